//! Pushes awaiting their ACK on one server connection. Each is one record:
//! the push itself (what a retry re-encodes, what the driver gets back when
//! it settles), its packet id (legacy ACKs name it) and its retry deadline.
//! Shared by the binary and the JSON server machines.

use std::collections::{HashMap, VecDeque};

use web_time::Instant;

use super::{OutboundPush, PushError, ServerEvent};
use crate::ack::RetryPolicy;

#[derive(Debug)]
struct InFlight {
    push: OutboundPush,
    packet_id: i32,
    attempt: u32,
    deadline: Instant,
}

/// The pushes of one connection that wait for an ACK. The tables exist only
/// while something is in flight: an idle connection holds one pointer.
#[derive(Debug, Default)]
pub(crate) struct PendingPushes {
    max: usize,
    tables: Option<Box<Tables>>,
}

#[derive(Debug, Default)]
struct Tables {
    sent: HashMap<u64, InFlight>,
    by_packet: HashMap<i32, u64>,
}

impl PendingPushes {
    pub fn new(max: usize) -> Self {
        Self { max, tables: None }
    }

    pub fn len(&self) -> usize {
        self.tables.as_ref().map_or(0, |t| t.sent.len())
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.tables
            .as_ref()
            .and_then(|t| t.sent.values().map(|e| e.deadline).min())
    }

    /// Whether one more tracked push may go out now.
    pub fn admit(&self, message_id: u64) -> Result<(), PushError> {
        let Some(t) = &self.tables else {
            return Ok(());
        };
        if t.sent.contains_key(&message_id) {
            return Err(PushError::Duplicate(message_id));
        }
        if t.sent.len() >= self.max {
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
        let t = self.tables.get_or_insert_with(Box::default);
        t.by_packet.insert(packet_id, push.message_id);
        t.sent.insert(
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
        self.tables.as_ref()?.by_packet.get(&packet_id).copied()
    }

    /// Confirms a message: its record, if it was pending.
    pub fn ack(&mut self, message_id: u64) -> Option<OutboundPush> {
        let t = self.tables.as_mut()?;
        let e = t.sent.remove(&message_id)?;
        t.by_packet.remove(&e.packet_id);
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
        let Some(t) = self.tables.as_mut() else {
            return resend;
        };
        for (id, e) in &mut t.sent {
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
            if let Some(e) = t.sent.remove(&id) {
                t.by_packet.remove(&e.packet_id);
                events.push_back(ServerEvent::PushTimedOut { push: e.push });
            }
        }
        self.shrink();
        resend
    }

    /// Every pending push, in message id order; nothing is pending afterwards.
    pub fn drain(&mut self) -> Vec<OutboundPush> {
        let Some(t) = self.tables.take() else {
            return Vec::new();
        };
        let mut all: Vec<OutboundPush> = t.sent.into_values().map(|e| e.push).collect();
        all.sort_unstable_by_key(|p| p.message_id);
        all
    }

    /// An idle connection holds no table memory.
    fn shrink(&mut self) {
        if self.tables.as_ref().is_some_and(|t| t.sent.is_empty()) {
            self.tables = None;
        }
    }
}
