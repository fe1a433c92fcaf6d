//! The file formats: the colibri container (a directory with `colibri.json`, the
//! [`manifest`], and one data file: dense tensors, then every routed expert in its own
//! 4 KiB-aligned byte range; docs/format.md), its [`quant`]ized encodings and checksums,
//! and the tensor table ([`tensors`]) of Hugging Face safetensors checkpoints and of a
//! container's dense region. Parsing here never touches the file system.

pub mod byteranges;
pub mod gguf;
pub mod gguf_config;
mod gguf_families;
pub mod gguf_import;
mod gguf_iq;
mod gguf_plan;
pub mod gguf_quant;
pub mod gguf_tensor;
pub mod gguf_tokenizer;
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
        verify(t, bytes.as_ref(), origin)?;
        let shape = t.shape.iter().map(|&d| d as usize).collect();
        store.insert(t.name.clone(), TensorEntry { dtype: t.dtype()?, shape, bytes });
    }
    Ok(store)
}

/// Reads `buf.len()` bytes at an absolute offset of a model's data file (a file, or an
/// HTTP Range request in the browser).
pub type ReadAt<'a> = &'a dyn Fn(u64, &mut [u8]) -> Result<()>;

/// Whether the CPU model decodes dense tensor `t` as it loads (norms, biases, a
/// convolution kernel): everything but the 2-D `*.weight` matrices, which it only reads
/// in the forward pass.
pub fn decoded_at_load(t: &manifest::DenseTensor) -> bool {
    t.shape.len() != 2 || !t.name.ends_with(".weight")
}

/// Largest read that gathers several small tensors (with the bytes between them).
const GATHER_BYTES: u64 = 1 << 20;

/// The dense tensor store of a model whose weight matrices stay in its data file: they
/// are placeholders ([`Bytes::elsewhere`], no memory) for a GPU backend to stream from
/// the file into its buffers (`gpu::stream`), while the tensors the CPU model decodes as
/// it loads ([`decoded_at_load`], a few KiB per layer) are read with `read`, each checked
/// against its checksum and kept in a buffer of its own.
pub fn dense_store_elsewhere(m: &Manifest, read: ReadAt, origin: &str) -> Result<TensorStore> {
    let mut store = TensorStore::default();
    let mut small = Vec::new();
    for t in &m.dense.tensors {
        let shape = t.shape.iter().map(|&d| d as usize).collect();
        if decoded_at_load(t) {
            small.push(t);
        } else {
            let bytes = Bytes::elsewhere(t.offset, t.length as usize);
            store.insert(t.name.clone(), TensorEntry { dtype: t.dtype()?, shape, bytes });
        }
    }
    small.sort_by_key(|t| t.offset);
    let mut i = 0;
    while i < small.len() {
        // Neighbours within GATHER_BYTES come in one read.
        let start = small[i].offset;
        let mut end = start + small[i].length;
        let mut j = i + 1;
        while j < small.len() && small[j].offset + small[j].length - start <= GATHER_BYTES {
            end = end.max(small[j].offset + small[j].length);
            j += 1;
        }
        let mut run = vec![0u8; (end - start) as usize];
        read(start, &mut run)?;
        for t in &small[i..j] {
            let at = (t.offset - start) as usize;
            let bytes = &run[at..at + t.length as usize];
            verify(t, bytes, origin)?;
            let shape = t.shape.iter().map(|&d| d as usize).collect();
            let entry = TensorEntry { dtype: t.dtype()?, shape, bytes: Bytes::from_vec(bytes.to_vec()) };
            store.insert(t.name.clone(), entry);
        }
        i = j;
    }
    Ok(store)
}

/// Checks dense tensor `t`'s bytes against its checksum.
pub fn verify(t: &manifest::DenseTensor, bytes: &[u8], origin: &str) -> Result<()> {
    verify_sum(t, checksum(bytes), origin)
}

/// What the error of a dense tensor that fails its checksum says.
pub const DENSE_CHECKSUM_MISMATCH: &str = "checksum mismatch in dense tensor";

/// Checks the checksum `got` of dense tensor `t`'s bytes: an [`Error::Checksum`] (the
/// browser refetches a stored copy of the dense weights that gives it).
pub fn verify_sum(t: &manifest::DenseTensor, got: u64, origin: &str) -> Result<()> {
    if got != manifest::parse_checksum(&t.xxh3).unwrap_or(0) {
        return Err(Error::Checksum(format!(
            "{origin}: {DENSE_CHECKSUM_MISMATCH} {} (bytes {}..{}): the file is corrupted; convert the model again",
            t.name,
            t.offset,
            t.offset + t.length
        )));
    }
    Ok(())
}

/// True if `dir` holds a converted colibri model.
#[cfg(not(target_arch = "wasm32"))]
pub fn is_container(dir: &std::path::Path) -> bool {
    dir.join(MANIFEST_FILE).is_file()
}
/// FP8 block-scaled weights (a child of `tensors`, which pairs them with their scales).
pub use tensors::fp8;
