//! HTTP Range requests (RFC 9110 section 14): parsing the `Range` header, coalescing
//! ranges, and the layout of `multipart/byteranges` bodies. Pure: no I/O.

/// A half-open byte range `[start, end)` of a representation; never empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl ByteRange {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// `bytes START-LAST/LEN` for Content-Range.
    pub fn content_range(&self, total: u64) -> String {
        format!("bytes {}-{}/{}", self.start, self.end - 1, total)
    }
}

/// What a `Range` header asks of a representation of `len` bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RangeRequest {
    /// No usable Range header: absent, another unit, or invalid syntax (which RFC 9110
    /// says to ignore): serve the whole representation with 200.
    Full,
    /// At least one range is satisfiable: 206. Sorted, non-overlapping, coalesced.
    Ranges(Vec<ByteRange>),
    /// No range is satisfiable: 416 with `Content-Range: bytes */LEN`.
    Unsatisfiable,
    /// More range-specs than the server accepts (RFC 9110 15.5.17 allows a 416 for an
    /// excessive number of ranges).
    TooMany,
}

/// Ranges are merged only where they overlap (which bounds what a request can make the
/// server send: never more than the file per request). Adjacent ranges stay separate parts,
/// so a client that asked for experts one range each gets one part per expert.
pub const COALESCE_GAP: u64 = 0;

/// Parses a `Range` header value (RFC 9110 14.1.1) for a representation of `len` bytes.
/// `max_ranges` bounds the number of range-specs accepted.
pub fn parse_range(value: &[u8], len: u64, max_ranges: usize) -> RangeRequest {
    let Ok(value) = std::str::from_utf8(value) else { return RangeRequest::Full };
    let Some((unit, set)) = value.split_once('=') else { return RangeRequest::Full };
    if !unit.eq_ignore_ascii_case("bytes") {
        return RangeRequest::Full;
    }
    // 1#range-spec: elements separated by commas with optional whitespace; empty
    // elements are allowed and ignored (RFC 9110 5.6.1.2).
    let mut specs = Vec::new();
    for element in set.split(',') {
        let element = element.trim_matches(|c| c == ' ' || c == '\t');
        if element.is_empty() {
            continue;
        }
        if specs.len() == max_ranges {
            return RangeRequest::TooMany;
        }
        match parse_spec(element) {
            Some(s) => specs.push(s),
            None => return RangeRequest::Full,
        }
    }
    if specs.is_empty() {
        return RangeRequest::Full;
    }
    if len == 0 {
        // A zero-length representation satisfies only a non-zero suffix range, and then
        // the "range" is the whole (empty) body: serve it with 200.
        return if specs.iter().any(|s| matches!(s, Spec::Suffix(n) if *n > 0)) {
            RangeRequest::Full
        } else {
            RangeRequest::Unsatisfiable
        };
    }
    let mut ranges: Vec<ByteRange> = specs
        .into_iter()
        .filter_map(|s| match s {
            Spec::From(first, last) if first < len => {
                Some(ByteRange { start: first, end: last.map_or(len, |l| l.saturating_add(1).min(len)) })
            }
            Spec::From(..) => None,
            Spec::Suffix(0) => None,
            Spec::Suffix(n) => Some(ByteRange { start: len.saturating_sub(n), end: len }),
        })
        .collect();
    if ranges.is_empty() {
        return RangeRequest::Unsatisfiable;
    }
    coalesce(&mut ranges, COALESCE_GAP);
    RangeRequest::Ranges(ranges)
}

#[derive(Clone, Copy, Debug)]
enum Spec {
    /// `first-pos "-" [ last-pos ]`
    From(u64, Option<u64>),
    /// `"-" suffix-length`
    Suffix(u64),
}

/// Digits only; values past u64 saturate (a huge first-pos is simply unsatisfiable, a
/// huge last-pos means "to the end").
fn parse_digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.bytes().fold(0u64, |acc, b| acc.saturating_mul(10).saturating_add((b - b'0') as u64)))
}

fn parse_spec(s: &str) -> Option<Spec> {
    let (first, last) = s.split_once('-')?;
    if first.is_empty() {
        return parse_digits(last).map(Spec::Suffix);
    }
    let first = parse_digits(first)?;
    if last.is_empty() {
        return Some(Spec::From(first, None));
    }
    let last = parse_digits(last)?;
    // last-pos < first-pos makes the whole header invalid (RFC 9110 14.1.1).
    (last >= first).then_some(Spec::From(first, Some(last)))
}

/// Sorts the ranges and merges those that overlap or lie less than `gap` bytes apart
/// (RFC 9110 14.2 lets a server coalesce such ranges; clients read each part's
/// Content-Range). With `gap` 0, touching ranges stay separate.
pub fn coalesce(ranges: &mut Vec<ByteRange>, gap: u64) {
    ranges.sort_by_key(|r| (r.start, r.end));
    let mut out: Vec<ByteRange> = Vec::with_capacity(ranges.len());
    for r in ranges.drain(..) {
        match out.last_mut() {
            Some(prev) if r.start < prev.end.saturating_add(gap) => prev.end = prev.end.max(r.end),
            _ => out.push(r),
        }
    }
    *ranges = out;
}

/// One piece of a response body: literal bytes or a byte range of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    Literal(Vec<u8>),
    File(ByteRange),
}

/// The body of a `multipart/byteranges` response (RFC 9110 14.6): for each range a
/// boundary line, its Content-Type and Content-Range, then its bytes; then the closing
/// boundary. Returns the segments and the total length (for Content-Length), or None when
/// that length does not fit in a u64 (ranges of a file within a few KB of 2^64 bytes: the
/// fuzzer's case; no real file, but no overflow either).
pub fn multipart_segments(
    ranges: &[ByteRange],
    total: u64,
    content_type: &str,
    boundary: &str,
) -> Option<(Vec<Segment>, u64)> {
    let mut segs = Vec::with_capacity(2 * ranges.len() + 1);
    let mut size = 0u64;
    for (i, r) in ranges.iter().enumerate() {
        let lead = if i == 0 { "" } else { "\r\n" };
        let head = format!(
            "{lead}--{boundary}\r\nContent-Type: {content_type}\r\nContent-Range: {}\r\n\r\n",
            r.content_range(total)
        );
        size = size.checked_add(head.len() as u64)?.checked_add(r.len())?;
        segs.push(Segment::Literal(head.into_bytes()));
        segs.push(Segment::File(*r));
    }
    let tail = format!("\r\n--{boundary}--\r\n");
    size = size.checked_add(tail.len() as u64)?;
    segs.push(Segment::Literal(tail.into_bytes()));
    Some((segs, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64) -> ByteRange {
        ByteRange { start, end }
    }

    fn parse(v: &str, len: u64) -> RangeRequest {
        parse_range(v.as_bytes(), len, 256)
    }

    #[test]
    fn single_suffix_and_open_ended_ranges() {
        assert_eq!(parse("bytes=0-0", 100), RangeRequest::Ranges(vec![r(0, 1)]));
        assert_eq!(parse("bytes=10-19", 100), RangeRequest::Ranges(vec![r(10, 20)]));
        assert_eq!(parse("bytes=90-", 100), RangeRequest::Ranges(vec![r(90, 100)]));
        assert_eq!(parse("bytes=-10", 100), RangeRequest::Ranges(vec![r(90, 100)]));
        assert_eq!(parse("bytes=-1000", 100), RangeRequest::Ranges(vec![r(0, 100)]));
        assert_eq!(parse("BYTES=0-", 100), RangeRequest::Ranges(vec![r(0, 100)]));
        // last-pos past the end is clamped; a huge one saturates.
        assert_eq!(parse("bytes=50-1000", 100), RangeRequest::Ranges(vec![r(50, 100)]));
        assert_eq!(parse("bytes=50-99999999999999999999999", 100), RangeRequest::Ranges(vec![r(50, 100)]));
    }

    #[test]
    fn unsatisfiable_ranges() {
        assert_eq!(parse("bytes=100-", 100), RangeRequest::Unsatisfiable);
        assert_eq!(parse("bytes=100-200", 100), RangeRequest::Unsatisfiable);
        assert_eq!(parse("bytes=-0", 100), RangeRequest::Unsatisfiable);
        assert_eq!(parse("bytes=99999999999999999999999-", 100), RangeRequest::Unsatisfiable);
        assert_eq!(parse("bytes=0-", 0), RangeRequest::Unsatisfiable);
        assert_eq!(parse("bytes=-5", 0), RangeRequest::Full);
        // One satisfiable range among unsatisfiable ones is enough.
        assert_eq!(parse("bytes=500-600, 0-0", 100), RangeRequest::Ranges(vec![r(0, 1)]));
    }

    #[test]
    fn invalid_syntax_is_ignored() {
        for v in [
            "bytes=",
            "bytes=,",
            "bytes=5",
            "bytes=a-b",
            "bytes=5-4",
            "bytes=--5",
            "bytes=1-2-3",
            "bytes= =1-2",
            "bytes=0x10-",
            "bytes=+1-2",
            "items=0-1",
            "0-1",
            "bytes 0-1",
            "bytes=1 -2",
            "bytes=0-1,junk",
        ] {
            assert_eq!(parse(v, 100), RangeRequest::Full, "{v}");
        }
        assert_eq!(parse_range(&[b'b', 0xff], 100, 256), RangeRequest::Full);
    }

    #[test]
    fn multiple_ranges_are_sorted_and_coalesced() {
        assert_eq!(
            parse("bytes=500-599, 0-99,\t1000-1099", 2000),
            RangeRequest::Ranges(vec![r(0, 100), r(500, 600), r(1000, 1100)])
        );
        // Overlapping ranges merge, touching ones do not; empty list elements are skipped.
        assert_eq!(parse("bytes=0-99,,50-149,150-299", 2000), RangeRequest::Ranges(vec![r(0, 150), r(150, 300)]));
        assert_eq!(parse("bytes=0-0,0-0,0-0,-1", 1000), RangeRequest::Ranges(vec![r(0, 1), r(999, 1000)]));
        let mut v = vec![r(0, 10), r(15, 20), r(20, 30)];
        coalesce(&mut v, 8);
        assert_eq!(v, vec![r(0, 30)]);
    }

    #[test]
    fn too_many_ranges_are_rejected() {
        let many: Vec<String> = (0..300).map(|i| format!("{}-{}", i * 1000, i * 1000 + 1)).collect();
        let v = format!("bytes={}", many.join(","));
        assert_eq!(parse(&v, 1 << 30), RangeRequest::TooMany);
        let ok: Vec<String> = (0..256).map(|i| format!("{}-{}", i * 1000, i * 1000 + 1)).collect();
        match parse(&format!("bytes={}", ok.join(",")), 1 << 30) {
            RangeRequest::Ranges(v) => assert_eq!(v.len(), 256),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_multipart_body_longer_than_u64_is_refused_not_overflowed() {
        // Found by the range_header fuzz target (tenth session): a file length near 2^64
        // and "bytes=1-2, 4-5 ,7-" made the Content-Length sum overflow (a panic in debug
        // builds, a wrong length in release ones).
        let len = 0xFFFF_FFFF_FFFF_FF00;
        let RangeRequest::Ranges(ranges) = parse("bytes=1-2, 4-5 ,7-", len) else { panic!() };
        assert_eq!(multipart_segments(&ranges, len, "application/octet-stream", "b"), None);
        // The same ranges of a file of ordinary size add up.
        let RangeRequest::Ranges(ranges) = parse("bytes=1-2, 4-5 ,7-", 100) else { panic!() };
        let (_, size) = multipart_segments(&ranges, 100, "application/octet-stream", "b").unwrap();
        assert!(size > 93 && size < 400, "{size}");
    }

    #[test]
    fn multipart_layout_length_matches_the_segments() {
        let ranges = [r(0, 10), r(100, 150)];
        let (segs, size) = multipart_segments(&ranges, 1000, "application/octet-stream", "B").unwrap();
        let mut counted = 0u64;
        let mut text = String::new();
        for s in &segs {
            match s {
                Segment::Literal(b) => {
                    counted += b.len() as u64;
                    text.push_str(std::str::from_utf8(b).unwrap());
                }
                Segment::File(r) => {
                    counted += r.len();
                    text.push_str(&"x".repeat(r.len() as usize));
                }
            }
        }
        assert_eq!(counted, size);
        assert!(
            text.starts_with("--B\r\nContent-Type: application/octet-stream\r\nContent-Range: bytes 0-9/1000\r\n\r\n")
        );
        assert!(text.contains(
            "\r\n--B\r\nContent-Type: application/octet-stream\r\nContent-Range: bytes 100-149/1000\r\n\r\n"
        ));
        assert!(text.ends_with("\r\n--B--\r\n"));
    }
}
