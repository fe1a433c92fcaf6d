//! Option scoring ("choose"): the probability of each of a fixed set of answers after a
//! prompt, generating nothing. Each option's score is the sum of its tokens'
//! log-probabilities under teacher forcing; the scores are normalised over the options.
//!
//! The prompt runs once; its last row scores every option's first token. Each option of
//! more than one token then runs after the prompt's cached keys and values: the caller
//! truncates its context back to the prompt (no copy, no second prefill) and feeds the
//! option's tokens but the last. Step-wise like [`super::Generator`], so the CPU model,
//! the GPU model and the browser's async backends drive the same code.

use serde_json::{json, Value};

use super::logprobs::LogSoftmax;
use crate::error::{Error, Result};
use crate::model::Logits;
use crate::tokenizer::{ChatMessage, Tokenizer};

/// Most options one call scores.
pub const MAX_OPTIONS: usize = 256;

/// The prompt's ids: one user message through the chat template (as `coli chat` and the
/// chat API send it), or with `raw` the text as it is (special tokens added, as
/// /v1/completions encodes a text prompt).
pub fn encode_prompt(tok: &Tokenizer, prompt: &str, raw: bool) -> Result<Vec<u32>> {
    if raw {
        tok.encode(prompt, true)
    } else {
        tok.encode_chat(&[ChatMessage::new("user", prompt)], true)
    }
}

/// Each option's ids, tokenized on its own (no special tokens).
pub fn encode_options(tok: &Tokenizer, options: &[String]) -> Result<Vec<Vec<u32>>> {
    options.iter().map(|o| tok.encode(o, false)).collect()
}

/// What [`Chooser`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// Per option: the sum of its tokens' log-probabilities (natural log).
    pub logprobs: Vec<f64>,
    /// Per option: exp(logprob) normalised over the options.
    pub probabilities: Vec<f64>,
    /// Entropy of `probabilities` in nats (0: certain; ln(n): no preference).
    pub entropy: f64,
    /// The most probable option (the first of equals).
    pub index: usize,
    /// Per option: its token count.
    pub option_tokens: Vec<usize>,
    pub prompt_tokens: usize,
    /// Tokens fed through the model: the prompt once, then each option but its last token.
    pub tokens_read: usize,
}

impl Choice {
    /// The result as JSON (the same shape on every surface), with the options' text.
    pub fn to_json(&self, options: &[String]) -> Value {
        json!({
            "options": options,
            "probabilities": self.probabilities,
            "logprobs": self.logprobs.iter().map(|&x| if x.is_finite() { json!(x) } else { json!(-9999.0) }).collect::<Vec<_>>(),
            "entropy": self.entropy,
            "index": self.index,
            "choice": options.get(self.index),
            "option_tokens": self.option_tokens,
            "prompt_tokens": self.prompt_tokens,
            "tokens_read": self.tokens_read,
        })
    }
}

/// The next forward pass [`Chooser`] needs: truncate the context to `keep` tokens, feed
/// `ids`, return the logits `which` asks for.
#[derive(Debug, PartialEq)]
pub struct Step<'a> {
    pub keep: usize,
    pub ids: &'a [u32],
    pub which: Logits,
}

/// Option scoring, step by step: call [`Chooser::step`], run it, hand the logits to
/// [`Chooser::accept`], until `step` gives None; then [`Chooser::finish`].
pub struct Chooser {
    prompt: Vec<u32>,
    options: Vec<Vec<u32>>,
    sums: Vec<f64>,
    /// The option whose tail runs next; None before the prompt has run.
    next: Option<usize>,
    /// The row length, from the prompt's row.
    vocab: usize,
    tokens_read: usize,
}

impl Chooser {
    /// Refuses an empty prompt, no options, an empty option, and an option that does not
    /// fit in the context after the prompt.
    pub fn new(prompt: Vec<u32>, options: Vec<Vec<u32>>, max_positions: usize) -> Result<Self> {
        if prompt.is_empty() {
            return Err(Error::Invalid("the prompt is empty".into()));
        }
        if options.is_empty() || options.len() > MAX_OPTIONS {
            return Err(Error::Invalid(format!("give between 1 and {MAX_OPTIONS} options")));
        }
        if let Some(i) = options.iter().position(|o| o.is_empty()) {
            return Err(Error::Invalid(format!("option {i} has no tokens")));
        }
        let longest = options.iter().map(Vec::len).max().unwrap_or(0);
        // The last option token is scored but never fed.
        let need = prompt.len() + longest - 1;
        if need > max_positions {
            return Err(Error::ContextOverflow { len: need, limit: max_positions });
        }
        let n = options.len();
        Ok(Chooser { prompt, options, sums: vec![0.0; n], next: None, vocab: 0, tokens_read: 0 })
    }

    /// The next forward pass, or None when every option is scored.
    pub fn step(&self) -> Option<Step<'_>> {
        match self.next {
            None => Some(Step { keep: 0, ids: &self.prompt, which: Logits::Last }),
            Some(i) => self.options.get(i).map(|o| Step {
                keep: self.prompt.len(),
                ids: &o[..o.len() - 1],
                which: Logits::All,
            }),
        }
    }

    /// Takes the logits of the step just run.
    pub fn accept(&mut self, logits: &[f32]) -> Result<()> {
        match self.next {
            None => {
                // The prompt's last row: every option's first token.
                if logits.is_empty() {
                    return Err(Error::Invalid("choose: an empty logits row".into()));
                }
                self.vocab = logits.len();
                let ls = LogSoftmax::of(logits);
                for (s, o) in self.sums.iter_mut().zip(&self.options) {
                    *s = ls.logprob(logits, o[0]);
                }
                self.tokens_read += self.prompt.len();
            }
            Some(i) => {
                let o = &self.options[i];
                let n = o.len() - 1;
                let vocab = self.vocab;
                if logits.len() != n * vocab {
                    return Err(Error::Invalid("choose: logits of the wrong shape".into()));
                }
                // Row j follows o[..=j] and scores o[j + 1]; summed in token order.
                for (j, row) in logits.chunks(vocab).enumerate() {
                    self.sums[i] += LogSoftmax::of(row).logprob(row, o[j + 1]);
                }
                self.tokens_read += n;
            }
        }
        // The next option with more than one token.
        let from = self.next.map_or(0, |i| i + 1);
        self.next = Some((from..self.options.len()).find(|&i| self.options[i].len() > 1).unwrap_or(self.options.len()));
        Ok(())
    }

    /// The scores (call when [`Chooser::step`] gives None).
    pub fn finish(&self) -> Choice {
        let max = self.sums.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> =
            self.sums.iter().map(|&s| if max.is_finite() { libm::exp(s - max) } else { 1.0 }).collect();
        let total: f64 = weights.iter().sum();
        let probabilities: Vec<f64> = weights.iter().map(|w| w / total).collect();
        let entropy = -probabilities.iter().filter(|&&p| p > 0.0).map(|&p| p * libm::log(p)).sum::<f64>();
        let index =
            probabilities.iter().enumerate().fold(0, |best, (i, &p)| if p > probabilities[best] { i } else { best });
        Choice {
            logprobs: self.sums.clone(),
            probabilities,
            entropy: entropy.max(0.0),
            index,
            option_tokens: self.options.iter().map(Vec::len).collect(),
            prompt_tokens: self.prompt.len(),
            tokens_read: self.tokens_read,
        }
    }
}

/// A synchronous backend for [`choose_with`]: `(keep, ids, which)` truncates the context
/// to `keep` tokens, feeds `ids` and returns the logits `which` asks for.
pub type KeepForward<'a> = dyn FnMut(usize, &[u32], Logits) -> Result<Vec<f32>> + 'a;

/// Runs a [`Chooser`] over a synchronous backend: `forward(keep, ids, which)` truncates
/// the context to `keep` tokens, feeds `ids` and returns the logits.
pub fn choose_with(
    forward: &mut KeepForward<'_>,
    prompt: Vec<u32>,
    options: Vec<Vec<u32>>,
    max_positions: usize,
) -> Result<Choice> {
    let mut c = Chooser::new(prompt, options, max_positions)?;
    while let Some(s) = c.step() {
        let logits = forward(s.keep, s.ids, s.which)?;
        c.accept(&logits)?;
    }
    Ok(c.finish())
}

/// [`choose_with`] on the CPU model, in a session of its own.
pub fn choose(model: &crate::model::Model, prompt: Vec<u32>, options: Vec<Vec<u32>>) -> Result<Choice> {
    let mut session = model.new_session();
    let mut forward = |keep: usize, ids: &[u32], which: Logits| {
        session.truncate(keep);
        model.forward(&mut session, ids, which)
    };
    choose_with(&mut forward, prompt, options, model.cfg.max_positions)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A "model" whose next-token distribution depends only on the last token fed:
    /// logits row for token t is [t, 2t, 3t, ...] mod 5 (vocab 6), so every step can be
    /// checked by hand; records what it was asked to do.
    fn toy(vocab: usize) -> impl FnMut(usize, &[u32], Logits) -> Result<Vec<f32>> {
        let mut ctx: Vec<u32> = Vec::new();
        move |keep, ids, which| {
            assert!(keep <= ctx.len());
            ctx.truncate(keep);
            ctx.extend_from_slice(ids);
            let row = |t: u32| (0..vocab).map(|j| ((t as usize * (j + 1)) % 5) as f32).collect::<Vec<f32>>();
            Ok(match which {
                Logits::Last => row(*ids.last().unwrap()),
                Logits::All => ids.iter().flat_map(|&t| row(t)).collect(),
            })
        }
    }

    fn lp(row: &[f32], id: u32) -> f64 {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let s: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
        row[id as usize] as f64 - m - s.ln()
    }

    #[test]
    fn scores_are_teacher_forced_sums_normalised_over_options() {
        let vocab = 6;
        let row = |t: u32| (0..vocab).map(|j| ((t as usize * (j + 1)) % 5) as f32).collect::<Vec<f32>>();
        let prompt = vec![1, 2, 3];
        let options = vec![vec![4], vec![2, 5, 1], vec![3, 3]];
        let c = choose_with(&mut toy(vocab), prompt.clone(), options.clone(), 64).unwrap();
        let want = [lp(&row(3), 4), lp(&row(3), 2) + lp(&row(2), 5) + lp(&row(5), 1), lp(&row(3), 3) + lp(&row(3), 3)];
        for (i, w) in want.iter().enumerate() {
            assert!((c.logprobs[i] - w).abs() < 1e-12, "{i}: {} vs {w}", c.logprobs[i]);
        }
        let z: f64 = want.iter().map(|w| w.exp()).sum();
        for (p, w) in c.probabilities.iter().zip(&want) {
            assert!((p - w.exp() / z).abs() < 1e-12);
        }
        let h: f64 = -c.probabilities.iter().map(|p| p * p.ln()).sum::<f64>();
        assert!((c.entropy - h).abs() < 1e-12);
        let best = (0..3).max_by(|&a, &b| want[a].total_cmp(&want[b])).unwrap();
        assert_eq!(c.index, best);
        // The prompt once, then 2 + 1 tokens of the two longer options.
        assert_eq!(c.tokens_read, 3 + 2 + 1);
        assert_eq!((c.prompt_tokens, c.option_tokens.clone()), (3, vec![1, 3, 2]));
        let j = c.to_json(&["a".into(), "b".into(), "c".into()]);
        assert_eq!(j["choice"], ["a", "b", "c"][best]);
    }

    #[test]
    fn the_prompt_runs_once_and_options_reuse_its_context() {
        let mut c = Chooser::new(vec![7, 8], vec![vec![1, 2, 3], vec![4], vec![5, 6]], 16).unwrap();
        let s = c.step().unwrap();
        assert_eq!((s.keep, s.ids, s.which), (0, &[7u32, 8][..], Logits::Last));
        c.accept(&[0.0; 10]).unwrap();
        let s = c.step().unwrap();
        assert_eq!((s.keep, s.ids, s.which), (2, &[1u32, 2][..], Logits::All));
        c.accept(&[0.0; 20]).unwrap();
        // The one-token option needs no pass.
        let s = c.step().unwrap();
        assert_eq!((s.keep, s.ids), (2, &[5u32][..]));
        assert!(c.accept(&[0.0; 7]).is_err(), "a row of the wrong size");
        c.accept(&[0.0; 10]).unwrap();
        assert!(c.step().is_none());
        // Uniform logits: each token has probability 1/10, so shorter options win.
        let r = c.finish();
        assert!((r.logprobs[0] - 3.0 * (0.1f64).ln()).abs() < 1e-12);
        assert!(r.probabilities[1] > r.probabilities[2] && r.probabilities[2] > r.probabilities[0]);
    }

    #[test]
    fn bad_input_is_refused() {
        assert!(Chooser::new(vec![], vec![vec![1]], 8).is_err());
        assert!(Chooser::new(vec![1], vec![], 8).is_err());
        assert!(Chooser::new(vec![1], vec![vec![1], vec![]], 8).is_err());
        // 6 prompt tokens + a 4-token option feeds 9 positions: over 8.
        assert!(Chooser::new(vec![1; 6], vec![vec![1; 4]], 8).is_err());
        assert!(Chooser::new(vec![1; 6], vec![vec![1; 3]], 8).is_ok());
    }
}
