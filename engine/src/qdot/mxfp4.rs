//! MXFP4 weight rows (tensor.rs: e2m1 nibbles with one e8m0 scale per 32 values) times f32
//! activations, with an integer inner loop that is exact.
//!
//! Doubled, the e2m1 values are the integers -12..=12 ([`MXFP4_DOUBLED`]) and a scale is a
//! power of two, so for block b of a row (scale byte s_b) and an activation row x:
//! - x is quantized once per matrix call to two int16 parts per block of 32
//!   ([`ActQ16::quantize`]): amax = max |x_i|, d_b = amax / 32767,
//!   h_i = clamp(round_ties_even(x_i * (32767 / amax)), -32767, 32767), then the remainder
//!   l_i = clamp(round_ties_even((x_i - h_i * d_b) * (65536 / d_b)), -32767, 32767), so
//!   x_i ~ d_b * (h_i + l_i / 65536) to about 2^-31 of amax: f32 precision, where int8
//!   activations (the int4/int8 kernels' 1/254 of amax) or int16 alone (measured: 4.9e-4 of
//!   the logits' spread on the gpt_oss_mxfp4 fixture, against 1.6e-5 for the f32 product)
//!   would move the logits of a sensitive model visibly;
//! - hsum_b = sum k_i * h_i and lsum_b = sum k_i * l_i in i32, exact in any order and SIMD
//!   width (each |sum| <= 12 * 32767 * 32 < 2^24, so its f32 is exact too);
//! - y = reduce8(acc) with acc[b mod 8] += (e8m0_half(s_b) * d_b) * (f32(hsum_b) +
//!   f32(lsum_b) * 2^-16), blocks in increasing order, every operation rounded on its own
//!   (no FMA).
//!
//! [`dot_row_scalar`] is the reference; the x86 AVX2 and wasm SIMD128 paths only change how
//! the integer sums are formed, so they give its bits by construction.

use crate::math::reduce8;
use crate::tensor::{e8m0_half, MXFP4_BLOCK, MXFP4_DOUBLED};

use super::Simd;

/// Largest quantized activation magnitude.
const QMAX: f32 = 32767.0;

/// As in the int8 kernels: blocks whose max |x| is below 2^-64 count as zero.
const TINY_BITS: u32 = 0x1f80_0000;

/// Activations of `n` positions quantized to int16 per block of 32.
#[derive(Clone, Debug, Default)]
pub struct ActQ16 {
    pub n: usize,
    pub cols: usize,
    pub blocks: usize,
    /// [n, cols] the parts h: within each block, its 16 even-indexed values, then its 16
    /// odd-indexed ones (the order of the low and high nibbles of the block's 16 bytes).
    pub q: Vec<i16>,
    /// [n, cols] the remainders l, in the same order.
    pub lo: Vec<i16>,
    /// [n, blocks] block scales d_b (NaN where the block holds NaN or an infinity).
    pub d: Vec<f32>,
}

impl ActQ16 {
    /// Quantizes `x` ([n, cols], cols a multiple of 32), reusing the buffers.
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize) {
        let blocks = cols / MXFP4_BLOCK;
        self.n = n;
        self.cols = cols;
        self.blocks = blocks;
        self.q.clear();
        self.q.resize(n * cols, 0);
        self.lo.clear();
        self.lo.resize(n * cols, 0);
        self.d.clear();
        self.d.resize(n * blocks, 0.0);
        for p in 0..n {
            for b in 0..blocks {
                let at = p * cols + b * MXFP4_BLOCK;
                let src = &x[at..at + MXFP4_BLOCK];
                let (h, l) = (&mut self.q[at..at + MXFP4_BLOCK], &mut self.lo[at..at + MXFP4_BLOCK]);
                self.d[p * blocks + b] = quantize_block(src, h, l);
            }
        }
    }
}

/// Quantizes one block of 32 into `hi` and `lo` in the even-then-odd order; returns d_b.
fn quantize_block(x: &[f32], hi: &mut [i16], lo: &mut [i16]) -> f32 {
    hi.iter_mut().for_each(|v| *v = 0);
    lo.iter_mut().for_each(|v| *v = 0);
    let amax_bits = x.iter().map(|v| v.to_bits() & 0x7fff_ffff).max().unwrap_or(0);
    if amax_bits >= 0x7f80_0000 {
        return f32::NAN;
    }
    if amax_bits < TINY_BITS {
        return 0.0;
    }
    let amax = f32::from_bits(amax_bits);
    let (inv, d) = (QMAX / amax, amax / QMAX);
    let inv_lo = 65536.0 / d;
    // Round half to even by adding and subtracting 1.5 * 2^23 (|y| < 2^22 here).
    const MAGIC: f32 = 12_582_912.0;
    for (i, &v) in x.iter().enumerate() {
        let h = ((v * inv + MAGIC) - MAGIC).clamp(-QMAX, QMAX);
        let l = (((v - h * d) * inv_lo + MAGIC) - MAGIC).clamp(-QMAX, QMAX);
        let at = (i >> 1) + (i & 1) * 16;
        hi[at] = h as i16;
        lo[at] = l as i16;
    }
    d
}

/// Adds block b's term to the accumulators (the one float step every path shares).
#[inline]
fn combine(acc: &mut [f32; 8], b: usize, scale: u8, d: f32, hsum: i32, lsum: i32) {
    const LO: f32 = 1.0 / 65536.0;
    acc[b % 8] += (e8m0_half(scale) * d) * (hsum as f32 + lsum as f32 * LO);
}

/// The reference: one stored MXFP4 row (`DType::Mxfp4.row_bytes(cols)` bytes) times
/// position `p` of `a`, in the documented order.
pub fn dot_row_scalar(row: &[u8], a: &ActQ16, p: usize) -> f32 {
    let nb = a.blocks;
    let (scales, vals) = row.split_at(nb.div_ceil(4) * 4);
    let (q, lo) = (&a.q[p * a.cols..(p + 1) * a.cols], &a.lo[p * a.cols..(p + 1) * a.cols]);
    let d = &a.d[p * nb..(p + 1) * nb];
    let mut acc = [0.0f32; 8];
    for b in 0..nb {
        let bytes = &vals[b * 16..(b + 1) * 16];
        let (qb, lb) = (&q[b * MXFP4_BLOCK..(b + 1) * MXFP4_BLOCK], &lo[b * MXFP4_BLOCK..(b + 1) * MXFP4_BLOCK]);
        let (mut hsum, mut lsum) = (0i32, 0i32);
        for (j, &byte) in bytes.iter().enumerate() {
            let (k0, k1) = (MXFP4_DOUBLED[(byte & 15) as usize] as i32, MXFP4_DOUBLED[(byte >> 4) as usize] as i32);
            hsum += k0 * qb[j] as i32 + k1 * qb[16 + j] as i32;
            lsum += k0 * lb[j] as i32 + k1 * lb[16 + j] as i32;
        }
        combine(&mut acc, b, scales[b], d[b], hsum, lsum);
    }
    reduce8(acc)
}

/// One row times one position with the chosen path (the same bits on every path).
#[inline]
pub fn dot_row(simd: Simd, row: &[u8], a: &ActQ16, p: usize) -> f32 {
    match simd {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Simd::Avx2/Avx512 come from Simd::available() after the CPU reported AVX2
        // (AVX-512 machines have it too); row and activations have the shapes of the caller's
        // matrix (row.len() == row_bytes(cols), `a` quantized for these cols).
        Simd::Avx2 | Simd::Avx512 => unsafe { dot_row_avx2(row, a, p) },
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Simd::Simd128 => dot_row_simd128(row, a, p),
        _ => dot_row_scalar(row, a, p),
    }
}

/// AVX2: per block, the 16 bytes' low and high nibbles become i8 weights through a
/// 16-entry table (pshufb), are widened to i16 and multiplied with the even and odd
/// activations by `vpmaddwd`. Blocks go eight at a time: their eight i32 lane vectors are
/// summed exactly into one vector (lane j = block j, [`hsum8x8`]) and combined in vector
/// lanes, lane l being acc[b mod 8] with the reference's operations in its order (the
/// scale 2^(e - 128) built from its bits as [`e8m0_half`] does); the last blocks of a row
/// (fewer than eight) take the reference's per-block step. No closures: a closure would be
/// compiled without this function's target features and call its intrinsics out of line.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_row_avx2(row: &[u8], a: &ActQ16, p: usize) -> f32 {
    use std::arch::x86_64::*;
    let nb = a.blocks;
    let (scales, vals) = row.split_at(nb.div_ceil(4) * 4);
    let (q, lo) = (&a.q[p * a.cols..(p + 1) * a.cols], &a.lo[p * a.cols..(p + 1) * a.cols]);
    let d = &a.d[p * nb..(p + 1) * nb];
    assert!(vals.len() >= nb * 16 && q.len() >= nb * MXFP4_BLOCK && lo.len() >= nb * MXFP4_BLOCK && scales.len() >= nb);
    let lut = _mm_loadu_si128(MXFP4_DOUBLED.as_ptr() as *const __m128i);
    let low = _mm_set1_epi8(15);
    let mut accv = _mm256_setzero_ps();
    let runs = nb / 8;
    for r in 0..runs {
        let (mut hv, mut lv) = ([_mm256_setzero_si256(); 8], [_mm256_setzero_si256(); 8]);
        for j in 0..8 {
            let b = r * 8 + j;
            // SAFETY: block b < nb: its 16 bytes and 32 + 32 values are in bounds (asserted).
            let (hs, ls) = unsafe {
                block_sums(lut, low, vals.as_ptr().add(b * 16), q.as_ptr().add(b * 32), lo.as_ptr().add(b * 32))
            };
            hv[j] = hs;
            lv[j] = ls;
        }
        // SAFETY: 8 scale bytes and 8 d values from block 8r are in bounds (8r + 8 <= nb).
        let (e, dv) = unsafe {
            (
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(scales.as_ptr().add(r * 8) as *const __m128i)),
                _mm256_loadu_ps(d.as_ptr().add(r * 8)),
            )
        };
        // e8m0_half: e < 2 gives 0x0020_0000 << e (a subnormal), else (e - 1) << 23.
        let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
        let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
        let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
        let sc = _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small));
        let sum = _mm256_add_ps(
            _mm256_cvtepi32_ps(hsum8x8(&hv)),
            _mm256_mul_ps(_mm256_cvtepi32_ps(hsum8x8(&lv)), _mm256_set1_ps(1.0 / 65536.0)),
        );
        accv = _mm256_add_ps(accv, _mm256_mul_ps(_mm256_mul_ps(sc, dv), sum));
    }
    let mut acc = [0.0f32; 8];
    // SAFETY: acc holds eight floats.
    unsafe { _mm256_storeu_ps(acc.as_mut_ptr(), accv) };
    for b in runs * 8..nb {
        // SAFETY: as above, block b < nb.
        let (hs, ls) =
            unsafe { block_sums(lut, low, vals.as_ptr().add(b * 16), q.as_ptr().add(b * 32), lo.as_ptr().add(b * 32)) };
        combine(&mut acc, b, scales[b], d[b], hsum8(hs), hsum8(ls));
    }
    reduce8(acc)
}

/// The eight-lane partial sums (exact i32) of one block's weights times its h and l parts.
///
/// SAFETY (caller): AVX2; 16 bytes at `w`, 32 values at `h` and at `l`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block_sums(
    lut: std::arch::x86_64::__m128i,
    low: std::arch::x86_64::__m128i,
    w: *const u8,
    h: *const i16,
    l: *const i16,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        let bytes = _mm_loadu_si128(w as *const __m128i);
        let (he, ho) = (_mm256_loadu_si256(h as *const __m256i), _mm256_loadu_si256(h.add(16) as *const __m256i));
        let (le, lo_) = (_mm256_loadu_si256(l as *const __m256i), _mm256_loadu_si256(l.add(16) as *const __m256i));
        let we = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(lut, _mm_and_si128(bytes, low)));
        let wo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(bytes, 4), low)));
        let hs = _mm256_add_epi32(_mm256_madd_epi16(we, he), _mm256_madd_epi16(wo, ho));
        let ls = _mm256_add_epi32(_mm256_madd_epi16(we, le), _mm256_madd_epi16(wo, lo_));
        (hs, ls)
    }
}

/// Lane j = the sum of v[j]'s eight lanes (exact).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn hsum8x8(v: &[std::arch::x86_64::__m256i; 8]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: register-only AVX2 operations, reached from the target_feature function.
    unsafe {
        let t0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        let t1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
        _mm256_add_epi32(_mm256_permute2x128_si256(t0, t1, 0x20), _mm256_permute2x128_si256(t0, t1, 0x31))
    }
}

/// The sum of eight i32 lanes (exact).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn hsum8(s: std::arch::x86_64::__m256i) -> i32 {
    use std::arch::x86_64::*;
    let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1));
    _mm_cvtsi128_si32(s1)
}

/// wasm SIMD128: the same integer sums with `i8x16.swizzle` as the table and
/// `i32x4.dot_i16x8_s`.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn dot_row_simd128(row: &[u8], a: &ActQ16, p: usize) -> f32 {
    use std::arch::wasm32::*;
    let nb = a.blocks;
    let (scales, vals) = row.split_at(nb.div_ceil(4) * 4);
    let (q, lo) = (&a.q[p * a.cols..(p + 1) * a.cols], &a.lo[p * a.cols..(p + 1) * a.cols]);
    let d = &a.d[p * nb..(p + 1) * nb];
    assert!(vals.len() >= nb * 16 && q.len() >= nb * MXFP4_BLOCK && lo.len() >= nb * MXFP4_BLOCK && scales.len() >= nb);
    // SAFETY: 16 readable bytes (the table is [i8; 16]); unaligned v128 loads are allowed.
    let lut = unsafe { v128_load(MXFP4_DOUBLED.as_ptr() as *const v128) };
    let low = u8x16_splat(15);
    let mut acc = [0.0f32; 8];
    for b in 0..nb {
        // SAFETY: in bounds as asserted above; wasm loads need no alignment.
        let (bytes, hv, lv) = unsafe {
            let (hp, lp) =
                (q.as_ptr().add(b * MXFP4_BLOCK) as *const v128, lo.as_ptr().add(b * MXFP4_BLOCK) as *const v128);
            (
                v128_load(vals.as_ptr().add(b * 16) as *const v128),
                [v128_load(hp), v128_load(hp.add(1)), v128_load(hp.add(2)), v128_load(hp.add(3))],
                [v128_load(lp), v128_load(lp.add(1)), v128_load(lp.add(2)), v128_load(lp.add(3))],
            )
        };
        let we = i8x16_swizzle(lut, v128_and(bytes, low));
        let wo = i8x16_swizzle(lut, u8x16_shr(bytes, 4));
        let w = [
            i16x8_extend_low_i8x16(we),
            i16x8_extend_high_i8x16(we),
            i16x8_extend_low_i8x16(wo),
            i16x8_extend_high_i8x16(wo),
        ];
        let sum = |v: &[v128; 4]| {
            let s = i32x4_add(
                i32x4_add(i32x4_dot_i16x8(w[0], v[0]), i32x4_dot_i16x8(w[1], v[1])),
                i32x4_add(i32x4_dot_i16x8(w[2], v[2]), i32x4_dot_i16x8(w[3], v[3])),
            );
            i32x4_extract_lane::<0>(s)
                + i32x4_extract_lane::<1>(s)
                + i32x4_extract_lane::<2>(s)
                + i32x4_extract_lane::<3>(s)
        };
        combine(&mut acc, b, scales[b], d[b], sum(&hv), sum(&lv));
    }
    reduce8(acc)
}

#[cfg(test)]
mod tests {
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
}
