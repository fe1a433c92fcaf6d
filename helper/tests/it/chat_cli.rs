//! `coli chat` as a script drives it (stdin piped: no prompt, the same commands): slash
//! commands stay out of the conversation, /save and /load round-trip it, Ctrl-C (SIGINT)
//! stops an answer and keeps the conversation.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-chat-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `coli chat` (greedy) on `model` with `input` piped in: (stdout, stderr). Its data
/// directory (where conversation caches go) is a fresh scratch one.
fn chat(model: &str, input: &str, extra: &[&str]) -> (String, String) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let data = scratch(&format!("data-{n}"));
    let r = chat_in(&data, model, input, extra);
    let _ = std::fs::remove_dir_all(&data);
    r
}

/// [`chat`] with the data directory `data` (`$XDG_DATA_HOME`).
/// `coli chat --model MODEL ARGS` with its own data directory and every stream piped.
fn spawn_chat(data: &std::path::Path, model: &std::path::Path, args: &[&str]) -> Child {
    coli()
        .env("XDG_DATA_HOME", data)
        .args(["chat", "--model"])
        .arg(model)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

pub(crate) fn chat_in(data: &std::path::Path, model: &str, input: &str, extra: &[&str]) -> (String, String) {
    let mut child =
        spawn_chat(data, &fixture(model), &[&["--max-new-tokens", "6", "--temperature", "0"], extra].concat());
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    (stdout, stderr)
}

#[test]
fn slash_commands_stay_out_of_the_conversation_and_save_load_round_trips() {
    let dir = scratch("commands");
    let file = dir.join("chat.json");
    let f = file.display().to_string();
    // Continued in one go...
    let (plain, _) = chat("qwen3_moe", "Hello\nAnd again\n", &["--system", "Be brief."]);
    // ...and through /save, /clear, /load: the same last answer.
    let input = format!(
        "Hello\n/help\n/frobnicate now\n/system\n/save {f}\n/clear\n/stats\n/load {f}\n/stats\nAnd again\n/quit\nnever read\n"
    );
    let (out, err) = chat("qwen3_moe", &input, &["--system", "Be brief."]);
    let answers: Vec<&str> = out.lines().collect();
    assert_eq!(answers.len(), 2, "only the two messages reach the model: {out:?}\n{err}");
    assert_eq!(out, plain, "the loaded conversation continues exactly as the one that was never saved");
    assert!(err.contains("/save FILE"), "/help lists the commands: {err}");
    assert!(err.contains("unknown command /frobnicate"), "{err}");
    assert!(err.contains("system prompt: Be brief."), "{err}");
    assert!(err.contains("conversation: 0 messages"), "/clear empties it: {err}");
    assert!(err.contains("conversation: 2 messages"), "/load restores it: {err}");
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let roles: Vec<&str> = saved["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant"]);
    assert_eq!(saved["messages"][0]["content"], "Be brief.");
    assert_eq!(saved["messages"][1]["content"], "Hello");
    assert_eq!(saved["messages"][2]["content"], answers[0].trim());

    // /system changes the prompt for the next answer and keeps the conversation.
    let (_, err) = chat("qwen3_moe", "Hello\n/system Answer in French.\n/system\n/stats\n", &[]);
    assert!(err.contains("system prompt: Answer in French.") && err.contains("conversation: 2 messages"), "{err}");
    // A file that is not a conversation: one line, and the chat goes on.
    std::fs::write(&file, "[{\"role\": \"tool\", \"content\": \"x\"}]").unwrap();
    let (out, err) = chat("qwen3_moe", &format!("/load {f}\nHello\n"), &[]);
    assert!(err.contains("role \"tool\""), "{err}");
    assert_eq!(out.lines().count(), 1, "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The number in "(restored the cache of N tokens ...)" and in /stats' "reused N cached
/// tokens", from stderr.
pub(crate) fn numbers_after(err: &str, marker: &str) -> Vec<usize> {
    err.match_indices(marker)
        .filter_map(|(i, _)| err[i + marker.len()..].split_whitespace().next()?.parse().ok())
        .collect()
}

/// Two turns in one run against one turn, a restart, `/load` and the second turn: the
/// same answers, and the second prompt's cache restored from disk (nothing re-prefilled).
/// Returns (scratch dir, data dir, the /load command, the second answer, the tokens the
/// second turn reused after the restart).
pub(crate) fn continues_after_a_restart(model: &str, extra: &[&str]) -> (PathBuf, PathBuf, String, String, usize) {
    let dir = scratch(&format!("kv-restart-{model}-{}", extra.len()));
    let (data, fresh) = (dir.join("data"), dir.join("fresh"));
    let f = dir.join("chat.json").display().to_string();
    let args = [&["--system", "Be brief."], extra].concat();
    // Uninterrupted: two turns in one run (the second reuses the first's cache in memory).
    let (plain, err) = chat_in(&fresh, model, "Hello\nAnd again\n/stats\n", &args);
    let in_memory = numbers_after(&err, "the last prompt reused ");
    // A Gated DeltaNet model's second prompt cuts the first answer (a fixture's random
    // answer does not tokenize back to the ids it generated): its state goes back to where
    // the first prompt ended (the snapshot there), so that much is reused in memory too.
    assert!(in_memory.len() == 1 && in_memory[0] > 0, "{err}");
    let recurrent = model.contains("next");
    // One turn, saved; a new process loads the conversation and finds its cache on disk.
    let (first, _) = chat_in(&data, model, &format!("Hello\n/save {f}\n"), &args);
    let files: Vec<_> = std::fs::read_dir(data.join("colibri/kv")).unwrap().collect();
    assert_eq!(files.len(), 1, "one model's directory of caches");
    let load = format!("/load {f}\nAnd again\n/stats\n");
    let (second, err) = chat_in(&data, model, &load, &args);
    assert_eq!(format!("{first}{second}"), plain, "the same answers as without the restart");
    // A file keeps the snapshot where the first prompt ended (its record split there; the
    // GPU's read back with it), so a Gated DeltaNet model restores as much as it reused in
    // memory: it restores the file's ids that the prompt shares, and says that the state
    // holds the first of them, where the first prompt ended.
    let reused = in_memory.clone();
    let restored = numbers_after(&err, "restored the cache of ");
    if recurrent {
        assert!(restored.len() == 1 && restored[0] >= reused[0], "{err}");
        assert!(err.contains(&format!("recurrent state holds {} of them", reused[0])), "{err}");
    } else {
        assert_eq!(restored, in_memory, "zero re-prefill: {err}");
    }
    assert_eq!(numbers_after(&err, "the last prompt reused "), reused, "{err}");
    (dir, data, load, second, reused[0])
}

/// A Gated DeltaNet model's conversation (whose fixture's second prompt cuts the first
/// answer) restores from disk up to where the first prompt ended, as in memory: the file
/// kept that snapshot.
#[test]
fn a_recurrent_conversation_restores_up_to_its_prompts_end() {
    let (dir, ..) = continues_after_a_restart("qwen3_next", &[]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model whose state goes back only to snapshots (Gated DeltaNet, DeepSeek-V4): the
/// first prompt's pass ends after the system prompt, so the conversation after /clear
/// (the same system prompt) keeps it, with the answer of a fresh run.
#[test]
fn after_clear_a_recurrent_model_keeps_the_system_prompt() {
    let sys = ["--system", "You answer questions about animals, briefly, and always politely."];
    for model in ["qwen3_5_moe", "deepseek_v4"] {
        let (out, err) = chat(model, "Hello there\n/clear\nWhat do owls eat?\n/stats\n", &sys);
        let reused = numbers_after(&err, "the last prompt reused ");
        assert!(reused.len() == 1 && reused[0] > 10, "{model}: {err}");
        let (alone, _) = chat(model, "What do owls eat?\n", &sys);
        assert_eq!(out.lines().nth(1), alone.lines().next(), "{model}: the same answer as a fresh run");
    }
}

#[test]
fn a_conversation_continues_after_a_restart_from_its_cache_on_disk() {
    let sys = ["--system", "Be brief."];
    let (dir, data, load, second, _) = continues_after_a_restart("qwen3_moe", &[]);
    // Corrupt cache files: one warning line each (their lengths no longer match their
    // records, so each is refused before it is read), not used, the same answer.
    let mut corrupted = 0;
    for model_dir in std::fs::read_dir(data.join("colibri/kv")).unwrap() {
        for file in std::fs::read_dir(model_dir.unwrap().path()).unwrap() {
            corrupted += 1;
            let p = file.unwrap().path();
            let len = std::fs::metadata(&p).unwrap().len();
            std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(len - 3).unwrap();
        }
    }
    let (again, err) = chat_in(&data, "qwen3_moe", &load, &sys);
    assert_eq!(again, second);
    assert_eq!(err.matches("warning: ignoring the KV cache file").count(), corrupted, "{err}");
    assert!(!err.contains("restored the cache"), "{err}");
    assert_eq!(numbers_after(&err, "the last prompt reused "), [0], "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Chunks of a child's pipe, read on a thread.
fn reader(mut pipe: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 || tx.send(String::from_utf8_lossy(&buf[..n]).into_owned()).is_err() {
                break;
            }
        }
    });
    rx
}

/// Reads from `rx` into `seen` until `done(seen)` or the deadline.
fn wait_for(rx: &Receiver<String>, seen: &mut String, done: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done(seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out; so far: {seen:?}");
        if let Ok(chunk) = rx.recv_timeout(left) {
            seen.push_str(&chunk);
        }
    }
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_the_answer_and_keeps_the_conversation() {
    // A random model with a long context and long answers (mixtral fixture: about 300
    // tokens before its end token), so a Ctrl-C sent at the answer's first bytes lands
    // while it is still being generated; an answer that beat the signal is retried.
    // Its own data directory: a conversation cache another run left must not answer here.
    let data = scratch("ctrl-c-data");
    let mut child = spawn_chat(&data, &fixture("mixtral"), &["--max-new-tokens", "100000", "--temperature", "0"]);
    let mut stdin = child.stdin.take().unwrap();
    let out = reader(child.stdout.take().unwrap());
    let err = reader(child.stderr.take().unwrap());
    let (mut seen_out, mut seen_err) = (String::new(), String::new());
    wait_for(&err, &mut seen_err, |s| s.contains("/help lists the commands"));
    let mut asked = 0;
    // /stats (on stderr, after the answer) says how the answer ended.
    while !seen_err.contains("ended by cancelled") {
        assert!(asked < 8, "no answer was stopped in {asked} tries: {seen_out:?}");
        asked += 1;
        let before = seen_out.len();
        stdin.write_all(b"Tell me everything\n").unwrap();
        wait_for(&out, &mut seen_out, |s| s.len() > before);
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        // /stats answers once the answer has ended, stopped or not.
        stdin.write_all(b"/stats\n").unwrap();
        let marks = seen_err.matches("conversation:").count();
        wait_for(&err, &mut seen_err, |s| s.matches("conversation:").count() > marks);
    }
    eprintln!("stopped after {asked} question(s)");
    // Still running, and the stopped answer is part of the conversation.
    let last = seen_err.rsplit("conversation: ").next().unwrap();
    assert!(last.starts_with(&format!("{} messages", 2 * asked)), "{seen_err}");
    stdin.write_all(b"Hello\n").unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}\n{seen_err}");
    while let Ok(chunk) = out.recv_timeout(Duration::from_secs(5)) {
        seen_out.push_str(&chunk);
    }
    assert_eq!(seen_out.matches(" [stopped]\n").count(), 1, "{seen_out:?}");
    let after = seen_out.rsplit(" [stopped]").next().unwrap();
    assert!(after.trim().len() > 1, "an answer after the stopped one: {seen_out:?}");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn a_conversation_past_the_context_drops_its_oldest_turns() {
    // The demo checkpoint with its context cut to 200 tokens: each worked addition is
    // about 55 tokens, so six of them overflow it.
    let dir = scratch("context");
    let model = dir.join("demo-small");
    std::fs::create_dir_all(&model).unwrap();
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/demo-hf");
    for e in std::fs::read_dir(&demo).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, model.join(p.file_name().unwrap())).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model.join("config.json")).unwrap()).unwrap();
    cfg["max_position_embeddings"] = serde_json::json!(200);
    std::fs::write(model.join("config.json"), cfg.to_string()).unwrap();
    let sums = [(23, 45), (31, 27), (56, 18), (64, 29), (47, 38), (12, 79)];
    let input: String = sums.iter().map(|(a, b)| format!("What is {a} + {b}?\n")).collect::<String>() + "/stats\n";
    let mut child = spawn_chat(
        &dir.join("data"),
        &model,
        &["--max-new-tokens", "48", "--temperature", "0", "--system", "Answer briefly."],
    );
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    assert!(out.status.success(), "{stderr}");
    let answers: Vec<&str> = stdout.lines().collect();
    assert_eq!(answers.len(), sums.len(), "{stdout}\n{stderr}");
    for ((a, b), got) in sums.iter().zip(&answers) {
        assert!(got.ends_with(&format!("So {a} + {b} = {}.", a + b)), "{got:?}\n{stderr}");
    }
    assert!(
        stderr.contains("no longer fits the model's context of 200 tokens: dropped the ")
            && stderr.contains("oldest messages, kept the system prompt"),
        "{stderr}"
    );
    // What the conversation holds now is what the model saw: fewer than all 12 messages.
    let held: usize = stderr
        .lines()
        .find_map(|l| l.split("conversation: ").nth(1))
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("/stats names the conversation's length");
    assert!(held < 12 && held.is_multiple_of(2), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The number after `marker` in the last /stats block of `err` (as f64).
fn last_stat(err: &str, marker: &str) -> f64 {
    let block = err.rsplit("last answer: ").next().unwrap();
    let at = block.find(marker).unwrap_or_else(|| panic!("no {marker:?} in {block:?}")) + marker.len();
    block[at..].split(|c: char| c != '.' && !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// A Ctrl-C during a long prompt's prefill (about 3,400 tokens, one forward pass before
/// chunked prefill) stops it at the next chunk: the answer ends cancelled with no token,
/// long before the whole prefill would have ended (before, it ran to its end and the
/// answer stopped at its first token).
#[cfg(unix)]
#[test]
fn ctrl_c_during_a_long_prefill_stops_it() {
    let data = scratch("prefill-ctrl-c");
    let mut child = spawn_chat(&data, &fixture("olmoe"), &["--max-new-tokens", "4", "--temperature", "0"]);
    let mut stdin = child.stdin.take().unwrap();
    let _out = reader(child.stdout.take().unwrap());
    let err = reader(child.stderr.take().unwrap());
    let mut seen = String::new();
    wait_for(&err, &mut seen, |s| s.contains("/help lists the commands"));
    let message =
        |salt: &str| format!("{}\n", format!("{salt} the cat sat on the mat and then some more words. ").repeat(140));
    // The whole prefill, measured: the first token comes after it.
    stdin.write_all(message("first").as_bytes()).unwrap();
    stdin.write_all(b"/stats\n/clear\n").unwrap();
    wait_for(&err, &mut seen, |s| s.contains("conversation:"));
    let whole = last_stat(&seen, "first token after ");
    // About 16 chunks of 256 positions: a stop at the next chunk ends far sooner than the
    // whole prefill whatever the machine's speed (the times below are relative to it).
    assert!(whole > 0.4, "the prefill takes only {whole} s: too short to tell\n{seen}");
    // Another prompt (nothing of it cached), stopped a tenth of the way into its prefill.
    stdin.write_all(message("second").as_bytes()).unwrap();
    std::thread::sleep(Duration::from_secs_f64(whole / 10.0));
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    stdin.write_all(b"/stats\n").unwrap();
    wait_for(&err, &mut seen, |s| s.matches("conversation:").count() == 2);
    let last = seen.rsplit("last answer: ").next().unwrap();
    assert!(last.contains("ended by cancelled"), "{seen}");
    assert_eq!(last_stat(&seen, ""), 0.0, "tokens produced after the Ctrl-C: {seen}");
    let took = last_stat(&seen, "tokens in ");
    // A tenth of the prefill, then at most one more chunk (a sixteenth), with room for a
    // loaded machine; the old one-pass prefill ran to its end (took >= whole).
    assert!(took < whole * 0.6, "the stopped prefill took {took} s; the whole one takes {whole} s");
    drop(stdin);
    assert!(child.wait().unwrap().success(), "{seen}");
    let _ = std::fs::remove_dir_all(&data);
}
