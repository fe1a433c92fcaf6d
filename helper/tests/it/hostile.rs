//! Bad input from outside through real `coli` processes: mutated model files, a FIFO as a
//! data file, and `coli convert` outputs that would destroy data. Every case must end in
//! one clear error line, no panic, no abort, and nothing on disk lost.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-hostile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn copy_fixture(name: &str, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
}

/// Runs with a time limit (a hang is a failure too).
fn run(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn assert_clean_failure(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure; stderr: {err}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), None, "killed by a signal: {err}");
    }
    assert!(!err.contains("panicked") && !err.contains("memory allocation"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "want one line on stderr, got: {err}");
    assert!(err.contains(needle), "stderr {err:?} does not mention {needle:?}");
}

/// config.json of the olmoe fixture with `key` set to `value`.
fn mutate_config(dir: &Path, key: &str, value: serde_json::Value) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v[key] = value;
    std::fs::write(p, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn mutated_configs_are_one_line_errors() {
    let base = scratch("config");
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        ("num_hidden_layers", (1u64 << 40).into(), "num_hidden_layers"),
        ("hidden_size", (1u64 << 40).into(), "hidden_size"),
        ("vocab_size", (1u64 << 40).into(), "vocab_size"),
        ("num_experts", (1u64 << 40).into(), "num_experts"),
        ("intermediate_size", u64::MAX.into(), "intermediate_size"),
        ("max_position_embeddings", (1u64 << 62).into(), "max_position_embeddings"),
        ("num_hidden_layers", 3.into(), "model.layers.2"),
        ("vocab_size", 77.into(), "embed_tokens"),
        ("clip_qkv", (-1.0).into(), "clip_qkv"),
    ];
    for (i, (key, value, needle)) in cases.into_iter().enumerate() {
        let dir = base.join(format!("m{i}"));
        copy_fixture("olmoe", &dir);
        mutate_config(&dir, key, value.clone());
        for args in [vec!["info"], vec!["logits", "--model"]] {
            let mut cmd = coli();
            cmd.args(&args).arg(&dir);
            if args[0] == "logits" {
                cmd.args(["--ids", "1,2", "--out"]).arg(base.join("out.f32"));
            }
            let out = run(&mut cmd, Duration::from_secs(60));
            if args[0] == "info" && out.status.success() {
                // `info` may describe a model whose weights it does not open; it must not crash.
                continue;
            }
            assert_clean_failure(&out, needle);
            let _ = value;
        }
    }
    std::fs::remove_dir_all(&base).unwrap();
}

#[cfg(unix)]
#[test]
fn a_fifo_as_a_model_file_is_an_error_not_a_hang() {
    let dir = scratch("fifo");
    copy_fixture("olmoe", &dir);
    for name in ["model.safetensors", "config.json"] {
        let p = dir.join(name);
        let saved = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let out = run(
            coli().args(["logits", "--model"]).arg(&dir).args(["--ids", "1", "--out"]).arg(dir.join("o.f32")),
            Duration::from_secs(30),
        );
        assert_clean_failure(&out, "not a regular file");
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, saved).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn convert_refuses_outputs_that_would_destroy_data() {
    let dir = scratch("convert");
    let src = dir.join("src");
    copy_fixture("olmoe", &src);
    let before: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect();
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"mine").unwrap();
    let cases: Vec<(PathBuf, &str)> = vec![
        (src.clone(), "is the source"),
        (src.join("."), "is the source"),
        (dir.join("src/../src"), "is the source"),
        (src.join("out"), "inside the source"),
        (dir.clone(), "holds the source"),
        (other.clone(), "holds other files"),
    ];
    for (out_dir, needle) in cases {
        let out = run(coli().arg("convert").arg(&src).arg("-o").arg(&out_dir), Duration::from_secs(60));
        assert_clean_failure(&out, needle);
    }
    for (p, b) in &before {
        assert_eq!(&std::fs::read(p).unwrap(), b, "{} changed", p.display());
    }
    assert_eq!(std::fs::read(other.join("notes.txt")).unwrap(), b"mine");
    assert!(!src.join("out").exists());
    // --force writes into the non-empty directory; a new directory needs nothing.
    let out = run(coli().arg("convert").arg(&src).arg("-o").arg(&other).arg("--force"), Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(other.join("notes.txt")).unwrap(), b"mine");
    // The manifest carries its own checksum; an edit is caught by load and by doctor.
    let m = other.join("colibri.json");
    let text = std::fs::read_to_string(&m).unwrap();
    assert!(text.contains("manifest_xxh3"));
    let out = run(coli().args(["doctor", "--checksums"]).arg(&other), Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // An edit that keeps the JSON valid: the first tensor's group size (whatever the
    // convert default is) doubled.
    let gs = text.split("\"group_size\": ").nth(1).and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next()).unwrap();
    let doubled = 2 * gs.parse::<u32>().unwrap();
    let edited = text.replacen(&format!("\"group_size\": {gs}"), &format!("\"group_size\": {doubled}"), 1);
    assert_ne!(edited, text);
    std::fs::write(&m, edited).unwrap();
    let out = run(
        coli().args(["logits", "--model"]).arg(&other).args(["--ids", "1", "--out"]).arg(dir.join("o.f32")),
        Duration::from_secs(60),
    );
    assert_clean_failure(&out, "manifest_xxh3");
    let out = run(coli().args(["doctor", "--checksums"]).arg(&other), Duration::from_secs(60));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("manifest_xxh3"), "{}", String::from_utf8_lossy(&out.stdout));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn serve_refuses_a_null_origin() {
    let out = run(coli().args(["serve", "--port", "0", "--allow-origin", "null"]), Duration::from_secs(30));
    assert_clean_failure(&out, "--allow-origin");
}
