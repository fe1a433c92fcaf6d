//! A chat longer than the context: the oldest turns go (the engine's `fit_chat`), the
//! response says how many (`dropped_messages`), `truncation: "disabled"` refuses instead;
//! with `tools` the same, on the prompt with the tools rendered in.
//! Served model: the demo checkpoint (models/demo-hf) with its context cut to 200 tokens.

use std::path::Path;

use serde_json::{json, Value};

use super::api::read_sse;
use super::*;

const CTX: usize = 200;

fn with_small_demo(dir: &Path) {
    demo_with_context(dir, CTX);
}

/// models/demo-small: the demo checkpoint with a context of `ctx` tokens.
fn demo_with_context(dir: &Path, ctx: usize) {
    let m = dir.join("models/demo-small");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo-hf"), &m);
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(m.join("config.json")).unwrap()).unwrap();
    cfg["max_position_embeddings"] = json!(ctx);
    std::fs::write(m.join("config.json"), cfg.to_string()).unwrap();
}

/// The demo's worked answer (tools/train_demo.py `add_answer`), for two-digit a and b.
fn add_answer(a: usize, b: usize) -> String {
    let u = a % 10 + b % 10;
    let c = u / 10;
    let carry = if c > 0 { ", carry 1. " } else { ". " };
    let plus = if c > 0 { " + 1" } else { "" };
    format!(
        "{a} + {b}: {} + {} = {u}{carry}{} + {}{plus} = {}. So {a} + {b} = {}.",
        a % 10,
        b % 10,
        a / 10,
        b / 10,
        a / 10 + b / 10 + c,
        a + b
    )
}

/// A system prompt, `turns` answered additions, then "What is 47 + 38?".
fn conversation(turns: usize) -> Vec<Value> {
    let mut v = vec![json!({"role": "system", "content": "Answer briefly."})];
    for i in 0..turns {
        let (a, b) = (11 + i, 22 + i);
        v.push(json!({"role": "user", "content": format!("What is {a} + {b}?")}));
        v.push(json!({"role": "assistant", "content": add_answer(a, b)}));
    }
    v.push(json!({"role": "user", "content": "What is 47 + 38?"}));
    v
}

#[test]
fn a_chat_longer_than_the_context_loses_its_oldest_turns() {
    let s = start_with("context", |_| {}, |_| {}, with_small_demo);
    let ask = |body: Value| s.post("/v1/chat/completions", &body.to_string());
    let base = json!({"model": "demo-small", "temperature": 0, "max_tokens": 40});

    // Fits: nothing dropped, no extension field.
    let mut b = base.clone();
    b["messages"] = json!(conversation(1));
    let v = ask(b).json();
    assert!(v.get("dropped_messages").is_none(), "{v}");
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().ends_with("So 47 + 38 = 85."), "{v}");

    // Eight turns (about 400 tokens) in a 200-token context: whole turns go, the system
    // prompt stays, the prompt leaves max_tokens of room, and the answer is still right.
    let mut b = base.clone();
    b["messages"] = json!(conversation(8));
    let r = ask(b.clone());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let dropped = v["dropped_messages"].as_u64().expect("dropped_messages") as usize;
    assert!(dropped >= 2 && dropped.is_multiple_of(2) && dropped < 16, "{v}");
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(prompt + 40 <= CTX + 1, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let answer = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(answer.ends_with("So 47 + 38 = 85."), "{v}");
    // The fewest turns: with one turn fewer dropped, the prompt would leave too little room.
    let loaded =
        crate::load::open_dir(&s.dir.join("models/demo-small"), &crate::load::CacheFlags::with_ram(None), true)
            .unwrap();
    let tok = loaded.tokenizer.as_ref().unwrap();
    let msgs: Vec<colibri_engine::tokenizer::ChatMessage> = serde_json::from_value(json!(conversation(8))).unwrap();
    let keep = |d: usize| [&msgs[..1], &msgs[1 + d..]].concat();
    assert_eq!(tok.encode_chat(&keep(dropped), true).unwrap().len(), prompt);
    assert!(tok.encode_chat(&keep(dropped - 2), true).unwrap().len() + 40 > CTX + 1);

    // Streamed: the first chunk says it; the text is the same.
    b["stream"] = json!(true);
    let mut c = Conn::open(s.addr).unwrap();
    c.send("POST", "/v1/chat/completions", &[("Content-Type", "application/json")], b.to_string().as_bytes()).unwrap();
    let (events, done) = read_sse(&mut c);
    assert!(done);
    assert_eq!(events[0]["dropped_messages"], json!(dropped), "{}", events[0]);
    let streamed: String = events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, answer);

    // truncation: "disabled" refuses what does not fit.
    let mut b = base.clone();
    b["messages"] = json!(conversation(8));
    b["truncation"] = json!("disabled");
    let r = ask(b.clone());
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    b["truncation"] = json!("sometimes");
    assert_eq!(ask(b).json()["error"]["param"], "truncation");

    // A last message longer than the context cannot be helped.
    let mut b = base.clone();
    b["messages"] = json!([{"role": "user", "content": "Spell river backwards. ".repeat(60)}]);
    let r = ask(b);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
}

#[test]
fn a_chat_with_tools_is_trimmed_with_its_tools_rendered_in() {
    // The tools are described in the system message (about 160 tokens): a larger context.
    const CTX: usize = 400;
    let s = start_with("context-tools", |_| {}, |_| {}, |d| demo_with_context(d, CTX));
    let tools = json!([{"type": "function", "function": {"name": "add", "description": "Adds two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"], "additionalProperties": false}}}]);
    let mut b = json!({"model": "demo-small", "temperature": 0, "max_tokens": 40, "tools": tools,
                       "tool_choice": "required", "messages": conversation(8)});
    let r = s.post("/v1/chat/completions", &b.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let dropped = v["dropped_messages"].as_u64().expect("dropped_messages") as usize;
    assert!(dropped >= 2 && dropped.is_multiple_of(2) && dropped < 16, "{v}");
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(prompt + 40 <= CTX + 1, "{v}");
    // The call is constrained (the tiny demo knows no tools: its numbers run to max_tokens).
    let c = &v["choices"][0];
    assert!(
        c["message"]["content"].as_str().is_some_and(|t| t.starts_with(r#"{"name": "add""#))
            || c["finish_reason"] == "tool_calls",
        "{v}"
    );
    // The prompt is the kept turns with the tools rendered in, and the fewest turns went.
    let loaded =
        crate::load::open_dir(&s.dir.join("models/demo-small"), &crate::load::CacheFlags::with_ram(None), true)
            .unwrap();
    let tok = loaded.tokenizer.as_ref().unwrap();
    let t = crate::serve::structured::tools(Some(&b["tools"]), Some(&b["tool_choice"])).unwrap().unwrap();
    let msgs: Vec<colibri_engine::tokenizer::ChatMessage> = serde_json::from_value(json!(conversation(8))).unwrap();
    let len = |d: usize| {
        let kept = [&msgs[..1], &msgs[1 + d..]].concat();
        tok.encode(&crate::serve::structured::chat_prompt(tok, &kept, &t).unwrap(), false).unwrap().len()
    };
    assert_eq!(len(dropped), prompt);
    assert!(len(dropped - 2) + 40 > CTX + 1);
    // truncation: "disabled" still refuses.
    b["truncation"] = json!("disabled");
    let r = s.post("/v1/chat/completions", &b.to_string());
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
}
