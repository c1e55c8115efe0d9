//! The Redis implementations of the stores (cluster mode). Keys follow mpush
//! where it had them (`mp:rs:` sessions, `mp:ur:` routes); the rest are ours.
//! Every command has a timeout; failures are logged and reported, never panics.

use async_trait::async_trait;
use base64::Engine as _;
use bytes::Bytes;
use mpush_protocol::crypto::ResumeKey;
use mpush_protocol::session::{AckMode, DeviceInfo, SessionRecord, SessionSecret};
use redis::AsyncCommands;
use serde_json::{Value, json};
use tracing::warn;

use super::{
    InboxFull, InboxStore, RecipientState, SessionStore, StoredMessage, TopicFull, TopicStore,
    TraceEvent, TraceState, TraceStore, TraceView,
};
use crate::clock::unix_ms;
use crate::cluster::redis_conn::RedisHandle;

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn unb64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

fn log<T>(what: &str, r: redis::RedisResult<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            metrics::counter!("mpush_redis_errors_total").increment(1);
            warn!(error = %e, "redis {what} failed");
            None
        }
    }
}

/// Sessions: legacy ones in mpush's value format, v2 ones as JSON, and
/// either sealed at rest (`s1:` + base64 of AES-GCM with the session id as
/// associated data, under a key derived from the server's RSA key): read
/// access to Redis does not let anyone resume a session. With `sealer`
/// `None` (`security.plaintext_sessions_at_rest`) values stay as mpush
/// wrote them, for clusters that share sessions with Java mpush nodes.
pub struct RedisSessions {
    pub redis: RedisHandle,
    pub sealer: Option<SessionSealer>,
}

/// Seals session values at rest.
pub struct SessionSealer {
    cipher: mpush_protocol::crypto::SessionCipher,
}

const SEALED: &str = "s1:";

impl SessionSealer {
    pub fn new(key: &mpush_protocol::crypto::RsaPrivate) -> Self {
        Self {
            cipher: mpush_protocol::crypto::SessionCipher::gcm(
                &key.derive_key(b"mpush sessions at rest v1"),
            ),
        }
    }

    pub fn seal(&self, session_id: &str, value: &str) -> String {
        let sealed = self.cipher.seal(
            &mut crate::clock::rng(),
            session_id.as_bytes(),
            value.as_bytes(),
        );
        format!("{SEALED}{}", b64(&sealed))
    }

    pub fn open(&self, session_id: &str, stored: &str) -> Option<String> {
        let sealed = unb64(stored.strip_prefix(SEALED)?)?;
        let plain = self.cipher.open(session_id.as_bytes(), &sealed).ok()?;
        String::from_utf8(plain).ok()
    }
}

#[async_trait]
impl SessionStore for RedisSessions {
    async fn put(&self, r: SessionRecord) {
        let ttl_ms = (r.expire_at_ms - unix_ms()).max(1000);
        let value = match &r.secret {
            SessionSecret::Legacy { .. } => r.to_mpush_value().unwrap_or_default(),
            SessionSecret::V2 { resume_key } => json!({
                "v": 2,
                "deviceId": r.device.device_id,
                "osName": r.device.os_name,
                "osVersion": r.device.os_version,
                "clientVersion": r.device.client_version,
                "resumeKey": b64(&resume_key.0),
            })
            .to_string(),
        };
        let value = match &self.sealer {
            Some(s) => s.seal(&r.session_id, &value),
            None => value,
        };
        let mut c = self.redis.conn();
        let res: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("mp:rs:{}", r.session_id))
            .arg(value)
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut c)
            .await;
        log("session put", res);
    }

    async fn remove(&self, session_id: &str) -> bool {
        let mut c = self.redis.conn();
        log(
            "session remove",
            c.del::<_, i64>(format!("mp:rs:{session_id}")).await,
        )
        .unwrap_or(0)
            > 0
    }

    async fn get(&self, session_id: &str) -> Option<SessionRecord> {
        let mut c = self.redis.conn();
        let key = format!("mp:rs:{session_id}");
        let (value, pttl): (Option<String>, i64) = log(
            "session get",
            redis::pipe().get(&key).pttl(&key).query_async(&mut c).await,
        )?;
        let value = match (&self.sealer, value?) {
            (Some(s), v) => match s.open(session_id, &v) {
                Some(plain) => plain,
                None => {
                    // Unsealed (written without the key) or tampered with:
                    // never a way in.
                    metrics::counter!("mpush_sessions_unsealable_total").increment(1);
                    return None;
                }
            },
            (None, v) => v,
        };
        let expire_at_ms = unix_ms() + pttl.max(0);
        if !value.starts_with('{') {
            return SessionRecord::from_mpush_value(session_id, expire_at_ms, &value);
        }
        let v: Value = serde_json::from_str(&value).ok()?;
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        let key: [u8; 32] = unb64(v["resumeKey"].as_str()?)?.try_into().ok()?;
        Some(SessionRecord {
            session_id: session_id.to_owned(),
            device: DeviceInfo {
                device_id: s("deviceId"),
                os_name: s("osName"),
                os_version: s("osVersion"),
                client_version: s("clientVersion"),
            },
            secret: SessionSecret::V2 {
                resume_key: ResumeKey(key),
            },
            expire_at_ms,
        })
    }
}

/// Traces: a hash per trace (`mp:trace:<id>`), one field per recipient
/// (`user|device`) holding its JSON state, expiring with the trace TTL.
pub struct RedisTraces {
    pub redis: RedisHandle,
    pub ttl_secs: u64,
}

fn state_name(s: TraceState) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn state_from(s: &str) -> TraceState {
    serde_json::from_value(json!(s)).unwrap_or(TraceState::Accepted)
}

#[async_trait]
impl TraceStore for RedisTraces {
    async fn create(&self, trace_id: &str, at_ms: i64) {
        let key = format!("mp:trace:{trace_id}");
        let mut c = self.redis.conn();
        let res: redis::RedisResult<()> = redis::pipe()
            .hset_nx(&key, "_meta", at_ms)
            .ignore()
            .expire(&key, self.ttl_secs as i64)
            .ignore()
            .query_async(&mut c)
            .await;
        log("trace create", res);
    }

    async fn record(&self, e: TraceEvent<'_>) {
        let key = format!("mp:trace:{}", e.trace_id);
        let mut c = self.redis.conn();
        // Read-modify-write of one field: concurrent writers for the same
        // recipient are one connection's events, so they do not interleave.
        let field = format!("{}|{}", e.user_id, e.device_id);
        let placeholder = format!("{}|", e.user_id);
        let fields: Option<Vec<Option<String>>> = log(
            "trace read",
            redis::cmd("HMGET")
                .arg(&key)
                .arg(&field)
                .arg(&placeholder)
                .arg("_meta")
                .query_async(&mut c)
                .await,
        );
        let fields = fields.unwrap_or_default();
        if fields.get(2).cloned().flatten().is_none() {
            // The trace expired (or never was): recording must not create a
            // key without a TTL.
            return;
        }
        let existing = fields
            .first()
            .cloned()
            .flatten()
            .or_else(|| fields.get(1).cloned().flatten());
        let from_placeholder = fields.first().cloned().flatten().is_none()
            && fields.get(1).cloned().flatten().is_some();
        let mut r: RecipientState = existing
            .and_then(|j| serde_json::from_str::<Value>(&j).ok())
            .map(|v| recipient_from_json(&v))
            .unwrap_or(RecipientState {
                user_id: e.user_id.to_owned(),
                device_id: e.device_id.to_owned(),
                client_type: e.client_type,
                state: e.state,
                detail: None,
                updated_at_ms: e.at_ms,
                history: Vec::new(),
            });
        if r.device_id.is_empty() {
            r.device_id = e.device_id.to_owned();
            r.client_type = e.client_type;
        }
        r.history.push((e.state, e.at_ms, e.detail.clone()));
        if e.state.rank() >= r.state.rank()
            || r.state == TraceState::Offline
            || r.history.len() == 1
        {
            r.state = e.state;
            r.detail = e.detail;
            r.updated_at_ms = e.at_ms;
        }
        let mut p = redis::pipe();
        if from_placeholder && !e.device_id.is_empty() {
            p.hdel(&key, &placeholder).ignore();
        }
        // Should the key have expired since the read, the write recreates it:
        // EXPIRE NX gives it a TTL then and leaves a live one alone (Redis 7).
        let res: redis::RedisResult<()> = p
            .hset(&key, &field, recipient_json(&r).to_string())
            .ignore()
            .cmd("EXPIRE")
            .arg(&key)
            .arg(self.ttl_secs)
            .arg("NX")
            .ignore()
            .query_async(&mut c)
            .await;
        log("trace record", res);
    }

    async fn get(&self, trace_id: &str) -> Option<TraceView> {
        let mut c = self.redis.conn();
        let all: std::collections::HashMap<String, String> =
            log("trace get", c.hgetall(format!("mp:trace:{trace_id}")).await)?;
        let created_at_ms = all.get("_meta")?.parse().unwrap_or(0);
        let mut recipients: Vec<RecipientState> = all
            .iter()
            .filter(|(k, _)| *k != "_meta")
            .filter_map(|(_, v)| serde_json::from_str::<Value>(v).ok())
            .map(|v| recipient_from_json(&v))
            .collect();
        recipients.sort_by(|a, b| (&a.user_id, &a.device_id).cmp(&(&b.user_id, &b.device_id)));
        let state = recipients
            .iter()
            .map(|r| r.state)
            .min_by_key(|s| s.rank())
            .unwrap_or(TraceState::Accepted);
        Some(TraceView {
            trace_id: trace_id.to_owned(),
            created_at_ms,
            state,
            recipients,
        })
    }
}

fn recipient_json(r: &RecipientState) -> Value {
    json!({
        "userId": r.user_id, "deviceId": r.device_id, "clientType": r.client_type,
        "state": state_name(r.state), "detail": r.detail, "updatedAtMs": r.updated_at_ms,
        "history": r.history.iter().map(|(s, t, d)| json!([state_name(*s), t, d])).collect::<Vec<_>>(),
    })
}

fn recipient_from_json(v: &Value) -> RecipientState {
    RecipientState {
        user_id: v["userId"].as_str().unwrap_or_default().to_owned(),
        device_id: v["deviceId"].as_str().unwrap_or_default().to_owned(),
        client_type: v["clientType"].as_i64().unwrap_or(-1) as i32,
        state: state_from(v["state"].as_str().unwrap_or_default()),
        detail: v["detail"].as_str().map(str::to_owned),
        updated_at_ms: v["updatedAtMs"].as_i64().unwrap_or(0),
        history: v["history"]
            .as_array()
            .map(|h| {
                h.iter()
                    .map(|e| {
                        (
                            state_from(e[0].as_str().unwrap_or_default()),
                            e[1].as_i64().unwrap_or(0),
                            e[2].as_str().map(str::to_owned),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// Appends ARGV[3] unless a message with id ARGV[2] is there (1) or the list
/// holds ARGV[1] already (0); the key lives ARGV[4] seconds.
const INBOX_PUSH: &str = r#"
local items = redis.call('LRANGE', KEYS[1], 0, -1)
local a = '"id":' .. ARGV[2] .. ','
local b = '"id":' .. ARGV[2] .. '}'
for _, v in ipairs(items) do
  if string.find(v, a, 1, true) or string.find(v, b, 1, true) then return 2 end
end
if #items >= tonumber(ARGV[1]) then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"#;

/// Inboxes: a list per user (`mp:inbox:<user>`) of JSON messages.
pub struct RedisInbox {
    pub redis: RedisHandle,
    pub max: usize,
    pub max_ttl_secs: u64,
}

fn message_json(m: &StoredMessage) -> String {
    json!({
        "id": m.message_id, "trace": m.trace_id, "content": b64(&m.content),
        "ack": match m.ack_mode { AckMode::None => 0, AckMode::Auto => 1, AckMode::Biz => 2 },
        "ct": m.client_type, "exp": m.expires_at_ms,
    })
    .to_string()
}

fn message_from(s: &str) -> Option<StoredMessage> {
    let v: Value = serde_json::from_str(s).ok()?;
    Some(StoredMessage {
        message_id: v["id"].as_u64()?,
        trace_id: v["trace"].as_str()?.to_owned(),
        content: Bytes::from(unb64(v["content"].as_str()?)?),
        ack_mode: match v["ack"].as_u64() {
            Some(1) => AckMode::Auto,
            Some(2) => AckMode::Biz,
            _ => AckMode::None,
        },
        client_type: v["ct"].as_i64().map(|c| c as i32),
        expires_at_ms: v["exp"].as_i64()?,
    })
}

#[async_trait]
impl InboxStore for RedisInbox {
    async fn push(&self, user_id: &str, message: StoredMessage) -> Result<(), InboxFull> {
        let key = format!("mp:inbox:{user_id}");
        // Drops expired entries first (list does), then checks and appends in
        // one script: concurrent pushes cannot overshoot the cap.
        self.list(user_id, unix_ms()).await;
        let mut c = self.redis.conn();
        let res: redis::RedisResult<i64> = redis::Script::new(INBOX_PUSH)
            .key(&key)
            .arg(self.max)
            .arg(message.message_id.to_string())
            .arg(message_json(&message))
            .arg(self.max_ttl_secs)
            .invoke_async(&mut c)
            .await;
        match log("inbox push", res) {
            Some(0) => Err(InboxFull(user_id.to_owned())),
            Some(_) => Ok(()),
            None => Err(InboxFull(format!("{user_id} (redis unavailable)"))),
        }
    }

    async fn list(&self, user_id: &str, now_ms: i64) -> Vec<StoredMessage> {
        let key = format!("mp:inbox:{user_id}");
        let mut c = self.redis.conn();
        let raw: Vec<String> = log("inbox list", c.lrange(&key, 0, -1).await).unwrap_or_default();
        let mut out = Vec::new();
        for r in raw {
            match message_from(&r) {
                Some(m) if m.expires_at_ms > now_ms => out.push(m),
                _ => {
                    let _: Option<i64> = log("inbox expire", c.lrem(&key, 1, &r).await);
                }
            }
        }
        out
    }

    async fn remove(&self, user_id: &str, message_id: u64) -> bool {
        let key = format!("mp:inbox:{user_id}");
        let mut c = self.redis.conn();
        let raw: Vec<String> = log("inbox list", c.lrange(&key, 0, -1).await).unwrap_or_default();
        for r in raw {
            if message_from(&r).is_some_and(|m| m.message_id == message_id) {
                let n: Option<i64> = log("inbox remove", c.lrem(&key, 1, &r).await);
                return n.unwrap_or(0) > 0;
            }
        }
        false
    }

    async fn len(&self, user_id: &str) -> usize {
        self.list(user_id, unix_ms()).await.len()
    }
}

/// How long a topic's subscriber set outlives its latest subscription (90 days).
pub const TOPIC_TTL_SECS: i64 = 90 * 86_400;

/// Adds ARGV[1] to the set KEYS[1] unless it holds ARGV[2] members already
/// (-1); 1 when added, 0 when there; the set lives ARGV[3] seconds. One key
/// per script, so it works on a Redis Cluster too.
const SET_ADD_CAPPED: &str = r#"
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  return 0
end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return -1 end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"#;

/// Topics: a set per topic (`mp:topic:<topic>`, as mpush's `topic:{topic}`)
/// and a set per user of its topics (`mp:ut:<user>`), both capped atomically.
pub struct RedisTopics {
    pub redis: RedisHandle,
    pub max_topics_per_user: usize,
    pub max_subscribers: usize,
}

impl RedisTopics {
    async fn add(&self, key: &str, member: &str, max: usize) -> Option<i64> {
        let mut c = self.redis.conn();
        log(
            "topic subscribe",
            redis::Script::new(SET_ADD_CAPPED)
                .key(key)
                .arg(member)
                .arg(max)
                .arg(TOPIC_TTL_SECS)
                .invoke_async(&mut c)
                .await,
        )
    }
}

#[async_trait]
impl TopicStore for RedisTopics {
    async fn subscribe(&self, topic: &str, user_id: &str) -> Result<bool, TopicFull> {
        let (tkey, ukey) = (format!("mp:topic:{topic}"), format!("mp:ut:{user_id}"));
        // The user's side first; given back if the topic is full.
        match self.add(&ukey, topic, self.max_topics_per_user).await {
            None => return Err(TopicFull::Unavailable),
            Some(-1) => {
                return Err(TopicFull::User(
                    user_id.to_owned(),
                    self.max_topics_per_user,
                ));
            }
            Some(_) => {}
        }
        match self.add(&tkey, user_id, self.max_subscribers).await {
            None => Err(TopicFull::Unavailable),
            Some(-1) => {
                let mut c = self.redis.conn();
                let _: Option<i64> = log("topic undo", c.srem(&ukey, topic).await);
                Err(TopicFull::Topic(topic.to_owned(), self.max_subscribers))
            }
            Some(n) => Ok(n == 1),
        }
    }

    async fn unsubscribe(&self, topic: &str, user_id: &str) -> bool {
        let mut c = self.redis.conn();
        let _: Option<i64> = log(
            "topic unsubscribe",
            c.srem(format!("mp:ut:{user_id}"), topic).await,
        );
        log(
            "topic unsubscribe",
            c.srem::<_, _, i64>(format!("mp:topic:{topic}"), user_id)
                .await,
        )
        .unwrap_or(0)
            > 0
    }

    async fn subscribers(&self, topic: &str) -> Vec<String> {
        let mut c = self.redis.conn();
        let mut v: Vec<String> = log(
            "topic members",
            c.smembers(format!("mp:topic:{topic}")).await,
        )
        .unwrap_or_default();
        v.sort();
        v
    }
}
