//! One step of a turn, written once for every surface. The native loops (`coli generate`,
//! `coli chat`, `coli bench`) call [`Generator::step`], whose forward pass is synchronous;
//! the browser engine awaits [`Generator::step_async`], whose forward pass fetches experts
//! from its storage tiers and whose drafters do the same. Both run the one body below:
//! drafts where there is room, one forward pass of [`Generator::input`], the tokens its
//! logits decide. (The server's batch splits the same step around a pass shared by many
//! sequences: `draft_room`/`push_drafts`, `input`/`logits_wanted`, `accept_pass`.)

use std::future::Future;
use std::pin::pin;
use std::task::{Context as TaskContext, Poll, Waker};

use super::{Drafter, ForwardKeep, Generator};
use crate::error::{Error, Result};
use crate::model::Logits;
use crate::tokenizer::Tokenizer;

/// What a step's forward pass gave back.
pub enum Pass {
    /// The logits [`Generator::logits_wanted`] asked for.
    Logits(Vec<f32>),
    /// Part of a long prompt was fed and nothing is decided yet (the browser feeds a long
    /// prompt in pieces, one per step, so that a cancel is seen between them): the next
    /// step feeds the rest.
    Partial,
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stepped {
    /// The turn had ended: nothing was fed.
    Finished,
    /// The forward pass fed part of the input ([`Pass::Partial`]).
    Partial,
    /// The pass ran and its logits were drawn from; `kept` of the ids fed stay valid in
    /// the context (rejected drafts do not).
    Accepted { kept: usize },
}

impl Generator {
    /// One step of the turn, the same on every surface: drafts from `drafter` where there
    /// is room for them, one forward pass of [`Generator::input`] (`forward(keep, ids,
    /// which)`: the context cut back to its first `keep` positions, then `ids` fed), and
    /// the tokens its logits decide. `fed` is how many positions of the context are valid
    /// before the step and after it. Returns false, feeding nothing, once finished.
    pub fn step<'d>(
        &mut self,
        forward: &mut ForwardKeep<'_>,
        fed: &mut usize,
        drafter: Option<&mut (dyn Drafter + 'd)>,
        tok: Option<&Tokenizer>,
    ) -> Result<bool> {
        let mut drafter = drafter;
        let step = self.step_async(
            fed,
            async |context: &[u32], k| match drafter.as_deref_mut() {
                Some(d) => d.propose(context, k),
                None => Ok(Vec::new()),
            },
            async |keep, ids: &[u32], which| forward(keep, ids, which).map(Pass::Logits),
            tok,
        );
        Ok(ready(step)?? != Stepped::Finished)
    }

    /// [`Generator::step`] with a drafter and a forward pass that may wait (the browser's
    /// storage tiers): `draft(context, k)` proposes up to `k` drafts after `context`,
    /// `forward(keep, ids, which)` runs the pass. `fed` counts the context's valid
    /// positions before and after, as in [`Generator::step`]; a [`Pass::Partial`] leaves
    /// it and the generator as they were.
    pub async fn step_async<D, F>(
        &mut self,
        fed: &mut usize,
        draft: D,
        forward: F,
        tok: Option<&Tokenizer>,
    ) -> Result<Stepped>
    where
        D: AsyncFnOnce(&[u32], usize) -> Result<Vec<u32>>,
        F: AsyncFnOnce(usize, &[u32], Logits) -> Result<Pass>,
    {
        if let k @ 1.. = self.draft_room() {
            let drafts = draft(self.context(), k).await?;
            self.push_drafts(&drafts[..drafts.len().min(k)])?;
        }
        let Some(ids) = self.input() else { return Ok(Stepped::Finished) };
        let ids = ids.to_vec();
        let which = self.logits_wanted();
        let logits = match forward(*fed, &ids, which).await? {
            Pass::Logits(l) => l,
            Pass::Partial => return Ok(Stepped::Partial),
        };
        let vocab = logits.len() / if which == Logits::All { ids.len() } else { 1 };
        let kept = self.accept_pass(&logits, vocab, tok)?;
        *fed += kept;
        Ok(Stepped::Accepted { kept })
    }
}

/// The value of a future that never waits (the synchronous step's closures return at
/// once), polled once; an error rather than a hang if it ever did wait.
fn ready<T>(fut: impl Future<Output = T>) -> Result<T> {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut TaskContext::from_waker(Waker::noop())) {
        Poll::Ready(v) => Ok(v),
        Poll::Pending => Err(Error::Invalid("a synchronous step waited on its forward pass".into())),
    }
}
