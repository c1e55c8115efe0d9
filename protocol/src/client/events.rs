//! What the machine tells the session layer (`ClientEvent`,
//! `ClientCloseReason`), what an app holds to acknowledge a push
//! (`AckToken`, `IncomingPush`), and why a request is refused (`ClientError`).

use std::time::Duration;

use bytes::Bytes;

use crate::error::ProtocolError;
use crate::message::{ErrorCode, HttpResponse, Redirect};
use crate::packet::Command;
use crate::session::{AckMode, Profile, ResumeTicket};

/// What the app needs to acknowledge a message later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AckToken {
    pub packet_id: i32,
    pub message_id: Option<u64>,
}

impl AckToken {
    /// The message id on v2; the packet id (unique per connection) on legacy.
    pub(super) fn dedup_key(&self) -> u64 {
        self.message_id.unwrap_or(self.packet_id as u32 as u64)
    }
}

/// A message pushed by the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingPush {
    pub content: Bytes,
    /// The server's message id (v2 only).
    pub message_id: Option<u64>,
    pub trace_id: String,
    pub ack_mode: AckMode,
    /// Set when the app must call `ack` (BIZ mode).
    pub ack: Option<AckToken>,
    pub expires_at_ms: u64,
}

/// Why the connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientCloseReason {
    Local,
    HandshakeTimeout,
    HeartbeatTimeout,
    RequestTimeout(Command),
    /// The server refused the handshake; mpush clients stop for good here.
    HandshakeRefused {
        code: ErrorCode,
        reason: String,
    },
    /// The server answered a request with ERROR.
    ServerError {
        cmd: Command,
        code: ErrorCode,
        reason: String,
    },
    Protocol(ProtocolError),
}

/// Words for the app (a disconnect's `reason`): what happened and, for an
/// error, the server's code and text.
impl std::fmt::Display for ClientCloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local => f.write_str("closed by this side"),
            Self::HandshakeTimeout => {
                f.write_str("the server did not answer the handshake in time")
            }
            Self::HeartbeatTimeout => f.write_str("nothing from the server within the heartbeat"),
            Self::RequestTimeout(cmd) => write!(f, "the server did not answer {cmd} in time"),
            Self::HandshakeRefused { code, reason } => {
                write!(
                    f,
                    "the server refused the handshake (error {}: {reason})",
                    code.0
                )
            }
            Self::ServerError { cmd, code, reason } => {
                write!(
                    f,
                    "the server answered {cmd} with error {}: {reason}",
                    code.0
                )
            }
            Self::Protocol(e) => write!(f, "protocol error: {e}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientEvent {
    /// Handshake or fast connect done. `ticket` is new after a full handshake.
    Connected {
        profile: Profile,
        heartbeat: Duration,
        resumed: bool,
        ticket: Option<ResumeTicket>,
    },
    /// The server refused the fast connect; a full handshake follows on this socket.
    ResumeRejected {
        code: ErrorCode,
    },
    BindOk {
        user_id: String,
    },
    Unbound {
        user_id: String,
    },
    Message(IncomingPush),
    /// The server acknowledged an up-push.
    PushAcked {
        request: i32,
    },
    /// An up-push that wanted an ACK got none in time.
    PushTimedOut {
        request: i32,
    },
    /// v2: the server refused an up-push (`ErrorCode::RETRY_LATER`: send it
    /// again later; `ErrorCode::REJECTED`: never as sent). The connection stays.
    PushRefused {
        request: i32,
        code: ErrorCode,
        reason: String,
    },
    Kicked {
        device_id: String,
        user_id: String,
    },
    /// v2: the server asks to reconnect elsewhere.
    Redirect(Redirect),
    HttpResponse {
        request: i32,
        response: HttpResponse,
    },
    HttpTimedOut {
        request: i32,
    },
    /// The connection is over. `reconnect` is false only when retrying is
    /// pointless (the server refused the handshake) or the app closed it.
    Closed {
        reason: ClientCloseReason,
        reconnect: bool,
    },
}

/// A command that cannot run now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("not connected yet")]
    NotConnected,
    #[error("the connection is closed")]
    Closed,
}
