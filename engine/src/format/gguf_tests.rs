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

/// The byte offset of tensor `name`'s entry fields in a file from [`Writer`]: (type, offset).
fn entry_fields(bytes: &[u8], name: &str) -> (usize, usize) {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let at = bytes.windows(key.len()).rposition(|w| w == key.as_slice()).unwrap() + key.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * n_dims;
    (ty, ty + 4)
}

#[test]
fn overlapping_tensors_are_refused() {
    // b's data moved onto a's: both would read the same bytes.
    let mut b = sample();
    let (_, off) = entry_fields(&b, "b");
    b[off..off + 8].copy_from_slice(&0u64.to_le_bytes());
    let e = err(&b);
    assert!(e.contains("tensor b (34 bytes of Q8_0") && e.contains("overlaps tensor a"), "{e}");
    // A tensor whose data runs into the next one's (its type says more bytes than its region).
    let w = Writer::new().tensor("a", &[32], 1, vec![1; 64]).tensor("b", &[32], 1, vec![2; 64]);
    let mut bytes = w.bytes();
    let (ty, _) = entry_fields(&bytes, "a");
    bytes[ty..ty + 4].copy_from_slice(&0u32.to_le_bytes()); // F16 -> F32: 128 bytes
    let e = err(&bytes);
    assert!(e.contains("tensor b") && e.contains("overlaps tensor a"), "{e}");
}

#[test]
fn types_that_do_not_fill_their_data_are_refused() {
    // Q8_0 data declared Q4_0 (same block of 32 values, 18 bytes instead of 34 a block).
    let w = Writer::new().tensor("q", &[64], 8, vec![3; 68]).tensor("n", &[8], 0, vec![0; 32]);
    let mut bytes = w.bytes();
    assert!(Gguf::parse(&bytes, "x.gguf").is_ok());
    let (ty, _) = entry_fields(&bytes, "q");
    bytes[ty..ty + 4].copy_from_slice(&2u32.to_le_bytes());
    let e = err(&bytes);
    assert!(e.contains("tensor q (36 bytes of Q4_0 for [64]") && e.contains("unused bytes before tensor n"), "{e}");
    // Two tensors' types swapped (F32 and F16 of one shape): one no longer fills its region.
    let w = Writer::new().tensor("a", &[16], 0, vec![0; 64]).tensor("b", &[16], 1, vec![0; 32]).tensor(
        "c",
        &[8],
        0,
        vec![0; 32],
    );
    let mut bytes = w.bytes();
    let (ta, _) = entry_fields(&bytes, "a");
    let (tb, _) = entry_fields(&bytes, "b");
    bytes[ta..ta + 4].copy_from_slice(&1u32.to_le_bytes());
    bytes[tb..tb + 4].copy_from_slice(&0u32.to_le_bytes());
    assert!(err(&bytes).contains("tensor a (32 bytes of F16"));
    // The last tensor: its type makes it shorter than the data left in the file.
    let w = Writer::new().tensor("a", &[8], 0, vec![0; 32]).tensor("z", &[64], 8, vec![0; 68]);
    let mut bytes = w.bytes();
    let (ty, _) = entry_fields(&bytes, "z");
    bytes[ty..ty + 4].copy_from_slice(&2u32.to_le_bytes());
    let e = err(&bytes);
    assert!(e.contains("tensor z (36 bytes of Q4_0") && e.contains("to the end of the file"), "{e}");
    // Trailing bytes past the last tensor's padding, and a first tensor not at offset 0.
    let mut bytes = sample();
    bytes.extend([0u8; 32]);
    assert!(err(&bytes).contains("tensor b (34 bytes of Q8_0"));
    let mut bytes = Writer::new().tensor("a", &[8], 0, vec![0; 32]).bytes();
    let (_, off) = entry_fields(&bytes, "a");
    bytes[off..off + 8].copy_from_slice(&32u64.to_le_bytes());
    bytes.extend([0u8; 32]);
    assert!(err(&bytes).contains("32 unused bytes before it"));
    // Zero-sized tensors share an offset with the next one, as writers place them.
    let g = Gguf::parse(&Writer::new().tensor("e", &[0], 0, vec![]).tensor("a", &[8], 0, vec![0; 32]).bytes(), "x");
    assert_eq!(g.unwrap().tensors.len(), 2);
}

#[test]
fn an_edited_alignment_reads_the_same_bytes_or_is_refused() {
    // For every header length modulo 32 (a padding key of k bytes), alignment 32 written
    // into the file, then edited to each other power of two.
    let mut refused = 0;
    for k in 0..32 {
        let data: Vec<u8> = (0..96u8).collect();
        let w = Writer::new()
            .string("pad", &"x".repeat(k))
            .u32("general.alignment", 32)
            .tensor("a", &[24], 0, data[..96].to_vec())
            .tensor("b", &[16], 1, data[..32].to_vec());
        let good = w.bytes();
        let g = Gguf::parse(&good, "x.gguf").unwrap();
        let want: Vec<&[u8]> =
            g.tensors.iter().map(|t| &good[t.offset as usize..(t.offset + t.size) as usize]).collect();
        let key = b"general.alignment";
        let at = good.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
        for a in [1u32, 2, 4, 8, 16, 64, 128] {
            let mut b = good.clone();
            b[at..at + 4].copy_from_slice(&a.to_le_bytes());
            match Gguf::parse(&b, "x.gguf") {
                Ok(g) => {
                    let got: Vec<&[u8]> =
                        g.tensors.iter().map(|t| &b[t.offset as usize..(t.offset + t.size) as usize]).collect();
                    assert_eq!(got, want, "k {k}, alignment {a}: other bytes read");
                }
                Err(e) => {
                    let e = e.to_string();
                    assert!(!e.contains('\n') && e.contains("tensor "), "{e}");
                    // A smaller alignment moves the data's start: refused, not read shifted.
                    refused += usize::from(a < 32);
                }
            }
        }
    }
    assert!(refused >= 16, "{refused}");
}

/// A header parsed from the file's first bytes (`Gguf::parse_prefix`, how `coli convert`
/// reads a GGUF without mapping it) is the header parsed from the whole file, or "read
/// more" while the prefix is too short; never a false error. A prefix of a truncated file
/// is refused as the whole truncated file is.
#[test]
fn a_header_parsed_from_a_prefix_is_the_whole_files() {
    let data: Vec<u8> = (0..96u8).collect();
    let good = Writer::new()
        .string("general.name", "prefix")
        .tensor("a", &[24], 0, data.clone())
        .tensor("b", &[16], 1, data[..32].to_vec())
        .bytes();
    let whole = Gguf::parse(&good, "x.gguf").unwrap();
    let len = good.len() as u64;
    let mut first_complete = None;
    for k in 0..=good.len() {
        match Gguf::parse_prefix(&good[..k], len, "x.gguf").unwrap() {
            Some(g) => {
                assert_eq!(
                    (&g.metadata, &g.tensors, g.data_start),
                    (&whole.metadata, &whole.tensors, whole.data_start)
                );
                first_complete.get_or_insert(k);
            }
            None => assert!(first_complete.is_none(), "prefix {k}: more asked for after a complete parse"),
        }
    }
    // The header ends before the tensor data: a prefix shorter than the file is enough.
    assert!(first_complete.unwrap() <= whole.data_start as usize, "{first_complete:?}");
    let cut = &good[..good.len() - 8];
    let e = Gguf::parse_prefix(&cut[..cut.len() / 2], cut.len() as u64, "x.gguf");
    let e = match e {
        Ok(None) => Gguf::parse(cut, "x.gguf").unwrap_err(),
        other => other.unwrap_err(),
    };
    assert!(e.to_string().contains("truncated"), "{e}");
}
