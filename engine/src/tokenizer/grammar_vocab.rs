//! The vocabulary as llguidance (structured output, `generate::grammar`) sees it, built once
//! per tokenizer ([`GrammarVocab`], [`super::Tokenizer::grammar_vocab`]): the bytes each token stands for, in a token trie
//! (`TokTrie`), plus one virtual end-of-sequence token after the vocabulary.
//!
//! The bytes come from the tokenizer's pieces the way the tokenizer's decoder turns them
//! into text (`toktrie_hf_tokenizers` does the same, but for an older `tokenizers`):
//! byte-level BPE maps each piece character back to its byte, SentencePiece pieces turn
//! the space marker into a space and `<0xHH>` byte-fallback pieces into that byte.
//! Special added tokens get toktrie's special-token marker, so no text grammar can
//! produce them; the stop ids are allowed through the virtual end-of-sequence token.

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use tokenizers::DecoderWrapper;

use llguidance::ParserFactory;

use crate::error::{Error, Result};

/// How the decoder turns a piece into text.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Spelling {
    /// GPT-2 byte-level BPE: every piece character stands for one byte.
    ByteLevel,
    /// SentencePiece: `space` stands for " ", `<0xHH>` pieces for one byte.
    Pieces { space: char },
}

fn spelling(d: &DecoderWrapper, found: &mut Option<Spelling>) {
    match d {
        DecoderWrapper::ByteLevel(_) => *found = Some(Spelling::ByteLevel),
        DecoderWrapper::ByteFallback(_) if found.is_none() => *found = Some(Spelling::Pieces { space: '\u{2581}' }),
        DecoderWrapper::Metaspace(m) => *found = Some(Spelling::Pieces { space: m.get_replacement() }),
        DecoderWrapper::Replace(r) => {
            // The pattern field is private: read it from the serialised form.
            let v = serde_json::to_value(r).unwrap_or_default();
            let pat = v["pattern"]["String"].as_str().unwrap_or_default();
            let mut chars = pat.chars();
            if let (Some(c), None, Some(" ")) = (chars.next(), chars.next(), v["content"].as_str()) {
                *found = Some(Spelling::Pieces { space: c });
            }
        }
        DecoderWrapper::Sequence(s) => {
            for d in s.get_decoders() {
                spelling(d, found);
            }
        }
        _ => {}
    }
}

/// The bytes of every token id below `n` (the tokenizer's vocabulary size); special
/// added tokens start with [`TokTrie::SPECIAL_TOKEN_MARKER`], ids without a piece are
/// empty (never allowed).
pub fn token_bytes(tok: &tokenizers::Tokenizer, n: usize) -> Result<Vec<Vec<u8>>> {
    let mut found = None;
    if let Some(d) = tok.get_decoder() {
        spelling(d, &mut found);
    }
    let Some(how) = found else {
        return Err(Error::Invalid(
            "structured output needs a byte-level or SentencePiece tokenizer; this tokenizer's decoder is neither"
                .into(),
        ));
    };
    let mut out = vec![Vec::new(); n];
    let added = tok.get_added_tokens_decoder();
    for (id, piece) in out.iter_mut().enumerate() {
        let id = id as u32;
        if let Some(a) = added.get(&id) {
            *piece = if a.special || (a.content.starts_with('<') && a.content.ends_with('>')) {
                let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                b.extend_from_slice(a.content.as_bytes());
                b
            } else {
                a.content.as_bytes().to_vec()
            };
            continue;
        }
        let Some(name) = tok.id_to_token(id) else { continue };
        *piece = match how {
            // A piece that is not byte-level text cannot be spelled: empty, never allowed.
            Spelling::ByteLevel => name.chars().map(byte_level_byte).collect::<Option<Vec<u8>>>().unwrap_or_default(),
            Spelling::Pieces { space } => {
                let hex = name.strip_prefix("<0x").and_then(|s| s.strip_suffix('>'));
                match hex.filter(|h| h.len() == 2).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => vec![b],
                    None => name.replace(space, " ").into_bytes(),
                }
            }
        };
    }
    Ok(out)
}

/// A token trie over the vocabulary plus the virtual end-of-sequence token `eos`.
struct Env {
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Only used to force tokens, which colibri never asks for (the tokenization is
    /// not canonical): greedy longest-match over the trie.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The vocabulary of `tok` for llguidance: ids `0..vocab_size` are the tokenizer's,
/// id `vocab_size` is the virtual end-of-sequence token (the returned id).
pub fn tok_env(tok: &tokenizers::Tokenizer, vocab_size: usize) -> Result<(TokEnv, u32)> {
    let mut words = token_bytes(tok, vocab_size)?;
    let eos = vocab_size as u32;
    let mut marker = vec![TokTrie::SPECIAL_TOKEN_MARKER];
    marker.extend_from_slice(b"<|colibri_eos|>");
    words.push(marker);
    let info = TokRxInfo::new(eos + 1, eos);
    let env: TokEnv = Arc::new(Env { trie: TokTrie::from(&info, &words) });
    Ok((env, eos))
}

/// llguidance's compiled view of a tokenizer's vocabulary (built once per tokenizer:
/// `Tokenizer::grammar_vocab`).
pub struct GrammarVocab {
    pub(crate) factory: ParserFactory,
    /// The virtual end-of-sequence id (one past the tokenizer's vocabulary).
    pub(crate) eos: u32,
}

impl GrammarVocab {
    pub(crate) fn new(tok: &tokenizers::Tokenizer, vocab_size: usize) -> Result<Self> {
        let (env, eos) = tok_env(tok, vocab_size)?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| Error::Grammar(e.to_string()))?;
        // Warnings and errors come back as values, never printed.
        factory.quiet();
        Ok(GrammarVocab { factory, eos })
    }
}

/// The GPT-2 byte-level alphabet backwards: the byte each printable stand-in char encodes.
pub(crate) fn byte_level_byte(c: char) -> Option<u8> {
    let c = c as u32;
    let direct = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    if c < 256 && direct(c) {
        return Some(c as u8);
    }
    // The other bytes were mapped, in order, to 256, 257, ...
    let mut n = 256;
    for b in 0u32..256 {
        if !direct(b) {
            if n == c {
                return Some(b as u8);
            }
            n += 1;
        }
    }
    None
}
