//! Opening a model directory for the native commands: weights, tokenizer, stop ids.

use std::path::Path;

use anyhow::{bail, Context, Result};
use colibri_engine::config::parse_token_ids;
use colibri_engine::tokenizer::Tokenizer;
use colibri_engine::Model;

use crate::ModelArgs;

pub struct Loaded {
    pub model: Model,
    pub tokenizer: Option<Tokenizer>,
    /// Ids that end generation: the config's, the generation config's and the tokenizer's eos.
    pub stop_ids: Vec<u32>,
}

pub fn setup(args: &ModelArgs) -> Result<()> {
    if let Some(t) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t.max(1))
            .build_global()
            .context("could not start the thread pool")?;
    }
    Ok(())
}

pub fn open(args: &ModelArgs, need_tokenizer: bool) -> Result<Loaded> {
    setup(args)?;
    let dir = crate::paths::resolve_model(&args.model, None)?;
    open_dir(&dir, args.ram, need_tokenizer)
}

/// Opens the model directory `dir` (weights, tokenizer, stop ids) without touching the
/// thread pool; `ram` is the expert-cache budget in bytes of converted models.
pub fn open_dir(dir: &Path, ram: Option<u64>, need_tokenizer: bool) -> Result<Loaded> {
    if !dir.is_dir() {
        bail!("{}: no such model directory", dir.display());
    }
    let model = Model::open_dir_with(dir, ram)?;
    let tokenizer = if need_tokenizer || dir.join("tokenizer.json").exists() {
        Some(Tokenizer::from_dir(dir)?)
    } else {
        None
    };
    let mut stop_ids = model.cfg.eos_token_ids.clone();
    stop_ids.extend(generation_config_eos(dir));
    if let Some(t) = &tokenizer {
        stop_ids.extend(t.eos_token_ids());
    }
    stop_ids.sort_unstable();
    stop_ids.dedup();
    Ok(Loaded { model, tokenizer, stop_ids })
}

fn generation_config_eos(dir: &Path) -> Vec<u32> {
    std::fs::read(dir.join("generation_config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .map(|v| parse_token_ids(v.get("eos_token_id")))
        .unwrap_or_default()
}

/// Parses a byte count: "1048576", "512M", "2G", "1.5GiB" (binary units).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("{s:?}: unknown unit (use K, M, G or T)")),
    };
    let v: f64 = num.parse().map_err(|_| format!("{s:?} is not a byte count"))?;
    let bytes = v * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(bytes as u64)
}

/// Parses "5,17,3" into token ids.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    let ids: Result<Vec<u32>> = s
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().with_context(|| format!("--ids: {t:?} is not a token id")))
        .collect();
    let ids = ids?;
    if ids.is_empty() {
        bail!("--ids: no token ids given");
    }
    Ok(ids)
}
