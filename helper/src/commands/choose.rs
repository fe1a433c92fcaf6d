//! `coli choose`: the probability of each of a fixed set of answers, generating nothing
//! (see colibri_engine::generate::choose).

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use colibri_engine::generate::choose::{self, choose_with};

use crate::backend::forward_keep_fn;
use crate::flags::ModelArgs;
use crate::load::open;

#[derive(Args)]
pub struct ChooseArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The question; by default sent as one user message through the chat template.
    #[arg(long)]
    pub prompt: String,
    /// The answers to score, separated by `|` (e.g. "merge|request changes|close").
    #[arg(long)]
    pub options: String,
    /// Score the options right after the prompt as raw text (no chat template).
    #[arg(long)]
    pub raw: bool,
    /// Print one JSON object: {options, probabilities, logprobs, entropy, index, choice,
    /// option_tokens, prompt_tokens, tokens_read, elapsed_ms}.
    #[arg(long)]
    pub json: bool,
}

pub fn choose(a: ChooseArgs) -> Result<()> {
    crate::flags::init_threads(a.model.threads)?;
    crate::flags::on_pool(|| choose_inner(a))
}

fn choose_inner(a: ChooseArgs) -> Result<()> {
    let options: Vec<String> = a.options.split('|').map(str::to_string).collect();
    if options.iter().any(|o| o.is_empty()) {
        bail!("--options: an empty option (separate options with |)");
    }
    let loaded = open(&a.model, true)?;
    let tok = loaded.tokenizer.as_ref().context("this model has no tokenizer.json")?;
    let prompt = choose::encode_prompt(tok, &a.prompt, a.raw)?;
    let option_ids = choose::encode_options(tok, &options)?;
    let max_positions = loaded.model.cfg.max_positions;
    let mut forward = forward_keep_fn(&loaded.model, a.model.compute())?;
    let start = Instant::now();
    let c = choose_with(&mut *forward, prompt, option_ids, max_positions)?;
    let elapsed = start.elapsed();
    drop(forward);
    crate::load::save_usage(&loaded);
    let mut out = std::io::stdout().lock();
    if a.json {
        let mut v = c.to_json(&options);
        v["elapsed_ms"] = serde_json::json!(elapsed.as_secs_f64() * 1e3);
        writeln!(out, "{v}")?;
    } else {
        for (o, p) in options.iter().zip(&c.probabilities) {
            writeln!(out, "{p:8.4}  {o}")?;
        }
        writeln!(
            out,
            "choice: {} (entropy {:.4} nats; {} tokens read in {:.0} ms)",
            options[c.index],
            c.entropy,
            c.tokens_read,
            elapsed.as_secs_f64() * 1e3
        )?;
    }
    Ok(())
}
