//! `coli synth --shape deepseek-v3`: the tensors and config.json of a DeepSeek-V3-shaped
//! checkpoint, with the names and layout of the hub's `deepseek_v3` releases: MLA
//! attention (a low-rank query `q_a_proj` / `q_a_layernorm` / `q_b_proj`, the key/value
//! latent `kv_a_proj_with_mqa` / `kv_a_layernorm` / `kv_b_proj`), per-head query and key
//! dims of 128 (no rope) + 64 (rope) and value dims of 128 as in DeepSeek-V3/R1 and Kimi-K2,
//! `--first-dense` dense layers (a SwiGLU MLP of 9 x `--intermediate`, V3's ratio of 18432
//! to 2048), then MoE layers: a sigmoid router with an f32 `e_score_correction_bias`,
//! `--experts` routed experts stored per expert, `--shared-experts` shared ones fused into
//! one MLP. Routing is one group (`n_group` 1, as Kimi-K2), top-`--top-k`, renormalised and
//! scaled by 2.5.

use anyhow::Result;
use serde_json::{json, Value};

use super::{routing_json, Dt, Fill, Routing, Spec, SynthArgs};

/// Per-head query/key dims without and with rope, and the value dim (DeepSeek-V3's).
pub(super) const QK_NOPE: usize = 128;
pub(super) const QK_ROPE: usize = 64;
pub(super) const V_HEAD: usize = 128;
/// The dense layers' intermediate size, in units of the experts' (V3: 18432 / 2048).
pub(super) const DENSE_RATIO: usize = 9;

/// Refuses what this shape cannot be.
pub(super) fn check(a: &SynthArgs) -> Result<()> {
    if a.routing != Routing::Random {
        anyhow::bail!("--shape deepseek-v3 has random routers only (--routing trained is OLMoE's layout)");
    }
    if a.experts < 2 || a.q_lora_rank == 0 || a.kv_lora_rank == 0 || a.intermediate == 0 {
        anyhow::bail!(
            "--shape deepseek-v3 needs --experts >= 2 and positive --q-lora-rank, --kv-lora-rank and --intermediate"
        );
    }
    if a.first_dense > a.layers {
        anyhow::bail!("--first-dense {} is more than --layers {}", a.first_dense, a.layers);
    }
    Ok(())
}

pub(super) fn specs(a: &SynthArgs) -> Vec<Spec> {
    let (h, i, ne, v, nh) = (a.hidden, a.intermediate, a.experts, a.vocab, a.heads);
    let w = |name: String, rows: usize, cols: usize| Spec {
        name,
        shape: vec![rows, cols],
        bound: (3.0 / cols as f32).sqrt(),
        fill: Fill::Plain,
        dtype: Dt::Bf16,
    };
    let ones = |name: String, n: usize| Spec { name, shape: vec![n], bound: 0.0, fill: Fill::Plain, dtype: Dt::Bf16 };
    let mlp = |out: &mut Vec<Spec>, p: String, inter: usize| {
        out.push(w(format!("{p}.gate_proj.weight"), inter, h));
        out.push(w(format!("{p}.up_proj.weight"), inter, h));
        out.push(w(format!("{p}.down_proj.weight"), h, inter));
    };
    let mut out = vec![Spec {
        name: "model.embed_tokens.weight".into(),
        shape: vec![v, h],
        bound: 1.0,
        fill: Fill::Plain,
        dtype: Dt::Bf16,
    }];
    for l in 0..a.layers {
        let p = format!("model.layers.{l}");
        out.push(ones(format!("{p}.input_layernorm.weight"), h));
        let at = format!("{p}.self_attn");
        out.push(w(format!("{at}.q_a_proj.weight"), a.q_lora_rank, h));
        out.push(ones(format!("{at}.q_a_layernorm.weight"), a.q_lora_rank));
        out.push(w(format!("{at}.q_b_proj.weight"), nh * (QK_NOPE + QK_ROPE), a.q_lora_rank));
        out.push(w(format!("{at}.kv_a_proj_with_mqa.weight"), a.kv_lora_rank + QK_ROPE, h));
        out.push(ones(format!("{at}.kv_a_layernorm.weight"), a.kv_lora_rank));
        out.push(w(format!("{at}.kv_b_proj.weight"), nh * (QK_NOPE + V_HEAD), a.kv_lora_rank));
        out.push(w(format!("{at}.o_proj.weight"), h, nh * V_HEAD));
        out.push(ones(format!("{p}.post_attention_layernorm.weight"), h));
        if l < a.first_dense {
            mlp(&mut out, format!("{p}.mlp"), DENSE_RATIO * i);
            continue;
        }
        out.push(w(format!("{p}.mlp.gate.weight"), ne, h));
        out.push(Spec {
            name: format!("{p}.mlp.gate.e_score_correction_bias"),
            shape: vec![ne],
            bound: 0.05,
            fill: Fill::Plain,
            dtype: Dt::F32,
        });
        for e in 0..ne {
            mlp(&mut out, format!("{p}.mlp.experts.{e}"), i);
        }
        if a.shared_experts > 0 {
            mlp(&mut out, format!("{p}.mlp.shared_experts"), a.shared_experts * i);
        }
    }
    out.push(ones("model.norm.weight".into(), h));
    out.push(w("lm_head.weight".into(), v, h));
    out
}

pub(super) fn config(a: &SynthArgs) -> Value {
    json!({
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": a.hidden,
        "intermediate_size": DENSE_RATIO * a.intermediate,
        "moe_intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "first_k_dense_replace": a.first_dense,
        "moe_layer_freq": 1,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.heads,
        "q_lora_rank": a.q_lora_rank,
        "kv_lora_rank": a.kv_lora_rank,
        "qk_nope_head_dim": QK_NOPE,
        "qk_rope_head_dim": QK_ROPE,
        "v_head_dim": V_HEAD,
        "n_routed_experts": a.experts,
        "n_shared_experts": a.shared_experts,
        "num_experts_per_tok": a.top_k,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": true,
        "routed_scaling_factor": 2.5,
        "vocab_size": a.vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "rope_interleave": true,
        "tie_word_embeddings": false,
        "hidden_act": "silu",
        "dtype": "bfloat16",
        "eos_token_id": 1,
        "colibri_synthetic": {"seed": a.seed, "generator": "coli synth", "shape": "deepseek-v3",
            "routing": routing_json(a)},
    })
}
