//! Up-push throughput (client → backend): connections push up as fast as
//! the server accepts (a window of un-ACKed pushes each); the server hands
//! them to a webhook (synchronous: ACK after the receiver's 2xx; asynchronous:
//! ACK once queued) or to a Redis Stream (ACK after XADD). Measured: accepted
//! messages/s, push → ACK latency, and that the backend got every one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use mpush_protocol::client::{ClientConfig, ClientConnection, ClientEvent};
use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::dedup::DedupWindow;
use mpush_protocol::session::{AckMode, DeviceInfo};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Redis, Sizes, start_redis, start_server_with};

/// Un-ACKed up-pushes per connection.
const WINDOW: usize = 16;

/// A webhook receiver that counts events (answers 204).
async fn receiver() -> Result<(String, Arc<AtomicU64>)> {
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    let app = axum::Router::new().route(
        "/",
        axum::routing::post(move |body: axum::body::Bytes| {
            let c = c.clone();
            async move {
                let n = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v["events"].as_array().map(Vec::len))
                    .unwrap_or(0);
                c.fetch_add(n as u64, Ordering::Relaxed);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", l.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    Ok((url, count))
}

/// One client: handshake, bind, then `n` up-pushes with `WINDOW` in flight.
async fn client(
    addr: String,
    i: usize,
    n: usize,
    hist: Arc<std::sync::Mutex<Histogram<u64>>>,
) -> Result<()> {
    let device = DeviceInfo {
        device_id: format!("up-{i}"),
        os_name: "android".into(),
        os_version: "14".into(),
        client_version: "bench".into(),
    };
    let mut cfg = ClientConfig::new(Arc::new(RsaPublic::mpush_default()), device);
    cfg.handshake_timeout = Duration::from_secs(30);
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
    let mut m = ClientConnection::new(
        Arc::new(cfg),
        seed,
        mpush_protocol::Instant::now(),
        0,
        None,
        DedupWindow::new(16),
    );
    let mut s = tokio::net::TcpStream::connect(&addr).await?;
    s.set_nodelay(true)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut sent = 0;
    let mut acked = 0;
    let mut bound = false;
    let mut in_flight: std::collections::HashMap<i32, Instant> = std::collections::HashMap::new();
    let content = [b'x'; 64];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        while let Some(e) = m.poll_event() {
            match e {
                ClientEvent::Connected { .. } => {
                    m.bind(&format!("up{i}"), "", "", mpush_protocol::Instant::now())
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                }
                ClientEvent::BindOk { .. } => bound = true,
                ClientEvent::PushAcked { request } => {
                    if let Some(t) = in_flight.remove(&request) {
                        acked += 1;
                        if let Ok(mut h) = hist.lock() {
                            let _ = h.record((t.elapsed().as_micros() as u64).max(1));
                        }
                    }
                }
                ClientEvent::PushRefused { reason, .. } => bail!("refused: {reason}"),
                ClientEvent::PushTimedOut { .. } => bail!("an up-push got no answer"),
                ClientEvent::Closed { reason, .. } => bail!("closed: {reason:?}"),
                _ => {}
            }
        }
        if acked == n {
            return Ok(());
        }
        while bound && sent < n && in_flight.len() < WINDOW {
            let now = mpush_protocol::Instant::now();
            let id = m
                .push(&content, AckMode::Auto, Duration::from_secs(30), now)
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            in_flight.insert(id, Instant::now());
            sent += 1;
        }
        while let Some(b) = m.poll_transmit() {
            s.write_all(&b).await?;
        }
        let wake = m.poll_timeout().map(tokio::time::Instant::from_std);
        tokio::select! {
            r = s.read(&mut buf) => match r? {
                0 => bail!("the server closed"),
                k => m.handle_input(&buf[..k], mpush_protocol::Instant::now()),
            },
            _ = async { match wake { Some(w) => tokio::time::sleep_until(w).await, None => std::future::pending().await } } => {
                m.handle_timeout(mpush_protocol::Instant::now());
            }
            _ = tokio::time::sleep_until(deadline) => bail!("up-push client {i} timed out"),
        }
    }
}

async fn one(
    bin: &std::path::Path,
    s: &Sizes,
    name: &str,
    env: Vec<(String, String)>,
    redis: Option<&Redis>,
    delivered: impl Fn() -> futures_util::future::BoxFuture<'static, u64>,
) -> Result<Value> {
    let conns = s.up_conns;
    let per = s.up_msgs / conns;
    let total = (per * conns) as u64;
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = start_server_with(bin, redis.map(|r| (r, "U")), None, &env_ref).await?;
    let hist = Arc::new(std::sync::Mutex::new(Histogram::new_with_bounds(
        1, 60_000_000, 3,
    )?));
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..conns)
        .map(|i| tokio::spawn(client(server.tcp.clone(), i, per, hist.clone())))
        .collect();
    for t in tasks {
        t.await.context("client task")??;
    }
    let accepted_secs = t0.elapsed().as_secs_f64();
    // Every accepted message reaches the backend (an asynchronous webhook
    // may still be posting).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = delivered().await;
    while got < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        got = delivered().await;
    }
    let delivered_secs = t0.elapsed().as_secs_f64();
    if got < total {
        bail!("{name}: the backend got {got} of {total} accepted up-pushes");
    }
    let h = hist.lock().map_err(|_| anyhow::anyhow!("histogram"))?;
    // The rate counts from the first handshake: the connects are part of it
    // for every sink alike.
    let v = json!({
        "sink": name,
        "conns": conns,
        "messages": total,
        "accepted_per_s": total as f64 / accepted_secs,
        "delivered_per_s": total as f64 / delivered_secs,
        "p50_us": h.value_at_quantile(0.5),
        "p99_us": h.value_at_quantile(0.99),
        "p999_us": h.value_at_quantile(0.999),
    });
    drop(server);
    Ok(v)
}

pub async fn upstream(bin: &std::path::Path, s: &Sizes) -> Result<Value> {
    let lift = |mut env: Vec<(String, String)>| {
        for (k, v) in [
            ("MPUSH__LIMITS__UP_PUSH_RATE_PER_CONN", "1000000"),
            ("MPUSH__LIMITS__UP_PUSH_BURST_PER_CONN", "1000000"),
            ("MPUSH__LIMITS__UP_PUSH_RATE_PER_USER", "1000000"),
            ("MPUSH__LIMITS__UP_PUSH_BURST_PER_USER", "1000000"),
        ] {
            env.push((k.into(), v.into()));
        }
        env
    };
    let mut rows = Vec::new();
    for mode in ["sync", "async"] {
        let (url, count) = receiver().await?;
        let hook = format!(
            "[{{url=\"{url}\",secret=\"bench-secret-0123456789\",mode=\"{mode}\",queue=100000,batch=256,concurrency=8}}]"
        );
        let env = lift(vec![("MPUSH__SINKS__WEBHOOKS".into(), hook)]);
        eprintln!("upstream: webhook ({mode})");
        let c = count.clone();
        rows.push(
            one(bin, s, &format!("webhook ({mode})"), env, None, move || {
                let c = c.clone();
                Box::pin(async move { c.load(Ordering::Relaxed) })
            })
            .await?,
        );
    }
    let redis = start_redis().await?;
    let env = lift(vec![(
        "MPUSH__SINKS__STREAM".into(),
        "{key=\"bench:up\",maxlen=10000000}".into(),
    )]);
    eprintln!("upstream: Redis Stream");
    let client = redis::Client::open(redis.url.as_str())?;
    let conn = client.get_multiplexed_async_connection().await?;
    rows.push(
        one(bin, s, "Redis Stream", env, Some(&redis), move || {
            let mut c = conn.clone();
            Box::pin(async move {
                redis::cmd("XLEN")
                    .arg("bench:up")
                    .query_async::<u64>(&mut c)
                    .await
                    .unwrap_or(0)
            })
        })
        .await?,
    );
    Ok(json!(rows))
}
