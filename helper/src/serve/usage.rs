//! `POST /api/usage` and `GET /api/usage/{id}`: expert-use counts that browsers report,
//! merged into the model's usage file (crate::usage_store, which the native commands
//! write to as well).

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use colibri_engine::experts::usage::{ExpertUsage, UsageReport};
use serde_json::json;

use super::models::expert_shape;
use super::AppState;
use crate::usage_store::{fingerprint, merge_into_file, read_usage, usage_path, Merged};

/// Largest request body of a usage report.
pub const MAX_USAGE_BODY: usize = 1 << 20;
/// Most [layer, expert, count] triples in one report.
pub const MAX_TRIPLES: usize = 65_536;

fn bad(status: StatusCode, msg: String) -> Response {
    (status, axum::Json(json!({"error": {"message": msg, "type": "invalid_request_error"}}))).into_response()
}

pub async fn post_usage(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => return bad(e.status(), e.body_text()),
    };
    let report: UsageReport = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return bad(
                StatusCode::BAD_REQUEST,
                format!("not a usage report ({{\"model\", \"counts\": [[layer, expert, count], ...]}}): {e}"),
            )
        }
    };
    if report.counts.len() > MAX_TRIPLES {
        return bad(StatusCode::PAYLOAD_TOO_LARGE, format!("at most {MAX_TRIPLES} counts per report"));
    }
    let Some(model) = state.registry.get(&report.model) else {
        return bad(StatusCode::NOT_FOUND, format!("no model {:?}", report.model));
    };
    let fallback = state.data_dir.as_ref().map(|d| d.join("usage"));
    let result = tokio::task::spawn_blocking(move || -> Result<(PathBuf, Merged), (StatusCode, String)> {
        let shape = expert_shape(&model.root)
            .map_err(|e| (StatusCode::UNPROCESSABLE_ENTITY, format!("{}: {e:#}", model.id)))?;
        // Bounds first (400), so only I/O problems become 500s.
        ExpertUsage::new(shape.0, shape.1)
            .merge_triples(&report.counts)
            .map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
        let path = usage_path(&model.root, &model.id, fallback.as_deref());
        let m = merge_into_file(&path, &model.id, shape, fingerprint(&model.root).as_deref(), &report.counts)
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
        if m.deferred {
            tracing::warn!(path = %path.display(), "another process holds the usage file's lock; counts kept in memory");
        }
        Ok((path, m))
    })
    .await;
    match result {
        Ok(Ok((path, m))) => {
            tracing::debug!(path = %path.display(), total = m.usage.total(), "usage merged");
            let total = m.usage.total();
            axum::Json(json!({"ok": true, "model": report.model, "total": total, "deferred": m.deferred}))
                .into_response()
        }
        Ok(Err((status, msg))) => bad(status, msg),
        Err(_) => bad(StatusCode::INTERNAL_SERVER_ERROR, "internal error".into()),
    }
}

pub async fn get_usage(State(state): State<Arc<AppState>>, UrlPath(id): UrlPath<String>) -> Response {
    let Some(model) = state.registry.get(&id) else {
        return bad(StatusCode::NOT_FOUND, format!("no model {id:?}"));
    };
    let fallback = state.data_dir.as_ref().map(|d| d.join("usage"));
    let result = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, String> {
        let (l, e) = expert_shape(&model.root).map_err(|e| format!("{e:#}"))?;
        let path = usage_path(&model.root, &model.id, fallback.as_deref());
        let fp = fingerprint(&model.root);
        Ok(read_usage(&path, l, e, fp.as_deref()).to_json_bytes(&model.id, fp.as_deref()))
    })
    .await;
    match result {
        Ok(Ok(bytes)) => ([(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Ok(Err(msg)) => bad(StatusCode::UNPROCESSABLE_ENTITY, msg),
        Err(_) => bad(StatusCode::INTERNAL_SERVER_ERROR, "internal error".into()),
    }
}
