//! One error type for the whole engine. Every failure a user can cause (bad files,
//! bad ids, unsupported models) ends up here with enough context for one clear line.

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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), io: source }
    }
}
