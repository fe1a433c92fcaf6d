//! A GGUF model as a Hugging Face checkpoint: the `config.json` its metadata describes
//! ([`super::gguf_config`]), its tensors under Hugging Face names (llama.cpp's
//! conversions undone), and its tokenizer ([`super::gguf_tokenizer`]). `coli convert
//! model.gguf` writes a normal colibri container from this (docs/gguf.md).
//!
//! Architectures (llama.cpp name -> `model_type`): `qwen3moe` -> qwen3_moe, `olmoe` ->
//! olmoe, `llama` with experts -> mixtral, `qwen2moe` -> qwen2_moe, `glm4moe` -> glm4_moe,
//! `deepseek2` -> deepseek_v3, `gpt-oss` -> gpt_oss, `qwen3next` -> qwen3_next,
//! `qwen35moe` -> qwen3_5_moe_text, `glm-dsa` -> glm_moe_dsa (what the last two add:
//! `gguf_families`). Tensor names follow gguf-py's tensor_mapping.py; for
//! `llama`, convert_hf_to_gguf.py permuted the rows of q_proj and k_proj (`permute(w,
//! n_head)`: within each head, interleaved pairs instead of two halves) and they are
//! permuted back here. The others use NEOX rope (two halves, as Hugging Face) or, for
//! deepseek2, interleaved pairs in both, and were not permuted. deepseek2's kv_b_proj is
//! stored whole (`attn_kv_b`, older files) or split per head into `attn_k_b` (each head's
//! key block transposed) and `attn_v_b` (newer files); the split is put back together.

use std::collections::BTreeMap;

use serde_json::Value as Json;

use super::gguf::{Gguf, Value};
use super::gguf_plan::ARCHES;
use super::gguf_plan::{err, meta_u64, Arch, Facts};
pub use super::gguf_plan::{KvSplit, Planned, Qkvz, VHeads, ValueMap};
use super::gguf_quant::{is_supported, supported_names};
pub use super::gguf_tensor::{keep_dtype, keep_dtype_for, stores_exactly, stores_exactly_for, tensor, REQUANT_GROUP};
use crate::error::Result;

/// A GGUF file read as a Hugging Face checkpoint.
pub struct Imported {
    pub arch: String,
    pub config: Json,
    pub tokenizer_json: Vec<u8>,
    pub tokenizer_config: Vec<u8>,
    pub tensors: Vec<Planned>,
    /// ggml type name -> number of GGUF tensors of that type.
    pub source_types: BTreeMap<String, usize>,
}

/// What a GGUF tensor of one layer is.
enum Role {
    /// A Hugging Face tensor of its own.
    Plain(String),
    /// A routed expert matrix: the expert (None: all of them, stacked) and the part
    /// (gate, up, down).
    Experts(Option<usize>, usize),
    /// deepseek2's split kv_b_proj: the key half (`attn_k_b`) or the value half.
    KeyB,
    ValueB,
    /// The routed experts' gate and up stacked in one tensor (`ffn_gate_up_exps`, `ne =
    /// [cols, 2 * inter, n_expert]`: per expert the gate rows, then the up rows), as
    /// llama.cpp's loader also accepts them.
    GateUpExperts,
    /// gpt-oss's gate (0) or up (1) expert biases, interleaved into `gate_up_proj_bias`.
    GateUpBias(usize),
    /// qwen3next's `attn_qkv` (0) or `attn_gate` (1), reassembled into `in_proj_qkvz`.
    Qkvz(usize),
}

/// The role of GGUF tensor `rest` (its name after `blk.N.`) of layer `l`, or None if it
/// is not part of the architecture.
fn map_layer(a: &Arch, l: usize, rest: &str) -> Option<Role> {
    let p = format!("model.layers.{l}");
    let plain = |s: &str| Some(Role::Plain(format!("{p}.{s}")));
    let attn = |s: &str| if a.mla { None } else { plain(&format!("self_attn.{s}")) };
    let mla = |s: &str| if a.mla { plain(&format!("self_attn.{s}")) } else { None };
    let shared = |s: &str| a.shared.and_then(|m| plain(&format!("mlp.{m}.{s}")));
    let if_ = |on: bool, s: &str| if on { plain(s) } else { None };
    match rest {
        "attn_norm.weight" => plain("input_layernorm.weight"),
        "ffn_norm.weight" => plain("post_attention_layernorm.weight"),
        // glm4moe and gpt-oss name the norm before the FFN after Hugging Face's module.
        "post_attention_norm.weight" if a.gguf == "glm4moe" || a.oai || a.next => {
            plain("post_attention_layernorm.weight")
        }
        "attn_q.weight" if a.mla => plain("self_attn.q_proj.weight"),
        "attn_q.weight" => attn("q_proj.weight"),
        "attn_k.weight" => attn("k_proj.weight"),
        "attn_v.weight" => attn("v_proj.weight"),
        "attn_output.weight" => plain("self_attn.o_proj.weight"),
        "attn_q.bias" if a.qkv_bias => attn("q_proj.bias"),
        "attn_k.bias" if a.qkv_bias => attn("k_proj.bias"),
        "attn_v.bias" if a.qkv_bias => attn("v_proj.bias"),
        "attn_output.bias" if a.oai => attn("o_proj.bias"),
        "attn_sinks.weight" if a.oai => attn("sinks"),
        "ffn_gate_inp.bias" if a.oai => plain(&format!("{}.{}.bias", a.moe, a.router)),
        "ffn_gate_exps.bias" if a.oai => Some(Role::GateUpBias(0)),
        "ffn_up_exps.bias" if a.oai => Some(Role::GateUpBias(1)),
        "ffn_down_exps.bias" if a.oai => plain(&format!("{}.experts.down_proj_bias", a.moe)),
        "attn_q_norm.weight" if a.qk_norm => attn("q_norm.weight"),
        "attn_k_norm.weight" if a.qk_norm => attn("k_norm.weight"),
        "attn_q_a.weight" => mla("q_a_proj.weight"),
        "attn_q_a_norm.weight" => mla("q_a_layernorm.weight"),
        "attn_q_b.weight" => mla("q_b_proj.weight"),
        "attn_kv_a_mqa.weight" => mla("kv_a_proj_with_mqa.weight"),
        "attn_kv_a_norm.weight" => mla("kv_a_layernorm.weight"),
        "attn_kv_b.weight" => mla("kv_b_proj.weight"),
        "attn_k_b.weight" if a.mla => Some(Role::KeyB),
        "attn_v_b.weight" if a.mla => Some(Role::ValueB),
        "ffn_gate_inp.weight" => plain(&format!("{}.{}.weight", a.moe, a.router)),
        "exp_probs_b.bias" => if_(a.score_bias, "mlp.gate.e_score_correction_bias"),
        "ffn_gate_exps.weight" => Some(Role::Experts(None, 0)),
        "ffn_up_exps.weight" => Some(Role::Experts(None, 1)),
        "ffn_down_exps.weight" => Some(Role::Experts(None, 2)),
        "ffn_gate_up_exps.weight" if !a.oai => Some(Role::GateUpExperts),
        "ffn_gate_shexp.weight" => shared("gate_proj.weight"),
        "ffn_up_shexp.weight" => shared("up_proj.weight"),
        "ffn_down_shexp.weight" => shared("down_proj.weight"),
        "ffn_gate_inp_shexp.weight" if a.gguf == "qwen2moe" || a.next => plain("mlp.shared_expert_gate.weight"),
        // qwen35moe: the DeltaNet input projections as Hugging Face stores them, apart.
        "attn_qkv.weight" if a.split_in => plain("linear_attn.in_proj_qkv.weight"),
        "attn_gate.weight" if a.split_in => plain("linear_attn.in_proj_z.weight"),
        "ssm_beta.weight" if a.split_in => plain("linear_attn.in_proj_b.weight"),
        "ssm_alpha.weight" if a.split_in => plain("linear_attn.in_proj_a.weight"),
        "attn_qkv.weight" if a.next => Some(Role::Qkvz(0)),
        "attn_gate.weight" if a.next => Some(Role::Qkvz(1)),
        "ssm_conv1d.weight" if a.next => plain("linear_attn.conv1d.weight"),
        "ssm_dt.bias" if a.next => plain("linear_attn.dt_bias"),
        "ssm_a" if a.next => plain("linear_attn.A_log"),
        "ssm_ba.weight" if a.next && !a.split_in => plain("linear_attn.in_proj_ba.weight"),
        "ssm_norm.weight" if a.next => plain("linear_attn.norm.weight"),
        "ssm_out.weight" if a.next => plain("linear_attn.out_proj.weight"),
        // glm-dsa's lightning indexer.
        "indexer.attn_q_b.weight" if a.dsa => plain("self_attn.indexer.wq_b.weight"),
        "indexer.attn_k.weight" if a.dsa => plain("self_attn.indexer.wk.weight"),
        "indexer.k_norm.weight" if a.dsa => plain("self_attn.indexer.k_norm.weight"),
        "indexer.k_norm.bias" if a.dsa => plain("self_attn.indexer.k_norm.bias"),
        "indexer.proj.weight" if a.dsa => plain("self_attn.indexer.weights_proj.weight"),
        "ffn_gate.weight" => if_(a.dense, "mlp.gate_proj.weight"),
        "ffn_up.weight" => if_(a.dense, "mlp.up_proj.weight"),
        "ffn_down.weight" => if_(a.dense, "mlp.down_proj.weight"),
        _ if a.gguf == "llama" => {
            // Older llama.cpp files store Mixtral's experts one by one: ffn_gate.E.weight.
            let (kind, e) = rest.strip_suffix(".weight")?.split_once('.')?;
            let part = ["ffn_gate", "ffn_up", "ffn_down"].iter().position(|k| *k == kind)?;
            Some(Role::Experts(Some(e.parse().ok()?), part))
        }
        _ => None,
    }
}

fn expert_name(a: &Arch, l: usize, e: usize, part: usize) -> String {
    format!("model.layers.{l}.{}.experts.{e}.{}.weight", a.moe, a.expert_names[part])
}

/// Reads the architecture, config, tokenizer and tensor map of a parsed GGUF.
pub fn import(g: &Gguf) -> Result<Imported> {
    let name =
        g.get("general.architecture").and_then(Value::as_str).ok_or_else(|| err("no general.architecture".into()))?;
    let known = ARCHES.iter().map(|a| a.gguf).collect::<Vec<_>>().join(", ");
    let a = ARCHES.iter().find(|a| a.gguf == name).ok_or_else(|| {
        err(format!(
            "architecture {name:?} is not supported (colibri converts {known}: Mixture-of-Experts models it runs)"
        ))
    })?;
    let (_, n_parts) = g.split("the file")?;
    if n_parts != g.parts {
        return Err(err(format!(
            "this file is one of {n_parts} parts of a split GGUF: convert the first part (NAME-00001-of-{n_parts:05}.gguf) with the others beside it"
        )));
    }
    let key = |k: &str| format!("{name}.{k}");
    let need = |k: &str| meta_u64(g, &key(k))?.ok_or_else(|| err(format!("no {}", key(k))));
    let n_blocks = need("block_count")? as usize;
    // glm4moe and deepseek2 files may end with MTP (NextN) layers that colibri does not
    // run; they are left out, as `coli convert` leaves them out of a checkpoint.
    let nextn = meta_u64(g, &key("nextn_predict_layers"))?.unwrap_or(0) as usize;
    let n_layers = n_blocks
        .checked_sub(nextn)
        .filter(|&n| n > 0)
        .ok_or_else(|| err(format!("{} ({nextn}) leaves no layers of {n_blocks}", key("nextn_predict_layers"))))?;
    let heads = need("attention.head_count")?;
    let n_experts = meta_u64(g, &key("expert_count"))?.unwrap_or(0);
    let used = meta_u64(g, &key("expert_used_count"))?.unwrap_or(0);
    if n_experts == 0 || used == 0 {
        return Err(err(format!(
            "{name} model without experts ({}) : colibri runs Mixture-of-Experts models only",
            key("expert_count")
        )));
    }
    let kv_heads = meta_u64(g, &key("attention.head_count_kv"))?.unwrap_or(heads);

    // Tensors.
    let mut tensors = Vec::new();
    let mut types = BTreeMap::new();
    let mut facts = Facts { n_layers, ..Facts::default() };
    // deepseek2's split kv_b_proj, per layer: (attn_k_b, attn_v_b, attn_kv_b present).
    let mut kv_b: BTreeMap<usize, (Option<usize>, Option<usize>, bool)> = BTreeMap::new();
    // gpt-oss's expert biases, per layer: (ffn_gate_exps.bias, ffn_up_exps.bias).
    let mut gate_up_b: BTreeMap<usize, [Option<usize>; 2]> = BTreeMap::new();
    // qwen3next's linear attention input, per layer: (attn_qkv, attn_gate).
    let mut qkvz: BTreeMap<usize, [Option<usize>; 2]> = BTreeMap::new();
    // qwen35moe's DeltaNet sizes (its value heads were reordered); glm-dsa's indexer
    // tensors per layer.
    let delta = if a.split_in { Some(super::gguf_families::delta_sizes(g, name)?) } else { None };
    let mut indexers: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (i, t) in g.tensors.iter().enumerate() {
        if !is_supported(t.ty) {
            return Err(err(format!(
                "tensor {} is {}, which colibri cannot read (it reads {})",
                t.name,
                t.ty.name,
                supported_names()
            )));
        }
        *types.entry(t.ty.name.to_string()).or_insert(0) += 1;
        let shape = t.shape();
        let global = match t.name.as_str() {
            "token_embd.weight" => Some("model.embed_tokens.weight"),
            "output_norm.weight" => Some("model.norm.weight"),
            "output.weight" => Some("lm_head.weight"),
            _ => None,
        };
        if let Some(hf) = global {
            let values = (a.next && t.name == "output_norm.weight").then_some(ValueMap::MinusOne);
            tensors.push(Planned { values, ..Planned::plain(hf.into(), shape, i) });
            continue;
        }
        let unknown = || err(format!("tensor {} is not part of a {name} model as colibri knows it", t.name));
        let (l, rest) = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(l, rest)| Some((l.parse::<usize>().ok()?, rest)))
            .ok_or_else(unknown)?;
        if l >= n_blocks {
            return Err(err(format!("tensor {} is in layer {l}, but {} is {n_blocks}", t.name, key("block_count"))));
        }
        if l >= n_layers {
            continue; // an MTP layer
        }
        match map_layer(a, l, rest).ok_or_else(unknown)? {
            Role::Plain(hf) => {
                let unpermute_heads = match rest {
                    "attn_q.weight" if a.permuted => Some(heads as usize),
                    "attn_k.weight" if a.permuted => Some(kv_heads as usize),
                    _ => None,
                };
                match rest {
                    "ffn_gate_inp.weight" => facts.moe_layers.push(l),
                    "ffn_gate_shexp.weight" if shape.len() == 2 => facts.shared_ff = shape[0],
                    "attn_q.bias" => facts.qkv_bias = true,
                    "attn_q_norm.weight" => facts.qk_norm = true,
                    "attn_kv_b.weight" => kv_b.entry(l).or_default().2 = true,
                    _ if rest.starts_with("indexer.") => indexers.entry(l).or_default().push(rest.to_string()),
                    _ => {}
                }
                let vheads = delta.as_ref().and_then(|d| super::gguf_families::vheads(rest, d));
                let values = match rest {
                    "attn_norm.weight" | "post_attention_norm.weight" | "attn_q_norm.weight" | "attn_k_norm.weight"
                        if a.next =>
                    {
                        Some(ValueMap::MinusOne)
                    }
                    "ssm_a" => Some(ValueMap::LogNeg),
                    _ => None,
                };
                // convert_hf_to_gguf squeezed the conv1d weight's [channels, 1, kernel].
                let shape = match rest {
                    "ssm_conv1d.weight" if shape.len() == 2 => vec![shape[0], 1, shape[1]],
                    _ => shape,
                };
                tensors.push(Planned { unpermute_heads, values, vheads, ..Planned::plain(hf, shape, i) });
            }
            Role::Qkvz(part) => qkvz.entry(l).or_default()[part] = Some(i),
            Role::KeyB => kv_b.entry(l).or_default().0 = Some(i),
            Role::ValueB => kv_b.entry(l).or_default().1 = Some(i),
            Role::GateUpBias(part) => gate_up_b.entry(l).or_default()[part] = Some(i),
            Role::Experts(Some(e), part) => {
                if shape.len() != 2 || e as u64 >= n_experts {
                    return Err(unknown());
                }
                if part == 0 && facts.expert_ff == 0 {
                    facts.expert_ff = shape[0];
                }
                tensors.push(Planned {
                    expert_of: Some((l, e, part)),
                    ..Planned::plain(expert_name(a, l, e, part), shape, i)
                });
            }
            Role::GateUpExperts => {
                if shape.len() != 3 || shape[0] as u64 != n_experts || !shape[1].is_multiple_of(2) {
                    return Err(err(format!(
                        "tensor {} has shape {shape:?}, expected {n_experts} stacked experts' gate and up",
                        t.name
                    )));
                }
                let inter = shape[1] / 2;
                if facts.expert_ff == 0 {
                    facts.expert_ff = inter;
                }
                // Expert e's gate is row block 2e of `inter` rows, its up block 2e + 1.
                for e in 0..shape[0] {
                    for part in 0..2 {
                        tensors.push(Planned {
                            expert: Some(2 * e + part),
                            expert_of: Some((l, e, part)),
                            ..Planned::plain(expert_name(a, l, e, part), vec![inter, shape[2]], i)
                        });
                    }
                }
            }
            Role::Experts(None, part) => {
                if shape.len() != 3 || shape[0] as u64 != n_experts {
                    return Err(err(format!(
                        "tensor {} has shape {shape:?}, expected {n_experts} stacked experts",
                        t.name
                    )));
                }
                if part == 0 && facts.expert_ff == 0 {
                    facts.expert_ff = shape[1];
                }
                for e in 0..shape[0] {
                    tensors.push(Planned {
                        expert: Some(e),
                        expert_of: Some((l, e, part)),
                        ..Planned::plain(expert_name(a, l, e, part), shape[1..].to_vec(), i)
                    });
                }
            }
        }
    }
    for (l, parts) in kv_b {
        match parts {
            (_, _, true) => {} // kv_b_proj whole (a file may hold the split copy too)
            (Some(k), Some(v), false) => tensors.push(kv_b_planned(g, l, k, v, heads as usize)?),
            _ => {
                return Err(err(format!(
                    "layer {l} has one of blk.{l}.attn_k_b.weight and blk.{l}.attn_v_b.weight only"
                )))
            }
        }
    }
    for (l, parts) in gate_up_b {
        tensors.push(gate_up_bias_planned(g, a, l, parts)?);
    }
    for (l, parts) in qkvz {
        tensors.push(qkvz_planned(g, name, l, parts)?);
    }
    facts.vocab = match g.tensor("token_embd.weight") {
        Some(t) if t.ne.len() == 2 => t.ne[1] as usize,
        _ => return Err(err("no 2-D token_embd.weight".into())),
    };
    if facts.expert_ff == 0 {
        return Err(err("no expert tensors (blk.N.ffn_gate_exps.weight or ffn_gate_up_exps.weight)".into()));
    }
    facts.tied = g.tensor("output.weight").is_none();
    if a.dsa {
        let (full, why) = super::gguf_families::indexer_types(g, name, n_layers)?;
        super::gguf_families::check_indexers(&full, &why, &indexers)?;
        facts.indexer_full = full;
    }
    let context = meta_u64(g, &key("context_length"))?;
    let config = super::gguf_config::config(g, a, &facts, context)?;
    let (tokenizer_json, tokenizer_config) = super::gguf_tokenizer::tokenizer_files(g, context)?;
    Ok(Imported { arch: name.to_string(), config, tokenizer_json, tokenizer_config, tensors, source_types: types })
}

/// kv_b_proj (`[heads * (qk_nope + v_head_dim), kv_lora_rank]`) of layer `l` from
/// `attn_k_b` (`[heads, kv_lora_rank, qk_nope]`) and `attn_v_b` (`[heads, v_head_dim,
/// kv_lora_rank]`): per head, the transposed key block, then the value block.
fn kv_b_planned(g: &Gguf, l: usize, k: usize, v: usize, heads: usize) -> Result<Planned> {
    let (ks, vs) = (g.tensors[k].shape(), g.tensors[v].shape());
    let bad = || {
        err(format!(
            "blk.{l}.attn_k_b.weight {ks:?} and attn_v_b.weight {vs:?} do not split a kv_b_proj of {heads} heads"
        ))
    };
    if ks.len() != 3 || vs.len() != 3 || ks[0] != heads || vs[0] != heads || ks[1] != vs[2] {
        return Err(bad());
    }
    let rows = ks[2].checked_add(vs[1]).and_then(|r| r.checked_mul(heads)).ok_or_else(bad)?;
    let name = format!("model.layers.{l}.self_attn.kv_b_proj.weight");
    Ok(Planned { kv_split: Some(KvSplit { v_src: v }), ..Planned::plain(name, vec![rows, ks[1]], k) })
}

/// qwen3next's `in_proj_qkvz` of layer `l` (`[2 * key_dim + 2 * value_dim, hidden]`) from
/// `attn_qkv` (`[2 * key_dim + value_dim, hidden]`) and `attn_gate` (`[value_dim, hidden]`),
/// with the head sizes from `ssm.*`: `state_size` (key head dim), `group_count` (key
/// heads), `inner_size` (value_dim).
fn qkvz_planned(g: &Gguf, name: &str, l: usize, parts: [Option<usize>; 2]) -> Result<Planned> {
    let [Some(qkv), Some(gate)] = parts else {
        return Err(err(format!("layer {l} has one of blk.{l}.attn_qkv.weight and blk.{l}.attn_gate.weight only")));
    };
    let need = |k: &str| meta_u64(g, &format!("{name}.{k}"))?.ok_or_else(|| err(format!("no {name}.{k}")));
    let (hk, groups, inner) =
        (need("ssm.state_size")? as usize, need("ssm.group_count")? as usize, need("ssm.inner_size")? as usize);
    let (qs, zs) = (g.tensors[qkv].shape(), g.tensors[gate].shape());
    let bad = || {
        err(format!("blk.{l}.attn_qkv.weight {qs:?} and attn_gate.weight {zs:?} do not fit ssm.state_size {hk}, ssm.group_count {groups}, ssm.inner_size {inner}"))
    };
    if groups == 0 || !inner.is_multiple_of(groups) || qs.len() != 2 || zs.len() != 2 || qs[1] != zs[1] {
        return Err(bad());
    }
    let key_dim = hk.checked_mul(groups).ok_or_else(bad)?;
    if qs[0] != 2 * key_dim + inner || zs[0] != inner {
        return Err(bad());
    }
    let x = Qkvz { gate, groups, hk, vpk: inner / groups };
    let hf = format!("model.layers.{l}.linear_attn.in_proj_qkvz.weight");
    Ok(Planned { qkvz: Some(x), ..Planned::plain(hf, vec![2 * key_dim + 2 * inner, qs[1]], qkv) })
}

/// gpt-oss's `gate_up_proj_bias` of layer `l` from `ffn_gate_exps.bias` and
/// `ffn_up_exps.bias` (both `[experts, inter]`).
fn gate_up_bias_planned(g: &Gguf, a: &Arch, l: usize, parts: [Option<usize>; 2]) -> Result<Planned> {
    let [Some(gate), Some(up)] = parts else {
        return Err(err(format!("layer {l} has one of blk.{l}.ffn_gate_exps.bias and blk.{l}.ffn_up_exps.bias only")));
    };
    let (gs, us) = (g.tensors[gate].shape(), g.tensors[up].shape());
    let cols = match gs.as_slice() {
        [_, c] if gs == us => c.checked_mul(2).ok_or_else(|| err(format!("blk.{l}.ffn_gate_exps.bias: too large")))?,
        _ => {
            return Err(err(format!(
                "blk.{l}.ffn_gate_exps.bias {gs:?} and ffn_up_exps.bias {us:?} are not two [experts, inter] tensors"
            )))
        }
    };
    let name = format!("model.layers.{l}.{}.experts.gate_up_proj_bias", a.moe);
    Ok(Planned { interleave: Some(up), ..Planned::plain(name, vec![gs[0], cols], gate) })
}

#[cfg(test)]
#[path = "gguf_import_tests.rs"]
mod tests;
