//! Recording GPU work: kernel dispatches, copies and clears are collected with their
//! small per-dispatch data (uniform parameters, token ids, cos/sin tables, routes) in
//! one host-side arena; [`Recorder::submit`] uploads the arena as one buffer, builds the
//! bind groups, encodes everything into one command buffer and, when reads were asked
//! for, waits for them (async: natively the device is polled, on the web the browser
//! resolves the mapping).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use super::kernels::{Kernel, Pipeline};
use super::GpuContext;
use crate::error::{Error, Result};

/// A byte range of a buffer.
#[derive(Clone, Debug)]
pub struct BufRange {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl BufRange {
    pub fn whole(buffer: &wgpu::Buffer) -> Self {
        BufRange { buffer: buffer.clone(), offset: 0, size: buffer.size() }
    }
}

/// What a binding points at: a buffer range, or a range of one recorder's arena (valid
/// only in the recorder that made it, which `dispatch` checks).
#[derive(Clone, Debug)]
pub enum Bind {
    Buf(BufRange),
    Data { recorder: u64, offset: u64, size: u64 },
}

static RECORDERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl From<&wgpu::Buffer> for Bind {
    fn from(b: &wgpu::Buffer) -> Self {
        Bind::Buf(BufRange::whole(b))
    }
}

impl From<&BufRange> for Bind {
    fn from(b: &BufRange) -> Self {
        Bind::Buf(b.clone())
    }
}

enum Op {
    Dispatch { pipeline: Arc<Pipeline>, binds: Vec<Bind>, groups: (u32, u32) },
    Copy { src: wgpu::Buffer, src_offset: u64, dst: wgpu::Buffer, dst_offset: u64, size: u64 },
    Clear { buffer: wgpu::Buffer, offset: u64, size: u64 },
}

/// Handle of a read requested with [`Recorder::read`]: the index into `submit`'s result.
#[derive(Clone, Copy, Debug)]
pub struct ReadId(pub usize);

pub struct Recorder<'c> {
    ctx: &'c GpuContext,
    ops: Vec<Op>,
    data: Vec<u8>,
    reads: Vec<(wgpu::Buffer, u64, u64)>,
    align: u64,
    id: u64,
}

impl<'c> Recorder<'c> {
    pub fn new(ctx: &'c GpuContext) -> Self {
        let align = (ctx.limits.min_uniform_buffer_offset_alignment as u64)
            .max(ctx.limits.min_storage_buffer_offset_alignment as u64)
            .max(16);
        let id = RECORDERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Recorder { ctx, ops: Vec::new(), data: Vec::new(), reads: Vec::new(), align, id }
    }

    pub fn ctx(&self) -> &'c GpuContext {
        self.ctx
    }

    /// Appends words to the arena (aligned for binding) and returns where they are.
    pub fn data(&mut self, words: &[u32]) -> Bind {
        let offset = self.data.len().div_ceil(self.align as usize) * self.align as usize;
        self.data.resize(offset, 0);
        self.data.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        // Uniform bindings are read in 16-byte units; pad so every binding is whole.
        let size = (words.len().max(1) * 4).div_ceil(16) * 16;
        self.data.resize(offset + size, 0);
        Bind::Data { recorder: self.id, offset: offset as u64, size: size as u64 }
    }

    pub fn data_f32(&mut self, v: &[f32]) -> Bind {
        let words: Vec<u32> = v.iter().map(|x| x.to_bits()).collect();
        self.data(&words)
    }

    /// Records `kernel` over `workgroups` workgroups (split over x and y when above the
    /// per-dimension limit). `params` are the kernel's Params fields between the leading
    /// `zero` and the trailing `groups_x`, which are filled in here; `binds` are
    /// bindings 1.. in order.
    pub fn dispatch(
        &mut self,
        kernel: Kernel,
        constants: &[(&'static str, f64)],
        params: &[u32],
        binds: Vec<Bind>,
        workgroups: u64,
    ) -> Result<()> {
        if workgroups == 0 {
            return Ok(());
        }
        let max = self.ctx.limits.max_compute_workgroups_per_dimension.max(1) as u64;
        let (x, y) = if workgroups <= max { (workgroups, 1) } else { (max, workgroups.div_ceil(max)) };
        if y > max {
            return Err(Error::Gpu(format!(
                "{}: {workgroups} workgroups are too many for one dispatch",
                kernel.name()
            )));
        }
        if binds.iter().any(|b| matches!(b, Bind::Data { recorder, .. } if *recorder != self.id)) {
            return Err(Error::Gpu(format!("{}: data bound from another recorder", kernel.name())));
        }
        let pipeline = self.ctx.pipeline(kernel, constants)?;
        let mut words = Vec::with_capacity(params.len() + 2);
        words.push(0); // zero: see shaders/common/arith.wgsl
        words.extend_from_slice(params);
        words.push(x as u32);
        let mut all = vec![self.data(&words)];
        all.extend(binds);
        self.ops.push(Op::Dispatch { pipeline, binds: all, groups: (x as u32, y as u32) });
        Ok(())
    }

    /// Copies `size` bytes (a multiple of 4) between buffers, in order with the dispatches.
    pub fn copy(&mut self, src: &wgpu::Buffer, src_offset: u64, dst: &wgpu::Buffer, dst_offset: u64, size: u64) {
        if size > 0 {
            self.ops.push(Op::Copy { src: src.clone(), src_offset, dst: dst.clone(), dst_offset, size });
        }
    }

    /// Zeroes `size` bytes of `buffer` from `offset`.
    pub fn clear(&mut self, buffer: &wgpu::Buffer, offset: u64, size: u64) {
        if size > 0 {
            self.ops.push(Op::Clear { buffer: buffer.clone(), offset, size });
        }
    }

    /// Asks for `size` bytes of `buffer` from `offset` to be read back after the work so far.
    pub fn read(&mut self, buffer: &wgpu::Buffer, offset: u64, size: u64) -> ReadId {
        self.reads.push((buffer.clone(), offset, size));
        ReadId(self.reads.len() - 1)
    }

    /// Submits everything recorded and returns the bytes of each read, in order.
    pub async fn submit(self) -> Result<Vec<Vec<u8>>> {
        let ctx = self.ctx;
        let device = &ctx.device;
        let arena = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("colibri arena"),
            size: (self.data.len() as u64).max(16),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if !self.data.is_empty() {
            ctx.queue.write_buffer(&arena, 0, &self.data);
        }
        let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("colibri") });
        let mut pass: Option<wgpu::ComputePass<'static>> = None;
        for op in &self.ops {
            match op {
                Op::Dispatch { pipeline, binds, groups } => {
                    let entries: Vec<wgpu::BindGroupEntry> = binds
                        .iter()
                        .enumerate()
                        .map(|(i, b)| {
                            let (buffer, offset, size) = match b {
                                Bind::Buf(r) => (&r.buffer, r.offset, r.size),
                                Bind::Data { offset, size, .. } => (&arena, *offset, *size),
                            };
                            wgpu::BindGroupEntry {
                                binding: i as u32,
                                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                    buffer,
                                    offset,
                                    size: wgpu::BufferSize::new(size),
                                }),
                            }
                        })
                        .collect();
                    let bg = device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: None,
                        layout: &pipeline.layout,
                        entries: &entries,
                    });
                    let p = pass.get_or_insert_with(|| {
                        enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None })
                            .forget_lifetime()
                    });
                    p.set_pipeline(&pipeline.pipeline);
                    p.set_bind_group(0, &bg, &[]);
                    p.dispatch_workgroups(groups.0, groups.1, 1);
                }
                Op::Copy { src, src_offset, dst, dst_offset, size } => {
                    drop(pass.take());
                    enc.copy_buffer_to_buffer(src, *src_offset, dst, *dst_offset, *size);
                }
                Op::Clear { buffer, offset, size } => {
                    drop(pass.take());
                    enc.clear_buffer(buffer, *offset, Some(*size));
                }
            }
        }
        drop(pass.take());
        let mut staging = Vec::with_capacity(self.reads.len());
        for (buffer, offset, size) in &self.reads {
            let padded = size.div_ceil(4) * 4;
            let s = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("colibri readback"),
                size: padded.max(4),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            enc.copy_buffer_to_buffer(buffer, *offset, &s, 0, padded);
            staging.push((s, *size));
        }
        ctx.queue.submit([enc.finish()]);
        ctx.take_error()?;
        let mut out = Vec::with_capacity(staging.len());
        for (s, size) in staging {
            let done = Oneshot::default();
            let tx = done.clone();
            s.slice(..).map_async(wgpu::MapMode::Read, move |r| tx.send(r));
            ctx.poll_wait()?;
            done.await.map_err(|e| Error::Gpu(format!("reading back: {e}")))?;
            let bytes = s.slice(..).get_mapped_range().map_err(|e| Error::Gpu(format!("reading back: {e}")))?
                [..size as usize]
                .to_vec();
            s.unmap();
            out.push(bytes);
        }
        ctx.take_error()?;
        Ok(out)
    }
}

type MapResult = std::result::Result<(), wgpu::BufferAsyncError>;

/// The result of a map_async callback, as a future (no executor or channel crate needed).
#[derive(Clone, Default)]
struct Oneshot {
    state: Arc<Mutex<(Option<MapResult>, Option<Waker>)>>,
}

impl Oneshot {
    fn send(&self, r: MapResult) {
        if let Ok(mut s) = self.state.lock() {
            s.0 = Some(r);
            if let Some(w) = s.1.take() {
                w.wake();
            }
        }
    }
}

impl Future for Oneshot {
    type Output = MapResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Ok(mut s) = self.state.lock() else {
            return Poll::Ready(Err(wgpu::BufferAsyncError));
        };
        match s.0.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
