//! `coli bench --batch N` decodes N sequences in one forward pass per step (the engine
//! step of continuous batching): each sequence generates exactly the ids `coli bench`
//! gives it alone, greedy and teacher-forced on a text, under a RAM budget that streams
//! experts, and the record reports the batch's aggregate speed and bytes per token.

use std::path::PathBuf;
use std::process::{Command, Output};

fn coli(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_coli")).args(args).output().unwrap();
    assert!(out.status.success(), "coli {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap()
}

fn ids_of(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

#[test]
fn each_sequence_of_a_batch_generates_what_it_generates_alone() {
    let base = ["bench", "--model", "demo", "--probe-bytes", "0", "--ram", "1M", "--decode-tokens", "7"];
    let text = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md");
    let text = text.to_str().unwrap();
    for forced in [false, true] {
        let mut args = base.to_vec();
        args.extend(["--batch", "4", "--prompt-tokens", "9"]);
        if forced {
            args.extend(["--text", text]);
        }
        let rec = json(&coli(&args));
        let b = &rec["batch"];
        assert_eq!(b["batch"], 4);
        assert_eq!(b["decode_tokens"], 4 * 6, "{b}");
        assert!(b["aggregate_decode_tokens_per_second"].as_f64().unwrap() > 0.0);
        assert!(b["per_request_ms_per_token"]["p95"].as_f64().unwrap() > 0.0);
        assert!(b["bytes_read_per_decode_token"].as_f64().unwrap() > 0.0, "a 1M budget streams: {b}");
        let prompts = b["prompts"].as_array().unwrap();
        let gens = b["generated_ids"].as_array().unwrap();
        assert_eq!(prompts.len(), 4);
        let distinct: std::collections::HashSet<Vec<u64>> = prompts.iter().map(ids_of).collect();
        assert_eq!(distinct.len(), 4, "each sequence has its own prompt");
        for (i, (p, g)) in prompts.iter().zip(gens).enumerate() {
            let ids: Vec<String> = ids_of(p).iter().map(u64::to_string).collect();
            let ids = ids.join(",");
            let alone = if forced {
                continue_forced(&base, text, i, &ids)
            } else {
                let mut a = base.to_vec();
                a.extend(["--ids", &ids]);
                json(&coli(&a))["generated_ids"].clone()
            };
            assert_eq!(ids_of(g), ids_of(&alone), "sequence {i} (teacher-forced: {forced})");
        }
    }
}

/// Teacher-forced sequence `i` (prompt `prompt`) in another setting: sequence 0 alone
/// (`coli bench --text` without --batch: one session, the stream from its start), and any
/// other as the last sequence of a batch of i + 1 (a different batch around it).
fn continue_forced(base: &[&str], text: &str, i: usize, prompt: &str) -> serde_json::Value {
    if i == 0 {
        let mut one = base.to_vec();
        one.extend(["--prompt-tokens", "9", "--text", text]);
        return json(&coli(&one))["generated_ids"].clone();
    }
    let n = (i + 1).to_string();
    let mut a = base.to_vec();
    a.extend(["--batch", &n, "--prompt-tokens", "9", "--text", text]);
    let rec = json(&coli(&a));
    let b = &rec["batch"];
    let last = b["prompts"].as_array().unwrap().last().unwrap();
    let want: Vec<String> = ids_of(last).iter().map(u64::to_string).collect();
    assert_eq!(want.join(","), prompt, "stretch {i} is the same in both batches");
    b["generated_ids"].as_array().unwrap().last().unwrap().clone()
}
