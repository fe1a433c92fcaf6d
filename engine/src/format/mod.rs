//! The file formats: the colibri container (a directory with `colibri.json`, the
//! [`manifest`], and one data file: dense tensors, then every routed expert in its own
//! 4 KiB-aligned byte range; docs/format.md), its [`quant`]ized encodings and checksums,
//! and the tensor table ([`tensors`]) of Hugging Face safetensors checkpoints and of a
//! container's dense region. Parsing here never touches the file system.

pub mod byteranges;
pub mod gguf;
pub mod gguf_config;
pub mod gguf_import;
pub mod gguf_quant;
pub mod gguf_tensor;
pub mod gguf_tokenizer;
pub mod kv;
pub mod manifest;
pub mod quant;
pub mod tensors;

use crate::error::{Error, Result};
use crate::tensor::Bytes;
use manifest::{checksum, Manifest};
use tensors::{TensorEntry, TensorStore};

/// Name of the manifest file; its presence marks a directory as a converted model.
pub const MANIFEST_FILE: &str = "colibri.json";

/// Builds the tensor store of the dense tensors from the bytes of the dense region
/// (`dense` starts at the region's offset), verifying each tensor's checksum.
pub fn dense_store(m: &Manifest, dense: &Bytes, origin: &str) -> Result<TensorStore> {
    if dense.len() as u64 != m.dense.length {
        return Err(Error::Invalid(format!(
            "{origin}: dense region is {} bytes, expected {}",
            dense.len(),
            m.dense.length
        )));
    }
    let mut store = TensorStore::default();
    for t in &m.dense.tensors {
        let start = (t.offset - m.dense.offset) as usize;
        let bytes = dense.slice(start, t.length as usize)?;
        let want = manifest::parse_checksum(&t.xxh3).unwrap_or(0);
        if checksum(bytes.as_ref()) != want {
            return Err(Error::Invalid(format!(
                "{origin}: checksum mismatch in dense tensor {} (bytes {}..{}): the file is corrupted; convert the model again",
                t.name,
                t.offset,
                t.offset + t.length
            )));
        }
        let shape = t.shape.iter().map(|&d| d as usize).collect();
        store.insert(t.name.clone(), TensorEntry { dtype: t.dtype()?, shape, bytes });
    }
    Ok(store)
}

/// True if `dir` holds a converted colibri model.
#[cfg(not(target_arch = "wasm32"))]
pub fn is_container(dir: &std::path::Path) -> bool {
    dir.join(MANIFEST_FILE).is_file()
}
