//! DeepSeek-V4's graph operations on the CPU: the bodies are [`crate::model::v4`]'s
//! functions, over the conversation's [`V4State`] that the pass borrows.

use crate::error::{Error, Result};
use crate::model::rope::Rope;
use crate::model::v4::attn::{attend, AttendShape};
use crate::model::v4::compress::{feed, rope_tail, select, visible, CompShape};
use crate::model::v4::{hc, HcShape, SelectShape, V4LayerState, V4State};

/// What a V4 pass needs beyond the other families': the state, both ropes, and the
/// indexer's last choice.
pub(crate) struct V4Ctx<'a> {
    pub(crate) state: &'a mut V4State,
    pub(crate) main: &'a Rope,
    pub(crate) compress: &'a Rope,
    pub(crate) chosen: Option<Vec<Vec<usize>>>,
}

impl V4Ctx<'_> {
    fn layer(&mut self, l: usize) -> Result<&mut V4LayerState> {
        if self.state.layers.len() <= l {
            self.state.layers.resize_with(l + 1, Default::default);
        }
        Ok(&mut self.state.layers[l])
    }
}

fn ctx<'c, 'a>(v4: &'c mut Option<V4Ctx<'a>>) -> Result<&'c mut V4Ctx<'a>> {
    v4.as_mut().ok_or_else(|| Error::Invalid("a DeepSeek-V4 operation in a pass without its state".into()))
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

#[allow(clippy::too_many_arguments)]
pub(crate) fn rope(
    v4: &mut Option<V4Ctx<'_>>,
    pos0: usize,
    t: &mut [f32],
    n: usize,
    heads: usize,
    stride: usize,
    compress: bool,
    inverse: bool,
) -> Result<()> {
    let c = ctx(v4)?;
    let rope = if compress { c.compress } else { c.main };
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for i in 0..n {
        for h in 0..heads {
            let at = (i * heads + h) * stride;
            rope_tail(rope, &mut t[at..at + stride], pos0 + i, inverse, &mut cos, &mut sin);
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn compress(
    v4: &mut Option<V4Ctx<'_>>,
    l: usize,
    index: bool,
    kv: &[f32],
    gate: &[f32],
    ape: &[f32],
    norm: &[f32],
    shape: CompShape,
) -> Result<()> {
    let c = ctx(v4)?;
    let rope = c.compress;
    let st = c.layer(l)?;
    let comp = if index { &mut st.index } else { &mut st.comp };
    feed(shape, ape, norm, comp, kv, gate, rope);
    Ok(())
}

pub(crate) fn choose(v4: &mut Option<V4Ctx<'_>>, l: usize, iq: &[f32], iw: &[f32], s: SelectShape) -> Result<()> {
    let c = ctx(v4)?;
    let (hi, di) = (s.heads, s.head_dim);
    let scale = (hi as f32).powf(-0.5);
    let picks = {
        let entries = &c.layer(l)?.index.entries;
        let total = entries.len() / di;
        let mut picks = Vec::with_capacity(s.n);
        let mut w = vec![0.0f32; hi];
        for i in 0..s.n {
            for (wh, v) in w.iter_mut().zip(&iw[i * hi..(i + 1) * hi]) {
                *wh = v * scale;
            }
            let vis = visible(s.pos0 + i, s.rate, total);
            picks.push(select(&iq[i * hi * di..(i + 1) * hi * di], &w, entries, vis, di, s.topk));
        }
        picks
    };
    c.chosen = Some(picks);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    v4: &mut Option<V4Ctx<'_>>,
    l: usize,
    q: &[f32],
    kv: &[f32],
    sinks: &[f32],
    s: AttendShape,
    out: &mut [f32],
) -> Result<()> {
    let c = ctx(v4)?;
    let chosen = c.chosen.take();
    if s.sparse && chosen.is_none() {
        return Err(Error::Invalid(format!("layer {l}: compressed sparse attention without the indexer's choice")));
    }
    attend(c.layer(l)?, q, kv, sinks, s, chosen.as_deref(), out);
    Ok(())
}
