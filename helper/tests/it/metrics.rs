//! `GET /metrics` of a real `coli serve`: Prometheus' text format (version 0.0.4) whose
//! counters follow what the server did: one completion of 4 tokens on a converted model.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

/// One HTTP/1.1 request on a new connection: (status, head, body).
fn request(port: u16, method: &str, path: &str, host: &str, body: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let typed = match body.is_empty() {
        true => String::new(),
        false => format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()),
    };
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{typed}\r\n{body}").unwrap();
    // A refused request may be answered and reset at once: keep what arrived.
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw) {
        assert!(!raw.is_empty(), "{method} {path}: {e}");
    }
    let out = String::from_utf8_lossy(&raw).into_owned();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (status, head.to_string(), body.to_string())
}

/// The samples of an exposition text by name with labels, checking its shape on the way:
/// every family has its HELP and TYPE lines before its samples, every sample is
/// `name{labels} number`.
fn parse(text: &str) -> HashMap<String, f64> {
    let (mut helped, mut typed) = (Vec::new(), Vec::new());
    let mut samples = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped.push(rest.split(' ').next().unwrap().to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let name = parts.next().unwrap().to_string();
            assert!(matches!(parts.next(), Some("counter" | "gauge")), "{line}");
            typed.push(name);
        } else {
            let (key, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line:?}"));
            let name = key.split('{').next().unwrap();
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{line}");
            assert!(
                helped.last().map(String::as_str) == Some(name) && typed.last().map(String::as_str) == Some(name),
                "{line}: no HELP/TYPE"
            );
            if let Some(labels) = key.strip_prefix(name) {
                assert!(labels.is_empty() || (labels.starts_with("{model=\"") && labels.ends_with("\"}")), "{line}");
            }
            samples.insert(key.to_string(), value.parse::<f64>().unwrap_or_else(|_| panic!("{line}")));
        }
    }
    samples
}

#[test]
fn metrics_follow_a_completion() {
    let data = std::env::temp_dir().join(format!("coli-metrics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let models = data.join("models");
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/olmoe");
    let out = coli().arg("convert").arg(&fixture).arg("-o").arg(models.join("olmoe")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut child = coli()
        .args(["serve", "--port", "0", "--models-dir"])
        .arg(&models)
        .env("XDG_DATA_HOME", &data)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The reader stays open: the server writes to its stdout.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let port: u16 = first.rsplit(':').next().unwrap().parse().unwrap();
    let host = format!("127.0.0.1:{port}");

    let (status, head, body) = request(port, "GET", "/metrics", &host, "");
    assert_eq!(status, 200, "{body}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
    let before = parse(&body);
    assert_eq!(before["colibri_tokens_generated_total"], 0.0);
    assert!(!before.keys().any(|k| k.contains("model=")), "no model loaded yet: {body}");

    let completion =
        r#"{"model": "olmoe", "prompt": [5, 17, 3, 42], "max_tokens": 4, "temperature": 0, "ignore_eos": true}"#;
    let (status, _, text) = request(port, "POST", "/v1/completions", &host, completion);
    assert_eq!(status, 200, "{text}");

    let (status, _, body) = request(port, "GET", "/metrics", &host, "");
    assert_eq!(status, 200);
    let after = parse(&body);
    assert_eq!(after["colibri_tokens_generated_total"], 4.0, "{body}");
    assert_eq!(after["colibri_generations_finished_total"], 1.0, "{body}");
    assert_eq!(after["colibri_generations_active"], 0.0, "{body}");
    assert!(after["colibri_requests_total"] >= before["colibri_requests_total"] + 2.0, "{body}");
    let m = |name: &str| {
        after.get(&format!("{name}{{model=\"olmoe\"}}")).copied().unwrap_or_else(|| panic!("{name}: {body}"))
    };
    // 4 prompt positions and 3 decode steps routed top-k experts in every layer: each read
    // came from a tier or from disk.
    assert!(
        m("colibri_expert_pinned_hits_total") + m("colibri_expert_ram_hits_total") + m("colibri_expert_misses_total")
            >= 7.0,
        "{body}"
    );
    assert!(m("colibri_expert_cached_bytes") > 0.0, "{body}");
    assert_eq!(m("colibri_model_generations_running"), 0.0);
    assert_eq!(m("colibri_kv_conversations"), 1.0, "the conversation's cache is kept: {body}");
    assert!(m("colibri_kv_bytes") > 0.0);

    // The same origin and host rules as every other route.
    assert_eq!(request(port, "GET", "/metrics", "attacker.example", "").0, 403);
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&data);
}
