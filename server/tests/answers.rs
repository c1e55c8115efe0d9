//! What the API's answers mean (ADR 0007), on one node: a 2xx only when a
//! push was handed to a connection or kept in the inbox; a retried request
//! (an Idempotency-Key, or the same traceId and message) gets the first
//! answer and sends nothing twice; a batch sends to each user once.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

#[tokio::test]
async fn an_answer_says_what_happened() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    // Offline, nothing asked to keep it: nothing happened (before: 200).
    let (st, r) = api
        .post("/api/v1/push", json!({"userId": "nobody", "content": "x"}))
        .await;
    assert_eq!(st, 404, "{r}");
    assert_eq!(
        (&r["error"]["code"], &r["status"]),
        (&json!("offline"), &json!("offline")),
        "{r}"
    );
    assert!(r["traceId"].is_string(), "the trace says so too: {r}");
    // Kept for the user: a 200 that says stored.
    let (st, r) = api
        .post(
            "/api/v1/push",
            json!({"userId": "nobody", "content": "x", "ttlSeconds": 60}),
        )
        .await;
    assert_eq!(
        (st, &r["status"], &r["stored"]),
        (200, &json!("sent"), &json!(true)),
        "{r}"
    );
    // Handed to a connection.
    let mut c = bound(&server, Via::Tcp, true, device("a-1", "android"), "ann", "").await;
    let (st, r) = api
        .post("/api/v1/push", json!({"userId": "ann", "content": "hi"}))
        .await;
    assert_eq!(
        (st, &r["status"], &r["dispatched"]),
        (200, &json!("sent"), &json!(1)),
        "{r}"
    );
    c.message("hi").await;
    // A batch: 200 when every user's push happened, 207 when some did not.
    let (st, r) = api
        .post(
            "/api/v1/push/batch",
            json!({"userIds": ["ann"], "content": "b1"}),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    let (st, r) = api
        .post(
            "/api/v1/push/batch",
            json!({"userIds": ["ann", "nobody"], "content": "b2"}),
        )
        .await;
    assert_eq!((st, &r["failed"]), (207, &json!(1)), "{r}");
    assert_eq!(r["results"][1]["status"], "offline", "{r}");
    server.shutdown().await;
}

/// A backend that retries (a timeout, a redeploy) with the same
/// Idempotency-Key gets the first answer; the device gets one copy, not
/// two (before: stored and delivered twice, each copy with its own id).
#[tokio::test]
async fn a_retried_request_sends_nothing_twice() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let mut c = bound(&server, Via::Tcp, true, device("r-1", "android"), "rae", "").await;
    let body = json!({"userId": "rae", "content": "once", "ackMode": "auto"});
    let key = [("idempotency-key", "order-42-shipped")];
    let (st1, h1, r1) = api.post_with("/api/v1/push", &key, body.clone()).await;
    assert_eq!(st1, 200, "{r1}");
    assert!(h1.get("idempotency-replayed").is_none());
    let (st2, h2, r2) = api.post_with("/api/v1/push", &key, body.clone()).await;
    assert_eq!((st2, &r2), (200, &r1), "the first answer again");
    assert_eq!(h2["idempotency-replayed"], "true");
    // The same key for another request is refused.
    let (st, _, r) = api
        .post_with(
            "/api/v1/push",
            &key,
            json!({"userId": "rae", "content": "other"}),
        )
        .await;
    assert_eq!(
        (st, &r["error"]["code"]),
        (422, &json!("key_reused")),
        "{r}"
    );
    // A traceId names a retry of the same message (and only of it).
    let traced = json!({"userId": "rae", "content": "traced", "traceId": "campaign-7"});
    let (_, a) = api.post("/api/v1/push", traced.clone()).await;
    let (_, b) = api.post("/api/v1/push", traced).await;
    assert_eq!(a, b);
    let (st, _) = api
        .post(
            "/api/v1/push",
            json!({"userId": "rae", "content": "traced too", "traceId": "campaign-7"}),
        )
        .await;
    assert_eq!(
        st, 200,
        "another message under the same trace id is another push"
    );
    // A batch that lists a user three times sends to the user once.
    let (st, r) = api
        .post(
            "/api/v1/push/batch",
            json!({"userIds": ["rae", "rae", "rae"], "content": "dup"}),
        )
        .await;
    assert_eq!(
        (st, r["results"].as_array().map(Vec::len)),
        (200, Some(1)),
        "{r}"
    );
    for text in ["once", "traced", "traced too", "dup"] {
        c.message(text).await;
    }
    c.settle(Duration::from_millis(400)).await;
    let got = c.messages();
    for text in ["once", "traced", "dup"] {
        assert_eq!(
            got.iter().filter(|m| *m == text).count(),
            1,
            "{text}: {got:?}"
        );
    }
    // A bad key is a 400, not ignored.
    let (st, _, _) = api
        .post_with("/api/v1/push", &[("idempotency-key", "")], body)
        .await;
    assert_eq!(st, 400);
    server.shutdown().await;
}

/// mpush's `/exec` answers in its own shape by the same rules.
#[tokio::test]
async fn mpush_exec_follows_the_same_rules() {
    let server = start(settings()).await;
    let api = Api::new(&server);
    let (st, r) = api
        .post(
            "/exec",
            json!({"method": "push", "userId": "nobody", "msgbody": "x"}),
        )
        .await;
    assert_eq!(
        (st, &r["success"], &r["status"]),
        (404, &json!(false), &json!("offline")),
        "{r}"
    );
    let (st, r) = api
        .post(
            "/exec",
            json!({"method": "push", "userId": "nobody", "msgbody": "x", "ttl": 60}),
        )
        .await;
    assert_eq!((st, &r["success"]), (200, &json!(true)), "{r}");
    server.shutdown().await;
}
