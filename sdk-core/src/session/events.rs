//! What a session says: actions for the driver, events and states for the
//! app, and why a command failed.

use super::*;

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Connect to this address, then `handle_opened` or `handle_open_failed`.
    Open {
        address: String,
    },
    Send(Bytes),
    /// Close the current socket (no `handle_closed` needed afterwards).
    Close,
    /// GET this URL, then `handle_servers`.
    FetchServers {
        url: String,
    },
}

/// A message for the app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub content: Vec<u8>,
    /// The server's id (v2 servers); `None` from legacy servers.
    pub message_id: Option<u64>,
    pub trace_id: String,
    /// The app must call `Session::ack(ack_id)` (BIZ mode).
    pub needs_ack: bool,
    pub ack_id: u64,
}

/// Where the session is, with what the app may show of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionState {
    /// Opening a connection (or asking the allocator) and shaking hands.
    Connecting { address: String },
    Connected {
        address: String,
        resumed: bool,
        v2: bool,
    },
    /// Waiting to reconnect (or paused: network down, app in the background).
    Disconnected { reason: String, retry_in_ms: u64 },
    /// For good: closed by the app, or refused by the server.
    Stopped { reason: String },
}

impl SessionState {
    /// `connecting`, `connected`, `disconnected` or `closed`: the same
    /// names in every SDK.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Connecting { .. } => "connecting",
            Self::Connected { .. } => "connected",
            Self::Disconnected { .. } => "disconnected",
            Self::Stopped { .. } => "closed",
        }
    }
}

/// What happened, for the app.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionEvent {
    /// The state changed (`Session::state()` says the same); comes before
    /// the `Connected`, `Disconnected` or `Stopped` event of that change.
    StateChanged(SessionState),
    Connected {
        address: String,
        resumed: bool,
        v2: bool,
    },
    Disconnected {
        reason: String,
        retry_in_ms: u64,
    },
    Message(Message),
    Kicked {
        device_id: String,
        user_id: String,
    },
    BindResult {
        user_id: String,
        ok: bool,
        reason: String,
    },
    /// Persist this ticket (empty: forget the stored one) to fast-connect later.
    TicketUpdated {
        ticket: String,
    },
    /// The request that `bind`, `unbind` or `push` returned is settled,
    /// once: a bind when the server accepted or refused it (`bind_failed`),
    /// or a newer bind or an unbind replaced it; an unbind once sent (or at
    /// once, offline); an up-push with an ACK mode when the server accepted
    /// it (its sinks have it) or refused it (`error.retryable()` says whether
    /// sending it again later may work), one without once written. Closing
    /// settles every open request with `stopped`.
    Settled {
        request: u64,
        result: Result<(), SessionError>,
    },
    /// Something the app should know that no request names (the ticket
    /// store failed, say). The session goes on. Raised by drivers.
    Error {
        error: SessionError,
    },
    /// The session will not reconnect (closed by the app, or refused for good).
    Stopped {
        reason: String,
    },
}

/// A command that could not be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    #[error("the offline queue is full ({0} items)")]
    QueueFull(usize),
    #[error("the session is stopped")]
    Stopped,
    #[error("unknown ack id {0}")]
    UnknownAck(u64),
    /// The server could not take the up-push now (its sinks are full, the
    /// sender is over its rate) or did not answer in time: send it again later.
    #[error("retry later: {0}")]
    RetryLater(String),
    /// The server will not take the up-push as sent (e.g. not bound).
    #[error("the server rejected the push: {0}")]
    PushRejected(String),
    /// A bad option or argument; the text names it.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The server refused the bind, or a newer bind or an unbind replaced it.
    #[error("bind failed: {0}")]
    BindFailed(String),
    /// A command before the client was started (`connect()`).
    #[error("not started: call connect() first")]
    NotStarted,
    /// The platform's storage (the resume ticket, the device id) failed.
    #[error("storage: {0}")]
    Storage(String),
    /// An app callback (listener) threw; the client goes on.
    #[error("a callback failed: {0}")]
    Callback(String),
    /// An event reader fell behind and its oldest events were dropped.
    #[error("events dropped: a reader is not keeping up")]
    EventsOverflow,
}

impl SessionError {
    /// A stable code per kind, shared by every SDK (`queue_full`, ...).
    pub fn code(&self) -> &'static str {
        match self {
            Self::QueueFull(_) => "queue_full",
            Self::Stopped => "stopped",
            Self::UnknownAck(_) => "unknown_ack",
            Self::RetryLater(_) => "retry_later",
            Self::PushRejected(_) => "push_rejected",
            Self::InvalidInput(_) => "invalid_input",
            Self::BindFailed(_) => "bind_failed",
            Self::NotStarted => "invalid_state",
            Self::Storage(_) => "storage",
            Self::Callback(_) => "callback",
            Self::EventsOverflow => "events_overflow",
        }
    }

    /// Doing the same again later may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, Self::QueueFull(_) | Self::RetryLater(_))
    }

    /// One error of every kind, for the bindings' tests that map each.
    pub fn every_kind() -> Vec<SessionError> {
        let all = vec![
            Self::QueueFull(0),
            Self::Stopped,
            Self::UnknownAck(0),
            Self::RetryLater(String::new()),
            Self::PushRejected(String::new()),
            Self::InvalidInput(String::new()),
            Self::BindFailed(String::new()),
            Self::NotStarted,
            Self::Storage(String::new()),
            Self::Callback(String::new()),
            Self::EventsOverflow,
        ];
        // Adding a variant breaks this match: add it to the list above too.
        for e in &all {
            match e {
                Self::QueueFull(_)
                | Self::Stopped
                | Self::UnknownAck(_)
                | Self::RetryLater(_)
                | Self::PushRejected(_)
                | Self::InvalidInput(_)
                | Self::BindFailed(_)
                | Self::NotStarted
                | Self::Storage(_)
                | Self::Callback(_)
                | Self::EventsOverflow => {}
            }
        }
        all
    }
}
