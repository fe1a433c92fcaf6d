//! DeepSeek-V4's forward pass on the CPU: embedding into `hc_mult` equal streams -> for
//! each layer [hyper-connection collapse -> RMSNorm -> attention -> expand, collapse ->
//! RMSNorm -> MoE -> expand] -> hyper-head -> final RMSNorm -> head.

use crate::error::{Error, Result};
use crate::experts::ExpertSource;
use crate::kernels::{matmul, rmsnorm_chunks};
use crate::math;
use crate::model::moe::{batch_union, route_with, Routing};
use crate::model::{Logits, Model};

use super::attn::{self, Shape};
use super::{hc, V4Layer, V4State, V4Weights};

/// `ids` after the `state.pos` positions `state` holds: the logits of `which` rows, and
/// with `hidden` every position's final-normed state (else empty).
pub fn forward(
    m: &Model,
    w: &V4Weights,
    state: &mut V4State,
    ids: &[u32],
    which: Logits,
    hidden: bool,
    on_use: &mut dyn FnMut(usize, usize, usize),
) -> Result<(Vec<f32>, Vec<f32>)> {
    let c = &m.cfg;
    let v4 = c.v4.as_deref().ok_or_else(|| Error::Invalid("not a deepseek_v4 model".into()))?;
    let (n, h, nhc) = (ids.len(), c.hidden, v4.hc_mult);
    let pos0 = state.pos;
    state.layers.resize_with(c.n_layers, Default::default);
    let mut x = vec![0.0f32; n * nhc * h];
    let mut row = vec![0.0f32; h];
    for (i, &id) in ids.iter().enumerate() {
        m.embed.row_into(id as usize, &mut row);
        for j in 0..nhc {
            x[(i * nhc + j) * h..(i * nhc + j + 1) * h].copy_from_slice(&row);
        }
    }
    let (iters, eps) = (v4.sinkhorn_iters, v4.hc_eps);
    for (l, layer) in w.layers.iter().enumerate() {
        let (mut a, post, comb) = hc::collapse(&layer.attn_hc, &x, n, nhc, h, iters, eps, c.rms_eps);
        rmsnorm_chunks(&mut a, &layer.attn_norm, c.rms_eps);
        let shape = Shape {
            v4,
            kind: v4.layers[l],
            hidden: h,
            n_heads: c.n_heads,
            head_dim: c.head_dim,
            rms_eps: c.rms_eps,
            scale: c.attn_scale,
        };
        let y = attn::forward(&layer.attn, &shape, &mut state.layers[l], &a, n, pos0, &w.main_rope, &w.compress_rope);
        hc::expand(&mut x, &y, &post, &comb, n, nhc, h);
        let (mut f, post, comb) = hc::collapse(&layer.ffn_hc, &x, n, nhc, h, iters, eps, c.rms_eps);
        rmsnorm_chunks(&mut f, &layer.ffn_norm, c.rms_eps);
        let y = moe(m, l, layer, &f, n, ids, on_use)?;
        hc::expand(&mut x, &y, &post, &comb, n, nhc, h);
    }
    let first = if hidden || which == Logits::All { 0 } else { n - 1 };
    let mut hn = hc::head(&w.head_fn, &w.head_base, w.head_scale, &x, first, n, nhc, h, eps, c.rms_eps);
    rmsnorm_chunks(&mut hn, &m.final_norm, c.rms_eps);
    let rows = if which == Logits::All { n } else { 1 };
    let mut logits = vec![0.0f32; rows * c.vocab];
    let skip = n - first - rows;
    matmul(&m.lm_head, &hn[skip * h..], rows, &mut logits);
    state.pos += n;
    Ok((logits, if hidden { hn } else { Vec::new() }))
}

/// The clamped SwiGLU of one expert on the rows of `x`: down(silu(min(gate x, limit)) *
/// clamp(up x, -limit, limit)).
fn clamped_swiglu(e: &crate::experts::Expert, x: &[f32], n: usize, limit: f32, out: &mut [f32]) {
    let inter = e.gate.rows;
    let (mut g, mut u) = (vec![0.0f32; n * inter], vec![0.0f32; n * inter]);
    matmul(&e.gate, x, n, &mut g);
    matmul(&e.up, x, n, &mut u);
    for (gv, uv) in g.iter_mut().zip(&u) {
        *gv = math::silu(gv.min(limit)) * uv.clamp(-limit, limit);
    }
    matmul(&e.down, &g, n, out);
}

/// Layer `l`'s MoE of `x` (n, hidden): routed experts (hash-chosen or by the router)
/// summed in ascending expert order, then the shared expert added.
fn moe(
    m: &Model,
    l: usize,
    layer: &V4Layer,
    x: &[f32],
    n: usize,
    ids: &[u32],
    on_use: &mut dyn FnMut(usize, usize, usize),
) -> Result<Vec<f32>> {
    let c = &m.cfg;
    let (h, ne, k) = (c.hidden, c.router.n_experts, c.router.top_k);
    let limit = c.v4.as_ref().map_or(f32::INFINITY, |v| v.swiglu_limit);
    let mut logits = vec![0.0f32; n * ne];
    matmul(&layer.router, x, n, &mut logits);
    let routes: Vec<Routing> = (0..n)
        .map(|p| {
            let lg = &logits[p * ne..(p + 1) * ne];
            match &layer.tid2eid {
                Some(t) => {
                    let id = ids[p] as usize;
                    let fixed: Vec<usize> = t[id * k..(id + 1) * k].iter().map(|&e| e as usize).collect();
                    route_with(lg, &c.router, None, Some(&fixed))
                }
                None => route_with(lg, &c.router, layer.correction_bias.as_deref(), None),
            }
        })
        .collect();
    let users = batch_union(&routes, ne)?;
    let used: Vec<usize> = (0..ne).filter(|&e| !users[e].is_empty()).collect();
    let experts: &dyn ExpertSource = m.experts.as_ref();
    experts.prepare(l, &used)?;
    let mut out = vec![0.0f32; n * h];
    for &e in &used {
        on_use(l, e, users[e].len());
        experts.note_use(l, e, users[e].len());
        let ex = experts.expert(l, e)?;
        let list = &users[e];
        let xs = crate::model::moe::gather_rows(x, n, h, list);
        let mut ys = vec![0.0f32; list.len() * h];
        clamped_swiglu(&ex, &xs, list.len(), limit, &mut ys);
        for (j, (p, wt)) in list.iter().enumerate() {
            for (d, y) in out[p * h..(p + 1) * h].iter_mut().zip(&ys[j * h..(j + 1) * h]) {
                *d += y * wt;
            }
        }
    }
    let mut shared = vec![0.0f32; n * h];
    clamped_swiglu(&layer.shared, x, n, limit, &mut shared);
    out.iter_mut().zip(&shared).for_each(|(o, s)| *o += s);
    Ok(out)
}
