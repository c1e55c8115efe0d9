//! End-to-end: a real server on 127.0.0.1:0, real sockets, clients that behave
//! like mpush-client-java 0.8.1 (legacy) and v2 clients, over TCP and WebSocket.

mod common;

use std::time::Duration;

use common::*;
use mpush_protocol::client::ClientEvent;
use mpush_protocol::session::Profile;
use serde_json::{Value, json};

#[tokio::test]
async fn handshake_bind_and_push_in_each_ack_mode_over_each_transport() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    for (via, v2) in [
        (Via::Tcp, false),
        (Via::Tcp, true),
        (Via::Ws, false),
        (Via::Ws, true),
    ] {
        let user = format!("u-{via:?}-{v2}");
        let mut c = TestClient::connect(
            &server,
            via,
            v2,
            device(&format!("d-{user}"), "android"),
            None,
        )
        .await;
        let ClientEvent::Connected { profile, .. } = c.connected().await else {
            unreachable!()
        };
        assert_eq!(profile, if v2 { Profile::V2 } else { Profile::Legacy });
        c.bind(&user, "").await;

        // none: DELIVERED once written to the socket (nothing to wait for).
        let (st, r) = api
            .post("/api/v1/push", json!({"userId": user, "content": "m-none"}))
            .await;
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["dispatched"], 1);
        c.message("m-none").await;
        api.trace_state(
            r["traceId"].as_str().unwrap_or_default(),
            &user,
            "DELIVERED",
        )
        .await;

        // auto: the SDK acks on receipt: ACK, saying it was the SDK.
        let (_, r) = api
            .post(
                "/api/v1/push",
                json!({"userId": user, "content": "m-auto", "ackMode": "auto"}),
            )
            .await;
        c.message("m-auto").await;
        let t = api
            .trace_state(r["traceId"].as_str().unwrap_or_default(), &user, "ACK")
            .await;
        assert_eq!(t["recipients"][0]["deviceId"], format!("d-{user}"));
        assert_eq!(
            t["recipients"][0]["detail"], "acknowledged by the SDK (auto)",
            "{t}"
        );

        // biz: the app acks: ACK.
        let (_, r) = api
            .post(
                "/api/v1/push",
                json!({"userId": user, "content": "m-biz", "ackMode": "biz"}),
            )
            .await;
        let ClientEvent::Message(m) = c.message("m-biz").await else {
            unreachable!()
        };
        c.ack(m.ack.expect("biz messages carry an ack token"));
        api.trace_state(r["traceId"].as_str().unwrap_or_default(), &user, "ACK")
            .await;
        c.close();
    }
    server.shutdown().await;
}

#[tokio::test]
async fn missing_acks_are_retried_then_time_out() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    for v2 in [false, true] {
        let user = format!("slow-{v2}");
        let mut c = bound(&server, Via::Tcp, v2, device(&user, "android"), &user, "").await;
        let (_, r) = api
            .post(
                "/api/v1/push",
                json!({"userId": user, "content": "never acked", "ackMode": "biz"}),
            )
            .await;
        let trace = r["traceId"].as_str().unwrap_or_default().to_owned();
        // 300 ms x 4 attempts with the test settings.
        let t = api.trace_state(&trace, &user, "TIMEOUT").await;
        let history = t["recipients"][0]["history"].to_string();
        for n in 1..=3 {
            assert!(history.contains(&format!("resent (retry {n})")), "{t}");
        }
        c.settle(Duration::from_millis(200)).await;
        assert_eq!(
            c.messages(),
            vec!["never acked"],
            "retries are deduplicated by the client"
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn fast_connect_resumes_and_falls_back() {
    let server = start(settings()).await;
    for v2 in [false, true] {
        let dev = device(&format!("fc-{v2}"), "android");
        let mut c = TestClient::connect(&server, Via::Tcp, v2, dev.clone(), None).await;
        let ClientEvent::Connected { ticket, .. } = c.connected().await else {
            unreachable!()
        };
        let ticket = ticket.expect("a resume ticket");
        c.close();
        let mut again =
            TestClient::connect(&server, Via::Tcp, v2, dev.clone(), Some(ticket.clone())).await;
        let ClientEvent::Connected {
            resumed, profile, ..
        } = again.connected().await
        else {
            unreachable!()
        };
        assert!(resumed, "fast connect (v2={v2})");
        assert_eq!(profile == Profile::V2, v2);
        again.bind("fc-user", "").await;
        again.close();
        // Unknown session: ERROR 103, then a full handshake on the same socket.
        let mut bogus = ticket.clone();
        bogus.session_id = "00000000000000000000000000000000".into();
        let mut c3 = TestClient::connect(&server, Via::Tcp, v2, dev, Some(bogus)).await;
        c3.wait_for("resume rejected", |e| {
            matches!(e, ClientEvent::ResumeRejected { .. })
        })
        .await;
        let ClientEvent::Connected { resumed, .. } = c3.connected().await else {
            unreachable!()
        };
        assert!(!resumed);
    }
    server.shutdown().await;
}

#[tokio::test]
async fn duplicate_login_kicks_the_older_device_of_the_same_type() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let mut phone1 = bound(
        &server,
        Via::Tcp,
        false,
        device("phone-1", "android"),
        "alice",
        "",
    )
    .await;
    let mut pc = bound(
        &server,
        Via::Tcp,
        true,
        device("pc-1", "windows"),
        "alice",
        "",
    )
    .await;
    let mut phone2 = bound(
        &server,
        Via::Tcp,
        true,
        device("phone-2", "ios"),
        "alice",
        "",
    )
    .await;
    phone1
        .wait_for("kick", |e| matches!(e, ClientEvent::Kicked { device_id, user_id } if device_id == "phone-1" && user_id == "alice"))
        .await;
    let (_, u) = api.get("/api/v1/users/alice").await;
    let mut devices: Vec<String> = u["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| d["deviceId"].as_str().unwrap_or("").to_owned())
        .collect();
    devices.sort();
    assert_eq!(devices, vec!["pc-1", "phone-2"], "{u}");
    // A push reaches both current devices, not the kicked one.
    api.post(
        "/api/v1/push",
        json!({"userId": "alice", "content": "hi all"}),
    )
    .await;
    phone2.message("hi all").await;
    pc.message("hi all").await;
    phone1.settle(Duration::from_millis(200)).await;
    assert!(phone1.messages().is_empty());
    server.shutdown().await;
}

#[tokio::test]
async fn offline_messages_arrive_in_order_after_reconnect_and_leave_the_inbox_when_acked() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let mut traces = Vec::new();
    for i in 0..3 {
        let (st, r) = api.post("/api/v1/push", json!({"userId": "bob", "content": format!("offline {i}"), "ackMode": "auto", "ttlSeconds": 60})).await;
        assert_eq!((st, r["stored"].as_bool()), (200, Some(true)), "{r}");
        traces.push(r["traceId"].as_str().unwrap_or_default().to_owned());
    }
    api.trace_state(&traces[0], "bob", "OFFLINE").await;
    let (_, u) = api.get("/api/v1/users/bob").await;
    assert_eq!(u["inbox"], 3);
    let mut c = TestClient::connect(
        &server,
        Via::Tcp,
        true,
        device("bob-phone", "android"),
        None,
    )
    .await;
    c.connected().await;
    c.bind("bob", "").await;
    c.message("offline 2").await;
    assert_eq!(c.messages(), vec!["offline 0", "offline 1", "offline 2"]);
    for t in &traces {
        api.trace_state(t, "bob", "ACK").await;
    }
    let (_, u) = api.get("/api/v1/users/bob").await;
    assert_eq!(u["inbox"], 0, "{u}");
    // Without a TTL an offline user gets nothing later.
    let (_, r) = api
        .post(
            "/api/v1/push",
            json!({"userId": "carol", "content": "gone"}),
        )
        .await;
    assert_eq!(r["stored"], false);
    api.trace_state(
        r["traceId"].as_str().unwrap_or_default(),
        "carol",
        "OFFLINE",
    )
    .await;
    server.shutdown().await;
}

/// Chromium's user agent as mpush's web page sends it: `"web " + navigator.userAgent`.
const WEB_OS_NAME: &str = "web Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0";

/// Conditions as backends moving from Java mpush send them (mpush's own
/// sources and docs) select the same connections as mpush's JavaScript
/// engine did: a field the client did not send is null, a method of null
/// selects nobody, a result that is not the boolean `true` selects nobody.
#[tokio::test]
async fn mpush_conditions_select_as_java_mpush_did() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let mut clients = Vec::new();
    // (user, OS name, tags, legacy mpush 0.8.1 profile?)
    let who = [
        ("a1", "android", "test,vip", true),
        ("a2", "android", "", true),
        ("i1", "ios", "vip", false),
        ("w1", WEB_OS_NAME, "test", false),
    ];
    for (user, os, tags, legacy) in who {
        let mut dev = device(user, os);
        dev.os_version = if os == "ios" {
            "17.4.1".into()
        } else {
            "14".into()
        };
        dev.client_version = if user == "a2" {
            "1.0.0".into()
        } else {
            "2.3.1".into()
        };
        clients.push(bound(&server, Via::Tcp, !legacy, dev, user, tags).await);
    }
    let cases = [
        // mpush-test's PushClientTestMain.
        ("tags&&tags.indexOf('test')!=-1", vec!["a1", "w1"]),
        (
            r#"tags.indexOf("vip") >= 0 && osName == "android""#,
            vec!["a1"],
        ),
        (
            r#"osName == "android" || osName == "ios""#,
            vec!["a1", "a2", "i1"],
        ),
        (
            r#"osName.indexOf("web") == 0 && osName.indexOf("Chrome/") > 0"#,
            vec!["w1"],
        ),
        (
            "parseInt(osVersion) >= 14 && clientVersion != '1.0.0'",
            vec!["a1", "i1", "w1"],
        ),
        (r#"/^(a|i)\d$/.test(userId) && !tags"#, vec!["a2"]),
        // The server's earlier (evalexpr) syntax.
        (
            r#"osName == "android" && str::regex_matches(tags, "vip")"#,
            vec!["a1"],
        ),
    ];
    for (k, (cond, want)) in cases.iter().enumerate() {
        let text = format!("cond-{k}");
        let (st, r) = api
            .post(
                "/api/v1/broadcast",
                json!({"content": text, "condition": cond}),
            )
            .await;
        assert_eq!(st, 202, "{cond}: {r}");
        for ((user, ..), c) in who.iter().zip(clients.iter_mut()) {
            if want.contains(user) {
                c.message(&text).await;
            }
        }
    }
    for ((user, ..), c) in who.iter().zip(clients.iter_mut()) {
        c.settle(Duration::from_millis(300)).await;
        let got: Vec<String> = c.messages();
        let want: Vec<String> = cases
            .iter()
            .enumerate()
            .filter(|(_, (_, w))| w.contains(user))
            .map(|(k, _)| format!("cond-{k}"))
            .collect();
        assert_eq!(got, want, "{user}");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn broadcast_with_a_tag_filter_and_topic_push() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let mut clients = Vec::new();
    for (user, tags) in [("t1", "vip,beta"), ("t2", "beta"), ("t3", "vip")] {
        let c = bound(&server, Via::Tcp, true, device(user, "android"), user, tags).await;
        clients.push(c);
    }
    let (st, r) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "for vips", "tags": ["vip"]}),
        )
        .await;
    assert_eq!(st, 202, "{r}");
    clients[0].message("for vips").await;
    clients[2].message("for vips").await;
    // A broadcast's trace is counts per node, not a record per recipient.
    let trace = r["traceId"].as_str().unwrap_or_default().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, t) = api.get(&format!("/api/v1/traces/{trace}")).await;
        let total = &t["broadcast"]["total"];
        if total["DISPATCHED"] == 2 && total["DELIVERED"] == 2 {
            assert_eq!(t["recipients"].as_array().map(Vec::len), Some(0), "{t}");
            assert_eq!(t["state"], "DELIVERED", "{t}");
            assert_eq!(t["broadcast"]["nodes"]["local"]["DELIVERED"], 2, "{t}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "broadcast trace: {t}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (st, _) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "cond", "condition": "userId == \"t2\""}),
        )
        .await;
    assert_eq!(st, 202);
    clients[1].message("cond").await;
    clients[1].settle(Duration::from_millis(200)).await;
    assert_eq!(clients[1].messages(), vec!["cond"], "t2 has no vip tag");
    let (st, _) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "x", "condition": "userId == ("}),
        )
        .await;
    assert_eq!(st, 400, "a bad condition is the caller's error");
    let (st, _) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "x", "condition": "userId"}),
        )
        .await;
    assert_eq!(st, 400, "a condition must be boolean");

    let (st, r) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "x", "condition": "userId.repeat(100000).length > 0"}),
        )
        .await;
    assert_eq!(st, 400, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("never make more than their input")),
        "a refusal says why: {r}"
    );

    for u in ["t1", "t3", "nobody-online"] {
        let (st, _) = api
            .text(
                reqwest::Method::PUT,
                &format!("/api/v1/topics/news/subscribers/{u}"),
                None,
            )
            .await;
        assert_eq!(st, 200);
    }
    let (st, r) = api
        .post(
            "/api/v1/topics/news/push",
            json!({"content": "news!", "ackMode": "auto"}),
        )
        .await;
    assert_eq!((st, r["subscribers"].as_u64()), (202, Some(3)), "{r}");
    clients[0].message("news!").await;
    clients[2].message("news!").await;
    let trace = r["traceId"].as_str().unwrap_or_default();
    api.trace_state(trace, "t1", "ACK").await;
    api.trace_state(trace, "nobody-online", "OFFLINE").await;
    let (st, _) = api
        .text(
            reqwest::Method::DELETE,
            "/api/v1/topics/news/subscribers/t3",
            None,
        )
        .await;
    assert_eq!(st, 200);
    let (st, _) = api
        .text(
            reqwest::Method::DELETE,
            "/api/v1/topics/news/subscribers/t3",
            None,
        )
        .await;
    assert_eq!(st, 404);
    server.shutdown().await;
}

#[tokio::test]
async fn mpush_compatible_exec_and_alloc_routes() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let mut c = TestClient::connect(
        &server,
        Via::Tcp,
        false,
        device("legacy-1", "android"),
        None,
    )
    .await;
    c.connected().await;
    c.bind("dave", "").await;

    // /exec method=push as a form, as mpush's alloc received it.
    let r = api
        .http
        .post(format!("{}/exec", api.base))
        .form(&[
            ("method", "push"),
            ("userId", "dave"),
            ("msgbody", "via exec"),
            ("ack", "true"),
            ("traceId", "trace-exec-1"),
        ])
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.expect("json");
    assert_eq!(v["traceId"], "trace-exec-1");
    c.message("via exec").await;
    api.trace_state("trace-exec-1", "dave", "ACK").await;
    let (st, q) = api
        .get("/exec?method=queryTrace&traceId=trace-exec-1")
        .await;
    assert_eq!(st, 200);
    assert_eq!(q["states"]["dave"], "ACK", "{q}");

    api.text(
        reqwest::Method::PUT,
        "/api/v1/topics/sports/subscribers/dave",
        None,
    )
    .await;
    let (st, t) = api
        .post(
            "/exec",
            json!({"method": "topicPush", "topic": "sports", "msgbody": "goal"}),
        )
        .await;
    assert_eq!(st, 200, "{t}");
    c.message("goal").await;
    let (st, e) = api.post("/exec", json!({"method": "nope"})).await;
    assert_eq!(st, 400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("nope")
    );

    // alloc: GET / lists the connect server; POST /push sends alloc's message.
    let (st, list) = api.text(reqwest::Method::GET, "/", None).await;
    assert_eq!((st, list), (200, server.tcp.to_string()));
    let (st, reply) = api
        .text(
            reqwest::Method::POST,
            "/push",
            Some(json!({"userId": "dave", "hello": "hi"})),
        )
        .await;
    assert_eq!(
        (st, reply.as_str()),
        (200, "服务已经开始推送,请注意查收消息")
    );
    let ev = c.wait_for("alloc push", |e| matches!(e, ClientEvent::Message(m) if String::from_utf8_lossy(&m.content).contains("msgType"))).await;
    let ClientEvent::Message(m) = ev else {
        unreachable!()
    };
    let v: serde_json::Value = serde_json::from_slice(&m.content).expect("alloc's PushMsg JSON");
    assert_eq!(v["msgType"], 3);
    assert!(
        v["content"]
            .as_str()
            .unwrap_or("")
            .contains("MPush开源推送，hi")
    );
    server.shutdown().await;
}

#[tokio::test]
async fn legacy_javascript_client_speaks_json_over_websocket() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let mut js = JsonClient::connect(&server).await;
    js.send(json!({"cmd": 2, "flags": 16, "sessionId": 1, "body": {"deviceId": "browser-1", "osName": "web", "osVersion": "x", "clientVersion": "1"}})).await;
    let hs = js.recv().await;
    assert_eq!(
        (hs["cmd"].as_u64(), hs["sessionId"].as_u64()),
        (Some(2), Some(1))
    );
    js.send(
        json!({"cmd": 5, "flags": 16, "sessionId": 2, "body": {"userId": "erin", "tags": "web"}}),
    )
    .await;
    let ok = js.recv().await;
    assert_eq!(
        (ok["cmd"].as_u64(), ok["body"]["data"].as_str()),
        (Some(11), Some("bind success")),
        "{ok}"
    );
    let (_, r) = api
        .post(
            "/api/v1/push",
            json!({"userId": "erin", "content": "to the browser", "ackMode": "auto"}),
        )
        .await;
    let push = js.recv().await;
    assert_eq!(push["cmd"], 15);
    assert_eq!(push["body"]["content"], "to the browser");
    assert_eq!(push["flags"].as_u64().unwrap_or(0) & 8, 8, "auto-ack flag");
    js.send(json!({"cmd": 23, "flags": 16, "sessionId": push["sessionId"], "body": null}))
        .await;
    api.trace_state(r["traceId"].as_str().unwrap_or_default(), "erin", "ACK")
        .await;
    let (_, u) = api.get("/api/v1/users/erin").await;
    assert_eq!(u["devices"][0]["transport"], "ws");
    assert_eq!(u["devices"][0]["clientType"], 3);
    server.shutdown().await;
}

#[tokio::test]
async fn api_kick_closes_the_device() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let mut c = bound(
        &server,
        Via::Tcp,
        true,
        device("k-1", "android"),
        "frank",
        "",
    )
    .await;
    let (st, r) = api.post("/api/v1/users/frank/kick", json!({})).await;
    assert_eq!((st, r["kicked"].as_u64()), (200, Some(1)), "{r}");
    c.wait_for("kick", |e| matches!(e, ClientEvent::Kicked { .. }))
        .await;
    c.wait_for("closed", |e| matches!(e, ClientEvent::Closed { .. }))
        .await;
    let (st, _) = api.post("/api/v1/users/frank/kick", json!({})).await;
    assert_eq!(st, 404);
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_redirects_v2_clients_and_keeps_unacked_messages() {
    let mut s = settings();
    s.shutdown.redirect_to = "10.1.2.3:3000".into();
    s.shutdown.redirect_to_ws = "wss://push.example/ws".into();
    s.shutdown.drain_timeout_ms = 1500;
    let server = start(s).await;
    let api = Api::new(&server);
    let (st, _) = api.get("/readyz").await;
    assert_eq!(st, 200, "ready before the drain");
    let mut v2 = bound(
        &server,
        Via::Tcp,
        true,
        device("sd-1", "android"),
        "gina",
        "",
    )
    .await;
    let (_, r) = api
        .post(
            "/api/v1/push",
            json!({"userId": "gina", "content": "keep me", "ackMode": "biz", "ttlSeconds": 600}),
        )
        .await;
    assert_eq!(r["stored"], true);
    v2.message("keep me").await;
    api.post(
        "/api/v1/push",
        json!({"userId": "gina", "content": "no ttl", "ackMode": "biz"}),
    )
    .await;
    let (_, _) = api
        .post(
            "/api/v1/push",
            json!({"userId": "gina", "content": "no ack needed"}),
        )
        .await;
    v2.message("no ack needed").await;
    let hub = server.hub.clone();
    let t0 = std::time::Instant::now();
    // Readiness turns 503 as soon as the drain starts (un-ACKed pushes keep
    // the connection, so the drain lasts until its deadline).
    let probe = {
        let api = Api::new(&server);
        tokio::spawn(async move {
            for _ in 0..100 {
                let (st, v) = api.get("/readyz").await;
                if st == 503 {
                    return Some(v);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            None
        })
    };
    server.shutdown().await;
    assert!(t0.elapsed() < Duration::from_secs(5), "drain is bounded");
    let not_ready = probe
        .await
        .expect("probe")
        .expect("readyz said 503 while draining");
    assert_eq!(not_ready["reason"], "draining", "{not_ready}");
    let ClientEvent::Redirect(r) = v2
        .wait_for("redirect", |e| matches!(e, ClientEvent::Redirect(_)))
        .await
    else {
        unreachable!()
    };
    // A TCP client is sent to a TCP address, after a non-zero, jittered wait.
    assert_eq!(r.address, "10.1.2.3:3000");
    assert!(r.retry_after_ms >= 100 && r.jitter_ms > 0, "{r:?}");
    v2.wait_for("closed", |e| matches!(e, ClientEvent::Closed { .. }))
        .await;
    let kept = hub
        .delivery()
        .inbox()
        .list("gina", unix_ms())
        .await
        .expect("memory inbox");
    let kept: Vec<&[u8]> = kept.iter().map(|m| &m.content[..]).collect();
    assert_eq!(
        kept,
        vec![&b"keep me"[..], &b"no ttl"[..]],
        "every un-ACKed message stays in the inbox"
    );
}

#[tokio::test]
async fn trace_shows_accepted_failed_and_per_message_ack_timeouts() {
    let mut s = settings();
    s.delivery.ack_waits_ms = vec![60_000; 3];
    s.delivery.inbox_max = 1;
    let server = start(s).await;
    let api = Api::new(&server);
    // A broadcast nobody matches says so: finished, matched 0 (it is not
    // left looking like one still running).
    let (_, r) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "nobody", "tags": ["none"]}),
        )
        .await;
    let path = format!(
        "/api/v1/traces/{}",
        r["traceId"].as_str().unwrap_or_default()
    );
    let mut t = Value::Null;
    for _ in 0..100 {
        t = api.get(&path).await.1;
        if t["broadcast"]["finished"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(t["broadcast"]["finished"], true, "{t}");
    assert_eq!(t["broadcast"]["matched"], 0, "{t}");
    assert_eq!(t["state"], "ACCEPTED", "{t}");
    // A full inbox is reported, never silently dropped.
    api.post(
        "/api/v1/push",
        json!({"userId": "ivy", "content": "1", "ttlSeconds": 60}),
    )
    .await;
    let (st, r) = api
        .post(
            "/api/v1/push",
            json!({"userId": "ivy", "content": "2", "ttlSeconds": 60}),
        )
        .await;
    // Neither handed on nor kept: not a 2xx (ADR 0007).
    assert_eq!(st, 409, "{r}");
    assert_eq!(r["error"]["code"], "inbox_full", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("full"),
        "{r}"
    );
    assert_eq!(r["status"], "inbox_full", "{r}");
    let t = api
        .trace_state(r["traceId"].as_str().unwrap_or_default(), "ivy", "FAILED")
        .await;
    assert!(
        t["recipients"][0]["detail"]
            .as_str()
            .unwrap_or("")
            .contains("full"),
        "{t}"
    );
    // timeoutMs overrides the configured 60 s wait for this message.
    let _client = bound(
        &server,
        Via::Tcp,
        true,
        device("to-1", "android"),
        "jack",
        "",
    )
    .await;
    let t0 = std::time::Instant::now();
    let (_, r) = api
        .post(
            "/api/v1/push",
            json!({"userId": "jack", "content": "quick", "ackMode": "biz", "timeoutMs": 100}),
        )
        .await;
    api.trace_state(r["traceId"].as_str().unwrap_or_default(), "jack", "TIMEOUT")
        .await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    server.shutdown().await;
}

#[tokio::test]
async fn a_message_without_ack_sent_online_is_not_kept_for_later() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let mut c = bound(&server, Via::Tcp, true, device("k-1", "android"), "kim", "").await;
    let (_, r) = api
        .post(
            "/api/v1/push",
            json!({"userId": "kim", "content": "once", "ttlSeconds": 60}),
        )
        .await;
    // Kept until a connection wrote it (a node that died first would not
    // lose it), then out of the inbox: not replayed at the next bind.
    assert_eq!(
        (&r["stored"], &r["dispatched"]),
        (&json!(true), &json!(1)),
        "{r}"
    );
    c.message("once").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while api.get("/api/v1/users/kim").await.1["inbox"] != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "left the inbox once written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.close();
    let mut again = bound(&server, Via::Tcp, true, device("k-1", "android"), "kim", "").await;
    again.settle(Duration::from_millis(200)).await;
    assert!(again.messages().is_empty(), "{:?}", again.messages());
    server.shutdown().await;
}

/// What browsers need from the HTTP port: the WebSocket allocator (any
/// origin), CORS on the API only for configured origins, the demo folder.
#[tokio::test]
async fn browser_routes_allocator_cors_and_demo() {
    let demo = std::env::temp_dir().join(format!("mpush-demo-{}", std::process::id()));
    std::fs::create_dir_all(&demo).expect("demo dir");
    std::fs::write(demo.join("index.html"), "<h1>demo</h1>").expect("index");
    let mut s = settings();
    s.security.cors_origins = vec!["http://app.example".into()];
    s.net.demo_dir = demo.display().to_string();
    let server = start(s).await;
    let api = Api::new(&server);
    let ws = server.ws.expect("ws gateway");

    let (st, list) = api.text(reqwest::Method::GET, "/?transport=ws", None).await;
    assert_eq!((st, list), (200, format!("ws://{ws}/")));
    let (st, body) = api
        .text(reqwest::Method::GET, "/?transport=carrier-pigeon", None)
        .await;
    assert_eq!(st, 400, "{body}");
    let r = api
        .http
        .get(format!("{}/?transport=ws", api.base))
        .header("origin", "http://elsewhere.example")
        .send()
        .await
        .expect("request");
    assert_eq!(r.headers()["access-control-allow-origin"], "*");

    // Preflight from the configured origin is allowed; others get no grant.
    let preflight = |origin: &'static str| {
        api.http
            .request(
                reqwest::Method::OPTIONS,
                format!("{}/api/v1/push", api.base),
            )
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "content-type")
            .send()
    };
    let ok = preflight("http://app.example").await.expect("preflight");
    assert_eq!(
        ok.headers()
            .get("access-control-allow-origin")
            .map(|v| v.to_str().unwrap_or_default().to_owned()),
        Some("http://app.example".to_owned())
    );
    let other = preflight("http://evil.example").await.expect("preflight");
    assert!(other.headers().get("access-control-allow-origin").is_none());
    let r = api
        .http
        .post(format!("{}/api/v1/push", api.base))
        .header("origin", "http://app.example")
        .json(&json!({"userId": "nobody", "content": "x", "ttlSeconds": 60}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://app.example"
    );

    // The demo folder at /demo/ (and /demo redirects there); nothing outside it.
    let (st, page) = api.text(reqwest::Method::GET, "/demo/", None).await;
    assert_eq!((st, page.as_str()), (200, "<h1>demo</h1>"));
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
        .get(format!("{}/demo", api.base))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 308);
    assert_eq!(r.headers()["location"], "/demo/");
    let (st, _) = api
        .text(reqwest::Method::GET, "/demo/%2e%2e/Cargo.toml", None)
        .await;
    assert_eq!(st, 404);
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&demo);
}

/// Retries follow the user for broadcasts too: a copy with an ACK mode that
/// a connection never acknowledged goes to the user's inbox when it closes.
#[tokio::test]
async fn an_unacked_broadcast_copy_goes_to_the_inbox_when_the_connection_closes() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let mut c = bound(
        &server,
        Via::Tcp,
        true,
        device("bc-1", "android"),
        "hana",
        "",
    )
    .await;
    let (st, _) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "to everyone", "ackMode": "biz"}),
        )
        .await;
    assert_eq!(st, 202);
    c.message("to everyone").await;
    let (_, u) = api.get("/api/v1/users/hana").await;
    assert_eq!(
        u["inbox"], 0,
        "a broadcast is not stored while it is in flight: {u}"
    );
    c.close();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, u) = api.get("/api/v1/users/hana").await;
        if u["inbox"] == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not kept: {u}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_help_units_histograms_and_build_info() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let mut c = bound(
        &server,
        Via::Tcp,
        true,
        device("m-1", "android"),
        "metric-user",
        "",
    )
    .await;
    let (st, _) = api
        .post(
            "/api/v1/push",
            serde_json::json!({"userId": "metric-user", "content": "measured", "ackMode": "auto"}),
        )
        .await;
    assert_eq!(st, 200);
    c.message("measured").await;
    // The ACK reaches the server (the trace says so) before the scrape.
    let deadline = tokio::time::Instant::now() + WAIT;
    let metrics = loop {
        let (_, m) = api.text(reqwest::Method::GET, "/metrics", None).await;
        if m.contains("mpush_push_ack_seconds_count") {
            break m;
        }
        assert!(tokio::time::Instant::now() < deadline, "{m}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    for needle in [
        "# HELP mpush_connections Open client connections",
        "# TYPE mpush_handshake_duration_seconds histogram",
        "mpush_handshake_duration_seconds_bucket{kind=\"full\",le=\"0.1\"}",
        "# TYPE mpush_push_write_delay_seconds histogram",
        "mpush_push_write_delay_seconds_count",
        "# TYPE mpush_push_ack_seconds histogram",
        "mpush_api_request_duration_seconds_count{route=\"push\"} ",
        "mpush_build_info{",
    ] {
        assert!(metrics.contains(needle), "{needle} missing:\n{metrics}");
    }
    server.shutdown().await;
}

// ----- ADR 0008: a resumed session keeps its binding -----------------------

/// The ticket of a `Connected` event; asserts whether it was a resume.
fn ticket_of(e: ClientEvent, resumed: bool) -> mpush_protocol::session::ResumeTicket {
    let ClientEvent::Connected {
        ticket, resumed: r, ..
    } = e
    else {
        unreachable!()
    };
    assert_eq!(r, resumed, "resumed");
    ticket.expect("a ticket")
}

async fn online(api: &Api, user: &str) -> bool {
    let (st, u) = api.get(&format!("/api/v1/users/{user}")).await;
    assert_eq!(st, 200, "{u}");
    u["online"].as_bool().expect("online")
}

async fn wait_offline(api: &Api, user: &str) {
    let t0 = std::time::Instant::now();
    while online(api, user).await {
        assert!(t0.elapsed() < WAIT, "{user} still online");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_fast_connect_comes_back_bound_without_a_bind() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    for via in [Via::Tcp, Via::Ws] {
        let dev = device(&format!("keep-{via:?}"), "android");
        let user = format!("kate-{via:?}");
        let mut c = TestClient::connect(&server, via, true, dev.clone(), None).await;
        let ticket = ticket_of(c.connected().await, false);
        c.bind(&user, "vip").await;
        c.close();
        wait_offline(&api, &user).await;
        // Kept for the user meanwhile, replayed by the restore.
        let push =
            json!({"userId": user, "content": "while away", "ackMode": "auto", "ttlSeconds": 60});
        let (st, r) = api.post("/api/v1/push", push).await;
        assert_eq!((st, r["stored"].as_bool()), (200, Some(true)), "{r}");

        // Twice: the binding travels with each single-use ticket.
        let mut ticket = ticket;
        for round in 0..2 {
            let mut c = TestClient::connect(&server, via, true, dev.clone(), Some(ticket)).await;
            ticket = ticket_of(c.connected().await, true);
            if round == 0 {
                c.message("while away").await;
            }
            assert!(online(&api, &user).await, "bound with no BIND ({via:?})");
            let (_, u) = api.get(&format!("/api/v1/users/{user}")).await;
            assert_eq!(u["devices"][0]["tags"], "vip", "{u}");
            let text = format!("live {round}");
            let (st, r) = api
                .post("/api/v1/push", json!({"userId": user, "content": text}))
                .await;
            assert_eq!(st, 200, "{r}");
            c.message(&text).await;
            assert!(
                !c.seen
                    .iter()
                    .any(|e| matches!(e, ClientEvent::BindOk { .. })),
                "no BIND was answered"
            );
            c.close();
            wait_offline(&api, &user).await;
        }

        // An UNBIND leaves nothing to restore.
        let mut c = TestClient::connect(&server, via, true, dev.clone(), Some(ticket)).await;
        ticket = ticket_of(c.connected().await, true);
        assert!(online(&api, &user).await);
        c.unbind(&user);
        c.wait_for("unbound", |e| matches!(e, ClientEvent::Unbound { .. }))
            .await;
        c.close();
        let mut c = TestClient::connect(&server, via, true, dev.clone(), Some(ticket)).await;
        ticket = ticket_of(c.connected().await, true);
        c.settle(Duration::from_millis(100)).await;
        assert!(!online(&api, &user).await, "not restored after an unbind");

        // Nor does a kick.
        c.bind(&user, "").await;
        let (st, _) = api
            .post(&format!("/api/v1/users/{user}/kick"), json!({}))
            .await;
        assert_eq!(st, 200);
        c.wait_for("closed", |e| matches!(e, ClientEvent::Closed { .. }))
            .await;
        wait_offline(&api, &user).await;
        let mut c = TestClient::connect(&server, via, true, dev.clone(), Some(ticket)).await;
        ticket_of(c.connected().await, true);
        c.settle(Duration::from_millis(100)).await;
        assert!(!online(&api, &user).await, "not restored after a kick");
        c.close();
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_kept_binding_ends_with_its_bind_token() {
    let mut s = settings();
    s.security.bind_secret = "keep-secret".into();
    s.limits.keep_binding = Some(true);
    let server = start(s).await;
    let api = Api::new(&server);
    let dev = device("token-phone", "android");
    let mut c = TestClient::connect(&server, Via::Tcp, true, dev.clone(), None).await;
    let ticket = ticket_of(c.connected().await, false);
    // A token that expires in a second or two.
    let exp = unix_ms() / 1000 + 2;
    let token = mpush_server::auth::sign_bind_token("keep-secret", "tom", exp);
    c.bind_with_token("tom", "", &token).await;
    c.close();
    wait_offline(&api, "tom").await;
    // Before the expiry the binding comes back...
    let mut c = TestClient::connect(&server, Via::Tcp, true, dev.clone(), Some(ticket)).await;
    let ticket = ticket_of(c.connected().await, true);
    assert!(
        online(&api, "tom").await,
        "restored while the token is good"
    );
    c.close();
    wait_offline(&api, "tom").await;
    // ...after it, not: the client binds itself with a fresh token.
    while unix_ms() <= exp * 1000 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut c = TestClient::connect(&server, Via::Tcp, true, dev, Some(ticket)).await;
    ticket_of(c.connected().await, true);
    c.settle(Duration::from_millis(100)).await;
    assert!(
        !online(&api, "tom").await,
        "an expired token restores nothing"
    );
    server.shutdown().await;
}
