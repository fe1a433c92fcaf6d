//! wasm SIMD128 one-position dispatch ([`super::dot_row`], [`super::dot_rows`]): each row to
//! the kernel of its type, group and bounds, in the summing form the build's calibration
//! chose (`wasm::dot16_form`); Q4K/Q5K rows to `wasm_k`, relaxed int4 rows of group 32 and
//! 64 to `wasm_int`, the others to `wasm::body`.

use super::wasm::{body, dot16_form, each_row};
use super::wasm_int::runs_int4;
use super::wasm_k::{body_k, runs_k};
use super::{round4, ActQ};

pub fn dot_row_simd128(int4: bool, row: &[u8], a: &ActQ, p: usize) -> f32 {
    if dot16_form() {
        row_form::<true>(int4, row, a, p)
    } else {
        row_form::<false>(int4, row, a, p)
    }
}

/// Whether int4 rows of group 32 and 64 take [`runs_int4`] ([`row_form`]).
const RUNS4: bool = cfg!(target_feature = "relaxed-simd");

/// [`dot_row_simd128`] in the summing form `W16`.
fn row_form<const W16: bool>(int4: bool, row: &[u8], a: &ActQ, p: usize) -> f32 {
    // Rows whose values fill whole chunks (every shape of a real model) skip the
    // per-load bounds checks.
    let (g, blocks) = (a.group, a.blocks);
    let need = if int4 { blocks * g / 2 } else { blocks * g };
    // Q5K rows hold 32 fifth-bit bytes per run of eight blocks after the nibbles.
    let need = if int4 && a.k5 { need + blocks * 4 } else { need };
    let inside = row.len() >= round4(blocks * 2) + need && a.qrow(p).len() >= blocks * g;
    // int8 against the activations' halves where they were made (relaxed builds).
    let halves = !int4 && cfg!(target_feature = "relaxed-simd") && !a.qh.is_empty();
    // The common groups get a body of their own: with the group known when compiling, a
    // block is straight-line code (V8 runs it about 1.4x faster than the loop over a
    // run-time group: tools/bench/qdot-wasm in Chromium, eleventh session).
    if int4 && a.k4 {
        return match (inside, a.k5) {
            (true, false) => runs_k::<W16, false>(row, a, p),
            (false, false) => body_k::<true, W16, false>(row, a, p),
            (true, true) => runs_k::<W16, true>(row, a, p),
            (false, true) => body_k::<true, W16, true>(row, a, p),
        };
    }
    match (int4, halves, inside, a.group) {
        // Relaxed builds (the threaded one): int4's own function, [`runs_int4`] (the
        // plain build's widening form gained nothing from it).
        (true, _, true, 32) if RUNS4 => runs_int4::<32, W16>(row, a, p),
        (true, _, true, 64) if RUNS4 => runs_int4::<64, W16>(row, a, p),
        (true, _, true, 32) => body::<true, false, 32, false, W16>(row, a, p),
        (true, _, true, 64) => body::<true, false, 64, false, W16>(row, a, p),
        (true, _, true, 128) => body::<true, false, 128, false, W16>(row, a, p),
        (true, _, true, _) => body::<true, false, 0, false, W16>(row, a, p),
        (true, _, false, _) => body::<true, true, 0, false, W16>(row, a, p),
        (false, true, true, 32) => body::<false, false, 32, true, W16>(row, a, p),
        (false, true, true, 64) => body::<false, false, 64, true, W16>(row, a, p),
        (false, true, true, 128) => body::<false, false, 128, true, W16>(row, a, p),
        (false, true, true, _) => body::<false, false, 0, true, W16>(row, a, p),
        (false, true, false, _) => body::<false, true, 0, true, W16>(row, a, p),
        (false, false, true, 32) => body::<false, false, 32, false, W16>(row, a, p),
        (false, false, true, 64) => body::<false, false, 64, false, W16>(row, a, p),
        (false, false, true, 128) => body::<false, false, 128, false, W16>(row, a, p),
        (false, false, true, _) => body::<false, false, 0, false, W16>(row, a, p),
        (false, false, false, _) => body::<false, true, 0, false, W16>(row, a, p),
    }
}

/// Rows of `rb` bytes times position 0, one output each: [`dot_row_simd128`] per row, in
/// the order and with the touches of [`each_row`]. Same bits: each output is its row's.
pub fn dot_rows(int4: bool, rows: &[u8], rb: usize, a: &ActQ, out: &mut [f32]) {
    if dot16_form() {
        each_row(rows, rb, out, |row| row_form::<true>(int4, row, a, 0));
    } else {
        each_row(rows, rb, out, |row| row_form::<false>(int4, row, a, 0));
    }
}
