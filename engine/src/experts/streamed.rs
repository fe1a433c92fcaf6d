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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::cache::CacheStats;
use super::lru::Lru;
use super::{Expert, ExpertSource};
use crate::error::{Error, Result};
use crate::format::tensors::MatReader;
use crate::tensor::Mat;

pub struct StreamedExperts {
    /// (layer) -> (expert) with placeholder matrices; empty for dense layers.
    layers: Vec<Vec<Arc<Expert>>>,
    shards: Arc<dyn MatReader>,
    cache: Mutex<Lru<(usize, usize), Arc<Expert>>>,
    budget: u64,
    /// Experts found in the kept set, experts read, and the bytes of those read.
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_read: AtomicU64,
}

impl StreamedExperts {
    /// Experts whose matrices are placeholders in `shards`, keeping at most `budget` bytes
    /// of them in memory (0: none, each read when used).
    pub fn new(layers: Vec<Vec<Arc<Expert>>>, shards: Arc<dyn MatReader>, budget: u64) -> Self {
        StreamedExperts {
            layers,
            shards,
            cache: Mutex::new(Lru::default()),
            budget,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
        }
    }

    fn read(&self, m: &Mat) -> Result<Mat> {
        self.shards.read_mat(m)
    }
}

impl ExpertSource for StreamedExperts {
    fn expert(&self, layer: usize, index: usize) -> Result<Arc<Expert>> {
        let key = (layer, index);
        if let Some(x) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(x);
        }
        let p = self
            .layers
            .get(layer)
            .and_then(|l| l.get(index))
            .ok_or_else(|| Error::Invalid(format!("no expert {index} in layer {layer}")))?;
        let x = Arc::new(Expert { gate: self.read(&p.gate)?, up: self.read(&p.up)?, down: self.read(&p.down)? });
        let bytes = x.byte_len() as u64;
        self.misses.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        if bytes <= self.budget {
            let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
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
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).contains(&(layer, index))
    }

    fn cached(&self) -> Vec<(usize, usize)> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect()
    }

    fn cache_stats(&self) -> Option<CacheStats> {
        let c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let hits = self.hits.load(Ordering::Relaxed);
        Some(CacheStats {
            hits,
            ram_hits: hits,
            misses: self.misses.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            cached_bytes: c.bytes(),
            cached_experts: c.len() as u64,
            ..CacheStats::default()
        })
    }
}
