//! Node-to-node forwarding over the internal port: NODE_PUSH packets in the
//! 13-byte framing, answered with OK or ERROR by packet id. One connection per
//! peer, pipelined; a broken connection fails its pending requests and is
//! re-opened by the next forward.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use mpush_protocol::message::{Body, ErrorCode, ErrorMessage, v2};
use mpush_protocol::packet::{Command, Decoder, Flags, Frame, Packet};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// Why a forward did not deliver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    #[error("user offline on node {0}")]
    Offline(String),
    #[error("node {0} failed to deliver")]
    Failed(String),
    #[error("node {0} unreachable: {1}")]
    Unreachable(String, String),
}

type Reply = oneshot::Sender<Result<(), ForwardError>>;

#[derive(Clone)]
struct Peer {
    tx: mpsc::Sender<(v2::NodePush, Reply)>,
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

    /// Forwards one push to the node listening on `addr`.
    pub async fn forward(
        &self,
        node: &str,
        addr: &str,
        push: v2::NodePush,
        timeout: Duration,
    ) -> Result<(), ForwardError> {
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
            .send((push, reply))
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
    mut rx: mpsc::Receiver<(v2::NodePush, Reply)>,
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
        tracing::warn!(%node, %addr, error = %e, "node authentication failed");
        return fail_all(&mut rx, unreachable(e.to_string()));
    }
    let pending: Arc<Mutex<HashMap<i32, Reply>>> = Arc::default();
    let mut next_id: i32 = 1;
    let mut inbuf = BytesMut::with_capacity(4096);
    let decoder = Decoder::new(1 << 20);
    loop {
        tokio::select! {
            req = rx.recv() => {
                let Some((push, reply)) = req else { return };
                let id = next_id;
                next_id = if next_id == i32::MAX { 1 } else { next_id + 1 };
                pending.lock().insert(id, reply);
                let frame = Frame::Packet(Packet::new(Command::NODE_PUSH, id, Flags::NONE, prost::Message::encode_to_vec(&push)));
                if let Err(e) = stream.write_all(&frame.to_bytes()).await {
                    return fail_pending(&pending, &mut rx, unreachable(e.to_string()));
                }
            }
            r = stream.read_buf(&mut inbuf) => {
                match r {
                    Ok(0) | Err(_) => return fail_pending(&pending, &mut rx, unreachable("connection lost".into())),
                    Ok(_) => {}
                }
                while let Ok(Some(frame)) = decoder.decode(&mut inbuf) {
                    let Frame::Packet(p) = frame else { continue };
                    let Some(reply) = pending.lock().remove(&p.session_id) else { continue };
                    let result = match p.cmd {
                        Command::OK => Ok(()),
                        _ => match ErrorMessage::from_bytes(&p.body).map(|e| e.code) {
                            Ok(ErrorCode::OFFLINE) => Err(ForwardError::Offline(node.clone())),
                            _ => Err(ForwardError::Failed(node.clone())),
                        },
                    };
                    let _ = reply.send(result);
                }
            }
        }
    }
}

fn fail_all(rx: &mut mpsc::Receiver<(v2::NodePush, Reply)>, e: ForwardError) {
    rx.close();
    while let Ok((_, reply)) = rx.try_recv() {
        let _ = reply.send(Err(e.clone()));
    }
}

fn fail_pending(
    pending: &Mutex<HashMap<i32, Reply>>,
    rx: &mut mpsc::Receiver<(v2::NodePush, Reply)>,
    e: ForwardError,
) {
    for (_, reply) in pending.lock().drain() {
        let _ = reply.send(Err(e.clone()));
    }
    fail_all(rx, e);
}
