//! `coli generate` and Ctrl-C (issue 29): a SIGINT during the generation stops it, prints
//! what was generated and a newline, says so on stderr and exits with 130 (it used to
//! end the process by the signal, losing the line's end). A real process, a real signal.
#![cfg(unix)]

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
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

/// Everything `rx` still delivers until its writer closes.
fn drain(rx: &Receiver<String>, seen: &mut String) {
    while let Ok(chunk) = rx.recv_timeout(Duration::from_secs(60)) {
        seen.push_str(&chunk);
    }
}

#[test]
fn ctrl_c_stops_generate_prints_what_it_made_and_exits_130() {
    // A random model with a long context, asked for far more tokens than it makes before
    // the Ctrl-C that follows its first output; a generation that ends before the signal
    // lands (a loaded machine) is counted and run again.
    for attempt in 1..=5 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_coli"))
            .args(["generate", "--model"])
            .arg(fixture("mixtral"))
            .args([
                "--prompt",
                "Tell me everything",
                "--max-new-tokens",
                "100000",
                "--ignore-eos",
                "--temperature",
                "0",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = reader(child.stdout.take().unwrap());
        let err = reader(child.stderr.take().unwrap());
        let (mut seen_out, mut seen_err) = (String::new(), String::new());
        let deadline = Instant::now() + Duration::from_secs(120);
        while seen_out.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no output in 120 s");
            match out.recv_timeout(left) {
                Ok(chunk) => seen_out.push_str(&chunk),
                Err(_) => break,
            }
        }
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let status = child.wait().unwrap();
        drain(&out, &mut seen_out);
        drain(&err, &mut seen_err);
        if status.success() {
            eprintln!("attempt {attempt}: the generation ended before the Ctrl-C ({seen_err})");
            continue;
        }
        assert_eq!(status.signal(), None, "killed by the signal: {status:?}; stderr: {seen_err}");
        assert_eq!(status.code(), Some(130), "stderr: {seen_err}");
        assert!(seen_out.ends_with('\n') && !seen_out.trim().is_empty(), "{seen_out:?}");
        let n: usize = seen_err
            .split("stopped by Ctrl-C after ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{seen_err}"));
        assert!((1..100_000).contains(&n), "{seen_err}");
        assert!(!seen_err.contains("panicked"), "{seen_err}");
        eprintln!("stopped after {n} tokens (attempt {attempt})");
        return;
    }
    panic!("no generation was stopped in 5 tries");
}

/// A Ctrl-C while a long prompt is read stops it at the next chunk: `coli generate` feeds
/// its prompt in PREFILL_CHUNK pieces (before, one pass ran to its end whatever came).
/// The signal is timed from a first run's load and prefill times; one that lands before
/// the handler is in place (still loading) or after the prefill (a loaded machine) is
/// counted and the run tried again.
#[test]
fn ctrl_c_during_a_long_prompt_stops_generate_at_the_next_chunk() {
    let ids: Vec<String> = (0..4000u32).map(|i| ((i * 7919 + 1) % 400).to_string()).collect();
    let run = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_coli"));
        c.args(["generate", "--model"])
            .arg(fixture("olmoe"))
            .args(["--ids", &ids.join(","), "--max-new-tokens", "4", "--temperature", "0", "--ignore-eos", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let t = Instant::now();
    let first = run().output().unwrap();
    let wall = t.elapsed().as_secs_f64();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let v: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    // The prefill: the first token comes after it.
    let whole = v["ttft_ms"].as_f64().unwrap() / 1e3;
    assert!(whole > 0.4, "the prefill takes only {whole} s: too short to tell");
    let load = (wall - whole).max(0.0);
    for attempt in 1..=5 {
        let child = run().spawn().unwrap();
        std::thread::sleep(Duration::from_secs_f64(load + whole / 10.0));
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let out = child.wait_with_output().unwrap();
        if out.status.signal().is_some() {
            eprintln!("attempt {attempt}: the Ctrl-C came while the model was loading");
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if !v["ids"].as_array().unwrap().is_empty() {
            eprintln!("attempt {attempt}: the Ctrl-C came after the prefill: {v}");
            continue;
        }
        assert_eq!(out.status.code(), Some(130));
        assert_eq!(v["finish_reason"], "cancelled", "{v}");
        // The time spent generating (no token: until it stopped).
        let took = v["ttft_ms"].as_f64().unwrap() / 1e3;
        eprintln!("the whole prefill takes {whole:.2} s; stopped a tenth in, it ran {took:.2} s (attempt {attempt})");
        // A tenth of the prefill, then at most one more chunk (a sixteenth), with room for
        // a loaded machine; one pass over the whole prompt took all of it.
        assert!(took < whole * 0.6, "the stopped prefill ran {took} s; the whole one takes {whole} s");
        return;
    }
    panic!("no prefill was stopped in 5 tries");
}
