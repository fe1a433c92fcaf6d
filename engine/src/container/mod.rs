//! The colibri model container: a directory with `colibri.json` (the manifest), one data
//! file (dense tensors, then every routed expert in its own 4 KiB-aligned byte range), and
//! the Hugging Face config and tokenizer files. Specified in docs/format.md.
//!
//! Parsing never touches the file system: bytes come through [`ByteSource`], so the
//! browser can supply HTTP ranges or OPFS reads where the native helper uses pread.

pub mod experts;
pub mod manifest;
pub mod quant;

use std::sync::Arc;

pub use experts::{CacheStats, ContainerExperts};
pub use manifest::{checksum, Manifest};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::tensor::Bytes;
use crate::weights::{TensorEntry, TensorStore};

/// Name of the manifest file; its presence marks a directory as a converted model.
pub const MANIFEST_FILE: &str = "colibri.json";

/// Random-access reads from a model's data file (a local file, an HTTP server, OPFS).
pub trait ByteSource: Send + Sync {
    /// Fills `buf` with the bytes at `offset`; an error if any of them is missing.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Names the source in error messages (a path or URL).
    fn name(&self) -> String;
    /// Hint: these (offset, length) ranges are about to be read, each by one `read_at`.
    /// A remote source can fetch them all in one request; local files ignore it.
    fn prefetch(&self, _ranges: &[(u64, usize)]) -> Result<()> {
        Ok(())
    }
}

/// A [`ByteSource`] over bytes already in memory (tests, small models, fetched files).
pub struct MemorySource {
    pub bytes: Bytes,
    pub name: String,
}

impl ByteSource for MemorySource {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let start = usize::try_from(offset).map_err(|_| Error::Invalid(format!("{}: offset {offset} too large", self.name)))?;
        let src = self.bytes.slice(start, buf.len()).map_err(|e| Error::Invalid(format!("{}: {e}", self.name)))?;
        buf.copy_from_slice(src.as_ref());
        Ok(())
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

/// Positioned reads from a local file (pread on unix; no shared cursor, so concurrent
/// reads need no lock).
#[cfg(not(target_arch = "wasm32"))]
pub struct FileSource {
    file: std::fs::File,
    path: std::path::PathBuf,
    #[cfg(not(any(unix, windows)))]
    lock: std::sync::Mutex<()>,
}

#[cfg(not(target_arch = "wasm32"))]
impl FileSource {
    pub fn open(path: &std::path::Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        Ok(FileSource {
            file,
            path: path.to_path_buf(),
            #[cfg(not(any(unix, windows)))]
            lock: std::sync::Mutex::new(()),
        })
    }

    pub fn len(&self) -> Result<u64> {
        Ok(self.file.metadata().map_err(|e| Error::io(&self.path, e))?.len())
    }

    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    pub fn file(&self) -> &std::fs::File {
        &self.file
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl ByteSource for FileSource {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        #[cfg(unix)]
        let r = std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset);
        #[cfg(windows)]
        let r = {
            use std::os::windows::fs::FileExt;
            let mut done = 0;
            let mut r = Ok(());
            while done < buf.len() {
                match self.file.seek_read(&mut buf[done..], offset + done as u64) {
                    Ok(0) => {
                        r = Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
                        break;
                    }
                    Ok(n) => done += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
            }
            r
        };
        #[cfg(not(any(unix, windows)))]
        let r = {
            use std::io::{Read, Seek};
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            let mut f = &self.file;
            f.seek(std::io::SeekFrom::Start(offset)).and_then(|_| f.read_exact(buf))
        };
        r.map_err(|e| {
            let e = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                std::io::Error::new(e.kind(), format!("bytes {offset}+{} are past the end of the file (truncated?)", buf.len()))
            } else {
                e
            };
            Error::io(&self.path, e)
        })
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

/// Builds the tensor store of the dense tensors from the bytes of the dense region
/// (`dense` starts at the region's offset), verifying each tensor's checksum.
pub fn dense_store(m: &Manifest, dense: &Bytes, origin: &str) -> Result<TensorStore> {
    if dense.len() as u64 != m.dense.length {
        return Err(Error::Invalid(format!("{origin}: dense region is {} bytes, expected {}", dense.len(), m.dense.length)));
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

/// A model from a container whose data file is reachable through `source`, with
/// `dense` holding the dense region's bytes and `ram` the expert-cache budget in bytes
/// (`None`: keep every expert once read; `Some(0)`: keep none).
pub fn model_from_parts(m: &Manifest, dense: &Bytes, source: Arc<dyn ByteSource>, ram: Option<u64>) -> Result<Model> {
    let cfg = ModelConfig::from_value(&m.config).map_err(|e| Error::Config(format!("{MANIFEST_FILE}: {e}")))?;
    let store = dense_store(m, dense, &source.name())?;
    let experts = ContainerExperts::new(m, &cfg, source, ram)?;
    Model::from_parts(cfg, &store, Box::new(experts))
}

/// Opens a converted model directory. The dense region is memory-mapped; experts are
/// read with pread on demand and cached under the `ram` budget.
#[cfg(not(target_arch = "wasm32"))]
pub fn open_dir(dir: &std::path::Path, ram: Option<u64>) -> Result<Model> {
    let (m, source) = open_manifest(dir)?;
    let dense = if m.dense.length == 0 {
        Bytes::from_vec(Vec::new())
    } else {
        // SAFETY: read-only map; model files are not expected to change under us.
        let map = unsafe { memmap2::MmapOptions::new().offset(m.dense.offset).len(m.dense.length as usize).map(source.file()) }
            .map_err(|e| Error::io(dir.join(&m.data_file), e))?;
        Bytes::new(Arc::new(map))
    };
    model_from_parts(&m, &dense, Arc::new(source), ram)
}

/// Reads and validates `dir/colibri.json` and opens its data file, checking its size.
#[cfg(not(target_arch = "wasm32"))]
pub fn open_manifest(dir: &std::path::Path) -> Result<(Manifest, FileSource)> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let m = Manifest::parse(&bytes).map_err(|e| Error::Invalid(format!("{}: {}", dir.display(), e)))?;
    let data = dir.join(&m.data_file);
    let source = FileSource::open(&data)?;
    let len = source.len()?;
    if len != m.data_size {
        return Err(Error::Invalid(format!(
            "{}: {len} bytes, but the manifest says {} (truncated or from another conversion)",
            data.display(),
            m.data_size
        )));
    }
    Ok((m, source))
}

/// True if `dir` holds a converted colibri model.
#[cfg(not(target_arch = "wasm32"))]
pub fn is_container(dir: &std::path::Path) -> bool {
    dir.join(MANIFEST_FILE).is_file()
}
