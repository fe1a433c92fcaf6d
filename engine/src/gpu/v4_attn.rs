//! DeepSeek-V4's attention state and its two last operations on the GPU, bit for bit as
//! the CPU's ([`crate::model::v4`]): a layer's sliding window of keys and its
//! compressors' entries ([`GpuV4Layer`]), the lightning indexer's choice
//! (index_scores.wgsl, DSA's scores with V4's bound, then v4_topk.wgsl), and the
//! attention over the window and the entries with per-head sinks (v4_attend.wgsl).

use super::kernels::Kernel;
use super::ops::u32_of;
use super::recorder::Recorder;
use super::v4::GpuComp;
use super::GpuContext;
use crate::error::{Error, Result};
use crate::model::v4::attn::AttendShape;
use crate::model::v4::SelectShape;

/// One layer's state on the GPU (v4::V4LayerState's): the last `held` keys (at most
/// window - 1 rows of head_dim), the attention's compressor and the indexer's.
pub struct GpuV4Layer {
    pub window: wgpu::Buffer,
    pub held: usize,
    pub comp: GpuComp,
    pub index: GpuComp,
    /// The indexer's last choice ([`Self::select`]) and its top-k, for the attention.
    pub choice: Option<(wgpu::Buffer, usize)>,
}

/// A [`GpuV4Layer`]'s state at a point: a copy of its window, its compressors'
/// [`super::v4::CompSnapshot`]s.
pub struct GpuV4Snapshot {
    window: wgpu::Buffer,
    held: usize,
    comp: super::v4::CompSnapshot,
    index: super::v4::CompSnapshot,
}

impl GpuV4Snapshot {
    /// GPU bytes it holds.
    pub fn bytes(&self) -> usize {
        self.window.size() as usize + self.comp.bytes() + self.index.bytes()
    }
}

impl GpuV4Layer {
    /// Its state now, into `reuse`'s buffers (an older snapshot's, pushed out) where they
    /// are the size; the copies are submitted at once.
    pub fn snapshot(&self, ctx: &GpuContext, reuse: Option<GpuV4Snapshot>) -> Result<GpuV4Snapshot> {
        let (window, comp, index) = match reuse {
            Some(r) if r.window.size() == self.window.size() => (r.window, Some(r.comp), Some(r.index)),
            _ => (ctx.storage_buffer("v4.window_snapshot", self.window.size())?, None, None),
        };
        super::deltanet::copy_now(ctx, &[(Some(&self.window), &window)]);
        let (comp, index) = (self.comp.snapshot(ctx, comp)?, self.index.snapshot(ctx, index)?);
        Ok(GpuV4Snapshot { window, held: self.held, comp, index })
    }

    /// Back to `s` (the indexer's choice is made again by the next pass).
    pub fn restore(&mut self, ctx: &GpuContext, s: &GpuV4Snapshot) {
        super::deltanet::copy_now(ctx, &[(Some(&s.window), &self.window)]);
        self.held = s.held;
        self.comp.restore(ctx, &s.comp);
        self.index.restore(ctx, &s.index);
        self.choice = None;
    }

    /// The empty state of a layer whose window is `window` positions of `head_dim` keys.
    pub fn new(ctx: &GpuContext, window: usize, head_dim: usize) -> Result<Self> {
        let bytes = (window.saturating_sub(1) * head_dim) as u64 * 4;
        Ok(GpuV4Layer {
            window: ctx.storage_buffer("v4.window", bytes)?,
            held: 0,
            comp: GpuComp::new(ctx)?,
            index: GpuComp::new(ctx)?,
            choice: None,
        })
    }

    /// GPU bytes held: the window's buffer and both compressors'.
    pub fn bytes(&self) -> usize {
        self.window.size() as usize + self.comp.bytes() + self.index.bytes()
    }

    /// The lightning indexer's choice for the pass's queries `iq` (n, heads, head_dim)
    /// with weights `iw` (n, heads) among the indexer's entries (v4's `choose`: the
    /// weights scaled by heads^-0.5, [`crate::model::v4::compress::select`]): per query
    /// the count, then the chosen entries ascending, in rows of topk + 1 u32s.
    pub fn select(
        &self,
        rec: &mut Recorder,
        iq: &wgpu::Buffer,
        iw: &wgpu::Buffer,
        s: SelectShape,
    ) -> Result<wgpu::Buffer> {
        if s.rate == 0 || s.topk == 0 {
            return Err(Error::Gpu(format!("v4 select: rate {}, top {}", s.rate, s.topk)));
        }
        let ctx = rec.ctx();
        let keys = self.index.count;
        let stride = keys.max(1);
        let scores = ctx.storage_buffer("v4.index_scores", (s.n * stride) as u64 * 4)?;
        let params = [
            u32_of("n", s.n)?,
            u32_of("pos0", s.pos0)?,
            u32_of("heads", s.heads)?,
            u32_of("head_dim", s.head_dim)?,
            u32_of("row", s.head_dim)?,
            0,
            u32_of("score stride", stride)?,
            (s.head_dim as f32).powf(-0.5).to_bits(),
            (s.heads as f32).powf(-0.5).to_bits(),
            u32_of("rate", s.rate)?,
            u32_of("keys", keys)?,
        ];
        let binds = vec![iq.into(), iw.into(), (&self.index.entries).into(), (&scores).into()];
        rec.dispatch(Kernel::IndexScores, &[], &params, binds, s.n as u64)?;
        let flags = ctx.storage_buffer("v4.index_flags", (s.n * stride) as u64 * 4)?;
        let list = ctx.storage_buffer("v4.index_choice", (s.n * (s.topk + 1)) as u64 * 4)?;
        let params = [
            u32_of("n", s.n)?,
            u32_of("pos0", s.pos0)?,
            u32_of("rate", s.rate)?,
            u32_of("keys", keys)?,
            u32_of("topk", s.topk)?,
            u32_of("score stride", stride)?,
        ];
        let binds = vec![(&scores).into(), (&flags).into(), (&list).into()];
        rec.dispatch(Kernel::V4Topk, &[], &params, binds, s.n as u64)?;
        Ok(list)
    }

    /// v4::attn::attend on the GPU: the pass's keys `kv` (n, head_dim) join the window,
    /// each query of `q` (n, heads, head_dim) attends over its window and the entries it
    /// may see (those of `choice`, from [`Self::select`], when `s.sparse`) with the head's
    /// sink into `out`; the window then keeps its last window - 1 keys.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &mut self,
        rec: &mut Recorder,
        q: &wgpu::Buffer,
        kv: &wgpu::Buffer,
        sinks: &wgpu::Buffer,
        s: AttendShape,
        choice: Option<(&wgpu::Buffer, usize)>,
        out: &wgpu::Buffer,
    ) -> Result<()> {
        let (n, hd) = (s.n, s.head_dim);
        if s.window == 0 || hd == 0 {
            return Err(Error::Gpu(format!("v4 attend: window {}, head_dim {hd}", s.window)));
        }
        let sparse = s.sparse && s.rate.is_some();
        let (list, topk) = match (sparse, choice) {
            (true, Some((list, topk))) => (list, topk),
            (true, None) => return Err(Error::Gpu("compressed sparse attention without the indexer's choice".into())),
            (false, _) => (q, 0),
        };
        let ctx = rec.ctx();
        let rows = self.held + n;
        let row = hd as u64 * 4;
        let keys = ctx.storage_buffer("v4.window_keys", rows as u64 * row)?;
        rec.copy(&self.window, 0, &keys, 0, self.held as u64 * row);
        rec.copy(kv, 0, &keys, self.held as u64 * row, n as u64 * row);
        let entries = if s.rate.is_some() { self.comp.count } else { 0 };
        let stride = s.window + entries;
        let scores = ctx.storage_buffer("v4.attn_scores", (n * s.heads * stride) as u64 * 4)?;
        let params = [
            u32_of("n", n)?,
            u32_of("heads", s.heads)?,
            u32_of("head_dim", hd)?,
            u32_of("pos0", s.pos0)?,
            u32_of("held", self.held)?,
            u32_of("window", s.window)?,
            u32_of("rate", s.rate.unwrap_or(0))?,
            u32_of("entries", entries)?,
            u32::from(sparse),
            u32_of("topk", topk)?,
            s.scale.to_bits(),
            u32_of("score stride", stride)?,
        ];
        let e = if entries > 0 { &self.comp.entries } else { &keys };
        let binds = vec![q.into(), (&keys).into(), e.into(), list.into(), sinks.into(), (&scores).into(), out.into()];
        rec.dispatch(Kernel::V4Attend, &[], &params, binds, (n * s.heads) as u64)?;
        let keep = (s.window - 1).min(rows);
        rec.copy(&keys, (rows - keep) as u64 * row, &self.window, 0, keep as u64 * row);
        self.held = keep;
        Ok(())
    }
}
