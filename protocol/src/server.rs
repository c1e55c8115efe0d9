//! `ServerConnection`: one client connection seen from the server, sans-IO.
//!
//! The driver feeds bytes (`handle_input`) and time (`handle_timeout`), issues
//! commands (`push`, `kick`, `redirect`, `close`) and answers IO round trips
//! (`handle_resume_result`, `handle_bind_result`, `handle_unbind_result`). After
//! every call it drains `poll_transmit` and `poll_event`, then sleeps until
//! `poll_timeout` or the next input.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand_core::SeedableRng;
use web_time::Instant;

use crate::ack::RetryPolicy;
use crate::crypto::{
    self, AesKey, Rng, RsaPrivate, SessionCipher, connection_key, legacy_session_key, random_array,
    resume_accept_proof, resume_proof, v2_session_keys, verify_mac,
};
use crate::error::{FrameError, ProtocolError};
use crate::liveness::{Check, Liveness};
use crate::message::{
    Ack, BindUser, Body, ErrorCode, ErrorMessage, FastConnect, FastConnectOk, Handshake,
    HandshakeOk, HttpRequest, HttpResponse, Kick, OkMessage, Redirect, v2,
};
use crate::packet::{Command, Decoder, Flags, Frame, Packet};
use crate::pending::PendingPushes;
use crate::seal::{Sealer, Side};
use crate::session::{AckMode, DeviceInfo, Profile, SessionRecord, SessionSecret};

/// Server-side protocol settings. Defaults are mpush's.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub private_key: Arc<RsaPrivate>,
    /// Bounds of the negotiated heartbeat (mpush: 3 min and 3 min).
    pub min_heartbeat: Duration,
    pub max_heartbeat: Duration,
    /// Heartbeat check interval before a handshake (mpush: 10 s).
    pub initial_heartbeat: Duration,
    /// Consecutive missed heartbeats tolerated; one more closes (mpush: 2).
    pub max_heartbeat_misses: u32,
    /// How long a session can be resumed (mpush: 1 day).
    pub session_ttl: Duration,
    /// Largest accepted body on the wire (mpush: 10 KiB).
    pub max_body: usize,
    /// Largest body a compressed packet may inflate to.
    pub max_inflated: usize,
    /// Compress outgoing bodies longer than this (mpush: 10 KiB).
    pub compress_over: usize,
    /// Offer the v2 profile to clients that ask for it.
    pub enable_v2: bool,
    /// Accept HTTP_PROXY requests (mpush's `mp.http.proxy-enabled`).
    pub http_proxy: bool,
    /// Retries of pushes that wait for an ACK.
    pub ack_retry: RetryPolicy,
    /// Pushes awaiting an ACK at once; more are refused with `PushError::Busy`.
    pub max_inflight: usize,
    /// A connection that has not completed a handshake or fast connect within
    /// this is closed, whatever it sends (default 10 s).
    pub handshake_timeout: Duration,
    /// Largest RSA ciphertext of a handshake, in blocks of the key's size
    /// (default 8; a real client sends two to four).
    pub max_handshake_blocks: usize,
    /// Refuse legacy and plaintext handshakes and legacy fast connects: only
    /// the v2 profile is served.
    pub require_v2: bool,
    /// Hand the RSA private-key operation to the driver
    /// (`ServerEvent::DecryptRequested`) instead of doing it inline, so a
    /// driver can run it off its async workers.
    pub offload_rsa: bool,
    /// Serve the transport-secured profile (ADR 0005) on connections the
    /// driver marked secure (`set_transport_secured`); never elsewhere.
    pub accept_transport: bool,
}

impl ServerConfig {
    pub fn new(private_key: Arc<RsaPrivate>) -> Self {
        Self {
            private_key,
            min_heartbeat: Duration::from_secs(180),
            max_heartbeat: Duration::from_secs(180),
            initial_heartbeat: Duration::from_secs(10),
            max_heartbeat_misses: 2,
            session_ttl: Duration::from_secs(86_400),
            max_body: crate::packet::DEFAULT_MAX_BODY,
            max_inflated: 1 << 20,
            compress_over: 10 * 1024,
            enable_v2: true,
            http_proxy: false,
            ack_retry: RetryPolicy::default(),
            max_inflight: 1024,
            handshake_timeout: Duration::from_secs(10),
            max_handshake_blocks: 8,
            require_v2: false,
            offload_rsa: false,
            accept_transport: true,
        }
    }
}

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
    /// `handle_decrypt_result`. Input that arrives meanwhile is buffered.
    DecryptRequested { ciphertext: Bytes },
    /// A full handshake finished; store `session` so the client can resume
    /// (`None` on the WebSocket JSON form, which has no keys and no resume).
    HandshakeCompleted {
        device: DeviceInfo,
        session: Option<SessionRecord>,
        profile: Profile,
    },
    /// Look the session up and call `handle_resume_result`.
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
    /// Register the route (and check `token`), then call `handle_bind_result`.
    BindRequested {
        request: i32,
        user_id: String,
        tags: String,
        token: String,
        /// The user bound on this connection before, if any.
        previous_user: Option<String>,
    },
    /// Remove the route, then call `handle_unbind_result`.
    UnbindRequested { request: i32, user_id: String },
    /// The client sent a message up: accept it (hand it on) or refuse it,
    /// then answer with `handle_up_push_result(reply, ..)`. The machine
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

/// What answering an up-push needs: hand it back to `handle_up_push_result`.
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
    user: Option<String>,
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
            State::AwaitDecrypt { .. } | State::AwaitResume { .. }
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

    /// Answer to `ResumeRequested`: the stored session, if any.
    pub fn handle_resume_result(&mut self, record: Option<SessionRecord>, now: Instant) {
        if !matches!(self.state, State::AwaitResume { .. }) {
            return;
        }
        let State::AwaitResume { request, packet_id } =
            std::mem::replace(&mut self.state, State::AwaitHandshake)
        else {
            return;
        };
        self.resume(*request, packet_id, record, now);
        self.process_input(now);
    }

    fn resume(
        &mut self,
        request: FastConnect,
        packet_id: i32,
        record: Option<SessionRecord>,
        now: Instant,
    ) {
        let expired = |r: &SessionRecord| r.expire_at_ms <= self.unix_ms(now);
        let Some(record) = record.filter(|r| !expired(r)) else {
            return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
        };
        let v2_record = matches!(
            record.secret,
            SessionSecret::V2 { .. } | SessionSecret::Transport { .. }
        );
        // A transport session resumes only on a secure transport and into
        // the same profile; a classic one only outside it (ADR 0005). A
        // mismatch looks like an unknown session: the client handshakes.
        let wants_transport = request
            .proof
            .as_ref()
            .and_then(|p| p.capabilities.as_ref())
            .is_some_and(v2::Capabilities::has_transport);
        let is_transport = record.secret.is_transport();
        if wants_transport != is_transport
            || (is_transport && !(self.transport_secured() && self.config.accept_transport))
        {
            return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
        }
        if record.device.device_id != request.device_id {
            // On v2 a wrong device id looks exactly like a wrong proof, so a
            // prober learns nothing about whose session it holds.
            let code = if v2_record {
                ErrorCode::SESSION_EXPIRED
            } else {
                ErrorCode::INVALID_DEVICE
            };
            return self.resume_refused(packet_id, code);
        }
        if self.config.require_v2 && !v2_record {
            return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
        }
        let heartbeat = self.negotiate_heartbeat(request.max_heartbeat);
        let mut next = None;
        let (cipher, profile, accept) = match (&record.secret, &request.proof) {
            (SessionSecret::Legacy { key, iv }, _) => {
                (Some(SessionCipher::cbc(key, *iv)), Profile::Legacy, None)
            }
            (
                SessionSecret::V2 { resume_key } | SessionSecret::Transport { resume_key },
                Some(proof),
            ) if self.config.enable_v2 => {
                let want = resume_proof(
                    resume_key,
                    &request.session_id,
                    &request.device_id,
                    &proof.client_nonce,
                );
                if !verify_mac(&want, &proof.proof) {
                    return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
                }
                let (Some(server_nonce), Some(next_raw)) = (self.draw::<16>(), self.draw::<16>())
                else {
                    return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
                };
                self.honour_features(proof.capabilities.as_ref());
                let next_id = hex_id(&next_raw);
                let next_expire = self.unix_ms(now) + duration_ms_i64(self.config.session_ttl);
                let next_key =
                    crate::crypto::next_resume_key(resume_key, &proof.client_nonce, &server_nonce);
                next = Some(SessionRecord {
                    session_id: next_id.clone(),
                    device: record.device.clone(),
                    secret: SessionSecret::resumable(next_key, is_transport),
                    expire_at_ms: next_expire,
                });
                let accept = v2::ResumeAccept {
                    server_nonce: server_nonce.to_vec(),
                    proof: resume_accept_proof(resume_key, &proof.client_nonce, &server_nonce),
                    next_session_id: next_id,
                    next_expire_at_ms: next_expire,
                };
                let cipher = (!is_transport).then(|| {
                    SessionCipher::gcm(&connection_key(
                        resume_key,
                        &proof.client_nonce,
                        &server_nonce,
                    ))
                });
                (cipher, Profile::V2, Some(accept))
            }
            // A v2 session without a proof (or with v2 turned off) cannot resume.
            (SessionSecret::V2 { .. } | SessionSecret::Transport { .. }, _) => {
                return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
            }
        };
        let ok = FastConnectOk {
            heartbeat: duration_ms(heartbeat),
            accept,
        };
        self.send_plain(Command::FAST_CONNECT, packet_id, ok.to_bytes());
        self.sealer.set_cipher(cipher);
        if is_transport {
            self.transport = Transport::Profile;
        }
        self.profile = profile;
        self.set_heartbeat(heartbeat, now);
        self.user = None;
        self.establish();
        let replaces = next.as_ref().map(|_| record.session_id.clone());
        self.events.push_back(ServerEvent::Resumed {
            device: record.device,
            profile,
            session: next,
            replaces,
        });
    }

    /// Answer to `BindRequested`: `Ok` binds, `Err(reason)` refuses and closes.
    pub fn handle_bind_result(&mut self, request: i32, user_id: &str, result: Result<(), String>) {
        if !self.is_established() {
            return;
        }
        match result {
            Ok(()) => {
                self.user = Some(user_id.to_owned());
                self.reply_ok(Command::BIND, request, "bind success");
            }
            Err(reason) => {
                self.reply_error(
                    ErrorMessage::with_reason(Command::BIND, ErrorCode::NONE, "bind failed"),
                    request,
                );
                self.close_with(CloseReason::Refused(reason));
            }
        }
    }

    /// Answer to `UpPush`. Accepted: the ACK the client asked for. Refused:
    /// a v2 client gets ERROR(PUSH, RETRY_LATER | REJECTED) and keeps its
    /// connection; a legacy client gets no answer (an mpush client reconnects
    /// on any ERROR; without the ACK its push callback times out instead).
    pub fn handle_up_push_result(&mut self, reply: UpPushReply, result: Result<(), UpPushRefusal>) {
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

    /// Answer to `UnbindRequested`.
    pub fn handle_unbind_result(&mut self, request: i32, ok: bool) {
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

    /// Answer to `HttpProxy`.
    pub fn http_response(&mut self, request: i32, response: &HttpResponse) {
        if self.is_established() {
            let body = response.to_bytes();
            self.send_sealed(Command::HTTP_PROXY, request, Flags::NONE, &body);
        }
    }

    /// Sends a push; with an ACK mode it is retried until acknowledged.
    /// Returns the packet id it went out under.
    pub fn push(&mut self, push: OutboundPush, now: Instant) -> Result<i32, PushError> {
        match self.state {
            State::Established => {}
            State::Closed => return Err(PushError::Closed),
            _ => return Err(PushError::NotReady),
        }
        let tracked = push.ack_mode != AckMode::None;
        if tracked {
            self.pending.admit(push.message_id)?;
        }
        let packet_id = self.next_push_id();
        self.send_push(&push, packet_id);
        if tracked {
            let policy = &self.config.ack_retry;
            self.pending.track(push, packet_id, now, policy);
        }
        Ok(packet_id)
    }

    /// Seals one push (its first attempt or a retry: a retry is the same
    /// packet, sealed again).
    fn send_push(&mut self, push: &OutboundPush, packet_id: i32) {
        let flags = push.ack_mode.flags();
        match self.profile {
            Profile::Legacy => {
                self.send_sealed(Command::PUSH, packet_id, flags, &push.content);
            }
            Profile::V2 => {
                let body = prost::Message::encode_to_vec(&v2::PushEnvelope {
                    message_id: push.message_id,
                    trace_id: push.trace_id.to_string(),
                    content: push.content.to_vec(),
                    ack_mode: push.ack_mode.to_v2(),
                    expires_at_ms: push.expires_at_ms,
                });
                self.send_sealed(Command::PUSH, packet_id, flags, &body);
            }
        }
    }

    /// Tells the client another device took its place (mpush 0.8.1 does not
    /// close the connection; the driver may).
    pub fn kick(&mut self, device_id: &str, user_id: &str) {
        if self.is_established() {
            let body = Kick {
                device_id: device_id.to_owned(),
                user_id: user_id.to_owned(),
            }
            .to_bytes();
            self.send_sealed(Command::KICK, 0, Flags::NONE, &body);
        }
    }

    /// Asks a v2 client to reconnect elsewhere; false (nothing sent) for legacy
    /// clients, which only learn by the connection closing.
    pub fn redirect(&mut self, redirect: &Redirect) -> bool {
        if !self.is_established() || self.profile != Profile::V2 {
            return false;
        }
        self.send_sealed(Command::REDIRECT, 0, Flags::NONE, &redirect.to_bytes());
        true
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

    fn on_handshake(&mut self, p: &Packet, now: Instant) -> Result<(), ProtocolError> {
        if self.handshake_seen || !matches!(self.state, State::AwaitHandshake) {
            // One full handshake per connection: a second one (a replay, or
            // a flood of RSA work on one socket) ends it.
            self.refuse_repeat(p, "handshake");
            return Ok(());
        }
        self.handshake_seen = true;
        if !p.flags.contains(Flags::CRYPTO) {
            // mpush accepts a plaintext handshake (spec 11.9); so do we,
            // unless only v2 is served.
            if self.config.require_v2 && !self.transport_secured() {
                self.refuse_handshake(p.session_id, "plaintext handshake (v2 required)");
                return Ok(());
            }
            return self.complete_handshake(p.session_id, p.body.to_vec(), true, now);
        }
        let max = self.config.private_key.size() * self.config.max_handshake_blocks;
        if p.body.is_empty() || p.body.len() > max {
            self.refuse_handshake(p.session_id, "handshake ciphertext size");
            return Ok(());
        }
        if self.config.offload_rsa {
            self.state = State::AwaitDecrypt {
                request: p.session_id,
                flags: p.flags,
            };
            self.events.push_back(ServerEvent::DecryptRequested {
                ciphertext: p.body.clone(),
            });
            return Ok(());
        }
        let Some(rng) = self.rng.as_deref_mut() else {
            self.refuse_handshake(p.session_id, "no handshake in this state");
            return Ok(());
        };
        let plain = self.config.private_key.decrypt(rng, &p.body);
        self.after_decrypt(p.session_id, p.flags, plain, now)
    }

    /// Answer to `DecryptRequested`: the plaintext, or why it failed.
    pub fn handle_decrypt_result(
        &mut self,
        result: Result<Vec<u8>, crate::error::CryptoError>,
        now: Instant,
    ) {
        let State::AwaitDecrypt { request, flags } = self.state else {
            return;
        };
        self.state = State::AwaitHandshake;
        if let Err(e) = self.after_decrypt(request, flags, result, now) {
            self.fail(Command::HANDSHAKE, request, e);
        }
        self.process_input(now);
    }

    fn after_decrypt(
        &mut self,
        request: i32,
        flags: Flags,
        plain: Result<Vec<u8>, crate::error::CryptoError>,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        let plain = plain?;
        let body = if flags.contains(Flags::COMPRESS) {
            crypto::decompress(&plain, self.config.max_body)?
        } else {
            plain
        };
        self.complete_handshake(request, body, false, now)
    }

    fn complete_handshake(
        &mut self,
        request: i32,
        body: Vec<u8>,
        plaintext: bool,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        let mut hs = Handshake::from_bytes(&body)?;
        if hs
            .capabilities
            .as_ref()
            .is_some_and(v2::Capabilities::has_transport)
        {
            return self.complete_transport_handshake(request, hs, plaintext, now);
        }
        let key_bytes = zeroize::Zeroizing::new(std::mem::take(&mut hs.client_key));
        let (Ok(iv), Ok(client_key)) = (
            <[u8; 16]>::try_from(hs.iv.as_slice()),
            <[u8; 16]>::try_from(key_bytes.as_slice()),
        ) else {
            self.refuse_handshake(request, "invalid handshake parameters");
            return Ok(());
        };
        let device = match handshake_device(&mut hs) {
            Ok(d) => d,
            Err(why) => {
                self.refuse_handshake(request, why);
                return Ok(());
            }
        };
        let v2 = self.config.enable_v2
            && hs
                .capabilities
                .as_ref()
                .is_some_and(|c| c.profile >= v2::PROFILE);
        if self.config.require_v2 && !v2 {
            self.refuse_handshake(request, "legacy handshake (v2 required)");
            return Ok(());
        }
        let (Some(server_key), Some(id_raw)) = (self.draw::<16>(), self.draw::<16>()) else {
            self.refuse_handshake(request, "no handshake in this state");
            return Ok(());
        };
        let capabilities = v2.then(|| {
            let echo = self.honour_features(hs.capabilities.as_ref());
            v2::Capabilities::v2().with_features(echo)
        });
        let (heartbeat, ok) =
            self.session_offer(&hs, &id_raw, server_key.to_vec(), capabilities, now);
        // HANDSHAKE_OK always goes out under AES-CBC(clientKey, iv), as in mpush.
        let client_key = AesKey(client_key);
        let reply_cipher = SessionCipher::cbc(&client_key, iv);
        // CBC: the nonce source is not used.
        let packet = self.sealer.seal_with(
            &reply_cipher,
            &mut Rng::from_seed([0; 32]),
            Command::HANDSHAKE,
            request,
            &ok.to_bytes(),
        );
        Frame::Packet(packet).encode(&mut self.out);
        let (cipher, secret, profile) = if v2 {
            let (traffic, resume_key) = v2_session_keys(&client_key.0, &server_key, &iv);
            (
                SessionCipher::gcm(&traffic),
                SessionSecret::V2 { resume_key },
                Profile::V2,
            )
        } else {
            let key = legacy_session_key(&client_key.0, &server_key);
            (
                SessionCipher::cbc(&key, iv),
                SessionSecret::Legacy { key, iv },
                Profile::Legacy,
            )
        };
        let session = SessionRecord {
            session_id: ok.session_id,
            device,
            secret,
            expire_at_ms: ok.expire_time,
        };
        self.handshake_established(Some(cipher), profile, heartbeat, session, now);
        Ok(())
    }

    /// A new session's terms: the heartbeat negotiated with `hs`, and the
    /// HANDSHAKE_OK that announces them (the session id made of `id_raw`,
    /// its expiry, `server_key` and `capabilities`).
    fn session_offer(
        &self,
        hs: &Handshake,
        id_raw: &[u8; 16],
        server_key: Vec<u8>,
        capabilities: Option<v2::Capabilities>,
        now: Instant,
    ) -> (Duration, HandshakeOk) {
        let heartbeat = self.negotiate_heartbeat(hs.max_heartbeat);
        let ok = HandshakeOk {
            server_key,
            heartbeat: duration_ms(heartbeat),
            session_id: hex_id(id_raw),
            expire_time: self.unix_ms(now) + duration_ms_i64(self.config.session_ttl),
            capabilities,
        };
        (heartbeat, ok)
    }

    /// Applies the client's `features` bits that change how this side sends
    /// (`FEATURE_PLAIN_BODIES`: no compression towards it), and returns the
    /// ones to echo in HANDSHAKE_OK.
    fn honour_features(&mut self, caps: Option<&v2::Capabilities>) -> u32 {
        if caps.is_some_and(v2::Capabilities::wants_plain_bodies) {
            self.sealer.never_compress();
            v2::FEATURE_PLAIN_BODIES
        } else {
            0
        }
    }

    /// A full handshake answered: the connection is up with `cipher`, and
    /// the driver hears of the new session.
    fn handshake_established(
        &mut self,
        cipher: Option<SessionCipher>,
        profile: Profile,
        heartbeat: Duration,
        session: SessionRecord,
        now: Instant,
    ) {
        self.sealer.set_cipher(cipher);
        self.profile = profile;
        self.set_heartbeat(heartbeat, now);
        self.establish();
        let device = session.device.clone();
        self.events.push_back(ServerEvent::HandshakeCompleted {
            session: Some(session),
            device,
            profile,
        });
    }

    /// The transport-secured profile (ADR 0005): a plaintext handshake on a
    /// connection the driver marked secure. No RSA, no cipher; the resume
    /// key is drawn here and sent inside TLS in `serverKey`.
    fn complete_transport_handshake(
        &mut self,
        request: i32,
        mut hs: Handshake,
        plaintext: bool,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        let allowed = plaintext
            && self.transport_secured()
            && self.config.accept_transport
            && self.config.enable_v2;
        if !allowed {
            self.refuse_handshake(request, "transport profile on a connection that is not TLS");
            return Ok(());
        }
        let device = match handshake_device(&mut hs) {
            Ok(d) => d,
            Err(why) => {
                self.refuse_handshake(request, why);
                return Ok(());
            }
        };
        let (Some(key), Some(id_raw)) = (
            self.draw::<{ crate::crypto::RESUME_KEY_LEN }>(),
            self.draw::<16>(),
        ) else {
            self.refuse_handshake(request, "no handshake in this state");
            return Ok(());
        };
        let echo = self.honour_features(hs.capabilities.as_ref());
        let capabilities = Some(v2::Capabilities::transport().with_features(echo));
        let (heartbeat, ok) = self.session_offer(&hs, &id_raw, key.to_vec(), capabilities, now);
        self.send_plain(Command::HANDSHAKE, request, ok.to_bytes());
        self.transport = Transport::Profile;
        let session = SessionRecord {
            session_id: ok.session_id,
            device,
            secret: SessionSecret::Transport {
                resume_key: crate::crypto::ResumeKey(key),
            },
            expire_at_ms: ok.expire_time,
        };
        self.handshake_established(None, Profile::V2, heartbeat, session, now);
        Ok(())
    }

    fn refuse_handshake(&mut self, request: i32, why: &str) {
        self.reply_error(
            ErrorMessage::with_reason(Command::HANDSHAKE, ErrorCode::NONE, "Param invalid"),
            request,
        );
        self.close_with(CloseReason::Refused(format!("handshake refused: {why}")));
    }

    /// A second handshake or fast connect on one connection closes it.
    fn refuse_repeat(&mut self, p: &Packet, what: &str) {
        self.reply_error(
            ErrorMessage::new(p.cmd, ErrorCode::REPEAT_HANDSHAKE),
            p.session_id,
        );
        self.close_with(CloseReason::Refused(format!("repeated {what}")));
    }

    fn establish(&mut self) {
        if let Some(prefix) = self.draw::<4>() {
            self.sealer.count_nonces(prefix);
        }
        // Nothing random is needed past this point: an established
        // connection does not carry an RNG.
        self.rng = None;
        self.state = State::Established;
        self.liveness.established();
    }

    /// Random bytes, while the connection still has its RNG.
    fn draw<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.rng.as_deref_mut().map(random_array)
    }

    fn on_fast_connect(&mut self, p: &Packet) -> Result<(), ProtocolError> {
        if self.resume_seen || self.handshake_seen || !matches!(self.state, State::AwaitHandshake) {
            self.refuse_repeat(p, "fast connect");
            return Ok(());
        }
        self.resume_seen = true;
        let fc = FastConnect::from_bytes(&p.body)?;
        if fc.session_id.is_empty()
            || fc.session_id.len() > crate::session::limits::SESSION_ID
            || fc.device_id.len() > crate::session::limits::DEVICE_ID
            || (self.config.require_v2 && fc.proof.is_none())
        {
            self.resume_refused(p.session_id, ErrorCode::SESSION_EXPIRED);
            return Ok(());
        }
        self.events.push_back(ServerEvent::ResumeRequested {
            session_id: fc.session_id.clone(),
            device_id: fc.device_id.clone(),
        });
        self.state = State::AwaitResume {
            request: Box::new(fc),
            packet_id: p.session_id,
        };
        Ok(())
    }

    fn resume_refused(&mut self, request: i32, code: ErrorCode) {
        // The connection stays open: the client handshakes on it (spec 5.5).
        self.state = State::AwaitHandshake;
        self.send_plain(
            Command::ERROR,
            request,
            ErrorMessage::new(Command::FAST_CONNECT, code).to_bytes(),
        );
    }

    fn on_bind(&mut self, p: &Packet) -> Result<(), ProtocolError> {
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
            previous_user: self.user.clone(),
        });
        Ok(())
    }

    fn on_up_push(&mut self, p: &Packet) -> Result<(), ProtocolError> {
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

    fn on_ack(&mut self, p: &Packet) -> Result<(), ProtocolError> {
        let mut ids: Vec<u64> = match self.profile {
            Profile::V2 if self.is_established() => Ack::from_bytes(&self.open(p)?)?.message_ids,
            Profile::V2 | Profile::Legacy => Vec::new(),
        };
        if ids.is_empty() {
            // Legacy ACKs (and bare v2 ones) name the push by its packet id.
            ids.extend(self.pending.message_for_packet(p.session_id));
        }
        for id in ids {
            if let Some(push) = self.pending.ack(id) {
                self.events.push_back(ServerEvent::Acked { push });
            }
        }
        Ok(())
    }

    fn on_http(&mut self, p: &Packet) -> Result<(), ProtocolError> {
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
        let packet = self.sealer.seal_counted(cmd, session_id, flags, body);
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

/// The device a handshake names, checked; `Err` says why it is refused.
fn handshake_device(hs: &mut Handshake) -> Result<DeviceInfo, &'static str> {
    let mut device = DeviceInfo {
        device_id: std::mem::take(&mut hs.device_id),
        os_name: std::mem::take(&mut hs.os_name),
        os_version: std::mem::take(&mut hs.os_version),
        client_version: std::mem::take(&mut hs.client_version),
    };
    if device.device_id.is_empty() {
        return Err("handshake without a device id");
    }
    device.check_limits()?;
    Ok(device)
}

pub(crate) fn duration_ms_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn hex_id(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
