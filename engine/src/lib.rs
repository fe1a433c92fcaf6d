//! colibri-engine: the model math of colibri.
//!
//! Formats (safetensors checkpoints), the Mixture-of-Experts forward pass for the
//! supported families, the CPU kernels, tokenizer and chat template, and the sampler.
//! No sockets, no browser APIs: the same code compiles natively and for
//! wasm32-unknown-unknown; threads are an optional feature (`parallel`).

pub mod attention;
pub mod config;
pub mod container;
pub mod error;
pub mod generate;
#[cfg(feature = "wgpu")]
pub mod gpu;
pub mod kernels;
pub mod math;
pub mod model;
pub mod moe;
pub mod qdot;
pub mod rope;
pub mod sampler;
pub mod tensor;
pub mod tokenizer;
pub mod usage;
pub mod weights;

pub use config::ModelConfig;
pub use error::{Error, Result};
pub use model::{Logits, Model, Session};
