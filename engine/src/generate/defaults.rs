//! Sampling defaults, in one place for every surface: what the request says, else what
//! the model's generation_config.json says, else the surface's own fallback (greedy for
//! `coli generate`, OpenAI's temperature 1 for the API).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::sampler::SamplerConfig;

/// The sampling settings of a generation_config.json. `do_sample: false` means greedy,
/// as in transformers; a missing key leaves the choice to the request or the fallback.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

/// Each surface's fallback, where neither the request nor the model's
/// generation_config.json says: decided here, not by each surface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Greedy: `coli generate`, `coli bench`, the browser's `engine.generate()`.
    Greedy,
    /// OpenAI's temperature 1 (top_p 1): the server's `/v1` endpoints and the browser's
    /// `chat.completions.create`.
    OpenAi,
    /// `coli chat`: temperature 0.7, top_p 0.95.
    Chat,
}

impl Fallback {
    /// The fallback sampler, with `seed` (used when the request gives none).
    pub fn config(self, seed: u64) -> SamplerConfig {
        let (temperature, top_p) = match self {
            Fallback::Greedy => (0.0, 1.0),
            Fallback::OpenAi => (1.0, 1.0),
            Fallback::Chat => (0.7, 0.95),
        };
        SamplerConfig { temperature, top_p, seed, ..SamplerConfig::default() }
    }
}

/// What a request asked for; None takes the default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingRequest {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<u64>,
    /// OpenAI's penalties and bias (no model default: a checkpoint's generation_config has
    /// none of them); None / empty is off.
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub logit_bias: BTreeMap<u32, f32>,
}

impl SamplingDefaults {
    /// Reads a parsed generation_config.json (anything else gives no defaults).
    pub fn from_generation_config(g: &Value) -> Self {
        let num = |k: &str| g.get(k).and_then(Value::as_f64).filter(|x| x.is_finite()).map(|x| x as f32);
        if g.get("do_sample").and_then(Value::as_bool) == Some(false) {
            return SamplingDefaults {
                temperature: Some(0.0),
                top_k: None,
                top_p: Some(1.0),
                repetition_penalty: None,
            };
        }
        SamplingDefaults {
            temperature: num("temperature"),
            // transformers' top_k default is 50 when sampling; 0 or absent leaves it off here.
            top_k: g.get("top_k").and_then(Value::as_u64).map(|k| k as usize),
            top_p: num("top_p"),
            repetition_penalty: num("repetition_penalty"),
        }
    }

    /// Reads generation_config.json bytes; unreadable JSON gives no defaults.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        serde_json::from_slice::<Value>(bytes).map(|v| Self::from_generation_config(&v)).unwrap_or_default()
    }

    /// The sampler for `req`: each field from the request, else this model's default, else
    /// `fallback`'s (the seed comes from the request or the fallback).
    pub fn resolve(&self, req: &SamplingRequest, fallback: &SamplerConfig) -> SamplerConfig {
        SamplerConfig {
            temperature: req.temperature.or(self.temperature).unwrap_or(fallback.temperature),
            top_k: req.top_k.or(self.top_k).unwrap_or(fallback.top_k),
            top_p: req.top_p.or(self.top_p).unwrap_or(fallback.top_p),
            repetition_penalty: req
                .repetition_penalty
                .or(self.repetition_penalty)
                .unwrap_or(fallback.repetition_penalty),
            seed: req.seed.unwrap_or(fallback.seed),
            frequency_penalty: req.frequency_penalty.unwrap_or(fallback.frequency_penalty),
            presence_penalty: req.presence_penalty.unwrap_or(fallback.presence_penalty),
            logit_bias: if req.logit_bias.is_empty() { fallback.logit_bias.clone() } else { req.logit_bias.clone() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn request_then_generation_config_then_fallback() {
        let openai = SamplerConfig { temperature: 1.0, seed: 9, ..SamplerConfig::default() };
        let greedy = SamplingDefaults::from_generation_config(&json!({"do_sample": false, "temperature": 0.6}));
        assert_eq!(greedy.temperature, Some(0.0));
        assert_eq!(greedy.resolve(&SamplingRequest::default(), &openai).temperature, 0.0);
        let req = SamplingRequest { temperature: Some(0.8), seed: Some(3), ..Default::default() };
        let c = greedy.resolve(&req, &openai);
        assert_eq!((c.temperature, c.seed, c.top_p), (0.8, 3, 1.0));

        let sampled = SamplingDefaults::from_generation_config(
            &json!({"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.1}),
        );
        let c = sampled.resolve(&SamplingRequest::default(), &openai);
        assert_eq!((c.temperature, c.top_p, c.top_k, c.repetition_penalty, c.seed), (0.6, 0.95, 20, 1.1, 9));

        // No sampling keys (the fixtures' configs) and unreadable files: the fallback.
        let none = SamplingDefaults::from_generation_config(&json!({"eos_token_id": 2}));
        assert_eq!(none, SamplingDefaults::default());
        assert_eq!(SamplingDefaults::from_bytes(b"{not json"), SamplingDefaults::default());
        assert_eq!(none.resolve(&SamplingRequest::default(), &openai), openai);
        // OpenAI's penalties and bias come from the request alone.
        let req = SamplingRequest {
            presence_penalty: Some(0.5),
            logit_bias: [(7, -100.0)].into_iter().collect(),
            ..Default::default()
        };
        let c = sampled.resolve(&req, &openai);
        assert_eq!((c.presence_penalty, c.frequency_penalty, c.logit_bias.get(&7)), (0.5, 0.0, Some(&-100.0)));
    }
}
