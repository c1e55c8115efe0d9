//! `ServerConnection`: one client connection seen from the server, sans-IO.
//!
//! A driver (the server's gateway, a test, a fuzz target) owns one machine
//! per socket and speaks to it in three kinds of call:
//!
//! - **Inputs**: `handle_input` (bytes from the socket), `handle_timeout`
//!   (time passed), `handle_answer` (the answer to an event that asked for a
//!   round trip: a decryption, a session lookup, a bind, an unbind, an
//!   up-push, an HTTP proxy request), and the commands `push`, `kick`,
//!   `redirect`, `close`.
//! - **Outputs**: `poll_transmit` (bytes for the socket), `poll_event`
//!   (`ServerEvent`s to act on) and `poll_timeout` (when to call
//!   `handle_timeout`). After every input the driver drains them.
//! - **Queries**: `profile`, `user`, `heartbeat`, `is_established`,
//!   `is_closed`, `is_transport`, `inflight`.
//!
//! The folder follows the connection's life:
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the machine, its state, the verbs, packet dispatch, sealing and replies |
//! | `config.rs` | `ServerConfig` |
//! | `events.rs` | `ServerEvent`, `Answer`, `OutboundPush` and the refusals |
//! | `handshake.rs` | the full handshake (RSA + AES, plaintext, transport-secured) |
//! | `resume.rs` | fast connect |
//! | `requests.rs` | bind, unbind, up-push, HTTP proxy |
//! | `push.rs` | pushes, ACKs, kick, redirect |
//! | `pending.rs` | pushes awaiting their ACK (shared with the JSON machine) |

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand_core::SeedableRng;
use web_time::Instant;

use crate::crypto::Rng;
use crate::error::{FrameError, ProtocolError};
use crate::liveness::{Check, Liveness};
use crate::message::{Ack, Body, ErrorCode, ErrorMessage, FastConnect, OkMessage};
use crate::packet::{Command, Decoder, Flags, Frame, Packet};
use crate::seal::{Sealer, Side};
use crate::session::Profile;
use pending::PendingPushes;

mod config;
mod events;
mod handshake;
pub(crate) mod pending;
mod push;
mod requests;
mod resume;

pub use config::ServerConfig;
pub use events::{
    Answer, BindRefusal, CloseReason, OutboundPush, PushError, ServerEvent, UpPushRefusal,
    UpPushReply,
};

#[derive(Debug)]
enum State {
    AwaitHandshake,
    AwaitDecrypt {
        request: i32,
        flags: Flags,
    },
    AwaitResume {
        /// Boxed: every connection's state is as small as its common case.
        request: Box<FastConnect>,
        packet_id: i32,
    },
    /// ADR 0008: resumed, binding the kept user before FAST_CONNECT_OK.
    AwaitRestore(Box<resume::PendingRestore>),
    Established,
    Closed,
}

/// First push id: high, so pushes do not collide with the small request ids a
/// Java client is waiting on (spec 3.3).
const FIRST_PUSH_ID: i32 = 0x4000_0000;

pub struct ServerConnection {
    config: Arc<ServerConfig>,
    /// Until the connection is established (handshake keys, session ids);
    /// dropped then: later nonces are counted (`Sealer::count_nonces`).
    rng: Option<Box<Rng>>,
    decoder: Decoder,
    inbuf: BytesMut,
    out: BytesMut,
    events: VecDeque<ServerEvent>,
    state: State,
    sealer: Sealer,
    profile: Profile,
    /// The bound user. A boxed `str`, not a `String`: 8 bytes less, which
    /// keeps the machine in jemalloc's 384-byte class (see
    /// `an_idle_machine_stays_in_its_allocation_class`).
    user: Option<Box<str>>,
    liveness: Liveness,
    clock_base: (Instant, i64),
    next_push_id: i32,
    pending: PendingPushes,
    /// A connection gets one full handshake and one fast connect attempt.
    handshake_seen: bool,
    resume_seen: bool,
    /// What the transport allows (ADR 0005); one byte, so an idle
    /// connection stays the size it was.
    transport: Transport,
    /// ADR 0008, when the client asked to keep its binding and this server
    /// does: the id of this connection's session (the 16 bytes of its hex
    /// form), for the driver to keep a binding under.
    /// All zeros: none (inline, not an `Option`: an idle connection is 8
    /// bytes smaller; a random id is all zeros with probability 2^-128, and
    /// that id would only lose its kept binding).
    kept_session: [u8; 16],
}

/// ADR 0005: where a connection stands with the transport-secured profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// Not known to be TLS: the profile is refused.
    Plain,
    /// The driver says it arrived over TLS: the profile is allowed.
    Secure,
    /// Established on the profile: no cipher, plaintext bodies.
    Profile,
}

impl std::fmt::Debug for ServerConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConnection")
            .field("state", &self.state)
            .field("profile", &self.profile)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl ServerConnection {
    /// A new connection accepted at `now`, when the wall clock read `unix_ms`.
    /// `seed` must come from a cryptographically secure source.
    pub fn new(config: Arc<ServerConfig>, seed: [u8; 32], now: Instant, unix_ms: i64) -> Self {
        let hb = config.initial_heartbeat;
        Self {
            decoder: Decoder::new(config.max_body),
            sealer: Sealer::new(Side::Server, config.compress_over, config.max_inflated),
            pending: PendingPushes::new(config.max_inflight),
            rng: Some(Box::new(Rng::from_seed(seed))),
            inbuf: BytesMut::new(),
            out: BytesMut::new(),
            events: VecDeque::new(),
            state: State::AwaitHandshake,
            profile: Profile::Legacy,
            user: None,
            liveness: Liveness::new(
                now,
                config.handshake_timeout,
                hb,
                // mpush counts a check as missed a second after the interval.
                Duration::from_secs(1),
                config.max_heartbeat_misses,
            ),
            clock_base: (now, unix_ms),
            next_push_id: FIRST_PUSH_ID,
            handshake_seen: false,
            resume_seen: false,
            transport: Transport::Plain,
            kept_session: [0; 16],
            config,
        }
    }

    pub fn profile(&self) -> Profile {
        self.profile
    }

    /// Before any input: this connection arrived over TLS (the server's own
    /// listener, or a trusted proxy that says so), so the client may use the
    /// transport-secured profile (ADR 0005). Never set it for anything else.
    pub fn set_transport_secured(&mut self, secure: bool) {
        self.transport = if secure {
            Transport::Secure
        } else {
            Transport::Plain
        };
    }

    /// Established on the transport-secured profile.
    pub fn is_transport(&self) -> bool {
        self.transport == Transport::Profile
    }

    fn transport_secured(&self) -> bool {
        self.transport != Transport::Plain
    }

    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// ADR 0008: the id of this connection's session when its client
    /// negotiated `FEATURE_KEEP_BINDING` with a server that keeps bindings.
    /// The driver then keeps each binding under it (a BIND that succeeded
    /// writes it, an UNBIND or a kick clears it).
    pub fn kept_session(&self) -> Option<String> {
        (self.kept_session != [0; 16]).then(|| hex_id(&self.kept_session))
    }

    pub fn heartbeat(&self) -> Duration {
        self.liveness.interval()
    }

    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established)
    }

    /// True once closed: drain `poll_transmit` one last time, then drop the socket.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Pushes waiting for their ACK.
    pub fn inflight(&self) -> usize {
        self.pending.len()
    }

    // ----- driver verbs -------------------------------------------------

    /// Bytes received from the socket.
    pub fn handle_input(&mut self, data: &[u8], now: Instant) {
        if self.is_closed() {
            return;
        }
        self.liveness.heard(now);
        self.inbuf.extend_from_slice(data);
        self.process_input(now);
    }

    /// Waiting for the driver's answer to `DecryptRequested` or `ResumeRequested`.
    fn awaiting_driver(&self) -> bool {
        matches!(
            self.state,
            State::AwaitDecrypt { .. } | State::AwaitResume { .. } | State::AwaitRestore(_)
        )
    }

    /// Decodes and handles what is buffered, unless a round trip is pending
    /// (then it waits, bounded: a client cannot make us hold more than one
    /// packet's worth while we decrypt or look its session up).
    fn process_input(&mut self, now: Instant) {
        if self.awaiting_driver() {
            if self.inbuf.len() > self.config.max_body + crate::packet::HEADER_LEN {
                self.inbuf.clear();
                self.close_with(CloseReason::Protocol(ProtocolError::State(
                    "too much data before the handshake completed",
                )));
            }
            return;
        }
        while !self.is_closed() {
            match self.decoder.decode(&mut self.inbuf) {
                Ok(None) => break,
                Ok(Some(Frame::Heartbeat)) => {
                    self.out.extend_from_slice(&[crate::packet::HEARTBEAT_BYTE])
                }
                Ok(Some(Frame::Packet(p))) => {
                    self.handle_packet(p, now);
                    if self.awaiting_driver() {
                        break;
                    }
                }
                Err(e) => self.frame_error(e),
            }
        }
        if self.inbuf.is_empty() {
            // An idle connection holds no read buffer at all.
            self.inbuf = BytesMut::new();
        }
    }

    /// Time passed; call at `poll_timeout`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.is_closed() {
            return;
        }
        match self.liveness.check(now) {
            Check::HandshakeTimeout => return self.close_with(CloseReason::HandshakeTimeout),
            Check::Dead => return self.close_with(CloseReason::HeartbeatTimeout),
            Check::Alive | Check::Missed => {}
        }
        let resend = self
            .pending
            .expire(now, &self.config.ack_retry, &mut self.events);
        for (packet_id, push) in resend {
            self.send_push(&push, packet_id);
        }
    }

    /// When `handle_timeout` wants to be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_closed() {
            return None;
        }
        Some(self.liveness.next(self.pending.next_deadline()))
    }

    /// Everything queued for the socket, in one buffer (one write).
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        // The whole buffer goes (not a split that would leave its spare
        // capacity behind): an idle connection holds no output buffer.
        // The burst's packets are sealed: its key schedule goes too.
        self.sealer.cool();
        (!self.out.is_empty()).then(|| std::mem::take(&mut self.out).freeze())
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

    /// The driver's answer to an event that asked for one (see `Answer`).
    /// An answer the machine no longer waits for is ignored.
    pub fn handle_answer(&mut self, answer: Answer, now: Instant) {
        match answer {
            Answer::Decrypted(result) => self.on_decrypted(result, now),
            Answer::Session(record) => self.on_session(record, now),
            Answer::Restored(bound) => self.on_restored(bound, now),
            Answer::Bind {
                request,
                user_id,
                result,
            } => self.on_bind_answer(request, user_id, result),
            Answer::Unbind { request, ok } => self.on_unbind_answer(request, ok),
            Answer::UpPush { reply, result } => self.on_up_push_answer(reply, result),
            Answer::Http { request, response } => self.on_http_answer(request, &response),
        }
    }

    /// Ends the connection from this side.
    pub fn close(&mut self) {
        self.close_with(CloseReason::Local);
    }

    // ----- packet handling ----------------------------------------------

    fn handle_packet(&mut self, p: Packet, now: Instant) {
        let cmd = p.cmd;
        let result = match cmd {
            Command::HANDSHAKE => self.on_handshake(&p, now),
            Command::FAST_CONNECT => self.on_fast_connect(&p),
            Command::BIND | Command::UNBIND => self.on_bind(&p),
            Command::PUSH => self.on_up_push(&p),
            Command::ACK => self.on_ack(&p),
            Command::HTTP_PROXY if self.config.http_proxy => self.on_http(&p),
            _ => {
                self.reply_error(
                    ErrorMessage::new(cmd, ErrorCode::UNSUPPORTED_CMD),
                    p.session_id,
                );
                self.close_with(CloseReason::UnsupportedCommand(cmd));
                Ok(())
            }
        };
        if let Err(e) = result {
            self.fail(cmd, p.session_id, e);
        }
    }

    /// A request that broke the protocol: ERROR 100 (mpush's dispatch error), then close.
    fn fail(&mut self, cmd: Command, request: i32, e: ProtocolError) {
        self.reply_error(ErrorMessage::new(cmd, ErrorCode::DISPATCH_ERROR), request);
        self.close_with(CloseReason::Protocol(e));
    }

    fn frame_error(&mut self, e: FrameError) {
        self.inbuf.clear();
        self.reply_error(
            ErrorMessage::with_reason(Command::UNKNOWN, ErrorCode::DISPATCH_ERROR, e.to_string()),
            0,
        );
        self.close_with(CloseReason::Protocol(e.into()));
    }

    // ----- helpers ------------------------------------------------------

    /// Opens a received body. On v2 every body after the handshake must be
    /// sealed: a plaintext one could have been injected.
    fn open(&self, p: &Packet) -> Result<Bytes, ProtocolError> {
        // Empty bodies too: a sealed empty body still carries its AEAD tag,
        // so nothing unauthenticated (an injected bare ACK) is accepted.
        if self.profile == Profile::V2
            && !self.is_transport()
            && (!p.flags.contains(Flags::CRYPTO) || p.body.is_empty())
        {
            return Err(ProtocolError::State("v2 requires sealed bodies"));
        }
        self.sealer.open(p)
    }

    fn send_plain(&mut self, cmd: Command, session_id: i32, body: Vec<u8>) {
        Frame::Packet(Sealer::plain(cmd, session_id, Flags::NONE, body)).encode(&mut self.out);
    }

    fn send_sealed(&mut self, cmd: Command, session_id: i32, flags: Flags, body: &[u8]) {
        // A packet already waiting for the write: a burst (see `seal_counted`).
        let burst = !self.out.is_empty();
        let packet = self
            .sealer
            .seal_counted(cmd, session_id, flags, body, burst);
        Frame::Packet(packet).encode(&mut self.out);
    }

    /// OK, ERROR and ACK: plaintext on legacy (as mpush), sealed on v2.
    fn send_reply(&mut self, cmd: Command, session_id: i32, body: Vec<u8>) {
        if self.profile == Profile::V2 && self.is_established() {
            self.send_sealed(cmd, session_id, Flags::NONE, &body);
        } else {
            self.send_plain(cmd, session_id, body);
        }
    }

    fn reply_ok(&mut self, answering: Command, request: i32, data: &str) {
        self.send_reply(
            Command::OK,
            request,
            OkMessage::new(answering, data).to_bytes(),
        );
    }

    fn reply_error(&mut self, e: ErrorMessage, request: i32) {
        self.send_reply(Command::ERROR, request, e.to_bytes());
    }

    fn send_ack(&mut self, session_id: i32, ack: &Ack) {
        self.send_reply(Command::ACK, session_id, ack.to_bytes());
    }

    fn close_with(&mut self, reason: CloseReason) {
        if self.is_closed() {
            return;
        }
        self.state = State::Closed;
        let unacked = self.pending.drain();
        self.events
            .push_back(ServerEvent::Closed { reason, unacked });
    }

    fn next_push_id(&mut self) -> i32 {
        let id = self.next_push_id;
        self.next_push_id = if id == i32::MAX {
            FIRST_PUSH_ID
        } else {
            id + 1
        };
        id
    }

    fn negotiate_heartbeat(&self, client_max: i32) -> Duration {
        let client_max = Duration::from_millis(u64::try_from(client_max).unwrap_or(0));
        client_max
            .min(self.config.max_heartbeat)
            .max(self.config.min_heartbeat)
    }

    fn set_heartbeat(&mut self, hb: Duration, now: Instant) {
        self.liveness.set_interval(hb, now);
    }

    fn unix_ms(&self, now: Instant) -> i64 {
        let (base, ms) = self.clock_base;
        ms + duration_ms_i64(now.saturating_duration_since(base))
    }
}

pub use crate::session::duration_ms;

pub(crate) fn duration_ms_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A session id's text: 32 lowercase hex characters. On every full
/// handshake and fast connect, so one allocation and no formatting per byte
/// (a `format!` per byte was about a tenth of a fast connect's server CPU).
fn hex_id(bytes: &[u8; 16]) -> String {
    hex::encode(bytes)
}

/// The 16 bytes of a session id made by `hex_id` (None for any other form).
fn unhex_id(id: &str) -> Option<[u8; 16]> {
    // Only the lowercase form `hex_id` writes, so the id round-trips.
    if !id.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; 16];
    // Also checks the length: exactly 32 characters.
    hex::decode_to_slice(id, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod size_tests {
    /// An idle connection holds its machine in a box of its own, so the
    /// machine's size picks the allocation: jemalloc's classes here are 320,
    /// 384 and 448 bytes, and one byte past 384 costs 64 per connection
    /// (issue 27's floor is 2,048 bytes per idle TCP connection in all).
    /// ADR 0008's session id took it from 376 to 392 bytes and an idle
    /// connection 64 bytes up before the bound user became a boxed `str`.
    #[test]
    fn an_idle_machine_stays_in_its_allocation_class() {
        let size = std::mem::size_of::<super::ServerConnection>();
        assert!(size <= 384, "the server machine is {size} bytes");
    }
}

#[cfg(test)]
mod id_tests {
    use super::{hex_id, unhex_id};

    proptest::proptest! {
        /// Every id `hex_id` writes reads back, and it is the only text of
        /// those bytes that does: the kept session's id round-trips exactly.
        #[test]
        fn a_session_id_round_trips(raw in proptest::array::uniform16(proptest::num::u8::ANY)) {
            let id = hex_id(&raw);
            proptest::prop_assert_eq!(id.len(), 32);
            proptest::prop_assert_eq!(unhex_id(&id), Some(raw));
            if id.bytes().any(|c| c.is_ascii_alphabetic()) {
                proptest::prop_assert_eq!(unhex_id(&id.to_ascii_uppercase()), None);
            }
        }
    }

    #[test]
    fn other_forms_of_an_id_are_not_ours() {
        for id in [
            "",
            "0123456789abcdef0123456789abcde",
            "0123456789abcdef0123456789abcdef0",
            "+123456789abcdef0123456789abcdef",
            "0123456789abcdeg0123456789abcdef",
            "0123456789ABCDEF0123456789abcdef",
            "0123456789abcdef0123456789abcdé",
        ] {
            assert_eq!(unhex_id(id), None, "{id:?}");
        }
        assert_eq!(
            unhex_id("000102030405060708090a0b0c0d0eff"),
            Some([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 255])
        );
    }
}
