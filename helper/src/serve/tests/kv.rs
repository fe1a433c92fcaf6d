//! Conversation caches (generate::reuse, kv_store): a second chat turn reuses the first
//! turn's cache and reports it in `usage.prompt_tokens_details.cached_tokens`, with the
//! answer (tokens and log-probabilities) of a server that keeps no cache; after a restart
//! the cache comes from disk; a corrupt cache file is ignored. Served model: the demo
//! checkpoint (models/demo-hf), its files' modification times fixed so that a copy has
//! the same fingerprint.

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use serde_json::{json, Value};

use super::api::read_sse;
use super::*;

fn with_demo(dir: &Path) {
    let m = dir.join("models/demo");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo-hf"), &m);
    for e in std::fs::read_dir(&m).unwrap() {
        let f = std::fs::File::options().write(true).open(e.unwrap().path()).unwrap();
        f.set_modified(UNIX_EPOCH + Duration::from_secs(1_700_000_000)).unwrap();
    }
}

/// A server of the demo; `kv` the --kv-cache budget; `data_from`: a data directory to
/// start with (a restart).
fn serve(tag: &str, kv: Option<u64>, data_from: Option<&Path>) -> TestServer {
    start_with(
        tag,
        |a| a.kv_cache = kv,
        |_| {},
        |dir| {
            with_demo(dir);
            if let Some(from) = data_from {
                let kv_dir = from.join("kv");
                for fp in std::fs::read_dir(&kv_dir).unwrap() {
                    let fp = fp.unwrap().path();
                    copy_dir(&fp, &dir.join("data/kv").join(fp.file_name().unwrap()));
                }
            }
        },
    )
}

fn first_turn() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "Answer briefly."}),
        json!({"role": "user", "content": "What is 12 + 34?"}),
    ]
}

fn body(messages: &[Value]) -> Value {
    // Seeded sampling with log-probabilities: the same tokens and logits are needed for
    // the same text and the same logprobs.
    json!({"model": "demo", "messages": messages, "temperature": 0.9, "top_p": 0.95, "seed": 5,
           "max_tokens": 40, "logprobs": true, "top_logprobs": 3})
}

fn chat(s: &TestServer, messages: &[Value]) -> Value {
    let r = s.post("/v1/chat/completions", &body(messages).to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or_else(|| panic!("no cached_tokens: {v}"))
}

/// The conversation after `v` answered `messages`, and a new question.
fn next_turn(messages: &[Value], v: &Value, question: &str) -> Vec<Value> {
    let mut m = messages.to_vec();
    m.push(json!({"role": "assistant", "content": v["choices"][0]["message"]["content"]}));
    m.push(json!({"role": "user", "content": question}));
    m
}

#[test]
fn a_second_turn_reuses_the_cache_with_the_same_answer_and_survives_a_restart() {
    let s = serve("kv", None, None);
    let plain = serve("kv-none", Some(0), None);
    let first = first_turn();
    let a = chat(&s, &first);
    assert_eq!(cached(&a), 0);
    assert_eq!(a["choices"][0], chat(&plain, &first)["choices"][0]);
    let second = next_turn(&first, &a, "And 5 + 7?");
    let b = chat(&s, &second);
    let b_plain = chat(&plain, &second);
    assert_eq!(cached(&b_plain), 0, "--kv-cache 0 keeps nothing");
    let prompt = b["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached(&b) > a["usage"]["prompt_tokens"].as_u64().unwrap(), "the first turn is reused: {b}");
    assert!(cached(&b) < prompt);
    assert_eq!(b["choices"][0], b_plain["choices"][0], "the same text and logprobs with and without the cache");
    assert_eq!(s.health()["generations"]["cached_prompt_tokens"], json!(cached(&b)));

    // Streamed, with usage: the same count; a prompt that diverges reuses a shorter prefix.
    let third = next_turn(&second, &b, "And 9 + 9?");
    let mut req = body(&third);
    req["stream"] = json!(true);
    req["stream_options"] = json!({"include_usage": true});
    let mut c = Conn::open(s.addr).unwrap();
    c.send("POST", "/v1/chat/completions", &[("Content-Type", "application/json")], req.to_string().as_bytes())
        .unwrap();
    let (events, done) = read_sse(&mut c);
    assert!(done);
    let usage = &events.last().unwrap()["usage"];
    assert!(usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > prompt, "{usage}");
    let mut other = first.clone();
    other[1] = json!({"role": "user", "content": "What is 99 + 1?"});
    let d = chat(&s, &other);
    assert!(cached(&d) > 0 && cached(&d) < a["usage"]["prompt_tokens"].as_u64().unwrap(), "{d}");
    assert_eq!(d["choices"][0], chat(&plain, &other)["choices"][0]);

    // /v1/completions with ids: the cache of the first request is reused.
    let ids: Vec<u32> = (5..25).collect();
    let comp = |ids: &[u32]| {
        let b = json!({"model": "demo", "prompt": ids, "max_tokens": 5, "temperature": 0});
        s.post("/v1/completions", &b.to_string()).json()
    };
    let e = comp(&ids);
    assert_eq!(cached(&e), 0);
    let longer: Vec<u32> = (5..40).collect();
    assert_eq!(cached(&comp(&longer)), 20, "the first prompt (its answer differs from 25, 26, ...)");

    // A restart: the cache comes from disk, and only the last prompt token is fed.
    // (The new server starts with a copy of the data directory; the old one then goes.)
    let again = serve("kv-restart", None, Some(&s.dir.join("data")));
    drop(s);
    let b2 = chat(&again, &second);
    assert_eq!(cached(&b2), prompt - 1, "zero re-prefill after a restart: {b2}");
    assert_eq!(b2["choices"][0], b_plain["choices"][0]);

    // A corrupt file is ignored (and removed), never trusted: the same answer, nothing cached.
    let kv_dir = again.dir.join("data/kv");
    let fp = std::fs::read_dir(&kv_dir).unwrap().next().unwrap().unwrap().path();
    for f in std::fs::read_dir(&fp).unwrap() {
        let p = f.unwrap().path();
        let mut bytes = std::fs::read(&p).unwrap();
        let at = bytes.len() - 20;
        bytes[at] ^= 0x40;
        std::fs::write(&p, bytes).unwrap();
    }
    let third_run = serve("kv-corrupt", None, Some(&again.dir.join("data")));
    drop(again);
    let b3 = chat(&third_run, &second);
    assert_eq!(cached(&b3), 0, "{b3}");
    assert_eq!(b3["choices"][0], b_plain["choices"][0]);
}
