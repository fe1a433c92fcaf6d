//! Every available path against the scalar reference, bit for bit, and the reference
//! against a plain f64 dot product of the dequantized values.

use super::*;
use crate::format::quant::quantize_row;
use crate::tensor::DType;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Random rows with some edge cases mixed in: zero blocks, one huge value, tiny values.
fn activations(n: usize, cols: usize, group: usize, seed: &mut u64) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n * cols).map(|_| lcg(seed) * 3.0).collect();
    for p in 0..n {
        let row = &mut x[p * cols..(p + 1) * cols];
        match p % 4 {
            1 => row[..group.min(cols)].iter_mut().for_each(|v| *v = 0.0),
            2 => row[cols / 2] = 3.0e38,
            3 => row.iter_mut().step_by(3).for_each(|v| *v *= 1e-30),
            _ => {}
        }
    }
    x
}

fn weights(dtype: DType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let rb = dtype.row_bytes(cols).unwrap();
    let mut out = vec![0u8; rows * rb];
    for r in 0..rows {
        let mut row: Vec<f32> = (0..cols).map(|_| lcg(seed)).collect();
        if r == 1 {
            // Full-scale values: int8 +-127 and int4 -8 and 7.
            row.iter_mut().enumerate().for_each(|(i, v)| *v = if i % 2 == 0 { 1.0 } else { -1.0 });
        }
        quantize_row(dtype, &row, &mut out[r * rb..(r + 1) * rb]).unwrap();
    }
    if rows > 2 && dtype.name() == "int8" {
        // -127 everywhere but the scales (valid container values at the extreme).
        let sb = round4(cols.div_ceil(dtype.group().unwrap() as usize) * 2);
        out[2 * rb + sb..2 * rb + sb + cols].iter_mut().for_each(|b| *b = 0x81);
    }
    out
}

#[test]
fn every_path_gives_the_reference_bits() {
    let paths = Simd::available();
    let mut seed = 5u64;
    let mut checked = 0;
    for &(group, cols) in
        &[(32usize, 32usize), (32, 100), (64, 2048), (64, 96), (128, 260), (32, 8 * 32 * 3 + 31), (8, 37), (3, 10)]
    {
        for dtype in [DType::Int4 { group: group as u32 }, DType::Int8 { group: group as u32 }] {
            let int4 = dtype.name() == "int4";
            let (rows, n) = (5, 6);
            let w = weights(dtype, rows, cols, &mut seed);
            let x = activations(n, cols, group, &mut seed);
            let mut a = ActQ::default();
            a.quantize(&x, n, cols, group, ActQ::wants_split(int4, group));
            let rb = dtype.row_bytes(cols).unwrap();
            for r in 0..rows {
                let row = &w[r * rb..(r + 1) * rb];
                for p in 0..n {
                    let want = dot_row_scalar(int4, row, &a, p);
                    for &s in &paths {
                        let got = dot_row(s, int4, row, &a, p);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{} {dtype} cols {cols} row {r} pos {p}: {got} vs {want}",
                            s.name()
                        );
                        checked += 1;
                    }
                }
                // Many positions per row pass (prepared rows on x86): the same bits.
                for &s in &paths {
                    let mut scratch = vec![0xAAu8; 7];
                    for p0 in [0usize, 1] {
                        let mut out = vec![0.0f32; n - p0];
                        dot_row_many(s, int4, row, &a, p0, &mut out, &mut scratch);
                        for (i, got) in out.iter().enumerate() {
                            let want = dot_row_scalar(int4, row, &a, p0 + i);
                            assert_eq!(got.to_bits(), want.to_bits(), "{} many {dtype} cols {cols} row {r}", s.name());
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 0);
}

#[test]
fn reference_is_close_to_the_float_product() {
    let mut seed = 9u64;
    let (cols, group) = (200usize, 32usize);
    for dtype in [DType::Int4 { group: 32 }, DType::Int8 { group: 32 }] {
        let int4 = dtype.name() == "int4";
        let w = weights(dtype, 1, cols, &mut seed);
        let x: Vec<f32> = (0..cols).map(|_| lcg(&mut seed)).collect();
        let mut a = ActQ::default();
        a.quantize(&x, 1, cols, group, ActQ::wants_split(int4, group));
        let m = crate::tensor::Mat::new(1, cols, dtype, crate::tensor::Bytes::from_vec(w.clone())).unwrap();
        let wf = m.to_f32();
        let exact: f64 = wf.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        let norm: f64 = wf.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
        let got = dot_row_scalar(int4, &w, &a, 0) as f64;
        // int8 activations: relative error per value <= 1/254 of the block max.
        assert!((got - exact).abs() <= norm * 0.01, "{dtype}: {got} vs {exact}");
    }
}

#[test]
fn quantize_block_rules() {
    let mut q = [0i8; 4];
    assert_eq!(quantize_block(&[0.0, -0.0, 0.0], &mut q, false), (0.0, 0));
    assert_eq!(quantize_block(&[1e-30, -1e-25], &mut q, false), (0.0, 0));
    let (d, s) = quantize_block(&[127.0, -63.5, 31.75, 0.5], &mut q, false);
    assert_eq!(d, 1.0);
    // 63.5 rounds to 64 (even), 31.75 to 32, 0.5 to 0 (even).
    assert_eq!(q, [127, -64, 32, 0]);
    assert_eq!(s, 127 - 64 + 32);
    let (d, _) = quantize_block(&[1.0, f32::NAN], &mut q, false);
    assert!(d.is_nan());
    assert_eq!(q, [0; 4]);
    let (d, _) = quantize_block(&[f32::NEG_INFINITY], &mut q, false);
    assert!(d.is_nan());
    let mut q32 = [0i8; 32];
    let x: Vec<f32> = (0..32).map(|i| i as f32).collect();
    quantize_block(&x, &mut q32, true);
    // Split order: even values first, then odd.
    assert_eq!(q32[1], (2.0f32 * 127.0 / 31.0).round_ties_even() as i8);
    assert_eq!(q32[16], (127.0f32 / 31.0).round_ties_even() as i8);
}

#[test]
fn non_finite_activations_make_that_position_nan() {
    let dtype = DType::Int4 { group: 32 };
    let mut seed = 3u64;
    let w = weights(dtype, 1, 64, &mut seed);
    let mut x: Vec<f32> = (0..128).map(|_| lcg(&mut seed)).collect();
    x[70] = f32::INFINITY;
    let mut a = ActQ::default();
    a.quantize(&x, 2, 64, 32, true);
    for s in Simd::available() {
        assert!(dot_row(s, true, &w, &a, 0).is_finite(), "{}", s.name());
        assert!(dot_row(s, true, &w, &a, 1).is_nan(), "{}", s.name());
    }
}

#[test]
fn quantize_rounds_half_to_even_like_the_definition() {
    // Every multiple of 1/8 in [-130, 130] as x * (127 / amax) with amax = 127: the
    // fast rounding must equal round_ties_even (then the clamp).
    for k in -1040..=1040 {
        let y = k as f32 / 8.0;
        let x = [y, 127.0];
        let mut q2 = [0i8; 2];
        quantize_block(&x, &mut q2, false);
        let want = y.round_ties_even().clamp(-127.0, 127.0) as i8;
        assert_eq!(q2[0], want, "{y}");
    }
}
