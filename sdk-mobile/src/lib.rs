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

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::session::{AckMode, DeviceInfo};
use mpush_sdk_core::native::{Client, ClientHandle, ClientOptions, StorageError, TicketStore};
use mpush_sdk_core::{SessionConfig, SessionError, SessionEvent, SessionState};
use tokio::runtime::Runtime;

uniffi::setup_scaffolding!();

/// How long `shutdown()` waits for the session to say goodbye to the server.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Every failure: one kind per `SessionError` kind of the core, whose
/// `code()` and `retryable()` it reports (the same strings in every SDK).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum PushError {
    #[error("the offline queue is full ({capacity} items)")]
    QueueFull { capacity: u64 },
    #[error("the client is stopped")]
    Stopped,
    #[error("unknown ack id {id}")]
    UnknownAck { id: u64 },
    /// The server could not take the up-push now (its sinks are full, the
    /// client is over its rate) or did not answer in time: retry later.
    #[error("retry later: {reason}")]
    RetryLater { reason: String },
    /// The server will not take the up-push as sent (e.g. not bound).
    #[error("the server rejected the push: {reason}")]
    PushRejected { reason: String },
    #[error("invalid input: {reason}")]
    InvalidInput { reason: String },
    #[error("bind failed: {reason}")]
    BindFailed { reason: String },
    /// A call before `connect()`.
    #[error("not started: call connect() first")]
    NotStarted,
    #[error("storage: {reason}")]
    Storage { reason: String },
    #[error("a callback failed: {reason}")]
    Callback { reason: String },
    #[error("events dropped: a reader is not keeping up")]
    EventsOverflow,
}

#[uniffi::export]
impl PushError {
    /// Trying the same again later may work.
    pub fn retryable(&self) -> bool {
        SessionError::from(self.clone()).retryable()
    }

    /// The core's code: `queue_full`, `stopped`, `unknown_ack`,
    /// `retry_later`, `push_rejected`, `invalid_input`, `bind_failed`,
    /// `invalid_state`, `storage`, `callback` or `events_overflow`.
    pub fn code(&self) -> String {
        SessionError::from(self.clone()).code().to_owned()
    }
}

impl From<SessionError> for PushError {
    fn from(e: SessionError) -> Self {
        use SessionError as S;
        match e {
            S::QueueFull(n) => Self::QueueFull { capacity: n as u64 },
            S::UnknownAck(id) => Self::UnknownAck { id },
            S::RetryLater(reason) => Self::RetryLater { reason },
            S::PushRejected(reason) => Self::PushRejected { reason },
            S::InvalidInput(reason) => Self::InvalidInput { reason },
            S::BindFailed(reason) => Self::BindFailed { reason },
            S::NotStarted => Self::NotStarted,
            S::Storage(reason) => Self::Storage { reason },
            S::Callback(reason) => Self::Callback { reason },
            S::EventsOverflow => Self::EventsOverflow,
            // `Stopped`, and any kind a newer core adds (the shared table
            // test fails until it has its own).
            _ => Self::Stopped,
        }
    }
}

impl From<PushError> for SessionError {
    fn from(e: PushError) -> Self {
        use PushError as P;
        match e {
            P::QueueFull { capacity } => Self::QueueFull(capacity as usize),
            P::Stopped => Self::Stopped,
            P::UnknownAck { id } => Self::UnknownAck(id),
            P::RetryLater { reason } => Self::RetryLater(reason),
            P::PushRejected { reason } => Self::PushRejected(reason),
            P::InvalidInput { reason } => Self::InvalidInput(reason),
            P::BindFailed { reason } => Self::BindFailed(reason),
            P::NotStarted => Self::NotStarted,
            P::Storage { reason } => Self::Storage(reason),
            P::Callback { reason } => Self::Callback(reason),
            P::EventsOverflow => Self::EventsOverflow,
        }
    }
}

/// An exception thrown by the app's `SessionStore` or `PushListener`.
impl From<uniffi::UnexpectedUniFFICallbackError> for PushError {
    fn from(e: uniffi::UnexpectedUniFFICallbackError) -> Self {
        Self::Callback { reason: e.reason }
    }
}

/// One error of every kind, as this binding hands them to the app, in the
/// order of `sdk-core/testdata/error-codes.json` (which the Kotlin and
/// Python tests check against it).
#[uniffi::export]
pub fn error_table() -> Vec<PushError> {
    SessionError::every_kind()
        .into_iter()
        .map(PushError::from)
        .collect()
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
    /// The tunables below: `None` takes the core's default
    /// (`SessionConfig::new`); every value is checked by `SessionConfig::validate`.
    #[uniffi(default = None)]
    pub heartbeat_ms: Option<u64>,
    #[uniffi(default = None)]
    pub connect_timeout_ms: Option<u64>,
    #[uniffi(default = None)]
    pub backoff_initial_ms: Option<u64>,
    #[uniffi(default = None)]
    pub backoff_max_ms: Option<u64>,
    #[uniffi(default = None)]
    pub dedup_capacity: Option<u32>,
    #[uniffi(default = None)]
    pub outbound_capacity: Option<u32>,
    /// For `tls://` and `wss://` servers (and an `https://` allocator): trust
    /// only this PEM certificate (a private deployment); default: the webpki
    /// roots.
    #[uniffi(default = None)]
    pub tls_pinned_cert_pem: Option<String>,
    /// On `tls://` and `wss://` servers of this project: skip RSA and AES
    /// (the transport-secured profile, ADR 0005); falls back to the classic
    /// handshake if a server refuses it.
    #[uniffi(default = false)]
    pub transport_profile: bool,
    /// Use mpush's published RSA key (`public_key: None`, or that key given
    /// by value) on plain connections to other hosts. Anyone can decrypt
    /// such a handshake; without this, `connect` refuses with `InvalidInput`.
    #[uniffi(default = false)]
    pub allow_published_key: bool,
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

/// Where the client is (`PushClient::state()`); `Idle` before `connect()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum ConnectionState {
    Idle,
    Connecting,
    Connected,
    Disconnected,
    Closed,
}

impl From<&SessionState> for ConnectionState {
    fn from(s: &SessionState) -> Self {
        match s {
            SessionState::Connecting { .. } => Self::Connecting,
            SessionState::Connected { .. } => Self::Connected,
            SessionState::Disconnected { .. } => Self::Disconnected,
            SessionState::Stopped { .. } => Self::Closed,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, uniffi::Enum)]
pub enum PushEvent {
    /// Every change of `PushClient::state()`, before its detail event.
    StateChanged {
        state: ConnectionState,
    },
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

/// The app's store as the core's `TicketStore` (whose failures the core
/// reports as `Error` events).
struct StoreAdapter(Arc<dyn SessionStore>);

impl TicketStore for StoreAdapter {
    fn load(&self) -> Result<Option<String>, StorageError> {
        self.0
            .load()
            .map(|t| t.filter(|t| !t.is_empty()))
            .map_err(|e| StorageError(e.to_string()))
    }

    fn save(&self, ticket: &str) -> Result<(), StorageError> {
        self.0
            .save(ticket.to_owned())
            .map_err(|e| StorageError(e.to_string()))
    }
}

enum Phase {
    Ready(Box<ClientOptions>),
    Running {
        handle: ClientHandle,
        runtime: Runtime,
        /// The task that calls the listener, if there is one.
        listener: Option<tokio::task::JoinHandle<()>>,
    },
    Closed,
}

/// The push client. `connect()` starts it; it reconnects by itself until `shutdown()`.
#[derive(uniffi::Object)]
pub struct PushClient {
    phase: Mutex<Phase>,
    listener: Option<Arc<dyn PushListener>>,
    /// The core client, for `next_event` (without a listener); `None`
    /// before `connect()` and after the last event.
    events: tokio::sync::Mutex<Option<Client>>,
    /// Tells a waiting `next_event` that `connect()` or `shutdown()` happened.
    started: tokio::sync::watch::Sender<bool>,
}

fn session_config(c: &PushConfig) -> Result<SessionConfig, PushError> {
    let key = match &c.public_key {
        Some(k) => RsaPublic::from_text(k).map_err(|e| PushError::InvalidInput {
            reason: format!("public_key: {e}"),
        })?,
        None => RsaPublic::mpush_default(),
    };
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
    let ms = Duration::from_millis;
    s.allocator_url = c.allocator_url.clone();
    s.offer_v2 = c.offer_v2;
    s.heartbeat = c.heartbeat_ms.map_or(s.heartbeat, ms);
    s.connect_timeout = c.connect_timeout_ms.map_or(s.connect_timeout, ms);
    s.backoff.initial = c.backoff_initial_ms.map_or(s.backoff.initial, ms);
    s.backoff.max = c.backoff_max_ms.map_or(s.backoff.max, ms);
    s.dedup_capacity = c.dedup_capacity.map_or(s.dedup_capacity, |n| n as usize);
    s.outbound_capacity = c
        .outbound_capacity
        .map_or(s.outbound_capacity, |n| n as usize);
    s.tls_pinned_cert_pem = c.tls_pinned_cert_pem.clone();
    s.transport_profile = c.transport_profile;
    s.allow_published_key = c.allow_published_key;
    s.validate()?;
    Ok(s)
}

fn to_event(e: SessionEvent) -> Option<PushEvent> {
    Some(match e {
        SessionEvent::StateChanged(s) => PushEvent::StateChanged { state: (&s).into() },
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
        SessionEvent::Error { error } => PushEvent::Error {
            error: error.into(),
        },
        SessionEvent::Stopped { reason } => PushEvent::Stopped { reason },
        _ => return None,
    })
}

#[uniffi::export]
impl PushClient {
    /// Checks the config (`invalid_input` names the bad field); nothing
    /// connects before `connect()`. `store` keeps the resume ticket (none:
    /// memory only); `listener` gets every event (none: read them with
    /// `next_event()`).
    #[uniffi::constructor]
    pub fn new(
        config: PushConfig,
        store: Option<Arc<dyn SessionStore>>,
        listener: Option<Arc<dyn PushListener>>,
    ) -> Result<Arc<Self>, PushError> {
        let session = session_config(&config)?;
        let ticket_store = store.map(|s| Arc::new(StoreAdapter(s)) as Arc<dyn TicketStore>);
        Ok(Arc::new(Self {
            phase: Mutex::new(Phase::Ready(Box::new(ClientOptions {
                session,
                ticket_store,
            }))),
            listener,
            events: tokio::sync::Mutex::new(None),
            started: tokio::sync::watch::Sender::new(false),
        }))
    }

    /// Starts connecting (and reconnecting until `shutdown()`). Watch for
    /// `PushEvent::Connected`, or just call `bind`. A second call does nothing.
    pub fn connect(&self) -> Result<(), PushError> {
        let mut phase = self.phase.lock().map_err(|_| PushError::Stopped)?;
        let options = match &*phase {
            Phase::Ready(o) => o.clone(),
            Phase::Running { .. } => return Ok(()),
            Phase::Closed => return Err(PushError::Stopped),
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
        let mut client = {
            let _guard = runtime.enter();
            Client::connect(*options)?
        };
        let handle = client.handle();
        let listener = match self.listener.clone() {
            // Every event on the SDK's thread; a throwing listener does not
            // stop the client.
            Some(l) => Some(runtime.spawn(async move {
                while let Some(e) = client.next_event().await {
                    if let Some(e) = to_event(e) {
                        let _ = l.on_event(e);
                    }
                }
            })),
            None => {
                if let Ok(mut slot) = self.events.try_lock() {
                    *slot = Some(client);
                }
                None
            }
        };
        *phase = Phase::Running {
            handle,
            runtime,
            listener,
        };
        self.started.send_replace(true);
        Ok(())
    }

    /// Where the client is: `Idle` before `connect()`, then as the
    /// `StateChanged` events tell.
    pub fn state(&self) -> ConnectionState {
        match self.phase.lock().as_deref() {
            Ok(Phase::Running { handle, .. }) => (&handle.state()).into(),
            Ok(Phase::Ready(_)) => ConnectionState::Idle,
            _ => ConnectionState::Closed,
        }
    }

    /// Binds a user (re-bound after every reconnect). Returns when the server
    /// accepted it; `BindFailed` when it refused (or a newer bind or an
    /// unbind replaced it).
    pub async fn bind(
        &self,
        user_id: String,
        tags: Vec<String>,
        token: Option<String>,
    ) -> Result<(), PushError> {
        let h = self.handle()?;
        let token = token.unwrap_or_default();
        Ok(h.bind(&user_id, &tags.join(","), &token).await?)
    }

    /// Forgets the user (no more re-binds); returns once the server was told.
    pub async fn unbind(&self) -> Result<(), PushError> {
        Ok(self.handle()?.unbind().await?)
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
        let mode = if ack { AckMode::Auto } else { AckMode::None };
        Ok(self.handle()?.push(&content, mode).await?)
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
    /// was read. Only without a listener; waits for `connect()`.
    pub async fn next_event(&self) -> Option<PushEvent> {
        let _ = self.started.subscribe().wait_for(|s| *s).await;
        let mut slot = self.events.lock().await;
        loop {
            match slot.as_mut()?.next_event().await {
                Some(e) => {
                    if let Some(pe) = to_event(e) {
                        return Some(pe);
                    }
                }
                None => {
                    *slot = None;
                    return None;
                }
            }
        }
    }

    /// Stops for good: closes the connection, ends pending calls (and
    /// `next_event`) with `Stopped`, and stops the SDK's thread. Also done
    /// when the object is freed. (Not `close`: Kotlin's `AutoCloseable.close`
    /// of the generated class frees the object, which cannot happen while a
    /// `next_event` call holds it.)
    pub fn shutdown(&self) {
        let Ok(mut phase) = self.phase.lock() else {
            return;
        };
        let old = std::mem::replace(&mut *phase, Phase::Closed);
        drop(phase);
        self.started.send_replace(true);
        let Phase::Running {
            handle,
            runtime,
            listener,
        } = old
        else {
            return;
        };
        handle.close();
        if tokio::runtime::Handle::try_current().is_ok() {
            // Called on the SDK's own thread (from a listener) or inside
            // another runtime: cannot wait here.
            runtime.shutdown_background();
        } else {
            // Give the session a moment to say goodbye and the listener
            // its last events, then stop.
            runtime.block_on(async {
                let _ = tokio::time::timeout(CLOSE_GRACE, async {
                    handle.stopped().await;
                    if let Some(l) = listener {
                        let _ = l.await;
                    }
                })
                .await;
            });
            runtime.shutdown_timeout(CLOSE_GRACE);
        }
    }
}

impl PushClient {
    fn handle(&self) -> Result<ClientHandle, PushError> {
        match self.phase.lock().as_deref() {
            Ok(Phase::Running { handle, .. }) => Ok(handle.clone()),
            Ok(Phase::Ready(_)) => Err(PushError::NotStarted),
            _ => Err(PushError::Stopped),
        }
    }
}

impl Drop for PushClient {
    fn drop(&mut self) {
        self.shutdown();
    }
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
        .map_err(|e| PushError::InvalidInput { reason: e.0 })
}

/// The SDK's version.
#[uniffi::export]
pub fn sdk_version() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared table (the JVM and Python tests read the same file).
    #[test]
    fn every_core_error_keeps_its_code() {
        let table: serde_json::Value =
            serde_json::from_str(include_str!("../../sdk-core/testdata/error-codes.json"))
                .expect("table");
        let rows = table["errors"].as_array().expect("errors");
        let errors = error_table();
        assert_eq!(rows.len(), errors.len());
        for (row, e) in rows.iter().zip(&errors) {
            assert_eq!(e.code(), row["code"], "{e:?}");
            assert_eq!(e.retryable(), row["retryable"], "{e:?}");
        }
    }
}
