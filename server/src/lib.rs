//! The mpush reference server. `start` binds every listener (port 0 works, for
//! tests) and returns the addresses; `Running::shutdown` drains and stops.
//!
//! Layers, as the IM design asks, every import pointing down:
//! `api`/`gateway` (HTTP and client connections) → `logic` (bind, auth,
//! delivery, traces, inbox, broadcast, topics, flow control) → `route`
//! (where a user is: this node's connections, the route table) and `cluster`
//! (discovery, node links, pub/sub) → `store` (storage behind traits) →
//! `redis_conn` (the Redis plumbing `store`, `route` and `cluster` share).

pub mod api;
pub mod auth;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod forwarded;
pub mod from_mpush;
pub mod gateway;
mod json_u64;
pub mod logic;
pub mod proxy;
pub mod redact;
pub mod redis_conn;
pub mod route;
pub mod sink;
pub mod store;
pub mod telemetry;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use config::{Settings, Validated};
pub use logic::Hub;

/// A started server.
pub struct Running {
    /// This node's id (`cluster.node_id`).
    pub node_id: String,
    pub tcp: SocketAddr,
    pub ws: Option<SocketAddr>,
    pub http: SocketAddr,
    /// The node-to-node port (cluster mode).
    pub internal: Option<SocketAddr>,
    pub hub: Arc<Hub>,
    tasks: Vec<JoinHandle<()>>,
    http_stop: tokio::sync::watch::Sender<bool>,
    /// The certificate in use: its reload watch runs while this is held
    /// (the listeners' acceptors read through it).
    _tls: Option<Arc<tls::Tls>>,
}

/// The process-wide Prometheus recorder (installed once, shared by servers
/// started in the same process, as tests do).
pub fn metrics_handle() -> PrometheusHandle {
    telemetry::handle()
}

/// Connections the kernel completes for a listener before it accepts them
/// (clamped by `net.core.somaxconn`). tokio's default is 1,024: a node
/// restarted under thousands of reconnecting clients then drops SYNs and
/// they retry a second or more later.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds a listener; an error names the setting and the flag that move it
/// (a second node on the same host needs its own ports).
async fn bind(a: SocketAddr, what: &str, setting: &str, flag: &str) -> anyhow::Result<TcpListener> {
    let listen = || -> std::io::Result<TcpListener> {
        let sock = if a.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // As `TcpListener::bind` does: a restarted node binds its ports again
        // while the old connections sit in TIME_WAIT.
        sock.set_reuseaddr(true)?;
        sock.bind(a)?;
        sock.listen(LISTEN_BACKLOG)
    };
    listen().map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
            format!(
                "; another process (another node?) listens there: give this one its own port with {setting} or {flag}"
            )
        } else {
            format!("; set another address with {setting} or {flag}")
        };
        anyhow::anyhow!("binding {what} on {a} ({setting}): {e}{hint}")
    })
}

/// Starts the server: the embedded in-memory default, or a cluster node when
/// `cluster.redis` is set.
pub async fn start(cfg: Validated) -> anyhow::Result<Running> {
    // The recorder first: what the services register while they start
    // (a sink's zero series) is then recorded, not lost to the no-op one.
    let metrics = metrics_handle();
    let cfg = Arc::new(cfg);
    let tcp = bind(cfg.tcp, "the TCP gateway", "net.tcp", "--tcp").await?;
    let http = bind(cfg.http, "the HTTP API", "net.http", "--http").await?;
    let ws = match cfg.ws {
        Some(a) => Some(bind(a, "the WebSocket gateway", "net.ws", "--ws").await?),
        None => None,
    };
    let listeners = logic::Listeners {
        tcp: tcp.local_addr()?,
        ws: ws.as_ref().map(TcpListener::local_addr).transpose()?,
        http: http.local_addr()?,
    };
    let mut tasks = Vec::new();
    let mut internal_addr = None;
    let hub = if cfg.settings.cluster.redis.is_empty() {
        Hub::in_memory(cfg.clone(), listeners)
    } else {
        let cluster = cluster::Cluster::connect(cfg.clone())
            .await
            .context("connecting to redis")?;
        let addr = &cfg.settings.cluster.internal;
        let internal = match addr.parse::<SocketAddr>() {
            Ok(a) => bind(a, "the node port", "cluster.internal", "--node-port").await?,
            Err(_) => TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the node port {addr} (cluster.internal)"))?,
        };
        internal_addr = Some(internal.local_addr()?);
        cluster.set_addresses(
            listeners.tcp,
            listeners.ws,
            listeners.http,
            internal.local_addr()?,
        );
        let hub = Hub::clustered(cfg.clone(), cluster, listeners);
        let c = &cfg.settings.cluster;
        let delivery: std::sync::Weak<dyn cluster::Delivery> = Arc::downgrade(&hub) as _;
        tasks.push(tokio::spawn(cluster::peer::serve(
            internal,
            delivery,
            c.secret.clone(),
            Duration::from_millis(c.timeout_ms),
            cfg.settings.limits.max_packet_size + 1024,
            hub.node().shutdown_signal(),
        )));
        hub
    };
    let gw = gateway::Gateway::new(hub.clone(), hub.proto().clone(), &cfg);
    let tls_for = |listener: &str| {
        cfg.tls
            .as_ref()
            .filter(|_| cfg.settings.tls.on(listener))
            .map(|t| t.acceptor().clone())
    };
    if let Some(t) = &cfg.tls {
        t.spawn_watch(Duration::from_secs(cfg.settings.tls.reload_check_secs));
    }
    tasks.push(tokio::spawn(gateway::accept_loop(
        tcp,
        gateway::Kind::Tcp,
        tls_for("tcp"),
        gw.clone(),
        hub.node().shutdown_signal(),
    )));
    if let Some(ws) = ws {
        tasks.push(tokio::spawn(gateway::accept_loop(
            ws,
            gateway::Kind::Ws,
            tls_for("ws"),
            gw,
            hub.node().shutdown_signal(),
        )));
    }
    let state = api::ApiState {
        svc: Arc::new(api::HubService(hub.clone())),
        settings: Arc::new(api::ApiSettings::new(&cfg)),
        metrics,
    };
    let app = api::router(state);
    let l = &cfg.settings.limits;
    let limits = api::serve::HttpLimits {
        max_connections: l.http_max_connections,
        header_timeout: Duration::from_millis(l.http_header_timeout_ms),
        idle_timeout: Duration::from_millis(l.http_idle_timeout_ms),
    };
    // The API keeps answering through the drain (`/readyz` says 503, pushes
    // are refused with 503) and stops when the drain is over.
    let (http_stop, http_stopped) = tokio::sync::watch::channel(false);
    tasks.push(tokio::spawn(api::serve::serve(
        http,
        app,
        limits,
        tls_for("http"),
        cfg.proxies.clone(),
        http_stopped,
    )));
    Ok(Running {
        node_id: hub.node_id().to_owned(),
        tcp: listeners.tcp,
        ws: listeners.ws,
        http: listeners.http,
        internal: internal_addr,
        hub,
        tasks,
        http_stop,
        _tls: cfg.tls.clone(),
    })
}

impl Running {
    /// Drains: the node leaves the cluster and withdraws its routes, readiness
    /// turns 503, v2 clients are redirected (an address of their transport,
    /// after a jittered wait), in-flight ACKs are awaited up to the drain
    /// timeout, then every connection closes. Un-ACKed messages go to their
    /// users' inboxes; the sinks' queues are handed on.
    pub async fn shutdown(self) {
        let hub = self.hub.clone();
        hub.start_drain().await;
        let limit = hub.node().settings().drain_timeout + Duration::from_secs(2);
        let t0 = tokio::time::Instant::now();
        while hub.node().connections() > 0 && t0.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // What the sinks still hold (async webhooks, lifecycle events,
        // callbacks) is handed on within what is left of the drain time.
        let left = hub
            .upstream()
            .sinks()
            .flush(
                limit
                    .saturating_sub(t0.elapsed())
                    .max(Duration::from_secs(1)),
            )
            .await;
        if left > 0 {
            tracing::warn!(left, "sink events not handed on before the node stopped");
        }
        let _ = self.http_stop.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
    }
}
