//! The browser engine's compute backends: the engine's CPU path compiled to wasm, or its
//! wgpu path on the browser's WebGPU. Both run `colibri_engine`'s one forward pass (the
//! GPU path mirrors it kernel for kernel), so they produce the same tokens; `auto`
//! measures both on this machine and keeps the faster.

use std::rc::Rc;

use colibri_engine::experts::usage::ExpertUsage;
use colibri_engine::experts::LookaheadStats;
use colibri_engine::format::manifest::Manifest;
use colibri_engine::format::ReadAt;
use colibri_engine::generate::HiddenLog;
use colibri_engine::gpu::pool::PoolStats;
use colibri_engine::gpu::stream::DenseStream;
use colibri_engine::gpu::{ExpertPlacement, GpuContext, GpuModel, GpuOptions, GpuSession, Hybrid, HybridStats};
use colibri_engine::{Logits, Model, Result, Session};

use crate::browser_source::BrowserSource;
use crate::net::now_ms;

/// Which backend the page asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Auto,
    WebGpu,
    Cpu,
}

impl Want {
    pub fn parse(s: Option<&str>) -> std::result::Result<Want, String> {
        match s.unwrap_or("auto") {
            "auto" => Ok(Want::Auto),
            "webgpu" => Ok(Want::WebGpu),
            "cpu" => Ok(Want::Cpu),
            other => Err(format!("unknown backend {other:?} (auto, webgpu or cpu)")),
        }
    }
}

#[derive(Clone)]
pub enum Backend {
    Cpu,
    Gpu(Rc<GpuModel<Rc<Model>>>),
}

/// One conversation's context on a backend.
pub enum Context {
    Cpu(Session),
    Gpu(GpuSession),
}

impl Context {
    pub fn tokens(&self) -> &[u32] {
        match self {
            Context::Cpu(s) => &s.tokens,
            Context::Gpu(s) => &s.tokens,
        }
    }

    /// Bytes of the recurrent states' snapshots (part of the context's bytes).
    pub fn snapshot_bytes(&self) -> usize {
        match self {
            Context::Cpu(s) => s.snapshot_bytes(),
            Context::Gpu(s) => s.snapshot_bytes(),
        }
    }

    /// Forgets everything after the first `len` tokens (a rollback or a new prompt that
    /// shares a prefix with the previous one).
    pub fn truncate(&mut self, len: usize) {
        match self {
            Context::Cpu(s) => s.truncate(len),
            Context::Gpu(s) => s.truncate(len),
        }
    }
}

impl colibri_engine::generate::Context for Context {
    fn tokens(&self) -> &[u32] {
        Context::tokens(self)
    }

    fn truncate(&mut self, len: usize) {
        Context::truncate(self, len)
    }

    /// The session's: a recurrent state (Gated DeltaNet, DeepSeek-V4) goes back only to a
    /// snapshot, so a prompt keeps no more than that (and `stats().cachedTokens` says so).
    fn keepable(&self, len: usize) -> usize {
        match self {
            Context::Cpu(s) => colibri_engine::generate::Context::keepable(s, len),
            Context::Gpu(s) => colibri_engine::generate::Context::keepable(s, len),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Context::Cpu(s) => s.bytes(),
            Context::Gpu(s) => s.bytes(),
        }
    }

    fn pin_snapshot(&mut self, pos: usize) {
        match self {
            Context::Cpu(s) => s.pin_snapshot(pos),
            Context::Gpu(s) => s.pin_snapshot(pos),
        }
    }
}

/// What `auto` measured: one decode step on each backend, in milliseconds.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoChoice {
    pub webgpu_ms: f64,
    pub cpu_ms: f64,
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Gpu(_) => "webgpu",
        }
    }

    pub fn adapter(&self) -> Option<String> {
        match self {
            Backend::Cpu => None,
            Backend::Gpu(g) => Some(g.ctx.adapter_name.clone()),
        }
    }

    /// Whether the WebGPU integer matmuls use dot4I8Packed (None on the CPU backend).
    pub fn dp4a(&self) -> Option<bool> {
        match self {
            Backend::Cpu => None,
            Backend::Gpu(g) => Some(g.ctx.dp4a()),
        }
    }

    pub fn new_context(&self, model: &Model) -> Context {
        match self {
            Backend::Cpu => Context::Cpu(model.new_session()),
            Backend::Gpu(g) => Context::Gpu(g.new_session()),
        }
    }

    /// Feeds `ids` after what `cx` holds; `on_use(layer, expert, positions)` per routed
    /// expert; with `log`, records the hidden states for MTP drafts (CPU backend only).
    pub async fn forward(
        &self,
        model: &Model,
        cx: &mut Context,
        ids: &[u32],
        which: Logits,
        on_use: &mut dyn FnMut(usize, usize, usize),
        log: Option<&HiddenLog>,
    ) -> Result<Vec<f32>> {
        match (self, cx, log) {
            (Backend::Cpu, Context::Cpu(s), None) => model.forward_with(s, ids, which, on_use),
            (Backend::Cpu, Context::Cpu(s), Some(log)) => {
                let keep = s.tokens.len();
                let (logits, hidden) = model.forward_hidden_with(s, ids, which, on_use)?;
                log.record(keep, model.cfg.hidden, &hidden);
                Ok(logits)
            }
            (Backend::Gpu(g), Context::Gpu(s), None) => g.forward_with(s, ids, which, on_use).await,
            (Backend::Gpu(_), _, Some(_)) => {
                Err(colibri_engine::Error::Invalid("MTP drafts run on the cpu backend".into()))
            }
            _ => Err(colibri_engine::Error::Gpu("a context of one backend was fed to the other".into())),
        }
    }

    /// [`Backend::forward`] over the browser tiers: a step that stopped because experts
    /// stored in IndexedDB must be read asynchronously is rolled back, the reads are
    /// awaited, and the step runs again (each retry gets at least one layer further).
    /// Expert uses are reported once, from the attempt that succeeded.
    #[allow(clippy::too_many_arguments)]
    pub async fn forward_tiered(
        &self,
        model: &Model,
        tiers: &BrowserSource,
        cx: &mut Context,
        ids: &[u32],
        which: Logits,
        on_use: &mut dyn FnMut(usize, usize, usize),
        log: Option<&HiddenLog>,
    ) -> Result<Vec<f32>> {
        let before = cx.tokens().len();
        let mut attempts = 0;
        loop {
            let mut uses = Vec::new();
            match self.forward(model, cx, ids, which, &mut |l, e, n| uses.push((l, e, n)), log).await {
                Ok(v) => {
                    for (l, e, n) in uses {
                        on_use(l, e, n);
                    }
                    return Ok(v);
                }
                Err(e) => {
                    cx.truncate(before);
                    attempts += 1;
                    if !tiers.has_pending() || attempts > model.cfg.n_layers + 1 {
                        return Err(e);
                    }
                    tiers.load_pending().await?;
                }
            }
        }
    }

    /// Hits of the GPU expert pool (0 on the CPU backend).
    pub fn gpu_hits(&self) -> u64 {
        match self {
            Backend::Cpu => 0,
            Backend::Gpu(g) => g.pool_stats().hits,
        }
    }

    /// The router lookahead's record (GPU backend only: the CPU backend in a worker
    /// cannot fetch while it computes, so it does not guess ahead).
    pub fn lookahead(&self) -> Option<LookaheadStats> {
        match self {
            Backend::Cpu => None,
            Backend::Gpu(g) => Some(g.lookahead_stats()),
        }
    }

    /// Re-pins the GPU pool by learned usage (nothing on the CPU backend); `size` gives an
    /// expert's bytes. Returns how many moved.
    pub fn repin(&self, counts: &ExpertUsage, size: &dyn Fn((usize, usize)) -> u64) -> Result<usize> {
        match self {
            Backend::Cpu => Ok(0),
            Backend::Gpu(g) => g.repin(counts, size),
        }
    }

    /// Where the routed experts ran, and the placement mode (None on the CPU backend).
    pub fn hybrid(&self) -> Option<(Hybrid, HybridStats)> {
        match self {
            Backend::Cpu => None,
            Backend::Gpu(g) => Some((g.hybrid(), g.hybrid_stats())),
        }
    }

    /// Where the routed experts ran since the last call, per (layer, expert): uses on the
    /// CPU threads and on the GPU (None on the CPU backend, where all run on the CPU).
    pub fn take_placement(&self) -> Result<Option<Vec<ExpertPlacement>>> {
        match self {
            Backend::Cpu => Ok(None),
            Backend::Gpu(g) => g.take_placement().map(Some),
        }
    }

    /// GPU bytes of the dense weights (None on the CPU backend).
    pub fn dense_gpu_bytes(&self) -> Option<u64> {
        match self {
            Backend::Cpu => None,
            Backend::Gpu(g) => Some(g.dense_bytes()),
        }
    }

    /// The GPU pool's counters (None on the CPU backend).
    pub fn pool_stats(&self) -> Option<PoolStats> {
        match self {
            Backend::Cpu => None,
            Backend::Gpu(g) => Some(g.pool_stats()),
        }
    }

    /// (layer, expert) of the experts in the GPU pool.
    pub fn pooled(&self) -> Vec<(usize, usize)> {
        match self {
            Backend::Cpu => Vec::new(),
            Backend::Gpu(g) => g.pooled(),
        }
    }
}

/// The GPU model's settings: the router lookahead (top-k per position), hybrid expert
/// placement as asked, timed by the worker's `performance.now()`; `pool`: the expert
/// pool's bytes (None: the engine's default).
fn gpu_options(model: &Model, hybrid: Hybrid, pool: Option<u64>) -> GpuOptions {
    GpuOptions { lookahead: model.cfg.router.top_k, hybrid, clock: Some(now_ms), expert_pool_bytes: pool }
}

/// Opens WebGPU and uploads the dense weights. The router lookahead prefetches top-k
/// experts per position for the next layer while the GPU computes the current one.
pub async fn open_gpu(model: Rc<Model>, hybrid: Hybrid, pool: Option<u64>) -> Result<Backend> {
    let ctx = GpuContext::new().await?;
    let opts = gpu_options(&model, hybrid, pool);
    Ok(Backend::Gpu(Rc::new(GpuModel::new(model, std::sync::Arc::new(ctx), opts)?)))
}

/// Opens WebGPU and streams the dense weights of `model` (placeholders:
/// `Container::load_elsewhere`) from the data file into GPU buffers, a bounded chunk at a
/// time read with `read` (`on_read(bytes so far)` after each), so that wasm memory never
/// holds them whole; `origin` names the file in errors.
pub async fn open_gpu_streamed(
    model: Rc<Model>,
    m: &Manifest,
    read: ReadAt<'_>,
    on_read: &dyn Fn(u64),
    origin: &str,
    hybrid: Hybrid,
    pool: Option<u64>,
) -> Result<Backend> {
    let ctx = GpuContext::new().await?;
    let opts = gpu_options(&model, hybrid, pool);
    let stream = DenseStream::new(m, read, origin).on_read(on_read);
    Ok(Backend::Gpu(Rc::new(GpuModel::new_streamed(model, std::sync::Arc::new(ctx), opts, &stream)?)))
}

/// Times one decode step after a one-token prompt on `b`, best of three (the prompt's
/// step also compiles pipelines and fetches the experts it routes to: not timed).
async fn time_step(b: &Backend, model: &Model, tiers: &BrowserSource, probe: [u32; 2]) -> Result<f64> {
    let mut cx = b.new_context(model);
    b.forward_tiered(model, tiers, &mut cx, &probe[..1], Logits::Last, &mut |_, _, _| {}, None).await?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        cx.truncate(1);
        let t0 = now_ms();
        b.forward_tiered(model, tiers, &mut cx, &probe[1..], Logits::Last, &mut |_, _, _| {}, None).await?;
        best = best.min(now_ms() - t0);
    }
    Ok(best)
}

/// `auto`: the faster of WebGPU and the CPU on this machine, measured.
pub async fn choose(
    gpu: Backend,
    model: &Model,
    tiers: &BrowserSource,
    probe: [u32; 2],
) -> Result<(Backend, AutoChoice)> {
    let webgpu_ms = time_step(&gpu, model, tiers, probe).await?;
    let cpu_ms = time_step(&Backend::Cpu, model, tiers, probe).await?;
    let choice = AutoChoice { webgpu_ms, cpu_ms };
    Ok((if webgpu_ms <= cpu_ms { gpu } else { Backend::Cpu }, choice))
}
