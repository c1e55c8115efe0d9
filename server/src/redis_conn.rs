//! "The" Redis of a cluster: a plain URL (`redis://host:port/db`), a master
//! found through Sentinel (`redis+sentinel://s1:26379,s2:26379/<master>`) and
//! followed across failovers, or a Redis Cluster (`redis+cluster://n1:6379,n2:6379/`).
//! Commands go through a `ConnectionManager` or a cluster connection (both
//! reconnect by themselves); with Sentinel, a watcher asks the sentinels for
//! the master every second and swaps the connection when it moves.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;

/// A connection to a single server (or Sentinel's master) or to a Redis Cluster.
#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        let f = match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        };
        Box::pin(timed(command_name(cmd), f))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        let f = match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        };
        Box::pin(timed("PIPELINE", f))
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}
use tracing::{info, warn};

/// Commands named in the metrics (others are `OTHER`: a fixed label set).
const COMMANDS: &[&str] = &[
    "GET",
    "SET",
    "DEL",
    "EXISTS",
    "EXPIRE",
    "PEXPIRE",
    "TTL",
    "HGET",
    "HSET",
    "HDEL",
    "HMGET",
    "HGETALL",
    "HLEN",
    "SADD",
    "SREM",
    "SMEMBERS",
    "SCARD",
    "SISMEMBER",
    "ZADD",
    "ZREM",
    "ZRANGE",
    "ZCARD",
    "LPUSH",
    "RPUSH",
    "LRANGE",
    "LTRIM",
    "LLEN",
    "LREM",
    "INCR",
    "PUBLISH",
    "SPUBLISH",
    "PING",
    "EVAL",
    "EVALSHA",
    "SCRIPT",
    "XADD",
    "SCAN",
    "MGET",
    "SENTINEL",
    "INFO",
];

fn command_name(cmd: &redis::Cmd) -> &'static str {
    let Some(redis::Arg::Simple(first)) = cmd.args_iter().next() else {
        return "OTHER";
    };
    COMMANDS
        .iter()
        .find(|c| c.as_bytes().eq_ignore_ascii_case(first))
        .copied()
        .unwrap_or("OTHER")
}

/// One Redis round trip, timed and counted by command.
async fn timed<T>(command: &'static str, f: redis::RedisFuture<'_, T>) -> redis::RedisResult<T> {
    let started = std::time::Instant::now();
    let r = f.await;
    metrics::histogram!("mpush_redis_command_duration_seconds", "command" => command)
        .record(started.elapsed().as_secs_f64());
    if r.is_err() {
        metrics::counter!("mpush_redis_command_errors_total", "command" => command).increment(1);
    }
    r
}

#[derive(Clone)]
pub struct RedisHandle(Arc<Inner>);

struct Inner {
    manager: RwLock<RedisConn>,
    client: RwLock<redis::Client>,
    config: ConnectionManagerConfig,
    sentinel: Option<Sentinel>,
    /// The nodes of a Redis Cluster (then pub/sub is sharded).
    cluster_nodes: Option<Vec<String>>,
    master: Mutex<String>,
    timeout: Duration,
    /// What it was opened with (for [`RedisHandle::reopen`]).
    url: String,
    ca_pem: Option<Vec<u8>>,
    /// RESP3 connections with a client-side cache (`RedisHandle::cached`).
    resp3: bool,
}

struct Sentinel {
    hosts: Vec<String>,
    master_name: String,
    /// `rediss+sentinel://`: the master (and the sentinels) over TLS.
    tls: bool,
    /// `user:password@` (or `:password@`) for the master.
    auth: Option<String>,
    ca_pem: Option<Vec<u8>>,
}

/// Splits `[user:password@]rest` (the credentials of a multi-host URL).
fn split_auth(rest: &str) -> (Option<String>, &str) {
    match rest.split_once('@') {
        Some((auth, hosts)) if !auth.contains('/') => (Some(auth.to_owned()), hosts),
        _ => (None, rest),
    }
}

/// Parses `redis+sentinel://[user:password@]h1:p1,h2:p2/<master name>`
/// (`rediss+sentinel://` for TLS).
fn parse_sentinel(url: &str) -> Option<Sentinel> {
    let (tls, rest) = match url.strip_prefix("rediss+sentinel://") {
        Some(r) => (true, r),
        None => (false, url.strip_prefix("redis+sentinel://")?),
    };
    let (auth, rest) = split_auth(rest);
    let (hosts, name) = rest.split_once('/')?;
    let hosts: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    let master_name = name.trim_matches('/').to_owned();
    (!hosts.is_empty() && !master_name.is_empty()).then_some(Sentinel {
        hosts,
        master_name,
        tls,
        auth,
        ca_pem: None,
    })
}

/// Parses `redis+cluster://[user:password@]n1:p1,n2:p2/` into node URLs
/// (`rediss+cluster://` for TLS), each carrying the credentials.
fn parse_cluster(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = match url.strip_prefix("rediss+cluster://") {
        Some(r) => ("rediss", r),
        None => ("redis", url.strip_prefix("redis+cluster://")?),
    };
    let (auth, rest) = split_auth(rest);
    let at = auth.map(|a| format!("{a}@")).unwrap_or_default();
    let hosts: Vec<String> = rest
        .trim_end_matches('/')
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{at}{h}/"))
        .collect();
    (!hosts.is_empty()).then_some(hosts)
}

/// True for the URL forms `connect` accepts.
pub fn valid_url(url: &str) -> bool {
    url.starts_with("redis://")
        || url.starts_with("rediss://")
        || parse_sentinel(url).is_some()
        || parse_cluster(url).is_some()
}

/// A client for one server: `rediss://` URLs trust `ca_pem` when given
/// (a private CA), else the webpki roots. `resp3`: speak RESP3 (which
/// carries the server's invalidations of a client-side cache).
fn open_client(url: &str, ca_pem: Option<&[u8]>, resp3: bool) -> redis::RedisResult<redis::Client> {
    use redis::IntoConnectionInfo;
    let mut info = url.into_connection_info()?;
    if resp3 {
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        info = info.set_redis_settings(settings);
    }
    match ca_pem {
        Some(ca) if url.starts_with("rediss://") => redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.to_vec()),
            },
        ),
        _ => redis::Client::open(info),
    }
}

impl RedisHandle {
    /// `ca_pem`: the CA that signs the Redis servers' certificates, for
    /// `rediss` URLs on a private CA (`cluster.redis_ca_file`).
    pub async fn connect(
        url: &str,
        timeout: Duration,
        ca_pem: Option<Vec<u8>>,
    ) -> anyhow::Result<Self> {
        Self::connect_with(url, timeout, ca_pem, None).await
    }

    /// `connect`, with a client-side cache of `cache` keys when given (RESP3
    /// connections; not for a Redis Cluster).
    async fn connect_with(
        url: &str,
        timeout: Duration,
        ca_pem: Option<Vec<u8>>,
        cache: Option<std::num::NonZeroUsize>,
    ) -> anyhow::Result<Self> {
        // rustls needs one process-wide provider when more than one is built in.
        let _ = tokio_rustls::rustls::crypto::aws_lc_rs::default_provider().install_default();
        let mut config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(2));
        let resp3 = cache.is_some();
        if let Some(size) = cache {
            config = config.set_cache_config(
                redis::caching::CacheConfig::new()
                    .set_mode(redis::caching::CacheMode::All)
                    .set_size(size),
            );
        }
        if let Some(nodes) = parse_cluster(url) {
            anyhow::ensure!(!resp3, "no client-side cache on a Redis Cluster");
            let mut builder = redis::cluster::ClusterClient::builder(nodes.clone())
                .connection_timeout(timeout)
                .response_timeout(timeout);
            if let Some(ca) = &ca_pem {
                builder = builder.certs(redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                });
            }
            let client = builder.build()?;
            let conn = tokio::time::timeout(timeout * 3, client.get_async_connection())
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "redis cluster at {} did not answer",
                        crate::redact::mask_url(url)
                    )
                })??;
            // Pub/sub messages are broadcast to every node of a Redis Cluster,
            // so one node's plain client carries them.
            let pubsub = open_client(&nodes[0], ca_pem.as_deref(), false)?;
            return Ok(Self(Arc::new(Inner {
                manager: RwLock::new(RedisConn::Cluster(conn)),
                client: RwLock::new(pubsub),
                config,
                sentinel: None,
                cluster_nodes: Some(nodes),
                master: Mutex::new(url.to_owned()),
                timeout,
                url: url.to_owned(),
                ca_pem,
                resp3,
            })));
        }
        let sentinel = parse_sentinel(url).map(|mut s| {
            s.ca_pem = ca_pem.clone();
            s
        });
        let target = match &sentinel {
            Some(s) => resolve_master(s, timeout).await.ok_or_else(|| {
                anyhow::anyhow!(
                    "no sentinel of {} knows master `{}`",
                    crate::redact::mask_url(url),
                    s.master_name
                )
            })?,
            None => url.to_owned(),
        };
        let client = open_client(&target, ca_pem.as_deref(), resp3)?;
        let manager = tokio::time::timeout(
            timeout * 3,
            client.get_connection_manager_with_config(config.clone()),
        )
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "redis at {} did not answer",
                crate::redact::mask_url(&target)
            )
        })??;
        Ok(Self(Arc::new(Inner {
            manager: RwLock::new(RedisConn::Single(manager)),
            client: RwLock::new(client),
            config,
            sentinel,
            cluster_nodes: None,
            master: Mutex::new(target),
            timeout,
            url: url.to_owned(),
            ca_pem,
            resp3,
        })))
    }

    /// A handle of its own to the same Redis (its own connections, which
    /// follow the master as this one does), opened on the calling runtime:
    /// their I/O then runs there. The trace writer's thread takes one, so
    /// its writes do not wait for the async workers (nor theirs for it).
    pub async fn reopen(&self) -> anyhow::Result<Self> {
        let h = Self::connect(&self.0.url, self.0.timeout, self.0.ca_pem.clone()).await?;
        h.spawn_follow();
        Ok(h)
    }

    /// A handle of its own to the same Redis whose connection keeps a
    /// client-side cache of up to `keys` keys (RESP3 with server-assisted
    /// invalidation: Redis tells it of every change to a key it has read,
    /// on the same connection, in order with the replies; a reconnect or a
    /// master that moved starts an empty cache). `None` for a Redis Cluster.
    pub async fn cached(&self, keys: std::num::NonZeroUsize) -> anyhow::Result<Option<Self>> {
        if self.0.cluster_nodes.is_some() {
            return Ok(None);
        }
        let h = Self::connect_with(
            &self.0.url,
            self.0.timeout,
            self.0.ca_pem.clone(),
            Some(keys),
        )
        .await?;
        h.spawn_follow();
        Ok(Some(h))
    }

    /// Hits, misses and invalidations of the client-side cache
    /// (`RedisHandle::cached`) since its connection opened.
    pub fn cache_statistics(&self) -> Option<redis::caching::CacheStatistics> {
        match &*self.0.manager.read() {
            RedisConn::Single(m) => m.get_cache_statistics(),
            RedisConn::Cluster(_) => None,
        }
    }

    /// A connection for one or more commands (cheap: a clone of the manager).
    pub fn conn(&self) -> RedisConn {
        self.0.manager.read().clone()
    }

    /// The nodes of a Redis Cluster, if that is what this is.
    pub fn cluster_nodes(&self) -> Option<Vec<String>> {
        self.0.cluster_nodes.clone()
    }

    pub fn timeout(&self) -> Duration {
        self.0.timeout
    }

    /// The client of the current master (for pub/sub).
    pub fn client(&self) -> redis::Client {
        self.0.client.read().clone()
    }

    /// With Sentinel: follows the master across failovers, until dropped.
    pub fn spawn_follow(&self) {
        if self.0.sentinel.is_none() {
            return;
        }
        let weak = Arc::downgrade(&self.0);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let Some(inner) = weak.upgrade() else { return };
                let Some(s) = &inner.sentinel else { return };
                let Some(master) = resolve_master(s, inner.timeout).await else {
                    continue;
                };
                if *inner.master.lock() == master {
                    continue;
                }
                let Ok(client) = open_client(&master, s.ca_pem.as_deref(), inner.resp3) else {
                    continue;
                };
                match tokio::time::timeout(
                    inner.timeout * 3,
                    client.get_connection_manager_with_config(inner.config.clone()),
                )
                .await
                {
                    Ok(Ok(m)) => {
                        let shown = crate::redact::mask_url(&master);
                        info!(master = %shown, "redis master moved (sentinel); following it");
                        *inner.manager.write() = RedisConn::Single(m);
                        *inner.client.write() = client;
                        *inner.master.lock() = master;
                    }
                    _ => warn!(
                        master = %crate::redact::mask_url(&master),
                        "new redis master not reachable yet"
                    ),
                }
            }
        });
    }
}

async fn resolve_master(s: &Sentinel, timeout: Duration) -> Option<String> {
    let scheme = if s.tls { "rediss" } else { "redis" };
    for host in &s.hosts {
        let Ok(client) = open_client(&format!("{scheme}://{host}/"), s.ca_pem.as_deref(), false)
        else {
            continue;
        };
        let Ok(Ok(mut c)) =
            tokio::time::timeout(timeout, client.get_multiplexed_async_connection()).await
        else {
            continue;
        };
        let reply: Result<Result<Option<Vec<String>>, _>, _> = tokio::time::timeout(
            timeout,
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&s.master_name)
                .query_async(&mut c),
        )
        .await;
        if let Ok(Ok(Some(addr))) = reply
            && let [h, p] = addr.as_slice()
        {
            let at = s.auth.as_ref().map(|a| format!("{a}@")).unwrap_or_default();
            return Some(format!("{scheme}://{at}{h}:{p}/"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls() {
        let s = parse_sentinel("redis+sentinel://a:26379,b:26380/mymaster").expect("parses");
        assert_eq!((s.hosts.len(), s.master_name.as_str()), (2, "mymaster"));
        assert!(parse_sentinel("redis+sentinel://a:26379/").is_none());
        assert!(
            valid_url("redis://x:1/")
                && valid_url("redis+sentinel://a:1/m")
                && !valid_url("http://x")
        );
        assert_eq!(
            parse_cluster("redis+cluster://a:1,b:2/"),
            Some(vec!["redis://a:1/".to_owned(), "redis://b:2/".to_owned()])
        );
    }

    #[test]
    fn credentials_and_tls_in_multi_host_urls() {
        let s = parse_sentinel("rediss+sentinel://app:s3cret@a:26379,b:26380/mymaster")
            .expect("parses");
        assert!(s.tls);
        assert_eq!(s.auth.as_deref(), Some("app:s3cret"));
        assert_eq!(s.hosts, ["a:26379", "b:26380"]);
        assert_eq!(
            parse_cluster("rediss+cluster://:pw@a:1,b:2/"),
            Some(vec![
                "rediss://:pw@a:1/".to_owned(),
                "rediss://:pw@b:2/".to_owned()
            ])
        );
        assert!(valid_url("rediss+cluster://a:1/") && valid_url("rediss+sentinel://a:1/m"));
        assert_eq!(command_name(&redis::cmd("hgetall")), "HGETALL");
        assert_eq!(command_name(&redis::cmd("FLUSHALL")), "OTHER");
    }
}
