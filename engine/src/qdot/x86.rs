//! x86-64 paths of [`super::dot_row`]: AVX2 (`maddubs`, 32 products per instruction) and
//! AVX-512 VNNI (`vpdpbusd` on 256-bit vectors). Only the integer sums differ from the
//! reference; the float combination is the reference's, eight blocks per vector (lane l
//! holds block 8k + l, which is exactly acc[b mod 8]).

use std::arch::x86_64::*;

use super::{padded, round4, ActQ, CHUNK};
use crate::math::reduce8;

pub fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
}

pub fn has_avx512() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// SAFETY (caller): AVX2 and F16C present; `row` is one stored row for `a`'s cols/group.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot_row_avx2(int4: bool, row: &[u8], a: &ActQ, p: usize) -> f32 {
    // SAFETY: the caller's contract; the body reads only inside `row` and `a`.
    unsafe { body::<false>(int4, row, a, p) }
}

/// SAFETY (caller): AVX-512 F/VL/BW/VNNI, AVX2 and F16C present; shapes as above.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub unsafe fn dot_row_avx512(int4: bool, row: &[u8], a: &ActQ, p: usize) -> f32 {
    // SAFETY: the caller's contract; the body reads only inside `row` and `a`.
    unsafe { body::<true>(int4, row, a, p) }
}

/// acc + the eight 4-product sums of unsigned `w` times signed `x` (32 pairs).
#[inline(always)]
unsafe fn dot_u8i8<const VNNI: bool>(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    // SAFETY: only reached from the target_feature functions above.
    unsafe {
        if VNNI {
            _mm256_dpbusd_epi32(acc, w, x)
        } else {
            // |w| <= 128, |x| <= 127: a pair sums to at most 32512, so maddubs never saturates.
            let pairs = _mm256_maddubs_epi16(w, x);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
}

/// The eight lane sums of v[0..8] as one vector (lane j = sum of v[j]); exact.
#[inline(always)]
unsafe fn hsum8(v: &[__m256i; 8]) -> __m256i {
    // SAFETY: only reached from the target_feature functions above.
    unsafe {
        let s01 = _mm256_hadd_epi32(v[0], v[1]);
        let s23 = _mm256_hadd_epi32(v[2], v[3]);
        let s45 = _mm256_hadd_epi32(v[4], v[5]);
        let s67 = _mm256_hadd_epi32(v[6], v[7]);
        let t0 = _mm256_hadd_epi32(s01, s23);
        let t1 = _mm256_hadd_epi32(s45, s67);
        let lo = _mm256_permute2x128_si256(t0, t1, 0x20);
        let hi = _mm256_permute2x128_si256(t0, t1, 0x31);
        _mm256_add_epi32(lo, hi)
    }
}

#[inline(always)]
unsafe fn body<const VNNI: bool>(int4: bool, row: &[u8], a: &ActQ, p: usize) -> f32 {
    let (g, blocks) = (a.group, a.blocks);
    let sb = round4(blocks * 2);
    let vals = &row[sb..];
    let (q, d, s) = (a.qrow(p), a.drow(p), a.srow(p));
    let chunks = g / CHUNK;
    // SAFETY: every load below is inside `q` (blocks * group values), `d`/`s` (padded to a
    // multiple of 8), `row` (scales, or a zero-padded copy past the end), or `vals`
    // (checked against its length, else a zero-padded copy).
    unsafe {
        let low4 = _mm_set1_epi8(0x0f);
        let mut acc = _mm256_setzero_ps();
        let mut b0 = 0;
        while b0 < blocks {
            let nb = (blocks - b0).min(8);
            let mut v = [_mm256_setzero_si256(); 8];
            for (j, vj) in v.iter_mut().enumerate().take(nb) {
                let b = b0 + j;
                let mut sum = _mm256_setzero_si256();
                for k in 0..chunks {
                    let c = b * g + k * CHUNK;
                    let x = _mm256_loadu_si256(q.as_ptr().add(c) as *const __m256i);
                    if int4 {
                        let at = c / 2;
                        let bytes = if at + 16 <= vals.len() {
                            _mm_loadu_si128(vals.as_ptr().add(at) as *const __m128i)
                        } else {
                            let buf = padded::<16>(vals, at);
                            _mm_loadu_si128(buf.as_ptr() as *const __m128i)
                        };
                        let lo = _mm_and_si128(bytes, low4);
                        let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
                        // Low nibbles are the even values, high the odd: the split order of q.
                        sum = dot_u8i8::<VNNI>(sum, _mm256_set_m128i(hi, lo), x);
                    } else {
                        let w = if c + 32 <= vals.len() {
                            _mm256_loadu_si256(vals.as_ptr().add(c) as *const __m256i)
                        } else {
                            let buf = padded::<32>(vals, c);
                            _mm256_loadu_si256(buf.as_ptr() as *const __m256i)
                        };
                        // w * x = |w| * (x with w's sign).
                        sum = dot_u8i8::<VNNI>(sum, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
                    }
                }
                *vj = sum;
            }
            let mut isum = hsum8(&v);
            if int4 {
                let s8 = _mm256_loadu_si256(s.as_ptr().add(b0) as *const __m256i);
                isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(s8, 3));
            }
            let f = _mm256_cvtepi32_ps(isum);
            let ws = if nb == 8 {
                _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(2 * b0) as *const __m128i))
            } else {
                // Past the last block the scales are zero (not the next values' bytes).
                let mut buf = [0u8; 16];
                buf[..2 * nb].copy_from_slice(&row[2 * b0..2 * (b0 + nb)]);
                _mm256_cvtph_ps(_mm_loadu_si128(buf.as_ptr() as *const __m128i))
            };
            let dv = _mm256_loadu_ps(d.as_ptr().add(b0));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(ws, dv), f));
            b0 += 8;
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        reduce8(lanes)
    }
}
