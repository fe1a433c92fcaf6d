//! The managed disk tier's policy, without browser APIs (tested natively): which experts
//! stay in browser storage under a byte budget ([`DiskBudget`]: pinned experts stay, the
//! others go least recently used first), and where in OPFS's expert file each one lives
//! ([`Extents`]: freed ranges are reused, a freed tail shrinks the file); and which of the
//! dense tensors' bytes a load has written to the browser's copy ([`Covered`]).

/// Experts are numbered in manifest order (every MoE layer's experts, layer by layer).
pub struct DiskBudget {
    /// Bytes the tier may hold (None: no limit).
    budget: Option<u64>,
    /// (expert) -> its bytes
    lens: Vec<u64>,
    stored: Vec<bool>,
    /// (expert) -> the tick of its last read or write (0: not since the tier opened)
    last_use: Vec<u64>,
    tick: u64,
    /// Kept whatever the recency: the hottest experts by learned usage.
    pinned: Vec<bool>,
    /// Evicted since the tier opened: a later fetch of one is a refetch.
    evicted: Vec<bool>,
    stored_bytes: u64,
}

impl DiskBudget {
    /// `mask`: what the store holds now (from its index).
    pub fn new(lens: Vec<u64>, mask: &[bool], budget: Option<u64>) -> Self {
        let n = lens.len();
        let stored: Vec<bool> = (0..n).map(|e| mask.get(e).copied().unwrap_or(false)).collect();
        let stored_bytes = stored.iter().zip(&lens).filter(|(s, _)| **s).map(|(_, l)| l).sum();
        DiskBudget {
            budget,
            lens,
            stored,
            last_use: vec![0; n],
            tick: 0,
            pinned: vec![false; n],
            evicted: vec![false; n],
            stored_bytes,
        }
    }

    pub fn budget(&self) -> Option<u64> {
        self.budget
    }

    pub fn stored_bytes(&self) -> u64 {
        self.stored_bytes
    }

    /// Marks `e` as just used (a read from the tier).
    pub fn touch(&mut self, e: usize) {
        self.tick += 1;
        if let Some(t) = self.last_use.get_mut(e) {
            *t = self.tick;
        }
    }

    /// Whether `e` was evicted earlier (its fetch now is a refetch); clears the mark.
    pub fn take_evicted(&mut self, e: usize) -> bool {
        self.evicted.get_mut(e).map(std::mem::take).unwrap_or(false)
    }

    /// The experts to evict, least recently used first and never a pinned one, so that
    /// `extra` more bytes fit the budget; None if they cannot (pinned experts fill it, or
    /// `extra` alone is over it).
    pub fn victims(&self, extra: u64) -> Option<Vec<usize>> {
        let Some(budget) = self.budget else { return Some(Vec::new()) };
        if extra > budget {
            return None;
        }
        let mut over = (self.stored_bytes + extra).saturating_sub(budget);
        if over == 0 {
            return Some(Vec::new());
        }
        let mut cands: Vec<usize> = (0..self.lens.len()).filter(|&e| self.stored[e] && !self.pinned[e]).collect();
        cands.sort_by_key(|&e| (self.last_use[e], e));
        let mut out = Vec::new();
        for e in cands {
            out.push(e);
            over = over.saturating_sub(self.lens[e]);
            if over == 0 {
                return Some(out);
            }
        }
        None
    }

    /// `e` is in the store now.
    pub fn stored(&mut self, e: usize) {
        if let Some(s) = self.stored.get_mut(e).filter(|s| !**s) {
            *s = true;
            self.stored_bytes += self.lens[e];
        }
        self.touch(e);
    }

    /// `e` left the store (`evicted`: to make room, so its next fetch is a refetch).
    pub fn removed(&mut self, e: usize, evicted: bool) {
        if let Some(s) = self.stored.get_mut(e).filter(|s| **s) {
            *s = false;
            self.stored_bytes -= self.lens[e];
            self.evicted[e] = evicted;
        }
    }

    /// Replaces the pin set.
    pub fn set_pinned(&mut self, experts: &[usize]) {
        self.pinned.iter_mut().for_each(|p| *p = false);
        for &e in experts {
            if let Some(p) = self.pinned.get_mut(e) {
                *p = true;
            }
        }
    }

    /// (experts, bytes) of the pin set that the store holds.
    pub fn pinned_stored(&self) -> (usize, u64) {
        (0..self.lens.len())
            .filter(|&e| self.pinned[e] && self.stored[e])
            .fold((0, 0), |(n, b), e| (n + 1, b + self.lens[e]))
    }
}

/// Free space in an expert file: stored experts are (offset, len) ranges, the rest below
/// `end` is free and reused first fit; the file ends at `end`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Extents {
    /// (offset, len), sorted by offset, never adjacent (merged)
    free: Vec<(u64, u64)>,
    end: u64,
}

impl Extents {
    /// The free ranges between `used` (offset, len) ranges; the file then ends where the
    /// last one does.
    pub fn from_used(used: &[(u64, u64)]) -> Self {
        let mut used = used.to_vec();
        used.sort_unstable();
        let mut x = Extents::default();
        for (off, len) in used {
            if off > x.end {
                x.free.push((x.end, off - x.end));
            }
            x.end = x.end.max(off + len);
        }
        x
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    /// Where `len` bytes go: the first free range that holds them, else the end.
    pub fn alloc(&mut self, len: u64) -> u64 {
        if let Some(i) = self.free.iter().position(|&(_, l)| l >= len) {
            let (off, l) = self.free[i];
            if l == len {
                self.free.remove(i);
            } else {
                self.free[i] = (off + len, l - len);
            }
            return off;
        }
        let off = self.end;
        self.end += len;
        off
    }

    /// Frees `len` bytes at `off`; a free range that reaches the end shortens the file.
    pub fn release(&mut self, off: u64, len: u64) {
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
        if let Some(&(o, l)) = self.free.last() {
            if o + l >= self.end {
                self.end = o;
                self.free.pop();
            }
        }
    }
}

/// Byte ranges written so far (sorted, merged), and which parts of other ranges they miss.
#[derive(Default)]
pub struct Covered {
    ranges: Vec<(u64, u64)>,
}

impl Covered {
    /// Adds [start, end).
    pub fn add(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        self.ranges.retain(|&(a, b)| {
            let touches = a <= e && s <= b;
            if touches {
                s = s.min(a);
                e = e.max(b);
            }
            !touches
        });
        let i = self.ranges.partition_point(|&(a, _)| a < s);
        self.ranges.insert(i, (s, e));
    }

    /// The parts of `want`'s [start, end) ranges not covered, in order.
    pub fn missing(&self, want: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for &(s, e) in want {
            let mut at = s;
            for &(a, b) in self.ranges.iter().filter(|&&(a, b)| a < e && b > s) {
                if a > at {
                    out.push((at, a));
                }
                at = at.max(b);
            }
            if at < e {
                out.push((at, e));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recent_unpinned_until_it_fits() {
        let mut b = DiskBudget::new(vec![10; 5], &[true, true, true, false, false], Some(30));
        assert_eq!(b.stored_bytes(), 30);
        b.touch(0);
        b.touch(2);
        // 1 was used longest ago, then 0 (touched before 2).
        assert_eq!(b.victims(10), Some(vec![1]));
        assert_eq!(b.victims(20), Some(vec![1, 0]));
        b.set_pinned(&[1]);
        assert_eq!(b.victims(10), Some(vec![0]));
        assert_eq!(b.victims(31), None);
        b.set_pinned(&[0, 1, 2]);
        assert_eq!(b.victims(10), None, "pinned experts fill the budget");
        b.set_pinned(&[]);
        b.removed(1, true);
        assert_eq!(b.stored_bytes(), 20);
        assert_eq!(b.victims(10), Some(vec![]));
        b.stored(3);
        assert!(b.take_evicted(1) && !b.take_evicted(1) && !b.take_evicted(0));
        assert_eq!(DiskBudget::new(vec![10; 2], &[true, true], None).victims(1 << 40), Some(vec![]));
    }

    #[test]
    fn freed_ranges_are_reused_and_a_free_tail_shrinks_the_file() {
        let mut x = Extents::from_used(&[(20, 10), (0, 10), (40, 10)]);
        assert_eq!(x, Extents { free: vec![(10, 10), (30, 10)], end: 50 });
        assert_eq!(x.alloc(10), 10);
        assert_eq!(x.alloc(20), 50);
        assert_eq!(x.alloc(5), 30);
        x.release(20, 10);
        x.release(10, 10);
        assert_eq!(x.free, vec![(10, 20), (35, 5)]);
        x.release(50, 20);
        assert_eq!((x.free.clone(), x.end()), (vec![(10, 20), (35, 5)], 50));
        x.release(40, 10);
        assert_eq!((x.free.clone(), x.end()), (vec![(10, 20)], 35));
        x.release(0, 10);
        x.release(30, 5);
        assert_eq!(x, Extents::default());
    }

    #[test]
    fn covered_merges_ranges_and_finds_the_gaps() {
        let mut c = Covered::default();
        for (s, e) in [(10, 20), (30, 40), (20, 25), (0, 5), (38, 50), (60, 60)] {
            c.add(s, e);
        }
        assert_eq!(c.ranges, vec![(0, 5), (10, 25), (30, 50)]);
        assert_eq!(c.missing(&[(0, 5), (3, 12), (45, 70)]), vec![(5, 10), (50, 70)]);
        c.add(4, 31);
        assert_eq!(c.ranges, vec![(0, 50)]);
        assert_eq!(c.missing(&[(0, 50)]), vec![]);
        let mut c = Covered::default();
        c.add(0, 8);
        c.add(12, 20);
        assert_eq!(c.missing(&[(2, 16), (18, 30), (40, 44)]), vec![(8, 12), (20, 30), (40, 44)]);
    }
}
