//! Reading config.json's values: integers bounded and named in errors, token ids,
//! `layer_types`, sliding windows, the settings the engine refuses.

use serde_json::Value;

use super::Family;
use crate::error::{Error, Result};

pub(super) fn get_usize(v: &Value, key: &str) -> Option<usize> {
    v.get(key).and_then(Value::as_u64).map(|x| usize::try_from(x).unwrap_or(usize::MAX))
}

/// `value` of `key` is at most `max`.
pub(super) fn bounded(key: &str, value: usize, max: usize) -> Result<usize> {
    if value > max {
        return Err(Error::Config(format!("{key} = {value} is larger than this engine allows ({max})")));
    }
    Ok(value)
}

pub(super) fn need_usize(v: &Value, key: &str) -> Result<usize> {
    get_usize(v, key).ok_or_else(|| Error::Config(format!("missing or invalid integer {key:?}")))
}

pub(super) fn first_usize(v: &Value, keys: &[&str]) -> Result<usize> {
    keys.iter()
        .find_map(|k| get_usize(v, k))
        .ok_or_else(|| Error::Config(format!("missing integer {:?}", keys.join(" or "))))
}

pub(super) fn get_f64(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

pub(super) fn get_bool(v: &Value, key: &str) -> Option<bool> {
    v.get(key).and_then(Value::as_bool)
}

/// Token ids in config.json may be an integer, a list of integers or null.
pub fn parse_token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().and_then(|x| u32::try_from(x).ok()).map(|x| vec![x]).unwrap_or_default(),
        Some(Value::Array(a)) => {
            a.iter().filter_map(Value::as_u64).filter_map(|x| u32::try_from(x).ok()).take(1024).collect()
        }
        _ => Vec::new(),
    }
}

/// What no family here implements, refused with the field named: quantized checkpoints
/// but block-scaled FP8 (e4m3, f32 scales) and gpt_oss's MXFP4 experts, and
/// activations other than SiLU.
pub(super) fn refuse_unsupported(v: &Value, family: Family) -> Result<()> {
    if let Some(q) = v.get("quantization_config").filter(|q| !q.is_null()) {
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("unknown");
        // gpt_oss's MXFP4 experts (*_blocks / *_scales) are read as they are (model/gpt_oss.rs),
        // and block-scaled FP8 of any family (format/fp8.rs).
        if method == "fp8" {
            crate::format::fp8::block_size(v)?;
        } else if !(family == Family::GptOss && method == "mxfp4") {
            return Err(Error::Config(format!(
                "quantization_config (quant_method {method:?}) is not supported: convert from a checkpoint in f32, bf16 or f16"
            )));
        }
    }
    match v.get("hidden_act").or_else(|| v.get("hidden_activation")) {
        None => Ok(()),
        Some(a) if a.as_str() == Some("silu") => Ok(()),
        Some(a) => Err(Error::Config(format!("hidden_act {a} is not supported (only \"silu\")"))),
    }
}

/// `key` as an integer: `default` when absent (transformers' default), an error naming
/// the key when null or not an integer.
pub(super) fn optional_usize(v: &Value, key: &str, default: usize) -> Result<usize> {
    match v.get(key) {
        None => Ok(default),
        Some(x) => x
            .as_u64()
            .map(|x| usize::try_from(x).unwrap_or(usize::MAX))
            .ok_or_else(|| Error::Config(format!("{key} = {x} is not supported (a non-negative integer is needed)"))),
    }
}

/// `layer_types` when present: one entry per layer, each one of `kinds`' names mapped to
/// its value; None when absent or null (the family's default applies); an error naming
/// the entry otherwise.
pub(super) fn layer_types<T: Copy>(v: &Value, n_layers: usize, kinds: &[(&str, T)]) -> Result<Option<Vec<T>>> {
    let Some(types) = v.get("layer_types").filter(|t| !t.is_null()) else { return Ok(None) };
    let types = types
        .as_array()
        .filter(|t| t.len() == n_layers)
        .ok_or_else(|| Error::Config(format!("layer_types must list one type for each of the {n_layers} layers")))?;
    let known = || kinds.iter().map(|(k, _)| format!("{k:?}")).collect::<Vec<_>>().join(" and ");
    types
        .iter()
        .map(|t| match kinds.iter().find(|(k, _)| t.as_str() == Some(k)) {
            Some((_, value)) => Ok(*value),
            None => Err(Error::Config(format!("layer_types entry {t} is not supported (only {})", known()))),
        })
        .collect::<Result<Vec<T>>>()
        .map(Some)
}

/// Per-layer sliding windows. Mixtral applies `sliding_window` to every layer when it is
/// set; the Qwen families only when `use_sliding_window` is on, following `layer_types`
/// when the config lists them (else layers from `max_window_layers` on).
pub(super) fn sliding_windows(v: &Value, family: Family, n_layers: usize) -> Vec<Option<usize>> {
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
