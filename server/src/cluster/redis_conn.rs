//! "The" Redis of a cluster: a plain URL (`redis://host:port/db`), or a master
//! found through Sentinel (`redis+sentinel://s1:26379,s2:26379/<master>`) and
//! followed across failovers. Commands go through a `ConnectionManager`
//! (reconnects by itself); with Sentinel, a watcher asks the sentinels for the
//! master every second and swaps the connection when it moves.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tracing::{info, warn};

#[derive(Clone)]
pub struct RedisHandle(Arc<Inner>);

struct Inner {
    manager: RwLock<ConnectionManager>,
    client: RwLock<redis::Client>,
    config: ConnectionManagerConfig,
    sentinel: Option<Sentinel>,
    master: Mutex<String>,
    timeout: Duration,
}

struct Sentinel {
    hosts: Vec<String>,
    master_name: String,
}

/// Parses `redis+sentinel://h1:p1,h2:p2/<master name>`.
fn parse_sentinel(url: &str) -> Option<Sentinel> {
    let rest = url.strip_prefix("redis+sentinel://")?;
    let (hosts, name) = rest.split_once('/')?;
    let hosts: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    let master_name = name.trim_matches('/').to_owned();
    (!hosts.is_empty() && !master_name.is_empty()).then_some(Sentinel { hosts, master_name })
}

/// True for the URL forms `connect` accepts.
pub fn valid_url(url: &str) -> bool {
    url.starts_with("redis://") || url.starts_with("rediss://") || parse_sentinel(url).is_some()
}

impl RedisHandle {
    pub async fn connect(url: &str, timeout: Duration) -> anyhow::Result<Self> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(2));
        let sentinel = parse_sentinel(url);
        let target = match &sentinel {
            Some(s) => resolve_master(s, timeout).await.ok_or_else(|| {
                anyhow::anyhow!("no sentinel of {url} knows master `{}`", s.master_name)
            })?,
            None => url.to_owned(),
        };
        let client = redis::Client::open(target.as_str())?;
        let manager = tokio::time::timeout(
            timeout * 3,
            client.get_connection_manager_with_config(config.clone()),
        )
        .await
        .map_err(|_| anyhow::anyhow!("redis at {target} did not answer"))??;
        Ok(Self(Arc::new(Inner {
            manager: RwLock::new(manager),
            client: RwLock::new(client),
            config,
            sentinel,
            master: Mutex::new(target),
            timeout,
        })))
    }

    /// A connection for one or more commands (cheap: a clone of the manager).
    pub fn conn(&self) -> ConnectionManager {
        self.0.manager.read().clone()
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
                let Ok(client) = redis::Client::open(master.as_str()) else {
                    continue;
                };
                match tokio::time::timeout(
                    inner.timeout * 3,
                    client.get_connection_manager_with_config(inner.config.clone()),
                )
                .await
                {
                    Ok(Ok(m)) => {
                        info!(%master, "redis master moved (sentinel); following it");
                        *inner.manager.write() = m;
                        *inner.client.write() = client;
                        *inner.master.lock() = master;
                    }
                    _ => warn!(%master, "new redis master not reachable yet"),
                }
            }
        });
    }
}

async fn resolve_master(s: &Sentinel, timeout: Duration) -> Option<String> {
    for host in &s.hosts {
        let Ok(client) = redis::Client::open(format!("redis://{host}/")) else {
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
            return Some(format!("redis://{h}:{p}/"));
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
    }
}
