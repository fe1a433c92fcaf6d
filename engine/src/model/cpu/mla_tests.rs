//! Multi-head latent attention through the graph on the CPU backend (`graph::mla`):
//! the absorbed form against the expanded formula of `model::mla`'s header in f64, and
//! prefill equal to token-by-token decode.

use crate::model::attention::AttnOpts;
use crate::model::attention::LayerCache;
use crate::model::config::MlaConfig;
use crate::model::config::QkNorm;
use crate::model::cpu::CpuOps;
use crate::model::mla::{MlaWeights, QueryProj};
use crate::model::rope::{Rope, RopeConfig};
use crate::tensor::Mat;

fn rand(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn mat(rows: usize, cols: usize, seed: u64) -> Mat {
    Mat::from_f32(rows, cols, &rand(rows * cols, seed)).unwrap()
}

const H: usize = 3;
const HIDDEN: usize = 14;

fn setup(q_lora: Option<usize>, interleave: bool) -> (MlaWeights, AttnOpts, MlaConfig, Rope) {
    let m = MlaConfig {
        q_lora_rank: q_lora,
        kv_lora_rank: 7,
        qk_nope_head_dim: 5,
        qk_rope_head_dim: 4,
        v_head_dim: 6,
        rope_interleave: interleave,
        dsa: None,
    };
    let (dn, dr, dv, r) = (5, 4, 6, 7);
    let q = match q_lora {
        None => QueryProj::Plain(mat(H * (dn + dr), HIDDEN, 1)),
        Some(rq) => QueryProj::LowRank {
            a: mat(rq, HIDDEN, 2),
            norm: rand(rq, 3).iter().map(|v| 1.0 + v).collect(),
            b: mat(H * (dn + dr), rq, 4),
        },
    };
    let kv_b = mat(H * (dn + dv), r, 5);
    let w = MlaWeights {
        q,
        kv_a: mat(r + dr, HIDDEN, 6),
        kv_norm: rand(r, 7).iter().map(|v| 1.0 + v).collect(),
        uv: (0..H).map(|h| kv_b.row_block(h * (dn + dv) + dn, dv).unwrap()).collect(),
        kv_b,
        wo: mat(HIDDEN, H * dv, 8),
        indexer: None,
    };
    let o = AttnOpts {
        n_heads: H,
        n_kv_heads: H,
        head_dim: dn + dr,
        qk_norm: QkNorm::None,
        clip_qkv: None,
        window: None,
        scale: 0.3,
        rms_eps: 1e-5,
        mla: Some(m.clone()),
        output_gate: false,
    };
    let rope = Rope::new(&RopeConfig::from_config(&serde_json::json!({}), dr, 64).unwrap());
    (w, o, m, rope)
}

/// The graph's MLA ([`crate::model::graph::mla`]) on the CPU backend.
fn run(s: &(MlaWeights, AttnOpts, MlaConfig, Rope), x: &[f32], pos0: usize, cache: &mut LayerCache) -> Vec<f32> {
    let n = x.len() / HIDDEN;
    let mut ops = CpuOps::for_positions(&s.3, pos0, n, std::slice::from_mut(cache));
    let mut out = vec![0.0; n * HIDDEN];
    let x = x.to_vec();
    let pass = crate::model::graph::mla(&mut ops, 0, &s.0, &s.1, &x, n, &mut out);
    crate::model::graph::run_ready(pass).unwrap().unwrap();
    out
}

/// The formula of the module header, without absorption, in f64: keys and values
/// expanded per head from the latents.
fn reference(s: &(MlaWeights, AttnOpts, MlaConfig, Rope), x: &[f32]) -> Vec<f64> {
    let (w, o, m, rope) = s;
    let (dn, dr, dv, r) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank);
    let n = x.len() / HIDDEN;
    let mv = |a: &Mat, v: &[f64]| -> Vec<f64> {
        let mut row = vec![0.0; a.cols];
        (0..a.rows)
            .map(|k| {
                a.row_into(k, &mut row);
                row.iter().zip(v).map(|(a, b)| *a as f64 * b).sum()
            })
            .collect()
    };
    let norm = |v: &[f64], wt: &[f32]| -> Vec<f64> {
        let ms = v.iter().map(|a| a * a).sum::<f64>() / v.len() as f64;
        v.iter().zip(wt).map(|(a, w)| a / (ms + 1e-6).sqrt() * *w as f64).collect()
    };
    // Rotation of interleaved or half-split pairs, in f64.
    let rot = |v: &[f64], p: usize| -> Vec<f64> {
        let half = dr / 2;
        let pair = |i: usize| if m.rope_interleave { (2 * i, 2 * i + 1) } else { (i, i + half) };
        let mut outv = vec![0.0; dr];
        for i in 0..half {
            let th = p as f64 * rope.inv_freq[i] as f64;
            let (a, b) = pair(i);
            // Output in the de-interleaved order, as transformers returns it.
            outv[i] = v[a] * th.cos() - v[b] * th.sin();
            outv[i + half] = v[b] * th.cos() + v[a] * th.sin();
        }
        outv
    };
    let (mut qs, mut keys, mut vals) = (vec![], vec![], vec![]);
    for i in 0..n {
        let xi: Vec<f64> = x[i * HIDDEN..(i + 1) * HIDDEN].iter().map(|v| *v as f64).collect();
        let q = match &w.q {
            QueryProj::Plain(wq) => mv(wq, &xi),
            QueryProj::LowRank { a, norm: nw, b } => mv(b, &norm(&mv(a, &xi), nw)),
        };
        let ckv = mv(&w.kv_a, &xi);
        let c = norm(&ckv[..r], &w.kv_norm);
        let kr = rot(&ckv[r..], i);
        let kv = mv(&w.kv_b, &c);
        let (mut qh, mut kh, mut vh) = (vec![], vec![], vec![]);
        for h in 0..H {
            let qq = &q[h * (dn + dr)..(h + 1) * (dn + dr)];
            qh.push([qq[..dn].to_vec(), rot(&qq[dn..], i)].concat());
            let kvh = &kv[h * (dn + dv)..(h + 1) * (dn + dv)];
            kh.push([kvh[..dn].to_vec(), kr.clone()].concat());
            vh.push(kvh[dn..].to_vec());
        }
        qs.push(qh);
        keys.push(kh);
        vals.push(vh);
    }
    let mut out = vec![];
    for (i, qi) in qs.iter().enumerate() {
        let mut ctx = vec![];
        for (h, qh) in qi.iter().enumerate() {
            let sc: Vec<f64> =
                (0..=i).map(|j| qh.iter().zip(&keys[j][h]).map(|(a, b)| a * b).sum::<f64>() * o.scale as f64).collect();
            let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            ctx.extend((0..dv).map(|d| (0..=i).map(|j| e[j] / z * vals[j][h][d]).sum::<f64>()));
        }
        out.extend(mv(&w.wo, &ctx));
    }
    out
}

#[test]
fn absorbed_latent_attention_matches_the_expanded_formula() {
    for (q_lora, interleave) in [(Some(6), true), (None, false), (None, true)] {
        let s = setup(q_lora, interleave);
        let n = 6;
        let x = rand(n * HIDDEN, 11).iter().map(|v| v * 4.0).collect::<Vec<_>>();
        let mut cache = LayerCache::default();
        let got = run(&s, &x, 0, &mut cache);
        let want = reference(&s, &x);
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((*g as f64 - w).abs() < 1e-5 * (1.0 + w.abs()), "{q_lora:?} {interleave}: [{k}] {g} vs {w}");
        }
        // Only the latent and the rotary key are cached.
        assert_eq!(cache.k.len(), n * 7);
        assert_eq!(cache.v.len(), n * 4);
    }
}

#[test]
fn prefill_equals_incremental_decode_bit_for_bit() {
    let s = setup(Some(6), true);
    let n = 7;
    let x = rand(n * HIDDEN, 12).iter().map(|v| v * 4.0).collect::<Vec<_>>();
    let mut c1 = LayerCache::default();
    let all = run(&s, &x, 0, &mut c1);
    let mut c2 = LayerCache::default();
    let mut inc = run(&s, &x[..3 * HIDDEN], 0, &mut c2);
    for i in 3..n {
        inc.extend(run(&s, &x[i * HIDDEN..(i + 1) * HIDDEN], i, &mut c2));
    }
    assert_eq!(all, inc);
    assert_eq!(c1.k, c2.k);
    assert_eq!(c1.v, c2.v);
    // A rollback keeps exactly the first positions' latents.
    c1.truncate(3);
    assert_eq!(c1.k, c2.k[..3 * 7].to_vec());
    assert_eq!(c1.v.len(), 3 * 4);
}
