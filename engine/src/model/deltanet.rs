//! Gated DeltaNet, the linear attention of qwen3_next and qwen3_5_moe (transformers'
//! `Qwen3NextGatedDeltaNet` and `Qwen3_5GatedDeltaNet`, the recurrent form
//! `torch_recurrent_gated_delta_rule`). For each new position:
//!
//! - the input projections ([`InProj`]): qwen3_next's `in_proj_qkvz x` and `in_proj_ba x`,
//!   grouped per key head g: q_g, k_g (k_head_dim each), v and z of the r = n_v_heads /
//!   n_k_heads value heads g*r..g*r+r, then b and a of those value heads; or qwen3_5_moe's
//!   `in_proj_qkv x` (every q, then every k, then every v), `in_proj_z x`, `in_proj_b x`,
//!   `in_proj_a x`; both mean the same q, k, v, z, b, a per head;
//! - a depthwise causal conv1d (kernel K, no bias) over the channels q|k|v, then SiLU; the
//!   last K - 1 inputs are kept as the conv window;
//! - q and k L2-normalised per head (x / sqrt(sum x^2 + 1e-6)), q scaled by k_head_dim^-0.5;
//!   beta = sigmoid(b), decay = exp(-exp(A_log) * softplus(a + dt_bias));
//! - per value head h (key head h / r), with the state S (k_head_dim x v_head_dim):
//!   S *= decay; delta = (v - S^T k) * beta; S += k delta^T; o = S^T q;
//! - o RMSNorm-ed per value head (a plain weight) times silu(z), then `out_proj`.
//!
//! Prefill runs the same recurrence token by token as decode, so a prompt fed at once and
//! fed token by token give the same bits. Every sum runs in one fixed order (ascending
//! index, no fused multiply-add: Rust never fuses), and exp/log come from
//! [`crate::math::exp`] and the pure-Rust `libm`, so native and wasm32 agree bit for bit.

use crate::error::{Error, Result};
use crate::format::tensors::TensorStore;
use crate::math;
use crate::model::config::LinearAttnConfig;
use crate::model::snapshots::Snapshots;
use crate::tensor::Mat;

/// A Gated DeltaNet layer's input projections, as the checkpoint stores them (the GPU
/// uploads the grouped form as the split one, its rows gathered).
pub enum InProj<M = Mat> {
    /// qwen3_next: `in_proj_qkvz` (2*key_dim + 2*value_dim, hidden): per key head q, k,
    /// v (r heads), z (r heads); `in_proj_ba` (2*n_v_heads, hidden): per key head b (r
    /// heads), a (r heads).
    Grouped { qkvz: M, ba: M },
    /// qwen3_5_moe: `in_proj_qkv` (conv_dim, hidden) in the conv's channel order (q of
    /// every key head, k, v of every value head), `in_proj_z` (value_dim, hidden),
    /// `in_proj_b` and `in_proj_a` (n_v_heads, hidden).
    Split { qkv: M, z: M, b: M, a: M },
}

/// One Gated DeltaNet layer's weights, as a backend's matrices `M` and vectors `V`; the
/// graph (`graph::deltanet`) runs them on either.
pub struct DeltaNetWeights<M = Mat, V = Vec<f32>> {
    pub in_proj: InProj<M>,
    /// (conv_dim, conv_kernel): taps of each channel, oldest input first.
    pub conv: V,
    /// (n_v_heads): -exp(A_log).
    pub neg_a: V,
    /// (n_v_heads)
    pub dt_bias: V,
    /// (v_head_dim): the gated RMSNorm's weight (not zero-centred).
    pub norm: V,
    /// (hidden, value_dim)
    pub out: M,
    pub cfg: LinearAttnConfig,
    pub eps: f32,
}

impl<M, V> DeltaNetWeights<M, V> {
    /// The same weights in another backend's form: `proj` converts the input projections,
    /// `m` and `v` one matrix and one vector, given their names.
    pub fn try_map<M2, V2>(
        &self,
        proj: impl Fn(&InProj<M>) -> Result<InProj<M2>>,
        m: impl Fn(&str, &M) -> Result<M2>,
        v: impl Fn(&str, &V) -> Result<V2>,
    ) -> Result<DeltaNetWeights<M2, V2>> {
        Ok(DeltaNetWeights {
            in_proj: proj(&self.in_proj)?,
            conv: v("conv", &self.conv)?,
            neg_a: v("neg_a", &self.neg_a)?,
            dt_bias: v("dt_bias", &self.dt_bias)?,
            norm: v("norm", &self.norm)?,
            out: m("out", &self.out)?,
            cfg: self.cfg.clone(),
            eps: self.eps,
        })
    }
}

/// What a Gated DeltaNet layer keeps between calls instead of a KV cache.
#[derive(Clone, Default)]
pub struct DeltaState {
    /// Positions absorbed.
    pub pos: usize,
    /// (conv_kernel - 1, conv_dim): the last inputs of the conv, oldest first.
    pub conv: Vec<f32>,
    /// (n_v_heads, k_head_dim, v_head_dim): the delta-rule matrices.
    pub s: Vec<f32>,
    /// (conv, s) at the start of recent multi-token calls, and where they ended.
    snapshots: Snapshots<(Vec<f32>, Vec<f32>)>,
}

impl DeltaState {
    /// Sized for a layer of shape `c` (emptied if it was not).
    pub fn ensure(&mut self, c: &LinearAttnConfig) {
        let (conv, s) = ((c.conv_kernel - 1) * c.conv_dim(), c.n_v_heads * c.k_head_dim * c.v_head_dim);
        if self.conv.len() != conv || self.s.len() != s {
            *self = DeltaState { pos: 0, conv: vec![0.0; conv], s: vec![0.0; s], ..Default::default() };
        }
    }

    /// Goes back to at most `positions` positions: unchanged if it holds no more, else the
    /// latest snapshot at or before `positions`, else the empty state. Returns the
    /// positions now held, which may be fewer than asked: a recurrent state cannot drop
    /// its last positions, so the caller feeds the difference again.
    pub fn rewind(&mut self, positions: usize) -> usize {
        if positions >= self.pos {
            return self.pos;
        }
        match self.snapshots.back_to(positions) {
            Some((pos, (conv, s))) => {
                self.pos = *pos;
                self.conv.clone_from(conv);
                self.s.clone_from(s);
            }
            None => {
                self.pos = 0;
                self.conv.iter_mut().for_each(|v| *v = 0.0);
                self.s.iter_mut().for_each(|v| *v = 0.0);
            }
        }
        self.pos
    }

    /// The positions [`DeltaState::rewind`]`(positions)` would leave, without going there.
    pub fn rewind_point(&self, positions: usize) -> usize {
        self.snapshots.point(self.pos, positions)
    }

    /// Keeps the snapshot after `pos` positions ([`Snapshots::pin`]).
    pub fn pin(&mut self, pos: usize) {
        self.snapshots.pin(pos);
    }

    /// Whether the coming passes verify drafts ([`Snapshots::verifying`]).
    pub fn verifying(&mut self, v: bool) {
        self.snapshots.verifying(v);
    }

    /// Floats its snapshots hold.
    pub fn snapshot_floats(&self) -> usize {
        self.snapshots.iter().map(|(_, (c, s))| c.len() + s.len()).sum()
    }

    /// Whether a call of `n` positions starts with a [`DeltaState::snapshot`]
    /// ([`Snapshots::begin`]).
    pub(crate) fn begin(&mut self, n: usize) -> bool {
        self.snapshots.begin(n)
    }

    /// The latest snapshot strictly between positions `from` and `to`: (its position, conv,
    /// s). A cache file's record of `from..to` is split there, so that the file keeps it
    /// (`model::kv::encode_record`).
    pub(crate) fn snapshot_between(&self, from: usize, to: usize) -> Option<(usize, &[f32], &[f32])> {
        self.snapshots.iter().rev().find(|s| from < s.0 && s.0 < to).map(|(p, (c, s))| (*p, &c[..], &s[..]))
    }

    /// The state after `pos` positions read back from a cache file's record: the state it
    /// held (an earlier record's end) becomes a snapshot, as it would have been where that
    /// record ended (the end of a prompt, or of a turn).
    pub(crate) fn advance_to(&mut self, pos: usize, conv: Vec<f32>, s: Vec<f32>) {
        self.snapshot();
        (self.pos, self.conv, self.s) = (pos, conv, s);
    }

    /// Its snapshots, oldest first: (position, conv, s) (a GPU session's upload from a
    /// cache file: `gpu::persist`).
    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
    pub(crate) fn snapshots(&self) -> impl Iterator<Item = (usize, &[f32], &[f32])> {
        self.snapshots.iter().map(|(p, (c, s))| (*p, &c[..], &s[..]))
    }

    /// Adds the state after `pos` positions as the newest snapshot (a GPU session's, read
    /// back: `gpu::persist`); the oldest goes past the two kept.
    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
    pub(crate) fn push_snapshot(&mut self, pos: usize, conv: Vec<f32>, s: Vec<f32>) {
        self.snapshots.push(pos, (conv, s));
    }

    /// Remembers the current state (at the start of a multi-token call: a prompt, a
    /// speculative batch) so that a later rewind to here costs no recomputation.
    pub(crate) fn snapshot(&mut self) {
        if self.snapshots.wants(self.pos) {
            // Into the buffers of the snapshot it pushes out, if any: no fresh pages to
            // fault in and zero per speculative step (the state is megabytes).
            let (mut conv, mut s) = self.snapshots.make_room().unwrap_or_default();
            conv.clone_from(&self.conv);
            s.clone_from(&self.s);
            self.snapshots.push(self.pos, (conv, s));
        }
    }
}

impl DeltaNetWeights {
    /// Loads `{prefix}.linear_attn.*` (prefix = "model.layers.{l}").
    pub fn load(s: &TensorStore, prefix: &str, hidden: usize, c: &LinearAttnConfig, eps: f32) -> Result<Self> {
        let p = format!("{prefix}.linear_attn");
        let (cd, k) = (c.conv_dim(), c.conv_kernel);
        let name = format!("{p}.conv1d.weight");
        let t = s.get(&name)?;
        if t.shape != [cd, 1, k] {
            return Err(Error::Shape { name, got: t.shape.clone(), want: vec![cd, 1, k] });
        }
        let conv = Mat::new(cd, k, t.dtype, t.bytes.clone())?.to_f32();
        let a_log = s.vector(&format!("{p}.A_log"), c.n_v_heads)?;
        let w = |name: &str, rows: usize| s.mat(&format!("{p}.{name}.weight"), rows, hidden);
        let in_proj = match c.split_in_proj {
            true => InProj::Split {
                qkv: w("in_proj_qkv", cd)?,
                z: w("in_proj_z", c.value_dim())?,
                b: w("in_proj_b", c.n_v_heads)?,
                a: w("in_proj_a", c.n_v_heads)?,
            },
            false => InProj::Grouped {
                qkvz: w("in_proj_qkvz", 2 * c.key_dim() + 2 * c.value_dim())?,
                ba: w("in_proj_ba", 2 * c.n_v_heads)?,
            },
        };
        Ok(DeltaNetWeights {
            in_proj,
            conv,
            // transformers: -self.A_log.float().exp()
            neg_a: a_log.iter().map(|&x| -math::exp(x)).collect(),
            dt_bias: s.vector(&format!("{p}.dt_bias"), c.n_v_heads)?,
            norm: s.vector(&format!("{p}.norm.weight"), c.v_head_dim)?,
            out: s.mat(&format!("{p}.out_proj.weight"), hidden, c.value_dim())?,
            cfg: c.clone(),
            eps,
        })
    }
}

/// qwen3_next's grouped projections (`qkvz` (n, 2*key_dim + 2*value_dim) and `ba` (n,
/// 2*n_v_heads), grouped per key head) in the conv's channel order: `mixed` (n, conv_dim)
/// q of every key head, k, v of every value head; `z` (n, value_dim); `bav` (n, 2*n_v_heads)
/// b of every value head, then a.
pub fn regroup(
    c: &LinearAttnConfig,
    qkvz: &[f32],
    ba: &[f32],
    n: usize,
    mixed: &mut [f32],
    z: &mut [f32],
    bav: &mut [f32],
) {
    let (kd, vd, cd) = (c.key_dim(), c.value_dim(), c.conv_dim());
    let (nk, nv, dk, dv) = (c.n_k_heads, c.n_v_heads, c.k_head_dim, c.v_head_dim);
    let r = nv / nk;
    let (wq, wb) = (2 * kd + 2 * vd, 2 * nv);
    let group = 2 * dk + 2 * r * dv;
    for t in 0..n {
        let src = &qkvz[t * wq..(t + 1) * wq];
        let m = &mut mixed[t * cd..(t + 1) * cd];
        for g in 0..nk {
            let s = &src[g * group..(g + 1) * group];
            m[g * dk..(g + 1) * dk].copy_from_slice(&s[..dk]);
            m[kd + g * dk..kd + (g + 1) * dk].copy_from_slice(&s[dk..2 * dk]);
            m[2 * kd + g * r * dv..2 * kd + (g + 1) * r * dv].copy_from_slice(&s[2 * dk..2 * dk + r * dv]);
            z[t * vd + g * r * dv..t * vd + (g + 1) * r * dv].copy_from_slice(&s[2 * dk + r * dv..]);
        }
        let src = &ba[t * wb..(t + 1) * wb];
        let dst = &mut bav[t * wb..(t + 1) * wb];
        for g in 0..nk {
            dst[g * r..(g + 1) * r].copy_from_slice(&src[g * 2 * r..g * 2 * r + r]);
            dst[nv + g * r..nv + (g + 1) * r].copy_from_slice(&src[g * 2 * r + r..(g + 1) * 2 * r]);
        }
    }
}

/// The gates in place: `ba` (n, 2*n_v_heads) b then a per position becomes beta =
/// sigmoid(b), then decay = exp(neg_a * softplus(a + dt_bias)).
pub fn gates(ba: &mut [f32], n: usize, nv: usize, neg_a: &[f32], dt_bias: &[f32]) {
    for row in ba[..n * 2 * nv].chunks_exact_mut(2 * nv) {
        let (b, a) = row.split_at_mut(nv);
        b.iter_mut().for_each(|v| *v = math::sigmoid(*v));
        for (h, v) in a.iter_mut().enumerate() {
            *v = math::exp(neg_a[h] * math::softplus(*v + dt_bias[h]));
        }
    }
}

/// The depthwise causal conv1d + SiLU over `mixed` (n, conv_dim) in place, with taps
/// `conv` (conv_dim, K), the window `win` (K - 1, conv_dim) holding the inputs before the
/// first position.
pub fn conv_silu(c: &LinearAttnConfig, conv: &[f32], mixed: &mut [f32], n: usize, win: &mut [f32]) {
    let (cd, k) = (c.conv_dim(), c.conv_kernel);
    let h = k - 1;
    let mut input = vec![0.0f32; k * cd];
    for t in 0..n {
        // input rows: the K - 1 previous inputs, then this position's.
        input[..h * cd].copy_from_slice(win);
        input[h * cd..].copy_from_slice(&mixed[t * cd..(t + 1) * cd]);
        let row = &mut mixed[t * cd..(t + 1) * cd];
        for (ch, o) in row.iter_mut().enumerate() {
            let w = &conv[ch * k..(ch + 1) * k];
            let mut acc = 0.0f32;
            for j in 0..k {
                acc += w[j] * input[j * cd + ch];
            }
            *o = math::silu(acc);
        }
        win.copy_from_slice(&input[cd..]);
    }
}

/// q and k of `mixed` (n, conv_dim): L2 norm per head (transformers' l2norm, eps 1e-6),
/// then q * k_head_dim^-0.5.
pub fn l2norm_qk(c: &LinearAttnConfig, mixed: &mut [f32], n: usize) {
    let (kd, cd, dk, nk) = (c.key_dim(), c.conv_dim(), c.k_head_dim, c.n_k_heads);
    let scale = (1.0 / (dk as f64).sqrt()) as f32;
    for t in 0..n {
        let m = &mut mixed[t * cd..(t + 1) * cd];
        for (i, head) in m[..2 * kd].chunks_exact_mut(dk).enumerate() {
            let inv = 1.0 / (math::sum_sq(head) + 1e-6).sqrt();
            if i < nk {
                head.iter_mut().for_each(|v| *v = (*v * inv) * scale);
            } else {
                head.iter_mut().for_each(|v| *v *= inv);
            }
        }
    }
}

/// The recurrence over n positions, one task per value head, advancing `state`; `o` (n,
/// value_dim) position-major.
pub fn rule(c: &LinearAttnConfig, mixed: &[f32], ba: &[f32], n: usize, state: &mut DeltaState, o: &mut [f32]) {
    let (kd, cd) = (c.key_dim(), c.conv_dim());
    let (nk, nv, dk, dv) = (c.n_k_heads, c.n_v_heads, c.k_head_dim, c.v_head_dim);
    let r = nv / nk;
    let mut oh = vec![0.0f32; nv * n * dv];
    let head = |h: usize, sh: &mut [f32], oh: &mut [f32]| {
        let g = h / r;
        let mut scratch = vec![0.0f32; 2 * dv];
        for t in 0..n {
            let m = &mixed[t * cd..(t + 1) * cd];
            let q = &m[g * dk..(g + 1) * dk];
            let k = &m[kd + g * dk..kd + (g + 1) * dk];
            let v = &m[2 * kd + h * dv..2 * kd + (h + 1) * dv];
            let (beta, dec) = (ba[t * 2 * nv + h], ba[t * 2 * nv + nv + h]);
            let ot = &mut oh[t * dv..(t + 1) * dv];
            delta_step(sh, q, k, v, dec, beta, ot, &mut scratch);
        }
    };
    let per_head = dk * dv;
    for_each_head(nv * per_head * n >= 1 << 15, &mut state.s, per_head, &mut oh, n * dv, head);
    state.pos += n;
    for t in 0..n {
        for h in 0..nv {
            o[t * nv * dv + h * dv..t * nv * dv + (h + 1) * dv]
                .copy_from_slice(&oh[(h * n + t) * dv..(h * n + t + 1) * dv]);
        }
    }
}

/// One step of the gated delta rule for one value head: `s` (dk, dv) decays, reads its
/// prediction of `v` at `k`, writes `beta` times the error, then answers `q` into `o`.
/// Each sum runs over the key dimension in ascending order. `scratch`: 2 * dv floats.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn delta_step(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    o: &mut [f32],
    scratch: &mut [f32],
) {
    let dv = v.len();
    let (mem, delta) = scratch.split_at_mut(dv);
    // kv_mem = (S * decay)^T k
    mem.iter_mut().for_each(|m| *m = 0.0);
    for (row, &ki) in s.chunks_exact_mut(dv).zip(k) {
        for (sv, m) in row.iter_mut().zip(mem.iter_mut()) {
            *sv *= decay;
            *m += *sv * ki;
        }
    }
    // delta = (v - kv_mem) * beta; S += k delta^T; o = S^T q
    for ((d, vv), m) in delta.iter_mut().zip(v).zip(mem.iter()) {
        *d = (vv - m) * beta;
    }
    o.iter_mut().for_each(|x| *x = 0.0);
    for ((row, &ki), &qi) in s.chunks_exact_mut(dv).zip(k).zip(q) {
        for ((sv, d), ov) in row.iter_mut().zip(delta.iter()).zip(o.iter_mut()) {
            *sv += ki * d;
            *ov += *sv * qi;
        }
    }
}

/// Runs `f(h, state_h, out_h)` for every head: `state` in chunks of `sc`, `out` in chunks
/// of `oc`, in parallel when `parallel` and the engine has threads (in the browser with
/// the calling worker taking part: `par::joined`). Heads are independent, so the bits
/// do not depend on the schedule.
fn for_each_head<F>(parallel: bool, state: &mut [f32], sc: usize, out: &mut [f32], oc: usize, f: F)
where
    F: Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
{
    #[cfg(feature = "parallel")]
    if parallel && sc > 0 && oc > 0 {
        use rayon::prelude::*;
        let heads = (state.len() / sc).min(out.len() / oc);
        if heads * sc == state.len() && heads * oc == out.len() {
            let (sp, op) = (crate::par::OutPtr(state.as_mut_ptr()), crate::par::OutPtr(out.as_mut_ptr()));
            // SAFETY: task h touches only head h's chunk of `state` and of `out`, both of
            // which outlive the region.
            let body = |h: usize| unsafe { f(h, sp.slice(h * sc, sc), op.slice(h * oc, oc)) };
            if crate::par::joined(heads, &body) {
                return;
            }
        }
        state.par_chunks_mut(sc).zip(out.par_chunks_mut(oc)).enumerate().for_each(|(h, (s, o))| f(h, s, o));
        return;
    }
    let _ = parallel;
    state.chunks_mut(sc).zip(out.chunks_mut(oc)).enumerate().for_each(|(h, (s, o))| f(h, s, o));
}
