//! The wasm int4 decode kernel alone, timed by node (V8, the JIT Chromium runs):
//! `node tools/bench/qdot-wasm/run.mjs`. One position times many stored int4 rows (int8,
//! Q4K or Q5K rows: [`setup`], [`setup_k`]), as a decode step's matmuls do.
use colibri_engine::format::quant::quantize_row;
use colibri_engine::qdot::{dot_row, dot_row_many, ActQ, Simd};
use colibri_engine::tensor::DType;

#[cfg(target_feature = "relaxed-simd")]
mod variants;

struct State {
    rows: usize,
    rb: usize,
    int4: bool,
    w: Vec<u8>,
    a: ActQ,
    out: Vec<f32>,
    /// `POS` positions of activations, interleaved (the prefill kernel's input).
    many: ActQ,
}

/// Every [`setup`] / [`setup_k`] made (a slot each), and the one the run* exports use
/// ([`select`]): run.mjs's FORMATS times several kinds of rows interleaved.
static mut SLOTS: Vec<State> = Vec::new();
static mut CURRENT: usize = 0;

/// The selected slot's rows and activations.
fn state() -> &'static mut State {
    // SAFETY: wasm32 without threads: one caller, and no reference outlives an export.
    #[allow(static_mut_refs)]
    unsafe {
        &mut SLOTS[CURRENT]
    }
}

/// Makes slot `i` (the i-th setup, from 0) the one the run* exports use.
#[no_mangle]
pub extern "C" fn select(i: usize) {
    // SAFETY: as in `state`.
    unsafe { CURRENT = i };
}

/// Adds `st` as a new slot and selects it.
fn push(st: State) {
    // SAFETY: as in `state`.
    #[allow(static_mut_refs)]
    unsafe {
        SLOTS.push(st);
        CURRENT = SLOTS.len() - 1;
    }
}

fn lcg(s: &mut u64) -> f32 {
    *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// `rows` random int4 rows (int8 rows where `int8` is not 0) of `cols` values (group
/// `group`) and one random position.
#[no_mangle]
pub extern "C" fn setup(rows: usize, cols: usize, group: usize, int8: usize) -> usize {
    let int4 = int8 == 0;
    let dtype = if int4 { DType::Int4 { group: group as u32 } } else { DType::Int8 { group: group as u32 } };
    let rb = dtype.row_bytes(cols).unwrap();
    let mut s = 7u64;
    let mut w = vec![0u8; rows * rb];
    let row: Vec<f32> = (0..cols).map(|_| lcg(&mut s)).collect();
    for r in 0..rows {
        let shifted: Vec<f32> = row.iter().map(|v| v * (1.0 + r as f32 * 1e-3)).collect();
        quantize_row(dtype, &shifted, &mut w[r * rb..(r + 1) * rb]).unwrap();
    }
    let x: Vec<f32> = (0..cols).map(|_| lcg(&mut s)).collect();
    let mut a = ActQ::default();
    a.quantize(&x, 1, cols, group, ActQ::wants_split(int4, group));
    if !int4 && Simd::active().halves() {
        a.halves(); // as the engine's matmul does (kernels.rs)
    }
    let xs: Vec<f32> = (0..cols * POS).map(|_| lcg(&mut s)).collect();
    let mut many = ActQ::default();
    many.quantize(&xs, POS, cols, group, ActQ::wants_split(int4, group));
    many.interleave();
    push(State { rows, rb, int4, w, a, out: vec![0.0; rows * POS], many });
    rows * rb
}

/// `rows` random Q4K rows (`k` 4) or Q5K rows (`k` 5) of `cols` values (a multiple of
/// 256), quantized as `quantize_row` does (each sub-block's span in 15 or 31 steps), and
/// one random position with the Q4K/Q5K activations (`ActQ::set_k4` / `set_k5`, as the
/// engine's matmul makes them): `dot_row` / `dot_rows` take the engine's Q4K/Q5K paths.
#[no_mangle]
pub extern "C" fn setup_k(rows: usize, cols: usize, k: usize) -> usize {
    let dtype = if k == 5 { DType::Q5K } else { DType::Q4K };
    let rb = dtype.row_bytes(cols).unwrap();
    let mut s = 7u64;
    let mut w = vec![0u8; rows * rb];
    // Weights of a model's size (|w| < 0.04, as the OLMoE-shaped benchmark's): most Q5_K
    // blocks then get an f16-subnormal d, as real files do (docs/benchmarks.md "The Q5_K_M
    // import in the browser"); values near 1 would hide what such scales cost.
    let row: Vec<f32> = (0..cols).map(|_| 0.04 * lcg(&mut s)).collect();
    for r in 0..rows {
        let shifted: Vec<f32> = row.iter().map(|v| v * (1.0 + r as f32 * 1e-3)).collect();
        quantize_row(dtype, &shifted, &mut w[r * rb..(r + 1) * rb]).unwrap();
    }
    let set = |a: &mut ActQ| if k == 5 { a.set_k5() } else { a.set_k4() };
    let x: Vec<f32> = (0..cols).map(|_| lcg(&mut s)).collect();
    let mut a = ActQ::default();
    a.quantize(&x, 1, cols, 32, true);
    set(&mut a);
    let xs: Vec<f32> = (0..cols * POS).map(|_| lcg(&mut s)).collect();
    let mut many = ActQ::default();
    many.quantize(&xs, POS, cols, 32, true);
    set(&mut many);
    many.interleave();
    push(State { rows, rb, int4: true, w, a, out: vec![0.0; rows * POS], many });
    rows * rb
}

/// Positions of `run_many` (a prefill-sized batch).
const POS: usize = 16;

/// The many-position (prefill) kernel: every row times `POS` positions; the bytes per
/// second it reports count each row once (divide by POS for per-position work).
#[no_mangle]
pub extern "C" fn run_many(iters: usize) -> u32 {
    let st = state();
    let simd = Simd::active();
    let mut scratch = Vec::new();
    let mut sum = 0u32;
    for _ in 0..iters {
        for r in 0..st.rows {
            let row = &st.w[r * st.rb..(r + 1) * st.rb];
            dot_row_many(simd, st.int4, row, &st.many, 0, &mut st.out[r * POS..(r + 1) * POS], &mut scratch);
        }
        sum = st.out.iter().fold(sum, |h, v| h.wrapping_add(v.to_bits()));
    }
    sum
}

/// `iters` passes over every row; returns a checksum of the outputs (their bits summed).
#[no_mangle]
pub extern "C" fn run(iters: usize) -> u32 {
    let st = state();
    let simd = Simd::active();
    let mut sum = 0u32;
    for _ in 0..iters {
        for r in 0..st.rows {
            st.out[r] = dot_row(simd, st.int4, &st.w[r * st.rb..(r + 1) * st.rb], &st.a, 0);
        }
        sum = st.out[..st.rows].iter().fold(sum, |h, v| h.wrapping_add(v.to_bits()));
    }
    sum
}

#[cfg(target_feature = "relaxed-simd")]
fn each(iters: usize, f: impl Fn(&[u8], &ActQ) -> f32) -> u32 {
    let st = state();
    let mut sum = 0u32;
    if st.a.group != 32 || !st.int4 || st.a.k4 {
        return 0; // the variants are written for int4 group 32
    }
    for _ in 0..iters {
        for r in 0..st.rows {
            st.out[r] = f(&st.w[r * st.rb..(r + 1) * st.rb], &st.a);
        }
        sum = st.out[..st.rows].iter().fold(sum, |h, v| h.wrapping_add(v.to_bits()));
    }
    sum
}

/// Candidate kernels: must return `run`'s checksum.
#[cfg(target_feature = "relaxed-simd")]
#[no_mangle]
pub extern "C" fn run_b16(iters: usize) -> u32 {
    each(iters, variants::dot_b::<true>)
}

#[cfg(target_feature = "relaxed-simd")]
#[no_mangle]
pub extern "C" fn run_c_int(iters: usize) -> u32 {
    each(iters, variants::dot_c::<1, false>)
}

#[cfg(target_feature = "relaxed-simd")]
#[no_mangle]
pub extern "C" fn run_c_eng(iters: usize) -> u32 {
    each(iters, variants::dot_c::<2, false>)
}

#[cfg(target_feature = "relaxed-simd")]
#[no_mangle]
pub extern "C" fn run_x_cnoscale(iters: usize) -> u32 {
    each(iters, variants::dot_c::<0, false>)
}

#[cfg(target_feature = "relaxed-simd")]
#[no_mangle]
pub extern "C" fn run_c_eng16(iters: usize) -> u32 {
    each(iters, variants::dot_c::<2, true>)
}

#[cfg(target_feature = "relaxed-simd")]
#[no_mangle]
pub extern "C" fn run_c_row(iters: usize) -> u32 {
    each(iters, variants::dot_c::<3, false>)
}

#[cfg(target_feature = "relaxed-simd")]
#[no_mangle]
pub extern "C" fn run_d(iters: usize) -> u32 {
    each(iters, variants::dot_d)
}

#[cfg(target_feature = "relaxed-simd")]
#[no_mangle]
pub extern "C" fn run_b8(iters: usize) -> u32 {
    each(iters, variants::dot_b::<false>)
}

/// Ablations (wrong results on purpose): what the parts cost.
#[cfg(target_feature = "relaxed-simd")]
#[no_mangle]
pub extern "C" fn run_x_noscale(iters: usize) -> u32 {
    each(iters, variants::dot_x_noscale)
}

#[cfg(target_feature = "relaxed-simd")]
#[no_mangle]
pub extern "C" fn run_x_core(iters: usize) -> u32 {
    each(iters, variants::dot_x_core)
}

#[cfg(target_feature = "relaxed-simd")]
#[no_mangle]
pub extern "C" fn run_x_load(iters: usize) -> u32 {
    each(iters, variants::dot_x_load)
}

/// `run_many`'s work by the one-position kernel, position by position (same bits: its
/// checksum must equal run_many's).
#[no_mangle]
pub extern "C" fn run_many1(iters: usize) -> u32 {
    let st = state();
    let simd = Simd::active();
    let mut sum = 0u32;
    for _ in 0..iters {
        for r in 0..st.rows {
            let row = &st.w[r * st.rb..(r + 1) * st.rb];
            for p in 0..POS {
                st.out[r * POS + p] = dot_row(simd, st.int4, row, &st.many, p);
            }
        }
        sum = st.out.iter().fold(sum, |h, v| h.wrapping_add(v.to_bits()));
    }
    sum
}

/// `run_many1` with position 0 each time (what the positions' data costs).
#[no_mangle]
pub extern "C" fn run_many0(iters: usize) -> u32 {
    let st = state();
    let simd = Simd::active();
    let mut sum = 0u32;
    for _ in 0..iters {
        for r in 0..st.rows {
            let row = &st.w[r * st.rb..(r + 1) * st.rb];
            for p in 0..POS {
                st.out[r * POS + p] = dot_row(simd, st.int4, row, &st.many, p & 0);
            }
        }
        sum = st.out.iter().fold(sum, |h, v| h.wrapping_add(v.to_bits()));
    }
    sum
}

/// One export per (streams, distance, stride) variant of [`run_streams`]; one stream with
/// `run_s4096_d16k`'s touches is what the engine's `qdot::dot_rows` did on wasm before it
/// took two streams (`run_two`, now `run_engine`).
macro_rules! stream_variants {
    ($($name:ident: $k:expr, $dist:expr, $stride:expr;)*) => {$(
        #[no_mangle]
        pub extern "C" fn $name(iters: usize) -> u32 {
            run_streams(iters, $k, $dist, $stride, 1)
        }
    )*};
}

stream_variants! {
    run_s4096_d8k: 1, 8192, 4096;
    run_s4096_d16k: 1, 16384, 4096;
    run_s1024_d4k: 1, 4096, 1024;
    run_s256_d4k: 1, 4096, 256;
    run_s64_d4k: 1, 4096, 64;
    run_s64_d12k: 1, 12288, 64;
    run_s4096_d32k: 1, 32768, 4096;
    run_s2048_d16k: 1, 16384, 2048;
    run_s8192_d16k: 1, 16384, 8192;
    run_two: 2, 16384, 4096;
    run_two_d8k: 2, 8192, 4096;
    run_two_d32k: 2, 32768, 4096;
    run_two_none: 2, 0, 4096;
    run_three: 3, 16384, 4096;
    run_four: 4, 16384, 4096;
}

/// The engine's kernel check (every path against the scalar reference, bit for bit, the
/// browser's `kernelSelfCheck`): the number of products compared, or 0 on a difference
/// ([`check_msg`] says which). Run it where the kernels run: in node 20 with its
/// experimental relaxed SIMD the relaxed build's int4 rows differed from the scalar
/// reference (2026-12-05), while in Chromium 156 every path gives the reference's bits
/// (tests/e2e's kernelSelfCheck); the plain SIMD128 build passes in both.
#[no_mangle]
pub extern "C" fn check() -> u32 {
    colibri_engine::qdot::check::check_paths().map_or(0, |n| n as u32)
}

static mut CHECK_MSG: String = String::new();

/// [`check`]'s first difference, as UTF-8 at the returned address ([`check_msg_len`] bytes).
#[no_mangle]
pub extern "C" fn check_msg() -> *const u8 {
    let msg = colibri_engine::qdot::check::check_paths().err().unwrap_or_default();
    // SAFETY: wasm32 without threads: one caller.
    #[allow(static_mut_refs)]
    unsafe {
        CHECK_MSG = msg;
        CHECK_MSG.as_ptr()
    }
}

/// The length of the message [`check_msg`] last wrote.
#[no_mangle]
pub extern "C" fn check_msg_len() -> usize {
    // SAFETY: as in `check_msg`.
    #[allow(static_mut_refs)]
    unsafe {
        CHECK_MSG.len()
    }
}

/// FP8 or MXFP4 rows and one position, for [`matmul`] (`FP8=1|2` or `MXFP4=1` in run.mjs).
static mut MAT_STATE: Option<(colibri_engine::tensor::Mat, Vec<f32>, Vec<f32>)> = None;

/// `rows` rows of `cols` values and one random position; returns the stored bytes. `kind`
/// 0: FP8, each block of 128 quantized as the releases are (roughly normal values, scale =
/// the block's largest magnitude / 448, bytes by `e4m3_from_f32`: few subnormal codes); 1:
/// FP8 of uniformly random bytes (no NaN), a sixteenth of them subnormal codes; 2: MXFP4
/// (scale bytes 124-131, random nibbles).
#[no_mangle]
pub extern "C" fn setup_mat(rows: usize, cols: usize, kind: usize) -> usize {
    use colibri_engine::tensor::{e4m3_from_f32, Bytes, Mat};
    let dtype = if kind == 2 { DType::Mxfp4 } else { DType::Fp8 { block: 128 } };
    let rb = dtype.row_bytes(cols).unwrap();
    let mut s = 11u64;
    let mut w = vec![0u8; rows * rb];
    for row in w.chunks_exact_mut(rb) {
        if kind == 2 {
            let nb = rb - cols / 2;
            for (i, v) in row.iter_mut().enumerate() {
                let r = ((lcg(&mut s) + 1.0) * 127.9) as u8;
                *v = if i < nb { 124 + r % 8 } else { r };
            }
            continue;
        }
        let nb = cols.div_ceil(128);
        let (scales, q) = row.split_at_mut(4 * nb);
        for (b, block) in q.chunks_mut(128).enumerate() {
            let vals: Vec<f32> = block.iter().map(|_| (0..4).map(|_| lcg(&mut s)).sum::<f32>() * 0.01).collect();
            let amax = vals.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = if kind == 0 { amax / 448.0 } else { 1e-3 * (1.5 + lcg(&mut s)) };
            scales[4 * b..4 * b + 4].copy_from_slice(&scale.to_le_bytes());
            for (v, x) in block.iter_mut().zip(&vals) {
                *v = match kind {
                    0 => e4m3_from_f32(x / scale),
                    _ => match ((lcg(&mut s) + 1.0) * 127.9) as u8 {
                        b if b & 0x7f == 0x7f => b ^ 1,
                        b => b,
                    },
                };
            }
        }
    }
    let x: Vec<f32> = (0..cols).map(|_| lcg(&mut s)).collect();
    let m = Mat::new(rows, cols, dtype, Bytes::from_vec(w)).unwrap();
    // SAFETY: wasm32 without threads: one caller.
    unsafe { MAT_STATE = Some((m, x, vec![0.0; rows])) };
    rows * rb
}

/// `iters` one-position products over [`setup_mat`]'s rows (the engine's `matmul`, which
/// takes `kernels::fp8_wasm` or `qdot::mxfp4`'s wasm kernel); a checksum of the outputs' bits.
#[no_mangle]
pub extern "C" fn matmul(iters: usize) -> u32 {
    // SAFETY: as in `setup`.
    #[allow(static_mut_refs)]
    let (m, x, out) = unsafe { MAT_STATE.as_mut().unwrap() };
    let mut sum = 0u32;
    for _ in 0..iters {
        colibri_engine::kernels::matmul(m, x, 1, out);
        sum = out.iter().fold(sum, |h, v| h.wrapping_add(v.to_bits()));
    }
    sum
}

/// `run` over `k` streams (rows `r`, `r + rows / k`, ... alternated: k pages read at once,
/// for more memory-level parallelism), each touching `lines` lines (offsets 0, 64, ...)
/// every `stride` bytes up to
/// `ahead` bytes past the row it starts (wasm has no prefetch instruction: these loads start
/// cache misses, and the hardware's stream prefetch, on pages the kernel reaches next).
fn run_streams(iters: usize, k: usize, ahead: usize, stride: usize, lines: usize) -> u32 {
    let st = state();
    let simd = Simd::active();
    let mut sum = 0u32;
    let mut touched = 0u8;
    let (rb, rows) = (st.rb, st.rows);
    let per = rows.div_ceil(k);
    for _ in 0..iters {
        let mut next: Vec<usize> = (0..k).map(|s| s * per * rb).collect();
        for i in 0..per {
            for s in 0..k {
                let r = s * per + i;
                if r >= rows.min((s + 1) * per) {
                    continue;
                }
                let end = ((s + 1) * per).min(rows) * rb;
                let until = (r * rb + ahead).min(end);
                while next[s] < until {
                    for at in (0..lines).map(|l| next[s] + 64 * l).filter(|&at| at < end) {
                        // SAFETY: at < end <= w.len().
                        touched ^= unsafe { *st.w.as_ptr().add(at) };
                    }
                    next[s] += stride;
                }
                st.out[r] = dot_row(simd, st.int4, &st.w[r * rb..(r + 1) * rb], &st.a, 0);
            }
        }
        sum = st.out[..st.rows].iter().fold(sum, |h, v| h.wrapping_add(v.to_bits()));
    }
    core::hint::black_box(touched);
    sum
}

/// The engine's one-position rows path (`qdot::dot_rows`: what a decode step's matmuls run
/// on one thread), whatever it does at this commit.
#[no_mangle]
pub extern "C" fn run_engine(iters: usize) -> u32 {
    let st = state();
    let simd = Simd::active();
    let mut sum = 0u32;
    for _ in 0..iters {
        colibri_engine::qdot::dot_rows(simd, st.int4, &st.w, st.rb, &st.a, &mut st.out[..st.rows]);
        sum = st.out[..st.rows].iter().fold(sum, |h, v| h.wrapping_add(v.to_bits()));
    }
    sum
}

/// The relaxed one-position kernels' summing form (`qdot::wasm_form`): 1 the 16-bit form
/// (the default), 0 the 32-bit one. run.mjs's FORM=32 sets 0. (Plain SIMD128 builds have
/// one form: nothing to set.)
#[no_mangle]
pub extern "C" fn set_form(dot16: usize) {
    #[cfg(target_feature = "relaxed-simd")]
    colibri_engine::qdot::wasm_form::set_dot16(dot16 != 0);
    let _ = dot16;
}

/// [`run_engine`] over consecutive matrices of `chunk` rows each, one `qdot::dot_rows` call
/// per matrix: a decode step's shapes (an OLMoE expert's matrix is about 1 MB, an attention
/// projection 4 MB), where each call starts its streams and touches cold.
fn run_engine_chunks(iters: usize, chunk: usize) -> u32 {
    let st = state();
    let simd = Simd::active();
    let mut sum = 0u32;
    for _ in 0..iters {
        let mut r = 0;
        while r < st.rows {
            let n = chunk.min(st.rows - r);
            colibri_engine::qdot::dot_rows(simd, st.int4, &st.w[r * st.rb..(r + n) * st.rb], st.rb, &st.a, &mut st.out[r..r + n]);
            r += n;
        }
        sum = st.out[..st.rows].iter().fold(sum, |h, v| h.wrapping_add(v.to_bits()));
    }
    sum
}

#[no_mangle]
pub extern "C" fn run_engine_c1024(iters: usize) -> u32 {
    run_engine_chunks(iters, 1024)
}

#[no_mangle]
pub extern "C" fn run_engine_c2048(iters: usize) -> u32 {
    run_engine_chunks(iters, 2048)
}

/// Touches of `lines` lines at the start of each page (offsets 0, 64, ...) instead of one:
/// two or more ascending misses in a page, the pattern the L2 stream prefetcher starts on.
macro_rules! line_variants {
    ($($name:ident: $k:expr, $dist:expr, $lines:expr;)*) => {$(
        #[no_mangle]
        pub extern "C" fn $name(iters: usize) -> u32 {
            run_streams(iters, $k, $dist, 4096, $lines)
        }
    )*};
}

line_variants! {
    run_l2_two: 2, 16384, 2;
    run_l3_two: 2, 16384, 3;
    run_l2_two_d8k: 2, 8192, 2;
    run_l2_one: 1, 16384, 2;
    run_l3_one_d8k: 1, 8192, 3;
}
