//! Pushes awaiting their ACK on one server connection. Each is one record:
//! the push itself (what a retry re-encodes, what the driver gets back when
//! it settles), its packet id (legacy ACKs name it) and its retry deadline.
//! Shared by the binary and the JSON server machines.

use std::collections::{HashMap, VecDeque};

use web_time::Instant;

use crate::ack::RetryPolicy;
use crate::server::{OutboundPush, PushError, ServerEvent};

#[derive(Debug)]
struct InFlight {
    push: OutboundPush,
    packet_id: i32,
    attempt: u32,
    deadline: Instant,
}

/// The pushes of one connection that wait for an ACK.
#[derive(Debug, Default)]
pub(crate) struct PendingPushes {
    max: usize,
    sent: HashMap<u64, InFlight>,
    by_packet: HashMap<i32, u64>,
}

impl PendingPushes {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            sent: HashMap::new(),
            by_packet: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.sent.len()
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.sent.values().map(|e| e.deadline).min()
    }

    /// Whether one more tracked push may go out now.
    pub fn admit(&self, message_id: u64) -> Result<(), PushError> {
        if self.sent.contains_key(&message_id) {
            return Err(PushError::Duplicate(message_id));
        }
        if self.sent.len() >= self.max {
            return Err(PushError::Busy);
        }
        Ok(())
    }

    pub fn track(
        &mut self,
        push: OutboundPush,
        packet_id: i32,
        now: Instant,
        policy: &RetryPolicy,
    ) {
        let deadline = now + push.ack_timeout.unwrap_or_else(|| policy.wait_after(0));
        self.by_packet.insert(packet_id, push.message_id);
        self.sent.insert(
            push.message_id,
            InFlight {
                push,
                packet_id,
                attempt: 0,
                deadline,
            },
        );
    }

    /// The message a legacy ACK (by packet id) confirms.
    pub fn message_for_packet(&self, packet_id: i32) -> Option<u64> {
        self.by_packet.get(&packet_id).copied()
    }

    /// Confirms a message: its record, if it was pending.
    pub fn ack(&mut self, message_id: u64) -> Option<OutboundPush> {
        let e = self.sent.remove(&message_id)?;
        self.by_packet.remove(&e.packet_id);
        self.shrink();
        Some(e.push)
    }

    /// Handles the deadlines that passed: reports `PushRetried` and
    /// `PushTimedOut` in `events`, and returns (packet id, push) of every
    /// push the caller must send again.
    pub fn expire(
        &mut self,
        now: Instant,
        policy: &RetryPolicy,
        events: &mut VecDeque<ServerEvent>,
    ) -> Vec<(i32, OutboundPush)> {
        let mut resend = Vec::new();
        let mut gave_up = Vec::new();
        for (id, e) in &mut self.sent {
            if e.deadline > now {
                continue;
            }
            if e.attempt < policy.retries {
                e.attempt += 1;
                e.deadline = now
                    + e.push
                        .ack_timeout
                        .unwrap_or_else(|| policy.wait_after(e.attempt));
                resend.push((e.packet_id, e.push.clone()));
                events.push_back(ServerEvent::PushRetried {
                    message_id: *id,
                    trace_id: e.push.trace_id.clone(),
                    attempt: e.attempt,
                });
            } else {
                gave_up.push(*id);
            }
        }
        gave_up.sort_unstable();
        for id in gave_up {
            if let Some(e) = self.sent.remove(&id) {
                self.by_packet.remove(&e.packet_id);
                events.push_back(ServerEvent::PushTimedOut { push: e.push });
            }
        }
        self.shrink();
        resend
    }

    /// Every pending push, in message id order; nothing is pending afterwards.
    pub fn drain(&mut self) -> Vec<OutboundPush> {
        let mut all: Vec<OutboundPush> = std::mem::take(&mut self.sent)
            .into_values()
            .map(|e| e.push)
            .collect();
        all.sort_unstable_by_key(|p| p.message_id);
        self.by_packet = HashMap::new();
        all
    }

    /// An idle connection holds no table memory.
    fn shrink(&mut self) {
        if self.sent.is_empty() && self.sent.capacity() > 0 {
            self.sent = HashMap::new();
            self.by_packet = HashMap::new();
        }
    }
}
