//! x86-64 AVX2 path of the float weights (f32, bf16, f16: a Hugging Face directory read
//! directly): [`crate::math::dot`]'s bits, four dot products at a time.
//!
//! `math::dot` keeps eight lanes (lane l sums the products of columns 8k + l in order), so
//! each lane is one chain of dependent additions: one 8-lane vector per add latency (four
//! cycles) is all a single dot product can do. Four independent products (four rows times
//! one position, or one row times four positions) keep four chains in flight; each is the
//! same vector chain as [`crate::math::dot_avx2`] with the weights decoded on the fly
//! (bf16: the 16 bits shifted up; f16: `vcvtph2ps`; both exact), then the same tail and
//! the same [`reduce8`]: the same bits.

use std::arch::x86_64::*;

use half::f16;

use crate::math::reduce8;

/// Stored float kinds (const parameter of the kernels).
pub const F32: u8 = 0;
pub const BF16: u8 = 1;
pub const F16: u8 = 2;

/// Bytes per stored value of kind `K`.
#[inline(always)]
const fn width<const K: u8>() -> usize {
    if K == F32 {
        4
    } else {
        2
    }
}

/// Eight values of kind `K` from `p` (unaligned) as f32.
#[inline(always)]
unsafe fn load8<const K: u8>(p: *const u8) -> __m256 {
    // SAFETY: the caller's 8 values are readable at p.
    unsafe {
        if K == F32 {
            _mm256_loadu_ps(p as *const f32)
        } else if K == BF16 {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        } else {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
        }
    }
}

/// One value of kind `K` from `p`.
#[inline(always)]
unsafe fn load1<const K: u8>(p: *const u8) -> f32 {
    // SAFETY: the caller's value is readable at p.
    unsafe {
        if K == F32 {
            f32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)])
        } else if K == BF16 {
            f32::from_bits((u16::from_le_bytes([*p, *p.add(1)]) as u32) << 16)
        } else {
            f16::from_bits(u16::from_le_bytes([*p, *p.add(1)])).to_f32()
        }
    }
}

/// `out[i] = math::dot(w[i] decoded, x[i])` for i < 4 over `cols` values, bit for bit.
/// `SAME_X`: every x[i] is x[0] (four rows times one position: loaded once). `ahead`: the
/// bytes that far past each row's (with `SAME_X` the four rows', else the one row's: its
/// caller passes a row length, the next row) are prefetched a 64-byte line at a time, into
/// L2 with `L2` (else L1); 0 for none.
///
/// SAFETY (caller): AVX2 and F16C present; each w[i] holds `cols` values of kind `K`,
/// each x[i] `cols` f32.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot4<const K: u8, const SAME_X: bool, const L2: bool>(
    w: [*const u8; 4],
    x: [*const f32; 4],
    cols: usize,
    ahead: usize,
) -> [f32; 4] {
    let chunks = cols / 8;
    let wd = width::<K>();
    // Chunks per 64-byte line of a row.
    let line = 64 / (8 * wd);
    // SAFETY: every load reads values c * 8..c * 8 + 8 < cols (or one value < cols); a
    // prefetch never faults.
    unsafe {
        let mut v = [_mm256_setzero_ps(); 4];
        for c in 0..chunks {
            if ahead > 0 && c % line == 0 {
                // Four rows (SAME_X), or the one row (its later bytes: the rows after it).
                for wi in if SAME_X { &w[..] } else { &w[..1] } {
                    let p = wi.wrapping_add(c * 8 * wd + ahead) as *const i8;
                    match L2 {
                        true => _mm_prefetch::<_MM_HINT_T1>(p),
                        false => _mm_prefetch::<_MM_HINT_T0>(p),
                    }
                }
            }
            let x0 = _mm256_loadu_ps(x[0].add(c * 8));
            for i in 0..4 {
                let xi = if SAME_X || i == 0 { x0 } else { _mm256_loadu_ps(x[i].add(c * 8)) };
                v[i] = _mm256_add_ps(v[i], _mm256_mul_ps(load8::<K>(w[i].add(c * 8 * wd)), xi));
            }
        }
        let mut out = [0.0f32; 4];
        for i in 0..4 {
            let mut acc = [0.0f32; 8];
            _mm256_storeu_ps(acc.as_mut_ptr(), v[i]);
            for k in chunks * 8..cols {
                acc[k - chunks * 8] += load1::<K>(w[i].add(k * wd)) * *x[i].add(k);
            }
            out[i] = reduce8(acc);
        }
        out
    }
}

/// `out[j][i] = math::dot(w[j] decoded, x[i])` for `R` rows j and four positions i, bit
/// for bit: each chunk of a row decoded once for the four positions, each position's chunk
/// loaded once for the `R` rows, `4 R` chains of adds in flight (the one-row
/// [`dot4`] without `SAME_X` keeps four, and loads four position chunks per row chunk). The
/// rows' bytes `ahead` past each row's (the caller's `R` rows on) are prefetched a 64-byte
/// line at a time; 0 for none. AVX2 has 16 vector registers: [`block_avx2`] takes two rows
/// (eight sums, four positions and a row's chunk); AVX-512 has 32: [`block_avx512`] four.
///
/// SAFETY (caller): the features of the calling wrapper; each w[j] holds `cols` values of
/// kind `K`, each x[i] `cols` f32.
#[inline(always)]
unsafe fn block<const K: u8, const R: usize>(
    w: [*const u8; R],
    x: [*const f32; 4],
    cols: usize,
    ahead: usize,
) -> [[f32; 4]; R] {
    let chunks = cols / 8;
    let wd = width::<K>();
    let line = 64 / (8 * wd);
    // SAFETY: as in dot4: every load reads values c * 8..c * 8 + 8 <= cols (or one value <
    // cols); a prefetch never faults.
    unsafe {
        let mut v = [[_mm256_setzero_ps(); 4]; R];
        for c in 0..chunks {
            if ahead > 0 && c % line == 0 {
                for wj in w {
                    _mm_prefetch::<_MM_HINT_T0>(wj.wrapping_add(c * 8 * wd + ahead) as *const i8);
                }
            }
            let xs = [
                _mm256_loadu_ps(x[0].add(c * 8)),
                _mm256_loadu_ps(x[1].add(c * 8)),
                _mm256_loadu_ps(x[2].add(c * 8)),
                _mm256_loadu_ps(x[3].add(c * 8)),
            ];
            for (vj, wj) in v.iter_mut().zip(w) {
                let wv = load8::<K>(wj.add(c * 8 * wd));
                for (vji, xi) in vj.iter_mut().zip(xs) {
                    *vji = _mm256_add_ps(*vji, _mm256_mul_ps(wv, xi));
                }
            }
        }
        let mut out = [[0.0f32; 4]; R];
        for ((oj, vj), wj) in out.iter_mut().zip(v).zip(w) {
            for ((o, vji), xi) in oj.iter_mut().zip(vj).zip(x) {
                let mut acc = [0.0f32; 8];
                _mm256_storeu_ps(acc.as_mut_ptr(), vji);
                for k in chunks * 8..cols {
                    acc[k - chunks * 8] += load1::<K>(wj.add(k * wd)) * *xi.add(k);
                }
                *o = reduce8(acc);
            }
        }
        out
    }
}

/// [`block`] of two rows (AVX2 and F16C).
///
/// SAFETY (caller): AVX2 and F16C present; as [`block`].
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn block_avx2<const K: u8>(
    w: [*const u8; 2],
    x: [*const f32; 4],
    cols: usize,
    ahead: usize,
) -> [[f32; 4]; 2] {
    // SAFETY: the caller's contract.
    unsafe { block::<K, 2>(w, x, cols, ahead) }
}

/// [`block`] of four rows, its sixteen sums in the AVX-512 registers ymm16-31 too.
///
/// SAFETY (caller): AVX2, F16C, AVX-512 F and VL present; as [`block`].
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl")]
pub unsafe fn block_avx512<const K: u8>(
    w: [*const u8; 4],
    x: [*const f32; 4],
    cols: usize,
    ahead: usize,
) -> [[f32; 4]; 4] {
    // SAFETY: the caller's contract.
    unsafe { block::<K, 4>(w, x, cols, ahead) }
}

/// `math::dot(w decoded, x)` for one row (the rows left after the fours).
///
/// SAFETY (caller): as [`dot4`] for one row.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot1<const K: u8>(w: *const u8, x: *const f32, cols: usize) -> f32 {
    let chunks = cols / 8;
    let wd = width::<K>();
    // SAFETY: as in dot4.
    unsafe {
        let mut v = _mm256_setzero_ps();
        for c in 0..chunks {
            v = _mm256_add_ps(v, _mm256_mul_ps(load8::<K>(w.add(c * 8 * wd)), _mm256_loadu_ps(x.add(c * 8))));
        }
        let mut acc = [0.0f32; 8];
        _mm256_storeu_ps(acc.as_mut_ptr(), v);
        for k in chunks * 8..cols {
            acc[k - chunks * 8] += load1::<K>(w.add(k * wd)) * *x.add(k);
        }
        reduce8(acc)
    }
}
