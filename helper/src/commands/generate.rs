//! `coli generate`: a continuation of a prompt (token ids or text), as text or JSON.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use colibri_engine::generate::logprobs::{chat_entry, token_logprob};
use colibri_engine::generate::{
    drive, drive_drafted, drive_speculative, feed_chunked, forward_recording, Constraint, Fallback, GenerateOptions,
    Generator, Grammar, ModelDrafter, MtpDrafter, StopReason, PREFILL_CHUNK,
};
use colibri_engine::tokenizer::{ChatMessage, DecodeStream};
use colibri_engine::Logits;

use crate::backend::forward_keep_fn;
use crate::flags::{parse_ids, ModelArgs, SamplingArgs};
use crate::load::{open, open_draft, CacheFlags, Draft};

/// Draft tokens per step: --speculate N, else the default of the draft source (the
/// engine's, shared with the browser's `generate({draft})`).
pub use colibri_engine::generate::draft::max_draft;

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt as comma-separated token ids.
    #[arg(long, conflicts_with = "prompt", required_unless_present = "prompt")]
    pub ids: Option<String>,
    /// Prompt as text, tokenized with the model's tokenizer and continued as it is (raw
    /// completion: no chat template) unless --chat is given.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Treat --prompt as one user message: apply the model's chat template (as `coli chat`
    /// and the API do) and answer it.
    #[arg(long)]
    pub chat: bool,
    /// With --chat: a system prompt placed before the message.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Most tokens to generate (default: with --chat, until the answer ends, at the model's
    /// end token or the end of its context; without, 32). A generation cut short by it or by
    /// the context says so on stderr ("finish_reason": "length" with --json).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Keep going past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object: {"ids", "text", "prompt_ids", "finish_reason", timings}.
    #[arg(long)]
    pub json: bool,
    /// With --json: also "logprobs", each produced token's log-probability with this many
    /// alternatives (0 to 20), as the API's chat `logprobs.content` (stop ids excepted).
    #[arg(long, requires = "json", value_parser = clap::value_parser!(u8).range(0..=20))]
    pub logprobs: Option<u8>,
    /// Structured output: the text must match the grammar in FILE (GBNF as llama.cpp
    /// takes it, with a `root` rule; or llguidance's Lark, with a `start` rule).
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub grammar: Option<std::path::PathBuf>,
    /// Structured output: the text must be JSON valid under the JSON Schema in FILE.
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub json_schema: Option<std::path::PathBuf>,
    /// Structured output: the whole text must match this regular expression.
    #[arg(long, value_name = "REGEX", group = "constraint")]
    pub regex: Option<String>,
    /// Speculative decoding from prompt lookup: up to N draft tokens per step (what
    /// followed the context's last tokens earlier on), checked in one forward pass. The
    /// output is the same as without; --json adds "speculation" (acceptance rate, tokens
    /// per forward pass).
    #[arg(long, value_name = "N", default_value_t = 0, conflicts_with = "logprobs")]
    pub speculate: usize,
    /// Speculative decoding with drafts from a smaller model of the same tokenizer (a
    /// directory or an installed id; another tokenizer is refused), or with `mtp` from the
    /// model's own multi-token-prediction layer (DeepSeek-V3, GLM-4.5; CPU backend): it
    /// proposes --speculate N tokens per step (4 for a model, 1 for mtp, if not given)
    /// greedily, the model checks them in one forward pass. The output is the same as without.
    #[arg(long, value_name = "DIR|mtp", conflicts_with = "logprobs")]
    pub draft: Option<std::path::PathBuf>,
}

impl GenerateArgs {
    /// The grammar of --grammar / --json-schema / --regex, if any.
    fn grammar(&self) -> Result<Option<Grammar>> {
        let read = |p: &std::path::Path| std::fs::read_to_string(p).with_context(|| format!("{}", p.display()));
        Ok(if let Some(p) = &self.grammar {
            Some(Grammar::from_text(&read(p)?))
        } else if let Some(p) = &self.json_schema {
            let text = read(p)?;
            let schema = serde_json::from_str(&text).with_context(|| {
                use colibri_engine::generate::grammar::limits::{json_nesting, MAX_JSON_NESTING};
                match json_nesting(text.as_bytes()) >= MAX_JSON_NESTING {
                    true => format!("{}: not JSON: nests deeper than {MAX_JSON_NESTING} levels", p.display()),
                    false => format!("{}: not JSON", p.display()),
                }
            })?;
            Some(Grammar::json_schema(schema))
        } else {
            self.regex.clone().map(Grammar::Regex)
        })
    }
}

pub fn generate(a: GenerateArgs) -> Result<()> {
    crate::flags::init_threads(a.model.threads)?;
    crate::flags::on_pool(|| generate_inner(a))
}

fn generate_inner(a: GenerateArgs) -> Result<()> {
    let ids_arg = a.ids.as_deref().map(parse_ids).transpose()?;
    let grammar = a.grammar()?;
    let loaded = open(&a.model, a.prompt.is_some() || a.logprobs.is_some() || grammar.is_some() || a.draft.is_some())?;
    let draft = a.draft.as_deref().map(|d| open_draft(d, &loaded, &CacheFlags::from_args(&a.model))).transpose()?;
    if matches!(draft, Some(Draft::Mtp)) && matches!(a.model.backend, crate::flags::BackendChoice::Wgpu) {
        bail!("--draft mtp runs on the CPU backend; use --backend cpu");
    }
    let tok = loaded.tokenizer.as_ref();
    let prompt_ids = match (ids_arg, &a.prompt) {
        (Some(_), _) if a.chat => bail!("--chat applies the chat template to --prompt; it cannot be used with --ids"),
        (Some(ids), _) => ids,
        (None, Some(text)) if a.chat => {
            let t = tok.context("this model has no tokenizer.json; use --ids")?;
            if !t.has_chat_template() {
                bail!("this model has no chat template; leave out --chat to continue the prompt as raw text");
            }
            let mut messages: Vec<ChatMessage> = a.system.iter().map(|s| ChatMessage::new("system", s)).collect();
            messages.push(ChatMessage::new("user", text));
            t.encode_chat(&messages, true)?
        }
        (None, Some(text)) => {
            let t = tok.context("this model has no tokenizer.json; use --ids")?;
            t.encode(text, true)?
        }
        (None, None) => bail!("give --ids or --prompt"),
    };
    let max_new_tokens = a.max_new_tokens.unwrap_or(if a.chat { usize::MAX } else { RAW_MAX_NEW_TOKENS });
    let opts = GenerateOptions {
        max_new_tokens,
        sampler: a.sampling.config(&loaded.sampling, Fallback::Greedy.config(0)),
        stop_ids: if a.ignore_eos { Vec::new() } else { loaded.stop_ids.clone() },
        logprobs: None,
    };
    opts.sampler.validate_vocab(loaded.model.cfg.vocab)?;
    let max_positions = loaded.model.cfg.max_positions;
    let mut gen = Generator::new(&[], &prompt_ids, max_positions, &opts)?;
    if let Some(g) = &grammar {
        let t = tok.context("structured output needs the model's tokenizer.json")?;
        gen = gen.with_constraint(Constraint::new(t, g)?);
    }
    let mut forward_pass = forward_keep_fn(&loaded.model, a.model.compute())?;
    // From here a Ctrl-C (SIGINT) stops the generation instead of the process: at its next
    // token, or while the prompt is read at its next chunk (the prompt goes in chunks of
    // PREFILL_CHUNK positions, the same bits as one pass). What was generated is printed,
    // then coli exits with 130.
    let stop = Arc::new(AtomicBool::new(false));
    crate::interrupt::catch_ctrl_c(stop.clone())?;
    let go_on = || !stop.load(Ordering::SeqCst);
    let mut forward = |keep: usize, ids: &[u32], which: Logits| {
        let mut at = keep;
        let mut pass = |part: &[u32], which| {
            let rows = forward_pass(at, part, which)?;
            at += part.len();
            Ok(rows)
        };
        feed_chunked(&mut pass, ids, which, PREFILL_CHUNK, &mut || go_on())
    };
    let start = Instant::now();
    let mut first_token = None;
    let mut stream = DecodeStream::default();
    let mut stdout = std::io::stdout().lock();
    let mut print_err = None;
    // --logprobs: the last row, kept until its token is known (the engine's computation).
    let last_row = std::cell::RefCell::new(Vec::new());
    let mut logprobs = Vec::new();
    let mut on_token = |id| {
        first_token.get_or_insert_with(|| start.elapsed());
        if let (Some(n), false) = (a.logprobs, opts.stop_ids.contains(&id)) {
            logprobs.push(token_logprob(&last_row.borrow(), id, n as usize));
        }
        if !a.json {
            if let Some(t) = tok {
                match stream.push(t, id) {
                    Ok(text) => {
                        if write!(stdout, "{text}").and_then(|_| stdout.flush()).is_err() {
                            return false;
                        }
                    }
                    Err(e) => {
                        print_err = Some(e);
                        return false;
                    }
                }
            }
        }
        go_on()
    };
    let (ids, reason, spec) = if let Some(Draft::Mtp) = &draft {
        let model = &loaded.model;
        let mut drafter = MtpDrafter::new(model)?;
        let (log, mut session) = (drafter.log(), model.new_session());
        let mut g = gen.with_external_drafts(max_draft(a.speculate, true));
        let reason = drive_drafted(
            &mut |keep, ids, which| {
                if !go_on() {
                    return Err(colibri_engine::Error::Cancelled);
                }
                forward_recording(model, &mut session, &log, keep, ids, which)
            },
            0,
            &mut g,
            Some(&mut drafter),
            &mut on_token,
        )?;
        (g.produced().to_vec(), reason, Some(g.spec_stats()))
    } else if let Some(Draft::Model(d)) = &draft {
        let mut drafter = ModelDrafter::new(
            forward_keep_fn(&d.model, a.model.compute())?,
            d.model.cfg.max_positions,
            loaded.model.cfg.vocab,
        );
        let mut g = gen.with_external_drafts(max_draft(a.speculate, false));
        let reason = drive_drafted(
            &mut |keep, ids, which| forward(keep, ids, which),
            0,
            &mut g,
            Some(&mut drafter),
            &mut on_token,
        )?;
        (g.produced().to_vec(), reason, Some(g.spec_stats()))
    } else if a.speculate == 0 {
        let mut fed = 0;
        let forward_last = &mut |ids: &[u32]| {
            let row = forward(fed, ids, Logits::Last)?;
            fed += ids.len();
            if a.logprobs.is_some() {
                last_row.borrow_mut().clone_from(&row);
            }
            Ok(row)
        };
        let (ids, reason) = drive(forward_last, gen, &mut on_token)?;
        (ids, reason, None)
    } else {
        let mut g = gen.with_speculation(a.speculate);
        let reason = drive_speculative(&mut |keep, ids, which| forward(keep, ids, which), 0, &mut g, &mut on_token)?;
        (g.produced().to_vec(), reason, Some(g.spec_stats()))
    };
    if let Some(e) = print_err {
        return Err(e.into());
    }
    let total = start.elapsed();
    let interrupted = reason == StopReason::Cancelled && stop.load(Ordering::SeqCst);
    drop(forward_pass);
    crate::load::save_usage(&loaded);
    let text = match tok {
        Some(t) => t.decode(&ids, true)?,
        None => String::new(),
    };
    if a.json {
        let ttft = first_token.unwrap_or(total).as_secs_f64();
        let decode_s = total.as_secs_f64() - ttft;
        let mut out = serde_json::json!({
            "ids": ids,
            "text": text,
            "prompt_ids": prompt_ids,
            "finish_reason": reason.as_str(),
            "ttft_ms": ttft * 1e3,
            "decode_tokens_per_second": if ids.len() > 1 && decode_s > 0.0 { (ids.len() - 1) as f64 / decode_s } else { 0.0 },
            "expert_cache": loaded.cache.as_ref().map(|c| c.describe()),
        });
        if let Some(s) = spec {
            out["speculation"] = s.to_json();
        }
        if let (Some(t), true) = (tok, a.logprobs.is_some()) {
            out["logprobs"] = logprobs.iter().map(|l| chat_entry(t, l)).collect();
        }
        writeln!(stdout, "{out}")?;
        drop(stdout);
    } else {
        if let Some(t) = tok {
            write!(stdout, "{}", stream.finish(t)?)?;
        } else {
            write!(stdout, "{}", ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","))?;
        }
        writeln!(stdout)?;
        drop(stdout);
        if reason == StopReason::Length {
            eprintln!(
                "{}",
                cut_note(ids.len(), a.max_new_tokens.is_none(), max_new_tokens, prompt_ids.len(), max_positions)
            );
        }
    }
    if interrupted {
        // What was generated is out; the exit status says it was cut.
        std::io::stdout().flush()?;
        eprintln!("coli: stopped by Ctrl-C after {} tokens", ids.len());
        std::process::exit(130);
    }
    Ok(())
}

/// Tokens a raw continuation (no --chat) makes when --max-new-tokens is not given.
const RAW_MAX_NEW_TOKENS: usize = 32;

/// The line that says an output was cut, and by what.
fn cut_note(produced: usize, default: bool, max_new_tokens: usize, prompt: usize, max_positions: usize) -> String {
    if produced >= max_new_tokens {
        let limit = if default { "the default --max-new-tokens" } else { "--max-new-tokens" };
        format!("coli: cut after {produced} tokens by {limit} (finish_reason \"length\"); raise it for more")
    } else {
        format!(
            "coli: cut after {produced} tokens: the prompt's {prompt} tokens and the output fill the model's \
             context of {max_positions} (finish_reason \"length\")"
        )
    }
}
