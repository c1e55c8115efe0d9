//! Storage behind fallible traits: the embedded in-memory default lives here;
//! the Redis implementations (cluster mode) implement the same traits. Every
//! call says whether what was asked for is missing (`Ok(None)`, `Ok(false)`)
//! or the store is down (`Err(StoreError)`), so the logic layer can tell the
//! caller which.

pub mod idempotency;
mod memory;
pub mod redis;

use mpush_protocol::session::ClientType;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use mpush_protocol::session::{AckMode, KeptBinding, SessionRecord};
use serde::Serialize;

pub use idempotency::{Claim, IdempotencyStore, MemoryIdempotency, RedisIdempotency};
pub use memory::{MemoryInbox, MemorySessions, MemoryTopics, MemoryTraces};

/// A store could not be reached (or answered nonsense).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{store} store unavailable: {reason}")]
pub struct StoreError {
    pub store: &'static str,
    pub reason: String,
}

impl StoreError {
    pub fn new(store: &'static str, reason: impl std::fmt::Display) -> Self {
        Self {
            store,
            reason: reason.to_string(),
        }
    }
}

/// Resumable sessions (fast connect), keyed by session id.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    async fn put(&self, record: SessionRecord) -> Result<(), StoreError>;
    async fn get(&self, session_id: &str) -> Result<Option<SessionRecord>, StoreError>;
    /// Deletes a session; true when this call deleted it (single-use tickets).
    async fn remove(&self, session_id: &str) -> Result<bool, StoreError>;
    /// ADR 0008: keeps `binding` with a live session (`None` clears it),
    /// leaving its expiry as it is. False when the session is gone: this
    /// never creates one (a ticket used meanwhile stays used).
    async fn set_binding(
        &self,
        session_id: &str,
        binding: Option<KeptBinding>,
    ) -> Result<bool, StoreError>;
}

/// The trace states of a message, per recipient device (the seed fork's
/// states): ACCEPTED (the API took it), DISPATCHED (queued for a connection),
/// DELIVERED (written to the socket), ACK (the client acknowledged it),
/// TIMEOUT, FAILED, OFFLINE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TraceState {
    Accepted,
    Dispatched,
    Delivered,
    Ack,
    Timeout,
    Failed,
    Offline,
}

impl TraceState {
    pub const ALL: [Self; 7] = [
        Self::Accepted,
        Self::Dispatched,
        Self::Delivered,
        Self::Ack,
        Self::Timeout,
        Self::Failed,
        Self::Offline,
    ];

    /// Final states are not overwritten by late, lesser news (a retry after an ACK).
    pub(crate) fn rank(self) -> u8 {
        match self {
            Self::Accepted => 0,
            Self::Offline => 1,
            Self::Dispatched => 2,
            Self::Delivered => 3,
            Self::Timeout | Self::Failed => 4,
            Self::Ack => 5,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Accepted => "ACCEPTED",
            Self::Dispatched => "DISPATCHED",
            Self::Delivered => "DELIVERED",
            Self::Ack => "ACK",
            Self::Timeout => "TIMEOUT",
            Self::Failed => "FAILED",
            Self::Offline => "OFFLINE",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == s)
    }
}

/// History entries kept per recipient: the first ones and the latest.
pub(crate) const MAX_HISTORY: usize = 16;

/// One recipient's state in a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecipientState {
    pub user_id: String,
    /// Empty while the user was offline.
    pub device_id: String,
    pub client_type: ClientType,
    pub state: TraceState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub updated_at_ms: i64,
    /// Every state change: state, time, and what happened (a forward hop, an error).
    pub history: Vec<(TraceState, i64, Option<String>)>,
}

/// How many recipients reached each state (a broadcast's trace, per node).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct StateCounts(pub [u64; 7]);

impl StateCounts {
    pub fn add(&mut self, s: TraceState, n: u64) {
        self.0[s as usize] += n;
    }

    pub fn get(&self, s: TraceState) -> u64 {
        self.0[s as usize]
    }

    pub fn merge(&mut self, o: &Self) {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a += b;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|n| *n == 0)
    }

    /// The counts by state name, zero counts left out.
    pub fn named(&self) -> BTreeMap<&'static str, u64> {
        TraceState::ALL
            .into_iter()
            .filter(|s| self.get(*s) > 0)
            .map(|s| (s.name(), self.get(s)))
            .collect()
    }

    /// Every copy counted here reached a state after which nothing more is
    /// expected (`ack`: the copies wait for an ACK).
    pub fn settled(&self, ack: bool) -> bool {
        use TraceState::*;
        let mut done = self.get(Ack) + self.get(Timeout) + self.get(Failed) + self.get(Offline);
        if !ack {
            done += self.get(Delivered);
        }
        done >= self.get(Dispatched)
    }

    /// How far the broadcast got: every copy written, acknowledged, or still
    /// under way.
    pub fn overall(&self) -> TraceState {
        use TraceState::*;
        let dispatched = self.get(Dispatched);
        if dispatched == 0 {
            return if self.get(Offline) > 0 {
                Offline
            } else {
                Accepted
            };
        }
        let ended = self.get(Failed) + self.get(Timeout) + self.get(Offline);
        if self.get(Ack) + ended >= dispatched && self.get(Ack) > 0 {
            Ack
        } else if self.get(Delivered) + ended >= dispatched && self.get(Delivered) > 0 {
            Delivered
        } else if ended >= dispatched {
            Failed
        } else {
            Dispatched
        }
    }
}

/// A recipient of a broadcast that did not get it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub user_id: String,
    pub device_id: String,
    pub state: TraceState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Failures kept per node and broadcast; beyond, only counted.
pub const MAX_FAILURES: usize = 100;

/// A broadcast's trace: counts per node, and the failures by device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct BroadcastView {
    /// Connections the broadcast matched, on every node that reported (0
    /// included: a broadcast that matched nobody says so).
    pub matched: u64,
    /// Every node that reported has handed on every copy, and each copy
    /// reached a state after which nothing more happens (ACK, or DELIVERED
    /// when no ACK is asked; TIMEOUT, FAILED, OFFLINE).
    pub finished: bool,
    /// In a cluster: how many nodes the broadcast reached (they each report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes_expected: Option<u64>,
    pub total: BTreeMap<&'static str, u64>,
    pub nodes: BTreeMap<String, BTreeMap<&'static str, u64>>,
    pub failures: Vec<Failure>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceView {
    pub trace_id: String,
    pub created_at_ms: i64,
    pub state: TraceState,
    pub recipients: Vec<RecipientState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broadcast: Option<BroadcastView>,
}

/// One state change of one recipient. Owned and cheap to clone: the ids are
/// shared with the connection and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    pub trace_id: Arc<str>,
    pub user_id: Arc<str>,
    pub device_id: Arc<str>,
    pub client_type: ClientType,
    pub state: TraceState,
    pub detail: Option<Cow<'static, str>>,
    pub at_ms: i64,
}

/// What one node adds to a broadcast's trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceCounts {
    pub trace_id: Arc<str>,
    pub node: Arc<str>,
    pub counts: StateCounts,
    pub failures: Vec<Failure>,
    /// Set when this node has selected the broadcast's recipients and handed
    /// every copy on: whether its copies wait for ACKs.
    pub handed: Option<bool>,
}

#[async_trait]
pub trait TraceStore: Send + Sync + 'static {
    /// Starts a trace (state ACCEPTED).
    async fn create(&self, trace_id: &str, at_ms: i64) -> Result<(), StoreError>;
    /// Applies state changes, in order (one batch: one lock or one round trip).
    async fn record(&self, events: &[TraceEvent]) -> Result<(), StoreError>;
    /// Applies state changes now, in order, where that costs no I/O (the
    /// memory store: one short lock): true when it did (all of them). A
    /// store that answers false gets its events in batches from the node's
    /// trace writer instead.
    fn record_now(&self, events: &[TraceEvent]) -> bool {
        let _ = events;
        false
    }
    /// This store on connections of its own, opened on the calling
    /// runtime, for the node's trace writer (which runs on a thread of its
    /// own, so a flood that keeps the async workers busy cannot starve it):
    /// `None` when the store has no connections (memory).
    async fn reopen(&self) -> Result<Option<Arc<dyn TraceStore>>, StoreError> {
        Ok(None)
    }
    /// Adds a node's counts to broadcasts' traces.
    async fn count(&self, counts: &[TraceCounts]) -> Result<(), StoreError>;
    /// A cluster broadcast reached `nodes` nodes (what PUBLISH answered): it
    /// is finished only once that many have reported. A store that never
    /// hears of it (one node) needs no count.
    async fn expect_nodes(&self, trace_id: &str, nodes: u64) -> Result<(), StoreError> {
        let _ = (trace_id, nodes);
        Ok(())
    }
    async fn get(&self, trace_id: &str) -> Result<Option<TraceView>, StoreError>;
}

/// A message kept for a user until it is acknowledged or expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub message_id: u64,
    pub trace_id: Arc<str>,
    pub content: Bytes,
    pub ack_mode: AckMode,
    /// Only devices of this client type get it.
    pub client_type: Option<ClientType>,
    pub expires_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InboxError {
    #[error("the offline inbox of `{0}` is full")]
    Full(String),
    #[error(transparent)]
    Unavailable(#[from] StoreError),
}

/// Per-user offline inbox: bounded, ordered, with expiry.
#[async_trait]
pub trait InboxStore: Send + Sync + 'static {
    /// Adds a message (once: a message id already there is not added again).
    async fn push(&self, user_id: &str, message: StoredMessage) -> Result<(), InboxError>;
    /// Unexpired messages in the order they were pushed (they stay until removed).
    async fn list(&self, user_id: &str, now_ms: i64) -> Result<Vec<StoredMessage>, StoreError>;
    async fn remove(&self, user_id: &str, message_id: u64) -> Result<bool, StoreError>;
    async fn len(&self, user_id: &str) -> Result<usize, StoreError>;
    /// Messages held for every user, when the store knows it cheaply (the
    /// embedded store does; Redis reports its own memory).
    fn total_hint(&self) -> Option<usize> {
        None
    }
}

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicFull {
    #[error("`{0}` is subscribed to {1} topics already (limits.max_topics_per_user)")]
    User(String, usize),
    #[error("topic `{0}` has {1} subscribers already (limits.max_subscribers_per_topic)")]
    Topic(String, usize),
    #[error(transparent)]
    Unavailable(#[from] StoreError),
}

/// Topic subscriptions, bounded per user and per topic.
#[async_trait]
pub trait TopicStore: Send + Sync + 'static {
    /// True when newly subscribed; refused over either bound.
    async fn subscribe(&self, topic: &str, user_id: &str) -> Result<bool, TopicFull>;
    async fn unsubscribe(&self, topic: &str, user_id: &str) -> Result<bool, StoreError>;
    async fn subscribers(&self, topic: &str) -> Result<Vec<String>, StoreError>;
}
