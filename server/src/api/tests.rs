//! The API's handlers at their seam: the real router and middleware over a
//! fake service, driven without a socket. What reaches the service, and
//! what an answer from it becomes in HTTP, is all that is observed.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use mpush_protocol::session::ClientType;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::{ApiSettings, ApiState, Health, Service, router};
use crate::cluster::NodeInfo;
use crate::logic::callback::CallbackTarget;
use crate::logic::send::{Audience, SendAnswer, SendError, SendRequest, Sent};
use crate::logic::{Listeners, NotReady, UserOutcome, UserStatus, UserView};
use crate::route::RouteError;
use crate::store::{StoreError, TopicFull, TraceView};

/// A logic layer that records what it is asked and answers as set.
#[derive(Default)]
struct Fake {
    sent: Mutex<Vec<SendRequest>>,
    /// The answer to the next send (else: every user `sent`).
    send_error: Mutex<Option<SendError>>,
    kicked: usize,
    not_ready: Option<NotReady>,
}

#[async_trait]
impl Service for Fake {
    async fn send(&self, req: SendRequest) -> Result<SendAnswer, SendError> {
        let users = match &req.audience {
            Audience::Users(u) => u.clone(),
            _ => Vec::new(),
        };
        let trace_id = req.trace_id.clone().unwrap_or_else(|| "t-fake".into());
        self.sent.lock().push(req);
        if let Some(e) = self.send_error.lock().take() {
            return Err(e);
        }
        let results = users
            .into_iter()
            .map(|u| UserOutcome {
                status: if u == "offline" {
                    UserStatus::Offline
                } else {
                    UserStatus::Sent
                },
                dispatched: usize::from(u != "offline"),
                ..UserOutcome::new(&u)
            })
            .collect();
        Ok(SendAnswer {
            sent: Sent::Users { trace_id, results },
            replayed: false,
        })
    }

    fn can_reach(&self, target: &CallbackTarget) -> bool {
        matches!(target, CallbackTarget::Sinks)
    }

    async fn trace(&self, _: &str) -> Result<Option<TraceView>, StoreError> {
        Ok(None)
    }

    async fn user(&self, user: &str) -> Result<UserView, StoreError> {
        Ok(UserView {
            user_id: user.into(),
            online: false,
            devices: Vec::new(),
            inbox: 3,
        })
    }

    async fn kick(&self, _: &str, _: Option<ClientType>) -> Result<usize, RouteError> {
        Ok(self.kicked)
    }

    async fn subscribe(&self, _: &str, _: &str) -> Result<bool, TopicFull> {
        Ok(true)
    }

    async fn unsubscribe(&self, _: &str, _: &str) -> Result<bool, StoreError> {
        Ok(false)
    }

    fn health(&self) -> Health {
        Health {
            draining: false,
            connections: 4,
            bound: 2,
        }
    }

    async fn ready(&self) -> Result<(), NotReady> {
        self.not_ready.clone().map_or(Ok(()), Err)
    }

    async fn live_nodes(&self) -> Option<Vec<NodeInfo>> {
        None
    }

    fn listeners(&self) -> Listeners {
        Listeners {
            tcp: "127.0.0.1:3000".parse().expect("address"),
            ws: None,
            http: "127.0.0.1:8080".parse().expect("address"),
        }
    }

    fn update_gauges(&self) {}
}

fn settings() -> ApiSettings {
    ApiSettings {
        max_ttl_secs: 3600,
        max_content: 1000,
        ..ApiSettings::default()
    }
}

/// One request through the whole router, from `peer`.
async fn call(
    fake: &Arc<Fake>,
    settings: ApiSettings,
    peer: &str,
    req: Request<Body>,
) -> (StatusCode, Value) {
    let state = ApiState {
        svc: fake.clone(),
        settings: Arc::new(settings),
        metrics: crate::telemetry::handle(),
    };
    let mut req = req;
    let peer: SocketAddr = peer.parse().expect("address");
    req.extensions_mut().insert(ConnectInfo(peer));
    let r = router(state).oneshot(req).await.expect("infallible");
    let status = r.status();
    let body = axum::body::to_bytes(r.into_body(), 1 << 20)
        .await
        .expect("body");
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn post(uri: &str, body: Value) -> Request<Body> {
    Request::post(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request")
}

const LOCAL: &str = "127.0.0.1:5000";

#[tokio::test]
async fn a_push_becomes_one_send_request_and_its_answer() {
    let fake = Arc::new(Fake::default());
    let body = json!({ "userId": "alice", "content": "hi", "ackMode": "auto", "ttlSeconds": 60, "traceId": "t-1" });
    let (status, answer) = call(&fake, settings(), LOCAL, post("/api/v1/push", body)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["traceId"], "t-1");
    assert_eq!(answer["status"], "sent");
    let sent = fake.sent.lock();
    let [req] = &sent[..] else {
        panic!("one send: {sent:?}");
    };
    assert!(matches!(&req.audience, Audience::Users(u) if u == &["alice".to_owned()]));
    assert_eq!(&*req.spec.content, b"hi");
    assert_eq!(req.spec.ttl_secs, 60);
}

#[tokio::test]
async fn the_api_s_own_limits_refuse_before_the_service_is_asked() {
    let fake = Arc::new(Fake::default());
    for body in [
        json!({ "userId": "a", "content": "x".repeat(1001) }),
        json!({ "userId": "a", "content": "x", "ttlSeconds": 3601 }),
        json!({ "userId": "a", "content": "x", "callbackUrl": "http://example.com/cb" }),
        json!({ "userId": "a", "content": "x", "surprise": 1 }),
    ] {
        let (status, answer) = call(&fake, settings(), LOCAL, post("/api/v1/push", body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert!(
            answer["error"].is_object() || answer["error"].is_string(),
            "{answer}"
        );
    }
    assert!(fake.sent.lock().is_empty());
    // A callback that a sink can take passes.
    let body = json!({ "userId": "a", "content": "x", "callback": true });
    let (status, _) = call(&fake, settings(), LOCAL, post("/api/v1/push", body)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn what_the_service_says_is_the_status() {
    let fake = Arc::new(Fake::default());
    *fake.send_error.lock() = Some(SendError::Unavailable("inbox store: down".into()));
    let body = json!({ "userId": "a", "content": "x" });
    let (status, answer) = call(&fake, settings(), LOCAL, post("/api/v1/push", body.clone())).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert!(answer.to_string().contains("inbox store: down"), "{answer}");

    *fake.send_error.lock() = Some(SendError::Draining);
    let (status, _) = call(&fake, settings(), LOCAL, post("/api/v1/push", body)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    // A batch where some users got it and some did not: 207.
    let body = json!({ "userIds": ["a", "offline"], "content": "x" });
    let (status, answer) = call(&fake, settings(), LOCAL, post("/api/v1/push/batch", body)).await;
    assert_eq!(status, StatusCode::MULTI_STATUS, "{answer}");
}

#[tokio::test]
async fn queries_answer_from_the_service() {
    let fake = Arc::new(Fake {
        not_ready: Some(NotReady::RedisTimeout),
        ..Fake::default()
    });
    let get = |u: &str| Request::get(u).body(Body::empty()).expect("request");
    let (status, answer) = call(&fake, settings(), LOCAL, get("/api/v1/traces/t-9")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    let (status, answer) = call(&fake, settings(), LOCAL, get("/api/v1/users/bob")).await;
    assert_eq!((status, &answer["inbox"]), (StatusCode::OK, &json!(3)));
    let (status, answer) = call(&fake, settings(), LOCAL, get("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&answer["connections"], &answer["bound"]),
        (&json!(4), &json!(2))
    );
    let (status, answer) = call(&fake, settings(), LOCAL, get("/readyz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        answer["reason"],
        "redis: no answer within cluster.timeout_ms"
    );
    // A kick that found no device is a 404; one that did, the count.
    let kick = || post("/api/v1/users/bob/kick", json!({}));
    let (status, _) = call(&fake, settings(), LOCAL, kick()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let fake = Arc::new(Fake {
        kicked: 2,
        ..Fake::default()
    });
    let (status, answer) = call(&fake, settings(), LOCAL, kick()).await;
    assert_eq!((status, &answer["kicked"]), (StatusCode::OK, &json!(2)));
}

/// `/exec` declares `Idempotency-Key` for every method: a malformed one is
/// a 400 even for a read (schemathesis found a `queryTrace` that took it).
#[tokio::test]
async fn exec_refuses_a_malformed_idempotency_key_whatever_the_method() {
    let fake = Arc::new(Fake::default());
    for (body, clean) in [
        ("method=queryTrace&traceId=t-1", StatusCode::NOT_FOUND),
        ("method=push&userId=a&msgbody=x", StatusCode::OK),
    ] {
        let req = |key: Option<&str>| {
            let mut r = Request::post("/exec")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Body::from(body))
                .expect("request");
            if let Some(k) = key {
                r.headers_mut()
                    .insert("idempotency-key", k.parse().expect("header"));
            }
            r
        };
        let (status, answer) = call(&fake, settings(), LOCAL, req(Some("bad key"))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let (status, answer) = call(&fake, settings(), LOCAL, req(Some("key-1"))).await;
        assert_eq!(status, clean, "{body}: {answer}");
    }
    // Only the well-formed push reached the service, with its key.
    let sent = fake.sent.lock();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].idempotency_key.as_deref(), Some("key-1"));
}

#[tokio::test]
async fn without_a_token_only_loopback_is_served_and_with_one_only_its_bearer() {
    let fake = Arc::new(Fake::default());
    let body = || post("/api/v1/push", json!({ "userId": "a", "content": "x" }));
    let (status, _) = call(&fake, settings(), "192.0.2.7:5000", body()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let with_token = ApiSettings {
        api_tokens: vec!["s3cret".into()],
        ..settings()
    };
    let (status, _) = call(&fake, with_token.clone(), LOCAL, body()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let mut req = body();
    req.headers_mut()
        .insert("authorization", "Bearer s3cret".parse().expect("header"));
    let (status, _) = call(&fake, with_token, "192.0.2.7:5000", req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fake.sent.lock().len(), 1);
}
