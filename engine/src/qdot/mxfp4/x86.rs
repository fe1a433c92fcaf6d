//! x86-64 paths of [`super::dot_row`]: AVX2 (`vpmaddubsw`) and AVX-512 VNNI (`vpdpbusd` on
//! 256-bit vectors), both on the byte planes of [`ActQ16::planes`].
//!
//! One 32-byte load holds the nibbles of two adjacent blocks (16 bytes each). Its low
//! nibbles are both blocks' even values and its high nibbles their odd values, in the
//! order of the planes; one `pshufb` each turns them into w = k + 12 (0..=24, unsigned,
//! [`TABLE`]), k the doubled value of [`MXFP4_DOUBLED`]. With h = 256 * hh + hl (hh signed
//! -128..=127, hl unsigned 0..=255) the block sums are exact integer identities:
//!
//!   sum k * h = 256 * sum w * hh + sum hl * w - 12 * sum h
//!
//! (the last term is [`ActQ16::corr`], made when the activations are quantized), and the
//! same for l. Every multiply is an unsigned byte times a signed byte: w (u8) * hh (s8), and
//! hl (u8) * w (s8: w <= 24 < 128).
//!
//! Bounds (all exact, nothing wraps or saturates):
//! - `vpdpbusd`: a lane adds 4 products per instruction; after the two hh steps
//!   |lane| <= 8 * 24 * 128 = 24576, shifted left by 8: <= 6291456, then the two hl steps
//!   add at most 8 * 255 * 24 = 48960: far inside i32.
//! - `vpmaddubsw` (AVX2): a pair w * hh + w * hh is at most 2 * 24 * 128 = 6144 in size and
//!   the even + odd sum 12288; hl * w pairs are at most 2 * 255 * 24 = 12240, even + odd
//!   24480; all below the i16 limit 32767, so the saturating add never saturates. Then
//!   `vpmaddwd` with 256 (|.| <= 2 * 12288 * 256 = 6291456) and with 1 widens to i32.
//! - Four lanes of a block (three `vphaddd` levels, exact i32 adds) hold sum w * h, at most
//!   32 * 24 * 32767 < 2^25; minus 12 * sum h (< 2^24) leaves sum k * h, |.| < 2^24.
//!
//! Blocks go eight at a time, as pairs (0, 1), (2, 3), (4, 5), (6, 7); after the adds lane
//! [`PLANE_LANE`]`[j]` holds block j, the corrections are stored in that order, and the
//! float sums are put back in block order by one `vpermps` before the reference's float
//! steps (acc lane l = acc[b mod 8]). The last blocks of a row (fewer than eight) are read
//! from a zero-padded copy of their bytes (the planes are zero past the last block) and
//! combined one by one with the reference's step.
//!
//! No closures: a closure would be compiled without the target features of the function
//! it is in and call its intrinsics out of line.

use std::arch::x86_64::*;

use super::{combine, ActQ16, PLANE_LANE};
use crate::math::reduce8;
use crate::tensor::{MXFP4_BLOCK, MXFP4_DOUBLED};

/// k + 12 for each nibble: the doubled e2m1 values made unsigned.
const TABLE: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (MXFP4_DOUBLED[i] + 12) as u8;
        i += 1;
    }
    t
};

/// For block j of a run (block order), the lane holding it in the kernel's sums.
const TO_BLOCK_ORDER: [i32; 8] = [
    PLANE_LANE[0] as i32,
    PLANE_LANE[1] as i32,
    PLANE_LANE[2] as i32,
    PLANE_LANE[3] as i32,
    PLANE_LANE[4] as i32,
    PLANE_LANE[5] as i32,
    PLANE_LANE[6] as i32,
    PLANE_LANE[7] as i32,
];

/// SAFETY (caller): AVX2 present; `row` is one stored MXFP4 row for `a`'s cols; `a` has
/// its planes ([`ActQ16::has_planes`]) and p < a.n.
#[target_feature(enable = "avx2")]
pub unsafe fn dot_row_avx2(row: &[u8], a: &ActQ16, p: usize) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { body::<false>(row, a, p) }
}

/// SAFETY (caller): AVX-512 F/VL/BW/VNNI and AVX2 present; shapes as above.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw,avx512vnni")]
pub unsafe fn dot_row_avx512(row: &[u8], a: &ActQ16, p: usize) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { body::<true>(row, a, p) }
}

#[inline(always)]
unsafe fn body<const VNNI: bool>(row: &[u8], a: &ActQ16, p: usize) -> f32 {
    let nb = a.blocks;
    let ds = a.dstride();
    let (scales, vals) = row.split_at(nb.div_ceil(4) * 4);
    let planes = &a.planes[p * ds * 128..(p + 1) * ds * 128];
    let corr = &a.corr[p * ds * 2..(p + 1) * ds * 2];
    let d = &a.d[p * nb..(p + 1) * nb];
    assert!(vals.len() >= nb * 16 && scales.len() >= nb && a.cols == nb * MXFP4_BLOCK);
    // SAFETY: AVX2 (and for VNNI AVX-512 VNNI/VL) per the callers' target features; every
    // pointer below is in bounds: run r < runs has blocks 8r..8r + 8 <= nb (16 bytes each
    // in `vals`, 8 scale bytes and 8 d values), and planes/corr hold ds >= 8 * runs + 8
    // blocks' worth when there is a tail.
    unsafe {
        let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(TABLE.as_ptr() as *const __m128i));
        let order = _mm256_loadu_si256(TO_BLOCK_ORDER.as_ptr() as *const __m256i);
        let mut accv = _mm256_setzero_ps();
        let runs = nb / 8;
        for r in 0..runs {
            let (hs, ls) = run_sums::<VNNI>(
                lut,
                vals.as_ptr().add(r * 128),
                planes.as_ptr().add(r * 1024),
                corr.as_ptr().add(r * 16),
            );
            let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(scales.as_ptr().add(r * 8) as *const __m128i));
            let dv = _mm256_loadu_ps(d.as_ptr().add(r * 8));
            // e8m0_half: e < 2 gives 0x0020_0000 << e (a subnormal), else (e - 1) << 23.
            let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
            let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
            let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
            let sc = _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small));
            let sum = _mm256_add_ps(
                _mm256_cvtepi32_ps(hs),
                _mm256_mul_ps(_mm256_cvtepi32_ps(ls), _mm256_set1_ps(1.0 / 65536.0)),
            );
            let sum = _mm256_permutevar8x32_ps(sum, order);
            accv = _mm256_add_ps(accv, _mm256_mul_ps(_mm256_mul_ps(sc, dv), sum));
        }
        let mut acc = [0.0f32; 8];
        _mm256_storeu_ps(acc.as_mut_ptr(), accv);
        if runs * 8 < nb {
            let b0 = runs * 8;
            let mut w = [0u8; 128];
            w[..(nb - b0) * 16].copy_from_slice(&vals[b0 * 16..nb * 16]);
            let (hs, ls) =
                run_sums::<VNNI>(lut, w.as_ptr(), planes.as_ptr().add(runs * 1024), corr.as_ptr().add(runs * 16));
            let (mut h, mut l) = ([0i32; 8], [0i32; 8]);
            _mm256_storeu_si256(h.as_mut_ptr() as *mut __m256i, hs);
            _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, ls);
            for b in b0..nb {
                let lane = PLANE_LANE[b - b0];
                combine(&mut acc, b, scales[b], d[b], h[lane], l[lane]);
            }
        }
        reduce8(acc)
    }
}

/// The exact sums k * h and k * l of eight blocks (lane [`PLANE_LANE`]`[j]` = block j):
/// 128 stored bytes at `w`, their 1024 plane bytes at `x`, 16 corrections at `c`.
///
/// SAFETY (caller): AVX2 (VNNI: AVX-512 VNNI and VL); the bytes are readable.
#[inline(always)]
unsafe fn run_sums<const VNNI: bool>(lut: __m256i, w: *const u8, x: *const u8, c: *const i32) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract.
    unsafe {
        let (h0, l0) = pair_sums::<VNNI>(lut, w, x);
        let (h1, l1) = pair_sums::<VNNI>(lut, w.add(32), x.add(256));
        let (h2, l2) = pair_sums::<VNNI>(lut, w.add(64), x.add(512));
        let (h3, l3) = pair_sums::<VNNI>(lut, w.add(96), x.add(768));
        let hs = _mm256_hadd_epi32(_mm256_hadd_epi32(h0, h1), _mm256_hadd_epi32(h2, h3));
        let ls = _mm256_hadd_epi32(_mm256_hadd_epi32(l0, l1), _mm256_hadd_epi32(l2, l3));
        (
            _mm256_sub_epi32(hs, _mm256_loadu_si256(c as *const __m256i)),
            _mm256_sub_epi32(ls, _mm256_loadu_si256(c.add(8) as *const __m256i)),
        )
    }
}

/// Lanes 0-3: block 2m's partial sums of w * h (and w * l), lanes 4-7 block 2m + 1's.
///
/// SAFETY (caller): as [`run_sums`]; 32 bytes at `w`, 256 at `x`.
#[inline(always)]
unsafe fn pair_sums<const VNNI: bool>(lut: __m256i, w: *const u8, x: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract.
    unsafe {
        let low = _mm256_set1_epi8(15);
        let bytes = _mm256_loadu_si256(w as *const __m256i);
        let we = _mm256_shuffle_epi8(lut, _mm256_and_si256(bytes, low));
        let wo = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), low));
        let v = x as *const __m256i;
        let h = part::<VNNI>(we, wo, v);
        let l = part::<VNNI>(we, wo, v.add(4));
        (h, l)
    }
}

/// sum w * (256 * hh + hl) in four lanes per block, from the planes hh_even, hh_odd,
/// hl_even, hl_odd at `v`.
///
/// SAFETY (caller): as [`pair_sums`]; 128 bytes at `v`.
#[inline(always)]
unsafe fn part<const VNNI: bool>(we: __m256i, wo: __m256i, v: *const __m256i) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let (he, ho) = (_mm256_loadu_si256(v), _mm256_loadu_si256(v.add(1)));
        let (le, lo) = (_mm256_loadu_si256(v.add(2)), _mm256_loadu_si256(v.add(3)));
        if VNNI {
            let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), we, he);
            let s = _mm256_dpbusd_epi32(s, wo, ho);
            let s = _mm256_slli_epi32::<8>(s);
            let s = _mm256_dpbusd_epi32(s, le, we);
            _mm256_dpbusd_epi32(s, lo, wo)
        } else {
            let hi = _mm256_add_epi16(_mm256_maddubs_epi16(we, he), _mm256_maddubs_epi16(wo, ho));
            let lo = _mm256_add_epi16(_mm256_maddubs_epi16(le, we), _mm256_maddubs_epi16(lo, wo));
            _mm256_add_epi32(_mm256_madd_epi16(hi, _mm256_set1_epi16(256)), _mm256_madd_epi16(lo, _mm256_set1_epi16(1)))
        }
    }
}
