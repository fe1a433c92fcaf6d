//! `COLI_MODEL_MIRROR`: a converted model's experts read from a copy on another device too.
//! `coli generate` answers the same with and without the copy, says where it reads from,
//! and a copy that is not the same model is a warning, never a different answer.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo")
}

fn copy_model(dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(demo()).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() && !p.to_string_lossy().ends_with(".lock") {
            std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
        }
    }
}

fn generate(model: &Path, mirror: Option<&Path>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_coli"));
    c.args(["generate", "--prompt", "What is 47 + 38?", "--chat", "--max-new-tokens", "24", "--temperature", "0"])
        .args(["--ram", "1M", "--model"])
        .arg(model)
        .env_remove("COLI_MODEL_MIRROR");
    if let Some(m) = mirror {
        c.env("COLI_MODEL_MIRROR", m);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn a_mirrored_model_answers_the_same_and_a_wrong_copy_is_only_a_warning() {
    let root = std::env::temp_dir().join(format!("coli-mirror-cli-{}", std::process::id()));
    let (a, disk2) = (root.join("disk1/demo"), root.join("disk2"));
    copy_model(&a);
    copy_model(&disk2.join("demo"));
    let plain = generate(&a, None);
    // The variable names a directory of copies: the model's copy is the one of its name.
    let mirrored = generate(&a, Some(&disk2));
    assert_eq!(String::from_utf8_lossy(&mirrored.stdout), String::from_utf8_lossy(&plain.stdout));
    let err = String::from_utf8_lossy(&mirrored.stderr);
    assert!(err.contains("its copy") && err.contains("disk2"), "{err}");
    // A copy of something else: the model is read from its own directory, with a warning.
    std::fs::write(disk2.join("demo/colibri.json"), b"{\"not\": \"the same\"}").unwrap();
    let wrong = generate(&a, Some(&disk2));
    assert_eq!(String::from_utf8_lossy(&wrong.stdout), String::from_utf8_lossy(&plain.stdout));
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(err.contains("warning: COLI_MODEL_MIRROR") && err.contains("not a copy of"), "{err}");
    let _ = std::fs::remove_dir_all(&root);
}
