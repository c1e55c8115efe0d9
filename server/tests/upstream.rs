//! Client → backend and delivery callbacks, end to end: real SDK clients
//! (native over TCP and WebSocket, a legacy mpush client, mpush's JSON
//! form), a real HTTP receiver that checks every signature, and a real
//! redis-server for the stream sink.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use common::*;
use hmac::{KeyInit, Mac};
use mpush_protocol::client::ClientEvent;
use mpush_protocol::message::ErrorCode;
use mpush_sdk_core::SessionEvent;
use mpush_sdk_core::native::{Client, ClientOptions};
use mpush_sdk_core::session::SessionConfig;
use mpush_server::config::{SinkEvent, StreamSink, Webhook, WebhookMode};
use mpush_server::{Running, Settings};
use parking_lot::Mutex;
use serde_json::{Value, json};

const SECRET: &str = "webhook-secret-0123456789";

/// A webhook receiver: checks `X-Mpush-Signature` (HMAC-SHA256 over
/// "timestamp.body") and the timestamp's age, keeps the events; can fail the
/// next N requests with 503, or stop listening altogether.
struct Receiver {
    addr: SocketAddr,
    state: Arc<RxState>,
    task: Option<tokio::task::JoinHandle<()>>,
}

#[derive(Default)]
struct RxState {
    events: Mutex<Vec<Value>>,
    requests: AtomicUsize,
    bad_signatures: AtomicUsize,
    fail_next: AtomicUsize,
    failing: AtomicBool,
    /// Each POST takes this long to answer (a slow backend).
    delay_ms: std::sync::atomic::AtomicU64,
}

impl Receiver {
    async fn start() -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let mut r = Self {
            addr: l.local_addr().expect("addr"),
            state: Arc::default(),
            task: None,
        };
        r.serve(l);
        r
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn serve(&mut self, l: tokio::net::TcpListener) {
        let st = self.state.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |h: HeaderMap, body: Bytes| {
                let st = st.clone();
                async move {
                    let delay = st.delay_ms.load(Ordering::Relaxed);
                    if delay > 0 {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                    }
                    st.take(&h, &body)
                }
            }),
        );
        self.task = Some(tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        }));
    }

    /// Stops listening: connections are refused until `restart`.
    fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    async fn restart(&mut self) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let l = tokio::net::TcpListener::bind(self.addr)
            .await
            .expect("rebind");
        self.serve(l);
    }

    fn events(&self, kind: &str) -> Vec<Value> {
        self.state
            .events
            .lock()
            .iter()
            .filter(|e| e["type"] == kind)
            .cloned()
            .collect()
    }

    /// Waits until `n` events of `kind` arrived (and returns them all).
    async fn wait(&self, kind: &str, n: usize) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let got = self.events(kind);
            if got.len() >= n {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{n} `{kind}` events expected; got {got:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

impl RxState {
    fn take(&self, h: &HeaderMap, body: &[u8]) -> StatusCode {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let header = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).unwrap_or("");
        let ts = header("x-mpush-timestamp");
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).expect("key");
        mac.update(ts.as_bytes());
        mac.update(b".");
        mac.update(body);
        let expected = format!("v1={}", hex::encode(mac.finalize().into_bytes()));
        let age = ts
            .parse::<i64>()
            .map(|t| (unix_ms() / 1000 - t).abs())
            .unwrap_or(i64::MAX);
        if header("x-mpush-signature") != expected || age > 300 {
            self.bad_signatures.fetch_add(1, Ordering::Relaxed);
            return StatusCode::UNAUTHORIZED;
        }
        if self.failing.load(Ordering::Relaxed)
            || self
                .fail_next
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
        {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        let v: Value = serde_json::from_slice(body).expect("a JSON body");
        let events = v["events"].as_array().expect("events").clone();
        self.events.lock().extend(events);
        StatusCode::NO_CONTENT
    }
}

fn webhook(url: &str, events: &[SinkEvent], mode: WebhookMode) -> Webhook {
    Webhook {
        url: url.into(),
        secret: SECRET.into(),
        events: events.to_vec(),
        mode,
        max_backoff_ms: 300,
        ..Webhook::default()
    }
}

fn with_webhook(rx: &Receiver, events: &[SinkEvent], mode: WebhookMode) -> Settings {
    let mut s = settings();
    s.sinks.webhooks = vec![webhook(&rx.url(), events, mode)];
    s
}

/// A native SDK client (the core's tokio driver), bound to `user`.
async fn sdk_client(address: String, device_id: &str, user: &str) -> Client {
    let key = Arc::new(mpush_protocol::crypto::RsaPublic::mpush_default());
    let mut cfg = SessionConfig::new(vec![address], key, device(device_id, "android"));
    cfg.backoff.initial = Duration::from_millis(100);
    cfg.backoff.max = Duration::from_millis(500);
    let c = Client::connect(ClientOptions {
        session: cfg,
        ticket_store: None,
    })
    .expect("valid options");
    c.bind(user, "", "").await.expect("bind");
    c
}

async fn wait_sdk(c: &mut Client, what: &str, f: impl Fn(&SessionEvent) -> bool) -> SessionEvent {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let e = tokio::time::timeout_at(deadline, c.next_event())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .unwrap_or_else(|| panic!("client ended before {what}"));
        if f(&e) {
            return e;
        }
    }
}

async fn bound_sdk(address: String, device_id: &str, user: &str) -> Client {
    let mut c = sdk_client(address, device_id, user).await;
    wait_sdk(&mut c, "bound", |e| {
        matches!(e, SessionEvent::BindResult { ok: true, .. })
    })
    .await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn up_pushes_from_every_client_arrive_signed_and_exactly_as_sent() {
    let rx = Receiver::start().await;
    let server = start(with_webhook(
        &rx,
        &[SinkEvent::UpPush, SinkEvent::Lifecycle],
        WebhookMode::Sync,
    ))
    .await;

    // The native SDK over TCP (v2) and over WebSocket.
    let tcp = bound_sdk(server.tcp.to_string(), "phone-1", "alice").await;
    let ws = bound_sdk(format!("ws://{}/", server.ws.expect("ws")), "tab-1", "bob").await;
    tcp.push(
        "héllo from tcp".as_bytes(),
        mpush_protocol::session::AckMode::Auto,
    )
    .await
    .expect("accepted");
    let binary = [0u8, 159, 146, 150, 255];
    ws.push(&binary, mpush_protocol::session::AckMode::Auto)
        .await
        .expect("accepted");

    // A legacy mpush client (binary, no message ids).
    let mut legacy = bound(
        &server,
        Via::Tcp,
        false,
        device("legacy-1", "ios"),
        "carol",
        "",
    )
    .await;
    legacy.push_up(b"from mpush 0.8.1");
    legacy
        .wait_for("ACK", |e| matches!(e, ClientEvent::PushAcked { .. }))
        .await;

    // mpush's JavaScript client (JSON over WebSocket).
    let mut js = JsonClient::connect(&server).await;
    js.send(json!({"cmd": 2, "flags": 16, "sessionId": 1, "body": {"deviceId": "js-1", "osName": "web", "osVersion": "x", "clientVersion": "1"}})).await;
    js.recv().await;
    js.send(json!({"cmd": 5, "flags": 16, "sessionId": 2, "body": {"userId": "dave"}}))
        .await;
    js.recv().await;
    js.send(
        json!({"cmd": 15, "flags": 24, "sessionId": 3, "body": {"content": "from the old page"}}),
    )
    .await;
    let ack = js.recv().await;
    assert_eq!(
        (ack["cmd"].as_u64(), ack["sessionId"].as_u64()),
        (Some(23), Some(3)),
        "{ack}"
    );

    let ups = rx.wait("up_push", 4).await;
    assert_eq!(ups.len(), 4, "each once: {ups:#?}");
    let by_user = |u: &str| {
        ups.iter()
            .find(|e| e["userId"] == u)
            .unwrap_or_else(|| panic!("{u}'s up-push: {ups:#?}"))
            .clone()
    };
    let a = by_user("alice");
    assert_eq!(a["content"], "héllo from tcp");
    assert_eq!(a["deviceId"], "phone-1");
    assert_eq!(a["node"], "local");
    assert_eq!(a["id"].as_str().map(str::len), Some(32));
    assert!(a["receivedAt"].as_i64().unwrap_or(0) > 0);
    assert!(a["clientType"].is_number());
    let b = by_user("bob");
    assert!(b.get("content").is_none());
    assert_eq!(
        b["contentBase64"],
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, binary)
    );
    assert_eq!(by_user("carol")["content"], "from mpush 0.8.1");
    assert_eq!(by_user("dave")["content"], "from the old page");
    let ids: std::collections::HashSet<&str> =
        ups.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(ids.len(), 4, "distinct ids");

    // Lifecycle events: every bind, and a disconnect with its reason.
    let bound_users: Vec<String> = rx
        .wait("bound", 4)
        .await
        .iter()
        .filter_map(|e| e["userId"].as_str().map(str::to_owned))
        .collect();
    for u in ["alice", "bob", "carol", "dave"] {
        assert!(
            bound_users.iter().any(|b| b == u),
            "{u} bound: {bound_users:?}"
        );
    }
    drop(tcp);
    let gone = rx.wait("disconnected", 1).await;
    assert_eq!(gone[0]["userId"], "alice");
    assert!(gone[0]["reason"].is_string());

    assert_eq!(rx.state.bad_signatures.load(Ordering::Relaxed), 0);
    drop(ws);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_that_fails_twice_still_gets_each_message() {
    let rx = Receiver::start().await;
    rx.state.fail_next.store(2, Ordering::Relaxed);
    let server = start(with_webhook(&rx, &[SinkEvent::UpPush], WebhookMode::Sync)).await;
    let c = bound_sdk(server.tcp.to_string(), "phone-1", "alice").await;
    // Accepted after the two failures (retried with backoff within the
    // accept timeout): the ACK means the receiver has it.
    c.push(b"third time lucky", mpush_protocol::session::AckMode::Auto)
        .await
        .expect("accepted after retries");
    let ups = rx.events("up_push");
    assert_eq!(ups.len(), 1, "{ups:#?}");
    assert_eq!(ups[0]["content"], "third time lucky");
    assert_eq!(rx.state.requests.load(Ordering::Relaxed), 3);
    drop(c);
    server.shutdown().await;
}

/// A receiver that is down longer than the accept timeout: the server says
/// "retry later" (before: the copy it had queued was still handed on later,
/// and the client's retry was a second event with another id). Now a copy
/// no worker took is withdrawn, and the SDK sends the message again with its
/// own message id: every copy the backend gets carries one event id, so it
/// can drop repeats; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_down_too_long_makes_the_push_fail_retryable_and_nothing_is_lost() {
    let mut rx = Receiver::start().await;
    let mut s = with_webhook(&rx, &[SinkEvent::UpPush], WebhookMode::Sync);
    s.sinks.accept_timeout_ms = 700;
    let server = start(s).await;
    let c = bound_sdk(server.tcp.to_string(), "phone-1", "alice").await;
    rx.stop();
    let pushing = {
        let c = c.clone();
        tokio::spawn(async move {
            c.push(b"while down", mpush_protocol::session::AckMode::Auto)
                .await
        })
    };
    // Refused for now at least twice (the SDK waits 1 s, then 2 s).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    rx.restart().await;
    pushing
        .await
        .expect("joined")
        .expect("accepted by a retry once the receiver is back");
    rx.wait("up_push", 1).await;
    // Any copy the server had in flight arrives too; let it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ups = rx.events("up_push");
    assert!(ups.iter().all(|u| u["content"] == "while down"), "{ups:#?}");
    let ids: std::collections::HashSet<&str> =
        ups.iter().filter_map(|u| u["id"].as_str()).collect();
    assert_eq!(ids.len(), 1, "one event id for every copy: {ups:#?}");

    // Asynchronous webhook with a queue of 2: accepted when queued, refused
    // for now when full; the SDK's retry gets it in once the receiver is
    // back, and every message arrives, in order, under its own id.
    let mut rx2 = Receiver::start().await;
    let mut s = with_webhook(&rx2, &[SinkEvent::UpPush], WebhookMode::Async);
    s.sinks.webhooks[0].queue = 2;
    s.sinks.webhooks[0].concurrency = 1;
    s.sinks.webhooks[0].batch = 1;
    let server2 = start(s).await;
    let c2 = bound_sdk(server2.tcp.to_string(), "phone-2", "bob").await;
    rx2.stop();
    let mut sent = Vec::new();
    let mut waiting = None;
    for i in 0..6 {
        let text = format!("async {i}");
        sent.push(text.clone());
        let c2 = c2.clone();
        let push = tokio::spawn(async move {
            c2.push(text.as_bytes(), mpush_protocol::session::AckMode::Auto)
                .await
        });
        // Accepted at once while the queue has room; the first that is
        // not waits for the SDK's retries.
        match tokio::time::timeout(Duration::from_millis(500), push).await {
            Ok(r) => r.expect("joined").expect("queued"),
            Err(_) => {
                waiting = Some(i);
                break;
            }
        }
    }
    assert!(waiting.is_some_and(|i| (1..=3).contains(&i)), "{waiting:?}");
    rx2.restart().await;
    let got: Vec<Value> = rx2.wait("up_push", sent.len()).await;
    let texts: Vec<&str> = got.iter().filter_map(|e| e["content"].as_str()).collect();
    assert_eq!(
        texts,
        sent.iter().map(String::as_str).collect::<Vec<_>>(),
        "every message, in order"
    );
    let ids: std::collections::HashSet<&str> =
        got.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(ids.len(), sent.len(), "one id per message");
    assert_eq!(rx.state.bad_signatures.load(Ordering::Relaxed), 0);
    drop((c, c2));
    server.shutdown().await;
    server2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn up_pushes_over_the_rate_are_refused_then_the_connection_is_closed() {
    let rx = Receiver::start().await;
    let mut s = with_webhook(&rx, &[SinkEvent::UpPush], WebhookMode::Async);
    s.limits.up_push_rate_per_conn = 1;
    s.limits.up_push_burst_per_conn = 2;
    s.limits.up_push_abuse_refusals = 3;
    let server = start(s).await;
    // A v2 client sees each refusal (ERROR RETRY_LATER) and keeps its
    // connection until it has been refused 3 times in a row.
    let mut c = bound(
        &server,
        Via::Tcp,
        true,
        device("flood-1", "android"),
        "eve",
        "",
    )
    .await;
    for _ in 0..5 {
        c.push_up(b"flood");
    }
    c.wait_for("closed", |e| matches!(e, ClientEvent::Closed { .. }))
        .await;
    let acked = c
        .seen
        .iter()
        .filter(|e| matches!(e, ClientEvent::PushAcked { .. }))
        .count();
    let refused = c
        .seen
        .iter()
        .filter(|e| {
            matches!(
                e,
                ClientEvent::PushRefused {
                    code: ErrorCode::RETRY_LATER,
                    ..
                }
            )
        })
        .count();
    assert_eq!((acked, refused), (2, 3), "{:?}", c.seen);
    assert_eq!(rx.wait("up_push", 2).await.len(), 2);

    // Without a bind, an up-push is rejected (not retryable).
    let mut anon =
        TestClient::connect(&server, Via::Tcp, true, device("anon-1", "android"), None).await;
    anon.connected().await;
    anon.push_up(b"who am I");
    anon.wait_for("rejected", |e| {
        matches!(
            e,
            ClientEvent::PushRefused {
                code: ErrorCode::REJECTED,
                ..
            }
        )
    })
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callbacks_report_each_terminal_state() {
    let rx = Receiver::start().await;
    let own = Receiver::start().await;
    let mut s = with_webhook(&rx, &[SinkEvent::Callback], WebhookMode::Async);
    s.sinks.callback_urls = vec![own.url()];
    s.sinks.callback_secret = SECRET.into();
    s.delivery.inbox_max = 5_000;
    // One wait of 3 s: long enough to fill a connection's 1024 in-flight
    // pushes before any times out.
    s.delivery.ack_waits_ms = vec![3000];
    s.delivery.ack_retries = 0;
    let server = start(s).await;
    let api = Api::new(&server);

    let mut ann = bound(
        &server,
        Via::Tcp,
        true,
        device("ann-1", "android"),
        "ann",
        "",
    )
    .await;
    // A legacy client that never acknowledges BIZ pushes.
    let mut ben = bound(
        &server,
        Via::Tcp,
        false,
        device("ben-1", "android"),
        "ben",
        "",
    )
    .await;

    let push = |user: &str, content: &str, ack: &str| json!({"userId": user, "content": content, "ackMode": ack, "callback": true});
    let (st, r) = api.post("/api/v1/push", push("ann", "auto", "auto")).await;
    assert_eq!(st, 200, "{r}");
    let t_ack = r["traceId"].as_str().expect("trace").to_owned();
    let (_, r) = api.post("/api/v1/push", push("ann", "none", "none")).await;
    let t_delivered = r["traceId"].as_str().expect("trace").to_owned();
    let (_, r) = api.post("/api/v1/push", push("ben", "biz", "biz")).await;
    let t_timeout = r["traceId"].as_str().expect("trace").to_owned();
    let (_, r) = api
        .post("/api/v1/push", push("nobody", "offline", "auto"))
        .await;
    let t_offline = r["traceId"].as_str().expect("trace").to_owned();
    ann.message("auto").await;
    ben.message("biz").await;

    // FAILED: a connection with 1024 un-ACKed pushes refuses the next.
    for chunk in (0..1023).collect::<Vec<_>>().chunks(64) {
        let posts = chunk.iter().map(|i| {
            api.post(
                "/api/v1/push",
                json!({"userId": "ben", "content": format!("fill {i}"), "ackMode": "biz"}),
            )
        });
        for (st, r) in futures_util::future::join_all(posts).await {
            assert_eq!(st, 200, "{r}");
        }
    }
    let (_, r) = api
        .post("/api/v1/push", push("ben", "one too many", "biz"))
        .await;
    let t_failed = r["traceId"].as_str().expect("trace").to_owned();

    let state_of = |events: &[Value], trace: &str| -> Vec<String> {
        events
            .iter()
            .filter(|e| e["traceId"] == trace)
            .filter_map(|e| e["state"].as_str().map(str::to_owned))
            .collect()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let got = rx.events("delivery");
        let done = [&t_ack, &t_delivered, &t_timeout, &t_offline, &t_failed]
            .iter()
            .all(|t| !state_of(&got, t).is_empty());
        if done {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "callbacks: {got:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = rx.events("delivery");
    assert_eq!(state_of(&got, &t_ack), ["ACK"]);
    assert_eq!(state_of(&got, &t_delivered), ["DELIVERED"]);
    assert_eq!(state_of(&got, &t_timeout), ["TIMEOUT"]);
    assert_eq!(state_of(&got, &t_offline), ["OFFLINE"]);
    assert_eq!(state_of(&got, &t_failed), ["FAILED"]);
    let ack = got
        .iter()
        .find(|e| e["traceId"] == t_ack.as_str())
        .expect("ack");
    assert_eq!(
        (ack["userId"].as_str(), ack["deviceId"].as_str()),
        (Some("ann"), Some("ann-1"))
    );
    // Pushes without `callback` report nothing.
    assert!(got.iter().all(|e| e["traceId"].as_str().is_some_and(|t| {
        [&t_ack, &t_delivered, &t_timeout, &t_offline, &t_failed]
            .iter()
            .any(|x| x.as_str() == t)
    })));

    // A broadcast reports one aggregate per node, not one call per recipient.
    let (st, r) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "all", "ackMode": "none", "callback": true}),
        )
        .await;
    assert_eq!(st, 202, "{r}");
    let t_all = r["traceId"].as_str().expect("trace").to_owned();
    let agg = rx.wait("broadcast", 1).await;
    assert_eq!(agg.len(), 1, "{agg:#?}");
    assert_eq!(agg[0]["traceId"], t_all.as_str());
    assert_eq!(agg[0]["node"], "local");
    assert_eq!(agg[0]["settled"], true);
    assert_eq!(agg[0]["counts"]["DISPATCHED"], 2);
    assert_eq!(agg[0]["counts"]["DELIVERED"], 2, "{agg:#?}");

    // /exec takes the same option; a per-push URL must be allow-listed.
    let (st, r) = api
        .text(
            reqwest::Method::POST,
            &format!(
                "/exec?method=push&userId=ann&msgbody=via%20exec&ack=true&callbackUrl={}",
                urlencode(&own.url())
            ),
            None,
        )
        .await;
    assert_eq!(st, 200, "{r}");
    let mine = own.wait("delivery", 1).await;
    assert_eq!(mine[0]["state"], "ACK", "{mine:#?}");
    let (st, r) = api
        .post(
            "/api/v1/push",
            json!({"userId": "ann", "content": "x", "callbackUrl": "http://evil.example/"}),
        )
        .await;
    assert_eq!(st, 400, "{r}");
    assert_eq!(rx.state.bad_signatures.load(Ordering::Relaxed), 0);
    assert_eq!(own.state.bad_signatures.load(Ordering::Relaxed), 0);
    drop((ann, ben));
    server.shutdown().await;
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_stream_sink_delivers_across_a_node_restart() {
    let redis = Redis::start(free_port()).await;
    let node = |tcp: &str| {
        let mut s = settings();
        s.net.tcp = tcp.into();
        s.cluster.redis = redis.url();
        s.cluster.internal = "127.0.0.1:0".into();
        s.cluster.node_id = "S".into();
        s.cluster.allow_unauthenticated_peers = true;
        s.sinks.stream = Some(StreamSink {
            key: "mpush:up".into(),
            maxlen: 1000,
            events: vec![SinkEvent::UpPush],
        });
        s
    };
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let server = start(node(&addr)).await;
    // A backend's consumer group, created before anything arrives.
    redis
        .query(&["XGROUP", "CREATE", "mpush:up", "backend", "$", "MKSTREAM"])
        .await;
    let mut c = bound_sdk(addr.clone(), "phone-1", "alice").await;
    c.push(b"before", mpush_protocol::session::AckMode::Auto)
        .await
        .expect("XADDed");
    server.shutdown().await;
    wait_sdk(&mut c, "disconnected", |e| {
        matches!(e, SessionEvent::Disconnected { .. })
    })
    .await;
    // Pushed while the node is down: kept by the SDK, sent once it is back.
    let h = c.handle();
    let pending = tokio::spawn(async move {
        h.push(b"during", mpush_protocol::session::AckMode::Auto)
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let server = start(node(&addr)).await;
    pending
        .await
        .expect("task")
        .expect("accepted after the restart");
    c.push(b"after", mpush_protocol::session::AckMode::Auto)
        .await
        .expect("XADDed");

    let read = redis
        .query(&[
            "XREADGROUP",
            "GROUP",
            "backend",
            "worker-1",
            "COUNT",
            "10",
            "STREAMS",
            "mpush:up",
            ">",
        ])
        .await;
    let text = format!("{read:?}");
    let contents: Vec<String> = ["before", "during", "after"]
        .iter()
        .filter(|w| text.contains(&format!("\\\"content\\\":\\\"{w}\\\"")))
        .map(|w| w.to_string())
        .collect();
    assert_eq!(contents, ["before", "during", "after"], "{text}");
    assert!(text.contains("\\\"node\\\":\\\"S\\\""), "{text}");
    drop(c);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callbacks_come_from_the_node_that_holds_the_device() {
    let redis = Redis::start(free_port()).await;
    let rx = Receiver::start().await;
    let node = |id: &str| {
        let mut s = with_webhook(&rx, &[SinkEvent::Callback], WebhookMode::Async);
        s.cluster.redis = redis.url();
        s.cluster.node_id = id.into();
        s.cluster.internal = "127.0.0.1:0".into();
        s.cluster.secret = "test-node-secret-0123456789abcdef".into();
        s.cluster.node_renew_secs = 1;
        s.cluster.node_ttl_secs = 3;
        s
    };
    let a = start(node("A")).await;
    let b = start(node("B")).await;
    let api = Api::new(&a);
    wait_for_nodes(&api, 2).await;
    let mut on_b = bound(&b, Via::Tcp, true, device("far-1", "android"), "far", "").await;
    let mut on_a = bound(&a, Via::Tcp, true, device("near-1", "android"), "near", "").await;
    // A unicast sent through A to a device on B: B watches it and reports.
    let (st, r) = api
        .post(
            "/api/v1/push",
            json!({"userId": "far", "content": "across", "ackMode": "auto", "callback": true}),
        )
        .await;
    assert_eq!((st, r["dispatched"].as_u64()), (200, Some(1)), "{r}");
    let trace = r["traceId"].as_str().expect("trace").to_owned();
    on_b.message("across").await;
    let got = rx.wait("delivery", 1).await;
    let ack = got
        .iter()
        .find(|e| e["traceId"] == trace.as_str())
        .expect("the callback");
    assert_eq!(
        (
            ack["state"].as_str(),
            ack["node"].as_str(),
            ack["deviceId"].as_str()
        ),
        (Some("ACK"), Some("B"), Some("far-1")),
        "{got:#?}"
    );
    // A broadcast: one aggregate from each node.
    let (st, r) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "everyone", "ackMode": "auto", "callback": true}),
        )
        .await;
    assert_eq!(st, 202, "{r}");
    on_a.message("everyone").await;
    on_b.message("everyone").await;
    let aggs = rx.wait("broadcast", 2).await;
    let mut nodes: Vec<&str> = aggs.iter().filter_map(|e| e["node"].as_str()).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, ["A", "B"], "{aggs:#?}");
    assert!(
        aggs.iter()
            .all(|e| e["counts"]["ACK"] == 1 && e["settled"] == true),
        "{aggs:#?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// `Running` is used by the helpers above through `common`.
#[allow(dead_code)]
fn _uses(_: &Running) {}

/// A caller cannot make a node watch pushes without end: over
/// `sinks.callback_max_watched` a push with a callback is a 503 (and not sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watched_callbacks_are_bounded() {
    let rx = Receiver::start().await;
    let mut s = with_webhook(&rx, &[SinkEvent::Callback], WebhookMode::Async);
    s.sinks.callback_max_watched = 1;
    let server = start(s).await;
    let api = Api::new(&server);
    let push = json!({"userId": "nobody-here", "content": "x", "ttlSeconds": 60, "callback": true});
    let (st, r) = api.post("/api/v1/push", push.clone()).await;
    assert_eq!(st, 200, "{r}");
    let (st, r) = api.post("/api/v1/push", push).await;
    assert_eq!(st, 503, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("callbacks"),
        "{r}"
    );
    server.shutdown().await;
}

/// Backpressure for delivery callbacks: pushes with callbacks come much
/// faster than a slow backend takes them (10 events a POST, one POST at a
/// time, 20 ms each: 500 a second) into a queue of 100. Each push waits for
/// room instead, so every callback arrives and none is dropped; without the
/// wait the queue overflowed and most were dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_pushes_with_callbacks_waits_for_a_slow_backend_and_loses_none() {
    use futures_util::StreamExt;
    let rx = Receiver::start().await;
    rx.state.delay_ms.store(20, Ordering::Relaxed);
    let mut s = with_webhook(&rx, &[SinkEvent::Callback], WebhookMode::Async);
    s.sinks.webhooks[0].queue = 100;
    s.sinks.webhooks[0].batch = 10;
    s.sinks.webhooks[0].concurrency = 1;
    let server = start(s).await;
    let api = Api::new(&server);
    const PUSHES: usize = 1_000;
    let started = std::time::Instant::now();
    let answers: Vec<u16> = futures_util::stream::iter(0..PUSHES)
        .map(|i| {
            let api = &api;
            async move {
                let body = json!({"userId": format!("away-{i}"), "content": "x", "callback": true});
                api.post("/api/v1/push", body).await.0
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let took = started.elapsed();
    // Offline users: each push answers 404 and reports OFFLINE.
    assert!(answers.iter().all(|s| *s == 404), "{answers:?}");
    let (_, metrics) = api.text(reqwest::Method::GET, "/metrics", None).await;
    let dropped: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("mpush_sink_events_dropped_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(dropped, 0.0, "callbacks dropped in {took:?}:\n{metrics}");
    let got = rx.wait("delivery", PUSHES).await;
    assert_eq!(got.len(), PUSHES);
    assert!(
        got.iter().all(|e| e["state"] == "OFFLINE"),
        "{:?}",
        got.first()
    );
    // The pushes went at the backend's pace (about 500 a second).
    assert!(took > Duration::from_millis(1_000), "{took:?}");
    server.shutdown().await;
}
