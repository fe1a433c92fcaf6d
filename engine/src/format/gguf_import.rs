//! A GGUF model as a Hugging Face checkpoint: the `config.json` its metadata describes,
//! its tensors under Hugging Face names (llama.cpp's conversions undone), and its
//! tokenizer ([`super::gguf_tokenizer`]). `coli convert model.gguf` writes a normal
//! colibri container from this (docs/gguf.md).
//!
//! Architectures (llama.cpp name -> `model_type`): `qwen3moe` -> qwen3_moe, `olmoe` ->
//! olmoe, `llama` with experts -> mixtral. Tensor names follow gguf-py's
//! tensor_mapping.py; for `llama`, convert_hf_to_gguf.py permuted the rows of q_proj and
//! k_proj (`permute(w, n_head)`: within each head, interleaved pairs instead of two
//! halves) and they are permuted back here. qwen3moe and olmoe use NEOX rope (two halves,
//! as Hugging Face) and were not permuted.

use std::collections::BTreeMap;

use serde_json::{json, Value as Json};

use super::gguf::{GgmlType, Gguf, TensorInfo, Value};
use super::gguf_quant::{self as q, dequantize, is_supported, repack_row, supported_names, to_int8_row};
use super::quant::quantize_row;
use super::tensors::TensorEntry;
use crate::error::{Error, Result};
use crate::tensor::{Bytes, DType};

/// What differs between the supported architectures.
struct Arch {
    gguf: &'static str,
    model_type: &'static str,
    class: &'static str,
    /// Hugging Face module holding the router and experts.
    moe: &'static str,
    /// Hugging Face names of an expert's gate, up and down projections.
    expert_names: [&'static str; 3],
    /// The config key for the expert count.
    experts_key: &'static str,
    /// Whether q/k rows were permuted for rope by convert_hf_to_gguf.
    permuted: bool,
    /// norm_topk_prob: llama.cpp hard-codes it per architecture (it is not in the file).
    norm_topk: Option<bool>,
}

const ARCHES: &[Arch] = &[
    Arch {
        gguf: "qwen3moe",
        model_type: "qwen3_moe",
        class: "Qwen3MoeForCausalLM",
        moe: "mlp",
        expert_names: ["gate_proj", "up_proj", "down_proj"],
        experts_key: "num_experts",
        permuted: false,
        norm_topk: Some(true),
    },
    Arch {
        gguf: "olmoe",
        model_type: "olmoe",
        class: "OlmoeForCausalLM",
        moe: "mlp",
        expert_names: ["gate_proj", "up_proj", "down_proj"],
        experts_key: "num_experts",
        permuted: false,
        norm_topk: Some(false),
    },
    Arch {
        gguf: "llama",
        model_type: "mixtral",
        class: "MixtralForCausalLM",
        moe: "block_sparse_moe",
        expert_names: ["w1", "w3", "w2"],
        experts_key: "num_local_experts",
        permuted: true,
        norm_topk: None,
    },
];

/// One Hugging Face tensor and where its values are in the GGUF.
#[derive(Clone, Debug)]
pub struct Planned {
    pub name: String,
    /// Hugging Face shape (`[rows, cols]` for matrices).
    pub shape: Vec<usize>,
    /// Index into `Gguf::tensors`.
    pub src: usize,
    /// For stacked experts (`ffn_*_exps`): the expert, a block of `shape[0]` rows.
    pub expert: Option<usize>,
    /// Rope permutation to undo: the number of heads the rows were permuted with.
    pub unpermute_heads: Option<usize>,
    /// For a routed expert's matrix: (layer, expert, part), part 0/1/2 = gate/up/down.
    pub expert_of: Option<(usize, usize, usize)>,
}

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

fn err(msg: String) -> Error {
    Error::Invalid(format!("GGUF: {msg}"))
}

fn meta_u64(g: &Gguf, key: &str) -> Result<Option<u64>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => match v.as_i64() {
            Some(x) if x >= 0 => Ok(Some(x as u64)),
            _ => Err(err(format!("{key} is {v:?}, not a non-negative integer"))),
        },
    }
}

fn meta_f64(g: &Gguf, key: &str) -> Result<Option<f64>> {
    match g.get(key) {
        None => Ok(None),
        // An f32 as its shortest decimal (1e-6, not 9.99999997e-7), as config.json has it.
        Some(Value::F32(x)) => Ok(Some(format!("{x}").parse().unwrap_or(*x as f64))),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| err(format!("{key} is {v:?}, not a number"))),
    }
}

/// An expert tensor: the expert (None: all of them, stacked) and the part (gate, up, down).
type ExpertPart = (Option<usize>, usize);

/// Hugging Face name, or expert index and part, of a GGUF tensor of layer `l`.
fn map_layer(a: &Arch, l: usize, rest: &str) -> Option<(String, Option<ExpertPart>)> {
    let p = format!("model.layers.{l}");
    let plain = |s: &str| Some((format!("{p}.{s}"), None));
    match rest {
        "attn_norm.weight" => plain("input_layernorm.weight"),
        "ffn_norm.weight" => plain("post_attention_layernorm.weight"),
        "attn_q.weight" => plain("self_attn.q_proj.weight"),
        "attn_k.weight" => plain("self_attn.k_proj.weight"),
        "attn_v.weight" => plain("self_attn.v_proj.weight"),
        "attn_output.weight" => plain("self_attn.o_proj.weight"),
        "attn_q_norm.weight" => plain("self_attn.q_norm.weight"),
        "attn_k_norm.weight" => plain("self_attn.k_norm.weight"),
        "ffn_gate_inp.weight" => Some((format!("{p}.{}.gate.weight", a.moe), None)),
        "ffn_gate_exps.weight" => Some((String::new(), Some((None, 0)))),
        "ffn_up_exps.weight" => Some((String::new(), Some((None, 1)))),
        "ffn_down_exps.weight" => Some((String::new(), Some((None, 2)))),
        _ => {
            // Older llama.cpp files store Mixtral's experts one by one: ffn_gate.E.weight.
            let (kind, e) = rest.strip_suffix(".weight")?.split_once('.')?;
            let part = ["ffn_gate", "ffn_up", "ffn_down"].iter().position(|k| *k == kind)?;
            Some((String::new(), Some((Some(e.parse().ok()?), part))))
        }
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
        err(format!("architecture {name:?} is not supported (colibri converts {known}; deepseek2, glm4moe and qwen2moe GGUFs are not read yet: convert the Hugging Face checkpoint)"))
    })?;
    if let Some(n) = meta_u64(g, "split.count")?.filter(|&n| n > 1) {
        return Err(err(format!(
            "this file is one of {n} parts of a split GGUF; merge them first (llama-gguf-split --merge FIRST_PART OUT.gguf)"
        )));
    }
    let key = |k: &str| format!("{name}.{k}");
    let need = |k: &str| meta_u64(g, &key(k))?.ok_or_else(|| err(format!("no {}", key(k))));
    let n_layers = need("block_count")? as usize;
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let kv_heads = meta_u64(g, &key("attention.head_count_kv"))?.unwrap_or(heads);
    let n_experts = meta_u64(g, &key("expert_count"))?.unwrap_or(0);
    let used = meta_u64(g, &key("expert_used_count"))?.unwrap_or(0);
    if n_experts == 0 || used == 0 {
        return Err(err(format!(
            "{name} model without experts ({}) : colibri runs Mixture-of-Experts models only",
            key("expert_count")
        )));
    }
    if heads == 0 || hidden % heads != 0 && g.get(&key("attention.key_length")).is_none() {
        return Err(err(format!("{} does not divide {}", key("attention.head_count"), key("embedding_length"))));
    }
    let head_dim = meta_u64(g, &key("attention.key_length"))?.unwrap_or(hidden / heads.max(1));

    // Tensors.
    let mut tensors = Vec::new();
    let mut types = BTreeMap::new();
    let mut expert_ff = None;
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
            tensors.push(Planned {
                name: hf.into(),
                shape,
                src: i,
                expert: None,
                unpermute_heads: None,
                expert_of: None,
            });
            continue;
        }
        let unknown = || err(format!("tensor {} is not part of a {name} model as colibri knows it", t.name));
        let (l, rest) = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(l, rest)| Some((l.parse::<usize>().ok()?, rest)))
            .ok_or_else(unknown)?;
        if l >= n_layers {
            return Err(err(format!("tensor {} is in layer {l}, but {} is {n_layers}", t.name, key("block_count"))));
        }
        let (hf, expert) = map_layer(a, l, rest).ok_or_else(unknown)?;
        match expert {
            None => {
                let unpermute_heads = match rest {
                    "attn_q.weight" if a.permuted => Some(heads as usize),
                    "attn_k.weight" if a.permuted => Some(kv_heads as usize),
                    _ => None,
                };
                tensors.push(Planned { name: hf, shape, src: i, expert: None, unpermute_heads, expert_of: None });
            }
            Some((Some(e), part)) => {
                if shape.len() != 2 || e as u64 >= n_experts {
                    return Err(unknown());
                }
                if part == 0 {
                    expert_ff.get_or_insert(shape[0]);
                }
                tensors.push(Planned {
                    name: expert_name(a, l, e, part),
                    shape,
                    src: i,
                    expert: None,
                    unpermute_heads: None,
                    expert_of: Some((l, e, part)),
                });
            }
            Some((None, part)) => {
                if shape.len() != 3 || shape[0] as u64 != n_experts {
                    return Err(err(format!(
                        "tensor {} has shape {shape:?}, expected {n_experts} stacked experts",
                        t.name
                    )));
                }
                if part == 0 {
                    expert_ff.get_or_insert(shape[1]);
                }
                for e in 0..shape[0] {
                    tensors.push(Planned {
                        name: expert_name(a, l, e, part),
                        shape: shape[1..].to_vec(),
                        src: i,
                        expert: Some(e),
                        unpermute_heads: None,
                        expert_of: Some((l, e, part)),
                    });
                }
            }
        }
    }
    let vocab = match g.tensor("token_embd.weight") {
        Some(t) if t.ne.len() == 2 => t.ne[1],
        _ => return Err(err("no 2-D token_embd.weight".into())),
    };
    let expert_ff = expert_ff.ok_or_else(|| err("no expert tensors (blk.N.ffn_gate_exps.weight)".into()))?;

    // config.json.
    let context = meta_u64(g, &key("context_length"))?;
    let mut c = json!({
        "architectures": [a.class],
        "model_type": a.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "hidden_act": "silu",
        "rms_norm_eps": meta_f64(g, &key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
        "rope_theta": meta_f64(g, &key("rope.freq_base"))?.unwrap_or(10000.0),
        "max_position_embeddings": context.unwrap_or(4096),
        "num_experts_per_tok": used,
        "tie_word_embeddings": g.tensor("output.weight").is_none(),
        "attention_bias": false,
    });
    let obj = c.as_object_mut().ok_or_else(|| err("config".into()))?;
    obj.insert(a.experts_key.into(), json!(n_experts));
    match a.model_type {
        "mixtral" => {
            obj.insert("intermediate_size".into(), json!(expert_ff));
            obj.insert("sliding_window".into(), Json::Null);
        }
        "olmoe" => {
            obj.insert("intermediate_size".into(), json!(expert_ff));
        }
        _ => {
            obj.insert("moe_intermediate_size".into(), json!(expert_ff));
            let ff = meta_u64(g, &key("feed_forward_length"))?.unwrap_or(expert_ff as u64);
            obj.insert("intermediate_size".into(), json!(ff));
            obj.insert("decoder_sparse_step".into(), json!(1));
            obj.insert("mlp_only_layers".into(), json!([]));
        }
    }
    if let Some(n) = a.norm_topk {
        obj.insert("norm_topk_prob".into(), json!(n));
    }
    if let Some(clip) = meta_f64(g, &key("attention.clamp_kqv"))? {
        obj.insert("clip_qkv".into(), json!(clip));
    }
    match g.get(&key("rope.scaling.type")).and_then(Value::as_str) {
        None | Some("none") => {}
        Some(kind @ ("yarn" | "linear")) => {
            let factor = meta_f64(g, &key("rope.scaling.factor"))?
                .ok_or_else(|| err(format!("{kind} rope scaling without {}", key("rope.scaling.factor"))))?;
            let mut s = json!({"rope_type": kind, "factor": factor});
            if let Some(o) = meta_u64(g, &key("rope.scaling.original_context_length"))? {
                s["original_max_position_embeddings"] = json!(o);
            }
            if let Some(f) = meta_f64(g, &key("rope.scaling.attn_factor"))? {
                s["attention_factor"] = json!(f);
            }
            obj.insert("rope_scaling".into(), s);
        }
        Some(other) => return Err(err(format!("rope scaling {other:?} is not supported"))),
    }
    let n_tokens = match g.get("tokenizer.ggml.tokens") {
        Some(Value::Array(t)) => t.len(),
        _ => 0,
    };
    for (k, gk) in [("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")] {
        if let Some(id) = meta_u64(g, gk).ok().flatten().filter(|&id| (id as usize) < n_tokens) {
            obj.insert(k.into(), json!(id));
        }
    }
    let (tokenizer_json, tokenizer_config) = super::gguf_tokenizer::tokenizer_files(g, context)?;
    Ok(Imported { arch: name.to_string(), config: c, tokenizer_json, tokenizer_config, tensors, source_types: types })
}

/// The GGUF row order of Hugging Face row `r` of a matrix whose rows were permuted for
/// rope with `heads` heads of `hd` rows (convert_hf_to_gguf's `permute`: row
/// `h*hd + j*hd/2 + i` went to `h*hd + 2*i + j`).
fn gguf_row(r: usize, hd: usize) -> usize {
    let (h, rem) = (r / hd, r % hd);
    let (j, i) = (rem / (hd / 2), rem % (hd / 2));
    h * hd + 2 * i + j
}

/// The stored type that keeps the values of a GGUF tensor of type `ty` exactly, where
/// colibri's container has one; K-quants (asymmetric or with 8-bit sub-scales) become
/// int8 with group 32, re-quantized from their exact f32 values.
pub fn keep_dtype(ty: GgmlType) -> DType {
    match ty.id {
        q::F32 => DType::F32,
        q::F16 => DType::F16,
        q::BF16 => DType::BF16,
        q::Q4_0 => DType::Int4 { group: 32 },
        _ => DType::Int8 { group: 32 },
    }
}

/// True if `dtype` can hold the values of a `ty` tensor exactly and [`tensor`] writes
/// them directly (MXFP4 into int8: when its scales fit f16, else re-quantized).
pub fn stores_exactly(ty: GgmlType, dtype: DType) -> bool {
    let g32 = dtype.group() == Some(32);
    match (ty.id, dtype) {
        (_, DType::F32) => true,
        (q::F16, DType::F16) | (q::BF16, DType::BF16) => true,
        (q::Q8_0 | q::Q4_0 | q::MXFP4, DType::Int8 { .. }) => g32,
        (q::Q4_0, DType::Int4 { .. }) => g32,
        _ => false,
    }
}

/// The values of `p` stored as `want` (or, with None, as [`keep_dtype`]); exact
/// whenever `want` can hold the GGUF values (F32 from anything, the same float type,
/// Q8_0 / Q4_0 / MXFP4 into int8 or int4 with group 32 as their scales allow), else
/// decoded to f32 and quantized as `coli convert` quantizes safetensors.
pub fn tensor(g: &Gguf, file: &Bytes, p: &Planned, want: Option<DType>) -> Result<TensorEntry> {
    let t: &TensorInfo = &g.tensors[p.src];
    let cols = *p.shape.last().unwrap_or(&1);
    let rows: usize = if p.shape.len() > 1 { p.shape[..p.shape.len() - 1].iter().product() } else { 1 };
    let src_rb = t.ty.bytes_for(cols as u64).ok_or_else(|| err(format!("tensor {}: bad row length", t.name)))? as usize;
    let len = rows.checked_mul(src_rb).ok_or_else(|| err(format!("tensor {}: too large", t.name)))?;
    let start =
        usize::try_from(t.offset).unwrap_or(usize::MAX).saturating_add(p.expert.unwrap_or(0).saturating_mul(len));
    let src = file.slice(start, len).map_err(|e| err(format!("tensor {}: {e}", t.name)))?;
    let dtype = want.unwrap_or_else(|| keep_dtype(t.ty));
    let order: Option<Vec<usize>> = match p.unpermute_heads {
        None => None,
        Some(heads) => {
            if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
                return Err(err(format!("tensor {}: {rows} rows do not split into {heads} rope heads", t.name)));
            }
            Some((0..rows).map(|r| gguf_row(r, rows / heads)).collect())
        }
    };
    let same_float = matches!((t.ty.id, dtype), (q::F32, DType::F32) | (q::F16, DType::F16) | (q::BF16, DType::BF16));
    if same_float && order.is_none() {
        return Ok(TensorEntry { dtype, shape: p.shape.clone(), bytes: src });
    }
    let out_rb = dtype.row_bytes(cols).ok_or_else(|| err(format!("tensor {}: bad stored type", t.name)))?;
    let mut out = vec![0u8; rows * out_rb];
    let mut vals = vec![0f32; cols];
    let g32 = |d: DType| d.group() == Some(32);
    for (r, o) in out.chunks_exact_mut(out_rb.max(1)).enumerate() {
        let sr = order.as_ref().map_or(r, |v| v[r]);
        let s = &src.as_ref()[sr * src_rb..(sr + 1) * src_rb];
        let done = match (t.ty.id, dtype) {
            _ if same_float => {
                o.copy_from_slice(s);
                true
            }
            (q::Q8_0, DType::Int8 { .. }) | (q::Q4_0, DType::Int4 { .. }) if g32(dtype) => {
                repack_row(t.ty.id, cols, s, o);
                true
            }
            (q::Q4_0 | q::MXFP4, DType::Int8 { .. }) if g32(dtype) => to_int8_row(t.ty.id, cols, s, o),
            _ => false,
        };
        if !done {
            dequantize(t.ty, s, &mut vals).map_err(|e| err(format!("tensor {}: {e}", t.name)))?;
            quantize_row(dtype, &vals, o).map_err(|e| err(format!("tensor {}: {e}", t.name)))?;
        }
    }
    Ok(TensorEntry { dtype, shape: p.shape.clone(), bytes: Bytes::from_vec(out) })
}

#[cfg(test)]
#[path = "gguf_import_tests.rs"]
mod tests;
