//! Files that change underneath or are planted by someone else, as `coli serve` and the
//! CLI meet them (issue 29): a streamed checkpoint truncated while served, the KV cache
//! directory (private, appended per turn, FIFOs and oversized files refused), the usage
//! lock held by another process, and manifests without their own checksum or with ranges
//! that share bytes. Real processes, real files, a real server on loopback.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-private-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        // Not the usage counts other tests' runs leave beside the demo model.
        if e.file_name().to_string_lossy().starts_with("usage.json") {
            continue;
        }
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// A `coli serve` child; killed when dropped.
struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(model: &Path, data: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let log = data.join(format!("serve-{}.log", rand_tag()));
        let mut cmd = coli();
        cmd.args(["serve", "--port", "0", "--model"])
            .arg(model)
            .args(extra)
            .env("XDG_DATA_HOME", data)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let url = first.strip_prefix("colibri is listening on ").unwrap_or_else(|| panic!("{first}"));
        let port = url.rsplit(':').next().unwrap().parse().unwrap();
        // Keep draining stdout so the server never blocks on it.
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Server { child, port, log }
    }

    /// One request on a new connection, waiting at most `limit`: (status, body).
    fn request(&self, method: &str, path: &str, body: &str, limit: Duration) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(limit)).unwrap();
        let typed = if body.is_empty() {
            String::new()
        } else {
            format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len())
        };
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n{typed}\r\n{body}",
            self.port
        )
        .unwrap();
        let mut out = String::new();
        if let Err(e) = s.read_to_string(&mut out) {
            panic!("{method} {path}: no answer within {limit:?} ({e}); server log: {}", self.log_text());
        }
        let status = out.split_whitespace().nth(1).unwrap_or_else(|| panic!("no status: {out:?}")).parse().unwrap();
        (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
    }

    fn complete(&self, model: &str, ids: &[u32], max_tokens: usize) -> (u16, String) {
        let body = json!({"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0}).to_string();
        self.request("POST", "/v1/completions", &body, Duration::from_secs(60))
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Peak resident memory (VmHWM) in bytes.
    fn peak_rss(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }
}

fn rand_tag() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

fn mem_available() -> u64 {
    let s = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = s.lines().find(|l| l.starts_with("MemAvailable:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Adds to the safetensors file at `path` an unused routed-expert tensor of `extra` bytes
/// that takes no disk (a hole): the checkpoint becomes larger than half the free memory,
/// which is what decides whether a checkpoint is read into memory.
fn grow_sparse(path: &Path, extra: u64) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let end = data.len() as u64;
    header.insert(
        "model.layers.0.mlp.experts.999999.gate_proj.weight".into(),
        json!({"dtype": "U8", "shape": [extra], "data_offsets": [end, end + extra]}),
    );
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    f.write_all(data).unwrap();
    f.set_len(8 + h.len() as u64 + end + extra).unwrap();
    8 + h.len() as u64
}

/// Item 2 of issue 29: a Hugging Face checkpoint larger than half of MemAvailable, served
/// directly and truncated while served (a re-download, `rsync --inplace`), used to kill
/// the server with SIGBUS on the next request (it was memory-mapped). Now it is streamed
/// with pread: the request is answered with an error and the server lives on.
#[test]
fn a_streamed_checkpoint_truncated_while_served_is_an_error_not_a_sigbus() {
    let dir = scratch("sigbus");
    let model = dir.join("qwen3_moe");
    copy_dir(&root().join("tests/fixtures/qwen3_moe"), &model);
    let st = model.join("model.safetensors");
    // Larger than half of MemAvailable whatever it is when the server starts.
    let header_end = grow_sparse(&st, mem_available() + (1 << 30));
    let mut server = Server::start(&model, &dir, &["--ram", "0"], &[]);
    let (status, body) = server.complete("qwen3_moe", &[1, 2, 3, 4], 2);
    assert_eq!(status, 200, "{body}");
    // Every byte after the header goes.
    std::fs::OpenOptions::new().write(true).open(&st).unwrap().set_len(header_end).unwrap();
    let (status, body) = server.complete("qwen3_moe", &[5, 6, 7, 8], 2);
    assert!(server.alive(), "the server died: {:?}; log: {}", server.child.try_wait(), server.log_text());
    assert!(status >= 400, "{status} {body}");
    assert!(body.contains("truncated"), "{body}");
    // Streamed, the stream has begun when the error comes: it ends with an error event
    // then `data: [DONE]`, well-formed (it used to stop after the error event).
    let req = json!({"model": "qwen3_moe", "prompt": [9, 10, 11], "max_tokens": 2, "stream": true});
    let (status, body) = server.request("POST", "/v1/completions", &req.to_string(), Duration::from_secs(60));
    assert_eq!(status, 200, "{body}");
    let events: Vec<&str> = body.lines().filter(|l| l.starts_with("data: ")).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{body}");
    assert!(events.len() >= 2 && events[events.len() - 2].contains("truncated"), "{body}");
    let (status, _) = server.request("GET", "/health", "", Duration::from_secs(10));
    assert_eq!(status, 200);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The ids a KV cache file holds, read as the helper reads them.
fn kv_ids(p: &Path) -> Vec<u32> {
    let bytes = std::fs::read(p).unwrap();
    let mut read = |at: u64, buf: &mut [u8]| -> colibri_engine::Result<()> {
        buf.copy_from_slice(&bytes[at as usize..at as usize + buf.len()]);
        Ok(())
    };
    colibri_engine::model::kv::scan(&mut read, bytes.len() as u64, 1 << 20).unwrap().header.tokens
}

fn kv_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "kv") && std::fs::symlink_metadata(p).unwrap().is_file())
        .collect();
    v.sort();
    v
}

fn cached_tokens(body: &str) -> u64 {
    let v: Value = serde_json::from_str(body).unwrap();
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0)
}

/// Item 4 of issue 29: conversation caches are 0600 files in 0700 directories, a turn is
/// appended to its conversation's file (not the whole file rewritten), a FIFO in the
/// directory does not hang a chat, and a file longer than its header says is refused
/// before it is read (it used to be read whole).
#[test]
fn kv_cache_files_are_private_appended_and_checked_before_reading() {
    use std::os::unix::fs::MetadataExt;
    let dir = scratch("kv");
    let model = root().join("tests/fixtures/qwen3_moe");
    let server = Server::start(&model, &dir, &[], &[]);
    let (status, body) = server.complete("qwen3_moe", &[1, 2, 3, 4, 5], 3);
    assert_eq!(status, 200, "{body}");
    let kv = dir.join("colibri/kv");
    let fps: Vec<PathBuf> = std::fs::read_dir(&kv).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(fps.len(), 1, "{fps:?}");
    let fp_dir = fps[0].clone();
    let files = kv_files(&fp_dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let file = files[0].clone();
    assert_eq!((mode(&kv), mode(&fp_dir), mode(&file)), (0o700, 0o700, 0o600), "private to this user");
    // The next turn extends the conversation: appended to the same file.
    let first = std::fs::read(&file).unwrap();
    let inode = std::fs::metadata(&file).unwrap().ino();
    let mut ids = kv_ids(&file);
    assert!(ids.starts_with(&[1, 2, 3, 4, 5]), "{ids:?}");
    ids.extend([7, 8, 9]);
    let (status, body) = server.complete("qwen3_moe", &ids, 2);
    assert_eq!(status, 200, "{body}");
    assert_eq!(kv_files(&fp_dir), std::slice::from_ref(&file), "the same file");
    let second = std::fs::read(&file).unwrap();
    assert_eq!(std::fs::metadata(&file).unwrap().ino(), inode, "not replaced by a rename");
    assert!(second.len() > first.len() && second.starts_with(&first), "the turn was appended");
    // A FIFO among the caches: refused without blocking the next turn.
    let fifo = std::ffi::CString::new(fp_dir.join("planted.kv").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let mut ids = kv_ids(&file);
    ids.push(10);
    let t = Instant::now();
    let body = json!({"model": "qwen3_moe", "prompt": ids, "max_tokens": 2, "temperature": 0}).to_string();
    let (status, body) = server.request("POST", "/v1/completions", &body, Duration::from_secs(30));
    assert_eq!(status, 200, "{body}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    drop(server);

    // After a restart the appended file is read back: the next turn reuses it all.
    let ids = kv_ids(&file);
    let server = Server::start(&model, &dir, &[], &[]);
    let mut more = ids.clone();
    more.push(11);
    let (status, body) = server.complete("qwen3_moe", &more, 1);
    assert_eq!(status, 200, "{body}");
    assert_eq!(cached_tokens(&body), ids.len() as u64, "{body}");
    drop(server);

    // A file of the conversation grown to 900 MiB (a hole after its real bytes): its
    // length is not what its records say, so it is refused without being read.
    let file = kv_files(&fp_dir).into_iter().max_by_key(|p| std::fs::metadata(p).unwrap().len()).unwrap();
    let ids = kv_ids(&file);
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(900 << 20).unwrap();
    let server = Server::start(&model, &dir, &[], &[]);
    let mut more = ids.clone();
    more.push(12);
    let (status, body) = server.complete("qwen3_moe", &more, 1);
    assert_eq!(status, 200, "{body}");
    assert_eq!(cached_tokens(&body), 0, "{body}");
    let peak = server.peak_rss();
    assert!(peak < 400 << 20, "peak RSS {peak} bytes: the file was read");
    assert!(!file.exists(), "the bad file is removed");
    assert!(server.log_text().contains("ignoring the KV cache file"), "{}", server.log_text());
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Item 5 of issue 29, the lock: every command creates the usage lock 0600 (`coli plan`
/// made it 0644), and another process holding it neither slows `/v1` calls (each used to
/// wait 5 s) nor makes `/api/usage` answer 500: the counts wait in memory and are written
/// once the lock is free.
#[test]
fn a_held_usage_lock_slows_nothing_and_fails_nothing() {
    use std::os::unix::io::AsRawFd;
    let dir = scratch("lock");
    let model = dir.join("demo");
    copy_dir(&root().join("models/demo"), &model);
    let out =
        coli().args(["plan", "--probe-bytes", "0", "--json"]).arg(&model).env("XDG_DATA_HOME", &dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lock = model.join("usage.json.lock");
    assert_eq!(mode(&lock), 0o600, "the lock file is private");
    let server = Server::start(&model, &dir, &[], &[]);
    let held = std::fs::File::open(&lock).unwrap();
    // SAFETY: flock on a descriptor we own (as another process would hold it).
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
    let t = Instant::now();
    for i in 0..3 {
        let (status, body) = server.complete("demo", &[1, 2, 3 + i], 4);
        assert_eq!(status, 200, "{body}");
    }
    assert!(t.elapsed() < Duration::from_secs(4), "three calls took {:?}", t.elapsed());
    let report = json!({"model": "demo", "counts": [[0, 0, 5]]}).to_string();
    let t = Instant::now();
    let (status, body) = server.request("POST", "/api/usage", &report, Duration::from_secs(30));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"deferred\":true"), "{body}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(!model.join("usage.json").exists(), "nothing written while the lock is held: {}", server.log_text());
    drop(held);
    let (status, body) = server.complete("demo", &[4, 5, 6], 2);
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.request("GET", "/api/usage/demo", "", Duration::from_secs(10));
    assert_eq!(status, 200, "{body}");
    let written: Value = serde_json::from_slice(&std::fs::read(model.join("usage.json")).unwrap()).unwrap();
    assert!(written.to_string().contains('5'), "the deferred report was written: {written}");
    assert_eq!(mode(&model.join("usage.json")), 0o600);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

fn run(args: &[&str], model: &Path) -> std::process::Output {
    coli().args(args).arg(model).env("XDG_DATA_HOME", model.parent().unwrap()).output().unwrap()
}

/// Item 5 of issue 29, the manifest: with its own checksum removed and an expert part's
/// offset moved onto another part, `coli logits` printed NaN with exit 0 and `doctor
/// --checksums` said everything matched. The checksum is now required (a clear "run coli
/// doctor --fix" for models from older converters), the ranges may not share bytes, and
/// `doctor --fix` seals only a model whose every byte matches.
#[test]
fn manifests_must_be_sealed_and_their_ranges_disjoint() {
    let dir = scratch("manifest");
    let (edited, old, orig) = (dir.join("edited"), dir.join("old"), dir.join("orig"));
    copy_dir(&root().join("models/demo"), &orig);
    for d in [&edited, &old] {
        copy_dir(&root().join("models/demo"), d);
        let p = d.join("colibri.json");
        let mut v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert!(v.as_object_mut().unwrap().remove("manifest_xxh3").is_some());
        if d == &edited {
            let parts = &mut v["experts"]["layers"][0]["parts"];
            parts[1]["offset"] = parts[0]["offset"].clone();
        }
        std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    }
    let out_file = dir.join("o.f32");
    let logits = |m: &Path| {
        coli().args(["logits", "--ids", "1,2,3", "--out"]).arg(&out_file).arg("--model").arg(m).output().unwrap()
    };
    for d in [&edited, &old] {
        let out = logits(d);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: logits ran", d.display());
        assert!(err.contains("coli doctor --fix"), "{err}");
        let out = run(&["doctor", "--checksums"], d);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("coli doctor --fix"));
    }
    // --fix: refused where two parts share bytes; seals the unedited old model.
    let out = run(&["doctor", "--fix"], &edited);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("overlaps"), "{said}");
    assert!(!std::fs::read_to_string(edited.join("colibri.json")).unwrap().contains("manifest_xxh3"));
    let out = run(&["doctor", "--fix", "--checksums"], &old);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(std::fs::read_to_string(old.join("colibri.json")).unwrap().contains("manifest_xxh3"));
    let out = logits(&old);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got = std::fs::read(&out_file).unwrap();
    let out = logits(&orig);
    assert!(out.status.success());
    assert_eq!(got, std::fs::read(&out_file).unwrap(), "the sealed model gives the original's logits");
    let _ = std::fs::remove_dir_all(&dir);
}
