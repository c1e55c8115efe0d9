//! The one way in for every push the API takes (push, batch, broadcast,
//! topic push, mpush's `/exec` and alloc's demo push): it checks what can
//! be checked before anything happens, claims the idempotency key, starts
//! the trace, watches the callbacks, sends, and says what happened (ADR
//! 0007). The API only turns requests into a [`SendRequest`] and a
//! [`Sent`] into its own format.

use mpush_protocol::session::ClientType;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use mpush_protocol::session::AckMode;
use serde::{Deserialize, Serialize};

use super::filter::Filter;
use super::{DeliveryService, MessageSpec, UserOutcome, UserStatus};
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
    client_type: Option<ClientType>,
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

impl DeliveryService {
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
                    .map_err(|e| SendError::Invalid(e.to_string()))?,
            )),
            _ => None,
        };
        if self.node.is_draining() {
            return Err(SendError::Draining);
        }
        // An explicit key names one request; a trace id names a retry only
        // of the same request (a caller may reuse one for several pushes).
        // Neither: no fingerprint (a 1,000-user batch's is serialized and
        // hashed whole) and no claim.
        let (key, fp) = match (&req.idempotency_key, &req.trace_id) {
            (Some(k), _) => (Some(format!("k:{k}")), fingerprint(&req)),
            (None, Some(t)) if !t.is_empty() => {
                let fp = fingerprint(&req);
                (Some(format!("t:{t}:{fp}")), fp)
            }
            _ => (None, String::new()),
        };
        // This request's claim on the key: only it can free the claim.
        let owner = if key.is_some() {
            crate::clock::random_hex(16)
        } else {
            String::new()
        };
        if let Some(key) = &key {
            match self.idempotency.claim(key, &fp, &owner).await {
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
                Err(e) => {
                    // The store may have taken the claim and lost the reply:
                    // freed when it answers again, or a retry would hear
                    // "in progress" for the claim's whole life.
                    self.settle_key_later(key.clone(), fp, owner, None);
                    return Err(SendError::Unavailable(e.to_string()));
                }
            }
        }
        let result = self.send_now(req, filter).await;
        if let Some(key) = key {
            let answer = match &result {
                Ok(sent) if sent.happened() => {
                    Some(serde_json::to_string(sent).unwrap_or_default())
                }
                _ => None,
            };
            if let Err(e) = self.settle_key(&key, &fp, &owner, answer.as_deref()).await {
                // The answer is true either way; until the store takes it,
                // a retry finds the claim (409 in_progress), not a free key.
                tracing::warn!(error = %e, "idempotency key not settled: trying again in the background");
                self.settle_key_later(key, fp, owner, answer);
            }
        }
        result.map(|sent| SendAnswer {
            sent,
            replayed: false,
        })
    }

    /// Keeps the answer under the key (or frees a key whose request did
    /// nothing).
    async fn settle_key(
        &self,
        key: &str,
        fp: &str,
        owner: &str,
        answer: Option<&str>,
    ) -> Result<(), crate::store::StoreError> {
        match answer {
            Some(a) => self.idempotency.finish(key, fp, a).await,
            None => self.idempotency.release(key, owner).await,
        }
    }

    /// A key the store did not take at once (Redis unreachable, or restarted
    /// empty) is settled again until it takes it, within the claim's life:
    /// left alone, the claim would expire and a retry would send the
    /// message a second time (or, for a request that did nothing, answer
    /// 409 until it expired).
    fn settle_key_later(
        self: &Arc<Self>,
        key: String,
        fp: String,
        owner: String,
        answer: Option<String>,
    ) {
        let hub = Arc::downgrade(self);
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let mut wait = Duration::from_millis(200);
            // Stops short of the claim's end: an answer is never written
            // over a claim another request made after this one's expired.
            while started.elapsed() + wait < crate::store::idempotency::PENDING * 5 / 6 {
                tokio::time::sleep(wait).await;
                let Some(hub) = hub.upgrade() else { return };
                if hub
                    .settle_key(&key, &fp, &owner, answer.as_deref())
                    .await
                    .is_ok()
                {
                    metrics::counter!("mpush_idempotency_settled_late_total").increment(1);
                    return;
                }
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            metrics::counter!("mpush_idempotency_unsettled_total").increment(1);
            tracing::warn!(
                "idempotency key never settled: a retry after its claim expires is sent again"
            );
        });
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
                    .await?;
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use bytes::Bytes;

    use super::*;
    use crate::config::Settings;
    use crate::logic::{Hub, Listeners, Stores};
    use crate::store::{
        IdempotencyStore, MemoryIdempotency, MemoryInbox, MemorySessions, MemoryTopics,
        MemoryTraces, StoreError,
    };

    /// The real in-memory store, refusing its first `fail` settlements (as
    /// Redis does while it is unreachable).
    struct Flaky {
        inner: MemoryIdempotency,
        fail: AtomicUsize,
        /// Claims taken whose reply is lost (an error, after the fact).
        lose_claims: AtomicUsize,
    }

    impl Flaky {
        fn refuse(&self) -> Result<(), StoreError> {
            let left = self.fail.load(Ordering::SeqCst);
            if left > 0 {
                self.fail.store(left - 1, Ordering::SeqCst);
                return Err(StoreError::new("idempotency", "unreachable (injected)"));
            }
            Ok(())
        }
    }

    #[async_trait]
    impl IdempotencyStore for Flaky {
        async fn claim(&self, key: &str, fp: &str, owner: &str) -> Result<Claim, StoreError> {
            let c = self.inner.claim(key, fp, owner).await;
            let lost = self.lose_claims.load(Ordering::SeqCst);
            if lost > 0 {
                self.lose_claims.store(lost - 1, Ordering::SeqCst);
                return Err(StoreError::new("idempotency", "reply lost (injected)"));
            }
            c
        }
        async fn finish(&self, key: &str, fp: &str, answer: &str) -> Result<(), StoreError> {
            self.refuse()?;
            self.inner.finish(key, fp, answer).await
        }
        async fn release(&self, key: &str, owner: &str) -> Result<(), StoreError> {
            self.refuse()?;
            self.inner.release(key, owner).await
        }
    }

    fn hub(fail: usize) -> Arc<Hub> {
        hub_losing(fail, 0)
    }

    fn hub_losing(fail: usize, lose_claims: usize) -> Arc<Hub> {
        let cfg = Arc::new(Settings::default().validate().expect("valid"));
        let stores = Stores {
            sessions: Arc::new(MemorySessions::new(100, 1 << 20)),
            traces: Arc::new(MemoryTraces::new(60, 100, 1 << 20)),
            inbox: Arc::new(MemoryInbox::new(100)),
            topics: Arc::new(MemoryTopics::new(10, 10)),
            idempotency: Arc::new(Flaky {
                inner: MemoryIdempotency::new(Duration::from_secs(60), 100, 1 << 20),
                fail: AtomicUsize::new(fail),
                lose_claims: AtomicUsize::new(lose_claims),
            }),
        };
        let any = "127.0.0.1:1".parse().expect("addr");
        Hub::new(
            cfg,
            stores,
            None,
            Listeners {
                tcp: any,
                ws: None,
                http: any,
            },
        )
    }

    fn request(ttl_secs: u64) -> SendRequest {
        SendRequest {
            audience: Audience::Users(vec!["u1".into()]),
            spec: MessageSpec {
                content: Bytes::from_static(b"hello"),
                ack_mode: AckMode::None,
                client_type: None,
                ttl_secs,
                ack_timeout: None,
                callback: None,
            },
            trace_id: None,
            idempotency_key: Some("key-1".into()),
            untraced: false,
        }
    }

    /// A push that happened while the store would not take its answer: a
    /// retry meanwhile hears "in progress", never a second send, and gets
    /// the first answer once the store takes it.
    #[tokio::test]
    async fn an_answer_the_store_did_not_take_is_kept_again_and_nothing_is_sent_twice() {
        let hub = hub(2);
        let first = hub.delivery().send(request(60)).await.expect("sent");
        assert!(!first.replayed);
        assert_eq!(hub.delivery().inbox.len("u1").await.expect("len"), 1);
        assert!(matches!(
            hub.delivery().send(request(60)).await,
            Err(SendError::InProgress)
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let again = loop {
            match hub.delivery().send(request(60)).await {
                Ok(a) => break a,
                Err(SendError::InProgress) => {
                    assert!(tokio::time::Instant::now() < deadline, "never settled");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{e:?}"),
            }
        };
        assert!(again.replayed);
        assert_eq!(again.sent, first.sent);
        assert_eq!(
            hub.delivery().inbox.len("u1").await.expect("len"),
            1,
            "kept once"
        );
    }

    /// A request that did nothing frees its key even when the store would
    /// not at first: a retry is sent, not held as "in progress" for a minute.
    #[tokio::test]
    async fn a_key_whose_request_did_nothing_is_freed_again() {
        let hub = hub(1);
        // Offline without a TTL: nothing happens (404).
        let first = hub.delivery().send(request(0)).await.expect("answered");
        assert!(!first.sent.happened());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match hub.delivery().send(request(0)).await {
                Ok(a) => {
                    assert!(!a.replayed, "a request that did nothing is not replayed");
                    break;
                }
                Err(SendError::InProgress) => {
                    assert!(tokio::time::Instant::now() < deadline, "never freed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{e:?}"),
            }
        }
    }

    /// A claim the store took but whose reply was lost: the request
    /// answers 503 (nothing sent) and frees its own claim when the store
    /// answers again, so the retry is sent once, not held for a minute.
    #[tokio::test]
    async fn a_claim_whose_reply_was_lost_is_freed_by_its_owner() {
        let hub = hub_losing(0, 1);
        assert!(matches!(
            hub.delivery().send(request(60)).await,
            Err(SendError::Unavailable(_))
        ));
        assert_eq!(
            hub.delivery().inbox.len("u1").await.expect("len"),
            0,
            "nothing sent"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let sent = loop {
            match hub.delivery().send(request(60)).await {
                Ok(a) => break a,
                Err(SendError::InProgress) => {
                    assert!(tokio::time::Instant::now() < deadline, "never freed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{e:?}"),
            }
        };
        assert!(!sent.replayed);
        assert_eq!(
            hub.delivery().inbox.len("u1").await.expect("len"),
            1,
            "sent once"
        );
        let again = hub.delivery().send(request(60)).await.expect("replayed");
        assert!(again.replayed);
        assert_eq!(hub.delivery().inbox.len("u1").await.expect("len"), 1);
    }
}
