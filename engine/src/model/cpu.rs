//! The CPU backend of the graph ([`super::graph`]): [`CpuOps`] executes each tensor
//! operation at once on `Vec<f32>` with the CPU kernels (the reference bits), and
//! [`CpuPass`] adds the model's weights, the per-layer caches, the expert supply and the
//! hooks of one forward pass.

use crate::error::Result;
use crate::experts::Expert;
use crate::kernels::{matmul, matmul_many, rmsnorm_chunks, MatJob};
use crate::math;
use crate::model::attention::{attend_cached, split_gate, AttendShape, AttnOpts, LayerCache};
use crate::model::config::Activation;
use crate::model::config::{LinearAttnConfig, MlaConfig};
use crate::model::deltanet::{self, DeltaState};
use crate::model::dsa::{self, IndexShape, Selection};
use crate::model::graph::{Attn, Backend, FfnRef, MlpRef, Ops};
use crate::model::graph::{CompShape, V4AttendShape};
use crate::model::mla;
use crate::model::moe::{MoeBlock, Routing};
use crate::model::rope::{deinterleave, Rope};
use crate::model::v4::{HcShape, SelectShape, V4State, V4Weights};
use crate::model::{AttnWeights, Ffn, Layer, Model};
use crate::tensor::Mat;

/// The CPU's tensor operations for one pass: the positions `pos0..pos0 + n` of one
/// sequence over its layers' caches, or of several sequences at once (a batch: their rows
/// one after the other, each attending over its own caches; every other operation runs
/// over all rows together, so a MoE layer reads each expert once for the whole batch).
pub(crate) struct CpuOps<'a> {
    rope: &'a Rope,
    /// RoPE's cos and sin of each row of the pass.
    cos: Vec<Vec<f32>>,
    sin: Vec<Vec<f32>>,
    /// The pass's sequences in row order.
    seqs: Vec<Seq<'a>>,
    /// The layer whose cache is `caches[0]` (the MTP layer's own cache follows the model's).
    first: usize,
    /// DeepSeek-V4's ropes, for a V4 pass (each sequence brings its state).
    v4: Option<v4::V4Ropes<'a>>,
}

/// One sequence of a pass: `n` rows at positions `pos0..`, its layers' caches.
pub(crate) struct Seq<'a> {
    pos0: usize,
    n: usize,
    caches: &'a mut [LayerCache],
    /// DSA: the positions each of its queries keeps, from the last indexer.
    selection: Option<Selection>,
    /// DeepSeek-V4: the sequence's state, and the entries each of its queries attends
    /// to, from the last indexer.
    v4: Option<&'a mut V4State>,
    chosen: Option<Vec<Vec<usize>>>,
}

impl<'a> Seq<'a> {
    pub(crate) fn new(pos0: usize, n: usize, caches: &'a mut [LayerCache]) -> Self {
        Seq { pos0, n, caches, selection: None, v4: None, chosen: None }
    }

    /// The sequence of a DeepSeek-V4 pass, over its `state`.
    pub(crate) fn with_v4(mut self, state: &'a mut V4State) -> Self {
        self.v4 = Some(state);
        self
    }

    fn cache(&mut self, l: usize, first: usize) -> Result<&mut LayerCache> {
        self.caches
            .get_mut(l.wrapping_sub(first))
            .ok_or_else(|| crate::error::Error::Invalid(format!("layer {l} has no cache")))
    }

    fn delta_state(&mut self, l: usize, first: usize) -> Result<&mut DeltaState> {
        self.cache(l, first)?
            .recurrent
            .as_deref_mut()
            .ok_or_else(|| crate::error::Error::Invalid(format!("layer {l} has no recurrent state")))
    }
}

impl<'a> CpuOps<'a> {
    #[cfg(test)]
    pub(crate) fn new(
        rope: &'a Rope,
        pos0: usize,
        cos: Vec<Vec<f32>>,
        sin: Vec<Vec<f32>>,
        caches: &'a mut [LayerCache],
    ) -> Self {
        let n = cos.len();
        CpuOps { rope, cos, sin, seqs: vec![Seq::new(pos0, n, caches)], first: 0, v4: None }
    }

    /// A DeepSeek-V4 pass, with its two ropes (its sequences' states: [`Seq::with_v4`]).
    pub(crate) fn with_v4(mut self, main: &'a Rope, compress: &'a Rope) -> Self {
        self.v4 = Some(v4::V4Ropes { main, compress });
        self
    }

    /// RoPE's tables for positions pos0..pos0 + n.
    pub(crate) fn for_positions(rope: &'a Rope, pos0: usize, n: usize, caches: &'a mut [LayerCache]) -> Self {
        Self::batch(rope, vec![Seq::new(pos0, n, caches)])
    }

    /// A pass over several sequences, their rows in the order given.
    pub(crate) fn batch(rope: &'a Rope, seqs: Vec<Seq<'a>>) -> Self {
        let rows: usize = seqs.iter().map(|s| s.n).sum();
        let (mut cos, mut sin) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
        for s in &seqs {
            for i in 0..s.n {
                let (mut co, mut si) = (Vec::new(), Vec::new());
                rope.cos_sin(s.pos0 + i, &mut co, &mut si);
                cos.push(co);
                sin.push(si);
            }
        }
        CpuOps { rope, cos, sin, seqs, first: 0, v4: None }
    }

    /// `caches` are layers `first..` (the MTP layer's cache alone).
    pub(crate) fn first_layer(mut self, first: usize) -> Self {
        self.first = first;
        self
    }

    /// Runs `f(sequence, first row, rows, first layer)` for each sequence of a pass over
    /// `n` rows in all (one sequence: all of them).
    fn each_seq(&mut self, n: usize, mut f: impl FnMut(&mut Seq<'a>, usize, usize, usize) -> Result<()>) -> Result<()> {
        let first = self.first;
        if let [one] = self.seqs.as_mut_slice() {
            return f(one, 0, n, first);
        }
        if self.seqs.iter().map(|s| s.n).sum::<usize>() != n {
            return Err(crate::error::Error::Invalid(format!("a batched pass of {n} rows over other sequences")));
        }
        let mut r0 = 0;
        for seq in &mut self.seqs {
            let rows = seq.n;
            f(seq, r0, rows, first)?;
            r0 += rows;
        }
        Ok(())
    }
}

/// What runs the CPU's tensor operations: [`CpuOps`] itself, or a [`CpuPass`] through its
/// `ops` (the one `Ops` impl below covers both; the pass only adds the model's weights and
/// hooks, [`Backend`]).
pub(crate) trait AsCpuOps {
    fn with<R>(&mut self, f: impl FnOnce(&mut CpuOps<'_>) -> R) -> R;
    fn with_ref<R>(&self, f: impl FnOnce(&CpuOps<'_>) -> R) -> R;
}

impl AsCpuOps for CpuOps<'_> {
    fn with<R>(&mut self, f: impl FnOnce(&mut CpuOps<'_>) -> R) -> R {
        f(self)
    }
    fn with_ref<R>(&self, f: impl FnOnce(&CpuOps<'_>) -> R) -> R {
        f(self)
    }
}

impl AsCpuOps for CpuPass<'_, '_> {
    fn with<R>(&mut self, f: impl FnOnce(&mut CpuOps<'_>) -> R) -> R {
        f(&mut self.ops)
    }
    fn with_ref<R>(&self, f: impl FnOnce(&CpuOps<'_>) -> R) -> R {
        f(&self.ops)
    }
}

impl<'w, P: AsCpuOps> Ops<'w> for P {
    type T = Vec<f32>;
    type M = Mat;
    type V = Vec<f32>;

    fn pos0(&self) -> usize {
        self.with_ref(|this| this.seqs.first().map_or(0, |s| s.pos0))
    }

    fn alloc(&mut self, _label: &'static str, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn copy(&mut self, src: &Vec<f32>, at: usize, dst: &mut Vec<f32>, dst_at: usize, len: usize) -> Result<()> {
        dst[dst_at..dst_at + len].copy_from_slice(&src[at..at + len]);
        Ok(())
    }

    fn rmsnorm_at(
        &mut self,
        t: &mut Vec<f32>,
        at: usize,
        rows: usize,
        width: usize,
        stride: usize,
        w: &Vec<f32>,
        eps: f32,
    ) -> Result<()> {
        debug_assert_eq!(w.len(), width);
        if stride == width {
            rmsnorm_chunks(&mut t[at..at + rows * width], w, eps);
        } else {
            for i in 0..rows {
                rmsnorm_chunks(&mut t[at + i * stride..at + i * stride + width], w, eps);
            }
        }
        Ok(())
    }

    fn add(&mut self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) -> Result<()> {
        x[..len].iter_mut().zip(&y[..len]).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn add_bias(&mut self, t: &mut Vec<f32>, b: &Vec<f32>, len: usize, period: usize) -> Result<()> {
        for row in t[..len].chunks_exact_mut(period) {
            for (v, bi) in row.iter_mut().zip(b) {
                *v += bi;
            }
        }
        Ok(())
    }

    fn matmul(&mut self, jobs: &mut [(&Mat, &mut Vec<f32>)], x: &Vec<f32>, row0: usize, n: usize) -> Result<()> {
        let mut mats: Vec<MatJob> = jobs
            .iter_mut()
            .map(|(w, out)| MatJob { w, x: &x[row0 * w.cols..(row0 + n) * w.cols], n, out: &mut out[..n * w.rows] })
            .collect();
        matmul_many(&mut mats);
        Ok(())
    }

    fn matmul_at(
        &mut self,
        w: &Mat,
        x: &Vec<f32>,
        row0: usize,
        n: usize,
        out: &mut Vec<f32>,
        at: usize,
        stride: usize,
    ) -> Result<()> {
        let mut y = vec![0.0f32; n * w.rows];
        matmul(w, &x[row0 * w.cols..(row0 + n) * w.cols], n, &mut y);
        for (p, row) in y.chunks_exact(w.rows).enumerate() {
            out[at + p * stride..at + p * stride + w.rows].copy_from_slice(row);
        }
        Ok(())
    }

    fn clamp(&mut self, t: &mut Vec<f32>, len: usize, c: f32) -> Result<()> {
        t[..len].iter_mut().for_each(|v| *v = v.clamp(-c, c));
        Ok(())
    }

    fn split_gate(
        &mut self,
        qg: &Vec<f32>,
        n: usize,
        heads: usize,
        hd: usize,
        q: &mut Vec<f32>,
        gate: &mut Vec<f32>,
    ) -> Result<()> {
        split_gate(qg, n, heads, hd, q, gate);
        Ok(())
    }

    fn rope_at(
        &mut self,
        t: &mut Vec<f32>,
        n: usize,
        heads: usize,
        stride: usize,
        at: usize,
        interleaved: bool,
    ) -> Result<()> {
        self.with(|this| {
            let rot = this.rope.rotary_dim;
            let mut scratch = Vec::with_capacity(rot);
            for i in 0..n {
                for h in 0..heads {
                    let x = &mut t[at + (i * heads + h) * stride..][..rot];
                    if interleaved {
                        deinterleave(x, &mut scratch);
                    }
                    this.rope.apply(x, rot, &this.cos[i], &this.sin[i]);
                }
            }
            Ok(())
        })
    }

    fn attend(
        &mut self,
        l: usize,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        s: AttendShape,
        sinks: Option<&Vec<f32>>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.with(|this| {
            let (kvd, qd) = (s.n_kv_heads * s.head_dim, s.n_heads * s.head_dim);
            this.each_seq(s.n, |seq, r0, n, first| {
                let shape = AttendShape { n, pos0: seq.pos0, ..s };
                let cache = seq.cache(l, first)?;
                cache.append(&k[r0 * kvd..(r0 + n) * kvd], &v[r0 * kvd..(r0 + n) * kvd], kvd, kvd);
                let (q, out) = (&q[r0 * qd..(r0 + n) * qd], &mut out[r0 * qd..(r0 + n) * qd]);
                attend_cached(cache, q, shape, sinks.map(Vec::as_slice), out);
                Ok(())
            })
        })
    }

    fn gate_sigmoid(&mut self, x: &mut Vec<f32>, g: &Vec<f32>, len: usize) -> Result<()> {
        x[..len].iter_mut().zip(&g[..len]).for_each(|(c, g)| *c *= math::sigmoid(*g));
        Ok(())
    }

    fn delta_begin(&mut self, l: usize, c: &LinearAttnConfig, n: usize) -> Result<()> {
        self.with(|this| {
            this.each_seq(n, |seq, _, n, first| {
                let st = seq.cache(l, first)?.recurrent.get_or_insert_with(Default::default);
                st.ensure(c);
                if st.begin(n) {
                    st.snapshot();
                }
                Ok(())
            })
        })
    }

    fn delta_regroup(
        &mut self,
        c: &LinearAttnConfig,
        qkvz: &Vec<f32>,
        ba: &Vec<f32>,
        n: usize,
        mixed: &mut Vec<f32>,
        z: &mut Vec<f32>,
        bav: &mut Vec<f32>,
    ) -> Result<()> {
        deltanet::regroup(c, qkvz, ba, n, mixed, z, bav);
        Ok(())
    }

    fn delta_conv(
        &mut self,
        l: usize,
        c: &LinearAttnConfig,
        taps: &Vec<f32>,
        mixed: &mut Vec<f32>,
        n: usize,
    ) -> Result<()> {
        self.with(|this| {
            let cd = c.conv_dim();
            this.each_seq(n, |seq, r0, n, first| {
                let st = seq.delta_state(l, first)?;
                deltanet::conv_silu(c, taps, &mut mixed[r0 * cd..(r0 + n) * cd], n, &mut st.conv);
                Ok(())
            })
        })
    }

    fn delta_l2norm(&mut self, c: &LinearAttnConfig, mixed: &mut Vec<f32>, n: usize) -> Result<()> {
        deltanet::l2norm_qk(c, mixed, n);
        Ok(())
    }

    fn delta_gates(
        &mut self,
        c: &LinearAttnConfig,
        ba: &mut Vec<f32>,
        n: usize,
        neg_a: &Vec<f32>,
        dt_bias: &Vec<f32>,
    ) -> Result<()> {
        deltanet::gates(ba, n, c.n_v_heads, neg_a, dt_bias);
        Ok(())
    }

    fn delta_rule(
        &mut self,
        l: usize,
        c: &LinearAttnConfig,
        mixed: &Vec<f32>,
        ba: &Vec<f32>,
        n: usize,
        o: &mut Vec<f32>,
    ) -> Result<()> {
        self.with(|this| {
            let (cd, nv2, vd) = (c.conv_dim(), 2 * c.n_v_heads, c.value_dim());
            this.each_seq(n, |seq, r0, n, first| {
                let st = seq.delta_state(l, first)?;
                let (mixed, ba) = (&mixed[r0 * cd..(r0 + n) * cd], &ba[r0 * nv2..(r0 + n) * nv2]);
                deltanet::rule(c, mixed, ba, n, st, &mut o[r0 * vd..(r0 + n) * vd]);
                Ok(())
            })
        })
    }

    fn gate_silu(&mut self, x: &mut Vec<f32>, g: &Vec<f32>, len: usize) -> Result<()> {
        x[..len].iter_mut().zip(&g[..len]).for_each(|(c, g)| *c *= math::silu(*g));
        Ok(())
    }

    fn swiglu(&mut self, g: &mut Vec<f32>, u: &Vec<f32>, len: usize, act: Activation) -> Result<()> {
        act.apply_rows(&mut g[..len], &u[..len], crate::qdot::Simd::active() != crate::qdot::Simd::Scalar);
        Ok(())
    }

    fn gated_add(&mut self, y: &mut Vec<f32>, s: &Vec<f32>, g: &Vec<f32>, n: usize, hidden: usize) -> Result<()> {
        for p in 0..n {
            let k = math::sigmoid(g[p]);
            let dst = &mut y[p * hidden..(p + 1) * hidden];
            dst.iter_mut().zip(&s[p * hidden..(p + 1) * hidden]).for_each(|(d, v)| *d += k * v);
        }
        Ok(())
    }

    fn mla_absorb(
        &mut self,
        kv_b: &Mat,
        q: &Vec<f32>,
        n: usize,
        heads: usize,
        m: &MlaConfig,
        qc: &mut Vec<f32>,
    ) -> Result<()> {
        mla::absorb(kv_b, q, n, heads, m, qc);
        Ok(())
    }

    fn attend_mla(
        &mut self,
        l: usize,
        qc: &Vec<f32>,
        ckv: &Vec<f32>,
        s: AttendShape,
        m: &MlaConfig,
        ctx: &mut Vec<f32>,
    ) -> Result<()> {
        self.with(|this| {
            if this.rope.rotary_dim != m.qk_rope_head_dim {
                return Err(crate::error::Error::Invalid(format!(
                    "MLA: rope of {} dims for a rotary key of {}",
                    this.rope.rotary_dim, m.qk_rope_head_dim
                )));
            }
            let (nh, r, row) = (s.n_heads, m.kv_lora_rank, m.cache_width_at(l));
            let (qw, total) = (s.n_heads * s.head_dim, s.n);
            let batched = this.seqs.len() > 1;
            this.each_seq(total, |seq, r0, n, first| {
                let sel = match m.indexer_at(l) {
                    None => None,
                    Some(_) => Some(seq.selection.take().ok_or_else(|| {
                        crate::error::Error::Invalid(format!("layer {l}: sparse attention before any indexer ran"))
                    })?),
                };
                let shape = AttendShape { n, pos0: seq.pos0, ..s };
                let (qc, ckv) = (&qc[r0 * qw..(r0 + n) * qw], &ckv[r0 * row..(r0 + n) * row]);
                let cache = seq.cache(l, first)?;
                if batched {
                    // ctx is head-major over all rows: this sequence's rows go to each
                    // head's block.
                    let mut part = vec![0.0f32; nh * n * r];
                    mla::attend(cache, qc, ckv, row, shape, m, sel.as_ref(), &mut part);
                    for h in 0..nh {
                        let dst = &mut ctx[(h * total + r0) * r..(h * total + r0 + n) * r];
                        dst.copy_from_slice(&part[h * n * r..(h + 1) * n * r]);
                    }
                } else {
                    mla::attend(cache, qc, ckv, row, shape, m, sel.as_ref(), ctx);
                }
                // Kept for the "shared" layers after this one.
                seq.selection = sel;
                Ok(())
            })
        })
    }

    fn layernorm_at(
        &mut self,
        t: &mut Vec<f32>,
        at: usize,
        rows: usize,
        width: usize,
        stride: usize,
        w: &Vec<f32>,
        bias: &Vec<f32>,
        eps: f32,
    ) -> Result<()> {
        for i in 0..rows {
            dsa::layer_norm(&mut t[at + i * stride..at + i * stride + width], w, bias, eps);
        }
        Ok(())
    }

    async fn index_select(
        &mut self,
        l: usize,
        iq: &Vec<f32>,
        iw: &Vec<f32>,
        ckv: &Vec<f32>,
        at: usize,
        row: usize,
        s: IndexShape,
    ) -> Result<()> {
        self.with(|this| {
            let (hi, di) = (s.heads, s.head_dim);
            this.each_seq(s.n, |seq, r0, n, first| {
                let pos0 = seq.pos0;
                let cache = seq.cache(l, first)?;
                // The cache holds the sequence's first pos0 positions; its rows keep [rotary
                // key, indexer key] in `v` (the latent is `k`), the indexer key last.
                let cv = &cache.v;
                let vw = cv.len().checked_div(pos0).unwrap_or(0);
                if pos0 > 0 && vw < di {
                    return Err(crate::error::Error::Invalid(format!("layer {l}: the cache holds no indexer keys")));
                }
                let skip = vw.saturating_sub(di);
                let ckv = &ckv[r0 * row..(r0 + n) * row];
                let key = |j: usize| -> &[f32] {
                    match j < pos0 {
                        true => &cv[j * vw + skip..j * vw + skip + di],
                        false => &ckv[(j - pos0) * row + at..(j - pos0) * row + at + di],
                    }
                };
                let (iq, iw) = (&iq[r0 * hi * di..(r0 + n) * hi * di], &iw[r0 * hi..(r0 + n) * hi]);
                seq.selection = Some(dsa::select(iq, iw, IndexShape { n, pos0, ..s }, key));
                Ok(())
            })
        })
    }

    fn hc_weights(
        &mut self,
        mix: &Vec<f32>,
        base: &Vec<f32>,
        scale: &Vec<f32>,
        s: HcShape,
        head: bool,
        pre: &mut Vec<f32>,
        post: &mut Vec<f32>,
        comb: &mut Vec<f32>,
    ) -> Result<()> {
        v4::hc_weights(mix, base, scale, s, head, pre, post, comb);
        Ok(())
    }

    fn hc_collapse(&mut self, pre: &Vec<f32>, x: &Vec<f32>, s: HcShape, out: &mut Vec<f32>) -> Result<()> {
        v4::hc_collapse(pre, x, s, out);
        Ok(())
    }

    fn hc_expand(
        &mut self,
        x: &mut Vec<f32>,
        y: &Vec<f32>,
        post: &Vec<f32>,
        comb: &Vec<f32>,
        s: HcShape,
    ) -> Result<()> {
        crate::model::v4::hc::expand(x, y, post, comb, s.n, s.n_hc, s.hidden);
        Ok(())
    }

    fn copy_rows(
        &mut self,
        src: &Vec<f32>,
        src_at: usize,
        src_stride: usize,
        dst: &mut Vec<f32>,
        dst_at: usize,
        dst_stride: usize,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        for r in 0..rows {
            let (s, d) = (src_at + r * src_stride, dst_at + r * dst_stride);
            dst[d..d + width].copy_from_slice(&src[s..s + width]);
        }
        Ok(())
    }

    fn rope_tail(
        &mut self,
        t: &mut Vec<f32>,
        n: usize,
        heads: usize,
        stride: usize,
        compress: bool,
        inverse: bool,
    ) -> Result<()> {
        self.with(|this| v4::rope(this, t, n, heads, stride, compress, inverse))
    }

    fn v4_compress(
        &mut self,
        l: usize,
        index: bool,
        kv: &Vec<f32>,
        gate: &Vec<f32>,
        ape: &Vec<f32>,
        norm: &Vec<f32>,
        c: CompShape,
    ) -> Result<()> {
        self.with(|this| v4::compress(this, l, index, kv, gate, ape, norm, c))
    }

    fn v4_select(&mut self, l: usize, iq: &Vec<f32>, iw: &Vec<f32>, s: SelectShape) -> Result<()> {
        self.with(|this| v4::choose(this, l, iq, iw, s))
    }

    fn v4_attend(
        &mut self,
        l: usize,
        q: &Vec<f32>,
        kv: &Vec<f32>,
        sinks: &Vec<f32>,
        s: V4AttendShape,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.with(|this| v4::attention(this, l, q, kv, sinks, s, out))
    }

    async fn read(&mut self, mut t: Vec<f32>, len: usize) -> Result<Vec<f32>> {
        t.truncate(len);
        Ok(t)
    }
}

/// One CPU forward pass of [`Model`]: [`CpuOps`] over the session's caches, with the
/// model's weights and the expert-use hooks of `Model::forward_observed`.
pub(crate) struct CpuPass<'w, 'a> {
    pub(crate) ops: CpuOps<'a>,
    pub(crate) model: &'w Model,
    pub(crate) on_use: &'a mut dyn FnMut(usize, usize, usize),
    pub(crate) on_ffn_input: &'a mut dyn FnMut(usize, &[f32]),
}

impl<'w> CpuPass<'w, '_> {
    /// Decoder layer `l`: the model's, or past them its multi-token-prediction layer's.
    fn layer(&self, l: usize) -> &'w Layer {
        let m = self.model;
        match (m.layers.get(l), &m.mtp) {
            (Some(layer), _) => layer,
            (None, Some(mtp)) if l == mtp.index => &mtp.layer,
            // The graph asks only for layers the model has (n_layers, or the MTP's).
            _ => &m.layers[l],
        }
    }
}

impl<'w> Backend<'w> for CpuPass<'w, '_> {
    fn model(&self) -> &'w Model {
        self.model
    }

    fn norms(&self, l: usize) -> (&'w Vec<f32>, &'w Vec<f32>) {
        let layer = self.layer(l);
        (&layer.attn_norm, &layer.ffn_norm)
    }

    fn attn_opts(&self, l: usize) -> &'w AttnOpts {
        &self.layer(l).attn_opts
    }

    fn attn(&self, l: usize) -> Attn<'w, Mat, Vec<f32>> {
        match &self.layer(l).attn {
            AttnWeights::Gqa(g) => Attn::Gqa(g),
            AttnWeights::Mla(w) => Attn::Mla(w),
            AttnWeights::Linear(w) => Attn::Linear(w),
        }
    }

    fn final_norm(&self) -> &'w Vec<f32> {
        &self.model.final_norm
    }

    fn lm_head(&self) -> &'w Mat {
        &self.model.lm_head
    }

    fn embed(&mut self, ids: &[u32], x: &mut Vec<f32>) -> Result<()> {
        let h = self.model.cfg.hidden;
        for (i, &id) in ids.iter().enumerate() {
            self.model.embed.row_into(id as usize, &mut x[i * h..(i + 1) * h]);
        }
        Ok(())
    }

    fn ffn(&self, l: usize) -> Result<FfnRef<'w, Mat>> {
        let mlp = |e: &'w Expert| MlpRef { gate: &e.gate, up: &e.up, down: &e.down, inter: e.gate.rows };
        Ok(match &self.layer(l).ffn {
            Ffn::Dense(e) => FfnRef::Dense(mlp(e)),
            Ffn::Moe(block) => FfnRef::Moe {
                n_experts: block.router.rows,
                shared: block.shared.as_ref().map(|s| (mlp(&s.mlp), s.gate.as_ref())),
            },
        })
    }

    fn ffn_begin(&mut self, l: usize, xn: &Vec<f32>, n: usize) -> Result<()> {
        let m = self.model;
        (self.on_ffn_input)(l, &xn[..n * m.cfg.hidden]);
        if m.experts.lookahead_enabled() {
            if let Some(Ffn::Moe(next)) = m.layers.get(l + 1).map(|x| &x.ffn) {
                m.experts.lookahead(l + 1, &next.predict(xn, n));
            }
        }
        Ok(())
    }

    async fn route(&mut self, l: usize, xn: &Vec<f32>, n: usize) -> Result<Vec<Routing>> {
        self.moe(l).map(|block| block.routes(xn, n))
    }

    async fn experts(
        &mut self,
        l: usize,
        users: &[Vec<(usize, f32)>],
        xn: &Vec<f32>,
        n: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let block = self.moe(l)?;
        let on_use = &mut *self.on_use;
        block.routed(l, self.model.experts.as_ref(), users, xn, n, out, Some(&mut |e, count| on_use(l, e, count)))
    }

    fn v4(&self) -> Option<&'w V4Weights> {
        self.model.v4.as_deref()
    }

    async fn v4_moe(&mut self, l: usize, xn: &Vec<f32>, n: usize, ids: &[u32], out: &mut Vec<f32>) -> Result<()> {
        let m = self.model;
        let w = m.v4.as_deref().ok_or_else(|| crate::error::Error::Invalid("not a DeepSeek-V4 model".into()))?;
        let layer = w.layers.get(l).ok_or_else(|| crate::error::Error::Invalid(format!("no layer {l}")))?;
        (self.on_ffn_input)(l, xn);
        // The router lookahead (learned-router layers; a hash layer's experts were read
        // ahead when the pass began): the next layer's router on this layer's input.
        if m.experts.lookahead_enabled() {
            if let Some(next) = w.layers.get(l + 1).filter(|x| x.tid2eid.is_none()) {
                m.experts.lookahead(l + 1, &crate::model::v4::moe::predict(m, next, &xn[..n * m.cfg.hidden], n));
            }
        }
        let y = crate::model::v4::moe::moe(m, l, layer, xn, n, ids, &mut *self.on_use)?;
        out[..n * m.cfg.hidden].copy_from_slice(&y);
        Ok(())
    }
}

impl<'w> CpuPass<'w, '_> {
    /// Layer `l`'s MoE block.
    fn moe(&self, l: usize) -> Result<&'w MoeBlock> {
        match &self.layer(l).ffn {
            Ffn::Moe(block) => Ok(block),
            Ffn::Dense(_) => Err(crate::error::Error::Invalid(format!("layer {l} has no routed experts"))),
        }
    }
}

mod v4;

#[cfg(test)]
mod deltanet_tests;
#[cfg(test)]
mod dsa_bench;
#[cfg(test)]
mod mla_tests;
#[cfg(test)]
mod tests;
