//! x86-64 paths of [`super::dot_row`]: AVX2 (`maddubs`, 32 products per instruction) and
//! AVX-512 VNNI (`vpdpbusd`; one-position int4 and int8 on 512-bit vectors). Only the integer sums
//! differ from the reference; the float combination is the reference's, eight blocks per
//! vector (lane l holds block 8k + l, which is exactly acc[b mod 8]).
//!
//! Q4K rows (`ActQ::k4`, tensor::DType::Q4K) are int4 rows whose run of eight blocks has a
//! Q4_K header instead of eight f16 scales: the same integer sums (of the stored nibbles,
//! before int4's `- 8 sum q`), and the reference's other float step ([`run_scales`],
//! [`combine`]); const `K` selects it. Q5K rows (`ActQ::k5`) add each value's fifth bit
//! ([`fifth_pair`]; AVX-512 [`super::x86_wide::fifth_quad`]) before the same sums: AVX2 on the pair layout,
//! AVX-512 on the quad layout ([`k5_takes`]).

use std::arch::x86_64::*;

use super::x86_rows::rows_at_once;
use super::x86_runs::{combine, finish, fold_pairs, paired_runs, prefetch, prefetch_ahead, run_scales};
pub use super::x86_runs::{has_avx2, has_avx512, has_avxvnni};
use super::x86_wide::{body_k5_quads, int8_runs, quad_runs};
use super::{round4, ActQ, CHUNK};
use crate::math::reduce8;

/// SAFETY (caller): AVX2 and F16C present; `row` is one stored row for `a`'s cols/group.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot_row_avx2(int4: bool, row: &[u8], a: &ActQ, p: usize) -> f32 {
    // SAFETY: the caller's contract; the body reads only inside `row` and `a`.
    unsafe {
        if a.k5 {
            return body_k5(row, a, p);
        }
        match (int4, a.k4) {
            (true, true) => body::<false, true, true>(row, a, p),
            (true, false) => body::<false, true, false>(row, a, p),
            _ => body::<false, false, false>(row, a, p),
        }
    }
}

/// SAFETY (caller): AVX-512 F/VL/BW/VNNI, AVX2 and F16C present; shapes as above.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub unsafe fn dot_row_avx512(int4: bool, row: &[u8], a: &ActQ, p: usize) -> f32 {
    // SAFETY: the caller's contract; the body reads only inside `row` and `a`.
    unsafe {
        if a.k5 {
            return body_k5_quads(row, a, p);
        }
        match (int4, a.k4) {
            (true, true) => body::<true, true, true>(row, a, p),
            (true, false) => body::<true, true, false>(row, a, p),
            _ => body::<true, false, false>(row, a, p),
        }
    }
}

/// [`dot_row_avx2`] for consecutive rows of `rb` bytes each (`rows` holds `out.len()` of
/// them) times position 0, in one call: the row loop is compiled with the body.
///
/// SAFETY (caller): as [`dot_row_avx2`], for every row.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot_rows_avx2(int4: bool, rows: &[u8], rb: usize, a: &ActQ, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe {
        if a.k5 {
            return rows_k5(rows, rb, a, out);
        }
        // Several rows at once (x86_rows): int4 on the pair layout, int8 of group 32 only (on
        // an AVX-512 Xeon's AVX2 path group 64 read 8% less so, 128 3% less at one thread).
        let pairs = matches!(a.group, 32 | 64 | 128) && a.qp.len() == a.n * a.dstride() * a.group;
        match (int4, a.k4) {
            (true, true) if pairs => rows_at_once::<false, true, true, false>(rows, rb, a, out),
            (true, false) if pairs => rows_at_once::<false, true, false, false>(rows, rb, a, out),
            (false, _) if a.group == 32 => rows_at_once::<false, false, false, false>(rows, rb, a, out),
            (true, true) => rows_body::<false, true, true>(rows, rb, a, out),
            (true, false) => rows_body::<false, true, false>(rows, rb, a, out),
            _ => rows_body::<false, false, false>(rows, rb, a, out),
        }
    }
}

/// [`dot_rows_avx2`] with the AVX-512 VNNI body.
///
/// SAFETY (caller): as [`dot_row_avx512`], for every row.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub unsafe fn dot_rows_avx512(int4: bool, rows: &[u8], rb: usize, a: &ActQ, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe {
        if a.k5 {
            return rows_at_once::<true, true, true, true>(rows, rb, a, out);
        }
        match (int4, a.k4) {
            (true, true) if has_quads(a) => rows_at_once::<true, true, true, false>(rows, rb, a, out),
            (true, false) if has_quads(a) => rows_at_once::<true, true, false, false>(rows, rb, a, out),
            (false, _) if matches!(a.group, 32 | 64 | 128) => {
                rows_at_once::<true, false, false, false>(rows, rb, a, out)
            }
            (true, true) => rows_body::<true, true, true>(rows, rb, a, out),
            (true, false) => rows_body::<true, true, false>(rows, rb, a, out),
            _ => rows_body::<true, false, false>(rows, rb, a, out),
        }
    }
}

#[inline(always)]
unsafe fn rows_body<const VNNI: bool, const INT4: bool, const K: bool>(
    rows: &[u8],
    rb: usize,
    a: &ActQ,
    out: &mut [f32],
) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb.max(1))) {
        // SAFETY: the caller's contract, row by row.
        *o = unsafe { body::<VNNI, INT4, K>(row, a, 0) };
    }
}

#[inline(always)]
unsafe fn rows_k5(rows: &[u8], rb: usize, a: &ActQ, out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb.max(1))) {
        // SAFETY: the caller's contract, row by row.
        *o = unsafe { body_k5(row, a, 0) };
    }
}

/// Whether the Q5K kernels take `a`: group 32, whole runs of 256 columns, split, `ds`
/// whole, and the quad layout (AVX-512, `quads`) or the pair layout (AVX2)
/// (super::k5_fast; other layouts run the reference).
pub fn k5_takes(a: &ActQ, quads: bool) -> bool {
    a.k5_whole() && if quads { has_quads(a) } else { a.qp.len() == a.n * a.dstride() * CHUNK }
}

/// One Q5K row times position `p` ([`k5_takes`] holds): [`paired_runs`]' sums with each
/// value's fifth bit added ([`fifth_pair`]), Q4K's float step.
///
/// SAFETY (caller): AVX2 and F16C present; `row` is one stored Q5K row for `a`.
#[inline(always)]
unsafe fn body_k5(row: &[u8], a: &ActQ, p: usize) -> f32 {
    let runs = a.blocks / 8;
    let vals = &row[16 * runs..];
    // SAFETY: a Q5K row is 16 header, 128 nibble and 32 fifth-bit bytes per run; the pair
    // layout holds 256 values per run of position p, d and ds dstride per position.
    unsafe {
        let high = vals.as_ptr().add(a.cols / 2);
        let qp = a.qp.as_ptr().add(p * a.dstride() * CHUNK);
        let ahead = prefetch_ahead(false);
        let mut acc = _mm256_setzero_ps();
        for r in 0..runs {
            if ahead > 0 {
                prefetch(vals.as_ptr().wrapping_add(ahead + r * 128), 128);
            }
            let isum = pairs8_k5(vals, high.add(32 * r), qp.add(r * 256), r * 256);
            let sc = run_scales::<true>(row.as_ptr().add(16 * r));
            acc = combine::<3, true>(acc, sc, isum, a, p * a.dstride() + 8 * r);
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        reduce8(lanes)
    }
}

/// The fifth bits of blocks i and i + 4 (i < 4) of a Q5K run (`h`: its 32 fifth-bit bytes,
/// tensor::q5k_bit: bytes m and 16 + m hold, at bits 2i and 2i + 1, those of nibble byte m
/// of block i and of block i + 4), as 0x10 bytes in the lanes of the pair layout's nibble
/// vector (block i in the low 128 bits, i + 4 in the high): (for the low nibbles, for the
/// high ones). One 16-bit shift per half brings bit 2i (2i + 1) to bit 4, which the mask
/// keeps: a shift by at most 4 either way moves nothing into bit 4 from the other byte.
///
/// SAFETY (caller): AVX2.
#[inline(always)]
pub(super) unsafe fn fifth_pair(h: __m256i, i: usize) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract.
    unsafe {
        let (lo, hi) = match i {
            0 => (_mm256_slli_epi16::<4>(h), _mm256_slli_epi16::<3>(h)),
            1 => (_mm256_slli_epi16::<2>(h), _mm256_slli_epi16::<1>(h)),
            2 => (h, _mm256_srli_epi16::<1>(h)),
            _ => (_mm256_srli_epi16::<2>(h), _mm256_srli_epi16::<3>(h)),
        };
        let b4 = _mm256_set1_epi8(0x10);
        (_mm256_and_si256(lo, b4), _mm256_and_si256(hi, b4))
    }
}

/// [`super::x86_runs::pairs8`] of a Q5K run at column `c0` (group 32): each nibble with its fifth bit
/// (u <= 31: a `vpmaddubsw` pair is at most 2 * 31 * 127 = 7874, the even and odd sum
/// 15748, so [`fold_pairs`] adds one level of `vphaddw` (31496), not two). Exact.
///
/// SAFETY (caller): AVX2; the run's 128 nibble bytes from `c0 / 2` are inside `vals`, its
/// 32 fifth-bit bytes at `high`, 256 pair-layout values at `qp`.
#[inline(always)]
unsafe fn pairs8_k5(vals: &[u8], high: *const u8, qp: *const i8, c0: usize) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let low4 = _mm256_set1_epi8(0x0f);
        let h = _mm256_loadu_si256(high as *const __m256i);
        let mut t = [_mm256_setzero_si256(); 4];
        for (i, ti) in t.iter_mut().enumerate() {
            let lo_at = (c0 + i * CHUNK) >> 1;
            let x = _mm256_loadu2_m128i(
                vals.as_ptr().add(lo_at + 2 * CHUNK) as *const __m128i,
                vals.as_ptr().add(lo_at) as *const __m128i,
            );
            let (l5, h5) = fifth_pair(h, i);
            let lo = _mm256_or_si256(_mm256_and_si256(x, low4), l5);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(x), low4), h5);
            let q = qp.add(i * 64);
            let even = _mm256_loadu_si256(q as *const __m256i);
            let odd = _mm256_loadu_si256(q.add(32) as *const __m256i);
            *ti = _mm256_add_epi16(_mm256_maddubs_epi16(lo, even), _mm256_maddubs_epi16(hi, odd));
        }
        fold_pairs(t, 2)
    }
}

/// One stored row times position `p`, the weights decoded on the fly. int4 rows with the
/// activations' pair layout ([`ActQ::pair`]) run their whole runs of 8 blocks in
/// [`paired_runs`] first.
#[inline(always)]
pub(super) unsafe fn body<const VNNI: bool, const INT4: bool, const K: bool>(row: &[u8], a: &ActQ, p: usize) -> f32 {
    let vals = &row[round4(a.blocks * 2)..];
    // Columns whose stored bytes lie inside `vals`: their chunks need no bounds check.
    let inside = if INT4 { vals.len() * 2 } else { vals.len() };
    let g = a.group;
    // SAFETY: the runs given to `quad_runs` and `paired_runs` end at or before `inside`
    // (c + 8 * group <= inside); the layouts' lengths are checked here.
    unsafe {
        let (mut start, mut acc) = (0, _mm256_setzero_ps());
        if VNNI && INT4 && has_quads(a) {
            let runs = (a.blocks / 8).min(inside / (8 * g));
            let qz = a.qz.as_ptr().add(p * a.dstride() * g);
            acc = match g / CHUNK {
                1 => quad_runs::<1, K, false, 1>([row], [vals], qz, a, p, runs),
                2 => quad_runs::<2, K, false, 1>([row], [vals], qz, a, p, runs),
                _ => quad_runs::<4, K, false, 1>([row], [vals], qz, a, p, runs),
            }[0];
            start = runs * 8;
        } else if VNNI && !INT4 && matches!(g, 32 | 64 | 128) {
            let runs = (a.blocks / 8).min(inside / (8 * g));
            acc = match g / CHUNK {
                1 => int8_runs::<1, 1>([row], [vals], a, p, runs),
                2 => int8_runs::<2, 1>([row], [vals], a, p, runs),
                _ => int8_runs::<4, 1>([row], [vals], a, p, runs),
            }[0];
            start = runs * 8;
        } else if INT4 && a.qp.len() == a.n * a.dstride() * g {
            let runs = (a.blocks / 8).min(inside / (8 * g));
            let qp = a.qp.as_ptr().add(p * a.dstride() * g);
            acc = match g / CHUNK {
                1 => paired_runs::<VNNI, 1, K, 1>([row], [vals], qp, a, p, runs),
                2 => paired_runs::<VNNI, 2, K, 1>([row], [vals], qp, a, p, runs),
                4 => paired_runs::<VNNI, 4, K, 1>([row], [vals], qp, a, p, runs),
                _ => paired_runs::<VNNI, 0, K, 1>([row], [vals], qp, a, p, runs),
            }[0];
            start = runs * 8;
        }
        finish::<VNNI, INT4, K>(row, a, p, (start, acc))
    }
}

/// Whether `a` holds the quad layout for a group [`quad_runs`] takes.
#[inline(always)]
pub(super) fn has_quads(a: &ActQ) -> bool {
    a.split && a.qz.len() == a.n * a.dstride() * a.group && matches!(a.group / CHUNK, 1 | 2 | 4)
}
