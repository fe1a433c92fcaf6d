//! The web app's files, embedded in the binary by helper/build.rs: everything in web/
//! (chat page, colibri.js, its worker, widget.js) and the built browser engine
//! (tools/build-web.sh): web/pkg/ (one thread) and web/pkg-threads/ (wasm threads, for
//! cross-origin isolated pages). Without web/index.html, `/` is a page listing the models.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};

use super::AppState;

include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));

/// Bytes of the browser engine builds embedded in this binary: (one-thread, threaded).
pub fn embedded_engine() -> (Option<u64>, Option<u64>) {
    let size = |name: &str| ASSETS.iter().find(|(p, ..)| *p == name).map(|(_, _, b)| b.len() as u64);
    (size("pkg/colibri_wasm_bg.wasm"), size("pkg-threads/colibri_wasm_bg.wasm"))
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

pub async fn index(State(state): State<Arc<AppState>>) -> Response {
    if let Some(r) = from_web_dir("index.html") {
        return r;
    }
    if let Some((_, ctype, bytes)) = ASSETS.iter().find(|(p, ..)| *p == "index.html") {
        return ([(header::CONTENT_TYPE, *ctype)], *bytes).into_response();
    }
    let models = state.registry.list();
    let items: String = if models.is_empty() {
        "<li>none yet: put a model directory under the models directory, or start with <code>coli serve --model DIR</code></li>".into()
    } else {
        models
            .iter()
            .map(|m| {
                format!(
                    "<li><code>{0}</code> (<a href=\"/models/{0}/config.json\">config.json</a>)</li>",
                    escape(&m.id)
                )
            })
            .collect()
    };
    let dir = state.registry.models_dir().map(|d| escape(&d.display().to_string())).unwrap_or_else(|| "(none)".into());
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>colibri</title>\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"></head>\
         <body style=\"font-family: system-ui, sans-serif; max-width: 40rem; margin: 3rem auto; line-height: 1.5\">\
         <h1>colibri</h1><p>The helper is running. The chat page is coming with the web app; \
         meanwhile the OpenAI-compatible API is at <code>/v1</code> and the model list at \
         <a href=\"/api/models\">/api/models</a>.</p><h2>Models</h2><ul>{items}</ul>\
         <p>Models directory: <code>{dir}</code></p></body></html>"
    ))
    .into_response()
}

/// A developer's override: with `COLIBRI_WEB_DIR=DIR`, the web app and engine builds are
/// served from DIR (a web/ folder, e.g. another checkout's, after tools/build-web.sh)
/// instead of the embedded copy, so that two engine builds can be compared with one `coli`
/// (tools/bench/browser.mjs --web-dir). Only plain relative names: every component of
/// letters, digits, `-`, `_` and `.`, none starting with a dot.
fn from_web_dir(name: &str) -> Option<Response> {
    static DIR: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| std::env::var_os("COLIBRI_WEB_DIR").map(Into::into)).as_ref()?;
    let plain = |c: &str| {
        !c.is_empty() && !c.starts_with('.') && c.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    if !name.split('/').all(plain) {
        return Some((StatusCode::NOT_FOUND, format!("{name} is not part of this helper\n")).into_response());
    }
    let ctype = match name.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "wasm" => "application/wasm",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        _ => "application/octet-stream",
    };
    Some(match std::fs::read(dir.join(name)) {
        Ok(bytes) => ([(header::CONTENT_TYPE, ctype), (header::CACHE_CONTROL, "no-cache")], bytes).into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{name}: {e} (COLIBRI_WEB_DIR)\n")).into_response(),
    })
}

fn serve_asset(name: &str) -> Response {
    if let Some(r) = from_web_dir(name) {
        return r;
    }
    match ASSETS.iter().find(|(p, ..)| *p == name) {
        Some((_, ctype, bytes)) => {
            ([(header::CONTENT_TYPE, *ctype), (header::CACHE_CONTROL, "no-cache")], *bytes).into_response()
        }
        None if name.starts_with("pkg/") || name.starts_with("pkg-threads/") => (
            StatusCode::NOT_FOUND,
            "the browser engine is not built into this coli: run tools/build-web.sh, then rebuild coli\n",
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, format!("{name} is not part of this helper\n")).into_response(),
    }
}

pub async fn asset(Path(name): Path<String>) -> Response {
    serve_asset(&name)
}

/// `/pkg/{*path}`: the one-thread wasm engine and its JavaScript glue.
pub async fn pkg_asset(Path(path): Path<String>) -> Response {
    serve_asset(&format!("pkg/{path}"))
}

/// `/pkg-threads/{*path}`: the threaded wasm engine, its glue and the thread pool's worker
/// script (under snippets/).
pub async fn pkg_threads_asset(Path(path): Path<String>) -> Response {
    serve_asset(&format!("pkg-threads/{path}"))
}
