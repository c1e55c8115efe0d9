//! Trace writes: connections and the delivery code hand state changes to
//! `Tracer::record` (no await, no task per message). The memory store takes
//! each in place (one short lock); for Redis they go through a bounded queue
//! to one writer, on a thread and Redis connections of its own, that applies
//! them in batches (one round trip per trace, per batch). Pushes wait for
//! room in that queue (`Tracer::room`), so a flood goes at the store's pace.
//! A broadcast's events are folded into per-node counts plus its failures by
//! device, never one record per recipient.

use mpush_protocol::session::ClientType;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::callback::Callbacks;
use crate::clock::unix_ms;
use crate::route::ConnInfo;
use crate::store::{
    Failure, MAX_FAILURES, StateCounts, StoreError, TraceCounts, TraceEvent, TraceState,
    TraceStore, TraceView,
};

/// Events a node may have queued for the writer before it starts refusing
/// (refusals are counted: `mpush_trace_events_dropped_total`).
const QUEUE: usize = 1 << 16;
/// Events applied per batch.
const BATCH: usize = 4096;
/// Broadcast traces the writer remembers as such.
const BROADCASTS: usize = 4096;

enum Item {
    Event(TraceEvent),
    /// A broadcast's failure (already counted): kept by device, up to a bound.
    BroadcastFailure(TraceEvent),
    /// This node handed every copy of a broadcast on (whether they wait for ACKs).
    Handed(Arc<str>, bool),
}

pub struct Tracer {
    store: Arc<dyn TraceStore>,
    tx: mpsc::Sender<Item>,
    dropped: AtomicU64,
    /// The writer's pace (see [`Tracer::room`]).
    pace: Arc<Pace>,
    deadline: Duration,
    live: Live,
    callbacks: Arc<Callbacks>,
}

/// What is left of a state change once a broadcast's has been counted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Counted in place (a broadcast's delivery or ACK).
    Done,
    /// A broadcast's failure: named in its trace.
    Failure,
    /// A recipient's: to the store.
    Store,
}

impl Next {
    /// Counts a state change of a broadcast in progress here (`live`) in
    /// place: what is left to do with it.
    fn of(live: Option<&LiveCounts>, state: TraceState) -> Self {
        let Some(c) = live else {
            return Self::Store;
        };
        c.counts[state as usize].fetch_add(1, Ordering::Relaxed);
        // A broadcast's failures also travel, named (they are few).
        if matches!(
            state,
            TraceState::Failed | TraceState::Timeout | TraceState::Offline
        ) {
            Self::Failure
        } else {
            Self::Done
        }
    }
}

/// State changes of one hand-over loop, recorded together when it flushes,
/// every [`TraceBatch::MAX`] of them, and when it is dropped (a caller's
/// future dropped halfway loses none). Each is stamped when it happened,
/// so the store keeps every recipient's history in time order.
pub struct TraceBatch<'a> {
    tracer: &'a Tracer,
    events: Vec<TraceEvent>,
}

impl TraceBatch<'_> {
    /// Bounds what a batch holds, and how long the store's lock is held.
    const MAX: usize = 256;

    /// A state change of a push on connection `info` of `user`.
    pub fn conn(
        &mut self,
        trace_id: &Arc<str>,
        user: &Arc<str>,
        info: &ConnInfo,
        state: TraceState,
        detail: Option<Cow<'static, str>>,
        at_ms: i64,
    ) {
        self.events.push(TraceEvent {
            trace_id: trace_id.clone(),
            user_id: user.clone(),
            device_id: info.device_id.clone(),
            client_type: info.client_type,
            state,
            detail,
            at_ms,
        });
        if self.events.len() >= Self::MAX {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.events.is_empty() {
            self.tracer.record_all(&mut self.events);
        }
    }
}

impl Drop for TraceBatch<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// This node's broadcasts in progress: their deliveries and ACKs are counted
/// here in place (a broadcast to 10k connections is 10k increments, not 10k
/// queued events) and flushed by the writer a few times a second.
type Live = Arc<dashmap::DashMap<Arc<str>, Arc<LiveCounts>>>;

struct LiveCounts {
    counts: [AtomicU64; 7],
    since: std::time::Instant,
}

impl LiveCounts {
    fn take(&self) -> StateCounts {
        let mut c = StateCounts::default();
        for s in TraceState::ALL {
            c.add(s, self.counts[s as usize].swap(0, Ordering::Relaxed));
        }
        c
    }
}

/// What pushes waiting for room in the writer's queue watch.
#[derive(Default)]
struct Pace {
    /// Signalled whenever the writer takes a batch out of the queue.
    drained: tokio::sync::Notify,
    /// The writer's last write failed or timed out: waiting would only slow
    /// delivery down.
    store_down: std::sync::atomic::AtomicBool,
}

/// How often live broadcast counts reach the store.
const FLUSH: Duration = Duration::from_millis(200);

impl Tracer {
    /// Starts the writer on a thread of its own (it ends when the tracer is
    /// dropped). Each batch gets `deadline`: a store that hangs loses that
    /// batch, not the writer.
    pub fn new(
        store: Arc<dyn TraceStore>,
        node: Arc<str>,
        deadline: Duration,
        callbacks: Arc<Callbacks>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let live = Live::default();
        let pace = Arc::new(Pace::default());
        // A thread of its own: as a task, the writer waited its turn behind
        // every ready connection task, and a flood that kept the async
        // workers busy filled its queue (Redis lost events so; the memory
        // store applies unicast events in place). The OS schedules a thread
        // beside the workers, and on it the writer's Redis I/O is its own.
        let job = write(
            store.clone(),
            node,
            rx,
            deadline,
            live.clone(),
            callbacks.clone(),
            pace.clone(),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the trace writer's runtime starts");
        std::thread::Builder::new()
            .name("mpush-traces".into())
            .spawn(move || rt.block_on(job))
            .expect("the trace writer's thread starts");
        Self {
            store,
            tx,
            dropped: AtomicU64::new(0),
            pace,
            deadline,
            live,
            callbacks,
        }
    }

    /// Events waiting for the writer.
    pub fn queued(&self) -> usize {
        QUEUE - self.tx.capacity()
    }

    /// Events refused because the writer's queue was full (also counted as
    /// `mpush_trace_events_dropped_total`).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Backpressure from the trace store: while the writer's queue is over
    /// half full, waits for it to drain (up to the store's deadline), so a
    /// flood of pushes goes at the pace the store takes their events instead
    /// of overflowing the queue. Past the deadline the push goes on: delivery
    /// never waits longer on tracing (what the queue then refuses is
    /// counted). A store whose last write failed is not waited for at all:
    /// delivery does not slow down for a trace store that is down.
    pub async fn room(&self) {
        if self.has_room() {
            return;
        }
        metrics::counter!("mpush_trace_backpressure_waits_total").increment(1);
        let waited = tokio::time::timeout(self.deadline, async {
            loop {
                // Registered before the check: a batch applied in between
                // still wakes it.
                let drained = self.pace.drained.notified();
                if self.has_room() {
                    return;
                }
                drained.await;
            }
        })
        .await;
        if waited.is_err() {
            metrics::counter!("mpush_trace_backpressure_timeouts_total").increment(1);
        }
    }

    fn has_room(&self) -> bool {
        self.queued() <= QUEUE / 2 || self.pace.store_down.load(Ordering::Relaxed)
    }

    /// The delivery callbacks this node watches.
    pub fn callbacks(&self) -> &Arc<Callbacks> {
        &self.callbacks
    }

    /// Starts a trace and returns its id (the caller's, or a new one).
    pub async fn start(&self, trace_id: Option<String>) -> Result<Arc<str>, StoreError> {
        let id = trace_id
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| crate::clock::random_hex(16));
        self.store.create(&id, unix_ms()).await?;
        Ok(id.into())
    }

    pub async fn get(&self, trace_id: &str) -> Result<Option<TraceView>, StoreError> {
        self.store.get(trace_id).await
    }

    /// Marks `trace_id` as a broadcast on this node: its events become counts.
    pub fn broadcast(&self, trace_id: &Arc<str>, dispatched: u64) {
        let counts = LiveCounts {
            counts: Default::default(),
            since: std::time::Instant::now(),
        };
        counts.counts[TraceState::Dispatched as usize].store(dispatched, Ordering::Relaxed);
        self.live.insert(trace_id.clone(), Arc::new(counts));
        if dispatched == 0 && self.callbacks.active() {
            // Nothing to wait for here: settled at once.
            self.callbacks
                .on_broadcast_counts(trace_id, &StateCounts::default());
        }
    }

    /// A cluster broadcast reached `nodes` nodes: its trace is finished once
    /// each has reported.
    pub async fn expect_nodes(&self, trace_id: &str, nodes: u64) -> Result<(), StoreError> {
        self.store.expect_nodes(trace_id, nodes).await
    }

    /// This node has handed every copy of broadcast `trace_id` on (`ack`:
    /// they wait for ACKs): with its counts, the trace can say when the
    /// broadcast is finished, and that it matched nobody here.
    pub fn broadcast_handed(&self, trace_id: &Arc<str>, ack: bool) {
        self.send(Item::Handed(trace_id.clone(), ack));
    }

    /// One recipient's state change.
    pub fn record(
        &self,
        trace_id: &Arc<str>,
        user_id: &Arc<str>,
        device_id: &Arc<str>,
        client_type: ClientType,
        state: TraceState,
        detail: Option<Cow<'static, str>>,
    ) {
        let next = Next::of(self.live.get(trace_id).as_deref().map(|c| &**c), state);
        if next == Next::Done {
            return;
        }
        let e = TraceEvent {
            trace_id: trace_id.clone(),
            user_id: user_id.clone(),
            device_id: device_id.clone(),
            client_type,
            state,
            detail,
            at_ms: unix_ms(),
        };
        if next == Next::Failure {
            self.send(Item::BroadcastFailure(e));
            return;
        }
        self.tell(&e);
        if !self.store.record_now(std::slice::from_ref(&e)) {
            // In place where the store allows it (memory): a writer task
            // waits its turn behind every ready connection task, and under
            // a flood of unicasts its queue filled and dropped events (a
            // quarter of them in the bench's batch phase).
            self.send(Item::Event(e));
        }
    }

    /// Tells the callbacks of a recipient's state change.
    fn tell(&self, e: &TraceEvent) {
        if self.callbacks.active() {
            self.callbacks.on_state(
                &e.trace_id,
                &e.user_id,
                &e.device_id,
                e.client_type,
                e.state,
                e.detail.as_ref(),
            );
        }
    }

    /// A batch of state changes recorded together (the hand-overs of one
    /// push to many recipients): the memory store applies them under one
    /// lock, looking each trace up once per run of its events.
    pub fn batch(&self) -> TraceBatch<'_> {
        TraceBatch {
            tracer: self,
            events: Vec::new(),
        }
    }

    fn record_all(&self, events: &mut Vec<TraceEvent>) {
        let mut live: Option<(Arc<str>, Option<Arc<LiveCounts>>)> = None;
        let mut failures = Vec::new();
        events.retain(|e| {
            if live.as_ref().is_none_or(|(t, _)| *t != e.trace_id) {
                let c = self.live.get(&e.trace_id).map(|c| c.value().clone());
                live = Some((e.trace_id.clone(), c));
            }
            let c = live.as_ref().and_then(|(_, c)| c.as_deref());
            match Next::of(c, e.state) {
                Next::Done => false,
                Next::Failure => {
                    failures.push(e.clone());
                    false
                }
                Next::Store => {
                    self.tell(e);
                    true
                }
            }
        });
        for f in failures {
            self.send(Item::BroadcastFailure(f));
        }
        if !events.is_empty() && !self.store.record_now(events) {
            for e in events.drain(..) {
                self.send(Item::Event(e));
            }
        }
        events.clear();
    }

    /// A state change of a push on connection `info` of `user`.
    pub fn conn(
        &self,
        trace_id: &Arc<str>,
        user: &Arc<str>,
        info: &ConnInfo,
        state: TraceState,
        detail: Option<Cow<'static, str>>,
    ) {
        self.record(
            trace_id,
            user,
            &info.device_id,
            info.client_type,
            state,
            detail,
        );
    }

    fn send(&self, item: Item) {
        if self.tx.try_send(item).is_err() {
            metrics::counter!("mpush_trace_events_dropped_total").increment(1);
            if self
                .dropped
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(10_000)
            {
                tracing::warn!("trace writer behind: trace events dropped");
            }
        }
    }
}

async fn write(
    shared: Arc<dyn TraceStore>,
    node: Arc<str>,
    mut rx: mpsc::Receiver<Item>,
    deadline: Duration,
    live: Live,
    callbacks: Arc<Callbacks>,
    pace: Arc<Pace>,
) {
    // The store on connections of this thread's own (Redis), opened when
    // the first batch needs it and again after a failure (at most once a
    // second; meanwhile batches are lost and counted, as when Redis is down).
    let mut own: Option<Arc<dyn TraceStore>> = None;
    let mut opened_at: Option<tokio::time::Instant> = None;
    let mut ticks: u32 = 0;
    let mut tick = tokio::time::interval(FLUSH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Failures kept per broadcast on this node (beyond, only counted).
    let mut failures_kept: HashMap<Arc<str>, usize> = HashMap::default();
    let mut buf = Vec::with_capacity(BATCH);
    loop {
        let mut counts: HashMap<Arc<str>, TraceCounts> = HashMap::default();
        tokio::select! {
            n = rx.recv_many(&mut buf, BATCH) => if n == 0 { return },
            _ = tick.tick() => {
                flush_live(&live, &node, &mut counts, &callbacks);
                failures_kept.retain(|t, _| live.contains_key(t));
                ticks = ticks.wrapping_add(1);
                if ticks.is_multiple_of(25) && callbacks.active() {
                    callbacks.sweep();
                }
            }
        }
        let mut events = Vec::new();
        if !buf.is_empty() {
            // Their room in the queue is free again.
            pace.drained.notify_waiters();
        }
        for item in buf.drain(..) {
            match item {
                Item::BroadcastFailure(e) => {
                    let kept = failures_kept.entry(e.trace_id.clone()).or_default();
                    if *kept < MAX_FAILURES {
                        *kept += 1;
                        entry(&mut counts, &node, &e.trace_id)
                            .failures
                            .push(Failure {
                                user_id: e.user_id.to_string(),
                                device_id: e.device_id.to_string(),
                                state: e.state,
                                detail: e.detail.map(Cow::into_owned),
                            });
                    }
                }
                Item::Event(e) => events.push(e),
                Item::Handed(t, ack) => {
                    // The counts so far travel with the mark, so the trace
                    // never shows "handed" before what was dispatched.
                    if let Some(c) = live.get(&t).map(|c| c.take())
                        && !c.is_empty()
                    {
                        fold(&t, &c, &node, &mut counts, &callbacks);
                    }
                    entry(&mut counts, &node, &t).handed = Some(ack);
                }
            }
        }
        if events.is_empty() && counts.is_empty() {
            continue;
        }
        let store = match &own {
            Some(s) => s.clone(),
            None if opened_at.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) => {
                lost(events.len() + counts.len(), "trace store not reachable");
                pace.store_down.store(true, Ordering::Relaxed);
                continue;
            }
            None => {
                opened_at = Some(tokio::time::Instant::now());
                match tokio::time::timeout(deadline, shared.reopen()).await {
                    Ok(Ok(Some(s))) => {
                        own = Some(s.clone());
                        s
                    }
                    Ok(Ok(None)) => {
                        own = Some(shared.clone());
                        shared.clone()
                    }
                    Ok(Err(e)) => {
                        lost(events.len() + counts.len(), &e.to_string());
                        pace.store_down.store(true, Ordering::Relaxed);
                        continue;
                    }
                    Err(_) => {
                        lost(events.len() + counts.len(), "trace store timed out");
                        pace.store_down.store(true, Ordering::Relaxed);
                        continue;
                    }
                }
            }
        };
        let mut ok = true;
        if !events.is_empty() {
            match tokio::time::timeout(deadline, store.record(&events)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    ok = false;
                    lost(events.len(), &e.to_string());
                }
                Err(_) => {
                    ok = false;
                    lost(events.len(), "trace store timed out");
                }
            }
        }
        if !counts.is_empty() {
            let counts: Vec<TraceCounts> = counts.into_values().collect();
            match tokio::time::timeout(deadline, store.count(&counts)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    ok = false;
                    lost(counts.len(), &e.to_string());
                }
                Err(_) => {
                    ok = false;
                    lost(counts.len(), "trace store timed out");
                }
            }
        }
        pace.store_down.store(!ok, Ordering::Relaxed);
        if buf.capacity() > BATCH {
            buf = Vec::with_capacity(BATCH);
        }
    }
}

/// Moves the live broadcast counts into `counts`; forgets broadcasts that
/// have been quiet for a minute, and the oldest beyond `BROADCASTS`.
fn flush_live(
    live: &Live,
    node: &Arc<str>,
    counts: &mut HashMap<Arc<str>, TraceCounts>,
    callbacks: &Callbacks,
) {
    let mut quiet = Vec::new();
    for e in live.iter() {
        let c = e.value().take();
        if c.is_empty() {
            if e.value().since.elapsed() > Duration::from_secs(60) {
                quiet.push(e.key().clone());
            }
            continue;
        }
        fold(e.key(), &c, node, counts, callbacks);
    }
    for k in quiet {
        live.remove(&k);
    }
    if live.len() > BROADCASTS {
        let mut all: Vec<(std::time::Instant, Arc<str>)> = live
            .iter()
            .map(|e| (e.value().since, e.key().clone()))
            .collect();
        all.sort();
        for (_, k) in all.into_iter().take(live.len() - BROADCASTS) {
            if let Some((k, c)) = live.remove(&k) {
                fold(&k, &c.take(), node, counts, callbacks);
            }
        }
    }
}

fn lost(n: usize, why: &str) {
    metrics::counter!("mpush_trace_events_lost_total").increment(n as u64);
    tracing::warn!(n, why, "trace events lost");
}

/// Moves a broadcast's live counts into what the writer stores next (and
/// tells the callbacks).
fn fold(
    t: &Arc<str>,
    c: &StateCounts,
    node: &Arc<str>,
    counts: &mut HashMap<Arc<str>, TraceCounts>,
    callbacks: &Callbacks,
) {
    if callbacks.active() {
        callbacks.on_broadcast_counts(t, c);
    }
    entry(counts, node, t).counts.merge(c);
}

fn entry<'a>(
    counts: &'a mut HashMap<Arc<str>, TraceCounts>,
    node: &Arc<str>,
    t: &Arc<str>,
) -> &'a mut TraceCounts {
    counts.entry(t.clone()).or_insert_with(|| TraceCounts {
        trace_id: t.clone(),
        node: node.clone(),
        counts: StateCounts::default(),
        failures: Vec::new(),
        handed: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryTraces;

    fn callbacks() -> Arc<Callbacks> {
        let sinks = Arc::new(crate::sink::Sinks::start(
            &crate::config::Sinks::default(),
            None,
        ));
        Arc::new(Callbacks::new(
            sinks,
            "n".into(),
            1_000,
            Duration::from_secs(60),
        ))
    }

    /// A trace store that takes traces but never answers a write.
    struct Hanging;

    #[async_trait::async_trait]
    impl TraceStore for Hanging {
        async fn create(&self, _: &str, _: i64) -> Result<(), StoreError> {
            Ok(())
        }
        async fn record(&self, _: &[TraceEvent]) -> Result<(), StoreError> {
            std::future::pending().await
        }
        async fn count(&self, _: &[TraceCounts]) -> Result<(), StoreError> {
            std::future::pending().await
        }
        async fn get(&self, _: &str) -> Result<Option<TraceView>, StoreError> {
            Ok(None)
        }
    }

    /// Backpressure never holds a push longer than the store's deadline,
    /// and not at all once the store's writes fail: a store that hangs
    /// costs the pushes waiting when it began one deadline, and no more.
    #[tokio::test]
    async fn waiting_for_room_ends_at_the_deadline_when_the_store_hangs() {
        let deadline = Duration::from_millis(300);
        let tracer = Tracer::new(Arc::new(Hanging), "n".into(), deadline, callbacks());
        let trace: Arc<str> = "t".into();
        let device: Arc<str> = "d".into();
        // Below half: no wait at all.
        let t0 = std::time::Instant::now();
        tracer.room().await;
        assert!(t0.elapsed() < deadline / 2, "{:?}", t0.elapsed());
        let users: Vec<Arc<str>> = (0..QUEUE).map(|u| format!("u{u}").into()).collect();
        for u in &users {
            tracer.record(
                &trace,
                u,
                &device,
                ClientType::Mobile,
                TraceState::Dispatched,
                None,
            );
        }
        assert!(tracer.queued() > QUEUE / 2, "{}", tracer.queued());
        let t0 = std::time::Instant::now();
        tracer.room().await;
        let waited = t0.elapsed();
        // Until the writer's write timed out (it began a little earlier).
        assert!(
            waited >= deadline / 2 && waited < deadline * 4,
            "waited {waited:?} for a deadline of {deadline:?}"
        );
        // The store is down now: pushes no longer wait for it.
        assert!(tracer.queued() > QUEUE / 2, "{}", tracer.queued());
        let t0 = std::time::Instant::now();
        tracer.room().await;
        assert!(t0.elapsed() < deadline / 2, "{:?}", t0.elapsed());
    }

    /// With the memory store, a flood of unicast events larger than the
    /// writer's queue, recorded before the writer task could run once,
    /// loses none: each is applied in place. (Through the queue, the
    /// bench's batch phase lost a quarter of them: the writer task waited
    /// its turn behind thousands of ready connection tasks.)
    #[tokio::test(flavor = "current_thread")]
    async fn a_flood_of_unicast_events_larger_than_the_queue_loses_none() {
        let store = Arc::new(MemoryTraces::new(3600, 1_000, 1 << 30));
        let tracer = Tracer::new(store, "n".into(), Duration::from_secs(1), callbacks());
        let trace = tracer.start(None).await.expect("trace");
        let users = QUEUE + 1_000;
        let ids: Vec<Arc<str>> = (0..users).map(|u| format!("u{u}").into()).collect();
        let device: Arc<str> = "d".into();
        // No await between the events: on this one-thread runtime the
        // writer task cannot run meanwhile.
        for u in &ids {
            for state in [TraceState::Dispatched, TraceState::Delivered] {
                tracer.record(&trace, u, &device, ClientType::Mobile, state, None);
            }
        }
        assert_eq!(tracer.dropped.load(Ordering::Relaxed), 0);
        assert_eq!(tracer.queued(), 0);
        let view = tracer.get(&trace).await.expect("get").expect("the trace");
        assert_eq!(view.recipients.len(), users);
        for r in &view.recipients {
            assert_eq!(r.state, TraceState::Delivered, "{}", r.user_id);
            let states: Vec<TraceState> = r.history.iter().map(|h| h.0).collect();
            assert_eq!(states, [TraceState::Dispatched, TraceState::Delivered]);
        }
    }

    fn conn_info(device: &str) -> ConnInfo {
        let device = mpush_protocol::session::DeviceInfo {
            device_id: device.into(),
            os_name: "Android".into(),
            os_version: "14".into(),
            client_version: "0.8.1".into(),
        };
        ConnInfo::new(
            1,
            &device,
            mpush_protocol::session::Profile::V2,
            crate::route::Transport::Tcp,
            0,
        )
    }

    /// A hand-over loop's DISPATCHED events are recorded together, when
    /// the batch flushes or is dropped: a connection that wrote its copy
    /// first (DELIVERED recorded before) still shows DISPATCHED, then
    /// DELIVERED, and its state stays DELIVERED. A broadcast's hand-overs
    /// in a batch are counted, its failures named.
    #[tokio::test]
    async fn a_batch_of_hand_overs_lands_in_time_order_when_dropped() {
        let store = Arc::new(MemoryTraces::new(3600, 1_000, 1 << 30));
        let tracer = Tracer::new(
            store.clone(),
            "n".into(),
            Duration::from_secs(1),
            callbacks(),
        );
        let trace = tracer.start(None).await.expect("trace");
        let info = conn_info("d1");
        let users: Vec<Arc<str>> = (0..600).map(|u| format!("u{u}").into()).collect();
        let handed = unix_ms();
        {
            let mut batch = tracer.batch();
            for u in &users {
                batch.conn(&trace, u, &info, TraceState::Dispatched, None, handed);
            }
            // The first 512 are flushed already (two batches' worth); the
            // rest wait while their connections write.
            for u in &users {
                tracer.conn(&trace, u, &info, TraceState::Delivered, None);
            }
        }
        let view = tracer.get(&trace).await.expect("get").expect("the trace");
        assert_eq!(view.recipients.len(), users.len());
        for r in &view.recipients {
            assert_eq!(r.state, TraceState::Delivered, "{}", r.user_id);
            let states: Vec<TraceState> = r.history.iter().map(|h| h.0).collect();
            assert_eq!(
                states,
                [TraceState::Dispatched, TraceState::Delivered],
                "{}",
                r.user_id
            );
        }

        // A broadcast's: its hand-overs become counts, a failure is named.
        let b = tracer.start(None).await.expect("trace");
        tracer.broadcast(&b, 2);
        {
            let mut batch = tracer.batch();
            batch.conn(&b, &users[0], &info, TraceState::Delivered, None, handed);
            let why = Some("slow consumer".into());
            batch.conn(&b, &users[1], &info, TraceState::Failed, why, handed);
        }
        let live = tracer.live.get(&b).expect("live").value().take();
        assert_eq!(live.get(TraceState::Delivered), 1);
        assert_eq!(live.get(TraceState::Failed), 1);
        let view = tracer.get(&b).await.expect("get").expect("the trace");
        assert!(view.recipients.is_empty(), "{:?}", view.recipients);
    }
}
