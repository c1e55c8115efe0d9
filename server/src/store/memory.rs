//! The embedded default: everything in process memory, with the same expiry
//! rules the Redis implementations apply.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

use async_trait::async_trait;
use mpush_protocol::session::SessionRecord;
use parking_lot::Mutex;

use super::{
    InboxFull, InboxStore, RecipientState, SessionStore, StoredMessage, TopicFull, TopicStore,
    TraceEvent, TraceState, TraceStore, TraceView,
};
use crate::clock::unix_ms;

/// Sessions, bounded by count and by bytes: over either bound the oldest are
/// forgotten (their clients fall back to a full handshake; nothing is lost).
pub struct MemorySessions {
    max: usize,
    max_bytes: usize,
    inner: Mutex<SessionMap>,
}

#[derive(Default)]
struct SessionMap {
    map: HashMap<String, SessionRecord>,
    /// Insertion order; ids of replaced or expired records are skipped.
    order: VecDeque<String>,
    bytes: usize,
}

/// What a record costs in memory, roughly: its strings and a fixed overhead.
fn session_bytes(r: &SessionRecord) -> usize {
    let d = &r.device;
    2 * r.session_id.len()
        + d.device_id.len()
        + d.os_name.len()
        + d.os_version.len()
        + d.client_version.len()
        + 160
}

impl MemorySessions {
    pub fn new(max: usize, max_bytes: usize) -> Self {
        Self {
            max: max.max(1),
            max_bytes,
            inner: Mutex::new(SessionMap::default()),
        }
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }
}

impl Default for MemorySessions {
    fn default() -> Self {
        Self::new(1_000_000, 256 << 20)
    }
}

#[async_trait]
impl SessionStore for MemorySessions {
    async fn put(&self, record: SessionRecord) {
        let mut g = self.inner.lock();
        let m = &mut *g;
        let size = session_bytes(&record);
        let id = record.session_id.clone();
        if let Some(old) = m.map.insert(id.clone(), record) {
            m.bytes -= session_bytes(&old);
        } else {
            m.order.push_back(id);
        }
        m.bytes += size;
        // Every session lives as long: the oldest expire first.
        let now = unix_ms();
        while let Some(id) = m.order.front() {
            if m.map.get(id).is_some_and(|r| r.expire_at_ms > now) {
                break;
            }
            if let Some(id) = m.order.pop_front()
                && let Some(old) = m.map.remove(&id)
            {
                m.bytes -= session_bytes(&old);
            }
        }
        while m.map.len() > self.max || m.bytes > self.max_bytes {
            let Some(id) = m.order.pop_front() else {
                break;
            };
            if let Some(old) = m.map.remove(&id) {
                m.bytes -= session_bytes(&old);
                metrics::counter!("mpush_sessions_evicted_total").increment(1);
            }
        }
        if m.order.len() > 2 * m.map.len() + 1024 {
            let live = &m.map;
            m.order.retain(|id| live.contains_key(id));
        }
    }

    async fn remove(&self, session_id: &str) -> bool {
        let mut g = self.inner.lock();
        match g.map.remove(session_id) {
            Some(old) => {
                g.bytes -= session_bytes(&old);
                true
            }
            None => false,
        }
    }

    async fn get(&self, session_id: &str) -> Option<SessionRecord> {
        let now = unix_ms();
        self.inner
            .lock()
            .map
            .get(session_id)
            .filter(|r| r.expire_at_ms > now)
            .cloned()
    }
}

struct TraceEntry {
    created_at_ms: i64,
    expires_at_ms: i64,
    recipients: Vec<RecipientState>,
    /// (user, device) → index in `recipients`; a device-less offline
    /// placeholder is under (user, ""). A broadcast records one event per
    /// recipient: finding it must not scan them all.
    index: HashMap<(String, String), usize>,
    /// What this entry costs, roughly (counted into `MemoryTraces::bytes`).
    size: usize,
}

/// History entries kept per recipient: the first ones and the latest.
const MAX_HISTORY: usize = 16;

fn event_bytes(detail: Option<&String>) -> usize {
    32 + detail.map_or(0, String::len)
}

pub struct MemoryTraces {
    ttl_ms: i64,
    /// Oldest traces are forgotten beyond this many (memory stays bounded).
    max: usize,
    map: Mutex<HashMap<String, TraceEntry>>,
    /// Creation order, for expiry.
    order: Mutex<VecDeque<(i64, String)>>,
    max_bytes: usize,
    bytes: AtomicUsize,
}

impl MemoryTraces {
    pub fn new(ttl_secs: u64, max: usize, max_bytes: usize) -> Self {
        Self {
            ttl_ms: i64::try_from(ttl_secs).unwrap_or(i64::MAX / 1000) * 1000,
            max: max.max(1),
            map: Mutex::new(HashMap::new()),
            order: Mutex::new(VecDeque::new()),
            max_bytes,
            bytes: AtomicUsize::new(0),
        }
    }

    /// Bytes held by traces, roughly.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Relaxed)
    }

    fn forget(&self, map: &mut HashMap<String, TraceEntry>, id: &str) {
        if let Some(e) = map.remove(id) {
            self.bytes.fetch_sub(e.size, Relaxed);
        }
    }

    /// Oldest traces go while over the byte bound.
    fn shrink(&self) {
        while self.bytes() > self.max_bytes {
            let Some((_, id)) = self.order.lock().pop_front() else {
                return;
            };
            self.forget(&mut self.map.lock(), &id);
            metrics::counter!("mpush_traces_evicted_total").increment(1);
        }
    }

    fn expire(&self, now: i64) {
        let mut order = self.order.lock();
        while order.front().is_some_and(|(exp, _)| *exp <= now) {
            if let Some((_, id)) = order.pop_front() {
                let mut map = self.map.lock();
                if map.get(&id).is_some_and(|e| e.expires_at_ms <= now) {
                    self.forget(&mut map, &id);
                }
            }
        }
    }
}

fn overall(recipients: &[RecipientState]) -> TraceState {
    // The least advanced recipient tells how far the message got for everyone.
    recipients
        .iter()
        .map(|r| r.state)
        .min_by_key(|s| s.rank())
        .unwrap_or(TraceState::Accepted)
}

impl MemoryTraces {
    /// Applies one event under the map's lock; returns the bytes it added.
    fn record_locked(&self, e: TraceEvent<'_>) -> usize {
        let mut map = self.map.lock();
        let Some(entry) = map.get_mut(e.trace_id) else {
            return 0;
        };
        let key = (e.user_id.to_owned(), e.device_id.to_owned());
        // The offline placeholder (no device) becomes the device that got it.
        let idx = entry.index.get(&key).copied().or_else(|| {
            let placeholder = (e.user_id.to_owned(), String::new());
            let i = entry.index.remove(&placeholder)?;
            entry.index.insert(key.clone(), i);
            Some(i)
        });
        let added = match idx {
            Some(i) => {
                let r = &mut entry.recipients[i];
                if r.device_id.is_empty() {
                    r.device_id = e.device_id.to_owned();
                    r.client_type = e.client_type;
                }
                // Keep how it started and how it is going.
                let dropped = if r.history.len() >= MAX_HISTORY {
                    event_bytes(r.history.remove(MAX_HISTORY / 2).2.as_ref())
                } else {
                    0
                };
                let added = event_bytes(e.detail.as_ref()).saturating_sub(dropped);
                r.history.push((e.state, e.at_ms, e.detail.clone()));
                if e.state.rank() >= r.state.rank() || r.state == TraceState::Offline {
                    r.state = e.state;
                    r.detail = e.detail;
                    r.updated_at_ms = e.at_ms;
                }
                added
            }
            None => {
                let added = 160
                    + 3 * (e.user_id.len() + e.device_id.len())
                    + 2 * event_bytes(e.detail.as_ref());
                entry.index.insert(key, entry.recipients.len());
                entry.recipients.push(RecipientState {
                    user_id: e.user_id.to_owned(),
                    device_id: e.device_id.to_owned(),
                    client_type: e.client_type,
                    state: e.state,
                    detail: e.detail.clone(),
                    updated_at_ms: e.at_ms,
                    history: vec![(e.state, e.at_ms, e.detail.clone())],
                });
                added
            }
        };
        entry.size += added;
        added
    }
}

#[async_trait]
impl TraceStore for MemoryTraces {
    async fn create(&self, trace_id: &str, at_ms: i64) {
        self.expire(at_ms);
        let expires_at_ms = at_ms.saturating_add(self.ttl_ms);
        let size = 64 + 2 * trace_id.len();
        if let std::collections::hash_map::Entry::Vacant(v) =
            self.map.lock().entry(trace_id.to_owned())
        {
            v.insert(TraceEntry {
                created_at_ms: at_ms,
                expires_at_ms,
                recipients: Vec::new(),
                index: HashMap::new(),
                size,
            });
            self.bytes.fetch_add(size, Relaxed);
        }
        let mut order = self.order.lock();
        order.push_back((expires_at_ms, trace_id.to_owned()));
        while order.len() > self.max {
            if let Some((_, old)) = order.pop_front() {
                self.forget(&mut self.map.lock(), &old);
            }
        }
        drop(order);
        self.shrink();
    }

    async fn record(&self, e: TraceEvent<'_>) {
        let added = self.record_locked(e);
        if added > 0 {
            self.bytes.fetch_add(added, Relaxed);
            self.shrink();
        }
    }

    async fn get(&self, trace_id: &str) -> Option<TraceView> {
        self.expire(unix_ms());
        let map = self.map.lock();
        let e = map.get(trace_id)?;
        Some(TraceView {
            trace_id: trace_id.to_owned(),
            created_at_ms: e.created_at_ms,
            state: overall(&e.recipients),
            recipients: e.recipients.clone(),
        })
    }
}

pub struct MemoryInbox {
    max: usize,
    map: Mutex<HashMap<String, VecDeque<StoredMessage>>>,
}

impl MemoryInbox {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            map: Mutex::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl InboxStore for MemoryInbox {
    async fn push(&self, user_id: &str, message: StoredMessage) -> Result<(), InboxFull> {
        let now = unix_ms();
        let mut map = self.map.lock();
        let q = map.entry(user_id.to_owned()).or_default();
        q.retain(|m| m.expires_at_ms > now);
        if q.iter().any(|m| m.message_id == message.message_id) {
            return Ok(());
        }
        if q.len() >= self.max {
            return Err(InboxFull(user_id.to_owned()));
        }
        q.push_back(message);
        Ok(())
    }

    async fn list(&self, user_id: &str, now_ms: i64) -> Vec<StoredMessage> {
        let mut map = self.map.lock();
        let Some(q) = map.get_mut(user_id) else {
            return Vec::new();
        };
        q.retain(|m| m.expires_at_ms > now_ms);
        let out: Vec<StoredMessage> = q.iter().cloned().collect();
        if q.is_empty() {
            map.remove(user_id);
        }
        out
    }

    async fn remove(&self, user_id: &str, message_id: u64) -> bool {
        let mut map = self.map.lock();
        let Some(q) = map.get_mut(user_id) else {
            return false;
        };
        let before = q.len();
        q.retain(|m| m.message_id != message_id);
        let removed = q.len() != before;
        if q.is_empty() {
            map.remove(user_id);
        }
        removed
    }

    async fn len(&self, user_id: &str) -> usize {
        self.map.lock().get(user_id).map_or(0, VecDeque::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn traces_are_bounded_by_bytes_and_history() {
        let t = MemoryTraces::new(3600, 1_000_000, 64 << 10);
        for i in 0..200 {
            let id = format!("trace-{i}");
            t.create(&id, unix_ms()).await;
            for u in 0..20 {
                let user = format!("user-{u}");
                t.record(TraceEvent {
                    trace_id: &id,
                    user_id: &user,
                    device_id: "device",
                    client_type: 1,
                    state: TraceState::Dispatched,
                    detail: None,
                    at_ms: unix_ms(),
                })
                .await;
            }
        }
        assert!(t.bytes() <= 64 << 10, "{}", t.bytes());
        assert!(t.get("trace-0").await.is_none(), "the oldest went");
        assert!(t.get("trace-199").await.is_some(), "the newest stays");
        // A retry storm does not grow one recipient's history without bound.
        for _ in 0..1000 {
            t.record(TraceEvent {
                trace_id: "trace-199",
                user_id: "user-1",
                device_id: "device",
                client_type: 1,
                state: TraceState::Dispatched,
                detail: Some("resent".into()),
                at_ms: unix_ms(),
            })
            .await;
        }
        let v = t.get("trace-199").await.expect("kept");
        let r = v
            .recipients
            .iter()
            .find(|r| r.user_id == "user-1")
            .expect("r");
        assert!(r.history.len() <= MAX_HISTORY);
    }

    #[tokio::test]
    async fn sessions_are_bounded_by_count_and_bytes() {
        use mpush_protocol::session::{DeviceInfo, SessionSecret};
        let s = MemorySessions::new(100, 1 << 20);
        let record = |i: usize, dev: usize| SessionRecord {
            session_id: format!("{i:032}"),
            device: DeviceInfo {
                device_id: "d".repeat(dev),
                ..Default::default()
            },
            secret: SessionSecret::Legacy {
                key: mpush_protocol::crypto::AesKey([1; 16]),
                iv: [2; 16],
            },
            expire_at_ms: unix_ms() + 60_000,
        };
        for i in 0..2000 {
            s.put(record(i, 16)).await;
        }
        assert_eq!(s.len(), 100);
        assert!(
            s.get(&format!("{:032}", 0)).await.is_none(),
            "oldest forgotten"
        );
        assert!(s.get(&format!("{:032}", 1999)).await.is_some());
        let s = MemorySessions::new(1_000_000, 1 << 20);
        for i in 0..2000 {
            s.put(record(i, 9000)).await;
        }
        assert!(s.bytes() <= 1 << 20, "{}", s.bytes());
    }

    #[tokio::test]
    async fn topics_are_bounded_per_user_and_per_topic() {
        let t = MemoryTopics::new(2, 3);
        assert_eq!(t.subscribe("a", "u").await, Ok(true));
        assert_eq!(t.subscribe("a", "u").await, Ok(false), "already there");
        assert_eq!(t.subscribe("b", "u").await, Ok(true));
        assert!(matches!(
            t.subscribe("c", "u").await,
            Err(TopicFull::User(..))
        ));
        assert!(t.unsubscribe("b", "u").await);
        assert_eq!(t.subscribe("c", "u").await, Ok(true), "a slot came back");
        for v in ["v", "w"] {
            assert_eq!(t.subscribe("a", v).await, Ok(true));
        }
        assert!(matches!(
            t.subscribe("a", "x").await,
            Err(TopicFull::Topic(..))
        ));
    }

    #[tokio::test]
    async fn traces_are_bounded_by_count() {
        let t = MemoryTraces::new(3600, 2, 1 << 30);
        for id in ["a", "b", "c"] {
            t.create(id, unix_ms()).await;
        }
        assert!(t.get("a").await.is_none(), "the oldest is forgotten");
        assert!(t.get("b").await.is_some() && t.get("c").await.is_some());
    }
}

pub struct MemoryTopics {
    max_topics_per_user: usize,
    max_subscribers: usize,
    inner: Mutex<TopicMaps>,
}

#[derive(Default)]
struct TopicMaps {
    topics: HashMap<String, HashSet<String>>,
    users: HashMap<String, HashSet<String>>,
}

impl MemoryTopics {
    pub fn new(max_topics_per_user: usize, max_subscribers: usize) -> Self {
        Self {
            max_topics_per_user,
            max_subscribers,
            inner: Mutex::new(TopicMaps::default()),
        }
    }
}

impl Default for MemoryTopics {
    fn default() -> Self {
        Self::new(256, 1_000_000)
    }
}

#[async_trait]
impl TopicStore for MemoryTopics {
    async fn subscribe(&self, topic: &str, user_id: &str) -> Result<bool, TopicFull> {
        let mut g = self.inner.lock();
        let m = &mut *g;
        if m.topics.get(topic).is_some_and(|s| s.contains(user_id)) {
            return Ok(false);
        }
        let subs = m.topics.get(topic).map_or(0, HashSet::len);
        if subs >= self.max_subscribers {
            return Err(TopicFull::Topic(topic.to_owned(), subs));
        }
        let mine = m.users.get(user_id).map_or(0, HashSet::len);
        if mine >= self.max_topics_per_user {
            return Err(TopicFull::User(user_id.to_owned(), mine));
        }
        m.topics
            .entry(topic.to_owned())
            .or_default()
            .insert(user_id.to_owned());
        m.users
            .entry(user_id.to_owned())
            .or_default()
            .insert(topic.to_owned());
        Ok(true)
    }

    async fn unsubscribe(&self, topic: &str, user_id: &str) -> bool {
        let mut g = self.inner.lock();
        let m = &mut *g;
        let Some(set) = m.topics.get_mut(topic) else {
            return false;
        };
        let removed = set.remove(user_id);
        if set.is_empty() {
            m.topics.remove(topic);
        }
        if let Some(t) = m.users.get_mut(user_id) {
            t.remove(topic);
            if t.is_empty() {
                m.users.remove(user_id);
            }
        }
        removed
    }

    async fn subscribers(&self, topic: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .inner
            .lock()
            .topics
            .get(topic)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}
