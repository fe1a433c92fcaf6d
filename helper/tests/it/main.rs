//! The helper's integration tests, one test binary (`cargo test -p colibri-helper --test it`;
//! a name filters, e.g. `--test it module_graph`). One binary instead of one per file: each
//! file used to be its own crate linked against the whole helper, which cost CI minutes of
//! compiling and linking; the files stay separate modules. Tests of different files now run
//! side by side (as tests of one file always did), so none may rely on running alone.

mod batch_cli;
mod chat_cli;
mod chat_pty;
mod choose_cli;
mod cli;
mod convert;
mod convert_truncated;
mod demo_model;
mod draft_cli;
mod expert_cache;
mod first_hour_cli;
mod fp8_cli;
mod generate_ctrl_c;
mod gguf;
mod gpu_cli;
mod gpu_hybrid_local;
mod gpu_stream;
mod hostile;
mod hybrid_cli;
mod memlimit_cli;
mod metrics;
mod mirror_cli;
mod models_cli;
mod module_graph;
mod mtp_cli;
mod private_files;
mod pull_cli;
mod routing_cli;
mod serve_cli;
mod structured_cli;
mod tune_cli;
mod v4_convert_cli;
mod v4_release_cli;
