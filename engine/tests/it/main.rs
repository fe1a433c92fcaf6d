//! The engine's integration tests, one test binary (`cargo test -p colibri-engine --test it`;
//! a name filters, e.g. `--test it transformers_fixtures`). The GPU files compile only with
//! the engine's `wgpu` feature (tools/test.sh runs `cargo test -p colibri-engine --features
//! wgpu`) and share one device. One binary instead of one per file saves CI the compiling and
//! linking of a crate per file; tests of different files now run side by side (as tests of one
//! file always did), so none may rely on running alone.

#[cfg(feature = "wgpu")]
mod gpu_common;

mod batch;
mod chunked_prefill;
mod dsa;
mod forward_bits;
mod gguf_gpt_oss;
mod gpu_arith;
mod gpu_deltanet;
mod gpu_fixtures;
mod gpu_hybrid;
mod gpu_kernels;
mod gpu_persist;
mod gpu_v4;
mod kv_reuse;
mod mirror;
mod mtp_fixtures;
mod shaders_valid;
mod tokenizer_fixtures;
mod transformers_fixtures;
mod v4;
