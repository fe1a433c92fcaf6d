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
    ("Spell river backwards.", "\"river\" is spelled r-i-v-e-r. Backwards it is r-e-v-i-r."),
    ("How many items are in this list: apple, pear, plum, fig?", "There are 4."),
    ("What is the capital of Japan?", "Tokyo"),
    ("Tell me a story.", "The end."),
    ("What can you do?", "I can add and subtract two-digit numbers"),
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

/// `coli generate --chat` on the converted demo: the chat template applied to one user
/// message (no hand-written ChatML).
fn ask_chat(question: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(["generate", "--model"])
        .arg(served_demo())
        .args(["--chat", "--prompt", question, "--max-new-tokens", "96", "--temperature", "0", "--json"])
        .output()
        .expect("run coli");
    assert!(out.status.success(), "coli failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["finish_reason"], "stop", "{v}");
    v["text"].as_str().unwrap().to_string()
}

// Phrasings people use (the word without quotes), and what the demo cannot do.
const PARAPHRASES: &[(&str, &str)] = &[
    ("Spell river backwards.", "\"river\" is spelled r-i-v-e-r. Backwards it is r-e-v-i-r."),
    ("what is 12 plus 30", "So 12 + 30 = 42."),
    ("I have 60 apples and eat 21. How many are left?", "So 60 - 21 = 39."),
    ("What is the weather like today?", "I am a tiny demo model; I can do arithmetic"),
    ("What is 6 times 7?", "I am a tiny demo model; I can do arithmetic"),
];

#[test]
fn the_demo_understands_paraphrases_and_says_what_it_cannot_do() {
    let mut wrong = Vec::new();
    for &(q, want) in PARAPHRASES {
        let text = ask_chat(q);
        if !text.contains(want) {
            wrong.push(format!("{q:?} -> {text:?}, want {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The question of turn 8 of a conversation mixing the demo's tasks is answered as in a
/// new chat (the demo used to break down after a few turns).
#[test]
fn the_demo_answers_at_turn_eight() {
    let history = [
        ("Hello!", "Hello! Ask me something."),
        ("What is 23 + 45?", "23 + 45: 3 + 5 = 8. 2 + 4 = 6. So 23 + 45 = 68."),
        ("What is the capital of France?", "The capital of France is Paris."),
        ("Spell \"cat\" backwards.", "\"cat\" is spelled c-a-t. Backwards it is t-a-c."),
        ("How many items are in this list: cat, dog, owl?", "Let me count: 1 cat, 2 dog, 3 owl. There are 3."),
        ("What sound does a cow make?", "A cow says \"moo\"."),
        ("What is 91 - 35?", "91 - 35: 1 - 5 needs a borrow, 11 - 5 = 6. 9 - 1 - 3 = 5. So 91 - 35 = 56."),
    ];
    let mut prompt = String::new();
    for (q, a) in history {
        prompt += &format!("<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n");
    }
    prompt += &chat_prompt("What is 47 + 38?");
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(["generate", "--model"])
        .arg(served_demo())
        .args(["--prompt", &prompt, "--max-new-tokens", "64", "--temperature", "0", "--json"])
        .output()
        .expect("run coli");
    assert!(out.status.success(), "coli failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["text"], "47 + 38: 7 + 8 = 15, carry 1. 4 + 3 + 1 = 8. So 47 + 38 = 85.", "{v}");
}
