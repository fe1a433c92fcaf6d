//! Log-probabilities of tokens (OpenAI `logprobs` / `top_logprobs`, and option scoring):
//! the log-softmax of the model's logits row, the distribution before temperature,
//! top-k/top-p and the repetition penalty (as OpenAI and vLLM report it).
//!
//! Computed in f64 in one fixed order with `math::exp64` (its SIMD lanes give its bits)
//! and the pure-Rust `libm`'s log (the same bits on native and wasm32), so the CLI, the
//! server and the browser report the same numbers:
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
        let max = crate::math::row_max(logits) as f64;
        if !max.is_finite() {
            // All -inf/NaN, or +inf entries: no finite normaliser (logprobs are -inf or NaN).
            return LogSoftmax { max, log_sum: 0.0 };
        }
        // The exponentials a chunk at a time in SIMD lanes (`math::exp64_rows`, the same
        // bits as the scalar `math::exp64` on every path), summed one by one in index
        // order. A -inf (or NaN) entry gives 0, which leaves the sum as it was.
        let simd = crate::qdot::Simd::active() != crate::qdot::Simd::Scalar;
        let mut buf = [0.0f64; 512];
        let mut sum = 0.0f64;
        for chunk in logits.chunks(buf.len()) {
            let e = &mut buf[..chunk.len()];
            for (d, &x) in e.iter_mut().zip(chunk) {
                *d = clean(x) - max;
            }
            crate::math::exp64_rows(e, simd);
            for &v in e.iter() {
                sum += v;
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
    if n <= 32 {
        return best_few(logits, n).into_iter().map(|id| (id, ls.logprob(logits, id))).collect();
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

/// The `n` (1..=32) first ids of `top_logprobs`' order (most likely first, ties by lower id)
/// in one pass over the row, without sorting 50 thousand ids: the ids come in increasing
/// order, so a newcomer goes after every kept entry of its value or more.
fn best_few(logits: &[f32], n: usize) -> Vec<u32> {
    use std::cmp::Ordering::{Greater, Less};
    let mut best: Vec<(f64, u32)> = Vec::with_capacity(n + 1);
    for (id, &x) in logits.iter().enumerate() {
        let v = clean(x);
        if best.len() == n && best.last().is_some_and(|l| v.total_cmp(&l.0) != Greater) {
            continue;
        }
        let at = best.partition_point(|b| b.0.total_cmp(&v) != Less);
        best.insert(at, (v, id as u32));
        best.truncate(n);
    }
    best.into_iter().map(|(_, id)| id).collect()
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
    fn the_one_pass_top_is_the_sorted_one() {
        // Few distinct values (many ties), NaN, both zeros and infinities mixed in.
        let mut r = crate::sampler::Rng::new(5);
        let row: Vec<f32> = (0..3000)
            .map(|i| match i % 97 {
                0 => f32::NAN,
                1 => -0.0,
                2 => 0.0,
                3 => f32::NEG_INFINITY,
                _ => (r.next_f64() * 16.0).floor() as f32 - 8.0,
            })
            .collect();
        let before = |a: &u32, b: &u32| clean(row[*b as usize]).total_cmp(&clean(row[*a as usize])).then(a.cmp(b));
        let mut sorted: Vec<u32> = (0..row.len() as u32).collect();
        sorted.sort_by(before);
        for n in 1..=32 {
            assert_eq!(best_few(&row, n), sorted[..n], "n = {n}");
        }
        assert_eq!(best_few(&row[..5], 32), sorted_of(&row[..5]));
    }

    fn sorted_of(row: &[f32]) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..row.len() as u32).collect();
        ids.sort_by(|a, b| clean(row[*b as usize]).total_cmp(&clean(row[*a as usize])).then(a.cmp(b)));
        ids
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
