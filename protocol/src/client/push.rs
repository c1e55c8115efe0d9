//! Pushes from the server: opened, deduplicated (a retransmission is
//! acknowledged again, not delivered twice), and acknowledged when the app
//! says so (AUTO at once, BIZ by `ack`), ACKs batched per flush.

use bytes::Bytes;
use web_time::Instant;

use super::{AckToken, ClientConnection, ClientError, ClientEvent, IncomingPush};
use crate::dedup::DedupWindow;
use crate::error::{DecodeError, ProtocolError};
use crate::message::{Ack, Body, v2};
use crate::packet::{Command, Flags, Frame, Packet};
use crate::session::{AckMode, Profile};

impl ClientConnection {
    /// Acknowledges a BIZ message (queued and sent at once).
    pub fn ack(&mut self, token: AckToken, now: Instant) -> Result<(), ClientError> {
        self.ready()?;
        self.window(&token).mark_acked(token.dedup_key());
        self.acks_out.push(token);
        self.flush_acks(now);
        Ok(())
    }

    pub(super) fn on_push(&mut self, p: &Packet) -> Result<(), ProtocolError> {
        if !self.is_established() {
            return Err(ProtocolError::State("push before handshake"));
        }
        let body = self.open(p)?;
        let msg = match self.profile {
            Profile::Legacy => {
                let ack_mode = AckMode::from_flags(p.flags);
                IncomingPush {
                    content: body,
                    message_id: None,
                    trace_id: String::new(),
                    ack_mode,
                    ack: None,
                    expires_at_ms: 0,
                }
            }
            Profile::V2 => {
                let env: v2::PushEnvelope = prost::Message::decode(body)
                    .map_err(|e| DecodeError::Protobuf(e.to_string()))?;
                IncomingPush {
                    content: env.content.into(),
                    message_id: Some(env.message_id),
                    trace_id: env.trace_id,
                    ack_mode: AckMode::from_v2(env.ack_mode),
                    ack: None,
                    expires_at_ms: env.expires_at_ms,
                }
            }
        };
        let token = AckToken {
            packet_id: p.session_id,
            message_id: msg.message_id,
        };
        let fresh = match msg.message_id {
            Some(id) => self.dedup.insert(id),
            None => self.legacy_dedup.insert(token.dedup_key()),
        };
        let expired = msg.expires_at_ms != 0
            && i64::try_from(msg.expires_at_ms).unwrap_or(i64::MAX) <= self.unix_ms(self.last_read);
        if !fresh || expired {
            // Already delivered (the server retried because our ACK was lost),
            // or too old to show: confirm again so the server stops retrying,
            // unless it is a BIZ message the app has not acknowledged yet.
            let confirm = match msg.ack_mode {
                AckMode::None => false,
                AckMode::Auto => true,
                AckMode::Biz => expired || self.window(&token).is_acked(token.dedup_key()),
            };
            if confirm {
                self.acks_out.push(token);
            }
            return Ok(());
        }
        match msg.ack_mode {
            AckMode::Auto => self.acks_out.push(token),
            AckMode::Biz | AckMode::None => {}
        }
        let ack = (msg.ack_mode == AckMode::Biz).then_some(token);
        self.events
            .push_back(ClientEvent::Message(IncomingPush { ack, ..msg }));
        Ok(())
    }

    /// v2 ids live in the window carried across connections; legacy packet
    /// ids only mean something on this connection.
    pub(super) fn window(&mut self, token: &AckToken) -> &mut DedupWindow {
        if token.message_id.is_some() {
            &mut self.dedup
        } else {
            &mut self.legacy_dedup
        }
    }

    /// Sends every queued ACK: one packet per message on legacy, one batched
    /// packet on v2.
    pub(super) fn flush_acks(&mut self, now: Instant) {
        if self.acks_out.is_empty() || !self.is_established() {
            return;
        }
        let tokens = std::mem::take(&mut self.acks_out);
        match self.profile {
            Profile::Legacy => {
                for t in tokens {
                    let p = Packet::new(Command::ACK, t.packet_id, Flags::NONE, Bytes::new());
                    self.write(&Frame::Packet(p).to_bytes(), now);
                }
            }
            Profile::V2 => {
                let ack = Ack {
                    message_ids: tokens.iter().filter_map(|t| t.message_id).collect(),
                };
                let first = tokens.first().map_or(0, |t| t.packet_id);
                let bytes = self.sealed_bytes(Command::ACK, first, Flags::NONE, &ack.to_bytes());
                self.write(&bytes, now);
            }
        }
    }
}
