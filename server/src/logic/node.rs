//! The node's own state: its connection count, the drain, where drained
//! clients go, the shutdown signal (the gateway watches it and tells each
//! connection through its queue), Redis health for readiness. It knows the
//! cluster (to ask Redis and to leave) but no delivery.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mpush_protocol::message::Redirect;
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;

use crate::cluster::{Cluster, NodeInfo};
use crate::config::Validated;
use crate::route::Transport;

/// Where the gateways listen (known once bound).
#[derive(Debug, Clone, Copy)]
pub struct Listeners {
    pub tcp: SocketAddr,
    pub ws: Option<SocketAddr>,
    pub http: SocketAddr,
}

/// Why the node is not ready for traffic (`/readyz`'s reason words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    #[error("draining")]
    Draining,
    #[error("redis: {0}")]
    Redis(String),
    #[error("redis: no answer within cluster.timeout_ms")]
    RedisTimeout,
}

/// The node's slice of the settings.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// Where v2 TCP / WebSocket clients go when no other node is live.
    pub redirect_to: String,
    pub redirect_to_ws: String,
    pub redirect_jitter_ms: u32,
    /// How long a drain waits for the connections' ACKs.
    pub drain_timeout: Duration,
    /// How long Redis may take to answer a readiness probe.
    pub cluster_timeout: Duration,
}

impl NodeSettings {
    pub fn new(cfg: &Validated) -> Self {
        let s = &cfg.settings;
        Self {
            redirect_to: s.shutdown.redirect_to.clone(),
            redirect_to_ws: s.shutdown.redirect_to_ws.clone(),
            redirect_jitter_ms: s.shutdown.redirect_jitter_ms,
            drain_timeout: Duration::from_millis(s.shutdown.drain_timeout_ms),
            cluster_timeout: Duration::from_millis(s.cluster.timeout_ms),
        }
    }
}

pub struct Node {
    settings: NodeSettings,
    cluster: Option<Arc<Cluster>>,
    listeners: Listeners,
    next_conn: AtomicU64,
    /// Every open connection, bound or not.
    connections: AtomicUsize,
    draining: AtomicBool,
    /// Flips to true when the node drains; each gateway watches it and tells
    /// its connections.
    shutdown: watch::Sender<bool>,
    /// Where clients are sent when this node drains (another node), chosen
    /// when the drain starts.
    redirect: RwLock<Option<NodeInfo>>,
    /// The last Redis health check, for `ready`.
    redis_health: Mutex<Option<(Instant, Result<(), NotReady>)>>,
}

impl Node {
    pub fn new(
        settings: NodeSettings,
        cluster: Option<Arc<Cluster>>,
        listeners: Listeners,
    ) -> Self {
        Self {
            settings,
            cluster,
            listeners,
            next_conn: AtomicU64::new(1),
            connections: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            shutdown: watch::channel(false).0,
            redirect: RwLock::new(None),
            redis_health: Mutex::new(None),
        }
    }

    pub fn settings(&self) -> &NodeSettings {
        &self.settings
    }

    pub fn listeners(&self) -> Listeners {
        self.listeners
    }

    /// A connection opened: its id.
    pub fn opened(&self) -> u64 {
        self.connections.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("mpush_connections_total").increment(1);
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// A connection (counted by `opened`) ended.
    pub fn closed(&self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// The drain's first step: from now on the node is not ready and takes
    /// no new pushes.
    pub(super) fn begin_drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The drain's last step: where clients go, then every connection is
    /// told.
    pub(super) fn signal_drain(&self, redirect: Option<NodeInfo>) {
        *self.redirect.write() = redirect;
        self.shutdown.send_replace(true);
    }

    /// Readiness is asked of Redis afresh at the next probe.
    pub(super) fn forget_health(&self) {
        *self.redis_health.lock() = None;
    }

    /// Ready for traffic: not draining, and the Redis it needs answers.
    /// `/readyz` is open without a token: Redis is asked at most once a
    /// second, within the cluster timeout, whatever the probe rate.
    pub async fn ready(&self) -> Result<(), NotReady> {
        if self.is_draining() {
            return Err(NotReady::Draining);
        }
        let Some(cl) = &self.cluster else {
            return Ok(());
        };
        if let Some((at, r)) = &*self.redis_health.lock()
            && at.elapsed() < Duration::from_secs(1)
        {
            return r.clone();
        }
        let r = match tokio::time::timeout(self.settings.cluster_timeout, cl.ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(NotReady::Redis(e.to_string())),
            Err(_) => Err(NotReady::RedisTimeout),
        };
        *self.redis_health.lock() = Some((Instant::now(), r.clone()));
        r
    }

    /// What a draining connection of `transport` is told:
    /// an address of its own transport, and a jittered wait so the clients
    /// of one node do not all arrive at once.
    pub fn redirect_for(&self, transport: Transport) -> Redirect {
        let s = &self.settings;
        let address = match (&*self.redirect.read(), transport) {
            (Some(n), Transport::Ws) if !n.ws.is_empty() => n.ws.clone(),
            (Some(n), Transport::Tcp) => n.tcp.clone(),
            (_, Transport::Ws) => s.redirect_to_ws.clone(),
            (_, Transport::Tcp) => s.redirect_to.clone(),
        };
        let jitter = s.redirect_jitter_ms.max(1);
        let spread = u32::try_from(crate::clock::random_below(u64::from(jitter))).unwrap_or(0);
        Redirect {
            address,
            retry_after_ms: 100 + spread,
            jitter_ms: jitter,
            reason: "server shutting down".into(),
        }
    }
}
