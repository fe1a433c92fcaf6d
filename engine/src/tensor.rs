//! Weight matrices that live in someone else's bytes (a memory-mapped shard, a fetched
//! buffer) and decode rows to f32 on demand, so a checkpoint is never copied whole.

use std::sync::Arc;

use half::{bf16, f16};

use crate::error::{Error, Result};

/// Element type of stored weights: plain floats, or symmetric integer quantization with
/// one f16 scale per `group` consecutive values of a row (see docs/format.md).
///
/// Quantized rows are laid out as `[scales: ceil(cols/group) x f16, zero-padded to a
/// multiple of 4 bytes][values, zero-padded to a multiple of 4 bytes]`; int8 values are
/// two's-complement bytes in [-127, 127], int4 values are stored as `q + 8` in a nibble
/// (element 2j in the low nibble of byte j, element 2j+1 in the high nibble), q in [-8, 7].
/// Dequantization `q * scale` is exact in f32.
///
/// MXFP4 rows (OCP microscaling FP4, as gpt-oss ships its experts) hold blocks of 32
/// values, `cols` a multiple of 32: `[scales: cols/32 x e8m0, zero-padded to a multiple of
/// 4 bytes][values: cols/2 bytes]`. A value is an e2m1 nibble (element 2j in the low nibble
/// of byte j of its block, 2j+1 in the high one), e8m0 scale s means 2^(s - 127); value =
/// [`MXFP4_DOUBLED`]`[nibble] * 2^(s - 128)`, exact in f32.
///
/// `U8` is raw bytes (safetensors "U8", the blocks and scales of an MXFP4 checkpoint, and
/// "F8_E8M0", the ue8m0 scales of an FP8 checkpoint), each read as its integer value (an
/// FP8 weight's e8m0 `_scale_inv` as 2^(b - 127), format::fp8).
///
/// FP8 rows (block-scaled e4m3, as DeepSeek-V3/R1, Kimi-K2 and GLM-5 ship their linear
/// weights) hold `[scales: ceil(cols/block) x f32][values: cols e4m3 bytes, zero-padded to
/// a multiple of 4 bytes]`: value c is [`E4M3`]`[byte c] * scale[c / block]`, one f32
/// product (correctly rounded, so every path gets the same bits). A Hugging Face checkpoint's
/// `weight_scale_inv` block of `[B0, B1]` weights becomes the scale of each of its B0 rows
/// (`block` = B1), so a row, and an expert, is self-contained.
///
/// `F8E4M3` is raw e4m3 bytes (safetensors "F8_E4M3", before their scales are paired with
/// them), each read as its e4m3 value.
///
/// `Q4K` rows (`cols` a multiple of 256) keep a GGUF Q4_K tensor's blocks exactly: `[headers:
/// cols / 256 x 16 bytes][values: cols / 2 bytes]`. Header k holds Q4_K block k's f16 d and
/// f16 dmin, then its eight 6-bit sub-block scales and eight 6-bit mins as one 96-bit
/// little-endian string (sc_j at bit 6j, m_j at bit 48 + 6j: [`q4k_scales`]; llama.cpp
/// packs them otherwise, [`q4k_header`] moves them); the values are its nibbles in int4's
/// order (value c in byte c / 2, low nibble for even c). Value c of sub-block j (32 values) is `A_j * u_c - B_j` with
/// `A_j = d * sc_j` and `B_j = dmin * m_j` (both exact in f32) and u_c the nibble 0..=15,
/// one rounding: llama.cpp's dequantization. The rows are as large as int4/g32's (0.5625
/// bytes per value: a 16-byte header per eight blocks where int4 has eight f16 scales), so
/// the int4 kernels' integer sums apply unchanged (crate::qdot).
///
/// `Q5K` rows (`cols` a multiple of 256) keep a GGUF Q5_K tensor's blocks exactly: `[headers:
/// cols / 256 x 16 bytes, as Q4K's][values: cols / 2 bytes, the low four bits of each value
/// in int4's order, as Q4K's][fifth bits: cols / 256 x 32 bytes]`. Value c of sub-block j is
/// `A_j * u_c - B_j` with u_c = nibble + 16 * fifth bit (0..=31), one rounding: llama.cpp's
/// dequantization. Run k's 32 fifth-bit bytes put the bit of value c (of the run's 256) at
/// [`q5k_bit`]: byte 16 (j / 4) + m, bit 2 (j mod 4) + (c mod 2) for nibble byte m of
/// sub-block j, so that a 16-byte load and one shift line the bits up with that sub-block's
/// 16 nibble bytes, and one 32-byte load and one shift those of sub-blocks j and j + 4. 0.6875 bytes per value (Q5_K's 176 per 256).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    F16,
    Int8 { group: u32 },
    Int4 { group: u32 },
    Mxfp4,
    U8,
    Fp8 { block: u32 },
    F8E4M3,
    Q4K,
    Q5K,
}

/// Values per Q4_K block (one 16-byte header: eight sub-blocks of 32).
pub const Q4K_BLOCK: usize = 256;

/// Where the fifth bit of value `c` (0..256) of a Q5K run is among its 32 fifth-bit bytes:
/// (byte, bit). See [`DType::Q5K`].
#[inline]
pub fn q5k_bit(c: usize) -> (usize, u32) {
    let (j, i) = (c / 32, c % 32);
    (16 * (j / 4) + i / 2, (2 * (j % 4) + i % 2) as u32)
}

/// The eight sub-block factors `A_j = d * sc_j` and offsets `B_j = dmin * m_j` of a Q4K
/// header (16 bytes: f16 d, f16 dmin, then sc_j at bit 6j and m_j at bit 48 + 6j of a
/// 96-bit little-endian string). Exact: an f16 times an integer below 64.
pub fn q4k_scales(head: &[u8]) -> ([f32; 8], [f32; 8]) {
    let half = |i: usize| f16::from_bits(u16::from_le_bytes([head[i], head[i + 1]])).to_f32();
    let (d, dmin) = (half(0), half(2));
    let mut bits = [0u8; 16];
    bits[..12].copy_from_slice(&head[4..16]);
    let bits = u128::from_le_bytes(bits);
    let (mut a, mut b) = ([0.0f32; 8], [0.0f32; 8]);
    for j in 0..8 {
        a[j] = d * ((bits >> (6 * j)) & 63) as f32;
        b[j] = dmin * ((bits >> (48 + 6 * j)) & 63) as f32;
    }
    (a, b)
}

/// A Q4K header from a Q4_K block's first 16 bytes (f16 d, f16 dmin, then llama.cpp's
/// packing of the 6-bit scales and mins, `get_scale_min_k4`): the same d and dmin, the
/// sixteen 6-bit values moved into [`q4k_scales`]' string.
pub fn q4k_header(block: &[u8]) -> [u8; 16] {
    let q = &block[4..16];
    let mut bits = 0u128;
    for j in 0..8 {
        let (sc, m) = if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
        };
        bits |= (sc as u128) << (6 * j) | (m as u128) << (48 + 6 * j);
    }
    let mut out = [0u8; 16];
    out[..4].copy_from_slice(&block[..4]);
    out[4..].copy_from_slice(&bits.to_le_bytes()[..12]);
    out
}

/// The value of every e4m3 byte (OCP FP8 E4M3, PyTorch's `float8_e4m3fn`: sign, four
/// exponent bits of bias 7, three mantissa bits, no infinities, 0x7f and 0xff NaN,
/// subnormals `m * 2^-9`, 0x80 is -0.0), exactly, as f32.
pub const E4M3: [f32; 256] = e4m3_table();

const fn e4m3_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut b = 0;
    while b < 256 {
        let (e, m) = ((b >> 3) & 15, b & 7);
        let mag = if e == 0 {
            m as f32 * (1.0 / 512.0)
        } else if e == 15 && m == 7 {
            f32::NAN
        } else {
            // 2^(e - 7) * (1 + m/8): exponent e - 7 + 127, mantissa m in the top 3 bits.
            f32::from_bits((((e + 120) as u32) << 23) | ((m as u32) << 20))
        };
        t[b] = if b >= 128 { -mag } else { mag };
        b += 1;
    }
    t
}

/// The e4m3 byte nearest to `v` (round to nearest, ties to even), saturating at ±448;
/// NaN gives 0x7f. The inverse of [`E4M3`] on its finite values.
pub fn e4m3_from_f32(v: f32) -> u8 {
    if v.is_nan() {
        return 0x7f;
    }
    let sign = if v.is_sign_negative() { 0x80u8 } else { 0 };
    let a = v.abs();
    let code = if a >= 464.0 {
        0x7e // past the midpoint of 448 and the next step: saturate
    } else if a < 1.0 / 64.0 {
        // Subnormal range: multiples of 2^-9 (a * 512 is exact), ties to even.
        let q = a * 512.0;
        let f = q.floor();
        let r = q - f;
        let f = f as u8;
        if r > 0.5 || (r == 0.5 && f & 1 == 1) {
            f + 1
        } else {
            f
        }
    } else {
        let bits = a.to_bits();
        let e = (bits >> 23) as i32 - 127; // -6..=8
        let m = bits & 0x7f_ffff;
        let (hi, rem) = (m >> 20, m & 0xf_ffff);
        let up = rem > 0x8_0000 || (rem == 0x8_0000 && hi & 1 == 1);
        let code = (((e + 7) as u32) << 3) + hi + up as u32;
        code.min(0x7e) as u8
    };
    sign | code
}

/// Values per MXFP4 block (one e8m0 scale each).
pub const MXFP4_BLOCK: usize = 32;

/// The e2m1 values of the 16 nibbles, doubled so that they are integers (-12..=12).
pub const MXFP4_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// [`MXFP4_DOUBLED`] as f32, nibble 8 being -0.0 as in the e2m1 encoding (and transformers'
/// dequantization), so that decoded weights keep the sign of zero.
const MXFP4_DOUBLED_F32: [f32; 16] =
    [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, -0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0];

/// Half the value of an e8m0 scale byte, 2^(e - 128), exactly (e < 2 give f32 subnormals):
/// the factor of the doubled values [`MXFP4_DOUBLED`].
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { ((e as u32) - 1) << 23 };
    f32::from_bits(bits)
}

#[inline]
fn round4(n: usize) -> usize {
    n.div_ceil(4) * 4
}

impl DType {
    /// Bytes of one stored row of `cols` values (None on overflow or a zero group size).
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        match self {
            DType::F32 => cols.checked_mul(4),
            DType::BF16 | DType::F16 => cols.checked_mul(2),
            DType::Int8 { group } | DType::Int4 { group } => {
                if group == 0 {
                    return None;
                }
                let groups = cols.div_ceil(group as usize);
                let values = if matches!(self, DType::Int8 { .. }) { cols } else { cols.div_ceil(2) };
                round4(groups.checked_mul(2)?).checked_add(round4(values))
            }
            DType::Mxfp4 if cols.is_multiple_of(MXFP4_BLOCK) => Some(round4(cols / MXFP4_BLOCK) + cols / 2),
            DType::Mxfp4 => None,
            DType::U8 | DType::F8E4M3 => Some(cols),
            DType::Fp8 { block: 0 } => None,
            DType::Fp8 { block } => cols.div_ceil(block as usize).checked_mul(4)?.checked_add(round4(cols)),
            DType::Q4K if cols.is_multiple_of(Q4K_BLOCK) => Some(cols / Q4K_BLOCK * 16 + cols / 2),
            DType::Q4K => None,
            DType::Q5K if cols.is_multiple_of(Q4K_BLOCK) => Some(cols / Q4K_BLOCK * 48 + cols / 2),
            DType::Q5K => None,
        }
    }

    /// Parses a safetensors dtype string ("F32", "BF16", "F16").
    pub fn from_safetensors(s: &str) -> Option<Self> {
        match s {
            "F32" => Some(DType::F32),
            "BF16" => Some(DType::BF16),
            "F16" => Some(DType::F16),
            // e8m0 scale bytes (`float8_e8m0fnu`): raw bytes, read as powers of two where
            // they are an FP8 weight's `_scale_inv` (format::fp8).
            "U8" | "F8_E8M0" => Some(DType::U8),
            "F8_E4M3" => Some(DType::F8E4M3),
            _ => None,
        }
    }

    /// Parses a colibri dtype name ("f32", "bf16", "f16", "int8", "int4"); the integer
    /// types need a group size.
    pub fn from_name(s: &str, group: Option<u32>) -> Option<Self> {
        match (s, group) {
            ("f32", None) => Some(DType::F32),
            ("bf16", None) => Some(DType::BF16),
            ("f16", None) => Some(DType::F16),
            ("int8", Some(g)) if g > 0 => Some(DType::Int8 { group: g }),
            ("int4", Some(g)) if g > 0 => Some(DType::Int4 { group: g }),
            ("mxfp4", None) => Some(DType::Mxfp4),
            ("u8", None) => Some(DType::U8),
            ("fp8", Some(b)) if b > 0 => Some(DType::Fp8 { block: b }),
            ("f8_e4m3", None) => Some(DType::F8E4M3),
            ("q4_k", None) => Some(DType::Q4K),
            ("q5_k", None) => Some(DType::Q5K),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::Int8 { .. } => "int8",
            DType::Int4 { .. } => "int4",
            DType::Mxfp4 => "mxfp4",
            DType::U8 => "u8",
            DType::Fp8 { .. } => "fp8",
            DType::F8E4M3 => "f8_e4m3",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
        }
    }

    /// The scale block (columns per f32 scale) of an FP8 row.
    pub fn fp8_block(self) -> Option<u32> {
        match self {
            DType::Fp8 { block } => Some(block),
            _ => None,
        }
    }

    /// The quantization group size, for the integer types.
    pub fn group(self) -> Option<u32> {
        match self {
            DType::Int8 { group } | DType::Int4 { group } => Some(group),
            _ => None,
        }
    }

    pub fn is_quantized(self) -> bool {
        self.group().is_some()
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.group(), self.fp8_block()) {
            (Some(g), _) => write!(f, "{}/g{g}", self.name()),
            (_, Some(b)) => write!(f, "{}/b{b}", self.name()),
            _ => f.write_str(self.name()),
        }
    }
}

/// A cheap, shareable view into bytes owned elsewhere (an mmap or a Vec), or a placeholder
/// for bytes that are not in memory at all ([`Bytes::elsewhere`]).
#[derive(Clone)]
pub struct Bytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
    /// For a placeholder: where its first byte sits in the model's data file; [`IN_MEMORY`]
    /// for bytes in memory (a sentinel, not an Option: this keeps Bytes at 40 bytes).
    at: u64,
}

/// `Bytes::at` of bytes in memory.
const IN_MEMORY: u64 = u64::MAX;

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.file_offset() {
            Some(at) => write!(f, "Bytes({} bytes at {at} of the data file, not in memory)", self.len),
            None => write!(f, "Bytes({} bytes)", self.len),
        }
    }
}

impl Bytes {
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        let len = (*owner).as_ref().len();
        Bytes { owner, start: 0, len, at: IN_MEMORY }
    }

    pub fn from_vec(v: Vec<u8>) -> Self {
        Bytes::new(Arc::new(v))
    }

    /// A placeholder for the `len` bytes at offset `at` of the model's data file that are
    /// not read into memory: a weight that goes from its source straight to a GPU buffer
    /// (`gpu::stream`). It has a length and slices like any other, but no contents:
    /// [`Bytes::as_ref`] gives an empty slice, so code that reads weights must check
    /// [`Bytes::is_elsewhere`] first (the CPU forward pass refuses such a model).
    pub fn elsewhere(at: u64, len: usize) -> Self {
        Bytes { owner: Arc::new(Vec::<u8>::new()), start: 0, len, at: at.min(IN_MEMORY - 1) }
    }

    /// Whether these bytes are a placeholder, not in memory.
    pub fn is_elsewhere(&self) -> bool {
        self.at != IN_MEMORY
    }

    /// Where a placeholder's first byte sits in the data file (None for bytes in memory).
    pub fn file_offset(&self) -> Option<u64> {
        self.is_elsewhere().then_some(self.at)
    }

    /// A sub-range; errors if it runs past the end.
    pub fn slice(&self, start: usize, len: usize) -> Result<Bytes> {
        match start.checked_add(len) {
            Some(end) if end <= self.len => match self.file_offset() {
                Some(at) => Ok(Bytes::elsewhere(at + start as u64, len)),
                None => Ok(Bytes { owner: self.owner.clone(), start: self.start + start, len, at: IN_MEMORY }),
            },
            _ => Err(Error::Invalid(format!("byte range {start}+{len} is outside a buffer of {} bytes", self.len))),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether both are the same bytes (the same view of one buffer, or placeholders of
    /// the same range), as a tied embedding and lm_head are.
    pub fn same(&self, other: &Bytes) -> bool {
        match (self.file_offset(), other.file_offset()) {
            (Some(a), Some(b)) => a == b && self.len == other.len,
            (None, None) => self.len == other.len && std::ptr::eq(self.as_ref().as_ptr(), other.as_ref().as_ptr()),
            _ => false,
        }
    }
}

impl AsRef<[u8]> for Bytes {
    /// The bytes; empty for a placeholder ([`Bytes::elsewhere`]).
    fn as_ref(&self) -> &[u8] {
        if self.is_elsewhere() {
            return &[];
        }
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
}

/// Decode little-endian float elements of `dtype` into f32 (exact for all three types).
/// Quantized types are decoded a row at a time by [`decode_row`]; here they leave `out` as is.
pub fn decode_into(dtype: DType, src: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        DType::U8 => {
            for (o, b) in out.iter_mut().zip(src) {
                *o = *b as f32;
            }
        }
        DType::F8E4M3 => {
            for (o, b) in out.iter_mut().zip(src) {
                *o = E4M3[*b as usize];
            }
        }
        DType::Int8 { .. } | DType::Int4 { .. } | DType::Mxfp4 | DType::Fp8 { .. } | DType::Q4K | DType::Q5K => {}
    }
}

/// Decode one MXFP4 row (`cols` a multiple of 32) into `out[..cols]`, exactly.
fn decode_mxfp4_row(cols: usize, src: &[u8], out: &mut [f32]) {
    let blocks = cols / MXFP4_BLOCK;
    let (scales, q) = src.split_at(round4(blocks));
    for b in 0..blocks {
        let s = e8m0_half(scales[b]);
        let dst = &mut out[b * MXFP4_BLOCK..(b + 1) * MXFP4_BLOCK];
        for (o, &byte) in dst.chunks_exact_mut(2).zip(&q[b * 16..(b + 1) * 16]) {
            o[0] = MXFP4_DOUBLED_F32[(byte & 15) as usize] * s;
            o[1] = MXFP4_DOUBLED_F32[(byte >> 4) as usize] * s;
        }
    }
}

/// Decode one Q4K (`!five`) or Q5K row (`cols` a multiple of 256) into `out[..cols]`:
/// `A_j * u - B_j`.
fn decode_k_row(five: bool, cols: usize, src: &[u8], out: &mut [f32]) {
    let runs = cols / Q4K_BLOCK;
    let (heads, q) = src.split_at(runs * 16);
    let (q, high) = q.split_at(cols / 2);
    for (k, head) in heads.chunks_exact(16).enumerate() {
        let (a, b) = q4k_scales(head);
        for (i, o) in out[k * Q4K_BLOCK..(k + 1) * Q4K_BLOCK].iter_mut().enumerate() {
            let byte = q[(k * Q4K_BLOCK + i) / 2];
            let mut u = if i % 2 == 0 { byte & 15 } else { byte >> 4 };
            if five {
                let (at, bit) = q5k_bit(i);
                u |= ((high[32 * k + at] >> bit) & 1) << 4;
            }
            *o = a[i / 32] * u as f32 - b[i / 32];
        }
    }
}

/// Decode one FP8 row (scale block `block`) into `out[..cols]`: `E4M3[byte] * scale`.
fn decode_fp8_row(block: usize, cols: usize, src: &[u8], out: &mut [f32]) {
    let nb = cols.div_ceil(block);
    let (scales, q) = src.split_at(4 * nb);
    for (b, s) in scales.chunks_exact(4).enumerate() {
        let s = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let (start, end) = (b * block, ((b + 1) * block).min(cols));
        for (o, &byte) in out[start..end].iter_mut().zip(&q[start..end]) {
            *o = E4M3[byte as usize] * s;
        }
    }
}

/// Decode one stored row (`dtype.row_bytes(cols)` bytes) into `out[..cols]`, exactly.
#[inline]
pub fn decode_row(dtype: DType, cols: usize, src: &[u8], out: &mut [f32]) {
    let (group, int4) = match dtype {
        DType::Int8 { group } => (group as usize, false),
        DType::Int4 { group } => (group as usize, true),
        DType::Mxfp4 => return decode_mxfp4_row(cols, src, out),
        DType::Fp8 { block } => return decode_fp8_row(block as usize, cols, src, out),
        DType::Q4K => return decode_k_row(false, cols, src, out),
        DType::Q5K => return decode_k_row(true, cols, src, out),
        _ => return decode_into(dtype, src, &mut out[..cols]),
    };
    let groups = cols.div_ceil(group);
    let (scales, q) = src.split_at(round4(groups * 2));
    for g in 0..groups {
        let s = f16::from_bits(u16::from_le_bytes([scales[2 * g], scales[2 * g + 1]])).to_f32();
        let (start, end) = (g * group, ((g + 1) * group).min(cols));
        let dst = &mut out[start..end];
        if int4 && start % 2 == 0 {
            // Two values per byte, low nibble first; same arithmetic as the general path.
            let bytes = &q[start / 2..end.div_ceil(2)];
            let mut pairs = dst.chunks_exact_mut(2);
            for (o, &b) in (&mut pairs).zip(bytes) {
                o[0] = ((b & 15) as i32 - 8) as f32 * s;
                o[1] = ((b >> 4) as i32 - 8) as f32 * s;
            }
            if let [last] = pairs.into_remainder() {
                *last = ((bytes[bytes.len() - 1] & 15) as i32 - 8) as f32 * s;
            }
        } else if int4 {
            for (k, o) in dst.iter_mut().enumerate() {
                let c = start + k;
                let b = q[c >> 1];
                let nib = if c & 1 == 0 { b & 15 } else { b >> 4 };
                *o = (nib as i32 - 8) as f32 * s;
            }
        } else {
            for (o, &b) in dst.iter_mut().zip(&q[start..end]) {
                *o = (b as i8) as f32 * s;
            }
        }
    }
}

/// A row-major `[rows, cols]` weight matrix (PyTorch `nn.Linear.weight` layout:
/// one row per output feature).
#[derive(Clone, Debug)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub dtype: DType,
    pub bytes: Bytes,
}

/// Largest quantization group a matrix may have: the integer kernels (crate::qdot) need
/// |isum_b| <= 127 * 127 * G below 2^24 so that f32(isum_b) is exact (127 * 127 * 1024 < 2^24).
pub const MAX_GROUP: usize = 1024;

impl Mat {
    pub fn new(rows: usize, cols: usize, dtype: DType, bytes: Bytes) -> Result<Self> {
        let want = dtype.row_bytes(cols).and_then(|rb| rb.checked_mul(rows)).ok_or_else(|| {
            Error::Invalid(format!("matrix [{rows}, {cols}] of {dtype}: size overflows or bad group size"))
        })?;
        if let Some(g) = dtype.group() {
            if g as usize > MAX_GROUP {
                return Err(Error::Invalid(format!(
                    "matrix [{rows}, {cols}] of {dtype}: quantization groups above {} values are not supported \
                     (re-run coli convert with a smaller --group-size)",
                    MAX_GROUP
                )));
            }
        }
        if bytes.len() != want {
            return Err(Error::Invalid(format!(
                "matrix [{rows}, {cols}] of {dtype} needs {want} bytes, got {}",
                bytes.len()
            )));
        }
        Ok(Mat { rows, cols, dtype, bytes })
    }

    /// An f32 matrix owning its data (tests, derived weights).
    pub fn from_f32(rows: usize, cols: usize, data: &[f32]) -> Result<Self> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        Mat::new(rows, cols, DType::F32, Bytes::from_vec(bytes))
    }

    /// Rows `start..start+n` as their own matrix (no copy).
    pub fn row_block(&self, start: usize, n: usize) -> Result<Mat> {
        let rb = self.row_bytes();
        Mat::new(n, self.cols, self.dtype, self.bytes.slice(start * rb, n * rb)?)
    }

    /// Decode row `r` into `out[..cols]`. `r` must be < rows (checked by callers'
    /// shapes, validated at load time).
    #[inline]
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        let src = &self.bytes.as_ref()[r * rb..(r + 1) * rb];
        decode_row(self.dtype, self.cols, src, out);
    }

    /// Bytes of one stored row (validated by [`Mat::new`]).
    #[inline]
    pub fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.cols).unwrap_or(0)
    }

    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        for (r, o) in out.chunks_exact_mut(self.cols.max(1)).enumerate().take(self.rows) {
            self.row_into(r, o);
        }
        out
    }

    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_all_dtypes_exactly() {
        let vals = [1.5f32, -2.25, 0.0, 65504.0];
        let f32b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bf: Vec<u8> = vals.iter().flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes()).collect();
        let hf: Vec<u8> = vals.iter().flat_map(|v| f16::from_f32(*v).to_bits().to_le_bytes()).collect();
        for (dt, b) in [(DType::F32, f32b), (DType::BF16, bf), (DType::F16, hf)] {
            let m = Mat::new(2, 2, dt, Bytes::from_vec(b)).unwrap();
            assert_eq!(
                m.to_f32(),
                vals.iter()
                    .map(|v| if dt == DType::BF16 { bf16::from_f32(*v).to_f32() } else { *v })
                    .collect::<Vec<_>>()
            );
            let mut row = [0.0; 2];
            m.row_into(1, &mut row);
            assert_eq!(row[0], 0.0);
        }
    }

    #[test]
    fn quantized_matrices_decode_rows_and_blocks() {
        // 3 rows of 5 values, int4 group 2 and int8 group 4: row layout is scales then values.
        let dt = DType::Int4 { group: 2 };
        assert_eq!(dt.row_bytes(5), Some(8 + 4));
        let mut bytes = Vec::new();
        for r in 0..3u8 {
            for g in 0..3u16 {
                bytes.extend(f16::from_f32(0.5 * (g + 1) as f32).to_bits().to_le_bytes());
            }
            bytes.extend([0, 0]);
            // q = -8, 7, r-8+... as nibbles (u = q + 8), low nibble first.
            bytes.extend([0xF0, 0x08 | (r << 4), 0x01, 0]);
        }
        let m = Mat::new(3, 5, dt, Bytes::from_vec(bytes)).unwrap();
        let mut row = [0.0; 5];
        m.row_into(1, &mut row);
        assert_eq!(row, [-8.0 * 0.5, 7.0 * 0.5, 0.0, (1.0 - 8.0) * 1.0, -7.0 * 1.5]);
        let block = m.row_block(1, 2).unwrap();
        assert_eq!(block.to_f32()[..5], row);
        assert_eq!(m.to_f32()[5..10], row);
        assert!(Mat::new(3, 5, dt, Bytes::from_vec(vec![0; 35])).is_err());
        assert!(Mat::new(1, 5, DType::Int8 { group: 0 }, Bytes::from_vec(vec![0; 8])).is_err());
        let i8m = Mat::new(
            1,
            5,
            DType::Int8 { group: 4 },
            Bytes::from_vec(vec![0x00, 0x40, 0x00, 0x3C, 0x81, 0x7F, 0xFF, 0x01, 3, 0, 0, 0]),
        )
        .unwrap();
        assert_eq!(i8m.to_f32(), vec![-254.0, 254.0, -2.0, 2.0, 3.0]);
    }

    #[test]
    fn int4_decode_matches_the_format_formula() {
        for (group, cols) in [(8usize, 37usize), (3, 10), (64, 96), (2, 1)] {
            let dt = DType::Int4 { group: group as u32 };
            let rb = dt.row_bytes(cols).unwrap();
            let mut seed = 11u32;
            let bytes: Vec<u8> = (0..rb)
                .map(|_| {
                    seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                    (seed >> 24) as u8 & 0x3B // keep scales finite: clear the f16 exponent's top bit
                })
                .collect();
            let mut out = vec![0.0; cols];
            decode_row(dt, cols, &bytes, &mut out);
            let sb = (cols.div_ceil(group) * 2).div_ceil(4) * 4;
            for (c, o) in out.iter().enumerate() {
                let g = c / group;
                let s = f16::from_bits(u16::from_le_bytes([bytes[2 * g], bytes[2 * g + 1]])).to_f32();
                let b = bytes[sb + c / 2];
                let q = if c % 2 == 0 { b & 15 } else { b >> 4 } as i32 - 8;
                assert_eq!(o.to_bits(), (q as f32 * s).to_bits(), "group {group} cols {cols} [{c}]");
            }
        }
    }

    #[test]
    fn mxfp4_rows_decode_to_the_e2m1_values_times_the_scale() {
        // One row of 64: scales 2^(127-127) = 1 and 2^(120-127), then 2 x 16 nibble bytes.
        assert_eq!(DType::Mxfp4.row_bytes(64), Some(4 + 32));
        assert_eq!(DType::Mxfp4.row_bytes(48), None);
        let mut bytes = vec![127u8, 120, 0, 0];
        bytes.extend((0..32u8).map(|j| j.wrapping_mul(37)));
        let m = Mat::new(1, 64, DType::Mxfp4, Bytes::from_vec(bytes.clone())).unwrap();
        let e2m1 = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
        for (c, v) in m.to_f32().iter().enumerate() {
            let byte = bytes[4 + c / 2];
            let nib = if c % 2 == 0 { byte & 15 } else { byte >> 4 };
            let scale = if c < 32 { 1.0 } else { (2.0f32).powi(-7) };
            assert_eq!(v.to_bits(), (e2m1[nib as usize] * scale).to_bits(), "[{c}]");
        }
        assert_eq!(e8m0_half(0).to_bits(), 0x0020_0000, "2^-128, a subnormal");
        assert_eq!(e8m0_half(255), 2.0f32.powi(127));
        assert_eq!(DType::from_safetensors("U8"), Some(DType::U8));
        assert_eq!(DType::from_name("mxfp4", None), Some(DType::Mxfp4));
    }

    #[test]
    fn e4m3_bytes_decode_exactly_and_round_trip() {
        // Against the format's definition, computed in f64 independently of the table.
        for b in 0..=255u8 {
            let (s, e, m) = (b >> 7, (b >> 3) & 15, b & 7);
            let v = E4M3[b as usize];
            if e == 15 && m == 7 {
                assert!(v.is_nan(), "{b:#x} is NaN");
                assert_eq!(e4m3_from_f32(v), 0x7f);
                continue;
            }
            let mag = if e == 0 { m as f64 / 512.0 } else { (1.0 + m as f64 / 8.0) * 2f64.powi(e as i32 - 7) };
            let want = if s == 1 { -mag } else { mag };
            assert_eq!(v as f64, want, "{b:#x}");
            assert_eq!(v.is_sign_negative(), s == 1, "{b:#x}: sign of zero kept");
            assert_eq!(e4m3_from_f32(v), b, "{b:#x} round-trips");
        }
        assert_eq!((E4M3[0x7e], E4M3[0x08], E4M3[0x01], E4M3[0xfe]), (448.0, 1.0 / 64.0, 1.0 / 512.0, -448.0));
        // Ties to even, saturation, subnormal rounding.
        assert_eq!(e4m3_from_f32(1.0625), 0x38, "1 + 1/16 is halfway between 1 and 1.125: even");
        assert_eq!(e4m3_from_f32(1.1875), 0x3a, "halfway between 1.125 and 1.25: even");
        assert_eq!((e4m3_from_f32(1e9), e4m3_from_f32(-500.0)), (0x7e, 0xfe));
        assert_eq!(e4m3_from_f32(1.5 / 512.0), 0x02, "1.5 subnormal steps: even");
        assert_eq!(e4m3_from_f32(0.2 / 512.0), 0x00);
    }

    #[test]
    fn fp8_rows_decode_to_e4m3_times_their_block_scale() {
        // 37 columns in blocks of 16: scales for 16, 16 and 5 columns, then 37 bytes + 3 pad.
        let dt = DType::Fp8 { block: 16 };
        assert_eq!(dt.row_bytes(37), Some(12 + 40));
        assert_eq!(DType::Fp8 { block: 0 }.row_bytes(37), None);
        assert_eq!((dt.to_string(), DType::from_name("fp8", Some(16))), ("fp8/b16".to_string(), Some(dt)));
        let scales = [0.5f32, -3.0e-3, 7.0];
        let mut row: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        row.extend((0..37u8).map(|c| c.wrapping_mul(71)));
        row.extend([0, 0, 0]);
        let m = Mat::new(1, 37, dt, Bytes::from_vec(row.clone())).unwrap();
        for (c, v) in m.to_f32().iter().enumerate() {
            let want = E4M3[row[12 + c] as usize] * scales[c / 16];
            assert_eq!(v.to_bits(), want.to_bits(), "[{c}]");
        }
        let mut raw = [0.0f32; 2];
        decode_into(DType::F8E4M3, &[0x38, 0xb8], &mut raw);
        assert_eq!(raw, [1.0, -1.0]);
        assert_eq!(DType::from_safetensors("F8_E4M3"), Some(DType::F8E4M3));
        assert_eq!(DType::from_safetensors("F8_E8M0"), Some(DType::U8), "e8m0 scale bytes");
    }

    #[test]
    fn wrong_size_and_out_of_range_slices_are_errors() {
        assert!(Mat::new(2, 3, DType::F32, Bytes::from_vec(vec![0; 20])).is_err());
        let b = Bytes::from_vec(vec![0; 8]);
        assert!(b.slice(4, 5).is_err());
        assert!(b.slice(usize::MAX, 2).is_err());
        assert_eq!(b.slice(2, 6).unwrap().len(), 6);
    }

    #[test]
    fn placeholders_slice_by_file_offset_and_hold_nothing() {
        let p = Bytes::elsewhere(4096, 100);
        assert!(p.is_elsewhere() && p.as_ref().is_empty() && p.len() == 100);
        let s = p.slice(10, 20).unwrap();
        assert_eq!((s.file_offset(), s.len()), (Some(4106), 20));
        assert!(p.slice(90, 11).is_err());
        assert!(s.same(&Bytes::elsewhere(4106, 20)) && !s.same(&Bytes::elsewhere(4106, 21)));
        let m = Mat::new(5, 5, DType::F32, p).unwrap();
        assert_eq!(m.row_block(2, 1).unwrap().bytes.file_offset(), Some(4096 + 40));
        let b = Bytes::from_vec(vec![1; 8]);
        assert!(b.same(&b.clone()) && !b.same(&b.slice(0, 4).unwrap()) && !b.same(&Bytes::from_vec(vec![1; 8])));
        assert!(!b.is_elsewhere() && b.file_offset().is_none());
    }
}
