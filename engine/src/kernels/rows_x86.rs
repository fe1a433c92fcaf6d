//! The x86-64 drivers of the float (f32, bf16, f16) and FP8 rows: which of the kernels of
//! [`super::float_x86`] and [`super::fp8_x86`] take a call's rows and positions, with what
//! prefetch, and where each output goes (`out[p * rows + r]`, as [`super::rows_into`]).

use super::{float_x86, fp8_x86};
use crate::math;
use crate::tensor::Mat;

/// Rows `r0..r1` of float weights (kind `K` of [`float_x86`]) times the `n` positions, the
/// bits of decoding each row and applying [`math::dot`]: four rows at a time for one
/// position, two rows (`wide`: four) times four positions at a time for more (see
/// float_x86). Returns false (nothing written) when the stored bytes are not the matrix's.
///
/// SAFETY (caller): AVX2 and F16C present (`wide`: AVX-512 F and VL too); as [`super::rows_into`].
pub(super) unsafe fn float_rows<const K: u8>(
    w: &Mat,
    x: &[f32],
    n: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
    wide: bool,
) -> bool {
    let (rows, cols, rb) = (w.rows, w.cols, w.row_bytes());
    let bytes = w.bytes.as_ref();
    if bytes.len() < rows * rb || x.len() < n * cols || r1 > rows {
        return false;
    }
    let (base, xp) = (bytes.as_ptr(), x.as_ptr());
    // SAFETY: rows r < r1 <= rows lie inside `bytes` (rb bytes each), positions p < n inside
    // `x` (cols each); outputs as in rows_into.
    unsafe {
        let row = |r: usize| base.add(r * rb);
        if n == 1 {
            // The rows ahead prefetched as the CPU wants it (`qdot::float_prefetch`): on
            // AMD with AVX-512 into L2 (without it bf16 rows of 512 to 1536 columns read a
            // third of the bandwidth), on Zen 1 to 3 bf16/f16 into L1, on Intel not at all.
            let (ahead, l2) = crate::qdot::float_prefetch(K == float_x86::F32, rb);
            let mut r = r0;
            while r + 4 <= r1 {
                let rs = [row(r), row(r + 1), row(r + 2), row(r + 3)];
                let v = match l2 {
                    true => float_x86::dot4::<K, true, true>(rs, [xp; 4], cols, ahead),
                    false => float_x86::dot4::<K, true, false>(rs, [xp; 4], cols, ahead),
                };
                std::ptr::copy_nonoverlapping(v.as_ptr(), out.add(r), 4);
                r += 4;
            }
            for r in r..r1 {
                *out.add(r) = float_x86::dot1::<K>(row(r), xp, cols);
            }
            return true;
        }
        // Several positions: two rows (AVX2) or four (AVX-512: 32 registers) times four
        // positions per pass: each row chunk decoded once for four positions, each position
        // chunk loaded once for the rows, eight or sixteen chains of adds in flight (bf16 at
        // 64 positions 19 -> 35 GMAC/s at one thread on Zen 4). The first four positions'
        // pass prefetches the next rows (one line per 64 bytes read); without it every row's
        // first loads waited on memory: qdot_bench at 4 positions, 2 threads, bf16 4.8 ->
        // 15.5 GB/s of weights, f16 6.6 -> 15.7, f32 18.9 -> 29.8 (Xeon, docs/benchmarks.md
        // "Several positions of the float and FP8 rows").
        let mut r = r0;
        let rr = if wide { 4 } else { 2 };
        while r + rr <= r1 && n >= 4 {
            let mut p = 0;
            while p + 4 <= n {
                let xs = [xp.add(p * cols), xp.add((p + 1) * cols), xp.add((p + 2) * cols), xp.add((p + 3) * cols)];
                let ahead = if p == 0 { rr * rb } else { 0 };
                let put = |j: usize, v: [f32; 4]| {
                    for (i, vi) in v.into_iter().enumerate() {
                        *out.add((p + i) * rows + r + j) = vi;
                    }
                };
                if wide {
                    let v = float_x86::block_avx512::<K>([row(r), row(r + 1), row(r + 2), row(r + 3)], xs, cols, ahead);
                    v.into_iter().enumerate().for_each(|(j, vj)| put(j, vj));
                } else {
                    let v = float_x86::block_avx2::<K>([row(r), row(r + 1)], xs, cols, ahead);
                    v.into_iter().enumerate().for_each(|(j, vj)| put(j, vj));
                }
                p += 4;
            }
            for rj in r..r + rr {
                for p in p..n {
                    *out.add(p * rows + rj) = float_x86::dot1::<K>(row(rj), xp.add(p * cols), cols);
                }
            }
            r += rr;
        }
        for r in r..r1 {
            let wr = row(r);
            let mut p = 0;
            while p + 4 <= n {
                let xs = [xp.add(p * cols), xp.add((p + 1) * cols), xp.add((p + 2) * cols), xp.add((p + 3) * cols)];
                let v = float_x86::dot4::<K, false, false>([wr; 4], xs, cols, if p == 0 { rb } else { 0 });
                for (i, vi) in v.iter().enumerate() {
                    *out.add((p + i) * rows + r) = *vi;
                }
                p += 4;
            }
            for p in p..n {
                *out.add(p * rows + r) = float_x86::dot1::<K>(wr, xp.add(p * cols), cols);
            }
        }
        true
    }
}

/// Rows `r0..r1` of FP8 weights (scale blocks of `block` columns, [`fp8_x86::takes`])
/// times the `n` positions, the bits of decoding each row and applying [`math::dot`]: four
/// rows at a time for one position (two per 512-bit register with `avx512`), four
/// positions at a time for more (`avx512`: two rows times eight positions). A row whose scales
/// [`fp8_x86::scales_ok`] refuses takes the decode-then-dot loop. Returns false (nothing
/// written) when the stored bytes are not the matrix's.
///
/// SAFETY (caller): AVX2 and F16C present (and AVX-512 F/BW/VL with `avx512`); as
/// [`super::rows_into`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn fp8_rows(
    w: &Mat,
    block: usize,
    x: &[f32],
    n: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
    avx512: bool,
) -> bool {
    let (rows, cols, rb) = (w.rows, w.cols, w.row_bytes());
    let bytes = w.bytes.as_ref();
    if bytes.len() < rows * rb || x.len() < n * cols || r1 > rows {
        return false;
    }
    let nb = cols.div_ceil(block);
    let (base, xp) = (bytes.as_ptr(), x.as_ptr());
    let mut buf = Vec::new();
    // SAFETY: rows r < r1 <= rows lie inside `bytes` (rb bytes each: nb scales, then cols
    // bytes), positions p < n inside `x` (cols each); outputs as in rows_into.
    unsafe {
        let row = |r: usize| base.add(r * rb);
        let plain = |r: usize, buf: &mut Vec<f32>| {
            buf.resize(cols, 0.0);
            w.row_into(r, buf);
            for p in 0..n {
                *out.add(p * rows + r) = math::dot(buf, &x[p * cols..(p + 1) * cols]);
            }
        };
        if n == 1 {
            let mut r = r0;
            while r + 4 <= r1 {
                if (r..r + 4).all(|k| fp8_x86::scales_ok(row(k), nb)) {
                    let rs = [row(r), row(r + 1), row(r + 2), row(r + 3)];
                    let v = match avx512 {
                        // SAFETY: Simd::Avx512 comes from Simd::available() after the CPU
                        // reported AVX-512 F/BW/VL (and AVX2, F16C).
                        true => fp8_x86::dot4_avx512(rs, xp, cols, block, 4 * rb),
                        false => fp8_x86::dot4::<true>(rs, [xp; 4], cols, block, 4 * rb),
                    };
                    std::ptr::copy_nonoverlapping(v.as_ptr(), out.add(r), 4);
                } else {
                    (r..r + 4).for_each(|k| plain(k, &mut buf));
                }
                r += 4;
            }
            for r in r..r1 {
                match fp8_x86::scales_ok(row(r), nb) {
                    true => *out.add(r) = fp8_x86::dot1(row(r), xp, cols, block),
                    false => plain(r, &mut buf),
                }
            }
            return true;
        }
        let one_row = |r: usize, buf: &mut Vec<f32>| {
            let wr = row(r);
            if !fp8_x86::scales_ok(wr, nb) {
                plain(r, buf);
                return;
            }
            let mut p = 0;
            while p + 4 <= n {
                let xs = [xp.add(p * cols), xp.add((p + 1) * cols), xp.add((p + 2) * cols), xp.add((p + 3) * cols)];
                // The next row prefetched in the first pass, as float_rows does.
                let v = fp8_x86::dot4::<false>([wr; 4], xs, cols, block, if p == 0 { rb } else { 0 });
                for (i, vi) in v.iter().enumerate() {
                    *out.add((p + i) * rows + r) = *vi;
                }
                p += 4;
            }
            for p in p..n {
                *out.add(p * rows + r) = fp8_x86::dot1(wr, xp.add(p * cols), cols, block);
            }
        };
        // AVX-512: two rows times eight positions per pass (fp8_x86::block_avx512).
        let mut r = r0;
        while avx512 && r + 2 <= r1 && n >= 8 {
            if !(r..r + 2).all(|k| fp8_x86::scales_ok(row(k), nb)) {
                (r..r + 2).for_each(|k| one_row(k, &mut buf));
                r += 2;
                continue;
            }
            let mut p = 0;
            while p + 8 <= n {
                let xs: [*const f32; 8] = std::array::from_fn(|i| xp.add((p + i) * cols));
                let v = fp8_x86::block_avx512([row(r), row(r + 1)], xs, cols, block, if p == 0 { 2 * rb } else { 0 });
                for (j, vj) in v.iter().enumerate() {
                    for (i, vi) in vj.iter().enumerate() {
                        *out.add((p + i) * rows + r + j) = *vi;
                    }
                }
                p += 8;
            }
            // The positions left (fewer than eight): fours, then ones, row by row.
            for k in r..r + 2 {
                let mut q = p;
                while q + 4 <= n {
                    let xs = [xp.add(q * cols), xp.add((q + 1) * cols), xp.add((q + 2) * cols), xp.add((q + 3) * cols)];
                    let v = fp8_x86::dot4::<false>([row(k); 4], xs, cols, block, 0);
                    for (i, vi) in v.iter().enumerate() {
                        *out.add((q + i) * rows + k) = *vi;
                    }
                    q += 4;
                }
                for q in q..n {
                    *out.add(q * rows + k) = fp8_x86::dot1(row(k), xp.add(q * cols), cols, block);
                }
            }
            r += 2;
        }
        for r in r..r1 {
            one_row(r, &mut buf);
        }
        true
    }
}
