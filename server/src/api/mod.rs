//! The HTTP API for business backends (JSON), mpush's `/exec` and the alloc
//! routes. An OpenAPI document is served at `/openapi.json`.
//!
//! This file is the router with its middleware and the JSON routes, each
//! next to the body it reads (about 60 lines a route); answers, errors, the
//! mpush routes, the seam and the accept loop are files beside it.

mod answer;
mod compat;
mod error;
pub mod seam;
pub mod serve;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use base64::Engine as _;
use bytes::Bytes;
use metrics_exporter_prometheus::PrometheusHandle;
use mpush_protocol::session::{AckMode, ClientType};
use serde::Deserialize;
use serde_json::{Value, json};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::services::ServeDir;

pub use error::ApiError;
pub use seam::{ApiSettings, Health, HubService, Service};

use crate::logic::MessageSpec;
use crate::logic::callback::CallbackTarget;
use crate::logic::send::{Audience, SendAnswer, SendRequest};
use crate::store::StoreError;

#[derive(Clone)]
pub struct ApiState {
    /// The logic layer, as the API sees it.
    pub svc: Arc<dyn Service>,
    pub settings: Arc<ApiSettings>,
    pub metrics: PrometheusHandle,
}

pub fn router(state: ApiState) -> Router {
    let protected = Router::new()
        .route("/api/v1/push", post(push))
        .route("/api/v1/push/batch", post(push_batch))
        .route("/api/v1/broadcast", post(broadcast))
        .route(
            "/api/v1/topics/{topic}/subscribers/{user_id}",
            put(subscribe).delete(unsubscribe),
        )
        .route("/api/v1/topics/{topic}/push", post(topic_push))
        .route("/api/v1/traces/{trace_id}", get(trace))
        .route("/api/v1/users/{user_id}", get(user))
        .route("/api/v1/users/{user_id}/kick", post(kick))
        .route("/exec", get(compat::exec).post(compat::exec))
        .route("/push", post(compat::alloc_push))
        // Set before the layers, so that CORS still answers a preflight.
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    let protected = match cors(&state.settings.cors_origins) {
        Some(layer) => protected.layer(layer),
        None => protected,
    };
    let mut app = Router::new()
        .route("/", get(compat::alloc_servers))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .method_not_allowed_fallback(method_not_allowed)
        .merge(protected);
    if let Some(dir) = demo_dir(&state.settings.demo_dir) {
        tracing::info!(dir = %dir.display(), "serving the demo page at /demo/");
        app = app
            .route("/demo", get(|| async { Redirect::permanent("/demo/") }))
            .nest_service("/demo/", ServeDir::new(dir));
    }
    app.fallback(|| async { ApiError::not_found("no such route") })
        .layer(middleware::from_fn_with_state(state.clone(), same_site))
        .layer(middleware::from_fn(timed))
        // A span per request (method, path, version) that every log line of
        // the request carries; the response (status, latency) at DEBUG, and
        // 5xx answers at WARN (a 503 while a store is down is an answer the
        // caller acts on; its cause is logged once where it happens).
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(
                    tower_http::trace::DefaultMakeSpan::new().level(tracing::Level::INFO),
                )
                .on_response(
                    tower_http::trace::DefaultOnResponse::new().level(tracing::Level::DEBUG),
                )
                .on_failure(tower_http::trace::DefaultOnFailure::new().level(tracing::Level::WARN)),
        )
        .with_state(state)
}

/// The route label of `mpush_api_request_duration_seconds` (a fixed set).
fn route_label(path: &str) -> &'static str {
    match path {
        "/api/v1/push" => "push",
        "/api/v1/push/batch" => "push_batch",
        "/api/v1/broadcast" => "broadcast",
        "/metrics" => "metrics",
        "/exec" | "/push" | "/" => "compat",
        p => match p.strip_prefix("/api/v1/") {
            Some(r) if r.starts_with("traces/") => "trace",
            Some(r) if r.starts_with("users/") && r.ends_with("/kick") => "kick",
            Some(r) if r.starts_with("users/") => "user",
            Some(r) if r.starts_with("topics/") && r.ends_with("/push") => "topic_push",
            Some(r) if r.starts_with("topics/") => "subscribe",
            _ => "other",
        },
    }
}

/// Times every request, from its headers read to its answer built (the
/// body is read inside), by route.
async fn timed(req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let route = route_label(req.uri().path());
    let res = next.run(req).await;
    metrics::histogram!("mpush_api_request_duration_seconds", "route" => route)
        .record(started.elapsed().as_secs_f64());
    res
}

/// A route without the method asked for: a JSON 405 (axum adds `Allow`).
async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed("this route has no such method (see Allow)")
}

/// DNS rebinding and cross-site requests: the `Host` must be an IP literal,
/// `localhost` or one of `security.allowed_hosts`; a state-changing request
/// that a browser sent from another site (its `Origin`, or
/// `Sec-Fetch-Site: cross-site`) must come from a configured CORS origin.
async fn same_site(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    let sec = &s.settings;
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !host.is_empty() && !host_allowed(host, &sec.allowed_hosts) {
        metrics::counter!("mpush_api_refused_total", "reason" => "host").increment(1);
        return ApiError::forbidden(format!(
            "host `{host}` is not served here (security.allowed_hosts)"
        ))
        .into_response();
    }
    if let Some(refusal) = preflight_refusal(&req, host, &sec.cors_origins) {
        metrics::counter!("mpush_api_refused_total", "reason" => "origin").increment(1);
        return ApiError::forbidden(refusal).into_response();
    }
    let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if !safe {
        let origin = req
            .headers()
            .get(header::ORIGIN)
            .and_then(|o| o.to_str().ok());
        let cross = match origin {
            Some(o) => !same_origin(o, host) && !origin_allowed(o, &sec.cors_origins),
            None => {
                req.headers()
                    .get("sec-fetch-site")
                    .is_some_and(|v| v.as_bytes() == b"cross-site")
                    && !sec.cors_origins.iter().any(|o| o == "*")
            }
        };
        if cross {
            metrics::counter!("mpush_api_refused_total", "reason" => "origin").increment(1);
            return ApiError::forbidden(
                "cross-site request refused (security.cors_origins lists the pages that may call the API)",
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// Methods and request headers a configured CORS origin may use.
const CORS_METHODS: [Method; 4] = [Method::GET, Method::POST, Method::PUT, Method::DELETE];
const CORS_HEADERS: [&str; 3] = ["content-type", "authorization", "idempotency-key"];

/// A CORS preflight the API will not allow, and why (a JSON 403 instead of
/// an empty answer the browser reports as "CORS error" and nothing more).
/// Preflights on a server without CORS origins get the JSON 405 of a route
/// without OPTIONS.
fn preflight_refusal(req: &Request, host: &str, origins: &[String]) -> Option<String> {
    if req.method() != Method::OPTIONS || origins.is_empty() {
        return None;
    }
    let h = req.headers();
    let asked = h.get(header::ACCESS_CONTROL_REQUEST_METHOD)?;
    let origin = h.get(header::ORIGIN).and_then(|o| o.to_str().ok())?;
    if !same_origin(origin, host) && !origin_allowed(origin, origins) {
        return Some(format!(
            "CORS preflight refused: origin `{origin}` is not in security.cors_origins"
        ));
    }
    let method = asked.to_str().unwrap_or("");
    if !CORS_METHODS.iter().any(|m| m.as_str() == method) {
        return Some(format!(
            "CORS preflight refused: method `{method}` (the API takes GET, POST, PUT and DELETE)"
        ));
    }
    let headers = h
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if let Some(other) = headers
        .split(',')
        .map(str::trim)
        .find(|x| !x.is_empty() && !CORS_HEADERS.iter().any(|a| a.eq_ignore_ascii_case(x)))
    {
        return Some(format!(
            "CORS preflight refused: request header `{other}` (allowed: {})",
            CORS_HEADERS.join(", ")
        ));
    }
    None
}

fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let Ok(a) = host.parse::<axum::http::uri::Authority>() else {
        return false;
    };
    let name = a.host().trim_start_matches('[').trim_end_matches(']');
    name.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed
            .iter()
            .any(|h| h == "*" || h.eq_ignore_ascii_case(name) || h.eq_ignore_ascii_case(host))
}

fn same_origin(origin: &str, host: &str) -> bool {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    rest.is_some_and(|r| !host.is_empty() && r.eq_ignore_ascii_case(host))
}

fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    allowed.iter().any(|o| o == "*" || o == origin)
}

/// The CORS layer for the configured origins (`*`: any), if any.
fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        // Validated at start-up.
        AllowOrigin::list(origins.iter().filter_map(|o| o.parse().ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods(CORS_METHODS)
            .allow_headers(CORS_HEADERS.map(header::HeaderName::from_static))
            .max_age(std::time::Duration::from_secs(600)),
    )
}

/// The demo folder, when configured and present (it holds `index.html`).
pub fn demo_dir(dir: &str) -> Option<std::path::PathBuf> {
    let p = std::path::PathBuf::from(dir);
    (!dir.is_empty() && p.join("index.html").is_file()).then_some(p)
}

/// Bearer tokens from the config; with none configured, loopback clients only.
async fn auth(
    State(s): State<ApiState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    forwarded: Option<axum::Extension<crate::forwarded::Forwarded>>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    let tokens = &s.settings.api_tokens;
    if tokens.is_empty() {
        // The client as the forwarding rules resolved it (an unknown one is
        // never loopback); without them (a router in a test), the peer.
        let loopback = match forwarded {
            Some(axum::Extension(f)) => f.is_loopback(),
            None => peer.ip().is_loopback(),
        };
        if !loopback {
            return ApiError::unauthorized(
                "no API token is configured: the API answers loopback clients only",
            )
            .into_response();
        }
    } else {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        // Constant time over digests (no length or prefix oracle), and every
        // token is compared.
        let ok = given.is_some_and(|g| {
            use sha2::Digest as _;
            let g = sha2::Sha256::digest(g.as_bytes());
            tokens.iter().fold(false, |hit, t| {
                let t = sha2::Sha256::digest(t.as_bytes());
                mpush_protocol::crypto::verify_mac(&t, &g) | hit
            })
        });
        if !ok {
            return ApiError::unauthorized("missing or wrong bearer token").into_response();
        }
    }
    next.run(req).await
}

/// The body fields every push shares.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct MessageBody {
    pub content: Option<String>,
    pub content_base64: Option<String>,
    pub client_type: Option<Value>,
    pub ack_mode: Option<String>,
    pub trace_id: Option<String>,
    pub timeout_ms: Option<u64>,
    pub ttl_seconds: Option<u64>,
    /// Report each recipient's terminal state to the callback sinks.
    pub callback: Option<bool>,
    /// ... or to this URL (one of `sinks.callback_urls`).
    pub callback_url: Option<String>,
    /// Anything else: refused (serde's `deny_unknown_fields` does not work
    /// through `flatten`, which the request bodies use).
    #[serde(flatten)]
    pub unknown: std::collections::BTreeMap<String, Value>,
}

impl MessageBody {
    pub fn spec(&self, s: &ApiState) -> Result<MessageSpec, ApiError> {
        if !self.unknown.is_empty() {
            let names: Vec<&str> = self.unknown.keys().map(String::as_str).collect();
            return Err(ApiError::bad_request(format!(
                "unknown field(s): {}",
                names.join(", ")
            )));
        }
        let content: Bytes = match (&self.content, &self.content_base64) {
            (Some(c), None) => Bytes::copy_from_slice(c.as_bytes()),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| ApiError::bad_request(format!("contentBase64 is not base64: {e}")))?
                .into(),
            (Some(_), Some(_)) => {
                return Err(ApiError::bad_request(
                    "give content or contentBase64, not both",
                ));
            }
            (None, None) => {
                return Err(ApiError::bad_request(
                    "content or contentBase64 is required",
                ));
            }
        };
        check_content(&s.settings, &content)?;
        let ack_mode = parse_ack_mode(self.ack_mode.as_deref())?;
        let ttl_secs = self.ttl_seconds.unwrap_or(0);
        let max_ttl = s.settings.max_ttl_secs;
        if ttl_secs > max_ttl {
            return Err(ApiError::bad_request(format!(
                "ttlSeconds is at most {max_ttl}"
            )));
        }
        if let Some(t) = self.timeout_ms
            && !(100..=600_000).contains(&t)
        {
            return Err(ApiError::bad_request("timeoutMs must be 100 to 600000"));
        }
        check_trace_id(self.trace_id.as_deref())?;
        let callback = match (&self.callback_url, self.callback) {
            (Some(u), Some(false)) => {
                return Err(ApiError::bad_request(format!(
                    "callbackUrl `{u}` with callback: false"
                )));
            }
            (Some(u), _) => Some(CallbackTarget::Url(u.as_str().into())),
            (None, Some(true)) => Some(CallbackTarget::Sinks),
            (None, _) => None,
        };
        if let Some(t) = &callback
            && !s.svc.can_reach(t)
        {
            return Err(ApiError::bad_request(match t {
                CallbackTarget::Sinks => {
                    "callback: no sink takes callbacks (sinks.webhooks[].events or sinks.stream.events)"
                        .to_owned()
                }
                CallbackTarget::Url(u) => {
                    format!("callbackUrl `{u}` is not in sinks.callback_urls")
                }
            }));
        }
        Ok(MessageSpec {
            content,
            ack_mode,
            client_type: parse_client_type(self.client_type.as_ref())?,
            ttl_secs,
            ack_timeout: self.timeout_ms.map(std::time::Duration::from_millis),
            callback,
        })
    }
}

/// A push no client could accept is refused, never stored.
fn check_content(settings: &ApiSettings, content: &[u8]) -> Result<(), ApiError> {
    let max = settings.max_content;
    if content.len() > max {
        return Err(ApiError::bad_request(format!(
            "content is {} bytes; at most {max}",
            content.len()
        )));
    }
    Ok(())
}

fn check_trace_id(t: Option<&str>) -> Result<(), ApiError> {
    if t.is_some_and(|t| t.len() > 128 || t.chars().any(char::is_control)) {
        return Err(ApiError::bad_request(
            "traceId is at most 128 characters, none of them control characters",
        ));
    }
    Ok(())
}

pub fn parse_ack_mode(s: Option<&str>) -> Result<AckMode, ApiError> {
    match s.unwrap_or("none") {
        "none" => Ok(AckMode::None),
        "auto" => Ok(AckMode::Auto),
        "biz" => Ok(AckMode::Biz),
        other => Err(ApiError::bad_request(format!(
            "ackMode `{other}` is not one of none, auto, biz"
        ))),
    }
}

/// 1/"mobile", 2/"pc", 3/"web" (mpush's client types).
fn parse_client_type(v: Option<&Value>) -> Result<Option<ClientType>, ApiError> {
    let bad = || ApiError::bad_request("clientType is 1 (mobile), 2 (pc), 3 (web) or their names");
    let known = [ClientType::Mobile, ClientType::Pc, ClientType::Web];
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => known
            .into_iter()
            .find(|t| n.as_i64() == Some(i64::from(t.code())))
            .map(Some)
            .ok_or_else(bad),
        Some(Value::String(s)) => known
            .into_iter()
            .find(|t| s == t.name() || *s == t.code().to_string())
            .map(Some)
            .ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

/// A user id the gateways accept in a bind (1 to 512 bytes).
fn check_user(u: &str) -> Result<(), ApiError> {
    use mpush_protocol::session::limits::USER_ID;
    if u.is_empty() || u.len() > USER_ID {
        return Err(ApiError::bad_request(format!(
            "userId must be 1 to {USER_ID} bytes"
        )));
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PushBody {
    user_id: String,
    #[serde(flatten)]
    message: MessageBody,
}

/// The one way in (`logic::send`) for the JSON routes.
async fn send(
    s: &ApiState,
    headers: &HeaderMap,
    audience: Audience,
    message: &MessageBody,
    spec: MessageSpec,
) -> Result<SendAnswer, ApiError> {
    let req = SendRequest {
        audience,
        spec,
        trace_id: message.trace_id.clone(),
        idempotency_key: answer::idempotency_key(headers)?,
        untraced: false,
    };
    s.svc.send(req).await.map_err(answer::send_error)
}

async fn push(
    State(s): State<ApiState>,
    headers: HeaderMap,
    body: Result<Json<PushBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(b) = body?;
    check_user(&b.user_id)?;
    let spec = b.message.spec(&s)?;
    let a = send(
        &s,
        &headers,
        Audience::Users(vec![b.user_id]),
        &b.message,
        spec,
    )
    .await?;
    // The push is queued on its connection, whose task was just woken: let
    // it write before this answer does, so the message does not wait
    // behind the HTTP response's write (on a busy worker it runs next).
    tokio::task::yield_now().await;
    Ok(answer::single(a))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BatchBody {
    user_ids: Vec<String>,
    #[serde(flatten)]
    message: MessageBody,
}

const MAX_BATCH: usize = 10_000;

async fn push_batch(
    State(s): State<ApiState>,
    headers: HeaderMap,
    body: Result<Json<BatchBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(b) = body?;
    if b.user_ids.is_empty() || b.user_ids.len() > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "userIds must hold 1 to {MAX_BATCH} users"
        )));
    }
    for u in &b.user_ids {
        check_user(u)?;
    }
    let spec = b.message.spec(&s)?;
    // One route lookup and one frame per node for the whole batch (results
    // per user, in the order given, each user once).
    let a = send(&s, &headers, Audience::Users(b.user_ids), &b.message, spec).await?;
    Ok(answer::batch(a))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BroadcastBody {
    #[serde(default)]
    tags: Vec<String>,
    condition: Option<String>,
    #[serde(flatten)]
    message: MessageBody,
}

async fn broadcast(
    State(s): State<ApiState>,
    headers: HeaderMap,
    body: Result<Json<BroadcastBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(b) = body?;
    let spec = b.message.spec(&s)?;
    let audience = Audience::Broadcast {
        tags: b.tags,
        condition: b.condition,
    };
    let a = send(&s, &headers, audience, &b.message, spec).await?;
    Ok(answer::started(a))
}

pub fn check_topic(t: &str) -> Result<(), ApiError> {
    if t.is_empty() || t.len() > 128 {
        return Err(ApiError::bad_request("topic must be 1 to 128 characters"));
    }
    Ok(())
}

async fn subscribe(
    State(s): State<ApiState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path((topic, user)) = path?;
    check_topic(&topic)?;
    check_user(&user)?;
    let new = s.svc.subscribe(&topic, &user).await.map_err(|e| match e {
        crate::store::TopicFull::Unavailable(_) => ApiError::unavailable(e.to_string()),
        _ => ApiError::conflict(e.to_string()),
    })?;
    Ok(Json(
        json!({ "topic": topic, "userId": user, "subscribed": true, "new": new }),
    ))
}

async fn unsubscribe(
    State(s): State<ApiState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path((topic, user)) = path?;
    check_topic(&topic)?;
    check_user(&user)?;
    let removed = s.svc.unsubscribe(&topic, &user).await.map_err(store_down)?;
    if !removed {
        return Err(ApiError::not_found(format!(
            "`{user}` is not subscribed to `{topic}`"
        )));
    }
    Ok(Json(
        json!({ "topic": topic, "userId": user, "subscribed": false }),
    ))
}

async fn topic_push(
    State(s): State<ApiState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<MessageBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Path(topic) = path?;
    check_topic(&topic)?;
    let Json(b) = body?;
    let spec = b.spec(&s)?;
    let a = send(&s, &headers, Audience::Topic(topic), &b, spec).await?;
    Ok(answer::started(a))
}

/// A store that is down: 503, saying which.
pub fn store_down(e: StoreError) -> ApiError {
    ApiError::unavailable(e.to_string())
}

async fn trace(
    State(s): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = path?;
    let view = s
        .svc
        .trace(&id)
        .await
        .map_err(store_down)?
        .ok_or_else(|| ApiError::not_found(format!("no trace `{id}` (unknown or expired)")))?;
    Ok(Json(serde_json::to_value(view).unwrap_or_default()))
}

/// A user's devices on every node (cluster mode), and its inbox.
async fn user(
    State(s): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(user) = path?;
    check_user(&user)?;
    let view = s.svc.user(&user).await.map_err(store_down)?;
    Ok(Json(serde_json::to_value(view).unwrap_or_default()))
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct KickBody {
    client_type: Option<Value>,
}

async fn kick(
    State(s): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let Path(user) = path?;
    check_user(&user)?;
    // The body is optional: none kicks every device.
    let body: KickBody = if body.is_empty() {
        KickBody::default()
    } else {
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if !json {
            return Err(ApiError::unsupported_media_type(
                "the body, when there is one, is application/json",
            ));
        }
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid_body(format!("the body is not a kick: {e}")))?
    };
    let ct = parse_client_type(body.client_type.as_ref())?;
    let kicked = s
        .svc
        .kick(&user, ct)
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    if kicked == 0 {
        return Err(ApiError::not_found(format!(
            "`{user}` has no online device to kick"
        )));
    }
    Ok(Json(json!({ "userId": user, "kicked": kicked })))
}

/// Liveness: the process serves HTTP (200 while draining too).
async fn healthz(State(s): State<ApiState>) -> Json<Value> {
    let h = s.svc.health();
    Json(json!({
        "status": if h.draining { "draining" } else { "ok" },
        "connections": h.connections,
        "bound": h.bound,
    }))
}

/// Readiness: 503 while draining, or while the Redis this node needs is
/// unreachable, so load balancers send nobody here.
async fn readyz(State(s): State<ApiState>) -> Response {
    match s.svc.ready().await {
        Ok(()) => Json(json!({ "status": "ready" })).into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "unavailable", "reason": why.to_string() })),
        )
            .into_response(),
    }
}

async fn metrics(State(s): State<ApiState>) -> impl IntoResponse {
    s.svc.update_gauges();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
}

async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("openapi.json"),
    )
}
