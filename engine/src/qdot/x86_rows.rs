//! The one-position x86 matmul's rows, several at once: [`rows_at_once`] hands
//! [`STREAMS`] rows from as many places in the call's rows to the runs of one kernel
//! (AVX-512 VNNI: [`super::x86_wide`]'s quad-layout int4, Q4K, Q5K and int8 runs; AVX2:
//! [`super::x86`]'s pair-layout int4 and Q4K runs and its int8 runs), which advance the
//! rows run by run together. Each row goes through the arithmetic of one row alone, so it
//! gives its own bits.

use std::arch::x86_64::*;

use super::x86_runs::{finish, int8_runs_avx2, paired_runs};
use super::x86_wide::{int8_runs, quad_runs};
use super::{round4, ActQ, CHUNK};
use crate::math::reduce8;

/// How many rows the one-position int4 and int8 kernels read at once, each from its own
/// place in the call's rows: three streams of addresses instead of one keep more of the
/// weights' bytes on their way from memory while the arithmetic of a run waits. On the
/// AVX-512 VNNI Xeon of docs/benchmarks.md ("Three rows at once", thirty-ninth session;
/// qdot_bench from memory, medians of three) AVX-512 int4/g32 rose from 15.7 to 17.2 GB/s
/// at one thread and from 24.7 to 27.9 at two, q4_k from 13.9 to 15.5 and 23.9 to 26.8,
/// int8/g32 from 13.2 to 16.0 and 25.3 to 30.5, int8/g64 14.5 -> 15.8 and 27.8 -> 30.3;
/// int8/g128, already near the bandwidth, stayed (14-16, 29-31). The AVX2 kernels (no
/// prefetch on Intel) gained most: int4/g32 11.7 -> 14.5 and 16.6 -> 23.1, q4_k 10.6 ->
/// 13.4 and 15.5 -> 22.0, int8/g32 11.6 -> 14.5 and 21.4 -> 28.1, but AVX2 int8/g64 and
/// g128 lost 8% and 3% at one thread, so they stay one row at a time. Two streams gained
/// a little less, four lost at one thread; one whole row after another from three places
/// (instead of their runs in turn) gained nothing.
pub(super) const STREAMS: usize = 3;

/// Row `i` of each of the `S` parts of `h` rows (of `rb` bytes) that `rows` begins with.
#[inline(always)]
pub(super) fn stream_group<const S: usize>(rows: &[u8], rb: usize, h: usize, i: usize) -> [&[u8]; S] {
    std::array::from_fn(|j| &rows[(i + j * h) * rb..(i + j * h + 1) * rb])
}

/// One-position rows `rows` (`out.len()` of `rb` bytes) times position 0, [`STREAMS`] at
/// a time: rows i, i + h, ... (h = the rows / STREAMS) together, then the rows past
/// STREAMS * h one by one. `VNNI`: the AVX-512 runs, else AVX2's; `INT4` int4 (`K`: Q4K,
/// `K5`: Q5K, AVX-512 only) or int8.
///
/// SAFETY (caller): the CPU has the path's features (AVX-512 F/VL/BW/VNNI with AVX2 and
/// F16C; AVX2 and F16C), the caller's function enables them; `a` is quantized for these
/// rows with group 32, 64 or 128, and holds the kernel's layout: AVX-512 int4 the quad
/// layout (`x86::has_quads`; Q5K `x86::k5_takes(a, true)`), AVX2 int4 the pair layout
/// (`dot_rows_avx2` sends AVX2 int8 of group 32 only).
#[inline(always)]
pub(super) unsafe fn rows_at_once<const VNNI: bool, const INT4: bool, const K: bool, const K5: bool>(
    rows: &[u8],
    rb: usize,
    a: &ActQ,
    out: &mut [f32],
) {
    if rb == 0 {
        return;
    }
    let n = out.len().min(rows.len() / rb);
    let h = n / STREAMS;
    for i in 0..h {
        let group = stream_group::<STREAMS>(rows, rb, h, i);
        // SAFETY: the caller's contract, for each row of the group.
        let sums = unsafe { row_group::<VNNI, INT4, K, K5, STREAMS>(group, a) };
        for (j, v) in sums.into_iter().enumerate() {
            out[i + j * h] = v;
        }
    }
    for (i, o) in out.iter_mut().enumerate().take(n).skip(STREAMS * h) {
        // SAFETY: as above.
        *o = unsafe { row_group::<VNNI, INT4, K, K5, 1>([&rows[i * rb..(i + 1) * rb]], a)[0] };
    }
}

/// `S` rows times position 0 ([`rows_at_once`]): the whole runs of each row through the
/// path's runs, interleaved, then [`finish`] for each row's last blocks (Q5K rows have
/// whole runs only: `x86_wide::body_k5_quads`' steps).
///
/// SAFETY (caller): as [`rows_at_once`], for each of the rows.
#[inline(always)]
unsafe fn row_group<const VNNI: bool, const INT4: bool, const K: bool, const K5: bool, const S: usize>(
    rows: [&[u8]; S],
    a: &ActQ,
) -> [f32; S] {
    let mut sums = [0.0f32; S];
    let mut lanes = [0.0f32; 8];
    // SAFETY: the caller's contract; the runs end inside each row as in `x86::body`.
    unsafe {
        if K5 {
            let runs = a.blocks / 8;
            let vals: [&[u8]; S] = std::array::from_fn(|j| &rows[j][16 * runs..]);
            let acc = quad_runs::<1, true, true, S>(rows, vals, a.qz.as_ptr(), a, 0, runs);
            for (sum, acc) in sums.iter_mut().zip(acc) {
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
                *sum = reduce8(lanes);
            }
            return sums;
        }
        let off = round4(a.blocks * 2);
        let vals: [&[u8]; S] = std::array::from_fn(|j| &rows[j][off..]);
        let inside = if INT4 { vals[0].len() * 2 } else { vals[0].len() };
        let runs = (a.blocks / 8).min(inside / (8 * a.group));
        let (qz, qp) = (a.qz.as_ptr(), a.qp.as_ptr());
        let acc = match (VNNI, INT4, a.group / CHUNK) {
            (true, true, 1) => quad_runs::<1, K, false, S>(rows, vals, qz, a, 0, runs),
            (true, true, 2) => quad_runs::<2, K, false, S>(rows, vals, qz, a, 0, runs),
            (true, true, _) => quad_runs::<4, K, false, S>(rows, vals, qz, a, 0, runs),
            (true, false, 1) => int8_runs::<1, S>(rows, vals, a, 0, runs),
            (true, false, 2) => int8_runs::<2, S>(rows, vals, a, 0, runs),
            (true, false, _) => int8_runs::<4, S>(rows, vals, a, 0, runs),
            (false, true, 1) => paired_runs::<false, 1, K, S>(rows, vals, qp, a, 0, runs),
            (false, true, 2) => paired_runs::<false, 2, K, S>(rows, vals, qp, a, 0, runs),
            (false, true, _) => paired_runs::<false, 4, K, S>(rows, vals, qp, a, 0, runs),
            (false, false, 1) => int8_runs_avx2::<1, S>(rows, vals, a, 0, runs),
            (false, false, 2) => int8_runs_avx2::<2, S>(rows, vals, a, 0, runs),
            (false, false, _) => int8_runs_avx2::<4, S>(rows, vals, a, 0, runs),
        };
        for ((sum, row), acc) in sums.iter_mut().zip(rows).zip(acc) {
            *sum = finish::<VNNI, INT4, K>(row, a, 0, (runs * 8, acc));
        }
        sums
    }
}
