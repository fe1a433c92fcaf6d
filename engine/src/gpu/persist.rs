//! A GPU session's caches as a CPU [`Session`] and back, so that the GPU backend writes and
//! reads the same cache files as the CPU (crate::model::kv): read back into the CPU's
//! layout ([`GpuModel::session_to_cpu`]) and uploaded from it
//! ([`GpuModel::session_from_cpu`]), the same floats both ways. Per layer:
//! - grouped-query attention: keys and values, rows of kv_dim each, as they are;
//! - MLA: the GPU's rows [latent, rotary key (, DSA's indexer key)] are the CPU's k
//!   (latent) and v (the rest) side by side;
//! - Gated DeltaNet: the recurrent state (conv inputs, delta-rule matrices) after the
//!   positions held, and the snapshots after the positions a record starts from (where a
//!   prompt ended: `kv::encode_record` splits the turn's record there), both ways;
//! - DeepSeek-V4: the window's keys, each compressor's entries and the rows its next
//!   entries need. The GPU keeps the last finished window's rows whole and their gates
//!   without the position bias; the CPU keeps their Ca halves with the bias added (the
//!   same f32 sum the kernel makes), so a state read back from a file marks its rows
//!   `prev_biased` and the kernel adds nothing to them.

use std::borrow::Borrow;

use super::deltanet::GpuDeltaState;
use super::model::{GpuModel, GpuSession};
use super::recorder::Recorder;
use super::v4::GpuComp;
use super::v4_attn::GpuV4Layer;
use super::weights::GpuAttn;
use super::GpuContext;
use crate::error::{Error, Result};
use crate::model::deltanet::DeltaState;
use crate::model::v4::{CompState, Compressor, V4LayerState};
use crate::model::{Model, Session};

/// Read-backs gathered into one submission: [`Reads::add`] each, [`Reads::run`] once,
/// then [`Reads::take`] each result.
#[derive(Default)]
struct Reads<'b> {
    list: Vec<(&'b wgpu::Buffer, usize, usize)>,
    got: Vec<Vec<f32>>,
}

impl<'b> Reads<'b> {
    /// The first `floats` floats of `b`, by the index returned.
    fn add(&mut self, b: &'b wgpu::Buffer, floats: usize) -> Result<usize> {
        self.add_at(b, 0, floats)
    }

    /// `floats` floats of `b` from float `at`, by the index returned.
    fn add_at(&mut self, b: &'b wgpu::Buffer, at: usize, floats: usize) -> Result<usize> {
        if (at + floats) as u64 * 4 > b.size() {
            return Err(Error::Gpu(format!(
                "reading back floats {at}..{} of a buffer of {} bytes",
                at + floats,
                b.size()
            )));
        }
        self.list.push((b, at, floats));
        Ok(self.list.len() - 1)
    }

    async fn run(&mut self, ctx: &GpuContext) -> Result<()> {
        let mut rec = Recorder::new(ctx);
        for (b, at, floats) in &self.list {
            rec.read(b, *at as u64 * 4, *floats as u64 * 4);
        }
        self.got = rec.submit().await?.iter().map(|b| super::buffers::f32s(b)).collect();
        Ok(())
    }

    fn take(&mut self, i: usize) -> Vec<f32> {
        self.got.get_mut(i).map(std::mem::take).unwrap_or_default()
    }
}

/// What one layer reads back, by [`Reads`] index.
enum LayerRead {
    None,
    Gqa {
        k: usize,
        v: usize,
        kvd: usize,
    },
    Mla {
        rows: usize,
        r: usize,
        row: usize,
    },
    /// The state, and the snapshots after `from` (position, conv, s).
    Linear {
        conv: usize,
        s: usize,
        snaps: Vec<(usize, usize, usize)>,
    },
}

/// A storage buffer holding `v` (at least `floats` floats of room).
fn upload(ctx: &GpuContext, label: &str, v: &[f32], floats: usize) -> Result<wgpu::Buffer> {
    let b = ctx.storage_buffer(label, floats.max(v.len()) as u64 * 4)?;
    if !v.is_empty() {
        write(ctx, &b, v);
    }
    Ok(b)
}

/// Writes `v` at the start of `b` (enqueued before any later submission).
fn write(ctx: &GpuContext, b: &wgpu::Buffer, v: &[f32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    ctx.queue.write_buffer(b, 0, &bytes);
}

/// Floats `n` of a vector that must hold them (a corrupt state would not).
fn take<'a>(v: &'a [f32], n: usize, what: &str) -> Result<&'a [f32]> {
    v.get(..n).ok_or_else(|| Error::Gpu(format!("{what}: {} floats where {n} are needed", v.len())))
}

impl<M: Borrow<Model>> GpuModel<M> {
    /// What `s` holds, as the CPU's session of the same tokens would hold it: its tokens
    /// and its caches read back (after a truncation that a recurrent state could not
    /// follow, the caches hold fewer positions than the tokens, as on the CPU: the next
    /// pass feeds the rest again).
    pub async fn session_to_cpu(&self, s: &GpuSession) -> Result<Session> {
        self.session_to_cpu_from(s, 0).await
    }

    /// [`GpuModel::session_to_cpu`] reading back only what positions `from..` added: the
    /// keys and values (or MLA rows) of those positions and the compressed entries made
    /// since, the rest of those vectors zeros (what appending a record of `from..` to a
    /// cache file needs, `model::kv::encode_record`); the states (recurrent, V4 window and
    /// rows) whole. `from` at the positions held reads only the states: the session's
    /// shape and tokens for the file's header.
    pub async fn session_to_cpu_from(&self, s: &GpuSession, from: usize) -> Result<Session> {
        let m = self.m();
        let c = &m.cfg;
        let mut out = m.new_session();
        if s.tokens.is_empty() {
            return Ok(out);
        }
        out.tokens = s.tokens.clone();
        let n = s.cached_len();
        let from = from.min(n);
        let mut reads = Reads::default();
        if let (Some(w), Some(state)) = (m.v4.as_deref(), out.v4.as_deref_mut()) {
            if n == 0 {
                return Ok(out);
            }
            if s.v4.len() != w.layers.len() {
                return Err(Error::Gpu(format!("a V4 state of {} layers for {}", s.v4.len(), w.layers.len())));
            }
            let mut plans = Vec::with_capacity(s.v4.len());
            for (gl, wl) in s.v4.iter().zip(&w.layers) {
                let window = reads.add(&gl.window, gl.held * c.head_dim)?;
                let comp = wl.attn.comp.as_ref().map(|cw| comp_reads(&gl.comp, cw, from, &mut reads)).transpose()?;
                let index =
                    wl.attn.indexer.as_ref().map(|ix| comp_reads(&gl.index, &ix.comp, from, &mut reads)).transpose()?;
                plans.push((window, comp, index));
            }
            reads.run(&self.ctx).await?;
            state.pos = n;
            state.layers = Vec::with_capacity(plans.len());
            for ((gl, wl), (window, comp, index)) in s.v4.iter().zip(&w.layers).zip(plans) {
                let comp = match (comp, &wl.attn.comp) {
                    (Some(p), Some(cw)) => comp_state(p, &gl.comp, cw, &mut reads),
                    _ => CompState::default(),
                };
                let index = match (index, &wl.attn.indexer) {
                    (Some(p), Some(ix)) => comp_state(p, &gl.index, &ix.comp, &mut reads),
                    _ => CompState::default(),
                };
                state.layers.push(V4LayerState { window: reads.take(window), comp, index });
            }
            return Ok(out);
        }
        if s.recurrent.iter().flatten().any(|r| r.pos != n) {
            return Err(Error::Gpu("recurrent states at different positions".into()));
        }
        let no_cache = |l: usize| Error::Gpu(format!("layer {l}: no KV cache"));
        let mut plans = Vec::with_capacity(self.layers.len());
        for (l, layer) in self.layers.iter().enumerate() {
            plans.push(match &layer.attn {
                GpuAttn::Linear(d) => {
                    let st = s.recurrent.get(l).and_then(Option::as_ref);
                    let st = st.ok_or_else(|| Error::Gpu(format!("layer {l}: recurrent state missing")))?;
                    let mut r = DeltaState::default();
                    r.ensure(&d.cfg);
                    let (cn, sn) = (r.conv.len(), r.s.len());
                    // Snapshots inside the positions read back: a cache file's record is
                    // split at one (kv::encode_record), so that the file keeps it.
                    let mut snaps = Vec::new();
                    for (pos, conv, s) in st.snapshot_buffers().filter(|&(pos, ..)| pos > from && pos < n) {
                        snaps.push((pos, reads.add(conv, cn)?, reads.add(s, sn)?));
                    }
                    LayerRead::Linear { conv: reads.add(&st.conv, cn)?, s: reads.add(&st.s, sn)?, snaps }
                }
                _ if n == 0 => LayerRead::None,
                GpuAttn::Mla(_) => {
                    let mla = c.mla.as_ref().ok_or_else(|| Error::Gpu("MLA weights without their config".into()))?;
                    let (r, row) = (mla.kv_lora_rank, mla.cache_width_at(l));
                    let (k, _) = s.kv.get(l).ok_or_else(|| no_cache(l))?;
                    LayerRead::Mla { rows: reads.add_at(k, from * row, (n - from) * row)?, r, row }
                }
                GpuAttn::Gqa(_) => {
                    let kvd = c.kv_dim();
                    let (k, v) = s.kv.get(l).ok_or_else(|| no_cache(l))?;
                    let (k, v) = (
                        reads.add_at(k, from * kvd, (n - from) * kvd)?,
                        reads.add_at(v, from * kvd, (n - from) * kvd)?,
                    );
                    LayerRead::Gqa { k, v, kvd }
                }
            });
        }
        reads.run(&self.ctx).await?;
        for (plan, cache) in plans.into_iter().zip(out.caches.iter_mut()) {
            match plan {
                LayerRead::None => {}
                LayerRead::Linear { conv, s, snaps } => {
                    let mut r = DeltaState::default();
                    for (pos, c, st) in snaps {
                        r.push_snapshot(pos, reads.take(c), reads.take(st));
                    }
                    (r.pos, r.conv, r.s) = (n, reads.take(conv), reads.take(s));
                    cache.recurrent = Some(Box::new(r));
                }
                LayerRead::Mla { rows, r, row } => {
                    let rows = reads.take(rows);
                    // Positions before `from` as zeros (not read back).
                    let (mut latent, mut rest) = (vec![0.0; from * r], vec![0.0; from * (row - r)]);
                    for x in rows.chunks_exact(row) {
                        latent.extend_from_slice(&x[..r]);
                        rest.extend_from_slice(&x[r..]);
                    }
                    cache.append(&latent, &rest, r, row - r);
                }
                LayerRead::Gqa { k, v, kvd } => {
                    let zeros = vec![0.0; from * kvd];
                    cache.append(&zeros, &zeros, kvd, kvd);
                    cache.append(&reads.take(k), &reads.take(v), kvd, kvd);
                }
            }
        }
        Ok(out)
    }

    /// Native convenience: [`GpuModel::session_to_cpu`] run to completion.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn session_to_cpu_blocking(&self, s: &GpuSession) -> Result<Session> {
        pollster::block_on(self.session_to_cpu(s))
    }

    /// Native convenience: [`GpuModel::session_to_cpu_from`] run to completion.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn session_to_cpu_from_blocking(&self, s: &GpuSession, from: usize) -> Result<Session> {
        pollster::block_on(self.session_to_cpu_from(s, from))
    }

    /// A GPU session holding what the CPU's `cpu` holds (a cache file read back): its
    /// tokens and caches, which may hold fewer positions than the tokens (the next pass
    /// feeds the rest again, as the CPU's would). The next forward pass continues it with
    /// the bits it would have had uninterrupted. Every size is checked against this
    /// model's (an error, not a panic, for a session of another shape).
    pub fn session_from_cpu(&self, cpu: &Session) -> Result<GpuSession> {
        let m = self.m();
        let c = &m.cfg;
        let ctx = &*self.ctx;
        let mut s = self.new_session();
        if cpu.tokens.is_empty() {
            return Ok(s);
        }
        s.tokens = cpu.tokens.clone();
        let n = cpu.cached_len();
        if let Some(w) = m.v4.as_deref() {
            let v4 = c.v4.as_deref().ok_or_else(|| Error::Gpu("DeepSeek-V4 weights without its config".into()))?;
            let state = cpu.v4.as_deref().ok_or_else(|| Error::Gpu("a session without the V4 state".into()))?;
            if n == 0 {
                // Nothing held: fresh layers at position 0, the tokens fed again.
                s.v4 =
                    (0..w.layers.len()).map(|_| GpuV4Layer::new(ctx, v4.window, c.head_dim)).collect::<Result<_>>()?;
                return Ok(s);
            }
            if state.layers.len() != w.layers.len() {
                return Err(Error::Gpu(format!("a V4 state of {} layers for {}", state.layers.len(), w.layers.len())));
            }
            for (st, wl) in state.layers.iter().zip(&w.layers) {
                let mut gl = GpuV4Layer::new(ctx, v4.window, c.head_dim)?;
                let held = st.window.len() / c.head_dim.max(1);
                if held * c.head_dim != st.window.len() || held >= v4.window.max(1) {
                    return Err(Error::Gpu(format!("a V4 window of {} floats", st.window.len())));
                }
                write(ctx, &gl.window, &st.window);
                gl.held = held;
                if let Some(cw) = &wl.attn.comp {
                    comp_from_cpu(ctx, &mut gl.comp, &st.comp, cw)?;
                }
                if let Some(ix) = &wl.attn.indexer {
                    comp_from_cpu(ctx, &mut gl.index, &st.index, &ix.comp)?;
                }
                s.v4.push(gl);
            }
            s.v4_pos = n;
            return Ok(s);
        }
        if cpu.caches.len() != self.layers.len() {
            return Err(Error::Gpu(format!("a session of {} layers for {}", cpu.caches.len(), self.layers.len())));
        }
        let cap = super::model::kv_capacity(n, c.max_positions);
        for (l, (layer, cache)) in self.layers.iter().zip(&cpu.caches).enumerate() {
            let (k, v) = match &layer.attn {
                GpuAttn::Linear(d) => {
                    let r = cache
                        .recurrent
                        .as_deref()
                        .ok_or_else(|| Error::Gpu(format!("layer {l}: no recurrent state")))?;
                    let mut st = GpuDeltaState::new(ctx, &d.cfg)?;
                    if r.pos != n {
                        return Err(Error::Gpu(format!("layer {l}: a recurrent state at {} of {n} positions", r.pos)));
                    }
                    if n > 0 {
                        // (A state of no positions is the zeros the new buffers hold.)
                        if r.conv.len() as u64 * 4 != st.conv.size() || r.s.len() as u64 * 4 != st.s.size() {
                            return Err(Error::Gpu(format!("layer {l}: a recurrent state of another shape")));
                        }
                        write(ctx, &st.conv, &r.conv);
                        write(ctx, &st.s, &r.s);
                        // A file's snapshots (where its records ended) come along.
                        for (pos, conv, s) in r.snapshots() {
                            st.push_snapshot(ctx, pos, conv, s)?;
                        }
                    }
                    st.pos = n;
                    s.recurrent.push(Some(st));
                    (upload(ctx, "k_cache", &[], 0)?, upload(ctx, "v_cache", &[], 0)?)
                }
                GpuAttn::Mla(_) => {
                    s.recurrent.push(None);
                    let mla = c.mla.as_ref().ok_or_else(|| Error::Gpu("MLA weights without their config".into()))?;
                    let (r, row) = (mla.kv_lora_rank, mla.cache_width_at(l));
                    let (latent, rest) =
                        (take(&cache.k, n * r, "MLA latents")?, take(&cache.v, n * (row - r), "MLA keys")?);
                    let mut rows = Vec::with_capacity(n * row);
                    for p in 0..n {
                        rows.extend_from_slice(&latent[p * r..(p + 1) * r]);
                        rows.extend_from_slice(&rest[p * (row - r)..(p + 1) * (row - r)]);
                    }
                    (upload(ctx, "k_cache", &rows, cap * mla.cache_width())?, upload(ctx, "v_cache", &[], 0)?)
                }
                GpuAttn::Gqa(_) => {
                    s.recurrent.push(None);
                    let kvd = c.kv_dim();
                    let (k, v) = (take(&cache.k, n * kvd, "keys")?, take(&cache.v, n * kvd, "values")?);
                    (upload(ctx, "k_cache", k, cap * kvd)?, upload(ctx, "v_cache", v, cap * kvd)?)
                }
            };
            s.kv.push((k, v));
        }
        s.kv_cap = cap;
        Ok(s)
    }
}

/// A compressor's read-backs: (entries made from the first one read on: its index and the
/// entries before it, its rows' kv and gate), by [`Reads`] index.
type CompRead = ((usize, usize), Option<(usize, usize)>);

/// Asks for a compressor's GPU state (its sizes checked first): the entries made by
/// positions `from..`, the rows whole.
fn comp_reads<'b>(g: &'b GpuComp, d: &Compressor, from: usize, reads: &mut Reads<'b>) -> Result<CompRead> {
    let prev = if g.has_prev { d.rate } else { 0 };
    if g.held < prev || g.held - prev > d.rate || (g.held > 0 && g.rows.is_none()) {
        return Err(Error::Gpu(format!("a compressor holding {} rows at rate {}", g.held, d.rate)));
    }
    let e0 = (from / d.rate.max(1)).min(g.count);
    let entries = (reads.add_at(&g.entries, e0 * d.dim, (g.count - e0) * d.dim)?, e0);
    let rows = match &g.rows {
        Some((kv, gate)) => Some((reads.add(kv, g.held * d.width())?, reads.add(gate, g.held * d.width())?)),
        None => None,
    };
    Ok((entries, rows))
}

/// A compressor's GPU state, read back, in the CPU's layout ([`CompState`]).
fn comp_state(plan: CompRead, g: &GpuComp, d: &Compressor, reads: &mut Reads<'_>) -> CompState {
    let (width, prev) = (d.width(), if g.has_prev { d.rate } else { 0 });
    let (rows_kv, rows_gate) = plan.1.map_or_else(Default::default, |(k, g)| (reads.take(k), reads.take(g)));
    let ((entries, e0), _) = plan;
    let mut st = CompState { entries: vec![0.0; e0 * d.dim], ..CompState::default() };
    st.entries.extend(reads.take(entries));
    st.buf_kv = rows_kv.get(prev * width..).unwrap_or_default().to_vec();
    st.buf_gate = rows_gate.get(prev * width..).unwrap_or_default().to_vec();
    if g.has_prev {
        // The Ca halves of the last finished window, its gates with the bias added.
        let (mut pk, mut pg) = (vec![0.0f32; d.rate * d.dim], vec![0.0f32; d.rate * d.dim]);
        for j in 0..d.rate {
            for ch in 0..d.dim {
                pk[j * d.dim + ch] = rows_kv[j * width + ch];
                let gate = rows_gate[j * width + ch];
                pg[j * d.dim + ch] = if g.prev_biased { gate } else { gate + d.ape[j * width + ch] };
            }
        }
        st.overlap = Some((pk, pg));
    }
    st
}

/// [`comp_state`]'s inverse: the entries, then the rows (the Ca halves of the last
/// finished window first, their Cb halves zero: the kernel never reads them), marked
/// `prev_biased`.
fn comp_from_cpu(ctx: &GpuContext, g: &mut GpuComp, st: &CompState, d: &Compressor) -> Result<()> {
    let width = d.width();
    let count = st.entries.len() / d.dim.max(1);
    let buf_rows = st.buf_kv.len() / width.max(1);
    let shaped = count * d.dim == st.entries.len()
        && buf_rows * width == st.buf_kv.len()
        && st.buf_gate.len() == st.buf_kv.len()
        && buf_rows < d.rate
        && st.overlap.as_ref().is_none_or(|(k, g)| d.overlap && k.len() == d.rate * d.dim && g.len() == k.len());
    if !shaped {
        return Err(Error::Gpu("a V4 compressor state of another shape".into()));
    }
    let cap = count.max(16);
    g.entries = upload(ctx, "v4.entries", &st.entries, cap * d.dim)?;
    g.count = count;
    g.cap = cap;
    let (mut kv, mut gate) = (Vec::with_capacity(2 * d.rate * width), Vec::with_capacity(2 * d.rate * width));
    if let Some((pk, pg)) = &st.overlap {
        for j in 0..d.rate {
            kv.extend_from_slice(&pk[j * d.dim..(j + 1) * d.dim]);
            kv.resize(kv.len() + d.dim, 0.0);
            gate.extend_from_slice(&pg[j * d.dim..(j + 1) * d.dim]);
            gate.resize(gate.len() + d.dim, 0.0);
        }
    }
    kv.extend_from_slice(&st.buf_kv);
    gate.extend_from_slice(&st.buf_gate);
    let room = 2 * d.rate * width;
    g.rows = Some((upload(ctx, "v4.comp_rows_kv", &kv, room)?, upload(ctx, "v4.comp_rows_gate", &gate, room)?));
    g.held = kv.len() / width.max(1);
    g.has_prev = st.overlap.is_some();
    g.prev_biased = g.has_prev;
    Ok(())
}
