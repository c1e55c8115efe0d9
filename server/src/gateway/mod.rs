//! The access layer: listeners, per-connection drivers, the registry, limits.

pub mod conn;
pub mod limits;
pub mod registry;
pub mod transport;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::{debug, warn};

use crate::push::Hub;
use limits::{IpRateLimit, IpSlot};
use transport::{Tcp, Ws};

/// Which kind of listener.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Tcp,
    Ws,
}

/// Accepts until shutdown. Over the connection limit, over the per-IP rate or
/// count, or out of file descriptors, new connections are refused and the
/// rest served.
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
        let Some(slot) = hub.per_ip.acquire(peer.ip()) else {
            metrics::counter!("mpush_connections_refused_total", "reason" => "per_ip").increment(1);
            drop(stream);
            continue;
        };
        if !limit.allow(peer.ip()) {
            metrics::counter!("mpush_connections_refused_total", "reason" => "rate").increment(1);
            drop(stream);
            continue;
        }
        hub.connections.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("mpush_connections_total").increment(1);
        tune(&stream, hub.cfg.settings.limits.tcp_keepalive_secs);
        let hub = hub.clone();
        match kind {
            Kind::Tcp => {
                tokio::spawn(conn::serve(Tcp(stream), hub, peer, slot));
            }
            Kind::Ws => {
                tokio::spawn(upgrade(stream, hub, peer, slot));
            }
        }
    }
}

/// No Nagle delay; TCP keepalive so a peer that vanished without a FIN (a
/// phone that lost its network) is found even while the protocol is idle.
fn tune(stream: &TcpStream, keepalive_secs: u64) {
    let _ = stream.set_nodelay(true);
    if keepalive_secs > 0 {
        let idle = Duration::from_secs(keepalive_secs);
        let ka = socket2::TcpKeepalive::new()
            .with_time(idle)
            .with_interval(Duration::from_secs(keepalive_secs.div_ceil(3).max(1)));
        let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&ka);
    }
}

async fn upgrade(stream: TcpStream, hub: Arc<Hub>, peer: SocketAddr, slot: IpSlot) {
    let l = &hub.cfg.settings.limits;
    let config = WebSocketConfig::default()
        .read_buffer_size(l.ws_read_buffer)
        .write_buffer_size(0)
        .max_message_size(Some(l.max_packet_size + 64))
        .max_frame_size(Some(l.max_packet_size + 64));
    let handshake = tokio_tungstenite::accept_async_with_config(stream, Some(config));
    match tokio::time::timeout(Duration::from_secs(10), handshake).await {
        Ok(Ok(ws)) => conn::serve(Ws(ws), hub, peer, slot).await,
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
    // Peers hold one pipelined connection each; this bounds what a stranger
    // can open before failing to authenticate.
    let peers = Arc::new(tokio::sync::Semaphore::new(256));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            r = listener.accept() => r,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let Ok(permit) = peers.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let hub = hub.clone();
        tokio::spawn(async move {
            let _permit = permit;
            serve_peer(stream, peer, hub).await;
        });
    }
}

async fn serve_peer(mut stream: TcpStream, peer: SocketAddr, hub: Arc<Hub>) {
    // Authenticated before a single push is read.
    let c = &hub.cfg.settings.cluster;
    let limit = Duration::from_millis(c.timeout_ms);
    if let Err(e) = crate::cluster::node_auth::accept(&mut stream, &c.secret, limit).await {
        metrics::counter!("mpush_node_auth_refused_total").increment(1);
        warn!(%peer, error = %e, "node port: peer refused");
        return;
    }
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
