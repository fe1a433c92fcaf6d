//! Cross-origin isolation: the helper's own pages may run the browser engine on several
//! threads (wasm atomics need a SharedArrayBuffer, which a browser only grants to a
//! document that is cross-origin isolated).
//!
//! - `Cross-Origin-Opener-Policy: same-origin` and `Cross-Origin-Embedder-Policy:
//!   require-corp` on every response. Browsers read them on documents (the chat page, any
//!   page of the helper a test opens) and on worker scripts (a dedicated worker's embedder
//!   policy comes from its script); on anything else they are ignored.
//! - `Cross-Origin-Resource-Policy: cross-origin` on every response, so an isolated page of
//!   another origin (a widget host that isolates itself) may still load the helper's
//!   scripts, wasm and model files. Reading them still takes CORS, which the access rules
//!   ([`super::security`]) grant to allowed origins only; CORP only concerns no-cors loads
//!   (such as the widget's no-cors `/health` probe), which carry nothing readable.

use axum::extract::Request;
use axum::http::header::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

pub const HEADERS: [(&str, &str); 3] = [
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-embedder-policy", "require-corp"),
    ("cross-origin-resource-policy", "cross-origin"),
];

/// The middleware: adds [`HEADERS`] to every response (a handler's own value wins).
pub async fn headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    for (name, value) in HEADERS {
        let name = HeaderName::from_static(name);
        if !h.contains_key(&name) {
            h.insert(name, HeaderValue::from_static(value));
        }
    }
    resp
}
