//! `coli chat`: a terminal chat that applies the model's chat template, streams tokens,
//! and reuses the KV cache for the part of the conversation that did not change.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use colibri_engine::generate::{generate, GenerateOptions};
use colibri_engine::sampler::SamplerConfig;
use colibri_engine::tokenizer::{ChatMessage, DecodeStream};

use crate::flags::{BackendChoice, ModelArgs, SamplingArgs};
use crate::load::open;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System prompt placed before the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per answer.
    #[arg(long, default_value_t = 512)]
    pub max_new_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn chat(a: ChatArgs) -> Result<()> {
    if a.model.backend == BackendChoice::Wgpu {
        bail!("coli chat runs on the CPU backend for now; --backend wgpu works with `coli logits` and `coli generate`");
    }
    let loaded = open(&a.model, true)?;
    let Some(tok) = loaded.tokenizer.as_ref() else { bail!("this model has no tokenizer") };
    if !tok.has_chat_template() {
        bail!("{}: the tokenizer has no chat template; use `coli generate --prompt` instead", a.model.model.display());
    }
    let cfg = &loaded.model.cfg;
    let interactive = std::io::stdin().is_terminal();
    if let (true, Some(c)) = (interactive, &loaded.cache) {
        eprintln!("coli: {}", c.describe());
    }
    eprintln!(
        "colibri: {} with {} layers and {} experts (top {}) from {}. /reset starts over, /quit leaves.",
        cfg.model_type,
        cfg.n_layers,
        cfg.router.n_experts,
        cfg.router.top_k,
        a.model.model.display()
    );
    let seed = a.sampling.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
    });
    let mut opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        sampler: a.sampling.config(
            &loaded.sampling,
            SamplerConfig { temperature: 0.7, top_p: 0.95, seed, ..SamplerConfig::default() },
        ),
        stop_ids: loaded.stop_ids.clone(),
        logprobs: None,
    };
    let mut history: Vec<ChatMessage> = Vec::new();
    if let Some(s) = &a.system {
        history.push(ChatMessage { role: "system".into(), content: s.clone() });
    }
    let base_len = history.len();
    let mut session = loaded.model.new_session();
    let mut stdout = std::io::stdout().lock();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            write!(stdout, "> ")?;
            stdout.flush()?;
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        let text = line.trim();
        match text {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                history.truncate(base_len);
                session = loaded.model.new_session();
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage { role: "user".into(), content: text.to_string() });
        let rendered = tok.apply_chat_template(&history, true)?;
        let ids = tok.encode(&rendered, false)?;
        // Reuse the cache for the unchanged prefix; always feed at least one token.
        let common =
            session.tokens.iter().zip(&ids).take_while(|(a, b)| a == b).count().min(ids.len().saturating_sub(1));
        session.truncate(common);
        let start = Instant::now();
        let mut stream = DecodeStream::default();
        let mut failed = None;
        let (out, _) = generate(&loaded.model, &mut session, &ids[common..], &opts, &mut |id| {
            if loaded.stop_ids.contains(&id) {
                return true;
            }
            match stream.push(tok, id) {
                Ok(t) => write!(stdout, "{t}").and_then(|_| stdout.flush()).is_ok(),
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        })?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        write!(stdout, "{}", stream.finish(tok)?)?;
        writeln!(stdout)?;
        let secs = start.elapsed().as_secs_f64();
        if interactive {
            eprintln!("[{} tokens, {:.1} tokens/s]", out.len(), out.len() as f64 / secs.max(1e-9));
        }
        let answer = tok.decode(&out, true)?;
        history.push(ChatMessage { role: "assistant".into(), content: answer.trim().to_string() });
        // A turn boundary: re-pin by what was used (with hysteresis), record the uses.
        loaded.model.experts.end_turn()?;
        crate::load::save_usage(&loaded);
        // Vary sampling between turns while staying reproducible for a given --seed.
        opts.sampler.seed = opts.sampler.seed.wrapping_add(1);
    }
    Ok(())
}
