//! The engine as JavaScript sees it (inside colibri's worker): load a converted model
//! from the helper, then logits, tokenization, chat templates and step-wise generation
//! (one token per call, so the worker can stream tokens and honour a stop request).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use colibri_engine::experts::cache::CacheOptions;
use colibri_engine::experts::ram_tiers::default_pin;
use colibri_engine::experts::usage::ExpertUsage;
use colibri_engine::generate::choose::{self, Chooser};
use colibri_engine::generate::context_room;
use colibri_engine::generate::draft::max_draft;
use colibri_engine::generate::logprobs::chat_entry;
use colibri_engine::generate::request::truncation;
use colibri_engine::generate::{
    keepable, pin_shared, reusable, snapshot_cuts, Constraint, GenerateOptions, Generator, MtpDrafter, Pass,
    SamplingDefaults, Stepped, PREFILL_CHUNK,
};
use colibri_engine::gpu::Hybrid;
use colibri_engine::model::config::parse_token_ids;
use colibri_engine::model::open::Container;
use colibri_engine::tokenizer::{answer_reserve, fit_chat, system_prefix_len, ChatMessage, DecodeStream, Tokenizer};
use colibri_engine::{Logits, Model};
use js_sys::{Function, Promise};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::backend::{AutoChoice, Backend, Context, Want};
use crate::browser_source::BrowserSource;
use crate::dense::{report, DenseSource, DenseStats};
use crate::dense_file::{DenseFile, SEAL_BYTES};
use crate::kv_file;
use crate::memory;
use crate::names::storage_name;
use crate::net::{fetch, js_err, now_ms};
use crate::opfs::estimate;

/// The share of the origin's storage quota that a model's disk tier may fill by default.
const DISK_SHARE: f64 = 0.5;

mod cache;
mod draft;
mod options;
mod stats;
mod tiers;
mod weights;
use draft::{propose_tiered, DraftModel, DraftOptions, NO_DRAFT};
use options::{GenOptions, LoadOptions};
use tiers::{count_use, disk_budget, learned_usage, tier_map};
use weights::{load_weights, Plan};

pub(crate) use crate::error::{err, JsFail};

#[derive(Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Perf {
    /// The last generation's decoded tokens (after its first) and their milliseconds:
    /// stats().tokensPerSecond.
    tokens: u64,
    decode_ms: f64,
    ttft_ms: Option<f64>,
    started_ms: f64,
    /// Routed expert loads (one per expert per layer per step).
    expert_loads: u64,
    /// The same loads by the tier that served them, indexed like [`tier_map`]'s bytes:
    /// [helper, browser disk, RAM, GPU]. They add up to `expert_loads`.
    tier_uses: [u64; 4],
    /// The last generation's prompt, and how many of its tokens the cache already held.
    prompt_tokens: u64,
    cached_tokens: u64,
}

/// What changes while the engine runs. Behind a RefCell because steps are async (on
/// WebGPU they wait for the device): the worker runs one operation at a time, so a
/// borrow that fails means the page called in during a step, which is refused.
struct State {
    cx: Context,
    gen: Option<Generator>,
    perf: Perf,
    /// The generation's MTP drafter (generate({draft: "mtp"})).
    mtp: Option<MtpDrafter<Rc<Model>>>,
    /// The draft model (`loadDraft`), and whether this generation takes its drafts
    /// (generate({draft: "model"})).
    draft: Option<DraftModel>,
    model_draft: bool,
    /// Positions of the generator's pending input already fed: a long prompt is read
    /// PREFILL_CHUNK positions per step, so that a cancel gets in between.
    prefilled: usize,
    /// Positions where a pass of the prompt ends (`generate::snapshot_cuts`: a recurrent
    /// state goes back only to where a pass ended), and the one where other conversations
    /// part from this one, whose snapshot stays (`generate::pin_shared`).
    cuts: Vec<usize>,
    shared: usize,
    /// What the conversation's cache file in browser storage holds, as this engine last
    /// wrote or read it (None: not known), and what it will hold once the write that
    /// `exportCache` handed out succeeds (`cacheStored`).
    kv_held: Option<kv_file::Held>,
    kv_pending: Option<kv_file::Held>,
}

#[wasm_bindgen]
pub struct Engine {
    model: Rc<Model>,
    tok: Rc<Tokenizer>,
    stop_ids: Vec<u32>,
    tiers: Arc<BrowserSource>,
    backend: Backend,
    /// What `auto` measured, when it chose.
    auto: Option<AutoChoice>,
    state: Rc<RefCell<State>>,
    /// Whether the browser granted persistent storage (asked by the page, not here).
    persisted: Rc<Cell<bool>>,
    /// Learned expert use: the counts the model came with (the helper's, or this
    /// browser's) plus every use since; the disk tier's pins and the usage file go by it.
    learned: Rc<RefCell<ExpertUsage>>,
    /// The usage the model came with could not be used (another model version...).
    usage_error: Option<String>,
    /// The RAM tier's pin budget.
    pin_bytes: u64,
    /// The disk tier: "auto", "opfs" or "indexeddb", and its budget (None: the default share).
    storage: String,
    disk_bytes: Option<u64>,
    storage_name: String,
    /// The model's sampling defaults from generation_config.json.
    defaults: SamplingDefaults,
    /// What chat requests sample with by default, as JSON {temperature, topP} for the page.
    sampling: serde_json::Value,
    /// The model's fingerprint (colibri.json's xxh3) and where the worker keeps the
    /// conversation's cache in browser storage.
    fingerprint: String,
    cache_name: String,
    /// The fingerprint written in (and required of) this backend's cache files: the
    /// model's, with the adapter's tag on WebGPU ([`cache_tag`]).
    cache_fingerprint: String,
    /// Where the dense weights came from, and the bytes of the browser's copy.
    dense: DenseStats,
}

/// What tells a backend's cache files apart (None: the CPU, whose files are the helper's
/// too): on WebGPU the adapter's name hashed, since a driver may reassociate floats and a
/// conversation continued after a reload must give the bits it would have given.
fn cache_tag(backend: &Backend) -> Option<String> {
    match backend {
        Backend::Cpu => None,
        Backend::Gpu(g) => Some(format!("webgpu-{}", g.ctx.adapter_id())),
    }
}

/// {temperature, topP} for the page: what `chat.completions.create` samples with when the
/// request leaves them out, resolved by the engine's turn (generation_config.json, else
/// the API's `Fallback::OpenAi`), as the helper's `/v1/chat/completions` does. The page
/// shows these and sends only what its settings change.
fn sampling_json(d: &SamplingDefaults) -> serde_json::Value {
    use colibri_engine::generate::{Fallback, SamplingRequest};
    let c = d.resolve(&SamplingRequest::default(), &Fallback::OpenAi.config(0));
    serde_json::json!({"temperature": c.temperature, "topP": c.top_p})
}

const BUSY: &str = "the engine is busy with another operation";

/// The state for one operation; a borrow that fails means another one is running.
fn borrow(state: &RefCell<State>) -> Result<std::cell::RefMut<'_, State>, JsFail> {
    state.try_borrow_mut().map_err(|_| JsFail::msg(BUSY))
}

impl Engine {
    fn state(&self) -> Result<std::cell::RefMut<'_, State>, JsFail> {
        borrow(&self.state)
    }
}

#[wasm_bindgen]
impl Engine {
    /// Loads the converted model at `base` (e.g. "http://127.0.0.1:7878/models/demo/").
    /// `usage_for(storageName)`: a promise of the model's learned usage file (JSON text,
    /// docs/api.md) or null; the hottest experts in it are pinned in the RAM tier now.
    /// The disk tier is not opened here: the worker calls `attachDisk` once it holds the
    /// model's storage (Web Locks).
    pub async fn load(
        base: String,
        options: JsValue,
        on_progress: Option<Function>,
        usage_for: Option<Function>,
    ) -> Result<Engine, JsFail> {
        let opts: LoadOptions = if options.is_undefined() || options.is_null() {
            LoadOptions::default()
        } else {
            serde_json::from_str(
                &js_sys::JSON::stringify(&options).map_err(|e| err(js_err(e)))?.as_string().unwrap_or_default(),
            )
            .map_err(err)?
        };
        let want = Want::parse(opts.backend.as_deref()).map_err(err)?;
        let hybrid: Hybrid = opts.hybrid.as_deref().unwrap_or("off").parse().map_err(err)?;
        let base = if base.ends_with('/') { base } else { format!("{base}/") };
        let manifest_bytes = fetch(&format!("{base}colibri.json"), None, 5).await.map_err(err)?;
        let container = Container::parse(&manifest_bytes, &base).map_err(err)?;
        // The kernels' summing form, timed once before they compute (some ms).
        crate::kernel_form();
        let m = &container.manifest;
        let get = |name: &str| format!("{base}{name}");
        let tok_json = fetch(&get("tokenizer.json"), None, 5).await.map_err(err)?;
        let tok_cfg = if m.files.iter().any(|f| f == "tokenizer_config.json") {
            Some(fetch(&get("tokenizer_config.json"), None, 5).await.map_err(err)?)
        } else {
            None
        };
        let gen_cfg = if m.files.iter().any(|f| f == "generation_config.json") {
            fetch(&get("generation_config.json"), None, 5).await.ok()
        } else {
            None
        };
        let mut tok = Tokenizer::from_bytes(&tok_json, tok_cfg.as_deref()).map_err(err)?;

        let total = m.dense.length;
        let data_url = get(&m.data_file);
        let ram = opts.ram_bytes.unwrap_or(512 << 20);
        // The dense weights go straight to GPU buffers on WebGPU (and for `auto` when the
        // CPU backend could not hold them in wasm memory), else into wasm memory.
        let cpu_fit = memory::cpu_fit(total, ram);
        let streamed = match want {
            Want::WebGpu => true,
            Want::Auto => cpu_fit.is_err(),
            Want::Cpu => {
                cpu_fit.clone().map_err(|e| JsFail::msg(&e))?;
                false
            }
        };

        let name = storage_name(&base, &container.fingerprint);
        let disk_error = if opts.disk.unwrap_or(true) { "not opened yet" } else { "disabled" };
        let tiers = Arc::new(BrowserSource::new(
            m,
            data_url.clone(),
            opts.multi_range.unwrap_or(true),
            Some(disk_error.into()),
        ));

        // Learned usage: the hottest experts are pinned in the RAM tier, as natively.
        let (nl, ne) = (container.cfg.n_layers, container.cfg.router.n_experts);
        let (usage, usage_error) = match learned_usage(usage_for.as_ref(), &name).await {
            Ok(None) => (ExpertUsage::new(nl, ne), None),
            Ok(Some(f)) => match ExpertUsage::from_file(&f, nl, ne, Some(&container.fingerprint)) {
                Ok(u) => (u, None),
                Err(e) => (ExpertUsage::new(nl, ne), Some(e.to_string())),
            },
            Err(e) => (ExpertUsage::new(nl, ne), Some(e)),
        };
        let (_, expert_bytes) = m.byte_totals();
        let n_experts = m.experts.layers.iter().map(|l| l.experts.len() as u64).sum::<u64>().max(1);
        let moe_layers = m.experts.layers.iter().filter(|l| !l.experts.is_empty()).count() as u64;
        let per_token = expert_bytes / n_experts * container.cfg.router.top_k as u64 * moe_layers;
        let pin_bytes = match opts.pin_bytes {
            Some(p) => p.min(ram),
            None if usage.total() > 0 => default_pin(ram, per_token),
            None => 0,
        };
        // The counts are learned now and pinned by the worker's first `endTurn`, after the
        // disk tier is attached, so that the pinned experts are stored there too.
        let cache = CacheOptions { ram: Some(ram), pin: pin_bytes, ..Default::default() };
        // The browser's copy of the dense weights (OPFS), kept under the disk budget.
        let keep = opts.disk.unwrap_or(true) && opts.storage.as_deref() != Some("indexeddb");
        let file = if !keep {
            Err(None)
        } else if disk_budget(opts.disk_bytes).await.is_some_and(|b| total + SEAL_BYTES > b) {
            DenseFile::remove(&name).await;
            Err(Some(format!("the dense weights ({total} bytes) do not fit the disk budget")))
        } else {
            DenseFile::open(&name, total).await.map_err(|e| Some(format!("no browser copy of the dense weights: {e}")))
        };
        let dense = DenseSource::new(data_url.clone(), m, file);
        let plan = Plan {
            container: &container,
            streamed,
            want,
            hybrid,
            gpu_pool: opts.gpu_pool_bytes,
            tiers: &tiers,
            cache,
            usage: &usage,
            tok: &tok,
            cpu_fit: &cpu_fit,
            on_progress: &on_progress,
        };
        let (model, backend, auto, dense) = load_weights(&plan, &dense).await?;
        let tag = cache_tag(&backend);

        let mut stop_ids = model.cfg.eos_token_ids.clone();
        let mut defaults = SamplingDefaults::default();
        if let Some(g) = gen_cfg.and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok()) {
            stop_ids.extend(parse_token_ids(g.get("eos_token_id")));
            defaults = SamplingDefaults::from_generation_config(&g);
        }
        let sampling = sampling_json(&defaults);
        tok.add_eos_ids(&stop_ids);
        stop_ids = tok.eos_token_ids();
        report(&on_progress, "ready", total as f64, total as f64);
        let state = State {
            cx: backend.new_context(&model),
            gen: None,
            perf: Perf::default(),
            mtp: None,
            draft: None,
            model_draft: false,
            prefilled: 0,
            cuts: Vec::new(),
            shared: 0,
            kv_held: None,
            kv_pending: None,
        };
        Ok(Engine {
            model,
            tok: Rc::new(tok),
            stop_ids,
            tiers,
            backend,
            auto,
            state: Rc::new(RefCell::new(state)),
            persisted: Rc::new(Cell::new(false)),
            learned: Rc::new(RefCell::new(usage)),
            usage_error,
            pin_bytes,
            storage: opts.storage.unwrap_or_else(|| "auto".into()),
            disk_bytes: opts.disk_bytes,
            storage_name: name,
            defaults,
            sampling,
            cache_name: match &tag {
                Some(t) => format!("{}.{t}.kv", storage_name(&base, &container.fingerprint)),
                None => format!("{}.kv", storage_name(&base, &container.fingerprint)),
            },
            cache_fingerprint: match &tag {
                Some(t) => format!("{}.{t}", container.fingerprint),
                None => container.fingerprint.clone(),
            },
            dense,
            fingerprint: container.fingerprint.clone(),
        })
    }

    #[wasm_bindgen(js_name = vocabSize)]
    pub fn vocab_size(&self) -> usize {
        self.model.cfg.vocab
    }

    #[wasm_bindgen(js_name = modelInfo)]
    pub fn model_info(&self) -> String {
        let c = &self.model.cfg;
        serde_json::json!({
            "modelType": c.model_type, "layers": c.n_layers, "experts": c.router.n_experts,
            "topK": c.router.top_k, "vocab": c.vocab, "moeLayers": c.moe_layers,
            "contextLength": c.max_positions, "sampling": self.sampling,
        })
        .to_string()
    }

    /// Teacher-forced logits of `ids` from an empty context: a promise of a
    /// Float32Array [ids.len() * vocab].
    pub fn logits(&self, ids: Vec<u32>) -> Promise {
        let (model, backend, state, tiers) =
            (self.model.clone(), self.backend.clone(), self.state.clone(), self.tiers.clone());
        future_to_promise(async move {
            let mut st = borrow(&state)?;
            let mut cx = backend.new_context(&model);
            let map = tier_map(&model, &tiers, &backend);
            let mut on_use = count_use(&mut st.perf, &map, model.cfg.router.n_experts);
            let out = backend
                .forward_tiered(&model, &tiers, &mut cx, &ids, Logits::All, &mut on_use, None)
                .await
                .map_err(err)?;
            Ok(js_sys::Float32Array::from(&out[..]).into())
        })
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, JsFail> {
        self.tok.encode(text, add_special_tokens).map_err(err)
    }

    pub fn decode(&self, ids: Vec<u32>) -> Result<String, JsFail> {
        self.tok.decode(&ids, true).map_err(err)
    }

    /// Renders `messages` ([{role, content}] as JSON) with the chat template and
    /// tokenizes the result. The oldest turns that would leave less than `max_tokens` (at
    /// most a quarter of the context) for the answer are dropped, as the helper's API does
    /// (the same `fit_chat`); `truncate` false keeps them (an overflow is then refused when
    /// generation starts). JSON: {"ids": [...], "dropped": messages left out, "shared": the
    /// ids other conversations with these system messages share (`generate`'s
    /// `sharedPrefix`; 0 but for models whose state goes back only to snapshots)}.
    #[wasm_bindgen(js_name = chatPrompt)]
    pub fn chat_prompt(&self, messages_json: &str, max_tokens: Option<u32>, truncate: bool) -> Result<String, JsFail> {
        let msgs: Vec<ChatMessage> = serde_json::from_str(messages_json).map_err(err)?;
        let (ids, dropped) = self.chat_prompt_ids(&msgs, max_tokens, truncate)?;
        let shared = self.shared_prefix(&msgs, &ids);
        Ok(serde_json::json!({"ids": ids, "dropped": dropped, "shared": shared}).to_string())
    }
}

impl Engine {
    /// The ids of `ids` (the prompt of `msgs`) that other conversations with the same system
    /// messages share, for a model that goes back only to snapshots (`generate`'s
    /// `sharedPrefix`); 0 for the others.
    fn shared_prefix(&self, msgs: &[ChatMessage], ids: &[u32]) -> usize {
        match self.model.cfg.rewinds_to_snapshots() {
            true => system_prefix_len(msgs, ids, &|m| self.tok.encode_chat(m, false)),
            false => 0,
        }
    }

    /// `msgs` rendered and tokenized, the oldest turns dropped to fit when `truncate`: the
    /// ids and how many messages were dropped.
    fn chat_prompt_ids(
        &self,
        msgs: &[ChatMessage],
        max_tokens: Option<u32>,
        truncate: bool,
    ) -> Result<(Vec<u32>, usize), JsFail> {
        let ctx = self.model.cfg.max_positions;
        let (ids, dropped) = if truncate {
            let f = fit_chat(&self.tok, msgs, ctx, answer_reserve(max_tokens.map(|t| t as usize), ctx)).map_err(err)?;
            (f.ids, f.dropped)
        } else {
            (self.tok.encode_chat(msgs, true).map_err(err)?, 0)
        };
        Ok((ids, dropped))
    }
}

#[wasm_bindgen]
impl Engine {
    /// An OpenAI chat request (JSON, as `chat.completions.create` got it): its parameters
    /// checked as [`Engine::begin`] checks them (first, as the helper's API does), then
    /// `messages` rendered and fitted as [`Engine::chat_prompt`] does, with
    /// `max_completion_tokens` / `max_tokens` and `truncation` from the request. JSON:
    /// {"ids": [...], "dropped": messages left out, "shared": as [`Engine::chat_prompt`]}.
    #[wasm_bindgen(js_name = chatRequest)]
    pub fn chat_request(&self, request: &str) -> Result<String, JsFail> {
        let req: serde_json::Value = serde_json::from_str(request).map_err(options::options_err(request))?;
        let turn = options::openai_turn(&req)?;
        let truncate = truncation(req.get("truncation")).map_err(err)?;
        let msgs: Vec<ChatMessage> =
            serde_json::from_value(req.get("messages").cloned().unwrap_or_else(|| serde_json::json!([])))
                .map_err(|e| colibri_engine::Error::param("messages", format!("messages: {e}")))?;
        if msgs.is_empty() {
            return Err(colibri_engine::Error::param("messages", "messages must be a non-empty list").into());
        }
        let max_tokens = turn.max_tokens.map(|t| t.min(u32::MAX as u64) as u32);
        let out = self.chat_prompt_ids(&msgs, max_tokens, truncate)?;
        // truncation "disabled": a prompt past the context is refused here, naming the
        // messages, as the helper's API refuses it.
        let len = out.0.len();
        let limit = self.model.cfg.max_positions;
        if context_room(len, limit).is_none() {
            let e = colibri_engine::Error::ContextOverflow { len, limit };
            return Err(JsFail::new(&e.to_string(), Some(e.code()), Some("messages")));
        }
        let shared = self.shared_prefix(&msgs, &out.0);
        Ok(serde_json::json!({"ids": out.0, "dropped": out.1, "shared": shared}).to_string())
    }

    /// Starts generating after `ids`, reusing the cached context for their common prefix
    /// with the previous call. `options` is JSON: {maxNewTokens, temperature, topK, topP,
    /// repetitionPenalty, seed, frequencyPenalty, presencePenalty, logitBias ({id: bias}),
    /// ignoreEos, stop, logprobs, topLogprobs, sharedPrefix, and for structured
    /// output one of jsonSchema, grammar (GBNF or Lark), regex, responseFormat (OpenAI's)},
    /// or {openai: an OpenAI chat request as it is, draft}: checked by the engine's
    /// `TurnRequest`, as the helper's API checks it. A parameter out of range or that
    /// cannot be honoured, and a grammar the library refuses, are errors here (with
    /// `code` and `param`), before anything runs.
    pub fn begin(&self, ids: Vec<u32>, options: &str) -> Result<(), JsFail> {
        let o: GenOptions = if options.is_empty() {
            GenOptions::default()
        } else {
            serde_json::from_str(options).map_err(options::options_err(options))?
        };
        // An OpenAI request (chat.completions.create passes it through untouched): checked
        // by the engine as the helper's API checks it, the same parameters refused by name.
        let turn = o.turn(self.model.cfg.vocab, &self.defaults)?;
        // Empty, out-of-vocabulary or longer than the context: refused before anything runs.
        self.model.cfg.check_input(&ids, 0).map_err(err)?;
        let opts = GenerateOptions {
            max_new_tokens: turn.max_new_tokens,
            sampler: turn.sampler,
            stop_ids: if turn.ignore_eos { Vec::new() } else { self.stop_ids.clone() },
            logprobs: turn.logprobs,
        };
        let model_draft = o.draft.as_deref() == Some("model");
        let want_mtp = match o.draft.as_deref() {
            None | Some("model") => false,
            Some("mtp") if !matches!(self.backend, Backend::Cpu) => {
                return Err(JsFail::msg("draft: \"mtp\" runs on the cpu backend (load({backend: \"cpu\"}))"))
            }
            Some("mtp") => true,
            Some(d) => return Err(JsFail::msg(&format!("draft: {d:?} is not a draft source (\"mtp\" or \"model\")"))),
        };
        let mut st = self.state()?;
        if model_draft && st.draft.is_none() {
            return Err(JsFail::msg(NO_DRAFT));
        }
        // MTP drafts read every position's hidden state: the cache is reused only when the
        // last generation recorded them (it drafted with MTP too, and its drafter stayed).
        let reuse = !want_mtp || st.mtp.is_some();
        let mtp = match (want_mtp, st.mtp.take()) {
            (false, _) => None,
            (true, Some(d)) => Some(d),
            (true, None) => Some(MtpDrafter::new(self.model.clone()).map_err(err)?),
        };
        let common = if reuse { keepable(&st.cx, &ids) } else { 0 };
        // A Gated DeltaNet or DeepSeek-V4 state goes back only to where a pass ended: the
        // prompt's passes end after the system prompt (`sharedPrefix`) or where it leaves
        // the last conversation and, for a long one, before its last id (a regenerated
        // answer then feeds that id alone).
        (st.cuts, st.shared) = match reuse && self.model.cfg.rewinds_to_snapshots() {
            true => {
                let shared = if o.shared_prefix > 0 { o.shared_prefix } else { reusable(st.cx.tokens(), &ids) };
                (snapshot_cuts(common, shared, ids.len()), shared)
            }
            false => (Vec::new(), 0),
        };
        // The engine's loop caps the answer at the context limit (prompt + k - 1 positions
        // for k tokens) and refuses a prompt longer than the context.
        let mut gen = Generator::new(&ids[..common], &ids[common..], self.model.cfg.max_positions, &opts)
            .map_err(err)?
            .with_text(DecodeStream::default(), turn.stop);
        if let Some(g) = turn.grammar {
            gen = gen.with_constraint(Constraint::new(&self.tok, &g).map_err(err)?);
        }
        if mtp.is_some() || model_draft {
            gen = gen.with_external_drafts(max_draft(turn.speculate, mtp.is_some()));
        } else if turn.speculate > 0 {
            gen = gen.with_speculation(turn.speculate);
        }
        st.mtp = mtp;
        st.model_draft = model_draft;
        // The cache of the prompt's prefix that the last generation left stays.
        st.cx.truncate(common);
        st.perf.cached_tokens = common as u64;
        st.perf.prompt_tokens = ids.len() as u64;
        st.gen = Some(gen);
        st.prefilled = 0;
        st.perf.started_ms = now_ms();
        st.perf.ttft_ms = None;
        st.perf.tokens = 0;
        st.perf.decode_ms = 0.0;
        Ok(())
    }

    /// Loads the converted model at `base` (named `name` in errors and stats: an id or a
    /// URL) as the draft model of `generate({draft: "model"})`, replacing any earlier one.
    /// `options`: {ramBytes, multiRange}. A draft whose tokenizer differs from the model's is
    /// refused. A promise of its `stats().draft`, as JSON.
    #[wasm_bindgen(js_name = loadDraft)]
    pub fn load_draft(
        &self,
        base: String,
        name: String,
        options: &str,
        on_progress: Option<Function>,
    ) -> Result<Promise, JsFail> {
        let opts: DraftOptions =
            if options.is_empty() { DraftOptions::default() } else { serde_json::from_str(options).map_err(err)? };
        let (tok, vocab, state) = (self.tok.clone(), self.model.cfg.vocab, self.state.clone());
        Ok(future_to_promise(async move {
            let d = DraftModel::load(&base, name, opts, &tok, vocab, &on_progress).await?;
            let stats = d.stats().to_string();
            let mut st = borrow(&state)?;
            st.draft = Some(d);
            st.model_draft = false;
            Ok(stats.into())
        }))
    }

    /// A promise of the next token, -2 while a long prompt is still being read (a chunk
    /// of it per step), or -1 when generation has ended. After an error (the
    /// helper went away mid-step) the context is rolled back, so calling again retries.
    pub fn step(&self) -> Promise {
        let (model, backend, state, tok, tiers) =
            (self.model.clone(), self.backend.clone(), self.state.clone(), self.tok.clone(), self.tiers.clone());
        future_to_promise(async move {
            let mut st = borrow(&state)?;
            let State { cx, gen, perf, mtp, draft, model_draft, prefilled, cuts, shared, .. } = &mut *st;
            let Some(g) = gen.as_mut() else { return Ok((-1).into()) };
            // Drafting is part of the step's time (tokensPerSecond).
            let t0 = now_ms();
            // The context's valid positions before this step's input (a long prompt's
            // pieces fed by earlier steps are part of that input).
            let mut fed = cx.tokens().len() - *prefilled;
            let log = mtp.as_ref().map(|d| d.log());
            let map = tier_map(&model, &tiers, &backend);
            let produced = g.produced().len();
            // The engine's step (Generator::step_async), as every surface runs it; only
            // the drafters' and the forward pass's storage I/O is the browser's own.
            let stepped = g
                .step_async(
                    &mut fed,
                    async |context: &[u32], k| match (mtp.as_mut(), draft.as_mut().filter(|_| *model_draft)) {
                        // The MTP layer's experts come through the model's own tiers.
                        (Some(d), _) => propose_tiered(d, &tiers, context, k).await,
                        (None, Some(d)) => d.propose(context, k).await,
                        (None, None) => Ok(Vec::new()),
                    },
                    async |_keep, ids: &[u32], which| {
                        pin_shared(cx, *shared);
                        let before = cx.tokens().len();
                        let mut on_use = count_use(&mut *perf, &map, model.cfg.router.n_experts);
                        // A long prompt goes in pieces of PREFILL_CHUNK positions (ending at
                        // the cuts too), one per step (-2: still reading), the same bits as
                        // one pass; the worker sees a cancel between them. Not with speculation's rows or MTP
                        // drafts, whose log follows whole passes.
                        let rest = ids.get(*prefilled..).unwrap_or_default();
                        let piece = cuts
                            .iter()
                            .find(|&&c| c > before)
                            .map_or(PREFILL_CHUNK, |&c| (c - before).min(PREFILL_CHUNK));
                        let part = which == Logits::Last && log.is_none() && rest.len() > piece;
                        let input = if part { &rest[..piece] } else { rest };
                        let result = match part {
                            true => backend.forward_tiered(&model, &tiers, cx, input, which, &mut on_use, None).await,
                            false => {
                                backend
                                    .forward_tiered(&model, &tiers, cx, input, which, &mut on_use, log.as_ref())
                                    .await
                            }
                        };
                        let logits = result.inspect_err(|_| cx.truncate(before))?;
                        Ok(match part {
                            true => {
                                *prefilled += piece;
                                Pass::Partial
                            }
                            false => {
                                *prefilled = 0;
                                Pass::Logits(logits)
                            }
                        })
                    },
                    Some(&tok),
                )
                .await
                .map_err(err)?;
            match stepped {
                Stepped::Finished => return Ok((-1).into()),
                Stepped::Partial => return Ok((-2).into()),
                // Rejected drafts leave the context.
                Stepped::Accepted { .. } => cx.truncate(fed),
            }
            let id = g.produced().last().copied().unwrap_or(0);
            let t1 = now_ms();
            if perf.ttft_ms.is_none() {
                perf.ttft_ms = Some(t1 - perf.started_ms);
            } else {
                perf.tokens += (g.produced().len() - produced) as u64;
                perf.decode_ms += t1 - t0;
            }
            Ok((id as i32).into())
        })
    }

    /// Text completed since the last call (never a partial UTF-8 character).
    #[wasm_bindgen(js_name = takeText)]
    pub fn take_text(&self) -> Result<String, JsFail> {
        Ok(self.state()?.gen.as_mut().map(|g| g.take_text()).unwrap_or_default())
    }

    /// Log-probabilities of the tokens produced since the last call, as JSON in the shape
    /// of OpenAI's chat `logprobs.content` ([{token, logprob, bytes, top_logprobs}]).
    #[wasm_bindgen(js_name = takeLogprobs)]
    pub fn take_logprobs(&self) -> Result<String, JsFail> {
        let entries = self.state()?.gen.as_mut().map(|g| g.take_logprobs()).unwrap_or_default();
        let v: Vec<serde_json::Value> = entries.iter().map(|t| chat_entry(&self.tok, t)).collect();
        serde_json::to_string(&v).map_err(err)
    }

    /// Scores `options` (a JSON list of strings) as answers to `prompt` (one user message
    /// through the chat template, or with `raw` the text as it is), generating nothing:
    /// a promise of the JSON of `coli choose --json` (without its timing).
    pub fn choose(&self, prompt: String, options_json: &str, raw: bool) -> Result<Promise, JsFail> {
        let options: Vec<String> = serde_json::from_str(options_json).map_err(err)?;
        if options.iter().any(|o| o.is_empty()) {
            return Err(JsFail::msg("an option is empty"));
        }
        let ids = choose::encode_prompt(&self.tok, &prompt, raw).map_err(err)?;
        let option_ids = choose::encode_options(&self.tok, &options).map_err(err)?;
        let mut c = Chooser::new(ids, option_ids, self.model.cfg.max_positions).map_err(err)?;
        let (model, backend, state, tiers) =
            (self.model.clone(), self.backend.clone(), self.state.clone(), self.tiers.clone());
        Ok(future_to_promise(async move {
            let mut st = borrow(&state)?;
            // A context of its own: the conversation's cached prefix stays as it was.
            let mut cx = backend.new_context(&model);
            while let Some(s) = c.step() {
                cx.truncate(s.keep);
                let map = tier_map(&model, &tiers, &backend);
                let mut on_use = count_use(&mut st.perf, &map, model.cfg.router.n_experts);
                let logits = backend
                    .forward_tiered(&model, &tiers, &mut cx, s.ids, s.which, &mut on_use, None)
                    .await
                    .map_err(err)?;
                c.accept(&logits).map_err(err)?;
            }
            Ok(c.finish().to_json(&options).to_string().into())
        }))
    }

    /// Why the current generation ended: "stop", "length", "cancelled", or "" while it
    /// runs (or before any).
    #[wasm_bindgen(js_name = finishReason)]
    pub fn finish_reason(&self) -> Result<String, JsFail> {
        let st = self.state()?;
        Ok(st.gen.as_ref().and_then(|g| g.finished()).map_or("", |r| r.as_str()).to_string())
    }

    /// Ids produced by the current generation.
    pub fn produced(&self) -> Result<Vec<u32>, JsFail> {
        Ok(self.state()?.gen.as_ref().map(|g| g.produced().to_vec()).unwrap_or_default())
    }

    /// (usage, quota) of browser storage in bytes, as JSON, or null.
    #[wasm_bindgen(js_name = storageEstimate)]
    pub async fn storage_estimate() -> String {
        match estimate().await {
            Some((u, q)) => serde_json::json!({"usage": u, "quota": q}).to_string(),
            None => "null".into(),
        }
    }
}
