//! A load process: holds up to ~19,990 client connections (this machine's
//! per-process file limit) from the given loopback source addresses, each a
//! real protocol client (RSA handshake or fast connect, bind, dedup, ACKs),
//! or a raw client of the ideal server. Driven over stdin/stdout in JSON lines
//! by `run`.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Serializer, V2Serializer};
use mpush_protocol::Instant;
use mpush_protocol::client::{ClientConfig, ClientConnection, ClientEvent};
use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::dedup::DedupWindow;
use mpush_protocol::session::{DeviceInfo, ResumeTicket};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Transport {
    Tcp,
    Ws,
    /// The ideal server's raw framing (4-byte length + payload).
    Ideal,
}

#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// `host:port` of the gateway (or the ideal server).
    #[arg(long)]
    pub target: String,
    #[arg(long, value_enum)]
    pub transport: Transport,
    /// Speak only the legacy mpush 0.8.1 profile.
    #[arg(long)]
    pub legacy: bool,
    #[arg(long)]
    pub conns: usize,
    /// Users are `u<first>` .. `u<first + conns - 1>`.
    #[arg(long, default_value_t = 0)]
    pub first: usize,
    /// Source addresses, comma-separated (about 28k ports each).
    #[arg(long, value_delimiter = ',')]
    pub src: Vec<IpAddr>,
    /// Handshakes in flight at once.
    #[arg(long, default_value_t = 128)]
    pub concurrency: usize,
    /// Connect over TLS, trusting this PEM certificate (name `localhost`);
    /// protocol clients then speak the transport-secured profile, and a
    /// reconnect resumes the TLS session.
    #[arg(long)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Reconnect storm clients: a lost connection (server gone, redirect,
    /// refused connect) is not a failure; the client comes back as the SDK
    /// does, with its backoff and jitter (or the redirect's delay) and its
    /// resume ticket. `bound_now` counts who is bound; the connect latency
    /// (attempt to bind) goes into the histogram.
    #[arg(long)]
    pub storm: bool,
    /// Bind again after every fast connect instead of asking the server to
    /// keep the binding (ADR 0008), as clients before it did.
    #[arg(long)]
    pub rebind: bool,
}

type ClientTls = tokio_rustls::client::TlsStream<TcpStream>;

/// A TLS client for one connection: the worker's configuration with a
/// session store of its own, as every real client has (a store shared by
/// all would keep a few tickets for the one server name).
fn tls_connector(args: &WorkerArgs) -> Result<Option<tokio_rustls::TlsConnector>> {
    use tokio_rustls::rustls;
    static BASE: std::sync::OnceLock<Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    if args.tls_ca.is_none() {
        return Ok(None);
    }
    let base = match BASE.get() {
        Some(b) => b.clone(),
        None => {
            let b = Arc::new(base_tls(args)?);
            BASE.get_or_init(|| b).clone()
        }
    };
    let mut cfg = (*base).clone();
    cfg.resumption = rustls::client::Resumption::in_memory_sessions(2);
    Ok(Some(tokio_rustls::TlsConnector::from(Arc::new(cfg))))
}

fn base_tls(args: &WorkerArgs) -> Result<tokio_rustls::rustls::ClientConfig> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::{CertificateDer, pem::PemObject};
    let ca = args.tls_ca.as_ref().context("no TLS certificate")?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).context("the TLS certificate")? {
        roots.add(c.context("the TLS certificate")?)?;
    }
    // The SDK's order (sdk-core's `tls_provider`): AES-128-GCM first, as
    // browsers send it, so the server and the ideal both run SHA-256.
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(cfg)
}

/// The timestamp the sender put at the start of a message: `T<unix nanos>;`.
pub fn stamp(len: usize) -> String {
    let ns = now_ns();
    let mut s = format!("T{ns};");
    while s.len() < len {
        s.push('x');
    }
    s
}

pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn latency_us(content: &[u8]) -> Option<u64> {
    let rest = content.strip_prefix(b"T")?;
    let end = rest.iter().position(|b| *b == b';')?;
    let ns: u64 = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    Some(now_ns().saturating_sub(ns) / 1000)
}

struct Shared {
    /// Storm clients bound right now.
    bound_now: std::sync::atomic::AtomicI64,
    /// Storm clients' connection losses and failed attempts.
    lost: AtomicU64,
    received: AtomicU64,
    bound: AtomicU64,
    failed: AtomicU64,
    resumed: AtomicU64,
    connected: AtomicU64,
    /// Protocol clients that dropped their connection on `disconnect` and
    /// wait for the next `reconnect`.
    dropped: AtomicU64,
    hist: Mutex<Histogram<u64>>,
    errors: Mutex<Vec<String>>,
}

impl Shared {
    fn record(&self, content: &[u8]) {
        self.received.fetch_add(1, Ordering::Relaxed);
        if let Some(us) = latency_us(content)
            && let Ok(mut h) = self.hist.lock()
        {
            let _ = h.record(us.max(1));
        }
    }

    fn fail(&self, e: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut v) = self.errors.lock()
            && v.len() < 5
        {
            v.push(e);
        }
    }
}

enum Io {
    Tcp(TcpStream),
    Ws(Box<WebSocketStream<MaybeTlsStream<TcpStream>>>),
    Tls(Box<ClientTls>),
    Wss(Box<WebSocketStream<ClientTls>>),
}

impl Io {
    async fn open(
        args: &WorkerArgs,
        src: IpAddr,
        tls: Option<&tokio_rustls::TlsConnector>,
    ) -> Result<Self> {
        let addr: SocketAddr = args.target.parse().context("target")?;
        let sock = TcpSocket::new_v4()?;
        sock.set_reuseaddr(true)?;
        // The source port is chosen at connect (by the 4-tuple), not at
        // bind: a bind to port 0 searches the address's whole bind table,
        // and with 19,000 sockets on one source address that search was
        // 40 % of the machine's CPU in a reconnect storm, taken from the
        // server under test. Real clients, each on its own device, pay none.
        #[cfg(target_os = "linux")]
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::IpBindAddressNoPort, &true)?;
        sock.bind(SocketAddr::new(src, 0))?;
        let s = sock.connect(addr).await?;
        s.set_nodelay(true)?;
        if let Some(tls) = tls {
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost")?;
            let t = tls.connect(name, s).await?;
            return match args.transport {
                Transport::Ws => {
                    let url = format!("wss://localhost:{}/", addr.port());
                    let (ws, _) = tokio_tungstenite::client_async(url, t).await?;
                    Ok(Self::Wss(Box::new(ws)))
                }
                _ => Ok(Self::Tls(Box::new(t))),
            };
        }
        match args.transport {
            Transport::Ws => {
                let url = format!("ws://{}/", args.target);
                let (ws, _) =
                    tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(s)).await?;
                Ok(Self::Ws(Box::new(ws)))
            }
            _ => Ok(Self::Tcp(s)),
        }
    }

    async fn send(&mut self, b: Bytes) -> Result<()> {
        match self {
            Self::Tcp(s) => s.write_all(&b).await?,
            Self::Ws(ws) => ws.send(WsMessage::Binary(b)).await?,
            Self::Tls(s) => {
                s.write_all(&b).await?;
                s.flush().await?;
            }
            Self::Wss(ws) => ws.send(WsMessage::Binary(b)).await?,
        }
        Ok(())
    }

    /// `None` at the end of the stream.
    async fn recv(&mut self, buf: &mut [u8]) -> Result<Option<Bytes>> {
        match self {
            Self::Tcp(s) => {
                let n = s.read(buf).await?;
                Ok((n > 0).then(|| Bytes::copy_from_slice(&buf[..n])))
            }
            Self::Tls(s) => {
                let n = s.read(buf).await?;
                Ok((n > 0).then(|| Bytes::copy_from_slice(&buf[..n])))
            }
            Self::Ws(ws) => ws_next(ws).await,
            Self::Wss(ws) => ws_next(ws).await,
        }
    }

    /// Raw bytes (the ideal server's framing) into `buf`; 0 at the end.
    async fn read_raw(&mut self, buf: &mut bytes::BytesMut) -> std::io::Result<usize> {
        match self {
            Self::Tcp(s) => s.read_buf(buf).await,
            Self::Tls(s) => s.read_buf(buf).await,
            _ => Ok(0),
        }
    }
}

async fn ws_next<S>(ws: &mut WebSocketStream<S>) -> Result<Option<Bytes>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match ws.next().await {
            None | Some(Ok(WsMessage::Close(_))) => return Ok(None),
            Some(Ok(WsMessage::Binary(b))) => return Ok(Some(b)),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e.into()),
        }
    }
}

/// Client `i`'s protocol configuration: its device, the profile the worker
/// speaks (the transport-secured one over TLS), `timeout` for the handshake
/// and the bind.
fn client_config(args: &WorkerArgs, i: usize, timeout: Duration) -> Arc<ClientConfig> {
    let device = DeviceInfo {
        device_id: format!("bench-{}", args.first + i),
        os_name: "android".into(),
        os_version: "14".into(),
        client_version: "bench".into(),
    };
    let mut cfg = ClientConfig::new(Arc::new(RsaPublic::mpush_default()), device);
    cfg.offer_v2 = !args.legacy;
    cfg.transport_secured = args.tls_ca.is_some();
    cfg.handshake_timeout = timeout;
    cfg.bind_timeout = timeout;
    cfg.keep_binding = !args.rebind;
    Arc::new(cfg)
}

/// A round of the protocol clients: its number, whether the clients stay
/// away after dropping their connection (`disconnect`) until the next round
/// (`reconnect`), and which clients it concerns: all, or with `part =
/// Some((k, parts))` those whose index is `k` modulo `parts` (`reconnect K
/// PARTS`, which brings back one part of the clients that are away; the
/// others go on holding or staying away).
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    n: u64,
    hold: bool,
    part: Option<(usize, usize)>,
}

impl Round {
    fn selects(&self, i: usize) -> bool {
        self.part.is_none_or(|(k, parts)| i % parts.max(1) == k)
    }
}

/// One protocol client: connect (fast connect when it has a ticket), bind,
/// count messages; on each `reconnect` round, drop the socket and come back;
/// on `disconnect`, drop it and wait for the next `reconnect`.
async fn protocol_client(
    i: usize,
    args: Arc<WorkerArgs>,
    shared: Arc<Shared>,
    gate: Arc<Semaphore>,
    mut rounds: watch::Receiver<Round>,
) {
    let src = args.src[(i / 20_000) % args.src.len().max(1)];
    let user = format!("u{}", args.first + i);
    let cfg = client_config(&args, i, Duration::from_secs(60));
    let mut ticket: Option<ResumeTicket> = None;
    let mut dedup = DedupWindow::new(64);
    let mut buf = vec![0u8; 4096];
    let mut round = rounds.borrow_and_update().n;
    let tls = match tls_connector(&args) {
        Ok(t) => t,
        Err(e) => return shared.fail(format!("TLS: {e}")),
    };
    loop {
        let mut permit = gate.clone().acquire_owned().await.ok();
        // Each reconnect round from another source address: the previous
        // round's ports are still in TIME_WAIT.
        let src = match src {
            IpAddr::V4(v4) if round > 0 => {
                let [a, _, c, d] = v4.octets();
                IpAddr::from([a, (round % 250) as u8 + 1, c, d])
            }
            other => other,
        };
        let mut io = match Io::open(&args, src, tls.as_ref()).await {
            Ok(io) => io,
            Err(e) => return shared.fail(format!("connect: {e}")),
        };
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&((args.first + i) as u64).to_le_bytes());
        seed[8..16].copy_from_slice(&round.to_le_bytes());
        let mut m = ClientConnection::new(
            cfg.clone(),
            seed,
            Instant::now(),
            (now_ns() / 1_000_000) as i64,
            ticket.clone(),
            std::mem::take(&mut dedup),
        );
        let next = 'conn: loop {
            while let Some(e) = m.poll_event() {
                match e {
                    ClientEvent::Connected {
                        ticket: t, resumed, ..
                    } => {
                        if let Some(t) = t {
                            ticket = Some(t);
                        }
                        shared.connected.fetch_add(1, Ordering::Relaxed);
                        if resumed {
                            shared.resumed.fetch_add(1, Ordering::Relaxed);
                        }
                        if !m.binding_kept() {
                            let _ = m.bind(&user, "", "", Instant::now());
                        } else if permit.take().is_some() {
                            // ADR 0008: resumed already bound.
                            shared.bound.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    ClientEvent::BindOk { .. } if permit.take().is_some() => {
                        shared.bound.fetch_add(1, Ordering::Relaxed);
                    }
                    ClientEvent::Message(msg) => shared.record(&msg.content),
                    ClientEvent::Closed { reason, .. } => {
                        shared.fail(format!("closed: {reason:?}"));
                        return;
                    }
                    _ => {}
                }
            }
            while let Some(b) = m.poll_transmit() {
                if let Err(e) = io.send(b).await {
                    shared.fail(format!("send: {e}"));
                    return;
                }
            }
            let deadline = m.poll_timeout();
            tokio::select! {
                r = io.recv(&mut buf) => match r {
                    Ok(Some(b)) => m.handle_input(&b, Instant::now()),
                    Ok(None) => { shared.fail("closed by the server".into()); return; }
                    Err(e) => { shared.fail(format!("recv: {e}")); return; }
                },
                _ = async {
                    match deadline {
                        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
                        None => std::future::pending().await,
                    }
                } => m.handle_timeout(Instant::now()),
                r = rounds.changed() => {
                    if r.is_err() { return; }
                    let r = *rounds.borrow_and_update();
                    if r.selects(i) {
                        break 'conn r;
                    }
                }
            }
        };
        dedup = m.take_dedup();
        drop(io);
        round = next.n;
        if next.hold {
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            loop {
                if rounds.changed().await.is_err() {
                    return;
                }
                let r = *rounds.borrow_and_update();
                if !r.hold && r.selects(i) {
                    round = r.n;
                    break;
                }
            }
        }
    }
}

/// A storm client: connects, binds, and whenever the connection is lost
/// comes back the way the SDK does (`sdk-core`'s session): after a loss or
/// a failed attempt, the SDK's backoff (1 s doubling to 60 s, ±20 % jitter,
/// reset once connected); after a redirect, its delay plus a random part of
/// its jitter, to its address. A fast connect with the resume ticket when it
/// has one. Never gives up.
async fn storm_client(i: usize, args: Arc<WorkerArgs>, shared: Arc<Shared>, gate: Arc<Semaphore>) {
    use mpush_protocol::backoff::{Backoff, BackoffConfig};
    let base = args.src[(i / 20_000) % args.src.len().max(1)];
    let user = format!("u{}", args.first + i);
    let cfg = client_config(&args, i, Duration::from_secs(30));
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&((args.first + i) as u64).to_le_bytes());
    let mut rng: mpush_protocol::crypto::Rng = rand_core::SeedableRng::from_seed(seed);
    let mut backoff = Backoff::new(BackoffConfig::default());
    let mut target = args.target.clone();
    let mut ticket: Option<ResumeTicket> = None;
    let mut dedup = DedupWindow::new(64);
    let mut buf = vec![0u8; 4096];
    let mut attempt: u64 = 0;
    loop {
        attempt += 1;
        // A fresh source address per attempt (earlier ports may be in
        // TIME_WAIT), and the clients spread over 64 of them: the kernel
        // picks a connect's source port by probing the address's ports in
        // use, and 19,000 connections from one address to one server port
        // made that probe a quarter of the machine's CPU.
        let src = match base {
            IpAddr::V4(v4) => {
                let [a, _, c, d] = v4.octets();
                let c = c.wrapping_add(((i % 64) as u8) << 2);
                IpAddr::from([a, (attempt % 250) as u8 + 1, c, d])
            }
            other => other,
        };
        let started = std::time::Instant::now();
        let permit = gate.clone().acquire_owned().await.ok();
        let a = WorkerArgs {
            target: target.clone(),
            ..(*args).clone()
        };
        let mut io = match Io::open(&a, src, None).await {
            Ok(io) => io,
            Err(_) => {
                drop(permit);
                shared.lost.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(backoff.next_delay(&mut rng)).await;
                continue;
            }
        };
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&((args.first + i) as u64).to_le_bytes());
        seed[8..16].copy_from_slice(&attempt.to_le_bytes());
        let mut m = ClientConnection::new(
            cfg.clone(),
            seed,
            Instant::now(),
            (now_ns() / 1_000_000) as i64,
            ticket.clone(),
            std::mem::take(&mut dedup),
        );
        let mut permit = permit;
        let mut bound = false;
        // What to wait before the next attempt, and where to go.
        let wait: Duration = 'conn: loop {
            while let Some(e) = m.poll_event() {
                let mut now_bound = false;
                match e {
                    ClientEvent::Connected { ticket: t, .. } => {
                        if let Some(t) = t {
                            ticket = Some(t);
                        }
                        backoff.reset();
                        // ADR 0008: a resume may come back already bound.
                        if m.binding_kept() {
                            now_bound = true;
                        } else {
                            let _ = m.bind(&user, "", "", Instant::now());
                        }
                    }
                    ClientEvent::BindOk { .. } => now_bound = true,
                    ClientEvent::Redirect(r) => {
                        if !r.address.is_empty() {
                            target = r.address.clone();
                        }
                        let jitter = if r.jitter_ms == 0 {
                            0
                        } else {
                            rand_core::Rng::next_u64(&mut rng) % u64::from(r.jitter_ms)
                        };
                        backoff.reset();
                        break 'conn Duration::from_millis(u64::from(r.retry_after_ms) + jitter);
                    }
                    ClientEvent::Closed { .. } => break 'conn backoff.next_delay(&mut rng),
                    _ => {}
                }
                if now_bound && !bound {
                    bound = true;
                    permit.take();
                    shared.bound.fetch_add(1, Ordering::Relaxed);
                    shared.bound_now.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut h) = shared.hist.lock() {
                        let _ = h.record((started.elapsed().as_micros() as u64).max(1));
                    }
                }
            }
            while let Some(b) = m.poll_transmit() {
                if io.send(b).await.is_err() {
                    break 'conn backoff.next_delay(&mut rng);
                }
            }
            let deadline = m.poll_timeout();
            tokio::select! {
                r = io.recv(&mut buf) => match r {
                    Ok(Some(b)) => m.handle_input(&b, Instant::now()),
                    Ok(None) | Err(_) => break 'conn backoff.next_delay(&mut rng),
                },
                _ = async {
                    match deadline {
                        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
                        None => std::future::pending().await,
                    }
                } => m.handle_timeout(Instant::now()),
            }
        };
        drop(permit);
        if bound {
            shared.bound_now.fetch_sub(1, Ordering::Relaxed);
        }
        shared.lost.fetch_add(1, Ordering::Relaxed);
        dedup = m.take_dedup();
        drop(io);
        tokio::time::sleep(wait).await;
    }
}

/// One client of the ideal server: count length-prefixed frames.
async fn ideal_client(i: usize, args: Arc<WorkerArgs>, shared: Arc<Shared>, gate: Arc<Semaphore>) {
    let src = args.src[(i / 20_000) % args.src.len().max(1)];
    let permit = gate.acquire_owned().await.ok();
    let tls = match tls_connector(&args) {
        Ok(t) => t,
        Err(e) => return shared.fail(format!("TLS: {e}")),
    };
    let mut io = match Io::open(&args, src, tls.as_ref()).await {
        Ok(io) => io,
        Err(e) => return shared.fail(format!("connect: {e}")),
    };
    shared.bound.fetch_add(1, Ordering::Relaxed);
    drop(permit);
    let mut buf = bytes::BytesMut::with_capacity(4096);
    loop {
        match io.read_raw(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        while buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() < 4 + len {
                break;
            }
            let frame = buf.split_to(4 + len);
            shared.record(&frame[4..]);
        }
    }
}

fn stats(shared: &Shared) -> serde_json::Value {
    let hist = shared
        .hist
        .lock()
        .map(|mut h| {
            let mut out = Vec::new();
            let _ = V2Serializer::new().serialize(&h, &mut out);
            h.reset();
            out
        })
        .unwrap_or_default();
    json!({
        "event": "stats",
        "received": shared.received.load(Ordering::Relaxed),
        "bound_now": shared.bound_now.load(Ordering::Relaxed),
        "lost": shared.lost.load(Ordering::Relaxed),
        "bound": shared.bound.load(Ordering::Relaxed),
        "connected": shared.connected.load(Ordering::Relaxed),
        "resumed": shared.resumed.load(Ordering::Relaxed),
        "dropped": shared.dropped.load(Ordering::Relaxed),
        "failed": shared.failed.load(Ordering::Relaxed),
        "errors": shared.errors.lock().map(|v| v.clone()).unwrap_or_default(),
        "hist": hist.iter().map(|b| format!("{b:02x}")).collect::<String>(),
    })
}

/// Runs the worker: opens the connections, then answers `stats`,
/// `reconnect`, `reconnect K PARTS`, `disconnect` and `quit` on stdin with
/// JSON lines on stdout. Send `reconnect K PARTS` one part at a time, once
/// the part before is back: a client away sees only the latest round.
pub async fn run(args: WorkerArgs) -> Result<()> {
    let args = Arc::new(args);
    let shared = Arc::new(Shared {
        bound_now: std::sync::atomic::AtomicI64::new(0),
        lost: AtomicU64::new(0),
        received: AtomicU64::new(0),
        bound: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        resumed: AtomicU64::new(0),
        connected: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        hist: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3)?),
        errors: Mutex::new(Vec::new()),
    });
    let gate = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let (round_tx, round_rx) = watch::channel(Round::default());
    for i in 0..args.conns {
        let (a, s, g) = (args.clone(), shared.clone(), gate.clone());
        if args.transport == Transport::Ideal {
            tokio::spawn(ideal_client(i, a, s, g));
        } else if args.storm {
            tokio::spawn(storm_client(i, a, s, g));
        } else {
            tokio::spawn(protocol_client(i, a, s, g, round_rx.clone()));
        }
    }
    let mut out = tokio::io::stdout();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let words: Vec<&str> = line.split_whitespace().collect();
        // A new round for every client, or for one part of them.
        let round = |hold: bool, part: Option<(usize, usize)>| {
            round_tx.send_modify(|r| {
                r.n += 1;
                r.hold = hold;
                r.part = part;
            });
        };
        let reply = match words[..] {
            ["stats"] => stats(&shared),
            ["reconnect"] => {
                round(false, None);
                json!({"event": "reconnecting"})
            }
            ["reconnect", k, parts] => match (k.parse::<usize>(), parts.parse::<usize>()) {
                (Ok(k), Ok(parts)) if k < parts => {
                    round(false, Some((k, parts)));
                    json!({"event": "reconnecting"})
                }
                _ => json!({"event": "error", "message": format!("bad part in {}", line.trim())}),
            },
            ["disconnect"] => {
                round(true, None);
                json!({"event": "disconnecting"})
            }
            ["quit"] => break,
            _ => json!({"event": "error", "message": format!("unknown command {}", line.trim())}),
        };
        out.write_all(format!("{reply}\n").as_bytes()).await?;
        out.flush().await?;
    }
    Ok(())
}
