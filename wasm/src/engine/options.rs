//! The options of `Engine::begin` (what `generate(...)` passes), as the worker sends them.

use std::collections::BTreeMap;

use colibri_engine::generate::request::stop_list;
use colibri_engine::generate::{Fallback, Grammar, SamplingDefaults, SamplingRequest, Turn, TurnRequest};
use colibri_engine::sampler::SamplerConfig;
use colibri_engine::Error;
use serde::Deserialize;
use serde_json::Value;

use super::JsFail;

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
    /// Stop strings (one or a list of up to 16): the text ends before the first one.
    pub(super) stop: Option<Value>,
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
    /// An OpenAI chat request as the page gave it (`chat.completions.create`): then the
    /// settings above are not read (but `draft`; `sharedPrefix` below is), the request's
    /// are, checked as the
    /// helper's API checks them.
    pub(super) openai: Option<Value>,
    /// Leading ids that other conversations likely share (a system prompt: `chatPrompt`'s
    /// `shared`): a model whose state goes back only to snapshots (Gated DeltaNet,
    /// DeepSeek-V4) ends a prompt pass there. 0: where the prompt leaves the last one.
    pub(super) shared_prefix: usize,
}

/// Completion tokens of an OpenAI request that names no limit (the context may allow fewer).
pub(super) const OPENAI_MAX_TOKENS: usize = 256;

/// What a generation does, from either kind of options, checked.
pub(super) struct TurnSettings {
    pub(super) max_new_tokens: usize,
    pub(super) sampler: SamplerConfig,
    pub(super) ignore_eos: bool,
    pub(super) stop: Vec<String>,
    pub(super) logprobs: Option<usize>,
    pub(super) grammar: Option<Grammar>,
    pub(super) speculate: usize,
}

/// An OpenAI chat request's turn, checked as the helper's `/v1/chat/completions` checks it
/// (the engine's [`TurnRequest`]); function calling is the helper's alone.
pub(super) fn openai_turn(req: &Value) -> Result<Turn, JsFail> {
    if req.get("tools").and_then(Value::as_array).is_some_and(|t| !t.is_empty()) {
        let why = "tools are not supported by the browser engine; use the helper's /v1/chat/completions";
        return Err(Error::param("tools", why).into());
    }
    Ok(TurnRequest::from_value(req)?.check(None, false)?)
}

impl GenOptions {
    /// The settings: the request's, else the model's `defaults` (generation_config.json),
    /// else the surface's fallback (greedy for `generate`, OpenAI's temperature 1 for an
    /// OpenAI request); a sampler out of range is an error naming the setting.
    pub(super) fn turn(&self, vocab: usize, defaults: &SamplingDefaults) -> Result<TurnSettings, JsFail> {
        let Some(req) = &self.openai else {
            let request = SamplingRequest {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                repetition_penalty: self.repetition_penalty,
                seed: Some(self.seed),
                frequency_penalty: self.frequency_penalty,
                presence_penalty: self.presence_penalty,
                logit_bias: self.logit_bias.clone(),
            };
            let sampler = defaults.resolve(&request, &Fallback::Greedy.config(0));
            sampler.validate_params(vocab)?;
            return Ok(TurnSettings {
                max_new_tokens: self.max_new_tokens,
                sampler,
                ignore_eos: self.ignore_eos,
                stop: stop_list(self.stop.as_ref())?,
                logprobs: self.logprobs.then_some(self.top_logprobs),
                grammar: self.grammar()?,
                speculate: self.speculate,
            });
        };
        let mut turn = openai_turn(req)?;
        let r = TurnRequest::from_value(req)?;
        let logprobs = r.chat_logprobs()?;
        let speculate = match r.speculate.as_ref() {
            None | Some(Value::Null) | Some(Value::Bool(false)) => 0,
            Some(v) => v.as_u64().map(|n| n.min(usize::MAX as u64) as usize).ok_or_else(|| {
                Error::param("speculate", "speculate must be a whole number of draft tokens per step")
            })?,
        };
        // No seed: a fresh one, as the helper draws one.
        turn.sampling.seed.get_or_insert_with(|| (js_sys::Math::random() * 2f64.powi(53)) as u64);
        let openai = Fallback::OpenAi.config(0);
        Ok(TurnSettings {
            max_new_tokens: turn.max_tokens.map_or(OPENAI_MAX_TOKENS, |t| t.min(usize::MAX as u64) as usize),
            sampler: turn.sampler(defaults, &openai, vocab)?,
            ignore_eos: turn.ignore_eos,
            stop: turn.stop,
            logprobs,
            grammar: turn.grammar.map(|g| g.0),
            speculate,
        })
    }

    pub(super) fn grammar(&self) -> Result<Option<Grammar>, JsFail> {
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
            all.extend(Grammar::from_response_format(f).map_err(|e| JsFail::msg(&e))?);
        }
        if all.len() > 1 {
            return Err(JsFail::msg("give one of jsonSchema, grammar, regex, response_format"));
        }
        Ok(all.pop())
    }
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            max_new_tokens: 32,
            temperature: None,
            top_k: None,
            top_p: None,
            repetition_penalty: None,
            seed: 0,
            frequency_penalty: None,
            presence_penalty: None,
            logit_bias: BTreeMap::new(),
            ignore_eos: false,
            stop: None,
            logprobs: false,
            top_logprobs: 0,
            json_schema: None,
            grammar: None,
            regex: None,
            response_format: None,
            speculate: 0,
            draft: None,
            openai: None,
            shared_prefix: 0,
        }
    }
}

/// generate()'s options (`text`) that do not parse. JSON nested past serde_json's 128
/// levels (a jsonSchema far past the engine's depth limit) is named as such, counted by the
/// engine's `json_nesting` (not read from the parser's message text).
pub(super) fn options_err(text: &str) -> impl FnOnce(serde_json::Error) -> JsFail + '_ {
    use colibri_engine::generate::grammar::limits::{json_nesting, MAX_JSON_NESTING, MAX_SCHEMA_DEPTH};
    move |e| {
        match json_nesting(text.as_bytes()) >= MAX_JSON_NESTING {
        true => JsFail::msg(&format!(
            "options: nested more than 128 levels deep (a jsonSchema nests at most {MAX_SCHEMA_DEPTH} levels: deeper than that is refused)"
        )),
        false => JsFail::msg(&e.to_string()),
    }
    }
}

/// load()'s options.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct LoadOptions {
    /// RAM tier budget for experts in bytes (default 512 MiB).
    pub(super) ram_bytes: Option<u64>,
    /// Bytes of the RAM tier kept for the experts pinned by learned usage (default: a
    /// quarter of it when the model has usage, as natively; `default_pin`).
    pub(super) pin_bytes: Option<u64>,
    /// Use the persistent OPFS tier (default true; the worker attaches it).
    pub(super) disk: Option<bool>,
    /// Bytes the disk tier may hold for this model (default: [`super::DISK_SHARE`] of the
    /// origin's quota, `navigator.storage.estimate()`).
    pub(super) disk_bytes: Option<u64>,
    /// "auto" (default: WebGPU if present and measured faster here), "webgpu" or "cpu".
    pub(super) backend: Option<String>,
    /// WebGPU: "off" (default: every routed expert on the GPU), "on" (experts missing from
    /// the GPU pool run on the CPU threads while the GPU computes) or "auto" (as on, how
    /// many chosen by measured cost); the tokens are the same.
    pub(super) hybrid: Option<String>,
    /// WebGPU: bytes of GPU memory for routed experts (default: four times the adapter's
    /// largest buffer, at most 2 GiB).
    pub(super) gpu_pool_bytes: Option<u64>,
    /// The disk tier: "auto" (default: OPFS, else IndexedDB), "opfs" or "indexeddb".
    pub(super) storage: Option<String>,
    /// Whether the server answers several ranges in one request (default true, as the
    /// helper does; the worker asks a static host first).
    pub(super) multi_range: Option<bool>,
}
