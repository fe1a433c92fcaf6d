//! `coli tune --model M`: measures how this machine reads the model's experts (cold reads
//! of its data file with 1, 2, 4, ... reader threads, through the page cache and with
//! O_DIRECT) and how fast the CPU kernels get through weights, chooses the fastest setting, times a short teacher-forced decode with the
//! defaults and with that setting (without and with the router lookahead, which it turns
//! on only where it is more than 5% faster), and writes the choice to the model's tune.json, which
//! later runs of the model use where their flags leave the choice open
//! (load::CacheFlags::tuned). `coli plan` reads the measured bandwidth from it.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use colibri_engine::format::is_container;
use colibri_engine::model::open::ModelDir;
use colibri_engine::Logits;

use crate::flags::{init_threads, on_pool, parse_bytes, DirectChoice, ModelArgs, DEFAULT_READERS, MAX_READERS};
use crate::load::{choose_direct, open_dir, CacheFlags};
use crate::tune::{ReadProbe, Tune};

#[derive(Args)]
pub struct TuneArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Bytes of experts read cold per measurement.
    #[arg(long, default_value = "128M", value_parser = parse_bytes)]
    pub bytes: u64,
    /// The reader thread counts to try.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub try_readers: Vec<usize>,
    /// Decode tokens of the before/after run (0: no run).
    #[arg(long, default_value_t = 24)]
    pub tokens: usize,
    /// Text of the teacher-forced run (default: a built-in paragraph).
    #[arg(long, value_name = "FILE")]
    pub text: Option<PathBuf>,
    /// Measure and print, but do not write tune.json.
    #[arg(long)]
    pub dry_run: bool,
}

/// The teacher-forced run's text where none is given.
const TEXT: &str = "A mixture-of-experts model routes every token to a few of its experts, so each \
token reads only a small part of the weights. When the experts do not fit in memory, they are \
read from disk as the router asks for them, and the speed of a decode step is set by how fast \
the disk returns those reads and how many of them the memory budget can keep. Reading with \
several threads at once keeps more requests in flight, which a solid-state disk answers in \
parallel; bypassing the page cache saves a copy and keeps the cache from growing past the \
budget, but some file systems and disks are faster through it. The best choice depends on the \
machine, which is why it is measured rather than guessed.";

/// Chooses among the probes: the fastest, preferring fewer readers and the page cache
/// when within 5% of it.
pub fn choose(probes: &[ReadProbe]) -> Option<&ReadProbe> {
    let best = probes.iter().map(|p| p.bytes_per_second).fold(0.0f64, f64::max);
    probes.iter().filter(|p| p.bytes_per_second >= 0.95 * best && best > 0.0).min_by_key(|p| (p.direct, p.readers))
}

pub fn run(a: TuneArgs) -> Result<()> {
    init_threads(a.model.threads)?;
    on_pool(|| run_inner(a))
}

fn run_inner(a: TuneArgs) -> Result<()> {
    let dir = crate::paths::resolve_model(&a.model.model, None)?;
    if !is_container(&dir) {
        bail!("{}: coli tune measures a converted model (run `coli convert` first)", dir.display());
    }
    if let Some(&r) = a.try_readers.iter().find(|&&r| r == 0 || r > MAX_READERS) {
        bail!("--try-readers {r}: between 1 and {MAX_READERS}");
    }
    let flags = CacheFlags::from_args(&a.model);
    let limit = colibri_engine::memlimit::detect(flags.mem_limit);
    let mut probes = Vec::new();
    for direct in [false, true] {
        let opened = ModelDir::open(&dir, direct).and_then(|m| m.into_container());
        let (c, source) = match opened {
            Ok(x) => x,
            Err(e) if direct => {
                println!("O_DIRECT: not available here ({e})");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for &readers in &a.try_readers {
            let (bps, _) = crate::probe::expert_reads(&c.manifest, &source, a.bytes, readers)?;
            println!(
                "cold expert reads, {:<11} {readers:>2} readers: {:>8.1} MB/s",
                if direct { "O_DIRECT," } else { "page cache," },
                bps / 1e6
            );
            probes.push(ReadProbe { direct, readers, bytes_per_second: bps });
        }
    }
    let Some(best) = choose(&probes).cloned() else { bail!("no expert read could be measured") };
    println!(
        "chosen: {} readers{}, {:.1} MB/s",
        best.readers,
        if best.direct { ", O_DIRECT" } else { "" },
        best.bytes_per_second / 1e6
    );
    let kernel = crate::probe::matvec_bandwidth(std::time::Duration::from_millis(300))?;
    println!("CPU kernels, one position: {:.1} GB/s of weights", kernel / 1e9);
    let data_size = ModelDir::open(&dir, false)?.into_container()?.0.manifest.data_size;
    // Both runs with explicit settings, so that an earlier tune.json does not choose.
    let auto_direct = choose_direct(DirectChoice::Auto, &limit, data_size).0;
    let explicit = |readers: usize, direct: bool, lookahead: bool| CacheFlags {
        readers,
        readers_given: true,
        direct: if direct || auto_direct { DirectChoice::On } else { DirectChoice::Off },
        lookahead,
        lookahead_given: true,
        ..flags.clone()
    };
    // The router lookahead stays off unless it decodes more than 5% faster (it costs
    // reads of wrong guesses; docs/benchmarks.md).
    let (before, after, off, on, lookahead) = match a.tokens {
        0 => (None, None, None, None, false),
        n => {
            let text = a.text.as_deref();
            let before = decode_speed(&dir, &explicit(DEFAULT_READERS, false, false), text, n)?;
            let off = decode_speed(&dir, &explicit(best.readers, best.direct, false), text, n)?;
            let on = decode_speed(&dir, &explicit(best.readers, best.direct, true), text, n)?;
            let lookahead = on > 1.05 * off;
            println!(
                "router lookahead: {off:.2} tok/s without, {on:.2} tok/s with: {}",
                if lookahead { "on" } else { "off" }
            );
            let after = if lookahead { on } else { off };
            println!("decode, {n} teacher-forced tokens: {before:.2} tok/s with the defaults, {after:.2} tok/s tuned");
            (Some(before), Some(after), Some(off), Some(on), lookahead)
        }
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let tune = Tune {
        readers: best.readers,
        direct: best.direct,
        lookahead,
        read_bytes_per_second: best.bytes_per_second,
        probes,
        kernel_bytes_per_second: kernel,
        measured_at: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        cpu,
        memory_limit: super::plan::limit_json(&limit),
        decode_before: before,
        decode_after: after,
        decode_lookahead_off: off,
        decode_lookahead_on: on,
    };
    if a.dry_run {
        println!("--dry-run: {} not written", dir.join(crate::tune::TUNE_FILE).display());
    } else {
        tune.save(&dir)?;
        println!("wrote {}", dir.join(crate::tune::TUNE_FILE).display());
    }
    Ok(())
}

/// Decode tokens/s of `n` teacher-forced tokens after a 16-token prompt, the model opened
/// with `flags` and its data file's pages evicted first.
fn decode_speed(dir: &Path, flags: &CacheFlags, text: Option<&Path>, n: usize) -> Result<f64> {
    if let Ok((_, source)) = ModelDir::open(dir, false).and_then(|m| m.into_container()) {
        crate::probe::evict(source.file());
    }
    let loaded = open_dir(dir, flags, false)?;
    let model = &loaded.model;
    let vocab = model.cfg.vocab as u64;
    let ids: Vec<u32> = match (&loaded.tokenizer, text) {
        (Some(tok), Some(path)) => {
            tok.encode(&colibri_engine::fsio::read_text(path, 16 << 20).context("--text")?, true)?
        }
        (Some(tok), None) => tok.encode(TEXT, true)?,
        (None, Some(_)) => bail!("--text needs the model's tokenizer.json"),
        (None, None) => {
            (0..(n + 16) as u64).map(|i| ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) % vocab) as u32).collect()
        }
    };
    let prompt = 16.min(ids.len().saturating_sub(1)).max(1);
    if ids.len() < prompt + 1 {
        bail!("the text has too few tokens");
    }
    let mut session = model.new_session();
    model.forward(&mut session, &ids[..prompt], Logits::Last)?;
    let t = Instant::now();
    let mut fed = 0;
    for &id in ids[prompt..].iter().take(n) {
        if session.len() + 1 > model.cfg.max_positions {
            break;
        }
        model.forward(&mut session, &[id], Logits::Last)?;
        fed += 1;
    }
    Ok(fed as f64 / t.elapsed().as_secs_f64().max(1e-9))
}
