//! The qwen3_5_moe parts of config.json (transformers' `Qwen3_5MoeConfig`, Qwen3.5/3.6 MoE).
//! The release is an image-text model: its config.json holds the language model's shape
//! under `text_config` (model_type `qwen3_5_moe_text`, transformers' `Qwen3_5MoeTextConfig`)
//! next to a `vision_config`; its weights sit under `model.language_model.` (read as the
//! text model's own names, `format::tensors::text_tower_name`) and `model.visual.` (not
//! read). The engine runs the text path; images are refused where a request could carry
//! them.
//!
//! The text tower is qwen3_next's (`Family::Qwen3Next`) with these differences, all
//! options of the blocks that exist: the DeltaNet input projections stored apart
//! (`LinearAttnConfig::split_in_proj`), every layer MoE (transformers drops
//! `mlp_only_layers` and `decoder_sparse_step`), a router that always renormalises its
//! top-k (no `norm_topk_prob`), and interleaved M-RoPE (`mrope_section`), which on text,
//! where the three position streams are equal, is the plain partial RoPE.

use serde_json::Value;

use crate::error::{Error, Result};

impl super::Family {
    /// qwen3_next and qwen3_5_moe: Gated DeltaNet layers between gated full-attention
    /// layers, zero-centred norms, `mtp.*` weights.
    pub fn is_qwen_hybrid(self) -> bool {
        matches!(self, super::Family::Qwen3Next | super::Family::Qwen35Moe)
    }
}

/// Keys of the outer config that apply to the language model: a quantization of the
/// release (refused by the common checks), the tying of the LM head, and the EOS ids when
/// the text config has none.
const OUTER_KEYS: [&str; 3] = ["quantization_config", "tie_word_embeddings", "eos_token_id"];

/// The language model's config of a `qwen3_5_moe` config.json: its `text_config`, with
/// [`OUTER_KEYS`] taken from the outer config where it sets them (an outer
/// `tie_word_embeddings` or `quantization_config` wins: transformers ties and quantizes the
/// whole model from the outer config).
pub(super) fn text_config(v: &Value) -> Result<Value> {
    let mut text = v
        .get("text_config")
        .filter(|t| t.is_object())
        .cloned()
        .ok_or_else(|| Error::Config("qwen3_5_moe: config.json has no \"text_config\" object".into()))?;
    let t = text.as_object_mut().ok_or_else(|| Error::Config("text_config is not an object".into()))?;
    for key in OUTER_KEYS {
        match v.get(key).filter(|x| !x.is_null()) {
            Some(x) if key != "eos_token_id" || t.get(key).is_none_or(Value::is_null) => {
                t.insert(key.into(), x.clone());
            }
            _ => {}
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use crate::model::config::{Family, ModelConfig, QkNorm, Scoring};

    /// Qwen3.5-35B-A3B's config.json as released (the fields the engine reads, and the
    /// vision tower's shape), written from the published file's known values.
    pub(crate) fn released() -> serde_json::Value {
        let layer_types: Vec<&str> =
            (0..40).map(|l| if (l + 1) % 4 == 0 { "full_attention" } else { "linear_attention" }).collect();
        let text = serde_json::json!({"model_type":"qwen3_5_moe_text","attention_bias":false,
            "attention_dropout":0.0,"attn_output_gate":true,"dtype":"bfloat16","eos_token_id":248044,
            "full_attention_interval":4,"head_dim":256,"hidden_act":"silu","hidden_size":2048,
            "initializer_range":0.02,"layer_types":layer_types,"linear_conv_kernel_dim":4,
            "linear_key_head_dim":128,"linear_num_key_heads":16,"linear_num_value_heads":32,
            "linear_value_head_dim":128,"mamba_ssm_dtype":"float32","max_position_embeddings":262144,
            "mlp_only_layers":[],"moe_intermediate_size":512,"mtp_num_hidden_layers":1,
            "mtp_use_dedicated_embeddings":false,"num_attention_heads":16,"num_experts":256,
            "num_experts_per_tok":8,"num_hidden_layers":40,"num_key_value_heads":2,
            "output_router_logits":false,"partial_rotary_factor":0.25,"rms_norm_eps":1e-06,
            "router_aux_loss_coef":0.001,"shared_expert_intermediate_size":512,"use_cache":true,
            "vocab_size":248320});
        let rope = serde_json::json!({"mrope_interleaved":true,"mrope_section":[11,11,10],
            "rope_type":"default","rope_theta":10000000,"partial_rotary_factor":0.25});
        let vision = serde_json::json!({"deepstack_visual_indexes":[],"depth":27,
            "hidden_act":"gelu_pytorch_tanh","hidden_size":1152,"in_channels":3,"initializer_range":0.02,
            "intermediate_size":4304,"model_type":"qwen3_5_moe","num_heads":16,
            "num_position_embeddings":2304,"out_hidden_size":2048,"patch_size":16,"spatial_merge_size":2,
            "temporal_patch_size":2});
        let mut v = serde_json::json!({"architectures":["Qwen3_5MoeForConditionalGeneration"],
            "model_type":"qwen3_5_moe","image_token_id":248056,"video_token_id":248057,
            "vision_start_token_id":248053,"vision_end_token_id":248054,"tie_word_embeddings":false,
            "text_config":text,"vision_config":vision});
        v["text_config"]["rope_parameters"] = rope;
        v
    }

    #[test]
    fn released_config_parses_at_full_size() {
        let c = ModelConfig::from_value(&released()).unwrap();
        assert_eq!((c.family, c.model_type.as_str()), (Family::Qwen35Moe, "qwen3_5_moe"));
        assert_eq!((c.hidden, c.n_layers, c.vocab, c.n_heads, c.n_kv_heads), (2048, 40, 248320, 16, 2));
        let la = c.linear_attn.as_ref().unwrap();
        assert!(la.split_in_proj);
        assert_eq!(la.layers.iter().filter(|l| !**l).count(), 10, "every fourth layer is full attention");
        assert!(la.layers[0] && !la.layers[3] && !la.layers[39]);
        assert_eq!((la.key_dim(), la.value_dim(), la.conv_dim()), (2048, 4096, 8192));
        assert_eq!((c.head_dim, c.rope.rotary_dim, c.rope.theta), (256, 64, 10_000_000.0));
        assert!(c.norm_plus_one && c.attn_output_gate && !c.qkv_bias && !c.o_bias);
        assert_eq!(c.qk_norm, QkNorm::PerHead);
        assert_eq!((c.router.scoring, c.router.n_experts, c.router.top_k), (Scoring::Softmax, 256, 8));
        assert!(c.router.norm_topk_prob);
        assert_eq!((c.expert_intermediate, c.shared_expert_intermediate), (512, Some(512)));
        assert!(c.shared_expert_gated && c.moe_layers.iter().all(|m| *m) && !c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids, vec![248044]);
        assert!(c.is_mtp_tensor("mtp.layers.0.mlp.experts.gate_up_proj"));
        assert!(!c.is_mtp_tensor("model.layers.0.linear_attn.A_log"));
        // The text config alone (qwen3_5_moe_text) is the same model.
        let t = ModelConfig::from_value(&released()["text_config"]).unwrap();
        assert_eq!((t.family, t.n_layers, t.linear_attn, t.moe_layers), (c.family, 40, c.linear_attn, c.moe_layers));
    }

    #[test]
    fn outer_keys_apply_and_a_missing_text_config_is_named() {
        let mut v = released();
        v["quantization_config"] = serde_json::json!({"quant_method":"fp8","weight_block_size":[128,128]});
        assert!(ModelConfig::from_value(&v).is_ok(), "block-scaled FP8 is read as it is");
        v["quantization_config"] = serde_json::json!({"quant_method":"fp8"});
        assert!(ModelConfig::from_value(&v).unwrap_err().to_string().contains("weight_block_size"));
        let mut v = released();
        v["tie_word_embeddings"] = true.into();
        assert!(ModelConfig::from_value(&v).unwrap().tie_word_embeddings);
        let mut v = released();
        v["text_config"].as_object_mut().unwrap().remove("eos_token_id");
        v["eos_token_id"] = 7.into();
        assert_eq!(ModelConfig::from_value(&v).unwrap().eos_token_ids, vec![7]);
        let mut v = released();
        v.as_object_mut().unwrap().remove("text_config");
        assert!(ModelConfig::from_value(&v).unwrap_err().to_string().contains("text_config"));
        // norm_topk_prob and mlp_only_layers are not Qwen3.5's: ignored as transformers does.
        let mut v = released();
        v["text_config"]["norm_topk_prob"] = false.into();
        v["text_config"]["mlp_only_layers"] = serde_json::json!([1]);
        let c = ModelConfig::from_value(&v).unwrap();
        assert!(c.router.norm_topk_prob && c.moe_layers.iter().all(|m| *m));
    }
}
