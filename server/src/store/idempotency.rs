//! Idempotent publish (ADR 0007): the first answer to a request that
//! carries a key is kept for a window, and a retry of the same request gets
//! that answer instead of a second delivery. In memory (bounded) for the
//! embedded default, in Redis (shared by every node) in cluster mode.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::StoreError;
use crate::redis_conn::RedisHandle;

/// How long a claim without an answer holds its key: the request that made
/// it is under way (or died: then the key is free again after this).
pub const PENDING: Duration = Duration::from_secs(60);

/// What a claim on a key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The first request with this key: go ahead, then `finish` (or
    /// `release`, when nothing happened).
    New,
    /// Answered before: the answer, as `finish` stored it.
    Done(String),
    /// A request with this key is under way.
    InProgress,
    /// The key was used for another request (another fingerprint).
    Mismatch,
}

#[async_trait]
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Claims `key` for the request `owner` (a token unique to it): a
    /// claim whose answer was lost (the store took it, the reply never
    /// came) can still be released by its owner, and only by it.
    async fn claim(&self, key: &str, fingerprint: &str, owner: &str) -> Result<Claim, StoreError>;
    /// Keeps `answer` under `key` for the window.
    async fn finish(&self, key: &str, fingerprint: &str, answer: &str) -> Result<(), StoreError>;
    /// Frees `key` if it is still `owner`'s claim without an answer (its
    /// request did nothing: a retry may try again); anything else stays.
    async fn release(&self, key: &str, owner: &str) -> Result<(), StoreError>;
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    fp: String,
    answer: Option<String>,
    /// The claim's owner (while there is no answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
}

impl Entry {
    fn claim(&self, fingerprint: &str) -> Claim {
        match (&self.answer, self.fp == fingerprint) {
            (_, false) => Claim::Mismatch,
            (Some(a), true) => Claim::Done(a.clone()),
            (None, true) => Claim::InProgress,
        }
    }
}

/// The embedded store: bounded by count and by bytes; over either, the
/// oldest keys are forgotten first (counted: `mpush_idempotency_evicted_total`).
pub struct MemoryIdempotency {
    window: Duration,
    max: usize,
    max_bytes: usize,
    inner: Mutex<Keys>,
}

#[derive(Default)]
struct Keys {
    map: HashMap<String, (Entry, Instant)>,
    order: VecDeque<(String, Instant)>,
    bytes: usize,
}

impl MemoryIdempotency {
    pub fn new(window: Duration, max: usize, max_bytes: usize) -> Self {
        Self {
            window,
            max,
            max_bytes,
            inner: Mutex::new(Keys::default()),
        }
    }
}

impl Keys {
    fn size(key: &str, e: &Entry) -> usize {
        key.len()
            + e.fp.len()
            + e.answer.as_ref().map_or(0, String::len)
            + e.owner.as_ref().map_or(0, String::len)
            + 64
    }

    fn remove(&mut self, key: &str) {
        if let Some((e, _)) = self.map.remove(key) {
            self.bytes -= Self::size(key, &e);
        }
    }

    fn insert(&mut self, key: &str, e: Entry, until: Instant) {
        self.remove(key);
        self.bytes += Self::size(key, &e);
        self.map.insert(key.to_owned(), (e, until));
        self.order.push_back((key.to_owned(), until));
    }

    /// Drops what expired, then the oldest while over a bound.
    fn trim(&mut self, now: Instant, max: usize, max_bytes: usize) {
        while let Some((k, until)) = self.order.front().cloned() {
            let live = self.map.get(&k).map(|(_, u)| *u);
            let stale = live != Some(until);
            let expired = until <= now;
            let over = self.map.len() > max || self.bytes > max_bytes;
            if !(stale || expired || over) {
                break;
            }
            self.order.pop_front();
            if !stale {
                if !expired {
                    metrics::counter!("mpush_idempotency_evicted_total").increment(1);
                }
                self.remove(&k);
            }
        }
    }
}

#[async_trait]
impl IdempotencyStore for MemoryIdempotency {
    async fn claim(&self, key: &str, fingerprint: &str, owner: &str) -> Result<Claim, StoreError> {
        let now = Instant::now();
        let mut g = self.inner.lock();
        g.trim(now, self.max, self.max_bytes);
        if let Some((e, until)) = g.map.get(key)
            && *until > now
        {
            return Ok(e.claim(fingerprint));
        }
        let e = Entry {
            fp: fingerprint.to_owned(),
            answer: None,
            owner: Some(owner.to_owned()),
        };
        g.insert(key, e, now + PENDING);
        Ok(Claim::New)
    }

    async fn finish(&self, key: &str, fingerprint: &str, answer: &str) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut g = self.inner.lock();
        let e = Entry {
            fp: fingerprint.to_owned(),
            answer: Some(answer.to_owned()),
            owner: None,
        };
        g.insert(key, e, now + self.window);
        g.trim(now, self.max, self.max_bytes);
        Ok(())
    }

    async fn release(&self, key: &str, owner: &str) -> Result<(), StoreError> {
        let mut g = self.inner.lock();
        if g.map
            .get(key)
            .is_some_and(|(e, _)| e.answer.is_none() && e.owner.as_deref() == Some(owner))
        {
            g.remove(key);
        }
        Ok(())
    }
}

/// Cluster mode: `mp:idem:<key>` (JSON), claimed with `SET NX` for
/// `PENDING`, then kept for the window; every key expires.
pub struct RedisIdempotency {
    pub redis: RedisHandle,
    pub window: Duration,
}

/// Deletes the key only while it is the caller's claim without an answer.
const RELEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local ok, e = pcall(cjson.decode, v)
if ok and type(e) == 'table' and e.owner == ARGV[1] and (e.answer == nil or e.answer == cjson.null) then
  return redis.call('DEL', KEYS[1])
end
return 0
";

fn redis_key(key: &str) -> String {
    // Keys come from callers: hashed, so their length and bytes are ours.
    use sha2::Digest as _;
    format!(
        "mp:idem:{}",
        hex::encode(sha2::Sha256::digest(key.as_bytes()))
    )
}

fn down(e: redis::RedisError) -> StoreError {
    metrics::counter!("mpush_redis_errors_total", "store" => "idempotency").increment(1);
    StoreError::new("idempotency", e)
}

#[async_trait]
impl IdempotencyStore for RedisIdempotency {
    async fn claim(&self, key: &str, fingerprint: &str, owner: &str) -> Result<Claim, StoreError> {
        let k = redis_key(key);
        let pending = serde_json::to_string(&Entry {
            fp: fingerprint.to_owned(),
            answer: None,
            owner: Some(owner.to_owned()),
        })
        .unwrap_or_default();
        let mut c = self.redis.conn();
        let set: Option<String> = redis::cmd("SET")
            .arg(&k)
            .arg(&pending)
            .arg("NX")
            .arg("EX")
            .arg(PENDING.as_secs())
            .query_async(&mut c)
            .await
            .map_err(down)?;
        if set.is_some() {
            return Ok(Claim::New);
        }
        let v: Option<String> = c.get(&k).await.map_err(down)?;
        match v
            .as_deref()
            .and_then(|v| serde_json::from_str::<Entry>(v).ok())
        {
            Some(e) => Ok(e.claim(fingerprint)),
            // Expired between the two commands: claim again.
            None => Box::pin(self.claim(key, fingerprint, owner)).await,
        }
    }

    async fn finish(&self, key: &str, fingerprint: &str, answer: &str) -> Result<(), StoreError> {
        let v = serde_json::to_string(&Entry {
            fp: fingerprint.to_owned(),
            answer: Some(answer.to_owned()),
            owner: None,
        })
        .unwrap_or_default();
        let mut c = self.redis.conn();
        c.set_ex::<_, _, ()>(redis_key(key), v, self.window.as_secs().max(1))
            .await
            .map_err(down)
    }

    async fn release(&self, key: &str, owner: &str) -> Result<(), StoreError> {
        let mut c = self.redis.conn();
        redis::Script::new(RELEASE)
            .key(redis_key(key))
            .arg(owner)
            .invoke_async::<i64>(&mut c)
            .await
            .map(|_| ())
            .map_err(down)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_answers_once_then_replays() {
        let s = MemoryIdempotency::new(Duration::from_secs(60), 100, 1 << 20);
        assert_eq!(s.claim("k", "fp", "r1").await, Ok(Claim::New));
        assert_eq!(s.claim("k", "fp", "r2").await, Ok(Claim::InProgress));
        assert_eq!(s.claim("k", "other", "r3").await, Ok(Claim::Mismatch));
        // Only the owner frees a claim.
        s.release("k", "r2").await.expect("answered");
        assert_eq!(s.claim("k", "fp", "r2").await, Ok(Claim::InProgress));
        s.release("k", "r1").await.expect("freed");
        assert_eq!(s.claim("k", "fp", "r4").await, Ok(Claim::New));
        s.finish("k", "fp", "{\"a\":1}").await.expect("kept");
        assert_eq!(
            s.claim("k", "fp", "r5").await,
            Ok(Claim::Done("{\"a\":1}".into()))
        );
        // An answer is never released.
        s.release("k", "r4").await.expect("answered");
        assert_eq!(
            s.claim("k", "fp", "r6").await,
            Ok(Claim::Done("{\"a\":1}".into()))
        );
    }

    #[tokio::test]
    async fn bounded_by_count_and_bytes() {
        let s = MemoryIdempotency::new(Duration::from_secs(60), 3, 1 << 20);
        for k in ["a", "b", "c", "d"] {
            s.claim(k, "fp", "r").await.expect("claimed");
            s.finish(k, "fp", "x").await.expect("kept");
        }
        assert_eq!(s.inner.lock().map.len(), 3, "the oldest went");
        assert_eq!(s.claim("a", "fp", "r").await, Ok(Claim::New));
        let small = MemoryIdempotency::new(Duration::from_secs(60), 100, 1000);
        for k in 0..10 {
            small
                .claim(&k.to_string(), "fp", "r")
                .await
                .expect("claimed");
            small
                .finish(&k.to_string(), "fp", &"y".repeat(200))
                .await
                .expect("kept");
        }
        assert!(small.inner.lock().bytes <= 1000);
    }
}
