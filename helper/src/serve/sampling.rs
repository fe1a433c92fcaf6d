//! The OpenAI request parameters that shape sampling beyond temperature and top_p:
//! `frequency_penalty`, `presence_penalty` and `logit_bias` (OpenAI's semantics, applied by
//! the engine's one sampler, [`colibri_engine::sampler`]), and the parameters the server
//! cannot honour, which are refused with a 400 naming them instead of being ignored.
//!
//! Parameters that do not change the output (`user`, `metadata`, `store`,
//! `service_tier`, `prompt_cache_key`, `safety_identifier`, `parallel_tool_calls`) and
//! unknown ones are still ignored, as OpenAI clients send many.

use std::collections::BTreeMap;

use colibri_engine::generate::SamplingRequest;
use colibri_engine::sampler::{SamplerConfig, MAX_LOGIT_BIAS, MAX_LOGIT_BIAS_ENTRIES, MAX_PENALTY};
use serde::Deserialize;
use serde_json::Value;

use super::api_error::ApiError;

/// The request fields read here (flattened into the endpoints' parameters).
#[derive(Deserialize, Default)]
pub(super) struct SamplingParams {
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    /// `{"token id": bias}`; a Value, so that a bad key or value gets a 400 naming it.
    logit_bias: Option<Value>,
    /// Completions: more candidates than the one returned.
    best_of: Option<Value>,
    /// Output other than text, predicted outputs, web search, the pre-tools function calls,
    /// reasoning controls: what this server cannot do.
    audio: Option<Value>,
    modalities: Option<Value>,
    prediction: Option<Value>,
    web_search_options: Option<Value>,
    functions: Option<Value>,
    function_call: Option<Value>,
    reasoning_effort: Option<Value>,
    verbosity: Option<Value>,
}

fn set(v: &Option<Value>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_null())
}

impl SamplingParams {
    /// Refuses what cannot be honoured, checks ranges, and fills `req`'s penalties and bias.
    pub(super) fn apply(&self, req: &mut SamplingRequest) -> Result<(), ApiError> {
        let refused: [(&'static str, bool, &str); 9] = [
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
        ];
        if let Some((param, _, msg)) = refused.into_iter().find(|r| r.1) {
            return Err(ApiError::invalid(msg, Some(param)));
        }
        for (param, v) in [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)] {
            if let Some(v) = v.filter(|v| !(v.is_finite() && v.abs() <= MAX_PENALTY)) {
                return Err(ApiError::invalid(format!("{param} must be between -2 and 2, got {v}"), Some(param)));
            }
        }
        req.frequency_penalty = self.frequency_penalty;
        req.presence_penalty = self.presence_penalty;
        req.logit_bias = logit_bias(self.logit_bias.as_ref())?;
        Ok(())
    }
}

/// OpenAI's `logit_bias`: an object from token ids (as strings) to numbers in -100..=100.
fn logit_bias(v: Option<&Value>) -> Result<BTreeMap<u32, f32>, ApiError> {
    let bad = |m: String| ApiError::invalid(m, Some("logit_bias"));
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

/// The resolved sampler's ranges, and its logit_bias ids against the model's vocabulary;
/// a 400 naming the parameter.
pub(super) fn check(sampler: &SamplerConfig, vocab: usize) -> Result<(), ApiError> {
    sampler.validate_vocab(vocab).map_err(|e| {
        let msg = e.to_string();
        let param = [
            "temperature",
            "top_p",
            "top_k",
            "repetition_penalty",
            "frequency_penalty",
            "presence_penalty",
            "logit_bias",
        ]
        .into_iter()
        .find(|p| msg.contains(p));
        ApiError::invalid(msg, param)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(v: Value) -> SamplingParams {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn penalties_and_bias_reach_the_request() {
        let mut req = SamplingRequest::default();
        params(json!({"frequency_penalty": 0.5, "presence_penalty": -1, "logit_bias": {"12": 100, " 7": -100.0}}))
            .apply(&mut req)
            .unwrap();
        assert_eq!((req.frequency_penalty, req.presence_penalty), (Some(0.5), Some(-1.0)));
        assert_eq!(req.logit_bias.into_iter().collect::<Vec<_>>(), [(7, -100.0), (12, 100.0)]);
        let mut req = SamplingRequest::default();
        params(json!({"logit_bias": null, "best_of": 1, "modalities": ["text"], "user": "x"})).apply(&mut req).unwrap();
        assert_eq!(req, SamplingRequest::default());
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        for (body, param) in [
            (json!({"best_of": 2}), "best_of"),
            (json!({"audio": {"voice": "alloy"}}), "audio"),
            (json!({"modalities": ["text", "audio"]}), "modalities"),
            (json!({"prediction": {"type": "content", "content": "x"}}), "prediction"),
            (json!({"functions": [{"name": "f"}]}), "functions"),
            (json!({"function_call": "auto"}), "function_call"),
            (json!({"reasoning_effort": "low"}), "reasoning_effort"),
            (json!({"frequency_penalty": 2.5}), "frequency_penalty"),
            (json!({"presence_penalty": -3}), "presence_penalty"),
            (json!({"logit_bias": [1, 2]}), "logit_bias"),
            (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
            (json!({"logit_bias": {"5": 101}}), "logit_bias"),
            (json!({"logit_bias": {"5": "high"}}), "logit_bias"),
        ] {
            let e = params(body.clone()).apply(&mut SamplingRequest::default()).unwrap_err();
            assert_eq!(e.param, Some(param), "{body}: {}", e.message);
        }
        let c = SamplerConfig { logit_bias: [(4096, 1.0)].into_iter().collect(), ..Default::default() };
        let e = check(&c, 4096).unwrap_err();
        assert_eq!(e.param, Some("logit_bias"), "{}", e.message);
        let e = check(&SamplerConfig { top_p: 2.0, ..Default::default() }, 10).unwrap_err();
        assert_eq!(e.param, Some("top_p"), "{}", e.message);
    }
}
