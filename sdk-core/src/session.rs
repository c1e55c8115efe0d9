//! `Session`: the client across reconnects, sans-IO. It owns the current
//! `ClientConnection`, the backoff, the dedup window, the resume ticket, the
//! user to re-bind and the outbound queue, and speaks in actions (open a
//! connection, send bytes, close), events and a next deadline.
//!
//! The driver: on `Action::Open` it connects and calls `handle_opened` (or
//! `handle_open_failed`); it feeds received bytes to `handle_input`, a closed
//! socket to `handle_closed`, and time to `handle_timeout` at `poll_timeout`.
//! After every call it drains `poll_action` and `poll_event`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mpush_protocol::Command;
use mpush_protocol::Instant;
use mpush_protocol::backoff::{Backoff, BackoffConfig};
use mpush_protocol::client::{
    AckToken, ClientCloseReason, ClientConfig, ClientConnection, ClientEvent,
};
use mpush_protocol::crypto::{Rng, RsaPublic, random_array};
use mpush_protocol::dedup::DedupWindow;
use mpush_protocol::message::ErrorCode;
use mpush_protocol::session::{AckMode, DeviceInfo, Profile, ResumeTicket};
use mpush_protocol::small_map::SmallMap;
use rand_core::{Rng as _, SeedableRng};

/// How to reach the servers and who this client is.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Addresses tried in order: `host:port` (TCP), `tls://host:port` (TCP
    /// over TLS) or `ws://` / `wss://` URLs.
    pub servers: Vec<String>,
    /// mpush's allocator: an HTTP URL whose `GET` returns `host:port,...`.
    /// When set, the list is fetched before each round of connection attempts.
    pub allocator_url: Option<String>,
    pub public_key: Arc<RsaPublic>,
    pub device: DeviceInfo,
    /// Ask for the v2 profile (a legacy server ignores it).
    pub offer_v2: bool,
    /// Heartbeat asked of the server.
    pub heartbeat: Duration,
    pub backoff: BackoffConfig,
    /// Message ids remembered to drop repeats, across reconnects.
    pub dedup_capacity: usize,
    /// Up-pushes and ACKs kept while offline; more are refused.
    pub outbound_capacity: usize,
    /// How long an `Open` may take before it counts as failed.
    pub connect_timeout: Duration,
    /// The native driver's TLS (`tls://`, `wss://`): `None` trusts the
    /// webpki roots (Mozilla's); a PEM certificate here is the only one
    /// trusted (pinning, for private deployments and self-signed servers).
    /// Browsers use the page's own trust instead.
    pub tls_pinned_cert_pem: Option<String>,
    /// On `tls://` and `wss://` addresses, use the transport-secured profile
    /// (ADR 0005: no RSA or AES on top of TLS; servers of this project
    /// only). If a server refuses it, the session goes back to the classic
    /// handshake for good. Off by default.
    pub transport_profile: bool,
    /// Opt-in: use mpush's published RSA key (the default when no key is
    /// given, and recognised by value when one is) on plain connections to
    /// other hosts. Anyone can decrypt such a handshake; this is for apps
    /// that must reach a server still using that key. Off by default.
    pub allow_published_key: bool,
}

impl SessionConfig {
    /// The defaults, here and nowhere else (every binding starts from them).
    pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(240);
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DEFAULT_DEDUP_CAPACITY: usize = 1024;
    pub const DEFAULT_OUTBOUND_CAPACITY: usize = 256;
    /// The bounds `validate` enforces.
    pub const MIN_HEARTBEAT: Duration = Duration::from_secs(1);
    pub const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(100);
    pub const MAX_DURATION: Duration = Duration::from_secs(86_400);
    pub const MAX_CAPACITY: usize = 1_000_000;

    pub fn new(servers: Vec<String>, public_key: Arc<RsaPublic>, device: DeviceInfo) -> Self {
        Self {
            servers,
            allocator_url: None,
            public_key,
            device,
            offer_v2: true,
            heartbeat: Self::DEFAULT_HEARTBEAT,
            backoff: BackoffConfig::default(),
            dedup_capacity: Self::DEFAULT_DEDUP_CAPACITY,
            outbound_capacity: Self::DEFAULT_OUTBOUND_CAPACITY,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            tls_pinned_cert_pem: None,
            transport_profile: false,
            allow_published_key: false,
        }
    }

    /// Checks every field; the error (`invalid_input`) names the first bad
    /// one. Every binding calls this, so the rules are the same everywhere.
    pub fn validate(&self) -> Result<(), SessionError> {
        let bad = |m: String| Err(SessionError::InvalidInput(m));
        if self.servers.is_empty() && self.allocator_url.is_none() {
            return bad("servers or allocator_url is required".into());
        }
        for s in &self.servers {
            if let Err(why) = check_address(s) {
                return bad(format!("servers: \"{s}\": {why}"));
            }
            if !cfg!(feature = "classic") && !transport_capable(s) {
                return bad(format!(
                    "servers: \"{s}\": this build has no RSA or AES, so it speaks only the \
                     transport-secured profile: wss://, or ws:// to this machine for development"
                ));
            }
        }
        if let Some(u) = &self.allocator_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            return bad(format!("allocator_url: \"{u}\" is not an http(s):// URL"));
        }
        if self.device.device_id.is_empty() {
            return bad("device_id must not be empty".into());
        }
        let within = |d: Duration, min: Duration| d >= min && d <= Self::MAX_DURATION;
        if !within(self.heartbeat, Self::MIN_HEARTBEAT) {
            return bad("heartbeat: from 1 s to 1 day".into());
        }
        if !within(self.connect_timeout, Self::MIN_CONNECT_TIMEOUT) {
            return bad("connect_timeout: from 100 ms to 1 day".into());
        }
        let b = &self.backoff;
        if b.initial.is_zero() || b.max < b.initial || b.max > Self::MAX_DURATION {
            return bad("backoff: 0 < initial <= max <= 1 day".into());
        }
        if !(1.0..=100.0).contains(&b.multiplier) || !(0.0..=1.0).contains(&b.jitter) {
            return bad("backoff: multiplier from 1 to 100, jitter from 0 to 1".into());
        }
        for (name, n) in [
            ("dedup_capacity", self.dedup_capacity),
            ("outbound_capacity", self.outbound_capacity),
        ] {
            if n == 0 || n > Self::MAX_CAPACITY {
                return bad(format!("{name}: from 1 to 1000000"));
            }
        }
        // Last, once every field is well formed: mpush's published key (left
        // as the default or given by value) protects nothing on a plain
        // connection to another host.
        if self.public_key.is_mpush_published() && !self.allow_published_key {
            let exposed = self
                .servers
                .iter()
                .find(|s| !is_tls_address(s) && !is_loopback_address(s))
                .or(self
                    .allocator_url
                    .as_ref()
                    .filter(|u| !is_loopback_address(u)));
            if let Some(s) = exposed {
                return bad(format!(
                    "public_key: mpush's published key, which anyone can decrypt the handshake \
                     with, for \"{s}\": give the server's own key (`mpush-server keygen` prints \
                     it), or set allow_published_key (allowPublishedKey) to reach a server that \
                     still uses it"
                ));
            }
        }
        Ok(())
    }
}

/// An address whose connection is TLS (`tls://`, `wss://`).
pub fn is_tls_address(address: &str) -> bool {
    address.starts_with("tls://") || address.starts_with("wss://")
}

/// A `ws://` address on this machine (`localhost`, 127.0.0.0/8, `[::1]`):
/// a development server, which may take the transport-secured profile over
/// plain WebSocket when it says so (`net.dev_loopback_transport`, ADR 0005).
pub fn is_loopback_ws(address: &str) -> bool {
    address.starts_with("ws://") && is_loopback_address(address)
}

/// An address on this machine (`localhost`, 127.0.0.0/8, `[::1]`), in any
/// form a server list or an allocator URL takes: `host:port`,
/// `tls://host:port`, `ws://`, `wss://`, `http://`, `https://`.
pub fn is_loopback_address(address: &str) -> bool {
    let rest = address.split_once("://").map_or(address, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // After any userinfo: `http://127.0.0.1@evil.example` is not loopback.
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    // 127.0.0.0/8 as a dotted quad, or ::1 (no IP parser: this runs in the
    // browser module, where every kilobyte counts).
    let v4_loopback = host.split('.').count() == 4
        && host.starts_with("127.")
        && host.split('.').all(|p| p.parse::<u8>().is_ok());
    host.eq_ignore_ascii_case("localhost") || host == "::1" || v4_loopback
}

/// Whether this build may use the transport-secured profile on `address`:
/// TLS addresses, and (in a build without the classic handshake, which has
/// no other way in) `ws://` to this machine for development.
fn transport_capable(address: &str) -> bool {
    is_tls_address(address) || (!cfg!(feature = "classic") && is_loopback_ws(address))
}

/// `host:port`, `tls://host:port`, `ws://...` or `wss://...`.
fn check_address(s: &str) -> Result<(), &'static str> {
    if let Some(rest) = s.strip_prefix("ws://").or_else(|| s.strip_prefix("wss://")) {
        return if rest.is_empty() || rest.starts_with('/') {
            Err("no host")
        } else {
            Ok(())
        };
    }
    let hostport = s.strip_prefix("tls://").unwrap_or(s);
    match hostport.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0) => Ok(()),
        _ => Err("not host:port, tls://host:port, ws:// or wss://"),
    }
}

/// The server list an mpush allocator answers (`host:port,host:port`, or
/// URLs), for `Session::handle_servers`.
pub fn parse_server_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

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

enum Outbound {
    Push(UpPush),
    Ack(AckToken),
}

/// An up-push until the server accepted it: sent again, with the same
/// message id, after a reconnect, and after a "retry later" or no answer
/// (so the backend, which gets the same event id each time, can drop a
/// copy that was handed on although the answer did not say so).
#[derive(Clone)]
struct UpPush {
    request: u64,
    message_id: u64,
    content: Bytes,
    ack_mode: AckMode,
    timeout: Duration,
    /// Sends so far that were refused for now or not answered.
    retries: u32,
}

/// Up-pushes refused with "retry later" (or not answered) are sent again
/// this many times, waiting 1, 2, 4 ... s, before `push` fails with
/// `retry_later`.
const UP_PUSH_RETRIES: u32 = 4;

enum Link {
    /// Waiting to (re)connect at this time.
    Waiting {
        at: Instant,
    },
    Fetching,
    Opening {
        address: String,
        deadline: Instant,
    },
    Connected {
        conn: Box<ClientConnection>,
        address: String,
    },
    Stopped,
}

pub struct Session {
    config: Arc<SessionConfig>,
    client_config: Arc<ClientConfig>,
    /// The same on the transport-secured profile (ADR 0005).
    transport_config: Arc<ClientConfig>,
    /// A server refused the transport profile: classic handshakes from now on.
    transport_refused: bool,
    /// The current connection uses it, and has (not) been established.
    conn_transport: bool,
    conn_established: bool,
    rng: Rng,
    clock: (Instant, i64),
    backoff: Backoff,
    link: Link,
    state: SessionState,
    dedup: Option<DedupWindow>,
    ticket: Option<ResumeTicket>,
    servers: Vec<String>,
    next_server: usize,
    /// Attempts in the current round over the server list.
    tried: usize,
    user: Option<(String, String, String)>,
    /// `bind` requests for `user` not answered yet (all settle together).
    binds: Vec<u64>,
    outbound: VecDeque<Outbound>,
    next_request: u64,
    /// Up-pushes sent and waiting for the server's answer, by connection
    /// request id; queued again if the connection drops first.
    requests: SmallMap<i32, UpPush>,
    /// Up-pushes to send again (same message id) at a time.
    retry: Vec<(Instant, UpPush)>,
    /// Open ACK handles: ack id → (connection generation, token).
    /// Bounded by `dedup_capacity` (oldest out): an app that never
    /// acknowledges cannot grow it without end; the server resends those.
    acks: SmallMap<u64, (u64, AckToken)>,
    next_ack: u64,
    generation: u64,
    actions: VecDeque<Action>,
    events: VecDeque<SessionEvent>,
    /// Reconnects wait while the network is down or the app is in the background.
    network_down: bool,
    background: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session that starts connecting at once. `ticket` is the text of a
    /// persisted `TicketUpdated`, if any. `seed` must be cryptographically random.
    pub fn new(
        config: SessionConfig,
        ticket: Option<&str>,
        seed: [u8; 32],
        now: Instant,
        unix_ms: i64,
    ) -> Self {
        let mut cc = ClientConfig::new(config.public_key.clone(), config.device.clone());
        cc.offer_v2 = config.offer_v2;
        cc.min_heartbeat = config.heartbeat;
        cc.max_heartbeat = config.heartbeat;
        let mut tc = cc.clone();
        tc.transport_secured = true;
        let mut s = Self {
            client_config: Arc::new(cc),
            transport_config: Arc::new(tc),
            transport_refused: false,
            conn_transport: false,
            conn_established: false,
            rng: Rng::from_seed(seed),
            clock: (now, unix_ms),
            backoff: Backoff::new(config.backoff.clone()),
            link: Link::Waiting { at: now },
            state: SessionState::Connecting {
                address: String::new(),
            },
            dedup: Some(DedupWindow::new(config.dedup_capacity)),
            ticket: ticket.and_then(ResumeTicket::from_text),
            servers: config.servers.clone(),
            next_server: 0,
            tried: 0,
            user: None,
            binds: Vec::new(),
            outbound: VecDeque::new(),
            next_request: 1,
            requests: SmallMap::new(),
            retry: Vec::new(),
            acks: SmallMap::new(),
            next_ack: 1,
            generation: 0,
            actions: VecDeque::new(),
            events: VecDeque::new(),
            network_down: false,
            background: false,
            config: Arc::new(config),
        };
        s.connect(now);
        s
    }

    /// Where the session is (every change is also a `StateChanged` event).
    pub fn state(&self) -> &SessionState {
        &self.state
    }

    pub fn is_connected(&self) -> bool {
        matches!(&self.link, Link::Connected { conn, .. } if conn.is_established())
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }

    /// True while reconnects wait for the network or the foreground.
    pub fn is_paused(&self) -> bool {
        self.network_down || self.background
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let link = match &self.link {
            Link::Waiting { .. } if self.is_paused() => None,
            Link::Waiting { at } => Some(*at),
            Link::Opening { deadline, .. } => Some(*deadline),
            Link::Connected { conn, .. } => conn.poll_timeout(),
            Link::Fetching | Link::Stopped => None,
        };
        let retry = self.retry.iter().map(|(at, _)| *at).min();
        match (link, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ----- driver inputs -------------------------------------------------

    pub fn handle_servers(&mut self, result: Result<Vec<String>, String>, now: Instant) {
        if !matches!(self.link, Link::Fetching) {
            return;
        }
        match result {
            Ok(list) if !list.is_empty() => {
                self.servers = list;
                self.next_server = 0;
                self.tried = 0;
                self.open_next(now);
            }
            Ok(_) => self.retry_later(now, "the allocator listed no server".into()),
            Err(e) => self.retry_later(now, format!("allocator: {e}")),
        }
    }

    pub fn handle_opened(&mut self, now: Instant) {
        let Link::Opening { address, .. } = std::mem::replace(&mut self.link, Link::Stopped) else {
            return;
        };
        let unix = self.unix_ms(now);
        let dedup = self
            .dedup
            .take()
            .unwrap_or_else(|| DedupWindow::new(self.config.dedup_capacity));
        self.conn_transport = self.config.transport_profile
            && self.config.offer_v2
            && !self.transport_refused
            && transport_capable(&address);
        self.conn_established = false;
        let config = if self.conn_transport {
            &self.transport_config
        } else {
            &self.client_config
        };
        let conn = ClientConnection::new(
            config.clone(),
            random_array(&mut self.rng),
            now,
            unix,
            self.ticket.clone(),
            dedup,
        );
        self.generation += 1;
        self.link = Link::Connected {
            conn: Box::new(conn),
            address,
        };
        self.pump(now);
    }

    pub fn handle_open_failed(&mut self, reason: &str, now: Instant) {
        if !matches!(self.link, Link::Opening { .. }) {
            return;
        }
        self.open_next_or_wait(now, reason.to_owned());
    }

    pub fn handle_input(&mut self, data: &[u8], now: Instant) {
        if let Link::Connected { conn, .. } = &mut self.link {
            conn.handle_input(data, now);
            self.pump(now);
        }
    }

    /// The socket closed (by the peer or an error).
    pub fn handle_closed(&mut self, reason: &str, now: Instant) {
        if let Link::Connected { .. } = self.link {
            self.drop_connection();
            self.retry_later(now, reason.to_owned());
        }
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.due_retries(now);
        let paused = self.is_paused();
        match &mut self.link {
            Link::Waiting { at } if *at <= now && !paused => self.connect(now),
            Link::Opening { deadline, .. } if *deadline <= now => {
                self.actions.push_back(Action::Close);
                self.open_next_or_wait(now, "connect timed out".into());
            }
            Link::Connected { conn, .. } => {
                conn.handle_timeout(now);
                self.pump(now);
            }
            _ => {}
        }
    }

    /// The network came back: forget the backoff and, if waiting (and not in
    /// the background), reconnect now.
    pub fn network_available(&mut self, now: Instant) {
        self.network_down = false;
        self.resume(now);
    }

    /// The network is gone: no reconnect attempts until `network_available`.
    /// A live connection is kept (its heartbeat tells whether it survived).
    pub fn network_lost(&mut self) {
        self.network_down = true;
    }

    /// The app came to the foreground: forget the backoff and, if waiting
    /// (and the network is up), reconnect now.
    pub fn foreground(&mut self, now: Instant) {
        self.background = false;
        self.resume(now);
    }

    /// The app went to the background: no reconnect attempts until
    /// `foreground` (apps that keep pushing in the background, from an
    /// Android foreground service, just do not report it). A live connection
    /// is kept.
    pub fn background(&mut self) {
        self.background = true;
    }

    fn resume(&mut self, now: Instant) {
        self.backoff.reset();
        if !self.is_paused()
            && let Link::Waiting { .. } = self.link
        {
            self.connect(now);
        }
    }

    // ----- app commands ----------------------------------------------------

    /// Binds (and re-binds after every reconnect) a user. Returns a
    /// request id that `Settled` names once the server accepted the bind
    /// (or refused it: `bind_failed`). Offline, it waits for the connection.
    /// A bind of another user, or an unbind, fails the open ones.
    pub fn bind(
        &mut self,
        user: &str,
        tags: &str,
        token: &str,
        now: Instant,
    ) -> Result<u64, SessionError> {
        self.alive()?;
        if user.is_empty() {
            return Err(SessionError::InvalidInput(
                "user id must not be empty".into(),
            ));
        }
        if self.user.as_ref().is_some_and(|(u, ..)| u != user) {
            self.fail_binds(&format!("replaced by a bind of {user}"));
        }
        let request = self.new_request();
        self.binds.push(request);
        self.user = Some((user.to_owned(), tags.to_owned(), token.to_owned()));
        if let Link::Connected { conn, .. } = &mut self.link
            && conn.is_established()
        {
            let _ = conn.bind(user, tags, token, now);
            self.pump(now);
        }
        Ok(request)
    }

    /// Forgets the user (no more re-binds) and tells the server. The
    /// request settles once that is sent (at once when offline: the server
    /// unbinds a closed connection by itself).
    pub fn unbind(&mut self, now: Instant) -> Result<u64, SessionError> {
        self.alive()?;
        self.fail_binds("unbound before the server answered");
        if let Some((user, ..)) = self.user.take()
            && let Link::Connected { conn, .. } = &mut self.link
        {
            let _ = conn.unbind(&user, now);
            self.pump(now);
        }
        let request = self.new_request();
        self.settle(request, Ok(()));
        Ok(request)
    }

    /// Acknowledges a message the app handled (BIZ mode). Offline, a v2 ACK is
    /// queued; a legacy one names a packet of a closed connection and is moot.
    pub fn ack(&mut self, ack_id: u64, now: Instant) -> Result<(), SessionError> {
        self.alive()?;
        let (generation, token) = self
            .acks
            .remove(&ack_id)
            .ok_or(SessionError::UnknownAck(ack_id))?;
        let current = generation == self.generation;
        if let Link::Connected { conn, .. } = &mut self.link
            && conn.is_established()
            && (current || token.message_id.is_some())
        {
            let _ = conn.ack(token, now);
            self.pump(now);
            return Ok(());
        }
        if token.message_id.is_some() {
            self.enqueue(Outbound::Ack(token))?;
        }
        Ok(())
    }

    /// Sends a message up; queued while offline. Returns a request id that
    /// `Settled` names: with an `ack_mode`, once the server accepted (or
    /// refused) it; without, once written. Until accepted it is kept (and
    /// sent again, with the same message id, after a reconnect); unanswered
    /// and queued up-pushes together are bounded by `outbound_capacity`.
    pub fn push(
        &mut self,
        content: &[u8],
        ack_mode: AckMode,
        now: Instant,
    ) -> Result<u64, SessionError> {
        self.alive()?;
        let held = self.outbound.len() + self.requests.len() + self.retry.len();
        if held >= self.config.outbound_capacity {
            return Err(SessionError::QueueFull(held));
        }
        let request = self.new_request();
        let item = Outbound::Push(UpPush {
            request,
            message_id: self.rng.next_u64(),
            content: Bytes::copy_from_slice(content),
            ack_mode,
            timeout: Duration::from_secs(10),
            retries: 0,
        });
        if self.is_connected() {
            self.send_outbound(item, now);
            self.pump(now);
        } else {
            self.enqueue(item)?;
        }
        Ok(request)
    }

    /// Stops for good.
    pub fn close(&mut self) {
        if matches!(self.link, Link::Stopped) {
            return;
        }
        if let Link::Connected { conn, .. } = &mut self.link {
            conn.close();
        }
        self.actions.push_back(Action::Close);
        self.stop("closed by the app".into());
    }

    // ----- internals -----------------------------------------------------

    fn new_request(&mut self) -> u64 {
        let r = self.next_request;
        self.next_request += 1;
        r
    }

    fn settle(&mut self, request: u64, result: Result<(), SessionError>) {
        self.events
            .push_back(SessionEvent::Settled { request, result });
    }

    /// Settles every open bind with `result`.
    fn settle_binds(&mut self, result: Result<(), SessionError>) {
        for r in std::mem::take(&mut self.binds) {
            self.settle(r, result.clone());
        }
    }

    fn fail_binds(&mut self, why: &str) {
        self.settle_binds(Err(SessionError::BindFailed(why.to_owned())));
    }

    fn set_state(&mut self, state: SessionState) {
        if state != self.state {
            self.state = state.clone();
            self.events.push_back(SessionEvent::StateChanged(state));
        }
    }

    /// Stopped for good: every open request settles with `stopped`.
    fn stop(&mut self, reason: String) {
        self.link = Link::Stopped;
        self.set_state(SessionState::Stopped {
            reason: reason.clone(),
        });
        let mut open: Vec<u64> = std::mem::take(&mut self.binds);
        open.extend(self.requests.drain().map(|(_, p)| p.request));
        open.extend(self.retry.drain(..).map(|(_, p)| p.request));
        open.extend(self.outbound.drain(..).filter_map(|o| match o {
            Outbound::Push(p) => Some(p.request),
            Outbound::Ack(_) => None,
        }));
        // Binds, then the pushes sent (in the order sent), then the queued ones.
        for r in open {
            self.settle(r, Err(SessionError::Stopped));
        }
        self.events.push_back(SessionEvent::Stopped { reason });
    }

    fn alive(&self) -> Result<(), SessionError> {
        if matches!(self.link, Link::Stopped) {
            Err(SessionError::Stopped)
        } else {
            Ok(())
        }
    }

    fn enqueue(&mut self, item: Outbound) -> Result<(), SessionError> {
        if self.outbound.len() >= self.config.outbound_capacity {
            return Err(SessionError::QueueFull(self.outbound.len()));
        }
        self.outbound.push_back(item);
        Ok(())
    }

    /// Starts a round: fetch the list from the allocator, or try the next server.
    fn connect(&mut self, now: Instant) {
        self.tried = 0;
        match &self.config.allocator_url {
            Some(url) => {
                let url = url.clone();
                self.link = Link::Fetching;
                self.set_state(SessionState::Connecting {
                    address: url.clone(),
                });
                self.actions.push_back(Action::FetchServers { url });
            }
            None => self.open_next(now),
        }
    }

    fn open_next(&mut self, now: Instant) {
        if self.servers.is_empty() {
            return self.retry_later(now, "no server address configured".into());
        }
        let address = self.servers[self.next_server % self.servers.len()].clone();
        self.next_server = (self.next_server + 1) % self.servers.len();
        self.tried += 1;
        self.link = Link::Opening {
            address: address.clone(),
            deadline: now + self.config.connect_timeout,
        };
        self.set_state(SessionState::Connecting {
            address: address.clone(),
        });
        self.actions.push_back(Action::Open { address });
    }

    fn open_next_or_wait(&mut self, now: Instant, reason: String) {
        if self.tried < self.servers.len() {
            self.open_next(now);
        } else {
            self.retry_later(now, reason);
        }
    }

    fn retry_later(&mut self, now: Instant, reason: String) {
        let delay = self.backoff.next_delay(&mut self.rng);
        self.wait(now, delay, reason);
    }

    fn wait(&mut self, now: Instant, delay: Duration, reason: String) {
        self.link = Link::Waiting { at: now + delay };
        let retry_in_ms = delay.as_millis() as u64;
        self.set_state(SessionState::Disconnected {
            reason: reason.clone(),
            retry_in_ms,
        });
        self.events.push_back(SessionEvent::Disconnected {
            reason,
            retry_in_ms,
        });
    }

    fn drop_connection(&mut self) {
        if self.conn_transport && !self.conn_established {
            // A transport-profile connection that ended before it was up:
            // the server would not take the profile (an older server, or
            // mpush), or the network failed mid-handshake. Either way the
            // classic handshake is used from now on, which every server takes.
            self.transport_refused = true;
        }
        if let Link::Connected { conn, .. } = &mut self.link {
            self.dedup = Some(conn.take_dedup());
        }
        // Legacy ACKs name packets of this connection: moot once it is gone.
        self.acks.retain(|_, (_, t)| t.message_id.is_some());
        // Up-pushes not answered yet go first on the next connection, in
        // the order they were made, with their message ids.
        for (_, p) in self.requests.drain().rev() {
            self.outbound.push_front(Outbound::Push(p));
        }
        self.link = Link::Stopped;
    }

    /// An up-push refused for now (or not answered): sent again later with
    /// its message id, or failed with `retry_later` after the last try.
    fn retry_up_push(&mut self, mut p: UpPush, reason: String, now: Instant) {
        // mpush 0.8.1's profile carries no message id: a copy sent again is
        // a new event to the backend, so the app decides.
        let v2 =
            matches!(&self.link, Link::Connected { conn, .. } if conn.profile() == Profile::V2);
        if p.retries >= UP_PUSH_RETRIES || !v2 {
            self.settle(p.request, Err(SessionError::RetryLater(reason)));
            return;
        }
        let wait = Duration::from_secs(1 << p.retries.min(5));
        p.retries += 1;
        self.retry.push((now + wait, p));
    }

    /// Up-pushes whose wait is over: sent now, or queued for the next
    /// connection.
    fn due_retries(&mut self, now: Instant) {
        while let Some(i) = self.retry.iter().position(|(at, _)| *at <= now) {
            let (_, p) = self.retry.remove(i);
            if self.is_connected() {
                self.send_outbound(Outbound::Push(p), now);
            } else {
                self.outbound.push_front(Outbound::Push(p));
            }
        }
        self.pump(now);
    }

    fn send_outbound(&mut self, item: Outbound, now: Instant) {
        let Link::Connected { conn, .. } = &mut self.link else {
            return;
        };
        match item {
            Outbound::Push(p) => {
                match conn.push_with_id(&p.content, p.message_id, p.ack_mode, p.timeout, now) {
                    Ok(id) if p.ack_mode != AckMode::None => {
                        self.requests.insert(id, p);
                    }
                    Ok(_) => self.settle(p.request, Ok(())),
                    Err(e) => {
                        self.settle(p.request, Err(SessionError::PushRejected(e.to_string())))
                    }
                }
            }
            Outbound::Ack(token) => {
                let _ = conn.ack(token, now);
            }
        }
    }

    /// Moves the connection's output to actions and its events to session events.
    fn pump(&mut self, now: Instant) {
        loop {
            let Link::Connected { conn, address } = &mut self.link else {
                return;
            };
            let address = address.clone();
            while let Some(b) = conn.poll_transmit() {
                self.actions.push_back(Action::Send(b));
            }
            let Some(e) = conn.poll_event() else {
                return;
            };
            self.on_connection_event(e, address, now);
        }
    }

    fn on_connection_event(&mut self, e: ClientEvent, address: String, now: Instant) {
        match e {
            ClientEvent::Connected {
                profile,
                resumed,
                ticket,
                ..
            } => {
                self.backoff.reset();
                self.conn_established = true;
                if let Some(t) = ticket {
                    self.events.push_back(SessionEvent::TicketUpdated {
                        ticket: t.to_text(),
                    });
                    self.ticket = Some(t);
                }
                let v2 = profile == Profile::V2;
                self.set_state(SessionState::Connected {
                    address: address.clone(),
                    resumed,
                    v2,
                });
                self.events.push_back(SessionEvent::Connected {
                    address,
                    resumed,
                    v2,
                });
                if let (Some((u, t, k)), Link::Connected { conn, .. }) =
                    (self.user.clone(), &mut self.link)
                {
                    let _ = conn.bind(&u, &t, &k, now);
                }
                while let Some(item) = self.outbound.pop_front() {
                    self.send_outbound(item, now);
                }
            }
            ClientEvent::ResumeRejected { .. } => {
                self.ticket = None;
                self.events.push_back(SessionEvent::TicketUpdated {
                    ticket: String::new(),
                });
            }
            ClientEvent::BindOk { user_id } => {
                if self.user.as_ref().is_some_and(|(u, ..)| *u == user_id) {
                    self.settle_binds(Ok(()));
                }
                self.events.push_back(SessionEvent::BindResult {
                    user_id,
                    ok: true,
                    reason: String::new(),
                });
            }
            ClientEvent::Unbound { .. } => {}
            ClientEvent::Message(m) => {
                let ack_id = self.next_ack;
                self.next_ack += 1;
                let needs_ack = m.ack.is_some();
                if let Some(token) = m.ack {
                    self.acks.insert(ack_id, (self.generation, token));
                    while self.acks.len() > self.config.dedup_capacity.max(1) {
                        self.acks.pop_first();
                    }
                }
                self.events.push_back(SessionEvent::Message(Message {
                    content: m.content.to_vec(),
                    message_id: m.message_id,
                    trace_id: m.trace_id,
                    needs_ack,
                    ack_id,
                }));
            }
            ClientEvent::PushAcked { request } => {
                if let Some(p) = self.requests.remove(&request) {
                    self.settle(p.request, Ok(()));
                }
            }
            ClientEvent::PushTimedOut { request } => {
                if let Some(p) = self.requests.remove(&request) {
                    self.retry_up_push(p, "no answer from the server in time".into(), now);
                }
            }
            ClientEvent::PushRefused {
                request,
                code,
                reason,
            } => {
                if let Some(p) = self.requests.remove(&request) {
                    if code == ErrorCode::RETRY_LATER {
                        self.retry_up_push(p, reason, now);
                    } else {
                        self.settle(p.request, Err(SessionError::PushRejected(reason)));
                    }
                }
            }
            ClientEvent::Kicked { device_id, user_id } => {
                // Kicked out ourselves (as mpush's JS client reads it: user and
                // device both ours): forget the user, so that reconnecting does
                // not undo the kick by binding again. The app may bind anew.
                let ours = device_id == self.config.device.device_id
                    && self.user.as_ref().is_some_and(|(u, ..)| *u == user_id);
                if ours {
                    self.user = None;
                    self.fail_binds("kicked");
                }
                self.events
                    .push_back(SessionEvent::Kicked { device_id, user_id });
            }
            ClientEvent::Redirect(r) => {
                // A clean drain: go now (after the server's delay and jitter),
                // without counting it as a failure.
                if !r.address.is_empty() {
                    self.servers.retain(|s| *s != r.address);
                    self.servers.insert(0, r.address.clone());
                    self.next_server = 0;
                }
                let jitter = if r.jitter_ms == 0 {
                    0
                } else {
                    self.rng.next_u64() % u64::from(r.jitter_ms)
                };
                self.actions.push_back(Action::Close);
                self.drop_connection();
                self.backoff.reset();
                let delay = Duration::from_millis(u64::from(r.retry_after_ms) + jitter);
                self.wait(now, delay, format!("redirected: {}", r.reason));
            }
            ClientEvent::HttpResponse { .. } | ClientEvent::HttpTimedOut { .. } => {}
            ClientEvent::Closed { reason, reconnect } => {
                // A refused bind: report it and stop re-binding that user on
                // every reconnect (the server would refuse it again).
                if let ClientCloseReason::ServerError {
                    cmd: Command::BIND,
                    reason: why,
                    ..
                } = &reason
                    && let Some((user_id, ..)) = self.user.take()
                {
                    self.fail_binds(why);
                    self.events.push_back(SessionEvent::BindResult {
                        user_id,
                        ok: false,
                        reason: why.clone(),
                    });
                }
                // A refused transport-profile handshake is not final: the
                // classic handshake comes next (see drop_connection).
                let fall_back = self.conn_transport && !self.conn_established;
                self.actions.push_back(Action::Close);
                self.drop_connection();
                if reconnect || fall_back {
                    self.retry_later(now, reason.to_string());
                } else {
                    self.stop(reason.to_string());
                }
            }
            _ => {}
        }
    }

    fn unix_ms(&self, now: Instant) -> i64 {
        let (base, ms) = self.clock;
        ms + i64::try_from(now.saturating_duration_since(base).as_millis()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_websocket_addresses() {
        for a in [
            "ws://localhost:8088/",
            "ws://LOCALHOST",
            "ws://127.0.0.1:8088",
            "ws://127.9.9.9/x",
            "ws://[::1]:8088/",
            "ws://127.0.0.1:8088?x=1",
        ] {
            assert!(is_loopback_ws(a), "{a}");
        }
        for a in [
            "wss://localhost/",
            "ws://example.com/",
            "ws://10.0.0.1:8088",
            "ws://localhost.example.com/",
            "ws://127.0.0.1.nip.io/",
            "ws://[::2]/",
            "ws://user@evil/",
            "tls://127.0.0.1:3000",
            "127.0.0.1:3000",
        ] {
            assert!(!is_loopback_ws(a), "{a}");
        }
    }

    /// mpush's published key, left as the default or given by value, is
    /// refused for plain connections to other hosts unless the app opts in.
    #[cfg(feature = "classic")]
    #[test]
    fn the_published_key_needs_an_opt_in_for_other_hosts() {
        let device = DeviceInfo {
            device_id: "d1".into(),
            ..DeviceInfo::default()
        };
        let config = |servers: &[&str], key: RsaPublic| {
            SessionConfig::new(
                servers.iter().map(|s| (*s).to_owned()).collect(),
                Arc::new(key),
                device.clone(),
            )
        };
        let pasted =
            RsaPublic::from_text(mpush_protocol::crypto::MPUSH_DEFAULT_PUBLIC_KEY).expect("loads");
        for key in [RsaPublic::mpush_default(), pasted] {
            for ok in [
                &["127.0.0.1:3000"][..],
                &["ws://localhost:8088/", "[::1]:3000"],
                &["tls://push.example.com:3000", "wss://push.example.com/"],
            ] {
                assert!(config(ok, key.clone()).validate().is_ok(), "{ok:?}");
            }
            for bad in [
                &["push.example.com:3000"][..],
                &["127.0.0.1:3000", "ws://10.0.0.1:8088/"],
            ] {
                let e = config(bad, key.clone()).validate().expect_err("refused");
                assert!(e.to_string().contains("allow_published_key"), "{e}");
                let mut c = config(bad, key.clone());
                c.allow_published_key = true;
                assert!(c.validate().is_ok(), "opted in");
            }
            let mut c = config(&[], key.clone());
            c.allocator_url = Some("http://alloc.example.com:9999/".into());
            assert!(c.validate().is_err(), "an allocator on another host");
            c.allocator_url = Some("http://127.0.0.1@alloc.example.com/".into());
            assert!(c.validate().is_err(), "userinfo is not the host");
        }
    }

    #[test]
    fn loopback_addresses_in_every_form() {
        for a in [
            "127.0.0.1:3000",
            "tls://localhost:3000",
            "http://user:pw@127.0.0.1:9999/",
            "[::1]:3000",
        ] {
            assert!(is_loopback_address(a), "{a}");
        }
        for a in [
            "10.0.0.1:3000",
            "http://127.0.0.1@evil.example/",
            "push.example.com:3000",
        ] {
            assert!(!is_loopback_address(a), "{a}");
        }
    }
}
