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
mod interrupt;
mod kv_store;
mod load;
mod paths;
mod probe;
mod serve;
mod tune;
mod usage_store;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use commands::{
    bench, bench_kernels, bench_routing, bench_serve, chat, choose, convert, doctor, generate, info, list, logits,
    plan, pull, run, service, synth,
};

/// `coli --version`: the package version and the commit it was built from (helper/build.rs).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("COLI_BUILD_COMMIT"), ")");

#[derive(Parser)]
#[command(name = "coli", version = VERSION, about = "colibri: Mixture-of-Experts models on your own machine")]
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
    /// Chat with a model, pulling it first when it is not installed (after checking that
    /// it can run here): an installed id, a directory, a hub repository or a catalog name.
    Run(run::RunArgs),
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
    /// Write a synthetic OLMoE- or DeepSeek-V3-shaped checkpoint (HF layout, seeded bf16 or
    /// block-scaled FP8) for benchmarks.
    Synth(synth::SynthArgs),
    /// Measure how this machine reads a converted model's experts (reader threads,
    /// O_DIRECT) and keep the fastest setting for later runs (the model's tune.json).
    Tune(commands::tune::TuneArgs),
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
    let cli = parse_args();
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
        Command::Run(a) => run::run(a),
        Command::Serve(a) => commands::serve::serve(a, false),
        Command::Web(a) => commands::serve::serve(a, true),
        Command::Service(a) => service::run(a),
        Command::BenchServe(a) => bench_serve::run(a),
        Command::BenchRouting(a) => bench_routing::run(a),
        Command::Bench(a) => bench::run(a),
        Command::BenchKernels(a) => bench_kernels::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Tune(a) => commands::tune::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The command line, where a value may be a negative number (`--temperature -1`,
/// `--presence-penalty -0.5`): it then reaches its flag's own check and range message
/// instead of being taken for an unknown flag.
fn command() -> clap::Command {
    fn negatives(cmd: clap::Command) -> clap::Command {
        cmd.mut_args(|a| if a.get_action().takes_values() { a.allow_negative_numbers(true) } else { a })
            .mut_subcommands(negatives)
    }
    negatives(Cli::command())
}

fn parse_args() -> Cli {
    let matches = command().get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// An error and its causes on one line, each said once: a message that already includes its
/// cause's text (`path: No such file or directory (os error 2)` over the io::Error itself)
/// is not followed by that cause again.
pub(crate) fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error whose message includes its cause, which it also gives as its source.
    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "/x/config.json: {}", self.0)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let os = std::io::Error::from(std::io::ErrorKind::NotFound).to_string();
        let e = anyhow::Error::new(Wrapped(std::io::ErrorKind::NotFound.into())).context("cannot open /x");
        assert_eq!(error_line(&e), format!("cannot open /x: /x/config.json: {os}"));
        // The engine's own errors say their cause in the message and not again as a source.
        let e = anyhow::Error::new(colibri_engine::Error::io("/y", std::io::ErrorKind::NotFound.into()));
        assert_eq!(format!("{e:#}"), format!("/y: {os}"));
        let e = anyhow::anyhow!("plain").context("outer");
        assert_eq!(error_line(&e), "outer: plain");
    }

    #[test]
    fn negative_numbers_reach_the_range_check() {
        let e =
            command().try_get_matches_from(["coli", "generate", "--model", "m", "--ids", "1", "--temperature", "-1"]);
        let msg = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("temperature must be a finite number >= 0"), "{msg}");
        let m = command()
            .try_get_matches_from(["coli", "generate", "--model", "m", "--ids", "1", "--presence-penalty", "-0.5"])
            .unwrap();
        let cli = Cli::from_arg_matches(&m).unwrap();
        let Command::Generate(g) = cli.command else { panic!("not generate") };
        assert_eq!(g.sampling.presence_penalty, Some(-0.5));
    }
}
