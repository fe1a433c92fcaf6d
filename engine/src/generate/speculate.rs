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

#[cfg(test)]
mod tests {
    use super::*;

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
