//! Fitting a conversation into the context window: the one trimming rule that every
//! surface uses (the OpenAI server, the browser engine and so the chat page and the widget,
//! `coli chat`).
//!
//! When the rendered conversation plus room for the answer would pass the context, whole
//! turns are dropped from the front: a turn is a user message and the messages after it
//! up to the next user message. The leading system messages and the last turn always stay.

use super::{ChatMessage, Tokenizer};
use crate::error::{Error, Result};

/// A conversation rendered (with the generation prompt) and tokenized, after the oldest
/// turns that did not fit were left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FittedChat {
    pub ids: Vec<u32>,
    /// How many messages were left out: the first `dropped` messages after the leading
    /// system messages.
    pub dropped: usize,
}

/// Tokens of answer that trimming keeps room for: `max_tokens` (all the context when
/// unset), but never more than a quarter of the context, so that a large `max_tokens` does
/// not throw away a conversation that fits.
pub fn answer_reserve(max_tokens: Option<usize>, max_positions: usize) -> usize {
    max_tokens.unwrap_or(usize::MAX).min(max_positions / 4).max(1)
}

/// Whether `len` prompt tokens leave room for `reserve` answer tokens: k tokens after a
/// prompt of `len` need `len + k - 1` positions (the last token is never fed).
fn leaves_room(len: usize, reserve: usize, max_positions: usize) -> bool {
    len + reserve <= max_positions + 1
}

/// Renders `messages` with the chat template and tokenizes them. If the prompt leaves less
/// than `reserve` tokens of the `max_positions` context for the answer, drops the fewest
/// oldest turns that make room. When no trimming makes room for `reserve`, the whole
/// conversation is kept if it fits at all (the answer then ends at the context), else the
/// fewest turns that make it fit are dropped. [`Error::ContextOverflow`] when the system
/// messages and the last turn alone are longer than the context.
pub fn fit_chat(tok: &Tokenizer, messages: &[ChatMessage], max_positions: usize, reserve: usize) -> Result<FittedChat> {
    fit_rendered(messages, max_positions, reserve, &|kept| tok.encode_chat(kept, true))
}

/// [`fit_chat`] with another rendering: `render` turns the kept messages into the prompt's
/// ids (the OpenAI server renders `tools` into the prompt this way). The same rule: the
/// leading system messages and the last turn stay, whole turns go from the front.
pub fn fit_rendered(
    messages: &[ChatMessage],
    max_positions: usize,
    reserve: usize,
    render: &dyn Fn(&[ChatMessage]) -> Result<Vec<u32>>,
) -> Result<FittedChat> {
    let system = messages.iter().take_while(|m| m.role == "system").count();
    // Where each droppable turn starts (after the system messages): the first message, and
    // every later user message. Dropping k turns drops messages[system..starts[k]].
    let starts: Vec<usize> = (system..messages.len())
        .filter(|&i| i == system || messages[i].role == "user")
        .chain(std::iter::once(messages.len()))
        .collect();
    // The last turn is never dropped: at most starts.len() - 2 turns go.
    let most = starts.len().saturating_sub(2);
    let render = |k: usize| -> Result<Vec<u32>> {
        let kept: Vec<ChatMessage> = messages[..system].iter().chain(&messages[starts[k]..]).cloned().collect();
        render(&kept)
    };
    let whole = render(0)?;
    if leaves_room(whole.len(), reserve, max_positions) {
        return Ok(FittedChat { ids: whole, dropped: 0 });
    }
    // The fewest dropped turns for which `ok` holds, by bisection: the prompt shrinks as
    // turns go. None when even `most` dropped turns do not do it.
    let fewest = |ok: &dyn Fn(usize) -> bool, cache: &mut Vec<(usize, Vec<u32>)>| -> Result<Option<usize>> {
        let mut len_of = |k: usize| -> Result<usize> {
            if let Some((_, ids)) = cache.iter().find(|(c, _)| *c == k) {
                return Ok(ids.len());
            }
            let ids = render(k)?;
            let n = ids.len();
            cache.push((k, ids));
            Ok(n)
        };
        if most == 0 || !ok(len_of(most)?) {
            return Ok(None);
        }
        let (mut lo, mut hi) = (1, most); // ok(hi) holds; looking for the smallest such k >= lo
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if ok(len_of(mid)?) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(Some(hi))
    };
    let mut cache = vec![(0, whole)];
    let k = match fewest(&|n| leaves_room(n, reserve, max_positions), &mut cache)? {
        Some(k) => Some(k),
        None if cache[0].1.len() <= max_positions => Some(0),
        None => fewest(&|n| n <= max_positions, &mut cache)?,
    };
    let Some(k) = k else {
        let len = cache.iter().find(|(c, _)| *c == most).map_or(0, |(_, ids)| ids.len());
        return Err(Error::ContextOverflow { len, limit: max_positions });
    };
    let ids = match cache.iter().position(|(c, _)| *c == k) {
        Some(i) => cache.swap_remove(i).1,
        None => render(k)?,
    };
    Ok(FittedChat { ids, dropped: starts[k] - system })
}

/// How many leading ids of `ids` (the prompt of `messages`) every conversation with the
/// same system messages starts with: the system messages and the next message's header,
/// found by rendering (`render`, without the generation prompt) the messages up to the
/// first that is not a system message, that one emptied (templates such as Qwen3's refuse
/// messages without a user query), and comparing. 0 without system messages, with nothing
/// after them, or when the template fails. A model whose state goes back only to snapshots
/// ends a prompt pass there (`generate::snapshot_cuts`): a widget's visitors share it.
pub fn system_prefix_len(
    messages: &[ChatMessage],
    ids: &[u32],
    render: &dyn Fn(&[ChatMessage]) -> Result<Vec<u32>>,
) -> usize {
    let system = messages.iter().take_while(|m| m.role == "system").count();
    if system == 0 || system == messages.len() {
        return 0;
    }
    let mut probe = messages[..=system].to_vec();
    probe[system].content.clear();
    render(&probe).map_or(0, |p| common_prefix(&p, ids).min(ids.len().saturating_sub(1)))
}

/// How many leading ids `a` and `b` share.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_prefix_is_what_visitors_with_one_system_prompt_share() {
        let tok = tok();
        let render = |m: &[ChatMessage]| tok.encode_chat(m, false);
        let visitor = |q: &str| vec![m("system", "Answer briefly, and always in English."), m("user", q)];
        let (a, b) = (visitor("What is 2 + 2?"), visitor("Name a river."));
        let (ia, ib) = (tok.encode_chat(&a, true).unwrap(), tok.encode_chat(&b, true).unwrap());
        let n = system_prefix_len(&a, &ia, &render);
        let system_alone = tok.encode_chat(&a[..1], false).unwrap();
        assert!(n > system_alone.len(), "the system messages and the user header: {n}");
        assert_eq!(ia[..n], ib[..n], "both visitors start with it");
        assert!(n < common_prefix(&ia, &ib) + 3, "and it ends near where they part");
        assert_eq!(system_prefix_len(&a[1..], &ia, &render), 0, "no system message");
        assert_eq!(system_prefix_len(&a[..1], &ia, &render), 0, "nothing after it");
        let fails = |_: &[ChatMessage]| -> Result<Vec<u32>> { Err(crate::Error::Template("no".into())) };
        assert_eq!(system_prefix_len(&a, &ia, &fails), 0);
    }

    fn tok() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo");
        Tokenizer::from_dir(&dir).expect("the demo model's tokenizer")
    }

    fn m(role: &str, content: &str) -> ChatMessage {
        ChatMessage::new(role, content)
    }

    /// A system prompt and five turns of different lengths.
    fn conversation() -> Vec<ChatMessage> {
        let mut v = vec![m("system", "Answer briefly.")];
        for i in 0..5 {
            v.push(m("user", &format!("What is {i} + {}?", i * 7)));
            v.push(m("assistant", &"a fairly long answer ".repeat(i + 1)));
        }
        v.push(m("user", "Spell river backwards."));
        v
    }

    /// The reference: drop 0, 1, 2, ... turns until the prompt leaves room.
    fn linear(tok: &Tokenizer, msgs: &[ChatMessage], max: usize, reserve: usize) -> Option<(usize, Vec<u32>)> {
        let starts: Vec<usize> = (1..msgs.len()).filter(|&i| i == 1 || msgs[i].role == "user").collect();
        let keep = |s: usize| -> Vec<u32> {
            let kept: Vec<ChatMessage> = msgs[..1].iter().chain(&msgs[s..]).cloned().collect();
            tok.encode_chat(&kept, true).unwrap()
        };
        for &s in &starts {
            let ids = keep(s);
            if ids.len() + reserve <= max + 1 {
                return Some((s - 1, ids));
            }
        }
        let whole = keep(1);
        if whole.len() <= max {
            return Some((0, whole));
        }
        starts.iter().map(|&s| (s - 1, keep(s))).find(|(_, ids)| ids.len() <= max)
    }

    #[test]
    fn keeps_a_conversation_that_fits() {
        let (tok, msgs) = (tok(), conversation());
        let all = tok.encode_chat(&msgs, true).unwrap();
        let f = fit_chat(&tok, &msgs, all.len() + 9, 10).unwrap();
        assert_eq!(f, FittedChat { ids: all, dropped: 0 });
    }

    #[test]
    fn drops_the_fewest_oldest_turns_and_keeps_the_system_prompt() {
        let (tok, msgs) = (tok(), conversation());
        let all = tok.encode_chat(&msgs, true).unwrap().len();
        let mut trimmed = 0;
        for max in (20..all + 20).step_by(3) {
            for reserve in [1, 8, 40] {
                let got = fit_chat(&tok, &msgs, max, reserve);
                match linear(&tok, &msgs, max, reserve) {
                    Some((dropped, ids)) => {
                        let f = got.unwrap_or_else(|e| panic!("max {max} reserve {reserve}: {e}"));
                        assert_eq!((f.dropped, &f.ids), (dropped, &ids), "max {max} reserve {reserve}");
                        assert_eq!(f.ids[..6], tok.encode_chat(&msgs[..1], false).unwrap()[..6], "system prompt kept");
                        assert!(f.dropped.is_multiple_of(2), "whole turns go");
                        trimmed += (f.dropped > 0) as usize;
                    }
                    None => assert!(
                        matches!(got, Err(Error::ContextOverflow { limit, .. }) if limit == max),
                        "max {max}: {got:?}"
                    ),
                }
            }
        }
        assert!(trimmed > 10, "the sweep must exercise trimming ({trimmed})");
    }

    #[test]
    fn a_last_turn_longer_than_the_context_is_an_error() {
        let tok = tok();
        let msgs = vec![m("user", "hello"), m("assistant", "hi"), m("user", &"word ".repeat(200))];
        match fit_chat(&tok, &msgs, 64, 8) {
            Err(Error::ContextOverflow { len, limit: 64 }) => assert!(len > 64),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_reserve_is_max_tokens_up_to_a_quarter_of_the_context() {
        assert_eq!(answer_reserve(Some(64), 1024), 64);
        assert_eq!(answer_reserve(Some(4096), 1024), 256);
        assert_eq!(answer_reserve(None, 1024), 256);
        assert_eq!(answer_reserve(Some(0), 1024), 1);
    }
}
