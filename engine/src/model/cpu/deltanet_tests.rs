//! Gated DeltaNet through the graph on the CPU backend (`graph::deltanet`): prefill equal
//! to token-by-token decode, split projections equal to grouped ones, the delta rule
//! against transformers' formulation, rewinds to snapshots.

use crate::math;
use crate::math::softplus;
use crate::model::config::LinearAttnConfig;
use crate::model::deltanet::{delta_step, DeltaNetWeights, DeltaState, InProj};
use crate::tensor::Mat;

/// The layer through the graph on the CPU backend.
fn forward(w: &DeltaNetWeights, x: &[f32], n: usize, state: &mut DeltaState, out: &mut [f32]) {
    let rope = crate::model::rope::Rope::new(
        &crate::model::rope::RopeConfig::from_config(&serde_json::json!({}), 2, 1).unwrap(),
    );
    let mut cache = crate::model::attention::LayerCache::default();
    cache.recurrent = Some(Box::new(std::mem::take(state)));
    let mut ops = super::CpuOps::new(&rope, 0, vec![], vec![], std::slice::from_mut(&mut cache));
    let (x, mut y) = (x.to_vec(), vec![0.0f32; out.len()]);
    crate::model::graph::deltanet(&mut ops, 0, w, &x, n, &mut y).unwrap();
    *state = cache.recurrent.map(|b| *b).unwrap_or_default();
    out.copy_from_slice(&y);
}

fn rand_vec(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5) * 2.0 * scale
        })
        .collect()
}

fn layer() -> DeltaNetWeights {
    let c = LinearAttnConfig {
        n_k_heads: 2,
        n_v_heads: 4,
        k_head_dim: 6,
        v_head_dim: 5,
        conv_kernel: 3,
        layers: vec![true],
        split_in_proj: false,
    };
    let h = 11;
    let m = |rows: usize, cols: usize, seed| Mat::from_f32(rows, cols, &rand_vec(rows * cols, seed, 0.5)).unwrap();
    DeltaNetWeights {
        in_proj: InProj::Grouped { qkvz: m(2 * c.key_dim() + 2 * c.value_dim(), h, 1), ba: m(2 * c.n_v_heads, h, 2) },
        conv: rand_vec(c.conv_dim() * c.conv_kernel, 3, 0.7),
        neg_a: rand_vec(c.n_v_heads, 4, 0.5).iter().map(|x| -math::exp(x - 1.0)).collect(),
        dt_bias: rand_vec(c.n_v_heads, 5, 0.5),
        norm: rand_vec(c.v_head_dim, 6, 0.3).iter().map(|x| x + 1.0).collect(),
        out: m(h, c.value_dim(), 7),
        cfg: c,
        eps: 1e-6,
    }
}

#[test]
fn prefill_equals_token_by_token_bit_for_bit() {
    let w = layer();
    let n = 9;
    let x = rand_vec(n * 11, 8, 1.0);
    let mut s1 = DeltaState::default();
    let mut all = vec![0.0; n * 11];
    forward(&w, &x, n, &mut s1, &mut all);
    let mut s2 = DeltaState::default();
    let mut inc = Vec::new();
    let mut y = vec![0.0; 3 * 11];
    forward(&w, &x[..33], 3, &mut s2, &mut y);
    inc.extend_from_slice(&y);
    for t in 3..n {
        let mut y = vec![0.0; 11];
        forward(&w, &x[t * 11..(t + 1) * 11], 1, &mut s2, &mut y);
        inc.extend_from_slice(&y);
    }
    assert_eq!(all, inc);
    assert_eq!((s1.pos, &s1.s, &s1.conv), (s2.pos, &s2.s, &s2.conv));
    assert!(all.iter().all(|v| v.is_finite()) && all.iter().any(|v| v.abs() > 1e-3));
}

/// qwen3_5_moe's separate projections hold the same rows as qwen3_next's grouped ones,
/// reordered: the layer gives the same bits either way.
#[test]
fn split_projections_equal_grouped_ones_bit_for_bit() {
    let w = layer();
    let c = w.cfg.clone();
    let (nk, r, dk, dv) = (c.n_k_heads, c.n_v_heads / c.n_k_heads, c.k_head_dim, c.v_head_dim);
    let InProj::Grouped { qkvz, ba } = &w.in_proj else { panic!("layer() is grouped") };
    let rows = |m: &Mat, idx: Vec<usize>| {
        let f = m.to_f32();
        let data: Vec<f32> = idx.iter().flat_map(|&i| f[i * m.cols..(i + 1) * m.cols].to_vec()).collect();
        Mat::from_f32(idx.len(), m.cols, &data).unwrap()
    };
    let group = 2 * dk + 2 * r * dv;
    let per = |start: usize, len: usize| (0..nk).flat_map(move |g| g * group + start..g * group + start + len);
    let split = DeltaNetWeights {
        in_proj: InProj::Split {
            qkv: rows(qkvz, per(0, dk).chain(per(dk, dk)).chain(per(2 * dk, r * dv)).collect()),
            z: rows(qkvz, per(2 * dk + r * dv, r * dv).collect()),
            b: rows(ba, (0..nk).flat_map(|g| g * 2 * r..g * 2 * r + r).collect()),
            a: rows(ba, (0..nk).flat_map(|g| g * 2 * r + r..g * 2 * r + 2 * r).collect()),
        },
        conv: w.conv.clone(),
        neg_a: w.neg_a.clone(),
        dt_bias: w.dt_bias.clone(),
        norm: w.norm.clone(),
        out: w.out.clone(),
        cfg: LinearAttnConfig { split_in_proj: true, ..c },
        eps: w.eps,
    };
    let n = 7;
    let x = rand_vec(n * 11, 12, 1.0);
    let (mut s1, mut s2) = (DeltaState::default(), DeltaState::default());
    let (mut y1, mut y2) = (vec![0.0; n * 11], vec![0.0; n * 11]);
    forward(&w, &x, n, &mut s1, &mut y1);
    forward(&split, &x, n, &mut s2, &mut y2);
    assert_eq!(y1, y2);
    assert_eq!((&s1.s, &s1.conv), (&s2.s, &s2.conv));
    assert!(y1.iter().any(|v| v.abs() > 1e-3));
}

/// The recurrence against transformers' formulation in f64: decay the state, read,
/// write beta times the error, answer the query.
#[test]
fn delta_step_matches_the_reference_formulation() {
    let (dk, dv) = (7, 5);
    let mut s = rand_vec(dk * dv, 9, 1.0);
    let mut s64: Vec<f64> = s.iter().map(|&v| v as f64).collect();
    for step in 0..4u64 {
        let (q, k, v) = (rand_vec(dk, 10 + step, 1.0), rand_vec(dk, 20 + step, 1.0), rand_vec(dv, 30 + step, 1.0));
        let (decay, beta) = (0.8f32, 0.6f32);
        let mut o = vec![0.0; dv];
        delta_step(&mut s, &q, &k, &v, decay, beta, &mut o, &mut [0.0; 10]);
        s64.iter_mut().for_each(|x| *x *= decay as f64);
        let mem: Vec<f64> = (0..dv).map(|j| (0..dk).map(|i| s64[i * dv + j] * k[i] as f64).sum()).collect();
        for i in 0..dk {
            for j in 0..dv {
                s64[i * dv + j] += k[i] as f64 * (v[j] as f64 - mem[j]) * beta as f64;
            }
        }
        for j in 0..dv {
            let want: f64 = (0..dk).map(|i| s64[i * dv + j] * q[i] as f64).sum();
            assert!((o[j] as f64 - want).abs() < 1e-5, "step {step} o[{j}] {} vs {want}", o[j]);
        }
    }
}

#[test]
fn rewind_goes_to_a_snapshot_or_the_start() {
    let w = layer();
    let x = rand_vec(12 * 11, 11, 1.0);
    let mut y = vec![0.0; 12 * 11];
    let mut s = DeltaState::default();
    forward(&w, &x[..5 * 11], 5, &mut s, &mut y); // no snapshot at 0 (the empty state)
    let at5 = s.clone();
    forward(&w, &x[5 * 11..9 * 11], 4, &mut s, &mut y); // snapshot at 5
    forward(&w, &x[9 * 11..10 * 11], 1, &mut s, &mut y); // a decode step: none
    assert_eq!(s.rewind(12), 10, "nothing to drop");
    assert_eq!(s.rewind(7), 5);
    assert_eq!((&s.s, &s.conv), (&at5.s, &at5.conv));
    assert_eq!(s.rewind(3), 0);
    assert!(s.s.iter().chain(&s.conv).all(|v| *v == 0.0));
    // softplus follows torch: x above 20, log1p(exp(x)) below.
    assert_eq!(softplus(25.0), 25.0);
    assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
    assert!((softplus(-30.0) - (-30.0f64).exp() as f32).abs() < 1e-18);
}
