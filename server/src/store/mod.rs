//! Storage behind traits: the embedded in-memory default lives here; the Redis
//! implementations (cluster mode) implement the same traits.

mod memory;
pub mod redis;

use async_trait::async_trait;
use bytes::Bytes;
use mpush_protocol::session::{AckMode, SessionRecord};
use serde::Serialize;

pub use memory::{MemoryInbox, MemorySessions, MemoryTopics, MemoryTraces};

/// Resumable sessions (fast connect), keyed by session id.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    async fn put(&self, record: SessionRecord);
    async fn get(&self, session_id: &str) -> Option<SessionRecord>;
    /// Deletes a session; true when this call deleted it (single-use tickets).
    async fn remove(&self, session_id: &str) -> bool;
}

/// The trace states of a message, per recipient device.
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
    /// Final states are not overwritten by late, lesser news (a retry after an ACK).
    pub(crate) fn rank(self) -> u8 {
        match self {
            Self::Accepted => 0,
            Self::Offline => 1,
            Self::Dispatched => 2,
            Self::Timeout | Self::Failed => 3,
            Self::Delivered => 4,
            Self::Ack => 5,
        }
    }
}

/// One recipient's state in a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecipientState {
    pub user_id: String,
    /// Empty while the user was offline.
    pub device_id: String,
    pub client_type: i32,
    pub state: TraceState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub updated_at_ms: i64,
    /// Every state change: state, time, and what happened (a forward hop, an error).
    pub history: Vec<(TraceState, i64, Option<String>)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceView {
    pub trace_id: String,
    pub created_at_ms: i64,
    pub state: TraceState,
    pub recipients: Vec<RecipientState>,
}

/// One state change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent<'a> {
    pub trace_id: &'a str,
    pub user_id: &'a str,
    pub device_id: &'a str,
    pub client_type: i32,
    pub state: TraceState,
    pub detail: Option<String>,
    pub at_ms: i64,
}

#[async_trait]
pub trait TraceStore: Send + Sync + 'static {
    /// Starts a trace (state ACCEPTED).
    async fn create(&self, trace_id: &str, at_ms: i64);
    async fn record(&self, event: TraceEvent<'_>);
    async fn get(&self, trace_id: &str) -> Option<TraceView>;
}

/// A message kept for a user until it is acknowledged or expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub message_id: u64,
    pub trace_id: String,
    pub content: Bytes,
    pub ack_mode: AckMode,
    /// Only devices of this client type get it.
    pub client_type: Option<i32>,
    pub expires_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the offline inbox of `{0}` is full")]
pub struct InboxFull(pub String);

/// Per-user offline inbox: bounded, ordered, with expiry.
#[async_trait]
pub trait InboxStore: Send + Sync + 'static {
    async fn push(&self, user_id: &str, message: StoredMessage) -> Result<(), InboxFull>;
    /// Unexpired messages in the order they were pushed (they stay until removed).
    async fn list(&self, user_id: &str, now_ms: i64) -> Vec<StoredMessage>;
    async fn remove(&self, user_id: &str, message_id: u64) -> bool;
    async fn len(&self, user_id: &str) -> usize;
}

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicFull {
    #[error("`{0}` is subscribed to {1} topics already (limits.max_topics_per_user)")]
    User(String, usize),
    #[error("topic `{0}` has {1} subscribers already (limits.max_subscribers_per_topic)")]
    Topic(String, usize),
    #[error("the topic store is unavailable")]
    Unavailable,
}

/// Topic subscriptions, bounded per user and per topic.
#[async_trait]
pub trait TopicStore: Send + Sync + 'static {
    /// True when newly subscribed; refused over either bound.
    async fn subscribe(&self, topic: &str, user_id: &str) -> Result<bool, TopicFull>;
    async fn unsubscribe(&self, topic: &str, user_id: &str) -> bool;
    async fn subscribers(&self, topic: &str) -> Vec<String>;
}
