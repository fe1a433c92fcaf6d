//! The GPU expert pool: routed experts uploaded on first use, kept under a byte budget,
//! least recently used evicted first (the expert supply's [`Lru`]). Experts come from the model's
//! [`ExpertSource`](crate::experts::ExpertSource) as `Arc<Expert>`, so the same source that
//! feeds the CPU path (resident, RAM cache, streamed) feeds the GPU.
//!
//! Evicting only drops the pool's handle: buffers still used by recorded or submitted
//! work stay alive until that work is done (wgpu keeps them), so a pool smaller than
//! one layer's experts is slow, never wrong.

use std::sync::Arc;

use super::buffers::{upload_mat, GpuMat};
use super::GpuContext;
use crate::error::Result;
use crate::experts::lru::Lru;
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
}

pub struct ExpertPool {
    budget: u64,
    /// (layer, expert) -> its buffers
    lru: Lru<(usize, usize), Arc<GpuExpert>>,
    stats: PoolStats,
}

impl ExpertPool {
    pub fn new(budget: u64) -> Self {
        ExpertPool { budget, lru: Lru::default(), stats: PoolStats { budget, ..Default::default() } }
    }

    /// The expert on the GPU, uploading it (and evicting others) if it is not there.
    pub fn get(
        &mut self,
        ctx: &GpuContext,
        layer: usize,
        index: usize,
        fetch: impl FnOnce() -> Result<Arc<Expert>>,
    ) -> Result<Arc<GpuExpert>> {
        if let Some(e) = self.lru.get(&(layer, index)) {
            self.stats.hits += 1;
            return Ok(e);
        }
        self.stats.misses += 1;
        let cpu = fetch()?;
        let gpu = Arc::new(GpuExpert::upload(ctx, &format!("layer{layer}.expert{index}"), &cpu)?);
        let size = gpu.byte_len();
        while self.lru.bytes() + size > self.budget && self.lru.pop_oldest().is_some() {
            self.stats.evictions += 1;
        }
        if size <= self.budget {
            self.lru.insert((layer, index), gpu.clone(), size);
        }
        self.stats.bytes = self.lru.bytes();
        Ok(gpu)
    }

    /// Whether the expert is on the GPU now (no upload needed).
    pub fn contains(&self, layer: usize, index: usize) -> bool {
        self.lru.contains(&(layer, index))
    }

    /// (layer, expert) of every expert on the GPU now, in no particular order.
    pub fn keys(&self) -> Vec<(usize, usize)> {
        self.lru.keys().copied().collect()
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats { bytes: self.lru.bytes(), ..self.stats }
    }

    pub fn len(&self) -> usize {
        self.lru.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lru.is_empty()
    }
}
