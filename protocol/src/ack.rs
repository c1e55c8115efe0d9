//! In-flight tracking with retry deadlines: what the server uses for pushes that
//! wait for an ACK, and the client for requests that wait for an answer.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use web_time::Instant;

/// When to retry and when to give up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// How long to wait after each attempt; the last value repeats for later
    /// attempts. Default: 2 s, 4 s, 6 s.
    pub waits: Vec<Duration>,
    /// Resends after the first attempt. Default: 3.
    pub retries: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            waits: vec![
                Duration::from_secs(2),
                Duration::from_secs(4),
                Duration::from_secs(6),
            ],
            retries: 3,
        }
    }
}

impl RetryPolicy {
    /// A policy with one timeout and no retries.
    pub fn once(wait: Duration) -> Self {
        Self {
            waits: vec![wait],
            retries: 0,
        }
    }

    pub(crate) fn wait_after(&self, attempt: u32) -> Duration {
        let i = (attempt as usize).min(self.waits.len().saturating_sub(1));
        self.waits.get(i).copied().unwrap_or(Duration::from_secs(2))
    }
}

/// What a deadline that passed asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Send again; this is retry number `attempt` (1-based).
    Retry { attempt: u32 },
    /// No retries left: the entry is removed.
    GaveUp,
}

#[derive(Debug, Clone)]
struct Entry {
    attempt: u32,
    deadline: Instant,
    /// Overrides the policy's waits for this key.
    wait: Option<Duration>,
}

/// Tracks in-flight keys and their retry deadlines.
#[derive(Debug, Clone)]
pub struct AckTracker<K> {
    policy: RetryPolicy,
    inflight: HashMap<K, Entry>,
}

impl<K: Eq + Hash + Clone> AckTracker<K> {
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            inflight: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.inflight.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inflight.is_empty()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.inflight.contains_key(key)
    }

    /// Starts tracking `key`, sent at `now`.
    pub fn insert(&mut self, key: K, now: Instant) {
        self.insert_with_wait(key, now, None);
    }

    /// Like `insert`, but every attempt of this key waits `wait` when given
    /// (the policy's number of retries still applies).
    pub fn insert_with_wait(&mut self, key: K, now: Instant, wait: Option<Duration>) {
        let deadline = now + wait.unwrap_or_else(|| self.policy.wait_after(0));
        self.inflight.insert(
            key,
            Entry {
                attempt: 0,
                deadline,
                wait,
            },
        );
    }

    /// Stops tracking `key`; true if it was in flight.
    pub fn ack(&mut self, key: &K) -> bool {
        self.inflight.remove(key).is_some()
    }

    /// The earliest deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.inflight.values().map(|e| e.deadline).min()
    }

    /// Every key whose deadline passed, with what to do about it. Retried keys
    /// get their next deadline; keys that gave up are removed.
    pub fn expire(&mut self, now: Instant) -> Vec<(K, Expiry)> {
        let mut out = Vec::new();
        let policy = &self.policy;
        self.inflight.retain(|k, e| {
            if e.deadline > now {
                return true;
            }
            if e.attempt < policy.retries {
                e.attempt += 1;
                e.deadline = now + e.wait.unwrap_or_else(|| policy.wait_after(e.attempt));
                out.push((k.clone(), Expiry::Retry { attempt: e.attempt }));
                true
            } else {
                out.push((k.clone(), Expiry::GaveUp));
                false
            }
        });
        out
    }

    /// Removes and returns every key (e.g. when the connection closes).
    pub fn drain(&mut self) -> Vec<K> {
        self.inflight.drain().map(|(k, _)| k).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_retries_at_2_4_6_then_gives_up() {
        let t0 = Instant::now();
        let mut t = AckTracker::new(RetryPolicy::default());
        t.insert(1u64, t0);
        let s = Duration::from_secs;
        assert_eq!(t.next_deadline(), Some(t0 + s(2)));
        assert!(t.expire(t0 + s(1)).is_empty());
        assert_eq!(t.expire(t0 + s(2)), vec![(1, Expiry::Retry { attempt: 1 })]);
        assert_eq!(t.next_deadline(), Some(t0 + s(6)));
        assert_eq!(t.expire(t0 + s(6)), vec![(1, Expiry::Retry { attempt: 2 })]);
        assert_eq!(t.next_deadline(), Some(t0 + s(12)));
        assert_eq!(
            t.expire(t0 + s(12)),
            vec![(1, Expiry::Retry { attempt: 3 })]
        );
        assert_eq!(t.next_deadline(), Some(t0 + s(18)));
        assert_eq!(t.expire(t0 + s(18)), vec![(1, Expiry::GaveUp)]);
        assert!(t.is_empty());
    }

    #[test]
    fn a_per_key_wait_overrides_the_policy() {
        let t0 = Instant::now();
        let mut t = AckTracker::new(RetryPolicy::default());
        t.insert_with_wait(1u64, t0, Some(Duration::from_millis(500)));
        let ms = Duration::from_millis;
        assert_eq!(t.next_deadline(), Some(t0 + ms(500)));
        assert_eq!(
            t.expire(t0 + ms(500)),
            vec![(1, Expiry::Retry { attempt: 1 })]
        );
        assert_eq!(t.next_deadline(), Some(t0 + ms(1000)));
    }

    #[test]
    fn ack_stops_tracking() {
        let t0 = Instant::now();
        let mut t = AckTracker::new(RetryPolicy::default());
        t.insert(7u64, t0);
        assert!(t.ack(&7));
        assert!(!t.ack(&7));
        assert!(t.expire(t0 + Duration::from_secs(100)).is_empty());
    }
}
