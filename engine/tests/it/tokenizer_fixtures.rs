//! The tokenizer and chat template against Hugging Face transformers: every
//! tests/fixtures/*/reference.json records `tokenizer: [{text, ids}]` (encode without
//! special tokens) and `chat: {messages, rendered, ids}` (apply_chat_template with
//! add_generation_prompt, then tokenized without special tokens, as transformers does).

use std::path::{Path, PathBuf};

use colibri_engine::tokenizer::{ChatMessage, DecodeStream, Tokenizer};
use serde_json::Value;

fn fixtures() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("reference.json").is_file() && p.join("tokenizer.json").is_file())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no fixture with reference.json and tokenizer.json under {}", root.display());
    dirs
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn check(dir: &Path) {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let reference: Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let tok = Tokenizer::from_dir(dir).unwrap_or_else(|e| panic!("{name}: {e}"));

    // The same tokenizer from bytes (the browser path) must agree.
    let cfg = std::fs::read(dir.join("tokenizer_config.json")).ok();
    let from_bytes = Tokenizer::from_bytes(&std::fs::read(dir.join("tokenizer.json")).unwrap(), cfg.as_deref())
        .unwrap_or_else(|e| panic!("{name}: {e}"));

    if let Some(v) = reference["diagnostics"]["tokenizer_vocab_size"].as_u64() {
        assert_eq!(tok.vocab_size() as u64, v, "{name}: vocab size");
    }

    let cases = reference["tokenizer"].as_array().expect("reference.tokenizer");
    assert!(!cases.is_empty(), "{name}: no tokenizer cases");
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        let got = tok.encode(text, false).unwrap();
        assert_eq!(got, want, "{name}: encode {text:?}");
        assert_eq!(from_bytes.encode(text, false).unwrap(), want, "{name}: from_bytes encode {text:?}");
        // Byte-level BPE without a normalizer decodes back to the text exactly.
        assert_eq!(tok.decode(&got, false).unwrap(), text, "{name}: decode {text:?}");
        let mut stream = DecodeStream::new(false);
        let mut streamed = String::new();
        for &id in &got {
            let piece = stream.push(&tok, id).unwrap();
            assert!(!piece.contains('\u{FFFD}'), "{name}: stream split a character in {text:?}");
            streamed += &piece;
        }
        streamed += &stream.finish(&tok).unwrap();
        assert_eq!(streamed, text, "{name}: streamed decode");
    }

    let chat = &reference["chat"];
    let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).expect("chat.messages");
    assert!(tok.has_chat_template(), "{name}: no chat template");
    let rendered = tok.apply_chat_template(&messages, true).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(rendered, chat["rendered"].as_str().expect("chat.rendered"), "{name}: rendered chat");
    assert_eq!(from_bytes.apply_chat_template(&messages, true).unwrap(), rendered, "{name}: from_bytes chat");
    assert_eq!(tok.encode(&rendered, false).unwrap(), ids(&chat["ids"]), "{name}: chat ids");
    assert_eq!(tok.encode_chat(&messages, true).unwrap(), ids(&chat["ids"]), "{name}: encode_chat");

    // The configured eos must be a real token id.
    for id in tok.eos_token_ids() {
        assert!((id as usize) < tok.vocab_size(), "{name}: eos id {id} outside the vocabulary");
    }
    eprintln!("{name}: {} encode cases and the chat template match transformers", cases.len());
}

#[test]
fn tokenizer_matches_transformers_on_every_fixture() {
    for dir in fixtures() {
        check(&dir);
    }
}
