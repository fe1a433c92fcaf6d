//! Flag types shared by several commands: the model flags (`--model`, `--ram`, `--backend`,
//! `--threads`, ...), the sampling flags, and their value parsers. Below the commands and
//! the server; imports nothing of the helper's own.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use colibri_engine::generate::{SamplingDefaults, SamplingRequest};
use colibri_engine::sampler::SamplerConfig;

/// `--backend`: where the forward pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    Cpu,
    Wgpu,
}

/// `--hybrid`: on `--backend wgpu`, where routed experts missing from the GPU pool are
/// computed (docs/benchmarks.md, "Hybrid expert placement").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum HybridChoice {
    /// Every expert on the GPU (missing ones are uploaded).
    #[default]
    Off,
    /// Missing experts whose bytes are in RAM run on the CPU threads once the GPU pool is
    /// full, while the GPU computes the others.
    On,
    /// As on, with how many go to the CPU chosen by the costs measured as it runs.
    Auto,
}

/// The most expert reader threads a flag or tune.json may ask for.
pub const MAX_READERS: usize = 64;
/// Expert reader threads where neither a flag nor tune.json chooses.
pub const DEFAULT_READERS: usize = 4;

/// `--direct`: whether expert reads bypass the page cache (O_DIRECT).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum DirectChoice {
    /// On under a memory cgroup that leaves less free memory than the model's data file.
    #[default]
    Auto,
    On,
    Off,
}

/// Where the forward pass runs: the backend, and on the GPU the expert placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compute {
    pub backend: BackendChoice,
    pub hybrid: HybridChoice,
    /// GPU memory for routed experts (None: the backend's default).
    pub gpu_pool: Option<u64>,
}

impl Compute {
    pub const CPU: Compute = Compute { backend: BackendChoice::Cpu, hybrid: HybridChoice::Off, gpu_pool: None };
}

/// Options shared by every command that runs a model.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model directory: a Hugging Face checkpoint (config.json, *.safetensors,
    /// tokenizer.json) or a converted colibri model (colibri.json).
    #[arg(long)]
    pub model: std::path::PathBuf,
    /// Expert-cache budget in bytes (suffixes K, M, G, T; 0 caches nothing; "all": no
    /// limit; default: automatic, half of the memory this process may still take (the
    /// tightest of MemAvailable, the memory cgroup's limit less its usage, and
    /// --mem-limit) minus the dense weights and read buffers, at least 256M or a quarter
    /// of that memory).
    #[arg(long, value_parser = parse_bytes)]
    pub ram: Option<u64>,
    /// A memory limit for the automatic budgets, besides MemAvailable and the cgroup's
    /// (K, M, G suffixes; also the COLI_MEM_LIMIT environment variable).
    #[arg(long, value_parser = parse_bytes)]
    pub mem_limit: Option<u64>,
    /// Bytes of the --ram budget for experts pinned by learned usage (usage.json next to
    /// the model); default with usage counts: a quarter of --ram, less if the rest could
    /// not hold one token's experts; without: 0.
    #[arg(long, value_parser = parse_bytes)]
    pub pin: Option<u64>,
    /// Reader threads that load missing experts while resident ones compute (0: read
    /// synchronously; default: what `coli tune` measured best for the model, else 4).
    #[arg(long, value_parser = clap::value_parser!(u16).range(0..=MAX_READERS as i64))]
    pub readers: Option<u16>,
    /// Prefetch the next layer's likely experts (router lookahead: layer L+1's router on
    /// layer L's input). Off by default: measured where experts stream from disk, the
    /// wrong guesses' reads cost more than the right ones save (docs/benchmarks.md);
    /// `coli tune` measures both and turns it on for a model where it decodes faster.
    #[arg(long, conflicts_with = "no_lookahead")]
    pub lookahead: bool,
    /// No router lookahead, whatever tune.json chose.
    #[arg(long)]
    pub no_lookahead: bool,
    /// Read experts with O_DIRECT, bypassing the page cache, where the file system allows:
    /// on (`--direct` alone), off, or auto: on when a memory cgroup leaves less free memory
    /// than the model's data file (the page cache its reads fill would count against it).
    #[arg(long, value_enum, default_value_t = DirectChoice::Auto, num_args = 0..=1, default_missing_value = "on")]
    pub direct: DirectChoice,
    /// Compute backend.
    #[arg(long, value_enum, default_value_t = BackendChoice::Cpu)]
    pub backend: BackendChoice,
    /// With --backend wgpu: compute routed experts missing from the GPU pool on the CPU
    /// threads at the same time as the GPU (off, on, auto). The outputs are the same bits.
    #[arg(long, value_enum, default_value_t = HybridChoice::Off)]
    pub hybrid: HybridChoice,
    /// With --backend wgpu: bytes of GPU memory for routed experts (suffixes K, M, G;
    /// default: four times the adapter's largest buffer, at most 2G).
    #[arg(long, value_parser = parse_bytes)]
    pub gpu_pool: Option<u64>,
    /// CPU threads (default: the physical cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

impl ModelArgs {
    /// The backend and expert placement these flags ask for.
    pub fn compute(&self) -> Compute {
        Compute { backend: self.backend, hybrid: self.hybrid, gpu_pool: self.gpu_pool }
    }
}

/// Sampling flags shared by `generate` and `chat`; a value out of range is refused as the
/// flags are read, with the engine's rule (`SamplerConfig::validate`).
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// 0 is greedy.
    #[arg(long, value_parser = parse_temperature)]
    pub temperature: Option<f32>,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches p.
    #[arg(long, value_parser = parse_top_p)]
    pub top_p: Option<f32>,
    /// Penalise tokens already in the context (1 = off).
    #[arg(long, value_parser = parse_repetition_penalty)]
    pub repetition_penalty: Option<f32>,
    /// Subtract this (-2 to 2) from a token's logit per time it was produced (OpenAI's).
    #[arg(long, value_parser = parse_frequency_penalty)]
    pub frequency_penalty: Option<f32>,
    /// Subtract this (-2 to 2) once from the logit of every token produced (OpenAI's).
    #[arg(long, value_parser = parse_presence_penalty)]
    pub presence_penalty: Option<f32>,
    /// Add to token logits: ID=BIAS,... (-100 to 100; 100 forces a token, -100 bans it).
    #[arg(long, value_name = "ID=BIAS,...", value_parser = parse_logit_bias)]
    pub logit_bias: Option<BTreeMap<u32, f32>>,
    /// Random seed; the same seed gives the same tokens.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampler: these flags, else the model's generation_config.json, else `fallback`
    /// (the command's own defaults; its seed when --seed is absent).
    pub fn config(&self, model: &SamplingDefaults, fallback: SamplerConfig) -> SamplerConfig {
        let req = SamplingRequest {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: self.logit_bias.clone().unwrap_or_default(),
        };
        model.resolve(&req, &fallback)
    }
}

/// A sampling number, checked by the engine's own rule for the field `set` fills.
fn sampler_number(s: &str, set: fn(&mut SamplerConfig, f32)) -> std::result::Result<f32, String> {
    let v: f32 = s.trim().parse().map_err(|_| "not a number".to_string())?;
    let mut c = SamplerConfig::default();
    set(&mut c, v);
    c.validate().map_err(|e| e.to_string().trim_start_matches("sampler: ").to_string())?;
    Ok(v)
}

fn parse_temperature(s: &str) -> std::result::Result<f32, String> {
    sampler_number(s, |c, v| c.temperature = v)
}

fn parse_top_p(s: &str) -> std::result::Result<f32, String> {
    sampler_number(s, |c, v| c.top_p = v)
}

fn parse_repetition_penalty(s: &str) -> std::result::Result<f32, String> {
    sampler_number(s, |c, v| c.repetition_penalty = v)
}

fn parse_frequency_penalty(s: &str) -> std::result::Result<f32, String> {
    sampler_number(s, |c, v| c.frequency_penalty = v)
}

fn parse_presence_penalty(s: &str) -> std::result::Result<f32, String> {
    sampler_number(s, |c, v| c.presence_penalty = v)
}

/// Parses "50=100,7=-100" into a logit bias.
pub fn parse_logit_bias(s: &str) -> std::result::Result<BTreeMap<u32, f32>, String> {
    let mut c = SamplerConfig::default();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, bias) = part.split_once('=').ok_or_else(|| format!("{part:?} is not ID=BIAS"))?;
        let id: u32 = id.trim().parse().map_err(|_| format!("{:?} is not a token id", id.trim()))?;
        let bias: f32 = bias.trim().parse().map_err(|_| format!("{:?} is not a number", bias.trim()))?;
        c.logit_bias.insert(id, bias);
    }
    c.validate().map_err(|e| e.to_string().trim_start_matches("sampler: ").to_string())?;
    Ok(c.logit_bias)
}

/// Runs a one-shot computing command on a thread of the CPU pool (after [`init_threads`])
/// when the pool has more than one: every parallel region of the kernels then starts on a
/// worker, which takes part in it (the engine's `par` team: the other workers poll for the
/// next region), instead of being injected from a thread that sleeps until the workers are
/// done (wake-ups per region; a decode step has a few regions per layer). Measured under
/// load (docs/benchmarks.md): +10% decode and +9% prefill at 2 threads. The
/// server and `coli chat` call it per forward pass instead: between passes their threads wait
/// for a client or a terminal, which must not hold a worker.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_num_threads() > 1 {
        rayon::scope(|_| f())
    } else {
        f()
    }
}

/// Sizes the global CPU thread pool (`--threads`; None: the physical cores). Call once, before any
/// parallel work.
pub fn init_threads(threads: Option<usize>) -> Result<()> {
    let n = threads.unwrap_or_else(physical_cores).max(1);
    if rayon::ThreadPoolBuilder::new().num_threads(n).build_global().is_err()
        && threads.is_some()
        && rayon::current_num_threads() != n
    {
        // A pool exists already (tests running several commands in one process).
        anyhow::bail!(
            "could not start the thread pool with {n} threads: one with {} runs",
            rayon::current_num_threads()
        );
    }
    Ok(())
}

/// Physical CPU cores (Linux: distinct (package, core) pairs in sysfs; elsewhere, or
/// when that is unreadable, the logical CPUs the process may use): a second hardware
/// thread on a core adds little to these kernels.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut cores = std::collections::BTreeSet::new();
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu") else { return logical };
    for e in dir.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.strip_prefix("cpu").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let read = |f: &str| std::fs::read_to_string(e.path().join("topology").join(f)).ok();
        if let (Some(pkg), Some(core)) = (read("physical_package_id"), read("core_id")) {
            cores.insert((pkg.trim().to_string(), core.trim().to_string()));
        }
    }
    if cores.is_empty() {
        logical
    } else {
        cores.len().min(logical)
    }
}

/// Parses a byte count: "1048576", "512M", "2G", "1.5GiB" (binary units), or "all".
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(u64::MAX);
    }
    colibri_engine::memlimit::parse_size(s)
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
