//! What the machine tells its driver (`ServerEvent`, `CloseReason`), what
//! the driver hands it (`OutboundPush`, `Answer`), and the refusals either
//! side can give (`PushError`, `BindRefusal`, `UpPushRefusal`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use web_time::Instant;

use crate::error::{CryptoError, ProtocolError};
use crate::message::{ErrorCode, HttpRequest, HttpResponse};
use crate::packet::Command;
use crate::session::{AckMode, DeviceInfo, KeptBinding, Profile, SessionRecord};

/// A push for one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundPush {
    /// The driver's id for this message to this device; events name it.
    pub message_id: u64,
    /// Shared by every recipient of one message (a broadcast's thousands).
    pub trace_id: Arc<str>,
    pub content: Bytes,
    pub ack_mode: AckMode,
    /// Unix milliseconds after which the client drops it; 0 = never (v2 only).
    pub expires_at_ms: u64,
    /// How long each attempt waits for the ACK; `None`: the config's policy.
    pub ack_timeout: Option<Duration>,
    /// When the sender accepted it (for its latency metrics; never sent).
    pub queued_at: Option<Instant>,
}

/// Why a push was not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PushError {
    #[error("the connection has not completed its handshake")]
    NotReady,
    #[error("the connection is closed")]
    Closed,
    #[error("too many pushes are waiting for an ACK on this connection")]
    Busy,
    #[error("message {0} is already in flight")]
    Duplicate(u64),
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseReason {
    /// The driver called `close`.
    Local,
    /// No bytes for too long.
    HeartbeatTimeout,
    /// The peer broke the protocol; an ERROR was sent where possible.
    Protocol(ProtocolError),
    /// A command this server does not serve.
    UnsupportedCommand(Command),
    /// A request the server refused (bad handshake parameters, bind refused).
    Refused(String),
    /// No handshake or fast connect completed within `handshake_timeout`.
    HandshakeTimeout,
}

/// What the driver must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerEvent {
    /// Only with `offload_rsa`: decrypt this handshake ciphertext with the
    /// server's private key (`RsaPrivate::decrypt`) and call
    /// `handle_answer(Answer::Decrypted(..))`. Input that arrives meanwhile is buffered.
    DecryptRequested { ciphertext: Bytes },
    /// A full handshake finished; store `session` so the client can resume
    /// (`None` on the WebSocket JSON form, which has no keys and no resume).
    HandshakeCompleted {
        device: DeviceInfo,
        session: Option<SessionRecord>,
        profile: Profile,
    },
    /// Look the session up and answer `Answer::Session`.
    ResumeRequested {
        session_id: String,
        device_id: String,
    },
    /// A fast connect succeeded. On v2 the ticket was single-use: delete
    /// `replaces` (if it was already gone, a concurrent resume used the same
    /// ticket: close this connection) and store `session`, the next one.
    Resumed {
        device: DeviceInfo,
        profile: Profile,
        session: Option<SessionRecord>,
        replaces: Option<String>,
    },
    /// ADR 0008, after `Resumed`: the session kept this binding (its token,
    /// if any, has not expired). Bind the connection as a BIND of it would
    /// (route, older login, inbox), then answer `Answer::Restored`; the
    /// FAST_CONNECT_OK waits for that answer. Only with
    /// `ServerConfig::keep_binding`.
    RestoreRequested { binding: KeptBinding },
    /// ADR 0008: the connection was kicked; clear the binding kept under
    /// this session so its next fast connect does not restore it. No answer.
    ForgetBinding { session_id: String },
    /// Register the route (and check `token`), then answer `Answer::Bind`.
    BindRequested {
        request: i32,
        user_id: String,
        tags: String,
        token: String,
        /// The user bound on this connection before, if any.
        previous_user: Option<String>,
    },
    /// Remove the route, then answer `Answer::Unbind`.
    UnbindRequested { request: i32, user_id: String },
    /// The client sent a message up: accept it (hand it on) or refuse it,
    /// then answer `Answer::UpPush { reply, .. }`. The machine
    /// sends no ACK of its own: the client's ACK means "accepted".
    UpPush {
        content: Bytes,
        /// The client's id for it (v2): the same on every resend.
        message_id: Option<u64>,
        reply: UpPushReply,
    },
    /// HTTP proxy request; answer with `http_response`.
    HttpProxy { request: i32, http: HttpRequest },
    /// The client confirmed a push: its record comes back, settled.
    Acked { push: OutboundPush },
    /// A push was sent again after its ACK did not come.
    PushRetried {
        message_id: u64,
        trace_id: Arc<str>,
        attempt: u32,
    },
    /// A push got no ACK after every retry: its record comes back.
    PushTimedOut { push: OutboundPush },
    /// The connection is over; `unacked` pushes never got their ACK (their
    /// records, in message id order).
    Closed {
        reason: CloseReason,
        unacked: Vec<OutboundPush>,
    },
}

/// What answering an up-push needs: hand it back in `Answer::UpPush`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpPushReply {
    pub request: i32,
    pub message_id: Option<u64>,
    /// The client asked for an ACK.
    pub wants_ack: bool,
}

/// Why an up-push was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpPushRefusal {
    /// Not now (sinks full or unavailable, sender over its rate): the same
    /// message may be sent again later.
    RetryLater(String),
    /// Never as sent (e.g. not bound).
    Rejected(String),
}

impl UpPushRefusal {
    pub fn reason(&self) -> &str {
        match self {
            Self::RetryLater(r) | Self::Rejected(r) => r,
        }
    }
}

/// The driver's answer to an event that asked for a round trip, handed to
/// `ServerConnection::handle_answer` (one verb for every answer).
#[derive(Debug)]
#[non_exhaustive]
pub enum Answer {
    /// To `DecryptRequested`: the plaintext, or why it failed.
    Decrypted(Result<Vec<u8>, CryptoError>),
    /// To `ResumeRequested`: the stored session, if any.
    Session(Option<SessionRecord>),
    /// To `RestoreRequested`: `true` when the connection is bound again.
    /// `false` (the store or the route table failed): the client is told
    /// it is not bound and sends its own BIND.
    Restored(bool),
    /// To `BindRequested`: bound, or refused (the connection then closes).
    Bind {
        request: i32,
        user_id: String,
        result: Result<(), BindRefusal>,
    },
    /// To `UnbindRequested`: `ok` when the route was removed.
    Unbind { request: i32, ok: bool },
    /// To `UpPush`: accepted (handed on), or refused.
    UpPush {
        reply: UpPushReply,
        result: Result<(), UpPushRefusal>,
    },
    /// To `HttpProxy`: the backend's response.
    Http {
        request: i32,
        response: HttpResponse,
    },
}

/// Why a bind was refused. On the wire every refusal is mpush's: ERROR(BIND)
/// with code `code()` and the reason "bind failed", then the connection
/// closes; the variant and its words go to the driver's logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BindRefusal {
    /// The bind token does not let this device bind this user (missing,
    /// malformed, expired, for another user or client type).
    #[error("{0}")]
    Unauthorized(String),
}

impl BindRefusal {
    /// What mpush 0.8.1 says to a refused bind.
    pub const WIRE_REASON: &'static str = "bind failed";

    /// The ERROR packet's code: none, as mpush sends.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Unauthorized(_) => ErrorCode::NONE,
        }
    }
}
