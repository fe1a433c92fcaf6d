//! What a new user meets in the first hour of `coli` (issue 36): `generate --chat` answers
//! to the end or says it was cut, negative numbers reach their range check, each error
//! says its cause once, `serve`'s log is plain text in a file, `--version` names the
//! commit, and the sampling flags do what they say. Real processes on the demo model.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-first-hour-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `coli` with its data and models directories in a scratch folder.
fn coli(tag: &str) -> Command {
    let home = scratch(tag);
    let mut c = Command::new(env!("CARGO_BIN_EXE_coli"));
    c.env("COLI_HOME", home.join("coli")).env("XDG_DATA_HOME", home.join("data"));
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

/// A failure with one line on stderr that contains `needle`.
fn one_line_failure(out: &Output, needle: &str) -> String {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "succeeded: {err}");
    assert!(err.contains(needle), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn generate_chat_runs_to_the_end_of_the_answer_or_says_it_was_cut() {
    let q = ["generate", "--model", "demo", "--chat", "--prompt", "What is 84 + 17?", "--temperature", "0"];
    // The whole worked answer (once cut at 32 tokens: "So 84 -"), nothing on stderr.
    let out = coli("chat-full").args(q).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).trim_end().ends_with("So 84 + 17 = 101."), "{}", text(&out.stdout));
    assert!(!text(&out.stderr).contains("cut"), "{}", text(&out.stderr));
    let v = json(&coli("chat-json").args(q).arg("--json").output().unwrap());
    assert_eq!(v["finish_reason"], "stop", "{v}");
    // A limit that cuts the answer says so: on stderr, and as finish_reason with --json.
    let out = coli("chat-cut").args(q).args(["--max-new-tokens", "10"]).output().unwrap();
    assert!(out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("cut after 10 tokens by --max-new-tokens"), "{err}");
    let v = json(&coli("chat-cut-json").args(q).args(["--max-new-tokens", "10", "--json"]).output().unwrap());
    assert_eq!((v["finish_reason"].as_str(), v["ids"].as_array().map(Vec::len)), (Some("length"), Some(10)));
}

#[test]
fn negative_numbers_parse_and_get_a_range_error() {
    let base = ["generate", "--model", "demo", "--ids", "1,2,3", "--max-new-tokens", "4", "--json"];
    for (flag, value, needle) in [
        ("--temperature", "-1", "temperature must be a finite number >= 0"),
        ("--top-p", "-0.5", "top_p must be in (0, 1]"),
        ("--repetition-penalty", "-1", "repetition_penalty must be a finite number > 0"),
        ("--presence-penalty", "-3", "presence_penalty must be between -2 and 2"),
    ] {
        let out = coli("negative").args(base).args([flag, value]).output().unwrap();
        let err = one_line_failure(&out, needle);
        assert!(!err.contains("unexpected argument"), "{err}");
        assert!(err.contains(&format!("'{value}'")), "{err}");
    }
    // In range, a negative number is a value like any other.
    let v = json(&coli("negative-ok").args(base).args(["--presence-penalty", "-0.5"]).output().unwrap());
    assert_eq!(v["ids"].as_array().unwrap().len(), 4);
}

#[test]
fn sampling_flags_change_the_output() {
    let base = ["generate", "--model", "demo", "--chat", "--prompt", "What is 23 + 45?", "--max-new-tokens", "24"];
    let ids = |extra: &[&str]| -> Vec<u64> {
        let v = json(&coli("flags").args(base).args(extra).arg("--json").output().unwrap());
        v["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap()).collect()
    };
    let greedy = ids(&["--temperature", "0"]);
    assert_eq!(ids(&["--temperature", "0", "--logit-bias", "100=100"]), vec![100; 24]);
    let banned = ids(&["--temperature", "0", "--logit-bias", &format!("{}=-100", greedy[0])]);
    assert_ne!(banned[0], greedy[0]);
    // The demo model is sure of its answers: at temperature 2 the penalties have room to act.
    let sampled = ids(&["--temperature", "2", "--seed", "5"]);
    assert_eq!(sampled, ids(&["--temperature", "2", "--seed", "5"]), "a seed reproduces");
    for penalty in ["--presence-penalty", "--frequency-penalty"] {
        assert_ne!(sampled, ids(&["--temperature", "2", "--seed", "5", penalty, "2"]), "{penalty}");
    }
    let out = coli("flags-bad").args(base).args(["--logit-bias", "999999=5"]).output().unwrap();
    one_line_failure(&out, "outside the vocabulary");
    let out = coli("flags-bad").args(base).args(["--logit-bias", "5=101"]).output().unwrap();
    one_line_failure(&out, "between -100 and 100");
}

#[cfg(unix)]
#[test]
fn each_error_says_its_cause_once() {
    // A model directory whose config.json is a directory: its reason, once.
    let dir = scratch("cause-once");
    std::fs::create_dir_all(dir.join("m/config.json")).unwrap();
    let out =
        coli("cause-once-run").args(["generate", "--model"]).arg(dir.join("m")).args(["--ids", "1"]).output().unwrap();
    let err = one_line_failure(&out, "not a regular file");
    assert_eq!(err.matches("not a regular file").count(), 1, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // /load of a missing file in `coli chat`: the OS's message once.
    let mut child = coli("cause-once-chat")
        .args(["chat", "--model", "demo"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let missing = dir.join("missing.json");
    writeln!(child.stdin.take().unwrap(), "/load {}", missing.display()).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    let os = std::io::Error::from_raw_os_error(libc::ENOENT).to_string();
    assert!(err.contains("cannot read the conversation"), "{err}");
    assert_eq!(err.matches(&os).count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(unix)]
#[test]
fn serve_logs_are_plain_text_when_redirected() {
    let dir = scratch("serve-log");
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let mut child = coli("serve-log-run")
        .args(["serve", "--port", "0"])
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    // Kept open while the server runs: it prints a second line.
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = stdout.next().unwrap().unwrap();
    let port: u16 = first.rsplit(':').next().unwrap().parse().unwrap_or_else(|_| panic!("{first}"));
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").unwrap();
    s.read_to_string(&mut String::new()).unwrap();
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    let logged = std::fs::read_to_string(dir.join("serve.log")).unwrap();
    assert!(logged.contains("path=/health"), "{logged}");
    assert!(!logged.contains('\x1b'), "colour codes in a log file: {logged:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn version_names_the_commit() {
    let out = coli("version").arg("--version").output().unwrap();
    assert!(out.status.success());
    let v = text(&out.stdout);
    assert!(v.starts_with(&format!("coli {} (", env!("CARGO_PKG_VERSION"))), "{v}");
    // In a git checkout: the commit's short hash and date; elsewhere it says it is unknown.
    let inside = v.split_once('(').and_then(|(_, r)| r.split_once(')')).map(|(c, _)| c).unwrap_or_default();
    let hash = inside.strip_prefix("commit ").and_then(|r| r.split(' ').next());
    assert!(
        hash.is_some_and(|h| h.len() == 12 && h.bytes().all(|b| b.is_ascii_hexdigit())) || inside == "unknown commit",
        "{v}"
    );
}
