//! `coli doctor [MODEL]`: checks of what a user needs on this machine (the browser engine
//! built into this coli, a Vulkan adapter, a helper on the default port, installed
//! models, free disk) and, given one, of a model (a directory or an installed id).
//! `--checksums` reads every expert of a converted model and verifies its checksum (the
//! manifest's every offset and size are checked as it is parsed: inside the data file,
//! no two tensors, experts or parts sharing a byte, lengths matching dtype and shape).
//! `--fix` seals a model converted before manifests carried their own checksum: every
//! byte verified, then `manifest_xxh3` added.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Result};
use clap::Args;
use colibri_engine::experts::cache::{CacheOptions, ExpertCache};
use colibri_engine::format::is_container;
use colibri_engine::model::open::ModelDir;
use colibri_engine::tokenizer::Tokenizer;
use colibri_engine::Model;
use indicatif::{ProgressBar, ProgressDrawTarget};

use crate::commands::doctor_machine as machine;
use crate::commands::doctor_report::Report;
use crate::commands::info::{human, summarize};

#[derive(Args)]
pub struct DoctorArgs {
    /// Model to check: a directory (Hugging Face checkpoint or converted colibri model) or
    /// the id of an installed model.
    pub path: Option<PathBuf>,
    /// The model, as a flag (same as PATH).
    #[arg(long, conflicts_with = "path")]
    pub model: Option<PathBuf>,
    /// Verify the checksum of every expert (reads the whole data file).
    #[arg(long)]
    pub checksums: bool,
    /// Add the manifest's own checksum (manifest_xxh3) to a model converted by an older
    /// coli, after verifying every dense tensor and expert against the manifest.
    #[arg(long)]
    pub fix: bool,
    /// The port where a running helper is looked for.
    #[arg(long, default_value_t = 7878)]
    pub port: u16,
    /// Directory of installed models (default: $XDG_DATA_HOME/colibri/models).
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
}

fn simd_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            v.push("avx2");
        }
        if std::arch::is_x86_feature_detected!("fma") {
            v.push("fma");
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            v.push("avx512f");
        }
    }
    #[cfg(target_arch = "aarch64")]
    v.push("neon");
    v
}

/// (MemTotal, MemAvailable) in bytes.
fn meminfo() -> Option<(u64, u64)> {
    Some((colibri_engine::fsio::meminfo("MemTotal")?, colibri_engine::fsio::meminfo("MemAvailable")?))
}

pub fn doctor(a: DoctorArgs) -> Result<()> {
    let mut r = Report { failed: 0 };
    r.ok("coli", format!("{} ({} {})", env!("CARGO_PKG_VERSION"), std::env::consts::OS, std::env::consts::ARCH));
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    r.ok("cpu", format!("{cores} threads available; SIMD: {}", simd_features().join(" ")));
    match meminfo() {
        Some((total, avail)) => r.ok("memory", format!("{} total, {} available", human(total), human(avail))),
        None => r.warn("memory", "unknown on this platform"),
    }
    machine::memory_limit(&mut r);
    let models_dir = a.models_dir.clone().or_else(crate::paths::models_dir);
    machine::web_engine(&mut r);
    machine::gpu(&mut r);
    machine::helper(&mut r, a.port);
    machine::models(&mut r, models_dir.as_deref());
    machine::disk(&mut r, models_dir.as_deref());

    let dir = match a.path.or(a.model) {
        Some(arg) => {
            r.check("model id", crate::paths::resolve_model(&arg, models_dir.as_deref()), |p| p.display().to_string())
        }
        None => None,
    };
    if let (Some(dir), true) = (&dir, a.fix) {
        r.check("fix", seal(dir), |s| s.clone());
    }
    if let Some(dir) = &dir {
        let summary = r.check("model", summarize(dir), |s| s.format.clone());
        if let Some(s) = &summary {
            r.ok(
                "sizes",
                format!(
                    "{} resident, {} streamed, {} per token at most",
                    human(s.resident),
                    human(s.streamed),
                    human(s.per_token())
                ),
            );
            if let Some((_, avail)) = meminfo() {
                if s.resident > avail {
                    r.warn("memory", format!("the resident set ({}) exceeds available memory", human(s.resident)));
                }
            }
        }
        if dir.join("tokenizer.json").is_file() {
            r.check("tokenizer", Tokenizer::from_dir(dir).map_err(Into::into), |_| "tokenizer.json loads".into());
        } else {
            r.warn("tokenizer", "no tokenizer.json: only --ids prompts will work");
        }
        if summary.is_some() {
            r.check("weights", Model::open_dir_with(dir, CacheOptions::with_ram(Some(0))).map_err(Into::into), |m| {
                format!("every tensor has the shape its config needs ({} layers)", m.cfg.n_layers)
            });
        }
        if is_container(dir) {
            use colibri_engine::format::manifest::{Manifest, MAX_MANIFEST_BYTES};
            use colibri_engine::format::MANIFEST_FILE;
            let bytes = colibri_engine::fsio::read_limited(&dir.join(MANIFEST_FILE), MAX_MANIFEST_BYTES);
            match bytes {
                Ok(b) if !Manifest::has_self_checksum(&b) => {
                    let e = Manifest::parse(&b).err().map(|e| e.to_string()).unwrap_or_default();
                    r.check::<()>("manifest", Err(anyhow::anyhow!(e)), |_| String::new());
                }
                Ok(b) => {
                    r.check("manifest", Manifest::parse(&b).map_err(Into::into), |_| {
                        "colibri.json matches its own checksum (manifest_xxh3)".into()
                    });
                }
                Err(e) => {
                    r.check::<()>("manifest", Err(e.into()), |_| String::new());
                }
            }
            if a.checksums {
                r.check("checksums", verify_experts(dir), |n| format!("all {n} experts and every dense tensor match"));
            } else {
                r.ok("checksums", "dense tensors verified (pass --checksums to verify every expert)");
            }
        } else if a.checksums {
            r.warn("checksums", "a Hugging Face checkpoint has no checksums; convert it with coli convert");
        }
    }
    if r.failed > 0 {
        bail!("{} check(s) failed", r.failed);
    }
    Ok(())
}

/// `--fix`: verifies the converted model in `dir` whose manifest lacks its own checksum
/// (the manifest's ranges, the data file's size, every dense tensor's and every expert's
/// checksum) and only then writes the manifest back with `manifest_xxh3` (a temporary
/// file renamed over it). A manifest that has one is only checked.
fn seal(dir: &std::path::Path) -> Result<String> {
    use anyhow::Context;
    use colibri_engine::experts::source::{ByteSource, FileSource};
    use colibri_engine::format::manifest::{fingerprint, Manifest, MAX_MANIFEST_BYTES};
    use colibri_engine::format::{dense_store, MANIFEST_FILE};
    use colibri_engine::model::config::ModelConfig;
    use colibri_engine::model::open::Container;
    if !is_container(dir) {
        bail!("{}: not a converted colibri model (no {MANIFEST_FILE}); nothing to fix", dir.display());
    }
    let path = dir.join(MANIFEST_FILE);
    let bytes = colibri_engine::fsio::read_limited(&path, MAX_MANIFEST_BYTES)?;
    if Manifest::has_self_checksum(&bytes) {
        Manifest::parse(&bytes)?;
        return Ok("colibri.json already carries its own checksum; nothing to fix".into());
    }
    let manifest = Manifest::parse_unsealed(&bytes)?;
    let cfg = ModelConfig::from_value(&manifest.config).context("colibri.json: its config")?;
    let container = Container { manifest, cfg, fingerprint: fingerprint(&bytes) };
    let m = &container.manifest;
    let data_path = dir.join(&m.data_file);
    let data = FileSource::open(&data_path)?;
    let len = data.len()?;
    if len != m.data_size {
        bail!("{}: {len} bytes, but the manifest says {}", data_path.display(), m.data_size);
    }
    let mut dense = vec![0u8; usize::try_from(m.dense.length).context("dense region too large")?];
    data.read_at(m.dense.offset, &mut dense)?;
    dense_store(m, &colibri_engine::tensor::Bytes::from_vec(dense), &data_path.display().to_string())?;
    let experts = ExpertCache::new(m, &container.expert_shape(), Arc::new(data), Some(0))?;
    let total: usize = m.experts.layers.iter().map(|l| l.experts.len()).sum();
    experts.verify_all(&mut |_, _| {})?;
    let tmp = path.with_extension(format!("json.tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        std::fs::write(&tmp, m.to_json())?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("{}: cannot write", path.display()));
    }
    Ok(format!("every dense tensor and all {total} experts match; colibri.json sealed (manifest_xxh3 added)"))
}

fn verify_experts(dir: &std::path::Path) -> Result<usize> {
    let (container, data) = ModelDir::open(dir, false)?.into_container()?;
    let m = &container.manifest;
    let experts = ExpertCache::new(m, &container.expert_shape(), Arc::new(data), Some(0))?;
    let total: usize = m.experts.layers.iter().map(|l| l.experts.len()).sum();
    let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
    experts.verify_all(&mut |done, _| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    Ok(total)
}
