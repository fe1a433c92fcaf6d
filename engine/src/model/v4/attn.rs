//! One V4 attention block over the n positions of a pass (see [`super`] for the design).

use crate::kernels::{matmul, rmsnorm_chunks};
use crate::math;
use crate::model::config::{V4Attn, V4Config};
use crate::model::rope::Rope;

use super::compress::{self, rope_tail};
use super::hc::unweighted_rmsnorm;
use super::{V4Attention, V4LayerState};

/// Sizes an attention block needs beyond its weights.
pub struct Shape<'a> {
    pub v4: &'a V4Config,
    pub kind: V4Attn,
    pub hidden: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub scale: f32,
}

/// The attention of `xn` (n, hidden; the normalised collapsed streams) at positions
/// `pos0..pos0 + n` into (n, hidden), advancing the layer's state `st`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    w: &V4Attention,
    s: &Shape,
    st: &mut V4LayerState,
    xn: &[f32],
    n: usize,
    pos0: usize,
    main_rope: &Rope,
    compress_rope: &Rope,
) -> Vec<f32> {
    let v4 = s.v4;
    let (hd, nh) = (s.head_dim, s.n_heads);
    let rope = if s.kind == V4Attn::Sliding { main_rope } else { compress_rope };
    let (mut cos, mut sin) = (Vec::new(), Vec::new());

    // q-LoRA: q_a -> RMSNorm (q_resid, also the indexer's input) -> q_b -> per-head
    // unweighted RMSNorm -> RoPE of each head's tail.
    let qr = v4.q_lora_rank;
    let mut qa = vec![0.0f32; n * qr];
    matmul(&w.q_a, xn, n, &mut qa);
    rmsnorm_chunks(&mut qa, &w.q_a_norm, s.rms_eps);
    let mut q = vec![0.0f32; n * nh * hd];
    matmul(&w.q_b, &qa, n, &mut q);
    let mut q = unweighted_rmsnorm(&q, hd, s.rms_eps);
    for i in 0..n {
        for h in 0..nh {
            let at = (i * nh + h) * hd;
            rope_tail(rope, &mut q[at..at + hd], pos0 + i, false, &mut cos, &mut sin);
        }
    }
    // The shared key = value head.
    let mut kv = vec![0.0f32; n * hd];
    matmul(&w.kv, xn, n, &mut kv);
    rmsnorm_chunks(&mut kv, &w.kv_norm, s.rms_eps);
    for i in 0..n {
        rope_tail(rope, &mut kv[i * hd..(i + 1) * hd], pos0 + i, false, &mut cos, &mut sin);
    }

    // Compressed entries, and the indexer's choice among them.
    if let Some(c) = &w.comp {
        compress::feed(c, &mut st.comp, xn, n, compress_rope, s.rms_eps);
    }
    let mut chosen: Option<Vec<Vec<usize>>> = None;
    if let Some(ix) = &w.indexer {
        compress::feed(&ix.comp, &mut st.index, xn, n, compress_rope, s.rms_eps);
        let (hi, di) = (v4.index_heads, v4.index_head_dim);
        let mut iq = vec![0.0f32; n * hi * di];
        matmul(&ix.q_b, &qa, n, &mut iq);
        let mut iw = vec![0.0f32; n * hi];
        matmul(&ix.weights, xn, n, &mut iw);
        let wscale = (hi as f32).powf(-0.5);
        iw.iter_mut().for_each(|v| *v *= wscale);
        let total = st.index.entries.len() / di;
        let mut picks = Vec::with_capacity(n);
        for i in 0..n {
            for h in 0..hi {
                let at = (i * hi + h) * di;
                rope_tail(compress_rope, &mut iq[at..at + di], pos0 + i, false, &mut cos, &mut sin);
            }
            let vis = compress::visible(pos0 + i, ix.comp.rate, total);
            picks.push(compress::select(
                &iq[i * hi * di..(i + 1) * hi * di],
                &iw[i * hi..(i + 1) * hi],
                &st.index.entries,
                vis,
                di,
                v4.index_topk,
            ));
        }
        chosen = Some(picks);
    }

    // The sliding window's keys: the cached ones (positions pos0 - held..pos0), then the pass's.
    let held = st.window.len() / hd;
    let mut keys = std::mem::take(&mut st.window);
    keys.extend_from_slice(&kv);
    let entries = w.comp.as_ref().map_or(&[][..], |_| &st.comp.entries[..]);
    let total = entries.len() / hd;
    let rate = v4.rate_of(s.kind);

    let mut out = vec![0.0f32; n * nh * hd];
    let mut logits = Vec::new();
    let mut cols: Vec<&[f32]> = Vec::new();
    for i in 0..n {
        let p = pos0 + i;
        // Key rows visible to p: window positions max(0, p + 1 - W)..=p, then the entries.
        cols.clear();
        let first = (p + 1).saturating_sub(v4.window);
        for pos in first..=p {
            let r = pos + held - pos0;
            cols.push(&keys[r * hd..(r + 1) * hd]);
        }
        if let Some(rate) = rate {
            let vis = compress::visible(p, rate, total);
            match &chosen {
                Some(picks) => {
                    picks[i].iter().filter(|&&e| e < vis).for_each(|&e| cols.push(&entries[e * hd..(e + 1) * hd]))
                }
                None => (0..vis).for_each(|e| cols.push(&entries[e * hd..(e + 1) * hd])),
            }
        }
        for h in 0..nh {
            let qh = &q[(i * nh + h) * hd..(i * nh + h + 1) * hd];
            logits.clear();
            logits.extend(cols.iter().map(|k| math::dot(qh, k) * s.scale));
            math::softmax_with_sink(&mut logits, w.sinks[h]);
            let o = &mut out[(i * nh + h) * hd..(i * nh + h + 1) * hd];
            for (pr, k) in logits.iter().zip(&cols) {
                for (ov, kv) in o.iter_mut().zip(k.iter()) {
                    *ov += pr * kv;
                }
            }
            rope_tail(rope, o, p, true, &mut cos, &mut sin);
        }
    }
    // Keep the last W - 1 keys.
    let keep = (v4.window - 1).min(keys.len() / hd);
    keys.drain(..keys.len() - keep * hd);
    st.window = keys;

    // The grouped low-rank output projection: group g's heads through o_a's block g,
    // then o_b over all groups.
    let (g, r) = (v4.o_groups, v4.o_lora_rank);
    let gw = nh * hd / g;
    let mut mid = vec![0.0f32; n * g * r];
    let mut xg = vec![0.0f32; n * gw];
    let mut yg = vec![0.0f32; n * r];
    for gi in 0..g {
        for i in 0..n {
            xg[i * gw..(i + 1) * gw].copy_from_slice(&out[i * nh * hd + gi * gw..i * nh * hd + (gi + 1) * gw]);
        }
        matmul(&w.o_a[gi], &xg, n, &mut yg);
        for i in 0..n {
            mid[i * g * r + gi * r..i * g * r + (gi + 1) * r].copy_from_slice(&yg[i * r..(i + 1) * r]);
        }
    }
    let mut y = vec![0.0f32; n * s.hidden];
    matmul(&w.o_b, &mid, n, &mut y);
    y
}
