//! Every available path against the scalar reference, bit for bit, and the reference
//! against a plain f64 dot product of the dequantized values.

use super::check::{check_paths, lcg, weights};
use super::*;
use crate::tensor::DType;

#[test]
fn every_path_gives_the_reference_bits() {
    let paths = Simd::available();
    // Every vector path of this architecture is among those compared (aarch64: NEON always,
    // and with dotprod where the CPU has it: qemu's `-cpu max` in tools/test.sh does).
    #[cfg(target_arch = "aarch64")]
    assert!(paths.contains(&Simd::Neon), "{paths:?}");
    eprintln!("paths: {:?}", paths.iter().map(|s| s.name()).collect::<Vec<_>>());
    let checked = check_paths().unwrap();
    // 11 shapes x 2 types x 6 rows x 150 products per path (one position with each of the
    // three activation layouts, many positions), the reference included, then 569 int4 and
    // 301 int8 rows of more than 64 KiB each (check_long_rows), then Q4K: 3 shapes x 3
    // layouts x 6 rows x 151, and as many Q5K (check_k).
    assert!(checked >= (19800 + 569 + 301 + 2 * 8154) * paths.len(), "{checked}");
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

/// The Q4K reference against the f64 product of the decoded row (tensor::decode_row: A * u
/// - B), on rows with random headers (every 6-bit scale and min) and quantized ones.
#[test]
fn q4k_reference_is_close_to_the_float_product() {
    let mut seed = 11u64;
    let cols = 512;
    let w = weights(DType::Q4K, 3, cols, &mut seed);
    let rb = DType::Q4K.row_bytes(cols).unwrap();
    let m = crate::tensor::Mat::new(3, cols, DType::Q4K, crate::tensor::Bytes::from_vec(w.clone())).unwrap();
    for r in [0, 1, 2] {
        let x: Vec<f32> = (0..cols).map(|_| lcg(&mut seed)).collect();
        let mut a = ActQ::default();
        a.quantize(&x, 1, cols, 32, true);
        a.set_k4();
        let mut wf = vec![0.0f32; cols];
        m.row_into(r, &mut wf);
        let exact: f64 = wf.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        let norm: f64 = wf.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
        let got = dot_row_scalar(true, &w[r * rb..(r + 1) * rb], &a, 0) as f64;
        assert!(norm > 0.0 && (got - exact).abs() <= norm * 0.01, "row {r}: {got} vs {exact} (norm {norm})");
        // Without the flag the same bytes read as int4 give another number.
        a.k4 = false;
        a.ds.clear();
        assert_ne!(dot_row_scalar(true, &w[r * rb..(r + 1) * rb], &a, 0) as f64, got);
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

#[cfg(target_arch = "x86_64")]
#[test]
fn quantize_avx2_gives_the_scalar_integers() {
    if !super::x86_runs::has_avx2() {
        return;
    }
    let mut seed = 11u64;
    for n in [8usize, 32, 64, 128] {
        for round in 0..50 {
            // Random values, exact ties (k / 2 after the scale), and values past the clamp.
            let x: Vec<f32> = (0..n)
                .map(|i| match (round + i) % 3 {
                    0 => lcg(&mut seed) * 3.0,
                    1 => ((lcg(&mut seed) * 400.0).round() / 2.0) * (2.0 / 127.0),
                    _ => (lcg(&mut seed) - 0.5) * 1e3,
                })
                .collect();
            let inv = 127.0 / x.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-3) * [1.0, 1.7][round % 2];
            // The split order needs whole chunks of 32.
            for split in [false, n % 32 == 0] {
                let (mut want, mut got) = (vec![0i8; n], vec![0i8; n]);
                let ws = super::quantize_values(&x, inv, &mut want, split);
                // SAFETY: AVX2 checked above; n is a multiple of 8.
                let gs = unsafe { super::x86_runs::quantize_avx2(&x, inv, &mut got, split) };
                assert_eq!((gs, &got), (ws, &want), "n {n} round {round} split {split}");
            }
        }
    }
}
