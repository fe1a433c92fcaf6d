//! x86-64 paths of [`super::dot_row`]: AVX2 (`vpmaddubsw`) and AVX-512 VNNI (`vpdpbusd`),
//! both on the byte planes of [`ActQ16::planes`].
//!
//! A stored byte holds two values of a block (low nibble: an even value, high: the next odd
//! one); one `pshufb` (or `vpermb`) turns nibbles into w = k + 12 (0..=24, unsigned,
//! [`TABLE`]), k the doubled value of [`MXFP4_DOUBLED`]. With h = 256 * hh + hl (hh signed
//! -128..=127, hl unsigned 0..=255) the block sums are exact integer identities:
//!
//!   sum k * h = 256 * sum w * hh + sum hl * w - 12 * sum h
//!
//! (the last term is [`ActQ16::corr`], made when the activations are quantized), and the
//! same for l. Every multiply is an unsigned byte times a signed byte: w (u8) * hh (s8), and
//! hl (u8) * w (s8: w <= 24 < 128).
//!
//! Lanes are blocks. A run of eight blocks is 128 stored bytes, 16 per block; its 32-bit
//! words are transposed so that word j of a vector belongs to the block in lane j
//! ([`LANE`]: AVX2 takes four 32-byte loads through a 4x4 transpose of words, eight
//! `vpunpck`; AVX-512 two 64-byte loads through two `vpermt2d`), and the planes are laid
//! out the same way. Every product of a block then lands in its own 32-bit lane (AVX-512:
//! two lanes, j and j + 8, folded once at the end), so the sums need no horizontal adds.
//!
//! Bounds (all exact, nothing wraps or saturates):
//! - AVX-512: a `vpdpbusd` lane adds 4 products. The hh chain takes four: |lane| <=
//!   16 * 24 * 128 = 49152, shifted left by 8 <= 12582912; the hl chain 16 * 255 * 24 =
//!   97920; the two halves of a block together stay below 2^25.
//! - AVX2: a `vpmaddubsw` pair w * hh + w * hh is at most 2 * 24 * 128 = 6144 in size, the
//!   even + odd sum of one word 12288, two words' 24576: below the i16 limit, and the
//!   wrapping 16-bit adds never wrap. hl * w pairs are at most 2 * 255 * 24 = 12240, even +
//!   odd 24480, widened by `vpmaddwd` with 1 at once; the hh sums by `vpmaddwd` with 256
//!   (|.| <= 2 * 24576 * 256).
//! - A block's lane holds sum w * h, at most 32 * 24 * 32767 < 2^25; minus 12 * sum h
//!   (< 2^24) that leaves sum k * h, |.| < 2^24.
//!
//! The float steps are the reference's (acc lane l = acc[b mod 8]): one `vpermps` puts the
//! eight blocks back in order. The last blocks of a row (fewer than eight) are read from a
//! zero-padded copy of their bytes (the planes and corrections are zero past the last block)
//! and combined one by one with the reference's step.
//!
//! No closures: a closure would be compiled without the target features of the function
//! it is in and call its intrinsics out of line.

use std::arch::x86_64::*;

use super::super::x86_rows::{stream_group, STREAMS};
use super::{combine, ActQ16, LANE};
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

/// How far ahead of the bytes being read the AVX2 kernels, and the AVX-512 ones on AMD,
/// prefetch (a few rows of a [_, 2048] matrix; chosen on Intel with 4 KiB pages).
const PREFETCH: usize = 12288;

/// How far ahead the AVX-512 kernels prefetch: on Intel the integer kernels' distance
/// (`qdot::x86_runs::prefetch_ahead`, 2 KiB; `COLIBRI_PREFETCH` sets both), since with the
/// weights in huge pages 12 KiB was slower there (Xeon, qdot_bench from 960 MB, two
/// rounds: 9.26-9.42 GB/s at one thread and 15.65-15.92 at two, against 9.95-10.05 and
/// 16.33-16.74 at 2 KiB; the AVX2 kernel read 7.4 GB/s at either distance); elsewhere
/// [`PREFETCH`].
fn ahead_avx512() -> usize {
    static AHEAD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *AHEAD.get_or_init(|| {
        if super::super::x86_runs::is_intel() {
            super::super::x86_runs::prefetch_ahead(true)
        } else {
            PREFETCH
        }
    })
}

/// `vpermps` index: block j's sum from lane [`LANE`]`[j]`.
const ORDER: [i32; 8] = {
    let mut o = [0i32; 8];
    let mut j = 0;
    while j < 8 {
        o[j] = LANE[j] as i32;
        j += 1;
    }
    o
};

/// The block in lane l (the inverse of [`LANE`]).
const BLOCK: [usize; 8] = {
    let mut b = [0usize; 8];
    let mut j = 0;
    while j < 8 {
        b[LANE[j]] = j;
        j += 1;
    }
    b
};

/// AVX-512: `vpermt2d` indices that make word j of vector c word 2c + j / 8 of the block in
/// lane j % 8, from a run's two 64-byte loads (word 4b + k of the pair: block b, word k).
const WIDX: [[i32; 16]; 2] = {
    let mut t = [[0i32; 16]; 2];
    let mut c = 0;
    while c < 2 {
        let mut j = 0;
        while j < 16 {
            t[c][j] = (4 * BLOCK[j % 8] + 2 * c + j / 8) as i32;
            j += 1;
        }
        c += 1;
    }
    t
};

/// SAFETY (caller): AVX2 present; `row` is one stored MXFP4 row for `a`'s cols; `a` has
/// its planes ([`ActQ16::has_planes`]) and p < a.n.
#[target_feature(enable = "avx2")]
pub unsafe fn dot_row_avx2(row: &[u8], a: &ActQ16, p: usize) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { body_avx2::<1>([row], a, p)[0] }
}

/// [`dot_row_avx2`] for consecutive rows of `rb` bytes each (`rows` holds `out.len()` of
/// them) times position 0, [`rows_at_once`].
///
/// SAFETY (caller): as [`dot_row_avx2`], for every row.
#[target_feature(enable = "avx2")]
pub unsafe fn dot_rows_avx2(rows: &[u8], rb: usize, a: &ActQ16, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { rows_at_once::<false, false>(rows, rb, a, out) }
}

/// Whether the AVX-512 path may use `vpermb` (AVX-512 VBMI) as its nibble table.
pub fn has_vbmi() -> bool {
    is_x86_feature_detected!("avx512vbmi")
}

/// SAFETY (caller): AVX-512 F/VL/BW/VNNI and AVX2 present; shapes as for [`dot_row_avx2`].
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw,avx512vnni")]
pub unsafe fn dot_row_avx512(row: &[u8], a: &ActQ16, p: usize) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { body_avx512::<false, 1>([row], a, p)[0] }
}

/// [`dot_rows_avx2`] with the AVX-512 body.
///
/// SAFETY (caller): as [`dot_row_avx512`], for every row.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw,avx512vnni")]
pub unsafe fn dot_rows_avx512(rows: &[u8], rb: usize, a: &ActQ16, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { rows_at_once::<true, false>(rows, rb, a, out) }
}

/// [`dot_row_avx512`] with `vpermb` as the nibble table.
///
/// SAFETY (caller): as [`dot_row_avx512`], and AVX-512 VBMI present ([`has_vbmi`]).
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw,avx512vnni,avx512vbmi")]
pub unsafe fn dot_row_avx512_vbmi(row: &[u8], a: &ActQ16, p: usize) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { body_avx512::<true, 1>([row], a, p)[0] }
}

/// [`dot_rows_avx512`] with `vpermb` as the nibble table.
///
/// SAFETY (caller): as [`dot_row_avx512_vbmi`], for every row.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw,avx512vnni,avx512vbmi")]
pub unsafe fn dot_rows_avx512_vbmi(rows: &[u8], rb: usize, a: &ActQ16, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { rows_at_once::<true, true>(rows, rb, a, out) }
}

/// The accumulator lanes of `R` rows reduced in the reference's order.
///
/// SAFETY (caller): AVX.
#[inline(always)]
unsafe fn finish<const R: usize>(accv: [__m256; R]) -> [f32; R] {
    let mut out = [0.0f32; R];
    for i in 0..R {
        let mut acc = [0.0f32; 8];
        // SAFETY: 8 floats of `acc`.
        unsafe { _mm256_storeu_ps(acc.as_mut_ptr(), accv[i]) };
        out[i] = reduce8(acc);
    }
    out
}

/// Checks the shapes every kernel relies on (the `unsafe` loads below stay inside them).
#[inline(always)]
fn check<const R: usize>(rows: &[&[u8]; R], a: &ActQ16, p: usize) {
    let (nb, sb) = (a.blocks, a.blocks.div_ceil(4) * 4);
    assert!(a.has_planes() && p < a.n && a.cols == nb * MXFP4_BLOCK && a.d.len() >= a.n * nb);
    for row in rows {
        assert!(row.len() >= sb + nb * 16);
    }
}

/// AVX2: `R` rows times position `p`.
///
/// SAFETY (caller): AVX2; the contract of [`dot_row_avx2`] for every row.
#[inline(always)]
unsafe fn body_avx2<const R: usize>(rows: [&[u8]; R], a: &ActQ16, p: usize) -> [f32; R] {
    check(&rows, a, p);
    let (nb, ds) = (a.blocks, a.dstride());
    let planes = &a.planes[p * ds * 128..(p + 1) * ds * 128];
    let corr = &a.corr[p * ds * 2..(p + 1) * ds * 2];
    let d = &a.d[p * nb..(p + 1) * nb];
    let sb = nb.div_ceil(4) * 4;
    // SAFETY: AVX2 per the callers' features; run r < runs covers blocks 8r..8r + 8 <= nb
    // (128 bytes from sb + 128r in each row, 8 scale bytes and 8 d values), and planes/corr
    // hold ds >= 8 * runs + 8 blocks when there is a tail (checked above).
    unsafe {
        let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(TABLE.as_ptr() as *const __m128i));
        let order = _mm256_loadu_si256(ORDER.as_ptr() as *const __m256i);
        let mut accv = [_mm256_setzero_ps(); R];
        let runs = nb / 8;
        for r in 0..runs {
            let mut w = [std::ptr::null(); R];
            for i in 0..R {
                w[i] = rows[i].as_ptr().add(sb + r * 128);
                // The same bytes PREFETCH bytes on (the next rows: a row is short, the
                // hardware's stream prefetch alone leaves the loads waiting on memory).
                let ahead = rows[i].as_ptr().wrapping_add(PREFETCH + r * 128) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(ahead);
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            }
            let s = run_avx2::<R>(lut, w, planes.as_ptr().add(r * 1024), corr.as_ptr().add(r * 16));
            for i in 0..R {
                let (hs, ls) = s[i];
                let sum = _mm256_add_ps(
                    _mm256_cvtepi32_ps(hs),
                    _mm256_mul_ps(_mm256_cvtepi32_ps(ls), _mm256_set1_ps(1.0 / 65536.0)),
                );
                let sum = _mm256_permutevar8x32_ps(sum, order);
                accv[i] = step(accv[i], sum, rows[i].as_ptr().add(r * 8), d.as_ptr().add(r * 8));
            }
        }
        let b0 = runs * 8;
        if b0 == nb {
            return finish(accv);
        }
        let mut tail = [[0u8; 128]; R];
        let mut w = [std::ptr::null(); R];
        for i in 0..R {
            tail[i][..(nb - b0) * 16].copy_from_slice(&rows[i][sb + b0 * 16..sb + nb * 16]);
            w[i] = tail[i].as_ptr();
        }
        let t = run_avx2::<R>(lut, w, planes.as_ptr().add(runs * 1024), corr.as_ptr().add(runs * 16));
        let mut out = [0.0f32; R];
        for i in 0..R {
            let mut acc = [0.0f32; 8];
            _mm256_storeu_ps(acc.as_mut_ptr(), accv[i]);
            let (mut h, mut l) = ([0i32; 8], [0i32; 8]);
            _mm256_storeu_si256(h.as_mut_ptr() as *mut __m256i, t[i].0);
            _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, t[i].1);
            for b in b0..nb {
                let lane = LANE[b - b0];
                combine(&mut acc, b, rows[i][b], d[b], h[lane], l[lane]);
            }
            out[i] = reduce8(acc);
        }
        out
    }
}

/// The rows [`STREAMS`] at a time, each from its own place in the call's rows (rows i,
/// i + h, ...: h = the rows / STREAMS; the activations loaded once for all of them), then
/// the last ones alone; AVX-512 (`WIDE`, `VBMI`: `vpermb`) or AVX2. Three streams of
/// addresses keep more bytes on their way from memory than one: on the AVX-512 Xeon of
/// docs/benchmarks.md (qdot_bench from memory, medians of three; thirty-ninth session)
/// the AVX-512 kernel read 11.0 GB/s at one thread and 19.7 at two with two neighbouring
/// rows at a time (as it did before), 14.5 and 26.2 with two rows half the call apart,
/// 16.2-16.4 and 28.2-29.2 with three, 15.9 and 28.3 with four.
///
/// SAFETY (caller): the contract of [`dot_rows_avx512`] (VBMI if `VBMI`) with `WIDE`, of
/// [`dot_rows_avx2`] without.
#[inline(always)]
unsafe fn rows_at_once<const WIDE: bool, const VBMI: bool>(rows: &[u8], rb: usize, a: &ActQ16, out: &mut [f32]) {
    let rb = rb.max(1);
    let n = out.len().min(rows.len() / rb);
    let h = n / STREAMS;
    for i in 0..h {
        let group = stream_group::<STREAMS>(rows, rb, h, i);
        // SAFETY: the caller's contract for each row of the group.
        let r = unsafe {
            if WIDE {
                body_avx512::<VBMI, STREAMS>(group, a, 0)
            } else {
                body_avx2::<STREAMS>(group, a, 0)
            }
        };
        for (j, v) in r.into_iter().enumerate() {
            out[i + j * h] = v;
        }
    }
    for (i, o) in out.iter_mut().enumerate().take(n).skip(STREAMS * h) {
        let row = [&rows[i * rb..(i + 1) * rb]];
        // SAFETY: as above, for one row.
        *o = unsafe {
            if WIDE {
                body_avx512::<VBMI, 1>(row, a, 0)[0]
            } else {
                body_avx2::<1>(row, a, 0)[0]
            }
        };
    }
}

/// SAFETY (caller): AVX-512 F/VL/BW/VNNI (and VBMI if `VBMI`); the contract of
/// [`dot_row_avx512`] for each of the `R` rows.
#[inline(always)]
unsafe fn body_avx512<const VBMI: bool, const R: usize>(rows: [&[u8]; R], a: &ActQ16, p: usize) -> [f32; R] {
    check(&rows, a, p);
    let (nb, ds) = (a.blocks, a.dstride());
    let planes = &a.planes[p * ds * 128..(p + 1) * ds * 128];
    let corr = &a.corr[p * ds * 2..(p + 1) * ds * 2];
    let d = &a.d[p * nb..(p + 1) * nb];
    let sb = nb.div_ceil(4) * 4;
    // SAFETY: as in body_avx2, with the callers' AVX-512 features, for every row.
    unsafe {
        // The table in each 16 bytes: `vpshufb` reads it per 128-bit lane, `vpermb` with
        // the index's bits 4-5 (the next nibble's) set or not.
        let lut = _mm512_broadcast_i32x4(_mm_loadu_si128(TABLE.as_ptr() as *const __m128i));
        let order = _mm256_loadu_si256(ORDER.as_ptr() as *const __m256i);
        let widx = [_mm512_loadu_epi32(WIDX[0].as_ptr()), _mm512_loadu_epi32(WIDX[1].as_ptr())];
        let mut accv = [_mm256_setzero_ps(); R];
        let runs = nb / 8;
        let pf = ahead_avx512();
        for r in 0..runs {
            let mut w = [std::ptr::null(); R];
            for i in 0..R {
                w[i] = rows[i].as_ptr().add(sb + r * 128);
                let ahead = rows[i].as_ptr().wrapping_add(pf + r * 128) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(ahead);
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            }
            let t = run_avx512::<VBMI, R>(lut, widx, w, planes.as_ptr().add(r * 1024), corr.as_ptr().add(r * 16));
            for i in 0..R {
                // Lanes 0-7: f32 of the sums k * h, lanes 8-15 of k * l (lane order).
                let f = _mm512_cvtepi32_ps(t[i]);
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(f)));
                let sum = _mm256_add_ps(_mm512_castps512_ps256(f), _mm256_mul_ps(hi, _mm256_set1_ps(1.0 / 65536.0)));
                let sum = _mm256_permutevar8x32_ps(sum, order);
                accv[i] = step_avx512(accv[i], sum, rows[i].as_ptr().add(r * 8), d.as_ptr().add(r * 8));
            }
        }
        let b0 = runs * 8;
        if b0 == nb {
            return finish(accv);
        }
        let mut tail = [[0u8; 128]; R];
        let mut w = [std::ptr::null(); R];
        for i in 0..R {
            tail[i][..(nb - b0) * 16].copy_from_slice(&rows[i][sb + b0 * 16..sb + nb * 16]);
            w[i] = tail[i].as_ptr();
        }
        let t = run_avx512::<VBMI, R>(lut, widx, w, planes.as_ptr().add(runs * 1024), corr.as_ptr().add(runs * 16));
        let mut out = [0.0f32; R];
        for i in 0..R {
            let mut acc = [0.0f32; 8];
            _mm256_storeu_ps(acc.as_mut_ptr(), accv[i]);
            let mut s = [0i32; 16];
            _mm512_storeu_si512(s.as_mut_ptr() as *mut __m512i, t[i]);
            for b in b0..nb {
                let lane = LANE[b - b0];
                combine(&mut acc, b, rows[i][b], d[b], s[lane], s[lane + 8]);
            }
            out[i] = reduce8(acc);
        }
        out
    }
}

/// acc + (e8m0_half(s) * d) * sum for eight blocks, the reference's float steps in its
/// order (the scale 2^(e - 128) built from its bits as `e8m0_half` does).
///
/// SAFETY (caller): AVX2; 8 scale bytes at `s`, 8 floats at `d`.
#[inline(always)]
unsafe fn step(acc: __m256, sum: __m256, s: *const u8, d: *const f32) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(s as *const __m128i));
        // e8m0_half: e < 2 gives 0x0020_0000 << e (a subnormal), else (e - 1) << 23.
        let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
        let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
        let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
        let sc = _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small));
        _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(sc, _mm256_loadu_ps(d)), sum))
    }
}

/// [`step`] with `vscalefps`: d * 2^(e - 128) rounded once, which is the reference's
/// e8m0_half(e) * d (the power of two is exact, subnormal or not, and the product is
/// rounded once either way; NaN d stays NaN, overflow gives infinity in both).
///
/// SAFETY (caller): AVX-512 F/VL; 8 scale bytes at `s`, 8 floats at `d`.
#[inline(always)]
unsafe fn step_avx512(acc: __m256, sum: __m256, s: *const u8, d: *const f32) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(s as *const __m128i));
        let pow = _mm256_cvtepi32_ps(_mm256_sub_epi32(e, _mm256_set1_epi32(128)));
        _mm256_add_ps(acc, _mm256_mul_ps(_mm256_scalef_ps(_mm256_loadu_ps(d), pow), sum))
    }
}

/// AVX2: the exact sums k * h and k * l of a run for `R` rows (lane [`LANE`]`[j]` = block
/// j): 128 stored bytes at each `w[i]`, the run's 1024 plane bytes at `x`, its 16
/// corrections at `c`.
///
/// SAFETY (caller): AVX2; the bytes are readable.
#[inline(always)]
unsafe fn run_avx2<const R: usize>(
    lut: __m256i,
    w: [*const u8; R],
    x: *const u8,
    c: *const i32,
) -> [(__m256i, __m256i); R] {
    // SAFETY: the caller's contract.
    unsafe {
        let low = _mm256_set1_epi8(15);
        // Word k of each block of the run, blocks in lane order (a 4x4 transpose of the
        // words of each 128-bit lane: v_m holds blocks 2m and 2m + 1).
        let mut t = [[_mm256_setzero_si256(); 4]; R];
        for i in 0..R {
            let v0 = _mm256_loadu_si256(w[i] as *const __m256i);
            let v1 = _mm256_loadu_si256(w[i].add(32) as *const __m256i);
            let v2 = _mm256_loadu_si256(w[i].add(64) as *const __m256i);
            let v3 = _mm256_loadu_si256(w[i].add(96) as *const __m256i);
            let (a, b) = (_mm256_unpacklo_epi32(v0, v1), _mm256_unpackhi_epi32(v0, v1));
            let (c2, d2) = (_mm256_unpacklo_epi32(v2, v3), _mm256_unpackhi_epi32(v2, v3));
            t[i] = [
                _mm256_unpacklo_epi64(a, c2),
                _mm256_unpackhi_epi64(a, c2),
                _mm256_unpacklo_epi64(b, d2),
                _mm256_unpackhi_epi64(b, d2),
            ];
        }
        // Per row: the 16-bit sums w * hh of words (0, 1) and (2, 3), for h and for l, and
        // the 32-bit sums hl * w.
        let mut hh = [[_mm256_setzero_si256(); 2]; R];
        let mut lh = [[_mm256_setzero_si256(); 2]; R];
        let mut hl = [_mm256_setzero_si256(); R];
        let mut ll = [_mm256_setzero_si256(); R];
        let ones = _mm256_set1_epi16(1);
        for k in 0..4 {
            let xk = x.add((k / 2) * 512 + (k % 2) * 32);
            let mut pv = [_mm256_setzero_si256(); 8];
            for (m, v) in pv.iter_mut().enumerate() {
                *v = _mm256_loadu_si256(xk.add(64 * m) as *const __m256i);
            }
            for i in 0..R {
                let we = _mm256_shuffle_epi8(lut, _mm256_and_si256(t[i][k], low));
                let wo = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16::<4>(t[i][k]), low));
                let h_hi = _mm256_add_epi16(_mm256_maddubs_epi16(we, pv[0]), _mm256_maddubs_epi16(wo, pv[1]));
                let l_hi = _mm256_add_epi16(_mm256_maddubs_epi16(we, pv[4]), _mm256_maddubs_epi16(wo, pv[5]));
                let h_lo = _mm256_add_epi16(_mm256_maddubs_epi16(pv[2], we), _mm256_maddubs_epi16(pv[3], wo));
                let l_lo = _mm256_add_epi16(_mm256_maddubs_epi16(pv[6], we), _mm256_maddubs_epi16(pv[7], wo));
                hh[i][k / 2] = _mm256_add_epi16(hh[i][k / 2], h_hi);
                lh[i][k / 2] = _mm256_add_epi16(lh[i][k / 2], l_hi);
                hl[i] = _mm256_add_epi32(hl[i], _mm256_madd_epi16(h_lo, ones));
                ll[i] = _mm256_add_epi32(ll[i], _mm256_madd_epi16(l_lo, ones));
            }
        }
        let k256 = _mm256_set1_epi16(256);
        let ch = _mm256_loadu_si256(c as *const __m256i);
        let cl = _mm256_loadu_si256(c.add(8) as *const __m256i);
        let mut out = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
        for i in 0..R {
            let h = _mm256_add_epi32(_mm256_madd_epi16(hh[i][0], k256), _mm256_madd_epi16(hh[i][1], k256));
            let l = _mm256_add_epi32(_mm256_madd_epi16(lh[i][0], k256), _mm256_madd_epi16(lh[i][1], k256));
            out[i] =
                (_mm256_sub_epi32(_mm256_add_epi32(h, hl[i]), ch), _mm256_sub_epi32(_mm256_add_epi32(l, ll[i]), cl));
        }
        out
    }
}

/// AVX-512: the exact sums of a run for `R` rows (their stored bytes at `w[i]`; the
/// activations are loaded once for all of them): lane [`LANE`]`[j]` = k * h of block j,
/// lane 8 + [`LANE`]`[j]` = k * l; the run's 1024 plane bytes at `x`, its 16 corrections
/// at `c`.
///
/// SAFETY (caller): AVX-512 F/BW/VNNI (VBMI if `VBMI`); 128 bytes at each `w[i]`, 1024 at
/// `x`, 16 i32 at `c`.
#[inline(always)]
unsafe fn run_avx512<const VBMI: bool, const R: usize>(
    lut: __m512i,
    widx: [__m512i; 2],
    w: [*const u8; R],
    x: *const u8,
    c: *const i32,
) -> [__m512i; R] {
    // SAFETY: the caller's contract.
    unsafe {
        // Per row and part: the hh chain (times 256 at the end) and the hl chain.
        let mut h = [[_mm512_setzero_si512(); 2]; R];
        let mut l = [[_mm512_setzero_si512(); 2]; R];
        // Words 2c (lanes 0-7) and 2c + 1 (lanes 8-15) of each block, blocks in lane order.
        let mut wv = [[_mm512_setzero_si512(); 2]; R];
        for i in 0..R {
            let l0 = _mm512_loadu_si512(w[i] as *const __m512i);
            let l1 = _mm512_loadu_si512(w[i].add(64) as *const __m512i);
            wv[i] = [_mm512_permutex2var_epi32(l0, widx[0], l1), _mm512_permutex2var_epi32(l0, widx[1], l1)];
        }
        // `cc` picks the plane vectors and each row's word vector alike.
        #[allow(clippy::needless_range_loop)]
        for cc in 0..2 {
            let v = x.add(512 * cc) as *const __m512i;
            let mut pv = [_mm512_setzero_si512(); 8];
            for (k, p) in pv.iter_mut().enumerate() {
                *p = _mm512_loadu_si512(v.add(k));
            }
            for i in 0..R {
                let (we, wo) = nibbles::<VBMI>(lut, wv[i][cc]);
                h[i][0] = _mm512_dpbusd_epi32(h[i][0], we, pv[0]);
                h[i][0] = _mm512_dpbusd_epi32(h[i][0], wo, pv[1]);
                h[i][1] = _mm512_dpbusd_epi32(h[i][1], pv[2], we);
                h[i][1] = _mm512_dpbusd_epi32(h[i][1], pv[3], wo);
                l[i][0] = _mm512_dpbusd_epi32(l[i][0], we, pv[4]);
                l[i][0] = _mm512_dpbusd_epi32(l[i][0], wo, pv[5]);
                l[i][1] = _mm512_dpbusd_epi32(l[i][1], pv[6], we);
                l[i][1] = _mm512_dpbusd_epi32(l[i][1], pv[7], wo);
            }
        }
        let corr = _mm512_loadu_epi32(c);
        let mut out = [_mm512_setzero_si512(); R];
        for i in 0..R {
            let hs = _mm512_add_epi32(_mm512_slli_epi32::<8>(h[i][0]), h[i][1]);
            let ls = _mm512_add_epi32(_mm512_slli_epi32::<8>(l[i][0]), l[i][1]);
            // Lanes j and 8 + j of hs (ls) are the two halves of one block's sum.
            let lo = _mm512_shuffle_i64x2::<0b01_00_01_00>(hs, ls);
            let hi = _mm512_shuffle_i64x2::<0b11_10_11_10>(hs, ls);
            out[i] = _mm512_sub_epi32(_mm512_add_epi32(lo, hi), corr);
        }
        out
    }
}

/// AVX-512: w = k + 12 of the low nibbles (even values) and of the high nibbles (odd
/// values) of the 64 stored bytes in `bytes`.
///
/// SAFETY (caller): AVX-512 F/BW (VBMI if `VBMI`).
#[inline(always)]
unsafe fn nibbles<const VBMI: bool>(lut: __m512i, bytes: __m512i) -> (__m512i, __m512i) {
    // SAFETY: the caller's contract.
    unsafe {
        if VBMI {
            // vpermb reads 6 index bits: the nibble and two bits of its neighbour, which the
            // table (repeated every 16 bytes) ignores; no masking.
            (_mm512_permutexvar_epi8(bytes, lut), _mm512_permutexvar_epi8(_mm512_srli_epi16::<4>(bytes), lut))
        } else {
            let low = _mm512_set1_epi8(15);
            (
                _mm512_shuffle_epi8(lut, _mm512_and_si512(bytes, low)),
                _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16::<4>(bytes), low)),
            )
        }
    }
}

/// [`super::quantize_block`] with AVX2 (the same operations on eight values at a time, so
/// the same bits): the parts of one block of 32 into `hi` and `lo` (even-then-odd order);
/// returns d_b. Blocks that hold NaN or an infinity, or whose max |x| is tiny, take the
/// reference.
///
/// SAFETY (caller): AVX2 present.
#[target_feature(enable = "avx2")]
pub unsafe fn quantize_block_avx2(x: &[f32], hi: &mut [i16], lo: &mut [i16]) -> f32 {
    let (x, hi, lo) = (&x[..MXFP4_BLOCK], &mut hi[..MXFP4_BLOCK], &mut lo[..MXFP4_BLOCK]);
    // SAFETY: AVX2 per this function's features; 32 floats at x, 32 i16 at hi and lo.
    unsafe {
        let xp = x.as_ptr();
        let v =
            [_mm256_loadu_ps(xp), _mm256_loadu_ps(xp.add(8)), _mm256_loadu_ps(xp.add(16)), _mm256_loadu_ps(xp.add(24))];
        let abs = _mm256_set1_epi32(0x7fff_ffff);
        let m01 = _mm256_max_epu32(
            _mm256_and_si256(_mm256_castps_si256(v[0]), abs),
            _mm256_and_si256(_mm256_castps_si256(v[1]), abs),
        );
        let m23 = _mm256_max_epu32(
            _mm256_and_si256(_mm256_castps_si256(v[2]), abs),
            _mm256_and_si256(_mm256_castps_si256(v[3]), abs),
        );
        let m = _mm256_max_epu32(m01, m23);
        let m = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m));
        let m = _mm_max_epu32(m, _mm_shuffle_epi32::<0b01_00_11_10>(m));
        let m = _mm_max_epu32(m, _mm_shuffle_epi32::<0b10_11_00_01>(m));
        let amax_bits = _mm_cvtsi128_si32(m) as u32;
        if !(super::TINY_BITS..0x7f80_0000).contains(&amax_bits) {
            return super::quantize_block(x, hi, lo);
        }
        let amax = f32::from_bits(amax_bits);
        let (inv, d) = (super::QMAX / amax, amax / super::QMAX);
        let inv_lo = 65536.0 / d;
        let (inv, dv, inv_lo) = (_mm256_set1_ps(inv), _mm256_set1_ps(d), _mm256_set1_ps(inv_lo));
        let (magic, qmax, qmin) =
            (_mm256_set1_ps(12_582_912.0), _mm256_set1_ps(super::QMAX), _mm256_set1_ps(-super::QMAX));
        let mut h = [_mm256_setzero_si256(); 4];
        let mut l = [_mm256_setzero_si256(); 4];
        for i in 0..4 {
            // The reference's steps, each rounded on its own: (x * inv + M) - M clamped, then
            // ((x - h * d) * inv_lo + M) - M clamped (max then min: no NaN here).
            let hf = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v[i], inv), magic), magic);
            let hf = _mm256_min_ps(_mm256_max_ps(hf, qmin), qmax);
            let r = _mm256_mul_ps(_mm256_sub_ps(v[i], _mm256_mul_ps(hf, dv)), inv_lo);
            let lf = _mm256_sub_ps(_mm256_add_ps(r, magic), magic);
            let lf = _mm256_min_ps(_mm256_max_ps(lf, qmin), qmax);
            h[i] = _mm256_cvttps_epi32(hf);
            l[i] = _mm256_cvttps_epi32(lf);
        }
        // i16 in column order, then each 128-bit lane's even words to its low 8 bytes and
        // odd words to its high 8 bytes, then evens of both lanes low, odds high.
        let split = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
        );
        for (parts, out) in [(h, &mut *hi), (l, &mut *lo)] {
            for half in 0..2 {
                let w =
                    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(parts[2 * half], parts[2 * half + 1]));
                let eo = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(w, split));
                // Values 16 * half.. : evens at 8 * half, odds at 16 + 8 * half.
                _mm_storeu_si128(out.as_mut_ptr().add(8 * half) as *mut __m128i, _mm256_castsi256_si128(eo));
                _mm_storeu_si128(
                    out.as_mut_ptr().add(16 + 8 * half) as *mut __m128i,
                    _mm256_extracti128_si256::<1>(eo),
                );
            }
        }
        d
    }
}
