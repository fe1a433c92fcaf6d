//! `coli serve --draft mtp`: drafts from each model's own MTP layer (the deepseek_v3_mtp
//! fixture; olmoe has none and uses prompt lookup), answers equal to the answers without,
//! and the per-request `speculate` field: off, fewer drafts, or a 400 beyond the server's;
//! MTP generations running together in one batch give the same answers.

use std::sync::Barrier;

use serde_json::{json, Value};

use super::*;

fn with_mtp_model(dir: &std::path::Path) {
    copy_dir(&fixture("deepseek_v3_mtp"), &dir.join("models/ds"));
}

/// The first choice of a chat completion (or the error's status and param).
fn chat(s: &TestServer, body: &Value) -> Result<Value, (u16, Value)> {
    let r = s.post("/v1/chat/completions", &body.to_string());
    match r.status {
        200 => Ok(r.json()["choices"][0].clone()),
        st => Err((st, r.json()["error"]["param"].clone())),
    }
}

fn drafted(s: &TestServer) -> u64 {
    s.health()["generations"]["speculation"]["drafted"].as_u64().unwrap()
}

#[test]
fn mtp_drafts_give_the_answers_without_them() {
    let plain = start_with("mtp-plain", |_| {}, |_| {}, with_mtp_model);
    let mtp = start_with(
        "mtp-on",
        |a| {
            a.speculate = 2;
            a.draft = Some("mtp".into());
        },
        |_| {},
        with_mtp_model,
    );
    let msg = |q: &str| json!([{"role": "user", "content": q}]);
    let mut bodies = Vec::new();
    for q in ["What is 47 + 38?", "Tell me a story."] {
        bodies.push(json!({"model": "ds", "messages": msg(q), "max_tokens": 30, "temperature": 0}));
        bodies.push(json!({"model": "ds", "messages": msg(q), "max_tokens": 30, "temperature": 1, "seed": 7}));
    }
    bodies.push(json!({"model": "ds", "messages": msg("Hi"), "max_tokens": 20, "temperature": 0.8, "seed": 3,
                       "logprobs": true, "top_logprobs": 2}));
    // No MTP layer: prompt lookup.
    bodies.push(json!({"model": MODEL, "messages": msg("Weather?"), "max_tokens": 20, "temperature": 0}));
    for b in &bodies {
        assert_eq!(chat(&mtp, b).unwrap(), chat(&plain, b).unwrap(), "{b}");
    }
    let c = json!({"model": "ds", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "logprobs": 2, "echo": true});
    let completion = |s: &TestServer| {
        let r = s.post("/v1/completions", &c.to_string());
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["choices"][0].clone()
    };
    assert_eq!(completion(&mtp), completion(&plain));
    let h = mtp.health()["generations"]["speculation"].clone();
    assert!(
        h["drafted"].as_u64().unwrap() > 0 && h["accepted"].as_u64().unwrap() <= h["drafted"].as_u64().unwrap(),
        "{h}"
    );
    assert_eq!(drafted(&plain), 0);

    // Per request: off, fewer, and more than the server allows.
    let b = json!({"model": "ds", "messages": msg("Count to ten."), "max_tokens": 24, "temperature": 0});
    let want = chat(&plain, &b).unwrap();
    let before = drafted(&mtp);
    for off in [json!(0), json!(false)] {
        let mut r = b.clone();
        r["speculate"] = off;
        assert_eq!(chat(&mtp, &r).unwrap(), want);
        assert_eq!(drafted(&mtp), before, "speculate {} drafts nothing", r["speculate"]);
    }
    let mut r = b.clone();
    r["speculate"] = json!(1);
    assert_eq!(chat(&mtp, &r).unwrap(), want);
    let one = drafted(&mtp) - before;
    assert!(one > 0 && one <= 23, "{one} drafts for 24 tokens at 1 per step");
    for (server, n) in [(&mtp, json!(3)), (&plain, json!(1)), (&mtp, json!("two")), (&mtp, json!(-1))] {
        let mut r = b.clone();
        r["speculate"] = n.clone();
        assert_eq!(chat(server, &r).unwrap_err(), (400, json!("speculate")), "speculate {n}");
    }
    let mut r = b.clone();
    r["speculate"] = json!(true);
    assert_eq!(chat(&plain, &r).unwrap(), want, "true: the server's setting (off)");
}

/// Generations drafting from the MTP layer join the batch like any other (the pass gives
/// each its positions' states): four at once give the answers of a server without drafts.
#[test]
fn mtp_generations_in_one_batch_give_the_answers_without_drafts() {
    let plain = start_with("mtp-batch-plain", |_| {}, |_| {}, with_mtp_model);
    let mtp = start_with(
        "mtp-batch",
        |a| {
            a.parallel = Some(4);
            a.speculate = 2;
            a.draft = Some("mtp".into());
        },
        |_| {},
        with_mtp_model,
    );
    let msg = |q: &str| json!([{"role": "user", "content": q}]);
    let bodies = [
        json!({"model": "ds", "messages": msg("What is 47 + 38?"), "max_tokens": 30, "temperature": 0}),
        json!({"model": "ds", "messages": msg("Tell me a story."), "max_tokens": 30, "temperature": 1, "seed": 7}),
        json!({"model": "ds", "messages": msg("Hi"), "max_tokens": 24, "temperature": 0.8, "seed": 3,
               "logprobs": true, "top_logprobs": 2}),
        json!({"model": "ds", "messages": msg("Count to ten."), "max_tokens": 28, "temperature": 0, "speculate": 1}),
    ];
    // The server without drafts takes no `speculate` (it allows none).
    let want: Vec<Value> = bodies
        .iter()
        .map(|b| {
            let mut b = b.clone();
            b.as_object_mut().map(|o| o.remove("speculate"));
            chat(&plain, &b).unwrap()
        })
        .collect();
    // Load the model first, so that the four arrive at a loaded model together.
    chat(&mtp, &json!({"model": "ds", "messages": msg("a"), "max_tokens": 1})).unwrap();
    let before = drafted(&mtp);
    let solo = super::batch::metric(&mtp, "colibri_engine_solo_passes_total");
    let barrier = Barrier::new(bodies.len());
    let got: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = bodies
            .iter()
            .map(|b| {
                let (mtp, barrier) = (&mtp, &barrier);
                sc.spawn(move || {
                    barrier.wait();
                    chat(mtp, b).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "request {i} ({}) differs in the batch", bodies[i]);
    }
    assert!(drafted(&mtp) > before, "the batch's generations drafted from the MTP layer");
    let most = super::batch::metric(&mtp, "colibri_engine_pass_sequences_max");
    assert!(most >= 2.0, "at most {most} MTP generations ran in one pass");
    assert_eq!(
        super::batch::metric(&mtp, "colibri_engine_solo_passes_total"),
        solo,
        "every MTP generation joined the shared passes"
    );
}
