//! When a server connection is dead: no handshake by its deadline, or silent
//! for more heartbeat intervals than allowed. Shared by the binary and the
//! JSON machine, so both close idle and unauthenticated peers the same way.

use std::time::Duration;

use web_time::Instant;

/// What a check at `poll_timeout` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// Nothing to do.
    Alive,
    /// An interval passed in silence (the JSON machine pings then).
    Missed,
    /// Silent for too many intervals.
    Dead,
    /// No handshake by the deadline.
    HandshakeTimeout,
}

#[derive(Debug)]
pub(crate) struct Liveness {
    handshake_deadline: Option<Instant>,
    interval: Duration,
    /// How late a read may be within an interval before it counts as missed.
    slack: Duration,
    last_read: Instant,
    next_check: Instant,
    misses: u32,
    max_misses: u32,
}

impl Liveness {
    pub(crate) fn new(
        now: Instant,
        handshake_timeout: Duration,
        interval: Duration,
        slack: Duration,
        max_misses: u32,
    ) -> Self {
        Self {
            handshake_deadline: Some(now + handshake_timeout),
            interval,
            slack,
            last_read: now,
            next_check: now + interval,
            misses: 0,
            max_misses,
        }
    }

    /// Bytes (or a frame) arrived.
    pub(crate) fn heard(&mut self, now: Instant) {
        self.last_read = now;
        self.misses = 0;
    }

    /// The handshake completed: its deadline no longer applies.
    pub(crate) fn established(&mut self) {
        self.handshake_deadline = None;
    }

    /// A new interval (the negotiated heartbeat), counted from `now`.
    pub(crate) fn set_interval(&mut self, interval: Duration, now: Instant) {
        self.interval = interval;
        self.next_check = now + interval;
        self.misses = 0;
    }

    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    /// The earliest of the next check, the handshake deadline and `other`.
    pub(crate) fn next(&self, other: Option<Instant>) -> Instant {
        [other, self.handshake_deadline]
            .into_iter()
            .flatten()
            .fold(self.next_check, Instant::min)
    }

    pub(crate) fn check(&mut self, now: Instant) -> Check {
        if self.handshake_deadline.is_some_and(|d| now >= d) {
            return Check::HandshakeTimeout;
        }
        if now < self.next_check {
            return Check::Alive;
        }
        self.next_check = now + self.interval;
        if now.saturating_duration_since(self.last_read) < self.interval + self.slack {
            return Check::Alive;
        }
        self.misses += 1;
        if self.misses > self.max_misses {
            Check::Dead
        } else {
            Check::Missed
        }
    }
}
