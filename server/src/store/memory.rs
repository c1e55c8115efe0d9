//! The embedded default: everything in process memory, with the same expiry
//! rules the Redis implementations apply.

use std::collections::{HashMap, HashSet, VecDeque};

use async_trait::async_trait;
use mpush_protocol::session::SessionRecord;
use parking_lot::Mutex;

use super::{
    InboxFull, InboxStore, RecipientState, SessionStore, StoredMessage, TopicStore, TraceEvent,
    TraceState, TraceStore, TraceView,
};
use crate::clock::unix_ms;

#[derive(Default)]
pub struct MemorySessions {
    map: Mutex<HashMap<String, SessionRecord>>,
}

#[async_trait]
impl SessionStore for MemorySessions {
    async fn put(&self, record: SessionRecord) {
        let now = unix_ms();
        let mut map = self.map.lock();
        if map.len().is_multiple_of(1024) {
            map.retain(|_, r| r.expire_at_ms > now);
        }
        map.insert(record.session_id.clone(), record);
    }

    async fn get(&self, session_id: &str) -> Option<SessionRecord> {
        let now = unix_ms();
        self.map
            .lock()
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
}

pub struct MemoryTraces {
    ttl_ms: i64,
    /// Oldest traces are forgotten beyond this many (memory stays bounded).
    max: usize,
    map: Mutex<HashMap<String, TraceEntry>>,
    /// Creation order, for expiry.
    order: Mutex<VecDeque<(i64, String)>>,
}

impl MemoryTraces {
    pub fn new(ttl_secs: u64, max: usize) -> Self {
        Self {
            ttl_ms: i64::try_from(ttl_secs).unwrap_or(i64::MAX / 1000) * 1000,
            max: max.max(1),
            map: Mutex::new(HashMap::new()),
            order: Mutex::new(VecDeque::new()),
        }
    }

    fn expire(&self, now: i64) {
        let mut order = self.order.lock();
        while order.front().is_some_and(|(exp, _)| *exp <= now) {
            if let Some((_, id)) = order.pop_front() {
                let mut map = self.map.lock();
                if map.get(&id).is_some_and(|e| e.expires_at_ms <= now) {
                    map.remove(&id);
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

#[async_trait]
impl TraceStore for MemoryTraces {
    async fn create(&self, trace_id: &str, at_ms: i64) {
        self.expire(at_ms);
        let expires_at_ms = at_ms.saturating_add(self.ttl_ms);
        self.map
            .lock()
            .entry(trace_id.to_owned())
            .or_insert(TraceEntry {
                created_at_ms: at_ms,
                expires_at_ms,
                recipients: Vec::new(),
                index: HashMap::new(),
            });
        let mut order = self.order.lock();
        order.push_back((expires_at_ms, trace_id.to_owned()));
        while order.len() > self.max {
            if let Some((_, old)) = order.pop_front() {
                self.map.lock().remove(&old);
            }
        }
    }

    async fn record(&self, e: TraceEvent<'_>) {
        let mut map = self.map.lock();
        let Some(entry) = map.get_mut(e.trace_id) else {
            return;
        };
        let key = (e.user_id.to_owned(), e.device_id.to_owned());
        // The offline placeholder (no device) becomes the device that got it.
        let idx = entry.index.get(&key).copied().or_else(|| {
            let placeholder = (e.user_id.to_owned(), String::new());
            let i = entry.index.remove(&placeholder)?;
            entry.index.insert(key.clone(), i);
            Some(i)
        });
        match idx {
            Some(i) => {
                let r = &mut entry.recipients[i];
                if r.device_id.is_empty() {
                    r.device_id = e.device_id.to_owned();
                    r.client_type = e.client_type;
                }
                r.history.push((e.state, e.at_ms, e.detail.clone()));
                if e.state.rank() >= r.state.rank() || r.state == TraceState::Offline {
                    r.state = e.state;
                    r.detail = e.detail;
                    r.updated_at_ms = e.at_ms;
                }
            }
            None => {
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
            }
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
    async fn traces_are_bounded_by_count() {
        let t = MemoryTraces::new(3600, 2);
        for id in ["a", "b", "c"] {
            t.create(id, unix_ms()).await;
        }
        assert!(t.get("a").await.is_none(), "the oldest is forgotten");
        assert!(t.get("b").await.is_some() && t.get("c").await.is_some());
    }
}

#[derive(Default)]
pub struct MemoryTopics {
    map: Mutex<HashMap<String, HashSet<String>>>,
}

#[async_trait]
impl TopicStore for MemoryTopics {
    async fn subscribe(&self, topic: &str, user_id: &str) -> bool {
        self.map
            .lock()
            .entry(topic.to_owned())
            .or_default()
            .insert(user_id.to_owned())
    }

    async fn unsubscribe(&self, topic: &str, user_id: &str) -> bool {
        let mut map = self.map.lock();
        let Some(set) = map.get_mut(topic) else {
            return false;
        };
        let removed = set.remove(user_id);
        if set.is_empty() {
            map.remove(topic);
        }
        removed
    }

    async fn subscribers(&self, topic: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .map
            .lock()
            .get(topic)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}
