//! The helper under attack and under careless use: broken models in the models
//! directory, runaway chat templates, slow and greedy clients, files truncated while
//! served, and big prompts that must not stall /health or file ranges.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::json;

use super::*;

fn write_config(dir: &Path, key: &str, value: serde_json::Value) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v[key] = value;
    std::fs::write(p, serde_json::to_vec(&v).unwrap()).unwrap();
}

/// Copies of the fixture with one thing broken each: (id, what the error must mention).
fn plant_mutants(models: &Path) -> Vec<(&'static str, &'static str)> {
    let mutant = |id: &str| {
        let d = models.join(id);
        copy_dir(&fixture(MODEL), &d);
        d
    };
    write_config(&mutant("layers-2e40"), "num_hidden_layers", (1u64 << 40).into());
    write_config(&mutant("hidden-2e40"), "hidden_size", (1u64 << 40).into());
    write_config(&mutant("experts-max"), "num_experts", u64::MAX.into());
    write_config(&mutant("layers-3"), "num_hidden_layers", 3.into());
    write_config(&mutant("vocab-small"), "vocab_size", 77.into());
    std::fs::write(mutant("bad-json").join("config.json"), b"{\"model_type\": \"olmoe\", ").unwrap();
    let d = mutant("cut-weights");
    let w = std::fs::read(d.join("model.safetensors")).unwrap();
    std::fs::write(d.join("model.safetensors"), &w[..100]).unwrap();
    // A directory of symlinks to itself (listing it must not explode).
    let d = mutant("loops");
    #[cfg(unix)]
    for i in 0..40 {
        std::os::unix::fs::symlink(".", d.join(format!("l{i}"))).unwrap();
    }
    vec![
        ("layers-2e40", "num_hidden_layers"),
        ("hidden-2e40", "hidden_size"),
        ("experts-max", "num_experts"),
        ("layers-3", "model.layers.2"),
        ("vocab-small", "embed_tokens"),
        ("bad-json", "JSON"),
        ("cut-weights", "header"),
    ]
}

#[test]
fn broken_models_are_listed_with_their_reason_and_never_take_the_server_down() {
    let mut cases = Vec::new();
    let s = start_with("mutants", |_| {}, |_| {}, |dir| cases = plant_mutants(&dir.join("models")));
    let t = Instant::now();
    let list = s.get("/api/models", &[]);
    assert_eq!(list.status, 200, "{}", list.text());
    assert!(t.elapsed() < Duration::from_secs(10), "/api/models took {:?}", t.elapsed());
    let list = list.json();
    let entry = |id: &str| list["data"].as_array().unwrap().iter().find(|m| m["id"] == id).cloned();
    for (id, needle) in &cases {
        let m = entry(id).unwrap_or_else(|| panic!("{id} is not listed: {list}"));
        assert_eq!(m["supported"], false, "{id}: {m}");
        let e = m["error"].as_str().unwrap_or_default();
        assert!(e.contains(needle), "{id}: {e:?} does not mention {needle:?}");
        assert_eq!(e.lines().count(), 1, "{id}: one line: {e:?}");
    }
    let good = entry(MODEL).unwrap();
    assert_eq!(good["supported"], true, "{good}");
    let looped = entry("loops").unwrap();
    assert!(looped["files"].as_array().unwrap().len() < 100, "each directory is listed once");
    let v1 = s.get("/v1/models", &[]).json();
    for (id, _) in &cases {
        let m = v1["data"].as_array().unwrap().iter().find(|m| m["id"] == *id).unwrap();
        assert!(m["colibri"]["error"].is_string(), "{m}");
    }
    for (id, _) in &cases {
        let r = s.get(&format!("/api/usage/{id}"), &[]);
        assert!((400..500).contains(&r.status), "{id}: {} {}", r.status, r.text());
        assert!(r.json()["error"]["message"].is_string());
        let r = s.post("/api/usage", &format!(r#"{{"model": "{id}", "counts": [[0, 0, 1]]}}"#));
        assert!((400..500).contains(&r.status), "{id}: {} {}", r.status, r.text());
        let r = s.post("/v1/completions", &format!(r#"{{"model": "{id}", "prompt": [1, 2], "max_tokens": 1}}"#));
        assert!((400..500).contains(&r.status), "{id}: {} {}", r.status, r.text());
        assert!(r.json()["error"]["message"].as_str().unwrap().contains("could not load"), "{}", r.text());
    }
    assert_eq!(s.get("/health", &[]).status, 200);
    let r = s.post("/v1/completions", r#"{"model": "olmoe", "prompt": [1, 2], "max_tokens": 2, "temperature": 0}"#);
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_chat_template_that_never_ends_is_stopped_with_an_error() {
    let s = start_with(
        "template",
        |_| {},
        |_| {},
        |dir| {
            let m = dir.join("models").join(MODEL);
            let p = m.join("tokenizer_config.json");
            let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            v["chat_template"] =
                "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i %}{% endfor %}{% endfor %}"
                    .into();
            std::fs::write(p, serde_json::to_vec(&v).unwrap()).unwrap();
        },
    );
    let t = Instant::now();
    let r = s.post("/v1/chat/completions", r#"{"model": "olmoe", "messages": [{"role": "user", "content": "hi"}]}"#);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("fuel"), "{}", r.text());
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    assert_eq!(s.get("/health", &[]).status, 200);
}

#[test]
fn slow_and_greedy_clients_cannot_lock_others_out() {
    let s = start_with(
        "slow",
        |_| {},
        |l| {
            l.max_connections = 8;
            l.max_connections_per_client = 6;
            l.body_timeout = Duration::from_secs(1);
            l.header_read_timeout = Duration::from_secs(1);
            l.evict_grace = Duration::from_millis(300);
        },
        |_| {},
    );
    let port = s.addr.port();
    let host = format!("127.0.0.1:{port}");
    // A Content-Length over the limit is refused before a byte of the body is read.
    let mut c = Conn::open(s.addr).unwrap();
    c.send_raw(format!("POST /api/usage HTTP/1.1\r\nHost: {host}\r\nContent-Length: 100000000\r\n\r\n").as_bytes())
        .unwrap();
    let t = Instant::now();
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 413);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("at most"));
    assert!(t.elapsed() < Duration::from_secs(2));
    // A body that trickles in is cut off after body_timeout.
    let mut c = Conn::open(s.addr).unwrap();
    c.send_raw(format!("POST /api/usage HTTP/1.1\r\nHost: {host}\r\nContent-Length: 50\r\n\r\n{{").as_bytes()).unwrap();
    let t = Instant::now();
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 408, "{}", r.text());
    assert!(t.elapsed() < Duration::from_secs(5));
    // A kept-alive connection that sits idle is closed after header_read_timeout.
    let mut c = Conn::open(s.addr).unwrap();
    c.send("GET", "/health", &[], b"").unwrap();
    assert_eq!(c.read_response(false).unwrap().status, 200);
    std::thread::sleep(Duration::from_millis(2500));
    let mut buf = [0u8; 1];
    assert!(matches!(c.stream().read(&mut buf), Ok(0) | Err(_)), "the idle connection is closed");
    // One client may not hold more than its share: its oldest connection makes room.
    let mut mine: Vec<Conn> = (0..6).map(|_| Conn::open(s.addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(s.get("/health", &[]).status, 200);
    mine[0].stream().set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(matches!(mine[0].stream().read(&mut buf), Ok(0) | Err(_)), "the oldest connection is closed");
    drop(mine);
    std::thread::sleep(Duration::from_millis(300));
    // Connections that hold their slot (a request head that never ends, a body that
    // never comes): at capacity the oldest is closed and a newcomer gets in at once.
    let mut hogs = Vec::new();
    for i in 0..12 {
        let mut c = std::net::TcpStream::connect(s.addr).unwrap();
        let req = if i % 2 == 0 {
            format!("GET /health HTTP/1.1\r\nHost: {host}\r\n")
        } else {
            format!("POST /api/usage HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1000\r\n\r\n{{")
        };
        let _ = c.write_all(req.as_bytes());
        hogs.push(c);
    }
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    assert_eq!(s.get("/health", &[]).status, 200);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

/// A client that asks for more than the socket buffers hold and then stops reading: the
/// server's writes stall, and after `write_timeout` the connection is closed instead of
/// being held (with its file, or its generation) forever.
#[test]
fn a_client_that_stops_reading_is_cut_off_by_the_write_timeout() {
    let s = start_with("stalled", |_| {}, |l| l.write_timeout = Duration::from_secs(1), |_| {});
    let host = format!("127.0.0.1:{}", s.addr.port());
    // Ten pipelined requests for the whole 3 MiB file: far more than loopback buffers take.
    let n = 10;
    let mut c = std::net::TcpStream::connect(s.addr).unwrap();
    let req = format!("GET /models/{MODEL}/{DATA} HTTP/1.1\r\nHost: {host}\r\n\r\n");
    c.write_all(req.repeat(n).as_bytes()).unwrap();
    // Not reading for well over the write timeout.
    std::thread::sleep(Duration::from_secs(4));
    let t = Instant::now();
    loop {
        let open = s.health()["connections"].as_u64().unwrap();
        // The /health request's own connection is the only one left.
        if open == 1 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "the stalled connection is still open ({open} open)");
        std::thread::sleep(Duration::from_millis(100));
    }
    // What the client can still read is what was buffered, then the end of the stream.
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut got, mut buf) = (0usize, vec![0u8; 1 << 16]);
    let ended = loop {
        match c.read(&mut buf) {
            Ok(0) => break true,
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    assert!(ended, "the connection was not closed (read {got} bytes, then a read timed out)");
    assert!(got < n * DATA_LEN, "all {got} bytes arrived: the writes never stalled");
    assert_eq!(s.get("/health", &[]).status, 200);
}

/// The demo model (a converted container with a tokenizer) under `models/demo`.
fn with_demo(dir: &Path) {
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo"), &dir.join("models/demo"));
}

#[test]
fn a_model_file_truncated_while_served_gives_errors_not_a_signal() {
    let s = start_with("truncate", |a| a.ram = Some(0), |_| {}, with_demo);
    let gen = r#"{"model": "demo", "prompt": "In the beginning", "max_tokens": 4, "temperature": 0}"#;
    let r = s.post("/v1/completions", gen);
    assert_eq!(r.status, 200, "{}", r.text());
    let data = s.dir.join("models/demo/weights.bin");
    let len = std::fs::metadata(&data).unwrap().len();
    // A range the browser would fetch, then the file shrinks under the server.
    let r = s.get("/models/demo/weights.bin", &[("Range", &format!("bytes={}-{}", len - 8192, len - 1))]);
    assert_eq!(r.status, 206);
    std::fs::OpenOptions::new().write(true).open(&data).unwrap().set_len(len / 2).unwrap();
    let r = s.post("/v1/completions", gen);
    assert!(r.status >= 400, "{}", r.text());
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("truncated"), "{}", r.text());
    let r = s.get("/models/demo/weights.bin", &[("Range", &format!("bytes={}-{}", len - 8192, len - 1))]);
    assert_eq!(r.status, 416);
    assert_eq!(s.get("/health", &[]).status, 200);
}

#[test]
fn cross_site_requests_and_a_second_host_header_are_refused() {
    let s = start("fetchsite", |a| a.allow_origins = vec!["https://app.example".into()]);
    let port = s.addr.port();
    let file = format!("/models/{MODEL}/config.json");
    for site in ["cross-site", "same-site"] {
        let r = s.get(&file, &[("Sec-Fetch-Site", site), ("Sec-Fetch-Mode", "no-cors")]);
        assert_eq!(r.status, 403, "{site}");
        assert_eq!(r.json()["error"]["type"], "forbidden");
        assert_eq!(s.get("/api/usage/olmoe", &[("Sec-Fetch-Site", site)]).status, 403);
    }
    assert_eq!(s.get(&file, &[("Sec-Fetch-Site", "cross-site"), ("Origin", "https://app.example")]).status, 200);
    assert_eq!(s.get(&file, &[("Sec-Fetch-Site", "same-origin")]).status, 200);
    assert_eq!(s.get(&file, &[("Sec-Fetch-Site", "none")]).status, 200);
    let r = s.raw(&format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil.example\r\n\r\n"));
    assert_eq!(r.status, 400);
}

/// The load test of issue #14: 4 clients send maximum-size prompts (4 MiB of text to be
/// tokenized) while /health and a Range request are timed. Prints the latencies.
#[test]
fn health_and_ranges_stay_quick_while_big_prompts_are_tokenized() {
    let s = start_with("bigprompts", |_| {}, |_| {}, with_demo);
    let addr = s.addr;
    let prompt = "And the earth was without form, and void. ".repeat((super::super::openai::MAX_BODY - 1024) / 43);
    let body = serde_json::to_vec(&serde_json::json!({"model": "demo", "prompt": prompt, "max_tokens": 1})).unwrap();
    assert!(body.len() <= super::super::openai::MAX_BODY);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let senders: Vec<_> = (0..4)
        .map(|_| {
            let (body, done) = (body.clone(), done.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = client::request(
                        addr,
                        "POST",
                        "/v1/completions",
                        &[("Content-Type", "application/json")],
                        &body,
                    )
                    .unwrap();
                    assert!(r.status == 400 || r.status == 200, "{} {}", r.status, r.text());
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (mut health, mut range) = (Vec::new(), Vec::new());
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(8) {
        let t0 = Instant::now();
        assert_eq!(s.get("/health", &[]).status, 200);
        health.push(t0.elapsed());
        let t0 = Instant::now();
        let r = s.get("/models/demo/weights.bin", &[("Range", "bytes=4096-8191")]);
        assert_eq!(r.status, 206);
        range.push(t0.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let prompts: usize = senders.into_iter().map(|h| h.join().unwrap()).sum();
    let pct = |v: &mut Vec<Duration>, p: f64| {
        v.sort();
        v[((v.len() - 1) as f64 * p) as usize]
    };
    let (h50, h99, r50, r99) =
        (pct(&mut health, 0.5), pct(&mut health, 0.99), pct(&mut range, 0.5), pct(&mut range, 0.99));
    eprintln!(
        "load: {prompts} max-size prompts; /health p50 {h50:?} p99 {h99:?}; 4 KiB range p50 {r50:?} p99 {r99:?} ({} samples)",
        health.len()
    );
    assert!(prompts >= 4, "the prompts were sent");
    // The issue's target is 50 ms at p99 on a quiet machine; this machine is shared with
    // compilers, so the test only fails on a real stall.
    assert!(h99 < Duration::from_secs(1) && r99 < Duration::from_secs(1), "health p99 {h99:?}, range p99 {r99:?}");
}

/// Sends `req` on a new connection and reads until some of the response has come.
fn begin(s: &TestServer, req: &str) -> (std::net::TcpStream, Vec<u8>) {
    let mut c = std::net::TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    c.write_all(req.as_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = c.read(&mut buf).unwrap();
    assert!(n > 0);
    buf.truncate(n);
    (c, buf)
}

/// A flood of connections from the client's own address (issue #29: about 200 a second
/// cut another client's stream) closes idle connections only: a download read slowly and
/// a streamed generation, both in progress, arrive whole. When every connection an address
/// may hold has a response in progress, a newcomer gets a 503 and the others go on.
#[test]
fn a_connection_flood_never_cuts_a_response_in_progress() {
    let s = start_with(
        "flood",
        |_| {},
        |l| {
            l.max_connections = 8;
            l.max_connections_per_client = 6;
            l.evict_grace = Duration::from_millis(300);
            l.header_read_timeout = Duration::from_secs(2);
        },
        |_| {},
    );
    let host = format!("127.0.0.1:{}", s.addr.port());
    let (mut download, mut got) =
        begin(&s, &format!("GET /models/{MODEL}/{DATA} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"));
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Count."}], "stream": true,
                      "max_tokens": 3000, "ignore_eos": true, "temperature": 0})
    .to_string();
    let (mut stream, mut events) = begin(
        &s,
        &format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    // 200 connections, one every 5 ms, half with a request head begun; all kept open.
    let mut flood = Vec::new();
    for i in 0..200 {
        let mut c = std::net::TcpStream::connect(s.addr).unwrap();
        if i % 2 == 0 {
            let _ = c.write_all(b"GET /health HTTP/1.1\r\n");
        }
        flood.push(c);
        std::thread::sleep(Duration::from_millis(5));
    }
    download.read_to_end(&mut got).unwrap();
    let at = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(got.len() - at, DATA_LEN, "the download was cut");
    assert!(got[at..] == data_bytes()[..]);
    stream.read_to_end(&mut events).unwrap();
    let text = String::from_utf8_lossy(&events);
    assert!(
        text.contains("\"finish_reason\":\"length\"")
            && text.contains("data: [DONE]\n\n")
            && text.ends_with("\r\n0\r\n\r\n"),
        "the stream was cut ({} bytes): {:?}",
        text.len(),
        &text[text.len().saturating_sub(600)..]
    );
    drop(flood);
    std::thread::sleep(Duration::from_millis(500));

    // Six streamed generations in progress (one runs, five wait for the model): a seventh
    // connection is refused, and they all finish.
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Count."}], "stream": true,
                      "max_tokens": 300, "ignore_eos": true, "temperature": 0})
    .to_string();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut busy: Vec<_> = (0..6).map(|_| begin(&s, &req)).collect();
    let r = s.get("/health", &[]);
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("too many connections"));
    for (c, got) in &mut busy {
        c.read_to_end(got).unwrap();
        assert!(String::from_utf8_lossy(got).contains("data: [DONE]\n\n"));
    }
    drop(busy);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.get("/health", &[]).status, 200);
}

/// A client that leaves a long `/v1/choose` (64 options of about 100 tokens each) frees
/// the model at once: the next completion is not kept waiting for the scoring to end
/// (issue #29: it waited 44.5 s).
#[test]
fn a_choose_whose_client_left_stops() {
    let s = start("choose-gone", |_| {});
    let host = format!("127.0.0.1:{}", s.addr.port());
    let options: Vec<String> =
        (0..64).map(|i| format!("option {i}: {}", "and then some more words ".repeat(20))).collect();
    let body = json!({"model": MODEL, "prompt": "Pick one.", "options": options, "raw": true}).to_string();
    // How long the whole scoring takes here.
    let t = Instant::now();
    assert_eq!(s.post("/v1/choose", &body).status, 200);
    let whole = t.elapsed();
    let mut c = std::net::TcpStream::connect(s.addr).unwrap();
    let head = format!(
        "POST /v1/choose HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body.as_bytes()).unwrap();
    std::thread::sleep(whole / 5);
    drop(c);
    let t = Instant::now();
    let r = s.post("/v1/completions", &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 1}).to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let waited = t.elapsed();
    assert!(waited < whole / 2, "the next request waited {waited:?}; the whole scoring takes {whole:?}");
}
