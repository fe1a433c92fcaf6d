//! `POST /v1/choose`: option scoring over HTTP (colibri's extension next to the OpenAI
//! endpoints, with their error shape). Request: `{model, prompt | messages, options,
//! raw}`; response: the engine's [`colibri_engine::generate::choose::Choice`] as JSON
//! plus `object`, `model`, `usage`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use colibri_engine::generate::choose::{self, MAX_OPTIONS};
use colibri_engine::generate::{feed_chunked, PREFILL_CHUNK};
use colibri_engine::tokenizer::ChatMessage;
use serde::Deserialize;
use serde_json::json;

use super::api_error::ApiError;
use super::generation::run_exclusive;
use super::openai::{admit, load_model};
use super::AppState;

#[derive(Deserialize)]
struct ChooseRequest {
    model: Option<String>,
    /// One user message (through the chat template unless `raw`).
    prompt: Option<String>,
    /// A conversation, through the chat template.
    messages: Option<Vec<ChatMessage>>,
    options: Option<Vec<String>>,
    #[serde(default)]
    raw: bool,
}

pub async fn choose(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match run(&state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(state: &Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body.map_err(|e| ApiError { status: e.status(), ..ApiError::invalid(e.body_text(), None) })?;
    let req: ChooseRequest = ApiError::parse_json(&body)?;
    let options = match req.options {
        Some(o) if !o.is_empty() && o.len() <= MAX_OPTIONS && o.iter().all(|x| !x.is_empty()) => o,
        _ => {
            return Err(ApiError::invalid(
                format!("options must be a list of 1 to {MAX_OPTIONS} non-empty strings"),
                Some("options"),
            ))
        }
    };
    let prompt = match (req.prompt, req.messages) {
        (Some(p), None) => Ok(p),
        (None, Some(m)) if !m.is_empty() && !req.raw => Err(m),
        _ => {
            return Err(ApiError::invalid(
                "give either prompt (a string) or messages (a non-empty list; not with raw)",
                Some("prompt"),
            ))
        }
    };
    let (model, slot, loaded) = load_model(state, req.model).await?;
    let admission = admit(state, &slot)?;
    let raw = req.raw;
    let opts = options.clone();
    // A client that goes away drops this future (hyper notices the closed connection):
    // the scoring stops before its next forward pass and frees the model.
    let gone = Arc::new(AtomicBool::new(false));
    let _on_drop = SetOnDrop(gone.clone());
    let result = run_exclusive(admission, move || {
        let tok =
            loaded.tokenizer.as_ref().ok_or_else(|| ApiError::invalid("this model has no tokenizer", Some("model")))?;
        let invalid = |e: colibri_engine::Error| ApiError::invalid(e.to_string(), Some("prompt"));
        let ids = match &prompt {
            Ok(p) => choose::encode_prompt(tok, p, raw).map_err(invalid)?,
            Err(m) => tok.encode_chat(m, true).map_err(invalid)?,
        };
        let option_ids = choose::encode_options(tok, &opts).map_err(invalid)?;
        let model = &loaded.model;
        let mut session = model.new_session();
        // A long prompt goes in chunks, the flag checked before each (the same bits as one
        // pass): a client that leaves during its prefill frees the model within one chunk.
        let mut forward = |keep: usize, ids: &[u32], which| {
            session.truncate(keep);
            let mut pass = |part: &[u32], which| model.forward(&mut session, part, which);
            feed_chunked(&mut pass, ids, which, PREFILL_CHUNK, &mut || !gone.load(Ordering::Relaxed))
        };
        let c = choose::choose_with(&mut forward, ids, option_ids, model.cfg.max_positions).map_err(|e| match e {
            colibri_engine::Error::ContextOverflow { .. } => {
                ApiError::invalid(e.to_string(), Some("prompt")).with_code("context_length_exceeded")
            }
            e => ApiError::invalid(e.to_string(), Some("prompt")),
        });
        if let Err(e) = loaded.model.experts.end_turn() {
            eprintln!("coli: warning: re-pinning experts: {e}");
        }
        crate::load::save_usage(&loaded);
        c
    })
    .await
    .ok_or_else(|| ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "the engine failed"))??;
    let mut v = result.to_json(&options);
    v["object"] = json!("choice");
    v["model"] = json!(model);
    v["usage"] = json!({"prompt_tokens": result.prompt_tokens, "tokens_read": result.tokens_read});
    Ok(axum::Json(v).into_response())
}

/// Sets its flag when dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
