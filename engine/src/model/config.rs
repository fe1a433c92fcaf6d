//! Model configuration: Hugging Face `config.json` of each supported family, read into
//! one architecture description with options. The rest of the engine never looks at
//! `model_type`; it reads the options below (qk-norm kind, biases, shared expert, ...).

use serde_json::Value;

use crate::error::{Error, Result};
use crate::experts::cache::ExpertShape;
pub use crate::kernels::Activation;
use crate::model::rope::RopeConfig;
use deepseek::{mla_config, sigmoid_router};
pub use read::parse_token_ids;
use read::{
    bounded, first_usize, get_bool, get_f64, get_usize, layer_types, need_usize, optional_usize, refuse_unsupported,
    sliding_windows,
};

mod deepseek;
mod deepseek_v4;
mod gpt_oss;
mod qwen3_5_moe;
mod qwen3_next;
mod read;

pub use deepseek_v4::{V4Attn, V4Config};
pub use qwen3_next::LinearAttnConfig;

/// Which model family a checkpoint belongs to (Hugging Face `model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Mixtral,
    Qwen2Moe,
    Qwen3Moe,
    Olmoe,
    /// DeepSeek-V3/R1 (and Kimi-K2, which ships the same architecture): MLA attention,
    /// sigmoid router with correction bias and group-limited top-k, shared experts,
    /// dense first layers.
    DeepseekV3,
    /// GLM-4.5/4.6: GQA with q/k/v biases and optional per-head q/k norms, partial
    /// RoPE, deepseek_v3's router, shared experts and dense first layers.
    Glm4Moe,
    /// gpt-oss: GQA with biases on q/k/v/o and attention sinks, sliding window on
    /// alternate layers, YaRN, a biased router softmaxed over its top-k, experts with
    /// biases and the clamped SwiGLU.
    GptOss,
    /// Qwen3-Next: Gated DeltaNet linear-attention layers (a recurrent state instead of a
    /// KV cache) between full-attention layers whose q_proj also yields an output gate,
    /// per-head q/k norms, partial RoPE; zero-centred RMSNorms (scale 1 + w); the softmax
    /// router and a shared expert with a sigmoid gate (qwen2_moe's MoE).
    Qwen3Next,
    /// Qwen3.5/3.6 MoE (`qwen3_5_moe`, the text tower of the image-text release, or
    /// `qwen3_5_moe_text`): qwen3_next's hybrid stack with the DeltaNet input projections
    /// stored apart, every layer MoE and the top-k always renormalised (`qwen3_5_moe`).
    Qwen35Moe,
    /// DeepSeek-V4: hyper-connection residual streams, sliding / compressed sparse /
    /// heavily compressed attention per layer, hash-routed and sqrtsoftplus-routed MoE
    /// (`deepseek_v4`, [`crate::model::v4`]).
    DeepseekV4,
}

impl Family {
    pub fn from_model_type(t: &str) -> Result<Self> {
        Ok(match t {
            "mixtral" => Family::Mixtral,
            "qwen2_moe" => Family::Qwen2Moe,
            "qwen3_moe" => Family::Qwen3Moe,
            "olmoe" => Family::Olmoe,
            // Kimi-K2 ships DeepSeek-V3's architecture under its own name (transformers'
            // kimi_k25 maps a "kimi_k2" text config to deepseek_v3 the same way).
            "deepseek_v3" | "kimi_k2" => Family::DeepseekV3,
            // DeepSeek-V3.2 and GLM-5: DeepSeek-V3 plus DeepSeek Sparse Attention.
            "deepseek_v32" | "glm_moe_dsa" => Family::DeepseekV3,
            "glm4_moe" => Family::Glm4Moe,
            "gpt_oss" => Family::GptOss,
            "qwen3_next" => Family::Qwen3Next,
            "qwen3_5_moe" | "qwen3_5_moe_text" => Family::Qwen35Moe,
            "deepseek_v4" => Family::DeepseekV4,
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

/// How a router turns its logits into per-expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    /// softmax over all experts (mixtral, qwen, olmoe).
    Softmax,
    /// sigmoid of each logit on its own (deepseek_v3).
    Sigmoid,
    /// The top-k are chosen on the logits themselves; their weights are the softmax over
    /// the k chosen logits only (gpt_oss).
    SoftmaxOfTopk,
    /// sqrt(softplus(logit)) of each logit on its own (deepseek_v4).
    SqrtSoftplus,
}

/// How router logits become the top-k experts and their mixing weights: the options of
/// the one routing function, [`crate::model::moe::route`].
#[derive(Clone, Debug, PartialEq)]
pub struct RouterConfig {
    pub n_experts: usize,
    pub top_k: usize,
    /// Renormalise the k selected scores to sum to one.
    pub norm_topk_prob: bool,
    pub scoring: Scoring,
    /// Group-limited selection: the experts form `n_group` equal groups and only the
    /// `topk_group` groups whose two best selection scores sum highest are candidates.
    /// 1 and 1 select over all experts.
    pub n_group: usize,
    pub topk_group: usize,
    /// Multiplies the final mixing weights (after renormalisation).
    pub routed_scaling_factor: f32,
    /// The layer's router has a per-expert bias added to the scores for the selection
    /// only, never to the mixing weights (`e_score_correction_bias`).
    pub correction_bias: bool,
    /// The router is a linear layer with a bias (gpt_oss's `router.bias`), added to its
    /// logits before anything else.
    pub logit_bias: bool,
}

impl RouterConfig {
    /// The softmax router of mixtral, qwen and olmoe: top-k over all experts.
    pub fn softmax(n_experts: usize, top_k: usize, norm_topk_prob: bool) -> Self {
        RouterConfig {
            n_experts,
            top_k,
            norm_topk_prob,
            scoring: Scoring::Softmax,
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: 1.0,
            correction_bias: false,
            logit_bias: false,
        }
    }
}

/// Multi-head Latent Attention (deepseek_v3): queries through an optional low-rank
/// bottleneck; keys and values of every head expanded from one compressed latent per
/// position, plus one rotary key shared by all heads. Each head's query and key are
/// `qk_nope_head_dim` values without position followed by `qk_rope_head_dim` rotated ones.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    /// None: a plain q_proj; Some(r): q_a_proj (r) -> RMSNorm -> q_b_proj.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// The rotary dimensions come as interleaved pairs (x0, x1), (x2, x3), ... rather than
    /// as two halves (transformers' `rope_interleave`, true for the released checkpoints).
    pub rope_interleave: bool,
    /// DeepSeek Sparse Attention (deepseek_v32, glm_moe_dsa): a lightning indexer picks the
    /// positions each query attends to ([`crate::model::dsa`]).
    pub dsa: Option<DsaConfig>,
}

/// DeepSeek Sparse Attention's indexer (transformers' `DeepseekV32Indexer`).
#[derive(Clone, Debug, PartialEq)]
pub struct DsaConfig {
    /// Positions each query keeps (`index_topk`).
    pub topk: usize,
    /// The indexer's heads and head size (`index_n_heads`, `index_head_dim`).
    pub n_heads: usize,
    pub head_dim: usize,
    /// Its rotary slice (the first qk_rope_head_dim of a head) comes as interleaved pairs
    /// (glm_moe_dsa) rather than halves (deepseek_v32).
    pub interleave: bool,
    /// Per layer: runs its own indexer ("full"), or reuses the selection of the last
    /// layer that did ("shared", glm_moe_dsa's `indexer_types`).
    pub full: Vec<bool>,
}

impl MlaConfig {
    /// Floats cached per position by the widest layer: the latent, the rotary key and,
    /// with DSA, the indexer's key.
    pub fn cache_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim + self.dsa.as_ref().map_or(0, |d| d.head_dim)
    }

    /// Floats cached per position by layer `l`: [latent, rotary key] and, where the layer
    /// runs the indexer, its key.
    pub fn cache_width_at(&self, l: usize) -> usize {
        let index = self.dsa.as_ref().filter(|d| d.full.get(l) == Some(&true)).map_or(0, |d| d.head_dim);
        self.kv_lora_rank + self.qk_rope_head_dim + index
    }

    /// Whether layer `l` runs DSA's indexer (None: the layer has no DSA). A multi-token
    /// prediction layer (past the model's layers) attends densely: its drafts are checked
    /// by the model, so this changes how many are accepted, never a token.
    pub fn indexer_at(&self, l: usize) -> Option<bool> {
        self.dsa.as_ref().and_then(|d| d.full.get(l).copied())
    }
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
    /// o_proj has a bias (gpt_oss).
    pub o_bias: bool,
    /// Each head has a learned sink logit that joins its softmax denominator (gpt_oss).
    pub attn_sinks: bool,
    pub qk_norm: QkNorm,
    /// q_proj yields, per head, the query and then an output gate of the same size; the
    /// attention output is multiplied by sigmoid(gate) before o_proj (qwen3_next).
    pub attn_output_gate: bool,
    /// Every RMSNorm weight w of the checkpoint scales by 1 + w (qwen3_next's zero-centred
    /// norms: input, post-attention, final and q/k norms); added once at load.
    pub norm_plus_one: bool,
    /// Gated DeltaNet sizes and which layers use it instead of attention (qwen3_next).
    pub linear_attn: Option<LinearAttnConfig>,
    /// Multi-head Latent Attention instead of grouped-query attention (deepseek_v3); then
    /// `head_dim` is the query/key head size (nope + rope) and `n_kv_heads == n_heads`.
    pub mla: Option<MlaConfig>,
    /// Multiplies q.k before the softmax: head_dim^-0.5, times YaRN's mscale^2 for MLA.
    pub attn_scale: f32,
    /// Clamp q, k and v to [-c, c] after projection (olmoe `clip_qkv`).
    pub clip_qkv: Option<f32>,
    /// Per layer: attend only to the last `w` positions (None = full causal attention).
    pub sliding_window: Vec<Option<usize>>,
    pub router: RouterConfig,
    /// Intermediate size of each routed expert.
    pub expert_intermediate: usize,
    /// How the experts' gate and up projections combine (SiLU, or gpt_oss's clamped SwiGLU).
    pub ffn_act: Activation,
    /// Routed experts have biases on gate, up and down (gpt_oss), kept with the dense
    /// weights of their layer.
    pub expert_bias: bool,
    /// Intermediate size of the dense MLP used by non-MoE layers.
    pub dense_intermediate: usize,
    /// Intermediate size of the always-on shared expert (all of deepseek_v3's
    /// `n_shared_experts` form one MLP of n times the size).
    pub shared_expert_intermediate: Option<usize>,
    /// The shared expert's output is scaled by sigmoid(shared_expert_gate x) (qwen2_moe);
    /// otherwise it is added as is (deepseek_v3).
    pub shared_expert_gated: bool,
    /// Per layer: true if the FFN is a routed MoE block, false for a dense MLP.
    pub moe_layers: Vec<bool>,
    pub tie_word_embeddings: bool,
    /// Multi-token-prediction layers stored after the decoder layers (DeepSeek-V3's
    /// layer 61, `num_nextn_predict_layers`): weights that next-token decoding does not
    /// use (transformers skips them too) and that conversion leaves out.
    pub mtp_layers: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// DeepSeek-V4's own sizes (None for every other family).
    pub v4: Option<Box<V4Config>>,
}

/// Upper bounds of the sizes a config.json may claim. Every size is checked against these
/// before anything is allocated from it, and later against the tensors actually present,
/// so a damaged or hostile config gives an error, never an allocation of 2^40 bytes.
/// The largest released MoE models stay far below them (DeepSeek-V3: 61 layers, 7168
/// hidden, 256 experts, 129280 vocabulary; Qwen3-235B: 94 layers, 128 experts).
pub mod limits {
    pub const MAX_LAYERS: usize = 1024;
    pub const MAX_HIDDEN: usize = 1 << 16;
    pub const MAX_HEADS: usize = 1024;
    pub const MAX_HEAD_DIM: usize = 4096;
    pub const MAX_VOCAB: usize = 1 << 22;
    pub const MAX_EXPERTS: usize = 1 << 12;
    /// Layers x experts: the size of a usage table (8 bytes per entry).
    pub const MAX_LAYER_EXPERTS: usize = 1 << 20;
    pub const MAX_INTERMEDIATE: usize = 1 << 18;
    pub const MAX_POSITIONS: usize = 1 << 24;
    /// vocab x hidden (the embedding), also a bound for every 2-D weight.
    pub const MAX_MATRIX: u64 = 1 << 36;
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
        if family == Family::DeepseekV4 {
            return deepseek_v4::model_config(v, model_type);
        }
        let text;
        let v = match model_type.as_str() {
            "qwen3_5_moe" => {
                text = qwen3_5_moe::text_config(v)?;
                &text
            }
            _ => v,
        };
        refuse_unsupported(v, family)?;
        use limits::*;
        let hidden = bounded("hidden_size", need_usize(v, "hidden_size")?, MAX_HIDDEN)?;
        let n_layers = bounded("num_hidden_layers", need_usize(v, "num_hidden_layers")?, MAX_LAYERS)?;
        let n_heads = bounded("num_attention_heads", need_usize(v, "num_attention_heads")?, MAX_HEADS)?;
        let n_kv_heads =
            bounded("num_key_value_heads", get_usize(v, "num_key_value_heads").unwrap_or(n_heads), n_heads)?;
        let vocab = bounded("vocab_size", need_usize(v, "vocab_size")?, MAX_VOCAB)?;
        // In u64: on wasm32 a usize product of two bounded sizes can still overflow.
        if vocab as u64 * hidden as u64 > MAX_MATRIX {
            return Err(Error::Config(format!(
                "vocab_size x hidden_size = {} is larger than this engine allows ({MAX_MATRIX})",
                vocab as u64 * hidden as u64
            )));
        }
        if hidden == 0 || n_layers == 0 || n_heads == 0 || n_kv_heads == 0 || vocab == 0 {
            return Err(Error::Config("sizes must be positive".into()));
        }
        if n_heads % n_kv_heads != 0 {
            return Err(Error::Config(format!(
                "num_attention_heads ({n_heads}) is not a multiple of num_key_value_heads ({n_kv_heads})"
            )));
        }
        let mla = match family {
            Family::DeepseekV3 => Some(mla_config(v, n_heads, n_kv_heads, n_layers)?),
            _ => None,
        };
        // olmoe derives head_dim from hidden_size (its k_norm is sized that way); MLA's
        // query/key head is the unrotated part followed by the rotated one.
        let head_dim = match (family, get_usize(v, "head_dim")) {
            _ if mla.is_some() => mla.as_ref().map_or(0, |m| m.qk_nope_head_dim + m.qk_rope_head_dim),
            (Family::GptOss, None) => 64,                         // GptOssConfig's default
            (Family::Qwen3Next | Family::Qwen35Moe, None) => 256, // Qwen3NextConfig's default
            (Family::Olmoe, _) | (_, None) => {
                if hidden % n_heads != 0 {
                    return Err(Error::Config(format!(
                        "hidden_size {hidden} is not divisible by num_attention_heads {n_heads} and no head_dim is given"
                    )));
                }
                hidden / n_heads
            }
            (_, Some(d)) => bounded("head_dim", d, MAX_HEAD_DIM)?,
        };
        if head_dim == 0 {
            return Err(Error::Config("head_dim must be positive".into()));
        }
        if mla.is_none() && head_dim % 2 != 0 {
            return Err(Error::Config(format!("head_dim {head_dim} must be even for RoPE")));
        }
        let rms_eps = get_f64(v, "rms_norm_eps").unwrap_or(if family == Family::GptOss { 1e-5 } else { 1e-6 }) as f32;
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(Error::Config(format!("rms_norm_eps {rms_eps} must be a finite number >= 0")));
        }
        let max_positions =
            bounded("max_position_embeddings", get_usize(v, "max_position_embeddings").unwrap_or(4096), MAX_POSITIONS)?;
        if max_positions == 0 {
            return Err(Error::Config("max_position_embeddings must be positive".into()));
        }
        // glm4_moe rotates half of each head unless told otherwise (transformers sets
        // partial_rotary_factor 0.5 by default).
        let default_partial = match family {
            Family::Glm4Moe => 0.5,
            Family::Qwen3Next | Family::Qwen35Moe => 0.25,
            _ => 1.0,
        };
        let gpt_oss_rope;
        let rope_src = match family {
            Family::GptOss => {
                gpt_oss_rope = gpt_oss::with_default_rope(v);
                &gpt_oss_rope
            }
            _ => v,
        };
        let rope = RopeConfig::from_config_with_partial(
            rope_src,
            mla.as_ref().map_or(head_dim, |m| m.qk_rope_head_dim),
            max_positions,
            default_partial,
        )?;
        let attn_scale = match &mla {
            // transformers: qk_head_dim ** -0.5 * mscale * mscale, in float64.
            Some(_) => {
                let m = crate::model::rope::softmax_mscale(v)?;
                (libm::pow(head_dim as f64, -0.5) * m * m) as f32
            }
            None => (head_dim as f32).powf(-0.5),
        };
        if mla.is_some() && rope.rotary_dim != head_dim - mla.as_ref().map_or(0, |m| m.qk_nope_head_dim) {
            return Err(Error::Config("partial_rotary_factor is not supported with MLA (deepseek_v3)".into()));
        }

        let n_experts = bounded(
            "num_experts",
            first_usize(v, &["num_local_experts", "num_experts", "n_routed_experts"])?,
            MAX_EXPERTS,
        )?;
        bounded("num_hidden_layers x num_experts", n_layers * n_experts, MAX_LAYER_EXPERTS)?;
        let top_k = bounded("num_experts_per_tok", need_usize(v, "num_experts_per_tok")?, n_experts)?;
        if top_k == 0 || top_k > n_experts {
            return Err(Error::Config(format!(
                "num_experts_per_tok {top_k} must be between 1 and the number of experts {n_experts}"
            )));
        }
        let router = match family {
            Family::Mixtral => RouterConfig::softmax(n_experts, top_k, true),
            // transformers' defaults for absent fields differ between the two.
            Family::DeepseekV3 if model_type == "glm_moe_dsa" => sigmoid_router(v, n_experts, top_k, (1, 1, 2.5))?,
            Family::DeepseekV3 => sigmoid_router(v, n_experts, top_k, (8, 4, 2.5))?,
            Family::Glm4Moe => sigmoid_router(v, n_experts, top_k, (1, 1, 1.0))?,
            Family::GptOss => gpt_oss::router(n_experts, top_k),
            Family::Qwen3Next => RouterConfig::softmax(n_experts, top_k, get_bool(v, "norm_topk_prob").unwrap_or(true)),
            // Qwen3.5's router always renormalises (transformers has no norm_topk_prob for it).
            Family::Qwen35Moe => RouterConfig::softmax(n_experts, top_k, true),
            _ => RouterConfig::softmax(n_experts, top_k, get_bool(v, "norm_topk_prob").unwrap_or(false)),
        };

        let (qkv_bias, qk_norm, clip_qkv) = match family {
            Family::Mixtral | Family::DeepseekV3 | Family::DeepseekV4 => (false, QkNorm::None, None),
            Family::Glm4Moe => (
                get_bool(v, "attention_bias").unwrap_or(false),
                if get_bool(v, "use_qk_norm").unwrap_or(false) { QkNorm::PerHead } else { QkNorm::None },
                None,
            ),
            Family::Qwen2Moe => (get_bool(v, "qkv_bias").unwrap_or(true), QkNorm::None, None),
            Family::GptOss => (get_bool(v, "attention_bias").unwrap_or(true), QkNorm::None, None),
            Family::Qwen3Moe | Family::Qwen3Next | Family::Qwen35Moe => {
                (get_bool(v, "attention_bias").unwrap_or(false), QkNorm::PerHead, None)
            }
            Family::Olmoe => {
                (get_bool(v, "attention_bias").unwrap_or(false), QkNorm::Full, get_f64(v, "clip_qkv").map(|c| c as f32))
            }
        };

        let (expert_intermediate, dense_intermediate) = match family {
            Family::Mixtral | Family::Olmoe | Family::GptOss => {
                let i = need_usize(v, "intermediate_size")?;
                (i, i)
            }
            Family::Qwen2Moe
            | Family::Qwen3Moe
            | Family::Qwen3Next
            | Family::Qwen35Moe
            | Family::DeepseekV3
            | Family::DeepseekV4
            | Family::Glm4Moe => {
                (need_usize(v, "moe_intermediate_size")?, get_usize(v, "intermediate_size").unwrap_or(0))
            }
        };
        let shared_expert_intermediate = match family {
            Family::Qwen2Moe => get_usize(v, "shared_expert_intermediate_size").filter(|&s| s > 0),
            Family::Qwen3Next | Family::Qwen35Moe => {
                Some(optional_usize(v, "shared_expert_intermediate_size", 512)?).filter(|&s| s > 0)
            }
            Family::DeepseekV3 | Family::Glm4Moe => {
                let n = optional_usize(v, "n_shared_experts", 1)?;
                bounded("n_shared_experts", n, MAX_EXPERTS)?;
                Some(n * expert_intermediate).filter(|&s| s > 0)
            }
            _ => None,
        };
        bounded("intermediate_size", dense_intermediate, MAX_INTERMEDIATE)?;
        bounded("moe_intermediate_size", expert_intermediate, MAX_INTERMEDIATE)?;
        if expert_intermediate == 0 {
            return Err(Error::Config("the experts' intermediate size must be positive".into()));
        }
        if let Some(s) = shared_expert_intermediate {
            bounded("shared_expert_intermediate_size", s, MAX_INTERMEDIATE)?;
        }
        if clip_qkv.is_some_and(|c| !(c.is_finite() && c >= 0.0)) {
            // f32::clamp(-c, c) panics on NaN or a negative c.
            return Err(Error::Config("clip_qkv must be a finite number >= 0".into()));
        }

        let moe_layers: Vec<bool> = match family {
            Family::Qwen2Moe | Family::Qwen3Moe | Family::Qwen3Next => {
                let step = get_usize(v, "decoder_sparse_step").unwrap_or(1).max(1);
                let only: Vec<usize> = v
                    .get("mlp_only_layers")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_u64).map(|x| x as usize).collect())
                    .unwrap_or_default();
                (0..n_layers).map(|l| !only.contains(&l) && n_experts > 0 && (l + 1) % step == 0).collect()
            }
            Family::DeepseekV3 | Family::Glm4Moe => {
                // transformers ignores moe_layer_freq; DeepSeek's own code reads it. Only
                // the value on which both agree is accepted.
                let freq = optional_usize(v, "moe_layer_freq", 1)?;
                if freq != 1 {
                    return Err(Error::Config(format!("moe_layer_freq = {freq} is not supported (only 1)")));
                }
                let dense = optional_usize(v, "first_k_dense_replace", if family == Family::Glm4Moe { 1 } else { 3 })?;
                match v.get("mlp_layer_types") {
                    // deepseek_v32 / glm_moe_dsa spell the same pattern out per layer.
                    Some(Value::Array(types)) => deepseek::mlp_layer_types(types, n_layers)?,
                    _ => (0..n_layers).map(|l| l >= dense).collect(),
                }
            }
            _ => vec![true; n_layers],
        };
        if moe_layers.iter().any(|m| !m) && dense_intermediate == 0 {
            return Err(Error::Config("dense layers need \"intermediate_size\"".into()));
        }

        let sliding_window = match family {
            Family::GptOss => gpt_oss::sliding_windows(v, n_layers)?,
            _ => sliding_windows(v, family, n_layers),
        };

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
            // qwen3_next's attention_bias puts a bias on o_proj too.
            o_bias: matches!(family, Family::GptOss | Family::Qwen3Next | Family::Qwen35Moe) && qkv_bias,
            attn_sinks: family == Family::GptOss,
            qk_norm,
            attn_output_gate: family.is_qwen_hybrid(),
            norm_plus_one: family.is_qwen_hybrid(),
            linear_attn: match family {
                Family::Qwen3Next => Some(qwen3_next::linear_config(v, n_layers)?),
                Family::Qwen35Moe => {
                    Some(LinearAttnConfig { split_in_proj: true, ..qwen3_next::linear_config(v, n_layers)? })
                }
                _ => None,
            },
            mla,
            attn_scale,
            clip_qkv,
            sliding_window,
            router,
            expert_intermediate,
            ffn_act: match family {
                Family::GptOss => gpt_oss::activation(v)?,
                _ => Activation::Silu,
            },
            expert_bias: family == Family::GptOss,
            dense_intermediate,
            shared_expert_intermediate,
            shared_expert_gated: matches!(family, Family::Qwen2Moe | Family::Qwen3Next | Family::Qwen35Moe),
            moe_layers,
            tie_word_embeddings: get_bool(v, "tie_word_embeddings").unwrap_or(false),
            mtp_layers: match family {
                Family::DeepseekV3 | Family::Glm4Moe => bounded(
                    "num_nextn_predict_layers",
                    get_usize(v, "num_nextn_predict_layers").unwrap_or(0),
                    MAX_LAYERS,
                )?,
                Family::Qwen3Next | Family::Qwen35Moe => {
                    bounded("mtp_num_hidden_layers", get_usize(v, "mtp_num_hidden_layers").unwrap_or(0), MAX_LAYERS)?
                }
                _ => 0,
            },
            bos_token_id: parse_token_ids(v.get("bos_token_id")).first().copied(),
            eos_token_ids: parse_token_ids(v.get("eos_token_id")),
            v4: None,
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
            mtp_layers: 0,
        }
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// The tensor-name prefix of decoder layer `l`: `model.layers.{l}`, and past the main
    /// stack the multi-token-prediction layers: DeepSeek's and GLM's continue the
    /// numbering, qwen3_next's and qwen3_5_moe's are `mtp.layers.{l - n_layers}`.
    pub fn layer_prefix(&self, l: usize) -> String {
        match l.checked_sub(self.n_layers) {
            Some(m) if self.family.is_qwen_hybrid() => format!("mtp.layers.{m}"),
            _ => format!("model.layers.{l}"),
        }
    }

    /// Whether tensor `name` belongs to a multi-token-prediction layer ([`Self::mtp_layers`]).
    pub fn is_mtp_tensor(&self, name: &str) -> bool {
        // qwen3_next and qwen3_5_moe keep their multi-token-prediction module under "mtp."
        // (transformers ignores those keys on load).
        // DeepSeek-V4's release keeps its MTP module under "mtp." too (not run yet).
        if (self.family.is_qwen_hybrid() || self.family == Family::DeepseekV4) && name.starts_with("mtp.") {
            return true;
        }
        name.strip_prefix("model.layers.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse::<usize>().ok())
            .is_some_and(|l| l >= self.n_layers && l < self.n_layers + self.mtp_layers)
    }

    /// Floats the attention cache holds per token and layer: keys and values of every kv
    /// head, or MLA's latent and rotary key (576 at DeepSeek-V3's sizes).
    pub fn cache_floats_per_layer(&self) -> usize {
        self.mla.as_ref().map_or(2 * self.kv_dim(), MlaConfig::cache_width)
    }

    /// Floats cached per position by attention layer `l` (DSA's "shared" layers keep no
    /// indexer key).
    pub fn cache_floats_at(&self, l: usize) -> usize {
        self.mla.as_ref().map_or(2 * self.kv_dim(), |m| m.cache_width_at(l))
    }

    /// Layers with an attention cache: all but the linear-attention ones.
    pub fn attention_layers(&self) -> usize {
        self.linear_attn.as_ref().map_or(self.n_layers, |la| la.layers.iter().filter(|l| !**l).count())
    }

    /// Bytes the attention caches grow by per token (f32). DeepSeek-V4's grow by their
    /// compressed entries only (one of head_dim per `rate` positions, and the indexer's of
    /// index_head_dim on CSA layers), rounded up; its window and carry are bounded.
    pub fn kv_cache_bytes_per_token(&self) -> usize {
        if let Some(v4) = &self.v4 {
            let bytes: usize = v4
                .layers
                .iter()
                .map(|&k| match (k, v4.rate_of(k)) {
                    (V4Attn::Csa, Some(r)) => 4 * (self.head_dim + v4.index_head_dim) / r,
                    (_, Some(r)) => 4 * self.head_dim / r,
                    _ => 0,
                })
                .sum();
            return bytes.max(1);
        }
        let linear = |l: usize| self.linear_attn.as_ref().is_some_and(|la| la.layers.get(l) == Some(&true));
        (0..self.n_layers).filter(|&l| !linear(l)).map(|l| self.cache_floats_at(l)).sum::<usize>() * 4
    }

    /// Whether a session goes back only to snapshots of its state (Gated DeltaNet layers,
    /// DeepSeek-V4's compressed state), taken where a pass began or ended: callers end a
    /// prompt's passes where they will want one (`generate::snapshot_cuts`).
    pub fn rewinds_to_snapshots(&self) -> bool {
        self.linear_attn.is_some() || self.v4.is_some()
    }

    /// Bytes of the linear-attention layers' recurrent state, whatever the length (f32).
    pub fn recurrent_state_bytes(&self) -> usize {
        self.linear_attn.as_ref().map_or(0, |la| la.state_floats() * (self.n_layers - self.attention_layers()) * 4)
    }

    /// What the attention layers are: "gqa", "mla" (deepseek_v3), "gqa+deltanet"
    /// (qwen3_next: Gated DeltaNet layers with a recurrent state between GQA layers), or
    /// "v4" (deepseek_v4: sliding window plus compressed entries).
    pub fn attention_kind(&self) -> &'static str {
        if self.v4.is_some() {
            return "v4";
        }
        match (&self.mla, &self.linear_attn) {
            (Some(_), _) => "mla",
            (None, Some(_)) => "gqa+deltanet",
            (None, None) => "gqa",
        }
    }
}

#[cfg(test)]
mod tests;
