//! The snapshots of a state that cannot drop its last positions (a Gated DeltaNet
//! layer's, DeepSeek-V4's compressed state; on the CPU and the GPU alike): where the last
//! multi-token passes began and where one ended, so that a rollback (a speculative
//! pass's rejected drafts) or a prompt that parts from the conversation there goes back
//! without feeding everything again. One bookkeeping for every such state; what a
//! snapshot holds (`T`) and how it is restored are the state's.
//!
//! One position may be pinned ([`Snapshots::pin`]): where the prompts of several
//! conversations part (after a widget's system prompt), so that its snapshot stays while
//! later passes come and go. Without it, a speculative decode (a multi-token verify pass
//! per step) or a long message after the system prompt pushed that snapshot out, and the
//! next visitor fed the system prompt again.
//!
//! A pass that verifies drafts ([`Snapshots::verifying`]: every position's logits asked
//! for) takes its snapshot apart, in a transient slot that the next one replaces: only
//! its own rollback needs it, so it pushes out neither the prompt's end (where a chat's
//! next turn, its thinking block dropped, goes back to) nor the cut before a long prompt's
//! last id (Regenerate).

/// Whether a pass of `new` ids (after any a rollback feeds again before them) belongs to
/// the decode: drafts to verify (every position's logits asked for) or one new id; its
/// snapshot is transient ([`Snapshots::verifying`]), unlike a prompt's.
pub fn decode_like(new: usize, which: crate::model::Logits) -> bool {
    which == crate::model::Logits::All || new == 1
}

/// Snapshots kept, besides a pinned one and a verify pass's.
pub const MAX_SNAPSHOTS: usize = 2;

/// Up to [`MAX_SNAPSHOTS`] snapshots `(position, T)`, oldest first (and one more at the
/// pinned position), the latest verify pass's start, and whether the last pass was a
/// multi-token one.
#[derive(Clone, Debug)]
pub struct Snapshots<T> {
    list: Vec<(usize, T)>,
    after_many: bool,
    pinned: Option<usize>,
    /// The start of the latest pass that verified drafts (newer than every one in `list`).
    transient: Option<(usize, T)>,
    /// Whether the coming passes verify drafts, and whether the snapshot being taken is
    /// a verify pass's.
    verifying: bool,
    taking_transient: bool,
}

impl<T> Default for Snapshots<T> {
    fn default() -> Self {
        Snapshots {
            list: Vec::new(),
            after_many: false,
            pinned: None,
            transient: None,
            verifying: false,
            taking_transient: false,
        }
    }
}

impl<T> Snapshots<T> {
    /// Whether the coming passes verify drafts (their snapshots go to the transient slot).
    pub fn verifying(&mut self, v: bool) {
        self.verifying = v;
    }

    /// Whether a pass of `n` positions starts with a snapshot: a multi-token pass (a
    /// prompt, a speculative batch) may be rolled back to its start, and the pass after
    /// one starts where it ended: where a chat's next prompt, which may not tokenize the
    /// answer back to the ids generated (or drops a thinking block), most often parts. A
    /// verify pass's is transient (unless it is also where a prompt ended), and no pass
    /// after one takes a snapshot for that.
    pub fn begin(&mut self, n: usize) -> bool {
        let kept = (n > 1 && !self.verifying) || self.after_many;
        self.taking_transient = !kept && n > 1;
        self.after_many = n > 1 && !self.verifying;
        kept || self.taking_transient
    }

    /// Whether a snapshot of the state after `pos` positions is worth taking: not of the
    /// empty state, not twice of one. One at the pinned position is kept even when a
    /// verify pass takes it (a prompt fed with every position's logits: echo, logprobs).
    pub fn wants(&mut self, pos: usize) -> bool {
        if self.pinned == Some(pos) {
            self.taking_transient = false;
        }
        pos > 0
            && self.list.last().is_none_or(|s| s.0 != pos)
            && (!self.taking_transient || self.transient.as_ref().is_none_or(|s| s.0 != pos))
    }

    /// Keeps the snapshot at `pos` (taken already or to be taken) while others come and
    /// go, in place of the one pinned before.
    pub fn pin(&mut self, pos: usize) {
        self.pinned = Some(pos);
    }

    /// The storage of the snapshot the one being taken replaces, if any: a verify pass's
    /// the previous verify pass's; another the oldest not pinned when the list is full,
    /// else the verify pass's (which every other snapshot drops: it is older).
    pub fn make_room(&mut self) -> Option<T> {
        let transient = self.transient.take().map(|s| s.1);
        if self.taking_transient {
            return transient;
        }
        let pinned = self.list.iter().position(|s| Some(s.0) == self.pinned);
        if self.list.len() < MAX_SNAPSHOTS + usize::from(pinned.is_some()) {
            return transient;
        }
        Some(self.list.remove(usize::from(pinned == Some(0))).1)
    }

    /// Adds the state after `pos` positions as the newest (the oldest not pinned goes
    /// past [`MAX_SNAPSHOTS`]), or as the verify pass's that [`Snapshots::begin`] chose.
    pub fn push(&mut self, pos: usize, snap: T) {
        self.make_room();
        if std::mem::take(&mut self.taking_transient) {
            self.transient = Some((pos, snap));
        } else {
            self.list.push((pos, snap));
        }
    }

    /// Where a state holding `held` positions lands when asked to go back to `positions`:
    /// unchanged if it holds no more, else the latest snapshot at or before, else 0.
    pub fn point(&self, held: usize, positions: usize) -> usize {
        if positions >= held {
            return held;
        }
        self.iter().map(|s| s.0).filter(|&p| p <= positions).max().unwrap_or(0)
    }

    /// Forgets the snapshots after `positions` and returns the latest one left (None: go
    /// back to the empty state).
    pub fn back_to(&mut self, positions: usize) -> Option<&(usize, T)> {
        self.list.retain(|s| s.0 <= positions);
        if self.transient.as_ref().is_some_and(|s| s.0 > positions) {
            self.transient = None;
        }
        self.transient.as_ref().or(self.list.last())
    }

    /// The snapshots, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &(usize, T)> {
        self.list.iter().chain(&self.transient)
    }

    pub fn clear(&mut self) {
        self.list.clear();
        self.transient = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_kept_the_oldest_out_and_back_to_the_latest_at_or_before() {
        let mut s = Snapshots::<char>::default();
        assert!(s.begin(5) && s.begin(1) && !s.begin(1), "a multi-token pass, the pass after one");
        assert!(!s.wants(0));
        s.push(4, 'a');
        assert!(!s.wants(4) && s.wants(9));
        s.push(9, 'b');
        s.push(12, 'c');
        assert_eq!(s.iter().map(|x| x.1).collect::<String>(), "bc");
        assert_eq!((s.point(20, 11), s.point(20, 30), s.point(20, 5)), (9, 20, 0));
        assert_eq!(s.make_room(), Some('b'));
        assert_eq!(s.back_to(11), None);
        s.push(3, 'd');
        s.push(7, 'e');
        assert_eq!(s.back_to(8), Some(&(7, 'e')));
    }

    #[test]
    fn a_verify_pass_takes_a_transient_snapshot() {
        let mut s = Snapshots::<char>::default();
        assert!(s.begin(10));
        s.push(3, 'p');
        s.verifying(true);
        assert!(s.begin(5), "the first verify pass after a prompt: where it ended");
        assert!(s.wants(13));
        s.push(13, 'e');
        for (pos, c) in [(18, 'a'), (23, 'b'), (24, 'c')] {
            assert!(s.begin(5) && s.wants(pos));
            let last = s.iter().nth(2).map(|x| x.1);
            assert_eq!(s.make_room(), last, "the last verify pass's storage");
            s.push(pos, c);
        }
        assert!(!s.begin(1), "no snapshot after a verify pass");
        assert_eq!(s.iter().map(|x| x.1).collect::<String>(), "pec", "the prompt's start and end stay");
        assert_eq!((s.point(30, 26), s.point(30, 20), s.point(30, 5)), (24, 13, 3));
        assert_eq!(s.back_to(24), Some(&(24, 'c')));
        assert!(s.begin(3) && !s.wants(24), "the refeed after a rollback: already there");
        assert_eq!(s.back_to(20), Some(&(13, 'e')));
        // A kept snapshot drops the verify pass's (older from then on).
        s.verifying(false);
        assert!(s.begin(3) && s.wants(25));
        s.push(25, 'f');
        assert_eq!(s.iter().map(|x| x.1).collect::<String>(), "ef");
    }

    #[test]
    fn a_verify_pass_at_the_pinned_position_keeps_its_snapshot() {
        let mut s = Snapshots::<char>::default();
        s.pin(6);
        s.verifying(true);
        assert!(s.begin(6) && s.wants(6));
        s.push(6, 'p');
        for (pos, c) in [(12, 'a'), (15, 'b'), (18, 'c')] {
            assert!(s.begin(3) && s.wants(pos));
            s.make_room();
            s.push(pos, c);
        }
        assert_eq!(s.iter().map(|x| x.1).collect::<String>(), "pc", "the pinned one and the latest");
        assert_eq!(s.back_to(20), Some(&(18, 'c')));
        assert_eq!(s.back_to(14), Some(&(6, 'p')));
    }

    #[test]
    fn a_pinned_snapshot_stays_while_others_come_and_go() {
        let mut s = Snapshots::<char>::default();
        s.pin(4);
        s.push(2, 'a');
        s.push(4, 'p');
        s.push(9, 'b');
        assert_eq!(s.iter().map(|x| x.1).collect::<String>(), "apb", "two besides the pinned one");
        for (pos, c) in [(12, 'c'), (15, 'd'), (18, 'e')] {
            s.push(pos, c);
        }
        assert_eq!(s.iter().map(|x| x.1).collect::<String>(), "pde", "the oldest not pinned went");
        assert_eq!(s.point(30, 10), 4);
        assert_eq!(s.make_room(), Some('d'));
        // Pinned elsewhere: the old one is just another snapshot again.
        s.pin(18);
        s.push(20, 'f');
        assert_eq!(s.iter().map(|x| x.1).collect::<String>(), "pef");
        // Gone back before it: it may be taken again, and is kept then.
        assert_eq!(s.back_to(3), None);
        for (pos, c) in [(18, 'g'), (19, 'h'), (21, 'i'), (22, 'j')] {
            s.push(pos, c);
        }
        assert_eq!(s.iter().map(|x| x.1).collect::<String>(), "gij");
    }
}
