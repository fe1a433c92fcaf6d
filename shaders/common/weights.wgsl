// weights.wgsl — shared prelude (not a kernel): exact decoding of stored weight rows.
//
// Prepended to kernels that read a weight matrix. The kernel declares
// `var<storage, read> W: array<u32>` holding one row block of the matrix in its stored
// bytes (engine/src/tensor.rs, DType), rows laid end to end from byte 0, and passes
// `cols` and `row_words` (u32 words per stored row; used by the integer types).
// The element type is a pipeline-overridable constant, so each dtype gets its own
// specialised pipeline:
//   DTYPE 0 f32 | 1 bf16 | 2 f16 | 3 int8 | 4 int4 | 5 fp8 | 6 q4k | 7 q5k, GROUP =
//   quantization group size (fp8: columns per scale block; q4k, q5k: 32).
// Quantized rows: [f16 scales, ceil(cols/GROUP), padded to 4 bytes][values, padded to
// 4 bytes]; int8 values are two's complement bytes, int4 values are q + 8 in a nibble
// (element 2j low nibble of byte j). value = f32(q) * f32(scale): exact in f32, the
// same bits as tensor::decode_row. No shader-f16 needed: f16 is decoded with integers.
// FP8 rows: [f32 scales, ceil(cols/GROUP)][e4m3 bytes, padded to 4 bytes]; value =
// e4m3(byte) * scale, one correctly rounded product (kept whole: wopq), the CPU's bits.
// Q4K rows: [16-byte headers, cols/256][int4's nibbles, the values u = 0..15 as stored];
// header k: f16 d, f16 dmin, then the 6-bit sc_j at bit 6j and m_j at bit 48 + 6j of a
// 96-bit string; value = A_j * u - B_j with A_j = d * sc_j, B_j = dmin * m_j (k4_factors),
// tensor::q4k_scales. The header words sit where int4 keeps its f16 scales (the same row
// layout), so wint reads the nibbles at the same place.
// Q5K rows: Q4K's row, then 32 bytes of fifth bits per 256 values (tensor::q5k_bit);
// u = nibble + 16 * fifth bit (0..31, k5_word), everything else as Q4K.
// The kernel's `P` has a field `zero` (always 0), as common/arith.wgsl needs.

override DTYPE: u32 = 0u;
override GROUP: u32 = 32u;

// IEEE half (16 low bits of h) to f32, exactly, subnormal halves included.
fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    var m = h & 0x3ffu;
    if (e == 0x1fu) {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    if (e == 0u) {
        if (m == 0u) {
            return bitcast<f32>(sign);
        }
        // Subnormal half: normalise (it is a normal f32).
        var ee = 113u; // 127 - 15 + 1
        while ((m & 0x400u) == 0u) {
            m = m << 1u;
            ee = ee - 1u;
        }
        return bitcast<f32>(sign | (ee << 23u) | ((m & 0x3ffu) << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// x, opaque to the compiler (bits xor P.zero = 0): a product passed through it is rounded
// to f32 as it stands, never reassociated with the products it feeds.
fn wopq(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) ^ P.zero);
}

// The e4m3 byte b (float8_e4m3fn: bias 7, no infinities, 0x7f/0xff NaN) as f32, exactly:
// tensor::E4M3.
fn e4m3_to_f32(b: u32) -> f32 {
    let sign = (b & 0x80u) << 24u;
    let e = (b >> 3u) & 15u;
    let m = b & 7u;
    if (e == 15u && m == 7u) {
        return bitcast<f32>(sign | 0x7fc00000u);
    }
    if (e == 0u) {
        // Subnormal: m * 2^-9, a normal f32 (exact).
        return bitcast<f32>(sign | bitcast<u32>(f32(m) * 0.001953125));
    }
    return bitcast<f32>(sign | ((e + 120u) << 23u) | (m << 20u));
}

// 16-bit element `e` of the block (little-endian halves of each word).
fn half_at(e: u32) -> u32 {
    return (W[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu;
}

// Integer value q of element (r, c) of an int8 (DTYPE 3) or int4 (DTYPE 4) row block; u of
// a Q4K (6) or Q5K (7) one.
fn wint(r: u32, c: u32, cols: u32, row_words: u32) -> i32 {
    let groups = (cols + GROUP - 1u) / GROUP;
    let vbase = r * row_words + (groups + 1u) / 2u;
    if (DTYPE == 3u) {
        let byte = (W[vbase + (c >> 2u)] >> ((c & 3u) * 8u)) & 0xffu;
        return (i32(byte) << 24u) >> 24u;
    }
    let nib = (W[vbase + (c >> 3u)] >> ((c & 7u) * 4u)) & 0xfu;
    if (DTYPE == 6u) {
        return i32(nib);
    }
    if (DTYPE == 7u) {
        let high = (k5_word(r, c & ~7u, cols, row_words) >> (8u * ((c & 7u) >> 1u) + (c & 1u))) & 1u;
        return i32(nib | (high << 4u));
    }
    return i32(nib) - 8;
}

// Whether the rows are Q4K or Q5K (DTYPE 6 or 7): k4_factors' headers over nibbles u.
fn k_rows() -> bool {
    return DTYPE == 6u || DTYPE == 7u;
}

// Q5K: the word of fifth bits of the eight values c..c+7 (c a multiple of 8) of row r,
// shifted so that bits 0 and 1 of its byte m are those of values c + 2m and c + 2m + 1.
// Value i of run k (column 256k + i, sub-block j = i / 32) has its bit at byte
// 16 (j / 4) + (i mod 32) / 2, bit 2 (j mod 4) + i mod 2 of the run's 32 bytes, which
// follow the row's headers (cols / 64 words) and nibbles (cols / 8 words): tensor::q5k_bit.
fn k5_word(r: u32, c: u32, cols: u32, row_words: u32) -> u32 {
    let j = (c >> 5u) & 7u;
    let at = r * row_words + cols / 64u + cols / 8u + 8u * (c >> 8u) + 4u * (j >> 2u) + ((c & 31u) >> 3u);
    return W[at] >> (2u * (j & 3u));
}

// Q4K: the 6-bit field at bit `at` of the string of header k of row r (its words 1-3).
fn k4_bits(r: u32, k: u32, at: u32, row_words: u32) -> u32 {
    let base = r * row_words + 4u * k + 1u;
    let o = at & 31u;
    var v = W[base + (at >> 5u)] >> o;
    if (o > 26u) {
        v = v | (W[base + (at >> 5u) + 1u] << (32u - o));
    }
    return v & 63u;
}

// Q4K: (A, B) of block g (32 values) of row r: d * sc_j and dmin * m_j, j = g mod 8 of
// header g / 8 (exact products).
fn k4_factors(r: u32, g: u32, row_words: u32) -> vec2<f32> {
    let k = g >> 3u;
    let j = g & 7u;
    let dw = W[r * row_words + 4u * k];
    let a = wopq(f16_to_f32(dw & 0xffffu) * f32(k4_bits(r, k, 6u * j, row_words)));
    let b = wopq(f16_to_f32(dw >> 16u) * f32(k4_bits(r, k, 48u + 6u * j, row_words)));
    return vec2<f32>(a, b);
}

// Q4K: one block's term of the integer matmuls' float step, `f` its k4_factors, `d` the
// activations' block scale, `isum` = sum u * q and `ssum` = sum q:
// (A * d) * f32(isum) - B * (d * f32(ssum)), every product rounded on its own.
fn k4_term(f: vec2<f32>, d: f32, isum: i32, ssum: i32) -> f32 {
    let ds = wopq(d * f32(ssum));
    return wopq(wopq(f.x * d) * f32(isum)) - wopq(f.y * ds);
}

// f16 scale of group g of row r of an int8/int4 row block, as f32 (exact).
fn wscale(r: u32, g: u32, cols: u32, row_words: u32) -> f32 {
    return f16_to_f32((W[r * row_words + (g >> 1u)] >> ((g & 1u) * 16u)) & 0xffffu);
}

// Element (r, c) of the row block, decoded to f32 exactly.
fn wval(r: u32, c: u32, cols: u32, row_words: u32) -> f32 {
    switch DTYPE {
        case 1u: {
            return bitcast<f32>(half_at(r * cols + c) << 16u);
        }
        case 2u: {
            return f16_to_f32(half_at(r * cols + c));
        }
        case 3u, 4u: {
            return f32(wint(r, c, cols, row_words)) * wscale(r, c / GROUP, cols, row_words);
        }
        case 6u, 7u: {
            let f = k4_factors(r, c / 32u, row_words);
            return wopq(f.x * f32(wint(r, c, cols, row_words))) - f.y;
        }
        case 5u: {
            let base = r * row_words;
            let nb = (cols + GROUP - 1u) / GROUP;
            let byte = (W[base + nb + (c >> 2u)] >> ((c & 3u) * 8u)) & 0xffu;
            return wopq(e4m3_to_f32(byte) * bitcast<f32>(W[base + c / GROUP]));
        }
        default: {
            return bitcast<f32>(W[r * cols + c]);
        }
    }
}
