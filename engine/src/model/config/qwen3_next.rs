//! The qwen3_next parts of config.json (transformers' `Qwen3NextConfig`): which layers are
//! Gated DeltaNet linear attention and which are full attention, and the linear layers'
//! sizes. Absent fields take transformers' defaults; what the engine does not implement
//! is refused with the field named.

use serde_json::Value;

use super::{bounded, layer_types, limits, optional_usize};
use crate::error::{Error, Result};

/// Gated DeltaNet (qwen3_next's linear attention): per layer a recurrent state of
/// `n_v_heads x k_head_dim x v_head_dim` floats and a causal-conv window of
/// `conv_kernel - 1` inputs replace the KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearAttnConfig {
    pub n_k_heads: usize,
    /// A multiple of `n_k_heads`: value head h reads key/query head h / (n_v_heads / n_k_heads).
    pub n_v_heads: usize,
    pub k_head_dim: usize,
    pub v_head_dim: usize,
    /// Taps of the depthwise causal conv1d over q|k|v.
    pub conv_kernel: usize,
    /// Per layer: true for a Gated DeltaNet layer, false for full attention.
    pub layers: Vec<bool>,
    /// The input projections as qwen3_5_moe stores them: `in_proj_qkv` (q of every key
    /// head, then k, then v: the conv's channel order), `in_proj_z`, `in_proj_b` and
    /// `in_proj_a` (value-head order); else qwen3_next's `in_proj_qkvz` / `in_proj_ba`,
    /// grouped per key head.
    pub split_in_proj: bool,
}

impl LinearAttnConfig {
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.k_head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.v_head_dim
    }

    /// Channels of the conv: q, k (key_dim each) and v (value_dim).
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Floats of one layer's recurrent state: the delta-rule matrices and the conv window.
    pub fn state_floats(&self) -> usize {
        self.n_v_heads * self.k_head_dim * self.v_head_dim + (self.conv_kernel - 1) * self.conv_dim()
    }
}

/// The linear layers' sizes (defaults: 16 key heads, 32 value heads, 128 x 128, kernel 4)
/// and the layer kinds, from `layer_types` or else `full_attention_interval` (default 4:
/// every fourth layer is full attention, as transformers fills `layer_types`).
pub(super) fn linear_config(v: &Value, n_layers: usize) -> Result<LinearAttnConfig> {
    use limits::*;
    let c = LinearAttnConfig {
        n_k_heads: bounded("linear_num_key_heads", optional_usize(v, "linear_num_key_heads", 16)?, MAX_HEADS)?,
        n_v_heads: bounded("linear_num_value_heads", optional_usize(v, "linear_num_value_heads", 32)?, MAX_HEADS)?,
        k_head_dim: bounded("linear_key_head_dim", optional_usize(v, "linear_key_head_dim", 128)?, MAX_HEAD_DIM)?,
        v_head_dim: bounded("linear_value_head_dim", optional_usize(v, "linear_value_head_dim", 128)?, MAX_HEAD_DIM)?,
        conv_kernel: bounded("linear_conv_kernel_dim", optional_usize(v, "linear_conv_kernel_dim", 4)?, 64)?,
        layers: layer_kinds(v, n_layers)?,
        split_in_proj: false,
    };
    if c.n_k_heads == 0 || c.k_head_dim == 0 || c.v_head_dim == 0 || c.conv_kernel == 0 {
        return Err(Error::Config(
            "the linear attention's head counts, head sizes and conv kernel must be positive".into(),
        ));
    }
    if c.n_v_heads == 0 || !c.n_v_heads.is_multiple_of(c.n_k_heads) {
        return Err(Error::Config(format!(
            "linear_num_value_heads ({}) is not a positive multiple of linear_num_key_heads ({})",
            c.n_v_heads, c.n_k_heads
        )));
    }
    Ok(c)
}

fn layer_kinds(v: &Value, n_layers: usize) -> Result<Vec<bool>> {
    if let Some(kinds) = layer_types(v, n_layers, &[("linear_attention", true), ("full_attention", false)])? {
        return Ok(kinds);
    }
    let every = optional_usize(v, "full_attention_interval", 4)?;
    if every == 0 {
        return Err(Error::Config(
            "full_attention_interval = 0 is not supported (a positive integer is needed)".into(),
        ));
    }
    Ok((0..n_layers).map(|l| !(l + 1).is_multiple_of(every)).collect())
}

#[cfg(test)]
mod tests {
    use crate::model::config::{Family, ModelConfig, QkNorm, Scoring};

    /// Qwen3-Next-80B-A3B-Instruct's config.json as released (fields the engine reads).
    fn released() -> serde_json::Value {
        serde_json::json!({"architectures":["Qwen3NextForCausalLM"],"model_type":"qwen3_next",
            "attention_bias":false,"attention_dropout":0.0,"bos_token_id":151643,"decoder_sparse_step":1,
            "eos_token_id":151645,"full_attention_interval":4,"head_dim":256,"hidden_act":"silu",
            "hidden_size":2048,"initializer_range":0.02,"intermediate_size":5120,"linear_conv_kernel_dim":4,
            "linear_key_head_dim":128,"linear_num_key_heads":16,"linear_num_value_heads":32,
            "linear_value_head_dim":128,"max_position_embeddings":262144,"mlp_only_layers":[],
            "moe_intermediate_size":512,"norm_topk_prob":true,"num_attention_heads":16,
            "num_experts":512,"num_experts_per_tok":10,"num_hidden_layers":48,"num_key_value_heads":2,
            "output_router_logits":false,"partial_rotary_factor":0.25,"rms_norm_eps":1e-06,
            "rope_scaling":null,"rope_theta":10000000,"router_aux_loss_coef":0.001,
            "shared_expert_intermediate_size":512,"tie_word_embeddings":false,"torch_dtype":"bfloat16",
            "use_cache":true,"use_sliding_window":false,"vocab_size":151936})
    }

    #[test]
    fn released_config_parses_at_full_size() {
        let c = ModelConfig::from_value(&released()).unwrap();
        assert_eq!(c.family, Family::Qwen3Next);
        let la = c.linear_attn.as_ref().unwrap();
        assert_eq!(la.layers.iter().filter(|l| !**l).count(), 12, "every fourth layer is full attention");
        assert!(la.layers[0] && la.layers[2] && !la.layers[3] && !la.layers[47]);
        assert_eq!((la.key_dim(), la.value_dim(), la.conv_dim()), (2048, 4096, 8192));
        // 2 MiB of delta-rule state + the conv window per linear layer, whatever the length.
        assert_eq!(la.state_floats(), 32 * 128 * 128 + 3 * 8192);
        assert_eq!((c.head_dim, c.rope.rotary_dim, c.rope.theta), (256, 64, 10_000_000.0));
        assert!(c.norm_plus_one && c.attn_output_gate && !c.qkv_bias && !c.o_bias);
        assert_eq!(c.qk_norm, QkNorm::PerHead);
        assert_eq!((c.router.scoring, c.router.top_k, c.router.norm_topk_prob), (Scoring::Softmax, 10, true));
        assert_eq!(c.shared_expert_intermediate, Some(512));
        assert!(c.shared_expert_gated && c.moe_layers.iter().all(|m| *m));
        assert!(c.is_mtp_tensor("mtp.layers.0.mlp.experts.3.up_proj.weight"));
        assert!(!c.is_mtp_tensor("model.layers.0.linear_attn.A_log"));
        // The FP8 release is read as it is; another quantization is refused naming it.
        let mut v = released();
        v["quantization_config"] = serde_json::json!({"quant_method":"fp8","weight_block_size":[128,128]});
        assert!(ModelConfig::from_value(&v).is_ok());
        v["quantization_config"] = serde_json::json!({"quant_method":"gptq"});
        assert!(ModelConfig::from_value(&v).unwrap_err().to_string().contains("quantization_config"));
    }

    #[test]
    fn layer_types_and_bad_sizes_are_named() {
        let mut v = released();
        v["num_hidden_layers"] = 3.into();
        v["layer_types"] = serde_json::json!(["full_attention", "linear_attention", "linear_attention"]);
        let c = ModelConfig::from_value(&v).unwrap();
        assert_eq!(c.linear_attn.unwrap().layers, vec![false, true, true]);
        v["layer_types"] = serde_json::json!(["full_attention", "sliding_attention", "linear_attention"]);
        let e = ModelConfig::from_value(&v).unwrap_err().to_string();
        assert!(e.contains("sliding_attention"), "{e}");
        v["layer_types"] = serde_json::json!(["full_attention"]);
        assert!(ModelConfig::from_value(&v).unwrap_err().to_string().contains("layer_types"));
        let mut v = released();
        v["linear_num_value_heads"] = 24.into();
        assert!(ModelConfig::from_value(&v).unwrap_err().to_string().contains("linear_num_value_heads"));
        let mut v = released();
        v["full_attention_interval"] = 0.into();
        assert!(ModelConfig::from_value(&v).unwrap_err().to_string().contains("full_attention_interval"));
        let mut v = released();
        v["linear_conv_kernel_dim"] = 0.into();
        assert!(ModelConfig::from_value(&v).is_err());
        // transformers' defaults: head_dim 256 and a quarter of it rotated.
        let mut v = released();
        v.as_object_mut().unwrap().remove("head_dim");
        v.as_object_mut().unwrap().remove("partial_rotary_factor");
        let c = ModelConfig::from_value(&v).unwrap();
        assert_eq!((c.head_dim, c.rope.rotary_dim), (256, 64));
    }
}
