//! The snapshots of a state that cannot drop its last positions (a Gated DeltaNet
//! layer's, DeepSeek-V4's compressed state; on the CPU and the GPU alike): where the last
//! multi-token passes began and where one ended, so that a rollback (a speculative
//! pass's rejected drafts) or a prompt that parts from the conversation there goes back
//! without feeding everything again. One bookkeeping for every such state; what a
//! snapshot holds (`T`) and how it is restored are the state's.

/// Snapshots kept.
pub const MAX_SNAPSHOTS: usize = 2;

/// Up to [`MAX_SNAPSHOTS`] snapshots `(position, T)`, oldest first, and whether the last
/// pass was a multi-token one.
#[derive(Clone, Debug)]
pub struct Snapshots<T> {
    list: Vec<(usize, T)>,
    after_many: bool,
}

impl<T> Default for Snapshots<T> {
    fn default() -> Self {
        Snapshots { list: Vec::new(), after_many: false }
    }
}

impl<T> Snapshots<T> {
    /// Whether a pass of `n` positions starts with a snapshot: a multi-token pass (a
    /// prompt, a speculative batch) may be rolled back to its start, and the pass after
    /// one starts where it ended: where a chat's next prompt, which may not tokenize the
    /// answer back to the ids generated (or drops a thinking block), most often parts.
    pub fn begin(&mut self, n: usize) -> bool {
        let snap = n > 1 || self.after_many;
        self.after_many = n > 1;
        snap
    }

    /// Whether a snapshot of the state after `pos` positions is worth taking: not of the
    /// empty state, not twice of one.
    pub fn wants(&self, pos: usize) -> bool {
        pos > 0 && self.list.last().is_none_or(|s| s.0 != pos)
    }

    /// The oldest snapshot when a new one would push it out (its storage to reuse).
    pub fn make_room(&mut self) -> Option<T> {
        (self.list.len() >= MAX_SNAPSHOTS).then(|| self.list.remove(0).1)
    }

    /// Adds the state after `pos` positions as the newest; the oldest goes past
    /// [`MAX_SNAPSHOTS`].
    pub fn push(&mut self, pos: usize, snap: T) {
        self.make_room();
        self.list.push((pos, snap));
    }

    /// Where a state holding `held` positions lands when asked to go back to `positions`:
    /// unchanged if it holds no more, else the latest snapshot at or before, else 0.
    pub fn point(&self, held: usize, positions: usize) -> usize {
        if positions >= held {
            return held;
        }
        self.list.iter().map(|s| s.0).filter(|&p| p <= positions).max().unwrap_or(0)
    }

    /// Forgets the snapshots after `positions` and returns the latest one left (None: go
    /// back to the empty state).
    pub fn back_to(&mut self, positions: usize) -> Option<&(usize, T)> {
        self.list.retain(|s| s.0 <= positions);
        self.list.last()
    }

    /// The snapshots, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &(usize, T)> {
        self.list.iter()
    }

    pub fn clear(&mut self) {
        self.list.clear();
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
}
