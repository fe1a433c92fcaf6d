//! `--hybrid on|off|auto` with `--backend wgpu` through real `coli` processes: with a GPU
//! pool too small for a layer's experts, the logits bytes and generated ids are the CPU
//! backend's, and `coli bench --backend wgpu` reports experts really computed on the CPU.
//! Skipped with a printed reason when there is no Vulkan adapter, unless
//! COLIBRI_REQUIRE_GPU=1.
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

fn ok(out: Output, what: &str) -> Output {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

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
    if std::env::var("COLIBRI_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("COLIBRI_REQUIRE_GPU=1 but: {err}");
    }
    eprintln!("skipping: {err}");
    false
}

const IDS: &str = "5,17,3,99,42,7,63,11,28,90,2,51";

fn logits(model: &Path, extra: &[&str], tag: &str) -> Vec<u8> {
    let out = std::env::temp_dir().join(format!("coli-hybrid-{tag}-{}.bin", std::process::id()));
    ok(
        coli()
            .args(["logits", "--model"])
            .arg(model)
            .args(["--ids", IDS, "--out"])
            .arg(&out)
            .args(extra)
            .output()
            .unwrap(),
        &format!("logits {tag}"),
    );
    let bytes = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    bytes
}

fn generated(model: &Path, extra: &[&str]) -> serde_json::Value {
    let out = ok(
        coli()
            .args(["generate", "--model"])
            .arg(model)
            .args(["--ids", "5,17,3,99", "--max-new-tokens", "10", "--ignore-eos", "--json"])
            .args(extra)
            .output()
            .unwrap(),
        "generate",
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["ids"].clone()
}

#[test]
fn hybrid_placement_keeps_the_cpu_bytes_and_computes_on_the_cpu() {
    if !have_gpu() {
        return;
    }
    let dst = std::env::temp_dir().join(format!("coli-hybrid-olmoe-int4-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    ok(
        coli().arg("convert").arg(fixture("olmoe")).arg("-o").arg(&dst).args(["--quant", "int4"]).output().unwrap(),
        "convert",
    );
    let cpu = logits(&dst, &["--backend", "cpu"], "cpu");
    // About two experts fit in a 12K pool: the rest of each layer's misses are candidates.
    for hybrid in ["off", "on", "auto"] {
        for ram in ["0", "1G"] {
            let args = ["--backend", "wgpu", "--gpu-pool", "12K", "--hybrid", hybrid, "--ram", ram];
            assert!(logits(&dst, &args, hybrid) == cpu, "--hybrid {hybrid} --ram {ram}: logits differ from the CPU's");
        }
    }
    let want = generated(&dst, &["--backend", "cpu"]);
    assert_eq!(generated(&dst, &["--backend", "wgpu", "--gpu-pool", "12K", "--hybrid", "on"]), want);

    let bench = |hybrid: &str| -> serde_json::Value {
        let out = ok(
            coli()
                .args(["bench", "--model"])
                .arg(&dst)
                .args(["--backend", "wgpu", "--gpu-pool", "12K", "--hybrid", hybrid, "--ram", "1G"])
                .args(["--prompt-tokens", "4", "--decode-tokens", "6", "--probe-bytes", "0", "--cache", "warm"])
                .output()
                .unwrap(),
            "bench",
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let on = bench("on");
    let off = bench("off");
    assert_eq!(on["generated_ids"], off["generated_ids"]);
    assert_eq!(on["hybrid"]["mode"], "on");
    assert!(on["hybrid"]["decode"]["cpu_experts"].as_u64().unwrap() > 0, "{on}");
    assert_eq!(off["hybrid"]["decode"]["cpu_experts"], 0, "{off}");
    assert!(off["hybrid"]["decode"]["gpu_experts"].as_u64().unwrap() > 0, "{off}");

    let bad = coli()
        .args(["logits", "--model"])
        .arg(&dst)
        .args(["--ids", "1", "--out", "/dev/null", "--hybrid", "maybe"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let _ = std::fs::remove_dir_all(&dst);
}
