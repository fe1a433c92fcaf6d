//! colibri-engine: the model math of colibri.
//!
//! Formats (safetensors checkpoints), the Mixture-of-Experts forward pass for the
//! supported families, the CPU kernels, tokenizer and chat template, and the sampler.
//! No sockets, no browser APIs: the same code compiles natively and for
//! wasm32-unknown-unknown; threads are an optional feature (`parallel`).

pub mod error;
pub mod experts;
pub mod format;
pub mod generate;
#[cfg(feature = "wgpu")]
pub mod gpu;
pub mod kernels;
pub mod math;
pub mod model;
pub mod sampler;
pub mod tensor;
pub mod tokenizer;

pub use error::{Error, Result};
pub use model::config::ModelConfig;
pub use model::{Logits, Model, Session};
