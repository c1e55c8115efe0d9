//! The app's requests (bind, unbind, up-push, HTTP proxy) and the server's
//! OK and ERROR answers to them.

use std::time::Duration;

use web_time::Instant;

use super::{
    ClientCloseReason, ClientConnection, ClientError, ClientEvent, Pending, RequestKind, State,
};
use crate::error::ProtocolError;
use crate::message::{BindUser, Body, ErrorCode, ErrorMessage, HttpRequest, OkMessage, v2};
use crate::packet::{Command, Flags, Packet};
use crate::session::{AckMode, Profile};

impl ClientConnection {
    /// Binds a user; `token` goes in the body's data field for servers that
    /// check it. Answered by `BindOk` (or the connection closes).
    pub fn bind(
        &mut self,
        user_id: &str,
        tags: &str,
        token: &str,
        now: Instant,
    ) -> Result<i32, ClientError> {
        self.ready()?;
        let body = BindUser {
            user_id: user_id.to_owned(),
            data: token.to_owned(),
            tags: tags.to_owned(),
        }
        .to_bytes();
        let id = self.next_id();
        let bytes = self.sealed_bytes(Command::BIND, id, Flags::NONE, &body);
        self.write(&bytes, now);
        self.pending.insert(
            id,
            Pending {
                kind: RequestKind::Bind,
                deadline: now + self.config.bind_timeout,
                retries_left: self.config.bind_retries,
                resend: Some(bytes),
                user_id: user_id.to_owned(),
            },
        );
        Ok(id)
    }

    pub fn unbind(&mut self, user_id: &str, now: Instant) -> Result<i32, ClientError> {
        self.ready()?;
        let body = BindUser {
            user_id: user_id.to_owned(),
            ..Default::default()
        }
        .to_bytes();
        let id = self.next_id();
        let bytes = self.sealed_bytes(Command::UNBIND, id, Flags::NONE, &body);
        self.write(&bytes, now);
        self.pending.insert(
            id,
            Pending {
                kind: RequestKind::Unbind,
                deadline: now + self.config.bind_timeout,
                retries_left: 0,
                resend: None,
                user_id: user_id.to_owned(),
            },
        );
        Ok(id)
    }

    /// Sends a message up. With `AckMode::Auto` the server's ACK is awaited
    /// for `timeout` (`PushAcked` or `PushTimedOut`).
    pub fn push(
        &mut self,
        content: &[u8],
        ack_mode: AckMode,
        timeout: Duration,
        now: Instant,
    ) -> Result<i32, ClientError> {
        let message_id = rand_core::Rng::next_u64(&mut self.rng);
        self.push_with_id(content, message_id, ack_mode, timeout, now)
    }

    /// `push` with the caller's message id (v2): a message sent again after a
    /// reconnect keeps its id, so the backend can tell it is the same one.
    pub fn push_with_id(
        &mut self,
        content: &[u8],
        message_id: u64,
        ack_mode: AckMode,
        timeout: Duration,
        now: Instant,
    ) -> Result<i32, ClientError> {
        self.ready()?;
        let id = self.next_id();
        let body = match self.profile {
            Profile::Legacy => content.to_vec(),
            Profile::V2 => prost::Message::encode_to_vec(&v2::PushEnvelope {
                message_id,
                content: content.to_vec(),
                ack_mode: ack_mode.to_v2(),
                ..Default::default()
            }),
        };
        let bytes = self.sealed_bytes(Command::PUSH, id, ack_mode.flags(), &body);
        self.write(&bytes, now);
        if ack_mode != AckMode::None {
            self.pending.insert(
                id,
                Pending {
                    kind: RequestKind::Push,
                    deadline: now + timeout,
                    retries_left: 0,
                    resend: None,
                    user_id: String::new(),
                },
            );
        }
        Ok(id)
    }

    /// Sends an HTTP request through the server's proxy.
    pub fn http(
        &mut self,
        request: &HttpRequest,
        timeout: Duration,
        now: Instant,
    ) -> Result<i32, ClientError> {
        self.ready()?;
        let id = self.next_id();
        let bytes = self.sealed_bytes(Command::HTTP_PROXY, id, Flags::NONE, &request.to_bytes());
        self.write(&bytes, now);
        self.pending.insert(
            id,
            Pending {
                kind: RequestKind::Http,
                deadline: now + timeout,
                retries_left: 0,
                resend: None,
                user_id: String::new(),
            },
        );
        Ok(id)
    }

    pub(super) fn on_ok(&mut self, p: &Packet) -> Result<(), ProtocolError> {
        let ok = OkMessage::from_bytes(&self.open(p)?)?;
        if let Some(req) = self.pending.remove(&p.session_id) {
            match (Command(ok.cmd), req.kind) {
                (Command::BIND, RequestKind::Bind) => {
                    self.events.push_back(ClientEvent::BindOk {
                        user_id: req.user_id,
                    });
                }
                (Command::UNBIND, RequestKind::Unbind) => {
                    self.events.push_back(ClientEvent::Unbound {
                        user_id: req.user_id,
                    });
                }
                _ => {
                    self.pending.insert(p.session_id, req);
                }
            }
        }
        Ok(())
    }

    pub(super) fn on_error(&mut self, p: &Packet, now: Instant) -> Result<(), ProtocolError> {
        let e = ErrorMessage::from_bytes(&self.open(p)?)?;
        let cmd = Command(e.cmd);
        match cmd {
            Command::FAST_CONNECT if matches!(self.state, State::Resuming { .. }) => {
                // mpush: forget the session and handshake on the same socket.
                self.pending.remove(&p.session_id);
                self.events
                    .push_back(ClientEvent::ResumeRejected { code: e.code });
                self.start_handshake(now);
            }
            Command::HANDSHAKE if e.code == ErrorCode::REPEAT_HANDSHAKE => {}
            Command::PUSH
                if matches!(e.code, ErrorCode::RETRY_LATER | ErrorCode::REJECTED)
                    && self
                        .pending
                        .get(&p.session_id)
                        .is_some_and(|r| r.kind == RequestKind::Push) =>
            {
                self.pending.remove(&p.session_id);
                self.events.push_back(ClientEvent::PushRefused {
                    request: p.session_id,
                    code: e.code,
                    reason: e.reason,
                });
            }
            Command::HANDSHAKE => self.close_with(
                ClientCloseReason::HandshakeRefused {
                    code: e.code,
                    reason: e.reason,
                },
                false,
            ),
            _ => self.close_with(
                ClientCloseReason::ServerError {
                    cmd,
                    code: e.code,
                    reason: e.reason,
                },
                true,
            ),
        }
        Ok(())
    }
}
