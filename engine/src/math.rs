//! Scalar math with results that are the same bits on every platform.
//!
//! `f32::exp` and friends call the platform's libm, whose last bit differs between
//! glibc, the wasm32 runtime and GPU drivers. Anything that can decide a token (softmax
//! in attention and routing, SiLU, sigmoid) uses [`exp`] below instead: only IEEE
//! add/sub/mul/div/floor and bit manipulation, in a fixed order, so native, wasm32 and a
//! WGSL port compute the same bits. Table math done once per model (RoPE frequencies)
//! uses the pure-Rust `libm` crate in f64, which is also identical on every target.

mod act;
mod exp64;
pub use act::{check_activations, exp_rows, Activation};
pub use exp64::{check_exp64, exp64, exp64_rows};

const LOG2E: f32 = std::f32::consts::LOG2_E;
// ln 2 split so that k * LN2_HI is exact for |k| < 2^15 (LN2_HI has 9 significant bits).
const LN2_HI: f32 = 0.693_359_4; // 0x3f31_8000
const LN2_LO: f32 = -2.121_944_4e-4;

/// e^x in f32, within 2 ulp of the true value, bit-reproducible everywhere.
///
/// x = k ln2 + r with |r| <= ln2/2; e^r by a degree-7 Taylor polynomial in Horner form;
/// the result is scaled by 2^k built from its exponent bits.
#[inline]
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    // (math/act.rs runs these steps in SIMD lanes: change both together.)
    if x > 88.722_83 {
        return f32::INFINITY;
    }
    if x < -87.336_54 {
        // Below the smallest normal: flush to zero (as a GPU would).
        return 0.0;
    }
    let k = floor_small(x * LOG2E + 0.5);
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let k = k as i32; // in [-126, 128]
    if k > 127 {
        p * pow2(127) * 2.0
    } else {
        p * pow2(k)
    }
}

/// floor(y) for |y| < 2^31, exactly: truncation toward zero, minus one where that went up.
/// The same value as `f32::floor`, which on baseline x86-64 (no SSE4.1 `roundss`) is a
/// libm call: it was 1.5% of a prefill, inside the elementwise SiLU.
#[inline]
fn floor_small(y: f32) -> f32 {
    let t = y as i32;
    (t - ((t as f32) > y) as i32) as f32
}

/// 2^k for k in [-126, 127], exactly.
#[inline]
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Logistic sigmoid 1 / (1 + e^-x), as torch.sigmoid computes it.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// SiLU (swish): x * sigmoid(x), written as x / (1 + e^-x) like torch.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// softplus(x) = log(1 + e^x), x itself above 20 (torch's threshold): [`exp`] under
/// `libm`'s log1pf, so every target gives the same bits (route.wgsl and the DeltaNet
/// gates' `det_softplus` port the same steps).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        libm::log1pf(exp(x))
    }
}

/// Sum of `w[i] * x[i]` in the engine's one reduction order: eight interleaved lane
/// accumulators (lane = i mod 8), combined pairwise as ((0+4)+(2+6))+((1+5)+(3+7)).
/// The fixed lane structure lets LLVM vectorize without reassociating, and a GPU
/// kernel (or any SIMD width that divides 8) can reproduce the same bits.
#[inline]
pub fn dot(w: &[f32], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let n = w.len().min(x.len());
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        let wb = &w[c * 8..c * 8 + 8];
        let xb = &x[c * 8..c * 8 + 8];
        for l in 0..8 {
            acc[l] += wb[l] * xb[l];
        }
    }
    for i in chunks * 8..n {
        acc[i - chunks * 8] += w[i] * x[i];
    }
    reduce8(acc)
}

/// [`dot`] with its eight lanes in one AVX2 register: each product and sum rounded on its
/// own as there (no FMA), the tail into the same lanes, the same [`reduce8`]: the same bits.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub unsafe fn dot_avx2(w: &[f32], x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = w.len().min(x.len());
    let chunks = n / 8;
    let mut v = _mm256_setzero_ps();
    for c in 0..chunks {
        // SAFETY: c * 8 + 8 <= n <= both lengths.
        let (a, b) = unsafe { (_mm256_loadu_ps(w.as_ptr().add(c * 8)), _mm256_loadu_ps(x.as_ptr().add(c * 8))) };
        v = _mm256_add_ps(v, _mm256_mul_ps(a, b));
    }
    let mut acc = [0.0f32; 8];
    // SAFETY: acc holds eight floats.
    unsafe { _mm256_storeu_ps(acc.as_mut_ptr(), v) };
    for i in chunks * 8..n {
        acc[i - chunks * 8] += w[i] * x[i];
    }
    reduce8(acc)
}

/// [`dot`] with its eight lanes in two SIMD128 registers (lanes 0-3 and 4-7): each product
/// and sum rounded on its own as there, the tail into the same lanes, the same
/// [`reduce8`]: the same bits.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[inline]
pub fn dot_simd128(w: &[f32], x: &[f32]) -> f32 {
    use std::arch::wasm32::*;
    let n = w.len().min(x.len());
    let chunks = n / 8;
    let (mut lo, mut hi) = (f32x4_splat(0.0), f32x4_splat(0.0));
    // SAFETY: every load reads 4 floats of a slice that has them (at + 4 <= chunks * 8 <= n).
    let l = |s: &[f32], at: usize| unsafe { v128_load(s.as_ptr().add(at) as *const v128) };
    for c in 0..chunks {
        let at = c * 8;
        lo = f32x4_add(lo, f32x4_mul(l(w, at), l(x, at)));
        hi = f32x4_add(hi, f32x4_mul(l(w, at + 4), l(x, at + 4)));
    }
    let mut acc = [0.0f32; 8];
    // SAFETY: the two stores write acc's 8 floats; v128.store has no alignment requirement.
    unsafe {
        v128_store(acc.as_mut_ptr() as *mut v128, lo);
        v128_store(acc.as_mut_ptr().add(4) as *mut v128, hi);
    }
    for i in chunks * 8..n {
        acc[i - chunks * 8] += w[i] * x[i];
    }
    reduce8(acc)
}

/// [`dot`] with its eight lanes in two NEON registers (lanes 0-3 and 4-7): each product
/// and sum rounded on its own as there (no fused multiply-add), the tail into the same
/// lanes, the same [`reduce8`]: the same bits.
#[cfg(target_arch = "aarch64")]
#[inline]
pub fn dot_neon(w: &[f32], x: &[f32]) -> f32 {
    use std::arch::aarch64::*;
    let n = w.len().min(x.len());
    let chunks = n / 8;
    let mut acc = [0.0f32; 8];
    // SAFETY: NEON is part of aarch64; every load reads 4 floats that the slices have
    // (at + 4 <= chunks * 8 <= n), the stores write acc's 8.
    unsafe {
        let (mut lo, mut hi) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let l = |s: &[f32], at: usize| vld1q_f32(s.as_ptr().add(at));
        for c in 0..chunks {
            let at = c * 8;
            lo = vaddq_f32(lo, vmulq_f32(l(w, at), l(x, at)));
            hi = vaddq_f32(hi, vmulq_f32(l(w, at + 4), l(x, at + 4)));
        }
        vst1q_f32(acc.as_mut_ptr(), lo);
        vst1q_f32(acc.as_mut_ptr().add(4), hi);
    }
    for i in chunks * 8..n {
        acc[i - chunks * 8] += w[i] * x[i];
    }
    reduce8(acc)
}

/// Sum of squares in the same lane order as [`dot`].
#[inline]
pub fn sum_sq(x: &[f32]) -> f32 {
    dot(x, x)
}

/// Combine eight lane accumulators in the fixed order documented on [`dot`].
#[inline]
pub fn reduce8(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// In-place softmax with the max subtracted first, sums in index order.
pub fn softmax(x: &mut [f32]) {
    // exp(-inf - m) adds +0.0 to a positive sum: the bits of the plain softmax.
    softmax_with_sink(x, f32::NEG_INFINITY);
}

/// [`softmax`] with one more logit, `sink`, in the denominator only (gpt_oss's attention
/// sinks, transformers' eager_attention_forward): the max includes the sink, the sum adds
/// its term after the others, and the sink's own probability is dropped.
pub fn softmax_with_sink(x: &mut [f32], sink: f32) {
    softmax_lanes(x, sink, false);
}

/// [`softmax_with_sink`] with the exponentials in SIMD lanes when `simd` ([`exp_rows`]:
/// the scalar `exp`'s bits), the sum still one by one in index order: the same bits either
/// way. Attention's scores take it (the caller knows whether SIMD is on: `COLIBRI_SIMD`):
/// at OLMoE's shape a 1024-token prompt is 134 M scores, and the scalar loop was 2-4% of a
/// long prefill and of the decode after it (docs/benchmarks.md "Softmax in lanes").
pub fn softmax_lanes(x: &mut [f32], sink: f32, simd: bool) {
    let m = x.iter().copied().fold(sink, f32::max);
    if m == f32::NEG_INFINITY {
        // Every entry masked: leave a uniform zero row rather than NaN.
        x.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    for v in x.iter_mut() {
        *v -= m;
    }
    exp_rows(x, simd);
    let mut s = 0.0f32;
    for &v in x.iter() {
        s += v;
    }
    s += exp(sink - m);
    for v in x.iter_mut() {
        *v /= s;
    }
}

/// Index of the largest value; ties go to the lowest index; NaN never wins.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// The largest of `x` with NaN left out (-inf when there is none): eight running maxima
/// (the first of equal values kept), then the first largest of those, in explicit
/// comparisons, so every target picks the same value (the same zero when +0 and -0 tie).
/// In lanes the compiler vectorizes: the sampler and the log-softmax take it over a
/// vocabulary every token.
pub fn row_max(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(tail) {
        m = if v > m { v } else { m };
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_max_skips_nan_and_takes_the_largest() {
        let mut x: Vec<f32> = (0..37).map(|i| ((i * 7919) % 101) as f32 - 50.0).collect();
        x[5] = f32::NAN;
        assert_eq!(row_max(&x), 50.0);
        x[36] = 75.5; // in the tail
        assert_eq!(row_max(&x), 75.5);
        assert_eq!(row_max(&[f32::NAN, f32::NEG_INFINITY]), f32::NEG_INFINITY);
        assert_eq!(row_max(&[]), f32::NEG_INFINITY);
        assert_eq!(row_max(&[1.0, f32::INFINITY, 2.0]), f32::INFINITY);
    }

    #[test]
    fn exp_is_accurate_over_the_softmax_range() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            let rel = ((got - want) / want).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        // 2 ulp of f32 is 2.4e-7 relative.
        assert!(worst < 2.4e-7, "worst relative error {worst}");
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-1000.0), 0.0);
        assert_eq!(exp(1000.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(88.7).is_finite());
    }

    #[test]
    fn softmax_survives_large_values() {
        let mut v = vec![1e30f32, 1e30, -1e30, 0.0];
        softmax(&mut v);
        assert_eq!(v, vec![0.5, 0.5, 0.0, 0.0]);
        let mut v = vec![3.0e38f32, 1.0];
        softmax(&mut v);
        assert_eq!(v, vec![1.0, 0.0]);
        let mut v = vec![f32::NEG_INFINITY; 3];
        softmax(&mut v);
        assert!(v.iter().all(|x| *x == 0.0));
        let mut v = vec![1000.0f32, 999.0];
        softmax(&mut v);
        let want = 1.0 / (1.0 + (-1.0f64).exp());
        assert!((v[0] as f64 - want).abs() < 1e-7);
        assert!((v.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn dot_order_is_fixed_and_matches_f64_closely() {
        let w: Vec<f32> = (0..37).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
        let x: Vec<f32> = (0..37).map(|i| ((i * 104729) % 97) as f32 / 40.0 - 1.2).collect();
        let got = dot(&w, &x);
        let want: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        assert!((got as f64 - want).abs() < 1e-5);
        // Reference written out by hand: lanes then the documented combine.
        let mut lanes = [0.0f32; 8];
        for i in 0..37 {
            lanes[i % 8] += w[i] * x[i];
        }
        assert_eq!(got.to_bits(), reduce8(lanes).to_bits());
    }

    #[test]
    fn floor_small_is_floor() {
        // exp's argument is x * log2(e) + 0.5 with x inside its guards: |y| < 129. Every
        // f32 step near the integers and halves of that range, plus random values.
        let mut vals = vec![0.0f32, 0.5, -0.5, 1.0, -1.0, 127.99999, -126.00001, 128.5, -127.5, 1e-30, -1e-30];
        for i in -130i32..=130 {
            let v = i as f32;
            vals.extend([v, v + 0.5, v.next_up(), v.next_down(), (v + 0.5).next_up(), (v + 0.5).next_down()]);
        }
        let mut seed = 3u32;
        vals.extend((0..10_000).map(|_| {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 260.0 - 130.0
        }));
        for y in vals {
            assert_eq!(floor_small(y), y.floor(), "{y}");
        }
    }

    #[test]
    fn silu_and_sigmoid() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert_eq!(silu(0.0), 0.0);
        for &x in &[-20.0f32, -3.0, -0.5, 0.25, 2.0, 15.0] {
            let want = x as f64 / (1.0 + (-(x as f64)).exp());
            assert!((silu(x) as f64 - want).abs() <= want.abs() * 3e-7 + 1e-30, "{x}");
        }
        assert_eq!(silu(-200.0), -0.0);
        assert_eq!(sigmoid(200.0), 1.0);
    }

    #[test]
    fn a_sink_takes_its_share_of_the_denominator() {
        let mut v = vec![1.0f32, 2.0, 0.5];
        softmax_with_sink(&mut v, 1.5);
        let z: f64 = [1.0f64, 2.0, 0.5, 1.5].iter().map(|x| x.exp()).sum();
        for (got, x) in v.iter().zip([1.0f64, 2.0, 0.5]) {
            assert!((*got as f64 - x.exp() / z).abs() < 1e-7);
        }
        // A sink far below the scores changes nothing; far above, it takes everything.
        let (mut a, mut b) = (vec![0.3f32, -1.0], vec![0.3f32, -1.0]);
        softmax_with_sink(&mut a, -1e4);
        softmax(&mut b);
        assert_eq!(a, b);
        softmax_with_sink(&mut a, 1e4);
        assert_eq!(a, vec![0.0, 0.0]);
    }

    /// The softmax in lanes gives the bits of the scalar loop it replaced (each entry's
    /// `exp(v - m)`, the sum in index order, then the sink), at row lengths around the lanes'
    /// widths, with masked (-inf) entries and a sink.
    #[test]
    fn softmax_in_lanes_gives_the_scalar_bits() {
        for len in [1usize, 3, 7, 8, 9, 15, 16, 17, 31, 64, 100, 1027] {
            let row: Vec<f32> = (0..len)
                .map(|i| if i % 11 == 5 { f32::NEG_INFINITY } else { ((i * 7919) % 2003) as f32 / 97.0 - 9.0 })
                .collect();
            for sink in [f32::NEG_INFINITY, 0.25, 30.0] {
                let m = row.iter().copied().fold(sink, f32::max);
                let mut want: Vec<f32> = row.iter().map(|&v| exp(v - m)).collect();
                let s = want.iter().fold(0.0f32, |s, &v| s + v) + exp(sink - m);
                want.iter_mut().for_each(|v| *v /= s);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                for simd in [false, true] {
                    let mut got = row.clone();
                    softmax_lanes(&mut got, sink, simd);
                    assert_eq!(bits(&got), bits(&want), "len {len}, sink {sink}, simd {simd}");
                }
            }
        }
    }

    #[test]
    fn argmax_ties_and_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
    }
}
