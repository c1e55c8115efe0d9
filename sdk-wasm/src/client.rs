//! `PushClient`: the JavaScript face of `mpush_sdk_core::Session`.
//!
//! All state lives in one `Inner` behind `Rc<RefCell<_>>`. Every entry point
//! (a method, a socket event, the timer, a fetch) borrows it, feeds the
//! session, runs the session's actions and turns its events into callback
//! calls, then releases the borrow and only then calls the app's callbacks,
//! so a callback may call back into the client.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use js_sys::{Array, ArrayBuffer, Function, Promise, Uint8Array};
use mpush_protocol::Instant;
use mpush_protocol::session::AckMode;
use mpush_sdk_core::session::{
    Action, Message, Session, SessionError, SessionEvent, SessionState, parse_server_list,
};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::prelude::*;
use web_sys::{EventTarget, VisibilityState};

use crate::events::{EventIterator, EventQueue};
use crate::js::{self, Tracked};
use crate::options::Options;
use crate::socket::{Socket, SocketEvent};

/// How long an allocator request may take.
const ALLOCATOR_TIMEOUT_MS: u32 = 5_000;

/// A callback to run once the borrow of `Inner` is released.
type Calls = Vec<(Function, Vec<JsValue>)>;

/// A promise waiting for the core: a request's `Settled`, or the first
/// connection (`connect()`).
enum Wait {
    Request(u64),
    Connected,
}

/// The session's one timer (`setTimeout`), re-armed when its deadline moves.
struct Timer {
    callback: Tracked<dyn FnMut()>,
    id: Option<JsValue>,
    at: Option<Instant>,
}

impl Timer {
    fn arm(&mut self, at: Option<Instant>, now: Instant) {
        if at == self.at {
            return;
        }
        self.cancel();
        if let Some(t) = at {
            // +1 ms: a timer must not fire a hair before the deadline it serves.
            let ms = t.saturating_duration_since(now).as_millis() as f64 + 1.0;
            self.id = Some(js::set_timeout(self.callback.function(), ms));
            self.at = at;
        }
    }

    fn cancel(&mut self) {
        if let Some(id) = self.id.take() {
            js::clear_timeout(&id);
        }
        self.at = None;
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// `online` and `visibilitychange` listeners, removed when dropped.
struct PageListeners {
    global: EventTarget,
    document: Option<EventTarget>,
    online: Tracked<dyn FnMut()>,
    visible: Tracked<dyn FnMut()>,
}

impl PageListeners {
    /// Listens where the host has events (a page, a worker); `None` in Node.
    fn install(me: &Weak<RefCell<Inner>>) -> Option<Self> {
        let global = js_sys::global();
        if !js::get(&global, "addEventListener").is_some_and(|f| f.is_function()) {
            return None;
        }
        let global: EventTarget = global.unchecked_into();
        let weak = me.clone();
        let online = Tracked::new(Closure::<dyn FnMut()>::new(move || {
            with_session(&weak, |s, now| s.network_available(now));
        }));
        let weak = me.clone();
        let visible = Tracked::new(Closure::<dyn FnMut()>::new(move || {
            let doc = js::get(&js_sys::global(), "document")
                .map(JsCast::unchecked_into::<web_sys::Document>);
            if doc.is_some_and(|d| d.visibility_state() == VisibilityState::Visible) {
                with_session(&weak, |s, now| s.foreground(now));
            }
        }));
        let _ = global.add_event_listener_with_callback("online", online.function());
        let document = js::get(&global, "document")
            .filter(|d| js::get(d, "addEventListener").is_some())
            .map(JsCast::unchecked_into::<EventTarget>);
        if let Some(d) = &document {
            let _ = d.add_event_listener_with_callback("visibilitychange", visible.function());
        }
        Some(Self {
            global,
            document,
            online,
            visible,
        })
    }
}

impl Drop for PageListeners {
    fn drop(&mut self) {
        let _ = self
            .global
            .remove_event_listener_with_callback("online", self.online.function());
        if let Some(d) = &self.document {
            let _ =
                d.remove_event_listener_with_callback("visibilitychange", self.visible.function());
        }
    }
}

struct Inner {
    me: Weak<RefCell<Inner>>,
    opts: Options,
    session: Option<Session>,
    socket: Option<Socket>,
    /// Which socket the session is talking to: events of older ones are ignored.
    socket_gen: u64,
    socket_opened: bool,
    timer: Option<Timer>,
    page: Option<PageListeners>,
    /// `close()` came before `connect()` (no session to say so).
    closed: bool,
    queues: Vec<Rc<RefCell<EventQueue>>>,
    waiters: Vec<(Wait, Function, Function)>,
}

/// Runs `f` on the session of a live client, then drives it.
fn with_session(weak: &Weak<RefCell<Inner>>, f: impl FnOnce(&mut Session, Instant)) {
    let Some(rc) = weak.upgrade() else { return };
    {
        let mut inner = rc.borrow_mut();
        let Some(s) = inner.session.as_mut() else {
            return;
        };
        f(s, Instant::now());
    }
    drive(&rc);
}

/// Runs the session's output, then the app's callbacks (outside the borrow).
fn drive(rc: &Rc<RefCell<Inner>>) {
    let calls = rc.borrow_mut().step();
    invoke(rc, calls);
}

fn invoke(rc: &Rc<RefCell<Inner>>, calls: Calls) {
    for (f, args) in calls {
        let r = match args.as_slice() {
            [] => f.call0(&JsValue::UNDEFINED),
            [a] => f.call1(&JsValue::UNDEFINED, a),
            [a, b, ..] => f.call2(&JsValue::UNDEFINED, a, b),
        };
        if let Err(e) = r {
            // A throwing callback must not break the client: report it to
            // onError (unless onError itself threw), else to the console.
            let on_error = rc.borrow().opts.on_error.clone();
            let err = session_error(&SessionError::Callback(js::describe(&e)));
            match on_error {
                Some(h) if h != f => {
                    let _ = h.call1(&JsValue::UNDEFINED, &err);
                }
                _ => web_sys::console::error_2(&"mpush-sdk: a callback threw".into(), &e),
            }
        }
    }
}

/// An `Error` with the core's `code` (shared by every SDK) and `retryable`:
/// every error this SDK raises is one of the core's.
pub(crate) fn session_error(e: &SessionError) -> JsValue {
    let err = js::error(e.code(), &e.to_string());
    let _ = js_sys::Reflect::set(&err, &"retryable".into(), &e.retryable().into());
    err
}

/// A promise whose settle functions `f` keeps.
fn promise(f: impl FnOnce(Function, Function)) -> Promise {
    let mut settle = None;
    let p = Promise::new(&mut |resolve, reject| settle = Some((resolve, reject)));
    if let Some((resolve, reject)) = settle {
        f(resolve, reject);
    }
    p
}

fn message_object(m: Message) -> JsValue {
    js::object(&[
        ("id", (m.ack_id as f64).into()),
        (
            "messageId",
            m.message_id
                .map_or(JsValue::NULL, |id| id.to_string().into()),
        ),
        ("traceId", m.trace_id.into()),
        ("text", String::from_utf8_lossy(&m.content).as_ref().into()),
        ("data", Uint8Array::from(m.content.as_slice()).into()),
        ("needsAck", m.needs_ack.into()),
    ])
}

fn event(kind: &str, mut fields: Vec<(&str, JsValue)>) -> JsValue {
    fields.insert(0, ("type", kind.into()));
    js::object(&fields)
}

fn no_crypto(e: JsValue) -> JsValue {
    let why = format!(
        "this runtime has no crypto.getRandomValues: {}",
        js::describe(&e)
    );
    session_error(&SessionError::InvalidInput(why))
}

/// `onStateChange`'s detail: what the core's state carries.
fn state_detail(s: &SessionState) -> JsValue {
    match s {
        SessionState::Connecting { address } => js::object(&[("address", address.into())]),
        SessionState::Connected {
            address,
            resumed,
            v2,
        } => js::object(&[
            ("address", address.into()),
            ("resumed", (*resumed).into()),
            ("v2", (*v2).into()),
        ]),
        SessionState::Disconnected {
            reason,
            retry_in_ms,
        } => js::object(&[
            ("reason", reason.into()),
            ("retryInMs", (*retry_in_ms as f64).into()),
        ]),
        SessionState::Stopped { reason } => js::object(&[("reason", reason.into())]),
    }
}

impl Inner {
    fn ticket_key(&self) -> String {
        format!("{}.ticket", self.opts.storage_key)
    }

    /// Feeds the session's actions to the host and its events to the app,
    /// until it has nothing more to say; re-arms the timer.
    fn step(&mut self) -> Calls {
        let mut calls = Calls::new();
        let now = Instant::now();
        loop {
            if let Some(a) = self.session.as_mut().and_then(Session::poll_action) {
                self.act(a, now);
            } else if let Some(e) = self.session.as_mut().and_then(Session::poll_event) {
                self.on_event(e, &mut calls);
            } else {
                break;
            }
        }
        let deadline = self.session.as_ref().and_then(Session::poll_timeout);
        if let Some(t) = &mut self.timer {
            t.arm(deadline, now);
        }
        calls
    }

    fn act(&mut self, a: Action, now: Instant) {
        match a {
            Action::Open { address } => {
                self.socket = None;
                self.socket_gen += 1;
                self.socket_opened = false;
                let (weak, generation) = (self.me.clone(), self.socket_gen);
                let sink = move |e: SocketEvent| on_socket_event(&weak, generation, e);
                match Socket::open(&address, self.opts.websocket.as_ref(), sink) {
                    Ok(s) => self.socket = Some(s),
                    Err(e) => {
                        if let Some(s) = self.session.as_mut() {
                            s.handle_open_failed(&e, now);
                        }
                    }
                }
            }
            Action::Send(bytes) => {
                let failed = match &self.socket {
                    Some(s) => s.send(&bytes).err(),
                    None => None,
                };
                if let Some(e) = failed {
                    self.socket = None;
                    if let Some(s) = self.session.as_mut() {
                        s.handle_closed(&format!("send failed: {e}"), now);
                    }
                }
            }
            Action::Close => self.socket = None,
            Action::FetchServers { url } => {
                let weak = self.me.clone();
                wasm_bindgen_futures::spawn_local(async move {
                    let result = js::fetch_text(&url, ALLOCATOR_TIMEOUT_MS)
                        .await
                        .map(|text| parse_server_list(&text));
                    with_session(&weak, |s, now| s.handle_servers(result, now));
                });
            }
        }
    }

    fn on_event(&mut self, e: SessionEvent, calls: &mut Calls) {
        match e {
            SessionEvent::StateChanged(state) => {
                let (name, detail) = (state.name(), state_detail(&state));
                if let Some(f) = &self.opts.on_state_change {
                    calls.push((f.clone(), vec![name.into(), detail.clone()]));
                }
                let ev = event("state", vec![("state", name.into()), ("detail", detail)]);
                self.emit(ev, calls);
                if let SessionState::Connected { .. } = state {
                    self.settle(|w| matches!(w, Wait::Connected), Ok(()), calls);
                }
            }
            SessionEvent::Message(m) => {
                let msg = message_object(m);
                if let Some(f) = &self.opts.on_message {
                    calls.push((f.clone(), vec![msg.clone()]));
                }
                self.emit(event("message", vec![("message", msg)]), calls);
            }
            SessionEvent::Kicked { device_id, user_id } => {
                let info = js::object(&[
                    ("userId", user_id.clone().into()),
                    ("deviceId", device_id.clone().into()),
                ]);
                if let Some(f) = &self.opts.on_kicked {
                    calls.push((f.clone(), vec![info]));
                }
                let ev = event(
                    "kicked",
                    vec![("userId", user_id.into()), ("deviceId", device_id.into())],
                );
                self.emit(ev, calls);
            }
            SessionEvent::BindResult {
                user_id,
                ok,
                reason,
            } => {
                if ok {
                    self.emit(event("bound", vec![("userId", user_id.into())]), calls);
                } else {
                    let why = format!("the server refused to bind {user_id}: {reason}");
                    self.report(session_error(&SessionError::BindFailed(why)), calls);
                }
            }
            SessionEvent::TicketUpdated { ticket } => {
                if let Err(e) = self.opts.storage.save(&self.ticket_key(), &ticket) {
                    self.report(session_error(&SessionError::Storage(e)), calls);
                }
            }
            SessionEvent::Settled { request, result } => {
                self.settle(
                    |w| matches!(w, Wait::Request(r) if *r == request),
                    result,
                    calls,
                );
            }
            SessionEvent::Error { error } => self.report(session_error(&error), calls),
            SessionEvent::Stopped { reason } => self.shutdown(&reason, calls),
            _ => {}
        }
    }

    /// Settles the promises `which` picks with `result`.
    fn settle(
        &mut self,
        which: impl Fn(&Wait) -> bool,
        result: Result<(), SessionError>,
        calls: &mut Calls,
    ) {
        let err = result.as_ref().err().map(session_error);
        for (_, resolve, reject) in self.waiters.extract_if(.., |(w, ..)| which(w)) {
            match &err {
                None => calls.push((resolve, vec![])),
                Some(e) => calls.push((reject, vec![e.clone()])),
            }
        }
    }

    fn report(&mut self, err: JsValue, calls: &mut Calls) {
        if let Some(f) = &self.opts.on_error {
            calls.push((f.clone(), vec![err.clone()]));
        }
        self.emit(event("error", vec![("error", err)]), calls);
    }

    /// Hands an event to every open iterator.
    fn emit(&mut self, ev: JsValue, calls: &mut Calls) {
        self.queues.retain(|q| !q.borrow().is_done());
        let mut overflowed = false;
        for q in &self.queues {
            overflowed |= q.borrow_mut().push(ev.clone());
        }
        if overflowed && let Some(f) = &self.opts.on_error {
            let err = session_error(&SessionError::EventsOverflow);
            calls.push((f.clone(), vec![err]));
        }
    }

    /// Stopped for good (the core settled its requests): reject what still
    /// waits, end the iterators, free the socket, the timer and the page
    /// listeners.
    fn shutdown(&mut self, reason: &str, calls: &mut Calls) {
        if self.closed {
            return;
        }
        self.closed = true;
        if self.session.is_none() {
            // Closed before connect(): the core never ran, say it here.
            let state = SessionState::Stopped {
                reason: reason.to_owned(),
            };
            self.on_event(SessionEvent::StateChanged(state), calls);
        }
        let stopped = Err(SessionError::Stopped);
        self.settle(|_| true, stopped, calls);
        for q in self.queues.drain(..) {
            q.borrow_mut().end();
        }
        self.socket = None;
        self.timer = None;
        self.page = None;
    }

    fn state_name(&self) -> &'static str {
        match &self.session {
            Some(s) => s.state().name(),
            None if self.closed => "closed",
            None => "idle",
        }
    }
}

fn on_socket_event(weak: &Weak<RefCell<Inner>>, generation: u64, e: SocketEvent) {
    let Some(rc) = weak.upgrade() else { return };
    {
        let mut guard = rc.borrow_mut();
        let inner = &mut *guard;
        if inner.socket_gen != generation || inner.socket.is_none() {
            return;
        }
        let now = Instant::now();
        let Some(session) = inner.session.as_mut() else {
            return;
        };
        match e {
            SocketEvent::Opened => {
                inner.socket_opened = true;
                session.handle_opened(now);
            }
            SocketEvent::Data(d) => session.handle_input(&d, now),
            SocketEvent::Closed(reason) => {
                let was_open = inner.socket_opened;
                inner.socket = None;
                if was_open {
                    session.handle_closed(&reason, now);
                } else {
                    session.handle_open_failed(&reason, now);
                }
            }
        }
    }
    drive(&rc);
}

/// The browser push client. Create it, set callbacks (or iterate
/// `events()`), `connect()`, `bind()` a user; it reconnects by itself until
/// `close()`.
#[wasm_bindgen]
pub struct PushClient {
    inner: Rc<RefCell<Inner>>,
}

fn bytes_of(data: &JsValue) -> Option<Vec<u8>> {
    if let Some(s) = data.as_string() {
        return Some(s.into_bytes());
    }
    if let Some(a) = data.dyn_ref::<Uint8Array>() {
        return Some(a.to_vec());
    }
    data.dyn_ref::<ArrayBuffer>()
        .map(|b| Uint8Array::new(b).to_vec())
}

#[wasm_bindgen]
impl PushClient {
    /// Checks the options and prepares the client; nothing connects before `connect()`.
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(unchecked_param_type = "PushClientOptions")] options: JsValue,
    ) -> Result<PushClient, JsValue> {
        let invalid = |e: String| session_error(&SessionError::InvalidInput(e));
        let mut opts = Options::parse(&options).map_err(invalid)?;
        let device_key = format!("{}.deviceId", opts.storage_key);
        let device_id = match &opts.device_id {
            Some(d) => d.clone(),
            None => match opts.storage.load(&device_key) {
                Ok(Some(d)) => d,
                loaded => {
                    let seed = js::random_seed().map_err(no_crypto)?;
                    let id: String = seed[..16].iter().map(|b| format!("{b:02x}")).collect();
                    let id = format!("web-{id}");
                    if loaded.is_ok() {
                        // Best effort: without storage the id lasts this page.
                        let _ = opts.storage.save(&device_key, &id);
                    }
                    id
                }
            },
        };
        opts.session.device.device_id = device_id;
        opts.session.validate().map_err(|e| session_error(&e))?;
        let inner = Rc::new_cyclic(|me| {
            RefCell::new(Inner {
                me: me.clone(),
                opts,
                session: None,
                socket: None,
                socket_gen: 0,
                socket_opened: false,
                timer: None,
                page: None,
                closed: false,
                queues: Vec::new(),
                waiters: Vec::new(),
            })
        });
        Ok(PushClient { inner })
    }

    /// Starts connecting (and reconnecting, until `close()`). Resolves once
    /// connected; rejects if the client is closed first.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn connect(&self) -> Promise {
        if let Err(e) = self.start() {
            return Promise::reject(&e);
        }
        let state = self.inner.borrow().state_name();
        let p = match state {
            "connected" => Promise::resolve(&JsValue::UNDEFINED),
            "closed" => Promise::reject(&session_error(&SessionError::Stopped)),
            _ => self.wait(Wait::Connected),
        };
        drive(&self.inner);
        p
    }

    /// A promise the core's next word on `w` settles.
    fn wait(&self, w: Wait) -> Promise {
        promise(|resolve, reject| self.inner.borrow_mut().waiters.push((w, resolve, reject)))
    }

    /// Runs a command that returns a request id; the promise settles with it.
    fn request(
        &self,
        f: impl FnOnce(&mut Session, Instant) -> Result<u64, SessionError>,
    ) -> Promise {
        match self.command(f) {
            Ok(r) => {
                let p = self.wait(Wait::Request(r));
                // The core may have settled it already (an unbind, offline).
                drive(&self.inner);
                p
            }
            Err(e) => Promise::reject(&e),
        }
    }

    fn start(&self) -> Result<(), JsValue> {
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        if inner.session.is_some() || inner.closed {
            return Ok(());
        }
        let o = &inner.opts;
        let cfg = o.session.clone();
        let mut calls = Calls::new();
        let ticket = match o.storage.load(&inner.ticket_key()) {
            Ok(t) => t,
            Err(e) => {
                inner.report(session_error(&SessionError::Storage(e)), &mut calls);
                None
            }
        };
        let seed = js::random_seed().map_err(no_crypto)?;
        let weak = inner.me.clone();
        inner.timer = Some(Timer {
            callback: Tracked::new(Closure::<dyn FnMut()>::new(move || {
                if let Some(rc) = weak.upgrade() {
                    if let Some(t) = rc.borrow_mut().timer.as_mut() {
                        t.id = None;
                        t.at = None;
                    }
                    with_session(&weak, |s, now| s.handle_timeout(now));
                }
            })),
            id: None,
            at: None,
        });
        inner.page = PageListeners::install(&inner.me);
        inner.session = Some(Session::new(
            cfg,
            ticket.as_deref(),
            seed,
            Instant::now(),
            js::unix_ms(),
        ));
        drop(guard);
        invoke(&self.inner, calls);
        Ok(())
    }

    fn command<T>(
        &self,
        f: impl FnOnce(&mut Session, Instant) -> Result<T, SessionError>,
    ) -> Result<T, JsValue> {
        let r = {
            let mut inner = self.inner.borrow_mut();
            let Some(s) = inner.session.as_mut() else {
                let e = if inner.closed {
                    SessionError::Stopped
                } else {
                    SessionError::NotStarted
                };
                return Err(session_error(&e));
            };
            f(s, Instant::now())
        };
        r.map_err(|e| session_error(&e))
    }

    /// Binds a user (and re-binds it after every reconnect). Resolves when
    /// the server accepted it; rejects with `bind_failed` if it refused, or
    /// a newer bind or an unbind replaced it.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn bind(
        &self,
        #[wasm_bindgen(js_name = userId)] user_id: String,
        #[wasm_bindgen(unchecked_optional_param_type = "BindOptions")] options: Option<JsValue>,
    ) -> Promise {
        let options = options.unwrap_or(JsValue::UNDEFINED);
        let parsed = (|| {
            let tags = match js::get(&options, "tags") {
                None => String::new(),
                Some(t) if t.is_string() => t.as_string().unwrap_or_default(),
                Some(t) if Array::is_array(&t) => Array::from(&t)
                    .iter()
                    .map(|x| x.as_string().ok_or("options.tags must hold strings"))
                    .collect::<Result<Vec<_>, _>>()?
                    .join(","),
                Some(_) => return Err("options.tags must be a string or an array".into()),
            };
            let token = match js::get(&options, "token") {
                None => String::new(),
                Some(t) => t.as_string().ok_or("options.token must be a string")?,
            };
            Ok((tags, token))
        })();
        match parsed {
            Ok((tags, token)) => self.request(|s, now| s.bind(&user_id, &tags, &token, now)),
            Err(e) => Promise::reject(&session_error(&SessionError::InvalidInput(e))),
        }
    }

    /// Unbinds the user (no more re-binds); pending `bind()` promises
    /// reject. Resolves once the server was told.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn unbind(&self) -> Promise {
        self.request(|s, now| s.unbind(now))
    }

    /// Acknowledges a message the app has handled: the message, or its `id`.
    /// False when there is nothing to acknowledge (an AUTO message, which the
    /// SDK acknowledged already, or one acknowledged before).
    pub fn ack(
        &self,
        #[wasm_bindgen(unchecked_param_type = "PushMessage | number")] message: JsValue,
    ) -> Result<bool, JsValue> {
        let id = message
            .as_f64()
            .or_else(|| js::get(&message, "id").and_then(|v| v.as_f64()))
            .ok_or_else(|| {
                session_error(&SessionError::InvalidInput(
                    "ack() takes a message or its id".into(),
                ))
            })?;
        if !(id.is_finite() && id >= 0.0 && id.fract() == 0.0) {
            return Ok(false);
        }
        let r = self.command(|s, now| match s.ack(id as u64, now) {
            Err(SessionError::UnknownAck(_)) => Ok(false),
            r => r.map(|()| true),
        });
        drive(&self.inner);
        r
    }

    /// Sends a message up to the server (queued while offline). With
    /// `{ack: true}` (the default) resolves when the server acknowledged it.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn push(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string | Uint8Array | ArrayBuffer")] data: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "PushOptions")] options: Option<JsValue>,
    ) -> Promise {
        let options = options.unwrap_or(JsValue::UNDEFINED);
        let invalid =
            |m: &str| Promise::reject(&session_error(&SessionError::InvalidInput(m.into())));
        let Some(bytes) = bytes_of(&data) else {
            return invalid("data must be a string, a Uint8Array or an ArrayBuffer");
        };
        let mode = match js::get(&options, "ack").map(|v| v.as_bool()) {
            None | Some(Some(true)) => AckMode::Auto,
            Some(Some(false)) => AckMode::None,
            Some(None) => return invalid("options.ack must be a boolean"),
        };
        self.request(|s, now| s.push(&bytes, mode, now))
    }

    /// Closes for good: no more reconnects; pending promises reject.
    pub fn close(&self) {
        let calls = {
            let mut inner = self.inner.borrow_mut();
            match inner.session.as_mut() {
                Some(s) => {
                    s.close();
                    inner.step()
                }
                None => {
                    let mut calls = Calls::new();
                    inner.shutdown("closed by the app", &mut calls);
                    calls
                }
            }
        };
        invoke(&self.inner, calls);
    }

    /// An async iterator over every event from now on:
    /// `for await (const e of client.events()) { ... }`. It ends when the client closes.
    #[wasm_bindgen(unchecked_return_type = "AsyncIterableIterator<PushEvent>")]
    pub fn events(&self) -> JsValue {
        let q = Rc::new(RefCell::new(EventQueue::default()));
        {
            let mut inner = self.inner.borrow_mut();
            if inner.closed {
                q.borrow_mut().end();
            } else {
                inner.queues.push(q.clone());
            }
        }
        EventIterator::create(q)
    }

    #[wasm_bindgen(getter, unchecked_return_type = "ConnectionState")]
    pub fn state(&self) -> String {
        self.inner.borrow().state_name().to_owned()
    }

    #[wasm_bindgen(getter, js_name = deviceId)]
    pub fn device_id(&self) -> String {
        self.inner.borrow().opts.session.device.device_id.clone()
    }

    #[wasm_bindgen(getter = onMessage, unchecked_return_type = "((message: PushMessage) => void) | null")]
    pub fn on_message(&self) -> Option<Function> {
        self.inner.borrow().opts.on_message.clone()
    }

    #[wasm_bindgen(setter = onMessage)]
    pub fn set_on_message(
        &self,
        #[wasm_bindgen(unchecked_param_type = "((message: PushMessage) => void) | null")] f: Option<
            Function,
        >,
    ) {
        self.inner.borrow_mut().opts.on_message = f;
    }

    #[wasm_bindgen(getter = onStateChange, unchecked_return_type = "((state: ConnectionState, detail: StateDetail) => void) | null")]
    pub fn on_state_change(&self) -> Option<Function> {
        self.inner.borrow().opts.on_state_change.clone()
    }

    #[wasm_bindgen(setter = onStateChange)]
    pub fn set_on_state_change(
        &self,
        #[wasm_bindgen(
            unchecked_param_type = "((state: ConnectionState, detail: StateDetail) => void) | null"
        )]
        f: Option<Function>,
    ) {
        self.inner.borrow_mut().opts.on_state_change = f;
    }

    #[wasm_bindgen(getter = onKicked, unchecked_return_type = "((info: KickInfo) => void) | null")]
    pub fn on_kicked(&self) -> Option<Function> {
        self.inner.borrow().opts.on_kicked.clone()
    }

    #[wasm_bindgen(setter = onKicked)]
    pub fn set_on_kicked(
        &self,
        #[wasm_bindgen(unchecked_param_type = "((info: KickInfo) => void) | null")] f: Option<
            Function,
        >,
    ) {
        self.inner.borrow_mut().opts.on_kicked = f;
    }

    #[wasm_bindgen(getter = onError, unchecked_return_type = "((error: PushError) => void) | null")]
    pub fn on_error(&self) -> Option<Function> {
        self.inner.borrow().opts.on_error.clone()
    }

    #[wasm_bindgen(setter = onError)]
    pub fn set_on_error(
        &self,
        #[wasm_bindgen(unchecked_param_type = "((error: PushError) => void) | null")] f: Option<
            Function,
        >,
    ) {
        self.inner.borrow_mut().opts.on_error = f;
    }
}
