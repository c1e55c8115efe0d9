//! A bounded window of recently seen ids: the oldest id is forgotten when the
//! window is full, so memory stays fixed however long a session lives. It also
//! remembers which of them the app acknowledged, so that a retried copy of a
//! message is confirmed again, even after a reconnect.

use std::collections::{HashSet, VecDeque};

#[derive(Debug, Clone)]
pub struct DedupWindow {
    capacity: usize,
    order: VecDeque<u64>,
    seen: HashSet<u64>,
    acked: HashSet<u64>,
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
            acked: HashSet::new(),
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
            self.acked.remove(&old);
        }
        true
    }

    /// Records that the app acknowledged `id` (ignored when `id` is not in the window).
    pub fn mark_acked(&mut self, id: u64) {
        if self.seen.contains(&id) {
            self.acked.insert(id);
        }
    }

    pub fn is_acked(&self, id: u64) -> bool {
        self.acked.contains(&id)
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
        w.mark_acked(4);
        w.mark_acked(99);
        assert!(w.is_acked(4) && !w.is_acked(99));
        for id in 10..13 {
            w.insert(id);
        }
        assert!(!w.is_acked(4), "forgotten with the id");
    }
}
