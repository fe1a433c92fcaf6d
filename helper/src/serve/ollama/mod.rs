//! Ollama-compatible endpoints beside the OpenAI ones, for the tools that speak Ollama's
//! API (Open WebUI, Continue, editors, the `ollama` client libraries): `GET /api/tags`,
//! `POST /api/show`, `GET /api/ps`, `GET /api/version`, `POST /api/chat` and
//! `POST /api/generate` (newline-delimited JSON as Ollama streams it, or one object with
//! `"stream": false`), `POST /api/pull` (progress lines, then `{"status": "success"}`).
//!
//! A chat or generate request is translated into the OpenAI request it means and run by
//! the OpenAI endpoints' own mapping to a generation ([`super::openai::prepare_chat_json`],
//! [`super::openai::prepare_completion_json`]): the same checks, sampler, prompt fitting,
//! queue and caches. Ollama's `options` map onto that sampler ([`options`]); an option that
//! would change the answer and cannot be honoured is refused with a 400 naming it. Errors
//! have Ollama's shape, `{"error": "..."}`. docs/api.md documents each endpoint.

mod chat;
mod models;
mod options;
mod pull;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use super::api_error::ApiError;
use super::AppState;

pub use pull::Puller;

/// Ollama's routes (merged into [`super::app`]).
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/tags", get(models::tags))
        .route("/api/show", post(models::show))
        .route("/api/ps", get(models::ps))
        .route("/api/version", get(version))
        .route("/api/chat", post(chat::chat))
        .route("/api/generate", post(chat::generate))
        .route("/api/pull", post(pull::pull))
}

/// The routes that generate (or pull): the OpenAI endpoints' body limit and time limit.
pub fn generates(path: &str) -> bool {
    matches!(path, "/api/chat" | "/api/generate" | "/api/pull")
}

async fn version() -> Response {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// An error in Ollama's shape: `{"error": "..."}` with its status.
pub(super) struct Error {
    status: StatusCode,
    message: String,
}

impl Error {
    fn bad(message: impl Into<String>) -> Self {
        Error { status: StatusCode::BAD_REQUEST, message: message.into() }
    }

    fn not_found(name: &str) -> Self {
        Error { status: StatusCode::NOT_FOUND, message: format!("model \"{name}\" not found, try pulling it first") }
    }
}

/// OpenAI's parameter names, as Ollama's request calls them.
const RENAMED: &[(&str, &str)] =
    &[("max_tokens", "num_predict"), ("repetition_penalty", "repeat_penalty"), ("response_format", "format")];

impl Error {
    /// An engine or OpenAI-layer error for a request that named the model `name`: a
    /// `model_not_found` becomes Ollama's 404 for that name (the name the client sent, not
    /// one read back out of the message).
    fn named(e: ApiError, name: &str) -> Self {
        match e.code {
            Some("model_not_found") => Error::not_found(name),
            _ => Error::from(e),
        }
    }
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Self {
        let mut message = e.message;
        if let Some((from, to)) = e.param.and_then(|p| RENAMED.iter().find(|r| r.0 == p)) {
            message = match message.contains(from) {
                true => message.replace(from, to),
                false => format!("{to}: {message}"),
            };
        }
        Error { status: e.status, message }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        (self.status, axum::Json(json!({"error": self.message}))).into_response()
    }
}

/// The installed id a name means: Ollama's names carry a tag (`demo:latest`) and pulled
/// models may be named as Ollama names Hugging Face repositories (`hf.co/OWNER/NAME:TAG`);
/// a model id has no `:` (crate::paths::is_valid_model_id).
pub(super) fn model_id(name: &str) -> &str {
    let name = name.trim();
    let name = name.strip_prefix("hf.co/").or_else(|| name.strip_prefix("huggingface.co/")).unwrap_or(name);
    name.split_once(':').map_or(name, |(id, _)| id)
}

/// The request's model name (`model`, or the older `name`), or a 400.
pub(super) fn model_name(req: &Value) -> Result<String, Error> {
    match req.get("model").filter(|v| !v.is_null()).or_else(|| req.get("name")) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
        Some(Value::String(_)) | None | Some(Value::Null) => Err(Error::bad("model is required")),
        Some(_) => Err(Error::bad("model must be a string")),
    }
}

/// The request body as a JSON object, or a 400.
pub(super) fn parse_object(body: &[u8]) -> Result<Value, Error> {
    match ApiError::parse_json::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(Error::bad("the body must be a JSON object")),
        Err(e) => Err(Error::from(e)),
    }
}

/// One line of newline-delimited JSON.
pub(super) fn line(v: &Value) -> axum::body::Bytes {
    axum::body::Bytes::from(format!("{v}\n"))
}

/// A streamed answer of newline-delimited JSON lines, as Ollama streams.
pub(super) fn ndjson(body: axum::body::Body) -> Response {
    Response::builder()
        .header(axum::http::header::CONTENT_TYPE, "application/x-ndjson")
        .header(axum::http::header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// RFC 3339 in UTC with nanoseconds, as Ollama writes `created_at` and `modified_at`.
pub(super) fn rfc3339(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian calendar, in eras of
    // 400 years that start on March 1st).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_nanos()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn names_and_times() {
        assert_eq!(model_id("demo"), "demo");
        assert_eq!(model_id("demo:latest"), "demo");
        assert_eq!(model_id("hf.co/acme/tiny-moe:Q4_K_M"), "acme/tiny-moe");
        assert_eq!(model_id("acme/tiny-moe"), "acme/tiny-moe");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        // 2024-02-29T12:34:56.5Z (a leap day) and 2000-03-01.
        let t = UNIX_EPOCH + Duration::new(1_709_210_096, 500_000_000);
        assert_eq!(rfc3339(t), "2024-02-29T12:34:56.500000000Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_868_800)), "2000-03-01T00:00:00.000000000Z");
    }

    #[test]
    fn openai_parameter_names_become_ollama_names() {
        let e = Error::from(ApiError::invalid("max_tokens must be at least 1", Some("max_tokens")));
        assert_eq!(e.message, "num_predict must be at least 1");
        let e = Error::from(ApiError::invalid("top_p must be in (0, 1]", Some("top_p")));
        assert_eq!(e.message, "top_p must be in (0, 1]");
    }
}
