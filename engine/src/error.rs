//! One error type for the whole engine. Every failure a user can cause (bad files,
//! bad ids, unsupported models) ends up here with enough context for one clear line.
//! Each variant has a stable [`Error::code`] (and a request parameter's error its
//! [`Error::param`]): the HTTP API's error bodies and the browser engine's JavaScript
//! errors carry them, so that no caller has to match on a message's text.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // The message includes its cause, which is therefore not also its `source()`: an
    // error chain (`{:#}`, `coli`'s error line) says it once.
    #[error("{path}: {io}")]
    Io { path: PathBuf, io: std::io::Error },
    #[error("{path}: invalid JSON: {json}")]
    Json { path: PathBuf, json: serde_json::Error },
    #[error("{path}: not a valid safetensors file: {msg}")]
    Safetensors { path: PathBuf, msg: String },
    #[error("config: {0}")]
    Config(String),
    #[error("unsupported model_type {0:?} (supported: mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3, kimi_k2, glm4_moe, gpt_oss, qwen3_next, qwen3_5_moe, qwen3_5_moe_text, deepseek_v4)")]
    UnknownModelType(String),
    #[error("tensor {name} is missing from the checkpoint")]
    MissingTensor { name: String },
    #[error("tensor {name} has shape {got:?}, expected {want:?}")]
    Shape { name: String, got: Vec<usize>, want: Vec<usize> },
    #[error("tensor {name} has dtype {dtype}, which is not supported (use f32, bf16 or f16)")]
    Dtype { name: String, dtype: String },
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("sequence of {len} tokens exceeds the context limit of {limit}")]
    ContextOverflow { len: usize, limit: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("{0}")]
    Invalid(String),
    /// The GPU backend: no adapter, a device error, a limit the model does not fit.
    #[error("gpu: {0}")]
    Gpu(String),
    /// Structured output: llguidance refused a grammar, or a constraint failed while
    /// tokens were generated (a parser limit reached, nothing left to allow).
    #[error("grammar: {0}")]
    Grammar(String),
    /// The caller asked to stop (between the chunks of a prefill: [`crate::generate::prefill`]).
    #[error("cancelled")]
    Cancelled,
    /// A request parameter that is out of range, malformed, or cannot be honoured; `name`
    /// is the parameter as OpenAI's API spells it (`top_p`, `logit_bias`, `stop`...).
    #[error("{message}")]
    Param { name: &'static str, message: String },
    /// Bytes that fail their checksum: a corrupt or truncated file (the message says which).
    #[error("{0}")]
    Checksum(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A [`Error::Param`] error naming `name`.
    pub fn param(name: &'static str, message: impl Into<String>) -> Self {
        Error::Param { name, message: message.into() }
    }

    /// The stable code of this kind of error (the HTTP API's `error.code`, a JavaScript
    /// error's `code`); never changes with the message.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Io { .. } => "io_error",
            Error::Json { .. } => "invalid_json",
            Error::Safetensors { .. } => "invalid_safetensors",
            Error::Config(_) => "invalid_config",
            Error::UnknownModelType(_) => "unsupported_model_type",
            Error::MissingTensor { .. } => "missing_tensor",
            Error::Shape { .. } => "bad_tensor_shape",
            Error::Dtype { .. } => "unsupported_dtype",
            Error::TokenOutOfRange { .. } => "token_out_of_range",
            Error::ContextOverflow { .. } => "context_length_exceeded",
            Error::Tokenizer(_) => "tokenizer_error",
            Error::Template(_) => "chat_template_error",
            Error::Invalid(_) => "invalid_input",
            Error::Gpu(_) => "gpu_error",
            Error::Grammar(_) => "grammar_error",
            Error::Cancelled => "cancelled",
            Error::Param { .. } => "invalid_parameter",
            Error::Checksum(_) => "checksum_mismatch",
        }
    }

    /// The request parameter a [`Error::Param`] names.
    pub fn param_name(&self) -> Option<&'static str> {
        match self {
            Error::Param { name, .. } => Some(name),
            _ => None,
        }
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), io: source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_and_params_are_named() {
        let e = Error::param("top_k", "top_k must be a whole number");
        assert_eq!(
            (e.code(), e.param_name(), e.to_string().as_str()),
            ("invalid_parameter", Some("top_k"), "top_k must be a whole number")
        );
        assert_eq!(Error::ContextOverflow { len: 9, limit: 8 }.code(), "context_length_exceeded");
        assert_eq!(Error::Checksum("x".into()).code(), "checksum_mismatch");
        assert_eq!(Error::Invalid("x".into()).param_name(), None);
    }
}
