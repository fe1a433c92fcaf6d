//! `coli convert model.gguf`: a GGUF file as the source of a conversion. The engine's
//! format stage parses and maps it (engine/src/format/gguf*.rs); here the file is read,
//! every tensor is brought into the stored type the conversion asks for (exactly where
//! the container can hold the GGUF values), and config.json / tokenizer files are made
//! from the metadata. See docs/gguf.md.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use colibri_engine::format::gguf::Gguf;
use colibri_engine::format::gguf_import::{import, tensor};
use colibri_engine::format::tensors::TensorStore;
use colibri_engine::tensor::{Bytes, DType};
use rayon::prelude::*;
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

/// The file's bytes: read into memory when it fits comfortably, else memory-mapped.
fn file_bytes(path: &Path) -> Result<Bytes> {
    Ok(TensorStore::read_or_map(path)?)
}

/// A parsed GGUF with its metadata mapped (no tensor converted yet).
pub struct Parsed {
    pub gguf: Gguf,
    pub file: Bytes,
    pub imported: colibri_engine::format::gguf_import::Imported,
}

pub fn parse(path: &Path) -> Result<Parsed> {
    let file = file_bytes(path)?;
    let origin = path.display().to_string();
    let gguf = Gguf::parse(file.as_ref(), &origin)?;
    let imported = import(&gguf).with_context(|| origin.clone())?;
    Ok(Parsed { gguf, file, imported })
}

/// A GGUF ready to convert: tensors under Hugging Face names in their stored types.
pub struct Source {
    pub config: Value,
    pub store: TensorStore,
    /// config.json, tokenizer.json, tokenizer_config.json.
    pub files: Vec<(String, Vec<u8>)>,
    /// What the manifest records about the source (`source` in colibri.json).
    pub provenance: Value,
}

/// Opens `path` and converts every tensor to `target(name, shape)` (None: the type that
/// keeps the GGUF values, see `gguf_import::keep_dtype`).
pub fn open(path: &Path, target: impl Fn(&str, &[usize]) -> Option<DType> + Sync) -> Result<Source> {
    let p = parse(path)?;
    let origin = path.display().to_string();
    let entries = p
        .imported
        .tensors
        .par_iter()
        .map(|t| {
            tensor(&p.gguf, &p.file, t, target(&t.name, &t.shape))
                .map(|e| (t.name.clone(), e))
                .with_context(|| origin.clone())
        })
        .collect::<Result<Vec<_>>>()?;
    let mut store = TensorStore::default();
    for (name, e) in entries {
        store.insert(name, e);
    }
    let im = p.imported;
    let mut config_json = serde_json::to_vec_pretty(&im.config)?;
    config_json.push(b'\n');
    let files = vec![
        ("config.json".to_string(), config_json),
        ("tokenizer.json".to_string(), im.tokenizer_json),
        ("tokenizer_config.json".to_string(), im.tokenizer_config),
    ];
    let provenance = json!({
        "format": "gguf",
        "file": path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        "gguf_version": p.gguf.version,
        "architecture": im.arch,
        "tensor_types": im.source_types,
    });
    Ok(Source { config: im.config, store, files, provenance })
}

/// One line about a container's GGUF origin, e.g. "converted from GGUF x.gguf (qwen3moe;
/// tensors Q4_0 x 10, F32 x 7)", or None for other sources.
pub fn describe_source(source: Option<&Value>) -> Option<String> {
    let s = source?;
    if s.get("format")?.as_str()? != "gguf" {
        return None;
    }
    let types: BTreeMap<String, u64> = serde_json::from_value(s.get("tensor_types")?.clone()).ok()?;
    let types: Vec<String> = types.iter().map(|(k, n)| format!("{k} x {n}")).collect();
    Some(format!(
        "converted from GGUF {} ({}; tensors {})",
        s.get("file").and_then(Value::as_str).unwrap_or("?"),
        s.get("architecture").and_then(Value::as_str).unwrap_or("?"),
        types.join(", ")
    ))
}
