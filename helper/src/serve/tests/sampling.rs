//! OpenAI's sampling parameters on a real server (the olmoe fixture, random weights):
//! each changes the output as OpenAI documents it (`logit_bias` +100 forces a token and
//! -100 bans it, `frequency_penalty` / `presence_penalty` cut repetition, `seed`
//! reproduces), and what cannot be honoured answers 400 naming the parameter.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::api::{read_sse, reference_continuation};
use super::*;

/// The text of each token the completion produced (`logprobs: 0` lists them).
fn tokens(s: &TestServer, extra: Value) -> Vec<String> {
    let (prompt, _) = reference_continuation();
    let mut body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0,
                          "ignore_eos": true, "logprobs": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = s.post("/v1/completions", &body.to_string());
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    let v = r.json();
    v["choices"][0]["logprobs"]["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect()
}

/// Token id -> its text in the API's logprobs (the engine's `token_text`).
fn texts(s: &TestServer) -> impl Fn(u32) -> String {
    let loaded = crate::load::open_dir(&s.model_dir(), &crate::load::CacheFlags::with_ram(None), true).unwrap();
    move |id| colibri_engine::generate::logprobs::token_text(loaded.tokenizer.as_ref().unwrap(), id).0
}

/// How many produced tokens repeat one produced before.
fn repeats(t: &[String]) -> usize {
    t.len() - t.iter().collect::<BTreeSet<_>>().len()
}

fn refused(r: client::Response, param: &str) {
    assert_eq!(r.status, 400, "{param}: {}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["param"], param, "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
}

#[test]
fn logit_bias_forces_and_bans_tokens() {
    let s = start("logit-bias", |_| {});
    let text = texts(&s);
    let (_, greedy) = reference_continuation();
    let plain = tokens(&s, json!({}));
    assert_eq!(plain, greedy[..8].iter().map(|&id| text(id)).collect::<Vec<_>>(), "the unbiased greedy tokens");
    // +100 on a token the model does not pick: every token is that one, greedy or sampled.
    let forced = (5u32..).find(|id| !greedy.contains(id) && !text(*id).is_empty() && *id != 400).unwrap();
    for extra in [json!({}), json!({"temperature": 1, "seed": 3}), json!({"temperature": 1.5, "top_p": 0.9, "seed": 4})]
    {
        let mut body = extra.clone();
        body["logit_bias"] = json!({ forced.to_string(): 100 });
        assert_eq!(tokens(&s, body), vec![text(forced); 8], "{extra}");
    }
    // -100 on the greedy tokens: none of them comes out (compared by text: byte tokens,
    // whose text is a replacement character, are left out of the comparison).
    let banned: BTreeSet<u32> = greedy[..8].iter().copied().collect();
    let bias: serde_json::Map<String, Value> = banned.iter().map(|id| (id.to_string(), json!(-100))).collect();
    let got = tokens(&s, json!({ "logit_bias": bias }));
    let whole = |t: &String| !t.contains('\u{fffd}');
    let banned_text: BTreeSet<String> = banned.iter().map(|&id| text(id)).filter(whole).collect();
    assert!(banned_text.len() >= 4, "{banned_text:?}");
    assert!(got.iter().filter(|t| whole(t)).all(|t| !banned_text.contains(t)), "{got:?} has one of {banned_text:?}");
    // Banning only the first greedy token changes the first token.
    assert_ne!(tokens(&s, json!({"logit_bias": {greedy[0].to_string(): -100}}))[0], text(greedy[0]));

    let (prompt, _) = reference_continuation();
    let bad = |bias: Value| json!({"model": MODEL, "prompt": prompt, "max_tokens": 2, "logit_bias": bias}).to_string();
    refused(s.post("/v1/completions", &bad(json!({"999999": 5}))), "logit_bias");
    refused(s.post("/v1/completions", &bad(json!({"5": 150}))), "logit_bias");
    refused(s.post("/v1/completions", &bad(json!({"five": 1}))), "logit_bias");
    refused(s.post("/v1/completions", &bad(json!([5]))), "logit_bias");
}

#[test]
fn frequency_and_presence_penalties_cut_repetition() {
    let s = start("penalties", |_| {});
    let long = |extra: Value| {
        let mut body = extra;
        body["max_tokens"] = json!(48);
        tokens(&s, body)
    };
    let plain = long(json!({}));
    let base = repeats(&plain);
    assert!(base >= 8, "the greedy continuation repeats itself ({base} repeats): {plain:?}");
    for param in ["frequency_penalty", "presence_penalty"] {
        let got = long(json!({ param: 2.0 }));
        assert!(repeats(&got) < base, "{param} 2: {} repeats against {base}: {got:?}", repeats(&got));
        // A negative penalty rewards repeats instead.
        let more = long(json!({ param: -2.0 }));
        assert!(repeats(&more) >= base, "{param} -2: {} repeats against {base}: {more:?}", repeats(&more));
    }
    // Also with sampling, and 0 changes nothing.
    let sampled = json!({"temperature": 0.8, "seed": 11});
    let mut zero = sampled.clone();
    zero["presence_penalty"] = json!(0);
    zero["frequency_penalty"] = json!(0.0);
    assert_eq!(long(zero), long(sampled));
    let (prompt, _) = reference_continuation();
    for (param, v) in [("frequency_penalty", 2.5), ("presence_penalty", -2.1)] {
        let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 2, param: v});
        refused(s.post("/v1/completions", &body.to_string()), param);
    }
}

#[test]
fn a_seed_reproduces_the_sample_streamed_or_not() {
    let s = start("seed", |_| {});
    let sampled = |seed: u64| tokens(&s, json!({"temperature": 1.2, "seed": seed, "max_tokens": 24}));
    let a = sampled(42);
    assert_eq!(a, sampled(42));
    assert_ne!(a, sampled(43));
    // The same seed streamed: the same text.
    let (prompt, _) = reference_continuation();
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 1.2, "seed": 42,
                      "ignore_eos": true});
    let whole = s.post("/v1/completions", &body.to_string()).json()["choices"][0]["text"].as_str().unwrap().to_string();
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let mut c = client::Conn::open(s.addr).unwrap();
    c.send("POST", "/v1/completions", &[], stream.to_string().as_bytes()).unwrap();
    let (events, done) = read_sse(&mut c);
    assert!(done);
    let streamed: String = events.iter().filter_map(|e| e["choices"][0]["text"].as_str()).collect();
    assert_eq!(streamed, whole);
}

#[test]
fn parameters_that_cannot_be_honoured_are_refused_by_name() {
    let s = start("refused", |_| {});
    let chat = |extra: Value| {
        let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        s.post("/v1/chat/completions", &body.to_string())
    };
    refused(chat(json!({"n": 2})), "n");
    refused(chat(json!({"functions": [{"name": "f", "parameters": {}}]})), "functions");
    refused(chat(json!({"function_call": "auto"})), "function_call");
    refused(chat(json!({"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"]})), "audio");
    refused(chat(json!({"modalities": ["audio"]})), "modalities");
    refused(chat(json!({"prediction": {"type": "content", "content": "Hi"}})), "prediction");
    refused(chat(json!({"web_search_options": {}})), "web_search_options");
    refused(chat(json!({"reasoning_effort": "high"})), "reasoning_effort");
    refused(chat(json!({"top_p": 1.5})), "top_p");
    let (prompt, _) = reference_continuation();
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 2, "best_of": 3});
    refused(s.post("/v1/completions", &body.to_string()), "best_of");
    // What does not change the output is still taken: metadata, user, best_of 1, text only.
    let r = chat(json!({"user": "u1", "metadata": {"a": "b"}, "store": false, "modalities": ["text"],
                        "parallel_tool_calls": true, "logit_bias": {}, "presence_penalty": null}));
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Bad values, each refused on both endpoints with the parameter's name and the engine's
/// code (`colibri_engine::Error::Param`, "invalid_parameter"), the code the browser engine
/// gives for the same request (tests/e2e/sampling.test.mjs). Before the engine checked the
/// request, a value of the wrong type was a JSON error naming nothing, and none had a code.
#[test]
fn bad_values_are_refused_with_their_name_and_the_engine_code() {
    let s = start("bad-values", |_| {});
    let (prompt, _) = reference_continuation();
    let cases = [
        (json!({"top_k": -1}), "top_k"),
        (json!({"top_k": 2.5}), "top_k"),
        (json!({"temperature": "hot"}), "temperature"),
        (json!({"top_p": 2}), "top_p"),
        (json!({"seed": "x"}), "seed"),
        (json!({"stop": 7}), "stop"),
        (json!({"stop": ["a", 1]}), "stop"),
        (json!({"max_tokens": -3}), "max_tokens"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"logit_bias": {"999999": 5}}), "logit_bias"),
        (json!({"ignore_eos": "yes"}), "ignore_eos"),
        (json!({"suffix": "x"}), "suffix"),
        (json!({"n": 3}), "n"),
    ];
    for (extra, param) in cases {
        for (path, mut body) in [
            ("/v1/chat/completions", json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]})),
            ("/v1/completions", json!({"model": MODEL, "prompt": prompt})),
        ] {
            body["max_tokens"] = json!(2);
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let r = s.post(path, &body.to_string());
            assert_eq!(r.status, 400, "{path} {extra}: {}", r.text());
            let e = &r.json()["error"];
            assert_eq!(
                (e["param"].as_str(), e["code"].as_str()),
                (Some(param), Some("invalid_parameter")),
                "{path} {extra}: {e}"
            );
            assert_eq!(e["type"], "invalid_request_error", "{e}");
        }
    }
}
