//! Quantization of weight rows into the container's stored types (the inverse of
//! [`crate::tensor::decode_row`]). Deterministic: the same f32 row always gives the same
//! bytes, on every platform (IEEE division and rounding only, no libm).

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::tensor::DType;

/// Candidate ratios `m / scale` tried for each int4 group, where `m` is the group's value
/// of largest magnitude (sign included). Negative ratios map `m` onto the negative side
/// (-8 is the one extra level); the others trade clipping of `m` against resolution. Each
/// candidate is also refitted once by least squares (scale = sum(x q) / sum(q q) for its
/// levels q). The lowest squared error wins (ties: the first tried).
const INT4_RATIOS: [f32; 12] = [-8.0, -7.75, -7.5, -7.25, -7.0, -6.75, -6.5, 6.5, 6.75, 7.0, 7.25, 7.5];

/// Writes `src` (one row of `cols` values) in `dtype`'s row layout into `out`, which must
/// be exactly `dtype.row_bytes(src.len())` bytes. Padding bytes are written as zeros.
pub fn quantize_row(dtype: DType, src: &[f32], out: &mut [u8]) -> Result<()> {
    let cols = src.len();
    let want = dtype.row_bytes(cols).ok_or_else(|| Error::Invalid(format!("bad dtype {dtype}")))?;
    if out.len() != want {
        return Err(Error::Invalid(format!("row of {cols} values in {dtype} needs {want} bytes, got {}", out.len())));
    }
    match dtype {
        DType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::BF16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        DType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        DType::Int8 { group } | DType::Int4 { group } => {
            let int4 = matches!(dtype, DType::Int4 { .. });
            let group = group as usize;
            let groups = cols.div_ceil(group);
            out.iter_mut().for_each(|b| *b = 0);
            let (scales, q) = out.split_at_mut((groups * 2).div_ceil(4) * 4);
            let mut qs = vec![0i8; group];
            for g in 0..groups {
                let chunk = &src[g * group..((g + 1) * group).min(cols)];
                if chunk.iter().any(|v| !v.is_finite()) {
                    return Err(Error::Invalid("cannot quantize a row holding NaN or infinity".into()));
                }
                let qs = &mut qs[..chunk.len()];
                let scale = if int4 { quantize_group_int4(chunk, qs) } else { quantize_group_int8(chunk, qs) };
                scales[2 * g..2 * g + 2].copy_from_slice(&scale.to_bits().to_le_bytes());
                for (k, &v) in qs.iter().enumerate() {
                    let c = g * group + k;
                    if int4 {
                        let nib = (v + 8) as u8;
                        q[c >> 1] |= if c & 1 == 0 { nib } else { nib << 4 };
                    } else {
                        q[c] = v as u8;
                    }
                }
            }
        }
        DType::Mxfp4 => quantize_row_mxfp4(src, out)?,
        DType::Fp8 { block } => quantize_row_fp8(block as usize, src, out)?,
        DType::Q4K => quantize_row_k(false, src, out)?,
        DType::Q5K => quantize_row_k(true, src, out)?,
        DType::U8 | DType::F8E4M3 => {
            return Err(Error::Invalid(format!("{dtype} is a raw checkpoint type, not a weight encoding")))
        }
    }
    Ok(())
}

/// Q4_K (`!five`) or Q5_K of one row (`cols` a multiple of 256; [`DType::Q4K`]'s and
/// [`DType::Q5K`]'s layouts): each sub-block of 32 spans min(x, 0)..max(x) in 15 (31)
/// steps, its step and -min quantized to 6 bits against the block's f16 d and dmin (the
/// largest of each over 63), each value the nearest level. A plain quantizer (llama.cpp's
/// `make_qkx2` searches for a better fit); GGUF imports copy the blocks instead.
fn quantize_row_k(five: bool, src: &[f32], out: &mut [u8]) -> Result<()> {
    use crate::tensor::{q4k_scales, q5k_bit, Q4K_BLOCK};
    let top = if five { 31.0 } else { 15.0 };
    if src.iter().any(|v| !v.is_finite()) {
        return Err(Error::Invalid("cannot quantize a row holding NaN or infinity".into()));
    }
    out.iter_mut().for_each(|b| *b = 0);
    let runs = src.len() / Q4K_BLOCK;
    let (heads, q) = out.split_at_mut(runs * 16);
    let (q, high) = q.split_at_mut(src.len() / 2);
    for (k, head) in heads.chunks_exact_mut(16).enumerate() {
        let x = &src[k * Q4K_BLOCK..(k + 1) * Q4K_BLOCK];
        let (mut step, mut off) = ([0.0f32; 8], [0.0f32; 8]);
        for j in 0..8 {
            let sub = &x[32 * j..32 * j + 32];
            let lo = sub.iter().fold(0.0f32, |m, &v| m.min(v));
            let hi = sub.iter().fold(f32::MIN, |m, &v| m.max(v));
            (step[j], off[j]) = ((hi - lo) / top, -lo);
        }
        let d = f16::from_f32(step.iter().fold(0.0f32, |m, &v| m.max(v)) / 63.0);
        let dmin = f16::from_f32(off.iter().fold(0.0f32, |m, &v| m.max(v)) / 63.0);
        let six =
            |v: f32, by: f16| if by.to_f32() > 0.0 { (v / by.to_f32()).round().clamp(0.0, 63.0) as u8 } else { 0 };
        let (sc, m): (Vec<u8>, Vec<u8>) = (0..8).map(|j| (six(step[j], d), six(off[j], dmin))).unzip();
        head[0..2].copy_from_slice(&d.to_bits().to_le_bytes());
        head[2..4].copy_from_slice(&dmin.to_bits().to_le_bytes());
        let bits = (0..8).fold(0u128, |v, j| v | (sc[j] as u128) << (6 * j) | (m[j] as u128) << (48 + 6 * j));
        head[4..16].copy_from_slice(&bits.to_le_bytes()[..12]);
        let (a, b) = q4k_scales(head);
        for (c, &v) in x.iter().enumerate() {
            let j = c / 32;
            let u = if a[j] > 0.0 { ((v + b[j]) / a[j]).round().clamp(0.0, top) as u8 } else { 0 };
            let at = (k * Q4K_BLOCK + c) >> 1;
            q[at] |= if c & 1 == 0 { u & 15 } else { (u & 15) << 4 };
            if five {
                let (byte, bit) = q5k_bit(c);
                high[32 * k + byte] |= (u >> 4) << bit;
            }
        }
    }
    Ok(())
}

/// FP8 of one row with scale blocks of `block` columns: each block's scale is
/// `max|x| / 448` (1 for an all-zero block), each value `e4m3_from_f32(x / scale)`.
/// (A Hugging Face FP8 checkpoint's bytes and scales are copied instead.)
fn quantize_row_fp8(block: usize, src: &[f32], out: &mut [u8]) -> Result<()> {
    use crate::tensor::e4m3_from_f32;
    let cols = src.len();
    let nb = cols.div_ceil(block);
    out.iter_mut().for_each(|b| *b = 0);
    let (scales, q) = out.split_at_mut(4 * nb);
    for (b, x) in src.chunks(block).enumerate() {
        if x.iter().any(|v| !v.is_finite()) {
            return Err(Error::Invalid("cannot quantize a row holding NaN or infinity".into()));
        }
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = if amax > 0.0 { amax / 448.0 } else { 1.0 };
        scales[4 * b..4 * b + 4].copy_from_slice(&scale.to_le_bytes());
        for (o, v) in q[b * block..].iter_mut().zip(x) {
            *o = e4m3_from_f32(v / scale);
        }
    }
    Ok(())
}

/// MXFP4 of one row (cols a multiple of 32, checked by row_bytes): each block's scale is
/// the smallest power of two 2^e with max |x| / 2^e <= 6 (e8m0 byte e + 127, e clamped
/// to the byte's range), each value the nearest e2m1 value (ties to the smaller
/// magnitude), the order of tools/fixtures_gpt_oss.py.
fn quantize_row_mxfp4(src: &[f32], out: &mut [u8]) -> Result<()> {
    use crate::tensor::{e8m0_half, MXFP4_BLOCK, MXFP4_DOUBLED};
    if src.iter().any(|v| !v.is_finite()) {
        return Err(Error::Invalid("cannot quantize a row holding NaN or infinity".into()));
    }
    let blocks = src.len() / MXFP4_BLOCK;
    out.iter_mut().for_each(|b| *b = 0);
    let (scales, q) = out.split_at_mut(blocks.div_ceil(4) * 4);
    for (b, x) in src.chunks_exact(MXFP4_BLOCK).enumerate() {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // Smallest e with amax <= 6 * 2^e, i.e. with amax <= 12 * e8m0_half(e + 127).
        let mut s: u8 = 0;
        while s < 254 && amax > 12.0 * e8m0_half(s) {
            s += 1;
        }
        scales[b] = s;
        let half = e8m0_half(s);
        for (k, &v) in x.iter().enumerate() {
            // Nearest doubled value to v / half, compared in f32 products (exact enough:
            // a tie means equal distance, which picks the first, smaller magnitude).
            let mut best = 0u8;
            let mut best_err = f32::INFINITY;
            for (nib, &d) in MXFP4_DOUBLED.iter().enumerate() {
                let err = (v - d as f32 * half).abs();
                if err < best_err {
                    best_err = err;
                    best = nib as u8;
                }
            }
            q[b * 16 + k / 2] |= if k % 2 == 0 { best } else { best << 4 };
        }
    }
    Ok(())
}

/// Rounds `d` to an f16 scale, keeping it finite.
fn to_scale(d: f32) -> f16 {
    let s = f16::from_f32(d);
    if s.is_infinite() {
        if d > 0.0 {
            f16::MAX
        } else {
            f16::MIN
        }
    } else {
        s
    }
}

/// q = round(x / s) clamped to [lo, hi]; zero when the scale is zero.
fn quantize_with(chunk: &[f32], s: f32, lo: f32, hi: f32, qs: &mut [i8]) -> f64 {
    let mut err = 0.0f64;
    for (q, &x) in qs.iter_mut().zip(chunk) {
        let v = if s == 0.0 { 0.0 } else { (x / s).round().clamp(lo, hi) };
        *q = v as i8;
        let d = x as f64 - (v * s) as f64;
        err += d * d;
    }
    err
}

/// Symmetric int8, q in [-127, 127], scale = max|x| / 127.
fn quantize_group_int8(chunk: &[f32], qs: &mut [i8]) -> f16 {
    let amax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let s = to_scale(amax / 127.0);
    quantize_with(chunk, s.to_f32(), -127.0, 127.0, qs);
    s
}

/// Symmetric int4, q in [-8, 7], the scale chosen among [`INT4_RATIOS`] and their
/// least-squares refits.
fn quantize_group_int4(chunk: &[f32], qs: &mut [i8]) -> f16 {
    let m = chunk.iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if m == 0.0 {
        qs.iter_mut().for_each(|q| *q = 0);
        return f16::ZERO;
    }
    let mut best = (f64::INFINITY, f16::ZERO);
    let mut tmp = vec![0i8; qs.len()];
    let mut consider = |s: f16, tmp: &mut [i8]| {
        let err = quantize_with(chunk, s.to_f32(), -8.0, 7.0, tmp);
        if err < best.0 {
            best = (err, s);
            qs.copy_from_slice(tmp);
        }
    };
    for r in INT4_RATIOS {
        consider(to_scale(m / r), &mut tmp);
        // Refit: the scale that minimises the error for these levels.
        let (xq, qq) = chunk
            .iter()
            .zip(tmp.iter())
            .fold((0.0f64, 0.0f64), |(a, b), (&x, &q)| (a + x as f64 * q as f64, b + (q as f64) * (q as f64)));
        if qq > 0.0 {
            consider(to_scale((xq / qq) as f32), &mut tmp);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::decode_row;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn roundtrip(dtype: DType, src: &[f32]) -> Vec<f32> {
        let mut bytes = vec![0xAA; dtype.row_bytes(src.len()).unwrap()];
        quantize_row(dtype, src, &mut bytes).unwrap();
        let mut out = vec![f32::NAN; src.len()];
        decode_row(dtype, src.len(), &bytes, &mut out);
        out
    }

    #[test]
    fn float_types_roundtrip() {
        let mut s = 1;
        let v: Vec<f32> = (0..37).map(|_| lcg(&mut s)).collect();
        assert_eq!(roundtrip(DType::F32, &v), v);
        let h: Vec<f32> = v.iter().map(|x| f16::from_f32(*x).to_f32()).collect();
        assert_eq!(roundtrip(DType::F16, &v), h);
        let b: Vec<f32> = v.iter().map(|x| bf16::from_f32(*x).to_f32()).collect();
        assert_eq!(roundtrip(DType::BF16, &v), b);
    }

    #[test]
    fn integer_types_are_close_and_exact_to_decode() {
        let mut s = 5;
        for cols in [1usize, 7, 64, 100, 129] {
            let v: Vec<f32> = (0..cols).map(|_| lcg(&mut s) * 0.1).collect();
            for (dtype, levels) in
                [(DType::Int8 { group: 64 }, 127.0), (DType::Int4 { group: 32 }, 7.0), (DType::Int4 { group: 8 }, 7.0)]
            {
                let out = roundtrip(dtype, &v);
                let g = dtype.group().unwrap() as usize;
                if levels == 127.0 {
                    for (k, (a, b)) in v.iter().zip(&out).enumerate() {
                        let chunk = &v[k / g * g..((k / g + 1) * g).min(cols)];
                        let amax = chunk.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                        assert!((a - b).abs() <= amax / levels * 0.51 + 1e-6, "{dtype} cols {cols} [{k}]: {a} vs {b}");
                    }
                    continue;
                }
                // int4: each group's squared error is at most that of plain rounding with
                // scale max/7 (one of the candidates the search tries).
                for (c0, (chunk, got)) in v.chunks(g).zip(out.chunks(g)).enumerate() {
                    let m = chunk.iter().fold(0.0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
                    let sc = f16::from_f32(m / 7.0).to_f32();
                    let plain: f64 = chunk
                        .iter()
                        .map(|&x| {
                            let q = if sc == 0.0 { 0.0 } else { (x / sc).round().clamp(-8.0, 7.0) };
                            (x as f64 - (q * sc) as f64).powi(2)
                        })
                        .sum();
                    let err: f64 = chunk.iter().zip(got).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
                    assert!(err <= plain * (1.0 + 1e-9) + 1e-18, "{dtype} cols {cols} group {c0}: {err} > {plain}");
                }
            }
        }
    }

    #[test]
    fn int4_layout_nibbles_and_scales() {
        // One group of 4: values 1, -2, 3, -4 -> m = -4, ratio -8 gives scale 0.5 exactly
        // with zero error: q = 2, -4, 6, -8 -> nibbles 10, 4, 14, 0.
        let mut bytes = vec![0; DType::Int4 { group: 4 }.row_bytes(4).unwrap()];
        quantize_row(DType::Int4 { group: 4 }, &[1.0, -2.0, 3.0, -4.0], &mut bytes).unwrap();
        assert_eq!(bytes.len(), 8);
        assert_eq!(&bytes[..4], &[0x00, 0x38, 0, 0]); // f16 0.5 = 0x3800, then padding
        assert_eq!(&bytes[4..], &[0x4A, 0x0E, 0, 0]);
        let mut b8 = vec![0; DType::Int8 { group: 2 }.row_bytes(3).unwrap()];
        quantize_row(DType::Int8 { group: 2 }, &[127.0, -63.5, 0.0], &mut b8).unwrap();
        // scales 1.0 (0x3C00) and 0, values 127, -64 (round half away), 0.
        assert_eq!(b8, vec![0x00, 0x3C, 0, 0, 127, 0xC0, 0, 0]);
    }

    #[test]
    fn zero_rows_and_bad_input() {
        assert_eq!(roundtrip(DType::Int4 { group: 4 }, &[0.0; 9]), vec![0.0; 9]);
        assert_eq!(roundtrip(DType::Int8 { group: 4 }, &[0.0; 9]), vec![0.0; 9]);
        let mut b = vec![0; DType::Int8 { group: 4 }.row_bytes(2).unwrap()];
        assert!(quantize_row(DType::Int8 { group: 4 }, &[f32::NAN, 1.0], &mut b).is_err());
        assert!(quantize_row(DType::Int8 { group: 4 }, &[1.0; 9], &mut b).is_err());
        // Huge values keep a finite scale.
        let out = roundtrip(DType::Int8 { group: 2 }, &[1e30, 1.0]);
        assert!(out[0].is_finite());
    }

    #[test]
    fn dequantized_product_is_exact() {
        // Every q * scale product must be exactly representable: compare with f64.
        let mut s = 9;
        let v: Vec<f32> = (0..256).map(|_| lcg(&mut s) * 3.0).collect();
        for dtype in [DType::Int8 { group: 64 }, DType::Int4 { group: 64 }] {
            let mut bytes = vec![0; dtype.row_bytes(v.len()).unwrap()];
            quantize_row(dtype, &v, &mut bytes).unwrap();
            let mut out = vec![0.0; v.len()];
            decode_row(dtype, v.len(), &bytes, &mut out);
            let scales: Vec<f64> =
                bytes[..8].chunks(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64()).collect();
            for (k, o) in out.iter().enumerate() {
                let q = *o as f64 / scales[k / 64];
                assert_eq!(q, q.round(), "{dtype} [{k}]");
            }
        }
    }
}
