//! `coli convert model.gguf`: a GGUF file as the source of a conversion. The engine's
//! format stage parses it (engine/src/format/gguf*.rs); here the file is read (pread, one
//! tensor at a time, never mapped), every tensor is brought into the stored type the
//! conversion asks for (exactly where the container can hold the GGUF values), and
//! config.json / tokenizer files are made from the metadata. See docs/gguf.md.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use colibri_engine::format::gguf::Gguf;
use colibri_engine::format::gguf_import::{import, keep_dtype_for, stores_exactly_for, tensor, Planned};
use colibri_engine::format::tensors::{Shards, TensorEntry, TensorStore};
use colibri_engine::tensor::{Bytes, DType, Mat};
use serde_json::{json, Value};

/// True if `path` is a file that starts with GGUF's magic (or is named *.gguf).
pub fn is_gguf(path: &Path) -> bool {
    if !path.is_file() {
        return false;
    }
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return true;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok()
        && &magic == b"GGUF"
}

/// The header of the GGUF file `path` (opened as part `part` of `data`), read from its
/// first bytes: 1 MiB, then four times more until the header fits (at most 1 GiB).
fn parse_header(data: &Shards, part: usize, path: &Path) -> Result<Gguf> {
    let origin = path.display().to_string();
    let len = data.part_len(part).context("no such part")?;
    let mut want = (1u64 << 20).min(len);
    loop {
        let prefix = data.read_part(part, 0, want as usize)?;
        if let Some(g) = Gguf::parse_prefix(&prefix, len, &origin)? {
            return Ok(g);
        }
        if want >= len || want >= 1 << 30 {
            bail!("{origin}: not a valid GGUF file: its header is larger than {want} bytes");
        }
        want = (want * 4).min(len).min(1 << 30);
    }
}

/// A parsed GGUF: its header, and its open file(s), read with pread one tensor at a time
/// (never mapped: a file truncated or replaced during a conversion is a read error naming
/// it, not a fault).
pub struct Parsed {
    pub gguf: Gguf,
    /// Its file, or a split GGUF's parts in order.
    pub data: Shards,
    pub paths: Vec<PathBuf>,
    pub imported: colibri_engine::format::gguf_import::Imported,
}

/// The file names of all parts of a split GGUF whose part `path` is (llama.cpp's
/// `NAME-00001-of-00003.gguf`, the names gguf-split writes), or None if `path` is not
/// named as a part.
pub fn split_paths(path: &Path, parts: usize) -> Option<Vec<PathBuf>> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf").or_else(|| name.strip_suffix(".GGUF"))?;
    let (rest, of) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let five = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !five(no) || !five(of) || of.parse::<usize>().ok()? != parts {
        return None;
    }
    let ext = &name[stem.len()..];
    Some((1..=parts).map(|i| path.with_file_name(format!("{prefix}-{i:05}-of-{parts:05}{ext}"))).collect())
}

/// Parses `path`; a split GGUF (`split.count` > 1) is named by its first part and read
/// with the others from beside it, each bounded by its own file, a missing one refused.
pub fn parse(path: &Path) -> Result<Parsed> {
    let first = Shards::open(&[path.to_path_buf()])?;
    let origin = path.display().to_string();
    let gguf = parse_header(&first, 0, path)?;
    let (no, n) = gguf.split(&origin)?;
    let (gguf, data, paths) = if n > 1 {
        let paths = split_paths(path, n).with_context(|| {
            format!("{origin}: part {} of a split GGUF of {n} parts, but not named NAME-{:05}-of-{n:05}.gguf as gguf-split names them", no + 1, no + 1)
        })?;
        if no != 0 {
            bail!(
                "{origin}: part {} of a split GGUF of {n} parts: convert the first part, {}",
                no + 1,
                paths[0].display()
            );
        }
        for (i, p) in paths.iter().enumerate().skip(1) {
            if !p.is_file() {
                bail!("{origin}: part {} of {n} of this split GGUF is missing: {}", i + 1, p.display());
            }
        }
        let data = Shards::open(&paths)?;
        let mut parts = vec![(gguf, origin.clone())];
        for (i, p) in paths.iter().enumerate().skip(1) {
            parts.push((parse_header(&data, i, p)?, p.display().to_string()));
        }
        (Gguf::join(parts)?, data, paths)
    } else {
        (gguf, first, vec![path.to_path_buf()])
    };
    let imported = import(&gguf).with_context(|| origin.clone())?;
    Ok(Parsed { gguf, data, paths, imported })
}

/// A GGUF ready to convert. Nothing is converted up front: `stub` has every tensor
/// under its Hugging Face name with the stored type and shape the conversion will write,
/// backed by zero pages (never touched but for norms), so the planner and
/// `Model::from_store` check the model as for a checkpoint; `lazy` converts one tensor or
/// expert at a time while the container is written, so memory stays bounded.
pub struct Source {
    pub config: Value,
    pub stub: TensorStore,
    pub lazy: Lazy,
    /// config.json, tokenizer.json, tokenizer_config.json.
    pub files: Vec<(String, Vec<u8>)>,
    /// What the manifest records about the source (`source` in colibri.json).
    pub provenance: Value,
}

/// Converts tensors of a parsed GGUF on demand.
pub struct Lazy {
    parsed: Parsed,
    by_name: HashMap<String, usize>,
    experts: HashMap<(usize, usize, usize), usize>,
}

impl Lazy {
    fn planned(&self, k: usize) -> &Planned {
        &self.parsed.imported.tensors[k]
    }

    /// Tensor `k` as `dtype` where that is exact; otherwise its exact f32 values, which the
    /// writer quantizes (in parallel, with the same function `tensor` would use).
    fn convert(&self, k: usize, dtype: DType) -> Result<Mat> {
        let p = self.planned(k);
        let want = if stores_exactly_for(&self.parsed.gguf, p, dtype) { dtype } else { DType::F32 };
        let e = tensor(&self.parsed.gguf, &self.parsed.data, p, Some(want))?;
        let cols = *p.shape.last().unwrap_or(&1);
        let rows = if p.shape.len() > 1 { p.shape[..p.shape.len() - 1].iter().product() } else { 1 };
        Ok(Mat::new(rows, cols, e.dtype, e.bytes)?)
    }

    /// The GGUF file, or every part of a split GGUF.
    pub fn paths(&self) -> &[PathBuf] {
        &self.parsed.paths
    }

    /// Tensor `name` (a Hugging Face name) stored as `dtype`.
    pub fn mat(&self, name: &str, dtype: DType) -> Result<Mat> {
        let k = *self.by_name.get(name).with_context(|| format!("GGUF: no tensor for {name}"))?;
        self.convert(k, dtype)
    }

    /// Gate, up and down of one routed expert, stored as `dtypes`.
    pub fn expert(&self, layer: usize, expert: usize, dtypes: [DType; 3]) -> Result<[Mat; 3]> {
        let part = |i: usize| -> Result<Mat> {
            let k = *self
                .experts
                .get(&(layer, expert, i))
                .with_context(|| format!("GGUF: expert {expert} of layer {layer} is missing"))?;
            self.convert(k, dtypes[i])
        };
        Ok([part(0)?, part(1)?, part(2)?])
    }
}

/// Opens `path`; `target(name, shape)` is the stored type of each tensor (None: the type
/// that keeps the GGUF values, `gguf_import::keep_dtype_for`).
pub fn open(path: &Path, target: impl Fn(&str, &[usize]) -> Option<DType>) -> Result<Source> {
    let parsed = parse(path)?;
    let mut plan = Vec::with_capacity(parsed.imported.tensors.len());
    let mut largest = 0usize;
    // GGUF tensors whose values the stored type cannot hold (decoded and re-quantized).
    let mut requantized: BTreeMap<String, std::collections::BTreeSet<usize>> = BTreeMap::new();
    for p in &parsed.imported.tensors {
        let dtype = target(&p.name, &p.shape).unwrap_or_else(|| keep_dtype_for(&parsed.gguf, p));
        if !stores_exactly_for(&parsed.gguf, p, dtype) {
            let ty = parsed.gguf.tensors[p.src].ty.name.to_string();
            requantized.entry(ty).or_default().insert(p.src);
        }
        let cols = *p.shape.last().unwrap_or(&1);
        let rows: usize = if p.shape.len() > 1 { p.shape[..p.shape.len() - 1].iter().product() } else { 1 };
        let len = dtype
            .row_bytes(cols)
            .and_then(|rb| rb.checked_mul(rows))
            .with_context(|| format!("{}: tensor {} is too large", path.display(), p.name))?;
        largest = largest.max(len);
        plan.push((dtype, len));
    }
    // One zeroed allocation (untouched pages cost no memory) behind every stub.
    let zeros = Bytes::from_vec(vec![0u8; largest]);
    let mut stub = TensorStore::default();
    let (mut by_name, mut experts) = (HashMap::new(), HashMap::new());
    for (k, (p, (dtype, len))) in parsed.imported.tensors.iter().zip(plan).enumerate() {
        stub.insert(p.name.clone(), TensorEntry { dtype, shape: p.shape.clone(), bytes: zeros.slice(0, len)? });
        by_name.insert(p.name.clone(), k);
        if let Some(x) = p.expert_of {
            experts.insert(x, k);
        }
    }
    let im = &parsed.imported;
    let mut config_json = serde_json::to_vec_pretty(&im.config)?;
    config_json.push(b'\n');
    let files = vec![
        ("config.json".to_string(), config_json),
        ("tokenizer.json".to_string(), im.tokenizer_json.clone()),
        ("tokenizer_config.json".to_string(), im.tokenizer_config.clone()),
    ];
    let provenance = json!({
        "format": "gguf",
        "file": path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        "gguf_version": parsed.gguf.version,
        "architecture": im.arch,
        "tensor_types": im.source_types,
    });
    let mut provenance = provenance;
    if parsed.gguf.parts > 1 {
        provenance["parts"] = json!(parsed.gguf.parts);
    }
    // Always written (empty: nothing re-quantized), so that a container from before this
    // record says nothing rather than "kept exactly".
    let counts: BTreeMap<&String, usize> = requantized.iter().map(|(k, v)| (k, v.len())).collect();
    provenance["requantized"] = json!(counts);
    let config = im.config.clone();
    Ok(Source { config, stub, lazy: Lazy { parsed, by_name, experts }, files, provenance })
}

/// One line about a container's GGUF origin, e.g. "converted from GGUF x.gguf (qwen3moe;
/// tensors Q4_K x 10, F32 x 7; re-quantized, not kept exactly: Q4_K x 10)", or None for
/// other sources.
pub fn describe_source(source: Option<&Value>) -> Option<String> {
    let s = source?;
    if s.get("format")?.as_str()? != "gguf" {
        return None;
    }
    let counts = |k: &str| -> Option<String> {
        let m: BTreeMap<String, u64> = serde_json::from_value(s.get(k)?.clone()).ok()?;
        Some(m.iter().map(|(k, n)| format!("{k} x {n}")).collect::<Vec<_>>().join(", "))
    };
    let requantized = match counts("requantized") {
        Some(r) if r.is_empty() => "; every tensor's values kept exactly".into(),
        Some(r) => format!("; re-quantized, not kept exactly: {r}"),
        None => String::new(),
    };
    Some(format!(
        "converted from GGUF {} ({}; tensors {}{requantized})",
        s.get("file").and_then(Value::as_str).unwrap_or("?"),
        s.get("architecture").and_then(Value::as_str).unwrap_or("?"),
        counts("tensor_types")?,
    ))
}

/// What a conversion without `--quant` does with the GGUF types of `p` that it cannot keep
/// exactly, one entry per stored type, for `coli info FILE.gguf`: "Q2_K, Q3_K (re-quantized
/// to int4/g32)", "Q6_K (re-quantized to int8/g128)" (docs/gguf.md "Tensor types").
pub fn converted_types(p: &Parsed) -> Vec<String> {
    let mut by: std::collections::BTreeMap<String, std::collections::BTreeSet<&'static str>> = Default::default();
    for t in &p.imported.tensors {
        let dtype = keep_dtype_for(&p.gguf, t);
        if !stores_exactly_for(&p.gguf, t, dtype) {
            by.entry(dtype.to_string()).or_default().insert(p.gguf.tensors[t.src].ty.name);
        }
    }
    by.into_iter()
        .map(|(d, tys)| format!("{} (re-quantized to {d})", tys.into_iter().collect::<Vec<_>>().join(", ")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_source_says_what_was_requantized() {
        let base = json!({"format": "gguf", "file": "m.gguf", "architecture": "qwen3moe",
            "tensor_types": {"Q4_K": 3, "F32": 2}});
        // A container from before `requantized` was recorded: no claim either way.
        assert_eq!(
            describe_source(Some(&base)).unwrap(),
            "converted from GGUF m.gguf (qwen3moe; tensors F32 x 2, Q4_K x 3)"
        );
        let mut v = base.clone();
        v["requantized"] = json!({});
        assert!(describe_source(Some(&v)).unwrap().ends_with("; every tensor's values kept exactly)"));
        v["requantized"] = json!({"Q4_K": 3});
        assert!(describe_source(Some(&v)).unwrap().ends_with("; re-quantized, not kept exactly: Q4_K x 3)"));
        assert_eq!(describe_source(Some(&json!({"format": "safetensors"}))), None);
    }
}
