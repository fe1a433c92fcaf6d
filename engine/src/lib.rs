//! colibri-engine: the model math of colibri, in folders that follow the data path.
//!
//! - [`mod@format`]: what bytes on disk mean: the container manifest and its checksums, the
//!   quantized encodings, the tensor table of safetensors checkpoints.
//! - [`experts`]: the expert supply: byte sources (file, memory, the browser's), the native
//!   reader pool, the in-memory tiers (pinned by usage, then by recent use), the usage counts.
//! - [`model`]: config, RoPE, attention, routing and the MoE block, the forward pass, and
//!   [`model::open`], the one place a model is opened (native directory or browser bytes).
//! - [`generate`], [`sampler`], [`tokenizer`]: ids in, ids and text out.
//! - `memlimit` (native only): how much memory the process may still take (MemAvailable,
//!   the memory cgroup's limits, a user's limit), for every automatic budget.
//! - `gpu` (feature `wgpu`): the same forward pass on wgpu; [`kernels`], [`math`] and
//!   [`tensor`]: the CPU arithmetic every backend is checked against.
//!
//! Each folder imports only from those above it in this list's order (format, experts,
//! model), never back. No sockets, no browser APIs: the same code compiles natively and
//! for wasm32-unknown-unknown; threads are an optional feature (`parallel`).

pub mod error;
pub mod experts;
pub mod format;
#[cfg(not(target_arch = "wasm32"))]
pub mod fsio;
pub mod generate;
#[cfg(feature = "wgpu")]
pub mod gpu;
#[cfg(not(target_arch = "wasm32"))]
pub mod hugemem;
pub mod kernels;
pub mod math;
#[cfg(not(target_arch = "wasm32"))]
pub mod memlimit;
pub mod model;
pub mod par;
pub mod qdot;
pub mod sampler;
pub mod tensor;
pub mod tokenizer;

pub use error::{Error, Result};
pub use model::config::ModelConfig;
pub use model::{Logits, Model, Session};
