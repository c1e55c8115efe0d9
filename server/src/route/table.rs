//! The Redis route table (cluster mode): `mp:ur:<userId>`, a hash of client
//! type → JSON route (mpush's key), expiring unless the owning node renews it.

use mpush_protocol::session::ClientType;
use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::StreamExt;

use super::{Renewed, Route, RouteError, RouteStore};
use crate::redis_conn::RedisHandle;

/// Compare-and-delete of a route field: only if it still names this connection.
const DEL_ROUTE: &str = r"
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and string.find(v, ARGV[2], 1, true) then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0";

/// Renewal of a route field: written (with the key's TTL) if the field is
/// gone (a Redis restart lost it, or it expired) or still names this
/// connection; a row of another connection (the device bound again here or
/// on another node since the snapshot) is left alone. Returns 1 if written.
static RENEW_ROUTE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and not string.find(v, ARGV[3], 1, true) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1",
    )
});

pub struct RedisRoutes {
    redis: RedisHandle,
    ttl_secs: u64,
    /// Delivery's lookups (`lookup_many`) through a connection with a
    /// client-side cache (`RedisHandle::cached`), if any.
    cache: Option<RedisHandle>,
}

fn key(user: &str) -> String {
    format!("mp:ur:{user}")
}

/// The stored value: the route plus a `mark` (`node#conn`) that the
/// compare-and-delete matches on.
fn value(r: &Route) -> String {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    v["mark"] = format!("{}#{}", r.node, r.conn_id).into();
    v.to_string()
}

fn parse(client_type: ClientType, v: &str) -> Option<Route> {
    let mut r: Route = serde_json::from_str(v).ok()?;
    r.client_type = client_type;
    Some(r)
}

/// A route row read by `parse_row`, by client type.
fn parse_rows(
    all: HashMap<String, String>,
    parse_row: fn(ClientType, &str) -> Option<Route>,
) -> Vec<Route> {
    let mut out: Vec<Route> = all
        .iter()
        .filter_map(|(ct, v)| parse_row(ClientType::from_code(ct.parse().ok()?)?, v))
        .collect();
    out.sort_by_key(|r| r.client_type);
    out
}

/// What delivery needs of a route: where it is. The device's details the
/// row also carries (for the user view) are skipped, not built.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Hop {
    node: String,
    #[serde(with = "crate::json_u64")]
    conn_id: u64,
    #[serde(default)]
    device_id: String,
}

fn parse_hop(client_type: ClientType, v: &str) -> Option<Route> {
    let h: Hop = serde_json::from_str(v).ok()?;
    Some(Route {
        client_type,
        node: h.node,
        conn_id: h.conn_id,
        device_id: h.device_id,
        device: None,
    })
}

fn down(e: redis::RedisError) -> RouteError {
    metrics::counter!("mpush_redis_errors_total", "store" => "routes").increment(1);
    RouteError(e.to_string())
}

impl RedisRoutes {
    pub fn new(redis: RedisHandle, ttl_secs: u64) -> Self {
        Self {
            redis,
            ttl_secs,
            cache: None,
        }
    }

    /// Delivery reads routes through `cache`, a handle with a client-side
    /// cache of the same Redis. Before each read it waits for a `PING`'s
    /// answer on that connection: Redis sends a key's invalidation on it
    /// as it changes the key, so every change made before the read began
    /// (a bind or an unbind the caller may already have seen answered) has
    /// reached the cache by then. A cached route is never older than that.
    pub fn with_cache(mut self, cache: Option<RedisHandle>) -> Self {
        self.cache = cache;
        self
    }

    /// One user's route rows.
    async fn rows(&self, user: &str) -> Result<HashMap<String, String>, RouteError> {
        let mut c = self.redis.conn();
        redis::cmd("HGETALL")
            .arg(key(user))
            .query_async(&mut c)
            .await
            .map_err(down)
    }
}

#[async_trait]
impl RouteStore for RedisRoutes {
    async fn bind(&self, user: &str, route: Route) -> Result<Option<Route>, RouteError> {
        let k = key(user);
        let mut c = self.redis.conn();
        let (old,): (Option<String>,) = redis::pipe()
            .hget(&k, route.client_type.code())
            .hset(&k, route.client_type.code(), value(&route))
            .ignore()
            .expire(&k, self.ttl_secs as i64)
            .ignore()
            .query_async(&mut c)
            .await
            .map_err(down)?;
        Ok(old.and_then(|v| parse(route.client_type, &v)))
    }

    async fn unbind(&self, user: &str, client_type: ClientType, node: &str, conn_id: u64) {
        let mut c = self.redis.conn();
        let r: redis::RedisResult<i64> = redis::Script::new(DEL_ROUTE)
            .key(key(user))
            .arg(client_type.code())
            .arg(format!("\"mark\":\"{node}#{conn_id}\""))
            .invoke_async(&mut c)
            .await;
        if let Err(e) = r {
            // The route expires with its TTL when the node stops renewing it.
            tracing::warn!(error = %e, user, "route removal failed");
            metrics::counter!("mpush_redis_errors_total", "store" => "routes").increment(1);
        }
    }

    async fn lookup(&self, user: &str) -> Result<Vec<Route>, RouteError> {
        Ok(parse_rows(self.rows(user).await?, parse))
    }

    async fn lookup_many(&self, users: &[Arc<str>]) -> Result<Vec<Vec<Route>>, RouteError> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        if self.redis.cluster_nodes().is_some() {
            // A Redis Cluster pipeline stays within one slot: one command
            // per user, many in flight.
            let owned: Vec<Arc<str>> = users.to_vec();
            let all: Vec<Result<Vec<Route>, RouteError>> = futures_util::stream::iter(owned)
                .map(|u| async move { Ok(parse_rows(self.rows(&u).await?, parse_hop)) })
                .buffered(64)
                .collect()
                .await;
            return all.into_iter().collect();
        }
        let mut p = redis::pipe();
        for u in users {
            p.hgetall(key(u));
        }
        let mut c = match &self.cache {
            Some(cached) => {
                let mut c = cached.conn();
                let () = redis::cmd("PING").query_async(&mut c).await.map_err(down)?;
                c
            }
            None => self.redis.conn(),
        };
        let all: Vec<HashMap<String, String>> = p.query_async(&mut c).await.map_err(down)?;
        Ok(all
            .into_iter()
            .map(|rows| parse_rows(rows, parse_hop))
            .collect())
    }

    async fn refresh(&self, routes: Vec<(Arc<str>, Route)>) -> Renewed {
        let ttl = self.ttl_secs;
        let writes = routes.into_iter().map(|(user, route)| {
            let redis = self.redis.clone();
            async move {
                let mut c = redis.conn();
                let r: redis::RedisResult<i64> = RENEW_ROUTE
                    .key(key(&user))
                    .arg(route.client_type.code())
                    .arg(value(&route))
                    .arg(format!("\"mark\":\"{}#{}\"", route.node, route.conn_id))
                    .arg(ttl)
                    .invoke_async(&mut c)
                    .await;
                (user, route, r)
            }
        });
        // One script per user key (one slot each on a Redis Cluster), many
        // in flight at once.
        let mut out = Renewed::default();
        let mut all = futures_util::stream::iter(writes).buffer_unordered(32);
        while let Some((user, route, r)) = all.next().await {
            match r {
                Ok(1) => out.written.push((user, route)),
                Ok(_) => {}
                Err(_) => out.failed += 1,
            }
        }
        out
    }
}
