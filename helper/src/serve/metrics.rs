//! `GET /metrics`: the server's counters in Prometheus' text exposition format (version
//! 0.0.4), the convention every serving stack follows; `/health` keeps its JSON.
//!
//! Server-wide: requests, refused requests, open connections, file bytes sent, generations
//! started / finished / cancelled / active, tokens generated, prompt tokens served from a
//! kept cache, speculation. Per loaded model (label `model`): generations admitted (running
//! or queued) and running, the conversation caches kept (count and bytes), and the expert
//! cache's hits per tier (pinned, ram), misses, bytes read from disk, bytes held and the
//! lookahead's prefetched bytes.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// One metric family: its help line, type and samples (labels, value).
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<(String, f64)>,
}

fn write(out: &mut String, f: &Family) {
    let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
    let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
    for (labels, v) in &f.samples {
        let _ = writeln!(out, "{}{labels} {v}", f.name);
    }
}

/// A label value escaped as the format asks (backslash, quote, newline).
fn label(model: &str) -> String {
    let v = model.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    format!("{{model=\"{v}\"}}")
}

fn one(name: &'static str, help: &'static str, kind: &'static str, v: f64) -> Family {
    Family { name, help, kind, samples: vec![(String::new(), v)] }
}

/// The exposition text of `state` right now.
pub fn render(state: &AppState) -> String {
    let s = &state.stats;
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    let mut fams = vec![
        one("colibri_requests_total", "HTTP requests answered.", "counter", n(&s.requests)),
        one("colibri_requests_refused_total", "Requests refused (host, origin, limits).", "counter", n(&s.refused)),
        one("colibri_connections", "Open connections.", "gauge", s.connections.load(Ordering::Relaxed) as f64),
        one("colibri_file_bytes_sent_total", "Model file bytes sent over the Range API.", "counter", n(&s.file_bytes)),
        one("colibri_generations_started_total", "Generations started.", "counter", n(&s.generations_started)),
        one("colibri_generations_finished_total", "Generations finished.", "counter", n(&s.generations_finished)),
        one("colibri_generations_cancelled_total", "Generations cancelled.", "counter", n(&s.generations_cancelled)),
        one(
            "colibri_generations_active",
            "Generations running now.",
            "gauge",
            s.generations_active.load(Ordering::Relaxed) as f64,
        ),
        one("colibri_tokens_generated_total", "Tokens generated.", "counter", n(&s.tokens_generated)),
        one(
            "colibri_prompt_tokens_cached_total",
            "Prompt tokens not fed again: their cache was kept from an earlier request.",
            "counter",
            n(&s.prompt_tokens_cached),
        ),
        one("colibri_speculation_drafted_total", "Speculative draft tokens fed.", "counter", n(&s.spec_drafted)),
        one("colibri_speculation_accepted_total", "Speculative draft tokens kept.", "counter", n(&s.spec_accepted)),
        one(
            "colibri_engine_passes_total",
            "Forward passes of the engine (one per batch step).",
            "counter",
            n(&s.passes),
        ),
        one(
            "colibri_engine_pass_sequences_total",
            "Generations fed by those passes (divided by the passes: the mean batch size).",
            "counter",
            n(&s.pass_sequences),
        ),
        one(
            "colibri_engine_pass_sequences_max",
            "Most generations one pass has fed.",
            "gauge",
            s.pass_sequences_max.load(Ordering::Relaxed) as f64,
        ),
        one(
            "colibri_engine_solo_passes_total",
            "Generations that ran a pass of their own instead of joining the step's shared pass (DeepSeek-V4, or a shared pass that failed and was redone one by one).",
            "counter",
            n(&s.solo_passes),
        ),
        one(
            "colibri_prefill_tokens_total",
            "Prompt positions fed by passes that fed a prompt chunk.",
            "counter",
            n(&s.prefill_positions),
        ),
        one(
            "colibri_prefill_seconds_total",
            "Time of the passes that fed a prompt chunk (prefill tokens/s: tokens / seconds).",
            "counter",
            n(&s.prefill_micros) / 1e6,
        ),
        one("colibri_decode_tokens_total", "Tokens made by decode-only passes.", "counter", n(&s.decode_tokens)),
        one(
            "colibri_decode_seconds_total",
            "Time of the decode-only passes (decode tokens/s: tokens / seconds).",
            "counter",
            n(&s.decode_micros) / 1e6,
        ),
    ];
    let models = state.engines.snapshot();
    let per = |name: &'static str,
               help: &'static str,
               kind: &'static str,
               f: &dyn Fn(&super::generation::SlotMetrics) -> Option<f64>| Family {
        name,
        help,
        kind,
        samples: models.iter().filter_map(|m| f(m).map(|v| (label(&m.model), v))).collect(),
    };
    fams.push(per(
        "colibri_model_generations_admitted",
        "Generations admitted per model (running or queued).",
        "gauge",
        &|m| Some(m.admitted as f64),
    ));
    fams.push(per("colibri_model_generations_running", "Generations running per model.", "gauge", &|m| {
        Some(m.running as f64)
    }));
    fams.push(per("colibri_model_queue_length", "Generations waiting for room in the model's batch.", "gauge", &|m| {
        Some(m.admitted.saturating_sub(m.running) as f64)
    }));
    fams.push(per(
        "colibri_model_parallel",
        "Generations the model runs together at most (coli serve --parallel).",
        "gauge",
        &|m| Some(m.parallel as f64),
    ));
    fams.push(per("colibri_kv_conversations", "Conversation caches kept per model.", "gauge", &|m| {
        Some(m.kv_conversations as f64)
    }));
    fams.push(per("colibri_kv_bytes", "Bytes of the conversation caches kept per model.", "gauge", &|m| {
        Some(m.kv_bytes as f64)
    }));
    fams.push(per("colibri_kv_active_bytes", "Bytes of the running generations' caches per model.", "gauge", &|m| {
        Some(m.kv_active_bytes as f64)
    }));
    let cache = |f: fn(&colibri_engine::experts::cache::CacheStats) -> u64| {
        move |m: &super::generation::SlotMetrics| m.cache.as_ref().map(|c| f(c) as f64)
    };
    fams.push(per(
        "colibri_expert_pinned_hits_total",
        "Expert reads served by the pinned tier.",
        "counter",
        &cache(|c| c.pinned_hits),
    ));
    fams.push(per(
        "colibri_expert_ram_hits_total",
        "Expert reads served by the RAM tier of recently used experts.",
        "counter",
        &cache(|c| c.ram_hits),
    ));
    fams.push(per("colibri_expert_misses_total", "Expert reads that went to disk.", "counter", &cache(|c| c.misses)));
    fams.push(per(
        "colibri_expert_bytes_read_total",
        "Expert bytes read from disk.",
        "counter",
        &cache(|c| c.bytes_read),
    ));
    fams.push(per(
        "colibri_expert_cached_bytes",
        "Expert bytes held in RAM (pinned and recently used).",
        "gauge",
        &cache(|c| c.cached_bytes),
    ));
    fams.push(per(
        "colibri_expert_prefetch_bytes_total",
        "Expert bytes the router lookahead asked to read early.",
        "counter",
        &cache(|c| c.prefetch_bytes),
    ));
    fams.push(per(
        "colibri_expert_prefetch_cancelled_bytes_total",
        "Of those, bytes cancelled unread (the router chose otherwise before a reader began).",
        "counter",
        &cache(|c| c.prefetch_cancelled_bytes),
    ));
    let mut out = String::new();
    for f in &fams {
        write(&mut out, f);
    }
    out
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let s = state.clone();
    match tokio::task::spawn_blocking(move || render(&s)).await {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response(),
        Err(_) => axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
