//! What the NEON and wasm SIMD128 FP8 kernels ([`super::fp8_neon`], [`super::fp8_wasm`])
//! share: their decode (below), the scales it takes, and the loop that gives them four rows
//! at a time.
//!
//! The decode, four bytes per vector, with integers and one product: each byte
//! sign-extended to its 32-bit lane (`s...s eeee mmm`), shifted left by 20 and masked with
//! [`BITS`] to `s 0000 eeee mmm 0...0`, is the f32 whose value is the e4m3 value times
//! 2^-120 exactly (a normal e4m3 `2^(e-7) (1 + m/8)` gets the f32 exponent field `e`; a
//! subnormal `m 2^-9` becomes the f32 subnormal `m 2^-129`). Its product with `scale *
//! 2^120` ([`TWO_120`]; exact, since rows reach the kernels only with |scale| < 2^7 or a
//! scale that is not finite: [`scales_ok`]) is the real product `E4M3[byte] * scale`
//! rounded once: the reference's bits. A subnormal code is an f32 subnormal operand, which
//! some CPUs multiply slowly (Intel's microcode assist, about 100 cycles); a release's
//! blocks (scale = the block's largest magnitude / 448) hold one such code in 3,000 to
//! 10,000 bytes, uniformly random bytes one in 18 (docs/kernels.md "FP8 weights"). The NaN
//! bytes (0x7f, 0xff) would read as ±480 times the scale: a row holding one is NaN
//! whatever the activations (NaN times anything is NaN), so the kernels test their rows'
//! bytes first and give NaN for such a row.

use crate::tensor::Mat;

/// The bits kept of a sign-extended byte shifted left by 20: the sign, then the byte's
/// seven magnitude bits as exponent field and mantissa top.
pub const BITS: u32 = 0x87f0_0000;

/// 2^120, by which the scales are multiplied.
pub const TWO_120: f32 = f32::from_bits((127 + 120) << 23);

/// Largest |scale| whose product with [`TWO_120`] is finite, with margin.
const SCALE_MAX: f32 = 128.0;

/// Whether [`rows`] takes a matrix of `block`-column scale blocks (one scale per vector of
/// eight).
pub fn takes(block: usize) -> bool {
    block > 0 && block.is_multiple_of(8)
}

/// Whether every scale of the stored row `row` (`nb` of them first) is below [`SCALE_MAX`]
/// or not finite (an infinite or NaN scale gives the reference's products either way).
fn scales_ok(row: &[u8], nb: usize) -> bool {
    row[..4 * nb].chunks_exact(4).all(|c| {
        let s = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        s.abs() < SCALE_MAX || !s.is_finite()
    })
}

/// A kernel of four stored rows (scales, then bytes) and one position: `dot4(rows, x, cols,
/// block)`.
pub type Dot4 = unsafe fn([*const u8; 4], *const f32, usize, usize) -> [f32; 4];

/// Rows `r0..r1` of the FP8 matrix `w` (scale blocks of `block` columns, [`takes`]) times
/// one position `x`, into `out[r0..r1]`: fours through `dot4`, the rest (and fours with a
/// scale [`scales_ok`] refuses) decoded and applied with [`crate::math::dot`] (the same
/// bits).
///
/// SAFETY (caller): `dot4` reads its four rows' `cols` values and `x`'s `cols` f32 and
/// nothing else.
pub unsafe fn rows(w: &Mat, block: usize, x: &[f32], r0: usize, r1: usize, out: &mut [f32], dot4: Dot4) {
    let (cols, rb) = (w.cols, w.row_bytes());
    let bytes = w.bytes.as_ref();
    let whole = bytes.len() >= r1 * rb && x.len() >= cols && out.len() >= r1 - r0;
    let nb = cols.div_ceil(block);
    let mut buf = vec![0.0f32; cols];
    let mut plain = |k: usize, out: &mut [f32]| {
        w.row_into(k, &mut buf);
        out[k - r0] = crate::math::dot(&buf, &x[..cols]);
    };
    let mut r = r0;
    while whole && r + 4 <= r1 {
        if (r..r + 4).all(|k| scales_ok(&bytes[k * rb..], nb)) {
            let row = |k: usize| bytes[k * rb..].as_ptr();
            // SAFETY: rows r..r+4 < r1 lie inside `bytes` (rb each), x holds cols values.
            let v = unsafe { dot4([row(r), row(r + 1), row(r + 2), row(r + 3)], x.as_ptr(), cols, block) };
            out[r - r0..r - r0 + 4].copy_from_slice(&v);
        } else {
            (r..r + 4).for_each(|k| plain(k, out));
        }
        r += 4;
    }
    (r..r1).for_each(|k| plain(k, out));
}
