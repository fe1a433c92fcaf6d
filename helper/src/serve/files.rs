//! `GET|HEAD /models/{id}/{path}`: model files with RFC 9110 range and conditional
//! request semantics, streamed from the file with positioned reads in bounded chunks.
//!
//! One request can fetch many experts: a multi-range request (`Range: bytes=a-b,c-d,...`,
//! up to [`MAX_RANGES`] ranges) is answered with one `multipart/byteranges` body, parts in
//! ascending offset order; overlapping ranges are merged into one part, so clients read
//! each part's Content-Range rather than assume the order or shape they asked for.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::models::{resolve_file, PathError};
use super::range::{multipart_segments, parse_range, ByteRange, RangeRequest, Segment};
use super::AppState;

/// Most range-specs in one Range header.
pub const MAX_RANGES: usize = 256;
/// Bytes read per positioned read while streaming a body.
const CHUNK: u64 = 512 * 1024;

/// Validators of one file version.
struct FileMeta {
    len: u64,
    modified: Option<SystemTime>,
    etag: String,
}

fn meta_of(file: &File) -> std::io::Result<FileMeta> {
    let md = file.metadata()?;
    let modified = md.modified().ok();
    let nanos = modified.and_then(|m| m.duration_since(SystemTime::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
    #[cfg(unix)]
    let ident = {
        use std::os::unix::fs::MetadataExt;
        (md.dev(), md.ino())
    };
    #[cfg(not(unix))]
    let ident = (0u64, 0u64);
    // Strong: any change of size, mtime (ns) or inode gives another tag.
    let mut key = Vec::with_capacity(40);
    for v in [ident.0, ident.1, md.len()] {
        key.extend_from_slice(&v.to_le_bytes());
    }
    key.extend_from_slice(&nanos.to_le_bytes());
    let etag = format!("\"{:016x}\"", xxhash_rust::xxh3::xxh3_64(&key));
    Ok(FileMeta { len: md.len(), modified, etag })
}

fn plain(status: StatusCode, msg: &str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], format!("{msg}\n")).into_response()
}

fn content_type(path: &std::path::Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "json" => "application/json",
        "txt" | "md" | "jinja" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// Entity-tag list matching (RFC 9110 8.8.3.2): `*` or any listed tag. `weak` compares
/// ignoring W/ prefixes; strong comparison requires both tags to be strong.
fn etag_matches(list: &str, etag: &str, weak: bool) -> bool {
    list.split(',').map(str::trim).any(|t| {
        if t == "*" {
            return true;
        }
        match t.strip_prefix("W/") {
            Some(w) => weak && w == etag,
            None => t == etag,
        }
    })
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

/// Truncates to whole seconds, as HTTP dates are.
fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// If-Range (RFC 9110 13.1.5): an entity-tag must match strongly; a date must equal
/// Last-Modified, which counts as strong only if the file is at least a second older
/// than now.
fn if_range_holds(value: &str, m: &FileMeta) -> bool {
    let value = value.trim();
    if value.starts_with('"') || value.starts_with("W/") {
        return value == m.etag;
    }
    match (httpdate::parse_http_date(value), m.modified) {
        (Ok(date), Some(modified)) => {
            let strong = SystemTime::now().duration_since(modified).is_ok_and(|d| d >= Duration::from_secs(1));
            strong && secs(date) == secs(modified)
        }
        _ => false,
    }
}

pub async fn get_file(
    State(state): State<Arc<AppState>>,
    Path((id, rel)): Path<(String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    // `owner/name` ids arrive percent-encoded (one segment) or as two segments.
    let found = match state.registry.get(&id) {
        Some(m) => Some((m, rel)),
        None => state.registry.split_file_path(&format!("{id}/{rel}")),
    };
    let Some((model, rel)) = found else {
        return plain(StatusCode::NOT_FOUND, &format!("no model {id:?}"));
    };
    let opened = tokio::task::spawn_blocking(move || -> Result<(PathBuf, File, FileMeta), PathError> {
        let path = resolve_file(&model.root, &rel)?;
        let file = colibri_engine::fsio::open_regular(&path).map_err(|_| PathError::NotFound)?;
        let meta = meta_of(&file).map_err(|_| PathError::NotFound)?;
        Ok((path, file, meta))
    })
    .await;
    let (path, file, meta) = match opened {
        Ok(Ok(v)) => v,
        Ok(Err(PathError::Invalid)) => return plain(StatusCode::BAD_REQUEST, "invalid file path"),
        Ok(Err(PathError::NotFound)) => return plain(StatusCode::NOT_FOUND, "no such file"),
        Err(_) => return plain(StatusCode::INTERNAL_SERVER_ERROR, "internal error"),
    };
    respond(&state, &method, &headers, Arc::new(file), &meta, content_type(&path))
}

fn respond(
    state: &AppState,
    method: &Method,
    h: &HeaderMap,
    file: Arc<File>,
    m: &FileMeta,
    ctype: &'static str,
) -> Response {
    let mut base = HeaderMap::new();
    base.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Ok(v) = HeaderValue::from_str(&m.etag) {
        base.insert(header::ETAG, v);
    }
    if let Some(t) = m.modified {
        if let Ok(v) = HeaderValue::from_str(&http_date(t)) {
            base.insert(header::LAST_MODIFIED, v);
        }
    }
    base.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));

    // Preconditions in the order of RFC 9110 13.2.2.
    if let Some(im) = header_str(h, header::IF_MATCH) {
        if !etag_matches(im, &m.etag, false) {
            return with_headers(StatusCode::PRECONDITION_FAILED, base, Body::empty());
        }
    } else if let (Some(ius), Some(modified)) = (header_str(h, header::IF_UNMODIFIED_SINCE), m.modified) {
        if httpdate::parse_http_date(ius).is_ok_and(|d| secs(modified) > secs(d)) {
            return with_headers(StatusCode::PRECONDITION_FAILED, base, Body::empty());
        }
    }
    if let Some(inm) = header_str(h, header::IF_NONE_MATCH) {
        if etag_matches(inm, &m.etag, true) {
            return with_headers(StatusCode::NOT_MODIFIED, base, Body::empty());
        }
    } else if let (Some(ims), Some(modified)) = (header_str(h, header::IF_MODIFIED_SINCE), m.modified) {
        if httpdate::parse_http_date(ims).is_ok_and(|d| secs(modified) <= secs(d)) {
            return with_headers(StatusCode::NOT_MODIFIED, base, Body::empty());
        }
    }

    let mut ranged = match h.get(header::RANGE) {
        Some(r) => parse_range(r.as_bytes(), m.len, MAX_RANGES),
        None => RangeRequest::Full,
    };
    if let Some(ir) = h.get(header::IF_RANGE) {
        if !ir.to_str().is_ok_and(|v| if_range_holds(v, m)) {
            ranged = RangeRequest::Full;
        }
    }
    let head = method == Method::HEAD;
    let (status, segments, len) = match ranged {
        RangeRequest::Full => {
            let segs = if m.len == 0 { vec![] } else { vec![Segment::File(ByteRange { start: 0, end: m.len })] };
            base.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
            (StatusCode::OK, segs, m.len)
        }
        RangeRequest::Unsatisfiable | RangeRequest::TooMany => return not_satisfiable(base, m.len),
        RangeRequest::Ranges(ranges) if ranges.len() == 1 => {
            let r = ranges[0];
            if let Ok(v) = HeaderValue::from_str(&r.content_range(m.len)) {
                base.insert(header::CONTENT_RANGE, v);
            }
            base.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
            (StatusCode::PARTIAL_CONTENT, vec![Segment::File(r)], r.len())
        }
        RangeRequest::Ranges(ranges) => {
            let n = state.stats.requests.load(Ordering::Relaxed);
            let boundary =
                format!("colibri{:016x}", xxhash_rust::xxh3::xxh3_64(&[m.etag.as_bytes(), &n.to_le_bytes()].concat()));
            let Some((segs, len)) = multipart_segments(&ranges, m.len, ctype, &boundary) else {
                return not_satisfiable(base, m.len);
            };
            if let Ok(v) = HeaderValue::from_str(&format!("multipart/byteranges; boundary={boundary}")) {
                base.insert(header::CONTENT_TYPE, v);
            }
            (StatusCode::PARTIAL_CONTENT, segs, len)
        }
    };
    base.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if head {
        return with_headers(status, base, Body::empty());
    }
    let file_bytes: u64 = segments.iter().map(|s| if let Segment::File(r) = s { r.len() } else { 0 }).sum();
    state.stats.file_bytes.fetch_add(file_bytes, Ordering::Relaxed);
    with_headers(status, base, stream_body(file, segments))
}

/// 416 with `Content-Range: bytes */LEN` (RFC 9110 15.5.17).
fn not_satisfiable(mut headers: HeaderMap, len: u64) -> Response {
    if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
        headers.insert(header::CONTENT_RANGE, v);
    }
    with_headers(StatusCode::RANGE_NOT_SATISFIABLE, headers, Body::empty())
}

fn with_headers(status: StatusCode, headers: HeaderMap, body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    r
}

/// Streams the segments: literals as they are, file ranges in [`CHUNK`]-sized positioned
/// reads on the blocking pool. A short read (the file shrank) ends the body with an
/// error, which aborts the connection rather than sending wrong bytes.
fn stream_body(file: Arc<File>, segments: Vec<Segment>) -> Body {
    let state = (file, segments.into_iter(), None::<ByteRange>);
    let stream = futures_util::stream::unfold(state, |(file, mut segs, mut cur)| async move {
        loop {
            if let Some(r) = cur.take() {
                let n = (r.end - r.start).min(CHUNK);
                let f = file.clone();
                let read = tokio::task::spawn_blocking(move || read_exact_at(&f, r.start, n as usize)).await;
                let item = match read {
                    Ok(Ok(buf)) => Ok(Bytes::from(buf)),
                    Ok(Err(e)) => Err(e),
                    Err(e) => Err(std::io::Error::other(e.to_string())),
                };
                let failed = item.is_err();
                if r.start + n < r.end && !failed {
                    cur = Some(ByteRange { start: r.start + n, end: r.end });
                }
                let segs = if failed { Vec::new().into_iter() } else { segs };
                return Some((item, (file, segs, cur)));
            }
            match segs.next()? {
                Segment::Literal(b) => return Some((Ok(Bytes::from(b)), (file, segs, cur))),
                Segment::File(r) => cur = Some(r),
            }
        }
    });
    Body::from_stream(stream)
}

/// Reads exactly `n` bytes at `offset` without moving a shared cursor.
pub fn read_exact_at(file: &File, offset: u64, n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        file.read_exact_at(&mut buf, offset)?;
    }
    #[cfg(windows)]
    {
        use std::os::windows::fs::FileExt;
        let mut done = 0;
        while done < n {
            let k = file.seek_read(&mut buf[done..], offset + done as u64)?;
            if k == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            done += k;
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_comparison() {
        let tag = "\"abc\"";
        assert!(etag_matches("\"abc\"", tag, false));
        assert!(etag_matches("\"x\", \"abc\"", tag, false));
        assert!(etag_matches("*", tag, false));
        assert!(!etag_matches("W/\"abc\"", tag, false));
        assert!(etag_matches("W/\"abc\"", tag, true));
        assert!(!etag_matches("\"abd\"", tag, true));
    }
}
