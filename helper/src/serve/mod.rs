//! The localhost helper's HTTP server (started by `coli serve` / `coli web`, see
//! crate::commands::serve). It streams model files (experts) to the browser over HTTP
//! Range, records which experts the browser used, serves the web app, and answers the
//! OpenAI API from the native engine. The HTTP API is documented in
//! docs/api.md; the access rules are in [`security`].
//!
//! Server plumbing: hyper's HTTP/1 connection driver with a header size limit and a
//! header read timeout, a write timeout on every connection (tokio-io-timeout), a cap on
//! open connections, per-request timeouts and body limits,
//! and a graceful shutdown on Ctrl-C / SIGTERM that stops accepting, cancels running
//! generations and waits briefly for open responses.

mod api_error;
mod batch;
mod choose;
pub mod client;
mod connections;
pub(crate) mod files;
mod generation;
mod isolation;
mod metrics;
pub(crate) mod models;
pub(crate) mod ollama;
mod openai;
mod page;
mod range;
pub mod security;
mod structured;
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
pub use page::embedded_engine;
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
    /// Generations admitted per model at once (running or waiting); more get 503 with
    /// Retry-After.
    #[arg(long, default_value_t = DEFAULT_MAX_QUEUE)]
    pub max_queue: usize,
    /// Generations running together per model, in one batch (continuous batching: each
    /// advances one token per engine step, and a MoE layer reads each expert once for the
    /// whole batch). A generation joins while the running conversations' caches fit the
    /// --kv-cache budget; one always runs. Default 4.
    #[arg(long, value_name = "N")]
    pub parallel: Option<usize>,
    /// CPU threads for the native engine (default: the physical cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Expert-cache budget in bytes of the native engine for converted models (K, M, G
    /// suffixes; "all": no limit; default: automatic, as `coli generate --help` says, from
    /// the tightest of MemAvailable and the memory cgroup's limit).
    #[arg(long, value_parser = crate::flags::parse_bytes)]
    pub ram: Option<u64>,
    /// Conversation caches kept per model, in memory and on disk under `<data dir>/kv/`,
    /// for requests that extend an earlier conversation (K, M, G suffixes; default 1G, at
    /// most an eighth of the memory the process may take; 0 keeps none).
    #[arg(long, value_parser = crate::flags::parse_bytes)]
    pub kv_cache: Option<u64>,
    /// Speculative decoding of the API's generations: up to N draft tokens per step from
    /// prompt lookup (or --draft), checked in one forward pass. The output is the same as
    /// without (greedy and sampled); 0 (the default) is off.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub speculate: usize,
    /// Drafts from this smaller model of the same tokenizer (a directory or an installed
    /// id), --speculate N per step (4 if not given), for the served models whose tokenizer
    /// it shares (the others use prompt lookup); `mtp`: from each model's own MTP layer
    /// (1 per step if not given; models without one use prompt lookup).
    #[arg(long, value_name = "DIR|mtp")]
    pub draft: Option<PathBuf>,
}

/// Generations admitted per model by default (`--max-queue`): running or waiting.
pub const DEFAULT_MAX_QUEUE: usize = 32;

/// Limits of the server; the defaults suit one user's machine (docs/api.md, "Limits").
#[derive(Clone, Debug)]
pub struct Limits {
    /// Open connections. When all are taken, a new connection closes the one idle longest
    /// (see [`connections`]), so that clients holding connections cannot lock everyone
    /// else out; when every one has a response in progress, the newcomer gets a 503.
    pub max_connections: usize,
    /// Open connections from one IP address; a newer one closes that client's connection
    /// idle longest, or gets a 503 when all of them have a response in progress.
    pub max_connections_per_client: usize,
    /// How long an evicted (idle) connection may take to close; one whose request arrived
    /// meanwhile finishes its response.
    pub evict_grace: Duration,
    /// Time to receive a whole request body (a body that trickles in is cut off: 408).
    pub body_timeout: Duration,
    /// Longest time a response may stall because the client takes none of its bytes;
    /// then the connection is closed (and a generation streaming to it cancelled).
    pub write_timeout: Duration,
    /// Time to produce a response head, for everything but generations.
    pub request_timeout: Duration,
    /// Time to produce a response head (non-streamed: the whole answer) for /v1.
    pub generation_timeout: Duration,
    /// Time one grammar (response_format, tools, grammar) may take to compile; past it
    /// the request gets a 400 naming the limit and the compilation is cancelled. 10 s:
    /// twenty times the slowest compile within the grammar limits measured in a debug
    /// build (0.48 s, a schema of 4,004 properties; a 4,000-alternative Lark grammar took
    /// 0.17 s), so only a grammar far outside what the limits were sized for meets it.
    pub grammar_compile_timeout: Duration,
    /// Time to receive a request's head; it also bounds how long a kept-alive connection
    /// may sit idle between requests.
    pub header_read_timeout: Duration,
    /// Request line and headers together (more: 431).
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            max_connections_per_client: 128,
            evict_grace: Duration::from_secs(2),
            body_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30),
            generation_timeout: Duration::from_secs(600),
            grammar_compile_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 64 * 1024,
        }
    }
}

/// Prompts prepared (template rendered, text tokenized) at once; see [`AppState`].
pub const PROMPTS_AT_ONCE: usize = 2;

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
    /// Prompt tokens not fed again: their cache was left by an earlier request.
    pub prompt_tokens_cached: AtomicU64,
    /// Speculative decoding (`--speculate`): verifying passes, drafts fed, drafts kept.
    pub spec_forwards: AtomicU64,
    pub spec_drafted: AtomicU64,
    pub spec_accepted: AtomicU64,
    /// The engine's passes (continuous batching): passes, the generations and positions
    /// they fed, and their time split by phase (a pass that fed any prompt chunk counts
    /// as prefill), in microseconds.
    pub passes: AtomicU64,
    pub pass_sequences: AtomicU64,
    pub pass_sequences_max: AtomicUsize,
    /// Generations of a step that ran a pass of their own beside the step's shared one
    /// (a model the batch does not run: DeepSeek-V4; or a shared pass that failed and was
    /// redone one generation at a time).
    pub solo_passes: AtomicU64,
    pub prefill_positions: AtomicU64,
    pub prefill_micros: AtomicU64,
    pub decode_tokens: AtomicU64,
    pub decode_micros: AtomicU64,
}

impl Stats {
    /// One engine pass: `sequences` generations fed `positions` positions in `seconds`
    /// and made `made` tokens; `prefill` when it fed a prompt chunk.
    pub fn record_pass(&self, sequences: usize, positions: usize, made: u64, seconds: f64, prefill: bool) {
        let micros = (seconds * 1e6) as u64;
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.pass_sequences.fetch_add(sequences as u64, Ordering::Relaxed);
        self.pass_sequences_max.fetch_max(sequences, Ordering::Relaxed);
        if prefill {
            self.prefill_positions.fetch_add(positions as u64, Ordering::Relaxed);
            self.prefill_micros.fetch_add(micros, Ordering::Relaxed);
        } else {
            self.decode_tokens.fetch_add(made, Ordering::Relaxed);
            self.decode_micros.fetch_add(micros, Ordering::Relaxed);
        }
    }
}

pub struct AppState {
    pub registry: Registry,
    pub policy: AccessPolicy,
    pub limits: Limits,
    /// `<data dir>`: usage files of read-only models go to its `usage/`.
    pub data_dir: Option<PathBuf>,
    pub stats: Arc<Stats>,
    engines: generation::Engines,
    /// Prompts rendered and tokenized at once (each can take a few hundred MB for a
    /// maximum-size body); more wait their turn.
    prompts: Arc<tokio::sync::Semaphore>,
    /// Set on shutdown; running generations stop at their next token.
    pub shutdown: Arc<AtomicBool>,
    started: Instant,
    /// What `/api/pull` pulls with (`coli serve` sets it; without it, pulls are refused).
    pub puller: std::sync::OnceLock<ollama::Puller>,
}

impl AppState {
    pub fn new(
        registry: Registry,
        policy: AccessPolicy,
        data_dir: Option<PathBuf>,
        max_queue: usize,
        ram: Option<u64>,
        speculation: generation::Speculation,
    ) -> Self {
        let kv_dir = data_dir.as_ref().map(|d| d.join("kv"));
        AppState {
            registry,
            policy,
            limits: Limits::default(),
            data_dir,
            stats: Arc::new(Stats::default()),
            engines: generation::Engines::new(max_queue, ram, speculation, kv_dir),
            prompts: Arc::new(tokio::sync::Semaphore::new(PROMPTS_AT_ONCE)),
            shutdown: Arc::new(AtomicBool::new(false)),
            started: Instant::now(),
            puller: std::sync::OnceLock::new(),
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
            "cached_prompt_tokens": n(&s.prompt_tokens_cached),
            "speculation": {"forwards": n(&s.spec_forwards), "drafted": n(&s.spec_drafted), "accepted": n(&s.spec_accepted)},
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
    let long = path.starts_with("/v1/") || ollama::generates(&path);
    let limit = if long { state.limits.generation_timeout } else { state.limits.request_timeout };
    let start = Instant::now();
    let resp = match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "timed out\n").into_response(),
    };
    tracing::info!(%method, %path, range, status = resp.status().as_u16(), ms = start.elapsed().as_secs_f64() * 1e3, "request");
    resp
}

/// Largest oversized body that is read (and dropped) before its 413 is sent.
const DRAIN_LIMIT: u64 = 16 << 20;

/// Largest body of a route: OpenAI requests, usage reports; nothing else takes one.
fn body_limit(path: &str) -> usize {
    if path.starts_with("/v1/") || ollama::generates(path) {
        openai::MAX_BODY
    } else if path == "/api/usage" {
        usage::MAX_USAGE_BODY
    } else {
        64 * 1024
    }
}

fn json_error(status: StatusCode, message: String) -> Response {
    (
        status,
        axum::Json(
            json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}}),
        ),
    )
        .into_response()
}

/// Reads the request body before any handler runs: a Content-Length over the route's
/// limit is refused without reading a byte (413), a body must arrive whole within
/// `body_timeout` (else 408), and a chunked one is cut off at the limit (413).
async fn read_body(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let limit = body_limit(req.uri().path());
    let declared = req.headers().get(axum::http::header::CONTENT_LENGTH);
    if let Some(v) = declared {
        match v.to_str().ok().and_then(|v| v.parse::<u64>().ok()) {
            Some(n) if n > limit as u64 => {
                let resp = json_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the body is {n} bytes; this endpoint takes at most {limit}"),
                );
                // A modest excess is read and dropped (within the body timeout) so that
                // the client, still sending, gets the 413 rather than a reset connection;
                // anything larger is answered at once and the connection closed.
                if n <= DRAIN_LIMIT {
                    let body = req.into_body();
                    let _ = tokio::time::timeout(
                        state.limits.body_timeout,
                        axum::body::to_bytes(body, DRAIN_LIMIT as usize),
                    )
                    .await;
                }
                return resp;
            }
            Some(_) => {}
            None => return json_error(StatusCode::BAD_REQUEST, "invalid Content-Length".into()),
        }
    }
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(state.limits.body_timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return json_error(StatusCode::PAYLOAD_TOO_LARGE, format!("the body is larger than {limit} bytes"))
        }
        Err(_) => {
            return json_error(
                StatusCode::REQUEST_TIMEOUT,
                format!("the body did not arrive within {} s", state.limits.body_timeout.as_secs()),
            )
        }
    };
    // The request is whole: its connection is busy until the response is over.
    if let Some(a) = parts.extensions.get::<Arc<connections::Activity>>() {
        a.mark();
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

/// The whole HTTP API; tests drive it with `tower::ServiceExt::oneshot` or a socket.
pub fn app(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/models", get(openai::list_models))
        .route("/chat/completions", post(openai::chat_completions))
        .route("/completions", post(openai::completions))
        .route("/choose", post(choose::choose))
        .fallback(api_error::not_found)
        .layer(DefaultBodyLimit::max(openai::MAX_BODY));
    Router::new()
        .route("/", get(page::index))
        .route("/health", get(health))
        .route("/metrics", get(metrics::metrics))
        .route("/api/models", get(api_models))
        .route("/api/usage", post(usage::post_usage).layer(DefaultBodyLimit::max(usage::MAX_USAGE_BODY)))
        .route("/api/usage/{*id}", get(usage::get_usage))
        .route("/models/{id}/{*path}", get(files::get_file))
        .route("/{name}", get(page::asset))
        .route("/pkg/{*path}", get(page::pkg_asset))
        .route("/pkg-threads/{*path}", get(page::pkg_threads_asset))
        .nest("/v1", v1)
        .merge(ollama::routes())
        .layer(middleware::from_fn_with_state(state.clone(), read_body))
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
    for o in &a.allow_origins {
        security::check_origin_arg(o).map_err(anyhow::Error::msg)?;
    }
    let host = a.host.clone().unwrap_or_else(|| "127.0.0.1".to_string());
    if !security::is_loopback_host(&host) {
        if a.host.is_none() {
            bail!("refusing to listen on {host}: not a loopback address");
        }
        tracing::warn!("listening on {host}: other machines on the network can reach this helper");
        eprintln!("warning: listening on {host}; other machines on the network can reach this helper");
    }
    let models_dir = a.models_dir.clone().or_else(crate::paths::models_dir);
    let mtp = a.draft.as_deref().is_some_and(crate::load::is_mtp);
    let draft_dir = a.draft.as_ref().filter(|_| !mtp).map(|d| crate::paths::resolve_model(d, models_dir.as_deref()));
    let draft_dir = draft_dir.transpose().context("--draft")?;
    let mut dirs = Vec::new();
    for m in &a.models {
        dirs.push(crate::paths::resolve_model(m, models_dir.as_deref())?);
    }
    if a.models.is_empty() {
        // The built-in demo model, installed into the models directory on first use (then
        // listed from there), or served from where it could be written.
        match crate::paths::builtin_demo(models_dir.as_deref()) {
            Ok(d) if models_dir.as_ref().is_some_and(|m| d.parent() == Some(m.as_path())) => {}
            Ok(d) => dirs.push(d),
            Err(e) => tracing::warn!("the built-in demo model could not be installed: {e}"),
        }
    }
    let registry = Registry::new(&dirs, models_dir)?;
    // Temporary usage files of writers that were killed mid-write.
    let usage_dirs = registry.list().into_iter().map(|m| m.root).chain(data_dir.as_ref().map(|d| d.join("usage")));
    let cleaned: usize = usage_dirs.map(|d| crate::usage_store::clean_temp_files(&d)).sum();
    if cleaned > 0 {
        tracing::info!("removed {cleaned} temporary usage file(s) left by killed writers");
    }
    let bind_host = host.trim_start_matches('[').trim_end_matches(']');
    let listener =
        TcpListener::bind((bind_host, a.port)).await.with_context(|| format!("cannot listen on {host}:{}", a.port))?;
    let addr = listener.local_addr()?;
    let mut hosts = a.allow_hosts.clone();
    if a.host.is_some() && !bind_host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_unspecified()) {
        hosts.push(host.clone());
    }
    let policy = AccessPolicy::new(addr.port(), &hosts, &a.allow_origins);
    // The draft model is opened now, so that a wrong --draft stops the start-up.
    let draft = match draft_dir {
        Some(dir) => {
            let flags = crate::load::CacheFlags::with_ram(a.ram);
            let l = tokio::task::spawn_blocking(move || crate::load::open_dir(&dir, &flags, true)).await?;
            Some(Arc::new(l.context("--draft")?))
        }
        None => None,
    };
    let max_draft = match (a.speculate, draft.is_some() || mtp) {
        (0, true) => colibri_engine::generate::draft::max_draft(0, mtp),
        (n, _) => n,
    };
    let speculation = generation::Speculation { max_draft, draft, mtp };
    let mut state = AppState::new(registry, policy, data_dir, a.max_queue, a.ram, speculation);
    if let Some(n) = a.parallel {
        if n == 0 {
            anyhow::bail!("--parallel must be at least 1");
        }
        state.engines.parallel = n;
    }
    let kv = a.kv_cache.unwrap_or_else(|| crate::load::auto_kv_bytes(&colibri_engine::memlimit::detect(None)));
    state.engines.kv.bytes = usize::try_from(kv).unwrap_or(usize::MAX);
    let state = Arc::new(state);
    Ok(Bound { listener, addr, state })
}

/// Connections being answered 503 at once; past this they are closed without a word.
const REFUSING_AT_ONCE: usize = 64;

/// Answers a connection there is no room for with a 503 (after reading its request head,
/// within the header timeout), then closes it.
fn refuse_connection(stream: tokio::net::TcpStream, http: &hyper::server::conn::http1::Builder, state: &Arc<AppState>) {
    static REFUSING: AtomicUsize = AtomicUsize::new(0);
    if REFUSING.fetch_add(1, Ordering::AcqRel) >= REFUSING_AT_ONCE {
        REFUSING.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    let svc = hyper::service::service_fn(|_req: Request<hyper::body::Incoming>| async {
        let mut r = json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many connections with a response in progress; try again later".into(),
        );
        r.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
        Ok::<_, std::convert::Infallible>(r)
    });
    let conn = http.serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
    let limit = state.limits.header_read_timeout + Duration::from_secs(1);
    tokio::spawn(async move {
        let _ = tokio::time::timeout(limit, conn).await;
        REFUSING.fetch_sub(1, Ordering::AcqRel);
    });
}

/// Serves until `shutdown` resolves, then stops accepting, cancels generations and waits
/// up to 5 s for open connections.
pub async fn run(bound: Bound, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let Bound { listener, state, .. } = bound;
    let router = app(state.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let table = Arc::new(std::sync::Mutex::new(connections::ConnTable::default()));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(state.limits.header_read_timeout)
        .max_header_size(state.limits.max_header_bytes);
    tokio::pin!(shutdown);
    loop {
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
        let admitted = table.lock().unwrap_or_else(|e| e.into_inner()).admit(peer.ip(), &state.limits);
        let _ = stream.set_nodelay(true);
        let Some((id, conn_state)) = admitted else {
            refuse_connection(stream, &http, &state);
            continue;
        };
        let svc = {
            let (router, conn_state) = (router.clone(), conn_state.clone());
            hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
                use tower::ServiceExt;
                let activity = Arc::new(connections::Activity::new(conn_state.clone()));
                req.extensions_mut().insert(activity.clone());
                let router = router.clone();
                async move {
                    let resp = router.oneshot(req.map(axum::body::Body::new)).await;
                    resp.map(|r| r.map(|b| connections::Tracked::wrap(b, activity)))
                }
            })
        };
        // A client that stops reading must not hold its connection (and a generation
        // streaming to it) forever: a write that makes no progress for write_timeout
        // fails, which ends the connection.
        let mut io = tokio_io_timeout::TimeoutStream::new(stream);
        io.set_write_timeout(Some(state.limits.write_timeout));
        let conn = http.serve_connection(TokioIo::new(Box::pin(io)), svc);
        let (st, table, mut stop) = (state.clone(), table.clone(), stop_rx.clone());
        st.stats.connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            tokio::pin!(conn);
            let ended = tokio::select! {
                r = conn.as_mut() => Ok(r),
                _ = conn_state.evict.notified() => Err(true),
                _ = stop.wait_for(|s| *s) => Err(false),
            };
            let ended = match ended {
                Ok(r) => r,
                Err(evicted) => {
                    // Finish the request in flight, then close. On shutdown a client that
                    // does not take its response in time is cut off; an evicted (idle)
                    // connection whose request arrived meanwhile finishes its response.
                    conn.as_mut().graceful_shutdown();
                    loop {
                        match tokio::time::timeout(st.limits.evict_grace, conn.as_mut()).await {
                            Ok(r) => break r,
                            Err(_) if evicted && conn_state.is_active() && !*stop.borrow() => continue,
                            Err(_) => break Ok(()),
                        }
                    }
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, "connection ended: {e}");
            }
            st.stats.connections.fetch_sub(1, Ordering::Relaxed);
            table.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
        });
    }
    drop(listener);
    state.shutdown.store(true, Ordering::Relaxed);
    tracing::info!("shutting down: waiting for open connections");
    let _ = stop_tx.send(true);
    let deadline = Instant::now() + Duration::from_secs(5);
    while state.stats.connections.load(Ordering::Relaxed) > 0 {
        if Instant::now() >= deadline {
            tracing::warn!("some connections did not close in time");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
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
    // Colours only on a terminal (and not under NO_COLOR): a log redirected to a file is plain.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour).try_init();
}
