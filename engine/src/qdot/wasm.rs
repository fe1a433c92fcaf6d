//! wasm SIMD128 path of [`super::dot_row`]: values widened to i16 and summed with
//! `i32x4.dot_i16x8_s` (exact), or int4 nibbles times int8 activations with relaxed SIMD's
//! `i32x4.relaxed_dot_i8x16_i7x16_add_s` where the build enables it (exact for nibbles);
//! the float combination as in the reference.

use core::arch::wasm32::*;

use super::{padded, round4, scale, ActQ, CHUNK};
use crate::math::reduce8;

/// Bytes `[at, at + 16)` of `src`, zero-filled past its end.
#[inline(always)]
fn load16(src: &[u8], at: usize) -> v128 {
    if at + 16 <= src.len() {
        // SAFETY: the 16 bytes are inside `src`; v128.load has no alignment requirement.
        unsafe { v128_load(src.as_ptr().add(at) as *const v128) }
    } else {
        let buf = padded::<16>(src, at);
        // SAFETY: `buf` holds 16 bytes.
        unsafe { v128_load(buf.as_ptr() as *const v128) }
    }
}

#[inline(always)]
fn load_q(q: &[i8], at: usize) -> v128 {
    let s = &q[at..at + 16];
    // SAFETY: `s` holds 16 bytes (the slice above is bounds-checked).
    unsafe { v128_load(s.as_ptr() as *const v128) }
}

/// Sum of the 16 products of `w` (i16 halves `wl`, `wh`) and the 16 int8 values `x`.
#[inline(always)]
fn dot16(acc: v128, wl: v128, wh: v128, x: v128) -> v128 {
    let a = i32x4_dot_i16x8(wl, i16x8_extend_low_i8x16(x));
    let b = i32x4_dot_i16x8(wh, i16x8_extend_high_i8x16(x));
    i32x4_add(acc, i32x4_add(a, b))
}

/// acc + the products of 16 nibble values `w` (0..=15) and 16 int8 values `x`.
///
/// With relaxed SIMD (the threaded build): `i32x4.relaxed_dot_i8x16_i7x16_add_s`, 16
/// products in one instruction. Its result is only implementation-defined when the second
/// operand has its top bit set or the 16-bit pair sums overflow; nibbles are at most 15,
/// so a pair sums to at most 2 * 15 * 127: the exact integer sum on every engine.
#[inline(always)]
fn nibbles16(acc: v128, w: v128, x: v128) -> v128 {
    #[cfg(target_feature = "relaxed-simd")]
    {
        i32x4_relaxed_dot_i8x16_i7x16_add(x, w, acc)
    }
    #[cfg(not(target_feature = "relaxed-simd"))]
    {
        dot16(acc, u16x8_extend_low_u8x16(w), u16x8_extend_high_u8x16(w), x)
    }
}

pub fn dot_row_simd128(int4: bool, row: &[u8], a: &ActQ, p: usize) -> f32 {
    let (g, blocks) = (a.group, a.blocks);
    let vals = &row[round4(blocks * 2)..];
    let (q, d, s) = (a.qrow(p), a.drow(p), a.srow(p));
    let low4 = u8x16_splat(15);
    let mut acc = [0.0f32; 8];
    for b in 0..blocks {
        let mut sum = i32x4_splat(0);
        for k in 0..g / CHUNK {
            let c = b * g + k * CHUNK;
            let (x0, x1) = (load_q(q, c), load_q(q, c + 16));
            if int4 {
                let bytes = load16(vals, c / 2);
                let lo = v128_and(bytes, low4);
                let hi = u8x16_shr(bytes, 4);
                sum = nibbles16(sum, lo, x0);
                sum = nibbles16(sum, hi, x1);
            } else {
                let (w0, w1) = (load16(vals, c), load16(vals, c + 16));
                sum = dot16(sum, i16x8_extend_low_i8x16(w0), i16x8_extend_high_i8x16(w0), x0);
                sum = dot16(sum, i16x8_extend_low_i8x16(w1), i16x8_extend_high_i8x16(w1), x1);
            }
        }
        let mut isum = i32x4_extract_lane::<0>(sum)
            + i32x4_extract_lane::<1>(sum)
            + i32x4_extract_lane::<2>(sum)
            + i32x4_extract_lane::<3>(sum);
        if int4 {
            isum -= 8 * s[b];
        }
        acc[b % 8] += (scale(row, b) * d[b]) * isum as f32;
    }
    reduce8(acc)
}
