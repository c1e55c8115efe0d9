//! The way of a push: resolve the user's routes (one round trip per batch),
//! keep an ACK-mode copy in the user's inbox, hand the push to each local
//! connection's queue and each remote node (one frame per node per batch),
//! and record what happened. Outcomes of pushes handed to a connection come
//! back from its machine (written, acknowledged, timed out, closed) to the
//! `settle_*` functions here, which own the trace and the inbox.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mpush_protocol::message::v2;
use mpush_protocol::server::OutboundPush;
use mpush_protocol::session::AckMode;

use super::Hub;
use super::callback::CallbackTarget;
use super::filter::Filter;
use crate::clock::unix_ms;
use crate::cluster::{BroadcastMsg, ForwardError};
use crate::route::{ConnCommand, ConnHandle, ConnInfo, Route, SendError, Target};
use crate::store::{InboxError, StoredMessage, TraceState};

/// What to send, independent of who gets it.
#[derive(Debug, Clone)]
pub struct MessageSpec {
    pub content: Bytes,
    pub ack_mode: AckMode,
    pub client_type: Option<i32>,
    /// Keep for offline users this long; 0 = only online devices get it
    /// (with an ACK mode, un-ACKed copies are kept `delivery.session_ttl_secs`).
    pub ttl_secs: u64,
    /// How long each delivery attempt waits for the ACK (`timeoutMs`).
    pub ack_timeout: Option<Duration>,
    /// Where each recipient's terminal state is reported, if anywhere.
    pub callback: Option<CallbackTarget>,
}

/// What happened to one user's copy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserOutcome {
    pub user_id: String,
    /// Connections (here or on other nodes) the message was handed to.
    pub dispatched: usize,
    /// Kept in the offline inbox.
    pub stored: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

static NO_DEVICE: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(""));

impl Hub {
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
            .unwrap_or_else(|| UserOutcome {
                user_id: user.to_owned(),
                dispatched: 0,
                stored: false,
                error: Some("not delivered".into()),
            })
    }

    /// Delivers one message to many users under one message id (a device
    /// deduplicates by it, so a user listed twice gets it once); the route
    /// table is read once for all of them, and each remote node gets one frame.
    pub async fn push_users(
        &self,
        trace_id: &Arc<str>,
        spec: &MessageSpec,
        users: &[Arc<str>],
    ) -> Vec<UserOutcome> {
        self.push_limiter.acquire(users.len()).await;
        let routes = self.router.resolve_many(users, spec.client_type).await;
        let now = unix_ms();
        // An ACK-mode copy stays until a device acknowledges it; it follows
        // the user to any node (a default TTL when the caller gave none).
        let keep_secs = match (spec.ttl_secs, spec.ack_mode) {
            (0, AckMode::None) => 0,
            (0, _) => self.cfg.settings.delivery.session_ttl_secs,
            (t, _) => t,
        };
        let message_id = self.next_message_id();
        let queued_at = mpush_protocol::Instant::now();
        let mut outcomes = Vec::with_capacity(users.len());
        let mut remote: HashMap<String, Vec<(usize, Route, Arc<OutboundPush>)>> = HashMap::new();
        for (i, (user, targets)) in users.iter().zip(routes).enumerate() {
            let mut o = UserOutcome {
                user_id: user.to_string(),
                dispatched: 0,
                stored: false,
                error: None,
            };
            let targets = match targets {
                Ok(t) => t,
                Err(e) => {
                    o.error = Some(e.to_string());
                    Vec::new()
                }
            };
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
                queued_at: Some(queued_at),
            });
            if keep_secs > 0 && (spec.ack_mode != AckMode::None || targets.is_empty()) {
                let stored = StoredMessage {
                    message_id: push.message_id,
                    trace_id: trace_id.clone(),
                    content: spec.content.clone(),
                    ack_mode: spec.ack_mode,
                    client_type: spec.client_type,
                    expires_at_ms: i64::try_from(push.expires_at_ms).unwrap_or(0),
                };
                match self.inbox.push(user, stored).await {
                    Ok(()) => o.stored = true,
                    Err(e) => {
                        if matches!(e, InboxError::Full(_)) {
                            metrics::counter!("mpush_inbox_full_total").increment(1);
                        }
                        o.error = Some(e.to_string());
                    }
                }
            }
            if targets.is_empty() {
                let (state, detail) = match (&o.error, o.stored) {
                    (Some(e), _) => (TraceState::Failed, e.clone()),
                    (None, true) => (
                        TraceState::Offline,
                        format!("kept {keep_secs}s for the user's next connection"),
                    ),
                    (None, false) => (TraceState::Offline, "user offline".to_owned()),
                };
                self.tracer.record(
                    trace_id,
                    user,
                    &NO_DEVICE,
                    spec.client_type.unwrap_or(-1),
                    state,
                    Some(detail.into()),
                );
            }
            for t in targets {
                match t {
                    Target::Local(h) => {
                        if self.send(&h, user, &push, false) {
                            o.dispatched += 1;
                        }
                    }
                    Target::Remote(r) => {
                        remote
                            .entry(r.node.clone())
                            .or_default()
                            .push((i, r, push.clone()))
                    }
                }
            }
            outcomes.push(o);
        }
        for (node, pushes) in remote {
            self.forward(&node, users, pushes, &mut outcomes).await;
        }
        metrics::counter!("mpush_pushes_total").increment(users.len() as u64);
        outcomes
    }

    /// One frame to `node` for every recipient it holds (they share the
    /// message and its id).
    async fn forward(
        &self,
        node_id: &str,
        users: &[Arc<str>],
        pushes: Vec<(usize, Route, Arc<OutboundPush>)>,
        outcomes: &mut [UserOutcome],
    ) {
        let Some(cl) = &self.cluster else {
            return;
        };
        let Some(node) = cl.node(node_id).await else {
            for (i, r, p) in &pushes {
                self.router.forget(&users[*i], r).await;
                self.trace_remote(
                    &p.trace_id,
                    &users[*i],
                    r,
                    TraceState::Offline,
                    format!("route to node {node_id} which is gone: removed"),
                );
            }
            return;
        };
        for (i, r, p) in &pushes {
            // The hop is recorded first: the other node's record for the
            // device then takes over this placeholder, keeping the history.
            self.tracer.record(
                &p.trace_id,
                &users[*i],
                &NO_DEVICE,
                r.client_type,
                TraceState::Dispatched,
                Some(format!("forwarded from node {} to node {}", cl.node_id, node.id).into()),
            );
        }
        // One frame per message id (recipients of one user share it).
        let callbacks = self.tracer.callbacks();
        let mut frames: Vec<(v2::NodePushBatch, Vec<usize>)> = Vec::new();
        for (k, (i, r, p)) in pushes.iter().enumerate() {
            let recipient = v2::NodeRecipient {
                user_id: users[*i].to_string(),
                client_type: r.client_type,
            };
            match frames
                .iter_mut()
                .find(|(b, _)| b.message_id == p.message_id)
            {
                Some((b, idx)) => {
                    b.recipients.push(recipient);
                    idx.push(k);
                }
                None => frames.push((
                    v2::NodePushBatch {
                        recipients: vec![recipient],
                        message_id: p.message_id,
                        trace_id: p.trace_id.to_string(),
                        content: p.content.to_vec(),
                        ack_mode: p.ack_mode.to_v2(),
                        expires_at_ms: p.expires_at_ms,
                        ack_timeout_ms: p.ack_timeout.map_or(0, |d| d.as_millis() as u32),
                        from_node: cl.node_id.clone(),
                        callback: callbacks
                            .target_of(&p.trace_id)
                            .map(|t| t.to_wire())
                            .unwrap_or_default(),
                    },
                    vec![k],
                )),
            }
        }
        let sent = futures_util::future::join_all(
            frames
                .into_iter()
                .map(|(b, idx)| async { (cl.forward(&node, b).await, idx) }),
        )
        .await;
        for (result, idx) in sent {
            for (n, k) in idx.into_iter().enumerate() {
                let (i, r, p) = &pushes[k];
                let user = &users[*i];
                match &result {
                    Ok(delivered) if delivered.get(n).copied().unwrap_or(0) > 0 => {
                        metrics::counter!("mpush_forwards_total").increment(1);
                        outcomes[*i].dispatched += 1;
                    }
                    Ok(_) => {
                        self.router.forget(user, r).await;
                        self.trace_remote(
                            &p.trace_id,
                            user,
                            r,
                            TraceState::Offline,
                            format!("not connected to node {node_id} any more: route removed"),
                        );
                    }
                    Err(e) => {
                        metrics::counter!("mpush_forward_errors_total").increment(1);
                        if matches!(e, ForwardError::Unreachable(..)) {
                            // A node that refuses connections is gone; its routes are stale.
                            self.router.forget(user, r).await;
                        }
                        self.trace_remote(&p.trace_id, user, r, TraceState::Failed, e.to_string());
                    }
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
        b.recipients
            .iter()
            .map(|r| {
                let user: Arc<str> = r.user_id.as_str().into();
                let mut n = 0;
                for h in self.router.local().lookup(&user) {
                    if (r.client_type == 0 || r.client_type == h.info.client_type)
                        && self.send(&h, &user, &push, false)
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
    fn send(
        &self,
        h: &ConnHandle,
        user: &Arc<str>,
        push: &Arc<OutboundPush>,
        broadcast: bool,
    ) -> bool {
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
        self.tracer
            .conn(&push.trace_id, user, &h.info, state, detail);
        state == TraceState::Dispatched
    }

    /// Starts a broadcast: on every node through Redis in cluster mode, else here.
    pub async fn start_broadcast(
        self: &Arc<Self>,
        trace_id: Arc<str>,
        spec: MessageSpec,
        tags: Vec<String>,
        condition: Option<String>,
    ) -> Result<(), String> {
        let filter = Filter::new(tags.clone(), condition.as_deref(), spec.client_type)?;
        let message_id = self.next_message_id();
        if let Some(cl) = &self.cluster {
            let msg = BroadcastMsg {
                trace_id: trace_id.to_string(),
                content: spec.content.to_vec(),
                ack_mode: spec.ack_mode.to_v2(),
                client_type: spec.client_type,
                tags,
                condition,
                message_id,
                callback: spec.callback.as_ref().map(CallbackTarget::to_wire),
            };
            return cl
                .publish_broadcast(&msg)
                .await
                .map_err(|e| format!("cluster unavailable: {e}"));
        }
        if let Some(target) = spec.callback.clone() {
            self.tracer
                .callbacks()
                .watch(&trace_id, target, spec.ack_mode != AckMode::None, true)
                .map_err(|e| e.to_string())?;
        }
        let hub = self.clone();
        tokio::spawn(async move {
            hub.broadcast_here(trace_id, message_id, &spec, Arc::new(filter))
                .await;
        });
        Ok(())
    }

    /// Sends to every connection here that passes `filter`, at the broadcast
    /// rate, up to `broadcast_max`. Its trace is counts per node.
    pub(super) async fn broadcast_here(
        &self,
        trace_id: Arc<str>,
        message_id: u64,
        spec: &MessageSpec,
        filter: Arc<Filter>,
    ) -> usize {
        let max = self.cfg.settings.delivery.broadcast_max;
        let targets = if filter.condition.is_some() {
            // A condition is evaluated once per connection, each within its
            // budget: on the blocking pool, not on the async workers that
            // serve connections.
            let (router, f) = (self.router.local_arc(), filter.clone());
            match tokio::task::spawn_blocking(move || {
                let (mut n, mut stats) = (0, super::filter::FilterStats::default());
                let targets = router.select(|u, h| {
                    let keep = n < max && f.matches(u, h, &mut stats);
                    n += usize::from(keep);
                    keep
                });
                (targets, stats)
            })
            .await
            {
                Ok((t, stats)) => {
                    stats.publish(&trace_id);
                    t
                }
                Err(e) => {
                    tracing::warn!(error = %e, "broadcast filter failed");
                    return 0;
                }
            }
        } else {
            let (mut n, mut stats) = (0, super::filter::FilterStats::default());
            self.router.local().select(|u, h| {
                let keep = n < max && filter.matches(u, h, &mut stats);
                n += usize::from(keep);
                keep
            })
        };
        self.tracer.broadcast(&trace_id, targets.len() as u64);
        let push = Arc::new(OutboundPush {
            message_id,
            trace_id: trace_id.clone(),
            content: spec.content.clone(),
            ack_mode: spec.ack_mode,
            expires_at_ms: 0,
            ack_timeout: None,
            queued_at: Some(mpush_protocol::Instant::now()),
        });
        // Flow control in slices large enough that waiting costs nothing per message.
        for chunk in targets.chunks(1024) {
            self.broadcast_limiter.acquire(chunk.len()).await;
            for (user, h) in chunk {
                self.send(h, user, &push, true);
            }
        }
        metrics::counter!("mpush_broadcast_deliveries_total").increment(targets.len() as u64);
        targets.len()
    }

    /// Pushes to every subscriber of `topic` in the background; the count.
    pub async fn start_topic_push(
        self: &Arc<Self>,
        topic: &str,
        trace_id: Arc<str>,
        spec: MessageSpec,
    ) -> Result<usize, crate::store::StoreError> {
        let users: Vec<Arc<str>> = self
            .topics
            .subscribers(topic)
            .await?
            .into_iter()
            .map(Arc::from)
            .collect();
        let n = users.len();
        let hub = self.clone();
        tokio::spawn(async move {
            for chunk in users.chunks(1000) {
                hub.push_users(&trace_id, &spec, chunk).await;
            }
        });
        Ok(n)
    }

    // ----- outcomes, from the connection that holds the push ----------

    /// Pushes written to the socket.
    pub fn settle_written(&self, user: &Arc<str>, info: &ConnInfo, traces: &[Arc<str>]) {
        for t in traces {
            self.tracer.conn(t, user, info, TraceState::Delivered, None);
        }
    }

    /// A push's delivery to this connection failed before it was written.
    pub fn settle_refused(
        &self,
        user: &Arc<str>,
        info: &ConnInfo,
        trace_id: &Arc<str>,
        why: String,
    ) {
        self.tracer
            .conn(trace_id, user, info, TraceState::Failed, Some(why.into()));
    }

    /// A push was sent again (its history shows each resend).
    pub fn settle_retried(
        &self,
        user: &Arc<str>,
        info: &ConnInfo,
        trace_id: &Arc<str>,
        attempt: u32,
    ) {
        metrics::counter!("mpush_push_retries_total").increment(1);
        self.tracer.conn(
            trace_id,
            user,
            info,
            TraceState::Dispatched,
            Some(format!("resent (retry {attempt})").into()),
        );
    }

    /// The client acknowledged a push: ACK, and the inbox copy goes.
    pub async fn settle_acked(&self, user: &Arc<str>, info: &ConnInfo, push: &OutboundPush) {
        let by = match push.ack_mode {
            AckMode::Biz => "acknowledged by the app (biz)",
            _ => "acknowledged by the SDK (auto)",
        };
        self.tracer
            .conn(&push.trace_id, user, info, TraceState::Ack, Some(by.into()));
        if let Err(e) = self.inbox.remove(user, push.message_id).await {
            tracing::warn!(error = %e, "acknowledged message left in the inbox");
        }
        metrics::counter!("mpush_acks_total").increment(1);
    }

    /// No ACK after every retry: TIMEOUT. The inbox copy stays (it follows
    /// the user to the next connection).
    pub fn settle_timed_out(&self, user: &Arc<str>, info: &ConnInfo, push: &OutboundPush) {
        self.tracer.conn(
            &push.trace_id,
            user,
            info,
            TraceState::Timeout,
            Some("no ACK after every retry; kept for the user's next connection".into()),
        );
    }

    /// The connection closed with pushes not acknowledged: each goes (back)
    /// to the user's inbox, with the session TTL when it had none, and is
    /// redelivered on the user's next bind on any node.
    pub async fn settle_closed(
        &self,
        user: &Arc<str>,
        info: &ConnInfo,
        unacked: Vec<OutboundPush>,
    ) {
        let keep_ms = i64::try_from(self.cfg.settings.delivery.session_ttl_secs)
            .unwrap_or(86_400)
            .saturating_mul(1000);
        for p in unacked {
            // A push with an expiry came from the inbox or was put there when
            // it was sent (`push_users`): it is there already, and storing it
            // again would cost the store a round trip per message on every
            // close (a drain closes them all at once). Only pushes without one
            // (a broadcast's) are kept now.
            if p.expires_at_ms != 0 {
                self.tracer.conn(
                    &p.trace_id,
                    user,
                    info,
                    TraceState::Offline,
                    Some(
                        "connection closed before the ACK; kept for the user's next connection"
                            .into(),
                    ),
                );
                continue;
            }
            let expires_at_ms = unix_ms() + keep_ms;
            let kept = StoredMessage {
                message_id: p.message_id,
                trace_id: p.trace_id.clone(),
                content: p.content.clone(),
                ack_mode: p.ack_mode,
                client_type: None,
                expires_at_ms,
            };
            let detail = match self.inbox.push(user, kept).await {
                Ok(()) => "connection closed before the ACK; kept for the user's next connection"
                    .to_owned(),
                Err(e) => {
                    metrics::counter!("mpush_inbox_full_total").increment(1);
                    format!("connection closed before the ACK; not kept: {e}")
                }
            };
            self.tracer.conn(
                &p.trace_id,
                user,
                info,
                TraceState::Offline,
                Some(detail.into()),
            );
        }
    }

    /// Messages waiting for `user` that a connection of `client_type` may
    /// get, as pushes (ACK-less ones leave the inbox now).
    pub async fn replay_inbox(&self, user: &Arc<str>, info: &ConnInfo) -> Vec<OutboundPush> {
        let kept = match self.inbox.list(user, unix_ms()).await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, %user, "offline inbox unavailable at bind");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for m in kept {
            if m.client_type.is_some_and(|ct| ct != info.client_type) {
                continue;
            }
            if m.ack_mode == AckMode::None {
                let _ = self.inbox.remove(user, m.message_id).await;
            }
            self.tracer.conn(
                &m.trace_id,
                user,
                info,
                TraceState::Dispatched,
                Some("from the offline inbox".into()),
            );
            out.push(OutboundPush {
                message_id: m.message_id,
                trace_id: m.trace_id,
                content: m.content,
                ack_mode: m.ack_mode,
                expires_at_ms: u64::try_from(m.expires_at_ms).unwrap_or(0),
                ack_timeout: None,
                queued_at: Some(mpush_protocol::Instant::now()),
            });
        }
        out
    }
}
