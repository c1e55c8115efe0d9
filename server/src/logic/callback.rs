//! Delivery callbacks: a push sent with `callback` is watched on every node
//! that handles it; each recipient's terminal state (DELIVERED for a push
//! without ACK, ACK, TIMEOUT, OFFLINE, FAILED) goes to the sinks that take
//! callbacks (or to the push's own allow-listed URL). A broadcast reports per
//! node: one aggregate of its counts once every copy there settled (or when
//! its window ends), never one call per recipient.
//!
//! Watches are bounded (`sinks.callback_max_watched`: more are refused) and
//! end after `sinks.callback_window_secs`. A later state of the same
//! recipient (an inbox copy ACKed after a TIMEOUT, on reconnect) is reported
//! again when it happens within the window on a node that watches the push.

use mpush_protocol::session::ClientType;
use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;

use crate::clock::unix_ms;
use crate::sink::{SinkEvent, Sinks};
use crate::store::{StateCounts, TraceState};

/// Where a push's callbacks go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackTarget {
    /// Every sink that takes callbacks.
    Sinks,
    /// An allow-listed URL of the push's own.
    Url(Arc<str>),
}

impl CallbackTarget {
    /// The form that travels between nodes: `*` or the URL.
    pub fn to_wire(&self) -> String {
        match self {
            Self::Sinks => "*".into(),
            Self::Url(u) => u.to_string(),
        }
    }

    pub fn from_wire(s: &str) -> Option<Self> {
        match s {
            "" => None,
            "*" => Some(Self::Sinks),
            u => Some(Self::Url(u.into())),
        }
    }
}

/// The watched pushes are full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many pushes with callbacks in flight on this node; retry later")]
pub struct WatchFull;

struct Watch {
    target: CallbackTarget,
    /// The push waits for an ACK: DELIVERED is not terminal.
    ack: bool,
    since: Instant,
    /// A broadcast: its settled counts so far on this node.
    broadcast: Option<StateCounts>,
}

pub struct Callbacks {
    watches: dashmap::DashMap<Arc<str>, Watch>,
    count: AtomicUsize,
    max: usize,
    window: Duration,
    sinks: Arc<Sinks>,
    node: Arc<str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeliveryEvent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: String,
    trace_id: &'a str,
    user_id: &'a str,
    device_id: &'a str,
    client_type: ClientType,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
    at: i64,
    node: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BroadcastEvent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: String,
    trace_id: &'a str,
    node: &'a str,
    /// Recipients per state on this node (zero counts left out).
    counts: std::collections::BTreeMap<&'static str, u64>,
    /// Every copy sent here reached a terminal state (else: the window ended).
    settled: bool,
    at: i64,
}

impl Callbacks {
    pub fn new(sinks: Arc<Sinks>, node: Arc<str>, max: usize, window: Duration) -> Self {
        Self {
            watches: dashmap::DashMap::new(),
            count: AtomicUsize::new(0),
            max,
            window,
            sinks,
            node,
        }
    }

    /// Whether callbacks can go anywhere: some sink takes them, or `url` is
    /// allow-listed.
    pub fn can_reach(&self, target: &CallbackTarget) -> bool {
        match target {
            CallbackTarget::Sinks => self.sinks.wants(SinkEvent::Callback),
            CallbackTarget::Url(u) => self.sinks.allows_callback_url(u),
        }
    }

    /// Waits (bounded) while the queue that takes `target`'s callbacks is
    /// over half full: see `Sinks::callback_room`.
    pub async fn room(&self, target: &CallbackTarget) {
        match target {
            CallbackTarget::Sinks => self.sinks.callback_room(None).await,
            CallbackTarget::Url(u) => self.sinks.callback_room(Some(u)).await,
        }
    }

    /// Watches `trace_id` on this node.
    pub fn watch(
        &self,
        trace_id: &Arc<str>,
        target: CallbackTarget,
        ack: bool,
        broadcast: bool,
    ) -> Result<(), WatchFull> {
        if self.count.load(Ordering::Relaxed) >= self.max {
            self.sweep();
            if self.count.load(Ordering::Relaxed) >= self.max {
                metrics::counter!("mpush_callback_watch_refused_total").increment(1);
                return Err(WatchFull);
            }
        }
        let w = Watch {
            target,
            ack,
            since: Instant::now(),
            broadcast: broadcast.then(StateCounts::default),
        };
        if self.watches.insert(trace_id.clone(), w).is_none() {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Where `trace_id`'s callbacks go, when it is watched here.
    pub fn target_of(&self, trace_id: &str) -> Option<CallbackTarget> {
        if !self.active() {
            return None;
        }
        self.watches.get(trace_id).map(|w| w.target.clone())
    }

    /// Anything watched (the tracer's hot path asks this first).
    pub fn active(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// One recipient's state change of a unicast push.
    pub fn on_state(
        &self,
        trace_id: &Arc<str>,
        user_id: &str,
        device_id: &str,
        client_type: ClientType,
        state: TraceState,
        detail: Option<&Cow<'static, str>>,
    ) {
        let target = {
            let Some(w) = self.watches.get(trace_id) else {
                return;
            };
            if w.broadcast.is_some() || !terminal(state, w.ack) {
                return;
            }
            w.target.clone()
        };
        let e = DeliveryEvent {
            kind: "delivery",
            id: crate::clock::random_hex(16),
            trace_id,
            user_id,
            device_id,
            client_type,
            state: state.name(),
            detail: detail.map(|d| &**d),
            at: unix_ms(),
            node: &self.node,
        };
        self.send(&target, serde_json::to_vec(&e).expect("serializable"));
    }

    /// A watched broadcast's new counts on this node (from the trace
    /// writer); reports once every copy settled.
    pub fn on_broadcast_counts(&self, trace_id: &Arc<str>, delta: &StateCounts) {
        let done = {
            let Some(mut w) = self.watches.get_mut(trace_id) else {
                return;
            };
            let ack = w.ack;
            let Some(total) = w.broadcast.as_mut() else {
                return;
            };
            total.merge(delta);
            let total = *total;
            settled(&total, ack).then(|| (w.target.clone(), total))
        };
        if let Some((target, counts)) = done {
            self.report_broadcast(trace_id, &target, &counts, true);
            if self.watches.remove(trace_id).is_some() {
                self.count.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Ends watches older than the window (a broadcast reports what it has).
    pub fn sweep(&self) {
        let mut ended = Vec::new();
        self.watches.retain(|t, w| {
            if w.since.elapsed() < self.window {
                return true;
            }
            if let Some(c) = &w.broadcast {
                ended.push((t.clone(), w.target.clone(), *c));
            }
            false
        });
        self.count.store(self.watches.len(), Ordering::Relaxed);
        for (t, target, counts) in ended {
            self.report_broadcast(&t, &target, &counts, false);
        }
    }

    fn report_broadcast(
        &self,
        trace_id: &str,
        target: &CallbackTarget,
        counts: &StateCounts,
        settled: bool,
    ) {
        let e = BroadcastEvent {
            kind: "broadcast",
            id: crate::clock::random_hex(16),
            trace_id,
            node: &self.node,
            counts: counts.named(),
            settled,
            at: unix_ms(),
        };
        self.send(target, serde_json::to_vec(&e).expect("serializable"));
    }

    fn send(&self, target: &CallbackTarget, json: Vec<u8>) {
        metrics::counter!("mpush_callbacks_total").increment(1);
        let json = Bytes::from(json);
        match target {
            CallbackTarget::Sinks => self.sinks.notify(SinkEvent::Callback, json),
            CallbackTarget::Url(u) => self.sinks.notify_url(u, json),
        }
    }
}

/// A recipient's state after which nothing more is expected.
fn terminal(state: TraceState, ack: bool) -> bool {
    match state {
        TraceState::Ack | TraceState::Timeout | TraceState::Failed | TraceState::Offline => true,
        TraceState::Delivered => !ack,
        TraceState::Accepted | TraceState::Dispatched => false,
    }
}

/// Every copy a node dispatched reached a terminal state.
fn settled(c: &StateCounts, ack: bool) -> bool {
    c.settled(ack)
}
