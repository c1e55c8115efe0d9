//! The logic layer: message ids, delivery to users' connections, traces, the
//! offline inbox, broadcast and topics, flow control. It holds no socket: it
//! reaches connections through the registry's command queues.

pub mod filter;
pub mod flow;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use mpush_protocol::ack::RetryPolicy;
use mpush_protocol::server::{OutboundPush, ServerConfig};
use mpush_protocol::session::AckMode;
use tokio::sync::mpsc::error::TrySendError;

use crate::clock::unix_ms;
use crate::config::Validated;
use crate::gateway::registry::{ConnCommand, ConnHandle, Registry};
use crate::store::{
    InboxStore, MemoryInbox, MemorySessions, MemoryTopics, MemoryTraces, SessionStore,
    StoredMessage, TopicStore, TraceEvent, TraceState, TraceStore,
};
use filter::Filter;
use flow::RateLimiter;

/// What to send, independent of who gets it.
#[derive(Debug, Clone)]
pub struct MessageSpec {
    pub content: Bytes,
    pub ack_mode: AckMode,
    pub client_type: Option<i32>,
    /// Keep for offline users this long; 0 = only online devices get it.
    pub ttl_secs: u64,
    /// How long each delivery attempt waits for the ACK (`timeoutMs`).
    pub ack_timeout: Option<Duration>,
}

/// What happened to one user's copy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserOutcome {
    pub user_id: String,
    /// Connections the message was handed to.
    pub dispatched: usize,
    /// Kept in the offline inbox (ttl set).
    pub stored: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub struct Hub {
    pub cfg: Arc<Validated>,
    pub proto: Arc<ServerConfig>,
    pub registry: Registry,
    pub sessions: Arc<dyn SessionStore>,
    pub traces: Arc<dyn TraceStore>,
    pub inbox: Arc<dyn InboxStore>,
    pub topics: Arc<dyn TopicStore>,
    pub push_limiter: RateLimiter,
    pub broadcast_limiter: RateLimiter,
    next_message: AtomicU64,
    next_conn: AtomicU64,
    /// Every open connection, bound or not.
    pub connections: AtomicUsize,
    pub draining: AtomicBool,
    /// Flips to true when the server shuts down; every driver watches it.
    pub shutdown: tokio::sync::watch::Sender<bool>,
    /// The TCP gateway's bound address (known once listening).
    pub tcp_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// The WebSocket gateway's bound address, once listening.
    pub ws_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// Cluster mode (Redis); unset for the embedded default.
    pub cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    /// Where v2 clients are sent on shutdown (chosen when it starts).
    pub redirect_to: std::sync::OnceLock<String>,
    /// Open connections per client address.
    pub per_ip: Arc<crate::gateway::limits::PerIp>,
    /// Handshake RSA work, off the async workers.
    pub rsa: crate::gateway::limits::RsaPool,
}

impl Hub {
    /// The embedded default: every store in memory.
    pub fn in_memory(cfg: Arc<Validated>) -> Arc<Self> {
        let d = &cfg.settings.delivery;
        let l = &cfg.settings.limits;
        let sessions = Arc::new(MemorySessions::new(l.max_sessions, l.max_session_bytes));
        let traces = Arc::new(MemoryTraces::new(
            d.trace_ttl_secs,
            d.trace_max,
            d.trace_max_bytes,
        ));
        let inbox = Arc::new(MemoryInbox::new(d.inbox_max));
        let topics = Arc::new(MemoryTopics::new(
            l.max_topics_per_user,
            l.max_subscribers_per_topic,
        ));
        Self::new(cfg, sessions, traces, inbox, topics)
    }

    /// Cluster mode: every store in Redis, shared with the other nodes.
    pub fn clustered(cfg: Arc<Validated>, cluster: Arc<crate::cluster::Cluster>) -> Arc<Self> {
        use crate::store::redis::{RedisInbox, RedisSessions, RedisTopics, RedisTraces};
        let d = &cfg.settings.delivery;
        let r = cluster.redis.clone();
        let hub = Self::new(
            cfg.clone(),
            Arc::new(RedisSessions {
                redis: r.clone(),
                sealer: (!cfg.settings.security.plaintext_sessions_at_rest)
                    .then(|| crate::store::redis::SessionSealer::new(&cfg.private_key)),
            }),
            Arc::new(RedisTraces {
                redis: r.clone(),
                ttl_secs: d.trace_ttl_secs,
            }),
            Arc::new(RedisInbox {
                redis: r.clone(),
                max: d.inbox_max,
                max_ttl_secs: d.max_ttl_secs,
            }),
            Arc::new(RedisTopics {
                redis: r,
                max_topics_per_user: cfg.settings.limits.max_topics_per_user,
                max_subscribers: cfg.settings.limits.max_subscribers_per_topic,
            }),
        );
        let _ = hub.cluster.set(cluster);
        hub
    }

    pub fn new(
        cfg: Arc<Validated>,
        sessions: Arc<dyn SessionStore>,
        traces: Arc<dyn TraceStore>,
        inbox: Arc<dyn InboxStore>,
        topics: Arc<dyn TopicStore>,
    ) -> Arc<Self> {
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
        // Ids stay unique across restarts (clients deduplicate by them): the
        // counter starts at the start-up time in ms, shifted left 16 bits.
        let first_id = u64::try_from(unix_ms()).unwrap_or(0) << 16;
        Arc::new(Self {
            push_limiter: RateLimiter::new(s.delivery.push_rate),
            broadcast_limiter: RateLimiter::new(s.delivery.broadcast_rate),
            proto: Arc::new(proto),
            registry: Registry::default(),
            sessions,
            traces,
            inbox,
            topics,
            next_message: AtomicU64::new(first_id),
            next_conn: AtomicU64::new(1),
            connections: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            shutdown: tokio::sync::watch::channel(false).0,
            tcp_addr: std::sync::OnceLock::new(),
            ws_addr: std::sync::OnceLock::new(),
            cluster: std::sync::OnceLock::new(),
            redirect_to: std::sync::OnceLock::new(),
            per_ip: crate::gateway::limits::PerIp::new(s.limits.max_connections_per_ip),
            rsa: crate::gateway::limits::RsaPool::new(
                cfg.private_key.clone(),
                match s.limits.rsa_workers {
                    // Two per core: RSA threads are preempted like any
                    // other, so the async workers keep their share, and the
                    // hand-off per handshake does not leave cores idle.
                    0 => 2 * std::thread::available_parallelism().map_or(2, usize::from),
                    n => n,
                },
                s.limits.rsa_queue,
            ),
            cfg,
        })
    }

    pub fn next_message_id(&self) -> u64 {
        self.next_message.fetch_add(1, Ordering::Relaxed)
    }

    pub fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    pub async fn trace(
        &self,
        trace_id: &str,
        user: &str,
        device: &str,
        client_type: i32,
        state: TraceState,
        detail: Option<String>,
    ) {
        self.traces
            .record(TraceEvent {
                trace_id,
                user_id: user,
                device_id: device,
                client_type,
                state,
                detail,
                at_ms: unix_ms(),
            })
            .await;
    }

    /// Delivers one message to one user: to each matching online device, and
    /// to the inbox when `ttl_secs` is set.
    pub async fn push_user(
        &self,
        trace_id: &str,
        spec: &MessageSpec,
        user_id: &str,
    ) -> UserOutcome {
        self.push_limiter.acquire().await;
        let message_id = self.next_message_id();
        let now = unix_ms();
        let expires_at_ms = if spec.ttl_secs > 0 {
            now + i64::try_from(spec.ttl_secs).unwrap_or(0) * 1000
        } else {
            0
        };
        let mut outcome = UserOutcome {
            user_id: user_id.to_owned(),
            dispatched: 0,
            stored: false,
            error: None,
        };
        let routes: Vec<ConnHandle> = self
            .registry
            .lookup(user_id)
            .into_iter()
            .filter(|h| spec.client_type.is_none_or(|ct| ct == h.info.client_type))
            .collect();
        let remote = self
            .remote_routes(user_id, spec.client_type, &routes, &mut outcome)
            .await;
        let any_route = !routes.is_empty() || !remote.is_empty();
        // Kept until a device acknowledges it; without an ACK mode there is
        // nothing to wait for, so only an offline user's copy is kept.
        if spec.ttl_secs > 0 && (spec.ack_mode != AckMode::None || !any_route) {
            let stored = StoredMessage {
                message_id,
                trace_id: trace_id.to_owned(),
                content: spec.content.clone(),
                ack_mode: spec.ack_mode,
                client_type: spec.client_type,
                expires_at_ms,
            };
            match self.inbox.push(user_id, stored).await {
                Ok(()) => outcome.stored = true,
                Err(e) => {
                    metrics::counter!("mpush_inbox_full_total").increment(1);
                    outcome.error = Some(e.to_string());
                }
            }
        }
        let push = OutboundPush {
            message_id,
            trace_id: trace_id.to_owned(),
            content: spec.content.clone(),
            ack_mode: spec.ack_mode,
            expires_at_ms: u64::try_from(expires_at_ms).unwrap_or(0),
            ack_timeout: spec.ack_timeout,
        };
        for h in &routes {
            if self.send(h, user_id, push.clone()).await {
                outcome.dispatched += 1;
            }
        }
        for r in &remote {
            if self.forward(r, user_id, &push).await {
                outcome.dispatched += 1;
            }
        }
        if !any_route {
            let detail = if outcome.stored {
                format!("kept {}s for the user's next connection", spec.ttl_secs)
            } else {
                "user offline".to_owned()
            };
            let state = if outcome.error.is_some() {
                TraceState::Failed
            } else {
                TraceState::Offline
            };
            let detail = outcome.error.clone().unwrap_or(detail);
            self.trace(
                trace_id,
                user_id,
                "",
                spec.client_type.unwrap_or(-1),
                state,
                Some(detail),
            )
            .await;
        }
        metrics::counter!("mpush_pushes_total").increment(1);
        outcome
    }

    /// Routes of `user` on other nodes (cluster mode), for client types with
    /// no local connection. Routes naming this node without a local
    /// connection are stale and removed.
    async fn remote_routes(
        &self,
        user_id: &str,
        client_type: Option<i32>,
        local: &[ConnHandle],
        outcome: &mut UserOutcome,
    ) -> Vec<crate::cluster::Route> {
        let Some(cl) = self.cluster.get() else {
            return Vec::new();
        };
        let routes = match cl.routes(user_id).await {
            Ok(r) => r,
            Err(e) => {
                metrics::counter!("mpush_redis_errors_total").increment(1);
                if local.is_empty() {
                    outcome.error = Some(format!("cluster route table unavailable: {e}"));
                }
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for r in routes {
            if client_type.is_some_and(|ct| ct != r.client_type)
                || local.iter().any(|h| h.info.client_type == r.client_type)
            {
                continue;
            }
            if r.node == cl.node_id {
                cl.route_del(user_id, r.client_type, &r.node, r.conn_id)
                    .await;
                continue;
            }
            out.push(r);
        }
        out
    }

    /// Forwards to the node holding `route`; cleans the route when that node is
    /// gone or no longer has the user.
    async fn forward(
        &self,
        route: &crate::cluster::Route,
        user_id: &str,
        push: &OutboundPush,
    ) -> bool {
        let Some(cl) = self.cluster.get() else {
            return false;
        };
        let (trace_id, ct) = (push.trace_id.as_str(), route.client_type);
        let Some(node) = cl.node(&route.node).await else {
            cl.route_del(user_id, ct, &route.node, route.conn_id).await;
            self.trace(
                trace_id,
                user_id,
                &route.device_id,
                ct,
                TraceState::Offline,
                Some(format!(
                    "route to node {} which is gone: removed",
                    route.node
                )),
            )
            .await;
            return false;
        };
        let msg = mpush_protocol::message::v2::NodePush {
            user_id: user_id.to_owned(),
            client_type: ct,
            message_id: push.message_id,
            trace_id: push.trace_id.clone(),
            content: push.content.to_vec(),
            ack_mode: push.ack_mode.to_v2(),
            expires_at_ms: push.expires_at_ms,
            ack_timeout_ms: push.ack_timeout.map_or(0, |d| d.as_millis() as u32),
            from_node: cl.node_id.clone(),
        };
        // The hop is recorded first: the other node's record for the device
        // then takes over this placeholder, keeping the whole history.
        self.trace(
            trace_id,
            user_id,
            "",
            ct,
            TraceState::Dispatched,
            Some(format!(
                "forwarded from node {} to node {}",
                cl.node_id, node.id
            )),
        )
        .await;
        match cl.forward(&node, msg).await {
            Ok(()) => {
                metrics::counter!("mpush_forwards_total").increment(1);
                true
            }
            Err(crate::cluster::ForwardError::Offline(n)) => {
                cl.route_del(user_id, ct, &route.node, route.conn_id).await;
                self.trace(
                    trace_id,
                    user_id,
                    "",
                    ct,
                    TraceState::Offline,
                    Some(format!("not connected to node {n} any more: route removed")),
                )
                .await;
                false
            }
            Err(e) => {
                metrics::counter!("mpush_forward_errors_total").increment(1);
                if matches!(e, crate::cluster::ForwardError::Unreachable(..)) {
                    // A node that refuses connections is gone; its routes are stale.
                    cl.route_del(user_id, ct, &route.node, route.conn_id).await;
                }
                self.trace(
                    trace_id,
                    user_id,
                    "",
                    ct,
                    TraceState::Failed,
                    Some(e.to_string()),
                )
                .await;
                false
            }
        }
    }

    /// A push forwarded by another node: deliver it to this node's connections.
    pub async fn deliver_local(&self, p: mpush_protocol::message::v2::NodePush) -> usize {
        let push = OutboundPush {
            message_id: p.message_id,
            trace_id: p.trace_id,
            content: Bytes::from(p.content),
            ack_mode: AckMode::from_v2(p.ack_mode),
            expires_at_ms: p.expires_at_ms,
            ack_timeout: (p.ack_timeout_ms > 0)
                .then(|| Duration::from_millis(u64::from(p.ack_timeout_ms))),
        };
        let mut n = 0;
        for h in self.registry.lookup(&p.user_id) {
            if (p.client_type == 0 || p.client_type == h.info.client_type)
                && self.send(&h, &p.user_id, push.clone()).await
            {
                n += 1;
            }
        }
        n
    }

    /// Starts a broadcast: on every node through Redis in cluster mode, else here.
    pub async fn start_broadcast(
        self: &Arc<Self>,
        trace_id: &str,
        spec: MessageSpec,
        tags: Vec<String>,
        condition: Option<String>,
    ) -> Result<(), String> {
        let filter = Filter::new(tags.clone(), condition.as_deref(), spec.client_type)?;
        if let Some(cl) = self.cluster.get() {
            let payload = serde_json::json!({
                "traceId": trace_id,
                "content": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &spec.content),
                "ackMode": spec.ack_mode.to_v2(),
                "clientType": spec.client_type,
                "tags": tags,
                "condition": condition,
            });
            return cl
                .publish("mp:broadcast", payload.to_string())
                .await
                .map_err(|e| format!("cluster unavailable: {e}"));
        }
        let hub = self.clone();
        let t = trace_id.to_owned();
        tokio::spawn(async move {
            hub.broadcast(&t, &spec, Arc::new(filter)).await;
        });
        Ok(())
    }

    /// A broadcast published by any node: deliver to this node's connections.
    pub async fn broadcast_from_cluster(&self, v: &serde_json::Value) {
        let content = v["content"]
            .as_str()
            .and_then(|c| {
                base64::Engine::decode(&base64::engine::general_purpose::STANDARD, c).ok()
            })
            .unwrap_or_default();
        let spec = MessageSpec {
            content: Bytes::from(content),
            ack_mode: AckMode::from_v2(v["ackMode"].as_i64().unwrap_or(0) as i32),
            client_type: v["clientType"].as_i64().map(|c| c as i32),
            ttl_secs: 0,
            ack_timeout: None,
        };
        let tags: Vec<String> = v["tags"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|t| t.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let Ok(filter) = Filter::new(tags, v["condition"].as_str(), spec.client_type) else {
            return;
        };
        self.broadcast(
            v["traceId"].as_str().unwrap_or_default(),
            &spec,
            Arc::new(filter),
        )
        .await;
    }

    /// Another node bound the same user and client type: kick our connection.
    pub fn kick_from_cluster(&self, v: &serde_json::Value) {
        let user = v["userId"].as_str().unwrap_or_default();
        let conn_id: u64 = v["connId"]
            .as_str()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        for h in self.registry.lookup(user) {
            if h.info.id == conn_id {
                let _ = h.tx.try_send(ConnCommand::Kicked(Box::new(
                    crate::gateway::registry::Kick {
                        device_id: h.info.device.device_id.clone(),
                        user_id: user.to_owned(),
                    },
                )));
                metrics::counter!("mpush_kicks_total").increment(1);
            }
        }
    }

    /// Hands a push to a connection's queue; a full queue is a slow consumer.
    async fn send(&self, h: &ConnHandle, user_id: &str, push: OutboundPush) -> bool {
        let trace_id = push.trace_id.clone();
        let (device, ct) = (h.info.device.device_id.as_str(), h.info.client_type);
        match h.tx.try_send(ConnCommand::Push(Box::new(push))) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                metrics::counter!("mpush_slow_consumer_total").increment(1);
                self.trace(
                    &trace_id,
                    user_id,
                    device,
                    ct,
                    TraceState::Failed,
                    Some("slow consumer: the connection's outbound queue is full".into()),
                )
                .await;
                false
            }
            Err(TrySendError::Closed(_)) => {
                self.trace(
                    &trace_id,
                    user_id,
                    device,
                    ct,
                    TraceState::Offline,
                    Some("connection closed".into()),
                )
                .await;
                false
            }
        }
    }

    /// Sends to every online connection that passes `filter`, at the broadcast
    /// rate, up to `broadcast_max`. Returns how many were targeted.
    pub async fn broadcast(
        &self,
        trace_id: &str,
        spec: &MessageSpec,
        filter: Arc<Filter>,
    ) -> usize {
        let message_id = self.next_message_id();
        let all = self.registry.snapshot();
        let max = self.cfg.settings.delivery.broadcast_max;
        // A condition is evaluated once per connection: a legal but heavy one
        // (a regex over 10k clients) runs on the blocking pool, not on the
        // async workers that serve connections.
        let pick = move || -> Vec<(String, ConnHandle)> {
            all.into_iter()
                .filter(|(u, h)| filter.matches(u, h))
                .take(max)
                .collect()
        };
        let targets = match tokio::task::spawn_blocking(pick).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "broadcast filter failed");
                return 0;
            }
        };
        for (user, h) in &targets {
            self.broadcast_limiter.acquire().await;
            let push = OutboundPush {
                message_id,
                trace_id: trace_id.to_owned(),
                content: spec.content.clone(),
                ack_mode: spec.ack_mode,
                expires_at_ms: 0,
                ack_timeout: None,
            };
            self.send(h, user, push).await;
        }
        metrics::counter!("mpush_broadcast_deliveries_total").increment(targets.len() as u64);
        targets.len()
    }

    /// Messages waiting for `user_id` that a connection of `client_type` may get.
    pub async fn pending_for(&self, user_id: &str, client_type: i32) -> Vec<StoredMessage> {
        self.inbox
            .list(user_id, unix_ms())
            .await
            .into_iter()
            .filter(|m| m.client_type.is_none_or(|ct| ct == client_type))
            .collect()
    }

    /// Starts a trace and returns its id (the caller's, or a new one).
    pub async fn start_trace(&self, trace_id: Option<String>) -> String {
        let id = trace_id
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| crate::clock::random_hex(16));
        self.traces.create(&id, unix_ms()).await;
        id
    }
}
