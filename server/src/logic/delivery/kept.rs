//! Inbox copies handed to users connected here: announced by the node that
//! kept them, swept after Redis came back, and kept in the first place.

use super::*;

impl DeliveryService {
    /// In cluster mode, a message kept for a user with no route (the table
    /// may have lost it) or with a device it could not reach is announced to
    /// every node: one where the user is connected hands it over now,
    /// without waiting for the user's next bind.
    pub(super) async fn announce_kept(
        &self,
        users: &[Arc<str>],
        message_id: u64,
        attempts: &[Attempt],
    ) {
        let Some(cl) = &self.cluster else {
            return;
        };
        let kept: Vec<(String, u64)> = users
            .iter()
            .zip(attempts)
            .filter(|(_, a)| a.outcome.stored && (!a.routed || a.unreached > 0))
            .map(|(u, _)| (u.to_string(), message_id))
            .collect();
        for chunk in kept.chunks(1000) {
            let msg = crate::cluster::KeptMsg {
                kept: chunk.to_vec(),
            };
            if let Err(e) = cl.publish_kept(&msg).await {
                tracing::warn!(error = %e, "kept messages not announced (they wait for the next bind)");
            }
        }
    }

    /// Messages kept for users connected here (announced by the node that
    /// kept them): handed to those connections now.
    /// An inbox that cannot be read makes the node recover (re-assert,
    /// then sweep every local user's inbox until it reads).
    /// False when some inbox could not be read (the node must recover).
    pub(in crate::logic) async fn deliver_kept(&self, msg: crate::cluster::KeptMsg) -> bool {
        let mut unread = false;
        for (user, message_id) in msg.kept {
            let user: Arc<str> = user.into();
            unread |= self.hand_kept(&user, Some(message_id)).await.is_none();
        }
        if unread {
            tracing::warn!("an announced kept message could not be read: recovering");
        }
        !unread
    }

    /// Everything kept for the users connected here (or for `only` of
    /// them), handed to their connections: after Redis came back, the
    /// announcements made while this node's subscription was down are
    /// lost, and this finds what they named (a message already in flight on
    /// a connection is not sent twice; a device drops a copy it has seen by
    /// its message id). A few users at a time, one inbox read each; returns
    /// the users whose inbox could not be read.
    pub async fn sweep_kept(&self, only: Option<Vec<Arc<str>>>) -> Vec<Arc<str>> {
        use futures_util::StreamExt;
        let users: Vec<Arc<str>> = only.unwrap_or_else(|| {
            let mut seen = std::collections::HashSet::new();
            self.router
                .local()
                .snapshot()
                .into_iter()
                .filter_map(|(u, _)| seen.insert(u.clone()).then_some(u))
                .collect()
        });
        let results: Vec<(Arc<str>, Option<u64>)> = futures_util::stream::iter(users)
            .map(|u| async move {
                let n = self.hand_kept(&u, None).await;
                (u, n)
            })
            .buffer_unordered(32)
            .collect()
            .await;
        let handed: u64 = results.iter().filter_map(|(_, n)| *n).sum();
        if handed > 0 {
            tracing::info!(
                handed,
                "kept messages handed to connections after Redis came back"
            );
        }
        results
            .into_iter()
            .filter_map(|(u, n)| n.is_none().then_some(u))
            .collect()
    }

    /// Hands `user`'s kept messages (one, or all) to the user's connections
    /// here; it leaves the inbox when a connection wrote it (or a device
    /// acknowledged it), not before. Returns how many copies were handed
    /// (None: the inbox could not be read).
    pub(super) async fn hand_kept(&self, user: &Arc<str>, only: Option<u64>) -> Option<u64> {
        let local = self.router.local().lookup(user);
        if local.is_empty() {
            return Some(0);
        }
        let kept = match self.inbox.list(user, unix_ms()).await {
            Ok(k) => k,
            Err(e) => {
                tracing::debug!(error = %e, %user, "inbox unavailable for a kept message");
                return None;
            }
        };
        let mut handed = 0;
        let mut trace = self.tracer.batch();
        for m in kept {
            if only.is_some_and(|id| id != m.message_id) {
                continue;
            }
            let push = Arc::new(OutboundPush {
                message_id: m.message_id,
                trace_id: m.trace_id,
                content: m.content,
                ack_mode: m.ack_mode,
                expires_at_ms: u64::try_from(m.expires_at_ms).unwrap_or(0),
                ack_timeout: None,
                queued_at: Some(mpush_protocol::Instant::now()),
            });
            for h in &local {
                if m.client_type.is_none_or(|ct| ct == h.info.client_type)
                    && self.hand_over(h, user, &push, false, &mut trace)
                {
                    handed += 1;
                }
            }
        }
        metrics::counter!("mpush_kept_delivered_total").increment(handed);
        Some(handed)
    }

    /// Puts the message in `user`'s inbox; a store that is down or a full
    /// inbox is noted on the attempt.
    pub(super) async fn keep(
        &self,
        user: &str,
        push: &OutboundPush,
        spec: &MessageSpec,
        a: &mut Attempt,
    ) {
        let stored = StoredMessage {
            message_id: push.message_id,
            trace_id: push.trace_id.clone(),
            content: spec.content.clone(),
            ack_mode: spec.ack_mode,
            client_type: spec.client_type,
            expires_at_ms: i64::try_from(push.expires_at_ms).unwrap_or(0),
        };
        match self.inbox.push(user, stored).await {
            Ok(()) => a.outcome.stored = true,
            Err(e) => {
                match e {
                    InboxError::Full(_) => {
                        metrics::counter!("mpush_inbox_full_total").increment(1);
                        a.inbox_full = true;
                    }
                    InboxError::Unavailable(_) => a.unavailable = true,
                }
                a.note(e.to_string());
            }
        }
    }
}
