//! The Redis implementations of the stores (cluster mode). Keys follow mpush
//! where it had them (`mp:rs:` sessions, `mp:ur:` routes); the rest are ours.
//! Every command has a timeout; failures are logged and reported, never panics.
//!
//! One file per backend, as `memory.rs`: every key layout of the cluster in
//! one place (the operators' reference for what is in Redis).

use async_trait::async_trait;
use base64::Engine as _;
use bytes::Bytes;
use mpush_protocol::crypto::ResumeKey;
use mpush_protocol::session::{
    AckMode, ClientType, DeviceInfo, KeptBinding, SessionRecord, SessionSecret,
};
use redis::AsyncCommands;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use tracing::warn;

use super::{
    Failure, InboxError, InboxStore, MAX_HISTORY, RecipientState, SessionStore, StateCounts,
    StoreError, StoredMessage, TopicFull, TopicStore, TraceCounts, TraceEvent, TraceState,
    TraceStore, TraceView,
};
use crate::clock::unix_ms;
use crate::redis_conn::RedisHandle;

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn unb64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

/// A failed command: counted, logged, and reported as the store being down.
fn check<T>(store: &'static str, what: &str, r: redis::RedisResult<T>) -> Result<T, StoreError> {
    r.map_err(|e| {
        metrics::counter!("mpush_redis_errors_total", "store" => store).increment(1);
        warn!(error = %e, "redis {what} failed");
        StoreError::new(store, e)
    })
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
    async fn put(&self, r: SessionRecord) -> Result<(), StoreError> {
        let ttl_ms = (r.expire_at_ms - unix_ms()).max(1000);
        self.write(&r, ttl_ms, false).await.map(drop)
    }

    async fn remove(&self, session_id: &str) -> Result<bool, StoreError> {
        let mut c = self.redis.conn();
        let n = check(
            "sessions",
            "session remove",
            c.del::<_, i64>(format!("mp:rs:{session_id}")).await,
        )?;
        Ok(n > 0)
    }

    async fn get(&self, session_id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let mut c = self.redis.conn();
        let key = format!("mp:rs:{session_id}");
        let (value, pttl): (Option<String>, i64) = check(
            "sessions",
            "session get",
            redis::pipe().get(&key).pttl(&key).query_async(&mut c).await,
        )?;
        Ok(parse_session(&self.sealer, session_id, value, pttl))
    }

    async fn set_binding(
        &self,
        session_id: &str,
        binding: Option<KeptBinding>,
    ) -> Result<bool, StoreError> {
        let mut c = self.redis.conn();
        let key = format!("mp:rs:{session_id}");
        let (value, pttl): (Option<String>, i64) = check(
            "sessions",
            "session get",
            redis::pipe().get(&key).pttl(&key).query_async(&mut c).await,
        )?;
        let Some(mut r) = parse_session(&self.sealer, session_id, value, pttl) else {
            return Ok(false);
        };
        if pttl <= 0 || r.binding == binding {
            return Ok(pttl > 0);
        }
        r.binding = binding;
        // XX: a session removed meanwhile (its ticket used) stays removed.
        self.write(&r, pttl, true).await
    }
}

impl RedisSessions {
    /// SET of a record for `ttl_ms`; with `only_existing`, only over a
    /// session that is still there (true when written).
    async fn write(
        &self,
        r: &SessionRecord,
        ttl_ms: i64,
        only_existing: bool,
    ) -> Result<bool, StoreError> {
        let value = match &r.secret {
            SessionSecret::Legacy { .. } => r.to_mpush_value().unwrap_or_default(),
            SessionSecret::V2 { resume_key } | SessionSecret::Transport { resume_key } => {
                let mut v = json!({
                    // "t": a transport-secured session (ADR 0005), resumed only over TLS.
                    "v": 2,
                    "t": r.secret.is_transport(),
                    "deviceId": r.device.device_id,
                    "osName": r.device.os_name,
                    "osVersion": r.device.os_version,
                    "clientVersion": r.device.client_version,
                    "resumeKey": b64(&resume_key.0),
                });
                if let Some(b) = &r.binding {
                    // ADR 0008: the kept binding, sealed with the rest.
                    v["binding"] = json!({
                        "userId": b.user_id,
                        "tags": b.tags,
                        "expiresAtMs": b.expires_at_ms,
                    });
                }
                v.to_string()
            }
        };
        let value = match &self.sealer {
            Some(s) => s.seal(&r.session_id, &value),
            None => value,
        };
        let mut c = self.redis.conn();
        let mut cmd = redis::cmd("SET");
        cmd.arg(format!("mp:rs:{}", r.session_id))
            .arg(value)
            .arg("PX")
            .arg(ttl_ms);
        if only_existing {
            cmd.arg("XX");
        }
        let res: redis::RedisResult<Option<String>> = cmd.query_async(&mut c).await;
        check("sessions", "session put", res).map(|ok| ok.is_some())
    }
}

fn parse_session(
    sealer: &Option<SessionSealer>,
    session_id: &str,
    value: Option<String>,
    pttl: i64,
) -> Option<SessionRecord> {
    {
        let value = match (sealer, value?) {
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
            secret: SessionSecret::resumable(ResumeKey(key), v["t"].as_bool() == Some(true)),
            expire_at_ms,
            binding: v.get("binding").and_then(|b| {
                Some(KeptBinding {
                    user_id: b["userId"].as_str()?.to_owned(),
                    tags: b["tags"].as_str().unwrap_or_default().to_owned(),
                    expires_at_ms: b["expiresAtMs"].as_i64().unwrap_or(0),
                })
            }),
        })
    }
}

/// Traces: a hash per trace (`mp:trace:<id>`). Each recipient event is a
/// field of its own (`e:<hash>` of user, device, state and detail; the value
/// `v1|<client type>|<unix ms>|<STATE>|<user len>|<device len>|<detail len or ->|<user><device><detail>`),
/// written without reading: a batch of events is one `HSET` per trace, and
/// the recipients' states are folded from their events when the trace is
/// read. The same event again (same state and detail) replaces its field, so
/// a recipient holds at most one field per distinct state and detail (a
/// retry's detail names its attempt). A broadcast's counts are
/// `n:<node>:<STATE>` counters and its failures `f:<user>|<device>`; all
/// expire with the trace TTL. Fields `<user>|<device>` holding a JSON state
/// are the earlier layout (read, never written).
///
/// With `max_bytes` set, the traces' bytes are also bounded: each write is
/// counted (its fields and values, plus a per-field overhead) into one of 16
/// shards of bookkeeping (`mp:traces:{tN}:idx`, a sorted set of trace ids by
/// creation; `:w`, each trace's bytes; `:sum`, the shard's), updated by one
/// script, so the sum is always that of the traces indexed. Once a shard is
/// over its sixteenth, its oldest traces are deleted. A trace that expired
/// leaves the index at the shard's next write; the bookkeeping keys expire a
/// TTL after their shard's last write, when every trace they count has. An
/// event for a trace already deleted recreates its key uncounted (as for an
/// expired one).
pub struct RedisTraces {
    pub redis: RedisHandle,
    pub ttl_secs: u64,
    /// 0: bounded by `ttl_secs` only.
    pub max_bytes: u64,
}

/// Shards of the traces' byte bound (one hash slot each on a Redis Cluster,
/// so the bookkeeping of busy traces is not all on one node).
const TRACE_SHARDS: u64 = 16;

/// What Redis spends on a hash field besides its name and value: its
/// entry in the hash table, the strings' headers and the allocator's
/// rounding (calibrated on `used_memory` by the bounded store's test).
const FIELD_OVERHEAD: u64 = 100;

/// Counts a write of `ARGV[4]` bytes to trace `ARGV[3]` (created now when
/// `ARGV[6]` is 1; not counted when the trace is not indexed) at `ARGV[1]`
/// ms; forgets indexed traces created before `ARGV[2]` (expired); then, while
/// the shard is over `ARGV[5]` bytes, takes out its oldest traces (64 at
/// most per call) and returns their ids for deletion.
static TRACE_ACCOUNT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(TRACE_ACCOUNT_LUA));
const TRACE_ACCOUNT_LUA: &str = r#"
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2], 'LIMIT', 0, 32)
for _, g in ipairs(gone) do
  total = total - tonumber(redis.call('HGET', KEYS[2], g) or '0')
  redis.call('HDEL', KEYS[2], g)
  redis.call('ZREM', KEYS[1], g)
end
if ARGV[6] == '1' then
  redis.call('ZADD', KEYS[1], 'NX', ARGV[1], ARGV[3])
end
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  redis.call('HINCRBY', KEYS[2], ARGV[3], ARGV[4])
  total = total + tonumber(ARGV[4])
end
local max = tonumber(ARGV[5])
local out = {}
while total > max and #out < 64 do
  local p = redis.call('ZPOPMIN', KEYS[1])
  if #p == 0 then break end
  total = total - tonumber(redis.call('HGET', KEYS[2], p[1]) or '0')
  redis.call('HDEL', KEYS[2], p[1])
  out[#out + 1] = p[1]
end
if total < 0 or redis.call('ZCARD', KEYS[1]) == 0 then total = 0 end
redis.call('SET', KEYS[3], total, 'PX', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
return out
"#;

fn state_name(s: TraceState) -> &'static str {
    s.name()
}

fn state_from(s: &str) -> TraceState {
    TraceState::from_name(s).unwrap_or(TraceState::Accepted)
}

/// FNV-1a, 64 bits: a field name that is the same on every node and version.
fn fnv64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.iter().chain(std::iter::once(&0xff)) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// One event's field and value (see [`RedisTraces`]).
fn event_entry(e: &TraceEvent) -> (String, String) {
    use std::fmt::Write as _;
    let state = state_name(e.state);
    let detail = e.detail.as_deref();
    let field = format!(
        "e:{:016x}",
        fnv64(&[
            e.user_id.as_bytes(),
            e.device_id.as_bytes(),
            state.as_bytes(),
            detail.map_or(&[0xfe][..], str::as_bytes),
        ])
    );
    let mut v = String::with_capacity(
        48 + e.user_id.len() + e.device_id.len() + detail.map_or(0, str::len),
    );
    let _ = write!(
        v,
        "v1|{}|{}|{state}|{}|{}|",
        e.client_type.code(),
        e.at_ms,
        e.user_id.len(),
        e.device_id.len()
    );
    match detail {
        Some(d) => {
            let _ = write!(v, "{}|", d.len());
        }
        None => v.push_str("-|"),
    }
    v.push_str(&e.user_id);
    v.push_str(&e.device_id);
    v.push_str(detail.unwrap_or_default());
    (field, v)
}

/// A recipient event as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StoredEvent {
    user_id: String,
    device_id: String,
    client_type: ClientType,
    state: TraceState,
    at_ms: i64,
    detail: Option<String>,
}

fn parse_event(v: &str) -> Option<StoredEvent> {
    let mut it = v.splitn(8, '|');
    if it.next()? != "v1" {
        return None;
    }
    let client_type = ClientType::from_code(it.next()?.parse().ok()?).unwrap_or_default();
    let at_ms = it.next()?.parse().ok()?;
    let state = TraceState::from_name(it.next()?)?;
    let ulen: usize = it.next()?.parse().ok()?;
    let dlen: usize = it.next()?.parse().ok()?;
    let tlen: Option<usize> = match it.next()? {
        "-" => None,
        n => Some(n.parse().ok()?),
    };
    let rest = it.next()?;
    let (user_id, rest) = (rest.get(..ulen)?, rest.get(ulen..)?);
    let (device_id, detail) = (rest.get(..dlen)?, rest.get(dlen..)?);
    if tlen.unwrap_or(0) != detail.len() {
        return None;
    }
    Some(StoredEvent {
        user_id: user_id.to_owned(),
        device_id: device_id.to_owned(),
        client_type,
        state,
        at_ms,
        detail: tlen.map(|_| detail.to_owned()),
    })
}

/// The events of a record in the earlier layout (a JSON record per recipient).
fn legacy_events(r: RecipientState) -> Vec<StoredEvent> {
    let ev = |(state, at_ms, detail)| StoredEvent {
        user_id: r.user_id.clone(),
        device_id: r.device_id.clone(),
        client_type: r.client_type,
        state,
        at_ms,
        detail,
    };
    if r.history.is_empty() {
        vec![ev((r.state, r.updated_at_ms, r.detail.clone()))]
    } else {
        r.history.iter().cloned().map(ev).collect()
    }
}

/// The recipients' states from their events, folded as the embedded store
/// applies them, in time order (a state's rank breaks a tie): a state
/// replaces the current one unless it ranks lower (OFFLINE is always
/// replaced); a user's record without a device (offline, or a hop to another
/// node) becomes the first device that gets the message after it. In the
/// order the records began, as the embedded store keeps them (the view then
/// merges what is left of a user's records without a device into its first
/// device's).
fn fold_recipients(events: Vec<StoredEvent>) -> Vec<RecipientState> {
    let mut by_user: HashMap<String, Vec<StoredEvent>> = HashMap::new();
    for e in events {
        by_user.entry(e.user_id.clone()).or_default().push(e);
    }
    let mut out = Vec::new();
    for (_, mut evs) in by_user {
        evs.sort_by_key(|e| (e.at_ms, e.state.rank()));
        let mut records: Vec<RecipientState> = Vec::new();
        for e in evs {
            let i = records
                .iter()
                .position(|r| r.device_id == e.device_id)
                .or_else(|| {
                    // The placeholder becomes the device that got it.
                    (!e.device_id.is_empty())
                        .then(|| records.iter().position(|r| r.device_id.is_empty()))
                        .flatten()
                });
            match i {
                Some(i) => {
                    let r = &mut records[i];
                    if r.device_id.is_empty() {
                        r.device_id = e.device_id;
                        r.client_type = e.client_type;
                    }
                    if r.history.len() >= MAX_HISTORY {
                        r.history.remove(MAX_HISTORY / 2);
                    }
                    r.history.push((e.state, e.at_ms, e.detail.clone()));
                    if e.state.rank() >= r.state.rank() || r.state == TraceState::Offline {
                        r.state = e.state;
                        r.detail = e.detail;
                        r.updated_at_ms = e.at_ms;
                    }
                }
                None => records.push(RecipientState {
                    user_id: e.user_id,
                    device_id: e.device_id,
                    client_type: e.client_type,
                    state: e.state,
                    detail: e.detail.clone(),
                    updated_at_ms: e.at_ms,
                    history: vec![(e.state, e.at_ms, e.detail)],
                }),
            }
        }
        out.extend(records.into_iter().map(|r| {
            let began = r.history.first().map_or(r.updated_at_ms, |h| h.1);
            (began, r)
        }));
    }
    // Stable: a user's records stay in the order they began.
    out.sort_by_key(|(began, _)| *began);
    out.into_iter().map(|(_, r)| r).collect()
}

impl RedisTraces {
    /// The counting script's call for `bytes` written to `trace_id`.
    fn account_call(
        &self,
        trace_id: &str,
        bytes: u64,
        create: bool,
    ) -> redis::ScriptInvocation<'static> {
        let shard = fnv64(&[trace_id.as_bytes()]) % TRACE_SHARDS;
        let now = unix_ms();
        let horizon = now
            .saturating_sub(i64::try_from(self.ttl_secs.saturating_mul(1000)).unwrap_or(i64::MAX));
        let mut call = TRACE_ACCOUNT.key(format!("mp:traces:{{t{shard}}}:idx"));
        call.key(format!("mp:traces:{{t{shard}}}:w"))
            .key(format!("mp:traces:{{t{shard}}}:sum"))
            .arg(now)
            .arg(horizon)
            .arg(trace_id)
            .arg(bytes)
            .arg(self.max_bytes / TRACE_SHARDS)
            .arg(if create { "1" } else { "0" })
            // The bookkeeping expires with the last trace it counts: a shard
            // not written for a TTL indexes only expired traces.
            .arg(self.ttl_secs.saturating_mul(1000).max(1));
        call
    }

    /// Sends `p`, a write of `bytes` to `trace_id`, and counts them against
    /// the bound (when there is one) in the same pipeline: the bound costs
    /// a command, not a round trip. On a Redis Cluster the bookkeeping is
    /// in another slot, so it is a call of its own after the write.
    async fn write_counted(
        &self,
        mut p: redis::Pipeline,
        trace_id: &str,
        bytes: u64,
        create: bool,
        what: &'static str,
    ) -> Result<(), StoreError> {
        let mut c = self.redis.conn();
        if self.max_bytes == 0 || bytes == 0 {
            return check("traces", what, p.query_async::<()>(&mut c).await);
        }
        let call = self.account_call(trace_id, bytes, create);
        let out = if self.redis.cluster_nodes().is_some() {
            check("traces", what, p.query_async::<()>(&mut c).await)?;
            check("traces", "trace account", call.invoke_async(&mut c).await)?
        } else {
            p.invoke_script(&call);
            match p.query_async::<(Vec<String>,)>(&mut c).await {
                Ok((out,)) => out,
                // Redis lost its scripts (a restart, a failover, SCRIPT
                // FLUSH). The pipeline is not a transaction: the write went
                // through and only the count did not, so the count alone
                // goes again, loading the script first.
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    check("traces", "trace account", call.invoke_async(&mut c).await)?
                }
                Err(e) => return check("traces", what, Err(e)),
            }
        };
        self.evict(out).await
    }

    /// Deletes the traces the bound pushed out.
    async fn evict(&self, out: Vec<String>) -> Result<(), StoreError> {
        if out.is_empty() {
            return Ok(());
        }
        metrics::counter!("mpush_traces_evicted_total").increment(out.len() as u64);
        // UNLINK: a large trace is freed off Redis's main thread.
        if self.redis.cluster_nodes().is_some() {
            // A Redis Cluster pipeline stays within one slot: one command
            // per trace, several in flight.
            let done: Vec<Result<(), StoreError>> = futures_util::stream::iter(out)
                .map(|id| async move {
                    let mut c = self.redis.conn();
                    let res = redis::cmd("UNLINK")
                        .arg(format!("mp:trace:{id}"))
                        .query_async::<()>(&mut c)
                        .await;
                    check("traces", "trace evict", res)
                })
                .buffer_unordered(16)
                .collect()
                .await;
            return done.into_iter().collect();
        }
        let mut c = self.redis.conn();
        let mut p = redis::pipe();
        for id in &out {
            p.cmd("UNLINK").arg(format!("mp:trace:{id}")).ignore();
        }
        check("traces", "trace evict", p.query_async::<()>(&mut c).await)
    }

    /// One trace's events as one write, whatever their number, and no read;
    /// with the bytes it writes.
    fn record_pipe(&self, trace_id: &str, events: &[&TraceEvent]) -> (redis::Pipeline, u64) {
        let key = format!("mp:trace:{trace_id}");
        let mut hset = redis::cmd("HSET");
        hset.arg(&key);
        let mut bytes = 0;
        for e in events {
            let (f, v) = event_entry(e);
            bytes += (f.len() + v.len()) as u64 + FIELD_OVERHEAD;
            hset.arg(f).arg(v);
        }
        let mut p = redis::pipe();
        p.add_command(hset).ignore();
        // An event for a trace that has expired recreates the key (without
        // `_meta`, so it reads as no trace): EXPIRE NX gives it a TTL then,
        // and leaves a live one alone (Redis 7).
        p.cmd("EXPIRE")
            .arg(&key)
            .arg(self.ttl_secs)
            .arg("NX")
            .ignore();
        (p, bytes)
    }
}

#[async_trait]
impl TraceStore for RedisTraces {
    async fn create(&self, trace_id: &str, at_ms: i64) -> Result<(), StoreError> {
        let key = format!("mp:trace:{trace_id}");
        let mut p = redis::pipe();
        p.hset_nx(&key, "_meta", at_ms)
            .ignore()
            .expire(&key, self.ttl_secs as i64)
            .ignore();
        let bytes = 2 * (key.len() as u64 + FIELD_OVERHEAD) + 20;
        self.write_counted(p, trace_id, bytes, true, "trace create")
            .await
    }

    async fn record(&self, events: &[TraceEvent]) -> Result<(), StoreError> {
        // Grouped by trace: each trace costs one write per batch (one slot
        // each on a Redis Cluster), several at a time.
        let mut by_trace: Vec<(Arc<str>, Vec<&TraceEvent>)> = Vec::new();
        for e in events {
            match by_trace.iter_mut().find(|(t, _)| *t == e.trace_id) {
                Some((_, v)) => v.push(e),
                None => by_trace.push((e.trace_id.clone(), vec![e])),
            }
        }
        let pipes: Vec<(Arc<str>, redis::Pipeline, u64)> = by_trace
            .iter()
            .map(|(t, evs)| {
                let (p, bytes) = self.record_pipe(t, evs);
                (t.clone(), p, bytes)
            })
            .collect();
        let results: Vec<Result<(), StoreError>> = futures_util::stream::iter(pipes)
            .map(|(t, p, bytes)| async move {
                self.write_counted(p, &t, bytes, false, "trace record")
                    .await
            })
            .buffer_unordered(16)
            .collect()
            .await;
        results.into_iter().collect()
    }

    async fn reopen(&self) -> Result<Option<Arc<dyn TraceStore>>, StoreError> {
        let redis = self
            .redis
            .reopen()
            .await
            .map_err(|e| StoreError::new("traces", e))?;
        Ok(Some(Arc::new(Self {
            redis,
            ttl_secs: self.ttl_secs,
            max_bytes: self.max_bytes,
        })))
    }

    async fn expect_nodes(&self, trace_id: &str, nodes: u64) -> Result<(), StoreError> {
        let key = format!("mp:trace:{trace_id}");
        let mut c = self.redis.conn();
        let res: redis::RedisResult<()> = redis::pipe()
            .hset(&key, "x", nodes)
            .ignore()
            .cmd("EXPIRE")
            .arg(&key)
            .arg(self.ttl_secs)
            .arg("NX")
            .ignore()
            .query_async(&mut c)
            .await;
        check("traces", "trace expect", res)
    }

    async fn count(&self, counts: &[TraceCounts]) -> Result<(), StoreError> {
        for tc in counts {
            let key = format!("mp:trace:{}", tc.trace_id);
            let mut p = redis::pipe();
            for st in TraceState::ALL {
                let n = tc.counts.get(st);
                if n > 0 {
                    p.hincr(&key, format!("n:{}:{}", tc.node, st.name()), n)
                        .ignore();
                }
            }
            if let Some(ack) = tc.handed {
                // The node appears even when it matched nobody.
                p.hincr(
                    &key,
                    format!("n:{}:{}", tc.node, TraceState::Dispatched.name()),
                    0,
                )
                .ignore();
                p.hset(&key, format!("h:{}", tc.node), if ack { "1" } else { "0" })
                    .ignore();
            }
            // The counters are a few fields per node, counted up in place:
            // what grows is the failures.
            let mut bytes = 0;
            for f in &tc.failures {
                let v = serde_json::to_string(f).unwrap_or_default();
                let field = format!("f:{}|{}", f.user_id, f.device_id);
                bytes += (field.len() + v.len()) as u64 + FIELD_OVERHEAD;
                p.hset(&key, field, v).ignore();
            }
            p.cmd("EXPIRE")
                .arg(&key)
                .arg(self.ttl_secs)
                .arg("NX")
                .ignore();
            self.write_counted(p, &tc.trace_id, bytes, false, "trace count")
                .await?;
        }
        Ok(())
    }

    async fn get(&self, trace_id: &str) -> Result<Option<TraceView>, StoreError> {
        let mut c = self.redis.conn();
        let all: HashMap<String, String> = check(
            "traces",
            "trace get",
            c.hgetall(format!("mp:trace:{trace_id}")).await,
        )?;
        let Some(created_at_ms) = all.get("_meta").map(|m| m.parse().unwrap_or(0)) else {
            return Ok(None);
        };
        let mut nodes: std::collections::BTreeMap<String, StateCounts> = Default::default();
        let mut failures = Vec::new();
        let mut events = Vec::new();
        let mut handed = std::collections::BTreeMap::new();
        // A cluster broadcast without the count of nodes it reached (not
        // written yet, or Redis refused it) is not known to be finished.
        let mut expected = Some(u64::MAX);
        for (k, v) in &all {
            if k == "_meta" {
                continue;
            }
            if k == "x" {
                expected = v.parse().ok().or(expected);
                continue;
            }
            if let Some(node) = k.strip_prefix("h:") {
                handed.insert(node.to_owned(), v == "1");
                continue;
            }
            if let Some(rest) = k.strip_prefix("n:") {
                if let Some((node, st)) = rest.rsplit_once(':')
                    && let Some(st) = TraceState::from_name(st)
                {
                    nodes
                        .entry(node.to_owned())
                        .or_default()
                        .add(st, v.parse().unwrap_or(0));
                }
            } else if k.starts_with("f:") {
                if let Ok(f) = serde_json::from_str::<Failure>(v) {
                    failures.push(f);
                }
            } else if k.starts_with("e:")
                && let Some(e) = parse_event(v)
            {
                events.push(e);
            } else if v.starts_with('{')
                && let Ok(v) = serde_json::from_str::<Value>(v)
            {
                events.extend(legacy_events(recipient_from_json(&v)));
            }
        }
        // In (user, device) order.
        let recipients = fold_recipients(events);
        failures.sort_by(|a, b| (&a.user_id, &a.device_id).cmp(&(&b.user_id, &b.device_id)));
        Ok(Some(super::memory::view(
            trace_id,
            created_at_ms,
            recipients,
            nodes.into_iter().collect(),
            &handed,
            expected,
            failures,
        )))
    }
}

/// A stored client type (mpush's integer); `None` when absent or unknown.
fn code(v: &Value) -> Option<ClientType> {
    ClientType::from_code(i32::try_from(v.as_i64()?).ok()?)
}

fn recipient_from_json(v: &Value) -> RecipientState {
    RecipientState {
        user_id: v["userId"].as_str().unwrap_or_default().to_owned(),
        device_id: v["deviceId"].as_str().unwrap_or_default().to_owned(),
        client_type: code(&v["clientType"]).unwrap_or_default(),
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
        "id": m.message_id, "trace": &*m.trace_id, "content": b64(&m.content),
        "ack": match m.ack_mode { AckMode::None => 0, AckMode::Auto => 1, AckMode::Biz => 2 },
        "ct": m.client_type, "exp": m.expires_at_ms,
    })
    .to_string()
}

fn message_from(s: &str) -> Option<StoredMessage> {
    let v: Value = serde_json::from_str(s).ok()?;
    Some(StoredMessage {
        message_id: v["id"].as_u64()?,
        trace_id: v["trace"].as_str()?.into(),
        content: Bytes::from(unb64(v["content"].as_str()?)?),
        ack_mode: match v["ack"].as_u64() {
            Some(1) => AckMode::Auto,
            Some(2) => AckMode::Biz,
            _ => AckMode::None,
        },
        client_type: v["ct"].as_i64().map(|_| code(&v["ct"]).unwrap_or_default()),
        expires_at_ms: v["exp"].as_i64()?,
    })
}

#[async_trait]
impl InboxStore for RedisInbox {
    async fn push(&self, user_id: &str, message: StoredMessage) -> Result<(), InboxError> {
        let key = format!("mp:inbox:{user_id}");
        // Drops expired entries first (list does), then checks and appends in
        // one script: concurrent pushes cannot overshoot the cap.
        self.list(user_id, unix_ms()).await?;
        let mut c = self.redis.conn();
        let res: redis::RedisResult<i64> = redis::Script::new(INBOX_PUSH)
            .key(&key)
            .arg(self.max)
            .arg(message.message_id.to_string())
            .arg(message_json(&message))
            .arg(self.max_ttl_secs)
            .invoke_async(&mut c)
            .await;
        match check("inbox", "inbox push", res)? {
            0 => Err(InboxError::Full(user_id.to_owned())),
            _ => Ok(()),
        }
    }

    async fn list(&self, user_id: &str, now_ms: i64) -> Result<Vec<StoredMessage>, StoreError> {
        let key = format!("mp:inbox:{user_id}");
        let mut c = self.redis.conn();
        let raw: Vec<String> = check("inbox", "inbox list", c.lrange(&key, 0, -1).await)?;
        let mut out = Vec::new();
        for r in raw {
            match message_from(&r) {
                Some(m) if m.expires_at_ms > now_ms => out.push(m),
                _ => {
                    check(
                        "inbox",
                        "inbox expire",
                        c.lrem::<_, _, i64>(&key, 1, &r).await,
                    )?;
                }
            }
        }
        Ok(out)
    }

    async fn remove(&self, user_id: &str, message_id: u64) -> Result<bool, StoreError> {
        let key = format!("mp:inbox:{user_id}");
        let mut c = self.redis.conn();
        let raw: Vec<String> = check("inbox", "inbox list", c.lrange(&key, 0, -1).await)?;
        for r in raw {
            if message_from(&r).is_some_and(|m| m.message_id == message_id) {
                let n: i64 = check("inbox", "inbox remove", c.lrem(&key, 1, &r).await)?;
                return Ok(n > 0);
            }
        }
        Ok(false)
    }

    async fn len(&self, user_id: &str) -> Result<usize, StoreError> {
        Ok(self.list(user_id, unix_ms()).await?.len())
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
    async fn add(&self, key: &str, member: &str, max: usize) -> Result<i64, StoreError> {
        let mut c = self.redis.conn();
        check(
            "topics",
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
        if self.add(&ukey, topic, self.max_topics_per_user).await? == -1 {
            return Err(TopicFull::User(
                user_id.to_owned(),
                self.max_topics_per_user,
            ));
        }
        match self.add(&tkey, user_id, self.max_subscribers).await? {
            -1 => {
                let mut c = self.redis.conn();
                check(
                    "topics",
                    "topic undo",
                    c.srem::<_, _, i64>(&ukey, topic).await,
                )?;
                Err(TopicFull::Topic(topic.to_owned(), self.max_subscribers))
            }
            n => Ok(n == 1),
        }
    }

    async fn unsubscribe(&self, topic: &str, user_id: &str) -> Result<bool, StoreError> {
        let mut c = self.redis.conn();
        check(
            "topics",
            "topic unsubscribe",
            c.srem::<_, _, i64>(format!("mp:ut:{user_id}"), topic).await,
        )?;
        let n: i64 = check(
            "topics",
            "topic unsubscribe",
            c.srem(format!("mp:topic:{topic}"), user_id).await,
        )?;
        Ok(n > 0)
    }

    async fn subscribers(&self, topic: &str) -> Result<Vec<String>, StoreError> {
        let mut c = self.redis.conn();
        let mut v: Vec<String> = check(
            "topics",
            "topic members",
            c.smembers(format!("mp:topic:{topic}")).await,
        )?;
        v.sort();
        Ok(v)
    }
}
