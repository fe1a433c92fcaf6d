use serde_json::{json, Value};

use super::*;

fn req(v: Value) -> TurnRequest {
    TurnRequest::from_value(&v).unwrap()
}

fn refused(v: Value) -> Error {
    req(v).check(None, false).unwrap_err()
}

#[test]
fn penalties_and_bias_reach_the_request() {
    let t = req(json!({"frequency_penalty": 0.5, "presence_penalty": -1, "logit_bias": {"12": 100, " 7": -100.0}}))
        .check(None, false)
        .unwrap();
    let r = t.sampling;
    assert_eq!((r.frequency_penalty, r.presence_penalty), (Some(0.5), Some(-1.0)));
    assert_eq!(r.logit_bias.into_iter().collect::<Vec<_>>(), [(7, -100.0), (12, 100.0)]);
    let t =
        req(json!({"logit_bias": null, "best_of": 1, "modalities": ["text"], "user": "x"})).check(None, false).unwrap();
    assert_eq!(t.sampling, SamplingRequest::default());
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
        (json!({"suffix": "x"}), "suffix"),
        (json!({"frequency_penalty": 2.5}), "frequency_penalty"),
        (json!({"presence_penalty": -3}), "presence_penalty"),
        (json!({"logit_bias": [1, 2]}), "logit_bias"),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
        (json!({"logit_bias": {"5": 101}}), "logit_bias"),
        (json!({"logit_bias": {"5": "high"}}), "logit_bias"),
        // Values of the wrong type name their parameter too.
        (json!({"top_k": -1}), "top_k"),
        (json!({"top_k": 1.5}), "top_k"),
        (json!({"temperature": "hot"}), "temperature"),
        (json!({"seed": "x"}), "seed"),
        (json!({"stop": 5}), "stop"),
        (json!({"stop": ["a", 1]}), "stop"),
        (json!({"stop": vec!["x"; 17]}), "stop"),
        (json!({"ignore_eos": "yes"}), "ignore_eos"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": -5}), "max_tokens"),
        (json!({"n": 2}), "n"),
        (json!({"grammar": 5}), "grammar"),
        (json!({"response_format": {"type": "xml"}}), "response_format"),
        (json!({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}), "grammar"),
        (json!({"stop": "x", "response_format": {"type": "json_object"}}), "response_format"),
    ] {
        let e = refused(body.clone());
        assert_eq!((e.param_name(), e.code()), (Some(param), "invalid_parameter"), "{body}: {e}");
    }
    // max_tokens 0 scores the prompt alone under echo.
    assert_eq!(req(json!({"max_tokens": 0})).check(None, true).unwrap().max_tokens, Some(0));
}

#[test]
fn the_sampler_is_the_request_then_the_model_then_the_fallback_and_is_checked() {
    let t = req(json!({"top_k": 2, "stop": " =", "seed": -1, "max_tokens": 9, "max_completion_tokens": 5}))
        .check(None, false)
        .unwrap();
    assert_eq!((t.stop.clone(), t.max_tokens, t.sampling.seed), (vec![" =".to_string()], Some(5), Some(u64::MAX)));
    let openai = SamplerConfig { temperature: 1.0, ..SamplerConfig::default() };
    let model = SamplingDefaults { top_p: Some(0.9), ..Default::default() };
    let s = t.sampler(&model, &openai, 100).unwrap();
    assert_eq!((s.top_k, s.top_p, s.temperature), (2, 0.9, 1.0));
    let t = req(json!({"top_p": 2})).check(None, false).unwrap();
    assert_eq!(t.sampler(&model, &openai, 100).unwrap_err().param_name(), Some("top_p"));
    let t = req(json!({"logit_bias": {"4096": 1}})).check(None, false).unwrap();
    assert_eq!(t.sampler(&model, &openai, 4096).unwrap_err().param_name(), Some("logit_bias"));
}

#[test]
fn logprobs_and_truncation() {
    assert_eq!(req(json!({"logprobs": true, "top_logprobs": 3})).chat_logprobs().unwrap(), Some(3));
    assert_eq!(req(json!({})).chat_logprobs().unwrap(), None);
    assert_eq!(req(json!({"top_logprobs": 3})).chat_logprobs().unwrap_err().param_name(), Some("top_logprobs"));
    assert_eq!(req(json!({"logprobs": 2})).chat_logprobs().unwrap_err().param_name(), Some("logprobs"));
    assert_eq!(req(json!({"logprobs": 2})).completion_logprobs().unwrap(), Some(2));
    assert_eq!(req(json!({"logprobs": 21})).completion_logprobs().unwrap_err().param_name(), Some("logprobs"));
    assert!(truncation(Some(&json!("auto"))).unwrap());
    assert!(!truncation(Some(&json!("disabled"))).unwrap());
    assert_eq!(truncation(Some(&json!("off"))).unwrap_err().param_name(), Some("truncation"));
}
