//! Speculative decoding from prompt lookup: draft tokens are what followed the latest
//! earlier occurrence of the context's last few tokens (n-gram matching, as transformers'
//! `prompt_lookup_num_tokens` and llama.cpp's lookup decoding do). The generator feeds
//! the last token and the drafts in one forward pass and draws from each position's
//! logits in order, keeping drafts while they equal what was drawn
//! ([`super::Generator::accept_rows`]).
//!
//! The output is exactly the output without speculation, for greedy and sampled decoding
//! alike: the engine's batched forward gives bit for bit the logits of token-by-token
//! decoding, each produced token is drawn from the same logits with the same random
//! stream (one draw per produced token), and rows after the first rejected draft are
//! never looked at. What speculation changes is how many tokens one forward pass yields.

/// Up to `k` tokens that followed the latest earlier occurrence of the last `n` tokens of
/// `context`, trying n = `max_ngram` down to 1; empty when nothing matches.
pub fn lookup(context: &[u32], max_ngram: usize, k: usize) -> &[u32] {
    let len = context.len();
    if k == 0 {
        return &[];
    }
    for n in (1..=max_ngram.min(len.saturating_sub(1))).rev() {
        let pattern = &context[len - n..];
        // The latest start i < len - n whose n tokens equal the suffix.
        for i in (0..len - n).rev() {
            if &context[i..i + n] == pattern {
                let from = i + n;
                return &context[from..(from + k).min(len)];
            }
        }
    }
    &[]
}

/// What speculation did over one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Forward passes that verified drafts (or fed the prompt).
    pub forwards: usize,
    /// Draft tokens fed.
    pub drafted: usize,
    /// Draft tokens that equalled the drawn token.
    pub accepted: usize,
    /// Tokens produced by those passes.
    pub produced: usize,
}

impl SpecStats {
    /// Accepted drafts over drafted (0 with none drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Tokens produced per forward pass.
    pub fn tokens_per_forward(&self) -> f64 {
        if self.forwards == 0 {
            0.0
        } else {
            self.produced as f64 / self.forwards as f64
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "forwards": self.forwards, "drafted": self.drafted, "accepted": self.accepted,
            "produced": self.produced, "acceptance_rate": self.acceptance_rate(),
            "tokens_per_forward": self.tokens_per_forward(),
        })
    }
}

/// Longest pause of drafting, in steps ([`DraftSchedule`]).
pub const MAX_PAUSE: usize = 32;

/// How many drafts the next step proposes, from how the last ones fared. A verify pass of
/// k drafts costs more than a one-token step (on the CPU each position's expert work is
/// its own), and a model whose state goes back only to snapshots (Gated DeltaNet,
/// DeepSeek-V4) pays a snapshot and a refeed for each rejection: with drafts that never
/// match (prompt lookup on a text that does not repeat itself), a fixed k made decode about
/// half as fast as without. Like transformers' "heuristic" schedule: two more drafts after
/// a step that kept them all (up to the most asked for), one fewer after one that kept
/// some, half as many after one that kept none; at one draft, from the second step in a
/// row that kept none, no drafts for 1, then 2, 4.. up to [`MAX_PAUSE`] steps after each
/// such step, until a draft is kept again. Which drafts are fed never changes the tokens
/// (each is drawn from the same logits either way).
#[derive(Clone, Copy, Debug)]
pub struct DraftSchedule {
    max: usize,
    len: usize,
    misses: usize,
    pause: usize,
    backoff: usize,
}

impl DraftSchedule {
    /// Up to `max` drafts per step, starting with `max`.
    pub fn new(max: usize) -> Self {
        DraftSchedule { max, len: max, misses: 0, pause: 0, backoff: 1 }
    }

    /// Drafts the next step may propose.
    pub fn next(&self) -> usize {
        if self.pause > 0 {
            0
        } else {
            self.len
        }
    }

    /// After a step that fed `drafted` drafts and kept `accepted` of them.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            self.pause = self.pause.saturating_sub(1);
            return;
        }
        if accepted > 0 {
            let len = if accepted >= drafted { self.len + 2 } else { self.len.saturating_sub(1) };
            (self.len, self.misses, self.backoff) = (len.clamp(1, self.max.max(1)), 0, 1);
        } else if self.len > 1 {
            self.len /= 2;
        } else {
            self.misses += 1;
            if self.misses >= 2 {
                self.pause = self.backoff;
                self.backoff = (2 * self.backoff).min(MAX_PAUSE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_shrink_pause_and_come_back() {
        let mut s = DraftSchedule::new(4);
        assert_eq!(s.next(), 4);
        // Steps that keep nothing: 2, 1 drafts; at one, the second miss in a row pauses.
        for want in [2, 1, 1] {
            s.record(s.next(), 0);
            assert_eq!(s.next(), want);
        }
        s.record(1, 0);
        assert_eq!(s.next(), 0, "paused for one step");
        s.record(0, 0);
        assert_eq!(s.next(), 1);
        s.record(1, 0);
        assert_eq!(s.next(), 0);
        s.record(0, 0);
        assert_eq!(s.next(), 0, "the next pause is two steps");
        s.record(0, 0);
        // A kept draft: two more per step, up to the most, and the pauses start over.
        s.record(1, 1);
        assert_eq!(s.next(), 3);
        s.record(3, 3);
        assert_eq!(s.next(), 4);
        s.record(4, 2);
        assert_eq!(s.next(), 3, "some kept: one fewer, no pause");
        s.record(3, 1);
        s.record(2, 1);
        s.record(1, 0);
        assert_eq!(s.next(), 1, "one miss after a kept draft does not pause");
        let mut p = DraftSchedule::new(1);
        let paused = (0..200).filter(|_| {
            let n = p.next();
            p.record(n, 0);
            n == 0
        });
        assert!(paused.count() >= 180, "the pauses grow to {MAX_PAUSE} steps");
    }

    #[test]
    fn the_latest_longest_match_gives_the_draft() {
        // ... 1 2 3 [9 9] ... 1 2 3 [7 8] ... 2 3 -> "2 3" last followed by 7 8.
        let c = [1, 2, 3, 9, 9, 5, 1, 2, 3, 7, 8, 6, 2, 3];
        assert_eq!(lookup(&c, 3, 2), [7, 8]);
        assert_eq!(lookup(&c, 3, 9), [7, 8, 6, 2, 3]);
        // No 3-gram "6 2 3" earlier: the 2-gram "2 3" is used.
        assert_eq!(lookup(&c, 1, 1), [7], "the 1-gram 3 last occurred before 7");
        assert!(lookup(&[1, 2, 3], 3, 4).is_empty(), "nothing repeats");
        assert!(lookup(&c, 3, 0).is_empty());
        assert!(lookup(&[], 3, 4).is_empty());
        assert_eq!(lookup(&[4, 4], 2, 3), [4]);
    }
}
