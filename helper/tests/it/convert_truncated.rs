//! `coli convert` of a source that another process truncates while it is converted (a
//! re-download, `rsync --inplace`; issue 29): the conversion stops with one clear line
//! naming the file and exit status 1, never a SIGBUS, and leaves no finished model behind
//! (no manifest: the output is not a valid model, and a rerun resumes it). Real files, a
//! real `coli` process. `COLI_READ_LIMIT=0` makes the source count as "larger than half the
//! free memory", the case that used to be memory-mapped (and died of SIGBUS here).
#![cfg(target_os = "linux")]

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-trunc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `coli convert src -o dst` slowly (a pause after each item) and truncates `victim`
/// to `keep` bytes once the conversion has begun writing; returns its output.
fn convert_truncating(src: &Path, dst: &Path, victim: &Path, keep: u64) -> Output {
    let child = coli()
        .arg("convert")
        .arg(src)
        .arg("-o")
        .arg(dst)
        .env("COLI_READ_LIMIT", "0")
        .env("COLI_CONVERT_ITEM_DELAY_MS", "300")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The data file appears once the plan is made and the source is open.
    let partial = dst.join("weights.bin.partial");
    let t = Instant::now();
    while !partial.exists() {
        assert!(t.elapsed() < Duration::from_secs(120), "the conversion never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::OpenOptions::new().write(true).open(victim).unwrap().set_len(keep).unwrap();
    child.wait_with_output().unwrap()
}

/// What every truncated conversion must show: a clean failure that names the file and
/// says what happened, and no model in `dst`.
fn assert_refused(out: &Output, dst: &Path, file: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), None, "killed by a signal: {:?}; stderr: {err}", out.status);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: ") && last.contains(file), "{err}");
    assert!(last.contains("truncated") || last.contains("past the end"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!dst.join("colibri.json").exists(), "a manifest was written");
    // Not a model: every command refuses the directory.
    let info = coli().arg("info").arg(dst).output().unwrap();
    assert!(!info.status.success(), "coli info accepted the unfinished output");
}

/// A Hugging Face checkpoint's shard truncated to its header mid-conversion.
#[test]
fn hf_checkpoint_truncated_mid_conversion_is_an_error_not_a_sigbus() {
    let dir = scratch("hf");
    let src = dir.join("qwen3_moe");
    std::fs::create_dir_all(&src).unwrap();
    for e in std::fs::read_dir(fixtures().join("qwen3_moe")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, src.join(p.file_name().unwrap())).unwrap();
    }
    let shard = src.join("model.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let dst = dir.join("out");
    let out = convert_truncating(&src, &dst, &shard, header_end + 64);
    assert_refused(&out, &dst, "model.safetensors");

    // The source restored, the same command resumes and finishes.
    std::fs::write(&shard, &bytes).unwrap();
    let out = coli().arg("convert").arg(&src).arg("-o").arg(&dst).env("COLI_READ_LIMIT", "0").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(dst.join("colibri.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A GGUF truncated to a third mid-conversion; and one truncated before, whose header
/// describes more than it holds.
#[test]
fn gguf_truncated_mid_conversion_is_an_error_not_a_sigbus() {
    let dir = scratch("gguf");
    let src = dir.join("olmoe.gguf");
    std::fs::copy(fixtures().join("gguf/olmoe-f16.gguf"), &src).unwrap();
    let len = std::fs::metadata(&src).unwrap().len();
    let dst = dir.join("out");
    let out = convert_truncating(&src, &dst, &src, len / 3);
    assert_refused(&out, &dst, "olmoe.gguf");

    let dst2 = dir.join("out2");
    let out = coli().arg("convert").arg(&src).arg("-o").arg(&dst2).env("COLI_READ_LIMIT", "0").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("olmoe.gguf") && (err.contains("truncated") || err.contains("past the end")), "{err}");
    assert!(!dst2.join("colibri.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
