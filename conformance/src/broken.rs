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
                "server.errors.bind_before_handshake",
                "server.bounds.oversize_frame",
                "server.bounds.silence",
            ],
        }
    }
}

impl FromStr for Defect {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|d| d.name()).collect();
                format!("no defect `{s}` (known: {})", names.join(", "))
            })
    }
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
