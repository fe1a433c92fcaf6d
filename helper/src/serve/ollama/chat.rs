//! `POST /api/chat` and `POST /api/generate`: the request translated into the OpenAI chat
//! (or, for `generate` with `raw`, completions) request it means, run by the OpenAI
//! endpoints' mapping, and answered as Ollama answers: newline-delimited JSON objects
//! (`application/x-ndjson`), one per piece of text with `"done": false`, then one with
//! `"done": true`, `done_reason` and the counts and durations (nanoseconds); with
//! `"stream": false`, that last object alone with the whole text. An error once the stream
//! has begun is a last line `{"error": "..."}`.
//!
//! An empty `messages` (chat) or `prompt` (generate) loads the model and answers
//! `"done_reason": "load"`, as Ollama does.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::super::generation::Event;
use super::super::openai::stream::async_stream_of;
use super::super::openai::{self, Prepared};
use super::super::{structured, AppState};
use super::{line, model_id, model_name, ndjson, options, parse_object, rfc3339, Error};

/// Which endpoint's objects to write.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Generate,
}

/// Request fields that would change the answer and that this server cannot honour.
fn refuse_fields(req: &Value, fields: &[(&str, &str)]) -> Result<(), Error> {
    for (name, why) in fields {
        let set = match req.get(*name) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        if set {
            return Err(Error::bad(format!("{name} is not supported: {why}")));
        }
    }
    Ok(())
}

/// The OpenAI fields every request shares: model, options, format, and what is refused.
fn common(req: &Value, name: &str) -> Result<Map<String, Value>, Error> {
    refuse_fields(
        req,
        &[
            ("think", "colibri does not separate a model's thinking from its answer"),
            ("images", "colibri runs the language model alone"),
        ],
    )?;
    // Models stay loaded until the helper stops; unloading on request is not supported.
    let unload = match req.get("keep_alive") {
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::String(s)) => matches!(s.trim(), "0" | "0s" | "0m" | "0h"),
        _ => false,
    };
    if unload {
        return Err(Error::bad("keep_alive 0 is not supported: a model stays loaded until the helper stops"));
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(model_id(name)));
    options::apply(req.get("options"), &mut out)?;
    match req.get("format") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) if s == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(schema @ Value::Object(_)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema, "strict": true}}),
            );
        }
        Some(_) => return Err(Error::bad("format must be \"json\" or a JSON schema")),
    }
    Ok(out)
}

/// An Ollama message as OpenAI's: tool calls carry their arguments as a JSON string.
fn message(m: &Value) -> Result<Value, Error> {
    let role = m.get("role").and_then(Value::as_str).ok_or_else(|| Error::bad("every message needs a role"))?;
    refuse_fields(m, &[("images", "colibri runs the language model alone")])?;
    let content = match m.get("content") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s,
        Some(_) => return Err(Error::bad("a message's content must be a string")),
    };
    let mut out = json!({"role": role, "content": content});
    if let Some(Value::Array(calls)) = m.get("tool_calls") {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let f = &c["function"];
                let args = match &f["arguments"] {
                    Value::String(s) => s.clone(),
                    Value::Null => "{}".into(),
                    a => a.to_string(),
                };
                json!({"id": format!("call_{i}"), "type": "function", "function": {"name": f["name"], "arguments": args}})
            })
            .collect();
        if !calls.is_empty() {
            out["tool_calls"] = json!(calls);
            if content.is_empty() {
                out["content"] = Value::Null;
            }
        }
    }
    Ok(out)
}

/// The OpenAI tool calls of an answer in Ollama's shape (arguments as an object).
fn ollama_calls(calls: &Value) -> Value {
    let calls = calls.as_array().map(Vec::as_slice).unwrap_or_default();
    let out: Vec<Value> = calls
        .iter()
        .map(|c| {
            let f = &c["function"];
            let args = f["arguments"].as_str().and_then(|s| serde_json::from_str(s).ok()).unwrap_or(json!({}));
            json!({"function": {"name": f["name"], "arguments": args}})
        })
        .collect();
    json!(out)
}

pub async fn chat(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let start = Instant::now();
    let run = async {
        let req = parse_object(&body)?;
        let name = model_name(&req)?;
        let mut out = common(&req, &name)?;
        let messages = match req.get("messages") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(m)) => m.iter().map(message).collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err(Error::bad("messages must be a list")),
        };
        let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(true);
        if messages.is_empty() {
            openai::load_model(&state, Some(model_id(&name).to_string())).await.map_err(|e| Error::named(e, &name))?;
            return Ok(loaded(Kind::Chat, &name, stream));
        }
        out.insert("messages".into(), json!(messages));
        if let Some(tools) = req.get("tools").filter(|t| t.as_array().is_some_and(|a| !a.is_empty())) {
            out.insert("tools".into(), tools.clone());
        }
        let p = openai::prepare_chat_json(&state, Value::Object(out)).await.map_err(|e| Error::named(e, &name))?;
        Ok(answer(Kind::Chat, name, stream, p, start).await)
    };
    run.await.unwrap_or_else(|e: Error| e.into_response())
}

pub async fn generate(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let start = Instant::now();
    let run = async {
        let req = parse_object(&body)?;
        let name = model_name(&req)?;
        refuse_fields(
            &req,
            &[
                ("suffix", "fill-in-the-middle is not supported"),
                ("template", "the model's own chat template is used"),
                ("context", "use /api/chat to continue a conversation"),
            ],
        )?;
        let mut out = common(&req, &name)?;
        let prompt = match req.get("prompt") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s.as_str(),
            Some(_) => return Err(Error::bad("prompt must be a string")),
        };
        let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(true);
        if prompt.is_empty() {
            openai::load_model(&state, Some(model_id(&name).to_string())).await.map_err(|e| Error::named(e, &name))?;
            return Ok(loaded(Kind::Generate, &name, stream));
        }
        let p = if req.get("raw").and_then(Value::as_bool) == Some(true) {
            out.insert("prompt".into(), json!(prompt));
            openai::prepare_completion_json(&state, Value::Object(out)).await.map_err(|e| Error::named(e, &name))?
        } else {
            let mut messages = Vec::new();
            match req.get("system") {
                Some(Value::String(s)) if !s.is_empty() => messages.push(json!({"role": "system", "content": s})),
                None | Some(Value::Null) | Some(Value::String(_)) => {}
                Some(_) => return Err(Error::bad("system must be a string")),
            }
            messages.push(json!({"role": "user", "content": prompt}));
            out.insert("messages".into(), json!(messages));
            openai::prepare_chat_json(&state, Value::Object(out)).await.map_err(|e| Error::named(e, &name))?
        };
        Ok(answer(Kind::Generate, name, stream, p, start).await)
    };
    run.await.unwrap_or_else(|e: Error| e.into_response())
}

/// The first fields of every object: model, created_at, and the text piece.
fn object(kind: Kind, model: &str, text: &str) -> Value {
    let mut v = json!({"model": model, "created_at": rfc3339(SystemTime::now())});
    match kind {
        Kind::Chat => v["message"] = json!({"role": "assistant", "content": text}),
        Kind::Generate => v["response"] = json!(text),
    }
    v
}

/// The answer to an empty request: the model is loaded.
fn loaded(kind: Kind, model: &str, stream: bool) -> Response {
    let mut v = object(kind, model, "");
    v["done_reason"] = json!("load");
    v["done"] = json!(true);
    if stream {
        ndjson(async_stream_of(move |out| async move { out.send(line(&v)).await }))
    } else {
        axum::Json(v).into_response()
    }
}

/// Times of one answer, for the last object's durations.
struct Clock {
    start: Instant,
    /// When the generation was queued (the model loaded, the prompt prepared).
    queued: Instant,
    /// When the first piece of text came (the prompt evaluated).
    first: Option<Instant>,
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

impl Clock {
    /// The last object's fields after the text (Ollama's order).
    fn done(&self, v: &mut Value, finish_reason: &str, prompt_tokens: usize, completion_tokens: usize) {
        let now = Instant::now();
        let first = self.first.unwrap_or(now);
        v["done_reason"] = json!(finish_reason);
        v["done"] = json!(true);
        v["total_duration"] = json!(nanos(now - self.start));
        v["load_duration"] = json!(nanos(self.queued - self.start));
        v["prompt_eval_count"] = json!(prompt_tokens);
        v["prompt_eval_duration"] = json!(nanos(first - self.queued));
        v["eval_count"] = json!(completion_tokens);
        v["eval_duration"] = json!(nanos(now - first));
    }
}

/// The held text of an answer with tools, as Ollama's `tool_calls` when it is a call.
fn calls_of(p: &Prepared, text: &str, finish: &str) -> Option<Value> {
    if !p.tools || finish != "stop" {
        return None;
    }
    structured::tool_calls(text, &p.id).map(|c| ollama_calls(&c))
}

/// Streams (or collects) the generation's events as Ollama's objects.
async fn answer(kind: Kind, model: String, stream: bool, mut p: Prepared, start: Instant) -> Response {
    let mut clock = Clock { start, queued: Instant::now(), first: None };
    if !stream {
        return collect(kind, model, p, clock).await;
    }
    let mut rx = std::mem::replace(&mut p.rx, tokio::sync::mpsc::channel(1).1);
    ndjson(async_stream_of(move |out| async move {
        // With tools the text is held until the end: it may turn out to be a call.
        let mut held = p.tools.then(String::new);
        while let Some(ev) = out.next(&mut rx).await {
            match ev {
                Event::Prompt(_) => {}
                Event::Text(t, _) => {
                    clock.first.get_or_insert_with(Instant::now);
                    match held.as_mut() {
                        Some(h) => h.push_str(&t),
                        None if t.is_empty() => {}
                        None => {
                            let mut v = object(kind, &model, &t);
                            v["done"] = json!(false);
                            out.send(line(&v)).await?
                        }
                    }
                }
                Event::Done { finish_reason, prompt_tokens, completion_tokens, .. } => {
                    let mut last = object(kind, &model, "");
                    if let Some(text) = held.take() {
                        match calls_of(&p, &text, finish_reason) {
                            Some(calls) => last["message"]["tool_calls"] = calls,
                            None => last = object(kind, &model, &text),
                        }
                    }
                    clock.done(&mut last, finish_reason, prompt_tokens, completion_tokens);
                    return out.send(line(&last)).await;
                }
                Event::Error(msg) | Event::Grammar(msg) => return out.send(line(&json!({"error": msg}))).await,
            }
        }
        if out.gone() {
            return Some(());
        }
        out.send(line(&json!({"error": "the generation stopped before it finished"}))).await
    }))
}

/// `"stream": false`: the last object alone, with the whole text.
async fn collect(kind: Kind, model: String, mut p: Prepared, mut clock: Clock) -> Response {
    let mut text = String::new();
    while let Some(ev) = p.rx.recv().await {
        match ev {
            Event::Prompt(_) => {}
            Event::Text(t, _) => {
                clock.first.get_or_insert_with(Instant::now);
                text.push_str(&t);
            }
            Event::Done { finish_reason, prompt_tokens, completion_tokens, .. } => {
                let calls = calls_of(&p, &text, finish_reason);
                let mut v = object(kind, &model, if calls.is_some() { "" } else { &text });
                if let Some(calls) = calls {
                    v["message"]["tool_calls"] = calls;
                }
                clock.done(&mut v, finish_reason, prompt_tokens, completion_tokens);
                return axum::Json(v).into_response();
            }
            Event::Error(msg) => {
                return Error { status: StatusCode::INTERNAL_SERVER_ERROR, message: msg }.into_response()
            }
            Event::Grammar(msg) => return Error::bad(msg).into_response(),
        }
    }
    Error { status: StatusCode::SERVICE_UNAVAILABLE, message: "the generation was cancelled".into() }.into_response()
}
