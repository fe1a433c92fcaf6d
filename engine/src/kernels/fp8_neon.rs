//! aarch64 NEON path of FP8 weights (block-scaled e4m3 rows, tensor.rs): the bits of
//! decoding the row (`E4M3[byte] * scale`) and applying [`crate::math::dot`], the decode
//! done in registers, four rows at a time for one position.
//!
//! The decode, four bytes per vector, with integers only (Rust's f16 vector types are not
//! stable, so no `fcvtl`): for `t = byte & 0x7f` with exponent `e = t >> 3` and mantissa
//! `m = t & 7`, a normal value's f32 bits are `(t << 20) + (120 << 23)` exactly; a subnormal
//! (`e = 0`) is `f32(m) * 2^-9`, exact; the sign bit is put on the magnitude, then the
//! product with the block's scale rounds once: the reference's bits. NaN bytes (0x7f, 0xff)
//! become NaN (all bits set) after the product, as on x86.
//!
//! Lanes are [`crate::math::dot`]'s: two float32x4 accumulators per row (lanes 0-3 and
//! 4-7), each product and sum rounded on its own (`fmul` then `fadd`, never `fmla`), the
//! tail (cols mod 8) added to lanes 0.. as there, then [`reduce8`]. Only blocks that are a
//! multiple of 8 columns come here ([`super::fp8_x86`]'s rule: `takes`).

use std::arch::aarch64::*;

use crate::math::reduce8;
use crate::tensor::E4M3;

/// Whether [`dot4`] takes a matrix of `block`-column scale blocks.
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
fn decode4(t: uint32x4_t, s: float32x4_t) -> float32x4_t {
    // SAFETY: NEON is part of aarch64's baseline; register operations only.
    unsafe {
        let mag = vandq_u32(t, vdupq_n_u32(0x7f));
        let normal = vaddq_u32(vshlq_n_u32::<20>(mag), vdupq_n_u32(120 << 23));
        let sub = vmulq_f32(vcvtq_f32_u32(vandq_u32(mag, vdupq_n_u32(7))), vdupq_n_f32(1.0 / 512.0));
        let is_sub = vceqq_u32(vshrq_n_u32::<3>(mag), vdupq_n_u32(0));
        let bits = vbslq_u32(is_sub, vreinterpretq_u32_f32(sub), normal);
        let signed = vorrq_u32(bits, vshlq_n_u32::<24>(vandq_u32(t, vdupq_n_u32(0x80))));
        let w = vmulq_f32(vreinterpretq_f32_u32(signed), s);
        let nan = vceqq_u32(mag, vdupq_n_u32(0x7f));
        vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(w), nan))
    }
}

/// `out[i] = math::dot(decode(w[i]), x)` for four stored FP8 rows and one position.
///
/// SAFETY (caller): [`takes`]`(block)`; each w[i] a whole row of `cols` values (scales,
/// then bytes); x holds `cols` f32.
pub unsafe fn dot4(w: [*const u8; 4], x: *const f32, cols: usize, block: usize) -> [f32; 4] {
    let nb = cols.div_ceil(block);
    let chunks = cols / 8;
    let per = block / 8;
    // SAFETY: every load reads inside the caller's rows and x (chunk c < chunks, scale
    // b < nb, bytes 8c..8c+8 <= cols).
    unsafe {
        let q = w.map(|r| r.add(4 * nb));
        let mut lo = [vdupq_n_f32(0.0); 4];
        let mut hi = [vdupq_n_f32(0.0); 4];
        for b in 0..nb {
            let s: [float32x4_t; 4] = std::array::from_fn(|i| vdupq_n_f32(scale(w[i], b)));
            for c in b * per..((b + 1) * per).min(chunks) {
                let (x0, x1) = (vld1q_f32(x.add(c * 8)), vld1q_f32(x.add(c * 8 + 4)));
                for i in 0..4 {
                    let h = vmovl_u8(vld1_u8(q[i].add(c * 8)));
                    let w0 = decode4(vmovl_u16(vget_low_u16(h)), s[i]);
                    let w1 = decode4(vmovl_high_u16(h), s[i]);
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
