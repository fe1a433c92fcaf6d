//! Gated DeltaNet (qwen3_next's linear attention) on the GPU: the WGSL twin of
//! [`crate::model::deltanet`], step for step and bit for bit.
//!
//! Per layer and call of n positions: three matmuls (the conv input q|k|v, z, and b|a;
//! qwen3_next's grouped weight rows regrouped at upload, qwen3_5_moe's taken as stored,
//! so each lands where the next kernel reads it:
//! a row's dot product does not depend on its neighbours, so the bits are the CPU's),
//! deltanet_conv.wgsl (causal conv + SiLU, the window kept in the session),
//! l2norm.wgsl (q, k), deltanet_gates.wgsl (beta, decay), delta_rule.wgsl (the
//! recurrence, the state kept in the session), rmsnorm.wgsl + gate_mul.wgsl (the gated
//! RMSNorm) and the out_proj matmul.
//!
//! [`GpuDeltaState`] is a layer's recurrent state in GPU buffers with the CPU's
//! [`crate::model::deltanet::DeltaState`] bookkeeping: positions absorbed, snapshots at
//! the start of multi-token calls, and a rewind to the latest snapshot at or before a
//! truncation (the caller feeds the difference again).

use super::buffers::GpuMat;
use super::kernels::Kernel;
use super::ops::{self, groups, u32_of, GateAct};
use super::recorder::Recorder;
use super::stream::Uploader;
use super::GpuContext;
use crate::error::{Error, Result};
use crate::model::config::LinearAttnConfig;
use crate::model::deltanet::{DeltaNetWeights, InProj};
use crate::tensor::{Bytes, Mat};

/// The rows `rows` of `m`, in that order, as a new matrix (stored bytes copied as they are).
pub fn gather_rows(m: &Mat, rows: impl IntoIterator<Item = usize>) -> Result<Mat> {
    let rb = m.row_bytes();
    let src = m.bytes.as_ref();
    let mut bytes = Vec::new();
    let mut n = 0;
    for r in rows {
        let row =
            src.get(r * rb..(r + 1) * rb).ok_or_else(|| Error::Gpu(format!("row {r} of a {}-row matrix", m.rows)))?;
        bytes.extend_from_slice(row);
        n += 1;
    }
    Mat::new(n, m.cols, m.dtype, Bytes::from_vec(bytes))
}

/// The rows of `top`, then those of `bottom` (same columns and dtype), as one matrix.
fn stack_rows(top: &Mat, bottom: &Mat) -> Result<Mat> {
    if (top.cols, top.dtype) != (bottom.cols, bottom.dtype) {
        return Err(Error::Gpu(format!(
            "cannot stack a {}-column {:?} matrix on a {}-column {:?} one",
            bottom.cols, bottom.dtype, top.cols, top.dtype
        )));
    }
    let mut bytes = top.bytes.as_ref().to_vec();
    bytes.extend_from_slice(bottom.bytes.as_ref());
    Mat::new(top.rows + bottom.rows, top.cols, top.dtype, Bytes::from_vec(bytes))
}

/// One Gated DeltaNet layer's weights on the GPU.
pub struct GpuDeltaNet {
    /// (conv_dim, hidden): in_proj_qkvz's q rows of every key head, then k, then v.
    in_mixed: GpuMat,
    /// (value_dim, hidden): in_proj_qkvz's z rows in value-head order.
    in_z: GpuMat,
    /// (2 * n_v_heads, hidden): in_proj_ba's b rows in value-head order, then a.
    in_ba: GpuMat,
    /// (conv_dim, conv_kernel)
    conv: wgpu::Buffer,
    /// (n_v_heads)
    neg_a: wgpu::Buffer,
    dt_bias: wgpu::Buffer,
    /// (v_head_dim)
    norm: wgpu::Buffer,
    out: GpuMat,
    pub cfg: LinearAttnConfig,
    eps: f32,
}

impl GpuDeltaNet {
    pub fn upload(up: &Uploader, label: &str, w: &DeltaNetWeights) -> Result<Self> {
        let c = &w.cfg;
        let (nk, dk, dv) = (c.n_k_heads, c.k_head_dim, c.v_head_dim);
        if nk == 0 || !c.n_v_heads.is_multiple_of(nk) || c.conv_kernel == 0 {
            return Err(Error::Gpu(format!(
                "{label}: linear attention with {} key heads, {} value heads and a conv of {} has no GPU kernel",
                nk, c.n_v_heads, c.conv_kernel
            )));
        }
        let r = c.n_v_heads / nk;
        let (mixed, z, ba) = match &w.in_proj {
            InProj::Grouped { qkvz, ba } => {
                // in_proj_qkvz per key head g: q (dk), k (dk), v (r * dv), z (r * dv).
                let group = 2 * dk + 2 * r * dv;
                let per_head =
                    |start: usize, len: usize| (0..nk).flat_map(move |g| g * group + start..g * group + start + len);
                let mixed = per_head(0, dk).chain(per_head(dk, dk)).chain(per_head(2 * dk, r * dv));
                let z = per_head(2 * dk + r * dv, r * dv);
                // in_proj_ba per key head g: b (r), a (r).
                let b_then_a = (0..nk)
                    .flat_map(|g| g * 2 * r..g * 2 * r + r)
                    .chain((0..nk).flat_map(|g| g * 2 * r + r..g * 2 * r + 2 * r));
                let qkvz = up.in_memory(qkvz)?;
                (gather_rows(&qkvz, mixed)?, gather_rows(&qkvz, z)?, gather_rows(&up.in_memory(ba)?, b_then_a)?)
            }
            // qwen3_5_moe stores them in the order the kernels read.
            InProj::Split { qkv, z, b, a } => {
                (up.in_memory(qkv)?, up.in_memory(z)?, stack_rows(&up.in_memory(b)?, &up.in_memory(a)?)?)
            }
        };
        Ok(GpuDeltaNet {
            in_mixed: up.mat(&format!("{label}.in_mixed"), &mixed)?,
            in_z: up.mat(&format!("{label}.in_z"), &z)?,
            in_ba: up.mat(&format!("{label}.in_ba"), &ba)?,
            conv: up.f32(&format!("{label}.conv"), &w.conv)?,
            neg_a: up.f32(&format!("{label}.neg_a"), &w.neg_a)?,
            dt_bias: up.f32(&format!("{label}.dt_bias"), &w.dt_bias)?,
            norm: up.f32(&format!("{label}.norm"), &w.norm)?,
            out: up.mat(&format!("{label}.out"), &w.out)?,
            cfg: c.clone(),
            eps: w.eps,
        })
    }

    /// The layer on n positions of `xn` (n, hidden) -> `y` (n, hidden), advancing `state`
    /// by those positions (DeltaNetWeights::forward).
    pub fn forward(
        &self,
        rec: &mut Recorder,
        s: &DeltaScratch,
        xn: &wgpu::Buffer,
        n: usize,
        state: &mut GpuDeltaState,
        y: &wgpu::Buffer,
    ) -> Result<()> {
        let c = &self.cfg;
        let (kd, vd, cd, nv) = (c.key_dim(), c.value_dim(), c.conv_dim(), c.n_v_heads);
        if s.n < n {
            return Err(Error::Gpu("DeltaNet scratch is too small".into()));
        }
        state.ensure(rec.ctx(), c)?;
        ops::matmul(rec, &self.in_mixed, xn, 0, n, &s.mixed, 0, cd)?;
        ops::matmul(rec, &self.in_z, xn, 0, n, &s.z, 0, vd)?;
        ops::matmul(rec, &self.in_ba, xn, 0, n, &s.ba, 0, 2 * nv)?;

        let params = [u32_of("n", n)?, u32_of("conv_dim", cd)?, u32_of("conv kernel", c.conv_kernel)?];
        let binds = vec![(&s.mixed).into(), (&self.conv).into(), (&state.conv).into()];
        rec.dispatch(Kernel::DeltaNetConv, &[], &params, binds, groups(cd, 64))?;

        // q and k: L2 norm per head, q then times k_head_dim^-0.5.
        let scale = (1.0 / (c.k_head_dim as f64).sqrt()) as f32;
        let heads = 2 * c.n_k_heads;
        let params = [
            u32_of("rows", n * heads)?,
            u32_of("heads", heads)?,
            u32_of("k_head_dim", c.k_head_dim)?,
            u32_of("conv_dim", cd)?,
            u32_of("key heads", c.n_k_heads)?,
            scale.to_bits(),
            1e-6f32.to_bits(),
        ];
        rec.dispatch(Kernel::L2Norm, &[], &params, vec![(&s.mixed).into()], (n * heads) as u64)?;

        let params = [u32_of("n", n)?, u32_of("value heads", nv)?];
        let binds = vec![(&s.ba).into(), (&self.neg_a).into(), (&self.dt_bias).into()];
        rec.dispatch(Kernel::DeltaNetGates, &[], &params, binds, groups(n * nv, 64))?;

        let col_groups = c.v_head_dim.div_ceil(64);
        let params = [
            u32_of("n", n)?,
            u32_of("value heads", nv)?,
            u32_of("heads ratio", nv / c.n_k_heads)?,
            u32_of("k_head_dim", c.k_head_dim)?,
            u32_of("v_head_dim", c.v_head_dim)?,
            u32_of("key_dim", kd)?,
            u32_of("conv_dim", cd)?,
            u32_of("column groups", col_groups)?,
        ];
        let binds = vec![(&s.mixed).into(), (&s.ba).into(), (&state.s).into(), (&s.o).into()];
        rec.dispatch(Kernel::DeltaRule, &[], &params, binds, (nv * col_groups) as u64)?;
        state.pos += n;

        // Gated RMSNorm per (position, value head), then out_proj.
        ops::rmsnorm(rec, &s.o, 0, n * nv, c.v_head_dim, &self.norm, self.eps)?;
        ops::gate_mul(rec, &s.o, &s.z, n * vd, GateAct::Silu)?;
        ops::matmul(rec, &self.out, &s.o, 0, n, y, 0, self.out.rows)
    }
}

/// Per-call scratch of the DeltaNet layers (shared by all of them: the queue runs the
/// layers in order).
pub struct DeltaScratch {
    n: usize,
    /// (n, conv_dim)
    mixed: wgpu::Buffer,
    /// (n, value_dim)
    z: wgpu::Buffer,
    /// (n, 2 * n_v_heads)
    ba: wgpu::Buffer,
    /// (n, value_dim)
    o: wgpu::Buffer,
}

impl DeltaScratch {
    pub fn new(ctx: &GpuContext, c: &LinearAttnConfig, n: usize) -> Result<Self> {
        let buf = |label: &str, elems: usize| ctx.storage_buffer(label, elems as u64 * 4);
        Ok(DeltaScratch {
            n,
            mixed: buf("deltanet.mixed", n * c.conv_dim())?,
            z: buf("deltanet.z", n * c.value_dim())?,
            ba: buf("deltanet.ba", n * 2 * c.n_v_heads)?,
            o: buf("deltanet.o", n * c.value_dim())?,
        })
    }
}

/// A snapshot of one layer's state after `pos` positions.
struct Snapshot {
    pos: usize,
    conv: wgpu::Buffer,
    s: wgpu::Buffer,
}

/// Snapshots kept per layer, as on the CPU.
const MAX_SNAPSHOTS: usize = 2;

/// One Gated DeltaNet layer's recurrent state on the GPU (DeltaState's twin).
pub struct GpuDeltaState {
    /// Positions absorbed.
    pub pos: usize,
    /// (conv_kernel - 1, conv_dim): the last inputs of the conv, oldest first.
    conv: wgpu::Buffer,
    /// (n_v_heads, k_head_dim, v_head_dim)
    s: wgpu::Buffer,
    snapshots: Vec<Snapshot>,
}

fn state_bytes(c: &LinearAttnConfig) -> (u64, u64) {
    (((c.conv_kernel - 1) * c.conv_dim()) as u64 * 4, (c.n_v_heads * c.k_head_dim * c.v_head_dim) as u64 * 4)
}

/// Copies (or, without a source, zeroes) state buffers now, ahead of any later work.
fn copy_now(ctx: &GpuContext, pairs: &[(Option<&wgpu::Buffer>, &wgpu::Buffer)]) {
    let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("deltanet state") });
    for (src, dst) in pairs {
        match src {
            Some(src) => enc.copy_buffer_to_buffer(src, 0, dst, 0, dst.size()),
            None => enc.clear_buffer(dst, 0, None),
        }
    }
    ctx.queue.submit([enc.finish()]);
}

impl GpuDeltaState {
    /// An empty state (zeroed buffers) for a layer of this shape.
    pub fn new(ctx: &GpuContext, c: &LinearAttnConfig) -> Result<Self> {
        let (conv, s) = state_bytes(c);
        Ok(GpuDeltaState {
            pos: 0,
            conv: ctx.storage_buffer("deltanet.conv_state", conv)?,
            s: ctx.storage_buffer("deltanet.state", s)?,
            snapshots: Vec::new(),
        })
    }

    fn ensure(&mut self, ctx: &GpuContext, c: &LinearAttnConfig) -> Result<()> {
        let (conv, s) = state_bytes(c);
        if self.conv.size() != conv.max(4) || self.s.size() != s.max(4) {
            *self = GpuDeltaState::new(ctx, c)?;
        }
        Ok(())
    }

    /// Bytes of the state itself (as `Session::bytes` counts the CPU's).
    pub fn bytes(&self) -> usize {
        (self.conv.size() + self.s.size()) as usize
    }

    /// Remembers the current state (at the start of a multi-token call), as
    /// DeltaState::snapshot does; the copy is submitted at once.
    pub fn snapshot(&mut self, ctx: &GpuContext) -> Result<()> {
        if self.pos == 0 || self.snapshots.last().is_some_and(|s| s.pos == self.pos) {
            return Ok(());
        }
        let (conv, s) = if self.snapshots.len() == MAX_SNAPSHOTS {
            let old = self.snapshots.remove(0);
            (old.conv, old.s)
        } else {
            (
                ctx.storage_buffer("deltanet.conv_snapshot", self.conv.size())?,
                ctx.storage_buffer("deltanet.state_snapshot", self.s.size())?,
            )
        };
        copy_now(ctx, &[(Some(&self.conv), &conv), (Some(&self.s), &s)]);
        self.snapshots.push(Snapshot { pos: self.pos, conv, s });
        Ok(())
    }

    /// Goes back to at most `positions` positions, as DeltaState::rewind: unchanged if it
    /// holds no more, else the latest snapshot at or before, else the empty state.
    /// Returns the positions now held.
    pub fn rewind(&mut self, ctx: &GpuContext, positions: usize) -> usize {
        if positions >= self.pos {
            return self.pos;
        }
        self.snapshots.retain(|s| s.pos <= positions);
        match self.snapshots.last() {
            Some(snap) => {
                self.pos = snap.pos;
                copy_now(ctx, &[(Some(&snap.conv), &self.conv), (Some(&snap.s), &self.s)]);
            }
            None => {
                self.pos = 0;
                copy_now(ctx, &[(None, &self.conv), (None, &self.s)]);
            }
        }
        self.pos
    }
}
