//! An in-memory client/server pair on a fake clock, joined by links that can
//! lose, delay (and so reorder) and duplicate whole frames. The pair plays the
//! server's driver too: it stores sessions, answers resume lookups and accepts
//! binds, so tests exercise the machines exactly as real drivers use them.
//!
//! Everything is seeded: the same seed replays the same run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand_core::{Rng as _, SeedableRng};
use web_time::Instant;

use crate::client::{ClientConfig, ClientConnection, ClientEvent};
use crate::crypto::{Rng, RsaPrivate, random_array};
use crate::dedup::DedupWindow;
use crate::packet::Decoder;
use crate::server::{Answer, BindRefusal, ServerConfig, ServerConnection, ServerEvent};
use crate::session::{DeviceInfo, ResumeTicket, SessionRecord};

/// Fault settings of one direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkFaults {
    /// Chance that a frame is lost.
    pub loss: f64,
    /// Chance that a frame arrives twice.
    pub duplicate: f64,
    /// Base one-way delay.
    pub latency: Duration,
    /// Extra random delay up to this bound; frames can overtake each other.
    pub jitter: Duration,
}

impl LinkFaults {
    /// A perfect link with 10 ms latency.
    pub fn perfect() -> Self {
        Self {
            loss: 0.0,
            duplicate: 0.0,
            latency: Duration::from_millis(10),
            jitter: Duration::ZERO,
        }
    }

    /// Loses, duplicates and reorders frames.
    pub fn hostile() -> Self {
        Self {
            loss: 0.1,
            duplicate: 0.1,
            latency: Duration::from_millis(10),
            jitter: Duration::from_millis(50),
        }
    }
}

/// One direction: frames in flight with their arrival times.
#[derive(Debug)]
pub struct Link {
    pub faults: LinkFaults,
    rng: Rng,
    seq: u64,
    in_flight: Vec<(Instant, u64, Bytes)>,
    /// Frames sent, frames lost, frames duplicated.
    pub stats: (u64, u64, u64),
}

impl Link {
    pub fn new(faults: LinkFaults, seed: u64) -> Self {
        Self {
            faults,
            rng: Rng::seed_from_u64(seed),
            seq: 0,
            in_flight: Vec::new(),
            stats: (0, 0, 0),
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.rng.next_u64() as f64 / u64::MAX as f64) < p
    }

    fn delay(&mut self) -> Duration {
        let j = self.faults.jitter.as_micros() as u64;
        let extra = if j == 0 { 0 } else { self.rng.next_u64() % j };
        self.faults.latency + Duration::from_micros(extra)
    }

    /// Cuts a transmit into frames and schedules each.
    pub fn send(&mut self, bytes: Bytes, now: Instant) {
        let mut buf = BytesMut::from(&bytes[..]);
        let decoder = Decoder::new(usize::MAX >> 1);
        while let Ok(Some(frame)) = decoder.decode(&mut buf) {
            self.stats.0 += 1;
            if self.chance(self.faults.loss) {
                self.stats.1 += 1;
                continue;
            }
            let copies = if self.chance(self.faults.duplicate) {
                self.stats.2 += 1;
                2
            } else {
                1
            };
            let wire = frame.to_bytes();
            for _ in 0..copies {
                let at = now + self.delay();
                self.seq += 1;
                self.in_flight.push((at, self.seq, wire.clone()));
            }
        }
    }

    pub fn next_arrival(&self) -> Option<Instant> {
        self.in_flight.iter().map(|f| f.0).min()
    }

    /// Frames due by `now`, in arrival order.
    pub fn deliver(&mut self, now: Instant) -> Vec<Bytes> {
        self.in_flight.sort_by_key(|f| (f.0, f.1));
        let n = self.in_flight.iter().take_while(|f| f.0 <= now).count();
        self.in_flight.drain(..n).map(|f| f.2).collect()
    }

    pub fn clear(&mut self) {
        self.in_flight.clear();
    }
}

/// How the simulated server driver answers binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindPolicy {
    Accept,
    Refuse(String),
}

/// A client and a server connection over two links, on a fake clock.
pub struct Pair {
    pub now: Instant,
    pub start: Instant,
    pub unix_ms: i64,
    pub client: ClientConnection,
    pub server: ServerConnection,
    pub c2s: Link,
    pub s2c: Link,
    pub client_events: Vec<ClientEvent>,
    pub server_events: Vec<ServerEvent>,
    /// The simulated session store.
    pub sessions: HashMap<String, SessionRecord>,
    pub bind_policy: BindPolicy,
    /// How the simulated server answers up-pushes: `None` accepts them.
    pub up_push_refusal: Option<crate::server::UpPushRefusal>,
    pub client_config: Arc<ClientConfig>,
    pub server_config: Arc<ServerConfig>,
    /// The server's connections count as TLS (ADR 0005): `secure()`.
    pub secure_transport: bool,
    /// How the simulated driver answers `RestoreRequested` (ADR 0008), and
    /// whether it holds the answer back (the test answers).
    pub restore_ok: bool,
    pub hold_restore: bool,
    rng: Rng,
}

/// Everything a server machine queued: its frames (decoded) and its events.
pub fn drain_server(s: &mut ServerConnection) -> (Vec<crate::packet::Frame>, Vec<ServerEvent>) {
    let mut buf = bytes::BytesMut::new();
    while let Some(b) = s.poll_transmit() {
        buf.extend_from_slice(&b);
    }
    let mut frames = Vec::new();
    while let Ok(Some(f)) = crate::packet::Decoder::new(1 << 20).decode(&mut buf) {
        frames.push(f);
    }
    let events = std::iter::from_fn(|| s.poll_event()).collect();
    (frames, events)
}

/// mpush's default key, loaded once (RSA prime recovery is not free).
pub fn default_key() -> Arc<RsaPrivate> {
    static KEY: std::sync::OnceLock<Arc<RsaPrivate>> = std::sync::OnceLock::new();
    KEY.get_or_init(|| Arc::new(RsaPrivate::mpush_default()))
        .clone()
}

pub fn test_device() -> DeviceInfo {
    DeviceInfo {
        device_id: "dev-1".into(),
        os_name: "android".into(),
        os_version: "6.0".into(),
        client_version: "2.0".into(),
    }
}

impl Pair {
    /// A pair with default configs; `offer_v2`/`enable_v2` pick the profiles.
    pub fn new(seed: u64, client_v2: bool, server_v2: bool, faults: LinkFaults) -> Self {
        let key = default_key();
        let mut cc = ClientConfig::new(Arc::new(key.public()), test_device());
        cc.offer_v2 = client_v2;
        let mut sc = ServerConfig::new(key);
        sc.enable_v2 = server_v2;
        Self::with_configs(seed, cc, sc, faults, None)
    }

    pub fn with_configs(
        seed: u64,
        client_config: ClientConfig,
        server_config: ServerConfig,
        faults: LinkFaults,
        ticket: Option<ResumeTicket>,
    ) -> Self {
        let mut rng = Rng::seed_from_u64(seed);
        let now = Instant::now();
        let unix_ms = 1_700_000_000_000;
        let client_config = Arc::new(client_config);
        let server_config = Arc::new(server_config);
        let client = ClientConnection::new(
            client_config.clone(),
            random_array(&mut rng),
            now,
            unix_ms,
            ticket,
            DedupWindow::default(),
        );
        let server =
            ServerConnection::new(server_config.clone(), random_array(&mut rng), now, unix_ms);
        let c2s = Link::new(faults, rng.next_u64());
        let s2c = Link::new(faults, rng.next_u64());
        let mut pair = Self {
            now,
            start: now,
            unix_ms,
            client,
            server,
            c2s,
            s2c,
            client_events: Vec::new(),
            server_events: Vec::new(),
            sessions: HashMap::new(),
            bind_policy: BindPolicy::Accept,
            up_push_refusal: None,
            client_config,
            server_config,
            secure_transport: false,
            restore_ok: true,
            hold_restore: false,
            rng,
        };
        pair.pump();
        pair
    }

    /// Marks the server's connection (and those of later reconnects) as
    /// arrived over TLS. Call before stepping: nothing reached it yet.
    pub fn secure(mut self) -> Self {
        self.secure_transport = true;
        self.server.set_transport_secured(true);
        self
    }

    /// Elapsed fake time.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Drops both connections and opens new ones on fresh links (same store,
    /// same clock), the client resuming with `ticket` and keeping its dedup window.
    pub fn reconnect(&mut self, ticket: Option<ResumeTicket>) {
        let dedup = self.client.take_dedup();
        let unix = self.unix_ms + (self.now - self.start).as_millis() as i64;
        self.client = ClientConnection::new(
            self.client_config.clone(),
            random_array(&mut self.rng),
            self.now,
            unix,
            ticket,
            dedup,
        );
        self.server = ServerConnection::new(
            self.server_config.clone(),
            random_array(&mut self.rng),
            self.now,
            unix,
        );
        self.server.set_transport_secured(self.secure_transport);
        self.c2s.clear();
        self.s2c.clear();
        self.pump();
    }

    /// Moves transmits onto links and handles driver round trips until quiet.
    pub fn pump(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(b) = self.client.poll_transmit() {
                self.c2s.send(b, self.now);
                progressed = true;
            }
            while let Some(b) = self.server.poll_transmit() {
                self.s2c.send(b, self.now);
                progressed = true;
            }
            while let Some(e) = self.client.poll_event() {
                self.client_events.push(e);
                progressed = true;
            }
            while let Some(e) = self.server.poll_event() {
                self.serve(&e);
                self.server_events.push(e);
                progressed = true;
            }
            if !progressed {
                break;
            }
        }
    }

    /// The simulated server driver.
    fn serve(&mut self, e: &ServerEvent) {
        match e {
            ServerEvent::HandshakeCompleted {
                session: Some(session),
                ..
            } => {
                self.sessions
                    .insert(session.session_id.clone(), session.clone());
            }
            ServerEvent::DecryptRequested { ciphertext } => {
                let plain = self
                    .server_config
                    .private_key
                    .decrypt(&mut self.rng, ciphertext);
                self.server
                    .handle_answer(Answer::Decrypted(plain), self.now);
            }
            ServerEvent::Resumed {
                session, replaces, ..
            } => {
                if let Some(old) = replaces
                    && self.sessions.remove(old).is_none()
                {
                    self.server.close();
                }
                if let Some(s) = session {
                    self.sessions.insert(s.session_id.clone(), s.clone());
                }
            }
            ServerEvent::ResumeRequested { session_id, .. } => {
                let record = self.sessions.get(session_id).cloned();
                self.server.handle_answer(Answer::Session(record), self.now);
            }
            ServerEvent::BindRequested {
                request, user_id, ..
            } => {
                let result = match &self.bind_policy {
                    BindPolicy::Accept => Ok(()),
                    BindPolicy::Refuse(r) => Err(BindRefusal::Unauthorized(r.clone())),
                };
                if result.is_ok()
                    && let ServerEvent::BindRequested { tags, .. } = e
                {
                    self.keep(Some(crate::session::KeptBinding {
                        user_id: user_id.clone(),
                        tags: tags.clone(),
                        expires_at_ms: 0,
                    }));
                }
                let answer = Answer::Bind {
                    request: *request,
                    user_id: user_id.clone(),
                    result,
                };
                self.server.handle_answer(answer, self.now);
            }
            ServerEvent::RestoreRequested { .. } if !self.hold_restore => {
                if !self.restore_ok {
                    self.keep(None);
                }
                self.server
                    .handle_answer(Answer::Restored(self.restore_ok), self.now);
            }
            ServerEvent::ForgetBinding { session_id } => {
                if let Some(s) = self.sessions.get_mut(session_id) {
                    s.binding = None;
                }
            }
            ServerEvent::UnbindRequested { request, .. } => {
                self.keep(None);
                let answer = Answer::Unbind {
                    request: *request,
                    ok: true,
                };
                self.server.handle_answer(answer, self.now);
            }
            ServerEvent::UpPush { reply, .. } => {
                let result = match &self.up_push_refusal {
                    None => Ok(()),
                    Some(r) => Err(r.clone()),
                };
                let answer = Answer::UpPush {
                    reply: *reply,
                    result,
                };
                self.server.handle_answer(answer, self.now);
            }
            _ => {}
        }
    }

    /// ADR 0008: what the driver keeps with the connection's session.
    fn keep(&mut self, binding: Option<crate::session::KeptBinding>) {
        if let Some(id) = self.server.kept_session()
            && let Some(s) = self.sessions.get_mut(&id)
        {
            s.binding = binding;
        }
    }

    /// Advances to the next arrival or timeout (at most `limit`) and handles it.
    /// Returns false when nothing is scheduled before `limit`.
    pub fn step(&mut self, limit: Instant) -> bool {
        let next = [
            self.c2s.next_arrival(),
            self.s2c.next_arrival(),
            self.client.poll_timeout(),
            self.server.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next.filter(|t| *t <= limit) else {
            self.now = self.now.max(limit);
            return false;
        };
        self.now = self.now.max(next);
        for b in self.c2s.deliver(self.now) {
            self.server.handle_input(&b, self.now);
            self.pump();
        }
        for b in self.s2c.deliver(self.now) {
            self.client.handle_input(&b, self.now);
            self.pump();
        }
        if self.client.poll_timeout().is_some_and(|t| t <= self.now) {
            self.client.handle_timeout(self.now);
        }
        if self.server.poll_timeout().is_some_and(|t| t <= self.now) {
            self.server.handle_timeout(self.now);
        }
        self.pump();
        true
    }

    /// Runs for `d` of fake time.
    pub fn run_for(&mut self, d: Duration) {
        let limit = self.now + d;
        while self.step(limit) {}
    }

    /// Runs until `cond` holds, for at most `max` of fake time; true if it held.
    pub fn run_until(&mut self, max: Duration, mut cond: impl FnMut(&Self) -> bool) -> bool {
        let limit = self.now + max;
        loop {
            if cond(self) {
                return true;
            }
            if !self.step(limit) {
                return cond(self);
            }
        }
    }
}
