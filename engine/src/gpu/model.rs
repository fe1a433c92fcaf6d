//! [`GpuModel`]: the forward pass of [`Model`] on the GPU, step for step the same as
//! `Model::forward_with` (model.rs), attention::attention and MoeBlock::forward, with
//! each CPU kernel replaced by its WGSL twin from [`super::ops`].
//!
//! Per MoE layer the router logits are routed on the GPU by route.wgsl (moe::route's
//! arithmetic and order for every scoring rule, bit for bit) and the choices read back, because the host must
//! fetch and upload missing experts; the selected experts then run on the GPU in
//! ascending index order, as the CPU adds them.

use std::borrow::Borrow;
use std::sync::{Arc, Mutex};

use super::buffers::{f32s, GpuMat};
use super::deltanet::{DeltaScratch, GpuDeltaState};
use super::hybrid::{Hybrid, HybridStats, MoeScratch, Placement};
use super::mla::MlaScratch;
use super::ops::{self, AttnShape, GateAct};
use super::pool::{ExpertPool, GpuExpert, PoolStats};
use super::recorder::Recorder;
use super::stream::{DenseStream, Uploader};
use super::weights::{self, DenseWeights, ExpertBiases, GpuAttn, GpuFfn, GpuLayer, GpuRouter};
use super::GpuContext;
use crate::error::{Error, Result};
use crate::experts::LookaheadStats;
use crate::model::config::Activation;
use crate::model::{Ffn, Logits, Model};

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
    embed: GpuMat,
    lm_head: GpuMat,
    final_norm: wgpu::Buffer,
    layers: Vec<GpuLayer>,
    /// GPU bytes of the dense weights.
    dense_bytes: u64,
    pub(super) pool: Mutex<ExpertPool>,
    /// Largest intermediate size of any FFN (sizes the expert scratch buffers).
    max_inter: usize,
    lookahead: usize,
    ahead_stats: Mutex<LookaheadStats>,
    pub(super) placement: Placement,
}

/// The KV cache (on the GPU) and token history of one conversation.
pub struct GpuSession {
    /// Every token fed so far, in order. After a truncation that a recurrent state could
    /// not follow exactly, the last of them are not in the state yet: the next forward
    /// pass feeds them again first (as `Session` does on the CPU).
    pub tokens: Vec<u32>,
    /// Per layer: (keys, values), each (kv_cap, kv_dim).
    kv: Vec<(wgpu::Buffer, wgpu::Buffer)>,
    kv_cap: usize,
    /// Per layer: a linear-attention layer's recurrent state (None for attention layers).
    recurrent: Vec<Option<GpuDeltaState>>,
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
        self.recurrent.iter().flatten().map(|st| st.pos).fold(self.tokens.len(), usize::min)
    }

    /// Bytes held: the cache buffers (their whole capacity), the recurrent states and the ids.
    pub fn bytes(&self) -> usize {
        4 * self.tokens.len()
            + self.kv.iter().map(|(k, v)| (k.size() + v.size()) as usize).sum::<usize>()
            + self.recurrent.iter().flatten().map(GpuDeltaState::bytes).sum::<usize>()
    }
}

impl crate::generate::Context for GpuSession {
    fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn truncate(&mut self, len: usize) {
        GpuSession::truncate(self, len)
    }

    fn bytes(&self) -> usize {
        GpuSession::bytes(self)
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
        let DenseWeights { embed, lm_head, final_norm, layers, max_inter, bytes } = dense;
        GpuModel {
            model,
            embed,
            lm_head,
            final_norm,
            layers,
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
        GpuSession { tokens: Vec::new(), kv: Vec::new(), kv_cap: 0, recurrent: Vec::new(), ctx: self.ctx.clone() }
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

    /// Layer `l + 1`'s router (GPU weights and routing settings) if that layer is MoE
    /// and the lookahead is on.
    fn next_router(&self, l: usize) -> Option<(&GpuRouter, crate::model::config::RouterConfig)> {
        if self.lookahead == 0 {
            return None;
        }
        match (self.m().layers.get(l + 1).map(|x| &x.ffn), self.layers.get(l + 1).map(|x| &x.ffn)) {
            (Some(Ffn::Moe(block)), Some(GpuFfn::Moe(moe))) => {
                let mut cfg = block.cfg.clone();
                // Group-limited routing has topk_group groups' experts to choose from.
                let grouped = cfg.n_group > 1 && cfg.topk_group < cfg.n_group;
                let candidates = if grouped { cfg.topk_group * (cfg.n_experts / cfg.n_group) } else { cfg.n_experts };
                cfg.top_k = self.lookahead.min(candidates).max(1);
                Some((&moe.router, cfg))
            }
            _ => None,
        }
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

    /// Feeds `ids` after what `session` holds and returns logits, (n, vocab) for
    /// `Logits::All` or (vocab) for `Logits::Last`, like `Model::forward`.
    pub async fn forward(&self, session: &mut GpuSession, ids: &[u32], which: Logits) -> Result<Vec<f32>> {
        self.forward_with(session, ids, which, &mut |_, _, _| {}).await
    }

    /// Native convenience: [`GpuModel::forward`] run to completion.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_blocking(&self, session: &mut GpuSession, ids: &[u32], which: Logits) -> Result<Vec<f32>> {
        pollster::block_on(self.forward(session, ids, which))
    }

    /// [`GpuModel::forward`], reporting every routed expert use as (layer, expert, positions).
    pub async fn forward_with(
        &self,
        session: &mut GpuSession,
        ids: &[u32],
        which: Logits,
        on_use: &mut dyn FnMut(usize, usize, usize),
    ) -> Result<Vec<f32>> {
        let c = &self.m().cfg;
        let held = session.cached_len();
        if held < session.tokens.len() {
            // A recurrent state went back further than the session's tokens: feed the
            // tokens in between again, with these, and return these ones' logits
            // (Model::forward_observed).
            c.check_input(ids, session.tokens.len())?;
            let again = session.tokens.len() - held;
            let all: Vec<u32> = session.tokens[held..].iter().chain(ids).copied().collect();
            session.tokens.truncate(held);
            return match self.forward_fed(session, &all, which, on_use).await {
                Ok(logits) if which == Logits::All => Ok(logits[again * c.vocab..].to_vec()),
                Ok(logits) => Ok(logits),
                Err(e) => {
                    session.truncate(held);
                    Err(e)
                }
            };
        }
        self.forward_fed(session, ids, which, on_use).await
    }

    /// [`GpuModel::forward_with`] on a session whose caches hold all its tokens.
    async fn forward_fed(
        &self,
        session: &mut GpuSession,
        ids: &[u32],
        which: Logits,
        on_use: &mut dyn FnMut(usize, usize, usize),
    ) -> Result<Vec<f32>> {
        let c = &self.m().cfg;
        let ctx = &*self.ctx;
        let (n, h, qd, kvd, hd) = (ids.len(), c.hidden, c.q_dim(), c.kv_dim(), c.head_dim);
        let pos0 = session.tokens.len();
        c.check_input(ids, pos0)?;
        let mut rec = Recorder::new(ctx);
        self.ensure_kv(&mut rec, session, pos0, pos0 + n)?;
        if session.recurrent.len() != self.layers.len() {
            session.recurrent = self
                .layers
                .iter()
                .map(|lw| match &lw.attn {
                    GpuAttn::Linear(d) => GpuDeltaState::new(ctx, &d.cfg).map(Some),
                    _ => Ok(None),
                })
                .collect::<Result<_>>()?;
        }
        if n > 1 {
            // As DeltaNetWeights::forward: a multi-token call may be rolled back to here.
            for st in session.recurrent.iter_mut().flatten() {
                st.snapshot(ctx)?;
            }
        }

        let f = 4u64; // bytes per f32
        let buf = |label: &str, elems: usize| ctx.storage_buffer(label, elems as u64 * f);
        let x = buf("x", n * h)?;
        let xn = buf("xn", n * h)?;
        let y = buf("y", n * h)?;
        let q = buf("q", n * qd)?;
        let k = buf("k", n * kvd)?;
        let v = buf("v", n * kvd)?;
        let attn_out = buf("attn_out", n * qd)?;
        let scores = buf("scores", n * c.n_heads * (pos0 + n))?;
        let (xs, ys, sy) = (buf("xs", n * h)?, buf("ys", n * h)?, buf("shared_out", n * h)?);
        let (g, u) = (buf("g", n * self.max_inter)?, buf("u", n * self.max_inter)?);
        let router_logits = buf("router_logits", n * c.router.n_experts)?;
        let probs = buf("router_probs", n * c.router.n_experts)?;
        // (expert, weight bits) per choice; any top-k up to all experts fits.
        let routes = buf("routes", n * c.router.n_experts * 2)?;
        let ahead_routes =
            if self.lookahead > 0 { Some(buf("ahead_routes", n * c.router.n_experts * 2)?) } else { None };
        // Layer -> experts the lookahead predicted for it (checked when it routes).
        let mut predicted: Vec<Option<Vec<usize>>> = vec![None; c.n_layers];
        let shared_gate = buf("shared_gate", n)?;
        let mla_scratch = c.mla.as_ref().map(|m| MlaScratch::new(ctx, m, c.n_heads, n)).transpose()?;
        let delta_scratch = c.linear_attn.as_ref().map(|la| DeltaScratch::new(ctx, la, n)).transpose()?;
        let attn_gate = if c.attn_output_gate { Some(buf("attn_gate", n * qd)?) } else { None };

        let rope = &self.m().rope;
        let half = rope.rotary_dim / 2;
        let mut cs = Vec::with_capacity(n * 2 * half);
        let (mut co, mut si) = (Vec::new(), Vec::new());
        for i in 0..n {
            rope.cos_sin(pos0 + i, &mut co, &mut si);
            cs.extend_from_slice(&co);
            cs.extend_from_slice(&si);
        }
        let mut cs_data = rec.data_f32(&cs);
        let ids_data = rec.data(ids);
        ops::embed(&mut rec, &self.embed, ids_data, n, &x)?;

        for (l, (layer, lw)) in self.m().layers.iter().zip(&self.layers).enumerate() {
            let o = &layer.attn_opts;
            rec.copy(&x, 0, &xn, 0, (n * h) as u64 * f);
            ops::rmsnorm(&mut rec, &xn, 0, n, h, &lw.attn_norm, c.rms_eps)?;
            match &lw.attn {
                GpuAttn::Mla(mla) => {
                    let scratch = mla_scratch.as_ref().ok_or_else(|| Error::Gpu("MLA scratch missing".into()))?;
                    let cache = &session.kv[l].0;
                    mla.forward(&mut rec, scratch, &xn, n, pos0, o, cache, &scores, cs_data.clone(), &y)?;
                }
                GpuAttn::Linear(d) => {
                    let scratch =
                        delta_scratch.as_ref().ok_or_else(|| Error::Gpu("DeltaNet scratch missing".into()))?;
                    let state = session
                        .recurrent
                        .get_mut(l)
                        .and_then(Option::as_mut)
                        .ok_or_else(|| Error::Gpu(format!("layer {l}: recurrent state missing")))?;
                    d.forward(&mut rec, scratch, &xn, n, state, &y)?;
                }
                GpuAttn::Gqa(a) => {
                    ops::matmul(&mut rec, &a.wq, &xn, 0, n, &q, 0, qd)?;
                    let gate = match (&a.gate, &attn_gate) {
                        (Some((wg, bg)), Some(gb)) => {
                            ops::matmul(&mut rec, wg, &xn, 0, n, gb, 0, qd)?;
                            if let Some(b) = bg {
                                ops::add(&mut rec, gb, 0, b, 0, n * qd, qd)?;
                            }
                            Some(gb)
                        }
                        (None, _) => None,
                        (Some(_), None) => return Err(Error::Gpu("attention gate scratch missing".into())),
                    };
                    ops::matmul(&mut rec, &a.wk, &xn, 0, n, &k, 0, kvd)?;
                    ops::matmul(&mut rec, &a.wv, &xn, 0, n, &v, 0, kvd)?;
                    for (t, b, d) in [(&q, &a.bq, qd), (&k, &a.bk, kvd), (&v, &a.bv, kvd)] {
                        if let Some(b) = b {
                            ops::add(&mut rec, t, 0, b, 0, n * d, d)?;
                        }
                    }
                    for (t, norm, d) in [(&q, &a.q_norm, qd), (&k, &a.k_norm, kvd)] {
                        if let Some((w, width)) = norm {
                            ops::rmsnorm(&mut rec, t, 0, n * d / width, *width, w, o.rms_eps)?;
                        }
                    }
                    if let Some(clip) = o.clip_qkv {
                        ops::clamp(&mut rec, &q, n * qd, clip)?;
                        ops::clamp(&mut rec, &k, n * kvd, clip)?;
                        ops::clamp(&mut rec, &v, n * kvd, clip)?;
                    }
                    ops::rope(&mut rec, &q, n, o.n_heads, hd, half, cs_data.clone())?;
                    ops::rope(&mut rec, &k, n, o.n_kv_heads, hd, half, cs_data.clone())?;
                    let (kc, vc) = &session.kv[l];
                    rec.copy(&k, 0, kc, (pos0 * kvd) as u64 * f, (n * kvd) as u64 * f);
                    rec.copy(&v, 0, vc, (pos0 * kvd) as u64 * f, (n * kvd) as u64 * f);
                    let shape = AttnShape {
                        n,
                        n_heads: o.n_heads,
                        n_kv_heads: o.n_kv_heads,
                        head_dim: hd,
                        pos0,
                        window: o.window,
                        scale: o.scale,
                        mla: None,
                    };
                    ops::attention(&mut rec, shape, &q, kc, vc, &scores, &attn_out, a.sinks.as_ref())?;
                    if let Some(gb) = gate {
                        // transformers: attn_output * torch.sigmoid(gate)
                        ops::gate_mul(&mut rec, &attn_out, gb, n * qd, GateAct::Sigmoid)?;
                    }
                    ops::matmul(&mut rec, &a.wo, &attn_out, 0, n, &y, 0, h)?;
                    if let Some(bo) = &a.bo {
                        ops::add(&mut rec, &y, 0, bo, 0, n * h, h)?;
                    }
                }
            }
            ops::add(&mut rec, &x, 0, &y, 0, n * h, n * h)?;

            rec.copy(&x, 0, &xn, 0, (n * h) as u64 * f);
            ops::rmsnorm(&mut rec, &xn, 0, n, h, &lw.ffn_norm, c.rms_eps)?;
            match (&layer.ffn, &lw.ffn) {
                (_, GpuFfn::Dense(mlp)) => swiglu_ffn(&mut rec, mlp, &xn, n, &g, &u, &y, Activation::Silu, None)?,
                (Ffn::Moe(block), GpuFfn::Moe(moe)) => {
                    let router = &moe.router;
                    let ne = router.w.rows;
                    let k = block.cfg.top_k;
                    router.route(&mut rec, &xn, n, &router_logits, &probs, &routes, &block.cfg)?;
                    rec.read(&routes, 0, (n * k * 2) as u64 * f);
                    let next = self.next_router(l);
                    if let (Some((next_router, cfg)), Some(ahead_routes)) = (&next, &ahead_routes) {
                        // router_logits is free again: this layer's routing has consumed it.
                        next_router.route(&mut rec, &xn, n, &router_logits, &probs, ahead_routes, cfg)?;
                        rec.read(ahead_routes, 0, (n * cfg.top_k * 2) as u64 * f);
                    }
                    // Hybrid placement computes some experts on the CPU: it needs the input.
                    let xn_read = (self.placement.mode != Hybrid::Off).then(|| rec.read(&xn, 0, (n * h) as u64 * f));
                    let done = std::mem::replace(&mut rec, Recorder::new(ctx)).submit().await?;
                    cs_data = rec.data_f32(&cs); // the arena went with the old recorder
                    let chosen = ops::routes_from(
                        done.first().ok_or_else(|| Error::Gpu("routes were not read back".into()))?,
                        k,
                    );
                    let users = crate::model::moe::batch_union(&chosen, ne)
                        .map_err(|e| Error::Gpu(format!("layer {l}: {e}")))?;
                    if let Some(guess) = predicted[l].take() {
                        let routed: Vec<usize> = (0..ne).filter(|&e| !users[e].is_empty()).collect();
                        let mut st =
                            self.ahead_stats.lock().map_err(|_| Error::Gpu("lookahead stats poisoned".into()))?;
                        st.routed += routed.len() as u64;
                        st.predicted_hits += routed.iter().filter(|e| guess.contains(e)).count() as u64;
                    }
                    let ahead = match (next, done.get(1)) {
                        (Some((_, cfg)), Some(bytes)) => {
                            let mut guess: Vec<usize> = ops::routes_from(bytes, cfg.top_k)
                                .into_iter()
                                .flat_map(|r| r.experts)
                                .filter(|&e| e < ne)
                                .collect();
                            guess.sort_unstable();
                            guess.dedup();
                            Some(guess)
                        }
                        _ => None,
                    };
                    rec.clear(&y, 0, (n * h) as u64 * f);
                    // Let the source fetch every expert the pool lacks in one request.
                    let missing: Vec<usize> = {
                        let pool = self.pool.lock().map_err(|_| Error::Gpu("expert pool poisoned".into()))?;
                        (0..ne).filter(|&e| !users[e].is_empty() && !pool.contains(l, e)).collect()
                    };
                    if !missing.is_empty() {
                        self.m().experts.prepare(l, &missing)?;
                    }
                    let xn_host = xn_read.and_then(|r| done.get(r.0)).map(|b| f32s(b));
                    let scratch = MoeScratch {
                        xn: &xn,
                        y: &y,
                        xs: &xs,
                        g: &g,
                        u: &u,
                        ys: &ys,
                        sy: &sy,
                        shared_gate: &shared_gate,
                    };
                    let (xh, users) = (xn_host.as_deref(), &users);
                    if self.moe_experts(&mut rec, l, block, moe, users, n, xh, &scratch, on_use).await? {
                        cs_data = rec.data_f32(&cs);
                    }
                    if let Some(guess) = ahead {
                        // Hand this layer's work to the GPU, then fetch the next layer's
                        // likely experts while it computes. A failed prefetch is not an
                        // error: the next layer fetches what it really needs itself.
                        std::mem::replace(&mut rec, Recorder::new(ctx)).submit().await?;
                        cs_data = rec.data_f32(&cs);
                        let missing: Vec<usize> = {
                            let pool = self.pool.lock().map_err(|_| Error::Gpu("expert pool poisoned".into()))?;
                            guess.iter().copied().filter(|&e| !pool.contains(l + 1, e)).collect()
                        };
                        if let Ok(mut st) = self.ahead_stats.lock() {
                            st.predicted += guess.len() as u64;
                            st.prefetched += missing.len() as u64;
                        }
                        let experts = &self.m().experts;
                        if !missing.is_empty() && experts.lookahead_enabled() {
                            // A source with reader threads (native) starts the reads and returns.
                            experts.lookahead(l + 1, &missing);
                        } else if !missing.is_empty() {
                            // Otherwise (the browser) the fetch runs here, while the GPU computes.
                            let _ = experts.prepare(l + 1, &missing);
                        }
                        predicted[l + 1] = Some(guess);
                    }
                }
                (Ffn::Dense(_), GpuFfn::Moe(_)) => {
                    return Err(Error::Gpu(format!("layer {l}: GPU weights do not match the model")))
                }
            }
            ops::add(&mut rec, &x, 0, &y, 0, n * h, n * h)?;
        }

        let (first, rows) = match which {
            Logits::All => (0, n),
            Logits::Last => (n - 1, 1),
        };
        let logits = buf("logits", rows * c.vocab)?;
        rec.copy(&x, (first * h) as u64 * f, &xn, 0, (rows * h) as u64 * f);
        ops::rmsnorm(&mut rec, &xn, 0, rows, h, &self.final_norm, c.rms_eps)?;
        ops::matmul(&mut rec, &self.lm_head, &xn, 0, rows, &logits, 0, c.vocab)?;
        rec.read(&logits, 0, (rows * c.vocab) as u64 * f);
        let done = rec.submit().await?;
        session.tokens.extend_from_slice(ids);
        Ok(f32s(done.first().ok_or_else(|| Error::Gpu("logits were not read back".into()))?))
    }

    /// Makes the session's KV cache hold `total` positions, keeping the first `keep`.
    fn ensure_kv(&self, rec: &mut Recorder, s: &mut GpuSession, keep: usize, total: usize) -> Result<()> {
        let c = &self.m().cfg;
        if s.kv.len() == c.n_layers && total <= s.kv_cap {
            return Ok(());
        }
        let cap = total.next_power_of_two().max(16).min(c.max_positions).max(total);
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
