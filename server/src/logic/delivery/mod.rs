//! The way of a push: resolve the user's routes (one round trip per batch),
//! keep an ACK-mode copy in the user's inbox, hand the push to each local
//! connection's queue and each remote node (one frame per node per batch),
//! and record what happened. Outcomes of pushes handed to a connection come
//! back from its machine (written, acknowledged, timed out, closed) to the
//! `settle` (one `Outcome`), which owns the trace and the inbox.
//!
//! A folder by responsibility: this file has the service, unicast and
//! forwarding; `kept.rs` the inbox copies handed to connected users,
//! `broadcast.rs` broadcasts and topic pushes, `outcome.rs` what became of
//! pushes on a connection.

use mpush_protocol::session::ClientType;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mpush_protocol::message::v2;
use mpush_protocol::server::OutboundPush;
use mpush_protocol::session::AckMode;

use super::Node;
use super::callback::CallbackTarget;
use super::filter::Filter;
use super::flow::RateLimiter;
use super::trace::{TraceBatch, Tracer};
use crate::clock::unix_ms;
use crate::cluster::{BroadcastMsg, Cluster};
use crate::route::{ConnCommand, ConnHandle, ConnInfo, Route, Router, SendError, Target};
use crate::store::{
    IdempotencyStore, InboxError, InboxStore, StoredMessage, TopicStore, TraceState,
};

mod broadcast;
mod kept;
mod outcome;

/// What to send, independent of who gets it.
#[derive(Debug, Clone)]
pub struct MessageSpec {
    pub content: Bytes,
    pub ack_mode: AckMode,
    pub client_type: Option<ClientType>,
    /// Keep for offline users this long; 0 = only online devices get it
    /// (with an ACK mode, un-ACKed copies are kept `delivery.session_ttl_secs`).
    pub ttl_secs: u64,
    /// How long each delivery attempt waits for the ACK (`timeoutMs`).
    pub ack_timeout: Option<Duration>,
    /// Where each recipient's terminal state is reported, if anywhere.
    pub callback: Option<CallbackTarget>,
}

/// What became of one user's copy, as the API reports it (ADR 0007).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserStatus {
    /// Handed to at least one of the user's connections (here, or to the
    /// node that holds it, which took it), or kept in the user's inbox.
    Sent,
    /// No connection, and nothing asked to keep it (no `ttlSeconds`, no
    /// ACK mode): nothing happened.
    Offline,
    /// The user's inbox is full (`delivery.inbox_max`): not kept.
    InboxFull,
    /// Neither handed on nor kept, because something it needed is down (the
    /// route table, the inbox store, the node that holds the connection).
    Unavailable,
}

/// What happened to one user's copy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserOutcome {
    pub user_id: String,
    pub status: UserStatus,
    /// Connections (here or on other nodes) the message was handed to.
    pub dispatched: usize,
    /// Kept in the offline inbox (until a device acknowledges it, with an
    /// ACK mode; until `ttlSeconds`, else).
    pub stored: bool,
    /// Devices it could not reach and that the inbox does not cover (no
    /// `ttlSeconds` and no ACK mode), counted in `error`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub missed: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl UserOutcome {
    /// Nothing has happened yet: offline until a connection or the inbox takes it.
    pub fn new(user: &str) -> Self {
        Self {
            user_id: user.to_owned(),
            status: UserStatus::Offline,
            dispatched: 0,
            stored: false,
            missed: 0,
            error: None,
        }
    }
}

/// One user's copy while it is being sent: what has happened so far.
struct Attempt {
    outcome: UserOutcome,
    /// A store or node it needed was down.
    unavailable: bool,
    inbox_full: bool,
    /// Copies that did not reach a device and wait for the inbox (if the
    /// message may be kept).
    unreached: usize,
    /// The route table named a device (or a connection is here).
    routed: bool,
}

impl Attempt {
    fn note(&mut self, error: String) {
        match &mut self.outcome.error {
            Some(e) => {
                e.push_str("; ");
                e.push_str(&error);
            }
            None => self.outcome.error = Some(error),
        }
    }

    fn finish(mut self) -> UserOutcome {
        let o = &mut self.outcome;
        o.status = if o.dispatched > 0 || o.stored {
            UserStatus::Sent
        } else if self.unavailable {
            UserStatus::Unavailable
        } else if self.inbox_full {
            UserStatus::InboxFull
        } else {
            UserStatus::Offline
        };
        if !o.stored {
            o.missed = self.unreached;
        }
        self.outcome
    }
}

static NO_DEVICE: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(""));

/// What became of pushes on one connection, for `DeliveryService::settle`.
#[derive(Debug)]
pub enum Outcome<'a> {
    /// Written to the socket; `kept`: inbox copies of them (TTL pushes
    /// without an ACK mode) that waited there until now.
    Written {
        traces: &'a [Arc<str>],
        kept: &'a [u64],
    },
    /// Not written: the machine refused it (closed, too many in flight).
    Refused { trace_id: &'a Arc<str>, why: String },
    /// Sent again after its ACK did not come.
    Retried {
        trace_id: &'a Arc<str>,
        attempt: u32,
    },
    /// Acknowledged by the device: the inbox copy goes.
    Acked(&'a OutboundPush),
    /// No ACK after every retry: the inbox copy stays for the next connection.
    TimedOut(&'a OutboundPush),
    /// The connection closed with these not acknowledged.
    Closed(Vec<OutboundPush>),
}

/// The inbox work an outcome leaves, for the connection to await.
pub type Settling<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

/// The delivery service: the route layer, the inbox, topics, idempotency,
/// the tracer and flow control, with the delivery settings. Every push the
/// API takes (`send.rs`) and every outcome a connection reports (`settle`)
/// runs here.
pub struct DeliveryService {
    pub(super) settings: crate::config::Delivery,
    pub(super) node: Arc<Node>,
    pub(super) router: Arc<Router>,
    pub(super) cluster: Option<Arc<Cluster>>,
    pub(super) inbox: Arc<dyn InboxStore>,
    pub(super) topics: Arc<dyn TopicStore>,
    pub(super) idempotency: Arc<dyn IdempotencyStore>,
    pub(super) tracer: Tracer,
    pub(super) push_limiter: RateLimiter,
    pub(super) broadcast_limiter: RateLimiter,
    pub(super) next_message: std::sync::atomic::AtomicU64,
}

impl DeliveryService {
    pub fn next_message_id(&self) -> u64 {
        self.next_message
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    pub fn inbox(&self) -> &Arc<dyn InboxStore> {
        &self.inbox
    }

    /// Topic subscriptions (the API's verbs).
    pub fn topics(&self) -> &Arc<dyn TopicStore> {
        &self.topics
    }

    /// Delivers one message to one user.
    pub async fn push_user(
        &self,
        trace_id: &Arc<str>,
        spec: &MessageSpec,
        user: &str,
    ) -> UserOutcome {
        let users = [Arc::<str>::from(user)];
        self.push_users(trace_id, spec, &users)
            .await
            .pop()
            .unwrap_or_else(|| UserOutcome::new(user))
    }

    /// Delivers one message to many users under one message id (a device
    /// deduplicates by it); the route table is read once for all of them,
    /// and each remote node gets one frame. A copy that cannot reach a
    /// device (a node that does not answer, a full connection queue) goes to
    /// the user's inbox when the message may be kept; routes are never
    /// removed on a guess, only when the node holding one says the
    /// connection is gone.
    pub async fn push_users(
        &self,
        trace_id: &Arc<str>,
        spec: &MessageSpec,
        users: &[Arc<str>],
    ) -> Vec<UserOutcome> {
        self.push_limiter.acquire(users.len()).await;
        // Backpressure: a flood goes at the pace its traces and callbacks
        // are taken, each wait bounded.
        self.tracer.room().await;
        if let Some(t) = &spec.callback {
            self.tracer.callbacks().room(t).await;
        }
        let routes = self.router.resolve_many(users, spec.client_type).await;
        let now = unix_ms();
        // An ACK-mode copy stays until a device acknowledges it; it follows
        // the user to any node (a default TTL when the caller gave none).
        let keep_secs = match (spec.ttl_secs, spec.ack_mode) {
            (0, AckMode::None) => 0,
            (0, _) => self.settings.session_ttl_secs,
            (t, _) => t,
        };
        let message_id = self.next_message_id();
        let push = Arc::new(OutboundPush {
            message_id,
            trace_id: trace_id.clone(),
            content: spec.content.clone(),
            ack_mode: spec.ack_mode,
            expires_at_ms: if keep_secs > 0 {
                u64::try_from(now).unwrap_or(0) + keep_secs * 1000
            } else {
                0
            },
            ack_timeout: spec.ack_timeout,
            queued_at: Some(mpush_protocol::Instant::now()),
        });
        let mut attempts = Vec::with_capacity(users.len());
        let mut remote: HashMap<String, Vec<(usize, Route)>> = HashMap::new();
        let mut trace = self.tracer.batch();
        for (i, (user, targets)) in users.iter().zip(routes).enumerate() {
            let mut a = Attempt {
                outcome: UserOutcome::new(user),
                unavailable: false,
                inbox_full: false,
                unreached: 0,
                routed: false,
            };
            let targets = match targets {
                Ok(t) => t,
                Err(e) => {
                    a.unavailable = true;
                    a.note(e.to_string());
                    Vec::new()
                }
            };
            // Kept first, whenever it may be kept: until a device acknowledges
            // it (ACK mode), or until one of the user's connections has
            // written it (a TTL without one): a node or connection that
            // fails after taking it does not lose it.
            if keep_secs > 0 {
                self.keep(user, &push, spec, &mut a).await;
            }
            a.routed = !targets.is_empty();
            if targets.is_empty() {
                self.trace_unrouted(trace_id, user, spec, &a, keep_secs);
            }
            for t in targets {
                match t {
                    Target::Local(h) => {
                        if self.hand_over(&h, user, &push, false, &mut trace) {
                            a.outcome.dispatched += 1;
                        } else {
                            a.unreached += 1;
                        }
                    }
                    Target::Remote(r) => remote.entry(r.node.clone()).or_default().push((i, r)),
                }
            }
            attempts.push(a);
        }
        drop(trace);
        for (node, routes) in remote {
            self.forward(&node, users, &push, routes, &mut attempts)
                .await;
        }
        // What did not reach a device goes to the inbox, when it may be kept.
        for (user, a) in users.iter().zip(attempts.iter_mut()) {
            if a.unreached > 0 && keep_secs > 0 && !a.outcome.stored {
                self.keep(user, &push, spec, a).await;
                if a.outcome.stored {
                    self.tracer.record(
                        trace_id,
                        user,
                        &NO_DEVICE,
                        spec.client_type.unwrap_or_default(),
                        TraceState::Offline,
                        Some(
                            format!(
                                "kept {keep_secs}s in the inbox: a device could not be reached"
                            )
                            .into(),
                        ),
                    );
                }
            }
        }
        self.announce_kept(users, message_id, &attempts).await;
        metrics::counter!("mpush_pushes_total").increment(users.len() as u64);
        attempts.into_iter().map(Attempt::finish).collect()
    }

    /// The trace of a user with no device to hand the message to.
    fn trace_unrouted(
        &self,
        trace_id: &Arc<str>,
        user: &Arc<str>,
        spec: &MessageSpec,
        a: &Attempt,
        keep_secs: u64,
    ) {
        let (state, detail) = match (&a.outcome.error, a.outcome.stored) {
            (_, true) => (
                TraceState::Offline,
                format!("kept {keep_secs}s for the user's next connection"),
            ),
            (Some(e), false) => (TraceState::Failed, e.clone()),
            (None, false) => (TraceState::Offline, "user offline".to_owned()),
        };
        self.tracer.record(
            trace_id,
            user,
            &NO_DEVICE,
            spec.client_type.unwrap_or_default(),
            state,
            Some(detail.into()),
        );
    }

    /// One frame to `node_id` for every recipient it holds (they share the
    /// message and its id). A node that does not answer leaves its routes
    /// alone: the copies count as unreached (the caller keeps them in the
    /// inbox when it may). A node that answers that a connection is gone
    /// has its route removed: that is the node's word, not a guess.
    async fn forward(
        &self,
        node_id: &str,
        users: &[Arc<str>],
        push: &Arc<OutboundPush>,
        routes: Vec<(usize, Route)>,
        attempts: &mut [Attempt],
    ) {
        let Some(cl) = &self.cluster else {
            return;
        };
        let node = match cl.node(node_id).await {
            Some(n) => n,
            None => {
                for (i, r) in &routes {
                    let a = &mut attempts[*i];
                    a.unreached += 1;
                    a.unavailable = true;
                    a.note(format!(
                        "node {node_id} is not registered (down, or cut off from Redis)"
                    ));
                    self.trace_remote(
                        &push.trace_id,
                        &users[*i],
                        r,
                        TraceState::Failed,
                        format!("node {node_id} is not registered"),
                    );
                }
                return;
            }
        };
        for (i, r) in &routes {
            // The hop is recorded first: the other node's record for the
            // device then takes over this placeholder, keeping the history.
            self.tracer.record(
                &push.trace_id,
                &users[*i],
                &NO_DEVICE,
                r.client_type,
                TraceState::Dispatched,
                Some(format!("forwarded from node {} to node {}", cl.node_id, node.id).into()),
            );
        }
        let batch = v2::NodePushBatch {
            recipients: routes
                .iter()
                .map(|(i, r)| v2::NodeRecipient {
                    user_id: users[*i].to_string(),
                    client_type: r.client_type.code(),
                })
                .collect(),
            message_id: push.message_id,
            trace_id: push.trace_id.to_string(),
            content: push.content.to_vec(),
            ack_mode: push.ack_mode.to_v2(),
            expires_at_ms: push.expires_at_ms,
            ack_timeout_ms: push.ack_timeout.map_or(0, |d| d.as_millis() as u32),
            from_node: cl.node_id.clone(),
            callback: self
                .tracer
                .callbacks()
                .target_of(&push.trace_id)
                .map(|t| t.to_wire())
                .unwrap_or_default(),
        };
        let result = cl.forward(&node, batch).await;
        for (n, (i, r)) in routes.iter().enumerate() {
            let user = &users[*i];
            let a = &mut attempts[*i];
            match &result {
                Ok(delivered) if delivered.get(n).copied().unwrap_or(0) > 0 => {
                    metrics::counter!("mpush_forwards_total").increment(1);
                    a.outcome.dispatched += 1;
                }
                Ok(_) => {
                    // The node says the connection is not there any more.
                    self.router.forget(user, r).await;
                    a.unreached += 1;
                    self.trace_remote(
                        &push.trace_id,
                        user,
                        r,
                        TraceState::Offline,
                        format!("not connected to node {node_id} any more: route removed"),
                    );
                }
                Err(e) => {
                    metrics::counter!("mpush_forward_errors_total").increment(1);
                    a.unreached += 1;
                    a.unavailable = true;
                    a.note(e.to_string());
                    self.trace_remote(&push.trace_id, user, r, TraceState::Failed, e.to_string());
                }
            }
        }
    }

    fn trace_remote(
        &self,
        trace_id: &Arc<str>,
        user: &Arc<str>,
        r: &Route,
        state: TraceState,
        detail: String,
    ) {
        self.tracer.record(
            trace_id,
            user,
            &NO_DEVICE,
            r.client_type,
            state,
            Some(detail.into()),
        );
    }

    /// A batch another node forwarded: to this node's connections.
    pub(super) fn deliver_forwarded(&self, b: v2::NodePushBatch) -> Vec<u32> {
        let callback = CallbackTarget::from_wire(&b.callback);
        let push = Arc::new(OutboundPush {
            message_id: b.message_id,
            trace_id: b.trace_id.into(),
            content: Bytes::from(b.content),
            ack_mode: AckMode::from_v2(b.ack_mode),
            expires_at_ms: b.expires_at_ms,
            ack_timeout: (b.ack_timeout_ms > 0)
                .then(|| Duration::from_millis(u64::from(b.ack_timeout_ms))),
            queued_at: Some(mpush_protocol::Instant::now()),
        });
        if let Some(target) = callback {
            let ack = push.ack_mode != AckMode::None;
            // Full: counted there; the origin still reports what it sees.
            let _ = self
                .tracer
                .callbacks()
                .watch(&push.trace_id, target, ack, false);
        }
        let mut trace = self.tracer.batch();
        b.recipients
            .iter()
            .map(|r| {
                let user: Arc<str> = r.user_id.as_str().into();
                let mut n = 0;
                for h in self.router.local().lookup(&user) {
                    // 0 (or a type this node does not know): any device.
                    let only = ClientType::from_code(r.client_type);
                    if only.is_none_or(|ct| ct == h.info.client_type)
                        && self.hand_over(&h, &user, &push, false, &mut trace)
                    {
                        n += 1;
                    }
                }
                n
            })
            .collect()
    }

    /// Hands a push to a connection's queue (DISPATCHED); a full queue is a
    /// slow consumer (FAILED), a closed one a user gone (OFFLINE).
    fn hand_over(
        &self,
        h: &ConnHandle,
        user: &Arc<str>,
        push: &Arc<OutboundPush>,
        broadcast: bool,
        trace: &mut TraceBatch<'_>,
    ) -> bool {
        // Before the connection can write it (and record DELIVERED); a
        // broadcast's copy is only counted, and its failure stamped after.
        let at_ms = (!broadcast).then(unix_ms);
        let (state, detail): (TraceState, Option<Cow<'static, str>>) = match h
            .tx
            .try_send(ConnCommand::Push(push.clone()))
        {
            Ok(()) => {
                if broadcast {
                    return true;
                }
                (TraceState::Dispatched, None)
            }
            Err(SendError::Full(_)) => {
                metrics::counter!("mpush_slow_consumer_total").increment(1);
                (
                    TraceState::Failed,
                    Some("slow consumer: the connection's outbound queue is full".into()),
                )
            }
            Err(SendError::Closed(_)) => (TraceState::Offline, Some("connection closed".into())),
        };
        let at_ms = at_ms.unwrap_or_else(unix_ms);
        trace.conn(&push.trace_id, user, &h.info, state, detail, at_ms);
        state == TraceState::Dispatched
    }
}
