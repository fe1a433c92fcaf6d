//! `coli pull` against a mock Hugging Face hub: a real HTTP server on a loopback port that
//! serves checkpoint directories in the hub's URL layout (API listing, `resolve` URLs that
//! redirect LFS files to a CDN path with `X-Linked-Etag` / `X-Linked-Size`, Range), and
//! injects faults: a connection dropped mid-file, corrupted bytes, a wrong checksum, a slow
//! link. The installed model must be byte-identical to `coli convert` of the same files.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-pull-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn coli(home: &Path, hub: &MockHub) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_coli"));
    c.env("COLI_HOME", home)
        .env("XDG_DATA_HOME", home.join("xdg"))
        .env("HF_ENDPOINT", format!("http://127.0.0.1:{}", hub.port))
        .env("HF_TOKEN", "secret-token");
    c
}

fn ok(out: Output) -> Output {
    assert!(out.status.success(), "failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// A failed run whose stderr's last line starts with `error:` and mentions `needle`, and
/// that is the only error line.
fn assert_one_error(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure; stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(err.trim_end().lines().last().unwrap().starts_with("error:"), "{err}");
    assert!(errors[0].contains(needle), "{:?} does not mention {needle:?}", errors[0]);
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Default)]
struct Faults {
    /// Files whose first full download is cut off halfway.
    drop_once: HashSet<String>,
    /// Files served with one flipped byte this many more times.
    corrupt: HashMap<String, usize>,
    /// Files whose advertised sha256 is wrong.
    wrong_sha: HashSet<String>,
    /// Pause per 16 KiB of CDN body.
    delay: Option<Duration>,
    /// Files whose first bounded Range read past byte 8 (a safetensors header) is cut off
    /// halfway, as a dropped connection.
    drop_header_once: HashSet<String>,
    /// Files whose `X-Linked-Size` says this instead of the truth.
    linked_size: HashMap<String, u64>,
    /// Files whose resolve URL answers a plain 302 to the CDN (no `X-Linked-*` headers,
    /// Content-Length 0), as for a renamed repository: the size is the CDN's HEAD.
    plain_redirect: HashSet<String>,
}

#[derive(Default)]
struct Log {
    /// "METHOD path range auth" per request.
    requests: Vec<String>,
    /// Real (not placeholder) shards in the staging directories when a shard was requested.
    real_shards_seen: Vec<usize>,
}

#[derive(Clone)]
struct MockHub {
    port: u16,
    repos: Arc<HashMap<String, PathBuf>>,
    faults: Arc<Mutex<Faults>>,
    log: Arc<Mutex<Log>>,
    home: PathBuf,
}

impl MockHub {
    fn start(repos: &[(&str, PathBuf)], home: &Path) -> MockHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let hub = MockHub {
            port: listener.local_addr().unwrap().port(),
            repos: Arc::new(repos.iter().map(|(r, p)| (r.to_string(), p.clone())).collect()),
            faults: Default::default(),
            log: Default::default(),
            home: home.to_path_buf(),
        };
        let h = hub.clone();
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                let h = h.clone();
                std::thread::spawn(move || h.handle(s));
            }
        });
        hub
    }

    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().requests.clone()
    }

    /// Shards in `<home>/.pull/*/src` whose allocated blocks hold more than half their size.
    fn real_shards(&self) -> usize {
        use std::os::unix::fs::MetadataExt;
        let mut n = 0;
        for d in std::fs::read_dir(self.home.join(".pull")).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(d.path().join("src")).into_iter().flatten().flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                let m = f.metadata().unwrap();
                if name.ends_with(".safetensors") && m.blocks() * 512 > m.len() / 2 {
                    n += 1;
                }
            }
        }
        n
    }

    fn handle(&self, mut s: TcpStream) {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        if r.read_line(&mut line).is_err() {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let range = headers.get("range").cloned().unwrap_or_default();
        let auth = headers.get("authorization").cloned().unwrap_or_default();
        self.log.lock().unwrap().requests.push(format!("{method} {target} {range} auth={auth}"));
        let authorized = auth == "Bearer secret-token";
        let send = |s: &mut TcpStream, status: &str, extra: &str, body: &[u8]| {
            let head =
                format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n", body.len());
            let _ = s.write_all(head.as_bytes());
            if method != "HEAD" {
                let _ = s.write_all(body);
            }
        };
        let repo_file = |rest: &str| -> Option<(String, PathBuf)> {
            let mut it = rest.splitn(3, '/');
            let repo = format!("{}/{}", it.next()?, it.next()?);
            Some((repo.clone(), self.repos.get(&repo)?.clone()))
        };

        if let Some(rest) = target.strip_prefix("/api/models/") {
            let Some((_, dir)) = repo_file(rest) else { return send(&mut s, "404 Not Found", "", b"no repo") };
            if !authorized {
                return send(&mut s, "401 Unauthorized", "", b"token");
            }
            let mut names: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            let siblings: Vec<_> = names.iter().map(|n| serde_json::json!({"rfilename": n})).collect();
            let body = serde_json::json!({"id": rest, "siblings": siblings}).to_string();
            return send(&mut s, "200 OK", "Content-Type: application/json\r\n", body.as_bytes());
        }
        if let Some(rest) = target.strip_prefix("/cdn/") {
            let Some((_, dir)) = repo_file(rest) else { return send(&mut s, "404 Not Found", "", b"") };
            let file = rest.splitn(3, '/').nth(2).unwrap_or("");
            let Ok(mut bytes) = std::fs::read(dir.join(file)) else { return send(&mut s, "404 Not Found", "", b"") };
            let total = bytes.len();
            let start: usize =
                range.strip_prefix("bytes=").and_then(|r| r.split('-').next()?.parse().ok()).unwrap_or(0);
            let end: usize = range
                .strip_prefix("bytes=")
                .and_then(|r| r.split('-').nth(1)?.parse::<usize>().ok())
                .map(|e| e + 1)
                .unwrap_or(total)
                .min(total);
            let mut f = self.faults.lock().unwrap();
            let is_full = range.is_empty();
            if file.ends_with(".safetensors") && end - start > 4096 && method != "HEAD" {
                let seen = self.real_shards();
                self.log.lock().unwrap().real_shards_seen.push(seen);
            }
            if is_full && f.corrupt.get(file).is_some_and(|n| *n > 0) {
                *f.corrupt.get_mut(file).unwrap() -= 1;
                bytes[total / 2] ^= 0x55;
            }
            let bounded = range.strip_prefix("bytes=").is_some_and(|r| !r.ends_with('-'));
            let cut = (is_full && f.drop_once.remove(file))
                || (bounded && start >= 8 && method != "HEAD" && f.drop_header_once.remove(file));
            let delay = f.delay;
            drop(f);
            let status = if is_full { "200 OK" } else { "206 Partial Content" };
            let cr =
                if is_full { String::new() } else { format!("Content-Range: bytes {start}-{}/{total}\r\n", end - 1) };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nAccept-Ranges: bytes\r\n{cr}Connection: close\r\n\r\n",
                end - start
            );
            let _ = s.write_all(head.as_bytes());
            if method == "HEAD" {
                return;
            }
            let body = &bytes[start..end];
            let body = if cut { &body[..body.len() / 2] } else { body };
            for chunk in body.chunks(16 << 10) {
                if s.write_all(chunk).is_err() {
                    return;
                }
                if let Some(d) = delay {
                    std::thread::sleep(d);
                }
            }
            if cut {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            return;
        }
        // /{owner}/{name}/resolve/{rev}/{file}
        let mut it = target.trim_start_matches('/').splitn(5, '/');
        let (owner, name, kw, _rev, file) = (it.next(), it.next(), it.next(), it.next(), it.next());
        let (Some(owner), Some(name), Some("resolve"), Some(file)) = (owner, name, kw, file) else {
            return send(&mut s, "404 Not Found", "", b"");
        };
        let repo = format!("{owner}/{name}");
        let Some(dir) = self.repos.get(&repo) else { return send(&mut s, "404 Not Found", "", b"") };
        if !authorized {
            return send(&mut s, "401 Unauthorized", "", b"token");
        }
        let Ok(bytes) = std::fs::read(dir.join(file)) else { return send(&mut s, "404 Not Found", "", b"") };
        if self.faults.lock().unwrap().plain_redirect.contains(file) {
            let extra = format!("Location: /cdn/{repo}/{file}\r\n");
            return send(&mut s, "302 Found", &extra, b"");
        }
        if file.ends_with(".safetensors") || file.ends_with(".gguf") {
            let sha = if self.faults.lock().unwrap().wrong_sha.contains(file) {
                sha256_hex(b"something else")
            } else {
                sha256_hex(&bytes)
            };
            let size = self.faults.lock().unwrap().linked_size.get(file).copied().unwrap_or(bytes.len() as u64);
            let extra = format!(
                "Location: http://127.0.0.1:{}/cdn/{repo}/{file}\r\nX-Linked-Etag: \"{sha}\"\r\nX-Linked-Size: {size}\r\nETag: \"{sha}\"\r\n",
                self.port,
            );
            return send(&mut s, "302 Found", &extra, b"");
        }
        // A small file: its ETag is a git hash on the real hub, not a sha256.
        send(&mut s, "200 OK", "ETag: \"0123456789abcdef0123456789abcdef01234567\"\r\n", &bytes)
    }
}

/// Asserts that two directories hold the same files with the same bytes.
fn assert_same_dir(got: &Path, want: &Path) {
    let list = |d: &Path| {
        let mut v: Vec<String> =
            std::fs::read_dir(d).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    assert_eq!(list(got), list(want), "{} vs {}", got.display(), want.display());
    for f in list(want) {
        assert!(std::fs::read(got.join(&f)).unwrap() == std::fs::read(want.join(&f)).unwrap(), "{f} differs");
    }
}

fn converted(src: &Path, tag: &str) -> PathBuf {
    let out = scratch(tag).join("model");
    let o = Command::new(env!("CARGO_BIN_EXE_coli")).arg("convert").arg(src).arg("-o").arg(&out).output().unwrap();
    ok(o);
    out
}

/// A small OLMoE-shaped checkpoint in several shards (with an index), from `coli synth`.
fn sharded_checkpoint(tag: &str) -> PathBuf {
    let dir = scratch(tag).join("ckpt");
    let o = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(["synth", "--layers", "2", "--experts", "8", "--top-k", "2", "--hidden", "64"])
        .args(["--intermediate", "64", "--heads", "4", "--vocab", "512", "--shard-size", "96K", "-o"])
        .arg(&dir)
        .output()
        .unwrap();
    ok(o);
    dir
}

#[test]
fn pull_matches_convert_through_a_redirect_and_a_dropped_connection() {
    let home = scratch("basic");
    let hub = MockHub::start(&[("acme/tiny-moe", fixture("qwen3_moe"))], &home);
    hub.faults.lock().unwrap().drop_once.insert("model.safetensors".into());

    let no_token = coli(&home, &hub).env_remove("HF_TOKEN").args(["pull", "acme/tiny-moe"]).output().unwrap();
    assert_one_error(&no_token, "HF_TOKEN");

    let out = ok(coli(&home, &hub).args(["pull", "acme/tiny-moe"]).output().unwrap());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("installed acme/tiny-moe"), "{err}");
    assert_same_dir(&home.join("acme/tiny-moe"), &converted(&fixture("qwen3_moe"), "basic-ref"));
    assert!(!home.join(".pull").exists(), "the staging directory is removed");

    let reqs = hub.requests();
    let resumed = reqs
        .iter()
        .any(|r| r.starts_with("GET /cdn/acme/tiny-moe/model.safetensors bytes=") && !r.contains("bytes=0-"));
    assert!(resumed, "no resumed Range request after the dropped connection: {reqs:#?}");
    assert!(reqs.iter().filter(|r| r.contains("/cdn/")).all(|r| r.ends_with("auth=")), "the token went to the CDN");
    assert!(reqs.iter().filter(|r| r.contains("/resolve/")).all(|r| r.ends_with("auth=Bearer secret-token")));

    let list = ok(coli(&home, &hub).args(["list", "--json"]).output().unwrap());
    let v: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(v["models"][0]["id"], "acme/tiny-moe");
    assert_eq!(v["models"][0]["quantization"], "int4/g32");

    let again = coli(&home, &hub).args(["pull", "acme/tiny-moe"]).output().unwrap();
    assert_one_error(&again, "already installed");
    for bad in ["tiny-moe", "acme/tiny-moe@a b", "../../etc"] {
        assert_one_error(&coli(&home, &hub).args(["pull", bad]).output().unwrap(), "not a");
    }
    assert_one_error(&coli(&home, &hub).args(["pull", "acme/missing"]).output().unwrap(), "404");
}

#[test]
fn pull_converts_shard_by_shard() {
    let home = scratch("shards");
    let ckpt = sharded_checkpoint("shards-src");
    let n_shards = std::fs::read_dir(&ckpt)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .count();
    assert!(n_shards >= 3, "{n_shards} shards");
    let hub = MockHub::start(&[("acme/synth", ckpt.clone())], &home);
    ok(coli(&home, &hub).args(["pull", "acme/synth", "--quant", "int8", "--group-size", "32"]).output().unwrap());
    let want = scratch("shards-ref").join("model");
    ok(Command::new(env!("CARGO_BIN_EXE_coli"))
        .arg("convert")
        .arg(&ckpt)
        .arg("-o")
        .arg(&want)
        .args(["--quant", "int8", "--group-size", "32"])
        .output()
        .unwrap());
    assert_same_dir(&home.join("acme/synth"), &want);
    let seen = hub.log.lock().unwrap().real_shards_seen.clone();
    assert_eq!(seen.len(), n_shards, "{seen:?}");
    assert!(seen.iter().all(|&n| n <= 1), "more than one downloaded shard on disk at once: {seen:?}");
}

#[test]
fn a_corrupted_download_is_fetched_again_and_a_wrong_checksum_never_converted() {
    let home = scratch("corrupt");
    let hub = MockHub::start(&[("acme/flaky", fixture("olmoe")), ("acme/bad", fixture("olmoe"))], &home);
    hub.faults.lock().unwrap().corrupt.insert("model.safetensors".into(), 1);
    let out = ok(coli(&home, &hub).args(["pull", "acme/flaky"]).output().unwrap());
    assert!(String::from_utf8_lossy(&out.stderr).contains("fetching it again"));
    assert_same_dir(&home.join("acme/flaky"), &converted(&fixture("olmoe"), "corrupt-ref"));

    hub.faults.lock().unwrap().wrong_sha.insert("model.safetensors".into());
    let before = hub.requests().len();
    let out = coli(&home, &hub).args(["pull", "acme/bad"]).output().unwrap();
    assert_one_error(&out, "sha256");
    let full_gets =
        hub.requests()[before..].iter().filter(|r| r.starts_with("GET /cdn/acme/bad/model.safetensors  ")).count();
    assert_eq!(full_gets, 2, "fetched once more after the mismatch, then refused");
    let staging = home.join(".pull/acme--bad@main");
    assert!(!staging.join("out").exists(), "a corrupted shard was converted");
    assert!(!staging.join("src/model.safetensors.part").exists());
    assert!(!home.join("acme/bad").exists());
}

#[cfg(unix)]
#[test]
fn a_killed_pull_resumes_to_the_same_bytes() {
    let home = scratch("kill");
    let ckpt = sharded_checkpoint("kill-src");
    let hub = MockHub::start(&[("acme/synth", ckpt.clone())], &home);
    hub.faults.lock().unwrap().delay = Some(Duration::from_millis(40));
    let mut child = coli(&home, &hub).args(["pull", "acme/synth"]).stderr(std::process::Stdio::null()).spawn().unwrap();
    let src = home.join(".pull/acme--synth@main/src");
    let t = Instant::now();
    // Kill it once a shard is converted and the next one is partly downloaded.
    loop {
        let names: Vec<String> = std::fs::read_dir(&src)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let converted = names.iter().any(|n| n.ends_with(".converted"));
        let part = names.iter().any(|n| n.ends_with(".part") && std::fs::metadata(src.join(n)).unwrap().len() > 0);
        if converted && part {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the pull finished before it could be killed");
        assert!(t.elapsed() < Duration::from_secs(60), "no progress: {names:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    hub.faults.lock().unwrap().delay = None;
    let before = hub.requests().len();
    ok(coli(&home, &hub).args(["pull", "acme/synth"]).output().unwrap());
    assert_same_dir(&home.join("acme/synth"), &converted(&ckpt, "kill-ref"));
    let reqs = hub.requests()[before..].to_vec();
    assert!(reqs.iter().any(|r| r.contains("/cdn/") && r.contains("bytes=") && !r.contains("bytes=0-")), "{reqs:#?}");
}

/// A repository of GGUF files, as the hub's *-GGUF repositories are: two quantizations of a
/// model (here two fixtures under such names), a multimodal projector and a split GGUF.
fn gguf_repo(tag: &str) -> PathBuf {
    let dir = scratch(tag).join("repo");
    std::fs::create_dir_all(&dir).unwrap();
    let g = fixture("gguf");
    std::fs::copy(g.join("qwen3moe-q4_0-q8_0.gguf"), dir.join("Tiny-MoE-Q4_0.gguf")).unwrap();
    std::fs::copy(g.join("qwen2moe-f16.gguf"), dir.join("Tiny-MoE-F16.gguf")).unwrap();
    std::fs::copy(g.join("glm4moe-f16.gguf"), dir.join("mmproj-Tiny-MoE-F16.gguf")).unwrap();
    for i in 1..=3 {
        let part = format!("deepseek2-kv_b-split-{i:05}-of-00003.gguf");
        std::fs::copy(g.join(part), dir.join(format!("Big-Q8_0-{i:05}-of-00003.gguf"))).unwrap();
    }
    std::fs::write(dir.join("README.md"), b"# Tiny-MoE GGUF\n").unwrap();
    dir
}

#[test]
fn pull_of_a_gguf_repository_matches_convert_of_the_file() {
    let home = scratch("gguf");
    let repo = gguf_repo("gguf-src");
    let hub = MockHub::start(&[("acme/Tiny-MoE-GGUF", repo.clone()), ("acme/bad-GGUF", repo.clone())], &home);
    let pull = |args: &[&str]| coli(&home, &hub).arg("pull").args(args).output().unwrap();
    // Several GGUFs: one must be chosen (the projector is not a candidate).
    let out = pull(&["acme/Tiny-MoE-GGUF"]);
    assert_one_error(&out, "holds 3 GGUF files");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("mmproj"));
    assert_one_error(&pull(&["acme/Tiny-MoE-GGUF", "--gguf", "Tiny"]), "matches 2");
    assert_one_error(&pull(&["acme/Tiny-MoE-GGUF", "--gguf", "Q2_K"]), "no GGUF file");

    // A split GGUF: every part downloaded (one resumed after a dropped connection) and
    // checked, the result what `coli convert` of the first part makes; a repository that
    // lacks a part is refused before anything is downloaded.
    hub.faults.lock().unwrap().drop_once.insert("Big-Q8_0-00002-of-00003.gguf".into());
    let out = ok(pull(&["acme/Tiny-MoE-GGUF", "--gguf", "Big"]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("(part 3 of 3)"));
    let local = scratch("gguf-split-ref");
    for i in 1..=3 {
        let part = format!("Big-Q8_0-{i:05}-of-00003.gguf");
        std::fs::copy(repo.join(&part), local.join(&part)).unwrap();
    }
    assert_same_dir(
        &home.join("acme/Tiny-MoE-GGUF"),
        &converted(&local.join("Big-Q8_0-00001-of-00003.gguf"), "gguf-split-out"),
    );
    let reqs = hub.requests();
    let resumed = reqs.iter().any(|r| r.contains("Big-Q8_0-00002-of-00003.gguf bytes=") && !r.contains("bytes=0-"));
    assert!(resumed, "no resumed Range request for part 2: {reqs:#?}");
    ok(coli(&home, &hub).args(["rm", "acme/Tiny-MoE-GGUF", "--yes"]).output().unwrap());
    let gap = scratch("gguf-gap").join("repo");
    std::fs::create_dir_all(&gap).unwrap();
    for i in 1..=2 {
        let part = format!("Big-Q8_0-{i:05}-of-00003.gguf");
        std::fs::copy(repo.join(&part), gap.join(&part)).unwrap();
    }
    let gap_hub = MockHub::start(&[("acme/gap-GGUF", gap)], &home);
    let before = gap_hub.requests().len();
    let out = coli(&home, &gap_hub).args(["pull", "acme/gap-GGUF"]).output().unwrap();
    assert_one_error(&out, "lacks part 3 of 3");
    assert!(!gap_hub.requests()[before..].iter().any(|r| r.contains("/cdn/")), "a part was downloaded");

    // By quant tag, through a redirect to the CDN, resuming after a dropped connection.
    hub.faults.lock().unwrap().drop_once.insert("Tiny-MoE-Q4_0.gguf".into());
    let out = ok(pull(&["acme/Tiny-MoE-GGUF", "--gguf", "q4_0"]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("installed acme/Tiny-MoE-GGUF"));
    let want = scratch("gguf-ref").join("Tiny-MoE-Q4_0.gguf");
    std::fs::copy(repo.join("Tiny-MoE-Q4_0.gguf"), &want).unwrap();
    assert_same_dir(&home.join("acme/Tiny-MoE-GGUF"), &converted(&want, "gguf-ref-out"));
    assert!(!home.join(".pull").exists(), "the staging directory (and the GGUF) is removed");
    let reqs = hub.requests();
    let resumed = reqs
        .iter()
        .any(|r| r.starts_with("GET /cdn/acme/Tiny-MoE-GGUF/Tiny-MoE-Q4_0.gguf bytes=") && !r.contains("bytes=0-"));
    assert!(resumed, "no resumed Range request after the dropped connection: {reqs:#?}");
    assert!(reqs.iter().filter(|r| r.contains("/cdn/")).all(|r| r.ends_with("auth=")), "the token went to the CDN");
    let list = ok(coli(&home, &hub).args(["list", "--json"]).output().unwrap());
    let v: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(
        (v["models"][0]["id"].as_str(), v["models"][0]["family"].as_str()),
        (Some("acme/Tiny-MoE-GGUF"), Some("qwen3_moe"))
    );

    // --quant converts as `coli convert --quant` would; a wrong checksum is never converted.
    let out = ok(pull(&["acme/Tiny-MoE-GGUF", "--gguf", "Tiny-MoE-F16.gguf", "--quant", "int8", "--force"]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("installed"));
    let want = scratch("gguf-ref8").join("Tiny-MoE-F16.gguf");
    std::fs::copy(repo.join("Tiny-MoE-F16.gguf"), &want).unwrap();
    let out8 = scratch("gguf-ref8-out").join("model");
    ok(Command::new(env!("CARGO_BIN_EXE_coli"))
        .arg("convert")
        .arg(&want)
        .arg("-o")
        .arg(&out8)
        .args(["--quant", "int8"])
        .output()
        .unwrap());
    assert_same_dir(&home.join("acme/Tiny-MoE-GGUF"), &out8);
    hub.faults.lock().unwrap().wrong_sha.insert("Tiny-MoE-F16.gguf".into());
    assert_one_error(&pull(&["acme/bad-GGUF", "--gguf", "F16"]), "sha256");
    assert!(!home.join(".pull/acme--bad-GGUF@main/out").exists(), "a corrupted GGUF was converted");
    assert!(!home.join("acme/bad-GGUF").exists());
}

fn plan_json(home: &Path, hub: &MockHub, model: &str) -> serde_json::Value {
    let out = ok(coli(home, hub).args(["plan", model, "--json", "--probe-bytes", "4M"]).output().unwrap());
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn plan_reads_only_config_and_index_and_estimates_what_pull_installs() {
    let home = scratch("plan");
    let hub = MockHub::start(&[("acme/sharded", sharded_checkpoint("plan-src"))], &home);
    let before = plan_json(&home, &hub, "acme/sharded");
    let reqs = hub.requests();
    assert!(
        reqs.iter().all(|r| r.contains("/config.json ") || r.contains("/model.safetensors.index.json ")),
        "plan read more than the config and the index: {reqs:?}"
    );
    assert_eq!(before["source"], "hub");
    assert_eq!(before["estimated_sizes"], true);
    assert!(before["machine"]["disk_read_bytes_per_second"].as_f64().unwrap() > 0.0, "{before}");
    assert!(before["machine"]["cpu_int4_matvec_bytes_per_second"].as_f64().unwrap() > 0.0);
    assert!(before["estimate"]["warm_tokens_per_second"].as_f64().unwrap() > 0.0);

    ok(coli(&home, &hub).args(["pull", "acme/sharded"]).output().unwrap());
    let after = plan_json(&home, &hub, "acme/sharded");
    assert_eq!(after["source"], "converted");
    assert_eq!(after["estimated_sizes"], false);
    // The estimate is the installed model's: experts to the byte, dense weights closely.
    assert_eq!(before["expert_bytes"], after["expert_bytes"], "{before}\n{after}");
    assert_eq!(before["streamed_bytes"], after["streamed_bytes"]);
    let (est, real) = (before["resident_bytes"].as_f64().unwrap(), after["resident_bytes"].as_f64().unwrap());
    assert!((est - real).abs() / real < 0.1, "resident estimate {est} vs installed {real}");
    // The --ram and --pin of the native commands: with --ram given, the pin is 0 until
    // usage is learned, and a --pin beyond --ram is cut to it.
    let fixed = ok(coli(&home, &hub)
        .args(["plan", "acme/sharded", "--json", "--probe-bytes", "0", "--ram", "1M", "--pin", "2M"])
        .output()
        .unwrap());
    let fixed: serde_json::Value = serde_json::from_slice(&fixed.stdout).unwrap();
    assert_eq!(fixed["ram"], 1 << 20);
    assert_eq!(fixed["pin"], 1 << 20);
    assert!(fixed["machine"]["disk_read_bytes_per_second"].is_null());

    let missing = coli(&home, &hub).args(["plan", "acme/nope"]).output().unwrap();
    assert_one_error(&missing, "acme/nope");
}

#[test]
fn the_readme_table_is_what_plan_says() {
    let home = scratch("readme");
    let cfgs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/hub-configs");
    let repos = [
        ("allenai/OLMoE-1B-7B-0924", "olmoe-1b-7b"),
        ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
        ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
        ("Qwen/Qwen3.5-35B-A3B", "qwen3.5-35b-a3b"),
        ("deepseek-ai/DeepSeek-V3.2-Exp", "deepseek-v3.2-exp"),
        ("zai-org/GLM-5", "glm-5"),
        ("moonshotai/Kimi-K2-Instruct", "kimi-k2-instruct"),
        ("deepseek-ai/DeepSeek-V4-Flash-Base", "deepseek-v4-flash-base"),
    ];
    let served: Vec<(&str, PathBuf)> = repos.iter().map(|(r, d)| (*r, cfgs.join(d))).collect();
    let hub = MockHub::start(&served, &home);
    let readme = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let gib = |b: &serde_json::Value| format!("{:.1} GiB", b.as_u64().unwrap() as f64 / (1u64 << 30) as f64);
    for (repo, _) in repos {
        let out = ok(coli(&home, &hub).args(["plan", repo, "--json", "--probe-bytes", "0"]).output().unwrap());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let container =
            serde_json::json!(v["resident_bytes"].as_u64().unwrap() + v["streamed_bytes"].as_u64().unwrap());
        let per_token =
            format!("{:.2} GiB", v["experts_per_token_bytes"].as_u64().unwrap() as f64 / (1u64 << 30) as f64);
        let per_token = if per_token.starts_with("0.") { per_token } else { gib(&v["experts_per_token_bytes"]) };
        let row = format!(
            "| {repo} | {} | {} | {} | {} (top-{} of {}, {} layers) | {} + one source shard |",
            v["model_type"].as_str().unwrap(),
            gib(&v["resident_bytes"]),
            gib(&v["streamed_bytes"]),
            per_token,
            v["top_k"],
            v["experts_per_layer"],
            v["moe_layers"],
            gib(&container)
        );
        assert!(readme.contains(&row), "README.md lacks the row\n{row}");
    }
}

/// A connection dropped while reading a shard's safetensors header (the Range read past
/// its length prefix) is read again, as the download loop resumes: the pull succeeds.
#[test]
fn a_connection_dropped_while_reading_a_header_is_retried() {
    let home = scratch("header-drop");
    let hub = MockHub::start(&[("acme/tiny-moe", fixture("qwen3_moe"))], &home);
    hub.faults.lock().unwrap().drop_header_once.insert("model.safetensors".into());
    let out = ok(coli(&home, &hub).args(["pull", "acme/tiny-moe"]).output().unwrap());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("trying again"), "{err}");
    assert_same_dir(&home.join("acme/tiny-moe"), &converted(&fixture("qwen3_moe"), "header-drop-ref"));
    let header_reads =
        hub.requests().iter().filter(|r| r.starts_with("GET /cdn/acme/tiny-moe/model.safetensors bytes=8-")).count();
    assert!(header_reads >= 2, "the header was not read again: {:#?}", hub.requests());
    assert!(hub.faults.lock().unwrap().drop_header_once.is_empty(), "the fault never fired");
}

/// A HEAD answered with a plain 302 (no X-Linked-Size, Content-Length 0) is followed to
/// the answer with the size, for a weights file and a small file alike; the token stays
/// with the hub.
#[test]
fn a_head_answered_with_a_plain_redirect_is_followed() {
    let home = scratch("head-302");
    let hub = MockHub::start(&[("acme/tiny-moe", fixture("qwen3_moe"))], &home);
    for f in ["model.safetensors", "config.json"] {
        hub.faults.lock().unwrap().plain_redirect.insert(f.into());
    }
    ok(coli(&home, &hub).args(["pull", "acme/tiny-moe"]).output().unwrap());
    assert_same_dir(&home.join("acme/tiny-moe"), &converted(&fixture("qwen3_moe"), "head-302-ref"));
    let reqs = hub.requests();
    assert!(reqs.iter().any(|r| r.starts_with("HEAD /cdn/acme/tiny-moe/model.safetensors ")), "{reqs:#?}");
    assert!(reqs.iter().filter(|r| r.contains("/cdn/")).all(|r| r.ends_with("auth=")), "the token went to the CDN");
}

fn files_over(dir: &Path, bytes: u64) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let m = std::fs::symlink_metadata(e.path()).unwrap();
        if m.is_dir() {
            out.extend(files_over(&e.path(), bytes));
        } else if m.len() > bytes {
            out.push(e.path());
        }
    }
    out
}

/// Bytes free at `dir`, as `df` says.
fn df_avail(dir: &Path) -> Option<u64> {
    let out = Command::new("df").args(["-B1", "--output=avail"]).arg(dir).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().nth(1)?.trim().parse().ok()
}

/// An absurd X-Linked-Size (1.1 TB) is refused before anything is written (it left a
/// sparse 1.1 TB placeholder); a size the disk cannot hold is refused by the free space,
/// for a safetensors shard and a GGUF alike.
#[test]
fn sizes_beyond_the_disk_or_any_hub_file_are_refused_before_writing() {
    let home = scratch("huge");
    let gguf = scratch("huge-gguf");
    std::fs::copy(fixture("gguf/qwen3moe-q4_0-q8_0.gguf"), gguf.join("Tiny-Q4_0.gguf")).unwrap();
    let hub = MockHub::start(&[("acme/tiny-moe", fixture("qwen3_moe")), ("acme/gguf", gguf)], &home);
    hub.faults.lock().unwrap().linked_size.insert("model.safetensors".into(), 1_100_000_000_000);
    let out = coli(&home, &hub).args(["pull", "acme/tiny-moe"]).output().unwrap();
    assert_one_error(&out, "more than any file colibri pulls");
    assert_eq!(files_over(&home, 1 << 30), Vec::<PathBuf>::new());
    assert!(!home.join(".pull").exists(), "staging data was written");

    // Just over the free space (when that is below the per-file bound).
    let Some(free) = df_avail(&home) else { return };
    if free + (1 << 30) >= 256 << 30 {
        return;
    }
    hub.faults.lock().unwrap().linked_size.insert("model.safetensors".into(), free + (1 << 30));
    let out = coli(&home, &hub).args(["pull", "acme/tiny-moe"]).output().unwrap();
    assert_one_error(&out, "of free disk");
    assert!(!home.join(".pull").exists(), "staging data was written");
    hub.faults.lock().unwrap().linked_size.insert("Tiny-Q4_0.gguf".into(), free + (1 << 30));
    let out = coli(&home, &hub).args(["pull", "acme/gguf"]).output().unwrap();
    assert_one_error(&out, "of free disk");
    assert!(!home.join(".pull").exists(), "staging data was written");
}

/// A failed pull keeps its staging data for the next run, says so, and `coli list
/// --partial` shows it, `coli list` counts it, `coli rm ID` removes it.
#[test]
fn unfinished_pulls_are_listed_and_removed() {
    let home = scratch("partial");
    let hub = MockHub::start(&[("acme/bad", fixture("olmoe"))], &home);
    hub.faults.lock().unwrap().wrong_sha.insert("model.safetensors".into());
    let out = coli(&home, &hub).args(["pull", "acme/bad"]).output().unwrap();
    assert_one_error(&out, "sha256");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("note: the unfinished pull") && err.contains("coli rm acme/bad"), "{err}");
    let staging = home.join(".pull/acme--bad@main");
    assert!(staging.is_dir());

    let out = ok(coli(&home, &hub).args(["list", "--partial", "--json"]).output().unwrap());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v["partial"][0];
    assert_eq!((p["id"].as_str(), p["revision"].as_str()), (Some("acme/bad"), Some("main")), "{v}");
    assert!(p["bytes"].as_u64().unwrap() > 0, "{v}");
    let out = ok(coli(&home, &hub).args(["list", "--json"]).output().unwrap());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["models"].as_array().map(Vec::len), Some(0));
    assert_eq!(v["partial"][0]["id"], "acme/bad");
    let text = String::from_utf8(ok(coli(&home, &hub).arg("list").output().unwrap()).stdout).unwrap();
    assert!(text.contains("1 unfinished pull(s)") && text.contains("coli list --partial"), "{text}");
    let text = String::from_utf8(ok(coli(&home, &hub).args(["list", "--partial"]).output().unwrap()).stdout).unwrap();
    assert!(text.contains("acme/bad") && text.contains("main"), "{text}");

    let out = ok(coli(&home, &hub).args(["rm", "acme/bad", "--yes"]).output().unwrap());
    assert!(String::from_utf8_lossy(&out.stderr).contains("removed acme/bad: 1 unfinished pull(s)"));
    assert!(!staging.exists() && !home.join(".pull").exists());
    let out = coli(&home, &hub).args(["rm", "acme/bad", "--yes"]).output().unwrap();
    assert_one_error(&out, "no installed model");
}

/// An FP8 fixture in two shards: every e4m3 weight (and DeepSeek-V4's FP4 expert) in the
/// first, every scale and the rest in the second, with an index (a weight's scale in
/// another shard than itself).
fn fp8_two_shards(name: &str, tag: &str) -> PathBuf {
    let (src, dir) = (fixture(name), scratch(tag).join("ckpt"));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let raw = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&raw[8..8 + n]).unwrap();
    let (mut shards, mut map) = ([serde_json::Map::new(), serde_json::Map::new()], serde_json::Map::new());
    let mut data = [Vec::new(), Vec::new()];
    for (k, mut v) in header.into_iter().filter(|(k, _)| k != "__metadata__") {
        let o: Vec<usize> =
            v["data_offsets"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        let s = usize::from(v["dtype"] != "F8_E4M3" && v["dtype"] != "I8");
        v["data_offsets"] = serde_json::json!([data[s].len(), data[s].len() + o[1] - o[0]]);
        data[s].extend_from_slice(&raw[8 + n + o[0]..8 + n + o[1]]);
        map.insert(k.clone(), format!("model-0000{}-of-00002.safetensors", s + 1).into());
        shards[s].insert(k, v);
    }
    for s in 0..2 {
        let h = serde_json::to_vec(&shards[s]).unwrap();
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend(h);
        out.extend(&data[s]);
        std::fs::write(dir.join(format!("model-0000{}-of-00002.safetensors", s + 1)), out).unwrap();
    }
    let total = data[0].len() + data[1].len();
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    dir
}

/// An FP8 repository is pulled as it is (FP8 kept, as `coli convert` keeps it; DeepSeek-V4's
/// release with its FP4 experts as MXFP4), each weight waiting for the shard of its scale.
#[test]
fn pull_of_an_fp8_repository_keeps_fp8() {
    for (name, experts) in [("deepseek_v3_fp8", "fp8"), ("deepseek_v4_fp8", "mxfp4")] {
        pull_keeps(name, experts);
    }
}

fn pull_keeps(name: &str, experts: &str) {
    let home = scratch(&format!("{name}-pull"));
    let ckpt = fp8_two_shards(name, &format!("{name}-src"));
    let hub = MockHub::start(&[("acme/fp8", ckpt.clone())], &home);
    ok(coli(&home, &hub).args(["pull", "acme/fp8"]).output().unwrap());
    assert_same_dir(&home.join("acme/fp8"), &converted(&ckpt, &format!("{name}-ref")));
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(home.join("acme/fp8/colibri.json")).unwrap()).unwrap();
    assert_eq!(
        (&m["quant"]["default"], &m["experts"]["layers"][0]["parts"][0]["dtype"]),
        (&"fp8".into(), &experts.into())
    );
    // The same model as the single-file fixture read directly.
    let logits = |model: &Path, out: &Path| {
        ok(Command::new(env!("CARGO_BIN_EXE_coli"))
            .args(["logits", "--model"])
            .arg(model)
            .args(["--ids", "5,17,3,99,250", "--out"])
            .arg(out)
            .output()
            .unwrap());
        std::fs::read(out).unwrap()
    };
    let want = logits(&fixture(name), &home.join("want.bin"));
    assert!(logits(&home.join("acme/fp8"), &home.join("got.bin")) == want);
}
