//! A bounded window of recently seen ids: the oldest id is forgotten when the
//! window is full, so memory stays fixed however long a session lives.

use std::collections::{HashSet, VecDeque};

#[derive(Debug, Clone)]
pub struct DedupWindow {
    capacity: usize,
    order: VecDeque<u64>,
    seen: HashSet<u64>,
}

impl Default for DedupWindow {
    fn default() -> Self {
        Self::new(1024)
    }
}

impl DedupWindow {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            order: VecDeque::new(),
            seen: HashSet::new(),
        }
    }

    /// Records `id`; true if it was not in the window (first sighting).
    pub fn insert(&mut self, id: u64) -> bool {
        if !self.seen.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > self.capacity
            && let Some(old) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        true
    }

    pub fn contains(&self, id: u64) -> bool {
        self.seen.contains(&id)
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_caught_and_old_ids_expire() {
        let mut w = DedupWindow::new(3);
        assert!(w.insert(1));
        assert!(!w.insert(1));
        assert!(w.insert(2));
        assert!(w.insert(3));
        assert!(w.insert(4)); // evicts 1
        assert_eq!(w.len(), 3);
        assert!(!w.contains(1));
        assert!(w.insert(1));
        assert!(!w.insert(4));
    }
}
