//! The routed experts of a Hugging Face checkpoint too large to read into memory
//! ([`TensorStore::open_dir_streamed`](crate::format::tensors::TensorStore::open_dir_streamed)):
//! each expert's matrices are placeholders in the checkpoint's shards, read with pread
//! into owned memory when a position routes to it and kept in a least-recently-used set
//! of a byte budget. Nothing is memory-mapped, so a shard truncated or replaced while the
//! model is served gives an error for the request that needs the missing bytes, never a
//! SIGBUS. The FP8 pairs of a block-scaled checkpoint are read the same way, through
//! [`crate::format::fp8::Fp8Table`], whether its bytes are in memory or in the shards.
//! Its [`CacheStats`] count the reads (`misses`, and `bytes_read`: each expert read counts
//! its size as it is held, the bytes `coli convert` would store for it) and the hits of
//! the kept set, so `coli bench` on a Hugging Face directory reports what it streams.
//! Experts named before they are routed to (DeepSeek-V4's hash layers,
//! [`ExpertSource::known`]) are read ahead on two reader threads, within the budget.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::cache::CacheStats;
use super::lru::Lru;
use super::reader::{LoadSlot, ReaderPool};
use super::{Expert, ExpertSource};
use crate::error::{Error, Result};
use crate::format::tensors::MatReader;

/// Reader threads for the reads started ahead of use ([`ExpertSource::known`]).
const READERS: usize = 2;

/// At most this many of one layer's experts read ahead per pass: a decode step's (V4-Flash
/// routes to 6), not a long prompt's many, whose reads would take the cores from its
/// compute.
const AHEAD_PER_LAYER: usize = 8;

type Slot = Arc<LoadSlot<Arc<Expert>>>;

/// What the reader threads share with the model: where the experts are, and the counts
/// of what was read.
struct Core {
    /// (layer) -> (expert) with placeholder matrices; empty for dense layers.
    layers: Vec<Vec<Arc<Expert>>>,
    shards: Arc<dyn MatReader>,
    /// Experts read, and the bytes of those read.
    misses: AtomicU64,
    bytes_read: AtomicU64,
}

impl Core {
    fn placeholder(&self, layer: usize, index: usize) -> Result<&Arc<Expert>> {
        self.layers
            .get(layer)
            .and_then(|l| l.get(index))
            .ok_or_else(|| Error::Invalid(format!("no expert {index} in layer {layer}")))
    }

    /// Expert `index` of `layer` read into memory (pread, into owned memory).
    fn read(&self, layer: usize, index: usize) -> Result<Arc<Expert>> {
        let p = self.placeholder(layer, index)?;
        let r = |m| self.shards.read_mat(m);
        let x = Arc::new(Expert { gate: r(&p.gate)?, up: r(&p.up)?, down: r(&p.down)? });
        self.misses.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(x.byte_len() as u64, Ordering::Relaxed);
        Ok(x)
    }
}

pub struct StreamedExperts {
    core: Arc<Core>,
    cache: Mutex<Lru<(usize, usize), Arc<Expert>>>,
    budget: u64,
    /// Experts found in the kept set.
    hits: AtomicU64,
    /// Reads started ahead of use, by (layer, expert), until the MoE takes them; at most
    /// `budget` bytes of them at a time.
    staged: Mutex<HashMap<(usize, usize), Slot>>,
    /// Started with the first read ahead (None: it could not start; reads stay on demand).
    pool: OnceLock<Option<ReaderPool>>,
    /// Reads started ahead, their bytes (as stored), and those the MoE then took.
    known: AtomicU64,
    prefetch_bytes: AtomicU64,
    prefetched_hits: AtomicU64,
}

impl StreamedExperts {
    /// Experts whose matrices are placeholders in `shards`, keeping at most `budget` bytes
    /// of them in memory (0: none, each read when used, and none read ahead).
    pub fn new(layers: Vec<Vec<Arc<Expert>>>, shards: Arc<dyn MatReader>, budget: u64) -> Self {
        StreamedExperts {
            core: Arc::new(Core { layers, shards, misses: AtomicU64::new(0), bytes_read: AtomicU64::new(0) }),
            cache: Mutex::new(Lru::default()),
            budget,
            hits: AtomicU64::new(0),
            staged: Mutex::new(HashMap::new()),
            pool: OnceLock::new(),
            known: AtomicU64::new(0),
            prefetch_bytes: AtomicU64::new(0),
            prefetched_hits: AtomicU64::new(0),
        }
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Lru<(usize, usize), Arc<Expert>>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_staged(&self) -> std::sync::MutexGuard<'_, HashMap<(usize, usize), Slot>> {
        self.staged.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ExpertSource for StreamedExperts {
    fn expert(&self, layer: usize, index: usize) -> Result<Arc<Expert>> {
        let key = (layer, index);
        if let Some(x) = self.lock_cache().get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(x);
        }
        // A read started ahead (its reader may still be at it), else one now.
        let ahead = self.lock_staged().remove(&key);
        let x = match ahead {
            Some(slot) => {
                self.prefetched_hits.fetch_add(1, Ordering::Relaxed);
                slot.wait()?
            }
            None => self.core.read(layer, index)?,
        };
        let bytes = x.byte_len() as u64;
        if bytes <= self.budget {
            let mut c = self.lock_cache();
            while c.bytes() + bytes > self.budget {
                if c.pop_oldest().is_none() {
                    break;
                }
            }
            c.insert(key, x.clone(), bytes);
        }
        Ok(x)
    }

    fn ready(&self, layer: usize, index: usize) -> bool {
        let key = (layer, index);
        self.lock_cache().contains(&key) || self.lock_staged().get(&key).is_some_and(|s| s.is_ready())
    }

    /// Experts named before they are routed to (DeepSeek-V4's hash layers): their reads
    /// start now on the reader threads, as many as `budget` bytes can hold beside those
    /// already started; [`ExpertSource::expert`] takes them (waiting for one still being
    /// read). The same experts, the same bits, only read earlier.
    fn known(&self, layer: usize, experts: &[usize]) {
        if self.budget == 0 {
            return;
        }
        let Some(pool) = self.pool.get_or_init(|| ReaderPool::new(READERS).ok()) else { return };
        let cache = self.lock_cache();
        let mut staged = self.lock_staged();
        let size = |k: &(usize, usize)| self.core.placeholder(k.0, k.1).map_or(0, |p| p.byte_len() as u64);
        let mut held: u64 = staged.keys().map(size).sum();
        let mut jobs: Vec<Box<dyn FnOnce() + Send>> = Vec::new();
        for &e in experts.iter().take(AHEAD_PER_LAYER) {
            let key = (layer, e);
            if self.core.placeholder(layer, e).is_err() || cache.contains(&key) || staged.contains_key(&key) {
                continue;
            }
            let bytes = size(&key);
            if held + bytes > self.budget {
                break;
            }
            held += bytes;
            let slot: Slot = Arc::default();
            staged.insert(key, slot.clone());
            let core = self.core.clone();
            jobs.push(Box::new(move || {
                if slot.begin() {
                    slot.put(core.read(layer, e));
                }
            }));
            self.known.fetch_add(1, Ordering::Relaxed);
            self.prefetch_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        drop((cache, staged));
        pool.submit(jobs, false);
    }

    fn cached(&self) -> Vec<(usize, usize)> {
        self.lock_cache().keys().copied().collect()
    }

    fn cache_stats(&self) -> Option<CacheStats> {
        let c = self.lock_cache();
        let hits = self.hits.load(Ordering::Relaxed);
        let mut st = CacheStats {
            hits,
            ram_hits: hits,
            misses: self.core.misses.load(Ordering::Relaxed),
            prefetched_hits: self.prefetched_hits.load(Ordering::Relaxed),
            bytes_read: self.core.bytes_read.load(Ordering::Relaxed),
            cached_bytes: c.bytes(),
            cached_experts: c.len() as u64,
            prefetch_bytes: self.prefetch_bytes.load(Ordering::Relaxed),
            ..CacheStats::default()
        };
        st.lookahead.known = self.known.load(Ordering::Relaxed);
        Some(st)
    }
}
