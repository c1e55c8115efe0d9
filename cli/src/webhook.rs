//! `mpush webhook-listen`: a small webhook receiver for trying the server's
//! sinks out. It checks each request's signature (`X-Mpush-Signature`:
//! `v1=` and the hex HMAC-SHA256 of "timestamp.body" under the shared secret)
//! and its timestamp's age, prints every event as one JSON line on stdout,
//! and answers 204 (401 for a bad signature, 503 while `--fail-first`
//! failures are left). With `--echo-api`, each up-push is sent back to its
//! user through the HTTP API ("echo: ..."), for a round trip to watch.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use hmac::{KeyInit, Mac};
use serde_json::{Value, json};

pub struct Options {
    pub listen: SocketAddr,
    pub path: String,
    pub secret: String,
    pub tolerance_secs: u64,
    pub fail_first: usize,
    pub echo_api: Option<String>,
    pub api_token: Option<String>,
    pub count: Option<usize>,
}

struct State {
    o: Options,
    failures_left: AtomicUsize,
    seen: AtomicUsize,
    http: reqwest::Client,
    done: tokio::sync::Notify,
}

/// Checks a webhook request: the signature over "timestamp.body" and the
/// timestamp within `tolerance_secs` of now.
pub fn verify(
    secret: &[u8],
    timestamp: &str,
    signature: &str,
    body: &[u8],
    tolerance_secs: u64,
) -> Result<(), &'static str> {
    let ts: i64 = timestamp.parse().map_err(|_| "no X-Mpush-Timestamp")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    if (now - ts).unsigned_abs() > tolerance_secs {
        return Err("timestamp too far from now (a replay?)");
    }
    let hex_sig = signature
        .strip_prefix("v1=")
        .ok_or("X-Mpush-Signature is not v1=<hex>")?;
    let sig = hex::decode(hex_sig).map_err(|_| "X-Mpush-Signature is not hex")?;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).map_err(|_| "bad key")?;
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    // Constant-time comparison.
    mac.verify_slice(&sig).map_err(|_| "signature mismatch")
}

pub async fn run(o: Options) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(o.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", o.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!(
        "webhook-listen: POST http://{addr}{} (signatures checked)",
        o.path
    );
    let path = o.path.clone();
    let state = Arc::new(State {
        failures_left: AtomicUsize::new(o.fail_first),
        seen: AtomicUsize::new(0),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| e.to_string())?,
        done: tokio::sync::Notify::new(),
        o,
    });
    let st = state.clone();
    let app = axum::Router::new().route(
        &path,
        axum::routing::post(move |h: HeaderMap, body: Bytes| {
            let st = st.clone();
            async move { take(&st, &h, &body).await }
        }),
    );
    let done = state.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { done.done.notified().await })
        .await
        .map_err(|e| e.to_string())
}

async fn take(st: &State, h: &HeaderMap, body: &[u8]) -> StatusCode {
    let header = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).unwrap_or("");
    if let Err(why) = verify(
        st.o.secret.as_bytes(),
        header("x-mpush-timestamp"),
        header("x-mpush-signature"),
        body,
        st.o.tolerance_secs,
    ) {
        eprintln!("webhook-listen: refused a request: {why}");
        return StatusCode::UNAUTHORIZED;
    }
    if st
        .failures_left
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
    {
        eprintln!("webhook-listen: answering 503 on purpose (--fail-first)");
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        eprintln!("webhook-listen: a body that is not JSON");
        return StatusCode::BAD_REQUEST;
    };
    let events = v["events"].as_array().cloned().unwrap_or_default();
    for e in &events {
        println!("{e}");
        if e["type"] == "up_push"
            && let Some(api) = &st.o.echo_api
        {
            echo(st, api, e).await;
        }
        let n = st.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if st.o.count.is_some_and(|c| n >= c) {
            st.done.notify_one();
        }
    }
    StatusCode::NO_CONTENT
}

/// Sends an up-push back to its user: "echo: <content>".
async fn echo(st: &State, api: &str, e: &Value) {
    let (Some(user), Some(content)) = (e["userId"].as_str(), e["content"].as_str()) else {
        return;
    };
    let mut req = st
        .http
        .post(format!("{}/api/v1/push", api.trim_end_matches('/')))
        .json(&json!({"userId": user, "content": format!("echo: {content}"), "ackMode": "auto"}));
    if let Some(t) = &st.o.api_token {
        req = req.bearer_auth(t);
    }
    if let Err(e) = req.send().await.and_then(|r| r.error_for_status()) {
        eprintln!("webhook-listen: echo to {user} failed: {e}");
    }
}
