//! Conversation caches of a model whose state goes back only to snapshots (Gated
//! DeltaNet: tests/fixtures/qwen3_5_moe; DeepSeek-V4's compressed state:
//! tests/fixtures/deepseek_v4): the prompt's passes end after the system
//! messages, so that other conversations with the same system prompt (a widget's
//! visitors) keep it, and before the last id of a long prompt, so that the same prompt
//! again (a regenerated answer) feeds one id. Every answer is the one of a server that
//! keeps no cache (tokens and log-probabilities).

use serde_json::{json, Value};

use super::*;

/// A server of `fixture` (its context raised to 1024 positions: a long prompt), served
/// as "m"; `kv` the --kv-cache budget.
fn serve(tag: &str, fixture_name: &str, kv: Option<u64>) -> TestServer {
    serve_with(tag, fixture_name, kv, 0)
}

/// [`serve`] with --speculate `speculate` (prompt lookup).
fn serve_with(tag: &str, fixture_name: &str, kv: Option<u64>, speculate: usize) -> TestServer {
    start_with(
        tag,
        |a| {
            a.kv_cache = kv;
            a.speculate = speculate;
        },
        |_| {},
        |dir| {
            let m = dir.join("models/m");
            copy_dir(&fixture(fixture_name), &m);
            let cfg = m.join("config.json");
            let mut v: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
            match v.get_mut("text_config") {
                Some(t) => t["max_position_embeddings"] = json!(1024),
                None => v["max_position_embeddings"] = json!(1024),
            }
            std::fs::write(&cfg, v.to_string()).unwrap();
        },
    )
}

fn system() -> String {
    let rules: String = (1..=10).map(|i| format!("Rule {i}: be kind. ")).collect();
    format!("You answer questions about animals. {rules}")
}

fn ask(s: &TestServer, body: &Value) -> Value {
    let r = s.post(
        if body.get("messages").is_some() { "/v1/chat/completions" } else { "/v1/completions" },
        &body.to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn chat(question: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "system", "content": system()}, {"role": "user", "content": question}],
           "temperature": 0.9, "seed": 7, "max_tokens": 12, "logprobs": true, "top_logprobs": 2})
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or_else(|| panic!("no cached_tokens: {v}"))
}

#[test]
fn a_gated_deltanet_model_keeps_the_system_prompt_and_a_long_prompt_for_its_answer_again() {
    keeps_the_system_prompt_and_a_long_prompt("qwen3_5_moe");
}

#[test]
fn a_deepseek_v4_model_keeps_the_system_prompt_and_a_long_prompt_for_its_answer_again() {
    keeps_the_system_prompt_and_a_long_prompt("deepseek_v4");
}

fn keeps_the_system_prompt_and_a_long_prompt(model: &str) {
    let s = serve(&format!("recurrent-{model}"), model, None);
    let plain = serve(&format!("recurrent-none-{model}"), model, Some(0));
    // The system messages alone, rendered: what every visitor's prompt starts with.
    let first = ask(&s, &chat("Tell me about birds."));
    assert_eq!(cached(&first), 0);
    assert_eq!(first["choices"][0], ask(&plain, &chat("Tell me about birds."))["choices"][0]);
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    for q in ["What about cats?", "And fish, do they sleep?"] {
        let v = ask(&s, &chat(q));
        // At least the system prompt's words (about 60 tokens), not the question.
        assert!(cached(&v) > 50 && cached(&v) < v["usage"]["prompt_tokens"].as_u64().unwrap() - 4, "{q}: {v}");
        assert_eq!(v["choices"][0], ask(&plain, &chat(q))["choices"][0], "{q}");
    }
    assert!(cached(&first) < prompt);

    // A prompt of 300 ids, then the same again (a regenerated answer): one id fed again.
    let ids: Vec<u32> = (0..300).map(|i| (i * 37 + 11) % 200 + 5).collect();
    let body = json!({"model": "m", "prompt": ids, "max_tokens": 6, "temperature": 0.8, "seed": 3, "logprobs": 2});
    let a = ask(&s, &body);
    assert_eq!(cached(&a), 0);
    let want = ask(&plain, &body)["choices"][0].clone();
    assert_eq!(a["choices"][0], want);
    let again = ask(&s, &body);
    assert_eq!(cached(&again), 299, "{again}");
    assert_eq!(again["choices"][0], want);
    // A prompt that leaves it after 250 ids goes back to the start (no snapshot there).
    let mut other = ids.clone();
    other[250] = 3;
    let o = ask(&s, &json!({"model": "m", "prompt": other, "max_tokens": 6, "temperature": 0}));
    assert_eq!(cached(&o), 0, "{o}");
}

/// Visitors arriving together run in one batch, their prompts cut after the system
/// messages and copied from each other's running sessions where those already hold it:
/// each gets the answer a server that keeps nothing gives it alone, and then a later
/// visitor keeps the system prompt.
#[test]
fn visitors_arriving_together_get_their_own_answers() {
    for model in ["qwen3_5_moe", "deepseek_v4"] {
        let s = serve(&format!("recurrent-batch-{model}"), model, None);
        let plain = serve(&format!("recurrent-batch-none-{model}"), model, Some(0));
        let qs = ["Why is the sky blue?", "Name a bird.", "What do owls eat?", "Do fish sleep?"];
        let alone: Vec<Value> = qs.iter().map(|q| ask(&plain, &chat(q))["choices"][0].clone()).collect();
        let warm = json!({"model": "m", "prompt": [1, 2], "max_tokens": 1});
        ask(&s, &warm);
        let barrier = std::sync::Barrier::new(qs.len());
        let together: Vec<Value> = std::thread::scope(|sc| {
            let hs: Vec<_> = qs
                .iter()
                .map(|q| {
                    let (s, barrier) = (&s, &barrier);
                    sc.spawn(move || {
                        barrier.wait();
                        ask(s, &chat(q))["choices"][0].clone()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(alone, together, "{model}");
        let later = ask(&s, &chat("Can crows count?"));
        assert!(cached(&later) > 50, "{model}: {later}");
        assert_eq!(later["choices"][0], ask(&plain, &chat("Can crows count?"))["choices"][0], "{model}");
    }
}

/// The state after the system prompt stays (its snapshot pinned) while later passes come
/// and go: with prompt-lookup speculation every step with drafts is a multi-token pass
/// that takes a snapshot, and a message longer than a prefill chunk is fed in several;
/// either pushed the system prompt's snapshot out of the two kept, and the next visitor
/// fed it again. The verify passes' snapshots are transient: the same long request again
/// (Regenerate) feeds one id.
#[test]
fn the_system_prompt_stays_through_speculation_and_a_long_message() {
    for model in ["qwen3_5_moe", "deepseek_v4"] {
        let s = serve_with(&format!("recurrent-spec-{model}"), model, None, 4);
        let plain = serve(&format!("recurrent-spec-none-{model}"), model, Some(0));
        let long: String = (0..150).map(|i| format!("w{i} ")).collect();
        let ask_long = |q: &str| {
            let mut v = chat(q);
            v["max_tokens"] = json!(40);
            v["temperature"] = json!(0);
            v
        };
        for q in ["Tell me about birds.", long.as_str(), "What about cats?"] {
            let v = ask(&s, &ask_long(q));
            assert_eq!(v["choices"][0], ask(&plain, &ask_long(q))["choices"][0], "{model}: {q}");
            if q.len() > 100 {
                let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
                assert!(prompt - cached(&v) > 256, "{model}: {v}");
                // Regenerate: the verify passes' snapshots did not push out the cut
                // before the prompt's last id.
                let again = ask(&s, &ask_long(q));
                assert_eq!(cached(&again), prompt - 1, "{model}: {again}");
                assert_eq!(again["choices"][0], v["choices"][0], "{model}");
            }
        }
        // The greedy answers repeat themselves, so prompt lookup drafted: verify passes ran.
        let m = s.get("/metrics", &[]).text();
        let drafted = m.lines().find(|l| l.starts_with("colibri_speculation_drafted_total"));
        let n = drafted.and_then(|l| l.rsplit(' ').next()).and_then(|n| n.parse::<f64>().ok());
        assert!(n.is_some_and(|n| n > 0.0), "{model}: {m}");
        let later = ask(&s, &ask_long("Can crows count?"));
        assert!(cached(&later) > 50, "{model}: {later}");
        assert_eq!(later["choices"][0], ask(&plain, &ask_long("Can crows count?"))["choices"][0], "{model}");
    }
}
