//! The one way in for every push the API takes (push, batch, broadcast,
//! topic push, mpush's `/exec` and alloc's demo push): it checks what can
//! be checked before anything happens, claims the idempotency key, starts
//! the trace, watches the callbacks, sends, and says what happened (ADR
//! 0007). The API only turns requests into a [`SendRequest`] and a
//! [`Sent`] into its own format.

use std::collections::HashSet;
use std::sync::Arc;

use mpush_protocol::session::AckMode;
use serde::{Deserialize, Serialize};

use super::filter::Filter;
use super::{Hub, MessageSpec, UserOutcome, UserStatus};
use crate::store::Claim;

/// Who a push goes to.
#[derive(Debug, Clone)]
pub enum Audience {
    /// One user, or a batch (duplicates are sent once).
    Users(Vec<String>),
    Broadcast {
        tags: Vec<String>,
        condition: Option<String>,
    },
    Topic(String),
}

#[derive(Debug, Clone)]
pub struct SendRequest {
    pub audience: Audience,
    pub spec: MessageSpec,
    /// The caller's trace id, if it gave one (a retry with the same one and
    /// the same message gets the first answer).
    pub trace_id: Option<String>,
    /// `Idempotency-Key`: a retry with it gets the first answer; the same
    /// key for another request is refused.
    pub idempotency_key: Option<String>,
    /// No trace record (mpush's `/exec` with `trace=false`).
    pub untraced: bool,
}

/// What happened, as it is kept for a retry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Sent {
    Users {
        trace_id: String,
        results: Vec<UserOutcome>,
    },
    Broadcast {
        trace_id: String,
    },
    Topic {
        trace_id: String,
        subscribers: usize,
    },
}

impl Sent {
    pub fn trace_id(&self) -> &str {
        match self {
            Self::Users { trace_id, .. }
            | Self::Broadcast { trace_id }
            | Self::Topic { trace_id, .. } => trace_id,
        }
    }

    /// Whether anything happened that a retry must not do again.
    fn happened(&self) -> bool {
        match self {
            Self::Users { results, .. } => results.iter().any(|r| r.status == UserStatus::Sent),
            Self::Broadcast { .. } | Self::Topic { .. } => true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendAnswer {
    pub sent: Sent,
    /// The answer of an earlier request with the same key (nothing was sent now).
    pub replayed: bool,
}

/// Why nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The caller's mistake (a condition that does not compile, too many tags).
    #[error("{0}")]
    Invalid(String),
    #[error("the server is shutting down")]
    Draining,
    /// A store or the cluster it needs is down.
    #[error("{0}")]
    Unavailable(String),
    #[error("a request with this Idempotency-Key is under way; retry when it has been answered")]
    InProgress,
    #[error("this Idempotency-Key was used for another request")]
    KeyReused,
}

/// The fields that make two requests the same request.
#[derive(Serialize)]
struct Fingerprint<'a> {
    audience: AudienceFp<'a>,
    content: &'a [u8],
    ack: u8,
    client_type: Option<i32>,
    ttl: u64,
    timeout_ms: Option<u128>,
    callback: Option<String>,
}

#[derive(Serialize)]
enum AudienceFp<'a> {
    Users(&'a [String]),
    Broadcast(&'a [String], Option<&'a str>),
    Topic(&'a str),
}

fn fingerprint(r: &SendRequest) -> String {
    use sha2::Digest as _;
    let audience = match &r.audience {
        Audience::Users(u) => AudienceFp::Users(u),
        Audience::Broadcast { tags, condition } => {
            AudienceFp::Broadcast(tags, condition.as_deref())
        }
        Audience::Topic(t) => AudienceFp::Topic(t),
    };
    let fp = Fingerprint {
        audience,
        content: &r.spec.content,
        ack: match r.spec.ack_mode {
            AckMode::None => 0,
            AckMode::Auto => 1,
            AckMode::Biz => 2,
        },
        client_type: r.spec.client_type,
        ttl: r.spec.ttl_secs,
        timeout_ms: r.spec.ack_timeout.map(|d| d.as_millis()),
        callback: r.spec.callback.as_ref().map(|c| c.to_wire()),
    };
    let json = serde_json::to_vec(&fp).unwrap_or_default();
    hex::encode(sha2::Sha256::digest(&json))
}

impl Hub {
    /// Sends `req` (see the module). `Ok` says what happened to each
    /// recipient; `Err` means nothing was sent.
    pub async fn send(self: &Arc<Self>, mut req: SendRequest) -> Result<SendAnswer, SendError> {
        if let Audience::Users(users) = &mut req.audience {
            let mut seen = HashSet::with_capacity(users.len());
            users.retain(|u| seen.insert(u.clone()));
        }
        let filter = match &req.audience {
            Audience::Broadcast { tags, condition } => Some(Arc::new(
                Filter::new(tags.clone(), condition.as_deref(), req.spec.client_type)
                    .map_err(SendError::Invalid)?,
            )),
            _ => None,
        };
        if self.is_draining() {
            return Err(SendError::Draining);
        }
        let fp = fingerprint(&req);
        // An explicit key names one request; a trace id names a retry only
        // of the same request (a caller may reuse one for several pushes).
        let key = match (&req.idempotency_key, &req.trace_id) {
            (Some(k), _) => Some(format!("k:{k}")),
            (None, Some(t)) if !t.is_empty() => Some(format!("t:{t}:{fp}")),
            _ => None,
        };
        if let Some(key) = &key {
            match self.idempotency.claim(key, &fp).await {
                Ok(Claim::New) => {}
                Ok(Claim::Done(answer)) => {
                    let sent = serde_json::from_str(&answer).map_err(|e| {
                        SendError::Unavailable(format!("the kept answer does not read: {e}"))
                    })?;
                    metrics::counter!("mpush_idempotent_replays_total").increment(1);
                    return Ok(SendAnswer {
                        sent,
                        replayed: true,
                    });
                }
                Ok(Claim::InProgress) => return Err(SendError::InProgress),
                Ok(Claim::Mismatch) => return Err(SendError::KeyReused),
                Err(e) => return Err(SendError::Unavailable(e.to_string())),
            }
        }
        let result = self.send_now(req, filter).await;
        if let Some(key) = &key {
            let kept = match &result {
                Ok(sent) if sent.happened() => {
                    let answer = serde_json::to_string(sent).unwrap_or_default();
                    self.idempotency.finish(key, &fp, &answer).await
                }
                _ => self.idempotency.release(key).await,
            };
            if let Err(e) = kept {
                // Sent already: the answer is true; a retry may not be
                // recognised (the store is down), which the log says.
                tracing::warn!(error = %e, "idempotency key not kept");
            }
        }
        result.map(|sent| SendAnswer {
            sent,
            replayed: false,
        })
    }

    async fn send_now(
        self: &Arc<Self>,
        req: SendRequest,
        filter: Option<Arc<Filter>>,
    ) -> Result<Sent, SendError> {
        let trace_id = if req.untraced {
            req.trace_id
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| crate::clock::random_hex(16))
                .into()
        } else {
            self.start_trace(req.trace_id).await
        };
        let spec = req.spec;
        match req.audience {
            Audience::Users(users) => {
                self.watch_callbacks(&trace_id, &spec)?;
                let users: Vec<Arc<str>> = users.iter().map(|u| Arc::from(u.as_str())).collect();
                let results = self.push_users(&trace_id, &spec, &users).await;
                Ok(Sent::Users {
                    trace_id: trace_id.to_string(),
                    results,
                })
            }
            Audience::Broadcast { tags, condition } => {
                let filter = filter.ok_or_else(|| SendError::Invalid("no filter".into()))?;
                self.start_broadcast(trace_id.clone(), spec, tags, condition, filter)
                    .await
                    .map_err(SendError::Unavailable)?;
                Ok(Sent::Broadcast {
                    trace_id: trace_id.to_string(),
                })
            }
            Audience::Topic(topic) => {
                self.watch_callbacks(&trace_id, &spec)?;
                let subscribers = self
                    .start_topic_push(&topic, trace_id.clone(), spec)
                    .await
                    .map_err(|e| SendError::Unavailable(e.to_string()))?;
                Ok(Sent::Topic {
                    trace_id: trace_id.to_string(),
                    subscribers,
                })
            }
        }
    }

    /// Starts a trace. A trace store that is down does not stop delivery
    /// (local delivery never depends on Redis): the push goes out untraced,
    /// the outage is logged and counted, and `GET /api/v1/traces/{id}`
    /// answers 503 meanwhile.
    async fn start_trace(&self, trace_id: Option<String>) -> Arc<str> {
        let id: Arc<str> = trace_id
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| crate::clock::random_hex(16))
            .into();
        if let Err(e) = self.tracer.start(Some(id.to_string())).await {
            metrics::counter!("mpush_traces_untraced_total").increment(1);
            tracing::warn!(error = %e, trace = %id, "trace store down: pushed untraced");
        }
        id
    }

    /// Watches a unicast push's delivery callbacks on this node (before it
    /// is sent); a full watch list refuses the push.
    fn watch_callbacks(&self, trace_id: &Arc<str>, spec: &MessageSpec) -> Result<(), SendError> {
        if let Some(t) = &spec.callback {
            self.tracer
                .callbacks()
                .watch(trace_id, t.clone(), spec.ack_mode != AckMode::None, false)
                .map_err(|e| SendError::Unavailable(e.to_string()))?;
        }
        Ok(())
    }
}
