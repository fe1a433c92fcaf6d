//! DeepSeek-V4 as the release is published (tests/fixtures/deepseek_v4_fp8,
//! tools/fixtures_v4_fp8.py: FP8 dense weights with `.scale` ue8m0 block scales, FP4 routed
//! experts) through `coli`: `logits` in memory and streamed (`--ram 0`, the checkpoint left
//! in its file) against transformers on the dequantized weights, `info` and `plan` with the
//! sizes the engine holds (experts as MXFP4 rows), and `convert` keeping it as it is.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/deepseek_v4_fp8")
}

fn ok(out: Output, what: &str) -> Output {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn the_release_layout_runs_and_reports_its_sizes() {
    let d = std::env::temp_dir().join(format!("coli-v4-release-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let r: Value = serde_json::from_slice(&std::fs::read(fixture().join("reference.json")).unwrap()).unwrap();
    let ids = r["ids"].as_array().unwrap().iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let run = |tag: &str, env: &[(&str, &str)], extra: &[&str]| {
        let out = d.join(format!("{tag}.bin"));
        let mut c = coli();
        c.envs(env.iter().copied()).args(["logits", "--model"]).arg(fixture());
        let o = c.args(["--ids", &ids, "--out"]).arg(&out).args(extra).output().unwrap();
        ok(o, tag);
        std::fs::read(out).unwrap()
    };
    let cpu = run("cpu", &[], &[]);
    let want = f32s(&std::fs::read(fixture().join("logits.bin")).unwrap());
    let got = f32s(&cpu);
    assert_eq!(got.len(), want.len());
    let mean = want.iter().map(|v| *v as f64).sum::<f64>() / want.len() as f64;
    let std = (want.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    let worst = got.iter().zip(&want).map(|(g, w)| (*g as f64 - *w as f64).abs()).fold(0.0, f64::max);
    assert!(worst / std <= 1e-3, "coli logits: max |diff| / std = {:.3e}", worst / std);
    let streamed = run("streamed", &[("COLI_READ_LIMIT", "1000")], &["--ram", "0"]);
    assert!(streamed == cpu, "experts read from the file when used give the same bits");

    let info = ok(coli().arg("info").arg(fixture()).output().unwrap(), "info");
    let info = String::from_utf8_lossy(&info.stdout);
    // An expert: gate and up 32 rows of (4 scale bytes + 32 packed), down 64 of (4 + 16).
    assert!(
        info.contains("FP4 experts read as MXFP4 rows, FP8 block-scaled e4m3 dense weights")
            && info.contains("(32 routed experts of 3.5 KiB each)"),
        "{info}"
    );
    let plan = ok(coli().arg("plan").arg(fixture()).output().unwrap(), "plan");
    let plan = String::from_utf8_lossy(&plan.stdout);
    assert!(
        plan.contains("sizes as read in place (FP8 dense weights, FP4 experts as MXFP4 rows)")
            && plan.contains("32 experts of 3.5 KiB"),
        "{plan}"
    );
    // `coli convert` keeps the release as it is (helper/tests/it/v4_convert_cli.rs checks the
    // container's layout and bits): the container gives the checkpoint's bits.
    let o = coli().arg("convert").arg(fixture()).arg("-o").arg(d.join("out")).output().unwrap();
    ok(o, "convert");
    let out = d.join("converted.bin");
    let o = coli().args(["logits", "--model"]).arg(d.join("out")).args(["--ids", &ids, "--out"]).arg(&out).output();
    ok(o.unwrap(), "logits of the container");
    assert!(std::fs::read(out).unwrap() == cpu, "the converted release gives the checkpoint's bits");
    let _ = std::fs::remove_dir_all(&d);
}
