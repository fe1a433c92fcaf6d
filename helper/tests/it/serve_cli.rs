//! `coli serve` and `coli service` as a user runs them: real processes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-serve-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One HTTP/1.1 request on a new connection: (status, body).
fn request(port: u16, method: &str, path: &str, host: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    let typed = if body.is_empty() {
        String::new()
    } else {
        format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len())
    };
    write!(s, "{head}{typed}\r\n{body}").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

fn get(port: u16, path: &str, host: &str) -> (u16, String) {
    request(port, "GET", path, host, "")
}

/// A reader that has closed the pipe (`coli serve | head -1` after its line, a supervisor
/// that only wanted the address) does not stop the server: its lines to stdout used to
/// panic on the closed pipe. Here the pipe is closed before the server writes anything.
#[test]
fn serve_lives_on_when_its_stdout_is_closed() {
    let data = scratch("stdout");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = coli()
        .args(["serve", "--port", &port.to_string(), "--model"])
        .arg(fixture("qwen3_moe"))
        .arg("--models-dir")
        .arg(data.join("models"))
        .env("XDG_DATA_HOME", &data)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::from(writer))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for it to listen, then ask a few times.
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "the server stopped before listening");
        assert!(start.elapsed() < Duration::from_secs(60), "the server never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..3 {
        assert_eq!(get(port, "/health", &format!("127.0.0.1:{port}")).0, 200);
    }
    assert!(child.try_wait().unwrap().is_none(), "the server stopped");
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&data);
}

#[cfg(unix)]
#[test]
fn serve_prints_its_url_answers_and_stops_on_sigterm() {
    let data = scratch("serve");
    let mut child = coli()
        .args(["serve", "--port", "0", "--model"])
        .arg(fixture("qwen3_moe"))
        .arg("--models-dir")
        .arg(data.join("models"))
        .env("XDG_DATA_HOME", &data)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let url = first.strip_prefix("colibri is listening on ").unwrap_or_else(|| panic!("{first}"));
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(url, format!("http://127.0.0.1:{port}"));

    let (status, body) = get(port, "/health", &format!("127.0.0.1:{port}"));
    assert_eq!(status, 200, "{body}");
    let (status, body) = get(port, "/api/models", &format!("localhost:{port}"));
    assert_eq!(status, 200);
    assert!(body.contains("\"qwen3_moe\""), "{body}");
    assert_eq!(get(port, "/health", "attacker.example").0, 403);

    // SIGTERM: a clean exit, promptly.
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "coli serve did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn serve_with_a_bad_model_fails_with_one_line() {
    let out = coli()
        .args(["serve", "--port", "0", "--model", "no-such-model-anywhere", "--models-dir", "/nonexistent"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: ") && err.contains("no-such-model-anywhere"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[cfg(target_os = "linux")]
#[test]
fn service_install_writes_a_systemd_unit() {
    let home = scratch("service");
    let cfg = home.join("config");
    let empty_path = home.join("bin");
    std::fs::create_dir_all(&empty_path).unwrap();
    let run = |args: &[&str]| {
        coli().args(args).env("HOME", &home).env("XDG_CONFIG_HOME", &cfg).env("PATH", &empty_path).output().unwrap()
    };
    let dry = run(&["service", "install", "--dry-run", "--port", "7979", "--allow-origin", "https://a.example"]);
    assert!(dry.status.success(), "{}", String::from_utf8_lossy(&dry.stderr));
    let text = String::from_utf8_lossy(&dry.stdout);
    assert!(
        text.contains("ExecStart=") && text.contains(" serve --port 7979 --allow-origin https://a.example\n"),
        "{text}"
    );
    let unit = cfg.join("systemd/user/colibri.service");
    assert!(!unit.exists(), "--dry-run writes nothing");

    // No systemctl on PATH: the unit is written all the same, and the output says so.
    let out = run(&["service", "install", "--port", "7979"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("systemctl is not available"), "{said}");
    let written = std::fs::read_to_string(&unit).unwrap();
    assert!(written.contains("Restart=on-failure") && written.contains("serve --port 7979"));
    let status = run(&["service", "status"]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("installed"));
    let out = run(&["service", "uninstall"]);
    assert!(out.status.success());
    assert!(!unit.exists());
    let _ = std::fs::remove_dir_all(&home);
}

fn post(port: u16, path: &str, body: &str) -> (u16, String) {
    request(port, "POST", path, &format!("127.0.0.1:{port}"), body)
}

/// Native generations in `coli serve` count their expert use into the model's usage
/// file, as `coli generate` and browser reports do, so the next start pins by it.
#[cfg(unix)]
#[test]
fn serve_records_native_expert_use_in_the_usage_file() {
    let data = scratch("usage");
    let models = data.join("models");
    let out = coli()
        .args(["convert"])
        .arg(fixture("olmoe"))
        .arg("-o")
        .arg(models.join("olmoe"))
        .args(["--quant", "int8"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut child = coli()
        .args(["serve", "--port", "0", "--models-dir"])
        .arg(&models)
        .env("XDG_DATA_HOME", &data)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let port: u16 = first.rsplit(':').next().unwrap().parse().unwrap();
    let body = r#"{"model": "olmoe", "prompt": [5, 17, 3, 42], "max_tokens": 4, "temperature": 0, "ignore_eos": true}"#;
    let (status, text) = post(port, "/v1/completions", body);
    assert_eq!(status, 200, "{text}");
    let (status, text) = get(port, "/api/usage/olmoe", &format!("127.0.0.1:{port}"));
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    // 4 prompt positions + 3 decode steps, top-k experts in each MoE layer.
    assert!(v["total"].as_u64().unwrap() >= 7, "{v}");
    // The counts are tied to this version of the model (the xxh3 of its colibri.json).
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(models.join("olmoe/usage.json")).unwrap()).unwrap();
    assert_eq!(saved["fingerprint"].as_str().map(str::len), Some(16), "{saved}");
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&data);
}

/// Copies the files of `src` (one level) into `dst`.
fn copy_model(src: &std::path::Path, dst: &std::path::Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        if e.path().is_file() {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
}

#[cfg(unix)]
#[test]
fn doctor_checks_the_machine_and_takes_model_ids() {
    let data = scratch("doctor");
    let home = data.join("models");
    copy_model(&fixture("qwen3_moe"), &home.join("tiny"));
    let doctor = |args: &[&str]| {
        let out = coli().arg("doctor").args(args).env("COLI_HOME", &home).env("RUST_LOG", "warn").output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success(), text, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let mut child = coli()
        .args(["serve", "--port", "0"])
        .env("COLI_HOME", &home)
        .env("XDG_DATA_HOME", &data)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let port = first.rsplit(':').next().unwrap().to_string();

    // An installed model by its id, as every other command takes it; `info` too.
    let (ok, text, err) = doctor(&["tiny", "--port", &port]);
    assert!(ok, "{text}{err}");
    let line = |what: &str| {
        text.lines()
            .find(|l| l.get(6..).is_some_and(|r| r.starts_with(what)))
            .unwrap_or_else(|| panic!("no {what}: {text}"))
    };
    assert!(line("model id").ends_with(&home.join("tiny").display().to_string()), "{text}");
    assert!(
        line("helper").starts_with("ok") && line("helper").contains(&format!("answers at http://127.0.0.1:{port}")),
        "{text}"
    );
    assert!(
        // `coli serve` installed the built-in demo beside it (on first use).
        line("models").starts_with("ok")
            && line("models").contains("2 installed")
            && line("models").contains("demo, tiny"),
        "{text}"
    );
    assert!(line("disk").starts_with("ok") && line("disk").contains("free at"), "{text}");
    // Built with or without the browser engine / a Vulkan driver: either way it says which.
    assert!(line("web engine").contains("built in") || line("web engine").contains("tools/build-web.sh"), "{text}");
    assert!(line("vulkan").contains("--backend wgpu"), "{text}");
    let info = coli().args(["info", "tiny", "--json"]).env("COLI_HOME", &home).output().unwrap();
    assert!(info.status.success(), "{}", String::from_utf8_lossy(&info.stderr));

    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    // No helper on that port any more: a warning with the command that starts one there.
    let (ok, text, _) = doctor(&["--port", &port]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!("none on http://127.0.0.1:{port}: start one with `coli serve --port {port}`")),
        "{text}"
    );
    // An id that is not installed: one clear failure.
    let (ok, text, _) = doctor(&["no-such-model", "--port", &port]);
    assert!(!ok && text.contains("FAIL  model id"), "{text}");
    let _ = std::fs::remove_dir_all(&data);
}

/// COLIBRI_WEB_DIR serves the page and engine files from a folder (a developer's A/B of two
/// engine builds); names that leave the folder or are hidden are refused.
#[cfg(unix)]
#[test]
fn serve_takes_the_web_app_from_colibri_web_dir() {
    let data = scratch("webdir");
    let web = data.join("web");
    std::fs::create_dir_all(web.join("pkg")).unwrap();
    std::fs::write(web.join("colibri.js"), "export const from = 'the folder';\n").unwrap();
    std::fs::write(web.join("pkg/colibri_wasm.js"), "// another build\n").unwrap();
    std::fs::write(web.join(".secret"), "no").unwrap();
    std::fs::write(data.join("outside.js"), "no").unwrap();
    let mut child = coli()
        .args(["serve", "--port", "0", "--models-dir"])
        .arg(data.join("models"))
        .env("XDG_DATA_HOME", &data)
        .env("COLIBRI_WEB_DIR", &web)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let port: u16 = first.rsplit(':').next().unwrap().parse().unwrap();
    let host = format!("127.0.0.1:{port}");
    let got = [
        get(port, "/colibri.js", &host),
        get(port, "/pkg/colibri_wasm.js", &host),
        get(port, "/.secret", &host),
        get(port, "/pkg/..%2f..%2foutside.js", &host),
        get(port, "/widget.js", &host),
    ];
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(got[0], (200, "export const from = 'the folder';\n".to_string()));
    assert_eq!(got[1], (200, "// another build\n".to_string()));
    assert_eq!(got[2].0, 404, "{:?}", got[2]);
    assert_eq!(got[3].0, 404, "{:?}", got[3]);
    // Not in the folder: not found (the embedded copy is not mixed in).
    assert_eq!(got[4].0, 404, "{:?}", got[4]);
    let _ = std::fs::remove_dir_all(&data);
}
