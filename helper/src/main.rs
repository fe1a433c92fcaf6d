//! `coli`: the colibri command line. Runs models natively, converts them, and serves them
//! to the browser and to OpenAI clients.
//!
//! Layers, each importing only from those below it: main.rs (the command enum) ->
//! commands/ (one module per command) -> serve/ (the HTTP server) -> load.rs and
//! backend.rs (opening a model, the CPU/GPU forward) -> usage_store.rs (the usage file),
//! flags.rs (flag types shared by commands) and paths.rs; /proc/meminfo is read by
//! the engine's fsio::meminfo.

mod backend;
mod commands;
mod flags;
mod hub;
mod kv_store;
mod load;
mod paths;
mod probe;
mod serve;
mod usage_store;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use commands::{
    bench, bench_kernels, bench_routing, bench_serve, chat, choose, convert, doctor, generate, info, list, logits,
    plan, pull, service, synth,
};

#[derive(Parser)]
#[command(name = "coli", version, about = "colibri: Mixture-of-Experts models on your own machine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Teacher-forced logits for every position, as raw little-endian f32 [n_ids, vocab].
    Logits(logits::LogitsArgs),
    /// Generate a continuation of a prompt (token ids or text).
    Generate(generate::GenerateArgs),
    /// Chat in the terminal with the model's chat template, streaming tokens.
    Chat(chat::ChatArgs),
    /// Score fixed answers to a prompt (their probabilities), generating nothing.
    Choose(choose::ChooseArgs),
    /// Convert a Hugging Face checkpoint into a colibri model (quantized, streamable).
    Convert(convert::ConvertArgs),
    /// Architecture, size and quantization of a model directory.
    Info(info::InfoArgs),
    /// The installed models (in $COLI_HOME): id, family, quantization, sizes, directory.
    List(list::ListArgs),
    /// Download a model from the Hugging Face hub (HF_ENDPOINT, HF_TOKEN), verify it and
    /// convert it shard by shard into the models directory.
    Pull(pull::PullArgs),
    /// Delete an installed model.
    Rm(list::RmArgs),
    /// What running a model here would look like (an installed id, a directory or a hub
    /// repository): resident/streamed split, the --ram and --pin chosen, tokens/s estimate.
    Plan(plan::PlanArgs),
    /// Check this machine and (optionally) a model directory.
    Doctor(doctor::DoctorArgs),
    /// The localhost helper: model files over HTTP Range, the web app, the OpenAI API.
    Serve(serve::ServeArgs),
    /// `coli serve`, then open the chat page in the browser.
    Web(serve::ServeArgs),
    /// Run the helper as a background service (systemd user unit / launchd agent).
    Service(service::ServiceArgs),
    /// Decode benchmark of one run: tokens/s, TTFT, hit rates per tier, bytes read,
    /// prefetch recall, peak RSS, disk bandwidth and the I/O lower bound (JSON).
    Bench(bench::BenchArgs),
    /// Router-lookahead recall and LRU vs learned-pin hit rates on real decoding (JSON).
    BenchRouting(bench_routing::RoutingBenchArgs),
    /// Load test of the helper's Range API against plain reads of the same file (JSON).
    BenchServe(bench_serve::BenchArgs),
    /// Each stored weight format's kernel in GB/s next to the memory read bandwidth.
    BenchKernels(bench_kernels::KernelBenchArgs),
    /// Write a synthetic OLMoE-shaped checkpoint (HF layout, seeded bf16) for benchmarks.
    Synth(synth::SynthArgs),
}

fn main() -> ExitCode {
    // Library code returns errors; should anything still panic, say so in one line.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("error: internal error{at}: {msg} (please report this)");
    }));
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Logits(a) => logits::logits(a),
        Command::Generate(a) => generate::generate(a),
        Command::Chat(a) => chat::chat(a),
        Command::Choose(a) => choose::choose(a),
        Command::Convert(a) => convert::convert(a),
        Command::Info(a) => info::info(a),
        Command::Doctor(a) => doctor::doctor(a),
        Command::List(a) => list::list(a),
        Command::Rm(a) => list::rm(a),
        Command::Plan(a) => plan::plan(a),
        Command::Pull(a) => pull::pull(a),
        Command::Serve(a) => commands::serve::serve(a, false),
        Command::Web(a) => commands::serve::serve(a, true),
        Command::Service(a) => service::run(a),
        Command::BenchServe(a) => bench_serve::run(a),
        Command::BenchRouting(a) => bench_routing::run(a),
        Command::Bench(a) => bench::run(a),
        Command::BenchKernels(a) => bench_kernels::run(a),
        Command::Synth(a) => synth::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("error: {}", chain.join(": "));
            ExitCode::FAILURE
        }
    }
}
