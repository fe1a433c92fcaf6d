//! The native engine behind the OpenAI endpoints: models loaded on first use and kept,
//! one generation per model at a time (the others wait in a bounded queue), each run on
//! the blocking pool and streaming text pieces through a channel. A generation stops
//! when its client goes away (the channel closes) or the helper shuts down: at its next
//! token, or during a long prompt at the next chunk of its prefill. Each model
//! keeps its last conversations' caches ([`ContextPool`]): a request that extends one
//! feeds only its new tokens (reported as `cached_tokens`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use colibri_engine::generate::logprobs::sequence_logprobs;
use colibri_engine::generate::{
    feed_chunked, forward_recording, Constraint, ContextPool, Drafter, GenerateOptions, Generator, ModelDrafter,
    MtpDrafter, StopReason, TokenLogprob, PREFILL_CHUNK,
};
use colibri_engine::model::config::ModelConfig;
use colibri_engine::tokenizer::DecodeStream;
use colibri_engine::{Logits, Session};
use tokio::sync::{mpsc, OnceCell, Semaphore};

use super::models::ModelEntry;
use super::Stats;
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

/// Generations that run at once on one model (the others wait in its queue).
const RUNNING_PER_MODEL: usize = 1;

/// A loaded model and its generation queue.
pub struct Slot {
    loaded: OnceCell<Arc<Loaded>>,
    /// The speculation its generations use (decided once: the draft only where the
    /// tokenizers agree).
    speculation: std::sync::OnceLock<Option<Speculation>>,
    /// Generations allowed at once on this model.
    running: Arc<Semaphore>,
    /// Generations admitted (running or waiting).
    admitted: AtomicUsize,
    /// The last conversations' caches, for requests that extend them.
    contexts: Mutex<ContextPool<Session>>,
    /// The same on disk, for after a restart (None without a data directory).
    store: OnceCell<Option<KvStore>>,
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
    /// Most generations admitted per model; more get 503.
    pub max_queue: usize,
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
    pub kv_conversations: usize,
    pub kv_bytes: usize,
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
                    running: RUNNING_PER_MODEL.saturating_sub(slot.running.available_permits()),
                    kv_conversations,
                    kv_bytes,
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
                    running: Arc::new(Semaphore::new(RUNNING_PER_MODEL)),
                    admitted: AtomicUsize::new(0),
                    contexts: Mutex::new(ContextPool::new(self.kv.conversations, self.kv.bytes)),
                    store: OnceCell::new(),
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
    pub loaded: Arc<Loaded>,
    pub prompt: Vec<u32>,
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

/// Starts `job` once the model is free; events arrive on the returned channel. Dropping
/// the receiver cancels the generation at its next token.
pub fn spawn(job: Job, admission: Admission, stats: Arc<Stats>, shutdown: Arc<AtomicBool>) -> mpsc::Receiver<Event> {
    let (tx, rx) = mpsc::channel(32);
    tokio::spawn(async move {
        let running = admission.0.running.clone();
        // A client that leaves while its generation waits for the model frees its place
        // in the queue at once (not when the generation's turn comes).
        let permit = tokio::select! {
            p = running.acquire_owned() => p,
            _ = tx.closed() => return,
        };
        let Ok(permit) = permit else { return };
        if tx.is_closed() || shutdown.load(Ordering::Relaxed) {
            return;
        }
        stats.generations_started.fetch_add(1, Ordering::Relaxed);
        stats.generations_active.fetch_add(1, Ordering::Relaxed);
        let st = stats.clone();
        let slot = admission.0.clone();
        let ran = tokio::task::spawn_blocking(move || {
            let kv = Kv { pool: &slot.contexts, store: slot.store.get().and_then(Option::as_ref) };
            let (last, cancelled) = run(job, kv, &tx, &st, &shutdown);
            // Account and free the model before the last event, so that a client that
            // sees it finds the generation over and the queue free.
            st.generations_active.fetch_sub(1, Ordering::Relaxed);
            let counter = if cancelled { &st.generations_cancelled } else { &st.generations_finished };
            counter.fetch_add(1, Ordering::Relaxed);
            drop(admission);
            drop(permit);
            if let Some(ev) = last {
                let _ = tx.blocking_send(ev);
            }
        })
        .await;
        if ran.is_err() {
            // The engine panicked: the ticket and permit were dropped while unwinding.
            stats.generations_active.fetch_sub(1, Ordering::Relaxed);
            stats.generations_cancelled.fetch_add(1, Ordering::Relaxed);
        }
    });
    rx
}

/// A model's conversation caches: in memory, and on disk when there is a data directory.
struct Kv<'a> {
    pool: &'a Mutex<ContextPool<Session>>,
    store: Option<&'a KvStore>,
}

impl Kv<'_> {
    /// The cache that keeps the most of `ids`, from memory or else from disk; None: none.
    fn take(&self, cfg: &ModelConfig, ids: &[u32]) -> Option<(Session, usize)> {
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

    /// Keeps `s` for the next request: in memory, and written to disk.
    fn put(&self, s: Session) {
        if let Some(store) = self.store {
            store.save(&s);
        }
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).put(s);
    }
}

/// Runs the generation on this (blocking) thread, sending text as it comes; returns the
/// last event to send (Done or Error; None if the client is gone) and whether the
/// generation was cancelled. The conversation's cache comes from `kv` (the longest prefix
/// of the prompt some earlier request left, in memory or on disk) and goes back there.
fn run(job: Job, kv: Kv<'_>, tx: &mpsc::Sender<Event>, stats: &Stats, shutdown: &AtomicBool) -> (Option<Event>, bool) {
    let Job { loaded, prompt, opts, stop, continue_prompt, prompt_logprobs, constraint, speculation } = job;
    let Some(tok) = loaded.tokenizer.as_ref() else {
        return (Some(Event::Error("this model has no tokenizer".into())), false);
    };
    let stream = if continue_prompt { DecodeStream::with_context(true, &prompt) } else { DecodeStream::default() };
    // MTP drafts read the hidden state of every position (a reused cache has none).
    let mtp = speculation.as_ref().is_some_and(|s| s.mtp);
    let mtp_drafter = if mtp { Some(MtpDrafter::new(&loaded.model)) } else { None }.transpose();
    let mtp_drafter = match mtp_drafter {
        Ok(d) => d,
        Err(e) => return (Some(Event::Error(e.to_string())), false),
    };
    let log = mtp_drafter.as_ref().map(|d| d.log());
    // A forward pass after what `session` holds (recording the hidden states for MTP); else on
    // a worker of the CPU pool (`flags::on_pool`: its parallel regions then start on a
    // worker). One hand-off per pass, not per request: between passes this thread waits
    // for the client (`blocking_send`), which must not hold a worker.
    //
    // A prompt is fed in chunks of PREFILL_CHUNK positions, and before each one the
    // generation checks that its client is still there and the helper not shutting down:
    // a client that leaves during a long prefill frees the model within one chunk, not
    // at the end of the whole prompt (the same bits as one pass: generate::prefill).
    let model = &loaded.model;
    let go_on = || !tx.is_closed() && !shutdown.load(Ordering::Relaxed);
    let forward = |session: &mut Session, ids: &[u32], which: Logits| {
        let mut pass = |part: &[u32], which| match &log {
            // The MTP log is not Send: those passes stay on this thread.
            Some(log) => forward_recording(model, session, log, session.len(), part, which),
            None => crate::flags::on_pool(|| model.forward(session, part, which)),
        };
        feed_chunked(&mut pass, ids, which, PREFILL_CHUNK, &mut || go_on())
    };
    // Echo with logprobs needs every prompt position's logits: nothing is reused then.
    let taken = match prompt_logprobs {
        None if !mtp => kv.take(&loaded.model.cfg, &prompt),
        _ => None,
    };
    let (mut session, cached) = taken.unwrap_or_else(|| (loaded.model.new_session(), 0));
    let (history, fresh) = prompt.split_at(cached);
    let mut gen = match Generator::new(history, fresh, loaded.model.cfg.max_positions, &opts) {
        Ok(g) => g.with_text(stream, stop),
        Err(e) => return (Some(Event::Error(e.to_string())), false),
    };
    if let Some(c) = constraint {
        gen = gen.with_constraint(c);
    }
    let mut drafter: Option<Box<dyn Drafter + '_>> = None;
    match speculation {
        Some(Speculation { max_draft, mtp: true, .. }) => {
            gen = gen.with_external_drafts(max_draft);
            drafter = mtp_drafter.map(|d| Box::new(d) as Box<dyn Drafter>);
        }
        Some(Speculation { max_draft, draft: Some(d), .. }) => {
            gen = gen.with_external_drafts(max_draft);
            let (mut ds, vocab, max_positions) =
                (d.model.new_session(), loaded.model.cfg.vocab, d.model.cfg.max_positions);
            let forward = Box::new(move |keep, ids: &[u32], which| {
                ds.truncate(keep);
                crate::flags::on_pool(|| d.model.forward(&mut ds, ids, which))
            });
            drafter = Some(Box::new(ModelDrafter::new(forward, max_positions, vocab)));
        }
        Some(Speculation { max_draft, draft: None, .. }) => gen = gen.with_speculation(max_draft),
        None => {}
    }
    let mut client_gone = false;
    let mut shutting_down = false;
    let mut result = Ok(());
    // Echo with logprobs: the prompt once with every position's logits; its last row
    // gives the first token.
    let mut first_row = None;
    if let Some(n) = prompt_logprobs {
        let vocab = loaded.model.cfg.vocab;
        match forward(&mut session, &prompt, Logits::All) {
            Ok(rows) => {
                if tx.blocking_send(Event::Prompt(sequence_logprobs(&rows, &prompt, vocab, n))).is_err() {
                    client_gone = true;
                    gen.cancel();
                }
                first_row = Some(rows[rows.len() - vocab..].to_vec());
            }
            Err(e) => {
                result = Err(e);
                gen.cancel();
            }
        }
    }
    let with_logprobs = opts.logprobs.is_some();
    // The engine's step (Generator::step): drafts, one pass, the tokens it decides. The
    // context is cut back to what stays valid before each pass (and after the last).
    let mut fed = cached;
    loop {
        let before = gen.produced().len();
        let mut pass = |keep: usize, ids: &[u32], which: Logits| {
            // Echo with logprobs fed the prompt already: its last row decides the first token.
            if let Some(row) = first_row.take() {
                return Ok(row);
            }
            if keep < session.len() {
                session.truncate(keep);
            }
            forward(&mut session, ids, which)
        };
        match gen.step(&mut pass, &mut fed, drafter.as_deref_mut(), Some(tok)) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        stats.tokens_generated.fetch_add((gen.produced().len() - before) as u64, Ordering::Relaxed);
        let text = gen.take_text();
        let lps = gen.take_logprobs();
        let send = !text.is_empty() || (with_logprobs && !lps.is_empty());
        if tx.is_closed() || (send && tx.blocking_send(Event::Text(text, lps)).is_err()) {
            client_gone = true;
            gen.cancel();
        } else if shutdown.load(Ordering::Relaxed) && gen.finished().is_none() {
            shutting_down = true;
            gen.cancel();
        }
    }
    if result.is_ok() && fed < session.len() {
        session.truncate(fed);
    }
    // A prefill stopped between its chunks: the client left or the helper is shutting
    // down. The chunks fed so far are a valid cache of the prompt's first tokens.
    if matches!(result, Err(colibri_engine::Error::Cancelled)) {
        result = Ok(());
        gen.cancel();
        if tx.is_closed() {
            client_gone = true;
        } else {
            shutting_down = true;
        }
    }
    if gen.is_speculative() {
        let sp = gen.spec_stats();
        stats.spec_forwards.fetch_add(sp.forwards as u64, Ordering::Relaxed);
        stats.spec_drafted.fetch_add(sp.drafted as u64, Ordering::Relaxed);
        stats.spec_accepted.fetch_add(sp.accepted as u64, Ordering::Relaxed);
    }
    // A turn boundary, as in `coli chat`: re-pin by use (with hysteresis) and merge the
    // expert uses into the model's usage file, next to what browsers report.
    if let Err(e) = loaded.model.experts.end_turn() {
        eprintln!("coli: warning: re-pinning experts: {e}");
    }
    crate::load::save_usage(&loaded);
    // A failed forward pass may have left keys past the ids: that cache is dropped.
    if result.is_ok() {
        stats.prompt_tokens_cached.fetch_add(cached as u64, Ordering::Relaxed);
        kv.put(session);
    }
    match result {
        Err(e @ colibri_engine::Error::Grammar(_)) => return (Some(Event::Grammar(e.to_string())), false),
        Err(e) => return (Some(Event::Error(e.to_string())), false),
        Ok(()) => {}
    }
    if client_gone {
        return (None, true);
    }
    if shutting_down {
        return (Some(Event::Error("the helper is shutting down".into())), true);
    }
    let finish_reason = match gen.finished() {
        Some(StopReason::Stop) => "stop",
        _ => "length",
    };
    let done = Event::Done {
        finish_reason,
        prompt_tokens: prompt.len(),
        cached_tokens: cached,
        completion_tokens: gen.produced().len(),
    };
    (Some(done), false)
}
