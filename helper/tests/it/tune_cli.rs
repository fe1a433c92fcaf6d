//! `coli tune`: measures cold expert reads of a converted model with each reader count
//! (through the page cache and with O_DIRECT), writes the fastest setting to the model's
//! tune.json, and later runs use it where their flags leave the choice open: `coli bench`
//! reads with its reader count, `--readers` still wins, `coli plan` quotes its bandwidth,
//! and a damaged file is ignored with a warning.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn coli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coli")).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = coli(args);
    assert!(out.status.success(), "coli {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-tune-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// The reader count and router lookahead a `coli bench` of `m` ran with, and its stderr.
fn bench_readers(m: &Path, extra: &[&str]) -> (u64, String) {
    let (rec, err) = bench_record(m, extra);
    (rec["expert_cache"]["readers"].as_u64().unwrap(), err)
}

fn bench_lookahead(m: &Path, extra: &[&str]) -> bool {
    bench_record(m, extra).0["expert_cache"]["lookahead"].as_bool().unwrap()
}

fn bench_record(m: &Path, extra: &[&str]) -> (serde_json::Value, String) {
    let mut args = vec!["bench", "--model", m.to_str().unwrap(), "--ids", "1,2,3", "--decode-tokens", "3"];
    args.extend(["--probe-bytes", "0"]);
    args.extend(extra);
    let out = coli(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (serde_json::from_slice(&out.stdout).unwrap(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn tune_writes_the_fastest_setting_and_later_runs_use_it() {
    let root = scratch("runs");
    let m = root.join("m");
    ok(&["convert", fixture("olmoe").to_str().unwrap(), "-o", m.to_str().unwrap()]);
    let ms = m.to_str().unwrap();
    let tune = m.join("tune.json");
    // --dry-run measures and writes nothing.
    let out = ok(&["tune", "--model", ms, "--bytes", "2M", "--tokens", "2", "--try-readers", "1,3", "--dry-run"]);
    assert!(out.contains("chosen:") && !tune.exists(), "{out}");
    let out = ok(&["tune", "--model", ms, "--bytes", "2M", "--tokens", "4", "--try-readers", "1,3"]);
    assert!(out.contains("tok/s with the defaults") && out.contains("wrote"), "{out}");
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&tune).unwrap()).unwrap();
    let readers = t["readers"].as_u64().unwrap();
    assert!([1, 3].contains(&readers), "{t}");
    let probes = t["probes"].as_array().unwrap();
    assert!(probes.len() == 2 || probes.len() == 4, "one probe per reader count and I/O mode: {t}");
    let best = probes.iter().map(|p| p["bytes_per_second"].as_f64().unwrap()).fold(0.0, f64::max);
    assert!(t["read_bytes_per_second"].as_f64().unwrap() >= 0.95 * best && best > 0.0, "{t}");
    assert!(t["decode_before"].as_f64().unwrap() > 0.0 && t["decode_after"].as_f64().unwrap() > 0.0, "{t}");
    // The router lookahead: both measured, on only where more than 5% faster.
    let (off, on) = (t["decode_lookahead_off"].as_f64().unwrap(), t["decode_lookahead_on"].as_f64().unwrap());
    assert!(off > 0.0 && on > 0.0, "{t}");
    assert_eq!(t["lookahead"].as_bool(), Some(on > 1.05 * off), "{t}");
    // Later runs read with the tuned count; --readers wins.
    assert_eq!(bench_readers(&m, &[]).0, readers);
    assert_eq!(bench_readers(&m, &["--readers", "2"]).0, 2);
    // Later runs use the tuned lookahead; --lookahead / --no-lookahead win.
    let mut t2 = t.clone();
    for tuned in [true, false] {
        t2["lookahead"] = tuned.into();
        std::fs::write(&tune, serde_json::to_vec(&t2).unwrap()).unwrap();
        assert_eq!(bench_lookahead(&m, &[]), tuned);
        assert!(bench_lookahead(&m, &["--lookahead"]));
        assert!(!bench_lookahead(&m, &["--no-lookahead"]));
    }
    std::fs::write(&tune, serde_json::to_vec(&t).unwrap()).unwrap();
    // coli plan quotes the measurement instead of probing again.
    let plan = ok(&["plan", ms]);
    assert!(plan.contains("measured by `coli tune`"), "{plan}");
    // A damaged file: a warning, and the defaults.
    std::fs::write(&tune, "{\"readers\": ").unwrap();
    let (r, err) = bench_readers(&m, &[]);
    assert_eq!(r, 4);
    assert!(!bench_lookahead(&m, &[]), "the router lookahead is off by default");
    assert!(err.contains("tune.json") && err.contains("ignored"), "{err}");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn tune_refuses_what_it_cannot_measure() {
    let hf = fixture("olmoe");
    let out = coli(&["tune", "--model", hf.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("coli convert"), "{err}");
    let root = scratch("bad");
    let m = root.join("m");
    ok(&["convert", fixture("olmoe").to_str().unwrap(), "-o", m.to_str().unwrap()]);
    let out = coli(&["tune", "--model", m.to_str().unwrap(), "--try-readers", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--try-readers 0"), "{err}");
    assert!(!m.join("tune.json").exists());
    let _ = std::fs::remove_dir_all(&root);
}
