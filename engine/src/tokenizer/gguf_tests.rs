//! The tokenizers rebuilt from a GGUF's vocabulary (`format::gguf_tokenizer`), run: the ids
//! llama.cpp's pre-tokenizers and the sentencepiece library give.

use super::Tokenizer;
use crate::error::Result;
use crate::format::gguf::tests::{gstr, Writer};
use crate::format::gguf::Gguf;
use crate::format::gguf_tokenizer::tokenizer_files;
use serde_json::Value as Json;

fn strings(k: &str, v: &[&str]) -> (String, u32, Vec<u8>) {
    let mut b = 8u32.to_le_bytes().to_vec();
    b.extend((v.len() as u64).to_le_bytes());
    for s in v {
        b.extend(gstr(s));
    }
    (k.into(), 9, b)
}

/// "123 45" with merges for "12", "123", "Ġ4", "Ġ45" and "45": each pre-tokenizer
/// splits digits and spaces its own way before the merges apply.
fn encode(pre: &str) -> Result<Vec<u32>> {
    let mut w = Writer::new().string("tokenizer.ggml.model", "gpt2").string("tokenizer.ggml.pre", pre);
    w.kv.push(strings("tokenizer.ggml.tokens", &["1", "2", "3", "4", "5", "Ġ", "12", "123", "45", "Ġ4", "Ġ45"]));
    w.kv.push(strings("tokenizer.ggml.merges", &["1 2", "12 3", "Ġ 4", "Ġ4 5", "4 5"]));
    let bytes = w.bytes();
    let g = Gguf::parse(&bytes, "t.gguf")?;
    let (tok, cfg) = tokenizer_files(&g, Some(64))?;
    let t = Tokenizer::from_bytes(&tok, Some(&cfg))?;
    t.encode("123 45", false)
}

#[test]
fn pre_tokenizers_split_digits_like_llama_cpp() {
    // GPT-2: digit runs whole, " 45" keeps its space.
    assert_eq!(encode("gpt-2").unwrap(), vec![7, 10]);
    // Qwen2: one digit at a time.
    assert_eq!(encode("qwen2").unwrap(), vec![0, 1, 2, 5, 3, 4]);
    // Llama 3: runs of up to three digits, the space on its own.
    assert_eq!(encode("llama-bpe").unwrap(), vec![7, 5, 8]);
    assert_eq!(encode("glm4").unwrap(), vec![7, 5, 8]);
    // DeepSeek-V3: digit runs of up to three split off first.
    assert_eq!(encode("deepseek-v3").unwrap(), vec![7, 5, 8]);
    // o200k (gpt-oss): runs of up to three, the space on its own (the regex compiles).
    assert_eq!(encode("gpt-4o").unwrap(), vec![7, 5, 8]);
    assert_eq!(encode("kimi-k2").unwrap(), vec![7, 5, 8]);
    let e = encode("made-up").unwrap_err().to_string();
    assert!(e.contains("\"made-up\""), "{e}");
}

/// A SentencePiece BPE vocabulary as llama.cpp stores it (tools/make_gguf_fixtures.py
/// trains one): the rebuilt tokenizer gives the sentencepiece library's own ids, with
/// byte fallback for characters outside the vocabulary, BOS added, and decodes back.
#[test]
fn sentencepiece_vocabulary_encodes_like_sentencepiece() {
    let dir = format!("{}/../tests/fixtures/gguf", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(format!("{dir}/spm-tokenizer.gguf")).unwrap();
    let g = Gguf::parse(&bytes, "spm").unwrap();
    let (tok, cfg) = tokenizer_files(&g, None).unwrap();
    let t = Tokenizer::from_bytes(&tok, Some(&cfg)).unwrap();
    let refs: Json = serde_json::from_slice(&std::fs::read(format!("{dir}/spm-tokenizer.ref.json")).unwrap()).unwrap();
    for r in refs.as_array().unwrap() {
        let text = r["text"].as_str().unwrap();
        let want: Vec<u32> = r["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(t.encode(text, false).unwrap(), want, "{text:?}");
        let mut with_bos = vec![1];
        with_bos.extend(&want);
        assert_eq!(t.encode(text, true).unwrap(), with_bos, "{text:?}");
        assert_eq!(t.decode(&want, false).unwrap(), text);
    }
}
