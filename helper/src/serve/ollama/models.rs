//! `GET /api/tags` (the models served), `POST /api/show` (one model's details, template and
//! parameters) and `GET /api/ps` (the models loaded now), in Ollama's shapes.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::super::models::{list_files, ModelEntry};
use super::super::AppState;
use super::{model_id, model_name, parse_object, rfc3339, Error};

/// A small JSON file of the model directory (Null when absent or unreadable).
fn read_json(root: &Path, name: &str) -> Value {
    colibri_engine::fsio::read_limited(&root.join(name), colibri_engine::fsio::MAX_JSON_BYTES)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null)
}

/// What `/api/tags` and `/api/ps` say of a model: name, size, digest, details.
fn entry(m: &ModelEntry) -> Value {
    let files = list_files(&m.root);
    let size: u64 = files.iter().map(|(_, s)| s).sum();
    let config = read_json(&m.root, "config.json");
    let manifest = read_json(&m.root, colibri_engine::format::MANIFEST_FILE);
    // A digest that changes when the model does: its id, config and manifest, and its
    // files' names and sizes (the weights themselves would take minutes to hash).
    let mut h = Sha256::new();
    h.update(m.id.as_bytes());
    h.update(config.to_string().as_bytes());
    h.update(manifest.to_string().as_bytes());
    for (name, len) in &files {
        h.update(format!("\n{name} {len}").as_bytes());
    }
    let digest: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let modified = std::fs::metadata(m.root.join("config.json")).and_then(|md| md.modified()).ok();
    let family = config.get("model_type").and_then(Value::as_str).unwrap_or("unknown");
    let (format, quant) = match manifest.pointer("/quant/default").and_then(Value::as_str) {
        Some(q) => ("colibri", q.to_string()),
        None => ("safetensors", config.get("torch_dtype").and_then(Value::as_str).unwrap_or("").to_string()),
    };
    json!({
        "name": m.id,
        "model": m.id,
        "modified_at": rfc3339(modified.unwrap_or(SystemTime::UNIX_EPOCH)),
        "size": size,
        "digest": digest,
        "details": {
            "parent_model": "",
            "format": format,
            "family": family,
            "families": [family],
            "parameter_size": "",
            "quantization_level": quant,
        },
    })
}

/// Runs `f` off the async workers (it reads the model directories).
async fn blocking(f: impl FnOnce() -> Result<Value, Error> + Send + 'static) -> Response {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(_) => Error { status: StatusCode::INTERNAL_SERVER_ERROR, message: "internal error".into() }.into_response(),
    }
}

pub async fn tags(State(state): State<Arc<AppState>>) -> Response {
    blocking(move || Ok(json!({"models": state.registry.list().iter().map(entry).collect::<Vec<_>>()}))).await
}

/// The loaded models; they stay loaded until the helper stops.
pub async fn ps(State(state): State<Arc<AppState>>) -> Response {
    blocking(move || {
        let loaded = state.engines.snapshot().into_iter().filter(|s| s.loaded);
        let models: Vec<Value> = loaded
            .filter_map(|s| state.registry.get(&s.model))
            .map(|m| {
                let mut v = entry(&m);
                v["size_vram"] = json!(0);
                v["expires_at"] = json!("9999-12-31T23:59:59Z");
                v
            })
            .collect();
        Ok(json!({"models": models}))
    })
    .await
}

/// Ollama's `parameters` text: the model's sampling defaults (generation_config.json).
fn parameters(root: &Path) -> String {
    let g = read_json(root, "generation_config.json");
    let names = [
        ("temperature", "temperature"),
        ("top_k", "top_k"),
        ("top_p", "top_p"),
        ("repetition_penalty", "repeat_penalty"),
    ];
    names
        .iter()
        .filter_map(|(from, to)| g.get(from).filter(|v| v.is_number()).map(|v| format!("{to} {v}")))
        .collect::<Vec<_>>()
        .join("\n")
}

pub async fn show(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let req = match parse_object(&body).and_then(|r| model_name(&r)) {
        Ok(name) => name,
        Err(e) => return e.into_response(),
    };
    blocking(move || {
        let m = state.registry.get(model_id(&req)).ok_or_else(|| Error::not_found(&req))?;
        let mut v = entry(&m);
        let config = read_json(&m.root, "config.json");
        let arch = v["details"]["family"].as_str().unwrap_or("unknown").to_string();
        let mut info = json!({"general.architecture": arch});
        let keys = [
            ("context_length", "max_position_embeddings"),
            ("embedding_length", "hidden_size"),
            ("block_count", "num_hidden_layers"),
            ("attention.head_count", "num_attention_heads"),
            ("attention.head_count_kv", "num_key_value_heads"),
            ("expert_count", "num_experts"),
            ("expert_count", "n_routed_experts"),
            ("expert_used_count", "num_experts_per_tok"),
            ("vocab_size", "vocab_size"),
        ];
        for (key, from) in keys {
            if let Some(n) = config.get(from).filter(|n| n.is_u64()) {
                info[format!("{arch}.{key}")] = n.clone();
            }
        }
        let tok = read_json(&m.root, "tokenizer_config.json");
        let template = tok.get("chat_template").and_then(Value::as_str).unwrap_or("");
        let mut capabilities = vec!["completion"];
        if template.contains("tools") {
            capabilities.push("tools");
        }
        v["modelfile"] = json!(format!("# colibri model {}\nFROM {}\n", m.id, m.root.display()));
        v["parameters"] = json!(parameters(&m.root));
        v["template"] = json!(template);
        v["license"] = json!("");
        v["model_info"] = info;
        v["capabilities"] = json!(capabilities);
        Ok(v)
    })
    .await
}
