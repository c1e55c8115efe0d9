//! Node-to-node forwarding over the internal port: NODE_PUSH_BATCH packets
//! (one message, many recipients) in the 13-byte framing, answered by packet
//! id with a `NodePushBatchResult`. One connection per peer, pipelined; a
//! broken connection fails its pending requests and is re-opened by the next
//! forward. `serve` is the receiving side.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::BytesMut;
use mpush_protocol::message::{Body, ErrorCode, ErrorMessage, v2};
use mpush_protocol::packet::{Command, Decoder, Flags, Frame, Packet};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::warn;

use super::Delivery;

/// Why a forward did not deliver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    #[error("node {0} failed to deliver")]
    Failed(String),
    #[error("node {0} unreachable: {1}")]
    Unreachable(String, String),
}

type Reply = oneshot::Sender<Result<Vec<u32>, ForwardError>>;

#[derive(Clone)]
struct Peer {
    tx: mpsc::Sender<(v2::NodePushBatch, Reply)>,
}

pub struct Peers {
    peers: Mutex<HashMap<String, Peer>>,
    /// `cluster.secret`, proven to each peer before anything is sent.
    secret: Arc<str>,
}

impl Peers {
    pub fn new(secret: String) -> Self {
        Self {
            peers: Mutex::new(HashMap::new()),
            secret: secret.into(),
        }
    }

    /// Forwards one batch to the node listening on `addr`.
    pub async fn forward(
        &self,
        node: &str,
        addr: &str,
        batch: v2::NodePushBatch,
        timeout: Duration,
    ) -> Result<Vec<u32>, ForwardError> {
        let peer = {
            let mut peers = self.peers.lock();
            match peers.get(addr) {
                Some(p) if !p.tx.is_closed() => p.clone(),
                _ => {
                    let (tx, rx) = mpsc::channel(1024);
                    tokio::spawn(run_peer(
                        node.to_owned(),
                        addr.to_owned(),
                        self.secret.clone(),
                        rx,
                        timeout,
                    ));
                    let p = Peer { tx };
                    peers.insert(addr.to_owned(), p.clone());
                    p
                }
            }
        };
        let (reply, rx) = oneshot::channel();
        let unreachable = |why: &str| ForwardError::Unreachable(node.to_owned(), why.to_owned());
        peer.tx
            .send((batch, reply))
            .await
            .map_err(|_| unreachable("connection closed"))?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(unreachable("connection closed")),
            Err(_) => Err(unreachable("timed out")),
        }
    }
}

async fn run_peer(
    node: String,
    addr: String,
    secret: Arc<str>,
    mut rx: mpsc::Receiver<(v2::NodePushBatch, Reply)>,
    timeout: Duration,
) {
    let unreachable = |why: String| ForwardError::Unreachable(node.clone(), why);
    let mut stream = match tokio::time::timeout(timeout, TcpStream::connect(&addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return fail_all(&mut rx, unreachable(e.to_string())),
        Err(_) => return fail_all(&mut rx, unreachable("connect timed out".into())),
    };
    let _ = stream.set_nodelay(true);
    if let Err(e) = super::node_auth::connect(&mut stream, &secret, timeout).await {
        warn!(%node, %addr, error = %e, "node authentication failed");
        return fail_all(&mut rx, unreachable(e.to_string()));
    }
    let mut pending: HashMap<i32, Reply> = HashMap::new();
    let mut next_id: i32 = 1;
    let mut inbuf = BytesMut::with_capacity(4096);
    let decoder = Decoder::new(16 << 20);
    loop {
        tokio::select! {
            req = rx.recv() => {
                let Some((batch, reply)) = req else { return };
                let id = next_id;
                next_id = if next_id == i32::MAX { 1 } else { next_id + 1 };
                pending.insert(id, reply);
                let body = prost::Message::encode_to_vec(&batch);
                let frame = Frame::Packet(Packet::new(Command::NODE_PUSH_BATCH, id, Flags::NONE, body));
                if let Err(e) = stream.write_all(&frame.to_bytes()).await {
                    return fail_pending(pending, &mut rx, unreachable(e.to_string()));
                }
            }
            r = stream.read_buf(&mut inbuf) => {
                match r {
                    Ok(0) | Err(_) => return fail_pending(pending, &mut rx, unreachable("connection lost".into())),
                    Ok(_) => {}
                }
                while let Ok(Some(frame)) = decoder.decode(&mut inbuf) {
                    let Frame::Packet(p) = frame else { continue };
                    let Some(reply) = pending.remove(&p.session_id) else { continue };
                    let result = match p.cmd {
                        Command::NODE_PUSH_BATCH => {
                            prost::Message::decode(p.body.clone())
                                .map(|r: v2::NodePushBatchResult| r.delivered)
                                .map_err(|_| ForwardError::Failed(node.clone()))
                        }
                        _ => Err(ForwardError::Failed(node.clone())),
                    };
                    let _ = reply.send(result);
                }
            }
        }
    }
}

fn fail_all(rx: &mut mpsc::Receiver<(v2::NodePushBatch, Reply)>, e: ForwardError) {
    rx.close();
    while let Ok((_, reply)) = rx.try_recv() {
        let _ = reply.send(Err(e.clone()));
    }
}

fn fail_pending(
    pending: HashMap<i32, Reply>,
    rx: &mut mpsc::Receiver<(v2::NodePushBatch, Reply)>,
    e: ForwardError,
) {
    for (_, reply) in pending {
        let _ = reply.send(Err(e.clone()));
    }
    fail_all(rx, e);
}

/// The node-to-node port: authenticated peers' batches in, results out.
pub async fn serve(
    listener: TcpListener,
    delivery: Weak<dyn Delivery>,
    secret: String,
    timeout: Duration,
    max_packet: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    // Peers hold one pipelined connection each; this bounds what a stranger
    // can open before failing to authenticate.
    let peers = Arc::new(tokio::sync::Semaphore::new(256));
    let secret: Arc<str> = secret.into();
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
        let (delivery, secret) = (delivery.clone(), secret.clone());
        tokio::spawn(async move {
            let _permit = permit;
            serve_peer(stream, peer, delivery, &secret, timeout, max_packet).await;
        });
    }
}

async fn serve_peer(
    mut stream: TcpStream,
    peer: SocketAddr,
    delivery: Weak<dyn Delivery>,
    secret: &str,
    timeout: Duration,
    max_packet: usize,
) {
    // Authenticated before a single push is read.
    if let Err(e) = super::node_auth::accept(&mut stream, secret, timeout).await {
        metrics::counter!("mpush_node_auth_refused_total").increment(1);
        warn!(%peer, error = %e, "node port: peer refused");
        return;
    }
    let decoder = Decoder::new(max_packet);
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
            let Some(d) = delivery.upgrade() else { return };
            let reply = answer(&*d, p).await;
            Frame::Packet(reply).encode(&mut out);
        }
        if !out.is_empty() && stream.write_all(&out).await.is_err() {
            return;
        }
    }
}

async fn answer(d: &dyn Delivery, p: Packet) -> Packet {
    let error = |cmd: Command, code: ErrorCode| {
        Packet::new(
            Command::ERROR,
            p.session_id,
            Flags::NONE,
            ErrorMessage::new(cmd, code).to_bytes(),
        )
    };
    if p.cmd != Command::NODE_PUSH_BATCH {
        return error(p.cmd, ErrorCode::UNSUPPORTED_CMD);
    }
    let Ok(batch) = prost::Message::decode(p.body.clone()) else {
        return error(p.cmd, ErrorCode::DISPATCH_ERROR);
    };
    let delivered = d.deliver_batch(batch).await;
    let body = prost::Message::encode_to_vec(&v2::NodePushBatchResult { delivered });
    Packet::new(Command::NODE_PUSH_BATCH, p.session_id, Flags::NONE, body)
}
