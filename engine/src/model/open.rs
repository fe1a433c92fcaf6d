//! Opening a model: the one place that turns a converted model's `colibri.json` into a
//! [`Model`] (natively from a directory, in the browser from fetched bytes), and that
//! opens a model directory of either kind. The manifest is parsed once, the data file
//! opened once; the dense region becomes the model's tensors (format), the routed experts
//! come from an [`ExpertCache`] over a [`ByteSource`] (expert supply).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::experts::cache::{CacheOptions, ExpertCache};
use crate::experts::source::ByteSource;
use crate::format::manifest::{fingerprint, Manifest};
use crate::format::{dense_store, MANIFEST_FILE};
use crate::model::config::ModelConfig;
use crate::model::Model;
use crate::tensor::Bytes;

/// A converted model's manifest, parsed and checked once, with the config it carries.
#[derive(Clone, Debug)]
pub struct Container {
    pub manifest: Manifest,
    pub cfg: ModelConfig,
    /// Which version of the model this is: the xxh3 of colibri.json (hex). Usage counts
    /// carry it, so a retrained model of the same shape starts its counts over.
    pub fingerprint: String,
}

impl Container {
    /// Parses the bytes of `colibri.json`; `origin` (a directory or URL) names them in errors.
    pub fn parse(bytes: &[u8], origin: &str) -> Result<Self> {
        let manifest = Manifest::parse(bytes).map_err(|e| Error::Invalid(format!("{origin}: {e}")))?;
        let cfg =
            ModelConfig::from_value(&manifest.config).map_err(|e| Error::Config(format!("{MANIFEST_FILE}: {e}")))?;
        Ok(Container { manifest, cfg, fingerprint: fingerprint(bytes) })
    }

    /// The shape of the routed experts: the config's, plus the MTP layer where this
    /// container holds its experts (containers converted before colibri kept MTP have none).
    pub fn expert_shape(&self) -> crate::experts::cache::ExpertShape {
        let mut shape = self.cfg.expert_shape();
        let n = self.cfg.n_layers;
        shape.mtp_layers =
            (n..n + self.cfg.mtp_layers).take_while(|&l| self.manifest.expert_layer(l).is_some()).count();
        shape
    }

    /// The model whose dense region holds `dense` (its bytes, checked against their
    /// checksums) and whose routed experts are read from `source` and cached as `opts` says.
    pub fn load(&self, dense: &Bytes, source: Arc<dyn ByteSource>, opts: CacheOptions) -> Result<Model> {
        let store = dense_store(&self.manifest, dense, &source.name())?;
        let experts = ExpertCache::with_options(&self.manifest, &self.expert_shape(), source, opts)?;
        Model::from_parts(self.cfg.clone(), &store, Box::new(experts))
    }

    /// The model with its weight matrices left in the data file ([`Bytes::elsewhere`]):
    /// for a GPU backend that streams them into its buffers (`GpuModel::new_streamed`),
    /// so that they never sit in memory whole. `read` reads the data file (for the few
    /// small tensors the model decodes now); the CPU forward pass refuses such a model.
    pub fn load_elsewhere(
        &self,
        read: crate::format::ReadAt,
        source: Arc<dyn ByteSource>,
        opts: CacheOptions,
    ) -> Result<Model> {
        let store = crate::format::dense_store_elsewhere(&self.manifest, read, &source.name())?;
        let experts = ExpertCache::with_options(&self.manifest, &self.expert_shape(), source, opts)?;
        Model::from_parts(self.cfg.clone(), &store, Box::new(experts))
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub use native::ModelDir;

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use super::Container;
    use crate::error::{Error, Result};
    use crate::experts::cache::CacheOptions;
    use crate::experts::mirror::MirrorSource;
    use crate::experts::source::{ByteSource, FileSource};
    use crate::format::tensors::TensorStore;
    use crate::format::MANIFEST_FILE;
    use crate::model::config::ModelConfig;
    use crate::model::Model;
    use crate::tensor::Bytes;

    /// A model directory, opened: a converted model (colibri.json parsed, its data file
    /// open and of the size the manifest says) or a Hugging Face checkpoint (config.json
    /// parsed; the safetensors are read by [`ModelDir::load`]).
    pub enum ModelDir {
        Container { dir: PathBuf, container: Box<Container>, data: FileSource, mirror: Option<Mirror> },
        HuggingFace { dir: PathBuf, cfg: Box<ModelConfig> },
    }

    /// A second copy of a converted model's data file on another device
    /// ([`ModelDir::with_mirror`]), and who hears when a copy fails.
    pub struct Mirror {
        data: FileSource,
        on_failure: Box<dyn Fn(&str) + Send + Sync>,
    }

    /// Bytes of a streamed Hugging Face checkpoint's experts kept in memory without `--ram`.
    fn streamed_expert_budget() -> u64 {
        crate::fsio::meminfo("MemAvailable").map_or(1 << 30, |b| b / 4)
    }

    impl ModelDir {
        /// Opens `dir`; with `direct`, a converted model's data file also with O_DIRECT
        /// (see [`FileSource::open_with`]).
        pub fn open(dir: &Path, direct: bool) -> Result<Self> {
            let path = dir.join(MANIFEST_FILE);
            if !path.is_file() {
                let cfg_path = dir.join("config.json");
                let bytes = crate::fsio::read_limited(&cfg_path, crate::fsio::MAX_JSON_BYTES)?;
                let cfg = ModelConfig::from_json_bytes(&bytes)
                    .map_err(|e| Error::Config(format!("{}: {e}", cfg_path.display())))?;
                return Ok(ModelDir::HuggingFace { dir: dir.to_path_buf(), cfg: Box::new(cfg) });
            }
            let bytes = crate::fsio::read_limited(&path, crate::format::manifest::MAX_MANIFEST_BYTES)?;
            let container = Container::parse(&bytes, &dir.display().to_string())?;
            let m = &container.manifest;
            let data_path = dir.join(&m.data_file);
            let data = FileSource::open_with(&data_path, direct)?;
            let len = data.len()?;
            if len != m.data_size {
                return Err(Error::Invalid(format!(
                    "{}: {len} bytes, but the manifest says {} (truncated or from another conversion)",
                    data_path.display(),
                    m.data_size
                )));
            }
            Ok(ModelDir::Container { dir: dir.to_path_buf(), container: Box::new(container), data, mirror: None })
        }

        /// Reads the experts from `copy` too: another directory holding the same converted
        /// model (its colibri.json byte for byte, its data file of the same size) on
        /// another device. Each expert read goes to the copy expected to finish first
        /// ([`MirrorSource`](crate::experts::mirror::MirrorSource)); a copy that fails is
        /// left out with `on_failure(why)`. An error, and nothing changed, when `copy` is
        /// not the same model or this is a Hugging Face checkpoint.
        pub fn add_mirror(&mut self, copy: &Path, on_failure: Box<dyn Fn(&str) + Send + Sync>) -> Result<()> {
            let ModelDir::Container { dir, container, data, mirror } = self else {
                return Err(Error::Invalid("only a converted model's experts can be read from a copy".into()));
            };
            let max = crate::format::manifest::MAX_MANIFEST_BYTES;
            let theirs = crate::fsio::read_limited(&copy.join(MANIFEST_FILE), max)?;
            if theirs != crate::fsio::read_limited(&dir.join(MANIFEST_FILE), max)? {
                return Err(Error::Invalid(format!(
                    "{}: not a copy of {} (its {MANIFEST_FILE} differs)",
                    copy.display(),
                    dir.display()
                )));
            }
            let copy_path = copy.join(&container.manifest.data_file);
            let copy_data = FileSource::open_with(&copy_path, data.direct())?;
            let len = copy_data.len()?;
            if len != container.manifest.data_size {
                return Err(Error::Invalid(format!(
                    "{}: {len} bytes, but the manifest says {} (an unfinished copy?)",
                    copy_path.display(),
                    container.manifest.data_size
                )));
            }
            *mirror = Some(Mirror { data: copy_data, on_failure });
            Ok(())
        }

        pub fn dir(&self) -> &Path {
            match self {
                ModelDir::Container { dir, .. } | ModelDir::HuggingFace { dir, .. } => dir,
            }
        }

        pub fn cfg(&self) -> &ModelConfig {
            match self {
                ModelDir::Container { container, .. } => &container.cfg,
                ModelDir::HuggingFace { cfg, .. } => cfg,
            }
        }

        /// The parsed manifest and the open data file of a converted model.
        pub fn container(&self) -> Option<(&Container, &FileSource)> {
            match self {
                ModelDir::Container { container, data, .. } => Some((container, data)),
                ModelDir::HuggingFace { .. } => None,
            }
        }

        /// The parsed manifest and the open data file; an error for a Hugging Face checkpoint.
        pub fn into_container(self) -> Result<(Container, FileSource)> {
            match self {
                ModelDir::Container { container, data, .. } => Ok((*container, data)),
                ModelDir::HuggingFace { dir, .. } => Err(Error::Invalid(format!(
                    "{}: not a converted colibri model (no {MANIFEST_FILE})",
                    dir.display()
                ))),
            }
        }

        /// Builds the model. A converted model's dense region is read into memory and its
        /// experts read on demand, cached as `opts` says; a Hugging Face checkpoint is read
        /// whole when it fits in half the free memory, else its dense weights are read and
        /// its experts read when used (pread, never mapped), `opts.ram` bytes of them kept
        /// (default: a quarter of MemAvailable).
        pub fn load(self, opts: CacheOptions) -> Result<Model> {
            match self {
                ModelDir::HuggingFace { dir, cfg } => {
                    // Streamed when too large to read: nothing mapped (see TensorStore).
                    let budget = opts.ram.unwrap_or_else(streamed_expert_budget);
                    Model::from_store_with(*cfg, &TensorStore::open_dir_streamed(&dir)?, budget)
                }
                ModelDir::Container { dir, container, data, mirror } => {
                    let m = &container.manifest;
                    // The dense region is read into owned memory (it is resident anyway,
                    // and every byte is checksummed at load): a data file truncated or
                    // replaced while served gives read errors on the experts it no longer
                    // holds, never a fault on a mapped page.
                    let len = usize::try_from(m.dense.length)
                        .map_err(|_| Error::Invalid(format!("{}: dense region too large", dir.display())))?;
                    // In huge-page-backed memory (crate::hugemem): decode reads all of it.
                    let mut buf = crate::hugemem::WeightBuf::zeroed(len).map_err(|e| {
                        Error::Invalid(format!(
                            "{}: cannot allocate {len} bytes for the dense weights: {e}",
                            dir.display()
                        ))
                    })?;
                    data.read_at(m.dense.offset, buf.as_mut_slice())?;
                    let dense = Bytes::new(Arc::new(buf));
                    let source: Arc<dyn ByteSource> = match mirror {
                        None => Arc::new(data),
                        Some(m) => Arc::new(MirrorSource::new(vec![Box::new(data), Box::new(m.data)], m.on_failure)?),
                    };
                    container.load(&dense, source, opts)
                }
            }
        }
    }
}
