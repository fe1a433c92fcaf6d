//! The forward pass, written once: embedding -> for each layer [RMSNorm -> attention ->
//! residual -> RMSNorm -> FFN -> residual] -> final RMSNorm -> lm_head, over the
//! operations of a [`Backend`]. The CPU backend ([`super::cpu`]) executes each operation
//! as it comes; the wgpu backend (`gpu::backend`) records it for the device. Both run
//! this one description, so a family's graph is written here once and each backend only
//! supplies operations; the CPU stays the reference whose bits the GPU kernels reproduce.
//!
//! Grouped-query attention, multi-head latent attention (deepseek_v3's, with its absorbed
//! projections and compressed cache, and DeepSeek Sparse Attention's indexer), Gated
//! DeltaNet and the FFN (a dense SwiGLU MLP, or a MoE layer: the one routing function, the
//! batch's union of experts, the shared expert and its gate) are composed here from the
//! operations. What stays per backend is where the routed experts come from and run
//! ([`Backend::experts`]: streamed and cached on the CPU, pooled or hybrid on the GPU).

mod v4;

use crate::error::Result;
pub(crate) use crate::model::attention::AttendShape;
use crate::model::attention::{AttnOpts, GqaWeights};
use crate::model::config::Activation;
use crate::model::config::{DsaConfig, LinearAttnConfig, MlaConfig, QkNorm, V4Attn};
use crate::model::deltanet::{DeltaNetWeights, InProj};
pub(crate) use crate::model::dsa::IndexShape;
use crate::model::dsa::{IndexerWeights, INDEX_NORM_EPS};
use crate::model::mla::{MlaWeights, QueryProj, LATENT_NORM_EPS};
use crate::model::moe::{batch_union, Routing};
pub(crate) use crate::model::v4::attn::AttendShape as V4AttendShape;
pub(crate) use crate::model::v4::compress::CompShape;
pub(crate) use crate::model::v4::{HcShape, SelectShape};
use crate::model::v4::{HyperConnection, V4Attention, V4Weights};
use crate::model::{Logits, Model};

/// One layer's attention as the graph sees it: grouped-query attention composed from the
/// operations, or a variant the backend runs as one operation.
pub(crate) enum Attn<'w, M, V> {
    Gqa(&'w GqaWeights<M, V>),
    /// Multi-head latent attention ([`mla`]).
    Mla(&'w MlaWeights<M, V>),
    /// Gated DeltaNet linear attention ([`deltanet`]).
    Linear(&'w DeltaNetWeights<M, V>),
}

/// A SwiGLU MLP's projections (a dense FFN, or a MoE layer's shared expert):
/// `down(silu(gate x) * up x)`, `inter` the rows of gate and up.
pub(crate) struct MlpRef<'w, M> {
    pub(crate) gate: &'w M,
    pub(crate) up: &'w M,
    pub(crate) down: &'w M,
    pub(crate) inter: usize,
}

/// One layer's FFN as the graph sees it.
pub(crate) enum FfnRef<'w, M> {
    Dense(MlpRef<'w, M>),
    /// Routed experts ([`Backend::route`], [`Backend::experts`]) and the shared expert with
    /// its sigmoid gate (qwen2_moe: a (1, hidden) projection) or without (deepseek_v3).
    Moe {
        n_experts: usize,
        shared: Option<(MlpRef<'w, M>, Option<&'w M>)>,
    },
}

/// The tensor operations of a backend: its weights (`M` matrices, `V` vectors) and
/// activations (`T`, a handle to a run of floats). Outputs are `&mut`; a backend may hand
/// out the same storage again for a label once the tensor it gave before for that label
/// is dropped (the graph never holds two live tensors of one label).
///
/// Every operation is the bit-exact twin of the CPU's: the GPU's WGSL kernels reproduce
/// the CPU kernels' arithmetic and order (docs/gpu.md).
pub(crate) trait Ops<'w> {
    type T;
    type M: 'w;
    type V: 'w;

    /// The first position of this pass (the positions already cached).
    fn pos0(&self) -> usize;
    /// A tensor of `len` floats (contents unspecified).
    fn alloc(&mut self, label: &'static str, len: usize) -> Result<Self::T>;
    /// `dst[dst_at..dst_at + len] = src[at..at + len]`.
    fn copy(&mut self, src: &Self::T, at: usize, dst: &mut Self::T, dst_at: usize, len: usize) -> Result<()>;
    /// In-place RMSNorm of `rows` rows of `width` floats with weight `w` (kernels::rmsnorm).
    fn rmsnorm(&mut self, t: &mut Self::T, rows: usize, width: usize, w: &Self::V, eps: f32) -> Result<()> {
        self.rmsnorm_at(t, 0, rows, width, width, w, eps)
    }
    /// [`Ops::rmsnorm`] of rows that start at `at` and lie `stride` floats apart.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_at(
        &mut self,
        t: &mut Self::T,
        at: usize,
        rows: usize,
        width: usize,
        stride: usize,
        w: &Self::V,
        eps: f32,
    ) -> Result<()>;
    /// `x[i] += y[i]` for i < len.
    fn add(&mut self, x: &mut Self::T, y: &Self::T, len: usize) -> Result<()>;
    /// `t[i] += b[i % period]` for i < len (`period` = b's length).
    fn add_bias(&mut self, t: &mut Self::T, b: &Self::V, len: usize, period: usize) -> Result<()>;
    /// Each job's `out[p, :] = w x[row0 + p, :]` for p < n (kernels::matmul_many).
    fn matmul(&mut self, jobs: &mut [(&Self::M, &mut Self::T)], x: &Self::T, row0: usize, n: usize) -> Result<()>;
    /// `out[at + p * stride..][..w.rows] = w x[row0 + p, :]` for p < n: one matmul whose
    /// output rows lie `stride` floats apart (a head's slice of a wider row).
    #[allow(clippy::too_many_arguments)]
    fn matmul_at(
        &mut self,
        w: &Self::M,
        x: &Self::T,
        row0: usize,
        n: usize,
        out: &mut Self::T,
        at: usize,
        stride: usize,
    ) -> Result<()>;
    /// `t[i] = clamp(t[i], -c, c)` for i < len.
    fn clamp(&mut self, t: &mut Self::T, len: usize, c: f32) -> Result<()>;
    /// `qg` (n, heads, 2 * hd), per head the query then the gate, apart into `q` and `gate`
    /// (n, heads * hd) each.
    fn split_gate(
        &mut self,
        qg: &Self::T,
        n: usize,
        heads: usize,
        hd: usize,
        q: &mut Self::T,
        gate: &mut Self::T,
    ) -> Result<()>;
    /// In-place RoPE of the pass's n positions, `heads` heads of `head_dim` each.
    fn rope(&mut self, t: &mut Self::T, n: usize, heads: usize, head_dim: usize) -> Result<()> {
        self.rope_at(t, n, heads, head_dim, 0, false)
    }
    /// In-place RoPE of the rotary dims at `at + (i * heads + h) * stride` of position i and
    /// head h. `interleaved`: the values come as neighbouring pairs (DeepSeek's
    /// rope_interleave) and are put in rotate-half order first (rope::deinterleave), as
    /// transformers returns them.
    fn rope_at(
        &mut self,
        t: &mut Self::T,
        n: usize,
        heads: usize,
        stride: usize,
        at: usize,
        interleaved: bool,
    ) -> Result<()>;
    /// Appends the keys and values of the pass's positions to layer `l`'s cache, then
    /// causal attention of the queries over it (with per-head sink logits) into `out`
    /// (n, n_heads * head_dim).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &mut self,
        l: usize,
        q: &Self::T,
        k: &Self::T,
        v: &Self::T,
        shape: AttendShape,
        sinks: Option<&Self::V>,
        out: &mut Self::T,
    ) -> Result<()>;
    /// MLA's absorbed queries: `qc` (n, H, r + dr) = per position and head
    /// [W_uk_h^T q_nope_h, q_rot_h] from `q` (n, H, dn + dr); W_uk_h is head h's first dn
    /// rows of `kv_b` (summed in ascending row order from 0.0).
    fn mla_absorb(
        &mut self,
        kv_b: &Self::M,
        q: &Self::T,
        n: usize,
        heads: usize,
        m: &MlaConfig,
        qc: &mut Self::T,
    ) -> Result<()>;
    /// Appends the n rows of `ckv` ([normalised latent, rotated key] and DSA's indexer key
    /// where the layer has one: `m.cache_width_at(l)` each) to layer `l`'s cache, then MLA's
    /// causal attention of `qc`'s rows over it (scores against the latents and the keys,
    /// the latents as the values) into `ctx`, head-major (H, n, r); with DSA over the
    /// positions of the last [`Ops::index_select`] only.
    fn attend_mla(
        &mut self,
        l: usize,
        qc: &Self::T,
        ckv: &Self::T,
        shape: AttendShape,
        m: &MlaConfig,
        ctx: &mut Self::T,
    ) -> Result<()>;
    /// In-place LayerNorm (weight and bias) of `rows` rows of `width` floats that start at
    /// `at` and lie `stride` apart (dsa::layer_norm).
    #[allow(clippy::too_many_arguments)]
    fn layernorm_at(
        &mut self,
        t: &mut Self::T,
        at: usize,
        rows: usize,
        width: usize,
        stride: usize,
        w: &Self::V,
        bias: &Self::V,
        eps: f32,
    ) -> Result<()>;
    /// DSA's selection for the pass's queries: `iq` (n, Hi, Di) the indexer's queries, `iw`
    /// (n, Hi) their head weights, the pass's indexer keys in the rows of `ckv` (at `at`,
    /// rows of `row`), the earlier ones in layer `l`'s cache. The backend keeps the
    /// selection for the MLA attention of this layer and of the "shared" layers after it.
    #[allow(clippy::too_many_arguments)]
    async fn index_select(
        &mut self,
        l: usize,
        iq: &Self::T,
        iw: &Self::T,
        ckv: &Self::T,
        at: usize,
        row: usize,
        shape: IndexShape,
    ) -> Result<()>;
    /// Gated DeltaNet: layer `l`'s recurrent state made ready for n positions (created;
    /// on the CPU snapshotted before a multi-token pass, which the GPU session does
    /// before the pass).
    fn delta_begin(&mut self, l: usize, c: &LinearAttnConfig, n: usize) -> Result<()>;
    /// qwen3_next's grouped projections in the conv's channel order (deltanet::regroup).
    #[allow(clippy::too_many_arguments)]
    fn delta_regroup(
        &mut self,
        c: &LinearAttnConfig,
        qkvz: &Self::T,
        ba: &Self::T,
        n: usize,
        mixed: &mut Self::T,
        z: &mut Self::T,
        bav: &mut Self::T,
    ) -> Result<()>;
    /// The causal conv1d + SiLU of `mixed` (n, conv_dim) in place, over layer `l`'s conv
    /// window (deltanet::conv_silu).
    fn delta_conv(
        &mut self,
        l: usize,
        c: &LinearAttnConfig,
        taps: &Self::V,
        mixed: &mut Self::T,
        n: usize,
    ) -> Result<()>;
    /// q and k of `mixed` L2-normalised per head, q scaled (deltanet::l2norm_qk).
    fn delta_l2norm(&mut self, c: &LinearAttnConfig, mixed: &mut Self::T, n: usize) -> Result<()>;
    /// `ba` (n, 2 * n_v_heads) in place to beta then decay (deltanet::gates).
    fn delta_gates(
        &mut self,
        c: &LinearAttnConfig,
        ba: &mut Self::T,
        n: usize,
        neg_a: &Self::V,
        dt_bias: &Self::V,
    ) -> Result<()>;
    /// The gated delta rule over n positions, advancing layer `l`'s state; `o` (n,
    /// value_dim) position-major (deltanet::rule).
    fn delta_rule(
        &mut self,
        l: usize,
        c: &LinearAttnConfig,
        mixed: &Self::T,
        ba: &Self::T,
        n: usize,
        o: &mut Self::T,
    ) -> Result<()>;
    /// `x[i] *= silu(g[i])` for i < len (the gated RMSNorm's gate).
    fn gate_silu(&mut self, x: &mut Self::T, g: &Self::T, len: usize) -> Result<()>;
    /// `x[i] *= sigmoid(g[i])` for i < len (qwen3_next's attention output gate).
    fn gate_sigmoid(&mut self, x: &mut Self::T, g: &Self::T, len: usize) -> Result<()>;
    /// `g[i] = act(g[i], u[i])` for i < len (the SwiGLU activation, kernels::Activation).
    fn swiglu(&mut self, g: &mut Self::T, u: &Self::T, len: usize, act: Activation) -> Result<()>;
    /// `y[p, :] += sigmoid(g[p]) * s[p, :]` for p < n, rows of `hidden` (the shared
    /// expert's gate).
    fn gated_add(&mut self, y: &mut Self::T, s: &Self::T, g: &Self::T, n: usize, hidden: usize) -> Result<()>;
    /// DeepSeek-V4's hyper-connection weights of `s.n` positions from their mixes `mix`:
    /// `pre` (n, N), `post` (n, N) and `comb` (n, N, N) (v4::hc::weights, mix (n, (2 + N) N));
    /// with `head`, the hyper-head's `pre` only (v4::hc::head_pre, mix (n, N)).
    #[allow(clippy::too_many_arguments)]
    fn hc_weights(
        &mut self,
        mix: &Self::T,
        base: &Self::V,
        scale: &Self::V,
        s: HcShape,
        head: bool,
        pre: &mut Self::T,
        post: &mut Self::T,
        comb: &mut Self::T,
    ) -> Result<()>;
    /// `out[i] = sum_j pre[i, j] x[i, j]` over the N streams of each position of `x`.
    fn hc_collapse(&mut self, pre: &Self::T, x: &Self::T, s: HcShape, out: &mut Self::T) -> Result<()>;
    /// The streams after a block: x[i, k] = post[i, k] y[i] + sum_j comb[i, j, k] x[i, j].
    fn hc_expand(&mut self, x: &mut Self::T, y: &Self::T, post: &Self::T, comb: &Self::T, s: HcShape) -> Result<()>;
    /// `rows` rows of `width` floats from `src` (at `src_at`, `src_stride` apart) into
    /// `dst` (at `dst_at`, `dst_stride` apart).
    #[allow(clippy::too_many_arguments)]
    fn copy_rows(
        &mut self,
        src: &Self::T,
        src_at: usize,
        src_stride: usize,
        dst: &mut Self::T,
        dst_at: usize,
        dst_stride: usize,
        rows: usize,
        width: usize,
    ) -> Result<()>;
    /// DeepSeek-V4's RoPE of the trailing rotary values of each of the pass's n positions'
    /// `heads` rows of `stride` floats, as interleaved pairs, in place (v4::compress::rope_tail):
    /// the compressed branches' rope or the main one; `inverse` rotates back.
    fn rope_tail(
        &mut self,
        t: &mut Self::T,
        n: usize,
        heads: usize,
        stride: usize,
        compress: bool,
        inverse: bool,
    ) -> Result<()>;
    /// Feeds a compressor of layer `l` (its indexer's with `index`) the projections `kv`
    /// and `gate` of the pass's positions (v4::compress::feed).
    #[allow(clippy::too_many_arguments)]
    fn v4_compress(
        &mut self,
        l: usize,
        index: bool,
        kv: &Self::T,
        gate: &Self::T,
        ape: &Self::V,
        norm: &Self::V,
        c: CompShape,
    ) -> Result<()>;
    /// The lightning indexer's choice for the pass's queries `iq` (n, heads, head_dim),
    /// with head weights `iw` (n, heads), among layer `l`'s indexer entries; kept for
    /// [`Ops::v4_attend`].
    fn v4_select(&mut self, l: usize, iq: &Self::T, iw: &Self::T, s: SelectShape) -> Result<()>;
    /// DeepSeek-V4's attention of the pass's queries `q` over layer `l`'s window (the
    /// pass's keys `kv` appended) and compressed entries (v4::attn::attend) into `out`.
    fn v4_attend(
        &mut self,
        l: usize,
        q: &Self::T,
        kv: &Self::T,
        sinks: &Self::V,
        s: V4AttendShape,
        out: &mut Self::T,
    ) -> Result<()>;
    /// The first `len` floats of `t`, back in memory (the GPU waits for its work here).
    async fn read(&mut self, t: Self::T, len: usize) -> Result<Vec<f32>>;
}

/// A backend that runs a whole model: [`Ops`], the model's weights in the backend's
/// form, and the parts still written per backend.
pub(crate) trait Backend<'w>: Ops<'w> {
    /// The model this pass runs (configuration and per-layer options).
    fn model(&self) -> &'w Model;
    /// Layer `l`'s attention and FFN norm weights.
    fn norms(&self, l: usize) -> (&'w Self::V, &'w Self::V);
    fn attn(&self, l: usize) -> Attn<'w, Self::M, Self::V>;
    fn attn_opts(&self, l: usize) -> &'w AttnOpts;
    fn final_norm(&self) -> &'w Self::V;
    fn lm_head(&self) -> &'w Self::M;
    /// `x[i, :]` = the embedding row of `ids[i]`.
    fn embed(&mut self, ids: &[u32], x: &mut Self::T) -> Result<()>;
    /// Layer `l`'s FFN weights.
    fn ffn(&self, l: usize) -> Result<FfnRef<'w, Self::M>>;
    /// Layer `l`'s FFN input `xn` (n, hidden) is ready: the CPU shows it to the pass's
    /// observer and starts reading the experts the next layer's router is likely to pick.
    fn ffn_begin(&mut self, _l: usize, _xn: &Self::T, _n: usize) -> Result<()> {
        Ok(())
    }
    /// MoE layer `l`'s router over the n positions of `xn`: each position's experts and
    /// weights, as moe::route decides them (the GPU routes with its twin and reads the
    /// choices back, since the host supplies the experts).
    async fn route(&mut self, l: usize, xn: &Self::T, n: usize) -> Result<Vec<Routing>>;
    /// MoE layer `l`'s routed experts into `out` (n, hidden): `out = sum over experts e
    /// (ascending) of w * expert_e(xn[p])` for the (p, w) of `users[e]`. The backend
    /// supplies the experts (fetched, cached, pooled, or run on the CPU beside the GPU).
    async fn experts(
        &mut self,
        l: usize,
        users: &[Vec<(usize, f32)>],
        xn: &Self::T,
        n: usize,
        out: &mut Self::T,
    ) -> Result<()>;
    /// DeepSeek-V4's layers, for a V4 model on a backend that runs them.
    fn v4(&self) -> Option<&'w V4Weights<Self::M, Self::V>>;
    /// DeepSeek-V4's MoE of layer `l` (hash layers route by `ids`) of `xn` into `out`.
    async fn v4_moe(&mut self, l: usize, xn: &Self::T, n: usize, ids: &[u32], out: &mut Self::T) -> Result<()>;
}

/// The forward pass of `ids` (the positions from [`Backend::pos0`] on): logits of `which`
/// rows, and with `hidden` every position's final-normed state (else an empty vector).
pub(crate) async fn forward<'w, B: Backend<'w>>(
    b: &mut B,
    ids: &[u32],
    which: Logits,
    hidden: bool,
) -> Result<(Vec<f32>, Vec<f32>)> {
    if let Some(w) = b.v4() {
        return v4::v4_forward(b, w, ids, which, hidden).await;
    }
    let c = &b.model().cfg;
    let (n, h) = (ids.len(), c.hidden);
    let x = layers(b, ids).await?;
    // The final norm over the rows whose logits are asked for (every row with `hidden`).
    let first = if hidden || which == Logits::All { 0 } else { n - 1 };
    let mut hn = b.alloc("hn", (n - first) * h)?;
    b.copy(&x, first * h, &mut hn, 0, (n - first) * h)?;
    b.rmsnorm(&mut hn, n - first, h, b.final_norm(), c.rms_eps)?;
    let rows = if which == Logits::All { n } else { 1 };
    let mut logits = b.alloc("logits", rows * c.vocab)?;
    b.matmul(&mut [(b.lm_head(), &mut logits)], &hn, n - first - rows, rows)?;
    let logits = b.read(logits, rows * c.vocab).await?;
    let states = if hidden { b.read(hn, n * h).await? } else { Vec::new() };
    Ok((logits, states))
}

/// The forward pass of `ids` with the logits of the rows `rows` only ((rows, vocab), in
/// that order): the rows each sequence of a batch asks for (none at all: the layers only),
/// and the final-normed states of the rows `states` ((states, hidden), in that order: what
/// an MTP drafter reads; the norm is per row, so a row's state is the bits of
/// [`forward`]'s with `hidden`).
pub(crate) async fn forward_rows<'w, B: Backend<'w>>(
    b: &mut B,
    ids: &[u32],
    rows: &[usize],
    states: &[usize],
) -> Result<(Vec<f32>, Vec<f32>)> {
    let c = &b.model().cfg;
    let (n, h, k, ks) = (ids.len(), c.hidden, rows.len(), states.len());
    if let Some(r) = rows.iter().chain(states).find(|&&r| r >= n) {
        return Err(crate::error::Error::Invalid(format!("logits or state of row {r} of a pass of {n}")));
    }
    let v4w = b.v4();
    let x = match v4w {
        Some(w) => v4::v4_layers(b, w, ids).await?,
        None => layers(b, ids).await?,
    };
    if k + ks == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    // The asked states' rows first, then the logits' rows, normed together (DeepSeek-V4:
    // through its hyper-head first).
    let hn = match v4w {
        Some(w) => v4::v4_head(b, w, &x, &states.iter().chain(rows).copied().collect::<Vec<_>>())?,
        None => {
            let mut hn = b.alloc("hn", (ks + k) * h)?;
            for (j, &r) in states.iter().chain(rows).enumerate() {
                b.copy(&x, r * h, &mut hn, j * h, h)?;
            }
            b.rmsnorm(&mut hn, ks + k, h, b.final_norm(), c.rms_eps)?;
            hn
        }
    };
    let logits = if k > 0 {
        let mut logits = b.alloc("logits", k * c.vocab)?;
        b.matmul(&mut [(b.lm_head(), &mut logits)], &hn, ks, k)?;
        b.read(logits, k * c.vocab).await?
    } else {
        Vec::new()
    };
    let states = if ks > 0 { b.read(hn, ks * h).await? } else { Vec::new() };
    Ok((logits, states))
}

/// The embedding and every decoder layer of `ids`: the residual stream (n, hidden).
async fn layers<'w, B: Backend<'w>>(b: &mut B, ids: &[u32]) -> Result<B::T> {
    let c = &b.model().cfg;
    let (n, h) = (ids.len(), c.hidden);
    let mut x = b.alloc("x", n * h)?;
    b.embed(ids, &mut x)?;
    let mut xn = b.alloc("xn", n * h)?;
    let mut y = b.alloc("y", n * h)?;
    for l in 0..c.n_layers {
        layer(b, l, n, &mut x, &mut xn, &mut y).await?;
    }
    Ok(x)
}

/// Decoder layer `l` over the residual stream `x` (n, hidden), in place: norm ->
/// attention -> residual -> norm -> FFN -> residual. `xn` and `y` are scratch of the same
/// size.
pub(crate) async fn layer<'w, B: Backend<'w>>(
    b: &mut B,
    l: usize,
    n: usize,
    x: &mut B::T,
    xn: &mut B::T,
    y: &mut B::T,
) -> Result<()> {
    let c = &b.model().cfg;
    let h = c.hidden;
    let (attn_norm, ffn_norm) = b.norms(l);
    b.copy(x, 0, xn, 0, n * h)?;
    b.rmsnorm(xn, n, h, attn_norm, c.rms_eps)?;
    match b.attn(l) {
        Attn::Gqa(w) => gqa(b, l, w, b.attn_opts(l), h, xn, n, y)?,
        Attn::Mla(w) => mla(b, l, w, b.attn_opts(l), xn, n, y).await?,
        Attn::Linear(w) => deltanet(b, l, w, xn, n, y)?,
    }
    b.add(x, y, n * h)?;
    b.copy(x, 0, xn, 0, n * h)?;
    b.rmsnorm(xn, n, h, ffn_norm, c.rms_eps)?;
    ffn(b, l, h, xn, n, y).await?;
    b.add(x, y, n * h)
}

/// Layer `l`'s FFN of the n positions of `xn` (normalised input) into `out` (n, hidden): a
/// dense SwiGLU MLP, or a MoE layer: the routes, their union over the batch (each expert
/// runs once over every position routed to it), the shared expert, the routed experts'
/// weighted sum, then the shared expert's output added (through its sigmoid gate).
async fn ffn<'w, B: Backend<'w>>(b: &mut B, l: usize, h: usize, xn: &B::T, n: usize, out: &mut B::T) -> Result<()> {
    b.ffn_begin(l, xn, n)?;
    match b.ffn(l)? {
        FfnRef::Dense(w) => mlp(b, &w, xn, n, out),
        FfnRef::Moe { n_experts, shared } => {
            let routes = b.route(l, xn, n).await?;
            let users = batch_union(&routes, n_experts)?;
            // The shared expert first: on the GPU it computes while experts placed on the
            // CPU run. Its output joins after the routed sum, as transformers adds it.
            let shared = match shared {
                Some((w, gate)) => {
                    let mut sy = b.alloc("ffn.shared", n * h)?;
                    mlp(b, &w, xn, n, &mut sy)?;
                    let g = match gate {
                        Some(gw) => {
                            let mut g = b.alloc("ffn.shared_gate", n)?;
                            b.matmul(&mut [(gw, &mut g)], xn, 0, n)?;
                            Some(g)
                        }
                        None => None,
                    };
                    Some((sy, g))
                }
                None => None,
            };
            b.experts(l, &users, xn, n, out).await?;
            match shared {
                Some((sy, Some(g))) => b.gated_add(out, &sy, &g, n, h),
                Some((sy, None)) => b.add(out, &sy, n * h),
                None => Ok(()),
            }
        }
    }
}

/// `out = down(silu(gate x) * up x)` for the n positions of `x`.
fn mlp<'w, B: Ops<'w>>(b: &mut B, w: &MlpRef<'w, B::M>, x: &B::T, n: usize, out: &mut B::T) -> Result<()> {
    let (mut g, mut u) = (b.alloc("ffn.g", n * w.inter)?, b.alloc("ffn.u", n * w.inter)?);
    b.matmul(&mut [(w.gate, &mut g), (w.up, &mut u)], x, 0, n)?;
    b.swiglu(&mut g, &u, n * w.inter, Activation::Silu)?;
    b.matmul(&mut [(w.down, out)], &g, 0, n)
}

/// Grouped-query attention of the n positions of `xn` (normalised input) into `out`
/// (n, `hidden`): projections with their biases, qwen3_next's output gate, q/k RMSNorm per
/// head or over the projection, olmoe's clip_qkv, RoPE, the cached attention (with
/// gpt_oss's sinks), the gate, o_proj and its bias.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gqa<'w, B: Ops<'w>>(
    b: &mut B,
    l: usize,
    w: &'w GqaWeights<B::M, B::V>,
    o: &AttnOpts,
    hidden: usize,
    xn: &B::T,
    n: usize,
    out: &mut B::T,
) -> Result<()> {
    let hd = o.head_dim;
    let (qd, kvd) = (o.n_heads * hd, o.n_kv_heads * hd);
    // The q projection's rows: the queries, and as many gate values with an output gate.
    let qw = if o.output_gate { 2 * qd } else { qd };
    let mut q = b.alloc("q", n * qw)?;
    let mut k = b.alloc("k", n * kvd)?;
    let mut v = b.alloc("v", n * kvd)?;
    b.matmul(&mut [(&w.wq, &mut q), (&w.wk, &mut k), (&w.wv, &mut v)], xn, 0, n)?;
    for (t, bias, d) in [(&mut q, &w.bq, qw), (&mut k, &w.bk, kvd), (&mut v, &w.bv, kvd)] {
        if let Some(bias) = bias {
            b.add_bias(t, bias, n * d, d)?;
        }
    }
    let gate = if o.output_gate {
        let (mut query, mut gate) = (b.alloc("q_only", n * qd)?, b.alloc("gate", n * qd)?);
        b.split_gate(&q, n, o.n_heads, hd, &mut query, &mut gate)?;
        q = query;
        Some(gate)
    } else {
        None
    };
    // The norm runs per head, or over the whole projection.
    let widths = match o.qk_norm {
        QkNorm::None => None,
        QkNorm::PerHead => Some((hd, hd)),
        QkNorm::Full => Some((qd, kvd)),
    };
    if let Some((wq, wk)) = widths {
        for (t, norm, d, width) in [(&mut q, &w.q_norm, qd, wq), (&mut k, &w.k_norm, kvd, wk)] {
            if let Some(norm) = norm {
                b.rmsnorm(t, n * d / width, width, norm, o.rms_eps)?;
            }
        }
    }
    if let Some(c) = o.clip_qkv {
        b.clamp(&mut q, n * qd, c)?;
        b.clamp(&mut k, n * kvd, c)?;
        b.clamp(&mut v, n * kvd, c)?;
    }
    b.rope(&mut q, n, o.n_heads, hd)?;
    b.rope(&mut k, n, o.n_kv_heads, hd)?;
    let shape = AttendShape {
        n,
        pos0: b.pos0(),
        n_heads: o.n_heads,
        n_kv_heads: o.n_kv_heads,
        head_dim: hd,
        window: o.window,
        scale: o.scale,
    };
    let mut ctx = b.alloc("attn_out", n * qd)?;
    b.attend(l, &q, &k, &v, shape, w.sinks.as_ref(), &mut ctx)?;
    if let Some(g) = gate {
        // transformers: attn_output * torch.sigmoid(gate)
        b.gate_sigmoid(&mut ctx, &g, n * qd)?;
    }
    b.matmul(&mut [(&w.wo, out)], &ctx, 0, n)?;
    if let Some(bo) = &w.bo {
        b.add_bias(out, bo, n * hidden, hidden)?;
    }
    Ok(())
}

/// Multi-head latent attention of the n positions of `xn` (normalised input) into `out`
/// (n, hidden), with the absorbed projections of [`crate::model::mla`] (its header has the
/// formulas): q (plain or low-rank with its norm), the latent and the shared rotary key
/// (kv_a, the latent normalised), RoPE of both rotary parts, the absorbed queries, the
/// cached latent attention, per head v_h = W_uv_h ctx_h, and o_proj.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn mla<'w, B: Ops<'w>>(
    b: &mut B,
    l: usize,
    w: &'w MlaWeights<B::M, B::V>,
    o: &AttnOpts,
    xn: &B::T,
    n: usize,
    out: &mut B::T,
) -> Result<()> {
    let Some(m) = &o.mla else {
        return Err(crate::error::Error::Invalid(format!("layer {l}: MLA weights without MLA sizes")));
    };
    let nh = o.n_heads;
    let (dn, dr, dv, r) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank);
    let (dq, width) = (dn + dr, r + dr);
    let mut q = b.alloc("mla.q", n * nh * dq)?;
    // q_a's normalised output (q_resid): q_b's input, and DSA's indexer's.
    let qa = match &w.q {
        QueryProj::Plain(wq) => {
            b.matmul(&mut [(wq, &mut q)], xn, 0, n)?;
            None
        }
        QueryProj::LowRank { a, norm, b: wb } => {
            let rq = m.q_lora_rank.unwrap_or(0);
            let mut qa = b.alloc("mla.qa", n * rq)?;
            b.matmul(&mut [(a, &mut qa)], xn, 0, n)?;
            b.rmsnorm(&mut qa, n, rq, norm, LATENT_NORM_EPS)?;
            b.matmul(&mut [(wb, &mut q)], &qa, 0, n)?;
            Some(qa)
        }
    };
    // The cache rows of the pass: the compressed latent and the shared rotary key (r + dr),
    // and where the layer runs DSA's indexer, its key.
    let row = m.cache_width_at(l);
    let mut ckv = b.alloc("mla.ckv", n * row)?;
    match row == width {
        true => b.matmul(&mut [(&w.kv_a, &mut ckv)], xn, 0, n)?,
        false => b.matmul_at(&w.kv_a, xn, 0, n, &mut ckv, 0, row)?,
    }
    b.rmsnorm_at(&mut ckv, 0, n, r, row, &w.kv_norm, LATENT_NORM_EPS)?;
    b.rope_at(&mut ckv, n, 1, row, r, m.rope_interleave)?;
    b.rope_at(&mut q, n, nh, dq, dn, m.rope_interleave)?;
    if let (Some(d), Some(true)) = (&m.dsa, m.indexer_at(l)) {
        let (Some(ix), Some(qa)) = (&w.indexer, &qa) else {
            return Err(crate::error::Error::Invalid(format!("layer {l}: DSA without its indexer weights")));
        };
        index(b, l, ix, d, xn, qa, n, &mut ckv, width, row).await?;
    }
    let mut qc = b.alloc("mla.qc", n * nh * width)?;
    b.mla_absorb(&w.kv_b, &q, n, nh, m, &mut qc)?;
    let shape = AttendShape {
        n,
        pos0: b.pos0(),
        n_heads: nh,
        n_kv_heads: 1,
        head_dim: width,
        window: o.window,
        scale: o.scale,
    };
    let mut ctx = b.alloc("mla.ctx", nh * n * r)?;
    b.attend_mla(l, &qc, &ckv, shape, m, &mut ctx)?;
    // Values: v_h = W_uv_h ctx_h, laid out (n, H*dv) for o_proj.
    let mut v = b.alloc("mla.v", n * nh * dv)?;
    for (h, uv) in w.uv.iter().enumerate() {
        b.matmul_at(uv, &ctx, h * n, n, &mut v, h * dv, nh * dv)?;
    }
    b.matmul(&mut [(&w.wo, out)], &v, 0, n)
}

/// Gated DeltaNet of the n positions of `xn` into `out` (n, hidden), with the formulas of
/// [`crate::model::deltanet`]: the input projections (split, or grouped and regrouped into
/// the conv's channel order), the gates, the causal conv + SiLU, the q/k L2 norms, the
/// delta rule over the layer's recurrent state, the gated RMSNorm and out_proj.
pub(crate) fn deltanet<'w, B: Ops<'w>>(
    b: &mut B,
    l: usize,
    w: &'w DeltaNetWeights<B::M, B::V>,
    xn: &B::T,
    n: usize,
    out: &mut B::T,
) -> Result<()> {
    let c = &w.cfg;
    let (vd, cd, nv, dv) = (c.value_dim(), c.conv_dim(), c.n_v_heads, c.v_head_dim);
    b.delta_begin(l, c, n)?;
    let mut mixed = b.alloc("dn.mixed", n * cd)?;
    let mut z = b.alloc("dn.z", n * vd)?;
    let mut ba = b.alloc("dn.ba", n * 2 * nv)?;
    match &w.in_proj {
        InProj::Split { qkv, z: wz, b: wb, a: wa } => {
            b.matmul(&mut [(qkv, &mut mixed), (wz, &mut z)], xn, 0, n)?;
            b.matmul_at(wb, xn, 0, n, &mut ba, 0, 2 * nv)?;
            b.matmul_at(wa, xn, 0, n, &mut ba, nv, 2 * nv)?;
        }
        InProj::Grouped { qkvz, ba: wba } => {
            let mut gq = b.alloc("dn.qkvz", n * (2 * c.key_dim() + 2 * vd))?;
            let mut gb = b.alloc("dn.ba_grouped", n * 2 * nv)?;
            b.matmul(&mut [(qkvz, &mut gq), (wba, &mut gb)], xn, 0, n)?;
            b.delta_regroup(c, &gq, &gb, n, &mut mixed, &mut z, &mut ba)?;
        }
    }
    b.delta_gates(c, &mut ba, n, &w.neg_a, &w.dt_bias)?;
    b.delta_conv(l, c, &w.conv, &mut mixed, n)?;
    b.delta_l2norm(c, &mut mixed, n)?;
    let mut o = b.alloc("dn.o", n * vd)?;
    b.delta_rule(l, c, &mixed, &ba, n, &mut o)?;
    // The gated RMSNorm per (position, value head): transformers' weight * (x * rsqrt(var +
    // eps)), then * silu(z).
    b.rmsnorm(&mut o, n * nv, dv, &w.norm, w.eps)?;
    b.gate_silu(&mut o, &z, n * vd)?;
    b.matmul(&mut [(&w.out, out)], &o, 0, n)
}

/// DeepSeek Sparse Attention's lightning indexer ([`crate::model::dsa`] has the formulas):
/// its key into the cache rows `ckv` (after the `at` floats of latent and rotary key,
/// rows of `row`), LayerNorm and RoPE; its queries from `qa` (q_resid) with RoPE; the
/// per-head weights; then the backend's selection of the positions each query keeps.
#[allow(clippy::too_many_arguments)]
async fn index<'w, B: Ops<'w>>(
    b: &mut B,
    l: usize,
    ix: &'w IndexerWeights<B::M, B::V>,
    d: &DsaConfig,
    xn: &B::T,
    qa: &B::T,
    n: usize,
    ckv: &mut B::T,
    at: usize,
    row: usize,
) -> Result<()> {
    let (hi, di) = (d.n_heads, d.head_dim);
    b.matmul_at(&ix.wk, xn, 0, n, ckv, at, row)?;
    b.layernorm_at(ckv, at, n, di, row, &ix.k_norm, &ix.k_bias, INDEX_NORM_EPS)?;
    b.rope_at(ckv, n, 1, row, at, d.interleave)?;
    let mut iq = b.alloc("dsa.q", n * hi * di)?;
    b.matmul(&mut [(&ix.wq_b, &mut iq)], qa, 0, n)?;
    b.rope_at(&mut iq, n, hi, di, 0, d.interleave)?;
    let mut iw = b.alloc("dsa.w", n * hi)?;
    b.matmul(&mut [(&ix.weights_proj, &mut iw)], xn, 0, n)?;
    let shape = IndexShape { n, pos0: b.pos0(), heads: hi, head_dim: di, topk: d.topk };
    b.index_select(l, &iq, &iw, ckv, at, row, shape).await
}

/// Runs a future that never waits (the CPU backend's pass) to its end.
pub(crate) fn run_ready<F: std::future::Future>(f: F) -> Result<F::Output> {
    use std::task::{Context, Poll, Waker};
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Ok(v),
        Poll::Pending => Err(crate::error::Error::Invalid("a CPU forward pass waited on something".into())),
    }
}
