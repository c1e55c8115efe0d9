//! What became of pushes on a connection: written, acknowledged, timed out,
//! closed with some outstanding, and the inbox replayed at bind.

use super::*;

impl DeliveryService {
    /// What became of pushes on a connection of `user`. What can be settled
    /// at once (the trace, metrics) is; work on the inbox store comes back
    /// as a future for the connection to await, so a connection's task
    /// carries that state only while there is such work (a written kept
    /// copy, an ACK, a close with pushes outstanding).
    #[must_use = "the inbox work runs only when awaited"]
    pub fn settle<'a>(
        &'a self,
        user: &'a Arc<str>,
        info: &'a ConnInfo,
        outcome: Outcome<'a>,
    ) -> Option<Settling<'a>> {
        match outcome {
            Outcome::Written { traces, kept } => {
                // One write's copies: recorded together (one lock in the
                // memory store, one clock read).
                let at_ms = unix_ms();
                let mut batch = self.tracer.batch();
                for t in traces {
                    batch.conn(t, user, info, TraceState::Delivered, None, at_ms);
                }
                drop(batch);
                (!kept.is_empty()).then(|| -> Settling<'a> {
                    Box::pin(async move {
                        for id in kept {
                            if let Err(e) = self.inbox.remove(user, *id).await {
                                // It stays: the next bind gets it again (the
                                // device's dedup window keeps it to one
                                // message for the app).
                                tracing::warn!(error = %e, %user, "a written message stays in the inbox");
                            }
                        }
                    })
                })
            }
            Outcome::Refused { trace_id, why } => {
                self.tracer
                    .conn(trace_id, user, info, TraceState::Failed, Some(why.into()));
                None
            }
            Outcome::Retried { trace_id, attempt } => {
                metrics::counter!("mpush_push_retries_total").increment(1);
                self.tracer.conn(
                    trace_id,
                    user,
                    info,
                    TraceState::Dispatched,
                    Some(format!("resent (retry {attempt})").into()),
                );
                None
            }
            Outcome::Acked(push) => {
                let by = match push.ack_mode {
                    AckMode::Biz => "acknowledged by the app (biz)",
                    _ => "acknowledged by the SDK (auto)",
                };
                self.tracer
                    .conn(&push.trace_id, user, info, TraceState::Ack, Some(by.into()));
                metrics::counter!("mpush_acks_total").increment(1);
                Some(Box::pin(async move {
                    if let Err(e) = self.inbox.remove(user, push.message_id).await {
                        tracing::warn!(error = %e, "acknowledged message left in the inbox");
                    }
                }))
            }
            Outcome::TimedOut(push) => {
                self.tracer.conn(
                    &push.trace_id,
                    user,
                    info,
                    TraceState::Timeout,
                    Some("no ACK after every retry; kept for the user's next connection".into()),
                );
                None
            }
            Outcome::Closed(unacked) if unacked.is_empty() => None,
            Outcome::Closed(unacked) => Some(Box::pin(self.keep_unacked(user, info, unacked))),
        }
    }

    /// The connection closed with pushes not acknowledged: each goes (back)
    /// to the user's inbox, with the session TTL when it had none, and is
    /// redelivered on the user's next bind on any node.
    pub(super) async fn keep_unacked(
        &self,
        user: &Arc<str>,
        info: &ConnInfo,
        unacked: Vec<OutboundPush>,
    ) {
        let keep_ms = i64::try_from(self.settings.session_ttl_secs)
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
    /// get, as pushes (they leave the inbox once written, or acknowledged).
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
