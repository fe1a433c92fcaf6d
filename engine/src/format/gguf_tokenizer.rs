//! The tokenizer of a GGUF file, rebuilt as Hugging Face `tokenizer.json` and
//! `tokenizer_config.json` from its `tokenizer.ggml.*` metadata, so the engine's
//! tokenizer (the `tokenizers` crate) and chat template (minijinja) load it unchanged.
//!
//! `tokenizer.ggml.model` "gpt2" (byte-level BPE: tokens, merges, token types) is read;
//! its `tokenizer.ggml.pre` names llama.cpp's pre-tokenizer, mapped here to the same
//! regex (llama.cpp's src/llama-vocab.cpp); an unknown one is refused rather than guessed.
//! "llama" (SentencePiece BPE: pieces, scores, token types; Mixtral, Llama 2) becomes the
//! tokenizer.json of Mixtral's own (legacy) Llama tokenizer: a prepend-U+2581 normalizer,
//! BPE with byte fallback, merges derived from the scores.

use std::collections::HashMap;

use serde_json::{json, Map, Value as Json};

use super::gguf::{Array, Gguf, Value};
use crate::error::{Error, Result};

/// llama.cpp's token types (llama_token_type).
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// Qwen2's split regex (llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2; Qwen's tokenizer.json).
const QWEN2: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's (LLAMA_VOCAB_PRE_TYPE_LLAMA3): numbers in runs of up to three digits.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// o200k's (LLAMA_VOCAB_PRE_TYPE_GPT4O: gpt-oss, GPT-4o; the regex of their
/// tokenizer.json): cased words with their contractions, digit runs of up to three.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Kimi-K2's (LLAMA_VOCAB_PRE_TYPE_KIMI_K2; the `pat_str` of its tokenization_kimi.py,
/// which llama.cpp hand-codes): o200k's with runs of Han first and Han taken out of the
/// letter classes.
const KIMI_K2: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

/// DeepSeek-V3's three splits in turn (LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM; DeepSeek-V3's
/// tokenizer.json): digit runs of up to three, runs of CJK ideographs and kana, then the rest.
const DEEPSEEK3: [&str; 3] = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

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
    let splits = |res: &[&str]| {
        let mut seq: Vec<Json> = res
            .iter()
            .map(|re| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false}))
            .collect();
        seq.push(byte_level(false));
        json!({"type": "Sequence", "pretokenizers": seq})
    };
    let split = |re: &str| splits(&[re]);
    Ok(match pre {
        // GPT-2's own regex, which ByteLevel applies itself ("olmo" is llama.cpp's name for
        // the same expression).
        "default" | "gpt-2" | "gpt2" | "olmo" => (byte_level(true), false),
        "qwen2" => (split(QWEN2), false),
        "llama-bpe" | "llama3" => (split(LLAMA3), true),
        // GLM-4.5's (LLAMA_VOCAB_PRE_TYPE_CHATGLM4 with ignore_merges): Llama 3's regex.
        "glm4" | "glm5" => (split(LLAMA3), true),
        "deepseek-v3" => (splits(&DEEPSEEK3), false),
        "gpt-4o" => (split(GPT4O), false),
        "kimi-k2" => (split(KIMI_K2), false),
        other => {
            return Err(err(format!(
                "tokenizer.ggml.pre {other:?} is a pre-tokenizer colibri does not know (known: gpt-2, olmo, qwen2, llama-bpe, glm4, deepseek-v3, gpt-4o, kimi-k2)"
            )))
        }
    })
}

/// Merges of a SentencePiece BPE vocabulary, derived as transformers'
/// SentencePieceExtractor does for Llama's tokenizer.json: every split of a piece into two
/// pieces of the vocabulary, highest score of the merged piece first; ties in the order
/// of the merged piece's id, then the ids of its halves.
fn spm_merges(tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
    let mut id: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        id.insert(t.as_str(), i); // a repeated piece keeps its last id, as a Python dict does
    }
    let mut merges: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (i, piece) in tokens.iter().enumerate() {
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&a), Some(&b)) = (id.get(l), id.get(r)) {
                merges.push((scores[i], i, a, b));
            }
        }
    }
    merges.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)).then(x.3.cmp(&y.3)));
    merges.into_iter().map(|(_, _, a, b)| (tokens[a].clone(), tokens[b].clone())).collect()
}

/// `tokenizer.json` and `tokenizer_config.json` for the GGUF's vocabulary; `context` is
/// the model's context length (the config's `model_max_length`).
pub fn tokenizer_files(g: &Gguf, context: Option<u64>) -> Result<(Vec<u8>, Vec<u8>)> {
    let model = g.get("tokenizer.ggml.model").and_then(Value::as_str).ok_or_else(|| {
        err("no tokenizer.ggml.model: the file has no tokenizer (colibri needs one to run the model)".into())
    })?;
    if model != "gpt2" && model != "llama" {
        return Err(err(format!(
            "tokenizer.ggml.model {model:?} is not supported (colibri reads \"gpt2\" byte-level BPE and \"llama\" SentencePiece BPE); convert the Hugging Face checkpoint instead"
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
    let spm = model == "llama";
    let merges: Vec<Json> = if spm {
        let scores = match g.get("tokenizer.ggml.scores") {
            Some(Value::Array(Array::F32(v))) if v.len() == n => v,
            _ => return Err(err(format!("a SentencePiece vocabulary needs tokenizer.ggml.scores: {n} f32"))),
        };
        spm_merges(tokens, scores).into_iter().map(|(a, b)| json!([a, b])).collect()
    } else {
        let merges = strings(g, "tokenizer.ggml.merges")?.unwrap_or(&[]);
        for m in merges {
            if m.split(' ').count() != 2 {
                return Err(err(format!("merge {m:?} is not two tokens separated by one space")));
            }
        }
        merges.iter().map(|m| json!(m)).collect()
    };
    // SentencePiece: spaces become U+2581 and, with add_space_prefix (SentencePiece's
    // add_dummy_prefix, default on), one is prepended even before leading spaces, as
    // sentencepiece and llama.cpp do (a Metaspace pre-tokenizer would not add it there).
    let (normalizer, pre_tok, ignore_merges) = if spm {
        let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
        let norm = match g.get("tokenizer.ggml.add_space_prefix") {
            Some(Value::Bool(false)) => replace,
            _ => json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u{2581}"}, replace]}),
        };
        (norm, Json::Null, false)
    } else {
        let (p, i) = pre_tokenizer(g.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default"))?;
        (Json::Null, p, i)
    };

    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, (tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        // A repeated token keeps its first id (a JSON vocabulary maps each string once).
        if !vocab.contains_key(tok) {
            vocab.insert(tok.clone(), json!(id));
        }
        if ty == CONTROL || ty == USER_DEFINED || ty == UNKNOWN {
            added.push(json!({"id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                              "normalized": ty == USER_DEFINED, "special": ty != USER_DEFINED}));
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
    let unk = if spm {
        let id = token_id(g, "tokenizer.ggml.unknown_token_id", n)?
            .or_else(|| types.iter().position(|&t| t == UNKNOWN).map(|i| i as u32));
        id.map(|i| json!(tokens[i as usize]))
    } else {
        None
    };
    let decoder = if spm {
        json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})
    } else {
        json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true})
    };
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added, "normalizer": normalizer, "pre_tokenizer": pre_tok, "post_processor": post,
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": spm, "byte_fallback": spm,
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
