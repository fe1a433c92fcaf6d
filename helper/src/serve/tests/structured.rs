//! Structured output on the OpenAI endpoints of a real server (the olmoe fixture, random
//! weights: whatever the model prefers, the answer must validate): response_format,
//! llama.cpp's grammar, tools / tool_choice, and the 400s.

use serde_json::{json, Value};

use super::api::read_sse;
use super::*;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 8},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "rain": {"type": "boolean"}
        },
        "required": ["city", "days", "rain"],
        "additionalProperties": false
    })
}

/// Checks `text` against [`schema`] by hand.
fn assert_valid(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let o = v.as_object().unwrap_or_else(|| panic!("not an object: {text}"));
    assert_eq!(o.len(), 3, "{text}");
    assert!(o["city"].as_str().is_some_and(|c| c.chars().count() <= 8), "{text}");
    assert!(o["days"].as_i64().is_some_and(|d| (1..=14).contains(&d)), "{text}");
    assert!(o["rain"].is_boolean(), "{text}");
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Weather plan?"}],
                          "max_tokens": 120, "temperature": 1});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[test]
fn json_schema_answers_validate_streamed_or_not() {
    let s = start("structured", |_| {});
    let rf = json!({"type": "json_schema", "json_schema": {"name": "plan", "schema": schema(), "strict": true}});
    for seed in 0..4 {
        let r = s.post("/v1/chat/completions", &chat(json!({"response_format": rf, "seed": seed})).to_string());
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        assert_valid(&text);

        // The same request streamed: the same text, in pieces.
        let mut c = client::Conn::open(s.addr).unwrap();
        let body = chat(json!({"response_format": rf, "seed": seed, "stream": true})).to_string();
        c.send("POST", "/v1/chat/completions", &[], body.as_bytes()).unwrap();
        let (events, done) = read_sse(&mut c);
        assert!(done);
        let streamed: String =
            events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().join("");
        assert_eq!(streamed, text);
        assert_eq!(events.last().unwrap()["choices"][0]["finish_reason"], "stop");
    }
    // json_object on completions, and the budget running out first: `length`, cut text.
    let body = json!({"model": MODEL, "prompt": "Data:", "max_tokens": 3, "temperature": 0,
                      "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema()}}});
    let v = s.post("/v1/completions", &body.to_string()).json();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(serde_json::from_str::<Value>(v["choices"][0]["text"].as_str().unwrap()).is_err());
    let body = json!({"model": MODEL, "prompt": "Data:", "max_tokens": 200, "seed": 1, "response_format": {"type": "json_object"}});
    let v = s.post("/v1/completions", &body.to_string()).json();
    let text = v["choices"][0]["text"].as_str().unwrap();
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(text).unwrap().is_object(), "{text}");
    } else {
        assert!(text.starts_with('{'), "{v}");
    }
}

#[test]
fn gbnf_grammar_and_tool_calls() {
    let s = start("tools", |_| {});
    // llama.cpp's `grammar`.
    let g = "root ::= (\"yes\" | \"no\") \" because \" [a-z]{1,6} \".\"";
    let v = s.post("/v1/chat/completions", &chat(json!({"grammar": g, "seed": 3})).to_string()).json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    let (head, rest) = text.split_once(" because ").unwrap_or_else(|| panic!("{v}"));
    assert!(head == "yes" || head == "no", "{text}");
    let word = rest.strip_suffix('.').unwrap();
    assert!((1..=6).contains(&word.len()) && word.bytes().all(|b| b.is_ascii_lowercase()), "{text}");

    // A required call: OpenAI's tool_calls, arguments valid under the parameters.
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
            "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}]);
    for (seed, choice) in
        [(1, json!("required")), (2, json!({"type": "function", "function": {"name": "get_weather"}}))]
    {
        let body = chat(json!({"tools": tools, "tool_choice": choice, "seed": seed}));
        let v = s.post("/v1/chat/completions", &body.to_string()).json();
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        assert!(c["message"]["content"].is_null());
        let call = &c["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        let name = call["function"]["name"].as_str().unwrap();
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        match name {
            "get_weather" => {
                assert!(args["city"].as_str().unwrap().chars().count() <= 8, "{args}");
                assert!(args["unit"] == "c" || args["unit"] == "f", "{args}");
            }
            "get_time" => assert_eq!(args, json!({})),
            _ => panic!("unknown function {name}"),
        }
        if choice.is_object() {
            assert_eq!(name, "get_weather");
        }
        // Streamed: one delta with the call, then finish_reason tool_calls.
        let mut c = client::Conn::open(s.addr).unwrap();
        let mut body = body.clone();
        body["stream"] = json!(true);
        c.send("POST", "/v1/chat/completions", &[], body.to_string().as_bytes()).unwrap();
        let (events, _) = read_sse(&mut c);
        let streamed = events.iter().find_map(|e| e["choices"][0]["delta"].get("tool_calls")).unwrap();
        assert_eq!(streamed[0]["function"], call["function"]);
        assert_eq!(streamed[0]["index"], 0);
        assert_eq!(events.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    }
    // An earlier call and its result in the history are accepted.
    let history = json!([{"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]);
    let body = json!({"model": MODEL, "messages": history, "tools": tools, "max_tokens": 40, "seed": 4});
    let r = s.post("/v1/chat/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let c = &r.json()["choices"][0];
    // auto: text or a call, never a broken call.
    assert!(c["message"]["content"].is_string() || c["message"]["tool_calls"].is_array(), "{c}");
}

#[test]
fn grammars_the_library_refuses_are_400s() {
    let s = start("structured-400", |_| {});
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}, "strict": true}}}),
            "response_format",
            "frobnicate",
        ),
        (json!({"grammar": "root ::= missing"}), "grammar", "missing"),
        (json!({"grammar": "root ::= [z-a]"}), "grammar", "GBNF line 1"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}], "tool_choice": "required"}),
            "tools",
            "nope",
        ),
        (json!({"response_format": {"type": "json_object"}, "stop": ["}"]}), "response_format", "stop"),
        (
            json!({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}),
            "grammar",
            "cannot be combined",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
            "not in tools",
        ),
    ];
    for (extra, param, needle) in cases {
        let r = s.post("/v1/chat/completions", &chat(extra.clone()).to_string());
        assert_eq!(r.status, 400, "{extra}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["param"], param, "{extra}: {e}");
        assert!(e["message"].as_str().unwrap().contains(needle), "{extra}: {e}");
    }
    assert_eq!(s.health()["status"], "ok");
}

/// `{"$defs": {"d0": {"$ref": "#/$defs/d1"}, ...}}`: a chain of n `$ref` links.
fn ref_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
    }
    defs.insert(format!("d{n}"), json!({"type": "string"}));
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

/// Schemas and grammars that overflowed the compiling thread's stack (and aborted the
/// whole server) are refused with a 400 naming the limit; the server stays up and answers
/// a schema within the limits.
#[test]
fn deep_and_wide_schemas_are_400s_and_the_server_stays_up() {
    let s = start("structured-limits", |_| {});
    let rf =
        |schema: Value| json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
    let props: serde_json::Map<String, Value> =
        (0..10_000).map(|i| (format!("property_{i}"), json!({"type": "string"}))).collect();
    let wide = json!({"type": "object", "properties": props});
    let mut rules = String::from("root ::= r0\n");
    for i in 0..3000 {
        rules.push_str(&format!("r{i} ::= \"x\" r{}\n", i + 1));
    }
    rules.push_str("r3000 ::= \"y\"\n");
    let cases = [
        (json!({"response_format": rf(ref_chain(1000))}), "response_format", "deeper than 64 levels"),
        (json!({"response_format": rf(wide.clone())}), "response_format", "10000 properties, over the limit of 1000"),
        (json!({"grammar": rules}), "grammar", "deeper than 64 levels"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": ref_chain(1000)}}], "tool_choice": "required"}),
            "tools",
            "deeper than 64",
        ),
    ];
    for (extra, param, needle) in cases {
        let body = chat(extra).to_string();
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{param}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["param"], param, "{e}");
        assert!(e["message"].as_str().unwrap().contains(needle), "{e}");
        assert_eq!(s.health()["status"], "ok");
    }
    // A body nested past serde_json's 128 levels (a schema of 200 nested arrays) is a 400
    // that names the limit.
    let mut deep = json!({"type": "string"});
    for _ in 0..200 {
        deep = json!({"type": "array", "items": deep});
    }
    let r = s.post("/v1/chat/completions", &chat(json!({"response_format": rf(deep)})).to_string());
    assert_eq!(r.status, 400, "{}", r.text());
    let e = &r.json()["error"];
    assert!(e["message"].as_str().unwrap().contains("deeper than 128 levels"), "{e}");
    assert_eq!(s.health()["status"], "ok");
    // Within the limits: a 60-link chain compiles and the answer is a string.
    let r = s.post(
        "/v1/chat/completions",
        &chat(json!({"response_format": rf(ref_chain(60)), "max_tokens": 8})).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(text.starts_with('"'), "{text}");
}

/// A Lark grammar that compiles but fails at the output's first token: after "a", `b`'s
/// 2,100 alternatives are predicted in one Earley row, past llguidance's limit of 2,000
/// items per row (engine: `a_grammar_that_fails_mid_generation_is_an_error`).
fn fails_after_its_first_token() -> String {
    let n = 2100;
    let alts: Vec<String> = (0..n).map(|i| format!("b{i}")).collect();
    let mut lark = format!("start: \"a\" b\nb: {}\n", alts.join(" | "));
    for i in 0..n {
        lark.push_str(&format!("b{i}: \"x\" \"{i}\"\n"));
    }
    lark
}

/// A grammar that fails while the output is generated (not when it is compiled) ends
/// the response cleanly: a 400 naming the grammar and llguidance's reason (it was a 500),
/// or streamed, an error event then [DONE]; the server goes on.
#[test]
fn a_grammar_failing_mid_generation_is_a_400_or_an_error_event() {
    let s = start("structured-mid", |_| {});
    let body = chat(json!({"grammar": fails_after_its_first_token(), "max_tokens": 20}));
    let r = s.post("/v1/chat/completions", &body.to_string());
    assert_eq!(r.status, 400, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!((e["param"].as_str(), e["code"].as_str()), (Some("grammar"), Some("grammar_failed")), "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.starts_with("grammar: ") && msg.contains("max is 2000") && !msg.contains("<state>"), "{msg}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let mut c = Conn::open(s.addr).unwrap();
    c.send("POST", "/v1/chat/completions", &[], streamed.to_string().as_bytes()).unwrap();
    let (events, done) = read_sse(&mut c);
    assert!(done, "the stream ends with [DONE]: {events:?}");
    let last = events.last().unwrap();
    assert_eq!(last["error"]["code"], "grammar_failed", "{events:?}");
    assert!(last["error"]["message"].as_str().unwrap().contains("max is 2000"), "{last}");
    assert_eq!(s.post("/v1/chat/completions", &chat(json!({})).to_string()).status, 200);
    assert_eq!(s.health()["status"], "ok");
}

/// A grammar that takes longer to compile than `grammar_compile_timeout` gets a 400
/// naming the limit (here 1 ms; the 2,100-alternative grammar takes about 0.1 s), its
/// compilation cancelled; one after another, such requests never wait on compile slots
/// that an abandoned compilation kept, and the server goes on.
#[test]
fn a_grammar_compile_past_the_time_limit_is_a_400() {
    let s = start_with(
        "structured-slow",
        |_| {},
        |l| l.grammar_compile_timeout = std::time::Duration::from_millis(1),
        |_| {},
    );
    let body = chat(json!({"grammar": fails_after_its_first_token(), "max_tokens": 2})).to_string();
    for _ in 0..4 {
        let t = std::time::Instant::now();
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["param"], "grammar", "{e}");
        assert!(e["message"].as_str().unwrap().contains("took longer than the limit of 0.001 s"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "{:?}", t.elapsed());
    }
    assert_eq!(s.post("/v1/chat/completions", &chat(json!({})).to_string()).status, 200);
}
