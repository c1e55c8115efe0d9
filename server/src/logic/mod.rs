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
mod node;
mod recovery;
pub mod send;
mod session;
pub mod trace;
mod upstream;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mpush_protocol::ack::RetryPolicy;
use mpush_protocol::message::v2;
use mpush_protocol::server::ServerConfig;
use mpush_protocol::session::AckMode;

use crate::clock::unix_ms;
use crate::cluster::{BroadcastMsg, Cluster, Delivery, KickMsg};
use crate::config::Validated;
use crate::route::{RedisRoutes, RouteStore, Router};
use crate::sink::Sinks;
use crate::store::{
    IdempotencyStore, InboxStore, MemoryIdempotency, MemoryInbox, MemorySessions, MemoryTopics,
    MemoryTraces, SessionStore, TopicStore, TraceStore,
};
pub use delivery::{DeliveryService, MessageSpec, Outcome, Settling, UserOutcome, UserStatus};
pub use node::{Listeners, Node, NodeSettings, NotReady};
pub use session::{DeviceView, Sessions, UserView};
use trace::Tracer;
pub use upstream::{Lifecycle, UpPushOutcome, UpPushStrikes, UpRefusal, Upstream, up_push_id};

/// The stores a node runs on.
pub struct Stores {
    pub sessions: Arc<dyn SessionStore>,
    pub traces: Arc<dyn TraceStore>,
    pub inbox: Arc<dyn InboxStore>,
    pub topics: Arc<dyn TopicStore>,
    pub idempotency: Arc<dyn IdempotencyStore>,
}

/// The logic layer, composed: the node's state, the sessions service, the
/// upstream service, and delivery (its router, stores, tracer and flow
/// control: `delivery/` and `send.rs`), and the use cases across them (the
/// drain here, recovery in `recovery.rs`, `cluster::Delivery` below).
/// Each service has its own slice of the settings; `lib.rs::start` builds
/// one `Hub` and hands the gateway and the API their views of it.
pub struct Hub {
    /// The protocol machines' settings (the gateway takes them at start).
    proto: Arc<ServerConfig>,
    /// For cluster membership and the background loops.
    cluster: Option<Arc<Cluster>>,
    route_refresh: Duration,
    node: Arc<Node>,
    sessions: Sessions,
    upstream: Upstream,
    delivery: Arc<DeliveryService>,
    recovery: recovery::Recovery,
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
                max_bytes: d.redis_trace_max_bytes,
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
        let node_id = cluster.as_ref().map_or_else(
            || {
                if s.cluster.node_id.is_empty() {
                    "local".to_owned()
                } else {
                    s.cluster.node_id.clone()
                }
            },
            |c| c.node_id.clone(),
        );
        let table: Option<Arc<dyn RouteStore>> = cluster.as_ref().map(|c| {
            Arc::new(
                RedisRoutes::new(c.redis.clone(), s.cluster.route_ttl_secs)
                    .with_cache(c.route_cache.clone()),
            ) as Arc<dyn RouteStore>
        });
        // Ids stay unique across restarts (clients deduplicate by them): the
        // counter starts at the start-up time in ms, shifted left 16 bits.
        let first_id = u64::try_from(unix_ms()).unwrap_or(0) << 16;
        let sinks = Arc::new(Sinks::start(
            &s.sinks,
            cluster.as_ref().map(|c| c.redis.clone()),
        ));
        let router = Arc::new(Router::new(node_id.clone(), table));
        let node = Arc::new(Node::new(
            NodeSettings::new(&cfg),
            cluster.clone(),
            listeners,
        ));
        let delivery = Arc::new(DeliveryService {
            settings: s.delivery.clone(),
            node: node.clone(),
            router: router.clone(),
            cluster: cluster.clone(),
            inbox: stores.inbox.clone(),
            topics: stores.topics,
            idempotency: stores.idempotency,
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
            push_limiter: flow::RateLimiter::new(s.delivery.push_rate),
            broadcast_limiter: flow::RateLimiter::new(s.delivery.broadcast_rate),
            next_message: AtomicU64::new(first_id),
        });
        let hub = Arc::new(Self {
            sessions: Sessions::new(
                stores.sessions,
                cfg.bind_auth.clone(),
                router,
                cluster.clone(),
                stores.inbox,
            ),
            upstream: Upstream::new(
                sinks,
                &s.limits,
                &node_id,
                crate::proxy::HttpProxy::new(&s.http_proxy),
            ),
            proto: Arc::new(protocol_config(&cfg)),
            route_refresh: Duration::from_secs(s.cluster.route_refresh_secs),
            cluster,
            node,
            delivery,
            recovery: recovery::Recovery::default(),
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
                hub.upstream.sweep();
            }
        });
        let Some(cl) = &self.cluster else {
            return;
        };
        let weak: std::sync::Weak<dyn Delivery> = Arc::downgrade(self) as _;
        cl.spawn_loops(weak);
        let me = Arc::downgrade(self);
        let every = self.route_refresh;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(hub) = me.upgrade() else { return };
                if hub.node.is_draining() {
                    return;
                }
                let failed = hub.delivery.router.refresh().await;
                if failed > 0 {
                    tracing::warn!(failed, "route refresh failed for some users");
                }
            }
        });
    }

    /// Connections, bound connections and the sinks' queues, as gauges.
    pub fn update_gauges(&self) {
        metrics::gauge!("mpush_connections").set(self.node.connections() as f64);
        metrics::gauge!("mpush_bound_connections").set(self.bound() as f64);
        metrics::gauge!("mpush_trace_queue_depth").set(self.delivery.tracer.queued() as f64);
        if let Some(n) = self.delivery.inbox.total_hint() {
            metrics::gauge!("mpush_inbox_messages").set(n as f64);
        }
        for (sink, n) in self.upstream.sinks().depths() {
            metrics::gauge!("mpush_sink_queue_depth", "sink" => sink.to_string()).set(n as f64);
        }
        // Counted by the cache's connection since it opened (a master that
        // moved starts them again: a counter reset).
        if let Some(st) = self
            .cluster
            .as_ref()
            .and_then(|c| c.route_cache.as_ref())
            .and_then(|c| c.cache_statistics())
        {
            metrics::counter!("mpush_route_cache_hits_total").absolute(st.hit as u64);
            metrics::counter!("mpush_route_cache_misses_total").absolute(st.miss as u64);
            metrics::counter!("mpush_route_cache_invalidations_total")
                .absolute(st.invalidate as u64);
        }
    }

    pub fn proto(&self) -> &Arc<ServerConfig> {
        &self.proto
    }

    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }

    /// The node's state: connections, drain, readiness.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Sessions, bind, kicks, who is online.
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// Up-pushes and lifecycle events.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// Pushes, their outcomes, traces, the inbox and topics.
    pub fn delivery(&self) -> &Arc<DeliveryService> {
        &self.delivery
    }

    /// This node's id (`cluster.node_id`, a random one in a cluster when
    /// unset, `local` on a single node).
    pub fn node_id(&self) -> &str {
        self.delivery.router.node_id()
    }

    /// Bound connections on this node.
    pub fn bound(&self) -> usize {
        self.delivery.router.local().len()
    }

    /// The start of a drain: this node leaves the cluster and removes its
    /// routes (no one sends here any more), picks where clients go, then
    /// tells every connection to drain.
    pub async fn start_drain(&self) {
        self.node.begin_drain();
        let mut redirect = None;
        if let Some(cl) = &self.cluster {
            cl.deregister().await;
            self.delivery.router.withdraw().await;
            let others = cl
                .live_nodes()
                .await
                .into_iter()
                .filter(|n| n.id != cl.node_id);
            redirect = first_reachable(others).await;
        }
        self.node.signal_drain(redirect);
    }
}

/// The least loaded of `nodes` (in their order) that accepts a connection on
/// its node port now. A node killed a moment ago keeps its registration
/// until it expires: redirecting every client there would send them into
/// their backoff instead of to a node that takes them. None reachable: the
/// clients are told to come back anywhere (their own server list).
async fn first_reachable(
    nodes: impl Iterator<Item = crate::cluster::NodeInfo>,
) -> Option<crate::cluster::NodeInfo> {
    const PROBE: Duration = Duration::from_millis(300);
    for n in nodes {
        if n.internal.is_empty() {
            // An older node that does not say: trust its registration.
            return Some(n);
        }
        if let Ok(Ok(_)) =
            tokio::time::timeout(PROBE, tokio::net::TcpStream::connect(&n.internal)).await
        {
            return Some(n);
        }
        tracing::warn!(node = %n.id, internal = %n.internal, "drain: a registered node does not answer; not redirecting clients there");
    }
    None
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
    proto.http_proxy = s.http_proxy.enabled;
    proto.offload_rsa = true;
    proto.keep_binding = s
        .limits
        .keep_binding
        .unwrap_or_else(|| cfg.bind_auth.is_anonymous());
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
        // The sending node waits with this one for the trace writer, and
        // for the callbacks' queue when the push has callbacks: for a
        // quarter of its forward's timeout at most, so the answer always
        // reaches it in time (a forward that times out is reported as not
        // delivered, and kept, although it was delivered here).
        let budget = self
            .cluster
            .as_ref()
            .map_or(Duration::from_millis(500), |c| c.timeout() / 4);
        let tracer = &self.delivery.tracer;
        let callback = callback::CallbackTarget::from_wire(&batch.callback);
        let _ = tokio::time::timeout(budget, async {
            tracer.room().await;
            if let Some(t) = &callback {
                tracer.callbacks().room(t).await;
            }
        })
        .await;
        self.delivery.deliver_forwarded(batch)
    }

    async fn broadcast(&self, msg: BroadcastMsg) {
        let client_type = msg.only_type();
        let spec = MessageSpec {
            content: Bytes::from(msg.content),
            ack_mode: AckMode::from_v2(msg.ack_mode),
            client_type,
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
            let _ = self
                .delivery
                .tracer
                .callbacks()
                .watch(&trace, target, ack, true);
        }
        let Ok(filter) = filter::Filter::new(msg.tags, msg.condition.as_deref(), spec.client_type)
        else {
            return;
        };
        self.delivery
            .broadcast_here(msg.trace_id.into(), msg.message_id, &spec, Arc::new(filter))
            .await;
    }

    fn kick(&self, msg: KickMsg) {
        self.sessions.kick_here(&msg);
    }

    async fn kept(&self, msg: crate::cluster::KeptMsg) {
        if !self.delivery.deliver_kept(msg).await {
            self.recover().await;
        }
    }

    async fn redis_back(&self) {
        self.recover().await;
    }

    fn load(&self) -> usize {
        self.node.connections()
    }

    fn draining(&self) -> bool {
        self.node.is_draining()
    }
}
