//! DeepSeek-V4's operations on the GPU, bit for bit as the CPU's ([`crate::model::v4`]):
//! the interleaved tail RoPE (rope_tail.wgsl) and the hyper-connections (`v4::hc`): the
//! weights of the streams (hc_weights.wgsl, Sinkhorn-Knopp included), the collapse of the
//! N residual streams before a block (hc_collapse.wgsl), their expand after it
//! (hc_expand.wgsl); the strided row copy the V4 graph uses to gather and scatter rows;
//! the compressors' entries with their state between passes ([`GpuComp`],
//! v4_compress.wgsl).

use super::kernels::Kernel;
use super::ops::{groups, u32_of};
use super::recorder::{Bind, Recorder};
use super::GpuContext;
use crate::error::{Error, Result};
use crate::model::rope::Rope;
use crate::model::v4::compress::CompShape;
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

/// A compressor's state on the GPU (v4::CompState's, laid out for the kernel): its
/// entries (rows of `dim`, RMSNorm and RoPE applied; the buffer grows by doubling), and
/// the rows the next entries still need: with overlapping windows the last finished
/// window's rows first (`has_prev`), then those of the unfinished window, as projected
/// (kv and gate; the position bias is added where they are used, the CPU's sum), except
/// the previous window's Ca gates after a state was read back from a cache file
/// (`prev_biased`: they hold the bias already, as the CPU's state keeps them).
pub struct GpuComp {
    pub entries: wgpu::Buffer,
    /// Entries so far.
    pub count: usize,
    pub(super) cap: usize,
    /// Room for 2 * rate rows of the projections' width each.
    pub(super) rows: Option<(wgpu::Buffer, wgpu::Buffer)>,
    pub(super) held: usize,
    pub(super) has_prev: bool,
    pub(super) prev_biased: bool,
}

/// What a [`GpuComp`] needs to go back to a point: its entries' count (they only grow),
/// copies of its kept rows, its flags.
pub struct CompSnapshot {
    count: usize,
    held: usize,
    has_prev: bool,
    prev_biased: bool,
    rows: Option<(wgpu::Buffer, wgpu::Buffer)>,
}

impl CompSnapshot {
    /// GPU bytes it holds (the rows kept for the next entries).
    pub(super) fn bytes(&self) -> usize {
        self.rows.as_ref().map_or(0, |(k, g)| (k.size() + g.size()) as usize)
    }
}

impl GpuComp {
    /// Its state now ([`CompSnapshot`]), into `reuse`'s buffers where they are the size
    /// (an older snapshot's); the copies are submitted at once.
    pub(super) fn snapshot(&self, ctx: &GpuContext, reuse: Option<CompSnapshot>) -> Result<CompSnapshot> {
        let rows = match &self.rows {
            Some((k, g)) => {
                let copy = match reuse.and_then(|r| r.rows) {
                    Some((rk, rg)) if (rk.size(), rg.size()) == (k.size(), g.size()) => (rk, rg),
                    _ => (
                        ctx.storage_buffer("v4.comp_rows_kv_snapshot", k.size())?,
                        ctx.storage_buffer("v4.comp_rows_gate_snapshot", g.size())?,
                    ),
                };
                super::deltanet::copy_now(ctx, &[(Some(k), &copy.0), (Some(g), &copy.1)]);
                Some(copy)
            }
            None => None,
        };
        let (count, held, has_prev, prev_biased) = (self.count, self.held, self.has_prev, self.prev_biased);
        Ok(CompSnapshot { count, held, has_prev, prev_biased, rows })
    }

    /// Back to `s` (entries after its count are dropped; later feeds overwrite them).
    pub(super) fn restore(&mut self, ctx: &GpuContext, s: &CompSnapshot) {
        (self.count, self.held, self.has_prev, self.prev_biased) = (s.count, s.held, s.has_prev, s.prev_biased);
        // Rows exist once fed and stay; none at the snapshot means none held then.
        if let (Some((k, g)), Some((dk, dg))) = (&s.rows, &self.rows) {
            super::deltanet::copy_now(ctx, &[(Some(k), dk), (Some(g), dg)]);
        }
    }

    /// The empty state.
    pub fn new(ctx: &GpuContext) -> Result<Self> {
        let entries = ctx.storage_buffer("v4.entries", 4)?;
        Ok(GpuComp { entries, count: 0, cap: 0, rows: None, held: 0, has_prev: false, prev_biased: false })
    }

    /// GPU bytes held: the entries' buffer and the rows kept for the next entries.
    pub fn bytes(&self) -> usize {
        let rows = self.rows.as_ref().map_or(0, |(k, g)| k.size() + g.size());
        (self.entries.size() + rows) as usize
    }

    /// Room for `entries` entries of `dim`, the ones so far copied over.
    fn reserve(&mut self, rec: &mut Recorder, entries: usize, dim: usize) -> Result<()> {
        if entries <= self.cap {
            return Ok(());
        }
        let cap = entries.max(2 * self.cap).max(16);
        let bigger = rec.ctx().storage_buffer("v4.entries", (cap * dim) as u64 * 4)?;
        rec.copy(&self.entries, 0, &bigger, 0, (self.count * dim) as u64 * 4);
        self.entries = bigger;
        self.cap = cap;
        Ok(())
    }

    /// v4::compress::feed on the GPU: the projections `kv` and `gate` (c.n rows of 2 *
    /// dim with overlap, else dim) of the pass's positions; every window they complete
    /// gives an entry (v4_compress.wgsl, then rmsnorm.wgsl with `norm`, then
    /// rope_tail.wgsl with `rope` at the entry's first position).
    #[allow(clippy::too_many_arguments)]
    pub fn feed(
        &mut self,
        rec: &mut Recorder,
        kv: &wgpu::Buffer,
        gate: &wgpu::Buffer,
        ape: &wgpu::Buffer,
        norm: &wgpu::Buffer,
        c: CompShape,
        rope: &Rope,
    ) -> Result<()> {
        let (n, r, d) = (c.n, c.rate, c.dim);
        if r == 0 || d == 0 || rope.rotary_dim > d {
            return Err(Error::Gpu(format!("v4 compress: rate {r}, dim {d}, rotary dim {}", rope.rotary_dim)));
        }
        let width = if c.overlap { 2 * d } else { d };
        let prev = if self.has_prev { r } else { 0 };
        let windows = (self.held - prev + n) / r;
        let rows = self.held + n;
        let row_bytes = (width * 4) as u64;
        let ctx = rec.ctx();
        let seq_kv = ctx.storage_buffer("v4.comp_kv", rows as u64 * row_bytes)?;
        let seq_gate = ctx.storage_buffer("v4.comp_gate", rows as u64 * row_bytes)?;
        if let Some((held_kv, held_gate)) = &self.rows {
            rec.copy(held_kv, 0, &seq_kv, 0, self.held as u64 * row_bytes);
            rec.copy(held_gate, 0, &seq_gate, 0, self.held as u64 * row_bytes);
        }
        rec.copy(kv, 0, &seq_kv, self.held as u64 * row_bytes, n as u64 * row_bytes);
        rec.copy(gate, 0, &seq_gate, self.held as u64 * row_bytes, n as u64 * row_bytes);
        if windows > 0 {
            self.reserve(rec, self.count + windows, d)?;
            let at = self.count * d;
            let params = [
                u32_of("windows", windows)?,
                u32_of("dim", d)?,
                u32_of("rate", r)?,
                u32::from(c.overlap),
                u32_of("first", prev)?,
                u32::from(self.has_prev),
                u32_of("entries offset", at)?,
                u32::from(self.prev_biased),
            ];
            let binds = vec![(&seq_kv).into(), (&seq_gate).into(), ape.into(), (&self.entries).into()];
            rec.dispatch(Kernel::V4Compress, &[], &params, binds, groups(windows * d, 64))?;
            super::ops::rmsnorm(rec, &self.entries, at, windows, d, norm, c.rms_eps)?;
            let (mut co, mut si, mut cs) = (Vec::new(), Vec::new(), Vec::with_capacity(windows * rope.rotary_dim));
            for w in 0..windows {
                rope.cos_sin((self.count + w) * r, &mut co, &mut si);
                cs.extend_from_slice(&co);
                cs.extend_from_slice(&si);
            }
            let cs = rec.data_f32(&cs);
            rope_tail(rec, &self.entries, at, windows, 1, d, rope.rotary_dim / 2, false, cs)?;
            self.count += windows;
        }
        // What the next entries need: with overlap the last finished window on, else the
        // unfinished window's rows.
        let keep_from = match (c.overlap, windows) {
            (true, 0) => 0,
            (true, w) => prev + (w - 1) * r,
            (false, w) => w * r,
        };
        self.held = rows - keep_from;
        self.has_prev = c.overlap && (self.has_prev || windows > 0);
        // A finished window's rows are kept as projected (the bias not in them).
        self.prev_biased &= windows == 0;
        if self.rows.is_none() {
            let bytes = (2 * r) as u64 * row_bytes;
            self.rows =
                Some((ctx.storage_buffer("v4.comp_rows_kv", bytes)?, ctx.storage_buffer("v4.comp_rows_gate", bytes)?));
        }
        if let Some((held_kv, held_gate)) = &self.rows {
            let from = keep_from as u64 * row_bytes;
            rec.copy(&seq_kv, from, held_kv, 0, self.held as u64 * row_bytes);
            rec.copy(&seq_gate, from, held_gate, 0, self.held as u64 * row_bytes);
        }
        Ok(())
    }
}
