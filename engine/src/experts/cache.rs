//! Routed experts read from a container on demand: one read of the expert's byte range,
//! a checksum check, and two in-memory tiers under a byte budget (pinned by learned
//! usage, then least-recently-used; by use count instead when the budget cannot hold one
//! token's experts, where recency never hits). Natively, misses and router-lookahead prefetches
//! load on a bounded pool of reader threads while the MoE block computes what is
//! resident. The bytes are the same whichever way and whenever they arrive, so budgets,
//! pinning, prefetching and read order change speed, never the answer.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::ram_tiers::{plan_repin, Key, RamTiers, Tier};
#[cfg(not(target_arch = "wasm32"))]
use super::reader::{BufferPool, LoadSlot, ReaderPool};
use super::source::ByteSource;
use super::{Expert, ExpertSource, LookaheadStats};
use crate::error::{Error, Result};
use crate::experts::usage::ExpertUsage;
use crate::format::manifest::{checksum, parse_checksum, ExpertLayer, Manifest};
use crate::tensor::{Bytes, DType, Mat};

/// Where one layer's experts are and how to cut them into gate, up and down.
struct LayerIndex {
    /// (dtype, rows, cols, offset in the range, length) of gate, up, down.
    parts: [(DType, usize, usize, usize, usize); 3],
    /// (offset, length, checksum) per expert.
    experts: Vec<(u64, usize, u64)>,
    /// Per expert: its bytes matched the checksum once in this process, so a later read
    /// of the same range (evicted, then streamed again) is not hashed again.
    checked: Vec<AtomicBool>,
}

/// What the expert cache needs to know of the model: which layers have routed experts
/// and the shape of one expert ([`crate::ModelConfig::expert_shape`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertShape {
    /// Per model layer: whether it has routed experts.
    pub moe_layers: Vec<bool>,
    pub hidden: usize,
    /// Intermediate size of one routed expert.
    pub intermediate: usize,
    /// Routed experts per MoE layer.
    pub n_experts: usize,
    /// Experts each position is routed to.
    pub top_k: usize,
    /// Multi-token-prediction layers with routed experts after the decoder stack (layer
    /// indices `moe_layers.len()..`): read like the others, not counted in usage.
    pub mtp_layers: usize,
}

/// How the expert cache behaves. `Default` is what the browser and tests get: no limit,
/// no pins, synchronous reads, no lookahead.
#[derive(Clone, Debug, Default)]
pub struct CacheOptions {
    /// Bytes of experts kept in memory, both tiers together (None: all, Some(0): none).
    pub ram: Option<u64>,
    /// Bytes of that budget reserved for pinned experts (capped at `ram`).
    pub pin: u64,
    /// Reader threads for misses and prefetches (0: read synchronously when asked).
    pub readers: usize,
    /// Apply layer L+1's router to layer L's FFN input and prefetch the predicted experts.
    pub lookahead: bool,
    /// Open the data file with O_DIRECT where the file system allows it.
    pub direct: bool,
    /// Expert-use counts of earlier runs: the pin set at start-up and the base of re-pinning.
    pub usage: Option<ExpertUsage>,
}

impl CacheOptions {
    /// Default options with a budget of `ram` bytes (None: keep every expert once read).
    pub fn with_ram(ram: Option<u64>) -> Self {
        CacheOptions { ram, ..Default::default() }
    }
}

/// Counters of the expert cache. `hits` = `pinned_hits` + `ram_hits`; `misses` were read
/// from the byte source (`prefetched_hits` of them by a lookahead read started early).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub pinned_hits: u64,
    pub ram_hits: u64,
    pub misses: u64,
    pub prefetched_hits: u64,
    pub bytes_read: u64,
    pub cached_bytes: u64,
    pub cached_experts: u64,
    pub pinned_experts: u64,
    pub pinned_bytes: u64,
    /// Lookahead: routed experts in layers that had a prediction, how many of them were
    /// predicted, and the reads it started (`prefetched`).
    pub lookahead: LookaheadStats,
    /// Bytes of the reads lookahead asked for; of those, the ones cancelled while still
    /// queued (the router chose otherwise before a reader got to them: never read), and the
    /// ones read that nobody used.
    pub prefetch_bytes: u64,
    pub prefetch_cancelled_bytes: u64,
    pub prefetch_wasted_bytes: u64,
    /// Experts moved into or out of the pinned tier after start-up.
    pub repinned: u64,
    /// Whether reads bypass the page cache (O_DIRECT) right now.
    pub direct_io: bool,
}

/// The part of the cache that reader threads share: where the bytes are and how to read them.
struct Core {
    source: Arc<dyn ByteSource>,
    /// Indexed by model layer; None for dense layers.
    layers: Vec<Option<LayerIndex>>,
    #[cfg(not(target_arch = "wasm32"))]
    buffers: Arc<BufferPool>,
    bytes_read: AtomicU64,
}

#[cfg(not(target_arch = "wasm32"))]
type ReadSlot = Arc<LoadSlot<(Arc<Expert>, u64)>>;

/// A read handed to the reader pool and not yet taken by the MoE block.
#[cfg(not(target_arch = "wasm32"))]
struct Staged {
    slot: ReadSlot,
    bytes: u64,
    /// Started by lookahead rather than by the layer that needs it.
    prefetch: bool,
}

#[derive(Default)]
struct State {
    tiers: RamTiers,
    #[cfg(not(target_arch = "wasm32"))]
    staged: HashMap<Key, Staged>,
    /// Misses of the current layer waiting for a free place in the read window.
    demand: VecDeque<Key>,
    /// layer -> experts the lookahead predicted for its next step.
    predicted: HashMap<usize, Vec<usize>>,
    /// Earlier runs' counts plus this run's (what pinning goes by).
    counts: Option<ExpertUsage>,
    /// This run's counts not yet handed out by `take_usage`.
    fresh: Option<ExpertUsage>,
    /// Recent uses, halved every [`ExpertCache::decay_every`] uses: what the second tier
    /// admits and evicts by.
    recent: Option<ExpertUsage>,
    /// Uses noted since the last halving.
    since_decay: u64,
    stats: CacheStats,
}

/// An [`ExpertSource`] over a container's data file.
pub struct ExpertCache {
    core: Arc<Core>,
    opts: CacheOptions,
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    top_k: usize,
    /// Uses (positions routed to an expert) between two halvings of the recent counts:
    /// [`DECAY_TOKENS`] tokens' worth.
    decay_every: u64,
    state: Mutex<State>,
    #[cfg(not(target_arch = "wasm32"))]
    pool: Option<ReaderPool>,
}

fn index_layer(l: &ExpertLayer, shape: &ExpertShape) -> Result<LayerIndex> {
    let (h, i) = (shape.hidden, shape.intermediate);
    let want = [[i, h], [i, h], [h, i]];
    let mut parts = [(DType::F32, 0, 0, 0, 0); 3];
    for (k, p) in l.parts.iter().enumerate() {
        let shape = [p.shape[0] as usize, p.shape[1] as usize];
        if shape != want[k] {
            return Err(Error::Invalid(format!(
                "colibri.json: layer {} expert {} has shape {:?}, the config implies {:?}",
                l.layer, p.name, p.shape, want[k]
            )));
        }
        parts[k] = (p.dtype()?, shape[0], shape[1], p.offset as usize, p.length as usize);
    }
    let n = shape.n_experts;
    if l.experts.len() != n {
        return Err(Error::Invalid(format!(
            "colibri.json: layer {} lists {} experts, the config says {n}",
            l.layer,
            l.experts.len()
        )));
    }
    let experts: Vec<_> =
        l.experts.iter().map(|e| (e.offset, e.length as usize, parse_checksum(&e.xxh3).unwrap_or(0))).collect();
    let checked = experts.iter().map(|_| AtomicBool::new(false)).collect();
    Ok(LayerIndex { parts, experts, checked })
}

impl Core {
    fn span(&self, layer: usize, index: usize) -> Result<(&LayerIndex, u64, usize, u64)> {
        let li = self
            .layers
            .get(layer)
            .and_then(|l| l.as_ref())
            .ok_or_else(|| Error::Invalid(format!("layer {layer} has no routed experts")))?;
        let &(offset, length, want) =
            li.experts.get(index).ok_or_else(|| Error::Invalid(format!("no expert {index} in layer {layer}")))?;
        Ok((li, offset, length, want))
    }

    fn size(&self, key: Key) -> u64 {
        self.span(key.0, key.1).map(|s| s.2 as u64).unwrap_or(0)
    }

    /// Reads expert `index` of `layer` and checks its checksum (the first time this process
    /// reads it, or every time with `always_check`); also returns its bytes.
    fn read(&self, layer: usize, index: usize, always_check: bool) -> Result<(Arc<Expert>, u64)> {
        let (li, offset, length, want) = self.span(layer, index)?;
        #[cfg(not(target_arch = "wasm32"))]
        let bytes = {
            let mut buf = self.buffers.take(length)?;
            self.source.read_aligned(offset, buf.full_mut(), length)?;
            buf.set_len(length);
            Bytes::new(Arc::new(buf))
        };
        #[cfg(target_arch = "wasm32")]
        let bytes = {
            let mut buf = vec![0u8; length];
            self.source.read_at(offset, &mut buf)?;
            Bytes::from_vec(buf)
        };
        self.bytes_read.fetch_add(length as u64, Ordering::Relaxed);
        let checked = &li.checked[index];
        let check = always_check || !checked.load(Ordering::Relaxed);
        if check && !self.source.checks_expert(offset, length) && checksum(bytes.as_ref()) != want {
            checked.store(false, Ordering::Relaxed);
            return Err(Error::Checksum(format!(
                "{}: checksum mismatch in expert {index} of layer {layer} (bytes {offset}..{}): the file is corrupted; convert the model again",
                self.source.name(),
                offset + length as u64
            )));
        }
        checked.store(true, Ordering::Relaxed);
        let mat = |k: usize| -> Result<Mat> {
            let (dt, rows, cols, off, len) = li.parts[k];
            Mat::new(rows, cols, dt, bytes.slice(off, len)?)
        };
        Ok((Arc::new(Expert { gate: mat(0)?, up: mat(1)?, down: mat(2)? }), length as u64))
    }
}

impl ExpertCache {
    /// Indexes the manifest's experts, checking them against the model config.
    /// `budget`: bytes of experts to keep in memory (None = all, Some(0) = none).
    pub fn new(m: &Manifest, shape: &ExpertShape, source: Arc<dyn ByteSource>, budget: Option<u64>) -> Result<Self> {
        Self::with_options(m, shape, source, CacheOptions::with_ram(budget))
    }

    /// [`ExpertCache::new`] with every option; pins the hottest experts of
    /// `opts.usage` that fit `opts.pin` before returning.
    pub fn with_options(
        m: &Manifest,
        shape: &ExpertShape,
        source: Arc<dyn ByteSource>,
        mut opts: CacheOptions,
    ) -> Result<Self> {
        let counted = shape.moe_layers.len();
        let n_layers = counted + shape.mtp_layers;
        let mut layers = Vec::with_capacity(n_layers);
        let all = shape.moe_layers.iter().copied().chain(std::iter::repeat_n(true, shape.mtp_layers));
        for (l, moe) in all.enumerate() {
            match (moe, m.expert_layer(l)) {
                (true, Some(x)) => layers.push(Some(index_layer(x, shape)?)),
                (true, None) => return Err(Error::Invalid(format!("colibri.json: no experts for MoE layer {l}"))),
                (false, Some(_)) => {
                    return Err(Error::Invalid(format!("colibri.json: experts listed for dense layer {l}")))
                }
                (false, None) => layers.push(None),
            }
        }
        if let Some(x) = m.experts.layers.iter().find(|x| x.layer as usize >= n_layers) {
            return Err(Error::Invalid(format!(
                "colibri.json: experts listed for layer {}, but the model has {} layers",
                x.layer, n_layers
            )));
        }
        opts.pin = opts.pin.min(opts.ram.unwrap_or(u64::MAX));
        let (nl, ne) = (counted, shape.n_experts);
        let counts = match opts.usage.take() {
            Some(u) if (u.n_layers(), u.n_experts()) == (nl, ne) => u,
            _ => ExpertUsage::new(nl, ne),
        };
        let top_k = shape.top_k;
        #[cfg(not(target_arch = "wasm32"))]
        let pool = if opts.readers > 0 { Some(ReaderPool::new(opts.readers)?) } else { None };
        // Free buffers kept for reuse: about one read window (each kept buffer is RSS).
        #[cfg(not(target_arch = "wasm32"))]
        let buffers = BufferPool::new(top_k.max(1) + opts.readers);
        let core = Arc::new(Core {
            source,
            layers,
            #[cfg(not(target_arch = "wasm32"))]
            buffers,
            bytes_read: AtomicU64::new(0),
        });
        let state = State {
            counts: Some(counts),
            fresh: Some(ExpertUsage::new(nl, ne)),
            recent: Some(ExpertUsage::new(nl, ne)),
            ..Default::default()
        };
        let x = ExpertCache {
            core,
            opts,
            top_k,
            decay_every: (DECAY_TOKENS * top_k * counted).max(1) as u64,
            state: Mutex::new(state),
            #[cfg(not(target_arch = "wasm32"))]
            pool,
        };
        if x.opts.pin > 0 {
            x.repin()?;
            x.lock().stats.repinned = 0;
        }
        Ok(x)
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn has_pool(&self) -> bool {
        self.pool.is_some()
    }

    #[cfg(target_arch = "wasm32")]
    fn has_pool(&self) -> bool {
        false
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lru_budget(&self) -> Option<u64> {
        self.opts.ram.map(|r| r.saturating_sub(self.opts.pin))
    }

    /// Keeps an expert just read (or unpinned) in the second tier, if its policy admits it:
    /// under a budget, by recent use counts ([`RamTiers::insert_frequent`]), not recency.
    fn keep(&self, st: &mut State, key: Key, x: Arc<Expert>, size: u64) {
        match self.lru_budget() {
            Some(budget) => {
                let recent = st.recent.as_ref();
                let count = |k: Key| recent.map_or(0, |c| c.get(k.0, k.1));
                st.tiers.insert_frequent(key, x, size, budget, &count)
            }
            None => st.tiers.insert_lru(key, x, size, None),
        }
    }

    pub fn stats(&self) -> CacheStats {
        let st = self.lock();
        let mut s = st.stats;
        s.hits = s.pinned_hits + s.ram_hits;
        s.bytes_read = self.core.bytes_read.load(Ordering::Relaxed);
        s.cached_bytes = st.tiers.lru_bytes() + st.tiers.pinned_bytes;
        s.cached_experts = (st.tiers.lru_len() + st.tiers.pinned.len()) as u64;
        s.pinned_experts = st.tiers.pinned.len() as u64;
        s.pinned_bytes = st.tiers.pinned_bytes;
        s.direct_io = self.core.source.direct();
        s
    }

    /// Reads expert `index` of `layer` from the source and checks its checksum (whether or
    /// not an earlier read did), bypassing the cache.
    pub fn load(&self, layer: usize, index: usize) -> Result<Arc<Expert>> {
        self.core.read(layer, index, true).map(|(x, _)| x)
    }

    /// Every expert's checksum, calling `progress(done, total)` along the way; returns the
    /// first failure.
    pub fn verify_all(&self, progress: &mut dyn FnMut(usize, usize)) -> Result<()> {
        let total: usize = self.core.layers.iter().flatten().map(|l| l.experts.len()).sum();
        let mut done = 0;
        for (l, li) in self.core.layers.iter().enumerate() {
            if let Some(li) = li {
                for e in 0..li.experts.len() {
                    self.load(l, e)?;
                    done += 1;
                    progress(done, total);
                }
            }
        }
        Ok(())
    }

    /// Moves experts between the pinned and second tiers by the usage counts (see
    /// [`plan_repin`]); returns how many moved. Experts to pin that are not in memory
    /// are read now.
    pub fn repin(&self) -> Result<usize> {
        if self.opts.pin == 0 {
            return Ok(0);
        }
        let (add, drop) = {
            let st = self.lock();
            let Some(counts) = st.counts.as_ref() else { return Ok(0) };
            let pinned: Vec<Key> = st.tiers.pinned.keys().copied().collect();
            plan_repin(&pinned, counts, &|k| self.core.size(k), self.opts.pin)
        };
        let missing: Vec<Key> = add.iter().copied().filter(|k| !self.lock().tiers.contains(k)).collect();
        let mut loaded = Vec::new();
        // A remote source fetches each batch in one request (ByteSource::prefetch) instead
        // of one request per expert; local files ignore the hint.
        for batch in repin_batches(&missing, &|k| self.core.size(k)) {
            let ranges: Vec<(u64, usize)> =
                batch.iter().filter_map(|&(l, e)| self.core.span(l, e).ok().map(|s| (s.1, s.2))).collect();
            self.core.source.prefetch(&ranges)?;
            for &k in batch {
                loaded.push((k, self.core.read(k.0, k.1, false)?));
            }
        }
        let mut st = self.lock();
        for k in &drop {
            if let Some((x, n)) = st.tiers.pinned.remove(k) {
                st.tiers.pinned_bytes -= n;
                self.keep(&mut st, *k, x, n);
            }
        }
        let mut loaded: HashMap<Key, (Arc<Expert>, u64)> = loaded.into_iter().collect();
        for k in &add {
            if let Some((x, n)) = st.tiers.take_lru(k).or_else(|| loaded.remove(k)) {
                st.tiers.pinned_bytes += n;
                st.tiers.pinned.insert(*k, (x, n));
            }
        }
        let moved = add.len() + drop.len();
        st.stats.repinned += moved as u64;
        Ok(moved)
    }

    /// Hands misses of the current layer to the readers while the window has room.
    #[cfg(not(target_arch = "wasm32"))]
    fn pump(&self, st: &mut State) {
        let Some(pool) = &self.pool else { return };
        let window = self.top_k.max(2 * pool.threads());
        let mut jobs = Vec::new();
        while st.staged.values().filter(|s| !s.prefetch).count() + jobs.len() < window {
            let Some(k) = st.demand.pop_front() else { break };
            if st.tiers.contains(&k) || st.staged.contains_key(&k) {
                continue;
            }
            jobs.push(self.stage(st, k, false));
        }
        pool.submit(jobs, true);
    }

    /// Registers a read of `k` and returns the job that performs it.
    #[cfg(not(target_arch = "wasm32"))]
    fn stage(&self, st: &mut State, k: Key, prefetch: bool) -> Box<dyn FnOnce() + Send> {
        let slot: ReadSlot = Arc::new(LoadSlot::default());
        st.staged.insert(k, Staged { slot: slot.clone(), bytes: self.core.size(k), prefetch });
        let core = self.core.clone();
        Box::new(move || {
            if slot.begin() {
                slot.put(core.read(k.0, k.1, false))
            }
        })
    }

    /// Hands the experts of `layer` that are neither held nor already staged to the reader
    /// pool as prefetches; how many.
    fn start_reads(&self, st: &mut std::sync::MutexGuard<'_, State>, layer: usize, experts: &[usize]) -> u64 {
        #[allow(unused_mut)]
        let mut started = 0;
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(pool) = &self.pool {
            let mut jobs = Vec::new();
            for &e in experts {
                let k = (layer, e);
                if st.tiers.contains(&k) || st.staged.contains_key(&k) {
                    continue;
                }
                started += 1;
                st.stats.prefetch_bytes += self.core.size(k);
                jobs.push(self.stage(st, k, true));
            }
            pool.submit(jobs, false);
        }
        #[cfg(target_arch = "wasm32")]
        let _ = (st, layer, experts);
        started
    }

    /// Takes the result of a staged read of `k`, if there is one (blocking until it is done).
    #[cfg(not(target_arch = "wasm32"))]
    fn take_staged(&self, st: &mut std::sync::MutexGuard<'_, State>, k: Key) -> Option<ReadSlot> {
        let s = st.staged.remove(&k)?;
        if s.prefetch {
            st.stats.prefetched_hits += 1;
        }
        self.pump(st);
        Some(s.slot)
    }

    #[cfg(target_arch = "wasm32")]
    fn take_staged(&self, _st: &mut std::sync::MutexGuard<'_, State>, _k: Key) -> Option<()> {
        None
    }
}

impl ExpertSource for ExpertCache {
    fn prepare(&self, layer: usize, experts: &[usize]) -> Result<()> {
        let Some(Some(li)) = self.core.layers.get(layer) else { return Ok(()) };
        let mut st = self.lock();
        if let Some(pred) = st.predicted.remove(&layer) {
            st.stats.lookahead.routed += experts.len() as u64;
            st.stats.lookahead.predicted_hits += experts.iter().filter(|e| pred.contains(e)).count() as u64;
        }
        #[cfg(not(target_arch = "wasm32"))]
        if self.pool.is_some() {
            // Prefetches of this layer that the router did not choose: those still queued
            // are cancelled (their bandwidth goes to the reads this layer needs), those a
            // reader began are wasted.
            let unused: Vec<Key> =
                st.staged.keys().filter(|k| k.0 == layer && !experts.contains(&k.1)).copied().collect();
            for k in unused {
                if let Some(s) = st.staged.remove(&k) {
                    match (s.slot.cancel(), s.prefetch) {
                        (true, true) => st.stats.prefetch_cancelled_bytes += s.bytes,
                        (false, true) => st.stats.prefetch_wasted_bytes += s.bytes,
                        (_, false) => {}
                    }
                }
            }
            st.demand.retain(|k| k.0 != layer);
            let misses: Vec<Key> = experts
                .iter()
                .map(|&e| (layer, e))
                .filter(|k| !st.tiers.contains(k) && !st.staged.contains_key(k))
                .collect();
            st.demand.extend(misses);
            self.pump(&mut st);
            return Ok(());
        }
        let misses: Vec<(u64, usize)> = experts
            .iter()
            .filter(|&&e| !st.tiers.contains(&(layer, e)))
            .filter_map(|&e| li.experts.get(e).map(|&(off, len, _)| (off, len)))
            .collect();
        drop(st);
        if misses.is_empty() {
            return Ok(());
        }
        self.core.source.prefetch(&misses)
    }

    fn lookahead_enabled(&self) -> bool {
        self.opts.lookahead && self.has_pool()
    }

    fn lookahead(&self, layer: usize, experts: &[usize]) {
        if !self.lookahead_enabled() || !matches!(self.core.layers.get(layer), Some(Some(_))) {
            return;
        }
        let mut st = self.lock();
        st.stats.lookahead.predicted += experts.len() as u64;
        st.predicted.insert(layer, experts.to_vec());
        st.stats.lookahead.prefetched += self.start_reads(&mut st, layer, experts);
    }

    fn known(&self, layer: usize, experts: &[usize]) {
        let Some(Some(li)) = self.core.layers.get(layer) else { return };
        if !self.has_pool() {
            return;
        }
        let named: Vec<usize> = experts.iter().copied().filter(|&e| e < li.experts.len()).collect();
        let mut st = self.lock();
        st.stats.lookahead.known += self.start_reads(&mut st, layer, &named);
    }

    fn ready(&self, layer: usize, index: usize) -> bool {
        let st = self.lock();
        let k = (layer, index);
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(s) = st.staged.get(&k) {
            return s.slot.is_ready();
        }
        st.tiers.contains(&k)
    }

    /// In the RAM tiers (or read), or in the byte source's local tier.
    fn local(&self, layer: usize, index: usize) -> bool {
        self.ready(layer, index)
            || self.core.span(layer, index).is_ok_and(|(_, off, len, _)| self.core.source.holds_locally(off, len))
    }

    fn note_use(&self, layer: usize, index: usize, positions: usize) {
        let mut st = self.lock();
        let st = &mut *st;
        for u in [st.counts.as_mut(), st.fresh.as_mut(), st.recent.as_mut()].into_iter().flatten() {
            let _ = u.add(layer, index, positions as u64);
        }
        st.since_decay += positions as u64;
        if st.since_decay >= self.decay_every {
            st.since_decay = 0;
            if let Some(r) = st.recent.as_mut() {
                r.halve();
                st.tiers.recount(&|k: Key| r.get(k.0, k.1));
            }
        }
    }

    fn take_usage(&self) -> Vec<(u64, u64, u64)> {
        let mut st = self.lock();
        let Some(f) = st.fresh.as_mut() else { return Vec::new() };
        let out = f.to_file("", None).counts;
        *f = ExpertUsage::new(f.n_layers(), f.n_experts());
        out
    }

    fn end_turn(&self) -> Result<()> {
        self.repin().map(|_| ())
    }

    fn learn(&self, usage: &ExpertUsage) {
        if let Some(c) = self.lock().counts.as_mut() {
            // Another shape is not this model's usage: ignored.
            let _ = c.merge(usage);
        }
    }

    fn cache_stats(&self) -> Option<CacheStats> {
        Some(self.stats())
    }

    fn cached(&self) -> Vec<(usize, usize)> {
        self.lock().tiers.keys()
    }

    fn expert(&self, layer: usize, index: usize) -> Result<Arc<Expert>> {
        let key = (layer, index);
        let mut st = self.lock();
        if let Some((x, tier)) = st.tiers.get(key) {
            match tier {
                Tier::Pinned => st.stats.pinned_hits += 1,
                Tier::Ram => st.stats.ram_hits += 1,
            }
            return Ok(x);
        }
        st.stats.misses += 1;
        let staged = self.take_staged(&mut st, key);
        st.demand.retain(|k| *k != key);
        drop(st);
        #[cfg(not(target_arch = "wasm32"))]
        let (x, size) = match staged {
            Some(slot) => slot.wait()?,
            None => self.core.read(layer, index, false)?,
        };
        #[cfg(target_arch = "wasm32")]
        let (x, size) = {
            let _ = staged;
            self.core.read(layer, index, false)?
        };
        self.keep(&mut self.lock(), key, x.clone(), size);
        Ok(x)
    }
}

/// Tokens' worth of expert uses (top-k per MoE layer per token) after which the recent
/// counts that the second tier keeps experts by are halved, so that a conversation that
/// moves to other experts gets them kept.
///
/// Why counts and not recency: a step of several sequences touches several tokens' experts
/// (four sampled sequences on 64 experts, top-8: about 27 per layer against 8), and an LRU
/// that cannot hold a whole step evicts each expert before its next use, while popular
/// experts (routing is skewed) stay hot across steps. Measured (docs/benchmarks.md,
/// thirty-eighth session), `coli bench --text docs/architecture.md` on the 64-expert OLMoE
/// shape, MB read per token at 128 MiB / 256 MiB: one sequence 67 / 29 with an LRU, 45 / 17
/// with this; four 67 / 37 against 39 / 18. On the trained demo (tools/bench_pinning.sh,
/// 16 runs) the share of expert uses read from disk fell from 0.353 to 0.313. The period:
/// 16 tokens read least on the demo and on bench_peers' 16-expert shape under a budget of
/// half a token's experts (64: 0.340 and 206 MB per token, 16: 0.313 and 202); the 64-expert
/// synthetic shape, whose popularity is fixed by construction, read 3-8% less with 64.
const DECAY_TOKENS: usize = 16;

/// Bytes of experts that [`ExpertCache::repin`] asks a source for at once (the browser
/// stages them in wasm memory, which never shrinks: kept well inside the 256 MiB of
/// working memory that wasm/src/memory.rs reserves).
const REPIN_BATCH_BYTES: u64 = 32 << 20;

/// `keys` cut into consecutive batches of at most [`REPIN_BATCH_BYTES`] (at least one
/// expert each).
fn repin_batches<'a>(keys: &'a [Key], size: &dyn Fn(Key) -> u64) -> Vec<&'a [Key]> {
    let (mut out, mut start, mut bytes) = (Vec::new(), 0, 0u64);
    for (i, &k) in keys.iter().enumerate() {
        if i > start && bytes + size(k) > REPIN_BATCH_BYTES {
            out.push(&keys[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size(k);
    }
    if start < keys.len() {
        out.push(&keys[start..]);
    }
    out
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
