//! config.json for a GGUF model: the Hugging Face config its `{arch}.*` metadata and its
//! tensors describe, with llama.cpp's meaning of each key (what llama.cpp's graph for the
//! architecture does when a key is absent is what the config says then). docs/gguf.md
//! lists the keys read per architecture.

use serde_json::{json, Value as Json};

use super::gguf::{Array, Gguf, Value};
use super::gguf_plan::{err, meta_f64, meta_u64, short, Arch, Facts};
use crate::error::Result;

/// llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID` (`{arch}.expert_gating_func`).
const GATING_SIGMOID: u64 = 2;

/// The config.json of a GGUF of architecture `a`.
pub(super) fn config(g: &Gguf, a: &Arch, f: &Facts, context: Option<u64>) -> Result<Json> {
    let name = a.gguf;
    let key = |k: &str| format!("{name}.{k}");
    let need = |k: &str| meta_u64(g, &key(k))?.ok_or_else(|| err(format!("no {}", key(k))));
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let kv_heads = meta_u64(g, &key("attention.head_count_kv"))?.unwrap_or(heads);
    let key_length = meta_u64(g, &key("attention.key_length"))?;
    if heads == 0 || (key_length.is_none() && hidden % heads != 0) {
        return Err(err(format!("{} does not divide {}", key("attention.head_count"), key("embedding_length"))));
    }
    let head_dim = key_length.unwrap_or(hidden / heads.max(1));
    let n_experts = need("expert_count")?;
    let mut c = json!({
        "architectures": [a.class],
        "model_type": a.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": f.n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": f.vocab,
        "hidden_act": "silu",
        "rms_norm_eps": meta_f64(g, &key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
        "rope_theta": meta_f64(g, &key("rope.freq_base"))?.unwrap_or(10000.0),
        "max_position_embeddings": context.unwrap_or(4096),
        "num_experts_per_tok": need("expert_used_count")?,
        "tie_word_embeddings": f.tied,
        "attention_bias": false,
    });
    let obj = c.as_object_mut().ok_or_else(|| err("config".into()))?;
    obj.insert(a.experts_key.into(), json!(n_experts));
    let dense_ff = meta_u64(g, &key("feed_forward_length"))?.unwrap_or(f.expert_ff as u64);
    match a.model_type {
        "mixtral" => {
            obj.insert("intermediate_size".into(), json!(f.expert_ff));
            obj.insert("sliding_window".into(), Json::Null);
        }
        "olmoe" => {
            obj.insert("intermediate_size".into(), json!(f.expert_ff));
        }
        "qwen3_moe" => {
            obj.insert("moe_intermediate_size".into(), json!(f.expert_ff));
            obj.insert("intermediate_size".into(), json!(dense_ff));
            obj.insert("decoder_sparse_step".into(), json!(1));
            obj.insert("mlp_only_layers".into(), json!([]));
        }
        "qwen2_moe" => {
            obj.insert("moe_intermediate_size".into(), json!(f.expert_ff));
            obj.insert("intermediate_size".into(), json!(dense_ff));
            obj.insert("shared_expert_intermediate_size".into(), json!(f.shared_ff));
            obj.insert("decoder_sparse_step".into(), json!(1));
            // Layers without a router are dense (llama.cpp's own qwen2moe has none).
            let dense: Vec<usize> = (0..f.n_layers).filter(|l| !f.moe_layers.contains(l)).collect();
            obj.insert("mlp_only_layers".into(), json!(dense));
            obj.insert("qkv_bias".into(), json!(f.qkv_bias));
            obj.insert("use_sliding_window".into(), json!(false));
        }
        "glm4_moe" | "deepseek_v3" | "glm_moe_dsa" => {
            obj.insert("moe_intermediate_size".into(), json!(f.expert_ff));
            obj.insert("intermediate_size".into(), json!(dense_ff));
            let shared = match meta_u64(g, &key("expert_shared_count"))? {
                Some(n) => n,
                None if f.expert_ff > 0 => (f.shared_ff / f.expert_ff) as u64,
                None => 0,
            };
            obj.insert("n_shared_experts".into(), json!(shared));
            let lead = meta_u64(g, &key("leading_dense_block_count"))?.unwrap_or(0);
            obj.insert("first_k_dense_replace".into(), json!(lead));
            obj.insert("n_group".into(), json!(meta_u64(g, &key("expert_group_count"))?.unwrap_or(1)));
            obj.insert("topk_group".into(), json!(meta_u64(g, &key("expert_group_used_count"))?.unwrap_or(1)));
            let scale = meta_f64(g, &key("expert_weights_scale"))?.filter(|&s| s != 0.0).unwrap_or(1.0);
            obj.insert("routed_scaling_factor".into(), json!(scale));
            // llama.cpp renormalises the top-k weights only when told to.
            let norm = matches!(g.get(&key("expert_weights_norm")), Some(Value::Bool(true)));
            obj.insert("norm_topk_prob".into(), json!(norm));
            // llama.cpp routes deepseek2 with a softmax unless the file says sigmoid
            // (DeepSeek-V2 / V2.5); colibri runs the sigmoid router of V3 only. glm4moe
            // and glm-dsa without the key are sigmoid in llama.cpp.
            let gating = meta_u64(g, &key("expert_gating_func"))?;
            let glm = matches!(a.model_type, "glm4_moe" | "glm_moe_dsa");
            if gating != Some(GATING_SIGMOID) && !(glm && gating.is_none()) {
                let is = gating.map_or("absent (softmax for llama.cpp)".to_string(), |v| v.to_string());
                return Err(err(format!(
                    "{} is {is}: colibri runs the sigmoid router ({GATING_SIGMOID}) of DeepSeek-V3 / GLM-4.5 only, not DeepSeek-V2's softmax router",
                    key("expert_gating_func")
                )));
            }
            obj.insert("scoring_func".into(), json!("sigmoid"));
            obj.insert("topk_method".into(), json!("noaux_tc"));
            obj.insert("num_nextn_predict_layers".into(), json!(0));
            if a.model_type == "glm4_moe" {
                obj.insert("attention_bias".into(), json!(f.qkv_bias));
                obj.insert("use_qk_norm".into(), json!(f.qk_norm));
                // Rotary dims per head: head_dim x partial_rotary_factor.
                let rot = meta_u64(g, &key("rope.dimension_count"))?.unwrap_or(head_dim / 2);
                if rot == 0 || rot > head_dim || rot % 2 != 0 {
                    return Err(err(format!("{} = {rot} for head_dim {head_dim}", key("rope.dimension_count"))));
                }
                obj.insert("partial_rotary_factor".into(), json!(rot as f64 / head_dim as f64));
            } else {
                mla(g, name, obj, heads)?;
                if a.dsa {
                    dsa(g, name, obj, f)?;
                }
            }
        }
        "gpt_oss" => gpt_oss(g, name, obj, f)?,
        "qwen3_next" => qwen3_next(g, name, obj, f, head_dim, dense_ff)?,
        "qwen3_5_moe_text" => {
            qwen3_next(g, name, obj, f, head_dim, dense_ff)?;
            qwen3_5(g, name, obj)?;
        }
        _ => return Err(err(format!("no config for {}", a.model_type))),
    }
    if let Some(n) = a.norm_topk {
        obj.insert("norm_topk_prob".into(), json!(n));
    }
    if let Some(clip) = meta_f64(g, &key("attention.clamp_kqv"))? {
        obj.insert("clip_qkv".into(), json!(clip));
    }
    rope_scaling(g, name, a.mla, obj)?;
    let n_tokens = match g.get("tokenizer.ggml.tokens") {
        Some(Value::Array(t)) => t.len(),
        _ => 0,
    };
    for (k, gk) in [("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")] {
        if let Some(id) = meta_u64(g, gk).ok().flatten().filter(|&id| (id as usize) < n_tokens) {
            obj.insert(k.into(), json!(id));
        }
    }
    Ok(c)
}

type Obj = serde_json::Map<String, Json>;

/// qwen3next: the Gated DeltaNet sizes from `ssm.*` (`conv_kernel`, `state_size` = key
/// head dim, `group_count` = key heads, `time_step_rank` = value heads, `inner_size` =
/// value heads x value head dim: llama.cpp itself assumes the two head dims equal, this
/// does not), the linear layers from `attention.recurrent_layers` (else every
/// `full_attention_interval`-th layer, default 4, is full attention), partial rotary from
/// `rope.dimension_count`, layers without a router dense (`mlp_only_layers`).
fn qwen3_next(g: &Gguf, name: &str, obj: &mut Obj, f: &Facts, head_dim: u64, dense_ff: u64) -> Result<()> {
    let key = |k: &str| format!("{name}.{k}");
    let need = |k: &str| meta_u64(g, &key(k))?.ok_or_else(|| err(format!("no {}", key(k))));
    obj.insert("moe_intermediate_size".into(), json!(f.expert_ff));
    obj.insert("intermediate_size".into(), json!(dense_ff));
    obj.insert("shared_expert_intermediate_size".into(), json!(f.shared_ff));
    obj.insert("decoder_sparse_step".into(), json!(1));
    let dense: Vec<usize> = (0..f.n_layers).filter(|l| !f.moe_layers.contains(l)).collect();
    obj.insert("mlp_only_layers".into(), json!(dense));
    let (kernel, hk, nk, nv, inner) = (
        need("ssm.conv_kernel")?,
        need("ssm.state_size")?,
        need("ssm.group_count")?,
        need("ssm.time_step_rank")?,
        need("ssm.inner_size")?,
    );
    if nv == 0 || inner % nv != 0 {
        return Err(err(format!(
            "{} {inner} is not a multiple of {} {nv}",
            key("ssm.inner_size"),
            key("ssm.time_step_rank")
        )));
    }
    obj.insert("linear_conv_kernel_dim".into(), json!(kernel));
    obj.insert("linear_key_head_dim".into(), json!(hk));
    obj.insert("linear_num_key_heads".into(), json!(nk));
    obj.insert("linear_num_value_heads".into(), json!(nv));
    obj.insert("linear_value_head_dim".into(), json!(inner / nv));
    let n = f.n_layers;
    let recurrent_key = key("attention.recurrent_layers");
    let linear: Vec<bool> = match g.get(&recurrent_key) {
        Some(Value::Array(Array::Bool(v))) if v.len() >= n => v[..n].to_vec(),
        Some(_) => return Err(err(format!("{recurrent_key} is not {n} bools"))),
        None => {
            let every = meta_u64(g, &key("full_attention_interval"))?.unwrap_or(4).max(1);
            (0..n as u64).map(|l| (l + 1) % every != 0).collect()
        }
    };
    let kinds: Vec<&str> = linear.iter().map(|&r| if r { "linear_attention" } else { "full_attention" }).collect();
    obj.insert("layer_types".into(), json!(kinds));
    let rot = meta_u64(g, &key("rope.dimension_count"))?.unwrap_or(head_dim / 4);
    if rot == 0 || rot > head_dim || rot % 2 != 0 {
        return Err(err(format!("{} = {rot} for head_dim {head_dim}", key("rope.dimension_count"))));
    }
    obj.insert("partial_rotary_factor".into(), json!(rot as f64 / head_dim as f64));
    obj.insert("attention_bias".into(), json!(false));
    Ok(())
}

/// qwen35moe, on top of [`qwen3_next`]'s keys: what Qwen3.5's text config does not have
/// (every layer is MoE) removed, and the interleaved M-RoPE of `rope.dimension_sections`
/// (on text, where the three position streams are equal, the plain partial rope).
fn qwen3_5(g: &Gguf, name: &str, obj: &mut Obj) -> Result<()> {
    let key = format!("{name}.rope.dimension_sections");
    let sections: Vec<u64> = match g.get(&key) {
        Some(Value::Array(a)) => {
            let v: Option<Vec<u64>> = match a {
                Array::I32(v) => v.iter().map(|&x| u64::try_from(x).ok()).collect(),
                Array::U32(v) => Some(v.iter().map(|&x| x as u64).collect()),
                _ => None,
            };
            v.ok_or_else(|| err(format!("{key} is not an array of non-negative integers")))?
        }
        Some(_) => return Err(err(format!("{key} is not an array"))),
        None => vec![11, 11, 10], // llama.cpp's converter writes Qwen3.5's default then
    };
    if sections.iter().skip(3).any(|&s| s != 0) || sections.len() < 3 {
        return Err(err(format!("{key} = {sections:?}: Qwen3.5's M-RoPE has three sections (t, h, w)")));
    }
    for k in ["mlp_only_layers", "decoder_sparse_step", "norm_topk_prob"] {
        obj.remove(k);
    }
    let theta = obj.get("rope_theta").cloned().unwrap_or(json!(10000.0));
    let partial = obj.get("partial_rotary_factor").cloned().unwrap_or(json!(0.25));
    obj.insert(
        "rope_parameters".into(),
        json!({"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial,
               "mrope_section": &sections[..3], "mrope_interleaved": true}),
    );
    Ok(())
}

/// glm-dsa's lightning indexer: `attention.indexer.{head_count, key_length, top_k}` and
/// the per-layer kinds the import settled (`Facts::indexer_full`).
fn dsa(g: &Gguf, name: &str, obj: &mut Obj, f: &Facts) -> Result<()> {
    let need = |k: &str| -> Result<u64> {
        let key = format!("{name}.attention.indexer.{k}");
        meta_u64(g, &key)?.ok_or_else(|| err(format!("no {key}")))
    };
    obj.insert("index_n_heads".into(), json!(need("head_count")?));
    obj.insert("index_head_dim".into(), json!(need("key_length")?));
    obj.insert("index_topk".into(), json!(need("top_k")?));
    let kinds: Vec<&str> = f.indexer_full.iter().map(|&x| if x { "full" } else { "shared" }).collect();
    obj.insert("indexer_types".into(), json!(kinds));
    Ok(())
}

/// gpt-oss: what llama.cpp's `openai-moe` graph does. The clamped SwiGLU's alpha 1.702 and
/// limit 7.0 are constants there (GptOssConfig's defaults, the released models' values);
/// `attention.sliding_window` on the layers that `attention.sliding_window_pattern` marks
/// (an array of bools per layer, or every n-th layer full; default 2: the even layers
/// slide, as the released models); YaRN from `rope.scaling.*`, where llama.cpp rounds the
/// correction range outward (transformers' `truncate: true`), or no scaling at all.
fn gpt_oss(g: &Gguf, name: &str, obj: &mut Obj, f: &Facts) -> Result<()> {
    let key = |k: &str| format!("{name}.{k}");
    obj.insert("intermediate_size".into(), json!(f.expert_ff));
    obj.insert("attention_bias".into(), json!(f.qkv_bias));
    obj.insert("swiglu_alpha".into(), json!(1.702));
    obj.insert("swiglu_limit".into(), json!(7.0));
    let window = meta_u64(g, &key("attention.sliding_window"))?.filter(|&w| w > 0);
    obj.insert("sliding_window".into(), json!(window));
    let n = f.n_layers;
    let pattern_key = key("attention.sliding_window_pattern");
    let sliding: Vec<bool> = match g.get(&pattern_key) {
        Some(Value::Array(Array::Bool(v))) if v.len() >= n => v[..n].to_vec(),
        Some(Value::Array(_)) => return Err(err(format!("{pattern_key} is not {n} bools"))),
        _ => {
            let p = meta_u64(g, &pattern_key)?.unwrap_or(2);
            (0..n as u64).map(|l| p == 0 || l % p < p - 1).collect()
        }
    };
    let kinds: Vec<&str> =
        sliding.iter().map(|&s| if s && window.is_some() { "sliding_attention" } else { "full_attention" }).collect();
    obj.insert("layer_types".into(), json!(kinds));
    if g.get(&key("rope.scaling.type")).is_none() {
        // Without rope.scaling llama.cpp rotates plainly (GptOssConfig would default to YaRN).
        obj.insert("rope_scaling".into(), json!({"rope_type": "default"}));
    }
    Ok(())
}

/// deepseek2's MLA sizes. llama.cpp writes the attention as MQA over the latent
/// (`key_length` = kv_lora_rank + rope dims, one kv head) and the real per-head sizes as
/// `key_length_mla` / `value_length_mla`; files from before that have the per-head
/// sizes in `key_length` / `value_length`.
fn mla(g: &Gguf, name: &str, obj: &mut Obj, heads: u64) -> Result<()> {
    let key = |k: &str| format!("{name}.{k}");
    let need = |k: &str| meta_u64(g, &key(k))?.ok_or_else(|| err(format!("no {}", key(k))));
    let kv_lora = need("attention.kv_lora_rank")?;
    let rope = need("rope.dimension_count")?;
    let (k_len, v_len) = match meta_u64(g, &key("attention.key_length_mla"))? {
        Some(k) => (k, need("attention.value_length_mla")?),
        None => (need("attention.key_length")?, need("attention.value_length")?),
    };
    let nope = k_len.checked_sub(rope).filter(|&n| n > 0).ok_or_else(|| {
        err(format!("MLA key length {k_len} is not larger than {} ({rope})", key("rope.dimension_count")))
    })?;
    obj.insert("q_lora_rank".into(), json!(meta_u64(g, &key("attention.q_lora_rank"))?));
    obj.insert("kv_lora_rank".into(), json!(kv_lora));
    obj.insert("qk_nope_head_dim".into(), json!(nope));
    obj.insert("qk_rope_head_dim".into(), json!(rope));
    obj.insert("v_head_dim".into(), json!(v_len));
    obj.insert("head_dim".into(), json!(rope));
    // MLA: every head has its own keys and values once decompressed.
    obj.insert("num_key_value_heads".into(), json!(heads));
    // llama.cpp rotates deepseek2's rope dims as interleaved pairs (GGML_ROPE_TYPE_NORM).
    obj.insert("rope_interleave".into(), json!(true));
    Ok(())
}

/// `rope_scaling` from `{arch}.rope.scaling.*` (`mla`: deepseek2's and glm-dsa's YaRN).
fn rope_scaling(g: &Gguf, name: &str, mla: bool, obj: &mut Obj) -> Result<()> {
    let key = |k: &str| format!("{name}.{k}");
    let kind = match g.get(&key("rope.scaling.type")).and_then(Value::as_str) {
        None | Some("none") => return Ok(()),
        Some(kind @ ("yarn" | "linear")) => kind,
        Some(other) => return Err(err(format!("rope scaling {other:?} is not supported"))),
    };
    let factor = meta_f64(g, &key("rope.scaling.factor"))?
        .ok_or_else(|| err(format!("{kind} rope scaling without {}", key("rope.scaling.factor"))))?;
    let mut s = json!({"rope_type": kind, "factor": factor});
    if let Some(o) = meta_u64(g, &key("rope.scaling.original_context_length"))? {
        s["original_max_position_embeddings"] = json!(o);
    }
    for (hf, gk) in [("beta_fast", "rope.scaling.yarn_beta_fast"), ("beta_slow", "rope.scaling.yarn_beta_slow")] {
        if let Some(b) = meta_f64(g, &key(gk))? {
            s[hf] = json!(b);
        }
    }
    let attn_factor = meta_f64(g, &key("rope.scaling.attn_factor"))?;
    if mla && kind == "yarn" {
        // llama.cpp's deepseek2: cos/sin unscaled and q.k scaled by (1 + 0.1 m ln factor)^2
        // with m = yarn_log_multiplier / 0.1 (convert_hf_to_gguf writes 0.1 x
        // mscale_all_dim): transformers' deepseek_v3 with mscale = mscale_all_dim = m.
        let mul = match g.get(&key("rope.scaling.yarn_log_multiplier")) {
            Some(Value::F32(x)) => short(x / 0.1),
            Some(v) => v.as_f64().map(|x| x / 0.1).ok_or_else(|| err(format!("yarn_log_multiplier is {v:?}")))?,
            None => {
                return Err(err(format!(
                    "{name} YaRN without {} is not supported",
                    key("rope.scaling.yarn_log_multiplier")
                )))
            }
        };
        if attn_factor.is_some_and(|f| f != 1.0) {
            return Err(err(format!("{name} with {} is not supported", key("rope.scaling.attn_factor"))));
        }
        s["mscale"] = json!(mul);
        s["mscale_all_dim"] = json!(mul);
    } else if let Some(f) = attn_factor {
        s["attention_factor"] = json!(f);
    }
    obj.insert("rope_scaling".into(), s);
    Ok(())
}
