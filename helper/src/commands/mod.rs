//! One module per `coli` command. Each parses its own flags (shared ones come from
//! crate::flags) and calls down into model loading, the server or the engine; nothing
//! below imports a command.

pub mod bench;
pub mod bench_batch;
pub mod bench_gpu;
pub mod bench_kernels;
pub mod bench_routing;
pub mod bench_serve;
pub mod catalog;
pub mod chat;
pub mod choose;
pub mod convert;
pub mod convert_gguf;
mod convert_output;
mod convert_source;
pub mod doctor;
pub(crate) mod doctor_machine;
mod doctor_report;
pub mod generate;
pub mod info;
pub mod list;
pub mod logits;
pub mod plan;
pub mod pull;
pub mod pull_gguf;
mod pull_staging;
pub mod run;
pub mod serve;
pub mod service;
pub mod synth;
pub mod tune;
