//! Block-scaled FP8 checkpoints (tests/fixtures/deepseek_v3_fp8, tools/fixtures_fp8.py) end
//! to end through `coli`: read as they are by `logits`, `generate`, `info`, `plan` (CPU,
//! every `--ram`, and wgpu where a Vulkan adapter is present); `coli convert` keeps FP8
//! exactly or re-quantizes with `--quant`; bad checkpoints are one clear line naming the
//! tensor or field, and a conversion of one writes nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/deepseek_v3_fp8")
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-fp8-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(fixture().join("reference.json")).unwrap()).unwrap()
}

fn ids_arg(v: &Value) -> String {
    v.as_array().unwrap().iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

fn ok(out: Output, what: &str) -> Output {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// `coli logits` of the reference's ids, as raw bytes.
fn logits(model: &Path, extra: &[&str], out: &Path) -> Vec<u8> {
    let r = reference();
    let o = coli()
        .args(["logits", "--model"])
        .arg(model)
        .args(["--ids", &ids_arg(&r["ids"]), "--out"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    ok(o, &format!("logits {} {extra:?}", model.display()));
    std::fs::read(out).unwrap()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// max |got - reference| / std(reference logits).
fn rel_to_reference(got: &[f32]) -> f64 {
    let want = f32s(&std::fs::read(fixture().join("logits.bin")).unwrap());
    assert_eq!(got.len(), want.len());
    let std = reference()["logits_std"].as_f64().unwrap();
    got.iter().zip(&want).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max) / std
}

fn greedy(model: &Path, extra: &[&str]) -> Vec<u64> {
    let r = reference();
    let n = r["greedy"]["new_ids"].as_array().unwrap().len().to_string();
    let out = coli()
        .args(["generate", "--model"])
        .arg(model)
        .args(["--ids", &ids_arg(&r["greedy"]["prompt_ids"]), "--max-new-tokens", &n, "--temperature", "0", "--json"])
        .args(extra)
        .output()
        .unwrap();
    let out = ok(out, "generate");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

fn want_greedy() -> Vec<u64> {
    reference()["greedy"]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

#[test]
fn an_fp8_directory_runs_as_it_is() {
    let d = scratch("run");
    let cpu = logits(&fixture(), &[], &d.join("cpu.bin"));
    let rel = rel_to_reference(&f32s(&cpu));
    assert!(rel < 1e-3, "logits {rel:.3e} of std from transformers");
    // The FP8 experts are read and cached as FP8 rows: no budget changes a bit.
    for ram in ["0", "3K", "1G"] {
        assert!(logits(&fixture(), &["--ram", ram], &d.join(format!("r{ram}.bin"))) == cpu, "--ram {ram}");
    }
    assert_eq!(greedy(&fixture(), &[]), want_greedy());
    // Read from the shards with pread (a checkpoint larger than the read limit): the FP8
    // pairs come from placeholders in the file, the same bits.
    let out = d.join("streamed.bin");
    let r = reference();
    let o = coli()
        .env("COLI_READ_LIMIT", "1000")
        .args(["logits", "--model"])
        .arg(fixture())
        .args(["--ram", "0", "--ids", &ids_arg(&r["ids"]), "--out"])
        .arg(&out)
        .output()
        .unwrap();
    ok(o, "streamed logits");
    assert!(std::fs::read(&out).unwrap() == cpu, "a streamed FP8 checkpoint gives the same bits");
    let probe = coli()
        .args(["logits", "--model"])
        .arg(fixture())
        .args(["--ids", "1", "--out", "/dev/null", "--backend", "wgpu"])
        .output()
        .unwrap();
    if probe.status.success() {
        let gpu = logits(&fixture(), &["--backend", "wgpu"], &d.join("gpu.bin"));
        // Bit for bit on lavapipe (engine/tests/it/gpu_fixtures.rs checks it per adapter).
        let rel = rel_to_reference(&f32s(&gpu));
        assert!(rel < 1e-3, "wgpu logits {rel:.3e} of std from transformers");
        eprintln!("wgpu logits equal to the CPU's bit for bit: {}", gpu == cpu);
        assert_eq!(greedy(&fixture(), &["--backend", "wgpu"]), want_greedy());
    } else {
        eprintln!("skipping wgpu: {}", String::from_utf8_lossy(&probe.stderr));
    }
    let info = ok(coli().arg("info").arg(fixture()).output().unwrap(), "info");
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.contains("FP8 block-scaled e4m3") && info.contains("(8 routed experts of 2.8 KiB each)"), "{info}");
    let plan = ok(coli().arg("plan").arg(fixture()).output().unwrap(), "plan");
    let plan = String::from_utf8_lossy(&plan.stdout);
    assert!(plan.contains("(FP8 kept)") && plan.contains("8 experts of 2.8 KiB"), "{plan}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn convert_keeps_fp8_exactly_or_requantizes_on_request() {
    let d = scratch("convert");
    let hf = logits(&fixture(), &[], &d.join("hf.bin"));
    let kept = d.join("kept");
    ok(coli().arg("convert").arg(fixture()).arg("-o").arg(&kept).output().unwrap(), "convert");
    let m: Value = serde_json::from_slice(&std::fs::read(kept.join("colibri.json")).unwrap()).unwrap();
    assert_eq!(m["quant"]["default"], "fp8");
    assert_eq!(m["experts"]["layers"][0]["parts"][2]["dtype"], "fp8");
    assert_eq!(m["experts"]["layers"][0]["parts"][2]["group_size"], 32);
    let kv_a = m["dense"]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "model.layers.0.self_attn.kv_a_proj_with_mqa.weight")
        .unwrap();
    // [28, 40] in blocks of 32 columns: 2 scales and 40 bytes per row.
    assert_eq!((&kv_a["dtype"], &kv_a["length"]), (&Value::from("fp8"), &Value::from(28 * (8 + 40))));
    assert!(logits(&kept, &[], &d.join("kept.bin")) == hf, "a converted FP8 model is the same model, bit for bit");
    assert_eq!(greedy(&kept, &["--ram", "0"]), want_greedy());
    // --quant re-quantizes from the dequantized values.
    let q = d.join("int8");
    ok(
        coli().arg("convert").arg(fixture()).arg("-o").arg(&q).args(["--quant", "int8"]).output().unwrap(),
        "convert int8",
    );
    let m: Value = serde_json::from_slice(&std::fs::read(q.join("colibri.json")).unwrap()).unwrap();
    let dense = m["dense"]["tensors"].as_array().unwrap().iter();
    let parts = m["experts"]["layers"][0]["parts"].as_array().unwrap().iter();
    assert!(dense.chain(parts).all(|t| t["dtype"] != "fp8"), "no FP8 left with --quant int8");
    assert_eq!(m["experts"]["layers"][0]["parts"][0]["dtype"], "int8");
    let rel = rel_to_reference(&f32s(&logits(&q, &[], &d.join("q.bin"))));
    // int8 weights and int8 activations (the integer kernel) on a random tiny model: 0.09
    // of std measured; a wrong decode of the FP8 values would be of the order of the std.
    assert!(rel < 0.25, "int8 from the dequantized FP8 weights: {rel:.3e} of std");
    eprintln!("int8 from FP8: max |diff| {rel:.3e} of std");
    let _ = std::fs::remove_dir_all(&d);
}

/// A copy of the fixture with `edit` applied to its tensors (name -> (dtype, shape, bytes))
/// and `cfg` to its config.json.
fn broken(tag: &str, edit: impl Fn(&mut Vec<(String, Value, Vec<u8>)>), cfg: impl Fn(&mut Value)) -> PathBuf {
    let d = scratch(tag).join("model");
    std::fs::create_dir_all(&d).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture().join(f), d.join(f)).unwrap();
    }
    let mut c: Value = serde_json::from_slice(&std::fs::read(fixture().join("config.json")).unwrap()).unwrap();
    cfg(&mut c);
    std::fs::write(d.join("config.json"), serde_json::to_vec(&c).unwrap()).unwrap();
    let raw = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&raw[8..8 + n]).unwrap();
    let mut tensors: Vec<(String, Value, Vec<u8>)> = header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let o = v["data_offsets"].as_array().unwrap();
            let (s, e) = (o[0].as_u64().unwrap() as usize, o[1].as_u64().unwrap() as usize);
            (k, v, raw[8 + n + s..8 + n + e].to_vec())
        })
        .collect();
    edit(&mut tensors);
    let (mut h, mut data) = (serde_json::Map::new(), Vec::new());
    for (k, mut v, b) in tensors {
        v["data_offsets"] = serde_json::json!([data.len(), data.len() + b.len()]);
        data.extend(b);
        h.insert(k, v);
    }
    let h = serde_json::to_vec(&h).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    std::fs::write(d.join("model.safetensors"), out).unwrap();
    d
}

#[test]
fn bad_fp8_checkpoints_are_one_clear_line_and_write_nothing() {
    let down = "model.layers.1.mlp.experts.3.down_proj.weight";
    let kv_a = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv";
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            broken("noscale", |t| t.retain(|(k, _, _)| k != &format!("{down}_scale_inv")), |_| {}),
            "down_proj.weight_scale_inv is missing",
        ),
        (
            broken(
                "shape",
                |t| {
                    let e = t.iter_mut().find(|(k, _, _)| k == kv_a).unwrap();
                    e.1["shape"] = serde_json::json!([1, 2]);
                    e.2.truncate(8);
                },
                |_| {},
            ),
            "kv_a_proj_with_mqa.weight_scale_inv has shape [1, 2]",
        ),
        (
            broken(
                "noblock",
                |_| {},
                |c| drop(c["quantization_config"].as_object_mut().unwrap().remove("weight_block_size")),
            ),
            "weight_block_size",
        ),
        (broken("fmt", |_| {}, |c| c["quantization_config"]["fmt"] = "e5m2".into()), "fmt \"e5m2\""),
        (broken("method", |_| {}, |c| c["quantization_config"]["quant_method"] = "awq".into()), "quant_method \"awq\""),
    ];
    for (dir, says) in cases {
        let o =
            coli().args(["logits", "--model"]).arg(&dir).args(["--ids", "1,2", "--out", "/dev/null"]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{says}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        let dst = dir.with_file_name("converted");
        let o = coli().arg("convert").arg(&dir).arg("-o").arg(&dst).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "convert, {says}: {err}");
        assert!(!dst.exists(), "convert wrote {} for a bad checkpoint", dst.display());
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }
}

/// One safetensors file's header: name -> (dtype, shape).
fn header(path: &Path) -> serde_json::Map<String, Value> {
    let raw = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&raw[8..8 + n]).unwrap()
}

/// `coli bench` JSON of the model at `dir`.
fn bench(dir: &Path, extra: &[&str]) -> Value {
    let o = coli()
        .args(["bench", "--model"])
        .arg(dir)
        .args(["--prompt-tokens", "5", "--decode-tokens", "7", "--probe-bytes", "0", "--cache", "warm"])
        .args(["--readers", "0", "--no-lookahead"])
        .args(extra)
        .output()
        .unwrap();
    serde_json::from_slice(&ok(o, &format!("bench {extra:?}")).stdout).unwrap()
}

#[test]
fn a_synthetic_fp8_deepseek_streams_its_experts_as_fp8() {
    let d = scratch("synth");
    let m = d.join("hf");
    // hidden 256, experts' intermediate 160: blocks of 128 with a partial last one.
    let (h, i, layers, dense, top_k) = (256usize, 160usize, 3usize, 1usize, 2usize);
    let shape = ["--layers", "3", "--first-dense", "1", "--experts", "8", "--top-k", "2", "--hidden", "256"];
    let more =
        ["--intermediate", "160", "--heads", "2", "--vocab", "512", "--q-lora-rank", "96", "--kv-lora-rank", "64"];
    let mut synth = coli();
    synth.arg("synth").arg("-o").arg(&m).args(shape).args(more).args(["--shape", "deepseek-v3", "--fp8"]);
    ok(synth.output().unwrap(), "synth");
    let cfg: Value = serde_json::from_slice(&std::fs::read(m.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (&cfg["model_type"], &cfg["quantization_config"]["quant_method"]),
        (&"deepseek_v3".into(), &"fp8".into())
    );
    assert_eq!(cfg["quantization_config"]["weight_block_size"], serde_json::json!([128, 128]));
    // As the releases: linear weights e4m3 with a scale per 128x128 block; router, norms,
    // embedding and output projection not.
    let mut t = serde_json::Map::new();
    for f in std::fs::read_dir(&m).unwrap().map(|e| e.unwrap().path()) {
        if f.extension().is_some_and(|e| e == "safetensors") {
            t.extend(header(&f));
        }
    }
    let dt = |n: &str| (t[n]["dtype"].as_str().unwrap().to_string(), t[n]["shape"].clone());
    let down = "model.layers.2.mlp.experts.5.down_proj.weight";
    assert_eq!(dt(down), ("F8_E4M3".into(), serde_json::json!([h, i])));
    assert_eq!(dt(&format!("{down}_scale_inv")), ("F32".into(), serde_json::json!([2, 2])));
    let kv_b = "model.layers.0.self_attn.kv_b_proj.weight";
    assert_eq!(dt(&format!("{kv_b}_scale_inv")), ("F32".into(), serde_json::json!([4, 1])), "2 x (128 + 128) rows");
    assert_eq!(dt("model.layers.1.mlp.gate.weight").0, "BF16");
    assert_eq!(dt("model.layers.1.mlp.gate.e_score_correction_bias").0, "F32");
    assert_eq!(dt("lm_head.weight").0, "BF16");

    // One routed expert as the engine streams and caches it: each row's e4m3 bytes and
    // an f32 scale per 128 columns (1 byte per weight plus scales).
    let row = |cols: usize| cols + 4 * cols.div_ceil(128);
    let expert = (2 * i * row(h) + h * row(i)) as f64;
    assert!(expert < (3 * h * i) as f64 * 1.05, "{expert}: about a byte per weight");
    // `coli convert` keeps the FP8 experts as they are: the container's expert parts are
    // those rows, and the model is the same bits as the directory.
    let c = d.join("kept");
    ok(coli().arg("convert").arg(&m).arg("-o").arg(&c).output().unwrap(), "convert");
    let man: Value = serde_json::from_slice(&std::fs::read(c.join("colibri.json")).unwrap()).unwrap();
    let parts = man["experts"]["layers"][0]["parts"].as_array().unwrap();
    assert!(parts.iter().all(|p| p["dtype"] == "fp8" && p["group_size"] == 128), "{parts:?}");
    let held: u64 = parts.iter().map(|p| p["length"].as_u64().unwrap()).sum();
    assert_eq!(held as f64, expert, "{parts:?}");
    let moe_layers = layers - dense;
    // Nothing cached: each decode token reads exactly its top-k experts per MoE layer.
    let none = bench(&c, &["--ram", "0"]);
    assert_eq!(none["model"]["model_type"], "deepseek_v3");
    let per_token = &none["decode"]["per_token"];
    assert_eq!(per_token["disk_reads"].as_f64().unwrap(), (moe_layers * top_k) as f64, "{per_token}");
    assert_eq!(none["bytes_read_per_decode_token"].as_f64().unwrap(), (moe_layers * top_k) as f64 * expert, "{none}");
    // Everything cached: what decode reads is the experts it meets for the first time.
    let all = bench(&c, &["--ram", "all"]);
    let dec = &all["decode"];
    let misses = dec["per_token"]["disk_reads"].as_f64().unwrap() * all["decode_tokens"].as_f64().unwrap();
    assert_eq!(dec["bytes_read"].as_f64().unwrap(), misses.round() * expert, "{all}");
    let pre = &all["prefill"];
    let pre_misses = pre["per_token"]["disk_reads"].as_f64().unwrap() * all["prompt_tokens"].as_f64().unwrap();
    assert!(pre_misses.round() >= top_k as f64 && pre["bytes_read"].as_f64().unwrap() == pre_misses.round() * expert);
    assert_eq!(all["model"]["expert_bytes"].as_f64().unwrap(), (moe_layers * 8) as f64 * expert, "{all}");
    assert_eq!(all["generated_ids"], none["generated_ids"], "the budget changes no token");
    // The directory itself (its FP8 experts read as they are) decodes the same tokens, and
    // bench counts what it streams: nothing kept, each decode token reads its top-k
    // experts per MoE layer, each counted at its size as held (the container's FP8 rows).
    assert_eq!(bench(&m, &[])["generated_ids"], none["generated_ids"]);
    let dir0 = bench(&m, &["--ram", "0"]);
    assert_eq!(dir0["generated_ids"], none["generated_ids"]);
    let per_token = &dir0["decode"]["per_token"];
    assert_eq!(per_token["disk_reads"].as_f64().unwrap(), (moe_layers * top_k) as f64, "{per_token}");
    let read = dir0["bytes_read_per_decode_token"].as_f64().unwrap();
    assert!(read > 0.0 && read == (moe_layers * top_k) as f64 * expert, "{dir0}");
    let _ = std::fs::remove_dir_all(&d);
}
