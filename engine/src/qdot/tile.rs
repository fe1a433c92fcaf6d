//! x86-64 path of [`super::dot_row_many`] for many positions, with `vpdpbusd` on 256-bit
//! vectors: AVX-512 VNNI's (EVEX) or AVX-VNNI's (VEX: the AVX2 path on CPUs that have it,
//! Intel since Alder Lake and Sapphire Rapids). A weight row is made ready once
//! ([`prepare`]) and then applied to the positions four at a time. (The AVX2 path without
//! VNNI had one too, with `vpmaddubsw`; on a Zen 1 EPYC the few-position kernel beat it at
//! every count measured, and on the Xeon it tied from 64 positions: plain AVX2 runs
//! [`super::x86_few`] at any count since the thirty-first session, docs/benchmarks.md.
//! With AVX-VNNI the prepared row is faster again: a 256-token prefill through
//! `COLIBRI_SIMD=avx2` on the Xeon 85-86 -> 101-104 tok/s, docs/benchmarks.md "AVX-VNNI".)
//!
//! The layout (built by [`prepare`] for the row and [`super::ActQ::interleave`] for the
//! activations): for each run of eight blocks, 32-byte vectors whose lane j (4 bytes)
//! holds four values of block j. One `vpdpbusd` per vector
//! then adds each block's products into that block's own lane, so a run of eight blocks
//! ends with its eight integer block sums in one register: no horizontal sums, and the
//! float combination is the reference's (lane l is acc[b mod 8] for b = 8k + l). The
//! integer sums are exact, so the bits are [`super::dot_row_scalar`]'s.

use std::arch::x86_64::*;

use super::{padded, round4, ActQ, CHUNK};
use crate::math::reduce8;

/// Positions applied per pass over a prepared row.
const TILE: usize = 4;

/// Makes `row` ready for many positions in `u`: the unsigned values w + bias (int4:
/// nibbles + 8; int8: w ^ 0x80 = w + 128) in the interleaved layout of the activations'
/// order (int4 split per chunk, int8 natural), zero past the row's last value and past its
/// last block, `a.dstride() * a.group` bytes.
///
/// SAFETY (caller): AVX2 present; `row` is one stored row for `a`'s cols/group; the group
/// is a multiple of [`CHUNK`].
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn prepare(int4: bool, row: &[u8], a: &ActQ, u: &mut Vec<u8>) {
    let g = a.group;
    let n = a.dstride() * g;
    let vals = &row[round4(a.blocks * 2)..];
    let stored = a.blocks * g;
    // Every byte of u[..n] is written below (no zero fill needed).
    if u.len() < n {
        u.resize(n, 0);
    }
    // SAFETY: loads are inside `vals` or a zero-padded copy; stores inside `u` (n is a
    // multiple of 8 blocks * group, and every run writes 8 * group bytes).
    unsafe {
        let low4 = _mm_set1_epi8(0x0f);
        let mut b0 = 0;
        while b0 < a.dstride() {
            for m in 0..g / CHUNK {
                let mut r = [_mm256_setzero_si256(); 8];
                for (j, rj) in r.iter_mut().enumerate() {
                    let c = (b0 + j) * g + m * CHUNK;
                    if c >= stored {
                        continue;
                    }
                    *rj = if int4 {
                        let at = c / 2;
                        let bytes = if at + 16 <= vals.len() {
                            _mm_loadu_si128(vals.as_ptr().add(at) as *const __m128i)
                        } else {
                            let buf = padded::<16>(vals, at);
                            _mm_loadu_si128(buf.as_ptr() as *const __m128i)
                        };
                        let lo = _mm_and_si128(bytes, low4);
                        let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
                        _mm256_set_m128i(hi, lo)
                    } else {
                        let buf = padded::<32>(vals, c);
                        let w = _mm256_loadu_si256(buf.as_ptr() as *const __m256i);
                        let k = vals.len().saturating_sub(c).min(32);
                        let keep = _mm256_cmpgt_epi8(
                            _mm256_set1_epi8(k as i8),
                            _mm256_setr_epi8(
                                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
                                24, 25, 26, 27, 28, 29, 30, 31,
                            ),
                        );
                        _mm256_and_si256(keep, _mm256_xor_si256(w, _mm256_set1_epi8(-128)))
                    };
                }
                // int4 past the row's end: the padded bytes are zero, so the values are 0
                // there too (and the activations are zero).
                let t = transpose8(r);
                let dst = u.as_mut_ptr().add(b0 * g + m * 8 * CHUNK);
                for (k, tk) in t.iter().enumerate() {
                    _mm256_storeu_si256(dst.add(k * 32) as *mut __m256i, *tk);
                }
            }
            b0 += 8;
        }
    }
}

/// 8 x 8 transpose of 32-bit words: lane j of out[k] = lane k of r[j].
#[inline(always)]
unsafe fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    // SAFETY: register-only operations, reached from the target_feature functions.
    unsafe {
        let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
        let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
        let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
        let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
        let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
        let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
        let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
        let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
        let s0 = _mm256_unpacklo_epi64(t0, t2);
        let s1 = _mm256_unpackhi_epi64(t0, t2);
        let s2 = _mm256_unpacklo_epi64(t1, t3);
        let s3 = _mm256_unpackhi_epi64(t1, t3);
        let s4 = _mm256_unpacklo_epi64(t4, t6);
        let s5 = _mm256_unpackhi_epi64(t4, t6);
        let s6 = _mm256_unpacklo_epi64(t5, t7);
        let s7 = _mm256_unpackhi_epi64(t5, t7);
        [
            _mm256_permute2x128_si256(s0, s4, 0x20),
            _mm256_permute2x128_si256(s1, s5, 0x20),
            _mm256_permute2x128_si256(s2, s6, 0x20),
            _mm256_permute2x128_si256(s3, s7, 0x20),
            _mm256_permute2x128_si256(s0, s4, 0x31),
            _mm256_permute2x128_si256(s1, s5, 0x31),
            _mm256_permute2x128_si256(s2, s6, 0x31),
            _mm256_permute2x128_si256(s3, s7, 0x31),
        ]
    }
}

/// A prepared row times positions `p0..p0 + out.len()`, with AVX-512 VNNI's `vpdpbusd`
/// when `wide`, else AVX-VNNI's.
///
/// SAFETY (caller): AVX2 and F16C present, and AVX-512 F/VL/BW/VNNI when `wide`, else
/// AVX-VNNI; `u` prepared from `row` by [`prepare`] for `a`'s layout; `a` interleaved.
pub unsafe fn dot_many(wide: bool, int4: bool, u: &[u8], row: &[u8], a: &ActQ, p0: usize, out: &mut [f32]) {
    let shift = if int4 { 3 } else { 7 };
    let mut i = 0;
    while i < out.len() {
        let k = (out.len() - i).min(TILE);
        let o = &mut out[i..i + k];
        // SAFETY: the caller's contract.
        unsafe {
            match (wide, k) {
                (true, 4) => tile_vnni::<4>(u, row, a, p0 + i, shift, o),
                (true, 3) => tile_vnni::<3>(u, row, a, p0 + i, shift, o),
                (true, 2) => tile_vnni::<2>(u, row, a, p0 + i, shift, o),
                (true, _) => tile_vnni::<1>(u, row, a, p0 + i, shift, o),
                (false, 4) => tile_avxvnni::<4>(u, row, a, p0 + i, shift, o),
                (false, 3) => tile_avxvnni::<3>(u, row, a, p0 + i, shift, o),
                (false, 2) => tile_avxvnni::<2>(u, row, a, p0 + i, shift, o),
                (false, _) => tile_avxvnni::<1>(u, row, a, p0 + i, shift, o),
            }
        }
        i += k;
    }
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn tile_vnni<const P: usize>(u: &[u8], row: &[u8], a: &ActQ, p0: usize, shift: i32, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { tile::<P, true>(u, row, a, p0, shift, out) }
}

#[target_feature(enable = "avx2,f16c,avxvnni")]
unsafe fn tile_avxvnni<const P: usize>(u: &[u8], row: &[u8], a: &ActQ, p0: usize, shift: i32, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { tile::<P, false>(u, row, a, p0, shift, out) }
}

/// acc + the eight 4-product sums of unsigned `w` times signed `x`: `vpdpbusd`, AVX-512
/// VNNI's (`EVEX`) or AVX-VNNI's; the same integers.
#[inline(always)]
unsafe fn dpbusd<const EVEX: bool>(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    // SAFETY: only reached from tile_vnni (EVEX) and tile_avxvnni, which enable the features.
    unsafe {
        if EVEX {
            _mm256_dpbusd_epi32(acc, w, x)
        } else {
            _mm256_dpbusd_avx_epi32(acc, w, x)
        }
    }
}

/// P positions from `p0` over the prepared row `u`: out[i] = position p0 + i.
#[inline(always)]
unsafe fn tile<const P: usize, const EVEX: bool>(
    u: &[u8],
    row: &[u8],
    a: &ActQ,
    p0: usize,
    shift: i32,
    out: &mut [f32],
) {
    let (g, ds) = (a.group, a.dstride());
    let run = 8 * g;
    debug_assert!(u.len() >= ds * g && a.qi.len() >= (p0 + P) * ds * g && out.len() >= P);
    // SAFETY: loads of `u` and the interleaved activations are inside their ds * g bytes
    // per position (checked above in debug builds, the callers' contract otherwise);
    // `d`/`s` hold ds entries per position; the scales are read from `row` (or a padded
    // copy of the last ones).
    unsafe {
        let sh = _mm_cvtsi32_si128(shift);
        let mut acc = [_mm256_setzero_ps(); P];
        // Plain loops, not closures: a closure is not compiled with this function's target
        // features, and its intrinsics would become calls.
        let mut qi = [a.qi.as_ptr() as *const u8; P];
        for (i, q) in qi.iter_mut().enumerate() {
            *q = a.qi.as_ptr().add((p0 + i) * ds * g) as *const u8;
        }
        let mut b0 = 0;
        while b0 < a.blocks {
            let nb = (a.blocks - b0).min(8);
            let mut isum = [_mm256_setzero_si256(); P];
            for (i, v) in isum.iter_mut().enumerate() {
                let s8 = _mm256_loadu_si256(a.srow(p0 + i).as_ptr().add(b0) as *const __m256i);
                *v = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_sll_epi32(s8, sh));
            }
            let base = b0 * g;
            // Two sums per position (even and odd vectors: a run is 8 * group bytes, an even
            // number of vectors) so that twice as many products are in flight.
            let mut odd = [_mm256_setzero_si256(); P];
            let mut v = 0;
            while v < run {
                let w0 = _mm256_loadu_si256(u.as_ptr().add(base + v) as *const __m256i);
                let w1 = _mm256_loadu_si256(u.as_ptr().add(base + v + 32) as *const __m256i);
                for i in 0..P {
                    let x0 = _mm256_loadu_si256(qi[i].add(base + v) as *const __m256i);
                    let x1 = _mm256_loadu_si256(qi[i].add(base + v + 32) as *const __m256i);
                    isum[i] = dpbusd::<EVEX>(isum[i], w0, x0);
                    odd[i] = dpbusd::<EVEX>(odd[i], w1, x1);
                }
                v += 64;
            }
            for i in 0..P {
                isum[i] = _mm256_add_epi32(isum[i], odd[i]);
            }
            let ws = if nb == 8 {
                _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(2 * b0) as *const __m128i))
            } else {
                let mut buf = [0u8; 16];
                buf[..2 * nb].copy_from_slice(&row[2 * b0..2 * (b0 + nb)]);
                _mm256_cvtph_ps(_mm_loadu_si128(buf.as_ptr() as *const __m128i))
            };
            for i in 0..P {
                let dv = _mm256_loadu_ps(a.drow(p0 + i).as_ptr().add(b0));
                acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(_mm256_mul_ps(ws, dv), _mm256_cvtepi32_ps(isum[i])));
            }
            b0 += 8;
        }
        for i in 0..P {
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i]);
            out[i] = reduce8(lanes);
        }
    }
}
