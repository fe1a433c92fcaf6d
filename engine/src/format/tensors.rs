//! Reading Hugging Face safetensors checkpoints: one file or many shards (with
//! `model.safetensors.index.json`). Tensors are handed out as [`Mat`] views.
//!
//! Natively a checkpoint that fits comfortably in memory is read into it; a larger one is
//! left in its files ([`TensorStore::open_dir_streamed`]): its tensors are placeholders
//! ([`Bytes::elsewhere`]) read with pread into owned memory when needed ([`Shards`]).
//! `coli convert` always leaves them there ([`TensorStore::open_dir_unread`]) and reads
//! one tensor or expert at a time. Nothing is memory-mapped: a file truncated or replaced
//! while it is served or converted gives a read error naming it, never a fault on a mapped
//! page (SIGBUS).
//!
//! Image-text checkpoints keep their language model under `model.language_model.` (as
//! transformers v5 saves them; Qwen3.5 MoE is published so): those tensors are stored under
//! the text model's own names (`model.layers.0...`), and the vision tower (`model.visual.`),
//! which no command uses, is left out ([`text_tower_name`]).

pub mod fp8;

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

/// The name a checkpoint tensor is kept under: a multimodal checkpoint's language-model
/// tensors (`model.language_model.X`) as the text model's (`model.X`); None for the vision
/// tower (`model.visual.`), which is not kept.
pub fn text_tower_name(name: String) -> Option<String> {
    if name.starts_with("model.visual.") {
        return None;
    }
    match name.strip_prefix("model.language_model.") {
        Some(rest) => Some(format!("model.{rest}")),
        None => Some(name),
    }
}

/// A tensor's dtype and shape as kept: the safetensors dtype, except deepseek_v4's integer
/// `tid2eid` tables (I32 / I64), kept as their little-endian bytes (U8, the last dimension
/// times the integer's width) for [`crate::model::v4`] to read, and its packed FP4 routed
/// experts (`*.experts.*` as I8 `[rows, cols / 2]`, or F4 `[rows, cols]`), kept as their
/// bytes (U8 `[rows, cols / 2]`) for [`fp8::pair`]; any other integer tensor is an error
/// naming its dtype.
fn dtype_and_shape(name: &str, dtype_name: &str, shape: &[usize]) -> Result<(DType, Vec<usize>)> {
    if let Some(dtype) = DType::from_safetensors(dtype_name) {
        return Ok((dtype, shape.to_vec()));
    }
    if name.contains(".experts.") && (dtype_name == "I8" || dtype_name == "F4") {
        let mut s = shape.to_vec();
        if let (Some(last), "F4") = (s.last_mut(), dtype_name) {
            if !last.is_multiple_of(2) {
                return Err(Error::Invalid(format!("tensor {name}: F4 rows of {last} values are not whole bytes")));
            }
            *last /= 2;
        }
        return Ok((DType::U8, s));
    }
    let width = match dtype_name {
        "I32" => 4,
        "I64" => 8,
        _ => 0,
    };
    match (name.ends_with("tid2eid"), shape.split_last()) {
        (true, Some((last, rest))) if width > 0 => {
            let mut s = rest.to_vec();
            s.push(last.checked_mul(width).ok_or_else(|| Error::Invalid(format!("tensor {name} too large")))?);
            Ok((DType::U8, s))
        }
        _ => Err(Error::Dtype { name: name.to_string(), dtype: dtype_name.to_string() }),
    }
}

/// One tensor of a checkpoint, still in its file's bytes.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Bytes,
}

/// Reads matrices whose bytes are placeholders ([`Bytes::elsewhere`]) into memory: the
/// shards of a streamed checkpoint ([`Shards`]), the FP8 pairs of a block-scaled one
/// ([`fp8::Fp8Table`]).
pub trait MatReader: Send + Sync {
    /// `m` with its bytes in memory (a matrix already in memory as it is).
    fn read_mat(&self, m: &Mat) -> Result<Mat>;
    /// The `len` bytes at offset `at` of the placeholders' run.
    fn read_bytes(&self, at: u64, len: usize) -> Result<Vec<u8>>;
}

/// All tensors of a checkpoint by name.
#[derive(Default)]
pub struct TensorStore {
    tensors: HashMap<String, TensorEntry>,
    /// The FP8 pairs of a block-scaled checkpoint, whose tensors are placeholders read
    /// through it ([`super::fp8`]).
    fp8: Option<std::sync::Arc<fp8::Fp8Table>>,
    /// The files of a streamed checkpoint ([`TensorStore::open_dir_streamed`]), whose
    /// tensors are placeholders at offsets of [`Shards`].
    #[cfg(not(target_arch = "wasm32"))]
    shards: Option<std::sync::Arc<Shards>>,
}

/// Checkpoints up to this size are read into memory instead of mapped or streamed: half of
/// the memory this process may still take (MemAvailable or its cgroup's limit,
/// crate::memlimit), or 4 GiB where that is unknown. `COLI_READ_LIMIT` (bytes) overrides
/// it: tests use it to stream a small checkpoint (docs/api.md).
#[cfg(not(target_arch = "wasm32"))]
fn owned_read_limit() -> u64 {
    if let Some(v) = std::env::var("COLI_READ_LIMIT").ok().and_then(|v| v.parse().ok()) {
        return v;
    }
    crate::memlimit::detect(None).available().map_or(4 << 30, |b| b / 2)
}

/// The open shard files of a streamed checkpoint, as one run of bytes: shard `i` starts
/// at the sum of the lengths of the shards before it (the offsets its tensors' placeholders
/// carry). Reads are positioned reads (pread) into owned memory, each checked against the
/// file's length first: a shard truncated since it was opened is an error naming it.
#[cfg(not(target_arch = "wasm32"))]
pub struct Shards {
    /// (path, file, first offset, length when opened), ascending offsets.
    files: Vec<(std::path::PathBuf, std::fs::File, u64, u64)>,
}

#[cfg(not(target_arch = "wasm32"))]
impl MatReader for Shards {
    fn read_mat(&self, m: &Mat) -> Result<Mat> {
        match m.bytes.file_offset() {
            Some(at) => Mat::new(m.rows, m.cols, m.dtype, Bytes::from_vec(self.read(at, m.bytes.len())?)),
            None => Ok(m.clone()),
        }
    }

    fn read_bytes(&self, at: u64, len: usize) -> Result<Vec<u8>> {
        self.read(at, len)
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Shards {
    /// Opens the regular files `paths` as one run of bytes, in this order.
    pub fn open(paths: &[std::path::PathBuf]) -> Result<Shards> {
        let mut files = Vec::with_capacity(paths.len());
        let mut base = 0u64;
        for p in paths {
            let file = crate::fsio::open_regular(p)?;
            let len = file.metadata().map_err(|e| Error::io(p, e))?.len();
            files.push((p.clone(), file, base, len));
            base = base.saturating_add(len);
        }
        Ok(Shards { files })
    }

    /// The length of file `part` when it was opened.
    pub fn part_len(&self, part: usize) -> Option<u64> {
        self.files.get(part).map(|f| f.3)
    }

    /// The `len` bytes at offset `off` of file `part`, read into owned memory.
    pub fn read_part(&self, part: usize, off: u64, len: usize) -> Result<Vec<u8>> {
        let (path, _, base, size) =
            self.files.get(part).ok_or_else(|| Error::Invalid(format!("no file {part} is open")))?;
        if off.checked_add(len as u64).is_none_or(|end| end > *size) {
            return Err(Error::io(
                path,
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("bytes {off}+{len} are past the end of the file ({size} bytes)"),
                ),
            ));
        }
        self.read(base + off, len)
    }

    /// The `len` bytes at offset `at` (of the run of all shards), read into owned memory.
    pub fn read(&self, at: u64, len: usize) -> Result<Vec<u8>> {
        let i = self.files.partition_point(|f| f.2 <= at).checked_sub(1);
        let (path, file, base, size) =
            i.and_then(|i| self.files.get(i)).ok_or_else(|| Error::Invalid(format!("offset {at} is in no shard")))?;
        let off = at - base;
        let end = off.checked_add(len as u64).filter(|&e| e <= *size);
        let past = || {
            Error::io(
                path,
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "bytes {off}+{len} are past the end of the file (truncated or replaced since it was opened?)"
                    ),
                ),
            )
        };
        end.ok_or_else(past)?;
        let now = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if now < off + len as u64 {
            return Err(past());
        }
        let mut buf = Vec::new();
        buf.try_reserve_exact(len)
            .map_err(|_| Error::Invalid(format!("{}: cannot allocate {len} bytes", path.display())))?;
        buf.resize(len, 0);
        read_exact_at(file, &mut buf, off).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => past(),
            _ => Error::io(path, e),
        })?;
        Ok(buf)
    }
}

#[cfg(unix)]
fn read_exact_at(f: &std::fs::File, buf: &mut [u8], off: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, off)
}

#[cfg(all(not(unix), not(target_arch = "wasm32")))]
fn read_exact_at(f: &std::fs::File, buf: &mut [u8], off: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek};
    let mut f = f;
    f.seek(std::io::SeekFrom::Start(off))?;
    f.read_exact(buf)
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
            let (dtype, shape) = dtype_and_shape(&name, &dtype_name, &info.shape)?;
            let (s, e) = info.data_offsets;
            let len =
                e.checked_sub(s).ok_or_else(|| err(format!("tensor {name}: data_offsets end before they start")))?;
            let start = data_start.checked_add(s).ok_or_else(|| err(format!("tensor {name}: offset overflows")))?;
            let view = bytes.slice(start, len).map_err(|x| err(x.to_string()))?;
            let Some(name) = text_tower_name(name) else { continue };
            if self.tensors.contains_key(&name) {
                return Err(err(format!(
                    "tensor {name} appears twice (in more than one shard, or with and without a language_model prefix)"
                )));
            }
            self.tensors.insert(name, TensorEntry { dtype, shape, bytes: view });
        }
        Ok(())
    }

    /// Opens a checkpoint directory: the shards listed by `model.safetensors.index.json`,
    /// else every `*.safetensors` file in it. The same as [`TensorStore::open_dir_streamed`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_dir(dir: &std::path::Path) -> Result<Self> {
        Self::open_dir_with(dir, Some(owned_read_limit()))
    }

    /// [`TensorStore::open_dir`]: a checkpoint larger than half the free memory is
    /// neither mapped nor read: its tensors are placeholders ([`Bytes::elsewhere`]) in the
    /// run of its shards ([`TensorStore::shards`]), read into memory with pread by
    /// [`TensorStore::resident`] (the dense weights) and by the model's expert source (the
    /// routed experts, as they are needed). Nothing can fault if a file is truncated later.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_dir_streamed(dir: &std::path::Path) -> Result<Self> {
        Self::open_dir_with(dir, Some(owned_read_limit()))
    }

    /// [`TensorStore::open_dir_streamed`] whatever the checkpoint's size: every tensor a
    /// placeholder, read with [`Shards::read`] when needed (`coli convert`, which reads
    /// each tensor once).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_dir_unread(dir: &std::path::Path) -> Result<Self> {
        Self::open_dir_with(dir, None)
    }

    /// The shards of a checkpoint opened by [`TensorStore::open_dir_streamed`] too large to
    /// read (its tensors are placeholders); None when its tensors are in memory.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn shards(&self) -> Option<std::sync::Arc<Shards>> {
        self.shards.clone()
    }

    /// What reads this store's placeholder tensors: the FP8 pairs (and through them the
    /// shards), or the shards; None when every tensor is in memory.
    pub fn reader(&self) -> Option<std::sync::Arc<dyn MatReader>> {
        if let Some(t) = &self.fp8 {
            return Some(t.clone());
        }
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(s) = &self.shards {
            return Some(s.clone());
        }
        None
    }

    /// Whether this store has FP8 block-scaled tensors (paired with their scales).
    pub fn has_fp8(&self) -> bool {
        self.fp8.is_some()
    }

    /// The checkpoint's name of the scale tensor paired with tensor `name` (an FP8 weight's
    /// `_scale_inv` or `.scale`, a packed FP4 expert's `.scale`: [`fp8::pair`]); None for a
    /// tensor read as it is.
    pub fn scale_of(&self, name: &str) -> Option<String> {
        let at = self.tensors.get(name)?.bytes.file_offset()?;
        self.fp8.as_ref()?.scale_name(at)
    }

    /// This store with every placeholder tensor read into owned memory ([`Self::reader`])
    /// but those for which `keep_elsewhere(name)` holds: the dense weights of a streamed
    /// or FP8 checkpoint.
    pub fn resident(&self, keep_elsewhere: impl Fn(&str) -> bool) -> Result<TensorStore> {
        let mut out = TensorStore {
            tensors: HashMap::with_capacity(self.tensors.len()),
            fp8: self.fp8.clone(),
            #[cfg(not(target_arch = "wasm32"))]
            shards: self.shards.clone(),
        };
        let reader = self.reader();
        for (name, t) in &self.tensors {
            let mut t = t.clone();
            if let (true, Some(r), false) = (t.bytes.is_elsewhere(), &reader, keep_elsewhere(name)) {
                let cols = t.shape.last().copied().unwrap_or(1);
                let rows = t.shape.iter().rev().skip(1).product::<usize>();
                t.bytes = r.read_mat(&Mat::new(rows, cols, t.dtype, t.bytes.clone())?)?.bytes;
            }
            out.tensors.insert(name.clone(), t);
        }
        Ok(out)
    }

    /// Pairs the FP8 tensors and packed FP4 experts with their scales ([`fp8::pair`]), with the block size
    /// of `dir`'s config.json, where the store holds any.
    #[cfg(not(target_arch = "wasm32"))]
    fn pair_fp8(&mut self, dir: &std::path::Path) -> Result<()> {
        if !fp8::has_pairs(self, true) {
            return Ok(());
        }
        let path = dir.join("config.json");
        let (block, fp4) = match crate::fsio::read_limited(&path, crate::fsio::MAX_JSON_BYTES) {
            Ok(b) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&b).map_err(|e| Error::Json { path: path.clone(), json: e })?;
                let block = fp8::block_size(&v).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
                (block, fp8::fp4_experts(&v))
            }
            Err(_) => (None, false),
        };
        if !fp8::has_pairs(self, fp4) {
            return Ok(());
        }
        let fallback = self.shards.clone().map(|s| s as std::sync::Arc<dyn MatReader>);
        fp8::pair(self, block, fp4, fallback)?;
        Ok(())
    }

    /// Sets the table that reads this store's FP8 placeholders.
    fn set_fp8(&mut self, table: std::sync::Arc<fp8::Fp8Table>) {
        self.fp8 = Some(table);
    }

    /// Reads the shards into memory when they hold at most `read_limit` bytes, else (and
    /// with None) leaves their tensors as placeholders.
    #[cfg(not(target_arch = "wasm32"))]
    fn open_dir_with(dir: &std::path::Path, read_limit: Option<u64>) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<std::path::PathBuf> = if index.exists() {
            let text = crate::fsio::read_limited(&index, crate::fsio::MAX_JSON_BYTES)?;
            let v: serde_json::Value =
                serde_json::from_slice(&text).map_err(|e| Error::Json { path: index.clone(), json: e })?;
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
        // replaced later cannot touch them. A larger checkpoint is read with pread as its
        // tensors are needed, each read checked against the file's length.
        let mut store = TensorStore::default();
        if read_limit.is_none_or(|limit| total > limit) {
            let mut base = 0u64;
            let mut files = Vec::with_capacity(opened.len());
            for (f, file, len) in opened {
                store.add_header(&f, &file, len, base)?;
                files.push((f, file, base, len));
                base = base.saturating_add(len);
            }
            store.shards = Some(std::sync::Arc::new(Shards { files }));
            store.pair_fp8(dir)?;
            return Ok(store);
        }
        for (f, file, len) in opened {
            let len = usize::try_from(len).map_err(|_| Error::Invalid(format!("{}: too large", f.display())))?;
            let mut buf = crate::hugemem::WeightBuf::zeroed(len)?;
            read_exact_at(&file, buf.as_mut_slice(), 0).map_err(|e| Error::io(&f, e))?;
            store.add_file(&f.display().to_string(), Bytes::new(std::sync::Arc::new(buf)))?;
        }
        store.pair_fp8(dir)?;
        Ok(store)
    }

    /// Adds the tensors of the shard `file` (`len` bytes, at `base` in the run of shards)
    /// as placeholders, from its header alone: every tensor's range checked against its
    /// dtype and shape and the file's length.
    #[cfg(not(target_arch = "wasm32"))]
    fn add_header(&mut self, path: &std::path::Path, file: &std::fs::File, len: u64, base: u64) -> Result<()> {
        let err = |msg: String| Error::Safetensors { path: path.to_path_buf(), msg };
        let mut n8 = [0u8; 8];
        if len < 8 {
            return Err(err(describe(SafeTensorError::HeaderTooSmall)));
        }
        read_exact_at(file, &mut n8, 0).map_err(|e| Error::io(path, e))?;
        let n = u64::from_le_bytes(n8);
        if n > 100_000_000 || 8 + n > len {
            return Err(err(describe(SafeTensorError::InvalidHeaderLength)));
        }
        let mut header = vec![0u8; n as usize];
        read_exact_at(file, &mut header, 8).map_err(|e| Error::io(path, e))?;
        let meta: safetensors::tensor::Metadata =
            serde_json::from_slice(&header).map_err(|e| err(format!("header: {e}")))?;
        let data_start = 8 + n;
        let data_len = len - data_start;
        let mut end_max = 0u64;
        for (name, info) in meta.tensors() {
            let dtype_name = info.dtype.to_string();
            let (dtype, shape) = dtype_and_shape(&name, &dtype_name, &info.shape)?;
            let (s, e) = (info.data_offsets.0 as u64, info.data_offsets.1 as u64);
            let bits = info.shape.iter().try_fold(info.dtype.bitsize() as u64, |a, &d| a.checked_mul(d as u64));
            let want = bits.filter(|b| b % 8 == 0).map(|b| b / 8);
            if e < s || want != Some(e - s) {
                return Err(err(format!(
                    "tensor {name}: data_offsets {s}..{e} do not hold {dtype_name} {:?}",
                    info.shape
                )));
            }
            if e > data_len {
                return Err(err(describe(SafeTensorError::MetadataIncompleteBuffer)));
            }
            end_max = end_max.max(e);
            let Some(name) = text_tower_name(name) else { continue };
            if self.tensors.contains_key(&name) {
                return Err(err(format!(
                    "tensor {name} appears twice (in more than one shard, or with and without a language_model prefix)"
                )));
            }
            let len = usize::try_from(e - s).map_err(|_| err(format!("tensor {name} too large")))?;
            let at = base + data_start + s;
            self.tensors.insert(name, TensorEntry { dtype, shape, bytes: Bytes::elsewhere(at, len) });
        }
        if end_max != data_len {
            return Err(err(describe(SafeTensorError::MetadataIncompleteBuffer)));
        }
        Ok(())
    }

    /// Removes one tensor.
    pub fn remove(&mut self, name: &str) -> Option<TensorEntry> {
        self.tensors.remove(name)
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

    /// A multimodal checkpoint's language model under its own prefix is read under the
    /// text model's names; its vision tower is left out; the same tensor twice is an error.
    #[test]
    fn text_tower_names_and_no_vision_tower() {
        let f = file(&[
            ("model.language_model.norm.weight", "F32", vec![1], vec![0, 0, 128, 63]),
            ("model.visual.blocks.0.attn.qkv.weight", "F32", vec![1], vec![0; 4]),
            ("lm_head.weight", "F32", vec![1, 1], vec![0; 4]),
        ]);
        let mut s = TensorStore::default();
        s.add_file("x", Bytes::from_vec(f)).unwrap();
        let mut names: Vec<&String> = s.names().collect();
        names.sort();
        assert_eq!(names, ["lm_head.weight", "model.norm.weight"]);
        assert_eq!(s.vector("model.norm.weight", 1).unwrap(), [1.0]);
        let twice = file(&[("model.norm.weight", "F32", vec![1], vec![0; 4])]);
        let e = s.add_file("y", Bytes::from_vec(twice)).unwrap_err().to_string();
        assert!(e.contains("model.norm.weight") && e.contains("twice"), "{e}");
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
