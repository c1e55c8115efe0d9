//! The connections' timers: one deadline heap per gateway and one task that
//! wakes each connection whose deadline came (its protocol machine's:
//! handshake, heartbeat, ACK retry; or its drain's), in the manner of the
//! hashed wheel timer Java mpush keeps for its heartbeats.
//!
//! A connection's task holds no timer of its own. A tokio `Sleep` is
//! 112 bytes of every idle connection's task, and the task made and dropped
//! one at each wake (two locked operations on tokio's timer wheel per push
//! delivered). Here a connection enters a deadline only when it is earlier
//! than the one it is armed for ([`ConnQueue::arm`]). A deadline that moved
//! later (a handshake done, a heartbeat read, the ACKs in flight answered)
//! is only noted in the connection's queue: when the armed entry comes, this
//! task re-enters it for the later deadline instead of waking the
//! connection ([`ConnQueue::fire`]), so a connection's task is woken only
//! when its deadline came, and holds one live entry. An entry a connection
//! has since armed earlier than is stale: it wakes nobody, and the heap is
//! compacted once stale entries outnumber the open connections, so it holds
//! at most about two entries per connection.
//!
//! Ticks are milliseconds since the timers were made; a deadline rounds up
//! to its tick, so no connection is woken before its deadline.
//!
//! [`ConnQueue::arm`]: crate::route::ConnQueue::arm
//! [`ConnQueue::fire`]: crate::route::ConnQueue::fire

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Entries are (tick, connection id), the earliest first.
type Heap = BinaryHeap<Reverse<(u64, u64)>>;

/// Entries a heap keeps room for however few it holds.
const MIN_ROOM: usize = 4096;

/// Gives back what a heap's peak (a storm, a mass disconnect) left unused:
/// once it holds less than a quarter of its room, it keeps twice what it
/// holds. The copy is paid at most once per halving, so entering and taking
/// entries stays amortized constant time.
fn trim(heap: &mut Heap) {
    if heap.capacity() > MIN_ROOM && heap.len() < heap.capacity() / 4 {
        heap.shrink_to((2 * heap.len()).max(MIN_ROOM));
    }
}

/// Connections woken per turn of the task: a deadline shared by many
/// connections (a storm's handshakes) is fired in turns that let the
/// worker's other tasks run between them.
pub(crate) const FIRE_BATCH: usize = 1024;

pub(crate) struct Timers {
    base: Instant,
    heap: Mutex<Heap>,
    /// Wakes the task when an entry comes before the one it sleeps for
    /// (and when the timers are dropped, to end it).
    notify: Arc<Notify>,
    started: AtomicBool,
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            heap: Mutex::new(BinaryHeap::new()),
            notify: Arc::new(Notify::new()),
            started: AtomicBool::new(false),
        }
    }
}

impl Drop for Timers {
    fn drop(&mut self) {
        // The task holds the gateway weakly: it wakes, finds it gone, ends.
        self.notify.notify_one();
    }
}

impl Timers {
    /// The tick of `t`, rounded up (a deadline is never early).
    pub(crate) fn tick_of(&self, t: Instant) -> u64 {
        let d = t.saturating_duration_since(self.base);
        let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
        u64::try_from(ms).unwrap_or(u64::MAX - 1)
    }

    /// The tick that has passed now (rounded down).
    pub(crate) fn now(&self) -> u64 {
        let ms = Instant::now()
            .saturating_duration_since(self.base)
            .as_millis();
        u64::try_from(ms).unwrap_or(u64::MAX - 1)
    }

    fn instant_of(&self, tick: u64) -> Instant {
        self.base + Duration::from_millis(tick)
    }

    /// Enters connection `conn`'s deadline `at` (armed in its queue first).
    pub(crate) fn add(&self, at: u64, conn: u64) {
        let first = {
            let mut heap = self.heap.lock();
            let first = heap.peek().is_none_or(|Reverse((next, _))| at < *next);
            heap.push(Reverse((at, conn)));
            first
        };
        if first {
            // A permit is kept if the task is not waiting yet: nothing lost.
            self.notify.notify_one();
        }
    }

    /// Enters the timers' own re-armed entries (see
    /// [`ConnQueue::fire`](crate::route::ConnQueue::fire)), under one lock;
    /// the earliest one's instant. The task calls it, so nobody is notified.
    pub(crate) fn add_all(&self, entries: &[(u64, u64)]) -> Option<Instant> {
        let first = entries.iter().map(|(at, _)| *at).min()?;
        let mut heap = self.heap.lock();
        heap.extend(entries.iter().map(|&e| Reverse(e)));
        Some(self.instant_of(first))
    }

    /// True once: the caller starts the task.
    pub(crate) fn start(&self) -> bool {
        !self.started.load(Ordering::Relaxed) && !self.started.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn notify(&self) -> Arc<Notify> {
        self.notify.clone()
    }

    /// Moves the entries due by tick `now` into `due`, at most
    /// [`FIRE_BATCH`]; the next entry's instant, if any (one that is due
    /// already when the batch is full).
    pub(crate) fn take_due(&self, now: u64, due: &mut Vec<(u64, u64)>) -> Option<Instant> {
        let mut heap = self.heap.lock();
        let mut next = None;
        while let Some(Reverse((at, conn))) = heap.peek().copied() {
            if at > now || due.len() >= FIRE_BATCH {
                next = Some(self.instant_of(at));
                break;
            }
            heap.pop();
            due.push((at, conn));
        }
        if !due.is_empty() {
            trim(&mut heap);
        }
        next
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.lock().len()
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.heap.lock().capacity()
    }

    /// Drops every entry `live` refuses. The heap is taken out meanwhile
    /// (connections enter theirs in a new one), so no connection waits on
    /// the lock for the walk.
    pub(crate) fn compact(&self, live: impl Fn(u64, u64) -> bool) {
        let old = std::mem::take(&mut *self.heap.lock());
        let kept: Vec<_> = old
            .into_vec()
            .into_iter()
            .filter(|Reverse((at, conn))| live(*at, *conn))
            .collect();
        let mut heap = self.heap.lock();
        let added = std::mem::take(&mut *heap);
        // `kept` reuses the old heap's allocation, peak and all.
        let mut merged = Heap::from(kept);
        merged.extend(added.into_vec());
        trim(&mut merged);
        *heap = merged;
        drop(heap);
        // The earliest entry may be another one now.
        self.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deadlines_round_up_and_come_out_in_order() {
        let t = Timers::default();
        let base = t.base;
        assert_eq!(t.tick_of(base), 0);
        assert_eq!(t.tick_of(base + Duration::from_micros(1)), 1);
        assert_eq!(t.tick_of(base + Duration::from_millis(7)), 7);
        assert_eq!(t.tick_of(base - Duration::from_millis(1)), 0);
        t.add(30, 3);
        t.add(10, 1);
        t.add(20, 2);
        let mut due = Vec::new();
        let next = t.take_due(20, &mut due);
        assert_eq!(due, vec![(10, 1), (20, 2)]);
        assert_eq!(next, Some(base + Duration::from_millis(30)));
        due.clear();
        assert_eq!(t.take_due(40, &mut due), None);
        assert_eq!(due, vec![(30, 3)]);
        // Many due at once come out in batches.
        for conn in 0..(FIRE_BATCH as u64 + 5) {
            t.add(50, conn);
        }
        due.clear();
        assert_eq!(
            t.take_due(60, &mut due),
            Some(base + Duration::from_millis(50))
        );
        assert_eq!(due.len(), FIRE_BATCH);
        due.clear();
        assert_eq!(t.take_due(60, &mut due), None);
        assert_eq!(due.len(), 5);
    }

    #[tokio::test]
    async fn compaction_keeps_only_live_entries_and_those_added_meanwhile() {
        let t = Timers::default();
        for conn in 0..100 {
            t.add(1_000 + conn, conn);
        }
        t.compact(|_, conn| conn % 10 == 0);
        assert_eq!(t.len(), 10);
        let mut due = Vec::new();
        t.take_due(u64::MAX - 1, &mut due);
        assert_eq!(due.len(), 10);
        assert!(due.windows(2).all(|w| w[0] < w[1]), "in order: {due:?}");
    }

    /// A storm's peak is given back: when its entries have fired, or when
    /// its connections closed and compaction dropped theirs.
    #[tokio::test]
    async fn the_heap_gives_back_the_room_a_peak_took() {
        let peak = 100 * FIRE_BATCH as u64;
        let t = Timers::default();
        for conn in 0..peak {
            t.add(10, conn);
        }
        assert!(t.capacity() >= peak as usize);
        let mut due = Vec::new();
        while t.take_due(10, &mut due).is_some() {
            due.clear();
        }
        assert_eq!(t.len(), 0);
        assert!(t.capacity() <= MIN_ROOM, "after firing: {}", t.capacity());

        // Also while later entries stay (the connections that remain).
        for conn in 0..peak {
            t.add(if conn < 100 { 1_000 } else { 15 }, conn);
        }
        due.clear();
        while t.take_due(15, &mut due).is_some_and(|_| !due.is_empty()) {
            due.clear();
        }
        assert_eq!(t.len(), 100);
        assert!(
            t.capacity() <= MIN_ROOM,
            "with entries left: {}",
            t.capacity()
        );
        due.clear();
        t.take_due(1_000, &mut due);

        for conn in 0..peak {
            t.add(20, conn);
        }
        t.compact(|_, conn| conn < 100);
        assert_eq!(t.len(), 100);
        assert!(
            t.capacity() <= MIN_ROOM,
            "after compaction: {}",
            t.capacity()
        );
        // What is left still fires, in order.
        due.clear();
        assert_eq!(t.take_due(20, &mut due), None);
        assert_eq!(due, (0..100).map(|c| (20, c)).collect::<Vec<_>>());
    }
}
