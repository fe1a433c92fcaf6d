//! The one-position AVX-512 VNNI runs of [`super::x86`]: int4 rows on the quad layout
//! ([`quad_runs`]; Q4K and Q5K too) and int8 rows of group 32, 64 or 128 ([`int8_runs`]),
//! for one row or several at once ([`super::x86_rows`], the one-position matmul's call),
//! each row through the same integers and float steps as the reference, so its bits.

use std::arch::x86_64::*;

use super::x86_runs::{combine, int8_halves128, prefetch, prefetch_k5, prefetch_rows512, prefetch_to, run_scales};
use super::{ActQ, CHUNK};
use crate::math::reduce8;

/// One Q5K row times position `p` on AVX-512 ([`super::x86::k5_takes`] with quads holds):
/// [`quad_runs`] with each value's fifth bit added ([`fifth_quad`]), Q4K's float step.
///
/// SAFETY (caller): AVX-512 F/VL/BW/VNNI, AVX2 and F16C present; `row` is one stored Q5K
/// row for `a`.
#[inline(always)]
pub(super) unsafe fn body_k5_quads(row: &[u8], a: &ActQ, p: usize) -> f32 {
    let runs = a.blocks / 8;
    // SAFETY: a Q5K row is 16 header, 128 nibble and 32 fifth-bit bytes per run; the quad
    // layout holds 256 values per run of position p, d and ds dstride per position.
    unsafe {
        let qz = a.qz.as_ptr().add(p * a.dstride() * CHUNK);
        let [acc] = quad_runs::<1, true, true, 1>([row], [&row[16 * runs..]], qz, a, p, runs);
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        reduce8(lanes)
    }
}

/// The fifth bits of the four blocks of one quad-layout vector of a Q5K run (blocks
/// 4k..4k + 4, block 4k + l in 128-bit lane l; `half`: the run's 16 fifth-bit bytes of
/// those blocks, tensor::q5k_bit), as 0x10 bytes over the nibble vector: (for the low
/// nibbles, for the high ones). The half is broadcast to the four lanes; in lane l, bits
/// 2l and 2l + 1 of each byte are rotated to bit 4 of that byte: a rotate of each 32-bit
/// word by 4 - 2l (3 - 2l) moves bit 8t + 2l to 8t + 4 (mod 32, so no bit is lost at
/// the word's edge), and the mask keeps bit 4 only.
///
/// SAFETY (caller): AVX-512 F; 16 bytes readable at `half`.
#[inline(always)]
pub(super) unsafe fn fifth_quad(half: *const u8) -> (__m512i, __m512i) {
    // SAFETY: the caller's contract.
    unsafe {
        let h = _mm512_broadcast_i32x4(_mm_loadu_si128(half as *const __m128i));
        let lo = _mm512_rolv_epi32(h, _mm512_setr_epi32(4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0, 30, 30, 30, 30));
        let hi = _mm512_rolv_epi32(h, _mm512_setr_epi32(3, 3, 3, 3, 1, 1, 1, 1, 31, 31, 31, 31, 29, 29, 29, 29));
        let b4 = _mm512_set1_epi8(0x10);
        (_mm512_and_si512(lo, b4), _mm512_and_si512(hi, b4))
    }
}

/// [`super::x86_runs::paired_runs`] in 512-bit vectors (AVX-512 VNNI, the quad layout `qz` of
/// [`ActQ::quad`]): one 64-byte load takes the nibbles of four chunks of 32 values, one per
/// 128-bit lane; its low nibbles times the quad layout's even values and its high nibbles
/// times the odd ones (two `vpdpbusd`) leave chunk k's four partial sums in lane k.
/// [`fold_quads`] then gives the run's eight block sums in block order. `CH` is group / 32
/// (1, 2 or 4); `K5` (Q5K rows, `CH` 1): each nibble with its fifth bit ([`fifth_quad`]).
/// The same integers as the reference's, so the same bits. `S` rows at once, their runs in
/// turn ([`super::x86_rows`]), each with its share of the prefetch distance.
///
/// SAFETY (caller): AVX-512 F/BW/VNNI present; as [`super::x86_runs::paired_runs`] for each row, with `qz`
/// the quad layout of position p.
#[inline(always)]
pub(super) unsafe fn quad_runs<const CH: usize, const K: bool, const K5: bool, const S: usize>(
    rows: [&[u8]; S],
    vals: [&[u8]; S],
    qz: *const i8,
    a: &ActQ,
    p: usize,
    runs: usize,
) -> [__m256; S] {
    let g = a.group;
    // SAFETY: the caller's contract; a run reads 4 * g bytes of each `vals` and 8 * g of
    // `qz` (K5: and 32 fifth-bit bytes after each row's nibbles); d and s hold dstride >= 8 *
    // runs entries.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); S];
        let low4 = _mm512_set1_epi8(0x0f);
        // The same bytes in flight whatever the rows at once: each row's share ahead.
        let ahead = if K5 { prefetch_k5() } else { prefetch_rows512() } / S / 64 * 64;
        let high: [*const u8; S] = std::array::from_fn(|j| vals[j].as_ptr().wrapping_add(a.cols / 2));
        for r in 0..runs {
            for j in 0..S {
                if ahead > 0 {
                    if K5 {
                        // The whole row (run headers, nibbles, fifth bits: three places) at
                        // the rate the runs read it, so that all three are on their way.
                        let per = rows[j].len() / runs.max(1);
                        prefetch(rows[j].as_ptr().wrapping_add(ahead + r * per), per);
                    } else {
                        prefetch(vals[j].as_ptr().wrapping_add(ahead + r * 4 * g), 4 * g);
                    }
                }
                let (w0, x0) = (vals[j].as_ptr().add(r * 4 * g), qz.add(r * 8 * g));
                let mut v = [_mm512_setzero_si512(); 8];
                for (k, vk) in v.iter_mut().enumerate().take(2 * CH) {
                    let w = _mm512_loadu_si512(w0.add(64 * k) as *const __m512i);
                    let even = _mm512_loadu_si512(x0.add(128 * k) as *const __m512i);
                    let odd = _mm512_loadu_si512(x0.add(128 * k + 64) as *const __m512i);
                    let (mut lo, mut hi) = (_mm512_and_si512(w, low4), _mm512_and_si512(_mm512_srli_epi16(w, 4), low4));
                    if K5 {
                        // u <= 31: vpdpbusd's four products of u8 and i8 add exactly in i32.
                        let (l5, h5) = fifth_quad(high[j].add(32 * r + 16 * k));
                        (lo, hi) = (_mm512_or_si512(lo, l5), _mm512_or_si512(hi, h5));
                    }
                    *vk = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, even), hi, odd);
                }
                let sc = run_scales::<K>(rows[j].as_ptr().add(16 * r));
                acc[j] = combine::<3, K>(acc[j], sc, fold_quads::<CH>(&mut v), a, p * a.dstride() + 8 * r);
            }
        }
        acc
    }
}

/// The first `runs` runs of eight int8 blocks of a row times position `p`, in 512-bit
/// vectors (AVX-512 VNNI): each 64 stored bytes flipped to w + 128 (unsigned, so one
/// `vpdpbusd` takes them with the activations as they are: no sign trick, no 16-bit
/// pairs), the run's vectors folded into the eight block sums ([`fold_quads`]: a 64-byte
/// vector holds two blocks of 32 over two lanes each, one block of 64 over four lanes, or
/// half a block of 128), less 128 times the block's activation sum (`s`). The same
/// integers as the reference's, so the same bits. `CH` is group / 32 (1, 2 or 4). `S` rows
/// at once as [`quad_runs`].
///
/// SAFETY (caller): AVX-512 F/BW/VNNI present; the runs' bytes are inside `vals`
/// (8 * group * runs <= vals.len()), the activations of position p are unsplit, `row`
/// holds the runs' scales.
#[inline(always)]
pub(super) unsafe fn int8_runs<const CH: usize, const S: usize>(
    rows: [&[u8]; S],
    vals: [&[u8]; S],
    a: &ActQ,
    p: usize,
    runs: usize,
) -> [__m256; S] {
    let g = a.group;
    let (q, d, s) = (a.qrow(p).as_ptr(), a.drow(p).as_ptr(), a.srow(p).as_ptr());
    // SAFETY: the caller's contract; a run reads 8 * g bytes of each `vals` and 8 * g values
    // of `q` (blocks * group of them); d and s hold dstride >= 8 * runs entries.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); S];
        let seven = _mm_cvtsi32_si128(7);
        let flip = _mm512_set1_epi8(-128);
        // The int4 runs' prefetch ([`prefetch_rows512`], each row its share); without it
        // these rows read 12.0 / 12.9 GB/s (g32 / g128) at one thread on a Xeon, with it
        // 14.6-15.5 / 16.2-16.6.
        let ahead = prefetch_rows512() / S / 64 * 64;
        // Groups of 128 on AMD: two halves, into L2 ([`int8_halves128`]).
        let halves = CH == 4 && int8_halves128();
        for r in 0..runs {
            for j in 0..S {
                let at = vals[j].as_ptr().wrapping_add(ahead + r * 8 * g);
                if ahead > 0 && halves {
                    prefetch_to::<_MM_HINT_T1>(at, 8 * g);
                } else if ahead > 0 {
                    prefetch(at, 8 * g);
                }
                let (w0, x0) = (vals[j].as_ptr().add(r * 8 * g), q.add(r * 8 * g));
                let sums = if halves {
                    // Each half as a run of group 64 (eight sums of 64 values), then the
                    // halves' sums added pairwise: [0+1, 2+3, 8+9, 10+11 | 4+5, ...] put
                    // in block order by the 64-bit permute.
                    let t = _mm256_hadd_epi32(int8_part::<2>(w0, x0, 0, flip), int8_part::<2>(w0, x0, 1, flip));
                    _mm256_permute4x64_epi64(t, 0b11_01_10_00)
                } else {
                    int8_part::<CH>(w0, x0, 0, flip)
                };
                let s8 = _mm256_sll_epi32(_mm256_loadu_si256(s.add(8 * r) as *const __m256i), seven);
                let isum = _mm256_sub_epi32(sums, s8);
                let ws = _mm256_cvtph_ps(_mm_loadu_si128(rows[j].as_ptr().add(16 * r) as *const __m128i));
                let dv = _mm256_loadu_ps(d.add(8 * r));
                acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_mul_ps(ws, dv), _mm256_cvtepi32_ps(isum)));
            }
        }
        acc
    }
}

/// The eight block sums of `4 * CH` vectors of int8 values at `w0` (flipped to w + 128 by
/// `flip`) times the activations at `x0` (`CH` = group / 32: 1, 2 or 4), `part` runs of
/// that size in (`int8_runs` takes a run of group 128 as two parts of group 64's shape).
/// A block of 128 spans two vectors: their sums are added first.
#[inline(always)]
unsafe fn int8_part<const CH: usize>(w0: *const u8, x0: *const i8, part: usize, flip: __m512i) -> __m256i {
    // SAFETY: the caller's contract (the part is inside the run; AVX-512 VNNI enabled there).
    unsafe {
        let mut v = [_mm512_setzero_si512(); 8];
        for k in 0..4 * CH {
            let at = 64 * (k + 4 * CH * part);
            let w = _mm512_xor_si512(_mm512_loadu_si512(w0.add(at) as *const __m512i), flip);
            let x = _mm512_loadu_si512(x0.add(at) as *const __m512i);
            let i = if CH == 4 { k / 2 } else { k };
            v[i] = _mm512_dpbusd_epi32(v[i], w, x);
        }
        if CH == 1 {
            fold_quads::<2>(&mut v)
        } else {
            fold_quads::<4>(&mut v)
        }
    }
}

/// The eight block sums of a run from its `2 * CH` chunk vectors (lane k of vector i holds
/// the four partial sums of chunk 4i + k): lanes of the same block are added pairwise
/// until one chunk lane per block is left (CH = 1), then two cross-vector permutes and two
/// adds leave block j's sum in lane j. Exact.
#[inline(always)]
pub(super) unsafe fn fold_quads<const CH: usize>(v: &mut [__m512i; 8]) -> __m256i {
    // SAFETY: only reached from the AVX-512 target_feature function.
    unsafe {
        let mut n = 2 * CH;
        while n > 2 {
            for i in 0..n / 2 {
                // Lanes (0, 1) and (2, 3) of each vector belong to the same block.
                let (x, y) = (v[2 * i], v[2 * i + 1]);
                v[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(x, y, 0x88), _mm512_shuffle_i32x4(x, y, 0xdd));
            }
            n /= 2;
        }
        // Blocks 0-3 in v[0]'s lanes, 4-7 in v[1]'s: element 4j (and 4j + 1, 4j + 2,
        // 4j + 3) of the pair is block j's.
        let ia = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 2, 6, 10, 14, 18, 22, 26, 30);
        let ib = _mm512_add_epi32(ia, _mm512_set1_epi32(1));
        let t = _mm512_add_epi32(_mm512_permutex2var_epi32(v[0], ia, v[1]), _mm512_permutex2var_epi32(v[0], ib, v[1]));
        _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1))
    }
}
