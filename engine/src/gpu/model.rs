//! [`GpuModel`]: a [`Model`] whose dense weights live in GPU buffers, its sessions (the
//! KV cache and recurrent states on the GPU) and its expert pool. The forward pass is
//! the graph's (`model::graph`), which the GPU backend (`gpu::backend`)
//! records with each CPU kernel's WGSL twin.

use std::borrow::Borrow;
use std::sync::{Arc, Mutex};

use super::buffers::GpuMat;
use super::deltanet::GpuDeltaState;
use super::ops;
use super::placement::{Hybrid, HybridStats, Placement};
use super::pool::{ExpertPool, GpuExpert, PoolStats};
use super::recorder::Recorder;
use super::stream::{DenseStream, Uploader};
use super::weights::{self, DenseWeights, ExpertBiases, GpuAttn, GpuFfn, GpuLayer, GpuRouter};
use super::GpuContext;
use crate::error::{Error, Result};
use crate::experts::LookaheadStats;
use crate::model::config::Activation;
use crate::model::snapshots::Snapshots;
use crate::model::{Ffn, Model};

/// Settings of the GPU backend.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Bytes of GPU memory for routed experts. Default: four times the adapter's
    /// maxBufferSize (1 GiB at WebGPU's default limits), at most 2 GiB.
    pub expert_pool_bytes: Option<u64>,
    /// Router lookahead: after layer L's experts are queued on the GPU, layer L+1's
    /// router applied to layer L's FFN input names the experts each position will
    /// likely need next (this many per position; 0 = off), and the expert source
    /// fetches those missing from the pool while the GPU computes. Outputs never
    /// depend on it.
    pub lookahead: usize,
    /// Hybrid expert placement (gpu/hybrid.rs): whether experts missing from the pool may
    /// run on the CPU while the GPU computes. Outputs never depend on it.
    pub hybrid: Hybrid,
    /// Milliseconds from any fixed origin, for `Hybrid::Auto`'s timings (default: the
    /// process clock natively, none on wasm32, where the caller passes
    /// `performance.now`).
    pub clock: Option<fn() -> f64>,
}

/// The process clock in milliseconds (native default of [`GpuOptions::clock`]).
#[cfg(not(target_arch = "wasm32"))]
fn process_ms() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64() * 1e3
}

/// The biases of routed expert `e` of a layer (rows e of [`ExpertBiases`]).
#[derive(Clone, Copy)]
pub(super) struct FfnBias<'a> {
    pub(super) b: &'a ExpertBiases,
    pub(super) e: usize,
}

/// A model whose dense weights live in GPU buffers. `M` is how the CPU model is held:
/// `&Model` natively, `Rc<Model>` where the GPU model must own it (the browser engine).
pub struct GpuModel<M: Borrow<Model>> {
    pub model: M,
    pub ctx: Arc<GpuContext>,
    pub(super) embed: GpuMat,
    pub(super) lm_head: GpuMat,
    pub(super) final_norm: wgpu::Buffer,
    pub(super) layers: Vec<GpuLayer>,
    /// DeepSeek-V4's layers and MoE parts.
    pub(super) v4: Option<super::weights::GpuV4>,
    /// GPU bytes of the dense weights.
    dense_bytes: u64,
    pub(super) pool: Mutex<ExpertPool>,
    /// Largest intermediate size of any FFN (sizes the expert scratch buffers).
    pub(super) max_inter: usize,
    lookahead: usize,
    pub(super) ahead_stats: Mutex<LookaheadStats>,
    pub(super) placement: Placement,
}

/// The KV cache (on the GPU) and token history of one conversation.
pub struct GpuSession {
    /// Every token fed so far, in order. After a truncation that a recurrent state could
    /// not follow exactly, the last of them are not in the state yet: the next forward
    /// pass feeds them again first (as `Session` does on the CPU).
    pub tokens: Vec<u32>,
    /// Per layer: (keys, values), each (kv_cap, kv_dim).
    pub(super) kv: Vec<(wgpu::Buffer, wgpu::Buffer)>,
    pub(super) kv_cap: usize,
    /// Per layer: a linear-attention layer's recurrent state (None for attention layers).
    pub(super) recurrent: Vec<Option<GpuDeltaState>>,
    /// DeepSeek-V4's per-layer state, holding the effect of the first `v4_pos` tokens.
    pub(super) v4: Vec<super::v4_attn::GpuV4Layer>,
    pub(super) v4_pos: usize,
    /// DeepSeek-V4's state where the last multi-token passes began or where one ended (as
    /// the CPU's `V4State` keeps them).
    pub(super) v4_snapshots: Snapshots<Vec<super::v4_attn::GpuV4Snapshot>>,
    ctx: Arc<GpuContext>,
}

impl GpuSession {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Forget everything after the first `len` tokens (later positions are overwritten).
    /// A recurrent state may only go back to a snapshot (see `Session::truncate`); then
    /// the next forward pass recomputes the tokens between, which gives the same bits.
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        // DeepSeek-V4's compressed state goes back to its latest snapshot at or before
        // `len`, else restarts (the next pass feeds the tokens after it again), as on the CPU.
        if self.v4_pos > len {
            self.v4_pos = match self.v4_snapshots.back_to(len) {
                Some((p, layers)) => {
                    for (l, s) in self.v4.iter_mut().zip(layers) {
                        l.restore(&self.ctx, s);
                    }
                    *p
                }
                None => 0,
            };
        }
        for st in self.recurrent.iter_mut().flatten() {
            st.rewind(&self.ctx, len);
        }
        let held = self.cached_len();
        if held < self.tokens.len() {
            for st in self.recurrent.iter_mut().flatten() {
                st.rewind(&self.ctx, held);
            }
        }
    }

    /// Tokens whose effect the caches hold: all of `tokens` but after a truncation that a
    /// recurrent state could not follow exactly.
    pub fn cached_len(&self) -> usize {
        if !self.v4.is_empty() {
            return self.v4_pos.min(self.tokens.len());
        }
        self.recurrent.iter().flatten().map(|st| st.pos).fold(self.tokens.len(), usize::min)
    }

    /// Bytes held: the cache buffers (their whole capacity), the recurrent states with
    /// their snapshots, and the ids.
    pub fn bytes(&self) -> usize {
        4 * self.tokens.len()
            + self.kv.iter().map(|(k, v)| (k.size() + v.size()) as usize).sum::<usize>()
            + self.recurrent.iter().flatten().map(GpuDeltaState::bytes).sum::<usize>()
            + self.v4.iter().map(super::v4_attn::GpuV4Layer::bytes).sum::<usize>()
            + self.snapshot_bytes()
    }

    /// Bytes of the recurrent states' snapshots (part of [`GpuSession::bytes`]), as
    /// `Session::snapshot_bytes`.
    pub fn snapshot_bytes(&self) -> usize {
        self.recurrent.iter().flatten().map(GpuDeltaState::snapshot_bytes).sum::<usize>()
            + self.v4_snapshots.iter().flat_map(|s| &s.1).map(super::v4_attn::GpuV4Snapshot::bytes).sum::<usize>()
    }

    /// Keeps the recurrent states' snapshot after `pos` positions, as
    /// `Session::pin_snapshot`.
    pub fn pin_snapshot(&mut self, pos: usize) {
        self.v4_snapshots.pin(pos);
        for st in self.recurrent.iter_mut().flatten() {
            st.pin(pos);
        }
    }

    /// Whether the coming pass belongs to the decode (its snapshot transient), as
    /// `Session::verifying`.
    pub(super) fn verifying(&mut self, v: bool) {
        self.v4_snapshots.verifying(v);
        for st in self.recurrent.iter_mut().flatten() {
            st.verifying(v);
        }
    }
}

impl crate::generate::Context for GpuSession {
    fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn truncate(&mut self, len: usize) {
        GpuSession::truncate(self, len)
    }

    /// A DeepSeek-V4 or Gated DeltaNet state goes back to its latest snapshot at or before
    /// `len` (the ids after it are fed again), so that is what is kept.
    fn keepable(&self, len: usize) -> usize {
        if !self.v4.is_empty() && self.v4_pos > len {
            return self.v4_snapshots.point(self.v4_pos, len);
        }
        self.recurrent.iter().flatten().map(|st| st.rewind_point(len)).fold(len, usize::min)
    }

    fn bytes(&self) -> usize {
        GpuSession::bytes(self)
    }

    fn pin_snapshot(&mut self, pos: usize) {
        GpuSession::pin_snapshot(self, pos)
    }
}

impl<M: Borrow<Model>> GpuModel<M> {
    /// Uploads the dense weights (embedding, attention, norms, routers, shared experts,
    /// dense MLPs, lm_head) from memory. Routed experts are uploaded when first routed to.
    pub fn new(model: M, ctx: Arc<GpuContext>, opts: GpuOptions) -> Result<Self> {
        let dense = weights::upload(model.borrow(), &Uploader::new(&ctx, None))?;
        Ok(Self::with_weights(model, ctx, opts, dense))
    }

    /// [`GpuModel::new`] for a model whose weight matrices are placeholders
    /// ([`Container::load_elsewhere`](crate::model::open::Container::load_elsewhere)):
    /// they are streamed from `stream` into their buffers in bounded chunks, each dense
    /// tensor checked against its checksum, so they are never whole in memory.
    pub fn new_streamed(model: M, ctx: Arc<GpuContext>, opts: GpuOptions, stream: &DenseStream) -> Result<Self> {
        let dense = weights::upload(model.borrow(), &Uploader::new(&ctx, Some(stream)))?;
        stream.finish()?;
        Ok(Self::with_weights(model, ctx, opts, dense))
    }

    fn with_weights(model: M, ctx: Arc<GpuContext>, opts: GpuOptions, dense: DenseWeights) -> Self {
        let budget =
            opts.expert_pool_bytes.unwrap_or_else(|| ctx.limits.max_buffer_size.saturating_mul(4).min(2 << 30));
        let DenseWeights { embed, lm_head, final_norm, layers, v4, max_inter, bytes } = dense;
        GpuModel {
            model,
            embed,
            lm_head,
            final_norm,
            layers,
            v4,
            dense_bytes: bytes,
            pool: Mutex::new(ExpertPool::new(budget)),
            max_inter,
            lookahead: opts.lookahead,
            ahead_stats: Mutex::default(),
            placement: Placement {
                mode: opts.hybrid,
                #[cfg(not(target_arch = "wasm32"))]
                clock: opts.clock.or(Some(process_ms)),
                #[cfg(target_arch = "wasm32")]
                clock: opts.clock,
                stats: Mutex::default(),
                placed: Mutex::default(),
            },
            ctx,
        }
    }

    /// GPU bytes of the dense weights.
    pub fn dense_bytes(&self) -> u64 {
        self.dense_bytes
    }

    /// The CPU model this GPU model mirrors.
    pub fn m(&self) -> &Model {
        self.model.borrow()
    }

    pub fn new_session(&self) -> GpuSession {
        GpuSession {
            tokens: Vec::new(),
            kv: Vec::new(),
            kv_cap: 0,
            recurrent: Vec::new(),
            v4: Vec::new(),
            v4_pos: 0,
            v4_snapshots: Snapshots::default(),
            ctx: self.ctx.clone(),
        }
    }

    pub fn pool_stats(&self) -> PoolStats {
        self.pool.lock().map(|p| p.stats()).unwrap_or_default()
    }

    /// Where the routed experts ran (hybrid placement) and the costs measured.
    pub fn hybrid_stats(&self) -> HybridStats {
        self.placement.stats.lock().map(|s| *s).unwrap_or_default()
    }

    pub fn hybrid(&self) -> Hybrid {
        self.placement.mode
    }

    pub fn lookahead_stats(&self) -> LookaheadStats {
        self.ahead_stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Layer `l + 1`'s router (GPU weights and routing settings) if the lookahead is on
    /// and that layer routes by its router: a MoE layer, or DeepSeek-V4's learned-router
    /// layers (its hash layers' experts are known and read ahead when the pass begins).
    pub(super) fn next_router(&self, l: usize) -> Option<(&GpuRouter, crate::model::config::RouterConfig)> {
        if self.lookahead == 0 {
            return None;
        }
        let (router, mut cfg) = match (&self.v4, self.m().layers.get(l + 1).map(|x| &x.ffn), self.layers.get(l + 1)) {
            (Some(v4), ..) => {
                v4.w.layers.get(l + 1).filter(|x| x.tid2eid.is_none())?;
                (&v4.moe.get(l + 1)?.router, self.m().cfg.router.clone())
            }
            (None, Some(Ffn::Moe(block)), Some(GpuLayer { ffn: GpuFfn::Moe(moe), .. })) => {
                (&moe.router, block.cfg.clone())
            }
            _ => return None,
        };
        // Group-limited routing has topk_group groups' experts to choose from.
        let grouped = cfg.n_group > 1 && cfg.topk_group < cfg.n_group;
        let candidates = if grouped { cfg.topk_group * (cfg.n_experts / cfg.n_group) } else { cfg.n_experts };
        cfg.top_k = self.lookahead.min(candidates).max(1);
        Some((router, cfg))
    }

    /// Re-pins the GPU pool by learned usage `counts` (a quarter of the pool, at turn
    /// ends, with the RAM tier's hysteresis): pinned experts are never evicted. `size`
    /// gives an expert's bytes. Returns how many moved.
    pub fn repin(
        &self,
        counts: &crate::experts::usage::ExpertUsage,
        size: &dyn Fn((usize, usize)) -> u64,
    ) -> Result<usize> {
        let mut pool = self.pool.lock().map_err(|_| Error::Gpu("expert pool poisoned".into()))?;
        let budget = pool.stats().budget / 4;
        pool.repin(&self.ctx, counts, budget, size, &|(l, e)| self.m().experts.expert(l, e))
    }

    /// (layer, expert) of every routed expert resident in the GPU pool.
    pub fn pooled(&self) -> Vec<(usize, usize)> {
        self.pool.lock().map(|p| p.keys()).unwrap_or_default()
    }

    /// Makes the session's KV cache hold `total` positions, keeping the first `keep`.
    pub(super) fn ensure_kv(&self, rec: &mut Recorder, s: &mut GpuSession, keep: usize, total: usize) -> Result<()> {
        let c = &self.m().cfg;
        if s.kv.len() == c.n_layers && total <= s.kv_cap {
            return Ok(());
        }
        let cap = kv_capacity(total, c.max_positions);
        let ctx = rec.ctx();
        let mut kv = Vec::with_capacity(c.n_layers);
        for (l, layer) in self.layers.iter().enumerate() {
            // Floats per position: GQA keys and values; MLA [latent, rotary key] (no values).
            let (kw, vw) = match (&layer.attn, &c.mla) {
                (GpuAttn::Mla(_), Some(m)) => (m.cache_width(), 0),
                (GpuAttn::Linear(_), _) => (0, 0),
                _ => (c.kv_dim(), c.kv_dim()),
            };
            let bytes = |w: usize| (cap * w).max(1) as u64 * 4;
            let (k, v) = (ctx.storage_buffer("k_cache", bytes(kw))?, ctx.storage_buffer("v_cache", bytes(vw))?);
            if let Some((ok, ov)) = s.kv.get(l) {
                let kept = keep.min(s.kv_cap) as u64 * 4;
                rec.copy(ok, 0, &k, 0, (kept * kw as u64).min(ok.size()));
                rec.copy(ov, 0, &v, 0, (kept * vw as u64).min(ov.size()));
            }
            kv.push((k, v));
        }
        s.kv = kv;
        s.kv_cap = cap;
        Ok(())
    }
}

/// Positions a session's KV buffers are made for when they must hold `total`: the next
/// power of two (at least 16, at most the model's context, never less than `total`).
pub(super) fn kv_capacity(total: usize, max_positions: usize) -> usize {
    total.next_power_of_two().max(16).min(max_positions).max(total)
}

/// `out = down(act(gate x, up x))` for m positions of `x`, with the expert's biases
/// added after each product when it has them (kernels::swiglu_many).
#[allow(clippy::too_many_arguments)]
pub(super) fn swiglu_ffn(
    rec: &mut Recorder,
    e: &GpuExpert,
    x: &wgpu::Buffer,
    m: usize,
    g: &wgpu::Buffer,
    u: &wgpu::Buffer,
    out: &wgpu::Buffer,
    act: Activation,
    bias: Option<FfnBias>,
) -> Result<()> {
    let (inter, hidden) = (e.gate.rows, e.down.rows);
    ops::matmul(rec, &e.gate, x, 0, m, g, 0, inter)?;
    ops::matmul(rec, &e.up, x, 0, m, u, 0, inter)?;
    if let Some(FfnBias { b, e }) = bias {
        ops::add(rec, g, 0, &b.gate, e * inter, m * inter, inter)?;
        ops::add(rec, u, 0, &b.up, e * inter, m * inter, inter)?;
    }
    ops::swiglu(rec, g, u, m * inter, act)?;
    ops::matmul(rec, &e.down, g, 0, m, out, 0, hidden)?;
    if let Some(FfnBias { b, e }) = bias {
        ops::add(rec, out, 0, &b.down, e * hidden, m * hidden, hidden)?;
    }
    Ok(())
}
