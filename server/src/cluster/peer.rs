//! Node-to-node forwarding over the internal port: NODE_PUSH_BATCH packets
//! (one message, many recipients) in the 13-byte framing, answered by packet
//! id with a `NodePushBatchResult`. One connection per peer, pipelined; a
//! broken connection fails its pending requests and is re-opened by the next
//! forward. `serve` is the receiving side.

use std::collections::HashMap;
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

/// The shortest a connection attempt to a peer is given (a round trip and
/// the peer's challenge on a loaded host).
const ATTEMPT_MIN: Duration = Duration::from_millis(250);

async fn run_peer(
    node: String,
    addr: String,
    secret: Arc<str>,
    mut rx: mpsc::Receiver<(v2::NodePushBatch, Reply)>,
    timeout: Duration,
) {
    let unreachable = |why: String| ForwardError::Unreachable(node.clone(), why);
    // A connection the peer closed before authenticating (its port busy
    // with strangers), or one that never answers (a half-open connection:
    // the handshake's last ACK lost under a SYN flood), is tried again with
    // a new one, within the forward's timeout: each attempt gets a share.
    let until = tokio::time::Instant::now() + timeout;
    let attempt = (timeout / 4).max(ATTEMPT_MIN);
    let mut last = String::new();
    let mut connected = None;
    while connected.is_none() && tokio::time::Instant::now() < until {
        let left = until
            .saturating_duration_since(tokio::time::Instant::now())
            .min(attempt);
        match tokio::time::timeout(left, TcpStream::connect(&addr)).await {
            Ok(Ok(mut s)) => {
                let _ = s.set_nodelay(true);
                match super::node_auth::connect(&mut s, &secret, left).await {
                    Ok(()) => connected = Some(s),
                    Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                        warn!(%node, %addr, error = %e, "node authentication failed");
                        return fail_all(&mut rx, unreachable(e.to_string()));
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            // Nothing listens: the node is down, no use trying again.
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return fail_all(&mut rx, unreachable(e.to_string()));
            }
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "connect timed out".into(),
        }
        if connected.is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let Some(mut stream) = connected else {
        return fail_all(
            &mut rx,
            unreachable(if last.is_empty() {
                "timed out".into()
            } else {
                last
            }),
        );
    };
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

/// Connections that have said nothing yet, at most: from one address, and
/// in all. Over either, the oldest of them (of that address) is closed.
const SILENT_PER_IP: usize = 16;
const SILENT_MAX: usize = 256;
/// Connections answering the challenge at once (a byte arrived; they have
/// the rest of the deadline to finish), and authenticated peers.
const ANSWERING_MAX: usize = 64;
const PEERS_MAX: usize = 256;
/// The longest a connection may take to authenticate.
const AUTH_DEADLINE: Duration = Duration::from_secs(1);

/// Connections that have not answered the challenge: per address, in
/// arrival order, so that the oldest can be closed to make room. A peer
/// answers within a round trip and leaves this queue at its first byte: a
/// stranger holding silent sockets only ever evicts its own.
#[derive(Default)]
struct Silent {
    next: u64,
    per_ip: HashMap<std::net::IpAddr, usize>,
    order: std::collections::VecDeque<(u64, std::net::IpAddr, Arc<tokio::sync::Notify>)>,
}

impl Silent {
    /// Admits a connection from `ip`, closing the oldest silent one of that
    /// address (or of all) when a bound is reached.
    fn admit(&mut self, ip: std::net::IpAddr) -> (u64, Arc<tokio::sync::Notify>) {
        if self.per_ip.get(&ip).copied().unwrap_or(0) >= SILENT_PER_IP {
            self.evict(|x| x == ip);
        } else if self.order.len() >= SILENT_MAX {
            self.evict(|_| true);
        }
        self.next += 1;
        let notify = Arc::new(tokio::sync::Notify::new());
        self.order.push_back((self.next, ip, notify.clone()));
        *self.per_ip.entry(ip).or_default() += 1;
        metrics::counter!("mpush_node_port_silent_total").increment(1);
        (self.next, notify)
    }

    fn evict(&mut self, which: impl Fn(std::net::IpAddr) -> bool) {
        if let Some(i) = self.order.iter().position(|(_, ip, _)| which(*ip))
            && let Some((_, ip, notify)) = self.order.remove(i)
        {
            notify.notify_one();
            self.release(ip);
            metrics::counter!("mpush_node_port_evicted_total").increment(1);
        }
    }

    /// The connection `id` spoke, failed or closed (an evicted one is gone
    /// already).
    fn done(&mut self, id: u64) {
        if let Some(i) = self.order.iter().position(|(x, ..)| *x == id)
            && let Some((_, ip, _)) = self.order.remove(i)
        {
            self.release(ip);
        }
    }

    fn release(&mut self, ip: std::net::IpAddr) {
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
    }
}

/// The node-to-node port: authenticated peers' batches in, results out.
/// Strangers cannot crowd peers out: a connection that has not proved the
/// cluster secret gets one second; while it says nothing it sits in a
/// bounded queue (per address and in all) whose oldest is closed to make
/// room; answering connections and authenticated peers have budgets of
/// their own.
pub async fn serve(
    listener: TcpListener,
    delivery: Weak<dyn Delivery>,
    secret: String,
    timeout: Duration,
    max_packet: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let peers = Arc::new(tokio::sync::Semaphore::new(PEERS_MAX));
    let answering = Arc::new(tokio::sync::Semaphore::new(ANSWERING_MAX));
    let silent = Arc::new(Mutex::new(Silent::default()));
    let secret: Arc<str> = secret.into();
    let deadline = timeout.min(AUTH_DEADLINE);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            r = listener.accept() => r,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let (id, evicted) = silent.lock().admit(peer.ip());
        let _ = stream.set_nodelay(true);
        let (delivery, secret) = (delivery.clone(), secret.clone());
        let (peers, answering, silent) = (peers.clone(), answering.clone(), silent.clone());
        tokio::spawn(async move {
            let auth = tokio::time::timeout(deadline, async {
                let mut stream = stream;
                let a = super::node_auth::hello(&mut stream).await?;
                // Silent, it may be closed to make room; once it speaks,
                // it has the rest of the deadline (within a bounded number).
                tokio::select! {
                    r = stream.readable() => r?,
                    _ = evicted.notified() => return Err(std::io::Error::other("closed to make room")),
                }
                let permit = match answering.clone().try_acquire_owned() {
                    Ok(p) => {
                        silent.lock().done(id);
                        Some(p)
                    }
                    Err(_) => None,
                };
                tokio::select! {
                    r = super::node_auth::answer(&mut stream, &secret, &a) => r?,
                    _ = evicted.notified(), if permit.is_none() => {
                        return Err(std::io::Error::other("closed to make room"));
                    }
                }
                drop(permit);
                Ok(stream)
            })
            .await;
            silent.lock().done(id);
            let stream = match auth {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    metrics::counter!("mpush_node_auth_refused_total").increment(1);
                    tracing::debug!(%peer, error = %e, "node port: connection refused");
                    return;
                }
                Err(_) => {
                    metrics::counter!("mpush_node_auth_refused_total").increment(1);
                    return;
                }
            };
            let Ok(_permit) = peers.try_acquire_owned() else {
                warn!(%peer, "node port: {PEERS_MAX} peers connected already");
                return;
            };
            serve_peer(stream, delivery, max_packet).await;
        });
    }
}

/// An authenticated peer's batches, answered in order.
async fn serve_peer(mut stream: TcpStream, delivery: Weak<dyn Delivery>, max_packet: usize) {
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
