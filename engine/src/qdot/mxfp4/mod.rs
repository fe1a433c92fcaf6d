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
//! [`dot_row_scalar`] is the reference; the x86 paths (`x86`: AVX2, AVX-512 VNNI) and the
//! wasm SIMD128 path only change how the integer sums are formed, so they give its bits by
//! construction. The x86 paths read the activations as byte planes ([`ActQ16::planes`]):
//! h = 256 * hh + hl with hh = h >> 8 (signed byte) and hl = h & 255 (unsigned byte), the
//! same for l, so that one byte multiply-add (`vpdpbusd`, or `vpmaddubsw`) takes 32 weights.

use crate::math::reduce8;
use crate::tensor::{e8m0_half, MXFP4_BLOCK, MXFP4_DOUBLED};

use super::Simd;

#[cfg(target_arch = "x86_64")]
mod x86;

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
    /// x86-64 only (empty elsewhere): [n, dstride * 128] bytes, `q` and `lo` as byte planes
    /// for the x86 kernels, h = 256 * hh + hl with hh = h >> 8 a signed byte and hl = h & 255
    /// unsigned (l likewise). Per run of eight blocks, 1024 bytes: for c in 0..2, eight
    /// 64-byte vectors hh_even, hh_odd, hl_even, hl_odd, lh_even, lh_odd, ll_even, ll_odd;
    /// 32-bit word j of vector c holds, for block b with [`LANE`]`[b]` = j % 8 and
    /// k = 2c + j / 8, the block's even (odd) values 4k..4k + 4: the values whose nibbles
    /// are word k of the block's 16 stored bytes. Zero past the last block.
    pub planes: Vec<u8>,
    /// x86-64 only: [n, dstride * 2] per run of eight blocks, 12 * sum h of each of its
    /// blocks, then 12 * sum l of each, block j at [`LANE`]`[j]` (the kernels read the
    /// weights as k + 12, `x86`).
    pub corr: Vec<i32>,
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
                self.d[p * blocks + b] = quantize_block_fast(src, h, l);
            }
        }
        self.planes.clear();
        self.corr.clear();
        if cfg!(target_arch = "x86_64") {
            self.build_planes();
        }
    }

    /// Entries per position of `corr` / 2 and blocks per position of `planes` / 128: the
    /// blocks rounded up to a run of eight.
    pub fn dstride(&self) -> usize {
        self.blocks.div_ceil(8) * 8
    }

    /// Whether [`ActQ16::planes`] and [`ActQ16::corr`] are built for these shapes.
    pub fn has_planes(&self) -> bool {
        let ds = self.dstride();
        self.planes.len() == self.n * ds * 128 && self.corr.len() == self.n * ds * 2
    }

    /// Fills [`ActQ16::planes`] and [`ActQ16::corr`] from `q` and `lo`.
    fn build_planes(&mut self) {
        let (n, cols, nb, ds) = (self.n, self.cols, self.blocks, self.dstride());
        self.planes.resize(n * ds * 128, 0);
        self.corr.resize(n * ds * 2, 0);
        for p in 0..n {
            let planes = &mut self.planes[p * ds * 128..(p + 1) * ds * 128];
            let corr = &mut self.corr[p * ds * 2..(p + 1) * ds * 2];
            for b in 0..nb {
                let at = p * cols + b * MXFP4_BLOCK;
                let run = &mut planes[(b / 8) * 1024..(b / 8 + 1) * 1024];
                let lane = LANE[b % 8];
                for (part, src) in [(0usize, &self.q[at..at + MXFP4_BLOCK]), (1, &self.lo[at..at + MXFP4_BLOCK])] {
                    // Values 0..16 are the block's even ones, 16..32 its odd ones; word k
                    // of the block's 16 stored bytes holds even (odd) values 4k..4k + 4.
                    for (eo, half) in src.chunks_exact(16).enumerate() {
                        for (k, four) in half.chunks_exact(4).enumerate() {
                            let at = (k / 2) * 512 + (k % 2) * 32 + lane * 4;
                            let (hh, hl) = (at + (part * 4 + eo) * 64, at + (part * 4 + 2 + eo) * 64);
                            for (i, &v) in four.iter().enumerate() {
                                run[hh + i] = (v >> 8) as u8;
                                run[hl + i] = v as u8;
                            }
                        }
                    }
                    // |sum| <= 12 * 32 * 32767 < 2^24.
                    let sum: i32 = src.iter().map(|&v| v as i32).sum();
                    corr[(b / 8) * 16 + part * 8 + lane] = 12 * sum;
                }
            }
        }
    }
}

/// The lane of block j of a run of eight in the x86 kernels' sums, planes and corrections:
/// the order in which a 4x4 transpose of 32-bit words leaves the blocks of four 32-byte
/// loads (two blocks each) (`x86`).
pub const LANE: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// [`quantize_block`] on the active SIMD path (x86: AVX2; the same bits).
#[inline]
fn quantize_block_fast(x: &[f32], hi: &mut [i16], lo: &mut [i16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if matches!(Simd::active(), Simd::Avx2 | Simd::Avx512) {
        // SAFETY: Simd::Avx2/Avx512 come from Simd::available() after the CPU reported AVX2.
        return unsafe { x86::quantize_block_avx2(x, hi, lo) };
    }
    quantize_block(x, hi, lo)
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
    let (hi, lo) = (&mut hi[..MXFP4_BLOCK], &mut lo[..MXFP4_BLOCK]);
    for (i, &v) in x[..MXFP4_BLOCK].iter().enumerate() {
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
        Simd::Avx2 if a.has_planes() => unsafe { x86::dot_row_avx2(row, a, p) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above; Simd::Avx512 means AVX-512 F/VL/BW/VNNI were reported (and VBMI
        // is checked).
        Simd::Avx512 if a.has_planes() => unsafe {
            if x86::has_vbmi() {
                x86::dot_row_avx512_vbmi(row, a, p)
            } else {
                x86::dot_row_avx512(row, a, p)
            }
        },
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Simd::Simd128 => dot_row_simd128(row, a, p),
        _ => dot_row_scalar(row, a, p),
    }
}

/// [`dot_row`] for consecutive stored rows of `rb` bytes each (`rows` holds `out.len()` of
/// them) times position 0 of `a`, into `out`: the same bits, the row loop inside the SIMD
/// function (one call and one set-up per slice of rows instead of per row).
pub fn dot_rows(simd: Simd, rows: &[u8], rb: usize, a: &ActQ16, out: &mut [f32]) {
    // wasm: the same rows, in two streams with pages touched ahead (it has no prefetch).
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if simd == Simd::Simd128 {
        return crate::qdot::wasm::each_row(rows, rb, out, |row| dot_row_simd128(row, a, 0));
    }
    if rows.len() >= out.len() * rb && a.has_planes() && a.n > 0 {
        match simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in dot_row, for each of the rows (`rows` holds all of them).
            Simd::Avx2 => return unsafe { x86::dot_rows_avx2(rows, rb, a, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above (VBMI: reported by the CPU).
            Simd::Avx512 => unsafe {
                if x86::has_vbmi() {
                    x86::dot_rows_avx512_vbmi(rows, rb, a, out)
                } else {
                    x86::dot_rows_avx512(rows, rb, a, out)
                }
                return;
            },
            _ => {}
        }
    }
    for (o, row) in out.iter_mut().zip(rows.chunks(rb.max(1))) {
        *o = dot_row(simd, row, a, 0);
    }
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
mod tests;
