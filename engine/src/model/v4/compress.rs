//! The compressed key/value entries of CSA and HCA layers, and the lightning indexer's
//! selection among them.
//!
//! A compressor projects every position to kv and gate rows; each window of `rate`
//! positions gives one entry: per channel, the softmax over the window's slots of gate +
//! `ape[slot]`, weighing kv, summed; then RMSNorm and RoPE (the compress rope) at the
//! entry's first position `e * rate`. CSA's windows overlap: its projections are twice
//! as wide, the first half (Ca) of window w - 1 and the second half (Cb) of window w make
//! entry w's 2 * rate slots (the very first window's Ca slots are empty: gate -inf).
//! Positions of an unfinished window wait in the state; the Ca half of the last finished
//! window is carried for the next entry.
//!
//! Entry e covers positions up to (e + 1) * rate - 1, so a query at position p sees the
//! entries e < (p + 1) / rate.

use crate::kernels::rmsnorm_chunks;
use crate::math;
use crate::model::rope::Rope;

use super::CompState;

/// RoPE of the trailing `rope.rotary_dim` values of `x` (one head) at `pos`, as
/// interleaved pairs (2i, 2i + 1), in place: transformers' `x * cos + rotate_half(x) *
/// sin`; `inverse` rotates back (sin negated).
pub fn rope_tail(rope: &Rope, x: &mut [f32], pos: usize, inverse: bool, cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
    rope.cos_sin(pos, cos, sin);
    let d = rope.rotary_dim;
    let at = x.len() - d;
    for i in 0..d / 2 {
        let (c, s) = (cos[i], if inverse { -sin[i] } else { sin[i] });
        let (a, b) = (x[at + 2 * i], x[at + 2 * i + 1]);
        x[at + 2 * i] = a * c + (-b) * s;
        x[at + 2 * i + 1] = b * c + a * s;
    }
}

/// A compressor's sizes for [`feed`]: `dim` per entry, one entry per `rate` positions,
/// overlapping windows (CSA: projections of 2 * dim), the entries' RMSNorm epsilon.
#[derive(Clone, Copy, Debug)]
pub struct CompShape {
    pub n: usize,
    pub dim: usize,
    pub rate: usize,
    pub overlap: bool,
    pub rms_eps: f32,
}

/// Feeds the projections `kv` and `gate` (n, width: 2 * dim with overlap, else dim) of
/// n positions to a compressor's state `st`: new entries (RMSNorm `norm`, the compress
/// rope at their first position) are appended to `st.entries`, the rest waits in `st`.
/// `ape` (rate, width) is the position bias of the gates.
pub fn feed(c: CompShape, ape: &[f32], norm: &[f32], st: &mut CompState, kv: &[f32], gate: &[f32], rope: &Rope) {
    let width = if c.overlap { 2 * c.dim } else { c.dim };
    let n = c.n;
    st.buf_kv.extend_from_slice(&kv[..n * width]);
    st.buf_gate.extend_from_slice(&gate[..n * width]);
    let rows = st.buf_kv.len() / width;
    let windows = rows / c.rate;
    let (d, r) = (c.dim, c.rate);
    let slots = if c.overlap { 2 * r } else { r };
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    let mut skv = vec![0.0f32; slots * d];
    let mut sg = vec![0.0f32; slots * d];
    let mut entry = vec![0.0f32; d];
    let mut w_col = vec![0.0f32; slots];
    for w in 0..windows {
        let row = |j: usize| -> std::ops::Range<usize> {
            let at = (w * r + j) * width;
            at..at + width
        };
        // The slots: (Ca of the previous window,) this window's (Cb or whole) rows.
        let own = if c.overlap { r } else { 0 };
        if c.overlap {
            match &st.overlap {
                Some((pk, pg)) => {
                    skv[..r * d].copy_from_slice(pk);
                    sg[..r * d].copy_from_slice(pg);
                }
                None => {
                    skv[..r * d].iter_mut().for_each(|v| *v = 0.0);
                    sg[..r * d].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
                }
            }
        }
        let half = if c.overlap { d } else { 0 };
        for j in 0..r {
            let (kr, gr) = (&st.buf_kv[row(j)], &st.buf_gate[row(j)]);
            let ape = &ape[j * width..(j + 1) * width];
            for ch in 0..d {
                skv[(own + j) * d + ch] = kr[half + ch];
                sg[(own + j) * d + ch] = gr[half + ch] + ape[half + ch];
            }
        }
        for ch in 0..d {
            for s in 0..slots {
                w_col[s] = sg[s * d + ch];
            }
            math::softmax(&mut w_col);
            let mut acc = 0.0f32;
            for s in 0..slots {
                acc += skv[s * d + ch] * w_col[s];
            }
            entry[ch] = acc;
        }
        rmsnorm_chunks(&mut entry, norm, c.rms_eps);
        let e = st.entries.len() / d;
        rope_tail(rope, &mut entry, e * r, false, &mut cos, &mut sin);
        st.entries.extend_from_slice(&entry);
        if c.overlap {
            // This window's Ca halves (gate with its bias) for the next entry.
            let (mut pk, mut pg) = (vec![0.0f32; r * d], vec![0.0f32; r * d]);
            for j in 0..r {
                let (kr, gr) = (&st.buf_kv[row(j)], &st.buf_gate[row(j)]);
                let ape = &ape[j * width..(j + 1) * width];
                for ch in 0..d {
                    pk[j * d + ch] = kr[ch];
                    pg[j * d + ch] = gr[ch] + ape[ch];
                }
            }
            st.overlap = Some((pk, pg));
        }
    }
    st.buf_kv.drain(..windows * r * width);
    st.buf_gate.drain(..windows * r * width);
}

/// The entries query position `p` may see: e < (p + 1) / rate, of `total`.
pub fn visible(p: usize, rate: usize, total: usize) -> usize {
    ((p + 1) / rate).min(total)
}

/// The lightning indexer's choice for one query: of the `visible` entries (rows of `di`
/// in `keys`), the `topk` with the largest sum_h w_h relu(q_h . k) / sqrt(di) (all when
/// no more than `topk`), in ascending entry order. `q` (heads, di) is rotated, `w` (heads)
/// already scaled by heads^-0.5.
pub fn select(q: &[f32], w: &[f32], keys: &[f32], visible: usize, di: usize, topk: usize) -> Vec<usize> {
    if visible <= topk {
        return (0..visible).collect();
    }
    let scale = (di as f32).powf(-0.5);
    let scores: Vec<f32> = (0..visible)
        .map(|e| {
            let k = &keys[e * di..(e + 1) * di];
            let mut s = 0.0f32;
            for (h, wh) in w.iter().enumerate() {
                let qk = math::dot(&q[h * di..(h + 1) * di], k);
                s += (qk.max(0.0) * scale) * wh;
            }
            s
        })
        .collect();
    top_entries(&scores, topk)
}

/// The `topk` entries with the highest `scores` (ties to the lower entry; -0 and +0 are
/// equal), in ascending order: the choice of [`select`] and of the GPU's v4_topk.wgsl.
pub fn top_entries(scores: &[f32], topk: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(&b)));
    order.truncate(topk);
    order.sort_unstable();
    order
}
