//! aarch64 NEON path of FP8 weights (block-scaled e4m3 rows, tensor.rs): the bits of
//! decoding the row (`E4M3[byte] * scale`) and applying [`crate::math::dot`], the decode
//! done in registers, four rows at a time for one position.
//!
//! The decode is [`super::fp8_four`]'s (a sign extension, a shift, a mask and the product
//! with the scale per four weights; Rust's f16 vector types are not stable, so no `fcvtl`).
//! aarch64 multiplies f32 subnormals at full speed on the cores we know of (no microcode
//! assist); with FPCR.FZ clear, as Linux and macOS leave it, they are exact.
//!
//! Lanes are [`crate::math::dot`]'s: two float32x4 accumulators per row (lanes 0-3 and
//! 4-7), each product and sum rounded on its own (`fmul` then `fadd`, never `fmla`), the
//! tail (cols mod 8) added to lanes 0.. as there, then [`reduce8`]. Only blocks that are a
//! multiple of 8 columns come here ([`super::fp8_x86`]'s rule: `takes`).

use std::arch::aarch64::*;

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
        let (top, ones) = (vdupq_n_u8(0x80), vdupq_n_u8(0xff));
        let mut hit = vdupq_n_u8(0);
        let mut i = 0;
        while i + 16 <= n {
            hit = vorrq_u8(hit, vceqq_u8(vorrq_u8(vld1q_u8(p.add(i)), top), ones));
            i += 16;
        }
        vmaxvq_u8(hit) == 0 && (i..n).all(|k| *p.add(k) | 0x80 != 0xff)
    }
}

/// Four e4m3 bytes (sign-extended into the lanes of `t`) times the scale (`s120` = scale
/// * 2^120): [`super::fp8_four`]'s decode.
#[inline(always)]
fn decode4(t: int32x4_t, s120: float32x4_t) -> float32x4_t {
    // SAFETY: NEON is part of aarch64's baseline; register operations only.
    unsafe {
        let bits = vandq_u32(vreinterpretq_u32_s32(vshlq_n_s32::<20>(t)), vdupq_n_u32(BITS));
        vmulq_f32(vreinterpretq_f32_u32(bits), s120)
    }
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
    // b < nb, bytes 8c..8c+8 <= cols).
    unsafe {
        let q = w.map(|r| r.add(4 * nb));
        let nan = q.map(|r| !nan_free(r, cols));
        let mut lo = [vdupq_n_f32(0.0); 4];
        let mut hi = [vdupq_n_f32(0.0); 4];
        for b in 0..nb {
            let s: [float32x4_t; 4] = std::array::from_fn(|i| vdupq_n_f32(scale(w[i], b) * TWO_120));
            for c in b * per..((b + 1) * per).min(chunks) {
                let (x0, x1) = (vld1q_f32(x.add(c * 8)), vld1q_f32(x.add(c * 8 + 4)));
                for i in 0..4 {
                    let h = vmovl_s8(vld1_s8(q[i].add(c * 8) as *const i8));
                    let w0 = decode4(vmovl_s16(vget_low_s16(h)), s[i]);
                    let w1 = decode4(vmovl_high_s16(h), s[i]);
                    lo[i] = vaddq_f32(lo[i], vmulq_f32(w0, x0));
                    hi[i] = vaddq_f32(hi[i], vmulq_f32(w1, x1));
                }
            }
        }
        let mut out = [0.0f32; 4];
        for i in 0..4 {
            let mut acc = [0.0f32; 8];
            vst1q_f32(acc.as_mut_ptr(), lo[i]);
            vst1q_f32(acc.as_mut_ptr().add(4), hi[i]);
            for k in chunks * 8..cols {
                acc[k - chunks * 8] += E4M3[*q[i].add(k) as usize] * scale(w[i], k / block) * *x.add(k);
            }
            out[i] = if nan[i] { f32::NAN } else { reduce8(acc) };
        }
        out
    }
}
