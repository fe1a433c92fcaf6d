//! Gated DeltaNet (qwen3_next's linear attention) on the GPU: its weights and recurrent
//! state. The pass is the graph's `graph::deltanet`, recorded with the GPU's operations
//! (`gpu::backend`): the input matmuls (qwen3_next's grouped weight rows gathered at
//! upload into the split layout qwen3_5_moe stores, so each lands where the next kernel
//! reads it), deltanet_conv.wgsl (causal conv + SiLU, the window kept in the session),
//! l2norm.wgsl (q, k), deltanet_gates.wgsl (beta, decay), delta_rule.wgsl (the
//! recurrence, the state kept in the session), rmsnorm.wgsl + gate_mul.wgsl (the gated
//! RMSNorm) and the out_proj matmul.
//!
//! [`GpuDeltaState`] is a layer's recurrent state in GPU buffers with the CPU's
//! [`crate::model::deltanet::DeltaState`] bookkeeping: positions absorbed, snapshots at
//! the start of multi-token calls, and a rewind to the latest snapshot at or before a
//! truncation (the caller feeds the difference again).

use super::buffers::GpuMat;
use super::stream::Uploader;
use super::GpuContext;
use crate::error::{Error, Result};
use crate::model::config::LinearAttnConfig;
use crate::model::deltanet::{DeltaNetWeights, InProj};
use crate::model::snapshots::Snapshots;
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

/// One Gated DeltaNet layer's weights on the GPU: always the split projections
/// (qwen3_next's grouped rows gathered at upload).
pub(super) type GpuDeltaNet = DeltaNetWeights<GpuMat, wgpu::Buffer>;

/// Uploads layer `label`'s weights; qwen3_next's grouped in_proj_qkvz / in_proj_ba rows
/// are gathered into the split layout (q|k|v in the conv's order, z, b, a), each row
/// as stored: a row's dot product does not depend on its neighbours, so the values are
/// those the CPU's regroup moves.
pub(super) fn upload(up: &Uploader, label: &str, w: &DeltaNetWeights) -> Result<GpuDeltaNet> {
    let c = &w.cfg;
    let (nk, dk, dv) = (c.n_k_heads, c.k_head_dim, c.v_head_dim);
    if nk == 0 || !c.n_v_heads.is_multiple_of(nk) || c.conv_kernel == 0 {
        return Err(Error::Gpu(format!(
            "{label}: linear attention with {} key heads, {} value heads and a conv of {} has no GPU kernel",
            nk, c.n_v_heads, c.conv_kernel
        )));
    }
    let r = c.n_v_heads / nk;
    let mat = |name: &str, m: &Mat| up.mat(&format!("{label}.{name}"), m);
    let proj = |p: &InProj| -> Result<InProj<GpuMat>> {
        Ok(match p {
            InProj::Grouped { qkvz, ba } => {
                // in_proj_qkvz per key head g: q (dk), k (dk), v (r * dv), z (r * dv).
                let group = 2 * dk + 2 * r * dv;
                let per_head =
                    |start: usize, len: usize| (0..nk).flat_map(move |g| g * group + start..g * group + start + len);
                let mixed = per_head(0, dk).chain(per_head(dk, dk)).chain(per_head(2 * dk, r * dv));
                let z = per_head(2 * dk + r * dv, r * dv);
                // in_proj_ba per key head g: b (r), a (r).
                let b = (0..nk).flat_map(|g| g * 2 * r..g * 2 * r + r);
                let a = (0..nk).flat_map(|g| g * 2 * r + r..g * 2 * r + 2 * r);
                let (qkvz, ba) = (up.in_memory(qkvz)?, up.in_memory(ba)?);
                InProj::Split {
                    qkv: mat("in_mixed", &gather_rows(&qkvz, mixed)?)?,
                    z: mat("in_z", &gather_rows(&qkvz, z)?)?,
                    b: mat("in_b", &gather_rows(&ba, b)?)?,
                    a: mat("in_a", &gather_rows(&ba, a)?)?,
                }
            }
            InProj::Split { qkv, z, b, a } => {
                InProj::Split { qkv: mat("in_mixed", qkv)?, z: mat("in_z", z)?, b: mat("in_b", b)?, a: mat("in_a", a)? }
            }
        })
    };
    w.try_map(proj, mat, |name, v| up.f32(&format!("{label}.{name}"), v))
}

/// One Gated DeltaNet layer's recurrent state on the GPU (DeltaState's twin).
pub struct GpuDeltaState {
    /// Positions absorbed.
    pub pos: usize,
    /// (conv_kernel - 1, conv_dim): the last inputs of the conv, oldest first.
    pub conv: wgpu::Buffer,
    /// (n_v_heads, k_head_dim, v_head_dim)
    pub s: wgpu::Buffer,
    /// (conv, s) copies at the start of recent multi-token calls and where they ended.
    snapshots: Snapshots<(wgpu::Buffer, wgpu::Buffer)>,
}

fn state_bytes(c: &LinearAttnConfig) -> (u64, u64) {
    (((c.conv_kernel - 1) * c.conv_dim()) as u64 * 4, (c.n_v_heads * c.k_head_dim * c.v_head_dim) as u64 * 4)
}

/// Copies (or, without a source, zeroes) state buffers now, ahead of any later work.
pub(super) fn copy_now(ctx: &GpuContext, pairs: &[(Option<&wgpu::Buffer>, &wgpu::Buffer)]) {
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
            snapshots: Snapshots::default(),
        })
    }

    pub(super) fn ensure(&mut self, ctx: &GpuContext, c: &LinearAttnConfig) -> Result<()> {
        let (conv, s) = state_bytes(c);
        if self.conv.size() != conv.max(4) || self.s.size() != s.max(4) {
            *self = GpuDeltaState::new(ctx, c)?;
        }
        Ok(())
    }

    /// Bytes of the state itself.
    pub fn bytes(&self) -> usize {
        (self.conv.size() + self.s.size()) as usize
    }

    /// Bytes of its snapshots.
    pub fn snapshot_bytes(&self) -> usize {
        self.snapshots.iter().map(|(_, (c, s))| (c.size() + s.size()) as usize).sum()
    }

    /// Keeps the snapshot after `pos` positions (`Snapshots::pin`).
    pub fn pin(&mut self, pos: usize) {
        self.snapshots.pin(pos);
    }

    /// Whether the coming passes verify drafts (`Snapshots::verifying`).
    pub fn verifying(&mut self, v: bool) {
        self.snapshots.verifying(v);
    }

    /// Whether a call of `n` positions starts with a snapshot, as `DeltaState::begin`: a
    /// multi-token call, and the call after one.
    pub(super) fn begin(&mut self, n: usize) -> bool {
        self.snapshots.begin(n)
    }

    /// Remembers the current state (at the start of a multi-token call), as
    /// DeltaState::snapshot does; the copy is submitted at once.
    pub fn snapshot(&mut self, ctx: &GpuContext) -> Result<()> {
        if !self.snapshots.wants(self.pos) {
            return Ok(());
        }
        // The oldest snapshot's buffers are reused when it goes.
        let (conv, s) = match self.snapshots.make_room() {
            Some(old) => old,
            None => (
                ctx.storage_buffer("deltanet.conv_snapshot", self.conv.size())?,
                ctx.storage_buffer("deltanet.state_snapshot", self.s.size())?,
            ),
        };
        copy_now(ctx, &[(Some(&self.conv), &conv), (Some(&self.s), &s)]);
        self.snapshots.push(self.pos, (conv, s));
        Ok(())
    }

    /// Its snapshots, oldest first: (position, conv, s) buffers (read back into a cache
    /// file's session: `gpu::persist`).
    pub(super) fn snapshot_buffers(&self) -> impl Iterator<Item = (usize, &wgpu::Buffer, &wgpu::Buffer)> {
        self.snapshots.iter().map(|(p, (c, s))| (*p, c, s))
    }

    /// Adds a snapshot after `pos` positions holding `conv` and `s` (a cache file's, uploaded:
    /// `gpu::persist`); the oldest goes past the two kept.
    pub(super) fn push_snapshot(&mut self, ctx: &GpuContext, pos: usize, conv: &[f32], s: &[f32]) -> Result<()> {
        if conv.len() as u64 * 4 != self.conv.size() || s.len() as u64 * 4 != self.s.size() {
            return Err(crate::Error::Gpu("a recurrent snapshot of another shape".into()));
        }
        let (cb, sb) = (
            ctx.storage_buffer("deltanet.conv_snapshot", self.conv.size())?,
            ctx.storage_buffer("deltanet.state_snapshot", self.s.size())?,
        );
        for (b, v) in [(&cb, conv), (&sb, s)] {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            ctx.queue.write_buffer(b, 0, &bytes);
        }
        self.snapshots.push(pos, (cb, sb));
        Ok(())
    }

    /// The positions [`GpuDeltaState::rewind`]`(positions)` would leave, without going there.
    pub fn rewind_point(&self, positions: usize) -> usize {
        self.snapshots.point(self.pos, positions)
    }

    /// Goes back to at most `positions` positions, as DeltaState::rewind: unchanged if it
    /// holds no more, else the latest snapshot at or before, else the empty state.
    /// Returns the positions now held.
    pub fn rewind(&mut self, ctx: &GpuContext, positions: usize) -> usize {
        if positions >= self.pos {
            return self.pos;
        }
        match self.snapshots.back_to(positions) {
            Some((pos, (conv, s))) => {
                self.pos = *pos;
                copy_now(ctx, &[(Some(conv), &self.conv), (Some(s), &self.s)]);
            }
            None => {
                self.pos = 0;
                copy_now(ctx, &[(None, &self.conv), (None, &self.s)]);
            }
        }
        self.pos
    }
}
