//! A deliberately broken server, to show that the cases fail when they
//! should: a proxy in front of a real server that breaks it in named ways
//! on the wire (frame headers and plaintext bodies are enough). The kit's
//! own tests run it; `mpush-conformance broken-proxy` runs it by hand.

use std::str::FromStr;

use bytes::BytesMut;
use mpush_protocol::message::{Body, ErrorMessage};
use mpush_protocol::packet::{Command, Decoder, Flags, Frame, Packet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One way of being broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    /// Heartbeats are not echoed (spec 1.2).
    NoPong,
    /// KICK never reaches the replaced device (7.4).
    NoKick,
    /// A refused fast connect says ERROR code 0 instead of 103/104 (5.5).
    WrongResumeCode,
    /// When the server closes a connection, the client's side stays open
    /// (every "and the connection closes" case).
    KeepOpen,
}

impl Defect {
    pub const ALL: [Defect; 4] = [
        Self::NoPong,
        Self::NoKick,
        Self::WrongResumeCode,
        Self::KeepOpen,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::NoPong => "no-pong",
            Self::NoKick => "no-kick",
            Self::WrongResumeCode => "wrong-resume-code",
            Self::KeepOpen => "keep-open",
        }
    }

    /// The server cases this defect must make fail.
    pub fn breaks(self) -> &'static [&'static str] {
        match self {
            Self::NoPong => &["server.framing.heartbeat"],
            Self::NoKick => &["server.bind.duplicate_login_kick"],
            Self::WrongResumeCode => &[
                "server.fast_connect.wrong_device",
                "server.fast_connect.unknown_session",
            ],
            Self::KeepOpen => &[
                "server.errors.unsupported_command",
                "server.errors.malformed_body",
                "server.errors.bind_before_handshake",
                "server.bounds.oversize_frame",
                "server.bounds.silence",
            ],
        }
    }
}

impl FromStr for Defect {
    type Err = UnknownDefect;

    fn from_str(s: &str) -> Result<Self, UnknownDefect> {
        by_name(&Self::ALL, Self::name, "defect", s)
    }
}

/// A defect named that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no {kind} `{name}` (known: {known})")]
pub struct UnknownDefect {
    kind: &'static str,
    name: String,
    known: String,
}

fn by_name<T: Copy>(
    all: &[T],
    name: fn(T) -> &'static str,
    kind: &'static str,
    s: &str,
) -> Result<T, UnknownDefect> {
    all.iter()
        .copied()
        .find(|d| name(*d) == s)
        .ok_or_else(|| UnknownDefect {
            kind,
            name: s.to_owned(),
            known: all.iter().map(|d| name(*d)).collect::<Vec<_>>().join(", "),
        })
}

/// Serves connections on `listener`, each relayed to `upstream` with
/// `defect` applied, until the task is dropped.
pub async fn serve(listener: TcpListener, upstream: String, defect: Defect) {
    while let Ok((client, _)) = listener.accept().await {
        let upstream = upstream.clone();
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(&upstream).await {
                relay(client, server, defect).await;
            }
        });
    }
}

async fn relay(client: TcpStream, server: TcpStream, defect: Defect) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async move {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = cr.read(&mut buf).await {
            if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = sw.shutdown().await;
    };
    let down = async move {
        let decoder = Decoder::new(64 << 20);
        let mut pending = BytesMut::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(n) if n > 0 => n,
                _ => break,
            };
            pending.extend_from_slice(&buf[..n]);
            let mut out = BytesMut::new();
            while let Ok(Some(frame)) = decoder.decode(&mut pending) {
                if let Some(f) = mangle(frame, defect) {
                    f.encode(&mut out);
                }
            }
            if cw.write_all(&out).await.is_err() {
                return;
            }
        }
        if defect == Defect::KeepOpen {
            // Hold the client's side open for a while after the server left.
            tokio::time::sleep(std::time::Duration::from_secs(120)).await;
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}

fn mangle(frame: Frame, defect: Defect) -> Option<Frame> {
    match (defect, frame) {
        (Defect::NoPong, Frame::Heartbeat) => None,
        (Defect::NoKick, Frame::Packet(p)) if p.cmd == Command::KICK => None,
        (Defect::WrongResumeCode, Frame::Packet(p))
            if p.cmd == Command::ERROR && !p.flags.contains(Flags::CRYPTO) =>
        {
            match ErrorMessage::from_bytes(&p.body) {
                Ok(mut e) if e.cmd == Command::FAST_CONNECT.0 => {
                    e.code.0 = 0;
                    Some(Frame::Packet(Packet::new(
                        p.cmd,
                        p.session_id,
                        p.flags,
                        e.to_bytes(),
                    )))
                }
                _ => Some(Frame::Packet(p)),
            }
        }
        (_, f) => Some(f),
    }
}

/// One way of being a broken client (the client mode's fixture).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientDefect {
    /// Never sends a heartbeat (6.2).
    NoHeartbeat,
    /// Reconnects at once, every time (9.9).
    TightLoop,
    /// Never fast-connects: a full handshake every time (5.5).
    NoResume,
    /// Hands every message to the application twice.
    DoubleDelivery,
    /// Never acknowledges a BIZ message.
    NoBizAck,
    /// Does not tell the application of a KICK.
    IgnoreKick,
}

impl ClientDefect {
    pub const ALL: [ClientDefect; 6] = [
        Self::NoHeartbeat,
        Self::TightLoop,
        Self::NoResume,
        Self::DoubleDelivery,
        Self::NoBizAck,
        Self::IgnoreKick,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::NoHeartbeat => "no-heartbeat",
            Self::TightLoop => "tight-loop",
            Self::NoResume => "no-resume",
            Self::DoubleDelivery => "double-delivery",
            Self::NoBizAck => "no-biz-ack",
            Self::IgnoreKick => "ignore-kick",
        }
    }

    /// The client cases this defect must make fail.
    pub fn breaks(self) -> &'static [&'static str] {
        match self {
            Self::NoHeartbeat => &["client.heartbeat"],
            Self::TightLoop => &["client.backoff"],
            Self::NoResume => &["client.fast_connect"],
            Self::DoubleDelivery => &["client.push.duplicate"],
            Self::NoBizAck => &["client.push.biz_ack"],
            Self::IgnoreKick => &["client.kick"],
        }
    }
}

impl FromStr for ClientDefect {
    type Err = UnknownDefect;

    fn from_str(s: &str) -> Result<Self, UnknownDefect> {
        by_name(&Self::ALL, Self::name, "client defect", s)
    }
}

/// A client that speaks the adapter contract (conformance/README.md), built
/// on the kit's own connection, broken as named.
pub async fn run_client(defect: ClientDefect) {
    use crate::conn::{Conn, Target};
    use mpush_protocol::client::{ClientConfig, ClientEvent};
    use mpush_protocol::crypto::RsaPublic;
    use mpush_protocol::session::DeviceInfo;
    use std::time::Duration;

    let var = |k: &str| std::env::var(format!("MPUSH_CONFORMANCE_{k}")).unwrap_or_default();
    let server = var("SERVER");
    let target = if server.starts_with("ws://") {
        Target::Ws(server)
    } else {
        Target::Tcp(server)
    };
    let key = match RsaPublic::from_text(&var("PUBLIC_KEY")) {
        Ok(k) => std::sync::Arc::new(k),
        Err(e) => {
            eprintln!("MPUSH_CONFORMANCE_PUBLIC_KEY: {e}");
            return;
        }
    };
    let (user, device) = (var("USER"), var("DEVICE"));
    let say = |v: serde_json::Value| println!("{v}");
    let mut ticket = None;
    let mut wait = Duration::from_millis(500);
    loop {
        let cfg = ClientConfig::new(
            key.clone(),
            DeviceInfo {
                device_id: device.clone(),
                os_name: "broken".into(),
                os_version: "1".into(),
                client_version: "0.0.1".into(),
            },
        );
        let resume = if defect == ClientDefect::NoResume {
            None
        } else {
            ticket.clone()
        };
        if let Ok(mut c) = Conn::open(&target, cfg, resume).await {
            c.drop_heartbeats = defect == ClientDefect::NoHeartbeat;
            while let Some(e) = c.next_event(Duration::from_secs(3600)).await {
                match e {
                    ClientEvent::Connected {
                        resumed, ticket: t, ..
                    } => {
                        wait = Duration::from_millis(500);
                        if t.is_some() {
                            ticket = t;
                        }
                        say(serde_json::json!({"event": "connected", "resumed": resumed}));
                        let _ = c
                            .machine
                            .bind(&user, "", "", mpush_protocol::Instant::now());
                        c.flush().await;
                    }
                    ClientEvent::BindOk { user_id } => {
                        say(serde_json::json!({"event": "bound", "userId": user_id}))
                    }
                    ClientEvent::Message(m) => {
                        let line = serde_json::json!({
                            "event": "message",
                            "text": String::from_utf8_lossy(&m.content),
                            "needsAck": m.ack.is_some(),
                        });
                        say(line.clone());
                        if defect == ClientDefect::DoubleDelivery {
                            say(line);
                        }
                        if let (Some(t), false) = (m.ack, defect == ClientDefect::NoBizAck) {
                            let _ = c.machine.ack(t, mpush_protocol::Instant::now());
                            c.flush().await;
                        }
                    }
                    ClientEvent::Kicked { device_id, .. } if defect != ClientDefect::IgnoreKick => {
                        say(serde_json::json!({"event": "kicked", "deviceId": device_id}))
                    }
                    ClientEvent::Closed { .. } => break,
                    _ => {}
                }
                if c.closed {
                    break;
                }
            }
        }
        say(serde_json::json!({"event": "disconnected"}));
        if defect != ClientDefect::TightLoop {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(8));
        }
    }
}
