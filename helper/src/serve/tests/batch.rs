//! Continuous batching (`coli serve --parallel N`): generations that run together in one
//! batch give exactly what each gives alone — tokens, text, logprobs, finish reasons —
//! whatever their settings: greedy, sampled with a seed, penalties and logit_bias, stop
//! strings, logprobs, structured output, speculation from a draft model and from prompt
//! lookup, echo with prompt logprobs, and a prompt long enough to be fed in chunks while
//! the others decode.

use std::sync::Barrier;

use serde_json::{json, Value};

use super::*;

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

fn with_demo(dir: &Path) {
    copy_dir(&repo("models/demo-hf"), &dir.join("models/demo"));
}

/// A server of the demo checkpoint with drafts from the converted demo, `parallel` at once.
fn server(tag: &str, parallel: usize) -> TestServer {
    start_with(
        tag,
        |a| {
            a.parallel = Some(parallel);
            a.max_queue = 16;
            a.speculate = 3;
            a.draft = Some(repo("models/demo"));
        },
        |_| {},
        with_demo,
    )
}

/// Eight requests, each different.
fn requests() -> Vec<(&'static str, Value)> {
    let chat = |q: &str, extra: Value| {
        let mut b = json!({"model": "demo", "messages": [{"role": "user", "content": q}], "speculate": false});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        ("/v1/chat/completions", b)
    };
    // A prompt of more than one PREFILL_CHUNK (256 positions): fed in chunks, in the batch.
    let long: String = (0..90).map(|i| format!("{} plus {} is {}. ", i, i + 3, 2 * i + 3)).collect();
    vec![
        chat("What is 47 + 38?", json!({"max_tokens": 40, "temperature": 0})),
        chat("Tell me a story.", json!({"max_tokens": 48, "temperature": 0.9, "top_p": 0.9, "seed": 11})),
        chat(
            "Spell \"garden\" backwards.",
            json!({"max_tokens": 40, "temperature": 0.7, "seed": 5, "frequency_penalty": 0.8,
                   "presence_penalty": 0.5, "logit_bias": {"30": -100}}),
        ),
        chat("Count from one to ten.", json!({"max_tokens": 40, "temperature": 0, "stop": ["five", "5"]})),
        chat(
            "How many legs does a cat have?",
            json!({"max_tokens": 24, "temperature": 0.8, "seed": 3,
                                                      "logprobs": true, "top_logprobs": 3}),
        ),
        chat(
            "Describe a dog.",
            json!({"max_tokens": 60, "temperature": 0.6, "seed": 9, "response_format": {"type": "json_schema",
                   "json_schema": {"name": "d", "schema": {"type": "object", "properties": {"name": {"type": "string"}},
                   "required": ["name"]}}}}),
        ),
        chat("What is 12 times 3?", json!({"max_tokens": 40, "temperature": 0, "speculate": 3})),
        (
            "/v1/completions",
            json!({"model": "demo", "prompt": long, "max_tokens": 16, "temperature": 0.5, "seed": 2,
                   "echo": true, "logprobs": 2, "speculate": 2}),
        ),
    ]
}

/// What must not change: every choice, and the completion's length.
fn answer(r: &client::Response) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    json!({"choices": v["choices"], "completion_tokens": v["usage"]["completion_tokens"]})
}

/// A sample of `name` in `/metrics` (the first series of that name).
pub(super) fn metric(s: &TestServer, name: &str) -> f64 {
    let text = s.get("/metrics", &[]).text();
    let line = text.lines().find(|l| l.starts_with(name) && !l.starts_with('#')).unwrap_or_else(|| panic!("{name}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn eight_generations_in_one_batch_give_what_each_gives_alone() {
    let reqs = requests();
    let alone: Vec<Value> = {
        let s = server("batch-alone", 1);
        reqs.iter().map(|(path, body)| answer(&s.post(path, &body.to_string()))).collect()
    };
    let s = server("batch-8", 8);
    // Load the model first, so that the eight arrive at a loaded model together.
    let warm = json!({"model": "demo", "prompt": "a", "max_tokens": 1, "speculate": false});
    assert_eq!(s.post("/v1/completions", &warm.to_string()).status, 200);
    let passes_before = metric(&s, "colibri_engine_passes_total");
    let barrier = Barrier::new(reqs.len());
    let together: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = reqs
            .iter()
            .map(|(path, body)| {
                let (s, barrier) = (&s, &barrier);
                sc.spawn(move || {
                    barrier.wait();
                    answer(&s.post(path, &body.to_string()))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, t, "request {i} ({}) differs in the batch", reqs[i].1);
    }
    // They did run together: passes fed several generations at once.
    let most = metric(&s, "colibri_engine_pass_sequences_max");
    let passes = metric(&s, "colibri_engine_passes_total") - passes_before;
    let fed = metric(&s, "colibri_engine_pass_sequences_total");
    eprintln!("batch: {passes} passes, at most {most} generations in one, {fed} fed in all");
    assert!(most >= 4.0, "at most {most} generations ran in one pass");
    assert_eq!(metric(&s, "colibri_model_parallel{model=\"demo\"}"), 8.0);
    // Each answer is real: the greedy arithmetic answer and the structured one.
    assert!(alone[5]["choices"][0]["message"]["content"].as_str().unwrap().starts_with('{'), "{}", alone[5]);
    assert!(alone[7]["choices"][0]["logprobs"]["tokens"].as_array().unwrap().len() > 256, "{}", alone[7]);
    assert_eq!(s.health()["generations"]["active"], 0);
}

/// A full queue answers 503 with Retry-After, and the batch never runs more than
/// `--parallel` at once.
#[test]
fn a_full_queue_says_when_to_retry() {
    let s = start("batch-busy", |a| {
        a.parallel = Some(2);
        a.max_queue = 3;
    });
    let warm = json!({"model": MODEL, "prompt": "a", "max_tokens": 1});
    assert_eq!(s.post("/v1/completions", &warm.to_string()).status, 200);
    let body =
        json!({"model": MODEL, "prompt": "a", "max_tokens": 400, "temperature": 0, "ignore_eos": true}).to_string();
    let barrier = Barrier::new(6);
    let answers: Vec<(u16, Option<String>)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..6)
            .map(|_| {
                let (s, body, barrier) = (&s, &body, &barrier);
                sc.spawn(move || {
                    barrier.wait();
                    let r = s.post("/v1/completions", body);
                    (r.status, r.header("retry-after").map(str::to_string))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = answers.iter().filter(|a| a.0 == 200).count();
    assert!(ok >= 3, "{answers:?}");
    assert!(answers.iter().any(|a| a.0 == 503), "six at once past a queue of three: {answers:?}");
    for a in answers.iter().filter(|a| a.0 != 200) {
        assert_eq!(a.0, 503, "{answers:?}");
        assert_eq!(a.1.as_deref(), Some("2"), "a 503 says when to retry: {answers:?}");
    }
    assert!(metric(&s, "colibri_engine_pass_sequences_max") <= 2.0);
}

/// A request that starts like one still running (a widget's visitors, one system prompt)
/// copies that generation's cache instead of feeding the common part again, and answers
/// exactly what it answers alone.
#[test]
fn a_request_shares_the_prefill_of_a_running_one() {
    let system: String = (0..40).map(|i| format!("Rule {i}: be brief. ")).collect();
    let ask = |q: &str, max: u32| {
        json!({"model": "demo", "max_tokens": max, "temperature": 0, "speculate": false,
               "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]})
    };
    let second = ask("What is 2 + 2?", 12);
    let alone = {
        let s = server("share-alone", 2);
        answer(&s.post("/v1/chat/completions", &second.to_string()))
    };
    let s = server("share", 2);
    // The first visitor's answer streams (it runs); the second arrives meanwhile.
    let mut first = ask("Tell me a story.", 400);
    first["stream"] = json!(true);
    first["ignore_eos"] = json!(true);
    let mut a = Conn::open(s.addr).unwrap();
    a.send("POST", "/v1/chat/completions", &[], first.to_string().as_bytes()).unwrap();
    assert_eq!(a.read_head().unwrap().0, 200);
    a.read_chunk().unwrap();
    let r = s.post("/v1/chat/completions", &second.to_string());
    assert_eq!(answer(&r), alone);
    let cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt = r.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached > prompt / 2, "{cached} of {prompt} prompt tokens came from the running generation");
    a.stream().shutdown(std::net::Shutdown::Both).unwrap();
}

/// A client that hangs up mid-answer leaves the batch at the next step; the others run on
/// and answer exactly what they answer alone.
#[test]
fn a_client_leaving_the_batch_changes_nothing_for_the_others() {
    let reqs = requests();
    let (a, b) = (&reqs[0], &reqs[1]);
    let alone: Vec<Value> = {
        let s = server("leave-alone", 1);
        [a, b].iter().map(|(path, body)| answer(&s.post(path, &body.to_string()))).collect()
    };
    let s = server("leave", 4);
    let long = json!({"model": "demo", "prompt": "Once", "max_tokens": 600, "ignore_eos": true,
                          "stream": true, "speculate": false, "temperature": 0});
    let mut gone = Conn::open(s.addr).unwrap();
    gone.send("POST", "/v1/completions", &[], long.to_string().as_bytes()).unwrap();
    assert_eq!(gone.read_head().unwrap().0, 200);
    gone.read_chunk().unwrap();
    let together: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = [a, b]
            .into_iter()
            .map(|(path, body)| {
                let s = &s;
                sc.spawn(move || answer(&s.post(path, &body.to_string())))
            })
            .collect();
        // The third client hangs up while the two run beside it.
        std::thread::sleep(std::time::Duration::from_millis(30));
        gone.stream().shutdown(std::net::Shutdown::Both).unwrap();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(alone, together);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while s.health()["generations"]["active"] != 0 {
        assert!(std::time::Instant::now() < deadline, "the abandoned generation never left the batch");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(s.health()["generations"]["cancelled"].as_u64().unwrap() >= 1);
}
