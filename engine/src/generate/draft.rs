//! Where draft tokens come from. Prompt lookup ([`super::speculate::lookup`]) works inside
//! the [`super::Generator`]; a [`Drafter`] proposes drafts from outside it, between two
//! verifying passes ([`super::drive_drafted`]): a smaller draft model of the same tokenizer
//! ([`ModelDrafter`]), as llama.cpp's `--model-draft` and transformers' assisted generation
//! do. Whatever proposes them, the target model verifies the drafts in one batched forward
//! and draws every produced token itself, so the output is exactly the output without.

use std::ops::Deref;

use super::ForwardKeep;
use crate::error::{Error, Result};
use crate::math;
use crate::model::{Logits, Model};
use crate::tokenizer::Tokenizer;

/// Draft tokens per step from a draft model when none are asked for (`--speculate`,
/// `generate({speculate})`).
pub const DEFAULT_DRAFT: usize = 4;
/// Draft tokens per step from an MTP layer when none are asked for: the layer was trained
/// for the token after next (DeepSeek-V3 reports 85-90% acceptance for it); chaining it
/// further is a guess.
pub const DEFAULT_MTP_DRAFT: usize = 1;

/// Draft tokens per step: `speculate` if given (not 0), else the default of the draft
/// source (an MTP layer or a draft model).
pub fn max_draft(speculate: usize, mtp: bool) -> usize {
    match (speculate, mtp) {
        (0, true) => DEFAULT_MTP_DRAFT,
        (0, false) => DEFAULT_DRAFT,
        (n, _) => n,
    }
}

/// A CPU forward pass of `model` with a context of its own, for [`ModelDrafter::new`]: cuts
/// the context back to `keep` positions, then feeds `ids`. `M` is how the caller holds the
/// model (`&Model`, or `Rc<Model>` in the browser engine).
pub fn cpu_forward_keep<'a, M: Deref<Target = Model> + 'a>(model: M) -> Box<ForwardKeep<'a>> {
    let mut session = model.new_session();
    Box::new(move |keep, ids, which| {
        session.truncate(keep);
        model.forward(&mut session, ids, which)
    })
}

/// Proposes the tokens likely to follow a context.
pub trait Drafter {
    /// Up to `k` draft tokens after `context` (everything in the context so far: history,
    /// prompt and the tokens produced, the last one not yet fed).
    fn propose(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>>;
}

/// A draft model's greedy continuation. `forward(keep, ids, which)` runs the draft model
/// (any backend) with its own context: it cuts that context back to its first `keep`
/// positions, then feeds `ids`. The draft keeps what it fed and refeeds only what changed
/// (the verified tokens replace its rejected drafts), one position at a time after that.
pub struct ModelDrafter<'a> {
    forward: Box<ForwardKeep<'a>>,
    /// The ids whose keys and values the draft model's context holds, in order.
    fed: Vec<u32>,
    /// The draft model's context limit.
    max_positions: usize,
    /// Drafts end before an id the target cannot take (ids >= its vocabulary).
    target_vocab: usize,
}

impl<'a> ModelDrafter<'a> {
    pub fn new(forward: Box<ForwardKeep<'a>>, max_positions: usize, target_vocab: usize) -> Self {
        ModelDrafter { forward, fed: Vec::new(), max_positions, target_vocab }
    }
}

impl Drafter for ModelDrafter<'_> {
    fn propose(&mut self, context: &[u32], k: usize) -> Result<Vec<u32>> {
        // k drafts after the context need context.len() + k - 1 positions.
        let k = k.min((self.max_positions + 1).saturating_sub(context.len()));
        if k == 0 || context.is_empty() {
            return Ok(Vec::new());
        }
        // The prefix the draft already holds; the last token is refed for its logits.
        let same = self.fed.iter().zip(context).take_while(|(a, b)| a == b).count().min(context.len() - 1);
        self.fed.truncate(same);
        let mut logits = (self.forward)(same, &context[same..], Logits::Last)?;
        self.fed.extend_from_slice(&context[same..]);
        let mut out = Vec::with_capacity(k);
        loop {
            let id = math::argmax(&logits) as u32;
            if id as usize >= self.target_vocab {
                break;
            }
            out.push(id);
            if out.len() == k {
                break;
            }
            logits = (self.forward)(self.fed.len(), &[id], Logits::Last)?;
            self.fed.push(id);
        }
        Ok(out)
    }
}

/// Refuses a draft model whose tokenizer maps ids to other tokens than the target's: its
/// drafts would be other words (they could never change the output, only waste passes).
pub fn check_same_tokenizer(target: &Tokenizer, draft: &Tokenizer) -> Result<()> {
    let (t, d) = (target.inner().get_vocab(true), draft.inner().get_vocab(true));
    if t == d {
        return Ok(());
    }
    let differ =
        t.iter().filter(|(tok, id)| d.get(*tok) != Some(id)).count() + d.keys().filter(|k| !t.contains_key(*k)).count();
    Err(Error::Invalid(format!(
        "the draft model has another tokenizer ({} tokens vs the model's {}, {differ} differ): a draft must share the model's tokenizer",
        d.len(),
        t.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a draft model was fed: (keep, ids) per call.
    type Calls = std::rc::Rc<std::cell::RefCell<Vec<(usize, Vec<u32>)>>>;

    /// A draft "model" whose next token after `id` is `(id + 1) % 7`, recording its calls.
    fn counting(calls: Calls) -> Box<ForwardKeep<'static>> {
        Box::new(move |keep, ids, _| {
            calls.borrow_mut().push((keep, ids.to_vec()));
            let mut row = vec![0.0f32; 7];
            row[(*ids.last().unwrap_or(&0) as usize + 1) % 7] = 1.0;
            Ok(row)
        })
    }

    #[test]
    fn a_draft_model_refeeds_only_what_changed() {
        let calls = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut d = ModelDrafter::new(counting(calls.clone()), 100, 7);
        assert_eq!(d.propose(&[1, 2], 3).unwrap(), [3, 4, 5]);
        assert_eq!(*calls.borrow(), [(0, vec![1, 2]), (2, vec![3]), (3, vec![4])]);
        calls.borrow_mut().clear();
        // Two drafts accepted, then the target drew 6: the draft holds 1 2 3 4, refeeds 6.
        assert_eq!(d.propose(&[1, 2, 3, 4, 6], 2).unwrap(), [0, 1]);
        assert_eq!(*calls.borrow(), [(4, vec![6]), (5, vec![0])]);
        calls.borrow_mut().clear();
        // The same context again: only its last token is refed (its logits are needed).
        assert_eq!(d.propose(&[1, 2, 3, 4, 6], 1).unwrap(), [0]);
        assert_eq!(*calls.borrow(), [(4, vec![6])]);
        assert!(d.propose(&[1, 2], 0).unwrap().is_empty());
    }

    #[test]
    fn drafts_stay_in_the_context_and_the_vocabulary() {
        let calls = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut d = ModelDrafter::new(counting(calls.clone()), 6, 7);
        // 4 positions of context: 3 drafts need 4 + 3 - 1 = 6 positions, a 4th does not fit.
        assert_eq!(d.propose(&[0, 1, 2, 3], 9).unwrap(), [4, 5, 6]);
        assert!(d.propose(&[0; 7], 2).unwrap().is_empty());
        // A target with 6 ids: the draft ends before id 6.
        let mut d = ModelDrafter::new(counting(calls), 100, 6);
        assert_eq!(d.propose(&[3], 9).unwrap(), [4, 5]);
    }
}
