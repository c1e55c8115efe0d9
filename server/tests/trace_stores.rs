//! The two trace stores say the same thing. The embedded store applies each
//! event to its record; the Redis store writes each event as a field without
//! reading (one `HSET` per trace and batch) and folds the records when the
//! trace is read. A property test feeds both the same random events (users,
//! devices and details with `|` in them, a user's records without a device,
//! every state, history past its cap, random batch splits) and compares the
//! traces they give back, on a real redis-server. Under a flood the node's
//! trace writer loses nothing: not while the async workers are all busy (it
//! has a thread of its own), nor when pushes come faster than Redis takes
//! their events (they wait for room).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use mpush_protocol::session::ClientType;
use mpush_server::redis_conn::RedisHandle;
use mpush_server::store::redis::RedisTraces;
use mpush_server::store::{MemoryTraces, RecipientState, TraceEvent, TraceState, TraceStore};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const USERS: [&str; 3] = ["u1", "u|2", "用户"];
const DEVICES: [&str; 3] = ["", "d1", "d|2"];
const DETAILS: [Option<&str>; 5] = [
    None,
    Some(""),
    Some("b|c"),
    Some("forwarded from node A to node B"),
    Some("resent (retry 1)"),
];

#[derive(Debug, Clone)]
struct Ev {
    user: usize,
    device: usize,
    state: usize,
    detail: usize,
    client_type: i32,
}

fn event(trace: &Arc<str>, e: &Ev, at_ms: i64) -> TraceEvent {
    TraceEvent {
        trace_id: trace.clone(),
        user_id: USERS[e.user].into(),
        device_id: DEVICES[e.device].into(),
        client_type: ClientType::from_code(e.client_type).unwrap_or_default(),
        state: TraceState::ALL[e.state],
        detail: DETAILS[e.detail].map(|d| d.to_owned().into()),
        at_ms,
    }
}

fn events() -> impl Strategy<Value = (Vec<Ev>, Vec<usize>)> {
    let ev = (
        0..USERS.len(),
        0..DEVICES.len(),
        0..7usize,
        0..DETAILS.len(),
        1..4i32,
    )
        .prop_map(|(user, device, state, detail, client_type)| Ev {
            user,
            device,
            state,
            detail,
            client_type,
        });
    (
        proptest::collection::vec(ev, 1..60),
        proptest::collection::vec(1..20usize, 1..8),
    )
}

async fn stores(redis: &Redis) -> (MemoryTraces, RedisTraces) {
    let handle = RedisHandle::connect(&redis.url(), Duration::from_secs(2), None)
        .await
        .expect("redis");
    (
        MemoryTraces::new(600, 10_000, 64 << 20),
        RedisTraces {
            redis: handle,
            ttl_secs: 600,
            max_bytes: 0,
        },
    )
}

#[test]
fn the_redis_trace_store_folds_what_the_embedded_store_applies() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let redis = rt.block_on(Redis::start(free_port()));
    let (memory, on_redis) = rt.block_on(stores(&redis));
    let mut runner = TestRunner::new(Config {
        cases: 256,
        ..Config::default()
    });
    let n = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(&events(), |(evs, splits)| {
            let k = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let trace: Arc<str> = format!("prop-{k}").into();
            let now = mpush_server::clock::unix_ms();
            // The same event twice is one field on Redis (its latest time):
            // the sequences keep each (user, device, state, detail) once.
            let mut seen = std::collections::HashSet::new();
            let evs: Vec<TraceEvent> = evs
                .iter()
                .filter(|e| seen.insert((e.user, e.device, e.state, e.detail)))
                .enumerate()
                .map(|(i, e)| event(&trace, e, now + 7 * i as i64))
                .collect();
            rt.block_on(async {
                for s in [&memory as &dyn TraceStore, &on_redis] {
                    s.create(&trace, now).await.expect("create");
                    let mut rest = &evs[..];
                    for k in splits.iter().cycle() {
                        if rest.is_empty() {
                            break;
                        }
                        let (batch, tail) = rest.split_at((*k).min(rest.len()));
                        s.record(batch).await.expect("record");
                        rest = tail;
                    }
                }
                let a = memory.get(&trace).await.expect("get").expect("trace");
                let b = on_redis.get(&trace).await.expect("get").expect("trace");
                let sorted = |mut r: Vec<RecipientState>| {
                    r.sort_by(|x, y| (&x.user_id, &x.device_id).cmp(&(&y.user_id, &y.device_id)));
                    r
                };
                prop_assert_eq!(
                    sorted(a.recipients.clone()),
                    sorted(b.recipients.clone()),
                    "events: {:?}",
                    evs
                );
                prop_assert_eq!(a.state, b.state);
                Ok::<(), TestCaseError>(())
            })
        })
        .expect("the stores agree");
}

#[tokio::test]
async fn recording_on_redis_never_reads_and_a_repeated_event_is_one_field() {
    let redis = Redis::start(free_port()).await;
    let (_, store) = stores(&redis).await;
    let trace: Arc<str> = "t-repeat".into();
    store.create(&trace, 1).await.expect("create");
    redis.query(&["CONFIG", "RESETSTAT"]).await;
    let ev = |state, at_ms, detail: &'static str| TraceEvent {
        trace_id: trace.clone(),
        user_id: "u".into(),
        device_id: "d".into(),
        client_type: ClientType::from_code(1).unwrap_or_default(),
        state,
        detail: Some(detail.into()),
        at_ms,
    };
    // A device that reconnects over and over is sent the same kept message
    // each time: the same events, again and again.
    for k in 0..200 {
        store
            .record(&[
                ev(TraceState::Dispatched, 10 + 3 * k, "from the inbox"),
                ev(TraceState::Delivered, 11 + 3 * k, "written"),
            ])
            .await
            .expect("record");
    }
    let stats = format!("{:?}", redis.query(&["INFO", "commandstats"]).await);
    assert!(!stats.contains("cmdstat_hmget"), "{stats}");
    assert!(!stats.contains("cmdstat_hget:"), "{stats}");
    assert!(!stats.contains("cmdstat_hgetall"), "{stats}");
    let fields = redis.query(&["HLEN", "mp:trace:t-repeat"]).await;
    assert_eq!(
        fields,
        redis::Value::Int(3),
        "_meta and one field per event"
    );
    let view = store.get(&trace).await.expect("get").expect("trace");
    let r = &view.recipients[0];
    assert_eq!(
        (r.state, r.updated_at_ms),
        (TraceState::Delivered, 11 + 3 * 199)
    );
    assert_eq!(r.history.len(), 2, "{:?}", r.history);
}

#[tokio::test]
async fn traces_in_the_earlier_layout_still_read() {
    let redis = Redis::start(free_port()).await;
    let (_, store) = stores(&redis).await;
    // The earlier layout: a JSON record per `user|device`, written by a
    // node of the old version during a rolling upgrade.
    let old = r#"{"userId":"u","deviceId":"d","clientType":1,"state":"DELIVERED","detail":null,"updatedAtMs":20,"history":[["DISPATCHED",10,"forwarded from node A to node B"],["DELIVERED",20,null]]}"#;
    redis
        .query(&["HSET", "mp:trace:t-old", "_meta", "5", "u|d", old])
        .await;
    store
        .record(&[TraceEvent {
            trace_id: "t-old".into(),
            user_id: "u".into(),
            device_id: "d".into(),
            client_type: ClientType::from_code(1).unwrap_or_default(),
            state: TraceState::Ack,
            detail: None,
            at_ms: 30,
        }])
        .await
        .expect("record");
    let view = store.get("t-old").await.expect("get").expect("trace");
    assert_eq!(view.recipients.len(), 1, "{view:?}");
    let r = &view.recipients[0];
    assert_eq!((r.state, r.updated_at_ms), (TraceState::Ack, 30));
    assert_eq!(
        r.history.iter().map(|h| h.0).collect::<Vec<_>>(),
        [
            TraceState::Dispatched,
            TraceState::Delivered,
            TraceState::Ack
        ]
    );
    assert_eq!(
        r.history[0].2.as_deref(),
        Some("forwarded from node A to node B")
    );
}

/// `used_memory` of `redis`, in bytes.
async fn used_memory(redis: &Redis) -> i64 {
    let info = match redis.query(&["INFO", "memory"]).await {
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("INFO: {other:?}"),
    };
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory")
}

fn int(v: redis::Value) -> i64 {
    match v {
        redis::Value::Int(n) => n,
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).parse().unwrap_or(0),
        redis::Value::Nil => 0,
        other => panic!("not a number: {other:?}"),
    }
}

/// A Redis trace store on `redis`.
async fn traces_on(redis: &Redis, ttl_secs: u64, max_bytes: u64) -> RedisTraces {
    let handle = RedisHandle::connect(&redis.url(), Duration::from_secs(2), None)
        .await
        .expect("redis");
    RedisTraces {
        redis: handle,
        ttl_secs,
        max_bytes,
    }
}

/// `cmd` (`GET`, `ZCARD`, `HLEN`) of the bound's bookkeeping key `part`
/// (`sum`, `idx`, `w`), summed over its 16 shards.
async fn over_shards(redis: &Redis, cmd: &str, part: &str) -> i64 {
    let mut total = 0;
    for shard in 0..16 {
        total += int(redis
            .query(&[cmd, &format!("mp:traces:{{t{shard}}}:{part}")])
            .await);
    }
    total
}

/// Writes `traces` traces of 40 events each (about 6 KB of fields and
/// values a trace), oldest first, named `<name>-<n>`.
async fn fill(store: &RedisTraces, name: &str, traces: usize) {
    for t in 0..traces {
        let trace: Arc<str> = format!("{name}-{t:05}").into();
        store.create(&trace, t as i64).await.expect("create");
        let evs: Vec<TraceEvent> = (0..40)
            .map(|k| TraceEvent {
                trace_id: trace.clone(),
                user_id: format!("user-{k:03}-of-a-batch-push").into(),
                device_id: format!("device-{k:03}-{}", "x".repeat(32)).into(),
                client_type: ClientType::from_code(1).unwrap_or_default(),
                state: TraceState::Delivered,
                detail: Some(format!("forwarded from node A to node B, attempt {k}").into()),
                at_ms: t as i64,
            })
            .collect();
        store.record(&evs).await.expect("record");
    }
}

/// With `max_bytes`, Redis holds traces within the bound however many are
/// written (its own `used_memory`, not only the store's count, stays near
/// it), the newest stay readable and the oldest go, and the bookkeeping
/// agrees with the keys. Without it, the same writes take several times as
/// much.
#[tokio::test]
async fn a_bounded_redis_trace_store_holds_its_bytes_whatever_is_written() {
    const MAX: u64 = 2 << 20;
    const TRACES: usize = 3_000; // about 18 MB of fields and values
    let redis = Redis::start(free_port()).await;
    let handle = RedisHandle::connect(&redis.url(), Duration::from_secs(2), None)
        .await
        .expect("redis");
    let unbounded = RedisTraces {
        redis: handle.clone(),
        ttl_secs: 600,
        max_bytes: 0,
    };
    let base = used_memory(&redis).await;
    fill(&unbounded, "bounded", TRACES).await;
    let grew_unbounded = used_memory(&redis).await - base;
    redis.query(&["FLUSHALL", "SYNC"]).await;

    let store = RedisTraces {
        redis: handle,
        ttl_secs: 600,
        max_bytes: MAX,
    };
    let base = used_memory(&redis).await;
    fill(&store, "bounded", TRACES).await;
    let grew = used_memory(&redis).await - base;
    eprintln!("Redis grew {grew} B bounded at {MAX} B, {grew_unbounded} B unbounded");
    assert!(
        grew < (MAX + MAX / 2) as i64,
        "bounded: {grew} B of Redis for a bound of {MAX} B"
    );
    assert!(
        grew_unbounded > 4 * grew,
        "the bound is what holds it: {grew_unbounded} B unbounded, {grew} B bounded"
    );

    // The bookkeeping: the shards' sums within the bound, and exactly the
    // indexed traces have keys.
    let sum = over_shards(&redis, "GET", "sum").await;
    let indexed = over_shards(&redis, "ZCARD", "idx").await;
    assert!(sum as u64 <= MAX, "{sum}");
    let keys = match redis.query(&["KEYS", "mp:trace:*"]).await {
        redis::Value::Array(k) => k.len() as i64,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        keys, indexed,
        "every kept trace indexed, every evicted one deleted"
    );
    assert!(indexed > 100 && indexed < TRACES as i64, "{indexed} kept");

    // The newest are readable and whole; the oldest are gone.
    let newest = store
        .get(&format!("bounded-{:05}", TRACES - 1))
        .await
        .expect("get")
        .expect("the newest trace is kept");
    assert_eq!(newest.recipients.len(), 40);
    assert!(store.get("bounded-00000").await.expect("get").is_none());
}

/// Traces that expired leave the bookkeeping as the store goes on writing:
/// the index holds only live traces, with no timer.
#[tokio::test]
async fn expired_traces_leave_the_bound_s_index() {
    let redis = Redis::start(free_port()).await;
    let store = traces_on(&redis, 1, 64 << 20).await;
    fill(&store, "early", 100).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // A shard forgets its expired traces at its next write: 300 traces
    // write to each of the 16 (the chance that one gets none is 16 × (15/16)^300).
    fill(&store, "later", 300).await;
    let mut indexed = Vec::new();
    for shard in 0..16 {
        match redis
            .query(&["ZRANGE", &format!("mp:traces:{{t{shard}}}:idx"), "0", "-1"])
            .await
        {
            redis::Value::Array(m) => indexed.extend(m),
            other => panic!("{other:?}"),
        }
    }
    let early = indexed
        .iter()
        .filter(|m| matches!(m, redis::Value::BulkString(b) if b.starts_with(b"early")))
        .count();
    assert_eq!(early, 0, "the expired traces left the index");
    assert_eq!(indexed.len(), 300, "the live ones are all there");
    let weights = over_shards(&redis, "HLEN", "w").await;
    assert_eq!(weights, 300, "and only theirs are weighed");
}

/// A node's tracer on `redis`, its batches given `deadline`.
async fn tracer(redis: &Redis, deadline: Duration) -> mpush_server::logic::trace::Tracer {
    use mpush_server::logic::callback::Callbacks;
    let (_, store) = stores(redis).await;
    let sinks = Arc::new(mpush_server::sink::Sinks::start(
        &mpush_server::config::Sinks::default(),
        None,
    ));
    let callbacks = Arc::new(Callbacks::new(
        sinks,
        "n".into(),
        1_000,
        Duration::from_secs(60),
    ));
    mpush_server::logic::trace::Tracer::new(Arc::new(store), "n".into(), deadline, callbacks)
}

/// The node's trace writer keeps up with a flood while the async workers
/// are busy the whole time. The flood is the bench's batch phase: pushes
/// to 1,000 users each, DISPATCHED and DELIVERED per recipient, at about
/// 100k events a second, more events than the writer's queue holds (65,536).
/// The test holds the runtime's only worker for the whole flood, as the
/// connection tasks of a loaded node do: as a task on the workers, the
/// writer could not run until the flood ended, and its queue refused the
/// rest (tens of thousands of events lost). On a thread of its own, with
/// its own Redis connection, it drains as events arrive.
#[tokio::test(flavor = "current_thread")]
async fn a_flood_that_holds_every_async_worker_loses_no_trace_event_on_redis() {
    let redis = Redis::start(free_port()).await;
    let tracer = tracer(&redis, Duration::from_secs(2)).await;
    const TRACES: usize = 50;
    const USERS: usize = 1_000;
    let mut traces = Vec::new();
    for _ in 0..TRACES {
        traces.push(tracer.start(None).await.expect("trace"));
    }
    let users: Vec<Arc<str>> = (0..USERS).map(|u| format!("u{u}").into()).collect();
    let device: Arc<str> = "d".into();
    let total = 2 * TRACES * USERS;
    assert!(total > 1 << 16, "more events than the writer's queue holds");
    // No await from here to the end of the flood: this runtime's only
    // worker is ours. Paced at one event per 10 µs (spinning).
    let start = std::time::Instant::now();
    let mut n = 0u32;
    for t in &traces {
        for u in &users {
            for state in [TraceState::Dispatched, TraceState::Delivered] {
                tracer.record(t, u, &device, ClientType::Mobile, state, None);
                n += 1;
                while start.elapsed() < Duration::from_micros(10) * n {
                    std::hint::spin_loop();
                }
            }
        }
    }
    let flood = start.elapsed();
    assert_eq!(
        tracer.dropped(),
        0,
        "events refused during a {flood:?} flood of {total}"
    );
    // Every recipient of every trace reaches Redis, in order.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for t in &traces {
        loop {
            let view = tracer.get(t).await.expect("get").expect("the trace");
            let done = view.recipients.len() == USERS
                && view.recipients.iter().all(|r| {
                    r.history.iter().map(|h| h.0).collect::<Vec<_>>()
                        == [TraceState::Dispatched, TraceState::Delivered]
                });
            if done {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "trace {t}: {} recipients written",
                view.recipients.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(tracer.queued(), 0);
}

/// Backpressure: producers that wait for `Tracer::room` before each push go
/// at the pace Redis takes the events, however fast they could go, and
/// nothing is dropped. Here the pushes come as fast as the test can make
/// them (no pacing): 200 pushes to 1,000 users, 400,000 events, six times
/// what the writer's queue holds.
#[tokio::test(flavor = "current_thread")]
async fn producers_that_wait_for_room_lose_no_trace_event_however_fast_they_go() {
    let redis = Redis::start(free_port()).await;
    let tracer = tracer(&redis, Duration::from_secs(5)).await;
    const PUSHES: usize = 200;
    const USERS: usize = 1_000;
    let users: Vec<Arc<str>> = (0..USERS).map(|u| format!("u{u}").into()).collect();
    let device: Arc<str> = "d".into();
    let mut traces = Vec::new();
    let start = std::time::Instant::now();
    for _ in 0..PUSHES {
        let t = tracer.start(None).await.expect("trace");
        tracer.room().await;
        for u in &users {
            tracer.record(
                &t,
                u,
                &device,
                ClientType::Mobile,
                TraceState::Dispatched,
                None,
            );
        }
        for u in &users {
            tracer.record(
                &t,
                u,
                &device,
                ClientType::Mobile,
                TraceState::Delivered,
                None,
            );
        }
        traces.push(t);
    }
    let took = start.elapsed();
    assert_eq!(tracer.dropped(), 0, "events refused ({took:?})");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for t in &traces {
        loop {
            let view = tracer.get(t).await.expect("get").expect("the trace");
            if view.recipients.len() == USERS
                && view
                    .recipients
                    .iter()
                    .all(|r| r.state == TraceState::Delivered && r.history.len() == 2)
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "trace {t}: {} recipients written",
                view.recipients.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The bound is counted in the same pipeline as the write it counts; a
/// Redis that lost its scripts (a restart, a failover, `SCRIPT FLUSH`)
/// refuses that one command only. The write went through, and the count
/// goes again with the script loaded: both writes below are stored and
/// counted once each.
#[tokio::test]
async fn a_trace_write_after_redis_lost_its_scripts_is_counted_once() {
    let redis = Redis::start(free_port()).await;
    let store = traces_on(&redis, 600, 16 << 20).await;
    let counted = async || over_shards(&redis, "GET", "sum").await;
    // A fresh Redis has no script yet: the first write meets NOSCRIPT too.
    store.create("lost-1", 1).await.expect("the first write");
    let one = counted().await;
    assert!(one > 0, "the first write is counted");
    redis.query(&["SCRIPT", "FLUSH"]).await;
    store
        .create("lost-2", 2)
        .await
        .expect("a write after SCRIPT FLUSH");
    let two = counted().await;
    assert_eq!(two, 2 * one, "each trace counted once (same-length ids)");
    for id in ["lost-1", "lost-2"] {
        assert_eq!(
            int(redis.query(&["EXISTS", &format!("mp:trace:{id}")]).await),
            1,
            "{id} written"
        );
    }
}
