//! Reading Hugging Face safetensors checkpoints: one file or many shards (with
//! `model.safetensors.index.json`), memory-mapped on native targets, plain buffers on
//! wasm32. Tensors are handed out as [`Mat`] views; nothing is copied up front.

use std::collections::HashMap;

use safetensors::{SafeTensorError, SafeTensors};

use crate::error::{Error, Result};
use crate::tensor::{Bytes, DType, Mat};

/// Whether checkpoint tensor `name` holds routed-expert weights (streamed, not resident):
/// under `.experts.`, except gpt_oss's stacked expert biases (`..._bias`), which are small
/// and stay with the dense weights of their layer.
pub fn is_routed_expert_weight(name: &str) -> bool {
    name.contains(".experts.") && !name.ends_with("_bias")
}

/// One tensor of a checkpoint, still in its file's bytes.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Bytes,
}

/// All tensors of a checkpoint by name.
#[derive(Default)]
pub struct TensorStore {
    tensors: HashMap<String, TensorEntry>,
}

/// Checkpoints up to this size are read into memory instead of mapped: half of the memory
/// this process may still take (MemAvailable or its cgroup's limit, crate::memlimit), or
/// 4 GiB where that is unknown.
#[cfg(not(target_arch = "wasm32"))]
fn owned_read_limit() -> u64 {
    crate::memlimit::detect(None).available().map_or(4 << 30, |b| b / 2)
}

fn describe(e: SafeTensorError) -> String {
    match e {
        SafeTensorError::MetadataIncompleteBuffer => {
            "the file is truncated (its header describes more data than it holds)".into()
        }
        SafeTensorError::HeaderTooSmall | SafeTensorError::InvalidHeaderLength => {
            "the file is too short to hold its header (truncated?)".into()
        }
        other => other.to_string(),
    }
}

impl TensorStore {
    /// Adds every tensor of one safetensors file held in `bytes`; `origin` names it in errors.
    pub fn add_file(&mut self, origin: &str, bytes: Bytes) -> Result<()> {
        let err = |msg: String| Error::Safetensors { path: origin.into(), msg };
        let (n, meta) = SafeTensors::read_metadata(bytes.as_ref()).map_err(|e| err(describe(e)))?;
        let data_start = 8 + n;
        for (name, info) in meta.tensors() {
            let dtype_name = info.dtype.to_string();
            let dtype = DType::from_safetensors(&dtype_name)
                .ok_or_else(|| Error::Dtype { name: name.clone(), dtype: dtype_name.clone() })?;
            let (s, e) = info.data_offsets;
            let len =
                e.checked_sub(s).ok_or_else(|| err(format!("tensor {name}: data_offsets end before they start")))?;
            let start = data_start.checked_add(s).ok_or_else(|| err(format!("tensor {name}: offset overflows")))?;
            let view = bytes.slice(start, len).map_err(|x| err(x.to_string()))?;
            if self.tensors.contains_key(&name) {
                return Err(err(format!("tensor {name} appears in more than one shard")));
            }
            self.tensors.insert(name, TensorEntry { dtype, shape: info.shape.clone(), bytes: view });
        }
        Ok(())
    }

    /// Opens a checkpoint directory: the shards listed by `model.safetensors.index.json`,
    /// else every `*.safetensors` file in it.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_dir(dir: &std::path::Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<std::path::PathBuf> = if index.exists() {
            let text = crate::fsio::read_limited(&index, crate::fsio::MAX_JSON_BYTES)?;
            let v: serde_json::Value =
                serde_json::from_slice(&text).map_err(|e| Error::Json { path: index.clone(), source: e })?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::Config(format!("{}: no \"weight_map\" object", index.display())))?;
            let mut names: Vec<&str> = map.values().filter_map(|s| s.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            for n in &names {
                if n.contains('/') || n.contains('\\') || n.starts_with('.') {
                    return Err(Error::Config(format!(
                        "{}: shard name {n:?} is not a plain file name",
                        index.display()
                    )));
                }
            }
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
            let mut files: Vec<_> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            files.sort();
            files
        };
        if files.is_empty() {
            return Err(Error::Invalid(format!("{}: no *.safetensors files found", dir.display())));
        }
        let mut opened = Vec::with_capacity(files.len());
        let mut total = 0u64;
        for f in files {
            let file = crate::fsio::open_regular(&f)?;
            let len = file.metadata().map_err(|e| Error::io(&f, e))?.len();
            total = total.saturating_add(len);
            opened.push((f, file, len));
        }
        // Read the shards into owned memory when they fit comfortably: a file truncated or
        // replaced later cannot touch them. Only a checkpoint larger than half the free
        // memory is memory-mapped (where a truncation under us would fault).
        let map = total > owned_read_limit();
        let mut store = TensorStore::default();
        for (f, file, len) in opened {
            let bytes = if map {
                // SAFETY: the map is read-only. If another process truncates the file while
                // it is mapped, reads fault; only checkpoints too large to read are mapped.
                let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(&f, e))?;
                Bytes::new(std::sync::Arc::new(map))
            } else {
                use std::io::Read;
                let mut buf = Vec::with_capacity(len as usize);
                file.take(len).read_to_end(&mut buf).map_err(|e| Error::io(&f, e))?;
                Bytes::from_vec(buf)
            };
            store.add_file(&f.display().to_string(), bytes)?;
        }
        Ok(store)
    }

    /// The bytes of one file: read into memory when it is at most half the free memory
    /// (a file truncated later cannot touch them), else memory-mapped.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_or_map(path: &std::path::Path) -> Result<Bytes> {
        let file = crate::fsio::open_regular(path)?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if len > owned_read_limit() {
            // SAFETY: read-only map; a truncation by another process while mapped faults,
            // as for the large safetensors checkpoints above.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
            return Ok(Bytes::new(std::sync::Arc::new(map)));
        }
        use std::io::Read;
        let mut buf = Vec::with_capacity(len as usize);
        file.take(len).read_to_end(&mut buf).map_err(|e| Error::io(path, e))?;
        Ok(Bytes::from_vec(buf))
    }

    /// Adds (or replaces) one tensor.
    pub fn insert(&mut self, name: String, entry: TensorEntry) {
        self.tensors.insert(name, entry);
    }

    pub fn get(&self, name: &str) -> Result<&TensorEntry> {
        self.tensors.get(name).ok_or_else(|| Error::MissingTensor { name: name.to_string() })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.tensors.keys()
    }

    fn check_shape(name: &str, t: &TensorEntry, want: &[usize]) -> Result<()> {
        if t.shape != want {
            return Err(Error::Shape { name: name.to_string(), got: t.shape.clone(), want: want.to_vec() });
        }
        Ok(())
    }

    /// A 2-D weight of exactly `[rows, cols]`.
    pub fn mat(&self, name: &str, rows: usize, cols: usize) -> Result<Mat> {
        let t = self.get(name)?;
        Self::check_shape(name, t, &[rows, cols])?;
        Mat::new(rows, cols, t.dtype, t.bytes.clone())
    }

    /// Row block `index` of a 3-D tensor `[n, rows, cols]` (fused expert weights).
    pub fn mat_in_stack(&self, name: &str, index: usize, n: usize, rows: usize, cols: usize) -> Result<Mat> {
        let t = self.get(name)?;
        Self::check_shape(name, t, &[n, rows, cols])?;
        let all = Mat::new(n * rows, cols, t.dtype, t.bytes.clone())?;
        all.row_block(index * rows, rows)
    }

    /// A 2-D tensor of exactly `[rows, cols]` (biases of stacked experts), as f32.
    pub fn vector_2d(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>> {
        Ok(self.mat(name, rows, cols)?.to_f32())
    }

    /// A 1-D tensor of exactly `len` values, as f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.get(name)?;
        Self::check_shape(name, t, &[len])?;
        Ok(Mat::new(1, len, t.dtype, t.bytes.clone())?.to_f32())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        for (name, dt, shape, bytes) in tensors {
            let start = data.len();
            data.extend_from_slice(bytes);
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": dt, "shape": shape, "data_offsets": [start, data.len()]}),
            );
        }
        let h = serde_json::to_vec(&header).unwrap();
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend(h);
        out.extend(data);
        out
    }

    #[test]
    fn reads_and_checks_shapes() {
        let w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let f = file(&[("w", "F32", vec![2, 3], w)]);
        let mut s = TensorStore::default();
        s.add_file("x.safetensors", Bytes::from_vec(f)).unwrap();
        assert_eq!(s.mat("w", 2, 3).unwrap().to_f32(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let e = s.mat("w", 3, 2).unwrap_err().to_string();
        assert!(e.contains("[2, 3]") && e.contains("[3, 2]"), "{e}");
        assert!(matches!(s.mat("nope", 1, 1), Err(Error::MissingTensor { .. })));
    }

    #[test]
    fn truncated_file_is_a_clear_error() {
        let w: Vec<u8> = vec![0; 24];
        let mut f = file(&[("w", "F32", vec![2, 3], w)]);
        f.truncate(f.len() - 5);
        let mut s = TensorStore::default();
        let e = s.add_file("x.safetensors", Bytes::from_vec(f)).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        let mut s = TensorStore::default();
        assert!(s.add_file("y", Bytes::from_vec(vec![1, 2, 3])).unwrap_err().to_string().contains("too short"));
    }

    #[test]
    fn unsupported_dtype_is_named() {
        let f = file(&[("w", "I64", vec![1], vec![0; 8])]);
        let mut s = TensorStore::default();
        let e = s.add_file("x", Bytes::from_vec(f)).unwrap_err().to_string();
        assert!(e.contains("I64"), "{e}");
    }
}
