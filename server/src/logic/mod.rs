//! The logic layer: bind and auth, delivery (one in-flight record per push per
//! connection, kept by the connection's machine; its outcome comes back here),
//! traces, the offline inbox, kicks, broadcast and topics, flow control. It
//! holds no socket: it reaches connections through the route layer.
//!
//! Imports point down only: `route`, `cluster`, `store`, `auth`, `config`.

pub mod callback;
mod delivery;
pub mod filter;
pub mod flow;
pub mod send;
mod session;
pub mod trace;
mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mpush_protocol::ack::RetryPolicy;
use mpush_protocol::message::{Redirect, v2};
use mpush_protocol::server::ServerConfig;
use mpush_protocol::session::AckMode;
use parking_lot::RwLock;

use crate::clock::unix_ms;
use crate::cluster::{BroadcastMsg, Cluster, Delivery, KickMsg, NodeInfo};
use crate::config::Validated;
use crate::route::{RedisRoutes, RouteStore, Router, Transport};
use crate::sink::Sinks;
use crate::store::{
    IdempotencyStore, InboxStore, MemoryIdempotency, MemoryInbox, MemorySessions, MemoryTopics,
    MemoryTraces, SessionStore, TopicStore, TraceStore,
};
pub use delivery::{MessageSpec, Outcome, Settling, UserOutcome, UserStatus};
pub use session::{DeviceView, UserView};
use trace::Tracer;
pub use upstream::{Lifecycle, UpPushOutcome, UpPushStrikes, UpRefusal, up_push_id};

/// The stores a node runs on.
pub struct Stores {
    pub sessions: Arc<dyn SessionStore>,
    pub traces: Arc<dyn TraceStore>,
    pub inbox: Arc<dyn InboxStore>,
    pub topics: Arc<dyn TopicStore>,
    pub idempotency: Arc<dyn IdempotencyStore>,
}

/// Where the gateways listen (known once bound).
#[derive(Debug, Clone, Copy)]
pub struct Listeners {
    pub tcp: SocketAddr,
    pub ws: Option<SocketAddr>,
    pub http: SocketAddr,
}

pub struct Hub {
    cfg: Arc<Validated>,
    proto: Arc<ServerConfig>,
    router: Router,
    cluster: Option<Arc<Cluster>>,
    sessions: Arc<dyn SessionStore>,
    inbox: Arc<dyn InboxStore>,
    topics: Arc<dyn TopicStore>,
    idempotency: Arc<dyn IdempotencyStore>,
    tracer: Tracer,
    push_limiter: flow::RateLimiter,
    broadcast_limiter: flow::RateLimiter,
    sinks: Arc<Sinks>,
    up_limits: upstream::UpLimits,
    next_message: AtomicU64,
    next_conn: AtomicU64,
    /// Every open connection, bound or not.
    connections: AtomicUsize,
    draining: AtomicBool,
    /// A recovery after Redis came back is running / is wanted (again).
    recovering: AtomicBool,
    recover_wanted: AtomicBool,
    /// Flips to true when the server drains; every connection watches it.
    shutdown: tokio::sync::watch::Sender<bool>,
    listeners: Listeners,
    /// Where clients are sent when this node drains (another node), chosen
    /// when the drain starts.
    redirect: RwLock<Option<NodeInfo>>,
    /// The last Redis health check, for `ready`.
    redis_health: parking_lot::Mutex<Option<(std::time::Instant, Result<(), String>)>>,
}

impl Hub {
    /// The embedded default: every store in memory.
    pub fn in_memory(cfg: Arc<Validated>, listeners: Listeners) -> Arc<Self> {
        let d = &cfg.settings.delivery;
        let l = &cfg.settings.limits;
        let stores = Stores {
            sessions: Arc::new(MemorySessions::new(l.max_sessions, l.max_session_bytes)),
            traces: Arc::new(MemoryTraces::new(
                d.trace_ttl_secs,
                d.trace_max,
                d.trace_max_bytes,
            )),
            inbox: Arc::new(MemoryInbox::new(d.inbox_max)),
            topics: Arc::new(MemoryTopics::new(
                l.max_topics_per_user,
                l.max_subscribers_per_topic,
            )),
            idempotency: Arc::new(MemoryIdempotency::new(
                Duration::from_secs(d.idempotency_window_secs),
                d.idempotency_max_keys,
                d.idempotency_max_bytes,
            )),
        };
        Self::new(cfg, stores, None, listeners)
    }

    /// Cluster mode: every store and the route table in Redis, shared with
    /// the other nodes.
    pub fn clustered(
        cfg: Arc<Validated>,
        cluster: Arc<Cluster>,
        listeners: Listeners,
    ) -> Arc<Self> {
        use crate::store::RedisIdempotency;
        use crate::store::redis::{RedisInbox, RedisSessions, RedisTopics, RedisTraces};
        let d = &cfg.settings.delivery;
        let r = cluster.redis.clone();
        let stores = Stores {
            sessions: Arc::new(RedisSessions {
                redis: r.clone(),
                sealer: (!cfg.settings.security.plaintext_sessions_at_rest)
                    .then(|| crate::store::redis::SessionSealer::new(&cfg.private_key)),
            }),
            traces: Arc::new(RedisTraces {
                redis: r.clone(),
                ttl_secs: d.trace_ttl_secs,
            }),
            inbox: Arc::new(RedisInbox {
                redis: r.clone(),
                max: d.inbox_max,
                max_ttl_secs: d.max_ttl_secs,
            }),
            topics: Arc::new(RedisTopics {
                redis: r.clone(),
                max_topics_per_user: cfg.settings.limits.max_topics_per_user,
                max_subscribers: cfg.settings.limits.max_subscribers_per_topic,
            }),
            idempotency: Arc::new(RedisIdempotency {
                redis: r,
                window: Duration::from_secs(d.idempotency_window_secs),
            }),
        };
        Self::new(cfg, stores, Some(cluster), listeners)
    }

    pub fn new(
        cfg: Arc<Validated>,
        stores: Stores,
        cluster: Option<Arc<Cluster>>,
        listeners: Listeners,
    ) -> Arc<Self> {
        let s = &cfg.settings;
        let node_id = cluster
            .as_ref()
            .map_or_else(|| "local".to_owned(), |c| c.node_id.clone());
        let table: Option<Arc<dyn RouteStore>> = cluster.as_ref().map(|c| {
            Arc::new(RedisRoutes::new(c.redis.clone(), s.cluster.route_ttl_secs))
                as Arc<dyn RouteStore>
        });
        // Ids stay unique across restarts (clients deduplicate by them): the
        // counter starts at the start-up time in ms, shifted left 16 bits.
        let first_id = u64::try_from(unix_ms()).unwrap_or(0) << 16;
        let sinks = Arc::new(Sinks::start(
            &s.sinks,
            cluster.as_ref().map(|c| c.redis.clone()),
        ));
        let hub = Arc::new(Self {
            sinks: sinks.clone(),
            up_limits: upstream::UpLimits::new(&s.limits),
            push_limiter: flow::RateLimiter::new(s.delivery.push_rate),
            broadcast_limiter: flow::RateLimiter::new(s.delivery.broadcast_rate),
            proto: Arc::new(protocol_config(&cfg)),
            tracer: Tracer::new(
                stores.traces.clone(),
                node_id.as_str().into(),
                Duration::from_millis(s.cluster.timeout_ms.max(1000)),
                Arc::new(callback::Callbacks::new(
                    sinks.clone(),
                    node_id.as_str().into(),
                    s.sinks.callback_max_watched,
                    Duration::from_secs(s.sinks.callback_window_secs),
                )),
            ),
            router: Router::new(node_id, table),
            cluster,
            sessions: stores.sessions,
            inbox: stores.inbox,
            topics: stores.topics,
            idempotency: stores.idempotency,
            next_message: AtomicU64::new(first_id),
            next_conn: AtomicU64::new(1),
            connections: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            recovering: AtomicBool::new(false),
            recover_wanted: AtomicBool::new(false),
            shutdown: tokio::sync::watch::channel(false).0,
            listeners,
            redirect: RwLock::new(None),
            redis_health: parking_lot::Mutex::new(None),
            cfg,
        });
        hub.spawn_background();
        hub
    }

    /// The up-push limiters' sweep; cluster membership and route refresh
    /// (cluster mode only).
    fn spawn_background(self: &Arc<Self>) {
        // Gauges kept current (not only when scraped).
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let Some(hub) = me.upgrade() else { return };
                hub.update_gauges();
            }
        });
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(upstream::SWEEP_EVERY).await;
                let Some(hub) = me.upgrade() else { return };
                hub.up_limits.sweep();
            }
        });
        let Some(cl) = &self.cluster else {
            return;
        };
        let weak: std::sync::Weak<dyn Delivery> = Arc::downgrade(self) as _;
        cl.spawn_loops(weak);
        let me = Arc::downgrade(self);
        let every = Duration::from_secs(self.cfg.settings.cluster.route_refresh_secs);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(hub) = me.upgrade() else { return };
                if hub.is_draining() {
                    return;
                }
                let failed = hub.router.refresh().await;
                if failed > 0 {
                    tracing::warn!(failed, "route refresh failed for some users");
                }
            }
        });
    }

    /// Connections, bound connections and the sinks' queues, as gauges.
    pub fn update_gauges(&self) {
        metrics::gauge!("mpush_connections").set(self.connections() as f64);
        metrics::gauge!("mpush_bound_connections").set(self.bound() as f64);
        metrics::gauge!("mpush_trace_queue_depth").set(self.tracer.queued() as f64);
        if let Some(n) = self.inbox.total_hint() {
            metrics::gauge!("mpush_inbox_messages").set(n as f64);
        }
        for (sink, n) in self.sinks.depths() {
            metrics::gauge!("mpush_sink_queue_depth", "sink" => sink.to_string()).set(n as f64);
        }
    }

    pub fn cfg(&self) -> &Arc<Validated> {
        &self.cfg
    }

    pub fn proto(&self) -> &Arc<ServerConfig> {
        &self.proto
    }

    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }

    pub fn listeners(&self) -> Listeners {
        self.listeners
    }

    pub fn inbox(&self) -> &Arc<dyn InboxStore> {
        &self.inbox
    }

    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    pub fn sinks(&self) -> &Arc<Sinks> {
        &self.sinks
    }

    pub fn next_message_id(&self) -> u64 {
        self.next_message.fetch_add(1, Ordering::Relaxed)
    }

    /// A connection opened: its id.
    pub fn opened(&self) -> u64 {
        self.connections.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("mpush_connections_total").increment(1);
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// A connection (counted by `opened`) ended.
    pub fn closed_conn(&self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn bound(&self) -> usize {
        self.router.local().len()
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Redis came back (the pub/sub connection's return, a registration
    /// found missing, a renewal that succeeds again after failing): the
    /// registration and every route of this node's connections go back into
    /// Redis, then what was kept for its users while it was not listening is
    /// handed over. Both are retried (0.1 s, doubling to 5 s) until they
    /// succeed or the node drains: never left for a timer. One recovery runs
    /// at a time; a call during one makes it run once more at its end.
    pub async fn recover(&self) {
        if self.cluster.is_none() {
            return;
        }
        self.recover_wanted.store(true, Ordering::SeqCst);
        if self.recovering.swap(true, Ordering::SeqCst) {
            return;
        }
        loop {
            while self.recover_wanted.swap(false, Ordering::SeqCst) && !self.is_draining() {
                self.reassert().await;
                self.sweep_until_done().await;
            }
            self.recovering.store(false, Ordering::SeqCst);
            // A call that came after the last check and found it running.
            if !self.recover_wanted.load(Ordering::SeqCst)
                || self.recovering.swap(true, Ordering::SeqCst)
            {
                break;
            }
        }
    }

    /// Puts this node's registration and every route of its connections
    /// back into Redis, retrying until both are there (or the node drains).
    pub async fn reassert(&self) {
        let Some(cl) = &self.cluster else {
            return;
        };
        let (mut registered, mut failed) = (false, usize::MAX);
        let mut wait = Duration::from_millis(100);
        let mut attempts = 0u32;
        while !self.is_draining() {
            attempts += 1;
            if !registered {
                registered = cl.register(self.connections(), true).await.is_some();
            }
            if failed > 0 {
                failed = self.router.refresh().await;
            }
            if registered && failed == 0 {
                break;
            }
            if attempts == 20 {
                tracing::warn!(
                    registered,
                    failed,
                    "re-asserting in Redis: still failing, trying on (up to every 5 s)"
                );
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
        *self.redis_health.lock() = None;
        metrics::counter!("mpush_redis_reasserts_total").increment(1);
        if registered && failed == 0 {
            tracing::info!(
                routes = self.bound(),
                attempts,
                "registration and routes re-asserted in Redis"
            );
        }
    }

    /// Hands over what is kept for the users connected here, retrying the
    /// users whose inbox could not be read until none is left (or the node
    /// drains).
    async fn sweep_until_done(&self) {
        let mut users = None;
        let mut wait = Duration::from_millis(100);
        while !self.is_draining() {
            let failed = self.sweep_kept(users.take()).await;
            if failed.is_empty() {
                return;
            }
            tracing::warn!(
                users = failed.len(),
                "kept messages not read for some users: trying again"
            );
            users = Some(failed);
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }

    /// Ready for traffic: not draining, and the Redis it needs answers.
    /// `/readyz` is open without a token: Redis is asked at most once a
    /// second, within the cluster timeout, whatever the probe rate.
    pub async fn ready(&self) -> Result<(), String> {
        if self.is_draining() {
            return Err("draining".into());
        }
        let Some(cl) = &self.cluster else {
            return Ok(());
        };
        if let Some((at, r)) = &*self.redis_health.lock()
            && at.elapsed() < Duration::from_secs(1)
        {
            return r.clone();
        }
        let limit = Duration::from_millis(self.cfg.settings.cluster.timeout_ms);
        let r = match tokio::time::timeout(limit, cl.ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("redis: {e}")),
            Err(_) => Err("redis: no answer within cluster.timeout_ms".into()),
        };
        *self.redis_health.lock() = Some((std::time::Instant::now(), r.clone()));
        r
    }

    /// The start of a drain: this node leaves the cluster and removes its
    /// routes (no one sends here any more), picks where clients go, then
    /// tells every connection to drain.
    pub async fn start_drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
        if let Some(cl) = &self.cluster {
            cl.deregister().await;
            self.router.withdraw().await;
            let other = cl
                .live_nodes()
                .await
                .into_iter()
                .find(|n| n.id != cl.node_id);
            *self.redirect.write() = other;
        }
        let _ = self.shutdown.send(true);
    }

    /// What a draining connection of `transport` is told:
    /// an address of its own transport, and a jittered wait so the clients
    /// of one node do not all arrive at once.
    pub fn redirect_for(&self, transport: Transport) -> Redirect {
        let s = &self.cfg.settings.shutdown;
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

/// The protocol machines' settings, from the server's.
fn protocol_config(cfg: &Validated) -> ServerConfig {
    let s = &cfg.settings;
    let mut proto = ServerConfig::new(cfg.private_key.clone());
    proto.min_heartbeat = Duration::from_millis(s.limits.min_heartbeat_ms);
    proto.max_heartbeat = Duration::from_millis(s.limits.max_heartbeat_ms);
    proto.max_body = s.limits.max_packet_size;
    proto.session_ttl = Duration::from_secs(s.delivery.session_ttl_secs);
    proto.handshake_timeout = Duration::from_millis(s.limits.handshake_timeout_ms);
    proto.require_v2 = s.security.require_v2;
    proto.offload_rsa = true;
    proto.ack_retry = RetryPolicy {
        waits: s
            .delivery
            .ack_waits_ms
            .iter()
            .map(|ms| Duration::from_millis(*ms))
            .collect(),
        retries: s.delivery.ack_retries,
    };
    proto
}

#[async_trait]
impl Delivery for Hub {
    async fn deliver_batch(&self, batch: v2::NodePushBatch) -> Vec<u32> {
        self.deliver_forwarded(batch)
    }

    async fn broadcast(&self, msg: BroadcastMsg) {
        let spec = MessageSpec {
            content: Bytes::from(msg.content),
            ack_mode: AckMode::from_v2(msg.ack_mode),
            client_type: msg.client_type,
            ttl_secs: 0,
            ack_timeout: None,
            callback: msg
                .callback
                .as_deref()
                .and_then(callback::CallbackTarget::from_wire),
        };
        if let Some(target) = spec.callback.clone() {
            let ack = spec.ack_mode != AckMode::None;
            let trace: Arc<str> = msg.trace_id.as_str().into();
            // Full: counted; the broadcast still goes out.
            let _ = self.tracer.callbacks().watch(&trace, target, ack, true);
        }
        let Ok(filter) = filter::Filter::new(msg.tags, msg.condition.as_deref(), spec.client_type)
        else {
            return;
        };
        self.broadcast_here(msg.trace_id.into(), msg.message_id, &spec, Arc::new(filter))
            .await;
    }

    fn kick(&self, msg: KickMsg) {
        self.kick_here(&msg);
    }

    async fn kept(&self, msg: crate::cluster::KeptMsg) {
        self.deliver_kept(msg).await;
    }

    async fn redis_back(&self) {
        self.recover().await;
    }

    fn load(&self) -> usize {
        self.connections()
    }

    fn draining(&self) -> bool {
        self.is_draining()
    }
}
