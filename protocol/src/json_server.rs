//! `JsonServerConnection`: the WebSocket JSON text-frame form of spec section 8,
//! for mpush's legacy JavaScript client. No keys, no compression, no fast
//! connect, and no heartbeat packet (mpush's JSON clients never send one).
//! Unlike mpush, idle connections are not kept forever: when nothing arrived
//! for a heartbeat interval the machine asks the driver for a WebSocket ping
//! (`poll_ping`), which every browser answers by itself; a connection that
//! stays silent through `max_heartbeat_misses` more intervals is closed, and
//! one that does not handshake within `handshake_timeout` too. It emits the
//! same `ServerEvent`s as `ServerConnection`, so a driver serves both with
//! the same code.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use web_time::Instant;

use crate::ProtocolError;
use crate::liveness::{Check, Liveness};
use crate::message::json::{self, JsonPacket};
use crate::packet::Command;
use crate::server::pending::PendingPushes;
use crate::server::{
    Answer, BindRefusal, CloseReason, OutboundPush, PushError, ServerConfig, ServerEvent,
    UpPushRefusal, UpPushReply,
};
use crate::session::{AckMode, DeviceInfo, Profile};

const FIRST_PUSH_ID: i32 = 0x4000_0000;

pub struct JsonServerConnection {
    config: Arc<ServerConfig>,
    out: VecDeque<String>,
    events: VecDeque<ServerEvent>,
    device: Option<DeviceInfo>,
    user: Option<String>,
    closed: bool,
    next_push_id: i32,
    /// Pending pushes; a retry renders the frame again.
    pending: PendingPushes,
    liveness: Liveness,
    ping: bool,
}

impl std::fmt::Debug for JsonServerConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonServerConnection")
            .field("device", &self.device)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl JsonServerConnection {
    /// A connection accepted at `accepted` (the handshake deadline runs from then).
    pub fn new(config: Arc<ServerConfig>, accepted: Instant) -> Self {
        Self {
            pending: PendingPushes::new(config.max_inflight),
            liveness: Liveness::new(
                accepted,
                config.handshake_timeout,
                config.max_heartbeat,
                Duration::ZERO,
                config.max_heartbeat_misses,
            ),
            ping: false,
            config,
            out: VecDeque::new(),
            events: VecDeque::new(),
            device: None,
            user: None,
            closed: false,
            next_push_id: FIRST_PUSH_ID,
        }
    }

    pub fn is_established(&self) -> bool {
        self.device.is_some() && !self.closed
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    pub fn inflight(&self) -> usize {
        self.pending.len()
    }

    /// Any frame from the peer (a WebSocket pong too): it is alive.
    pub fn handle_activity(&mut self, now: Instant) {
        self.liveness.heard(now);
    }

    /// True once after the machine decided the peer should be pinged.
    pub fn poll_ping(&mut self) -> bool {
        std::mem::take(&mut self.ping)
    }

    /// One text frame from the socket.
    pub fn handle_text(&mut self, text: &str, now: Instant) {
        if self.closed {
            return;
        }
        self.handle_activity(now);
        if text.len() > self.config.max_body {
            self.fail(
                Command::UNKNOWN,
                0,
                ProtocolError::State("JSON frame too large"),
            );
            return;
        }
        let p = match JsonPacket::parse(text) {
            Ok(p) => p,
            Err(e) => return self.fail(Command::UNKNOWN, 0, e.into()),
        };
        match p.cmd {
            Command::HANDSHAKE => self.on_handshake(&p),
            Command::BIND | Command::UNBIND => self.on_bind(&p),
            Command::PUSH => {
                if !self.is_established() {
                    return self.fail(
                        p.cmd,
                        p.session_id,
                        ProtocolError::State("push before handshake"),
                    );
                }
                self.events.push_back(ServerEvent::UpPush {
                    content: p.str_field("content").into_bytes().into(),
                    message_id: None,
                    reply: UpPushReply {
                        request: p.session_id,
                        message_id: None,
                        wants_ack: AckMode::from_flags(p.flags) == AckMode::Auto,
                    },
                });
            }
            Command::ACK => {
                if let Some(id) = self.pending.message_for_packet(p.session_id)
                    && let Some(push) = self.pending.ack(id)
                {
                    self.events.push_back(ServerEvent::Acked { push });
                }
            }
            other => {
                self.out.push_back(
                    json::error(other, p.session_id, 101, "unsupported command").to_text(),
                );
                self.close_with(CloseReason::UnsupportedCommand(other));
            }
        }
    }

    /// A binary frame on a JSON connection is a protocol error (mpush closes).
    pub fn handle_binary(&mut self) {
        self.fail(
            Command::UNKNOWN,
            0,
            ProtocolError::State("binary frame on a JSON connection"),
        );
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if self.closed {
            return;
        }
        match self.liveness.check(now) {
            Check::HandshakeTimeout => return self.close_with(CloseReason::HandshakeTimeout),
            Check::Dead => return self.close_with(CloseReason::HeartbeatTimeout),
            Check::Missed => self.ping = true,
            Check::Alive => {}
        }
        let resend = self
            .pending
            .expire(now, &self.config.ack_retry, &mut self.events);
        for (id, push) in resend {
            self.out
                .push_back(json::push(id, &push.content, push.ack_mode.flags()).to_text());
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed {
            return None;
        }
        Some(self.liveness.next(self.pending.next_deadline()))
    }

    /// The next text frame to send.
    pub fn poll_transmit(&mut self) -> Option<String> {
        self.out.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        let e = self.events.pop_front();
        if e.is_none() && self.events.capacity() > 0 {
            // Drained: an idle connection holds no event buffer (a few
            // hundred bytes per event slot).
            self.events = VecDeque::new();
        }
        e
    }

    /// The driver's answer to an event. The JSON form asks only for binds,
    /// unbinds and up-pushes (it has no keys, no fast connect and no HTTP
    /// proxy); any other answer is ignored.
    pub fn handle_answer(&mut self, answer: Answer) {
        match answer {
            Answer::Bind {
                request,
                user_id,
                result,
            } => self.on_bind_answer(request, user_id, result),
            Answer::Unbind { request, ok } => self.on_unbind_answer(request, ok),
            Answer::UpPush { reply, result } => self.on_up_push_answer(reply, result),
            Answer::Decrypted(_)
            | Answer::Session(_)
            | Answer::Restored(_)
            | Answer::Http { .. } => {}
        }
    }

    fn on_bind_answer(&mut self, request: i32, user_id: String, result: Result<(), BindRefusal>) {
        if !self.is_established() {
            return;
        }
        match result {
            Ok(()) => {
                self.user = Some(user_id);
                self.out
                    .push_back(json::ok(Command::BIND, request, "bind success").to_text());
            }
            Err(refusal) => {
                let code = refusal.code().0;
                self.out.push_back(
                    json::error(Command::BIND, request, code, BindRefusal::WIRE_REASON).to_text(),
                );
                self.close_with(CloseReason::Refused(refusal.to_string()));
            }
        }
    }

    /// Answer to `UpPush`: the ACK the client asked for once accepted; no
    /// answer when refused (mpush's JavaScript client has no refusal, and an
    /// ERROR would end its connection): its push callback times out.
    fn on_up_push_answer(&mut self, reply: UpPushReply, result: Result<(), UpPushRefusal>) {
        if result.is_ok() && reply.wants_ack && !self.is_closed() {
            self.out
                .push_back(JsonPacket::new(Command::ACK, reply.request, None).to_text());
        }
    }

    fn on_unbind_answer(&mut self, request: i32, ok: bool) {
        if !self.is_established() {
            return;
        }
        if ok {
            self.user = None;
            self.out
                .push_back(json::ok(Command::UNBIND, request, "unbind success").to_text());
        } else {
            self.out
                .push_back(json::error(Command::UNBIND, request, 0, "unbind failed").to_text());
        }
    }

    pub fn push(&mut self, push: OutboundPush, now: Instant) -> Result<i32, PushError> {
        if self.closed {
            return Err(PushError::Closed);
        }
        if !self.is_established() {
            return Err(PushError::NotReady);
        }
        let tracked = push.ack_mode != AckMode::None;
        if tracked {
            self.pending.admit(push.message_id)?;
        }
        let id = self.next_push_id;
        self.next_push_id = if id == i32::MAX {
            FIRST_PUSH_ID
        } else {
            id + 1
        };
        self.out
            .push_back(json::push(id, &push.content, push.ack_mode.flags()).to_text());
        if tracked {
            self.pending.track(push, id, now, &self.config.ack_retry);
        }
        Ok(id)
    }

    pub fn kick(&mut self, device_id: &str, user_id: &str) {
        if self.is_established() {
            self.out.push_back(json::kick(device_id, user_id).to_text());
        }
    }

    pub fn close(&mut self) {
        self.close_with(CloseReason::Local);
    }

    fn on_handshake(&mut self, p: &JsonPacket) {
        let mut device = DeviceInfo {
            device_id: p.str_field("deviceId"),
            os_name: p.str_field("osName"),
            os_version: p.str_field("osVersion"),
            client_version: p.str_field("clientVersion"),
        };
        if self.device.is_some() {
            // One handshake per connection.
            self.out.push_back(
                json::error(Command::HANDSHAKE, p.session_id, 102, "repeat handshake").to_text(),
            );
            return self.close_with(CloseReason::Refused("repeated handshake".into()));
        }
        if self.config.require_v2 {
            // The JSON form has no keys at all.
            self.out.push_back(
                json::error(Command::HANDSHAKE, p.session_id, 0, "Param invalid").to_text(),
            );
            return self.close_with(CloseReason::Refused("JSON handshake (v2 required)".into()));
        }
        if device.device_id.is_empty() || device.check_limits().is_err() {
            self.out.push_back(
                json::error(Command::HANDSHAKE, p.session_id, 0, "Param invalid").to_text(),
            );
            return self.close_with(CloseReason::Refused("invalid handshake parameters".into()));
        }
        self.liveness.established();
        self.out
            .push_back(JsonPacket::new(Command::HANDSHAKE, p.session_id, None).to_text());
        self.device = Some(device.clone());
        self.events.push_back(ServerEvent::HandshakeCompleted {
            device,
            session: None,
            profile: Profile::Legacy,
        });
    }

    fn on_bind(&mut self, p: &JsonPacket) {
        if !self.is_established() {
            self.out
                .push_back(json::error(p.cmd, p.session_id, 0, "not handshake").to_text());
            return self.close_with(CloseReason::Refused("bind before handshake".into()));
        }
        let user_id = p.str_field("userId");
        let (mut tags, token) = (p.str_field("tags"), p.str_field("data"));
        if crate::session::limits::check_bind(&user_id, &mut tags).is_err() {
            self.out
                .push_back(json::error(p.cmd, p.session_id, 0, "invalid param").to_text());
            return self.close_with(CloseReason::Refused("bind field too long".into()));
        }
        if p.cmd == Command::UNBIND {
            self.events.push_back(ServerEvent::UnbindRequested {
                request: p.session_id,
                user_id,
            });
            return;
        }
        if user_id.is_empty() {
            self.out
                .push_back(json::error(Command::BIND, p.session_id, 0, "invalid param").to_text());
            return self.close_with(CloseReason::Refused("bind without a user id".into()));
        }
        self.events.push_back(ServerEvent::BindRequested {
            request: p.session_id,
            user_id,
            tags,
            token,
            previous_user: self.user.clone(),
        });
    }

    fn fail(&mut self, cmd: Command, session_id: i32, e: ProtocolError) {
        self.out
            .push_back(json::error(cmd, session_id, 100, "handle message error").to_text());
        self.close_with(CloseReason::Protocol(e));
    }

    fn close_with(&mut self, reason: CloseReason) {
        if self.closed {
            return;
        }
        self.closed = true;
        let unacked = self.pending.drain();
        self.events
            .push_back(ServerEvent::Closed { reason, unacked });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::default_key;
    use bytes::Bytes;

    fn conn() -> JsonServerConnection {
        JsonServerConnection::new(Arc::new(ServerConfig::new(default_key())), Instant::now())
    }

    fn texts(c: &mut JsonServerConnection) -> Vec<String> {
        std::iter::from_fn(|| c.poll_transmit()).collect()
    }

    #[test]
    fn handshake_bind_push_ack() {
        let now = Instant::now();
        let mut c = conn();
        c.handle_text(
            r#"{"cmd":2,"flags":16,"sessionId":1,"body":{"deviceId":"web-1","osName":"web"}}"#,
            now,
        );
        assert_eq!(
            texts(&mut c),
            vec![r#"{"bodyLength":0,"cmd":2,"flags":16,"sessionId":1}"#]
        );
        assert!(matches!(
            c.poll_event(),
            Some(ServerEvent::HandshakeCompleted { session: None, .. })
        ));
        c.handle_text(
            r#"{"cmd":5,"flags":16,"sessionId":2,"body":{"userId":"u1","tags":"a"}}"#,
            now,
        );
        let Some(ServerEvent::BindRequested {
            request,
            user_id,
            tags,
            ..
        }) = c.poll_event()
        else {
            panic!("bind requested");
        };
        assert_eq!((request, user_id.as_str(), tags.as_str()), (2, "u1", "a"));
        c.handle_answer(Answer::Bind {
            request: 2,
            user_id: "u1".into(),
            result: Ok(()),
        });
        assert!(texts(&mut c)[0].contains(r#""data":"bind success""#));
        let id = c
            .push(
                OutboundPush {
                    message_id: 9,
                    trace_id: "".into(),
                    content: Bytes::from_static(b"hi"),
                    ack_mode: AckMode::Auto,
                    expires_at_ms: 0,
                    ack_timeout: None,
                    queued_at: None,
                },
                now,
            )
            .expect("pushed");
        assert!(texts(&mut c)[0].contains(r#""content":"hi""#));
        c.handle_text(
            &format!(r#"{{"cmd":23,"flags":16,"sessionId":{id},"body":null}}"#),
            now,
        );
        assert!(
            matches!(c.poll_event(), Some(ServerEvent::Acked { push }) if push.message_id == 9)
        );
        assert_eq!(c.inflight(), 0);
    }

    #[test]
    fn bad_frames_close_with_an_error() {
        let now = Instant::now();
        for bad in [
            "not json",
            r#"{"cmd":1,"flags":16,"sessionId":1}"#,
            r#"{"cmd":5,"flags":16,"sessionId":2,"body":{"userId":"u"}}"#,
        ] {
            let mut c = conn();
            c.handle_text(bad, now);
            assert!(texts(&mut c)[0].contains(r#""cmd":10"#), "{bad}");
            assert!(c.is_closed(), "{bad}");
        }
    }
}
