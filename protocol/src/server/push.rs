//! Pushes to the client and their ACKs (retries live in `PendingPushes`),
//! and the server's own messages: kick and redirect.

use web_time::Instant;

use super::{OutboundPush, PushError, ServerConnection, ServerEvent, State};
use crate::error::ProtocolError;
use crate::message::{Ack, Body, Kick, Redirect, v2};
use crate::packet::{Command, Flags, Packet};
use crate::session::{AckMode, Profile};

impl ServerConnection {
    /// Sends a push; with an ACK mode it is retried until acknowledged.
    /// Returns the packet id it went out under.
    pub fn push(&mut self, push: OutboundPush, now: Instant) -> Result<i32, PushError> {
        match self.state {
            State::Established => {}
            State::Closed => return Err(PushError::Closed),
            _ => return Err(PushError::NotReady),
        }
        let tracked = push.ack_mode != AckMode::None;
        if tracked {
            self.pending.admit(push.message_id)?;
        }
        let packet_id = self.next_push_id();
        self.send_push(&push, packet_id);
        if tracked {
            let policy = &self.config.ack_retry;
            self.pending.track(push, packet_id, now, policy);
        }
        Ok(packet_id)
    }

    /// Seals one push (its first attempt or a retry: a retry is the same
    /// packet, sealed again).
    pub(super) fn send_push(&mut self, push: &OutboundPush, packet_id: i32) {
        let flags = push.ack_mode.flags();
        match self.profile {
            Profile::Legacy => {
                self.send_sealed(Command::PUSH, packet_id, flags, &push.content);
            }
            Profile::V2 => {
                let body = prost::Message::encode_to_vec(&v2::PushEnvelope {
                    message_id: push.message_id,
                    trace_id: push.trace_id.to_string(),
                    content: push.content.to_vec(),
                    ack_mode: push.ack_mode.to_v2(),
                    expires_at_ms: push.expires_at_ms,
                });
                self.send_sealed(Command::PUSH, packet_id, flags, &body);
            }
        }
    }

    pub(super) fn on_ack(&mut self, p: &Packet) -> Result<(), ProtocolError> {
        let mut ids: Vec<u64> = match self.profile {
            Profile::V2 if self.is_established() => Ack::from_bytes(&self.open(p)?)?.message_ids,
            Profile::V2 | Profile::Legacy => Vec::new(),
        };
        if ids.is_empty() {
            // Legacy ACKs (and bare v2 ones) name the push by its packet id.
            ids.extend(self.pending.message_for_packet(p.session_id));
        }
        for id in ids {
            if let Some(push) = self.pending.ack(id) {
                self.events.push_back(ServerEvent::Acked { push });
            }
        }
        Ok(())
    }

    /// Tells the client another device took its place (mpush 0.8.1 does not
    /// close the connection; the driver may).
    pub fn kick(&mut self, device_id: &str, user_id: &str) {
        // A kicked connection's binding is not restored by its next fast
        // connect (ADR 0008), and none is kept on it from now on.
        if let Some(session_id) = self.kept_session() {
            self.kept_session = [0; 16];
            self.events
                .push_back(ServerEvent::ForgetBinding { session_id });
        }
        if self.is_established() {
            let body = Kick {
                device_id: device_id.to_owned(),
                user_id: user_id.to_owned(),
            }
            .to_bytes();
            self.send_sealed(Command::KICK, 0, Flags::NONE, &body);
        }
    }

    /// Asks a v2 client to reconnect elsewhere; false (nothing sent) for legacy
    /// clients, which only learn by the connection closing.
    pub fn redirect(&mut self, redirect: &Redirect) -> bool {
        if !self.is_established() || self.profile != Profile::V2 {
            return false;
        }
        self.send_sealed(Command::REDIRECT, 0, Flags::NONE, &redirect.to_bytes());
        true
    }
}
