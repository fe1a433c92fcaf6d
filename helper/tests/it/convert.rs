//! `coli convert` and the colibri container, end to end: every fixture converted to every
//! stored type and checked against the transformers reference; bit-identical logits for
//! every `--ram` budget; resume after an abort or SIGKILL gives identical bytes; corrupted
//! experts and damaged manifests are clear errors.
//!
//! Run with `--nocapture` to see the quality table that docs/benchmarks.md records.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use colibri_engine::experts::cache::CacheOptions;
use colibri_engine::generate::{generate, GenerateOptions};
use colibri_engine::sampler::SamplerConfig;
use colibri_engine::{Logits, Model};
use serde_json::Value;

const FIXTURES: [&str; 10] = [
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "olmoe",
    "deepseek_v3",
    "deepseek_v3_noqlora",
    "glm4_moe",
    "gpt_oss",
    "qwen3_next",
    "qwen3_next_f32",
];

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-convert-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn reference(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(fixture(name).join("reference.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn convert(src: &Path, dst: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = coli();
    c.arg("convert").arg(src).arg("-o").arg(dst).args(extra);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn convert_ok(src: &Path, dst: &Path, extra: &[&str]) {
    let out = convert(src, dst, extra, &[]);
    assert!(out.status.success(), "convert {extra:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

fn logits(model: &Model, name: &str) -> Vec<f32> {
    let mut s = model.new_session();
    model.forward(&mut s, &ids(&reference(name)["ids"]), Logits::All).unwrap()
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v as f64));
    let z = x.iter().map(|v| (*v as f64 - m).exp()).sum::<f64>().ln();
    x.iter().map(|v| *v as f64 - m - z).collect()
}

fn argmax(x: &[f32]) -> usize {
    colibri_engine::math::argmax(x)
}

struct Quality {
    rel: f64,
    kl: f64,
    agree: f64,
    greedy: usize,
}

/// Compares logits with the reference: max |diff| / std, mean KL(ref || got), argmax
/// agreement, and how many greedy tokens match before the first difference.
fn quality(name: &str, model: &Model, got: &[f32]) -> Quality {
    let r = reference(name);
    let want = f32s(&std::fs::read(fixture(name).join("logits.bin")).unwrap());
    let vocab = model.cfg.vocab;
    assert_eq!(got.len(), want.len());
    let std = r["logits_std"].as_f64().unwrap();
    let worst = got.iter().zip(&want).map(|(a, b)| (*a as f64 - *b as f64).abs()).fold(0.0, f64::max);
    let (mut kl, mut agree) = (0.0, 0);
    let n = want.len() / vocab;
    for p in 0..n {
        let (w, g) = (&want[p * vocab..(p + 1) * vocab], &got[p * vocab..(p + 1) * vocab]);
        let (lw, lg) = (log_softmax(w), log_softmax(g));
        kl += lw.iter().zip(&lg).map(|(a, b)| a.exp() * (a - b)).sum::<f64>();
        agree += (argmax(w) == argmax(g)) as usize;
    }
    let prompt = ids(&r["greedy"]["prompt_ids"]);
    let want_new = ids(&r["greedy"]["new_ids"]);
    let opts = GenerateOptions {
        max_new_tokens: want_new.len(),
        sampler: SamplerConfig::default(),
        stop_ids: vec![],
        logprobs: None,
    };
    let mut s = model.new_session();
    let (new, _) = generate(model, &mut s, &prompt, &opts, &mut |_| true).unwrap();
    let greedy = new.iter().zip(&want_new).take_while(|(a, b)| a == b).count();
    Quality { rel: worst / std, kl: kl / n as f64, agree: agree as f64 / n as f64, greedy }
}

#[test]
fn every_fixture_in_every_type_against_transformers() {
    let root = scratch("types");
    let mut table = vec!["| model | --quant | max abs diff / std | mean KL(ref||got) | argmax agreement | greedy tokens matching (of 24) |".to_string(), "|---|---|---|---|---|---|".to_string()];
    let mut failures = Vec::new();
    for name in FIXTURES {
        let hf = Model::open_dir(&fixture(name)).unwrap();
        let hf_logits = logits(&hf, name);
        let configs: [(&str, &[&str]); 7] = [
            ("f32", &["--quant", "f32"]),
            ("bf16", &["--quant", "bf16"]),
            ("f16", &["--quant", "f16"]),
            ("int8", &["--quant", "int8"]),
            ("int4", &["--quant", "int4"]),
            ("int4 --group-size 32", &["--quant", "int4", "--group-size", "32"]),
            ("int4 --attn int8 --mlp int8", &["--quant", "int4", "--attn", "int8", "--mlp", "int8"]),
        ];
        for (k, (quant, args)) in configs.into_iter().enumerate() {
            let dst = root.join(format!("{name}-{k}"));
            convert_ok(&fixture(name), &dst, args);
            let model = Model::open_dir(&dst).unwrap_or_else(|e| panic!("{name} {quant}: {e}"));
            let got = logits(&model, name);
            let q = quality(name, &model, &got);
            table.push(format!(
                "| {name} | {quant} | {:.2e} | {:.2e} | {:.0}% | {} |",
                q.rel,
                q.kl,
                q.agree * 100.0,
                q.greedy
            ));
            let bits_equal = got.iter().zip(&hf_logits).all(|(a, b)| a.to_bits() == b.to_bits());
            let on_disk = reference(name)["dtype_on_disk"].as_str().unwrap().to_string();
            let lossless = quant == "f32"
                || (quant == "bf16" && on_disk == "bfloat16")
                || (quant == "f16" && on_disk == "float16");
            // Lossless conversions must reproduce the checkpoint's own path bit for bit (and so
            // meet the transformers bar); the lossy ones are regression guards a little below
            // what docs/benchmarks.md records.
            // deepseek_v3's sigmoid routers choose on scores whose margins in these tiny
            // random models go down to 2e-4 (tests/fixtures/README.md): rounding bf16 or
            // int8 weights flips a few expert choices, and each flip moves a position's
            // logits by O(1). The engine is not the cause: with only the attention weights
            // rounded to bf16, transformers and the engine agree to 9e-6 of std. Their
            // gates are the measured numbers (bf16 KL 0.09, int8 KL 0.17-0.37) with margin.
            let sensitive = name.starts_with("deepseek_v3");
            // qwen3_next's tiny random models are as touchy: transformers itself, given
            // the fixture's weights rounded to int8 (groups of 64), moves to KL 0.14 with
            // 69% argmax agreement (embeddings alone: KL 0.09), so its gates are also the
            // measured numbers (int8 KL 0.23 / 0.07 at 73% agreement; f16 of the f32 case
            // 6.0e-2 of std at KL 5e-5) with margin.
            let touchy = name.starts_with("qwen3_next");
            let ok = match quant {
                _ if lossless => bits_equal && q.rel <= 1e-3,
                "bf16" if sensitive => q.kl < 0.2 && q.agree >= 0.9,
                "int8" if sensitive => q.kl < 0.6 && q.agree >= 0.6,
                "f16" if touchy => q.rel <= 0.1 && q.kl < 1e-4 && q.agree >= 0.95,
                "int8" if touchy => q.kl < 0.4 && q.agree >= 0.65,
                "f16" => q.rel <= 5e-2 && q.kl < 1e-4 && q.agree >= 0.95,
                "bf16" => q.rel <= 0.5 && q.kl < 1e-2 && q.agree >= 0.95,
                "int8" => q.kl < 0.1 && q.agree >= 0.85,
                _ => q.kl < 3.0 && q.agree >= 0.15,
            };
            if !ok {
                failures.push(format!(
                    "{name} {quant}: bits equal {bits_equal}, rel {:.2e}, kl {:.2e}, agreement {}, greedy {}",
                    q.rel, q.kl, q.agree, q.greedy
                ));
            }
        }
    }
    eprintln!("\n{}\n", table.join("\n"));
    let _ = std::fs::remove_dir_all(&root);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Prefill and decode logits of converted model `dst` (of fixture `name`) are the same
/// bits under every expert-cache budget, from none to all.
fn same_bits_for_every_budget(name: &str, dst: &Path) {
    let m: Value = serde_json::from_slice(&std::fs::read(dst.join("colibri.json")).unwrap()).unwrap();
    let expert = m["experts"]["layers"][0]["experts"][0]["length"].as_u64().unwrap();
    let mut runs = Vec::new();
    for ram in [Some(0), Some(expert), Some(expert * 7), None] {
        let model = Model::open_dir_with(dst, CacheOptions::with_ram(ram)).unwrap();
        let mut s = model.new_session();
        let prefill = model.forward(&mut s, &ids(&reference(name)["ids"]), Logits::All).unwrap();
        // Then a few decode steps, which hit the cache differently.
        let mut steps = Vec::new();
        for id in [5u32, 17, 3] {
            steps.extend(model.forward(&mut s, &[id], Logits::Last).unwrap());
        }
        runs.push((ram, prefill, steps));
    }
    for (ram, p, s) in &runs[1..] {
        assert!(
            p.iter().zip(&runs[0].1).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: prefill differs with --ram {ram:?}"
        );
        assert!(
            s.iter().zip(&runs[0].2).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: decode differs with --ram {ram:?}"
        );
    }
}

#[test]
fn ram_budget_never_changes_the_bits() {
    let root = scratch("ram");
    let dst = root.join("m");
    convert_ok(&fixture("qwen2_moe"), &dst, &[]);
    same_bits_for_every_budget("qwen2_moe", &dst);
    for name in [
        "deepseek_v3",
        "deepseek_v3_fp8",
        "deepseek_v3_noqlora",
        "glm4_moe",
        "gpt_oss",
        "gpt_oss_mxfp4",
        "qwen3_next",
        "qwen3_5_moe",
    ] {
        let d = root.join(name);
        convert_ok(&fixture(name), &d, &[]);
        same_bits_for_every_budget(name, &d);
    }
    // The command line accepts the budget with suffixes and writes the same bytes.
    let mut files = Vec::new();
    for ram in ["0", "3K", "1.5M", "2G"] {
        let out_file = root.join(format!("logits-{ram}.f32"));
        let out = coli()
            .args(["logits", "--model"])
            .arg(&dst)
            .args(["--ram", ram, "--ids", "5,17,3,99", "--out"])
            .arg(&out_file)
            .output()
            .unwrap();
        assert!(out.status.success(), "--ram {ram}: {}", String::from_utf8_lossy(&out.stderr));
        files.push(std::fs::read(&out_file).unwrap());
    }
    assert!(files.iter().all(|f| f == &files[0]));
    let out = coli()
        .args(["logits", "--model"])
        .arg(&dst)
        .args(["--ram", "12Q", "--ids", "5", "--out", "/dev/null"])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("unknown unit"));
    let _ = std::fs::remove_dir_all(&root);
}

/// Every file of two directories, byte for byte.
fn assert_same_dirs(a: &Path, b: &Path) {
    let list = |d: &Path| {
        let mut v: Vec<String> =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    };
    assert_eq!(list(a), list(b));
    for f in list(a) {
        assert!(std::fs::read(a.join(&f)).unwrap() == std::fs::read(b.join(&f)).unwrap(), "{f} differs");
    }
}

#[test]
fn resume_after_abort_is_byte_identical() {
    let root = scratch("resume");
    let clean = root.join("clean");
    convert_ok(&fixture("qwen2_moe"), &clean, &["--quant", "int4"]);
    let total = {
        let m: Value = serde_json::from_slice(&std::fs::read(clean.join("colibri.json")).unwrap()).unwrap();
        m["dense"]["tensors"].as_array().unwrap().len()
            + m["experts"]["layers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["experts"].as_array().unwrap().len())
                .sum::<usize>()
    };
    for (k, abort) in [1, 7, total / 2, total - 1].into_iter().enumerate() {
        let dst = root.join(format!("run{k}"));
        let out = convert(
            &fixture("qwen2_moe"),
            &dst,
            &["--quant", "int4"],
            &[("COLI_CONVERT_ABORT_AFTER", &abort.to_string())],
        );
        assert_eq!(out.status.code(), Some(75), "abort after {abort}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!dst.join("colibri.json").exists() && dst.join("weights.bin.partial").exists());
        if k == 2 {
            // Damage a journaled item and an unjournaled one: both must be redone.
            let mut b = std::fs::read(dst.join("weights.bin.partial")).unwrap();
            b[0] ^= 0xFF;
            let n = b.len();
            b[n - 1] ^= 0x55;
            std::fs::write(dst.join("weights.bin.partial"), b).unwrap();
        }
        if k == 3 {
            // A second interruption while resuming.
            let out = convert(&fixture("qwen2_moe"), &dst, &["--quant", "int4"], &[("COLI_CONVERT_ABORT_AFTER", "1")]);
            assert_eq!(out.status.code(), Some(75));
        }
        let out = convert(&fixture("qwen2_moe"), &dst, &["--quant", "int4"], &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        if abort > 1 {
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("resuming"),
                "abort {abort}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert_same_dirs(&clean, &dst);
    }
    // Options that change the layout start over instead of mixing bytes.
    let dst = root.join("other-options");
    let out = convert(&fixture("qwen2_moe"), &dst, &["--quant", "int8"], &[("COLI_CONVERT_ABORT_AFTER", "5")]);
    assert_eq!(out.status.code(), Some(75));
    let out = convert(&fixture("qwen2_moe"), &dst, &["--quant", "int4"], &[]);
    assert!(out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("resuming"));
    assert_same_dirs(&clean, &dst);
    // A finished conversion is not overwritten without --force.
    let out = convert(&fixture("qwen2_moe"), &dst, &[], &[]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--force"));
    convert_ok(&fixture("qwen2_moe"), &dst, &["--force"]);
    assert_same_dirs(&clean, &dst);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn resume_after_sigkill_is_byte_identical() {
    let root = scratch("sigkill");
    let clean = root.join("clean");
    convert_ok(&fixture("mixtral"), &clean, &["--quant", "int8"]);
    let dst = root.join("killed");
    let mut child = coli()
        .arg("convert")
        .arg(fixture("mixtral"))
        .arg("-o")
        .arg(&dst)
        .args(["--quant", "int8"])
        .env("COLI_CONVERT_ITEM_DELAY_MS", "40")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let journal = dst.join("convert.journal");
    let start = std::time::Instant::now();
    loop {
        let lines = std::fs::read_to_string(&journal).map(|t| t.lines().count()).unwrap_or(0);
        if lines >= 3 || start.elapsed().as_secs() > 60 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL on unix
    child.wait().unwrap();
    assert!(!dst.join("colibri.json").exists(), "the conversion finished before it could be killed");
    let out = convert(&fixture("mixtral"), &dst, &["--quant", "int8"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("resuming"));
    assert_same_dirs(&clean, &dst);
    let _ = std::fs::remove_dir_all(&root);
}

fn assert_clean_failure(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure; stderr: {err}");
    assert!(!err.contains("panicked") && !err.contains("internal error"), "panic: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "want one line on stderr, got: {err}");
    assert!(err.contains(needle), "stderr {err:?} does not mention {needle:?}");
}

fn run_logits(model: &Path) -> Output {
    let r = reference("olmoe");
    let ids = ids(&r["ids"]).iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    coli().args(["logits", "--model"]).arg(model).args(["--ids", &ids, "--out", "/dev/null"]).output().unwrap()
}

#[test]
fn corruption_is_caught_by_checksums() {
    let root = scratch("corrupt");
    let dst = root.join("m");
    convert_ok(&fixture("olmoe"), &dst, &["--quant", "int8"]);
    let m: Value = serde_json::from_slice(&std::fs::read(dst.join("colibri.json")).unwrap()).unwrap();
    let data = dst.join("weights.bin");
    let clean = std::fs::read(&data).unwrap();
    let out = coli().args(["doctor"]).arg(&dst).arg("--checksums").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));

    // One damaged expert: named by layer, index and file, by the loader and by doctor.
    let e = &m["experts"]["layers"][1]["experts"][3];
    let mut bad = clean.clone();
    bad[(e["offset"].as_u64().unwrap() + e["length"].as_u64().unwrap() / 2) as usize] ^= 1;
    std::fs::write(&data, &bad).unwrap();
    let model = Model::open_dir_with(&dst, CacheOptions::with_ram(Some(0))).unwrap();
    let err = model.experts.expert(1, 3).unwrap_err().to_string();
    assert!(err.contains("checksum mismatch in expert 3 of layer 1") && err.contains("weights.bin"), "{err}");
    let out = coli().args(["doctor"]).arg(&dst).arg("--checksums").output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("expert 3 of layer 1"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Every expert of layer 0 damaged: a forward pass must stop with one clear line.
    let mut bad = clean.clone();
    for e in m["experts"]["layers"][0]["experts"].as_array().unwrap() {
        bad[e["offset"].as_u64().unwrap() as usize + 7] ^= 0x10;
    }
    std::fs::write(&data, &bad).unwrap();
    assert_clean_failure(&run_logits(&dst), "checksum mismatch in expert");

    // A damaged dense tensor is caught when the model opens.
    let t = &m["dense"]["tensors"][2];
    let mut bad = clean.clone();
    bad[t["offset"].as_u64().unwrap() as usize] ^= 0x80;
    std::fs::write(&data, &bad).unwrap();
    assert_clean_failure(
        &run_logits(&dst),
        &format!("checksum mismatch in dense tensor {}", t["name"].as_str().unwrap()),
    );

    // A truncated data file.
    std::fs::write(&data, &clean[..clean.len() - 100]).unwrap();
    assert_clean_failure(&run_logits(&dst), "truncated");
    std::fs::remove_file(&data).unwrap();
    assert_clean_failure(&run_logits(&dst), "weights.bin");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn damaged_manifests_are_clear_errors() {
    let root = scratch("manifest");
    let dst = root.join("m");
    // Group 64: the layout below has an expert part at offset 4096.
    convert_ok(&fixture("mixtral"), &dst, &["--quant", "int4", "--group-size", "64"]);
    let path = dst.join("colibri.json");
    let good = std::fs::read(&path).unwrap();
    assert!(String::from_utf8_lossy(&good).contains("\"offset\": 4096"), "the layout this test edits changed");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() / 3].to_vec()),
        ("empty", Vec::new()),
        ("garbage", b"\x89PNG\r\n\x1a\n\x00\x00".to_vec()),
        ("not a manifest", br#"{"hello": "world"}"#.to_vec()),
        (
            "future",
            String::from_utf8(good.clone()).unwrap().replacen("\"version\": 1", "\"version\": 99", 1).into_bytes(),
        ),
        (
            "lying offsets",
            String::from_utf8(good.clone()).unwrap().replacen("\"offset\": 4096", "\"offset\": 4095", 1).into_bytes(),
        ),
    ];
    for (what, bytes) in cases {
        std::fs::write(&path, &bytes).unwrap();
        let out = run_logits(&dst);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: accepted");
        assert!(!err.contains("panicked") && err.trim_end().lines().count() == 1, "{what}: {err}");
        assert!(err.contains("colibri.json"), "{what}: {err}");
        let out = coli().arg("info").arg(&dst).output().unwrap();
        assert!(!out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("panicked"), "{what}: info");
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn info_and_doctor_on_both_formats() {
    let root = scratch("info");
    let dst = root.join("m");
    convert_ok(&fixture("qwen3_moe"), &dst, &[]);
    let info = |p: &Path| -> Value {
        let out = coli().arg("info").arg(p).arg("--json").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let (hf, conv) = (info(&fixture("qwen3_moe")), info(&dst));
    for v in [&hf, &conv] {
        assert_eq!(v["model_type"], "qwen3_moe");
        assert_eq!(v["experts"], 64);
        assert_eq!(v["top_k"], 2);
        assert!(v["streamed_bytes"].as_u64().unwrap() > 0 && v["resident_bytes"].as_u64().unwrap() > 0);
    }
    assert!(conv["format"].as_str().unwrap().contains("colibri container v1"));
    assert!(conv["quantization"].as_str().unwrap().contains("experts int4/g32"));
    // int4 experts take about a quarter of bf16 (plus scales).
    let (a, b) = (hf["expert_bytes"].as_u64().unwrap() as f64, conv["expert_bytes"].as_u64().unwrap() as f64);
    assert!(b < a * 0.45, "{a} vs {b}");
    let text = coli().arg("info").arg(&dst).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("streamed"));
    for p in [fixture("qwen3_moe"), dst.clone()] {
        let out = coli().arg("doctor").arg(&p).arg("--checksums").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    }
    let out = coli().arg("doctor").output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("cpu"));
    let out = coli().arg("info").arg(root.join("nope")).output().unwrap();
    assert_clean_failure(&out, "no such model directory");
    let _ = std::fs::remove_dir_all(&root);
}

/// A copy of fixture `name` (sharded, with an index) with one more shard holding the
/// tensors of a multi-token-prediction layer after the decoder layers, as DeepSeek-V3
/// ships its layer 61, and `num_nextn_predict_layers: 1` in config.json.
fn with_mtp_layer(name: &str, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(dst.join("config.json")).unwrap()).unwrap();
    let (layers, hidden) = (cfg["num_hidden_layers"].as_u64().unwrap(), cfg["hidden_size"].as_u64().unwrap());
    cfg["num_nextn_predict_layers"] = 1.into();
    std::fs::write(dst.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    let names =
        [format!("model.layers.{layers}.input_layernorm.weight"), format!("model.layers.{layers}.enorm.weight")];
    let mut header = serde_json::Map::new();
    for (k, n) in names.iter().enumerate() {
        let at = k as u64 * hidden * 4;
        header.insert(
            n.clone(),
            serde_json::json!({"dtype": "F32", "shape": [hidden], "data_offsets": [at, at + hidden * 4]}),
        );
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    h.resize(h.len().div_ceil(8) * 8, b' ');
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend(h);
    file.extend(std::iter::repeat_n(0u8, (names.len() as u64 * hidden * 4) as usize));
    std::fs::write(dst.join("mtp.safetensors"), file).unwrap();
    let index_path = dst.join("model.safetensors.index.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    for n in &names {
        index["weight_map"][n] = "mtp.safetensors".into();
    }
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
}

#[test]
fn deepseek_v3_converts_without_its_mtp_layer_and_reports_its_latent_cache() {
    let root = scratch("mtp");
    let (src, dst) = (root.join("hf"), root.join("m"));
    with_mtp_layer("deepseek_v3", &src);
    convert_ok(&src, &dst, &["--quant", "bf16"]);
    let m: Value = serde_json::from_slice(&std::fs::read(dst.join("colibri.json")).unwrap()).unwrap();
    let dense: Vec<&str> =
        m["dense"]["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(dense.contains(&"model.layers.2.self_attn.kv_b_proj.weight"));
    assert!(dense.contains(&"model.layers.1.mlp.gate.e_score_correction_bias"));
    assert!(dense.contains(&"model.layers.1.mlp.shared_experts.down_proj.weight"));
    assert!(!dense.iter().any(|n| n.starts_with("model.layers.3.")), "MTP tensors were converted: {dense:?}");
    // Routed experts only of the MoE layers (1 and 2; layer 0 is dense), 16 each.
    let layers = m["experts"]["layers"].as_array().unwrap();
    assert_eq!(layers.iter().map(|l| l["experts"].as_array().unwrap().len()).collect::<Vec<_>>(), [16, 16]);
    // bf16 is lossless for this bf16 checkpoint: the same bits as the checkpoint itself.
    let (hf, conv) = (Model::open_dir(&src).unwrap(), Model::open_dir(&dst).unwrap());
    let (a, b) = (logits(&hf, "deepseek_v3"), logits(&conv, "deepseek_v3"));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    for p in [&src, &dst] {
        let out = coli().arg("info").arg(p).arg("--json").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!((&v["model_type"], &v["attention"]), (&Value::from("deepseek_v3"), &Value::from("mla")));
        // (kv_lora_rank 28 + qk_rope_head_dim 10) floats x 3 layers x 4 bytes.
        assert_eq!(v["kv_cache_bytes_per_token"], (28 + 10) * 3 * 4);
    }
    let text = coli().arg("info").arg(&dst).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("MLA: latent 28 + rope key 10 = 38 floats"));
    let _ = std::fs::remove_dir_all(&root);
}

/// gpt-oss's released layout: the MXFP4 experts are streamed in that format (conversion
/// without --quant/--experts: bytes unchanged, `mxfp4` in the manifest), computed by the
/// MXFP4 kernel to the checkpoint's own bits (dense weights kept bf16), within 1e-3 of
/// transformers; `--experts int8` still converts them. The engine's MXFP4 quantizer writes the fixture's bytes from their values.
#[test]
fn gpt_oss_mxfp4_experts_stay_mxfp4() {
    let name = "gpt_oss_mxfp4";
    let root = scratch("mxfp4");
    let dst = root.join("m");
    convert_ok(&fixture(name), &dst, &[]);
    let m: Value = serde_json::from_slice(&std::fs::read(dst.join("colibri.json")).unwrap()).unwrap();
    let parts = m["experts"]["layers"][0]["parts"].as_array().unwrap();
    assert!(parts.iter().all(|p| p["dtype"] == "mxfp4"), "{parts:?}");
    let dense: Vec<&str> =
        m["dense"]["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(dense.contains(&"model.layers.0.mlp.experts.gate_up_proj_bias"));
    assert!(!dense.iter().any(|n| n.ends_with("_blocks") || n.ends_with("_scales")), "{dense:?}");
    // The dense weights kept bf16 as in the checkpoint (experts still MXFP4: no --quant).
    let dst16 = root.join("bf16");
    convert_ok(&fixture(name), &dst16, &["--embed", "bf16", "--lm-head", "bf16", "--attn", "bf16", "--mlp", "bf16"]);
    let (hf, conv) = (Model::open_dir(&fixture(name)).unwrap(), Model::open_dir(&dst16).unwrap());
    let (a, b) = (logits(&hf, name), logits(&conv, name));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "converted MXFP4 differs from the checkpoint");
    let q = quality(name, &conv, &b);
    assert!(q.rel <= 1e-3 && q.greedy == 24, "rel {:.2e}, greedy {}", q.rel, q.greedy);

    let x = hf.experts.expert(1, 5).unwrap();
    for w in [&x.gate, &x.up, &x.down] {
        let rb = w.row_bytes();
        let mut row = vec![0.0f32; w.cols];
        let mut bytes = vec![0u8; rb];
        for r in 0..w.rows {
            w.row_into(r, &mut row);
            colibri_engine::format::quant::quantize_row(w.dtype, &row, &mut bytes).unwrap();
            assert_eq!(bytes, w.bytes.as_ref()[r * rb..(r + 1) * rb], "row {r}");
        }
    }

    let dst8 = root.join("int8");
    convert_ok(&fixture(name), &dst8, &["--experts", "int8"]);
    let m: Value = serde_json::from_slice(&std::fs::read(dst8.join("colibri.json")).unwrap()).unwrap();
    assert_eq!(m["experts"]["layers"][0]["parts"][0]["dtype"], "int8");
    let _ = std::fs::remove_dir_all(&root);
}

/// DeepSeek-V4 converts (helper/tests/it/v4_convert_cli.rs checks the layouts and bits): a
/// bf16 checkpoint with the usual defaults gives a container that opens.
#[test]
fn deepseek_v4_converts() {
    let dst = scratch("v4");
    let out = convert(&fixture("deepseek_v4"), &dst, &[], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m = Model::open_dir(&dst).unwrap();
    assert!(
        m.v4.is_some()
            && m.experts.expert(3, 7).unwrap().gate.dtype == colibri_engine::tensor::DType::Int4 { group: 32 }
    );
    let _ = std::fs::remove_dir_all(&dst);
}

/// `coli info` describes DeepSeek-V4's attention as it is (a window and compressed
/// entries), not as plain GQA, in text and JSON.
#[test]
fn deepseek_v4_info_names_its_attention() {
    let out = coli().arg("info").arg(fixture("deepseek_v4")).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("DeepSeek-V4: a window of 6 keys") && text.contains("grows by 64 bytes per token"), "{text}");
    let out = coli().arg("info").arg(fixture("deepseek_v4")).arg("--json").output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((&v["attention"], &v["kv_cache_bytes_per_token"]), (&"v4".into(), &64.into()), "{v}");
}
