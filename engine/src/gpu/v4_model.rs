//! DeepSeek-V4 on the GPU backend: the pass's V4 operations over the session's per-layer
//! state ([`GpuV4Layer`]): the compressors, the indexer's choice, the attention, and the
//! MoE (the router on the GPU with sqrtsoftplus or the hash layers' `tid2eid` experts,
//! read back for the host to fetch the experts, which run with the clamped SwiGLU, then
//! the shared expert). Its weights are uploaded with the others' (`weights::upload_v4`:
//! the graph's V4 weights over GPU matrices, and per layer the MoE's resident parts).

use std::borrow::Borrow;

use super::backend::GpuPass;
use super::hybrid::MoeScratch;
use super::model::swiglu_ffn;
use super::ops;
use super::placement::Hybrid;
use super::weights::GpuV4;
use crate::error::{Error, Result};
use crate::kernels::Activation;
use crate::model::graph::{CompShape, Ops, V4AttendShape};
use crate::model::moe::batch_union;
use crate::model::v4::SelectShape;
use crate::model::Model;

impl<'a, M: Borrow<Model>> GpuPass<'a, M> {
    fn v4_weights(&self) -> Result<&'a GpuV4> {
        self.gm.v4.as_ref().ok_or_else(|| Error::Gpu("not a DeepSeek-V4 model".into()))
    }

    /// [`Ops::v4_compress`]: [`super::v4::GpuComp::feed`] of the layer's compressor (or
    /// its indexer's).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn v4_feed(
        &mut self,
        l: usize,
        index: bool,
        kv: &wgpu::Buffer,
        gate: &wgpu::Buffer,
        ape: &wgpu::Buffer,
        norm: &wgpu::Buffer,
        c: CompShape,
    ) -> Result<()> {
        let rope = &self.v4_weights()?.w.compress_rope;
        let st = self.session.v4.get_mut(l).ok_or_else(|| Error::Gpu(format!("layer {l}: no DeepSeek-V4 state")))?;
        let comp = if index { &mut st.index } else { &mut st.comp };
        comp.feed(&mut self.rec, kv, gate, ape, norm, c, rope)
    }

    /// [`Ops::v4_select`]: the choice is kept in the layer's state for the attention.
    pub(super) fn v4_choose(&mut self, l: usize, iq: &wgpu::Buffer, iw: &wgpu::Buffer, s: SelectShape) -> Result<()> {
        let st = self.session.v4.get_mut(l).ok_or_else(|| Error::Gpu(format!("layer {l}: no DeepSeek-V4 state")))?;
        let list = st.select(&mut self.rec, iq, iw, s)?;
        st.choice = Some((list, s.topk));
        Ok(())
    }

    /// [`Ops::v4_attend`].
    pub(super) fn v4_attention(
        &mut self,
        l: usize,
        q: &wgpu::Buffer,
        kv: &wgpu::Buffer,
        sinks: &wgpu::Buffer,
        s: V4AttendShape,
        out: &wgpu::Buffer,
    ) -> Result<()> {
        let st = self.session.v4.get_mut(l).ok_or_else(|| Error::Gpu(format!("layer {l}: no DeepSeek-V4 state")))?;
        let choice = st.choice.take();
        st.attend(&mut self.rec, q, kv, sinks, s, choice.as_ref().map(|(b, k)| (b, *k)), out)
    }

    /// [`crate::model::graph::Backend::v4_moe`]: v4::moe::moe on the GPU.
    pub(super) async fn v4_moe_gpu(
        &mut self,
        l: usize,
        xn: &wgpu::Buffer,
        n: usize,
        ids: &[u32],
        out: &wgpu::Buffer,
    ) -> Result<()> {
        let gm = self.gm;
        let v4 = self.v4_weights()?;
        let (lw, moe) = match (v4.w.layers.get(l), v4.moe.get(l)) {
            (Some(lw), Some(moe)) => (lw, moe),
            _ => return Err(Error::Gpu(format!("layer {l}: no DeepSeek-V4 MoE weights"))),
        };
        let c = &gm.m().cfg;
        let (h, ne, k) = (c.hidden, c.router.n_experts, c.router.top_k);
        let limit = c.v4.as_ref().map_or(f32::INFINITY, |v| v.swiglu_limit);
        let act = Activation::SiluClamped { limit };
        let f = 4u64;
        let logits = Ops::alloc(self, "router_logits", n * ne)?;
        let probs = Ops::alloc(self, "router_probs", n * ne)?;
        let routes = Ops::alloc(self, "routes", n * ne.max(k) * 2)?;
        ops::matmul(&mut self.rec, &moe.router.w, xn, 0, n, &logits, 0, ne)?;
        let fixed = match &lw.tid2eid {
            Some(t) => {
                let mut rows = Vec::with_capacity(n * k);
                for &id in ids.iter().take(n) {
                    let row = t
                        .get(id as usize * k..(id as usize + 1) * k)
                        .ok_or_else(|| Error::Gpu(format!("layer {l}: token {id} is outside tid2eid")))?;
                    if let Some(e) = row.iter().find(|&&e| e as usize >= ne) {
                        return Err(Error::Gpu(format!("layer {l}: tid2eid names expert {e} of {ne}")));
                    }
                    rows.extend_from_slice(row);
                }
                Some(self.rec.data(&rows))
            }
            None => None,
        };
        let bias = if fixed.is_some() { None } else { moe.router.correction.as_ref() };
        ops::route_with(&mut self.rec, &logits, &probs, &routes, n, &c.router, bias, fixed)?;
        self.rec.read(&routes, 0, (n * k * 2) as u64 * f);
        // The router lookahead for a learned-router layer next (logits and probs are free).
        let next = gm.next_router(l);
        let ahead_read = self.route_ahead(&next, xn, n, &logits, &probs)?;
        let xn_read = (gm.placement.mode != Hybrid::Off).then(|| self.rec.read(xn, 0, (n * h) as u64 * f));
        let done = self.submit().await?;
        let chosen = ops::routes_from(done.first().ok_or_else(|| Error::Gpu("routes were not read back".into()))?, k);
        self.score_guess(l, &chosen, ne)?;
        let guess = self.guess(&next, ahead_read, &done, ne);
        let xn_host = xn_read.and_then(|r| done.get(r.0)).map(|b| super::buffers::f32s(b));
        let users = batch_union(&chosen, ne)?;
        self.rec.clear(out, 0, (n * h) as u64 * f);
        let missing: Vec<usize> = {
            let pool = gm.pool.lock().map_err(|_| Error::Gpu("expert pool poisoned".into()))?;
            (0..ne).filter(|&e| !users[e].is_empty() && !pool.contains(l, e)).collect()
        };
        if !missing.is_empty() {
            gm.m().experts.prepare(l, &missing)?;
        }
        let inter = gm.max_inter;
        let (xs, ys) = (Ops::alloc(self, "xs", n * h)?, Ops::alloc(self, "ys", n * h)?);
        let (g, u) = (Ops::alloc(self, "g", n * inter)?, Ops::alloc(self, "u", n * inter)?);
        let scratch = MoeScratch { xn, y: out, xs: &xs, g: &g, u: &u, ys: &ys };
        let on_use = &mut *self.on_use;
        if gm.moe_experts(&mut self.rec, l, act, None, moe, &users, xn_host.as_deref(), &scratch, on_use).await? {
            self.reattach_tables();
        }
        // The shared expert, added after the routed sum (v4::moe::moe).
        if let Some((shared, _)) = &moe.shared {
            swiglu_ffn(&mut self.rec, shared, xn, n, &g, &u, &ys, act, None)?;
            ops::add(&mut self.rec, out, 0, &ys, 0, n * h, n * h)?;
        }
        if let Some(guess) = guess {
            self.prefetch_guess(l, guess).await?;
        }
        Ok(())
    }
}
