//! The committed demo model (models/demo-hf, trained by tools/train_demo.py) answers
//! held-out arithmetic questions correctly through the native path: `coli generate`,
//! greedy (temperature 0), on the ChatML-rendered prompt.
//!
//! The operand pairs below were held out of training (never seen in any phrasing); the
//! model works the sum out column by column ("7 + 8 = 15, carry 1. ...") and the test
//! checks the final line and, for a few, the whole answer.

use std::path::PathBuf;
use std::process::Command;

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/demo-hf")
}

fn chat_prompt(question: &str) -> String {
    format!("<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
}

/// Greedy answer of the demo model to one user turn, as `coli generate --json` gives it.
fn ask(question: &str) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(["generate", "--model"])
        .arg(model_dir())
        .args(["--prompt", &chat_prompt(question), "--max-new-tokens", "64", "--temperature", "0", "--json"])
        .output()
        .expect("run coli");
    assert!(out.status.success(), "coli failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    (v["text"].as_str().unwrap().to_string(), v["finish_reason"].as_str().unwrap().to_string())
}

/// The number after the last "=" of the answer ("... So 47 + 38 = 85.").
fn final_number(text: &str) -> Option<i64> {
    let tail = text.trim().trim_end_matches('.').rsplit('=').next()?;
    tail.trim().parse().ok()
}

// (question, expected result) — held-out operand pairs, several phrasings.
const CASES: &[(&str, i64)] = &[
    ("Please add 46 to 21.", 67),
    ("How much is 33 + 81?", 114),
    ("Add 51 and 77.", 128),
    ("Compute 75 + 95.", 170),
    ("What is 77 plus 99?", 176),
    ("What is 49 minus 21?", 28),
    ("Calculate 99 minus 26.", 73),
    ("What is 96 minus 49?", 47),
    ("How much is 53 - 26?", 27),
    ("Compute 90 - 88.", 2),
];

#[test]
fn demo_model_does_held_out_arithmetic() {
    let mut wrong = Vec::new();
    for &(q, want) in CASES {
        let (text, finish) = ask(q);
        if final_number(&text) != Some(want) || finish != "stop" {
            wrong.push(format!("{q:?} -> {text:?} (finish {finish}), want {want}"));
        }
    }
    assert!(wrong.is_empty(), "wrong answers:\n{}", wrong.join("\n"));
}

#[test]
fn demo_model_shows_its_column_addition() {
    let (text, _) = ask(FULL_ANSWER.0);
    assert_eq!(text, FULL_ANSWER.1);
}

const FULL_ANSWER: (&str, &str) =
    ("Compute 75 + 95.", "75 + 95: 5 + 5 = 10, carry 1. 7 + 9 + 1 = 17. So 75 + 95 = 170.");

/// The converted demo model the helper serves (models/demo, int8) and its example prompts.
fn served_demo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/demo")
}

// What the demo answers to each prompt of models/demo/examples.json (the chat page offers
// them on an empty chat): a part of the answer that only a right answer contains.
const EXAMPLES: &[(&str, &str)] = &[
    ("What is 47 + 38?", "So 47 + 38 = 85."),
    ("What is 91 minus 46?", "So 91 - 46 = 45."),
    ("Spell \"garden\" backwards.", "Backwards it is n-e-d-r-a-g."),
    ("How many items are in this list: apple, pear, plum, fig?", "There are 4."),
    ("What is the capital of Japan?", "Tokyo"),
    ("Tell me a story.", "The end."),
];

#[test]
fn the_example_prompts_are_answered_well() {
    let file = std::fs::read(served_demo().join("examples.json")).expect("models/demo/examples.json");
    let v: serde_json::Value = serde_json::from_slice(&file).expect("examples.json is JSON");
    let prompts: Vec<&str> =
        v["prompts"].as_array().expect("{\"prompts\": [...]}").iter().map(|p| p.as_str().unwrap()).collect();
    let known: Vec<&str> = EXAMPLES.iter().map(|e| e.0).collect();
    assert_eq!(prompts, known, "every example prompt needs a checked answer here");
    let mut wrong = Vec::new();
    for &(q, want) in EXAMPLES {
        let out = Command::new(env!("CARGO_BIN_EXE_coli"))
            .args(["generate", "--model"])
            .arg(served_demo())
            .args(["--prompt", &chat_prompt(q), "--max-new-tokens", "96", "--temperature", "0", "--json"])
            .output()
            .expect("run coli");
        assert!(out.status.success(), "coli failed: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        let (text, finish) = (v["text"].as_str().unwrap_or(""), v["finish_reason"].as_str().unwrap_or(""));
        if !text.contains(want) || finish != "stop" {
            wrong.push(format!("{q:?} -> {text:?} (finish {finish}), want {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "example prompts answered badly:\n{}", wrong.join("\n"));
}
