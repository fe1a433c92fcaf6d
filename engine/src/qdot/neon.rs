//! aarch64 NEON path of [`super::dot_row`]: the integer block sums with `sdot` (the dotprod
//! extension: four products per 32-bit lane, detected at run time) or, on cores without
//! it, widening `smull` products accumulated pairwise (`sadalp`); the float combination as
//! in the reference, four blocks per float32x4 (lane l of the first accumulator is
//! acc[8k + l], of the second acc[8k + 4 + l]: the reference's order), separate multiplies
//! and adds (no `fmla`), so the bits are the reference's. Q4K rows (`ActQ::k4`) take the
//! int4 sums and the reference's Q4K step ([`k4_scales8`]); Q5K rows (`ActQ::k5`) the same
//! with each nibble's fifth bit ORed in as 16 before the multiply ([`fifth16`]: u <= 31,
//! still a positive int8 for `sdot` and `smull`).
//!
//! `sdot` is written with `asm!`: Rust's `vdotq_s32` is not stable yet (rust#117224).

use std::arch::aarch64::*;
use std::arch::asm;

use super::{round4, scale, ActQ, CHUNK, K4_INDEX, K4_SHIFT};
use crate::math::reduce8;

pub fn has_dotprod() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

/// acc lane k + the four products of bytes 4k..4k + 4 of `a` and `b` (signed).
///
/// # Safety
/// The CPU must have the dotprod extension (callers are `#[target_feature(enable =
/// "dotprod")]` functions reached only after [`has_dotprod`]).
#[inline(always)]
pub(super) unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: register-only instruction; the caller guarantees the extension.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// acc + the 16 products of `a` and `b` spread over the four lanes (which products land
/// in which lane differs from [`sdot`]; only the sum of the lanes is used). A product is
/// at most 127 * 128 in magnitude, so the i16 products and the pairwise i32 sums are exact.
#[inline(always)]
fn mull(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: NEON is part of the aarch64 baseline; register-only intrinsics.
    unsafe {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

/// Whether these kernels take Q5K activations `a` (`ActQ::k5`): split, group 32, whole
/// runs of eight blocks (`cols` a multiple of 256), `ds` made. One position reads `q`, many
/// the interleaved layout where it is made (`neon_tile::fits`).
pub fn k5_takes(a: &ActQ) -> bool {
    a.k5_whole()
}

/// One row times one position (see [`super::dot_row`]); rows and activations that do not
/// hold every block's values (a last partial block) use the reference.
///
/// # Safety
/// `dotprod` only where [`has_dotprod`] said so.
pub unsafe fn dot_row_neon(dotprod: bool, int4: bool, row: &[u8], a: &ActQ, p: usize) -> f32 {
    let (g, blocks) = (a.group, a.blocks);
    let need = if int4 { blocks * g / 2 } else { blocks * g };
    // Q5K rows hold 32 fifth-bit bytes per run of eight blocks after the nibbles.
    let need = if int4 && a.k5 { need + blocks * 4 } else { need };
    let inside = row.len() >= round4(blocks * 2) + need
        && a.qrow(p).len() >= blocks * g
        && a.drow(p).len() >= blocks.div_ceil(4) * 4
        && a.srow(p).len() >= blocks.div_ceil(4) * 4;
    if !inside || g == 0 || !g.is_multiple_of(CHUNK) {
        return super::dot_row_scalar(int4, row, a, p);
    }
    if int4 && a.k4 && (g != 32 || a.ds.len() < (p + 1) * a.dstride()) {
        return super::dot_row_scalar(int4, row, a, p);
    }
    if int4 && a.k5 && !k5_takes(a) {
        return super::dot_row_scalar(int4, row, a, p);
    }
    match (dotprod, int4, a.k4, a.k5) {
        // SAFETY: `dotprod` only with the extension (the caller's contract); the shapes
        // were checked above.
        (true, true, true, true) => unsafe { body_dot::<true, true, true>(row, a, p) },
        // SAFETY: as above.
        (true, true, true, false) => unsafe { body_dot::<true, true, false>(row, a, p) },
        // SAFETY: as above.
        (true, true, false, _) => unsafe { body_dot::<true, false, false>(row, a, p) },
        // SAFETY: as above.
        (true, false, _, _) => unsafe { body_dot::<false, false, false>(row, a, p) },
        // SAFETY: the shapes were checked above.
        (false, true, true, true) => unsafe { body::<true, false, true, true>(row, a, p) },
        // SAFETY: as above.
        (false, true, true, false) => unsafe { body::<true, false, true, false>(row, a, p) },
        // SAFETY: as above.
        (false, true, false, _) => unsafe { body::<true, false, false, false>(row, a, p) },
        // SAFETY: as above.
        (false, false, _, _) => unsafe { body::<false, false, false, false>(row, a, p) },
    }
}

#[target_feature(enable = "dotprod")]
unsafe fn body_dot<const INT4: bool, const K: bool, const K5: bool>(row: &[u8], a: &ActQ, p: usize) -> f32 {
    // SAFETY: the caller's contract (dotprod present, shapes checked).
    unsafe { body::<INT4, true, K, K5>(row, a, p) }
}

/// A Q4K header's factors (A, B of tensor::q4k_scales) for blocks 0-3 and 4-7 of its run:
/// per half, one table lookup puts in lane l the two bytes holding sc_j (j = 4h + l, bit 6j
/// of the header's string) and, above them, the two holding m_j (bit 48 + 6j: the same
/// offset in its byte), one shift per lane brings both to bit 0 of their halves; d and
/// dmin convert once, as `half` does; the products d * sc and dmin * m are exact.
#[inline(always)]
pub(super) fn k4_scales8(head: &[u8]) -> [(float32x4_t, float32x4_t); 2] {
    let head = &head[..16];
    let half = |i: usize| half::f16::from_bits(u16::from_le_bytes([head[i], head[i + 1]])).to_f32();
    let (d, dmin) = (half(0), half(2));
    // SAFETY: `head` and each half of the table hold 16 bytes, K4_SHIFT 4 u32; NEON is baseline.
    [0, 1].map(|h| unsafe {
        let w = vreinterpretq_u32_u8(vqtbl1q_u8(vld1q_u8(head.as_ptr()), vld1q_u8(K4_INDEX[16 * h..].as_ptr())));
        // A negative count shifts right.
        let w = vshlq_u32(w, vnegq_s32(vreinterpretq_s32_u32(vld1q_u32(K4_SHIFT.as_ptr()))));
        let six = vdupq_n_u32(63);
        let (sc, m) = (vandq_u32(w, six), vandq_u32(vshrq_n_u32::<16>(w), six));
        (vmulq_f32(vdupq_n_f32(d), vcvtq_f32_u32(sc)), vmulq_f32(vdupq_n_f32(dmin), vcvtq_f32_u32(m)))
    })
}

/// The fifth bits of block `b` of a Q5K row (`high`: the row's fifth-bit bytes, 32 per run
/// of eight blocks, tensor::q5k_bit) as 0x10 bytes over the block's 16 nibble bytes: (for
/// the low nibbles, for the high ones). Sub-block j = b mod 8 keeps those of nibble byte m
/// in byte 16 (j / 4) + m, bits 2 (j mod 4) and 2 (j mod 4) + 1: a per-byte shift right by
/// 2 (j mod 4) brings them to bits 0 and 1, shifts left by 4 and 3 to bit 4, the mask's.
///
/// # Safety
/// `high` holds the fifth-bit bytes of block `b`'s run.
#[inline(always)]
pub(super) unsafe fn fifth16(high: &[u8], b: usize) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: the 16 bytes read are inside `high` (the caller's contract); NEON is baseline.
    unsafe {
        let h = vld1q_u8(high.as_ptr().add(32 * (b / 8) + 16 * (b % 8 / 4)));
        // A negative count shifts right.
        let h = vshlq_u8(h, vdupq_n_s8(-2 * (b % 4) as i8));
        let five = vdupq_n_u8(0x10);
        (vandq_u8(vshlq_n_u8::<4>(h), five), vandq_u8(vshlq_n_u8::<3>(h), five))
    }
}

/// The integer sum of block `b` (int4: without the -8 correction) as four partial lanes.
/// `K5` (int4, group 32): a Q5K row, `high` its fifth-bit bytes ([`fifth16`]); u <= 31
/// times |q| <= 127, so `sdot`'s and `smull`'s products, all positive-int8 weights, are
/// exact as for int4, and a block's sum is at most 31 * 127 * 32 < 2^17.
///
/// # Safety
/// `vals` holds the block's stored values and `q` its activations (`K5`: `high` its fifth
/// bits); `DOT` needs dotprod.
#[inline(always)]
unsafe fn block_lanes<const INT4: bool, const DOT: bool, const K5: bool>(
    vals: &[u8],
    high: &[u8],
    q: &[i8],
    b: usize,
    g: usize,
) -> int32x4_t {
    // SAFETY: every load below is inside `vals` / `q` / `high` (the caller checked the shapes).
    unsafe {
        let mut sum = vdupq_n_s32(0);
        for k in 0..g / CHUNK {
            let c = b * g + k * CHUNK;
            let (x0, x1) = (vld1q_s8(q.as_ptr().add(c)), vld1q_s8(q.as_ptr().add(c + 16)));
            let (w0, w1) = if INT4 {
                // Low nibbles pair with the chunk's even values (x0), high with the odd (x1).
                let bytes = vld1q_u8(vals.as_ptr().add(c / 2));
                let (mut lo, mut hi) = (vandq_u8(bytes, vdupq_n_u8(15)), vshrq_n_u8::<4>(bytes));
                if K5 {
                    let (l5, h5) = fifth16(high, b);
                    (lo, hi) = (vorrq_u8(lo, l5), vorrq_u8(hi, h5));
                }
                (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
            } else {
                (vld1q_s8(vals.as_ptr().add(c) as *const i8), vld1q_s8(vals.as_ptr().add(c + 16) as *const i8))
            };
            sum = if DOT { sdot(sdot(sum, w0, x0), w1, x1) } else { mull(mull(sum, w0, x0), w1, x1) };
        }
        sum
    }
}

/// The f16 scales of blocks `b..b + 4` of a stored row as f32, the bits of the reference's
/// conversion: exponent and mantissa shifted into place and multiplied by 2^112 (exact for
/// normal and subnormal values; aarch64 Linux keeps subnormals), infinities and NaNs
/// (exponent 31) given f32's all-ones exponent, NaNs their quiet bit.
#[inline(always)]
pub(super) fn scales4(row: &[u8], b: usize) -> float32x4_t {
    let bytes = &row[2 * b..2 * b + 8];
    // SAFETY: `bytes` holds the 8 bytes read (bounds-checked slice); NEON is baseline.
    unsafe {
        let h = vmovl_u16(vreinterpret_u16_u8(vld1_u8(bytes.as_ptr())));
        let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
        let em = vandq_u32(h, vdupq_n_u32(0x7fff));
        let finite = vmulq_f32(vreinterpretq_f32_u32(vshlq_n_u32::<13>(em)), vdupq_n_f32(f32::from_bits(0x7780_0000)));
        let is_special = vcgeq_u32(em, vdupq_n_u32(0x7c00));
        if vmaxvq_u32(is_special) == 0 {
            return vreinterpretq_f32_u32(vorrq_u32(sign, vreinterpretq_u32_f32(finite)));
        }
        let man = vshlq_n_u32::<13>(vandq_u32(em, vdupq_n_u32(0x3ff)));
        let quiet = vandq_u32(vmvnq_u32(vceqq_u32(man, vdupq_n_u32(0))), vdupq_n_u32(0x40_0000));
        let special = vorrq_u32(vorrq_u32(vdupq_n_u32(0x7f80_0000), man), quiet);
        vreinterpretq_f32_u32(vorrq_u32(sign, vbslq_u32(is_special, special, vreinterpretq_u32_f32(finite))))
    }
}

/// Four blocks per step: their integer sums gathered into one vector by two pairwise adds,
/// then (ws_b * d_b) * f32(isum_b) for the four at once, added to acc lanes b mod 8; the
/// blocks after the last multiple of four one at a time (as the wasm path does). `K`: a Q4K
/// row (whole runs of eight blocks of 32): (A_b * d_b) * f32(isum_b) - B_b * ds_b; `K5`
/// (with `K`): a Q5K row, the same with its fifth bits.
///
/// # Safety
/// The shapes checked by [`dot_row_neon`]; `DOT` needs dotprod.
#[inline(always)]
unsafe fn body<const INT4: bool, const DOT: bool, const K: bool, const K5: bool>(
    row: &[u8],
    a: &ActQ,
    p: usize,
) -> f32 {
    let (g, blocks) = (a.group, a.blocks);
    let vals = &row[round4(blocks * 2)..];
    // Q5K: the fifth-bit bytes after the nibbles (inside the row: checked by dot_row_neon).
    let high = if K5 { &vals[blocks * CHUNK / 2..] } else { &[][..] };
    let (q, d, s) = (a.qrow(p), a.drow(p), a.srow(p));
    let ds = if K { &a.ds[p * a.dstride()..(p + 1) * a.dstride()] } else { &[][..] };
    let full = blocks / 4 * 4;
    let mut out = [0.0f32; 8];
    // SAFETY: block loads inside `vals` / `q` (caller), `d` and `s` hold whole fours of
    // blocks (checked by dot_row_neon), `out` holds 8 f32.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 2];
        let mut b = 0;
        // Q4K: whole runs of eight blocks (its rows have no other), each header decoded once.
        while K && b + 8 <= blocks {
            for (k, (am, bm)) in k4_scales8(&row[2 * b..2 * b + 16]).into_iter().enumerate() {
                let c = b + 4 * k;
                let s0 = block_lanes::<INT4, DOT, K5>(vals, high, q, c, g);
                let s1 = block_lanes::<INT4, DOT, K5>(vals, high, q, c + 1, g);
                let s2 = block_lanes::<INT4, DOT, K5>(vals, high, q, c + 2, g);
                let s3 = block_lanes::<INT4, DOT, K5>(vals, high, q, c + 3, g);
                let isum = vpaddq_s32(vpaddq_s32(s0, s1), vpaddq_s32(s2, s3));
                let t1 = vmulq_f32(vmulq_f32(am, vld1q_f32(d[c..c + 4].as_ptr())), vcvtq_f32_s32(isum));
                acc[k] = vaddq_f32(acc[k], vsubq_f32(t1, vmulq_f32(bm, vld1q_f32(ds[c..c + 4].as_ptr()))));
            }
            b += 8;
        }
        while b < full {
            let s0 = block_lanes::<INT4, DOT, K5>(vals, high, q, b, g);
            let s1 = block_lanes::<INT4, DOT, K5>(vals, high, q, b + 1, g);
            let s2 = block_lanes::<INT4, DOT, K5>(vals, high, q, b + 2, g);
            let s3 = block_lanes::<INT4, DOT, K5>(vals, high, q, b + 3, g);
            let mut isum = vpaddq_s32(vpaddq_s32(s0, s1), vpaddq_s32(s2, s3));
            let k = (b / 4) & 1;
            if INT4 {
                isum = vsubq_s32(isum, vshlq_n_s32::<3>(vld1q_s32(s.as_ptr().add(b))));
            }
            let db = vld1q_f32(d.as_ptr().add(b));
            let prod = vmulq_f32(vmulq_f32(scales4(row, b), db), vcvtq_f32_s32(isum));
            acc[k] = vaddq_f32(acc[k], prod);
            b += 4;
        }
        vst1q_f32(out.as_mut_ptr(), acc[0]);
        vst1q_f32(out.as_mut_ptr().add(4), acc[1]);
        for b in full..blocks {
            let mut isum = vaddvq_s32(block_lanes::<INT4, DOT, K5>(vals, high, q, b, g));
            if INT4 {
                isum -= 8 * s[b];
            }
            out[b % 8] += (scale(row, b) * d[b]) * isum as f32;
        }
    }
    reduce8(out)
}
