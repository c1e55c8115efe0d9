//! What mpush users call today: `/exec` (`method=push|topicPush|queryTrace`)
//! and the alloc routes (`GET /` server list, `POST /push` demo push).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Json;
use axum::body::Bytes as BodyBytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::IntoResponse;
use bytes::Bytes;
use mpush_protocol::session::AckMode;
use serde_json::{Value, json};

use super::{ApiError, ApiState, MessageBody, answer, check_topic, check_user, store_down};
use crate::logic::send::{Audience, SendRequest, Sent};
use crate::logic::{MessageSpec, UserStatus};
use crate::store::TraceState;

/// Parameters from the query string, a form body or a JSON object body.
fn params(
    query: HashMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<HashMap<String, String>, ApiError> {
    let mut p = query;
    if body.is_empty() {
        return Ok(p);
    }
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.starts_with("application/json") {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("body is not JSON: {e}")))?;
        let Value::Object(m) = v else {
            return Err(ApiError::bad_request("body must be a JSON object"));
        };
        for (k, v) in m {
            let s = match v {
                Value::String(s) => s,
                Value::Null => continue,
                other => other.to_string(),
            };
            p.insert(k, s);
        }
    } else {
        let form: Vec<(String, String)> = serde_urlencoded_pairs(body)?;
        p.extend(form);
    }
    Ok(p)
}

fn serde_urlencoded_pairs(body: &[u8]) -> Result<Vec<(String, String)>, ApiError> {
    serde_urlencoded::from_bytes(body)
        .map_err(|e| ApiError::bad_request(format!("body is not a form: {e}")))
}

fn flag(p: &HashMap<String, String>, k: &str) -> bool {
    p.get(k).is_some_and(|v| v == "true" || v == "1")
}

/// `POST|GET /exec?method=push|topicPush|queryTrace` (mpush manual 6.2, 6.5, 7.2).
pub async fn exec(
    State(s): State<ApiState>,
    http_method: Method,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: BodyBytes,
) -> Result<axum::response::Response, ApiError> {
    let p = params(query, &headers, &body)?;
    // Checked for every method, as the document declares it for `/exec`: a
    // malformed key is the caller's mistake even where nothing is sent.
    let idempotency_key = answer::idempotency_key(&headers)?;
    let method = p.get("method").map(String::as_str).unwrap_or("");
    // A GET with side effects is what an <img src> on any page can send:
    // only with a bearer token (which the auth layer already checked).
    if http_method == Method::GET
        && matches!(method, "push" | "topicPush")
        && s.settings.api_tokens.is_empty()
    {
        return Err(ApiError::method_not_allowed(format!(
            "method={method} changes state: use POST (GET needs a bearer token)"
        )));
    }
    let need = |k: &str| {
        p.get(k)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ApiError::bad_request(format!("`{k}` is required for method={method}")))
    };
    // mpush's parameters as the JSON API's body: one validation for both.
    let spec = |p: &HashMap<String, String>| -> Result<MessageSpec, ApiError> {
        let body = p
            .get("msgbody")
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ApiError::bad_request("`msgbody` is required"))?;
        let ttl_seconds = match p.get("ttl").filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => Some(
                t.parse::<u64>()
                    .map_err(|_| ApiError::bad_request("`ttl` is a number of seconds"))?,
            ),
        };
        MessageBody {
            content: Some(body.clone()),
            ack_mode: Some(if flag(p, "ack") { "auto" } else { "none" }.into()),
            trace_id: p.get("traceId").cloned(),
            ttl_seconds,
            callback: flag(p, "callback").then_some(true),
            callback_url: p.get("callbackUrl").filter(|u| !u.is_empty()).cloned(),
            ..MessageBody::default()
        }
        .spec(&s)
    };
    // The trace id a push is sent under: `trace=false` asks for no record
    // (the seed fork's switch; the push still gets an id).
    let untraced = p.get("trace").is_some_and(|v| v == "false" || v == "0");
    let request = |audience: Audience, spec: MessageSpec| SendRequest {
        audience,
        spec,
        trace_id: p.get("traceId").filter(|t| !t.is_empty()).cloned(),
        idempotency_key: idempotency_key.clone(),
        untraced,
    };
    match method {
        "push" => {
            let user = need("userId")?.clone();
            check_user(&user)?;
            let spec = spec(&p)?;
            let req = request(Audience::Users(vec![user]), spec);
            let a = s.svc.send(req).await.map_err(answer::send_error)?;
            let Sent::Users { trace_id, results } = a.sent else {
                return Err(ApiError::unavailable("an answer of another kind"));
            };
            let o = results.into_iter().next();
            let (status, dispatched, stored) =
                o.as_ref().map_or((UserStatus::Unavailable, 0, false), |o| {
                    (o.status, o.dispatched, o.stored)
                });
            let body = json!({
                "success": status == UserStatus::Sent,
                "traceId": trace_id,
                "status": status,
                "dispatched": dispatched,
                "stored": stored,
            });
            // The same rule as the JSON API, in mpush's shape.
            let code = match status {
                UserStatus::Sent => StatusCode::OK,
                UserStatus::Offline => StatusCode::NOT_FOUND,
                UserStatus::InboxFull => StatusCode::CONFLICT,
                UserStatus::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            };
            let mut r = (code, Json(body)).into_response();
            if code == StatusCode::SERVICE_UNAVAILABLE {
                r.headers_mut().insert(header::RETRY_AFTER, 1.into());
            }
            Ok(r)
        }
        "topicPush" => {
            let topic = need("topic")?.clone();
            check_topic(&topic)?;
            let spec = spec(&p)?;
            let a = s
                .svc
                .send(request(Audience::Topic(topic), spec))
                .await
                .map_err(answer::send_error)?;
            let Sent::Topic {
                trace_id,
                subscribers,
            } = a.sent
            else {
                return Err(ApiError::unavailable("an answer of another kind"));
            };
            Ok(
                Json(json!({ "success": true, "traceId": trace_id, "subscribers": subscribers }))
                    .into_response(),
            )
        }
        "queryTrace" => {
            let id = need("traceId")?;
            let view = s
                .svc
                .trace(id)
                .await
                .map_err(store_down)?
                .ok_or_else(|| ApiError::not_found(format!("no trace `{id}`")))?;
            // mpush's shape: one state per user (Redis hash `trace:{id}`), plus detail.
            let mut states = serde_json::Map::new();
            states.insert("_meta".into(), json!(TraceState::Accepted));
            for r in &view.recipients {
                states.insert(r.user_id.clone(), json!(r.state));
            }
            Ok(
                Json(json!({ "success": true, "traceId": id, "states": states, "trace": view }))
                    .into_response(),
            )
        }
        "" => Err(ApiError::bad_request(
            "`method` is required: push, topicPush or queryTrace",
        )),
        other => Err(ApiError::bad_request(format!(
            "unknown method `{other}`: push, topicPush or queryTrace"
        ))),
    }
}

/// alloc's `GET /`: `host:port,...` of the connect servers, least loaded
/// first. With `?transport=ws`: the WebSocket gateways' `ws://` URLs, for
/// browsers (any origin may ask: the list is public).
pub async fn alloc_servers(
    State(s): State<ApiState>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    let ws = match q.get("transport").map(String::as_str) {
        None | Some("tcp") => false,
        Some("ws") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown transport `{other}`: tcp or ws"
            )));
        }
    };
    let cors = [(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")];
    if let Some(nodes) = s.svc.live_nodes().await
        && !nodes.is_empty()
    {
        let list: Vec<String> = nodes
            .into_iter()
            .map(|n| if ws { n.ws } else { n.tcp })
            .filter(|a| !a.is_empty())
            .collect();
        return Ok((StatusCode::OK, cors, list.join(",")));
    }
    let net = &s.settings;
    let addr = if ws {
        ws_url(&s, &headers).unwrap_or_default()
    } else if net.public_address.is_empty() {
        let tcp = s.svc.listeners().tcp;
        if net.tls_tcp {
            format!("tls://{tcp}")
        } else {
            tcp.to_string()
        }
    } else {
        net.public_address.clone()
    };
    Ok((StatusCode::OK, cors, addr))
}

/// This node's WebSocket URL as a browser that reached us through `Host`
/// can use it: the configured public URL, else the gateway's port on the
/// bound address (or on the asked host when bound to all interfaces).
fn ws_url(s: &ApiState, headers: &HeaderMap) -> Option<String> {
    let net = &s.settings;
    if !net.public_ws_url.is_empty() {
        return Some(net.public_ws_url.clone());
    }
    let bound = s.svc.listeners().ws?;
    let scheme = if net.tls_ws { "wss" } else { "ws" };
    if !bound.ip().is_unspecified() {
        return Some(format!("{scheme}://{bound}/"));
    }
    let asked = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<axum::http::uri::Authority>().ok())
        .map(|a| a.host().to_owned())
        .unwrap_or_else(|| "127.0.0.1".to_owned());
    Some(format!("{scheme}://{asked}:{}/", bound.port()))
}

static ALLOC_MSG: AtomicU64 = AtomicU64::new(1);

/// alloc's demo `POST /push {userId, hello, broadcast, condition}`: always 200
/// with its fixed reply; the message is built as alloc builds it.
pub async fn alloc_push(
    State(s): State<ApiState>,
    headers: HeaderMap,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let Json(v) = body?;
    let str_field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let user = str_field("userId");
    let hello = str_field("hello");
    if hello.len() > 1024 {
        return Err(ApiError::bad_request("`hello` is at most 1024 bytes"));
    }
    let broadcast = v.get("broadcast").and_then(Value::as_bool).unwrap_or(false);
    let notification = json!({
        "content": format!("MPush开源推送，{hello}"),
        "nid": 1,
        "ticker": "你有一条新的消息,请注意查收",
        "title": "MPUSH推送",
    });
    let msg = json!({
        "content": notification.to_string(),
        "msgId": format!("msg_{}", ALLOC_MSG.fetch_add(1, Ordering::Relaxed)),
        "msgType": 3,
    });
    let spec = MessageSpec {
        content: Bytes::from(msg.to_string()),
        ack_mode: AckMode::None,
        client_type: None,
        ttl_secs: 0,
        ack_timeout: None,
        callback: None,
    };
    let audience = if broadcast {
        let condition = v
            .get("condition")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Audience::Broadcast {
            tags: Vec::new(),
            condition,
        }
    } else {
        check_user(&user)?;
        Audience::Users(vec![user])
    };
    let req = SendRequest {
        audience,
        spec,
        trace_id: None,
        idempotency_key: answer::idempotency_key(&headers)?,
        untraced: false,
    };
    let a = s.svc.send(req).await.map_err(answer::send_error)?;
    // alloc's reply, when the push happened; the JSON API's errors else.
    if let Sent::Users { results, .. } = &a.sent
        && let Some(o) = results.first()
        && o.status != UserStatus::Sent
    {
        return Err(answer::user_error(o));
    }
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "服务已经开始推送,请注意查收消息",
    ))
}
