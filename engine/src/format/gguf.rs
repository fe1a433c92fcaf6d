//! Reading GGUF, llama.cpp's single-file model format (version 2 and 3, little-endian):
//!
//! ```text
//! "GGUF" u32 version, u64 tensor_count, u64 kv_count
//! kv_count x  (string key, u32 value_type, value)       string = u64 length + UTF-8 bytes
//! tensor_count x (string name, u32 n_dims, n_dims x u64 ne, u32 ggml_type, u64 offset)
//! padding to general.alignment (default 32), then the tensor data; offsets are relative
//! to its start and multiples of the alignment
//! ```
//!
//! Nothing in the file is trusted: every count, length and offset is checked against the
//! bytes that are really there with checked arithmetic before anything is allocated or
//! sliced (a tensor offset past the end is how llama.cpp's "Bleeding Llama" read out of
//! bounds). A metadata array of n elements needs at least n bytes of file, so allocations
//! stay within a small multiple of the file size. Every failure is one line naming the
//! file and the offending field.

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// Largest tensor rank ggml has (GGML_MAX_DIMS).
pub const MAX_DIMS: usize = 4;
/// The default (and usual) data alignment.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A ggml tensor type: its id, name, values per block and bytes per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType {
    pub id: u32,
    pub name: &'static str,
    pub block: u64,
    pub block_bytes: u64,
}

/// Every type ggml defines (ggml/src/ggml-common.h, gguf-py's GGML_QUANT_SIZES), so any
/// file's sizes can be checked; which of them colibri can convert is decided elsewhere.
const TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        TYPES.iter().find(|t| t.0 == id).map(|&(id, name, block, block_bytes)| GgmlType {
            id,
            name,
            block,
            block_bytes,
        })
    }

    pub fn by_name(name: &str) -> Option<Self> {
        TYPES.iter().find(|t| t.1 == name).and_then(|t| Self::from_id(t.0))
    }

    /// Bytes of `n` values (None if `n` is not a whole number of blocks or on overflow).
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        if !n.is_multiple_of(self.block) {
            return None;
        }
        (n / self.block).checked_mul(self.block_bytes)
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Array(Array),
}

/// A metadata array (one element type; nested arrays are refused).
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    /// An integer value of any width, if it fits i64 (bools are not integers here).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::I8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::Str(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Integer elements as i64 (None for strings, floats, bools, or a u64 above i64::MAX).
    pub fn to_i64(&self) -> Option<Vec<i64>> {
        Some(match self {
            Array::U8(v) => v.iter().map(|&x| x.into()).collect(),
            Array::I8(v) => v.iter().map(|&x| x.into()).collect(),
            Array::U16(v) => v.iter().map(|&x| x.into()).collect(),
            Array::I16(v) => v.iter().map(|&x| x.into()).collect(),
            Array::U32(v) => v.iter().map(|&x| x.into()).collect(),
            Array::I32(v) => v.iter().map(|&x| x.into()).collect(),
            Array::U64(v) => v.iter().map(|&x| i64::try_from(x).ok()).collect::<Option<_>>()?,
            Array::I64(v) => v.clone(),
            _ => return None,
        })
    }
}

/// One tensor: name, ggml type, `ne` (`ne[0]` is the row length: the reverse of PyTorch's
/// shape), absolute byte offset in the file and byte size.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    pub ne: Vec<u64>,
    pub offset: u64,
    pub size: u64,
    /// The file of a split GGUF that holds it ([`Gguf::join`]; 0 in a single file).
    pub part: usize,
}

impl TensorInfo {
    /// The shape in PyTorch's order (outermost first).
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
}

/// The parsed header of a GGUF file; tensor data stays in the caller's bytes.
#[derive(Clone, Debug)]
pub struct Gguf {
    pub version: u32,
    pub alignment: u64,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the tensor data section (of the first file).
    pub data_start: u64,
    /// Files the tensors are in: 1, or a split GGUF's part count once [`Gguf::join`]ed.
    pub parts: usize,
}

/// True if `bytes` starts like a GGUF file.
pub fn looks_like_gguf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"GGUF")
}

struct Cursor<'a> {
    /// The file's first bytes (all of it, or a prefix: [`Gguf::parse_prefix`]).
    buf: &'a [u8],
    pos: usize,
    origin: &'a str,
    /// The whole file's length, which counts and lengths are checked against.
    file_len: u64,
    /// Set when a read ran past `buf` but not past the file: more of it is needed.
    short: bool,
}

impl<'a> Cursor<'a> {
    fn err(&self, what: &str) -> Error {
        Error::Invalid(format!("{}: not a valid GGUF file: {what} (at byte {})", self.origin, self.pos))
    }

    /// Bytes of the file from the cursor on.
    fn remaining(&self) -> u64 {
        self.file_len.saturating_sub(self.pos as u64)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n as u64 > self.remaining() {
            return Err(self.err(&format!("{what} runs past the end of the file (truncated?)")));
        }
        if n > self.buf.len() - self.pos {
            self.short = true;
            return Err(self.err(&format!("{what} runs past the {} bytes read", self.buf.len())));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l as u64 <= self.remaining())
            .ok_or_else(|| self.err(&format!("{what} claims {len} bytes, more than the file holds")))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.err(&format!("{what} is not UTF-8")))
    }

    /// Checks that `count` elements of at least `min_size` bytes each can be in the file.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<usize> {
        match count.checked_mul(min_size) {
            Some(n) if n <= self.remaining() => Ok(count as usize),
            _ => Err(self.err(&format!("{what} count {count} is more than the file can hold"))),
        }
    }
}

macro_rules! read_vec {
    ($c:expr, $n:expr, $t:ty, $what:expr) => {{
        let size = std::mem::size_of::<$t>();
        let bytes = $c.take($n * size, $what)?;
        bytes.chunks_exact(size).map(|b| <$t>::from_le_bytes(b.try_into().unwrap_or_default())).collect::<Vec<$t>>()
    }};
}

fn scalar(c: &mut Cursor, ty: u32, what: &str) -> Result<Value> {
    Ok(match ty {
        0 => Value::U8(c.array::<1>(what)?[0]),
        1 => Value::I8(c.array::<1>(what)?[0] as i8),
        2 => Value::U16(u16::from_le_bytes(c.array(what)?)),
        3 => Value::I16(i16::from_le_bytes(c.array(what)?)),
        4 => Value::U32(c.u32(what)?),
        5 => Value::I32(i32::from_le_bytes(c.array(what)?)),
        6 => Value::F32(f32::from_le_bytes(c.array(what)?)),
        7 => match c.array::<1>(what)?[0] {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            b => return Err(c.err(&format!("{what}: bool byte {b}"))),
        },
        8 => Value::Str(c.string(what)?),
        10 => Value::U64(c.u64(what)?),
        11 => Value::I64(i64::from_le_bytes(c.array(what)?)),
        12 => Value::F64(f64::from_le_bytes(c.array(what)?)),
        9 => return Err(c.err(&format!("{what}: nested arrays are not supported"))),
        t => return Err(c.err(&format!("{what}: unknown value type {t}"))),
    })
}

fn value(c: &mut Cursor, what: &str) -> Result<Value> {
    let ty = c.u32(what)?;
    if ty != 9 {
        return scalar(c, ty, what);
    }
    let et = c.u32(what)?;
    let count = c.u64(what)?;
    let min = match et {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => return Err(c.err(&format!("{what}: nested arrays are not supported"))),
        t => return Err(c.err(&format!("{what}: unknown array element type {t}"))),
    };
    let n = c.check_count(count, min, what)?;
    Ok(Value::Array(match et {
        0 => Array::U8(c.take(n, what)?.to_vec()),
        1 => Array::I8(c.take(n, what)?.iter().map(|&b| b as i8).collect()),
        2 => Array::U16(read_vec!(c, n, u16, what)),
        3 => Array::I16(read_vec!(c, n, i16, what)),
        4 => Array::U32(read_vec!(c, n, u32, what)),
        5 => Array::I32(read_vec!(c, n, i32, what)),
        6 => Array::F32(read_vec!(c, n, f32, what)),
        10 => Array::U64(read_vec!(c, n, u64, what)),
        11 => Array::I64(read_vec!(c, n, i64, what)),
        12 => Array::F64(read_vec!(c, n, f64, what)),
        7 => Array::Bool(
            c.take(n, what)?
                .iter()
                .map(|&b| match b {
                    0 => Ok(false),
                    1 => Ok(true),
                    _ => Err(()),
                })
                .collect::<Result<_, ()>>()
                .map_err(|_| c.err(&format!("{what}: a bool element is neither 0 nor 1")))?,
        ),
        _ => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(c.string(what)?);
            }
            Array::Str(v)
        }
    }))
}

/// Checks that the tensors tile the data section as every GGUF writer lays them out
/// (gguf-py, llama.cpp, ollama): in offset order, each starts where the previous one ends,
/// rounded up to the alignment, the first at 0, and the section ends with the last one
/// plus at most its padding. So no two tensors share bytes (an overlap reads one tensor's
/// data as another's), no tensor's type and shape say fewer bytes than its region holds (a
/// swapped type: Q4_0 over Q8_0 data), and an alignment edited in the metadata, which moves
/// the data section's start, leaves bytes unaccounted for and is refused.
fn check_layout(tensors: &[TensorInfo], data_start: u64, data_len: u64, alignment: u64, origin: &str) -> Result<()> {
    let bad = |m: String| Err(Error::Invalid(format!("{origin}: not a valid GGUF file: {m}")));
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| (t.offset, t.size));
    let describe = |t: &TensorInfo| {
        format!(
            "tensor {} ({} bytes of {} for {:?} at data offset {})",
            t.name,
            t.size,
            t.ty.name,
            t.ne,
            t.offset - data_start
        )
    };
    // Offsets and sizes were checked against the data section, so nothing here overflows.
    let padded = |n: u64| n.div_ceil(alignment) * alignment;
    let mut end = 0u64;
    let mut prev: Option<&TensorInfo> = None;
    for t in order {
        let rel = t.offset - data_start;
        match prev {
            Some(p) if rel < end => return bad(format!("{} overlaps tensor {}", describe(t), p.name)),
            Some(p) if rel != padded(end) => {
                return bad(format!(
                "{} is followed by {} unused bytes before tensor {} (a wrong type or shape, or a changed alignment?)",
                describe(p),
                rel - end,
                t.name
            ))
            }
            None if rel != 0 => {
                return bad(format!(
                    "{} is not at the start of the tensor data: {rel} unused bytes before it (a changed alignment?)",
                    describe(t)
                ))
            }
            _ => {}
        }
        end = rel + t.size;
        prev = Some(t);
    }
    if let Some(last) = prev {
        if data_len > padded(end) {
            return bad(format!(
                "{} is followed by {} bytes to the end of the file, more than its padding to {alignment} (a wrong type or shape, or a changed alignment?)",
                describe(last),
                data_len - end
            ));
        }
    }
    Ok(())
}

impl Gguf {
    /// Parses the header of the GGUF file in `bytes` (the whole file: tensor ranges are
    /// checked against its length). `origin` names the file in errors.
    pub fn parse(bytes: &[u8], origin: &str) -> Result<Gguf> {
        Self::parse_prefix(bytes, bytes.len() as u64, origin)?
            .ok_or_else(|| Error::Invalid(format!("{origin}: not a valid GGUF file: its header is incomplete")))
    }

    /// [`Gguf::parse`] from the first bytes of a file of `file_len` bytes (tensor ranges
    /// are checked against `file_len`): None when the header runs past `prefix` (read more
    /// of the file and try again). How a file is parsed without mapping or reading it whole.
    pub fn parse_prefix(prefix: &[u8], file_len: u64, origin: &str) -> Result<Option<Gguf>> {
        let mut c = Cursor { buf: prefix, pos: 0, origin, file_len: file_len.max(prefix.len() as u64), short: false };
        match Self::parse_cursor(&mut c) {
            Err(_) if c.short => Ok(None),
            r => r.map(Some),
        }
    }

    fn parse_cursor(c: &mut Cursor) -> Result<Gguf> {
        let origin = c.origin;
        let magic = c.take(4, "the magic").map_err(|_| c.err("too short to be a GGUF file"))?;
        if magic != b"GGUF" {
            return Err(c.err("wrong magic (expected \"GGUF\")"));
        }
        let version = c.u32("the version")?;
        match version {
            2 | 3 => {}
            1 => return Err(c.err("version 1 is not supported (re-convert it with a current llama.cpp)")),
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                return Err(c.err("a big-endian file; only little-endian GGUF is supported"))
            }
            v => return Err(c.err(&format!("unsupported version {v} (expected 2 or 3)"))),
        }
        let n_tensors = c.u64("the tensor count")?;
        let n_kv = c.u64("the metadata count")?;
        // A key-value pair needs at least 8 + 4 + 1 bytes, a tensor entry 8 + 4 + 4 + 8 + 8.
        let n_kv = c.check_count(n_kv, 13, "metadata")?;
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = c.string(&format!("metadata key {i}"))?;
            let v = value(c, &format!("metadata {key:?}"))?;
            if metadata.insert(key.clone(), v).is_some() {
                return Err(c.err(&format!("metadata key {key:?} appears twice")));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => *a as u64,
            Some(v) => return Err(c.err(&format!("general.alignment {v:?} is not a power of two (u32)"))),
        };
        let n_tensors = c.check_count(n_tensors, 32, "tensor")?;
        let mut infos = Vec::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = c.string(&format!("the name of tensor {i}"))?;
            let what = format!("tensor {name}");
            let n_dims = c.u32(&what)? as usize;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(c.err(&format!("{what} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")));
            }
            let mut ne = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                ne.push(c.u64(&what)?);
            }
            let ty_id = c.u32(&what)?;
            let ty = GgmlType::from_id(ty_id).ok_or_else(|| c.err(&format!("{what} has unknown ggml type {ty_id}")))?;
            let rel = c.u64(&what)?;
            infos.push((name, ty, ne, rel));
        }
        let data_start = (c.pos as u64).div_ceil(alignment).saturating_mul(alignment);
        let file_len = c.file_len;
        if data_start > file_len && n_tensors > 0 {
            return Err(c.err("the tensor data section starts past the end of the file (truncated?)"));
        }
        let data_len = file_len.saturating_sub(data_start);
        let mut tensors = Vec::with_capacity(infos.len());
        let mut names = std::collections::HashSet::new();
        for (name, ty, ne, rel) in infos {
            let bad = |m: String| Error::Invalid(format!("{origin}: not a valid GGUF file: tensor {name} {m}"));
            if !names.insert(name.clone()) {
                return Err(bad("appears twice".into()));
            }
            let count =
                ne.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).ok_or_else(|| bad(format!("{ne:?} overflows")))?;
            if !ne[0].is_multiple_of(ty.block) {
                return Err(bad(format!(
                    "has rows of {} values, not a multiple of {}'s block of {}",
                    ne[0], ty.name, ty.block
                )));
            }
            let size = ty.bytes_for(count).ok_or_else(|| bad(format!("{ne:?} overflows")))?;
            if !rel.is_multiple_of(alignment) {
                return Err(bad(format!("offset {rel} is not a multiple of the alignment {alignment}")));
            }
            match rel.checked_add(size) {
                Some(end) if end <= data_len => {}
                _ => {
                    return Err(bad(format!(
                        "({} bytes at data offset {rel}) runs past the end of the file ({data_len} bytes of data; truncated?)",
                        size
                    )))
                }
            }
            tensors.push(TensorInfo { name, ty, ne, offset: data_start + rel, size, part: 0 });
        }
        check_layout(&tensors, data_start, data_len, alignment, origin)?;
        Ok(Gguf { version, alignment, metadata, tensors, data_start, parts: 1 })
    }

    /// `(split.no, split.count)` of this file: `(0, 1)` for a file that is not part of a
    /// split GGUF (llama.cpp's gguf-split, `NAME-00001-of-00003.gguf`).
    pub fn split(&self, origin: &str) -> Result<(usize, usize)> {
        let get = |k: &str| match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .filter(|&x| (0..=u16::MAX as i64).contains(&x))
                .map(|x| Some(x as usize))
                .ok_or_else(|| Error::Invalid(format!("{origin}: {k} is {v:?}, not a small non-negative integer"))),
        };
        match (get("split.no")?, get("split.count")?) {
            (None, None | Some(0 | 1)) => Ok((0, 1)),
            (Some(no), Some(n)) if no < n => Ok((no, n)),
            (no, n) => Err(Error::Invalid(format!("{origin}: split.no {no:?} of split.count {n:?} is not a part"))),
        }
    }

    /// The parts of a split GGUF, in order, as one GGUF: the first part's metadata and every
    /// part's tensors (each tensor remembers its part; its range was checked against that
    /// file by [`Gguf::parse`]). Each part must say it is part i of `parts.len()`, tensor
    /// names must be unique across parts, and their number must be the first part's
    /// `split.tensors.count`.
    pub fn join(parts: Vec<(Gguf, String)>) -> Result<Gguf> {
        let n = parts.len();
        let mut it = parts.into_iter();
        let (mut first, origin) = it.next().ok_or_else(|| Error::Invalid("a split GGUF of no parts".into()))?;
        if first.split(&origin)? != (0, n) {
            return Err(Error::Invalid(format!("{origin}: not the first of {n} parts of a split GGUF")));
        }
        let want = match first.get("split.tensors.count").and_then(Value::as_i64) {
            Some(c) if c >= 0 => c as u64,
            _ => return Err(Error::Invalid(format!("{origin}: a split GGUF without split.tensors.count"))),
        };
        let mut names: std::collections::HashSet<String> = first.tensors.iter().map(|t| t.name.clone()).collect();
        for (i, (g, origin)) in it.enumerate() {
            let i = i + 1;
            let (no, count) = g.split(&origin)?;
            if (no, count) != (i, n) {
                return Err(Error::Invalid(format!(
                    "{origin}: says it is part {} of {count}, expected part {} of {n}",
                    no + 1,
                    i + 1
                )));
            }
            for mut t in g.tensors {
                if !names.insert(t.name.clone()) {
                    return Err(Error::Invalid(format!("{origin}: tensor {} is in two parts", t.name)));
                }
                t.part = i;
                first.tensors.push(t);
            }
        }
        if first.tensors.len() as u64 != want {
            return Err(Error::Invalid(format!(
                "{origin}: the {n} parts hold {} tensors, split.tensors.count says {want}",
                first.tensors.len()
            )));
        }
        first.parts = n;
        Ok(first)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

#[cfg(test)]
#[path = "gguf_tests.rs"]
pub(crate) mod tests;
