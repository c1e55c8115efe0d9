//! Broadcasts (on every node through Redis in cluster mode) and topic
//! pushes.

use super::*;

impl DeliveryService {
    /// Starts a broadcast: on every node through Redis in cluster mode, else here.
    pub async fn start_broadcast(
        self: &Arc<Self>,
        trace_id: Arc<str>,
        spec: MessageSpec,
        tags: Vec<String>,
        condition: Option<String>,
        filter: Arc<Filter>,
    ) -> Result<(), crate::logic::send::SendError> {
        use crate::logic::send::SendError;
        let message_id = self.next_message_id();
        if let Some(cl) = &self.cluster {
            let msg = BroadcastMsg {
                trace_id: trace_id.to_string(),
                content: spec.content.to_vec(),
                ack_mode: spec.ack_mode.to_v2(),
                client_type: spec.client_type.map(ClientType::code),
                tags,
                condition,
                message_id,
                callback: spec.callback.as_ref().map(CallbackTarget::to_wire),
            };
            let nodes = cl
                .publish_broadcast(&msg)
                .await
                .map_err(|e| SendError::Unavailable(format!("cluster unavailable: {e}")))?;
            // Started: the answer stays 202 even if the count cannot be
            // written; the trace then never claims to be finished.
            if let Err(e) = self.tracer.expect_nodes(&trace_id, nodes).await {
                tracing::warn!(trace = %trace_id, error = %e, "broadcast trace: the count of nodes was not recorded");
            }
            return Ok(());
        }
        if let Some(target) = spec.callback.clone() {
            self.tracer
                .callbacks()
                .watch(&trace_id, target, spec.ack_mode != AckMode::None, true)
                .map_err(|e| SendError::Unavailable(e.to_string()))?;
        }
        let hub = self.clone();
        tokio::spawn(async move {
            hub.broadcast_here(trace_id, message_id, &spec, filter)
                .await;
        });
        Ok(())
    }

    /// Sends to every connection here that passes `filter`, at the broadcast
    /// rate, up to `broadcast_max`. Its trace is counts per node.
    pub(in crate::logic) async fn broadcast_here(
        &self,
        trace_id: Arc<str>,
        message_id: u64,
        spec: &MessageSpec,
        filter: Arc<Filter>,
    ) -> usize {
        let max = self.settings.broadcast_max;
        let targets = if filter.condition.is_some() {
            // A condition is evaluated once per connection, each within its
            // budget: on the blocking pool, not on the async workers that
            // serve connections.
            let (router, f) = (self.router.local_arc(), filter.clone());
            match tokio::task::spawn_blocking(move || {
                let (mut n, mut stats) = (0, crate::logic::filter::FilterStats::default());
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
                    Vec::new()
                }
            }
        } else {
            let (mut n, mut stats) = (0, crate::logic::filter::FilterStats::default());
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
            let mut trace = self.tracer.batch();
            for (user, h) in chunk {
                self.hand_over(h, user, &push, true, &mut trace);
            }
        }
        self.tracer
            .broadcast_handed(&trace_id, spec.ack_mode != AckMode::None);
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
}
