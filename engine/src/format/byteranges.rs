//! Parsing HTTP range responses: `Content-Range` and `multipart/byteranges` bodies
//! (RFC 9110 §14.6), so one request can bring back all of a layer's missing experts.
//! The one parser of these: the browser's byte source and the helper's test client and
//! `coli bench-serve` use it.

/// One part of a range response: the absolute offset of its first byte, the bytes, and
/// the complete length of the resource its Content-Range names (None for `*`).
#[derive(Debug, PartialEq)]
pub struct Part {
    pub offset: u64,
    pub data: Vec<u8>,
    pub complete: Option<u64>,
}

/// Parses `bytes a-b/len` (or `bytes a-b/*`) into (a, b) inclusive and len (None for `*`).
/// A range whose length does not fit in u64 (`0-18446744073709551615`) is refused, so
/// callers can take `b - a + 1` without overflow (`range_len`).
pub fn parse_content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let v = v.trim().strip_prefix("bytes")?.trim_start();
    let (range, len) = v.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let (a, b): (u64, u64) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a <= b && b - a < u64::MAX).then_some((a, b, len.trim().parse().ok()))
}

/// The number of bytes of the inclusive range `a..=b` that `parse_content_range` returned.
pub fn range_len(a: u64, b: u64) -> u64 {
    b - a + 1
}

/// The boundary parameter of a `multipart/byteranges; boundary=...` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/byteranges") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim().eq_ignore_ascii_case("boundary").then(|| v.trim().trim_matches('"').to_string())
    })
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || from > hay.len() {
        return None;
    }
    hay[from..].windows(needle.len()).position(|w| w == needle).map(|p| p + from)
}

/// Splits a multipart/byteranges body into its parts. Each part's length comes from its
/// own Content-Range, so binary data that happens to contain the boundary is safe.
pub fn parse_multipart(body: &[u8], boundary: &str) -> Result<Vec<Part>, String> {
    let delim = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut pos = find(body, delim.as_bytes(), 0).ok_or("multipart body has no boundary")?;
    loop {
        pos += delim.len();
        if body.get(pos..pos + 2) == Some(b"--") {
            return Ok(parts);
        }
        let head_end = find(body, b"\r\n\r\n", pos).ok_or("multipart part without a header end")?;
        let head = std::str::from_utf8(&body[pos..head_end]).map_err(|_| "multipart header is not text")?;
        let range = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim().eq_ignore_ascii_case("content-range").then(|| parse_content_range(v))?
            })
            .ok_or("multipart part without a valid Content-Range")?;
        let start = head_end + 4;
        let len = usize::try_from(range_len(range.0, range.1)).map_err(|_| "multipart part too large")?;
        let data = start
            .checked_add(len)
            .and_then(|end| body.get(start..end))
            .ok_or("multipart part is shorter than its Content-Range")?;
        parts.push(Part { offset: range.0, data: data.to_vec(), complete: range.2 });
        pos = find(body, delim.as_bytes(), start + len).ok_or("multipart body is missing its closing boundary")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_forms() {
        assert_eq!(parse_content_range("bytes 0-9/100"), Some((0, 9, Some(100))));
        assert_eq!(parse_content_range(" bytes 5-5/*"), Some((5, 5, None)));
        assert_eq!(parse_content_range("bytes */100"), None);
        assert_eq!(parse_content_range("bytes 9-1/100"), None);
        // The whole u64 range has no length that fits: refused (was an overflow panic in
        // parse_multipart, found by the multipart fuzz target in CI).
        assert_eq!(parse_content_range("bytes 0-18446744073709551615/*"), None);
        assert_eq!(parse_content_range("bytes 1-18446744073709551615/*"), Some((1, u64::MAX, None)));
        assert_eq!(range_len(1, u64::MAX), u64::MAX);
    }

    #[test]
    fn multipart_roundtrip_with_boundary_inside_data() {
        let b = "XYZ";
        let mut body = Vec::new();
        let chunks: [(u64, &[u8]); 2] = [(10, b"--XYZ\r\n\r\nevil"), (4096, &[0u8, 1, 2, 255])];
        for (off, d) in chunks {
            body.extend_from_slice(
                format!(
                    "\r\n--{b}\r\nContent-Type: application/octet-stream\r\nContent-Range: bytes {}-{}/9000\r\n\r\n",
                    off,
                    off + d.len() as u64 - 1
                )
                .as_bytes(),
            );
            body.extend_from_slice(d);
        }
        body.extend_from_slice(format!("\r\n--{b}--\r\n").as_bytes());
        let parts = parse_multipart(&body, b).unwrap();
        assert_eq!(
            parts,
            vec![
                Part { offset: 10, data: chunks[0].1.to_vec(), complete: Some(9000) },
                Part { offset: 4096, data: chunks[1].1.to_vec(), complete: Some(9000) }
            ]
        );
        assert_eq!(boundary("multipart/byteranges; boundary=\"XYZ\""), Some("XYZ".into()));
        assert_eq!(boundary("text/plain; boundary=XYZ"), None);
        // Truncated body: an error, not a panic.
        assert!(parse_multipart(&body[..body.len() - 20], b).is_err());
        // A part claiming every byte of u64: an error, not an overflow.
        let huge = b"--b\r\nContent-Range: bytes 0-18446744073709551615/*\r\n\r\nab\r\n--b--";
        assert!(parse_multipart(huge, "b").is_err());
    }
}
