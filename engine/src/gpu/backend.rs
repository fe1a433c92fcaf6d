//! The wgpu backend of the graph ([`crate::model::graph`]): [`GpuPass`] records each
//! operation of one forward pass with its WGSL twin ([`super::ops`]) into a [`Recorder`],
//! and submits where the host must see a result (the routes of a MoE layer, the logits).
//!
//! Per MoE layer the router logits are routed on the GPU by route.wgsl (moe::route's
//! arithmetic and order for every scoring rule, bit for bit) and the choices read back,
//! because the host must fetch and upload missing experts; the selected experts then run
//! on the GPU in ascending index order, as the CPU adds them.

use std::borrow::Borrow;
use std::collections::HashMap;

use super::buffers::{f32s, GpuMat};
use super::deltanet::GpuDeltaState;
use super::hybrid::MoeScratch;
use super::kernels::Kernel;
use super::model::{GpuModel, GpuSession};
use super::ops::{self, AttnShape, GateAct};
use super::placement::Hybrid;
use super::pool::GpuExpert;
use super::recorder::{Bind, Recorder};
use super::v4;
use super::weights::{GpuAttn, GpuFfn, GpuMoe};
use crate::error::{Error, Result};
use crate::model::attention::AttnOpts;
use crate::model::config::{Activation, LinearAttnConfig, MlaConfig};
use crate::model::dsa;
use crate::model::graph::{AttendShape, Attn, Backend, FfnRef, IndexShape, MlpRef, Ops};
use crate::model::graph::{CompShape, V4AttendShape};
use crate::model::moe::{MoeBlock, Routing};
use crate::model::v4::{HcShape, SelectShape, V4Weights};
use crate::model::{Ffn, Model};

/// One forward pass of a [`GpuModel`] over a session, positions `pos0..pos0 + n`.
pub(super) struct GpuPass<'a, M: Borrow<Model>> {
    pub(super) gm: &'a GpuModel<M>,
    pub(super) rec: Recorder<'a>,
    pub(super) session: &'a mut GpuSession,
    pos0: usize,
    n: usize,
    /// RoPE's [cos.., sin..] per position of the pass, and where the recorder holds it
    /// (again after every submit: the data arena goes with the recorder).
    cs: Vec<f32>,
    cs_data: Bind,
    /// DeepSeek-V4's two RoPEs (main, then the compressed branches'): rotary dim, [cos..,
    /// sin..] per position of the pass, where the recorder holds it.
    v4_cs: Vec<(usize, Vec<f32>, Bind)>,
    /// Scratch buffers by label, reused from layer to layer.
    scratch: HashMap<&'static str, wgpu::Buffer>,
    /// DSA: the positions each query of the pass keeps, from the last indexer.
    selection: Option<crate::model::dsa::Selection>,
    /// The layer whose rows of this pass `index_select` already put in its cache.
    rows_cached: Option<usize>,
    /// Layer -> experts the lookahead predicted for it (checked when it routes).
    pub(super) predicted: Vec<Option<Vec<usize>>>,
    /// Between a MoE layer's `route` and `experts`: the next layer's likely experts, and
    /// the FFN input read back (hybrid placement runs some experts on the CPU).
    ahead: Option<Vec<usize>>,
    xn_host: Option<Vec<f32>>,
    pub(super) on_use: &'a mut dyn FnMut(usize, usize, usize),
}

impl<'a, M: Borrow<Model>> GpuPass<'a, M> {
    pub(super) fn new(
        gm: &'a GpuModel<M>,
        mut rec: Recorder<'a>,
        session: &'a mut GpuSession,
        n: usize,
        on_use: &'a mut dyn FnMut(usize, usize, usize),
    ) -> Result<Self> {
        let c = &gm.m().cfg;
        let pos0 = session.tokens.len();
        let rope = &gm.m().rope;
        let half = rope.rotary_dim / 2;
        let mut cs = Vec::with_capacity(n * 2 * half);
        let (mut co, mut si) = (Vec::new(), Vec::new());
        for i in 0..n {
            rope.cos_sin(pos0 + i, &mut co, &mut si);
            cs.extend_from_slice(&co);
            cs.extend_from_slice(&si);
        }
        let cs_data = rec.data_f32(&cs);
        let v4_cs = match &gm.m().v4 {
            Some(w) => [&w.main_rope, &w.compress_rope]
                .into_iter()
                .map(|r| {
                    let mut t = Vec::with_capacity(n * r.rotary_dim);
                    for i in 0..n {
                        r.cos_sin(pos0 + i, &mut co, &mut si);
                        t.extend_from_slice(&co);
                        t.extend_from_slice(&si);
                    }
                    let data = rec.data_f32(&t);
                    (r.rotary_dim, t, data)
                })
                .collect(),
            None => Vec::new(),
        };
        Ok(GpuPass {
            gm,
            rec,
            session,
            pos0,
            n,
            cs,
            cs_data,
            v4_cs,
            scratch: HashMap::new(),
            selection: None,
            rows_cached: None,
            predicted: vec![None; c.n_layers],
            ahead: None,
            xn_host: None,
            on_use,
        })
    }

    /// Submits what was recorded (a fresh recorder takes its place) and returns the reads.
    pub(super) async fn submit(&mut self) -> Result<Vec<Vec<u8>>> {
        let ctx = self.rec.ctx();
        let done = std::mem::replace(&mut self.rec, Recorder::new(ctx)).submit().await?;
        self.reattach_tables();
        Ok(done)
    }

    /// The RoPE tables again in a fresh recorder's data arena.
    pub(super) fn reattach_tables(&mut self) {
        self.cs_data = self.rec.data_f32(&self.cs);
        for (_, t, data) in &mut self.v4_cs {
            *data = self.rec.data_f32(t);
        }
    }

    fn half(&self) -> usize {
        self.gm.m().rope.rotary_dim / 2
    }

    /// Layer `l`'s recurrent state.
    fn delta_state(&mut self, l: usize) -> Result<&mut GpuDeltaState> {
        self.session
            .recurrent
            .get_mut(l)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Gpu(format!("layer {l}: recurrent state missing")))
    }

    /// The attention score scratch of this pass: n * n_heads * (pos0 + n) floats.
    fn scores(&mut self) -> Result<wgpu::Buffer> {
        let c = &self.gm.m().cfg;
        let len = self.n * c.n_heads * (self.pos0 + self.n);
        Ops::alloc(self, "scores", len)
    }
}

impl<'a, M: Borrow<Model>> Ops<'a> for GpuPass<'a, M> {
    type T = wgpu::Buffer;
    type M = GpuMat;
    type V = wgpu::Buffer;

    fn pos0(&self) -> usize {
        self.pos0
    }

    fn alloc(&mut self, label: &'static str, len: usize) -> Result<wgpu::Buffer> {
        let bytes = len.max(1) as u64 * 4;
        if let Some(b) = self.scratch.get(label).filter(|b| b.size() >= bytes) {
            return Ok(b.clone());
        }
        let b = self.rec.ctx().storage_buffer(label, bytes)?;
        self.scratch.insert(label, b.clone());
        Ok(b)
    }

    fn copy(&mut self, src: &wgpu::Buffer, at: usize, dst: &mut wgpu::Buffer, dst_at: usize, len: usize) -> Result<()> {
        self.rec.copy(src, at as u64 * 4, dst, dst_at as u64 * 4, len as u64 * 4);
        Ok(())
    }

    fn rmsnorm_at(
        &mut self,
        t: &mut wgpu::Buffer,
        at: usize,
        rows: usize,
        width: usize,
        stride: usize,
        w: &wgpu::Buffer,
        eps: f32,
    ) -> Result<()> {
        ops::rmsnorm_strided(&mut self.rec, t, at, rows, width, stride, w, eps)
    }

    fn add(&mut self, x: &mut wgpu::Buffer, y: &wgpu::Buffer, len: usize) -> Result<()> {
        ops::add(&mut self.rec, x, 0, y, 0, len, len)
    }

    fn add_bias(&mut self, t: &mut wgpu::Buffer, b: &wgpu::Buffer, len: usize, period: usize) -> Result<()> {
        ops::add(&mut self.rec, t, 0, b, 0, len, period)
    }

    fn matmul(
        &mut self,
        jobs: &mut [(&GpuMat, &mut wgpu::Buffer)],
        x: &wgpu::Buffer,
        row0: usize,
        n: usize,
    ) -> Result<()> {
        for (w, out) in jobs.iter_mut() {
            ops::matmul(&mut self.rec, w, x, row0 * w.cols, n, out, 0, w.rows)?;
        }
        Ok(())
    }

    fn matmul_at(
        &mut self,
        w: &GpuMat,
        x: &wgpu::Buffer,
        row0: usize,
        n: usize,
        out: &mut wgpu::Buffer,
        at: usize,
        stride: usize,
    ) -> Result<()> {
        ops::matmul(&mut self.rec, w, x, row0 * w.cols, n, out, at, stride)
    }

    fn clamp(&mut self, t: &mut wgpu::Buffer, len: usize, c: f32) -> Result<()> {
        ops::clamp(&mut self.rec, t, len, c)
    }

    fn split_gate(
        &mut self,
        qg: &wgpu::Buffer,
        n: usize,
        heads: usize,
        hd: usize,
        q: &mut wgpu::Buffer,
        gate: &mut wgpu::Buffer,
    ) -> Result<()> {
        ops::split_gate(&mut self.rec, qg, n * heads, hd, q, gate)
    }

    fn rope_at(
        &mut self,
        t: &mut wgpu::Buffer,
        n: usize,
        heads: usize,
        stride: usize,
        at: usize,
        interleaved: bool,
    ) -> Result<()> {
        let (half, cs) = (self.half(), self.cs_data.clone());
        match interleaved {
            false => ops::rope_at(&mut self.rec, t, at, n, heads, stride, half, cs),
            true => ops::rope_pairs_at(&mut self.rec, t, at, n, heads, stride, half, cs),
        }
    }

    fn attend(
        &mut self,
        l: usize,
        q: &wgpu::Buffer,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        s: AttendShape,
        sinks: Option<&wgpu::Buffer>,
        out: &mut wgpu::Buffer,
    ) -> Result<()> {
        let scores = self.scores()?;
        let (kc, vc) = self.session.kv.get(l).ok_or_else(|| Error::Gpu(format!("layer {l}: no KV cache")))?;
        let kvd = (s.n_kv_heads * s.head_dim) as u64 * 4;
        self.rec.copy(k, 0, kc, s.pos0 as u64 * kvd, s.n as u64 * kvd);
        self.rec.copy(v, 0, vc, s.pos0 as u64 * kvd, s.n as u64 * kvd);
        let shape = AttnShape {
            n: s.n,
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.head_dim,
            pos0: s.pos0,
            window: s.window,
            scale: s.scale,
            mla: None,
            row: None,
        };
        ops::attention(&mut self.rec, shape, q, kc, vc, &scores, out, sinks, None)
    }

    fn mla_absorb(
        &mut self,
        kv_b: &GpuMat,
        q: &wgpu::Buffer,
        n: usize,
        heads: usize,
        m: &MlaConfig,
        qc: &mut wgpu::Buffer,
    ) -> Result<()> {
        let (dn, dr, dv) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
        ops::mla_absorb(&mut self.rec, kv_b, q, qc, n, heads, dn, dr, dn + dv)
    }

    fn attend_mla(
        &mut self,
        l: usize,
        qc: &wgpu::Buffer,
        ckv: &wgpu::Buffer,
        s: AttendShape,
        m: &MlaConfig,
        ctx: &mut wgpu::Buffer,
    ) -> Result<()> {
        let (r, dr) = (m.kv_lora_rank, m.qk_rope_head_dim);
        if self.half() * 2 != dr {
            return Err(Error::Gpu(format!("MLA: rope of {} dims for a rotary key of {dr}", self.half() * 2)));
        }
        let scores = self.scores()?;
        let cache = &self.session.kv.get(l).ok_or_else(|| Error::Gpu(format!("layer {l}: no KV cache")))?.0;
        // The cache row of a position is [latent, rotary key] (and DSA's indexer key), as
        // ckv's rows.
        let row = m.cache_width_at(l);
        let bytes = row as u64 * 4;
        if self.rows_cached.take() != Some(l) {
            self.rec.copy(ckv, 0, cache, s.pos0 as u64 * bytes, s.n as u64 * bytes);
        }
        let sel = match m.indexer_at(l) {
            None => None,
            Some(_) => {
                let kept = self
                    .selection
                    .as_ref()
                    .ok_or_else(|| Error::Gpu(format!("layer {l}: sparse attention before any indexer ran")))?;
                let topk = m.dsa.as_ref().map_or(1, |d| d.topk);
                let mut ids = vec![u32::MAX; s.n * topk];
                for (i, k) in kept.iter().enumerate() {
                    if let Some(k) = k {
                        ids[i * topk..i * topk + k.len()].copy_from_slice(k);
                    }
                }
                Some(ops::Selected { ids: self.rec.data(&ids), topk })
            }
        };
        let shape = AttnShape {
            n: s.n,
            n_heads: s.n_heads,
            n_kv_heads: 1,
            head_dim: r + dr,
            pos0: s.pos0,
            window: s.window,
            scale: s.scale,
            mla: Some((r, dr)),
            row: Some(row),
        };
        ops::attention(&mut self.rec, shape, qc, cache, cache, &scores, ctx, None, sel)
    }

    fn layernorm_at(
        &mut self,
        t: &mut wgpu::Buffer,
        at: usize,
        rows: usize,
        width: usize,
        stride: usize,
        w: &wgpu::Buffer,
        bias: &wgpu::Buffer,
        eps: f32,
    ) -> Result<()> {
        ops::layernorm(&mut self.rec, t, at, rows, width, stride, w, bias, eps)
    }

    async fn index_select(
        &mut self,
        l: usize,
        iq: &wgpu::Buffer,
        iw: &wgpu::Buffer,
        ckv: &wgpu::Buffer,
        at: usize,
        row: usize,
        s: IndexShape,
    ) -> Result<()> {
        // Queries that see at most index_topk positions keep them all: no scores needed.
        if s.pos0 + s.n <= s.topk {
            self.selection = Some(vec![None; s.n]);
            return Ok(());
        }
        // The pass's rows go into the cache first (attend_mla then leaves them), so every
        // key is read from there.
        let cache = &self.session.kv.get(l).ok_or_else(|| Error::Gpu(format!("layer {l}: no KV cache")))?.0;
        let bytes = row as u64 * 4;
        self.rec.copy(ckv, 0, cache, s.pos0 as u64 * bytes, s.n as u64 * bytes);
        self.rows_cached = Some(l);
        let len = s.n * (s.pos0 + s.n);
        let scores = Ops::alloc(self, "dsa.scores", len)?;
        let cache = &self.session.kv.get(l).ok_or_else(|| Error::Gpu(format!("layer {l}: no KV cache")))?.0;
        ops::index_scores(&mut self.rec, iq, iw, cache, &scores, s, row, at)?;
        let scores = Ops::read(self, scores, len).await?;
        self.selection = Some(dsa::select_scored(&scores, s));
        Ok(())
    }

    fn delta_begin(&mut self, l: usize, c: &LinearAttnConfig, _n: usize) -> Result<()> {
        // Snapshots are taken before the pass (`prepare`).
        let ctx = self.rec.ctx();
        self.delta_state(l)?.ensure(ctx, c)
    }

    fn delta_regroup(
        &mut self,
        _c: &LinearAttnConfig,
        _qkvz: &wgpu::Buffer,
        _ba: &wgpu::Buffer,
        _n: usize,
        _mixed: &mut wgpu::Buffer,
        _z: &mut wgpu::Buffer,
        _bav: &mut wgpu::Buffer,
    ) -> Result<()> {
        Err(Error::Gpu("DeltaNet: grouped projections are gathered into the split layout at upload".into()))
    }

    fn delta_conv(
        &mut self,
        l: usize,
        c: &LinearAttnConfig,
        taps: &wgpu::Buffer,
        mixed: &mut wgpu::Buffer,
        n: usize,
    ) -> Result<()> {
        let cd = c.conv_dim();
        let params = [ops::u32_of("n", n)?, ops::u32_of("conv_dim", cd)?, ops::u32_of("conv kernel", c.conv_kernel)?];
        let win = self.delta_state(l)?.conv.clone();
        let binds = vec![(&*mixed).into(), taps.into(), (&win).into()];
        self.rec.dispatch(Kernel::DeltaNetConv, &[], &params, binds, ops::groups(cd, 64))
    }

    fn delta_l2norm(&mut self, c: &LinearAttnConfig, mixed: &mut wgpu::Buffer, n: usize) -> Result<()> {
        // q and k: L2 norm per head, q then times k_head_dim^-0.5.
        let scale = (1.0 / (c.k_head_dim as f64).sqrt()) as f32;
        let heads = 2 * c.n_k_heads;
        let params = [
            ops::u32_of("rows", n * heads)?,
            ops::u32_of("heads", heads)?,
            ops::u32_of("k_head_dim", c.k_head_dim)?,
            ops::u32_of("conv_dim", c.conv_dim())?,
            ops::u32_of("key heads", c.n_k_heads)?,
            scale.to_bits(),
            1e-6f32.to_bits(),
        ];
        self.rec.dispatch(Kernel::L2Norm, &[], &params, vec![(&*mixed).into()], (n * heads) as u64)
    }

    fn delta_gates(
        &mut self,
        c: &LinearAttnConfig,
        ba: &mut wgpu::Buffer,
        n: usize,
        neg_a: &wgpu::Buffer,
        dt_bias: &wgpu::Buffer,
    ) -> Result<()> {
        let nv = c.n_v_heads;
        let params = [ops::u32_of("n", n)?, ops::u32_of("value heads", nv)?];
        let binds = vec![(&*ba).into(), neg_a.into(), dt_bias.into()];
        self.rec.dispatch(Kernel::DeltaNetGates, &[], &params, binds, ops::groups(n * nv, 64))
    }

    fn delta_rule(
        &mut self,
        l: usize,
        c: &LinearAttnConfig,
        mixed: &wgpu::Buffer,
        ba: &wgpu::Buffer,
        n: usize,
        o: &mut wgpu::Buffer,
    ) -> Result<()> {
        let nv = c.n_v_heads;
        let col_groups = c.v_head_dim.div_ceil(64);
        let params = [
            ops::u32_of("n", n)?,
            ops::u32_of("value heads", nv)?,
            ops::u32_of("heads ratio", nv / c.n_k_heads)?,
            ops::u32_of("k_head_dim", c.k_head_dim)?,
            ops::u32_of("v_head_dim", c.v_head_dim)?,
            ops::u32_of("key_dim", c.key_dim())?,
            ops::u32_of("conv_dim", c.conv_dim())?,
            ops::u32_of("column groups", col_groups)?,
        ];
        let st = self.delta_state(l)?;
        st.pos += n;
        let s = st.s.clone();
        let binds = vec![mixed.into(), ba.into(), (&s).into(), (&*o).into()];
        self.rec.dispatch(Kernel::DeltaRule, &[], &params, binds, (nv * col_groups) as u64)
    }

    fn gate_silu(&mut self, x: &mut wgpu::Buffer, g: &wgpu::Buffer, len: usize) -> Result<()> {
        ops::gate_mul(&mut self.rec, x, g, len, GateAct::Silu)
    }

    fn gate_sigmoid(&mut self, x: &mut wgpu::Buffer, g: &wgpu::Buffer, len: usize) -> Result<()> {
        ops::gate_mul(&mut self.rec, x, g, len, GateAct::Sigmoid)
    }

    fn swiglu(&mut self, g: &mut wgpu::Buffer, u: &wgpu::Buffer, len: usize, act: Activation) -> Result<()> {
        ops::swiglu(&mut self.rec, g, u, len, act)
    }

    fn gated_add(
        &mut self,
        y: &mut wgpu::Buffer,
        s: &wgpu::Buffer,
        g: &wgpu::Buffer,
        n: usize,
        hidden: usize,
    ) -> Result<()> {
        ops::gated_add(&mut self.rec, y, s, g, n, hidden)
    }

    fn hc_weights(
        &mut self,
        mix: &wgpu::Buffer,
        base: &wgpu::Buffer,
        scale: &wgpu::Buffer,
        s: HcShape,
        head: bool,
        pre: &mut wgpu::Buffer,
        post: &mut wgpu::Buffer,
        comb: &mut wgpu::Buffer,
    ) -> Result<()> {
        v4::hc_weights(&mut self.rec, mix, base, scale, s, head, pre, post, comb)
    }

    fn hc_collapse(&mut self, pre: &wgpu::Buffer, x: &wgpu::Buffer, s: HcShape, out: &mut wgpu::Buffer) -> Result<()> {
        v4::hc_collapse(&mut self.rec, pre, x, s, out)
    }

    fn hc_expand(
        &mut self,
        x: &mut wgpu::Buffer,
        y: &wgpu::Buffer,
        post: &wgpu::Buffer,
        comb: &wgpu::Buffer,
        s: HcShape,
    ) -> Result<()> {
        let scratch = Ops::alloc(self, "hc_streams", s.n * s.n_hc * s.hidden)?;
        v4::hc_expand(&mut self.rec, x, y, post, comb, s, &scratch)
    }

    fn copy_rows(
        &mut self,
        src: &wgpu::Buffer,
        src_at: usize,
        src_stride: usize,
        dst: &mut wgpu::Buffer,
        dst_at: usize,
        dst_stride: usize,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        v4::copy_rows(&mut self.rec, src, src_at, src_stride, dst, dst_at, dst_stride, rows, width)
    }

    fn rope_tail(
        &mut self,
        t: &mut wgpu::Buffer,
        n: usize,
        heads: usize,
        stride: usize,
        compress: bool,
        inverse: bool,
    ) -> Result<()> {
        let (half, cs) = match self.v4_cs.get(usize::from(compress)) {
            Some((rot, _, cs)) => (rot / 2, cs.clone()),
            None => return Err(Error::Gpu("deepseek_v4's interleaved tail RoPE without its tables".into())),
        };
        v4::rope_tail(&mut self.rec, t, 0, n, heads, stride, half, inverse, cs)
    }

    fn v4_compress(
        &mut self,
        l: usize,
        index: bool,
        kv: &wgpu::Buffer,
        gate: &wgpu::Buffer,
        ape: &wgpu::Buffer,
        norm: &wgpu::Buffer,
        c: CompShape,
    ) -> Result<()> {
        self.v4_feed(l, index, kv, gate, ape, norm, c)
    }

    fn v4_select(&mut self, l: usize, iq: &wgpu::Buffer, iw: &wgpu::Buffer, s: SelectShape) -> Result<()> {
        self.v4_choose(l, iq, iw, s)
    }

    fn v4_attend(
        &mut self,
        l: usize,
        q: &wgpu::Buffer,
        kv: &wgpu::Buffer,
        sinks: &wgpu::Buffer,
        s: V4AttendShape,
        out: &mut wgpu::Buffer,
    ) -> Result<()> {
        self.v4_attention(l, q, kv, sinks, s, out)
    }

    async fn read(&mut self, t: wgpu::Buffer, len: usize) -> Result<Vec<f32>> {
        self.rec.read(&t, 0, len as u64 * 4);
        let done = self.submit().await?;
        Ok(f32s(done.first().ok_or_else(|| Error::Gpu("a result was not read back".into()))?))
    }
}

impl<'a, M: Borrow<Model>> Backend<'a> for GpuPass<'a, M> {
    fn v4(&self) -> Option<&'a V4Weights<GpuMat, wgpu::Buffer>> {
        self.gm.v4.as_ref().map(|v| &v.w)
    }

    async fn v4_moe(
        &mut self,
        l: usize,
        xn: &wgpu::Buffer,
        n: usize,
        ids: &[u32],
        out: &mut wgpu::Buffer,
    ) -> Result<()> {
        self.v4_moe_gpu(l, xn, n, ids, out).await
    }

    fn model(&self) -> &'a Model {
        self.gm.m()
    }

    fn norms(&self, l: usize) -> (&'a wgpu::Buffer, &'a wgpu::Buffer) {
        let lw = &self.gm.layers[l];
        (&lw.attn_norm, &lw.ffn_norm)
    }

    fn attn(&self, l: usize) -> Attn<'a, GpuMat, wgpu::Buffer> {
        match &self.gm.layers[l].attn {
            GpuAttn::Gqa(g) => Attn::Gqa(g),
            GpuAttn::Mla(w) => Attn::Mla(w),
            GpuAttn::Linear(w) => Attn::Linear(w),
        }
    }

    fn attn_opts(&self, l: usize) -> &'a AttnOpts {
        &self.gm.m().layers[l].attn_opts
    }

    fn final_norm(&self) -> &'a wgpu::Buffer {
        &self.gm.final_norm
    }

    fn lm_head(&self) -> &'a GpuMat {
        &self.gm.lm_head
    }

    fn embed(&mut self, ids: &[u32], x: &mut wgpu::Buffer) -> Result<()> {
        let ids_data = self.rec.data(ids);
        ops::embed(&mut self.rec, &self.gm.embed, ids_data, ids.len(), x)
    }

    fn ffn(&self, l: usize) -> Result<FfnRef<'a, GpuMat>> {
        let mlp = |e: &'a GpuExpert| MlpRef { gate: &e.gate, up: &e.up, down: &e.down, inter: e.gate.rows };
        let lw = self.gm.layers.get(l).ok_or_else(|| Error::Gpu(format!("layer {l}: no GPU weights")))?;
        Ok(match &lw.ffn {
            GpuFfn::Dense(e) => FfnRef::Dense(mlp(e)),
            GpuFfn::Moe(moe) => FfnRef::Moe {
                n_experts: moe.router.w.rows,
                shared: moe.shared.as_ref().map(|(e, gate)| (mlp(e), gate.as_ref())),
            },
        })
    }

    async fn route(&mut self, l: usize, xn: &wgpu::Buffer, n: usize) -> Result<Vec<Routing>> {
        let gm = self.gm;
        let (block, moe) = self.moe(l)?;
        let (c, f) = (&gm.m().cfg, 4u64);
        let router = &moe.router;
        let ne = router.w.rows;
        let k = block.cfg.top_k;
        let router_logits = Ops::alloc(self, "router_logits", n * c.router.n_experts)?;
        let probs = Ops::alloc(self, "router_probs", n * c.router.n_experts)?;
        // (expert, weight bits) per choice; any top-k up to all experts fits.
        let routes = Ops::alloc(self, "routes", n * c.router.n_experts * 2)?;
        router.route(&mut self.rec, xn, n, &router_logits, &probs, &routes, &block.cfg)?;
        self.rec.read(&routes, 0, (n * k * 2) as u64 * f);
        let next = gm.next_router(l);
        // router_logits and probs are free again: this layer's routing has consumed them.
        let ahead_read = self.route_ahead(&next, xn, n, &router_logits, &probs)?;
        // Hybrid placement computes some experts on the CPU: it needs the input.
        let h = c.hidden;
        let xn_read = (gm.placement.mode != Hybrid::Off).then(|| self.rec.read(xn, 0, (n * h) as u64 * f));
        let done = self.submit().await?;
        let chosen = ops::routes_from(done.first().ok_or_else(|| Error::Gpu("routes were not read back".into()))?, k);
        self.score_guess(l, &chosen, ne)?;
        self.ahead = self.guess(&next, ahead_read, &done, ne);
        self.xn_host = xn_read.and_then(|r| done.get(r.0)).map(|b| f32s(b));
        Ok(chosen)
    }

    async fn experts(
        &mut self,
        l: usize,
        users: &[Vec<(usize, f32)>],
        xn: &wgpu::Buffer,
        n: usize,
        y: &mut wgpu::Buffer,
    ) -> Result<()> {
        let gm = self.gm;
        let (block, moe) = self.moe(l)?;
        let (c, f) = (&gm.m().cfg, 4u64);
        let (h, ne) = (c.hidden, moe.router.w.rows);
        let (ahead, xn_host) = (self.ahead.take(), self.xn_host.take());
        self.rec.clear(y, 0, (n * h) as u64 * f);
        // Let the source fetch every expert the pool lacks in one request.
        let missing: Vec<usize> = {
            let pool = gm.pool.lock().map_err(|_| Error::Gpu("expert pool poisoned".into()))?;
            (0..ne.min(users.len())).filter(|&e| !users[e].is_empty() && !pool.contains(l, e)).collect()
        };
        if !missing.is_empty() {
            gm.m().experts.prepare(l, &missing)?;
        }
        let inter = gm.max_inter;
        let (xs, ys) = (Ops::alloc(self, "xs", n * h)?, Ops::alloc(self, "ys", n * h)?);
        let (g, u) = (Ops::alloc(self, "g", n * inter)?, Ops::alloc(self, "u", n * inter)?);
        let scratch = MoeScratch { xn, y, xs: &xs, g: &g, u: &u, ys: &ys };
        let on_use = &mut *self.on_use;
        let (act, bias, xn_host) = (block.act, block.expert_bias.as_ref(), xn_host.as_deref());
        if gm.moe_experts(&mut self.rec, l, act, bias, moe, users, xn_host, &scratch, on_use).await? {
            self.reattach_tables();
        }
        if let Some(guess) = ahead {
            self.prefetch_guess(l, guess).await?;
        }
        Ok(())
    }
}

impl<'a, M: Borrow<Model>> GpuPass<'a, M> {
    /// Layer `l`'s MoE block and its resident GPU parts.
    fn moe(&self, l: usize) -> Result<(&'a MoeBlock, &'a GpuMoe)> {
        let gm = self.gm;
        match (gm.m().layers.get(l).map(|x| &x.ffn), gm.layers.get(l).map(|x| &x.ffn)) {
            (Some(Ffn::Moe(block)), Some(GpuFfn::Moe(moe))) => Ok((block, moe)),
            _ => Err(Error::Gpu(format!("layer {l}: GPU weights do not match the model"))),
        }
    }
}
