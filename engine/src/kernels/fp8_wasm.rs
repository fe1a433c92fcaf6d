//! wasm SIMD128 path of FP8 weights (the browser's CPU backend): the bits of decoding the
//! row (`E4M3[byte] * scale`) and applying [`crate::math::dot`], four rows at a time for one
//! position, with [`super::fp8_four`]'s decode (a sign extension, a shift, a mask and the
//! product with the scale per four weights) and loop.
//!
//! Lanes are `math::dot`'s: two f32x4 accumulators per row (lanes 0-3 and 4-7), `f32x4.mul`
//! then `f32x4.add` (wasm has no fused multiply-add outside relaxed SIMD), the tail (cols
//! mod 8) into lanes 0.., then [`reduce8`].

use std::arch::wasm32::*;

use super::fp8_four::{BITS, TWO_120};
use crate::math::reduce8;
use crate::tensor::E4M3;

/// Scale `b` of the row at `row`.
#[inline(always)]
unsafe fn scale(row: *const u8, b: usize) -> f32 {
    // SAFETY: the caller's scale b is readable.
    unsafe { f32::from_le_bytes(*(row.add(4 * b) as *const [u8; 4])) }
}

/// Whether none of the `n` bytes at `p` is an e4m3 NaN (`b | 0x80 == 0xff`).
///
/// SAFETY (caller): `n` bytes readable at `p`.
#[inline(always)]
unsafe fn nan_free(p: *const u8, n: usize) -> bool {
    // SAFETY: loads inside the caller's n bytes (16-byte steps below n, then single bytes).
    unsafe {
        let (top, ones) = (u8x16_splat(0x80), u8x16_splat(0xff));
        let mut hit = u8x16_splat(0);
        let mut i = 0;
        while i + 16 <= n {
            hit = v128_or(hit, u8x16_eq(v128_or(v128_load(p.add(i) as *const v128), top), ones));
            i += 16;
        }
        !v128_any_true(hit) && (i..n).all(|k| *p.add(k) | 0x80 != 0xff)
    }
}

/// Four e4m3 bytes (sign-extended into the lanes of `t`) times the scale (`s120` = scale
/// * 2^120): [`super::fp8_four`]'s decode.
#[inline(always)]
fn decode4(t: v128, s120: v128) -> v128 {
    f32x4_mul(v128_and(i32x4_shl(t, 20), u32x4_splat(BITS)), s120)
}

/// `out[i] = math::dot(decode(w[i]), x)` for four stored FP8 rows and one position; NaN
/// for a row holding a NaN byte.
///
/// SAFETY (caller): `block` a multiple of 8; each w[i] a whole row of `cols` values
/// (scales, then bytes) whose scales [`super::fp8_four`] takes; x holds `cols` f32.
pub unsafe fn dot4(w: [*const u8; 4], x: *const f32, cols: usize, block: usize) -> [f32; 4] {
    let nb = cols.div_ceil(block);
    let chunks = cols / 8;
    let per = block / 8;
    // SAFETY: every load reads inside the caller's rows and x (chunk c < chunks, scale
    // b < nb, bytes 8c..8c+8 <= cols); v128 loads have no alignment requirement.
    unsafe {
        let q = w.map(|r| r.add(4 * nb));
        let nan = q.map(|r| !nan_free(r, cols));
        let mut lo = [f32x4_splat(0.0); 4];
        let mut hi = [f32x4_splat(0.0); 4];
        for b in 0..nb {
            let s: [v128; 4] = std::array::from_fn(|i| f32x4_splat(scale(w[i], b) * TWO_120));
            for c in b * per..((b + 1) * per).min(chunks) {
                let x0 = v128_load(x.add(c * 8) as *const v128);
                let x1 = v128_load(x.add(c * 8 + 4) as *const v128);
                for i in 0..4 {
                    let h = i16x8_load_extend_i8x8(q[i].add(c * 8) as *const i8);
                    let w0 = decode4(i32x4_extend_low_i16x8(h), s[i]);
                    let w1 = decode4(i32x4_extend_high_i16x8(h), s[i]);
                    lo[i] = f32x4_add(lo[i], f32x4_mul(w0, x0));
                    hi[i] = f32x4_add(hi[i], f32x4_mul(w1, x1));
                }
            }
        }
        let mut out = [0.0f32; 4];
        for i in 0..4 {
            let mut acc = [0.0f32; 8];
            v128_store(acc.as_mut_ptr() as *mut v128, lo[i]);
            v128_store(acc.as_mut_ptr().add(4) as *mut v128, hi[i]);
            for k in chunks * 8..cols {
                acc[k - chunks * 8] += E4M3[*q[i].add(k) as usize] * scale(w[i], k / block) * *x.add(k);
            }
            out[i] = if nan[i] { f32::NAN } else { reduce8(acc) };
        }
        out
    }
}
