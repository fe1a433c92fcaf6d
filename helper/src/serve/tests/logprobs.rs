//! logprobs / top_logprobs / echo on the OpenAI endpoints, checked against a
//! log-softmax computed here (std f64 exp/ln) from the engine's teacher-forced logits.

use colibri_engine::Logits;
use serde_json::{json, Value};

use super::api::{read_sse, reference_continuation};
use super::*;

/// log-softmax of every row of `rows` (n, vocab), computed the plain way.
fn log_softmax(rows: &[f32], vocab: usize) -> Vec<Vec<f64>> {
    rows.chunks(vocab)
        .map(|r| {
            let m = r.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let s: f64 = r.iter().map(|&x| (x as f64 - m).exp()).sum();
            r.iter().map(|&x| x as f64 - m - s.ln()).collect()
        })
        .collect()
}

fn close(got: &Value, want: f64, what: &str) {
    let g = got.as_f64().unwrap_or_else(|| panic!("{what}: {got} is not a number"));
    assert!((g - want).abs() < 1e-9, "{what}: {g} vs {want}");
}

#[test]
fn completions_logprobs_and_echo_match_the_engine_logits() {
    let s = start("logprobs", |_| {});
    let (ids, _) = reference_continuation();
    let n = 5;
    let body = json!({"model": MODEL, "prompt": ids, "max_tokens": n, "temperature": 0, "ignore_eos": true,
                      "logprobs": 3, "echo": true});
    let r = s.post("/v1/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), ids.len() + n, "{lp}");

    // The independent computation: the whole sequence teacher-forced through the engine.
    let loaded = crate::load::open_dir(&s.model_dir(), &crate::load::CacheFlags::with_ram(None), true).unwrap();
    let tok = loaded.tokenizer.as_ref().unwrap();
    let vocab = loaded.model.cfg.vocab;
    // The generated ids are the greedy ones: the argmax of each row.
    let mut all = ids.clone();
    let mut session = loaded.model.new_session();
    let mut rows = loaded.model.forward(&mut session, &ids, Logits::All).unwrap();
    for _ in 0..n {
        let last = &rows[rows.len() - vocab..];
        let id = colibri_engine::math::argmax(last) as u32;
        all.push(id);
        rows.extend(loaded.model.forward(&mut session, &[id], Logits::Last).unwrap());
    }
    let want = log_softmax(&rows, vocab);
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null(), "{lp}");
    for i in 1..all.len() {
        close(&lp["token_logprobs"][i], want[i - 1][all[i] as usize], &format!("token {i}"));
        let (text, _) = colibri_engine::generate::logprobs::token_text(tok, all[i]);
        assert_eq!(tokens[i], text.as_str());
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "{top:?}");
        let best = top.values().map(|x| x.as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
        let wbest = want[i - 1].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert!((best - wbest).abs() < 1e-9);
        if i >= ids.len() {
            // Greedy: the chosen token is the most likely one.
            close(&lp["token_logprobs"][i], wbest, &format!("greedy token {i}"));
        }
    }
    // text is the prompt then the completion; offsets count its characters.
    let text = v["choices"][0]["text"].as_str().unwrap();
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(text.chars().count(), joined.chars().count());
    let offsets: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));

    // max_tokens 0 with echo scores the prompt alone; the same numbers.
    let body = json!({"model": MODEL, "prompt": ids, "max_tokens": 0, "logprobs": 0, "echo": true});
    let r = s.post("/v1/completions", &body.to_string()).json();
    let l0 = &r["choices"][0]["logprobs"];
    assert_eq!(l0["tokens"].as_array().unwrap().len(), ids.len(), "{r}");
    for i in 1..ids.len() {
        assert_eq!(l0["token_logprobs"][i], lp["token_logprobs"][i]);
        assert_eq!(l0["top_logprobs"][i], json!({}));
    }
    assert_eq!(r["usage"]["completion_tokens"], 0);

    // Streamed: the same entries, spread over the chunks.
    let mut body = json!({"model": MODEL, "prompt": ids, "max_tokens": n, "temperature": 0, "ignore_eos": true,
                          "logprobs": 3, "echo": true, "stream": true});
    let mut c = Conn::open(s.addr).unwrap();
    c.send("POST", "/v1/completions", &[], body.to_string().as_bytes()).unwrap();
    let (events, done) = read_sse(&mut c);
    assert!(done);
    let mut streamed = Vec::new();
    let mut offs = Vec::new();
    for e in &events {
        let l = &e["choices"][0]["logprobs"];
        if !l.is_null() {
            streamed.extend(l["token_logprobs"].as_array().unwrap().iter().cloned());
            offs.extend(l["text_offset"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()));
        }
    }
    assert_eq!(streamed, lp["token_logprobs"].as_array().unwrap().clone());
    assert_eq!(offs, offsets);
    // Without logprobs nothing changes: logprobs null, echo still returns the prompt.
    body["stream"] = json!(false);
    body.as_object_mut().unwrap().remove("logprobs");
    let plain = s.post("/v1/completions", &body.to_string()).json();
    assert!(plain["choices"][0]["logprobs"].is_null());
    assert_eq!(plain["choices"][0]["text"], v["choices"][0]["text"]);
}

#[test]
fn chat_logprobs_in_openai_shape_streamed_and_not() {
    let s = start("chatlogprobs", |_| {});
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6,
                      "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 4});
    let v = s.post("/v1/chat/completions", &body.to_string()).json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len(), 6, "{v}");
    assert!(v["choices"][0]["logprobs"]["refusal"].is_null());
    for e in &content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 4);
        // Sorted, and greedy picks the first.
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{lps:?}");
        assert_eq!(top[0]["token"], e["token"]);
        assert_eq!(top[0]["logprob"], e["logprob"]);
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        let bytes: Vec<u8> = e["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
        if let Ok(s) = std::str::from_utf8(&bytes) {
            if !s.contains('\u{FFFD}') {
                assert_eq!(e["token"].as_str().unwrap(), s);
            }
        }
    }
    // The content is the tokens' text.
    let text: String = content.iter().map(|e| e["token"].as_str().unwrap()).collect();
    if !text.contains('\u{FFFD}') {
        assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), text);
    }

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let mut c = Conn::open(s.addr).unwrap();
    c.send("POST", "/v1/chat/completions", &[], sb.to_string().as_bytes()).unwrap();
    let (events, done) = read_sse(&mut c);
    assert!(done);
    let streamed: Vec<Value> = events
        .iter()
        .filter_map(|e| e["choices"][0]["logprobs"]["content"].as_array())
        .flat_map(|a| a.iter().cloned())
        .collect();
    assert_eq!(streamed, content);

    // logprobs: true alone gives empty top_logprobs; without it, null as before.
    let mut b = body.clone();
    b.as_object_mut().unwrap().remove("top_logprobs");
    let v1 = s.post("/v1/chat/completions", &b.to_string()).json();
    let c1 = v1["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(c1.len(), 6);
    assert_eq!(c1[0]["top_logprobs"], json!([]));
    assert_eq!(c1[0]["logprob"], content[0]["logprob"]);
    b.as_object_mut().unwrap().remove("logprobs");
    let v0 = s.post("/v1/chat/completions", &b.to_string()).json();
    assert!(v0["choices"][0]["logprobs"].is_null());
    assert_eq!(v0["choices"][0]["message"], v["choices"][0]["message"]);

    // Bad values are refused, naming the parameter.
    for (extra, param) in [
        (json!({"top_logprobs": 3}), "top_logprobs"),
        (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        (json!({"logprobs": 3}), "logprobs"),
    ] {
        let mut b = json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = s.post("/v1/chat/completions", &b.to_string());
        assert_eq!(r.status, 400, "{b}");
        assert_eq!(r.json()["error"]["param"], param);
    }
    let r = s.post("/v1/completions", &json!({"model": MODEL, "prompt": "a", "logprobs": true}).to_string());
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "logprobs");
}

#[test]
fn choose_endpoint_scores_options_like_the_engine() {
    let s = start("choose", |_| {});
    let options = ["a", " yes", " no no"];
    let body = json!({"model": MODEL, "prompt": "The answer is", "options": options, "raw": true});
    let r = s.post("/v1/choose", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "choice");
    assert_eq!(v["model"], MODEL);

    // Independently: prompt + option teacher-forced in one pass each, log-softmax here.
    let loaded = crate::load::open_dir(&s.model_dir(), &crate::load::CacheFlags::with_ram(None), true).unwrap();
    let tok = loaded.tokenizer.as_ref().unwrap();
    let vocab = loaded.model.cfg.vocab;
    let p = tok.encode("The answer is", true).unwrap();
    let mut sums = Vec::new();
    for o in options {
        let oi = tok.encode(o, false).unwrap();
        let all: Vec<u32> = p.iter().chain(&oi).copied().collect();
        let rows = loaded.model.forward(&mut loaded.model.new_session(), &all, Logits::All).unwrap();
        let lsm = log_softmax(&rows, vocab);
        sums.push((0..oi.len()).map(|j| lsm[p.len() - 1 + j][oi[j] as usize]).sum::<f64>());
    }
    let z: f64 = sums.iter().map(|x| x.exp()).sum();
    for (i, w) in sums.iter().enumerate() {
        close(&v["logprobs"][i], *w, &format!("option {i}"));
        close(&v["probabilities"][i], w.exp() / z, &format!("probability {i}"));
    }
    assert_eq!(v["usage"]["prompt_tokens"], p.len());

    // The chat template by default, or messages; the same question gives the same answer.
    let chat = s.post("/v1/choose", &json!({"model": MODEL, "prompt": "hello", "options": options}).to_string()).json();
    let msgs = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "options": options});
    assert_eq!(s.post("/v1/choose", &msgs.to_string()).json()["probabilities"], chat["probabilities"]);

    for (bad, param) in [
        (json!({"model": MODEL, "prompt": "x", "options": []}), "options"),
        (json!({"model": MODEL, "prompt": "x", "options": ["a", ""]}), "options"),
        (json!({"model": MODEL, "options": ["a"]}), "prompt"),
        (
            json!({"model": MODEL, "prompt": "x", "options": ["a"], "messages": [{"role": "user", "content": "x"}]}),
            "prompt",
        ),
        (json!({"model": MODEL, "prompt": "x".repeat(30000), "options": ["a"], "raw": true}), "prompt"),
        (json!({"prompt": "x", "options": ["a"]}), "model"),
    ] {
        let r = s.post("/v1/choose", &bad.to_string());
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{}", r.text());
    }
}
