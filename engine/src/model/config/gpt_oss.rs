//! The gpt_oss parts of config.json (transformers' `GptOssConfig`): the clamped SwiGLU,
//! the router, the alternating sliding window and the default YaRN rope. Absent fields
//! take transformers' defaults; what the engine does not implement is refused with the
//! field named.

use serde_json::Value;

use super::{get_f64, get_usize, layer_types, Activation, RouterConfig, Scoring};
use crate::error::{Error, Result};

/// The experts' clamped SwiGLU: `swiglu_alpha` (default 1.702) and `swiglu_limit` (7.0).
pub(super) fn activation(v: &Value) -> Result<Activation> {
    let alpha = get_f64(v, "swiglu_alpha").unwrap_or(1.702) as f32;
    let limit = get_f64(v, "swiglu_limit").unwrap_or(7.0) as f32;
    if !(alpha.is_finite() && limit.is_finite() && limit >= 0.0) {
        return Err(Error::Config(format!(
            "swiglu_alpha = {alpha} and swiglu_limit = {limit} must be finite, the limit >= 0"
        )));
    }
    Ok(Activation::ClampedSwiglu { alpha, limit })
}

/// A linear router with a bias: top-k of the logits, softmax over the chosen.
pub(super) fn router(n_experts: usize, top_k: usize) -> RouterConfig {
    RouterConfig { scoring: Scoring::SoftmaxOfTopk, logit_bias: true, ..RouterConfig::softmax(n_experts, top_k, false) }
}

/// Per layer: `sliding_window` on the layers `layer_types` marks "sliding_attention"
/// (transformers' default when absent: the even layers), none on "full_attention" ones.
/// An absent `sliding_window` is transformers' default 128; null means no window.
pub(super) fn sliding_windows(v: &Value, n_layers: usize) -> Result<Vec<Option<usize>>> {
    let window = match v.get("sliding_window") {
        None => Some(128), // GptOssConfig's default
        Some(Value::Null) => None,
        Some(w) => match w.as_u64() {
            Some(0) | None => return Err(Error::Config(format!("sliding_window = {w} is not a positive integer"))),
            Some(_) => get_usize(v, "sliding_window"),
        },
    };
    let kinds = [("full_attention", None), ("sliding_attention", window)];
    Ok(layer_types(v, n_layers, &kinds)?
        .unwrap_or_else(|| (0..n_layers).map(|l| if l % 2 == 0 { window } else { None }).collect()))
}

/// `v` with transformers' default rope for gpt_oss (YaRN, factor 32 over 4096 positions,
/// theta 150000) filled in where the config gives no rope parameters.
pub(super) fn with_default_rope(v: &Value) -> Value {
    let mut v = v.clone();
    let has = |k: &str| v.get(k).is_some_and(Value::is_object);
    if !has("rope_parameters") && !has("rope_scaling") {
        let theta = get_f64(&v, "rope_theta").unwrap_or(150000.0);
        v["rope_parameters"] = serde_json::json!({
            "rope_type": "yarn", "rope_theta": theta, "factor": 32.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096
        });
    } else if get_f64(&v, "rope_theta").is_none() && v["rope_parameters"].get("rope_theta").is_none() {
        v["rope_theta"] = 150000.0.into();
    }
    v
}

#[cfg(test)]
mod tests {
    use crate::model::config::{Activation, ModelConfig, Scoring};

    fn base() -> serde_json::Value {
        serde_json::json!({"model_type":"gpt_oss","hidden_size":64,"num_hidden_layers":4,
            "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":10,"num_local_experts":4,
            "num_experts_per_tok":2,"intermediate_size":32,"sliding_window":8,
            "rope_scaling":{"rope_type":"yarn","factor":32.0,"beta_fast":32.0,"beta_slow":1.0,
                "truncate":false,"original_max_position_embeddings":4096},"rope_theta":150000})
    }

    #[test]
    fn released_shape_and_defaults() {
        let c = ModelConfig::from_value(&base()).unwrap();
        assert_eq!(c.head_dim, 64, "GptOssConfig's default head_dim");
        assert_eq!(c.sliding_window, vec![Some(8), None, Some(8), None]);
        assert!(c.qkv_bias && c.o_bias && c.attn_sinks && c.expert_bias && c.router.logit_bias);
        assert_eq!(c.router.scoring, Scoring::SoftmaxOfTopk);
        assert_eq!(c.ffn_act, Activation::ClampedSwiglu { alpha: 1.702, limit: 7.0 });
        assert_eq!(c.rms_eps, 1e-5);
        assert_eq!(c.rope.theta, 150000.0);
        // No rope parameters at all: transformers' YaRN default.
        let mut v = base();
        v.as_object_mut().unwrap().remove("rope_scaling");
        v.as_object_mut().unwrap().remove("rope_theta");
        let d = ModelConfig::from_value(&v).unwrap();
        assert_eq!(d.rope, c.rope);
    }

    #[test]
    fn layer_types_decide_and_unknown_ones_are_named() {
        let mut v = base();
        v["layer_types"] =
            serde_json::json!(["full_attention", "sliding_attention", "full_attention", "full_attention"]);
        assert_eq!(ModelConfig::from_value(&v).unwrap().sliding_window, vec![None, Some(8), None, None]);
        v["layer_types"] =
            serde_json::json!(["full_attention", "chunked_attention", "full_attention", "full_attention"]);
        let e = ModelConfig::from_value(&v).unwrap_err().to_string();
        assert!(e.contains("chunked_attention"), "{e}");
        v["layer_types"] = serde_json::json!(["full_attention"]);
        assert!(ModelConfig::from_value(&v).unwrap_err().to_string().contains("layer_types"));
        let mut v = base();
        v["swiglu_limit"] = (-1.0).into();
        assert!(ModelConfig::from_value(&v).unwrap_err().to_string().contains("swiglu_limit"));
    }
}
