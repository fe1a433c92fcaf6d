//! Continuous batching (issue #35): every generation running on a model advances one step
//! per engine iteration, all of them in one forward pass ([`Model::forward_batch_rows`]):
//! each matrix is read once per step for the whole batch, and a MoE layer reads and runs
//! each expert once for every row routed to it (the batch's union), so the bytes read per
//! generated token fall as the batch grows.
//!
//! One driver thread per model runs the iterations while there is work. Between
//! iterations new generations join (up to `--parallel` at once, and while the running
//! conversations' caches fit the KV budget), and finished or cancelled ones leave. A
//! prompt is fed in chunks of [`PREFILL_CHUNK`] positions, at most one chunk's worth of
//! prompt positions per iteration, so the others' time per token stays bounded while a
//! long prompt comes in. Every token a generation makes is the one it makes alone
//! (greedy or sampled with a seed, with logprobs, a grammar or speculation): the batched
//! pass gives each sequence its own bits, chunking changes none, and each generation keeps
//! its own sampler, grammar and drafter.
//!
//! A generation drafting from the model's MTP layer runs in the batch too: the pass gives
//! it the final-normed states of its fed positions, which its drafter reads, and so do
//! DeepSeek-V4's generations (each over its own compressed state).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use colibri_engine::generate::logprobs::sequence_logprobs;
use colibri_engine::generate::mtp::HiddenLog;
use colibri_engine::generate::{
    forward_recording, keepable, pin_shared, reusable, snapshot_cuts, Drafter, Generator, ModelDrafter, MtpDrafter,
    StopReason, PREFILL_CHUNK,
};
use colibri_engine::tokenizer::DecodeStream;
use colibri_engine::{Error, Logits, Model, Session};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::generation::{Admission, Entry, Event, Job, Kv, Slot, Speculation};
use super::Stats;
use crate::load::Loaded;

/// Inputs of at most this many ids are a step's token and its drafts, which always join
/// the pass; longer ones are prompt chunks, within the iteration's prefill budget.
const STEP_IDS: usize = 16;

/// Starts `job` once the model has room in its batch; events arrive on the returned
/// channel. Dropping the receiver cancels the generation at its next step.
pub fn spawn(job: Job, admission: Admission, stats: Arc<Stats>, shutdown: Arc<AtomicBool>) -> mpsc::Receiver<Event> {
    let (tx, rx) = mpsc::channel(32);
    tokio::spawn(async move {
        let running = admission.slot().running.clone();
        // A client that leaves while its generation waits for room frees its place in
        // the queue at once (not when the generation's turn comes).
        let permit = tokio::select! {
            p = running.acquire_owned() => p,
            _ = tx.closed() => return,
        };
        let Ok(permit) = permit else { return };
        if tx.is_closed() || shutdown.load(Ordering::Relaxed) {
            return;
        }
        let slot = admission.slot().clone();
        enqueue(&slot, Entry { job, tx, admission, permit }, stats, shutdown);
    });
    rx
}

/// Hands `entry` to its model's driver, starting the driver if none runs.
fn enqueue(slot: &Arc<Slot>, entry: Entry, stats: Arc<Stats>, shutdown: Arc<AtomicBool>) {
    let mut q = slot.incoming.lock().unwrap_or_else(|e| e.into_inner());
    q.waiting.push_back(entry);
    if !q.driving {
        q.driving = true;
        let (slot, rt) = (slot.clone(), tokio::runtime::Handle::current());
        tokio::task::spawn_blocking(move || drive(slot, stats, shutdown, rt));
    }
}

/// The driver: iterations while any generation runs or waits; returns when none is left.
fn drive(slot: Arc<Slot>, stats: Arc<Stats>, shutdown: Arc<AtomicBool>, rt: tokio::runtime::Handle) {
    let Some(loaded) = slot.loaded.get().cloned() else {
        // Entries come only after the model loaded; nothing to run them with otherwise.
        let mut q = slot.incoming.lock().unwrap_or_else(|e| e.into_inner());
        q.waiting.clear();
        q.driving = false;
        return;
    };
    let kv = Kv { pool: &slot.contexts, store: slot.store.get().and_then(Option::as_ref) };
    let ctx = Ctx { loaded: &loaded, stats: &stats, shutdown: &shutdown, rt: &rt, kv: &kv };
    let mut active: Vec<Seq<'_>> = Vec::new();
    loop {
        let joining = {
            let mut q = slot.incoming.lock().unwrap_or_else(|e| e.into_inner());
            let mut held: usize = active.iter().map(|s| s.session.bytes()).sum();
            let mut joining = Vec::new();
            // Join in arrival order while the running caches fit the budget (one always
            // runs); the rest wait for the next iteration.
            while let Some(e) = q.waiting.front() {
                let need = loaded.model.session_bytes_bound(e.job.prompt.len());
                if !(active.is_empty() && joining.is_empty()) && held + need > slot.kv_active_bytes {
                    break;
                }
                held += need;
                joining.extend(q.waiting.pop_front());
            }
            if active.is_empty() && joining.is_empty() {
                q.driving = false;
                return;
            }
            joining
        };
        for e in joining {
            let running: Vec<&Session> = active.iter().map(|s| &s.session).collect();
            if let Some(s) = Seq::start(e, &ctx, &running) {
                active.push(s);
            }
        }
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| iteration(&mut active, &ctx)));
        if ran.is_err() {
            // The engine panicked: every generation of this iteration ends with an error.
            for s in &mut active {
                s.error = Some(Event::Error("the engine failed; this generation was stopped".into()));
                s.gen.cancel();
                s.session = loaded.model.new_session();
                s.fed = 0;
            }
        }
        let mut i = 0;
        while i < active.len() {
            if active[i].over() {
                active.swap_remove(i).finish(&ctx);
            } else {
                i += 1;
            }
        }
        // Keep arrival order for the prefill budget (swap_remove moved the last one).
        active.sort_by_key(|s| s.order);
        // One KV budget: the running generations' caches first, the kept conversations in
        // what is left.
        let running: usize = active.iter().map(|s| s.session.bytes()).sum();
        slot.kv_active.store(running, Ordering::Relaxed);
        slot.contexts.lock().unwrap_or_else(|e| e.into_inner()).shrink_to(slot.kv_active_bytes.saturating_sub(running));
    }
}

/// What every generation of the driver shares.
struct Ctx<'a> {
    loaded: &'a Arc<Loaded>,
    stats: &'a Stats,
    shutdown: &'a AtomicBool,
    rt: &'a tokio::runtime::Handle,
    kv: &'a Kv<'a>,
}

/// One generation in the batch.
struct Seq<'a> {
    order: Instant,
    tx: mpsc::Sender<Event>,
    /// Its place in the queue and in the model's running generations; freed at the end.
    admission: Option<Admission>,
    permit: Option<OwnedSemaphorePermit>,
    gen: Generator,
    session: Session,
    /// Positions of the session that stay valid (the generator's view).
    fed: usize,
    prompt_tokens: usize,
    cached: usize,
    /// Session positions where a prompt pass ends ([`snapshot_cuts`]), and the one
    /// where other conversations part from this one, whose snapshot is pinned
    /// ([`pin_shared`]).
    cuts: Vec<usize>,
    shared: usize,
    /// The input being fed (a copy of the generator's) and how much of it is fed.
    input: Vec<u32>,
    done: usize,
    /// Logits rows gathered for the input (its chunks' rows with echo).
    rows: Vec<f32>,
    /// Echo with logprobs, until its prompt is fed: alternatives per entry, and the prompt.
    echo: Option<(usize, Vec<u32>)>,
    drafter: Option<Box<dyn Drafter + 'a>>,
    /// MTP drafts: this sequence's passes record their hidden states (its own pass).
    mtp_log: Option<HiddenLog>,
    with_logprobs: bool,
    /// Events not yet taken by the client's channel.
    outbox: VecDeque<Event>,
    client_gone: bool,
    shutting_down: bool,
    /// The error that ends it (sent last).
    error: Option<Event>,
}

impl<'a> Seq<'a> {
    /// The generation of `e`, its cache taken from the kept conversations or copied from a
    /// running one's (`running`: requests that start alike, such as a widget's visitors
    /// with one system prompt, share its prefill); None when it could not start (its
    /// error was sent).
    fn start(e: Entry, cx: &Ctx<'a>, running: &[&Session]) -> Option<Self> {
        let Entry { job, tx, admission, permit } = e;
        let fail = |msg: String| {
            let _ = tx.try_send(Event::Error(msg));
            None
        };
        if tx.is_closed() {
            return None;
        }
        let model = &cx.loaded.model;
        let Job { prompt, shared_hint, opts, stop, continue_prompt, prompt_logprobs, constraint, speculation } = job;
        if cx.loaded.tokenizer.is_none() {
            return fail("this model has no tokenizer".into());
        }
        let stream = if continue_prompt { DecodeStream::with_context(true, &prompt) } else { DecodeStream::default() };
        let mtp = speculation.as_ref().is_some_and(|s| s.mtp);
        // A Gated DeltaNet or DeepSeek-V4 state goes back only to where a pass started or
        // ended: the prompt's passes end where later requests will want to go back to,
        // after the system messages (the handler's hint), else where this prompt leaves
        // a conversation kept or running.
        let recurrent = model.cfg.rewinds_to_snapshots() && prompt_logprobs.is_none() && !mtp;
        let shared = match recurrent {
            true if shared_hint > 0 => shared_hint,
            true => running.iter().map(|s| reusable(&s.tokens, &prompt)).fold(cx.kv.shared(&prompt), usize::max),
            false => 0,
        };
        // Echo with logprobs needs every prompt position's logits, and MTP drafts every
        // position's hidden state: nothing is reused then.
        let taken = match prompt_logprobs {
            None if !mtp => {
                let kept = cx.kv.take(&model.cfg, &prompt);
                let have = kept.as_ref().map_or(0, |k| k.1);
                let peer = running
                    .iter()
                    .map(|s| (s, keepable(*s, &prompt)))
                    .filter(|&(_, k)| k > have)
                    .max_by_key(|&(_, k)| k);
                match peer {
                    Some((s, k)) => {
                        if let Some((cache, _)) = kept {
                            cx.kv.put(cache);
                        }
                        let mut copy = (*s).clone();
                        copy.truncate(k);
                        Some((copy, k))
                    }
                    None => kept,
                }
            }
            _ => None,
        };
        let (session, cached) = taken.unwrap_or_else(|| (model.new_session(), 0));
        let cuts = if recurrent { snapshot_cuts(cached, shared, prompt.len()) } else { Vec::new() };
        let (history, fresh) = prompt.split_at(cached);
        let mut gen = match Generator::new(history, fresh, model.cfg.max_positions, &opts) {
            Ok(g) => g.with_text(stream, stop),
            Err(e) => return fail(e.to_string()),
        };
        if let Some(c) = constraint {
            gen = gen.with_constraint(c);
        }
        let mut drafter: Option<Box<dyn Drafter + 'a>> = None;
        let mut mtp_log = None;
        match speculation {
            Some(Speculation { max_draft, mtp: true, .. }) => match MtpDrafter::new(model) {
                Ok(d) => {
                    gen = gen.with_external_drafts(max_draft);
                    mtp_log = Some(d.log());
                    drafter = Some(Box::new(d));
                }
                Err(e) => return fail(e.to_string()),
            },
            Some(Speculation { max_draft, draft: Some(d), .. }) => {
                gen = gen.with_external_drafts(max_draft);
                let (mut ds, vocab, max_positions) =
                    (d.model.new_session(), model.cfg.vocab, d.model.cfg.max_positions);
                let forward = Box::new(move |keep, ids: &[u32], which| {
                    ds.truncate(keep);
                    crate::flags::on_pool(|| d.model.forward(&mut ds, ids, which))
                });
                drafter = Some(Box::new(ModelDrafter::new(forward, max_positions, vocab)));
            }
            Some(Speculation { max_draft, draft: None, .. }) => gen = gen.with_speculation(max_draft),
            None => {}
        }
        cx.stats.generations_started.fetch_add(1, Ordering::Relaxed);
        cx.stats.generations_active.fetch_add(1, Ordering::Relaxed);
        Some(Seq {
            order: Instant::now(),
            tx,
            admission: Some(admission),
            permit: Some(permit),
            gen,
            session,
            fed: cached,
            prompt_tokens: prompt.len(),
            cached,
            cuts,
            shared,
            input: Vec::new(),
            done: 0,
            rows: Vec::new(),
            echo: prompt_logprobs.map(|n| (n, prompt.clone())),
            drafter,
            mtp_log,
            with_logprobs: opts.logprobs.is_some(),
            outbox: VecDeque::new(),
            client_gone: false,
            shutting_down: false,
            error: None,
        })
    }

    /// Whether it has ended (finished, cancelled or failed).
    fn over(&self) -> bool {
        self.error.is_some()
            || match self.gen.finished() {
                None => false,
                Some(StopReason::Cancelled) => true,
                // Echo's prompt logprobs are still owed (a request for no new token).
                Some(_) => self.echo.is_none(),
            }
    }

    /// Before an iteration: a client that left or a helper shutting down ends it (the
    /// positions fed so far stay a valid cache); else drafts and the next input.
    fn prepare(&mut self, shutdown: &AtomicBool) {
        if self.over() {
            return;
        }
        pin_shared(&mut self.session, self.shared);
        if self.tx.is_closed() || shutdown.load(Ordering::Relaxed) {
            self.client_gone = self.tx.is_closed();
            self.shutting_down = !self.client_gone;
            if self.done > 0 {
                // A prompt stopped between its chunks: those fed are a valid cache.
                self.fed = self.session.len();
            }
            self.gen.cancel();
            self.echo = None;
            return;
        }
        if self.done > 0 {
            return;
        }
        if let Some((_, prompt)) = &self.echo {
            // Echo: the whole prompt first, every row (no drafts before the first token).
            self.input = prompt.clone();
            self.rows.clear();
            return;
        }
        if let (Some(d), k @ 1..) = (self.drafter.as_deref_mut(), self.gen.draft_room()) {
            let pushed = d.propose(self.gen.context(), k).and_then(|ds| self.gen.push_drafts(&ds[..ds.len().min(k)]));
            if let Err(e) = pushed {
                self.error = Some(Event::Error(e.to_string()));
                return;
            }
        }
        match self.gen.input() {
            Some(ids) => {
                self.input = ids.to_vec();
                self.rows.clear();
                if self.fed < self.session.len() {
                    self.session.truncate(self.fed);
                }
            }
            None => self.input.clear(),
        }
    }

    /// The part of the input this iteration feeds, and the logits it asks for.
    fn part(&self) -> (&[u32], Option<Logits>) {
        let mut end = (self.done + PREFILL_CHUNK).min(self.input.len());
        let at = self.session.len();
        if let Some(&c) = self.cuts.iter().find(|&&c| c > at) {
            end = end.min(self.done + (c - at));
        }
        let last = end == self.input.len();
        let which = match (self.echo.is_some(), last) {
            (true, _) => Some(Logits::All),
            (false, true) => Some(self.gen.logits_wanted()),
            (false, false) => None,
        };
        (&self.input[self.done..end], which)
    }

    /// Takes the logits of the part just fed; once the whole input is fed, the rows the
    /// generator draws its tokens from ([`Seq::settle`] takes the draw), None before
    /// that or when no token is owed (echo's prompt logprobs alone).
    fn stage(&mut self, rows: Vec<f32>, part: usize, cx: &Ctx<'_>) -> Option<Vec<f32>> {
        self.done += part;
        self.rows.extend_from_slice(&rows);
        if self.done < self.input.len() {
            return None;
        }
        let vocab = cx.loaded.model.cfg.vocab;
        let rows = std::mem::take(&mut self.rows);
        self.done = 0;
        if let Some((n, prompt)) = self.echo.take() {
            self.outbox.push_back(Event::Prompt(sequence_logprobs(&rows, &prompt, vocab, n)));
            if self.gen.finished().is_some() {
                // No token was asked for: the prompt's logprobs are the answer.
                self.fed = self.session.len();
                self.flush();
                return None;
            }
        }
        Some(rows)
    }

    /// After [`Generator::accept_pass`] drew from the rows of [`Seq::stage`] (`drawn`:
    /// its result; `before`: the tokens produced before it): the positions kept, the
    /// text and logprobs to send.
    fn settle(&mut self, drawn: colibri_engine::Result<usize>, before: usize, cx: &Ctx<'_>) {
        match drawn {
            Ok(kept) => self.fed += kept,
            Err(e) => {
                self.error = Some(match e {
                    e @ Error::Grammar(_) => Event::Grammar(e.to_string()),
                    e => Event::Error(e.to_string()),
                });
                return;
            }
        }
        cx.stats.tokens_generated.fetch_add((self.gen.produced().len() - before) as u64, Ordering::Relaxed);
        let text = self.gen.take_text();
        let lps = self.gen.take_logprobs();
        if !text.is_empty() || (self.with_logprobs && !lps.is_empty()) {
            match self.outbox.back_mut() {
                Some(Event::Text(t, l)) => {
                    t.push_str(&text);
                    l.extend(lps);
                }
                _ => self.outbox.push_back(Event::Text(text, lps)),
            }
        }
        self.flush();
    }

    /// Sends what the client's channel takes now; a client that left ends it.
    fn flush(&mut self) {
        while let Some(ev) = self.outbox.pop_front() {
            match self.tx.try_send(ev) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(ev)) => {
                    self.outbox.push_front(ev);
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.client_gone = true;
                    self.gen.cancel();
                    return;
                }
            }
        }
    }

    /// Its own forward pass of `ids` (MTP recording, or a model the batch does not run).
    fn solo(&mut self, model: &Model, ids: &[u32], which: Option<Logits>) -> colibri_engine::Result<Vec<f32>> {
        let w = which.unwrap_or(Logits::Last);
        let rows = match &self.mtp_log {
            Some(log) => {
                let keep = self.session.len();
                forward_recording(model, &mut self.session, log, keep, ids, w)?
            }
            None => crate::flags::on_pool(|| model.forward(&mut self.session, ids, w))?,
        };
        Ok(if which.is_some() { rows } else { Vec::new() })
    }

    /// Ends it: its cache kept for the next request, its place freed, its last events sent.
    fn finish(mut self, cx: &Ctx<'_>) {
        let failed = self.error.is_some();
        if !failed && self.fed < self.session.len() {
            self.session.truncate(self.fed);
        }
        let st = cx.stats;
        if self.gen.is_speculative() {
            let sp = self.gen.spec_stats();
            st.spec_forwards.fetch_add(sp.forwards as u64, Ordering::Relaxed);
            st.spec_drafted.fetch_add(sp.drafted as u64, Ordering::Relaxed);
            st.spec_accepted.fetch_add(sp.accepted as u64, Ordering::Relaxed);
        }
        // A turn boundary, as in `coli chat`: re-pin by use (with hysteresis) and merge the
        // expert uses into the model's usage file, next to what browsers report.
        if let Err(e) = cx.loaded.model.experts.end_turn() {
            eprintln!("coli: warning: re-pinning experts: {e}");
        }
        crate::load::save_usage(cx.loaded);
        // A failed pass may have left keys past the ids: that cache is dropped.
        if !failed {
            st.prompt_tokens_cached.fetch_add(self.cached as u64, Ordering::Relaxed);
            cx.kv.put(std::mem::replace(&mut self.session, cx.loaded.model.new_session()));
        }
        let cancelled = self.client_gone || self.shutting_down;
        let last = match self.error.take() {
            Some(e) => Some(e),
            None if self.client_gone => None,
            None if self.shutting_down => Some(Event::Error("the helper is shutting down".into())),
            None => Some(Event::Done {
                finish_reason: match self.gen.finished() {
                    Some(StopReason::Stop) => "stop",
                    _ => "length",
                },
                prompt_tokens: self.prompt_tokens,
                cached_tokens: self.cached,
                completion_tokens: self.gen.produced().len(),
            }),
        };
        // Account and free the model's place before the last event, so that a client that
        // sees it finds the generation over and the queue free.
        st.generations_active.fetch_sub(1, Ordering::Relaxed);
        let counter = if cancelled { &st.generations_cancelled } else { &st.generations_finished };
        counter.fetch_add(1, Ordering::Relaxed);
        drop(self.admission.take());
        drop(self.permit.take());
        if self.client_gone {
            return;
        }
        self.outbox.extend(last);
        self.flush();
        if !self.outbox.is_empty() && !self.client_gone {
            // A slow client: the rest goes out as it reads, off this thread.
            let (tx, events) = (self.tx.clone(), std::mem::take(&mut self.outbox));
            cx.rt.spawn(async move {
                for ev in events {
                    if tx.send(ev).await.is_err() {
                        break;
                    }
                }
            });
        }
    }
}

/// One engine iteration: each running generation's next input (or its next prompt chunk,
/// within the prefill budget) in one batched pass, then the tokens each pass decides.
fn iteration(active: &mut [Seq<'_>], cx: &Ctx<'_>) {
    let model = &cx.loaded.model;
    for s in active.iter_mut() {
        s.prepare(cx.shutdown);
    }
    // Which sequences feed now: every step input; prompt chunks while the budget lasts
    // (the oldest first; the first chunk always).
    let mut budget = PREFILL_CHUNK;
    let mut feeding = Vec::new();
    for (i, s) in active.iter().enumerate() {
        if s.over() || s.input.is_empty() {
            continue;
        }
        let n = s.part().0.len();
        if n > STEP_IDS {
            if n > budget {
                continue;
            }
            budget -= n;
        }
        feeding.push(i);
    }
    if feeding.is_empty() {
        return;
    }
    let prefill = budget < PREFILL_CHUNK;
    let t0 = Instant::now();
    let mut results: Vec<(usize, usize, colibri_engine::Result<Vec<f32>>)> = Vec::new();
    if feeding.len() > 1 {
        let parts: Vec<(Vec<u32>, Option<Logits>)> = feeding
            .iter()
            .map(|&i| {
                let (ids, w) = active[i].part();
                (ids.to_vec(), w)
            })
            .collect();
        let ids: Vec<&[u32]> = parts.iter().map(|p| p.0.as_slice()).collect();
        let which: Vec<Option<Logits>> = parts.iter().map(|p| p.1).collect();
        // MTP drafts read every fed position's final-normed state: those sequences ask
        // the pass for theirs and record them, as their own pass would.
        let hidden: Vec<bool> = feeding.iter().map(|&i| active[i].mtp_log.is_some()).collect();
        let keeps: Vec<usize> = feeding.iter().map(|&i| active[i].session.len()).collect();
        let mut picked: Vec<&mut Session> = Vec::with_capacity(feeding.len());
        for (i, s) in active.iter_mut().enumerate() {
            if feeding.contains(&i) {
                picked.push(&mut s.session);
            }
        }
        match crate::flags::on_pool(|| model.forward_batch_hidden(&mut picked, &ids, &which, &hidden)) {
            Ok(out) => {
                for (((&i, (rows, states)), p), keep) in feeding.iter().zip(out).zip(&parts).zip(keeps) {
                    if let Some(log) = &active[i].mtp_log {
                        log.record(keep, model.cfg.hidden, &states);
                    }
                    results.push((i, p.0.len(), Ok(rows)));
                }
            }
            // The batch's sessions are as they were: each runs alone, so that an error
            // ends only the generation it belongs to.
            Err(_) => {
                cx.stats.solo_passes.fetch_add(feeding.len() as u64, Ordering::Relaxed);
                results.extend(solo_passes(active, &feeding, model))
            }
        }
    } else {
        results.extend(solo_passes(active, &feeding, model));
    }
    let rows_fed: usize = results.iter().map(|r| r.1).sum();
    let elapsed = t0.elapsed().as_secs_f64();
    let before = cx.stats.tokens_generated.load(Ordering::Relaxed);
    let mut staged: Vec<Option<Vec<f32>>> = (0..active.len()).map(|_| None).collect();
    for (i, n, r) in results {
        let s = &mut active[i];
        match r {
            Ok(rows) => staged[i] = s.stage(rows, n, cx),
            Err(e) => s.error = Some(Event::Error(e.to_string())),
        }
    }
    draw_all(active, staged, cx);
    let made = cx.stats.tokens_generated.load(Ordering::Relaxed) - before;
    cx.stats.record_pass(feeding.len(), rows_fed, made, elapsed, prefill);
    // Clients that read slowly get what waited for them.
    for s in active.iter_mut() {
        if !s.outbox.is_empty() {
            s.flush();
        }
    }
}

/// The draws of an iteration: each sequence with rows staged ([`Seq::stage`]) samples
/// its tokens from them (its own sampler, grammar and random stream: sampling, logprobs
/// and detokenizing, about a millisecond a sequence at a 50k vocabulary), those of
/// several sequences on the pool's threads at once, which sat idle between passes; then
/// each settles ([`Seq::settle`]) in order. A sequence's tokens are the same whichever
/// thread draws them.
fn draw_all(active: &mut [Seq<'_>], staged: Vec<Option<Vec<f32>>>, cx: &Ctx<'_>) {
    use rayon::prelude::*;
    let vocab = cx.loaded.model.cfg.vocab;
    let tok = cx.loaded.tokenizer.as_ref();
    let mut jobs: Vec<(usize, &mut Generator, Vec<f32>)> = active
        .iter_mut()
        .zip(staged)
        .enumerate()
        .filter_map(|(i, (s, rows))| rows.map(|r| (i, &mut s.gen, r)))
        .collect();
    let draw = |(_, g, rows): &mut (usize, &mut Generator, Vec<f32>)| {
        let before = g.produced().len();
        (g.accept_pass(rows, vocab, tok), before)
    };
    let drawn: Vec<(colibri_engine::Result<usize>, usize)> = if jobs.len() > 1 {
        crate::flags::on_pool(|| jobs.par_iter_mut().map(draw).collect())
    } else {
        jobs.iter_mut().map(draw).collect()
    };
    let order: Vec<usize> = jobs.iter().map(|j| j.0).collect();
    drop(jobs);
    for (i, (r, before)) in order.into_iter().zip(drawn) {
        active[i].settle(r, before, cx);
    }
}

/// Each of `which` sequences' parts in its own pass.
fn solo_passes(
    active: &mut [Seq<'_>],
    which: &[usize],
    model: &Model,
) -> Vec<(usize, usize, colibri_engine::Result<Vec<f32>>)> {
    which
        .iter()
        .map(|&i| {
            let s = &mut active[i];
            let (ids, w) = s.part();
            let ids = ids.to_vec();
            (i, ids.len(), s.solo(model, &ids, w))
        })
        .collect()
}
