//! `coli choose` as scripts use it: the scores checked against `coli logits` (a
//! log-softmax computed here over the teacher-forced logits of prompt + option).

use std::path::PathBuf;
use std::process::Command;

use colibri_engine::tokenizer::Tokenizer;

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn choose(args: &[&str]) -> serde_json::Value {
    let out = coli().args(["choose", "--model"]).arg(fixture("olmoe")).args(args).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Teacher-forced logits of `ids` from `coli logits`: (ids.len(), vocab).
fn logits(ids: &[u32], tag: usize) -> Vec<f32> {
    let file = std::env::temp_dir().join(format!("coli-choose-{}-{tag}.f32", std::process::id()));
    let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let out = coli()
        .args(["logits", "--model"])
        .arg(fixture("olmoe"))
        .args(["--ids", &ids.join(","), "--out"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = std::fs::read(&file).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let _ = std::fs::remove_file(&file);
    v
}

fn log_softmax_at(row: &[f32], id: u32) -> f64 {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
    row[id as usize] as f64 - m - s.ln()
}

#[test]
fn choose_scores_options_as_teacher_forced_sums() {
    let prompt = "The answer is";
    let options = ["a", " yes", " no no no"];
    let v = choose(&["--raw", "--prompt", prompt, "--options", &options.join("|")]);
    let tok = Tokenizer::from_dir(&fixture("olmoe")).unwrap();
    let p = tok.encode(prompt, true).unwrap();
    assert_eq!(v["prompt_tokens"], p.len());
    let mut read = p.len();
    let mut z = 0.0;
    for (i, o) in options.iter().enumerate() {
        let oi = tok.encode(o, false).unwrap();
        assert_eq!(v["option_tokens"][i], oi.len());
        read += oi.len() - 1;
        let all: Vec<u32> = p.iter().chain(&oi).copied().collect();
        let rows = logits(&all, i);
        let vocab = rows.len() / all.len();
        let want: f64 = (0..oi.len()).map(|j| log_softmax_at(&rows[(p.len() - 1 + j) * vocab..][..vocab], oi[j])).sum();
        let got = v["logprobs"][i].as_f64().unwrap();
        assert!((got - want).abs() < 1e-6, "option {i}: {got} vs {want}");
        z += want.exp();
    }
    let probs: Vec<f64> = v["probabilities"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    for (i, prob) in probs.iter().enumerate() {
        let want = v["logprobs"][i].as_f64().unwrap().exp() / z;
        assert!((prob - want).abs() < 1e-9, "{i}: {prob} vs {want}");
    }
    assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    let h = v["entropy"].as_f64().unwrap();
    assert!((0.0..=3f64.ln() + 1e-12).contains(&h));
    assert_eq!(v["tokens_read"], read, "the prompt once, each option but its last token");
    let best = (0..3).max_by(|&a, &b| probs[a].total_cmp(&probs[b])).unwrap();
    assert_eq!(v["choice"], options[best]);

    // By default the prompt goes through the chat template: more tokens, other scores.
    let chat = choose(&["--prompt", prompt, "--options", &options.join("|")]);
    assert!(chat["prompt_tokens"].as_u64().unwrap() > p.len() as u64);
    // Plain output: one line per option, then the choice.
    let out = coli()
        .args(["choose", "--model"])
        .arg(fixture("olmoe"))
        .args(["--raw", "--prompt", prompt, "--options", &options.join("|")])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 4, "{text}");
    assert!(text.lines().last().unwrap().starts_with("choice: "), "{text}");
}

#[test]
fn choose_refuses_bad_options_in_one_line() {
    for opts in ["a||b", ""] {
        let out = coli()
            .args(["choose", "--model"])
            .arg(fixture("olmoe"))
            .args(["--prompt", "x", "--options", opts])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}

#[test]
fn generate_logprobs_match_a_log_softmax_of_coli_logits() {
    let prompt = [5u32, 17, 3, 42];
    let ids: Vec<String> = prompt.iter().map(|i| i.to_string()).collect();
    let out = coli()
        .args(["generate", "--model"])
        .arg(fixture("olmoe"))
        .args(["--ids", &ids.join(","), "--max-new-tokens", "4", "--temperature", "0", "--ignore-eos"])
        .args(["--json", "--logprobs", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let new: Vec<u32> = v["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let lps = v["logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), new.len());
    let all: Vec<u32> = prompt.iter().chain(&new).copied().collect();
    let rows = logits(&all, 99);
    let vocab = rows.len() / all.len();
    for (k, (&id, e)) in new.iter().zip(lps).enumerate() {
        let row = &rows[(prompt.len() - 1 + k) * vocab..][..vocab];
        let want = log_softmax_at(row, id);
        let got = e["logprob"].as_f64().unwrap();
        assert!((got - want).abs() < 1e-9, "token {k}: {got} vs {want}");
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["logprob"], e["logprob"]);
    }
    // Without --json the flag is refused.
    let out = coli()
        .args(["generate", "--model"])
        .arg(fixture("olmoe"))
        .args(["--ids", "5,17", "--logprobs", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
