//! The OpenAI-compatible API, served by the native engine: `GET /v1/models`,
//! `POST /v1/chat/completions` and `POST /v1/completions`, streaming (`stream: true`,
//! server-sent events of `chat.completion.chunk` / `text_completion` objects ending in
//! `data: [DONE]`) or not. Errors have OpenAI's shape:
//! `{"error": {"message", "type", "param", "code"}}` ([`super::api_error`]).
//!
//! Supported: temperature, top_p, max_tokens / max_completion_tokens, stop (string or
//! list), seed, n = 1, stream_options.include_usage; extensions as in llama.cpp/vLLM:
//! top_k, repetition_penalty, ignore_eos; colibri's `speculate` (speculative decoding per
//! request, within `coli serve --speculate`); logprobs / top_logprobs (chat) and logprobs +
//! echo (completions) in OpenAI's shapes (see [`colibri_engine::generate::logprobs`]).
//! Structured output (`response_format` json_object / json_schema, llama.cpp's `grammar`,
//! `tools` / `tool_choice`): see [`super::structured`]. frequency_penalty,
//! presence_penalty and logit_bias, and what is refused by name: the engine's
//! [`colibri_engine::generate::request`], which the browser engine runs too;
//! n > 1 is refused with 400.
//! A chat that would overflow the context loses its oldest turns (`truncation: "auto"`,
//! the default; the response says how many messages in `dropped_messages`); `"disabled"`
//! answers 400 `context_length_exceeded` instead. With `tools`, the prompt that is fitted
//! is the one with the tools rendered in (they stay; turns go).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use colibri_engine::generate::logprobs::{chat_entry, completion_logprobs};
use colibri_engine::generate::request::truncation;
use colibri_engine::generate::{context_room, Fallback, GenerateOptions, TokenLogprob, TurnRequest};
use colibri_engine::tokenizer::{answer_reserve, fit_rendered, system_prefix_len, ChatMessage};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::api_error::ApiError;
use super::generation::{self as engine, EngineError, Event, Job, Speculation};
use super::structured::{self, Tools};
use super::AppState;

pub(super) mod stream;
use stream::stream_response;

/// Completion tokens when the request names no limit (and the context allows it).
pub const DEFAULT_MAX_TOKENS: usize = 4096;
/// Largest request body of the OpenAI endpoints.
pub const MAX_BODY: usize = 4 << 20;

#[derive(Deserialize, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// Fields common to both endpoints: the server's own, and the turn's (checked by the
/// engine, as the browser engine checks them); unknown fields are ignored, as OpenAI
/// clients send many.
#[derive(Deserialize, Default)]
struct Params {
    model: Option<String>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    /// Ollama's `num_ctx` (also taken here): the context window in tokens, at most the
    /// model's; the prompt and the answer must fit in it.
    num_ctx: Option<usize>,
    #[serde(flatten)]
    turn: TurnRequest,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct MessageIn {
    role: String,
    content: Option<Content>,
    /// An assistant turn's earlier function calls.
    tool_calls: Option<Value>,
}

#[derive(Deserialize)]
struct ChatRequest {
    #[serde(flatten)]
    params: Params,
    messages: Option<Vec<MessageIn>>,
    tools: Option<Value>,
    /// "auto" (default): drop the oldest turns that do not fit the context; "disabled":
    /// answer 400 `context_length_exceeded` instead (the names of OpenAI's Responses API).
    truncation: Option<Value>,
    tool_choice: Option<Value>,
}

#[derive(Deserialize)]
struct CompletionRequest {
    #[serde(flatten)]
    params: Params,
    prompt: Option<Value>,
    echo: Option<bool>,
}

fn parse<T: serde::de::DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let body = body.map_err(|e| ApiError { status: e.status(), ..ApiError::invalid(e.body_text(), None) })?;
    ApiError::parse_json(&body)
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

static COUNTER: AtomicU64 = AtomicU64::new(1);

fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:x}{:06x}", now_secs(), COUNTER.fetch_add(1, Ordering::Relaxed) & 0xff_ffff)
}

/// Everything decided before a generation starts.
pub(super) struct Prepared {
    pub(super) id: String,
    pub(super) model: String,
    created: u64,
    stream: bool,
    include_usage: bool,
    pub(super) rx: mpsc::Receiver<Event>,
    loaded: Arc<crate::load::Loaded>,
    /// Whether the response carries logprobs.
    logprobs: bool,
    /// Completions with echo: the prompt's ids and text, returned before the completion.
    echo: Option<(Vec<u32>, String)>,
    /// Chat: how many of the oldest messages were left out to fit the context.
    pub(super) dropped_messages: usize,
    /// Function calling: an output that is a call is returned as `tool_calls`.
    pub(super) tools: bool,
    /// The parameter the output's grammar came from (tools, response_format, grammar).
    pub(super) grammar_param: Option<&'static str>,
}

/// What an endpoint asks of [`prepare`] beyond the common parameters.
#[derive(Default)]
struct Extras {
    /// Decode the output as a continuation of the prompt (completions).
    continue_prompt: bool,
    /// Log-probabilities with this many alternatives per token.
    logprobs: Option<usize>,
    /// Return the prompt (and its logprobs, with `logprobs`) before the completion.
    echo: bool,
    /// Function calling (chat).
    tools: Option<Tools>,
}

/// Looks the requested model up and loads it (once): its id, queue and engine.
pub(super) async fn load_model(
    state: &Arc<AppState>,
    model: Option<String>,
) -> Result<(String, Arc<engine::Slot>, Arc<crate::load::Loaded>), ApiError> {
    let model = model
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::invalid("you must provide a model parameter", Some("model")))?;
    let entry = state.registry.get(&model).ok_or_else(|| {
        ApiError {
            status: StatusCode::NOT_FOUND,
            ..ApiError::invalid(format!("The model `{model}` does not exist"), Some("model"))
        }
        .with_code("model_not_found")
    })?;
    let (slot, loaded) = state.engines.load(&entry).await.map_err(|e| match e {
        // The model's files are broken: the request cannot be served as it is (422).
        EngineError::Load(msg) => ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            ..ApiError::invalid(format!("could not load model `{model}`: {msg}"), Some("model"))
        }
        .with_code("model_not_loadable"),
        EngineError::Busy => ApiError::server(StatusCode::SERVICE_UNAVAILABLE, "busy"),
    })?;
    Ok((model, slot, loaded))
}

/// Seconds a client refused for a full queue is asked to wait (`Retry-After`): about one
/// generation's time on a small model.
const BUSY_RETRY_AFTER_S: u32 = 2;

/// A place in the model's queue, or 503.
pub(super) fn admit(state: &AppState, slot: &Arc<engine::Slot>) -> Result<engine::Admission, ApiError> {
    engine::admit(&state.engines, slot).map_err(|_| {
        ApiError::server(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests for this model are waiting; try again later",
        )
        .with_code("server_busy")
        .retry_after(BUSY_RETRY_AFTER_S)
    })
}

/// A request's prompt as `make_prompt` built it.
pub(super) struct Built {
    pub ids: Vec<u32>,
    /// Messages left out to fit the context.
    pub dropped: usize,
    /// Leading ids that later requests likely share ([`Job::shared_hint`]); 0: none known.
    pub shared_hint: usize,
}

/// Shared path of both endpoints: look the model up, load it, build the prompt with
/// `make_prompt`, check limits, queue the generation.
async fn prepare(
    state: &Arc<AppState>,
    p: Params,
    prefix: &str,
    extras: Extras,
    make_prompt: impl FnOnce(&crate::load::Loaded) -> Result<Built, ApiError> + Send + 'static,
) -> Result<Prepared, ApiError> {
    // Every parameter of the turn, checked by the engine (the browser engine runs the same
    // check): refusals, types, ranges, one constraint at most, stop strings.
    let tools = extras.tools.as_ref().map(|t| t.grammar.clone());
    let mut turn = p.turn.check(tools, extras.echo)?;
    turn.sampling.seed.get_or_insert_with(|| {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
            ^ COUNTER.fetch_add(1, Ordering::Relaxed)
    });
    let grammar = turn.grammar.take();
    let grammar_param = grammar.as_ref().map(|g| g.1);
    let requested = turn.max_tokens;

    let num_ctx = p.num_ctx;
    if num_ctx == Some(0) {
        return Err(ApiError::invalid("num_ctx must be at least 1", Some("num_ctx")));
    }
    let (model, slot, loaded) = load_model(state, p.model).await?;
    // The request, then the model's generation_config.json, then OpenAI's defaults.
    let sampler = turn.sampler(&loaded.sampling, &Fallback::OpenAi.config(0), loaded.model.cfg.vocab)?;
    // Template rendering and tokenizing take CPU time in proportion to the request (up to
    // MAX_BODY bytes): off the async workers, so /health and file ranges stay quick.
    // At most PROMPTS_AT_ONCE at a time, which bounds their memory.
    let l = loaded.clone();
    let permit = state.prompts.clone().acquire_owned().await;
    let Built { ids: prompt, dropped: dropped_messages, shared_hint } = tokio::task::spawn_blocking(move || {
        let r = make_prompt(&l);
        drop(permit);
        r
    })
    .await
    .map_err(|_| ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "the prompt could not be prepared"))??;
    let constraint = match grammar {
        None => None,
        Some((g, param)) => {
            Some(structured::compile(loaded.clone(), g, param, state.limits.grammar_compile_timeout).await?)
        }
    };
    let cfg = &loaded.model.cfg;
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty", None));
    }
    if let Some(&bad) = prompt.iter().find(|&&id| id as usize >= cfg.vocab) {
        return Err(ApiError::invalid(
            format!("token id {bad} is outside the vocabulary ({})", cfg.vocab),
            Some("prompt"),
        ));
    }
    let ctx = num_ctx.map_or(cfg.max_positions, |n| n.min(cfg.max_positions));
    let Some(room) = context_room(prompt.len(), ctx) else {
        return Err(ApiError::invalid(
            format!("the prompt has {} tokens; the context is {ctx} tokens", prompt.len()),
            Some("messages"),
        )
        .with_code("context_length_exceeded"));
    };
    let max_new_tokens = requested.map_or(DEFAULT_MAX_TOKENS, |r| r.min(usize::MAX as u64) as usize).min(room);
    let speculation = Speculation::for_request(state.engines.speculation(&slot, &loaded), p.turn.speculate.as_ref())
        .map_err(|e| ApiError::invalid(e, Some("speculate")))?;
    let admission = admit(state, &slot)?;
    let stop_ids = if turn.ignore_eos { Vec::new() } else { loaded.stop_ids.clone() };
    let echo = if extras.echo {
        let (l, ids) = (loaded.clone(), prompt.clone());
        let text = tokio::task::spawn_blocking(move || match &l.tokenizer {
            Some(t) => t.decode(&ids, false).map_err(|e| ApiError::invalid(e.to_string(), Some("prompt"))),
            None => Ok(String::new()),
        })
        .await
        .map_err(|_| ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "the prompt could not be decoded"))??;
        Some((prompt.clone(), text))
    } else {
        None
    };
    let job = Job {
        prompt,
        shared_hint,
        opts: GenerateOptions { max_new_tokens, sampler, stop_ids, logprobs: extras.logprobs },
        stop: turn.stop,
        continue_prompt: extras.continue_prompt,
        prompt_logprobs: extras.logprobs.filter(|_| extras.echo),
        constraint,
        speculation,
    };
    let rx = super::batch::spawn(job, admission, state.stats.clone(), state.shutdown.clone());
    Ok(Prepared {
        id: new_id(prefix),
        model,
        created: now_secs(),
        stream: p.stream.unwrap_or(false),
        include_usage: p.stream_options.unwrap_or_default().include_usage,
        rx,
        loaded,
        logprobs: extras.logprobs.is_some(),
        echo,
        dropped_messages,
        tools: extras.tools.is_some(),
        grammar_param,
    })
}

/// OpenAI's usage object; `cached`: prompt tokens whose cache an earlier request left.
fn usage_json(prompt_tokens: usize, cached: usize, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

/// Which endpoint's object shapes to produce.
#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Text,
}

/// Renders log-probability entries in the endpoint's shape; counts text offsets
/// (characters of the returned text) across the chunks of a stream.
struct Logprobs {
    kind: Kind,
    offset: usize,
}

impl Logprobs {
    /// `entries`: (id, its logprob; None for the first prompt token under echo).
    fn render(&mut self, p: &Prepared, entries: &[(u32, Option<&TokenLogprob>)]) -> Value {
        let Some(tok) = p.loaded.tokenizer.as_ref().filter(|_| p.logprobs) else { return Value::Null };
        match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = entries.iter().filter_map(|(_, t)| t.map(|t| chat_entry(tok, t))).collect();
                json!({"content": content, "refusal": null})
            }
            Kind::Text => {
                let v = completion_logprobs(tok, entries, self.offset);
                if let (Some(last), Some(text)) =
                    (v["text_offset"].as_array().and_then(|a| a.last()), v["tokens"].as_array().and_then(|a| a.last()))
                {
                    self.offset = last.as_u64().unwrap_or(0) as usize + text.as_str().map_or(0, |t| t.chars().count());
                }
                v
            }
        }
    }

    fn generated(&mut self, p: &Prepared, lps: &[TokenLogprob]) -> Value {
        let entries: Vec<(u32, Option<&TokenLogprob>)> = lps.iter().map(|t| (t.id, Some(t))).collect();
        self.render(p, &entries)
    }

    /// The prompt under echo: its first token has no logprob.
    fn prompt(&mut self, p: &Prepared, ids: &[u32], lps: &[TokenLogprob]) -> Value {
        let entries: Vec<(u32, Option<&TokenLogprob>)> =
            ids.iter().enumerate().map(|(i, &id)| (id, i.checked_sub(1).and_then(|j| lps.get(j)))).collect();
        self.render(p, &entries)
    }
}

impl Kind {
    fn chunk(self, p: &Prepared, text: Option<&str>, role: bool, finish: Option<&str>, logprobs: Value) -> Value {
        match self {
            Kind::Chat => {
                let mut delta = json!({});
                if role {
                    delta["role"] = json!("assistant");
                }
                if let Some(t) = text {
                    delta["content"] = json!(t);
                }
                let mut v = json!({"id": p.id, "object": "chat.completion.chunk", "created": p.created, "model": p.model,
                       "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]});
                if role {
                    add_dropped(&mut v, p);
                }
                v
            }
            Kind::Text => json!({"id": p.id, "object": "text_completion", "created": p.created, "model": p.model,
                                 "choices": [{"index": 0, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish}]}),
        }
    }

    fn complete(self, p: &Prepared, text: String, finish: &str, usage: Value, logprobs: Value) -> Value {
        match self {
            Kind::Chat => {
                let mut v = json!({"id": p.id, "object": "chat.completion", "created": p.created, "model": p.model,
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": finish}],
                                 "usage": usage});
                add_dropped(&mut v, p);
                v
            }
            Kind::Text => json!({"id": p.id, "object": "text_completion", "created": p.created, "model": p.model,
                                 "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
                                 "usage": usage}),
        }
    }
}

/// colibri's extension: `dropped_messages` when the oldest turns were left out to fit the
/// context (absent when nothing was).
fn add_dropped(v: &mut Value, p: &Prepared) {
    if p.dropped_messages > 0 {
        v["dropped_messages"] = json!(p.dropped_messages);
    }
}

/// Function calling: the output as OpenAI's `tool_calls` when it is a complete call.
fn as_tool_calls(p: &Prepared, text: &str, finish: &str) -> Option<Value> {
    if !p.tools || finish != "stop" {
        return None;
    }
    structured::tool_calls(text, &p.id)
}

async fn collect(kind: Kind, mut p: Prepared) -> Response {
    let (mut text, prompt_ids) = match p.echo.take() {
        Some((ids, t)) => (t, ids),
        None => (String::new(), Vec::new()),
    };
    let mut prompt_lps = Vec::new();
    let mut lps = Vec::new();
    while let Some(ev) = p.rx.recv().await {
        match ev {
            Event::Prompt(l) => prompt_lps = l,
            Event::Text(t, l) => {
                text.push_str(&t);
                lps.extend(l);
            }
            Event::Done { finish_reason, prompt_tokens, cached_tokens, completion_tokens } => {
                let usage = usage_json(prompt_tokens, cached_tokens, completion_tokens);
                let mut entries: Vec<(u32, Option<&TokenLogprob>)> = Vec::new();
                if !prompt_ids.is_empty() {
                    entries.extend(
                        prompt_ids
                            .iter()
                            .enumerate()
                            .map(|(i, &id)| (id, i.checked_sub(1).and_then(|j| prompt_lps.get(j)))),
                    );
                }
                entries.extend(lps.iter().map(|t| (t.id, Some(t))));
                let v = Logprobs { kind, offset: 0 }.render(&p, &entries);
                let calls = as_tool_calls(&p, &text, finish_reason);
                let mut body = kind.complete(&p, text, finish_reason, usage, v);
                if let Some(calls) = calls {
                    body["choices"][0]["message"] = json!({"role": "assistant", "content": null, "tool_calls": calls});
                    body["choices"][0]["finish_reason"] = json!("tool_calls");
                }
                return axum::Json(body).into_response();
            }
            Event::Error(msg) => return ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, msg).into_response(),
            Event::Grammar(msg) => return structured::failed_while_generating(msg, p.grammar_param).into_response(),
        }
    }
    ApiError::server(StatusCode::SERVICE_UNAVAILABLE, "the generation was cancelled").into_response()
}

async fn respond(kind: Kind, p: Prepared) -> Response {
    if p.stream {
        stream_response(kind, p)
    } else {
        collect(kind, p).await
    }
}

pub async fn chat_completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let prepared = match parse(body) {
        Ok(req) => prepare_chat(&state, req).await,
        Err(e) => Err(e),
    };
    match prepared {
        Ok(p) => respond(Kind::Chat, p).await,
        Err(e) => e.into_response(),
    }
}

/// A chat request in OpenAI's shape (the Ollama endpoints translate theirs into it),
/// checked and queued: the chat endpoint's whole mapping from request to generation.
pub(super) async fn prepare_chat_json(state: &Arc<AppState>, req: Value) -> Result<Prepared, ApiError> {
    prepare_chat(state, serde_json::from_value(req).map_err(ApiError::json_body)?).await
}

async fn prepare_chat(state: &Arc<AppState>, req: ChatRequest) -> Result<Prepared, ApiError> {
    let tools = structured::tools(req.tools.as_ref(), req.tool_choice.as_ref())?;
    let messages = match req.messages {
        Some(m) if !m.is_empty() => m,
        _ => return Err(ApiError::invalid("messages must be a non-empty list", Some("messages"))),
    };
    let mut turns = Vec::with_capacity(messages.len());
    for m in messages {
        let content = match m.content {
            None => m.tool_calls.as_ref().map(structured::calls_as_text).unwrap_or_default(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                if let Some(p) = parts.iter().find(|p| p.kind != "text") {
                    let why = format!("content parts of type {:?} are not supported: only text (colibri runs the language model alone, image inputs are refused, also for image-text models such as Qwen3.5)", p.kind);
                    return Err(ApiError::invalid(why, Some("messages")));
                }
                parts.into_iter().filter_map(|p| p.text).collect::<Vec<_>>().join("")
            }
        };
        turns.push(ChatMessage { role: m.role, content });
    }
    let logprobs = req.params.turn.chat_logprobs().map_err(ApiError::from)?;
    let truncate = truncation(req.truncation.as_ref()).map_err(ApiError::from)?;
    // (A bad value is refused by the turn's check.)
    let max_tokens = req.params.turn.max_tokens().ok().flatten().map(|t| t.min(usize::MAX as u64) as usize);
    let num_ctx = req.params.num_ctx;
    let for_prompt = tools.clone();
    let extras = Extras { logprobs, tools, ..Extras::default() };
    prepare(state, req.params, "chatcmpl", extras, move |l| {
        let tok =
            l.tokenizer.as_ref().ok_or_else(|| ApiError::invalid("this model has no tokenizer", Some("model")))?;
        if !tok.has_chat_template() {
            return Err(ApiError::invalid("this model has no chat template; use /v1/completions", Some("model")));
        }
        let invalid = |e: colibri_engine::Error| ApiError::invalid(e.to_string(), Some("messages"));
        // Tools are rendered into the prompt by the structured-output code.
        let render = |kept: &[ChatMessage]| match &for_prompt {
            Some(t) => tok.encode(&structured::chat_prompt(tok, kept, t)?, false),
            None => tok.encode_chat(kept, true),
        };
        let (ids, dropped) = if !truncate {
            (render(&turns).map_err(invalid)?, 0)
        } else {
            // The one trimming rule of every surface (colibri_engine::tokenizer::fit_chat).
            let ctx = num_ctx.map_or(l.model.cfg.max_positions, |n| n.min(l.model.cfg.max_positions));
            match fit_rendered(&turns, ctx, answer_reserve(max_tokens, ctx), &render) {
                Ok(f) => (f.ids, f.dropped),
                Err(e @ colibri_engine::Error::ContextOverflow { .. }) => {
                    return Err(invalid(e).with_code("context_length_exceeded"))
                }
                Err(e) => return Err(invalid(e)),
            }
        };
        // A model whose state goes back only to where a pass ended (Gated DeltaNet,
        // DeepSeek-V4) ends one after the system messages, which other conversations (a
        // widget's visitors) start with too. Without tools (rendered into the system part).
        let shared_hint = match l.model.cfg.rewinds_to_snapshots() && for_prompt.is_none() {
            true => system_prefix_len(&turns, &ids, &|m| tok.encode_chat(m, false)),
            false => 0,
        };
        Ok(Built { ids, dropped, shared_hint })
    })
    .await
}

/// A completions prompt: text, one text in a list, token ids, or one list of ids.
fn prompt_ids(v: Option<Value>, l: &crate::load::Loaded) -> Result<Vec<u32>, ApiError> {
    let bad = || {
        ApiError::invalid("prompt must be a string, a list of token ids, or a list with one of those", Some("prompt"))
    };
    let v = match v {
        Some(Value::Array(mut a)) if a.len() == 1 && !a[0].is_number() => a.pop().unwrap_or(Value::Null),
        Some(v) => v,
        None => return Err(ApiError::invalid("you must provide a prompt", Some("prompt"))),
    };
    match v {
        Value::String(s) => {
            let tok = l
                .tokenizer
                .as_ref()
                .ok_or_else(|| ApiError::invalid("this model has no tokenizer; send token ids", Some("prompt")))?;
            tok.encode(&s, true).map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))
        }
        Value::Array(a) => {
            a.iter().map(|x| x.as_u64().filter(|&i| i <= u32::MAX as u64).map(|i| i as u32).ok_or_else(bad)).collect()
        }
        _ => Err(bad()),
    }
}

pub async fn completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let prepared = match parse(body) {
        Ok(req) => prepare_completion(&state, req).await,
        Err(e) => Err(e),
    };
    match prepared {
        Ok(p) => respond(Kind::Text, p).await,
        Err(e) => e.into_response(),
    }
}

/// A completions request in OpenAI's shape, checked and queued (as [`prepare_chat_json`]).
pub(super) async fn prepare_completion_json(state: &Arc<AppState>, req: Value) -> Result<Prepared, ApiError> {
    prepare_completion(state, serde_json::from_value(req).map_err(ApiError::json_body)?).await
}

async fn prepare_completion(state: &Arc<AppState>, req: CompletionRequest) -> Result<Prepared, ApiError> {
    // (suffix and the other refused fields: the turn's check.)
    let logprobs = req.params.turn.completion_logprobs().map_err(ApiError::from)?;
    let extras = Extras { continue_prompt: true, logprobs, echo: req.echo == Some(true), tools: None };
    let prompt = req.prompt;
    prepare(state, req.params, "cmpl", extras, move |l| {
        Ok(Built { ids: prompt_ids(prompt, l)?, dropped: 0, shared_hint: 0 })
    })
    .await
}

/// The models; one that cannot be loaded carries `"colibri": {"error": ...}`.
pub async fn list_models(State(state): State<Arc<AppState>>) -> Response {
    let s = state.clone();
    let data = tokio::task::spawn_blocking(move || {
        s.registry
            .list()
            .into_iter()
            .map(|m| {
                let mut v = json!({"id": m.id, "object": "model", "created": 0, "owned_by": "colibri"});
                if let Err(e) = super::models::check(&m.root) {
                    v["colibri"] = json!({"supported": false, "error": format!("{e:#}")});
                }
                v
            })
            .collect::<Vec<Value>>()
    })
    .await;
    match data {
        Ok(data) => axum::Json(json!({"object": "list", "data": data})).into_response(),
        Err(_) => ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response(),
    }
}
