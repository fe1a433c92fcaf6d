//! Ollama's `options` onto the OpenAI request the engine's one sampler reads.
//!
//! - Honoured: `temperature`, `top_k` (0 or less: off), `top_p`, `seed` (-1: a random
//!   one), `num_predict` (-1 or -2: until the context is full), `stop`, `repeat_penalty`
//!   (over the whole context, which is `repeat_last_n: -1`), `presence_penalty`,
//!   `frequency_penalty` (OpenAI's, the same formulas as llama.cpp's), `num_ctx` (the
//!   context window, at most the model's).
//! - Accepted at the value that turns them off: `min_p: 0`, `typical_p: 1`, `tfs_z: 1`,
//!   `mirostat: 0` (its `mirostat_tau` and `mirostat_eta` then do nothing),
//!   `repeat_last_n: -1`, `penalize_newline: true` (the penalty applies to every token).
//! - Accepted and without effect on the answer: where and how the model runs (`num_thread`,
//!   `num_gpu`, `main_gpu`, `num_batch`, `use_mmap`, `use_mlock`, `low_vram`, `numa`,
//!   `f16_kv`): `coli serve --threads / --ram` decide that for every request.
//! - Anything else is refused with a 400 naming it.

use serde_json::{json, Map, Value};

use super::Error;

/// Options with no effect on the tokens produced (placement and threads).
const PLACEMENT: &[&str] =
    &["num_thread", "num_gpu", "main_gpu", "num_batch", "use_mmap", "use_mlock", "low_vram", "numa", "f16_kv"];

/// Options taken under another name (Ollama's, OpenAI's).
const RENAMED: &[(&str, &str)] = &[
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("repeat_penalty", "repetition_penalty"),
    ("num_ctx", "num_ctx"),
];

/// Options accepted only at the value that turns them off, and why any other is refused.
const OFF: &[(&str, f64, &str)] = &[
    ("min_p", 0.0, "min_p sampling is not supported (0 turns it off)"),
    ("typical_p", 1.0, "typical sampling is not supported (1 turns it off)"),
    ("tfs_z", 1.0, "tail-free sampling is not supported (1 turns it off)"),
    ("mirostat", 0.0, "mirostat sampling is not supported (0 turns it off)"),
    (
        "repeat_last_n",
        -1.0,
        "repeat_penalty applies to the whole context here (repeat_last_n -1); a window of the last n tokens is not supported",
    ),
];

fn number(name: &str, v: &Value) -> Result<f64, Error> {
    v.as_f64().ok_or_else(|| Error::bad(format!("option {name} must be a number")))
}

/// Writes the OpenAI fields that `options` asks for into `out`; a 400 naming the first
/// option that cannot be honoured.
pub fn apply(options: Option<&Value>, out: &mut Map<String, Value>) -> Result<(), Error> {
    let options = match options {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(Error::bad("options must be an object")),
    };
    let mirostat_off = options.get("mirostat").is_none_or(|m| m.is_null() || m.as_f64() == Some(0.0));
    for (name, v) in options {
        if v.is_null() || PLACEMENT.contains(&name.as_str()) {
            continue;
        }
        if let Some((_, to)) = RENAMED.iter().find(|r| r.0 == name) {
            out.insert(to.to_string(), v.clone());
            continue;
        }
        if let Some((_, off, why)) = OFF.iter().find(|r| r.0 == name) {
            if number(name, v)? != *off {
                return Err(Error::bad(format!("option {name} = {v} is not supported: {why}")));
            }
            continue;
        }
        match name.as_str() {
            "top_k" => {
                let k = number(name, v)?;
                if k.fract() != 0.0 {
                    return Err(Error::bad(format!("option top_k must be a whole number, got {v}")));
                }
                out.insert("top_k".into(), json!(k.max(0.0) as u64));
            }
            "seed" => {
                let s = v.as_i64().ok_or_else(|| Error::bad(format!("option seed must be a whole number, got {v}")))?;
                if s >= 0 {
                    out.insert("seed".into(), json!(s));
                }
            }
            "num_predict" => {
                let n = v
                    .as_i64()
                    .ok_or_else(|| Error::bad(format!("option num_predict must be a whole number, got {v}")))?;
                match n {
                    // Until the context is full (the engine caps it at the room left).
                    -2 | -1 => out.insert("max_tokens".into(), json!(u32::MAX)),
                    1.. => out.insert("max_tokens".into(), json!(n)),
                    _ => {
                        return Err(Error::bad(format!(
                            "option num_predict = {n}: give at least 1 (or -1: until the context is full)"
                        )))
                    }
                };
            }
            "stop" => {
                let stop = match v {
                    Value::String(s) => json!([s]),
                    Value::Array(_) => v.clone(),
                    _ => return Err(Error::bad("option stop must be a list of strings")),
                };
                out.insert("stop".into(), stop);
            }
            "mirostat_tau" | "mirostat_eta" if mirostat_off => {}
            "penalize_newline" => {
                if v.as_bool() != Some(true) {
                    return Err(Error::bad(
                        "option penalize_newline = false is not supported: repeat_penalty applies to every token",
                    ));
                }
            }
            _ => return Err(Error::bad(format!("option {name} is not supported"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Value) -> Result<Value, String> {
        let mut out = Map::new();
        apply(Some(&v), &mut out).map(|_| Value::Object(out)).map_err(|e| e.message)
    }

    #[test]
    fn options_become_the_openai_fields() {
        let v = map(json!({"temperature": 0.5, "top_k": 20, "top_p": 0.9, "seed": 42, "num_predict": 16,
            "stop": ["\n"], "repeat_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "num_ctx": 2048, "num_thread": 8, "use_mmap": true, "min_p": 0.0, "mirostat": 0,
            "mirostat_tau": 5.0, "repeat_last_n": -1, "penalize_newline": true, "typical_p": 1.0}))
        .unwrap();
        assert_eq!(
            v,
            json!({"temperature": 0.5, "top_k": 20, "top_p": 0.9, "seed": 42, "max_tokens": 16, "stop": ["\n"],
                   "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5, "num_ctx": 2048})
        );
        assert_eq!(
            map(json!({"seed": -1, "top_k": -1, "num_predict": -1})).unwrap(),
            json!({"top_k": 0, "max_tokens": u32::MAX})
        );
        assert_eq!(map(json!({"stop": "x"})).unwrap(), json!({"stop": ["x"]}));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        for (opts, name) in [
            (json!({"min_p": 0.05}), "min_p"),
            (json!({"mirostat": 2}), "mirostat"),
            (json!({"mirostat": 2, "mirostat_tau": 5.0}), "mirostat"),
            (json!({"repeat_last_n": 64}), "repeat_last_n"),
            (json!({"tfs_z": 0.9}), "tfs_z"),
            (json!({"typical_p": 0.5}), "typical_p"),
            (json!({"num_keep": 4}), "num_keep"),
            (json!({"penalize_newline": false}), "penalize_newline"),
            (json!({"num_predict": 0}), "num_predict"),
            (json!({"top_k": 2.5}), "top_k"),
            (json!({"seed": "x"}), "seed"),
            (json!({"made_up": 1}), "made_up"),
        ] {
            let e = map(opts.clone()).unwrap_err();
            assert!(e.contains(name), "{opts}: {e}");
        }
        assert!(map(json!([1])).unwrap_err().contains("options must be an object"));
    }
}
