//! Model configuration: Hugging Face `config.json` of each supported family, read into
//! one architecture description with options. The rest of the engine never looks at
//! `model_type`; it reads the options below (qk-norm kind, biases, shared expert, ...).

use serde_json::Value;

use crate::error::{Error, Result};
use crate::experts::cache::ExpertShape;
use crate::model::rope::RopeConfig;

/// Which model family a checkpoint belongs to (Hugging Face `model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Mixtral,
    Qwen2Moe,
    Qwen3Moe,
    Olmoe,
}

impl Family {
    pub fn from_model_type(t: &str) -> Result<Self> {
        Ok(match t {
            "mixtral" => Family::Mixtral,
            "qwen2_moe" => Family::Qwen2Moe,
            "qwen3_moe" => Family::Qwen3Moe,
            "olmoe" => Family::Olmoe,
            other => return Err(Error::UnknownModelType(other.to_string())),
        })
    }
}

/// Normalisation of the query/key projections before RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// RMSNorm over each head's `head_dim` values (qwen3_moe).
    PerHead,
    /// RMSNorm over the whole q (n_heads*head_dim) and k (n_kv_heads*head_dim) projection (olmoe).
    Full,
}

/// How router probabilities are turned into the top-k mixing weights.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterConfig {
    pub n_experts: usize,
    pub top_k: usize,
    /// Renormalise the k selected probabilities to sum to one.
    pub norm_topk_prob: bool,
}

/// Everything the forward pass needs to know about a model.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub family: Family,
    pub model_type: String,
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub rms_eps: f32,
    pub max_positions: usize,
    pub rope: RopeConfig,
    pub qkv_bias: bool,
    pub qk_norm: QkNorm,
    /// Clamp q, k and v to [-c, c] after projection (olmoe `clip_qkv`).
    pub clip_qkv: Option<f32>,
    /// Per layer: attend only to the last `w` positions (None = full causal attention).
    pub sliding_window: Vec<Option<usize>>,
    pub router: RouterConfig,
    /// Intermediate size of each routed expert.
    pub expert_intermediate: usize,
    /// Intermediate size of the dense MLP used by non-MoE layers.
    pub dense_intermediate: usize,
    /// Intermediate size of the always-on shared expert, gated by a sigmoid (qwen2_moe).
    pub shared_expert_intermediate: Option<usize>,
    /// Per layer: true if the FFN is a routed MoE block, false for a dense MLP.
    pub moe_layers: Vec<bool>,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

fn get_usize(v: &Value, key: &str) -> Option<usize> {
    v.get(key).and_then(Value::as_u64).map(|x| x as usize)
}

fn need_usize(v: &Value, key: &str) -> Result<usize> {
    get_usize(v, key).ok_or_else(|| Error::Config(format!("missing or invalid integer {key:?}")))
}

fn first_usize(v: &Value, keys: &[&str]) -> Result<usize> {
    keys.iter()
        .find_map(|k| get_usize(v, k))
        .ok_or_else(|| Error::Config(format!("missing integer {:?}", keys.join(" or "))))
}

fn get_f64(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn get_bool(v: &Value, key: &str) -> Option<bool> {
    v.get(key).and_then(Value::as_bool)
}

/// Token ids in config.json may be an integer, a list of integers or null.
pub fn parse_token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

impl ModelConfig {
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Self> {
        let v: Value =
            serde_json::from_slice(bytes).map_err(|e| Error::Config(format!("config.json is not valid JSON: {e}")))?;
        Self::from_value(&v)
    }

    pub fn from_value(v: &Value) -> Result<Self> {
        let model_type = v
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::Config("missing \"model_type\"".into()))?
            .to_string();
        let family = Family::from_model_type(&model_type)?;
        let hidden = need_usize(v, "hidden_size")?;
        let n_layers = need_usize(v, "num_hidden_layers")?;
        let n_heads = need_usize(v, "num_attention_heads")?;
        let n_kv_heads = get_usize(v, "num_key_value_heads").unwrap_or(n_heads);
        let vocab = need_usize(v, "vocab_size")?;
        if hidden == 0 || n_layers == 0 || n_heads == 0 || n_kv_heads == 0 || vocab == 0 {
            return Err(Error::Config("sizes must be positive".into()));
        }
        if n_heads % n_kv_heads != 0 {
            return Err(Error::Config(format!(
                "num_attention_heads ({n_heads}) is not a multiple of num_key_value_heads ({n_kv_heads})"
            )));
        }
        // olmoe derives head_dim from hidden_size (its k_norm is sized that way).
        let head_dim = match (family, get_usize(v, "head_dim")) {
            (Family::Olmoe, _) | (_, None) => {
                if hidden % n_heads != 0 {
                    return Err(Error::Config(format!(
                        "hidden_size {hidden} is not divisible by num_attention_heads {n_heads} and no head_dim is given"
                    )));
                }
                hidden / n_heads
            }
            (_, Some(d)) => d,
        };
        if head_dim % 2 != 0 {
            return Err(Error::Config(format!("head_dim {head_dim} must be even for RoPE")));
        }
        let rms_eps = get_f64(v, "rms_norm_eps").unwrap_or(1e-6) as f32;
        let max_positions = get_usize(v, "max_position_embeddings").unwrap_or(4096);
        let rope = RopeConfig::from_config(v, head_dim, max_positions)?;

        let n_experts = first_usize(v, &["num_local_experts", "num_experts"])?;
        let top_k = need_usize(v, "num_experts_per_tok")?;
        if top_k == 0 || top_k > n_experts {
            return Err(Error::Config(format!(
                "num_experts_per_tok {top_k} must be between 1 and the number of experts {n_experts}"
            )));
        }
        let norm_topk_prob = match family {
            Family::Mixtral => true,
            _ => get_bool(v, "norm_topk_prob").unwrap_or(false),
        };

        let (qkv_bias, qk_norm, clip_qkv) = match family {
            Family::Mixtral => (false, QkNorm::None, None),
            Family::Qwen2Moe => (get_bool(v, "qkv_bias").unwrap_or(true), QkNorm::None, None),
            Family::Qwen3Moe => (get_bool(v, "attention_bias").unwrap_or(false), QkNorm::PerHead, None),
            Family::Olmoe => {
                (get_bool(v, "attention_bias").unwrap_or(false), QkNorm::Full, get_f64(v, "clip_qkv").map(|c| c as f32))
            }
        };

        let (expert_intermediate, dense_intermediate) = match family {
            Family::Mixtral | Family::Olmoe => {
                let i = need_usize(v, "intermediate_size")?;
                (i, i)
            }
            Family::Qwen2Moe | Family::Qwen3Moe => {
                (need_usize(v, "moe_intermediate_size")?, get_usize(v, "intermediate_size").unwrap_or(0))
            }
        };
        let shared_expert_intermediate = match family {
            Family::Qwen2Moe => get_usize(v, "shared_expert_intermediate_size").filter(|&s| s > 0),
            _ => None,
        };

        let moe_layers: Vec<bool> = match family {
            Family::Qwen2Moe | Family::Qwen3Moe => {
                let step = get_usize(v, "decoder_sparse_step").unwrap_or(1).max(1);
                let only: Vec<usize> = v
                    .get("mlp_only_layers")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_u64).map(|x| x as usize).collect())
                    .unwrap_or_default();
                (0..n_layers).map(|l| !only.contains(&l) && n_experts > 0 && (l + 1) % step == 0).collect()
            }
            _ => vec![true; n_layers],
        };
        if moe_layers.iter().any(|m| !m) && dense_intermediate == 0 {
            return Err(Error::Config("dense layers need \"intermediate_size\"".into()));
        }

        let sliding_window = sliding_windows(v, family, n_layers);

        Ok(ModelConfig {
            family,
            model_type,
            hidden,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab,
            rms_eps,
            max_positions,
            rope,
            qkv_bias,
            qk_norm,
            clip_qkv,
            sliding_window,
            router: RouterConfig { n_experts, top_k, norm_topk_prob },
            expert_intermediate,
            dense_intermediate,
            shared_expert_intermediate,
            moe_layers,
            tie_word_embeddings: get_bool(v, "tie_word_embeddings").unwrap_or(false),
            bos_token_id: parse_token_ids(v.get("bos_token_id")).first().copied(),
            eos_token_ids: parse_token_ids(v.get("eos_token_id")),
        })
    }

    /// Checks `ids` before a forward pass that starts at position `pos0`: not empty,
    /// inside the vocabulary, and within the context limit.
    pub fn check_input(&self, ids: &[u32], pos0: usize) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::Invalid("no tokens to process".into()));
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(Error::TokenOutOfRange { id, vocab: self.vocab });
        }
        if pos0 + ids.len() > self.max_positions {
            return Err(Error::ContextOverflow { len: pos0 + ids.len(), limit: self.max_positions });
        }
        Ok(())
    }

    /// What the expert cache needs of this config: the MoE layers and one expert's shape.
    pub fn expert_shape(&self) -> ExpertShape {
        ExpertShape {
            moe_layers: self.moe_layers.clone(),
            hidden: self.hidden,
            intermediate: self.expert_intermediate,
            n_experts: self.router.n_experts,
            top_k: self.router.top_k,
        }
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// Per-layer sliding windows. Mixtral applies `sliding_window` to every layer when it is
/// set; the Qwen families only when `use_sliding_window` is on, following `layer_types`
/// when the config lists them (else layers from `max_window_layers` on).
fn sliding_windows(v: &Value, family: Family, n_layers: usize) -> Vec<Option<usize>> {
    let window = get_usize(v, "sliding_window").filter(|&w| w > 0);
    match family {
        Family::Mixtral => vec![window; n_layers],
        Family::Qwen2Moe | Family::Qwen3Moe if get_bool(v, "use_sliding_window").unwrap_or(false) => {
            if let Some(types) = v.get("layer_types").and_then(Value::as_array) {
                (0..n_layers)
                    .map(|l| match types.get(l).and_then(Value::as_str) {
                        Some("sliding_attention") => window,
                        _ => None,
                    })
                    .collect()
            } else {
                let from = get_usize(v, "max_window_layers").unwrap_or(n_layers);
                (0..n_layers).map(|l| if l >= from { window } else { None }).collect()
            }
        }
        _ => vec![None; n_layers],
    }
}

#[cfg(test)]
mod tests {
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
}
