//! Bad input gets its error, and the server keeps serving everyone else.

mod common;

use std::time::Duration;

use bytes::BytesMut;
use common::*;
use mpush_protocol::message::{Body, ErrorCode, ErrorMessage};
use mpush_protocol::packet::{Command, Decoder, Flags, Frame, Packet};
use serde_json::json;

fn errors_in(bytes: &[u8]) -> Vec<ErrorMessage> {
    let mut buf = BytesMut::from(bytes);
    let mut out = Vec::new();
    while let Ok(Some(f)) = Decoder::new(1 << 20).decode(&mut buf) {
        if let Frame::Packet(p) = f
            && p.cmd == Command::ERROR
        {
            out.push(ErrorMessage::from_bytes(&p.body).expect("error body"));
        }
    }
    out
}

#[tokio::test]
async fn bad_bytes_and_bad_requests_do_not_disturb_other_clients() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let mut good =
        TestClient::connect(&server, Via::Tcp, false, device("good-1", "android"), None).await;
    good.connected().await;
    good.bind("good", "").await;

    // Garbage: not a frame (a huge length), closed with an error.
    let reply = raw_exchange(server.tcp, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(errors_in(&reply)[0].code, ErrorCode::DISPATCH_ERROR);
    // An oversized frame: refused as soon as its header is seen.
    let mut big = vec![0u8, 0, 0x40, 0, 15, 0, 0, 0, 0, 0, 0, 1, 0];
    big.extend(vec![0u8; 100]);
    let reply = raw_exchange(server.tcp, &big).await;
    let e = &errors_in(&reply)[0];
    assert!(e.reason.contains("exceeds"), "{e:?}");
    // A handshake that does not decrypt: ERROR 100 for cmd HANDSHAKE.
    let hs = Frame::Packet(Packet::new(
        Command::HANDSHAKE,
        1,
        Flags::CRYPTO,
        vec![7u8; 128],
    ))
    .to_bytes();
    let reply = raw_exchange(server.tcp, &hs).await;
    let e = &errors_in(&reply)[0];
    assert_eq!(
        (e.cmd, e.code),
        (Command::HANDSHAKE.0, ErrorCode::DISPATCH_ERROR)
    );
    // An unknown command: ERROR 101.
    let unknown = Frame::Packet(Packet::new(Command(77), 1, Flags::NONE, vec![])).to_bytes();
    let reply = raw_exchange(server.tcp, &unknown).await;
    assert_eq!(errors_in(&reply)[0].code, ErrorCode::UNSUPPORTED_CMD);
    // Random bytes over WebSocket and JSON garbage.
    let mut js = JsonClient::connect(&server).await;
    js.send(json!({"cmd": 99, "flags": 16, "sessionId": 1}))
        .await;
    let e = js.recv().await;
    assert_eq!(
        (e["cmd"].as_u64(), e["body"]["code"].as_u64()),
        (Some(10), Some(101)),
        "{e}"
    );

    // Malformed API bodies: 4xx with a JSON error naming the problem.
    for (path, body, needle) in [
        ("/api/v1/push", json!({"content": "no user"}), "userId"),
        ("/api/v1/push", json!({"userId": "x"}), "content"),
        (
            "/api/v1/push",
            json!({"userId": "x", "content": "c", "ackMode": "sometimes"}),
            "ackMode",
        ),
        (
            "/api/v1/push",
            json!({"userId": "x", "contentBase64": "%%%"}),
            "base64",
        ),
        (
            "/api/v1/push",
            json!({"userId": "x", "content": "c", "clientType": 9}),
            "clientType",
        ),
        (
            "/api/v1/push",
            json!({"userId": "x", "content": "c", "ttlSeconds": 999999999}),
            "ttlSeconds",
        ),
        (
            "/api/v1/push",
            json!({"userId": "x", "content": "x".repeat(20000)}),
            "bytes",
        ),
        (
            "/api/v1/push/batch",
            json!({"userIds": [], "content": "c"}),
            "userIds",
        ),
        (
            "/api/v1/push",
            json!({"userId": "x", "content": "c", "unknownField": 1}),
            "unknown",
        ),
    ] {
        let (st, v) = api.post(path, body.clone()).await;
        assert_eq!(st, 400, "{body} -> {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(needle),
            "{body}: `{msg}` should name `{needle}`"
        );
    }
    let r = api
        .http
        .post(format!("{}/api/v1/push", api.base))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.expect("a JSON error body");
    assert_eq!(v["error"]["code"], "invalid_body");
    let r = api
        .http
        .post(format!("{}/api/v1/push", api.base))
        .body("x")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 415);
    let (st, v) = api.get("/api/v1/nothing-here").await;
    assert_eq!((st, v["error"]["code"].as_str()), (404, Some("not_found")));
    let (st, _) = api.get("/api/v1/traces/unknown-trace").await;
    assert_eq!(st, 404);

    // Through all of that, the good client is still served.
    let (st, _) = api
        .post(
            "/api/v1/push",
            json!({"userId": "good", "content": "still here", "ackMode": "auto"}),
        )
        .await;
    assert_eq!(st, 200);
    good.message("still here").await;
    let (_, h) = api.get("/healthz").await;
    assert_eq!(h["bound"], 1, "{h}");
    server.shutdown().await;
}

#[tokio::test]
async fn api_tokens_are_required_when_configured() {
    let mut s = settings();
    s.security.api_tokens = vec!["0123456789abcdef-token".into()];
    let server = start(s).await;
    let api = Api::new(&server);
    let (st, v) = api
        .post(
            "/api/v1/push",
            json!({"userId": "u", "content": "c", "ttlSeconds": 60}),
        )
        .await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let r = api
        .http
        .post(format!("{}/api/v1/push", api.base))
        .bearer_auth("wrong-wrong-wrong-wrong")
        .json(&json!({"userId": "u", "content": "c", "ttlSeconds": 60}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 401);
    let r = api
        .http
        .post(format!("{}/api/v1/push", api.base))
        .bearer_auth("0123456789abcdef-token")
        .json(&json!({"userId": "u", "content": "c", "ttlSeconds": 60}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    // Health, metrics and the OpenAPI document stay open.
    assert_eq!(api.get("/healthz").await.0, 200);
    let (st, doc) = api.get("/openapi.json").await;
    assert_eq!(st, 200);
    for path in [
        "/api/v1/push",
        "/api/v1/push/batch",
        "/api/v1/broadcast",
        "/api/v1/traces/{traceId}",
        "/api/v1/users/{userId}",
        "/api/v1/users/{userId}/kick",
        "/api/v1/topics/{topic}/push",
        "/exec",
        "/healthz",
        "/metrics",
    ] {
        assert!(doc["paths"].get(path).is_some(), "OpenAPI lacks {path}");
    }
    let (st, metrics) = api.text(reqwest::Method::GET, "/metrics", None).await;
    assert_eq!(st, 200);
    assert!(metrics.contains("mpush_connections"), "{metrics}");
    server.shutdown().await;
}

#[tokio::test]
async fn bind_tokens_are_checked_when_a_secret_is_set() {
    let mut s = settings();
    s.security.bind_secret = "bind-secret".into();
    let server = start(s).await;
    let mut c = TestClient::connect(&server, Via::Tcp, true, device("bt-1", "android"), None).await;
    c.connected().await;
    c.bind_with_token("hank", "", "bogus").await;
    c.wait_for("refused bind closes", |e| {
        matches!(e, mpush_protocol::client::ClientEvent::Closed { .. })
    })
    .await;
    let token = mpush_server::auth::sign_bind_token("bind-secret", "hank", unix_ms() / 1000 + 60);
    let mut c = TestClient::connect(&server, Via::Tcp, true, device("bt-1", "android"), None).await;
    c.connected().await;
    c.bind_with_token("hank", "", &token).await;
    c.wait_for("bind ok", |e| {
        matches!(e, mpush_protocol::client::ClientEvent::BindOk { .. })
    })
    .await;
    server.shutdown().await;
}

#[tokio::test]
async fn connections_over_the_limit_are_refused_and_the_rest_served() {
    let mut s = settings();
    s.limits.max_connections = 2;
    let server = start(s).await;
    let mut a =
        TestClient::connect(&server, Via::Tcp, false, device("lim-1", "android"), None).await;
    a.connected().await;
    let mut b =
        TestClient::connect(&server, Via::Tcp, false, device("lim-2", "android"), None).await;
    b.connected().await;
    // The third is closed at once, without a byte.
    let reply = raw_exchange(server.tcp, &[0xDF]).await;
    assert!(reply.is_empty(), "{reply:?}");
    a.bind("lim", "").await;
    let api = Api::new(&server);
    api.post("/api/v1/push", json!({"userId": "lim", "content": "ok"}))
        .await;
    a.message("ok").await;
    drop(b);
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.shutdown().await;
}
