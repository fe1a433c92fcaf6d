//! `coli plan MODEL`: what running MODEL on this machine would look like, before anything
//! is downloaded or loaded. MODEL is an installed id, a directory (converted or a Hugging
//! Face checkpoint) or a hub repository `OWNER/NAME[@REV]` (only its config.json and
//! safetensors index are read). From the model's sizes and this machine (memory, cores,
//! a brief disk read and CPU kernel measurement, the GPU adapter) it prints the resident /
//! streamed split, the `--ram` and `--pin` the native commands would choose (the same code
//! as theirs, crate::load), and an estimated decode speed.
//!
//! A model that is not converted yet is estimated as `coli convert` / `coli pull` would
//! store it by default: routed experts int4 with groups of 32, routers f32, every other
//! matrix int8 with groups of 128 (convert's DEFAULT_INT8_GROUP).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use colibri_engine::format::is_container;
use colibri_engine::format::tensors::TensorStore;
use colibri_engine::model::open::ModelDir;
use colibri_engine::tensor::DType;
use colibri_engine::ModelConfig;
use serde_json::json;

use crate::commands::doctor_machine::adapter;
use crate::commands::info::human;
use crate::flags::DirectChoice;
use crate::flags::{init_threads, parse_bytes, physical_cores};
use crate::hub::Hub;
use crate::load::{choose_direct, choose_pin, choose_ram, reader_buffers};

#[derive(Args)]
pub struct PlanArgs {
    /// An installed id, a model directory, or a hub repository OWNER/NAME[@REV].
    pub model: String,
    /// Plan for this expert-cache budget instead of the automatic one (as --ram does).
    #[arg(long, value_parser = parse_bytes)]
    pub ram: Option<u64>,
    /// Plan under this memory limit besides MemAvailable and the cgroup's (as --mem-limit does).
    #[arg(long, value_parser = parse_bytes)]
    pub mem_limit: Option<u64>,
    /// Plan for this pin budget instead of the automatic one (as --pin does).
    #[arg(long, value_parser = parse_bytes)]
    pub pin: Option<u64>,
    /// CPU threads for the compute measurement (default: the physical cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Bytes read to measure the disk (0 skips the measurement).
    #[arg(long, default_value = "128M", value_parser = parse_bytes)]
    pub probe_bytes: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A model's sizes as the engine would hold them.
struct Sizes {
    /// Where they come from: "converted", "checkpoint", "hub".
    source: &'static str,
    /// Where the model is (a directory or a hub URL).
    location: String,
    cfg: ModelConfig,
    /// Dense weights: always in memory.
    resident: u64,
    /// Of those, the token embeddings: one row per token is read, not the matrix (0 when
    /// the output projection shares them).
    embed: u64,
    /// Routed experts: cached under --ram, else read from disk.
    streamed: u64,
    n_experts: u64,
    /// Whether the sizes are an estimate of a conversion (not converted yet).
    estimated: bool,
    /// A block-scaled FP8 checkpoint: the estimate keeps its FP8 weights.
    fp8: bool,
    /// DeepSeek-V4's release: FP4 routed experts, read in place as MXFP4 rows (the sizes
    /// are the checkpoint's own, as the engine holds them).
    fp4: bool,
    /// Learned usage counts exist (the automatic --pin needs them).
    has_usage: bool,
    /// The converted data file, to measure the disk with real expert reads.
    data: Option<(ModelDir, PathBuf)>,
}

impl Sizes {
    fn expert_bytes(&self) -> u64 {
        self.streamed.checked_div(self.n_experts).unwrap_or(0)
    }

    fn moe_layers(&self) -> u64 {
        self.cfg.moe_layers.iter().filter(|m| **m).count() as u64
    }

    /// The bytes of one token's experts: top-k of every MoE layer.
    fn experts_per_token(&self) -> u64 {
        self.moe_layers() * self.cfg.router.top_k as u64 * self.expert_bytes()
    }
}

/// The sizes `coli convert`'s defaults would give a model of `params` parameters (of a
/// block-scaled FP8 checkpoint, `fp8` its block size: kept FP8).
fn estimated_sizes(
    source: &'static str,
    location: String,
    cfg: ModelConfig,
    params: u64,
    fp8: Option<[usize; 2]>,
) -> Result<Sizes> {
    let (resident, expert, embed) = match fp8 {
        Some([_, b1]) => fp8_sizes(&cfg, params, b1)?,
        None => converted_sizes(&cfg, params)?,
    };
    let n_experts = cfg.moe_layers.iter().filter(|m| **m).count() as u64 * cfg.router.n_experts as u64;
    Ok(Sizes {
        source,
        location,
        resident,
        embed,
        streamed: expert * n_experts,
        n_experts,
        cfg,
        estimated: true,
        fp8: fp8.is_some(),
        fp4: false,
        has_usage: false,
        data: None,
    })
}

/// Bytes `coli convert`'s defaults store for the model of `cfg` with `params` parameters
/// in all: (resident, one expert, the token embeddings).
fn converted_sizes(cfg: &ModelConfig, params: u64) -> Result<(u64, u64, u64)> {
    let (h, i) = (cfg.hidden, cfg.expert_intermediate);
    let int4 = DType::Int4 { group: super::convert::GROUP };
    let int8 = DType::Int8 { group: super::convert::DEFAULT_INT8_GROUP };
    let row = |dt: DType, cols: usize| dt.row_bytes(cols).context("row size");
    let expert = (2 * i * row(int4, h)? + h * row(int4, i)?) as u64;
    let moe = cfg.moe_layers.iter().filter(|m| **m).count() as u64;
    let experts = cfg.router.n_experts as u64;
    let expert_params = moe * experts * 3 * (h * i) as u64;
    let router_params = moe * experts * h as u64;
    let rest = params.saturating_sub(expert_params + router_params);
    // int8: one byte per value plus an f16 scale per group.
    let int8_per_1024 = row(int8, 1024)? as u64;
    let embed = if cfg.tie_word_embeddings { 0 } else { (cfg.vocab * row(int8, h)?) as u64 };
    Ok((rest * int8_per_1024 / 1024 + router_params * 4, expert, embed))
}

/// [`converted_sizes`] of a block-scaled FP8 checkpoint (blocks of `b1` columns), which
/// `coli convert` keeps as it is: FP8 rows (1 byte per weight plus an f32 scale per `b1`)
/// for the linear weights, bf16 token embeddings and lm_head, f32 routers.
fn fp8_sizes(cfg: &ModelConfig, params: u64, b1: usize) -> Result<(u64, u64, u64)> {
    let (h, i) = (cfg.hidden, cfg.expert_intermediate);
    let fp8 = DType::Fp8 { block: b1 as u32 };
    let row = |cols: usize| fp8.row_bytes(cols).context("row size");
    let expert = (2 * i * row(h)? + h * row(i)?) as u64;
    let moe = cfg.moe_layers.iter().filter(|m| **m).count() as u64;
    let experts = cfg.router.n_experts as u64;
    let router_params = moe * experts * h as u64;
    let tables = if cfg.tie_word_embeddings { 1 } else { 2 } * (cfg.vocab * h) as u64;
    let rest = params.saturating_sub(moe * experts * 3 * (h * i) as u64 + router_params + tables);
    let embed = if cfg.tie_word_embeddings { 0 } else { (cfg.vocab * h * 2) as u64 };
    Ok((rest * row(1024)? as u64 / 1024 + router_params * 4 + tables * 2, expert, embed))
}

/// The FP8 block size of a config.json (format::fp8), None for other checkpoints.
fn fp8_block(config: &[u8]) -> Option<[usize; 2]> {
    let v: serde_json::Value = serde_json::from_slice(config).ok()?;
    colibri_engine::format::fp8::block_size(&v).ok().flatten()
}

fn read_config(bytes: &[u8], what: &str) -> Result<ModelConfig> {
    ModelConfig::from_json_bytes(bytes).with_context(|| format!("{what}: config.json"))
}

/// Bytes per parameter of a checkpoint's `torch_dtype` (bf16 where it says nothing).
fn source_width(config: &serde_json::Value) -> u64 {
    if colibri_engine::format::fp8::block_size(config).ok().flatten().is_some() {
        return 1; // e4m3 linear weights (the bf16 tables and the scales are a few percent)
    }
    match config.get("torch_dtype").or_else(|| config.get("dtype")).and_then(|v| v.as_str()) {
        Some("float32") => 4,
        _ => 2,
    }
}

fn local_sizes(dir: &Path) -> Result<Sizes> {
    let location = dir.display().to_string();
    if is_container(dir) {
        let md = ModelDir::open(dir, true)?;
        let (c, _) = md.container().context("not a converted model")?;
        let (resident, streamed) = c.manifest.byte_totals();
        let lm_head = c.manifest.dense.tensors.iter().any(|t| t.name == "lm_head.weight");
        let embed = match c.manifest.dense.tensors.iter().find(|t| t.name == "model.embed_tokens.weight") {
            Some(t) if lm_head => t.length,
            _ => 0,
        };
        let n_experts = c.manifest.experts.layers.iter().map(|l| l.experts.len() as u64).sum();
        let id = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
        let fallback = crate::paths::data_dir().map(|d| d.join("usage"));
        let usage_file = crate::usage_store::usage_path(dir, &id, fallback.as_deref());
        let usage = crate::usage_store::read_usage(
            &usage_file,
            c.cfg.n_layers,
            c.cfg.router.n_experts,
            Some(c.fingerprint.as_str()),
        );
        let cfg = c.cfg.clone();
        let data = dir.join(&c.manifest.data_file);
        return Ok(Sizes {
            source: "converted",
            location,
            cfg,
            resident,
            embed,
            streamed,
            n_experts,
            estimated: false,
            fp8: false,
            fp4: false,
            has_usage: usage.total() > 0,
            data: Some((md, data)),
        });
    }
    let bytes = std::fs::read(dir.join("config.json")).with_context(|| format!("{location}: no config.json"))?;
    let cfg = read_config(&bytes, &location)?;
    // Only shapes are needed: a large checkpoint is not even mapped.
    let store = TensorStore::open_dir_streamed(dir)?;
    let mut params = 0u64;
    for n in store.names() {
        if !cfg.is_mtp_tensor(n) {
            params += store.get(n)?.shape.iter().map(|&d| d as u64).product::<u64>();
        }
    }
    if fp4_experts(&bytes) {
        return in_place_sizes(location, cfg, &store);
    }
    estimated_sizes("checkpoint", location, cfg, params, fp8_block(&bytes))
}

/// Whether a config.json declares FP4 routed experts (DeepSeek-V4's `expert_dtype` "fp4",
/// at the top level or in `quantization_config`).
fn fp4_experts(config: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(config) else { return false };
    let fp4 = |x: Option<&serde_json::Value>| x.and_then(|x| x.as_str()) == Some("fp4");
    fp4(v.get("expert_dtype")) || fp4(v.get("quantization_config").and_then(|q| q.get("expert_dtype")))
}

/// The sizes of a checkpoint read as it is published (DeepSeek-V4's release: FP8 dense
/// weights, FP4 experts as MXFP4 rows; `coli convert` does not take it): each tensor's bytes
/// as the engine holds it (the paired placeholders' row bytes), the MTP layer (`mtp.*`)
/// left out as the engine leaves it.
fn in_place_sizes(location: String, cfg: ModelConfig, store: &TensorStore) -> Result<Sizes> {
    let (mut resident, mut streamed) = (0u64, 0u64);
    for n in store.names() {
        if cfg.is_mtp_tensor(n) || n.starts_with("mtp.") {
            continue;
        }
        let len = store.get(n)?.bytes.len() as u64;
        if colibri_engine::format::tensors::is_routed_expert_weight(n) {
            streamed += len;
        } else {
            resident += len;
        }
    }
    let embed = match cfg.tie_word_embeddings {
        true => 0,
        false => ["embed.weight", "model.embed_tokens.weight"]
            .iter()
            .find_map(|n| store.get(n).ok())
            .map_or(0, |t| t.bytes.len() as u64),
    };
    let n_experts = cfg.moe_layers.iter().filter(|m| **m).count() as u64 * cfg.router.n_experts as u64;
    Ok(Sizes {
        source: "checkpoint",
        location,
        resident,
        embed,
        streamed,
        n_experts,
        cfg,
        estimated: false,
        fp8: true,
        fp4: true,
        has_usage: false,
        data: None,
    })
}

/// A hub repository from its config.json and safetensors index (or the size of its one
/// model.safetensors), nothing else.
fn hub_sizes(spec: &str) -> Result<Sizes> {
    let (repo, rev) = crate::commands::pull::parse_repo(spec)?;
    let hub = Hub::from_env();
    let location = format!("{}/{repo} @ {rev}", hub.endpoint());
    let cfg_bytes = hub.read_small(repo, rev, "config.json", 4 << 20)?;
    let cfg = read_config(&cfg_bytes, &location)?;
    let raw: serde_json::Value = serde_json::from_slice(&cfg_bytes)?;
    let total = match hub.read_small(repo, rev, crate::commands::pull::INDEX, 64 << 20) {
        Ok(b) => {
            let v: serde_json::Value = serde_json::from_slice(&b)
                .with_context(|| format!("{location}: {} is not JSON", crate::commands::pull::INDEX))?;
            v["metadata"]["total_size"]
                .as_u64()
                .with_context(|| format!("{location}: the safetensors index has no metadata.total_size"))?
        }
        Err(_) => hub.stat(repo, rev, "model.safetensors").with_context(|| format!("{location}: no safetensors"))?.size,
    };
    if fp4_experts(&cfg_bytes) {
        return hub_fp4_sizes(location, cfg, total);
    }
    let params = total / source_width(&raw);
    estimated_sizes("hub", location, cfg, params, fp8_block(&cfg_bytes))
}

/// A hub release with FP4 routed experts (DeepSeek-V4's: FP8 dense weights), from its
/// index's total bytes as published: the experts as the MXFP4 rows they are read and
/// converted as (the published FP4 bytes and scale bytes, the same count), the rest its
/// dense bytes as published (the engine's FP8 rows carry an f32 scale per 128 columns where
/// the release has an e8m0 byte per 128 x 128 block: about 3% more of the FP8 weights).
fn hub_fp4_sizes(location: String, cfg: ModelConfig, total: u64) -> Result<Sizes> {
    let (h, i) = (cfg.hidden, cfg.expert_intermediate);
    let row = |cols: usize| DType::Mxfp4.row_bytes(cols).context("row size");
    let expert = (2 * i * row(h)? + h * row(i)?) as u64;
    let n_experts = cfg.moe_layers.iter().filter(|m| **m).count() as u64 * cfg.router.n_experts as u64;
    let streamed = expert * n_experts;
    let resident = total
        .checked_sub(streamed)
        .with_context(|| format!("{location}: the index's total_size is less than its FP4 experts' bytes"))?;
    let embed = if cfg.tie_word_embeddings { 0 } else { (cfg.vocab * h * 2) as u64 };
    Ok(Sizes {
        source: "hub",
        location,
        resident,
        embed,
        streamed,
        n_experts,
        cfg,
        estimated: true,
        fp8: true,
        fp4: true,
        has_usage: false,
        data: None,
    })
}

/// MODEL as a directory or installed id, else as a hub repository.
fn sizes(model: &str) -> Result<Sizes> {
    match crate::paths::resolve_model(Path::new(model), None) {
        Ok(dir) => local_sizes(&dir),
        Err(e) if model.contains('/') && !Path::new(model).is_absolute() && !model.starts_with('.') => {
            hub_sizes(model).map_err(|h| h.context(format!("{e:#}; as a hub repository")))
        }
        Err(e) => Err(e),
    }
}

/// Disk reads: (bytes/s, how measured).
fn disk_speed(s: &Sizes, bytes: u64, threads: usize) -> Result<Option<(f64, String)>> {
    if bytes == 0 {
        return Ok(None);
    }
    if let Some((md, path)) = &s.data {
        if let Some((c, source)) = md.container() {
            let (bw, read) = crate::probe::expert_reads(&c.manifest, source, bytes, threads)?;
            if read > 0 {
                let how = match &source.direct_note {
                    None => "O_DIRECT",
                    Some(_) => "buffered after evicting the page cache",
                };
                return Ok(Some((bw, format!("{} of random experts of {} ({how})", human(read), path.display()))));
            }
        }
    }
    let dir = crate::paths::models_dir().unwrap_or_else(std::env::temp_dir);
    let chunk = s.expert_bytes().max(1 << 20) as usize;
    let (bw, how) = crate::probe::scratch_reads(&dir, bytes, chunk, threads)?;
    Ok(Some((bw, format!("{} of a scratch file in {} ({how})", human(bytes), dir.display()))))
}

pub fn plan(a: PlanArgs) -> Result<()> {
    init_threads(a.threads)?;
    let s = sizes(&a.model)?;
    if s.n_experts == 0 {
        bail!("{}: no routed experts (not a Mixture-of-Experts model)", a.model);
    }
    let threads = rayon::current_num_threads();
    let limit = colibri_engine::memlimit::detect(a.mem_limit);
    let available = limit.available();
    let total_mem = colibri_engine::fsio::meminfo("MemTotal");
    // What `coli tune` measured for the model, where it ran: its readers and disk speed.
    let tune = s.data.as_ref().and_then(|(_, data)| data.parent().and_then(crate::tune::Tune::load));
    // --readers' default: the reads of one layer's misses in parallel.
    let readers = tune.as_ref().map_or(crate::flags::DEFAULT_READERS, |t| t.readers);
    let buffers = reader_buffers(s.expert_bytes(), s.cfg.router.top_k, readers);
    let (ram, ram_note) = choose_ram(a.ram, &limit, s.resident, s.streamed, buffers);
    let per_token = s.experts_per_token();
    let pin = choose_pin(a.pin, ram, per_token, s.has_usage);
    // What the native commands' --direct auto would do with the data file (or the model's
    // estimated size).
    let (direct, direct_why) = choose_direct(DirectChoice::Auto, &limit, s.resident + s.streamed);
    let disk = match &tune {
        Some(t) if t.read_bytes_per_second > 0.0 => Some((
            t.read_bytes_per_second,
            format!(
                "measured by `coli tune`: {} readers{}",
                t.readers,
                if t.direct { ", O_DIRECT" } else { ", through the page cache" }
            ),
        )),
        _ => disk_speed(&s, a.probe_bytes, readers)?,
    };
    let compute = match &tune {
        Some(t) if t.kernel_bytes_per_second > 0.0 => t.kernel_bytes_per_second,
        _ => crate::probe::matvec_bandwidth(Duration::from_millis(300))?,
    };
    let gpu = adapter();

    // What a token costs: every resident matrix but the embeddings and top-k experts per
    // MoE layer pass through the kernels; with a cache smaller than the experts, a share
    // of a token's experts (uniform routing: 1 - cached / all) is read from disk.
    let cached = ram.unwrap_or(u64::MAX).min(s.streamed);
    let miss_share = 1.0 - cached as f64 / s.streamed.max(1) as f64;
    let compute_s = (s.resident - s.embed.min(s.resident) + per_token) as f64 / compute.max(1.0);
    let read_s = disk.as_ref().map(|(bw, _)| per_token as f64 * miss_share / bw.max(1.0));
    let warm_tps = 1.0 / compute_s;
    let steady_tps = read_s.map(|r| 1.0 / (compute_s + r));
    let fits = available.map(|av| s.resident + cached <= av);

    if a.json {
        let v = json!({
            "model": a.model,
            "source": s.source,
            "location": s.location,
            "estimated_sizes": s.estimated,
            "model_type": s.cfg.model_type,
            "layers": s.cfg.n_layers,
            "moe_layers": s.moe_layers(),
            "experts_per_layer": s.cfg.router.n_experts,
            "top_k": s.cfg.router.top_k,
            "resident_bytes": s.resident,
            "streamed_bytes": s.streamed,
            "expert_bytes": s.expert_bytes(),
            "experts_per_token_bytes": per_token,
            "machine": {
                "threads": threads,
                "physical_cores": physical_cores(),
                "mem_total_bytes": total_mem,
                "mem_available_bytes": colibri_engine::fsio::meminfo("MemAvailable"),
                "memory_limit": limit_json(&limit),
                "disk_read_bytes_per_second": disk.as_ref().map(|d| d.0),
                "disk_probe": disk.as_ref().map(|d| d.1.clone()),
                "cpu_int4_matvec_bytes_per_second": compute,
                "gpu_adapter": gpu.as_ref().ok(),
                "gpu_note": gpu.as_ref().err(),
            },
            "ram": ram,
            "ram_note": ram_note,
            "direct_io": direct,
            "direct_note": direct_why,
            "pin": pin,
            "has_usage": s.has_usage,
            "cached_expert_bytes": cached,
            "disk_share_of_expert_reads": miss_share,
            "fits_in_memory": fits,
            "estimate": {
                "warm_tokens_per_second": warm_tps,
                "steady_tokens_per_second": steady_tps,
                "note": "native CPU decode, one position: (resident but the embeddings + one token's experts) / CPU kernel bandwidth, plus the uncached share of that token's experts / disk bandwidth (uniform routing, the worst case; learned pins do better)",
            },
        });
        println!("{v}");
        return Ok(());
    }
    let c = &s.cfg;
    let kind = match s.source {
        "converted" => "converted colibri model".to_string(),
        "checkpoint" if s.fp4 => {
            "Hugging Face checkpoint; sizes as read in place (FP8 dense weights, FP4 experts as MXFP4 rows)".to_string()
        }
        "checkpoint" if s.fp8 => "Hugging Face checkpoint; sizes as `coli convert` stores it (FP8 kept)".to_string(),
        "checkpoint" => "Hugging Face checkpoint; sizes as `coli convert` stores it (int4 experts)".to_string(),
        _ if s.fp4 => "hub repository (config.json + safetensors index only); sizes as `coli pull` stores it (FP8 dense weights, FP4 experts as MXFP4 rows, kept)".to_string(),
        _ => "hub repository (config.json + safetensors index only); sizes as `coli pull` stores it".to_string(),
    };
    println!("model      {} ({kind})", s.location);
    println!(
        "shape      {}: {} layers ({} MoE) x {} experts, top-{}",
        c.model_type,
        c.n_layers,
        s.moe_layers(),
        c.router.n_experts,
        c.router.top_k
    );
    let est = if s.estimated { " (estimate)" } else { "" };
    println!("resident   {}{est}: dense weights, always in memory", human(s.resident));
    println!("streamed   {}{est}: {} experts of {}", human(s.streamed), s.n_experts, human(s.expert_bytes()));
    println!("per token  {} of experts (top-{} x {} MoE layers)", human(per_token), c.router.top_k, s.moe_layers());
    let mem = match total_mem {
        Some(t) => format!("{} total", human(t)),
        None => "unknown".into(),
    };
    println!("machine    {threads} threads ({} physical cores), memory {mem}", physical_cores());
    println!("limit      {}", limit.describe());
    match &disk {
        Some((bw, how)) => println!("disk       {}/s ({how})", human(*bw as u64)),
        None => println!("disk       not measured (--probe-bytes 0)"),
    }
    println!("cpu        {}/s of int4 weights through the matrix-vector kernel", human(compute as u64));
    match &gpu {
        Ok(name) => println!("gpu        {name} (--backend wgpu)"),
        Err(e) => println!("gpu        none ({e})"),
    }
    let ram_text = ram.map_or("all".to_string(), human);
    println!("--ram      {ram_text} ({ram_note})");
    println!("--direct   {} ({direct_why})", if direct { "on" } else { "off" });
    let pin_why = if a.pin.is_some() {
        "--pin"
    } else if s.has_usage {
        "a quarter of --ram: learned usage counts exist"
    } else {
        "no learned usage yet"
    };
    println!("--pin      {} ({pin_why})", human(pin));
    println!(
        "split      {} of experts cached in RAM, {:.0}% of expert reads from disk at worst",
        human(cached),
        miss_share * 100.0
    );
    if fits == Some(false) {
        println!("warning    resident + cache exceed the free memory ({}): pass a smaller --ram", limit.describe());
    }
    match steady_tps {
        Some(t) if miss_share > 0.0 => {
            println!("estimate   {t:.1} tokens/s (disk-bound share included); {warm_tps:.1} tokens/s once a prompt's experts are cached")
        }
        _ => println!("estimate   {warm_tps:.1} tokens/s (every expert fits in the cache)"),
    }
    Ok(())
}

/// The memory limits found, as JSON: the bytes free under the tightest, where it comes
/// from, and every limit found (what `coli plan --json`, `coli doctor --json` and
/// `coli bench` report).
pub fn limit_json(l: &colibri_engine::memlimit::MemoryLimit) -> serde_json::Value {
    let found: Vec<serde_json::Value> = l
        .found
        .iter()
        .map(|f| {
            json!({"kind": f.kind.name(), "limit_bytes": f.limit, "used_bytes": f.used,
                "available_bytes": f.available(), "path": f.path.as_ref().map(|p| p.display().to_string())})
        })
        .collect();
    json!({"available_bytes": l.available(), "source": l.tightest().map(|t| t.kind.name()),
        "describe": l.describe(), "found": found})
}

/// What `coli run` checks before it pulls a model: the sizes `coli plan` computes, against
/// the memory this process may take (no disk or kernel measurement).
pub struct Fit {
    /// Dense weights, always in memory.
    pub resident: u64,
    /// Routed experts, and of those the bytes the automatic --ram would cache.
    pub streamed: u64,
    pub cached: u64,
    /// The memory this process may still take (None: unknown), and where that comes from.
    pub available: Option<u64>,
    pub limit: String,
}

impl Fit {
    /// Whether the dense weights and one token's read buffers fit at all.
    pub fn runs(&self) -> bool {
        self.available.is_none_or(|av| self.resident < av)
    }
}

/// [`Fit`] of `model` (a hub repository, a directory or an installed id).
pub fn fit(model: &str, mem_limit: Option<u64>) -> Result<Fit> {
    let s = sizes(model)?;
    let limit = colibri_engine::memlimit::detect(mem_limit);
    let buffers = reader_buffers(s.expert_bytes(), s.cfg.router.top_k, 4);
    let (ram, _) = choose_ram(None, &limit, s.resident, s.streamed, buffers);
    Ok(Fit {
        resident: s.resident,
        streamed: s.streamed,
        cached: ram.unwrap_or(u64::MAX).min(s.streamed),
        available: limit.available(),
        limit: limit.describe(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::convert::DEFAULT_INT8_GROUP;

    #[test]
    fn converted_sizes_follow_convert_defaults() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3_moe");
        let cfg = read_config(&std::fs::read(dir.join("config.json")).unwrap(), "fixture").unwrap();
        let (h, i) = (cfg.hidden, cfg.expert_intermediate);
        let (_, expert, embed) = converted_sizes(&cfg, 0).unwrap();
        // Three int4 matrices: per row, the f16 scales of 32 values and the packed values.
        let row = |cols: usize| (cols / 32 * 2).next_multiple_of(4) + (cols / 2).next_multiple_of(4);
        assert_eq!(expert as usize, 2 * i * row(h) + h * row(i));
        assert_eq!(
            embed as usize,
            if cfg.tie_word_embeddings {
                0
            } else {
                // int8 in convert's default group for the int8 classes.
                cfg.vocab * ((h.div_ceil(DEFAULT_INT8_GROUP as usize) * 2).next_multiple_of(4) + h.next_multiple_of(4))
            }
        );
        let (resident, _, _) = converted_sizes(&cfg, 1 << 30).unwrap();
        assert!(resident > 1 << 30, "int8 with f16 scales is more than a byte per value");
    }
}
