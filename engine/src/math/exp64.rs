//! e^x in f64 with the same bits on every path ([`exp64`], [`exp64_rows`]): what the
//! log-softmax of `logprobs` sums over a vocabulary (50 thousand exponentials a token).
//! `libm::exp` gave those bits on every target too, one value at a time (about 600 us a
//! token at a 50k vocabulary on a Xeon); these steps are plain IEEE operations (no FMA),
//! so the lanes of AVX2, NEON and SIMD128 repeat them one for one.
//!
//! x = k ln2 + r with k = x / ln2 rounded to nearest (the 1.5 * 2^52 addition), |r| <=
//! ln2 / 2; e^r by its Taylor polynomial of degree 13 in Horner form (truncation below
//! 6e-18 relative), scaled by 2^k built from its exponent bits. Within a few ulp of e^x.
//! Results below the smallest normal f64 flush to 0, as [`super::exp`]'s do in f32.

/// 1.5 * 2^52: adding it rounds a value below 2^51 in magnitude to an integer.
const ROUND: f64 = 6_755_399_441_055_744.0;
const LOG2E: f64 = std::f64::consts::LOG2_E;
/// ln 2 split (fdlibm's): `k * LN2_HI` is exact for |k| < 2^20.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// Above, +inf; below, 0 (e^LO is about the smallest normal f64).
const HI: f64 = 709.782_712_893_384;
const LO: f64 = -708.396_418_532_264;
/// The Taylor coefficients 1/13! .. 1/2!, 1, 1, innermost first (rounded once each).
const HORNER: [f64; 13] = [
    1.0 / 479_001_600.0,
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];
/// 1/13!, the innermost coefficient (the polynomial starts as r times it).
const C13: f64 = 1.0 / 6_227_020_800.0;

/// e^x, the reference every lane path repeats.
#[inline]
pub fn exp64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x > HI {
        return f64::INFINITY;
    }
    if x < LO {
        return 0.0;
    }
    let t = x * LOG2E + ROUND;
    let k = t - ROUND;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let mut p = r * C13;
    for (j, c) in HORNER.iter().enumerate() {
        p += c;
        if j + 1 < HORNER.len() {
            p *= r;
        }
    }
    // k from t's low bits (t = ROUND + k exactly), in [-1022, 1024].
    let ki = t.to_bits().wrapping_sub(ROUND.to_bits()) as i64;
    let v = p * f64::from_bits(((ki.min(1023) + 1023) as u64) << 52);
    if ki > 1023 {
        v * 2.0
    } else {
        v
    }
}

/// `v[i] = exp64(v[i])` for every i, bit for bit; `simd`: the caller's SIMD path is on
/// (`qdot::Simd::active()` is not scalar).
pub fn exp64_rows(v: &mut [f64], simd: bool) {
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if simd && is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        done = unsafe { rows_avx2(v) };
    }
    #[cfg(target_arch = "aarch64")]
    if simd {
        done = rows_neon(v);
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if simd {
        done = rows_simd128(v);
    }
    let _ = simd;
    for x in &mut v[done..] {
        *x = exp64(*x);
    }
}

/// The whole groups of four of [`exp64_rows`] on AVX2; returns how many it did.
///
/// SAFETY (caller): AVX2 present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rows_avx2(v: &mut [f64]) -> usize {
    use std::arch::x86_64::*;
    let n = v.len() / 4 * 4;
    let set = _mm256_set1_pd;
    for c in v[..n].chunks_exact_mut(4) {
        // SAFETY: `c` holds four f64; unaligned loads and stores.
        let x = unsafe { _mm256_loadu_pd(c.as_ptr()) };
        let t = _mm256_add_pd(_mm256_mul_pd(x, set(LOG2E)), set(ROUND));
        let k = _mm256_sub_pd(t, set(ROUND));
        let r = _mm256_sub_pd(_mm256_sub_pd(x, _mm256_mul_pd(k, set(LN2_HI))), _mm256_mul_pd(k, set(LN2_LO)));
        let mut p = _mm256_mul_pd(r, set(C13));
        for (j, c) in HORNER.iter().enumerate() {
            p = _mm256_add_pd(p, set(*c));
            if j + 1 < HORNER.len() {
                p = _mm256_mul_pd(p, r);
            }
        }
        let ki = _mm256_sub_epi64(_mm256_castpd_si256(t), _mm256_castpd_si256(set(ROUND)));
        let big = _mm256_cmpgt_epi64(ki, _mm256_set1_epi64x(1023));
        let kc = _mm256_blendv_epi8(ki, _mm256_set1_epi64x(1023), big);
        let scale = _mm256_slli_epi64::<52>(_mm256_add_epi64(kc, _mm256_set1_epi64x(1023)));
        let y = _mm256_mul_pd(p, _mm256_castsi256_pd(scale));
        let y = _mm256_blendv_pd(y, _mm256_mul_pd(y, set(2.0)), _mm256_castsi256_pd(big));
        let y = _mm256_blendv_pd(y, set(f64::INFINITY), _mm256_cmp_pd::<_CMP_GT_OQ>(x, set(HI)));
        let y = _mm256_blendv_pd(y, _mm256_setzero_pd(), _mm256_cmp_pd::<_CMP_LT_OQ>(x, set(LO)));
        let y = _mm256_blendv_pd(y, x, _mm256_cmp_pd::<_CMP_UNORD_Q>(x, x));
        // SAFETY: as the load.
        unsafe { _mm256_storeu_pd(c.as_mut_ptr(), y) };
    }
    n
}

/// The whole pairs of [`exp64_rows`] in NEON; returns how many it did.
#[cfg(target_arch = "aarch64")]
fn rows_neon(v: &mut [f64]) -> usize {
    use std::arch::aarch64::*;
    let n = v.len() / 2 * 2;
    for c in v[..n].chunks_exact_mut(2) {
        // SAFETY: `c` holds two f64; NEON is part of aarch64; register operations.
        unsafe {
            let set = |a: f64| vdupq_n_f64(a);
            let x = vld1q_f64(c.as_ptr());
            let t = vaddq_f64(vmulq_f64(x, set(LOG2E)), set(ROUND));
            let k = vsubq_f64(t, set(ROUND));
            let r = vsubq_f64(vsubq_f64(x, vmulq_f64(k, set(LN2_HI))), vmulq_f64(k, set(LN2_LO)));
            let mut p = vmulq_f64(r, set(C13));
            for (j, c) in HORNER.iter().enumerate() {
                p = vaddq_f64(p, set(*c));
                if j + 1 < HORNER.len() {
                    p = vmulq_f64(p, r);
                }
            }
            let ki = vsubq_s64(vreinterpretq_s64_f64(t), vreinterpretq_s64_f64(set(ROUND)));
            let big = vcgtq_s64(ki, vdupq_n_s64(1023));
            let kc = vbslq_s64(big, vdupq_n_s64(1023), ki);
            let scale = vshlq_n_s64::<52>(vaddq_s64(kc, vdupq_n_s64(1023)));
            let y = vmulq_f64(p, vreinterpretq_f64_s64(scale));
            let y = vbslq_f64(big, vmulq_f64(y, set(2.0)), y);
            let y = vbslq_f64(vcgtq_f64(x, set(HI)), set(f64::INFINITY), y);
            let y = vbslq_f64(vcltq_f64(x, set(LO)), set(0.0), y);
            vst1q_f64(c.as_mut_ptr(), vbslq_f64(vceqq_f64(x, x), y, x));
        }
    }
    n
}

/// The whole pairs of [`exp64_rows`] in SIMD128; returns how many it did.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn rows_simd128(v: &mut [f64]) -> usize {
    use std::arch::wasm32::*;
    let n = v.len() / 2 * 2;
    let set = f64x2_splat;
    for c in v[..n].chunks_exact_mut(2) {
        // SAFETY: `c` holds two f64; unaligned loads and stores are allowed.
        let x = unsafe { v128_load(c.as_ptr() as *const v128) };
        let t = f64x2_add(f64x2_mul(x, set(LOG2E)), set(ROUND));
        let k = f64x2_sub(t, set(ROUND));
        let r = f64x2_sub(f64x2_sub(x, f64x2_mul(k, set(LN2_HI))), f64x2_mul(k, set(LN2_LO)));
        let mut p = f64x2_mul(r, set(C13));
        for (j, c) in HORNER.iter().enumerate() {
            p = f64x2_add(p, set(*c));
            if j + 1 < HORNER.len() {
                p = f64x2_mul(p, r);
            }
        }
        let ki = i64x2_sub(t, set(ROUND));
        let big = i64x2_gt(ki, i64x2_splat(1023));
        let kc = v128_bitselect(i64x2_splat(1023), ki, big);
        let scale = i64x2_shl(i64x2_add(kc, i64x2_splat(1023)), 52);
        let y = f64x2_mul(p, scale);
        let y = v128_bitselect(f64x2_mul(y, set(2.0)), y, big);
        let y = v128_bitselect(set(f64::INFINITY), y, f64x2_gt(x, set(HI)));
        let y = v128_bitselect(set(0.0), y, f64x2_lt(x, set(LO)));
        let y = v128_bitselect(x, y, f64x2_ne(x, x));
        // SAFETY: as the load.
        unsafe { v128_store(c.as_mut_ptr() as *mut v128, y) };
    }
    n
}

/// Checks [`exp64_rows`] (with `simd`: whatever path this build and CPU take) against
/// [`exp64`] bit for bit over a sweep of the whole range (both bounds, k = 1024, flushed
/// results), special values and lengths with tails; returns how many values agreed. The
/// native tests run it, and `qdot::check::check_paths` runs it where the browser does.
pub fn check_exp64(simd: bool) -> Result<usize, String> {
    let mut xs: Vec<f64> = Vec::new();
    let mut x = -720.0f64;
    while x < 720.0 {
        xs.push(x);
        x += 0.0917;
    }
    for b in [HI, LO, 709.0, 709.78, 0.5 * std::f64::consts::LN_2, -40.0, 1e-300, 0.0] {
        for d in -4i64..=4 {
            let v = f64::from_bits((b.to_bits() as i64 + d) as u64);
            xs.extend([v, -v]);
        }
    }
    xs.extend([-0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -f64::NAN, f64::MAX, f64::MIN, 1e-310]);
    let mut checked = 0;
    for len in [xs.len(), xs.len() - 1, 3, 1, 0] {
        let mut got = xs[..len].to_vec();
        exp64_rows(&mut got, simd);
        for (o, &x) in got.iter().zip(&xs) {
            let want = exp64(x);
            if want.to_bits() != o.to_bits() && !(want.is_nan() && o.is_nan()) {
                return Err(format!("exp64_rows x={x:e}: {o:e} vs {want:e}"));
            }
            checked += 1;
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_gives_the_reference_bits() {
        assert!(check_exp64(true).unwrap() > 30_000);
    }

    #[test]
    fn close_to_libm_everywhere() {
        let mut x = -708.0f64;
        let mut worst = 0.0f64;
        while x < 709.0 {
            let (got, want) = (exp64(x), libm::exp(x));
            worst = worst.max(((got - want) / want).abs());
            x += 0.003_17;
        }
        assert!(worst < 4.0 * f64::EPSILON, "worst relative error {worst:e}");
        assert_eq!(exp64(0.0), 1.0);
        assert_eq!(exp64(-800.0), 0.0);
        assert_eq!(exp64(710.0), f64::INFINITY);
        assert!(exp64(f64::NAN).is_nan());
    }
}
