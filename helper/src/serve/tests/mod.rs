//! Tests of the helper over real loopback sockets: a server on 127.0.0.1:0 in its own
//! runtime thread, and the raw client of [`super::client`] (which can also send hostile
//! requests). Models are scratch copies of the committed fixtures.

mod api;
mod batch;
mod cancel;
mod context;
mod hostile;
mod kv;
mod logprobs;
mod mtp;
mod ollama;
mod ranges;
mod recurrent;
mod sampling;
mod security;
mod speculation;
mod structured;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::client::{self, Conn, Response};
use super::{AppState, ServeArgs};

/// The model every test serves: a copy of tests/fixtures/olmoe plus a data file.
pub const MODEL: &str = "olmoe";
/// A file with known bytes inside the model directory.
pub const DATA: &str = "experts.bin";
pub const DATA_LEN: usize = 3 * 1024 * 1024 + 123;

pub fn data_bytes() -> Vec<u8> {
    (0..DATA_LEN).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    pub dir: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl TestServer {
    pub fn model_dir(&self) -> PathBuf {
        self.dir.join("models").join(MODEL)
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        client::request(self.addr, "GET", path, headers, b"").expect("request")
    }

    pub fn post(&self, path: &str, body: &str) -> Response {
        client::request(self.addr, "POST", path, &[("Content-Type", "application/json")], body.as_bytes())
            .expect("request")
    }

    /// Sends raw bytes on a new connection and reads one response.
    pub fn raw(&self, raw: &str) -> Response {
        let mut c = Conn::open(self.addr).expect("connect");
        c.send_raw(raw.as_bytes()).expect("send");
        c.read_response(false).expect("response")
    }

    pub fn health(&self) -> serde_json::Value {
        self.get("/health", &[]).json()
    }

    pub fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> anyhow::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| anyhow::anyhow!("server thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
        }
    }
}

/// Starts a server over a scratch models directory; `tweak` adjusts the options.
pub fn start(tag: &str, tweak: impl FnOnce(&mut ServeArgs)) -> TestServer {
    start_with(tag, tweak, |_| {}, |_| {})
}

/// [`start`], also adjusting the server's limits, and preparing the scratch directory
/// (`prepare(dir)`, with `dir/models/olmoe` in place) before the server starts.
pub fn start_with(
    tag: &str,
    tweak: impl FnOnce(&mut ServeArgs),
    limits: impl FnOnce(&mut super::Limits),
    prepare: impl FnOnce(&Path),
) -> TestServer {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("coli-serve-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let model = dir.join("models").join(MODEL);
    copy_dir(&fixture(MODEL), &model);
    std::fs::write(model.join(DATA), data_bytes()).unwrap();
    std::fs::write(model.join("empty.bin"), b"").unwrap();
    std::fs::create_dir_all(model.join("sub")).unwrap();
    std::fs::write(model.join("sub/inner.json"), b"{\"inner\": true}").unwrap();
    std::fs::write(dir.join("secret.txt"), b"TOP-SECRET").unwrap();
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(dir.join("secret.txt"), model.join("escape.txt")).unwrap();
        std::os::unix::fs::symlink(model.join(DATA), model.join("alias.bin")).unwrap();
    }
    prepare(&dir);
    let mut args = ServeArgs { port: 0, max_queue: 8, models_dir: Some(dir.join("models")), ..Default::default() };
    tweak(&mut args);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut bound = rt.block_on(super::bind_with(&args, Some(dir.join("data")))).expect("bind");
    limits(&mut Arc::get_mut(&mut bound.state).expect("the state is not shared yet").limits);
    let (addr, state) = (bound.addr, bound.state.clone());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        rt.block_on(super::run(bound, async {
            let _ = rx.await;
        }))
    });
    TestServer { addr, state, dir, stop: Some(tx), thread: Some(thread) }
}

#[test]
fn health_and_model_list() {
    let s = start("health", |_| {});
    let h = s.get("/health", &[]);
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "ok");
    let m = s.get("/api/models", &[]).json();
    let olmoe = m["data"].as_array().unwrap().iter().find(|d| d["id"] == MODEL).expect("the model is listed");
    assert_eq!(olmoe["id"], MODEL);
    assert_eq!(olmoe["model_type"], "olmoe");
    assert_eq!(olmoe["n_layers"], 2);
    assert_eq!(olmoe["n_experts"], 24);
    let files: Vec<&str> = olmoe["files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert!(
        files.contains(&"model.safetensors") && files.contains(&DATA) && files.contains(&"sub/inner.json"),
        "{files:?}"
    );
    assert!(!files.contains(&"escape.txt"), "a symlink out of the model is not listed");
    let size = olmoe["files"].as_array().unwrap().iter().find(|f| f["path"] == DATA).unwrap()["size"].as_u64();
    assert_eq!(size, Some(DATA_LEN as u64));
    // The web app (or, in a build without web/index.html, a page listing the models).
    let page = s.get("/", &[]);
    assert_eq!(page.status, 200);
    assert!(page.header("content-type").unwrap().starts_with("text/html"));
    assert!(page.text().contains("colibri"));
    assert_eq!(s.get("/no-such-asset.js", &[]).status, 404);
    s.stop().unwrap();
}

#[test]
fn oneshot_without_a_socket() {
    use tower::ServiceExt;
    let s = start("oneshot", |_| {});
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let port = s.addr.port();
    let resp = rt.block_on(async {
        let req = axum::http::Request::get("/health")
            .header("host", format!("localhost:{port}"))
            .body(axum::body::Body::empty())
            .unwrap();
        super::app(s.state.clone()).oneshot(req).await.unwrap()
    });
    assert_eq!(resp.status(), 200);
}

#[test]
fn usage_reports_merge_into_the_usage_file() {
    let s = start("usage", |_| {});
    let r = s.post("/api/usage", r#"{"model": "olmoe", "counts": [[0, 1, 5], [1, 23, 2], [0, 1, 1]]}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["total"], 8);
    let r = s.post("/api/usage", r#"{"model": "olmoe", "counts": [[0, 1, 4]]}"#);
    assert_eq!(r.json()["total"], 12);
    let file = s.model_dir().join("usage.json");
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(saved["counts"], serde_json::json!([[0, 1, 10], [1, 23, 2]]));
    assert_eq!(saved["n_layers"], 2);
    assert_eq!(s.get("/api/usage/olmoe", &[]).json()["counts"], saved["counts"]);
    // The usage file is not a model file.
    assert_eq!(s.get("/models/olmoe/usage.json", &[]).status, 404);
    // Out of bounds, malformed, unknown model: refused, nothing changes.
    for (body, status) in [
        (r#"{"model": "olmoe", "counts": [[2, 0, 1]]}"#, 400),
        (r#"{"model": "olmoe", "counts": [[0, 24, 1]]}"#, 400),
        (r#"{"model": "olmoe", "counts": [[0, -1, 1]]}"#, 400),
        (r#"{"model": "olmoe", "counts": "lots"}"#, 400),
        (r#"{"model": "olmoe""#, 400),
        (r#"{"model": "nope", "counts": []}"#, 404),
    ] {
        let r = s.post("/api/usage", body);
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert!(r.json()["error"]["message"].is_string(), "{}", r.text());
    }
    let again: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(again["total"], 12);
}

#[cfg(unix)]
#[test]
fn usage_of_a_read_only_model_goes_to_the_data_dir() {
    use std::os::unix::fs::PermissionsExt;
    let s = start("usage-ro", |_| {});
    let dir = s.model_dir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    // Root ignores permissions; only check the fallback where it applies.
    let writable = std::fs::write(dir.join("probe"), b"").is_ok();
    let _ = std::fs::remove_file(dir.join("probe"));
    let r = s.post("/api/usage", r#"{"model": "olmoe", "counts": [[1, 2, 3]]}"#);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    if !writable {
        assert!(s.dir.join("data/usage/olmoe.json").is_file());
        assert!(!dir.join("usage.json").exists());
    }
    assert_eq!(s.get("/api/usage/olmoe", &[]).json()["total"], 3);
}
