//! Tests of `model::config` (split out to keep config.rs under the project's 800 lines).
use super::*;

#[test]
fn unknown_model_type_is_named() {
    let e = ModelConfig::from_json_bytes(br#"{"model_type":"llama"}"#).unwrap_err();
    assert!(e.to_string().contains("llama"), "{e}");
}

#[test]
fn missing_field_is_reported() {
    let e = ModelConfig::from_json_bytes(br#"{"model_type":"mixtral","hidden_size":8}"#).unwrap_err();
    assert!(e.to_string().contains("num_hidden_layers"), "{e}");
}

/// A valid mixtral config with `key` replaced by `value`.
fn mutant(key: &str, value: serde_json::Value) -> Result<ModelConfig> {
    let mut v = serde_json::json!({"model_type":"mixtral","hidden_size":16,"num_hidden_layers":2,
        "num_attention_heads":2,"num_key_value_heads":1,"vocab_size":10,"num_local_experts":4,
        "num_experts_per_tok":2,"intermediate_size":8});
    v[key] = value;
    ModelConfig::from_value(&v)
}

#[test]
fn huge_sizes_are_errors_not_allocations() {
    mutant("hidden_size", 16.into()).unwrap();
    for key in [
        "num_hidden_layers",
        "hidden_size",
        "vocab_size",
        "num_local_experts",
        "intermediate_size",
        "max_position_embeddings",
        "head_dim",
        "num_attention_heads",
    ] {
        for value in [1u64 << 40, u64::MAX, 1 << 31] {
            let e = mutant(key, value.into()).unwrap_err().to_string();
            assert!(e.contains("config"), "{key}={value}: {e}");
        }
    }
    assert!(mutant("num_key_value_heads", 4.into()).is_err());
    assert!(mutant("num_experts_per_tok", 5.into()).is_err());
    assert!(mutant("clip_qkv", (-1.0).into()).is_ok(), "mixtral ignores clip_qkv");
    assert!(mutant("rms_norm_eps", (-1.0).into()).is_err());
    assert!(mutant("max_position_embeddings", 0.into()).is_err());
    let mut v: serde_json::Value = serde_json::from_str(
        r#"{"model_type":"olmoe","hidden_size":16,"num_hidden_layers":2,"num_attention_heads":2,
        "vocab_size":10,"num_experts":4,"num_experts_per_tok":2,"intermediate_size":8}"#,
    )
    .unwrap();
    ModelConfig::from_value(&v).unwrap();
    v["clip_qkv"] = (-1.0).into();
    assert!(ModelConfig::from_value(&v).unwrap_err().to_string().contains("clip_qkv"));
    // The product of two sizes that pass alone.
    let mut v = serde_json::json!({"model_type":"mixtral","hidden_size":65536,"num_hidden_layers":2,
        "num_attention_heads":2,"vocab_size":4194304,"num_local_experts":4,"num_experts_per_tok":2,
        "intermediate_size":8});
    assert!(ModelConfig::from_value(&v).unwrap_err().to_string().contains("vocab_size x hidden_size"));
    v["vocab_size"] = 1000.into();
    v["num_hidden_layers"] = 1024.into();
    v["num_local_experts"] = 4096.into();
    assert!(ModelConfig::from_value(&v).unwrap_err().to_string().contains("x num_experts"));
    assert_eq!(parse_token_ids(Some(&serde_json::json!([1, 1u64 << 40, 2]))), vec![1, 2]);
}

#[test]
fn qwen2_dense_layers_and_shared_expert() {
    let c = ModelConfig::from_json_bytes(
        br#"{"model_type":"qwen2_moe","hidden_size":16,"num_hidden_layers":4,"num_attention_heads":2,
        "num_key_value_heads":1,"vocab_size":10,"num_experts":4,"num_experts_per_tok":2,
        "moe_intermediate_size":8,"intermediate_size":12,"shared_expert_intermediate_size":6,
        "decoder_sparse_step":2,"mlp_only_layers":[3]}"#,
    )
    .unwrap();
    assert_eq!(c.moe_layers, vec![false, true, false, false]);
    assert_eq!(c.shared_expert_intermediate, Some(6));
    assert!(c.qkv_bias);
    assert_eq!(c.head_dim, 8);
}
