//! x86-64 paths of [`super::dot_row`]: AVX2 (`vpmaddubsw`, two blocks per 256-bit vector)
//! and AVX-512 VNNI (`vpdpbusd`, four blocks per 512-bit vector), both on the byte planes
//! of [`ActQ16::planes`].
//!
//! One load of stored bytes holds the nibbles of adjacent blocks (16 bytes each). Its low
//! nibbles are the blocks' even values and its high nibbles their odd values, in the order
//! of the planes; one `pshufb` each turns them into w = k + 12 (0..=24, unsigned,
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
//!   24480; all below the i16 limit 32767, so the saturating adds never saturate. Then
//!   `vpmaddwd` with 256 (|.| <= 2 * 12288 * 256 = 6291456) and with 1 widens to i32.
//! - The four lanes of a block (exact i32 adds) hold sum w * h, at most
//!   32 * 24 * 32767 < 2^25; minus 12 * sum h (< 2^24) that leaves sum k * h, |.| < 2^24.
//!
//! Blocks go eight at a time (a run). AVX2: pairs (0, 1), (2, 3), (4, 5), (6, 7); three
//! `vphaddd` leave block j in lane [`PAIR_LANE`]`[j]`. AVX-512: quads (0-3), (4-7); two
//! 64-bit unpacks and two `vshufps` leave [`QUAD_LANE`]. The corrections are permuted to
//! that order, the float sums put back in block order by one `vpermps`, and the float steps
//! are the reference's (acc lane l = acc[b mod 8]). The last blocks of a row (fewer than
//! eight) are read from a zero-padded copy of their bytes (the planes and corrections are
//! zero past the last block) and combined one by one with the reference's step.
//!
//! No closures: a closure would be compiled without the target features of the function
//! it is in and call its intrinsics out of line.

use std::arch::x86_64::*;

use super::{combine, ActQ16};
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

/// How far ahead of the bytes being read the kernels prefetch (a few rows of a
/// [_, 2048] matrix).
const PREFETCH: usize = 12288;

/// AVX2: the lane of block j of a run in its sums (even blocks in lanes 0-3, odd in 4-7).
const PAIR_LANE: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// AVX2: [`PAIR_LANE`] for `vpermps` (the float sums back in block order).
const PAIR_ORDER: [i32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// AVX2: the block whose correction lane l takes (the inverse of [`PAIR_LANE`]).
const PAIR_BLOCK: [i32; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// AVX-512: the lane of block j's sum of k * h in the 16-lane result (block i and i + 4
/// share the 128-bit lane i: h of i, h of i + 4, l of i, l of i + 4); l is 2 lanes on.
const QUAD_LANE: [usize; 8] = [0, 4, 8, 12, 1, 5, 9, 13];

/// AVX-512: [`QUAD_LANE`] for `vpermps` (the float sums back in block order; the upper
/// eight lanes are not read).
const QUAD_ORDER: [i32; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0];

/// AVX-512: the correction (index into a run's 8 h then 8 l values) that lane l takes.
const QUAD_CORR: [i32; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// SAFETY (caller): AVX2 present; `row` is one stored MXFP4 row for `a`'s cols; `a` has
/// its planes ([`ActQ16::has_planes`]) and p < a.n.
#[target_feature(enable = "avx2")]
pub unsafe fn dot_row_avx2(row: &[u8], a: &ActQ16, p: usize) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { body_avx2(row, a, p) }
}

/// [`dot_row_avx2`] for consecutive rows of `rb` bytes each (`rows` holds `out.len()` of
/// them) times position 0, in one call: the row loop is compiled with the body.
///
/// SAFETY (caller): as [`dot_row_avx2`], for every row.
#[target_feature(enable = "avx2")]
pub unsafe fn dot_rows_avx2(rows: &[u8], rb: usize, a: &ActQ16, out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb.max(1))) {
        // SAFETY: the caller's contract, row by row.
        *o = unsafe { body_avx2(row, a, 0) };
    }
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
    unsafe { rows_avx512::<false>(rows, rb, a, out) }
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
    unsafe { rows_avx512::<true>(rows, rb, a, out) }
}

/// SAFETY (caller): AVX2; the contract of [`dot_row_avx2`].
#[inline(always)]
unsafe fn body_avx2(row: &[u8], a: &ActQ16, p: usize) -> f32 {
    let nb = a.blocks;
    let ds = a.dstride();
    let (scales, vals) = row.split_at(nb.div_ceil(4) * 4);
    let planes = &a.planes[p * ds * 128..(p + 1) * ds * 128];
    let corr = &a.corr[p * ds * 2..(p + 1) * ds * 2];
    let d = &a.d[p * nb..(p + 1) * nb];
    assert!(vals.len() >= nb * 16 && scales.len() >= nb && a.cols == nb * MXFP4_BLOCK);
    // SAFETY: AVX2 per the callers' features; run r < runs covers blocks 8r..8r + 8 <= nb
    // (16 bytes each in `vals`, 8 scale bytes and 8 d values), and planes/corr hold
    // ds >= 8 * runs + 8 blocks when there is a tail.
    unsafe {
        let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(TABLE.as_ptr() as *const __m128i));
        let order = _mm256_loadu_si256(PAIR_ORDER.as_ptr() as *const __m256i);
        let cperm = _mm256_loadu_si256(PAIR_BLOCK.as_ptr() as *const __m256i);
        let mut accv = _mm256_setzero_ps();
        let runs = nb / 8;
        for r in 0..runs {
            let w = vals.as_ptr().add(r * 128);
            let ahead = row.as_ptr().wrapping_add(PREFETCH + r * 128) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            let (hs, ls) = run_avx2(lut, cperm, w, planes.as_ptr().add(r * 1024), corr.as_ptr().add(r * 16));
            let sum = _mm256_add_ps(
                _mm256_cvtepi32_ps(hs),
                _mm256_mul_ps(_mm256_cvtepi32_ps(ls), _mm256_set1_ps(1.0 / 65536.0)),
            );
            let sum = _mm256_permutevar8x32_ps(sum, order);
            accv = step(accv, sum, scales.as_ptr().add(r * 8), d.as_ptr().add(r * 8));
        }
        let mut acc = [0.0f32; 8];
        _mm256_storeu_ps(acc.as_mut_ptr(), accv);
        if runs * 8 < nb {
            let b0 = runs * 8;
            let mut w = [0u8; 128];
            w[..(nb - b0) * 16].copy_from_slice(&vals[b0 * 16..nb * 16]);
            let (hs, ls) =
                run_avx2(lut, cperm, w.as_ptr(), planes.as_ptr().add(runs * 1024), corr.as_ptr().add(runs * 16));
            let (mut h, mut l) = ([0i32; 8], [0i32; 8]);
            _mm256_storeu_si256(h.as_mut_ptr() as *mut __m256i, hs);
            _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, ls);
            for b in b0..nb {
                let lane = PAIR_LANE[b - b0];
                combine(&mut acc, b, scales[b], d[b], h[lane], l[lane]);
            }
        }
        reduce8(acc)
    }
}

/// The rows two at a time (the activations loaded once for both), the last one alone.
///
/// SAFETY (caller): the contract of [`dot_rows_avx512`] (VBMI if `VBMI`).
#[inline(always)]
unsafe fn rows_avx512<const VBMI: bool>(rows: &[u8], rb: usize, a: &ActQ16, out: &mut [f32]) {
    let mut i = 0;
    while i + 4 <= out.len() {
        let r4 = [
            &rows[i * rb..(i + 1) * rb],
            &rows[(i + 1) * rb..(i + 2) * rb],
            &rows[(i + 2) * rb..(i + 3) * rb],
            &rows[(i + 3) * rb..(i + 4) * rb],
        ];
        // SAFETY: the caller's contract for rows i..i + 4.
        let r = unsafe { body_avx512::<VBMI, 4>(r4, a, 0) };
        out[i..i + 4].copy_from_slice(&r);
        i += 4;
    }
    while i + 2 <= out.len() {
        // SAFETY: the caller's contract for rows i and i + 1.
        let r =
            unsafe { body_avx512::<VBMI, 2>([&rows[i * rb..(i + 1) * rb], &rows[(i + 1) * rb..(i + 2) * rb]], a, 0) };
        out[i..i + 2].copy_from_slice(&r);
        i += 2;
    }
    if i < out.len() {
        // SAFETY: as above, for the last row.
        out[i] = unsafe { body_avx512::<VBMI, 1>([&rows[i * rb..(i + 1) * rb]], a, 0)[0] };
    }
}

/// SAFETY (caller): AVX-512 F/VL/BW/VNNI (and VBMI if `VBMI`); the contract of
/// [`dot_row_avx512`] for each of the `R` rows.
#[inline(always)]
unsafe fn body_avx512<const VBMI: bool, const R: usize>(rows: [&[u8]; R], a: &ActQ16, p: usize) -> [f32; R] {
    let nb = a.blocks;
    let ds = a.dstride();
    let planes = &a.planes[p * ds * 128..(p + 1) * ds * 128];
    let corr = &a.corr[p * ds * 2..(p + 1) * ds * 2];
    let d = &a.d[p * nb..(p + 1) * nb];
    let sb = nb.div_ceil(4) * 4;
    for row in rows {
        assert!(row.len() >= sb + nb * 16 && a.cols == nb * MXFP4_BLOCK);
    }
    // SAFETY: as in body_avx2, with the callers' AVX-512 features, for every row.
    unsafe {
        // The table in each 16 bytes: `vpshufb` reads it per 128-bit lane, `vpermb` with
        // the index's bits 4-5 (the next nibble's) set or not.
        let lut = _mm512_broadcast_i32x4(_mm_loadu_si128(TABLE.as_ptr() as *const __m128i));
        let order = _mm512_loadu_epi32(QUAD_ORDER.as_ptr());
        let cperm = _mm512_loadu_epi32(QUAD_CORR.as_ptr());
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
            let t = run_avx512::<VBMI, R>(lut, cperm, w, planes.as_ptr().add(r * 1024), corr.as_ptr().add(r * 16));
            for i in 0..R {
                // Lanes 4j and 4j + 1: f32(h) + f32(l) * 2^-16 of blocks j and j + 4.
                let f = _mm512_cvtepi32_ps(t[i]);
                let lo = _mm512_mul_ps(_mm512_permute_ps::<0b11_10_11_10>(f), _mm512_set1_ps(1.0 / 65536.0));
                let sum = _mm512_castps512_ps256(_mm512_permutexvar_ps(order, _mm512_add_ps(f, lo)));
                accv[i] = step_avx512(accv[i], sum, rows[i].as_ptr().add(r * 8), d.as_ptr().add(r * 8));
            }
        }
        let mut out = [0.0f32; R];
        let mut tail = [[0u8; 128]; R];
        let b0 = runs * 8;
        let mut w = [std::ptr::null(); R];
        for i in 0..R {
            tail[i][..(nb - b0) * 16].copy_from_slice(&rows[i][sb + b0 * 16..sb + nb * 16]);
            w[i] = tail[i].as_ptr();
        }
        let t = if b0 < nb {
            run_avx512::<VBMI, R>(lut, cperm, w, planes.as_ptr().add(runs * 1024), corr.as_ptr().add(runs * 16))
        } else {
            [_mm512_setzero_si512(); R]
        };
        for i in 0..R {
            let mut acc = [0.0f32; 8];
            _mm256_storeu_ps(acc.as_mut_ptr(), accv[i]);
            let mut s = [0i32; 16];
            _mm512_storeu_si512(s.as_mut_ptr() as *mut __m512i, t[i]);
            for b in b0..nb {
                let lane = QUAD_LANE[b - b0];
                combine(&mut acc, b, rows[i][b], d[b], s[lane], s[lane + 2]);
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

/// AVX2: the exact sums k * h and k * l of a run (lane [`PAIR_LANE`]`[j]` = block j):
/// 128 stored bytes at `w`, the run's 1024 plane bytes at `x`, its 16 corrections at `c`.
///
/// SAFETY (caller): AVX2; the bytes are readable.
#[inline(always)]
unsafe fn run_avx2(lut: __m256i, cperm: __m256i, w: *const u8, x: *const u8, c: *const i32) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract. Pair (2m, 2m + 1) is half m % 2 of quad m / 2.
    unsafe {
        let (h0, l0) = pair_avx2(lut, w, x);
        let (h1, l1) = pair_avx2(lut, w.add(32), x.add(32));
        let (h2, l2) = pair_avx2(lut, w.add(64), x.add(512));
        let (h3, l3) = pair_avx2(lut, w.add(96), x.add(544));
        let hs = _mm256_hadd_epi32(_mm256_hadd_epi32(h0, h1), _mm256_hadd_epi32(h2, h3));
        let ls = _mm256_hadd_epi32(_mm256_hadd_epi32(l0, l1), _mm256_hadd_epi32(l2, l3));
        let ch = _mm256_permutevar8x32_epi32(_mm256_loadu_si256(c as *const __m256i), cperm);
        let cl = _mm256_permutevar8x32_epi32(_mm256_loadu_si256(c.add(8) as *const __m256i), cperm);
        (_mm256_sub_epi32(hs, ch), _mm256_sub_epi32(ls, cl))
    }
}

/// AVX2: lanes 0-3 hold block 2m's partial sums of w * h (and of w * l), lanes 4-7 block
/// 2m + 1's; the planes are 32-byte halves of the quad's 64-byte vectors.
///
/// SAFETY (caller): as [`run_avx2`]; 32 bytes at `w`, the plane vectors at `x + 64k`.
#[inline(always)]
unsafe fn pair_avx2(lut: __m256i, w: *const u8, x: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract.
    unsafe {
        let low = _mm256_set1_epi8(15);
        let bytes = _mm256_loadu_si256(w as *const __m256i);
        let we = _mm256_shuffle_epi8(lut, _mm256_and_si256(bytes, low));
        let wo = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), low));
        let h = part_avx2(we, wo, x);
        let l = part_avx2(we, wo, x.add(256));
        (h, l)
    }
}

/// AVX2: sum w * (256 * hh + hl) in four lanes per block, from the planes hh_even,
/// hh_odd, hl_even, hl_odd at `x`, `x + 64`, `x + 128`, `x + 192`.
///
/// SAFETY (caller): as [`pair_avx2`].
#[inline(always)]
unsafe fn part_avx2(we: __m256i, wo: __m256i, x: *const u8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let (he, ho) = (_mm256_loadu_si256(x as *const __m256i), _mm256_loadu_si256(x.add(64) as *const __m256i));
        let (le, lo) =
            (_mm256_loadu_si256(x.add(128) as *const __m256i), _mm256_loadu_si256(x.add(192) as *const __m256i));
        let hi = _mm256_add_epi16(_mm256_maddubs_epi16(we, he), _mm256_maddubs_epi16(wo, ho));
        let lo = _mm256_add_epi16(_mm256_maddubs_epi16(le, we), _mm256_maddubs_epi16(lo, wo));
        _mm256_add_epi32(_mm256_madd_epi16(hi, _mm256_set1_epi16(256)), _mm256_madd_epi16(lo, _mm256_set1_epi16(1)))
    }
}

/// AVX-512: the exact sums of a run for `R` rows (their stored bytes at `w[i]`; the
/// activations are loaded once for all of them), lane 4j + {0, 1, 2, 3} = k * h of block j,
/// of block j + 4, k * l of block j, of block j + 4 ([`QUAD_LANE`]); the run's 1024 plane
/// bytes at `x`, its 16 corrections at `c`.
///
/// SAFETY (caller): AVX-512 F/BW/VNNI (VBMI if `VBMI`); 128 bytes at each `w[i]`, 1024 at
/// `x`, 16 i32 at `c`.
#[inline(always)]
unsafe fn run_avx512<const VBMI: bool, const R: usize>(
    lut: __m512i,
    cperm: __m512i,
    w: [*const u8; R],
    x: *const u8,
    c: *const i32,
) -> [__m512i; R] {
    // SAFETY: the caller's contract.
    unsafe {
        let corr = _mm512_permutexvar_epi32(cperm, _mm512_loadu_epi32(c));
        let mut q = [[_mm512_setzero_si512(); 4]; R];
        for m in 0..2 {
            let v = x.add(512 * m) as *const __m512i;
            let mut planes = [_mm512_setzero_si512(); 8];
            for (k, p) in planes.iter_mut().enumerate() {
                *p = _mm512_loadu_si512(v.add(k));
            }
            for i in 0..R {
                let (we, wo) = nibbles::<VBMI>(lut, w[i].add(64 * m));
                q[i][m] = part_avx512(we, wo, &planes[..4]);
                q[i][2 + m] = part_avx512(we, wo, &planes[4..]);
            }
        }
        let mut out = [_mm512_setzero_si512(); R];
        for i in 0..R {
            let [h0, h1, l0, l1] = q[i];
            // 128-bit lane j: [a0 + a2, a1 + a3, b0 + b2, b1 + b3] of blocks a = j, b = j + 4.
            let sh = _mm512_add_epi32(_mm512_unpacklo_epi64(h0, h1), _mm512_unpackhi_epi64(h0, h1));
            let sl = _mm512_add_epi32(_mm512_unpacklo_epi64(l0, l1), _mm512_unpackhi_epi64(l0, l1));
            let (fh, fl) = (_mm512_castsi512_ps(sh), _mm512_castsi512_ps(sl));
            let even = _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(fh, fl));
            let odd = _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(fh, fl));
            out[i] = _mm512_sub_epi32(_mm512_add_epi32(even, odd), corr);
        }
        out
    }
}

/// AVX-512: the 64 stored bytes at `w` as w = k + 12 of their low nibbles (128-bit lane j:
/// block j's even values) and of their high nibbles (its odd values).
///
/// SAFETY (caller): AVX-512 F/BW (VBMI if `VBMI`); 64 bytes at `w`.
#[inline(always)]
unsafe fn nibbles<const VBMI: bool>(lut: __m512i, w: *const u8) -> (__m512i, __m512i) {
    // SAFETY: the caller's contract.
    unsafe {
        let bytes = _mm512_loadu_si512(w as *const __m512i);
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

/// AVX-512: sum w * (256 * hh + hl) in four lanes per block, from the planes hh_even,
/// hh_odd, hl_even, hl_odd in `v`.
#[inline(always)]
unsafe fn part_avx512(we: __m512i, wo: __m512i, v: &[__m512i]) -> __m512i {
    // SAFETY: register-only AVX-512 VNNI operations, reached from the target_feature
    // functions.
    unsafe {
        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), we, v[0]);
        let s = _mm512_dpbusd_epi32(s, wo, v[1]);
        let s = _mm512_slli_epi32::<8>(s);
        let s = _mm512_dpbusd_epi32(s, v[2], we);
        _mm512_dpbusd_epi32(s, v[3], wo)
    }
}
