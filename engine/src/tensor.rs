//! Weight matrices that live in someone else's bytes (a memory-mapped shard, a fetched
//! buffer) and decode rows to f32 on demand, so a checkpoint is never copied whole.

use std::sync::Arc;

use half::{bf16, f16};

use crate::error::{Error, Result};

/// Element type of stored weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    BF16,
    F16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// Parses a safetensors dtype string ("F32", "BF16", "F16").
    pub fn from_safetensors(s: &str) -> Option<Self> {
        match s {
            "F32" => Some(DType::F32),
            "BF16" => Some(DType::BF16),
            "F16" => Some(DType::F16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        }
    }
}

/// A cheap, shareable view into bytes owned elsewhere (an mmap or a Vec).
#[derive(Clone)]
pub struct Bytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.len)
    }
}

impl Bytes {
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        let len = (*owner).as_ref().len();
        Bytes { owner, start: 0, len }
    }

    pub fn from_vec(v: Vec<u8>) -> Self {
        Bytes::new(Arc::new(v))
    }

    /// A sub-range; errors if it runs past the end.
    pub fn slice(&self, start: usize, len: usize) -> Result<Bytes> {
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(Bytes { owner: self.owner.clone(), start: self.start + start, len }),
            _ => Err(Error::Invalid(format!(
                "byte range {start}+{len} is outside a buffer of {} bytes",
                self.len
            ))),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
}

/// Decode little-endian elements of `dtype` into f32 (exact for all three types).
pub fn decode_into(dtype: DType, src: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
    }
}

/// A row-major `[rows, cols]` weight matrix (PyTorch `nn.Linear.weight` layout:
/// one row per output feature).
#[derive(Clone, Debug)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub dtype: DType,
    pub bytes: Bytes,
}

impl Mat {
    pub fn new(rows: usize, cols: usize, dtype: DType, bytes: Bytes) -> Result<Self> {
        let want = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| Error::Invalid("matrix size overflows".into()))?;
        if bytes.len() != want {
            return Err(Error::Invalid(format!(
                "matrix [{rows}, {cols}] of {} needs {want} bytes, got {}",
                dtype.name(),
                bytes.len()
            )));
        }
        Ok(Mat { rows, cols, dtype, bytes })
    }

    /// An f32 matrix owning its data (tests, derived weights).
    pub fn from_f32(rows: usize, cols: usize, data: &[f32]) -> Result<Self> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        Mat::new(rows, cols, DType::F32, Bytes::from_vec(bytes))
    }

    /// Rows `start..start+n` as their own matrix (no copy).
    pub fn row_block(&self, start: usize, n: usize) -> Result<Mat> {
        let rb = self.cols * self.dtype.size();
        Mat::new(n, self.cols, self.dtype, self.bytes.slice(start * rb, n * rb)?)
    }

    /// Decode row `r` into `out[..cols]`. `r` must be < rows (checked by callers'
    /// shapes, validated at load time).
    #[inline]
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let rb = self.cols * self.dtype.size();
        let src = &self.bytes.as_ref()[r * rb..(r + 1) * rb];
        decode_into(self.dtype, src, &mut out[..self.cols]);
    }

    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        decode_into(self.dtype, self.bytes.as_ref(), &mut out);
        out
    }

    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_all_dtypes_exactly() {
        let vals = [1.5f32, -2.25, 0.0, 65504.0];
        let f32b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bf: Vec<u8> = vals.iter().flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes()).collect();
        let hf: Vec<u8> = vals.iter().flat_map(|v| f16::from_f32(*v).to_bits().to_le_bytes()).collect();
        for (dt, b) in [(DType::F32, f32b), (DType::BF16, bf), (DType::F16, hf)] {
            let m = Mat::new(2, 2, dt, Bytes::from_vec(b)).unwrap();
            assert_eq!(m.to_f32(), vals.iter().map(|v| if dt == DType::BF16 { bf16::from_f32(*v).to_f32() } else { *v }).collect::<Vec<_>>());
            let mut row = [0.0; 2];
            m.row_into(1, &mut row);
            assert_eq!(row[0], 0.0);
        }
    }

    #[test]
    fn wrong_size_and_out_of_range_slices_are_errors() {
        assert!(Mat::new(2, 3, DType::F32, Bytes::from_vec(vec![0; 20])).is_err());
        let b = Bytes::from_vec(vec![0; 8]);
        assert!(b.slice(4, 5).is_err());
        assert!(b.slice(usize::MAX, 2).is_err());
        assert_eq!(b.slice(2, 6).unwrap().len(), 6);
    }
}
