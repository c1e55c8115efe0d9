//! Cluster mode on a real Redis (each test starts its own redis-server on a
//! free loopback port): cross-node push, kick, broadcast and topics; a node
//! killed with SIGKILL; Redis restarted mid-run.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use mpush_protocol::client::ClientEvent;
use mpush_server::{Running, Settings};
use serde_json::{Value, json};

const NODE_SECRET: &str = "test-node-secret-0123456789abcdef";

fn node_settings(redis: &str, id: &str) -> Settings {
    let mut s = settings();
    s.cluster.redis = redis.into();
    s.cluster.node_id = id.into();
    s.cluster.internal = "127.0.0.1:0".into();
    s.cluster.secret = NODE_SECRET.into();
    s.cluster.route_refresh_secs = 1;
    s.cluster.route_ttl_secs = 10;
    s.cluster.node_renew_secs = 1;
    s.cluster.node_ttl_secs = 3;
    s.cluster.timeout_ms = 500;
    s
}

async fn nodes(redis: &Redis) -> Vec<Running> {
    nodes_with(redis, |_| {}).await
}

/// Nodes A, B and C as [`nodes`] starts them, each with `tweak` applied.
async fn nodes_with(redis: &Redis, tweak: impl Fn(&mut Settings)) -> Vec<Running> {
    let mut out = Vec::new();
    for id in ["A", "B", "C"] {
        let mut s = node_settings(&redis.url(), id);
        tweak(&mut s);
        out.push(start(s).await);
    }
    // Wait until every node is registered.
    wait_for_nodes(&Api::new(&out[0]), 3).await;
    out
}

async fn on(server: &Running, user: &str, device: &str, os: &str, tags: &str) -> TestClient {
    bound(
        server,
        Via::Tcp,
        true,
        common::device(device, os),
        user,
        tags,
    )
    .await
}

#[tokio::test]
async fn push_kick_broadcast_and_topics_cross_nodes() {
    let redis = Redis::start(free_port()).await;
    let n = nodes(&redis).await;
    let (api_a, api_c) = (Api::new(&n[0]), Api::new(&n[2]));
    let mut on_b = on(&n[1], "bea", "bea-phone", "android", "vip").await;
    let mut on_c = on(&n[2], "cal", "cal-pc", "windows", "").await;
    let mut on_a = on(&n[0], "ada", "ada-phone", "android", "vip").await;

    // A user bound on B receives a push sent to A's API; the trace shows the hop.
    let (st, r) = api_a
        .post(
            "/api/v1/push",
            json!({"userId": "bea", "content": "from A", "ackMode": "auto"}),
        )
        .await;
    assert_eq!((st, r["dispatched"].as_u64()), (200, Some(1)), "{r}");
    on_b.message("from A").await;
    let t = api_a
        .trace_state(r["traceId"].as_str().unwrap_or_default(), "bea", "ACK")
        .await;
    let hops = t.to_string();
    assert!(hops.contains("forwarded from node A to node B"), "{t}");
    // One device shape whatever node is asked: node A shows the device on
    // B with every field B shows.
    let (_, via_a) = api_a.get("/api/v1/users/bea").await;
    let (_, via_b) = Api::new(&n[1]).get("/api/v1/users/bea").await;
    assert_eq!(via_a["devices"], via_b["devices"], "{via_a} {via_b}");
    let d = &via_a["devices"][0];
    assert_eq!(d["tags"], "vip", "{via_a}");
    for field in [
        "osName",
        "clientVersion",
        "profile",
        "transport",
        "connectedAtMs",
    ] {
        assert!(!d[field].is_null(), "{field} missing: {via_a}");
    }
    assert!(
        hops.contains("DISPATCHED") && t["recipients"][0]["deviceId"] == "bea-phone",
        "{t}"
    );

    // Bea logs in again from another phone on C: the phone on B is kicked.
    let _bea2 = on(&n[2], "bea", "bea-phone-2", "ios", "").await;
    on_b.wait_for(
        "cross-node kick",
        |e| matches!(e, ClientEvent::Kicked { device_id, .. } if device_id == "bea-phone"),
    )
    .await;
    let (_, r) = api_a
        .post(
            "/api/v1/push",
            json!({"userId": "bea", "content": "to the new phone"}),
        )
        .await;
    assert_eq!(r["dispatched"], 1, "{r}");

    // A broadcast from C reaches every bound connection: the phone on B
    // was replaced by bea's newer login, so it is connected but no longer
    // bea's (as on one node, and in mpush) and gets no broadcast.
    let (st, everyone) = api_c
        .post(
            "/api/v1/broadcast",
            json!({"content": "everyone", "condition": "true"}),
        )
        .await;
    assert_eq!(st, 202);
    on_a.message("everyone").await;
    on_c.message("everyone").await;
    on_b.settle(Duration::from_millis(300)).await;
    assert!(
        !on_b.messages().contains(&"everyone".to_owned()),
        "the replaced phone got the broadcast"
    );
    // Its trace: the three nodes it reached each reported, and it matched
    // every bound connection (three: ada on A, cal and bea's newer phone on
    // C); finished once the copies are settled. A broadcast that
    // matched nobody is finished at once, with matched 0 on every node.
    let (st, nobody) = api_a
        .post(
            "/api/v1/broadcast",
            json!({"content": "nobody", "tags": ["no-such-tag"]}),
        )
        .await;
    assert_eq!(st, 202);
    for (r, matched) in [(&everyone, 3), (&nobody, 0)] {
        let path = format!("/api/v1/traces/{}", r["traceId"].as_str().unwrap_or(""));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let t = loop {
            let (_, t) = Api::new(&n[1]).get(&path).await;
            if t["broadcast"]["finished"] == true {
                break t;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never finished: {t}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(t["broadcast"]["matched"], matched, "{t}");
        assert_eq!(t["broadcast"]["nodesExpected"], 3, "{t}");
        assert_eq!(
            t["broadcast"]["nodes"].as_object().map(|n| n.len()),
            Some(3),
            "{t}"
        );
    }
    let (st, _) = api_c
        .post(
            "/api/v1/broadcast",
            json!({"content": "vips", "tags": ["vip"]}),
        )
        .await;
    assert_eq!(st, 202);
    on_a.message("vips").await;
    on_c.settle(Duration::from_millis(300)).await;
    assert!(!on_c.messages().contains(&"vips".to_owned()));

    // Topics are shared: subscribe through A, push through C, delivered on A and C.
    for u in ["ada", "cal"] {
        api_a
            .text(
                reqwest::Method::PUT,
                &format!("/api/v1/topics/news/subscribers/{u}"),
                None,
            )
            .await;
    }
    let (st, r) = api_c
        .post("/api/v1/topics/news/push", json!({"content": "topic!"}))
        .await;
    assert_eq!((st, r["subscribers"].as_u64()), (202, Some(2)), "{r}");
    on_a.message("topic!").await;
    on_c.message("topic!").await;

    // The allocator lists the three nodes, least loaded first.
    let (_, list) = api_a.text(reqwest::Method::GET, "/", None).await;
    assert_eq!(list.split(',').count(), 3, "{list}");
    for node in n {
        node.shutdown().await;
    }
}

#[tokio::test]
async fn redis_restart_keeps_local_delivery_and_cross_node_delivery_comes_back() {
    let port = free_port();
    let redis = Redis::start(port).await;
    // Timers too slow to repair anything within the test: what comes back
    // comes back because the nodes re-assert it the moment Redis is back.
    let mut n = Vec::new();
    for id in ["A", "B"] {
        let mut s = node_settings(&redis.url(), id);
        s.cluster.route_refresh_secs = 60;
        s.cluster.route_ttl_secs = 120;
        s.cluster.node_renew_secs = 10;
        s.cluster.node_ttl_secs = 30;
        n.push(start(s).await);
    }
    wait_for_nodes(&Api::new(&n[0]), 2).await;
    let api_a = Api::new(&n[0]);
    let mut on_a = on(&n[0], "lou", "lou-1", "android", "").await;
    let mut on_b = on(&n[1], "rem", "rem-1", "android", "").await;
    api_a
        .post(
            "/api/v1/push",
            json!({"userId": "rem", "content": "before"}),
        )
        .await;
    on_b.message("before").await;

    // Readiness asks Redis at most once a second however often it is
    // probed (the route is open without a token).
    let pings = |v: redis::Value| {
        let text = format!("{v:?}");
        text.split("cmdstat_ping:calls=")
            .nth(1)
            .and_then(|r| r.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = pings(redis.query(&["INFO", "commandstats"]).await);
    for _ in 0..200 {
        let (st, _) = api_a.get("/readyz").await;
        assert_eq!(st, 200);
    }
    let after = pings(redis.query(&["INFO", "commandstats"]).await);
    assert!(
        after - before <= 5,
        "200 probes cost {} Redis PINGs",
        after - before
    );

    drop(redis);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Not ready while Redis is down.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (st, v) = api_a.get("/readyz").await;
        if st == 503 {
            assert!(v["reason"].as_str().unwrap_or("").contains("redis"), "{v}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still ready: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Local delivery never stops.
    let (st, r) = api_a
        .post(
            "/api/v1/push",
            json!({"userId": "lou", "content": "redis is down"}),
        )
        .await;
    assert_eq!((st, r["dispatched"].as_u64()), (200, Some(1)), "{r}");
    on_a.message("redis is down").await;
    // Remote delivery fails with a true answer: 503, naming what is down
    // (before: 200 with an error field).
    let (st, r) = api_a
        .post("/api/v1/push", json!({"userId": "rem", "content": "lost"}))
        .await;
    assert_eq!(st, 503, "{r}");
    assert_eq!(
        (&r["status"], &r["dispatched"]),
        (&json!("unavailable"), &json!(0)),
        "{r}"
    );
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("unavailable"),
        "{r}"
    );

    // Redis comes back (empty): the nodes re-register and put their routes
    // back at once (before: at the next refresh, 30 s by default; pushes
    // meanwhile answered `stored` and waited for the user's next bind).
    let _redis = Redis::start(port).await;
    let back = std::time::Instant::now();
    loop {
        let (_, r) = api_a
            .post("/api/v1/push", json!({"userId": "rem", "content": "after"}))
            .await;
        if r["dispatched"] == 1 {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(2),
            "cross-node delivery not back within 2 s of Redis: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    on_b.message("after").await;
    // And ready again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while api_a.get("/readyz").await.0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "/readyz never came back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for node in n {
        node.shutdown().await;
    }
}

/// A message kept for a user whom the route table does not know (Redis
/// lost the route) reaches the user's connection on another node at once,
/// without a new bind (before: it waited in the inbox for as long as the
/// connection lived).
#[tokio::test]
async fn a_kept_message_reaches_a_user_connected_elsewhere_without_a_new_bind() {
    let redis = Redis::start(free_port()).await;
    let n = nodes(&redis).await;
    let api_a = Api::new(&n[0]);
    let mut on_b = on(&n[1], "kip", "kip-1", "android", "").await;
    redis.query(&["DEL", "mp:ur:kip"]).await;
    let (st, r) = api_a
        .post(
            "/api/v1/push",
            json!({"userId": "kip", "content": "kept", "ttlSeconds": 600}),
        )
        .await;
    assert_eq!(
        (st, &r["stored"], &r["dispatched"]),
        (200, &json!(true), &json!(0)),
        "{r}"
    );
    on_b.message("kept").await;
    // Delivered, not kept twice: it left the inbox (no ACK mode).
    inbox_empties(&api_a, "kip").await;
    for node in n {
        node.shutdown().await;
    }
}

/// Waits (5 s at most) until `user`'s inbox is empty, as `api` sees it.
async fn inbox_empties(api: &Api, user: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, u) = api.get(&format!("/api/v1/users/{user}")).await;
        if u["inbox"] == 0 {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{u}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A message kept while a node was not listening (its announcement lost,
/// as in the instants after a Redis restart) reaches the user's connection
/// when the node's subscription comes back, without a new bind.
#[tokio::test]
async fn a_kept_message_announced_while_a_node_was_not_listening_is_found() {
    use base64::Engine as _;
    let redis = Redis::start(free_port()).await;
    let n = nodes(&redis).await;
    let api_a = Api::new(&n[0]);
    let mut on_b = on(&n[1], "swp", "swp-1", "android", "").await;
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis()
        + 600_000;
    let stored = json!({
        "id": 4_000_000_001u64, "trace": "sweep-trace",
        "content": base64::engine::general_purpose::STANDARD.encode("swept"),
        "ack": 0, "ct": null, "exp": exp,
    })
    .to_string();
    redis.query(&["RPUSH", "mp:inbox:swp", &stored]).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), on_b.message("swept"))
            .await
            .is_err(),
        "nothing announced it yet"
    );
    // Every node's subscription ends, as when Redis goes away and comes back.
    redis.query(&["CLIENT", "KILL", "TYPE", "pubsub"]).await;
    tokio::time::timeout(Duration::from_secs(5), on_b.message("swept"))
        .await
        .expect("the node found it when it listened again");
    inbox_empties(&api_a, "swp").await;
    for node in n {
        node.shutdown().await;
    }
}

/// Idempotency keys are shared through Redis: a retry through another
/// node gets the first answer and sends nothing twice; a request that did
/// nothing frees its key (only its own claim) for a retry.
#[tokio::test]
async fn a_retry_through_another_node_sends_nothing_twice() {
    let redis = Redis::start(free_port()).await;
    let n = nodes(&redis).await;
    let (api_a, api_b) = (Api::new(&n[0]), Api::new(&n[1]));
    // Offline, nothing to keep: 404 on both nodes (the key was freed).
    let nothing = json!({"userId": "idm", "content": "gone"});
    let k1 = [("idempotency-key", "retry-across-1")];
    let (st, _, r) = api_a.post_with("/api/v1/push", &k1, nothing.clone()).await;
    assert_eq!(st, 404, "{r}");
    let (st, h, r) = api_b.post_with("/api/v1/push", &k1, nothing).await;
    assert_eq!(st, 404, "{r}");
    assert!(
        h.get("idempotency-replayed").is_none(),
        "sent again, not replayed"
    );
    // Kept: the retry through B replays A's answer, and the user gets one copy.
    let kept = json!({"userId": "idm", "content": "kept-once", "ttlSeconds": 600});
    let k2 = [("idempotency-key", "retry-across-2")];
    let (st1, _, r1) = api_a.post_with("/api/v1/push", &k2, kept.clone()).await;
    assert_eq!((st1, &r1["stored"]), (200, &json!(true)), "{r1}");
    let (st2, h2, r2) = api_b.post_with("/api/v1/push", &k2, kept).await;
    assert_eq!((st2, &r2), (200, &r1), "the first answer again");
    assert_eq!(h2["idempotency-replayed"], "true");
    let (st, _, r) = api_b
        .post_with(
            "/api/v1/push",
            &k2,
            json!({"userId": "idm", "content": "other"}),
        )
        .await;
    assert_eq!(
        (st, &r["error"]["code"]),
        (422, &json!("key_reused")),
        "{r}"
    );
    let (_, u) = api_b.get("/api/v1/users/idm").await;
    assert_eq!(u["inbox"], 1, "{u}");
    let mut c = on(&n[1], "idm", "idm-1", "android", "").await;
    c.message("kept-once").await;
    for node in n {
        node.shutdown().await;
    }
}

/// A node as its own process, to be killed with SIGKILL.
struct NodeProcess {
    child: Child,
    tcp: String,
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_node(redis: &str, id: &str) -> NodeProcess {
    let (tcp, http) = (free_port(), free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_mpush-server"))
        .args([
            "--tcp",
            &format!("127.0.0.1:{tcp}"),
            "--http",
            &format!("127.0.0.1:{http}"),
            "--ws",
            "",
            "--redis",
            redis,
        ])
        .env("MPUSH__CLUSTER__NODE_ID", id)
        .env("MPUSH__CLUSTER__INTERNAL", "127.0.0.1:0")
        .env("MPUSH__CLUSTER__SECRET", NODE_SECRET)
        .env("MPUSH__CLUSTER__NODE_RENEW_SECS", "1")
        .env("MPUSH__CLUSTER__NODE_TTL_SECS", "3")
        .env("MPUSH__CLUSTER__TIMEOUT_MS", "500")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("node starts");
    NodeProcess {
        child,
        tcp: format!("127.0.0.1:{tcp}"),
    }
}

#[tokio::test]
async fn a_killed_node_clients_move_and_messages_meanwhile_arrive_once() {
    use mpush_sdk_core::SessionEvent;
    use mpush_sdk_core::native::{Client, ClientOptions};
    use mpush_sdk_core::session::SessionConfig;

    let redis = Redis::start(free_port()).await;
    let a = start(node_settings(&redis.url(), "A")).await;
    let api = Api::new(&a);
    let mut victim = spawn_node(&redis.url(), "K");
    wait_listening(&victim.tcp).await;
    // Two SDK clients whose server list starts with K, then A.
    let mut clients = Vec::new();
    for user in ["kim", "kat"] {
        let key = std::sync::Arc::new(mpush_protocol::crypto::RsaPublic::mpush_default());
        let cfg = SessionConfig::new(
            vec![victim.tcp.clone(), a.tcp.to_string()],
            key,
            device(&format!("{user}-phone"), "android"),
        );
        let mut c = Client::connect(ClientOptions {
            session: cfg,
            ticket_store: None,
        })
        .expect("valid options");
        c.bind(user, "", "").await.expect("bind");
        wait_sdk(&mut c, "bound on K", |e| {
            matches!(e, SessionEvent::BindResult { ok: true, .. })
        })
        .await;
        clients.push((user, c));
    }
    let routes = redis.query(&["HGETALL", "mp:ur:kim"]).await;
    assert!(
        format!("{routes:?}").contains("K#"),
        "the route names node K: {routes:?}"
    );

    let _ = victim.child.kill(); // SIGKILL
    let _ = victim.child.wait();
    // Meanwhile: pushes with an ACK mode and a TTL, through A.
    let mut traces = Vec::new();
    for (user, _) in &clients {
        let (_, r) = api.post("/api/v1/push", json!({"userId": user, "content": format!("for {user}"), "ackMode": "auto", "ttlSeconds": 300})).await;
        traces.push(r["traceId"].as_str().unwrap_or_default().to_owned());
    }
    // The clients move to A by themselves (the session made on K resumes there).
    for (user, c) in &mut clients {
        let want = format!("for {user}");
        let e = wait_sdk(c, "reconnected to A", |e| {
            matches!(e, SessionEvent::Connected { .. })
        })
        .await;
        assert!(
            matches!(&e, SessionEvent::Connected { address, .. } if *address == a.tcp.to_string()),
            "{e:?}"
        );
        let mut got = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while let Ok(Some(e)) = tokio::time::timeout_at(deadline, c.next_event()).await {
            if matches!(&e, SessionEvent::Message(m) if m.content == want.as_bytes()) {
                got += 1;
            }
        }
        assert_eq!(got, 1, "{user}: delivered exactly once");
    }
    // Stale routes to K are gone; the routes now name A.
    for (user, _) in &clients {
        let routes = redis.query(&["HGETALL", &format!("mp:ur:{user}")]).await;
        let text = format!("{routes:?}");
        assert!(!text.contains("K#") && text.contains("A#"), "{text}");
    }
    for t in &traces {
        let (_, v) = api.get(&format!("/api/v1/traces/{t}")).await;
        assert_eq!(v["state"], "ACK", "{v}");
    }
    a.shutdown().await;
}

async fn wait_sdk(
    c: &mut mpush_sdk_core::native::Client,
    what: &str,
    f: impl Fn(&mpush_sdk_core::SessionEvent) -> bool,
) -> mpush_sdk_core::SessionEvent {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let e = tokio::time::timeout_at(deadline, c.next_event())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .expect("running");
        if f(&e) {
            return e;
        }
    }
}

#[tokio::test]
async fn a_draining_node_leaves_first_and_sends_v2_clients_to_another_node() {
    use mpush_sdk_core::SessionEvent;
    use mpush_sdk_core::native::{Client, ClientOptions};
    use mpush_sdk_core::session::SessionConfig;

    let redis = Redis::start(free_port()).await;
    let a = start(node_settings(&redis.url(), "A")).await;
    let mut sb = node_settings(&redis.url(), "B");
    sb.shutdown.redirect_jitter_ms = 200;
    let b = start(sb).await;
    let (api_a, api_b) = (Api::new(&a), Api::new(&b));
    wait_for_nodes(&api_a, 2).await;
    // The client only knows node B.
    let key = std::sync::Arc::new(mpush_protocol::crypto::RsaPublic::mpush_default());
    let cfg = SessionConfig::new(
        vec![b.tcp.to_string()],
        key,
        device("dana-phone", "android"),
    );
    let mut c = Client::connect(ClientOptions {
        session: cfg,
        ticket_store: None,
    })
    .expect("valid options");
    c.bind("dana", "", "").await.expect("bind");
    wait_sdk(&mut c, "bound on B", |e| {
        matches!(e, SessionEvent::BindResult { ok: true, .. })
    })
    .await;
    // An unacknowledged BIZ message is in flight when B drains.
    let (_, r) = api_b
        .post(
            "/api/v1/push",
            json!({"userId": "dana", "content": "in flight", "ackMode": "biz"}),
        )
        .await;
    let SessionEvent::Message(first) =
        wait_sdk(&mut c, "message", |e| matches!(e, SessionEvent::Message(_))).await
    else {
        unreachable!()
    };
    b.shutdown().await;
    let (_, list) = api_a.text(reqwest::Method::GET, "/", None).await;
    assert_eq!(list, a.tcp.to_string(), "B left the cluster first");
    let e = wait_sdk(&mut c, "moved to A", |e| {
        matches!(e, SessionEvent::Connected { .. })
    })
    .await;
    assert!(
        matches!(&e, SessionEvent::Connected { address, resumed: true, .. } if *address == a.tcp.to_string()),
        "{e:?}"
    );
    wait_sdk(&mut c, "re-bound on A", |e| {
        matches!(e, SessionEvent::BindResult { ok: true, .. })
    })
    .await;
    // The message B never got an ACK for was kept and comes again from A; the
    // app does not see it twice, and its ACK now completes the trace.
    c.ack(first.ack_id).await.expect("ack");
    let trace = r["traceId"].as_str().unwrap_or_default();
    api_a.trace_state(trace, "dana", "ACK").await;
    let (_, u) = api_a.get("/api/v1/users/dana").await;
    assert_eq!(u["online"], true, "{u}");
    a.shutdown().await;
}

/// A node killed a moment ago is still registered until its TTL: a drain
/// must not send its clients there (they would back off against a closed
/// port), but to a node that answers.
#[tokio::test]
async fn a_drain_skips_a_registered_node_that_does_not_answer() {
    use mpush_sdk_core::SessionEvent;
    use mpush_sdk_core::native::{Client, ClientOptions};
    use mpush_sdk_core::session::SessionConfig;

    let redis = Redis::start(free_port()).await;
    let a = start(node_settings(&redis.url(), "A")).await;
    let mut sb = node_settings(&redis.url(), "B");
    sb.shutdown.redirect_jitter_ms = 200;
    let b = start(sb).await;
    let api_a = Api::new(&a);
    wait_for_nodes(&api_a, 2).await;
    // A dead node's registration, as a killed process leaves it: the least
    // loaded and first by id, its ports closed.
    let closed = free_port();
    let dead = json!({
        "id": "0dead", "tcp": format!("127.0.0.1:{closed}"), "ws": "", "http": "",
        "internal": format!("127.0.0.1:{closed}"), "load": 0,
    });
    redis
        .query(&["SET", "mp:{n}:node:0dead", &dead.to_string(), "EX", "60"])
        .await;
    redis.query(&["SADD", "mp:{n}:nodes", "0dead"]).await;
    let key = std::sync::Arc::new(mpush_protocol::crypto::RsaPublic::mpush_default());
    let cfg = SessionConfig::new(
        vec![b.tcp.to_string()],
        key,
        device("erin-phone", "android"),
    );
    let mut c = Client::connect(ClientOptions {
        session: cfg,
        ticket_store: None,
    })
    .expect("valid options");
    c.bind("erin", "", "").await.expect("bind");
    wait_sdk(&mut c, "bound on B", |e| {
        matches!(e, SessionEvent::BindResult { ok: true, .. })
    })
    .await;
    b.shutdown().await;
    let e = wait_sdk(&mut c, "moved", |e| {
        matches!(e, SessionEvent::Connected { .. })
    })
    .await;
    assert!(
        matches!(&e, SessionEvent::Connected { address, .. } if *address == a.tcp.to_string()),
        "redirected to the node that answers, not the dead one: {e:?}"
    );
    a.shutdown().await;
}

#[tokio::test]
async fn a_sentinel_failover_is_followed_without_a_restart() {
    let (p_master, p_replica, p_sentinel) = (free_port(), free_port(), free_port());
    let master = Redis::start(p_master).await;
    let _replica = Redis::start_with(
        p_replica,
        &["--replicaof", "127.0.0.1", &p_master.to_string()],
    )
    .await;
    let dir = std::env::temp_dir().join(format!(
        "mpush-sentinel-{}-{p_sentinel}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let conf = dir.join("sentinel.conf");
    std::fs::write(
        &conf,
        format!("port {p_sentinel}\nbind 127.0.0.1\nsentinel monitor mymaster 127.0.0.1 {p_master} 1\nsentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 3000\n"),
    )
    .expect("write");
    let sentinel_child = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .spawn()
        .expect("sentinel");
    let sentinel = Redis {
        child: sentinel_child,
        port: p_sentinel,
        dir,
    };
    wait_listening(("127.0.0.1", p_sentinel)).await;
    // The replica must be in sync before a failover can pick it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let info = master.query(&["INFO", "replication"]).await;
        if format!("{info:?}").contains("state=online") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "replica never synced");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let url = format!("redis+sentinel://127.0.0.1:{p_sentinel}/mymaster");
    let a = start(node_settings(&url, "A")).await;
    let b = start(node_settings(&url, "B")).await;
    let api = Api::new(&a);
    let mut on_b = on(&b, "sia", "sia-1", "android", "").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, r) = api
            .post(
                "/api/v1/push",
                json!({"userId": "sia", "content": "before"}),
            )
            .await;
        if r["dispatched"] == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    on_b.message("before").await;

    // Fail over: the replica becomes the master; the nodes follow it. The
    // sentinel may not know the replica as a good one yet (NOGOODSLAVE): retry.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match sentinel
            .try_query(&["SENTINEL", "FAILOVER", "mymaster"])
            .await
        {
            Ok(_) => break,
            Err(e) if e.to_string().contains("NOGOODSLAVE") => {
                assert!(std::time::Instant::now() < deadline, "{e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("SENTINEL FAILOVER: {e}"),
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let m = sentinel
            .query(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])
            .await;
        if format!("{m:?}").contains(&p_replica.to_string()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sentinel never failed over: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Until the nodes follow, writes hit the old master (now a read-only
    // replica) and traces are lost; afterwards every push is fully traced.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let content = format!("after {attempt}");
        let (_, r) = api
            .post(
                "/api/v1/push",
                json!({"userId": "sia", "content": content, "ackMode": "auto"}),
            )
            .await;
        let trace = r["traceId"].as_str().unwrap_or_default().to_owned();
        let mut delivered = false;
        for _ in 0..20 {
            let (_, t) = api.get(&format!("/api/v1/traces/{trace}")).await;
            if t["state"] == "ACK" {
                delivered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if delivered {
            on_b.message(&content).await;
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "delivery never resumed after the failover: {r}"
        );
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn nodes_share_a_redis_cluster() {
    let ports = [free_port(), free_port(), free_port()];
    let dir = std::env::temp_dir().join(format!(
        "mpush-rediscluster-{}-{}",
        std::process::id(),
        ports[0]
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let mut shards = Vec::new();
    for p in ports {
        let conf = format!("nodes-{p}.conf");
        let child = Command::new("redis-server")
            .current_dir(&dir)
            .args([
                "--port",
                &p.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &conf,
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server");
        // Each removes the shared directory on drop; the last one finds it gone.
        shards.push(Redis {
            child,
            port: p,
            dir: dir.clone(),
        });
    }
    for p in ports {
        wait_listening(("127.0.0.1", p)).await;
    }
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let out = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli (from redis-tools, installed with redis-server)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let info = shards[0].query(&["CLUSTER", "INFO"]).await;
        if format!("{info:?}").contains("cluster_state:ok") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "cluster never became ok"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let url = format!("redis+cluster://{}/", addrs.join(","));
    let a = start(node_settings(&url, "A")).await;
    let b = start(node_settings(&url, "B")).await;
    let api = Api::new(&a);
    wait_for_nodes(&api, 2).await;
    let (_, list) = api.text(reqwest::Method::GET, "/", None).await;
    assert_eq!(list.split(',').count(), 2, "{list}");
    // Users spread over slots of every shard.
    let mut clients = Vec::new();
    for i in 0..6 {
        let user = format!("rc-user-{i}");
        clients.push((
            user.clone(),
            on(&b, &user, &format!("rc-dev-{i}"), "android", "t").await,
        ));
    }
    for (user, c) in &mut clients {
        let (_, r) = api
            .post(
                "/api/v1/push",
                json!({"userId": user, "content": "via the redis cluster", "ackMode": "auto"}),
            )
            .await;
        assert_eq!(r["dispatched"], 1, "{r}");
        c.message("via the redis cluster").await;
        api.trace_state(r["traceId"].as_str().unwrap_or_default(), user, "ACK")
            .await;
    }
    let (st, _) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "all of you", "tags": ["t"]}),
        )
        .await;
    assert_eq!(st, 202);
    for (_, c) in &mut clients {
        c.message("all of you").await;
    }
    // A second login on A kicks the device on B (sharded pub/sub carries it).
    let _again = on(&a, "rc-user-0", "rc-dev-0b", "ios", "").await;
    clients[0]
        .1
        .wait_for(
            "kick across nodes",
            |e| matches!(e, ClientEvent::Kicked { device_id, .. } if device_id == "rc-dev-0"),
        )
        .await;
    a.shutdown().await;
    b.shutdown().await;

    // The traces' byte bound on a Redis Cluster: its bookkeeping shards sit
    // in slots of their own, and the traces it pushes out (in other slots)
    // are deleted one command each.
    use mpush_server::redis_conn::RedisHandle;
    use mpush_server::store::redis::RedisTraces;
    use mpush_server::store::{TraceEvent, TraceStore};
    let handle = RedisHandle::connect(&url, Duration::from_secs(2), None)
        .await
        .expect("redis cluster");
    let traces = RedisTraces {
        redis: handle,
        ttl_secs: 600,
        max_bytes: 512 << 10,
    };
    for t in 0..300 {
        let id: std::sync::Arc<str> = format!("rc-trace-{t:03}").into();
        traces.create(&id, t).await.expect("create");
        let evs: Vec<TraceEvent> = (0..20)
            .map(|k| TraceEvent {
                trace_id: id.clone(),
                user_id: format!("rc-user-{k:02}").into(),
                device_id: format!("rc-device-{k:02}-{}", "x".repeat(40)).into(),
                client_type: mpush_protocol::session::ClientType::Mobile,
                state: mpush_server::store::TraceState::Delivered,
                detail: Some("forwarded from node A to node B".into()),
                at_ms: t,
            })
            .collect();
        traces.record(&evs).await.expect("record");
    }
    assert!(
        traces.get("rc-trace-000").await.expect("get").is_none(),
        "the oldest went"
    );
    let newest = traces
        .get("rc-trace-299")
        .await
        .expect("get")
        .expect("the newest stays");
    assert_eq!(newest.recipients.len(), 20);
    let mut keys = 0;
    for shard in &shards {
        if let redis::Value::Array(k) = shard.query(&["KEYS", "mp:trace:rc-trace-*"]).await {
            keys += k.len();
        }
    }
    assert!(keys > 10 && keys < 150, "{keys} traces kept of 300");
}

/// A stranger on the node port: it is answered with a challenge and closed
/// when it cannot prove the secret, before the push it sent is read.
#[tokio::test]
async fn the_node_port_reads_nothing_from_a_peer_without_the_secret() {
    use mpush_protocol::packet::{Command, Flags, Frame, Packet};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = Redis::start(free_port()).await;
    let n = nodes(&redis).await;
    let mut on_b = on(&n[1], "bea", "bea-phone", "android", "").await;
    let redis::Value::BulkString(node) = redis.query(&["GET", "mp:{n}:node:B"]).await else {
        panic!("node B is registered");
    };
    let node: Value = serde_json::from_slice(&node).expect("json");
    let internal = node["internal"]
        .as_str()
        .expect("internal address")
        .to_owned();
    for guess in [[0u8; 32], [7u8; 32]] {
        let mut s = tokio::net::TcpStream::connect(&internal)
            .await
            .expect("connects");
        let mut hello = [0u8; 36];
        s.read_exact(&mut hello).await.expect("a challenge");
        assert_eq!(&hello[..4], b"MPN1");
        let mut bytes = b"MPN1".to_vec();
        bytes.extend_from_slice(&[1u8; 32]);
        bytes.extend_from_slice(&guess);
        let push = mpush_protocol::message::v2::NodePush {
            user_id: "bea".into(),
            message_id: 1,
            content: b"forged".to_vec(),
            ..Default::default()
        };
        let frame = Frame::Packet(Packet::new(
            Command::NODE_PUSH,
            1,
            Flags::NONE,
            prost::Message::encode_to_vec(&push),
        ));
        bytes.extend_from_slice(&frame.to_bytes());
        s.write_all(&bytes).await.expect("writes");
        let mut buf = [0u8; 64];
        let r = tokio::time::timeout(WAIT, s.read(&mut buf))
            .await
            .expect("closed in time");
        assert!(
            matches!(r, Ok(0) | Err(_)),
            "closed without an answer: {r:?}"
        );
    }
    // Nodes that know the secret still forward.
    let (st, _) = Api::new(&n[0])
        .post("/api/v1/push", json!({"userId": "bea", "content": "real"}))
        .await;
    assert_eq!(st, 200);
    on_b.message("real").await;
    assert!(!on_b.messages().iter().any(|m| m == "forged"));
}

/// The inbox cap holds under concurrent pushes from every node, and every
/// key the cluster wrote has a TTL.
#[tokio::test]
async fn the_inbox_cap_is_atomic_and_every_key_expires() {
    let redis = Redis::start(free_port()).await;
    let mut n = Vec::new();
    for id in ["A", "B"] {
        let mut s = node_settings(&redis.url(), id);
        s.delivery.inbox_max = 5;
        s.limits.max_topics_per_user = 2;
        s.limits.max_subscribers_per_topic = 2;
        n.push(start(s).await);
    }
    wait_for_nodes(&Api::new(&n[0]), 2).await;
    let mut on_b = on(&n[1], "sub", "sub-phone", "android", "").await;
    let (st, _) = Api::new(&n[1])
        .text(
            reqwest::Method::PUT,
            "/api/v1/topics/news/subscribers/sub",
            None,
        )
        .await;
    assert_eq!(st, 200);
    // Topic caps hold on Redis too: two topics per user, two subscribers per topic.
    let put = |node: usize, topic: &str, user: &str| {
        let api = Api::new(&n[node]);
        let path = format!("/api/v1/topics/{topic}/subscribers/{user}");
        async move { api.text(reqwest::Method::PUT, &path, None).await.0 }
    };
    assert_eq!(put(0, "sports", "sub").await, 200);
    assert_eq!(
        put(1, "weather", "sub").await,
        409,
        "third topic of one user"
    );
    assert_eq!(put(0, "news", "ann").await, 200);
    assert_eq!(
        put(1, "news", "bob").await,
        409,
        "third subscriber of one topic"
    );
    let sends = (0..40).map(|i| {
        let api = Api::new(&n[i % 2]);
        async move {
            api.post(
                "/api/v1/push",
                json!({"userId": "offline-olga", "content": format!("m{i}"), "ttlSeconds": 600}),
            )
            .await
        }
    });
    let results = futures_util::future::join_all(sends).await;
    let stored = results.iter().filter(|(_, v)| v["stored"] == true).count();
    assert_eq!(stored, 5, "{results:?}");
    let (_, user) = Api::new(&n[0]).get("/api/v1/users/offline-olga").await;
    assert_eq!(user["inbox"], 5);
    // A trace with a recipient, a route, a topic, the node registry: all expire.
    let (_, r) = Api::new(&n[0])
        .post(
            "/api/v1/push",
            json!({"userId": "sub", "content": "ttl check"}),
        )
        .await;
    on_b.message("ttl check").await;
    assert!(r["traceId"].is_string());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let redis::Value::Array(keys) = redis.query(&["KEYS", "*"]).await else {
        panic!("keys");
    };
    assert!(keys.len() >= 5, "{keys:?}");
    for k in keys {
        let redis::Value::BulkString(k) = k else {
            continue;
        };
        let k = String::from_utf8(k).expect("utf-8");
        let redis::Value::Int(ttl) = redis.query(&["TTL", &k]).await else {
            panic!("ttl");
        };
        assert!(ttl > 0, "{k} has no TTL ({ttl})");
    }
}

/// Session secrets are sealed in Redis: reading `mp:rs:*` shows no key, and a
/// record planted by someone who can write to Redis does not resume.
#[tokio::test]
async fn session_secrets_are_sealed_at_rest() {
    use mpush_protocol::session::{ResumeTicket, SessionRecord, SessionSecret};
    let redis = Redis::start(free_port()).await;
    let node = start(node_settings(&redis.url(), "A")).await;
    let dev = common::device("sealed-1", "android");
    let mut c = TestClient::connect(&node, Via::Tcp, false, dev.clone(), None).await;
    let ClientEvent::Connected {
        ticket: Some(ticket),
        ..
    } = c.connected().await
    else {
        panic!("a ticket");
    };
    let redis::Value::BulkString(v) = redis
        .query(&["GET", &format!("mp:rs:{}", ticket.session_id)])
        .await
    else {
        panic!("stored");
    };
    let v = String::from_utf8(v).expect("utf-8");
    assert!(v.starts_with("s1:"), "{v}");
    assert!(!v.contains("sealed-1"), "no plaintext fields: {v}");
    // The real ticket still resumes (on any node holding the RSA key).
    let mut again =
        TestClient::connect(&node, Via::Tcp, false, dev.clone(), Some(ticket.clone())).await;
    let ClientEvent::Connected { resumed, .. } = again.connected().await else {
        panic!("connected");
    };
    assert!(resumed);
    // A forged record in mpush's plaintext format, with a key the forger knows.
    let SessionSecret::Legacy { key, iv } = ticket.secret.clone() else {
        panic!("legacy");
    };
    let forged = SessionRecord {
        session_id: "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0".into(),
        device: dev.clone(),
        secret: SessionSecret::Legacy { key, iv },
        expire_at_ms: unix_ms() + 60_000,
        binding: None,
    };
    let value = forged.to_mpush_value().expect("mpush value");
    redis
        .query(&[
            "SET",
            &format!("mp:rs:{}", forged.session_id),
            &value,
            "EX",
            "60",
        ])
        .await;
    let planted = ResumeTicket {
        session_id: forged.session_id.clone(),
        expire_at_ms: forged.expire_at_ms,
        secret: forged.secret.clone(),
    };
    let mut f = TestClient::connect(&node, Via::Tcp, false, dev, Some(planted)).await;
    let ClientEvent::Connected { resumed, .. } = f.connected().await else {
        panic!("connected");
    };
    assert!(!resumed, "a planted plaintext record is not a way in");
    node.shutdown().await;
}

/// Retries follow the user: a push with an ACK mode in flight on a node that
/// is killed (SIGKILL, no chance to save anything) is in the user's shared
/// inbox from the start, so the node the client moves to delivers it again;
/// the device's dedup keeps it to one message for the app.
#[tokio::test]
async fn unacked_messages_on_a_killed_node_reach_the_user_on_the_next_node_once() {
    use mpush_sdk_core::SessionEvent;
    use mpush_sdk_core::native::{Client, ClientOptions};
    use mpush_sdk_core::session::SessionConfig;

    let redis = Redis::start(free_port()).await;
    let a = start(node_settings(&redis.url(), "A")).await;
    let api = Api::new(&a);
    let mut victim = spawn_node(&redis.url(), "K");
    wait_listening(&victim.tcp).await;
    let key = std::sync::Arc::new(mpush_protocol::crypto::RsaPublic::mpush_default());
    let cfg = SessionConfig::new(
        vec![victim.tcp.clone(), a.tcp.to_string()],
        key,
        device("una-phone", "android"),
    );
    let mut c = Client::connect(ClientOptions {
        session: cfg,
        ticket_store: None,
    })
    .expect("valid options");
    c.bind("una", "", "").await.expect("bind");
    wait_sdk(&mut c, "bound on K", |e| {
        matches!(e, SessionEvent::BindResult { ok: true, .. })
    })
    .await;
    // A biz push the app never acknowledges: in flight on K.
    let (_, r) = api
        .post(
            "/api/v1/push",
            json!({"userId": "una", "content": "in flight", "ackMode": "biz"}),
        )
        .await;
    assert_eq!(r["dispatched"], 1, "{r}");
    let trace = r["traceId"].as_str().unwrap_or_default().to_owned();
    let mut seen = 0;
    wait_sdk(
        &mut c,
        "the push on K",
        |e| matches!(e, SessionEvent::Message(m) if m.content == b"in flight"),
    )
    .await;
    seen += 1;

    let _ = victim.child.kill(); // SIGKILL
    let _ = victim.child.wait();
    let e = wait_sdk(&mut c, "reconnected to A", |e| {
        matches!(e, SessionEvent::Connected { .. })
    })
    .await;
    assert!(
        matches!(&e, SessionEvent::Connected { address, .. } if *address == a.tcp.to_string()),
        "{e:?}"
    );
    // A hands it out again from the user's inbox...
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, t) = api.get(&format!("/api/v1/traces/{trace}")).await;
        if t.to_string().contains("from the offline inbox") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never redelivered: {t}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ...and the app still sees it once.
    let quiet = tokio::time::Instant::now() + Duration::from_secs(2);
    while let Ok(Some(e)) = tokio::time::timeout_at(quiet, c.next_event()).await {
        if matches!(&e, SessionEvent::Message(m) if m.content == b"in flight") {
            seen += 1;
        }
    }
    assert_eq!(seen, 1, "delivered to the app exactly once");
    a.shutdown().await;
}

/// Cluster mode on a Redis that speaks only TLS and wants a password: the
/// routes, the cross-node push and the broadcast's pub/sub all go over
/// `rediss://` with the test's own CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_on_a_tls_redis_with_a_password() {
    let dir = std::env::temp_dir().join(format!("mpush-rediss-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let c = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("a certificate");
    let (cert, key) = (dir.join("redis.crt"), dir.join("redis.key"));
    std::fs::write(&cert, c.cert.pem()).expect("write");
    std::fs::write(&key, c.signing_key.serialize_pem()).expect("write");
    let port = free_port();
    let (cert_s, key_s) = (
        cert.to_string_lossy().into_owned(),
        key.to_string_lossy().into_owned(),
    );
    let _redis = Redis::start_with(
        port,
        &[
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &cert_s,
            "--tls-key-file",
            &key_s,
            "--tls-ca-cert-file",
            &cert_s,
            "--tls-auth-clients",
            "no",
            "--requirepass",
            "redis-pass-0123",
        ],
    )
    .await;
    let url = format!("rediss://:redis-pass-0123@127.0.0.1:{port}/");
    let node = |id: &str| {
        let mut s = node_settings(&url, id);
        s.cluster.redis_ca_file = cert_s.clone();
        s
    };
    // Without the CA (webpki roots only) the node does not trust this Redis.
    assert!(
        mpush_server::start(node_settings(&url, "X").validate().expect("valid"))
            .await
            .is_err(),
        "an untrusted certificate is refused"
    );
    let a = start(node("A")).await;
    let b = start(node("B")).await;
    let api = Api::new(&a);
    wait_for_nodes(&api, 2).await;
    let mut on_b = bound(&b, Via::Tcp, true, device("tls-b", "android"), "rita", "").await;
    let (st, r) = api
        .post(
            "/api/v1/push",
            json!({"userId": "rita", "content": "via rediss", "ackMode": "auto"}),
        )
        .await;
    assert_eq!((st, r["dispatched"].as_u64()), (200, Some(1)), "{r}");
    on_b.message("via rediss").await;
    let (st, _) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "all over tls", "ackMode": "none"}),
        )
        .await;
    assert_eq!(st, 202);
    on_b.message("all over tls").await;
    assert_eq!(api.get("/readyz").await.0, 200);
    a.shutdown().await;
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A broadcast condition travels to every node, and each compiles and
/// evaluates it for its own connections. Before, one within the text limits
/// could nest string-building functions until evaluating it asked for
/// gigabytes, and every node aborted. Now the growing functions are refused
/// at the API (400), and what compiles stays within its budget on every node:
/// a condition that needs more than it for a connection (here: copies of 4
/// KiB of tags) selects nobody, is counted, and no node stops serving.
#[tokio::test]
async fn a_hostile_condition_stops_no_node() {
    let redis = Redis::start(free_port()).await;
    let n = [
        start(node_settings(&redis.url(), "A")).await,
        start(node_settings(&redis.url(), "B")).await,
    ];
    wait_for_nodes(&Api::new(&n[0]), 2).await;
    let api = Api::new(&n[0]);
    // The longest tags a server keeps, on each node.
    let tags = (0..1000)
        .map(|i| format!("t{i:03}"))
        .collect::<Vec<_>>()
        .join(",");
    let tags = &tags[..tags[..4096.min(tags.len())].rfind(',').unwrap_or(0)];
    let mut clients = [
        on(&n[0], "ha", "ha-1", "android", tags).await,
        on(&n[1], "hb", "hb-1", "android", tags).await,
    ];

    // evalexpr's abort: a replacement nested in itself (each level squares
    // the length). Refused before anything is sent anywhere.
    let mut grow = "userId".to_owned();
    for _ in 0..6 {
        grow = format!("str::regex_replace({grow}, \"\", userId)");
    }
    for c in [
        format!("{grow} == \"\""),
        "userId.repeat(1e9).length > 0".to_owned(),
        "tags.padStart(1e9) == tags".to_owned(),
    ] {
        let (st, r) = api
            .post("/api/v1/broadcast", json!({"content": "x", "condition": c}))
            .await;
        assert_eq!(st, 400, "{c}: {r}");
    }

    // Compiles, and needs more than the budget on every connection here.
    let heavy = format!("({}).toUpperCase() == tags", vec!["tags"; 24].join(" + "));
    let (st, r) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "heavy", "condition": heavy}),
        )
        .await;
    assert_eq!(st, 202, "{r}");
    // Both nodes still serve, and the next broadcast reaches both.
    let (st, _) = api
        .post(
            "/api/v1/broadcast",
            json!({"content": "after", "condition": "userId.indexOf('h') == 0"}),
        )
        .await;
    assert_eq!(st, 202);
    for c in &mut clients {
        c.message("after").await;
        assert!(
            !c.messages().contains(&"heavy".to_owned()),
            "over budget: not selected"
        );
    }
    for node in &n {
        let (_, metrics) = Api::new(node)
            .text(reqwest::Method::GET, "/metrics", None)
            .await;
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("mpush_broadcast_condition_errors_total{kind=\"memory\"}")),
            "each node counted the budget stop:\n{metrics}"
        );
    }
    for node in n {
        node.shutdown().await;
    }
}

/// A stranger holds hundreds of idle sockets on a node's port (reopening
/// each one the node closes). Before: the port's slots filled, a peer that
/// had to connect was turned away, the user's route was deleted on a guess
/// and every push answered 200 with nothing dispatched. Now strangers wait
/// in a bounded queue of their own (the oldest closed first, one second
/// each), and every push reaches the user.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stranger_holding_node_port_sockets_loses_no_push() {
    let redis = Redis::start(free_port()).await;
    // The property is "no push lost", not latency: the forward's timeout is
    // closer to the default (5 s) than the other cluster tests' 500 ms, so
    // that a pause of the machine running the suite is not read as a loss.
    let settings = |id| {
        let mut s = node_settings(&redis.url(), id);
        s.cluster.timeout_ms = 3_000;
        s
    };
    let n = [start(settings("A")).await, start(settings("B")).await];
    wait_for_nodes(&Api::new(&n[0]), 2).await;
    let port_b = n[1].internal.expect("B's node port");
    let mut on_b = on(&n[1], "flo", "flo-1", "android", "").await;
    // The flood, before A has ever connected to B, from another address
    // (a stranger's host: 127.0.0.2 on loopback) and on threads of its own,
    // as a stranger's host would be: its tasks do not queue in the nodes'
    // scheduler.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cycles = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let flood = {
        let (stop, cycles) = (stop.clone(), cycles.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("the flood's runtime");
            rt.block_on(async move {
                let mut holders = Vec::new();
                for _ in 0..400 {
                    let (stop, cycles) = (stop.clone(), cycles.clone());
                    holders.push(tokio::spawn(async move {
                        use std::sync::atomic::Ordering::Relaxed;
                        while !stop.load(Relaxed) {
                            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
                            socket
                                .bind("127.0.0.2:0".parse().expect("addr"))
                                .expect("bind 127.0.0.2");
                            let Ok(mut s) = socket.connect(port_b).await else {
                                // Refused or out of ports: try again, without
                                // spinning on the thread.
                                tokio::time::sleep(Duration::from_millis(5)).await;
                                continue;
                            };
                            cycles.fetch_add(1, Relaxed);
                            // Hold it until the node closes it, saying nothing.
                            // Reads are bounded: a connection the kernel
                            // completed with a SYN cookie and the node never
                            // accepted is half-open, and no close comes.
                            let mut buf = [0u8; 64];
                            use tokio::io::AsyncReadExt;
                            while !stop.load(Relaxed) {
                                match tokio::time::timeout(
                                    Duration::from_millis(200),
                                    s.read(&mut buf),
                                )
                                .await
                                {
                                    Ok(Ok(0)) | Ok(Err(_)) => break,
                                    Ok(Ok(_)) | Err(_) => {}
                                }
                            }
                        }
                    }));
                }
                for h in holders {
                    let _ = h.await;
                }
            });
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = cycles.load(std::sync::atomic::Ordering::Relaxed);
    let api_a = Api::new(&n[0]);
    for k in 0..30 {
        let text = format!("through the flood {k}");
        let t = std::time::Instant::now();
        let (st, r) = api_a
            .post("/api/v1/push", json!({"userId": "flo", "content": text}))
            .await;
        assert_eq!(
            (st, &r["dispatched"]),
            (200, &json!(1)),
            "push {k} after {:?}: {r}",
            t.elapsed()
        );
        on_b.message(&text).await;
    }
    // The flood was on all along: the node closed (and the stranger
    // reopened) many sockets while the pushes went through.
    let during = cycles.load(std::sync::atomic::Ordering::Relaxed) - before;
    assert!(during > 400, "the flood went on ({during} sockets)");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // The holders end within a read's bound once told to.
    for node in n {
        node.shutdown().await;
    }
    let joined = tokio::task::spawn_blocking(move || flood.join().is_ok());
    assert!(
        tokio::time::timeout(Duration::from_secs(10), joined)
            .await
            .is_ok_and(|j| j.is_ok_and(|ok| ok)),
        "the flood's thread ends once told to"
    );
}

/// A route refresh works from a snapshot of the node's connections and takes
/// a while for many. A device that moved to another node meanwhile keeps its
/// new row (the refresh does not write the old one back over it), and one
/// that closed meanwhile does not get its row back: otherwise pushes from
/// other nodes go to the old node until the TTL or the other node's refresh.
#[tokio::test]
async fn a_route_refresh_writes_no_row_back_over_a_newer_bind_or_for_a_closed_connection() {
    use mpush_protocol::session::{ClientType, DeviceInfo, Profile};
    use mpush_server::redis_conn::RedisHandle;
    use mpush_server::route::{
        ConnHandle, ConnInfo, ConnQueue, RedisRoutes, RouteStore, Router, Transport,
    };
    use std::sync::Arc;

    let redis = Redis::start(free_port()).await;
    let router = |node: &str, handle: RedisHandle| {
        let table: Arc<dyn RouteStore> = Arc::new(RedisRoutes::new(handle, 90));
        Router::new(node.into(), Some(table))
    };
    let url = redis.url();
    let connect = || RedisHandle::connect(&url, Duration::from_secs(2), None);
    let a = router("A", connect().await.expect("redis"));
    let b = router("B", connect().await.expect("redis"));
    let handle = |id: u64| {
        let device = DeviceInfo {
            device_id: format!("device-{id}"),
            os_name: "android".into(),
            os_version: "14".into(),
            client_version: "1.0".into(),
        };
        ConnHandle {
            info: Arc::new(ConnInfo::new(id, &device, Profile::V2, Transport::Tcp, 0)),
            tx: Arc::new(ConnQueue::new(8)),
        }
    };
    let row = |user: &str| {
        let redis = &redis;
        let key = format!("mp:ur:{user}");
        async move {
            match redis
                .query(&["HGET", &key, &ClientType::Mobile.code().to_string()])
                .await
            {
                redis::Value::BulkString(v) => Some(String::from_utf8_lossy(&v).into_owned()),
                redis::Value::Nil => None,
                other => panic!("{other:?}"),
            }
        }
    };

    let (moved, closed, stays): (Arc<str>, Arc<str>, Arc<str>) =
        ("moved".into(), "closed".into(), "stays".into());
    a.bind(&moved, handle(1)).await.1.expect("bound");
    a.bind(&closed, handle(2)).await.1.expect("bound");
    a.bind(&stays, handle(3)).await.1.expect("bound");
    let snapshot = a.local().snapshot();
    // Meanwhile: the first device reconnects to B, the second closes, and
    // Redis loses the third's row (a restart).
    a.local().unbind(&moved, 1);
    let (_, replaced) = b.bind(&moved, handle(9)).await;
    assert!(replaced.expect("bound").is_some_and(|r| r.node == "A"));
    a.unbind(&closed, ClientType::Mobile, 2).await;
    redis.query(&["DEL", "mp:ur:stays"]).await;

    assert_eq!(a.refresh_from(snapshot).await, 0, "nothing failed");
    let moved_row = row("moved").await.expect("B's row");
    assert!(moved_row.contains("\"mark\":\"B#9\""), "{moved_row}");
    assert_eq!(row("closed").await, None, "no row for a closed connection");
    let stays_row = row("stays").await.expect("written back");
    assert!(stays_row.contains("\"mark\":\"A#3\""), "{stays_row}");
    // And the routes resolve as they are.
    let targets = a.resolve(&moved, None).await.expect("resolves");
    assert!(
        matches!(&targets[..], [mpush_server::route::Target::Remote(r)] if r.node == "B"),
        "{targets:?}"
    );
}

async fn online(api: &Api) -> bool {
    let (_, u) = api.get("/api/v1/users/rita").await;
    u["online"].as_bool().expect("online")
}

/// ADR 0008 on Redis: a binding kept with a session is sealed at rest with
/// it, travels with the single-use ticket to another node, comes back there
/// without a BIND (pushes sent through any node reach it), and an UNBIND
/// clears it for every node.
#[tokio::test]
async fn a_kept_binding_resumes_on_another_node_without_a_bind() {
    let redis = Redis::start(free_port()).await;
    let a = start(node_settings(&redis.url(), "A")).await;
    let b = start(node_settings(&redis.url(), "B")).await;
    let api = Api::new(&a);
    wait_for_nodes(&api, 2).await;
    let dev = common::device("kept-1", "android");
    let ticket_of = |e: ClientEvent| match e {
        ClientEvent::Connected {
            ticket: Some(t), ..
        } => t,
        other => panic!("connected with a ticket: {other:?}"),
    };
    let mut c = TestClient::connect(&a, Via::Tcp, true, dev.clone(), None).await;
    let ticket = ticket_of(c.connected().await);
    c.bind("rita", "vip").await;
    let redis::Value::BulkString(v) = redis
        .query(&["GET", &format!("mp:rs:{}", ticket.session_id)])
        .await
    else {
        panic!("stored");
    };
    let v = String::from_utf8(v).expect("utf-8");
    assert!(v.starts_with("s1:") && !v.contains("rita"), "sealed: {v}");
    let redis::Value::Int(ttl) = redis
        .query(&["PTTL", &format!("mp:rs:{}", ticket.session_id)])
        .await
    else {
        panic!("pttl");
    };
    assert!(ttl > 60_000, "the session keeps its expiry: {ttl} ms");
    c.close();
    let t0 = std::time::Instant::now();
    while online(&api).await {
        assert!(t0.elapsed() < WAIT, "rita still online");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // On B, with the ticket: bound again with no BIND.
    let mut c = TestClient::connect(&b, Via::Tcp, true, dev.clone(), Some(ticket)).await;
    let ticket = ticket_of(c.connected().await);
    let (st, r) = api
        .post(
            "/api/v1/push",
            json!({"userId": "rita", "content": "via A", "ackMode": "auto"}),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    c.message("via A").await;
    assert!(
        !c.seen
            .iter()
            .any(|e| matches!(e, ClientEvent::BindOk { .. })),
        "no BIND was answered"
    );
    let (_, u) = api.get("/api/v1/users/rita").await;
    assert_eq!(u["devices"][0]["node"], "B", "{u}");
    assert_eq!(u["devices"][0]["tags"], "vip", "{u}");

    // An UNBIND clears it: the next resume, on A, is not bound.
    c.unbind("rita");
    c.wait_for("unbound", |e| matches!(e, ClientEvent::Unbound { .. }))
        .await;
    c.close();
    let mut c = TestClient::connect(&a, Via::Tcp, true, dev, Some(ticket)).await;
    ticket_of(c.connected().await);
    c.settle(Duration::from_millis(200)).await;
    assert!(!online(&api).await, "nothing restored after an unbind");
    a.shutdown().await;
    b.shutdown().await;
}

/// A new login on node C races an API kick of the same user sent to node
/// B, while the user's older device is on node A. Whichever wins, once both
/// have answered the cluster tells the truth, with no timer to repair it
/// (the route refresh is 1 s here; the checks run before it):
/// - the device on A is kicked (by the kick, or by the newer login);
/// - the device on C was either kicked too (the API kick found its route)
///   or is the user's one device: a push through A then reaches it, and
///   node B lists exactly it; otherwise the user is offline (404) and
///   listed with no device.
///
/// Rounds vary which side starts first by a few hundred µs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_login_racing_an_api_kick_on_other_nodes_leaves_true_routes() {
    let redis = Redis::start(free_port()).await;
    let n = nodes(&redis).await;
    let (api_a, api_b) = (Api::new(&n[0]), Api::new(&n[1]));
    let mut outcomes = [0usize; 2];
    for round in 0..16u64 {
        let user = format!("racer-{round}");
        let mut old = on(&n[0], &user, &format!("old-{round}"), "android", "").await;
        let new_dev = common::device(&format!("new-{round}"), "android");
        let lead = Duration::from_micros((round % 4) * 300);
        let kick = async {
            if round % 2 == 0 {
                tokio::time::sleep(lead).await;
            }
            api_b
                .post(&format!("/api/v1/users/{user}/kick"), json!({}))
                .await
        };
        let login = async {
            if round % 2 == 1 {
                tokio::time::sleep(lead).await;
            }
            bound(&n[2], Via::Tcp, true, new_dev.clone(), &user, "").await
        };
        let ((st, kicked), mut new) = tokio::join!(kick, login);
        // The kick found at least the old device (or, late, the new one).
        assert_eq!(st, 200, "round {round}: {kicked}");
        assert!(
            kicked["kicked"].as_u64() >= Some(1),
            "round {round}: {kicked}"
        );
        old.wait_for("the old device kicked", |e| {
            matches!(e, ClientEvent::Kicked { .. })
        })
        .await;
        new.settle(Duration::from_millis(300)).await;
        let new_kicked = new
            .seen
            .iter()
            .any(|e| matches!(e, ClientEvent::Kicked { .. }));
        outcomes[usize::from(new_kicked)] += 1;
        let text = format!("after round {round}");
        let (st, r) = api_a
            .post("/api/v1/push", json!({"userId": user, "content": text}))
            .await;
        let (_, listed) = api_b.get(&format!("/api/v1/users/{user}")).await;
        let devices: Vec<&str> = listed["devices"]
            .as_array()
            .map(|d| d.iter().filter_map(|d| d["deviceId"].as_str()).collect())
            .unwrap_or_default();
        if new_kicked {
            assert_eq!(st, 404, "round {round}: the user has no connection: {r}");
            assert!(devices.is_empty(), "round {round}: {listed}");
        } else {
            assert_eq!(
                (st, &r["dispatched"]),
                (200, &json!(1)),
                "round {round}: {r}"
            );
            new.message(&text).await;
            assert_eq!(devices, [format!("new-{round}")], "round {round}: {listed}");
        }
        assert!(
            old.messages().iter().all(|m| m != &text),
            "round {round}: the kicked device got the push"
        );
    }
    // Both orders happened (the lead alternates which side starts first).
    eprintln!(
        "new login kicked in {} rounds of 16, kept in {}",
        outcomes[1], outcomes[0]
    );
}

/// A device replaced by a newer login on another node stays connected (as
/// in mpush) but is no longer the user's: a push through its own node goes
/// to the newer device, and once that one leaves, the old node's route
/// refreshes do not bring the replaced device back.
#[tokio::test]
async fn a_device_replaced_from_another_node_gets_nothing_more_and_is_not_refreshed_back() {
    let redis = Redis::start(free_port()).await;
    let n = nodes(&redis).await;
    let (api_a, api_b) = (Api::new(&n[0]), Api::new(&n[1]));
    let mut old = on(&n[0], "rita", "rita-old", "android", "").await;
    let mut new = on(&n[2], "rita", "rita-new", "android", "").await;
    old.wait_for("the old device kicked", |e| {
        matches!(e, ClientEvent::Kicked { .. })
    })
    .await;
    // Through the node that holds the replaced connection.
    let (st, r) = api_a
        .post(
            "/api/v1/push",
            json!({"userId": "rita", "content": "to the new one"}),
        )
        .await;
    assert_eq!((st, &r["dispatched"]), (200, &json!(1)), "{r}");
    new.message("to the new one").await;
    let (_, listed) = api_a.get("/api/v1/users/rita").await;
    assert_eq!(
        listed["devices"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    assert_eq!(listed["devices"][0]["deviceId"], "rita-new", "{listed}");
    // The newer device leaves; three route refreshes (1 s here) later the
    // user is still offline everywhere.
    new.close();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let (st, r) = api_b
        .post(
            "/api/v1/push",
            json!({"userId": "rita", "content": "to nobody"}),
        )
        .await;
    assert_eq!(st, 404, "{r}");
    old.settle(Duration::from_millis(200)).await;
    assert!(
        old.messages().is_empty(),
        "the replaced device got {:?}",
        old.messages()
    );
}

/// A node that waits for room in its callback queue before it delivers a
/// forwarded batch waits a quarter of the forward's timeout at most: the
/// forwarding node gets its answer in time and reports the push delivered
/// (a forward that timed out would be reported as not delivered, although
/// it was). Node B's callback backend hangs, and its queue of 4 is over
/// half full; the forward's timeout is 500 ms, the wait for room alone up
/// to `sinks.accept_timeout_ms` (5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forwarded_push_is_answered_in_time_while_the_callback_queue_is_full() {
    use mpush_server::config::{SinkEvent, Webhook, WebhookMode};
    let hook = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", hook.local_addr().expect("addr"));
    tokio::spawn(async move {
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                axum::http::StatusCode::NO_CONTENT
            }),
        );
        let _ = axum::serve(hook, app).await;
    });
    let redis = Redis::start(free_port()).await;
    let mut n = Vec::new();
    for id in ["A", "B"] {
        let mut s = node_settings(&redis.url(), id);
        s.sinks.webhooks = vec![Webhook {
            url: url.clone(),
            secret: "callback-secret-0123456789".into(),
            events: vec![SinkEvent::Callback],
            mode: WebhookMode::Async,
            queue: 4,
            batch: 1,
            concurrency: 1,
            timeout_ms: 20_000,
            ..Webhook::default()
        }];
        n.push(start(s).await);
    }
    wait_for_nodes(&Api::new(&n[0]), 2).await;
    let (api_a, api_b) = (Api::new(&n[0]), Api::new(&n[1]));
    let mut on_b = on(&n[1], "cleo", "cleo-phone", "android", "").await;
    // Four callbacks on B: its worker hangs on the first, three wait.
    for i in 0..4 {
        let (st, r) = api_b
            .post(
                "/api/v1/push",
                json!({"userId": "cleo", "content": format!("local {i}"), "callback": true}),
            )
            .await;
        assert_eq!(st, 200, "{r}");
        on_b.message(&format!("local {i}")).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = std::time::Instant::now();
    let (st, r) = api_a
        .post(
            "/api/v1/push",
            json!({"userId": "cleo", "content": "forwarded", "callback": true}),
        )
        .await;
    let took = t.elapsed();
    assert_eq!(
        (st, &r["status"]),
        (200, &json!("sent")),
        "{r} after {took:?}"
    );
    assert!(took < Duration::from_millis(500), "{took:?}");
    on_b.message("forwarded").await;
    for node in n {
        node.shutdown().await;
    }
}

/// The route cache never shows delivery an older route table than Redis
/// held when the push came in: a device bound, unbound or replaced on
/// another node a moment ago is seen by the next batch through node A,
/// whose cache held the user's routes from the batch before. Each step is
/// answered (BIND and UNBIND OK, a kick seen) before the push that must see
/// it, with no sleep between, so the invalidation has no time of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cached_route_never_hides_a_bind_an_unbind_or_a_new_login_on_another_node() {
    let redis = Redis::start(free_port()).await;
    // Routes refreshed every 30 s, not every second as in the other tests:
    // a refresh rewrites the user's route, which rightly invalidates A's
    // cached copy, and under a loaded machine one between the two warm-up
    // batches left the cache fewer hits than the check below counts.
    let n = nodes_with(&redis, |s| {
        s.cluster.route_refresh_secs = 30;
        s.cluster.route_ttl_secs = 90;
    })
    .await;
    let api_a = Api::new(&n[0]);
    let batch = |user: &str, content: &str| {
        api_a.post(
            "/api/v1/push/batch",
            json!({"userIds": [user], "content": content}),
        )
    };
    // A batch through A that Redis's routes say reaches `devices` devices.
    let reaches = async |round: usize, user: &str, content: &str, devices: u64| {
        let (st, r) = batch(user, content).await;
        assert_eq!(
            (st, &r["dispatched"]),
            (200, &json!(devices)),
            "round {round}, {content:?}: {r}"
        );
    };
    for round in 0..8 {
        let user = format!("cache{round}");
        let mut phone = on(&n[1], &user, &format!("{user}-phone"), "android", "").await;
        // Read twice through A: the second is served by its cache.
        for warm in ["warm-1", "warm-2"] {
            reaches(round, &user, warm, 1).await;
            phone.message(warm).await;
        }

        // A second device on C: the very next batch reaches both.
        let mut pc = on(&n[2], &user, &format!("{user}-pc"), "windows", "").await;
        reaches(round, &user, "both", 2).await;
        phone.message("both").await;
        pc.message("both").await;

        // The phone unbinds: the next batch goes to the PC alone.
        phone.unbind(&user);
        phone
            .wait_for("unbind ok", |e| matches!(e, ClientEvent::Unbound { .. }))
            .await;
        reaches(round, &user, "pc only", 1).await;
        pc.message("pc only").await;

        // A newer PC login on A replaces the one on C: only it gets the next.
        let mut pc2 = on(&n[0], &user, &format!("{user}-pc-2"), "windows", "").await;
        pc.wait_for("kicked by the newer login", |e| {
            matches!(e, ClientEvent::Kicked { .. })
        })
        .await;
        reaches(round, &user, "newer pc", 1).await;
        pc2.message("newer pc").await;

        // Everyone leaves through C's API: the user is offline for A too.
        pc2.unbind(&user);
        pc2.wait_for("unbind ok", |e| matches!(e, ClientEvent::Unbound { .. }))
            .await;
        let (st, r) = batch(&user, "offline").await;
        assert_eq!(
            r["results"][0]["status"], "offline",
            "round {round}: {st} {r}"
        );
        phone.settle(Duration::from_millis(50)).await;
        pc.settle(Duration::from_millis(50)).await;
        for (c, name, never) in [
            (&phone, "phone", &["pc only", "newer pc", "offline"][..]),
            (&pc, "first pc", &["newer pc", "offline"][..]),
        ] {
            for late in never {
                assert!(
                    !c.messages().contains(&(*late).to_owned()),
                    "round {round}: the {name} got {late:?}"
                );
            }
        }
    }
    // The cache did serve lookups (the second warm-up batch of each round).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, text) = api_a.text(reqwest::Method::GET, "/metrics", None).await;
        let hits: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("mpush_route_cache_hits_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0);
        if hits >= 8.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "route cache hits: {hits}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for s in n {
        s.shutdown().await;
    }
}
