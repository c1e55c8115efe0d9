//! Cluster mode on Redis: node discovery, node-to-node forwarding (`peer`),
//! and pub/sub fan-out for broadcast and cross-node kicks. What arrives is
//! handed to a `Delivery` (the logic layer implements it); the route table
//! is `route::table`.
//!
//! Keys: `mp:{n}:node:<id>` (JSON, TTL `node_ttl_secs`, renewed), `mp:{n}:nodes`
//! (set of ids), channels `mp:events` (join/leave), `mp:broadcast`,
//! `mp:kick:<nodeId>`, `mp:kept` (messages kept for users who may be online
//! somewhere); every message is a typed serde struct.
//!
//! Shared state is re-asserted as soon as Redis is back, not left for a
//! timer: the pub/sub connection ends the moment Redis goes away, and when
//! it is subscribed again the node registers and writes its routes at once
//! (`Delivery::redis_back`); a registration found missing at a renewal
//! (Redis lost its data under a live connection) does the same.

pub mod node_auth;
pub mod peer;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use mpush_protocol::message::v2;
use mpush_protocol::session::ClientType;
use parking_lot::Mutex;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::Validated;
use crate::redis_conn::RedisHandle;
pub use peer::ForwardError;

/// What the cluster hands to the node's logic: the cluster layer knows how
/// messages travel between nodes, not what delivering one means.
#[async_trait]
pub trait Delivery: Send + Sync + 'static {
    /// A batch another node forwarded: per recipient, how many local
    /// connections took it.
    async fn deliver_batch(&self, batch: v2::NodePushBatch) -> Vec<u32>;
    /// A broadcast published by any node (this one too).
    async fn broadcast(&self, msg: BroadcastMsg);
    /// A kick for one of this node's connections.
    fn kick(&self, msg: KickMsg);
    /// Messages kept in users' inboxes while the users may be connected
    /// to this node (a route that was missing, a node that did not answer):
    /// hand them to the connections here now.
    async fn kept(&self, msg: KeptMsg);
    /// Redis is reachable again after an outage (or lost its data): put
    /// this node's registration and routes back at once.
    async fn redis_back(&self);
    /// Open connections (the node's advertised load).
    fn load(&self) -> usize;
    fn draining(&self) -> bool;
}

/// Messages kept for users who may be online somewhere, as published on
/// `mp:kept`: `(user id, message id)` pairs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptMsg {
    pub kept: Vec<(String, u64)>,
}

/// A broadcast, as published on `mp:broadcast`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BroadcastMsg {
    pub trace_id: String,
    #[serde(with = "base64_bytes")]
    pub content: Vec<u8>,
    pub ack_mode: i32,
    /// mpush's integer, as every node of every version reads it
    /// (`ClientType::code`); converted where the message is read.
    pub client_type: Option<i32>,
    #[serde(default)]
    pub tags: Vec<String>,
    pub condition: Option<String>,
    /// The message id every node uses: one broadcast is one message.
    pub message_id: u64,
    /// Delivery callbacks: `*` the callback sinks, else an allow-listed URL;
    /// each node reports its own aggregate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<String>,
}

impl BroadcastMsg {
    /// The client type it is for, read from mpush's integer: none is every
    /// type; a code this node does not know selects only devices of an
    /// unknown type (as stored messages read back), never every device.
    pub fn only_type(&self) -> Option<ClientType> {
        self.client_type
            .map(|c| ClientType::from_code(c).unwrap_or_default())
    }
}

/// A kick, as published on `mp:kick:<node>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KickMsg {
    pub user_id: String,
    /// mpush's integer (`ClientType::code`); 0: any client type.
    pub client_type: i32,
    /// 0: every connection of the user (and client type, when not 0).
    #[serde(with = "crate::json_u64")]
    pub conn_id: u64,
    /// Replaced by a login elsewhere (KICK, connection stays: mpush 7.4), or
    /// kicked by the API (KICK and close).
    #[serde(default)]
    pub close: bool,
}

mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        base64::engine::general_purpose::STANDARD
            .decode(String::deserialize(d)?)
            .map_err(serde::de::Error::custom)
    }
}

/// The set of node ids, and each node's registration: the `{n}` hash tag keeps
/// them in one slot of a Redis Cluster.
const NODES: &str = "mp:{n}:nodes";

fn node_key(id: &str) -> String {
    format!("mp:{{n}}:node:{id}")
}

/// What a node publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: String,
    pub tcp: String,
    #[serde(default)]
    pub ws: String,
    #[serde(default)]
    pub http: String,
    #[serde(default)]
    pub internal: String,
    #[serde(default)]
    pub load: usize,
}

impl NodeInfo {
    fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    fn from_json(s: &str) -> Option<Self> {
        serde_json::from_str(s).ok()
    }
}

/// A node joined or left (`mp:events`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum NodeEvent {
    Join(String),
    Leave(String),
}

pub struct Cluster {
    pub node_id: String,
    pub redis: RedisHandle,
    /// The same Redis through a connection with a client-side cache, for
    /// delivery's route lookups (`cluster.route_cache_keys`; none when 0,
    /// on a Redis Cluster, or when Redis cannot speak RESP3).
    pub route_cache: Option<RedisHandle>,
    cfg: Arc<Validated>,
    me: Mutex<Option<NodeInfo>>,
    peers: peer::Peers,
    live: Mutex<HashMap<String, (Instant, Option<NodeInfo>)>>,
}

impl Cluster {
    pub async fn connect(cfg: Arc<Validated>) -> anyhow::Result<Arc<Self>> {
        let c = &cfg.settings.cluster;
        let ca =
            if c.redis_ca_file.is_empty() {
                None
            } else {
                Some(std::fs::read(&c.redis_ca_file).map_err(|e| {
                    anyhow::anyhow!("cluster.redis_ca_file {}: {e}", c.redis_ca_file)
                })?)
            };
        let redis = RedisHandle::connect(&c.redis, Duration::from_millis(c.timeout_ms), ca).await?;
        redis.spawn_follow();
        let route_cache = match std::num::NonZeroUsize::new(c.route_cache_keys) {
            None => None,
            Some(keys) => match redis.cached(keys).await {
                Ok(cache) => cache,
                Err(e) => {
                    // Redis before 6 has no RESP3: routes are then read
                    // without a cache, as with `route_cache_keys = 0`.
                    tracing::warn!(error = %e, "no route cache: routes are read from Redis each time");
                    None
                }
            },
        };
        let node_id = if c.node_id.is_empty() {
            crate::clock::random_hex(6)
        } else {
            c.node_id.clone()
        };
        Ok(Arc::new(Self {
            node_id,
            redis,
            route_cache,
            peers: peer::Peers::new(cfg.settings.cluster.secret.clone()),
            cfg,
            me: Mutex::new(None),
            live: Mutex::new(HashMap::new()),
        }))
    }

    /// What a node-to-node call (a forward) waits for its answer.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.settings.cluster.timeout_ms)
    }

    /// Sets the advertised addresses once listening.
    pub fn set_addresses(
        &self,
        tcp: SocketAddr,
        ws: Option<SocketAddr>,
        http: SocketAddr,
        internal: SocketAddr,
    ) {
        let host = |a: SocketAddr| {
            let h = &self.cfg.settings.cluster.advertise_host;
            let host = if !h.is_empty() {
                h.clone()
            } else if a.ip().is_unspecified() {
                "127.0.0.1".to_owned()
            } else {
                a.ip().to_string()
            };
            format!("{host}:{}", a.port())
        };
        // What clients are handed (allocator, drain redirects): with TLS on
        // a gateway, its address says so.
        let tls = &self.cfg.settings.tls;
        let tcp_addr = if tls.on("tcp") {
            format!("tls://{}", host(tcp))
        } else {
            host(tcp)
        };
        let ws_scheme = if tls.on("ws") { "wss" } else { "ws" };
        *self.me.lock() = Some(NodeInfo {
            id: self.node_id.clone(),
            tcp: tcp_addr,
            ws: ws
                .map(|w| format!("{ws_scheme}://{}/", host(w)))
                .unwrap_or_default(),
            http: host(http),
            internal: host(internal),
            load: 0,
        });
    }

    /// Registers (or renews) this node with its current load: `None` when
    /// Redis did not answer, else whether the registration was still there.
    pub async fn register(&self, load: usize, announce: bool) -> Option<bool> {
        let mut me = self.me.lock().clone()?;
        me.load = load;
        let ttl = self.cfg.settings.cluster.node_ttl_secs;
        let mut c = self.redis.conn();
        let mut p = redis::pipe();
        // Both keys share the `{n}` hash tag: one slot, so one pipeline also
        // works on a Redis Cluster. PUBLISH (no key) goes on its own.
        p.exists(node_key(&me.id))
            .set_ex(node_key(&me.id), me.to_json(), ttl)
            .ignore()
            .sadd(NODES, &me.id)
            .ignore()
            // Every key has a TTL: the set lives as long as a node renews it.
            .expire(NODES, (ttl * 10) as i64)
            .ignore();
        let was_there = p
            .query_async::<(bool,)>(&mut c)
            .await
            .map_err(|e| warn!(error = %e, "node registration failed"))
            .ok()
            .map(|(b,)| b);
        let ok = was_there.is_some();
        if ok && announce {
            let _: redis::RedisResult<i64> = c
                .publish(
                    "mp:events",
                    serde_json::to_string(&NodeEvent::Join(me.id.clone())).unwrap_or_default(),
                )
                .await;
        }
        was_there
    }

    /// Whether Redis answers (readiness).
    pub async fn ping(&self) -> Result<(), redis::RedisError> {
        let mut c = self.redis.conn();
        redis::cmd("PING")
            .query_async::<String>(&mut c)
            .await
            .map(|_| ())
    }

    /// Leaves the cluster (first step of a drain).
    pub async fn deregister(&self) {
        let mut c = self.redis.conn();
        let id = &self.node_id;
        let _: redis::RedisResult<()> = redis::pipe()
            .del(node_key(id))
            .ignore()
            .srem(NODES, id)
            .ignore()
            .query_async(&mut c)
            .await;
        let _: redis::RedisResult<i64> = c
            .publish(
                "mp:events",
                serde_json::to_string(&NodeEvent::Leave(id.clone())).unwrap_or_default(),
            )
            .await;
    }

    /// Live nodes, least loaded first (the allocator's list).
    pub async fn live_nodes(&self) -> Vec<NodeInfo> {
        let mut c = self.redis.conn();
        let ids: Vec<String> = c.smembers(NODES).await.unwrap_or_default();
        if ids.is_empty() {
            return Vec::new();
        }
        let keys: Vec<String> = ids.iter().map(|i| node_key(i)).collect();
        // One GET per key (not MGET): in a Redis Cluster the keys live in different slots.
        let mut p = redis::pipe();
        for k in &keys {
            p.get(k);
        }
        let values: Vec<Option<String>> = p.query_async(&mut c).await.unwrap_or_default();
        let mut nodes = Vec::new();
        for (id, v) in ids.iter().zip(values) {
            match v.as_deref().and_then(NodeInfo::from_json) {
                Some(n) => nodes.push(n),
                // Expired registration: forget the id.
                None => {
                    let _: redis::RedisResult<i64> = c.srem(NODES, id).await;
                }
            }
        }
        nodes.sort_by_key(|n| (n.load, n.id.clone()));
        nodes
    }

    /// A node's registration, if it is live (cached for a second).
    pub async fn node(&self, id: &str) -> Option<NodeInfo> {
        if let Some((at, n)) = self.live.lock().get(id)
            && at.elapsed() < Duration::from_secs(1)
        {
            return n.clone();
        }
        let mut c = self.redis.conn();
        let v: Option<String> = c.get(node_key(id)).await.ok().flatten();
        let n = v.as_deref().and_then(NodeInfo::from_json);
        self.live
            .lock()
            .insert(id.to_owned(), (Instant::now(), n.clone()));
        n
    }

    /// Forwards a batch to `node`: per recipient, how many connections took it.
    pub async fn forward(
        &self,
        node: &NodeInfo,
        batch: v2::NodePushBatch,
    ) -> Result<Vec<u32>, ForwardError> {
        self.peers
            .forward(&node.id, &node.internal, batch, self.timeout())
            .await
    }

    /// Publishes a broadcast to every node (this one included).
    /// Publishes a broadcast; how many nodes it reached (each handles it and
    /// reports to its trace).
    pub async fn publish_broadcast(&self, msg: &BroadcastMsg) -> Result<u64, redis::RedisError> {
        self.publish(
            "mp:broadcast",
            serde_json::to_string(msg).unwrap_or_default(),
        )
        .await
    }

    /// Tells every node about messages kept for users who may be connected
    /// there.
    pub async fn publish_kept(&self, msg: &KeptMsg) -> Result<(), redis::RedisError> {
        self.publish("mp:kept", serde_json::to_string(msg).unwrap_or_default())
            .await
            .map(|_| ())
    }

    /// Sends a kick to the node holding the connection.
    pub async fn publish_kick(&self, node: &str, msg: &KickMsg) -> Result<(), redis::RedisError> {
        self.publish(
            &format!("mp:kick:{node}"),
            serde_json::to_string(msg).unwrap_or_default(),
        )
        .await
        .map(|_| ())
    }

    /// PUBLISH, or SPUBLISH (sharded pub/sub) on a Redis Cluster: how many
    /// subscribers got it.
    async fn publish(&self, channel: &str, payload: String) -> Result<u64, redis::RedisError> {
        let mut c = self.redis.conn();
        let cmd = if self.redis.cluster_nodes().is_some() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        };
        redis::cmd(cmd)
            .arg(channel)
            .arg(payload)
            .query_async::<i64>(&mut c)
            .await
            .map(|n| u64::try_from(n).unwrap_or(0))
    }

    /// Background work: renewing the registration and the pub/sub
    /// listener; each survives Redis outages and recovers alone. Both stop
    /// when `delivery` is gone or draining.
    pub fn spawn_loops(self: &Arc<Self>, delivery: Weak<dyn Delivery>) {
        let me = self.clone();
        let d = delivery.clone();
        tokio::spawn(async move {
            let every = Duration::from_secs(me.cfg.settings.cluster.node_renew_secs);
            let (mut registered, mut ever) = (false, false);
            loop {
                let Some(node) = d.upgrade() else { return };
                if node.draining() {
                    return;
                }
                let was_there = me.register(node.load(), !registered).await;
                if was_there.is_some() && !registered {
                    info!(node = %me.node_id, "registered in the cluster");
                }
                if registered && was_there == Some(false) {
                    // Redis answers but forgot this node: it lost its data.
                    warn!(node = %me.node_id, "registration was gone from Redis: re-asserting routes");
                    let n = node.clone();
                    tokio::spawn(async move { n.redis_back().await });
                } else if ever && !registered && was_there.is_some() {
                    // Reachable again after renewals failed (a partition the
                    // pub/sub connection may not have noticed).
                    warn!(node = %me.node_id, "redis reachable again: re-asserting routes");
                    let n = node.clone();
                    tokio::spawn(async move { n.redis_back().await });
                }
                registered = was_there.is_some();
                ever |= registered;
                drop(node);
                tokio::time::sleep(if registered {
                    every
                } else {
                    Duration::from_secs(1)
                })
                .await;
            }
        });
        let me = self.clone();
        tokio::spawn(async move {
            let mut subscribed_before = false;
            loop {
                let again = subscribed_before;
                let d = delivery.clone();
                let id = me.node_id.clone();
                let on_subscribed = move || {
                    // Subscribed again after an outage: Redis is back.
                    if again && let Some(d) = d.upgrade() {
                        info!(node = %id, "redis is back: re-asserting registration and routes");
                        tokio::spawn(async move { d.redis_back().await });
                    }
                };
                match me.listen(&delivery, on_subscribed).await {
                    Ok(subscribed) => subscribed_before |= subscribed,
                    Err(e) => warn!(error = %e, "cluster pub/sub lost; resubscribing"),
                }
                if delivery.upgrade().is_none_or(|d| d.draining()) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    /// Listens until the connection ends; `on_subscribed` is called once
    /// the subscriptions are in place. `Ok(true)`: it was subscribed.
    async fn listen(
        &self,
        delivery: &Weak<dyn Delivery>,
        on_subscribed: impl FnOnce(),
    ) -> Result<bool, redis::RedisError> {
        if let Some(nodes) = self.redis.cluster_nodes() {
            return self
                .listen_sharded(nodes, delivery, on_subscribed)
                .await
                .map(|()| true);
        }
        let mut ps = self.redis.client().get_async_pubsub().await?;
        ps.subscribe("mp:broadcast").await?;
        ps.subscribe("mp:kept").await?;
        ps.subscribe(format!("mp:kick:{}", self.node_id)).await?;
        on_subscribed();
        let mut stream = ps.on_message();
        while let Some(msg) = stream.next().await {
            let Some(d) = delivery.upgrade() else {
                return Ok(true);
            };
            let payload: String = msg.get_payload().unwrap_or_default();
            dispatch(d, msg.get_channel_name(), &payload);
        }
        Ok(true)
    }

    /// Sharded pub/sub on a Redis Cluster: each channel lives on one shard
    /// (RESP3; the client resubscribes by itself after disconnections).
    async fn listen_sharded(
        &self,
        nodes: Vec<String>,
        delivery: &Weak<dyn Delivery>,
        on_subscribed: impl FnOnce(),
    ) -> Result<(), redis::RedisError> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<redis::PushInfo>();
        let t = self.redis.timeout();
        let client = redis::cluster::ClusterClient::builder(nodes)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(tx)
            .connection_timeout(t)
            .response_timeout(t)
            .build()?;
        let mut conn = client.get_async_connection().await?;
        conn.ssubscribe("mp:broadcast").await?;
        conn.ssubscribe("mp:kept").await?;
        conn.ssubscribe(format!("mp:kick:{}", self.node_id)).await?;
        on_subscribed();
        while let Some(push) = rx.recv().await {
            if push.kind != redis::PushKind::SMessage {
                continue;
            }
            let Some(d) = delivery.upgrade() else {
                return Ok(());
            };
            let text = |v: Option<&redis::Value>| {
                v.and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                    .unwrap_or_default()
            };
            let (channel, payload) = (text(push.data.first()), text(push.data.get(1)));
            dispatch(d, &channel, &payload);
        }
        Ok(())
    }
}

/// A message from pub/sub: typed, or dropped (and counted) when malformed.
fn dispatch(d: Arc<dyn Delivery>, channel: &str, payload: &str) {
    if channel == "mp:broadcast" {
        match serde_json::from_str::<BroadcastMsg>(payload) {
            Ok(msg) => {
                tokio::spawn(async move { d.broadcast(msg).await });
            }
            Err(e) => malformed(channel, &e),
        }
    } else if channel == "mp:kept" {
        match serde_json::from_str::<KeptMsg>(payload) {
            Ok(msg) => {
                tokio::spawn(async move { d.kept(msg).await });
            }
            Err(e) => malformed(channel, &e),
        }
    } else {
        match serde_json::from_str::<KickMsg>(payload) {
            Ok(msg) => d.kick(msg),
            Err(e) => malformed(channel, &e),
        }
    }
}

fn malformed(channel: &str, e: &serde_json::Error) {
    metrics::counter!("mpush_cluster_malformed_total").increment(1);
    warn!(channel, error = %e, "malformed cluster message dropped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broadcast_s_client_type_reads_as_mpush_s_integer() {
        let msg = |client_type| BroadcastMsg {
            trace_id: "t".into(),
            content: Vec::new(),
            ack_mode: 0,
            client_type,
            tags: Vec::new(),
            condition: None,
            message_id: 1,
            callback: None,
        };
        assert_eq!(msg(None).only_type(), None);
        assert_eq!(msg(Some(3)).only_type(), Some(ClientType::Web));
        // Never widened to every device.
        assert_eq!(msg(Some(7)).only_type(), Some(ClientType::Unknown));
        assert_eq!(msg(Some(0)).only_type(), Some(ClientType::Unknown));
    }
}
