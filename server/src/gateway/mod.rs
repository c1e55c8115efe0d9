//! The access layer: listeners, per-connection drivers, limits. A driver
//! moves bytes and time into its connection's machine and carries the output
//! out; what a client asks for (bind, resume) and what became of a push are
//! handed to the logic layer, which decides.

pub mod conn;
pub mod limits;
pub mod seam;
#[cfg(test)]
mod tests;
mod timers;
pub mod transport;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::{debug, warn};

use crate::config::{TrustedProxies, Validated};
use crate::route::ConnQueue;
use crate::tls::Acceptor as TlsAcceptor;
use limits::{IpRateLimit, IpSlot, PerIp, RsaPool};
use mpush_protocol::server::ServerConfig;
pub use seam::Logic;
use transport::{Tcp, TlsTcp, Ws};

/// What the gateway reads of the configuration, taken once when it is
/// built: it never reads the whole configuration afterwards.
pub struct GatewaySettings {
    /// The protocol machines' settings.
    pub proto: Arc<ServerConfig>,
    pub max_connections: usize,
    /// Commands waiting for one connection (pushes, kicks).
    pub outbound_queue: usize,
    pub tcp_keepalive_secs: u64,
    /// For the TLS and WebSocket handshakes before the protocol's.
    pub handshake_timeout: Duration,
    /// How long a draining connection waits for its ACKs.
    pub drain_timeout: Duration,
    /// A write the peer does not take within this ends the connection.
    pub write_timeout: Duration,
    pub ws_read_buffer: usize,
    pub max_packet_size: usize,
    /// `net.dev_loopback_transport`: plain ws:// from this machine may use
    /// the transport-secured profile (development only).
    pub dev_loopback_transport: bool,
    pub proxies: Arc<TrustedProxies>,
}

impl GatewaySettings {
    pub fn new(cfg: &Validated, proto: Arc<ServerConfig>) -> Self {
        let l = &cfg.settings.limits;
        Self {
            proto,
            max_connections: l.max_connections,
            outbound_queue: l.outbound_queue,
            tcp_keepalive_secs: l.tcp_keepalive_secs,
            handshake_timeout: Duration::from_millis(l.handshake_timeout_ms),
            drain_timeout: Duration::from_millis(cfg.settings.shutdown.drain_timeout_ms),
            write_timeout: cfg.write_timeout(),
            ws_read_buffer: l.ws_read_buffer,
            max_packet_size: l.max_packet_size,
            dev_loopback_transport: cfg.loopback_transport,
            proxies: cfg.proxies.clone(),
        }
    }
}

/// What every connection of this node shares: the logic layer (through its
/// seam, [`Logic`]), the gateway's settings and its own limits.
pub struct Gateway<L> {
    pub logic: Arc<L>,
    pub settings: GatewaySettings,
    /// Open connections per client address.
    per_ip: Arc<PerIp>,
    /// Handshake RSA work, off the async workers.
    rsa: RsaPool,
    /// New connections per second per client address.
    rate: IpRateLimit,
    /// Every open connection's queue, for the drain.
    pub(crate) conns: ConnRegistry,
}

/// Every open connection's command queue, bound or not: the drain and the
/// timers reach each through it. One waiter (a task per gateway) watches the
/// node's shutdown signal, instead of a watch future held by every idle
/// connection; one task keeps the connections' deadlines (`timers`).
#[derive(Default)]
pub(crate) struct ConnRegistry {
    map: dashmap::DashMap<u64, Arc<ConnQueue>>,
    draining: std::sync::atomic::AtomicBool,
    pub(crate) timers: timers::Timers,
}

impl ConnRegistry {
    /// Registers a connection's queue; true when the node drains already
    /// (the connection drains itself then).
    pub(crate) fn register(&self, conn_id: u64, q: &Arc<ConnQueue>) -> bool {
        self.map.insert(conn_id, q.clone());
        // After the insert: a drain that started before it is seen here, one
        // that starts after it finds the queue.
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn remove(&self, conn_id: u64) {
        self.map.remove(&conn_id);
    }

    /// Tells every connection to drain (idempotent).
    pub(crate) fn drain_all(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for e in self.map.iter() {
            e.value().drain();
        }
    }

    /// Open connections registered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Wakes every connection whose deadline came by now; the next
    /// deadline's instant. `due` is the caller's scratch space.
    fn fire_due(&self, due: &mut Vec<(u64, u64)>) -> Option<Instant> {
        let mut next = self.timers.take_due(self.timers.now(), due);
        // Entries whose connection's deadline moved later re-arm for it in
        // place of a wake: the task is woken only when its deadline came.
        // A connection holds one live entry whatever its deadline did.
        due.retain_mut(|(at, conn)| match self.map.get(conn).map(|q| q.fire(*at)) {
            Some(crate::route::Fired::Rearmed(later)) => {
                *at = later;
                true
            }
            _ => false,
        });
        if let Some(first) = self.timers.add_all(due) {
            next = Some(next.map_or(first, |n| n.min(first)));
        }
        due.clear();
        // Stale entries (connections gone, or armed earlier since) are
        // dropped once they outnumber the open connections: at most about
        // two entries per connection, and the walk amortised over as many
        // entries as it drops.
        if self.timers.len() > 2 * self.map.len() + 1024 {
            self.timers
                .compact(|at, conn| self.map.get(&conn).is_some_and(|q| q.armed_for(at)));
        }
        next
    }
}

/// Starts `gw`'s timer task (once; called by the first connection that arms
/// a deadline, so it runs on the connections' runtime).
fn start_timers<L: Logic>(gw: &Arc<Gateway<L>>) {
    if !gw.conns.timers.start() {
        return;
    }
    let notify = gw.conns.timers.notify();
    let gw = Arc::downgrade(gw);
    tokio::spawn(async move {
        let mut due = Vec::new();
        loop {
            // The gateway is held only while firing: a dropped gateway ends
            // the task (its timers notify on drop).
            let Some(g) = gw.upgrade() else {
                return;
            };
            let next = g.conns.fire_due(&mut due);
            drop(g);
            if next.is_some_and(|at| at <= Instant::now()) {
                // A full batch: the rest after the worker's other tasks.
                tokio::task::yield_now().await;
                continue;
            }
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = notify.notified() => {}
                    }
                }
                None => notify.notified().await,
            }
        }
    });
}

/// Drains every connection of `gw` when the node's shutdown signal flips.
fn watch_shutdown<L: Logic>(gw: &Arc<Gateway<L>>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut signal = gw.logic.shutdown_signal();
    let gw = Arc::downgrade(gw);
    rt.spawn(async move {
        loop {
            if *signal.borrow_and_update() {
                if let Some(gw) = gw.upgrade() {
                    gw.conns.drain_all();
                }
                return;
            }
            if signal.changed().await.is_err() {
                return;
            }
        }
    });
}

impl<L: Logic> Gateway<L> {
    /// `proto`: the protocol machines' settings (the logic layer's, so that
    /// sessions it stores and the machines agree).
    pub fn new(logic: Arc<L>, proto: Arc<ServerConfig>, cfg: &Validated) -> Arc<Self> {
        let l = &cfg.settings.limits;
        let workers = match l.rsa_workers {
            // Two per core: RSA threads are preempted like any other, so the
            // async workers keep their share, and the hand-off per handshake
            // does not leave cores idle.
            0 => 2 * std::thread::available_parallelism().map_or(2, usize::from),
            n => n,
        };
        tracing::info!(
            library = cfg.private_key.backend(),
            bits = cfg.private_key.size() * 8,
            workers,
            "RSA private-key operations"
        );
        let gw = Arc::new(Self {
            conns: ConnRegistry::default(),
            rate: IpRateLimit::new(l.handshakes_per_ip),
            per_ip: PerIp::new(l.max_connections_per_ip),
            rsa: RsaPool::new(cfg.private_key.clone(), workers, l.rsa_queue),
            settings: GatewaySettings::new(cfg, proto),
            logic,
        });
        watch_shutdown(&gw);
        gw
    }
}

/// Which kind of listener.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Tcp,
    Ws,
}

/// Accepts until shutdown. Over the connection limit, over the per-IP rate or
/// count, or out of file descriptors, new connections are refused and the
/// rest served.
pub async fn accept_loop<L: Logic>(
    listener: TcpListener,
    kind: Kind,
    tls: Option<TlsAcceptor>,
    gw: Arc<Gateway<L>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let logic = gw.logic.clone();
    let max = gw.settings.max_connections;
    let mut last_warn: Option<Instant> = None;
    let inherited = tune_listener(&listener, gw.settings.tcp_keepalive_secs);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            r = listener.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // EMFILE/ENFILE and friends: back off briefly, keep serving.
                metrics::counter!("mpush_accept_errors_total").increment(1);
                if last_warn.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) {
                    warn!(error = %e, "accept failed; refusing new connections for a moment");
                    last_warn = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        if logic.connections() >= max {
            metrics::counter!("mpush_connections_refused_total", "reason" => "max_connections")
                .increment(1);
            drop(stream);
            continue;
        }
        // Behind a trusted proxy, a WebSocket client's own address is known
        // only from the upgrade's headers: its per-IP checks happen there.
        let behind_proxy = matches!(kind, Kind::Ws) && gw.settings.proxies.trusts(peer.ip());
        let slot = if behind_proxy {
            None
        } else {
            let Some(slot) = admit(&gw, peer.ip()) else {
                drop(stream);
                continue;
            };
            Some(slot)
        };
        let conn_id = logic.opened();
        if !inherited {
            tune(&stream, gw.settings.tcp_keepalive_secs);
        }
        let gw = gw.clone();
        match (kind, tls.clone()) {
            (Kind::Tcp, None) => {
                let Some(slot) = slot else { continue };
                tokio::spawn(conn::serve(Tcp(stream), gw, conn_id, peer, slot, false));
            }
            (Kind::Ws, None) => {
                tokio::spawn(upgrade(stream, false, gw, conn_id, peer, slot));
            }
            (kind, Some(acceptor)) => {
                tokio::spawn(tls_then(acceptor, kind, stream, gw, conn_id, peer, slot));
            }
        }
    }
}

/// The TLS handshake (within the handshake deadline), then the connection.
/// The per-address checks: open connections, then the connection rate.
fn admit<L>(gw: &Gateway<L>, ip: std::net::IpAddr) -> Option<IpSlot> {
    let Some(slot) = gw.per_ip.acquire(ip) else {
        metrics::counter!("mpush_connections_refused_total", "reason" => "per_ip").increment(1);
        return None;
    };
    if !gw.rate.allow(ip) {
        metrics::counter!("mpush_connections_refused_total", "reason" => "rate").increment(1);
        return None;
    }
    Some(slot)
}

async fn tls_then<L: Logic>(
    acceptor: TlsAcceptor,
    kind: Kind,
    stream: TcpStream,
    gw: Arc<Gateway<L>>,
    conn_id: u64,
    peer: SocketAddr,
    slot: Option<IpSlot>,
) {
    let limit = gw.settings.handshake_timeout;
    let tls = match tokio::time::timeout(limit, acceptor.accept(stream)).await {
        // Counted by the acceptor (`mpush_tls_handshakes_total`, `_suites_total`).
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            metrics::counter!("mpush_tls_handshake_errors_total").increment(1);
            debug!(%peer, error = %e, "TLS handshake failed");
            gw.logic.closed();
            return;
        }
        Err(_) => {
            metrics::counter!("mpush_tls_handshake_errors_total").increment(1);
            gw.logic.closed();
            return;
        }
    };
    match (kind, slot) {
        (Kind::Tcp, Some(slot)) => {
            // A task of its own: the idle connection does not carry this
            // task's state (its arguments live as long as it does).
            tokio::spawn(conn::serve(
                TlsTcp(Box::new(tls)),
                gw,
                conn_id,
                peer,
                slot,
                true,
            ));
        }
        (Kind::Tcp, None) => gw.logic.closed(),
        (Kind::Ws, slot) => upgrade(tls, true, gw, conn_id, peer, slot).await,
    }
}

/// No Nagle delay; TCP keepalive so a peer that vanished without a FIN (a
/// phone that lost its network) is found even while the protocol is idle.
fn tune(stream: &TcpStream, keepalive_secs: u64) {
    let _ = tune_socket(socket2::SockRef::from(stream), keepalive_secs);
}

fn tune_socket(s: socket2::SockRef<'_>, keepalive_secs: u64) -> std::io::Result<()> {
    s.set_tcp_nodelay(true)?;
    if keepalive_secs > 0 {
        let ka = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(keepalive_secs))
            .with_interval(Duration::from_secs(keepalive_secs.div_ceil(3).max(1)));
        s.set_tcp_keepalive(&ka)?;
    }
    Ok(())
}

/// Sets [`tune`]'s options once on the listener, where its accepted sockets
/// inherit them: Linux makes each accepted socket a copy of the listening
/// one (TCP_NODELAY, SO_KEEPALIVE and its idle time and interval included;
/// `accepted_sockets_inherit_the_listener_s_options` checks it). That spares
/// four system calls per connection, about 5 % of a fast connect's CPU.
/// False (tune each connection) elsewhere, or when the listener refused one.
fn tune_listener(listener: &TcpListener, keepalive_secs: u64) -> bool {
    cfg!(target_os = "linux")
        && tune_socket(socket2::SockRef::from(listener), keepalive_secs).is_ok()
}

/// The WebSocket upgrade, then the connection on a task of its own: an idle
/// connection carries none of the upgrade's state (its buffers, the
/// forwarding headers, this task's arguments).
/// `tls`: the stream is our own TLS listener's (ADR 0005's secure transport).
async fn upgrade<S, L: Logic>(
    stream: S,
    tls: bool,
    gw: Arc<Gateway<L>>,
    conn_id: u64,
    peer: SocketAddr,
    slot: Option<IpSlot>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let upgraded = Box::pin(ws_handshake(stream, &gw, peer, slot)).await;
    match upgraded {
        Some((ws, peer, slot, forwarded_tls)) => {
            tokio::spawn(conn::serve(
                Ws(ws),
                gw,
                conn_id,
                peer,
                slot,
                tls || forwarded_tls,
            ));
        }
        None => gw.logic.closed(),
    }
}

// tungstenite's upgrade callback returns its own (large) error response type.
#[allow(clippy::result_large_err)]
async fn ws_handshake<S, L>(
    stream: S,
    gw: &Gateway<L>,
    peer: SocketAddr,
    slot: Option<IpSlot>,
) -> Option<(WebSocketStream<S>, SocketAddr, IpSlot, bool)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let l = &gw.settings;
    let config = WebSocketConfig::default()
        .read_buffer_size(l.ws_read_buffer)
        .write_buffer_size(0)
        .max_message_size(Some(l.max_packet_size + 64))
        .max_frame_size(Some(l.max_packet_size + 64));
    // The upgrade's forwarding headers (believed from trusted proxies only).
    let mut seen = crate::forwarded::ForwardingHeaders::default();
    let callback = |req: &tokio_tungstenite::tungstenite::handshake::server::Request, resp| {
        seen = crate::forwarded::ForwardingHeaders::from_headers(req.headers());
        Ok(resp)
    };
    let handshake = tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config));
    let ws = match tokio::time::timeout(Duration::from_secs(10), handshake).await {
        Ok(Ok(ws)) => ws,
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "websocket upgrade failed");
            return None;
        }
        Err(_) => return None,
    };
    match slot {
        // `net.dev_loopback_transport`: a plain connection from this machine
        // may use the transport-secured profile (development only; the
        // setting needs a loopback listener and no proxies).
        Some(s) => {
            // A request that carries forwarding headers came through a
            // proxy on this machine: its client is not local.
            let dev = gw.settings.dev_loopback_transport && peer.ip().is_loopback() && !seen.any();
            Some((ws, peer, s, dev))
        }
        // Trusted proxies are configured: the client's address, and whether
        // its own connection was TLS, come from them.
        None => {
            let f = gw.settings.proxies.resolve(peer.ip(), &seen);
            // An unknown client (malformed forwarding) counts as `::`.
            let s = admit(gw, f.ip())?;
            Some((ws, SocketAddr::new(f.ip(), 0), s, f.secure))
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod listener_options {
    use super::*;

    /// A socket accepted (on loopback) from a listener [`tune_listener`]
    /// set up with `keepalive_secs`, and the client's end to keep it open.
    async fn accepted_from_tuned_listener(keepalive_secs: u64) -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        assert!(tune_listener(&listener, keepalive_secs));
        let addr = listener.local_addr().expect("addr");
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (accepted.expect("accept").0, client.expect("connect"))
    }

    /// What [`tune_listener`] relies on: a socket accepted from a tuned
    /// listener (real sockets, on loopback) has the listener's TCP_NODELAY,
    /// SO_KEEPALIVE and keepalive times without being tuned itself.
    #[tokio::test]
    async fn accepted_sockets_inherit_the_listener_s_options() {
        let (stream, _client) = accepted_from_tuned_listener(90).await;
        let s = socket2::SockRef::from(&stream);
        assert!(s.tcp_nodelay().expect("TCP_NODELAY"));
        assert!(s.keepalive().expect("SO_KEEPALIVE"));
        assert_eq!(
            s.tcp_keepalive_time().expect("idle"),
            Duration::from_secs(90)
        );
        assert_eq!(
            s.tcp_keepalive_interval().expect("interval"),
            Duration::from_secs(30)
        );

        // Without keepalive configured: no Nagle delay still, no keepalive.
        let (stream, _client) = accepted_from_tuned_listener(0).await;
        let s = socket2::SockRef::from(&stream);
        assert!(s.tcp_nodelay().expect("TCP_NODELAY"));
        assert!(!s.keepalive().expect("SO_KEEPALIVE"));
    }
}
