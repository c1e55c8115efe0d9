//! `ClientConnection`: one connection seen from the client, sans-IO. It behaves
//! like mpush-client-java 0.8.1 on the legacy profile (spec section 9) and
//! negotiates the v2 profile when configured to offer it.
//!
//! It starts talking as soon as it is created (fast connect when given a valid
//! ticket, a full handshake otherwise). Reconnecting is not its job: it ends
//! with `ClientEvent::Closed { reconnect, .. }` and the session layer decides.
//!
//! - **Inputs**: `handle_input` (bytes from the socket), `handle_timeout`
//!   (time passed), and the app's requests `bind`, `unbind`, `push`,
//!   `push_with_id`, `http`, `ack`, `close`.
//! - **Outputs**: `poll_transmit` (bytes for the socket), `poll_event`
//!   (`ClientEvent`s) and `poll_timeout`.
//! - **Queries**: `profile`, `heartbeat`, `is_established`, `is_closed`;
//!   `take_dedup` hands the dedup window to the next connection.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the machine, its state, the verbs, packet dispatch, sealing and timers |
//! | `config.rs` | `ClientConfig` |
//! | `events.rs` | `ClientEvent`, `ClientCloseReason`, `AckToken`, `IncomingPush`, `ClientError` |
//! | `handshake.rs` | full handshake and fast connect, and the classic ciphers |
//! | `requests.rs` | bind, unbind, up-push, HTTP proxy; OK and ERROR |
//! | `push.rs` | pushes received, dedup, ACKs |

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand_core::SeedableRng;
use web_time::Instant;

use crate::crypto::{AesKey, Rng};
use crate::dedup::DedupWindow;
use crate::error::ProtocolError;
use crate::message::{Body, HttpResponse, Kick, Redirect};
use crate::packet::{Command, Decoder, Flags, Frame, HEARTBEAT_BYTE, Packet};
use crate::seal::{Sealer, Side};
use crate::session::{Profile, ResumeTicket};
use crate::small_map::SmallMap;

mod config;
mod events;
mod handshake;
mod push;
mod requests;

pub use config::ClientConfig;
pub use events::{AckToken, ClientCloseReason, ClientError, ClientEvent, IncomingPush};

#[derive(Debug)]
enum State {
    Handshaking {
        client_key: AesKey,
        iv: [u8; 16],
    },
    Resuming {
        ticket: ResumeTicket,
        client_nonce: [u8; 16],
    },
    Established,
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestKind {
    Handshake,
    Bind,
    Unbind,
    Push,
    Http,
}

#[derive(Debug)]
struct Pending {
    kind: RequestKind,
    deadline: Instant,
    retries_left: u32,
    /// The exact packet to resend (mpush resends the sealed bytes).
    resend: Option<Bytes>,
    user_id: String,
}

pub struct ClientConnection {
    config: Arc<ClientConfig>,
    rng: Rng,
    decoder: Decoder,
    inbuf: BytesMut,
    out: BytesMut,
    events: VecDeque<ClientEvent>,
    state: State,
    sealer: Sealer,
    profile: Profile,
    heartbeat: Duration,
    last_read: Instant,
    last_write: Instant,
    clock_base: (Instant, i64),
    next_request: i32,
    pending: SmallMap<i32, Pending>,
    acks_out: Vec<AckToken>,
    dedup: DedupWindow,
    legacy_dedup: DedupWindow,
    /// ADR 0008: the fast connect's answer said the server bound this
    /// connection again to the session's user.
    binding_kept: bool,
    /// The `features` bits the server echoed in HANDSHAKE_OK (0 on the
    /// legacy profile, and before a handshake completed).
    server_features: u32,
}

impl std::fmt::Debug for ClientConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConnection")
            .field("state", &self.state)
            .field("profile", &self.profile)
            .finish_non_exhaustive()
    }
}

impl ClientConnection {
    /// Starts a connection on a freshly opened socket at `now` (wall clock
    /// `unix_ms`). A valid `ticket` means fast connect. `dedup` carries the
    /// ids seen on earlier connections; take it back with `take_dedup`.
    pub fn new(
        config: Arc<ClientConfig>,
        seed: [u8; 32],
        now: Instant,
        unix_ms: i64,
        ticket: Option<ResumeTicket>,
        dedup: DedupWindow,
    ) -> Self {
        let mut c = Self {
            decoder: Decoder::new(config.max_body),
            sealer: Sealer::new(Side::Client, config.compress_over, config.max_body),
            config,
            rng: Rng::from_seed(seed),
            inbuf: BytesMut::new(),
            out: BytesMut::new(),
            events: VecDeque::new(),
            state: State::Closed,
            profile: Profile::Legacy,
            heartbeat: Duration::ZERO,
            last_read: now,
            last_write: now,
            clock_base: (now, unix_ms),
            next_request: 1,
            pending: SmallMap::new(),
            acks_out: Vec::new(),
            dedup,
            legacy_dedup: DedupWindow::new(256),
            binding_kept: false,
            server_features: 0,
        };
        // A ticket resumes only into its own profile (a transport session
        // only over a secure transport, a classic one only outside it).
        let transport = c.transport();
        let usable = |t: &ResumeTicket| {
            t.expire_at_ms > unix_ms
                && !t.session_id.is_empty()
                && t.secret.is_transport() == transport
        };
        #[cfg(not(feature = "classic"))]
        if !transport {
            // No RSA or AES here: only the transport-secured profile.
            c.close_with(
                ClientCloseReason::Protocol(ProtocolError::State(handshake::NO_CLASSIC)),
                false,
            );
            return c;
        }
        match ticket.filter(usable) {
            Some(t) => c.start_resume(t, now),
            None => c.start_handshake(now),
        }
        c
    }

    pub fn profile(&self) -> Profile {
        self.profile
    }

    /// On the transport-secured profile (asked for by the config).
    fn transport(&self) -> bool {
        self.config.transport_secured && self.config.offer_v2
    }

    pub fn heartbeat(&self) -> Duration {
        self.heartbeat
    }

    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established)
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// ADR 0008: this connection was resumed already bound to the user the
    /// session had bound (the server kept the binding); that user gets its
    /// pushes without a BIND. A client that wants another user, other tags
    /// or no user binds or unbinds as usual.
    pub fn binding_kept(&self) -> bool {
        self.binding_kept
    }

    /// The `Capabilities.features` bits the server echoed in this session's
    /// HANDSHAKE_OK (`v2::FEATURE_*`): what it honours. 0 on the legacy
    /// profile; a resumed connection has no HANDSHAKE_OK, so 0 there too
    /// (its `binding_kept` says what ADR 0008 needs).
    pub fn server_features(&self) -> u32 {
        self.server_features
    }

    /// The dedup window, to hand to the next connection.
    pub fn take_dedup(&mut self) -> DedupWindow {
        std::mem::take(&mut self.dedup)
    }

    // ----- driver verbs -------------------------------------------------

    pub fn handle_input(&mut self, data: &[u8], now: Instant) {
        if self.is_closed() {
            return;
        }
        self.last_read = now;
        self.inbuf.extend_from_slice(data);
        while !self.is_closed() {
            match self.decoder.decode(&mut self.inbuf) {
                Ok(None) => break,
                Ok(Some(Frame::Heartbeat)) => {}
                Ok(Some(Frame::Packet(p))) => {
                    if let Err(e) = self.handle_packet(p, now) {
                        self.close_with(ClientCloseReason::Protocol(e), true);
                    }
                }
                Err(e) => self.close_with(ClientCloseReason::Protocol(e.into()), true),
            }
        }
        self.flush_acks(now);
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if self.is_closed() {
            return;
        }
        let due: Vec<i32> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(mut p) = self.pending.remove(&id) else {
                continue;
            };
            if p.retries_left > 0
                && let Some(bytes) = p.resend.clone()
            {
                p.retries_left -= 1;
                p.deadline = now + self.config.bind_timeout;
                self.write(&bytes, now);
                self.pending.insert(id, p);
                continue;
            }
            match p.kind {
                RequestKind::Handshake => {
                    return self.close_with(ClientCloseReason::HandshakeTimeout, true);
                }
                RequestKind::Bind => {
                    return self.close_with(ClientCloseReason::RequestTimeout(Command::BIND), true);
                }
                RequestKind::Unbind => {}
                RequestKind::Push => self
                    .events
                    .push_back(ClientEvent::PushTimedOut { request: id }),
                RequestKind::Http => self
                    .events
                    .push_back(ClientEvent::HttpTimedOut { request: id }),
            }
        }
        if self.is_established() {
            if now >= self.read_deadline() {
                return self.close_with(ClientCloseReason::HeartbeatTimeout, true);
            }
            if now >= self.ping_deadline() {
                self.write(&[HEARTBEAT_BYTE], now);
            }
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_closed() {
            return None;
        }
        let mut t = self.pending.values().map(|p| p.deadline).min();
        if self.is_established() {
            let hb = self.ping_deadline().min(self.read_deadline());
            t = Some(t.map_or(hb, |x| x.min(hb)));
        }
        t
    }

    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        (!self.out.is_empty()).then(|| self.out.split().freeze())
    }

    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    // ----- commands -----------------------------------------------------

    pub fn close(&mut self) {
        self.close_with(ClientCloseReason::Local, false);
    }

    // ----- starting -----------------------------------------------------

    // ----- packet handling ----------------------------------------------

    fn handle_packet(&mut self, p: Packet, now: Instant) -> Result<(), ProtocolError> {
        match p.cmd {
            Command::HANDSHAKE => self.on_handshake_ok(&p, now),
            Command::FAST_CONNECT => self.on_fast_connect_ok(&p, now),
            Command::OK => self.on_ok(&p),
            Command::ERROR => self.on_error(&p, now),
            Command::PUSH => self.on_push(&p),
            Command::ACK => {
                if self
                    .pending
                    .get(&p.session_id)
                    .is_some_and(|r| r.kind == RequestKind::Push)
                {
                    self.pending.remove(&p.session_id);
                    self.events.push_back(ClientEvent::PushAcked {
                        request: p.session_id,
                    });
                }
                Ok(())
            }
            Command::KICK => {
                let k = Kick::from_bytes(&self.open(&p)?)?;
                self.events.push_back(ClientEvent::Kicked {
                    device_id: k.device_id,
                    user_id: k.user_id,
                });
                Ok(())
            }
            Command::REDIRECT if self.profile == Profile::V2 && self.is_established() => {
                let r = Redirect::from_bytes(&self.open(&p)?)?;
                self.events.push_back(ClientEvent::Redirect(r));
                Ok(())
            }
            Command::HTTP_PROXY => {
                if self
                    .pending
                    .get(&p.session_id)
                    .is_some_and(|r| r.kind == RequestKind::Http)
                {
                    self.pending.remove(&p.session_id);
                    let response = HttpResponse::from_bytes(&self.open(&p)?)?;
                    self.events.push_back(ClientEvent::HttpResponse {
                        request: p.session_id,
                        response,
                    });
                }
                Ok(())
            }
            // Like the Java client: unknown commands are ignored.
            _ => Ok(()),
        }
    }

    // ----- helpers ------------------------------------------------------

    fn open(&self, p: &Packet) -> Result<Bytes, ProtocolError> {
        if self.profile == Profile::V2
            && !self.transport()
            && self.is_established()
            && (!p.flags.contains(Flags::CRYPTO) || p.body.is_empty())
        {
            return Err(ProtocolError::State("v2 requires sealed bodies"));
        }
        self.sealer.open(p)
    }

    fn sealed_bytes(&mut self, cmd: Command, id: i32, flags: Flags, body: &[u8]) -> Bytes {
        Frame::Packet(self.sealer.seal(&mut self.rng, cmd, id, flags, body)).to_bytes()
    }

    fn write(&mut self, bytes: &[u8], now: Instant) {
        self.out.extend_from_slice(bytes);
        self.last_write = now;
    }

    fn ready(&self) -> Result<(), ClientError> {
        match self.state {
            State::Established => Ok(()),
            State::Closed => Err(ClientError::Closed),
            _ => Err(ClientError::NotConnected),
        }
    }

    fn next_id(&mut self) -> i32 {
        let id = self.next_request;
        self.next_request = if id >= 0x3FFF_FFFF { 1 } else { id + 1 };
        id
    }

    /// Ping when nothing was written for `heartbeat - 1 s` (mpush's rule).
    fn ping_deadline(&self) -> Instant {
        self.last_write + self.heartbeat.saturating_sub(Duration::from_secs(1))
    }

    /// Give up when nothing was read for two heartbeats (plus slack): mpush
    /// reconnects on the second consecutive missed check.
    fn read_deadline(&self) -> Instant {
        self.last_read + (self.heartbeat + Duration::from_secs(1)) * 2
    }

    fn close_with(&mut self, reason: ClientCloseReason, reconnect: bool) {
        if self.is_closed() {
            return;
        }
        self.state = State::Closed;
        self.pending.clear();
        self.events
            .push_back(ClientEvent::Closed { reason, reconnect });
    }

    fn unix_ms(&self, now: Instant) -> i64 {
        let (base, ms) = self.clock_base;
        ms + i64::try_from(now.saturating_duration_since(base).as_millis()).unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ErrorCode;

    /// A disconnect's reason reaches apps as text (`SessionState::Disconnected`):
    /// words and the server's code, not the enum's Debug form.
    #[test]
    fn close_reasons_read_as_words() {
        let cases = [
            (
                ClientCloseReason::HeartbeatTimeout,
                "nothing from the server within the heartbeat",
            ),
            (
                ClientCloseReason::RequestTimeout(Command::BIND),
                "the server did not answer BIND in time",
            ),
            (
                ClientCloseReason::RequestTimeout(Command(99)),
                "the server did not answer Command(99) in time",
            ),
            (
                ClientCloseReason::ServerError {
                    cmd: Command::BIND,
                    code: ErrorCode::RETRY_LATER,
                    reason: "busy".into(),
                },
                "the server answered BIND with error 105: busy",
            ),
            (
                ClientCloseReason::Protocol(ProtocolError::State("x")),
                "protocol error: x",
            ),
        ];
        for (reason, text) in cases {
            assert_eq!(reason.to_string(), text);
        }
    }
}
