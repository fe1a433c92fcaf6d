//! The container manifest (`colibri.json`): its schema, strict validation of what a file
//! claims (every range inside the data file, every length matching its dtype and shape),
//! and the layout planner that assigns each tensor and expert its deterministic offset.
//! The byte-level specification is docs/format.md.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::tensor::DType;

/// Value of the manifest's `format` field.
pub const FORMAT: &str = "colibri";
/// The manifest version this engine writes and reads.
pub const VERSION: u32 = 1;
/// The checksum every entry carries: XXH3 64-bit, seed 0, as 16 lowercase hex digits.
pub const CHECKSUM: &str = "xxh3-64";
/// Alignment of every routed expert's byte range (and of the expert region).
pub const EXPERT_ALIGN: u64 = 4096;
/// Alignment of every dense tensor and of each part inside an expert.
pub const TENSOR_ALIGN: u64 = 256;
/// The manifest's checksum of itself: xxh3-64 (hex) of the compact JSON of every other
/// field (docs/format.md). Required: a manifest written before it existed is refused with
/// [`UNSEALED`]'s advice (`coli doctor --fix` verifies such a model and adds it).
pub const SELF_CHECKSUM: &str = "manifest_xxh3";
/// What a manifest without [`SELF_CHECKSUM`] is told (after "colibri.json: ").
pub const UNSEALED: &str = "no checksum of its own (manifest_xxh3; converted by an older coli): \
     run `coli doctor --fix MODEL` to verify every byte of the model and add it, or convert it again";
/// Largest manifest read (a 1024-layer, 4096-expert model needs about 600 MiB of JSON;
/// real ones are a few MiB).
pub const MAX_MANIFEST_BYTES: u64 = 1 << 30;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    /// Always "colibri".
    pub format: String,
    /// Format version (1).
    pub version: u32,
    /// Checksum algorithm of every `xxh3` field: "xxh3-64".
    pub checksum: String,
    /// The data file, relative to the manifest's directory.
    pub data_file: String,
    /// Exact size of the data file in bytes.
    pub data_size: u64,
    /// How the weights were quantized (informational; each tensor names its own dtype).
    pub quant: QuantSummary,
    /// The Hugging Face config.json, verbatim.
    pub config: serde_json::Value,
    /// Other files kept beside the manifest (config.json, tokenizer files).
    pub files: Vec<String>,
    pub dense: DenseRegion,
    pub experts: ExpertRegion,
    /// Where the weights came from when not a Hugging Face checkpoint (optional): for a
    /// GGUF import `{"format": "gguf", "file", "gguf_version", "architecture",
    /// "tensor_types": {ggml type: count}}` (docs/gguf.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct QuantSummary {
    /// The `--quant` of the conversion (the type of attention and expert weights).
    pub default: String,
    pub group_size: u32,
    /// Stored type per tensor class: embed, lm_head, attn, experts, mlp, other.
    pub classes: std::collections::BTreeMap<String, String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DenseRegion {
    pub offset: u64,
    pub length: u64,
    pub tensors: Vec<DenseTensor>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DenseTensor {
    /// Hugging Face tensor name.
    pub name: String,
    pub dtype: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_size: Option<u32>,
    pub shape: Vec<u64>,
    /// Absolute offset in the data file.
    pub offset: u64,
    pub length: u64,
    pub xxh3: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ExpertRegion {
    pub offset: u64,
    pub length: u64,
    pub alignment: u64,
    /// One entry per MoE layer, ascending.
    pub layers: Vec<ExpertLayer>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ExpertLayer {
    pub layer: u32,
    /// gate, up, down: where each matrix sits inside every expert's range.
    pub parts: Vec<ExpertPart>,
    /// Expert `i` of this layer is `experts[i]`.
    pub experts: Vec<ExpertEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ExpertPart {
    pub name: String,
    pub dtype: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_size: Option<u32>,
    /// [rows, cols]
    pub shape: [u64; 2],
    /// Relative to the start of the expert's range.
    pub offset: u64,
    pub length: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ExpertEntry {
    pub offset: u64,
    pub length: u64,
    pub xxh3: String,
}

/// xxh3 of the compact JSON of `v` (the manifest without its own checksum). serde_json
/// parses floats exactly (`float_roundtrip`) and prints the shortest form that reads back
/// to the same number, so the writer's and the reader's JSON agree byte for byte.
fn self_checksum(v: &serde_json::Value) -> u64 {
    checksum(&serde_json::to_vec(&sorted_keys(v)).unwrap_or_default())
}

/// `v` with every object's keys in sorted order: the checksum is over compact JSON with
/// sorted keys, whatever order serde_json's maps keep (insertion order once a dependency
/// turns on its `preserve_order` feature, as llguidance does).
fn sorted_keys(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            serde_json::Value::Object(keys.into_iter().map(|k| (k.clone(), sorted_keys(&m[k]))).collect())
        }
        serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(sorted_keys).collect()),
        other => other.clone(),
    }
}

/// The engine's checksum of a byte range.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

pub fn checksum_hex(v: u64) -> String {
    format!("{v:016x}")
}

/// Which version of a model a manifest describes: the checksum of its bytes, in hex.
pub fn fingerprint(manifest_bytes: &[u8]) -> String {
    checksum_hex(checksum(manifest_bytes))
}

pub fn parse_checksum(s: &str) -> Option<u64> {
    if s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        u64::from_str_radix(s, 16).ok()
    } else {
        None
    }
}

fn bad(msg: impl Into<String>) -> Error {
    Error::Invalid(format!("colibri.json: {}", msg.into()))
}

fn dtype_of(what: &str, name: &str, group: Option<u32>) -> Result<DType> {
    DType::from_name(name, group).ok_or_else(|| bad(format!("{what}: unknown dtype {name:?} (group_size {group:?})")))
}

fn stored_len(what: &str, dtype: DType, shape: &[u64]) -> Result<u64> {
    let (rows, cols) = match shape {
        [] => (1, 1),
        [n] => (1, *n),
        [rest @ .., c] => (
            rest.iter()
                .try_fold(1u64, |a, &b| a.checked_mul(b))
                .ok_or_else(|| bad(format!("{what}: shape overflows")))?,
            *c,
        ),
    };
    if dtype.is_quantized() && shape.len() != 2 {
        return Err(bad(format!("{what}: quantized tensors must be 2-D")));
    }
    let cols = usize::try_from(cols).map_err(|_| bad(format!("{what}: shape too large")))?;
    dtype
        .row_bytes(cols)
        .and_then(|rb| (rb as u64).checked_mul(rows))
        .ok_or_else(|| bad(format!("{what}: size overflows")))
}

fn within(what: &str, offset: u64, length: u64, start: u64, end: u64) -> Result<()> {
    match offset.checked_add(length) {
        Some(e) if offset >= start && e <= end => Ok(()),
        _ => Err(bad(format!("{what}: bytes {offset}+{length} fall outside {start}..{end}"))),
    }
}

/// An error naming two of `ranges` ((offset, length, name)) that share a byte: every
/// tensor, expert and part must have bytes of its own, or an edited offset could make two
/// of them read the same bytes (each checksum still matching) and the model compute garbage.
fn disjoint(what: &str, mut ranges: Vec<(u64, u64, String)>) -> Result<()> {
    ranges.retain(|r| r.1 > 0);
    ranges.sort_unstable_by_key(|r| r.0);
    for w in ranges.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        // Ranges were checked against overflow before (within).
        if a.0.saturating_add(a.1) > b.0 {
            return Err(bad(format!(
                "{what} {} (bytes {}+{}) overlaps {} (bytes {}+{})",
                a.2, a.0, a.1, b.2, b.0, b.1
            )));
        }
    }
    Ok(())
}

impl DenseTensor {
    pub fn dtype(&self) -> Result<DType> {
        dtype_of(&self.name, &self.dtype, self.group_size)
    }
}

impl ExpertPart {
    pub fn dtype(&self) -> Result<DType> {
        dtype_of(&self.name, &self.dtype, self.group_size)
    }
}

impl Manifest {
    /// Parses and validates a manifest, which must carry its own checksum
    /// ([`SELF_CHECKSUM`]). Every later read can trust its ranges.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        Self::parse_with(bytes, true)
    }

    /// [`Manifest::parse`] for a manifest that may lack its own checksum (one from an older
    /// converter): what `coli doctor --fix` reads before it verifies the data and seals it.
    /// A checksum that is there must still match.
    pub fn parse_unsealed(bytes: &[u8]) -> Result<Self> {
        Self::parse_with(bytes, false)
    }

    fn parse_with(bytes: &[u8], sealed: bool) -> Result<Self> {
        let v: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not valid JSON ({e}); the file is damaged or truncated")))?;
        match (v.get("format").and_then(|f| f.as_str()), v.get("version").and_then(|f| f.as_u64())) {
            (Some(FORMAT), Some(n)) if n == VERSION as u64 => {}
            (Some(FORMAT), Some(n)) => {
                return Err(bad(format!("format version {n} is not supported (this coli reads version {VERSION})")))
            }
            _ => return Err(bad("not a colibri manifest (no \"format\": \"colibri\" with a \"version\")")),
        }
        let mut v = v;
        if let Some(obj) = v.as_object_mut() {
            if let Some(claimed) = obj.remove(SELF_CHECKSUM) {
                let want = claimed.as_str().and_then(parse_checksum);
                if want != Some(self_checksum(&serde_json::Value::Object(obj.clone()))) {
                    return Err(bad(format!(
                        "its own checksum ({SELF_CHECKSUM}) does not match: the manifest was edited or damaged; convert the model again"
                    )));
                }
            } else if sealed {
                return Err(bad(UNSEALED));
            }
        }
        let m: Manifest = serde_json::from_value(v).map_err(|e| bad(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    /// Whether the manifest in `bytes` carries its own checksum (written by this version
    /// of the converter or later); [`Manifest::parse`] requires it.
    pub fn has_self_checksum(bytes: &[u8]) -> bool {
        serde_json::from_slice::<serde_json::Value>(bytes).is_ok_and(|v| v.get(SELF_CHECKSUM).is_some())
    }

    /// The manifest as written to disk: pretty JSON with its own checksum as the last field.
    pub fn to_json(&self) -> Vec<u8> {
        let Ok(serde_json::Value::Object(mut obj)) = serde_json::to_value(self) else { return Vec::new() };
        let sum = self_checksum(&serde_json::Value::Object(obj.clone()));
        obj.insert(SELF_CHECKSUM.into(), checksum_hex(sum).into());
        let mut v = serde_json::to_vec_pretty(&obj).unwrap_or_default();
        v.push(b'\n');
        v
    }

    pub fn validate(&self) -> Result<()> {
        if self.checksum != CHECKSUM {
            return Err(bad(format!("unsupported checksum {:?} (expected {CHECKSUM:?})", self.checksum)));
        }
        for f in std::iter::once(&self.data_file).chain(&self.files) {
            if f.is_empty() || f.contains('/') || f.contains('\\') || f.starts_with('.') {
                return Err(bad(format!("file name {f:?} is not a plain file name")));
            }
        }
        let d = &self.dense;
        within("dense region", d.offset, d.length, 0, self.data_size)?;
        let mut names = std::collections::HashSet::new();
        for t in &d.tensors {
            let want = stored_len(&t.name, t.dtype()?, &t.shape)?;
            if t.length != want {
                return Err(bad(format!(
                    "{}: length {} but {} of shape {:?} needs {want}",
                    t.name, t.length, t.dtype, t.shape
                )));
            }
            within(&t.name, t.offset, t.length, d.offset, d.offset + d.length)?;
            parse_checksum(&t.xxh3).ok_or_else(|| bad(format!("{}: bad checksum {:?}", t.name, t.xxh3)))?;
            if !names.insert(t.name.as_str()) {
                return Err(bad(format!("tensor {} is listed twice", t.name)));
            }
        }
        disjoint("dense tensor", d.tensors.iter().map(|t| (t.offset, t.length, t.name.clone())).collect())?;
        let x = &self.experts;
        if d.length > 0 && x.length > 0 && d.offset < x.offset + x.length && x.offset < d.offset + d.length {
            return Err(bad(format!(
                "the dense region ({}+{}) and the expert region ({}+{}) overlap",
                d.offset, d.length, x.offset, x.length
            )));
        }
        if x.alignment == 0 || !x.alignment.is_power_of_two() {
            return Err(bad(format!("expert alignment {} is not a power of two", x.alignment)));
        }
        within("expert region", x.offset, x.length, 0, self.data_size)?;
        let mut prev = None;
        for l in &x.layers {
            if prev.is_some_and(|p| p >= l.layer) {
                return Err(bad("expert layers must be listed in ascending order"));
            }
            prev = Some(l.layer);
            let names: Vec<&str> = l.parts.iter().map(|p| p.name.as_str()).collect();
            if names != ["gate", "up", "down"] {
                return Err(bad(format!("layer {}: expert parts must be gate, up, down; got {names:?}", l.layer)));
            }
            let mut span = 0u64;
            for p in &l.parts {
                let end = p.offset.checked_add(p.length);
                span = span.max(end.ok_or_else(|| bad(format!("layer {}: part {} overflows", l.layer, p.name)))?);
            }
            for p in &l.parts {
                let what = format!("layer {} expert part {}", l.layer, p.name);
                let want = stored_len(&what, p.dtype()?, &p.shape)?;
                if p.length != want {
                    return Err(bad(format!("{what}: length {} but needs {want}", p.length)));
                }
                within(&what, p.offset, p.length, 0, span)?;
            }
            let parts = l.parts.iter().map(|p| (p.offset, p.length, format!("part {}", p.name))).collect();
            disjoint(&format!("layer {} expert", l.layer), parts)?;
            for (i, e) in l.experts.iter().enumerate() {
                let what = format!("layer {} expert {i}", l.layer);
                if e.length != span {
                    return Err(bad(format!("{what}: length {} but its parts span {span}", e.length)));
                }
                if e.offset % x.alignment != 0 {
                    return Err(bad(format!("{what}: offset {} is not aligned to {}", e.offset, x.alignment)));
                }
                within(&what, e.offset, e.length, x.offset, x.offset + x.length)?;
                parse_checksum(&e.xxh3).ok_or_else(|| bad(format!("{what}: bad checksum {:?}", e.xxh3)))?;
            }
        }
        let all = x.layers.iter().flat_map(|l| {
            l.experts
                .iter()
                .enumerate()
                .map(move |(i, e)| (e.offset, e.length, format!("layer {} expert {i}", l.layer)))
        });
        disjoint("expert", all.collect())?;
        Ok(())
    }

    pub fn expert_layer(&self, layer: usize) -> Option<&ExpertLayer> {
        self.experts.layers.iter().find(|l| l.layer as usize == layer)
    }

    /// Bytes of all dense tensors (resident) and of all routed experts (streamed).
    pub fn byte_totals(&self) -> (u64, u64) {
        let dense = self.dense.tensors.iter().map(|t| t.length).sum();
        let experts = self.experts.layers.iter().flat_map(|l| &l.experts).map(|e| e.length).sum();
        (dense, experts)
    }
}

/// What the planner needs to know about one dense tensor.
pub struct DensePlan {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
}

/// What the planner needs to know about one MoE layer's experts.
pub struct ExpertLayerPlan {
    pub layer: u32,
    pub count: usize,
    /// (dtype, [rows, cols]) of gate, up, down.
    pub parts: [(DType, [u64; 2]); 3],
}

fn align(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

fn dtype_fields(d: DType) -> (String, Option<u32>) {
    // FP8 rows keep their scale block (columns per scale) in `group_size`.
    (d.name().to_string(), d.group().or(d.fp8_block()))
}

/// Lays out a container: dense tensors from offset 0, each aligned to [`TENSOR_ALIGN`];
/// then the expert region at the next [`EXPERT_ALIGN`] boundary, every expert's range
/// starting on an [`EXPERT_ALIGN`] boundary, layer by layer, expert by expert. Checksums
/// are left empty for the writer to fill in.
pub fn plan(
    data_file: &str,
    quant: QuantSummary,
    config: serde_json::Value,
    files: Vec<String>,
    dense: &[DensePlan],
    experts: &[ExpertLayerPlan],
) -> Result<Manifest> {
    let mut at = 0u64;
    let mut tensors = Vec::with_capacity(dense.len());
    for t in dense {
        at = align(at, TENSOR_ALIGN);
        let length = stored_len(&t.name, t.dtype, &t.shape)?;
        let (dtype, group_size) = dtype_fields(t.dtype);
        tensors.push(DenseTensor {
            name: t.name.clone(),
            dtype,
            group_size,
            shape: t.shape.clone(),
            offset: at,
            length,
            xxh3: String::new(),
        });
        at += length;
    }
    let dense_region = DenseRegion { offset: 0, length: at, tensors };
    let x0 = align(at, EXPERT_ALIGN);
    at = x0;
    let mut layers = Vec::with_capacity(experts.len());
    for l in experts {
        let mut parts = Vec::with_capacity(3);
        let mut off = 0u64;
        for ((dt, shape), name) in l.parts.iter().zip(["gate", "up", "down"]) {
            off = align(off, TENSOR_ALIGN);
            let length = stored_len(name, *dt, shape)?;
            let (dtype, group_size) = dtype_fields(*dt);
            parts.push(ExpertPart { name: name.into(), dtype, group_size, shape: *shape, offset: off, length });
            off += length;
        }
        let mut list = Vec::with_capacity(l.count);
        for _ in 0..l.count {
            at = align(at, EXPERT_ALIGN);
            list.push(ExpertEntry { offset: at, length: off, xxh3: String::new() });
            at += off;
        }
        layers.push(ExpertLayer { layer: l.layer, parts, experts: list });
    }
    Ok(Manifest {
        format: FORMAT.into(),
        version: VERSION,
        checksum: CHECKSUM.into(),
        data_file: data_file.into(),
        data_size: at,
        quant,
        config,
        files,
        dense: dense_region,
        experts: ExpertRegion { offset: x0, length: at - x0, alignment: EXPERT_ALIGN, layers },
        source: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let mut m = plan(
            "weights.bin",
            QuantSummary::default(),
            serde_json::json!({"model_type": "mixtral"}),
            vec!["config.json".into()],
            &[
                DensePlan { name: "a".into(), dtype: DType::F32, shape: vec![3] },
                DensePlan { name: "b".into(), dtype: DType::Int8 { group: 64 }, shape: vec![5, 100] },
            ],
            &[ExpertLayerPlan {
                layer: 0,
                count: 2,
                parts: [
                    (DType::Int4 { group: 64 }, [4, 10]),
                    (DType::Int4 { group: 64 }, [4, 10]),
                    (DType::Int8 { group: 64 }, [10, 4]),
                ],
            }],
        )
        .unwrap();
        for t in &mut m.dense.tensors {
            t.xxh3 = checksum_hex(1);
        }
        for e in &mut m.experts.layers[0].experts {
            e.xxh3 = checksum_hex(2);
        }
        m
    }

    #[test]
    fn plan_is_aligned_and_roundtrips() {
        let m = sample();
        assert_eq!(m.dense.tensors[1].offset, 256);
        assert_eq!(m.dense.tensors[1].length, 5 * (4 + 100));
        assert_eq!(m.experts.offset, 4096);
        let l = &m.experts.layers[0];
        assert_eq!(l.parts[1].offset, 256);
        assert_eq!(l.experts[1].offset, 8192);
        assert_eq!(m.data_size, 8192 + l.experts[1].length);
        let back = Manifest::parse(&m.to_json()).unwrap();
        assert_eq!(back, m);
        assert!(Manifest::has_self_checksum(&m.to_json()));
    }

    #[test]
    fn the_manifest_checksum_catches_edits() {
        let mut m = sample();
        m.config =
            serde_json::json!({"model_type": "mixtral", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "x": 0.1});
        let json = String::from_utf8(m.to_json()).unwrap();
        assert!(json.contains(SELF_CHECKSUM));
        let back = Manifest::parse(json.as_bytes()).unwrap();
        assert_eq!(back, m);
        // Edits that still pass every other check: a group size, a checksum, a config value.
        for (from, to) in
            [("\"group_size\": 64", "\"group_size\": 32"), ("0000000000000002", "0000000000000003"), ("0.1", "0.2")]
        {
            assert!(json.contains(from), "{from}");
            let edited = json.replacen(from, to, 1);
            let e = Manifest::parse(edited.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(SELF_CHECKSUM), "{from}: {e}");
        }
        // Whitespace does not matter; a manifest without the field is refused with the way
        // out (coli doctor --fix reads it with parse_unsealed).
        Manifest::parse(json.replace("  ", " ").as_bytes()).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
        v.as_object_mut().unwrap().remove(SELF_CHECKSUM);
        let old = serde_json::to_vec(&v).unwrap();
        assert!(!Manifest::has_self_checksum(&old));
        let e = Manifest::parse(&old).unwrap_err().to_string();
        assert!(e.contains("coli doctor --fix"), "{e}");
        assert_eq!(Manifest::parse_unsealed(&old).unwrap(), m);
    }

    #[test]
    fn garbage_and_lies_are_clear_errors() {
        let json = sample().to_json();
        for cut in [0, 1, 10, json.len() / 2, json.len() - 3] {
            let e = Manifest::parse(&json[..cut]).unwrap_err().to_string();
            assert!(e.contains("colibri.json"), "{e}");
        }
        assert!(Manifest::parse(b"\x00\xff garbage").unwrap_err().to_string().contains("not valid JSON"));
        assert!(Manifest::parse(br#"{"a":1}"#).unwrap_err().to_string().contains("not a colibri manifest"));
        let mut m = sample();
        m.version = 9;
        assert!(Manifest::parse(&m.to_json()).unwrap_err().to_string().contains("version 9"));
        let mut m = sample();
        m.data_size -= 1;
        assert!(Manifest::parse(&m.to_json()).unwrap_err().to_string().contains("outside"));
        let mut m = sample();
        m.dense.tensors[1].length += 1;
        assert!(Manifest::parse(&m.to_json()).is_err());
        let mut m = sample();
        m.experts.layers[0].experts[0].offset += 8;
        assert!(Manifest::parse(&m.to_json()).unwrap_err().to_string().contains("aligned"));
        let mut m = sample();
        m.experts.layers[0].experts[0].xxh3 = "xyz".into();
        assert!(Manifest::parse(&m.to_json()).unwrap_err().to_string().contains("checksum"));
        let mut m = sample();
        m.dense.tensors[0].dtype = "int3".into();
        assert!(Manifest::parse(&m.to_json()).unwrap_err().to_string().contains("int3"));
        let mut m = sample();
        m.data_file = "../etc/passwd".into();
        assert!(Manifest::parse(&m.to_json()).is_err());
        let mut m = sample();
        m.dense.tensors[0].shape = vec![u64::MAX, u64::MAX];
        assert!(Manifest::parse(&m.to_json()).is_err());
        // Ranges that share bytes: a part moved onto another, two tensors, two experts.
        let mut m = sample();
        m.experts.layers[0].parts[1].offset = 0;
        let e = Manifest::parse(&m.to_json()).unwrap_err().to_string();
        assert!(e.contains("part gate") && e.contains("overlaps") && e.contains("part up"), "{e}");
        let mut m = sample();
        m.dense.tensors[1].offset = 8;
        assert!(Manifest::parse(&m.to_json()).unwrap_err().to_string().contains("overlaps"));
        let mut m = sample();
        m.experts.layers[0].experts[1].offset = m.experts.layers[0].experts[0].offset;
        let e = Manifest::parse(&m.to_json()).unwrap_err().to_string();
        assert!(e.contains("expert 0") && e.contains("overlaps"), "{e}");
        let mut m = sample();
        m.experts.layers[0].parts[2].offset = u64::MAX - 1;
        assert!(Manifest::parse(&m.to_json()).unwrap_err().to_string().contains("overflows"));
    }
}
