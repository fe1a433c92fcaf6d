//! Speculative decoding in the server (`coli serve --speculate N [--draft DIR]`): every
//! answer is the one without it, greedy and sampled, streamed or not, with logprobs and
//! structured output. Served: the demo checkpoint (models/demo-hf, f32) with drafts from
//! the committed converted demo (models/demo: other weights, the same tokenizer), and the
//! olmoe fixture, whose tokenizer is another: there the draft is not used (prompt lookup).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::api::read_sse;
use super::*;

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

fn with_demo(dir: &Path) {
    copy_dir(&repo("models/demo-hf"), &dir.join("models/demo"));
}

/// The answer (text, finish_reason, logprobs) and the streamed text of `body`.
fn ask(s: &TestServer, body: &Value) -> (Value, String) {
    let r = s.post("/v1/chat/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let c = r.json()["choices"][0].clone();
    let mut b = body.clone();
    b["stream"] = json!(true);
    let mut conn = Conn::open(s.addr).unwrap();
    conn.send("POST", "/v1/chat/completions", &[], b.to_string().as_bytes()).unwrap();
    let (events, done) = read_sse(&mut conn);
    assert!(done);
    let streamed: String = events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    (
        json!({"content": c["message"]["content"], "finish_reason": c["finish_reason"], "logprobs": c["logprobs"]}),
        streamed,
    )
}

#[test]
fn answers_are_the_same_with_speculation_on() {
    let plain = start_with("spec-plain", |_| {}, |_| {}, with_demo);
    let lookup = start_with("spec-lookup", |a| a.speculate = 4, |_| {}, with_demo);
    let draft = start_with(
        "spec-draft",
        |a| {
            a.speculate = 3;
            a.draft = Some(repo("models/demo"));
        },
        |_| {},
        with_demo,
    );
    let msg = |q: &str| json!([{"role": "user", "content": q}]);
    let mut bodies = Vec::new();
    for q in
        ["What is 47 + 38?", "Spell \"garden\" backwards.", "Tell me a story.", "How many letters are in \"elephant\"?"]
    {
        bodies.push(json!({"model": "demo", "messages": msg(q), "max_tokens": 60, "temperature": 0}));
        bodies.push(json!({"model": "demo", "messages": msg(q), "max_tokens": 60, "temperature": 1, "seed": 7}));
    }
    bodies.push(json!({"model": "demo", "messages": msg("Tell me a fact."), "max_tokens": 30, "temperature": 0.8,
                       "seed": 3, "logprobs": true, "top_logprobs": 3}));
    bodies.push(json!({"model": "demo", "messages": msg("Who are you?"), "max_tokens": 40, "seed": 5,
                       "response_format": {"type": "json_object"}}));
    bodies.push(json!({"model": "demo", "messages": msg("Tell me a story."), "max_tokens": 80, "temperature": 0,
                       "stop": [" the "]}));
    // The other tokenizer: the draft is left out, prompt lookup drafts.
    bodies.push(json!({"model": MODEL, "messages": msg("Weather?"), "max_tokens": 30, "temperature": 0}));
    bodies.push(json!({"model": MODEL, "messages": msg("Weather?"), "max_tokens": 30, "temperature": 1, "seed": 2}));
    for b in &bodies {
        let (want, want_streamed) = ask(&plain, b);
        assert!(!want["content"].as_str().unwrap_or_default().is_empty() || b["model"] == MODEL, "{want}");
        assert_eq!(want_streamed, want["content"].as_str().unwrap_or_default(), "{b}");
        for s in [&lookup, &draft] {
            let (got, streamed) = ask(s, b);
            assert_eq!(got, want, "{b}");
            assert_eq!(streamed, want_streamed, "{b}");
        }
    }
    // Completions, with the prompt echoed and scored (the prompt's pass gives the first row).
    for b in [
        json!({"model": "demo", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "logprobs": 2, "echo": true}),
        json!({"model": "demo", "prompt": "one two three one two three one two", "max_tokens": 24, "temperature": 0.7, "seed": 1}),
    ] {
        let body = |s: &TestServer| {
            let r = s.post("/v1/completions", &b.to_string());
            assert_eq!(r.status, 200, "{}", r.text());
            let mut v = r.json();
            v["choices"][0].take()
        };
        let want = body(&plain);
        for s in [&lookup, &draft] {
            assert_eq!(body(s), want, "{b}");
        }
    }
    let spec = |s: &TestServer| s.health()["generations"]["speculation"].clone();
    assert_eq!(spec(&plain), json!({"forwards": 0, "drafted": 0, "accepted": 0}));
    for s in [&lookup, &draft] {
        let h = spec(s);
        let (drafted, accepted) = (h["drafted"].as_u64().unwrap(), h["accepted"].as_u64().unwrap());
        assert!(drafted > 0 && accepted > 0 && accepted <= drafted, "{h}");
    }
    // The draft model (int8 weights of the same network) agrees with it most of the time.
    let h = spec(&draft);
    assert!(h["accepted"].as_u64().unwrap() * 2 > h["drafted"].as_u64().unwrap(), "{h}");
}

#[test]
fn a_draft_that_cannot_be_opened_stops_the_start() {
    let args = ServeArgs { port: 0, draft: Some(repo("no/such/draft")), ..Default::default() };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let e = rt.block_on(super::super::bind_with(&args, None)).err().expect("refused");
    assert!(format!("{e:#}").starts_with("--draft: "), "{e:#}");
}
