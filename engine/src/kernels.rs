//! CPU kernels: matrix products, RMSNorm, SwiGLU. Each output element is computed by one
//! call of [`math::dot`] in its fixed reduction order, so the result does not depend on
//! thread count, batch size or which rows run where: prefill and decode agree bit for bit.

use std::cell::RefCell;

pub mod bench;
#[cfg(target_arch = "x86_64")]
mod float_x86;
#[cfg(any(target_arch = "aarch64", all(target_arch = "wasm32", target_feature = "simd128")))]
mod fp8_four;
#[cfg(target_arch = "aarch64")]
mod fp8_neon;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod fp8_wasm;
#[cfg(target_arch = "x86_64")]
mod fp8_x86;
#[cfg(target_arch = "x86_64")]
mod rows_x86;

use crate::math;
#[cfg(feature = "parallel")]
use crate::par::joined;
pub use crate::par::threads;
use crate::par::OutPtr;
use crate::qdot::mxfp4::ActQ16;
use crate::qdot::{self, ActQ, Simd};
use crate::tensor::{DType, Mat};

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
    // One thread: no hand-off to the pool (its one worker would run it while this thread
    // sleeps: two context switches for nothing).
    #[cfg(feature = "parallel")]
    if parallel && threads() > 1 {
        let (len, base) = (data.len(), OutPtr(data.as_mut_ptr()));
        if joined(len.div_ceil(chunk), &|i| {
            // SAFETY: chunk i is data[i * chunk..] (the last one shorter), disjoint from
            // every other task's, and `data` is borrowed mutably until the region ends.
            f(i, unsafe { base.slice(i * chunk, chunk.min(len - i * chunk)) })
        }) {
            return;
        }
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

/// One product of a batch handed to [`matmul_many`]: `out[p, r] = sum_c w[r, c] * x[p, c]`.
pub struct MatJob<'a> {
    pub w: &'a Mat,
    /// [n, w.cols]
    pub x: &'a [f32],
    pub n: usize,
    /// [n, w.rows]
    pub out: &'a mut [f32],
}

/// `out[p, r] = sum_c w[r, c] * x[p, c]` for `p < n`: x is `[n, w.cols]`, out `[n, w.rows]`.
///
/// Float weights (f32, bf16, f16): each row is decoded once and [`math::dot`] applies it
/// to every position. Integer weights (int8, int4): the positions are quantized once and
/// every output is one [`qdot::dot_row`] (integer sums in the order of docs/kernels.md).
/// MXFP4 weights: the positions are quantized to int16 in two parts once and every output
/// is one [`qdot::mxfp4::dot_row`].
/// Either way an output depends only on its row and its position: not on thread count,
/// batch size, SIMD path or which rows run where.
pub fn matmul(w: &Mat, x: &[f32], n: usize, out: &mut [f32]) {
    matmul_many(&mut [MatJob { w, x, n, out }]);
}

thread_local! {
    /// Quantized activations, reused from call to call (no allocation on the hot path).
    static ACTS: RefCell<Vec<ActQ>> = const { RefCell::new(Vec::new()) };
    /// One decoded float row per thread (integer weights: [OUT_ROWS, n] outputs).
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// One integer row made ready for many positions (qdot::dot_row_many), per thread.
    static PREP: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Activations quantized to int16 for MXFP4 weights (qdot::mxfp4).
    static ACTS16: RefCell<Vec<ActQ16>> = const { RefCell::new(Vec::new()) };
}

/// Several independent products in one parallel region (one hand-off to the thread pool
/// instead of one per matrix): rows of all jobs are cut into tasks of similar cost. Jobs
/// that read the same `x` with the same quantization share one quantized copy of it.
pub fn matmul_many(jobs: &mut [MatJob]) {
    let simd = Simd::active();
    let mut acts = ACTS.with(|a| std::mem::take(&mut *a.borrow_mut()));
    let mut keys: Vec<(usize, usize, usize, usize, bool, bool, bool)> = Vec::new();
    let mut act_of = vec![usize::MAX; jobs.len()];
    let mut acts16 = ACTS16.with(|a| std::mem::take(&mut *a.borrow_mut()));
    let mut keys16: Vec<(usize, usize, usize)> = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        let (n, cols) = (job.n, job.w.cols);
        assert!(job.x.len() >= n * cols && job.out.len() >= n * job.w.rows, "matmul shapes");
        if job.w.dtype == DType::Mxfp4 {
            // MXFP4 weights take int16 activations (qdot::mxfp4), one copy per distinct x.
            let key = (job.x.as_ptr() as usize, n, cols);
            act_of[j] = match keys16.iter().position(|k| *k == key) {
                Some(k) => k,
                None => {
                    if acts16.len() <= keys16.len() {
                        acts16.push(ActQ16::default());
                    }
                    acts16[keys16.len()].quantize(&job.x[..n * cols], n, cols);
                    keys16.push(key);
                    keys16.len() - 1
                }
            };
            continue;
        }
        // Q4K rows are int4 rows of group 32 under Q4_K headers (qdot's `ActQ::k4`); Q5K
        // rows add fifth bits (`ActQ::k5`).
        let k5 = job.w.dtype == DType::Q5K;
        let k4 = k5 || job.w.dtype == DType::Q4K;
        let Some(group) = (if k4 { Some(32) } else { job.w.dtype.group() }) else { continue };
        let (group, int4) = (group as usize, k4 || matches!(job.w.dtype, DType::Int4 { .. }));
        let split = ActQ::wants_split(int4, group);
        let key = (job.x.as_ptr() as usize, n, cols, group, split, k4, k5);
        if let Some(k) = keys.iter().position(|k| *k == key) {
            act_of[j] = k;
            continue;
        }
        if acts.len() <= keys.len() {
            acts.push(ActQ::default());
        }
        acts[keys.len()].quantize(&job.x[..n * cols], n, cols, group, split);
        if k5 {
            acts[keys.len()].set_k5();
        } else if k4 {
            acts[keys.len()].set_k4();
        }
        // Q4K and Q5K rows are prepared only in wasm and on NEON (qdot::prepares_k4); on x86
        // every count of positions takes the one-position layouts, which the few-position
        // kernels read too.
        if n >= qdot::prepare_min(simd) && (!k4 || qdot::prepares_k4(simd)) {
            acts[keys.len()].interleave();
        } else if int4 && simd.quads() && ActQ::quad_group(group) {
            acts[keys.len()].quad();
        } else if int4 && simd.pairs() {
            acts[keys.len()].pair();
        }
        if !int4 && simd.halves() {
            acts[keys.len()].halves();
        }
        act_of[j] = keys.len();
        keys.push(key);
    }
    let outs: Vec<OutPtr> = jobs.iter_mut().map(|j| OutPtr(j.out.as_mut_ptr())).collect();
    let macs: usize = jobs.iter().map(|j| j.w.rows * j.w.cols * j.n).sum();
    let run = |j: usize, r0: usize, r1: usize| {
        let job = &jobs[j];
        let act = match job.w.dtype {
            DType::Mxfp4 => acts16.get(act_of[j]).map(Act::Int16),
            _ => acts.get(act_of[j]).map(Act::Int8),
        };
        // SAFETY: OutPtr's contract; rows r0..r1 of job j belong to this task alone.
        unsafe { rows_into(simd, job.w, job.x, job.n, act, r0, r1, outs[j].0) }
    };
    let threads = threads();
    if threads <= 1 || macs < PARALLEL_MIN_MACS {
        for (j, job) in jobs.iter().enumerate() {
            run(j, 0, job.w.rows);
        }
    } else {
        // About four tasks per thread, none tiny.
        let task_macs = (macs / (threads * 4)).max(1 << 14);
        let mut tasks = Vec::new();
        for (j, job) in jobs.iter().enumerate() {
            let per = (task_macs / (job.w.cols * job.n).max(1)).max(1);
            tasks.extend((0..job.w.rows).step_by(per).map(|r0| (j, r0, (r0 + per).min(job.w.rows))));
        }
        for_each_task(&tasks, |&(j, r0, r1)| run(j, r0, r1));
    }
    ACTS.with(|a| *a.borrow_mut() = acts);
    ACTS16.with(|a| *a.borrow_mut() = acts16);
}

/// The quantized activations a weight type's integer kernel takes.
#[derive(Clone, Copy)]
enum Act<'a> {
    /// int8 per group (int8 and int4 weights, crate::qdot).
    Int8(&'a ActQ),
    /// int16 per block of 32 (MXFP4 weights, crate::qdot::mxfp4).
    Int16(&'a ActQ16),
}

/// Runs `f` on every task, on the thread pool when the `parallel` feature is on.
fn for_each_task<T: Sync, F: Fn(&T) + Sync + Send>(tasks: &[T], f: F) {
    #[cfg(feature = "parallel")]
    {
        if joined(tasks.len(), &|i| f(&tasks[i])) {
            return;
        }
        use rayon::prelude::*;
        tasks.par_iter().for_each(f);
    }
    #[cfg(not(feature = "parallel"))]
    tasks.iter().for_each(f);
}

/// Rows computed before their outputs are written, position by position (16 f32 = one
/// cache line per position).
const OUT_ROWS: usize = 16;

/// Rows `r0..r1` of `w` times the `n` positions, written to `out[p * w.rows + r]`.
///
/// SAFETY (caller): `out` points at `n * w.rows` writable f32s that no one else touches
/// at these rows; `x` holds `n * w.cols` values; `act` is `x` quantized for `w` when `w`
/// is an integer type.
#[allow(clippy::too_many_arguments)]
unsafe fn rows_into(simd: Simd, w: &Mat, x: &[f32], n: usize, act: Option<Act>, r0: usize, r1: usize, out: *mut f32) {
    let (rows, cols, rb) = (w.rows, w.cols, w.row_bytes());
    let bytes = w.bytes.as_ref();
    let put = |p: usize, r: usize, v: f32| {
        // SAFETY: p < n and r < rows, inside the caller's `n * rows` elements.
        unsafe { *out.add(p * rows + r) = v }
    };
    match (w.dtype, act) {
        (DType::Mxfp4, Some(Act::Int16(a))) => {
            if n == 1 {
                // SAFETY: rows r0..r1 of position 0 are out[r0..r1], this task's alone.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.add(r0), r1 - r0) };
                qdot::mxfp4::dot_rows(simd, &bytes[r0 * rb..r1 * rb], rb, a, dst);
                return;
            }
            for r in r0..r1 {
                let row = &bytes[r * rb..(r + 1) * rb];
                for p in 0..n {
                    put(p, r, qdot::mxfp4::dot_row(simd, row, a, p));
                }
            }
        }
        (DType::Int8 { .. } | DType::Int4 { .. } | DType::Q4K | DType::Q5K, Some(Act::Int8(a))) => {
            let int4 = matches!(w.dtype, DType::Int4 { .. } | DType::Q4K | DType::Q5K);
            if n == 1 {
                // SAFETY: rows r0..r1 of position 0 are out[r0..r1], this task's alone.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.add(r0), r1 - r0) };
                qdot::dot_rows(simd, int4, &bytes[r0 * rb..r1 * rb], rb, a, dst);
                return;
            }
            let mut prep = PREP.with(|b| std::mem::take(&mut *b.borrow_mut()));
            let mut cols = ROW.with(|b| std::mem::take(&mut *b.borrow_mut()));
            // Rows in groups of OUT_ROWS, each written out position by position as one
            // contiguous run (a row at a time would store one value per cache line).
            cols.resize(OUT_ROWS * n, 0.0);
            for g0 in (r0..r1).step_by(OUT_ROWS) {
                let g1 = (g0 + OUT_ROWS).min(r1);
                let k1 = g1 - g0;
                qdot::dot_rows_many(simd, int4, &bytes[g0 * rb..g1 * rb], rb, a, &mut cols[..k1 * n], &mut prep);
                for p in 0..n {
                    for (k, r) in (g0..g1).enumerate() {
                        put(p, r, cols[k * n + p]);
                    }
                }
            }
            ROW.with(|b| *b.borrow_mut() = cols);
            PREP.with(|b| *b.borrow_mut() = prep);
        }
        _ => {
            #[cfg(target_arch = "x86_64")]
            if matches!(simd, Simd::Avx2 | Simd::Avx512) {
                // SAFETY: Simd::Avx2/Avx512 come from Simd::available() after the CPU reported
                // AVX2 and F16C; the caller's contract for `out` and `x`.
                let done = unsafe {
                    match w.dtype {
                        DType::F32 => {
                            rows_x86::float_rows::<{ float_x86::F32 }>(w, x, n, r0, r1, out, simd == Simd::Avx512)
                        }
                        DType::BF16 => {
                            rows_x86::float_rows::<{ float_x86::BF16 }>(w, x, n, r0, r1, out, simd == Simd::Avx512)
                        }
                        DType::F16 => {
                            rows_x86::float_rows::<{ float_x86::F16 }>(w, x, n, r0, r1, out, simd == Simd::Avx512)
                        }
                        DType::Fp8 { block } if fp8_x86::takes(block as usize) => {
                            rows_x86::fp8_rows(w, block as usize, x, n, r0, r1, out, simd == Simd::Avx512)
                        }
                        _ => false,
                    }
                };
                if done {
                    return;
                }
            }
            #[cfg(target_arch = "aarch64")]
            if let (DType::Fp8 { block }, 1, Simd::Neon | Simd::NeonDot) = (w.dtype, n, simd) {
                if fp8_four::takes(block as usize) {
                    // SAFETY: rows r0..r1 of position 0 are out[r0..r1], this task's alone;
                    // fp8_neon::dot4 reads its rows and x alone.
                    return unsafe {
                        let dst = std::slice::from_raw_parts_mut(out.add(r0), r1 - r0);
                        fp8_four::rows(w, block as usize, x, r0, r1, dst, fp8_neon::dot4)
                    };
                }
            }
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            if let (DType::Fp8 { block }, 1, Simd::Simd128) = (w.dtype, n, simd) {
                if fp8_four::takes(block as usize) {
                    // SAFETY: rows r0..r1 of position 0 are out[r0..r1], this task's alone;
                    // fp8_wasm::dot4 reads its rows and x alone.
                    return unsafe {
                        let dst = std::slice::from_raw_parts_mut(out.add(r0), r1 - r0);
                        fp8_four::rows(w, block as usize, x, r0, r1, dst, fp8_wasm::dot4)
                    };
                }
            }
            let mut buf = ROW.with(|b| std::mem::take(&mut *b.borrow_mut()));
            buf.resize(cols, 0.0);
            for r in r0..r1 {
                w.row_into(r, &mut buf);
                for p in 0..n {
                    put(p, r, math::dot(&buf, &x[p * cols..(p + 1) * cols]));
                }
            }
            ROW.with(|b| *b.borrow_mut() = buf);
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

/// How a gated feed-forward combines its gate value g and up value u (math/act.rs).
pub use crate::math::Activation;

/// Biases of a feed-forward: added to the gate, up and down products.
#[derive(Clone, Copy)]
pub struct FfnBias<'a> {
    /// (inter)
    pub gate: &'a [f32],
    /// (inter)
    pub up: &'a [f32],
    /// (hidden)
    pub down: &'a [f32],
}

/// SwiGLU feed-forward `down(silu(gate(x)) * up(x))` for `n` positions.
pub fn swiglu(gate: &Mat, up: &Mat, down: &Mat, x: &[f32], n: usize, out: &mut [f32]) {
    swiglu_many(&[FfnJob { gate, up, down, x, n, act: Activation::Silu, bias: None }], &mut [out]);
}

/// One SwiGLU feed-forward of a batch handed to [`swiglu_many`].
pub struct FfnJob<'a> {
    /// (inter, hidden)
    pub gate: &'a Mat,
    /// (inter, hidden)
    pub up: &'a Mat,
    /// (hidden, inter)
    pub down: &'a Mat,
    /// [n, hidden]
    pub x: &'a [f32],
    pub n: usize,
    pub act: Activation,
    pub bias: Option<FfnBias<'a>>,
}

/// Adds `b` to every `b.len()`-sized row of `y`.
fn add_rows(y: &mut [f32], b: &[f32]) {
    for row in y.chunks_exact_mut(b.len().max(1)) {
        row.iter_mut().zip(b).for_each(|(v, bi)| *v += bi);
    }
}

/// Elementwise activations below this many values run on the calling thread.
#[cfg(feature = "parallel")]
const PARALLEL_MIN_ELEMS: usize = 1 << 15;

/// Several SwiGLU feed-forwards (the experts of one MoE layer) in two parallel regions:
/// every gate and up product together, then every down product. `outs[k]` is
/// `[jobs[k].n, hidden]`; each result is the same bits as [`swiglu`] alone.
pub fn swiglu_many(jobs: &[FfnJob], outs: &mut [&mut [f32]]) {
    let mut g: Vec<Vec<f32>> = jobs.iter().map(|j| vec![0.0f32; j.n * j.gate.rows]).collect();
    let mut u: Vec<Vec<f32>> = jobs.iter().map(|j| vec![0.0f32; j.n * j.up.rows]).collect();
    let mut first: Vec<MatJob> = Vec::with_capacity(2 * jobs.len());
    for ((j, gi), ui) in jobs.iter().zip(g.iter_mut()).zip(u.iter_mut()) {
        first.push(MatJob { w: j.gate, x: j.x, n: j.n, out: gi });
        first.push(MatJob { w: j.up, x: j.x, n: j.n, out: ui });
    }
    matmul_many(&mut first);
    drop(first);
    // The elementwise activation, per expert (the same bits on any thread): on the pool
    // when there is enough of it (a prefill's experts; it was 4% of a 128-token prefill
    // on one thread while the other waited).
    let simd = Simd::active() != Simd::Scalar;
    let activate = |gi: &mut Vec<f32>, ui: &mut Vec<f32>, j: &FfnJob| {
        if let Some(b) = &j.bias {
            add_rows(gi, b.gate);
            add_rows(ui, b.up);
        }
        j.act.apply_rows(gi, ui, simd);
    };
    let elems: usize = g.iter().map(|v| v.len()).sum();
    #[cfg(feature = "parallel")]
    if elems >= PARALLEL_MIN_ELEMS && jobs.len() > 1 && threads() > 1 {
        let (gp, up) = (OutPtr(g.as_mut_ptr()), OutPtr(u.as_mut_ptr()));
        // SAFETY: task i alone touches g[i] and u[i], borrowed mutably until the region ends.
        let joined =
            joined(jobs.len(), &|i| unsafe { activate(&mut gp.slice(i, 1)[0], &mut up.slice(i, 1)[0], &jobs[i]) });
        if !joined {
            use rayon::prelude::*;
            g.par_iter_mut().zip(u.par_iter_mut()).zip(jobs.par_iter()).for_each(|((gi, ui), j)| activate(gi, ui, j));
        }
    } else {
        g.iter_mut().zip(u.iter_mut()).zip(jobs).for_each(|((gi, ui), j)| activate(gi, ui, j));
    }
    #[cfg(not(feature = "parallel"))]
    {
        let _ = elems;
        g.iter_mut().zip(u.iter_mut()).zip(jobs).for_each(|((gi, ui), j)| activate(gi, ui, j));
    }
    let mut second: Vec<MatJob> = jobs
        .iter()
        .zip(&g)
        .zip(outs.iter_mut())
        .map(|((j, gi), o)| MatJob { w: j.down, x: gi, n: j.n, out: o })
        .collect();
    matmul_many(&mut second);
    drop(second);
    for (j, o) in jobs.iter().zip(outs.iter_mut()) {
        if let Some(b) = &j.bias {
            add_rows(&mut o[..j.n * b.down.len()], b.down);
        }
    }
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
    fn float_weights_give_the_bits_of_decode_then_dot() {
        // Each float kind, rows not a multiple of four (nor of two: the several-position
        // blocks of two or four rows leave rows over), columns with and without a tail, one
        // position and several (fours and the rest): every output is math::dot of the decoded
        // row, on every SIMD path (AVX2's blocks of two rows, AVX-512's of four, the plain
        // loop).
        let mut s = 11u64;
        for (rows, cols) in [(37, 29), (8, 64), (3, 7), (7, 40)] {
            let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut s)).collect();
            let f32m = Mat::from_f32(rows, cols, &w).unwrap();
            let bf: Vec<u8> = w.iter().flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes()).collect();
            let hf: Vec<u8> = w.iter().flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes()).collect();
            let mats = [
                f32m,
                Mat::new(rows, cols, DType::BF16, crate::tensor::Bytes::from_vec(bf)).unwrap(),
                Mat::new(rows, cols, DType::F16, crate::tensor::Bytes::from_vec(hf)).unwrap(),
            ];
            for m in &mats {
                for n in [1, 2, 4, 5, 8, 9] {
                    let x: Vec<f32> = (0..n * cols).map(|_| lcg(&mut s)).collect();
                    let mut out = vec![0.0; n * rows];
                    matmul(m, &x, n, &mut out);
                    let mut row = vec![0.0; cols];
                    let mut want = vec![0.0f32; n * rows];
                    for r in 0..rows {
                        m.row_into(r, &mut row);
                        for p in 0..n {
                            want[p * rows + r] = math::dot(&row, &x[p * cols..(p + 1) * cols]);
                        }
                    }
                    assert!(out.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "{} matmul", m.dtype);
                    for simd in Simd::available() {
                        let mut out = vec![0.0; n * rows];
                        // SAFETY: out holds n * rows values; x n * cols; rows 0..rows of m.
                        unsafe { rows_into(simd, m, &x, n, None, 0, rows, out.as_mut_ptr()) };
                        for (i, (g, w)) in out.iter().zip(&want).enumerate() {
                            assert_eq!(
                                g.to_bits(),
                                w.to_bits(),
                                "{} {} [{rows}, {cols}] n {n} [{i}]",
                                simd.name(),
                                m.dtype
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn fp8_weights_give_the_bits_of_decode_then_dot_on_every_simd_path() {
        // Blocks of 8, 16, 32 (the vector paths) and 12 (two scales in a vector: the plain
        // loop), columns with a partial last block and a tail; NaN bytes (rows 1 and 2 in a
        // group of four that the large scale of row 3 sends to the plain loop, rows 5 and 14
        // in groups the vector kernels take), subnormals, -0, a scale too large for the
        // vector path's 2^8 pre-scaling and an infinite one.
        let mut s = 5u64;
        for (rows, cols, block) in [(37, 84, 32), (9, 64, 16), (6, 7, 8), (5, 40, 12), (4, 300, 128), (8, 300, 128)] {
            let dt = DType::Fp8 { block };
            let rb = dt.row_bytes(cols).unwrap();
            let nb = cols.div_ceil(block as usize);
            let mut bytes = vec![0u8; rows * rb];
            for (r, row) in bytes.chunks_exact_mut(rb).enumerate() {
                for b in 0..nb {
                    let sc = match (r, b) {
                        (3, 0) => 3.0e37,
                        (4, 1) => f32::INFINITY,
                        _ => 1e-3 * (1.0 + lcg(&mut s)),
                    };
                    row[4 * b..4 * b + 4].copy_from_slice(&sc.to_le_bytes());
                }
                for c in 0..cols {
                    let v = (lcg(&mut s) * 1e4).abs() as u32 as u8;
                    row[4 * nb + c] = match (r, c % 50) {
                        (1, 3) | (5, 9) => 0x7f,
                        (2, 4) | (14, 10) => 0xff,
                        (_, 5) => 0x80,
                        (_, 6) => 0x03,
                        _ => v,
                    };
                }
            }
            let m = Mat::new(rows, cols, dt, crate::tensor::Bytes::from_vec(bytes)).unwrap();
            for n in [1, 2, 5, 8, 13] {
                let x: Vec<f32> = (0..n * cols).map(|_| lcg(&mut s)).collect();
                let mut row = vec![0.0; cols];
                let mut want = vec![0.0f32; n * rows];
                for r in 0..rows {
                    m.row_into(r, &mut row);
                    for p in 0..n {
                        want[p * rows + r] = math::dot(&row, &x[p * cols..(p + 1) * cols]);
                    }
                }
                for simd in Simd::available() {
                    let mut out = vec![0.0; n * rows];
                    // SAFETY: out holds n * rows values; x n * cols; rows 0..rows of m.
                    unsafe { rows_into(simd, &m, &x, n, None, 0, rows, out.as_mut_ptr()) };
                    for (i, (g, w)) in out.iter().zip(&want).enumerate() {
                        assert!(
                            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                            "{} {dt} [{rows}, {cols}] n {n} [{i}]: {g} vs {w}",
                            simd.name()
                        );
                    }
                }
                assert!(want.iter().any(|v| v.is_nan()) == (rows > 2), "the NaN rows are NaN");
            }
        }
    }

    #[test]
    fn integer_matmul_is_batch_invariant() {
        // Rows in several output groups (OUT_ROWS) and a partial one; 1, 2 (one position at
        // a time), 3+ positions (rows made ready once) and 20 (activations quantized on
        // the thread pool): every output has the bits of the same position alone.
        let mut s = 11u64;
        let (rows, cols) = (37, 96);
        for dtype in [DType::Int4 { group: 32 }, DType::Int8 { group: 32 }] {
            let rb = dtype.row_bytes(cols).unwrap();
            let mut bytes = vec![0u8; rows * rb];
            for r in 0..rows {
                let w: Vec<f32> = (0..cols).map(|_| lcg(&mut s)).collect();
                crate::format::quant::quantize_row(dtype, &w, &mut bytes[r * rb..(r + 1) * rb]).unwrap();
            }
            let m = Mat::new(rows, cols, dtype, crate::tensor::Bytes::from_vec(bytes)).unwrap();
            for n in [2, 3, 9, 20] {
                let x: Vec<f32> = (0..n * cols).map(|_| lcg(&mut s)).collect();
                let mut out = vec![0.0; n * rows];
                matmul(&m, &x, n, &mut out);
                for p in 0..n {
                    let mut single = vec![0.0; rows];
                    matmul(&m, &x[p * cols..(p + 1) * cols], 1, &mut single);
                    for r in 0..rows {
                        assert_eq!(out[p * rows + r].to_bits(), single[r].to_bits(), "{dtype} n {n} p {p} r {r}");
                    }
                }
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
