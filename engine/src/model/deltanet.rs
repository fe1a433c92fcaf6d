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
use crate::kernels::{matmul_many, MatJob};
use crate::math;
use crate::model::config::LinearAttnConfig;
use crate::tensor::Mat;

/// A Gated DeltaNet layer's input projections, as the checkpoint stores them.
pub enum InProj {
    /// qwen3_next: `in_proj_qkvz` (2*key_dim + 2*value_dim, hidden): per key head q, k,
    /// v (r heads), z (r heads); `in_proj_ba` (2*n_v_heads, hidden): per key head b (r
    /// heads), a (r heads).
    Grouped { qkvz: Mat, ba: Mat },
    /// qwen3_5_moe: `in_proj_qkv` (conv_dim, hidden) in the conv's channel order (q of
    /// every key head, k, v of every value head), `in_proj_z` (value_dim, hidden),
    /// `in_proj_b` and `in_proj_a` (n_v_heads, hidden).
    Split { qkv: Mat, z: Mat, b: Mat, a: Mat },
}

/// One Gated DeltaNet layer's weights.
pub struct DeltaNetWeights {
    pub in_proj: InProj,
    /// (conv_dim, conv_kernel): taps of each channel, oldest input first.
    pub conv: Vec<f32>,
    /// (n_v_heads): -exp(A_log).
    pub neg_a: Vec<f32>,
    /// (n_v_heads)
    pub dt_bias: Vec<f32>,
    /// (v_head_dim): the gated RMSNorm's weight (not zero-centred).
    pub norm: Vec<f32>,
    /// (hidden, value_dim)
    pub out: Mat,
    pub cfg: LinearAttnConfig,
    pub eps: f32,
}

/// A snapshot of one layer's recurrent state after `pos` positions.
#[derive(Clone)]
struct Snapshot {
    pos: usize,
    conv: Vec<f32>,
    s: Vec<f32>,
}

/// Snapshots kept per layer (see [`DeltaState::rewind`]).
const MAX_SNAPSHOTS: usize = 2;

/// What a Gated DeltaNet layer keeps between calls instead of a KV cache.
#[derive(Clone, Default)]
pub struct DeltaState {
    /// Positions absorbed.
    pub pos: usize,
    /// (conv_kernel - 1, conv_dim): the last inputs of the conv, oldest first.
    pub conv: Vec<f32>,
    /// (n_v_heads, k_head_dim, v_head_dim): the delta-rule matrices.
    pub s: Vec<f32>,
    /// States at the start of recent multi-token calls, oldest first.
    snapshots: Vec<Snapshot>,
}

impl DeltaState {
    fn ensure(&mut self, c: &LinearAttnConfig) {
        let (conv, s) = ((c.conv_kernel - 1) * c.conv_dim(), c.n_v_heads * c.k_head_dim * c.v_head_dim);
        if self.conv.len() != conv || self.s.len() != s {
            *self = DeltaState { pos: 0, conv: vec![0.0; conv], s: vec![0.0; s], snapshots: Vec::new() };
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
        self.snapshots.retain(|s| s.pos <= positions);
        match self.snapshots.last() {
            Some(snap) => {
                self.pos = snap.pos;
                self.conv.clone_from(&snap.conv);
                self.s.clone_from(&snap.s);
            }
            None => {
                self.pos = 0;
                self.conv.iter_mut().for_each(|v| *v = 0.0);
                self.s.iter_mut().for_each(|v| *v = 0.0);
            }
        }
        self.pos
    }

    /// Remembers the current state (at the start of a multi-token call: a prompt, a
    /// speculative batch) so that a later rewind to here costs no recomputation.
    fn snapshot(&mut self) {
        if self.pos == 0 || self.snapshots.last().is_some_and(|s| s.pos == self.pos) {
            return;
        }
        if self.snapshots.len() == MAX_SNAPSHOTS {
            self.snapshots.remove(0);
        }
        self.snapshots.push(Snapshot { pos: self.pos, conv: self.conv.clone(), s: self.s.clone() });
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

    /// The layer on `n` new positions of `x` (n, hidden) -> `out` (n, hidden), advancing
    /// `state` by those positions.
    pub fn forward(&self, x: &[f32], n: usize, state: &mut DeltaState, out: &mut [f32]) {
        let c = &self.cfg;
        state.ensure(c);
        if n > 1 {
            state.snapshot();
        }
        let (kd, vd, cd) = (c.key_dim(), c.value_dim(), c.conv_dim());
        let (nk, nv, dk, dv) = (c.n_k_heads, c.n_v_heads, c.k_head_dim, c.v_head_dim);
        let r = nv / nk;
        // The conv input q|k|v (n, conv_dim), z (n, value_dim), and b and a (n, n_v_heads)
        // per value head; each element one dot product of a weight row, whatever the layout.
        let mut mixed = vec![0.0f32; n * cd];
        let mut z = vec![0.0f32; n * vd];
        let mut b = vec![0.0f32; n * nv];
        let mut a = vec![0.0f32; n * nv];
        match &self.in_proj {
            InProj::Split { qkv, z: wz, b: wb, a: wa } => matmul_many(&mut [
                MatJob { w: qkv, x, n, out: &mut mixed },
                MatJob { w: wz, x, n, out: &mut z },
                MatJob { w: wb, x, n, out: &mut b },
                MatJob { w: wa, x, n, out: &mut a },
            ]),
            InProj::Grouped { qkvz: wqkvz, ba: wba } => {
                let (wq, wb) = (wqkvz.rows, wba.rows);
                let mut qkvz = vec![0.0f32; n * wq];
                let mut ba = vec![0.0f32; n * wb];
                matmul_many(&mut [MatJob { w: wqkvz, x, n, out: &mut qkvz }, MatJob { w: wba, x, n, out: &mut ba }]);
                // Regroup per position from the key-head groups.
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
                    for g in 0..nk {
                        b[t * nv + g * r..t * nv + (g + 1) * r].copy_from_slice(&src[g * 2 * r..g * 2 * r + r]);
                        a[t * nv + g * r..t * nv + (g + 1) * r].copy_from_slice(&src[g * 2 * r + r..(g + 1) * 2 * r]);
                    }
                }
            }
        }
        // beta and decay (n, n_v_heads).
        let beta: Vec<f32> = b.iter().map(|&v| math::sigmoid(v)).collect();
        let decay: Vec<f32> = a
            .iter()
            .enumerate()
            .map(|(i, &v)| math::exp(self.neg_a[i % nv] * softplus(v + self.dt_bias[i % nv])))
            .collect();

        self.conv_silu(&mut mixed, n, &mut state.conv);

        // q and k: L2 norm per head (transformers' l2norm, eps 1e-6), then q * k_head_dim^-0.5.
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

        // The recurrence, one task per value head over all n positions; o (n_v_heads, n, dv).
        let mut o = vec![0.0f32; nv * n * dv];
        let head = |h: usize, sh: &mut [f32], oh: &mut [f32]| {
            let g = h / r;
            let mut scratch = vec![0.0f32; 2 * dv];
            for t in 0..n {
                let m = &mixed[t * cd..(t + 1) * cd];
                let q = &m[g * dk..(g + 1) * dk];
                let k = &m[kd + g * dk..kd + (g + 1) * dk];
                let v = &m[2 * kd + h * dv..2 * kd + (h + 1) * dv];
                let (dec, b) = (decay[t * nv + h], beta[t * nv + h]);
                let ot = &mut oh[t * dv..(t + 1) * dv];
                delta_step(sh, q, k, v, dec, b, ot, &mut scratch);
            }
        };
        let per_head = dk * dv;
        for_each_head(nv * per_head * n >= 1 << 15, &mut state.s, per_head, &mut o, n * dv, head);
        state.pos += n;

        // Gated RMSNorm per (position, value head), back to (n, value_dim), then out_proj.
        let mut y = vec![0.0f32; n * vd];
        for t in 0..n {
            for h in 0..nv {
                let src = &o[(h * n + t) * dv..(h * n + t + 1) * dv];
                let zh = &z[t * vd + h * dv..t * vd + (h + 1) * dv];
                let dst = &mut y[t * vd + h * dv..t * vd + (h + 1) * dv];
                let inv = 1.0 / (math::sum_sq(src) / dv as f32 + self.eps).sqrt();
                for (((d, s), w), zz) in dst.iter_mut().zip(src).zip(&self.norm).zip(zh) {
                    // transformers: weight * (x * rsqrt(var + eps)), then * silu(z).
                    *d = (w * (s * inv)) * math::silu(*zz);
                }
            }
        }
        crate::kernels::matmul(&self.out, &y, n, out);
    }

    /// The depthwise causal conv1d + SiLU over `mixed` (n, conv_dim) in place, the window
    /// `win` (K - 1, conv_dim) holding the inputs before the first position.
    fn conv_silu(&self, mixed: &mut [f32], n: usize, win: &mut [f32]) {
        let (cd, k) = (self.cfg.conv_dim(), self.cfg.conv_kernel);
        let h = k - 1;
        let mut input = vec![0.0f32; k * cd];
        for t in 0..n {
            // input rows: the K - 1 previous inputs, then this position's.
            input[..h * cd].copy_from_slice(win);
            input[h * cd..].copy_from_slice(&mixed[t * cd..(t + 1) * cd]);
            let row = &mut mixed[t * cd..(t + 1) * cd];
            for (ch, o) in row.iter_mut().enumerate() {
                let w = &self.conv[ch * k..(ch + 1) * k];
                let mut acc = 0.0f32;
                for j in 0..k {
                    acc += w[j] * input[j * cd + ch];
                }
                *o = math::silu(acc);
            }
            win.copy_from_slice(&input[cd..]);
        }
    }
}

/// softplus(x) = log(1 + e^x), x itself above 20 (torch's threshold); `libm` so every
/// target gives the same bits.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        libm::log1pf(math::exp(x))
    }
}

/// One step of the gated delta rule for one value head: `s` (dk, dv) decays, reads its
/// prediction of `v` at `k`, writes `beta` times the error, then answers `q` into `o`.
/// Each sum runs over the key dimension in ascending order. `scratch`: 2 * dv floats.
#[allow(clippy::too_many_arguments)]
#[inline]
fn delta_step(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_vec(len: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5) * 2.0 * scale
            })
            .collect()
    }

    fn layer() -> DeltaNetWeights {
        let c = LinearAttnConfig {
            n_k_heads: 2,
            n_v_heads: 4,
            k_head_dim: 6,
            v_head_dim: 5,
            conv_kernel: 3,
            layers: vec![true],
            split_in_proj: false,
        };
        let h = 11;
        let m = |rows: usize, cols: usize, seed| Mat::from_f32(rows, cols, &rand_vec(rows * cols, seed, 0.5)).unwrap();
        DeltaNetWeights {
            in_proj: InProj::Grouped {
                qkvz: m(2 * c.key_dim() + 2 * c.value_dim(), h, 1),
                ba: m(2 * c.n_v_heads, h, 2),
            },
            conv: rand_vec(c.conv_dim() * c.conv_kernel, 3, 0.7),
            neg_a: rand_vec(c.n_v_heads, 4, 0.5).iter().map(|x| -math::exp(x - 1.0)).collect(),
            dt_bias: rand_vec(c.n_v_heads, 5, 0.5),
            norm: rand_vec(c.v_head_dim, 6, 0.3).iter().map(|x| x + 1.0).collect(),
            out: m(h, c.value_dim(), 7),
            cfg: c,
            eps: 1e-6,
        }
    }

    #[test]
    fn prefill_equals_token_by_token_bit_for_bit() {
        let w = layer();
        let n = 9;
        let x = rand_vec(n * 11, 8, 1.0);
        let mut s1 = DeltaState::default();
        let mut all = vec![0.0; n * 11];
        w.forward(&x, n, &mut s1, &mut all);
        let mut s2 = DeltaState::default();
        let mut inc = Vec::new();
        let mut y = vec![0.0; 3 * 11];
        w.forward(&x[..33], 3, &mut s2, &mut y);
        inc.extend_from_slice(&y);
        for t in 3..n {
            let mut y = vec![0.0; 11];
            w.forward(&x[t * 11..(t + 1) * 11], 1, &mut s2, &mut y);
            inc.extend_from_slice(&y);
        }
        assert_eq!(all, inc);
        assert_eq!((s1.pos, &s1.s, &s1.conv), (s2.pos, &s2.s, &s2.conv));
        assert!(all.iter().all(|v| v.is_finite()) && all.iter().any(|v| v.abs() > 1e-3));
    }

    /// qwen3_5_moe's separate projections hold the same rows as qwen3_next's grouped ones,
    /// reordered: the layer gives the same bits either way.
    #[test]
    fn split_projections_equal_grouped_ones_bit_for_bit() {
        let w = layer();
        let c = w.cfg.clone();
        let (nk, r, dk, dv) = (c.n_k_heads, c.n_v_heads / c.n_k_heads, c.k_head_dim, c.v_head_dim);
        let InProj::Grouped { qkvz, ba } = &w.in_proj else { panic!("layer() is grouped") };
        let rows = |m: &Mat, idx: Vec<usize>| {
            let f = m.to_f32();
            let data: Vec<f32> = idx.iter().flat_map(|&i| f[i * m.cols..(i + 1) * m.cols].to_vec()).collect();
            Mat::from_f32(idx.len(), m.cols, &data).unwrap()
        };
        let group = 2 * dk + 2 * r * dv;
        let per = |start: usize, len: usize| (0..nk).flat_map(move |g| g * group + start..g * group + start + len);
        let split = DeltaNetWeights {
            in_proj: InProj::Split {
                qkv: rows(qkvz, per(0, dk).chain(per(dk, dk)).chain(per(2 * dk, r * dv)).collect()),
                z: rows(qkvz, per(2 * dk + r * dv, r * dv).collect()),
                b: rows(ba, (0..nk).flat_map(|g| g * 2 * r..g * 2 * r + r).collect()),
                a: rows(ba, (0..nk).flat_map(|g| g * 2 * r + r..g * 2 * r + 2 * r).collect()),
            },
            conv: w.conv.clone(),
            neg_a: w.neg_a.clone(),
            dt_bias: w.dt_bias.clone(),
            norm: w.norm.clone(),
            out: w.out.clone(),
            cfg: LinearAttnConfig { split_in_proj: true, ..c },
            eps: w.eps,
        };
        let n = 7;
        let x = rand_vec(n * 11, 12, 1.0);
        let (mut s1, mut s2) = (DeltaState::default(), DeltaState::default());
        let (mut y1, mut y2) = (vec![0.0; n * 11], vec![0.0; n * 11]);
        w.forward(&x, n, &mut s1, &mut y1);
        split.forward(&x, n, &mut s2, &mut y2);
        assert_eq!(y1, y2);
        assert_eq!((&s1.s, &s1.conv), (&s2.s, &s2.conv));
        assert!(y1.iter().any(|v| v.abs() > 1e-3));
    }

    /// The recurrence against transformers' formulation in f64: decay the state, read,
    /// write beta times the error, answer the query.
    #[test]
    fn delta_step_matches_the_reference_formulation() {
        let (dk, dv) = (7, 5);
        let mut s = rand_vec(dk * dv, 9, 1.0);
        let mut s64: Vec<f64> = s.iter().map(|&v| v as f64).collect();
        for step in 0..4u64 {
            let (q, k, v) = (rand_vec(dk, 10 + step, 1.0), rand_vec(dk, 20 + step, 1.0), rand_vec(dv, 30 + step, 1.0));
            let (decay, beta) = (0.8f32, 0.6f32);
            let mut o = vec![0.0; dv];
            delta_step(&mut s, &q, &k, &v, decay, beta, &mut o, &mut [0.0; 10]);
            s64.iter_mut().for_each(|x| *x *= decay as f64);
            let mem: Vec<f64> = (0..dv).map(|j| (0..dk).map(|i| s64[i * dv + j] * k[i] as f64).sum()).collect();
            for i in 0..dk {
                for j in 0..dv {
                    s64[i * dv + j] += k[i] as f64 * (v[j] as f64 - mem[j]) * beta as f64;
                }
            }
            for j in 0..dv {
                let want: f64 = (0..dk).map(|i| s64[i * dv + j] * q[i] as f64).sum();
                assert!((o[j] as f64 - want).abs() < 1e-5, "step {step} o[{j}] {} vs {want}", o[j]);
            }
        }
    }

    #[test]
    fn rewind_goes_to_a_snapshot_or_the_start() {
        let w = layer();
        let x = rand_vec(12 * 11, 11, 1.0);
        let mut y = vec![0.0; 12 * 11];
        let mut s = DeltaState::default();
        w.forward(&x[..5 * 11], 5, &mut s, &mut y); // no snapshot at 0 (the empty state)
        let at5 = s.clone();
        w.forward(&x[5 * 11..9 * 11], 4, &mut s, &mut y); // snapshot at 5
        w.forward(&x[9 * 11..10 * 11], 1, &mut s, &mut y); // a decode step: none
        assert_eq!(s.rewind(12), 10, "nothing to drop");
        assert_eq!(s.rewind(7), 5);
        assert_eq!((&s.s, &s.conv), (&at5.s, &at5.conv));
        assert_eq!(s.rewind(3), 0);
        assert!(s.s.iter().chain(&s.conv).all(|v| *v == 0.0));
        // softplus follows torch: x above 20, log1p(exp(x)) below.
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert!((softplus(-30.0) - (-30.0f64).exp() as f32).abs() < 1e-18);
    }
}
