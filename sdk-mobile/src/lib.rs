//! UniFFI bindings of the mpush client core: a thin layer over
//! `mpush_sdk_core::native` for Android (Kotlin), iOS (Swift) and Python.
//!
//! A [`PushClient`] owns a small tokio runtime (one worker thread named
//! `mpush-sdk`) that runs the session; `shutdown()` or dropping the client stops
//! the session and the runtime, leaving no thread behind. Events reach the app
//! through a [`PushListener`] it implements, or through `next_event()` (async:
//! a Kotlin `Flow` and a Swift `AsyncSequence` wrap it in `bindings/`). The
//! resume ticket persists through a [`SessionStore`] the app implements
//! (SharedPreferences, Keychain). Errors are one enum with stable codes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mpush_protocol::backoff::BackoffConfig;
use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::session::{AckMode, DeviceInfo};
use mpush_sdk_core::native::{Client, ClientHandle, ClientOptions, TicketStore};
use mpush_sdk_core::{SessionConfig, SessionError, SessionEvent};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

uniffi::setup_scaffolding!();

/// How long `shutdown()` waits for the session to say goodbye to the server.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Every failure, with a stable `code()` shared with the other SDKs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum PushError {
    #[error("the offline queue is full ({capacity} items)")]
    QueueFull { capacity: u64 },
    #[error("the client is stopped")]
    Stopped,
    #[error("unknown ack id {id}")]
    UnknownAck { id: u64 },
    #[error("invalid input: {reason}")]
    InvalidInput { reason: String },
    #[error("the server refused the bind: {reason}")]
    BindFailed { reason: String },
    /// The server could not take the up-push now (its sinks are full, the
    /// client is over its rate) or did not answer in time: retry later.
    #[error("retry later: {reason}")]
    RetryLater { reason: String },
    /// The server will not take the up-push as sent (e.g. not bound).
    #[error("the server rejected the push: {reason}")]
    PushRejected { reason: String },
    #[error("storage: {reason}")]
    Storage { reason: String },
}

#[uniffi::export]
impl PushError {
    /// Trying the same again later may work.
    pub fn retryable(&self) -> bool {
        matches!(self, Self::QueueFull { .. } | Self::RetryLater { .. })
    }

    /// `queue_full`, `stopped`, `unknown_ack`, `invalid_input`, `bind_failed`,
    /// `retry_later`, `push_rejected` or `storage`.
    pub fn code(&self) -> String {
        match self {
            Self::QueueFull { .. } => "queue_full",
            Self::Stopped => "stopped",
            Self::UnknownAck { .. } => "unknown_ack",
            Self::InvalidInput { .. } => "invalid_input",
            Self::BindFailed { .. } => "bind_failed",
            Self::RetryLater { .. } => "retry_later",
            Self::PushRejected { .. } => "push_rejected",
            Self::Storage { .. } => "storage",
        }
        .to_owned()
    }
}

impl From<SessionError> for PushError {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::QueueFull(n) => Self::QueueFull { capacity: n as u64 },
            SessionError::UnknownAck(id) => Self::UnknownAck { id },
            SessionError::RetryLater(reason) => Self::RetryLater { reason },
            SessionError::PushRejected(reason) => Self::PushRejected { reason },
            // `Stopped`, and any kind a newer core adds (the test below
            // checks that every kind known today keeps its own code).
            _ => Self::Stopped,
        }
    }
}

/// An exception thrown by the app's `SessionStore` or `PushListener`.
impl From<uniffi::UnexpectedUniFFICallbackError> for PushError {
    fn from(e: uniffi::UnexpectedUniFFICallbackError) -> Self {
        Self::Storage { reason: e.reason }
    }
}

/// Who the client is and where it connects.
#[derive(Debug, Clone, uniffi::Record)]
pub struct PushConfig {
    /// `host:port` (TCP, mpush's port 3000) or `ws://` / `wss://` URLs, tried in order.
    pub servers: Vec<String>,
    pub device_id: String,
    /// mpush's allocator: a URL whose GET answers `host:port,...`.
    #[uniffi(default = None)]
    pub allocator_url: Option<String>,
    /// The server's RSA public key (PEM or base64 X.509); `None`: mpush's public default key.
    #[uniffi(default = None)]
    pub public_key: Option<String>,
    /// `android` or `ios` (mpush's client type 1).
    #[uniffi(default = "android")]
    pub os_name: String,
    #[uniffi(default = "")]
    pub os_version: String,
    #[uniffi(default = "")]
    pub client_version: String,
    /// Offer the v2 profile (a legacy mpush server ignores the offer).
    #[uniffi(default = true)]
    pub offer_v2: bool,
    #[uniffi(default = 240000)]
    pub heartbeat_ms: u64,
    #[uniffi(default = 10000)]
    pub connect_timeout_ms: u64,
    #[uniffi(default = 1000)]
    pub backoff_initial_ms: u64,
    #[uniffi(default = 60000)]
    pub backoff_max_ms: u64,
    #[uniffi(default = 1024)]
    pub dedup_capacity: u32,
    #[uniffi(default = 256)]
    pub outbound_capacity: u32,
    /// For `tls://` and `wss://` servers (and an `https://` allocator): trust
    /// only this PEM certificate (a private deployment); default: the webpki
    /// roots.
    #[uniffi(default = None)]
    pub tls_pinned_cert_pem: Option<String>,
}

/// A message for the app.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct PushMessage {
    /// This client's handle: pass it to `ack()` (BIZ messages).
    pub id: u64,
    /// The server's message id (v2 servers).
    pub message_id: Option<u64>,
    pub trace_id: String,
    pub content: Vec<u8>,
    /// The server waits for `ack(id)`; AUTO messages were acknowledged already.
    pub needs_ack: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, uniffi::Enum)]
pub enum PushEvent {
    Connected {
        address: String,
        resumed: bool,
        v2: bool,
    },
    Disconnected {
        reason: String,
        retry_in_ms: u64,
    },
    Message {
        message: PushMessage,
    },
    Kicked {
        user_id: String,
        device_id: String,
    },
    Bound {
        user_id: String,
    },
    BindFailed {
        user_id: String,
        reason: String,
    },
    /// The client will not reconnect (closed, or refused for good).
    Stopped {
        reason: String,
    },
    /// Something the app should know that is not tied to a call (a storage failure).
    Error {
        error: PushError,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum AppState {
    Foreground,
    Background,
}

/// Keeps the resume ticket (SharedPreferences, Keychain, a file).
#[uniffi::export(with_foreign)]
pub trait SessionStore: Send + Sync {
    fn load(&self) -> Result<Option<String>, PushError>;
    /// Saves the ticket; an empty one means: forget it.
    fn save(&self, ticket: String) -> Result<(), PushError>;
}

/// Receives every event, on the SDK's thread: hand work off, do not block.
#[uniffi::export(with_foreign)]
pub trait PushListener: Send + Sync {
    fn on_event(&self, event: PushEvent) -> Result<(), PushError>;
}

/// A session store in memory (tests, or apps that do not persist).
#[derive(Debug, Default, uniffi::Object)]
pub struct MemorySessionStore {
    ticket: Mutex<Option<String>>,
}

#[uniffi::export]
impl MemorySessionStore {
    #[uniffi::constructor]
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
}

#[uniffi::export]
impl SessionStore for MemorySessionStore {
    fn load(&self) -> Result<Option<String>, PushError> {
        Ok(self.ticket.lock().map(|t| t.clone()).unwrap_or_default())
    }

    fn save(&self, ticket: String) -> Result<(), PushError> {
        if let Ok(mut t) = self.ticket.lock() {
            *t = (!ticket.is_empty()).then_some(ticket);
        }
        Ok(())
    }
}

/// The app's store as the core's `TicketStore`; its failures become events.
struct StoreAdapter {
    store: Arc<dyn SessionStore>,
    errors: mpsc::UnboundedSender<PushError>,
}

impl TicketStore for StoreAdapter {
    fn load(&self) -> Option<String> {
        match self.store.load() {
            Ok(t) => t.filter(|t| !t.is_empty()),
            Err(e) => {
                let _ = self.errors.send(e);
                None
            }
        }
    }

    fn save(&self, ticket: &str) -> Result<(), String> {
        self.store.save(ticket.to_owned()).map_err(|e| {
            let reason = e.to_string();
            let _ = self.errors.send(e);
            reason
        })
    }
}

type Reply = oneshot::Sender<Result<(), PushError>>;

/// Calls waiting for the server's answer.
#[derive(Default)]
struct Waiters {
    binds: HashMap<String, Vec<Reply>>,
    stopped: bool,
}

impl Waiters {
    fn stop(&mut self) {
        self.stopped = true;
        for tx in self.binds.drain().flat_map(|(_, v)| v) {
            let _ = tx.send(Err(PushError::Stopped));
        }
    }
}

enum Phase {
    Ready(Box<ClientOptions>),
    Running {
        handle: ClientHandle,
        done: oneshot::Receiver<()>,
    },
    Closed,
}

struct State {
    phase: Phase,
    runtime: Option<Runtime>,
}

/// The push client. `connect()` starts it; it reconnects by itself until `shutdown()`.
#[derive(uniffi::Object)]
pub struct PushClient {
    state: Mutex<State>,
    waiters: Arc<Mutex<Waiters>>,
    listener: Option<Arc<dyn PushListener>>,
    events_tx: Mutex<Option<mpsc::UnboundedSender<PushEvent>>>,
    events: tokio::sync::Mutex<mpsc::UnboundedReceiver<PushEvent>>,
    store_errors: Mutex<Option<mpsc::UnboundedReceiver<PushError>>>,
}

fn session_config(c: &PushConfig) -> Result<SessionConfig, PushError> {
    if c.servers.is_empty() && c.allocator_url.is_none() {
        return Err(PushError::InvalidInput {
            reason: "servers or allocator_url is required".into(),
        });
    }
    if c.device_id.is_empty() {
        return Err(PushError::InvalidInput {
            reason: "device_id must not be empty".into(),
        });
    }
    let key = match &c.public_key {
        Some(k) => RsaPublic::from_text(k).map_err(|e| PushError::InvalidInput {
            reason: format!("public_key: {e}"),
        })?,
        None => RsaPublic::mpush_default(),
    };
    if c.backoff_initial_ms == 0 || c.backoff_max_ms < c.backoff_initial_ms {
        return Err(PushError::InvalidInput {
            reason: "backoff: 0 < backoff_initial_ms <= backoff_max_ms".into(),
        });
    }
    let mut s = SessionConfig::new(
        c.servers.clone(),
        Arc::new(key),
        DeviceInfo {
            device_id: c.device_id.clone(),
            os_name: c.os_name.clone(),
            os_version: c.os_version.clone(),
            client_version: c.client_version.clone(),
        },
    );
    s.allocator_url = c.allocator_url.clone();
    s.offer_v2 = c.offer_v2;
    s.heartbeat = Duration::from_millis(c.heartbeat_ms.max(1000));
    s.connect_timeout = Duration::from_millis(c.connect_timeout_ms.max(100));
    s.backoff = BackoffConfig {
        initial: Duration::from_millis(c.backoff_initial_ms),
        max: Duration::from_millis(c.backoff_max_ms),
        ..BackoffConfig::default()
    };
    s.dedup_capacity = c.dedup_capacity.max(1) as usize;
    s.outbound_capacity = c.outbound_capacity.max(1) as usize;
    s.tls_pinned_cert_pem = c.tls_pinned_cert_pem.clone();
    Ok(s)
}

fn to_event(e: SessionEvent) -> Option<PushEvent> {
    Some(match e {
        SessionEvent::Connected {
            address,
            resumed,
            v2,
        } => PushEvent::Connected {
            address,
            resumed,
            v2,
        },
        SessionEvent::Disconnected {
            reason,
            retry_in_ms,
        } => PushEvent::Disconnected {
            reason,
            retry_in_ms,
        },
        SessionEvent::Message(m) => PushEvent::Message {
            message: PushMessage {
                id: m.ack_id,
                message_id: m.message_id,
                trace_id: m.trace_id,
                content: m.content,
                needs_ack: m.needs_ack,
            },
        },
        SessionEvent::Kicked { device_id, user_id } => PushEvent::Kicked { user_id, device_id },
        SessionEvent::BindResult {
            user_id, ok: true, ..
        } => PushEvent::Bound { user_id },
        SessionEvent::BindResult {
            user_id, reason, ..
        } => PushEvent::BindFailed { user_id, reason },
        SessionEvent::Stopped { reason } => PushEvent::Stopped { reason },
        _ => return None,
    })
}

#[uniffi::export]
impl PushClient {
    /// Checks the config; nothing connects before `connect()`. `store` keeps
    /// the resume ticket (none: memory only); `listener` gets every event
    /// (none: read them with `next_event()`).
    #[uniffi::constructor]
    pub fn new(
        config: PushConfig,
        store: Option<Arc<dyn SessionStore>>,
        listener: Option<Arc<dyn PushListener>>,
    ) -> Result<Arc<Self>, PushError> {
        let session = session_config(&config)?;
        let (err_tx, err_rx) = mpsc::unbounded_channel();
        let ticket_store = store.map(|store| {
            Arc::new(StoreAdapter {
                store,
                errors: err_tx,
            }) as Arc<dyn TicketStore>
        });
        let (tx, rx) = mpsc::unbounded_channel();
        Ok(Arc::new(Self {
            state: Mutex::new(State {
                phase: Phase::Ready(Box::new(ClientOptions {
                    session,
                    ticket_store,
                })),
                runtime: None,
            }),
            waiters: Arc::new(Mutex::new(Waiters::default())),
            listener,
            events_tx: Mutex::new(Some(tx)),
            events: tokio::sync::Mutex::new(rx),
            store_errors: Mutex::new(Some(err_rx)),
        }))
    }

    /// Starts connecting (and reconnecting until `shutdown()`). Watch for
    /// `PushEvent::Connected`. A second call does nothing.
    pub fn connect(&self) -> Result<(), PushError> {
        let mut st = self.state.lock().map_err(|_| PushError::Stopped)?;
        let options = match std::mem::replace(&mut st.phase, Phase::Closed) {
            Phase::Ready(o) => o,
            other => {
                let closed = matches!(other, Phase::Closed);
                st.phase = other;
                return if closed {
                    Err(PushError::Stopped)
                } else {
                    Ok(())
                };
            }
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(2)
            .thread_name("mpush-sdk")
            .enable_all()
            .build()
            .map_err(|e| PushError::InvalidInput {
                reason: format!("cannot start the SDK's runtime: {e}"),
            })?;
        let client = {
            let _guard = runtime.enter();
            Client::connect(*options)
        };
        let handle = client.handle();
        let (done_tx, done_rx) = oneshot::channel();
        let events_tx = self.events_tx.lock().ok().and_then(|mut t| t.take());
        let store_errors = self.store_errors.lock().ok().and_then(|mut r| r.take());
        runtime.spawn(forward(
            client,
            store_errors,
            self.listener.clone(),
            events_tx,
            self.waiters.clone(),
            done_tx,
        ));
        st.phase = Phase::Running {
            handle,
            done: done_rx,
        };
        st.runtime = Some(runtime);
        Ok(())
    }

    /// Binds a user (re-bound after every reconnect). Returns when the server
    /// accepted it; `BindFailed` when it refused.
    pub async fn bind(
        &self,
        user_id: String,
        tags: Vec<String>,
        token: Option<String>,
    ) -> Result<(), PushError> {
        if user_id.is_empty() {
            return Err(PushError::InvalidInput {
                reason: "user_id must not be empty".into(),
            });
        }
        let handle = self.handle()?;
        let (tx, rx) = oneshot::channel();
        {
            let mut w = self.waiters.lock().map_err(|_| PushError::Stopped)?;
            if w.stopped {
                return Err(PushError::Stopped);
            }
            w.binds.entry(user_id.clone()).or_default().push(tx);
        }
        handle
            .bind(&user_id, &tags.join(","), token.as_deref().unwrap_or(""))
            .await?;
        rx.await.unwrap_or(Err(PushError::Stopped))
    }

    pub fn unbind(&self) -> Result<(), PushError> {
        Ok(self.handle()?.unbind()?)
    }

    /// Acknowledges a BIZ message the app has handled (`message.id`); queued
    /// while offline. Does not block: safe in a listener.
    pub fn ack(&self, id: u64) -> Result<(), PushError> {
        Ok(self.handle()?.ack_nowait(id)?)
    }

    /// Sends a message up (queued while offline, and sent again after a
    /// reconnect until the server answers). With `ack`, returns once the
    /// server accepted it (handed it to the backend's sinks); throws
    /// `RetryLater` (retryable) or `PushRejected`.
    pub async fn push(&self, content: Vec<u8>, ack: bool) -> Result<(), PushError> {
        let handle = self.handle()?;
        let mode = if ack { AckMode::Auto } else { AckMode::None };
        // The core's driver settles it: accepted by the server, or a typed
        // error (`retry_later` is retryable).
        Ok(handle.push(&content, mode).await?)
    }

    /// The network came back (retry now) or went away (no attempts until it is back).
    pub fn network_changed(&self, available: bool) -> Result<(), PushError> {
        Ok(self.handle()?.network_changed(available)?)
    }

    /// Foreground: retry now. Background: no reconnect attempts until the
    /// foreground (a live connection stays).
    pub fn app_state(&self, state: AppState) -> Result<(), PushError> {
        Ok(self.handle()?.app_state(state == AppState::Foreground)?)
    }

    /// The next event, or `None` once the client has stopped and every event
    /// was read. Only without a listener.
    pub async fn next_event(&self) -> Option<PushEvent> {
        self.events.lock().await.recv().await
    }

    /// Stops for good: closes the connection, ends pending calls (and
    /// `next_event`) with `Stopped`, and stops the SDK's thread. Also done
    /// when the object is freed. (Not `close`: Kotlin's `AutoCloseable.close`
    /// of the generated class frees the object, which cannot happen while a
    /// `next_event` call holds it.)
    pub fn shutdown(&self) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        let phase = std::mem::replace(&mut st.phase, Phase::Closed);
        let runtime = st.runtime.take();
        drop(st);
        if let Ok(mut w) = self.waiters.lock() {
            w.stop();
        }
        if let Phase::Running { handle, done } = phase {
            handle.close();
            if let Some(rt) = runtime {
                if tokio::runtime::Handle::try_current().is_ok() {
                    // Called on the SDK's own thread (from a listener) or
                    // inside another runtime: cannot wait here.
                    rt.shutdown_background();
                } else {
                    // Give the session a moment to say goodbye, then stop.
                    let _ = rt.block_on(async { tokio::time::timeout(CLOSE_GRACE, done).await });
                    rt.shutdown_timeout(CLOSE_GRACE);
                }
            }
        }
        // No more events: `next_event()` returns None once the queue is read.
        if let Ok(mut t) = self.events_tx.lock() {
            t.take();
        }
    }
}

impl PushClient {
    fn handle(&self) -> Result<ClientHandle, PushError> {
        let st = self.state.lock().map_err(|_| PushError::Stopped)?;
        match &st.phase {
            Phase::Running { handle, .. } => Ok(handle.clone()),
            Phase::Ready(_) => Err(PushError::InvalidInput {
                reason: "call connect() first".into(),
            }),
            Phase::Closed => Err(PushError::Stopped),
        }
    }
}

impl Drop for PushClient {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Runs on the SDK's thread: settles waiting calls and hands every event to
/// the listener or the `next_event` queue.
async fn forward(
    mut client: Client,
    mut store_errors: Option<mpsc::UnboundedReceiver<PushError>>,
    listener: Option<Arc<dyn PushListener>>,
    events: Option<mpsc::UnboundedSender<PushEvent>>,
    waiters: Arc<Mutex<Waiters>>,
    done: oneshot::Sender<()>,
) {
    let deliver = |e: PushEvent| match &listener {
        // A throwing listener must not stop the client; nothing to do with it.
        Some(l) => {
            let _ = l.on_event(e);
        }
        None => {
            if let Some(tx) = &events {
                let _ = tx.send(e);
            }
        }
    };
    loop {
        let e = tokio::select! {
            e = client.next_event() => e,
            Some(err) = async {
                match &mut store_errors {
                    Some(r) => r.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                deliver(PushEvent::Error { error: err });
                continue;
            }
        };
        let Some(e) = e else { break };
        if let Ok(mut w) = waiters.lock() {
            match &e {
                SessionEvent::BindResult {
                    user_id,
                    ok,
                    reason,
                } => {
                    for tx in w.binds.remove(user_id).unwrap_or_default() {
                        let _ = tx.send(if *ok {
                            Ok(())
                        } else {
                            Err(PushError::BindFailed {
                                reason: reason.clone(),
                            })
                        });
                    }
                }
                SessionEvent::Stopped { .. } => w.stop(),
                _ => {}
            }
        }
        let stopped = matches!(e, SessionEvent::Stopped { .. });
        if let Some(pe) = to_event(e) {
            deliver(pe);
        }
        if stopped {
            break;
        }
    }
    if let Ok(mut w) = waiters.lock() {
        w.stop();
    }
    let _ = done.send(());
}

/// Checks one shared protocol test vector (the JSON text of one file of
/// `protocol/testdata/vectors/`) against this library; returns its name.
#[uniffi::export]
pub fn check_vector(json: String) -> Result<String, PushError> {
    let v: serde_json::Value =
        serde_json::from_str(&json).map_err(|e| PushError::InvalidInput {
            reason: format!("not JSON: {e}"),
        })?;
    mpush_protocol::conformance::check_vector(&v)
        .map_err(|reason| PushError::InvalidInput { reason })
}

/// The SDK's version.
#[uniffi::export]
pub fn sdk_version() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_core_error_keeps_its_code() {
        for e in SessionError::every_kind() {
            assert_eq!(PushError::from(e.clone()).code(), e.code(), "{e:?}");
        }
    }
}
