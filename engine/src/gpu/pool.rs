//! The GPU expert pool: routed experts uploaded on first use, kept under a byte budget,
//! least recently used evicted first (the expert supply's [`Lru`]); experts pinned by
//! learned usage ([`ExpertPool::repin`], the RAM tier's rule and hysteresis) are never
//! evicted. Experts come from the model's
//! [`ExpertSource`](crate::experts::ExpertSource) as `Arc<Expert>`, so the same source that
//! feeds the CPU path (resident, RAM cache, streamed) feeds the GPU.
//!
//! Evicting only drops the pool's handle: buffers still used by recorded or submitted
//! work stay alive until that work is done (wgpu keeps them), so a pool smaller than
//! one layer's experts is slow, never wrong.

use std::collections::HashMap;
use std::sync::Arc;

use super::buffers::{upload_mat, GpuMat};
use super::GpuContext;
use crate::error::Result;
use crate::experts::lru::Lru;
use crate::experts::ram_tiers::{plan_repin, Key};
use crate::experts::usage::ExpertUsage;
use crate::experts::Expert;

/// One expert's three matrices on the GPU.
pub struct GpuExpert {
    /// (intermediate, hidden)
    pub gate: GpuMat,
    /// (intermediate, hidden)
    pub up: GpuMat,
    /// (hidden, intermediate)
    pub down: GpuMat,
}

impl GpuExpert {
    pub fn upload(ctx: &GpuContext, label: &str, e: &Expert) -> Result<Self> {
        Ok(GpuExpert {
            gate: upload_mat(ctx, &format!("{label}.gate"), &e.gate)?,
            up: upload_mat(ctx, &format!("{label}.up"), &e.up)?,
            down: upload_mat(ctx, &format!("{label}.down"), &e.down)?,
        })
    }

    pub fn byte_len(&self) -> u64 {
        self.gate.byte_len() + self.up.byte_len() + self.down.byte_len()
    }
}

/// Counters for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub bytes: u64,
    pub budget: u64,
    /// Experts pinned by learned usage, their bytes, and moves in or out of the pin set.
    pub pinned: u64,
    pub pinned_bytes: u64,
    pub repinned: u64,
}

pub struct ExpertPool {
    budget: u64,
    /// (layer, expert) -> its buffers
    lru: Lru<(usize, usize), Arc<GpuExpert>>,
    /// Outside the LRU and never evicted; their bytes count against `budget` too.
    pinned: HashMap<Key, Arc<GpuExpert>>,
    pinned_bytes: u64,
    stats: PoolStats,
}

impl ExpertPool {
    pub fn new(budget: u64) -> Self {
        ExpertPool {
            budget,
            lru: Lru::default(),
            pinned: HashMap::new(),
            pinned_bytes: 0,
            stats: PoolStats { budget, ..Default::default() },
        }
    }

    /// The expert on the GPU, uploading it (and evicting others) if it is not there.
    pub fn get(
        &mut self,
        ctx: &GpuContext,
        layer: usize,
        index: usize,
        fetch: impl FnOnce() -> Result<Arc<Expert>>,
    ) -> Result<Arc<GpuExpert>> {
        if let Some(e) = self.pinned.get(&(layer, index)).cloned().or_else(|| self.lru.get(&(layer, index))) {
            self.stats.hits += 1;
            return Ok(e);
        }
        self.stats.misses += 1;
        let cpu = fetch()?;
        let gpu = Arc::new(GpuExpert::upload(ctx, &format!("layer{layer}.expert{index}"), &cpu)?);
        let size = gpu.byte_len();
        let budget = self.budget.saturating_sub(self.pinned_bytes);
        while self.lru.bytes() + size > budget && self.lru.pop_oldest().is_some() {
            self.stats.evictions += 1;
        }
        if size <= budget {
            self.lru.insert((layer, index), gpu.clone(), size);
        }
        self.stats.bytes = self.lru.bytes();
        Ok(gpu)
    }

    /// Re-pins by `counts`: the hottest experts that fit `pin_budget` bytes (at most the
    /// pool's budget) with [`plan_repin`]'s hysteresis; `size` gives an expert's bytes on
    /// the GPU, `fetch` its weights for an upload. Returns how many moved.
    pub fn repin(
        &mut self,
        ctx: &GpuContext,
        counts: &ExpertUsage,
        pin_budget: u64,
        size: &dyn Fn(Key) -> u64,
        fetch: &dyn Fn(Key) -> Result<Arc<Expert>>,
    ) -> Result<usize> {
        let current: Vec<Key> = self.pinned.keys().copied().collect();
        let (add, drop) = plan_repin(&current, counts, size, pin_budget.min(self.budget));
        for k in &drop {
            if let Some(x) = self.pinned.remove(k) {
                let n = x.byte_len();
                self.pinned_bytes -= n;
                self.lru.insert(*k, x, n);
            }
        }
        for &k in &add {
            let x = match self.lru.remove(&k) {
                Some((x, _)) => x,
                None => {
                    let cpu = fetch(k)?;
                    Arc::new(GpuExpert::upload(ctx, &format!("layer{}.expert{}", k.0, k.1), &cpu)?)
                }
            };
            self.pinned_bytes += x.byte_len();
            self.pinned.insert(k, x);
        }
        let budget = self.budget.saturating_sub(self.pinned_bytes);
        while self.lru.bytes() > budget && self.lru.pop_oldest().is_some() {
            self.stats.evictions += 1;
        }
        self.stats.repinned += (add.len() + drop.len()) as u64;
        Ok(add.len() + drop.len())
    }

    /// Whether the expert is on the GPU now (no upload needed).
    pub fn contains(&self, layer: usize, index: usize) -> bool {
        self.pinned.contains_key(&(layer, index)) || self.lru.contains(&(layer, index))
    }

    /// Bytes the pool can take without evicting anything.
    pub fn free_bytes(&self) -> u64 {
        self.budget.saturating_sub(self.pinned_bytes).saturating_sub(self.lru.bytes())
    }

    /// (layer, expert) of every expert on the GPU now, in no particular order.
    pub fn keys(&self) -> Vec<(usize, usize)> {
        self.pinned.keys().chain(self.lru.keys()).copied().collect()
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            bytes: self.lru.bytes() + self.pinned_bytes,
            pinned: self.pinned.len() as u64,
            pinned_bytes: self.pinned_bytes,
            ..self.stats
        }
    }

    pub fn len(&self) -> usize {
        self.lru.len() + self.pinned.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
