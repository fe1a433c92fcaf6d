//! The x86 integer kernels' shared steps, below every kernel file: block sums of stored
//! chunks ([`sums8`], [`sums_any`]), a run's scales and the reference's float step
//! ([`run_scales`], [`combine`], [`finish`]), the AVX2 runs of one position ([`paired_runs`]
//! on the pair layout, [`int8_runs_avx2`]) and the weights' prefetch ([`prefetch_ahead`]).
//! [`super::x86`] (the entry points), `x86_wide` (the AVX-512 runs), `x86_rows` (several
//! rows at once) and `x86_few` (several positions) build on them.

use std::arch::x86_64::*;

use super::{padded, round4, ActQ, CHUNK, K4_INDEX, K4_SHIFT};
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

/// Whether the AVX2 path may prepare rows for many positions (`super::tile`) with AVX-VNNI's
/// 256-bit `vpdpbusd` (Intel since Alder Lake and Sapphire Rapids, AMD since Zen 5): AVX2
/// and AVX-VNNI present, unless `COLIBRI_AVXVNNI=0` (the plain AVX2 kernels, to compare).
pub fn has_avxvnni() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        has_avx2()
            && is_x86_feature_detected!("avxvnni")
            && std::env::var("COLIBRI_AVXVNNI").map_or(true, |v| v.trim() != "0")
    })
}

/// [`super::quantize_values`] eight values at a time: the same multiply, the same add and
/// subtract of 1.5 * 2^23 (ties to even), the same clamp, so the same integers; `split`
/// puts them in the split order (`super::split_index`) as the scalar loop does.
///
/// SAFETY (caller): AVX2 present; `x.len()` a multiple of 8, `dst.len() >= x.len()`.
#[target_feature(enable = "avx2")]
pub unsafe fn quantize_avx2(x: &[f32], inv: f32, dst: &mut [i8], split: bool) -> i32 {
    // SAFETY: every load reads 8 of x's values at i < x.len() (a multiple of 8).
    unsafe {
        let (vi, magic) = (_mm256_set1_ps(inv), _mm256_set1_ps(super::MAGIC));
        let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
        let mut sum = _mm256_setzero_si256();
        let mut q = [0i32; 8];
        for i in (0..x.len()).step_by(8) {
            let y = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), vi), magic), magic);
            let qi = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(y, lo), hi));
            sum = _mm256_add_epi32(sum, qi);
            _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, qi);
            for (k, &v) in q.iter().enumerate() {
                dst[if split { super::split_index(i + k) } else { i + k }] = v as i8;
            }
        }
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, sum);
        lanes.iter().sum()
    }
}

/// acc + the eight 4-product sums of unsigned `w` times signed `x` (32 pairs).
#[inline(always)]
pub(super) unsafe fn dot_u8i8<const VNNI: bool>(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
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
pub(super) unsafe fn hsum8(v: &[__m256i; 8]) -> __m256i {
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

/// The products of the 32 stored values at column `c` of `vals` (int4: 16 bytes of
/// nibbles in split order; int8: 32 bytes) with the activations `x`, added to `sum`.
/// `CHECKED`: the bytes may run past `vals` (read through a zero-padded copy).
#[inline(always)]
pub(super) unsafe fn stored_chunk<const VNNI: bool, const INT4: bool, const CHECKED: bool>(
    vals: &[u8],
    sum: __m256i,
    c: usize,
    x: __m256i,
) -> __m256i {
    // SAFETY: unchecked loads only where the caller ensured the bytes are inside `vals`.
    unsafe {
        if INT4 {
            let at = c / 2;
            let bytes = if !CHECKED || at + 16 <= vals.len() {
                _mm_loadu_si128(vals.as_ptr().add(at) as *const __m128i)
            } else {
                let buf = padded::<16>(vals, at);
                _mm_loadu_si128(buf.as_ptr() as *const __m128i)
            };
            // Low nibbles are the even values, high the odd: the split order of q.
            let both = _mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes);
            dot_u8i8::<VNNI>(sum, _mm256_and_si256(both, _mm256_set1_epi8(0x0f)), x)
        } else {
            let w = if !CHECKED || c + 32 <= vals.len() {
                _mm256_loadu_si256(vals.as_ptr().add(c) as *const __m256i)
            } else {
                let buf = padded::<32>(vals, c);
                _mm256_loadu_si256(buf.as_ptr() as *const __m256i)
            };
            // w * x = |w| * (x with w's sign).
            dot_u8i8::<VNNI>(sum, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
        }
    }
}

/// Blocks from `start` (a multiple of 8) to the end of one row, added to the accumulator
/// lanes `acc` of the blocks before them, and the reference's final sum: whole runs of
/// eight blocks inside the stored bytes take [`sums8`], the rest [`sums_any`] through a
/// zero-padded copy where the bytes end; the block sums, less `sum q << 3` for int4 (whose
/// stored values carry a bias of 8), are combined in the reference's float order.
///
/// No closures here or below: a closure is not compiled with the calling function's
/// target features, so its intrinsics would become out-of-line calls (they were: half of
/// an int8 decode's time went to `_mm256_sign_epi8` and `_mm256_dpbusd_epi32` calls).
#[inline(always)]
pub(super) unsafe fn finish<const VNNI: bool, const INT4: bool, const K: bool>(
    row: &[u8],
    a: &ActQ,
    p: usize,
    (start, acc0): (usize, __m256),
) -> f32 {
    let vals = &row[round4(a.blocks * 2)..];
    let inside = if INT4 { vals.len() * 2 } else { vals.len() };
    let (g, blocks) = (a.group, a.blocks);
    let q = a.qrow(p);
    // SAFETY: every load below is inside `q` (blocks * group values), `d`/`s`/`ds` (padded
    // to a multiple of 8 per position, p < n), `vals` (whole runs only when c0 + 8 * group <= inside; the rest
    // through a padded copy) or `row`'s scales (or a zero-padded copy of the last ones).
    unsafe {
        let mut acc = acc0;
        let mut b0 = start;
        // The AVX2 int8 rows (int4 rows mostly take `paired_runs`, which prefetches itself;
        // the few-position kernels reach here only for a row's last blocks, where it costs
        // a few instructions).
        let ahead = if VNNI || INT4 { 0 } else { prefetch_ahead(false) };
        while b0 < blocks {
            let nb = (blocks - b0).min(8);
            let c0 = b0 * g;
            if ahead > 0 {
                prefetch(vals.as_ptr().wrapping_add(ahead + c0), 8 * g);
            }
            let isum = if nb == 8 && c0 + 8 * g <= inside {
                match g / CHUNK {
                    1 => sums8::<VNNI, INT4, 1>(vals, q, c0),
                    2 => sums8::<VNNI, INT4, 2>(vals, q, c0),
                    4 => sums8::<VNNI, INT4, 4>(vals, q, c0),
                    _ => sums_any::<VNNI, INT4, false>(vals, q, g, c0, 8),
                }
            } else {
                sums_any::<VNNI, INT4, true>(vals, q, g, c0, nb)
            };
            // A Q4K row has whole runs only (256 columns per header).
            let sc = if nb == 8 {
                run_scales::<K>(row.as_ptr().add(2 * b0))
            } else {
                // Past the last block the scales are zero (not the next values' bytes).
                let mut buf = [0u8; 16];
                buf[..2 * nb].copy_from_slice(&row[2 * b0..2 * (b0 + nb)]);
                (_mm256_cvtph_ps(_mm_loadu_si128(buf.as_ptr() as *const __m128i)), _mm256_setzero_ps())
            };
            let at = p * a.dstride() + b0;
            acc = if INT4 { combine::<3, K>(acc, sc, isum, a, at) } else { combine::<0, false>(acc, sc, isum, a, at) };
            b0 += 8;
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        reduce8(lanes)
    }
}

/// The first `runs` runs of eight int4 blocks of a row times position `p` (pair layout
/// `qp`), combined in the reference's order into the eight accumulator lanes. `CH` is
/// group / 32 (0: read it from the group).
///
/// SAFETY (caller): the runs' bytes are inside `vals` (8 * group * runs <= 2 * vals.len()),
/// `qp` holds the pair layout of position p, `row` holds the runs' scales.
#[inline(always)]
pub(super) unsafe fn paired_runs<const VNNI: bool, const CH: usize, const K: bool, const S: usize>(
    rows: [&[u8]; S],
    vals: [&[u8]; S],
    qp: *const i8,
    a: &ActQ,
    p: usize,
    runs: usize,
) -> [__m256; S] {
    let g = a.group;
    let ch = if CH == 0 { g / CHUNK } else { CH };
    // SAFETY: the caller's contract; d and s hold dstride >= 8 * runs entries.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); S];
        let ahead = prefetch_ahead(VNNI) / S / 64 * 64;
        for r in 0..runs {
            for j in 0..S {
                if ahead > 0 {
                    prefetch(vals[j].as_ptr().wrapping_add(ahead + r * 4 * g), 4 * g);
                }
                let isum = pairs8::<VNNI>(vals[j], qp.add(r * 8 * g), r * 8 * g, g, ch);
                let sc = run_scales::<K>(rows[j].as_ptr().add(16 * r));
                acc[j] = combine::<3, K>(acc[j], sc, isum, a, p * a.dstride() + 8 * r);
            }
        }
        acc
    }
}

/// The first `runs` runs of eight int8 blocks of `S` rows at once ([`super::x86_rows`])
/// times position `p` on AVX2: [`finish`]'s steps for whole runs ([`sums8`], the run's
/// scales, [`combine`]), the rows' runs in turn, each with its share of the AVX2 prefetch.
/// `CH` is group / 32 (1, 2 or 4).
///
/// SAFETY (caller): AVX2 and F16C present; each row's runs are inside its `vals`
/// (8 * group * runs <= vals.len()); `row` holds the runs' scales.
#[inline(always)]
pub(super) unsafe fn int8_runs_avx2<const CH: usize, const S: usize>(
    rows: [&[u8]; S],
    vals: [&[u8]; S],
    a: &ActQ,
    p: usize,
    runs: usize,
) -> [__m256; S] {
    let g = a.group;
    let q = a.qrow(p);
    // SAFETY: the caller's contract; d holds dstride >= 8 * runs entries.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); S];
        let ahead = prefetch_ahead(false) / S / 64 * 64;
        for r in 0..runs {
            for j in 0..S {
                let c0 = r * 8 * g;
                if ahead > 0 {
                    prefetch(vals[j].as_ptr().wrapping_add(ahead + c0), 8 * g);
                }
                let isum = sums8::<false, false, CH>(vals[j], q, c0);
                let sc = run_scales::<false>(rows[j].as_ptr().add(16 * r));
                acc[j] = combine::<0, false>(acc[j], sc, isum, a, p * a.dstride() + 8 * r);
            }
        }
        acc
    }
}

/// The factors of a run's eight blocks (lane j = block j), from the 16 bytes at `head`:
/// int4/int8 (`!K`) their eight f16 scales, and zero; Q4K (`K`) A and B of the Q4K header
/// (tensor::q4k_scales: one shuffle puts in lane j the two bytes holding sc_j (bit 6j of
/// the string) and, above them, the two holding m_j (bit 48 + 6j: the same offset in its
/// byte), one shift per lane brings both to their bytes' bit 0; d * sc and dmin * m are
/// exact).
///
/// SAFETY (caller): AVX2 and F16C; 16 bytes readable at `head`.
#[inline(always)]
pub(super) unsafe fn run_scales<const K: bool>(head: *const u8) -> (__m256, __m256) {
    // SAFETY: the caller's contract.
    unsafe {
        let h = _mm_loadu_si128(head as *const __m128i);
        if !K {
            return (_mm256_cvtph_ps(h), _mm256_setzero_ps());
        }
        let dd = _mm_cvtph_ps(h);
        let (d, dmin) = (_mm256_broadcastss_ps(dd), _mm256_broadcastss_ps(_mm_movehdup_ps(dd)));
        let hb = _mm256_broadcastsi128_si256(h);
        let w = _mm256_shuffle_epi8(hb, _mm256_loadu_si256(K4_INDEX.as_ptr() as *const __m256i));
        let shift = _mm_loadu_si128(K4_SHIFT.as_ptr() as *const __m128i);
        let w = _mm256_srlv_epi32(w, _mm256_broadcastsi128_si256(shift));
        let six = _mm256_set1_epi32(63);
        let (sc, m) = (_mm256_and_si256(w, six), _mm256_and_si256(_mm256_srli_epi32::<16>(w), six));
        (_mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(m)))
    }
}

/// `acc` plus eight blocks (activation entries `at..at + 8` of `a`: d, and s or ds) in the
/// reference's float order: int4/int8 (`!K`) (ws_b * d_b) * f32(sums_b - s_b << SHIFT)
/// (the stored values' bias: int4 8 = 1 << 3, VNNI int8 128; 0: none); Q4K (`K`, `sums`
/// of the nibbles as stored) (A_b * d_b) * f32(sums_b) - B_b * ds_b.
///
/// SAFETY (caller): AVX2; `a.d`, `a.s` (and `a.ds` with `K`) hold `at + 8` entries.
#[inline(always)]
pub(super) unsafe fn combine<const SHIFT: i32, const K: bool>(
    acc: __m256,
    (ws, wb): (__m256, __m256),
    sums: __m256i,
    a: &ActQ,
    at: usize,
) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        let dv = _mm256_loadu_ps(a.d.as_ptr().add(at));
        if K {
            let t1 = _mm256_mul_ps(_mm256_mul_ps(ws, dv), _mm256_cvtepi32_ps(sums));
            let t2 = _mm256_mul_ps(wb, _mm256_loadu_ps(a.ds.as_ptr().add(at)));
            return _mm256_add_ps(acc, _mm256_sub_ps(t1, t2));
        }
        let isum = if SHIFT > 0 {
            let s8 = _mm256_loadu_si256(a.s.as_ptr().add(at) as *const __m256i);
            _mm256_sub_epi32(sums, _mm256_slli_epi32::<SHIFT>(s8))
        } else {
            sums
        };
        _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(ws, dv), _mm256_cvtepi32_ps(isum)))
    }
}

/// The eight block sums of the int4 run at column `c0`, blocks paired (i, i + 4) in one
/// vector: the 16 nibble bytes of block i's chunk and of block i + 4's in one load, their
/// low nibbles times the pair layout's even values and their high nibbles times the odd
/// ones, so lanes 0-3 carry block i and lanes 4-7 block i + 4; lane j of the result is
/// block j. Exact integer sums: the bits of [`sums8`]. `ch` = group / 32.
#[inline(always)]
pub(super) unsafe fn pairs8<const VNNI: bool>(vals: &[u8], qp: *const i8, c0: usize, g: usize, ch: usize) -> __m256i {
    // SAFETY: the caller's run is inside `vals` (c0 + 8 * g <= 2 * vals.len()) and the
    // pair layout holds 8 * g values from `qp`.
    unsafe {
        let low4 = _mm256_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let mut v = [_mm256_setzero_si256(); 4];
        let mut t = [_mm256_setzero_si256(); 4];
        for i in 0..4 {
            // AVX2: the 16-bit pair sums of up to four chunks added before widening (a
            // pair is at most 2 * 15 * 127 = 3810 in size, eight of them 30480 < 2^15).
            let mut pairs = _mm256_setzero_si256();
            for m in 0..ch {
                let lo_at = ((c0 + i * g) >> 1) + m * 16;
                let hi_at = lo_at + 2 * g;
                let x = _mm256_loadu2_m128i(
                    vals.as_ptr().add(hi_at) as *const __m128i,
                    vals.as_ptr().add(lo_at) as *const __m128i,
                );
                let q = qp.add((i * ch + m) * 64);
                let even = _mm256_loadu_si256(q as *const __m256i);
                let odd = _mm256_loadu_si256(q.add(32) as *const __m256i);
                let (lo, hi) = (_mm256_and_si256(x, low4), _mm256_and_si256(_mm256_srli_epi16(x, 4), low4));
                if VNNI {
                    v[i] = dot_u8i8::<VNNI>(v[i], lo, even);
                    v[i] = dot_u8i8::<VNNI>(v[i], hi, odd);
                } else {
                    let two = _mm256_add_epi16(_mm256_maddubs_epi16(lo, even), _mm256_maddubs_epi16(hi, odd));
                    pairs = _mm256_add_epi16(pairs, two);
                    if ch > 2 && (m % 4 == 3 || m + 1 == ch) {
                        v[i] = _mm256_add_epi32(v[i], _mm256_madd_epi16(pairs, ones));
                        pairs = _mm256_setzero_si256();
                    }
                }
            }
            t[i] = pairs;
        }
        if VNNI || ch > 2 {
            return _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        }
        fold_pairs(t, ch)
    }
}

/// The eight block sums of a run from the 16-bit pair sums `t[i]` of blocks i (lanes 0-3)
/// and i + 4 (lanes 4-7) over `ch` <= 2 chunks each (every 16-bit lane at most ch * 7620:
/// two `vpmaddubsw` lanes of 2 * 15 * 127): `vphaddw` while the lanes stay below 2^15
/// (twice for one chunk, once for two), then one `vpmaddwd` per vector left, so a run
/// widens with one or two multiplies instead of four (the multiply port is what AVX2 int4
/// waits on: two `vpmaddubsw` per 64 products). Lane j of the result is block j. Exact.
#[inline(always)]
pub(super) unsafe fn fold_pairs(t: [__m256i; 4], ch: usize) -> __m256i {
    // SAFETY: only reached from the AVX2 target_feature functions.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        // Per 128-bit half: [i's 8 lanes] -> hadd(i, i + 1) = [i x 4, i + 1 x 4].
        let (h01, h23) = (_mm256_hadd_epi16(t[0], t[1]), _mm256_hadd_epi16(t[2], t[3]));
        if ch == 1 {
            // [0 x 2, 1 x 2, 2 x 2, 3 x 2 | 4 x 2 ... 7 x 2], 30480 at most; widened pairwise.
            return _mm256_madd_epi16(_mm256_hadd_epi16(h01, h23), ones);
        }
        _mm256_hadd_epi32(_mm256_madd_epi16(h01, ones), _mm256_madd_epi16(h23, ones))
    }
}

/// Integer sums of the eight blocks from column `c0`, `CH` chunks each, unrolled so that
/// the eight sums stay in registers: lane j of the result is block j.
///
/// SAFETY (caller): the run's stored bytes are inside `vals` (c0 + 8 * CH * 32 <= inside)
/// and its activations inside `q`.
#[inline(always)]
pub(super) unsafe fn sums8<const VNNI: bool, const INT4: bool, const CH: usize>(
    vals: &[u8],
    q: &[i8],
    c0: usize,
) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let mut v = [_mm256_setzero_si256(); 8];
        for (j, vj) in v.iter_mut().enumerate() {
            for k in 0..CH {
                let c = c0 + (j * CH + k) * CHUNK;
                let x = _mm256_loadu_si256(q.as_ptr().add(c) as *const __m256i);
                *vj = stored_chunk::<VNNI, INT4, false>(vals, *vj, c, x);
            }
        }
        hsum8(&v)
    }
}

/// [`sums8`] for `nb` <= 8 blocks of any multiple of [`CHUNK`] (lanes past `nb` are zero);
/// `CHECKED`: the stored bytes may end inside the blocks (read through a padded copy).
///
/// SAFETY (caller): the blocks' activations are inside `q`; unless `CHECKED`, their stored
/// bytes are inside `vals`.
#[inline(always)]
pub(super) unsafe fn sums_any<const VNNI: bool, const INT4: bool, const CHECKED: bool>(
    vals: &[u8],
    q: &[i8],
    g: usize,
    c0: usize,
    nb: usize,
) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let mut v = [_mm256_setzero_si256(); 8];
        for (j, vj) in v.iter_mut().enumerate().take(nb) {
            for k in 0..g / CHUNK {
                let c = c0 + j * g + k * CHUNK;
                let x = _mm256_loadu_si256(q.as_ptr().add(c) as *const __m256i);
                *vj = stored_chunk::<VNNI, INT4, CHECKED>(vals, *vj, c, x);
            }
        }
        hsum8(&v)
    }
}

/// How far ahead of the stored bytes being read the one-position AVX-512 int4 and int8
/// kernels prefetch on Intel (a few rows of a [_, 2048] matrix; a row is short and the hardware's
/// stream prefetch alone leaves the loads waiting: int4/g32 read 14.7-14.9 GB/s without,
/// 17.2-18.2 with, from a 16 MiB working set, one process, on the Xeon of
/// docs/benchmarks.md). The int8 kernels showed no gain then (12 KiB ahead, 4 KiB pages);
/// at 2 KiB with huge pages they read 22-28% more (thirty-sixth session). 2 KiB since
/// the weights sit in huge pages (crate::hugemem): 12 KiB was then the worst of 0.5-12 KiB
/// (same Xeon, qdot_bench from 1000 MB one thread: q4_k 10.4-10.7 GB/s at 12 KiB against
/// 11.9-12.3 at 2 KiB, int4/g32 11.4-12.2 against 12.0-13.5; whole decode of the Q4_K_M
/// import 13.0-13.3 against 14.4-15.2 tok/s, default conversion 13.3-14.6 against
/// 14.5-15.4); with 4 KiB pages the two were equal.
const PREFETCH: usize = 2048;

/// How far ahead the one-position AVX2 int4 and int8 kernels prefetch on AMD CPUs without
/// AVX-512 (Zen 1 to Zen 3 take the AVX2 path): on a Zen 1 EPYC (2 cores) int4/g32 read
/// 6.1-6.3 GB/s from memory without, 7.2-7.5 with (g64 5.7-6.0 -> 7.7-7.9, g128 5.4-6.1
/// -> 8.5; two threads 8.6-10.0 -> 10.1-12.0); 4 to 8 KiB ahead were equal, 12 KiB a
/// little worse (qdot_bench, 64 MiB per thread; docs/kernels.md, docs/benchmarks.md). On Intel the AVX2 kernels
/// were slower with a prefetch (16.4 against 18.9 GB/s), so none there.
const PREFETCH_AVX2_AMD: usize = 6144;

/// How far ahead the one-position AVX-512 int4 and int8 rows ([`super::x86_wide`], three
/// rows at once, each its third) prefetch on AMD (Zen 4): a short distance, about the next
/// two lines of each row. Without it the runs of a group of 128 (1 KiB of int8) waited on
/// memory: each run's loads fill the vector scheduler before they are answered, so few
/// lines are in flight, where the prefetches (which take no vector slot) ask for them all
/// at once. On an AMD EPYC (Zen 4, 2 cores, 31 GB/s read at one thread), qdot_bench from a
/// 256 MiB working set, one thread, without it / with it: int8/g128 12.5 / 21.0 GB/s,
/// int4/g128 16.1 / 26.3, int8/g64 21.0 / 26.5, int8/g32 26.2 / 29.0, int4/g32 26.5 /
/// 27.3, q4_k and q5_k equal; two threads int8/g128 20.8 / 28.0, int8/g64 29.8 / 40.1,
/// int4/g128 23.5 / 30.4 (docs/benchmarks.md, forty-first session). The few-position
/// runs keep none there: the same distance cost int8/g128 at 2 and 4 positions 10-25%.
/// (Twelve KiB, the Intel distance of the twenty-second session, cost a quarter.)
const PREFETCH_ROWS_AMD: usize = 384;

/// The least distance of the one-position float rows' prefetch into L2 on AMD with AVX-512
/// (below four rows when rows are short): on an AMD EPYC (Zen 4, 2 cores, 28.7 GB/s read at
/// one thread), qdot_bench from 256 MiB, one thread, bf16 rows of 512 columns read 8 GB/s
/// without a prefetch, 15-18 four rows (4 KiB) ahead, 23-27 at 8 KiB; 768 columns 18-22 at
/// four rows (6 KiB), 22.7-25.2 at 12 KiB (docs/benchmarks.md, forty-third session).
const FLOAT_L2_MIN: usize = 12 << 10;

/// How the one-position float rows (f32, bf16, f16; four rows at a time) prefetch.
#[derive(Clone, Copy)]
enum FloatAhead {
    /// None (Intel: f32 rows read at the bandwidth without; bf16/f16 not measured with one).
    Off,
    /// bf16/f16 rows the next four rows' bytes into L1, f32 none (AMD without AVX-512: on
    /// a Zen 1 EPYC bf16 read 7.7 GB/s from memory without, 8.6-9.3 with; f32 was slower).
    FourRows,
    /// Every kind the next four rows' bytes, at least [`FLOAT_L2_MIN`], into L2 (AMD with
    /// AVX-512: [`FLOAT_L2_MIN`]'s figures; into L1 the same distances were no faster than
    /// none, 2 KiB rows or 4).
    L2,
    /// `COLIBRI_PREFETCH=BYTES`: that distance (0: none), into L1.
    Bytes(usize),
}

/// How far ahead the one-position AVX-512 Q5K rows prefetch on AMD (Zen 4), walking each
/// row's bytes whole at the rate its runs read them: a Q5K row's run headers, nibbles and
/// fifth bits lie in three places, and [`PREFETCH_ROWS_AMD`]'s short distance over the
/// nibbles alone left the rows waiting on memory (13 GB/s from memory, 24 from cache). On
/// an AMD EPYC (Zen 4, 2 cores, 28.7 GB/s read at one thread), qdot_bench from 256 MiB,
/// one thread, the old prefetch against this one, two rounds: rows of 1024 columns
/// 9.4-11.3 / 16.4-20.0 GB/s, 2048 9.7-12.3 / 16.4-16.9, 4096 11.1-12.5 / 18.9-23.7, 7168
/// 11.6-11.8 / 12.7-14.2; two threads 13.6-14.0 / 21.6-22.2, 13.2-19.7 / 19.2-26.7,
/// 17.7-18.1 / 25.6-28.9, 16.9-17.1 / 20.8-22.5 (docs/benchmarks.md, forty-third session).
/// 6 to 12 KiB were alike; q4_k rows (headers and nibbles) showed no gain from either.
const PREFETCH_K5_AMD: usize = 8192;

/// The distances in bytes, 0 for none, of the AVX-512 one-position int4/int8 rows (Q5K
/// rows: `k5`), the AVX-512 few-position runs, and the AVX2 kernels; the float rows' choice.
struct Ahead {
    rows512: usize,
    k5: usize,
    few512: usize,
    avx2: usize,
    halves128: bool,
    float: FloatAhead,
}

fn ahead() -> &'static Ahead {
    static AHEAD: std::sync::OnceLock<Ahead> = std::sync::OnceLock::new();
    AHEAD.get_or_init(|| {
        let intel = is_intel();
        let halves128 = match std::env::var("COLIBRI_INT8_HALVES").as_deref().map(str::trim) {
            Ok("0") => false,
            Ok("1") => true,
            _ => !intel,
        };
        match std::env::var("COLIBRI_PREFETCH").ok().and_then(|v| v.trim().parse().ok()) {
            Some(bytes) => Ahead {
                rows512: bytes,
                k5: bytes,
                few512: bytes,
                avx2: bytes,
                halves128,
                float: FloatAhead::Bytes(bytes),
            },
            None if intel => {
                Ahead { rows512: PREFETCH, k5: PREFETCH, few512: PREFETCH, avx2: 0, halves128, float: FloatAhead::Off }
            }
            // AMD with AVX-512 (Zen 4 and later) takes the AVX-512 path.
            None => Ahead {
                rows512: PREFETCH_ROWS_AMD,
                k5: PREFETCH_K5_AMD,
                few512: 0,
                avx2: if has_avx512() { 0 } else { PREFETCH_AVX2_AMD },
                halves128,
                float: if has_avx512() { FloatAhead::L2 } else { FloatAhead::FourRows },
            },
        }
    })
}

/// Whether the one-position AVX-512 int8 rows of group 128 ([`super::x86_wide::int8_runs`])
/// take each run as two halves of group 64's shape and prefetch into L2 instead of L1: on
/// AMD, not on Intel (not measured there); `COLIBRI_INT8_HALVES=1` or `0` overrides. Both
/// give the same bits (integer sums, exact in any order).
///
/// On an AMD EPYC (Zen 4, 2 cores, 31.8 GB/s read at one thread; docs/benchmarks.md,
/// forty-second session), qdot_bench from 256 MiB, one thread, rounds alternated: the
/// whole-run form with the L1 prefetch 22.4-24.5 GB/s, the halves with it 24.8-27.5, the
/// whole run with the L2 prefetch 20.6-26.7, the halves with it 28.4-30.9 (one run 21.1). From cache the
/// halves are slower (two folds per run: 30-42 against 53 GB/s), which decode, reading the
/// rows from memory, does not see.
pub(super) fn int8_halves128() -> bool {
    match HALVES128.load(std::sync::atomic::Ordering::Relaxed) {
        0 => false,
        1 => true,
        _ => ahead().halves128,
    }
}

/// [`int8_halves128`]'s choice set (`Some`) or back to the CPU's (`None`): the kernel
/// check runs both forms.
pub(super) fn set_int8_halves128(form: Option<bool>) {
    HALVES128.store(form.map_or(2, u8::from), std::sync::atomic::Ordering::Relaxed)
}

/// 0 or 1: set by [`set_int8_halves128`]; 2: the CPU's choice.
static HALVES128: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(2);

/// The prefetch distance of the few-position int4/int8 runs of the AVX-512 path (`avx512`)
/// or of the AVX2 path's kernels, 0 for none: AVX-512 [`PREFETCH`] on Intel, none on AMD;
/// AVX2 [`PREFETCH_AVX2_AMD`] on AMD without AVX-512, none on Intel. The environment
/// variable `COLIBRI_PREFETCH=BYTES` (0: off) overrides every distance, this one and
/// [`prefetch_rows512`]'s. Any distance gives the same bits: a prefetch only moves bytes
/// into the cache.
pub fn prefetch_ahead(avx512: bool) -> usize {
    if avx512 {
        ahead().few512
    } else {
        ahead().avx2
    }
}

/// How far past each row's bytes (0: not at all), and whether into L2 rather than L1, the
/// one-position float rows of `row_bytes` each prefetch, four rows at a time ([`FloatAhead`]:
/// on AMD with AVX-512 into L2, at least four rows and [`FLOAT_L2_MIN`] ahead; without
/// AVX-512 bf16/f16 four rows into L1; on Intel none). The same bits whatever the distance.
pub fn float_prefetch(f32: bool, row_bytes: usize) -> (usize, bool) {
    match ahead().float {
        FloatAhead::Off => (0, false),
        FloatAhead::FourRows => (if f32 { 0 } else { 4 * row_bytes }, false),
        FloatAhead::L2 => ((4 * row_bytes).max(FLOAT_L2_MIN), true),
        FloatAhead::Bytes(bytes) => (bytes, false),
    }
}

/// The prefetch distance of the one-position AVX-512 int4 and int8 rows: [`PREFETCH`] on
/// Intel, [`PREFETCH_ROWS_AMD`] on AMD (on an AMD EPYC of the twenty-second session, before
/// the rows went three at once, 12 KiB cost a quarter of int4/g64's speed).
pub(super) fn prefetch_rows512() -> usize {
    ahead().rows512
}

/// [`prefetch_rows512`] for Q5K rows: [`PREFETCH_K5_AMD`] on AMD, [`PREFETCH`] on Intel.
pub(super) fn prefetch_k5() -> usize {
    ahead().k5
}

/// Whether the CPU says "GenuineIntel" (`cpuid`: cache the answer).
pub(crate) fn is_intel() -> bool {
    // `cpuid` leaf 0 exists on every x86-64 CPU.
    let id = __cpuid(0);
    let mut vendor = [0u8; 12];
    vendor[..4].copy_from_slice(&id.ebx.to_le_bytes());
    vendor[4..8].copy_from_slice(&id.edx.to_le_bytes());
    vendor[8..].copy_from_slice(&id.ecx.to_le_bytes());
    &vendor == b"GenuineIntel"
}

/// Prefetches the `len` bytes at `p` (a hint: any address is allowed).
#[inline(always)]
pub(super) fn prefetch(p: *const u8, len: usize) {
    prefetch_to::<_MM_HINT_T0>(p, len)
}

/// [`prefetch`] with the hint `H` (`_MM_HINT_T0`: into L1; `_MM_HINT_T1`: into L2).
#[inline(always)]
pub(super) fn prefetch_to<const H: i32>(p: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        // SAFETY: a prefetch never faults, whatever the address (SSE, x86-64's baseline).
        unsafe { _mm_prefetch::<H>(p.wrapping_add(off) as *const i8) };
        off += 64;
    }
}
