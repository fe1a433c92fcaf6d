//! The localhost helper's HTTP server (started by `coli serve` / `coli web`, see
//! crate::commands::serve). It streams model files (experts) to the browser over HTTP
//! Range, records which experts the browser used, serves the web app, and answers the
//! OpenAI API from the native engine. The HTTP API is documented in
//! docs/api.md; the access rules are in [`security`].
//!
//! Server plumbing: hyper's HTTP/1 connection driver with a header size limit and a
//! header read timeout, a cap on open connections, per-request timeouts and body limits,
//! and a graceful shutdown on Ctrl-C / SIGTERM that stops accepting, cancels running
//! generations and waits briefly for open responses.

pub mod client;
pub(crate) mod files;
mod generation;
mod isolation;
pub(crate) mod models;
mod openai;
mod page;
mod range;
pub mod security;
#[cfg(test)]
mod tests;
pub(crate) mod usage;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use clap::Args;
use serde_json::json;
use tokio::net::TcpListener;

pub use models::Registry;
use security::AccessPolicy;

/// Options of `coli serve` (and `coli web`, `coli service install`).
#[derive(Args, Clone, Debug, Default)]
pub struct ServeArgs {
    /// Address to listen on. Default 127.0.0.1; anything but loopback exposes the helper to
    /// the network and must be asked for explicitly.
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 7878)]
    pub port: u16,
    /// A model to serve: a directory, or the id of an installed model. Repeatable.
    #[arg(long = "model")]
    pub models: Vec<PathBuf>,
    /// Directory of installed models (default: $XDG_DATA_HOME/colibri/models).
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    /// A web origin (e.g. https://example.com) whose pages may call the helper (CORS,
    /// Private Network Access). Exact match; repeatable.
    #[arg(long = "allow-origin")]
    pub allow_origins: Vec<String>,
    /// An extra host name accepted in the Host header besides localhost, 127.0.0.1 and
    /// [::1]. Repeatable.
    #[arg(long = "allow-host")]
    pub allow_hosts: Vec<String>,
    /// Generations admitted per model at once (one runs, the rest wait); more get 503.
    #[arg(long, default_value_t = 8)]
    pub max_queue: usize,
    /// CPU threads for the native engine (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Expert-cache budget in bytes of the native engine for converted models (K, M, G
    /// suffixes; default: no limit).
    #[arg(long, value_parser = crate::flags::parse_bytes)]
    pub ram: Option<u64>,
}

/// Limits of the server; the defaults suit one user's machine.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    /// Time to produce a response head, for everything but generations.
    pub request_timeout: Duration,
    /// Time to produce a response head (non-streamed: the whole answer) for /v1.
    pub generation_timeout: Duration,
    pub header_read_timeout: Duration,
    /// Request line and headers together (more: 431).
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            request_timeout: Duration::from_secs(30),
            generation_timeout: Duration::from_secs(600),
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 64 * 1024,
        }
    }
}

/// Counters shown by `/health`.
#[derive(Default)]
pub struct Stats {
    pub requests: AtomicU64,
    pub refused: AtomicU64,
    pub connections: AtomicUsize,
    pub file_bytes: AtomicU64,
    pub generations_started: AtomicU64,
    pub generations_finished: AtomicU64,
    pub generations_cancelled: AtomicU64,
    pub generations_active: AtomicUsize,
    pub tokens_generated: AtomicU64,
}

pub struct AppState {
    pub registry: Registry,
    pub policy: AccessPolicy,
    pub limits: Limits,
    /// `<data dir>`: usage files of read-only models go to its `usage/`.
    pub data_dir: Option<PathBuf>,
    pub stats: Arc<Stats>,
    engines: generation::Engines,
    /// Set on shutdown; running generations stop at their next token.
    pub shutdown: Arc<AtomicBool>,
    started: Instant,
}

impl AppState {
    pub fn new(
        registry: Registry,
        policy: AccessPolicy,
        data_dir: Option<PathBuf>,
        max_queue: usize,
        ram: Option<u64>,
    ) -> Self {
        AppState {
            registry,
            policy,
            limits: Limits::default(),
            data_dir,
            stats: Arc::new(Stats::default()),
            engines: generation::Engines::new(max_queue, ram),
            shutdown: Arc::new(AtomicBool::new(false)),
            started: Instant::now(),
        }
    }
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let s = &state.stats;
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    axum::Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": state.started.elapsed().as_secs(),
        "requests": n(&s.requests),
        "refused": n(&s.refused),
        "connections": s.connections.load(Ordering::Relaxed),
        "file_bytes_sent": n(&s.file_bytes),
        "generations": {
            "started": n(&s.generations_started),
            "finished": n(&s.generations_finished),
            "cancelled": n(&s.generations_cancelled),
            "active": s.generations_active.load(Ordering::Relaxed),
            "tokens": n(&s.tokens_generated),
        },
    }))
    .into_response()
}

async fn api_models(State(state): State<Arc<AppState>>) -> Response {
    let s = state.clone();
    let list =
        tokio::task::spawn_blocking(move || s.registry.list().iter().map(models::describe).collect::<Vec<_>>()).await;
    match list {
        Ok(data) => axum::Json(json!({"object": "list", "data": data})).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Outermost layer: counts and logs every request, and bounds the time to a response head.
async fn log_and_limit(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    state.stats.requests.fetch_add(1, Ordering::Relaxed);
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let range = req.headers().contains_key(axum::http::header::RANGE);
    let limit = if path.starts_with("/v1/") { state.limits.generation_timeout } else { state.limits.request_timeout };
    let start = Instant::now();
    let resp = match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "timed out\n").into_response(),
    };
    tracing::info!(%method, %path, range, status = resp.status().as_u16(), ms = start.elapsed().as_secs_f64() * 1e3, "request");
    resp
}

/// The whole HTTP API; tests drive it with `tower::ServiceExt::oneshot` or a socket.
pub fn app(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/models", get(openai::list_models))
        .route("/chat/completions", post(openai::chat_completions))
        .route("/completions", post(openai::completions))
        .fallback(openai::not_found)
        .layer(DefaultBodyLimit::max(openai::MAX_BODY));
    Router::new()
        .route("/", get(page::index))
        .route("/health", get(health))
        .route("/api/models", get(api_models))
        .route("/api/usage", post(usage::post_usage).layer(DefaultBodyLimit::max(usage::MAX_USAGE_BODY)))
        .route("/api/usage/{*id}", get(usage::get_usage))
        .route("/models/{id}/{*path}", get(files::get_file))
        .route("/{name}", get(page::asset))
        .route("/pkg/{*path}", get(page::pkg_asset))
        .route("/pkg-threads/{*path}", get(page::pkg_threads_asset))
        .nest("/v1", v1)
        .layer(middleware::from_fn_with_state(state.clone(), security::guard))
        .layer(middleware::from_fn(isolation::headers))
        .layer(middleware::from_fn_with_state(state.clone(), log_and_limit))
        .with_state(state)
}

/// A bound, not yet running server.
pub struct Bound {
    pub listener: TcpListener,
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
}

/// Resolves the models, binds the socket and builds the state. A non-loopback host must
/// be asked for with `--host`.
pub async fn bind(a: &ServeArgs) -> Result<Bound> {
    bind_with(a, crate::paths::data_dir()).await
}

/// [`bind`] with another data directory (usage files of read-only models go to its `usage/`).
pub async fn bind_with(a: &ServeArgs, data_dir: Option<PathBuf>) -> Result<Bound> {
    let host = a.host.clone().unwrap_or_else(|| "127.0.0.1".to_string());
    if !security::is_loopback_host(&host) {
        if a.host.is_none() {
            bail!("refusing to listen on {host}: not a loopback address");
        }
        tracing::warn!("listening on {host}: other machines on the network can reach this helper");
        eprintln!("warning: listening on {host}; other machines on the network can reach this helper");
    }
    let models_dir = a.models_dir.clone().or_else(crate::paths::models_dir);
    let mut dirs = Vec::new();
    for m in &a.models {
        dirs.push(crate::paths::resolve_model(m, models_dir.as_deref())?);
    }
    if a.models.is_empty() && crate::paths::builtin_demo().join("config.json").is_file() {
        // A source checkout serves its built-in demo model unless one is installed.
        let installed = models_dir.as_ref().is_some_and(|d| d.join("demo/config.json").is_file());
        if !installed {
            dirs.push(crate::paths::builtin_demo());
        }
    }
    let registry = Registry::new(&dirs, models_dir)?;
    let bind_host = host.trim_start_matches('[').trim_end_matches(']');
    let listener =
        TcpListener::bind((bind_host, a.port)).await.with_context(|| format!("cannot listen on {host}:{}", a.port))?;
    let addr = listener.local_addr()?;
    let mut hosts = a.allow_hosts.clone();
    if a.host.is_some() && !bind_host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_unspecified()) {
        hosts.push(host.clone());
    }
    let policy = AccessPolicy::new(addr.port(), &hosts, &a.allow_origins);
    let state = Arc::new(AppState::new(registry, policy, data_dir, a.max_queue, a.ram));
    Ok(Bound { listener, addr, state })
}

/// Serves until `shutdown` resolves, then stops accepting, cancels generations and waits
/// up to 5 s for open connections.
pub async fn run(bound: Bound, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let Bound { listener, state, .. } = bound;
    let router = app(state.clone());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let conn_limit = Arc::new(tokio::sync::Semaphore::new(state.limits.max_connections));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(state.limits.header_read_timeout)
        .max_header_size(state.limits.max_header_bytes);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = conn_limit.clone().acquire_owned() => p?,
            _ = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(v) => v,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(router.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), svc));
        let st = state.clone();
        st.stats.connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, "connection ended: {e}");
            }
            st.stats.connections.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
    drop(listener);
    state.shutdown.store(true, Ordering::Relaxed);
    tracing::info!("shutting down: waiting for open connections");
    if tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await.is_err() {
        tracing::warn!("some connections did not close in time");
    }
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
