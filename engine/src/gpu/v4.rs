//! DeepSeek-V4's operations on the GPU, bit for bit as the CPU's ([`crate::model::v4`]):
//! the interleaved tail RoPE (rope_tail.wgsl) and the hyper-connections (`v4::hc`): the
//! weights of the streams (hc_weights.wgsl, Sinkhorn-Knopp included), the collapse of the
//! N residual streams before a block (hc_collapse.wgsl), their expand after it
//! (hc_expand.wgsl); and the strided row copy the V4 graph uses to gather and scatter rows.

use super::kernels::Kernel;
use super::ops::{groups, u32_of};
use super::recorder::{Bind, Recorder};
use crate::error::{Error, Result};
use crate::model::v4::HcShape;

/// The hyper-connection weights of the `s.n` positions from their mixes (v4::hc::weights,
/// Sinkhorn-Knopp for `s.iters` iterations): `pre`, `post` (n, N) and `comb` (n, N, N);
/// with `head`, only `pre` (v4::hc::head_pre, mixes of N floats per position).
#[allow(clippy::too_many_arguments)]
pub fn hc_weights(
    rec: &mut Recorder,
    mix: &wgpu::Buffer,
    base: &wgpu::Buffer,
    scale: &wgpu::Buffer,
    s: HcShape,
    head: bool,
    pre: &wgpu::Buffer,
    post: &wgpu::Buffer,
    comb: &wgpu::Buffer,
) -> Result<()> {
    let params =
        [u32_of("n", s.n)?, u32_of("n_hc", s.n_hc)?, u32_of("iters", s.iters)?, u32::from(head), s.eps.to_bits()];
    let binds = vec![mix.into(), base.into(), scale.into(), pre.into(), post.into(), comb.into()];
    rec.dispatch(Kernel::HcWeights, &[], &params, binds, groups(s.n, 64))
}

/// `out[p, :] = sum_j pre[p, j] x[p, j, :]` for the `s.n` positions of `x` (n, n_hc, hidden).
pub fn hc_collapse(
    rec: &mut Recorder,
    pre: &wgpu::Buffer,
    x: &wgpu::Buffer,
    s: HcShape,
    out: &wgpu::Buffer,
) -> Result<()> {
    let params = [u32_of("n", s.n)?, u32_of("n_hc", s.n_hc)?, u32_of("hidden", s.hidden)?];
    rec.dispatch(Kernel::HcCollapse, &[], &params, vec![out.into(), pre.into(), x.into()], groups(s.n * s.hidden, 64))
}

/// The streams after a block: `x[p, k] = post[p, k] y[p] + sum_j comb[p, j, k] x[p, j]`,
/// through `scratch` (at least n * n_hc * hidden floats), which is copied back over `x`.
pub fn hc_expand(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    post: &wgpu::Buffer,
    comb: &wgpu::Buffer,
    s: HcShape,
    scratch: &wgpu::Buffer,
) -> Result<()> {
    let len = s.n * s.n_hc * s.hidden;
    let params = [u32_of("n", s.n)?, u32_of("n_hc", s.n_hc)?, u32_of("hidden", s.hidden)?];
    let binds = vec![scratch.into(), x.into(), y.into(), post.into(), comb.into()];
    rec.dispatch(Kernel::HcExpand, &[], &params, binds, groups(len, 64))?;
    rec.copy(scratch, 0, x, 0, len as u64 * 4);
    Ok(())
}

/// `rows` rows of `width` floats from `src` (at float `src_at`, `src_stride` apart) into
/// `dst` (at `dst_at`, `dst_stride` apart): buffer copies, exact.
#[allow(clippy::too_many_arguments)]
pub fn copy_rows(
    rec: &mut Recorder,
    src: &wgpu::Buffer,
    src_at: usize,
    src_stride: usize,
    dst: &wgpu::Buffer,
    dst_at: usize,
    dst_stride: usize,
    rows: usize,
    width: usize,
) -> Result<()> {
    let f = 4u64;
    if src_stride == width && dst_stride == width {
        rec.copy(src, src_at as u64 * f, dst, dst_at as u64 * f, (rows * width) as u64 * f);
        return Ok(());
    }
    for r in 0..rows {
        let (s, d) = (src_at + r * src_stride, dst_at + r * dst_stride);
        rec.copy(src, s as u64 * f, dst, d as u64 * f, width as u64 * f);
    }
    Ok(())
}

/// DeepSeek-V4's RoPE of the trailing `2 * half` values of each of n positions' `heads`
/// rows of `stride` floats (at float `x_offset`), as interleaved pairs in place
/// (v4::compress::rope_tail); `cs` holds per position half cosines then half sines;
/// `inverse` rotates back.
#[allow(clippy::too_many_arguments)]
pub fn rope_tail(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    x_offset: usize,
    n: usize,
    heads: usize,
    stride: usize,
    half: usize,
    inverse: bool,
    cs: Bind,
) -> Result<()> {
    if 2 * half > stride {
        return Err(Error::Gpu(format!("rope_tail: {} rotary values in rows of {stride}", 2 * half)));
    }
    let params = [
        u32_of("n", n)?,
        u32_of("heads", heads)?,
        u32_of("stride", stride)?,
        u32_of("half", half)?,
        u32::from(inverse),
        u32_of("x offset", x_offset)?,
        0,
    ];
    rec.dispatch(Kernel::RopeTail, &[], &params, vec![x.into(), cs], groups(n * heads * half, 64))
}
