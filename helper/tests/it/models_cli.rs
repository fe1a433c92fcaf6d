//! Model management as a user does it: `COLI_HOME`, `coli list`, `coli rm`, installed ids
//! on every command, and `coli serve` serving every installed model. Real processes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// `coli` with its models directory at `home` and no other data directory.
fn coli(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_coli"));
    c.env("COLI_HOME", home).env("XDG_DATA_HOME", home.join("xdg")).env("RUST_LOG", "warn");
    c
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-models-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}

fn ok(out: Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed: {err}");
    String::from_utf8(out.stdout).unwrap()
}

/// A failed run with exactly one line on stderr, mentioning `needle`.
fn assert_clean_failure(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure; stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "want one line on stderr, got: {err}");
    assert!(err.starts_with("error: ") && err.contains(needle), "stderr {err:?} does not mention {needle:?}");
}

/// A models directory with a checkpoint (`olmoe`), a pulled-style `owner/name` checkpoint
/// and a converted model.
fn populated(tag: &str) -> PathBuf {
    let home = scratch(tag);
    copy_dir(&fixture("olmoe"), &home.join("olmoe"));
    copy_dir(&fixture("qwen3_moe"), &home.join("acme/tiny-moe"));
    ok(coli(&home).arg("convert").arg(fixture("mixtral")).arg("-o").arg(home.join("mix-int4")).output().unwrap());
    home
}

#[test]
fn list_shows_every_installed_model_and_rm_removes_one() {
    let home = populated("list");
    let v: serde_json::Value =
        serde_json::from_str(&ok(coli(&home).args(["list", "--json"]).output().unwrap())).unwrap();
    assert_eq!(v["models_dir"], home.display().to_string());
    let models = v["models"].as_array().unwrap();
    let ids: Vec<&str> = models.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["acme/tiny-moe", "mix-int4", "olmoe"]);
    let by_id = |id: &str| models.iter().find(|m| m["id"] == id).unwrap().clone();
    let conv = by_id("mix-int4");
    assert_eq!(conv["family"], "mixtral");
    assert_eq!(conv["quantization"], "int4/g32");
    let on_disk = std::fs::metadata(home.join("mix-int4/weights.bin")).unwrap().len();
    assert!(conv["size"].as_u64().unwrap() > on_disk);
    let (resident, streamed) = (conv["resident_bytes"].as_u64().unwrap(), conv["streamed_bytes"].as_u64().unwrap());
    assert!(resident > 0 && streamed > resident, "{conv}");
    assert!(resident + streamed <= on_disk, "the data file holds the resident and the streamed bytes");
    assert_eq!(by_id("acme/tiny-moe")["family"], "qwen3_moe");
    assert_eq!(by_id("olmoe")["path"], home.join("olmoe").display().to_string());

    let table = ok(coli(&home).arg("list").output().unwrap());
    assert!(table.starts_with("ID "), "{table}");
    assert!(table.contains("acme/tiny-moe") && table.contains("int4/g32") && table.contains("mixtral"), "{table}");

    // Without a terminal to ask on, rm deletes nothing unless told --yes.
    assert_clean_failure(&coli(&home).args(["rm", "acme/tiny-moe"]).output().unwrap(), "--yes");
    assert!(home.join("acme/tiny-moe/config.json").is_file());
    let out = coli(&home).args(["rm", "--yes", "acme/tiny-moe"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("removed acme/tiny-moe"));
    assert!(!home.join("acme").exists(), "the empty owner directory goes too");
    assert_clean_failure(&coli(&home).args(["rm", "-y", "acme/tiny-moe"]).output().unwrap(), "no installed model");
    assert_clean_failure(&coli(&home).args(["rm", "-y", "../olmoe"]).output().unwrap(), "is not a model id");
    assert!(home.join("olmoe/config.json").is_file());

    let empty = scratch("list-empty");
    let text = ok(coli(&empty).arg("list").output().unwrap());
    assert!(text.contains("no models installed"), "{text}");
}

#[test]
fn rm_never_deletes_outside_the_models_directory() {
    let home = scratch("rm-links");
    let outside = scratch("rm-outside");
    copy_dir(&fixture("olmoe"), &outside.join("olmoe"));
    // A model linked into the models directory: rm removes the link, not the model.
    std::os::unix::fs::symlink(outside.join("olmoe"), home.join("linked")).unwrap();
    // An owner directory linked to elsewhere: nothing is deleted through it.
    std::os::unix::fs::symlink(&outside, home.join("elsewhere")).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&ok(coli(&home).args(["list", "--json"]).output().unwrap())).unwrap();
    let ids: Vec<&str> = v["models"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["elsewhere/olmoe", "linked"]);

    assert_clean_failure(
        &coli(&home).args(["rm", "--yes", "elsewhere/olmoe"]).output().unwrap(),
        "outside the models directory",
    );
    assert!(outside.join("olmoe/config.json").is_file());
    let out = coli(&home).args(["rm", "--yes", "linked"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::symlink_metadata(home.join("linked")).is_err(), "the link is gone");
    assert!(outside.join("olmoe/config.json").is_file(), "its target stays");
}

#[test]
fn every_command_takes_an_installed_id() {
    let home = populated("ids");
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("qwen3_moe").join("reference.json")).unwrap()).unwrap();
    let prompt: Vec<String> =
        r["greedy"]["prompt_ids"].as_array().unwrap().iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let want = &r["greedy"]["new_ids"];
    let n = want.as_array().unwrap().len().to_string();
    let gen = ok(coli(&home)
        .args(["generate", "--model", "acme/tiny-moe", "--ids", &prompt.join(","), "--max-new-tokens", &n, "--json"])
        .output()
        .unwrap());
    let got: serde_json::Value = serde_json::from_str(&gen).unwrap();
    assert_eq!(&got["ids"], want);

    for args in [&["info", "acme/tiny-moe", "--json"][..], &["info", "--model", "mix-int4", "--json"]] {
        let v: serde_json::Value = serde_json::from_str(&ok(coli(&home).args(args).output().unwrap())).unwrap();
        assert!(v["path"].as_str().unwrap().starts_with(&home.display().to_string()), "{v}");
    }
    let doc = ok(coli(&home).args(["doctor", "mix-int4"]).output().unwrap());
    assert!(doc.contains("ok    weights"), "{doc}");
    // The disk under the models directory, measured with the O_DIRECT probe.
    assert!(doc.contains("disk speed") && doc.contains("/s (random 256 KiB reads"), "{doc}");
    let doc = ok(coli(&home).args(["doctor", "--model", "olmoe"]).output().unwrap());
    assert!(doc.contains("ok    weights"), "{doc}");

    assert_clean_failure(&coli(&home).args(["info", "no-such-model"]).output().unwrap(), "no-such-model");
    assert_clean_failure(
        &coli(&home)
            .args(["generate", "--model", "acme/nope", "--ids", "1", "--max-new-tokens", "1"])
            .output()
            .unwrap(),
        "acme/nope",
    );
    let out = coli(&home).args(["doctor", "no-such-model"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAIL  model id"));
}

/// `demo` is built into the binary: with nothing installed, the first command that names
/// it installs it into COLI_HOME (the same files as models/demo), for every command,
/// `info` and `doctor` included (they once refused the id the others took); `coli list`
/// shows it before and after. A binary copied away from the checkout does the same.
#[test]
fn the_built_in_demo_id_works_everywhere() {
    let home = scratch("demo-id");
    let list = ok(coli(&home).arg("list").output().unwrap());
    assert!(list.contains("demo: built into coli"), "{list}");
    let v: serde_json::Value =
        serde_json::from_str(&ok(coli(&home).args(["info", "demo", "--json"]).output().unwrap())).unwrap();
    let path = std::fs::canonicalize(v["path"].as_str().unwrap()).unwrap();
    assert_eq!(path, std::fs::canonicalize(home.join("demo")).unwrap(), "{v}");
    let checkout = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/demo");
    for f in ["colibri.json", "config.json", "weights.bin", "tokenizer.json", "examples.json"] {
        assert!(std::fs::read(checkout.join(f)).unwrap() == std::fs::read(home.join("demo").join(f)).unwrap(), "{f}");
    }
    let doc = ok(coli(&home).args(["doctor", "demo"]).output().unwrap());
    assert!(doc.contains("ok    weights") && doc.contains("ok    tokenizer"), "{doc}");
    let list = ok(coli(&home).args(["list", "--json"]).output().unwrap());
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!((v["models"][0]["id"].as_str(), v["built_in"].clone()), (Some("demo"), serde_json::json!([])), "{v}");

    // A copy of the binary, an empty HOME, no COLI_HOME: installed under HOME, and it answers.
    let away = scratch("demo-away");
    let bin = away.join("coli");
    std::fs::copy(env!("CARGO_BIN_EXE_coli"), &bin).unwrap();
    let empty_home = away.join("home");
    std::fs::create_dir_all(&empty_home).unwrap();
    let gen = ok(Command::new(&bin)
        .env_clear()
        .env("HOME", &empty_home)
        .env("PATH", "/usr/bin:/bin")
        .args(["generate", "--model", "demo", "--chat", "--prompt", "What is 7 plus 5?", "--temperature", "0"])
        .output()
        .unwrap());
    assert!(gen.contains("12"), "{gen}");
    assert!(empty_home.join(".local/share/colibri/models/demo/weights.bin").is_file());
    let _ = std::fs::remove_dir_all(&away);
}

fn get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

#[test]
fn serve_serves_every_installed_model() {
    let home = populated("serve");
    let mut child = coli(&home).args(["serve", "--port", "0"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let port: u16 = first.rsplit(':').next().unwrap().parse().unwrap_or_else(|_| panic!("{first}"));
    let (status, body) = get(port, "/api/models");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<&str> = v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    for id in ["acme/tiny-moe", "mix-int4", "olmoe"] {
        assert!(ids.contains(&id), "{id} missing from {ids:?}");
    }
    let want = std::fs::read_to_string(home.join("acme/tiny-moe/config.json")).unwrap();
    for path in ["/models/acme%2Ftiny-moe/config.json", "/models/acme/tiny-moe/config.json"] {
        assert_eq!(get(port, path), (200, want.clone()), "{path}");
    }
    assert_eq!(get(port, "/models/acme/nope/config.json").0, 404);
    assert_eq!(get(port, "/models/mix-int4/colibri.json").0, 200);
    let _ = child.kill();
    let _ = child.wait();
}
