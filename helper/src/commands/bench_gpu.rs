//! `coli bench --backend wgpu`: prefill and greedy decode on the GPU forward, one JSON
//! record like the CPU bench's core fields, plus where the routed experts ran (hybrid
//! placement, `--hybrid`) and the GPU expert pool's counters.

#[cfg(feature = "wgpu")]
use std::time::Instant;

use anyhow::Result;
use colibri_engine::Model;
#[cfg(feature = "wgpu")]
use colibri_engine::{math, Logits};
#[cfg(feature = "wgpu")]
use serde_json::json;
use serde_json::Value;

use crate::flags::Compute;

/// Runs the prompt and `decode_tokens` greedy steps on the GPU; `base` is the record's
/// shared part (commit, hardware, command, model), extended here.
#[cfg(feature = "wgpu")]
pub fn run(
    model: &Model,
    c: Compute,
    prompt: &[u32],
    decode_tokens: usize,
    warmup: bool,
    mut base: Value,
) -> Result<Value> {
    let gpu = crate::backend::gpu_model(model, c)?;
    if warmup {
        gpu.forward_blocking(&mut gpu.new_session(), prompt, Logits::Last)?;
    }
    let h0 = gpu.hybrid_stats();
    let mut session = gpu.new_session();
    let t0 = Instant::now();
    let logits = gpu.forward_blocking(&mut session, prompt, Logits::Last)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let h1 = gpu.hybrid_stats();
    let t1 = Instant::now();
    let mut ids = vec![math::argmax(&logits) as u32];
    for _ in 1..decode_tokens.max(1) {
        if session.len() + 1 > model.cfg.max_positions {
            break;
        }
        let next = *ids.last().unwrap_or(&0);
        let logits = gpu.forward_blocking(&mut session, &[next], Logits::Last)?;
        ids.push(math::argmax(&logits) as u32);
    }
    let decode_s = t1.elapsed().as_secs_f64();
    let h2 = gpu.hybrid_stats();
    let pool = gpu.pool_stats();
    let place = |a: &colibri_engine::gpu::HybridStats, b: &colibri_engine::gpu::HybridStats| json!({"cpu_experts": b.cpu_experts - a.cpu_experts, "gpu_experts": b.gpu_experts - a.gpu_experts});
    let extra = json!({
        "backend": "wgpu",
        "adapter": gpu.ctx.adapter_name,
        "hybrid": {"mode": gpu.hybrid().name(), "prefill": place(&h0, &h1), "decode": place(&h1, &h2),
            "cpu_ms_per_expert": h2.cpu_ms, "cpu_ms_per_further_position": h2.cpu_position_ms, "upload_ms_per_expert": h2.upload_ms, "gpu_ms_per_expert": h2.gpu_ms},
        "gpu_pool": {"budget": pool.budget, "bytes": pool.bytes, "hits": pool.hits, "misses": pool.misses,
            "evictions": pool.evictions},
        "warmup": warmup,
        "prompt_tokens": prompt.len(),
        "decode_tokens": ids.len() - 1,
        "ttft_ms": prefill_s * 1e3,
        "prefill_tokens_per_second": prompt.len() as f64 / prefill_s.max(1e-9),
        "decode_tokens_per_second": (ids.len() - 1) as f64 / decode_s.max(1e-9),
        "decode_seconds": decode_s,
        "generated_ids": ids,
    });
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
    Ok(base)
}

#[cfg(not(feature = "wgpu"))]
pub fn run(_: &Model, _: Compute, _: &[u32], _: usize, _: bool, _: Value) -> Result<Value> {
    anyhow::bail!("this coli was built without the wgpu backend (cargo feature \"wgpu\"); use --backend cpu")
}
