//! One stored row times a few positions ([`FEW`] = 32 per pass) on AVX-512 VNNI and AVX2:
//! a batch's decode step, a speculative step's drafts, an expert that a few of a step's
//! rows chose, a short prompt. Below [`super::prepare_min`] positions preparing the row
//! ([`super::tile`]) does not pay, and the one-position kernel once per position loaded and
//! unpacked the row's bytes again for each (from L1) and paid its set-up each time: in
//! `coli bench --batch 4` that call was 59% of the decode's samples. Here each run of eight
//! blocks is loaded and unpacked once, then applied to every position. Per position the
//! integer sums and their float combination are those of the one-position kernels
//! (`quad_runs`, `int8_runs`, `paired_runs`, `sums8`), so the bits are too.

use std::arch::x86_64::*;

use super::x86::{body, fifth_pair, has_quads};
use super::x86_runs::{combine, finish, fold_pairs, hsum8, prefetch, prefetch_ahead, run_scales};
use super::x86_wide::{fifth_quad, fold_quads};
use super::{round4, ActQ, CHUNK};

/// Positions per pass over a row (an accumulator vector each).
pub const FEW: usize = 32;

/// `out[i]` = [`super::x86::dot_row_avx512`] of `row` and position `p0 + i`, [`FEW`]
/// positions per pass (layouts the run kernels do not take go one at a time).
///
/// SAFETY (caller): AVX-512 F/VL/BW/VNNI, AVX2 and F16C present; `row` is one stored row
/// for `a`'s cols and group; positions `p0..p0 + out.len()` are inside `a`.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub unsafe fn dot_row_few_avx512(int4: bool, row: &[u8], a: &ActQ, p0: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract (one row of its own length).
    unsafe { rows_of_kind::<true, false>(int4, row, row.len(), a, p0, out) }
}

/// [`dot_row_few_avx512`] on AVX2: `out[i]` = [`super::x86::dot_row_avx2`] of `row` and
/// position `p0 + i` (int4 on the pair layout, int8 through `vpsignb`).
///
/// SAFETY (caller): AVX2 and F16C present; shapes as [`dot_row_few_avx512`].
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot_row_few_avx2(int4: bool, row: &[u8], a: &ActQ, p0: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract (one row of its own length).
    unsafe { rows_of_kind::<false, false>(int4, row, row.len(), a, p0, out) }
}

/// [`dot_row_few_avx512`] over consecutive rows of `rb` bytes: `out[k * n + i]` is row k
/// times position `p0 + i`, `n` = out.len() / rows. One call for a group of rows, so a
/// row's set-up is not a call of its own (a decode step's row of 2048 int8 values is two
/// runs of eight blocks).
///
/// SAFETY (caller): as [`dot_row_few_avx512`] for every row; `rows.len()` a multiple of
/// `rb`, `out.len()` = rows * n with n >= 1.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub unsafe fn dot_rows_few_avx512(int4: bool, rows: &[u8], rb: usize, a: &ActQ, p0: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { rows_of_kind::<true, false>(int4, rows, rb, a, p0, out) }
}

/// [`dot_rows_few_avx512`] on AVX2 ([`dot_row_few_avx2`] row by row).
///
/// SAFETY (caller): AVX2 and F16C present; shapes as [`dot_rows_few_avx512`].
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot_rows_few_avx2(int4: bool, rows: &[u8], rb: usize, a: &ActQ, p0: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { rows_of_kind::<false, false>(int4, rows, rb, a, p0, out) }
}

/// [`dot_row_few_avx2`] with AVX-VNNI: int8 rows through [`flipped_runs_few`] (one 256-bit
/// `vpdpbusd` per 32 values and position instead of `vpsignb`, `vpmaddubsw`, `vpmaddwd`);
/// int4 as on AVX2.
///
/// SAFETY (caller): AVX2, F16C and AVX-VNNI present; shapes as [`dot_row_few_avx512`].
#[target_feature(enable = "avx2,f16c,avxvnni")]
pub unsafe fn dot_row_few_avxvnni(int4: bool, row: &[u8], a: &ActQ, p0: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract (one row of its own length).
    unsafe { rows_of_kind::<false, true>(int4, row, row.len(), a, p0, out) }
}

/// [`dot_rows_few_avx2`] with AVX-VNNI ([`dot_row_few_avxvnni`] row by row).
///
/// SAFETY (caller): AVX2, F16C and AVX-VNNI present; shapes as [`dot_rows_few_avx512`].
#[target_feature(enable = "avx2,f16c,avxvnni")]
pub unsafe fn dot_rows_few_avxvnni(int4: bool, rows: &[u8], rb: usize, a: &ActQ, p0: usize, out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { rows_of_kind::<false, true>(int4, rows, rb, a, p0, out) }
}

/// [`few_rows`] for the row kind (int4, Q4K/Q5K, int8), `n` = out.len() / rows.
///
/// SAFETY (caller): as [`dot_rows_few_avx512`] (AVX-512 only when `VNNI`).
#[inline(always)]
unsafe fn rows_of_kind<const VNNI: bool, const AV: bool>(
    int4: bool,
    rows: &[u8],
    rb: usize,
    a: &ActQ,
    p0: usize,
    out: &mut [f32],
) {
    let n = out.len() / (rows.len() / rb.max(1)).max(1);
    // SAFETY: the caller's contract, row by row.
    unsafe {
        match (int4, a.k4) {
            (true, true) => few_rows::<VNNI, true, true, AV>(rows, rb, a, p0, n, out),
            (true, false) => few_rows::<VNNI, true, false, AV>(rows, rb, a, p0, n, out),
            _ => few_rows::<VNNI, false, false, AV>(rows, rb, a, p0, n, out),
        }
    }
}

/// Whether the run kernels take `a`'s layout (else the one-position kernel runs per position).
#[inline(always)]
fn takes<const VNNI: bool, const INT4: bool>(a: &ActQ) -> bool {
    let g = a.group;
    match (VNNI, INT4) {
        (true, true) => has_quads(a),
        (false, true) => a.split && a.qp.len() == a.n * a.dstride() * g && matches!(g, 32 | 64 | 128),
        (_, false) => !a.split && matches!(g, 32 | 64 | 128),
    }
}

/// [`few`] for each row of `rows`, `n` outputs per row. Two positions (an expert that two
/// of a step's rows chose, two sequences' step) and, for int4, three run with the count
/// known to the compiler, their accumulators in registers: qdot_bench on the Xeon, from
/// memory, two threads, at two positions int4/g32 13.4 -> 18.7 GB/s of weights, at three
/// 11.7 -> 16.1; int8/g128 at two 19.0 -> 20.1 in one build and 25.3 in another (code
/// placement: docs/benchmarks.md). int8 over three or four positions and int4
/// over four or eight were slower that way (int4/g32 at four, one thread, 8.2 -> 6.8: more
/// live vectors than registers), so those keep the loop over positions.
///
/// SAFETY (caller): as [`dot_rows_few_avx512`].
#[inline(always)]
unsafe fn few_rows<const VNNI: bool, const INT4: bool, const K: bool, const AV: bool>(
    rows: &[u8],
    rb: usize,
    a: &ActQ,
    p0: usize,
    n: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller's contract.
    unsafe {
        match n {
            2 if takes::<VNNI, INT4>(a) => rows_n::<VNNI, INT4, K, AV, 2>(rows, rb, a, p0, out),
            3 if INT4 && takes::<VNNI, INT4>(a) => rows_n::<VNNI, INT4, K, AV, 3>(rows, rb, a, p0, out),
            _ => {
                for (row, o) in rows.chunks_exact(rb.max(1)).zip(out.chunks_mut(n.max(1))) {
                    few::<VNNI, INT4, K, AV>(row, a, p0, o);
                }
            }
        }
    }
}

/// Each row of `rows` times exactly `N` positions ([`runs_few`] with all `N` accumulators).
///
/// SAFETY (caller): as [`dot_rows_few_avx512`], `out.len()` = rows * N, and [`takes`] holds.
#[inline(always)]
unsafe fn rows_n<const VNNI: bool, const INT4: bool, const K: bool, const AV: bool, const N: usize>(
    rows: &[u8],
    rb: usize,
    a: &ActQ,
    p0: usize,
    out: &mut [f32],
) {
    for (row, o) in rows.chunks_exact(rb.max(1)).zip(out.chunks_exact_mut(N)) {
        // SAFETY: the caller's contract, row by row.
        unsafe { runs_few::<VNNI, INT4, K, AV, N>(row, a, p0, o) }
    }
}

#[inline(always)]
unsafe fn few<const VNNI: bool, const INT4: bool, const K: bool, const AV: bool>(
    row: &[u8],
    a: &ActQ,
    p0: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller's contract; the runs end at or before the stored bytes (`inside`),
    // as in `body`.
    unsafe {
        if !takes::<VNNI, INT4>(a) {
            for (i, o) in out.iter_mut().enumerate() {
                *o = body::<VNNI, INT4, K>(row, a, p0 + i);
            }
            return;
        }
        for (c, out) in out.chunks_mut(FEW).enumerate() {
            // Accumulators sized to the call: zeroing and addressing 32 of them for a
            // decode step of 8 cost 5% of that step (measured).
            if out.len() <= 8 {
                runs_few::<VNNI, INT4, K, AV, 8>(row, a, p0 + c * FEW, out);
            } else {
                runs_few::<VNNI, INT4, K, AV, FEW>(row, a, p0 + c * FEW, out);
            }
        }
    }
}

/// [`few`] for up to `N` positions whose layout the run kernels take.
///
/// SAFETY (caller): as [`dot_row_few_avx512`] (AVX-512 only when `VNNI`); `out.len() <= N`;
/// `a` holds the quad (AVX-512) or pair (AVX2) layout for int4, or unsplit activations for
/// int8, of a group of 32, 64 or 128.
#[inline(always)]
unsafe fn runs_few<const VNNI: bool, const INT4: bool, const K: bool, const AV: bool, const N: usize>(
    row: &[u8],
    a: &ActQ,
    p0: usize,
    out: &mut [f32],
) {
    let g = a.group;
    let vals = &row[round4(a.blocks * 2)..];
    let inside = if INT4 { vals.len() * 2 } else { vals.len() };
    let runs = (a.blocks / 8).min(inside / (8 * g));
    // SAFETY: the caller's contract; the runs end at or before the stored bytes (`inside`),
    // as in `body`.
    unsafe {
        let mut all = [_mm256_setzero_ps(); N];
        // A call that fills the array ([`rows_n`]) takes all of it: the slice's length is
        // then N to the compiler, which unrolls the loops over positions.
        let acc = if N <= 3 { &mut all[..] } else { &mut all[..out.len()] };
        match (VNNI, INT4, g / CHUNK) {
            (true, true, 1) => quad_runs_few::<1, K>(row, vals, a, p0, runs, acc),
            (true, true, 2) => quad_runs_few::<2, K>(row, vals, a, p0, runs, acc),
            (true, true, _) => quad_runs_few::<4, K>(row, vals, a, p0, runs, acc),
            (true, false, 1) => int8_runs_few::<1>(row, vals, a, p0, runs, acc),
            (true, false, 2) => int8_runs_few::<2>(row, vals, a, p0, runs, acc),
            (true, false, _) => int8_runs_few::<4>(row, vals, a, p0, runs, acc),
            (false, true, 1) => paired_runs_few::<1, K>(row, vals, a, p0, runs, acc),
            (false, true, 2) => paired_runs_few::<2, K>(row, vals, a, p0, runs, acc),
            (false, true, _) => paired_runs_few::<4, K>(row, vals, a, p0, runs, acc),
            (false, false, 1) if AV => flipped_runs_few::<1>(row, vals, a, p0, runs, acc),
            (false, false, 2) if AV => flipped_runs_few::<2>(row, vals, a, p0, runs, acc),
            (false, false, _) if AV => flipped_runs_few::<4>(row, vals, a, p0, runs, acc),
            (false, false, 1) => signed_runs_few::<1>(row, vals, a, p0, runs, acc),
            (false, false, 2) => signed_runs_few::<2>(row, vals, a, p0, runs, acc),
            (false, false, _) => signed_runs_few::<4>(row, vals, a, p0, runs, acc),
        }
        for (i, (o, &acc)) in out.iter_mut().zip(acc.iter()).enumerate() {
            *o = finish::<VNNI, INT4, K>(row, a, p0 + i, (runs * 8, acc));
        }
    }
}

/// How far ahead the AVX2 few-position runs prefetch: the one-position AVX2 kernels'
/// distance where they have one (AMD before Zen 4), else the AVX-512 kernels' (Intel, whose
/// one-position AVX2 kernels prefetch nothing). Each run's loads otherwise waited on memory
/// before its positions' work: on the Xeon with `COLIBRI_SIMD=avx2`, qdot_bench at 4
/// positions, 2 threads, int8/g128 11.9 -> 14.9 GB/s of weights, int4/g32 8.8 -> 11.8.
/// `COLIBRI_PREFETCH` overrides it as it does both.
fn ahead_avx2() -> usize {
    match prefetch_ahead(false) {
        0 => prefetch_ahead(true),
        d => d,
    }
}

/// `quad_runs` for positions `p0..p0 + acc.len()`: each 64-byte load of nibbles split once
/// into its low and high halves, then two `vpdpbusd` per position against its quad layout.
///
/// SAFETY (caller): AVX-512 F/BW/VNNI present; the runs' bytes are inside `vals`
/// (8 * group * runs <= 2 * vals.len()); `a` holds the quad layout of every position;
/// `row` holds the runs' scales.
#[inline(always)]
unsafe fn quad_runs_few<const CH: usize, const K: bool>(
    row: &[u8],
    vals: &[u8],
    a: &ActQ,
    p0: usize,
    runs: usize,
    acc: &mut [__m256],
) {
    let (g, ds) = (a.group, a.dstride());
    // SAFETY: the caller's contract; a run reads 4 * g bytes of `vals` and, per position,
    // 8 * g of its quad layout (ds * g per position); d and s hold ds >= 8 * runs entries.
    unsafe {
        let low4 = _mm512_set1_epi8(0x0f);
        let ahead = prefetch_ahead(true);
        // Q5K (group 32): the fifth bits after the nibbles (x86::fifth_quad).
        let k5 = K && a.k5;
        let high = vals.as_ptr().wrapping_add(a.cols / 2);
        for r in 0..runs {
            if ahead > 0 {
                prefetch(vals.as_ptr().wrapping_add(ahead + r * 4 * g), 4 * g);
            }
            let w0 = vals.as_ptr().add(r * 4 * g);
            let (mut lo, mut hi) = ([_mm512_setzero_si512(); 8], [_mm512_setzero_si512(); 8]);
            for k in 0..2 * CH {
                let w = _mm512_loadu_si512(w0.add(64 * k) as *const __m512i);
                lo[k] = _mm512_and_si512(w, low4);
                hi[k] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
                if k5 {
                    let (l5, h5) = fifth_quad(high.add(32 * r + 16 * k));
                    (lo[k], hi[k]) = (_mm512_or_si512(lo[k], l5), _mm512_or_si512(hi[k], h5));
                }
            }
            let sc = run_scales::<K>(row.as_ptr().add(16 * r));
            for (i, acc) in acc.iter_mut().enumerate() {
                let p = p0 + i;
                let x0 = a.qz.as_ptr().add(p * ds * g + r * 8 * g);
                let mut v = [_mm512_setzero_si512(); 8];
                for k in 0..2 * CH {
                    let even = _mm512_loadu_si512(x0.add(128 * k) as *const __m512i);
                    let odd = _mm512_loadu_si512(x0.add(128 * k + 64) as *const __m512i);
                    v[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[k], even), hi[k], odd);
                }
                add_run::<3, K>(acc, sc, fold_quads::<CH>(&mut v), a, p, r);
            }
        }
    }
}

/// `int8_runs` for positions `p0..p0 + acc.len()`: each 64 stored bytes loaded and flipped
/// to w + 128 once, then one `vpdpbusd` per position.
///
/// SAFETY (caller): AVX-512 F/BW/VNNI present; the runs' bytes are inside `vals`
/// (8 * group * runs <= vals.len()); the activations are unsplit; `row` holds the runs'
/// scales.
#[inline(always)]
unsafe fn int8_runs_few<const CH: usize>(
    row: &[u8],
    vals: &[u8],
    a: &ActQ,
    p0: usize,
    runs: usize,
    acc: &mut [__m256],
) {
    let (g, qs) = (a.group, a.blocks * a.group);
    // SAFETY: the caller's contract; a run reads 8 * g bytes of `vals` and, per position,
    // 8 * g values of its `q` row (qs of them); d and s hold ds >= 8 * runs entries.
    unsafe {
        let flip = _mm512_set1_epi8(-128);
        // `int8_runs`' prefetch: without it each run's loads waited on memory before its
        // positions' work could start (`perf`: nine tenths of this kernel's samples on the
        // loads; qdot_bench int8/g128, 4 positions, 2 threads: 11.7 GB/s of weights).
        let ahead = prefetch_ahead(true);
        for r in 0..runs {
            if ahead > 0 {
                prefetch(vals.as_ptr().wrapping_add(ahead + r * 8 * g), 8 * g);
            }
            let w0 = vals.as_ptr().add(r * 8 * g);
            let mut w = [_mm512_setzero_si512(); 16];
            for (k, wk) in w.iter_mut().enumerate().take(4 * CH) {
                *wk = _mm512_xor_si512(_mm512_loadu_si512(w0.add(64 * k) as *const __m512i), flip);
            }
            let sc = run_scales::<false>(row.as_ptr().add(16 * r));
            for (i, acc) in acc.iter_mut().enumerate() {
                let p = p0 + i;
                let x0 = a.q.as_ptr().add(p * qs + r * 8 * g);
                let mut v = [_mm512_setzero_si512(); 8];
                for (k, &wk) in w.iter().enumerate().take(4 * CH) {
                    let x = _mm512_loadu_si512(x0.add(64 * k) as *const __m512i);
                    // A block of 128 spans two vectors: their sums are added first.
                    let j = if CH == 4 { k / 2 } else { k };
                    v[j] = _mm512_dpbusd_epi32(v[j], wk, x);
                }
                let sums = if CH == 1 { fold_quads::<2>(&mut v) } else { fold_quads::<4>(&mut v) };
                add_run::<7, false>(acc, sc, sums, a, p, r);
            }
        }
    }
}

/// The AVX2 one-position int4 kernel's runs (`paired_runs` on the pair layout) for
/// positions `p0..p0 + acc.len()`: each run's nibbles loaded and split once, then per
/// position two `vpmaddubsw` per chunk pair, 16-bit sums over up to four chunks, one
/// `vpmaddwd` (the bounds of `pairs8`).
///
/// SAFETY (caller): AVX2 present; the runs' bytes are inside `vals`
/// (8 * group * runs <= 2 * vals.len()); `a` holds the pair layout of every position;
/// `row` holds the runs' scales.
#[inline(always)]
unsafe fn paired_runs_few<const CH: usize, const K: bool>(
    row: &[u8],
    vals: &[u8],
    a: &ActQ,
    p0: usize,
    runs: usize,
    acc: &mut [__m256],
) {
    let (g, ds) = (a.group, a.dstride());
    // SAFETY: the caller's contract; a run reads 4 * g bytes of `vals` and, per position,
    // 8 * g of its pair layout (ds * g per position); d and s hold ds >= 8 * runs entries.
    unsafe {
        let (low4, ones) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
        // Q5K: the fifth bits after the nibbles (x86::fifth_pair), sums folded as for two
        // chunks (x86::pairs8_k5's bounds).
        let k5 = K && a.k5;
        let high = vals.as_ptr().wrapping_add(a.cols / 2);
        let ahead = ahead_avx2();
        for r in 0..runs {
            if ahead > 0 {
                prefetch(vals.as_ptr().wrapping_add(ahead + r * 4 * g), 4 * g);
            }
            let c0 = r * 8 * g;
            let h5 = if k5 { _mm256_loadu_si256(high.add(32 * r) as *const __m256i) } else { _mm256_setzero_si256() };
            let (mut lo, mut hi) = ([_mm256_setzero_si256(); 16], [_mm256_setzero_si256(); 16]);
            for i in 0..4 {
                for m in 0..CH {
                    let lo_at = ((c0 + i * g) >> 1) + m * 16;
                    let x = _mm256_loadu2_m128i(
                        vals.as_ptr().add(lo_at + 2 * g) as *const __m128i,
                        vals.as_ptr().add(lo_at) as *const __m128i,
                    );
                    lo[i * CH + m] = _mm256_and_si256(x, low4);
                    hi[i * CH + m] = _mm256_and_si256(_mm256_srli_epi16(x, 4), low4);
                    if k5 {
                        let (l5, hh5) = fifth_pair(h5, i);
                        lo[i * CH + m] = _mm256_or_si256(lo[i * CH + m], l5);
                        hi[i * CH + m] = _mm256_or_si256(hi[i * CH + m], hh5);
                    }
                }
            }
            let sc = run_scales::<K>(row.as_ptr().add(16 * r));
            for (j, acc) in acc.iter_mut().enumerate() {
                let p = p0 + j;
                let qp = a.qp.as_ptr().add(p * ds * g + c0);
                let mut t = [_mm256_setzero_si256(); 4];
                for (i, ti) in t.iter_mut().enumerate() {
                    // At most four chunks' 16-bit pair sums before widening (`pairs8`).
                    for m in 0..CH {
                        let q = qp.add((i * CH + m) * 64);
                        let even = _mm256_loadu_si256(q as *const __m256i);
                        let odd = _mm256_loadu_si256(q.add(32) as *const __m256i);
                        let two = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo[i * CH + m], even),
                            _mm256_maddubs_epi16(hi[i * CH + m], odd),
                        );
                        *ti = _mm256_add_epi16(*ti, two);
                    }
                }
                let isum = if CH <= 2 {
                    fold_pairs(t, if k5 { 2 } else { CH })
                } else {
                    // No closure (`map`): it would not inherit the target features.
                    let mut v = t;
                    for vi in v.iter_mut() {
                        *vi = _mm256_madd_epi16(*vi, ones);
                    }
                    _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]))
                };
                add_run::<3, K>(acc, sc, isum, a, p, r);
            }
        }
    }
}

/// The AVX2 one-position int8 kernel's runs (`sums8`: |w| times x with w's sign) for
/// positions `p0..p0 + acc.len()`: each chunk's |w| formed once, then per position one
/// `vpsignb`, `vpmaddubsw` and `vpmaddwd`.
///
/// SAFETY (caller): AVX2 present; the runs' bytes are inside `vals`
/// (8 * group * runs <= vals.len()); the activations are unsplit; `row` holds the runs'
/// scales.
#[inline(always)]
unsafe fn signed_runs_few<const CH: usize>(
    row: &[u8],
    vals: &[u8],
    a: &ActQ,
    p0: usize,
    runs: usize,
    acc: &mut [__m256],
) {
    let (g, qs) = (a.group, a.blocks * a.group);
    // SAFETY: the caller's contract; a run reads 8 * g bytes of `vals` and, per position,
    // 8 * g values of its `q` row (qs of them); d holds ds >= 8 * runs entries.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let ahead = ahead_avx2();
        for r in 0..runs {
            let c0 = r * 8 * g;
            if ahead > 0 {
                prefetch(vals.as_ptr().wrapping_add(ahead + c0), 8 * g);
            }
            let (mut w, mut aw) = ([_mm256_setzero_si256(); 32], [_mm256_setzero_si256(); 32]);
            for k in 0..8 * CH {
                w[k] = _mm256_loadu_si256(vals.as_ptr().add(c0 + k * CHUNK) as *const __m256i);
                aw[k] = _mm256_sign_epi8(w[k], w[k]);
            }
            let sc = run_scales::<false>(row.as_ptr().add(16 * r));
            for (j, acc) in acc.iter_mut().enumerate() {
                let p = p0 + j;
                let x0 = a.q.as_ptr().add(p * qs + c0);
                let mut v = [_mm256_setzero_si256(); 8];
                for (b, vb) in v.iter_mut().enumerate() {
                    for k in b * CH..(b + 1) * CH {
                        let x = _mm256_loadu_si256(x0.add(k * CHUNK) as *const __m256i);
                        // |w| <= 128, |x| <= 127: a pair is at most 32512, no saturation.
                        let pairs = _mm256_maddubs_epi16(aw[k], _mm256_sign_epi8(x, w[k]));
                        *vb = _mm256_add_epi32(*vb, _mm256_madd_epi16(pairs, ones));
                    }
                }
                let isum = hsum8(&v);
                add_run::<0, false>(acc, sc, isum, a, p, r);
            }
        }
    }
}

/// [`signed_runs_few`] with AVX-VNNI: each run's 32-byte chunks flipped to w + 128 once
/// (unsigned, so `vpdpbusd` takes them with the activations as they are), then per position
/// one 256-bit `vpdpbusd` per chunk into its block's vector, the eight block sums
/// ([`hsum8`]) less 128 times each block's activation sum, as the AVX-512 int8 runs: the
/// same integers, so the same bits.
///
/// SAFETY (caller): AVX2 and AVX-VNNI present; the runs' bytes are inside `vals`
/// (8 * group * runs <= vals.len()); the activations are unsplit; `row` holds the runs'
/// scales.
#[inline(always)]
unsafe fn flipped_runs_few<const CH: usize>(
    row: &[u8],
    vals: &[u8],
    a: &ActQ,
    p0: usize,
    runs: usize,
    acc: &mut [__m256],
) {
    let (g, qs) = (a.group, a.blocks * a.group);
    // SAFETY: the caller's contract; a run reads 8 * g bytes of `vals` and, per position,
    // 8 * g values of its `q` row (qs of them); d and s hold ds >= 8 * runs entries.
    unsafe {
        let flip = _mm256_set1_epi8(-128);
        let ahead = ahead_avx2();
        for r in 0..runs {
            let c0 = r * 8 * g;
            if ahead > 0 {
                prefetch(vals.as_ptr().wrapping_add(ahead + c0), 8 * g);
            }
            let mut w = [_mm256_setzero_si256(); 32];
            for (k, wk) in w.iter_mut().enumerate().take(8 * CH) {
                *wk = _mm256_xor_si256(_mm256_loadu_si256(vals.as_ptr().add(c0 + k * CHUNK) as *const __m256i), flip);
            }
            let sc = run_scales::<false>(row.as_ptr().add(16 * r));
            for (j, acc) in acc.iter_mut().enumerate() {
                let p = p0 + j;
                let x0 = a.q.as_ptr().add(p * qs + c0);
                let mut v = [_mm256_setzero_si256(); 8];
                for (b, vb) in v.iter_mut().enumerate() {
                    for (k, &wk) in w.iter().enumerate().take((b + 1) * CH).skip(b * CH) {
                        let x = _mm256_loadu_si256(x0.add(k * CHUNK) as *const __m256i);
                        *vb = _mm256_dpbusd_avx_epi32(*vb, wk, x);
                    }
                }
                add_run::<7, false>(acc, sc, hsum8(&v), a, p, r);
            }
        }
    }
}

/// Run `r`'s eight block sums of position `p` added to its accumulator lanes in the
/// reference's order ([`combine`]: the stored values' bias 2^`SHIFT` for int4/int8, or a
/// Q4K run's two factors `sc` from [`run_scales`]).
///
/// SAFETY (caller): AVX2 present; `a`'s d and s (ds for `K`) hold run `r` of position `p`.
#[inline(always)]
unsafe fn add_run<const SHIFT: i32, const K: bool>(
    acc: &mut __m256,
    sc: (__m256, __m256),
    sums: __m256i,
    a: &ActQ,
    p: usize,
    r: usize,
) {
    // SAFETY: the caller's contract (d, s and ds are dstride long per position).
    *acc = unsafe { combine::<SHIFT, K>(*acc, sc, sums, a, p * a.dstride() + 8 * r) };
}
