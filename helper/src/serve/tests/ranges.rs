//! Model files over HTTP: every Range form, conditional requests, HEAD, streaming.

use colibri_engine::format::byteranges::parse_multipart;

use super::*;

fn url(name: &str) -> String {
    format!("/models/{MODEL}/{name}")
}

#[test]
fn full_file_with_validators() {
    let s = start("full", |_| {});
    let data = data_bytes();
    let r = s.get(&url(DATA), &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, data);
    assert_eq!(r.header("content-length"), Some(DATA_LEN.to_string().as_str()));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    let etag = r.header("etag").unwrap();
    assert!(etag.starts_with('"') && etag.ends_with('"') && !etag.starts_with("W/"), "strong etag: {etag}");
    assert!(r.header("last-modified").is_some());
    let cfg = s.get(&url("config.json"), &[]);
    assert_eq!(cfg.header("content-type"), Some("application/json"));
    assert_eq!(cfg.body, std::fs::read(s.model_dir().join("config.json")).unwrap());
    assert_eq!(s.get(&url("sub/inner.json"), &[]).text(), "{\"inner\": true}");
    let empty = s.get(&url("empty.bin"), &[]);
    assert_eq!((empty.status, empty.body.len(), empty.header("content-length")), (200, 0, Some("0")));
    // A symlink that stays inside the model directory is fine.
    #[cfg(unix)]
    assert_eq!(s.get(&url("alias.bin"), &[]).body, data);
    assert_eq!(s.get(&url("missing.bin"), &[]).status, 404);
    assert_eq!(s.get("/models/nope/config.json", &[]).status, 404);
}

#[test]
fn single_suffix_and_open_ended_ranges() {
    let s = start("single", |_| {});
    let data = data_bytes();
    let n = DATA_LEN as u64;
    for (spec, start, end) in [
        ("bytes=0-0", 0u64, 1u64),
        ("bytes=100-1123", 100, 1124),
        ("bytes=-500", n - 500, n),
        ("bytes=3000000-", 3_000_000, n),
        ("bytes=1000-99999999", 1000, n),
        ("bytes=-99999999", 0, n),
        ("bytes=5-5, 5-9", 5, 10),
    ] {
        let r = s.get(&url(DATA), &[("Range", spec)]);
        assert_eq!(r.status, 206, "{spec}");
        assert_eq!(r.body, &data[start as usize..end as usize], "{spec}");
        assert_eq!(r.header("content-range"), Some(format!("bytes {start}-{}/{n}", end - 1).as_str()), "{spec}");
        assert_eq!(r.header("content-length"), Some((end - start).to_string().as_str()), "{spec}");
    }
}

#[test]
fn multi_range_is_multipart_byteranges() {
    let s = start("multi", |_| {});
    let data = data_bytes();
    let r = s.get(&url(DATA), &[("Range", "bytes=2000000-2000099, 0-9, -16")]);
    assert_eq!(r.status, 206);
    let ctype = r.header("content-type").unwrap();
    let boundary = ctype.strip_prefix("multipart/byteranges; boundary=").expect(ctype);
    assert_eq!(r.header("content-length"), Some(r.body.len().to_string().as_str()));
    let parts = parse_multipart(&r.body, boundary).expect("multipart body");
    let n = DATA_LEN;
    let want = [(0usize, 10usize), (2_000_000, 2_000_100), (n - 16, n)];
    assert_eq!(parts.len(), 3);
    for (p, (a, b)) in parts.iter().zip(want) {
        assert_eq!((p.offset, p.complete), (a as u64, Some(n as u64)));
        assert_eq!(p.data, &data[a..b]);
    }
    let text = String::from_utf8_lossy(&r.body);
    assert_eq!(text.matches("Content-Type: application/octet-stream\r\n").count(), 3);
    assert!(text.ends_with(&format!("\r\n--{boundary}--\r\n")));

    // Overlapping ranges are coalesced into one part (then no multipart).
    let r = s.get(&url(DATA), &[("Range", "bytes=0-99,50-199,10-20")]);
    assert_eq!(r.header("content-range"), Some(format!("bytes 0-199/{n}").as_str()));
    assert_eq!(r.body, &data[..200]);
    // Touching ranges (experts laid end to end) stay one part each.
    let r = s.get(&url(DATA), &[("Range", "bytes=4096-8191,0-4095")]);
    let b = r.header("content-type").unwrap().split("boundary=").nth(1).unwrap().to_string();
    let parts = parse_multipart(&r.body, &b).unwrap();
    assert_eq!(
        parts.iter().map(|p| (p.offset, p.data.len(), p.complete)).collect::<Vec<_>>(),
        [(0, 4096, Some(n as u64)), (4096, 4096, Some(n as u64))]
    );

    // A layer's experts in one request: 64 ranges of 4 KiB.
    let spec: Vec<String> = (0..64).map(|i| format!("{}-{}", i * 40_000, i * 40_000 + 4095)).collect();
    let r = s.get(&url(DATA), &[("Range", &format!("bytes={}", spec.join(",")))]);
    let b = r.header("content-type").unwrap().split("boundary=").nth(1).unwrap().to_string();
    let parts = parse_multipart(&r.body, &b).unwrap();
    assert_eq!(parts.len(), 64);
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(p.data, &data[i * 40_000..i * 40_000 + 4096]);
    }
}

#[test]
fn unsatisfiable_invalid_and_too_many_ranges() {
    let s = start("bad-ranges", |_| {});
    let n = DATA_LEN;
    for spec in ["bytes=99999999-", &format!("bytes={n}-{}", n + 10), "bytes=-0"] {
        let r = s.get(&url(DATA), &[("Range", spec)]);
        assert_eq!(r.status, 416, "{spec}");
        assert_eq!(r.header("content-range"), Some(format!("bytes */{n}").as_str()), "{spec}");
    }
    assert_eq!(s.get(&url("empty.bin"), &[("Range", "bytes=0-")]).status, 416);
    // Invalid syntax or another unit: the header is ignored and the whole file sent.
    for spec in ["bytes=5-1", "bytes=abc", "bytes 0-1", "pages=1-2", "bytes=0-1,x", "bytes=--1"] {
        let r = s.get(&url(DATA), &[("Range", spec)]);
        assert_eq!((r.status, r.body.len()), (200, n), "{spec}");
    }
    // More than 256 ranges: refused (RFC 9110 15.5.17) instead of amplified.
    let spec: Vec<String> = (0..300).map(|i| format!("{}-{}", i * 2, i * 2)).collect();
    let r = s.get(&url(DATA), &[("Range", &format!("bytes={}", spec.join(",")))]);
    assert_eq!(r.status, 416);
    // Hundreds of copies of the whole file collapse into one range.
    let spec = vec!["0-"; 200].join(",");
    let r = s.get(&url(DATA), &[("Range", &format!("bytes={spec}"))]);
    assert_eq!((r.status, r.body.len()), (206, n));
}

#[test]
fn conditional_requests_and_head() {
    let s = start("cond", |_| {});
    let data = data_bytes();
    let first = s.get(&url(DATA), &[]);
    let etag = first.header("etag").unwrap().to_string();
    let modified = first.header("last-modified").unwrap().to_string();

    let r = s.get(&url(DATA), &[("If-None-Match", &etag)]);
    assert_eq!((r.status, r.body.len()), (304, 0));
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    assert_eq!(s.get(&url(DATA), &[("If-None-Match", "\"other\", W/\"x\"")]).status, 200);
    assert_eq!(s.get(&url(DATA), &[("If-None-Match", "*")]).status, 304);
    assert_eq!(s.get(&url(DATA), &[("If-Modified-Since", &modified)]).status, 304);
    assert_eq!(s.get(&url(DATA), &[("If-Match", "\"other\"")]).status, 412);
    assert_eq!(s.get(&url(DATA), &[("If-Match", &etag), ("Range", "bytes=0-0")]).status, 206);

    // If-Range: a matching validator keeps the range; anything else sends the whole file.
    let r = s.get(&url(DATA), &[("Range", "bytes=10-19"), ("If-Range", &etag)]);
    assert_eq!((r.status, r.body.as_slice()), (206, &data[10..20]));
    for stale in ["\"stale\"", &format!("W/{etag}"), "Tue, 15 Nov 1994 08:12:31 GMT", "garbage"] {
        let r = s.get(&url(DATA), &[("Range", "bytes=10-19"), ("If-Range", stale)]);
        assert_eq!((r.status, r.body.len()), (200, DATA_LEN), "{stale}");
    }
    // A date works when it is the file's Last-Modified and the file is a second old.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let r = s.get(&url(DATA), &[("Range", "bytes=10-19"), ("If-Range", &modified)]);
    assert_eq!(r.status, 206);

    // HEAD: the same headers, no body.
    let mut c = Conn::open(s.addr).unwrap();
    let h = c.request("HEAD", &url(DATA), &[], b"").unwrap();
    assert_eq!((h.status, h.body.len()), (200, 0));
    assert_eq!(h.header("content-length"), Some(DATA_LEN.to_string().as_str()));
    assert_eq!(h.header("etag"), Some(etag.as_str()));
    let h = c.request("HEAD", &url(DATA), &[("Range", "bytes=0-9,100-109")], b"").unwrap();
    assert_eq!(h.status, 206);
    assert!(h.header("content-type").unwrap().starts_with("multipart/byteranges"));
    // The keep-alive connection is still in step after HEADs.
    let g = c.request("GET", &url(DATA), &[("Range", "bytes=0-3")], b"").unwrap();
    assert_eq!(g.body, &data[..4]);

    // A changed file gets a new tag; the old one no longer matches.
    std::fs::write(s.model_dir().join(DATA), b"new contents").unwrap();
    let r = s.get(&url(DATA), &[("If-None-Match", &etag)]);
    assert_eq!(r.status, 200);
    assert_ne!(r.header("etag"), Some(etag.as_str()));
    let r = s.get(&url(DATA), &[("Range", "bytes=0-2"), ("If-Range", &etag)]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"new contents"[..]));
}

#[test]
fn many_concurrent_range_readers() {
    let s = start("concurrent", |_| {});
    let data = data_bytes();
    std::thread::scope(|sc| {
        for t in 0..16usize {
            let (s, data) = (&s, &data);
            sc.spawn(move || {
                let mut c = Conn::open(s.addr).unwrap();
                for i in 0..20usize {
                    let a = (t * 7919 + i * 104_729) % (DATA_LEN - 70_000);
                    let spec = format!("bytes={a}-{}", a + 65_535);
                    let r = c.request("GET", &url(DATA), &[("Range", &spec)], b"").unwrap();
                    assert_eq!(r.status, 206);
                    assert_eq!(r.body, &data[a..a + 65_536]);
                }
            });
        }
    });
    assert!(s.health()["file_bytes_sent"].as_u64().unwrap() >= 16 * 20 * 65_536);
}
