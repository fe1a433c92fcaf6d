//! The OpenAI-compatible endpoints, served by the native engine on the olmoe fixture.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::*;

pub(super) fn reference_continuation() -> (Vec<u32>, Vec<u32>) {
    let r: Value = serde_json::from_slice(&std::fs::read(fixture(MODEL).join("reference.json")).unwrap()).unwrap();
    let ids = |v: &Value| v.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect::<Vec<_>>();
    (ids(&r["greedy"]["prompt_ids"]), ids(&r["greedy"]["new_ids"]))
}

/// Reads a server-sent-event stream to its end: the JSON events and whether [DONE] came.
pub(super) fn read_sse(c: &mut Conn) -> (Vec<Value>, bool) {
    let (status, headers) = c.read_head().unwrap();
    assert_eq!(status, 200);
    assert!(headers.iter().any(|(n, v)| n == "content-type" && v.starts_with("text/event-stream")));
    let mut text = String::new();
    while let Some(chunk) = c.read_chunk().unwrap() {
        text.push_str(&String::from_utf8(chunk).unwrap());
    }
    let mut events = Vec::new();
    let mut done = false;
    for block in text.split("\n\n").filter(|b| !b.is_empty()) {
        let data = block.strip_prefix("data: ").expect(block);
        if data == "[DONE]" {
            done = true;
        } else {
            events.push(serde_json::from_str(data).unwrap());
        }
    }
    (events, done)
}

#[test]
fn models_and_non_streamed_completions() {
    let s = start("openai", |_| {});
    let m = s.get("/v1/models", &[]).json();
    assert_eq!(m["object"], "list");
    assert!(m["data"].as_array().unwrap().iter().any(|d| d["id"] == MODEL && d["object"] == "model"), "{m}");

    // Greedy completion from token ids equals the fixture's reference continuation.
    let (ids, greedy) = reference_continuation();
    let n = greedy.len().min(8);
    let body = json!({"model": MODEL, "prompt": ids, "max_tokens": n, "temperature": 0, "ignore_eos": true});
    let r = s.post("/v1/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": ids.len(), "completion_tokens": n, "total_tokens": ids.len() + n,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let loaded = crate::load::open_dir(&s.model_dir(), &crate::load::CacheFlags::with_ram(None), true).unwrap();
    let tok = loaded.tokenizer.as_ref().unwrap();
    let want = tok.decode(&greedy[..n], true).unwrap();
    let with_prompt = tok.decode(&[&ids[..], &greedy[..n]].concat(), true).unwrap();
    let got = v["choices"][0]["text"].as_str().unwrap();
    assert!(got == want || with_prompt.ends_with(got), "{got:?} vs {want:?}");

    // Chat, non-streamed.
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5, "temperature": 0, "seed": 1});
    let r = s.post("/v1/chat/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["choices"][0]["message"]["content"].is_string());
    let used = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=5).contains(&used));
    assert!(["stop", "length"].contains(&v["choices"][0]["finish_reason"].as_str().unwrap()));
    // Same seed and settings, same answer (content parts give the same prompt).
    let again = json!({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]}], "max_tokens": 5, "temperature": 0, "seed": 1});
    assert_eq!(s.post("/v1/chat/completions", &again.to_string()).json()["choices"], v["choices"]);
    // An image part is refused with a 400 that names it (the engine runs text only).
    let image = json!({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}], "max_tokens": 5});
    let r = s.post("/v1/chat/completions", &image.to_string());
    assert_eq!(r.status, 400, "{}", r.text());
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("\"image_url\"") && msg.contains("image inputs are refused"), "{msg}");
    // response_format text is plain text: the same answer.
    let mut text = again.clone();
    text["response_format"] = json!({"type": "text"});
    assert_eq!(s.post("/v1/chat/completions", &text.to_string()).json()["choices"], v["choices"]);
    let h = s.health();
    assert_eq!(h["generations"]["finished"], 4);
    assert_eq!(h["generations"]["active"], 0);
}

#[test]
fn streamed_chat_and_completions() {
    let s = start("stream", |_| {});
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0.8, "seed": 7,
                      "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true});
    let mut c = Conn::open(s.addr).unwrap();
    c.send("POST", "/v1/chat/completions", &[("Content-Type", "application/json")], body.to_string().as_bytes())
        .unwrap();
    let (events, done) = read_sse(&mut c);
    assert!(done, "ends with data: [DONE]");
    assert!(events.iter().all(|e| e["object"] == "chat.completion.chunk"));
    let id = &events[0]["id"];
    assert!(events.iter().all(|e| &e["id"] == id));
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let finish: Vec<&Value> = events.iter().filter(|e| !e["choices"][0]["finish_reason"].is_null()).collect();
    assert_eq!(finish.len(), 1);
    assert_eq!(finish[0]["choices"][0]["finish_reason"], "length");
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 6);
    let streamed: String = events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    // The same request without streaming gives the same text.
    let mut plain = body.clone();
    plain["stream"] = json!(false);
    let v = s.post("/v1/chat/completions", &plain.to_string()).json();
    assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), streamed);

    let body =
        json!({"model": MODEL, "prompt": "The", "max_tokens": 4, "temperature": 0, "stream": true, "ignore_eos": true});
    let mut c = Conn::open(s.addr).unwrap();
    c.send("POST", "/v1/completions", &[], body.to_string().as_bytes()).unwrap();
    let (events, done) = read_sse(&mut c);
    assert!(done);
    assert!(events.iter().all(|e| e["object"] == "text_completion"));
    assert_eq!(events.last().unwrap()["choices"][0]["finish_reason"], "length");
}

#[test]
fn stop_strings_end_the_answer() {
    let s = start("stop", |_| {});
    let base = json!({"model": MODEL, "prompt": "a", "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let full = s.post("/v1/completions", &base.to_string()).json();
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    if chars.len() < 4 {
        return; // a tokenizer that decodes to almost nothing: nothing to cut
    }
    let stop: String = chars[2..4].iter().collect();
    let mut req = base.clone();
    req["stop"] = json!([stop, "never-appears"]);
    let v = s.post("/v1/completions", &req.to_string()).json();
    let cut = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(cut, &text[..text.find(&stop).unwrap()]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 12);
}

#[test]
fn bad_requests_get_openai_errors() {
    let s = start("errors", |_| {});
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/v1/chat/completions", "{not json".into(), 400, None),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}]}).to_string(),
            400,
            Some("model"),
        ),
        ("/v1/chat/completions", json!({"model": MODEL}).to_string(), 400, Some("messages")),
        ("/v1/chat/completions", json!({"model": MODEL, "messages": []}).to_string(), 400, Some("messages")),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}).to_string(),
            404,
            Some("model"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}).to_string(),
            400,
            Some("n"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": -1}).to_string(),
            400,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).to_string(),
            400,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}).to_string(),
            400,
            Some("response_format"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}, "strict": true}}}).to_string(),
            400,
            Some("response_format"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "x", "response_format": "json"}).to_string(),
            400,
            Some("response_format"),
        ),
        ("/v1/completions", json!({"model": MODEL}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"model": MODEL, "prompt": [1, 99999]}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"model": MODEL, "prompt": {"a": 1}}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"model": MODEL, "prompt": vec![5; 5000]}).to_string(), 400, Some("messages")),
        ("/v1/completions", "[1, 2]".into(), 400, None),
    ];
    for (path, body, status, param) in cases {
        let r = s.post(path, &body);
        assert_eq!(r.status, status, "{path} {body}: {}", r.text());
        let e = &r.json()["error"];
        assert!(e["message"].is_string() && e["type"].is_string(), "{}", r.text());
        assert!(e.as_object().unwrap().contains_key("param") && e.as_object().unwrap().contains_key("code"));
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{body}");
        }
    }
    assert_eq!(
        s.post(
            "/v1/chat/completions",
            &json!({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}).to_string()
        )
        .json()["error"]["code"],
        "model_not_found"
    );
    assert_eq!(s.health()["status"], "ok");
}

#[test]
fn a_client_that_disconnects_stops_its_generation() {
    let s = start("disconnect", |_| {});
    let max = 4000;
    let body =
        json!({"model": MODEL, "prompt": "a", "max_tokens": max, "temperature": 0, "stream": true, "ignore_eos": true});
    let mut c = Conn::open(s.addr).unwrap();
    c.send("POST", "/v1/completions", &[], body.to_string().as_bytes()).unwrap();
    let (status, _) = c.read_head().unwrap();
    assert_eq!(status, 200);
    let first = c.read_chunk().unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    c.stream().shutdown(std::net::Shutdown::Both).unwrap();
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let h = s.health();
        if h["generations"]["cancelled"] == 1 && h["generations"]["active"] == 0 {
            let tokens = h["generations"]["tokens"].as_u64().unwrap();
            assert!(tokens < max as u64, "the generation ran to the end ({tokens} tokens)");
            break;
        }
        assert!(Instant::now() < deadline, "generation did not stop: {h}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The server is healthy and answers the next request.
    let r = s.post("/v1/completions", &json!({"model": MODEL, "prompt": "a", "max_tokens": 2}).to_string());
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn concurrent_generations_queue_and_overflow_gets_503() {
    let s = start("queue", |a| a.max_queue = 2);
    let body =
        json!({"model": MODEL, "prompt": "a", "max_tokens": 300, "temperature": 0, "ignore_eos": true}).to_string();
    // Warm up (load the model) so the timing below is about generation.
    assert_eq!(
        s.post("/v1/completions", &json!({"model": MODEL, "prompt": "a", "max_tokens": 1}).to_string()).status,
        200
    );
    let statuses: Vec<u16> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..6).map(|_| sc.spawn(|| s.post("/v1/completions", &body).status)).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = statuses.iter().filter(|&&c| c == 200).count();
    assert!(ok >= 2, "{statuses:?}");
    assert!(statuses.iter().all(|&c| c == 200 || c == 503), "{statuses:?}");
    assert_eq!(s.health()["generations"]["active"], 0);
}

/// A client that leaves while its generation waits in the queue frees its place at once,
/// so the next client is admitted instead of refused with 503.
#[test]
fn a_client_that_leaves_the_queue_frees_its_place() {
    let s = start("queue-leave", |a| {
        a.max_queue = 2;
        a.parallel = Some(1);
    });
    let warm = json!({"model": MODEL, "prompt": "a", "max_tokens": 1}).to_string();
    assert_eq!(s.post("/v1/completions", &warm).status, 200);
    let long = json!({"model": MODEL, "prompt": "a", "max_tokens": 4000, "temperature": 0, "stream": true, "ignore_eos": true});
    // A runs; B waits behind it, then hangs up.
    let mut a = Conn::open(s.addr).unwrap();
    a.send("POST", "/v1/completions", &[], long.to_string().as_bytes()).unwrap();
    assert_eq!(a.read_head().unwrap().0, 200);
    a.read_chunk().unwrap();
    let mut b = Conn::open(s.addr).unwrap();
    b.send("POST", "/v1/completions", &[], long.to_string().as_bytes()).unwrap();
    assert_eq!(b.read_head().unwrap().0, 200);
    b.stream().shutdown(std::net::Shutdown::Both).unwrap();
    drop(b);
    // C is admitted (the queue holds A and C), not refused; B never started.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut c = loop {
        let mut c = Conn::open(s.addr).unwrap();
        c.send("POST", "/v1/completions", &[], long.to_string().as_bytes()).unwrap();
        let (status, _) = c.read_head().unwrap();
        if status == 200 {
            break c;
        }
        assert_eq!(status, 503);
        assert!(Instant::now() < deadline, "B's place in the queue was never freed");
        std::thread::sleep(Duration::from_millis(50));
    };
    a.stream().shutdown(std::net::Shutdown::Both).unwrap();
    drop(a);
    // C runs once A is gone.
    let first = c.read_chunk().unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    c.stream().shutdown(std::net::Shutdown::Both).unwrap();
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let h = s.health();
        if h["generations"]["active"] == 0 && h["generations"]["cancelled"] == 2 {
            // A and C ran and were cancelled; B never started.
            assert_eq!(h["generations"]["started"], 3, "{h}");
            break;
        }
        assert!(Instant::now() < deadline, "{h}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn shutdown_cancels_running_generations() {
    let s = start("shutdown", |_| {});
    let body = json!({"model": MODEL, "prompt": "a", "max_tokens": 4000, "temperature": 0, "stream": true, "ignore_eos": true});
    let mut c = Conn::open(s.addr).unwrap();
    c.send("POST", "/v1/completions", &[], body.to_string().as_bytes()).unwrap();
    assert_eq!(c.read_head().unwrap().0, 200);
    c.read_chunk().unwrap();
    let state = s.state.clone();
    let t = Instant::now();
    s.stop().unwrap();
    assert!(t.elapsed() < Duration::from_secs(8), "shutdown took {:?}", t.elapsed());
    assert!(state.stats.tokens_generated.load(std::sync::atomic::Ordering::Relaxed) < 4000);
    // The stream ends well-formed: an error event that says why, then [DONE] (issue 29).
    let mut rest = String::new();
    while let Ok(Some(chunk)) = c.read_chunk() {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(rest.contains("shutting down"), "{rest}");
    assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");
}

#[test]
fn the_context_limit_matches_the_engine_loop() {
    let s = start("context", |_| {});
    // A 16-position context (the model loads on first use, after this edit).
    let cfg_path = s.model_dir().join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["max_position_embeddings"] = json!(16);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let ask = |n: usize| {
        let ids: Vec<u32> = (0..n as u32).map(|i| 5 + i % 50).collect();
        let body = json!({"model": MODEL, "prompt": ids, "max_tokens": 10, "temperature": 0, "ignore_eos": true});
        s.post("/v1/completions", &body.to_string())
    };
    // k tokens after a p-token prompt need p + k - 1 positions: 16 - 14 + 1 = 3.
    for (prompt, want) in [(14, 3), (16, 1)] {
        let r = ask(prompt);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["usage"]["completion_tokens"], want, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }
    let r = ask(17);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
}
