//! Log-probabilities of tokens (OpenAI `logprobs` / `top_logprobs`, and option scoring):
//! the log-softmax of the model's logits row, the distribution before temperature,
//! top-k/top-p and the repetition penalty (as OpenAI and vLLM report it).
//!
//! Computed in f64 in one fixed order with the pure-Rust `libm` (the same bits on native
//! and wasm32), so the CLI, the server and the browser report the same numbers:
//! logprob(i) = (x_i - max) - ln(sum_j exp(x_j - max)), j in index order. NaN logits
//! count as -inf (they never receive probability, as in the sampler).

use serde_json::{json, Value};

use crate::tokenizer::{byte_level_byte, Tokenizer};

/// Most alternatives per position (OpenAI allows 20).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One token's log-probability and the most likely alternatives at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f64,
    /// The `n` most likely ids, most likely first (ties: lower id first).
    pub top: Vec<(u32, f64)>,
}

/// The normaliser of one logits row.
#[derive(Clone, Copy, Debug)]
pub struct LogSoftmax {
    max: f64,
    log_sum: f64,
}

fn clean(x: f32) -> f64 {
    if x.is_nan() {
        f64::NEG_INFINITY
    } else {
        x as f64
    }
}

impl LogSoftmax {
    pub fn of(logits: &[f32]) -> Self {
        let max = logits.iter().map(|&x| clean(x)).fold(f64::NEG_INFINITY, f64::max);
        if !max.is_finite() {
            // All -inf/NaN, or +inf entries: no finite normaliser (logprobs are -inf or NaN).
            return LogSoftmax { max, log_sum: 0.0 };
        }
        let mut sum = 0.0f64;
        for &x in logits {
            let x = clean(x);
            if x != f64::NEG_INFINITY {
                sum += libm::exp(x - max);
            }
        }
        LogSoftmax { max, log_sum: libm::log(sum) }
    }

    /// log p(id); -inf for an id outside the row.
    pub fn logprob(&self, logits: &[f32], id: u32) -> f64 {
        match logits.get(id as usize) {
            Some(&x) => (clean(x) - self.max) - self.log_sum,
            None => f64::NEG_INFINITY,
        }
    }
}

/// The `n` most likely ids of `logits` with their log-probabilities, most likely first.
pub fn top_logprobs(logits: &[f32], n: usize, ls: &LogSoftmax) -> Vec<(u32, f64)> {
    if n == 0 {
        return Vec::new();
    }
    let before = |a: &u32, b: &u32| clean(logits[*b as usize]).total_cmp(&clean(logits[*a as usize])).then(a.cmp(b));
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(order.len());
    if n < order.len() {
        order.select_nth_unstable_by(n - 1, before);
        order.truncate(n);
    }
    order.sort_unstable_by(before);
    order.into_iter().map(|id| (id, ls.logprob(logits, id))).collect()
}

/// `id`'s log-probability under `logits`, with the `top_n` most likely alternatives.
pub fn token_logprob(logits: &[f32], id: u32, top_n: usize) -> TokenLogprob {
    let ls = LogSoftmax::of(logits);
    TokenLogprob { id, logprob: ls.logprob(logits, id), top: top_logprobs(logits, top_n, &ls) }
}

/// Teacher-forced log-probabilities of `ids[1..]` from the rows of `ids` (row i holds the
/// logits after ids[..=i]; `rows` is (ids.len(), vocab)). The first id has none.
pub fn sequence_logprobs(rows: &[f32], ids: &[u32], vocab: usize, top_n: usize) -> Vec<TokenLogprob> {
    (1..ids.len())
        .filter_map(|i| rows.get((i - 1) * vocab..i * vocab).map(|row| token_logprob(row, ids[i], top_n)))
        .collect()
}

/// A token's text and raw bytes as OpenAI reports them: the text decoded on its own
/// (special tokens included), and the bytes it stands for, which differ from the text's
/// UTF-8 when the token holds part of a character (byte-level BPE stand-ins, or
/// SentencePiece byte-fallback pieces such as `<0xE2>`).
pub fn token_text(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let text = tok.decode(&[id], false).unwrap_or_default();
    if !text.contains('\u{FFFD}') {
        let bytes = text.as_bytes().to_vec();
        return (text, bytes);
    }
    let piece = tok.id_to_token(id).unwrap_or_default();
    if let Some(hex) = piece.strip_prefix("<0x").and_then(|s| s.strip_suffix('>')) {
        if let Ok(b) = u8::from_str_radix(hex, 16) {
            return (text, vec![b]);
        }
    }
    match piece.chars().map(byte_level_byte).collect::<Option<Vec<u8>>>() {
        Some(bytes) if !bytes.is_empty() => (text, bytes),
        _ => {
            let bytes = text.as_bytes().to_vec();
            (text, bytes)
        }
    }
}

/// -inf as OpenAI writes it (JSON has no infinity).
fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        json!(-9999.0)
    }
}

/// One entry of a chat completion's `logprobs.content`:
/// `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`.
pub fn chat_entry(tok: &Tokenizer, t: &TokenLogprob) -> Value {
    let (token, bytes) = token_text(tok, t.id);
    let top: Vec<Value> = t
        .top
        .iter()
        .map(|&(id, lp)| {
            let (token, bytes) = token_text(tok, id);
            json!({"token": token, "logprob": num(lp), "bytes": bytes})
        })
        .collect();
    json!({"token": token, "logprob": num(t.logprob), "bytes": bytes, "top_logprobs": top})
}

/// A text completion's `logprobs` object for `entries` (None: a position without one,
/// the first prompt token under `echo`), with `text_offset` counted in characters from
/// `offset0`: `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`.
pub fn completion_logprobs(tok: &Tokenizer, entries: &[(u32, Option<&TokenLogprob>)], offset0: usize) -> Value {
    let (mut tokens, mut lps, mut tops, mut offsets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut at = offset0;
    for &(id, t) in entries {
        let (text, _) = token_text(tok, id);
        offsets.push(at);
        at += text.chars().count();
        tokens.push(text);
        match t {
            Some(t) => {
                lps.push(num(t.logprob));
                let mut m = serde_json::Map::new();
                for &(alt, lp) in &t.top {
                    m.entry(token_text(tok, alt).0).or_insert_with(|| num(lp));
                }
                tops.push(Value::Object(m));
            }
            None => {
                lps.push(Value::Null);
                tops.push(Value::Null);
            }
        }
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(logits: &[f32]) -> Vec<f64> {
        let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let s: f64 = logits.iter().map(|&x| (x as f64 - m).exp()).sum();
        logits.iter().map(|&x| x as f64 - m - s.ln()).collect()
    }

    #[test]
    fn log_softmax_matches_a_direct_computation_and_sums_to_one() {
        let logits = [0.5f32, -1.0, 3.25, 0.0, 3.25, -20.0];
        let ls = LogSoftmax::of(&logits);
        let want = naive(&logits);
        let mut total = 0.0;
        for (i, w) in want.iter().enumerate() {
            let got = ls.logprob(&logits, i as u32);
            assert!((got - w).abs() < 1e-12, "{i}: {got} vs {w}");
            total += got.exp();
        }
        assert!((total - 1.0).abs() < 1e-12);
        assert_eq!(ls.logprob(&logits, 99), f64::NEG_INFINITY);
    }

    #[test]
    fn top_is_sorted_ties_by_lower_id_and_skips_nan() {
        let logits = [0.5f32, f32::NAN, 3.25, 0.0, 3.25, -20.0];
        let t = token_logprob(&logits, 2, 3);
        assert_eq!(t.top.iter().map(|x| x.0).collect::<Vec<_>>(), [2, 4, 0]);
        assert_eq!(t.top[0].1, t.logprob);
        assert!(t.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert_eq!(token_logprob(&logits, 1, 0).logprob, f64::NEG_INFINITY);
        assert!(token_logprob(&logits, 1, 0).top.is_empty());
        // More asked than the row has: the whole row, NaN last.
        assert_eq!(token_logprob(&logits, 0, 50).top.len(), 6);
        assert_eq!(token_logprob(&logits, 0, 50).top[5].0, 1);
    }

    #[test]
    fn sequence_logprobs_use_the_previous_row() {
        let vocab = 3;
        let rows = [0.0f32, 1.0, 2.0, 2.0, 1.0, 0.0];
        let got = sequence_logprobs(&rows, &[7, 2, 0], vocab, 1);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].id, got[1].id), (2, 0));
        assert!((got[0].logprob - naive(&rows[..3])[2]).abs() < 1e-12);
        assert!((got[1].logprob - naive(&rows[3..])[0]).abs() < 1e-12);
        assert_eq!(got[1].top[0].0, 0);
    }

    #[test]
    fn byte_level_alphabet_round_trips() {
        assert_eq!(byte_level_byte('A'), Some(b'A'));
        assert_eq!(byte_level_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_byte('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_byte('\u{100}'), Some(0));
        assert_eq!(byte_level_byte('€'), None);
    }
}
