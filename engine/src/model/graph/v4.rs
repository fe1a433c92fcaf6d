//! DeepSeek-V4's forward pass over the graph's operations (hyper-connections, the
//! compressed sparse attention), written once for every backend.

use super::*;

/// DeepSeek-V4's forward pass ([`crate::model::v4`]): [`v4_layers`], then
/// [`v4_head`] over the rows whose logits are asked for (every row with `hidden`) -> head.
pub(super) async fn v4_forward<'w, B: Backend<'w>>(
    b: &mut B,
    w: &'w V4Weights<B::M, B::V>,
    ids: &[u32],
    which: Logits,
    hidden: bool,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let c = &b.model().cfg;
    let (n, h) = (ids.len(), c.hidden);
    let x = v4_layers(b, w, ids).await?;
    let first = if hidden || which == Logits::All { 0 } else { n - 1 };
    let rows_in = n - first;
    let hn = v4_head(b, w, &x, &(first..n).collect::<Vec<_>>())?;
    let rows = if which == Logits::All { n } else { 1 };
    let mut logits = b.alloc("logits", rows * c.vocab)?;
    b.matmul(&mut [(b.lm_head(), &mut logits)], &hn, rows_in - rows, rows)?;
    let logits = b.read(logits, rows * c.vocab).await?;
    let states = if hidden { b.read(hn, n * h).await? } else { Vec::new() };
    Ok((logits, states))
}

/// DeepSeek-V4's layers over `ids`: the embedding into `hc_mult` equal streams -> for
/// each layer [hyper-connection -> RMSNorm -> attention -> expand, hyper-connection ->
/// RMSNorm -> MoE -> expand]; the streams (n, hc_mult * hidden).
pub(super) async fn v4_layers<'w, B: Backend<'w>>(
    b: &mut B,
    w: &'w V4Weights<B::M, B::V>,
    ids: &[u32],
) -> Result<B::T> {
    let c = &b.model().cfg;
    let Some(v4) = c.v4.as_deref() else {
        return Err(crate::error::Error::Invalid("DeepSeek-V4 weights without its config".into()));
    };
    let (n, h, nhc) = (ids.len(), c.hidden, v4.hc_mult);
    let s = HcShape { n, n_hc: nhc, hidden: h, iters: v4.sinkhorn_iters, eps: v4.hc_eps };
    // The hash layers' experts follow from the ids alone: their reads start now, before
    // the first layer (exact, not the router lookahead's guess; `LookaheadStats::known`).
    let (k, ne) = (c.router.top_k, c.router.n_experts);
    for (l, lw) in w.layers.iter().enumerate() {
        if let Some(t) = &lw.tid2eid {
            b.model().experts.known(l, &crate::model::v4::moe::hash_experts(t, ids, k, ne));
        }
    }
    let mut e = b.alloc("v4.embed", n * h)?;
    b.embed(ids, &mut e)?;
    let mut x = b.alloc("v4.x", n * nhc * h)?;
    for j in 0..nhc {
        b.copy_rows(&e, 0, h, &mut x, j * h, nhc * h, n, h)?;
    }
    for (l, lw) in w.layers.iter().enumerate() {
        let (mut a, post, comb) = hc_pre(b, &lw.attn_hc, w, &x, s, c.rms_eps)?;
        b.rmsnorm(&mut a, n, h, &lw.attn_norm, c.rms_eps)?;
        let mut y = b.alloc("v4.y", n * h)?;
        v4_attention(b, l, &lw.attn, &a, n, &mut y)?;
        b.hc_expand(&mut x, &y, &post, &comb, s)?;
        let (mut f, post, comb) = hc_pre(b, &lw.ffn_hc, w, &x, s, c.rms_eps)?;
        b.rmsnorm(&mut f, n, h, &lw.ffn_norm, c.rms_eps)?;
        b.v4_moe(l, &f, n, ids, &mut y).await?;
        b.hc_expand(&mut x, &y, &post, &comb, s)?;
    }
    Ok(x)
}

/// The hyper-head and the final RMSNorm of the streams `x` at `rows` (in that order):
/// (rows, hidden). Each row is computed from its streams alone, so a row's bits do not
/// depend on the others asked with it.
pub(super) fn v4_head<'w, B: Backend<'w>>(
    b: &mut B,
    w: &'w V4Weights<B::M, B::V>,
    x: &B::T,
    rows: &[usize],
) -> Result<B::T> {
    let c = &b.model().cfg;
    let Some(v4) = c.v4.as_deref() else {
        return Err(crate::error::Error::Invalid("DeepSeek-V4 weights without its config".into()));
    };
    let (k, h, nhc) = (rows.len(), c.hidden, v4.hc_mult);
    let hs = HcShape { n: k, n_hc: nhc, hidden: h, iters: v4.sinkhorn_iters, eps: v4.hc_eps };
    let rw = nhc * h;
    // The rows' streams, a copy per run of consecutive rows.
    let gather = |b: &mut B, label: &'static str| -> Result<B::T> {
        let mut t = b.alloc(label, k * rw)?;
        let mut j = 0;
        while j < k {
            let run = rows[j..].iter().enumerate().take_while(|&(i, &r)| r == rows[j] + i).count();
            b.copy(x, rows[j] * rw, &mut t, j * rw, run * rw)?;
            j += run;
        }
        Ok(t)
    };
    let mut xf = gather(b, "v4.xf")?;
    b.rmsnorm(&mut xf, k, rw, &w.hc_ones, c.rms_eps)?;
    let mut mix = b.alloc("v4.mix", k * nhc)?;
    b.matmul(&mut [(&w.head_fn, &mut mix)], &xf, 0, k)?;
    let (mut pre, mut none_a, mut none_b) = (b.alloc("v4.pre", k * nhc)?, b.alloc("v4.p", 1)?, b.alloc("v4.c", 1)?);
    b.hc_weights(&mix, &w.head_base, &w.head_scale, hs, true, &mut pre, &mut none_a, &mut none_b)?;
    let xs = gather(b, "v4.xs")?;
    let mut hn = b.alloc("hn", k * h)?;
    b.hc_collapse(&pre, &xs, hs, &mut hn)?;
    b.rmsnorm(&mut hn, k, h, b.final_norm(), c.rms_eps)?;
    Ok(hn)
}

/// A hyper-connection before a block: the streams `x` RMS-normalised as one vector per
/// position, mixed by `fn`, into the weights; returns the collapsed input, post and comb.
fn hc_pre<'w, B: Ops<'w>>(
    b: &mut B,
    hc: &'w HyperConnection<B::M, B::V>,
    w: &'w V4Weights<B::M, B::V>,
    x: &B::T,
    s: HcShape,
    rms_eps: f32,
) -> Result<(B::T, B::T, B::T)> {
    let (n, nhc, h) = (s.n, s.n_hc, s.hidden);
    let mut xf = b.alloc("v4.xf", n * nhc * h)?;
    b.copy(x, 0, &mut xf, 0, n * nhc * h)?;
    b.rmsnorm(&mut xf, n, nhc * h, &w.hc_ones, rms_eps)?;
    let mut mix = b.alloc("v4.mix", n * (2 + nhc) * nhc)?;
    b.matmul(&mut [(&hc.fn_, &mut mix)], &xf, 0, n)?;
    let mut pre = b.alloc("v4.pre", n * nhc)?;
    let mut post = b.alloc("v4.post", n * nhc)?;
    let mut comb = b.alloc("v4.comb", n * nhc * nhc)?;
    b.hc_weights(&mix, &hc.base, &hc.scale, s, false, &mut pre, &mut post, &mut comb)?;
    let mut out = b.alloc("v4.in", n * h)?;
    b.hc_collapse(&pre, x, s, &mut out)?;
    Ok((out, post, comb))
}

/// DeepSeek-V4's attention of `xn` (n, hidden) into `out` (n, hidden), layer `l`: q-LoRA
/// (q_a, RMSNorm, q_b, the per-head norm without weight), the shared key = value head
/// (kv_proj, RMSNorm), RoPE of both tails (the compress rope on compressed layers), the
/// compressors and the indexer's choice, the attention with sinks, the output's tail
/// rotated back, and the grouped low-rank output projection.
fn v4_attention<'w, B: Backend<'w>>(
    b: &mut B,
    l: usize,
    w: &'w V4Attention<B::M, B::V>,
    xn: &B::T,
    n: usize,
    out: &mut B::T,
) -> Result<()> {
    let c = &b.model().cfg;
    let Some(v4) = c.v4.as_deref() else {
        return Err(crate::error::Error::Invalid("DeepSeek-V4 weights without its config".into()));
    };
    let (nh, hd, eps) = (c.n_heads, c.head_dim, c.rms_eps);
    let kind = v4.layers[l];
    let compressed = kind != V4Attn::Sliding;
    let qr = v4.q_lora_rank;
    let mut qa = b.alloc("v4.qa", n * qr)?;
    b.matmul(&mut [(&w.q_a, &mut qa)], xn, 0, n)?;
    b.rmsnorm(&mut qa, n, qr, &w.q_a_norm, eps)?;
    let mut q = b.alloc("v4.q", n * nh * hd)?;
    b.matmul(&mut [(&w.q_b, &mut q)], &qa, 0, n)?;
    b.rmsnorm(&mut q, n * nh, hd, &w.ones, eps)?;
    b.rope_tail(&mut q, n, nh, hd, compressed, false)?;
    let mut kv = b.alloc("v4.kv", n * hd)?;
    b.matmul(&mut [(&w.kv, &mut kv)], xn, 0, n)?;
    b.rmsnorm(&mut kv, n, hd, &w.kv_norm, eps)?;
    b.rope_tail(&mut kv, n, 1, hd, compressed, false)?;
    let rate = v4.rate_of(kind);
    if let (Some(cw), Some(rate)) = (&w.comp, rate) {
        let overlap = kind == V4Attn::Csa;
        let width = if overlap { 2 * hd } else { hd };
        let (mut ck, mut cg) = (b.alloc("v4.ckv", n * width)?, b.alloc("v4.cgate", n * width)?);
        b.matmul(&mut [(&cw.kv, &mut ck), (&cw.gate, &mut cg)], xn, 0, n)?;
        let shape = CompShape { n, dim: hd, rate, overlap, rms_eps: eps };
        b.v4_compress(l, false, &ck, &cg, &cw.ape, &cw.norm, shape)?;
    }
    if let Some(ix) = &w.indexer {
        let (hi, di) = (v4.index_heads, v4.index_head_dim);
        let (mut ik, mut ig) = (b.alloc("v4.ikv", n * 2 * di)?, b.alloc("v4.igate", n * 2 * di)?);
        b.matmul(&mut [(&ix.comp.kv, &mut ik), (&ix.comp.gate, &mut ig)], xn, 0, n)?;
        let shape = CompShape { n, dim: di, rate: v4.csa_rate, overlap: true, rms_eps: eps };
        b.v4_compress(l, true, &ik, &ig, &ix.comp.ape, &ix.comp.norm, shape)?;
        let mut iq = b.alloc("v4.iq", n * hi * di)?;
        b.matmul(&mut [(&ix.q_b, &mut iq)], &qa, 0, n)?;
        b.rope_tail(&mut iq, n, hi, di, true, false)?;
        let mut iw = b.alloc("v4.iw", n * hi)?;
        b.matmul(&mut [(&ix.weights, &mut iw)], xn, 0, n)?;
        let shape = SelectShape { n, pos0: b.pos0(), heads: hi, head_dim: di, topk: v4.index_topk, rate: v4.csa_rate };
        b.v4_select(l, &iq, &iw, shape)?;
    }
    let shape = V4AttendShape {
        n,
        pos0: b.pos0(),
        heads: nh,
        head_dim: hd,
        window: v4.window,
        rate,
        sparse: kind == V4Attn::Csa,
        scale: c.attn_scale,
    };
    let mut ctx = b.alloc("v4.ctx", n * nh * hd)?;
    b.v4_attend(l, &q, &kv, &w.sinks, shape, &mut ctx)?;
    b.rope_tail(&mut ctx, n, nh, hd, compressed, true)?;
    // Group g: its heads' n rows through o_a's block g, side by side in `mid`.
    let (g, r) = (v4.o_groups, v4.o_lora_rank);
    let gw = nh * hd / g;
    let mut mid = b.alloc("v4.mid", n * g * r)?;
    let mut xg = b.alloc("v4.group", n * gw)?;
    for (gi, oa) in w.o_a.iter().enumerate() {
        b.copy_rows(&ctx, gi * gw, nh * hd, &mut xg, 0, gw, n, gw)?;
        b.matmul_at(oa, &xg, 0, n, &mut mid, gi * r, g * r)?;
    }
    b.matmul(&mut [(&w.o_b, out)], &mid, 0, n)
}
