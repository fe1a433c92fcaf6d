//! `--draft mtp`: speculative decoding with drafts from the model's own multi-token-
//! prediction layer, on the fixtures with one (tests/fixtures/{deepseek_v3,glm4_moe,
//! glm_moe_dsa}_mtp, tools/fixtures_mtp.py; glm_moe_dsa_mtp decodes past its index_topk,
//! so the sparse attention decides the tokens), from the checkpoint and from a converted container (which keeps
//! the MTP layer, its experts streamed like the others): the ids are the ones without it,
//! greedy and sampled. A model without an MTP layer is refused in one line.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-mtp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn run(args: &[&str]) -> Value {
    let o = coli().args(args).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let o = coli().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "{args:?} succeeded");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// Generation with and without MTP drafts gives the same ids (32 of them: whatever a
/// random model's tokens, an end-of-sequence token does not stop it); returns the drafts' stats.
fn same_ids(model: &Path) -> Vec<Value> {
    let m = model.to_str().unwrap();
    let mut stats = Vec::new();
    for sampling in [["--temperature", "0"], ["--temperature", "0.9"]] {
        let base = [
            "generate",
            "--model",
            m,
            "--ids",
            "5,17,3,99,41,7",
            "--max-new-tokens",
            "32",
            "--ignore-eos",
            "--seed",
            "3",
            "--json",
        ];
        let with = |extra: &[&str]| run(&[&base[..], &sampling[..], extra].concat());
        let plain = with(&[]);
        assert_eq!(plain["ids"].as_array().unwrap().len(), 32, "{plain}");
        for n in [None, Some("3")] {
            let extra: Vec<&str> = match n {
                Some(n) => vec!["--draft", "mtp", "--speculate", n],
                None => vec!["--draft", "mtp"],
            };
            let fast = with(&extra);
            assert_eq!(fast["ids"], plain["ids"], "{m} {sampling:?} {extra:?}");
            let s = &fast["speculation"];
            assert_eq!(s["produced"].as_u64().unwrap(), 32, "{s}");
            // The fixtures' MTP layers are random: their drafts are (nearly) never accepted.
            assert!(s["drafted"].as_u64().unwrap() > 0 && s["forwards"].as_u64().unwrap() <= 32, "{s}");
            stats.push(s.clone());
        }
    }
    stats
}

#[test]
fn mtp_drafts_change_passes_not_tokens() {
    for name in ["deepseek_v3_mtp", "glm4_moe_mtp", "glm_moe_dsa_mtp", "qwen3_5_moe_mtp"] {
        for s in same_ids(&fixture(name)) {
            eprintln!("{name}: {s}");
        }
    }
}

#[test]
fn a_converted_model_keeps_its_mtp_layer() {
    let out = scratch("convert");
    let src = fixture("deepseek_v3_mtp");
    let o = coli().arg("convert").arg(&src).arg("-o").arg(&out).args(["--quant", "f32"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let manifest: Value = serde_json::from_slice(&std::fs::read(out.join("colibri.json")).unwrap()).unwrap();
    let layers: Vec<u64> =
        manifest["experts"]["layers"].as_array().unwrap().iter().map(|l| l["layer"].as_u64().unwrap()).collect();
    assert_eq!(layers, [1, 2, 3], "the MTP layer (3) streams its experts like layers 1 and 2");
    let dense = manifest["dense"]["tensors"].as_array().unwrap();
    assert!(dense.iter().any(|t| t["name"] == "model.layers.3.eh_proj.weight"));
    same_ids(&out);
    // f32 container, f32-upcast bf16 checkpoint: the same greedy ids as the checkpoint.
    let ids = |m: &Path| {
        run(&["generate", "--model", m.to_str().unwrap(), "--ids", "5,17,3", "--max-new-tokens", "16", "--json"])["ids"]
            .clone()
    };
    assert_eq!(ids(&out), ids(&src));
    // bench: the same greedy ids with MTP drafts, and the draft source in the record.
    let bench = |extra: &[&str]| {
        let base = ["bench", "--model", out.to_str().unwrap(), "--ids", "5,17,3", "--decode-tokens", "24"];
        run(&[&base[..], &["--probe-bytes", "0", "--cache", "warm"], extra].concat())
    };
    let (plain, fast) = (bench(&[]), bench(&["--draft", "mtp", "--speculate", "2"]));
    assert_eq!(plain["generated_ids"], fast["generated_ids"]);
    let s = &fast["speculation"];
    assert_eq!((&s["draft"]["path"], &s["draft"]["max_draft"]), (&Value::from("mtp"), &Value::from(2)), "{s}");
    assert!(s["drafted"].as_u64().unwrap() > 0, "{s}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_model_without_mtp_is_refused_in_one_line() {
    let m = fixture("deepseek_v3");
    let m = m.to_str().unwrap();
    let err = fails(&["generate", "--model", m, "--ids", "5,17", "--max-new-tokens", "4", "--draft", "mtp"]);
    assert!(err.contains("no MTP layer"), "{err}");
    let err = fails(&["bench", "--model", m, "--ids", "5,17", "--probe-bytes", "0", "--draft", "mtp"]);
    assert!(err.contains("no MTP layer"), "{err}");
}

/// Qwen3.5's `mtp.*` module survives `coli convert` under its own names, its routed
/// experts streamed as the layer after the main stack's, and drafts from the container
/// change no token.
#[test]
fn a_converted_qwen3_5_model_keeps_its_mtp_module() {
    let out = scratch("convert-qwen");
    let src = fixture("qwen3_5_moe_mtp");
    let o = coli().arg("convert").arg(&src).arg("-o").arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let manifest: Value = serde_json::from_slice(&std::fs::read(out.join("colibri.json")).unwrap()).unwrap();
    let layers: Vec<u64> =
        manifest["experts"]["layers"].as_array().unwrap().iter().map(|l| l["layer"].as_u64().unwrap()).collect();
    assert_eq!(layers, [0, 1, 2, 3, 4], "the MTP layer (4) streams its experts");
    let dense = manifest["dense"]["tensors"].as_array().unwrap();
    for name in ["mtp.fc.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.layers.0.self_attn.q_proj.weight"] {
        assert!(dense.iter().any(|t| t["name"] == name), "{name} kept");
    }
    same_ids(&out);
    let _ = std::fs::remove_dir_all(&out);
}
