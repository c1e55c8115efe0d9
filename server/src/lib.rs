//! The mpush reference server. `start` binds every listener (port 0 works, for
//! tests) and returns the addresses; `Running::shutdown` drains and stops.
//!
//! Layers, as the IM design asks: `gateway` (connections; the only layer with
//! sockets), `push` (delivery logic: traces, inbox, broadcast, topics, flow
//! control), `store` (storage behind traits; in memory by default), `api` (HTTP).

pub mod api;
pub mod auth;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod gateway;
pub mod push;
pub mod store;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use config::{Settings, Validated};
pub use push::Hub;

/// A started server.
pub struct Running {
    pub tcp: SocketAddr,
    pub ws: Option<SocketAddr>,
    pub http: SocketAddr,
    pub hub: Arc<Hub>,
    tasks: Vec<JoinHandle<()>>,
}

/// The process-wide Prometheus recorder (installed once, shared by servers
/// started in the same process, as tests do).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder is installed; then ours just renders nothing.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Starts the server: the embedded in-memory default, or a cluster node when
/// `cluster.redis` is set.
pub async fn start(cfg: Validated) -> anyhow::Result<Running> {
    let cfg = Arc::new(cfg);
    if cfg.settings.cluster.redis.is_empty() {
        return start_with_hub(Hub::in_memory(cfg)).await;
    }
    let cluster = cluster::Cluster::connect(cfg.clone())
        .await
        .context("connecting to redis")?;
    start_with_hub(Hub::clustered(cfg, cluster)).await
}

/// Starts listeners and the API around `hub`.
pub async fn start_with_hub(hub: Arc<Hub>) -> anyhow::Result<Running> {
    let cfg = hub.cfg.clone();
    let tcp = TcpListener::bind(cfg.tcp)
        .await
        .with_context(|| format!("binding TCP {}", cfg.tcp))?;
    let http = TcpListener::bind(cfg.http)
        .await
        .with_context(|| format!("binding HTTP {}", cfg.http))?;
    let ws = match cfg.ws {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .with_context(|| format!("binding WebSocket {a}"))?,
        ),
        None => None,
    };
    let tcp_addr = tcp.local_addr()?;
    let http_addr = http.local_addr()?;
    let ws_addr = ws.as_ref().map(TcpListener::local_addr).transpose()?;
    let _ = hub.tcp_addr.set(tcp_addr);
    if let Some(a) = ws_addr {
        let _ = hub.ws_addr.set(a);
    }
    let mut tasks = Vec::new();
    if let Some(cl) = hub.cluster.get() {
        let addr = &cfg.settings.cluster.internal;
        let internal = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the node port {addr}"))?;
        cl.set_addresses(tcp_addr, ws_addr, http_addr, internal.local_addr()?);
        tasks.push(tokio::spawn(gateway::internal_loop(
            internal,
            hub.clone(),
            hub.shutdown.subscribe(),
        )));
        cl.spawn_loops(Arc::downgrade(&hub));
    }
    tasks.push(tokio::spawn(gateway::accept_loop(
        tcp,
        gateway::Kind::Tcp,
        hub.clone(),
        hub.shutdown.subscribe(),
    )));
    if let Some(ws) = ws {
        tasks.push(tokio::spawn(gateway::accept_loop(
            ws,
            gateway::Kind::Ws,
            hub.clone(),
            hub.shutdown.subscribe(),
        )));
    }
    let state = api::ApiState {
        hub: hub.clone(),
        metrics: metrics_handle(),
    };
    let app = api::router(state);
    let l = &cfg.settings.limits;
    let limits = api::serve::HttpLimits {
        max_connections: l.http_max_connections,
        header_timeout: Duration::from_millis(l.http_header_timeout_ms),
        idle_timeout: Duration::from_millis(l.http_idle_timeout_ms),
    };
    tasks.push(tokio::spawn(api::serve::serve(
        http,
        app,
        limits,
        hub.shutdown.subscribe(),
    )));
    Ok(Running {
        tcp: tcp_addr,
        ws: ws_addr,
        http: http_addr,
        hub,
        tasks,
    })
}

impl Running {
    /// Stops accepting, tells v2 clients to reconnect elsewhere, waits for
    /// in-flight ACKs up to the drain timeout, then closes every connection.
    /// Un-ACKed messages with a TTL stay in the offline inbox.
    pub async fn shutdown(self) {
        let hub = self.hub.clone();
        hub.draining.store(true, Ordering::Relaxed);
        if let Some(cl) = hub.cluster.get() {
            // Leave first, so no one forwards here or is sent here any more;
            // v2 clients are sent to the least loaded other node.
            cl.deregister().await;
            if hub.cfg.settings.shutdown.redirect_to.is_empty()
                && let Some(n) = cl
                    .live_nodes()
                    .await
                    .into_iter()
                    .find(|n| n.id != cl.node_id)
            {
                let _ = hub.redirect_to.set(n.tcp);
            }
        }
        let _ = hub.shutdown.send(true);
        let limit = Duration::from_millis(hub.cfg.settings.shutdown.drain_timeout_ms)
            + Duration::from_secs(2);
        let t0 = tokio::time::Instant::now();
        while hub.connections.load(Ordering::Relaxed) > 0 && t0.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
    }
}
