//! A KV cache file (model::kv, read back from disk or OPFS): scanning its header and
//! record heads (what the helper does before reading a file) and decoding end with a
//! session or an error. Version 1 input gets its correct checksum appended and version 2
//! input its header's and records' checksums recomputed (kv::reseal), so the fuzzer
//! reaches the header, size and shape checks behind them (a wrong checksum alone is
//! refused first).
#![no_main]
use colibri_engine::model::kv;
use colibri_engine::format::manifest::checksum;
use colibri_engine::model::config::ModelConfig;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn cfg() -> &'static ModelConfig {
    static C: OnceLock<ModelConfig> = OnceLock::new();
    C.get_or_init(|| {
        // qwen3_next: attention layers and linear layers with a recurrent state.
        let json = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/qwen3_next/config.json"))
            .expect("the qwen3_next fixture's config.json");
        ModelConfig::from_json_bytes(&json).expect("the fixture's config parses")
    })
}

fn check(bytes: &[u8]) {
    if let Ok(s) = kv::decode(bytes, "fp", cfg()) {
        assert!(s.tokens.len() <= cfg().max_positions);
        // A file that decodes scans to the same ids and its own length.
        let mut read = |at: u64, buf: &mut [u8]| -> colibri_engine::Result<()> {
            buf.copy_from_slice(&bytes[at as usize..at as usize + buf.len()]);
            Ok(())
        };
        let sc = kv::scan(&mut read, bytes.len() as u64, cfg().max_positions).expect("a decodable file scans");
        assert_eq!((sc.header.tokens, sc.len), (s.tokens, bytes.len() as u64));
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = kv::read_header(data);
    // The length the file claims may be anything: reads past the data fail, as on a file
    // truncated under the reader.
    let claimed = data.len() as u64 + data.first().map_or(0, |&b| b as u64 * 4096);
    let mut read = |at: u64, buf: &mut [u8]| -> colibri_engine::Result<()> {
        let src = usize::try_from(at).ok().and_then(|a| data.get(a..a.checked_add(buf.len())?));
        let src = src.ok_or_else(|| colibri_engine::Error::Invalid("past the end".into()))?;
        buf.copy_from_slice(src);
        Ok(())
    };
    let _ = kv::scan(&mut read, claimed, cfg().max_positions);
    let mut bytes = data.to_vec();
    bytes.extend_from_slice(&checksum(data).to_le_bytes());
    check(&bytes);
    if let Some(sealed) = kv::reseal(data) {
        check(&sealed);
    }
});
