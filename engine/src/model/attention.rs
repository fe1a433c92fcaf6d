//! The one attention module: grouped-query attention over a KV cache, with the options
//! the families need (qkv bias, q/k RMSNorm per head or over the whole projection,
//! clip_qkv, sliding window, partial RoPE, an o_proj bias and gpt_oss's
//! attention sinks, qwen3_next's sigmoid output gate), or Multi-head Latent Attention
//! ([`crate::model::mla`], deepseek_v3) whose cache holds compressed latents, or Gated
//! DeltaNet linear attention ([`crate::model::deltanet`], qwen3_next) whose recurrent
//! state replaces the cache.

use crate::error::Result;
use crate::kernels::for_each_chunk;
use crate::math;
use crate::model::config::{MlaConfig, QkNorm};
use crate::model::deltanet::DeltaState;
use crate::tensor::Mat;

#[derive(Clone, Debug)]
pub struct AttnOpts {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub qk_norm: QkNorm,
    pub clip_qkv: Option<f32>,
    /// Attend to at most the last `w` positions (the current one included).
    pub window: Option<usize>,
    /// Multiplies q.k (transformers: head_dim ** -0.5; MLA: times YaRN's mscale^2).
    pub scale: f32,
    pub rms_eps: f32,
    /// Multi-head Latent Attention's sizes (with `AttnWeights::Mla`).
    pub mla: Option<MlaConfig>,
    /// wq yields per head the query and then as many gate values; the output of the
    /// head is multiplied by sigmoid(gate) before wo (qwen3_next).
    pub output_gate: bool,
}

/// Grouped-query attention's weights, as matrices `M` and vectors `V` of a backend: the
/// CPU's [`Mat`] and `Vec<f32>` as loaded, or a GPU's buffers ([`GqaWeights::try_map`]).
/// The graph (`model::graph`) runs them on either.
pub struct GqaWeights<M = Mat, V = Vec<f32>> {
    /// (n_heads*head_dim, hidden); (n_heads*2*head_dim, hidden) with an output gate:
    /// per head the query rows, then the gate rows.
    pub wq: M,
    /// (n_kv_heads*head_dim, hidden)
    pub wk: M,
    /// (n_kv_heads*head_dim, hidden)
    pub wv: M,
    /// (hidden, n_heads*head_dim)
    pub wo: M,
    /// As many as wq has rows.
    pub bq: Option<V>,
    pub bk: Option<V>,
    pub bv: Option<V>,
    /// (hidden)
    pub bo: Option<V>,
    /// (n_heads): one learned logit per head that joins its softmax denominator (gpt_oss).
    pub sinks: Option<V>,
    /// (head_dim) for QkNorm::PerHead, (n_heads*head_dim) for QkNorm::Full
    pub q_norm: Option<V>,
    /// (head_dim) for QkNorm::PerHead, (n_kv_heads*head_dim) for QkNorm::Full
    pub k_norm: Option<V>,
}

impl<M, V> GqaWeights<M, V> {
    /// The same weights in another backend's form: `m` and `v` convert one matrix and one
    /// vector, given their names (wq, bq, ..., as the fields).
    pub fn try_map<M2, V2>(
        &self,
        m: impl Fn(&str, &M) -> Result<M2>,
        v: impl Fn(&str, &V) -> Result<V2>,
    ) -> Result<GqaWeights<M2, V2>> {
        let ov = |name: &str, x: &Option<V>| x.as_ref().map(|x| v(name, x)).transpose();
        Ok(GqaWeights {
            wq: m("wq", &self.wq)?,
            wk: m("wk", &self.wk)?,
            wv: m("wv", &self.wv)?,
            wo: m("wo", &self.wo)?,
            bq: ov("bq", &self.bq)?,
            bk: ov("bk", &self.bk)?,
            bv: ov("bv", &self.bv)?,
            bo: ov("bo", &self.bo)?,
            sinks: ov("sinks", &self.sinks)?,
            q_norm: ov("q_norm", &self.q_norm)?,
            k_norm: ov("k_norm", &self.k_norm)?,
        })
    }
}

/// What one layer caches for every position so far. GQA: keys in `k` and values in `v`,
/// (len, n_kv_heads*head_dim) each. MLA: the normalised latents in `k` (len,
/// kv_lora_rank) and the rotated shared keys in `v` (len, qk_rope_head_dim). Gated
/// DeltaNet: nothing per position, the recurrent state in `recurrent`.
#[derive(Clone, Default)]
pub struct LayerCache {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Floats per position in `k` and in `v` (set by the first append).
    k_width: usize,
    v_width: usize,
    /// A linear-attention layer's state (None for attention layers).
    pub recurrent: Option<Box<DeltaState>>,
}

impl LayerCache {
    /// Positions cached.
    pub fn len(&self) -> usize {
        match &self.recurrent {
            Some(r) => r.pos,
            None => self.k.len().checked_div(self.k_width).unwrap_or(0),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Floats cached per position (both parts).
    pub fn width(&self) -> usize {
        self.k_width + self.v_width
    }

    /// Appends positions: `k` in rows of `k_width` floats, `v` in rows of `v_width`.
    pub fn append(&mut self, k: &[f32], v: &[f32], k_width: usize, v_width: usize) {
        self.k_width = k_width;
        self.v_width = v_width;
        self.k.extend_from_slice(k);
        self.v.extend_from_slice(v);
    }

    /// Keeps the first `positions` positions. A recurrent state may keep fewer (see
    /// [`DeltaState::rewind`]); [`LayerCache::len`] says how many.
    pub fn truncate(&mut self, positions: usize) {
        self.k.truncate(positions * self.k_width);
        self.v.truncate(positions * self.v_width);
        if let Some(r) = &mut self.recurrent {
            r.rewind(positions);
        }
    }
}

/// The first position that position `p` attends to.
pub fn first_visible(p: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (p + 1).saturating_sub(w))
}

/// The shapes of one attention call over a layer's cache (the positions of this pass,
/// from `pos0`, after those already cached).
#[derive(Clone, Copy, Debug)]
pub struct AttendShape {
    pub n: usize,
    pub pos0: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Attend to at most the last `w` positions (the current one included).
    pub window: Option<usize>,
    pub scale: f32,
}

/// Causal attention of the n queries `q` (n, n_heads * head_dim) over the keys and values
/// in `cache` (the pass's positions already appended) into `out` (same shape).
pub(crate) fn attend_cached(cache: &LayerCache, q: &[f32], s: AttendShape, sinks: Option<&[f32]>, out: &mut [f32]) {
    let hd = s.head_dim;
    let (qd, kvd) = (s.n_heads * hd, s.n_kv_heads * hd);
    let group = s.n_heads / s.n_kv_heads;
    let (ck, cv) = (&cache.k, &cache.v);
    // One task per block of positions and block of heads: scores over the visible keys,
    // softmax, weighted values. A block's heads walk the cache together, position by
    // position, so each cached row is read as one contiguous run (a head alone would read
    // only its head_dim floats of every row, a new page per position at OLMoE's shape,
    // which the prefetchers do not follow). Many positions (prefill) go in blocks of
    // consecutive queries with every head, so that each cached row is read once per block
    // instead of once per query ([`task_shape`]).
    let (qb, hb) = task_shape(s.n_heads, s.n);
    let simd = attend_simd();
    for_each_chunk(&mut out[..s.n * qd], qb * hb * hd, |idx, dst| {
        let blocks = s.n_heads / hb;
        let (i, h0) = (idx / blocks * qb, idx % blocks * hb);
        let nq = dst.len() / (hb * hd);
        let heads = Heads {
            q: &q[i * qd + h0 * hd..(i + nq - 1) * qd + (h0 + hb) * hd],
            nq,
            k: ck,
            v: cv,
            stride: kvd,
            h0,
            nh: hb,
            group,
            hd,
            p0: s.pos0 + i,
            window: s.window,
            scale: s.scale,
            sinks: sinks.map(|s| &s[h0..h0 + hb]),
        };
        attend(&heads, dst, simd);
    });
}

/// (Positions, heads) per attention task for `positions` queries. Many positions: blocks of
/// up to 16 consecutive ones with every head (a block's output is then one contiguous
/// run), at least four blocks per thread. At prefill the cached rows were read once per
/// query: for a 1024-token prompt at OLMoE's shape about 130 GB of keys and values
/// (computed; mostly from the caches), and attention took a fifth of the prefill (docs/benchmarks.md "Prefill of
/// long prompts"). Otherwise one position per task and [`heads_per_task`] heads.
fn task_shape(n_heads: usize, positions: usize) -> (usize, usize) {
    let qb = (positions / (4 * crate::kernels::threads())).min(16);
    if qb >= 2 {
        return (qb, n_heads);
    }
    (1, heads_per_task(n_heads, positions))
}

/// Heads per attention task: up to 16 (one 8 KiB run of a cached row at head_dim 128: the
/// whole row at OLMoE's shape, where 8 heads read every other 4 KiB page of the cache and
/// one-thread decode after a 1024-token prompt ran 6% slower, docs/benchmarks.md "Prefill
/// of long prompts"), fewer when the positions times the blocks would not give every
/// thread a task. A divisor of `n_heads`; each head's sums are the same whatever the block.
fn heads_per_task(n_heads: usize, positions: usize) -> usize {
    let threads = crate::kernels::threads();
    (1..=n_heads.min(16))
        .rev()
        .find(|&b| n_heads.is_multiple_of(b) && positions * (n_heads / b) >= threads)
        .unwrap_or(1)
}

/// A block of `nq` consecutive query positions (from `p0`) and `nh` consecutive query heads
/// and their view of the cache: head `t` of query `i` (`q[i * qd + t * hd..]`, qd the
/// row width of every head, so with one query only the block's heads are there) is head
/// `h0 + t` and reads kv head `(h0 + t) / group`, whose key and value of position j start
/// at `j * stride + kvh * hd`. Query i sees positions `first_visible(p0 + i, window)..=p0 +
/// i`. Several queries come only with every head (`nh` = the layer's heads).
struct Heads<'a> {
    q: &'a [f32],
    nq: usize,
    k: &'a [f32],
    v: &'a [f32],
    stride: usize,
    h0: usize,
    nh: usize,
    group: usize,
    hd: usize,
    p0: usize,
    window: Option<usize>,
    scale: f32,
    sinks: Option<&'a [f32]>,
}

impl Heads<'_> {
    /// The positions query `i` sees.
    fn visible(&self, i: usize) -> std::ops::Range<usize> {
        first_visible(self.p0 + i, self.window)..self.p0 + i + 1
    }
}

/// Whether [`attend`] runs its SIMD build: AVX2 on x86-64, NEON on aarch64, SIMD128 in
/// wasm (unless `COLIBRI_SIMD=scalar` forces the reference). Every build runs the same
/// loops with a dot product of the same eight lanes ([`math::dot`] and its twins), each
/// product and sum rounded on its own, so the bits are the same.
fn attend_simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::qdot::Simd::active().pairs()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        crate::qdot::Simd::active() != crate::qdot::Simd::Scalar
    }
}

/// For each query and head of the block: scores over the visible keys, softmax (with the
/// head's sink), the weighted sum of the values into its `hd` floats of `dst` (laid out as
/// the block's queries).
fn attend(h: &Heads, dst: &mut [f32], simd: bool) {
    if !simd {
        return attend_body(h, dst, false, math::dot);
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `simd` comes from attend_simd, true on x86-64 only where AVX2 was detected.
    unsafe {
        attend_avx2(h, dst)
    }
    #[cfg(target_arch = "aarch64")]
    attend_body(h, dst, true, math::dot_neon);
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    attend_body(h, dst, true, math::dot_simd128);
    #[cfg(not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        all(target_arch = "wasm32", target_feature = "simd128")
    )))]
    attend_body(h, dst, true, math::dot);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn attend_avx2(h: &Heads, dst: &mut [f32]) {
    // SAFETY: this function runs only where AVX2 is present.
    attend_body(h, dst, true, |a, b| unsafe { math::dot_avx2(a, b) })
}

#[inline(always)]
/// `simd`: the softmax's exponentials in lanes too ([`math::softmax_lanes`]: the same bits).
fn attend_body(h: &Heads, dst: &mut [f32], simd: bool, dot: impl Fn(&[f32], &[f32]) -> f32) {
    let (hd, nh, nq) = (h.hd, h.nh, h.nq);
    // Query i's head t: its query and output at i * row + t * hd.
    let row = nh * hd;
    let kv = |t: usize| (h.h0 + t) / h.group * hd;
    // Query i sees positions lo..lo + len; its scores, head by head, start at `at` (head t's
    // at at + t * len).
    let mut spans = Vec::with_capacity(nq);
    let mut total = 0;
    for i in 0..nq {
        let vis = h.visible(i);
        spans.push((vis.start, vis.len(), total));
        total += nh * vis.len();
    }
    let mut scores = vec![0.0f32; total];
    // Every query's positions, in ascending order: each cached row is read once for the
    // block, and each (query, head) meets its positions in the order of one query alone,
    // so its sums are the same bits whatever the block. Plain loops, not iterator chains:
    // their bodies are compiled inside this function (and so in attend_avx2, whose vectors
    // are 256 bits wide).
    let all = h.visible(0).start..h.p0 + nq;
    for j in all.clone() {
        let krow = &h.k[j * h.stride..];
        for (i, &(lo, len, at)) in spans.iter().enumerate() {
            if !(lo..lo + len).contains(&j) {
                continue;
            }
            for t in 0..nh {
                let o = kv(t);
                let qt = &h.q[i * row + t * hd..i * row + (t + 1) * hd];
                scores[at + t * len + j - lo] = dot(qt, &krow[o..o + hd]) * h.scale;
            }
        }
    }
    for &(_, len, at) in &spans {
        for (t, s) in scores[at..at + nh * len].chunks_exact_mut(len.max(1)).enumerate() {
            // exp(-inf - m) adds +0.0 to a positive sum: without a sink, the plain softmax.
            math::softmax_lanes(s, h.sinks.map_or(f32::NEG_INFINITY, |sk| sk[t]), simd);
        }
    }
    dst.iter_mut().for_each(|d| *d = 0.0);
    for j in all {
        let vrow = &h.v[j * h.stride..];
        for (i, &(lo, len, at)) in spans.iter().enumerate() {
            if !(lo..lo + len).contains(&j) {
                continue;
            }
            for t in 0..nh {
                let (o, s) = (kv(t), scores[at + t * len + j - lo]);
                for (d, vv) in dst[i * row + t * hd..i * row + (t + 1) * hd].iter_mut().zip(&vrow[o..o + hd]) {
                    *d += s * vv;
                }
            }
        }
    }
}

/// Takes `qg` (n, heads, 2 * hd), per head the query then the gate, apart into `q` and
/// `gate` (n, heads * hd) each.
pub(crate) fn split_gate(qg: &[f32], n: usize, heads: usize, hd: usize, q: &mut [f32], gate: &mut [f32]) {
    let rows = qg.chunks_exact(2 * hd).take(n * heads);
    for ((head, qd), gd) in rows.zip(q.chunks_exact_mut(hd)).zip(gate.chunks_exact_mut(hd)) {
        qd.copy_from_slice(&head[..hd]);
        gd.copy_from_slice(&head[hd..]);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A random matrix (also the CPU backend's attention tests').
    pub(crate) fn mat(rows: usize, cols: usize, seed: u64) -> Mat {
        let mut s = seed;
        let v: Vec<f32> = (0..rows * cols)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect();
        Mat::from_f32(rows, cols, &v).unwrap()
    }

    #[test]
    fn head_and_query_blocks_and_vector_widths_give_the_same_bits() {
        // 8 query heads on 4 kv heads, head_dim 20 (a tail after two 8-float chunks), 9
        // cached positions of which the last 5 are this pass's queries, a window and sinks:
        // every block of heads (one query per task) and every block of queries (all heads)
        // and, where the CPU has it, the SIMD build must give the bits of one head of one
        // query at a time.
        let (nh, group, hd, len, n) = (8, 2, 20, 9, 5);
        let (qd, kvd) = (nh * hd, nh / group * hd);
        let noise = |n: usize, seed: u64| mat(1, n, seed).to_f32();
        let (q, k, v) = (noise(n * qd, 7), noise(len * kvd, 8), noise(len * kvd, 9));
        let sinks: Vec<f32> = (0..nh).map(|i| i as f32 * 0.3 - 1.0).collect();
        for window in [None, Some(3)] {
            let run = |qb: usize, hb: usize, wide: bool| {
                let mut out = vec![0.0f32; n * qd];
                for (idx, dst) in out.chunks_mut(qb * hb * hd).enumerate() {
                    let (i, h0) = (idx / (nh / hb) * qb, idx % (nh / hb) * hb);
                    let nq = dst.len() / (hb * hd);
                    let heads = Heads {
                        q: &q[i * qd + h0 * hd..(i + nq - 1) * qd + (h0 + hb) * hd],
                        nq,
                        k: &k,
                        v: &v,
                        stride: kvd,
                        h0,
                        nh: hb,
                        group,
                        hd,
                        p0: len - n + i,
                        window,
                        scale: 0.25,
                        sinks: Some(&sinks[h0..h0 + hb]),
                    };
                    attend(&heads, dst, wide);
                }
                out
            };
            let reference = run(1, 1, false);
            let shapes = [(1, 2), (1, 4), (1, 8), (2, 8), (3, 8), (5, 8)];
            for (qb, hb) in shapes {
                assert_eq!(run(qb, hb, false), reference, "{qb} queries, {hb} heads, window {window:?}");
                if attend_simd() {
                    assert_eq!(run(qb, hb, true), reference, "SIMD build, {qb} queries, {hb} heads");
                }
            }
            assert!(reference.iter().all(|x| x.is_finite()) && reference.iter().any(|&x| x != 0.0));
        }
    }

    #[test]
    fn many_positions_go_in_query_blocks() {
        let threads = crate::kernels::threads();
        assert_eq!(task_shape(16, 1), (1, heads_per_task(16, 1)));
        assert_eq!(task_shape(16, 256 * threads), (16, 16));
        assert_eq!(task_shape(16, 8 * threads), (2, 16));
    }
}
