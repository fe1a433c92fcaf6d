use super::*;

/// A small GGUF writer for tests: metadata pairs (already encoded) and tensors.
pub(crate) struct Writer {
    pub kv: Vec<(String, u32, Vec<u8>)>,
    pub tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

pub(crate) fn gstr(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

impl Writer {
    pub fn new() -> Self {
        Writer { kv: Vec::new(), tensors: Vec::new() }
    }

    pub fn u32(mut self, k: &str, v: u32) -> Self {
        self.kv.push((k.into(), 4, v.to_le_bytes().to_vec()));
        self
    }

    pub fn string(mut self, k: &str, v: &str) -> Self {
        self.kv.push((k.into(), 8, gstr(v)));
        self
    }

    pub fn tensor(mut self, name: &str, ne: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors.push((name.into(), ne.to_vec(), ty, data));
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, t, v) in &self.kv {
            out.extend(gstr(k));
            out.extend(t.to_le_bytes());
            out.extend(v);
        }
        let mut offset = 0u64;
        for (name, ne, ty, data) in &self.tensors {
            out.extend(gstr(name));
            out.extend((ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        for (_, _, _, data) in &self.tensors {
            out.extend(data);
            while !out.len().is_multiple_of(32) {
                out.push(0);
            }
        }
        out
    }
}

fn sample() -> Vec<u8> {
    let w: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    Writer::new()
        .string("general.architecture", "qwen3moe")
        .u32("qwen3moe.block_count", 2)
        .tensor("a", &[3, 2], 0, w)
        .tensor("b", &[32], 8, vec![1; 34])
        .bytes()
}

fn err(bytes: &[u8]) -> String {
    let e = Gguf::parse(bytes, "x.gguf").unwrap_err().to_string();
    assert!(e.starts_with("x.gguf: not a valid GGUF file: "), "{e}");
    assert!(!e.contains('\n'), "{e}");
    e
}

#[test]
fn parses_metadata_and_tensors() {
    let bytes = sample();
    let g = Gguf::parse(&bytes, "x.gguf").unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.get("general.architecture").and_then(Value::as_str), Some("qwen3moe"));
    assert_eq!(g.get("qwen3moe.block_count").and_then(Value::as_i64), Some(2));
    let a = g.tensor("a").unwrap();
    assert_eq!((a.shape(), a.size, a.ty.name), (vec![2, 3], 24, "F32"));
    let data = &bytes[a.offset as usize..(a.offset + a.size) as usize];
    assert_eq!(f32::from_le_bytes(data[20..24].try_into().unwrap()), 5.0);
    let b = g.tensor("b").unwrap();
    assert_eq!((b.size, b.offset - g.data_start), (34, 32));
}

#[test]
fn every_truncation_is_one_clear_error() {
    let bytes = sample();
    let g = Gguf::parse(&bytes, "x.gguf").unwrap();
    let end_of_data = (g.tensors[1].offset + g.tensors[1].size) as usize;
    for n in 0..end_of_data {
        let e = err(&bytes[..n]);
        assert!(e.contains("truncated") || e.contains("too short") || e.contains("more than the file"), "{n}: {e}");
    }
}

#[test]
fn hostile_headers_are_refused() {
    let good = sample();
    let mut b = good.clone();
    b[0] = b'X';
    assert!(err(&b).contains("magic"));
    for (v, want) in [(1u32, "version 1"), (7, "version 7"), (0x0300_0000, "big-endian")] {
        let mut b = good.clone();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        assert!(err(&b).contains(want), "{v}");
    }
    // Huge tensor and metadata counts.
    let mut b = good.clone();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(&b).contains("tensor count"));
    let mut b = good.clone();
    b[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(err(&b).contains("metadata count"));
    // A huge string length (the first key's).
    let mut b = good.clone();
    b[24..32].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    assert!(err(&b).contains("more than the file holds"));

    // A tensor offset past the end, and one that wraps around.
    for off in [1u64 << 20, u64::MAX - 31] {
        let w: Vec<u8> = vec![0; 24];
        let mut bytes = Writer::new().tensor("a", &[3, 2], 0, w).bytes();
        // The offset is the last u64 of the only tensor entry: header, name, n_dims,
        // two dims, type, offset.
        let entry_end = 24 + 8 + 1 + 4 + 16 + 4 + 8;
        bytes[entry_end - 8..entry_end].copy_from_slice(&off.to_le_bytes());
        assert!(err(&bytes).contains("runs past the end"), "{off}");
    }
    // Dimensions whose product overflows, too many dimensions, an unknown type,
    // rows that are not whole blocks, a misaligned offset.
    let e = err(&Writer::new().tensor("a", &[1 << 32, 1 << 32, 1 << 32], 0, vec![]).bytes());
    assert!(e.contains("overflows"), "{e}");
    let e = err(&Writer::new().tensor("a", &[1, 1, 1, 1, 1], 0, vec![0; 4]).bytes());
    assert!(e.contains("5 dimensions"), "{e}");
    let e = err(&Writer::new().tensor("a", &[1], 99, vec![0; 4]).bytes());
    assert!(e.contains("unknown ggml type 99"), "{e}");
    let e = err(&Writer::new().tensor("a", &[31], 8, vec![0; 34]).bytes());
    assert!(e.contains("not a multiple"), "{e}");
    let e = err(&Writer::new().tensor("a", &[1], 0, vec![0; 4]).tensor("a", &[1], 0, vec![0; 4]).bytes());
    assert!(e.contains("appears twice"), "{e}");
    let e = err(&Writer::new().u32("general.alignment", 24).bytes());
    assert!(e.contains("power of two"), "{e}");
    let e = err(&Writer::new().u32("k", 1).u32("k", 2).bytes());
    assert!(e.contains("appears twice"), "{e}");
}

#[test]
fn arrays_are_bounded_by_the_file() {
    // An array of u64::MAX / 8 strings claims more bytes than there are.
    let mut v = 8u32.to_le_bytes().to_vec();
    v.extend((u64::MAX / 8).to_le_bytes());
    let mut w = Writer::new();
    w.kv.push(("tokenizer.ggml.tokens".into(), 9, v));
    assert!(err(&w.bytes()).contains("count"));
    // A well-formed array of strings and one of i32.
    let mut v = 8u32.to_le_bytes().to_vec();
    v.extend(2u64.to_le_bytes());
    v.extend(gstr("a"));
    v.extend(gstr("bc"));
    let mut i = 5u32.to_le_bytes().to_vec();
    i.extend(3u64.to_le_bytes());
    for x in [1i32, -2, 3] {
        i.extend(x.to_le_bytes());
    }
    let mut w = Writer::new();
    w.kv.push(("s".into(), 9, v));
    w.kv.push(("i".into(), 9, i));
    let g = Gguf::parse(&w.bytes(), "x").unwrap();
    assert_eq!(g.get("s"), Some(&Value::Array(Array::Str(vec!["a".into(), "bc".into()]))));
    match g.get("i") {
        Some(Value::Array(a)) => assert_eq!(a.to_i64(), Some(vec![1, -2, 3])),
        other => panic!("{other:?}"),
    }
}

#[test]
fn reads_the_llama_cpp_fixtures() {
    for (name, arch, n) in
        [("olmoe-f16", "olmoe", 27), ("mixtral-f16", "llama", 33), ("qwen3moe-q4_0-q8_0", "qwen3moe", 27)]
    {
        let path = format!("{}/../tests/fixtures/gguf/{name}.gguf", env!("CARGO_MANIFEST_DIR"));
        let bytes = std::fs::read(&path).unwrap();
        let g = Gguf::parse(&bytes, &path).unwrap();
        assert_eq!(g.get("general.architecture").and_then(Value::as_str), Some(arch));
        assert_eq!(g.tensors.len(), n, "{name}");
    }
}
