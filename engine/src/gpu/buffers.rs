//! Weights in GPU buffers. A matrix keeps its stored bytes (f32, bf16, f16, int8/int4
//! with f16 group scales, MXFP4, or FP8 with f32 block scales) and the kernels decode them exactly; a matrix larger than
//! one storage binding (or one buffer) is split into row blocks, each its own buffer.

use super::recorder::BufRange;
use super::GpuContext;
use crate::error::{Error, Result};
use crate::tensor::{DType, Mat};

/// One row block `[row0, row0 + rows)` of a matrix, in its own buffer.
#[derive(Clone, Debug)]
pub struct MatPart {
    pub row0: usize,
    pub rows: usize,
    pub range: BufRange,
}

/// A `[rows, cols]` weight matrix on the GPU.
#[derive(Clone, Debug)]
pub struct GpuMat {
    pub rows: usize,
    pub cols: usize,
    pub dtype: DType,
    /// u32 words per stored row (used by the integer types, whose rows are 4-byte aligned).
    pub row_words: u32,
    pub parts: Vec<MatPart>,
}

impl GpuMat {
    pub fn byte_len(&self) -> u64 {
        self.parts.iter().map(|p| p.range.size).sum()
    }
}

/// Largest number of rows of `row_bytes` each that one block may hold.
fn rows_per_block(ctx: &GpuContext, row_bytes: usize, rows: usize) -> Result<usize> {
    let limit = ctx.max_binding();
    if row_bytes as u64 > limit {
        return Err(Error::Gpu(format!(
            "one weight row of {row_bytes} bytes exceeds the storage binding limit of {limit} bytes"
        )));
    }
    let per = ((limit / row_bytes.max(1) as u64) as usize).max(1);
    Ok(per.min(rows.max(1)))
}

/// A new weight buffer of at least `bytes` (padded to 4 bytes, as copies require), empty.
pub fn weight_buffer(ctx: &GpuContext, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
    let size = bytes.max(4).div_ceil(4) * 4;
    if size > ctx.limits.max_buffer_size {
        return Err(Error::Gpu(format!(
            "{label}: {size} bytes exceed the buffer size limit of {}",
            ctx.limits.max_buffer_size
        )));
    }
    Ok(ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    }))
}

/// Writes `bytes` at `offset` (a multiple of 4) of `buffer`: the whole words as they are,
/// a last partial word padded with zeros (buffers are padded to 4 bytes).
pub fn write_padded(ctx: &GpuContext, buffer: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
    let whole = bytes.len() / 4 * 4;
    if whole > 0 {
        ctx.queue.write_buffer(buffer, offset, &bytes[..whole]);
    }
    if whole < bytes.len() {
        let mut tail = [0u8; 4];
        tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
        ctx.queue.write_buffer(buffer, offset + whole as u64, &tail);
    }
}

/// Copies bytes into a new storage buffer (padded to 4 bytes, as copies require).
pub fn upload_bytes(ctx: &GpuContext, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer> {
    let buffer = weight_buffer(ctx, label, bytes.len() as u64)?;
    write_padded(ctx, &buffer, 0, bytes);
    Ok(buffer)
}

/// How a matrix is laid out on the GPU: (bytes per row, u32 words per row for the integer
/// types, rows per block of one binding).
pub fn mat_layout(ctx: &GpuContext, label: &str, m: &Mat) -> Result<(usize, u32, usize)> {
    if matches!(m.dtype, DType::U8 | DType::F8E4M3) {
        return Err(Error::Gpu(format!("{label}: {} weights have no GPU kernels; use the CPU backend", m.dtype)));
    }
    let row_bytes = m.row_bytes();
    let row_words =
        if m.dtype.is_quantized() || matches!(m.dtype, DType::Mxfp4 | DType::Fp8 { .. } | DType::Q4K | DType::Q5K) {
            if !row_bytes.is_multiple_of(4) {
                return Err(Error::Gpu(format!("{label}: quantized rows of {row_bytes} bytes are not 4-byte aligned")));
            }
            (row_bytes / 4) as u32
        } else {
            0
        };
    Ok((row_bytes, row_words, rows_per_block(ctx, row_bytes, m.rows)?))
}

/// Uploads a matrix in its stored dtype, in row blocks that fit one binding each. Its
/// bytes must be in memory (a placeholder is streamed by `stream::Uploader`).
pub fn upload_mat(ctx: &GpuContext, label: &str, m: &Mat) -> Result<GpuMat> {
    if m.bytes.is_elsewhere() {
        return Err(Error::Gpu(format!("{label}: its bytes are not in memory (stream them with gpu::stream)")));
    }
    let (row_bytes, row_words, per) = mat_layout(ctx, label, m)?;
    let bytes = m.bytes.as_ref();
    let mut parts = Vec::new();
    let mut row0 = 0;
    while row0 < m.rows {
        let rows = per.min(m.rows - row0);
        let buffer = upload_bytes(ctx, label, &bytes[row0 * row_bytes..(row0 + rows) * row_bytes])?;
        parts.push(MatPart { row0, rows, range: BufRange::whole(&buffer) });
        row0 += rows;
    }
    Ok(GpuMat { rows: m.rows, cols: m.cols, dtype: m.dtype, row_words, parts })
}

/// Uploads an f32 vector (norm weights, biases).
pub fn upload_f32(ctx: &GpuContext, label: &str, v: &[f32]) -> Result<wgpu::Buffer> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    upload_bytes(ctx, label, &bytes)
}

/// Reads little-endian f32s from bytes.
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
