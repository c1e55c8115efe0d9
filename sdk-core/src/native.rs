//! The tokio driver (feature `tokio`): runs a [`Session`] over TCP (`host:port`)
//! or WebSocket (`ws://`, `wss://` with rustls), persists the resume ticket,
//! and exposes a small async API.
//!
//! One file: the driver loop, its two transports and the handle the app
//! holds are one task's parts, read together; the session it drives is the
//! `session` folder.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use mpush_protocol::Instant;
use mpush_protocol::session::AckMode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::session::{
    Action, Session, SessionConfig, SessionError, SessionEvent, SessionState, is_tls_address,
    parse_server_list,
};

/// Where the resume ticket persists: a file (`FileTicketStore`), or what
/// the platform offers (SharedPreferences, Keychain) through the bindings.
/// A failure of either becomes a `SessionEvent::Error` (code `storage`).
pub trait TicketStore: Send + Sync + 'static {
    /// The saved ticket, if any.
    fn load(&self) -> Result<Option<String>, StorageError>;
    /// Saves a ticket; empty means forget the saved one.
    fn save(&self, ticket: &str) -> Result<(), StorageError>;
}

/// A ticket store's failure, in the store's own words (a file's error, or
/// what the platform's store said): the `storage` error's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StorageError(pub String);

/// Why a connection, a read or a write, or an allocator request failed. Its
/// words are the reason the session's state (and so the app) shows.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// The socket: connect, read or write.
    #[error("{0}")]
    Io(Arc<std::io::Error>),
    #[error("{0}")]
    WebSocket(Arc<tokio_tungstenite::tungstenite::Error>),
    /// The TLS handshake.
    #[error("TLS: {0}")]
    Tls(Arc<std::io::Error>),
    /// TLS could not be set up (the provider's protocol versions).
    #[error("{0}")]
    TlsConfig(#[from] tokio_rustls::rustls::Error),
    #[error("pinned certificate: {0}")]
    PinnedCertificate(String),
    /// An address this driver cannot use as written.
    #[error("{address}: {reason}")]
    Address { address: String, reason: String },
    /// The allocator request.
    #[error("{0}")]
    Http(Arc<reqwest::Error>),
    /// The peer took no bytes within the send timeout.
    #[error("write timed out")]
    WriteTimeout,
}

impl From<std::io::Error> for TransportError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(Arc::new(e))
    }
}

impl From<tokio_tungstenite::tungstenite::Error> for TransportError {
    fn from(e: tokio_tungstenite::tungstenite::Error) -> Self {
        Self::WebSocket(Arc::new(e))
    }
}

impl From<reqwest::Error> for TransportError {
    fn from(e: reqwest::Error) -> Self {
        Self::Http(Arc::new(e))
    }
}

/// Keeps the resume ticket in a file (one line), like mpush's `token.dat`.
#[derive(Debug, Clone)]
pub struct FileTicketStore {
    pub path: PathBuf,
}

impl FileTicketStore {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The saved ticket; no file is `None`, an unreadable one an error.
    pub fn load(&self) -> std::io::Result<Option<String>> {
        match std::fs::read_to_string(&self.path) {
            Ok(s) => Ok(Some(s.trim().to_owned()).filter(|s| !s.is_empty())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Saves a ticket; an empty one deletes the file.
    pub fn save(&self, ticket: &str) -> std::io::Result<()> {
        if ticket.is_empty() {
            match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            std::fs::write(&self.path, format!("{ticket}\n"))
        }
    }
}

impl TicketStore for FileTicketStore {
    fn load(&self) -> Result<Option<String>, StorageError> {
        FileTicketStore::load(self)
            .map_err(|e| StorageError(format!("{}: {e}", self.path.display())))
    }

    fn save(&self, ticket: &str) -> Result<(), StorageError> {
        FileTicketStore::save(self, ticket)
            .map_err(|e| StorageError(format!("{}: {e}", self.path.display())))
    }
}

/// What `Client::connect` needs.
#[derive(Clone)]
pub struct ClientOptions {
    pub session: SessionConfig,
    /// Where to keep the resume ticket; `None`: in memory only.
    pub ticket_store: Option<Arc<dyn TicketStore>>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("session", &self.session)
            .field("ticket_store", &self.ticket_store.is_some())
            .finish()
    }
}

/// A caller's wait for a request's `Settled` event.
type Reply = oneshot::Sender<Result<(), SessionError>>;

enum Cmd {
    Bind(String, String, String, Reply),
    Unbind(Reply),
    Ack(u64, Option<Reply>),
    Push(Vec<u8>, AckMode, Reply),
    Network(bool),
    Foreground(bool),
}

/// How long one write may wait for a peer that does not read.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Commands waiting for the driver; more wait in `send().await` (the
/// async ones) or fail with `queue_full` (the others).
pub const COMMAND_CAPACITY: usize = 256;
/// Events the app has not read yet. Once this many wait, the driver stops
/// reading the socket (the server's flow control takes over) until the app
/// catches up; commands, timers and heartbeats go on.
pub const EVENT_CAPACITY: usize = 1024;

/// A connected (or reconnecting) client. Dropping it closes the session.
/// Its commands are those of [`ClientHandle`] (through `Deref`).
pub struct Client {
    handle: ClientHandle,
    events: mpsc::Receiver<SessionEvent>,
}

/// The commands of a [`Client`], cloneable and usable from any task while
/// one owner reads the events.
#[derive(Clone)]
pub struct ClientHandle {
    cmds: mpsc::Sender<Cmd>,
    /// `close()` does not queue behind commands or a connect attempt.
    close: Arc<watch::Sender<bool>>,
    state: watch::Receiver<SessionState>,
    /// Closed (its sender dropped) when the driver task ends.
    done: watch::Receiver<()>,
}

impl Client {
    /// Checks the options (`SessionConfig::validate`), then starts the
    /// session in a background task; it connects and reconnects by itself.
    /// Watch `next_event` for `Connected`, or await `bind`.
    pub fn connect(options: ClientOptions) -> Result<Self, SessionError> {
        options.session.validate()?;
        let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_CAPACITY);
        let (ev_tx, ev_rx) = mpsc::channel(EVENT_CAPACITY);
        let (close_tx, close_rx) = watch::channel(false);
        let (state_tx, state_rx) = watch::channel(SessionState::Connecting {
            address: String::new(),
        });
        let (done_tx, done_rx) = watch::channel(());
        tokio::spawn(async move {
            run(options, cmd_rx, close_rx, state_tx, ev_tx).await;
            drop(done_tx);
        });
        Ok(Self {
            handle: ClientHandle {
                cmds: cmd_tx,
                close: Arc::new(close_tx),
                state: state_rx,
                done: done_rx,
            },
            events: ev_rx,
        })
    }

    /// The next event; `None` once the session has stopped and every event was read.
    pub async fn next_event(&mut self) -> Option<SessionEvent> {
        self.events.recv().await
    }

    /// A handle for commands from elsewhere (the client still closes when dropped).
    pub fn handle(&self) -> ClientHandle {
        self.handle.clone()
    }
}

impl std::ops::Deref for Client {
    type Target = ClientHandle;

    fn deref(&self) -> &ClientHandle {
        &self.handle
    }
}

impl ClientHandle {
    /// Binds a user (re-bound after every reconnect). Resolves once the
    /// server accepted it; `BindFailed` when it refused, or a newer bind or
    /// an unbind replaced it. Offline, it waits for the connection.
    pub async fn bind(&self, user: &str, tags: &str, token: &str) -> Result<(), SessionError> {
        self.request(|tx| Cmd::Bind(user.into(), tags.into(), token.into(), tx))
            .await
    }

    /// Forgets the user (no more re-binds); resolves once the server was told.
    pub async fn unbind(&self) -> Result<(), SessionError> {
        self.request(Cmd::Unbind).await
    }

    pub async fn ack(&self, ack_id: u64) -> Result<(), SessionError> {
        self.request(|tx| Cmd::Ack(ack_id, Some(tx))).await
    }

    /// Acknowledges without waiting (safe to call from an event callback
    /// that must not block); `QueueFull` if the command queue is full.
    pub fn ack_nowait(&self, ack_id: u64) -> Result<(), SessionError> {
        self.try_send(Cmd::Ack(ack_id, None))
    }

    /// Sends a message up (queued while offline, and kept across
    /// reconnects until the server answers). With an ACK mode, resolves once
    /// the server accepted it; fails with `SessionError::RetryLater` when it
    /// could not take it now (`error.retryable()`), `PushRejected` when it
    /// never will, `QueueFull` when too many are waiting. Without, resolves
    /// once it is written.
    pub async fn push(&self, content: &[u8], ack_mode: AckMode) -> Result<(), SessionError> {
        self.request(|tx| Cmd::Push(content.to_vec(), ack_mode, tx))
            .await
    }

    /// The network is back: retry now.
    pub fn network_available(&self) -> Result<(), SessionError> {
        self.try_send(Cmd::Network(true))
    }

    /// The network came or went: back, retry now; gone, no attempts until back.
    pub fn network_changed(&self, available: bool) -> Result<(), SessionError> {
        self.try_send(Cmd::Network(available))
    }

    /// The app came to the foreground (retry now) or went to the background
    /// (no reconnect attempts until it is back; a live connection stays).
    pub fn app_state(&self, foreground: bool) -> Result<(), SessionError> {
        self.try_send(Cmd::Foreground(foreground))
    }

    /// Where the session is now (`StateChanged` events tell each change).
    pub fn state(&self) -> SessionState {
        self.state.borrow().clone()
    }

    /// Resolves once the session has stopped (after `close()`, or refused
    /// for good by the server) and its driver has handed over its last
    /// events (or has no reader left).
    pub async fn stopped(&self) {
        let mut done = self.done.clone();
        while done.changed().await.is_ok() {}
    }

    /// Stops for good, at once: a connect attempt in progress is dropped and
    /// every open request fails with `Stopped`.
    pub fn close(&self) {
        self.close.send_replace(true);
    }

    async fn request(&self, cmd: impl FnOnce(Reply) -> Cmd) -> Result<(), SessionError> {
        let (tx, rx) = oneshot::channel();
        self.cmds
            .send(cmd(tx))
            .await
            .map_err(|_| SessionError::Stopped)?;
        rx.await.unwrap_or(Err(SessionError::Stopped))
    }

    fn try_send(&self, c: Cmd) -> Result<(), SessionError> {
        self.cmds.try_send(c).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => SessionError::QueueFull(COMMAND_CAPACITY),
            mpsc::error::TrySendError::Closed(_) => SessionError::Stopped,
        })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.handle.close();
    }
}

enum Conn {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    Ws(Box<WebSocketStream<MaybeTlsStream<TcpStream>>>),
}

/// One trust store for every TLS connection of a client (`tls://`, `wss://`):
/// the webpki roots, or only the pinned certificate.
fn tls_config(
    pinned_pem: Option<&str>,
) -> Result<Arc<tokio_rustls::rustls::ClientConfig>, TransportError> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match pinned_pem {
        Some(pem) => {
            for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let c = c.map_err(|e| TransportError::PinnedCertificate(e.to_string()))?;
                roots
                    .add(c)
                    .map_err(|e| TransportError::PinnedCertificate(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(TransportError::PinnedCertificate(
                    "no certificate in the PEM".into(),
                ));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(tls_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// rustls' suites with AES-128-GCM first, as browsers order them (rustls
/// puts AES-256-GCM first). A server that follows the client's order
/// (rustls' default, nginx's) then runs its key schedule on SHA-256, which
/// CPUs accelerate (SHA-NI), instead of SHA-384, which runs in plain code
/// on CPUs without SHA-512 instructions: about a tenth less server CPU per
/// TLS connect (BENCHMARKS.md). Our server chooses AES-128-GCM itself.
/// Both are TLS 1.3's standard suites; AES-128 is the one every TLS 1.3
/// stack must implement. The bench's load clients order theirs the same.
fn tls_provider() -> tokio_rustls::rustls::crypto::CryptoProvider {
    use tokio_rustls::rustls::CipherSuite;
    let mut p = tokio_rustls::rustls::crypto::aws_lc_rs::default_provider();
    p.cipher_suites.sort_by_key(|s| {
        !matches!(
            s.suite(),
            CipherSuite::TLS13_AES_128_GCM_SHA256
                | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    });
    p
}

impl Conn {
    async fn open(
        address: &str,
        tls: &Arc<tokio_rustls::rustls::ClientConfig>,
    ) -> Result<Self, TransportError> {
        if address.starts_with("ws://") || address.starts_with("wss://") {
            let (ws, _) = tokio_tungstenite::connect_async_tls_with_config(
                address,
                None,
                false,
                Some(tokio_tungstenite::Connector::Rustls(tls.clone())),
            )
            .await?;
            Ok(Self::Ws(Box::new(ws)))
        } else if let Some(hostport) = address.strip_prefix("tls://") {
            let host = hostport
                .rsplit_once(':')
                .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
                .ok_or_else(|| TransportError::Address {
                    address: address.to_owned(),
                    reason: "tls://host:port".into(),
                })?;
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| TransportError::Address {
                    address: address.to_owned(),
                    reason: e.to_string(),
                })?;
            let s = TcpStream::connect(hostport).await?;
            let _ = s.set_nodelay(true);
            let s = tokio_rustls::TlsConnector::from(tls.clone())
                .connect(name, s)
                .await
                .map_err(|e| TransportError::Tls(Arc::new(e)))?;
            Ok(Self::Tls(Box::new(s)))
        } else {
            let s = TcpStream::connect(address).await?;
            let _ = s.set_nodelay(true);
            Ok(Self::Tcp(s))
        }
    }

    async fn send(&mut self, b: Bytes) -> Result<(), TransportError> {
        match self {
            Self::Tcp(s) => Ok(s.write_all(&b).await?),
            Self::Tls(s) => {
                s.write_all(&b).await?;
                Ok(s.flush().await?)
            }
            Self::Ws(ws) => Ok(ws.send(WsMessage::Binary(b)).await?),
        }
    }

    /// Cancel-safe: `Ok(None)` is a clean end of stream.
    async fn recv(&mut self, buf: &mut [u8]) -> Result<Option<Bytes>, TransportError> {
        match self {
            Self::Tcp(s) => match s.read(buf).await? {
                0 => Ok(None),
                n => Ok(Some(Bytes::copy_from_slice(&buf[..n]))),
            },
            Self::Tls(s) => match s.read(buf).await? {
                0 => Ok(None),
                n => Ok(Some(Bytes::copy_from_slice(&buf[..n]))),
            },
            Self::Ws(ws) => loop {
                match ws.next().await {
                    None | Some(Ok(WsMessage::Close(_))) => return Ok(None),
                    Some(Ok(WsMessage::Binary(b))) => return Ok(Some(b)),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e.into()),
                }
            },
        }
    }

    async fn close(self) {
        match self {
            Self::Tcp(mut s) => {
                let _ = s.shutdown().await;
            }
            Self::Tls(mut s) => {
                let _ = s.shutdown().await;
            }
            Self::Ws(mut ws) => {
                let _ = WebSocketStream::close(&mut ws, None).await;
            }
        }
    }
}

/// The allocator's list, over the same trust store as the connections.
async fn fetch_servers(
    url: &str,
    tls: Option<&Arc<tokio_rustls::rustls::ClientConfig>>,
) -> Result<Vec<String>, TransportError> {
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(3));
    if let Some(t) = tls {
        builder = builder.use_preconfigured_tls((**t).clone());
    }
    let client = builder.build()?;
    let text = client.get(url).send().await?.text().await?;
    Ok(parse_server_list(&text))
}

fn seed() -> [u8; 32] {
    let mut s = [0u8; 32];
    getrandom::fill(&mut s).expect("OS random number generator");
    s
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(0))
        .unwrap_or(0)
}

async fn sleep_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}

type Pending<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, TransportError>> + Send>>;

/// Polls an optional future: pending while there is none.
async fn poll_opt<T>(f: &mut Option<Pending<T>>) -> Result<T, TransportError> {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// A command's request id waits for its `Settled` (or fails the caller now).
fn wait_for(
    waiters: &mut std::collections::HashMap<u64, Reply>,
    request: Result<u64, SessionError>,
    tx: Reply,
) {
    match request {
        Ok(r) => {
            waiters.insert(r, tx);
        }
        Err(e) => {
            let _ = tx.send(Err(e));
        }
    }
}

/// Closes a connection in the background (a close handshake must not hold
/// up the session), bounded in time.
fn close_later(c: Conn) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(2), c.close()).await;
    });
}

async fn run(
    options: ClientOptions,
    mut cmds: mpsc::Receiver<Cmd>,
    mut close: watch::Receiver<bool>,
    state: watch::Sender<SessionState>,
    events: mpsc::Sender<SessionEvent>,
) {
    // Events the app has not taken yet (see EVENT_CAPACITY).
    let mut backlog: std::collections::VecDeque<SessionEvent> = std::collections::VecDeque::new();
    let storage_error = |e: StorageError| SessionEvent::Error {
        error: SessionError::Storage(e.0),
    };
    let ticket = match options.ticket_store.as_ref().map(|s| s.load()) {
        Some(Ok(t)) => t,
        Some(Err(e)) => {
            backlog.push_back(storage_error(e));
            None
        }
        None => None,
    };
    // A bad pinned certificate fails every TLS connect (and says why); plain
    // addresses still work.
    let tls = tls_config(options.session.tls_pinned_cert_pem.as_deref());
    let mut session = Session::new(
        options.session,
        ticket.as_deref(),
        seed(),
        Instant::now(),
        unix_ms(),
    );
    let mut conn: Option<Conn> = None;
    // The connect attempt and the allocator request run beside commands:
    // a `close()` (or anything else) does not wait for them.
    let mut opening: Option<Pending<Conn>> = None;
    let mut fetching: Option<Pending<Vec<String>>> = None;
    let mut buf = vec![0u8; 16 * 1024];
    // Callers waiting for their request's `Settled`, by request id.
    let mut waiters: std::collections::HashMap<u64, Reply> = std::collections::HashMap::new();
    loop {
        while let Some(a) = session.poll_action() {
            match a {
                Action::Open { address } => {
                    if let Some(c) = conn.take() {
                        close_later(c);
                    }
                    let tls = tls.clone();
                    // The session's own deadline (connect_timeout) ends a
                    // slow attempt with `Action::Close`.
                    opening = Some(Box::pin(async move {
                        match &tls {
                            Ok(t) => Conn::open(&address, t).await,
                            Err(e) if is_tls_address(&address) => Err(e.clone()),
                            Err(_) => Conn::open(&address, &tls_config(None)?).await,
                        }
                    }));
                }
                Action::Send(b) => {
                    // A peer that stops reading must not hold the driver (and
                    // a `close()`) for longer than this.
                    if let Some(c) = &mut conn {
                        let sent = tokio::time::timeout(SEND_TIMEOUT, c.send(b)).await;
                        if let Err(e) = sent.unwrap_or(Err(TransportError::WriteTimeout)) {
                            conn = None;
                            session.handle_closed(&e.to_string(), Instant::now());
                        }
                    }
                }
                Action::Close => {
                    opening = None;
                    if let Some(c) = conn.take() {
                        close_later(c);
                    }
                }
                Action::FetchServers { url } => {
                    let tls = tls.clone();
                    fetching = Some(Box::pin(async move {
                        match &tls {
                            Ok(t) => fetch_servers(&url, Some(t)).await,
                            Err(e) if url.starts_with("https://") => Err(e.clone()),
                            Err(_) => fetch_servers(&url, None).await,
                        }
                    }));
                }
            }
        }
        let mut stopped = false;
        while let Some(e) = session.poll_event() {
            match &e {
                SessionEvent::TicketUpdated { ticket } => {
                    if let Some(store) = &options.ticket_store
                        && let Err(e) = store.save(ticket)
                    {
                        backlog.push_back(storage_error(e));
                    }
                }
                SessionEvent::Settled { request, result } => {
                    if let Some(tx) = waiters.remove(request) {
                        let _ = tx.send(result.clone());
                    }
                }
                SessionEvent::StateChanged(s) => {
                    state.send_replace(s.clone());
                }
                SessionEvent::Stopped { .. } => stopped = true,
                _ => {}
            }
            backlog.push_back(e);
        }
        if stopped {
            for (_, tx) in waiters.drain() {
                let _ = tx.send(Err(SessionError::Stopped));
            }
            if let Some(c) = conn.take() {
                let _ = tokio::time::timeout(Duration::from_secs(2), c.close()).await;
            }
            // The last events (`Stopped` among them) go to a reader that is
            // still there; the task ends when they are read or it is gone.
            for e in backlog {
                if events.send(e).await.is_err() {
                    break;
                }
            }
            return;
        }
        let reading = conn.is_some() && backlog.len() < EVENT_CAPACITY;
        tokio::select! {
            biased;
            _ = close.wait_for(|c| *c) => session.close(),
            c = cmds.recv() => {
                let now = Instant::now();
                match c {
                    Some(Cmd::Bind(u, t, k, tx)) => wait_for(&mut waiters, session.bind(&u, &t, &k, now), tx),
                    Some(Cmd::Unbind(tx)) => wait_for(&mut waiters, session.unbind(now), tx),
                    Some(Cmd::Ack(id, tx)) => {
                        let r = session.ack(id, now);
                        if let Some(tx) = tx { let _ = tx.send(r); }
                    }
                    Some(Cmd::Push(b, m, tx)) => wait_for(&mut waiters, session.push(&b, m, now), tx),
                    Some(Cmd::Network(true)) => session.network_available(now),
                    Some(Cmd::Network(false)) => session.network_lost(),
                    Some(Cmd::Foreground(true)) => session.foreground(now),
                    Some(Cmd::Foreground(false)) => session.background(),
                    None => session.close(),
                }
            }
            permit = events.reserve(), if !backlog.is_empty() => match permit {
                Ok(p) => { if let Some(e) = backlog.pop_front() { p.send(e); } }
                // Nobody reads events any more: keep serving commands.
                Err(_) => backlog.clear(),
            },
            r = poll_opt(&mut opening) => {
                opening = None;
                match r {
                    Ok(c) => { conn = Some(c); session.handle_opened(Instant::now()); }
                    Err(e) => session.handle_open_failed(&e.to_string(), Instant::now()),
                }
            }
            r = poll_opt(&mut fetching) => {
                fetching = None;
                match r {
                    Ok(list) => session.handle_servers(list, Instant::now()),
                    Err(e) => session.handle_servers_failed(&e.to_string(), Instant::now()),
                }
            }
            r = async {
                match &mut conn {
                    Some(c) => c.recv(&mut buf).await,
                    None => std::future::pending().await,
                }
            }, if reading => match r {
                Ok(Some(b)) => session.handle_input(&b, Instant::now()),
                Ok(None) => { conn = None; session.handle_closed("closed by the server", Instant::now()); }
                Err(e) => { conn = None; session.handle_closed(&e.to_string(), Instant::now()); }
            },
            _ = sleep_opt(session.poll_timeout()) => session.handle_timeout(Instant::now()),
        }
    }
}
