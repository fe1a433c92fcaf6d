//! The generation loop, once for every surface (`coli generate` / `coli chat`, the OpenAI
//! server, the browser engine): a step-wise [`Generator`] says which ids to feed next and
//! turns the logits of the last fed position into the next token, ending at a stop id, a
//! stop string, the token budget or the context limit. The caller owns the forward pass,
//! so the same loop drives the CPU model, the GPU model and the browser's async steps.

pub mod choose;
pub mod defaults;
pub mod draft;
pub mod grammar;
pub mod logprobs;
pub mod mtp;
pub mod prefill;
pub mod request;
pub mod reuse;
pub mod speculate;
mod step;
pub mod stop;

use crate::error::{Error, Result};
use crate::model::{Logits, Model, Session};
use crate::sampler::{Sampler, SamplerConfig};
use crate::tokenizer::{DecodeStream, Tokenizer};

pub use defaults::{Fallback, SamplingDefaults, SamplingRequest};
pub use draft::{check_same_tokenizer, Drafter, ModelDrafter};
pub use grammar::{CompileCancel, Constraint, Grammar};
pub use logprobs::TokenLogprob;
pub use mtp::{forward_recording, HiddenLog, MtpDrafter};
pub use prefill::{feed_chunked, feed_chunked_last, feed_pieces, PREFILL_CHUNK};
pub use request::{Turn, TurnRequest};
pub use reuse::{keepable, pin_shared, reusable, reuse, snapshot_cuts, Context, ContextPool, LAST_CUT_MIN};
pub use speculate::{DraftSchedule, SpecStats};
pub use step::{Pass, Stepped};
pub use stop::StopMatcher;

#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampler: SamplerConfig,
    /// Generation ends after emitting one of these (the id is included in the output).
    pub stop_ids: Vec<u32>,
    /// Record each produced token's log-probability with this many alternatives
    /// (None: off). Stop ids get no entry: they are not part of the text.
    pub logprobs: Option<usize>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A stop id or a stop string was produced.
    Stop,
    /// `max_new_tokens` were produced, or the context is full.
    Length,
    /// The caller asked to stop.
    Cancelled,
}

impl StopReason {
    /// OpenAI's `finish_reason` (a cancelled generation reports what it was cut at).
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Stop => "stop",
            StopReason::Length => "length",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// Most tokens a generation can produce after `used` context positions: the k-th token
/// is sampled from the logits of position used + k - 2, so k tokens need used + k - 1
/// positions (the last token is never fed). None when `used` itself does not fit.
pub fn context_room(used: usize, max_positions: usize) -> Option<usize> {
    (used <= max_positions).then(|| max_positions - used + 1)
}

/// Text output with stop strings: decoded pieces, held back while they could still start
/// a stop string.
struct TextOut {
    stream: DecodeStream,
    stops: StopMatcher,
    out: String,
}

/// One generation, step by step: feed [`Generator::input`] to the model, hand the last
/// position's logits to [`Generator::accept`], until [`Generator::finished`].
pub struct Generator {
    sampler: Sampler,
    stop_ids: Vec<u32>,
    /// The token budget after the context limit.
    max_new: usize,
    /// Everything in the context (history, prompt, produced): the repetition penalty's view.
    seen: Vec<u32>,
    pending: Vec<u32>,
    produced: Vec<u32>,
    finished: Option<StopReason>,
    text: Option<TextOut>,
    /// Alternatives per logprob entry (None: no logprobs).
    top_logprobs: Option<usize>,
    /// Entries not yet taken.
    logprobs: Vec<TokenLogprob>,
    /// Structured output: the grammar the produced tokens must follow.
    constraint: Option<Constraint>,
    /// Speculation: most draft tokens per step (0: off), how many the next step proposes,
    /// and the drafts now in `pending`.
    max_draft: usize,
    schedule: DraftSchedule,
    /// Drafts come from the caller ([`Generator::push_drafts`]), not from prompt lookup.
    external_drafts: bool,
    drafts: usize,
    spec: SpecStats,
}

impl Generator {
    /// A generation that feeds `prompt` after the `history` already in the context.
    /// Refuses an empty prompt and a context that cannot hold history + prompt.
    pub fn new(history: &[u32], prompt: &[u32], max_positions: usize, opts: &GenerateOptions) -> Result<Self> {
        if prompt.is_empty() {
            return Err(Error::Invalid("the prompt is empty".into()));
        }
        let used = history.len() + prompt.len();
        let room =
            context_room(used, max_positions).ok_or(Error::ContextOverflow { len: used, limit: max_positions })?;
        let max_new = opts.max_new_tokens.min(room);
        Ok(Generator {
            sampler: Sampler::new(opts.sampler.clone())?,
            stop_ids: opts.stop_ids.clone(),
            max_new,
            seen: history.iter().chain(prompt).copied().collect(),
            pending: prompt.to_vec(),
            produced: Vec::new(),
            finished: (max_new == 0).then_some(StopReason::Length),
            text: None,
            top_logprobs: opts.logprobs.map(|n| n.min(logprobs::MAX_TOP_LOGPROBS)),
            logprobs: Vec::new(),
            constraint: None,
            max_draft: 0,
            schedule: DraftSchedule::new(0),
            external_drafts: false,
            drafts: 0,
            spec: SpecStats::default(),
        })
    }

    /// Also produce text: `stream` decodes the produced ids (stop ids are not decoded),
    /// and generation ends at the first of `stop_strings`, which is not part of the text.
    pub fn with_text(mut self, stream: DecodeStream, stop_strings: Vec<String>) -> Self {
        self.text = Some(TextOut { stream, stops: StopMatcher::new(stop_strings), out: String::new() });
        self
    }

    /// Structured output: each token is drawn among those `c` allows (the stop ids only
    /// where its grammar may end), and generation stops once the grammar is complete.
    pub fn with_constraint(mut self, c: Constraint) -> Self {
        self.constraint = Some(c);
        self
    }

    /// Speculative decoding from prompt lookup with up to `max_draft` draft tokens per
    /// step ([`speculate`]): [`Generator::input`] then holds the last token and the
    /// drafts; feed them in one pass and hand the last [`Generator::rows_needed`] rows to
    /// [`Generator::accept_rows`]. The output is the same as without.
    pub fn with_speculation(mut self, max_draft: usize) -> Self {
        self.max_draft = max_draft;
        self.schedule = DraftSchedule::new(max_draft);
        self
    }

    /// Speculative decoding with up to `max_draft` drafts per step that the caller proposes
    /// ([`Generator::draft_room`], [`Generator::push_drafts`]; a [`Drafter`] with
    /// [`drive_drafted`]) instead of prompt lookup. The output is the same as without.
    pub fn with_external_drafts(mut self, max_draft: usize) -> Self {
        self.max_draft = max_draft;
        self.schedule = DraftSchedule::new(max_draft);
        self.external_drafts = max_draft > 0;
        self
    }

    /// How many drafts [`Generator::push_drafts`] takes now: none while drafts wait to be
    /// verified or the prompt is still to be fed (its pass returns the last row only),
    /// else as many as the schedule gives ([`DraftSchedule`]: up to the most per step),
    /// within the token budget (k drafts and the token after them are k + 1 produced
    /// tokens).
    pub fn draft_room(&self) -> usize {
        if !self.external_drafts || self.finished.is_some() || self.drafts > 0 || self.produced.is_empty() {
            return 0;
        }
        self.schedule.next().min(self.max_new.saturating_sub(self.produced.len() + 1))
    }

    /// Everything in the context so far (history, prompt, produced): what drafts follow.
    pub fn context(&self) -> &[u32] {
        &self.seen
    }

    /// Appends draft tokens to [`Generator::input`] (at most [`Generator::draft_room`]);
    /// drafts after a stop id are left out (nothing follows a stop).
    pub fn push_drafts(&mut self, drafts: &[u32]) -> Result<()> {
        if drafts.len() > self.draft_room() {
            return Err(Error::Invalid(format!("{} drafts, room for {}", drafts.len(), self.draft_room())));
        }
        let drafts = match drafts.iter().position(|d| self.stop_ids.contains(d)) {
            Some(i) => &drafts[..=i],
            None => drafts,
        };
        self.pending.extend_from_slice(drafts);
        self.drafts = drafts.len();
        Ok(())
    }

    /// Whether drafts are proposed ([`Generator::with_speculation`]): feed with every
    /// position's logits and use [`Generator::accept_rows`].
    pub fn is_speculative(&self) -> bool {
        self.max_draft > 0
    }

    /// How many logits rows (the last fed positions) [`Generator::accept_rows`] takes.
    pub fn rows_needed(&self) -> usize {
        self.drafts + 1
    }

    /// What speculation did so far.
    pub fn spec_stats(&self) -> SpecStats {
        self.spec
    }

    /// Draws from each of `rows` (the last [`Generator::rows_needed`] positions' logits,
    /// row-major) in order while the drafts equal what was drawn, then proposes the next
    /// drafts. Returns how many of the ids just fed stay valid in the context: the caller
    /// truncates its cache to what it held before plus that many.
    pub fn accept_rows(&mut self, rows: &[f32], tok: Option<&Tokenizer>) -> Result<usize> {
        let n = self.drafts + 1;
        if rows.is_empty() || !rows.len().is_multiple_of(n) {
            return Err(Error::Invalid(format!("accept_rows: {} values are not {n} rows", rows.len())));
        }
        let vocab = rows.len() / n;
        let fed = self.pending.clone();
        let drafts = &fed[fed.len() - self.drafts..];
        let mut kept = fed.len() - drafts.len();
        self.spec.forwards += 1;
        self.spec.drafted += drafts.len();
        for (i, row) in rows.chunks(vocab).enumerate() {
            let id = self.accept(row, tok)?;
            self.spec.produced += 1;
            if i < drafts.len() && id == drafts[i] {
                kept += 1;
                self.spec.accepted += 1;
                if self.finished.is_none() {
                    continue;
                }
            }
            break;
        }
        self.schedule.record(drafts.len(), kept - (fed.len() - drafts.len()));
        self.drafts = 0;
        if self.finished.is_none() && self.max_draft > 0 && !self.external_drafts {
            // Each accepted draft and the token after them is one more produced token.
            let room = self.max_new.saturating_sub(self.produced.len() + 1);
            let d = speculate::lookup(&self.seen, 3, self.schedule.next().min(room));
            self.pending.extend_from_slice(d);
            self.drafts = d.len();
        }
        Ok(kept)
    }

    /// Which logits the pass that feeds [`Generator::input`] must return: every fed
    /// position's while drafts wait to be verified, else the last position's.
    pub fn logits_wanted(&self) -> Logits {
        if self.rows_needed() > 1 {
            Logits::All
        } else {
            Logits::Last
        }
    }

    /// Takes the logits of the pass that fed [`Generator::input`] (as
    /// [`Generator::logits_wanted`] asked; rows of `vocab` values) and draws the tokens
    /// they decide ([`Generator::accept_rows`] on the last [`Generator::rows_needed`] rows).
    /// Returns how many of the ids fed stay valid in the context.
    pub fn accept_pass(&mut self, logits: &[f32], vocab: usize, tok: Option<&Tokenizer>) -> Result<usize> {
        let n = self.rows_needed();
        if vocab == 0 || logits.len() < n * vocab {
            return Err(Error::Invalid("the forward pass returned too few logits".into()));
        }
        self.accept_rows(&logits[logits.len() - n * vocab..], tok)
    }

    /// The ids to feed next (the prompt, then each sampled token); None once finished.
    pub fn input(&self) -> Option<&[u32]> {
        if self.finished.is_some() {
            None
        } else {
            Some(&self.pending)
        }
    }

    /// Samples the next token from `logits` (the last fed position's row). With text
    /// output, `tok` decodes it; a decoding error ends nothing and is returned.
    pub fn accept(&mut self, logits: &[f32], tok: Option<&Tokenizer>) -> Result<u32> {
        if self.finished.is_some() {
            return Err(Error::Invalid("the generation has finished".into()));
        }
        let id = match self.constraint.as_mut() {
            None => self.sampler.sample(logits, &self.seen, &self.produced),
            Some(c) => {
                let masked = c.mask(logits, &self.stop_ids)?;
                self.sampler.sample(masked, &self.seen, &self.produced)
            }
        };
        let is_stop = self.stop_ids.contains(&id);
        // The grammar follows every token of the text (a stop id ends it).
        let mut complete = false;
        if let (Some(c), false) = (self.constraint.as_mut(), is_stop) {
            c.consume(id)?;
            complete = c.is_complete();
        }
        if let (Some(n), false) = (self.top_logprobs, is_stop) {
            self.logprobs.push(logprobs::token_logprob(logits, id, n));
        }
        self.produced.push(id);
        self.seen.push(id);
        self.pending.clear();
        self.pending.push(id);
        if let (Some(t), Some(tok)) = (self.text.as_mut(), tok) {
            if !is_stop {
                let piece = t.stream.push(tok, id)?;
                let (out, hit) = t.stops.push(&piece);
                t.out.push_str(&out);
                if hit {
                    self.finished = Some(StopReason::Stop);
                    return Ok(id);
                }
            }
        }
        if is_stop || complete {
            self.finished = Some(StopReason::Stop);
        } else if self.produced.len() >= self.max_new {
            self.finished = Some(StopReason::Length);
        }
        if self.finished.is_some() {
            if let (Some(t), Some(tok)) = (self.text.as_mut(), tok) {
                // The held-back tail: an incomplete character, a possible stop-string start.
                let tail = t.stream.finish(tok)?;
                let (out, hit) = t.stops.push(&tail);
                t.out.push_str(&out);
                if !hit {
                    t.out.push_str(&t.stops.finish());
                }
            }
        }
        Ok(id)
    }

    /// Ends the generation now (a client went away, the caller's stop button).
    pub fn cancel(&mut self) {
        self.finished.get_or_insert(StopReason::Cancelled);
    }

    pub fn finished(&self) -> Option<StopReason> {
        self.finished
    }

    /// The ids produced so far.
    pub fn produced(&self) -> &[u32] {
        &self.produced
    }

    /// The token budget after the context limit.
    pub fn max_new_tokens(&self) -> usize {
        self.max_new
    }

    /// Log-probability entries of the tokens produced since the last call (with
    /// `logprobs` set; else empty).
    pub fn take_logprobs(&mut self) -> Vec<TokenLogprob> {
        std::mem::take(&mut self.logprobs)
    }

    /// Text that became final since the last call (with text output; else empty).
    pub fn take_text(&mut self) -> String {
        self.text.as_mut().map(|t| std::mem::take(&mut t.out)).unwrap_or_default()
    }
}

/// Feeds `prompt` after what `session` holds and generates up to `max_new_tokens`, or as
/// many as the model's context allows. `on_token` sees each new id as soon as it is
/// sampled and returns false to stop.
pub fn generate(
    model: &Model,
    session: &mut Session,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, StopReason)> {
    let history = session.tokens.clone();
    let max_positions = model.cfg.max_positions;
    generate_with(&mut |ids| model.forward(session, ids, Logits::Last), &history, prompt, max_positions, opts, on_token)
}

/// [`generate`] over any backend: `forward(ids)` feeds `ids` after everything fed so far
/// and returns the last position's logits (the CPU model, the GPU model). `history` is
/// what was fed before `prompt`; `max_positions` the context limit.
pub fn generate_with(
    forward: &mut dyn FnMut(&[u32]) -> Result<Vec<f32>>,
    history: &[u32],
    prompt: &[u32],
    max_positions: usize,
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, StopReason)> {
    drive(forward, Generator::new(history, prompt, max_positions, opts)?, on_token)
}

/// Runs `g` to its end with `forward` (as [`generate_with`]); for a generator with a
/// constraint or text output. A `forward` that answers [`Error::Cancelled`] (a chunked
/// prefill whose caller stopped it: [`feed_chunked`]) ends the generation as cancelled.
pub fn drive(
    forward: &mut dyn FnMut(&[u32]) -> Result<Vec<f32>>,
    mut g: Generator,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, StopReason)> {
    while let Some(ids) = g.input() {
        let logits = match forward(ids) {
            Err(Error::Cancelled) => {
                g.cancel();
                return Ok((g.produced, StopReason::Cancelled));
            }
            r => r?,
        };
        let id = g.accept(&logits, None)?;
        if !on_token(id) {
            g.cancel();
            return Ok((g.produced, StopReason::Cancelled));
        }
    }
    let reason = g.finished.unwrap_or(StopReason::Length);
    Ok((g.produced, reason))
}

/// A forward pass that first cuts the context back: `(keep, ids, which)`.
pub type ForwardKeep<'a> = dyn FnMut(usize, &[u32], Logits) -> Result<Vec<f32>> + 'a;

/// Runs `g` to its end with drafts verified in one pass ([`Generator::with_speculation`]).
/// `forward(keep, ids, which)` cuts the context back to its first `keep` positions, then
/// feeds `ids` after them; `history` is how many positions it held before `g` began.
pub fn drive_speculative(
    forward: &mut ForwardKeep<'_>,
    history: usize,
    g: &mut Generator,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<StopReason> {
    drive_drafted(forward, history, g, None, on_token)
}

/// [`drive_speculative`] where `drafter` proposes the drafts before each pass (for a
/// generator [`Generator::with_external_drafts`]; None: prompt lookup's own drafts). A
/// `forward` that answers [`Error::Cancelled`] ends the generation as cancelled.
pub fn drive_drafted(
    forward: &mut ForwardKeep<'_>,
    history: usize,
    g: &mut Generator,
    mut drafter: Option<&mut dyn Drafter>,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<StopReason> {
    let mut fed = history;
    loop {
        let before = g.produced().len();
        match g.step(forward, &mut fed, drafter.as_deref_mut(), None) {
            Ok(true) => {}
            Ok(false) => break,
            Err(Error::Cancelled) => {
                g.cancel();
                return Ok(StopReason::Cancelled);
            }
            Err(e) => return Err(e),
        }
        for i in before..g.produced().len() {
            if !on_token(g.produced()[i]) {
                g.cancel();
                return Ok(StopReason::Cancelled);
            }
        }
    }
    Ok(g.finished().unwrap_or(StopReason::Length))
}

#[cfg(test)]
mod tests;
