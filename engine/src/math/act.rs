//! The SwiGLU activation `silu(g) * u` over whole rows, in SIMD lanes that run the
//! scalar [`super::exp`]'s steps one for one (the same IEEE operations in the same order,
//! no FMA, the same range checks): the same bits as the scalar loop on every path.
//!
//! Element by element it was 2% of a two-thread decode's samples (OLMoE shape: eight
//! experts of 1024 rows a layer, 130 thousand SiLUs a token), run on one thread while the
//! other waited: the scalar [`super::exp`] has four branches and two float/int conversions.

/// What every SIMD path shares: [`super::exp`]'s constants.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64", all(target_arch = "wasm32", target_feature = "simd128")))]
mod lanes {
    pub(super) use super::super::{LN2_HI, LN2_LO, LOG2E};

    /// The Horner coefficients of [`super::super::exp`]'s polynomial, innermost first (the
    /// same f32 constants: `1.0 / 6.0` and so on, rounded once at compile time).
    pub(super) const HORNER: [f32; 7] = [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0];

    /// [`super::super::exp`]'s bounds: above, +inf; below, 0.
    pub(super) const HI: f32 = 88.722_83;
    pub(super) const LO: f32 = -87.336_54;
}
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
use lanes::*;

/// `g[i] = silu(g[i]) * u[i]` for i < min(len): [`super::silu`] times `u`, bit for bit.
/// `simd`: the caller's SIMD path is on (`qdot::Simd::active()` is not scalar): AVX2 where
/// the CPU has it, NEON on aarch64, SIMD128 in a wasm build with it; false runs the scalar
/// loop.
pub fn silu_mul(g: &mut [f32], u: &[f32], simd: bool) {
    let n = g.len().min(u.len());
    let (g, u) = (&mut g[..n], &u[..n]);
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if simd && is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        done = unsafe { silu_mul_avx2(g, u) };
    }
    #[cfg(target_arch = "aarch64")]
    if simd {
        done = silu_mul_neon(g, u);
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if simd {
        done = silu_mul_simd128(g, u);
    }
    let _ = simd;
    for (a, b) in g[done..].iter_mut().zip(&u[done..]) {
        *a = super::silu(*a) * *b;
    }
}

/// The whole groups of eight of [`silu_mul`] on AVX2; returns how many it did.
///
/// SAFETY (caller): AVX2 present; `g.len() == u.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn silu_mul_avx2(g: &mut [f32], u: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let n = g.len() / 8 * 8;
    let mut i = 0;
    while i < n {
        // SAFETY: i + 8 <= n <= both lengths.
        unsafe {
            let x = _mm256_loadu_ps(g.as_ptr().add(i));
            let neg = _mm256_xor_ps(x, _mm256_set1_ps(-0.0));
            let s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), exp8(neg)));
            _mm256_storeu_ps(g.as_mut_ptr().add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr().add(i))));
        }
        i += 8;
    }
    n
}

/// [`super::exp`] in eight lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let y = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _mm256_set1_ps(0.5));
    // floor_small: truncate, minus one where that went up (lanes out of range are replaced
    // below, whatever the conversion gave them).
    let t = _mm256_cvttps_epi32(y);
    let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_cvtepi32_ps(t), y));
    let ki = _mm256_add_epi32(t, up);
    let k = _mm256_cvtepi32_ps(ki);
    let r = _mm256_sub_ps(
        _mm256_sub_ps(x, _mm256_mul_ps(k, _mm256_set1_ps(LN2_HI))),
        _mm256_mul_ps(k, _mm256_set1_ps(LN2_LO)),
    );
    let mut p = _mm256_mul_ps(r, _mm256_set1_ps(1.0 / 5040.0));
    for (j, c) in HORNER.iter().enumerate() {
        p = _mm256_add_ps(_mm256_set1_ps(*c), p);
        if j + 1 < HORNER.len() {
            p = _mm256_mul_ps(r, p);
        }
    }
    // p * 2^k, k = 128 as (p * 2^127) * 2.
    let scale =
        _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_min_epi32(ki, _mm256_set1_epi32(127)), _mm256_set1_epi32(127)));
    let v = _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
    let big = _mm256_castsi256_ps(_mm256_cmpgt_epi32(ki, _mm256_set1_epi32(127)));
    let v = _mm256_blendv_ps(v, _mm256_mul_ps(v, _mm256_set1_ps(2.0)), big);
    let v = _mm256_blendv_ps(v, _mm256_set1_ps(f32::INFINITY), _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(HI)));
    let v = _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(LO)));
    _mm256_blendv_ps(v, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
}

/// The whole groups of four of [`silu_mul`] in NEON (aarch64's baseline); returns how many
/// it did.
#[cfg(target_arch = "aarch64")]
fn silu_mul_neon(g: &mut [f32], u: &[f32]) -> usize {
    use std::arch::aarch64::*;
    let n = g.len() / 4 * 4;
    let mut i = 0;
    while i < n {
        // SAFETY: i + 4 <= n <= both lengths; NEON is part of aarch64.
        unsafe {
            let x = vld1q_f32(g.as_ptr().add(i));
            let s = vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0), exp4_neon(vnegq_f32(x))));
            vst1q_f32(g.as_mut_ptr().add(i), vmulq_f32(s, vld1q_f32(u.as_ptr().add(i))));
        }
        i += 4;
    }
    n
}

/// [`super::exp`] in four NEON lanes (no fused operations: each product and sum rounded on
/// its own, as the scalar code).
#[cfg(target_arch = "aarch64")]
fn exp4_neon(x: std::arch::aarch64::float32x4_t) -> std::arch::aarch64::float32x4_t {
    use std::arch::aarch64::*;
    // SAFETY: NEON is part of aarch64; only register operations.
    unsafe {
        let y = vaddq_f32(vmulq_f32(x, vdupq_n_f32(LOG2E)), vdupq_n_f32(0.5));
        // Truncation toward zero, as `as i32` (lanes out of range are replaced below).
        let t = vcvtq_s32_f32(y);
        let up = vreinterpretq_s32_u32(vcgtq_f32(vcvtq_f32_s32(t), y));
        let ki = vaddq_s32(t, up);
        let k = vcvtq_f32_s32(ki);
        let r = vsubq_f32(vsubq_f32(x, vmulq_f32(k, vdupq_n_f32(LN2_HI))), vmulq_f32(k, vdupq_n_f32(LN2_LO)));
        let mut p = vmulq_f32(r, vdupq_n_f32(1.0 / 5040.0));
        for (j, c) in HORNER.iter().enumerate() {
            p = vaddq_f32(vdupq_n_f32(*c), p);
            if j + 1 < HORNER.len() {
                p = vmulq_f32(r, p);
            }
        }
        let scale = vshlq_n_s32::<23>(vaddq_s32(vminq_s32(ki, vdupq_n_s32(127)), vdupq_n_s32(127)));
        let v = vmulq_f32(p, vreinterpretq_f32_s32(scale));
        let v = vbslq_f32(vcgtq_s32(ki, vdupq_n_s32(127)), vmulq_f32(v, vdupq_n_f32(2.0)), v);
        let v = vbslq_f32(vcgtq_f32(x, vdupq_n_f32(HI)), vdupq_n_f32(f32::INFINITY), v);
        let v = vbslq_f32(vcltq_f32(x, vdupq_n_f32(LO)), vdupq_n_f32(0.0), v);
        vbslq_f32(vceqq_f32(x, x), v, x)
    }
}

/// The whole groups of four of [`silu_mul`] in SIMD128; returns how many it did.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn silu_mul_simd128(g: &mut [f32], u: &[f32]) -> usize {
    use std::arch::wasm32::*;
    let n = g.len() / 4 * 4;
    let mut i = 0;
    while i < n {
        // SAFETY: i + 4 <= n <= both lengths; unaligned loads and stores are allowed.
        unsafe {
            let x = v128_load(g.as_ptr().add(i) as *const v128);
            let s = f32x4_div(x, f32x4_add(f32x4_splat(1.0), exp4(f32x4_neg(x))));
            let b = v128_load(u.as_ptr().add(i) as *const v128);
            v128_store(g.as_mut_ptr().add(i) as *mut v128, f32x4_mul(s, b));
        }
        i += 4;
    }
    n
}

/// [`super::exp`] in four lanes.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn exp4(x: std::arch::wasm32::v128) -> std::arch::wasm32::v128 {
    use std::arch::wasm32::*;
    let y = f32x4_add(f32x4_mul(x, f32x4_splat(LOG2E)), f32x4_splat(0.5));
    // In range the truncation is `as i32`'s; out of range the lanes are replaced below.
    let t = i32x4_trunc_sat_f32x4(y);
    let ki = i32x4_add(t, f32x4_gt(f32x4_convert_i32x4(t), y));
    let k = f32x4_convert_i32x4(ki);
    let r = f32x4_sub(f32x4_sub(x, f32x4_mul(k, f32x4_splat(LN2_HI))), f32x4_mul(k, f32x4_splat(LN2_LO)));
    let mut p = f32x4_mul(r, f32x4_splat(1.0 / 5040.0));
    for (j, c) in HORNER.iter().enumerate() {
        p = f32x4_add(f32x4_splat(*c), p);
        if j + 1 < HORNER.len() {
            p = f32x4_mul(r, p);
        }
    }
    let scale = i32x4_shl(i32x4_add(i32x4_min(ki, i32x4_splat(127)), i32x4_splat(127)), 23);
    let v = f32x4_mul(p, scale);
    let v = v128_bitselect(f32x4_mul(v, f32x4_splat(2.0)), v, i32x4_gt(ki, i32x4_splat(127)));
    let v = v128_bitselect(f32x4_splat(f32::INFINITY), v, f32x4_gt(x, f32x4_splat(HI)));
    let v = v128_bitselect(f32x4_splat(0.0), v, f32x4_lt(x, f32x4_splat(LO)));
    v128_bitselect(x, v, f32x4_ne(x, x))
}

/// Checks [`silu_mul`] (with `simd`: whatever path this build and CPU take) against the scalar
/// [`super::silu`] times u, bit for bit: a sweep over the exponent's whole range (both
/// bounds, k = 128, subnormal results), special values, and lengths with tails. Returns
/// how many values agreed. The native tests run it, and `qdot::check::check_paths` runs it
/// where the browser builds call it (`kernelSelfCheck`).
pub fn check_silu_mul(simd: bool) -> Result<usize, String> {
    let mut g: Vec<f32> = Vec::new();
    let mut x = -100.0f32;
    while x < 100.0 {
        g.push(x);
        x += 0.01371;
    }
    for b in [88.722_83f32, -87.336_54, 88.7, 88.72, -87.3, -88.72, 89.0, -89.0] {
        for d in -4i32..=4 {
            let v = f32::from_bits((b.to_bits() as i32 + d) as u32);
            g.extend([v, -v]);
        }
    }
    g.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, 1e-40, -1e-40, f32::MAX, f32::MIN]);
    g.extend([f32::MIN_POSITIVE, 1e-7, -1e-7, 0.5, -0.5, 127.5, -126.5, 1e30, -1e30]);
    let u: Vec<f32> = (0..g.len()).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
    let mut checked = 0;
    for len in [g.len(), g.len() - 1, 7, 3, 0] {
        let mut got = g[..len].to_vec();
        silu_mul(&mut got, &u[..len], simd);
        for (i, o) in got.iter().enumerate() {
            let want = super::silu(g[i]) * u[i];
            if want.to_bits() != o.to_bits() && !(want.is_nan() && o.is_nan()) {
                return Err(format!("silu_mul g={:e} u={:e}: {o:e} vs {want:e}", g[i], u[i]));
            }
            checked += 1;
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    #[test]
    fn silu_mul_gives_the_scalar_bits() {
        let checked = super::check_silu_mul(true).unwrap();
        assert!(checked > 29_000, "{checked}");
    }
}
