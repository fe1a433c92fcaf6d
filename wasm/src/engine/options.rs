//! The options of `Engine::begin` (what `generate(...)` passes), as the worker sends them.

use std::collections::BTreeMap;

use colibri_engine::generate::Grammar;
use serde::Deserialize;
use wasm_bindgen::prelude::*;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct GenOptions {
    pub(super) max_new_tokens: usize,
    /// Sampling settings; absent ones come from generation_config.json, else greedy.
    pub(super) temperature: Option<f32>,
    pub(super) top_k: Option<usize>,
    pub(super) top_p: Option<f32>,
    pub(super) repetition_penalty: Option<f32>,
    pub(super) seed: u64,
    /// OpenAI's frequency and presence penalties (-2 to 2) over the tokens this generation
    /// produced, and logit bias ({id: -100 to 100}); absent: off.
    pub(super) frequency_penalty: Option<f32>,
    pub(super) presence_penalty: Option<f32>,
    pub(super) logit_bias: BTreeMap<u32, f32>,
    pub(super) ignore_eos: bool,
    /// Stop strings: the text ends before the first one.
    pub(super) stop: Vec<String>,
    /// Record each token's log-probability (taken with `takeLogprobs`).
    pub(super) logprobs: bool,
    /// Alternatives per token with `logprobs` (0 to 20).
    pub(super) top_logprobs: usize,
    /// Structured output (one at most): a JSON Schema, a GBNF or Lark grammar, a
    /// regular expression, or OpenAI's `response_format`.
    pub(super) json_schema: Option<serde_json::Value>,
    pub(super) grammar: Option<String>,
    pub(super) regex: Option<String>,
    pub(super) response_format: Option<serde_json::Value>,
    /// Speculative decoding from prompt lookup: most draft tokens per step (0: off).
    pub(super) speculate: usize,
    /// "mtp": the drafts come from the model's own MTP layer (CPU backend), `speculate`
    /// per step (1 if 0); "model": from the draft model (`loadDraft`), 4 if 0.
    pub(super) draft: Option<String>,
}

impl GenOptions {
    pub(super) fn grammar(&self) -> Result<Option<Grammar>, JsError> {
        let mut all = Vec::new();
        if let Some(s) = &self.json_schema {
            all.push(Grammar::json_schema(s.clone()));
        }
        if let Some(g) = &self.grammar {
            all.push(Grammar::from_text(g));
        }
        if let Some(r) = &self.regex {
            all.push(Grammar::Regex(r.clone()));
        }
        if let Some(f) = &self.response_format {
            all.extend(Grammar::from_response_format(f).map_err(|e| JsError::new(&e))?);
        }
        if all.len() > 1 {
            return Err(JsError::new("give one of jsonSchema, grammar, regex, response_format"));
        }
        Ok(all.pop())
    }
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            max_new_tokens: 128,
            temperature: None,
            top_k: None,
            top_p: None,
            repetition_penalty: None,
            seed: 0,
            frequency_penalty: None,
            presence_penalty: None,
            logit_bias: BTreeMap::new(),
            ignore_eos: false,
            stop: Vec::new(),
            logprobs: false,
            top_logprobs: 0,
            json_schema: None,
            grammar: None,
            regex: None,
            response_format: None,
            speculate: 0,
            draft: None,
        }
    }
}
