//! Several sequences in one forward pass (continuous batching, issue #35): each sequence
//! brings its own session (caches, recurrent states) and its new tokens; the pass runs the
//! rows of all of them together through the one graph (model::graph), so every matrix is
//! read once per step for the whole batch and a MoE layer reads and runs each expert once
//! for every row routed to it (the batch's union). Attention, DSA's indexer and Gated
//! DeltaNet's recurrence run per sequence over its own caches (cpu::CpuOps over several
//! sequences), and so do DeepSeek-V4's compressors, indexer and attention, each sequence
//! over its own V4 state.
//!
//! Exact: every kernel computes a row from that row alone in a fixed order, so a
//! sequence's logits are the bits it gets alone (engine/tests/it/batch.rs asserts it on every
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
        let rows = self.forward_batch_full(sessions, ids, which, &vec![false; ids.len()], &mut |_, _, _| {})?;
        Ok(rows.into_iter().map(|(logits, _)| logits).collect())
    }

    /// [`Model::forward_batch_rows`] that also gives, for each sequence with `hidden[i]`,
    /// the final-normed states of its own ids ((ids, hidden) row-major: what
    /// [`Model::forward_hidden`] gives it alone, bit for bit; empty for the others). An MTP
    /// drafter's sequence records them, so it runs in the batch like any other.
    pub fn forward_batch_hidden(
        &self,
        sessions: &mut [&mut Session],
        ids: &[&[u32]],
        which: &[Option<Logits>],
        hidden: &[bool],
    ) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
        self.forward_batch_full(sessions, ids, which, hidden, &mut |_, _, _| {})
    }

    /// [`Model::forward_batch`], reporting every routed expert use as
    /// [`Model::forward_with`] does: `on_use(layer, expert, positions)`, once for the batch.
    pub fn forward_batch_with(
        &self,
        sessions: &mut [&mut Session],
        ids: &[&[u32]],
        on_use: &mut dyn FnMut(usize, usize, usize),
    ) -> Result<Vec<Vec<f32>>> {
        let n = ids.len();
        let rows = self.forward_batch_full(sessions, ids, &vec![Some(Logits::Last); n], &vec![false; n], on_use)?;
        Ok(rows.into_iter().map(|(logits, _)| logits).collect())
    }

    fn forward_batch_full(
        &self,
        sessions: &mut [&mut Session],
        ids: &[&[u32]],
        which: &[Option<Logits>],
        hidden: &[bool],
        on_use: &mut dyn FnMut(usize, usize, usize),
    ) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
        self.check_cpu()?;
        let c = &self.cfg;
        if sessions.len() != ids.len() || which.len() != ids.len() || hidden.len() != ids.len() {
            return Err(Error::Invalid(format!(
                "{} sessions, {} logits choices and {} state choices for {} inputs",
                sessions.len(),
                which.len(),
                hidden.len(),
                ids.len()
            )));
        }
        if let Some(i) = ids.iter().position(|t| t.is_empty()) {
            return Err(Error::Invalid(format!("sequence {i} of the batch has no tokens")));
        }
        for s in sessions.iter_mut() {
            self.v4_ready(s);
        }
        // A sequence whose recurrent state went back further than its tokens feeds the
        // tokens in between again first, as Model::forward does (DeepSeek-V4's state
        // restarted by a truncation: all of them).
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
        let (mut states, mut state_counts) = (Vec::new(), Vec::with_capacity(feeds.len()));
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
            let with = if hidden[counts.len() - 1] { t.len() } else { 0 };
            states.extend(end - with..end);
            state_counts.push(with);
            s.verifying(w.is_some_and(|w| super::snapshots::decode_like(t.len(), w)));
            let Session { caches, tokens, v4 } = &mut **s;
            let seq = cpu::Seq::new(tokens.len(), feed.len(), caches);
            seqs.push(match v4.as_deref_mut() {
                Some(state) => {
                    if state.begin(feed.len()) {
                        state.snapshot();
                    }
                    seq.with_v4(state)
                }
                None => seq,
            });
        }
        let all: Vec<u32> = feeds.iter().flatten().copied().collect();
        let mut ops = cpu::CpuOps::batch(&self.rope, seqs);
        if let Some(w) = &self.v4 {
            ops = ops.with_v4(&w.main_rope, &w.compress_rope);
        }
        let mut pass = cpu::CpuPass { ops, model: self, on_use, on_ffn_input: &mut |_, _| {} };
        let logits = graph::run_ready(graph::forward_rows(&mut pass, &all, &rows, &states))?;
        drop(pass);
        match logits {
            Ok((logits, hs)) => {
                for (s, feed) in sessions.iter_mut().zip(&feeds) {
                    s.tokens.extend_from_slice(feed);
                    if let Some(v) = s.v4.as_deref_mut().filter(|_| self.v4.is_some()) {
                        v.pos += feed.len();
                    }
                }
                let mut out = Vec::with_capacity(counts.len());
                let (mut at, mut hat) = (0, 0);
                for (k, kh) in counts.into_iter().zip(state_counts) {
                    let l = logits[at * c.vocab..(at + k) * c.vocab].to_vec();
                    out.push((l, hs[hat * c.hidden..(hat + kh) * c.hidden].to_vec()));
                    at += k;
                    hat += kh;
                }
                Ok(out)
            }
            Err(e) => {
                // Leave every session as it was before the pass (its caches may hold part;
                // a DeepSeek-V4 state restarts, as Model::forward's does, and the next pass
                // feeds its tokens again).
                for s in sessions.iter_mut() {
                    if self.v4.is_some() {
                        s.v4 = Some(self.fresh_v4());
                    }
                    let len = s.tokens.len();
                    s.truncate(len);
                }
                Err(e)
            }
        }
    }
}
