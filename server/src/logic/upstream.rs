//! Client → backend: up-pushes (rate-limited per connection and per user,
//! then handed to the sinks; the client's ACK waits for their acceptance)
//! and connection lifecycle events (bound, unbound, kicked, disconnected),
//! off unless a sink takes them.

use mpush_protocol::session::ClientType;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use governor::{DefaultKeyedRateLimiter, Quota};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::clock::unix_ms;
use crate::config::Limits;
use crate::route::{ConnInfo, Transport};
use crate::sink::{Refusal, SinkEvent, Sinks};

/// Why an up-push was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpRefusal {
    #[error("bind a user first")]
    NotBound,
    #[error("no sink takes up-pushes on this server")]
    NoSink,
    /// Over the connection's or the user's rate.
    #[error("up-push rate exceeded ({0}); retry later")]
    RateLimited(&'static str),
    /// A sink is full or did not accept in time.
    #[error("{0}; retry later")]
    Busy(String),
}

impl UpRefusal {
    /// The client may send the same message again later.
    pub fn retryable(&self) -> bool {
        matches!(self, Self::RateLimited(_) | Self::Busy(_))
    }
}

/// A connection's record of up-pushes refused for its rate in a row; the
/// gateway holds one per connection and hands it to every `up_push`.
#[derive(Debug, Default)]
pub struct UpPushStrikes(u32);

/// What became of an up-push: the answer for the client, and whether the
/// connection is to be closed (this many rate refusals in a row, the
/// `limits.up_push_abuse_refusals` setting, is abuse, not a burst).
#[derive(Debug)]
pub struct UpPushOutcome {
    pub result: Result<(), UpRefusal>,
    pub close: bool,
}

/// The per-connection and per-user up-push limiters (governor's keyed
/// GCRA: state only for keys that sent recently; swept every 30 s).
/// The upstream service: up-pushes and lifecycle events to the sinks.
pub struct Upstream {
    sinks: Arc<Sinks>,
    limits: UpLimits,
    /// This node's id, in every event.
    node_id: Arc<str>,
    /// `limits.up_push_abuse_refusals`.
    abuse_refusals: u32,
    /// mpush's HTTP proxy, when it is on.
    proxy: Option<Arc<crate::proxy::HttpProxy>>,
}

impl Upstream {
    pub fn new(
        sinks: Arc<Sinks>,
        l: &Limits,
        node_id: &str,
        proxy: Option<Arc<crate::proxy::HttpProxy>>,
    ) -> Self {
        Self {
            sinks,
            limits: UpLimits::new(l),
            node_id: node_id.into(),
            abuse_refusals: l.up_push_abuse_refusals,
            proxy,
        }
    }

    /// mpush's HTTP proxy, when it is on.
    pub fn proxy(&self) -> Option<&Arc<crate::proxy::HttpProxy>> {
        self.proxy.as_ref()
    }

    pub fn sinks(&self) -> &Arc<Sinks> {
        &self.sinks
    }

    /// Forgets idle senders' rate state (every `SWEEP_EVERY`).
    pub(super) fn sweep(&self) {
        self.limits.sweep();
    }
}

struct UpLimits {
    per_conn: DefaultKeyedRateLimiter<u64>,
    per_user: DefaultKeyedRateLimiter<Arc<str>>,
}

fn quota(rate: u32, burst: u32) -> Quota {
    let one = NonZeroU32::MIN;
    Quota::per_second(NonZeroU32::new(rate).unwrap_or(one))
        .allow_burst(NonZeroU32::new(burst).unwrap_or(one))
}

impl UpLimits {
    fn new(l: &Limits) -> Self {
        Self {
            per_conn: DefaultKeyedRateLimiter::keyed(quota(
                l.up_push_rate_per_conn,
                l.up_push_burst_per_conn,
            )),
            per_user: DefaultKeyedRateLimiter::keyed(quota(
                l.up_push_rate_per_user,
                l.up_push_burst_per_user,
            )),
        }
    }

    /// Forgets keys whose buckets are full again (idle senders).
    fn sweep(&self) {
        self.per_conn.retain_recent();
        self.per_conn.shrink_to_fit();
        self.per_user.retain_recent();
        self.per_user.shrink_to_fit();
    }
}

pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(30);

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct UpPushEvent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: &'a str,
    user_id: &'a str,
    device_id: &'a str,
    client_type: ClientType,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_base64: Option<String>,
    received_at: i64,
    node: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LifecycleEvent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: String,
    user_id: &'a str,
    device_id: &'a str,
    client_type: ClientType,
    transport: Transport,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    at: i64,
    node: &'a str,
}

/// A connection lifecycle event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Bound,
    Unbound,
    Kicked,
    Disconnected,
}

impl Lifecycle {
    fn name(self) -> &'static str {
        match self {
            Self::Bound => "bound",
            Self::Unbound => "unbound",
            Self::Kicked => "kicked",
            Self::Disconnected => "disconnected",
        }
    }
}

/// The id of an up-push: with the client's message id (v2), the same for
/// every resend of one message from one device (so the backend can
/// deduplicate), and no device can make one that collides with another's;
/// without (legacy clients), a random one.
pub fn up_push_id(device_id: &str, message_id: Option<u64>) -> String {
    match message_id {
        Some(m) => {
            let mut h = Sha256::new();
            h.update(device_id.as_bytes());
            h.update([0]);
            h.update(m.to_be_bytes());
            hex::encode(&h.finalize()[..16])
        }
        None => crate::clock::random_hex(16),
    }
}

impl Upstream {
    /// A client's up-push: accepted once every sink that takes up-pushes
    /// accepted it; `strikes` is the connection's count of rate refusals
    /// in a row, and the outcome says when they reach the abuse limit.
    pub async fn up_push(
        &self,
        user: Option<&Arc<str>>,
        info: &ConnInfo,
        content: &[u8],
        message_id: Option<u64>,
        strikes: &mut UpPushStrikes,
    ) -> UpPushOutcome {
        let result = self.hand_up_push(user, info, content, message_id).await;
        match &result {
            Err(UpRefusal::RateLimited(_)) => strikes.0 += 1,
            _ => strikes.0 = 0,
        }
        let close = strikes.0 >= self.abuse_refusals;
        if close {
            metrics::counter!("mpush_up_push_abuse_closed_total").increment(1);
        }
        UpPushOutcome { result, close }
    }

    async fn hand_up_push(
        &self,
        user: Option<&Arc<str>>,
        info: &ConnInfo,
        content: &[u8],
        message_id: Option<u64>,
    ) -> Result<(), UpRefusal> {
        let Some(user) = user else {
            return Err(UpRefusal::NotBound);
        };
        if !self.sinks.wants(SinkEvent::UpPush) {
            return Err(UpRefusal::NoSink);
        }
        if self.limits.per_conn.check_key(&info.id).is_err() {
            metrics::counter!("mpush_up_pushes_refused_total", "reason" => "conn_rate")
                .increment(1);
            return Err(UpRefusal::RateLimited("per connection"));
        }
        if self.limits.per_user.check_key(user).is_err() {
            metrics::counter!("mpush_up_pushes_refused_total", "reason" => "user_rate")
                .increment(1);
            return Err(UpRefusal::RateLimited("per user"));
        }
        let id = up_push_id(&info.device_id, message_id);
        let text = std::str::from_utf8(content).ok();
        let event = UpPushEvent {
            kind: "up_push",
            id: &id,
            user_id: user,
            device_id: &info.device_id,
            client_type: info.client_type,
            content: text,
            content_base64: text
                .is_none()
                .then(|| base64::engine::general_purpose::STANDARD.encode(content)),
            received_at: unix_ms(),
            node: &self.node_id,
        };
        let json = Bytes::from(serde_json::to_vec(&event).expect("serializable"));
        match self.sinks.submit(SinkEvent::UpPush, json).await {
            Ok(()) => {
                metrics::counter!("mpush_up_pushes_accepted_total").increment(1);
                Ok(())
            }
            Err(Refusal::NoSink(_)) => Err(UpRefusal::NoSink),
            Err(Refusal::Busy(why)) => {
                metrics::counter!("mpush_up_pushes_refused_total", "reason" => "sink").increment(1);
                Err(UpRefusal::Busy(why))
            }
        }
    }

    /// Some sink takes lifecycle events (callers skip building them otherwise).
    pub fn wants_lifecycle(&self) -> bool {
        self.sinks.wants(SinkEvent::Lifecycle)
    }

    /// A connection lifecycle event, for the sinks that take them.
    pub fn lifecycle(&self, kind: Lifecycle, user: &str, info: &ConnInfo, reason: Option<&str>) {
        if !self.sinks.wants(SinkEvent::Lifecycle) {
            return;
        }
        let event = LifecycleEvent {
            kind: kind.name(),
            id: crate::clock::random_hex(16),
            user_id: user,
            device_id: &info.device_id,
            client_type: info.client_type,
            transport: info.transport,
            reason,
            at: unix_ms(),
            node: &self.node_id,
        };
        let json = Bytes::from(serde_json::to_vec(&event).expect("serializable"));
        self.sinks.notify(SinkEvent::Lifecycle, json);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_up_push_id_is_stable_per_device_and_message() {
        let a = up_push_id("dev-1", Some(7));
        assert_eq!(a, up_push_id("dev-1", Some(7)));
        assert_eq!(a.len(), 32);
        assert_ne!(a, up_push_id("dev-2", Some(7)));
        assert_ne!(a, up_push_id("dev-1", Some(8)));
        assert_ne!(up_push_id("dev-1", None), up_push_id("dev-1", None));
    }
}
