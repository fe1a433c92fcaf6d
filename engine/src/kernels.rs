//! CPU kernels: matrix products, RMSNorm, SwiGLU. Each output element is computed by one
//! call of [`math::dot`] in its fixed reduction order, so the result does not depend on
//! thread count, batch size or which rows run where: prefill and decode agree bit for bit.

use crate::math;
use crate::tensor::Mat;

/// Runs `f(chunk_index, chunk)` over `data.chunks_mut(chunk)`, on all cores when the
/// `parallel` feature is on.
pub fn for_each_chunk<F>(data: &mut [f32], chunk: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    for_each_chunk_if(true, data, chunk, f)
}

/// [`for_each_chunk`], in parallel only if `parallel` (small jobs cost more to hand out
/// to threads than to run). Results are the same either way.
pub fn for_each_chunk_if<F>(parallel: bool, data: &mut [f32], chunk: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    let chunk = chunk.max(1);
    #[cfg(feature = "parallel")]
    if parallel {
        use rayon::prelude::*;
        data.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
        return;
    }
    let _ = parallel;
    data.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
}

/// Multiply-adds below which a matrix product runs on the calling thread: handing work
/// to the pool costs microseconds, which small models' matrices do not repay.
const PARALLEL_MIN_MACS: usize = 1 << 16;

/// Number of threads the parallel kernels may use.
pub fn threads() -> usize {
    #[cfg(feature = "parallel")]
    {
        rayon::current_num_threads()
    }
    #[cfg(not(feature = "parallel"))]
    {
        1
    }
}

/// `out[p, r] = sum_c w[r, c] * x[p, c]` for `p < n`: x is `[n, w.cols]`, out `[n, w.rows]`.
/// Each weight row is decoded once and applied to all `n` positions.
pub fn matmul(w: &Mat, x: &[f32], n: usize, out: &mut [f32]) {
    let (rows, cols) = (w.rows, w.cols);
    debug_assert!(x.len() >= n * cols && out.len() >= n * rows);
    if n == 0 || rows == 0 {
        return;
    }
    // Rows per task: enough work per task to amortise scheduling, enough tasks to balance.
    let per_task = (rows / (threads() * 4)).max(1).min(256);
    let kernel = |block: usize, dst: &mut [f32], stride: usize| {
        let mut row = vec![0.0f32; cols];
        let first = block * per_task;
        for k in 0..dst.len() / stride {
            w.row_into(first + k, &mut row);
            for p in 0..n {
                dst[k * stride + p] = math::dot(&row, &x[p * cols..(p + 1) * cols]);
            }
        }
    };
    let parallel = rows * cols * n >= PARALLEL_MIN_MACS;
    if n == 1 {
        for_each_chunk_if(parallel, &mut out[..rows], per_task, |b, dst| kernel(b, dst, 1));
        return;
    }
    // Work in [rows, n] then transpose into [n, rows].
    let mut tmp = vec![0.0f32; rows * n];
    for_each_chunk_if(parallel, &mut tmp, per_task * n, |b, dst| kernel(b, dst, n));
    for r in 0..rows {
        for p in 0..n {
            out[p * rows + r] = tmp[r * n + p];
        }
    }
}

/// RMSNorm as transformers computes it: `w * (x * rsqrt(mean(x^2) + eps))`.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let inv = rms_scale(x, eps);
    for ((o, xi), wi) in out.iter_mut().zip(x).zip(w) {
        *o = wi * (xi * inv);
    }
}

/// In-place RMSNorm of every `w.len()`-sized chunk of `x`.
pub fn rmsnorm_chunks(x: &mut [f32], w: &[f32], eps: f32) {
    for c in x.chunks_exact_mut(w.len()) {
        let inv = rms_scale(c, eps);
        for (v, wi) in c.iter_mut().zip(w) {
            *v = wi * (*v * inv);
        }
    }
}

#[inline]
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mean = math::sum_sq(x) / x.len() as f32;
    1.0 / (mean + eps).sqrt()
}

/// SwiGLU feed-forward `down(silu(gate(x)) * up(x))` for `n` positions.
pub fn swiglu(gate: &Mat, up: &Mat, down: &Mat, x: &[f32], n: usize, out: &mut [f32]) {
    let inter = gate.rows;
    let mut g = vec![0.0f32; n * inter];
    let mut u = vec![0.0f32; n * inter];
    matmul(gate, x, n, &mut g);
    matmul(up, x, n, &mut u);
    for (gi, ui) in g.iter_mut().zip(&u) {
        *gi = math::silu(*gi) * ui;
    }
    matmul(down, &g, n, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn matmul_matches_naive_and_is_batch_invariant() {
        let mut s = 7u64;
        let (rows, cols, n) = (37, 29, 5);
        let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut s)).collect();
        let x: Vec<f32> = (0..n * cols).map(|_| lcg(&mut s)).collect();
        let m = Mat::from_f32(rows, cols, &w).unwrap();
        let mut out = vec![0.0; n * rows];
        matmul(&m, &x, n, &mut out);
        for p in 0..n {
            let mut single = vec![0.0; rows];
            matmul(&m, &x[p * cols..(p + 1) * cols], 1, &mut single);
            for r in 0..rows {
                assert_eq!(out[p * rows + r].to_bits(), single[r].to_bits());
                let naive: f64 = (0..cols).map(|c| w[r * cols + c] as f64 * x[p * cols + c] as f64).sum();
                assert!((out[p * rows + r] as f64 - naive).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn rmsnorm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5, 0.25];
        let w = [1.0f32, 0.5, 2.0, -1.0, 1.3];
        let mut out = [0.0; 5];
        rmsnorm(&x, &w, 1e-6, &mut out);
        let ms: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 5.0;
        for i in 0..5 {
            let want = w[i] as f64 * x[i] as f64 / (ms + 1e-6).sqrt();
            assert!((out[i] as f64 - want).abs() < 1e-6 * want.abs().max(1.0));
        }
        let mut y = [x, x].concat();
        rmsnorm_chunks(&mut y, &w, 1e-6);
        assert_eq!(&y[..5], &out);
        assert_eq!(&y[5..], &out);
        // All-zero input stays finite thanks to eps.
        let mut z = [0.0f32; 4];
        rmsnorm_chunks(&mut z, &[1.0; 4], 1e-5);
        assert!(z.iter().all(|v| *v == 0.0));
    }
}
