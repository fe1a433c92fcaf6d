//! `coli chat`: a terminal chat that applies the model's chat template, streams tokens,
//! and reuses the KV cache for the part of the conversation that did not change.
//!
//! On a terminal: line editing and a history (rustyline; kept in the data directory),
//! slash commands (`/help`), Ctrl-C stops an answer and keeps the conversation (at an
//! empty prompt, a second Ctrl-C leaves, as does Ctrl-D). Piped input is read line by
//! line with the same commands and no prompt, so scripts see only the answers.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use colibri_engine::generate::{
    feed_pieces, generate_with, pin_shared, reusable, reuse, snapshot_cuts, Fallback, GenerateOptions, StopReason,
    PREFILL_CHUNK,
};
use colibri_engine::tokenizer::{answer_reserve, fit_chat, system_prefix_len, ChatMessage, DecodeStream};
use colibri_engine::Logits;

use crate::backend::ChatSession;
use crate::flags::{ModelArgs, SamplingArgs};
use crate::load::{open, Loaded};

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System prompt placed before the conversation (`/system` changes it).
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per answer.
    #[arg(long, default_value_t = 512)]
    pub max_new_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

const HELP: &str = "\
/help            this list
/clear           start a new conversation (the system prompt stays)
/system [TEXT]   show the system prompt, or set it (the conversation stays)
/save FILE       write the conversation as JSON ({\"messages\": [{role, content}, ...]})
/load FILE       continue a conversation saved with /save (or any such JSON)
/stats           the last answer's speed, the context used, the expert cache
/quit            leave (also Ctrl-D; Ctrl-C twice at an empty prompt)
Ctrl-C while the model answers stops the answer and keeps the conversation.
A message that starts with / is a command; start it with // to send a literal /.";

/// What the user typed: a message for the model, or a command.
#[derive(Debug, PartialEq)]
enum Input<'a> {
    Message(&'a str),
    Help,
    Clear,
    System(Option<&'a str>),
    Save(&'a str),
    Load(&'a str),
    Stats,
    Quit,
    Unknown(&'a str),
    Empty,
}

fn parse(line: &str) -> Input<'_> {
    let text = line.trim();
    if text.is_empty() {
        return Input::Empty;
    }
    if text.starts_with("//") {
        return Input::Message(&text[1..]);
    }
    let Some(cmd) = text.strip_prefix('/') else { return Input::Message(text) };
    let (name, arg) = cmd.split_once(char::is_whitespace).map_or((cmd, ""), |(n, a)| (n, a.trim()));
    let arg = (!arg.is_empty()).then_some(arg);
    match (name, arg) {
        ("help" | "?", _) => Input::Help,
        ("clear" | "reset" | "new", _) => Input::Clear,
        ("system", a) => Input::System(a),
        ("save", Some(f)) => Input::Save(f),
        ("load", Some(f)) => Input::Load(f),
        ("stats", _) => Input::Stats,
        ("quit" | "exit" | "q", _) => Input::Quit,
        _ => Input::Unknown(name),
    }
}

/// The conversation file of `/save` and `/load`: OpenAI's message shape.
#[derive(serde::Serialize, serde::Deserialize)]
struct Saved {
    messages: Vec<ChatMessage>,
}

/// Where the lines come from: rustyline on a terminal, plain lines otherwise.
enum Lines {
    Editor(Box<rustyline::DefaultEditor>, Option<PathBuf>),
    Piped(std::io::Lines<std::io::StdinLock<'static>>),
}

/// One read: a line, Ctrl-C at the prompt, or the end.
enum Read {
    Line(String),
    Interrupted,
    End,
}

impl Lines {
    fn open(interactive: bool) -> Result<Lines> {
        if !interactive {
            return Ok(Lines::Piped(std::io::stdin().lock().lines()));
        }
        let mut ed = rustyline::DefaultEditor::new().context("cannot set up line editing")?;
        let file = crate::paths::data_dir().map(|d| d.join("chat_history"));
        if let Some(f) = &file {
            let _ = ed.load_history(f);
        }
        Ok(Lines::Editor(Box::new(ed), file))
    }

    fn read(&mut self) -> Result<Read> {
        match self {
            Lines::Piped(lines) => Ok(lines.next().transpose()?.map_or(Read::End, Read::Line)),
            Lines::Editor(ed, _) => match ed.readline("> ") {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        let _ = ed.add_history_entry(line.as_str());
                    }
                    Ok(Read::Line(line))
                }
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Read::Interrupted),
                Err(rustyline::error::ReadlineError::Eof) => Ok(Read::End),
                Err(e) => Err(e.into()),
            },
        }
    }

    fn save_history(&mut self) {
        if let Lines::Editor(ed, Some(f)) = self {
            if let Some(dir) = f.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = ed.save_history(f);
        }
    }
}

/// The figures `/stats` shows.
#[derive(Default)]
struct LastAnswer {
    tokens: usize,
    secs: f64,
    first_token_secs: Option<f64>,
    reason: Option<StopReason>,
}

pub fn chat(a: ChatArgs) -> Result<()> {
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
        "colibri: {} with {} layers and {} experts (top {}) from {}. /help lists the commands.",
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
        sampler: a.sampling.config(&loaded.sampling, Fallback::Chat.config(seed)),
        stop_ids: loaded.stop_ids.clone(),
        logprobs: None,
    };
    opts.sampler.validate_vocab(cfg.vocab)?;
    let stop = Arc::new(AtomicBool::new(false));
    crate::interrupt::catch_ctrl_c(stop.clone())?;
    let mut system = a.system.clone();
    let mut turns: Vec<ChatMessage> = Vec::new();
    let mut session = ChatSession::new(&loaded.model, a.model.compute())?;
    // The conversation's cache on disk after every turn, found again after a restart.
    let root = crate::paths::resolve_model(&a.model.model, None)?;
    let store = crate::kv_store::KvStore::in_data_dir(&root, 8, 1 << 30).map(|st| match session.cache_tag() {
        Some(tag) => st.for_backend(&tag),
        None => st,
    });
    let mut last_cached = 0;
    let mut lines = Lines::open(interactive)?;
    let mut last = LastAnswer::default();
    let mut interrupted = false;
    loop {
        let line = match lines.read()? {
            Read::End => break,
            Read::Interrupted => {
                if interrupted {
                    break;
                }
                interrupted = true;
                eprintln!("(Ctrl-C again, Ctrl-D or /quit leaves)");
                continue;
            }
            Read::Line(l) => l,
        };
        interrupted = false;
        // From here a Ctrl-C stops this answer, also one typed while the conversation is
        // being fitted, its cache restored from disk or its prompt read: the flag is
        // cleared now, not when the first token comes (which would lose that Ctrl-C).
        stop.store(false, Ordering::SeqCst);
        let text = match parse(&line) {
            Input::Empty => continue,
            Input::Quit => break,
            Input::Help => {
                eprintln!("{HELP}");
                continue;
            }
            Input::Clear => {
                turns.clear();
                eprintln!("(a new conversation)");
                continue;
            }
            Input::System(None) => {
                eprintln!("system prompt: {}", system.as_deref().unwrap_or("(none)"));
                continue;
            }
            Input::System(Some(s)) => {
                system = Some(s.to_string());
                eprintln!("(system prompt set; the conversation stays)");
                continue;
            }
            Input::Save(f) => {
                match save(Path::new(f), system.as_deref(), &turns) {
                    Ok(()) => eprintln!("(saved {} messages to {f})", turns.len()),
                    Err(e) => eprintln!("error: {}", crate::error_line(&e)),
                }
                continue;
            }
            Input::Load(f) => {
                match load(Path::new(f)) {
                    Ok((s, t)) => {
                        if s.is_some() {
                            system = s;
                        }
                        turns = t;
                        eprintln!("(loaded {} messages from {f})", turns.len());
                    }
                    Err(e) => eprintln!("error: {}", crate::error_line(&e)),
                }
                continue;
            }
            Input::Stats => {
                eprintln!("{}", stats(&loaded, &last, session.tokens().len(), turns.len()));
                eprintln!(
                    "KV cache: {} bytes per token; the last prompt reused {last_cached} cached tokens",
                    cfg.kv_cache_bytes_per_token()
                );
                continue;
            }
            Input::Unknown(name) => {
                eprintln!("unknown command /{name}: /help lists them (// sends a literal /)");
                continue;
            }
            Input::Message(t) => t.to_string(),
        };
        turns.push(ChatMessage { role: "user".into(), content: text });
        let mut messages = Vec::with_capacity(turns.len() + 1);
        if let Some(s) = &system {
            messages.push(ChatMessage { role: "system".into(), content: s.clone() });
        }
        messages.extend(turns.iter().cloned());
        // The one trimming rule of every surface (fit_chat): when the conversation would
        // leave too little of the context for the answer, the oldest turns go.
        let reserve = answer_reserve(Some(opts.max_new_tokens), cfg.max_positions);
        let ids = match fit_chat(tok, &messages, cfg.max_positions, reserve) {
            Ok(f) => {
                if f.dropped > 0 {
                    turns.drain(..f.dropped);
                    eprintln!(
                        "(the conversation no longer fits the model's context of {} tokens: dropped the {} oldest \
                         messages{}; /clear starts afresh)",
                        cfg.max_positions,
                        f.dropped,
                        if system.is_some() { ", kept the system prompt" } else { "" }
                    );
                }
                f.ids
            }
            Err(e @ colibri_engine::Error::ContextOverflow { .. }) => {
                turns.pop();
                eprintln!("error: {e}: that message does not fit the model's context; it was not sent");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        // Reuse the cache for the unchanged prefix (always feeding at least one token), or
        // a longer one written by an earlier run (after a restart and /load).
        let shared = reusable(session.tokens(), &ids);
        let mut common = reuse(&mut session, &ids);
        if let Some((s, kept)) = store.as_ref().and_then(|st| st.find(cfg, &ids, common)) {
            // A recurrent state (Gated DeltaNet, DeepSeek-V4's compressor) cut inside a file
            // restarts: its tokens are fed again, so say how many the cache really spares.
            let held = s.cached_len().min(kept);
            if session.restore(s) {
                if held < kept {
                    eprintln!(
                        "(restored the cache of {kept} tokens of this conversation from disk; this model's \
                         recurrent state holds {held} of them, the other {} are fed again)",
                        kept - held
                    );
                } else {
                    eprintln!("(restored the cache of {kept} tokens of this conversation from disk)");
                }
                common = kept;
            }
        }
        // What the prompt did not have to feed again (a recurrent state cut back by `reuse`
        // or a restored file restarts where it cannot follow).
        last_cached = common.min(session.cached_len());
        // A model whose state goes back only to snapshots (Gated DeltaNet, DeepSeek-V4):
        // the prompt's passes end where a later prompt will want one (after the system
        // prompt, which a conversation after /clear starts with too; where this prompt
        // leaves the last one; before a long prompt's last id), as the server's do.
        let (cuts, shared) = match cfg.rewinds_to_snapshots() {
            true => {
                let hint = system_prefix_len(&messages, &ids, &|m| tok.encode_chat(m, false));
                let shared = if hint > 0 { hint } else { shared };
                (snapshot_cuts(last_cached, shared, ids.len()), shared)
            }
            false => (Vec::new(), 0),
        };
        let start = Instant::now();
        let mut first = None;
        let mut stream = DecodeStream::default();
        let mut failed = None;
        let mut stdout = std::io::stdout().lock();
        let fed = session.tokens().to_vec();
        // The prompt goes in chunks (the same bits as one pass): a Ctrl-C during a long
        // prefill stops it at the next chunk, not when the whole prompt has been read.
        let go_on = || !stop.load(Ordering::SeqCst);
        let (out, reason) = generate_with(
            &mut |ids| {
                let at = session.tokens().len();
                let ends: Vec<usize> = cuts.iter().filter(|&&c| c > at).map(|&c| c - at).collect();
                crate::flags::on_pool(|| {
                    let forward = &mut |part: &[u32], _| {
                        pin_shared(&mut session, shared);
                        session.forward(part)
                    };
                    feed_pieces(forward, ids, Logits::Last, PREFILL_CHUNK, &ends, &mut || go_on())
                })
            },
            &fed,
            &ids[common..],
            cfg.max_positions,
            &opts,
            &mut |id| {
                first.get_or_insert_with(|| start.elapsed().as_secs_f64());
                if stop.load(Ordering::SeqCst) {
                    return false;
                }
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
            },
        )?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        write!(stdout, "{}", stream.finish(tok)?)?;
        let stopped = stop.swap(false, Ordering::SeqCst);
        if stopped {
            write!(stdout, " [stopped]")?;
        }
        writeln!(stdout)?;
        drop(stdout);
        last = LastAnswer {
            tokens: out.len(),
            secs: start.elapsed().as_secs_f64(),
            first_token_secs: first,
            reason: Some(reason),
        };
        if interactive {
            eprintln!("[{} tokens, {:.1} tokens/s]", out.len(), out.len() as f64 / last.secs.max(1e-9));
        }
        let answer = tok.decode(&out, true)?;
        turns.push(ChatMessage { role: "assistant".into(), content: answer.trim().to_string() });
        if let Some(st) = &store {
            session.save_to(st);
        }
        // A turn boundary: re-pin by what was used (with hysteresis), record the uses.
        loaded.model.experts.end_turn()?;
        crate::load::save_usage(&loaded);
        // Vary sampling between turns while staying reproducible for a given --seed.
        opts.sampler.seed = opts.sampler.seed.wrapping_add(1);
    }
    lines.save_history();
    Ok(())
}

fn save(path: &Path, system: Option<&str>, turns: &[ChatMessage]) -> Result<()> {
    let mut messages = Vec::with_capacity(turns.len() + 1);
    if let Some(s) = system {
        messages.push(ChatMessage { role: "system".into(), content: s.to_string() });
    }
    messages.extend(turns.iter().cloned());
    let json = serde_json::to_string_pretty(&Saved { messages })?;
    std::fs::write(path, json + "\n").with_context(|| format!("cannot write {}", path.display()))
}

/// (system prompt, turns) of a saved conversation: `{"messages": [...]}` or a bare array.
fn load(path: &Path) -> Result<(Option<String>, Vec<ChatMessage>)> {
    let bytes = colibri_engine::fsio::read_limited(path, colibri_engine::fsio::MAX_JSON_BYTES)
        .context("cannot read the conversation")?;
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).with_context(|| format!("{} is not JSON", path.display()))?;
    let list = if value.is_array() { value } else { value.get("messages").cloned().unwrap_or_default() };
    let messages: Vec<ChatMessage> = serde_json::from_value(list)
        .with_context(|| format!("{}: expected {{\"messages\": [{{\"role\", \"content\"}}, ...]}}", path.display()))?;
    let mut system = None;
    let mut turns = Vec::new();
    for m in messages {
        match m.role.as_str() {
            "system" => system = Some(m.content),
            "user" | "assistant" => turns.push(m),
            other => bail!("{}: a message with role {other:?} (system, user or assistant expected)", path.display()),
        }
    }
    Ok((system, turns))
}

fn stats(loaded: &Loaded, last: &LastAnswer, context: usize, messages: usize) -> String {
    let max = loaded.model.cfg.max_positions;
    let mut s = format!("conversation: {messages} messages, {context} of {max} context tokens in use");
    match last.reason {
        None => s.push_str("\nlast answer: none yet"),
        Some(reason) => {
            let decode = last.secs - last.first_token_secs.unwrap_or(0.0);
            let rate = if last.tokens > 1 && decode > 0.0 { (last.tokens - 1) as f64 / decode } else { 0.0 };
            s.push_str(&format!(
                "\nlast answer: {} tokens in {:.2} s (first token after {:.2} s, then {rate:.1} tokens/s), ended by {}",
                last.tokens,
                last.secs,
                last.first_token_secs.unwrap_or(0.0),
                reason.as_str()
            ));
        }
    }
    if let Some(c) = &loaded.cache {
        s.push_str(&format!("\nexpert cache: {}", c.describe()));
    }
    if let Some(st) = loaded.model.experts.cache_stats() {
        s.push_str(&format!("\nexpert reads: {} hits, {} misses", st.hits, st.misses));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_messages() {
        assert_eq!(parse("  hello "), Input::Message("hello"));
        assert_eq!(parse(""), Input::Empty);
        assert_eq!(parse("   "), Input::Empty);
        assert_eq!(parse("/help"), Input::Help);
        assert_eq!(parse("/clear"), Input::Clear);
        assert_eq!(parse("/reset"), Input::Clear);
        assert_eq!(parse("/system"), Input::System(None));
        assert_eq!(parse("/system  Be brief. "), Input::System(Some("Be brief.")));
        assert_eq!(parse("/save chat.json"), Input::Save("chat.json"));
        assert_eq!(parse("/save"), Input::Unknown("save"));
        assert_eq!(parse("/load a b.json"), Input::Load("a b.json"));
        assert_eq!(parse("/stats"), Input::Stats);
        assert_eq!(parse("/quit"), Input::Quit);
        assert_eq!(parse("/exit"), Input::Quit);
        assert_eq!(parse("/frobnicate now"), Input::Unknown("frobnicate"));
        assert_eq!(parse("//etc/passwd is a path"), Input::Message("/etc/passwd is a path"));
        assert_eq!(parse("//"), Input::Message("/"));
    }
}
