use super::*;
use crate::tensor::{Bytes, DType, Mat};

fn lcg(s: &mut u64) -> u64 {
    *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *s >> 33
}

/// A random MXFP4 matrix [rows, cols] with scales around 2^-4.
fn random(rows: usize, cols: usize, seed: u64) -> Mat {
    let rb = DType::Mxfp4.row_bytes(cols).unwrap();
    let mut s = seed;
    let mut bytes = vec![0u8; rows * rb];
    for row in bytes.chunks_exact_mut(rb) {
        let nb = cols / 32;
        for scale in &mut row[..nb] {
            *scale = 120 + (lcg(&mut s) % 8) as u8;
        }
        let vals = nb.div_ceil(4) * 4;
        for v in &mut row[vals..] {
            *v = lcg(&mut s) as u8;
        }
    }
    Mat::new(rows, cols, DType::Mxfp4, Bytes::from_vec(bytes)).unwrap()
}

#[test]
fn every_path_gives_the_reference_bits_and_the_float_product_closely() {
    for (rows, cols, n) in [(5usize, 32usize, 1usize), (7, 96, 3), (3, 320, 2)] {
        let m = random(rows, cols, cols as u64);
        let mut s = 99u64;
        let x: Vec<f32> = (0..n * cols).map(|_| (lcg(&mut s) % 2001) as f32 / 500.0 - 2.0).collect();
        let mut a = ActQ16::default();
        a.quantize(&x, n, cols);
        let w = m.to_f32();
        let rb = m.row_bytes();
        for p in 0..n {
            for r in 0..rows {
                let row = &m.bytes.as_ref()[r * rb..(r + 1) * rb];
                let want = dot_row_scalar(row, &a, p);
                for simd in Simd::available() {
                    assert_eq!(dot_row(simd, row, &a, p).to_bits(), want.to_bits(), "{simd:?} [{r}] p{p}");
                }
                let exact: f64 = (0..cols).map(|c| w[r * cols + c] as f64 * x[p * cols + c] as f64).sum();
                let norm: f64 = (0..cols).map(|c| (w[r * cols + c] as f64).abs()).sum::<f64>() * 2.0;
                // f32 precision: the remainders carry x to ~2^-31 of each block's amax.
                assert!((want as f64 - exact).abs() <= norm * 1e-7 + 1e-6, "{want} vs {exact}");
            }
        }
    }
}

#[test]
fn every_scale_byte_gives_the_reference_bits() {
    // One row whose 256 blocks carry every e8m0 byte (subnormal 2^(e-128) for e < 2, the
    // largest ones overflowing to infinity in the products), eight-block runs and a tail.
    for cols in [256 * 32, 260 * 32] {
        let mut m = random(1, cols, 3);
        let mut bytes = m.bytes.as_ref().to_vec();
        for (b, s) in bytes.iter_mut().take(cols / 32).enumerate() {
            *s = (b % 256) as u8;
        }
        m = Mat::new(1, cols, DType::Mxfp4, Bytes::from_vec(bytes)).unwrap();
        let mut s = 5u64;
        let x: Vec<f32> = (0..cols).map(|_| (lcg(&mut s) % 2001) as f32 / 500.0 - 2.0).collect();
        let mut a = ActQ16::default();
        a.quantize(&x, 1, cols);
        let want = dot_row_scalar(m.bytes.as_ref(), &a, 0);
        for simd in Simd::available() {
            assert_eq!(dot_row(simd, m.bytes.as_ref(), &a, 0).to_bits(), want.to_bits(), "{simd:?} cols {cols}");
        }
    }
}

#[test]
fn nan_and_zero_blocks() {
    let m = random(1, 64, 5);
    let mut a = ActQ16::default();
    let mut x = vec![0.0f32; 64];
    a.quantize(&x, 1, 64);
    assert_eq!(dot_row_scalar(m.bytes.as_ref(), &a, 0), 0.0);
    x[40] = f32::NAN;
    a.quantize(&x, 1, 64);
    assert!(dot_row_scalar(m.bytes.as_ref(), &a, 0).is_nan());
}

/// Activations with chosen parts: h and l drawn from `pick`, d = 1 / 1024.
fn chosen(n: usize, cols: usize, seed: u64, pick: &[i16]) -> ActQ16 {
    let blocks = cols / 32;
    let mut s = seed;
    let mut a = ActQ16 { n, cols, blocks, ..Default::default() };
    a.q = (0..n * cols).map(|_| pick[lcg(&mut s) as usize % pick.len()]).collect();
    a.lo = (0..n * cols).map(|_| pick[lcg(&mut s) as usize % pick.len()]).collect();
    a.d = vec![1.0 / 1024.0; n * blocks];
    a.build_planes();
    a
}

#[test]
fn the_planes_hold_the_parts_and_their_corrections() {
    let mut a = ActQ16::default();
    let mut s = 11u64;
    let (n, cols) = (2, 11 * 32);
    let x: Vec<f32> = (0..n * cols).map(|_| (lcg(&mut s) % 2001) as f32 / 500.0 - 2.0).collect();
    a.quantize(&x, n, cols);
    if !cfg!(target_arch = "x86_64") {
        assert!(a.planes.is_empty() && a.corr.is_empty());
        return;
    }
    assert!(a.has_planes());
    let ds = a.dstride();
    assert_eq!(ds, 16);
    for p in 0..n {
        let planes = &a.planes[p * ds * 128..(p + 1) * ds * 128];
        for b in 0..ds {
            for (part, vals) in [(0usize, &a.q), (1, &a.lo)] {
                let mut sum = 0i32;
                for i in 0..32 {
                    // Value i: even or odd (i / 16), in word k of the block's stored bytes.
                    let (eo, k) = (i / 16, (i % 16) / 4);
                    let lane = LANE[b % 8] + 8 * (k % 2);
                    let at = (b / 8) * 1024 + (k / 2) * 512 + (part * 4 + eo) * 64 + lane * 4 + i % 4;
                    let (hh, hl) = (planes[at] as i8 as i32, planes[at + 128] as i32);
                    let want = if b < a.blocks { vals[p * cols + b * 32 + i] as i32 } else { 0 };
                    assert_eq!(256 * hh + hl, want, "p{p} b{b} part {part} i{i}");
                    sum += want;
                }
                assert_eq!(a.corr[p * ds * 2 + (b / 8) * 16 + part * 8 + LANE[b % 8]], 12 * sum);
            }
        }
    }
}

#[test]
fn tails_positions_and_extreme_parts_give_the_reference_bits() {
    // Row lengths around runs of eight blocks (and pairs), three positions, parts at the
    // ends of their range and at the byte planes' edges (low byte 0 or 255, high byte
    // -128 or 127), weights random, all +12 (0x77) or all -12 (0xff).
    let pick: &[i16] =
        &[32767, -32767, 255, -255, 256, -256, 0, 1, -1, 0x7f00, -0x7f00, 0x7fff - 255, -32768 + 255, 128];
    for nb in [1usize, 2, 3, 7, 8, 9, 15, 16, 17, 23, 90] {
        let cols = nb * 32;
        let a = chosen(3, cols, nb as u64, pick);
        let mut m = random(3, cols, nb as u64 + 100);
        let mut bytes = m.bytes.as_ref().to_vec();
        let rb = m.row_bytes();
        let vals = nb.div_ceil(4) * 4;
        bytes[rb + vals..2 * rb].iter_mut().for_each(|v| *v = 0x77);
        bytes[2 * rb + vals..].iter_mut().for_each(|v| *v = 0xff);
        m = Mat::new(3, cols, DType::Mxfp4, Bytes::from_vec(bytes)).unwrap();
        for r in 0..3 {
            let row = &m.bytes.as_ref()[r * rb..(r + 1) * rb];
            for p in 0..3 {
                let want = dot_row_scalar(row, &a, p);
                assert!(want.is_finite());
                for simd in Simd::available() {
                    assert_eq!(dot_row(simd, row, &a, p).to_bits(), want.to_bits(), "{simd:?} nb {nb} row {r} p{p}");
                }
            }
        }
    }
}

#[test]
fn the_largest_parts_with_the_largest_weights_give_the_exact_sums() {
    // Every h = l = +-32767 against all +-12: |sum| = 12 * 32767 * 32 per block, the bound.
    for (h, byte) in [(32767i16, 0x77u8), (-32767, 0x77), (32767, 0xff), (-32767, 0xff)] {
        let nb = 9;
        let a = chosen(1, nb * 32, 1, &[h]);
        let mut bytes = random(1, nb * 32, 1).bytes.as_ref().to_vec();
        bytes[12..].iter_mut().for_each(|v| *v = byte);
        let want = dot_row_scalar(&bytes, &a, 0);
        for simd in Simd::available() {
            assert_eq!(dot_row(simd, &bytes, &a, 0).to_bits(), want.to_bits(), "{simd:?} {h} {byte:#x}");
        }
    }
}

/// Every x86 kernel this CPU runs (with and without VBMI), one row or many.
#[cfg(target_arch = "x86_64")]
fn x86_kernels(rows: &[u8], rb: usize, a: &ActQ16, p: usize) -> Vec<(&'static str, Vec<f32>)> {
    let mut v = Vec::new();
    let one = |f: unsafe fn(&[u8], &ActQ16, usize) -> f32| -> Vec<f32> {
        // SAFETY: called only for features the CPU reported; shapes from the tests.
        rows.chunks(rb).map(|r| unsafe { f(r, a, p) }).collect()
    };
    let many = |f: unsafe fn(&[u8], usize, &ActQ16, &mut [f32])| -> Vec<f32> {
        let mut out = vec![0.0; rows.len() / rb];
        // SAFETY: as above.
        unsafe { f(rows, rb, a, &mut out) };
        out
    };
    if crate::qdot::Simd::available().contains(&Simd::Avx2) {
        v.push(("avx2", one(x86::dot_row_avx2)));
        if p == 0 {
            v.push(("avx2 rows", many(x86::dot_rows_avx2)));
        }
    }
    if crate::qdot::Simd::available().contains(&Simd::Avx512) {
        v.push(("avx512", one(x86::dot_row_avx512)));
        if p == 0 {
            v.push(("avx512 rows", many(x86::dot_rows_avx512)));
        }
        if x86::has_vbmi() {
            v.push(("avx512vbmi", one(x86::dot_row_avx512_vbmi)));
            if p == 0 {
                v.push(("avx512vbmi rows", many(x86::dot_rows_avx512_vbmi)));
            }
        }
    }
    v
}

#[cfg(target_arch = "x86_64")]
#[test]
fn every_x86_kernel_gives_the_reference_bits() {
    // Tails and runs, three positions, scales over the whole e8m0 range, activations
    // large enough that 2^127 * d overflows to infinity and small enough for subnormals.
    for nb in [1usize, 5, 8, 13, 16, 90, 256] {
        let cols = nb * 32;
        let mut m = random(5, cols, nb as u64);
        let rb = m.row_bytes();
        let mut bytes = m.bytes.as_ref().to_vec();
        for (i, row) in bytes.chunks_mut(rb).enumerate() {
            for (b, s) in row.iter_mut().take(nb).enumerate() {
                *s = ((b * 37 + i * 101) % 256) as u8;
            }
        }
        m = Mat::new(5, cols, DType::Mxfp4, Bytes::from_vec(bytes)).unwrap();
        let mut s = 7u64;
        let x: Vec<f32> =
            (0..3 * cols).map(|i| ((lcg(&mut s) % 2001) as f32 / 500.0 - 2.0) * [1e-15, 1.0, 1e6][i / cols]).collect();
        let mut a = ActQ16::default();
        a.quantize(&x, 3, cols);
        for p in 0..3 {
            let want: Vec<u32> = m.bytes.as_ref().chunks(rb).map(|r| dot_row_scalar(r, &a, p).to_bits()).collect();
            if nb == 256 && p == 2 {
                assert!(want.iter().any(|w| !f32::from_bits(*w).is_finite()), "some overflow");
            }
            for (name, got) in x86_kernels(m.bytes.as_ref(), rb, &a, p) {
                let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{name} nb {nb} p{p}");
            }
        }
    }
}

#[test]
#[ignore]
fn microbench() {
    let rows: usize = std::env::var("MB_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    let cols = 2048usize;
    let m = random(rows, cols, 1);
    let mut s = 3u64;
    let x: Vec<f32> = (0..cols).map(|_| (lcg(&mut s) % 2001) as f32 / 500.0 - 2.0).collect();
    let mut a = ActQ16::default();
    a.quantize(&x, 1, cols);
    let rb = m.row_bytes();
    let mut out = vec![0.0f32; rows];
    for simd in Simd::available() {
        let mut best = f64::MAX;
        for _ in 0..(12800 / rows).max(5) {
            let t = std::time::Instant::now();
            for _ in 0..20 {
                dot_rows(simd, m.bytes.as_ref(), rb, &a, &mut out);
                std::hint::black_box(&out);
            }
            best = best.min(t.elapsed().as_secs_f64() / 20.0);
        }
        let runs = (rows * cols / 256) as f64;
        eprintln!(
            "{simd:?}: {:.2} ns per run of 8 blocks, {:.2} GB/s",
            best * 1e9 / runs,
            (rows * rb) as f64 / best / 1e9
        );
    }
}

#[test]
fn every_path_quantizes_to_the_reference_parts() {
    // Random blocks, blocks with NaN, an infinity, tiny or zero values, huge values, ties
    // of the rounding, and the clamp's edges: the fast quantizer's parts and scales are the
    // reference's, bit for bit.
    let mut s = 17u64;
    let mut x: Vec<f32> = (0..64 * 32).map(|_| (lcg(&mut s) % 2_000_001) as f32 / 1e5 - 10.0).collect();
    x[32 + 5] = f32::NAN;
    x[64 + 9] = f32::INFINITY;
    x[96..128].iter_mut().for_each(|v| *v = 1e-30);
    x[128..160].iter_mut().for_each(|v| *v = 0.0);
    x[160..192].iter_mut().enumerate().for_each(|(i, v)| *v = 3e38 * if i % 2 == 0 { 1.0 } else { -0.7 });
    x[192..224].iter_mut().enumerate().for_each(|(i, v)| *v = (i as f32 - 16.0) * 0.5);
    x[224..256].iter_mut().enumerate().for_each(|(i, v)| *v = if i == 3 { -1.0 } else { 1.0 / (i + 2) as f32 });
    x[256] = -f32::MIN_POSITIVE;
    for b in 0..64 {
        let src = &x[b * 32..(b + 1) * 32];
        let (mut h0, mut l0) = ([0i16; 32], [0i16; 32]);
        let d0 = quantize_block(src, &mut h0, &mut l0);
        let (mut h1, mut l1) = ([7i16; 32], [7i16; 32]);
        let d1 = quantize_block_fast(src, &mut h1, &mut l1);
        assert!(d0.to_bits() == d1.to_bits() || (d0.is_nan() && d1.is_nan()), "block {b}: {d0} vs {d1}");
        assert_eq!((h0, l0), (h1, l1), "block {b}");
    }
}
