//! Hybrid expert placement: the routed experts of one MoE layer on the GPU forward, each
//! computed either on the GPU (from the expert pool, uploading it if missing) or on the
//! CPU (the CPU backend's kernels, `kernels::swiglu_many`, from the bytes the expert
//! source holds locally), both at once.
//!
//! Order of work for a layer with CPU experts:
//! 1. the GPU experts are recorded and submitted (no read-back, so the host does not
//!    wait): those before the first CPU expert (ascending index) add into the layer's
//!    output `y` at once, as without hybrid placement; later ones write their outputs into
//!    a buffer of their own (the graph recorded the shared expert before them, so it runs
//!    in this submission too);
//! 2. the CPU experts run on the CPU threads meanwhile, from the FFN input read back with
//!    the routes;
//! 3. their outputs are uploaded, and `moe_accumulate` adds every remaining expert's
//!    outputs into `y` in ascending expert order; the graph then adds the shared expert.
//!
//! The sum is the CPU path's (`MoeBlock::routed`: ascending experts, `y += w * out`
//! rounded per product, then the graph's shared expert), and a CPU-computed expert gives the
//! bits of a GPU-computed one (docs/kernels.md), so tokens and logits do not depend on
//! where each expert ran.
//!
//! Which experts go to the CPU ([`Hybrid`]): only experts missing from the GPU pool whose
//! bytes are held locally (`ExpertSource::local`): in the expert cache's RAM tiers, or by
//! the browser's expert source (`ByteSource::holds_locally`: in its disk tier, OPFS /
//! IndexedDB, or fetched and waiting for its read), which the GPU side would read as well
//! to upload them. Natively (a local file) only the RAM tiers count. An expert the source
//! cannot hand out locally stays on the GPU (uploaded); in the browser the layer's misses
//! are fetched from the helper before placement (`prepare`), so a fetched expert is a
//! candidate too. Placement reads each candidate once (from RAM, or from the source into
//! the RAM tiers, counted there as any use) and hands it to the side that computes it. A
//! missing expert that fits in the pool's free room is uploaded (the pool fills up
//! first). With `On`, every other missing expert runs on the CPU. With
//! `Auto`, the engine keeps running averages of the costs: CPU compute of an expert at one
//! position (a region of single-position experts' time / its experts, as in decode) and of
//! each further position (from regions with more positions, as in prefill), upload (host
//! time of the pool's upload of a missing expert, with its read when placement had not read
//! it) and GPU compute per expert (time from submitting the GPU part to its completion /
//! its experts, measured when the GPU finishes after the CPU; an upper bound otherwise). A
//! candidate's read (from RAM or disk) is in neither side's cost: either side pays it. It
//! then sends to the CPU the `c` candidates with the fewest positions, the `c` that
//! minimises `max(cpu(c), (gpu_experts - c) * gpu + (uploads - c) * upload)`, cpu(c) being
//! their CPU cost at their positions (the two sides run at the same time). Until the CPU
//! and GPU costs are known, one candidate per layer goes to the CPU (to measure them).
//! Timing the GPU costs a wait for it (a read-back) in that layer, so `Auto` times the
//! first 8 layer passes with CPU experts, then one in 16. Without a clock (see
//! [`GpuOptions::clock`](super::GpuOptions)) `Auto` acts as `On`.
//!
//! Where each routed expert ran is also kept per (layer, expert) until
//! [`GpuModel::take_placement`] takes it (the browser's Brain view marks the cells).

use std::borrow::{Borrow, Cow};
use std::sync::Arc;

use super::buffers::upload_bytes;
use super::model::{swiglu_ffn, FfnBias};
use super::ops;
use super::placement::{ema, ExpertPlacement, Hybrid};
use super::recorder::Recorder;
use super::weights::GpuMoe;
use super::GpuModel;
use crate::error::{Error, Result};
use crate::experts::Expert;
use crate::kernels::{swiglu_many, Activation, FfnJob};
use crate::model::moe::{gather_rows, ExpertBiases};
use crate::model::Model;
use crate::tensor::Mat;

/// Per used expert: the expert, where placement read it already.
type Held = Vec<Option<Arc<Expert>>>;

/// Bytes an expert takes in GPU buffers (each matrix's bytes, padded to 4).
fn gpu_bytes(e: &Expert) -> u64 {
    let m = |m: &Mat| (m.bytes.as_ref().len() as u64).div_ceil(4) * 4;
    m(&e.gate) + m(&e.up) + m(&e.down)
}

/// The GPU buffers a MoE layer works in.
pub(super) struct MoeScratch<'a> {
    /// The FFN input [n, hidden] and the layer's output (cleared by the caller).
    pub(super) xn: &'a wgpu::Buffer,
    pub(super) y: &'a wgpu::Buffer,
    /// Gathered positions, gate/up products, one expert's outputs.
    pub(super) xs: &'a wgpu::Buffer,
    pub(super) g: &'a wgpu::Buffer,
    pub(super) u: &'a wgpu::Buffer,
    pub(super) ys: &'a wgpu::Buffer,
}

impl<M: Borrow<Model>> GpuModel<M> {
    /// Where the routed experts ran since the last call, ascending by (layer, expert); the
    /// uses add up to the growth of `HybridStats`' `cpu_experts` and `gpu_experts`.
    pub fn take_placement(&self) -> Result<Vec<ExpertPlacement>> {
        let mut placed = self.placement.placed.lock().map_err(|_| Error::Gpu("hybrid placement poisoned".into()))?;
        Ok(std::mem::take(&mut *placed)
            .into_iter()
            .map(|((layer, expert), [cpu, gpu])| ExpertPlacement { layer, expert, cpu, gpu })
            .collect())
    }

    /// Records (and, with CPU experts, submits part of) layer `l`'s routed experts into
    /// `s.y` (the graph adds the shared expert). `users[e]`: the (position, weight) pairs routed to
    /// expert e; `xn`: the FFN input read back (None: every expert on the GPU).
    /// Returns whether `rec` was submitted and replaced (its data arena with it).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn moe_experts<'a>(
        &'a self,
        rec: &mut Recorder<'a>,
        l: usize,
        act: Activation,
        cpu_bias: Option<&ExpertBiases>,
        moe: &GpuMoe,
        users: &[Vec<(usize, f32)>],
        xn: Option<&[f32]>,
        s: &MoeScratch<'_>,
        on_use: &mut dyn FnMut(usize, usize, usize),
    ) -> Result<bool> {
        let ctx = &*self.ctx;
        let h = self.m().cfg.hidden;
        let f = 4u64;
        let experts = &self.m().experts;
        let used: Vec<usize> = (0..users.len()).filter(|&e| !users[e].is_empty()).collect();
        for &e in &used {
            on_use(l, e, users[e].len());
            // The source counts uses for the usage file, as MoeBlock::routed does.
            experts.note_use(l, e, users[e].len());
        }
        // Experts `place` read (to size them) are handed on, so each is read once here.
        let (on_cpu, mut held) = self.place(l, users, &used, xn.is_some())?;
        let first_cpu = on_cpu.iter().position(|&c| c).unwrap_or(used.len());
        // Outputs of the GPU experts after the first CPU expert, added later in order.
        let mut later: Vec<Option<wgpu::Buffer>> = vec![None; used.len()];
        for (i, &e) in used.iter().enumerate() {
            if on_cpu[i] {
                continue;
            }
            let list = &users[e];
            let expert = {
                let mut pool = self.pool.lock().map_err(|_| Error::Gpu("expert pool poisoned".into()))?;
                let t0 = if pool.contains(l, e) { None } else { self.placement.now() };
                let x = pool.get(ctx, l, e, || held[i].take().map_or_else(|| experts.expert(l, e), Ok))?;
                if let (Some(t0), Some(t1)) = (t0, self.placement.now()) {
                    let mut st = self.placement.stats()?;
                    st.upload_ms = ema(st.upload_ms, t1 - t0);
                }
                x
            };
            for (j, (p, _)) in list.iter().enumerate() {
                rec.copy(s.xn, (p * h) as u64 * f, s.xs, (j * h) as u64 * f, h as u64 * f);
            }
            let bias = moe.biases.as_ref().map(|b| FfnBias { b, e });
            if i < first_cpu {
                swiglu_ffn(rec, &expert, s.xs, list.len(), s.g, s.u, s.ys, act, bias)?;
                ops::moe_accumulate(rec, s.y, s.ys, list, h)?;
            } else {
                let out = ctx.storage_buffer("expert_out", (list.len() * h) as u64 * f)?;
                swiglu_ffn(rec, &expert, s.xs, list.len(), s.g, s.u, &out, act, bias)?;
                later[i] = Some(out);
            }
        }
        let n_cpu = on_cpu.iter().filter(|&&c| c).count();
        {
            let mut placed =
                self.placement.placed.lock().map_err(|_| Error::Gpu("hybrid placement poisoned".into()))?;
            for (&e, &cpu) in used.iter().zip(&on_cpu) {
                placed.entry((l, e)).or_default()[usize::from(!cpu)] += 1;
            }
        }
        let timed = {
            let mut st = self.placement.stats()?;
            st.cpu_experts += n_cpu as u64;
            st.gpu_experts += (used.len() - n_cpu) as u64;
            st.hybrid_layers += u64::from(n_cpu > 0);
            // Auto waits for the GPU to time it: on the first layers, then one in 16.
            self.placement.mode == Hybrid::Auto && (st.hybrid_layers <= 8 || st.hybrid_layers.is_multiple_of(16))
        };
        let submitted = match xn {
            Some(xn) if n_cpu > 0 => {
                // The GPU part goes now; the CPU experts run while it computes.
                let t_submit = self.placement.now();
                std::mem::replace(rec, Recorder::new(ctx)).submit().await?;
                let cpu_idx: Vec<usize> = (0..used.len()).filter(|&i| on_cpu[i]).collect();
                let outs = self.cpu_experts(l, act, cpu_bias, users, &used, &cpu_idx, &mut held, xn, h)?;
                let t_cpu = self.placement.now();
                if let (true, Some(t0), Some(t1)) = (timed, t_submit, t_cpu) {
                    self.measure(s.y, t0, t1, used.len() - n_cpu + moe.shared.is_some() as usize).await?;
                }
                for (&i, out) in cpu_idx.iter().zip(outs) {
                    let bytes: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
                    later[i] = Some(upload_bytes(ctx, "cpu_expert_out", &bytes)?);
                }
                true
            }
            _ => false,
        };
        for (i, out) in later.iter().enumerate() {
            if let Some(out) = out {
                ops::moe_accumulate(rec, s.y, out, &users[used[i]], h)?;
            }
        }
        Ok(submitted)
    }

    /// Per used expert (ascending): whether it runs on the CPU, and the expert if this read
    /// it (the held ones missing from the pool).
    fn place(
        &self,
        l: usize,
        users: &[Vec<(usize, f32)>],
        used: &[usize],
        have_input: bool,
    ) -> Result<(Vec<bool>, Held)> {
        let mut on_cpu = vec![false; used.len()];
        let mut held = vec![None; used.len()];
        if self.placement.mode == Hybrid::Off || !have_input {
            return Ok((on_cpu, held));
        }
        let experts = &self.m().experts;
        let pool = self.pool.lock().map_err(|_| Error::Gpu("expert pool poisoned".into()))?;
        let mut free = pool.free_bytes();
        let (mut gpu, mut up, mut candidates) = (0usize, 0usize, Vec::new());
        for (i, &e) in used.iter().enumerate() {
            if pool.contains(l, e) {
                gpu += 1;
                continue;
            }
            if experts.local(l, e) {
                // Reading it takes it from the RAM tiers, or from the source's local tier
                // into them (counted as any use: a RAM hit, or a miss served by the disk).
                let x = experts.expert(l, e)?;
                let size = gpu_bytes(&x);
                held[i] = Some(x);
                if size > free {
                    candidates.push(i);
                    continue;
                }
                free -= size;
            }
            gpu += 1;
            up += 1;
        }
        drop(pool);
        // The candidates with the fewest positions go first (the cheapest on the CPU).
        candidates.sort_by_key(|&i| users[used[i]].len());
        let positions: Vec<usize> = candidates.iter().map(|&i| users[used[i]].len()).collect();
        let k = self.placement.cpu_share(&positions, gpu, up)?;
        for &i in candidates.iter().take(k) {
            on_cpu[i] = true;
        }
        Ok((on_cpu, held))
    }

    /// Computes the experts `used[i]`, i in `idx`, on the CPU from `xn` (one parallel
    /// region, as MoeBlock::routed): their outputs, [positions, hidden] each.
    #[allow(clippy::too_many_arguments)]
    fn cpu_experts(
        &self,
        l: usize,
        act: Activation,
        cpu_bias: Option<&ExpertBiases>,
        users: &[Vec<(usize, f32)>],
        used: &[usize],
        idx: &[usize],
        held: &mut [Option<Arc<Expert>>],
        xn: &[f32],
        h: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let t0 = self.placement.now();
        let experts = &self.m().experts;
        let arcs = idx
            .iter()
            .map(|&i| held.get_mut(i).and_then(Option::take).map_or_else(|| experts.expert(l, used[i]), Ok))
            .collect::<Result<Vec<_>>>()?;
        // The positions routed here index the n rows read back (as on the CPU path).
        let n = xn.len() / h.max(1);
        if idx.iter().flat_map(|&i| &users[used[i]]).any(|&(p, _)| p >= n) {
            return Err(Error::Gpu("FFN input too short".into()));
        }
        let xs: Vec<Cow<'_, [f32]>> = idx.iter().map(|&i| gather_rows(xn, n, h, &users[used[i]])).collect();
        let jobs: Vec<FfnJob> = idx
            .iter()
            .zip(&arcs)
            .zip(&xs)
            .map(|((&i, w), x)| FfnJob {
                gate: &w.gate,
                up: &w.up,
                down: &w.down,
                x: x.as_ref(),
                n: x.len() / h,
                act,
                bias: cpu_bias.map(|b| b.of(used[i])),
            })
            .collect();
        let mut outs: Vec<Vec<f32>> = xs.iter().map(|x| vec![0.0f32; x.len()]).collect();
        {
            let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            swiglu_many(&jobs, &mut refs);
        }
        if let (Some(t0), Some(t1)) = (t0, self.placement.now()) {
            self.placement.record_cpu(t1 - t0, idx.len(), jobs.iter().map(|j| j.n).sum())?;
        }
        Ok(outs)
    }

    /// `Auto`: waits for the GPU part submitted at `t_submit` (a 4-byte read-back after
    /// it) and records the GPU's time per expert; the CPU part ended at `t_cpu`.
    async fn measure(&self, y: &wgpu::Buffer, t_submit: f64, t_cpu: f64, n_gpu: usize) -> Result<()> {
        let mut probe = Recorder::new(&self.ctx);
        probe.read(y, 0, 4);
        probe.submit().await?;
        let Some(t_done) = self.placement.now() else { return Ok(()) };
        let n_gpu = n_gpu.max(1) as f64;
        let mut st = self.placement.stats()?;
        // The GPU finished after the CPU (it waited 0.5 ms or more): its time is known;
        // else it is at most the CPU's, a bound that may only lower the estimate.
        if t_done - t_cpu >= 0.5 {
            st.gpu_ms = ema(st.gpu_ms, (t_done - t_submit) / n_gpu);
        } else {
            let bound = (t_cpu - t_submit) / n_gpu;
            st.gpu_ms = Some(st.gpu_ms.map_or(bound, |g| g.min(bound)));
        }
        Ok(())
    }
}
