//! What a push's answer says, in HTTP (ADR 0007): a 2xx only when the push
//! was handed on (to a connection, or to the node that holds it) or kept in
//! the inbox; otherwise a 4xx naming why nothing happened (`offline`,
//! `inbox_full`), or a 503 with `Retry-After` naming what is down. A batch
//! answers per user: 200 when every user's push happened, 207 when some did
//! not (see `results[].status`), 503 when none did because something is
//! down. A retried request (the same `Idempotency-Key`, or the same
//! `traceId` and message) gets the first answer again, with
//! `Idempotency-Replayed: true`, and nothing is sent twice.

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::ApiError;
use crate::logic::send::{SendAnswer, SendError, Sent};
use crate::logic::{UserOutcome, UserStatus};

/// The longest `Idempotency-Key`, and what it may hold.
pub const MAX_IDEMPOTENCY_KEY: usize = 255;

/// The request's `Idempotency-Key`, checked.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let k = v.to_str().unwrap_or_default();
    if k.is_empty() || k.len() > MAX_IDEMPOTENCY_KEY || !k.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::bad_request(format!(
            "Idempotency-Key is 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters"
        )));
    }
    Ok(Some(k.to_owned()))
}

/// Why nothing was sent, as an HTTP error.
pub fn send_error(e: SendError) -> ApiError {
    match e {
        SendError::Invalid(m) => ApiError::bad_request(m),
        SendError::Draining => ApiError::unavailable(e.to_string()).retry_after(5),
        SendError::Unavailable(m) => ApiError::unavailable(m),
        SendError::InProgress => {
            ApiError::new(StatusCode::CONFLICT, "in_progress", e.to_string()).retry_after(1)
        }
        SendError::KeyReused => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "key_reused",
            e.to_string(),
        ),
    }
}

fn replayed(mut r: Response, replayed: bool) -> Response {
    if replayed {
        r.headers_mut()
            .insert("idempotency-replayed", HeaderValue::from_static("true"));
    }
    r
}

/// `POST /api/v1/push`: one user.
/// A single-user push's answer, serialized as it is.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct SingleBody<'a> {
    trace_id: &'a str,
    status: UserStatus,
    dispatched: usize,
    stored: bool,
    missed: usize,
    error: Option<&'a str>,
}

pub fn single(a: SendAnswer) -> Response {
    let SendAnswer {
        sent,
        replayed: again,
    } = a;
    let Sent::Users { trace_id, results } = sent else {
        return ApiError::unavailable("an answer of another kind").into_response();
    };
    let Some(o) = results.into_iter().next() else {
        return ApiError::unavailable("no answer for the user").into_response();
    };
    let body = SingleBody {
        trace_id: &trace_id,
        status: o.status,
        dispatched: o.dispatched,
        stored: o.stored,
        missed: o.missed,
        error: o.error.as_deref(),
    };
    let r = match o.status {
        UserStatus::Sent => (StatusCode::OK, Json(body)).into_response(),
        _ => user_error(&o)
            .with(strip_error(serde_json::to_value(&body).unwrap_or_default()))
            .into_response(),
    };
    replayed(r, again)
}

/// Why a user's push did not happen, as an HTTP error.
pub fn user_error(o: &UserOutcome) -> ApiError {
    let why = |default: &str| o.error.clone().unwrap_or_else(|| default.to_owned());
    match o.status {
        UserStatus::Offline => ApiError::new(
            StatusCode::NOT_FOUND,
            "offline",
            "the user has no connection, and nothing asked to keep the push (ttlSeconds or an ackMode)",
        ),
        UserStatus::InboxFull => ApiError::new(
            StatusCode::CONFLICT,
            "inbox_full",
            why("the user's inbox is full"),
        ),
        UserStatus::Unavailable | UserStatus::Sent => {
            ApiError::unavailable(why("a store or node it needed is down"))
        }
    }
}

/// The outcome's fields beside `error` (which becomes the error object).
fn strip_error(mut body: Value) -> Value {
    if let Value::Object(m) = &mut body {
        m.remove("error");
    }
    body
}

/// A batch's answer, serialized as it is (a 1,000-user answer is not built
/// as a `Value` tree first).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BatchBody<'a> {
    trace_id: &'a str,
    dispatched: usize,
    failed: usize,
    results: &'a [UserOutcome],
}

/// `POST /api/v1/push/batch`: per user.
pub fn batch(a: SendAnswer) -> Response {
    let SendAnswer {
        sent,
        replayed: again,
    } = a;
    let Sent::Users { trace_id, results } = sent else {
        return ApiError::unavailable("an answer of another kind").into_response();
    };
    let failed = results
        .iter()
        .filter(|r| r.status != UserStatus::Sent)
        .count();
    let down = results.iter().any(|r| r.status == UserStatus::Unavailable);
    let body = BatchBody {
        trace_id: &trace_id,
        dispatched: results.iter().map(|r| r.dispatched).sum(),
        failed,
        results: &results,
    };
    let r = if failed == 0 {
        (StatusCode::OK, Json(body)).into_response()
    } else if failed == results.len() && down {
        ApiError::unavailable("no user's push happened: a store or node it needed is down")
            .with(serde_json::to_value(&body).unwrap_or_default())
            .into_response()
    } else {
        (StatusCode::MULTI_STATUS, Json(body)).into_response()
    };
    replayed(r, again)
}

/// A broadcast or a topic push: 202 once it is started everywhere it goes.
pub fn started(a: SendAnswer) -> Response {
    let SendAnswer {
        sent,
        replayed: again,
    } = a;
    let body = match &sent {
        Sent::Topic {
            trace_id,
            subscribers,
        } => json!({ "traceId": trace_id, "subscribers": subscribers }),
        other => json!({ "traceId": other.trace_id() }),
    };
    replayed((StatusCode::ACCEPTED, Json(body)).into_response(), again)
}
