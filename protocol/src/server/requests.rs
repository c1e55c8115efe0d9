//! The client's requests once established: bind and unbind, up-pushes and
//! HTTP proxy requests, each sent to the driver as an event and answered
//! through `handle_answer`.

use bytes::Bytes;

use super::{BindRefusal, CloseReason, ServerConnection, ServerEvent, UpPushRefusal, UpPushReply};
use crate::error::ProtocolError;
use crate::message::{Ack, BindUser, Body, ErrorCode, ErrorMessage, HttpRequest, HttpResponse, v2};
use crate::packet::{Command, Flags, Packet};
use crate::session::{AckMode, Profile};

impl ServerConnection {
    pub(super) fn on_bind(&mut self, p: &Packet) -> Result<(), ProtocolError> {
        if !self.is_established() {
            self.reply_error(
                ErrorMessage::with_reason(p.cmd, ErrorCode::NONE, "not handshake"),
                p.session_id,
            );
            self.close_with(CloseReason::Refused("bind before handshake".into()));
            return Ok(());
        }
        let body = self.open(p)?;
        let mut b = BindUser::from_bytes(&body)?;
        if let Err(field) = crate::session::limits::check_bind(&b.user_id, &mut b.tags) {
            self.reply_error(
                ErrorMessage::with_reason(p.cmd, ErrorCode::NONE, "invalid param"),
                p.session_id,
            );
            self.close_with(CloseReason::Refused(format!("bind: `{field}` too long")));
            return Ok(());
        }
        if p.cmd == Command::UNBIND {
            self.events.push_back(ServerEvent::UnbindRequested {
                request: p.session_id,
                user_id: b.user_id,
            });
            return Ok(());
        }
        if b.user_id.is_empty() {
            self.reply_error(
                ErrorMessage::with_reason(Command::BIND, ErrorCode::NONE, "invalid param"),
                p.session_id,
            );
            self.close_with(CloseReason::Refused("bind without a user id".into()));
            return Ok(());
        }
        self.events.push_back(ServerEvent::BindRequested {
            request: p.session_id,
            user_id: b.user_id,
            tags: b.tags,
            token: b.data,
            previous_user: self.user.as_deref().map(String::from),
        });
        Ok(())
    }

    /// Answer to `BindRequested`: `Ok` binds; a refusal answers as mpush
    /// does ("bind failed") and closes.
    pub(super) fn on_bind_answer(
        &mut self,
        request: i32,
        user_id: String,
        result: Result<(), BindRefusal>,
    ) {
        if !self.is_established() {
            return;
        }
        match result {
            Ok(()) => {
                self.user = Some(user_id.into_boxed_str());
                self.reply_ok(Command::BIND, request, "bind success");
            }
            Err(refusal) => {
                self.reply_error(
                    ErrorMessage::with_reason(
                        Command::BIND,
                        refusal.code(),
                        BindRefusal::WIRE_REASON,
                    ),
                    request,
                );
                self.close_with(CloseReason::Refused(refusal.to_string()));
            }
        }
    }

    /// Answer to `UnbindRequested`.
    pub(super) fn on_unbind_answer(&mut self, request: i32, ok: bool) {
        if !self.is_established() {
            return;
        }
        if ok {
            self.user = None;
            self.reply_ok(Command::UNBIND, request, "unbind success");
        } else {
            self.reply_error(
                ErrorMessage::with_reason(Command::UNBIND, ErrorCode::NONE, "unbind failed"),
                request,
            );
        }
    }

    pub(super) fn on_up_push(&mut self, p: &Packet) -> Result<(), ProtocolError> {
        if !self.is_established() {
            return Err(ProtocolError::State("push before handshake"));
        }
        let body = self.open(p)?;
        let (content, message_id) = match self.profile {
            Profile::Legacy => (body, None),
            Profile::V2 => {
                let env: v2::PushEnvelope = prost::Message::decode(body)
                    .map_err(|e| crate::DecodeError::Protobuf(e.to_string()))?;
                (Bytes::from(env.content), Some(env.message_id))
            }
        };
        self.events.push_back(ServerEvent::UpPush {
            content,
            message_id,
            reply: UpPushReply {
                request: p.session_id,
                message_id,
                wants_ack: AckMode::from_flags(p.flags) == AckMode::Auto,
            },
        });
        Ok(())
    }

    /// Answer to `UpPush`. Accepted: the ACK the client asked for. Refused:
    /// a v2 client gets ERROR(PUSH, RETRY_LATER | REJECTED) and keeps its
    /// connection; a legacy client gets no answer (an mpush client reconnects
    /// on any ERROR; without the ACK its push callback times out instead).
    pub(super) fn on_up_push_answer(
        &mut self,
        reply: UpPushReply,
        result: Result<(), UpPushRefusal>,
    ) {
        if !self.is_established() {
            return;
        }
        match result {
            Ok(()) if reply.wants_ack => {
                let ack = Ack {
                    message_ids: reply.message_id.into_iter().collect(),
                };
                self.send_ack(reply.request, &ack);
            }
            Ok(()) => {}
            Err(refusal) if self.profile == Profile::V2 => {
                let code = match refusal {
                    UpPushRefusal::RetryLater(_) => ErrorCode::RETRY_LATER,
                    UpPushRefusal::Rejected(_) => ErrorCode::REJECTED,
                };
                self.reply_error(
                    ErrorMessage::with_reason(Command::PUSH, code, refusal.reason()),
                    reply.request,
                );
            }
            Err(_) => {}
        }
    }

    pub(super) fn on_http(&mut self, p: &Packet) -> Result<(), ProtocolError> {
        if !self.is_established() {
            return Err(ProtocolError::State("http proxy before handshake"));
        }
        let http = HttpRequest::from_bytes(&self.open(p)?)?;
        self.events.push_back(ServerEvent::HttpProxy {
            request: p.session_id,
            http,
        });
        Ok(())
    }

    /// Answer to `HttpProxy`.
    pub(super) fn on_http_answer(&mut self, request: i32, response: &HttpResponse) {
        if self.is_established() {
            let body = response.to_bytes();
            self.send_sealed(Command::HTTP_PROXY, request, Flags::NONE, &body);
        }
    }
}
