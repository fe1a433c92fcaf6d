//! Throughput of every stored weight format's matrix kernel, next to the machine's memory
//! read bandwidth (`coli bench-kernels`, and the format-ratio guard of tools/test.sh).
//!
//! A format is timed through [`super::matmul`], the path the model takes, over a working
//! set of matrices of one shape, cycled so that the bytes come from where a model's would
//! (memory, once the set is larger than the caches). The figure is bytes of stored weights
//! read per second: one position (decode) is a memory-bound pass over the weights, many
//! positions (prefill) show how far the kernel is from that bound when it computes more.

use std::time::Instant;

use half::{bf16, f16};

use crate::error::Result;
use crate::tensor::{Bytes, DType, Mat};

/// One stored format a model can hold: the dtype and how users end up with it.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    pub dtype: DType,
    /// Where this format comes from (which command or file gives it).
    pub source: &'static str,
}

/// Every format the engine's matrix kernel reads: what `coli convert` writes (int4/int8
/// with the default group 32 and the other common groups), what a GGUF import keeps (Q4_0
/// and Q8_0 become int4/int8 with group 32, MXFP4 stays), and the float weights of a
/// Hugging Face directory read directly (f32, bf16, f16, block-scaled FP8).
pub fn formats() -> Vec<Format> {
    let f = |dtype, source| Format { dtype, source };
    vec![
        f(DType::Int4 { group: 32 }, "coli convert default experts; GGUF Q4_0"),
        f(DType::Q4K, "GGUF Q4_K (Q4_K_M, Q4_K_S files) as coli convert keeps it"),
        f(DType::Q5K, "GGUF Q5_K (Q5_K_M, Q5_K_S files) as coli convert keeps it"),
        f(DType::Int8 { group: 32 }, "coli convert default attention/dense/lm-head; GGUF Q8_0"),
        f(DType::Int4 { group: 64 }, "coli convert --group-size 64"),
        f(DType::Int8 { group: 64 }, "coli convert --group-size 64 (int8 parts)"),
        f(DType::Int4 { group: 128 }, "coli convert --group-size 128"),
        f(DType::Int8 { group: 128 }, "coli convert --group-size 128 (int8 parts)"),
        f(DType::Mxfp4, "gpt-oss experts; GGUF MXFP4"),
        f(DType::Fp8 { block: 128 }, "HF FP8 directory (DeepSeek-V3/R1, Kimi-K2, GLM-5; coli convert keeps it)"),
        f(DType::BF16, "HF directory (bf16 checkpoints)"),
        f(DType::F16, "HF directory (f16 checkpoints)"),
        f(DType::F32, "HF directory (f32 checkpoints)"),
    ]
}

/// A deterministic pseudo-random generator (no dependency; the values only need to look
/// like weights: no NaN, no subnormal scale).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() % 65536) as f32 / 32768.0 - 1.0
    }
}

/// A [rows, cols] matrix of `dtype` with pseudo-random weights of ordinary size.
pub fn matrix(dtype: DType, rows: usize, cols: usize, seed: u64) -> Result<Mat> {
    let mut bytes = vec![0u8; row_bytes(dtype, cols)? * rows];
    fill(dtype, cols, seed, &mut bytes);
    Mat::new(rows, cols, dtype, Bytes::from_vec(bytes))
}

fn row_bytes(dtype: DType, cols: usize) -> Result<usize> {
    dtype.row_bytes(cols).ok_or_else(|| crate::error::Error::Invalid(format!("{dtype}: bad shape [.., {cols}]")))
}

/// Fills `bytes` (zeroed, whole rows of `cols` values of `dtype`) with pseudo-random
/// weights of ordinary size.
fn fill(dtype: DType, cols: usize, seed: u64, bytes: &mut [u8]) {
    let rb = dtype.row_bytes(cols).unwrap_or(1);
    let mut g = Lcg(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    for row in bytes.chunks_exact_mut(rb.max(1)) {
        match dtype {
            DType::F32 => row.chunks_exact_mut(4).for_each(|c| c.copy_from_slice(&(g.unit() * 0.05).to_le_bytes())),
            DType::BF16 => row
                .chunks_exact_mut(2)
                .for_each(|c| c.copy_from_slice(&bf16::from_f32(g.unit() * 0.05).to_bits().to_le_bytes())),
            DType::F16 => row
                .chunks_exact_mut(2)
                .for_each(|c| c.copy_from_slice(&f16::from_f32(g.unit() * 0.05).to_bits().to_le_bytes())),
            DType::Int8 { group } | DType::Int4 { group } => {
                let blocks = cols.div_ceil(group as usize);
                let (scales, vals) = row.split_at_mut(blocks.div_ceil(2) * 4);
                for s in scales.chunks_exact_mut(2).take(blocks) {
                    s.copy_from_slice(&f16::from_f32(0.002 + 0.001 * (g.next() % 8) as f32).to_bits().to_le_bytes());
                }
                vals.iter_mut().for_each(|v| *v = g.next() as u8);
            }
            DType::Mxfp4 => {
                let blocks = cols / crate::tensor::MXFP4_BLOCK;
                let (scales, vals) = row.split_at_mut(blocks.div_ceil(4) * 4);
                scales.iter_mut().take(blocks).for_each(|s| *s = 118 + (g.next() % 6) as u8);
                vals.iter_mut().for_each(|v| *v = g.next() as u8);
            }
            DType::Fp8 { block } => {
                let blocks = cols.div_ceil(block as usize);
                let (scales, vals) = row.split_at_mut(blocks * 4);
                for s in scales.chunks_exact_mut(4) {
                    s.copy_from_slice(&(0.0001 + 0.00002 * (g.next() % 8) as f32).to_le_bytes());
                }
                // Any byte but the two NaNs (0x7f, 0xff); the row's padding stays zero.
                for v in vals.iter_mut().take(cols) {
                    let b = g.next() as u8;
                    *v = if b & 0x7f == 0x7f { b ^ 1 } else { b };
                }
            }
            DType::Q4K | DType::Q5K => {
                let runs = cols / crate::tensor::Q4K_BLOCK;
                let (heads, vals) = row.split_at_mut(runs * 16);
                for h in heads.chunks_exact_mut(16) {
                    h[0..2].copy_from_slice(
                        &f16::from_f32(0.0002 + 0.0001 * (g.next() % 4) as f32).to_bits().to_le_bytes(),
                    );
                    h[2..4].copy_from_slice(
                        &f16::from_f32(0.0001 + 0.0001 * (g.next() % 4) as f32).to_bits().to_le_bytes(),
                    );
                    h[4..].iter_mut().for_each(|v| *v = g.next() as u8);
                }
                vals.iter_mut().for_each(|v| *v = g.next() as u8);
            }
            DType::U8 | DType::F8E4M3 => row.iter_mut().for_each(|v| *v = g.next() as u8),
        }
    }
}

/// Enough [rows, cols] matrices of `dtype` to hold about `bytes` stored bytes (at least one).
/// They lie one after another in one buffer of the kind a model's weights get (natively
/// crate::hugemem's, as the dense region and the expert cache have), so that their reads
/// meet the same pages.
pub fn working_set(dtype: DType, rows: usize, cols: usize, bytes: usize) -> Result<Vec<Mat>> {
    let one = row_bytes(dtype, cols)?.max(1) * rows;
    let count = bytes.div_ceil(one).max(1);
    let all = weight_memory(one * count, |buf| {
        for (i, m) in buf.chunks_exact_mut(one).enumerate() {
            fill(dtype, cols, i as u64 + 1, m);
        }
    })?;
    (0..count).map(|i| Mat::new(rows, cols, dtype, all.slice(i * one, one)?)).collect()
}

/// `len` zero bytes in weight memory, filled by `f`.
pub fn weight_memory(len: usize, f: impl FnOnce(&mut [u8])) -> Result<Bytes> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let mut buf = crate::hugemem::WeightBuf::zeroed(len)?;
        f(buf.as_mut_slice());
        Ok(Bytes::new(std::sync::Arc::new(buf)))
    }
    #[cfg(target_arch = "wasm32")]
    {
        let mut buf = vec![0u8; len];
        f(&mut buf);
        Ok(Bytes::from_vec(buf))
    }
}

/// One measurement: stored bytes read per second and multiply-adds per second.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    pub bytes_per_s: f64,
    pub macs_per_s: f64,
}

/// Which clock [`kernel_rate`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// Elapsed time: what a user waits for (every thread of the pool counts).
    Wall,
    /// CPU time of the calling thread (Linux and other unix; elsewhere elapsed time): for
    /// one thread on a busy machine, the time the kernel itself ran, not the time other
    /// processes had the core.
    Thread,
}

/// Seconds on `clock`.
fn now(clock: Clock, t0: Instant) -> f64 {
    #[cfg(unix)]
    if clock == Clock::Thread {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec, which `ts` is.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
        }
    }
    let _ = clock;
    t0.elapsed().as_secs_f64()
}

/// Times [`super::matmul`] of `n` positions over every matrix of `mats` in turn (one warm-up
/// pass first), repeating passes until `min_secs` have gone by on `clock`, on the current
/// thread pool.
pub fn kernel_rate(mats: &[Mat], n: usize, min_secs: f64, clock: Clock) -> Rate {
    let Some(first) = mats.first() else { return Rate { bytes_per_s: 0.0, macs_per_s: 0.0 } };
    let (rows, cols) = (first.rows, first.cols);
    let mut g = Lcg(7);
    let x: Vec<f32> = (0..n * cols).map(|_| g.unit()).collect();
    let mut out = vec![0.0f32; n * rows];
    let pass_bytes: usize = mats.iter().map(|m| m.byte_len()).sum();
    let pass_macs: usize = mats.iter().map(|m| m.rows * m.cols * n).sum();
    let pass = |out: &mut [f32]| {
        for m in mats {
            super::matmul(m, &x, n, out);
        }
    };
    pass(&mut out);
    let wall = Instant::now();
    let (t0, mut passes) = (now(clock, wall), 0usize);
    loop {
        pass(&mut out);
        passes += 1;
        let secs = now(clock, wall) - t0;
        if secs >= min_secs {
            std::hint::black_box(&out);
            return Rate {
                bytes_per_s: (pass_bytes * passes) as f64 / secs,
                macs_per_s: (pass_macs * passes) as f64 / secs,
            };
        }
    }
}

/// Memory read bandwidth in bytes per second: `bytes` summed as u64 words by every thread
/// of the current pool (a share each), passes repeated until `min_secs` have gone by.
pub fn read_rate(bytes: &[u8], min_secs: f64) -> f64 {
    // SAFETY: every bit pattern is a valid u64; align_to keeps the words inside `bytes`.
    let (_, buf, _) = unsafe { bytes.align_to::<u64>() };
    let threads = super::threads().max(1);
    let part = buf.len().div_ceil(threads).max(1);
    let sum = |c: &[u64]| c.iter().fold(0u64, |a, &b| a.wrapping_add(b));
    let pass = || -> u64 {
        #[cfg(feature = "parallel")]
        if threads > 1 {
            use rayon::prelude::*;
            return buf.par_chunks(part).map(sum).reduce(|| 0, u64::wrapping_add);
        }
        buf.chunks(part).map(sum).fold(0, u64::wrapping_add)
    };
    std::hint::black_box(pass());
    let (t0, mut passes) = (Instant::now(), 0usize);
    loop {
        std::hint::black_box(pass());
        passes += 1;
        let secs = t0.elapsed().as_secs_f64();
        if secs >= min_secs {
            return (std::mem::size_of_val(buf) * passes) as f64 / secs;
        }
    }
}
