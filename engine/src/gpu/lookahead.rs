//! The router lookahead on the GPU ([`super::GpuOptions::lookahead`]), for every family's
//! MoE layers (`GpuPass::route`) and DeepSeek-V4's learned-router ones
//! (`GpuPass::v4_moe_gpu`): with a layer's routing, the next layer's router applied to
//! this layer's FFN input names the experts each position will likely need next; they are
//! fetched while the GPU computes this layer's experts, and scored when the next layer
//! routes. Only what is fetched early depends on it, never an output.

use std::borrow::Borrow;

use super::backend::GpuPass;
use super::ops;
use super::recorder::ReadId;
use super::weights::GpuRouter;
use crate::error::{Error, Result};
use crate::model::config::RouterConfig;
use crate::model::graph::Ops;
use crate::model::moe::Routing;
use crate::model::Model;

/// The next layer's router and its settings for the guess (top-k: the lookahead's count).
pub(super) type NextRouter<'a> = Option<(&'a GpuRouter, RouterConfig)>;

impl<'a, M: Borrow<Model>> GpuPass<'a, M> {
    /// Records the next layer's routing of `xn` (n positions) into a scratch buffer and its
    /// read; `logits` and `probs` are free scratch of n x n_experts (this layer's routing
    /// has consumed them: the GPU runs the work in order).
    pub(super) fn route_ahead(
        &mut self,
        next: &NextRouter<'a>,
        xn: &wgpu::Buffer,
        n: usize,
        logits: &wgpu::Buffer,
        probs: &wgpu::Buffer,
    ) -> Result<Option<ReadId>> {
        let Some((router, cfg)) = next else { return Ok(None) };
        let ne = self.gm.m().cfg.router.n_experts;
        let routes = Ops::alloc(self, "ahead_routes", n * ne.max(cfg.top_k) * 2)?;
        router.route(&mut self.rec, xn, n, logits, probs, &routes, cfg)?;
        Ok(Some(self.rec.read(&routes, 0, (n * cfg.top_k * 2) as u64 * 4)))
    }

    /// The experts the next layer's routing read back (`read`, from [`Self::route_ahead`],
    /// among `done`) names, ascending, each once; None without a guess.
    pub(super) fn guess(
        &self,
        next: &NextRouter<'a>,
        read: Option<ReadId>,
        done: &[Vec<u8>],
        ne: usize,
    ) -> Option<Vec<usize>> {
        let (Some((_, cfg)), Some(bytes)) = (next, read.and_then(|r| done.get(r.0))) else { return None };
        let mut guess: Vec<usize> =
            ops::routes_from(bytes, cfg.top_k).into_iter().flat_map(|r| r.experts).filter(|&e| e < ne).collect();
        guess.sort_unstable();
        guess.dedup();
        Some(guess)
    }

    /// Scores layer `l`'s routing `chosen` against the guess made for it (if any).
    pub(super) fn score_guess(&mut self, l: usize, chosen: &[Routing], ne: usize) -> Result<()> {
        let Some(guess) = self.predicted.get_mut(l).and_then(Option::take) else { return Ok(()) };
        let mut routed: Vec<usize> =
            chosen.iter().flat_map(|r| r.experts.iter().copied()).filter(|&e| e < ne).collect();
        routed.sort_unstable();
        routed.dedup();
        let mut st = self.gm.ahead_stats.lock().map_err(|_| Error::Gpu("lookahead stats poisoned".into()))?;
        st.routed += routed.len() as u64;
        st.predicted_hits += routed.iter().filter(|e| guess.contains(e)).count() as u64;
        Ok(())
    }

    /// Hands layer `l`'s work to the GPU, then fetches the experts of `guess` (layer l + 1)
    /// that the pool lacks while it computes, and keeps the guess to score. A failed
    /// prefetch is not an error: the next layer fetches what it really needs itself.
    pub(super) async fn prefetch_guess(&mut self, l: usize, guess: Vec<usize>) -> Result<()> {
        self.submit().await?;
        let gm = self.gm;
        let missing: Vec<usize> = {
            let pool = gm.pool.lock().map_err(|_| Error::Gpu("expert pool poisoned".into()))?;
            guess.iter().copied().filter(|&e| !pool.contains(l + 1, e)).collect()
        };
        if let Ok(mut st) = gm.ahead_stats.lock() {
            st.predicted += guess.len() as u64;
            st.prefetched += missing.len() as u64;
        }
        let experts = &gm.m().experts;
        if !missing.is_empty() && experts.lookahead_enabled() {
            // A source with reader threads (native) starts the reads and returns.
            experts.lookahead(l + 1, &missing);
        } else if !missing.is_empty() {
            // Otherwise (the browser) the fetch runs here, while the GPU computes.
            let _ = experts.prepare(l + 1, &missing);
        }
        if let Some(p) = self.predicted.get_mut(l + 1) {
            *p = Some(guess);
        }
        Ok(())
    }
}
