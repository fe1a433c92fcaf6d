//! `coli`: the colibri command line. Runs models natively, and (in later releases)
//! converts them and serves them to the browser.

mod backend;
mod bench;
mod chat;
mod convert;
mod doctor;
mod info;
mod load;
mod paths;
mod routing_bench;
mod run;
mod serve;
mod synth;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "coli", version, about = "colibri: Mixture-of-Experts models on your own machine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Teacher-forced logits for every position, as raw little-endian f32 [n_ids, vocab].
    Logits(run::LogitsArgs),
    /// Generate a continuation of a prompt (token ids or text).
    Generate(run::GenerateArgs),
    /// Chat in the terminal with the model's chat template, streaming tokens.
    Chat(chat::ChatArgs),
    /// Convert a Hugging Face checkpoint into a colibri model (quantized, streamable).
    Convert(convert::ConvertArgs),
    /// Architecture, size and quantization of a model directory.
    Info(info::InfoArgs),
    /// Check this machine and (optionally) a model directory.
    Doctor(doctor::DoctorArgs),
    /// The localhost helper: model files over HTTP Range, the web app, the OpenAI API.
    Serve(serve::ServeArgs),
    /// `coli serve`, then open the chat page in the browser.
    Web(serve::ServeArgs),
    /// Run the helper as a background service (systemd user unit / launchd agent).
    Service(serve::service::ServiceArgs),
    /// Decode benchmark of one run: tokens/s, TTFT, hit rates per tier, bytes read,
    /// prefetch recall, peak RSS, disk bandwidth and the I/O lower bound (JSON).
    Bench(bench::BenchArgs),
    /// Router-lookahead recall and LRU vs learned-pin hit rates on real decoding (JSON).
    BenchRouting(routing_bench::RoutingBenchArgs),
    /// Load test of the helper's Range API against plain reads of the same file (JSON).
    BenchServe(serve::bench::BenchArgs),
    /// Write a synthetic OLMoE-shaped checkpoint (HF layout, seeded bf16) for benchmarks.
    Synth(synth::SynthArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Cpu,
    Wgpu,
}

/// Options shared by every command that runs a model.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model directory: a Hugging Face checkpoint (config.json, *.safetensors,
    /// tokenizer.json) or a converted colibri model (colibri.json).
    #[arg(long)]
    pub model: std::path::PathBuf,
    /// Expert-cache budget in bytes (suffixes K, M, G, T; 0 caches nothing; "all": no
    /// limit; default: half of MemAvailable minus the dense weights, at least 256M).
    #[arg(long, value_parser = load::parse_bytes)]
    pub ram: Option<u64>,
    /// Bytes of the --ram budget for experts pinned by learned usage (usage.json next to
    /// the model); default with usage counts: a quarter of --ram, less if the rest could
    /// not hold one token's experts; without: 0.
    #[arg(long, value_parser = load::parse_bytes)]
    pub pin: Option<u64>,
    /// Reader threads that load missing experts while resident ones compute (0: read
    /// synchronously).
    #[arg(long, default_value_t = 4)]
    pub readers: usize,
    /// Do not prefetch the next layer's likely experts (router lookahead).
    #[arg(long)]
    pub no_lookahead: bool,
    /// Read experts with O_DIRECT, bypassing the page cache, where the file system allows.
    #[arg(long)]
    pub direct: bool,
    /// Compute backend.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// CPU threads (default: the physical cores).
    #[arg(long)]
    pub threads: Option<usize>,
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
        Command::Logits(a) => run::logits(a),
        Command::Generate(a) => run::generate(a),
        Command::Chat(a) => chat::chat(a),
        Command::Convert(a) => convert::convert(a),
        Command::Info(a) => info::info(a),
        Command::Doctor(a) => doctor::doctor(a),
        Command::Serve(a) => serve::serve(a, false),
        Command::Web(a) => serve::serve(a, true),
        Command::Service(a) => serve::service::run(a),
        Command::BenchServe(a) => serve::bench::run(a),
        Command::BenchRouting(a) => routing_bench::run(a),
        Command::Bench(a) => bench::run(a),
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
