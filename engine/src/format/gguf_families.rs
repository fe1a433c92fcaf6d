//! What the two newest architectures add to a GGUF import (docs/gguf.md): qwen35moe's
//! value-head order (convert_hf_to_gguf tiles the DeltaNet value heads; [`vheads`] plans
//! them back grouped by key head) and glm-dsa's per-layer indexer kinds ([`indexer_types`],
//! llama.cpp's rule where the file does not say, and [`check_indexers`], the indexer
//! tensors each layer must and must not have).

use std::collections::BTreeMap;

use super::gguf::{Array, Gguf, Value};
use super::gguf_plan::{err, meta_u64, VHeads};
use crate::error::Result;

/// qwen35moe's Gated DeltaNet sizes (`ssm.*`): key heads, value heads, their head dims.
pub(super) struct DeltaSizes {
    nk: usize,
    nv: usize,
    hk: usize,
    hv: usize,
}

/// The DeltaNet sizes of a qwen35moe file: `ssm.group_count` (key heads),
/// `ssm.time_step_rank` (value heads), `ssm.state_size` (key head dim), `ssm.inner_size`
/// (value heads x value head dim).
pub(super) fn delta_sizes(g: &Gguf, name: &str) -> Result<DeltaSizes> {
    let need = |k: &str| -> Result<usize> {
        let key = format!("{name}.{k}");
        Ok(meta_u64(g, &key)?.ok_or_else(|| err(format!("no {key}")))? as usize)
    };
    let (nk, nv, hk, inner) =
        (need("ssm.group_count")?, need("ssm.time_step_rank")?, need("ssm.state_size")?, need("ssm.inner_size")?);
    if nk == 0 || nv == 0 || !nv.is_multiple_of(nk) || !inner.is_multiple_of(nv) {
        return Err(err(format!(
            "{name}.ssm.time_step_rank {nv} is not a multiple of ssm.group_count {nk}, or ssm.inner_size {inner} of it"
        )));
    }
    Ok(DeltaSizes { nk, nv, hk, hv: inner / nv })
}

/// The value-head reorder to undo on qwen35moe tensor `rest` (its name after `blk.N.`):
/// convert_hf_to_gguf reorders them wherever there are fewer key heads than value heads.
pub(super) fn vheads(rest: &str, d: &DeltaSizes) -> Option<VHeads> {
    let per_k = d.nv / d.nk;
    if per_k <= 1 {
        return None; // grouped and tiled are the same order
    }
    let v = |hd, offset, cols| Some(VHeads { nk: d.nk, per_k, hd, offset, cols });
    match rest {
        // q and k (2 x key heads x key head dim) first, then the value channels.
        "attn_qkv.weight" | "ssm_conv1d.weight" => v(d.hv, 2 * d.nk * d.hk, false),
        "attn_gate.weight" => v(d.hv, 0, false),
        "ssm_beta.weight" | "ssm_alpha.weight" => v(1, 0, false),
        "ssm_a" | "ssm_dt.bias" => v(1, 0, true),
        "ssm_out.weight" => v(d.hv, 0, true),
        _ => None,
    }
}

/// The indexer tensors of a glm-dsa layer whose indexer is "full" (names after `blk.N.`).
pub(super) const INDEXER: [&str; 5] = [
    "indexer.attn_q_b.weight",
    "indexer.attn_k.weight",
    "indexer.k_norm.weight",
    "indexer.k_norm.bias",
    "indexer.proj.weight",
];

/// llama.cpp's `GLM_5_2_DEFAULT_INDEXER_TYPES`: full indexers on layers 0 and 1, then on
/// every fourth layer from 2 (2, 6, 10, ...), shared on the others.
fn glm_5_2_default(l: usize) -> bool {
    l < 2 || (l - 2).is_multiple_of(4)
}

/// glm-dsa's indexer kind per layer (true: "full", its own top-k selection; false:
/// "shared", the previous full layer's) and where that came from, by llama.cpp's rule
/// (src/models/glm-dsa.cpp): `{arch}.attention.indexer.types` (one bool or integer per
/// layer, true / non-zero for full) where the file has it; else every layer full when
/// `context_length` is below 2^20 (GLM-5 and 5.1, whose GGUFs predate the key), and
/// GLM-5.2's pattern ([`glm_5_2_default`]) from there on.
pub(super) fn indexer_types(g: &Gguf, name: &str, n_layers: usize) -> Result<(Vec<bool>, String)> {
    let key = format!("{name}.attention.indexer.types");
    let from_ints = |v: Vec<i64>| v.into_iter().map(|x| x != 0).collect::<Vec<bool>>();
    let listed: Option<Vec<bool>> = match g.get(&key) {
        None => None,
        Some(Value::Array(Array::Bool(v))) => Some(v.clone()),
        Some(Value::Array(Array::U8(v))) => Some(from_ints(v.iter().map(|&x| x as i64).collect())),
        Some(Value::Array(Array::I8(v))) => Some(from_ints(v.iter().map(|&x| x as i64).collect())),
        Some(Value::Array(Array::U32(v))) => Some(from_ints(v.iter().map(|&x| x as i64).collect())),
        Some(Value::Array(Array::I32(v))) => Some(from_ints(v.iter().map(|&x| x as i64).collect())),
        Some(_) => return Err(err(format!("{key} is not an array of bools or integers"))),
    };
    if let Some(v) = listed {
        if v.len() < n_layers {
            return Err(err(format!("{key} has {} entries for {n_layers} layers", v.len())));
        }
        return Ok((v[..n_layers].to_vec(), key));
    }
    let context = meta_u64(g, &format!("{name}.context_length"))?.unwrap_or(0);
    if context < 1 << 20 {
        Ok((vec![true; n_layers], format!("{key} absent and context_length {context} < 2^20: GLM-5's, all full")))
    } else {
        let why = format!("{key} absent and context_length {context} >= 2^20: GLM-5.2's pattern");
        Ok(((0..n_layers).map(glm_5_2_default).collect(), why))
    }
}

/// Every layer whose indexer is full has all [`INDEXER`] tensors; a shared layer has none
/// (it runs no indexer, and the Hugging Face checkpoint has none there); layer 0 is full
/// (a shared layer reuses an earlier selection). `present`: per layer, the indexer
/// tensors the file has.
pub(super) fn check_indexers(full: &[bool], why: &str, present: &BTreeMap<usize, Vec<String>>) -> Result<()> {
    if full.first() == Some(&false) {
        return Err(err(format!("layer 0's indexer is shared ({why}): there is no earlier selection to reuse")));
    }
    let none = Vec::new();
    for (l, &f) in full.iter().enumerate() {
        let have = present.get(&l).unwrap_or(&none);
        if f {
            if let Some(t) = INDEXER.iter().find(|t| !have.iter().any(|h| h == *t)) {
                return Err(err(format!("tensor blk.{l}.{t} is missing: layer {l}'s indexer is full ({why})")));
            }
        } else if let Some(t) = have.first() {
            return Err(err(format!(
                "tensor blk.{l}.{t} is in layer {l}, whose indexer is shared ({why}): a shared layer has no indexer of its own"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_glm_5_2_default_pattern_is_llama_cpps() {
        let first: Vec<u8> = (0..14).map(|l| glm_5_2_default(l) as u8).collect();
        assert_eq!(first, [1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]);
        // GLM-5.2's 78 layers: 21 full, 57 shared.
        assert_eq!((0..78).filter(|&l| glm_5_2_default(l)).count(), 21);
    }

    #[test]
    fn tiled_value_heads_map_back_to_grouped() {
        // 2 key heads, 3 value heads each, 2 values per head, after 4 rows of q and k.
        let v = VHeads { nk: 2, per_k: 3, hd: 2, offset: 4, cols: false };
        let src: Vec<usize> = (0..4 + 12 + 1).map(|x| v.source(x)).collect();
        // Hugging Face head g*3+r (g: key head) is GGUF head r*2+g.
        assert_eq!(src, [0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 6, 7, 10, 11, 14, 15, 16]);
    }
}
