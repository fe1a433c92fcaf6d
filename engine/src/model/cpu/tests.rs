//! The CPU backend's attention variants through the graph: prefill equals token-by-token
//! decode, and a sliding window limits what is seen.

use super::*;
use crate::model::attention::tests::mat;
use crate::model::attention::GqaWeights;
use crate::model::config::QkNorm;
use crate::model::rope::RopeConfig;

/// Self-attention for `n` new positions starting at absolute position `pos0`, on the CPU.
/// `x`: (n, hidden) normalised input; `cos`/`sin`: per new position, rotary_dim/2 each;
/// `out`: (n, hidden). Appends what the variant caches of the new positions to `cache`.
/// Grouped-query attention runs the graph's one description ([`crate::model::graph::gqa`]);
/// the forward pass itself goes through [`CpuPass`].
#[allow(clippy::too_many_arguments)]
fn attention(
    w: &AttnWeights,
    o: &AttnOpts,
    rope: &Rope,
    x: &[f32],
    n: usize,
    pos0: usize,
    cos: &[Vec<f32>],
    sin: &[Vec<f32>],
    cache: &mut LayerCache,
    out: &mut [f32],
) -> Result<()> {
    match (w, &o.mla) {
        (AttnWeights::Gqa(g), None) => {
            let mut ops = CpuOps::new(rope, pos0, cos.to_vec(), sin.to_vec(), std::slice::from_mut(cache));
            let mut y = out[..n * g.wo.rows].to_vec();
            crate::model::graph::gqa(&mut ops, 0, g, o, g.wo.rows, &x.to_vec(), n, &mut y)?;
            out[..y.len()].copy_from_slice(&y);
            Ok(())
        }
        (AttnWeights::Mla(m), Some(_)) => {
            let mut ops = CpuOps::new(rope, pos0, cos.to_vec(), sin.to_vec(), std::slice::from_mut(cache));
            let mut y = out[..n * m.wo.rows].to_vec();
            crate::model::graph::run_ready(crate::model::graph::mla(&mut ops, 0, m, o, &x.to_vec(), n, &mut y))??;
            out[..y.len()].copy_from_slice(&y);
            Ok(())
        }
        (AttnWeights::Linear(d), None) => {
            let mut ops = CpuOps::new(rope, pos0, cos.to_vec(), sin.to_vec(), std::slice::from_mut(cache));
            let mut y = out[..n * d.out.rows].to_vec();
            crate::model::graph::deltanet(&mut ops, 0, d, &x.to_vec(), n, &mut y)?;
            out[..y.len()].copy_from_slice(&y);
            Ok(())
        }
        _ => Err(crate::error::Error::Invalid("attention weights and options are of different variants".into())),
    }
}

fn setup(qk: QkNorm, window: Option<usize>) -> (AttnWeights, AttnOpts, Rope) {
    let (h, nh, nkv, hd) = (10, 4, 2, 6);
    let nw = |len: usize| Some((0..len).map(|i| 1.0 + i as f32 * 0.05).collect());
    let w = AttnWeights::Gqa(GqaWeights {
        wq: mat(nh * hd, h, 1),
        wk: mat(nkv * hd, h, 2),
        wv: mat(nkv * hd, h, 3),
        wo: mat(h, nh * hd, 4),
        bq: Some(vec![0.1; nh * hd]),
        bk: None,
        bv: Some(vec![-0.2; nkv * hd]),
        bo: Some(vec![0.05; h]),
        sinks: Some(vec![0.5, -1.0, 2.0, 0.0]),
        q_norm: match qk {
            QkNorm::None => None,
            QkNorm::PerHead => nw(hd),
            QkNorm::Full => nw(nh * hd),
        },
        k_norm: match qk {
            QkNorm::None => None,
            QkNorm::PerHead => nw(hd),
            QkNorm::Full => nw(nkv * hd),
        },
    });
    let o = AttnOpts {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        qk_norm: qk,
        clip_qkv: Some(2.0),
        window,
        scale: (hd as f32).powf(-0.5),
        rms_eps: 1e-6,
        mla: None,
        output_gate: false,
    };
    let rope = Rope::new(&RopeConfig::from_config(&serde_json::json!({}), hd, 64).unwrap());
    (w, o, rope)
}

fn run(
    w: &AttnWeights,
    o: &AttnOpts,
    rope: &Rope,
    x: &[f32],
    n: usize,
    pos0: usize,
    cache: &mut LayerCache,
) -> Vec<f32> {
    let (mut cs, mut ss) = (vec![], vec![]);
    for i in 0..n {
        let (mut c, mut s) = (vec![], vec![]);
        rope.cos_sin(pos0 + i, &mut c, &mut s);
        cs.push(c);
        ss.push(s);
    }
    let mut out = vec![0.0; n * 10];
    attention(w, o, rope, x, n, pos0, &cs, &ss, cache, &mut out).unwrap();
    out
}

#[test]
fn prefill_equals_incremental_decode_bit_for_bit() {
    for (qk, window) in [(QkNorm::None, None), (QkNorm::PerHead, Some(3)), (QkNorm::Full, None)] {
        let (w, o, rope) = setup(qk, window);
        let n = 9;
        let x: Vec<f32> = (0..n * 10).map(|i| ((i * 53 % 17) as f32 - 8.0) / 5.0).collect();
        let mut c1 = LayerCache::default();
        let all = run(&w, &o, &rope, &x, n, 0, &mut c1);
        let mut c2 = LayerCache::default();
        let mut inc = Vec::new();
        inc.extend(run(&w, &o, &rope, &x[..40], 4, 0, &mut c2));
        for i in 4..n {
            inc.extend(run(&w, &o, &rope, &x[i * 10..(i + 1) * 10], 1, i, &mut c2));
        }
        assert_eq!(all, inc, "{qk:?}");
        assert_eq!(c1.k, c2.k);
    }
}

#[test]
fn window_limits_what_is_seen() {
    // With a window of 1 each position sees only itself, so its output does not
    // depend on earlier inputs.
    let (w, o, rope) = setup(QkNorm::None, Some(1));
    let mut x: Vec<f32> = (0..30).map(|i| i as f32 / 10.0).collect();
    let a = run(&w, &o, &rope, &x, 3, 0, &mut LayerCache::default());
    x[0] = 5.0;
    let b = run(&w, &o, &rope, &x, 3, 0, &mut LayerCache::default());
    assert_ne!(a[..10], b[..10]);
    assert_eq!(a[20..], b[20..]);
}
