//! The in-memory tiers of the expert cache: pinned experts (the hottest by learned usage,
//! never evicted) and a second tier for the rest of the budget, which keeps the experts
//! used most of late (by recency when there is no budget), plus the re-pinning rule with
//! hysteresis so that experts do not thrash between the two.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use super::lru::Lru;
use super::Expert;
use crate::experts::usage::ExpertUsage;

pub type Key = (usize, usize);

/// An expert outside the pin set replaces the coldest pinned one only when it has been
/// used this many times as often (and at least `REPIN_MARGIN` more times).
pub const REPIN_FACTOR: f64 = 1.25;
pub const REPIN_MARGIN: u64 = 2;

#[derive(Default)]
pub struct RamTiers {
    /// key -> (expert, bytes)
    pub pinned: HashMap<Key, (Arc<Expert>, u64)>,
    pub pinned_bytes: u64,
    lru: Lru<Key, Arc<Expert>>,
    /// The second tier's residents by use count, least first, for [`Self::insert_frequent`]:
    /// an entry may hold less than the expert's count now (counts only grow between two
    /// [`Self::recount`]s; it is brought up to date when it comes first) or a key that
    /// left the tier (skipped).
    by_count: BinaryHeap<Reverse<(u64, Key)>>,
}

/// Which tier answered a lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    Pinned,
    Ram,
}

impl RamTiers {
    pub fn contains(&self, key: &Key) -> bool {
        self.pinned.contains_key(key) || self.lru.contains(key)
    }

    /// Looks `key` up, marking an LRU entry as just used.
    pub fn get(&mut self, key: Key) -> Option<(Arc<Expert>, Tier)> {
        if let Some((x, _)) = self.pinned.get(&key) {
            return Some((x.clone(), Tier::Pinned));
        }
        self.lru.get(&key).map(|x| (x, Tier::Ram))
    }

    /// Adds an expert to the LRU tier, evicting the least recently used until it fits in
    /// `budget` bytes (None: no limit). An expert larger than the budget is not kept.
    pub fn insert_lru(&mut self, key: Key, x: Arc<Expert>, size: u64, budget: Option<u64>) {
        if self.contains(&key) || budget.is_some_and(|b| size > b) {
            return;
        }
        if let Some(b) = budget {
            while self.lru.bytes() + size > b {
                if self.lru.pop_oldest().is_none() {
                    break;
                }
            }
        }
        self.lru.insert(key, x, size);
    }

    /// Adds an expert to the second tier by use count instead of recency, for a budget
    /// (`count`: recent uses, which only grow between two [`Self::recount`]s). Recency
    /// fails where a budget cannot hold what comes back: below one token's experts every
    /// layer's experts are used once per token, in the same order, and an LRU evicts each
    /// before its next use; a step of several sequences brings several tokens' experts.
    /// When `key` does not fit, the residents with the fewest uses make room, but only if
    /// each has fewer uses than `key` (ties: the lower key goes first); otherwise `key` is
    /// not kept. An expert larger than the budget is not kept.
    pub fn insert_frequent(&mut self, key: Key, x: Arc<Expert>, size: u64, budget: u64, count: &dyn Fn(Key) -> u64) {
        if self.contains(&key) || size > budget {
            return;
        }
        let c = count(key);
        let mut need = (self.lru.bytes() + size).saturating_sub(budget);
        let mut victims: Vec<Key> = Vec::new();
        while need > 0 {
            let Some(Reverse((stored, k))) = self.by_count.pop() else { break };
            if !self.lru.contains(&k) || victims.contains(&k) {
                continue;
            }
            let now = count(k);
            if now > stored {
                self.by_count.push(Reverse((now, k)));
                continue;
            }
            if now >= c {
                self.by_count.push(Reverse((now, k)));
                break;
            }
            need = need.saturating_sub(self.lru.size(&k));
            victims.push(k);
        }
        if need > 0 {
            for k in victims {
                self.by_count.push(Reverse((count(k), k)));
            }
            return;
        }
        for k in victims {
            self.lru.remove(&k);
        }
        self.lru.insert(key, x, size);
        self.by_count.push(Reverse((c, key)));
    }

    /// Re-reads every resident's count (after the counts fell: [`Self::insert_frequent`]
    /// relies on them only growing in between).
    pub fn recount(&mut self, count: &dyn Fn(Key) -> u64) {
        self.by_count = self.lru.keys().map(|&k| Reverse((count(k), k))).collect();
    }

    /// Takes an expert out of the LRU tier (to pin it).
    pub fn take_lru(&mut self, key: &Key) -> Option<(Arc<Expert>, u64)> {
        self.lru.remove(key)
    }

    pub fn keys(&self) -> Vec<Key> {
        self.pinned.keys().chain(self.lru.keys()).copied().collect()
    }

    pub fn lru_len(&self) -> usize {
        self.lru.len()
    }

    pub fn lru_bytes(&self) -> u64 {
        self.lru.bytes()
    }
}

/// The default pin budget when the model has usage counts: a quarter of `ram`, and never
/// so much that the LRU part cannot hold one token's experts (`per_token`: top-k of every
/// MoE layer). Measured (docs/benchmarks.md): on the demo model, pins learned from other
/// chats lowered the disk share of expert loads a little at a quarter of the budget
/// (0.310 -> 0.305, mean of 8 runs) and raised it at half (0.351); on the OLMoE-shaped
/// model half pinned left an LRU smaller than a token's working set, which hit nothing.
pub fn default_pin(ram: u64, per_token: u64) -> u64 {
    (ram / 4).min(ram.saturating_sub(per_token))
}

/// The pin set after one re-pinning step: which experts to add and which to drop.
/// `pinned`: the current set; `counts`: uses so far; `size(key)`: bytes of an expert;
/// `budget`: bytes the pinned tier may hold. Free room is filled with the hottest
/// unpinned experts; after that a candidate displaces the coldest pinned expert only if
/// it beats it by [`REPIN_FACTOR`] and [`REPIN_MARGIN`] (hysteresis).
pub fn plan_repin(
    pinned: &[Key],
    counts: &ExpertUsage,
    size: &dyn Fn(Key) -> u64,
    budget: u64,
) -> (Vec<Key>, Vec<Key>) {
    let count = |k: Key| counts.get(k.0, k.1);
    let mut kept: Vec<Key> = pinned.to_vec();
    // Coldest last, so pop() gives the weakest; ties: the higher key is weaker.
    kept.sort_by(|a, b| count(*b).cmp(&count(*a)).then(a.cmp(b)));
    let mut used: u64 = kept.iter().map(|&k| size(k)).sum();
    let (mut add, mut drop) = (Vec::new(), Vec::new());
    for (l, e, c) in counts.hottest(usize::MAX) {
        let k = (l, e);
        if kept.contains(&k) {
            continue;
        }
        let s = size(k);
        if s == 0 {
            continue;
        }
        if used + s <= budget {
            used += s;
            add.push(k);
            continue;
        }
        let Some(&weak) = kept.last() else { break };
        let wc = count(weak);
        if (c as f64) < wc as f64 * REPIN_FACTOR
            || c < wc.saturating_add(REPIN_MARGIN)
            || used - size(weak) + s > budget
        {
            break; // candidates only get colder from here
        }
        kept.pop();
        used = used - size(weak) + s;
        drop.push(weak);
        add.push(k);
    }
    (add, drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Mat;

    fn usage(triples: &[(u64, u64, u64)]) -> ExpertUsage {
        let mut u = ExpertUsage::new(2, 4);
        u.merge_triples(triples).unwrap();
        u
    }

    #[test]
    fn fills_then_swaps_only_past_the_hysteresis() {
        let size = |_: Key| 10u64;
        let u = usage(&[(0, 0, 50), (0, 1, 40), (1, 2, 30), (1, 3, 1)]);
        let (add, drop) = plan_repin(&[], &u, &size, 25);
        assert_eq!((add, drop), (vec![(0, 0), (0, 1)], vec![]));
        // (1, 2) at 30 is not 1.25x (0, 1) at 40 (nor x 0,0): nothing changes.
        let (add, drop) = plan_repin(&[(0, 0), (0, 1)], &u, &size, 25);
        assert!(add.is_empty() && drop.is_empty());
        // Once it is clearly hotter, it displaces the coldest pinned expert.
        let u = usage(&[(0, 0, 50), (0, 1, 40), (1, 2, 51)]);
        let (add, drop) = plan_repin(&[(0, 0), (0, 1)], &u, &size, 25);
        assert_eq!((add, drop), (vec![(1, 2)], vec![(0, 1)]));
        // Within the hysteresis band: no swap even though it is hotter.
        let u = usage(&[(0, 0, 50), (0, 1, 40), (1, 2, 45)]);
        assert!(plan_repin(&[(0, 0), (0, 1)], &u, &size, 25).0.is_empty());
    }

    #[test]
    fn default_pin_leaves_the_lru_one_token_of_experts() {
        assert_eq!(default_pin(1000, 100), 250);
        assert_eq!(default_pin(512, 425), 87);
        assert_eq!(default_pin(512, 100), 128);
        assert_eq!(default_pin(300, 425), 0);
        assert_eq!(default_pin(0, 0), 0);
    }

    /// A 1 x 1 expert: the tiers only hold it, the sizes are given separately.
    fn tiny_expert() -> Arc<Expert> {
        let one = || Mat::from_f32(1, 1, &[1.0]).unwrap();
        Arc::new(Expert { gate: one(), up: one(), down: one() })
    }

    #[test]
    fn lru_evicts_least_recent_and_pins_are_separate() {
        let x = tiny_expert();
        let mut t = RamTiers::default();
        t.insert_lru((0, 0), x.clone(), 4, Some(8));
        t.insert_lru((0, 1), x.clone(), 4, Some(8));
        assert!(t.get((0, 0)).is_some());
        t.insert_lru((0, 2), x.clone(), 4, Some(8));
        assert!(t.contains(&(0, 0)) && !t.contains(&(0, 1)) && t.contains(&(0, 2)));
        t.insert_lru((0, 3), x.clone(), 9, Some(8));
        assert!(!t.contains(&(0, 3)));
        let (y, n) = t.take_lru(&(0, 0)).unwrap();
        t.pinned.insert((0, 0), (y, n));
        assert_eq!(t.get((0, 0)).unwrap().1, Tier::Pinned);
        assert_eq!((t.lru_bytes(), t.lru_len()), (4, 1));
    }

    #[test]
    fn frequent_tier_keeps_the_most_used_and_admits_only_hotter_experts() {
        let x = tiny_expert();
        let count = |k: Key| [5u64, 1, 3, 3, 10, 2][k.1];
        let mut t = RamTiers::default();
        t.insert_frequent((0, 0), x.clone(), 4, 8, &count);
        t.insert_frequent((0, 1), x.clone(), 4, 8, &count);
        // Full: 2 (3 uses) displaces 1 (1 use), the coldest.
        t.insert_frequent((0, 2), x.clone(), 4, 8, &count);
        assert!(t.contains(&(0, 0)) && !t.contains(&(0, 1)) && t.contains(&(0, 2)));
        // 3 is not used more often than the coldest resident (2: 3 uses): not kept.
        t.insert_frequent((0, 3), x.clone(), 4, 8, &count);
        assert!(!t.contains(&(0, 3)) && t.contains(&(0, 2)));
        // A colder one needing room is refused even though a resident's bytes would do.
        t.insert_frequent((0, 5), x.clone(), 4, 8, &count);
        assert!(!t.contains(&(0, 5)));
        // 4 (10 uses, 8 bytes) needs both places and beats both residents.
        t.insert_frequent((0, 4), x.clone(), 8, 8, &count);
        assert_eq!((t.keys(), t.lru_bytes()), (vec![(0, 4)], 8));
        // Larger than the whole budget: not kept, nothing evicted.
        t.insert_frequent((1, 0), x.clone(), 9, 8, &|_| 100);
        assert_eq!(t.keys(), vec![(0, 4)]);
    }
}
