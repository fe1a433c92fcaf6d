//! The OpenAI-shaped error every `/v1` handler answers with:
//! `{"error": {"message", "type", "param", "code"}}`, and the 404 of unknown `/v1` routes.
//! Below the handlers (openai, structured, sampling, choose), so none of them imports
//! another for it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// An OpenAI-style error response.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Seconds a client should wait before trying again (a 503's `Retry-After`).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// A request body parsed as `T`, or a 400. serde_json refuses nesting past 128 levels;
    /// a body that nests that deep (counted by the engine's `json_nesting`, not read from the
    /// parser's message) is refused as the limit it is (a schema that deep gets the same
    /// answer in the browser engine).
    pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Self> {
        use colibri_engine::generate::grammar::limits::{json_nesting, MAX_JSON_NESTING};
        serde_json::from_slice(body).map_err(|e| match json_nesting(body) >= MAX_JSON_NESTING {
            true => ApiError::invalid(
                format!(
                    "the JSON body nests deeper than {MAX_JSON_NESTING} levels (a response_format or tool schema that deep is refused): {e}"
                ),
                None,
            ),
            false => ApiError::json_body(e),
        })
    }

    /// A request that is not the JSON it should be (a parsed value of the wrong shape; a
    /// body's bytes go through [`ApiError::parse_json`]).
    pub fn json_body(e: serde_json::Error) -> Self {
        ApiError::invalid(format!("could not parse the JSON body: {e}"), None)
    }

    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
            retry_after: None,
        }
    }

    /// The engine's error as a 400: its stable code, and the parameter a
    /// [`colibri_engine::Error::Param`] names (else `param`).
    pub fn engine(e: colibri_engine::Error, param: Option<&'static str>) -> Self {
        let code = e.code();
        let param = e.param_name().or(param);
        ApiError::invalid(e.to_string(), param).with_code(code)
    }

    pub(super) fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub(super) fn server(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind: "server_error", param: None, code: None, retry_after: None }
    }

    /// Asks the client to try again after `seconds` (`Retry-After`).
    pub(super) fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    pub(super) fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl From<colibri_engine::Error> for ApiError {
    fn from(e: colibri_engine::Error) -> Self {
        ApiError::engine(e, None)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(s));
        }
        r
    }
}

/// Any unknown `/v1/...` route.
pub async fn not_found() -> ApiError {
    ApiError { status: StatusCode::NOT_FOUND, ..ApiError::invalid("unknown endpoint", None) }.with_code("unknown_url")
}
