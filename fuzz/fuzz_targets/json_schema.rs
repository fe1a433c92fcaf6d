//! Structured output from outside (issue #29): any JSON as a JSON Schema, and any text as a
//! Lark/GBNF grammar, goes through the compile limits and, within them, llguidance's
//! compiler and first mask: errors are fine, a panic or a stack overflow is a finding.
#![no_main]
use std::sync::OnceLock;

use colibri_engine::generate::grammar::limits::{json_nesting, MAX_JSON_NESTING};
use colibri_engine::generate::{Constraint, Grammar};
use colibri_engine::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen2_moe");
        Tokenizer::from_dir(&dir).expect("the fixture tokenizer")
    })
}

fuzz_target!(|data: &[u8]| {
    // The nesting count the surfaces use to name serde_json's depth refusal agrees with
    // the parser: whatever parses nests less than the limit.
    let nesting = json_nesting(data);
    let grammar = match serde_json::from_slice::<serde_json::Value>(data) {
        Ok(v) => {
            assert!(nesting < MAX_JSON_NESTING, "parsed JSON nesting {nesting} levels");
            Grammar::json_schema(v)
        }
        Err(_) => match std::str::from_utf8(data) {
            Ok(t) => Grammar::from_text(t),
            Err(_) => return,
        },
    };
    // Constraint::new checks the limits first.
    let _ = Constraint::new(tokenizer(), &grammar);
});
