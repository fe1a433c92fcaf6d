//! The Range header of a file request (helper/src/serve/range.rs, included as is): the
//! answer's ranges are sorted, disjoint and inside the file; the multipart layout adds up.
#![no_main]
#[allow(dead_code)]
#[path = "../../helper/src/serve/range.rs"]
mod range;
use libfuzzer_sys::fuzz_target;
use range::{multipart_segments, parse_range, RangeRequest, Segment};

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let len = u64::from_le_bytes(data[..8].try_into().unwrap()) >> (data[0] % 64);
    if let RangeRequest::Ranges(r) = parse_range(&data[8..], len, 256) {
        assert!(!r.is_empty() && r.len() <= 256);
        // Sorted and disjoint (adjacent ranges stay separate parts: COALESCE_GAP is 0).
        for w in r.windows(2) {
            assert!(w[0].end <= w[1].start);
        }
        assert!(r.iter().all(|x| x.start < x.end && x.end <= len));
        // None only when the body's length would not fit in a u64 (the file's ranges are
        // within len, so only for a len near 2^64).
        let Some((segs, total)) = multipart_segments(&r, len, "application/octet-stream", "b") else {
            let ranges: u128 = r.iter().map(|x| (x.end - x.start) as u128).sum();
            assert!(ranges + 100 * r.len() as u128 > u64::MAX as u128 - 65536);
            return;
        };
        let sum: u64 = segs
            .iter()
            .map(|s| match s {
                Segment::Literal(b) => b.len() as u64,
                Segment::File(r) => r.len(),
            })
            .sum();
        assert_eq!(sum, total);
    }
});
