//! ggml's grid-coded types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: the
//! "i-quants" of 1.6 to 3.4 bits per value that the smallest files of the largest models
//! use), decoded to f32 with ggml-quants.c's arithmetic (`dequantize_row_iq*`; every product
//! rounded on its own, in the same order), so the values are bit for bit llama.cpp's and
//! gguf-py's (checked on tests/fixtures/gguf/dequant.json, whose blocks meet every grid
//! entry).
//!
//! Each block of 256 values is groups of 8 (IQ3: 4) values, each group an index into a
//! fixed codebook of small integers, with signs (IQ2/IQ3: a sign bit per value, or a 7-bit
//! index of an 8-bit pattern of even parity) or an offset (IQ1: +-1/8), and a scale per 16
//! or 32 values. The codebooks are format constants, not computable: `iq_grids.bin` holds
//! them one signed byte per element, as gguf-py unpacks them
//! (`tools/make_gguf_fixtures.py --mix-only` writes it).

use half::f16;

// ggml's type ids of the grid-coded types (gguf_quant re-exports them).
pub const IQ2_XXS: u32 = 16;
pub const IQ2_XS: u32 = 17;
pub const IQ3_XXS: u32 = 18;
pub const IQ1_S: u32 = 19;
pub const IQ3_S: u32 = 21;
pub const IQ2_S: u32 = 22;
pub const IQ1_M: u32 = 29;

/// The codebooks, in this order: iq2xxs (256 x 8), iq2xs (512 x 8), iq2s (1024 x 8),
/// iq3xxs (256 x 4), iq3s (512 x 4), iq1s (2048 x 8; IQ1_M's too).
const GRIDS: &[u8; 33792] = include_bytes!("iq_grids.bin");
const IQ2XXS: usize = 0;
const IQ2XS: usize = IQ2XXS + 256 * 8;
const IQ2S: usize = IQ2XS + 512 * 8;
const IQ3XXS: usize = IQ2S + 1024 * 8;
const IQ3S: usize = IQ3XXS + 256 * 4;
const IQ1S: usize = IQ3S + 512 * 4;

/// Element `j` of entry `i` of the codebook at `at` whose entries have `m` elements.
#[inline]
fn grid(at: usize, m: usize, i: usize, j: usize) -> f32 {
    GRIDS[at + m * i + j] as i8 as f32
}

/// The 8-bit sign pattern of 7-bit index `i` (ksigns_iq2xs): bit 7 makes the parity even.
#[inline]
fn ksigns(i: u32) -> u32 {
    let i = i & 127;
    i | (i.count_ones() & 1) << 7
}

/// +1 or -1 by bit `j` of `signs` (set: negative).
#[inline]
fn sign(signs: u32, j: usize) -> f32 {
    if (signs >> j) & 1 == 1 {
        -1.0
    } else {
        1.0
    }
}

#[inline]
fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

#[inline]
fn u16_at(b: &[u8], at: usize) -> u32 {
    u16::from_le_bytes([b[at], b[at + 1]]) as u32
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// `0.5 + s` quarter-steps (IQ2) or half-steps (IQ3_XXS) of `d`: d * (0.5 + s) * f.
#[inline]
fn half_scale(d: f32, s: u32, f: f32) -> f32 {
    d * (0.5 + s as f32) * f
}

/// Decodes one block of grid-coded type `ty` (256 values) into `y`; other types are left.
pub(super) fn block(b: &[u8], ty: u32, y: &mut [f32]) {
    match ty {
        IQ2_XXS => {
            // d, then per 32 values two u32: four grid indices, and four 7-bit sign indices
            // with the 4-bit scale on top.
            let d = h(b, 0);
            for k in 0..8 {
                let (idx, aux) = (&b[2 + 8 * k..6 + 8 * k], u32_at(b, 6 + 8 * k));
                let db = half_scale(d, aux >> 28, 0.25);
                for l in 0..4 {
                    let s = ksigns(aux >> (7 * l));
                    for j in 0..8 {
                        y[32 * k + 8 * l + j] = db * grid(IQ2XXS, 8, idx[l] as usize, j) * sign(s, j);
                    }
                }
            }
        }
        IQ2_XS | IQ2_S => {
            // IQ2_XS: d, 32 u16 (9-bit index, 7-bit sign index), scales[8]. IQ2_S: d, qs[32]
            // (index low bits), signs[32] (a bit per value), qh[8] (2 high index bits per
            // group), scales[8]. A 4-bit scale per 16 values.
            let d = h(b, 0);
            let xs = ty == IQ2_XS;
            let scales = if xs { &b[66..74] } else { &b[74..82] };
            for g in 0..32 {
                let sc = (scales[g / 4] >> (4 * ((g / 2) % 2))) & 15;
                let db = half_scale(d, sc as u32, 0.25);
                let (at, i, s) = if xs {
                    let v = u16_at(b, 2 + 2 * g);
                    (IQ2XS, (v & 511) as usize, ksigns(v >> 9))
                } else {
                    let hi = (b[66 + g / 4] >> (2 * (g % 4))) & 3;
                    (IQ2S, b[2 + g] as usize | (hi as usize) << 8, b[34 + g] as u32)
                };
                for j in 0..8 {
                    y[8 * g + j] = db * grid(at, 8, i, j) * sign(s, j);
                }
            }
        }
        IQ3_XXS => {
            // d, qs[64] (an index per 4 values), then per 32 values a u32: four 7-bit sign
            // indices (one per 8 values) and the 4-bit scale on top.
            let d = h(b, 0);
            for k in 0..8 {
                let aux = u32_at(b, 66 + 4 * k);
                let db = half_scale(d, aux >> 28, 0.5);
                for l in 0..4 {
                    let s = ksigns(aux >> (7 * l));
                    for j in 0..8 {
                        let i = b[2 + 8 * k + 2 * l + j / 4] as usize;
                        y[32 * k + 8 * l + j] = db * grid(IQ3XXS, 4, i, j % 4) * sign(s, j);
                    }
                }
            }
        }
        IQ3_S => {
            // d, qs[64] (index low bits, one per 4 values), qh[8] (the ninth bits), signs[32]
            // (a bit per value), scales[4] (a 4-bit scale per 32 values: d * (1 + 2 s)).
            let d = h(b, 0);
            for v in 0..256 {
                let g = v / 4;
                let i = b[2 + g] as usize | (((b[66 + g / 8] >> (g % 8)) & 1) as usize) << 8;
                let sc = (b[106 + v / 64] >> (4 * ((v / 32) % 2))) & 15;
                let db = d * (1 + 2 * sc as u32) as f32;
                y[v] = db * grid(IQ3S, 4, i, v % 4) * sign(b[74 + v / 8] as u32, v % 8);
            }
        }
        IQ1_S | IQ1_M => {
            // IQ1_S: d, qs[32] (index low bits), per 32 values a u16: four 3-bit high index
            // parts, a 3-bit scale (d * (2 s + 1)) and the offset's sign on top. IQ1_M:
            // qs[32], qh[16] (a nibble per group: 3 high index bits, the offset's sign),
            // four u16 of four 3-bit scales (one per 16 values) whose top nibbles are d.
            let m = ty == IQ1_M;
            let d = if m {
                let top = |k: usize| u16_at(b, 48 + 2 * k) & 0xF000;
                let bits = top(0) >> 12 | top(1) >> 8 | top(2) >> 4 | top(3);
                f16::from_bits(bits as u16).to_f32()
            } else {
                h(b, 0)
            };
            for g in 0..32 {
                let (hi, neg, s) = if m {
                    let nib = (b[32 + g / 2] >> (4 * (g % 2))) & 15;
                    let t = g / 2;
                    (nib & 7, nib & 8 != 0, (u16_at(b, 48 + 2 * (t / 4)) >> (3 * (t % 4))) & 7)
                } else {
                    let qh = u16_at(b, 34 + 2 * (g / 4));
                    (((qh >> (3 * (g % 4))) & 7) as u8, qh & 0x8000 != 0, (qh >> 12) & 7)
                };
                let dl = d * (2 * s + 1) as f32;
                let delta = if neg { -0.125 } else { 0.125 };
                let i = b[if m { g } else { 2 + g }] as usize | (hi as usize) << 8;
                for j in 0..8 {
                    y[8 * g + j] = dl * (grid(IQ1S, 8, i, j) + delta);
                }
            }
        }
        _ => {}
    }
}
