//! The server against an attacker on loopback: each attack gets its stated
//! reaction (close, 4xx, refusal, deadline), and a bound client keeps
//! receiving pushes meanwhile.

mod common;

use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use mpush_protocol::client::ClientEvent;
use mpush_protocol::packet::{Command, Flags, Frame, Packet};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

/// True when the peer closed `s` within `limit` (reading whatever came first).
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

async fn push_reaches(server: &mpush_server::Running, c: &mut TestClient, user: &str, text: &str) {
    let (st, _) = Api::new(server)
        .post("/api/v1/push", json!({"userId": user, "content": text}))
        .await;
    assert_eq!(st, 200);
    c.message(text).await;
}

fn rsa_frame(blocks: usize) -> Vec<u8> {
    Frame::Packet(Packet::new(
        Command::HANDSHAKE,
        1,
        Flags::CRYPTO,
        vec![0x55; blocks * 128],
    ))
    .to_bytes()
    .to_vec()
}

#[tokio::test]
async fn handshake_floods_are_closed_and_bound_clients_keep_receiving() {
    let server = start(settings()).await;
    let mut good = bound(&server, Via::Tcp, true, device("g1", "android"), "good", "").await;
    // A 10 KiB RSA frame (80 blocks), resent on one socket: closed on the first.
    let mut s = TcpStream::connect(server.tcp).await.expect("connects");
    for _ in 0..20 {
        if s.write_all(&rsa_frame(80)).await.is_err() {
            break;
        }
    }
    assert!(
        closed_within(&mut s, WAIT).await,
        "oversized RSA handshake closes"
    );
    // Many sockets with undecryptable handshakes of a legal size: each one
    // costs at most one RSA operation, on the blocking pool, and is closed.
    let mut socks = Vec::new();
    for _ in 0..40 {
        let mut s = TcpStream::connect(server.tcp).await.expect("connects");
        s.write_all(&rsa_frame(8)).await.expect("writes");
        s.write_all(&rsa_frame(8)).await.expect("writes");
        socks.push(s);
    }
    push_reaches(&server, &mut good, "good", "during the flood").await;
    for s in &mut socks {
        assert!(closed_within(s, WAIT).await);
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_connection_that_never_handshakes_meets_its_deadline() {
    let mut st = settings();
    st.limits.handshake_timeout_ms = 1000;
    let server = start(st).await;
    let mut good = bound(
        &server,
        Via::Tcp,
        false,
        device("g2", "android"),
        "good",
        "",
    )
    .await;
    // TCP: heartbeat bytes only, forever.
    let mut s = TcpStream::connect(server.tcp).await.expect("connects");
    let t0 = tokio::time::Instant::now();
    let mut closed = false;
    while t0.elapsed() < Duration::from_secs(5) {
        if s.write_all(&[0xDF]).await.is_err() {
            closed = true;
            break;
        }
        if closed_within(&mut s, Duration::from_millis(200)).await {
            closed = true;
            break;
        }
    }
    assert!(closed, "heartbeats alone do not keep a connection");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // WebSocket: upgraded, then nothing.
    let addr = server.ws.expect("ws");
    let stream = TcpStream::connect(addr).await.expect("connects");
    let (mut ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/"), stream)
        .await
        .expect("upgrade");
    let end = tokio::time::timeout(Duration::from_secs(4), async {
        while let Some(Ok(m)) = ws.next().await {
            if matches!(m, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
    assert!(end.is_ok(), "a silent WebSocket is closed at the deadline");
    push_reaches(&server, &mut good, "good", "still here").await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_silent_json_websocket_is_pinged_then_closed() {
    let mut st = settings();
    st.limits.min_heartbeat_ms = 1000;
    st.limits.max_heartbeat_ms = 1000;
    let server = start(st).await;
    let mut j = JsonClient::connect(&server).await;
    j.send(json!({"cmd": 2, "flags": 16, "sessionId": 1, "body": {"deviceId": "js-1", "osName": "web"}}))
        .await;
    j.recv().await;
    // A live browser answers pings (tungstenite does while it reads): kept.
    let alive = tokio::time::timeout(Duration::from_millis(2500), j.recv()).await;
    assert!(alive.is_err(), "no frames, but still open");
    // A dead peer never reads: the server's pings go unanswered and it closes
    // the connection after two missed intervals.
    let addr = server.ws.expect("ws");
    let stream = TcpStream::connect(addr).await.expect("connects");
    let (mut ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/"), stream)
        .await
        .expect("upgrade");
    ws.send(Message::Text(
        json!({"cmd": 2, "flags": 16, "sessionId": 1, "body": {"deviceId": "js-2", "osName": "web"}})
            .to_string()
            .into(),
    ))
    .await
    .expect("send");
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let mut closed = false;
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(2), ws.next()).await {
        match m {
            Ok(Message::Close(_)) | Err(_) => {
                closed = true;
                break;
            }
            Ok(_) => {}
        }
    }
    assert!(closed, "an unresponsive JSON client is closed");
    server.shutdown().await;
}

#[tokio::test]
async fn connections_per_address_are_capped() {
    let mut st = settings();
    st.limits.max_connections_per_ip = 3;
    let server = start(st).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(server.tcp).await.expect("connects"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut fourth = TcpStream::connect(server.tcp).await.expect("connects");
    assert!(
        closed_within(&mut fourth, WAIT).await,
        "over the per-IP cap"
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut c = bound(&server, Via::Tcp, true, device("pi", "android"), "pi", "").await;
    push_reaches(&server, &mut c, "pi", "slots come back").await;
    server.shutdown().await;
}

#[tokio::test]
async fn slow_http_clients_are_cut_off_and_capped() {
    let mut st = settings();
    st.limits.http_header_timeout_ms = 500;
    st.limits.http_idle_timeout_ms = 800;
    st.limits.http_max_connections = 60;
    let server = start(st).await;
    let mut slow = Vec::new();
    for _ in 0..40 {
        let mut s = TcpStream::connect(server.http).await.expect("connects");
        s.write_all(b"POST /api/v1/push HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .expect("writes");
        slow.push(s);
    }
    // Idle, never a byte.
    let mut idle = TcpStream::connect(server.http).await.expect("connects");
    for s in &mut slow {
        assert!(
            closed_within(s, Duration::from_secs(3)).await,
            "header deadline"
        );
    }
    assert!(
        closed_within(&mut idle, Duration::from_secs(3)).await,
        "idle deadline"
    );
    // Over the cap, the next connection is closed at once.
    let mut held = Vec::new();
    for _ in 0..60 {
        held.push(TcpStream::connect(server.http).await.expect("connects"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut over = TcpStream::connect(server.http).await.expect("connects");
    assert!(
        closed_within(&mut over, Duration::from_millis(400)).await,
        "over the cap"
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (st, _) = Api::new(&server).get("/healthz").await;
    assert_eq!(st, 200);
    server.shutdown().await;
}

#[tokio::test]
async fn the_api_refuses_rebinding_cross_site_and_oversized_requests() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let base = &api.base;
    let http = reqwest::Client::new();
    // DNS rebinding: a name we do not serve.
    let r = http
        .post(format!("{base}/api/v1/push"))
        .header("host", "evil.example")
        .json(&json!({"userId": "u", "content": "x", "ttlSeconds": 60}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 403);
    let body: serde_json::Value = r.json().await.expect("json error");
    assert_eq!(body["error"]["code"], "forbidden");
    // CSRF: a page on another site posting a form to /exec.
    let r = http
        .post(format!("{base}/exec"))
        .header("origin", "https://evil.example")
        .form(&[("method", "push"), ("userId", "u"), ("msgbody", "x")])
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 403);
    // A cross-site GET with side effects (an <img src>): not without a token.
    let r = http
        .get(format!("{base}/exec?method=push&userId=u&msgbody=x"))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 405);
    // The same page's own requests are fine (the demo page).
    let r = http
        .post(format!("{base}/api/v1/push"))
        .header("origin", base.as_str())
        .json(&json!({"userId": "u", "content": "x", "ttlSeconds": 60}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);
    // /exec validates like /api/v1/push: 1.6 MB of msgbody is a 400.
    let big = "x".repeat(1_600_000);
    let r = http
        .post(format!("{base}/exec"))
        .form(&[
            ("method", "push"),
            ("userId", "u"),
            ("msgbody", big.as_str()),
        ])
        .send()
        .await
        .expect("request");
    assert!(matches!(r.status().as_u16(), 400 | 413), "{}", r.status());
    let (st, v) = api
        .post(
            "/exec",
            json!({"method": "push", "userId": "u", "msgbody": "x", "ttl": "forever"}),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    // A condition nested 200,000 deep: a 400 with the reason, and the server lives.
    let deep = format!("{}true{}", "(".repeat(200_000), ")".repeat(200_000));
    let (st, v) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "x", "condition": deep}),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("condition")
    );
    let (st, _) = api.get("/healthz").await;
    assert_eq!(st, 200);
    server.shutdown().await;
}

#[tokio::test]
async fn api_tokens_are_required_when_configured() {
    let mut st = settings();
    st.security.api_tokens = vec!["0123456789abcdef-token".into()];
    let server = start(st).await;
    let http = reqwest::Client::new();
    let url = format!("http://{}/api/v1/push", server.http);
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer 0123456789abcdef-toke"),
    ] {
        let mut r = http
            .post(&url)
            .json(&json!({"userId": "u", "content": "x", "ttlSeconds": 60}));
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        assert_eq!(r.send().await.expect("request").status().as_u16(), 401);
    }
    let r = http
        .post(&url)
        .header("authorization", "Bearer 0123456789abcdef-token")
        .json(&json!({"userId": "u", "content": "x", "ttlSeconds": 60}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);
    server.shutdown().await;
}

#[tokio::test]
async fn jwt_binds_only_the_user_the_token_names() {
    let secret = "jwt-secret-0123456789abcdef-0123456789";
    let mut st = settings();
    st.security.jwt_secret = secret.into();
    st.security.api_tokens = vec!["0123456789abcdef-token".into()];
    let server = start(st).await;
    // An offline message waits in the inbox of `ann`.
    let r = reqwest::Client::new()
        .post(format!("http://{}/api/v1/push", server.http))
        .header("authorization", "Bearer 0123456789abcdef-token")
        .json(&json!({"userId": "ann", "content": "for ann only", "ttlSeconds": 600}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);
    let key = mpush_server::auth::MintKey::Secret(secret.into());
    // No token, and a token for someone else: refused, closed, nothing read.
    let bob = mpush_server::auth::mint_jwt(&key, "bob", 60, None, None).expect("token");
    for (v2, token) in [(false, String::new()), (true, bob)] {
        let mut c = TestClient::connect(&server, Via::Tcp, v2, device("x", "android"), None).await;
        c.connected().await;
        c.bind_with_token("ann", "", &token).await;
        c.wait_for("refused bind closes", |e| {
            matches!(e, ClientEvent::Closed { .. })
        })
        .await;
        assert!(c.messages().is_empty());
    }
    // The JSON WebSocket form is checked too.
    let mut j = JsonClient::connect(&server).await;
    j.send(
        json!({"cmd": 2, "flags": 16, "sessionId": 1, "body": {"deviceId": "js", "osName": "web"}}),
    )
    .await;
    j.recv().await;
    j.send(json!({"cmd": 5, "flags": 16, "sessionId": 2, "body": {"userId": "ann"}}))
        .await;
    let v = j.recv().await;
    assert_eq!(v["cmd"], 10, "bind refused: {v}");
    // The right token binds and gets the inbox.
    let ann = mpush_server::auth::mint_jwt(&key, "ann", 60, None, None).expect("token");
    let mut c = TestClient::connect(&server, Via::Ws, true, device("ann-1", "android"), None).await;
    c.connected().await;
    c.bind_with_token("ann", "", &ann).await;
    c.message("for ann only").await;
    server.shutdown().await;
}

/// `security.max_bind_token_lifetime_secs`: a valid token that expires a
/// year from now (a leaked one would be good for a year) is refused; one
/// within the limit binds.
#[tokio::test]
async fn a_bind_token_that_lives_too_long_is_refused() {
    let secret = "jwt-secret-0123456789abcdef-0123456789";
    let mut st = settings();
    st.security.jwt_secret = secret.into();
    st.security.max_bind_token_lifetime_secs = 3600;
    let server = start(st).await;
    let key = mpush_server::auth::MintKey::Secret(secret.into());
    let year = mpush_server::auth::mint_jwt(&key, "ann", 365 * 86_400, None, None).expect("token");
    let mut c =
        TestClient::connect(&server, Via::Tcp, true, device("ann-1", "android"), None).await;
    c.connected().await;
    c.bind_with_token("ann", "", &year).await;
    c.wait_for("refused bind closes", |e| {
        matches!(e, ClientEvent::Closed { .. })
    })
    .await;
    let hour = mpush_server::auth::mint_jwt(&key, "ann", 3600, None, None).expect("token");
    let mut c =
        TestClient::connect(&server, Via::Tcp, true, device("ann-2", "android"), None).await;
    c.connected().await;
    c.bind_with_token("ann", "", &hour).await;
    c.wait_for("bound", |e| matches!(e, ClientEvent::BindOk { .. }))
        .await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_v2_ticket_resumes_once_even_when_replayed_concurrently() {
    let server = start(settings()).await;
    let dev = device("tk-1", "android");
    let mut c = TestClient::connect(&server, Via::Tcp, true, dev.clone(), None).await;
    let ClientEvent::Connected {
        ticket: Some(ticket),
        ..
    } = c.connected().await
    else {
        panic!("a ticket");
    };
    c.close();
    // Four connections present the same ticket at once.
    let mut tries = Vec::new();
    for _ in 0..4 {
        tries.push(TestClient::connect(
            &server,
            Via::Tcp,
            true,
            dev.clone(),
            Some(ticket.clone()),
        ));
    }
    let mut clients = futures_util::future::join_all(tries).await;
    let mut alive_resumed = 0;
    for t in &mut clients {
        let ClientEvent::Connected { resumed, .. } = t.connected().await else {
            panic!("connected");
        };
        t.settle(Duration::from_millis(300)).await;
        let closed = t
            .seen
            .iter()
            .any(|e| matches!(e, ClientEvent::Closed { .. }));
        if resumed && !closed {
            alive_resumed += 1;
        }
    }
    assert_eq!(alive_resumed, 1, "exactly one resume survives");
    server.shutdown().await;
}

#[tokio::test]
async fn rsa_handshakes_per_address_stay_within_their_budget() {
    // A connection gets one handshake, so the connection rate is the RSA budget.
    let mut st = settings();
    st.limits.handshakes_per_ip = 3;
    let server = start(st).await;
    let mut clients = Vec::new();
    for i in 0..8 {
        clients.push(
            TestClient::connect(
                &server,
                Via::Tcp,
                true,
                device(&format!("b{i}"), "android"),
                None,
            )
            .await,
        );
    }
    let (mut connected, mut closed) = (0, 0);
    for c in &mut clients {
        c.settle(Duration::from_millis(500)).await;
        if c.seen
            .iter()
            .any(|e| matches!(e, ClientEvent::Connected { .. }))
        {
            connected += 1;
        } else if c
            .seen
            .iter()
            .any(|e| matches!(e, ClientEvent::Closed { .. }))
        {
            closed += 1;
        }
    }
    assert_eq!((connected, closed), (3, 5), "a burst of 3, the rest closed");
    server.shutdown().await;
}

/// Behind a trusted proxy, the client's own address counts: the token-less
/// API answers loopback clients only (a remote client through a local proxy
/// is refused), and per-IP limits apply per forwarded client; from anyone
/// else, forwarding headers are ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_addresses_are_believed_from_trusted_proxies_only() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let mut s = settings();
    s.net.trusted_proxies = vec!["127.0.0.1".into()];
    s.limits.max_connections_per_ip = 1;
    let server = start(s).await;
    let http = reqwest::Client::new();
    let url = format!("http://{}/api/v1/users/nobody", server.http);
    let status = |h: Option<&'static str>| {
        let mut r = http.get(&url);
        if let Some(xff) = h {
            r = r.header("x-forwarded-for", xff);
        }
        async move { r.send().await.expect("answers").status().as_u16() }
    };
    assert_eq!(
        status(None).await,
        200,
        "a loopback client: the API answers"
    );
    assert_eq!(
        status(Some("203.0.113.5")).await,
        401,
        "a remote client through the local proxy: no token, no answer"
    );
    // Per-IP limits per forwarded client on the WebSocket gateway.
    let ws = server.ws.expect("ws");
    let open = |xff: &'static str| async move {
        let mut req = format!("ws://{ws}/")
            .into_client_request()
            .expect("request");
        req.headers_mut()
            .insert("x-forwarded-for", xff.parse().expect("header"));
        let (mut c, _) = tokio_tungstenite::connect_async(req)
            .await
            .expect("upgrade");
        // Refused after the upgrade: the server closes at once.
        let r = tokio::time::timeout(Duration::from_millis(500), c.next()).await;
        (c, r.is_err())
    };
    let (_a, a_open) = open("198.51.100.1").await;
    let (_b, b_open) = open("198.51.100.2").await;
    let (_c, c_open) = open("198.51.100.1").await;
    assert!(a_open && b_open, "one connection each for two clients");
    assert!(
        !c_open,
        "a second connection from the same client is refused"
    );
    server.shutdown().await;

    // Not a trusted proxy: the header is ignored (a loopback caller).
    let server = start(settings()).await;
    let url = format!("http://{}/api/v1/users/nobody", server.http);
    let r = http
        .get(&url)
        .header("x-forwarded-for", "203.0.113.5")
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status().as_u16(), 200);
    server.shutdown().await;
}

/// A stranger behind the local trusted proxy writes forwarding headers the
/// proxy passes on: with no API tokens, none of them makes the caller
/// loopback. Every form is answered 401.
#[tokio::test]
async fn malformed_forwarding_headers_never_make_a_caller_loopback() {
    let http = reqwest::Client::new();
    let cases: [(&str, &[&str], &str); 3] = [
        (
            "x-forwarded-for",
            &[
                "203.0.113.5:4711",
                "[2001:db8::1]",
                "[2001:db8::1]:4711",
                "unknown",
                "",
                ",",
                "127.0.0.1, junk",
                "203.0.113.5, 127.0.0.1:80",
                "localhost",
                "_hidden",
                "2130706433",
            ],
            "x-forwarded-for",
        ),
        (
            "x-forwarded-proto",
            &["", "https,", "gopher"],
            "x-forwarded-for",
        ),
        (
            "forwarded",
            &[
                "for=unknown",
                "for=_hidden",
                "for=[::1]",
                "for=\"[::1]:99999\"",
                "proto=https",
                "for=127.0.0.1;secret=1",
                "",
            ],
            "forwarded",
        ),
    ];
    for (name, values, mode) in cases {
        let mut s = settings();
        s.net.trusted_proxies = vec!["127.0.0.1".into()];
        s.net.forwarded_header = mode.into();
        let server = start(s).await;
        let url = format!("http://{}/api/v1/users/nobody", server.http);
        for v in values {
            let mut r = http.get(&url).header(name, *v);
            if name == "x-forwarded-proto" {
                r = r.header("x-forwarded-for", "127.0.0.1");
            }
            let st = r.send().await.expect("answers").status().as_u16();
            assert_eq!(st, 401, "{name}: {v:?}");
        }
        // The header the server is not told to read is ignored, even when
        // it names loopback: that one could be the client's own.
        let other = if mode == "forwarded" {
            "x-forwarded-for"
        } else {
            "forwarded"
        };
        let other_value = if mode == "forwarded" {
            "127.0.0.1"
        } else {
            "for=127.0.0.1"
        };
        let (mine, mine_value) = if mode == "forwarded" {
            ("forwarded", "for=203.0.113.5")
        } else {
            ("x-forwarded-for", "203.0.113.5")
        };
        let st = http
            .get(&url)
            .header(other, other_value)
            .header(mine, mine_value)
            .send()
            .await
            .expect("answers")
            .status()
            .as_u16();
        assert_eq!(st, 401, "{other} is not read in {mode} mode");
        // Two header lines are one list: the proxy's line (the last) counts.
        let st = http
            .get(&url)
            .header(
                mine,
                if mode == "forwarded" {
                    "for=127.0.0.1"
                } else {
                    "127.0.0.1"
                },
            )
            .header(mine, mine_value)
            .send()
            .await
            .expect("answers")
            .status()
            .as_u16();
        assert_eq!(st, 401, "two {mine} lines");
        server.shutdown().await;
    }
}

/// ADR 0005: the plaintext (transport-secured) handshake over a plain
/// WebSocket, with `X-Forwarded-Proto: wss`. Believed from a trusted proxy
/// (the connection is up), ignored from anyone else (refused, no session):
/// a client cannot talk its way out of the crypto by writing a header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plaintext_profile_needs_tls_or_a_trusted_proxy_that_says_so() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    async fn try_profile(ws: std::net::SocketAddr) -> bool {
        try_profile_with(ws, true).await
    }

    async fn try_profile_with(ws: std::net::SocketAddr, forwarded: bool) -> bool {
        let mut req = format!("ws://{ws}/")
            .into_client_request()
            .expect("request");
        if forwarded {
            req.headers_mut()
                .insert("x-forwarded-proto", "wss".parse().expect("header"));
        }
        let (mut sock, _) = tokio_tungstenite::connect_async(req)
            .await
            .expect("upgrade");
        let key = std::sync::Arc::new(mpush_protocol::crypto::RsaPublic::mpush_default());
        let mut cc = mpush_protocol::client::ClientConfig::new(key, device("fwd-1", "web"));
        cc.transport_secured = true;
        let mut conn = mpush_protocol::client::ClientConnection::new(
            std::sync::Arc::new(cc),
            [3; 32],
            mpush_protocol::Instant::now(),
            0,
            None,
            mpush_protocol::dedup::DedupWindow::default(),
        );
        while let Some(b) = conn.poll_transmit() {
            sock.send(Message::Binary(b)).await.expect("send");
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match tokio::time::timeout_at(deadline, sock.next()).await {
                Ok(Some(Ok(Message::Binary(b)))) => {
                    conn.handle_input(&b, mpush_protocol::Instant::now());
                    while let Some(e) = conn.poll_event() {
                        if matches!(e, ClientEvent::Connected { .. }) {
                            return true;
                        }
                    }
                }
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(_))) | Ok(None) => return false,
                Err(_) => panic!("the server neither answered nor closed"),
            }
        }
    }

    let mut trusted = settings();
    trusted.net.trusted_proxies = vec!["127.0.0.1".into()];
    let server = start(trusted).await;
    assert!(
        try_profile(server.ws.expect("ws")).await,
        "a trusted proxy that says wss: the profile is allowed"
    );
    server.shutdown().await;

    let mut other = settings();
    other.net.trusted_proxies = vec!["192.0.2.0/24".into()];
    let server = start(other).await;
    assert!(
        !try_profile(server.ws.expect("ws")).await,
        "the same header from a peer that is not a trusted proxy: refused"
    );
    server.shutdown().await;
    let server = start(settings()).await;
    assert!(
        !try_profile(server.ws.expect("ws")).await,
        "no trusted proxies at all, and the upgrade came through a proxy: refused"
    );
    // net.dev_loopback_transport, unset: a WebSocket gateway on loopback
    // without proxies takes the profile over plain ws:// from this machine
    // (the browser's default module against `cargo run`'s server).
    assert!(
        try_profile_with(server.ws.expect("ws"), false).await,
        "the default loopback server: the profile from loopback is allowed"
    );
    server.shutdown().await;

    let mut dev = settings();
    dev.net.dev_loopback_transport = Some(true);
    let server = start(dev).await;
    assert!(
        try_profile_with(server.ws.expect("ws"), false).await,
        "a development server: the profile from loopback is allowed"
    );
    server.shutdown().await;
    let mut off = settings();
    off.net.dev_loopback_transport = Some(false);
    let server = start(off).await;
    assert!(
        !try_profile_with(server.ws.expect("ws"), false).await,
        "turned off: refused"
    );
    server.shutdown().await;
}
