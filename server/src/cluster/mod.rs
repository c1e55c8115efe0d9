//! Cluster mode on Redis: node discovery, the route table, node-to-node
//! forwarding, and pub/sub fan-out for broadcast and cross-node kicks.
//!
//! Keys: `mp:{n}:node:<id>` (JSON, TTL `node_ttl_secs`, renewed), `mp:{n}:nodes`
//! (set of ids), `mp:ur:<userId>` (hash: client type → JSON route, TTL refreshed
//! while connected), channels `mp:events` (join/leave), `mp:broadcast`,
//! `mp:kick:<nodeId>`.

pub mod node_auth;
pub mod peer;
pub mod redis_conn;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use mpush_protocol::message::v2;
use parking_lot::Mutex;
use redis::AsyncCommands;
use serde_json::{Value, json};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::Validated;
use crate::push::Hub;
pub use peer::ForwardError;

/// The set of node ids, and each node's registration: the `{n}` hash tag keeps
/// them in one slot of a Redis Cluster.
const NODES: &str = "mp:{n}:nodes";

fn node_key(id: &str) -> String {
    format!("mp:{{n}}:node:{id}")
}

/// What a node publishes about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub id: String,
    pub tcp: String,
    pub ws: String,
    pub http: String,
    pub internal: String,
    pub load: usize,
}

impl NodeInfo {
    fn to_json(&self) -> String {
        json!({"id": self.id, "tcp": self.tcp, "ws": self.ws, "http": self.http, "internal": self.internal, "load": self.load}).to_string()
    }

    fn from_json(s: &str) -> Option<Self> {
        let v: Value = serde_json::from_str(s).ok()?;
        let f = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        Some(Self {
            id: f("id"),
            tcp: f("tcp"),
            ws: f("ws"),
            http: f("http"),
            internal: f("internal"),
            load: v["load"].as_u64().unwrap_or(0) as usize,
        })
    }
}

/// One route of the table: where (user, client type) is connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub client_type: i32,
    pub node: String,
    pub conn_id: u64,
    pub device_id: String,
}

pub struct Cluster {
    pub node_id: String,
    pub redis: redis_conn::RedisHandle,
    cfg: Arc<Validated>,
    me: Mutex<Option<NodeInfo>>,
    peers: peer::Peers,
    live: Mutex<HashMap<String, (Instant, Option<NodeInfo>)>>,
}

/// Compare-and-delete of a route field: only if it still names this connection.
const DEL_ROUTE: &str = r"
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and string.find(v, ARGV[2], 1, true) then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0";

impl Cluster {
    pub async fn connect(cfg: Arc<Validated>) -> anyhow::Result<Arc<Self>> {
        let c = &cfg.settings.cluster;
        let redis =
            redis_conn::RedisHandle::connect(&c.redis, Duration::from_millis(c.timeout_ms)).await?;
        redis.spawn_follow();
        let node_id = if c.node_id.is_empty() {
            crate::clock::random_hex(6)
        } else {
            c.node_id.clone()
        };
        Ok(Arc::new(Self {
            node_id,
            redis,
            peers: peer::Peers::new(cfg.settings.cluster.secret.clone()),
            cfg,
            me: Mutex::new(None),
            live: Mutex::new(HashMap::new()),
        }))
    }

    fn timeout(&self) -> Duration {
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
        *self.me.lock() = Some(NodeInfo {
            id: self.node_id.clone(),
            tcp: host(tcp),
            ws: ws.map(|w| format!("ws://{}/", host(w))).unwrap_or_default(),
            http: host(http),
            internal: host(internal),
            load: 0,
        });
    }

    /// Registers (or renews) this node with its current load.
    pub async fn register(&self, load: usize, announce: bool) -> bool {
        let Some(mut me) = self.me.lock().clone() else {
            return false;
        };
        me.load = load;
        let ttl = self.cfg.settings.cluster.node_ttl_secs;
        let mut c = self.redis.conn();
        let mut p = redis::pipe();
        // Both keys share the `{n}` hash tag: one slot, so one pipeline also
        // works on a Redis Cluster. PUBLISH (no key) goes on its own.
        p.set_ex(node_key(&me.id), me.to_json(), ttl)
            .ignore()
            .sadd(NODES, &me.id)
            .ignore()
            // Every key has a TTL: the set lives as long as a node renews it.
            .expire(NODES, (ttl * 10) as i64)
            .ignore();
        let ok = p
            .query_async::<()>(&mut c)
            .await
            .map_err(|e| warn!(error = %e, "node registration failed"))
            .is_ok();
        if ok && announce {
            let _: redis::RedisResult<i64> = c
                .publish("mp:events", json!({"join": me.id}).to_string())
                .await;
        }
        ok
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
            .publish("mp:events", json!({"leave": id}).to_string())
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

    fn route_value(&self, conn_id: u64, device_id: &str) -> String {
        json!({"node": self.node_id, "connId": conn_id.to_string(), "deviceId": device_id, "mark": format!("{}#{}", self.node_id, conn_id)}).to_string()
    }

    /// Writes this node's route for (user, client type); returns the route it replaced.
    pub async fn route_set(
        &self,
        user: &str,
        client_type: i32,
        conn_id: u64,
        device_id: &str,
    ) -> Result<Option<Route>, redis::RedisError> {
        let key = format!("mp:ur:{user}");
        let mut c = self.redis.conn();
        let (old,): (Option<String>,) = redis::pipe()
            .hget(&key, client_type)
            .hset(&key, client_type, self.route_value(conn_id, device_id))
            .ignore()
            .expire(&key, self.cfg.settings.cluster.route_ttl_secs as i64)
            .ignore()
            .query_async(&mut c)
            .await?;
        Ok(old.and_then(|v| parse_route(client_type, &v)))
    }

    /// Removes a route only if it still names `node`'s connection `conn_id`.
    pub async fn route_del(&self, user: &str, client_type: i32, node: &str, conn_id: u64) {
        let mut c = self.redis.conn();
        let _: redis::RedisResult<i64> = redis::Script::new(DEL_ROUTE)
            .key(format!("mp:ur:{user}"))
            .arg(client_type)
            .arg(format!("\"mark\":\"{node}#{conn_id}\""))
            .invoke_async(&mut c)
            .await;
    }

    pub async fn routes(&self, user: &str) -> Result<Vec<Route>, redis::RedisError> {
        let mut c = self.redis.conn();
        let all: HashMap<String, String> = c.hgetall(format!("mp:ur:{user}")).await?;
        Ok(all
            .iter()
            .filter_map(|(ct, v)| parse_route(ct.parse().ok()?, v))
            .collect())
    }

    /// Forwards a push to the node holding the route.
    pub async fn forward(&self, node: &NodeInfo, push: v2::NodePush) -> Result<(), ForwardError> {
        self.peers
            .forward(&node.id, &node.internal, push, self.timeout())
            .await
    }

    /// PUBLISH, or SPUBLISH (sharded pub/sub) on a Redis Cluster.
    pub async fn publish(&self, channel: &str, payload: String) -> Result<(), redis::RedisError> {
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
            .map(|_| ())
    }

    /// Background work: renewing the registration, refreshing routes, and
    /// the pub/sub listener; each survives Redis outages and recovers alone.
    pub fn spawn_loops(self: &Arc<Self>, hub: Weak<Hub>) {
        let me = self.clone();
        let h = hub.clone();
        tokio::spawn(async move {
            let every = Duration::from_secs(me.cfg.settings.cluster.node_renew_secs);
            let mut registered = false;
            loop {
                let Some(hub) = h.upgrade() else { return };
                if hub.draining.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                let ok = me
                    .register(
                        hub.connections.load(std::sync::atomic::Ordering::Relaxed),
                        !registered,
                    )
                    .await;
                if ok && !registered {
                    info!(node = %me.node_id, "registered in the cluster");
                }
                registered = ok;
                drop(hub);
                tokio::time::sleep(if ok { every } else { Duration::from_secs(1) }).await;
            }
        });
        let me = self.clone();
        let h = hub.clone();
        tokio::spawn(async move {
            let every = Duration::from_secs(me.cfg.settings.cluster.route_refresh_secs);
            loop {
                tokio::time::sleep(every).await;
                let Some(hub) = h.upgrade() else { return };
                let ttl = me.cfg.settings.cluster.route_ttl_secs as i64;
                // One small pipeline per user key (one slot each on a Redis
                // Cluster), many in flight at once.
                let writes = hub.registry.snapshot().into_iter().map(|(user, handle)| {
                    let me = me.clone();
                    async move {
                        let key = format!("mp:ur:{user}");
                        let value = me.route_value(handle.info.id, &handle.info.device.device_id);
                        let mut c = me.redis.conn();
                        redis::pipe()
                            .hset(&key, handle.info.client_type, value)
                            .ignore()
                            .expire(&key, ttl)
                            .ignore()
                            .query_async::<()>(&mut c)
                            .await
                    }
                });
                let failed = futures_util::stream::iter(writes)
                    .buffer_unordered(32)
                    .filter(|r| std::future::ready(r.is_err()))
                    .count()
                    .await;
                if failed > 0 {
                    warn!(failed, "route refresh failed for some users");
                }
            }
        });
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = me.listen(&hub).await {
                    warn!(error = %e, "cluster pub/sub lost; resubscribing");
                }
                if hub
                    .upgrade()
                    .is_none_or(|h| h.draining.load(std::sync::atomic::Ordering::Relaxed))
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }

    async fn listen(&self, hub: &Weak<Hub>) -> Result<(), redis::RedisError> {
        if let Some(nodes) = self.redis.cluster_nodes() {
            return self.listen_sharded(nodes, hub).await;
        }
        let mut ps = self.redis.client().get_async_pubsub().await?;
        ps.subscribe("mp:broadcast").await?;
        ps.subscribe(format!("mp:kick:{}", self.node_id)).await?;
        let mut stream = ps.on_message();
        while let Some(msg) = stream.next().await {
            let Some(hub) = hub.upgrade() else {
                return Ok(());
            };
            let payload: String = msg.get_payload().unwrap_or_default();
            self.dispatch(&hub, msg.get_channel_name(), &payload);
        }
        Ok(())
    }
}

impl Cluster {
    /// Sharded pub/sub on a Redis Cluster: each channel lives on one shard
    /// (RESP3; the client resubscribes by itself after disconnections).
    async fn listen_sharded(
        &self,
        nodes: Vec<String>,
        hub: &Weak<Hub>,
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
        conn.ssubscribe(format!("mp:kick:{}", self.node_id)).await?;
        while let Some(push) = rx.recv().await {
            if push.kind != redis::PushKind::SMessage {
                continue;
            }
            let Some(hub) = hub.upgrade() else {
                return Ok(());
            };
            let text = |v: Option<&redis::Value>| {
                v.and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                    .unwrap_or_default()
            };
            let (channel, payload) = (text(push.data.first()), text(push.data.get(1)));
            self.dispatch(&hub, &channel, &payload);
        }
        Ok(())
    }

    fn dispatch(&self, hub: &Arc<Hub>, channel: &str, payload: &str) {
        let Ok(v) = serde_json::from_str::<Value>(payload) else {
            return;
        };
        if channel == "mp:broadcast" {
            let hub = hub.clone();
            tokio::spawn(async move { hub.broadcast_from_cluster(&v).await });
        } else {
            hub.kick_from_cluster(&v);
        }
    }
}

fn parse_route(client_type: i32, v: &str) -> Option<Route> {
    let j: Value = serde_json::from_str(v).ok()?;
    Some(Route {
        client_type,
        node: j["node"].as_str()?.to_owned(),
        conn_id: j["connId"].as_str()?.parse().ok()?,
        device_id: j["deviceId"].as_str().unwrap_or_default().to_owned(),
    })
}
