//! `coli bench`: one native decoding run, printed as one JSON record: commit, hardware
//! (cores, memory, load, the model's file system), command line, page-cache state,
//! prefill and decode tokens/s, time to first token, expert hit rate per tier (pinned /
//! RAM / disk), bytes read per token, router-lookahead recall and wasted bytes, peak
//! RSS, and the disk read bandwidth measured in the same run with the I/O lower bound it
//! implies (missed bytes / bandwidth) next to the decode time.
//!
//! Cold = the data file's pages are evicted from the page cache (posix_fadvise
//! DONTNEED, no root needed) before the model is opened; warm = the whole file is read
//! through the page cache first. Either way the process starts with an empty expert cache;
//! `--warmup` runs the prompt once, untimed, so that the timed runs find its experts resident.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use colibri_engine::experts::cache::CacheStats;
use colibri_engine::format::is_container;
use colibri_engine::model::open::ModelDir;
use colibri_engine::{math, Logits};
use serde_json::{json, Value};

use crate::flags::{init_threads, on_pool, parse_bytes, parse_ids, ModelArgs};
use crate::load::{open_dir, CacheFlags};
use colibri_engine::generate::{
    feed_chunked_last, forward_recording, Drafter, GenerateOptions, Generator, HiddenLog, ModelDrafter, MtpDrafter,
    SpecStats, PREFILL_CHUNK,
};

use crate::backend::forward_keep_fn;
use crate::flags::{BackendChoice, Compute};
use crate::load::{open_draft, Draft};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CacheState {
    Cold,
    Warm,
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt as comma-separated ids (default: `--prompt-tokens` seeded pseudo-random ids).
    #[arg(long)]
    pub ids: Option<String>,
    #[arg(long, default_value_t = 16)]
    pub prompt_tokens: usize,
    /// Greedy decode steps after the prompt.
    #[arg(long, default_value_t = 32)]
    pub decode_tokens: usize,
    /// Page-cache state of the model's data file at the start.
    #[arg(long, value_enum, default_value_t = CacheState::Cold)]
    pub cache: CacheState,
    /// Bytes of random experts read (cold, in parallel like the readers) to measure the
    /// disk bandwidth; 0 skips it.
    #[arg(long, default_value = "256M", value_parser = parse_bytes)]
    pub probe_bytes: u64,
    /// Runs the prompt once (untimed, in a throwaway session) before the timed prefill,
    /// so that the experts it uses are already in the expert cache: with `--ram all` the
    /// timed prefill reads no expert it uses (decode may still meet new ones).
    #[arg(long)]
    pub warmup: bool,
    /// Speculative decoding from prompt lookup with up to N draft tokens per step
    /// (0: off); the record adds "speculation" (acceptance rate, tokens per forward pass).
    /// The generated ids are the same as without.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub speculate: usize,
    /// Also time a second chat turn of N new tokens after the first turn's prompt and
    /// answer: its first token with the first turn's cache kept (generate::reuse) and
    /// from an empty cache (record field `second_turn`).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub second_turn: usize,
    /// Speculative decoding with drafts from a smaller model of the same tokenizer (a
    /// directory or an installed id), or with `mtp` from the model's own MTP layer,
    /// --speculate N per step (4 for a model, 1 for mtp, if not given); the record adds
    /// "speculation" with the draft's load time. The generated ids are the same.
    #[arg(long, value_name = "DIR|mtp")]
    pub draft: Option<std::path::PathBuf>,
    /// Teacher-forced run on a fixed token stream: this text file through the model's
    /// tokenizer. The prompt is its first --prompt-tokens tokens, and each decode step
    /// feeds the stream's next token instead of the model's choice, so that the routing
    /// follows real text (greedy decoding of a synthetic model falls into a loop that
    /// touches the same few experts). The record adds "teacher_forced".
    #[arg(long, value_name = "FILE", conflicts_with_all = ["ids", "draft", "speculate"])]
    pub text: Option<std::path::PathBuf>,
    /// N sequences decoded together, one forward pass per step for all (continuous
    /// batching's engine step, bench_batch.rs): each its own prompt (its own stretch of
    /// --text, or its own ids); the record adds "batch" (aggregate tok/s, p50/p95 time
    /// per token, bytes read per decode token). CPU backend.
    #[arg(long, value_name = "N", conflicts_with_all = ["ids", "draft", "speculate", "second_turn"])]
    pub batch: Option<usize>,
}

fn read_file(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn status_kb(field: &str) -> Option<u64> {
    let s = read_file("/proc/self/status");
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The mount that holds `path`: (device, mount point, file system type), from /proc/mounts.
fn mount_of(path: &Path) -> Value {
    let p = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mounts = read_file("/proc/mounts");
    let best = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && p.starts_with(f[1])).then(|| (f[0], f[1], f[2]))
        })
        .max_by_key(|m| m.1.len());
    match best {
        Some((dev, at, fs)) => json!({"device": dev, "mount": at, "fs": fs}),
        None => Value::Null,
    }
}

fn commit() -> Value {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "HEAD"]) {
        Some(c) => {
            json!({"id": c, "dirty": git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty())})
        }
        None => Value::Null,
    }
}

fn hardware(model: &Path) -> Value {
    let cpu = read_file("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string());
    json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "cpu": cpu,
        "mem_total_bytes": colibri_engine::fsio::meminfo("MemTotal"),
        "mem_available_bytes": colibri_engine::fsio::meminfo("MemAvailable"),
        "load_average": read_file("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        "model_storage": mount_of(model),
    })
}

/// Reads the whole file once so that its pages are in the page cache.
fn warm(path: &Path) -> Result<()> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 8 << 20];
    while f.read(&mut buf)? > 0 {}
    Ok(())
}

/// Cold reads of pseudo-random experts of the converted model in `dir`, `threads` at a
/// time: (bytes/s, bytes read).
fn probe_bandwidth(dir: &Path, direct: bool, bytes: u64, threads: usize) -> Result<(f64, u64)> {
    let (c, source) = ModelDir::open(dir, direct)?.into_container()?;
    crate::probe::expert_reads(&c.manifest, &source, bytes, threads)
}

/// What the expert cache did between `a` and `b`, over `tokens` positions.
fn delta(a: &CacheStats, b: &CacheStats, tokens: usize) -> Value {
    let (pin, ram, miss) = (b.pinned_hits - a.pinned_hits, b.ram_hits - a.ram_hits, b.misses - a.misses);
    let uses = (pin + ram + miss).max(1) as f64;
    let (la, lb) = (a.lookahead, b.lookahead);
    let sel = (lb.routed - la.routed) as f64;
    let t = tokens.max(1) as f64;
    json!({
        "expert_uses": pin + ram + miss,
        "per_token": {"expert_uses": (pin + ram + miss) as f64 / t, "disk_reads": miss as f64 / t,
            "bytes_read": (b.bytes_read - a.bytes_read) as f64 / t},
        "hit_rate": {"pinned": pin as f64 / uses, "ram_lru": ram as f64 / uses, "disk": miss as f64 / uses},
        "disk_reads_started_by_prefetch": b.prefetched_hits - a.prefetched_hits,
        "bytes_read": b.bytes_read - a.bytes_read,
        "prefetch": {
            "recall": if sel > 0.0 { Some((lb.predicted_hits - la.predicted_hits) as f64 / sel) } else { None },
            "reads": lb.prefetched - la.prefetched,
            // Reads started when a pass began because hash routing named the experts.
            "hash_reads": lb.known - la.known,
            "bytes": b.prefetch_bytes - a.prefetch_bytes,
            "cancelled_bytes": b.prefetch_cancelled_bytes - a.prefetch_cancelled_bytes,
            "wasted_bytes": b.prefetch_wasted_bytes - a.prefetch_wasted_bytes,
        },
    })
}

/// Greedy decoding of `n` tokens after a prefilled `prompt` (its last `logits`), drafts
/// from prompt lookup (or `drafter`) verified in one pass each; with `log`, every pass
/// records its hidden states there (for an MTP drafter).
#[allow(clippy::too_many_arguments)]
fn speculative_decode(
    model: &colibri_engine::Model,
    session: &mut colibri_engine::Session,
    prompt: &[u32],
    logits: &[f32],
    n: usize,
    max_draft: usize,
    mut drafter: Option<&mut dyn Drafter>,
    log: Option<&HiddenLog>,
) -> Result<(Vec<u32>, SpecStats)> {
    let opts = GenerateOptions { max_new_tokens: n, ..GenerateOptions::default() };
    let g = Generator::new(&[], prompt, model.cfg.max_positions, &opts)?;
    let mut g = if drafter.is_some() { g.with_external_drafts(max_draft) } else { g.with_speculation(max_draft) };
    let mut fed = g.accept_rows(logits, None)?;
    // The engine's step (colibri_engine::generate::Generator::step), as every surface runs it.
    let mut forward = |keep: usize, ids: &[u32], which: Logits| match log {
        Some(log) => forward_recording(model, session, log, keep, ids, which),
        None => {
            session.truncate(keep);
            model.forward(session, ids, which)
        }
    };
    while g.step(&mut forward, &mut fed, drafter.as_deref_mut(), None)? {}
    Ok((g.produced().to_vec(), g.spec_stats()))
}

/// A second chat turn: the first turn's `prompt` and `answer`, then `n` new ids. Times its
/// first token with the cache of the first turn kept and from an empty one.
fn second_turn(
    model: &colibri_engine::Model,
    session: &mut colibri_engine::Session,
    prompt: &[u32],
    answer: &[u32],
    n: usize,
) -> Result<serde_json::Value> {
    let vocab = model.cfg.vocab as u64;
    let mut ids: Vec<u32> = prompt.iter().chain(answer).copied().collect();
    ids.extend((0..n as u64).map(|i| ((i.wrapping_mul(0xD1B5_4A32_D192_ED03) >> 19) % vocab) as u32));
    let t = Instant::now();
    let kept = colibri_engine::generate::reuse(session, &ids);
    let reused = model.forward(session, &ids[kept..], Logits::Last)?;
    let reused_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let fresh = model.forward(&mut model.new_session(), &ids, Logits::Last)?;
    let fresh_s = t.elapsed().as_secs_f64();
    let same = reused.iter().zip(&fresh).all(|(a, b)| a.to_bits() == b.to_bits());
    Ok(json!({"prompt_tokens": ids.len(), "cached_tokens": kept, "ttft_ms_reused": reused_s * 1e3,
        "ttft_ms_fresh": fresh_s * 1e3, "speedup": fresh_s / reused_s.max(1e-9), "same_logits_bits": same,
        "kv_cache_bytes": session.bytes()}))
}

pub fn run(a: BenchArgs) -> Result<()> {
    init_threads(a.model.threads)?;
    on_pool(|| run_inner(a))
}

/// The token stream of `--text`: the file through the model's tokenizer.
fn text_stream(path: &Path, loaded: &crate::load::Loaded) -> Result<Vec<u32>> {
    let tok = loaded.tokenizer.as_ref().context("--text needs the model's tokenizer.json")?;
    let text = colibri_engine::fsio::read_text(path, 256 << 20).with_context(|| "--text")?;
    let ids = tok.encode(&text, true)?;
    if ids.len() < 2 {
        anyhow::bail!("--text {}: fewer than 2 tokens", path.display());
    }
    Ok(ids)
}

fn run_inner(a: BenchArgs) -> Result<()> {
    let dir = crate::paths::resolve_model(&a.model.model, None)?;
    let (flags, _) = CacheFlags::from_args(&a.model).tuned(&dir);
    let container = is_container(&dir);
    let limit = colibri_engine::memlimit::detect(flags.mem_limit);
    let opened = if container { Some(ModelDir::open(&dir, false)?.into_container()?) } else { None };
    // O_DIRECT as the model's own reads will use it (--direct, or the automatic choice).
    let direct = match &opened {
        Some((c, _)) => crate::load::choose_direct(flags.direct, &limit, c.manifest.data_size).0,
        None => false,
    };
    let (bandwidth, probed) =
        if container { probe_bandwidth(&dir, direct, a.probe_bytes, flags.readers)? } else { (0.0, 0) };
    let mut evicted = false;
    if let Some((c, source)) = &opened {
        match a.cache {
            CacheState::Cold => evicted = crate::probe::evict(source.file()),
            CacheState::Warm => warm(&dir.join(&c.manifest.data_file)).context("warming the page cache")?,
        }
    }
    drop(opened);
    let t_load = Instant::now();
    let loaded = open_dir(&dir, &flags, a.draft.is_some() || a.text.is_some())?;
    let load_s = t_load.elapsed().as_secs_f64();
    let t_draft = Instant::now();
    let draft = a.draft.as_deref().map(|d| open_draft(d, &loaded, &flags)).transpose()?;
    let draft_load_s = t_draft.elapsed().as_secs_f64();
    let model = &loaded.model;
    let vocab = model.cfg.vocab as u64;
    let stream = a.text.as_deref().map(|p| text_stream(p, &loaded)).transpose()?;
    let prompt: Vec<u32> = match (&a.ids, &stream) {
        (Some(s), _) => parse_ids(s)?,
        (None, Some(st)) => st[..a.prompt_tokens.clamp(1, st.len() - 1)].to_vec(),
        (None, None) => (0..a.prompt_tokens.max(1) as u64)
            .map(|i| ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) % vocab) as u32)
            .collect(),
    };
    if a.model.backend == BackendChoice::Wgpu {
        if stream.is_some() {
            anyhow::bail!("--text runs on the CPU backend only");
        }
        let base = json!({"bench": "decode", "commit": commit(), "hardware": hardware(&dir),
            "command": std::env::args().collect::<Vec<_>>(),
            "model": {"path": dir.display().to_string(), "model_type": model.cfg.model_type,
                "layers": model.cfg.n_layers, "experts_per_layer": model.cfg.router.n_experts,
                "top_k": model.cfg.router.top_k},
            "load_seconds": load_s});
        let out = super::bench_gpu::run(model, a.model.compute(), &prompt, a.decode_tokens, a.warmup, base)?;
        println!("{out}");
        return Ok(());
    }
    let stats = || model.experts.cache_stats().unwrap_or_default();
    if let Some(n) = a.batch {
        return batch(&a, n, &dir, model, stream.as_deref(), &prompt, &|| stats().bytes_read);
    }
    let zero = if a.warmup {
        let mut warm = model.new_session();
        feed_chunked_last(
            &mut |part| model.forward(&mut warm, part, Logits::Last),
            &prompt,
            PREFILL_CHUNK,
            &mut || true,
        )?;
        stats()
    } else {
        CacheStats::default()
    };
    let mut session = model.new_session();
    // --draft mtp: the MTP layer reads the hidden states of every pass, the prompt's too.
    let mut mtp = match &draft {
        Some(Draft::Mtp) => Some(MtpDrafter::new(model)?),
        _ => None,
    };
    let log = mtp.as_ref().map(|m| m.log());
    let t0 = Instant::now();
    // In chunks of PREFILL_CHUNK positions, as `coli chat`, `generate` and `serve` feed a
    // prompt (the same bits as one pass; a long prompt in one pass is not what users run).
    let mut logits = match &log {
        Some(log) => forward_recording(model, &mut session, log, 0, &prompt, Logits::Last)?,
        None => feed_chunked_last(
            &mut |part| model.forward(&mut session, part, Logits::Last),
            &prompt,
            PREFILL_CHUNK,
            &mut || true,
        )?,
    };
    let prefill_s = t0.elapsed().as_secs_f64();
    let after_prefill = stats();
    let t1 = Instant::now();
    let mut spec = None;
    let mut ids = vec![math::argmax(&logits) as u32];
    if let Some(m) = mtp.as_mut() {
        let max_draft = super::generate::max_draft(a.speculate, true);
        let n = a.decode_tokens.max(1);
        let (got, s) = speculative_decode(model, &mut session, &prompt, &logits, n, max_draft, Some(m), log.as_ref())?;
        let mut j = s.to_json();
        j["draft"] = json!({"path": "mtp", "max_draft": max_draft});
        (ids, spec) = (got, Some(j));
    } else if let Some(Draft::Model(d)) = &draft {
        let max_draft = super::generate::max_draft(a.speculate, false);
        let fwd = forward_keep_fn(&d.model, Compute::CPU)?;
        let mut drafter = ModelDrafter::new(fwd, d.model.cfg.max_positions, model.cfg.vocab);
        let n = a.decode_tokens.max(1);
        let (got, s) =
            speculative_decode(model, &mut session, &prompt, &logits, n, max_draft, Some(&mut drafter), None)?;
        let mut j = s.to_json();
        j["draft"] = json!({"path": a.draft.as_ref().map(|p| p.display().to_string()), "load_seconds": draft_load_s,
            "max_draft": max_draft, "model_bytes": d.cache.as_ref().map(|c| c.dense_bytes + c.expert_bytes)});
        (ids, spec) = (got, Some(j));
    } else if a.speculate > 0 {
        let n = a.decode_tokens.max(1);
        let (got, s) = speculative_decode(model, &mut session, &prompt, &logits, n, a.speculate, None, None)?;
        (ids, spec) = (got, Some(s.to_json()));
    }
    // Teacher forcing: the tokens fed (the stream after the prompt) and how often the
    // model's own choice was the stream's next token.
    let mut fed: Vec<u32> = Vec::new();
    let mut agree = 0usize;
    for _ in ids.len()..a.decode_tokens.max(1) {
        if session.len() + 1 > model.cfg.max_positions {
            break;
        }
        let next = match &stream {
            Some(st) => {
                let Some(&t) = st.get(prompt.len() + fed.len()) else { break };
                agree += usize::from(*ids.last().unwrap_or(&0) == t);
                fed.push(t);
                t
            }
            None => *ids.last().unwrap_or(&0),
        };
        logits = model.forward(&mut session, &[next], Logits::Last)?;
        ids.push(math::argmax(&logits) as u32);
    }
    let decode_s = t1.elapsed().as_secs_f64();
    let end = stats();
    let second =
        if a.second_turn > 0 { Some(second_turn(model, &mut session, &prompt, &ids, a.second_turn)?) } else { None };
    let steps = (ids.len() - 1).max(1) as f64;
    let decode_read = end.bytes_read - after_prefill.bytes_read;
    let cache = loaded.cache.as_ref();
    let out = json!({
        "bench": "decode",
        "commit": commit(),
        "hardware": hardware(&dir),
        "command": std::env::args().collect::<Vec<_>>(),
        "model": {"path": dir.display().to_string(), "model_type": model.cfg.model_type, "layers": model.cfg.n_layers,
            "experts_per_layer": model.cfg.router.n_experts, "top_k": model.cfg.router.top_k,
            "dense_bytes": cache.map(|c| c.dense_bytes), "expert_bytes": cache.map(|c| c.expert_bytes),
            "attention": model.cfg.attention_kind(),
            "kv_cache_bytes_per_token": model.cfg.kv_cache_bytes_per_token(),
            "recurrent_state_bytes": model.cfg.recurrent_state_bytes(),
            // What the caches hold at these context lengths (DeepSeek-V4: bounded by its
            // window plus compressed entries), and what this run's session held at its end
            // against what the same formula says for its length (ids included; the
            // recurrent states' snapshots apart).
            "kv_cache_bytes_at_context": {"1024": model.kv_cache_bytes_at(1024),
                "8192": model.kv_cache_bytes_at(8192), "32768": model.kv_cache_bytes_at(32768)},
            "session_bytes_at_end": session.bytes(),
            "session_snapshot_bytes": session.snapshot_bytes(),
            "session_bytes_predicted": model.kv_cache_bytes_at(session.len()) + 4 * session.len()},
        "cache_state": match a.cache { CacheState::Cold => "cold", CacheState::Warm => "warm" },
        "warmup": a.warmup,
        "page_cache_evicted": evicted,
        "expert_cache": {"ram_bytes": cache.and_then(|c| c.ram), "pin_bytes": cache.map(|c| c.pin), "budget_note": cache.map(|c| c.describe()),
            "readers": flags.readers, "lookahead": flags.lookahead, "direct_io": end.direct_io,
            "direct_note": cache.map(|c| c.direct.1.clone()),
            "pinned_experts": end.pinned_experts, "cached_bytes_at_end": end.cached_bytes},
        "load_seconds": load_s,
        "prompt_tokens": prompt.len(),
        "decode_tokens": ids.len() - 1,
        "ttft_ms": prefill_s * 1e3,
        "prefill_tokens_per_second": prompt.len() as f64 / prefill_s.max(1e-9),
        "decode_tokens_per_second": (ids.len() - 1) as f64 / decode_s.max(1e-9),
        "decode_seconds": decode_s,
        "prefill": delta(&zero, &after_prefill, prompt.len()),
        "decode": delta(&after_prefill, &end, ids.len() - 1),
        "teacher_forced": stream.as_ref().map(|st| json!({"text": a.text.as_ref().map(|p| p.display().to_string()),
            "stream_tokens": st.len(), "fed_tokens": fed.len(),
            "model_agrees_with_stream": agree as f64 / fed.len().max(1) as f64})),
        "memory_limit": super::plan::limit_json(cache.map_or(&limit, |c| &c.limit)),
        "bytes_read_per_decode_token": decode_read as f64 / steps,
        "disk": {"probe_bytes": probed, "read_bandwidth_bytes_per_second": bandwidth,
            "io_lower_bound_decode_seconds": if bandwidth > 0.0 { Some(decode_read as f64 / bandwidth) } else { None },
            "note": "bandwidth of cold pread of random experts with as many threads as readers; lower bound = bytes read during decode / that bandwidth (page-cache hits can beat it)"},
        "second_turn": second,
        "peak_rss_bytes": status_kb("VmHWM:").map(|k| k * 1024),
        "rss_bytes": status_kb("VmRSS:").map(|k| k * 1024),
        "speculation": spec,
        "generated_ids": ids,
    });
    println!("{out}");
    Ok(())
}

/// `--batch N`: N prompts (stretches of the text stream one after the other, or
/// pseudo-random ids from N seeds), decoded together (bench_batch.rs).
fn batch(
    a: &BenchArgs,
    n: usize,
    dir: &Path,
    model: &colibri_engine::Model,
    stream: Option<&[u32]>,
    prompt: &[u32],
    bytes_read: &dyn Fn() -> u64,
) -> Result<()> {
    if a.model.backend == BackendChoice::Wgpu {
        anyhow::bail!("--batch runs on the CPU backend only");
    }
    if n == 0 {
        anyhow::bail!("--batch 0: at least one sequence");
    }
    let (p, d, vocab) = (prompt.len(), a.decode_tokens.max(1), model.cfg.vocab as u64);
    let (prompts, forced): (Vec<Vec<u32>>, Option<Vec<Vec<u32>>>) = match stream {
        Some(st) => {
            let span = p + d;
            if st.len() < n * span {
                anyhow::bail!(
                    "--text holds {} tokens; --batch {n} needs {} (prompt + decode each)",
                    st.len(),
                    n * span
                );
            }
            let prompts = (0..n).map(|i| st[i * span..i * span + p].to_vec()).collect();
            (prompts, Some((0..n).map(|i| st[i * span + p..(i + 1) * span].to_vec()).collect()))
        }
        None => {
            let ids = |seed: u64| -> Vec<u32> {
                (0..p as u64)
                    .map(|i| (((i + seed * 7919).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) % vocab) as u32)
                    .collect()
            };
            ((0..n as u64).map(ids).collect(), None)
        }
    };
    let run = super::bench_batch::run(model, &prompts, forced.as_deref(), d, bytes_read)?;
    let out = json!({"bench": "decode_batch", "commit": commit(), "hardware": hardware(dir),
        "command": std::env::args().collect::<Vec<_>>(),
        "model": {"path": dir.display().to_string(), "model_type": model.cfg.model_type,
            "layers": model.cfg.n_layers, "experts_per_layer": model.cfg.router.n_experts,
            "top_k": model.cfg.router.top_k},
        "teacher_forced": stream.is_some(),
        "batch": run,
        "peak_rss_bytes": status_kb("VmHWM:").map(|k| k * 1024)});
    println!("{out}");
    Ok(())
}
