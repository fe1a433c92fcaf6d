//! A least-recently-used map with a byte count: the RAM tier of the expert cache
//! ([`super::ram_tiers`]) and the GPU expert pool (`gpu::pool`) keep their experts in one.
//! It keeps the order of use and the bytes; the caller decides when to evict.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

pub struct Lru<K, V> {
    /// key -> (value, bytes, tick of last use)
    entries: HashMap<K, (V, u64, u64)>,
    /// tick of last use -> key
    order: BTreeMap<u64, K>,
    bytes: u64,
    tick: u64,
}

impl<K, V> Default for Lru<K, V> {
    fn default() -> Self {
        Lru { entries: HashMap::new(), order: BTreeMap::new(), bytes: 0, tick: 0 }
    }
}

impl<K: Copy + Eq + Hash, V: Clone> Lru<K, V> {
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of every entry together.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.entries.keys()
    }

    /// Bytes of `key`'s entry (0 if absent).
    pub fn size(&self, key: &K) -> u64 {
        self.entries.get(key).map_or(0, |e| e.1)
    }

    /// The value of `key`, marked as just used.
    pub fn get(&mut self, key: &K) -> Option<V> {
        let (v, _, last) = self.entries.get_mut(key)?;
        self.order.remove(last);
        self.tick += 1;
        *last = self.tick;
        self.order.insert(self.tick, *key);
        Some(v.clone())
    }

    /// Adds `key` as just used (replacing an entry of the same key).
    pub fn insert(&mut self, key: K, v: V, bytes: u64) {
        self.remove(&key);
        self.tick += 1;
        self.order.insert(self.tick, key);
        self.entries.insert(key, (v, bytes, self.tick));
        self.bytes += bytes;
    }

    /// Takes `key` out: its value and bytes.
    pub fn remove(&mut self, key: &K) -> Option<(V, u64)> {
        let (v, n, t) = self.entries.remove(key)?;
        self.order.remove(&t);
        self.bytes -= n;
        Some((v, n))
    }

    /// Takes the least recently used entry out.
    pub fn pop_oldest(&mut self) -> Option<(K, V, u64)> {
        let (_, key) = self.order.pop_first()?;
        let (v, n, _) = self.entries.remove(&key)?;
        self.bytes -= n;
        Some((key, v, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_first_and_use_refreshes() {
        let mut l: Lru<u32, &str> = Lru::default();
        l.insert(1, "a", 4);
        l.insert(2, "b", 5);
        l.insert(3, "c", 6);
        assert_eq!((l.len(), l.bytes()), (3, 15));
        assert_eq!(l.get(&1), Some("a"));
        assert_eq!(l.pop_oldest(), Some((2, "b", 5)));
        assert_eq!(l.remove(&3), Some(("c", 6)));
        l.insert(1, "a2", 7);
        assert_eq!((l.len(), l.bytes()), (1, 7));
        assert_eq!(l.pop_oldest(), Some((1, "a2", 7)));
        assert!(l.pop_oldest().is_none() && l.is_empty() && l.bytes() == 0);
    }
}
