//! Opening a model directory for the native commands: weights, tokenizer, stop ids.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use colibri_engine::experts::cache::CacheOptions;
use colibri_engine::experts::ram_tiers::default_pin;
use colibri_engine::experts::source::FileSource;
use colibri_engine::generate::SamplingDefaults;
use colibri_engine::model::config::parse_token_ids;
use colibri_engine::model::open::{Container, ModelDir};
use colibri_engine::tokenizer::Tokenizer;
use colibri_engine::Model;

use colibri_engine::memlimit::MemoryLimit;

use crate::flags::{init_threads, DirectChoice, ModelArgs, DEFAULT_READERS};
use crate::tune::Tune;

pub struct Loaded {
    pub model: Model,
    pub tokenizer: Option<Tokenizer>,
    /// Ids that end generation: the config's, the generation config's and the tokenizer's eos.
    pub stop_ids: Vec<u32>,
    /// The expert cache as set up (converted models only).
    pub cache: Option<CacheSetup>,
    /// Sampling defaults from generation_config.json (none without one).
    pub sampling: SamplingDefaults,
}

/// Expert-cache flags of the commands that run a model (see [`ModelArgs`]).
#[derive(Clone, Debug)]
pub struct CacheFlags {
    /// None: choose from free memory; u64::MAX: no limit.
    pub ram: Option<u64>,
    pub pin: Option<u64>,
    pub readers: usize,
    pub lookahead: bool,
    /// Whether `--lookahead` or `--no-lookahead` was given (else tune.json may choose).
    pub lookahead_given: bool,
    pub direct: DirectChoice,
    /// `--mem-limit`: a memory limit of the user's, on top of the machine's and the cgroup's.
    pub mem_limit: Option<u64>,
    /// Whether `--readers` was given (else tune.json may choose, [`CacheFlags::tuned`]).
    pub readers_given: bool,
}

impl CacheFlags {
    pub fn from_args(a: &ModelArgs) -> Self {
        CacheFlags {
            ram: a.ram,
            pin: a.pin,
            readers: a.readers.map_or(DEFAULT_READERS, usize::from),
            lookahead: a.lookahead,
            lookahead_given: a.lookahead || a.no_lookahead,
            direct: a.direct,
            mem_limit: a.mem_limit,
            readers_given: a.readers.is_some(),
        }
    }

    /// What `coli serve` uses: `ram` as given, every other flag at its default.
    pub fn with_ram(ram: Option<u64>) -> Self {
        CacheFlags {
            ram,
            pin: None,
            readers: DEFAULT_READERS,
            lookahead: false,
            lookahead_given: false,
            direct: DirectChoice::Auto,
            mem_limit: None,
            readers_given: false,
        }
    }

    /// These flags with what `coli tune` measured for the model in `dir` where they leave
    /// the choice open: its reader count unless `--readers` was given, O_DIRECT where it
    /// read faster and `--direct` is auto, the router lookahead where it decoded faster and
    /// neither `--lookahead` nor `--no-lookahead` was given.
    pub fn tuned(&self, dir: &Path) -> (CacheFlags, Option<Tune>) {
        let mut f = self.clone();
        let tune = Tune::load(dir);
        if let Some(t) = &tune {
            if !f.readers_given {
                f.readers = t.readers;
            }
            if t.direct && f.direct == DirectChoice::Auto {
                f.direct = DirectChoice::On;
            }
            if !f.lookahead_given {
                f.lookahead = t.lookahead;
            }
        }
        (f, tune)
    }
}

/// The expert cache of a converted model as chosen at start-up.
#[derive(Clone, Debug)]
pub struct CacheSetup {
    /// None: no limit.
    pub ram: Option<u64>,
    pub pin: u64,
    /// How the budget was chosen (for the log line and benchmark records).
    pub note: String,
    pub dense_bytes: u64,
    pub expert_bytes: u64,
    /// Where expert-use counts are merged after a run.
    pub usage_file: PathBuf,
    /// The model version the counts belong to (colibri.json's fingerprint).
    pub fingerprint: Option<String>,
    pub model_id: String,
    /// Why O_DIRECT is off although asked for.
    pub direct_note: Option<String>,
    /// Whether expert reads were opened with O_DIRECT, and why.
    pub direct: (bool, String),
    /// The memory limits found when the budget was chosen.
    pub limit: MemoryLimit,
}

/// Smallest budget the automatic choice goes down to (less where a quarter of the free
/// memory is less).
const AUTO_RAM_FLOOR: u64 = 256 << 20;

/// Bytes of expert buffers the readers hold besides the cache: the buffers kept for reuse
/// (top-k + readers) and the read window (top-k, at least two per reader), for experts of
/// `expert` bytes.
pub fn reader_buffers(expert: u64, top_k: usize, readers: usize) -> u64 {
    let n = top_k + readers + top_k.max(2 * readers);
    expert.saturating_mul(n as u64)
}

/// The automatic budget: half of the memory this process may still take (the tightest of
/// MemAvailable, the cgroup's limit less its usage, and `--mem-limit`: `limit`) minus the
/// dense weights (read into memory at load) and the readers' buffers, at least
/// `AUTO_RAM_FLOOR` (or a quarter of the free memory, if less), at most every expert, and
/// never more than what the dense weights, the buffers and an eighth of the free memory
/// (the KV cache, activations, the binary) leave.
pub fn auto_ram(limit: &MemoryLimit, dense: u64, experts: u64, buffers: u64) -> (u64, String) {
    match limit.tightest() {
        Some(t) => {
            let avail = t.available();
            let floor = AUTO_RAM_FLOOR.min(avail / 4);
            let cap = avail.saturating_sub(dense + buffers + avail / 8);
            let b = (avail / 2).saturating_sub(dense + buffers).max(floor).min(cap).min(experts);
            let capped = if b == cap && b < experts {
                format!(", at most {} (the rest of the free memory less an eighth)", human(cap))
            } else {
                String::new()
            };
            (
                b,
                format!(
                    "auto: half of {} free ({}) minus {} of dense weights and {} of read buffers, at least {}{capped}",
                    human(avail),
                    t.describe(),
                    human(dense),
                    human(buffers),
                    human(floor)
                ),
            )
        }
        None => (AUTO_RAM_FLOOR.min(experts), "auto: free memory unknown, the floor".into()),
    }
}

/// The expert-cache budget for `--ram` (None: automatic; u64::MAX: "all"): (None for no
/// limit, or the budget; how it was chosen). `limit`: the memory limits found; `dense`,
/// `experts` and `buffers`: the model's resident and streamed bytes and the readers'
/// buffers.
pub fn choose_ram(
    flag: Option<u64>,
    limit: &MemoryLimit,
    dense: u64,
    experts: u64,
    buffers: u64,
) -> (Option<u64>, String) {
    match flag {
        Some(u64::MAX) => (None, "--ram all: no limit".to_string()),
        Some(b) => (Some(b), "--ram".to_string()),
        None => {
            let (b, note) = auto_ram(limit, dense, experts, buffers);
            (Some(b), note)
        }
    }
}

/// The server's conversation caches (`--kv-cache`) when not given: 1 GiB, at most an
/// eighth of the memory the process may still take.
pub fn auto_kv_bytes(limit: &MemoryLimit) -> u64 {
    limit.available().map_or(1 << 30, |a| (a / 8).min(1 << 30))
}

/// Whether expert reads use O_DIRECT for a data file of `file_bytes` (`--direct`), and why.
pub fn choose_direct(flag: DirectChoice, limit: &MemoryLimit, file_bytes: u64) -> (bool, String) {
    match flag {
        DirectChoice::On => (true, "--direct on".into()),
        DirectChoice::Off => (false, "--direct off".into()),
        DirectChoice::Auto => match limit.cgroup() {
            Some(c) if limit.direct_by_default(file_bytes) => (
                true,
                format!(
                    "auto: the {} data file is larger than the {} its memory cgroup leaves free ({}), which would charge it the page cache",
                    human(file_bytes),
                    human(c.available()),
                    c.describe()
                ),
            ),
            Some(_) => (false, "auto: the data file fits in what the memory cgroup leaves free".into()),
            None => (false, "auto: no memory cgroup limit".into()),
        },
    }
}

/// The pin budget for `--pin` (None: automatic): [`default_pin`] of the budget when the
/// model has learned usage counts, else 0; never more than the budget. `per_token`: the
/// bytes of one token's experts (top-k of every MoE layer).
pub fn choose_pin(flag: Option<u64>, ram: Option<u64>, per_token: u64, has_usage: bool) -> u64 {
    let pin = match flag {
        Some(p) => p,
        None if has_usage => ram.map_or(0, |r| default_pin(r, per_token)),
        None => 0,
    };
    ram.map_or(pin, |r| pin.min(r))
}

pub use colibri_engine::memlimit::human;

pub fn open(args: &ModelArgs, need_tokenizer: bool) -> Result<Loaded> {
    init_threads(args.threads)?;
    let dir = crate::paths::resolve_model(&args.model, None)?;
    open_dir(&dir, &CacheFlags::from_args(args), need_tokenizer)
}

/// Chooses the expert-cache options of the converted model in `dir` (its manifest `c`, its
/// data file `data`) from the flags, the memory limits (`limit`) and the model's usage
/// file; `direct`: whether the data file was opened with O_DIRECT, and why.
fn cache_options(
    dir: &Path,
    flags: &CacheFlags,
    c: &Container,
    data: &FileSource,
    limit: MemoryLimit,
    direct: (bool, String),
) -> Result<(CacheOptions, CacheSetup)> {
    let m = &c.manifest;
    let (dense, experts) = m.byte_totals();
    let n_experts: u64 = m.experts.layers.iter().map(|l| l.experts.len() as u64).sum();
    let per_expert = experts / n_experts.max(1);
    let buffers = reader_buffers(per_expert, c.cfg.router.top_k, flags.readers);
    let (ram, note) = choose_ram(flags.ram, &limit, dense, experts, buffers);
    let model_id = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    let fallback = crate::paths::data_dir().map(|d| d.join("usage"));
    let usage_file = crate::usage_store::usage_path(dir, &model_id, fallback.as_deref());
    let fingerprint = Some(c.fingerprint.clone());
    let usage =
        crate::usage_store::read_usage(&usage_file, c.cfg.n_layers, c.cfg.router.n_experts, fingerprint.as_deref());
    let moe_layers = m.experts.layers.iter().filter(|l| !l.experts.is_empty()).count() as u64;
    let per_token = per_expert * c.cfg.router.top_k as u64 * moe_layers;
    let pin = choose_pin(flags.pin, ram, per_token, usage.total() > 0);
    let opts = CacheOptions {
        ram,
        pin,
        readers: flags.readers,
        lookahead: flags.lookahead,
        direct: direct.0,
        usage: Some(usage),
    };
    let setup = CacheSetup {
        ram,
        pin,
        note,
        dense_bytes: dense,
        expert_bytes: experts,
        usage_file,
        fingerprint,
        model_id,
        direct_note: data.direct_note.clone(),
        direct,
        limit,
    };
    Ok((opts, setup))
}

impl CacheSetup {
    /// One line saying what the expert cache is and why (chat and serve print it; the
    /// JSON of generate and bench carry it; logits stays silent so that an error is the
    /// only line on stderr).
    pub fn describe(&self) -> String {
        let mut line = format!("expert cache {} ({}", self.ram.map_or("unlimited".into(), human), self.note);
        if self.pin > 0 {
            line += &format!(", {} pinned by usage", human(self.pin));
        }
        if self.direct.0 && self.direct.1.starts_with("auto") {
            line += "; O_DIRECT reads: the page cache would count against the memory cgroup";
        }
        if let Some(n) = &self.direct_note {
            line += &format!("; --direct: {n}");
        }
        line + ")"
    }
}

/// Opens the model directory `dir` (weights, tokenizer, stop ids) without touching the
/// thread pool. For a converted model, sets up the expert cache from `flags`.
pub fn open_dir(dir: &Path, flags: &CacheFlags, need_tokenizer: bool) -> Result<Loaded> {
    if !dir.is_dir() {
        bail!("{}: no such model directory", dir.display());
    }
    let (flags, _) = flags.tuned(dir);
    let flags = &flags;
    // colibri.json is parsed and the data file opened here (again with O_DIRECT where
    // the automatic choice wants it).
    let mut md = ModelDir::open(dir, flags.direct == DirectChoice::On)?;
    let (opts, cache) = match md.container() {
        Some((c, _)) => {
            let limit = colibri_engine::memlimit::detect(flags.mem_limit);
            let direct = choose_direct(flags.direct, &limit, c.manifest.data_size);
            if direct.0 && flags.direct == DirectChoice::Auto {
                md = ModelDir::open(dir, true)?;
            }
            let Some((c, data)) = md.container() else { bail!("{}: the model changed while opened", dir.display()) };
            let (opts, setup) = cache_options(dir, flags, c, data, limit, direct)?;
            (opts, Some(setup))
        }
        // A Hugging Face checkpoint too large to read keeps `--ram` bytes of its experts.
        None => (CacheOptions { ram: flags.ram, ..CacheOptions::default() }, None),
    };
    add_mirror(&mut md, dir);
    let model = md.load(opts)?;
    let tokenizer =
        if need_tokenizer || dir.join("tokenizer.json").exists() { Some(Tokenizer::from_dir(dir)?) } else { None };
    let mut stop_ids = model.cfg.eos_token_ids.clone();
    let gen_cfg = std::fs::read(dir.join("generation_config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    stop_ids.extend(gen_cfg.as_ref().map(|g| parse_token_ids(g.get("eos_token_id"))).unwrap_or_default());
    let sampling = gen_cfg.as_ref().map(SamplingDefaults::from_generation_config).unwrap_or_default();
    if let Some(t) = &tokenizer {
        stop_ids.extend(t.eos_token_ids());
    }
    stop_ids.sort_unstable();
    stop_ids.dedup();
    Ok(Loaded { model, tokenizer, stop_ids, cache, sampling })
}

/// Where `COLI_MODEL_MIRROR` keeps a copy of the model in `dir`: `$COLI_MODEL_MIRROR/<name>`
/// (a directory of copies, such as a second disk's models directory), or the variable's
/// directory itself when it is a copy of this model.
pub fn mirror_dir(dir: &Path) -> Option<PathBuf> {
    let root = PathBuf::from(std::env::var_os("COLI_MODEL_MIRROR").filter(|v| !v.is_empty())?);
    let named = dir.file_name().map(|n| root.join(n));
    match named.filter(|d| d.join(colibri_engine::format::MANIFEST_FILE).is_file()) {
        Some(d) => Some(d),
        None => Some(root),
    }
}

/// A converted model's experts read from its copy under `COLI_MODEL_MIRROR` too (the reads
/// split by each copy's measured speed; a copy that fails is left out with a warning). A
/// copy that is missing or not the same model is a warning, and the model is read as it is.
fn add_mirror(md: &mut ModelDir, dir: &Path) {
    let Some(copy) = mirror_dir(dir).filter(|_| md.container().is_some()) else { return };
    if copy.canonicalize().ok() == dir.canonicalize().ok() {
        return;
    }
    let say: Box<dyn Fn(&str) + Send + Sync> = Box::new(|why| eprintln!("coli: warning: COLI_MODEL_MIRROR: {why}"));
    match md.add_mirror(&copy, say) {
        Ok(()) => eprintln!("coli: experts are read from {} and its copy {}", dir.display(), copy.display()),
        Err(e) => eprintln!("coli: warning: COLI_MODEL_MIRROR: {e}; reading {} only", dir.display()),
    }
}

/// Merges the expert uses counted since the last call into the model's usage file, so
/// that the next start pins what this run used most. A failure is only a warning.
pub fn save_usage(loaded: &Loaded) {
    let Some(c) = &loaded.cache else { return };
    let triples = loaded.model.experts.take_usage();
    if triples.is_empty() {
        return;
    }
    let shape = (loaded.model.cfg.n_layers, loaded.model.cfg.router.n_experts);
    match crate::usage_store::merge_into_file(&c.usage_file, &c.model_id, shape, c.fingerprint.as_deref(), &triples) {
        Ok(m) if m.deferred => {
            // Once per process: `coli serve` merges after every generation.
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                eprintln!(
                    "coli: warning: another process holds {}.lock; expert usage is kept in memory and written once it is free",
                    c.usage_file.display()
                );
            }
        }
        Ok(_) => {}
        Err(e) => eprintln!("coli: warning: could not record expert usage: {e:#}"),
    }
}

/// What `--draft` names: the model's own multi-token-prediction layer (`mtp`), or a
/// smaller model of the same tokenizer.
pub enum Draft {
    Mtp,
    Model(Box<Loaded>),
}

/// `--draft mtp`: the model's MTP layer rather than a draft model (a directory named `mtp`
/// is `./mtp`).
pub fn is_mtp(spec: &Path) -> bool {
    spec.as_os_str() == "mtp"
}

/// Refuses `--draft mtp` for a model without an MTP layer, in one line.
pub fn check_mtp(target: &Loaded) -> Result<()> {
    if !target.model.has_mtp() {
        bail!(
            "--draft mtp: this model has no MTP layer (its config.json has no num_nextn_predict_layers, or it was converted before colibri kept MTP layers: convert it again)"
        );
    }
    Ok(())
}

/// The draft of `--draft` (`mtp`, a directory or an installed id) for speculative decoding
/// of `target`: a draft model is refused in one line unless both have a tokenizer and it
/// is the same.
pub fn open_draft(spec: &Path, target: &Loaded, flags: &CacheFlags) -> Result<Draft> {
    if is_mtp(spec) {
        check_mtp(target)?;
        return Ok(Draft::Mtp);
    }
    open_draft_model(spec, target, flags).map(|d| Draft::Model(Box::new(d)))
}

/// The draft model of `--draft` (a directory or an installed id) for speculative decoding
/// of `target`: refused in one line unless both have a tokenizer and it is the same.
fn open_draft_model(spec: &Path, target: &Loaded, flags: &CacheFlags) -> Result<Loaded> {
    let dir = crate::paths::resolve_model(spec, None).with_context(|| "--draft")?;
    let draft = open_dir(&dir, flags, true).with_context(|| format!("--draft {}", dir.display()))?;
    let (Some(t), Some(d)) = (&target.tokenizer, &draft.tokenizer) else {
        bail!("--draft needs the model's tokenizer.json");
    };
    colibri_engine::generate::check_same_tokenizer(t, d).with_context(|| format!("--draft {}", dir.display()))?;
    Ok(draft)
}

#[cfg(test)]
mod tests {
    use super::*;
    use colibri_engine::memlimit::{Found, Kind};

    const MIB: u64 = 1 << 20;

    fn limit(kind: Kind, avail: u64) -> MemoryLimit {
        MemoryLimit { found: vec![Found { kind, limit: avail, used: 0, path: None }] }
    }

    #[test]
    fn auto_ram_follows_the_tightest_limit() {
        // A big machine: half of it minus the dense weights, at most every expert.
        let host = limit(Kind::MemAvailable, 16 << 30);
        assert_eq!(auto_ram(&host, 500 * MIB, 40 << 30, 50 * MIB).0, (8 << 30) - 550 * MIB);
        assert_eq!(auto_ram(&host, 500 * MIB, 3 << 30, 50 * MIB).0, 3 << 30);
        // A 1 GiB cgroup: half of it less the dense weights and buffers.
        let cg = limit(Kind::CgroupV1, 1024 * MIB);
        let (b, note) = auto_ram(&cg, 50 * MIB, 4 << 30, 44 * MIB);
        assert_eq!(b, 512 * MIB - 94 * MIB);
        assert!(note.contains("cgroup v1"), "{note}");
        // Dense weights larger than half: the floor, but never past what the limit leaves.
        let (b, note) = auto_ram(&cg, 700 * MIB, 4 << 30, 50 * MIB);
        assert_eq!(b, 1024 * MIB - 750 * MIB - 128 * MIB);
        assert!(note.contains("at most"), "{note}");
        let (b, _) = auto_ram(&cg, 1000 * MIB, 4 << 30, 50 * MIB);
        assert_eq!(b, 0, "nothing left: no cache rather than an OOM kill");
        // Unknown memory: the floor.
        assert_eq!(auto_ram(&MemoryLimit::default(), 0, 4 << 30, 0).0, AUTO_RAM_FLOOR);
    }

    #[test]
    fn direct_is_automatic_only_under_a_cgroup_smaller_than_the_model() {
        let cg = limit(Kind::CgroupV2Max, 1 << 30);
        assert!(choose_direct(DirectChoice::Auto, &cg, 2 << 30).0);
        assert!(!choose_direct(DirectChoice::Auto, &cg, 512 * MIB).0);
        assert!(!choose_direct(DirectChoice::Auto, &limit(Kind::MemAvailable, 1 << 30), 2 << 30).0);
        assert!(!choose_direct(DirectChoice::Off, &cg, 2 << 30).0);
        assert!(choose_direct(DirectChoice::On, &limit(Kind::MemAvailable, 1 << 40), 1).0);
        assert_eq!(auto_kv_bytes(&cg), 128 * MIB);
        assert_eq!(auto_kv_bytes(&limit(Kind::MemAvailable, 64 << 30)), 1 << 30);
    }
}
