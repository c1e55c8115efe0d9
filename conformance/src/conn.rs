//! One connection of the kit to the server under test: the protocol's
//! client machine (what an mpush 0.8.1 client does, spec section 9) over TCP
//! or WebSocket binary frames, and beside it an observer that records every
//! frame the server sent as it arrived (heartbeats, commands, plaintext
//! ERRORs), so that cases can judge what the server did on the wire, not
//! only what the machine made of it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use mpush_protocol::Instant;
use mpush_protocol::client::{ClientConfig, ClientConnection, ClientEvent};
use mpush_protocol::dedup::DedupWindow;
use mpush_protocol::message::{Body, ErrorMessage};
use mpush_protocol::packet::{Command, Decoder, Flags, Frame};
use mpush_protocol::session::ResumeTicket;
use tokio::net::TcpStream;

/// Where the server under test listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `host:port` of the binary TCP gateway.
    Tcp(String),
    /// `ws://host:port/path`: the same frames in binary WebSocket messages.
    Ws(String),
}

impl Target {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Tcp(_) => "tcp",
            Self::Ws(_) => "ws",
        }
    }
}

type Link = crate::link::Link<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

/// A frame the server sent, as seen on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Heartbeat,
    Packet {
        cmd: Command,
        flags: Flags,
        session_id: i32,
        /// A plaintext ERROR's body, decoded.
        error: Option<ErrorMessage>,
    },
}

impl Seen {
    /// A plaintext ERROR for `cmd`, if this is one.
    pub fn error_for(&self, cmd: Command) -> Option<&ErrorMessage> {
        match self {
            Self::Packet { error: Some(e), .. } if e.cmd == cmd.0 => Some(e),
            _ => None,
        }
    }
}

/// Why a connection step failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("cannot connect to {0}: {1}")]
    Connect(String, String),
    #[error("{0}")]
    Io(String),
}

pub struct Conn {
    link: Link,
    pub machine: ClientConnection,
    observer: BytesMut,
    decoder: Decoder,
    /// Every frame the server sent, in order.
    pub seen: Vec<Seen>,
    /// Events of the machine not taken yet.
    events: VecDeque<ClientEvent>,
    /// The socket ended (the server closed it, or an error).
    pub closed: bool,
    /// Never send a heartbeat (the broken client fixture).
    pub drop_heartbeats: bool,
}

fn seed() -> [u8; 32] {
    let mut s = [0u8; 32];
    let _ = getrandom::fill(&mut s);
    s
}

pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

async fn open_link(target: &Target) -> Result<Link, ConnError> {
    let fail = |e: String| {
        let addr = match target {
            Target::Tcp(a) | Target::Ws(a) => a.clone(),
        };
        ConnError::Connect(addr, e)
    };
    match target {
        Target::Tcp(addr) => {
            let s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
                .await
                .map_err(|_| fail("timed out".into()))?
                .map_err(|e| fail(e.to_string()))?;
            let _ = s.set_nodelay(true);
            Ok(Link::Tcp(s))
        }
        Target::Ws(url) => {
            let (ws, _) = tokio::time::timeout(
                CONNECT_TIMEOUT,
                tokio_tungstenite::connect_async(url.as_str()),
            )
            .await
            .map_err(|_| fail("timed out".into()))?
            .map_err(|e| fail(e.to_string()))?;
            Ok(Link::Ws(Box::new(ws)))
        }
    }
}

impl Conn {
    fn new(link: Link, config: ClientConfig, ticket: Option<ResumeTicket>) -> Self {
        let machine = ClientConnection::new(
            Arc::new(config),
            seed(),
            Instant::now(),
            unix_ms(),
            ticket,
            DedupWindow::default(),
        );
        Self {
            link,
            machine,
            observer: BytesMut::new(),
            decoder: Decoder::new(64 << 20),
            seen: Vec::new(),
            events: VecDeque::new(),
            closed: false,
            drop_heartbeats: false,
        }
    }

    /// Connects; the machine starts its handshake (or fast connect, with a
    /// ticket) at once.
    pub async fn open(
        target: &Target,
        config: ClientConfig,
        ticket: Option<ResumeTicket>,
    ) -> Result<Self, ConnError> {
        let mut c = Self::new(open_link(target).await?, config, ticket);
        c.flush().await;
        Ok(c)
    }

    /// A connection on which the kit speaks raw bytes only (the machine is
    /// made but told nothing: nothing of it is sent).
    pub async fn open_raw(target: &Target, config: ClientConfig) -> Result<Self, ConnError> {
        let mut c = Self::new(open_link(target).await?, config, None);
        // Drop the handshake the machine queued: raw means raw.
        while c.machine.poll_transmit().is_some() {}
        Ok(c)
    }

    /// The end of the handshake (or fast connect): `Connected`, `Closed`, or
    /// `None` when neither came within `within`.
    pub async fn handshake_end(&mut self, within: Duration) -> Option<ClientEvent> {
        self.event(within, |e| {
            matches!(
                e,
                ClientEvent::Connected { .. } | ClientEvent::Closed { .. }
            )
        })
        .await
    }

    /// Writes bytes as they are (one WebSocket message on WebSocket).
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        if !self.link.write(bytes).await {
            self.closed = true;
        }
    }

    /// Writes what the machine queued.
    pub async fn flush(&mut self) {
        while let Some(b) = self.machine.poll_transmit() {
            if self.drop_heartbeats && b[..] == [mpush_protocol::packet::HEARTBEAT_BYTE] {
                continue;
            }
            self.send_raw(&b).await;
        }
        while let Some(e) = self.machine.poll_event() {
            self.events.push_back(e);
        }
    }

    fn observe(&mut self, data: &[u8]) {
        self.observer.extend_from_slice(data);
        loop {
            match self.decoder.decode(&mut self.observer) {
                Ok(Some(Frame::Heartbeat)) => self.seen.push(Seen::Heartbeat),
                Ok(Some(Frame::Packet(p))) => {
                    let error = (p.cmd == Command::ERROR && !p.flags.contains(Flags::CRYPTO))
                        .then(|| ErrorMessage::from_bytes(&p.body).ok())
                        .flatten();
                    self.seen.push(Seen::Packet {
                        cmd: p.cmd,
                        flags: p.flags,
                        session_id: p.session_id,
                        error,
                    });
                }
                Ok(None) => break,
                Err(_) => {
                    self.observer.clear();
                    break;
                }
            }
        }
    }

    /// Reads once (or runs the machine's timer) until `deadline`; false when
    /// the deadline passed or the socket is closed.
    async fn step(&mut self, deadline: tokio::time::Instant) -> bool {
        if self.closed {
            return false;
        }
        let timer = self
            .machine
            .poll_timeout()
            .map(tokio::time::Instant::from_std)
            .unwrap_or(deadline)
            .min(deadline);
        let mut buf = vec![0u8; 64 << 10];
        let read = self.link.read(&mut buf);
        let got = tokio::select! {
            r = read => Some(r),
            _ = tokio::time::sleep_until(timer) => None,
        };
        match got {
            Some(Some(data)) => {
                self.observe(&data);
                self.machine.handle_input(&data, Instant::now());
            }
            Some(None) => self.closed = true,
            None => self.machine.handle_timeout(Instant::now()),
        }
        self.flush().await;
        !self.closed && tokio::time::Instant::now() < deadline
    }

    /// The next machine event matching `f` within `within` (others are kept).
    pub async fn event(
        &mut self,
        within: Duration,
        f: impl Fn(&ClientEvent) -> bool,
    ) -> Option<ClientEvent> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(i) = self.events.iter().position(&f) {
                return self.events.remove(i);
            }
            if !self.step(deadline).await {
                return self
                    .events
                    .iter()
                    .position(&f)
                    .and_then(|i| self.events.remove(i));
            }
        }
    }

    /// A frame matching `f` that arrives from now on, within `within`.
    pub async fn frame(&mut self, within: Duration, f: impl Fn(&Seen) -> bool) -> Option<Seen> {
        let deadline = tokio::time::Instant::now() + within;
        let mut from = self.seen.len();
        loop {
            if let Some(s) = self.seen[from..].iter().find(|s| f(s)) {
                return Some(s.clone());
            }
            from = self.seen.len();
            if !self.step(deadline).await {
                return self.seen[from..].iter().find(|s| f(s)).cloned();
            }
        }
    }

    /// True when the server closed the connection within `within`.
    pub async fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.step(deadline).await {}
        self.closed
    }

    /// Reads (and records) what arrives without running the machine, so
    /// nothing is sent, not even a heartbeat; true when the server closed
    /// the connection before `deadline`.
    pub async fn silent_until(&mut self, deadline: tokio::time::Instant) -> bool {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let read = self.link.read(&mut buf);
            match tokio::time::timeout_at(deadline, read).await {
                Ok(Some(data)) => self.observe(&data),
                Ok(None) => {
                    self.closed = true;
                    return true;
                }
                Err(_) => return false,
            }
        }
    }

    /// Reads for `d`, keeping what arrives.
    pub async fn settle(&mut self, d: Duration) {
        let deadline = tokio::time::Instant::now() + d;
        while self.step(deadline).await {}
    }

    /// The next machine event, whatever it is, within `within`.
    pub async fn next_event(&mut self, within: Duration) -> Option<ClientEvent> {
        self.event(within, |_| true).await
    }

    /// The events taken so far and not matched, for failure messages.
    pub fn pending_events(&self) -> Vec<ClientEvent> {
        self.events.iter().cloned().collect()
    }
}
