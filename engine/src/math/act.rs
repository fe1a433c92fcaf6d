//! The gated feed-forward's activation ([`Activation`]: `silu(g) * u` and the clamped
//! kinds of gpt_oss and DeepSeek-V4) over whole rows, in SIMD lanes that run the scalar
//! [`super::exp`]'s steps one for one (the same IEEE operations in the same order, no FMA,
//! the same range checks): the same bits as the scalar loop on every path.
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

/// How a gated feed-forward combines its gate value g and up value u.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// silu(g) * u (every family but gpt_oss).
    Silu,
    /// gpt_oss (transformers' `GptOssExperts._apply_gate`): g clamped above at `limit`,
    /// u to [-limit, limit], then (u + 1) * (g * sigmoid(alpha * g)).
    ClampedSwiglu { alpha: f32, limit: f32 },
    /// deepseek_v4 (`swiglu_limit`): silu(min(g, limit)) * clamp(u, -limit, limit).
    SiluClamped { limit: f32 },
}

impl Activation {
    /// The reference, one value.
    #[inline]
    pub fn apply(self, g: f32, u: f32) -> f32 {
        match self {
            Activation::Silu => super::silu(g) * u,
            Activation::ClampedSwiglu { alpha, limit } => {
                let g = g.min(limit);
                let u = u.clamp(-limit, limit);
                (u + 1.0) * (g * super::sigmoid(g * alpha))
            }
            Activation::SiluClamped { limit } => super::silu(g.min(limit)) * u.clamp(-limit, limit),
        }
    }

    /// `g[i] = apply(g[i], u[i])` for i < min(len), bit for bit. `simd`: the caller's SIMD
    /// path is on (`qdot::Simd::active()` is not scalar): AVX2 where the CPU has it, NEON on
    /// aarch64, SIMD128 in a wasm build with it; false runs the scalar loop. The clamped
    /// kinds take the SIMD path for a finite positive limit (and finite alpha), where the
    /// lanes' min and max give `f32::min`'s and `clamp`'s results, NaN included.
    pub fn apply_rows(self, g: &mut [f32], u: &[f32], simd: bool) {
        let n = g.len().min(u.len());
        let (g, u) = (&mut g[..n], &u[..n]);
        let (kind, alpha, limit) = match self {
            Activation::Silu => (SILU, 0.0, 0.0),
            Activation::SiluClamped { limit } => (SILU_CLAMPED, 0.0, limit),
            Activation::ClampedSwiglu { alpha, limit } => (CLAMPED_SWIGLU, alpha, limit),
        };
        let lanes_ok = simd && (kind == SILU || (limit.is_finite() && limit > 0.0 && alpha.is_finite()));
        #[allow(unused_mut)]
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if lanes_ok && is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected.
            done = unsafe {
                match kind {
                    SILU => rows_avx2::<SILU>(g, u, alpha, limit),
                    SILU_CLAMPED => rows_avx2::<SILU_CLAMPED>(g, u, alpha, limit),
                    _ => rows_avx2::<CLAMPED_SWIGLU>(g, u, alpha, limit),
                }
            };
        }
        #[cfg(target_arch = "aarch64")]
        if lanes_ok {
            done = match kind {
                SILU => rows_neon::<SILU>(g, u, alpha, limit),
                SILU_CLAMPED => rows_neon::<SILU_CLAMPED>(g, u, alpha, limit),
                _ => rows_neon::<CLAMPED_SWIGLU>(g, u, alpha, limit),
            };
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        if lanes_ok {
            done = match kind {
                SILU => rows_simd128::<SILU>(g, u, alpha, limit),
                SILU_CLAMPED => rows_simd128::<SILU_CLAMPED>(g, u, alpha, limit),
                _ => rows_simd128::<CLAMPED_SWIGLU>(g, u, alpha, limit),
            };
        }
        let _ = (lanes_ok, alpha, limit);
        for (a, b) in g[done..].iter_mut().zip(&u[done..]) {
            *a = self.apply(*a, *b);
        }
    }
}

/// `v[i] = exp(v[i])` ([`super::exp`]) for every i, bit for bit; `simd` as for
/// [`Activation::apply_rows`] (the lanes are the activations' own [`super::exp`] steps).
/// The sampler's softmax over a vocabulary (50 thousand values a token) runs it.
pub fn exp_rows(v: &mut [f32], simd: bool) {
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if simd && is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        done = unsafe { exp_rows_avx2(v) };
    }
    #[cfg(target_arch = "aarch64")]
    if simd {
        done = exp_rows_neon(v);
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if simd {
        done = exp_rows_simd128(v);
    }
    let _ = simd;
    for x in &mut v[done..] {
        *x = super::exp(*x);
    }
}

/// The whole groups of eight of [`exp_rows`]; returns how many it did.
///
/// SAFETY (caller): AVX2 present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_rows_avx2(v: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let n = v.len() / 8 * 8;
    for c in v[..n].chunks_exact_mut(8) {
        // SAFETY: `c` holds eight f32; unaligned loads and stores.
        unsafe { _mm256_storeu_ps(c.as_mut_ptr(), exp8(_mm256_loadu_ps(c.as_ptr()))) };
    }
    n
}

/// The whole groups of four of [`exp_rows`] in NEON; returns how many it did.
#[cfg(target_arch = "aarch64")]
fn exp_rows_neon(v: &mut [f32]) -> usize {
    use std::arch::aarch64::*;
    let n = v.len() / 4 * 4;
    for c in v[..n].chunks_exact_mut(4) {
        // SAFETY: `c` holds four f32; NEON is part of aarch64.
        unsafe { vst1q_f32(c.as_mut_ptr(), exp4_neon(vld1q_f32(c.as_ptr()))) };
    }
    n
}

/// The whole groups of four of [`exp_rows`] in SIMD128; returns how many it did.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn exp_rows_simd128(v: &mut [f32]) -> usize {
    use std::arch::wasm32::*;
    let n = v.len() / 4 * 4;
    for c in v[..n].chunks_exact_mut(4) {
        // SAFETY: `c` holds four f32; unaligned loads and stores are allowed.
        unsafe { v128_store(c.as_mut_ptr() as *mut v128, exp4(v128_load(c.as_ptr() as *const v128))) };
    }
    n
}

/// [`Activation`] kinds as the lanes' const parameter.
const SILU: u8 = 0;
const SILU_CLAMPED: u8 = 1;
const CLAMPED_SWIGLU: u8 = 2;

/// The whole groups of eight of [`Activation::apply_rows`] on AVX2 (`K`: the kind);
/// returns how many it did. `_mm256_min_ps(a, b)` is `a < b ? a : b` (b where either is
/// NaN) and `_mm256_max_ps(a, b)` is `a > b ? a : b`: so `min(g, limit)` gives limit for a
/// NaN g as `f32::min` does, and `max(-limit, min(limit, u))` keeps a NaN u as `clamp` does.
///
/// SAFETY (caller): AVX2 present; `g.len() == u.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rows_avx2<const K: u8>(g: &mut [f32], u: &[f32], alpha: f32, limit: f32) -> usize {
    use std::arch::x86_64::*;
    let n = g.len() / 8 * 8;
    let (one, sign, lim, alpha) =
        (_mm256_set1_ps(1.0), _mm256_set1_ps(-0.0), _mm256_set1_ps(limit), _mm256_set1_ps(alpha));
    let mut i = 0;
    while i < n {
        // SAFETY: i + 8 <= n <= both lengths.
        unsafe {
            let (mut x, mut b) = (_mm256_loadu_ps(g.as_ptr().add(i)), _mm256_loadu_ps(u.as_ptr().add(i)));
            if K != SILU {
                x = _mm256_min_ps(x, lim);
                b = _mm256_max_ps(_mm256_xor_ps(lim, sign), _mm256_min_ps(lim, b));
            }
            let y = if K == CLAMPED_SWIGLU {
                // (u + 1) * (g * sigmoid(g * alpha)), sigmoid(t) = 1 / (1 + e^-t).
                let e = exp8(_mm256_xor_ps(_mm256_mul_ps(x, alpha), sign));
                let sig = _mm256_div_ps(one, _mm256_add_ps(one, e));
                _mm256_mul_ps(_mm256_add_ps(b, one), _mm256_mul_ps(x, sig))
            } else {
                // silu(g) * u, silu(t) = t / (1 + e^-t).
                _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_xor_ps(x, sign)))), b)
            };
            _mm256_storeu_ps(g.as_mut_ptr().add(i), y);
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

/// The whole groups of four of [`Activation::apply_rows`] in NEON (aarch64's baseline;
/// `K`: the kind); returns how many it did. `vminnmq_f32` returns the number where one
/// operand is NaN (`f32::min`'s limit for a NaN g); `vminq_f32`/`vmaxq_f32` keep a NaN u
/// (`clamp`'s).
#[cfg(target_arch = "aarch64")]
fn rows_neon<const K: u8>(g: &mut [f32], u: &[f32], alpha: f32, limit: f32) -> usize {
    use std::arch::aarch64::*;
    let n = g.len() / 4 * 4;
    let mut i = 0;
    while i < n {
        // SAFETY: i + 4 <= n <= both lengths; NEON is part of aarch64.
        unsafe {
            let (one, lim) = (vdupq_n_f32(1.0), vdupq_n_f32(limit));
            let (mut x, mut b) = (vld1q_f32(g.as_ptr().add(i)), vld1q_f32(u.as_ptr().add(i)));
            if K != SILU {
                x = vminnmq_f32(x, lim);
                b = vmaxq_f32(vminq_f32(b, lim), vnegq_f32(lim));
            }
            let y = if K == CLAMPED_SWIGLU {
                let e = exp4_neon(vnegq_f32(vmulq_f32(x, vdupq_n_f32(alpha))));
                let sig = vdivq_f32(one, vaddq_f32(one, e));
                vmulq_f32(vaddq_f32(b, one), vmulq_f32(x, sig))
            } else {
                vmulq_f32(vdivq_f32(x, vaddq_f32(one, exp4_neon(vnegq_f32(x)))), b)
            };
            vst1q_f32(g.as_mut_ptr().add(i), y);
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

/// The whole groups of four of [`Activation::apply_rows`] in SIMD128 (`K`: the kind);
/// returns how many it did. The clamps are compares and bit selects: `g < limit ? g :
/// limit` gives limit for a NaN g as `f32::min` does, and u is replaced only where `u >
/// limit` or `u < -limit`, so a NaN u stays as with `clamp`. (Not `f32x4_pmin`/`pmax`: in
/// the build with relaxed-simd a NaN u came out clamped, caught by kernelSelfCheck.)
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn rows_simd128<const K: u8>(g: &mut [f32], u: &[f32], alpha: f32, limit: f32) -> usize {
    use std::arch::wasm32::*;
    let n = g.len() / 4 * 4;
    let (one, lim) = (f32x4_splat(1.0), f32x4_splat(limit));
    let mut i = 0;
    while i < n {
        // SAFETY: i + 4 <= n <= both lengths; unaligned loads and stores are allowed.
        unsafe {
            let mut x = v128_load(g.as_ptr().add(i) as *const v128);
            let mut b = v128_load(u.as_ptr().add(i) as *const v128);
            if K != SILU {
                x = v128_bitselect(x, lim, f32x4_lt(x, lim));
                b = v128_bitselect(lim, b, f32x4_gt(b, lim));
                b = v128_bitselect(f32x4_neg(lim), b, f32x4_lt(b, f32x4_neg(lim)));
            }
            let y = if K == CLAMPED_SWIGLU {
                let e = exp4(f32x4_neg(f32x4_mul(x, f32x4_splat(alpha))));
                let sig = f32x4_div(one, f32x4_add(one, e));
                f32x4_mul(f32x4_add(b, one), f32x4_mul(x, sig))
            } else {
                f32x4_mul(f32x4_div(x, f32x4_add(one, exp4(f32x4_neg(x)))), b)
            };
            v128_store(g.as_mut_ptr().add(i) as *mut v128, y);
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

/// Checks [`Activation::apply_rows`] (with `simd`: whatever path this build and CPU take)
/// for every kind against [`Activation::apply`], bit for bit: a sweep over the exponent's
/// whole range (both bounds, k = 128, subnormal results), values at and around the clamp
/// limits, special values (NaN, infinities, signed zeros), and lengths with tails, and
/// [`exp_rows`] against [`super::exp`] over the same values. Returns
/// how many values agreed. The native tests run it, and `qdot::check::check_paths` runs it
/// where the browser builds call it (`kernelSelfCheck`).
pub fn check_activations(simd: bool) -> Result<usize, String> {
    let mut g: Vec<f32> = Vec::new();
    let mut x = -100.0f32;
    while x < 100.0 {
        g.push(x);
        x += 0.01371;
    }
    for b in [88.722_83f32, -87.336_54, 88.7, 88.72, -87.3, -88.72, 89.0, -89.0, 7.0, 10.0, 51.4, 51.3] {
        for d in -4i32..=4 {
            let v = f32::from_bits((b.to_bits() as i32 + d) as u32);
            g.extend([v, -v]);
        }
    }
    g.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, 1e-40, -1e-40, f32::MAX, f32::MIN]);
    g.extend([f32::MIN_POSITIVE, 1e-7, -1e-7, 0.5, -0.5, 127.5, -126.5, 1e30, -1e30]);
    // u: ordinary values, with g's sweep and specials mixed in (the clamps act on u too).
    let u: Vec<f32> = (0..g.len())
        .map(|i| if i % 3 == 0 { g[(i * 7) % g.len()] } else { ((i * 7919) % 2001) as f32 / 1000.0 - 1.0 })
        .collect();
    let kinds = [
        Activation::Silu,
        Activation::SiluClamped { limit: 10.0 },
        Activation::ClampedSwiglu { alpha: 1.702, limit: 7.0 },
        Activation::ClampedSwiglu { alpha: f32::NAN, limit: 7.0 },
        Activation::SiluClamped { limit: f32::INFINITY },
    ];
    let mut checked = 0;
    for act in kinds {
        for len in [g.len(), g.len() - 1, 7, 3, 0] {
            let mut got = g[..len].to_vec();
            act.apply_rows(&mut got, &u[..len], simd);
            for (i, o) in got.iter().enumerate() {
                let want = act.apply(g[i], u[i]);
                if want.to_bits() != o.to_bits() && !(want.is_nan() && o.is_nan()) {
                    return Err(format!("{act:?} g={:e} u={:e}: {o:e} vs {want:e}", g[i], u[i]));
                }
                checked += 1;
            }
        }
    }
    // The sampler's exponentials (`exp_rows`) over the same sweep, with tails.
    for len in [g.len(), g.len() - 1, 7, 3, 0] {
        let mut got = g[..len].to_vec();
        exp_rows(&mut got, simd);
        for (o, &x) in got.iter().zip(&g) {
            let want = super::exp(x);
            if want.to_bits() != o.to_bits() && !(want.is_nan() && o.is_nan()) {
                return Err(format!("exp_rows x={x:e}: {o:e} vs {want:e}"));
            }
            checked += 1;
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_activation_gives_the_scalar_bits() {
        let checked = super::check_activations(true).unwrap();
        assert!(checked > 5 * 29_000, "{checked}");
    }
}
