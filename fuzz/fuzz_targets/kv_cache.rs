//! A KV cache file (format::kv, read back from disk or OPFS): decoding ends with a session
//! or an error. The input gets its correct checksum appended, so the fuzzer reaches the
//! header and shape checks behind it (a wrong checksum alone is refused first).
#![no_main]
use colibri_engine::format::kv;
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

fuzz_target!(|data: &[u8]| {
    let _ = kv::read_header(data);
    let mut bytes = data.to_vec();
    bytes.extend_from_slice(&checksum(data).to_le_bytes());
    if let Ok(s) = kv::decode(&bytes, "fp", cfg()) {
        assert!(s.tokens.len() <= cfg().max_positions);
    }
});
