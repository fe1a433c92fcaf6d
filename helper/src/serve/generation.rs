//! The native engine behind the OpenAI endpoints: models loaded on first use and kept,
//! each with its generations (up to `--parallel` of them) running together in one batch
//! ([`super::batch`]: continuous batching), the others waiting in a bounded queue; each
//! streams text pieces through a channel. A generation stops when its client goes away
//! (the channel closes) or the helper shuts down: at its next token, or during a long
//! prompt at the next chunk of its prefill. Each model keeps its last conversations'
//! caches ([`ContextPool`]): a request that extends one feeds only its new tokens
//! (reported as `cached_tokens`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use colibri_engine::generate::{Constraint, ContextPool, GenerateOptions, TokenLogprob};
use colibri_engine::model::config::ModelConfig;
use colibri_engine::Session;
use tokio::sync::{mpsc, OnceCell, Semaphore};

use super::models::ModelEntry;
use crate::kv_store::KvStore;
use crate::load::Loaded;

/// Speculative decoding of every generation (`coli serve --speculate N [--draft DIR|mtp]`;
/// off by default): up to `max_draft` drafts per step from prompt lookup, from `draft`, a
/// smaller model of the same tokenizer, or with `mtp` from the model's own MTP layer. The
/// output is the same as without.
#[derive(Clone, Default)]
pub struct Speculation {
    pub max_draft: usize,
    pub draft: Option<Arc<Loaded>>,
    pub mtp: bool,
}

impl Speculation {
    /// The speculation of one request: `speculate` is the request's extension field (absent
    /// or null: the server's; `false` or 0: off; `true`: the server's; N: up to N drafts per
    /// step, within the server's `--speculate`). `server` is the model's (None: off). Err:
    /// why the request cannot have it (a 400 naming `speculate`).
    pub fn for_request(
        server: Option<Speculation>,
        speculate: Option<&serde_json::Value>,
    ) -> Result<Option<Self>, String> {
        use serde_json::Value;
        let limit = server.as_ref().map_or(0, |s| s.max_draft);
        let n = match speculate {
            None | Some(Value::Null) | Some(Value::Bool(true)) => return Ok(server),
            Some(Value::Bool(false)) => 0,
            Some(v) => v.as_u64().ok_or("speculate must be a boolean or a whole number of draft tokens")?,
        };
        match (n, server) {
            (0, _) => Ok(None),
            (n, Some(s)) if n <= limit as u64 => Ok(Some(Speculation { max_draft: n as usize, ..s })),
            (n, _) => Err(format!(
                "speculate: {n} draft tokens per step, but this server allows at most {limit} (coli serve --speculate N)"
            )),
        }
    }
}

/// Generations that run at once on one model by default (`coli serve --parallel`).
pub const DEFAULT_PARALLEL: usize = 4;

/// A loaded model and its generation queue.
pub struct Slot {
    pub(super) loaded: OnceCell<Arc<Loaded>>,
    /// The speculation its generations use (decided once: the draft only where the
    /// tokenizers agree).
    speculation: std::sync::OnceLock<Option<Speculation>>,
    /// Generations (and /v1/choose calls) allowed at once on this model: the batch's size.
    pub(super) running: Arc<Semaphore>,
    parallel: usize,
    /// Generations admitted (running or waiting).
    admitted: AtomicUsize,
    /// The last conversations' caches, for requests that extend them.
    pub(super) contexts: Mutex<ContextPool<Session>>,
    /// The same on disk, for after a restart (None without a data directory).
    pub(super) store: OnceCell<Option<KvStore>>,
    /// Generations waiting to join the batch, and whether its driver runs.
    pub(super) incoming: Mutex<Incoming>,
    /// A generation joins the batch while the running ones' caches hold at most this many
    /// bytes (the KV budget; one always runs).
    pub(super) kv_active_bytes: usize,
    /// Bytes the running generations' caches hold now (the driver updates it).
    pub(super) kv_active: AtomicUsize,
}

/// How many conversations' caches each model keeps, and in how many bytes at most.
#[derive(Clone, Copy, Debug)]
pub struct KvBudget {
    pub conversations: usize,
    pub bytes: usize,
}

impl Default for KvBudget {
    /// Eight conversations in 1 GiB (a 4096-token conversation of the demo model takes
    /// 4 MiB; of DeepSeek-V3 at full size, 576 floats x 61 layers, 576 MiB).
    fn default() -> Self {
        KvBudget { conversations: 8, bytes: 1 << 30 }
    }
}

/// Every model loaded so far.
pub struct Engines {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Most generations admitted per model (running or waiting); more get 503.
    pub max_queue: usize,
    /// Generations running together per model (one batch).
    pub parallel: usize,
    /// Expert-cache budget in bytes for converted models (None: no limit).
    ram: Option<u64>,
    /// Conversation caches kept per model.
    pub kv: KvBudget,
    /// Where they are written (`<data dir>/kv`); None: memory only.
    kv_dir: Option<PathBuf>,
    speculation: Speculation,
}

/// One loaded model's numbers for `/metrics`.
pub struct SlotMetrics {
    pub model: String,
    /// Whether the model is loaded (`/api/ps`); a failed load leaves it unloaded.
    pub loaded: bool,
    pub admitted: usize,
    pub running: usize,
    pub parallel: usize,
    pub kv_conversations: usize,
    pub kv_bytes: usize,
    pub kv_active_bytes: usize,
    pub cache: Option<colibri_engine::experts::cache::CacheStats>,
}

/// Why a generation could not start.
#[derive(Debug)]
pub enum EngineError {
    Busy,
    Load(String),
}

impl Engines {
    pub fn new(max_queue: usize, ram: Option<u64>, speculation: Speculation, kv_dir: Option<PathBuf>) -> Self {
        Engines {
            slots: Mutex::new(HashMap::new()),
            max_queue: max_queue.max(1),
            parallel: DEFAULT_PARALLEL,
            ram,
            speculation,
            kv: KvBudget::default(),
            kv_dir,
        }
    }

    /// The speculation of `slot`'s generations (None: off). A draft whose tokenizer is not
    /// the model's is left out for that model (prompt lookup instead), with a warning.
    pub fn speculation(&self, slot: &Slot, loaded: &Loaded) -> Option<Speculation> {
        let s = &self.speculation;
        slot.speculation
            .get_or_init(|| {
                if s.max_draft == 0 {
                    return None;
                }
                let same = |d: &Loaded| match (&loaded.tokenizer, &d.tokenizer) {
                    (Some(t), Some(dt)) => {
                        colibri_engine::generate::check_same_tokenizer(t, dt).map_err(|e| e.to_string())
                    }
                    _ => Err("no tokenizer".into()),
                };
                let lookup = Speculation { max_draft: s.max_draft, draft: None, mtp: false };
                if s.mtp && !loaded.model.has_mtp() {
                    tracing::warn!("--draft mtp: this model has no MTP layer; prompt lookup instead");
                    return Some(lookup);
                }
                match s.draft.as_deref().map(same) {
                    Some(Err(e)) => {
                        tracing::warn!("--draft is not used for this model: {e}; prompt lookup instead");
                        Some(lookup)
                    }
                    _ => Some(s.clone()),
                }
            })
            .clone()
    }

    /// Every model's numbers right now, sorted by id (`/metrics`).
    pub fn snapshot(&self) -> Vec<SlotMetrics> {
        let slots: Vec<(String, Arc<Slot>)> = match self.slots.lock() {
            Ok(s) => s.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            Err(_) => Vec::new(),
        };
        let mut out: Vec<SlotMetrics> = slots
            .into_iter()
            .map(|(model, slot)| {
                let (kv_conversations, kv_bytes) = slot.contexts.lock().map(|p| (p.len(), p.bytes())).unwrap_or((0, 0));
                SlotMetrics {
                    loaded: slot.loaded.get().is_some(),
                    model,
                    admitted: slot.admitted.load(std::sync::atomic::Ordering::Relaxed),
                    running: slot.parallel.saturating_sub(slot.running.available_permits()),
                    parallel: slot.parallel,
                    kv_conversations,
                    kv_bytes,
                    kv_active_bytes: slot.kv_active.load(Ordering::Relaxed),
                    cache: slot.loaded.get().and_then(|l| l.model.experts.cache_stats()),
                }
            })
            .collect();
        out.sort_by(|a, b| a.model.cmp(&b.model));
        out
    }

    fn slot(&self, id: &str) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .entry(id.to_string())
            .or_insert_with(|| {
                Arc::new(Slot {
                    loaded: OnceCell::new(),
                    speculation: std::sync::OnceLock::new(),
                    running: Arc::new(Semaphore::new(self.parallel)),
                    parallel: self.parallel,
                    admitted: AtomicUsize::new(0),
                    contexts: Mutex::new(ContextPool::new(self.kv.conversations, self.kv.bytes)),
                    store: OnceCell::new(),
                    incoming: Mutex::new(Default::default()),
                    kv_active_bytes: self.kv.bytes,
                    kv_active: AtomicUsize::new(0),
                })
            })
            .clone()
    }

    /// Loads the model (once; a failed load is retried by the next request).
    pub async fn load(&self, m: &ModelEntry) -> Result<(Arc<Slot>, Arc<Loaded>), EngineError> {
        let slot = self.slot(&m.id);
        let (root, ram) = (m.root.clone(), self.ram);
        let loaded = slot
            .loaded
            .get_or_try_init(|| async move {
                tracing::info!(model = %root.display(), "loading model");
                match tokio::task::spawn_blocking(move || {
                    crate::load::open_dir(&root, &crate::load::CacheFlags::with_ram(ram), true)
                })
                .await
                {
                    Ok(Ok(l)) => {
                        if let Some(c) = &l.cache {
                            tracing::info!("{}", c.describe());
                        }
                        Ok(Arc::new(l))
                    }
                    Ok(Err(e)) => Err(EngineError::Load(format!("{e:#}"))),
                    Err(e) => Err(EngineError::Load(e.to_string())),
                }
            })
            .await?
            .clone();
        let (root, kv) = (m.root.clone(), self.kv);
        let dir = self.kv_dir.clone().filter(|_| kv.bytes > 0);
        slot.store
            .get_or_init(|| async move {
                let dir = dir?;
                tokio::task::spawn_blocking(move || KvStore::new(&dir, &root, kv.conversations, kv.bytes as u64))
                    .await
                    .ok()
                    .flatten()
            })
            .await;
        Ok((slot, loaded))
    }
}

/// A ticket in a model's queue; dropping it leaves the queue.
pub struct Admission(Arc<Slot>);

impl Admission {
    /// The model it is a ticket for.
    pub(super) fn slot(&self) -> &Arc<Slot> {
        &self.0
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Takes a place in the model's queue, or Busy if the queue is full.
pub fn admit(engines: &Engines, slot: &Arc<Slot>) -> Result<Admission, EngineError> {
    let n = slot.admitted.fetch_add(1, Ordering::AcqRel);
    let ticket = Admission(slot.clone());
    if n >= engines.max_queue {
        return Err(EngineError::Busy);
    }
    Ok(ticket)
}

/// Runs `f` on the blocking pool once the model is free (the queue generations wait in);
/// None if the engine panicked.
pub async fn run_exclusive<T: Send + 'static>(
    admission: Admission,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let running = admission.0.running.clone();
    let permit = running.acquire_owned().await.ok()?;
    tokio::task::spawn_blocking(move || {
        let r = f();
        drop(permit);
        drop(admission);
        r
    })
    .await
    .ok()
}

/// What a generation sends back, in order: the prompt's log-probabilities (echo with
/// logprobs only), pieces of text with the log-probabilities of the tokens produced since
/// the last piece (logprobs only; the text may then be empty), then one Done or Error.
#[derive(Debug)]
pub enum Event {
    Prompt(Vec<TokenLogprob>),
    Text(String, Vec<TokenLogprob>),
    /// `cached_tokens`: prompt tokens whose cache an earlier request left (not fed again).
    Done {
        finish_reason: &'static str,
        prompt_tokens: usize,
        cached_tokens: usize,
        completion_tokens: usize,
    },
    Error(String),
    /// The output's grammar failed while tokens were generated (llguidance's reason): the
    /// request's fault, not the server's.
    Grammar(String),
}

/// One generation request, ready to run.
pub struct Job {
    pub prompt: Vec<u32>,
    /// Leading ids of `prompt` that later requests likely share (its system messages
    /// rendered); a recurrent model's prompt pass ends there
    /// ([`colibri_engine::generate::snapshot_cuts`]). 0: none known.
    pub shared_hint: usize,
    pub opts: GenerateOptions,
    pub stop: Vec<String>,
    /// Decode the output as a continuation of the prompt (completions) or on its own (chat).
    pub continue_prompt: bool,
    /// Also the prompt's teacher-forced log-probabilities with this many alternatives
    /// (completions with echo and logprobs); the prompt runs even when no token is asked.
    pub prompt_logprobs: Option<usize>,
    /// Structured output: the compiled grammar the output must match.
    pub constraint: Option<Constraint>,
    /// Speculative decoding (None: off).
    pub speculation: Option<Speculation>,
}

/// A generation waiting to join its model's batch ([`super::batch`]).
pub(super) struct Entry {
    pub job: Job,
    pub tx: mpsc::Sender<Event>,
    pub admission: Admission,
    pub permit: tokio::sync::OwnedSemaphorePermit,
}

/// What a model's batch driver shares with the handlers: the entries waiting to join, and
/// whether a driver thread runs.
#[derive(Default)]
pub(super) struct Incoming {
    pub waiting: std::collections::VecDeque<Entry>,
    pub driving: bool,
}

/// A model's conversation caches: in memory, and on disk when there is a data directory.
pub(super) struct Kv<'a> {
    pub pool: &'a Mutex<ContextPool<Session>>,
    pub store: Option<&'a KvStore>,
}

impl Kv<'_> {
    /// The cache that keeps the most of `ids`, from memory or else from disk; None: none.
    pub fn take(&self, cfg: &ModelConfig, ids: &[u32]) -> Option<(Session, usize)> {
        let mem = self.pool.lock().unwrap_or_else(|e| e.into_inner()).take(ids);
        let kept = mem.as_ref().map_or(0, |m| m.1);
        match self.store.and_then(|s| s.find(cfg, ids, kept)) {
            Some(disk) => {
                if let Some((m, _)) = mem {
                    self.pool.lock().unwrap_or_else(|e| e.into_inner()).put(m);
                }
                Some(disk)
            }
            None => mem,
        }
    }

    /// The longest prefix `ids` shares with a conversation kept in memory
    /// ([`ContextPool::shared`]).
    pub fn shared(&self, ids: &[u32]) -> usize {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).shared(ids)
    }

    /// Keeps `s` for the next request: in memory, and written to disk.
    pub fn put(&self, s: Session) {
        if let Some(store) = self.store {
            store.save(&s);
        }
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).put(s);
    }
}
