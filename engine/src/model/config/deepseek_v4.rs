//! DeepSeek-V4 (`deepseek_v4`, transformers 5.23's configuration_deepseek_v4.py): the
//! sizes of [`crate::model::v4`]'s forward pass, read from config.json with transformers'
//! defaults and its legacy fields folded in as it does (`compress_ratios` per layer,
//! `compress_rate_csa` / `compress_rate_hca`, `num_hash_layers`, `qk_rope_head_dim`).

use serde_json::Value;

use super::{
    bounded, get_bool, get_f64, get_usize, limits, optional_usize, parse_token_ids, Activation, Error, Family,
    ModelConfig, QkNorm, Result, RouterConfig, Scoring,
};
use crate::model::rope::RopeConfig;

/// The attention of one layer (`layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V4Attn {
    /// The sliding window only.
    Sliding,
    /// Compressed sparse attention: overlapping compressed entries every `rate` tokens,
    /// the lightning indexer's top-k of them, plus the sliding window.
    Csa,
    /// Heavily compressed attention: non-overlapping compressed entries, all of them.
    Hca,
}

/// DeepSeek-V4's sizes beyond [`ModelConfig`]'s.
#[derive(Clone, Debug, PartialEq)]
pub struct V4Config {
    pub layers: Vec<V4Attn>,
    /// Per layer: routed by the frozen `tid2eid[token id]` table (`hash_moe`).
    pub hash: Vec<bool>,
    pub csa_rate: usize,
    pub hca_rate: usize,
    pub window: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    /// The rotated tail of each head (`partial_rotary_factor * head_dim`).
    pub rope_dim: usize,
    pub index_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub hc_mult: usize,
    pub sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub swiglu_limit: f32,
    /// The sliding layers' rope (`rope_parameters.main`).
    pub main_rope: RopeConfig,
    /// The compressed layers' and compressors' rope (`rope_parameters.compress`).
    pub compress_rope: RopeConfig,
}

impl V4Config {
    /// The compression rate of a layer of kind `k` (None for a sliding layer).
    pub fn rate_of(&self, k: V4Attn) -> Option<usize> {
        match k {
            V4Attn::Csa => Some(self.csa_rate),
            V4Attn::Hca => Some(self.hca_rate),
            V4Attn::Sliding => None,
        }
    }
}

fn kind(name: &str) -> Result<V4Attn> {
    match name {
        "sliding_attention" => Ok(V4Attn::Sliding),
        "compressed_sparse_attention" => Ok(V4Attn::Csa),
        "heavily_compressed_attention" => Ok(V4Attn::Hca),
        other => Err(Error::Config(format!("deepseek_v4: layer type {other:?} is not one of sliding_attention, compressed_sparse_attention, heavily_compressed_attention"))),
    }
}

fn positive(key: &str, value: usize, max: usize) -> Result<usize> {
    if value == 0 {
        return Err(Error::Config(format!("{key} must be positive")));
    }
    bounded(key, value, max)
}

/// The rope of one rope-type label (`main` / `compress`), nested (v5) or from the flat
/// fields as transformers folds them.
fn rope(v: &Value, label: &str, head_dim: usize, max_positions: usize, partial: f64) -> Result<RopeConfig> {
    let nested = v.get("rope_parameters").and_then(|p| p.get(label)).filter(|p| p.is_object()).cloned();
    let params = match nested {
        Some(p) => p,
        None => {
            let theta = match label {
                "main" => get_f64(v, "rope_theta").unwrap_or(10000.0),
                _ => get_f64(v, "compress_rope_theta").unwrap_or(160000.0),
            };
            let mut p = serde_json::Map::new();
            if label == "compress" {
                let flat = v.get("rope_parameters").or_else(|| v.get("rope_scaling")).and_then(Value::as_object);
                for (k, x) in flat.into_iter().flatten() {
                    if k != "main" && k != "compress" {
                        p.insert(k.clone(), x.clone());
                    }
                }
                let yarn = p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str) == Some("yarn");
                if yarn && !p.contains_key("attention_factor") {
                    p.insert("attention_factor".into(), 1.0.into());
                }
            }
            p.insert("rope_theta".into(), theta.into());
            Value::Object(p)
        }
    };
    let mut params = params;
    if let Some(o) = params.as_object_mut() {
        o.insert("partial_rotary_factor".into(), partial.into());
    }
    let wrapped = serde_json::json!({ "rope_parameters": params });
    RopeConfig::from_config_with_partial(&wrapped, head_dim, max_positions, partial)
}

/// The release's quantization, accepted as published: `quantization_config` block-scaled
/// FP8 (`quant_method` "fp8", `fmt` "e4m3", `scale_fmt` "ue8m0" or float,
/// `weight_block_size`, checked by [`crate::format::fp8::block_size`]) and `expert_dtype`
/// (at the top level as V4 ships it, or inside `quantization_config` as transformers folds
/// it) "fp4" (routed experts as e2m1 + ue8m0 per 32, read as MXFP4 rows) or "fp8". Any
/// other value is refused with the field named.
fn quantization(v: &Value) -> Result<()> {
    let q = v.get("quantization_config").filter(|q| !q.is_null());
    if let Some(q) = q {
        match q.get("quant_method").and_then(Value::as_str) {
            Some("fp8") => {
                crate::format::fp8::block_size(v)?;
            }
            _ => {
                let m = q.get("quant_method").map_or("missing".to_string(), |m| m.to_string());
                return Err(Error::Config(format!(
                    "deepseek_v4: quantization_config.quant_method {m} is not supported (only \"fp8\", the release's)"
                )));
            }
        }
    }
    for (field, x) in [
        ("expert_dtype", v.get("expert_dtype")),
        ("quantization_config.expert_dtype", q.and_then(|q| q.get("expert_dtype"))),
    ] {
        match x {
            None | Some(Value::Null) => {}
            Some(x) if matches!(x.as_str(), Some("fp4" | "fp8")) => {
                if q.is_none() {
                    return Err(Error::Config(format!(
                        "deepseek_v4: {field} {x} needs a quantization_config (block-scaled FP8, quant_method \"fp8\")"
                    )));
                }
            }
            Some(x) => {
                return Err(Error::Config(format!(
                    "deepseek_v4: {field} {x} is not supported (only \"fp4\" and \"fp8\")"
                )))
            }
        }
    }
    Ok(())
}

/// config.json of a deepseek_v4 checkpoint as a [`ModelConfig`] with its [`V4Config`].
pub fn model_config(v: &Value, model_type: String) -> Result<ModelConfig> {
    use limits::*;
    quantization(v)?;
    if let Some(a) = v.get("hidden_act").filter(|a| a.as_str() != Some("silu")) {
        return Err(Error::Config(format!("hidden_act {a} is not supported (only \"silu\")")));
    }
    let hidden = positive("hidden_size", optional_usize(v, "hidden_size", 4096)?, MAX_HIDDEN)?;
    let n_layers = positive("num_hidden_layers", optional_usize(v, "num_hidden_layers", 43)?, MAX_LAYERS)?;
    let n_heads = positive("num_attention_heads", optional_usize(v, "num_attention_heads", 64)?, MAX_HEADS)?;
    if optional_usize(v, "num_key_value_heads", 1)? != 1 {
        return Err(Error::Config("deepseek_v4: num_key_value_heads must be 1 (one shared key/value head)".into()));
    }
    let head_dim = positive("head_dim", optional_usize(v, "head_dim", 512)?, MAX_HEAD_DIM)?;
    let vocab = positive("vocab_size", optional_usize(v, "vocab_size", 129280)?, MAX_VOCAB)?;
    if vocab as u64 * hidden as u64 > MAX_MATRIX {
        return Err(Error::Config("vocab_size x hidden_size is larger than this engine allows".into()));
    }
    let rms_eps = get_f64(v, "rms_norm_eps").unwrap_or(1e-6) as f32;
    if !(rms_eps.is_finite() && rms_eps >= 0.0) {
        return Err(Error::Config(format!("rms_norm_eps {rms_eps} must be a finite number >= 0")));
    }
    let max_positions =
        positive("max_position_embeddings", optional_usize(v, "max_position_embeddings", 1 << 20)?, MAX_POSITIONS)?;

    // Legacy fields, folded in as transformers' __post_init__ does.
    let mut csa_rate = 4;
    let mut hca_rate = 128;
    if let Some(r) = v.get("compress_rates").and_then(Value::as_object) {
        csa_rate = r.get("compressed_sparse_attention").and_then(Value::as_u64).map_or(csa_rate, |x| x as usize);
        hca_rate = r.get("heavily_compressed_attention").and_then(Value::as_u64).map_or(hca_rate, |x| x as usize);
    }
    csa_rate = get_usize(v, "compress_rate_csa").unwrap_or(csa_rate);
    hca_rate = get_usize(v, "compress_rate_hca").unwrap_or(hca_rate);
    let csa_rate = positive("compress_rates.compressed_sparse_attention", csa_rate, 1 << 16)?;
    let hca_rate = positive("compress_rates.heavily_compressed_attention", hca_rate, 1 << 16)?;
    let layers: Vec<V4Attn> = match (v.get("layer_types").filter(|t| !t.is_null()), v.get("compress_ratios")) {
        (Some(t), _) => t
            .as_array()
            .ok_or_else(|| Error::Config("layer_types must be a list".into()))?
            .iter()
            .map(|x| kind(x.as_str().unwrap_or("")))
            .collect::<Result<_>>()?,
        (None, Some(Value::Array(r))) => r
            .iter()
            .map(|x| match x.as_u64() {
                Some(0) => Ok(V4Attn::Sliding),
                Some(4) => Ok(V4Attn::Csa),
                Some(128) => Ok(V4Attn::Hca),
                _ => Err(Error::Config(format!("deepseek_v4: compress_ratios entry {x} is not 0, 4 or 128"))),
            })
            .collect::<Result<_>>()?,
        _ => (0..n_layers)
            .map(|l| match l {
                0 | 1 => V4Attn::Hca,
                _ if (l - 2) % 2 == 1 => V4Attn::Csa,
                _ => V4Attn::Hca,
            })
            .collect(),
    };
    if layers.len() < n_layers {
        return Err(Error::Config(format!("layer_types must list one type for each of the {n_layers} layers")));
    }
    let layers = layers[..n_layers].to_vec();
    let hash: Vec<bool> = match v.get("mlp_layer_types").filter(|t| !t.is_null()) {
        Some(t) => {
            let t = t.as_array().filter(|t| t.len() >= n_layers).ok_or_else(|| {
                Error::Config(format!("mlp_layer_types must list one type for each of the {n_layers} layers"))
            })?;
            t[..n_layers]
                .iter()
                .map(|x| match x.as_str() {
                    Some("hash_moe") => Ok(true),
                    Some("moe") => Ok(false),
                    _ => Err(Error::Config(format!("deepseek_v4: mlp layer type {x} is not hash_moe or moe"))),
                })
                .collect::<Result<_>>()?
        }
        None => {
            let n_hash = optional_usize(v, "num_hash_layers", 3)?;
            (0..n_layers).map(|l| l < n_hash).collect()
        }
    };
    let partial = match (get_f64(v, "partial_rotary_factor"), get_usize(v, "qk_rope_head_dim")) {
        (Some(p), _) => p,
        (None, Some(r)) => r as f64 / head_dim as f64,
        (None, None) => 64.0 / 512.0,
    };
    let main_rope = rope(v, "main", head_dim, max_positions, partial)?;
    let compress_rope = rope(v, "compress", head_dim, max_positions, partial)?;
    let rope_dim = main_rope.rotary_dim;

    let q_lora_rank = positive("q_lora_rank", optional_usize(v, "q_lora_rank", 1024)?, MAX_HIDDEN)?;
    let o_groups = positive("o_groups", optional_usize(v, "o_groups", 8)?, MAX_HEADS)?;
    let o_lora_rank = positive("o_lora_rank", optional_usize(v, "o_lora_rank", 1024)?, MAX_HIDDEN)?;
    if n_heads % o_groups != 0 {
        return Err(Error::Config(format!("o_groups {o_groups} must divide num_attention_heads {n_heads}")));
    }
    let index_heads = positive("index_n_heads", optional_usize(v, "index_n_heads", 64)?, MAX_HEADS)?;
    let index_head_dim = positive("index_head_dim", optional_usize(v, "index_head_dim", 128)?, MAX_HEAD_DIM)?;
    if index_head_dim < rope_dim || head_dim < rope_dim {
        return Err(Error::Config(format!(
            "deepseek_v4: the rotated tail ({rope_dim}) is longer than head_dim {head_dim} or index_head_dim {index_head_dim}"
        )));
    }
    let index_topk = positive("index_topk", optional_usize(v, "index_topk", 512)?, 1 << 20)?;
    let window = positive("sliding_window", optional_usize(v, "sliding_window", 128)?, MAX_POSITIONS)?;
    let hc_mult = positive("hc_mult", optional_usize(v, "hc_mult", 4)?, 64)?;
    let sinkhorn_iters = positive("hc_sinkhorn_iters", optional_usize(v, "hc_sinkhorn_iters", 20)?, 1000)?;
    let hc_eps = get_f64(v, "hc_eps").unwrap_or(1e-6) as f32;
    let swiglu_limit = get_f64(v, "swiglu_limit").unwrap_or(10.0) as f32;
    if !(swiglu_limit.is_finite() && swiglu_limit > 0.0 && hc_eps.is_finite()) {
        return Err(Error::Config("swiglu_limit must be a positive number and hc_eps finite".into()));
    }

    let n_experts = positive("n_routed_experts", optional_usize(v, "n_routed_experts", 256)?, MAX_EXPERTS)?;
    bounded("num_hidden_layers x num_experts", n_layers * n_experts, MAX_LAYER_EXPERTS)?;
    let top_k = optional_usize(v, "num_experts_per_tok", 6)?;
    if top_k == 0 || top_k > n_experts {
        return Err(Error::Config(format!("num_experts_per_tok {top_k} must be between 1 and {n_experts}")));
    }
    let scoring = match v.get("scoring_func").and_then(Value::as_str).unwrap_or("sqrtsoftplus") {
        "sqrtsoftplus" => Scoring::SqrtSoftplus,
        "sigmoid" => Scoring::Sigmoid,
        "softmax" => Scoring::Softmax,
        other => return Err(Error::Config(format!("deepseek_v4: scoring_func {other:?} is not supported"))),
    };
    let expert_intermediate =
        positive("moe_intermediate_size", optional_usize(v, "moe_intermediate_size", 2048)?, MAX_INTERMEDIATE)?;
    let n_shared = optional_usize(v, "n_shared_experts", 1)?;
    if n_shared != 1 {
        return Err(Error::Config(format!("deepseek_v4: n_shared_experts {n_shared} is not supported (1)")));
    }
    let routed_scaling_factor = get_f64(v, "routed_scaling_factor").unwrap_or(1.5) as f32;
    let rope = main_rope.clone();
    Ok(ModelConfig {
        family: Family::DeepseekV4,
        model_type,
        hidden,
        n_layers,
        n_heads,
        n_kv_heads: 1,
        head_dim,
        vocab,
        rms_eps,
        max_positions,
        rope,
        qkv_bias: false,
        o_bias: false,
        attn_sinks: true,
        qk_norm: QkNorm::None,
        attn_output_gate: false,
        norm_plus_one: false,
        linear_attn: None,
        mla: None,
        attn_scale: (head_dim as f32).powf(-0.5),
        clip_qkv: None,
        sliding_window: vec![Some(window); n_layers],
        router: RouterConfig {
            n_experts,
            top_k,
            norm_topk_prob: true,
            scoring,
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor,
            correction_bias: true,
            logit_bias: false,
        },
        expert_intermediate,
        ffn_act: Activation::Silu,
        expert_bias: false,
        dense_intermediate: 0,
        shared_expert_intermediate: Some(expert_intermediate),
        shared_expert_gated: false,
        moe_layers: vec![true; n_layers],
        tie_word_embeddings: get_bool(v, "tie_word_embeddings").unwrap_or(false),
        mtp_layers: 0,
        bos_token_id: parse_token_ids(v.get("bos_token_id")).first().copied(),
        eos_token_ids: parse_token_ids(v.get("eos_token_id")),
        v4: Some(Box::new(V4Config {
            layers,
            hash,
            csa_rate,
            hca_rate,
            window,
            q_lora_rank,
            o_groups,
            o_lora_rank,
            rope_dim,
            index_heads,
            index_head_dim,
            index_topk,
            hc_mult,
            sinkhorn_iters,
            hc_eps,
            swiglu_limit,
            main_rope,
            compress_rope,
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Value {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/deepseek_v4/config.json");
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    }

    #[test]
    fn the_fixture_config() {
        let c = ModelConfig::from_value(&fixture()).unwrap();
        let v4 = c.v4.as_ref().unwrap();
        assert_eq!(c.family, Family::DeepseekV4);
        assert_eq!(v4.layers, [V4Attn::Sliding, V4Attn::Csa, V4Attn::Hca, V4Attn::Csa]);
        assert_eq!(v4.hash, [true, true, false, false]);
        assert_eq!((v4.csa_rate, v4.hca_rate, v4.window, v4.rope_dim, v4.hc_mult), (4, 8, 6, 8, 3));
        assert_eq!(c.router.scoring, Scoring::SqrtSoftplus);
        assert!(matches!(v4.compress_rope.kind, crate::model::rope::RopeKind::Yarn { .. }));
        assert_eq!(v4.compress_rope.theta, 40000.0);
        assert_eq!(v4.main_rope.theta, 10000.0);
    }

    /// The legacy fields of the release's config.json (V4-Flash's shape, few layers).
    #[test]
    fn legacy_fields_fold_in() {
        let v = serde_json::json!({"model_type":"deepseek_v4","num_hidden_layers":4,
            "compress_ratios":[0,4,128,4],"num_hash_layers":1,"qk_rope_head_dim":64,"head_dim":512,
            "rope_theta":10000,"compress_rope_theta":160000,
            "rope_scaling":{"type":"yarn","factor":16,"original_max_position_embeddings":65536,
                "beta_fast":32,"beta_slow":1}});
        let c = ModelConfig::from_value(&v).unwrap();
        let v4 = c.v4.unwrap();
        assert_eq!(v4.layers, [V4Attn::Sliding, V4Attn::Csa, V4Attn::Hca, V4Attn::Csa]);
        assert_eq!(v4.hash, [true, false, false, false]);
        assert_eq!(v4.rope_dim, 64);
        let crate::model::rope::RopeKind::Yarn { attention_factor, factor, .. } = v4.compress_rope.kind else {
            panic!("yarn")
        };
        assert_eq!((attention_factor, factor), (Some(1.0), 16.0));
        assert_eq!(v4.main_rope.kind, crate::model::rope::RopeKind::Default);
    }

    /// The release's quantization_config (V4-Flash's, expert_dtype at the top level) is
    /// read; every other method, format or expert type is refused with its field named.
    #[test]
    fn the_release_quantization_is_read_and_others_refused_by_name() {
        let release = serde_json::json!({"activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8",
            "scale_fmt":"ue8m0","weight_block_size":[128,128]});
        let mut v = fixture();
        v["quantization_config"] = release.clone();
        v["expert_dtype"] = "fp4".into();
        assert_eq!(ModelConfig::from_value(&v).unwrap().family, Family::DeepseekV4);
        let mut v = fixture();
        v["quantization_config"] = release.clone();
        v["quantization_config"]["expert_dtype"] = "fp4".into();
        assert!(ModelConfig::from_value(&v).is_ok());
        let refused = |edit: &dyn Fn(&mut Value), want: &str| {
            let mut v = fixture();
            v["quantization_config"] = release.clone();
            v["expert_dtype"] = "fp4".into();
            edit(&mut v);
            let e = ModelConfig::from_value(&v).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        refused(&|v| v["expert_dtype"] = "int4".into(), "expert_dtype \"int4\"");
        refused(&|v| v["quantization_config"]["expert_dtype"] = "nvfp4".into(), "quantization_config.expert_dtype");
        refused(&|v| v["quantization_config"]["quant_method"] = "mxfp4".into(), "quant_method \"mxfp4\"");
        refused(&|v| v["quantization_config"]["fmt"] = "e5m2".into(), "fmt \"e5m2\"");
        refused(&|v| v["quantization_config"]["scale_fmt"] = "e4m3".into(), "scale_fmt \"e4m3\"");
        refused(&|v| v["quantization_config"]["weight_block_size"] = 128.into(), "weight_block_size");
        refused(
            &|v| {
                v.as_object_mut().unwrap().remove("quantization_config");
            },
            "needs a quantization_config",
        );
        let mut v = fixture();
        v["layer_types"][1] = "full_attention".into();
        assert!(ModelConfig::from_value(&v).unwrap_err().to_string().contains("full_attention"));
    }
}
