//! The embedded default: everything in process memory, with the same expiry
//! rules the Redis implementations apply.
//!
//! One file per backend, as `redis.rs`: the five stores' in-memory forms
//! side by side, so their bounds (count and bytes) read alike; a third is
//! their tests.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use async_trait::async_trait;
use mpush_protocol::session::{DeviceInfo, KeptBinding, SessionRecord, SessionSecret};
use parking_lot::Mutex;

use super::{
    BroadcastView, Failure, InboxError, InboxStore, MAX_FAILURES, MAX_HISTORY, RecipientState,
    SessionStore, StateCounts, StoreError, StoredMessage, TopicFull, TopicStore, TraceCounts,
    TraceEvent, TraceState, TraceStore, TraceView,
};
use crate::clock::unix_ms;

/// Sessions, bounded by count and by bytes: over either bound the oldest are
/// forgotten (their clients fall back to a full handshake; nothing is lost).
/// Every live connection has one, so each is kept compact: the id shared by
/// the map and the expiry order, the device's four fields in one string.
pub struct MemorySessions {
    max: usize,
    max_bytes: usize,
    inner: Mutex<SessionMap>,
}

#[derive(Default)]
struct SessionMap {
    map: HashMap<Arc<str>, Packed>,
    /// Insertion order; ids of replaced or expired records are skipped.
    order: VecDeque<Arc<str>>,
    bytes: usize,
}

/// A `SessionRecord` without its id in one string: `<n>:` and the kept
/// binding's `n` bytes (ADR 0008, see `pack`; `0:` for none), then the
/// device fields joined by `\0`. One allocation per session, a kept binding
/// or not.
struct Packed {
    fields: Box<str>,
    secret: SessionSecret,
    expire_at_ms: i64,
}

impl Packed {
    fn new(r: SessionRecord) -> Self {
        let d = &r.device;
        let device = [
            d.device_id.as_str(),
            &d.os_name,
            &d.os_version,
            &d.client_version,
        ];
        Self {
            fields: pack(r.binding.as_ref(), &device),
            secret: r.secret,
            expire_at_ms: r.expire_at_ms,
        }
    }

    /// The packed binding (if any) and the device part.
    fn parts(&self) -> (Option<&str>, &str) {
        let Some((n, rest)) = self.fields.split_once(':') else {
            return (None, &self.fields);
        };
        let n: usize = n.parse().unwrap_or(0);
        match (rest.get(..n), rest.get(n..)) {
            (Some(b), Some(device)) => ((n > 0).then_some(b), device),
            _ => (None, rest),
        }
    }

    fn set_binding(&mut self, binding: Option<&KeptBinding>) {
        let fields = pack(binding, &[self.parts().1]);
        self.fields = fields;
    }

    fn unpack(&self, session_id: &str) -> SessionRecord {
        let (binding, device) = self.parts();
        let mut f = device.split('\0').map(str::to_owned);
        let mut next = || f.next().unwrap_or_default();
        SessionRecord {
            session_id: session_id.to_owned(),
            device: DeviceInfo {
                device_id: next(),
                os_name: next(),
                os_version: next(),
                client_version: next(),
            },
            secret: self.secret.clone(),
            expire_at_ms: self.expire_at_ms,
            binding: binding.and_then(unpack_binding),
        }
    }

    /// What it costs in memory, roughly: the map slot, the id (shared with
    /// the order queue) and the packed string.
    fn bytes(&self, id: &str) -> usize {
        128 + id.len() + self.fields.len()
    }
}

/// `Packed::fields` in one allocation of its exact size: every full
/// handshake and fast connect stores a session, so no `format!` and no
/// intermediate strings here. `device` is joined with `\0`.
fn pack(binding: Option<&KeptBinding>, device: &[&str]) -> Box<str> {
    // `<expiry>:<user id length>:<user id><tags>`: length-prefixed, so no
    // byte of a user id or tags can move a field.
    let (mut exp, mut ulen) = (itoa::Buffer::new(), itoa::Buffer::new());
    let b = binding.map(|b| (exp.format(b.expires_at_ms), ulen.format(b.user_id.len()), b));
    let b_len = b.map_or(0, |(e, u, b)| {
        e.len() + u.len() + 2 + b.user_id.len() + b.tags.len()
    });
    let mut n = itoa::Buffer::new();
    let n = n.format(b_len);
    let d_len = device.iter().map(|d| d.len()).sum::<usize>() + device.len().saturating_sub(1);
    let mut s = String::with_capacity(n.len() + 1 + b_len + d_len);
    s.push_str(n);
    s.push(':');
    if let Some((e, u, b)) = b {
        for part in [e, ":", u, ":", &b.user_id, &b.tags] {
            s.push_str(part);
        }
    }
    for (i, d) in device.iter().enumerate() {
        if i > 0 {
            s.push('\0');
        }
        s.push_str(d);
    }
    // Exact: `into_boxed_str` keeps the allocation as it is.
    debug_assert_eq!(s.len(), s.capacity());
    s.into_boxed_str()
}

fn unpack_binding(s: &str) -> Option<KeptBinding> {
    let (exp, rest) = s.split_once(':')?;
    let (len, rest) = rest.split_once(':')?;
    let len: usize = len.parse().ok()?;
    Some(KeptBinding {
        user_id: rest.get(..len)?.to_owned(),
        tags: rest.get(len..)?.to_owned(),
        expires_at_ms: exp.parse().ok()?,
    })
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
    async fn put(&self, record: SessionRecord) -> Result<(), StoreError> {
        let mut g = self.inner.lock();
        let m = &mut *g;
        let id: Arc<str> = record.session_id.as_str().into();
        let packed = Packed::new(record);
        let size = packed.bytes(&id);
        if let Some(old) = m.map.insert(id.clone(), packed) {
            m.bytes -= old.bytes(&id);
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
                m.bytes -= old.bytes(&id);
            }
        }
        while m.map.len() > self.max || m.bytes > self.max_bytes {
            let Some(id) = m.order.pop_front() else {
                break;
            };
            if let Some(old) = m.map.remove(&id) {
                m.bytes -= old.bytes(&id);
                metrics::counter!("mpush_sessions_evicted_total").increment(1);
            }
        }
        if m.order.len() > 2 * m.map.len() + 1024 {
            let live = &m.map;
            m.order.retain(|id| live.contains_key(id));
        }
        Ok(())
    }

    async fn remove(&self, session_id: &str) -> Result<bool, StoreError> {
        let mut g = self.inner.lock();
        Ok(match g.map.remove(session_id) {
            Some(old) => {
                g.bytes -= old.bytes(session_id);
                true
            }
            None => false,
        })
    }

    async fn get(&self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let now = unix_ms();
        Ok(self
            .inner
            .lock()
            .map
            .get(session_id)
            .filter(|r| r.expire_at_ms > now)
            .map(|r| r.unpack(session_id)))
    }

    async fn set_binding(
        &self,
        session_id: &str,
        binding: Option<KeptBinding>,
    ) -> Result<bool, StoreError> {
        let now = unix_ms();
        let mut g = self.inner.lock();
        let m = &mut *g;
        let Some(r) = m.map.get_mut(session_id).filter(|r| r.expire_at_ms > now) else {
            return Ok(false);
        };
        let before = r.bytes(session_id);
        r.set_binding(binding.as_ref());
        m.bytes = m.bytes - before + r.bytes(session_id);
        Ok(true)
    }
}

/// A recipient's trace as the embedded store keeps it: the ids shared with
/// the index and the events (no copies), the first state changes inline. A
/// unicast's recipient costs no allocation of its own (a `RecipientState`
/// took four: both ids, the history and its growth to a second state);
/// `view` builds the answer's form when a trace is read.
struct Recipient {
    user_id: Arc<str>,
    /// Empty while the user was offline.
    device_id: Arc<str>,
    client_type: mpush_protocol::session::ClientType,
    state: TraceState,
    detail: Option<Box<str>>,
    updated_at_ms: i64,
    /// DISPATCHED and DELIVERED (or ACKED) fit inline.
    history: smallvec::SmallVec<[Change; 2]>,
}

/// One entry of a recipient's history: the state, when, and what happened.
type Change = (TraceState, i64, Option<Box<str>>);

impl Recipient {
    fn view(&self) -> RecipientState {
        RecipientState {
            user_id: self.user_id.to_string(),
            device_id: self.device_id.to_string(),
            client_type: self.client_type,
            state: self.state,
            detail: self.detail.as_deref().map(str::to_owned),
            updated_at_ms: self.updated_at_ms,
            history: self
                .history
                .iter()
                .map(|(s, at, d)| (*s, *at, d.as_deref().map(str::to_owned)))
                .collect(),
        }
    }
}

struct TraceEntry {
    created_at_ms: i64,
    expires_at_ms: i64,
    recipients: Vec<Recipient>,
    /// (user, device) → index in `recipients`; a device-less offline
    /// placeholder is under (user, "").
    index: HashMap<(Arc<str>, Arc<str>), usize>,
    /// How many of `index`'s keys are such placeholders: while none is, a
    /// recipient's first event looks nothing more up.
    placeholders: usize,
    /// A broadcast's counts per node, and its failures.
    counts: HashMap<Arc<str>, StateCounts>,
    /// The nodes that handed every copy on, and whether theirs wait for ACKs.
    handed: HashMap<Arc<str>, bool>,
    failures: Vec<Failure>,
    /// What this entry costs, roughly (counted into `MemoryTraces::bytes`).
    size: usize,
}

fn event_bytes(detail: Option<&str>) -> usize {
    32 + detail.map_or(0, str::len)
}

pub struct MemoryTraces {
    ttl_ms: i64,
    /// Oldest traces are forgotten beyond this many (memory stays bounded).
    max: usize,
    max_bytes: usize,
    inner: Mutex<TraceMap>,
}

#[derive(Default)]
struct TraceMap {
    map: HashMap<Arc<str>, TraceEntry>,
    /// Creation order, for expiry.
    order: VecDeque<(i64, Arc<str>)>,
    bytes: usize,
}

impl TraceMap {
    fn forget(&mut self, id: &str) {
        if let Some(e) = self.map.remove(id) {
            self.bytes -= e.size;
        }
    }

    /// Oldest traces go while over the byte bound.
    fn shrink(&mut self, max_bytes: usize) {
        while self.bytes > max_bytes {
            let Some((_, id)) = self.order.pop_front() else {
                return;
            };
            self.forget(&id);
            metrics::counter!("mpush_traces_evicted_total").increment(1);
        }
    }

    fn expire(&mut self, now: i64) {
        while self.order.front().is_some_and(|(exp, _)| *exp <= now) {
            if let Some((_, id)) = self.order.pop_front()
                && self.map.get(&id).is_some_and(|e| e.expires_at_ms <= now)
            {
                self.forget(&id);
            }
        }
    }

    /// Applies events of one trace; returns the bytes they added.
    fn record(&mut self, trace_id: &str, events: &[TraceEvent]) -> usize {
        let Some(entry) = self.map.get_mut(trace_id) else {
            return 0;
        };
        events.iter().map(|e| entry.record(e)).sum()
    }

    fn count(&mut self, c: &TraceCounts) -> usize {
        let Some(entry) = self.map.get_mut(&c.trace_id) else {
            return 0;
        };
        let mut added = 0;
        entry
            .counts
            .entry(c.node.clone())
            .or_insert_with(|| {
                added += 96 + c.node.len();
                StateCounts::default()
            })
            .merge(&c.counts);
        if let Some(ack) = c.handed {
            entry.handed.insert(c.node.clone(), ack);
        }
        for f in &c.failures {
            if entry.failures.len() >= MAX_FAILURES * entry.counts.len().max(1) {
                break;
            }
            added += 64 + f.user_id.len() + f.device_id.len();
            entry.failures.push(f.clone());
        }
        entry.size += added;
        added
    }
}

impl TraceEntry {
    /// Applies one event; returns the bytes it added.
    fn record(&mut self, e: &TraceEvent) -> usize {
        let key = (e.user_id.clone(), e.device_id.clone());
        // The offline placeholder (no device) becomes the device that got it.
        let idx = self.index.get(&key).copied().or_else(|| {
            if self.placeholders == 0 || e.device_id.is_empty() {
                return None;
            }
            let placeholder = (e.user_id.clone(), Arc::<str>::from(""));
            let i = self.index.remove(&placeholder)?;
            self.placeholders -= 1;
            self.index.insert(key.clone(), i);
            Some(i)
        });
        let detail = e.detail.as_deref().map(Box::<str>::from);
        let added = match idx {
            Some(i) => {
                let r = &mut self.recipients[i];
                if r.device_id.is_empty() {
                    r.device_id = e.device_id.clone();
                    r.client_type = e.client_type;
                }
                // Keep how it started and how it is going.
                let dropped = if r.history.len() >= MAX_HISTORY {
                    event_bytes(r.history.remove(MAX_HISTORY / 2).2.as_deref())
                } else {
                    0
                };
                let added = event_bytes(detail.as_deref()).saturating_sub(dropped);
                // In time order (a state's rank breaks a tie), as the Redis
                // store reads them: a hand-over's DISPATCHED, recorded with
                // its batch, can come after the DELIVERED of its write.
                let at = r
                    .history
                    .iter()
                    .rposition(|h| (h.1, h.0.rank()) <= (e.at_ms, e.state.rank()))
                    .map_or(0, |p| p + 1);
                r.history.insert(at, (e.state, e.at_ms, detail.clone()));
                if e.state.rank() >= r.state.rank() || r.state == TraceState::Offline {
                    r.state = e.state;
                    r.detail = detail;
                    r.updated_at_ms = e.at_ms;
                }
                added
            }
            None => {
                let added = 160
                    + 3 * (e.user_id.len() + e.device_id.len())
                    + 2 * event_bytes(detail.as_deref());
                self.placeholders += usize::from(key.1.is_empty());
                self.index.insert(key, self.recipients.len());
                self.recipients.push(Recipient {
                    user_id: e.user_id.clone(),
                    device_id: e.device_id.clone(),
                    client_type: e.client_type,
                    state: e.state,
                    detail: detail.clone(),
                    updated_at_ms: e.at_ms,
                    history: smallvec::smallvec![(e.state, e.at_ms, detail)],
                });
                added
            }
        };
        self.size += added;
        added
    }
}

impl MemoryTraces {
    pub fn new(ttl_secs: u64, max: usize, max_bytes: usize) -> Self {
        Self {
            ttl_ms: i64::try_from(ttl_secs).unwrap_or(i64::MAX / 1000) * 1000,
            max: max.max(1),
            max_bytes,
            inner: Mutex::new(TraceMap::default()),
        }
    }

    /// Bytes held by traces, roughly.
    pub fn bytes(&self) -> usize {
        self.inner.lock().bytes
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

/// A user's device-less entry (a forward hop, written by the forwarding
/// node) belongs to the device that got the message (written by the node
/// holding it). The two nodes write independently, so which came first is
/// not known: the entries are joined when read, histories in time order.
fn merge_placeholders(mut recipients: Vec<RecipientState>) -> Vec<RecipientState> {
    let mut i = 0;
    while i < recipients.len() {
        let r = &recipients[i];
        let target = (r.device_id.is_empty())
            .then(|| {
                recipients
                    .iter()
                    .position(|d| d.user_id == r.user_id && !d.device_id.is_empty())
            })
            .flatten();
        match target {
            Some(t) => {
                let p = recipients.remove(i);
                let t = if t > i { t - 1 } else { t };
                let d = &mut recipients[t];
                d.history.extend(p.history);
                d.history.sort_by_key(|h| h.1);
            }
            None => i += 1,
        }
    }
    recipients
}

/// A trace's view: its recipients, or a broadcast's counts.
pub(crate) fn view(
    trace_id: &str,
    created_at_ms: i64,
    recipients: Vec<RecipientState>,
    nodes: Vec<(String, StateCounts)>,
    handed: &std::collections::BTreeMap<String, bool>,
    nodes_expected: Option<u64>,
    failures: Vec<Failure>,
) -> TraceView {
    let recipients = merge_placeholders(recipients);
    let mut state = overall(&recipients);
    let broadcast = (!nodes.is_empty()).then(|| {
        let mut total = StateCounts::default();
        for (_, c) in &nodes {
            total.merge(c);
        }
        if recipients.is_empty() {
            state = total.overall();
        }
        // In a cluster, every node the broadcast reached must have reported.
        let finished = !handed.is_empty()
            && nodes_expected.is_none_or(|n| handed.len() as u64 >= n)
            && nodes
                .iter()
                .all(|(n, c)| handed.get(n).is_some_and(|ack| c.settled(*ack)));
        BroadcastView {
            matched: total.get(TraceState::Dispatched),
            finished,
            nodes_expected,
            total: total.named(),
            nodes: nodes.into_iter().map(|(n, c)| (n, c.named())).collect(),
            failures,
        }
    });
    TraceView {
        trace_id: trace_id.to_owned(),
        created_at_ms,
        state,
        recipients,
        broadcast,
    }
}

impl MemoryTraces {
    /// State changes under one lock, then the byte bound.
    fn apply(&self, events: &[TraceEvent]) {
        let mut m = self.inner.lock();
        let mut added = 0;
        // A batch's events come in runs of one trace: one lookup per run.
        for run in events.chunk_by(|a, b| a.trace_id == b.trace_id) {
            added += m.record(&run[0].trace_id, run);
        }
        m.bytes += added;
        m.shrink(self.max_bytes);
    }
}

#[async_trait]
impl TraceStore for MemoryTraces {
    async fn create(&self, trace_id: &str, at_ms: i64) -> Result<(), StoreError> {
        let mut m = self.inner.lock();
        m.expire(at_ms);
        let expires_at_ms = at_ms.saturating_add(self.ttl_ms);
        let size = 64 + 2 * trace_id.len();
        let id: Arc<str> = trace_id.into();
        if let std::collections::hash_map::Entry::Vacant(v) = m.map.entry(id.clone()) {
            v.insert(TraceEntry {
                created_at_ms: at_ms,
                expires_at_ms,
                recipients: Vec::new(),
                index: HashMap::default(),
                placeholders: 0,
                counts: HashMap::default(),
                handed: HashMap::default(),
                failures: Vec::new(),
                size,
            });
            m.bytes += size;
        }
        m.order.push_back((expires_at_ms, id));
        while m.order.len() > self.max {
            if let Some((_, old)) = m.order.pop_front() {
                m.forget(&old);
            }
        }
        m.shrink(self.max_bytes);
        Ok(())
    }

    async fn record(&self, events: &[TraceEvent]) -> Result<(), StoreError> {
        self.apply(events);
        Ok(())
    }

    fn record_now(&self, events: &[TraceEvent]) -> bool {
        self.apply(events);
        true
    }

    async fn count(&self, counts: &[TraceCounts]) -> Result<(), StoreError> {
        let mut m = self.inner.lock();
        let mut added = 0;
        for c in counts {
            added += m.count(c);
        }
        m.bytes += added;
        m.shrink(self.max_bytes);
        Ok(())
    }

    async fn get(&self, trace_id: &str) -> Result<Option<TraceView>, StoreError> {
        let mut m = self.inner.lock();
        m.expire(unix_ms());
        let Some(e) = m.map.get(trace_id) else {
            return Ok(None);
        };
        let mut nodes: Vec<(String, StateCounts)> =
            e.counts.iter().map(|(n, c)| (n.to_string(), *c)).collect();
        nodes.sort_by(|a, b| a.0.cmp(&b.0));
        let handed = e.handed.iter().map(|(n, a)| (n.to_string(), *a)).collect();
        Ok(Some(view(
            trace_id,
            e.created_at_ms,
            e.recipients.iter().map(Recipient::view).collect(),
            nodes,
            &handed,
            None,
            e.failures.clone(),
        )))
    }
}

pub struct MemoryInbox {
    max: usize,
    map: Mutex<HashMap<String, VecDeque<StoredMessage>>>,
    /// Messages held in all, kept with every change (for the gauge).
    total: std::sync::atomic::AtomicUsize,
}

impl MemoryInbox {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            map: Mutex::new(HashMap::new()),
            total: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn dropped(&self, n: usize) {
        if n > 0 {
            self.total
                .fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[async_trait]
impl InboxStore for MemoryInbox {
    async fn push(&self, user_id: &str, message: StoredMessage) -> Result<(), InboxError> {
        let now = unix_ms();
        let mut map = self.map.lock();
        let q = map.entry(user_id.to_owned()).or_default();
        let before = q.len();
        q.retain(|m| m.expires_at_ms > now);
        self.dropped(before - q.len());
        if q.iter().any(|m| m.message_id == message.message_id) {
            return Ok(());
        }
        if q.len() >= self.max {
            return Err(InboxError::Full(user_id.to_owned()));
        }
        q.push_back(message);
        self.total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    async fn list(&self, user_id: &str, now_ms: i64) -> Result<Vec<StoredMessage>, StoreError> {
        let mut map = self.map.lock();
        let Some(q) = map.get_mut(user_id) else {
            return Ok(Vec::new());
        };
        let before = q.len();
        q.retain(|m| m.expires_at_ms > now_ms);
        self.dropped(before - q.len());
        let out: Vec<StoredMessage> = q.iter().cloned().collect();
        if q.is_empty() {
            map.remove(user_id);
        }
        Ok(out)
    }

    async fn remove(&self, user_id: &str, message_id: u64) -> Result<bool, StoreError> {
        let mut map = self.map.lock();
        let Some(q) = map.get_mut(user_id) else {
            return Ok(false);
        };
        let before = q.len();
        q.retain(|m| m.message_id != message_id);
        self.dropped(before - q.len());
        let removed = q.len() != before;
        if q.is_empty() {
            map.remove(user_id);
        }
        Ok(removed)
    }

    async fn len(&self, user_id: &str) -> Result<usize, StoreError> {
        Ok(self.map.lock().get(user_id).map_or(0, VecDeque::len))
    }

    fn total_hint(&self) -> Option<usize> {
        Some(self.total.load(std::sync::atomic::Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_inbox_total_follows_every_change() {
        let inbox = MemoryInbox::new(10);
        let msg = |id: u64, expires_at_ms: i64| StoredMessage {
            message_id: id,
            trace_id: "t".into(),
            content: bytes::Bytes::from_static(b"x"),
            ack_mode: mpush_protocol::session::AckMode::Auto,
            client_type: None,
            expires_at_ms,
        };
        let later = unix_ms() + 60_000;
        inbox.push("u1", msg(1, later)).await.expect("room");
        inbox
            .push("u1", msg(1, later))
            .await
            .expect("a repeat is not added");
        inbox
            .push("u1", msg(2, unix_ms() + 50))
            .await
            .expect("room");
        inbox.push("u2", msg(3, later)).await.expect("room");
        assert_eq!(inbox.total_hint(), Some(3));
        assert!(inbox.remove("u2", 3).await.expect("removed"));
        assert_eq!(inbox.total_hint(), Some(2));
        // Expired messages leave the count when they are found.
        inbox.list("u1", unix_ms() + 1000).await.expect("list");
        assert_eq!(inbox.total_hint(), Some(1));
    }

    use super::*;

    fn ev(trace: &str, user: &str, detail: Option<&'static str>) -> TraceEvent {
        TraceEvent {
            trace_id: trace.into(),
            user_id: user.into(),
            device_id: "device".into(),
            client_type: mpush_protocol::session::ClientType::Mobile,
            state: TraceState::Dispatched,
            detail: detail.map(Into::into),
            at_ms: unix_ms(),
        }
    }

    /// `n` trace ids of 65 printable ASCII bytes that an unkeyed string hash
    /// (rustc-hash 2's Fx, which this store used) maps to one value: a
    /// caller choosing trace ids (or user ids) like these turns every lookup
    /// of a map under that hash into a scan of all of them, under the lock
    /// every push's trace event takes.
    ///
    /// How: Fx folds 16-byte chunks as `t = lo ^ hi` of the 128-bit product
    /// `(s0 ^ x) * (K ^ y)`, and the third chunk's `s0` is the first chunk's
    /// `t`. Choose the first chunk so that `t` is printable and make it the
    /// third chunk's `x`: that product is 0 whatever its `y`, so the third
    /// chunk's last 8 bytes are free and every id differs only there.
    fn ids_colliding_under_fx(n: usize) -> Vec<String> {
        const SEED1: u64 = 0x243f_6a88_85a3_08d3;
        const K: u64 = 0xa409_3822_299f_31d0;
        let mix = |x: u64, y: u64| {
            let p = u128::from(x) * u128::from(y);
            (p as u64) ^ ((p >> 64) as u64)
        };
        // Eight printable bytes numbered `i` (base 94 from '!').
        let word = |mut i: u64| {
            let mut b = [0u8; 8];
            for c in &mut b {
                *c = b'!' + (i % 94) as u8;
                i /= 94;
            }
            b
        };
        let y1 = *b"chunk1-y";
        let t = (0..)
            .map(|i| {
                (
                    word(i),
                    mix(
                        SEED1 ^ u64::from_le_bytes(word(i)),
                        K ^ u64::from_le_bytes(y1),
                    ),
                )
            })
            .find(|(_, t)| t.to_le_bytes().iter().all(u8::is_ascii_graphic))
            .expect("one in a few thousand is printable");
        (0..n as u64)
            .map(|i| {
                let mut id = Vec::with_capacity(65);
                id.extend_from_slice(&t.0);
                id.extend_from_slice(&y1);
                id.extend_from_slice(b"second-chunk-xy!");
                id.extend_from_slice(&t.1.to_le_bytes());
                id.extend_from_slice(&word(i));
                id.extend_from_slice(b"the-last-17-bytes");
                String::from_utf8(id).expect("printable ASCII")
            })
            .collect()
    }

    /// Plays the caller who chooses trace ids and user ids to collide: ids
    /// that all share one value under an unkeyed hash spread under the
    /// store's keyed one, for the trace map and for a trace's recipients.
    #[tokio::test]
    async fn ids_crafted_to_collide_under_an_unkeyed_hash_spread_here() {
        use std::hash::BuildHasher;
        const N: usize = 4_096;
        let ids = ids_colliding_under_fx(N);
        let fx = rustc_hash::FxBuildHasher;
        let unkeyed: HashSet<u64> = ids.iter().map(|i| fx.hash_one(i.as_str())).collect();
        assert_eq!(
            unkeyed.len(),
            1,
            "the ids must collide where they were crafted to"
        );
        let pairs: HashSet<u64> = ids
            .iter()
            .map(|i| fx.hash_one((i.as_str(), "device")))
            .collect();
        assert_eq!(pairs.len(), 1, "and so must (user, device) pairs of them");

        let t = MemoryTraces::new(3600, 2 * N, 1 << 30);
        let now = unix_ms();
        for id in &ids {
            t.create(id, now).await.expect("memory store");
        }
        t.create("batch", now).await.expect("memory store");
        let events: Vec<TraceEvent> = ids.iter().map(|u| ev("batch", u, None)).collect();
        t.record(&events).await.expect("memory store");

        let m = t.inner.lock();
        assert_eq!(m.map.len(), N + 1);
        let keyed: HashSet<u64> = ids
            .iter()
            .map(|i| m.map.hasher().hash_one(i.as_str()))
            .collect();
        assert_eq!(keyed.len(), N, "trace ids spread over the trace map");
        let index = &m.map["batch"].index;
        assert_eq!(index.len(), N);
        let keyed: HashSet<u64> = index.keys().map(|k| index.hasher().hash_one(k)).collect();
        assert_eq!(keyed.len(), N, "recipients spread over a trace's index");
    }

    /// An offline recipient's placeholder (no device) becomes the device
    /// that got the message, once; another device of the same user, and a
    /// user never offline, are recipients of their own.
    #[tokio::test]
    async fn an_offline_placeholder_becomes_the_device_that_got_it() {
        let t = MemoryTraces::new(3600, 1_000, 1 << 20);
        t.create("t", unix_ms()).await.expect("memory store");
        let at = |user: &str, device: &str, state: TraceState, detail: Option<&'static str>| {
            TraceEvent {
                device_id: device.into(),
                state,
                ..ev("t", user, detail)
            }
        };
        t.record(&[
            at("u1", "", TraceState::Offline, Some("kept")),
            at("u2", "d2", TraceState::Dispatched, None),
            at("u1", "d1", TraceState::Dispatched, None),
            at("u1", "d1", TraceState::Delivered, None),
            at("u1", "d9", TraceState::Dispatched, None),
            at("u2", "d2", TraceState::Delivered, Some("late")),
        ])
        .await
        .expect("memory store");
        let v = t.get("t").await.expect("memory store").expect("kept");
        let mut got: Vec<_> = v
            .recipients
            .iter()
            .map(|r| {
                let states: Vec<_> = r.history.iter().map(|h| (h.0, h.2.clone())).collect();
                (
                    r.user_id.as_str(),
                    r.device_id.as_str(),
                    r.state,
                    r.detail.clone(),
                    states,
                )
            })
            .collect();
        got.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        use TraceState::{Delivered, Dispatched, Offline};
        assert_eq!(
            got,
            vec![
                (
                    "u1",
                    "d1",
                    Delivered,
                    None,
                    vec![
                        (Offline, Some("kept".into())),
                        (Dispatched, None),
                        (Delivered, None)
                    ]
                ),
                ("u1", "d9", Dispatched, None, vec![(Dispatched, None)]),
                (
                    "u2",
                    "d2",
                    Delivered,
                    Some("late".into()),
                    vec![(Dispatched, None), (Delivered, Some("late".into()))]
                ),
            ]
        );
    }

    #[tokio::test]
    async fn traces_are_bounded_by_bytes_and_history() {
        let t = MemoryTraces::new(3600, 1_000_000, 64 << 10);
        for i in 0..200 {
            let id = format!("trace-{i}");
            t.create(&id, unix_ms()).await.expect("memory store");
            let batch: Vec<TraceEvent> = (0..20)
                .map(|u| ev(&id, &format!("user-{u}"), None))
                .collect();
            t.record(&batch).await.expect("memory store");
        }
        assert!(t.bytes() <= 64 << 10, "{}", t.bytes());
        assert!(
            t.get("trace-0").await.expect("memory store").is_none(),
            "the oldest went"
        );
        assert!(
            t.get("trace-199").await.expect("memory store").is_some(),
            "the newest stays"
        );
        // A retry storm does not grow one recipient's history without bound.
        let storm: Vec<TraceEvent> = (0..1000)
            .map(|_| ev("trace-199", "user-1", Some("resent")))
            .collect();
        t.record(&storm).await.expect("memory store");
        let v = t
            .get("trace-199")
            .await
            .expect("memory store")
            .expect("kept");
        let r = v
            .recipients
            .iter()
            .find(|r| r.user_id == "user-1")
            .expect("r");
        assert!(r.history.len() <= MAX_HISTORY);
    }

    #[tokio::test]
    async fn broadcast_traces_are_counts_per_node_not_recipients() {
        let t = MemoryTraces::new(3600, 1_000_000, 1 << 20);
        t.create("b", unix_ms()).await.expect("memory store");
        let mut counts = StateCounts::default();
        counts.add(TraceState::Dispatched, 10_000);
        counts.add(TraceState::Delivered, 9_999);
        let failures = vec![Failure {
            user_id: "u".into(),
            device_id: "d".into(),
            state: TraceState::Failed,
            detail: Some("slow consumer".into()),
        }];
        counts.add(TraceState::Failed, 1);
        let c = TraceCounts {
            trace_id: "b".into(),
            node: "n1".into(),
            counts,
            failures,
            handed: None,
        };
        let before = t.bytes();
        for _ in 0..100 {
            t.count(std::slice::from_ref(&c))
                .await
                .expect("memory store");
        }
        assert!(
            t.bytes() - before < 16 << 10,
            "a broadcast costs a few KB, not 10k records: {}",
            t.bytes()
        );
        let v = t.get("b").await.expect("memory store").expect("trace");
        let b = v.broadcast.expect("broadcast view");
        assert_eq!(b.total["DISPATCHED"], 1_000_000);
        assert!(v.recipients.is_empty());
        assert_eq!(v.state, TraceState::Delivered);
    }

    #[tokio::test]
    async fn sessions_are_bounded_by_count_and_bytes() {
        use mpush_protocol::session::{DeviceInfo, SessionSecret};
        let s = MemorySessions::new(100, 1 << 20);
        let record = |i: usize, dev: usize| SessionRecord {
            binding: None,
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
            s.put(record(i, 16)).await.expect("memory store");
        }
        assert_eq!(s.len(), 100);
        assert!(
            s.get(&format!("{:032}", 0))
                .await
                .expect("memory store")
                .is_none(),
            "oldest forgotten"
        );
        assert!(
            s.get(&format!("{:032}", 1999))
                .await
                .expect("memory store")
                .is_some()
        );
        let s = MemorySessions::new(1_000_000, 1 << 20);
        for i in 0..2000 {
            s.put(record(i, 9000)).await.expect("memory store");
        }
        assert!(s.bytes() <= 1 << 20, "{}", s.bytes());
    }

    proptest::proptest! {
        /// Whatever the fields hold (separators, digits, multibyte text),
        /// a session packs into one string of its exact size and comes back
        /// as it went in, a binding set later included.
        #[test]
        fn a_packed_session_comes_back_as_it_went_in(
            device in proptest::array::uniform4("[^\\x00]{0,40}"),
            binding in proptest::option::of(("\\PC{0,40}", "\\PC{0,40}", proptest::num::i64::ANY)),
            later in proptest::option::of(("\\PC{0,40}", "\\PC{0,40}", proptest::num::i64::ANY)),
        ) {
            use mpush_protocol::session::{DeviceInfo, KeptBinding, SessionSecret};
            let kept = |b: Option<(String, String, i64)>| {
                b.map(|(user_id, tags, expires_at_ms)| KeptBinding { user_id, tags, expires_at_ms })
            };
            let [device_id, os_name, os_version, client_version] = device;
            let record = SessionRecord {
                session_id: "s".into(),
                device: DeviceInfo { device_id, os_name, os_version, client_version },
                secret: SessionSecret::V2 {
                    resume_key: mpush_protocol::crypto::ResumeKey([3; 32]),
                },
                expire_at_ms: 7,
                binding: kept(binding),
            };
            let mut p = Packed::new(record.clone());
            proptest::prop_assert_eq!(&p.unpack("s"), &record);
            let later = kept(later);
            p.set_binding(later.as_ref());
            proptest::prop_assert_eq!(p.unpack("s"), SessionRecord { binding: later, ..record });
        }
    }

    /// ADR 0008: a binding is kept with a live session, counted in its
    /// bytes, cleared, and never creates a session.
    #[tokio::test]
    async fn a_kept_binding_is_set_on_live_sessions_only_and_counted() {
        use mpush_protocol::session::{DeviceInfo, KeptBinding, SessionSecret};
        let s = MemorySessions::new(10, 1 << 20);
        let id = "a".repeat(32);
        let binding = KeptBinding {
            // Separators inside the fields move nothing.
            user_id: format!("{}:7:x\0", "u".repeat(100)),
            tags: "vip,a:b".into(),
            expires_at_ms: 1_700_000_000_000,
        };
        assert_eq!(s.set_binding(&id, Some(binding.clone())).await, Ok(false));
        assert!(s.is_empty(), "nothing created");
        let record = SessionRecord {
            session_id: id.clone(),
            device: DeviceInfo {
                // Looks like the packed header: moves nothing either.
                device_id: "3:ab".into(),
                os_name: "android".into(),
                ..Default::default()
            },
            secret: SessionSecret::V2 {
                resume_key: mpush_protocol::crypto::ResumeKey([3; 32]),
            },
            expire_at_ms: unix_ms() + 60_000,
            binding: None,
        };
        s.put(record).await.expect("memory store");
        let bare = s.bytes();
        assert_eq!(s.set_binding(&id, Some(binding.clone())).await, Ok(true));
        assert!(s.bytes() >= bare + 100, "counted: {} vs {bare}", s.bytes());
        let got = s.get(&id).await.expect("memory store").expect("live");
        assert_eq!(got.binding, Some(binding));
        assert_eq!(
            (got.device.device_id.as_str(), got.device.os_name.as_str()),
            ("3:ab", "android")
        );
        assert_eq!(s.set_binding(&id, None).await, Ok(true));
        assert_eq!(s.bytes(), bare);
        assert_eq!(
            s.get(&id).await.ok().flatten().and_then(|r| r.binding),
            None
        );
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
        assert!(t.unsubscribe("b", "u").await.expect("memory store"));
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
            t.create(id, unix_ms()).await.expect("memory store");
        }
        assert!(
            t.get("a").await.expect("memory store").is_none(),
            "the oldest is forgotten"
        );
        assert!(
            t.get("b").await.expect("memory store").is_some()
                && t.get("c").await.expect("memory store").is_some()
        );
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

    async fn unsubscribe(&self, topic: &str, user_id: &str) -> Result<bool, StoreError> {
        let mut g = self.inner.lock();
        let m = &mut *g;
        let Some(set) = m.topics.get_mut(topic) else {
            return Ok(false);
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
        Ok(removed)
    }

    async fn subscribers(&self, topic: &str) -> Result<Vec<String>, StoreError> {
        let mut v: Vec<String> = self
            .inner
            .lock()
            .topics
            .get(topic)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        v.sort();
        Ok(v)
    }
}
