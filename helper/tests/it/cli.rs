//! The `coli` command line as scripts use it: real processes, real files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// A scratch copy of a fixture that a test may damage.
fn scratch_copy(name: &str, tag: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("coli-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    dst
}

fn reference(name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(fixture(name).join("reference.json")).unwrap()).unwrap()
}

fn ids_arg(v: &serde_json::Value) -> String {
    v.as_array().unwrap().iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

/// Asserts a failed run with exactly one line on stderr, mentioning `needle`.
fn assert_clean_failure(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr: {err}");
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "panic: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "want one line on stderr, got: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "stderr {err:?} does not mention {needle:?}");
}

#[test]
fn logits_command_writes_the_reference_logits() {
    let r = reference("olmoe");
    let out_file = std::env::temp_dir().join(format!("coli-logits-{}.f32", std::process::id()));
    let out = coli()
        .args(["logits", "--model"])
        .arg(fixture("olmoe"))
        .args(["--ids", &ids_arg(&r["ids"]), "--out"])
        .arg(&out_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Vec<f32> =
        std::fs::read(&out_file).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let want: Vec<f32> = std::fs::read(fixture("olmoe").join("logits.bin"))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got.len(), want.len());
    let std = r["logits_std"].as_f64().unwrap();
    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
    assert!(worst / std < 1e-3, "{worst}");
    let _ = std::fs::remove_file(out_file);
}

#[test]
fn generate_json_reproduces_the_greedy_reference() {
    for name in ["mixtral", "deepseek_v3", "deepseek_v3_fp8", "qwen3_next", "qwen3_5_moe"] {
        let r = reference(name);
        let want: Vec<u64> = r["greedy"]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        let out = coli()
            .args(["generate", "--model"])
            .arg(fixture(name))
            .args([
                "--ids",
                &ids_arg(&r["greedy"]["prompt_ids"]),
                "--max-new-tokens",
                &want.len().to_string(),
                "--temperature",
                "0",
                "--json",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
        let got: Vec<u64> = v["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        assert_eq!(got, want, "{name}");
        assert!(v["text"].is_string());
        assert_eq!(v["finish_reason"], "length");
    }
}

#[test]
fn generate_from_text_prompt_is_seeded_and_reproducible() {
    let run = |seed: &str| {
        let out = coli()
            .args(["generate", "--model"])
            .arg(fixture("qwen3_moe"))
            .args([
                "--prompt",
                "Hello there",
                "--max-new-tokens",
                "12",
                "--temperature",
                "1.0",
                "--top-p",
                "0.9",
                "--seed",
                seed,
                "--ignore-eos",
                "--json",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["prompt_ids"], serde_json::json!(reference_ids("qwen3_moe", "Hello there")));
        v["ids"].clone()
    };
    let a = run("7");
    assert_eq!(a.as_array().unwrap().len(), 12);
    assert_eq!(a, run("7"));
    assert_ne!(a, run("8"));
}

/// The tokenizer's ids for `text` as transformers recorded them, if the fixture has them;
/// else what the fixture tokenizer gives through the engine.
fn reference_ids(name: &str, text: &str) -> serde_json::Value {
    let t = colibri_engine::tokenizer::Tokenizer::from_dir(&fixture(name)).unwrap();
    serde_json::json!(t.encode(text, true).unwrap())
}

#[test]
fn chat_streams_an_answer_per_line_of_input() {
    use std::io::Write;
    // deepseek_v3: the second turn reuses the MLA latent cache of the first; qwen3_next:
    // its recurrent state.
    for name in ["qwen3_moe", "deepseek_v3", "qwen3_next"] {
        let mut child = coli()
            .args(["chat", "--model"])
            .arg(fixture(name))
            .args(["--max-new-tokens", "5", "--temperature", "0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"Hello\nAnd again\n/reset\nHello\n/quit\n").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        let answers: Vec<&str> = text.lines().collect();
        assert_eq!(answers.len(), 3, "{name}: {text:?}");
        // Greedy, and /reset forgot the first exchange: the same question gives the same answer.
        assert_eq!(answers[0], answers[2], "{name}");
    }
}

#[test]
fn missing_model_directory() {
    let out =
        coli().args(["logits", "--model", "/nonexistent/model", "--ids", "1", "--out", "/dev/null"]).output().unwrap();
    assert_clean_failure(&out, "/nonexistent/model");
}

#[test]
fn truncated_safetensors() {
    let dir = scratch_copy("olmoe", "trunc");
    let f = dir.join("model.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.set_len(len / 2).unwrap();
    let out =
        coli().args(["logits", "--model"]).arg(&dir).args(["--ids", "1,2", "--out", "/dev/null"]).output().unwrap();
    assert_clean_failure(&out, "truncated");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn missing_shard() {
    let dir = scratch_copy("qwen2_moe", "shard");
    std::fs::remove_file(dir.join("model-00003-of-00005.safetensors")).unwrap();
    let out = coli().args(["logits", "--model"]).arg(&dir).args(["--ids", "1", "--out", "/dev/null"]).output().unwrap();
    assert_clean_failure(&out, "model-00003-of-00005.safetensors");
    let _ = std::fs::remove_dir_all(dir);
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(p, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn unknown_model_type() {
    let dir = scratch_copy("mixtral", "mtype");
    edit_config(&dir, |v| v["model_type"] = "falcon_mamba".into());
    let out = coli().args(["generate", "--model"]).arg(&dir).args(["--ids", "1", "--json"]).output().unwrap();
    assert_clean_failure(&out, "falcon_mamba");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tensor_with_the_wrong_shape() {
    let dir = scratch_copy("qwen3_moe", "shape");
    edit_config(&dir, |v| v["moe_intermediate_size"] = 40.into());
    let out = coli().args(["logits", "--model"]).arg(&dir).args(["--ids", "1", "--out", "/dev/null"]).output().unwrap();
    assert_clean_failure(&out, "has shape");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn ids_outside_the_vocabulary() {
    let out = coli()
        .args(["logits", "--model"])
        .arg(fixture("olmoe"))
        .args(["--ids", "3,401", "--out", "/dev/null"])
        .output()
        .unwrap();
    assert_clean_failure(&out, "401");
    let out = coli()
        .args(["logits", "--model"])
        .arg(fixture("olmoe"))
        .args(["--ids", "3,x", "--out", "/dev/null"])
        .output()
        .unwrap();
    assert_clean_failure(&out, "\"x\"");
}

#[test]
#[cfg(not(feature = "wgpu"))]
fn wgpu_backend_says_it_is_not_built() {
    let out = coli()
        .args(["generate", "--model"])
        .arg(fixture("olmoe"))
        .args(["--ids", "1", "--backend", "wgpu"])
        .output()
        .unwrap();
    assert_clean_failure(&out, "wgpu");
}
// With the feature, helper/tests/it/gpu_cli.rs runs --backend wgpu against --backend cpu.

#[test]
fn bench_routing_reports_lookahead_recall_and_cache_hit_rates() {
    let out =
        coli().args(["bench-routing", "--model"]).arg(fixture("qwen3_moe")).args(["--tokens", "6"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON record");
    let (k, k2) = (v["lookahead"]["recall_top_k"].as_f64().unwrap(), v["lookahead"]["recall_top_2k"].as_f64().unwrap());
    assert!((0.0..=1.0).contains(&k) && k2 >= k && k2 <= 1.0, "{v}");
    let caches = v["caches"].as_array().unwrap();
    assert_eq!(caches.len(), 3);
    let mut last = 0.0;
    for c in caches {
        let lru = c["lru_hit_rate"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&lru) && (0.0..=1.0).contains(&c["pinned_hit_rate"].as_f64().unwrap()));
        // Caches are listed smallest first; a larger LRU never hits less on the same trace.
        assert!(lru >= last, "{v}");
        last = lru;
    }
}

#[test]
fn generate_stops_cleanly_at_the_context_limit() {
    // qwen3_moe's context is 128 positions: after a 126-token prompt, k tokens need
    // 126 + k - 1 positions, so exactly 3 fit (the last one is never fed).
    let ids: Vec<String> = (0..126).map(|i| ((i * 37 + 5) % 300).to_string()).collect();
    let run = |ids: &[String]| {
        coli()
            .args(["generate", "--model"])
            .arg(fixture("qwen3_moe"))
            .args(["--ids", &ids.join(","), "--max-new-tokens", "10", "--ignore-eos", "--json"])
            .output()
            .unwrap()
    };
    let out = run(&ids);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ids"].as_array().unwrap().len(), 3, "{v}");
    assert_eq!(v["finish_reason"], "length");
    // A prompt longer than the context is refused with one line, before any step.
    let long: Vec<String> = (0..129).map(|i| (i % 300).to_string()).collect();
    let out = run(&long);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("context"), "{err}");
}

/// `coli bench --warmup` runs the prompt once before the timed prefill: with `--ram all`
/// every expert the timed prefill uses is then resident (a run without the warm-up reads
/// them during the prefill); only the router lookahead may still read a guessed expert.
#[test]
fn bench_warmup_leaves_the_timed_prefill_on_resident_experts() {
    let dir = std::env::temp_dir().join(format!("coli-cli-bench-warmup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out =
        coli().arg("convert").arg(fixture("qwen3_moe")).arg("-o").arg(&dir).args(["--quant", "int8"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bench = |warmup: bool| {
        let mut c = coli();
        c.args(["bench", "--model"]).arg(&dir).args(["--ram", "all", "--cache", "warm", "--probe-bytes", "0"]);
        c.args(["--prompt-tokens", "12", "--decode-tokens", "3", "--threads", "1"]);
        if warmup {
            c.arg("--warmup");
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("one JSON record")
    };
    let (cold, warm) = (bench(false), bench(true));
    assert_eq!(cold["warmup"], false);
    assert_eq!(warm["warmup"], true);
    // Keys and values of 2 kv heads x 20 dims, in 2 layers, f32.
    assert_eq!(cold["model"]["kv_cache_bytes_per_token"], 2 * (2 * 20) * 2 * 4);
    assert_eq!(cold["model"]["attention"], "gqa");
    assert!(cold["prefill"]["hit_rate"]["disk"].as_f64().unwrap() > 0.0, "{cold}");
    assert_eq!(warm["prefill"]["hit_rate"]["disk"].as_f64(), Some(0.0), "{warm}");
    // Only the router lookahead (off by default) could read during a warm prefill; a read
    // it started may still be in flight when the prefill ends (counted in its bytes, not
    // yet in bytes_read).
    let prefetched = warm["prefill"]["prefetch"]["bytes"].as_u64().unwrap();
    let read = warm["prefill"]["bytes_read"].as_u64().unwrap();
    assert!(read <= prefetched, "{warm}");
    // Same prompt, same greedy tokens whether or not the experts were loaded first.
    assert_eq!(cold["generated_ids"], warm["generated_ids"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn generate_help_says_the_prompt_is_raw_unless_chat() {
    let out = coli().args(["generate", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--chat") && help.contains("raw completion: no chat template"), "{help}");
    // --chat needs a text prompt: with --ids it is refused.
    let out = coli().args(["generate", "--model", "demo", "--ids", "1,2", "--chat"]).output().unwrap();
    assert!(!out.status.success());
}

/// `coli rm` never deletes outside `$COLI_HOME`. The audit's layout: an owner directory
/// linked to elsewhere (`own -> /elsewhere`) where the model is itself a link
/// (`/elsewhere/m3 -> real-m3`): `coli rm own/m3` removed `/elsewhere/m3`. Now refused.
/// Links inside a model's directory are removed with it, their targets kept.
#[cfg(unix)]
#[test]
fn rm_never_leaves_the_models_directory() {
    use std::os::unix::fs::symlink;
    let base = std::env::temp_dir().join(format!("coli-cli-rm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (home, elsewhere) = (base.join("home"), base.join("elsewhere"));
    std::fs::create_dir_all(&home).unwrap();
    let real = scratch_copy("olmoe", "rm-real");
    std::fs::create_dir_all(&elsewhere).unwrap();
    symlink(&real, elsewhere.join("m3")).unwrap();
    symlink(&elsewhere, home.join("own")).unwrap();
    let rm = |id: &str| coli().env("COLI_HOME", &home).args(["rm", "--yes", id]).output().unwrap();
    assert_clean_failure(&rm("own/m3"), "outside the models directory");
    assert!(std::fs::symlink_metadata(elsewhere.join("m3")).is_ok(), "the link outside was removed");
    assert!(real.join("config.json").is_file());

    // A model whose directory holds links to a file and a directory outside.
    let model = home.join("acme/inside");
    std::fs::create_dir_all(&model).unwrap();
    for e in std::fs::read_dir(&real).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, model.join(p.file_name().unwrap())).unwrap();
    }
    std::fs::write(elsewhere.join("keep.txt"), b"keep").unwrap();
    std::fs::create_dir_all(elsewhere.join("keepdir")).unwrap();
    std::fs::write(elsewhere.join("keepdir/x"), b"x").unwrap();
    symlink(elsewhere.join("keep.txt"), model.join("notes.txt")).unwrap();
    symlink(elsewhere.join("keepdir"), model.join("extra")).unwrap();
    let out = rm("acme/inside");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!home.join("acme").exists());
    assert_eq!(std::fs::read(elsewhere.join("keep.txt")).unwrap(), b"keep");
    assert!(elsewhere.join("keepdir/x").is_file());
    assert!(real.join("config.json").is_file());
    let _ = std::fs::remove_dir_all(&base);
    let _ = std::fs::remove_dir_all(&real);
}
