//! `Session`: the client across reconnects, sans-IO. It owns the current
//! `ClientConnection`, the backoff, the dedup window, the resume ticket, the
//! user to re-bind and the outbound queue, and speaks in actions (open a
//! connection, send bytes, close), events and a next deadline.
//!
//! The driver: on `Action::Open` it connects and calls `handle_opened` (or
//! `handle_open_failed`); it feeds received bytes to `handle_input`, a closed
//! socket to `handle_closed`, and time to `handle_timeout` at `poll_timeout`.
//! After every call it drains `poll_action` and `poll_event`.
//!
//! The session is a folder by responsibility: `config.rs` (what it is
//! configured with), `events.rs` (what it says), `commands.rs` (the app's
//! commands and how requests settle), `link.rs` (the connection across
//! reconnects); this file holds the state and the driver's inputs and
//! queries.

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

mod commands;
mod config;
mod events;
mod link;
#[cfg(test)]
mod tests;

pub use config::*;
pub use events::*;

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
    /// The (user, tags, token) the server last confirmed on this session's
    /// chain of tickets: a fast connect that comes back with the binding
    /// kept (ADR 0008) needs no BIND while it is still `user`.
    confirmed: Option<(String, String, String)>,
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
            confirmed: None,
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

    /// The allocator's list (`Action::FetchServers`), parsed with
    /// [`parse_server_list`].
    pub fn handle_servers(&mut self, list: Vec<String>, now: Instant) {
        if !matches!(self.link, Link::Fetching) {
            return;
        }
        if list.is_empty() {
            self.retry_later(now, "the allocator listed no server".into());
        } else {
            self.servers = list;
            self.next_server = 0;
            self.tried = 0;
            self.open_next(now);
        }
    }

    /// The allocator could not be asked: why.
    pub fn handle_servers_failed(&mut self, reason: &str, now: Instant) {
        if matches!(self.link, Link::Fetching) {
            self.retry_later(now, format!("allocator: {reason}"));
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

    pub(super) fn resume(&mut self, now: Instant) {
        self.backoff.reset();
        if !self.is_paused()
            && let Link::Waiting { .. } = self.link
        {
            self.connect(now);
        }
    }
}
