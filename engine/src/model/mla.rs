//! Multi-head Latent Attention (DeepSeek-V2/V3, Kimi-K2): the MLA variant of the one
//! attention module ([`crate::model::attention`]).
//! Reference: transformers' `DeepseekV3Attention` (modeling_deepseek_v3.py, v5).
//!
//! transformers, per position (H heads; dn = qk_nope_head_dim, dr = qk_rope_head_dim,
//! dv = v_head_dim, r = kv_lora_rank):
//! ```text
//! q          = q_b(RMSNorm(q_a(x)))  or  q_proj(x)         (H, dn + dr)
//! [c, k_rot] = kv_a_proj_with_mqa(x);  c = RMSNorm(c)      (r), (dr) shared by all heads
//! q_rot, k_rot rotated (interleaved pairs if rope_interleave)
//! [k_nope_h, v_h] = kv_b(c)                                (H, dn + dv)
//! score_h(i, j) = scale * (q_nope_h(i) . k_nope_h(j) + q_rot_h(i) . k_rot(j))
//! out = o_proj(concat_h sum_j softmax_j(score_h(i, j)) v_h(j))
//! ```
//! Here the cache holds only `c` and `k_rot` (r + dr floats per position and layer: 576
//! for DeepSeek-V3) and the key/value up-projections are absorbed:
//! `q_nope_h . (W_uk_h c) = (W_uk_h^T q_nope_h) . c` and
//! `sum_j p_j (W_uv_h c_j) = W_uv_h (sum_j p_j c_j)`, where W_uk_h and W_uv_h are head h's
//! rows of kv_b. Every position's numbers depend only on that position and the cache, so a
//! prefill gives the bits of token-by-token decoding.
//!
//! The pass is written once, in the graph (`graph::mla`), for every backend; this module
//! holds the weights and the CPU's two MLA operations (`absorb`, `attend`).

use crate::error::Result;
use crate::format::tensors::TensorStore;
use crate::kernels::for_each_chunk;
use crate::math;
use crate::model::attention::{first_visible, AttendShape, LayerCache};
use crate::model::config::MlaConfig;
use crate::model::dsa::{IndexerWeights, Selection};
use crate::tensor::Mat;

/// transformers builds q_a_layernorm and kv_a_layernorm with the default epsilon, not
/// the config's `rms_norm_eps`.
pub(crate) const LATENT_NORM_EPS: f32 = 1e-6;

/// How the queries are projected.
pub enum QueryProj<M = Mat, V = Vec<f32>> {
    /// (H*(dn+dr), hidden)
    Plain(M),
    /// q_a_proj (q_lora_rank, hidden) -> RMSNorm (q_lora_rank) -> q_b_proj (H*(dn+dr), q_lora_rank)
    LowRank { a: M, norm: V, b: M },
}

/// One layer's MLA weights, as matrices `M` and vectors `V` of a backend (the CPU's
/// [`Mat`] and `Vec<f32>` as loaded, or a GPU's buffers through [`MlaWeights::try_map`]);
/// the graph (`graph::mla`) runs them on either.
pub struct MlaWeights<M = Mat, V = Vec<f32>> {
    pub q: QueryProj<M, V>,
    /// kv_a_proj_with_mqa: (r + dr, hidden)
    pub kv_a: M,
    /// kv_a_layernorm: (r)
    pub kv_norm: V,
    /// kv_b_proj: (H*(dn+dv), r); per head, dn key rows (W_uk_h) then dv value rows.
    pub kv_b: M,
    /// Per head its dv value rows of kv_b (W_uv_h, (dv, r)), views into kv_b's bytes.
    pub uv: Vec<M>,
    /// o_proj: (hidden, H*dv)
    pub wo: M,
    /// DeepSeek Sparse Attention's indexer, on the layers that run it ([`crate::model::dsa`]).
    pub indexer: Option<Box<IndexerWeights<M, V>>>,
}

impl MlaWeights {
    /// Loads `{prefix}.q_proj` or `q_a_proj`/`q_a_layernorm`/`q_b_proj`,
    /// `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj` (and layer `l`'s DSA
    /// indexer where it runs one), checking every shape.
    pub fn load(s: &TensorStore, prefix: &str, hidden: usize, n_heads: usize, m: &MlaConfig, l: usize) -> Result<Self> {
        let (dn, dr, dv, r) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank);
        let w = |name: &str, rows: usize, cols: usize| s.mat(&format!("{prefix}.{name}.weight"), rows, cols);
        let qd = n_heads * (dn + dr);
        let q = match m.q_lora_rank {
            None => QueryProj::Plain(w("q_proj", qd, hidden)?),
            Some(rq) => QueryProj::LowRank {
                a: w("q_a_proj", rq, hidden)?,
                norm: s.vector(&format!("{prefix}.q_a_layernorm.weight"), rq)?,
                b: w("q_b_proj", qd, rq)?,
            },
        };
        let kv_b = w("kv_b_proj", n_heads * (dn + dv), r)?;
        let uv = (0..n_heads).map(|h| kv_b.row_block(h * (dn + dv) + dn, dv)).collect::<Result<_>>()?;
        Ok(MlaWeights {
            q,
            kv_a: w("kv_a_proj_with_mqa", r + dr, hidden)?,
            kv_norm: s.vector(&format!("{prefix}.kv_a_layernorm.weight"), r)?,
            kv_b,
            uv,
            wo: w("o_proj", hidden, n_heads * dv)?,
            indexer: match (&m.dsa, m.indexer_at(l), m.q_lora_rank) {
                (Some(d), Some(true), Some(rq)) => Some(Box::new(IndexerWeights::load(s, prefix, hidden, rq, d)?)),
                _ => None,
            },
        })
    }
}

impl<M, V> MlaWeights<M, V> {
    /// The same weights in another backend's form: `m` and `v` convert one matrix and one
    /// vector, given their names (q, q_a, q_a_norm, q_b, kv_a, kv_norm, kv_b, uv{h}, wo).
    pub fn try_map<M2, V2>(
        &self,
        m: impl Fn(&str, &M) -> Result<M2>,
        v: impl Fn(&str, &V) -> Result<V2>,
    ) -> Result<MlaWeights<M2, V2>> {
        Ok(MlaWeights {
            q: match &self.q {
                QueryProj::Plain(q) => QueryProj::Plain(m("q", q)?),
                QueryProj::LowRank { a, norm, b } => {
                    QueryProj::LowRank { a: m("q_a", a)?, norm: v("q_a_norm", norm)?, b: m("q_b", b)? }
                }
            },
            kv_a: m("kv_a", &self.kv_a)?,
            kv_norm: v("kv_norm", &self.kv_norm)?,
            kv_b: m("kv_b", &self.kv_b)?,
            uv: self.uv.iter().enumerate().map(|(h, u)| m(&format!("uv{h}"), u)).collect::<Result<_>>()?,
            wo: m("wo", &self.wo)?,
            indexer: self.indexer.as_ref().map(|x| x.try_map(&m, &v).map(Box::new)).transpose()?,
        })
    }
}

/// The absorbed queries (the CPU's `Ops::mla_absorb`): `qc` (n, H, r + dr) from the
/// queries `q` (n, H, dn + dr), rotary part rotated: per head and position
/// `W_uk_h^T q_nope_h` (summed over the dn rows of W_uk_h in ascending order, from 0.0:
/// a fixed order that the GPU's mla_absorb.wgsl reproduces), then q's rotary part.
pub(crate) fn absorb(kv_b: &Mat, q: &[f32], n: usize, n_heads: usize, m: &MlaConfig, qc: &mut [f32]) {
    let (dn, dr, dv, r) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank);
    let (dq, w) = (dn + dr, r + dr);
    // Head-major (H, n, r) so that each head is one task.
    let mut q_lat = vec![0.0f32; n_heads * n * r];
    for_each_chunk(&mut q_lat, n * r, |h, dst| {
        let mut row = vec![0.0f32; r];
        for d in 0..dn {
            kv_b.row_into(h * (dn + dv) + d, &mut row);
            for i in 0..n {
                let qv = q[(i * n_heads + h) * dq + d];
                for (t, u) in dst[i * r..(i + 1) * r].iter_mut().zip(&row) {
                    *t += qv * u;
                }
            }
        }
    });
    for i in 0..n {
        for h in 0..n_heads {
            let at = (i * n_heads + h) * w;
            qc[at..at + r].copy_from_slice(&q_lat[(h * n + i) * r..(h * n + i + 1) * r]);
            qc[at + r..at + w].copy_from_slice(&q[(i * n_heads + h) * dq + dn..(i * n_heads + h + 1) * dq]);
        }
    }
}

/// The CPU's `Ops::attend_mla`: appends the n rows of `ckv` ([latent, rotated key] and
/// DSA's indexer key where the layer has one: `row` floats each) to `cache` (the latents
/// in `k`, the rest in `v`), then per head and position the scores of `qc`'s row against
/// the visible positions, or the selected ones (`sel`, ascending), latent and rotary dot
/// products, softmax, and the probability-weighted sum of their latents into `ctx` (H, n, r).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    cache: &mut LayerCache,
    qc: &[f32],
    ckv: &[f32],
    row: usize,
    s: AttendShape,
    m: &MlaConfig,
    sel: Option<&Selection>,
    ctx: &mut [f32],
) {
    let (n, nh, pos0) = (s.n, s.n_heads, s.pos0);
    let (dr, r) = (m.qk_rope_head_dim, m.kv_lora_rank);
    let w = r + dr;
    let mut latent = Vec::with_capacity(n * r);
    let mut rest = Vec::with_capacity(n * (row - r));
    for x in ckv[..n * row].chunks_exact(row) {
        latent.extend_from_slice(&x[..r]);
        rest.extend_from_slice(&x[r..]);
    }
    cache.append(&latent, &rest, r, row - r);
    // One task per (head, position).
    let (cl, ckr, vw) = (&cache.k, &cache.v, row - r);
    for_each_chunk(&mut ctx[..nh * n * r], r, |idx, dst| {
        let (h, i) = (idx / n, idx % n);
        let p = pos0 + i;
        let visible: Vec<usize> = match sel.and_then(|s| s.get(i)).and_then(Option::as_ref) {
            Some(kept) => kept.iter().map(|&j| j as usize).collect(),
            None => (first_visible(p, s.window)..=p).collect(),
        };
        let q = &qc[(i * nh + h) * w..(i * nh + h + 1) * w];
        let (ql, qr) = q.split_at(r);
        let mut scores: Vec<f32> = visible
            .iter()
            .map(|&j| (math::dot(ql, &cl[j * r..(j + 1) * r]) + math::dot(qr, &ckr[j * vw..j * vw + dr])) * s.scale)
            .collect();
        math::softmax(&mut scores);
        dst.fill(0.0);
        for (s, &j) in scores.iter().zip(&visible) {
            for (d, c) in dst.iter_mut().zip(&cl[j * r..(j + 1) * r]) {
                *d += s * c;
            }
        }
    });
}
