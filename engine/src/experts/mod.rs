//! The expert supply: where a routed expert's weights come from. [`ExpertSource`] is what
//! the model asks (resident experts, or the [`cache::ExpertCache`] over a container's data
//! file); below it, [`source::ByteSource`] is where the bytes are read (a local file, memory,
//! the browser's disk tier and fetches from the helper), the native [`reader`] pool loads
//! them ahead of need, [`ram_tiers`] keeps them (pinned by [`usage`], then by recent use).

pub mod cache;
pub mod lru;
#[cfg(not(target_arch = "wasm32"))]
pub mod mirror;
pub mod ram_tiers;
#[cfg(not(target_arch = "wasm32"))]
pub mod reader;
pub mod source;
#[cfg(not(target_arch = "wasm32"))]
pub mod streamed;
pub mod usage;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::kernels::swiglu;
use crate::tensor::Mat;
use cache::CacheStats;

/// One SwiGLU expert: `down(silu(gate x) * up x)`.
#[derive(Clone, Debug)]
pub struct Expert {
    /// (intermediate, hidden)
    pub gate: Mat,
    /// (intermediate, hidden)
    pub up: Mat,
    /// (hidden, intermediate)
    pub down: Mat,
}

impl Expert {
    pub fn forward(&self, x: &[f32], n: usize, out: &mut [f32]) {
        swiglu(&self.gate, &self.up, &self.down, x, n, out)
    }

    pub fn byte_len(&self) -> usize {
        self.gate.byte_len() + self.up.byte_len() + self.down.byte_len()
    }
}

/// Where routed experts come from. The engine asks for an expert only when a position
/// routes to it; implementations decide whether it is resident, cached or fetched.
pub trait ExpertSource: Send + Sync {
    fn expert(&self, layer: usize, index: usize) -> Result<Arc<Expert>>;

    /// Called once per MoE block with every expert it is about to use (ascending), so a
    /// source can fetch all of a layer's misses in one request before they are asked for.
    fn prepare(&self, _layer: usize, _experts: &[usize]) -> Result<()> {
        Ok(())
    }

    /// The (layer, expert) pairs the source holds in memory right now.
    fn cached(&self) -> Vec<(usize, usize)> {
        Vec::new()
    }

    /// Hit/miss counters of the source's cache, if it has one.
    fn cache_stats(&self) -> Option<CacheStats> {
        None
    }

    /// True if [`ExpertSource::expert`] would answer without waiting for a read (the
    /// MoE block computes such experts first).
    fn ready(&self, _layer: usize, _index: usize) -> bool {
        true
    }

    /// True if the expert's bytes are held locally: in memory ([`ExpertSource::ready`]) or
    /// in a local tier of the byte source ([`source::ByteSource::holds_locally`]: the browser's
    /// disk tier), so that reading them waits for no network. Hybrid placement on the GPU
    /// backend (gpu/hybrid.rs) may compute such experts on the CPU.
    fn local(&self, layer: usize, index: usize) -> bool {
        self.ready(layer, index)
    }

    /// Whether the model should call [`ExpertSource::lookahead`].
    fn lookahead_enabled(&self) -> bool {
        false
    }

    /// Router lookahead: these experts of `layer` are likely needed by its next step
    /// (predicted from the previous layer's state); a source may start reading them.
    fn lookahead(&self, _layer: usize, _experts: &[usize]) {}

    /// Hash routing (DeepSeek-V4's `hash_moe` layers): these experts of `layer` will be used
    /// by the pass that is starting, known from its token ids alone. A source with reader
    /// threads starts reading the missing ones now, with or without the router lookahead
    /// (nothing here is a guess).
    fn known(&self, _layer: usize, _experts: &[usize]) {}

    /// `positions` positions were routed to expert `index` of `layer` (usage counting).
    fn note_use(&self, _layer: usize, _index: usize, _positions: usize) {}

    /// The uses noted since the last call, as (layer, expert, count), for the usage file.
    fn take_usage(&self) -> Vec<(u64, u64, u64)> {
        Vec::new()
    }

    /// Adds earlier runs' counts to what pinning goes by (not reported again by
    /// [`ExpertSource::take_usage`]); the next [`ExpertSource::end_turn`] pins by them.
    fn learn(&self, _usage: &usage::ExpertUsage) {}

    /// A conversation turn ended: a cache may re-pin its hottest experts now.
    fn end_turn(&self) -> Result<()> {
        Ok(())
    }
}

/// All experts held in memory (views into the checkpoint's mapped files).
pub struct ResidentExperts {
    /// (layer) -> (expert); empty for dense layers.
    pub layers: Vec<Vec<Arc<Expert>>>,
}

impl ExpertSource for ResidentExperts {
    fn expert(&self, layer: usize, index: usize) -> Result<Arc<Expert>> {
        self.layers
            .get(layer)
            .and_then(|l| l.get(index))
            .cloned()
            .ok_or_else(|| Error::Invalid(format!("no expert {index} in layer {layer}")))
    }
}

/// How well the router lookahead guessed, on either backend (the expert cache's reader
/// pool natively, the GPU forward's own guess on wgpu).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LookaheadStats {
    /// Experts routed to in layers that had a prediction.
    pub routed: u64,
    /// Of those, how many had been predicted.
    pub predicted_hits: u64,
    /// Experts predicted (per layer, the union over positions).
    pub predicted: u64,
    /// Predicted experts that were missing (from the RAM tiers, or the GPU pool) and
    /// were handed to a read or fetch.
    pub prefetched: u64,
    /// Experts that hash routing named when the pass began ([`ExpertSource::known`]) that
    /// were missing and were handed to a read.
    pub known: u64,
}

impl LookaheadStats {
    /// Share of the routed experts that had been predicted (None before any prediction).
    pub fn recall(&self) -> Option<f64> {
        (self.routed > 0).then(|| self.predicted_hits as f64 / self.routed as f64)
    }
}
