//! The browser SDK in headless Chromium against a real mpush-server.
//!
//! Run through `scripts/test-web` (or by hand:
//! `node tools/web/with-server.mjs -- cargo test -p mpush-sdk-wasm --target wasm32-unknown-unknown`
//! with `CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner`
//! and `CHROMEDRIVER=/usr/bin/chromedriver`): the harness starts the server
//! and passes its addresses at compile time.
#![cfg(target_arch = "wasm32")]

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, Function, JSON, Object, Promise, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

// The package's driver (js/client.js) over this build's core, as an app
// gets it from `mpush-sdk`: the tests use the JavaScript API.
#[wasm_bindgen(module = "/js/client.js")]
extern "C" {
    #[wasm_bindgen(js_name = makeClient)]
    fn make_client(wasm: &JsValue) -> Function;
    #[wasm_bindgen(js_name = liveHandles)]
    fn live_handles_js() -> Vec<u32>;
}

#[wasm_bindgen]
extern "C" {
    type PushClient;
    #[wasm_bindgen(method)]
    fn connect(this: &PushClient) -> Promise;
    #[wasm_bindgen(method)]
    fn bind(this: &PushClient, user_id: String, options: Option<JsValue>) -> Promise;
    #[wasm_bindgen(method, catch)]
    fn ack(this: &PushClient, message: JsValue) -> Result<bool, JsValue>;
    #[wasm_bindgen(method)]
    fn push(this: &PushClient, data: JsValue, options: Option<JsValue>) -> Promise;
    #[wasm_bindgen(method)]
    fn close(this: &PushClient);
    #[wasm_bindgen(method)]
    fn events(this: &PushClient) -> JsValue;
    #[wasm_bindgen(method, getter)]
    fn state(this: &PushClient) -> String;
    #[wasm_bindgen(method, getter, js_name = deviceId)]
    fn device_id(this: &PushClient) -> String;
}

thread_local! {
    static CLASS: Function = make_client(&mpush_sdk_wasm::module_for_tests());
}

impl PushClient {
    /// `new PushClient(options)`.
    fn new(options: JsValue) -> Result<PushClient, JsValue> {
        CLASS.with(|c| Reflect::construct(c, &Array::of1(&options)).map(JsCast::unchecked_into))
    }
}

/// Open sockets, and handlers and timers registered, of every client.
fn live_handles() -> (usize, usize) {
    let v = live_handles_js();
    (v[0] as usize, v[1] as usize)
}

const WS: Option<&str> = option_env!("MPUSH_TEST_WS");
const API: Option<&str> = option_env!("MPUSH_TEST_API");
const CONTROL: Option<&str> = option_env!("MPUSH_TEST_CONTROL");
/// A second server with TLS on its WebSocket gateway (with-server.mjs --wss).
const WSS: Option<&str> = option_env!("MPUSH_TEST_WSS");
const WSS_API: Option<&str> = option_env!("MPUSH_TEST_WSS_API");

fn ws() -> &'static str {
    WS.expect("MPUSH_TEST_WS is not set: run these tests through scripts/test-web")
}

fn api() -> &'static str {
    API.expect("MPUSH_TEST_API is not set: run these tests through scripts/test-web")
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_name = fetch)]
    fn fetch(url: &str, init: &JsValue) -> Promise;
    #[wasm_bindgen(js_name = setTimeout)]
    fn set_timeout(f: &Function, ms: f64);
}

async fn sleep(ms: u32) {
    let p = Promise::new(&mut |resolve, _| set_timeout(&resolve, f64::from(ms)));
    let _ = JsFuture::from(p).await;
}

fn get(o: &JsValue, key: &str) -> JsValue {
    Reflect::get(o, &key.into()).unwrap_or(JsValue::UNDEFINED)
}

fn set(o: &JsValue, key: &str, v: impl Into<JsValue>) {
    let _ = Reflect::set(o, &key.into(), &v.into());
}

fn json(text: &str) -> JsValue {
    JSON::parse(text).expect("valid JSON")
}

async fn http(method: &str, path: &str, body: Option<JsValue>) -> (u16, JsValue) {
    http_at(api(), method, path, body).await
}

async fn http_at(base: &str, method: &str, path: &str, body: Option<JsValue>) -> (u16, JsValue) {
    let init = Object::new();
    set(&init, "method", method);
    if let Some(b) = body {
        let headers = Object::new();
        set(&headers, "content-type", "application/json");
        set(&init, "headers", headers);
        set(
            &init,
            "body",
            JSON::stringify(&b).expect("stringify").as_string(),
        );
    }
    let resp = JsFuture::from(fetch(&format!("{base}{path}"), &init))
        .await
        .expect("the API answers");
    let status = get(&resp, "status").as_f64().unwrap_or(0.0) as u16;
    let json_fn: Function = get(&resp, "json").dyn_into().expect("json()");
    let parsed = JsFuture::from(Promise::from(json_fn.call0(&resp).expect("json() runs")))
        .await
        .unwrap_or(JsValue::NULL);
    (status, parsed)
}

/// What the harness's webhook receiver got: (events, bad signatures).
async fn webhook_events() -> (Vec<JsValue>, u32) {
    let url = format!(
        "{}/webhook/events",
        CONTROL.expect("MPUSH_TEST_CONTROL is not set: run these tests through scripts/test-web")
    );
    let resp = JsFuture::from(fetch(&url, &Object::new()))
        .await
        .expect("the receiver answers");
    let json_fn: Function = get(&resp, "json").dyn_into().expect("json()");
    let v = JsFuture::from(Promise::from(json_fn.call0(&resp).expect("json() runs")))
        .await
        .expect("JSON");
    let events = js_sys::Array::from(&get(&v, "events")).iter().collect();
    (
        events,
        get(&v, "badSignatures").as_f64().unwrap_or(-1.0) as u32,
    )
}

/// Pushes through the server's HTTP API; returns the trace id.
async fn api_push(user: &str, content: &str, ack_mode: &str) -> String {
    let body = Object::new();
    set(&body, "userId", user);
    set(&body, "content", content);
    set(&body, "ackMode", ack_mode);
    let (status, r) = http("POST", "/api/v1/push", Some(body.into())).await;
    assert_eq!(status, 200, "push: {:?}", JSON::stringify(&r));
    get(&r, "traceId").as_string().expect("traceId")
}

/// The trace's state for the first recipient, and how many times it was sent.
async fn trace(trace_id: &str) -> (String, usize) {
    let (_, t) = http("GET", &format!("/api/v1/traces/{trace_id}"), None).await;
    let r0 = js_sys::Array::from(&get(&t, "recipients")).get(0);
    let state = get(&r0, "state").as_string().unwrap_or_default();
    let sends = js_sys::Array::from(&get(&r0, "history"))
        .iter()
        .filter(|h| {
            let s = JSON::stringify(h)
                .ok()
                .and_then(|s| s.as_string())
                .unwrap_or_default();
            s.contains("DISPATCHED")
        })
        .count();
    (state, sends)
}

async fn wait_until(what: &str, ms: u32, mut f: impl FnMut() -> bool) {
    let mut waited = 0;
    while !f() {
        assert!(waited < ms, "timed out after {ms} ms waiting for {what}");
        sleep(20).await;
        waited += 20;
    }
}

async fn await_promise(p: Promise) -> Result<JsValue, JsValue> {
    JsFuture::from(p).await
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        js_sys::Math::random().to_bits() % 1_000_000_007
    )
}

/// Collects what the callbacks see.
#[derive(Default)]
struct Seen {
    messages: Vec<JsValue>,
    states: Vec<(String, JsValue)>,
    kicked: Vec<JsValue>,
    errors: Vec<JsValue>,
}

type Keep = Vec<Closure<dyn FnMut(JsValue, JsValue)>>;

/// Options with callbacks recording into `seen`. Storage in memory unless `storage` given.
fn options(extra: &str, seen: &Rc<RefCell<Seen>>, keep: &mut Keep) -> JsValue {
    let o = json(extra);
    set(&o, "servers", ws());
    let mk = |seen: &Rc<RefCell<Seen>>, kind: &'static str| {
        let seen = seen.clone();
        Closure::<dyn FnMut(JsValue, JsValue)>::new(move |a: JsValue, b: JsValue| {
            let mut s = seen.borrow_mut();
            match kind {
                "message" => s.messages.push(a),
                "state" => s.states.push((a.as_string().unwrap_or_default(), b)),
                "kicked" => s.kicked.push(a),
                _ => s.errors.push(a),
            }
        })
    };
    for (key, kind) in [
        ("onMessage", "message"),
        ("onStateChange", "state"),
        ("onKicked", "kicked"),
        ("onError", "error"),
    ] {
        let c = mk(seen, kind);
        set(&o, key, c.as_ref().clone());
        keep.push(c);
    }
    o
}

fn texts(seen: &Rc<RefCell<Seen>>) -> Vec<String> {
    seen.borrow()
        .messages
        .iter()
        .map(|m| get(m, "text").as_string().unwrap_or_default())
        .collect()
}

#[wasm_bindgen_test]
async fn connect_bind_receive_ack_and_deduplicate_a_retried_message() {
    let seen = Rc::new(RefCell::new(Seen::default()));
    let mut keep = Keep::new();
    let client =
        PushClient::new(options(r#"{"storage": null}"#, &seen, &mut keep)).expect("valid options");
    assert_eq!(client.state(), "idle");
    await_promise(client.connect()).await.expect("connects");
    assert_eq!(client.state(), "connected");
    let connected = seen
        .borrow()
        .states
        .iter()
        .find(|(s, _)| s == "connected")
        .map(|(_, d)| d.clone())
        .expect("a connected state change");
    assert_eq!(get(&connected, "v2").as_bool(), Some(true), "v2 by default");

    let user = unique("web-user");
    let bind_opts = json(r#"{"tags": ["web", "beta"]}"#);
    await_promise(client.bind(user.clone(), Some(bind_opts)))
        .await
        .expect("bound");
    let (_, u) = http("GET", &format!("/api/v1/users/{user}"), None).await;
    assert_eq!(get(&u, "online").as_bool(), Some(true));

    // AUTO: delivered and acknowledged by the SDK itself.
    let t1 = api_push(&user, "hello browser", "auto").await;
    wait_until("the auto message", 5000, || {
        !seen.borrow().messages.is_empty()
    })
    .await;
    let m = seen.borrow().messages[0].clone();
    assert_eq!(
        get(&m, "text").as_string().as_deref(),
        Some("hello browser")
    );
    assert_eq!(get(&m, "needsAck").as_bool(), Some(false));
    assert!(
        get(&m, "messageId").is_string(),
        "v2 messages carry the server's id"
    );
    assert_eq!(get(&m, "traceId").as_string(), Some(t1.clone()));
    // The SDK acknowledged receipt: the server records ACK ("by the SDK").
    for _ in 0..100 {
        if trace(&t1).await.0 == "ACK" {
            break;
        }
        sleep(20).await;
    }
    assert_eq!(
        trace(&t1).await.0,
        "ACK",
        "the SDK acknowledged the AUTO push"
    );
    assert!(
        !client.ack(m.clone()).expect("ack"),
        "AUTO: nothing left to ack"
    );

    // BIZ: not acknowledged until the app says so; the server retries
    // (every 300 ms here) and the retries are dropped as duplicates.
    let t2 = api_push(&user, "handle me", "biz").await;
    wait_until("the biz message", 5000, || {
        seen.borrow().messages.len() == 2
    })
    .await;
    // Two resends (at 300 and 600 ms), well before the server gives up (1200 ms).
    for _ in 0..40 {
        if trace(&t2).await.1 >= 3 {
            break;
        }
        sleep(20).await;
    }
    let (state, sends) = trace(&t2).await;
    assert_ne!(state, "ACK");
    assert!(sends >= 3, "the server resent the message ({sends} sends)");
    assert_eq!(
        texts(&seen),
        vec!["hello browser", "handle me"],
        "the retried copies were deduplicated"
    );
    let m2 = seen.borrow().messages[1].clone();
    assert_eq!(get(&m2, "needsAck").as_bool(), Some(true));
    let id = get(&m2, "id");
    assert!(id.as_f64().is_some(), "ids are numbers");
    assert!(client.ack(m2.clone()).expect("ack"), "the first ack sends");
    assert!(
        !client.ack(id).expect("ack"),
        "a second ack has nothing to do"
    );
    let bad = client.ack("nope".into()).expect_err("not a message");
    assert_eq!(
        get(&bad, "code").as_string().as_deref(),
        Some("invalid_input")
    );
    for _ in 0..100 {
        if trace(&t2).await.0 == "ACK" {
            break;
        }
        sleep(20).await;
    }
    assert_eq!(trace(&t2).await.0, "ACK");
    assert!(seen.borrow().errors.is_empty());

    client.close();
    assert_eq!(client.state(), "closed");
    assert_eq!(live_handles(), (0, 0), "socket, timer and listeners freed");
    let err = await_promise(client.connect()).await.expect_err("closed");
    assert_eq!(get(&err, "code").as_string().as_deref(), Some("stopped"));
}

/// Many failed attempts in a row: each attempt's socket and handlers are
/// freed before the next, and `close()` frees the rest.
#[wasm_bindgen_test]
async fn reconnect_attempts_free_their_sockets_and_handlers() {
    let seen = Rc::new(RefCell::new(Seen::default()));
    let mut keep = Keep::new();
    let o = options(
        r#"{"storage": null, "backoff": {"initialMs": 20, "maxMs": 40, "jitter": 0}}"#,
        &seen,
        &mut keep,
    );
    // Port 9 (discard) on loopback: nothing listens, every attempt fails.
    set(&o, "servers", "ws://127.0.0.1:9/");
    let client = PushClient::new(o).expect("valid options");
    let _ = client.connect();
    let mut most = (0, 0);
    for _ in 0..40 {
        sleep(25).await;
        let (s, c) = live_handles();
        most = (most.0.max(s), most.1.max(c));
    }
    let failures = seen
        .borrow()
        .states
        .iter()
        .filter(|(s, _)| s == "disconnected")
        .count();
    assert!(failures >= 5, "only {failures} attempts");
    assert!(most.0 <= 1, "at most one socket at a time, saw {}", most.0);
    // 4 socket handlers + the timer + 2 page listeners.
    assert!(most.1 <= 7, "handlers pile up: {}", most.1);
    client.close();
    assert_eq!(live_handles(), (0, 0));
}

/// Up-pushes made while offline wait in the queue, the async iterator sees
/// every event, a kick ends the session, the ticket in localStorage lets the
/// next client fast-connect.
#[wasm_bindgen_test]
async fn offline_queue_events_iterator_kick_and_fast_connect() {
    let storage_key = unique("mpush-test");
    let seen = Rc::new(RefCell::new(Seen::default()));
    let mut keep = Keep::new();
    let o = options("{}", &seen, &mut keep);
    set(&o, "storageKey", storage_key.as_str());
    let client = PushClient::new(o).expect("valid options");
    let events = client.events();
    let next: Function = get(&events, "next").dyn_into().expect("next()");
    assert!(
        Reflect::get(&events, &js_sys::Symbol::async_iterator()).is_ok_and(|f| f.is_function()),
        "events() is async-iterable"
    );

    // Before connect(): commands are refused clearly.
    let refused = await_promise(client.push("x".into(), None))
        .await
        .expect_err("refused");
    assert_eq!(
        get(&refused, "code").as_string().as_deref(),
        Some("invalid_state")
    );
    // Queued while connecting, sent once connected (after the bind), resolved
    // once the server accepted it: by then the backend's webhook has it,
    // exactly as sent, with a valid signature.
    let _ = client.connect();
    let user = unique("web-kick");
    let bound = client.bind(user.clone(), None);
    let up = client.push("queued while offline ✓".into(), None);
    await_promise(up)
        .await
        .expect("the server accepted the queued push");
    await_promise(bound).await.expect("bound");
    let (hooked, bad) = webhook_events().await;
    assert_eq!(bad, 0, "every webhook signature verifies");
    let mine: Vec<&JsValue> = hooked
        .iter()
        .filter(|e| get(e, "userId").as_string().as_deref() == Some(user.as_str()))
        .collect();
    assert_eq!(mine.len(), 1, "the up-push arrived once");
    assert_eq!(
        get(mine[0], "content").as_string().as_deref(),
        Some("queued while offline ✓")
    );
    assert_eq!(get(mine[0], "type").as_string().as_deref(), Some("up_push"));
    api_push(&user, "via iterator", "auto").await;
    let mut kinds = Vec::new();
    loop {
        let r = await_promise(next.call0(&events).expect("next").into())
            .await
            .expect("next resolves");
        let ev = get(&r, "value");
        let kind = get(&ev, "type").as_string().unwrap_or_default();
        kinds.push(kind.clone());
        if kind == "message" {
            let m = get(&ev, "message");
            assert_eq!(get(&m, "text").as_string().as_deref(), Some("via iterator"));
            break;
        }
        assert!(kinds.len() < 20, "{kinds:?}");
    }
    assert!(kinds.contains(&"bound".to_owned()), "{kinds:?}");
    assert!(kinds.contains(&"state".to_owned()), "{kinds:?}");

    // The ticket is in localStorage now.
    let local = get(&js_sys::global(), "localStorage");
    let get_item: Function = get(&local, "getItem").dyn_into().expect("getItem");
    let ticket = get_item
        .call1(&local, &format!("{storage_key}.ticket").into())
        .expect("getItem")
        .as_string()
        .unwrap_or_default();
    assert!(ticket.starts_with("v2,"), "ticket {ticket:?}");
    let device = client.device_id();
    assert!(device.starts_with("web-"), "{device}");

    // A kick through the API: onKicked; the server closes the connection and
    // the client reconnects without binding the kicked user again.
    let (status, _) = http(
        "POST",
        &format!("/api/v1/users/{user}/kick"),
        Some(json("{}")),
    )
    .await;
    assert_eq!(status, 200);
    wait_until("the kick", 5000, || !seen.borrow().kicked.is_empty()).await;
    let k = seen.borrow().kicked[0].clone();
    assert_eq!(get(&k, "userId").as_string(), Some(user.clone()));
    assert_eq!(get(&k, "deviceId").as_string(), Some(device.clone()));
    let reconnected = || {
        let s = seen.borrow();
        s.states.iter().filter(|(s, _)| s == "connected").count() >= 2
    };
    wait_until("the reconnect", 5000, reconnected).await;
    sleep(300).await;
    let (_, u) = http("GET", &format!("/api/v1/users/{user}"), None).await;
    assert_eq!(get(&u, "online").as_bool(), Some(false), "not re-bound");

    // close() ends the iterator once its queued events are read.
    client.close();
    for _ in 0..50 {
        let r = await_promise(next.call0(&events).expect("next").into())
            .await
            .expect("next resolves");
        if get(&r, "done").as_bool() == Some(true) {
            break;
        }
    }
    let r = await_promise(next.call0(&events).expect("next").into())
        .await
        .expect("next resolves");
    assert_eq!(get(&r, "done").as_bool(), Some(true), "the iterator ended");

    // Same storage key: same device, and the session resumes (fast connect).
    let seen2 = Rc::new(RefCell::new(Seen::default()));
    let o = options("{}", &seen2, &mut keep);
    set(&o, "storageKey", storage_key.as_str());
    let again = PushClient::new(o).expect("valid options");
    assert_eq!(again.device_id(), device, "the device id persisted");
    await_promise(again.connect()).await.expect("connects");
    let resumed = seen2
        .borrow()
        .states
        .iter()
        .find(|(s, _)| s == "connected")
        .map(|(_, d)| get(d, "resumed").as_bool());
    assert_eq!(
        resumed,
        Some(Some(true)),
        "fast connect with the stored ticket"
    );
    again.close();
    assert_eq!(live_handles(), (0, 0));
}

/// ADR 0005 in the browser: over `wss://` to a server with a TLS listener (its
/// self-signed certificate made by the harness), the SDK connects on the
/// transport-secured profile (its ticket says `vt,`), binds and gets a push.
#[wasm_bindgen_test]
async fn over_wss_the_transport_secured_profile_connects_binds_and_receives() {
    let (Some(wss), Some(wss_api)) = (WSS, WSS_API) else {
        panic!("MPUSH_TEST_WSS is not set: run these tests through scripts/test-web");
    };
    let store = Object::new();
    let items = Rc::new(RefCell::new(Vec::<(String, String)>::new()));
    let keep = items.clone();
    let set_item = Closure::<dyn FnMut(String, String)>::new(move |k: String, v: String| {
        keep.borrow_mut().push((k, v));
    });
    let get_item = Closure::<dyn FnMut(String) -> JsValue>::new(|_: String| JsValue::NULL);
    let remove_item = Closure::<dyn FnMut(String)>::new(|_: String| {});
    set(&store, "getItem", get_item.as_ref().clone());
    set(&store, "setItem", set_item.as_ref().clone());
    set(&store, "removeItem", remove_item.as_ref().clone());
    let got = Rc::new(RefCell::new(Vec::<String>::new()));
    let sink = got.clone();
    let on_message = Closure::<dyn FnMut(JsValue)>::new(move |m: JsValue| {
        sink.borrow_mut()
            .push(get(&m, "text").as_string().unwrap_or_default());
    });
    let opts = Object::new();
    set(&opts, "servers", wss);
    set(&opts, "storage", store);
    set(&opts, "deviceId", "wss-browser-1");
    set(&opts, "onMessage", on_message.as_ref().clone());
    let client = PushClient::new(opts.into()).expect("valid options");
    await_promise(client.connect())
        .await
        .expect("connected over wss://");
    await_promise(client.bind("wss-user".into(), None))
        .await
        .expect("bound");
    let ticket = items
        .borrow()
        .iter()
        .rev()
        .find(|(k, _)| k.ends_with(".ticket"))
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    assert!(
        ticket.starts_with("vt,"),
        "a transport-profile session: {ticket}"
    );
    let (status, _) = http_at(
        wss_api,
        "POST",
        "/api/v1/push",
        Some(json(
            r#"{"userId": "wss-user", "content": "over wss", "ackMode": "auto"}"#,
        )),
    )
    .await;
    assert_eq!(status, 200);
    wait_until("the push over wss://", 5000, || {
        got.borrow().iter().any(|t| t == "over wss")
    })
    .await;
    client.close();
}

/// The one (error, code) table of every SDK, as this SDK hands errors to JS.
#[wasm_bindgen_test]
fn every_error_has_the_shared_code_and_retryable_flag() {
    let table = json(include_str!("../../sdk-core/testdata/error-codes.json"));
    let rows = js_sys::Array::from(&get(&table, "errors"));
    let errors = mpush_sdk_wasm::error_table();
    assert_eq!(rows.length() as usize, errors.len());
    for (row, e) in rows.iter().zip(&errors) {
        assert!(e.is_instance_of::<js_sys::Error>(), "an Error");
        assert_eq!(get(e, "code").as_string(), get(&row, "code").as_string());
        assert_eq!(
            get(e, "retryable").as_bool(),
            get(&row, "retryable").as_bool()
        );
    }
}

#[wasm_bindgen_test]
fn bad_options_are_refused_with_the_field_named() {
    for (opts, field) in [
        (r#"{}"#, "servers or allocator_url"),
        (r#"{"servers": "tcp://x:1"}"#, "options.servers"),
        (
            r#"{"servers": ["ws://a/"], "backoff": {"jitter": 2}}"#,
            "jitter",
        ),
        (
            r#"{"servers": "ws://a/", "heartbeatMs": "soon"}"#,
            "options.heartbeatMs",
        ),
        (
            r#"{"servers": "ws://a/", "storage": {"getItem": 1}}"#,
            "options.storage",
        ),
        (
            r#"{"servers": "ws://a/", "publicKey": "not a key"}"#,
            "options.publicKey",
        ),
        (
            r#"{"servers": "ws://a/", "onMessage": 3}"#,
            "options.onMessage",
        ),
    ] {
        let err = PushClient::new(json(opts)).err().expect("refused");
        assert_eq!(
            get(&err, "code").as_string().as_deref(),
            Some("invalid_input"),
            "{opts}"
        );
        let msg = get(&err, "message").as_string().unwrap_or_default();
        assert!(msg.contains(field), "{opts}: {msg}");
    }
}
