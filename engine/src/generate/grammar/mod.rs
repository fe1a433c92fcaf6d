//! Structured output: a [`Grammar`] (JSON Schema, any JSON object, a regular expression,
//! a Lark or GBNF grammar) compiled by llguidance into a [`Constraint`] that the
//! [`Generator`](super::Generator) applies token by token: before each draw, every token
//! the grammar does not allow next gets logit -inf (the stop ids only where the grammar
//! may end), then the usual sampler runs; the drawn token advances the grammar.
//!
//! The mask is integer work on llguidance's token trie and is applied before the sampler
//! in one fixed order, so the CPU, the server and the browser draw the same tokens. When
//! the grammar is complete (nothing can follow), generation stops with `stop`; when the
//! token budget runs out first, it ends with `length` and the output is a prefix of a
//! valid one (never claimed complete).
//!
//! Before anything is compiled, [`Grammar::check_limits`] refuses input deeper or larger
//! than what compiles on a small stack ([`limits`]); the first mask is computed while
//! compiling, so a grammar past llguidance's own limits is refused there too.

mod gbnf;
pub mod limits;

use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;
use llguidance::{JsonCompileOptions, Matcher};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::tokenizer::{GrammarVocab, Tokenizer};

pub use gbnf::gbnf_to_lark;

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON Schema. `lenient`: keywords llguidance does not support are ignored
    /// instead of refused (OpenAI `strict: false`).
    JsonSchema { schema: Value, lenient: bool },
    /// A grammar in llguidance's Lark dialect (start rule `start`).
    Lark(String),
    /// A grammar in llama.cpp's GBNF (start rule `root`).
    Gbnf(String),
    /// A regular expression (Rust `regex` syntax) the whole output must match.
    Regex(String),
}

impl Grammar {
    /// A grammar file's text: GBNF when a line defines a rule with `::=`, else Lark.
    pub fn from_text(text: &str) -> Grammar {
        let gbnf = text.lines().any(|l| {
            let l = l.trim_start();
            let name_len = l.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')).unwrap_or(l.len());
            name_len > 0 && l[name_len..].trim_start().starts_with("::=")
        });
        if gbnf {
            Grammar::Gbnf(text.to_string())
        } else {
            Grammar::Lark(text.to_string())
        }
    }

    /// OpenAI's `response_format`: None for `text` (or null); `json_object` (llama.cpp
    /// also takes a `schema` in it); `json_schema` with `{name, schema, strict}` (without
    /// `strict: true`, schema keywords llguidance does not know are ignored rather than
    /// refused). The error says what is wrong with it.
    pub fn from_response_format(v: &Value) -> std::result::Result<Option<Grammar>, String> {
        if v.is_null() {
            return Ok(None);
        }
        match v.get("type").and_then(Value::as_str) {
            Some("text") => Ok(None),
            Some("json_object") => Ok(Some(match v.get("schema") {
                Some(s) if !s.is_null() => Grammar::json_schema(s.clone()),
                _ => Grammar::JsonObject,
            })),
            Some("json_schema") => {
                let js = v.get("json_schema").filter(|j| j.is_object());
                let js = js.ok_or("response_format json_schema needs a json_schema object with a schema")?;
                let strict = js.get("strict").and_then(Value::as_bool).unwrap_or(false);
                // OpenAI allows no schema: any JSON value.
                let schema = js.get("schema").cloned().unwrap_or_else(|| serde_json::json!({}));
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err("response_format.json_schema.schema must be a JSON Schema object".into());
                }
                Ok(Some(Grammar::JsonSchema { schema, lenient: !strict }))
            }
            Some(t) => Err(format!("response_format type `{t}` is not one of text, json_object, json_schema")),
            None => Err("response_format must be an object with a type".into()),
        }
    }

    /// A strict JSON Schema.
    pub fn json_schema(schema: Value) -> Grammar {
        Grammar::JsonSchema { schema, lenient: false }
    }

    fn to_llguidance(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(with_json_style(serde_json::json!({"type": "object"}), false))
            }
            Grammar::JsonSchema { schema, lenient } => {
                TopLevelGrammar::from_json_schema(with_json_style(schema.clone(), *lenient))
            }
            Grammar::Lark(s) => TopLevelGrammar::from_lark(s.clone()),
            Grammar::Gbnf(s) => TopLevelGrammar::from_lark(gbnf_to_lark(s)?),
            Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
        })
    }
}

/// How colibri writes JSON under a schema unless the schema's own `x-guidance` says
/// otherwise: `", "` between items, `": "` after keys, no other whitespace (free
/// whitespace lets a small model pad forever instead of closing the object).
pub fn with_json_style(mut schema: Value, lenient: bool) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        if !obj.contains_key("x-guidance") {
            let style = JsonCompileOptions {
                item_separator: ", ".into(),
                key_separator: ": ".into(),
                whitespace_flexible: false,
                lenient,
                ..JsonCompileOptions::default()
            };
            style.apply_to(&mut schema);
        }
    }
    schema
}

/// A compiled grammar following one generation.
pub struct Constraint {
    matcher: Matcher,
    vocab: Arc<GrammarVocab>,
    masked: Vec<f32>,
    /// The first mask, computed while compiling.
    first: Option<SimpleVob>,
}

/// llguidance's message on one line (its Lark errors quote the grammar over several),
/// without the parser state and grammar dump that its mid-generation errors append.
fn grammar_err(e: impl std::fmt::Display) -> Error {
    let msg = e.to_string();
    let lines: Vec<&str> = msg
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("<state>") && !l.starts_with("<grammar>"))
        .filter(|l| !l.is_empty())
        .collect();
    Error::Grammar(lines.join(" | "))
}

/// Stops a compilation ([`Constraint::new_cancellable`]) from another thread. llguidance
/// builds a grammar's parser with no way to stop it (its own limits bound that work), then
/// computes the first mask cooperatively cancellable: a cancel while the parser is built
/// skips the mask, one during the mask stops it mid-way. Either way the compilation answers
/// [`Error::Cancelled`].
#[derive(Clone, Default)]
pub struct CompileCancel(Arc<Mutex<CancelState>>);

#[derive(Default)]
struct CancelState {
    cancelled: bool,
    handle: Option<llguidance::CancellationHandle>,
}

impl CompileCancel {
    pub fn cancel(&self) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.cancelled = true;
        if let Some(h) = &s.handle {
            h.cancel();
        }
    }
}

impl Constraint {
    /// Compiles `grammar` for `tok`'s vocabulary and computes its first mask; a grammar past
    /// the [`limits`], or one llguidance refuses (its syntax, or its own limits on size and
    /// work), gives [`Error::Grammar`] (or [`Error::Invalid`]) with the reason.
    pub fn new(tok: &Tokenizer, grammar: &Grammar) -> Result<Self> {
        Self::new_cancellable(tok, grammar, None)
    }

    /// [`Constraint::new`] that `cancel` can stop ([`CompileCancel`]).
    pub fn new_cancellable(tok: &Tokenizer, grammar: &Grammar, cancel: Option<&CompileCancel>) -> Result<Self> {
        grammar.check_limits()?;
        let vocab = tok.grammar_vocab()?;
        let parser = vocab.factory.create_parser(grammar.to_llguidance()?).map_err(grammar_err)?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(grammar_err(e));
        }
        if let Some(c) = cancel {
            matcher = matcher.into_cancellable();
            let mut s = c.0.lock().unwrap_or_else(|e| e.into_inner());
            if s.cancelled {
                return Err(Error::Cancelled);
            }
            s.handle = matcher.cancellation_handle();
        }
        let first = match matcher.compute_mask() {
            Ok(m) => m,
            Err(e) if e.is::<llguidance::Cancelled>() || matcher.is_cancelled() => return Err(Error::Cancelled),
            Err(e) => return Err(grammar_err(e)),
        };
        // Compiled: a later cancel leaves this constraint alone.
        if let Some(c) = cancel {
            c.0.lock().unwrap_or_else(|e| e.into_inner()).handle = None;
        }
        Ok(Constraint { matcher, vocab, masked: Vec::new(), first: Some(first) })
    }

    /// `logits` with every token the grammar does not allow next at -inf; the stop ids
    /// keep their logit only where the grammar may end. Errors when nothing is allowed
    /// (the vocabulary cannot spell what the grammar needs).
    pub fn mask(&mut self, logits: &[f32], stop_ids: &[u32]) -> Result<&[f32]> {
        let allowed = match self.first.take() {
            Some(m) => m,
            None => self.matcher.compute_mask().map_err(grammar_err)?,
        };
        let eos = self.vocab.eos as usize;
        self.masked.clear();
        self.masked.extend(logits.iter().enumerate().map(|(i, &x)| {
            if i < eos && allowed.get(i) {
                x
            } else {
                f32::NEG_INFINITY
            }
        }));
        let may_end = allowed.get(eos);
        for &s in stop_ids {
            if let Some(x) = self.masked.get_mut(s as usize) {
                *x = if may_end { logits[s as usize] } else { f32::NEG_INFINITY };
            }
        }
        if self.masked.iter().all(|&x| x == f32::NEG_INFINITY || x.is_nan()) {
            return Err(Error::Grammar("no token of this model's vocabulary can continue the output here".into()));
        }
        Ok(&self.masked)
    }

    /// Advances the grammar by the drawn token (not a stop id).
    pub fn consume(&mut self, id: u32) -> Result<()> {
        self.first = None;
        self.matcher.consume_token(id).map_err(grammar_err)
    }

    /// The output is complete and nothing can follow it.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The output so far is a complete match (more may still follow).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests;
