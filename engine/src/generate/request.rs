//! One turn's request, as every surface takes it: OpenAI's request fields (what the
//! server's `/v1` endpoints read, and what the browser engine's `chat.completions.create`
//! passes through untouched), checked here once, so that the server and the browser accept
//! and refuse exactly the same parameters, each refusal an [`Error::Param`] naming the
//! parameter. The sampler is then the request's settings, else the model's
//! generation_config.json ([`SamplingDefaults`]), else the surface's fallback.
//!
//! Parameters that do not change the output (`user`, `metadata`, `store`, `service_tier`,
//! `prompt_cache_key`, `safety_identifier`, `parallel_tool_calls`) and unknown ones are
//! ignored, as OpenAI clients send many; parameters that would change it and cannot be
//! honoured are refused by name.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::defaults::{SamplingDefaults, SamplingRequest};
use super::grammar::Grammar;
use super::logprobs::MAX_TOP_LOGPROBS;
use crate::error::{Error, Result};
use crate::sampler::{SamplerConfig, MAX_LOGIT_BIAS, MAX_LOGIT_BIAS_ENTRIES, MAX_PENALTY};

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 16;

/// The fields of a request that shape a turn (flattened into the server's endpoint
/// bodies; the browser's request as it is). Each is a JSON value, so that a value of the
/// wrong type is refused naming its parameter.
#[derive(Deserialize, Default, Clone, Debug)]
pub struct TurnRequest {
    pub temperature: Option<Value>,
    pub top_p: Option<Value>,
    /// llama.cpp's and vLLM's extensions.
    pub top_k: Option<Value>,
    pub repetition_penalty: Option<Value>,
    pub ignore_eos: Option<Value>,
    pub seed: Option<Value>,
    pub max_tokens: Option<Value>,
    pub max_completion_tokens: Option<Value>,
    /// A string or a list of up to [`MAX_STOP`].
    pub stop: Option<Value>,
    pub n: Option<Value>,
    /// Chat: a boolean (with `top_logprobs`); completions: the number of alternatives.
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<Value>,
    pub response_format: Option<Value>,
    /// llama.cpp's extension: a GBNF (or Lark) grammar the output must match.
    pub grammar: Option<Value>,
    /// colibri's extension: speculative decoding for this request (the surface decides
    /// what it allows).
    pub speculate: Option<Value>,
    pub frequency_penalty: Option<Value>,
    pub presence_penalty: Option<Value>,
    /// `{"token id": bias}`.
    pub logit_bias: Option<Value>,
    /// Completions: more candidates than the one returned.
    pub best_of: Option<Value>,
    /// Output other than text, predicted outputs, web search, the pre-tools function calls,
    /// reasoning controls, completions' suffix: what colibri cannot do.
    pub audio: Option<Value>,
    pub modalities: Option<Value>,
    pub prediction: Option<Value>,
    pub web_search_options: Option<Value>,
    pub functions: Option<Value>,
    pub function_call: Option<Value>,
    pub reasoning_effort: Option<Value>,
    pub verbosity: Option<Value>,
    pub suffix: Option<Value>,
}

/// A request, checked: what the turn does.
#[derive(Clone, Debug, Default)]
pub struct Turn {
    /// The request's sampling settings (None: the model's default, else the fallback).
    pub sampling: SamplingRequest,
    /// Stop strings: the text ends before the first one.
    pub stop: Vec<String>,
    /// `max_completion_tokens`, else `max_tokens` (None: the surface's default).
    pub max_tokens: Option<u64>,
    /// Generate past the model's end-of-sequence ids.
    pub ignore_eos: bool,
    /// Structured output and the parameter it came from (`tools`, `response_format`,
    /// `grammar`).
    pub grammar: Option<(Grammar, &'static str)>,
}

fn set(v: &Option<Value>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_null())
}

/// A present, non-null value.
fn given(v: &Option<Value>) -> Option<&Value> {
    v.as_ref().filter(|v| !v.is_null())
}

fn number(v: &Option<Value>, name: &'static str) -> Result<Option<f32>> {
    match given(v) {
        None => Ok(None),
        Some(x) => {
            x.as_f64().map(|f| Some(f as f32)).ok_or_else(|| Error::param(name, format!("{name} must be a number")))
        }
    }
}

fn whole(v: &Option<Value>, name: &'static str) -> Result<Option<u64>> {
    match given(v) {
        None => Ok(None),
        Some(x) => {
            x.as_u64().map(Some).ok_or_else(|| Error::param(name, format!("{name} must be a whole number >= 0")))
        }
    }
}

impl TurnRequest {
    /// Reads a request body (a JSON object; unknown fields are ignored).
    pub fn from_value(v: &Value) -> Result<Self> {
        if !v.is_object() {
            return Err(Error::Invalid("the request must be a JSON object".into()));
        }
        TurnRequest::deserialize(v).map_err(|e| Error::Invalid(format!("the request: {e}")))
    }

    /// Checks every parameter, in the order the server always has (one error: the first),
    /// and returns the turn. `tools`: the grammar of function calling, when the surface
    /// has it (the server's chat). `echo`: completions that return the prompt, where
    /// `max_tokens` 0 scores the prompt alone.
    pub fn check(&self, tools: Option<Grammar>, echo: bool) -> Result<Turn> {
        if given(&self.n).is_some_and(|n| n.as_u64() != Some(1)) {
            return Err(Error::param("n", "only n = 1 is supported"));
        }
        let grammar = self.structured(tools)?;
        if grammar.is_some() && self.stop.is_some() {
            return Err(Error::Param {
                name: grammar.as_ref().map_or("stop", |g| g.1),
                message: "stop cannot be combined with structured output: the grammar decides where the output ends"
                    .into(),
            });
        }
        let stop = stop_list(self.stop.as_ref())?;
        self.refuse_unsupported()?;
        let mut sampling = SamplingRequest {
            temperature: number(&self.temperature, "temperature")?,
            top_k: whole(&self.top_k, "top_k")?.map(|k| k.min(usize::MAX as u64) as usize),
            top_p: number(&self.top_p, "top_p")?,
            repetition_penalty: number(&self.repetition_penalty, "repetition_penalty")?,
            seed: match given(&self.seed) {
                None => None,
                // OpenAI's seed is a signed 64-bit integer; its bits are the sampler's seed.
                Some(s) => Some(
                    s.as_i64()
                        .map(|s| s as u64)
                        .or_else(|| s.as_u64())
                        .ok_or_else(|| Error::param("seed", "seed must be an integer"))?,
                ),
            },
            ..SamplingRequest::default()
        };
        for (name, v) in [("frequency_penalty", &self.frequency_penalty), ("presence_penalty", &self.presence_penalty)]
        {
            let p = number(v, name)?;
            if let Some(x) = p.filter(|x| !(x.is_finite() && x.abs() <= MAX_PENALTY)) {
                return Err(Error::param(name, format!("{name} must be between -2 and 2, got {x}")));
            }
            match name {
                "frequency_penalty" => sampling.frequency_penalty = p,
                _ => sampling.presence_penalty = p,
            }
        }
        sampling.logit_bias = logit_bias(self.logit_bias.as_ref())?;
        let ignore_eos = match given(&self.ignore_eos) {
            None => false,
            Some(b) => b.as_bool().ok_or_else(|| Error::param("ignore_eos", "ignore_eos must be a boolean"))?,
        };
        let max_tokens = self.max_tokens()?;
        // max_tokens 0 with echo scores the prompt alone.
        if max_tokens == Some(0) && !echo {
            return Err(Error::param("max_tokens", "max_tokens must be at least 1"));
        }
        Ok(Turn { sampling, stop, max_tokens, ignore_eos, grammar })
    }

    /// `max_completion_tokens`, else `max_tokens` (None: neither).
    pub fn max_tokens(&self) -> Result<Option<u64>> {
        match whole(&self.max_completion_tokens, "max_completion_tokens")? {
            Some(n) => Ok(Some(n)),
            None => whole(&self.max_tokens, "max_tokens"),
        }
    }

    /// One constraint at most: from tools, response_format or grammar.
    fn structured(&self, tools: Option<Grammar>) -> Result<Option<(Grammar, &'static str)>> {
        let mut all: Vec<(Grammar, &'static str)> = Vec::new();
        if let Some(t) = tools {
            all.push((t, "tools"));
        }
        if let Some(f) = &self.response_format {
            if let Some(g) = Grammar::from_response_format(f).map_err(|e| Error::param("response_format", e))? {
                all.push((g, "response_format"));
            }
        }
        match given(&self.grammar) {
            None => {}
            Some(Value::String(g)) if g.trim().is_empty() => {}
            Some(Value::String(g)) => all.push((Grammar::from_text(g), "grammar")),
            Some(_) => return Err(Error::param("grammar", "grammar must be a string (GBNF or Lark)")),
        }
        if all.len() > 1 {
            let names: Vec<&str> = all.iter().map(|g| g.1).collect();
            return Err(Error::param(all[1].1, format!("{} cannot be combined", names.join(" and "))));
        }
        let grammar = all.pop();
        if let Some((g, name)) = &grammar {
            g.check_limits().map_err(|e| Error::param(name, format!("{name}: {e}")))?;
        }
        Ok(grammar)
    }

    /// What cannot be honoured, by name.
    fn refuse_unsupported(&self) -> Result<()> {
        let refused: [(&'static str, bool, &str); 10] = [
            (
                "best_of",
                set(&self.best_of) && self.best_of.as_ref().and_then(Value::as_u64) != Some(1),
                "only best_of = 1 is supported",
            ),
            ("audio", set(&self.audio), "audio output is not supported"),
            (
                "modalities",
                set(&self.modalities) && self.modalities != Some(serde_json::json!(["text"])),
                "only the text modality is supported",
            ),
            ("prediction", set(&self.prediction), "predicted outputs are not supported"),
            ("web_search_options", set(&self.web_search_options), "web search is not supported"),
            ("functions", set(&self.functions), "functions is not supported; use tools"),
            ("function_call", set(&self.function_call), "function_call is not supported; use tool_choice"),
            ("reasoning_effort", set(&self.reasoning_effort), "reasoning_effort is not supported"),
            ("verbosity", set(&self.verbosity), "verbosity is not supported"),
            ("suffix", set(&self.suffix), "suffix is not supported"),
        ];
        match refused.into_iter().find(|r| r.1) {
            Some((name, _, msg)) => Err(Error::param(name, msg)),
            None => Ok(()),
        }
    }

    /// Chat: `logprobs` (a boolean) and `top_logprobs` (0 to 20, needs logprobs): the
    /// alternatives per token, or None for no logprobs.
    pub fn chat_logprobs(&self) -> Result<Option<usize>> {
        let on = match given(&self.logprobs) {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(Error::param("logprobs", "logprobs must be a boolean")),
        };
        let top = match given(&self.top_logprobs) {
            None => None,
            Some(v) => Some(top_count(v, "top_logprobs")?),
        };
        match (on, top) {
            (false, Some(_)) => Err(Error::param("top_logprobs", "top_logprobs needs logprobs: true")),
            (false, None) => Ok(None),
            (true, n) => Ok(Some(n.unwrap_or(0))),
        }
    }

    /// Completions: `logprobs` is the number of alternatives (0 to 20).
    pub fn completion_logprobs(&self) -> Result<Option<usize>> {
        given(&self.logprobs).map(|v| top_count(v, "logprobs")).transpose()
    }
}

/// `stop`: a string or a list of up to [`MAX_STOP`] strings (None or null: none).
pub fn stop_list(v: Option<&Value>) -> Result<Vec<String>> {
    let bad = || Error::param("stop", "stop must be a string or a list of strings");
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) if a.len() > MAX_STOP => {
            Err(Error::param("stop", format!("at most {MAX_STOP} stop sequences")))
        }
        Some(Value::Array(a)) => a.iter().map(|s| s.as_str().map(str::to_string).ok_or_else(bad)).collect(),
        Some(_) => Err(bad()),
    }
}

/// A whole number in 0..=MAX_TOP_LOGPROBS, or an error naming `name`.
fn top_count(v: &Value, name: &'static str) -> Result<usize> {
    v.as_u64()
        .filter(|&n| n as usize <= MAX_TOP_LOGPROBS)
        .map(|n| n as usize)
        .ok_or_else(|| Error::param(name, format!("{name} must be an integer between 0 and {MAX_TOP_LOGPROBS}")))
}

/// OpenAI's `logit_bias`: an object from token ids (as strings) to numbers in -100..=100.
fn logit_bias(v: Option<&Value>) -> Result<BTreeMap<u32, f32>> {
    let bad = |m: String| Error::param("logit_bias", m);
    let map = match v {
        None | Some(Value::Null) => return Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(bad("logit_bias must be an object mapping token ids to numbers".into())),
    };
    if map.len() > MAX_LOGIT_BIAS_ENTRIES {
        return Err(bad(format!("logit_bias has {} entries; at most {MAX_LOGIT_BIAS_ENTRIES}", map.len())));
    }
    let mut out = BTreeMap::new();
    for (k, v) in map {
        let id: u32 = k.trim().parse().map_err(|_| bad(format!("logit_bias key {k:?} is not a token id")))?;
        let b = v
            .as_f64()
            .filter(|b| b.is_finite() && b.abs() <= MAX_LOGIT_BIAS as f64)
            .ok_or_else(|| bad(format!("logit_bias for token {id} must be a number between -100 and 100")))?;
        out.insert(id, b as f32);
    }
    Ok(out)
}

impl Turn {
    /// The sampler: each setting from the request, else the model's `defaults`, else
    /// `fallback`'s; its ranges and logit_bias ids (against a vocabulary of `vocab`)
    /// checked, an [`Error::Param`] naming the setting.
    pub fn sampler(
        &self,
        defaults: &SamplingDefaults,
        fallback: &SamplerConfig,
        vocab: usize,
    ) -> Result<SamplerConfig> {
        let s = defaults.resolve(&self.sampling, fallback);
        s.validate_params(vocab)?;
        Ok(s)
    }
}

/// Chat's `truncation`: "auto" (default: the oldest turns that do not fit the context
/// are dropped) or "disabled" (refused instead): whether to truncate.
pub fn truncation(v: Option<&Value>) -> Result<bool> {
    match v {
        None | Some(Value::Null) => Ok(true),
        Some(Value::String(s)) if s == "auto" => Ok(true),
        Some(Value::String(s)) if s == "disabled" => Ok(false),
        Some(_) => Err(Error::param("truncation", "truncation must be \"auto\" or \"disabled\"")),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
