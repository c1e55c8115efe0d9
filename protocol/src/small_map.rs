//! A map for the few entries a client keeps by id (requests awaiting an
//! answer, messages awaiting the app's ACK): a `Vec` of pairs in insertion
//! order, searched linearly.
//!
//! Each of these holds at most about a thousand entries, usually a handful,
//! where a scan is as fast as hashing; and it costs the browser module no hash
//! table code (a `HashMap` per key type is kilobytes of wasm). Iteration
//! follows insertion, so what is drained from it comes out in the order it
//! went in, without sorting.

/// Pairs in insertion order; at most one per key.
#[derive(Debug, Clone)]
pub struct SmallMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<K: PartialEq, V> SmallMap<K, V> {
    pub const fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    fn position(&self, key: &K) -> Option<usize> {
        self.entries.iter().position(|(k, _)| k == key)
    }

    /// Sets `key` to `value`: in place if present (keeping its position),
    /// else at the end. Returns the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.position(&key) {
            Some(i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            None => {
                self.entries.push((key, value));
                None
            }
        }
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.position(key).map(|i| &self.entries[i].1)
    }

    /// Removes `key`, keeping the others in order.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.position(key).map(|i| self.entries.remove(i).1)
    }

    /// Removes the oldest entry.
    pub fn pop_first(&mut self) -> Option<(K, V)> {
        (!self.entries.is_empty()).then(|| self.entries.remove(0))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.entries.retain_mut(|(k, v)| keep(k, v));
    }

    /// Every entry, in insertion order, leaving the map empty.
    pub fn drain(&mut self) -> impl DoubleEndedIterator<Item = (K, V)> + '_ {
        self.entries.drain(..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_one_entry_per_key_in_insertion_order() {
        let mut m = SmallMap::new();
        assert_eq!(m.insert(3, "c"), None);
        assert_eq!(m.insert(1, "a"), None);
        assert_eq!(m.insert(2, "b"), None);
        assert_eq!(m.insert(1, "A"), Some("a"), "replaced in place");
        assert_eq!(m.len(), 3);
        assert_eq!(m.get(&1), Some(&"A"));
        assert_eq!(m.get(&9), None);
        assert_eq!(m.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [3, 1, 2]);
        assert_eq!(m.remove(&1), Some("A"));
        assert_eq!(m.remove(&1), None);
        assert_eq!(m.values().copied().collect::<Vec<_>>(), ["c", "b"]);
        m.insert(7, "g");
        assert_eq!(m.pop_first(), Some((3, "c")));
        m.retain(|k, _| *k != 7);
        assert_eq!(m.drain().collect::<Vec<_>>(), [(2, "b")]);
        assert!(m.is_empty() && m.pop_first().is_none());
        m.insert(5, "e");
        m.clear();
        assert!(m.is_empty());
    }
}
