//! The generation loop: prefill the prompt, then one token at a time through the KV
//! cache, sampling each next token and stopping at a stop id or the token budget.

use crate::error::{Error, Result};
use crate::model::{Logits, Model, Session};
use crate::sampler::{Sampler, SamplerConfig};

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampler: SamplerConfig,
    /// Generation ends after emitting one of these (the id is included in the output).
    pub stop_ids: Vec<u32>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A stop id was produced.
    Stop,
    /// `max_new_tokens` were produced.
    Length,
    /// The caller's callback asked to stop.
    Cancelled,
}

/// Feeds `prompt` after what `session` holds and generates up to `max_new_tokens`.
/// `on_token` sees each new id as soon as it is sampled and returns false to stop.
pub fn generate(
    model: &Model,
    session: &mut Session,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, StopReason)> {
    let history = session.tokens.clone();
    generate_with(&mut |ids| model.forward(session, ids, Logits::Last), &history, prompt, opts, on_token)
}

/// The generation loop over any backend: `forward(ids)` feeds `ids` after everything
/// fed so far and returns the last position's logits (the CPU model, the GPU model).
/// `history` is what was fed before `prompt` (the sampler's repetition penalty sees it).
pub fn generate_with(
    forward: &mut dyn FnMut(&[u32]) -> Result<Vec<f32>>,
    history: &[u32],
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, StopReason)> {
    if prompt.is_empty() {
        return Err(Error::Invalid("the prompt is empty".into()));
    }
    let mut sampler = Sampler::new(opts.sampler.clone())?;
    let mut out = Vec::new();
    let mut seen: Vec<u32> = history.iter().chain(prompt).copied().collect();
    let mut logits = forward(prompt)?;
    if opts.max_new_tokens == 0 {
        return Ok((out, StopReason::Length));
    }
    loop {
        let id = sampler.sample(&logits, &seen);
        out.push(id);
        if !on_token(id) {
            return Ok((out, StopReason::Cancelled));
        }
        if opts.stop_ids.contains(&id) {
            return Ok((out, StopReason::Stop));
        }
        if out.len() >= opts.max_new_tokens {
            return Ok((out, StopReason::Length));
        }
        logits = forward(&[id])?;
        seen.push(id);
    }
}
