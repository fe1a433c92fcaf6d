//! DeepSeek-V4's graph operations on the CPU: the bodies are [`crate::model::v4`]'s
//! functions, each over one sequence's [`crate::model::v4::V4State`] that the pass borrows (in a batch, each
//! sequence's rows over its own state, [`CpuOps::each_seq`]).

use super::{CpuOps, Seq};
use crate::error::{Error, Result};
use crate::model::rope::Rope;
use crate::model::v4::attn::{attend, AttendShape};
use crate::model::v4::compress::{feed, rope_tail, select, visible, CompShape};
use crate::model::v4::{hc, HcShape, SelectShape, V4LayerState};

/// What a V4 pass needs beyond the other families': both ropes (each sequence brings its
/// state, [`Seq::with_v4`]).
#[derive(Clone, Copy)]
pub(crate) struct V4Ropes<'a> {
    pub(crate) main: &'a Rope,
    pub(crate) compress: &'a Rope,
}

fn ropes<'a>(ops: &CpuOps<'a>) -> Result<V4Ropes<'a>> {
    ops.v4.ok_or_else(|| Error::Invalid("a DeepSeek-V4 operation in a pass without its ropes".into()))
}

/// Layer `l`'s state of the sequence.
fn layer<'s>(seq: &'s mut Seq<'_>, l: usize) -> Result<&'s mut V4LayerState> {
    let st = seq
        .v4
        .as_deref_mut()
        .ok_or_else(|| Error::Invalid("a DeepSeek-V4 operation over a sequence without its state".into()))?;
    if st.layers.len() <= l {
        st.layers.resize_with(l + 1, Default::default);
    }
    Ok(&mut st.layers[l])
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn hc_weights(
    mix: &[f32],
    base: &[f32],
    scale: &[f32],
    s: HcShape,
    head: bool,
    pre: &mut [f32],
    post: &mut [f32],
    comb: &mut [f32],
) {
    let nhc = s.n_hc;
    if head {
        for p in 0..s.n {
            hc::head_pre(&mix[p * nhc..(p + 1) * nhc], base, scale[0], s.eps, &mut pre[p * nhc..(p + 1) * nhc]);
        }
        return;
    }
    let m = (2 + nhc) * nhc;
    for p in 0..s.n {
        hc::weights(
            base,
            scale,
            &mix[p * m..(p + 1) * m],
            nhc,
            s.iters,
            s.eps,
            &mut pre[p * nhc..(p + 1) * nhc],
            &mut post[p * nhc..(p + 1) * nhc],
            &mut comb[p * nhc * nhc..(p + 1) * nhc * nhc],
        );
    }
}

pub(crate) fn hc_collapse(pre: &[f32], x: &[f32], s: HcShape, out: &mut [f32]) {
    let (nhc, h) = (s.n_hc, s.hidden);
    for p in 0..s.n {
        hc::mix_streams(
            &pre[p * nhc..(p + 1) * nhc],
            &x[p * nhc * h..(p + 1) * nhc * h],
            h,
            &mut out[p * h..(p + 1) * h],
        );
    }
}

/// RoPE of the tails of `t`'s n rows of `heads` x `stride`, each row at its sequence's
/// position.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope(
    ops: &mut CpuOps<'_>,
    t: &mut [f32],
    n: usize,
    heads: usize,
    stride: usize,
    compress: bool,
    inverse: bool,
) -> Result<()> {
    let r = ropes(ops)?;
    let rope = if compress { r.compress } else { r.main };
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    ops.each_seq(n, |seq, r0, n, _| {
        for i in 0..n {
            for h in 0..heads {
                let at = ((r0 + i) * heads + h) * stride;
                rope_tail(rope, &mut t[at..at + stride], seq.pos0 + i, inverse, &mut cos, &mut sin);
            }
        }
        Ok(())
    })
}

/// Each sequence's rows of the projections `kv` and `gate` into layer `l`'s compressor
/// (the indexer's with `index`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn compress(
    ops: &mut CpuOps<'_>,
    l: usize,
    index: bool,
    kv: &[f32],
    gate: &[f32],
    ape: &[f32],
    norm: &[f32],
    shape: CompShape,
) -> Result<()> {
    let rope = ropes(ops)?.compress;
    let width = if shape.overlap { 2 * shape.dim } else { shape.dim };
    ops.each_seq(shape.n, |seq, r0, n, _| {
        let st = layer(seq, l)?;
        let comp = if index { &mut st.index } else { &mut st.comp };
        let rows = r0 * width..(r0 + n) * width;
        feed(CompShape { n, ..shape }, ape, norm, comp, &kv[rows.clone()], &gate[rows], rope);
        Ok(())
    })
}

/// The indexer's choice for each query of each sequence, among its own entries; kept
/// for the sequence's next [`attention`].
pub(crate) fn choose(ops: &mut CpuOps<'_>, l: usize, iq: &[f32], iw: &[f32], s: SelectShape) -> Result<()> {
    let (hi, di) = (s.heads, s.head_dim);
    let scale = (hi as f32).powf(-0.5);
    ops.each_seq(s.n, |seq, r0, n, _| {
        let pos0 = seq.pos0;
        let picks = {
            let entries = &layer(seq, l)?.index.entries;
            let total = entries.len() / di;
            let mut picks = Vec::with_capacity(n);
            let mut w = vec![0.0f32; hi];
            for i in 0..n {
                let row = r0 + i;
                for (wh, v) in w.iter_mut().zip(&iw[row * hi..(row + 1) * hi]) {
                    *wh = v * scale;
                }
                let vis = visible(pos0 + i, s.rate, total);
                picks.push(select(&iq[row * hi * di..(row + 1) * hi * di], &w, entries, vis, di, s.topk));
            }
            picks
        };
        seq.chosen = Some(picks);
        Ok(())
    })
}

/// Each sequence's queries over its window and compressed entries (its indexer's choice
/// on a sparse layer).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    ops: &mut CpuOps<'_>,
    l: usize,
    q: &[f32],
    kv: &[f32],
    sinks: &[f32],
    s: AttendShape,
    out: &mut [f32],
) -> Result<()> {
    let (qw, hd) = (s.heads * s.head_dim, s.head_dim);
    ops.each_seq(s.n, |seq, r0, n, _| {
        let chosen = seq.chosen.take();
        if s.sparse && chosen.is_none() {
            return Err(Error::Invalid(format!("layer {l}: compressed sparse attention without the indexer's choice")));
        }
        let shape = AttendShape { n, pos0: seq.pos0, ..s };
        let (q, kv, out) = (&q[r0 * qw..(r0 + n) * qw], &kv[r0 * hd..(r0 + n) * hd], &mut out[r0 * qw..(r0 + n) * qw]);
        attend(layer(seq, l)?, q, kv, sinks, shape, chosen.as_deref(), out);
        Ok(())
    })
}
