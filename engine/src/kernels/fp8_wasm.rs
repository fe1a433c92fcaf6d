//! wasm SIMD128 path of FP8 weights (the browser's CPU backend): [`super::fp8_neon`]'s
//! kernel with SIMD128's operations, the same bits as decoding the row (`E4M3[byte] *
//! scale`) and applying [`crate::math::dot`].
//!
//! The decode, four bytes per vector, with integers only: for `t = byte & 0x7f` (exponent
//! `t >> 3`, mantissa `m = t & 7`) a normal value's f32 bits are `(t << 20) + (120 << 23)`
//! exactly, a subnormal is `f32(m) * 2^-9` exactly; the sign bit goes on the magnitude and
//! the product with the block's scale rounds once. NaN bytes become NaN after the product.
//! Lanes are `math::dot`'s: two f32x4 accumulators per row (lanes 0-3 and 4-7), `f32x4.mul`
//! then `f32x4.add` (wasm has no fused multiply-add outside relaxed SIMD), the tail (cols
//! mod 8) into lanes 0.., then [`reduce8`].

use std::arch::wasm32::*;

use crate::math::reduce8;
use crate::tensor::E4M3;

/// Whether [`rows`] takes a matrix of `block`-column scale blocks.
pub fn takes(block: usize) -> bool {
    block > 0 && block.is_multiple_of(8)
}

/// Scale `b` of the row at `row`.
#[inline(always)]
unsafe fn scale(row: *const u8, b: usize) -> f32 {
    // SAFETY: the caller's scale b is readable.
    unsafe { f32::from_le_bytes(*(row.add(4 * b) as *const [u8; 4])) }
}

/// Four e4m3 values (the low 8 bits of `t`'s lanes) times the scale `s`, NaN bytes NaN.
#[inline(always)]
fn decode4(t: v128, s: v128) -> v128 {
    let mag = v128_and(t, u32x4_splat(0x7f));
    let normal = i32x4_add(u32x4_shl(mag, 20), u32x4_splat(120 << 23));
    let sub = f32x4_mul(f32x4_convert_u32x4(v128_and(mag, u32x4_splat(7))), f32x4_splat(1.0 / 512.0));
    let is_sub = i32x4_eq(u32x4_shr(mag, 3), u32x4_splat(0));
    let bits = v128_bitselect(sub, normal, is_sub);
    let signed = v128_or(bits, u32x4_shl(v128_and(t, u32x4_splat(0x80)), 24));
    let w = f32x4_mul(signed, s);
    v128_or(w, i32x4_eq(mag, u32x4_splat(0x7f)))
}

/// `out[i] = math::dot(decode(w[i]), x)` for four stored FP8 rows and one position.
///
/// SAFETY (caller): [`takes`]`(block)`; each w[i] a whole row of `cols` values (scales,
/// then bytes); x holds `cols` f32.
unsafe fn dot4(w: [*const u8; 4], x: *const f32, cols: usize, block: usize) -> [f32; 4] {
    let nb = cols.div_ceil(block);
    let chunks = cols / 8;
    let per = block / 8;
    // SAFETY: every load reads inside the caller's rows and x (chunk c < chunks, scale
    // b < nb, bytes 8c..8c+8 <= cols); v128 loads have no alignment requirement.
    unsafe {
        let q = w.map(|r| r.add(4 * nb));
        let mut lo = [f32x4_splat(0.0); 4];
        let mut hi = [f32x4_splat(0.0); 4];
        for b in 0..nb {
            let s: [v128; 4] = std::array::from_fn(|i| f32x4_splat(scale(w[i], b)));
            for c in b * per..((b + 1) * per).min(chunks) {
                let x0 = v128_load(x.add(c * 8) as *const v128);
                let x1 = v128_load(x.add(c * 8 + 4) as *const v128);
                for i in 0..4 {
                    let h = u16x8_load_extend_u8x8(q[i].add(c * 8));
                    let w0 = decode4(u32x4_extend_low_u16x8(h), s[i]);
                    let w1 = decode4(u32x4_extend_high_u16x8(h), s[i]);
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
            out[i] = reduce8(acc);
        }
        out
    }
}

/// Rows `r0..r1` of the FP8 matrix `w` (scale blocks of `block` columns, [`takes`]) times
/// one position `x`, into `out[r0..r1]`: fours through [`dot4`], the rest decoded and
/// applied with [`crate::math::dot`] (the same bits).
pub fn rows(w: &crate::tensor::Mat, block: usize, x: &[f32], r0: usize, r1: usize, out: &mut [f32]) {
    let (cols, rb) = (w.cols, w.row_bytes());
    let bytes = w.bytes.as_ref();
    let whole = bytes.len() >= r1 * rb && x.len() >= cols && out.len() >= r1 - r0;
    let mut r = r0;
    if whole {
        let row = |k: usize| bytes[k * rb..].as_ptr();
        while r + 4 <= r1 {
            // SAFETY: rows r..r+4 < r1 lie inside `bytes` (rb each), x holds cols values.
            let v = unsafe { dot4([row(r), row(r + 1), row(r + 2), row(r + 3)], x.as_ptr(), cols, block) };
            out[r - r0..r - r0 + 4].copy_from_slice(&v);
            r += 4;
        }
    }
    let mut buf = vec![0.0f32; cols];
    for k in r..r1 {
        w.row_into(k, &mut buf);
        out[k - r0] = crate::math::dot(&buf, &x[..cols]);
    }
}
