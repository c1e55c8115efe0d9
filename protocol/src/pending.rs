//! Pushes awaiting their ACK on one server connection: retry deadlines, what
//! to resend, and the packet id → message id map that legacy ACKs need. Shared
//! by the binary and the JSON server machines.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use web_time::Instant;

use crate::ack::{AckTracker, Expiry, RetryPolicy};
use crate::server::{PushError, ServerEvent};

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

    /// Handles the deadlines that passed: reports `PushRetried` and
    /// `PushTimedOut` in `events`, and returns (packet id, payload) of every
    /// push the caller must send again.
    pub fn expire(&mut self, now: Instant, events: &mut VecDeque<ServerEvent>) -> Vec<(i32, P)> {
        let mut resend = Vec::new();
        for (id, expiry) in self.acks.expire(now) {
            match expiry {
                Expiry::Retry { attempt } => {
                    if let Some(p) = self.sent.get(&id) {
                        resend.push(p.clone());
                        events.push_back(ServerEvent::PushRetried {
                            message_id: id,
                            attempt,
                        });
                    }
                }
                Expiry::GaveUp => {
                    self.forget(id);
                    events.push_back(ServerEvent::PushTimedOut { message_id: id });
                }
            }
        }
        resend
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
