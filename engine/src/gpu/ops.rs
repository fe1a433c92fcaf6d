//! One function per kernel: checks shapes, fills the kernel's parameters and records the
//! dispatch. Offsets and lengths are in f32 elements. Each has a CPU reference it is
//! tested against (engine/tests/it/gpu_kernels.rs).

use super::buffers::GpuMat;
use super::kernels::{dtype_constants, Kernel};
use super::recorder::{Bind, Recorder};
use crate::error::{Error, Result};
use crate::tensor::DType;

pub(crate) fn u32_of(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Gpu(format!("{what} = {v} does not fit the kernels' 32-bit indices")))
}

pub(crate) fn groups(threads: usize, per_group: usize) -> u64 {
    threads.div_ceil(per_group) as u64
}

/// `y[y_offset + p * y_stride + r] = dot(m[r, :], x[x_offset + p * cols ..])` for p < n
/// (kernels::matmul; reference order math::dot).
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    rec: &mut Recorder,
    m: &GpuMat,
    x: &wgpu::Buffer,
    x_offset: usize,
    n: usize,
    y: &wgpu::Buffer,
    y_offset: usize,
    y_stride: usize,
) -> Result<()> {
    if m.dtype == crate::tensor::DType::Mxfp4 {
        return mxfp4_matmul(rec, m, x, x_offset, n, y, y_offset, y_stride);
    }
    let consts = dtype_constants(m.dtype);
    // Q4K rows: int4 nibbles in blocks of 32 under Q4_K headers (weights.wgsl, DTYPE 6);
    // Q5K rows: the same with a fifth bit per value after them (DTYPE 7).
    let group = if matches!(m.dtype, DType::Q4K | DType::Q5K) { Some(32) } else { m.dtype.group() };
    if let Some(group) = group {
        return qmatmul(rec, m, group as usize, x, x_offset, n, y, y_offset, y_stride);
    }
    for part in &m.parts {
        let params = [
            u32_of("rows", part.rows)?,
            u32_of("cols", m.cols)?,
            u32_of("n", n)?,
            m.row_words,
            u32_of("x offset", x_offset)?,
            u32_of("y offset", y_offset + part.row0)?,
            u32_of("y stride", y_stride)?,
        ];
        rec.dispatch(
            Kernel::Matmul,
            &consts,
            &params,
            vec![(&part.range).into(), x.into(), y.into()],
            groups(part.rows, 8),
        )?;
    }
    Ok(())
}

/// [`matmul`] for int8/int4 weights: the n positions are quantized once
/// (quantize_act.wgsl), then every row block runs the integer kernel (qmatmul.wgsl);
/// the same bits as kernels::matmul (qdot::dot_row_scalar).
#[allow(clippy::too_many_arguments)]
fn qmatmul(
    rec: &mut Recorder,
    m: &GpuMat,
    group: usize,
    x: &wgpu::Buffer,
    x_offset: usize,
    n: usize,
    y: &wgpu::Buffer,
    y_offset: usize,
    y_stride: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let blocks = m.cols.div_ceil(group);
    let q_words = blocks * group.div_ceil(4);
    let d_offset = n * q_words;
    let words = d_offset + n * blocks;
    let act = rec.ctx().act_buffer(words as u64 * 4)?;
    let params = [
        u32_of("n", n)?,
        u32_of("cols", m.cols)?,
        u32_of("group", group)?,
        u32_of("blocks", blocks)?,
        u32_of("x offset", x_offset)?,
        u32_of("quantized words", q_words)?,
        u32_of("scale offset", d_offset)?,
    ];
    rec.dispatch(Kernel::QuantizeAct, &[], &params, vec![x.into(), (&act).into()], (n * blocks) as u64)?;
    let consts = dtype_constants(m.dtype);
    // dot4I8Packed needs every block to start on a word: int8 groups of 4k, int4 of 8k.
    let word = if matches!(m.dtype, DType::Int4 { .. } | DType::Q4K | DType::Q5K) { 8 } else { 4 };
    let kernel = if rec.ctx().dp4a() && group.is_multiple_of(word) { Kernel::QMatmulDp4a } else { Kernel::QMatmul };
    for part in &m.parts {
        let params = [
            u32_of("rows", part.rows)?,
            u32_of("cols", m.cols)?,
            u32_of("n", n)?,
            m.row_words,
            u32_of("quantized words", q_words)?,
            u32_of("scale offset", d_offset)?,
            u32_of("y offset", y_offset + part.row0)?,
            u32_of("y stride", y_stride)?,
        ];
        rec.dispatch(
            kernel,
            &consts,
            &params,
            vec![(&part.range).into(), (&act).into(), y.into()],
            groups(part.rows, 8),
        )?;
    }
    Ok(())
}

/// [`matmul`] for MXFP4 weights: the n positions are quantized once to two int16 parts
/// per block of 32 (quantize_act16.wgsl), then every row block runs the integer kernel
/// (mxfp4_matmul.wgsl); the same bits as kernels::matmul (qdot::mxfp4::dot_row_scalar).
#[allow(clippy::too_many_arguments)]
fn mxfp4_matmul(
    rec: &mut Recorder,
    m: &GpuMat,
    x: &wgpu::Buffer,
    x_offset: usize,
    n: usize,
    y: &wgpu::Buffer,
    y_offset: usize,
    y_stride: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    if !m.cols.is_multiple_of(crate::tensor::MXFP4_BLOCK) {
        return Err(Error::Gpu(format!("MXFP4 matrix with {} columns (not whole blocks of 32)", m.cols)));
    }
    let blocks = m.cols / crate::tensor::MXFP4_BLOCK;
    let q_words = blocks * 32;
    let d_offset = n * q_words;
    let act = rec.ctx().act_buffer((d_offset + n * blocks) as u64 * 4)?;
    let params = [
        u32_of("n", n)?,
        u32_of("cols", m.cols)?,
        u32_of("blocks", blocks)?,
        u32_of("x offset", x_offset)?,
        u32_of("quantized words", q_words)?,
        u32_of("scale offset", d_offset)?,
    ];
    rec.dispatch(Kernel::QuantizeAct16, &[], &params, vec![x.into(), (&act).into()], groups(n * blocks, 64))?;
    for part in &m.parts {
        let params = [
            u32_of("rows", part.rows)?,
            u32_of("cols", m.cols)?,
            u32_of("n", n)?,
            m.row_words,
            u32_of("quantized words", q_words)?,
            u32_of("scale offset", d_offset)?,
            u32_of("y offset", y_offset + part.row0)?,
            u32_of("y stride", y_stride)?,
        ];
        rec.dispatch(
            Kernel::Mxfp4Matmul,
            &[],
            &params,
            vec![(&part.range).into(), (&act).into(), y.into()],
            groups(part.rows, 8),
        )?;
    }
    Ok(())
}

/// `x[i, :] = m[ids[i], :]` for the n ids stored at `ids` (an arena range of u32s).
pub fn embed(rec: &mut Recorder, m: &GpuMat, ids: Bind, n: usize, x: &wgpu::Buffer) -> Result<()> {
    if m.dtype == crate::tensor::DType::Mxfp4 {
        return Err(Error::Gpu("an MXFP4 embedding has no GPU kernel; use the CPU backend".into()));
    }
    let consts = dtype_constants(m.dtype);
    for part in &m.parts {
        let params = [
            u32_of("n", n)?,
            u32_of("cols", m.cols)?,
            u32_of("rows", part.rows)?,
            u32_of("row0", part.row0)?,
            m.row_words,
            0,
        ];
        rec.dispatch(
            Kernel::Embed,
            &consts,
            &params,
            vec![(&part.range).into(), ids.clone(), x.into()],
            groups(n * m.cols, 64),
        )?;
    }
    Ok(())
}

/// In-place RMSNorm of `rows` rows of `width` starting at `x_offset` (kernels::rmsnorm).
pub fn rmsnorm(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    x_offset: usize,
    rows: usize,
    width: usize,
    w: &wgpu::Buffer,
    eps: f32,
) -> Result<()> {
    rmsnorm_strided(rec, x, x_offset, rows, width, width, w, eps)
}

/// [`rmsnorm`] of rows that start `stride` floats apart (the first `width` of each).
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_strided(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    x_offset: usize,
    rows: usize,
    width: usize,
    stride: usize,
    w: &wgpu::Buffer,
    eps: f32,
) -> Result<()> {
    let params = [
        u32_of("rows", rows)?,
        u32_of("width", width)?,
        eps.to_bits(),
        u32_of("x offset", x_offset)?,
        u32_of("row stride", stride)?,
    ];
    rec.dispatch(Kernel::RmsNorm, &[], &params, vec![x.into(), w.into()], rows as u64)
}

/// In-place RoPE of n positions x heads heads of head_dim, rotating the first 2 * half
/// values of each head with the per-position [cos.., sin..] table at `cs` (Rope::apply).
#[allow(clippy::too_many_arguments)]
pub fn rope(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    n: usize,
    heads: usize,
    head_dim: usize,
    half: usize,
    cs: Bind,
) -> Result<()> {
    rope_at(rec, x, 0, n, heads, head_dim, half, cs)
}

/// [`rope`] of the heads laid out from `x_offset` on, `head_dim` apart, rotating the
/// 2 * half values at the start of each.
#[allow(clippy::too_many_arguments)]
pub fn rope_at(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    x_offset: usize,
    n: usize,
    heads: usize,
    head_dim: usize,
    half: usize,
    cs: Bind,
) -> Result<()> {
    let params = [
        u32_of("n", n)?,
        u32_of("heads", heads)?,
        u32_of("head_dim", head_dim)?,
        u32_of("half", half)?,
        u32_of("x offset", x_offset)?,
        0,
    ];
    rec.dispatch(Kernel::Rope, &[], &params, vec![x.into(), cs], groups(n * heads * half, 64))
}

/// [`rope_at`] of heads whose rotary values come as interleaved pairs (rope_pairs.wgsl:
/// rope::deinterleave then Rope::apply), leaving them in rotate-half order.
#[allow(clippy::too_many_arguments)]
pub fn rope_pairs_at(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    x_offset: usize,
    n: usize,
    heads: usize,
    head_dim: usize,
    half: usize,
    cs: Bind,
) -> Result<()> {
    if half > 512 {
        return Err(Error::Gpu(format!("interleaved RoPE of {} dims: at most 1024", 2 * half)));
    }
    let params = [
        u32_of("n", n)?,
        u32_of("heads", heads)?,
        u32_of("head_dim", head_dim)?,
        u32_of("half", half)?,
        u32_of("x offset", x_offset)?,
        0,
    ];
    rec.dispatch(Kernel::RopePairs, &[], &params, vec![x.into(), cs], (n * heads) as u64)
}

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub pos0: usize,
    pub window: Option<usize>,
    pub scale: f32,
    /// MLA (kv_lora_rank, qk_rope_head_dim): one kv head whose cache row is [latent,
    /// rotary key] (K and V the same buffer, head_dim their sum), the latent as the value,
    /// the context written head-major [n_heads, n, kv_lora_rank] (mla::attention).
    pub mla: Option<(usize, usize)>,
    /// Floats per cache row when wider than the key (DSA's indexer key follows it).
    pub row: Option<usize>,
}

/// DeepSeek Sparse Attention's selection for [`attention`]: per query `topk` positions,
/// ascending (a row starting u32::MAX keeps every visible position).
pub struct Selected {
    pub ids: Bind,
    pub topk: usize,
}

/// Causal GQA over the cache for n new positions (the attention part of
/// attention::attention after the projections). `scores` holds n * n_heads * (pos0 + n)
/// floats; `sinks` (n_heads), if given, are gpt_oss's per-head sink logits.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    rec: &mut Recorder,
    s: AttnShape,
    q: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    scores: &wgpu::Buffer,
    out: &wgpu::Buffer,
    sinks: Option<&wgpu::Buffer>,
    sel: Option<Selected>,
) -> Result<()> {
    if s.n_kv_heads == 0 || !s.n_heads.is_multiple_of(s.n_kv_heads) {
        return Err(Error::Gpu(format!("{} heads do not group over {} kv heads", s.n_heads, s.n_kv_heads)));
    }
    let (split, k_stride, v_dim) = match s.mla {
        Some((r, dr)) if r + dr == s.head_dim && s.n_kv_heads == 1 => (r, s.row.unwrap_or(r + dr).max(r + dr), r),
        Some(_) => return Err(Error::Gpu("MLA attention: head_dim must be latent + rotary with one kv head".into())),
        None => (0, s.n_kv_heads * s.head_dim, s.head_dim),
    };
    let stride = s.pos0 + s.n;
    if (scores.size() / 4) < (s.n * s.n_heads * stride) as u64 {
        return Err(Error::Gpu("attention score scratch is too small".into()));
    }
    let params = [
        u32_of("n", s.n)?,
        u32_of("heads", s.n_heads)?,
        u32_of("kv heads", s.n_kv_heads)?,
        u32_of("head_dim", s.head_dim)?,
        u32_of("pos0", s.pos0)?,
        u32_of("window", s.window.unwrap_or(0))?,
        s.scale.to_bits(),
        u32_of("score stride", stride)?,
        sinks.is_some() as u32,
        u32_of("split", split)?,
        u32_of("k stride", k_stride)?,
        u32_of("v dim", v_dim)?,
        u32_of("v stride", k_stride)?,
        s.mla.is_some() as u32,
        u32_of("selected positions", sel.as_ref().map_or(0, |x| x.topk))?,
    ];
    // Without sinks or a selection the queries stand in for the (unread) bindings.
    let sel = sel.map_or(q.into(), |x| x.ids);
    let binds =
        vec![q.into(), k_cache.into(), v_cache.into(), scores.into(), out.into(), sinks.unwrap_or(q).into(), sel];
    rec.dispatch(Kernel::Attention, &[], &params, binds, (s.n * s.n_heads) as u64)
}

/// MLA's absorbed queries (mla_absorb.wgsl): `qc` [n, n_heads, r + dr] from the queries
/// `q` [n, n_heads, dn + dr] and kv_b_proj [n_heads * head_rows, r] (one row block).
#[allow(clippy::too_many_arguments)]
pub fn mla_absorb(
    rec: &mut Recorder,
    kv_b: &GpuMat,
    q: &wgpu::Buffer,
    qc: &wgpu::Buffer,
    n: usize,
    n_heads: usize,
    dn: usize,
    dr: usize,
    head_rows: usize,
) -> Result<()> {
    let [part] = &kv_b.parts[..] else {
        return Err(Error::Gpu("MLA: kv_b_proj must fit one storage binding".into()));
    };
    let r = kv_b.cols;
    let params = [
        u32_of("n", n)?,
        u32_of("heads", n_heads)?,
        u32_of("dn", dn)?,
        u32_of("dr", dr)?,
        u32_of("r", r)?,
        u32_of("head rows", head_rows)?,
        kv_b.row_words,
    ];
    let binds = vec![(&part.range).into(), q.into(), qc.into()];
    rec.dispatch(Kernel::MlaAbsorb, &dtype_constants(kv_b.dtype), &params, binds, groups(n * n_heads * (r + dr), 64))
}

/// In-place LayerNorm (weight and bias) of `rows` rows of `width` floats from `x_offset`
/// on, `stride` apart (layernorm.wgsl, dsa::layer_norm).
#[allow(clippy::too_many_arguments)]
pub fn layernorm(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    x_offset: usize,
    rows: usize,
    width: usize,
    stride: usize,
    w: &wgpu::Buffer,
    b: &wgpu::Buffer,
    eps: f32,
) -> Result<()> {
    let params = [
        u32_of("rows", rows)?,
        u32_of("width", width)?,
        eps.to_bits(),
        u32_of("x offset", x_offset)?,
        u32_of("stride", stride)?,
    ];
    rec.dispatch(Kernel::LayerNorm, &[], &params, vec![x.into(), w.into(), b.into()], groups(rows, 64))
}

/// DSA's index scores (index_scores.wgsl, dsa::select's sums) of the n queries `iq`
/// (n, heads, head_dim) with weights `iw` (n, heads) against the keys at `k_offset` of
/// the cache rows (`row` floats each) into `scores` (n, pos0 + n).
#[allow(clippy::too_many_arguments)]
pub(crate) fn index_scores(
    rec: &mut Recorder,
    iq: &wgpu::Buffer,
    iw: &wgpu::Buffer,
    cache: &wgpu::Buffer,
    scores: &wgpu::Buffer,
    s: crate::model::dsa::IndexShape,
    row: usize,
    k_offset: usize,
) -> Result<()> {
    let (scale, head_scale) = crate::model::dsa::scales(s);
    let params = [
        u32_of("n", s.n)?,
        u32_of("pos0", s.pos0)?,
        u32_of("heads", s.heads)?,
        u32_of("head_dim", s.head_dim)?,
        u32_of("row", row)?,
        u32_of("k offset", k_offset)?,
        u32_of("score stride", s.pos0 + s.n)?,
        scale.to_bits(),
        head_scale.to_bits(),
        1, // rate: every position
        u32_of("keys", s.pos0 + s.n)?,
    ];
    let binds = vec![iq.into(), iw.into(), cache.into(), scores.into()];
    rec.dispatch(Kernel::IndexScores, &[], &params, binds, s.n as u64)
}

/// `g[i] = act(g[i], u[i])` for i < len (kernels::Activation::apply).
pub fn swiglu(
    rec: &mut Recorder,
    g: &wgpu::Buffer,
    u: &wgpu::Buffer,
    len: usize,
    act: crate::kernels::Activation,
) -> Result<()> {
    use crate::kernels::Activation;
    let (clamped, alpha, limit) = match act {
        Activation::Silu => (0, 0.0f32, 0.0f32),
        Activation::ClampedSwiglu { alpha, limit } => (1, alpha, limit),
        Activation::SiluClamped { limit } => (2, 0.0, limit),
    };
    let params = [u32_of("len", len)?, clamped, alpha.to_bits(), limit.to_bits()];
    rec.dispatch(Kernel::Swiglu, &[], &params, vec![g.into(), u.into()], groups(len, 64))
}

/// `y[y_offset + i] += b[b_offset + i % period]` for i < len.
#[allow(clippy::too_many_arguments)]
pub fn add(
    rec: &mut Recorder,
    y: &wgpu::Buffer,
    y_offset: usize,
    b: &wgpu::Buffer,
    b_offset: usize,
    len: usize,
    period: usize,
) -> Result<()> {
    let params = [
        u32_of("len", len)?,
        u32_of("period", period.max(1))?,
        u32_of("y offset", y_offset)?,
        u32_of("b offset", b_offset)?,
    ];
    rec.dispatch(Kernel::Add, &[], &params, vec![y.into(), b.into()], groups(len, 64))
}

/// `qg` (rows, 2 * hd), per row the query then the gate, apart into `q` and `gate`
/// (rows, hd) each (attention::split_gate).
pub fn split_gate(
    rec: &mut Recorder,
    qg: &wgpu::Buffer,
    rows: usize,
    hd: usize,
    q: &wgpu::Buffer,
    gate: &wgpu::Buffer,
) -> Result<()> {
    let len = rows * hd;
    let params = [u32_of("len", len)?, u32_of("head_dim", hd)?];
    rec.dispatch(Kernel::SplitGate, &[], &params, vec![qg.into(), q.into(), gate.into()], groups(len, 64))
}

/// `x[i] = clamp(x[i], -c, c)` for i < len.
pub fn clamp(rec: &mut Recorder, x: &wgpu::Buffer, len: usize, c: f32) -> Result<()> {
    rec.dispatch(Kernel::Clamp, &[], &[u32_of("len", len)?, c.to_bits()], vec![x.into()], groups(len, 64))
}

/// `out[dst_i, :] += y[i, :] * w_i` for the m (position, weight) pairs in `routes`.
pub fn moe_accumulate(
    rec: &mut Recorder,
    out: &wgpu::Buffer,
    y: &wgpu::Buffer,
    routes: &[(usize, f32)],
    hidden: usize,
) -> Result<()> {
    let mut words = Vec::with_capacity(routes.len() * 2);
    for &(p, w) in routes {
        words.push(u32_of("position", p)?);
        words.push(w.to_bits());
    }
    let route = rec.data(&words);
    let params = [u32_of("m", routes.len())?, u32_of("hidden", hidden)?, 0];
    rec.dispatch(
        Kernel::MoeAccumulate,
        &[],
        &params,
        vec![out.into(), y.into(), route],
        groups(routes.len() * hidden, 64),
    )
}

/// `out[p, :] += sigmoid(g[p]) * s[p, :]` for p < n.
pub fn gated_add(
    rec: &mut Recorder,
    out: &wgpu::Buffer,
    s: &wgpu::Buffer,
    g: &wgpu::Buffer,
    n: usize,
    hidden: usize,
) -> Result<()> {
    let params = [u32_of("n", n)?, u32_of("hidden", hidden)?];
    rec.dispatch(Kernel::GatedAdd, &[], &params, vec![out.into(), s.into(), g.into()], groups(n * hidden, 64))
}

/// Routes n positions from their router logits (moe::route, every scoring rule, the
/// selection bias `bias` and group-limited top-k): `out` receives, per position, top_k
/// (expert index, weight bits) pairs in moe::route's order; `probs` is scratch
/// [n, n_experts].
pub fn route(
    rec: &mut Recorder,
    logits: &wgpu::Buffer,
    probs: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: usize,
    cfg: &crate::model::config::RouterConfig,
    bias: Option<&wgpu::Buffer>,
) -> Result<()> {
    route_with(rec, logits, probs, out, n, cfg, bias, None)
}

/// [`route`], with the experts already chosen where `fixed` says (moe::route_with's
/// `fixed`: deepseek_v4's hash layers, `tid2eid` rows of top_k experts per position, each
/// below n_experts: the caller checks); the scores still weigh them.
#[allow(clippy::too_many_arguments)]
pub fn route_with(
    rec: &mut Recorder,
    logits: &wgpu::Buffer,
    probs: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: usize,
    cfg: &crate::model::config::RouterConfig,
    bias: Option<&wgpu::Buffer>,
    fixed: Option<Bind>,
) -> Result<()> {
    use crate::model::config::Scoring;
    if cfg.top_k == 0 || cfg.top_k > cfg.n_experts {
        return Err(Error::Gpu(format!("route: top_k {} of {} experts", cfg.top_k, cfg.n_experts)));
    }
    let grouped = cfg.n_group > 1 && cfg.topk_group < cfg.n_group && cfg.n_experts.is_multiple_of(cfg.n_group);
    if grouped && (cfg.n_group > 32 || cfg.topk_group * (cfg.n_experts / cfg.n_group) < cfg.top_k) {
        return Err(Error::Gpu(format!(
            "route: {} groups keeping {} for top_k {} of {} experts has no GPU kernel (at most 32 groups, enough candidates)",
            cfg.n_group, cfg.topk_group, cfg.top_k, cfg.n_experts
        )));
    }
    let scoring = match cfg.scoring {
        Scoring::Softmax => 0,
        Scoring::Sigmoid => 1,
        Scoring::SoftmaxOfTopk => 2,
        Scoring::SqrtSoftplus => 3,
    };
    let params = [
        u32_of("n", n)?,
        u32_of("experts", cfg.n_experts)?,
        u32_of("top_k", cfg.top_k)?,
        cfg.norm_topk_prob as u32,
        scoring,
        bias.is_some() as u32,
        u32_of("n_group", cfg.n_group)?,
        u32_of("topk_group", cfg.topk_group)?,
        cfg.routed_scaling_factor.to_bits(),
        fixed.is_some() as u32,
    ];
    // Without a bias (or fixed experts) the logits stand in for the (unread) binding.
    let fixed = fixed.unwrap_or_else(|| logits.into());
    let binds = vec![logits.into(), probs.into(), out.into(), bias.unwrap_or(logits).into(), fixed];
    rec.dispatch(Kernel::Route, &[], &params, binds, groups(n, 64))
}

/// Reads what [`route`] wrote: per position, (experts, weights) as moe::route returns them.
pub fn routes_from(words: &[u8], top_k: usize) -> Vec<crate::model::moe::Routing> {
    let w: Vec<u32> = words.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    w.chunks_exact(2 * top_k.max(1))
        .map(|c| crate::model::moe::Routing {
            experts: c.chunks_exact(2).map(|p| p[0] as usize).collect(),
            weights: c.chunks_exact(2).map(|p| f32::from_bits(p[1])).collect(),
        })
        .collect()
}

/// Which activation [`gate_mul`] applies to the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateAct {
    /// math::sigmoid (qwen3_next's attention output gate).
    Sigmoid,
    /// math::silu (Gated DeltaNet's gated RMSNorm).
    Silu,
}

/// `x[i] = x[i] * act(g[i])` for i < len (gate_mul.wgsl).
pub fn gate_mul(rec: &mut Recorder, x: &wgpu::Buffer, g: &wgpu::Buffer, len: usize, act: GateAct) -> Result<()> {
    let params = [u32_of("len", len)?, (act == GateAct::Silu) as u32];
    rec.dispatch(Kernel::GateMul, &[], &params, vec![x.into(), g.into()], groups(len, 64))
}
