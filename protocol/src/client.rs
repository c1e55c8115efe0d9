//! `ClientConnection`: one connection seen from the client, sans-IO. It behaves
//! like mpush-client-java 0.8.1 on the legacy profile (spec section 9) and
//! negotiates the v2 profile when configured to offer it.
//!
//! It starts talking as soon as it is created (fast connect when given a valid
//! ticket, a full handshake otherwise). Reconnecting is not its job: it ends
//! with `ClientEvent::Closed { reconnect, .. }` and the session layer decides.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand_core::SeedableRng;
use web_time::Instant;

use crate::crypto::{
    self, AesKey, Rng, RsaPublic, SessionCipher, connection_key, random_array, resume_accept_proof,
    resume_proof, v2_session_keys, verify_mac,
};
use crate::dedup::DedupWindow;
use crate::error::{DecodeError, ProtocolError};
use crate::message::{
    Ack, BindUser, Body, ErrorCode, ErrorMessage, FastConnect, FastConnectOk, Handshake,
    HandshakeOk, HttpRequest, HttpResponse, Kick, OkMessage, Redirect, v2,
};
use crate::packet::{Command, Decoder, Flags, Frame, HEARTBEAT_BYTE, Packet};
use crate::seal::{Sealer, Side};
use crate::session::{AckMode, DeviceInfo, Profile, ResumeTicket, SessionSecret, duration_ms};
use crate::small_map::SmallMap;

/// Client-side protocol settings. Defaults are mpush-client-java's.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub public_key: Arc<RsaPublic>,
    pub device: DeviceInfo,
    /// Heartbeat bounds sent to the server (mpush: both 240 s).
    pub min_heartbeat: Duration,
    pub max_heartbeat: Duration,
    /// Handshake and fast-connect answer timeout (mpush: 3 s, no retry).
    pub handshake_timeout: Duration,
    /// BIND/UNBIND answer timeout (mpush: 3 s) and resends of BIND (mpush: 1).
    pub bind_timeout: Duration,
    pub bind_retries: u32,
    /// Compress bodies longer than this (mpush client: 1024).
    pub compress_over: usize,
    /// Largest body accepted from the server, on the wire and inflated.
    pub max_body: usize,
    /// Ask for the v2 profile; a legacy server ignores the request.
    pub offer_v2: bool,
    /// This connection is TLS (or loopback in development): use the
    /// transport-secured profile (ADR 0005): a plaintext handshake, no
    /// RSA and no cipher. Only servers of this project accept it, and only
    /// on connections they know to be TLS. Needs `offer_v2`.
    pub transport_secured: bool,
}

impl ClientConfig {
    pub fn new(public_key: Arc<RsaPublic>, device: DeviceInfo) -> Self {
        Self {
            public_key,
            device,
            min_heartbeat: Duration::from_secs(240),
            max_heartbeat: Duration::from_secs(240),
            handshake_timeout: Duration::from_secs(3),
            bind_timeout: Duration::from_secs(3),
            bind_retries: 1,
            compress_over: 1024,
            max_body: 1 << 20,
            offer_v2: true,
            transport_secured: false,
        }
    }
}

/// What the app needs to acknowledge a message later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AckToken {
    pub packet_id: i32,
    pub message_id: Option<u64>,
}

impl AckToken {
    /// The message id on v2; the packet id (unique per connection) on legacy.
    fn dedup_key(&self) -> u64 {
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
                ClientCloseReason::Protocol(ProtocolError::State(NO_CLASSIC)),
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

    /// Binds a user; `token` goes in the body's data field for servers that
    /// check it. Answered by `BindOk` (or the connection closes).
    pub fn bind(
        &mut self,
        user_id: &str,
        tags: &str,
        token: &str,
        now: Instant,
    ) -> Result<i32, ClientError> {
        self.ready()?;
        let body = BindUser {
            user_id: user_id.to_owned(),
            data: token.to_owned(),
            tags: tags.to_owned(),
        }
        .to_bytes();
        let id = self.next_id();
        let bytes = self.sealed_bytes(Command::BIND, id, Flags::NONE, &body);
        self.write(&bytes, now);
        self.pending.insert(
            id,
            Pending {
                kind: RequestKind::Bind,
                deadline: now + self.config.bind_timeout,
                retries_left: self.config.bind_retries,
                resend: Some(bytes),
                user_id: user_id.to_owned(),
            },
        );
        Ok(id)
    }

    pub fn unbind(&mut self, user_id: &str, now: Instant) -> Result<i32, ClientError> {
        self.ready()?;
        let body = BindUser {
            user_id: user_id.to_owned(),
            ..Default::default()
        }
        .to_bytes();
        let id = self.next_id();
        let bytes = self.sealed_bytes(Command::UNBIND, id, Flags::NONE, &body);
        self.write(&bytes, now);
        self.pending.insert(
            id,
            Pending {
                kind: RequestKind::Unbind,
                deadline: now + self.config.bind_timeout,
                retries_left: 0,
                resend: None,
                user_id: user_id.to_owned(),
            },
        );
        Ok(id)
    }

    /// Acknowledges a BIZ message (queued and sent at once).
    pub fn ack(&mut self, token: AckToken, now: Instant) -> Result<(), ClientError> {
        self.ready()?;
        self.window(&token).mark_acked(token.dedup_key());
        self.acks_out.push(token);
        self.flush_acks(now);
        Ok(())
    }

    /// Sends a message up. With `AckMode::Auto` the server's ACK is awaited
    /// for `timeout` (`PushAcked` or `PushTimedOut`).
    pub fn push(
        &mut self,
        content: &[u8],
        ack_mode: AckMode,
        timeout: Duration,
        now: Instant,
    ) -> Result<i32, ClientError> {
        let message_id = rand_core::Rng::next_u64(&mut self.rng);
        self.push_with_id(content, message_id, ack_mode, timeout, now)
    }

    /// `push` with the caller's message id (v2): a message sent again after a
    /// reconnect keeps its id, so the backend can tell it is the same one.
    pub fn push_with_id(
        &mut self,
        content: &[u8],
        message_id: u64,
        ack_mode: AckMode,
        timeout: Duration,
        now: Instant,
    ) -> Result<i32, ClientError> {
        self.ready()?;
        let id = self.next_id();
        let body = match self.profile {
            Profile::Legacy => content.to_vec(),
            Profile::V2 => prost::Message::encode_to_vec(&v2::PushEnvelope {
                message_id,
                content: content.to_vec(),
                ack_mode: ack_mode.to_v2(),
                ..Default::default()
            }),
        };
        let bytes = self.sealed_bytes(Command::PUSH, id, ack_mode.flags(), &body);
        self.write(&bytes, now);
        if ack_mode != AckMode::None {
            self.pending.insert(
                id,
                Pending {
                    kind: RequestKind::Push,
                    deadline: now + timeout,
                    retries_left: 0,
                    resend: None,
                    user_id: String::new(),
                },
            );
        }
        Ok(id)
    }

    /// Sends an HTTP request through the server's proxy.
    pub fn http(
        &mut self,
        request: &HttpRequest,
        timeout: Duration,
        now: Instant,
    ) -> Result<i32, ClientError> {
        self.ready()?;
        let id = self.next_id();
        let bytes = self.sealed_bytes(Command::HTTP_PROXY, id, Flags::NONE, &request.to_bytes());
        self.write(&bytes, now);
        self.pending.insert(
            id,
            Pending {
                kind: RequestKind::Http,
                deadline: now + timeout,
                retries_left: 0,
                resend: None,
                user_id: String::new(),
            },
        );
        Ok(id)
    }

    pub fn close(&mut self) {
        self.close_with(ClientCloseReason::Local, false);
    }

    // ----- starting -----------------------------------------------------

    fn start_handshake(&mut self, now: Instant) {
        if self.transport() {
            return self.start_transport_handshake(now);
        }
        let client_key: [u8; 16] = random_array(&mut self.rng);
        let iv: [u8; 16] = random_array(&mut self.rng);
        let caps = self
            .config
            .offer_v2
            .then(|| offered(v2::Capabilities::v2()));
        let hs = self.handshake_message(iv.to_vec(), client_key.to_vec(), caps);
        let mut body = hs.to_bytes();
        let mut flags = Flags::CRYPTO;
        if let Some(c) = crypto::compress_over(&body, self.config.compress_over) {
            body = c;
            flags = flags.with(Flags::COMPRESS);
        }
        let id = self.next_id();
        match self.config.public_key.encrypt(&mut self.rng, &body) {
            Ok(sealed) => {
                let p = Packet::new(Command::HANDSHAKE, id, flags, sealed);
                self.write(&Frame::Packet(p).to_bytes(), now);
            }
            Err(e) => {
                return self.close_with(ClientCloseReason::Protocol(e.into()), false);
            }
        }
        self.sealer.set_cipher(None);
        self.state = State::Handshaking {
            client_key: AesKey(client_key),
            iv,
        };
        self.expect_handshake_answer(id, now);
    }

    /// This device's HANDSHAKE body.
    fn handshake_message(
        &self,
        iv: Vec<u8>,
        client_key: Vec<u8>,
        capabilities: Option<v2::Capabilities>,
    ) -> Handshake {
        let d = &self.config.device;
        Handshake {
            device_id: d.device_id.clone(),
            os_name: d.os_name.clone(),
            os_version: d.os_version.clone(),
            client_version: d.client_version.clone(),
            iv,
            client_key,
            min_heartbeat: duration_ms(self.config.min_heartbeat),
            max_heartbeat: duration_ms(self.config.max_heartbeat),
            timestamp: 0,
            capabilities,
        }
    }

    /// ADR 0005: the handshake in plaintext (the transport is TLS), no keys.
    fn start_transport_handshake(&mut self, now: Instant) {
        let caps = Some(offered(v2::Capabilities::transport()));
        let hs = self.handshake_message(Vec::new(), Vec::new(), caps);
        let id = self.next_id();
        let p = Packet::new(Command::HANDSHAKE, id, Flags::NONE, hs.to_bytes());
        self.write(&Frame::Packet(p).to_bytes(), now);
        self.sealer.set_cipher(None);
        self.state = State::Handshaking {
            client_key: AesKey([0; 16]),
            iv: [0; 16],
        };
        self.expect_handshake_answer(id, now);
    }

    fn start_resume(&mut self, ticket: ResumeTicket, now: Instant) {
        let client_nonce: [u8; 16] = random_array(&mut self.rng);
        let proof = match &ticket.secret {
            SessionSecret::Legacy { .. } => None,
            SessionSecret::V2 { resume_key } | SessionSecret::Transport { resume_key } => {
                Some(v2::ResumeProof {
                    capabilities: Some(offered(if ticket.secret.is_transport() {
                        v2::Capabilities::transport()
                    } else {
                        v2::Capabilities::v2()
                    })),
                    client_nonce: client_nonce.to_vec(),
                    proof: resume_proof(
                        resume_key,
                        &ticket.session_id,
                        &self.config.device.device_id,
                        &client_nonce,
                    ),
                })
            }
        };
        let fc = FastConnect {
            session_id: ticket.session_id.clone(),
            device_id: self.config.device.device_id.clone(),
            min_heartbeat: duration_ms(self.config.min_heartbeat),
            max_heartbeat: duration_ms(self.config.max_heartbeat),
            proof,
        };
        let id = self.next_id();
        let p = Packet::new(Command::FAST_CONNECT, id, Flags::NONE, fc.to_bytes());
        self.write(&Frame::Packet(p).to_bytes(), now);
        self.state = State::Resuming {
            ticket,
            client_nonce,
        };
        self.expect_handshake_answer(id, now);
    }

    fn expect_handshake_answer(&mut self, id: i32, now: Instant) {
        self.pending.insert(
            id,
            Pending {
                kind: RequestKind::Handshake,
                deadline: now + self.config.handshake_timeout,
                retries_left: 0,
                resend: None,
                user_id: String::new(),
            },
        );
    }

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

    fn on_handshake_ok(&mut self, p: &Packet, now: Instant) -> Result<(), ProtocolError> {
        let State::Handshaking { client_key, iv } = &self.state else {
            return Ok(()); // a late or repeated answer
        };
        let (client_key, iv) = (client_key.clone(), *iv);
        if self.transport() {
            return self.on_transport_handshake_ok(p, now);
        }
        let reply_cipher = cbc_cipher(&client_key, iv)?;
        let body = self.sealer.open_with(Some(&reply_cipher), p)?;
        let ok = HandshakeOk::from_bytes(&body)?;
        let server_key: [u8; 16] = ok
            .server_key
            .as_slice()
            .try_into()
            .map_err(|_| DecodeError::BadLength { field: "serverKey" })?;
        let v2 = self.config.offer_v2
            && ok
                .capabilities
                .as_ref()
                .is_some_and(|c| c.profile >= v2::PROFILE);
        let (cipher, secret, profile) = if v2 {
            let (traffic, resume_key) = v2_session_keys(&client_key.0, &server_key, &iv);
            (
                gcm_cipher(&traffic)?,
                SessionSecret::V2 { resume_key },
                Profile::V2,
            )
        } else {
            let key = crypto::legacy_session_key(&client_key.0, &server_key);
            (
                cbc_cipher(&key, iv)?,
                SessionSecret::Legacy { key, iv },
                Profile::Legacy,
            )
        };
        let ticket = (!ok.session_id.is_empty()).then(|| ResumeTicket {
            session_id: ok.session_id.clone(),
            expire_at_ms: ok.expire_time,
            secret,
        });
        self.pending.remove(&p.session_id);
        self.established(Some(cipher), profile, ok.heartbeat, now);
        self.events.push_back(ClientEvent::Connected {
            profile,
            heartbeat: self.heartbeat,
            resumed: false,
            ticket,
        });
        Ok(())
    }

    /// ADR 0005: a plaintext HANDSHAKE_OK naming the transport profile, its
    /// `serverKey` the session's resume key.
    fn on_transport_handshake_ok(&mut self, p: &Packet, now: Instant) -> Result<(), ProtocolError> {
        if p.flags.contains(Flags::CRYPTO) {
            return Err(ProtocolError::State(
                "a sealed answer to a transport handshake",
            ));
        }
        let ok = HandshakeOk::from_bytes(&p.body)?;
        if !ok
            .capabilities
            .as_ref()
            .is_some_and(v2::Capabilities::has_transport)
        {
            return Err(ProtocolError::State(
                "the server did not take the transport-secured profile",
            ));
        }
        let key: [u8; crate::crypto::RESUME_KEY_LEN] = ok
            .server_key
            .as_slice()
            .try_into()
            .map_err(|_| DecodeError::BadLength { field: "serverKey" })?;
        let ticket = (!ok.session_id.is_empty()).then(|| ResumeTicket {
            session_id: ok.session_id.clone(),
            expire_at_ms: ok.expire_time,
            secret: SessionSecret::Transport {
                resume_key: crate::crypto::ResumeKey(key),
            },
        });
        self.pending.remove(&p.session_id);
        self.established(None, Profile::V2, ok.heartbeat, now);
        self.events.push_back(ClientEvent::Connected {
            profile: Profile::V2,
            heartbeat: self.heartbeat,
            resumed: false,
            ticket,
        });
        Ok(())
    }

    fn on_fast_connect_ok(&mut self, p: &Packet, now: Instant) -> Result<(), ProtocolError> {
        let State::Resuming {
            ticket,
            client_nonce,
        } = &self.state
        else {
            return Ok(());
        };
        let ok = FastConnectOk::from_bytes(&p.body)?;
        let mut next = None;
        let (cipher, profile) = match (&ticket.secret, &ok.accept) {
            (SessionSecret::Legacy { key, iv }, _) => {
                (Some(cbc_cipher(key, *iv)?), Profile::Legacy)
            }
            (
                SessionSecret::V2 { resume_key } | SessionSecret::Transport { resume_key },
                Some(accept),
            ) => {
                let transport = ticket.secret.is_transport();
                let want = resume_accept_proof(resume_key, client_nonce, &accept.server_nonce);
                if !verify_mac(&want, &accept.proof) {
                    return Err(ProtocolError::State(
                        "server failed to prove the session key",
                    ));
                }
                let key = connection_key(resume_key, client_nonce, &accept.server_nonce);
                // Single-use tickets: the server named the session to use next time.
                if !accept.next_session_id.is_empty() {
                    let resume_key = crate::crypto::next_resume_key(
                        resume_key,
                        client_nonce,
                        &accept.server_nonce,
                    );
                    next = Some(ResumeTicket {
                        session_id: accept.next_session_id.clone(),
                        expire_at_ms: accept.next_expire_at_ms,
                        secret: SessionSecret::resumable(resume_key, transport),
                    });
                }
                let cipher = if transport {
                    None
                } else {
                    Some(gcm_cipher(&key)?)
                };
                (cipher, Profile::V2)
            }
            (SessionSecret::V2 { .. } | SessionSecret::Transport { .. }, None) => {
                return Err(ProtocolError::State("v2 resume answered without a proof"));
            }
        };
        self.pending.remove(&p.session_id);
        self.established(cipher, profile, ok.heartbeat, now);
        self.events.push_back(ClientEvent::Connected {
            profile,
            heartbeat: self.heartbeat,
            resumed: true,
            ticket: next,
        });
        Ok(())
    }

    fn established(
        &mut self,
        cipher: Option<SessionCipher>,
        profile: Profile,
        heartbeat_ms: i32,
        now: Instant,
    ) {
        self.sealer.set_cipher(cipher);
        self.profile = profile;
        self.heartbeat = Duration::from_millis(u64::try_from(heartbeat_ms).unwrap_or(0).max(1000));
        self.state = State::Established;
        self.last_read = now;
    }

    fn on_ok(&mut self, p: &Packet) -> Result<(), ProtocolError> {
        let ok = OkMessage::from_bytes(&self.open(p)?)?;
        if let Some(req) = self.pending.remove(&p.session_id) {
            match (Command(ok.cmd), req.kind) {
                (Command::BIND, RequestKind::Bind) => {
                    self.events.push_back(ClientEvent::BindOk {
                        user_id: req.user_id,
                    });
                }
                (Command::UNBIND, RequestKind::Unbind) => {
                    self.events.push_back(ClientEvent::Unbound {
                        user_id: req.user_id,
                    });
                }
                _ => {
                    self.pending.insert(p.session_id, req);
                }
            }
        }
        Ok(())
    }

    fn on_error(&mut self, p: &Packet, now: Instant) -> Result<(), ProtocolError> {
        let e = ErrorMessage::from_bytes(&self.open(p)?)?;
        let cmd = Command(e.cmd);
        match cmd {
            Command::FAST_CONNECT if matches!(self.state, State::Resuming { .. }) => {
                // mpush: forget the session and handshake on the same socket.
                self.pending.remove(&p.session_id);
                self.events
                    .push_back(ClientEvent::ResumeRejected { code: e.code });
                self.start_handshake(now);
            }
            Command::HANDSHAKE if e.code == ErrorCode::REPEAT_HANDSHAKE => {}
            Command::PUSH
                if matches!(e.code, ErrorCode::RETRY_LATER | ErrorCode::REJECTED)
                    && self
                        .pending
                        .get(&p.session_id)
                        .is_some_and(|r| r.kind == RequestKind::Push) =>
            {
                self.pending.remove(&p.session_id);
                self.events.push_back(ClientEvent::PushRefused {
                    request: p.session_id,
                    code: e.code,
                    reason: e.reason,
                });
            }
            Command::HANDSHAKE => self.close_with(
                ClientCloseReason::HandshakeRefused {
                    code: e.code,
                    reason: e.reason,
                },
                false,
            ),
            _ => self.close_with(
                ClientCloseReason::ServerError {
                    cmd,
                    code: e.code,
                    reason: e.reason,
                },
                true,
            ),
        }
        Ok(())
    }

    fn on_push(&mut self, p: &Packet) -> Result<(), ProtocolError> {
        if !self.is_established() {
            return Err(ProtocolError::State("push before handshake"));
        }
        let body = self.open(p)?;
        let msg = match self.profile {
            Profile::Legacy => {
                let ack_mode = AckMode::from_flags(p.flags);
                IncomingPush {
                    content: body,
                    message_id: None,
                    trace_id: String::new(),
                    ack_mode,
                    ack: None,
                    expires_at_ms: 0,
                }
            }
            Profile::V2 => {
                let env: v2::PushEnvelope = prost::Message::decode(body)
                    .map_err(|e| DecodeError::Protobuf(e.to_string()))?;
                IncomingPush {
                    content: env.content.into(),
                    message_id: Some(env.message_id),
                    trace_id: env.trace_id,
                    ack_mode: AckMode::from_v2(env.ack_mode),
                    ack: None,
                    expires_at_ms: env.expires_at_ms,
                }
            }
        };
        let token = AckToken {
            packet_id: p.session_id,
            message_id: msg.message_id,
        };
        let fresh = match msg.message_id {
            Some(id) => self.dedup.insert(id),
            None => self.legacy_dedup.insert(token.dedup_key()),
        };
        let expired = msg.expires_at_ms != 0
            && i64::try_from(msg.expires_at_ms).unwrap_or(i64::MAX) <= self.unix_ms(self.last_read);
        if !fresh || expired {
            // Already delivered (the server retried because our ACK was lost),
            // or too old to show: confirm again so the server stops retrying,
            // unless it is a BIZ message the app has not acknowledged yet.
            let confirm = match msg.ack_mode {
                AckMode::None => false,
                AckMode::Auto => true,
                AckMode::Biz => expired || self.window(&token).is_acked(token.dedup_key()),
            };
            if confirm {
                self.acks_out.push(token);
            }
            return Ok(());
        }
        match msg.ack_mode {
            AckMode::Auto => self.acks_out.push(token),
            AckMode::Biz | AckMode::None => {}
        }
        let ack = (msg.ack_mode == AckMode::Biz).then_some(token);
        self.events
            .push_back(ClientEvent::Message(IncomingPush { ack, ..msg }));
        Ok(())
    }

    // ----- helpers ------------------------------------------------------

    /// v2 ids live in the window carried across connections; legacy packet
    /// ids only mean something on this connection.
    fn window(&mut self, token: &AckToken) -> &mut DedupWindow {
        if token.message_id.is_some() {
            &mut self.dedup
        } else {
            &mut self.legacy_dedup
        }
    }

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

    /// Sends every queued ACK: one packet per message on legacy, one batched
    /// packet on v2.
    fn flush_acks(&mut self, now: Instant) {
        if self.acks_out.is_empty() || !self.is_established() {
            return;
        }
        let tokens = std::mem::take(&mut self.acks_out);
        match self.profile {
            Profile::Legacy => {
                for t in tokens {
                    let p = Packet::new(Command::ACK, t.packet_id, Flags::NONE, Bytes::new());
                    self.write(&Frame::Packet(p).to_bytes(), now);
                }
            }
            Profile::V2 => {
                let ack = Ack {
                    message_ids: tokens.iter().filter_map(|t| t.message_id).collect(),
                };
                let first = tokens.first().map_or(0, |t| t.packet_id);
                let bytes = self.sealed_bytes(Command::ACK, first, Flags::NONE, &ack.to_bytes());
                self.write(&bytes, now);
            }
        }
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

/// The classic ciphers; a build without them (feature `classic` off, the
/// transport-only browser module) refuses the classic profiles.
#[cfg(feature = "classic")]
fn cbc_cipher(key: &AesKey, iv: [u8; 16]) -> Result<SessionCipher, ProtocolError> {
    Ok(SessionCipher::cbc(key, iv))
}

#[cfg(feature = "classic")]
fn gcm_cipher(key: &AesKey) -> Result<SessionCipher, ProtocolError> {
    Ok(SessionCipher::gcm(key))
}

#[cfg(not(feature = "classic"))]
fn cbc_cipher(_: &AesKey, _: [u8; 16]) -> Result<SessionCipher, ProtocolError> {
    Err(ProtocolError::State(NO_CLASSIC))
}

#[cfg(not(feature = "classic"))]
fn gcm_cipher(_: &AesKey) -> Result<SessionCipher, ProtocolError> {
    Err(ProtocolError::State(NO_CLASSIC))
}

#[cfg(not(feature = "classic"))]
const NO_CLASSIC: &str = "this build speaks only the transport-secured profile (wss://)";

/// What this client offers: `caps`, and `FEATURE_PLAIN_BODIES` when this
/// build does not inflate (the server then sends it no compressed body).
fn offered(caps: v2::Capabilities) -> v2::Capabilities {
    if crypto::INFLATES {
        caps
    } else {
        caps.with_features(v2::FEATURE_PLAIN_BODIES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
