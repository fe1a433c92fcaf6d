//! Prefix reuse: a conversation's context (its KV cache, or MLA's latents, with the token
//! ids it holds) is kept after a request, and a later request whose ids start with the
//! same tokens keeps the cache of that common prefix and feeds only the rest.
//!
//! The output is exactly that of a fresh run: the engine's batched forward gives bit for
//! bit the logits of token-by-token decoding, so where the prompt is split between an
//! earlier request and this one changes no bit; the generator still sees the whole prompt
//! (`Generator::new(&ids[..kept], &ids[kept..], ..)`), so the repetition penalty and the
//! sampler's random stream are those of a fresh run too.
//!
//! One rule for every surface: [`reusable`] (how much of a context a prompt can keep) and
//! [`ContextPool`] (the conversations a server keeps, least recently used out first, by
//! bytes). `coli chat` and the browser keep their one conversation with [`reuse`].

use crate::model::Session;

/// A conversation's context on some backend: the ids it holds and a way to cut it back.
pub trait Context {
    /// Every id fed so far, in order.
    fn tokens(&self) -> &[u32];
    /// Forgets everything after the first `len` ids.
    fn truncate(&mut self, len: usize);
    /// The longest prefix of at most `len` ids this context can be cut back to: `len`
    /// for a KV cache; a recurrent state cannot go back, so all or nothing there.
    fn keepable(&self, len: usize) -> usize {
        len
    }
    /// Bytes the context holds (its cache and ids).
    fn bytes(&self) -> usize;
    /// Keeps the state after `pos` positions to go back to while later passes come and
    /// go (a recurrent state's snapshot, [`Session::pin_snapshot`]); a KV cache goes back
    /// anywhere. Call it when the context holds `pos` positions, before feeding on.
    fn pin_snapshot(&mut self, _pos: usize) {}
}

impl Context for Session {
    fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn truncate(&mut self, len: usize) {
        Session::truncate(self, len)
    }

    /// A DeepSeek-V4 or Gated DeltaNet state goes back to its latest snapshot at or
    /// before `len` ([`crate::model::v4::V4State::rewind`],
    /// [`crate::model::deltanet::DeltaState::rewind`]; the ids after it are fed again).
    fn keepable(&self, len: usize) -> usize {
        match &self.v4 {
            Some(v) if v.pos > len => v.rewind_point(len),
            _ => self
                .caches
                .iter()
                .filter_map(|c| c.recurrent.as_ref())
                .map(|r| r.rewind_point(len))
                .fold(len, usize::min),
        }
    }

    fn bytes(&self) -> usize {
        Session::bytes(self)
    }

    fn pin_snapshot(&mut self, pos: usize) {
        Session::pin_snapshot(self, pos)
    }
}

/// How many of `ids` a context holding `cached` keeps: their longest common prefix, but
/// at least one id is left to feed (its logits give the first new token).
pub fn reusable(cached: &[u32], ids: &[u32]) -> usize {
    cached.iter().zip(ids).take_while(|(a, b)| a == b).count().min(ids.len().saturating_sub(1))
}

/// Fresh ids from which a prompt for a model whose state goes back only to snapshots is
/// fed with its last id in a pass of its own ([`snapshot_cuts`]): that extra pass (one more read of
/// the weights, about one decode step) is small next to a prefill of this many ids, which
/// is what regenerating the answer would otherwise feed again.
pub const LAST_CUT_MIN: usize = 256;

/// Where the passes of a prompt of `len` ids, `kept` of them already held, should end
/// for a model whose state goes back only to snapshots (Gated DeltaNet, DeepSeek-V4:
/// one at the start of each multi-token pass and one after it,
/// [`crate::model::deltanet::DeltaState`], [`crate::model::v4::V4State`]),
/// so that later requests find a state to go back to:
/// - at `shared`, the longest prefix the prompt shares with a conversation kept or
///   running (a widget's visitors with one system prompt: the next request that starts
///   alike keeps that prefix) when it is more than `kept`;
/// - before the last id when at least [`LAST_CUT_MIN`] ids are fed (a regenerated
///   answer, the same prompt again, then feeds one id, not the prompt).
///
/// Positions in ascending order, each in `kept + 1..len`. Cutting a prompt's passes
/// changes no bit (prefill == decode). A KV cache goes back anywhere and needs none.
pub fn snapshot_cuts(kept: usize, shared: usize, len: usize) -> Vec<usize> {
    let mut cuts = Vec::new();
    if shared > kept && shared < len {
        cuts.push(shared);
    }
    let last = len.saturating_sub(1);
    if len.saturating_sub(kept) >= LAST_CUT_MIN && last > kept && cuts.last() != Some(&last) {
        cuts.push(last);
    }
    cuts
}

/// Before a pass of a prompt whose passes end at `shared` ([`snapshot_cuts`]): when the
/// context holds exactly that many positions, the snapshot the pass takes there is pinned
/// ([`Context::pin_snapshot`]), so that later passes (a long message's chunks, speculative
/// verify passes) do not push out where other conversations part from this one.
pub fn pin_shared<C: Context + ?Sized>(cx: &mut C, shared: usize) {
    if shared > 0 && cx.tokens().len() == shared {
        cx.pin_snapshot(shared);
    }
}

/// How many ids of `ids` the context `cx` can keep ([`reusable`], [`Context::keepable`]).
pub fn keepable<C: Context + ?Sized>(cx: &C, ids: &[u32]) -> usize {
    cx.keepable(reusable(cx.tokens(), ids))
}

/// Cuts `cx` back to what `ids` can reuse ([`keepable`]) and returns how many ids it
/// kept: feed `ids[kept..]` after them.
pub fn reuse<C: Context + ?Sized>(cx: &mut C, ids: &[u32]) -> usize {
    let kept = keepable(cx, ids);
    cx.truncate(kept);
    kept
}

/// The conversations a server keeps between requests, bounded by count and by bytes; the
/// least recently used go first.
pub struct ContextPool<C> {
    entries: Vec<Entry<C>>,
    max_entries: usize,
    max_bytes: usize,
    clock: u64,
}

struct Entry<C> {
    cx: C,
    bytes: usize,
    used: u64,
}

impl<C: Context + Clone> ContextPool<C> {
    /// A pool of at most `max_entries` contexts and `max_bytes` bytes (0: keeps nothing).
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        ContextPool { entries: Vec::new(), max_entries, max_bytes, clock: 0 }
    }

    /// The context that shares the longest prefix with `ids`, cut back to it, and how many
    /// ids it kept; None when no context shares a single id. A context that `ids` extends
    /// is taken out (it is put back when the request ends); one that diverges is copied,
    /// so the conversation it holds stays for its own next turn.
    pub fn take(&mut self, ids: &[u32]) -> Option<(C, usize)> {
        let (i, kept) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.cx.keepable(reusable(e.cx.tokens(), ids))))
            .max_by_key(|&(i, kept)| (kept, self.entries[i].used))?;
        if kept == 0 {
            return None;
        }
        self.clock += 1;
        let mut cx = if kept == self.entries[i].cx.tokens().len() {
            self.entries.swap_remove(i).cx
        } else {
            self.entries[i].used = self.clock;
            self.entries[i].cx.clone()
        };
        cx.truncate(kept);
        Some((cx, kept))
    }

    /// The longest prefix `ids` shares with a kept context (at most all but its last id),
    /// whether or not that context can be cut back to it ([`snapshot_cuts`]).
    pub fn shared(&self, ids: &[u32]) -> usize {
        self.entries.iter().map(|e| reusable(e.cx.tokens(), ids)).max().unwrap_or(0)
    }

    /// Keeps `cx` for later requests. Contexts it extends are dropped (it serves every
    /// request they would); then the least recently used go while over a bound. A context
    /// larger than the whole byte budget is not kept.
    pub fn put(&mut self, cx: C) {
        let bytes = cx.bytes();
        if cx.tokens().is_empty() || bytes > self.max_bytes || self.max_entries == 0 {
            return;
        }
        let t = cx.tokens();
        self.entries.retain(|e| !t.starts_with(e.cx.tokens()));
        self.clock += 1;
        self.entries.push(Entry { cx, bytes, used: self.clock });
        while self.entries.len() > self.max_entries || self.bytes() > self.max_bytes {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i) else {
                break;
            };
            self.entries.swap_remove(oldest);
        }
    }

    /// Drops the least recently used contexts until at most `max_bytes` are kept (a server
    /// whose running generations take more of one KV budget makes room for them here).
    pub fn shrink_to(&mut self, max_bytes: usize) {
        while self.bytes() > max_bytes {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i) else {
                break;
            };
            self.entries.swap_remove(oldest);
        }
    }

    /// Bytes held by the kept contexts.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// Contexts kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every kept context, most recently used first (to write them out).
    pub fn contexts(&self) -> Vec<&C> {
        let mut v: Vec<&Entry<C>> = self.entries.iter().collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.used));
        v.into_iter().map(|e| &e.cx).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A context of ids only; `recurrent` ones cannot be cut back.
    #[derive(Clone, Debug, PartialEq)]
    struct Ids {
        ids: Vec<u32>,
        recurrent: bool,
    }

    impl Context for Ids {
        fn tokens(&self) -> &[u32] {
            &self.ids
        }
        fn truncate(&mut self, len: usize) {
            self.ids.truncate(len)
        }
        fn keepable(&self, len: usize) -> usize {
            if self.recurrent && len < self.ids.len() {
                0
            } else {
                len
            }
        }
        fn bytes(&self) -> usize {
            self.ids.len() * 100
        }
    }

    fn ids(v: &[u32]) -> Ids {
        Ids { ids: v.to_vec(), recurrent: false }
    }

    #[test]
    fn shrinking_drops_the_least_recently_used_first() {
        let mut pool = ContextPool::new(8, 10_000);
        pool.put(ids(&[1, 2]));
        pool.put(ids(&[3, 4, 5]));
        pool.put(ids(&[6]));
        assert_eq!(pool.bytes(), 600);
        assert!(pool.take(&[1, 7]).is_some(), "used last now (copied: it diverges)");
        pool.shrink_to(350);
        let kept: Vec<Vec<u32>> = pool.contexts().iter().map(|c| c.ids.clone()).collect();
        assert_eq!(kept, [vec![1, 2], vec![6]], "[3, 4, 5], the oldest, went first");
        pool.shrink_to(0);
        assert!(pool.is_empty());
    }

    #[test]
    fn the_common_prefix_leaves_one_id_to_feed() {
        assert_eq!(reusable(&[1, 2, 3], &[1, 2, 3, 4]), 3);
        assert_eq!(reusable(&[1, 2, 3], &[1, 2, 3]), 2, "the same prompt again feeds its last id");
        assert_eq!(reusable(&[1, 2, 3], &[1, 9, 3, 4]), 1);
        assert_eq!(reusable(&[1, 2, 3, 4, 5], &[1, 2]), 1, "a shorter prompt cuts the cache back");
        assert_eq!(reusable(&[], &[1]), 0);
        assert_eq!(reusable(&[1], &[]), 0);
        let mut c = ids(&[1, 2, 3, 4]);
        assert_eq!(reuse(&mut c, &[1, 2, 7]), 2);
        assert_eq!(c.ids, [1, 2]);
        let mut r = Ids { ids: vec![1, 2, 3, 4], recurrent: true };
        assert_eq!(reuse(&mut r, &[1, 2, 3, 4, 5]), 4, "a recurrent state extended");
        assert_eq!(reuse(&mut r, &[1, 2, 7]), 0, "a recurrent state cannot go back: all or nothing");
        assert!(r.ids.is_empty());
    }

    #[test]
    fn the_pool_takes_the_longest_prefix_and_copies_a_diverging_one() {
        let mut p = ContextPool::new(4, 10_000);
        p.put(ids(&[1, 2, 3, 4]));
        p.put(ids(&[1, 2, 9]));
        assert_eq!(p.len(), 2);
        // Extends [1 2 3 4]: taken out whole.
        let (c, kept) = p.take(&[1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!((c.ids.as_slice(), kept), (&[1, 2, 3, 4][..], 4));
        assert_eq!(p.len(), 1);
        p.put(ids(&[1, 2, 3, 4, 5, 6, 7]));
        // Diverges after [1 2 3]: a copy cut back, the original stays.
        let (c, kept) = p.take(&[1, 2, 3, 8]).unwrap();
        assert_eq!((c.ids.as_slice(), kept), (&[1, 2, 3][..], 3));
        assert_eq!(p.len(), 2);
        assert!(p.contexts().iter().any(|c| c.ids == [1, 2, 3, 4, 5, 6, 7]));
        assert!(p.take(&[5, 6]).is_none(), "nothing shared");
        // A recurrent state that would have to go back is not offered.
        let mut q = ContextPool::new(4, 10_000);
        q.put(Ids { ids: vec![1, 2, 3], recurrent: true });
        assert!(q.take(&[1, 2, 5]).is_none());
        assert_eq!(q.take(&[1, 2, 3, 5]).map(|(_, k)| k), Some(3));
    }

    #[test]
    fn a_recurrent_prompt_ends_its_passes_where_later_requests_go_back_to() {
        // What a kept context shares, whether or not it can go back there.
        let mut q = ContextPool::new(4, 100_000);
        q.put(Ids { ids: vec![1, 2, 3, 4], recurrent: true });
        q.put(Ids { ids: vec![1, 2, 7], recurrent: true });
        assert_eq!(q.shared(&[1, 2, 3, 9]), 3);
        assert_eq!(q.shared(&[1, 2, 3, 4]), 3, "all but the last id");
        assert_eq!(q.shared(&[5]), 0);
        // At the shared prefix beyond what was kept; before the last id of a long prompt.
        assert_eq!(snapshot_cuts(0, 40, 60), [40]);
        assert_eq!(snapshot_cuts(40, 40, 60), [] as [usize; 0], "kept already");
        assert_eq!(snapshot_cuts(0, 0, 60), [] as [usize; 0]);
        assert_eq!(snapshot_cuts(0, 40, LAST_CUT_MIN), [40, LAST_CUT_MIN - 1]);
        assert_eq!(snapshot_cuts(10, 0, LAST_CUT_MIN + 9), [] as [usize; 0], "fewer fresh ids than LAST_CUT_MIN");
        assert_eq!(snapshot_cuts(0, 299, 300), [299], "one cut where both fall");
        assert_eq!(snapshot_cuts(0, 0, 1), [] as [usize; 0]);
    }

    #[test]
    fn the_pool_is_bounded_by_count_and_bytes_least_recent_out() {
        let mut p = ContextPool::new(2, 10_000);
        p.put(ids(&[1]));
        p.put(ids(&[2]));
        p.put(ids(&[3]));
        assert_eq!(p.len(), 2);
        assert!(p.take(&[1, 5]).is_none(), "the oldest went");
        // Bytes: 100 per id, budget 500.
        let mut p = ContextPool::new(8, 500);
        p.put(ids(&[1, 1]));
        p.put(ids(&[2, 2]));
        // Using [1 1] makes [2 2] the least recent.
        let (c, _) = p.take(&[1, 1, 5]).unwrap();
        p.put(c);
        p.put(ids(&[3, 3]));
        assert!(p.bytes() <= 500);
        assert!(p.take(&[2, 2, 5]).is_none(), "the least recently used went");
        assert!(p.take(&[1, 1, 5]).is_some());
        p.put(ids(&[7; 6]));
        assert!(p.take(&[7, 7]).is_none(), "larger than the whole budget: not kept");
        // A context that extends others replaces them.
        let mut p = ContextPool::new(8, 10_000);
        p.put(ids(&[1, 2]));
        p.put(ids(&[1, 2, 3]));
        assert_eq!(p.len(), 1);
        assert!(ContextPool::<Ids>::new(0, 0).is_empty());
    }
}
