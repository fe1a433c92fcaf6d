//! DeepSeek-V4 (`deepseek_v4`; transformers 5.23's modeling_deepseek_v4.py, paper §2):
//! the weights as the checkpoint names them, the per-conversation state, and the CPU
//! CPU bodies of its graph operations (the pass itself is `graph::v4_forward`).
//!
//! What differs from DeepSeek-V3:
//! - **mHC** ([`hc`]): the residual is `hc_mult` streams per position. Before each block a
//!   hyper-connection computes from the RMS-normalised streams (one vector of
//!   `hc_mult * hidden`) the weights pre (sigmoid + eps), post (2 sigmoid) and comb
//!   (softmax rows + eps, then Sinkhorn-Knopp: columns, then `hc_sinkhorn_iters - 1`
//!   times rows and columns, each sum + eps); the block reads sum_j pre_j x_j and the
//!   streams become x'_k = post_k out + sum_j comb_jk x_j. The hyper-head collapses the
//!   streams once more (sigmoid pre) before the final norm.
//! - **Attention** ([`attn`]): one shared key=value head (`kv_proj`, RMSNorm, RoPE on the
//!   trailing `rope_dim` values as interleaved pairs), q-LoRA with a per-head unweighted
//!   RMSNorm, a learned sink logit per head, the sliding window of `sliding_window`
//!   positions, and on compressed layers the compressed entries ([`compress`]); the
//!   output's rope tail is rotated back (at the query's position) and the heads go
//!   through the grouped low-rank output projection (`o_groups` blocks of `o_lora_rank`,
//!   then `o_b_proj`).
//! - **MoE**: `hash_moe` layers take their experts from `tid2eid[token id]`, the others
//!   the top-k of sqrtsoftplus + correction bias ([`crate::model::moe::route_with`]); the
//!   routed and shared experts clamp gate (above) and up (both sides) at `swiglu_limit`.
//!
//! The state a conversation keeps per layer ([`V4State`]) is bounded by design: the last
//! `sliding_window - 1` keys, the compressed entries (one per `rate` positions), the
//! positions of an unfinished compression window and the CSA's overlap carry.

pub mod attn;
pub mod compress;
pub mod hc;
pub mod load;
pub mod moe;
pub mod persist;

use crate::experts::Expert;
use crate::model::snapshots::Snapshots;
use crate::tensor::Mat;

/// A compressor: `kv_proj` / `gate_proj` (width `2 * dim` with the CSA's overlapping
/// windows, else `dim`), the position bias `ape` (rate, width) and the entries' RMSNorm.
pub struct Compressor<M = Mat, V = Vec<f32>> {
    pub kv: M,
    pub gate: M,
    pub ape: V,
    pub norm: V,
    pub dim: usize,
    pub rate: usize,
    pub overlap: bool,
}

impl<M, V> Compressor<M, V> {
    /// Floats of one position's projections: 2 * dim with overlapping windows, else dim.
    pub fn width(&self) -> usize {
        if self.overlap {
            2 * self.dim
        } else {
            self.dim
        }
    }
}

/// The CSA's lightning indexer: its own compressor at `index_head_dim`, its query
/// projection from q_a's normalised output, and the per-head weights.
pub struct Indexer<M = Mat, V = Vec<f32>> {
    pub comp: Compressor<M, V>,
    pub q_b: M,
    pub weights: M,
}

pub struct V4Attention<M = Mat, V = Vec<f32>> {
    pub q_a: M,
    pub q_a_norm: V,
    pub q_b: M,
    /// head_dim ones: the per-head query norm has no weight.
    pub ones: V,
    pub kv: M,
    pub kv_norm: V,
    /// Per group: (o_lora_rank, n_heads * head_dim / o_groups), `o_a_proj`'s row blocks.
    pub o_a: Vec<M>,
    pub o_b: M,
    pub sinks: V,
    pub comp: Option<Compressor<M, V>>,
    pub indexer: Option<Indexer<M, V>>,
}

/// One hyper-connection: `fn` ((2 + N) N, N hidden), `base` ((2 + N) N), `scale` (3).
pub struct HyperConnection<M = Mat, V = Vec<f32>> {
    pub fn_: M,
    pub base: V,
    pub scale: V,
}

pub struct V4Layer<M = Mat, V = Vec<f32>> {
    pub attn_norm: V,
    pub ffn_norm: V,
    pub attn: V4Attention<M, V>,
    pub attn_hc: HyperConnection<M, V>,
    pub ffn_hc: HyperConnection<M, V>,
    /// (n_experts, hidden)
    pub router: Mat,
    /// `e_score_correction_bias` (learned-router layers).
    pub correction_bias: Option<Vec<f32>>,
    /// `hash_moe`: (vocab, top_k) expert ids.
    pub tid2eid: Option<Vec<u32>>,
    pub shared: Expert,
}

/// Everything of a V4 model beyond [`crate::model::Model`]'s embedding, final norm and
/// head; the routed experts are the model's [`crate::experts::ExpertSource`].
pub struct V4Weights<M = Mat, V = Vec<f32>> {
    pub layers: Vec<V4Layer<M, V>>,
    /// The hyper-head: `hc_fn` (N, N hidden), `hc_base` (N), `hc_scale` (1).
    pub head_fn: M,
    pub head_base: V,
    pub head_scale: V,
    /// N * hidden ones: the hyper-connections' input norm has no weight.
    pub hc_ones: V,
    pub main_rope: crate::model::rope::Rope,
    pub compress_rope: crate::model::rope::Rope,
}

/// A compressor's running state: its entries so far (rows of `dim`, RoPE applied), the
/// projections of the positions of the unfinished window (rows of the projection's width,
/// the gate without its position bias), and with overlapping windows the previous window's
/// first halves (kv, and gate with its bias), which the next entry mixes in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompState {
    pub entries: Vec<f32>,
    pub buf_kv: Vec<f32>,
    pub buf_gate: Vec<f32>,
    pub overlap: Option<(Vec<f32>, Vec<f32>)>,
}

/// One layer's state: the last `sliding_window - 1` keys (rows of head_dim; keys are the
/// values), the compressor's and the indexer's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct V4LayerState {
    pub window: Vec<f32>,
    pub comp: CompState,
    pub index: CompState,
}

/// A conversation's state for every layer, after `pos` positions. Two are equal when
/// they hold the same state (whatever snapshots they kept on the way).
#[derive(Clone, Debug, Default)]
pub struct V4State {
    pub pos: usize,
    pub layers: Vec<V4LayerState>,
    /// The model's sizes, for a cache file ([`persist`]).
    pub layout: Option<persist::V4Layout>,
    /// Each layer's state at the start of recent multi-token passes and where they
    /// ended ([`V4State::rewind`]).
    snapshots: Snapshots<Vec<LayerSnapshot>>,
}

impl PartialEq for V4State {
    fn eq(&self, other: &Self) -> bool {
        (self.pos, &self.layers, &self.layout) == (other.pos, &other.layers, &other.layout)
    }
}

/// One layer's state without its compressors' entries, which only grow: how many floats
/// of them it held is enough to go back.
#[derive(Clone, Debug, Default, PartialEq)]
struct LayerSnapshot {
    window: Vec<f32>,
    comp: CompState,
    index: CompState,
    held: (usize, usize),
}

impl LayerSnapshot {
    /// Becomes `l`'s state, in the vectors it has.
    fn take(&mut self, l: &V4LayerState) {
        self.window.clone_from(&l.window);
        for (c, from) in [(&mut self.comp, &l.comp), (&mut self.index, &l.index)] {
            c.entries.clear();
            c.buf_kv.clone_from(&from.buf_kv);
            c.buf_gate.clone_from(&from.buf_gate);
            c.overlap.clone_from(&from.overlap);
        }
        self.held = (l.comp.entries.len(), l.index.entries.len());
    }

    fn restore(&self, l: &mut V4LayerState) {
        l.window.clone_from(&self.window);
        for (c, snap, held) in [(&mut l.comp, &self.comp, self.held.0), (&mut l.index, &self.index, self.held.1)] {
            c.entries.truncate(held);
            c.buf_kv.clone_from(&snap.buf_kv);
            c.buf_gate.clone_from(&snap.buf_gate);
            c.overlap.clone_from(&snap.overlap);
        }
    }
}

impl V4State {
    /// The empty state of a model laid out as `layout`.
    pub fn new(layout: Option<persist::V4Layout>) -> Self {
        V4State { layout, ..Default::default() }
    }

    /// Floats held, without its snapshots' ([`V4State::snapshot_floats`]).
    pub fn floats(&self) -> usize {
        let c = |s: &CompState| {
            s.entries.len()
                + s.buf_kv.len()
                + s.buf_gate.len()
                + s.overlap.as_ref().map_or(0, |(a, b)| a.len() + b.len())
        };
        self.layers.iter().map(|l| l.window.len() + c(&l.comp) + c(&l.index)).sum()
    }

    /// Whether a pass of `n` positions starts with a [`V4State::snapshot`]
    /// ([`Snapshots::begin`]).
    pub(crate) fn begin(&mut self, n: usize) -> bool {
        self.snapshots.begin(n)
    }

    /// Remembers the current state, so that a later [`V4State::rewind`] to here costs no
    /// recomputation: every layer's window and the compressors' unfinished windows (a
    /// few windows of keys; the entries are counted, not copied).
    pub(crate) fn snapshot(&mut self) {
        if self.snapshots.wants(self.pos) {
            // Into the vectors of the snapshot it pushes out, if any.
            let mut old = self.snapshots.make_room().unwrap_or_default();
            old.resize_with(self.layers.len(), LayerSnapshot::default);
            for (s, l) in old.iter_mut().zip(&self.layers) {
                s.take(l);
            }
            self.snapshots.push(self.pos, old);
        }
    }

    /// The positions [`V4State::rewind`]`(positions)` would leave, without going there.
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

    /// Floats its snapshots hold (the entries are counted, not copied).
    pub fn snapshot_floats(&self) -> usize {
        let c = |s: &CompState| {
            s.buf_kv.len() + s.buf_gate.len() + s.overlap.as_ref().map_or(0, |(a, b)| a.len() + b.len())
        };
        let layer = |l: &LayerSnapshot| l.window.len() + c(&l.comp) + c(&l.index);
        self.snapshots.iter().map(|(_, ls)| ls.iter().map(layer).sum::<usize>()).sum()
    }

    /// Goes back to at most `positions` positions: unchanged if it holds no more, else
    /// the latest snapshot at or before `positions`, else the empty state. Returns the
    /// positions now held (the caller feeds the rest again).
    pub fn rewind(&mut self, positions: usize) -> usize {
        if positions >= self.pos {
            return self.pos;
        }
        match self.snapshots.back_to(positions) {
            Some((pos, snap)) => {
                for (l, s) in self.layers.iter_mut().zip(snap) {
                    s.restore(l);
                }
                self.pos = *pos;
            }
            None => {
                // The empty state, with the snapshots' bookkeeping (none left, a pin).
                let snapshots = std::mem::take(&mut self.snapshots);
                *self = V4State { snapshots, ..V4State::new(self.layout.take()) };
            }
        }
        self.pos
    }
}

/// The sizes of a hyper-connection operation over n positions: N streams of `hidden`,
/// Sinkhorn-Knopp's iterations and epsilon.
#[derive(Clone, Copy, Debug)]
pub struct HcShape {
    pub n: usize,
    pub n_hc: usize,
    pub hidden: usize,
    pub iters: usize,
    pub eps: f32,
}

/// The indexer's choice for n queries: `heads` of `head_dim`, the top `topk` of the
/// entries each may see (one per `rate` positions).
#[derive(Clone, Copy, Debug)]
pub struct SelectShape {
    pub n: usize,
    pub pos0: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub topk: usize,
    pub rate: usize,
}
