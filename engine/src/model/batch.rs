//! Several sequences in one forward pass (continuous batching, issue #35): each sequence
//! brings its own session (caches, recurrent states) and its new tokens; the pass runs the
//! rows of all of them together through the one graph (model::graph), so every matrix is
//! read once per step for the whole batch and a MoE layer reads and runs each expert once
//! for every row routed to it (the batch's union). Attention, DSA's indexer and Gated
//! DeltaNet's recurrence run per sequence over its own caches (cpu::CpuOps over several
//! sequences).
//!
//! Exact: every kernel computes a row from that row alone in a fixed order, so a
//! sequence's logits are the bits it gets alone (engine/tests/batch.rs asserts it on every
//! fixture family).

use crate::error::{Error, Result};
use crate::model::attention::LayerCache;
use crate::model::{cpu, graph, Logits, Model, Session};

impl Model {
    /// One forward pass over several sessions: `ids[i]` are fed to `sessions[i]` (at least
    /// one token each); returns each sequence's last-position logits, in order.
    pub fn forward_batch(&self, sessions: &mut [&mut Session], ids: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        self.forward_batch_with(sessions, ids, &mut |_, _, _| {})
    }

    /// Whether [`Model::forward_batch`] runs this model (DeepSeek-V4 does not yet: one
    /// sequence per pass there).
    pub fn batches(&self) -> bool {
        self.v4.is_none()
    }

    /// [`Model::forward_batch`] with the logits each sequence asks for: `which[i]` None
    /// (an unfinished prompt's chunk: none), `Last` (its last position's row) or `All`
    /// (a row per id of `ids[i]`, as [`Model::forward`] gives them); each sequence's rows
    /// in order, (rows, vocab) row-major.
    pub fn forward_batch_rows(
        &self,
        sessions: &mut [&mut Session],
        ids: &[&[u32]],
        which: &[Option<Logits>],
    ) -> Result<Vec<Vec<f32>>> {
        self.forward_batch_full(sessions, ids, which, &mut |_, _, _| {})
    }

    /// [`Model::forward_batch`], reporting every routed expert use as
    /// [`Model::forward_with`] does: `on_use(layer, expert, positions)`, once for the batch.
    pub fn forward_batch_with(
        &self,
        sessions: &mut [&mut Session],
        ids: &[&[u32]],
        on_use: &mut dyn FnMut(usize, usize, usize),
    ) -> Result<Vec<Vec<f32>>> {
        self.forward_batch_full(sessions, ids, &vec![Some(Logits::Last); ids.len()], on_use)
    }

    fn forward_batch_full(
        &self,
        sessions: &mut [&mut Session],
        ids: &[&[u32]],
        which: &[Option<Logits>],
        on_use: &mut dyn FnMut(usize, usize, usize),
    ) -> Result<Vec<Vec<f32>>> {
        self.check_cpu()?;
        let c = &self.cfg;
        if sessions.len() != ids.len() || which.len() != ids.len() {
            return Err(Error::Invalid(format!(
                "{} sessions and {} logits choices for {} inputs",
                sessions.len(),
                which.len(),
                ids.len()
            )));
        }
        if let Some(i) = ids.iter().position(|t| t.is_empty()) {
            return Err(Error::Invalid(format!("sequence {i} of the batch has no tokens")));
        }
        // A sequence whose recurrent state went back further than its tokens feeds the
        // tokens in between again first, as Model::forward does.
        let mut feeds: Vec<Vec<u32>> = Vec::with_capacity(ids.len());
        for (s, t) in sessions.iter().zip(ids) {
            let held = s.cached_len();
            let mut feed: Vec<u32> = s.tokens[held..].to_vec();
            feed.extend_from_slice(t);
            c.check_input(&feed, held)?;
            feeds.push(feed);
        }
        for s in sessions.iter_mut() {
            let held = s.cached_len();
            s.tokens.truncate(held);
            if s.caches.len() != c.n_layers {
                s.caches = vec![LayerCache::default(); c.n_layers];
            }
        }
        // The rows each sequence asks for: of its own ids, not of those fed again.
        let mut rows = Vec::with_capacity(feeds.len());
        let mut counts = Vec::with_capacity(feeds.len());
        let mut seqs = Vec::with_capacity(feeds.len());
        let mut end = 0;
        for (((s, feed), t), w) in sessions.iter_mut().zip(&feeds).zip(ids).zip(which) {
            end += feed.len();
            let first = match w {
                None => end,
                Some(Logits::Last) => end - 1,
                Some(Logits::All) => end - t.len(),
            };
            rows.extend(first..end);
            counts.push(end - first);
            seqs.push(cpu::Seq::new(s.tokens.len(), feed.len(), &mut s.caches));
        }
        let all: Vec<u32> = feeds.iter().flatten().copied().collect();
        let mut pass = cpu::CpuPass {
            ops: cpu::CpuOps::batch(&self.rope, seqs),
            model: self,
            on_use,
            on_ffn_input: &mut |_, _| {},
        };
        let logits = graph::run_ready(graph::forward_rows(&mut pass, &all, &rows))?;
        drop(pass);
        match logits {
            Ok(logits) => {
                for (s, feed) in sessions.iter_mut().zip(&feeds) {
                    s.tokens.extend_from_slice(feed);
                }
                let mut out = Vec::with_capacity(counts.len());
                let mut at = 0;
                for k in counts {
                    out.push(logits[at * c.vocab..(at + k) * c.vocab].to_vec());
                    at += k;
                }
                Ok(out)
            }
            Err(e) => {
                // Leave every session as it was before the pass (its caches may hold part).
                for s in sessions.iter_mut() {
                    let len = s.tokens.len();
                    s.truncate(len);
                }
                Err(e)
            }
        }
    }
}
