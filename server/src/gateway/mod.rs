//! The access layer: listeners, per-connection drivers, the registry, limits.

pub mod conn;
pub mod registry;
pub mod transport;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::{debug, warn};

use crate::push::Hub;
use transport::{Tcp, Ws};

/// New connections per second per client IP (each one usually costs a full
/// RSA handshake), with a burst of the same size.
pub struct IpRateLimit {
    rate: f64,
    buckets: Mutex<HashMap<IpAddr, (f64, Instant)>>,
}

impl IpRateLimit {
    pub fn new(rate: u32) -> Self {
        Self {
            rate: f64::from(rate.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn allow(&self, ip: IpAddr) -> bool {
        let now = Instant::now();
        let mut b = self.buckets.lock();
        if b.len() > 100_000 {
            // Forget full buckets; they are equivalent to new ones.
            let rate = self.rate;
            b.retain(|_, (t, at)| *t + now.duration_since(*at).as_secs_f64() * rate < rate);
        }
        let e = b.entry(ip).or_insert((self.rate, now));
        e.0 = (e.0 + now.duration_since(e.1).as_secs_f64() * self.rate).min(self.rate);
        e.1 = now;
        if e.0 >= 1.0 {
            e.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Which kind of listener.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Tcp,
    Ws,
}

/// Accepts until shutdown. Over the connection limit, over the per-IP rate, or
/// out of file descriptors, new connections are refused and the rest served.
pub async fn accept_loop(
    listener: TcpListener,
    kind: Kind,
    hub: Arc<Hub>,
    mut shutdown: watch::Receiver<bool>,
) {
    let limit = IpRateLimit::new(hub.cfg.settings.limits.handshakes_per_ip);
    let max = hub.cfg.settings.limits.max_connections;
    let mut last_warn: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            r = listener.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // EMFILE/ENFILE and friends: back off briefly, keep serving.
                metrics::counter!("mpush_accept_errors_total").increment(1);
                if last_warn.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) {
                    warn!(error = %e, "accept failed; refusing new connections for a moment");
                    last_warn = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        if hub.connections.load(Ordering::Relaxed) >= max {
            metrics::counter!("mpush_connections_refused_total", "reason" => "max_connections")
                .increment(1);
            drop(stream);
            continue;
        }
        if !limit.allow(peer.ip()) {
            metrics::counter!("mpush_connections_refused_total", "reason" => "rate").increment(1);
            drop(stream);
            continue;
        }
        hub.connections.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("mpush_connections_total").increment(1);
        let hub = hub.clone();
        match kind {
            Kind::Tcp => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(conn::serve(Tcp(stream), hub, peer));
            }
            Kind::Ws => {
                tokio::spawn(upgrade(stream, hub, peer));
            }
        }
    }
}

async fn upgrade(stream: TcpStream, hub: Arc<Hub>, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let l = &hub.cfg.settings.limits;
    let config = WebSocketConfig::default()
        .read_buffer_size(l.ws_read_buffer)
        .write_buffer_size(0)
        .max_message_size(Some(l.max_packet_size + 64))
        .max_frame_size(Some(l.max_packet_size + 64));
    let handshake = tokio_tungstenite::accept_async_with_config(stream, Some(config));
    match tokio::time::timeout(Duration::from_secs(10), handshake).await {
        Ok(Ok(ws)) => conn::serve(Ws(ws), hub, peer).await,
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "websocket upgrade failed");
            hub.connections.fetch_sub(1, Ordering::Relaxed);
        }
        Err(_) => {
            hub.connections.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The node-to-node port (cluster mode): NODE_PUSH in, OK/ERROR out.
pub async fn internal_loop(
    listener: TcpListener,
    hub: Arc<Hub>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            r = listener.accept() => r,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_peer(stream, hub.clone()));
    }
}

async fn serve_peer(mut stream: TcpStream, hub: Arc<Hub>) {
    use bytes::BytesMut;
    use mpush_protocol::message::{Body, ErrorCode, ErrorMessage, OkMessage};
    use mpush_protocol::packet::{Command, Decoder, Flags, Frame, Packet};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let decoder = Decoder::new(hub.cfg.settings.limits.max_packet_size + 1024);
    let mut inbuf = BytesMut::with_capacity(4096);
    loop {
        match stream.read_buf(&mut inbuf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut out = BytesMut::new();
        loop {
            let frame = match decoder.decode(&mut inbuf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => return,
            };
            let Frame::Packet(p) = frame else { continue };
            let reply = if p.cmd != Command::NODE_PUSH {
                Packet::new(
                    Command::ERROR,
                    p.session_id,
                    Flags::NONE,
                    ErrorMessage::new(p.cmd, ErrorCode::UNSUPPORTED_CMD).to_bytes(),
                )
            } else {
                match prost::Message::decode(p.body.clone()) {
                    Ok(push) => {
                        if hub.deliver_local(push).await > 0 {
                            Packet::new(
                                Command::OK,
                                p.session_id,
                                Flags::NONE,
                                OkMessage::new(Command::NODE_PUSH, "delivered").to_bytes(),
                            )
                        } else {
                            Packet::new(
                                Command::ERROR,
                                p.session_id,
                                Flags::NONE,
                                ErrorMessage::new(Command::NODE_PUSH, ErrorCode::OFFLINE)
                                    .to_bytes(),
                            )
                        }
                    }
                    Err(_) => Packet::new(
                        Command::ERROR,
                        p.session_id,
                        Flags::NONE,
                        ErrorMessage::new(Command::NODE_PUSH, ErrorCode::DISPATCH_ERROR).to_bytes(),
                    ),
                }
            };
            Frame::Packet(reply).encode(&mut out);
        }
        if !out.is_empty() && stream.write_all(&out).await.is_err() {
            return;
        }
    }
}
