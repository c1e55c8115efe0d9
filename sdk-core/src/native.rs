//! The tokio driver (feature `tokio`): runs a [`Session`] over TCP (`host:port`)
//! or WebSocket (`ws://`, `wss://` with rustls), persists the resume ticket,
//! and exposes a small async API.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use mpush_protocol::Instant;
use mpush_protocol::session::AckMode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::session::{
    Action, Session, SessionConfig, SessionError, SessionEvent, parse_server_list,
};

/// Where the resume ticket persists: a file (`FileTicketStore`), or what
/// the platform offers (SharedPreferences, Keychain) through the bindings.
pub trait TicketStore: Send + Sync + 'static {
    /// The saved ticket, if any.
    fn load(&self) -> Option<String>;
    /// Saves a ticket; empty means forget the saved one.
    fn save(&self, ticket: &str) -> Result<(), String>;
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

    pub fn load(&self) -> Option<String> {
        std::fs::read_to_string(&self.path)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
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
    fn load(&self) -> Option<String> {
        FileTicketStore::load(self)
    }

    fn save(&self, ticket: &str) -> Result<(), String> {
        FileTicketStore::save(self, ticket).map_err(|e| format!("{}: {e}", self.path.display()))
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

enum Cmd {
    Bind(
        String,
        String,
        String,
        oneshot::Sender<Result<(), SessionError>>,
    ),
    Unbind,
    Ack(u64, oneshot::Sender<Result<(), SessionError>>),
    Push(Vec<u8>, AckMode, oneshot::Sender<Result<(), SessionError>>),
    Network(bool),
    Foreground(bool),
    Close,
}

/// A connected (or reconnecting) client. Dropping it closes the session.
/// Its commands are those of [`ClientHandle`] (through `Deref`).
pub struct Client {
    handle: ClientHandle,
    events: mpsc::UnboundedReceiver<SessionEvent>,
}

/// The commands of a [`Client`], cloneable and usable from any task while
/// one owner reads the events.
#[derive(Clone)]
pub struct ClientHandle {
    cmds: mpsc::UnboundedSender<Cmd>,
}

impl Client {
    /// Starts the session in a background task; it connects and reconnects by
    /// itself. Watch `next_event` for `Connected`.
    pub fn connect(options: ClientOptions) -> Self {
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        tokio::spawn(run(options, cmd_rx, ev_tx));
        Self {
            handle: ClientHandle { cmds: cmd_tx },
            events: ev_rx,
        }
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
    pub async fn bind(&self, user: &str, tags: &str, token: &str) -> Result<(), SessionError> {
        let (tx, rx) = oneshot::channel();
        self.send(Cmd::Bind(user.into(), tags.into(), token.into(), tx))?;
        rx.await.unwrap_or(Err(SessionError::Stopped))
    }

    pub fn unbind(&self) -> Result<(), SessionError> {
        self.send(Cmd::Unbind)
    }

    pub async fn ack(&self, ack_id: u64) -> Result<(), SessionError> {
        let (tx, rx) = oneshot::channel();
        self.send(Cmd::Ack(ack_id, tx))?;
        rx.await.unwrap_or(Err(SessionError::Stopped))
    }

    /// Acknowledges without waiting for the session's answer (safe to call
    /// from an event callback that must not block).
    pub fn ack_nowait(&self, ack_id: u64) -> Result<(), SessionError> {
        let (tx, _) = oneshot::channel();
        self.send(Cmd::Ack(ack_id, tx))
    }

    /// Sends a message up (queued while offline, and kept across
    /// reconnects until the server answers). With an ACK mode, resolves once
    /// the server accepted it; fails with `SessionError::RetryLater` when it
    /// could not take it now (`error.retryable()`), `PushRejected` when it
    /// never will, `QueueFull` when too many are waiting. Without, resolves
    /// once it is queued to be sent.
    pub async fn push(&self, content: &[u8], ack_mode: AckMode) -> Result<(), SessionError> {
        let (tx, rx) = oneshot::channel();
        self.send(Cmd::Push(content.to_vec(), ack_mode, tx))?;
        rx.await.unwrap_or(Err(SessionError::Stopped))
    }

    /// The network is back: retry now.
    pub fn network_available(&self) -> Result<(), SessionError> {
        self.send(Cmd::Network(true))
    }

    /// The network came or went: back, retry now; gone, no attempts until back.
    pub fn network_changed(&self, available: bool) -> Result<(), SessionError> {
        self.send(Cmd::Network(available))
    }

    /// The app came to the foreground (retry now) or went to the background
    /// (no reconnect attempts until it is back; a live connection stays).
    pub fn app_state(&self, foreground: bool) -> Result<(), SessionError> {
        self.send(Cmd::Foreground(foreground))
    }

    pub fn close(&self) {
        let _ = self.cmds.send(Cmd::Close);
    }

    fn send(&self, c: Cmd) -> Result<(), SessionError> {
        self.cmds.send(c).map_err(|_| SessionError::Stopped)
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
fn tls_config(pinned_pem: Option<&str>) -> Result<Arc<tokio_rustls::rustls::ClientConfig>, String> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match pinned_pem {
        Some(pem) => {
            for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let c = c.map_err(|e| format!("pinned certificate: {e}"))?;
                roots
                    .add(c)
                    .map_err(|e| format!("pinned certificate: {e}"))?;
            }
            if roots.is_empty() {
                return Err("pinned certificate: no certificate in the PEM".into());
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

impl Conn {
    async fn open(
        address: &str,
        tls: &Arc<tokio_rustls::rustls::ClientConfig>,
    ) -> Result<Self, String> {
        if address.starts_with("ws://") || address.starts_with("wss://") {
            let (ws, _) = tokio_tungstenite::connect_async_tls_with_config(
                address,
                None,
                false,
                Some(tokio_tungstenite::Connector::Rustls(tls.clone())),
            )
            .await
            .map_err(|e| e.to_string())?;
            Ok(Self::Ws(Box::new(ws)))
        } else if let Some(hostport) = address.strip_prefix("tls://") {
            let host = hostport
                .rsplit_once(':')
                .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
                .ok_or_else(|| format!("{address}: tls://host:port"))?;
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| format!("{address}: {e}"))?;
            let s = TcpStream::connect(hostport)
                .await
                .map_err(|e| e.to_string())?;
            let _ = s.set_nodelay(true);
            let s = tokio_rustls::TlsConnector::from(tls.clone())
                .connect(name, s)
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            Ok(Self::Tls(Box::new(s)))
        } else {
            let s = TcpStream::connect(address)
                .await
                .map_err(|e| e.to_string())?;
            let _ = s.set_nodelay(true);
            Ok(Self::Tcp(s))
        }
    }

    async fn send(&mut self, b: Bytes) -> Result<(), String> {
        match self {
            Self::Tcp(s) => s.write_all(&b).await.map_err(|e| e.to_string()),
            Self::Tls(s) => {
                s.write_all(&b).await.map_err(|e| e.to_string())?;
                s.flush().await.map_err(|e| e.to_string())
            }
            Self::Ws(ws) => ws
                .send(WsMessage::Binary(b))
                .await
                .map_err(|e| e.to_string()),
        }
    }

    /// Cancel-safe: `Ok(None)` is a clean end of stream.
    async fn recv(&mut self, buf: &mut [u8]) -> Result<Option<Bytes>, String> {
        match self {
            Self::Tcp(s) => match s.read(buf).await {
                Ok(0) => Ok(None),
                Ok(n) => Ok(Some(Bytes::copy_from_slice(&buf[..n]))),
                Err(e) => Err(e.to_string()),
            },
            Self::Tls(s) => match s.read(buf).await {
                Ok(0) => Ok(None),
                Ok(n) => Ok(Some(Bytes::copy_from_slice(&buf[..n]))),
                Err(e) => Err(e.to_string()),
            },
            Self::Ws(ws) => loop {
                match ws.next().await {
                    None | Some(Ok(WsMessage::Close(_))) => return Ok(None),
                    Some(Ok(WsMessage::Binary(b))) => return Ok(Some(b)),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e.to_string()),
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
) -> Result<Vec<String>, String> {
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(3));
    if let Some(t) = tls {
        builder = builder.use_preconfigured_tls((**t).clone());
    }
    let client = builder.build().map_err(|e| e.to_string())?;
    let text = client
        .get(url)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
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

async fn run(
    options: ClientOptions,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    events: mpsc::UnboundedSender<SessionEvent>,
) {
    let ticket = options.ticket_store.as_ref().and_then(|s| s.load());
    let connect_timeout = options.session.connect_timeout;
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
    let mut buf = vec![0u8; 16 * 1024];
    // Up-pushes waiting for the server's answer, by session request id.
    let mut pushes: std::collections::HashMap<u64, oneshot::Sender<Result<(), SessionError>>> =
        std::collections::HashMap::new();
    loop {
        while let Some(a) = session.poll_action() {
            match a {
                Action::Open { address } => {
                    if let Some(c) = conn.take() {
                        c.close().await;
                    }
                    let open = async {
                        match &tls {
                            Ok(t) => Conn::open(&address, t).await,
                            Err(e)
                                if address.starts_with("tls://")
                                    || address.starts_with("wss://") =>
                            {
                                Err(e.clone())
                            }
                            Err(_) => Conn::open(&address, &tls_config(None)?).await,
                        }
                    };
                    match tokio::time::timeout(connect_timeout, open).await {
                        Ok(Ok(c)) => {
                            conn = Some(c);
                            session.handle_opened(Instant::now());
                        }
                        Ok(Err(e)) => session.handle_open_failed(&e, Instant::now()),
                        Err(_) => session.handle_open_failed("connect timed out", Instant::now()),
                    }
                }
                Action::Send(b) => {
                    if let Some(c) = &mut conn
                        && let Err(e) = c.send(b).await
                    {
                        conn = None;
                        session.handle_closed(&e, Instant::now());
                    }
                }
                Action::Close => {
                    if let Some(c) = conn.take() {
                        c.close().await;
                    }
                }
                Action::FetchServers { url } => {
                    let r = match &tls {
                        Ok(t) => fetch_servers(&url, Some(t)).await,
                        Err(e) if url.starts_with("https://") => Err(e.clone()),
                        Err(_) => fetch_servers(&url, None).await,
                    };
                    session.handle_servers(r, Instant::now());
                }
            }
        }
        let mut stopped = false;
        while let Some(e) = session.poll_event() {
            if let (SessionEvent::TicketUpdated { ticket }, Some(store)) =
                (&e, &options.ticket_store)
            {
                let _ = store.save(ticket);
            }
            match &e {
                SessionEvent::PushAcked { request } => {
                    if let Some(tx) = pushes.remove(request) {
                        let _ = tx.send(Ok(()));
                    }
                }
                SessionEvent::PushFailed { request, error } => {
                    if let Some(tx) = pushes.remove(request) {
                        let _ = tx.send(Err(error.clone()));
                    }
                }
                SessionEvent::Stopped { .. } => {
                    stopped = true;
                    for (_, tx) in pushes.drain() {
                        let _ = tx.send(Err(SessionError::Stopped));
                    }
                }
                _ => {}
            }
            let _ = events.send(e);
        }
        if stopped && session.poll_action().is_none() {
            if let Some(c) = conn.take() {
                c.close().await;
            }
            return;
        }
        tokio::select! {
            c = cmds.recv() => {
                let now = Instant::now();
                match c {
                    Some(Cmd::Bind(u, t, k, tx)) => { let _ = tx.send(session.bind(&u, &t, &k, now)); }
                    Some(Cmd::Unbind) => { let _ = session.unbind(now); }
                    Some(Cmd::Ack(id, tx)) => { let _ = tx.send(session.ack(id, now)); }
                    Some(Cmd::Push(b, m, tx)) => match session.push(&b, m, now) {
                        Ok(request) if m != AckMode::None => { pushes.insert(request, tx); }
                        Ok(_) => { let _ = tx.send(Ok(())); }
                        Err(e) => { let _ = tx.send(Err(e)); }
                    },
                    Some(Cmd::Network(true)) => session.network_available(now),
                    Some(Cmd::Network(false)) => session.network_lost(),
                    Some(Cmd::Foreground(true)) => session.foreground(now),
                    Some(Cmd::Foreground(false)) => session.background(),
                    Some(Cmd::Close) | None => session.close(),
                }
            }
            r = async {
                match &mut conn {
                    Some(c) => c.recv(&mut buf).await,
                    None => std::future::pending().await,
                }
            } => match r {
                Ok(Some(b)) => session.handle_input(&b, Instant::now()),
                Ok(None) => { conn = None; session.handle_closed("closed by the server", Instant::now()); }
                Err(e) => { conn = None; session.handle_closed(&e, Instant::now()); }
            },
            _ = sleep_opt(session.poll_timeout()) => session.handle_timeout(Instant::now()),
        }
    }
}
