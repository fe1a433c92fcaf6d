//! Cancellation of long computations whose client went away (issue #29): a long prompt's
//! prefill stops within one chunk, so the next request does not wait for it to end.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::json;

use super::*;

/// A prompt of `n` token ids of the olmoe fixture (vocabulary 401), distinct per `salt`
/// from its first id on, so that no request reuses another's cache.
fn long_prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7919 + salt * 31 + 1) % 400).collect()
}

/// Sends `body` to `path` on a new connection and hangs up after `after`, without reading.
fn send_and_leave(s: &TestServer, path: &str, body: &str, after: Duration) {
    let mut c = std::net::TcpStream::connect(s.addr).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        s.addr.port(),
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body.as_bytes()).unwrap();
    std::thread::sleep(after);
    c.shutdown(std::net::Shutdown::Both).unwrap();
}

/// A client that sends a 4,000-token prompt and leaves a tenth of the way into its prefill, streamed or not: the
/// next request is answered long before the whole prefill would have ended (before
/// chunked prefill it waited for all of it), and the generation counts as cancelled
/// without producing a token.
#[test]
fn a_client_that_leaves_during_a_long_prefill_frees_the_model() {
    let s = start("prefill-gone", |_| {});
    let n = 4000;
    let short = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 1}).to_string();
    assert_eq!(s.post("/v1/completions", &short).status, 200);
    // How long the whole prefill takes here.
    let t = Instant::now();
    let r =
        s.post("/v1/completions", &json!({"model": MODEL, "prompt": long_prompt(n, 0), "max_tokens": 1}).to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let whole = t.elapsed();
    // 16 chunks of 256 positions: every time below is relative to the whole prefill, so
    // the test holds on a faster machine too.
    assert!(whole > Duration::from_millis(400), "the prefill takes only {whole:?}: too short to tell");
    for (i, stream) in [false, true].into_iter().enumerate() {
        let body = json!({"model": MODEL, "prompt": long_prompt(n, 1 + i as u32), "max_tokens": 8,
                          "stream": stream, "temperature": 0});
        send_and_leave(&s, "/v1/completions", &body.to_string(), whole / 10);
        let t = Instant::now();
        let r = s.post("/v1/completions", &short);
        assert_eq!(r.status, 200, "{}", r.text());
        let waited = t.elapsed();
        eprintln!("stream {stream}: the next request waited {waited:?}; the whole prefill takes {whole:?}");
        assert!(
            waited < whole * 3 / 5,
            "stream {stream}: the next request waited {waited:?}; the whole prefill takes {whole:?}"
        );
        let h = s.health();
        assert_eq!(h["generations"]["cancelled"], 1 + i as u64, "{h}");
        assert_eq!(h["generations"]["active"], 0, "{h}");
    }
    // Only the short requests and the measured one produced tokens.
    assert_eq!(s.health()["generations"]["tokens"], 4);
}

/// A shutdown during a long prefill stops it at the next chunk: the helper exits long
/// before the whole prefill would have ended, and the stream ends with the error event
/// that says why (before chunked prefill the shutdown waited for all of it).
#[test]
fn shutdown_during_a_long_prefill_stops_it() {
    let s = start("prefill-shutdown", |_| {});
    let n = 4000;
    let t = Instant::now();
    let r =
        s.post("/v1/completions", &json!({"model": MODEL, "prompt": long_prompt(n, 0), "max_tokens": 1}).to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let whole = t.elapsed();
    // 16 chunks of 256 positions: every time below is relative to the whole prefill, so
    // the test holds on a faster machine too.
    assert!(whole > Duration::from_millis(400), "the prefill takes only {whole:?}: too short to tell");
    let body = json!({"model": MODEL, "prompt": long_prompt(n, 1), "max_tokens": 8, "stream": true});
    let mut c = Conn::open(s.addr).unwrap();
    c.send("POST", "/v1/completions", &[], body.to_string().as_bytes()).unwrap();
    assert_eq!(c.read_head().unwrap().0, 200);
    std::thread::sleep(whole / 10);
    let t = Instant::now();
    s.stop().unwrap();
    let took = t.elapsed();
    eprintln!("shutdown took {took:?}; the whole prefill takes {whole:?}");
    assert!(took < whole * 3 / 5, "shutdown took {took:?}; the whole prefill takes {whole:?}");
    let mut rest = String::new();
    while let Ok(Some(chunk)) = c.read_chunk() {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(rest.contains("shutting down"), "{rest}");
    assert!(rest.trim_end().ends_with("data: [DONE]"), "the stream did not end with [DONE]: {rest}");
}

/// The body of a streamed response until the server closes it.
fn read_stream(c: &mut Conn) -> String {
    let mut rest = String::new();
    while let Ok(Some(chunk)) = c.read_chunk() {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    rest
}

/// Every stream ends well-formed (issue 29): a streamed request still waiting for the
/// model when the helper shuts down used to end with no event at all (its generation never
/// began, so nothing sent a last event); now it ends with an error event then
/// `data: [DONE]`, as the stream running ahead of it does.
#[test]
fn a_stream_waiting_for_the_model_at_shutdown_ends_with_an_error_then_done() {
    let s = start("queued-shutdown", |_| {});
    let short = json!({"model": MODEL, "prompt": "Hi", "max_tokens": 1}).to_string();
    assert_eq!(s.post("/v1/completions", &short).status, 200);
    let streamed = |path: &str, body: serde_json::Value| {
        let mut c = Conn::open(s.addr).unwrap();
        c.send("POST", path, &[], body.to_string().as_bytes()).unwrap();
        assert_eq!(c.read_head().unwrap().0, 200);
        c
    };
    // One generation at a time: the second waits for the first's long prefill.
    let mut running = streamed(
        "/v1/completions",
        json!({"model": MODEL, "prompt": long_prompt(4000, 7), "max_tokens": 64, "stream": true}),
    );
    let mut waiting = streamed(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64, "stream": true}),
    );
    s.stop().unwrap();
    for (what, c) in [("running", &mut running), ("waiting", &mut waiting)] {
        let rest = read_stream(c);
        let events: Vec<&str> = rest.lines().filter(|l| l.starts_with("data: ")).collect();
        assert_eq!(events.last(), Some(&"data: [DONE]"), "{what}: {rest}");
        let error = events.iter().rev().nth(1).unwrap_or_else(|| panic!("{what}: {rest}"));
        let v: serde_json::Value = serde_json::from_str(&error["data: ".len()..]).unwrap();
        assert!(v["error"]["message"].is_string(), "{what}: {rest}");
    }
}
