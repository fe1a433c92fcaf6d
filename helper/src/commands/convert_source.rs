//! Reading a Hugging Face checkpoint for `coli convert` without mapping it: the source is
//! opened with every tensor a placeholder in its files
//! ([`TensorStore::open_dir_unread`]), each dense tensor is read (pread) a block of rows
//! at a time as it is written and each routed expert when it is written. A shard truncated
//! or replaced during the conversion is a read error naming it (exit 1, the output left
//! unfinished: no manifest, the journal kept for a rerun), never a SIGBUS. The GGUF source
//! reads the same way (convert_gguf.rs). Also the rows' encoding into their stored type
//! and the positioned reads and writes of the output file.

use std::sync::Arc;

use std::fs::File;

use anyhow::{Context, Result};
use colibri_engine::format::quant::quantize_row;
use colibri_engine::format::tensors::{is_routed_expert_weight, MatReader, TensorEntry, TensorStore};
use colibri_engine::model::config::Family;
use colibri_engine::tensor::DType;
use colibri_engine::tensor::{Bytes, Mat};
use colibri_engine::ModelConfig;
use rayon::prelude::*;

/// The tensors the planner builds its `Model` from (for the checkpoint's shapes and its
/// experts' layout, never its values): the routed experts stay placeholders in `store`'s
/// shards (read when each is written: [`resolve`]); the other tensors are views of one
/// zeroed allocation of the largest one's size (pages never written cost no memory, as
/// for a GGUF's stub), as their values are read from `store` when written. gpt_oss's fused
/// experts are reordered as the model loads, so they are read (as serving one does).
pub fn planning_store(cfg: &ModelConfig, store: &TensorStore) -> Result<TensorStore> {
    let Some(shards) = store.shards() else { return Ok(store.resident(|_| true)?) };
    let mut names: Vec<&String> = store.names().collect();
    names.sort();
    let largest = names
        .iter()
        .filter(|n| !is_routed_expert_weight(n))
        .map(|n| store.get(n).map(|t| t.bytes.len()))
        .try_fold(0usize, |m, l| l.map(|l| m.max(l)))?;
    let zeros = Bytes::from_vec(vec![0u8; largest]);
    let mut out = TensorStore::default();
    for n in names {
        let t = store.get(n)?;
        let bytes = match (is_routed_expert_weight(n), t.bytes.file_offset()) {
            (true, Some(at)) if cfg.family == Family::GptOss => Bytes::from_vec(shards.read(at, t.bytes.len())?),
            (true, _) => t.bytes.clone(),
            (false, _) => zeros.slice(0, t.bytes.len())?,
        };
        out.insert(n.clone(), TensorEntry { dtype: t.dtype, shape: t.shape.clone(), bytes });
    }
    Ok(out)
}

/// `m` with its bytes in memory: read by the store's `reader` when they are a placeholder
/// (its shards, or an FP8 weight laid out as rows with its scales).
pub fn resolve(m: Mat, reader: Option<&Arc<dyn MatReader>>) -> Result<Mat> {
    match (m.bytes.file_offset(), reader) {
        (Some(_), Some(r)) => Ok(r.read_mat(&m)?),
        (Some(_), None) => anyhow::bail!("a tensor's bytes are not in memory and no file holds them"),
        (None, _) => Ok(m),
    }
}

/// Rows of `src` from `first` on, stored as `dtype` into `out` (whole rows); rows already
/// in `dtype` are copied as they are.
pub fn encode_rows(src: &Mat, first: usize, dtype: DType, out: &mut [u8]) -> Result<()> {
    let rb = dtype.row_bytes(src.cols).context("bad stored type")?;
    if rb == 0 {
        return Ok(());
    }
    if src.dtype == dtype {
        let from = first.checked_mul(rb).context("row offset overflows")?;
        let bytes = src.bytes.as_ref().get(from..from + out.len()).context("rows outside the tensor")?;
        out.copy_from_slice(bytes);
        return Ok(());
    }
    out.par_chunks_mut(rb).enumerate().try_for_each_init(
        || vec![0.0f32; src.cols],
        |row, (k, o)| {
            src.row_into(first + k, row);
            quantize_row(dtype, row, o)
        },
    )?;
    Ok(())
}

pub fn write_at(f: &File, buf: &[u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::write_all_at(f, buf, offset)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Seek, SeekFrom};
        let mut f = f;
        f.seek(SeekFrom::Start(offset))?;
        f.write_all(buf)
    }
}

pub fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(f, buf, offset)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = f;
        f.seek(SeekFrom::Start(offset))?;
        f.read_exact(buf)
    }
}
