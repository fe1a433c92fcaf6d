//! The access rules over real sockets: Host, Origin, CORS and Private Network Access,
//! path confinement, limits, and hostile input.

use super::*;

const APP: &str = "https://app.example";

#[test]
fn hosts_other_than_loopback_are_refused() {
    let s = start("host", |a| a.allow_hosts = vec!["colibri.lan".into()]);
    let port = s.addr.port();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "localhost".into(),
        format!("[::1]:{port}"),
        format!("colibri.lan:{port}"),
    ] {
        assert_eq!(s.get("/health", &[("Host", &host)]).status, 200, "{host}");
    }
    for host in [
        "evil.example",
        &format!("evil.example:{port}"),
        "localhost:1",
        "127.0.0.1.evil.example",
        "localhost.",
        "0.0.0.0",
        "",
    ] {
        let r = s.get("/health", &[("Host", host)]);
        assert_eq!(r.status, 403, "{host}");
    }
    // Model files too (a rebinding page must not read them), and absolute-form targets.
    assert_eq!(s.get(&format!("/models/{MODEL}/config.json"), &[("Host", "evil.example")]).status, 403);
    let r = s.raw(&format!("GET http://evil.example/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"));
    assert_eq!(r.status, 403);
    // HTTP/1.0 without Host.
    let r = s.raw("GET /health HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 403);
    assert!(s.health()["refused"].as_u64().unwrap() >= 9);
}

#[test]
fn origins_cors_and_private_network_preflights() {
    let s = start("origin", |a| a.allow_origins = vec![APP.into()]);
    let port = s.addr.port();
    // Same-origin (the helper's own page) and no Origin at all: fine, no CORS headers.
    let own = format!("http://127.0.0.1:{port}");
    let r = s.get("/health", &[("Origin", &own)]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);
    // An allowed cross origin gets exactly its origin back, never *.
    let r = s.get(&format!("/models/{MODEL}/config.json"), &[("Origin", APP)]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    assert!(r.header("access-control-expose-headers").unwrap().contains("Content-Range"));
    // Anything else is refused, including look-alikes and null.
    for o in [
        "https://evil.example",
        "https://app.example.evil.example",
        "http://app.example",
        "null",
        &format!("http://127.0.0.1:{}", port + 1),
    ] {
        assert_eq!(s.get("/health", &[("Origin", o)]).status, 403, "{o}");
        let r = s.post("/v1/chat/completions", "{}");
        assert_ne!(r.status, 403, "no Origin: not refused");
        let r =
            client::request(s.addr, "POST", "/api/usage", &[("Origin", o)], br#"{"model":"olmoe","counts":[[0,0,1]]}"#)
                .unwrap();
        assert_eq!(r.status, 403, "{o}");
    }
    assert!(!s.model_dir().join("usage.json").exists(), "refused reports change nothing");

    // Preflight with Private Network Access.
    let pre = [
        ("Origin", APP),
        ("Access-Control-Request-Method", "GET"),
        ("Access-Control-Request-Headers", "range, if-range"),
        ("Access-Control-Request-Private-Network", "true"),
    ];
    let r = client::request(s.addr, "OPTIONS", &format!("/models/{MODEL}/{DATA}"), &pre, b"").unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    assert_eq!(r.header("access-control-allow-private-network"), Some("true"));
    assert_eq!(r.header("access-control-allow-headers"), Some("range, if-range"));
    assert!(r.header("access-control-allow-methods").unwrap().contains("POST"));
    assert!(r.header("vary").unwrap().contains("Origin"));
    let mut evil = pre;
    evil[0].1 = "https://evil.example";
    let r = client::request(s.addr, "OPTIONS", "/v1/chat/completions", &evil, b"").unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(r.header("access-control-allow-origin"), None);
    assert_eq!(r.header("access-control-allow-private-network"), None);
}

#[test]
fn pages_are_cross_origin_isolated_and_files_loadable_from_isolated_pages() {
    let s = start("isolation", |a| a.allow_origins = vec![APP.into()]);
    let isolated = |r: &Response, what: &str| {
        assert_eq!(r.header("cross-origin-opener-policy"), Some("same-origin"), "{what}");
        assert_eq!(r.header("cross-origin-embedder-policy"), Some("require-corp"), "{what}");
        assert_eq!(r.header("cross-origin-resource-policy"), Some("cross-origin"), "{what}");
    };
    // The chat page (or the model list without one), a document the e2e tests open, the
    // scripts, the engine's wasm (a missing build answers 404, with the same headers).
    for path in
        ["/", "/health", "/colibri.js", "/colibri-worker.js", "/pkg/colibri_wasm.js", "/pkg-threads/colibri_wasm.js"]
    {
        let r = s.get(path, &[]);
        isolated(&r, path);
    }
    // Model files for an allowed page of another origin: CORS and CORP together, whole
    // files and ranges alike.
    let file = format!("/models/{MODEL}/{DATA}");
    for range in [None, Some("bytes=0-99")] {
        let mut h = vec![("Origin", APP)];
        h.extend(range.map(|r| ("Range", r)));
        let r = s.get(&file, &h);
        assert!(r.status == 200 || r.status == 206, "{}", r.status);
        assert_eq!(r.header("access-control-allow-origin"), Some(APP));
        isolated(&r, &file);
    }
    // Refusals carry them too.
    let r = s.get(&file, &[("Origin", "https://evil.example")]);
    assert_eq!(r.status, 403);
    isolated(&r, "403");
}

#[test]
fn the_widget_code_loads_on_every_origin_and_nothing_else_does() {
    let s = start("public", |a| a.allow_origins = vec![APP.into()]);
    for o in ["https://evil.example", "null", "http://localhost:1"] {
        for path in ["/widget.js", "/markdown.js"] {
            let r = s.get(path, &[("Origin", o)]);
            // 200 with the web app built in, 404 (same headers) in a build without web/.
            assert!(r.status == 200 || r.status == 404, "{path} {o}: {}", r.status);
            assert_eq!(r.header("access-control-allow-origin"), Some("*"), "{path} {o}");
            assert_eq!(r.header("access-control-allow-credentials"), None);
            assert!(r.header("vary").unwrap().contains("Origin"));
        }
        // A preflight (Private Network Access) for the widget: GET only, no other method.
        let pre = [
            ("Origin", o),
            ("Access-Control-Request-Method", "GET"),
            ("Access-Control-Request-Private-Network", "true"),
        ];
        let r = client::request(s.addr, "OPTIONS", "/widget.js", &pre, b"").unwrap();
        assert_eq!(r.status, 204);
        assert_eq!(r.header("access-control-allow-origin"), Some("*"));
        assert_eq!(r.header("access-control-allow-methods"), Some("GET, HEAD"));
        assert_eq!(r.header("access-control-allow-private-network"), Some("true"));
        let pre = [("Origin", o), ("Access-Control-Request-Method", "POST")];
        assert_eq!(client::request(s.addr, "OPTIONS", "/widget.js", &pre, b"").unwrap().status, 403);
        // Not a way in: a POST to the widget's path, the rest of the app, the model, the API.
        let r = client::request(s.addr, "POST", "/widget.js", &[("Origin", o)], b"{}").unwrap();
        assert_eq!(r.status, 403, "POST /widget.js {o}");
        for path in
            ["/colibri.js", "/", "/health", "/api/models", &format!("/models/{MODEL}/config.json"), "/v1/models"]
        {
            let r = s.get(path, &[("Origin", o)]);
            assert_eq!(r.status, 403, "{path} {o}");
            assert_eq!(r.header("access-control-allow-origin"), None, "{path} {o}");
        }
        let r =
            client::request(s.addr, "POST", "/api/usage", &[("Origin", o)], br#"{"model":"olmoe","counts":[[0,0,1]]}"#)
                .unwrap();
        assert_eq!(r.status, 403);
    }
    // An allowed origin still gets its own origin back, not *.
    let r = s.get("/widget.js", &[("Origin", APP)]);
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    // DNS rebinding stays refused for the public files too.
    assert_eq!(s.get("/widget.js", &[("Host", "evil.example")]).status, 403);
}

#[test]
fn no_cors_without_allowed_origins() {
    let s = start("no-origins", |_| {});
    let pre = [("Origin", APP), ("Access-Control-Request-Method", "POST")];
    let r = client::request(s.addr, "OPTIONS", "/v1/completions", &pre, b"").unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(s.get("/health", &[("Origin", APP)]).status, 403);
}

#[test]
fn file_paths_cannot_leave_the_model_directory() {
    let s = start("traversal", |_| {});
    let secret = "TOP-SECRET";
    let m = MODEL;
    for path in [
        format!("/models/{m}/../secret.txt"),
        format!("/models/{m}/../../secret.txt"),
        format!("/models/{m}/%2e%2e/secret.txt"),
        format!("/models/{m}/%2E%2E/%2E%2E/secret.txt"),
        format!("/models/{m}/..%2fsecret.txt"),
        format!("/models/{m}/..%2Fsecret.txt"),
        format!("/models/{m}/sub/..%2f..%2fsecret.txt"),
        format!("/models/{m}/%2fetc%2fpasswd"),
        format!("/models/{m}//etc/passwd"),
        format!("/models/{m}/..%5csecret.txt"),
        format!("/models/{m}/config.json%00.txt"),
        format!("/models/{m}/./config.json"),
        format!("/models/{m}/escape.txt"),
        format!("/models/{m}/sub/../escape.txt"),
        "/models/../secret.txt".to_string(),
        "/models/%2e%2e/secret.txt".to_string(),
        "/models/..%2fsecret.txt/x".to_string(),
        format!("/models/{m}/%ff%fe"),
    ] {
        // Raw request: the client must not normalise the path.
        let port = s.addr.port();
        let r = s.raw(&format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"));
        assert!(r.status == 400 || r.status == 404, "{path}: {}", r.status);
        assert!(!r.text().contains(secret), "{path} leaked the secret");
    }
    assert_eq!(s.get("/health", &[]).status, 200);
}

#[test]
fn limits_on_bodies_headers_and_hostile_input() {
    let s = start("limits", |_| {});
    let port = s.addr.port();
    // Oversized bodies.
    let big = format!(r#"{{"model":"olmoe","counts":[{}]}}"#, vec!["[0,0,1]"; 200_000].join(","));
    assert!(big.len() > super::super::usage::MAX_USAGE_BODY);
    let r = s.post("/api/usage", &big);
    assert_eq!(r.status, 413, "{}", r.text());
    let huge = "x".repeat(super::super::openai::MAX_BODY + 10);
    let r = s.post("/v1/completions", &huge);
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    // Oversized headers: refused by hyper (431), the server lives on.
    let r = s.raw(&format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Big: {}\r\n\r\n", "a".repeat(100_000)));
    assert_eq!(r.status, 431);
    // Garbage instead of HTTP, a lying Content-Length, a truncated request.
    for raw in [
        "\x16\x03\x01\x02\x00\x01\x00\x01\x7c\x03\x03garbage\r\n\r\n".to_string(),
        "GET /health HTTP/9.9\r\n\r\n".into(),
        format!("POST /api/usage HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: -5\r\n\r\n"),
        format!("GET /models/{MODEL}/{DATA} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nRange: bytes=\u{1F600}\r\n\r\n"),
    ] {
        let mut c = Conn::open(s.addr).unwrap();
        c.send_raw(raw.as_bytes()).unwrap();
        let _ = c.read_response(false);
    }
    let mut c = Conn::open(s.addr).unwrap();
    c.send_raw(
        format!("POST /api/usage HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 100\r\n\r\n{{\"mo").as_bytes(),
    )
    .unwrap();
    drop(c);
    // A client that stops reading a large body mid-way.
    let mut c = Conn::open(s.addr).unwrap();
    c.send("GET", &format!("/models/{MODEL}/{DATA}"), &[], b"").unwrap();
    let (status, _) = c.read_head().unwrap();
    assert_eq!(status, 200);
    drop(c);
    assert_eq!(s.get("/health", &[]).status, 200);
    // Methods and paths that do not exist.
    assert_eq!(s.get("/nope/nope", &[]).status, 404);
    assert_eq!(client::request(s.addr, "DELETE", &format!("/models/{MODEL}/{DATA}"), &[], b"").unwrap().status, 405);
    assert_eq!(s.get("/v1/nope", &[]).json()["error"]["code"], "unknown_url");
}

#[test]
fn too_many_connections_wait_instead_of_failing() {
    let s = start("conns", |_| {});
    // Open more idle connections than there are worker threads; requests still succeed.
    let idle: Vec<Conn> = (0..32).map(|_| Conn::open(s.addr).unwrap()).collect();
    assert_eq!(s.get("/health", &[]).status, 200);
    drop(idle);
}
