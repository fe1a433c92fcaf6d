//! Every available path against the scalar reference, bit for bit, on random rows with
//! the edge cases mixed in. The native tests run it, and the browser builds export it
//! (`kernelSelfCheck`), so the wasm SIMD paths are checked where they run (with the SIMD
//! feed-forward activations', `math::check_activations`; the log-softmax's f64
//! exponentials, `math::check_exp64`).

use super::{dot_row, dot_row_many, dot_row_scalar, dot_rows, dot_rows_many, round4, ActQ, Simd};
use crate::format::quant::quantize_row;
use crate::tensor::DType;

/// A deterministic uniform value in [-1, 1).
pub fn lcg(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Random rows with some edge cases mixed in: zero blocks, one huge value, tiny values.
pub fn activations(n: usize, cols: usize, group: usize, seed: &mut u64) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n * cols).map(|_| lcg(seed) * 3.0).collect();
    for p in 0..n {
        let row = &mut x[p * cols..(p + 1) * cols];
        match p % 5 {
            1 => row[..group.min(cols)].iter_mut().for_each(|v| *v = 0.0),
            2 => row[cols / 2] = 3.0e38,
            3 => row.iter_mut().step_by(3).for_each(|v| *v *= 1e-30),
            // Every value 127 after quantization: the largest integer sums a block can have.
            4 => row.iter_mut().for_each(|v| *v = 2.0),
            _ => {}
        }
    }
    x
}

/// f16 scales a stored row may hold besides ordinary ones: zeros, subnormals, the largest
/// finite value, infinities and NaNs (the last two only make that row NaN).
const ODD_SCALES: [u16; 9] = [0x0000, 0x8000, 0x0001, 0x83ff, 0x0200, 0x7bff, 0xfbff, 0x7c00, 0xfe01];

/// `rows` stored rows of `dtype`: random, then full scale (row 1), int8 -128 and -127
/// everywhere (row 2), odd finite scales (row 3), odd scales with infinities and NaNs (row 4), every
/// value at its largest stored code (row 5: int4 nibble 15, int8 127; with an activation row
/// of 127s the largest sums any kernel's narrow accumulators must hold).
///
/// Q4K and Q5K rows: row 0's headers hold random 6-bit scales and mins (every bit pattern),
/// rows 3 and 4 odd values of d and dmin; row 5's fifth bits are all set (u = 31).
pub fn weights(dtype: DType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let Some(rb) = dtype.row_bytes(cols) else { return Vec::new() };
    let k4 = matches!(dtype, DType::Q4K | DType::Q5K);
    let blocks = dtype.group().map_or(1, |g| cols.div_ceil(g.max(1) as usize));
    // Where the values start (after the scales, or the Q4K headers).
    let vstart = if k4 { cols / 256 * 16 } else { round4(blocks * 2) };
    let mut out = vec![0u8; rows * rb];
    for r in 0..rows {
        let mut row: Vec<f32> = (0..cols).map(|_| lcg(seed)).collect();
        if r == 1 {
            // Full-scale values: int8 +-127 and int4 -8 and 7.
            row.iter_mut().enumerate().for_each(|(i, v)| *v = if i % 2 == 0 { 1.0 } else { -1.0 });
        }
        let dst = &mut out[r * rb..(r + 1) * rb];
        if quantize_row(dtype, &row, dst).is_err() {
            return Vec::new();
        }
        if r == 2 && dtype.name() == "int8" {
            // -128 and -127 everywhere but the scales (the extremes a container can hold:
            // `convert` writes -127 at most, a GGUF Q8_0 import keeps any byte).
            let vals = &mut dst[round4(blocks * 2)..round4(blocks * 2) + cols];
            vals.iter_mut().enumerate().for_each(|(i, b)| *b = if i % 3 == 0 { 0x80 } else { 0x81 });
        }
        if r == 5 {
            let v = if dtype.name() == "int8" { 0x7f } else { 0xff };
            dst[vstart..].iter_mut().for_each(|b| *b = v);
        }
        if k4 {
            for (k, head) in dst[..vstart].chunks_exact_mut(16).enumerate() {
                if r == 0 {
                    head[4..].iter_mut().for_each(|b| *b = (lcg(seed) * 128.0 + 128.0) as u8);
                }
                if (r == 3 || r == 4) && k % 3 != 1 {
                    let odd = if r == 3 { &ODD_SCALES[..7] } else { &ODD_SCALES[..] };
                    head[..2].copy_from_slice(&odd[(k / 3 + r) % odd.len()].to_le_bytes());
                    head[2..4].copy_from_slice(&odd[(k / 3 + r + 1) % odd.len()].to_le_bytes());
                }
            }
            continue;
        }
        if r == 3 || r == 4 {
            let odd = if r == 3 { &ODD_SCALES[..7] } else { &ODD_SCALES[..] };
            for b in 0..blocks {
                if b % 3 != 1 {
                    let h = odd[(b / 3 + r) % odd.len()];
                    dst[2 * b..2 * b + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
        }
    }
    out
}

/// Equal bits, or both NaN (NaN payloads are not portable across instruction sets).
fn same(got: f32, want: f32) -> bool {
    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
}

/// Every available path (one position at a time and many at once) against
/// [`dot_row_scalar`] over shapes covering partial blocks, partial vectors of blocks and
/// groups the fast paths do not take. Returns how many products were compared, or the
/// first difference.
pub fn check_paths() -> Result<usize, String> {
    // wasm relaxed-SIMD builds: the one-position kernels' two summing forms, each.
    #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
    {
        use super::wasm_form::{dot16, set_dot16};
        let was = dot16();
        let mut checked = 0;
        for form in [false, true] {
            set_dot16(form);
            let r = check_all();
            set_dot16(was);
            checked += r.map_err(|e| format!("{}-bit form: {e}", if form { 16 } else { 32 }))?;
        }
        return Ok(checked);
    }
    // x86-64: the AVX-512 int8 rows of group 128 whole and in halves
    // (`x86_runs::int8_halves128`), each.
    #[cfg(target_arch = "x86_64")]
    {
        use super::x86_runs::set_int8_halves128;
        let mut checked = 0;
        for form in [false, true] {
            set_int8_halves128(Some(form));
            let r = check_all();
            set_int8_halves128(None);
            checked +=
                r.map_err(|e| format!("int8 rows of group 128 {}: {e}", if form { "in halves" } else { "whole" }))?;
        }
        return Ok(checked);
    }
    #[allow(unreachable_code)]
    check_all()
}

/// [`check_paths`] with the kernels' forms as they are set.
fn check_all() -> Result<usize, String> {
    let paths = Simd::available();
    let mut seed = 5u64;
    let mut checked = 0;
    let shapes: [(usize, usize); 11] = [
        (32, 32),
        (32, 100),
        (32, 224),
        (64, 2048),
        (64, 96),
        (128, 260),
        (128, 1024 + 64),
        (32, 8 * 32 * 3 + 31),
        (32, 1000),
        (8, 37),
        (3, 10),
    ];
    for (group, cols) in shapes {
        for dtype in [DType::Int4 { group: group as u32 }, DType::Int8 { group: group as u32 }] {
            let int4 = dtype.name() == "int4";
            // 36 positions: AVX-512 (and AVX2 with AVX-VNNI) prepares rows from 33
            // (qdot::prepare_min), plain AVX2 runs the few-position kernel in two passes;
            // one position at a time is checked on the first 9.
            let (rows, n, one) = (6, 36, 9);
            let w = weights(dtype, rows, cols, &mut seed);
            let rb = dtype.row_bytes(cols).ok_or_else(|| format!("no row layout for {dtype}"))?;
            if w.len() != rows * rb {
                return Err(format!("could not make {dtype} rows of {cols}"));
            }
            let x = activations(n, cols, group, &mut seed);
            let mut a = ActQ::default();
            a.quantize(&x, n, cols, group, ActQ::wants_split(int4, group));
            // The many-position kernels read the interleaved copy where there is one.
            let mut ai = a.clone();
            ai.interleave();
            // The one-position x86 int4 kernel reads the pair layout where there is one.
            let mut ap = a.clone();
            ap.pair();
            // The one-position AVX-512 int4 kernel reads the quad layout where there is one.
            let mut aq = a.clone();
            aq.quad();
            // The one-position wasm relaxed-SIMD int8 kernel reads the halves.
            let mut ah = a.clone();
            ah.halves();
            // All rows at once (the one-position matmul's call), each layout.
            for &s in &paths {
                for a in [&a, &ap, &aq, &ah] {
                    let mut out = vec![0.0f32; rows];
                    dot_rows(s, int4, &w, rb, a, &mut out);
                    for (r, &got) in out.iter().enumerate() {
                        let want = dot_row_scalar(int4, &w[r * rb..(r + 1) * rb], a, 0);
                        if !same(got, want) {
                            return Err(format!("{} rows {dtype} cols {cols} row {r}: {got:e} vs {want:e}", s.name()));
                        }
                        checked += 1;
                    }
                }
            }
            // All rows at once for a few positions (the many-position matmul's groups of
            // rows): the counts the few-position kernels unroll, and more.
            for &s in &paths {
                for a in [&a, &ap, &aq, &ah, &ai] {
                    for n in [2usize, 3, 4, 5, 9] {
                        let mut out = vec![0.0f32; rows * n];
                        let mut scratch = Vec::new();
                        dot_rows_many(s, int4, &w, rb, a, &mut out, &mut scratch);
                        for (k, &got) in out.iter().enumerate() {
                            let (r, p) = (k / n, k % n);
                            let want = dot_row_scalar(int4, &w[r * rb..(r + 1) * rb], a, p);
                            if !same(got, want) {
                                return Err(format!(
                                    "{} rows of {n} {dtype} cols {cols} row {r} pos {p}: {got:e} vs {want:e}",
                                    s.name()
                                ));
                            }
                            checked += 1;
                        }
                    }
                }
            }
            for r in 0..rows {
                let row = &w[r * rb..(r + 1) * rb];
                for &s in &paths {
                    let layouts = [&a, &ap, &aq, &ah];
                    for (p, a) in layouts.iter().flat_map(|a| (0..one).map(move |p| (p, *a))) {
                        let (got, want) = (dot_row(s, int4, row, a, p), dot_row_scalar(int4, row, a, p));
                        if !same(got, want) {
                            return Err(format!(
                                "{} {dtype} cols {cols} row {r} pos {p}: {got:e} vs {want:e}",
                                s.name()
                            ));
                        }
                        checked += 1;
                    }
                    let mut scratch = vec![0xAAu8; 7];
                    // Whole and partial position ranges of each layout: from 2 positions
                    // (the few-position kernels) to all 9 (the prepared row's).
                    let ranges = [(0usize, one, &a), (1, one, &a), (0, n, &ai), (1, n, &ai), (3, 12, &ai)];
                    let few = [(0, 2, &aq), (4, 5, &aq), (1, 8, &aq), (0, 9, &aq), (2, 3, &a), (1, 7, &ap)];
                    // wasm relaxed int8 against the halves: within a pass, over two, and short.
                    let few = few.into_iter().chain([(0, 9, &ah), (1, 12, &ah), (3, 5, &ah)]);
                    for (p0, end, a) in ranges.into_iter().chain(few) {
                        let mut out = vec![0.0f32; end - p0];
                        dot_row_many(s, int4, row, a, p0, &mut out, &mut scratch);
                        for (i, &got) in out.iter().enumerate() {
                            let want = dot_row_scalar(int4, row, a, p0 + i);
                            if !same(got, want) {
                                return Err(format!(
                                    "{} many {dtype} cols {cols} row {r} pos {}: {got:e} vs {want:e}",
                                    s.name(),
                                    p0 + i
                                ));
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    checked += check_long_rows(&paths, &mut seed)?;
    // wasm's f16 conversions (row scales, Q4K headers) for every f16 value.
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        checked += super::wasm_k::check_f16()?;
    }
    checked += check_k(DType::Q4K, &paths, &mut seed)?;
    checked += check_k(DType::Q5K, &paths, &mut seed)?;
    // The SwiGLU activation's SIMD lanes (the same scalar steps; math/act.rs).
    checked += crate::math::check_activations(paths.iter().any(|&s| s != Simd::Scalar))?;
    checked += crate::math::check_exp64(paths.iter().any(|&s| s != Simd::Scalar))?;
    Ok(checked)
}

/// Q4K rows (int4 nibbles under Q4_K headers, `ActQ::k4`) or Q5K rows (`dtype`; with fifth
/// bits, `ActQ::k5`) on every path and layout: one position, all rows at once, and position
/// ranges up to past one pass of the few-position kernels (qdot::x86_few::FEW = 32).
fn check_k(dtype: DType, paths: &[Simd], seed: &mut u64) -> Result<usize, String> {
    let mut checked = 0;
    for cols in [256, 768, 2048] {
        let (rows, n) = (7, 36);
        let rb = dtype.row_bytes(cols).ok_or_else(|| format!("no row layout for {dtype}"))?;
        let w = weights(dtype, rows, cols, seed);
        if w.len() != rows * rb {
            return Err(format!("could not make {dtype} rows of {cols}"));
        }
        let mut a = ActQ::default();
        a.quantize(&activations(n, cols, 32, seed), n, cols, 32, true);
        if dtype == DType::Q5K {
            a.set_k5();
        } else {
            a.set_k4();
        }
        let (mut ap, mut aq, mut ai) = (a.clone(), a.clone(), a.clone());
        ap.pair();
        aq.quad();
        ai.interleave();
        for &s in paths {
            for a in [&a, &ap, &aq, &ai] {
                let mut out = vec![0.0f32; rows];
                dot_rows(s, true, &w, rb, a, &mut out);
                for (r, &got) in out.iter().enumerate() {
                    let row = &w[r * rb..(r + 1) * rb];
                    let want = dot_row_scalar(true, row, a, 0);
                    if !same(got, want) {
                        return Err(format!("{} rows {dtype} cols {cols} row {r}: {got:e} vs {want:e}", s.name()));
                    }
                    let mut scratch = Vec::new();
                    for (p0, end) in [(0, 9), (1, 2), (3, 36), (0, 33)] {
                        let mut many = vec![0.0f32; end - p0];
                        dot_row_many(s, true, row, a, p0, &mut many, &mut scratch);
                        for (i, &got) in many.iter().enumerate() {
                            let (one, want) = (dot_row(s, true, row, a, p0 + i), dot_row_scalar(true, row, a, p0 + i));
                            if !same(got, want) || !same(one, want) {
                                return Err(format!(
                                    "{} {dtype} cols {cols} row {r} pos {}: {got:e} (one: {one:e}) vs {want:e}",
                                    s.name(),
                                    p0 + i
                                ));
                            }
                            checked += 2;
                        }
                    }
                    checked += 1;
                }
                // All rows at once for a few positions (the unrolled counts and a loop).
                for n in [2usize, 3, 5] {
                    let mut out = vec![0.0f32; rows * n];
                    dot_rows_many(s, true, &w, rb, a, &mut out, &mut Vec::new());
                    for (k, &got) in out.iter().enumerate() {
                        let want = dot_row_scalar(true, &w[k / n * rb..(k / n + 1) * rb], a, k % n);
                        if !same(got, want) {
                            return Err(format!(
                                "{} rows of {n} {dtype} cols {cols} at {k}: {got:e} vs {want:e}",
                                s.name()
                            ));
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    Ok(checked)
}

/// One position over matrices of more than 64 KiB of rows, an odd count of them: the wasm
/// path reads such ranges as two streams (`wasm_rows::dot_rows`), the others as one.
fn check_long_rows(paths: &[Simd], seed: &mut u64) -> Result<usize, String> {
    let (cols, group) = (256, 32);
    let mut checked = 0;
    for dtype in [DType::Int4 { group: group as u32 }, DType::Int8 { group: group as u32 }] {
        let int4 = dtype.name() == "int4";
        let rb = dtype.row_bytes(cols).ok_or_else(|| format!("no row layout for {dtype}"))?;
        let rows = ((80 << 10) / rb) | 1;
        let w = weights(dtype, rows, cols, seed);
        let mut a = ActQ::default();
        a.quantize(&activations(1, cols, group, seed), 1, cols, group, ActQ::wants_split(int4, group));
        let mut ah = a.clone();
        ah.halves();
        for (&s, a) in paths.iter().flat_map(|s| [(s, &a), (s, &ah)]) {
            let mut out = vec![0.0f32; rows];
            dot_rows(s, int4, &w, rb, a, &mut out);
            for (r, &got) in out.iter().enumerate() {
                let want = dot_row_scalar(int4, &w[r * rb..(r + 1) * rb], a, 0);
                if !same(got, want) {
                    return Err(format!("{} long rows {dtype} row {r} of {rows}: {got:e} vs {want:e}", s.name()));
                }
                checked += 1;
            }
        }
    }
    Ok(checked)
}
