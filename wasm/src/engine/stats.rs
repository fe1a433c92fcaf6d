//! `stats()`: what the engine did and holds, as JSON for the page.

use wasm_bindgen::prelude::*;

use super::draft::DraftModel;
use super::{Engine, JsFail, BUSY};
use crate::backend::Context;
use crate::memory;

#[wasm_bindgen]
impl Engine {
    /// Engine statistics as JSON (backend, tiers, bytes fetched, tokens/s, TTFT).
    pub fn stats(&self) -> Result<String, JsFail> {
        let t = self.tiers.stats.borrow().clone();
        let st = self.state.try_borrow().map_err(|_| JsFail::msg(BUSY))?;
        let perf = &st.perf;
        let loads = perf.expert_loads;
        let [helper, disk, ram, gpu] = perf.tier_uses;
        let ahead = self.backend.lookahead();
        let cache = self.model.experts.cache_stats().unwrap_or_default();
        let rate = |n: u64| if loads > 0 { n as f64 / loads as f64 } else { 0.0 };
        let disk_usage = self.tiers.disk_usage();
        let pool = self.backend.pool_stats();
        let mut out = serde_json::json!({
            "backend": self.backend.name(),
            // CPU kernel threads: the pool's workers in the threaded build, else 1.
            "threads": colibri_engine::kernels::threads(),
            // The integer dot-product path of the CPU kernels ("simd128" or "scalar").
            "simd": colibri_engine::qdot::Simd::active().name(),
            // The relaxed-SIMD kernels' summing form as measured at load (or null).
            "simdForm": crate::kernel_form(),
            "adapter": self.backend.adapter(),
            // WebGPU: whether the integer matmuls use WGSL's dot4I8Packed (the browser has
            // packed_4x8_integer_dot_product); null on the CPU backend.
            "dp4a": self.backend.dp4a(),
            "auto": self.auto,
            "tokensPerSecond": if perf.decode_ms > 0.0 { perf.tokens as f64 * 1000.0 / perf.decode_ms } else { 0.0 },
            // The last generation's speculation (generate({speculate})), else null.
            "speculation": st.gen.as_ref().filter(|g| g.is_speculative()).map(|g| {
                let s = g.spec_stats();
                serde_json::json!({"forwards": s.forwards, "drafted": s.drafted, "accepted": s.accepted,
                    "produced": s.produced, "acceptanceRate": s.acceptance_rate(), "tokensPerForward": s.tokens_per_forward()})
            }),
            "ttftMs": perf.ttft_ms,
            // What the attention cache holds per token: K and V of every kv head, or
            // MLA's latent and rotary key (deepseek_v3); qwen3_next's linear layers keep
            // a fixed-size recurrent state instead.
            "attention": self.model.cfg.attention_kind(),
            "kvCacheBytesPerToken": self.model.cfg.kv_cache_bytes_per_token(),
            "recurrentStateBytes": self.model.cfg.recurrent_state_bytes(),
            // The conversation's cache kept between generations: the last prompt's tokens,
            // how many of them it already held (not fed again), and its size now.
            "promptTokens": perf.prompt_tokens,
            "cachedTokens": perf.cached_tokens,
            "kvCacheTokens": st.cx.tokens().len(),
            "kvCacheBytes": colibri_engine::generate::Context::bytes(&st.cx),
            "kvSnapshotBytes": st.cx.snapshot_bytes(),
            "bytesFetched": t.bytes_fetched,
            "expertLoads": loads,
            // Each expert use once, by the tier that served it: these add up to expertLoads.
            "tiers": { "gpu": gpu, "ram": ram, "disk": disk, "helper": helper },
            // The tiers' own event counters (prefetches and retried steps included).
            "tierEvents": {
                "gpuPoolHits": self.backend.gpu_hits(),
                "ramHits": self.model.experts.cache_stats().map_or(0, |c| c.hits),
                "diskHits": t.disk_hits,
                "helperFetches": t.helper_fetches,
            },
            "requests": t.requests,
            // Whether expert requests ask for several ranges at once (false on a static
            // host that cannot answer them: one range per request).
            "multiRange": self.tiers.multi_range(),
            "retries": t.retries,
            "corruptDropped": t.corrupt_dropped,
            "diskReadBytes": t.disk_bytes,
            "diskReadMs": t.disk_ms,
            "prefetchRecall": ahead.and_then(|a| a.recall()),
            "prefetch": ahead.map(|a| serde_json::json!({
                "routed": a.routed, "predictedHits": a.predicted_hits, "predicted": a.predicted,
                "prefetched": a.prefetched, "wastedBytes": t.prefetch_wasted_bytes,
            })),
            "diskEnabled": t.disk_enabled,
            "diskKind": t.disk_kind,
            "diskError": t.disk_error,
            "diskExperts": self.tiers.disk_count(),
            "persisted": self.persisted.get(),
        });
        // Learned placement and the managed disk tier (a second object: one json! of all
        // of it is past the macro's recursion limit).
        let placement = serde_json::json!({
            // The same as shares of expertLoads: each tier's hit rate.
            "hitRates": { "gpu": rate(gpu), "ram": rate(ram), "disk": rate(disk), "helper": rate(helper) },
            // Experts pinned by learned usage: in the RAM tier (its pin budget, what it
            // holds, its hits) and in the disk tier (never evicted); moves at turn ends.
            "pins": {
                "ramBudget": self.pin_bytes, "ramExperts": cache.pinned_experts, "ramBytes": cache.pinned_bytes,
                "ramHits": cache.pinned_hits, "ramRepinned": cache.repinned,
                "diskExperts": disk_usage.map(|d| d.pinned), "diskBytes": disk_usage.map(|d| d.pinned_bytes),
                "diskRepinned": t.disk_repinned,
                "gpuExperts": pool.map(|p| p.pinned), "gpuBytes": pool.map(|p| p.pinned_bytes),
                "gpuRepinned": pool.map(|p| p.repinned),
            },
            "learnedUses": self.learned.borrow().total(),
            "usageError": self.usage_error,
            // The managed disk tier: its budget (null: none), the expert bytes it holds and
            // its files' size; experts evicted to stay under the budget, evicted ones
            // fetched again, and ones not stored because pinned experts filled it.
            "diskBudget": disk_usage.and_then(|d| d.budget),
            "diskStoredBytes": disk_usage.map(|d| d.stored),
            "diskFileBytes": disk_usage.map(|d| d.file),
            "diskEvictions": t.disk_evictions,
            "diskRefetches": t.disk_refetches,
            "diskSkipped": t.disk_skipped,
            // The dense weights: from the browser's copy ("opfs") or the network, the bytes
            // fetched for them, their copy's size in browser storage (inside load's
            // diskBytes; diskBudget is what is left of it for experts).
            "dense": self.dense,
            // Memory: the wasm heap now (also its peak: it never shrinks), whether the dense
            // weights are in it (not on WebGPU: streamed to GPU buffers), and the bytes of
            // the GPU's buffers: dense weights, expert pool, KV cache (null on the CPU).
            "memory": {
                "wasmBytes": memory::wasm_bytes(),
                "denseInWasm": self.model.dense_in_memory(),
                "gpuDenseBytes": self.backend.dense_gpu_bytes(),
                "gpuExpertBytes": pool.map(|p| p.bytes),
                "gpuKvBytes": matches!(st.cx, Context::Gpu(_)).then(|| colibri_engine::generate::Context::bytes(&st.cx)),
            },
        });
        if let (Some(o), serde_json::Value::Object(p)) = (out.as_object_mut(), placement) {
            o.extend(p);
            // The draft model (loadDraft), else null.
            o.insert("draft".into(), st.draft.as_ref().map_or(serde_json::Value::Null, DraftModel::stats));
            // WebGPU's hybrid placement: expert uses computed on the CPU threads and on the
            // GPU, and the costs (ms per expert) "auto" weighs; null on the CPU backend.
            o.insert(
                "hybrid".into(),
                self.backend.hybrid().map_or(serde_json::Value::Null, |(m, h)| {
                    serde_json::json!({"mode": m.name(), "cpuExperts": h.cpu_experts, "gpuExperts": h.gpu_experts,
                    "cpuMs": h.cpu_ms, "cpuPositionMs": h.cpu_position_ms, "uploadMs": h.upload_ms, "gpuMs": h.gpu_ms})
                }),
            );
        }
        Ok(out.to_string())
    }
}
