//! `coli generate --draft DIR` / `coli bench --draft DIR`: speculative decoding with drafts
//! from a smaller model of the same tokenizer. The target is the demo checkpoint
//! (models/demo-hf, f32), the draft the committed converted demo (models/demo: int8
//! weights, the same tokenizer), and the demo drafting for itself: the ids are the ones
//! without a draft, greedy and sampled. A draft with another tokenizer is one line.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(args: &[&str]) -> Value {
    let o = coli().args(args).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_draft_model_changes_passes_not_tokens() {
    let target = root().join("models/demo-hf");
    let (t, int8) = (target.to_str().unwrap(), root().join("models/demo"));
    for q in ["What is 47 + 38?", "Tell me a story.", "Spell \"garden\" backwards."] {
        for sampling in [["--temperature", "0"], ["--temperature", "1"]] {
            let base =
                ["generate", "--model", t, "--chat", "--prompt", q, "--max-new-tokens", "48", "--seed", "4", "--json"];
            let with = |extra: &[&str]| run(&[&base[..], &sampling[..], extra].concat());
            let plain = with(&[]);
            assert!(!plain["ids"].as_array().unwrap().is_empty());
            for (draft, n) in [(int8.to_str().unwrap(), "3"), (t, "5")] {
                let fast = with(&["--draft", draft, "--speculate", n]);
                assert_eq!(fast["ids"], plain["ids"], "{q} {sampling:?} draft {draft}");
                assert_eq!((&fast["text"], &fast["finish_reason"]), (&plain["text"], &plain["finish_reason"]));
                let s = &fast["speculation"];
                let (drafted, accepted) = (s["drafted"].as_u64().unwrap(), s["accepted"].as_u64().unwrap());
                assert_eq!(s["produced"].as_u64().unwrap() as usize, plain["ids"].as_array().unwrap().len(), "{s}");
                assert!(drafted > 0 && accepted <= drafted, "{s}");
                if draft == t && sampling[1] == "0" {
                    // Drafting for itself, greedy: every draft is what the model draws.
                    assert_eq!(accepted, drafted, "{s}");
                    assert!(s["forwards"].as_u64().unwrap() * 3 <= s["produced"].as_u64().unwrap() + 6, "{s}");
                }
            }
        }
    }
    // bench: the same greedy ids with a draft, and the draft in the record.
    let ids = "2046,882,198,2044,261";
    let bench = |extra: &[&str]| {
        let base =
            ["bench", "--model", t, "--ids", ids, "--decode-tokens", "24", "--probe-bytes", "0", "--cache", "warm"];
        run(&[&base[..], extra].concat())
    };
    let (plain, fast) = (bench(&[]), bench(&["--draft", int8.to_str().unwrap()]));
    assert_eq!(plain["generated_ids"], fast["generated_ids"]);
    assert_eq!(fast["speculation"]["draft"]["max_draft"], 4, "{}", fast["speculation"]);
    assert!(fast["speculation"]["accepted"].as_u64().unwrap() > 0, "{}", fast["speculation"]);
}

#[test]
fn a_draft_with_another_tokenizer_is_refused_in_one_line() {
    let other = root().join("tests/fixtures/qwen3_moe");
    let o = coli()
        .args(["generate", "--model"])
        .arg(root().join("models/demo"))
        .args(["--prompt", "Hello", "--max-new-tokens", "4", "--draft"])
        .arg(&other)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("another tokenizer") && err.contains("qwen3_moe"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let o = coli()
        .args(["bench", "--model"])
        .arg(root().join("models/demo"))
        .args(["--probe-bytes", "0", "--draft", "/no/such/draft"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.trim_end().lines().count() == 1, "{err}");
}
