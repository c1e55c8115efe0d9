//! The tokio client against the real server on 127.0.0.1:0.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::session::DeviceInfo;
use mpush_sdk_core::SessionEvent;
use mpush_sdk_core::native::{Client, ClientOptions, FileTicketStore};
use mpush_sdk_core::session::SessionConfig;
use mpush_server::{Running, Settings};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(15);

fn settings(tcp: &str, ws: &str, http: &str) -> Settings {
    let mut s = Settings::default();
    s.net.tcp = tcp.into();
    s.net.ws = ws.into();
    s.net.http = http.into();
    s.shutdown.drain_timeout_ms = 500;
    s
}

async fn start(s: Settings) -> Running {
    mpush_server::start(s.validate().expect("valid"))
        .await
        .expect("starts")
}

fn options(server: &str, device: &str, v2: bool) -> ClientOptions {
    let dev = DeviceInfo {
        device_id: device.into(),
        os_name: "linux".into(),
        os_version: "1".into(),
        client_version: "1".into(),
    };
    let mut cfg = SessionConfig::new(
        vec![server.to_owned()],
        Arc::new(RsaPublic::mpush_default()),
        dev,
    );
    cfg.offer_v2 = v2;
    ClientOptions {
        session: cfg,
        ticket_store: None,
    }
}

async fn wait_for(c: &mut Client, what: &str, f: impl Fn(&SessionEvent) -> bool) -> SessionEvent {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let e = tokio::time::timeout_at(deadline, c.next_event())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .expect("client running");
        if f(&e) {
            return e;
        }
    }
}

async fn push(http: SocketAddr, body: Value) -> Value {
    reqwest::Client::new()
        .post(format!("http://{http}/api/v1/push"))
        .json(&body)
        .send()
        .await
        .expect("api")
        .json()
        .await
        .expect("json")
}

#[tokio::test]
async fn listen_push_receive_over_tcp_and_websocket() {
    let server = start(settings("127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0")).await;
    let ws = format!("ws://{}/", server.ws.expect("ws"));
    for (addr, v2) in [
        (server.tcp.to_string(), true),
        (server.tcp.to_string(), false),
        (ws.clone(), true),
        (ws, false),
    ] {
        let user = format!("u-{}-{v2}", addr.len());
        let mut c =
            Client::connect(options(&addr, &format!("d-{user}"), v2)).expect("valid options");
        c.bind(&user, "", "").await.expect("bind");
        let e = wait_for(&mut c, "connected", |e| {
            matches!(e, SessionEvent::Connected { .. })
        })
        .await;
        assert!(matches!(e, SessionEvent::Connected { v2: got, .. } if got == v2));
        wait_for(&mut c, "bound", |e| {
            matches!(e, SessionEvent::BindResult { ok: true, .. })
        })
        .await;
        push(
            server.http,
            json!({"userId": user, "content": "hello", "ackMode": "biz"}),
        )
        .await;
        let SessionEvent::Message(m) =
            wait_for(&mut c, "message", |e| matches!(e, SessionEvent::Message(_))).await
        else {
            unreachable!()
        };
        assert_eq!(m.content, b"hello");
        assert!(m.needs_ack);
        c.ack(m.ack_id).await.expect("ack");
        c.close();
    }
    server.shutdown().await;
}

#[tokio::test]
async fn the_client_comes_back_by_itself_and_gets_what_was_pushed_while_away_exactly_once() {
    let first = start(settings("127.0.0.1:0", "", "127.0.0.1:0")).await;
    let (tcp, http) = (first.tcp, first.http);
    let dir = std::env::temp_dir().join(format!("mpush-sdk-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let mut opts = options(&tcp.to_string(), "phone-1", true);
    opts.ticket_store = Some(Arc::new(FileTicketStore::new(dir.join("token.dat"))));
    let mut c = Client::connect(opts).expect("valid options");
    c.bind("zoe", "", "").await.expect("bind");
    wait_for(&mut c, "bound", |e| {
        matches!(e, SessionEvent::BindResult { ok: true, .. })
    })
    .await;
    assert!(dir.join("token.dat").exists(), "the ticket is persisted");

    // The session survives a dropped connection (the API's kick closes it):
    // fast connect. A kick of this device is not undone: no re-bind until
    // the app binds again.
    let r = reqwest::Client::new()
        .post(format!("http://{http}/api/v1/users/zoe/kick"))
        .json(&json!({}))
        .send()
        .await
        .expect("kick");
    assert_eq!(r.status(), 200);
    wait_for(&mut c, "fast connect", |e| {
        matches!(e, SessionEvent::Connected { resumed: true, .. })
    })
    .await;
    let online = |v: Value| v["online"].as_bool();
    let u: Value = reqwest::get(format!("http://{http}/api/v1/users/zoe"))
        .await
        .expect("user")
        .json()
        .await
        .expect("json");
    assert_eq!(online(u), Some(false), "the kicked user is not bound again");
    c.bind("zoe", "", "").await.expect("bind");
    wait_for(&mut c, "re-bound", |e| {
        matches!(e, SessionEvent::BindResult { ok: true, .. })
    })
    .await;

    // Kill the server; bring a new one up on the same ports; push while away.
    first.shutdown().await;
    wait_for(&mut c, "disconnected", |e| {
        matches!(e, SessionEvent::Disconnected { .. })
    })
    .await;
    let second = start(settings(&tcp.to_string(), "", &http.to_string())).await;
    let r = push(
        second.http,
        json!({"userId": "zoe", "content": "while away", "ackMode": "auto", "ttlSeconds": 300}),
    )
    .await;
    assert_eq!(r["stored"], true, "{r}");
    // The new server has no session: the client falls back to a handshake.
    wait_for(&mut c, "reconnected", |e| {
        matches!(e, SessionEvent::Connected { .. })
    })
    .await;
    let mut got = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while let Ok(Some(e)) = tokio::time::timeout_at(deadline, c.next_event()).await {
        if matches!(&e, SessionEvent::Message(m) if m.content == b"while away") {
            got += 1;
        }
    }
    assert_eq!(got, 1, "delivered exactly once");
    let trace = r["traceId"].as_str().unwrap_or_default();
    let t: Value = reqwest::get(format!("http://{http}/api/v1/traces/{trace}"))
        .await
        .expect("trace")
        .json()
        .await
        .expect("json");
    assert_eq!(t["state"], "ACK", "{t}");
    second.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_server_means_backoff_and_network_available_retries_at_once() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut c =
        Client::connect(options(&format!("127.0.0.1:{port}"), "d", true)).expect("valid options");
    let SessionEvent::Disconnected { retry_in_ms, .. } = wait_for(&mut c, "disconnected", |e| {
        matches!(e, SessionEvent::Disconnected { .. })
    })
    .await
    else {
        unreachable!()
    };
    assert!((800..=1200).contains(&retry_in_ms), "{retry_in_ms}");
    let SessionEvent::Disconnected { retry_in_ms, .. } = wait_for(&mut c, "second try", |e| {
        matches!(e, SessionEvent::Disconnected { .. })
    })
    .await
    else {
        unreachable!()
    };
    assert!((1600..=2400).contains(&retry_in_ms), "{retry_in_ms}");
    c.network_available().expect("running");
    let SessionEvent::Disconnected { retry_in_ms, .. } =
        wait_for(&mut c, "retry after reset", |e| {
            matches!(e, SessionEvent::Disconnected { .. })
        })
        .await
    else {
        unreachable!()
    };
    assert!(
        (800..=1200).contains(&retry_in_ms),
        "backoff was reset: {retry_in_ms}"
    );
}

#[tokio::test]
async fn server_addresses_come_from_mpush_allocator() {
    let server = start(settings("127.0.0.1:0", "", "127.0.0.1:0")).await;
    let mut opts = options("unused:1", "alloc-1", false);
    opts.session.servers.clear();
    opts.session.allocator_url = Some(format!("http://{}/", server.http));
    let mut c = Client::connect(opts).expect("valid options");
    let SessionEvent::Connected { address, v2, .. } = wait_for(&mut c, "connected", |e| {
        matches!(e, SessionEvent::Connected { .. })
    })
    .await
    else {
        unreachable!()
    };
    assert_eq!(
        address,
        server.tcp.to_string(),
        "the allocator's GET / listed the TCP gateway"
    );
    assert!(!v2, "legacy profile when not offering v2");
    c.close();
    server.shutdown().await;
}

/// A server that takes the TCP connection and then says nothing: the
/// WebSocket upgrade (the connect attempt) hangs until the connect timeout.
#[tokio::test]
async fn close_during_a_slow_connect_returns_at_once_and_fails_what_waits() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let addr = silent.local_addr().expect("addr");
    let held = tokio::spawn(async move {
        let mut socks = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            socks.push(s);
        }
    });
    let mut opts = options(&format!("ws://{addr}/"), "slow-1", true);
    opts.session.connect_timeout = Duration::from_secs(60);
    let mut c = Client::connect(opts).expect("valid options");
    wait_for(
        &mut c,
        "connecting",
        |e| matches!(e, SessionEvent::StateChanged(s) if s.name() == "connecting"),
    )
    .await;
    // Commands are served while the attempt hangs.
    assert_eq!(c.state().name(), "connecting");
    let h = c.handle();
    let bind = tokio::spawn(async move { h.bind("ann", "", "").await });
    let h = c.handle();
    let push = tokio::spawn(async move {
        h.push(b"queued", mpush_protocol::session::AckMode::Auto)
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = tokio::time::Instant::now();
    c.close();
    let bind = tokio::time::timeout(Duration::from_secs(2), bind)
        .await
        .expect("bind settles at once")
        .expect("task");
    let push = tokio::time::timeout(Duration::from_secs(2), push)
        .await
        .expect("push settles at once")
        .expect("task");
    assert_eq!(bind, Err(mpush_sdk_core::SessionError::Stopped));
    assert_eq!(push, Err(mpush_sdk_core::SessionError::Stopped));
    wait_for(&mut c, "stopped", |e| {
        matches!(e, SessionEvent::Stopped { .. })
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "close did not wait for the 60 s connect attempt"
    );
    assert_eq!(c.state().name(), "closed");
    held.abort();
}

#[tokio::test]
async fn bind_resolves_when_the_server_accepted_and_invalid_options_are_refused() {
    let server = start(settings("127.0.0.1:0", "", "127.0.0.1:0")).await;
    let c = Client::connect(options(&server.tcp.to_string(), "b-1", true)).expect("valid");
    // Made before the connection is up: resolves once the server bound it.
    tokio::time::timeout(WAIT, c.bind("bea", "", ""))
        .await
        .expect("in time")
        .expect("bound");
    let u: Value = reqwest::get(format!("http://{}/api/v1/users/bea", server.http))
        .await
        .expect("user")
        .json()
        .await
        .expect("json");
    assert_eq!(u["online"], true, "{u}");
    tokio::time::timeout(WAIT, c.unbind())
        .await
        .expect("in time")
        .expect("unbound");
    assert_eq!(c.state().name(), "connected");
    drop(c);

    let mut bad = options("not an address", "b-2", true);
    bad.session.dedup_capacity = 0;
    match Client::connect(bad) {
        Err(e) => assert_eq!(e.code(), "invalid_input"),
        Ok(_) => panic!("invalid options accepted"),
    }
    server.shutdown().await;
}
