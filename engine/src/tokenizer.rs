//! Tokenizer and chat template: a Hugging Face `tokenizer.json` (through the
//! `tokenizers` crate) plus what `tokenizer_config.json` adds — special tokens, the eos
//! token and the Jinja chat template (rendered with minijinja, set up the way
//! transformers sets up Jinja2).
//!
//! Everything can be built from bytes, so the browser build needs no filesystem.

use minijinja::value::Value;
use minijinja::Environment;

use crate::error::{Error, Result};

mod fit;
mod grammar_vocab;
mod template;
pub use fit::{answer_reserve, fit_chat, fit_rendered, system_prefix_len, FittedChat};
pub(crate) use grammar_vocab::byte_level_byte;
pub use grammar_vocab::GrammarVocab;
use template::{template_env, template_error, TEMPLATE_NAME};
pub use template::{MAX_RENDERED_BYTES, MAX_TEMPLATE_BYTES, TEMPLATE_FUEL};

/// One chat turn, as transformers' `apply_chat_template` takes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

#[derive(Clone)]
enum ChatTemplate {
    /// No template; the string says why (shown by `apply_chat_template`).
    Missing(String),
    Ready(Box<Environment<'static>>),
    /// A template that failed to compile; the string is the error.
    Broken(String),
}

/// A Hugging Face tokenizer with its config: encode, decode, eos ids, chat template.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    vocab_size: usize,
    /// `*_token` entries of tokenizer_config (bos_token, eos_token, ...), as strings.
    special: Vec<(String, String)>,
    additional_special: Vec<String>,
    eos_ids: Vec<u32>,
    template: ChatTemplate,
    /// The vocabulary compiled for structured output, built on first use.
    grammar_vocab: std::sync::OnceLock<std::sync::Arc<GrammarVocab>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("special", &self.special)
            .field("eos_ids", &self.eos_ids)
            .field("has_chat_template", &self.has_chat_template())
            .finish()
    }
}

/// A special-token entry of tokenizer_config: a plain string or an AddedToken object.
fn token_string(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(m) => m.get("content").and_then(|c| c.as_str()).map(str::to_owned),
        _ => None,
    }
}

impl Tokenizer {
    /// Builds from the bytes of `tokenizer.json` and, optionally, `tokenizer_config.json`.
    pub fn from_bytes(tokenizer_json: &[u8], tokenizer_config_json: Option<&[u8]>) -> Result<Self> {
        let config = match tokenizer_config_json {
            Some(b) => Some(
                serde_json::from_slice(b).map_err(|json| Error::Json { path: "tokenizer_config.json".into(), json })?,
            ),
            None => None,
        };
        Self::build(tokenizer_json, config.as_ref(), "tokenizer.json")
    }

    /// Reads `dir/tokenizer.json` (required), `dir/tokenizer_config.json` (optional) and
    /// `dir/chat_template.jinja` (optional; it replaces the config's template, as in
    /// transformers).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn from_dir(dir: &std::path::Path) -> Result<Self> {
        use crate::fsio::{read_limited, read_optional, MAX_TOKENIZER_BYTES};
        let tok_path = dir.join("tokenizer.json");
        let tok_bytes = read_limited(&tok_path, MAX_TOKENIZER_BYTES)?;
        let cfg_path = dir.join("tokenizer_config.json");
        let config = match read_optional(&cfg_path, MAX_TOKENIZER_BYTES)? {
            Some(b) => Some(
                serde_json::from_slice::<serde_json::Value>(&b)
                    .map_err(|json| Error::Json { path: cfg_path.clone(), json })?,
            ),
            None => None,
        };
        let mut tok = Self::build(&tok_bytes, config.as_ref(), &tok_path.display().to_string())?;
        let jinja_path = dir.join("chat_template.jinja");
        if let Some(src) = read_optional(&jinja_path, MAX_TEMPLATE_BYTES as u64)? {
            match String::from_utf8(src) {
                Ok(src) => tok.set_chat_template(&src),
                Err(_) => tok.template = ChatTemplate::Broken(format!("{}: not UTF-8 text", jinja_path.display())),
            }
        }
        Ok(tok)
    }

    fn build(tokenizer_json: &[u8], config: Option<&serde_json::Value>, label: &str) -> Result<Self> {
        // The JSON is checked first: tokenizers 0.22 panics (an `expect` in its decoder's
        // Deserialize) on a syntax error or a bad string escape inside the "decoder"
        // object, found by fuzzing (fuzz/fuzz_targets/tokenizer.rs).
        serde_json::from_slice::<JsonSyntax>(tokenizer_json)
            .map_err(|e| Error::Tokenizer(format!("{label}: not a valid tokenizer.json: {e}")))?;
        let inner = tokenizers::Tokenizer::from_bytes(tokenizer_json)
            .map_err(|e| Error::Tokenizer(format!("{label}: not a valid tokenizer.json: {e}")))?;
        let vocab_size = inner.get_vocab(true).values().map(|&id| id as usize + 1).max().unwrap_or(0);
        let empty = serde_json::Map::new();
        let cfg = match config {
            None => &empty,
            Some(serde_json::Value::Object(m)) => m,
            Some(_) => return Err(Error::Tokenizer("tokenizer_config.json: expected a JSON object".into())),
        };
        let special: Vec<(String, String)> = cfg
            .iter()
            .filter(|(k, _)| k.ends_with("_token"))
            .filter_map(|(k, v)| token_string(v).map(|s| (k.clone(), s)))
            .collect();
        let additional_special = ["additional_special_tokens", "extra_special_tokens"]
            .iter()
            .filter_map(|k| cfg.get(*k).and_then(|v| v.as_array()))
            .flatten()
            .filter_map(token_string)
            .collect();
        let mut tok = Tokenizer {
            inner,
            vocab_size,
            special,
            additional_special,
            eos_ids: Vec::new(),
            template: ChatTemplate::Missing("tokenizer_config.json has no chat_template".into()),
            grammar_vocab: std::sync::OnceLock::new(),
        };
        if let Some(id) = tok.special_token("eos_token").and_then(|s| tok.token_to_id(s)) {
            tok.eos_ids.push(id);
        }
        match cfg.get("chat_template") {
            Some(serde_json::Value::String(src)) => tok.set_chat_template(src),
            Some(serde_json::Value::Array(list)) => {
                let named = |name: &str| list.iter().find(|t| t.get("name").and_then(|n| n.as_str()) == Some(name));
                match named("default").and_then(|t| t.get("template")).and_then(|t| t.as_str()) {
                    Some(src) => tok.set_chat_template(src),
                    None => {
                        tok.template = ChatTemplate::Missing(
                            "tokenizer_config.json has named chat templates but none called \"default\"".into(),
                        )
                    }
                }
            }
            _ => {}
        }
        Ok(tok)
    }

    /// Replaces the chat template. A template that does not compile is kept as an
    /// error that [`Tokenizer::apply_chat_template`] reports.
    pub fn set_chat_template(&mut self, source: &str) {
        if source.len() > MAX_TEMPLATE_BYTES {
            self.template = ChatTemplate::Broken(format!(
                "the template is {} bytes; at most {MAX_TEMPLATE_BYTES} are accepted",
                source.len()
            ));
            return;
        }
        self.template = match template_env(source) {
            Ok(env) => ChatTemplate::Ready(Box::new(env)),
            Err(e) => ChatTemplate::Broken(e),
        };
    }

    /// The string value of a `*_token` entry of tokenizer_config, e.g. "bos_token".
    pub fn special_token(&self, name: &str) -> Option<&str> {
        self.special.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The underlying `tokenizers` tokenizer.
    /// The vocabulary as structured output needs it (token bytes in a trie), built on the
    /// first call and shared after.
    pub fn grammar_vocab(&self) -> Result<std::sync::Arc<GrammarVocab>> {
        if let Some(v) = self.grammar_vocab.get() {
            return Ok(v.clone());
        }
        let v = std::sync::Arc::new(GrammarVocab::new(&self.inner, self.vocab_size)?);
        Ok(self.grammar_vocab.get_or_init(|| v).clone())
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        // encode_fast: the same ids without tracking offsets, which we never read (a 4 MiB
        // prompt took about 1.5 GB with them).
        let enc =
            self.inner.encode_fast(text, add_special_tokens).map_err(|e| Error::Tokenizer(format!("encode: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes `ids`; ids outside the vocabulary are skipped.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| Error::Tokenizer(format!("decode: {e}")))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// One more than the largest id, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The configured end-of-sequence ids: tokenizer_config's `eos_token` plus whatever
    /// [`Tokenizer::add_eos_ids`] added, without duplicates.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    /// Adds eos ids from config.json / generation_config.json.
    pub fn add_eos_ids(&mut self, ids: &[u32]) {
        for &id in ids {
            if !self.eos_ids.contains(&id) {
                self.eos_ids.push(id);
            }
        }
    }

    pub fn has_chat_template(&self) -> bool {
        !matches!(self.template, ChatTemplate::Missing(_))
    }

    /// Renders the chat template like transformers' `apply_chat_template(tokenize=False)`.
    /// Tokenize the result with `encode(.., false)`: the template writes its own bos.
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_chat(messages, None, add_generation_prompt)
    }

    /// [`Tokenizer::apply_chat_template`] with `tools` (OpenAI's list of
    /// `{"type": "function", "function": {...}}`) in the template's `tools` variable, as
    /// transformers passes them; a template that does not use it renders as without.
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &serde_json::Value,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_chat(messages, Some(tools), add_generation_prompt)
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let env = match &self.template {
            ChatTemplate::Ready(env) => env,
            ChatTemplate::Missing(why) => return Err(Error::Template(why.clone())),
            ChatTemplate::Broken(e) => return Err(Error::Template(e.clone())),
        };
        let mut ctx: Vec<(String, Value)> =
            self.special.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
        if !self.additional_special.is_empty() {
            ctx.push((
                "additional_special_tokens".into(),
                Value::from_iter(self.additional_special.iter().map(|s| Value::from(s.as_str()))),
            ));
        }
        let messages = messages.iter().map(|m| {
            Value::from_pairs([("role", Value::from(m.role.as_str())), ("content", Value::from(m.content.as_str()))])
        });
        ctx.push(("messages".into(), Value::from_iter(messages)));
        ctx.push(("add_generation_prompt".into(), Value::from(add_generation_prompt)));
        if let Some(t) = tools {
            ctx.push(("tools".into(), Value::from(minijinja::value::Serde(t))));
        }
        let tmpl = env.get_template(TEMPLATE_NAME).map_err(template_error)?;
        // Fuel (set on the environment) bounds the instructions run; this bounds the output.
        let mut out = template::CappedWriter::default();
        match tmpl.render_captured_to(Value::from_pairs(ctx), &mut out) {
            Ok(_) => String::from_utf8(out.buf).map_err(|_| Error::Template("the template wrote invalid UTF-8".into())),
            Err(_) if out.overflowed => {
                Err(Error::Template(format!("the rendered prompt is longer than {MAX_RENDERED_BYTES} bytes")))
            }
            Err(e) => Err(template_error(e)),
        }
    }

    /// `apply_chat_template` followed by `encode(.., false)`.
    pub fn encode_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>> {
        self.encode(&self.apply_chat_template(messages, add_generation_prompt)?, false)
    }
}

/// Streaming detokenizer: push ids one at a time, get back only text that is final.
///
/// Each step decodes a short window of recent ids and returns what the newest id added,
/// so decoders that look at neighbours (byte-level BPE, SentencePiece's leading space)
/// see their context. Text ending in U+FFFD (a character whose bytes are not all there
/// yet) is held back until later ids complete it; [`DecodeStream::finish`] flushes.
#[derive(Clone, Debug)]
pub struct DecodeStream {
    ids: Vec<u32>,
    skip_special_tokens: bool,
    prefix_offset: usize,
    read_offset: usize,
}

impl Default for DecodeStream {
    /// Skips special tokens (the eos is not printed).
    fn default() -> Self {
        Self::new(true)
    }
}

impl DecodeStream {
    pub fn new(skip_special_tokens: bool) -> Self {
        DecodeStream { ids: Vec::new(), skip_special_tokens, prefix_offset: 0, read_offset: 0 }
    }

    /// A stream that continues after `context` (e.g. the prompt): its last few ids are
    /// decoded as context but never returned.
    pub fn with_context(skip_special_tokens: bool, context: &[u32]) -> Self {
        let tail = &context[context.len().saturating_sub(4)..];
        DecodeStream { ids: tail.to_vec(), skip_special_tokens, prefix_offset: 0, read_offset: tail.len() }
    }

    /// The ids held (context tail, then everything pushed).
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Adds `id`; returns the text that became final (often empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        self.step(tok, false)
    }

    /// Returns whatever is still held back (an incomplete character comes out as U+FFFD).
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        self.step(tok, true)
    }

    fn step(&mut self, tok: &Tokenizer, flush: bool) -> Result<String> {
        let skip = self.skip_special_tokens;
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], skip)?;
        if full.len() <= prefix.len() || (!flush && full.ends_with('\u{FFFD}')) {
            return Ok(String::new());
        }
        let new = match full.strip_prefix(prefix.as_str()) {
            Some(rest) => rest.to_string(),
            None => {
                // The window decoded differently with the new id (should not happen with
                // the supported decoders): emit from the first byte that differs.
                let common = full
                    .char_indices()
                    .zip(prefix.chars())
                    .take_while(|((_, a), b)| a == b)
                    .last()
                    .map_or(0, |((i, a), _)| i + a.len_utf8());
                full[common..].to_string()
            }
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(new)
    }
}

/// Parses a JSON document whole, every string decoded (so a bad escape such as a lone
/// surrogate is an error, which `serde::de::IgnoredAny` lets through), keeping nothing.
struct JsonSyntax;

impl<'de> serde::Deserialize<'de> for JsonSyntax {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(JsonSyntax)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonSyntax {
    type Value = JsonSyntax;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> std::result::Result<Self, E> {
        Ok(self)
    }
    fn visit_i64<E>(self, _: i64) -> std::result::Result<Self, E> {
        Ok(self)
    }
    fn visit_u64<E>(self, _: u64) -> std::result::Result<Self, E> {
        Ok(self)
    }
    fn visit_f64<E>(self, _: f64) -> std::result::Result<Self, E> {
        Ok(self)
    }
    fn visit_str<E>(self, _: &str) -> std::result::Result<Self, E> {
        Ok(self)
    }
    fn visit_unit<E>(self) -> std::result::Result<Self, E> {
        Ok(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self, A::Error> {
        while seq.next_element::<JsonSyntax>()?.is_some() {}
        Ok(self)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self, A::Error> {
        while map.next_entry::<JsonSyntax, JsonSyntax>()?.is_some() {}
        Ok(self)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod gguf_tests;
