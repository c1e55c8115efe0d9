//! Pushes awaiting their ACK on one server connection: retry deadlines, what
//! to resend, and the packet id → message id map that legacy ACKs need. Shared
//! by the binary and the JSON server machines.

use std::collections::HashMap;
use std::time::Duration;

use web_time::Instant;

use crate::ack::{AckTracker, Expiry, RetryPolicy};
use crate::server::PushError;

/// A deadline that passed: the message, what to do, and for a retry the
/// packet id and what to resend.
pub(crate) type Expired<P> = (u64, Expiry, Option<(i32, P)>);

/// The pushes of one connection that wait for an ACK; `P` is what a retry resends.
#[derive(Debug)]
pub(crate) struct PendingPushes<P> {
    acks: AckTracker<u64>,
    max: usize,
    sent: HashMap<u64, (i32, P)>,
    by_packet: HashMap<i32, u64>,
}

impl<P: Clone> PendingPushes<P> {
    pub fn new(policy: RetryPolicy, max: usize) -> Self {
        Self {
            acks: AckTracker::new(policy),
            max,
            sent: HashMap::new(),
            by_packet: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.acks.len()
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.acks.next_deadline()
    }

    /// Whether one more tracked push may go out now.
    pub fn admit(&self, message_id: u64) -> Result<(), PushError> {
        if self.acks.contains(&message_id) {
            return Err(PushError::Duplicate(message_id));
        }
        if self.acks.len() >= self.max {
            return Err(PushError::Busy);
        }
        Ok(())
    }

    pub fn track(
        &mut self,
        message_id: u64,
        packet_id: i32,
        resend: P,
        now: Instant,
        wait: Option<Duration>,
    ) {
        self.acks.insert_with_wait(message_id, now, wait);
        self.by_packet.insert(packet_id, message_id);
        self.sent.insert(message_id, (packet_id, resend));
    }

    /// The message a legacy ACK (by packet id) confirms.
    pub fn message_for_packet(&self, packet_id: i32) -> Option<u64> {
        self.by_packet.get(&packet_id).copied()
    }

    /// Confirms a message; true if it was pending.
    pub fn ack(&mut self, message_id: u64) -> bool {
        if !self.acks.ack(&message_id) {
            return false;
        }
        self.forget(message_id);
        true
    }

    /// Deadlines that passed: a retry comes with the packet id and what to resend.
    pub fn expire(&mut self, now: Instant) -> Vec<Expired<P>> {
        let mut out = Vec::new();
        for (id, expiry) in self.acks.expire(now) {
            match expiry {
                Expiry::Retry { .. } => out.push((id, expiry, self.sent.get(&id).cloned())),
                Expiry::GaveUp => {
                    self.forget(id);
                    out.push((id, expiry, None));
                }
            }
        }
        out
    }

    /// Every pending message id, in order; nothing is pending afterwards.
    pub fn drain(&mut self) -> Vec<u64> {
        let mut ids = self.acks.drain();
        ids.sort_unstable();
        self.sent.clear();
        self.by_packet.clear();
        ids
    }

    fn forget(&mut self, id: u64) {
        if let Some((packet_id, _)) = self.sent.remove(&id) {
            self.by_packet.remove(&packet_id);
        }
    }
}
