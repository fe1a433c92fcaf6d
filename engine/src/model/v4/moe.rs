//! DeepSeek-V4's MoE on the CPU: the experts `tid2eid[token id]` names (hash layers) or
//! the router's top-k of sqrtsoftplus + correction bias, weighed by the router's scores,
//! through the clamped SwiGLU, plus the shared expert.

use crate::error::Result;
use crate::experts::ExpertSource;
use crate::kernels::matmul;
use crate::model::moe::{batch_union, route_with, Routing};
use crate::model::Model;

use super::V4Layer;

/// The clamped SwiGLU of one expert on the rows of `x`: down(silu(min(gate x, limit)) *
/// clamp(up x, -limit, limit)).
fn clamped_swiglu(e: &crate::experts::Expert, x: &[f32], n: usize, limit: f32, out: &mut [f32]) {
    let inter = e.gate.rows;
    let (mut g, mut u) = (vec![0.0f32; n * inter], vec![0.0f32; n * inter]);
    matmul(&e.gate, x, n, &mut g);
    matmul(&e.up, x, n, &mut u);
    let act = crate::kernels::Activation::SiluClamped { limit };
    act.apply_rows(&mut g, &u, crate::qdot::Simd::active() != crate::qdot::Simd::Scalar);
    matmul(&e.down, &g, n, out);
}

/// Layer `l`'s MoE of `x` (n, hidden): routed experts (hash-chosen or by the router)
/// summed in ascending expert order, then the shared expert added.
pub(crate) fn moe(
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

/// The router lookahead's guess for a learned-router layer `next` from the input `x` (n,
/// hidden) of the layer before it: its router's top-k per position (sqrtsoftplus and
/// correction bias, as `moe` routes), the `top_k` chosen most often. A guess: only
/// which experts are read early depends on it, never an output.
pub fn predict(m: &Model, next: &V4Layer, x: &[f32], n: usize) -> Vec<usize> {
    let c = &m.cfg;
    let ne = c.router.n_experts;
    let mut logits = vec![0.0f32; n * ne];
    matmul(&next.router, x, n, &mut logits);
    let bias = next.correction_bias.as_deref();
    let routes = logits.chunks_exact(ne).map(|lg| route_with(lg, &c.router, bias, None));
    crate::model::moe::most_chosen(routes, ne, c.router.top_k)
}

/// The experts a hash layer's `tid2eid` ((vocab, k) expert ids) names for `ids`, ascending,
/// each once; ids outside the table and ids naming no expert below `ne` give none (the
/// MoE itself reports them).
pub fn hash_experts(tid2eid: &[u32], ids: &[u32], k: usize, ne: usize) -> Vec<usize> {
    let mut used = vec![false; ne];
    for &id in ids {
        if let Some(row) = tid2eid.get(id as usize * k..(id as usize + 1) * k) {
            row.iter().filter(|&&e| (e as usize) < ne).for_each(|&e| used[e as usize] = true);
        }
    }
    (0..ne).filter(|&e| used[e]).collect()
}
