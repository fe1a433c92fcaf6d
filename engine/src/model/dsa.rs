//! DeepSeek Sparse Attention (deepseek_v32, glm_moe_dsa): a lightning indexer picks, for
//! every query, the `index_topk` cached positions that multi-head latent attention
//! ([`crate::model::mla`]) then attends to. Reference: transformers' `DeepseekV32Indexer`
//! and `GlmMoeDsaAttention` (v5.23).
//!
//! transformers, per position (Hi indexer heads of Di, dr = qk_rope_head_dim):
//! ```text
//! q_h  = wq_b(q_resid)_h          q_resid = q_a_layernorm(q_a_proj(x)), MLA's own
//! k    = LayerNorm(wk(x))         one key per position, weight and bias, eps 1e-6
//! RoPE on the first dr of q_h and k (half-split in V3.2, interleaved pairs in GLM-5)
//! w_h  = weights_proj(x)_h * Hi^-0.5
//! score(i, j) = sum_h w_h(i) * relu(q_h(i) . k(j) * Di^-0.5)       for j <= i
//! keep the index_topk best j per query; MLA attends to those only
//! ```
//! Here the indexer's key is cached with the layer's MLA row ([latent, rotary key,
//! indexer key]), so a conversation continued from the KV file selects the same
//! positions. The selection is computed only where a query sees more than `index_topk`
//! positions; otherwise it keeps every visible position, which is plain MLA bit for bit
//! (the attention sums over the same positions in the same order). Ties: the higher score
//! first, then the earlier position; the kept positions are attended in ascending order.
//! glm_moe_dsa's "shared" layers run no indexer and reuse the selection of the last layer
//! that did.

use crate::error::Result;
use crate::format::tensors::TensorStore;
use crate::kernels::for_each_chunk_if;
use crate::math;
use crate::model::config::DsaConfig;
use crate::tensor::Mat;

/// Positions scored per parallel task.
const SCORE_CHUNK: usize = 512;

/// transformers builds the indexer's k_norm with eps 1e-6.
pub(crate) const INDEX_NORM_EPS: f32 = 1e-6;

/// One layer's indexer weights, as a backend's matrices `M` and vectors `V`.
pub struct IndexerWeights<M = Mat, V = Vec<f32>> {
    /// (Hi*Di, q_lora_rank)
    pub wq_b: M,
    /// (Di, hidden)
    pub wk: M,
    /// LayerNorm of the key: weight and bias (Di)
    pub k_norm: V,
    pub k_bias: V,
    /// (Hi, hidden)
    pub weights_proj: M,
}

impl IndexerWeights {
    /// Loads `{prefix}.indexer.{wq_b, wk, k_norm, weights_proj}`.
    pub fn load(s: &TensorStore, prefix: &str, hidden: usize, q_lora_rank: usize, d: &DsaConfig) -> Result<Self> {
        let p = format!("{prefix}.indexer");
        let w = |name: &str, rows: usize, cols: usize| s.mat(&format!("{p}.{name}.weight"), rows, cols);
        Ok(IndexerWeights {
            wq_b: w("wq_b", d.n_heads * d.head_dim, q_lora_rank)?,
            wk: w("wk", d.head_dim, hidden)?,
            k_norm: s.vector(&format!("{p}.k_norm.weight"), d.head_dim)?,
            k_bias: s.vector(&format!("{p}.k_norm.bias"), d.head_dim)?,
            weights_proj: w("weights_proj", d.n_heads, hidden)?,
        })
    }
}

impl<M, V> IndexerWeights<M, V> {
    /// The same weights in another backend's form (names: idx_wq_b, idx_wk, idx_k_norm,
    /// idx_k_bias, idx_weights).
    pub fn try_map<M2, V2>(
        &self,
        m: &impl Fn(&str, &M) -> Result<M2>,
        v: &impl Fn(&str, &V) -> Result<V2>,
    ) -> Result<IndexerWeights<M2, V2>> {
        Ok(IndexerWeights {
            wq_b: m("idx_wq_b", &self.wq_b)?,
            wk: m("idx_wk", &self.wk)?,
            k_norm: v("idx_k_norm", &self.k_norm)?,
            k_bias: v("idx_k_bias", &self.k_bias)?,
            weights_proj: m("idx_weights", &self.weights_proj)?,
        })
    }
}

/// In-place LayerNorm of `x` with weight `w` and bias `b`: the mean (sum in index order
/// over the length), the variance of the deviations (the same order), then
/// `(x - mean) * (1 / sqrt(var + eps)) * w + b`, each product rounded before the add.
pub(crate) fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f32;
    let mean = x.iter().fold(0.0f32, |a, v| a + v) / n;
    let var = x.iter().fold(0.0f32, |a, v| a + (v - mean) * (v - mean)) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, wi), bi) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * inv * wi + bi;
    }
}

/// The positions each query of a pass attends to: None where it keeps every visible one.
pub(crate) type Selection = Vec<Option<Vec<u32>>>;

/// The indexer's shapes for one pass.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IndexShape {
    pub n: usize,
    pub pos0: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub topk: usize,
}

/// The indexer's two scales: the dot product's (Di^-0.5) and the head weights' (Hi^-0.5).
pub(crate) fn scales(s: IndexShape) -> (f32, f32) {
    ((s.head_dim as f32).powf(-0.5), (s.heads as f32).powf(-0.5))
}

/// The score of one query (`q`, Hi heads of Di, head weights `w` already scaled) against
/// one key: heads ascending from 0.0, `w_h * max(dot * scale, 0)` each.
fn score(q: &[f32], w: &[f32], k: &[f32], di: usize, scale: f32) -> f32 {
    w.iter().enumerate().fold(0.0f32, |acc, (h, wh)| {
        let d = math::dot(&q[h * di..(h + 1) * di], k) * scale;
        acc + wh * d.max(0.0)
    })
}

/// DSA's selection for the n queries of a pass (the CPU's `Ops::index_select`): `iq` (n,
/// Hi, Di) the indexer's rotated queries, `iw` (n, Hi) weights_proj's output, and
/// `key(j)` the indexer key of position j (cached, or of this pass).
pub(crate) fn select<'k>(iq: &[f32], iw: &[f32], s: IndexShape, key: impl Fn(usize) -> &'k [f32] + Sync) -> Selection {
    let (hi, di) = (s.heads, s.head_dim);
    let (scale, head_scale) = scales(s);
    (0..s.n)
        .map(|i| {
            let p = s.pos0 + i;
            if p < s.topk {
                return None;
            }
            let q = &iq[i * hi * di..(i + 1) * hi * di];
            let w: Vec<f32> = iw[i * hi..(i + 1) * hi].iter().map(|w| w * head_scale).collect();
            // Every visible position's score, in parallel chunks (each score is computed
            // alone, so the chunking changes no bit).
            let mut scores = vec![0.0f32; p + 1];
            for_each_chunk_if(p + 1 >= 2 * SCORE_CHUNK, &mut scores, SCORE_CHUNK, |c, dst| {
                for (k, d) in dst.iter_mut().enumerate() {
                    *d = score(q, &w, key(c * SCORE_CHUNK + k), di, scale);
                }
            });
            Some(choose(scores, s.topk))
        })
        .collect()
}

/// The selection from scores computed elsewhere (the GPU's index_scores.wgsl): row i of
/// `scores` (n, pos0 + n) holds query i's scores of positions 0..=pos0 + i.
#[cfg(feature = "wgpu")]
pub(crate) fn select_scored(scores: &[f32], s: IndexShape) -> Selection {
    let stride = s.pos0 + s.n;
    (0..s.n)
        .map(|i| {
            let p = s.pos0 + i;
            (p >= s.topk).then(|| choose(scores[i * stride..i * stride + p + 1].to_vec(), s.topk))
        })
        .collect()
}

/// The `topk` best of `scores` (position j's at j): the higher score first, then the
/// earlier position (a total order: NaN last), returned in ascending position order.
fn choose(scores: Vec<f32>, topk: usize) -> Vec<u32> {
    let mut scored: Vec<(f32, u32)> = scores.into_iter().zip(0u32..).collect();
    let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    scored.select_nth_unstable_by(topk - 1, order);
    let mut kept: Vec<u32> = scored[..topk].iter().map(|x| x.1).collect();
    kept.sort_unstable();
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_centres_and_scales() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        layer_norm(&mut x, &[1.0; 4], &[0.5; 4], 0.0);
        let mean: f32 = x.iter().sum::<f32>() / 4.0;
        assert!((mean - 0.5).abs() < 1e-6, "{x:?}");
        assert!(x[0] < x[1] && x[2] < x[3]);
    }

    #[test]
    fn selection_keeps_the_best_and_breaks_ties_by_position() {
        // One head of one dimension: score(j) = relu(k_j), weight 1.
        let keys: Vec<[f32; 1]> = [0.5, 2.0, 2.0, -1.0, 3.0, 2.0].iter().map(|v| [*v]).collect();
        let s = IndexShape { n: 2, pos0: 4, heads: 1, head_dim: 1, topk: 3 };
        let sel = select(&[1.0, 1.0], &[1.0, 1.0], s, |j| &keys[j][..]);
        // Query at 4 sees 0..=4: best 3.0 (4), then 2.0 at 1 and 2 (earlier first).
        assert_eq!(sel[0], Some(vec![1, 2, 4]));
        // Query at 5: 3.0 (4), then the 2.0s at 1 and 2 win over 5.
        assert_eq!(sel[1], Some(vec![1, 2, 4]));
        // Up to topk visible positions: everything (None).
        let s = IndexShape { n: 1, pos0: 2, heads: 1, head_dim: 1, topk: 3 };
        assert_eq!(select(&[1.0], &[1.0], s, |j| &keys[j][..]), vec![None]);
    }
}
