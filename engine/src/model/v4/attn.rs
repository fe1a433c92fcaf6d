//! The core of a V4 attention block (the graph composes the rest: `graph::v4_attention`):
//! each query over the sliding window's keys and the compressed entries it may see.

use crate::math;

use super::compress::visible;
use super::V4LayerState;

/// The sizes of one attention pass: n queries of `heads` heads of `head_dim`, a window of
/// `window` positions, compressed entries every `rate` positions (None: a sliding layer),
/// `sparse`: the indexer's choice decides which of them (CSA).
#[derive(Clone, Copy, Debug)]
pub struct AttendShape {
    pub n: usize,
    pub pos0: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub window: usize,
    pub rate: Option<usize>,
    pub sparse: bool,
    pub scale: f32,
}

/// Appends the pass's keys `kv` (n, head_dim; keys are the values) to the layer's window,
/// then for each query position p and head: softmax (with the head's sink logit) over the
/// keys of positions p + 1 - window..=p and the visible compressed entries (those of
/// `chosen[i]` with `sparse`), the keys weighed into `out` (n, heads, head_dim); the
/// window then keeps its last window - 1 keys.
pub fn attend(
    st: &mut V4LayerState,
    q: &[f32],
    kv: &[f32],
    sinks: &[f32],
    s: AttendShape,
    chosen: Option<&[Vec<usize>]>,
    out: &mut [f32],
) {
    let (hd, nh, n) = (s.head_dim, s.heads, s.n);
    let held = st.window.len() / hd;
    let mut keys = std::mem::take(&mut st.window);
    keys.extend_from_slice(&kv[..n * hd]);
    let entries = &st.comp.entries[..];
    let total = entries.len() / hd;
    out[..n * nh * hd].iter_mut().for_each(|v| *v = 0.0);
    let mut logits = Vec::new();
    let mut cols: Vec<&[f32]> = Vec::new();
    for i in 0..n {
        let p = s.pos0 + i;
        cols.clear();
        for pos in (p + 1).saturating_sub(s.window)..=p {
            let r = pos + held - s.pos0;
            cols.push(&keys[r * hd..(r + 1) * hd]);
        }
        if let Some(rate) = s.rate {
            let vis = visible(p, rate, total);
            match chosen.filter(|_| s.sparse).and_then(|c| c.get(i)) {
                Some(picks) => {
                    picks.iter().filter(|&&e| e < vis).for_each(|&e| cols.push(&entries[e * hd..(e + 1) * hd]))
                }
                None => (0..vis).for_each(|e| cols.push(&entries[e * hd..(e + 1) * hd])),
            }
        }
        for h in 0..nh {
            let qh = &q[(i * nh + h) * hd..(i * nh + h + 1) * hd];
            logits.clear();
            logits.extend(cols.iter().map(|k| math::dot(qh, k) * s.scale));
            math::softmax_with_sink(&mut logits, sinks[h]);
            let o = &mut out[(i * nh + h) * hd..(i * nh + h + 1) * hd];
            for (pr, k) in logits.iter().zip(&cols) {
                for (ov, kv) in o.iter_mut().zip(k.iter()) {
                    *ov += pr * kv;
                }
            }
        }
    }
    let keep = (s.window - 1).min(keys.len() / hd);
    keys.drain(..keys.len() - keep * hd);
    st.window = keys;
}
