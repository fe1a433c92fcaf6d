//! Decoding checked against gguf-py's `gguf.quants.dequantize` (an independent numpy
//! implementation): tests/fixtures/gguf/dequant.json holds random blocks of every type
//! (tools/make_gguf_fixtures.py) and the f32 bits gguf-py gives for them.

use super::*;
use crate::tensor::{decode_row, DType};

const VECTORS: &str = include_str!("../../../tests/fixtures/gguf/dequant.json");

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn case(name: &str) -> (GgmlType, Vec<u8>, Vec<u32>) {
    let v: serde_json::Value = serde_json::from_str(VECTORS).unwrap();
    let c = &v[name];
    let ty = GgmlType::from_id(c["type_id"].as_u64().unwrap() as u32).unwrap();
    assert_eq!(ty.name, name);
    let bits = c["f32_bits"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    (ty, hex(c["bytes"].as_str().unwrap()), bits)
}

fn assert_bits(name: &str, got: &[f32], want: &[u32]) {
    assert_eq!(got.len(), want.len(), "{name}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), *w, "{name}: value {i}: got {g}, gguf-py {}", f32::from_bits(*w));
    }
}

#[test]
fn every_supported_type_matches_gguf_py_bit_for_bit() {
    let names = ["F32", "F16", "BF16", "Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4"];
    for name in names.into_iter().chain(["Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"]) {
        let (ty, bytes, want) = case(name);
        let mut out = vec![f32::NAN; want.len()];
        dequantize(ty, &bytes, &mut out).unwrap();
        assert_bits(name, &out, &want);
        assert!(out.iter().any(|v| *v != 0.0), "{name}: all zero");
    }
}

/// The grid-coded types on blocks that meet every entry of their codebooks (and, with
/// random bits around the indices, the sign patterns, scales and offsets): the sha256 of
/// gguf-py's values, and the first 64 of them bit for bit.
#[test]
fn every_grid_coded_type_matches_gguf_py_on_every_codebook_entry() {
    use sha2::{Digest, Sha256};
    let v: serde_json::Value = serde_json::from_str(VECTORS).unwrap();
    for name in ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"] {
        let c = &v[name];
        let ty = GgmlType::from_id(c["type_id"].as_u64().unwrap() as u32).unwrap();
        assert_eq!(ty.name, name);
        let bytes = hex(c["bytes"].as_str().unwrap());
        let mut out = vec![f32::NAN; (bytes.len() / ty.block_bytes as usize) * 256];
        dequantize(ty, &bytes, &mut out).unwrap();
        let first: Vec<u32> =
            c["first_f32_bits"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_bits(name, &out[..first.len()], &first);
        let le: Vec<u8> = out.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(format!("{:x}", Sha256::digest(&le)), c["f32_sha256"].as_str().unwrap(), "{name}");
    }
}

#[test]
fn wrong_sizes_and_unsupported_types_are_errors() {
    let (ty, bytes, want) = case("Q4_K");
    let mut out = vec![0.0; want.len() - 1];
    assert!(dequantize(ty, &bytes, &mut out).is_err());
    let mut out = vec![0.0; want.len()];
    assert!(dequantize(ty, &bytes[1..], &mut out).is_err());
    let e = dequantize(GgmlType::by_name("TQ2_0").unwrap(), &[0; 66], &mut [0.0; 256]).unwrap_err().to_string();
    assert!(e.contains("TQ2_0") && e.contains("Q6_K") && e.contains("IQ1_M"), "{e}");
}

#[test]
fn q8_0_and_q4_0_repack_into_colibri_rows_exactly() {
    for (name, dtype) in [("Q8_0", DType::Int8 { group: 32 }), ("Q4_0", DType::Int4 { group: 32 })] {
        let (ty, bytes, want) = case(name);
        let cols = want.len();
        let mut row = vec![0xAAu8; dtype.row_bytes(cols).unwrap()];
        repack_row(ty.id, cols, &bytes, &mut row);
        let mut out = vec![f32::NAN; cols];
        decode_row(dtype, cols, &row, &mut out);
        assert_bits(name, &out, &want);
    }
}

/// gguf-py's Q4_K and Q5_K values (three random blocks each) from Q4K / Q5K rows made by
/// `q4k_row` / `q5k_row`, bit for bit: the headers' scales and mins moved, the nibbles
/// reordered, the fifth bits moved, llama.cpp's arithmetic.
#[test]
fn q4_k_and_q5_k_move_into_their_rows_exactly() {
    for (name, dtype) in [("Q4_K", DType::Q4K), ("Q5_K", DType::Q5K)] {
        let (ty, bytes, want) = case(name);
        let cols = want.len();
        let mut row = vec![0xAAu8; dtype.row_bytes(cols).unwrap()];
        if dtype == DType::Q4K {
            q4k_row(cols, &bytes, &mut row);
        } else {
            q5k_row(cols, &bytes, &mut row);
        }
        let mut out = vec![f32::NAN; cols];
        decode_row(dtype, cols, &row, &mut out);
        assert_bits(&format!("{name} as {dtype}"), &out, &want);
        assert_eq!(ty.name, name);
    }
}

#[test]
fn q4_0_q5_0_iq4_nl_and_mxfp4_widen_to_int8_exactly() {
    let dtype = DType::Int8 { group: 32 };
    for name in ["Q4_0", "Q5_0", "IQ4_NL"] {
        let (ty, bytes, want) = case(name);
        let mut row = vec![0u8; dtype.row_bytes(want.len()).unwrap()];
        assert!(to_int8_row(ty.id, want.len(), &bytes, &mut row), "{name}");
        let mut out = vec![f32::NAN; want.len()];
        decode_row(dtype, want.len(), &row, &mut out);
        assert_bits(&format!("{name} as int8"), &out, &want);
    }
    let (_, _, want) = case("Q4_0");
    let mut row = vec![0u8; dtype.row_bytes(want.len()).unwrap()];

    // The fixture's MXFP4 exponents (0, 1: f32 subnormals) do not fit f16: refused.
    let (ty, bytes, want) = case("MXFP4");
    assert!(!to_int8_row(ty.id, want.len(), &bytes, &mut row));
    // Exponents 104..=143 do; 2^-7 and 2^15 here, every nibble value.
    let mut block = vec![121u8];
    block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    block.push(143);
    block.extend((0..16u8).map(|j| (j << 4) | (j ^ 5)));
    let mut want = vec![0.0f32; 64];
    dequantize(ty, &block, &mut want).unwrap();
    let mut row = vec![0u8; dtype.row_bytes(64).unwrap()];
    assert!(to_int8_row(ty.id, 64, &block, &mut row));
    let mut out = vec![f32::NAN; 64];
    decode_row(dtype, 64, &row, &mut out);
    assert_eq!(
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(want[7], 12.0 * 2f32.powi(-7));
    assert_eq!(want[32], 6.0 * 2f32.powi(15));
    block[17] = 144; // 2^16 overflows f16
    assert!(!to_int8_row(ty.id, 64, &block, &mut row));
}
