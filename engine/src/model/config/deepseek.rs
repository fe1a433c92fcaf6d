//! The deepseek_v3 parts of config.json: MLA sizes and the sigmoid / group-limited
//! router (which glm4_moe shares). Absent fields take transformers' defaults
//! (`DeepseekV3Config`, `Glm4MoeConfig`); what the engine does not implement is refused
//! with the field named.

use serde_json::Value;

use super::{bounded, get_bool, limits, need_usize, optional_usize, DsaConfig, MlaConfig, RouterConfig, Scoring};
use crate::error::{Error, Result};

/// MLA sizes of a deepseek_v3 config.json. Every size must be present (`q_lora_rank` may
/// be null: a plain q_proj). deepseek_v32 and glm_moe_dsa add DeepSeek Sparse Attention.
pub(super) fn mla_config(v: &Value, n_heads: usize, n_kv_heads: usize, n_layers: usize) -> Result<MlaConfig> {
    use limits::*;
    if n_kv_heads != n_heads {
        return Err(Error::Config(format!(
            "num_key_value_heads ({n_kv_heads}) must equal num_attention_heads ({n_heads}) for MLA attention"
        )));
    }
    if get_bool(v, "attention_bias").unwrap_or(false) {
        return Err(Error::Config("attention_bias = true is not supported for deepseek_v3".into()));
    }
    let q_lora_rank = match v.get("q_lora_rank") {
        Some(Value::Null) => None,
        _ => Some(bounded("q_lora_rank", need_usize(v, "q_lora_rank")?, MAX_HIDDEN)?),
    };
    let dsa = match v.get("model_type").and_then(Value::as_str) {
        Some(t @ ("deepseek_v32" | "glm_moe_dsa")) => Some(dsa_config(v, t, n_layers)?),
        _ => None,
    };
    if dsa.is_some() && q_lora_rank.is_none() {
        return Err(Error::Config(
            "DeepSeek Sparse Attention needs q_lora_rank (its indexer reads q_a's output)".into(),
        ));
    }
    let m = MlaConfig {
        q_lora_rank,
        kv_lora_rank: bounded("kv_lora_rank", need_usize(v, "kv_lora_rank")?, MAX_HIDDEN)?,
        qk_nope_head_dim: bounded("qk_nope_head_dim", need_usize(v, "qk_nope_head_dim")?, MAX_HEAD_DIM)?,
        qk_rope_head_dim: bounded("qk_rope_head_dim", need_usize(v, "qk_rope_head_dim")?, MAX_HEAD_DIM)?,
        v_head_dim: bounded("v_head_dim", need_usize(v, "v_head_dim")?, MAX_HEAD_DIM)?,
        // deepseek_v32 and glm_moe_dsa always rotate interleaved pairs (no such field).
        rope_interleave: match v.get("rope_interleave") {
            _ if dsa.is_some() => true,
            None | Some(Value::Null) => true,
            Some(b) => b.as_bool().ok_or_else(|| Error::Config(format!("rope_interleave = {b} is not a boolean")))?,
        },
        dsa,
    };
    if q_lora_rank == Some(0) || m.kv_lora_rank == 0 || m.v_head_dim == 0 {
        return Err(Error::Config("q_lora_rank, kv_lora_rank and v_head_dim must be positive".into()));
    }
    if m.qk_rope_head_dim == 0 || !m.qk_rope_head_dim.is_multiple_of(2) {
        return Err(Error::Config(format!("qk_rope_head_dim {} must be even and positive", m.qk_rope_head_dim)));
    }
    Ok(m)
}

/// DeepSeek Sparse Attention's indexer sizes (transformers' `DeepseekV32Config` and
/// `GlmMoeDsaConfig` defaults for absent fields) and glm_moe_dsa's per-layer
/// `indexer_types` (or the `index_topk_pattern` / `index_topk_freq` /
/// `index_skip_topk_offset` schedule it is derived from).
fn dsa_config(v: &Value, model_type: &str, n_layers: usize) -> Result<DsaConfig> {
    use limits::*;
    let glm = model_type == "glm_moe_dsa";
    let topk = optional_usize(v, "index_topk", 2048)?;
    let n_heads = bounded("index_n_heads", optional_usize(v, "index_n_heads", if glm { 32 } else { 64 })?, MAX_HEADS)?;
    let head_dim = bounded("index_head_dim", optional_usize(v, "index_head_dim", 128)?, MAX_HEAD_DIM)?;
    let rope = need_usize(v, "qk_rope_head_dim")?;
    if topk == 0 || n_heads == 0 || head_dim < rope {
        return Err(Error::Config(format!(
            "index_topk ({topk}) and index_n_heads ({n_heads}) must be positive and index_head_dim ({head_dim}) at least qk_rope_head_dim ({rope})"
        )));
    }
    let full: Vec<bool> = match (glm, v.get("indexer_types"), v.get("index_topk_pattern")) {
        (false, None | Some(Value::Null), _) => vec![true; n_layers],
        (_, Some(Value::Array(types)), _) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("full") => Ok(true),
                Some("shared") => Ok(false),
                _ => Err(Error::Config(format!("indexer_types entry {t} is not \"full\" or \"shared\""))),
            })
            .collect::<Result<_>>()?,
        (true, None | Some(Value::Null), Some(Value::String(p))) => p
            .chars()
            .map(|c| match c {
                'F' => Ok(true),
                'S' => Ok(false),
                _ => Err(Error::Config(format!("index_topk_pattern {p:?}: only F and S"))),
            })
            .collect::<Result<_>>()?,
        (true, None | Some(Value::Null), _) => {
            let freq = optional_usize(v, "index_topk_freq", 1)?.max(1);
            let offset = optional_usize(v, "index_skip_topk_offset", 2)?;
            (0..n_layers).map(|i| (i + 1).saturating_sub(offset).is_multiple_of(freq)).collect()
        }
        (false, Some(t), _) => return Err(Error::Config(format!("indexer_types = {t} is not a list"))),
        (true, Some(t), _) => return Err(Error::Config(format!("indexer_types = {t} is not a list"))),
    };
    if full.len() != n_layers {
        return Err(Error::Config(format!("{} indexer_types for {n_layers} layers", full.len())));
    }
    if full.first() == Some(&false) {
        return Err(Error::Config("the first layer's indexer is \"shared\": there is no earlier selection".into()));
    }
    Ok(DsaConfig { topk, n_heads, head_dim, interleave: glm, full })
}

/// deepseek_v32 / glm_moe_dsa's `mlp_layer_types`: "dense" or "sparse" (MoE) per layer.
pub(super) fn mlp_layer_types(types: &[Value], n_layers: usize) -> Result<Vec<bool>> {
    if types.len() != n_layers {
        return Err(Error::Config(format!("{} mlp_layer_types for {n_layers} layers", types.len())));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            Some("sparse") => Ok(true),
            Some("dense") => Ok(false),
            _ => Err(Error::Config(format!("mlp_layer_types entry {t} is not \"dense\" or \"sparse\""))),
        })
        .collect()
}

/// deepseek_v3's router (glm4_moe's too): sigmoid scores, a correction bias for the
/// selection, groups, a scaling factor. Absent fields take `defaults`, the family's
/// transformers defaults of (n_group, topk_group, routed_scaling_factor).
pub(super) fn sigmoid_router(
    v: &Value,
    n_experts: usize,
    top_k: usize,
    defaults: (usize, usize, f64),
) -> Result<RouterConfig> {
    match v.get("scoring_func").and_then(Value::as_str) {
        None | Some("sigmoid") => {}
        Some(other) => {
            return Err(Error::Config(format!(
                "scoring_func {other:?} is not supported for this router (only \"sigmoid\")"
            )))
        }
    }
    match v.get("topk_method").and_then(Value::as_str) {
        None | Some("noaux_tc") => {}
        Some(other) => {
            return Err(Error::Config(format!(
                "topk_method {other:?} is not supported for this router (only \"noaux_tc\")"
            )))
        }
    }
    let n_group = optional_usize(v, "n_group", defaults.0)?;
    let topk_group = optional_usize(v, "topk_group", defaults.1)?;
    if n_group == 0 || !n_experts.is_multiple_of(n_group) || n_experts / n_group < 2 {
        return Err(Error::Config(format!(
            "n_group = {n_group} must divide the {n_experts} routed experts into groups of at least 2"
        )));
    }
    if topk_group == 0 || topk_group > n_group || top_k > topk_group * (n_experts / n_group) {
        return Err(Error::Config(format!(
            "topk_group = {topk_group} must be between 1 and n_group ({n_group}) and keep at least num_experts_per_tok ({top_k}) experts"
        )));
    }
    let scale = match v.get("routed_scaling_factor") {
        None => defaults.2,
        Some(x) => x.as_f64().filter(|f| f.is_finite() && *f > 0.0).ok_or_else(|| {
            Error::Config(format!("routed_scaling_factor = {x} is not supported (a positive number is needed)"))
        })?,
    };
    Ok(RouterConfig {
        n_experts,
        top_k,
        norm_topk_prob: get_bool(v, "norm_topk_prob").unwrap_or(true),
        scoring: Scoring::Sigmoid,
        n_group,
        topk_group,
        routed_scaling_factor: scale as f32,
        correction_bias: true,
        logit_bias: false,
    })
}

#[cfg(test)]
mod tests {
    use super::super::ModelConfig;
    use super::*;

    /// A valid deepseek_v3 config (the shape of DeepSeek-V3's config.json, small) with
    /// `key` replaced by `value` (null removes it).
    fn deepseek(key: &str, value: serde_json::Value) -> Result<ModelConfig> {
        let mut v = serde_json::json!({"model_type":"deepseek_v3","hidden_size":64,"num_hidden_layers":4,
            "num_attention_heads":4,"num_key_value_heads":4,"vocab_size":100,"n_routed_experts":16,
            "num_experts_per_tok":4,"moe_intermediate_size":8,"intermediate_size":24,"n_shared_experts":1,
            "first_k_dense_replace":1,"moe_layer_freq":1,"n_group":4,"topk_group":2,"topk_method":"noaux_tc",
            "scoring_func":"sigmoid","routed_scaling_factor":2.5,"norm_topk_prob":true,"q_lora_rank":24,
            "kv_lora_rank":16,"qk_nope_head_dim":8,"qk_rope_head_dim":4,"v_head_dim":6,"hidden_act":"silu",
            "max_position_embeddings":1024,"rope_theta":10000,
            "rope_scaling":{"type":"yarn","factor":40,"beta_fast":32,"beta_slow":1,"mscale":1.0,
                "mscale_all_dim":1.0,"original_max_position_embeddings":64}});
        if value.is_null() {
            v.as_object_mut().unwrap().remove(key);
        } else {
            v[key] = value;
        }
        ModelConfig::from_value(&v)
    }

    #[test]
    fn deepseek_v3_options() {
        let c = deepseek("q_lora_rank", 24.into()).unwrap();
        let m = c.mla.as_ref().unwrap();
        assert_eq!((m.q_lora_rank, m.kv_lora_rank, m.cache_width()), (Some(24), 16, 20));
        assert!(m.rope_interleave);
        assert_eq!(c.head_dim, 12);
        assert_eq!(c.rope.rotary_dim, 4);
        assert_eq!(c.moe_layers, vec![false, true, true, true]);
        assert_eq!((c.shared_expert_intermediate, c.shared_expert_gated), (Some(8), false));
        let r = &c.router;
        assert_eq!((r.scoring, r.n_group, r.topk_group, r.correction_bias), (Scoring::Sigmoid, 4, 2, true));
        assert_eq!((r.routed_scaling_factor, r.norm_topk_prob), (2.5, true));
        // Softmax scale: 12^-0.5 * (0.1 ln 40 + 1)^2.
        let ms = 0.1 * 40f64.ln() + 1.0;
        assert_eq!(c.attn_scale, (12f64.powf(-0.5) * ms * ms) as f32);
        assert_eq!(c.cache_floats_per_layer(), 20);
        // q_lora_rank null: a plain q_proj; absent fields take transformers' defaults.
        let mut j: serde_json::Value = serde_json::from_str(
            r#"{"model_type":"deepseek_v3","hidden_size":64,"num_hidden_layers":4,
            "num_attention_heads":4,"vocab_size":100,"n_routed_experts":16,"num_experts_per_tok":4,
            "moe_intermediate_size":8,"intermediate_size":24,"kv_lora_rank":16,"qk_nope_head_dim":8,
            "qk_rope_head_dim":4,"v_head_dim":6}"#,
        )
        .unwrap();
        j["q_lora_rank"] = serde_json::Value::Null;
        let c = ModelConfig::from_value(&j).unwrap();
        assert_eq!(c.mla.as_ref().unwrap().q_lora_rank, None);
        assert_eq!(c.moe_layers, vec![false, false, false, true], "first_k_dense_replace defaults to 3");
        assert_eq!((c.router.n_group, c.router.topk_group, c.router.routed_scaling_factor), (8, 4, 2.5));
        assert_eq!(c.attn_scale, (12f32).powf(-0.5), "no rope scaling: no mscale");
        // A multi-token-prediction layer after the decoder layers is recognised.
        j["num_nextn_predict_layers"] = 1.into();
        let c = ModelConfig::from_value(&j).unwrap();
        assert!(c.is_mtp_tensor("model.layers.4.enorm.weight"));
        assert!(!c.is_mtp_tensor("model.layers.3.input_layernorm.weight"));
        assert!(!c.is_mtp_tensor("model.layers.5.enorm.weight"));
    }

    /// The config.json files of the released models (as published; Kimi-K2 under its own
    /// model_type): what the engine makes of them at full size.
    #[test]
    fn released_configs() {
        let dsv3 = r#"{"architectures":["DeepseekV3ForCausalLM"],"attention_bias":false,"bos_token_id":0,
            "eos_token_id":1,"ep_size":1,"first_k_dense_replace":3,"hidden_act":"silu","hidden_size":7168,
            "intermediate_size":18432,"kv_lora_rank":512,"max_position_embeddings":163840,
            "model_type":"deepseek_v3","moe_intermediate_size":2048,"moe_layer_freq":1,"n_group":8,
            "n_routed_experts":256,"n_shared_experts":1,"norm_topk_prob":true,"num_attention_heads":128,
            "num_experts_per_tok":8,"num_hidden_layers":61,"num_key_value_heads":128,"num_nextn_predict_layers":1,
            "q_lora_rank":1536,"qk_nope_head_dim":128,"qk_rope_head_dim":64,
            "quantization_config":{"activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8",
                "weight_block_size":[128,128]},
            "rms_norm_eps":1e-06,"rope_scaling":{"beta_fast":32,"beta_slow":1,"factor":40,"mscale":1.0,
                "mscale_all_dim":1.0,"original_max_position_embeddings":4096,"type":"yarn"},
            "rope_theta":10000,"routed_scaling_factor":2.5,"scoring_func":"sigmoid","seq_aux":true,
            "tie_word_embeddings":false,"topk_group":4,"topk_method":"noaux_tc","torch_dtype":"bfloat16",
            "v_head_dim":128,"vocab_size":129280}"#;
        let mut v: Value = serde_json::from_str(dsv3).unwrap();
        // The FP8 release loads as it is (format/fp8.rs), a bf16 conversion of it too; a
        // method colibri does not read is refused in one line naming it.
        assert!(ModelConfig::from_value(&v).is_ok());
        let mut awq = v.clone();
        awq["quantization_config"]["quant_method"] = "awq".into();
        let e = ModelConfig::from_value(&awq).unwrap_err().to_string();
        assert!(e.contains("quantization_config") && e.contains("awq"), "{e}");
        v.as_object_mut().unwrap().remove("quantization_config");
        let c = ModelConfig::from_value(&v).unwrap();
        assert_eq!(c.cache_floats_per_layer(), 576, "the MLA cache of DeepSeek-V3");
        assert_eq!(c.moe_layers.iter().filter(|m| **m).count(), 58);
        assert_eq!((c.router.n_experts, c.router.top_k, c.router.n_group, c.router.topk_group), (256, 8, 8, 4));
        assert_eq!((c.head_dim, c.rope.rotary_dim, c.mtp_layers), (192, 64, 1));
        assert!(c.is_mtp_tensor("model.layers.61.shared_head.head.weight"));
        let ms = 0.1 * 40f64.ln() + 1.0;
        assert_eq!(c.attn_scale, (192f64.powf(-0.5) * ms * ms) as f32);

        let kimi = r#"{"model_type":"kimi_k2","hidden_size":7168,"intermediate_size":18432,
            "moe_intermediate_size":2048,"num_hidden_layers":61,"num_attention_heads":64,"num_key_value_heads":64,
            "n_shared_experts":1,"n_routed_experts":384,"routed_scaling_factor":2.827,"kv_lora_rank":512,
            "q_lora_rank":1536,"qk_rope_head_dim":64,"v_head_dim":128,"qk_nope_head_dim":128,
            "topk_method":"noaux_tc","n_group":1,"topk_group":1,"num_experts_per_tok":8,"moe_layer_freq":1,
            "first_k_dense_replace":1,"norm_topk_prob":true,"scoring_func":"sigmoid",
            "max_position_embeddings":131072,"rope_theta":50000.0,"rope_scaling":{"beta_fast":1.0,"beta_slow":1.0,
            "factor":32.0,"mscale":1.0,"mscale_all_dim":1.0,"original_max_position_embeddings":4096,"type":"yarn"},
            "vocab_size":163840,"num_nextn_predict_layers":0,"hidden_act":"silu","rms_norm_eps":1e-06}"#;
        let c = ModelConfig::from_json_bytes(kimi.as_bytes()).unwrap();
        assert_eq!(c.family, super::super::Family::DeepseekV3);
        assert_eq!(c.cache_floats_per_layer(), 576);
        assert_eq!((c.router.n_experts, c.router.n_group, c.router.routed_scaling_factor), (384, 1, 2.827));
        assert_eq!(c.moe_layers.iter().filter(|m| **m).count(), 60);
    }

    /// GLM-4.5's config.json: GQA with biases and q/k norms, half of each head rotated,
    /// the sigmoid router with one group.
    #[test]
    fn glm4_moe_released_config() {
        let glm = r#"{"architectures":["Glm4MoeForCausalLM"],"attention_bias":true,"attention_dropout":0.0,
            "pad_token_id":151329,"eos_token_id":[151329,151336,151338],"head_dim":128,"hidden_act":"silu",
            "hidden_size":5120,"partial_rotary_factor":0.5,"initializer_range":0.02,"intermediate_size":12288,
            "max_position_embeddings":131072,"model_type":"glm4_moe","moe_intermediate_size":1536,
            "norm_topk_prob":true,"num_attention_heads":96,"n_group":1,"topk_group":1,"n_routed_experts":160,
            "n_shared_experts":1,"routed_scaling_factor":2.5,"num_experts_per_tok":8,"first_k_dense_replace":3,
            "num_hidden_layers":92,"num_key_value_heads":8,"rms_norm_eps":1e-05,"rope_scaling":null,
            "rope_theta":1000000,"num_nextn_predict_layers":1,"tie_word_embeddings":false,"torch_dtype":"bfloat16",
            "use_cache":true,"use_qk_norm":true,"vocab_size":151552}"#;
        let mut v: Value = serde_json::from_str(glm).unwrap();
        let c = ModelConfig::from_value(&v).unwrap();
        assert_eq!(c.family, super::super::Family::Glm4Moe);
        assert!(c.mla.is_none() && c.qkv_bias);
        assert_eq!(c.qk_norm, super::super::QkNorm::PerHead);
        assert_eq!((c.head_dim, c.rope.rotary_dim), (128, 64));
        assert_eq!(c.cache_floats_per_layer(), 2 * 8 * 128);
        assert_eq!(c.moe_layers.iter().filter(|m| **m).count(), 89);
        assert_eq!((c.router.scoring, c.router.n_group, c.router.routed_scaling_factor), (Scoring::Sigmoid, 1, 2.5));
        assert_eq!((c.shared_expert_intermediate, c.shared_expert_gated, c.mtp_layers), (Some(1536), false, 1));
        assert_eq!(c.attn_scale, 128f32.powf(-0.5));
        // Absent: transformers' glm4_moe defaults (half rotary, one group, scale 1, one dense layer).
        for key in ["partial_rotary_factor", "n_group", "topk_group", "routed_scaling_factor", "first_k_dense_replace"]
        {
            v.as_object_mut().unwrap().remove(key);
        }
        let c = ModelConfig::from_value(&v).unwrap();
        assert_eq!(c.rope.rotary_dim, 64);
        assert_eq!((c.router.n_group, c.router.topk_group, c.router.routed_scaling_factor), (1, 1, 1.0));
        assert_eq!(c.moe_layers.iter().filter(|m| **m).count(), 91);
    }

    #[test]
    fn deepseek_v3_refuses_what_it_does_not_implement() {
        let cases: &[(&str, serde_json::Value, &str)] = &[
            ("scoring_func", "softmax".into(), "scoring_func"),
            ("topk_method", "greedy".into(), "topk_method"),
            ("moe_layer_freq", 2.into(), "moe_layer_freq"),
            ("n_group", 3.into(), "n_group"),
            ("n_group", 16.into(), "n_group"),
            ("topk_group", 5.into(), "topk_group"),
            ("topk_group", 0.into(), "topk_group"),
            ("num_experts_per_tok", 9.into(), "topk_group"),
            ("num_key_value_heads", 2.into(), "num_key_value_heads"),
            ("attention_bias", true.into(), "attention_bias"),
            ("qk_rope_head_dim", 5.into(), "qk_rope_head_dim"),
            ("kv_lora_rank", 0.into(), "kv_lora_rank"),
            ("kv_lora_rank", serde_json::Value::Null, "kv_lora_rank"),
            ("v_head_dim", serde_json::Value::Null, "v_head_dim"),
            ("routed_scaling_factor", (-1.0).into(), "routed_scaling_factor"),
            ("first_k_dense_replace", "two".into(), "first_k_dense_replace"),
            ("hidden_act", "gelu".into(), "hidden_act"),
            ("quantization_config", serde_json::json!({"quant_method": "fp8"}), "quantization_config"),
            ("rope_interleave", "yes".into(), "rope_interleave"),
            ("partial_rotary_factor", 0.5.into(), "partial_rotary_factor"),
        ];
        for (key, value, named) in cases {
            let e = deepseek(key, value.clone()).unwrap_err().to_string();
            assert!(e.contains(named), "{key} = {value}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let c = deepseek("n_group", serde_json::Value::Null).unwrap();
        assert_eq!(c.router.n_group, 8, "an absent n_group is transformers' default");
    }
}
