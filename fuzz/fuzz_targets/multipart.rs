//! A multipart/byteranges body as the browser engine parses it (format::byteranges):
//! the first line of the input is the Content-Type, the rest the body.
#![no_main]
use colibri_engine::format::byteranges as multipart;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let ctype = String::from_utf8_lossy(&data[..split]);
    let body = data.get(split + 1..).unwrap_or(&[]);
    let _ = multipart::parse_content_range(&ctype);
    if let Some(b) = multipart::boundary(&ctype) {
        if let Ok(parts) = multipart::parse_multipart(body, &b) {
            assert!(parts.iter().map(|p| p.data.len()).sum::<usize>() <= body.len());
        }
    }
});
