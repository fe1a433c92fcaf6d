//! x86-64 AVX2 path of FP8 weights (block-scaled e4m3 rows, tensor.rs): the bits of
//! decoding the row (`E4M3[byte] * scale`) and applying [`crate::math::dot`], with the
//! decode done in registers, four dot products at a time as [`super::float_x86`] does.
//!
//! The decode: an e4m3 byte `s eeee mmm` placed as the half `s 0eeee mmm0000000` is an f16
//! whose value is the e4m3 value times 2^-8 exactly, subnormals included (an e4m3
//! subnormal `m * 2^-9` becomes the f16 subnormal `m * 2^-17`); `vcvtph2ps` widens it to
//! f32 exactly (a normal f32: no denormal operand anywhere). Multiplying by `scale * 2^8`
//! (exact unless it overflows: such rows take the plain loop) gives the real product
//! `E4M3[byte] * scale` rounded once: the reference's bits. The NaN bytes (0x7f, 0xff)
//! would read as ±1.875 * 2^8 this way. A row holding one has a NaN product in some lane
//! whatever the activations (NaN times anything is NaN), so its dot product is NaN: the
//! one-position kernels ([`dot4`] with `SAME_X`, [`dot4_avx512`]) first test their rows'
//! bytes for NaN ([`nan_free`], three cheap integer operations per 32 bytes, which also
//! brings the rows into L1 ahead of the decode) and give NaN for a row that holds one,
//! instead of testing every decoded vector (three float operations per eight or sixteen
//! weights, a fifth of the kernel). The kernels that decode a chunk once
//! for several positions ([`dot4`] without `SAME_X`, [`dot1`]) keep the per-vector test
//! ([`nan_fix`]). Per 8 weights: one 8-byte load, a widening, a shift and a mask, the
//! conversion, two products and the add.
//!
//! The lanes are [`crate::math::dot`]'s: lane l sums the columns 8k + l in increasing k,
//! each product and sum rounded on its own (no FMA), the tail (cols mod 8) added to lanes
//! 0.. as there, then [`reduce8`]. Blocks whose width is not a multiple of 8 would put
//! two scales in one vector: those matrices take the plain loop (the same bits).

use std::arch::x86_64::*;

use crate::math::reduce8;
use crate::tensor::E4M3;

/// Largest |scale| whose `scale * 2^8` is finite (with margin).
const SCALE_MAX: f32 = 1.0e36;

/// Whether [`dot4`]/[`dot1`] take a matrix of `block`-column scale blocks.
pub fn takes(block: usize) -> bool {
    block > 0 && block.is_multiple_of(8)
}

/// Whether every scale of the row at `row` (`nb` of them) is safe to pre-multiply by 2^8.
///
/// SAFETY (caller): `row` holds `nb` f32 scales.
#[inline]
pub unsafe fn scales_ok(row: *const u8, nb: usize) -> bool {
    // SAFETY: the caller's nb scales.
    (0..nb).all(|b| unsafe { scale(row, b) }.abs() <= SCALE_MAX || !unsafe { scale(row, b) }.is_finite())
}

/// Scale `b` of the row at `row`.
#[inline(always)]
unsafe fn scale(row: *const u8, b: usize) -> f32 {
    // SAFETY: the caller's scale b is readable.
    unsafe { f32::from_le_bytes(*(row.add(4 * b) as *const [u8; 4])) }
}

/// Whether none of the `n` bytes at `p` is an e4m3 NaN (`s 1111 111`): `b | 0x80 == 0xff`
/// tested 32 bytes at a time.
///
/// SAFETY (caller): AVX2 present; `n` bytes readable at `p`.
#[inline(always)]
unsafe fn nan_free(p: *const u8, n: usize) -> bool {
    // SAFETY: loads of the caller's n bytes (32-byte steps below n, then single bytes).
    unsafe {
        let (top, ones) = (_mm256_set1_epi8(-128), _mm256_set1_epi8(-1));
        let mut hit = _mm256_setzero_si256();
        let mut i = 0;
        while i + 32 <= n {
            let v = _mm256_loadu_si256(p.add(i) as *const __m256i);
            hit = _mm256_or_si256(hit, _mm256_cmpeq_epi8(_mm256_or_si256(v, top), ones));
            i += 32;
        }
        _mm256_testz_si256(hit, hit) == 1 && (i..n).all(|k| *p.add(k) | 0x80 != 0xff)
    }
}

/// [`nan_free`] 64 bytes at a time into a mask register (AVX-512 BW): an or and a
/// compare per 64 bytes, a third of the 256-bit scan's operations per byte.
///
/// SAFETY (caller): AVX-512 F and BW present; `n` bytes readable at `p`.
#[inline(always)]
unsafe fn nan_free512(p: *const u8, n: usize) -> bool {
    // SAFETY: loads of the caller's n bytes (64-byte steps below n, then single bytes).
    unsafe {
        let (top, ones) = (_mm512_set1_epi8(-128), _mm512_set1_epi8(-1));
        let mut hit: __mmask64 = 0;
        let mut i = 0;
        while i + 64 <= n {
            let v = _mm512_loadu_si512(p.add(i) as *const __m512i);
            hit |= _mm512_cmpeq_epi8_mask(_mm512_or_si512(v, top), ones);
            i += 64;
        }
        hit == 0 && (i..n).all(|k| *p.add(k) | 0x80 != 0xff)
    }
}

/// Eight e4m3 bytes at `p` as f32, each its value times 2^-8; NaN bytes give ±1.875
/// (see the module comment: [`nan_fix`] after the product, or [`nan_free`] before).
#[inline(always)]
unsafe fn load8(p: *const u8) -> __m256 {
    // SAFETY: the caller's 8 bytes are readable at p.
    unsafe { _mm256_cvtph_ps(halves(_mm_loadl_epi64(p as *const __m128i))) }
}

/// The low eight bytes of `b` as the halves `s 0eeee mmm0000000`: each byte sign-extended
/// to 16 bits (`s s s s s s s s s eeee mmm`), shifted left by 7 (`s s eeee mmm 0000000`),
/// bit 14 cleared.
#[inline(always)]
unsafe fn halves(b: __m128i) -> __m128i {
    // SAFETY: register operations (SSE4.1 and SSE2, under the caller's AVX2).
    unsafe { _mm_and_si128(_mm_slli_epi16::<7>(_mm_cvtepi8_epi16(b)), _mm_set1_epi16(HALF_MASK)) }
}

/// The bits kept of a sign-extended, shifted byte: 1011 1111 1000 0000.
const HALF_MASK: i16 = 0xbf80u16 as i16;

/// `w` (the product of [`load8`]'s `f` and the scaled scale) with NaN where `f` came from
/// a NaN byte.
#[inline(always)]
unsafe fn nan_fix(f: __m256, w: __m256) -> __m256 {
    // SAFETY: register operations only (AVX, which the caller has).
    unsafe {
        let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), f);
        _mm256_or_ps(w, _mm256_cmp_ps::<_CMP_EQ_OQ>(abs, _mm256_set1_ps(1.875)))
    }
}

/// `out[i] = math::dot(decode(w[i]), x[i])` for i < 4: w[i] a stored FP8 row (scales
/// first, `nb = ceil(cols / block)` of them, then the bytes), x[i] `cols` f32. `SAME_X`:
/// every x[i] is x[0] (four rows, one position); else every w[i] is w[0] (one row, four
/// positions).
///
/// The bytes `ahead` past each row's are prefetched (with `SAME_X` the next rows', else
/// the one row's: the caller passes its row length for the next row).
///
/// SAFETY (caller): AVX2 and F16C present; [`takes`]`(block)`; [`scales_ok`] for each row;
/// each w[i] a whole row (all the same one unless `SAME_X`), each x[i] `cols` f32.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot4<const SAME_X: bool>(
    w: [*const u8; 4],
    x: [*const f32; 4],
    cols: usize,
    block: usize,
    ahead: usize,
) -> [f32; 4] {
    let nb = cols.div_ceil(block);
    let chunks = cols / 8;
    let per = block / 8;
    // SAFETY: every load reads inside the caller's rows and activations (chunk c < chunks,
    // scale b < nb, bytes 8c..8c+8 <= cols).
    unsafe {
        let q = w.map(|r| r.add(4 * nb));
        let nan = match SAME_X {
            true => [!nan_free(q[0], cols), !nan_free(q[1], cols), !nan_free(q[2], cols), !nan_free(q[3], cols)],
            false => [false; 4],
        };
        let mut v = [_mm256_setzero_ps(); 4];
        let mask = _mm256_set1_epi16(HALF_MASK);
        for b in 0..nb {
            let s = [
                _mm256_set1_ps(scale(w[0], b) * 256.0),
                _mm256_set1_ps(scale(w[1], b) * 256.0),
                _mm256_set1_ps(scale(w[2], b) * 256.0),
                _mm256_set1_ps(scale(w[3], b) * 256.0),
            ];
            let (mut c, end) = (b * per, ((b + 1) * per).min(chunks));
            // Four rows, one position: two chunks per step, each row's 16 bytes widened to
            // halves at once (one widening, shift and mask per 16 weights, the high eight
            // taken out by one extract); the chunks then go into the sums in order. NaN
            // bytes: the whole row is NaN (below).
            while SAME_X && c + 2 <= end {
                let (x0, x1) = (_mm256_loadu_ps(x[0].add(c * 8)), _mm256_loadu_ps(x[0].add(c * 8 + 8)));
                if c % 8 == 0 {
                    prefetch(q, c * 8 + ahead);
                }
                for i in 0..4 {
                    let b16 = _mm_loadu_si128(q[i].add(c * 8) as *const __m128i);
                    let h = _mm256_and_si256(_mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(b16)), mask);
                    let f0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
                    let f1 = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h));
                    v[i] = _mm256_add_ps(v[i], _mm256_mul_ps(_mm256_mul_ps(f0, s[i]), x0));
                    v[i] = _mm256_add_ps(v[i], _mm256_mul_ps(_mm256_mul_ps(f1, s[i]), x1));
                }
                c += 2;
            }
            for c in c..end {
                if SAME_X {
                    let x0 = _mm256_loadu_ps(x[0].add(c * 8));
                    if c % 8 == 0 {
                        prefetch(q, c * 8 + ahead);
                    }
                    for i in 0..4 {
                        let f = load8(q[i].add(c * 8));
                        v[i] = _mm256_add_ps(v[i], _mm256_mul_ps(_mm256_mul_ps(f, s[i]), x0));
                    }
                } else {
                    // One row and four positions: the row's chunk decoded once (its bytes
                    // `ahead` on, the next row's, prefetched a line at a time).
                    if ahead > 0 && c % 8 == 0 {
                        prefetch([q[0]; 1], c * 8 + ahead);
                    }
                    let f = load8(q[0].add(c * 8));
                    let wv = nan_fix(f, _mm256_mul_ps(f, s[0]));
                    for i in 0..4 {
                        v[i] = _mm256_add_ps(v[i], _mm256_mul_ps(wv, _mm256_loadu_ps(x[i].add(c * 8))));
                    }
                }
            }
        }
        let mut out = [0.0f32; 4];
        for i in 0..4 {
            let mut acc = [0.0f32; 8];
            _mm256_storeu_ps(acc.as_mut_ptr(), v[i]);
            for k in chunks * 8..cols {
                let wk = E4M3[*q[i].add(k) as usize] * scale(w[i], k / block);
                acc[k - chunks * 8] += wk * *x[i].add(k);
            }
            out[i] = if nan[i] { f32::NAN } else { reduce8(acc) };
        }
        out
    }
}

/// Prefetches the cache line `at` bytes past each of the four value pointers (the same
/// bytes of the next four rows: rows are short, 2 KiB at DeepSeek's 2048 columns, and four
/// streams of them ended before the hardware's prefetcher caught up: the loads of the
/// weights were most of the kernel's time in `perf`). A prefetch never faults.
#[inline(always)]
unsafe fn prefetch<const N: usize>(q: [*const u8; N], at: usize) {
    for p in q {
        // SAFETY: a prefetch of any address is harmless (wrapping_add: no provenance claim).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(at) as *const i8) };
    }
}

/// Scale `b` of row `a` times 2^8 in lanes 0-7 and of row `c` in lanes 8-15. (A function,
/// not a closure: a closure would not get the caller's target features, and its
/// intrinsics would be calls.)
#[inline(always)]
unsafe fn scale_pair(a: *const u8, c: *const u8, b: usize) -> __m512 {
    // SAFETY: the caller's scales; AVX-512 F present (the caller's features).
    unsafe { both(_mm256_set1_ps(scale(a, b) * 256.0), _mm256_set1_ps(scale(c, b) * 256.0)) }
}

/// `lo` in lanes 0-7 and `hi` in lanes 8-15 (AVX-512 F alone: no DQ `vinsertf32x8`).
#[inline(always)]
unsafe fn both(lo: __m256, hi: __m256) -> __m512 {
    // SAFETY: register operations; AVX-512 F present (the caller's features).
    unsafe {
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi)))
    }
}

/// The eight f32 at `p` in lanes 0-7 and again in 8-15 (one broadcast load).
#[inline(always)]
unsafe fn bcast8(p: *const f32) -> __m512 {
    // SAFETY: the caller's eight values; AVX-512 F present (the caller's features).
    unsafe { _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(p as *const f64))) }
}

/// [`dot4`] with `SAME_X` (four rows, one position) on AVX-512: rows 0 and 1 share one
/// 512-bit accumulator (lanes 0-7 row 0's eight lanes, 8-15 row 1's), rows 2 and 3 another,
/// so each step decodes 16 weights (`vcvtph2ps` of 16 halves) against the position's eight
/// values loaded into both halves: the same lanes, products and sums as [`dot4`], the same
/// bits, in half the instructions. Within a scale block it takes four chunks per step: each
/// row's 32 bytes in one load, a pair's rows interleaved by qwords (`vpunpck[lh]qdq`) and
/// widened to halves 32 at a time, so the integer work per 16 weights is a quarter of a
/// widening, a shift, a mask and half an extract instead of a gathering load and a
/// 256-bit widening, shift and mask (the 512-bit operations share two ports: the kernel is
/// bound by its operations there, not by its loads; docs/kernels.md "FP8 weights").
///
/// SAFETY (caller): AVX-512 F, BW, VL and F16C present; as [`dot4`].
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub unsafe fn dot4_avx512(w: [*const u8; 4], x: *const f32, cols: usize, block: usize, ahead: usize) -> [f32; 4] {
    let nb = cols.div_ceil(block);
    let chunks = cols / 8;
    let per = block / 8;
    // SAFETY: as in dot4.
    unsafe {
        let q = w.map(|r| r.add(4 * nb));
        let nan =
            [!nan_free512(q[0], cols), !nan_free512(q[1], cols), !nan_free512(q[2], cols), !nan_free512(q[3], cols)];
        let mut v = [_mm512_setzero_ps(); 2];
        let mask = _mm256_set1_epi16(HALF_MASK);
        let mask4 = _mm512_set1_epi16(HALF_MASK);
        for b in 0..nb {
            let s = [scale_pair(w[0], w[1], b), scale_pair(w[2], w[3], b)];
            let (mut c, end) = (b * per, ((b + 1) * per).min(chunks));
            // Four chunks at a time: each row's 32 bytes in one load, the pairs' chunks
            // interleaved as bytes (c and c + 2 from the low qwords, c + 1 and c + 3 from the
            // high ones), widened 32 at a time; the chunks then go into the sums in order.
            while c + 4 <= end {
                if c % 8 == 0 {
                    prefetch(q, c * 8 + ahead);
                }
                let xx = [
                    bcast8(x.add(c * 8)),
                    bcast8(x.add(c * 8 + 8)),
                    bcast8(x.add(c * 8 + 16)),
                    bcast8(x.add(c * 8 + 24)),
                ];
                for (k, vk) in v.iter_mut().enumerate() {
                    let ra = _mm256_loadu_si256(q[2 * k].add(c * 8) as *const __m256i);
                    let rb = _mm256_loadu_si256(q[2 * k + 1].add(c * 8) as *const __m256i);
                    let h02 = _mm512_and_si512(
                        _mm512_slli_epi16::<7>(_mm512_cvtepi8_epi16(_mm256_unpacklo_epi64(ra, rb))),
                        mask4,
                    );
                    let h13 = _mm512_and_si512(
                        _mm512_slli_epi16::<7>(_mm512_cvtepi8_epi16(_mm256_unpackhi_epi64(ra, rb))),
                        mask4,
                    );
                    let f = [
                        _mm512_cvtph_ps(_mm512_castsi512_si256(h02)),
                        _mm512_cvtph_ps(_mm512_castsi512_si256(h13)),
                        _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h02)),
                        _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h13)),
                    ];
                    for j in 0..4 {
                        *vk = _mm512_add_ps(*vk, _mm512_mul_ps(_mm512_mul_ps(f[j], s[k]), xx[j]));
                    }
                }
                c += 4;
            }
            while c < end {
                let xx = bcast8(x.add(c * 8));
                if c % 8 == 0 {
                    prefetch(q, c * 8 + ahead);
                }
                for (k, vk) in v.iter_mut().enumerate() {
                    // Rows 2k and 2k + 1's eight bytes, as halves (see `halves`).
                    let lo = _mm_loadl_epi64(q[2 * k].add(c * 8) as *const __m128i);
                    let pair =
                        _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(lo), q[2 * k + 1].add(c * 8) as *const f64));
                    let h = _mm256_and_si256(_mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(pair)), mask);
                    let f = _mm512_cvtph_ps(h);
                    *vk = _mm512_add_ps(*vk, _mm512_mul_ps(_mm512_mul_ps(f, s[k]), xx));
                }
                c += 1;
            }
        }
        let mut out = [0.0f32; 4];
        for (k, vk) in v.iter().enumerate() {
            let mut acc = [0.0f32; 16];
            _mm512_storeu_ps(acc.as_mut_ptr(), *vk);
            for (j, half) in acc.chunks_exact_mut(8).enumerate() {
                let i = 2 * k + j;
                for kk in chunks * 8..cols {
                    let wk = E4M3[*q[i].add(kk) as usize] * scale(w[i], kk / block);
                    half[kk - chunks * 8] += wk * *x.add(kk);
                }
                out[i] = if nan[i] { f32::NAN } else { reduce8(half.try_into().unwrap_or([0.0; 8])) };
            }
        }
        out
    }
}

/// [`dot4`] without `SAME_X` for `R` rows and `P` positions at once: `out[j][i]` is row j
/// times position i, each chunk of a row decoded once for the `P` positions, each
/// position's chunk loaded once for the `R` rows, `R P` chains of adds in flight; the same
/// lanes, products and sums as [`dot4`], so the same bits. The rows' bytes `ahead` past each row's
/// (the caller's `R` rows on) are prefetched a line at a time; 0 for none.
///
/// SAFETY (caller): the features of the calling wrapper; as [`dot4`] for each row.
#[inline(always)]
unsafe fn block<const R: usize, const P: usize>(
    w: [*const u8; R],
    x: [*const f32; P],
    cols: usize,
    block: usize,
    ahead: usize,
) -> [[f32; P]; R] {
    let nb = cols.div_ceil(block);
    let chunks = cols / 8;
    let per = block / 8;
    // SAFETY: as in dot4, for each row.
    unsafe {
        let q = w.map(|r| r.add(4 * nb));
        let mut v = [[_mm256_setzero_ps(); P]; R];
        for b in 0..nb {
            let s: [__m256; R] = std::array::from_fn(|j| _mm256_set1_ps(scale(w[j], b) * 256.0));
            for c in b * per..((b + 1) * per).min(chunks) {
                if ahead > 0 && c % 8 == 0 {
                    prefetch(q, c * 8 + ahead);
                }
                let xs: [__m256; P] = std::array::from_fn(|i| _mm256_loadu_ps(x[i].add(c * 8)));
                for ((vj, qj), sj) in v.iter_mut().zip(q).zip(s) {
                    let f = load8(qj.add(c * 8));
                    let wv = nan_fix(f, _mm256_mul_ps(f, sj));
                    for (vji, xi) in vj.iter_mut().zip(xs) {
                        *vji = _mm256_add_ps(*vji, _mm256_mul_ps(wv, xi));
                    }
                }
            }
        }
        let mut out = [[0.0f32; P]; R];
        for (j, (oj, vj)) in out.iter_mut().zip(v).enumerate() {
            for ((o, vji), xi) in oj.iter_mut().zip(vj).zip(x) {
                let mut acc = [0.0f32; 8];
                _mm256_storeu_ps(acc.as_mut_ptr(), vji);
                for k in chunks * 8..cols {
                    let wk = E4M3[*q[j].add(k) as usize] * scale(w[j], k / block);
                    acc[k - chunks * 8] += wk * *xi.add(k);
                }
                *o = reduce8(acc);
            }
        }
        out
    }
}

/// [`block`] of two rows and eight positions, its sixteen sums in the AVX-512 registers
/// ymm16-31 too: each row chunk's decode (a widening, shift, mask, conversion, product and
/// NaN test) serves eight positions. Two rows times four positions with AVX2's 16
/// registers, and four times four here, were no faster than one row times four (docs/kernels.md).
///
/// SAFETY (caller): AVX2, F16C, AVX-512 F and VL present; as [`block`].
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl")]
pub unsafe fn block_avx512(
    w: [*const u8; 2],
    x: [*const f32; 8],
    cols: usize,
    block: usize,
    ahead: usize,
) -> [[f32; 8]; 2] {
    // SAFETY: the caller's contract.
    unsafe { self::block::<2, 8>(w, x, cols, block, ahead) }
}

/// [`dot4`] for one row.
///
/// SAFETY (caller): as [`dot4`] for one row.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot1(w: *const u8, x: *const f32, cols: usize, block: usize) -> f32 {
    let nb = cols.div_ceil(block);
    let chunks = cols / 8;
    let per = block / 8;
    // SAFETY: as in dot4.
    unsafe {
        let q = w.add(4 * nb);
        let mut v = _mm256_setzero_ps();
        for b in 0..nb {
            let s = _mm256_set1_ps(scale(w, b) * 256.0);
            for c in b * per..((b + 1) * per).min(chunks) {
                let f = load8(q.add(c * 8));
                let wv = nan_fix(f, _mm256_mul_ps(f, s));
                v = _mm256_add_ps(v, _mm256_mul_ps(wv, _mm256_loadu_ps(x.add(c * 8))));
            }
        }
        let mut acc = [0.0f32; 8];
        _mm256_storeu_ps(acc.as_mut_ptr(), v);
        for k in chunks * 8..cols {
            acc[k - chunks * 8] += E4M3[*q.add(k) as usize] * scale(w, k / block) * *x.add(k);
        }
        reduce8(acc)
    }
}
