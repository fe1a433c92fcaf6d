//! What the three parts of a GGUF import share (`gguf_import` reads the file's tensors and
//! plans them, `gguf_config` writes its config.json, `gguf_tensor` decodes each planned
//! tensor): the supported architectures and what differs between them ([`Arch`]), the plan
//! of one Hugging Face tensor ([`Planned`] and its value maps), what the tensors say about
//! the model ([`Facts`]), and reading metadata values.

use super::gguf::{Gguf, Value};
use crate::error::{Error, Result};

/// What differs between the supported architectures.
pub(super) struct Arch {
    pub gguf: &'static str,
    pub model_type: &'static str,
    pub class: &'static str,
    /// Hugging Face module holding the router and experts.
    pub(super) moe: &'static str,
    /// Hugging Face names of an expert's gate, up and down projections.
    pub(super) expert_names: [&'static str; 3],
    /// The config key for the expert count.
    pub experts_key: &'static str,
    /// Whether q/k rows were permuted for rope by convert_hf_to_gguf.
    pub(super) permuted: bool,
    /// norm_topk_prob where llama.cpp hard-codes it per architecture (not in the file).
    pub norm_topk: Option<bool>,
    /// Hugging Face module of the shared expert(s) (`ffn_*_shexp`), if the family has one.
    pub(super) shared: Option<&'static str>,
    /// Biases on q/k/v (`attn_{q,k,v}.bias`) are part of the family.
    pub(super) qkv_bias: bool,
    /// Per-head or full q/k norms (`attn_{q,k}_norm`) are part of the family.
    pub(super) qk_norm: bool,
    /// Dense FFN layers (`ffn_{gate,up,down}`) are part of the family.
    pub(super) dense: bool,
    /// The sigmoid router's correction bias (`exp_probs_b`) is part of the family.
    pub(super) score_bias: bool,
    /// Multi-head latent attention (deepseek2) instead of q/k/v projections.
    pub(super) mla: bool,
    /// The router's module under `moe` (`ffn_gate_inp`).
    pub(super) router: &'static str,
    /// gpt-oss: biases on the router, the routed experts and o_proj, attention sinks.
    pub(super) oai: bool,
    /// qwen3next: Gated DeltaNet layers (`ssm_*`), gated attention, zero-centred norms
    /// stored with the 1 added.
    pub(super) next: bool,
    /// qwen35moe: the DeltaNet input projections apart (`attn_qkv`, `attn_gate`,
    /// `ssm_beta`, `ssm_alpha`: Hugging Face's `in_proj_{qkv,z,b,a}`), the value heads
    /// reordered from grouped by key head to tiled ([`VHeads`]).
    pub(super) split_in: bool,
    /// glm-dsa: DeepSeek Sparse Attention's lightning indexer (`indexer.*`).
    pub(super) dsa: bool,
}

pub(super) const BASE: Arch = Arch {
    gguf: "",
    model_type: "",
    class: "",
    moe: "mlp",
    expert_names: ["gate_proj", "up_proj", "down_proj"],
    experts_key: "num_experts",
    permuted: false,
    norm_topk: None,
    shared: None,
    qkv_bias: false,
    qk_norm: false,
    dense: false,
    score_bias: false,
    mla: false,
    router: "gate",
    oai: false,
    next: false,
    split_in: false,
    dsa: false,
};

pub(super) const ARCHES: &[Arch] = &[
    Arch {
        gguf: "qwen3moe",
        model_type: "qwen3_moe",
        class: "Qwen3MoeForCausalLM",
        norm_topk: Some(true),
        qk_norm: true,
        ..BASE
    },
    Arch {
        gguf: "olmoe",
        model_type: "olmoe",
        class: "OlmoeForCausalLM",
        norm_topk: Some(false),
        qk_norm: true,
        ..BASE
    },
    Arch {
        gguf: "llama",
        model_type: "mixtral",
        class: "MixtralForCausalLM",
        moe: "block_sparse_moe",
        expert_names: ["w1", "w3", "w2"],
        experts_key: "num_local_experts",
        permuted: true,
        ..BASE
    },
    // llama.cpp's qwen2moe graph never renormalises the top-k weights.
    Arch {
        gguf: "qwen2moe",
        model_type: "qwen2_moe",
        class: "Qwen2MoeForCausalLM",
        norm_topk: Some(false),
        shared: Some("shared_expert"),
        qkv_bias: true,
        dense: true,
        ..BASE
    },
    Arch {
        gguf: "glm4moe",
        model_type: "glm4_moe",
        class: "Glm4MoeForCausalLM",
        experts_key: "n_routed_experts",
        shared: Some("shared_experts"),
        qkv_bias: true,
        qk_norm: true,
        dense: true,
        score_bias: true,
        ..BASE
    },
    Arch {
        gguf: "deepseek2",
        model_type: "deepseek_v3",
        class: "DeepseekV3ForCausalLM",
        experts_key: "n_routed_experts",
        shared: Some("shared_experts"),
        dense: true,
        score_bias: true,
        mla: true,
        ..BASE
    },
    // gpt-oss: the experts' gate and up are separate tensors (convert_hf_to_gguf split the
    // alternating rows of gate_up_proj), MXFP4 in released files.
    Arch {
        gguf: "gpt-oss",
        model_type: "gpt_oss",
        class: "GptOssForCausalLM",
        experts_key: "num_local_experts",
        qkv_bias: true,
        router: "router",
        oai: true,
        ..BASE
    },
    // qwen3next: llama.cpp's graph renormalises the top-k weights (as Qwen3-Next does).
    Arch {
        gguf: "qwen3next",
        model_type: "qwen3_next",
        class: "Qwen3NextForCausalLM",
        norm_topk: Some(true),
        shared: Some("shared_expert"),
        qk_norm: true,
        dense: true,
        next: true,
        ..BASE
    },
    // qwen35moe (Qwen3.5/3.6 MoE): the text model of the image-text release, as its own
    // config (`qwen3_5_moe_text`); every layer MoE, the top-k always renormalised.
    Arch {
        gguf: "qwen35moe",
        model_type: "qwen3_5_moe_text",
        class: "Qwen3_5MoeForCausalLM",
        shared: Some("shared_expert"),
        qk_norm: true,
        next: true,
        split_in: true,
        ..BASE
    },
    // glm-dsa (GLM-5): deepseek2's MLA and router plus the lightning indexer.
    Arch {
        gguf: "glm-dsa",
        model_type: "glm_moe_dsa",
        class: "GlmMoeDsaForCausalLM",
        experts_key: "n_routed_experts",
        shared: Some("shared_experts"),
        dense: true,
        score_bias: true,
        mla: true,
        dsa: true,
        ..BASE
    },
];

/// deepseek2's kv_b_proj split as newer llama.cpp writes it: `src` of the [`Planned`]
/// is `attn_k_b` (`[heads, kv_lora_rank, qk_nope_head_dim]`: each head's key rows
/// transposed), `v_src` is `attn_v_b` (`[heads, v_head_dim, kv_lora_rank]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSplit {
    pub v_src: usize,
}

/// One Hugging Face tensor and where its values are in the GGUF.
#[derive(Clone, Debug)]
pub struct Planned {
    pub name: String,
    /// Hugging Face shape (`[rows, cols]` for matrices).
    pub shape: Vec<usize>,
    /// Index into `Gguf::tensors`.
    pub src: usize,
    /// For stacked experts (`ffn_*_exps`): the expert, a block of `shape[0]` rows (in
    /// `ffn_gate_up_exps`: block 2e is expert e's gate, 2e + 1 its up).
    pub expert: Option<usize>,
    /// Rope permutation to undo: the number of heads the rows were permuted with.
    pub unpermute_heads: Option<usize>,
    /// For a routed expert's matrix: (layer, expert, part), part 0/1/2 = gate/up/down.
    pub expert_of: Option<(usize, usize, usize)>,
    /// deepseek2's kv_b_proj put back together from `attn_k_b` and `attn_v_b`.
    pub kv_split: Option<KvSplit>,
    /// gpt-oss's `gate_up_proj_bias` (`[experts, 2 * inter]`): row e alternates row e of
    /// `src` (`ffn_gate_exps.bias`) and of this tensor (`ffn_up_exps.bias`), as
    /// transformers keeps them.
    pub interleave: Option<usize>,
    /// qwen3next's `in_proj_qkvz` from `attn_qkv` (`src`) and `attn_gate`.
    pub qkvz: Option<Qkvz>,
    /// Values to map back (qwen3next's norms and `ssm_a`).
    pub values: Option<ValueMap>,
    /// qwen35moe's value heads, tiled by convert_hf_to_gguf, put back grouped.
    pub vheads: Option<VHeads>,
}

/// qwen35moe's value heads: convert_hf_to_gguf (`_reorder_v_heads`) reordered them from
/// grouped by key head (Hugging Face: head `g * per_k + r` is value head r of key head g)
/// to tiled (`r * nk + g`), each a block of `hd` rows (or columns, or single values), from
/// row (or column) `offset` on: in `in_proj_qkv` and `conv1d` the rows after q and k, the
/// rows of `in_proj_z` (hd = value head dim), `in_proj_b`, `in_proj_a` (hd = 1), the values
/// of `A_log` and `dt_bias` (1-D: columns, hd = 1), the columns of `out_proj`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VHeads {
    pub nk: usize,
    pub per_k: usize,
    pub hd: usize,
    pub offset: usize,
    /// The columns are reordered (else the rows).
    pub cols: bool,
}

impl VHeads {
    /// The GGUF index of Hugging Face row (or column) `x`.
    pub fn source(&self, x: usize) -> usize {
        let Some(y) = x.checked_sub(self.offset) else { return x };
        let block = self.per_k * self.hd;
        if y >= self.nk * block {
            return x;
        }
        let (g, r, d) = (y / block, (y / self.hd) % self.per_k, y % self.hd);
        self.offset + (r * self.nk + g) * self.hd + d
    }
}

/// qwen3next's `in_proj_qkvz` ([`super::gguf_tensor`] reassembles the rows): `groups` key
/// heads of `hk` rows of q and of k each, `vpk` value (and gate) rows per key head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Qkvz {
    pub gate: usize,
    pub groups: usize,
    pub hk: usize,
    pub vpk: usize,
}

/// What convert_hf_to_gguf did to a tensor's values, undone on import.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueMap {
    /// qwen3next's RMSNorm weights (zero-centred in Hugging Face) were stored plus one.
    MinusOne,
    /// qwen3next's `A_log` was stored as `ssm_a` = -exp(A_log).
    LogNeg,
}

impl Planned {
    pub(super) fn plain(name: String, shape: Vec<usize>, src: usize) -> Self {
        Planned {
            name,
            shape,
            src,
            expert: None,
            unpermute_heads: None,
            expert_of: None,
            kv_split: None,
            interleave: None,
            qkvz: None,
            values: None,
            vheads: None,
        }
    }
}

pub(super) fn err(msg: String) -> Error {
    Error::Invalid(format!("GGUF: {msg}"))
}

pub(super) fn meta_u64(g: &Gguf, key: &str) -> Result<Option<u64>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => match v.as_i64() {
            Some(x) if x >= 0 => Ok(Some(x as u64)),
            _ => Err(err(format!("{key} is {v:?}, not a non-negative integer"))),
        },
    }
}

/// An f32 as its shortest decimal (1e-6, not 9.99999997e-7), as config.json has it.
pub(super) fn short(x: f32) -> f64 {
    format!("{x}").parse().unwrap_or(x as f64)
}

pub(super) fn meta_f64(g: &Gguf, key: &str) -> Result<Option<f64>> {
    match g.get(key) {
        None => Ok(None),
        Some(Value::F32(x)) => Ok(Some(short(*x))),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| err(format!("{key} is {v:?}, not a number"))),
    }
}

/// What the tensors say about the model, for config.json.
#[derive(Default)]
pub(super) struct Facts {
    /// Layers of the main stack (without llama.cpp's appended MTP / NextN layers).
    pub n_layers: usize,
    pub vocab: usize,
    /// Rows of one routed expert's gate projection.
    pub expert_ff: usize,
    /// Rows of the shared expert's gate projection (0: none).
    pub shared_ff: usize,
    /// Layers with a router (`ffn_gate_inp`).
    pub moe_layers: Vec<usize>,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    pub tied: bool,
    /// glm-dsa: per layer, whether its indexer is "full" (else "shared").
    pub indexer_full: Vec<bool>,
}
