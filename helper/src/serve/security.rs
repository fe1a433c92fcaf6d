//! Who may talk to the helper.
//!
//! - Host: only loopback names (`localhost`, `127.0.0.1`, `[::1]`), `--allow-host` names
//!   and the `--host` the helper was bound to, with the helper's port or none. Anything
//!   else is refused with 403: a page on attacker.example whose name was re-pointed at
//!   127.0.0.1 (DNS rebinding, as in CVE-2024-28224) still sends `Host: attacker.example`.
//! - Origin: requests from browsers carry one. Allowed are the helper's own origins
//!   (same-origin pages) and exact `--allow-origin` matches; any other Origin is refused
//!   with 403, so a random page can neither read model files nor start generations.
//! - CORS and Private Network Access preflights are answered for `--allow-origin`
//!   origins only, never with `*`.
//! - One exception: the widget's own code ([`PUBLIC_ASSETS`]: `/widget.js` and the module it
//!   imports before it knows whether it is allowed) is served to every origin with
//!   `Access-Control-Allow-Origin: *`, so that on a page the helper refuses the widget can
//!   still run and say which `--allow-origin` to add. It is the same code for everyone and
//!   carries nothing of the user's: model files, usage counts and the APIs stay behind the
//!   allowlist.

use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// The access rules, fixed at start-up.
#[derive(Clone, Debug)]
pub struct AccessPolicy {
    /// Lower-case host names (IPv6 literals in brackets) accepted in Host.
    pub hosts: Vec<String>,
    /// The port the helper listens on.
    pub port: u16,
    /// Exact origins (scheme://host[:port]) that get CORS.
    pub origins: Vec<String>,
}

/// Splits a Host value into (lower-case name, port); None if malformed.
fn split_host(value: &str) -> Option<(String, Option<u16>)> {
    let value = value.trim();
    let (name, port) = if let Some(rest) = value.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{inside}]"), port)
    } else {
        match value.rsplit_once(':') {
            Some((n, p)) => (n.to_string(), Some(p)),
            None => (value.to_string(), None),
        }
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => Some(p.parse().ok()?),
        Some(_) => return None,
    };
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == '/' || c == '@') {
        return None;
    }
    Some((name.to_ascii_lowercase(), port))
}

impl AccessPolicy {
    /// Loopback names, plus `extra` (`--allow-host`, and the bind host when it was given).
    pub fn new(port: u16, extra_hosts: &[String], origins: &[String]) -> Self {
        let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "[::1]"].iter().map(|s| s.to_string()).collect();
        for h in extra_hosts {
            let h = h.trim().to_ascii_lowercase();
            let h = if h.contains(':') && !h.starts_with('[') { format!("[{h}]") } else { h };
            if !h.is_empty() && !hosts.contains(&h) {
                hosts.push(h);
            }
        }
        let origins = origins.iter().map(|o| o.trim().trim_end_matches('/').to_string()).collect();
        AccessPolicy { hosts, port, origins }
    }

    pub fn host_allowed(&self, value: &str) -> bool {
        match split_host(value) {
            Some((name, port)) => self.hosts.contains(&name) && port.is_none_or(|p| p == self.port),
            None => false,
        }
    }

    /// The helper's own origins: `http://` + an allowed host with the helper's port.
    fn same_origin(&self, origin: &str) -> bool {
        let Some(rest) = origin.strip_prefix("http://") else { return false };
        match split_host(rest) {
            Some((name, port)) => self.hosts.contains(&name) && port.unwrap_or(80) == self.port,
            None => false,
        }
    }

    /// Cross-origin pages listed with `--allow-origin`.
    pub fn cors_allowed(&self, origin: &str) -> bool {
        self.origins.iter().any(|o| o == origin)
    }

    pub fn origin_allowed(&self, origin: &str) -> bool {
        self.same_origin(origin) || self.cors_allowed(origin)
    }
}

fn refuse(why: &'static str) -> Response {
    refuse_with(StatusCode::FORBIDDEN, why)
}

fn refuse_with(status: StatusCode, why: &'static str) -> Response {
    let body = serde_json::json!({"error": {"message": why.trim_end(), "type": "forbidden"}});
    (status, axum::Json(body)).into_response()
}

/// Checks `--allow-origin` values: an exact `http(s)://host[:port]` origin. `null` (what
/// sandboxed frames and file:// pages send) would admit any of them, and `*` any page.
pub fn check_origin_arg(o: &str) -> Result<(), String> {
    let o = o.trim().trim_end_matches('/');
    let rest = o.strip_prefix("https://").or_else(|| o.strip_prefix("http://"));
    match rest {
        Some(host) if !host.is_empty() && !host.contains(['/', '*', ' ', '@', '?', '#']) => Ok(()),
        _ => Err(format!(
            "--allow-origin {o:?}: give an exact origin such as https://example.com (not null, *, or a path)"
        )),
    }
}

/// Paths whose answers a page of another site must not get without CORS: model files,
/// usage counts and the APIs. (`<img src>` and other no-cors requests send no Origin.)
fn private_path(path: &str) -> bool {
    path.starts_with("/models/") || path.starts_with("/api/") || path.starts_with("/v1/")
}

/// Files every origin may load (with `Access-Control-Allow-Origin: *`): the widget and
/// what it imports before it has checked that the helper allows the page.
pub const PUBLIC_ASSETS: &[&str] = &["/widget.js", "/markdown.js"];

fn public_asset(req: &Request) -> bool {
    let method_ok = match *req.method() {
        Method::GET | Method::HEAD => true,
        Method::OPTIONS => {
            let asked = req.headers().get(header::ACCESS_CONTROL_REQUEST_METHOD).map(|v| v.as_bytes());
            matches!(asked, Some(b"GET") | Some(b"HEAD"))
        }
        _ => false,
    };
    method_ok && PUBLIC_ASSETS.contains(&req.uri().path())
}

/// A public asset for an origin that is not allowed: `*`, no credentials, GET and HEAD
/// only (a preflight, e.g. Chrome's Private Network Access one, is answered the same way).
async fn serve_public(req: Request, next: Next) -> Response {
    let is_preflight = req.method() == Method::OPTIONS;
    let mut resp = if is_preflight {
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, HEAD"));
        let pna = HeaderName::from_static("access-control-request-private-network");
        if req.headers().get(&pna).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true")) {
            h.insert(HeaderName::from_static("access-control-allow-private-network"), HeaderValue::from_static("true"));
        }
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        r
    } else {
        next.run(req).await
    };
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    resp
}

/// Response headers that cross-origin pages may read.
const EXPOSED: &str = "Content-Range, Content-Length, Accept-Ranges, ETag, Last-Modified";

/// A header value list of tokens (Access-Control-Request-Headers); None if it holds
/// anything else.
fn token_list(v: &HeaderValue) -> Option<HeaderValue> {
    let s = v.to_str().ok()?;
    let ok = s.len() <= 1024
        && s.split(',').all(|t| {
            let t = t.trim();
            !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.!#$%&'*+^`|~".contains(&b))
        });
    ok.then(|| v.clone())
}

/// The middleware: Host check, Origin check, preflights, CORS headers on the way out.
pub async fn guard(State(state): State<std::sync::Arc<AppState>>, req: Request, next: Next) -> Response {
    let policy = &state.policy;
    if req.headers().get_all(header::HOST).iter().nth(1).is_some() {
        state.stats.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return refuse_with(StatusCode::BAD_REQUEST, "bad request: more than one Host header\n");
    }
    let host_ok = match (req.uri().authority(), req.headers().get(header::HOST)) {
        (Some(a), h) => {
            policy.host_allowed(a.as_str()) && h.is_none_or(|h| h.to_str().is_ok_and(|h| policy.host_allowed(h)))
        }
        (None, Some(h)) => h.to_str().is_ok_and(|h| policy.host_allowed(h)),
        (None, None) => false,
    };
    if !host_ok {
        state.stats.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return refuse("forbidden: this helper only answers requests addressed to localhost (see --allow-host)\n");
    }
    let origin = match req.headers().get(header::ORIGIN).map(|o| o.to_str().map(str::to_owned)) {
        None => None,
        Some(Ok(o)) if policy.origin_allowed(&o) => Some(o),
        Some(_) if public_asset(&req) => return serve_public(req, next).await,
        Some(_) => {
            state.stats.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return refuse("forbidden: this origin may not use the helper (see --allow-origin)\n");
        }
    };
    // A request another site's page made without CORS (an <img>, a no-cors fetch) says
    // so in Sec-Fetch-Site and carries no allowed Origin: no model bytes, no counts.
    let fetch_site = req.headers().get("sec-fetch-site").map(|v| v.as_bytes());
    let foreign = matches!(fetch_site, Some(b"cross-site") | Some(b"same-site"));
    if foreign && origin.is_none() && private_path(req.uri().path()) {
        state.stats.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return refuse("forbidden: a request from another site without an allowed Origin (see --allow-origin)\n");
    }
    let cors = origin.filter(|o| policy.cors_allowed(o));
    let is_preflight =
        req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if is_preflight {
        let Some(origin) = cors else {
            return refuse("forbidden: preflight from an origin that is not allowed\n");
        };
        return preflight(&origin, req.headers());
    }
    let mut resp = next.run(req).await;
    if let Some(origin) = cors {
        let h = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&origin) {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        }
        h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static(EXPOSED));
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    resp
}

fn preflight(origin: &str, req: &HeaderMap) -> Response {
    let mut resp = StatusCode::NO_CONTENT.into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, HEAD, POST, OPTIONS"));
    if let Some(v) = req.get(header::ACCESS_CONTROL_REQUEST_HEADERS).and_then(token_list) {
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v);
    }
    // Private Network Access: a public page may reach this loopback server.
    let pna = HeaderName::from_static("access-control-request-private-network");
    if req.get(&pna).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true")) {
        h.insert(HeaderName::from_static("access-control-allow-private-network"), HeaderValue::from_static("true"));
    }
    h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    h.insert(
        header::VARY,
        HeaderValue::from_static(
            "Origin, Access-Control-Request-Method, Access-Control-Request-Headers, Access-Control-Request-Private-Network",
        ),
    );
    resp
}

/// Whether binding `host` keeps the helper on this machine.
pub fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost") || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_and_ports() {
        let p = AccessPolicy::new(7878, &["my.box".into(), "::2".into()], &[]);
        for ok in [
            "localhost",
            "localhost:7878",
            "LOCALHOST:7878",
            "127.0.0.1",
            "127.0.0.1:7878",
            "[::1]",
            "[::1]:7878",
            "my.box:7878",
            "[::2]",
        ] {
            assert!(p.host_allowed(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.example",
            "evil.example:7878",
            "localhost:80",
            "127.0.0.1:7879",
            "127.0.0.2",
            "localhost.",
            "[::1",
            "[::1]x",
            "localhost:",
            "localhost:99999",
            "user@localhost",
            "localhost:7878:7878",
            "localhost.evil.example",
            "0.0.0.0",
        ] {
            assert!(!p.host_allowed(bad), "{bad}");
        }
    }

    #[test]
    fn origins_are_exact() {
        let p = AccessPolicy::new(7878, &[], &["https://app.example".into()]);
        assert!(p.origin_allowed("http://127.0.0.1:7878"));
        assert!(p.origin_allowed("http://localhost:7878"));
        assert!(!p.origin_allowed("http://localhost:7879"));
        assert!(!p.origin_allowed("https://localhost:7878"));
        assert!(p.origin_allowed("https://app.example"));
        assert!(p.cors_allowed("https://app.example"));
        assert!(!p.cors_allowed("http://127.0.0.1:7878"));
        for bad in ["https://app.example.evil", "https://evil.app.example", "http://app.example", "null", "*", ""] {
            assert!(!p.origin_allowed(bad), "{bad}");
        }
    }

    #[test]
    fn origin_arguments_must_be_exact_origins() {
        for ok in ["https://app.example", "http://localhost:8080", "https://x.example/"] {
            assert!(check_origin_arg(ok).is_ok(), "{ok}");
        }
        for bad in ["null", "*", "https://*.example", "app.example", "https://", "https://a.example/path", "file://"] {
            assert!(check_origin_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn loopback_bind_addresses() {
        for h in ["127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.5"] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in ["0.0.0.0", "::", "192.168.1.2", "example.com"] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }
}
