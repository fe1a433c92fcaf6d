//! Drafts from the model's own multi-token-prediction layer ([`crate::model::mtp`]), as
//! vLLM and SGLang use DeepSeek-V3's: after each verifying pass, the MTP layer reads the
//! main model's hidden state of every position the pass kept and the token after it, and
//! proposes the token after next; further drafts chain the layer on its own output. The
//! target model verifies the drafts like any others ([`super::drive_drafted`]), so the
//! output is exactly the output without.

use std::cell::RefCell;
use std::ops::Deref;
use std::rc::Rc;

use super::Drafter;
use crate::error::{Error, Result};
use crate::math;
use crate::model::attention::LayerCache;
use crate::model::{Logits, Model, Session};

/// The main model's final-normed hidden states, one row per position fed (the target's
/// forward pass writes them, the [`MtpDrafter`] reads them).
#[derive(Clone, Default)]
pub struct HiddenLog(Rc<RefCell<Vec<f32>>>);

impl HiddenLog {
    /// Rows of positions `keep..` from a pass that fed them after the first `keep`
    /// positions (what [`Model::forward_hidden`] returns); later rows are dropped.
    pub fn record(&self, keep: usize, hidden: usize, rows: &[f32]) {
        let mut v = self.0.borrow_mut();
        v.truncate(keep * hidden);
        v.extend_from_slice(rows);
    }
}

/// A target forward pass that also records the hidden states for the MTP drafter: cuts
/// `session` back to `keep` positions, feeds `ids`, returns `which` logits.
pub fn forward_recording(
    model: &Model,
    session: &mut Session,
    log: &HiddenLog,
    keep: usize,
    ids: &[u32],
    which: Logits,
) -> Result<Vec<f32>> {
    session.truncate(keep);
    let (logits, hidden) = model.forward_hidden(session, ids, which)?;
    log.record(keep, model.cfg.hidden, &hidden);
    Ok(logits)
}

/// Greedy drafts from `model`'s MTP layer, with the layer's own KV cache. `M` is how the
/// drafter holds the model (`&Model`, or `Rc<Model>` in the browser engine).
pub struct MtpDrafter<M> {
    model: M,
    log: HiddenLog,
    cache: LayerCache,
    /// The context whose MTP positions `cache` holds: position i read ctx[..=i + 1].
    ctx: Vec<u32>,
}

impl<M: Deref<Target = Model>> MtpDrafter<M> {
    /// A drafter for `model` (an error if it has no MTP layer); the target's forward
    /// passes must record into [`MtpDrafter::log`].
    pub fn new(model: M) -> Result<Self> {
        if !model.has_mtp() {
            return Err(Error::Invalid(
                "this model has no MTP layer (num_nextn_predict_layers is 0, or it was converted without it)".into(),
            ));
        }
        Ok(MtpDrafter { model, log: HiddenLog::default(), cache: LayerCache::default(), ctx: Vec::new() })
    }

    pub fn log(&self) -> HiddenLog {
        self.log.clone()
    }
}

impl<M: Deref<Target = Model>> Drafter for MtpDrafter<M> {
    fn propose(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>> {
        let (h, len, max) = (self.model.cfg.hidden, context.len(), self.model.cfg.max_positions);
        // Position i reads h_i and t_{i+1}: the context's last token is not fed yet, so
        // positions 0..len-1 are known.
        if k == 0 || len < 2 {
            return Ok(Vec::new());
        }
        let log = self.log.0.borrow();
        if log.len() < (len - 1) * h {
            return Err(Error::Invalid(format!(
                "mtp: the model fed {} positions, the context needs {}",
                log.len() / h,
                len - 1
            )));
        }
        // What the cache holds of this context (at least the last position is redone:
        // its output starts the drafts).
        let same = self.ctx.iter().zip(context).take_while(|(a, b)| a == b).count();
        let valid = same.saturating_sub(1).min(self.cache.len()).min(len - 2);
        self.cache.truncate(valid);
        let (mut logits, out) = self.model.mtp_forward(
            &mut self.cache,
            valid,
            &log[valid * h..(len - 1) * h],
            &context[valid + 1..],
            Logits::Last,
        )?;
        self.ctx = context.to_vec();
        let mut state = out[out.len() - h..].to_vec();
        let mut drafts = Vec::with_capacity(k);
        loop {
            let id = math::argmax(&logits) as u32;
            drafts.push(id);
            // The next chained position, after the known ones and the drafts before.
            let pos = len - 2 + drafts.len();
            if drafts.len() == k || pos >= max {
                break;
            }
            let (l, o) = self.model.mtp_forward(&mut self.cache, pos, &state, &[id], Logits::Last)?;
            (logits, state) = (l, o);
        }
        // The chained positions read the layer's own output, not the model's: dropped.
        self.cache.truncate(len - 1);
        Ok(drafts)
    }
}
