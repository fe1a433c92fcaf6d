//! Which form the relaxed-SIMD one-position kernels sum their products in. Both give the
//! exact integer sums (so the same bits); which is faster depends on how the browser's JIT
//! lowers them for the CPU it runs on, so the engine measures it once ([`calibrate`]):
//! - 32-bit: `i32x4.relaxed_dot_i8x16_i7x16_add_s` per 16 products (V8 on x64 without
//!   VNNI: `vpmaddubsw`, `vpmaddwd` with a ones vector made each time, `vpaddd`);
//! - 16-bit: `i16x8.relaxed_dot_i8x16_i7x16_s` (one `vpmaddubsw`) for two sets of 16
//!   products, added (int4's two nibble halves) or subtracted (int8 against the
//!   activations' halves) in i16, where the result still fits, then one widening
//!   `i32x4.extadd_pairwise_i16x8_s`.
//!
//! Measured in Chromium 156 on an AMD EPYC Zen 1 (docs/benchmarks.md): the 16-bit form of
//! the int8 rows' sums, then of the int4 rows' too, each raised the decode by several
//! percent (int4's step: 6-7%); on an Intel Xeon with AVX-512 VNNI an int4 16-bit form was
//! 7% slower from L3 and as fast from memory (docs/kernels.md).

use std::sync::atomic::{AtomicBool, Ordering};

use super::{ActQ, Simd};
use crate::format::quant::quantize_row;
use crate::tensor::DType;

static DOT16: AtomicBool = AtomicBool::new(true);

/// Whether the one-position kernels use the 16-bit form.
#[inline]
pub fn dot16() -> bool {
    DOT16.load(Ordering::Relaxed)
}

/// Sets the form (both are exact: only the speed changes).
pub fn set_dot16(on: bool) {
    DOT16.store(on, Ordering::Relaxed)
}

/// Times both forms on int4 (group 32) and int8 (group 128, the activations' halves) rows
/// that stay in cache, with the clock `now_ms` (milliseconds): 15 ms untimed, then timed
/// rounds alternated (15 ms and at least five rounds), and keeps the faster (the best time
/// of each). Returns (16-bit chosen, ms of the 32-bit form, ms of the 16-bit form); where
/// no rows could be made, the form as it is and zeros. About 30 ms (once, at load).
pub fn calibrate(now_ms: &dyn Fn() -> f64) -> (bool, f64, f64) {
    let (rows, cols) = (64, 2048);
    // Plain values, no edge cases (the check has those): a fixed sine pattern.
    let value = |i: usize| ((i as f32) * 0.7311).sin();
    let x: Vec<f32> = (0..cols).map(|i| value(i + 17)).collect();
    let mut cases = Vec::new();
    for (dtype, group) in [(DType::Int4 { group: 32 }, 32), (DType::Int8 { group: 128 }, 128)] {
        let int4 = group == 32;
        let rb = dtype.row_bytes(cols).unwrap_or(0);
        let mut w = vec![0u8; rows * rb];
        for (r, dst) in w.chunks_exact_mut(rb.max(1)).enumerate() {
            let row: Vec<f32> = (0..cols).map(|i| value(r * cols + i)).collect();
            if quantize_row(dtype, &row, dst).is_err() {
                return (dot16(), 0.0, 0.0);
            }
        }
        let mut a = ActQ::default();
        a.quantize(&x, 1, cols, group, ActQ::wants_split(int4, group));
        if !int4 {
            a.halves();
        }
        cases.push((int4, w, rb, a));
    }
    let mut out = vec![0.0f32; rows];
    let mut best = [f64::MAX; 2];
    // The first WARM_MS are not timed: each form's first calls run the JIT's baseline code
    // until V8 has compiled the hot functions again, optimized, on a background thread (a
    // few milliseconds on a busy 2-core host), and rounds that caught one form before that
    // and the other after it picked the wrong one. Then timed rounds, alternated, for at
    // least TIMED_MS and MIN_ROUNDS rounds.
    const WARM_MS: f64 = 15.0;
    const TIMED_MS: f64 = 15.0;
    const MIN_ROUNDS: usize = 5;
    // A bound whatever the clock does (one that never advances times nothing: the 16-bit
    // form, as before any calibration).
    const MAX_ROUNDS: usize = 200;
    let start = now_ms();
    let mut timed_from = None;
    let mut rounds = 0;
    for _ in 0..MAX_ROUNDS {
        let now = now_ms();
        let timing = now - start >= WARM_MS;
        if timing && timed_from.is_none() {
            timed_from = Some(now);
        }
        if let Some(t0) = timed_from {
            if rounds >= MIN_ROUNDS && now - t0 >= TIMED_MS {
                break;
            }
        }
        for form in [false, true] {
            set_dot16(form);
            let t0 = now_ms();
            for _ in 0..16 {
                for (int4, w, rb, a) in &cases {
                    super::dot_rows(Simd::Simd128, *int4, w, *rb, a, &mut out);
                }
            }
            let t = now_ms() - t0;
            if timing {
                best[form as usize] = best[form as usize].min(t);
            }
            core::hint::black_box(&out);
        }
        rounds += usize::from(timing);
    }
    let pick = best[1] <= best[0];
    set_dot16(pick);
    (pick, best[0], best[1])
}
