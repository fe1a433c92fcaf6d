//! `--backend wgpu` through real `coli` processes: the same logits bytes and the same
//! generated ids as `--backend cpu`, on the Hugging Face fixtures and on converted int4
//! / int8 models whose experts stream from disk (`--ram 0`). Skipped with a printed
//! reason when there is no Vulkan adapter, unless COLIBRI_REQUIRE_GPU=1.
#![cfg(feature = "wgpu")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn coli() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_coli"));
    c.env("NODEVICE_SELECT", "1");
    c
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn ids_arg(name: &str) -> String {
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture(name).join("reference.json")).unwrap()).unwrap();
    r["ids"].as_array().unwrap().iter().take(20).map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

fn ok(out: Output, what: &str) -> Output {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// True when the wgpu backend can run here; otherwise prints why (or fails under
/// COLIBRI_REQUIRE_GPU=1).
fn have_gpu() -> bool {
    let out = coli()
        .args(["logits", "--model"])
        .arg(fixture("olmoe"))
        .args(["--ids", "1", "--out", "/dev/null", "--backend", "wgpu"])
        .output()
        .unwrap();
    if out.status.success() {
        return true;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no Vulkan adapter; install mesa-vulkan-drivers"), "unexpected failure: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "want one line on stderr, got: {err}");
    if std::env::var("COLIBRI_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("COLIBRI_REQUIRE_GPU=1 but: {err}");
    }
    eprintln!("skipping: {err}");
    false
}

fn logits(model: &Path, ids: &str, backend: &str, extra: &[&str], tag: &str) -> Vec<u8> {
    let out = std::env::temp_dir().join(format!("coli-gpu-{tag}-{backend}-{}.bin", std::process::id()));
    ok(
        coli()
            .args(["logits", "--model"])
            .arg(model)
            .args(["--ids", ids, "--out"])
            .arg(&out)
            .args(["--backend", backend])
            .args(extra)
            .output()
            .unwrap(),
        &format!("logits {tag} {backend}"),
    );
    let bytes = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    bytes
}

fn generated_ids(model: &Path, backend: &str, extra: &[&str]) -> serde_json::Value {
    let out = ok(
        coli()
            .args(["generate", "--model"])
            .arg(model)
            .args(["--ids", "5,17,3,99", "--max-new-tokens", "12", "--ignore-eos", "--json", "--backend", backend])
            .args(extra)
            .output()
            .unwrap(),
        &format!("generate {backend}"),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["ids"].clone()
}

#[test]
fn wgpu_backend_gives_the_cpu_bytes_on_every_fixture() {
    if !have_gpu() {
        return;
    }
    for name in [
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
        "olmoe",
        "glm4_moe",
        "gpt_oss_mxfp4",
        "deepseek_v3",
        "qwen3_next",
        "qwen3_5_moe",
    ] {
        let ids = ids_arg(name);
        let cpu = logits(&fixture(name), &ids, "cpu", &[], &format!("hf-{name}"));
        let gpu = logits(&fixture(name), &ids, "wgpu", &[], &format!("hf-{name}"));
        assert!(cpu == gpu, "{name}: --backend wgpu logits differ from --backend cpu");
        assert_eq!(
            generated_ids(&fixture(name), "wgpu", &[]),
            generated_ids(&fixture(name), "cpu", &[]),
            "{name}: generated ids"
        );
    }
}

#[test]
fn wgpu_backend_on_converted_quantized_models_streaming_experts() {
    if !have_gpu() {
        return;
    }
    for (name, quant) in
        [("mixtral", "int4"), ("qwen2_moe", "int8"), ("olmoe", "int4"), ("qwen3_next", "int4"), ("qwen3_5_moe", "int4")]
    {
        let dst = std::env::temp_dir().join(format!("coli-gpu-convert-{name}-{quant}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dst);
        ok(
            coli().arg("convert").arg(fixture(name)).arg("-o").arg(&dst).args(["--quant", quant]).output().unwrap(),
            "convert",
        );
        let ids = ids_arg(name);
        let tag = format!("{quant}-{name}");
        let cpu = logits(&dst, &ids, "cpu", &[], &tag);
        for ram in ["0", "1G"] {
            let gpu = logits(&dst, &ids, "wgpu", &["--ram", ram], &tag);
            assert!(cpu == gpu, "{name} {quant} --ram {ram}: --backend wgpu logits differ from --backend cpu");
        }
        assert_eq!(
            generated_ids(&dst, "wgpu", &["--ram", "0"]),
            generated_ids(&dst, "cpu", &[]),
            "{name} {quant}: generated ids"
        );
        let _ = std::fs::remove_dir_all(&dst);
    }
}

/// `coli generate --backend wgpu` on a converted model records its expert use in the usage
/// file as the CPU path does: the same tokens route to the same experts, so the counts match.
#[test]
fn wgpu_backend_records_expert_usage_like_cpu() {
    if !have_gpu() {
        return;
    }
    let dst = std::env::temp_dir().join(format!("coli-gpu-usage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    ok(
        coli().arg("convert").arg(fixture("olmoe")).arg("-o").arg(&dst).args(["--quant", "int4"]).output().unwrap(),
        "convert",
    );
    let usage = |backend: &str| -> serde_json::Value {
        let _ = std::fs::remove_file(dst.join("usage.json"));
        generated_ids(&dst, backend, &[]);
        let bytes = std::fs::read(dst.join("usage.json"))
            .unwrap_or_else(|e| panic!("--backend {backend} wrote no usage file: {e}"));
        serde_json::from_slice(&bytes).unwrap()
    };
    let cpu = usage("cpu");
    let gpu = usage("wgpu");
    assert!(cpu["total"].as_u64().unwrap() > 0, "{cpu}");
    assert_eq!(gpu["total"], cpu["total"]);
    assert_eq!(gpu["counts"], cpu["counts"]);
    let _ = std::fs::remove_dir_all(&dst);
}

/// `coli chat --backend wgpu` (offered in its --help): the same answers as the CPU, turn
/// after turn (the second turn reuses the first one's keys and values on the GPU).
#[test]
fn chat_on_wgpu_answers_like_the_cpu() {
    use std::io::Write;
    if !have_gpu() {
        return;
    }
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/demo");
    let answers = |backend: &str| {
        let mut child = coli()
            .args(["chat", "--model"])
            .arg(&demo)
            .args(["--max-new-tokens", "40", "--temperature", "0", "--backend", backend])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"What is 47 + 38?\nSpell \"garden\" backwards.\n/quit\n").unwrap();
        String::from_utf8(ok(child.wait_with_output().unwrap(), backend).stdout).unwrap()
    };
    let cpu = answers("cpu");
    assert!(cpu.contains("So 47 + 38 = 85.") && cpu.contains("n-e-d-r-a-g"), "{cpu}");
    assert_eq!(answers("wgpu"), cpu);
}

/// `coli chat --backend wgpu` writes its conversation's caches after every turn (read back
/// from the GPU) and restores them after a restart with nothing re-prefilled and the
/// answers of a run that never stopped: a GQA model, and one with Gated DeltaNet's
/// recurrent state (whose fixture's second prompt cuts the first answer: in memory and from
/// the file, read back from the GPU with the snapshot where the first prompt ended, its state
/// goes back there: the same answers). Its files are its own: a CPU run in the same data directory finds none
/// of them (the GPU's float order may differ from the CPU's), and writes its own beside.
#[test]
fn gpu_chat_continues_after_a_restart_from_its_own_cache_files() {
    if !have_gpu() {
        return;
    }
    for model in ["qwen3_moe", "qwen3_next"] {
        let (dir, data, load, second, reused) =
            crate::chat_cli::continues_after_a_restart(model, &["--backend", "wgpu"]);
        // The second run appended its turn's positions, read back from the GPU from where
        // the file ended: a third run restores the whole second prompt from that record.
        let gpu = ["--system", "Be brief.", "--backend", "wgpu"];
        let (again, err) = crate::chat_cli::chat_in(&data, model, &load, &gpu);
        assert_eq!(again, second, "{model}: after the appended record: {err}");
        let restored = crate::chat_cli::numbers_after(&err, "restored the cache of ");
        // qwen3_next: the same prompt again reuses all of it but its last id (fed again for
        // its logits), and the file's state goes back only to where records end (the prompt's
        // end is one id past that): nothing to restore.
        if !model.contains("next") {
            assert!(
                restored.len() == 1 && restored[0] > reused,
                "{model}: the appended record unused ({reused}): {err}"
            );
        } else {
            assert!(restored.is_empty(), "{model}: a restore that spares nothing: {err}");
        }
        let (_, err) = crate::chat_cli::chat_in(&data, model, &load, &["--system", "Be brief."]);
        assert!(!err.contains("restored the cache"), "{model}: the CPU read the GPU's cache: {err}");
        let mut dirs: Vec<String> = std::fs::read_dir(data.join("colibri/kv"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        dirs.sort();
        assert_eq!(dirs.len(), 2, "{model}: the CPU's and the GPU's caches apart: {dirs:?}");
        assert!(dirs[1].starts_with(&dirs[0]) && dirs[1].contains(".wgpu-"), "{model}: {dirs:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
