//! The mpush browser SDK's core: `mpush-sdk-core`'s `Session` (reconnect
//! with backoff and jitter, fast connect, re-bind, dedup, ACKs, the offline
//! queue) behind a narrow wasm-bindgen class, [`Core`], that takes and gives
//! plain values. The driver around it (the `WebSocket`, the timer, promises,
//! callbacks and the event iterator) is the package's `client.js`, as the
//! native driver is `sdk-core/src/native.rs`: it makes no protocol decision,
//! and this crate makes no I/O.
//!
//! Why the driver is JavaScript: the browser package has a 60 KB budget,
//! and the same driver written in Rust was 25 KB of the module (every JS
//! object built field by field through `Reflect`, every callback a closure
//! shim); in JavaScript it is a few kilobytes. See `sdk-wasm/README.md`.
//!
//! The crate compiles for the host too (so the workspace's lints and tests
//! cover it), but it only does something in a JavaScript engine.

use std::sync::Arc;
use std::time::Duration;

use js_sys::Uint8Array;
use mpush_protocol::Instant;
use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::session::{AckMode, DeviceInfo};
use mpush_sdk_core::session::{
    Action, Session, SessionConfig, SessionError, SessionEvent, SessionState, parse_server_list,
};
use wasm_bindgen::prelude::*;

pub mod layout;
use layout::{BindSlot, ItemSlot, KickedSlot, MessageSlot, NumberSlot, SettledSlot, StateSlot};

/// A `poll` item written in slot order, each value beside its slot's name:
/// the build fails if a slot is not at its position (`layout.rs`), and the
/// item is one `vec!` of its values (no placeholder to overwrite).
macro_rules! slots {
    ($($slot:expr => $value:expr),+ $(,)?) => {{
        slots!(@at 0usize; $($slot),+);
        vec![$($value),+]
    }};
    (@at $i:expr; $slot:expr $(, $rest:expr)*) => {
        const { assert!($slot as usize == $i, "a poll item's slot is out of its layout order") };
        slots!(@at $i + 1; $($rest),*);
    };
    (@at $i:expr;) => {};
}

#[cfg(all(target_family = "wasm", not(target_feature = "atomics")))]
#[global_allocator]
static TALC: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

#[wasm_bindgen(inline_js = "export function mkError(code, message, retryable) {
  const e = new Error(message);
  e.code = code;
  e.retryable = retryable;
  return e;
}")]
extern "C" {
    #[wasm_bindgen(js_name = mkError)]
    fn mk_error(code: &str, message: &str, retryable: bool) -> JsValue;
}

/// An `Error` with the core's `code` (shared by every SDK) and `retryable`:
/// every error the SDK raises is one of the core's.
fn js_error(e: &SessionError) -> JsValue {
    mk_error(e.code(), &e.to_string(), e.retryable())
}

/// The error of `kind` (a `SessionError` code) for the driver's own checks:
/// `invalid_input` (an option of the wrong type), `invalid_state` (a command
/// before `connect()`), `stopped`, `storage`, `callback`, `events_overflow`.
#[wasm_bindgen(js_name = sdkError)]
pub fn sdk_error(kind: &str, message: String) -> JsValue {
    js_error(&match kind {
        "invalid_state" => SessionError::NotStarted,
        "stopped" => SessionError::Stopped,
        "storage" => SessionError::Storage(message),
        "callback" => SessionError::Callback(message),
        "events_overflow" => SessionError::EventsOverflow,
        _ => SessionError::InvalidInput(message),
    })
}

/// The SDK's version.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}

/// One session, driven by `client.js`.
#[wasm_bindgen]
#[derive(Default)]
pub struct Core {
    config: Option<SessionConfig>,
    session: Option<Session>,
}

fn string(s: impl Into<String>) -> JsValue {
    JsValue::from(s.into())
}

fn number(n: u64) -> JsValue {
    JsValue::from_f64(n as f64)
}

#[wasm_bindgen]
impl Core {
    #[wasm_bindgen(constructor)]
    pub fn new() -> Core {
        Core::default()
    }

    /// Sets and checks the configuration (the core's defaults and ranges).
    /// `numbers` holds the numeric settings at their [`NumberSlot`]s
    /// (durations in ms); NaN takes the default. Throws `invalid_input`
    /// naming the field.
    #[allow(clippy::too_many_arguments)]
    pub fn configure(
        &mut self,
        servers: Vec<String>,
        allocator_url: Option<String>,
        public_key: Option<String>,
        device_id: String,
        os_name: String,
        os_version: String,
        client_version: String,
        v2: bool,
        transport_profile: bool,
        allow_published_key: bool,
        numbers: &[f64],
    ) -> Result<(), JsValue> {
        let public_key = match public_key {
            Some(text) => RsaPublic::from_text(&text).map_err(|e| {
                js_error(&SessionError::InvalidInput(format!(
                    "options.publicKey: {e}"
                )))
            })?,
            None => RsaPublic::mpush_default(),
        };
        let device = DeviceInfo {
            device_id,
            os_name,
            os_version,
            client_version,
        };
        let mut c = SessionConfig::new(servers, Arc::new(public_key), device);
        c.allocator_url = allocator_url;
        c.offer_v2 = v2;
        c.transport_profile = transport_profile;
        c.allow_published_key = allow_published_key;
        let n = |slot: NumberSlot| numbers.get(slot as usize).copied().filter(|n| !n.is_nan());
        let ms = |slot: NumberSlot, into: &mut Duration| {
            if let Some(v) = n(slot) {
                *into = Duration::from_millis(v as u64);
            }
        };
        ms(NumberSlot::HeartbeatMs, &mut c.heartbeat);
        ms(NumberSlot::ConnectTimeoutMs, &mut c.connect_timeout);
        ms(NumberSlot::BackoffInitialMs, &mut c.backoff.initial);
        ms(NumberSlot::BackoffMaxMs, &mut c.backoff.max);
        if let Some(v) = n(NumberSlot::BackoffMultiplier) {
            c.backoff.multiplier = v;
        }
        if let Some(v) = n(NumberSlot::BackoffJitter) {
            c.backoff.jitter = v;
        }
        if let Some(v) = n(NumberSlot::DedupCapacity) {
            c.dedup_capacity = v as usize;
        }
        if let Some(v) = n(NumberSlot::OutboundCapacity) {
            c.outbound_capacity = v as usize;
        }
        c.validate().map_err(|e| js_error(&e))?;
        self.config = Some(c);
        Ok(())
    }

    /// Starts the session (it connects at once). `ticket` is the stored
    /// resume ticket; `seed` 32 bytes of `crypto.getRandomValues`.
    pub fn start(
        &mut self,
        ticket: Option<String>,
        seed: &[u8],
        unix_ms: f64,
    ) -> Result<(), JsValue> {
        let (Some(config), Ok(seed)) = (self.config.clone(), <[u8; 32]>::try_from(seed)) else {
            return Err(js_error(&SessionError::InvalidInput(
                "start() needs a configuration and a 32-byte seed".into(),
            )));
        };
        self.session = Some(Session::new(
            config,
            ticket.as_deref(),
            seed,
            Instant::now(),
            unix_ms as i64,
        ));
        Ok(())
    }

    fn session(&mut self) -> Result<&mut Session, JsValue> {
        self.session
            .as_mut()
            .ok_or_else(|| js_error(&SessionError::NotStarted))
    }

    /// The socket `open` asked for is open.
    pub fn opened(&mut self) {
        if let Some(s) = &mut self.session {
            s.handle_opened(Instant::now());
        }
    }

    /// Bytes from the socket.
    pub fn input(&mut self, data: &[u8]) {
        if let Some(s) = &mut self.session {
            s.handle_input(data, Instant::now());
        }
    }

    /// The socket closed (`was_open`) or could not open.
    pub fn closed(&mut self, reason: &str, was_open: bool) {
        if let Some(s) = &mut self.session {
            if was_open {
                s.handle_closed(reason, Instant::now());
            } else {
                s.handle_open_failed(reason, Instant::now());
            }
        }
    }

    /// The allocator's answer to `fetch`: its text, or why it failed.
    pub fn servers(&mut self, text: Option<String>, error: Option<String>) {
        if let Some(s) = &mut self.session {
            match text {
                Some(t) => s.handle_servers(parse_server_list(&t), Instant::now()),
                None => s.handle_servers_failed(&error.unwrap_or_default(), Instant::now()),
            }
        }
    }

    /// The timer fired.
    pub fn timeout(&mut self) {
        if let Some(s) = &mut self.session {
            s.handle_timeout(Instant::now());
        }
    }

    /// The page went online: retry now.
    pub fn online(&mut self) {
        if let Some(s) = &mut self.session {
            s.network_available(Instant::now());
        }
    }

    /// The page became visible: check the connection now.
    pub fn foreground(&mut self) {
        if let Some(s) = &mut self.session {
            s.foreground(Instant::now());
        }
    }

    /// A request id, settled by a later `settled` item.
    pub fn bind(&mut self, user_id: &str, tags: &str, token: &str) -> Result<f64, JsValue> {
        let r = self.session()?.bind(user_id, tags, token, Instant::now());
        r.map(|r| r as f64).map_err(|e| js_error(&e))
    }

    pub fn unbind(&mut self) -> Result<f64, JsValue> {
        let r = self.session()?.unbind(Instant::now());
        r.map(|r| r as f64).map_err(|e| js_error(&e))
    }

    /// `ack`: wait for the server's acceptance (AUTO), or only send (NONE).
    pub fn push(&mut self, data: &[u8], ack: bool) -> Result<f64, JsValue> {
        let mode = if ack { AckMode::Auto } else { AckMode::None };
        let r = self.session()?.push(data, mode, Instant::now());
        r.map(|r| r as f64).map_err(|e| js_error(&e))
    }

    /// False when there is nothing to acknowledge (unknown or done).
    pub fn ack(&mut self, ack_id: f64) -> Result<bool, JsValue> {
        match self.session()?.ack(ack_id as u64, Instant::now()) {
            Ok(()) => Ok(true),
            Err(SessionError::UnknownAck(_)) => Ok(false),
            Err(e) => Err(js_error(&e)),
        }
    }

    pub fn close(&mut self) {
        if let Some(s) = &mut self.session {
            s.close();
        }
    }

    /// `idle` (not started), `connecting`, `connected`, `disconnected`, `closed`.
    pub fn state(&self) -> String {
        self.session
            .as_ref()
            .map_or("idle", |s| s.state().name())
            .to_owned()
    }

    /// Milliseconds until `timeout()` is due; -1: no timer.
    pub fn wait(&self) -> f64 {
        let deadline = self.session.as_ref().and_then(Session::poll_timeout);
        deadline.map_or(-1.0, |t| {
            t.saturating_duration_since(Instant::now()).as_millis() as f64
        })
    }

    /// The next thing for the driver, as an array whose [`ItemSlot::Kind`]
    /// names it: an action (`open` address, `send` bytes, `close`, `fetch`
    /// url), then the events (`state`, `message`, `kicked`, `bind`,
    /// `ticket`, `settled`, `error`, `stopped`), each field at its slot
    /// (`layout.rs`). `undefined` when there is nothing.
    pub fn poll(&mut self) -> Option<Vec<JsValue>> {
        use ItemSlot::{Kind, Value};
        let s = self.session.as_mut()?;
        if let Some(a) = s.poll_action() {
            return Some(match a {
                Action::Open { address } => {
                    slots![Kind => string("open"), Value => string(address)]
                }
                Action::Send(b) => slots![
                    Kind => string("send"),
                    Value => Uint8Array::from(&b[..]).into(),
                ],
                Action::Close => slots![Kind => string("close")],
                Action::FetchServers { url } => {
                    slots![Kind => string("fetch"), Value => string(url)]
                }
            });
        }
        loop {
            let item = match s.poll_event()? {
                // What the state does not carry is undefined.
                SessionEvent::StateChanged(state) => {
                    let mut item = vec![JsValue::UNDEFINED; StateSlot::Count as usize];
                    let mut set = |slot: StateSlot, v: JsValue| item[slot as usize] = v;
                    set(StateSlot::Name, string(state.name()));
                    match state {
                        SessionState::Connecting { address } => {
                            set(StateSlot::Address, string(address))
                        }
                        SessionState::Connected {
                            address,
                            resumed,
                            v2,
                        } => {
                            set(StateSlot::Address, string(address));
                            set(StateSlot::Resumed, resumed.into());
                            set(StateSlot::V2, v2.into());
                        }
                        SessionState::Disconnected {
                            reason,
                            retry_in_ms,
                        } => {
                            set(StateSlot::Reason, string(reason));
                            set(StateSlot::RetryInMs, number(retry_in_ms));
                        }
                        SessionState::Stopped { reason } => set(StateSlot::Reason, string(reason)),
                    }
                    item[Kind as usize] = string("state");
                    item
                }
                SessionEvent::Message(m) => slots![
                    Kind => string("message"),
                    MessageSlot::AckId => number(m.ack_id),
                    // A decimal string: u64 ids do not fit a JS number.
                    MessageSlot::MessageId => m
                        .message_id
                        .map_or(JsValue::NULL, |id| string(id.to_string())),
                    MessageSlot::TraceId => string(m.trace_id),
                    MessageSlot::Content => Uint8Array::from(m.content.as_slice()).into(),
                    MessageSlot::NeedsAck => m.needs_ack.into(),
                ],
                SessionEvent::Kicked { device_id, user_id } => slots![
                    Kind => string("kicked"),
                    KickedSlot::UserId => string(user_id),
                    KickedSlot::DeviceId => string(device_id),
                ],
                SessionEvent::BindResult {
                    user_id,
                    ok,
                    reason,
                } => slots![
                    Kind => string("bind"),
                    BindSlot::UserId => string(user_id),
                    BindSlot::Ok => ok.into(),
                    BindSlot::Reason => string(reason),
                ],
                SessionEvent::TicketUpdated { ticket } => {
                    slots![Kind => string("ticket"), Value => string(ticket)]
                }
                SessionEvent::Settled { request, result } => slots![
                    Kind => string("settled"),
                    SettledSlot::Request => number(request),
                    SettledSlot::Error => result.err().map_or(JsValue::NULL, |e| js_error(&e)),
                ],
                SessionEvent::Error { error } => {
                    slots![Kind => string("error"), Value => js_error(&error)]
                }
                SessionEvent::Stopped { reason } => {
                    slots![Kind => string("stopped"), Value => string(reason)]
                }
                // `state` carries what these say.
                _ => continue,
            };
            return Some(item);
        }
    }
}

/// Checks one shared protocol test vector (the JSON text of one file of
/// `protocol/testdata/vectors/`) against this build and returns its name;
/// throws an `Error` naming the vector and the field that differs.
#[cfg(feature = "conformance")]
#[wasm_bindgen(js_name = checkVector)]
pub fn check_vector(json: &str) -> Result<String, JsError> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| JsError::new(&format!("not JSON: {e}")))?;
    mpush_protocol::conformance::check_vector(&v).map_err(|e| JsError::new(&e.0))
}

/// One error of every kind, as this SDK raises them (an `Error` with the
/// core's `code` and `retryable`), in the order of
/// `sdk-core/testdata/error-codes.json`, which the tests check them against.
#[doc(hidden)]
pub fn error_table() -> Vec<JsValue> {
    SessionError::every_kind().iter().map(js_error).collect()
}

/// The self-test module's `errorTable()`: see [`error_table`].
#[cfg(feature = "conformance")]
#[wasm_bindgen(js_name = errorTable)]
pub fn error_table_js() -> Vec<JsValue> {
    error_table()
}

/// `version()` and the `Core` class as one object, for `client.js`'s
/// `makeClient` where a module namespace is not at hand (the tests).
#[doc(hidden)]
pub fn module_for_tests() -> JsValue {
    let o = js_sys::Object::new();
    let core: JsValue = Core::new().into();
    let class = js_sys::Reflect::get(&core, &"constructor".into()).unwrap_or(JsValue::UNDEFINED);
    let set = |k: &str, v: &JsValue| {
        let _ = js_sys::Reflect::set(&o, &k.into(), v);
    };
    set("Core", &class);
    set(
        "version",
        &wasm_bindgen::closure::Closure::<dyn Fn() -> String>::new(version).into_js_value(),
    );
    set(
        "sdkError",
        &wasm_bindgen::closure::Closure::<dyn Fn(String, String) -> JsValue>::new(
            |k: String, m: String| sdk_error(&k, m),
        )
        .into_js_value(),
    );
    o.into()
}
