//! Sinks: where events for the backend go (client up-pushes, connection
//! lifecycle events, delivery callbacks). Each sink is a bounded queue on
//! this node and workers that hand batches of events on (an HTTP POST, a
//! pipeline of `XADD`s), retrying with backoff and jitter for as long as the
//! far end fails; nothing leaves the queue until it was taken.
//!
//! An event is accepted by a sink when it is in its queue (an asynchronous
//! webhook) or once it was handed on (a synchronous webhook's 2xx, the
//! stream's `XADD`). `submit` waits for every sink that takes the event's
//! kind, within `accept_timeout`; a full queue refuses at once. Delivery
//! callbacks are not submitted but notified (a full queue drops them,
//! counted); pushes with callbacks wait for room first (`callback_room`), so
//! they come no faster than the backend takes their callbacks.
//!
//! Imports point down only: `config`, `clock`, `redis_conn`.

mod stream;
mod webhook;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

pub use crate::config::SinkEvent;
use crate::config::{Sinks as SinkSettings, WebhookMode};
use crate::redis_conn::RedisHandle;
pub use webhook::{SIGNATURE_HEADER, TIMESTAMP_HEADER, sign};

/// Why a far end did not take a batch (it is tried again with a backoff).
/// `target` is what the logs may show: `POST <url, masked>` or `XADD <key>`.
#[derive(Debug, thiserror::Error)]
enum DeliverError {
    /// No answer: connection refused, reset, TLS, a timeout on the way.
    #[error("{target}: {reason}")]
    Unreachable { target: String, reason: String },
    /// It answered, and not with success.
    #[error("{target}: {status}")]
    Refused { target: String, status: String },
    /// It did not answer within the store's timeout.
    #[error("{target}: Redis did not answer in time")]
    Timeout { target: String },
}

/// One far end: takes a batch of events (JSON objects) or fails.
#[async_trait]
trait Deliver: Send + Sync + 'static {
    async fn deliver(&self, events: &[Bytes]) -> Result<(), DeliverError>;
}

struct Item {
    event: Bytes,
    /// Fired once the event was handed on (synchronous acceptance).
    done: Option<oneshot::Sender<()>>,
    /// For a submitted event: whether a worker took it or the submitter
    /// withdrew it (a refused event is not handed on later).
    claim: Option<Arc<std::sync::atomic::AtomicU8>>,
}

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

/// A sink's bounded queue; its workers run until the `Sinks` is dropped.
struct Queue {
    name: Arc<str>,
    kinds: Vec<SinkEvent>,
    /// Accepted once handed on (else: once queued).
    sync: bool,
    tx: mpsc::Sender<Item>,
    dropped: AtomicU64,
    /// Events taken by a worker and not yet handed on.
    in_flight: Arc<AtomicUsize>,
    pace: Arc<Pace>,
}

/// What producers waiting for room in a queue watch (`Sinks::callback_room`).
#[derive(Default)]
struct Pace {
    /// Signalled whenever a worker takes a batch out of the queue.
    drained: tokio::sync::Notify,
    /// A worker's last delivery failed: the far end is down, and waiting
    /// for it would only slow the pushes.
    failing: std::sync::atomic::AtomicBool,
}

struct Worker {
    name: Arc<str>,
    rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Item>>>,
    far: Arc<dyn Deliver>,
    batch: usize,
    max_backoff: Duration,
    stop: watch::Receiver<()>,
    in_flight: Arc<AtomicUsize>,
    pace: Arc<Pace>,
}

impl Queue {
    #[allow(clippy::too_many_arguments)]
    fn start(
        name: String,
        kinds: Vec<SinkEvent>,
        sync: bool,
        far: Arc<dyn Deliver>,
        capacity: usize,
        batch: usize,
        concurrency: usize,
        max_backoff: Duration,
        stop: &watch::Receiver<()>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(capacity);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let name: Arc<str> = name.into();
        // This sink's series exist from start, at zero (telemetry::LABELS).
        for metric in [
            "mpush_sink_events_delivered_total",
            "mpush_sink_retries_total",
            "mpush_sink_refused_total",
        ] {
            metrics::counter!(metric, "sink" => name.to_string()).increment(0);
        }
        for k in &kinds {
            metrics::counter!("mpush_sink_events_dropped_total", "sink" => name.to_string(), "kind" => kind_name(*k))
                .increment(0);
        }
        metrics::gauge!("mpush_sink_queue_depth", "sink" => name.to_string()).set(0.0);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let pace = Arc::new(Pace::default());
        for _ in 0..concurrency {
            tokio::spawn(
                Worker {
                    name: name.clone(),
                    rx: rx.clone(),
                    far: far.clone(),
                    batch,
                    max_backoff,
                    stop: stop.clone(),
                    in_flight: in_flight.clone(),
                    pace: pace.clone(),
                }
                .run(),
            );
        }
        Self {
            name,
            kinds,
            sync,
            tx,
            dropped: AtomicU64::new(0),
            in_flight,
            pace,
        }
    }

    /// Over half of the queue waits for a worker, and the far end is not
    /// known to be down.
    fn behind(&self) -> bool {
        self.tx.max_capacity() - self.tx.capacity() > self.tx.max_capacity() / 2
            && !self.pace.failing.load(Ordering::Relaxed)
    }

    /// Waits while the queue is `behind`, woken as workers take batches.
    async fn room(&self) {
        loop {
            let drained = self.pace.drained.notified();
            if !self.behind() {
                return;
            }
            drained.await;
        }
    }

    fn takes(&self, kind: SinkEvent) -> bool {
        self.kinds.contains(&kind)
    }

    /// Events not yet handed on: queued or in a worker's batch.
    fn depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity() + self.in_flight.load(Ordering::Relaxed)
    }

    fn offer(
        &self,
        event: Bytes,
        done: Option<oneshot::Sender<()>>,
        claim: Option<Arc<std::sync::atomic::AtomicU8>>,
    ) -> Result<(), Bytes> {
        self.tx
            .try_send(Item { event, done, claim })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(i) | mpsc::error::TrySendError::Closed(i) => {
                    i.event
                }
            })
    }

    /// Best effort: a full queue counts the event as dropped (and says so).
    fn notify(&self, kind: SinkEvent, event: Bytes) {
        if self.offer(event, None, None).is_err() {
            metrics::counter!("mpush_sink_events_dropped_total", "sink" => self.name.to_string(), "kind" => kind_name(kind)).increment(1);
            if self
                .dropped
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(1000)
            {
                tracing::warn!(sink = %self.name, kind = kind_name(kind), "sink queue full: event dropped");
            }
        }
    }
}

impl Worker {
    async fn run(mut self) {
        let mut buf = Vec::with_capacity(self.batch);
        loop {
            let n = {
                let mut rx = self.rx.lock().await;
                tokio::select! {
                    n = rx.recv_many(&mut buf, self.batch) => n,
                    _ = self.stop.changed() => return,
                }
            };
            if n == 0 {
                return;
            }
            self.pace.drained.notify_waiters();
            // Events their submitter withdrew (refused to the client) are
            // not handed on.
            buf.retain(|i| {
                i.claim.as_ref().is_none_or(|c| {
                    c.compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                })
            });
            let n = buf.len();
            if n == 0 {
                continue;
            }
            self.in_flight.fetch_add(n, Ordering::Relaxed);
            let events: Vec<Bytes> = buf.iter().map(|i| i.event.clone()).collect();
            let mut attempt: u32 = 0;
            loop {
                match self.far.deliver(&events).await {
                    Ok(()) => {
                        self.pace.failing.store(false, Ordering::Relaxed);
                        break;
                    }
                    Err(e) => {
                        self.pace.failing.store(true, Ordering::Relaxed);
                        attempt += 1;
                        metrics::counter!("mpush_sink_retries_total", "sink" => self.name.to_string())
                            .increment(1);
                        if attempt == 1 || attempt.is_multiple_of(20) {
                            tracing::warn!(sink = %self.name, attempt, error = %e, events = n, "sink delivery failed; retrying");
                        }
                        let wait = backoff(attempt, self.max_backoff);
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = self.stop.changed() => return,
                        }
                    }
                }
            }
            metrics::counter!("mpush_sink_events_delivered_total", "sink" => self.name.to_string())
                .increment(n as u64);
            self.in_flight.fetch_sub(n, Ordering::Relaxed);
            for i in buf.drain(..) {
                if let Some(d) = i.done {
                    let _ = d.send(());
                }
            }
            if buf.capacity() > self.batch {
                buf = Vec::with_capacity(self.batch);
            }
        }
    }
}

/// 100 ms doubling to `max`, with full jitter over its upper half.
fn backoff(attempt: u32, max: Duration) -> Duration {
    let base = Duration::from_millis(100)
        .saturating_mul(1 << attempt.saturating_sub(1).min(16))
        .min(max);
    let half = base / 2;
    let ms = u64::try_from(half.as_millis()).unwrap_or(u64::MAX).max(1);
    half + Duration::from_millis(crate::clock::random_below(ms))
}

fn kind_name(k: SinkEvent) -> &'static str {
    match k {
        SinkEvent::UpPush => "up_push",
        SinkEvent::Lifecycle => "lifecycle",
        SinkEvent::Callback => "callback",
    }
}

/// Why `submit` did not get an event accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No sink takes this kind of event.
    #[error("no sink is configured for {0}")]
    NoSink(&'static str),
    /// Full, or did not accept in time: try again later.
    #[error("{0}")]
    Busy(String),
}

/// Every sink of this node.
pub struct Sinks {
    queues: Vec<Queue>,
    /// Per-push callback URLs (the allow-list) and their queues.
    callback_urls: Vec<(String, Queue)>,
    accept_timeout: Duration,
    /// Dropped: every worker stops.
    _stop: watch::Sender<()>,
}

impl Sinks {
    /// Starts the workers of every configured sink (`redis`: the cluster's,
    /// for the stream sink; validation made sure it is there if needed).
    pub fn start(cfg: &SinkSettings, redis: Option<RedisHandle>) -> Self {
        let (stop_tx, stop) = watch::channel(());
        let mut queues = Vec::new();
        for (i, w) in cfg.webhooks.iter().enumerate() {
            tracing::info!(sink = i, url = %crate::redact::mask_url(&w.url), mode = ?w.mode, events = ?w.events, "webhook sink");
            let far = Arc::new(webhook::Webhook::new(&w.url, &w.secret, w.timeout_ms));
            queues.push(Queue::start(
                format!("webhook{i}"),
                w.events.clone(),
                w.mode == WebhookMode::Sync,
                far,
                w.queue,
                w.batch,
                w.concurrency,
                Duration::from_millis(w.max_backoff_ms),
                &stop,
            ));
        }
        if let (Some(st), Some(redis)) = (&cfg.stream, redis) {
            tracing::info!(key = %st.key, maxlen = st.maxlen, events = ?st.events, "Redis Stream sink");
            let far = Arc::new(stream::Stream::new(redis, &st.key, st.maxlen));
            queues.push(Queue::start(
                "stream".into(),
                st.events.clone(),
                true,
                far,
                100_000,
                512,
                2,
                Duration::from_secs(5),
                &stop,
            ));
        }
        let callback_urls = cfg
            .callback_urls
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let far = Arc::new(webhook::Webhook::new(u, &cfg.callback_secret, 5_000));
                let q = Queue::start(
                    format!("callback{i}"),
                    vec![SinkEvent::Callback],
                    false,
                    far,
                    10_000,
                    100,
                    2,
                    Duration::from_secs(30),
                    &stop,
                );
                (u.clone(), q)
            })
            .collect();
        Self {
            queues,
            callback_urls,
            accept_timeout: Duration::from_millis(cfg.accept_timeout_ms),
            _stop: stop_tx,
        }
    }

    /// Some sink takes events of `kind` (callers skip building them otherwise).
    pub fn wants(&self, kind: SinkEvent) -> bool {
        self.queues.iter().any(|q| q.takes(kind))
    }

    /// Backpressure for delivery callbacks: while a queue that takes them
    /// (the callback sinks; with `url`, that allow-listed URL's queue) is
    /// over half full and its far end is not failing, waits for its
    /// workers, up to the acceptance timeout (`sinks.accept_timeout_ms`). A flood of pushes with callbacks then
    /// goes at the pace the backend takes their callbacks instead of
    /// overflowing the queue (its events dropped); past the timeout the push
    /// goes on, and a full queue counts what it drops.
    pub async fn callback_room(&self, url: Option<&str>) {
        let queues: Vec<&Queue> = match url {
            None => self
                .queues
                .iter()
                .filter(|q| q.takes(SinkEvent::Callback))
                .collect(),
            Some(u) => self
                .callback_urls
                .iter()
                .filter(|(url, _)| url == u)
                .map(|(_, q)| q)
                .collect(),
        };
        if queues.iter().all(|q| !q.behind()) {
            return;
        }
        metrics::counter!("mpush_sink_backpressure_waits_total").increment(1);
        let waited = tokio::time::timeout(self.accept_timeout, async {
            for q in queues {
                q.room().await;
            }
        })
        .await;
        if waited.is_err() {
            metrics::counter!("mpush_sink_backpressure_timeouts_total").increment(1);
        }
    }

    /// `url` is on the callback allow-list.
    pub fn allows_callback_url(&self, url: &str) -> bool {
        self.callback_urls.iter().any(|(u, _)| u == url)
    }

    /// Hands `event` to every sink that takes `kind`; Ok once each accepted
    /// it. A refusal may come after some sink accepted: the client sends it
    /// again, and the backend deduplicates by the event's id.
    pub async fn submit(&self, kind: SinkEvent, event: Bytes) -> Result<(), Refusal> {
        let mut waits = Vec::new();
        let mut claims = Vec::new();
        let mut any = false;
        let withdraw = |claims: &[Arc<std::sync::atomic::AtomicU8>]| {
            // What no worker took yet is withdrawn: a refused event is not
            // handed on later (what was taken carries the same id when the
            // client sends it again).
            for c in claims {
                let _ = c.compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire);
            }
        };
        for q in self.queues.iter().filter(|q| q.takes(kind)) {
            any = true;
            let (done, wait) = if q.sync {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            } else {
                (None, None)
            };
            let claim = Arc::new(std::sync::atomic::AtomicU8::new(QUEUED));
            if q.offer(event.clone(), done, Some(claim.clone())).is_err() {
                metrics::counter!("mpush_sink_refused_total", "sink" => q.name.to_string())
                    .increment(1);
                withdraw(&claims);
                return Err(Refusal::Busy(format!("{} is full", q.name)));
            }
            claims.push(claim);
            if let Some(w) = wait {
                waits.push((q.name.clone(), w));
            }
        }
        if !any {
            return Err(Refusal::NoSink(kind_name(kind)));
        }
        let deadline = tokio::time::Instant::now() + self.accept_timeout;
        for (name, w) in waits {
            match tokio::time::timeout_at(deadline, w).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    withdraw(&claims);
                    return Err(Refusal::Busy(format!("{name} stopped")));
                }
                Err(_) => {
                    metrics::counter!("mpush_sink_refused_total", "sink" => name.to_string())
                        .increment(1);
                    withdraw(&claims);
                    return Err(Refusal::Busy(format!("{name} did not accept in time")));
                }
            }
        }
        Ok(())
    }

    /// Hands `event` to every sink that takes `kind`, without waiting; a full
    /// queue counts it dropped (`mpush_sink_events_dropped_total`).
    pub fn notify(&self, kind: SinkEvent, event: Bytes) {
        for q in self.queues.iter().filter(|q| q.takes(kind)) {
            q.notify(kind, event.clone());
        }
    }

    /// A callback to an allow-listed URL of its own.
    pub fn notify_url(&self, url: &str, event: Bytes) {
        if let Some((_, q)) = self.callback_urls.iter().find(|(u, _)| u == url) {
            q.notify(SinkEvent::Callback, event);
        }
    }

    /// Events not yet handed on, per sink (for the metrics gauge).
    pub fn depths(&self) -> Vec<(Arc<str>, usize)> {
        self.queues
            .iter()
            .chain(self.callback_urls.iter().map(|(_, q)| q))
            .map(|q| (q.name.clone(), q.depth()))
            .collect()
    }

    /// Waits (up to `limit`) until every queue is empty: a node that stops
    /// hands on what it holds first.
    pub async fn flush(&self, limit: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left: usize = self.depths().iter().map(|(_, n)| n).sum();
            if left == 0 || tokio::time::Instant::now() >= deadline {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter() {
        let max = Duration::from_secs(30);
        for a in 1..40 {
            let d = backoff(a, max);
            assert!(d <= max, "{a}: {d:?}");
            assert!(d >= Duration::from_millis(50), "{a}: {d:?}");
        }
        assert!(backoff(1, max) <= Duration::from_millis(100));
        assert!(backoff(30, max) >= Duration::from_secs(15));
    }

    /// A far end that never answers, or always fails.
    struct Far(bool);

    #[async_trait]
    impl Deliver for Far {
        async fn deliver(&self, _: &[Bytes]) -> Result<(), DeliverError> {
            if self.0 {
                return Err(DeliverError::Unreachable {
                    target: "test".into(),
                    reason: "down".into(),
                });
            }
            std::future::pending().await
        }
    }

    /// One callback sink of 100 events over `far`, 70 of them queued.
    async fn callback_sink(fails: bool, accept: Duration) -> Sinks {
        let (stop_tx, stop) = watch::channel(());
        let q = Queue::start(
            "cb".into(),
            vec![SinkEvent::Callback],
            false,
            Arc::new(Far(fails)),
            100,
            10,
            1,
            Duration::from_millis(50),
            &stop,
        );
        for _ in 0..70 {
            assert!(q.offer(Bytes::from_static(b"{}"), None, None).is_ok());
        }
        // The worker takes its first batch (and hangs on it, or fails it).
        tokio::time::sleep(Duration::from_millis(100)).await;
        Sinks {
            queues: vec![q],
            callback_urls: Vec::new(),
            accept_timeout: accept,
            _stop: stop_tx,
        }
    }

    /// A backend that hangs holds a push with callbacks for the acceptance
    /// timeout at most; one that fails holds it not at all.
    #[tokio::test]
    async fn waiting_for_callback_room_is_bounded_and_skipped_while_the_backend_fails() {
        let accept = Duration::from_millis(300);
        let hangs = callback_sink(false, accept).await;
        assert!(hangs.queues[0].behind());
        let t = std::time::Instant::now();
        hangs.callback_room(None).await;
        let waited = t.elapsed();
        assert!(waited >= accept && waited < accept * 4, "{waited:?}");
        // A URL no queue serves has nothing to wait for.
        let t = std::time::Instant::now();
        hangs.callback_room(Some("http://elsewhere/")).await;
        assert!(t.elapsed() < accept / 2);

        let fails = callback_sink(true, accept).await;
        assert!(
            !fails.queues[0].behind(),
            "a failing far end is not waited for"
        );
        let t = std::time::Instant::now();
        fails.callback_room(None).await;
        assert!(t.elapsed() < accept / 2, "{:?}", t.elapsed());
    }
}
