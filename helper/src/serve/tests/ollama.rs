//! The Ollama endpoints over a socket, for what the client test (tests/e2e/ollama.test.mjs)
//! does not reach: NDJSON framing, `format` (JSON and a schema), `num_ctx`, request bodies
//! past the default 64 KiB, and `/api/pull` on a server that cannot pull.
//! Served model: the demo checkpoint (models/demo-hf) as `demo`.

use std::path::Path;

use serde_json::{json, Value};

use super::*;

fn with_demo(dir: &Path) {
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo-hf"), &dir.join("models/demo"));
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "demo", "messages": [{"role": "user", "content": "What is 23 + 45?"}],
                          "stream": false, "options": {"temperature": 0}});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[test]
fn ndjson_format_num_ctx_and_limits() {
    let s = start_with("ollama", |_| {}, |_| {}, with_demo);
    // Streamed: application/x-ndjson, one object a line, the last one done.
    let r = s.post("/api/chat", &chat(json!({"stream": true})).to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let ctype = r.headers.iter().find(|(k, _)| k == "content-type").map(|(_, v)| v.as_str());
    assert_eq!(ctype, Some("application/x-ndjson"));
    let text = r.text();
    let lines: Vec<Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert!(lines.len() > 2 && text.ends_with('\n'), "{text}");
    assert!(lines[..lines.len() - 1].iter().all(|l| l["done"] == false && l["message"]["content"].is_string()));
    let last = lines.last().unwrap();
    assert_eq!(last["done"], true);
    let whole = s.post("/api/chat", &chat(json!({})).to_string()).json();
    let pieces: String = lines.iter().map(|l| l["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(whole["message"]["content"].as_str().unwrap(), pieces);
    assert_eq!(whole["eval_count"], last["eval_count"]);

    // format: "json" and a schema.
    let v = s.post("/api/chat", &chat(json!({"format": "json", "options": {"num_predict": 60}})).to_string()).json();
    let content = v["message"]["content"].as_str().unwrap_or_else(|| panic!("{v}"));
    if v["done_reason"] == "stop" {
        serde_json::from_str::<Value>(content).unwrap_or_else(|e| panic!("{e}: {content}"));
    }
    let schema = json!({"type": "object", "properties": {"sum": {"type": "string", "maxLength": 8}}, "required": ["sum"],
                        "additionalProperties": false});
    let v = s
        .post(
            "/api/generate",
            &json!({"model": "demo", "prompt": "What is 23 + 45?", "format": schema,
        "stream": false, "options": {"temperature": 0, "num_predict": 60}})
            .to_string(),
        )
        .json();
    let content = v["response"].as_str().unwrap_or_else(|| panic!("{v}"));
    let parsed: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content}"));
    assert!(parsed["sum"].as_str().is_some_and(|s| s.chars().count() <= 8), "{content}");

    // num_ctx is the context: the prompt and the answer fit in it (the last token is never
    // fed, so p + 3 positions hold 4 new tokens: colibri_engine::generate::context_room).
    let p = whole["prompt_eval_count"].as_u64().unwrap();
    let v = s.post("/api/chat", &chat(json!({"options": {"temperature": 0, "num_ctx": p + 3}})).to_string()).json();
    assert_eq!((v["eval_count"].as_u64(), v["done_reason"].as_str()), (Some(4), Some("length")), "{v}");
    let r = s.post("/api/chat", &chat(json!({"options": {"num_ctx": 4}})).to_string());
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"].as_str().unwrap().contains("context"), "{}", r.text());

    // A body past the server's default 64 KiB reaches the handler (the context refuses it).
    let long = "word ".repeat(40_000);
    let body = json!({"model": "demo", "messages": [{"role": "user", "content": long}], "stream": false});
    let r = s.post("/api/chat", &body.to_string());
    assert_eq!(r.status, 400, "{}", r.text().chars().take(300).collect::<String>());
    assert!(r.json()["error"].as_str().unwrap().contains("context limit"), "{}", r.text());

    // Bad requests: Ollama's error shape.
    for (body, needle, status) in [
        (json!({"messages": []}), "model is required", 400),
        (chat(json!({"model": "nope"})), "model \"nope\" not found", 404),
        // The name as the client sent it, tag included (Ollama's own message).
        (chat(json!({"model": "nope:7b"})), "model \"nope:7b\" not found", 404),
        (chat(json!({"options": {"min_p": 0.2}})), "min_p", 400),
        (chat(json!({"options": {"num_predict": 0}})), "num_predict", 400),
        (chat(json!({"format": "yaml"})), "format", 400),
        (chat(json!({"think": true})), "think", 400),
        (chat(json!({"keep_alive": 0})), "keep_alive", 400),
        (chat(json!({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]})), "images", 400),
    ] {
        let r = s.post("/api/chat", &body.to_string());
        assert_eq!(r.status, status, "{body}: {}", r.text());
        let e = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(e.contains(needle), "{body}: {e}");
    }
    let r = s.post("/api/generate", &json!({"model": "demo", "prompt": "x", "context": [1, 2]}).to_string());
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].as_str().unwrap().contains("context"));

    // An empty chat loads the model; this server (no puller) cannot pull a new model.
    let v = s.post("/api/chat", &json!({"model": "demo", "stream": false}).to_string()).json();
    assert_eq!((v["done"].as_bool(), v["done_reason"].as_str()), (Some(true), Some("load")), "{v}");
    let r = s.post("/api/pull", r#"{"model": "acme/tiny"}"#);
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].as_str().unwrap().contains("cannot pull"), "{}", r.text());
    assert_eq!(s.post("/api/pull", r#"{"model": "demo", "stream": false}"#).json(), json!({"status": "success"}));
}
