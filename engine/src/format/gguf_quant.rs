//! ggml's tensor encodings, decoded to f32 (ggml/src/ggml-common.h block layouts; the
//! arithmetic follows ggml-quants.c's `dequantize_row_*` reference: every product and
//! difference rounded to f32 on its own, in the same order, so the values are bit for bit
//! what llama.cpp and gguf-py compute), and the exact re-encodings into colibri's int8 /
//! int4 rows (docs/format.md) where the container can hold the values unchanged.

use half::f16;

use super::gguf::GgmlType;
use crate::error::{Error, Result};

pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q5_0: u32 = 6;
pub const Q5_1: u32 = 7;
pub const Q8_0: u32 = 8;
pub const Q2_K: u32 = 10;
pub const Q3_K: u32 = 11;
pub const Q4_K: u32 = 12;
pub const Q5_K: u32 = 13;
pub const Q6_K: u32 = 14;
pub use super::gguf_iq::{IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS};
pub const IQ4_NL: u32 = 20;
pub const IQ4_XS: u32 = 23;
pub const BF16: u32 = 30;
pub const MXFP4: u32 = 39;

/// The grid-coded types (`gguf_iq`).
pub const GRID_CODED: &[u32] = &[IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M];

/// The types colibri decodes: every type of gguf.rs's table that llama.cpp writes into
/// model files but the ternary TQ1_0 / TQ2_0.
pub const SUPPORTED: &[u32] = &[
    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S,
    IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, MXFP4,
];

pub fn is_supported(ty: GgmlType) -> bool {
    SUPPORTED.contains(&ty.id)
}

/// The names of the supported types, for error messages.
pub fn supported_names() -> String {
    SUPPORTED.iter().filter_map(|&id| GgmlType::from_id(id)).map(|t| t.name).collect::<Vec<_>>().join(", ")
}

#[inline]
fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// E8M0 exponent to f32, halved (ggml_e8m0_to_fp32_half): 2^(e - 128), with the two
/// smallest exponents as f32 subnormals.
#[inline]
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { ((e as u32) - 1) << 23 };
    f32::from_bits(bits)
}

/// MXFP4's E2M1 values, doubled (kvalues_mxfp4).
const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// IQ4_NL's and IQ4_XS's sixteen non-linear levels (kvalues_iq4nl).
const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// The 4-bit value `j` (0..32) of a 32-value block whose 16 bytes hold value j in the low
/// and value j + 16 in the high nibble of byte j (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4).
#[inline]
fn nib32(qs: &[u8], j: usize) -> u8 {
    if j < 16 {
        qs[j] & 0xF
    } else {
        qs[j - 16] >> 4
    }
}

/// The 6-bit scale (biased by 32) of 16-value sub-block `j` of a Q3_K block's 12 scale
/// bytes: the low four bits in byte j (j < 8) or the high nibble of byte j - 8, the top two
/// in bits 2 (j / 4) of byte 8 + j % 4.
#[inline]
fn scale_q3k(j: usize, sc: &[u8]) -> i32 {
    let low = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
    let high = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K / Q5_K block (get_scale_min_k4).
#[inline]
fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    let (d, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    };
    (d as f32, m as f32)
}

fn block(b: &[u8], ty: u32, y: &mut [f32]) {
    match ty {
        Q4_1 | Q5_0 | Q5_1 => {
            // d, (Q4_1, Q5_1: m), (Q5_0, Q5_1: qh, bit j the fifth bit of value j), qs[16].
            let d = h(b, 0);
            let (m, at) = if ty == Q5_0 { (0.0, 2) } else { (h(b, 2), 4) };
            let (qh, qs) = if ty == Q4_1 {
                (0, &b[at..])
            } else {
                (u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]), &b[at + 4..])
            };
            for (j, o) in y.iter_mut().enumerate().take(32) {
                let u = (nib32(qs, j) as u32 | ((qh >> j) & 1) << 4) as i32;
                *o = if ty == Q5_0 { (u - 16) as f32 * d } else { u as f32 * d + m };
            }
        }
        IQ4_NL => {
            let d = h(b, 0);
            for (j, o) in y.iter_mut().enumerate().take(32) {
                *o = d * KVALUES_IQ4NL[nib32(&b[2..], j) as usize] as f32;
            }
        }
        IQ4_XS => {
            // d, scales_h (u16: bits 2k..2k+1 the top of sub-block k's 6-bit scale),
            // scales_l[4] (nibble k the low four), qs[128]: eight IQ4_NL-coded sub-blocks.
            let (d, sh) = (h(b, 0), u16::from_le_bytes([b[2], b[3]]) as u32);
            for k in 0..8 {
                let ls = ((b[4 + k / 2] >> (4 * (k % 2))) & 0xF) as u32 | ((sh >> (2 * k)) & 3) << 4;
                let dl = d * (ls as i32 - 32) as f32;
                let qs = &b[8 + 16 * k..24 + 16 * k];
                for (j, o) in y[32 * k..32 * k + 32].iter_mut().enumerate() {
                    *o = dl * KVALUES_IQ4NL[nib32(qs, j) as usize] as f32;
                }
            }
        }
        Q2_K | Q3_K => {
            // Q2_K: scales[16] (low nibble scale, high min), qs[64], d, dmin. Q3_K: hmask[32],
            // qs[64], scales[12] (6-bit, biased by 32), d. Two halves of 128 values; in each,
            // value 32 s + l (s < 4, l < 32) is bits 2s of byte l of the half's 32 qs bytes,
            // its sub-block of 16 is 2 s + l / 16; Q3_K's third bit is bit 4 h + s of hmask[l]
            // (set: as is; clear: minus 4).
            let q2 = ty == Q2_K;
            let (qs, d) = if q2 { (&b[16..80], h(b, 80)) } else { (&b[32..96], h(b, 108)) };
            for half in 0..2 {
                for s in 0..4 {
                    for l in 0..32 {
                        let sub = 8 * half + 2 * s + l / 16;
                        let u = ((qs[32 * half + l] >> (2 * s)) & 3) as i32;
                        y[128 * half + 32 * s + l] = if q2 {
                            let sc = b[sub];
                            d * (sc & 0xF) as f32 * u as f32 - h(b, 82) * (sc >> 4) as f32
                        } else {
                            let high = (b[l] >> (4 * half + s)) & 1;
                            d * scale_q3k(sub, &b[96..108]) as f32 * (u - if high == 1 { 0 } else { 4 }) as f32
                        };
                    }
                }
            }
        }
        Q4_0 => {
            let d = h(b, 0);
            for j in 0..16 {
                y[j] = ((b[2 + j] & 0xF) as i32 - 8) as f32 * d;
                y[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
            }
        }
        Q8_0 => {
            let d = h(b, 0);
            for j in 0..32 {
                y[j] = (b[2 + j] as i8) as f32 * d;
            }
        }
        MXFP4 => {
            let d = e8m0_half(b[0]);
            for j in 0..16 {
                y[j] = d * KVALUES_MXFP4[(b[1 + j] & 0xF) as usize] as f32;
                y[j + 16] = d * KVALUES_MXFP4[(b[1 + j] >> 4) as usize] as f32;
            }
        }
        Q4_K | Q5_K => {
            // d, dmin, scales[12], (Q5_K: qh[32]), qs[128]: 4 chunks of 64 values, each the
            // low then the high nibbles of 32 bytes, with their own 6-bit scale and min.
            let (d, dmin, scales) = (h(b, 0), h(b, 2), &b[4..16]);
            let (qh, qs) = if ty == Q5_K { (&b[16..48], &b[48..176]) } else { (&b[0..0], &b[16..144]) };
            for chunk in 0..4 {
                let (sc1, m1) = scale_min_k4(2 * chunk, scales);
                let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
                let (d1, min1, d2, min2) = (d * sc1, dmin * m1, d * sc2, dmin * m2);
                let q = &qs[32 * chunk..32 * chunk + 32];
                let out = &mut y[64 * chunk..64 * chunk + 64];
                for l in 0..32 {
                    let (mut lo, mut hi) = ((q[l] & 0xF) as u32, (q[l] >> 4) as u32);
                    if ty == Q5_K {
                        lo += (((qh[l] >> (2 * chunk)) & 1) as u32) << 4;
                        hi += (((qh[l] >> (2 * chunk + 1)) & 1) as u32) << 4;
                    }
                    out[l] = d1 * lo as f32 - min1;
                    out[l + 32] = d2 * hi as f32 - min2;
                }
            }
        }
        Q6_K => {
            // ql[128], qh[64], scales[16] (i8), d: two halves of 128 values.
            let d = h(b, 208);
            for half in 0..2 {
                let ql = &b[64 * half..64 * half + 64];
                let qh = &b[128 + 32 * half..128 + 32 * half + 32];
                let sc = &b[192 + 8 * half..192 + 8 * half + 8];
                let out = &mut y[128 * half..128 * half + 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    out[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                    out[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                    out[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                    out[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                }
            }
        }
        _ => super::gguf_iq::block(b, ty, y),
    }
}

/// Decodes `out.len()` values of type `ty` from `src` (exactly their bytes).
pub fn dequantize(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<()> {
    if !is_supported(ty) {
        return Err(Error::Invalid(format!(
            "ggml type {} is not supported (colibri reads {})",
            ty.name,
            supported_names()
        )));
    }
    if ty.bytes_for(out.len() as u64) != Some(src.len() as u64) {
        return Err(Error::Invalid(format!("{} bytes do not hold {} {} values", src.len(), out.len(), ty.name)));
    }
    match ty.id {
        F32 => {
            out.iter_mut().zip(src.chunks_exact(4)).for_each(|(o, b)| *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        F16 => {
            out.iter_mut().zip(src.chunks_exact(2)).for_each(|(o, b)| *o = f16::from_le_bytes([b[0], b[1]]).to_f32())
        }
        BF16 => out
            .iter_mut()
            .zip(src.chunks_exact(2))
            .for_each(|(o, b)| *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)),
        id => {
            let (n, bb) = (ty.block as usize, ty.block_bytes as usize);
            for (y, b) in out.chunks_exact_mut(n).zip(src.chunks_exact(bb)) {
                block(b, id, y);
            }
        }
    }
    Ok(())
}

fn pad4(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// One row of Q8_0 or Q4_0 (`cols` values, a multiple of 32) re-encoded as a colibri
/// int8 (Q8_0) or int4 (Q4_0) row with group 32: the same f16 scales and the same
/// integers, so `q * scale` gives exactly ggml's values. Q4_0 keeps value j of a block in
/// the low nibble of byte j and value j+16 in the high nibble; colibri keeps value 2k in
/// the low and 2k+1 in the high nibble of byte k, so only the nibbles move.
pub fn repack_row(ty: u32, cols: usize, src: &[u8], out: &mut [u8]) {
    let groups = cols / 32;
    let values = pad4(groups * 2);
    out.fill(0);
    for g in 0..groups {
        match ty {
            Q8_0 => {
                let b = &src[34 * g..34 * g + 34];
                out[2 * g..2 * g + 2].copy_from_slice(&b[0..2]);
                out[values + 32 * g..values + 32 * g + 32].copy_from_slice(&b[2..34]);
            }
            _ => {
                let b = &src[18 * g..18 * g + 18];
                out[2 * g..2 * g + 2].copy_from_slice(&b[0..2]);
                let mut q = [0u8; 32];
                for j in 0..16 {
                    q[j] = b[2 + j] & 0xF;
                    q[j + 16] = b[2 + j] >> 4;
                }
                for k in 0..16 {
                    out[values + 16 * g + k] = q[2 * k] | (q[2 * k + 1] << 4);
                }
            }
        }
    }
}

/// One row of Q4_K (`cols` a multiple of 256: blocks of 144 bytes, f16 d, f16 dmin, 12
/// bytes of 6-bit scales and mins, 128 bytes holding, per 64 values, value l in the low and
/// value 32 + l in the high nibble of byte l) as a colibri Q4K row (tensor.rs: each block's
/// d, dmin, scales and mins in 16 bytes, `tensor::q4k_header`, then value 2k in the low and
/// 2k + 1 in the high nibble of byte k): the same values, moved.
pub fn q4k_row(cols: usize, src: &[u8], out: &mut [u8]) {
    k_row(false, cols, src, out)
}

/// One row of Q5_K (blocks of 176 bytes: Q4_K's header, then 32 bytes qh whose bit 2c of
/// byte l is the fifth bit of value 64c + l and bit 2c + 1 that of value 64c + 32 + l, then
/// Q4_K's 128 nibble bytes) as a colibri Q5K row (tensor.rs: Q4K's headers and nibbles,
/// then each run's fifth bits where `tensor::q5k_bit` puts them): the same values, moved.
pub fn q5k_row(cols: usize, src: &[u8], out: &mut [u8]) {
    k_row(true, cols, src, out)
}

fn k_row(five: bool, cols: usize, src: &[u8], out: &mut [u8]) {
    let blocks = cols / 256;
    let bb = if five { 176 } else { 144 };
    let (heads, rest) = out.split_at_mut(blocks * 16);
    let (vals, high) = rest.split_at_mut(cols / 2);
    high.fill(0);
    for k in 0..blocks {
        let b = &src[bb * k..bb * k + bb];
        heads[16 * k..16 * k + 16].copy_from_slice(&crate::tensor::q4k_header(b));
        let (qh, qs) = if five { (&b[16..48], &b[48..176]) } else { (&b[0..0], &b[16..144]) };
        let mut u = [0u8; 256];
        for chunk in 0..4 {
            for l in 0..32 {
                let byte = qs[32 * chunk + l];
                u[64 * chunk + l] = byte & 0xF;
                u[64 * chunk + 32 + l] = byte >> 4;
                if five {
                    u[64 * chunk + l] |= ((qh[l] >> (2 * chunk)) & 1) << 4;
                    u[64 * chunk + 32 + l] |= ((qh[l] >> (2 * chunk + 1)) & 1) << 4;
                }
            }
        }
        for (i, o) in vals[128 * k..128 * k + 128].iter_mut().enumerate() {
            *o = (u[2 * i] & 15) | ((u[2 * i + 1] & 15) << 4);
        }
        if five {
            for (c, &v) in u.iter().enumerate() {
                let (at, bit) = crate::tensor::q5k_bit(c);
                high[32 * k + at] |= (v >> 4) << bit;
            }
        }
    }
}

/// One row of ggml MXFP4 (`cols` a multiple of 32: blocks of one e8m0 byte and 16 bytes
/// holding value j in the low and value j+16 in the high nibble of byte j) as a colibri
/// MXFP4 row (tensor.rs: the block scales, padded to 4 bytes, then value 2k in the low and
/// 2k+1 in the high nibble of byte k): the same scale bytes and the same nibbles, moved.
pub fn mxfp4_row(cols: usize, src: &[u8], out: &mut [u8]) {
    let groups = cols / 32;
    let values = pad4(groups);
    out.fill(0);
    for g in 0..groups {
        let b = &src[17 * g..17 * g + 17];
        out[g] = b[0];
        let nib = |v: usize| if v < 16 { b[1 + v] & 0xF } else { b[1 + v - 16] >> 4 };
        for k in 0..16 {
            out[values + 16 * g + k] = nib(2 * k) | (nib(2 * k + 1) << 4);
        }
    }
}

/// One row of Q4_0, Q5_0, IQ4_NL or MXFP4 as a colibri int8 row with group 32, if that is
/// exact: Q4_0's integers are in [-8, 7], Q5_0's in [-16, 15], IQ4_NL's its levels (in
/// [-127, 113]), each under the block's own f16 scale; MXFP4's are the doubled E2M1 values
/// (|q| <= 12) with the scale 2^(e-128), exact in f16 for e in 104..=143. Returns false
/// (leaving `out` unspecified) when a scale does not fit f16 exactly.
pub fn to_int8_row(ty: u32, cols: usize, src: &[u8], out: &mut [u8]) -> bool {
    let groups = cols / 32;
    let values = pad4(groups * 2);
    out.fill(0);
    for g in 0..groups {
        let (scale, q): (f16, [i8; 32]) = match ty {
            Q4_0 => {
                let b = &src[18 * g..18 * g + 18];
                let mut q = [0i8; 32];
                for j in 0..16 {
                    q[j] = (b[2 + j] & 0xF) as i8 - 8;
                    q[j + 16] = (b[2 + j] >> 4) as i8 - 8;
                }
                (f16::from_le_bytes([b[0], b[1]]), q)
            }
            Q5_0 | IQ4_NL => {
                let bb = if ty == Q5_0 { 22 } else { 18 };
                let b = &src[bb * g..bb * g + bb];
                let mut q = [0i8; 32];
                for (j, v) in q.iter_mut().enumerate() {
                    *v = if ty == Q5_0 {
                        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                        (nib32(&b[6..], j) as u32 | ((qh >> j) & 1) << 4) as i8 - 16
                    } else {
                        KVALUES_IQ4NL[nib32(&b[2..], j) as usize]
                    };
                }
                (f16::from_le_bytes([b[0], b[1]]), q)
            }
            MXFP4 => {
                let b = &src[17 * g..17 * g + 17];
                let d = e8m0_half(b[0]);
                let s = f16::from_f32(d);
                if s.to_f32() != d {
                    return false;
                }
                let mut q = [0i8; 32];
                for j in 0..16 {
                    q[j] = KVALUES_MXFP4[(b[1 + j] & 0xF) as usize];
                    q[j + 16] = KVALUES_MXFP4[(b[1 + j] >> 4) as usize];
                }
                (s, q)
            }
            _ => return false,
        };
        out[2 * g..2 * g + 2].copy_from_slice(&scale.to_le_bytes());
        for (o, v) in out[values + 32 * g..values + 32 * g + 32].iter_mut().zip(q) {
            *o = v as u8;
        }
    }
    true
}

#[cfg(test)]
#[path = "gguf_quant_tests.rs"]
mod tests;
