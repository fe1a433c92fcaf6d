//! wasm SIMD128 path of [`super::dot_row`]: values widened to i16 and summed with
//! `i32x4.dot_i16x8_s` (exact), or int4 nibbles times int8 activations with relaxed SIMD's
//! `i32x4.relaxed_dot_i8x16_i7x16_add_s` where the build enables it (exact for nibbles);
//! the float combination as in the reference, four blocks per f32x4 (lane l of the first
//! vector is acc[8k + l], of the second acc[8k + 4 + l]: the reference's order).

use core::arch::wasm32::*;

use super::{padded, round4, scale, ActQ, CHUNK};
use crate::math::reduce8;

/// Bytes `[at, at + 16)` of `src`, zero-filled past its end (`CHECKED`; unchecked, the
/// caller has made sure the bytes are inside `src`).
#[inline(always)]
fn load16<const CHECKED: bool>(src: &[u8], at: usize) -> v128 {
    if !CHECKED || at + 16 <= src.len() {
        // SAFETY: the 16 bytes are inside `src`; v128.load has no alignment requirement.
        unsafe { v128_load(src.as_ptr().add(at) as *const v128) }
    } else {
        let buf = padded::<16>(src, at);
        // SAFETY: `buf` holds 16 bytes.
        unsafe { v128_load(buf.as_ptr() as *const v128) }
    }
}

/// Activations `[at, at + 16)`; `CHECKED` as for [`load16`].
#[inline(always)]
fn load_q<const CHECKED: bool>(q: &[i8], at: usize) -> v128 {
    if CHECKED {
        let s = &q[at..at + 16];
        // SAFETY: `s` holds 16 bytes (the slice above is bounds-checked).
        unsafe { v128_load(s.as_ptr() as *const v128) }
    } else {
        // SAFETY: the caller checked that q holds every block's values.
        unsafe { v128_load(q.as_ptr().add(at) as *const v128) }
    }
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
    // Rows whose values fill whole chunks (every shape of a real model) skip the
    // per-load bounds checks.
    let (g, blocks) = (a.group, a.blocks);
    let need = if int4 { blocks * g / 2 } else { blocks * g };
    let inside = row.len() >= round4(blocks * 2) + need && a.qrow(p).len() >= blocks * g;
    match (int4, inside) {
        (true, true) => body::<true, false>(row, a, p),
        (true, false) => body::<true, true>(row, a, p),
        (false, true) => body::<false, false>(row, a, p),
        (false, false) => body::<false, true>(row, a, p),
    }
}

/// The integer sum of block `b` (int4: without the -8 correction) as four partial lanes.
#[inline(always)]
fn block_lanes<const INT4: bool, const CHECKED: bool>(vals: &[u8], q: &[i8], b: usize, g: usize) -> v128 {
    let mut sum = i32x4_splat(0);
    for k in 0..g / CHUNK {
        let c = b * g + k * CHUNK;
        let (x0, x1) = (load_q::<CHECKED>(q, c), load_q::<CHECKED>(q, c + 16));
        if INT4 {
            let bytes = load16::<CHECKED>(vals, c / 2);
            sum = nibbles16(sum, v128_and(bytes, u8x16_splat(15)), x0);
            sum = nibbles16(sum, u8x16_shr(bytes, 4), x1);
        } else {
            let (w0, w1) = (load16::<CHECKED>(vals, c), load16::<CHECKED>(vals, c + 16));
            sum = dot16(sum, i16x8_extend_low_i8x16(w0), i16x8_extend_high_i8x16(w0), x0);
            sum = dot16(sum, i16x8_extend_low_i8x16(w1), i16x8_extend_high_i8x16(w1), x1);
        }
    }
    sum
}

/// [sum of s0's lanes, s1's, s2's, s3's]: integer adds, exact in any order.
#[inline(always)]
fn hsum4(s0: v128, s1: v128, s2: v128, s3: v128) -> v128 {
    let t0 = i32x4_add(i32x4_shuffle::<0, 4, 1, 5>(s0, s1), i32x4_shuffle::<2, 6, 3, 7>(s0, s1));
    let t1 = i32x4_add(i32x4_shuffle::<0, 4, 1, 5>(s2, s3), i32x4_shuffle::<2, 6, 3, 7>(s2, s3));
    i32x4_add(i32x4_shuffle::<0, 1, 4, 5>(t0, t1), i32x4_shuffle::<2, 3, 6, 7>(t0, t1))
}

/// The f16 scales of blocks `b..b + 4` of a stored row as f32, with the bits of
/// `half::f16::to_f32` (the software conversion wasm uses): exponent and mantissa shifted
/// into place and multiplied by 2^112, which is exact for normal and subnormal values;
/// infinities and NaNs (exponent 31) get f32's all-ones exponent, NaNs their quiet bit.
#[inline(always)]
fn scales4(row: &[u8], b: usize) -> v128 {
    let bytes = &row[2 * b..2 * b + 8];
    // SAFETY: `bytes` holds the 8 bytes read (the slice above is bounds-checked).
    let h = u32x4_extend_low_u16x8(unsafe { v128_load64_zero(bytes.as_ptr() as *const u64) });
    let sign = i32x4_shl(v128_and(h, i32x4_splat(0x8000)), 16);
    let em = v128_and(h, i32x4_splat(0x7fff));
    let finite = f32x4_mul(i32x4_shl(em, 13), f32x4_splat(f32::from_bits(0x7780_0000)));
    let man = i32x4_shl(v128_and(em, i32x4_splat(0x3ff)), 13);
    let quiet = v128_and(v128_not(i32x4_eq(man, i32x4_splat(0))), i32x4_splat(0x40_0000));
    let special = v128_or(v128_or(i32x4_splat(0x7f80_0000), man), quiet);
    let is_special = i32x4_ge(em, i32x4_splat(0x7c00));
    v128_or(sign, v128_bitselect(special, finite, is_special))
}

/// Four blocks per step: their integer sums gathered into one vector, then
/// (ws_b * d_b) * f32(isum_b) for the four at once, added to acc lanes b mod 8 (blocks
/// 8k..8k+4 in the first vector, 8k+4..8k+8 in the second): the reference's products and
/// per-lane order. The blocks after the last multiple of four run one at a time.
#[inline(always)]
fn body<const INT4: bool, const CHECKED: bool>(row: &[u8], a: &ActQ, p: usize) -> f32 {
    let (g, blocks) = (a.group, a.blocks);
    let vals = &row[round4(blocks * 2)..];
    let (q, d, s) = (a.qrow(p), a.drow(p), a.srow(p));
    let mut acc = [f32x4_splat(0.0); 2];
    let full = blocks / 4 * 4;
    let mut b = 0;
    while b < full {
        let s0 = block_lanes::<INT4, CHECKED>(vals, q, b, g);
        let s1 = block_lanes::<INT4, CHECKED>(vals, q, b + 1, g);
        let s2 = block_lanes::<INT4, CHECKED>(vals, q, b + 2, g);
        let s3 = block_lanes::<INT4, CHECKED>(vals, q, b + 3, g);
        let mut isum = hsum4(s0, s1, s2, s3);
        let (dq, sq) = (&d[b..b + 4], &s[b..b + 4]);
        if INT4 {
            // SAFETY: `sq` holds 4 i32 (bounds-checked slice); v128.load is unaligned.
            isum = i32x4_sub(isum, i32x4_shl(unsafe { v128_load(sq.as_ptr() as *const v128) }, 3));
        }
        // SAFETY: `dq` holds 4 f32 (bounds-checked slice).
        let db = unsafe { v128_load(dq.as_ptr() as *const v128) };
        let prod = f32x4_mul(f32x4_mul(scales4(row, b), db), f32x4_convert_i32x4(isum));
        let k = (b / 4) & 1;
        acc[k] = f32x4_add(acc[k], prod);
        b += 4;
    }
    let mut out = [0.0f32; 8];
    // SAFETY: `out` holds 8 f32; v128.store has no alignment requirement.
    unsafe {
        v128_store(out.as_mut_ptr() as *mut v128, acc[0]);
        v128_store(out.as_mut_ptr().add(4) as *mut v128, acc[1]);
    }
    for b in full..blocks {
        let v = block_lanes::<INT4, CHECKED>(vals, q, b, g);
        let mut isum = i32x4_extract_lane::<0>(v)
            + i32x4_extract_lane::<1>(v)
            + i32x4_extract_lane::<2>(v)
            + i32x4_extract_lane::<3>(v);
        if INT4 {
            isum -= 8 * s[b];
        }
        out[b % 8] += (scale(row, b) * d[b]) * isum as f32;
    }
    reduce8(out)
}
