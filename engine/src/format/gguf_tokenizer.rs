//! The tokenizer of a GGUF file, rebuilt as Hugging Face `tokenizer.json` and
//! `tokenizer_config.json` from its `tokenizer.ggml.*` metadata, so the engine's
//! tokenizer (the `tokenizers` crate) and chat template (minijinja) load it unchanged.
//!
//! `tokenizer.ggml.model` "gpt2" (byte-level BPE: tokens, merges, token types) is read;
//! its `tokenizer.ggml.pre` names llama.cpp's pre-tokenizer, mapped here to the same
//! regex (llama.cpp's src/llama-vocab.cpp); an unknown one is refused rather than guessed.
//! SentencePiece vocabularies ("llama") are refused for now.

use serde_json::{json, Map, Value as Json};

use super::gguf::{Array, Gguf, Value};
use crate::error::{Error, Result};

/// llama.cpp's token types (llama_token_type).
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// Qwen2's split regex (llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2; Qwen's tokenizer.json).
const QWEN2: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's (LLAMA_VOCAB_PRE_TYPE_LLAMA3): numbers in runs of up to three digits.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn err(msg: String) -> Error {
    Error::Tokenizer(format!("GGUF metadata: {msg}"))
}

fn strings<'a>(g: &'a Gguf, key: &str) -> Result<Option<&'a [String]>> {
    match g.get(key) {
        None => Ok(None),
        Some(Value::Array(Array::Str(v))) => Ok(Some(v)),
        Some(_) => Err(err(format!("{key} is not an array of strings"))),
    }
}

fn token_id(g: &Gguf, key: &str, n: usize) -> Result<Option<u32>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => match v.as_i64() {
            Some(id) if id >= 0 && (id as usize) < n => Ok(Some(id as u32)),
            // llama.cpp writes -1 (as u32::MAX in some files) for "none".
            Some(-1) | Some(0xFFFF_FFFF) => Ok(None),
            _ => Err(err(format!("{key} {v:?} is not a token id below {n}"))),
        },
    }
}

/// The pre-tokenizer for llama.cpp's `tokenizer.ggml.pre` name, plus `ignore_merges`.
fn pre_tokenizer(pre: &str) -> Result<(Json, bool)> {
    let byte_level =
        |regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": regex});
    let split = |re: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false},
            byte_level(false)
        ]})
    };
    Ok(match pre {
        // GPT-2's own regex, which ByteLevel applies itself ("olmo" is llama.cpp's name for
        // the same expression).
        "default" | "gpt-2" | "gpt2" | "olmo" => (byte_level(true), false),
        "qwen2" => (split(QWEN2), false),
        "llama-bpe" | "llama3" => (split(LLAMA3), true),
        other => {
            return Err(err(format!(
                "tokenizer.ggml.pre {other:?} is a pre-tokenizer colibri does not know (known: gpt-2, olmo, qwen2, llama-bpe)"
            )))
        }
    })
}

/// `tokenizer.json` and `tokenizer_config.json` for the GGUF's vocabulary; `context` is
/// the model's context length (the config's `model_max_length`).
pub fn tokenizer_files(g: &Gguf, context: Option<u64>) -> Result<(Vec<u8>, Vec<u8>)> {
    let model = g.get("tokenizer.ggml.model").and_then(Value::as_str).ok_or_else(|| {
        err("no tokenizer.ggml.model: the file has no tokenizer (colibri needs one to run the model)".into())
    })?;
    if model != "gpt2" {
        return Err(err(format!(
            "tokenizer.ggml.model {model:?} is not supported yet (only \"gpt2\" byte-level BPE); convert the Hugging Face checkpoint instead"
        )));
    }
    let tokens = strings(g, "tokenizer.ggml.tokens")?.ok_or_else(|| err("no tokenizer.ggml.tokens".into()))?;
    let n = tokens.len();
    let types = match g.get("tokenizer.ggml.token_type") {
        None => vec![1; n],
        Some(Value::Array(a)) => a.to_i64().ok_or_else(|| err("tokenizer.ggml.token_type is not integers".into()))?,
        Some(_) => return Err(err("tokenizer.ggml.token_type is not an array".into())),
    };
    if types.len() != n {
        return Err(err(format!("{} token types for {n} tokens", types.len())));
    }
    let merges = strings(g, "tokenizer.ggml.merges")?.unwrap_or(&[]);
    for m in merges {
        if m.split(' ').count() != 2 {
            return Err(err(format!("merge {m:?} is not two tokens separated by one space")));
        }
    }
    let pre = g.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
    let (pre_tok, ignore_merges) = pre_tokenizer(pre)?;

    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, (tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        // A repeated token keeps its first id (a JSON vocabulary maps each string once).
        if !vocab.contains_key(tok) {
            vocab.insert(tok.clone(), json!(id));
        }
        if ty == CONTROL || ty == USER_DEFINED {
            added.push(json!({"id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                              "normalized": ty == USER_DEFINED, "special": ty == CONTROL}));
        }
    }
    let bos = token_id(g, "tokenizer.ggml.bos_token_id", n)?;
    let eos = token_id(g, "tokenizer.ggml.eos_token_id", n)?;
    let pad = token_id(g, "tokenizer.ggml.padding_token_id", n)?;
    let add_bos = matches!(g.get("tokenizer.ggml.add_bos_token"), Some(Value::Bool(true)));
    let post = match (add_bos, bos) {
        (true, Some(b)) => {
            let t = &tokens[b as usize];
            json!({"type": "TemplateProcessing",
                   "single": [{"SpecialToken": {"id": t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                   "pair": [{"SpecialToken": {"id": t, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                            {"SpecialToken": {"id": t, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                   "special_tokens": {t: {"id": t, "ids": [b], "tokens": [t]}}})
        }
        _ => Json::Null,
    };
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added, "normalizer": null, "pre_tokenizer": pre_tok, "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges},
    });
    let mut cfg = Map::new();
    cfg.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    cfg.insert("clean_up_tokenization_spaces".into(), json!(false));
    cfg.insert("add_bos_token".into(), json!(add_bos));
    for (key, id) in [("bos_token", bos), ("eos_token", eos), ("pad_token", pad)] {
        if let Some(id) = id {
            cfg.insert(key.into(), json!(tokens[id as usize]));
        }
    }
    if let Some(c) = context {
        cfg.insert("model_max_length".into(), json!(c));
    }
    match g.get("tokenizer.chat_template") {
        None => {}
        Some(Value::Str(t)) => {
            cfg.insert("chat_template".into(), json!(t));
        }
        Some(_) => return Err(err("tokenizer.chat_template is not a string".into())),
    }
    let to_vec = |v: &Json| serde_json::to_vec_pretty(v).map_err(|e| err(e.to_string()));
    Ok((to_vec(&tokenizer)?, to_vec(&Json::Object(cfg))?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::gguf::tests::{gstr, Writer};

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
        let t = crate::tokenizer::Tokenizer::from_bytes(&tok, Some(&cfg))?;
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
        let e = encode("made-up").unwrap_err().to_string();
        assert!(e.contains("\"made-up\""), "{e}");
    }
}
