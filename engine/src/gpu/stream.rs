//! Dense weights streamed from the data file into GPU buffers, never whole in memory.
//!
//! A model loaded with [`Container::load_elsewhere`](crate::model::open::Container) keeps
//! placeholders ([`Bytes::elsewhere`]) for its weight matrices. [`Uploader`], which the GPU
//! model's upload code goes through, uploads weights in memory as they are and streams a
//! placeholder from a [`DenseStream`]: read in chunks of at most [`CHUNK`] bytes, each
//! written to its buffer (`queue.write_buffer`, which copies it out at once) and the chunk
//! reused for the next. Memory then holds one chunk, not the dense weights: what keeps
//! the browser's wasm heap (4 GiB at most, and it never shrinks) for activations, the KV
//! cache and the RAM expert tier.
//!
//! Every tensor is checked against its manifest checksum as it streams by (xxh3 over its
//! bytes in order); [`DenseStream::finish`] reads the rest of any tensor that was read
//! only in part or out of order, so nothing unchecked is used.

use std::cell::{Cell, RefCell};

use xxhash_rust::xxh3::Xxh3;

use super::buffers::{mat_layout, upload_f32, upload_mat, weight_buffer, write_padded, GpuMat, MatPart};
use super::pool::GpuExpert;
use super::recorder::BufRange;
use super::GpuContext;
use crate::error::{Error, Result};
use crate::experts::Expert;
use crate::format::manifest::{DenseTensor, Manifest};
use crate::format::{verify_sum, ReadAt};
use crate::tensor::{Bytes, Mat};

/// Largest read (and the memory it takes): 8 MiB.
pub const CHUNK: usize = 8 << 20;

/// One dense tensor's checksum in progress.
struct Check<'m> {
    t: &'m DenseTensor,
    hasher: Xxh3,
    /// File offset of the next byte the hash needs.
    next: u64,
    /// Some bytes of it were read (so it must be checked before the model is used).
    touched: bool,
    done: bool,
}

/// Reads placeholders' bytes from a model's data file in bounded chunks, checking every
/// dense tensor against its checksum on the way.
pub struct DenseStream<'a> {
    read: ReadAt<'a>,
    origin: String,
    /// The manifest's dense tensors by file offset.
    checks: RefCell<Vec<Check<'a>>>,
    buf: RefCell<Vec<u8>>,
    chunk: usize,
    read_bytes: Cell<u64>,
    largest_read: Cell<usize>,
    on_read: Option<&'a dyn Fn(u64)>,
}

impl<'a> DenseStream<'a> {
    /// A stream over the data file of `m`, read with `read`; `origin` names it in errors.
    pub fn new(m: &'a Manifest, read: ReadAt<'a>, origin: &str) -> Self {
        let mut checks: Vec<Check> = m
            .dense
            .tensors
            .iter()
            .map(|t| Check { t, hasher: Xxh3::new(), next: t.offset, touched: false, done: false })
            .collect();
        checks.sort_by_key(|c| c.t.offset);
        DenseStream {
            read,
            origin: origin.to_string(),
            checks: RefCell::new(checks),
            buf: RefCell::new(Vec::new()),
            chunk: CHUNK,
            read_bytes: Cell::new(0),
            largest_read: Cell::new(0),
            on_read: None,
        }
    }

    /// Reads at most `bytes` at a time (rounded down to a multiple of 4, at least 4).
    pub fn with_chunk(mut self, bytes: usize) -> Self {
        self.chunk = (bytes / 4 * 4).max(4);
        self
    }

    /// Calls `f(bytes read so far)` after every read (progress).
    pub fn on_read(mut self, f: &'a dyn Fn(u64)) -> Self {
        self.on_read = Some(f);
        self
    }

    /// Bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.read_bytes.get()
    }

    /// The largest single read so far: the memory streaming took.
    pub fn largest_read(&self) -> usize {
        self.largest_read.get()
    }

    /// Reads the `len` bytes at file offset `at` chunk by chunk, handing each to
    /// `sink(offset from at, bytes)`.
    fn stream(&self, at: u64, len: u64, sink: &mut dyn FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        let mut buf = self.buf.borrow_mut();
        let want = (self.chunk as u64).min(len) as usize;
        if buf.len() < want {
            buf.resize(want, 0);
        }
        let mut off = 0;
        while off < len {
            let n = (len - off).min(self.chunk as u64) as usize;
            let chunk = &mut buf[..n];
            (self.read)(at + off, chunk)?;
            self.feed(at + off, chunk)?;
            self.read_bytes.set(self.read_bytes.get() + n as u64);
            self.largest_read.set(self.largest_read.get().max(n));
            if let Some(f) = self.on_read {
                f(self.read_bytes.get());
            }
            sink(off, chunk)?;
            off += n as u64;
        }
        Ok(())
    }

    /// Hashes `bytes` (read at file offset `at`, inside one dense tensor) into their
    /// tensor's checksum if they are its next bytes; checks it when complete.
    fn feed(&self, at: u64, bytes: &[u8]) -> Result<()> {
        let mut checks = self.checks.borrow_mut();
        let i = checks.partition_point(|c| c.t.offset <= at);
        let c = match i.checked_sub(1).map(|i| &mut checks[i]) {
            Some(c) if at + bytes.len() as u64 <= c.t.offset + c.t.length => c,
            _ => {
                return Err(Error::Invalid(format!(
                    "{}: bytes {at}..{} are not inside one dense tensor",
                    self.origin,
                    at + bytes.len() as u64
                )))
            }
        };
        c.touched = true;
        if c.done || at != c.next {
            return Ok(());
        }
        c.hasher.update(bytes);
        c.next += bytes.len() as u64;
        if c.next == c.t.offset + c.t.length {
            c.done = true;
            verify_sum(c.t, c.hasher.digest(), &self.origin)?;
        }
        Ok(())
    }

    /// Checks every tensor that was read in part or out of order, reading the rest of it.
    /// Call it once the upload is done: a failed checksum is an error here.
    pub fn finish(&self) -> Result<()> {
        let todo: Vec<(u64, u64)> = self
            .checks
            .borrow()
            .iter()
            .filter(|c| c.touched && !c.done)
            .map(|c| (c.next, c.t.offset + c.t.length - c.next))
            .collect();
        for (at, len) in todo {
            self.stream(at, len, &mut |_, _| Ok(()))?;
        }
        Ok(())
    }
}

/// Uploads weights for the GPU model: from memory, or streamed from a [`DenseStream`]
/// where they are placeholders. Counts the bytes it puts on the GPU.
pub struct Uploader<'a, 's> {
    pub ctx: &'a GpuContext,
    stream: Option<&'a DenseStream<'s>>,
    bytes: Cell<u64>,
}

impl<'a, 's> Uploader<'a, 's> {
    pub fn new(ctx: &'a GpuContext, stream: Option<&'a DenseStream<'s>>) -> Self {
        Uploader { ctx, stream, bytes: Cell::new(0) }
    }

    /// GPU bytes of everything uploaded so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.get()
    }

    fn stream(&self, label: &str) -> Result<&'a DenseStream<'s>> {
        self.stream.ok_or_else(|| Error::Gpu(format!("{label}: its bytes are not in memory and no source was given")))
    }

    /// A matrix in its stored dtype, in row blocks that fit one binding each.
    pub fn mat(&self, label: &str, m: &Mat) -> Result<GpuMat> {
        let g = match m.bytes.file_offset() {
            None => upload_mat(self.ctx, label, m)?,
            Some(at) => self.stream_mat(label, m, at)?,
        };
        self.bytes.set(self.bytes.get() + g.byte_len());
        Ok(g)
    }

    /// An f32 vector (norm weights, biases: always in memory).
    pub fn f32(&self, label: &str, v: &[f32]) -> Result<wgpu::Buffer> {
        let b = upload_f32(self.ctx, label, v)?;
        self.bytes.set(self.bytes.get() + b.size());
        Ok(b)
    }

    pub fn opt_f32(&self, label: &str, v: &Option<Vec<f32>>) -> Result<Option<wgpu::Buffer>> {
        v.as_ref().map(|v| self.f32(label, v)).transpose()
    }

    /// A dense MLP or shared expert.
    pub fn expert(&self, label: &str, e: &Expert) -> Result<GpuExpert> {
        Ok(GpuExpert {
            gate: self.mat(&format!("{label}.gate"), &e.gate)?,
            up: self.mat(&format!("{label}.up"), &e.up)?,
            down: self.mat(&format!("{label}.down"), &e.down)?,
        })
    }

    /// `m` with its bytes in memory, for uploads that reorder its rows first: `m` itself,
    /// or a placeholder's bytes read whole.
    pub fn in_memory(&self, m: &Mat) -> Result<Mat> {
        let Some(at) = m.bytes.file_offset() else { return Ok(m.clone()) };
        let mut out = Vec::new();
        out.try_reserve_exact(m.bytes.len())
            .map_err(|_| Error::Gpu(format!("cannot allocate {} bytes for a weight matrix", m.bytes.len())))?;
        self.stream("a weight matrix")?.stream(at, m.bytes.len() as u64, &mut |_, b| {
            out.extend_from_slice(b);
            Ok(())
        })?;
        Mat::new(m.rows, m.cols, m.dtype, Bytes::from_vec(out))
    }

    /// [`Uploader::mat`] of a placeholder whose bytes start at file offset `at`.
    fn stream_mat(&self, label: &str, m: &Mat, at: u64) -> Result<GpuMat> {
        let s = self.stream(label)?;
        let (row_bytes, row_words, per) = mat_layout(self.ctx, label, m)?;
        let mut parts = Vec::new();
        let mut row0 = 0;
        while row0 < m.rows {
            let rows = per.min(m.rows - row0);
            let len = (rows * row_bytes) as u64;
            let buffer = weight_buffer(self.ctx, label, len)?;
            s.stream(at + (row0 * row_bytes) as u64, len, &mut |off, bytes| {
                write_padded(self.ctx, &buffer, off, bytes);
                // Natively wgpu stages each write until a submit: hand them over now.
                #[cfg(not(target_arch = "wasm32"))]
                self.ctx.queue.submit([]);
                Ok(())
            })?;
            parts.push(MatPart { row0, rows, range: BufRange::whole(&buffer) });
            row0 += rows;
        }
        Ok(GpuMat { rows: m.rows, cols: m.cols, dtype: m.dtype, row_words, parts })
    }
}
