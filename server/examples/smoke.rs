//! Smoke benchmark of the single-node server (issue 3): memory per idle bound
//! connection, and pushes per second through the HTTP API.
//!
//! Run: `cargo run --release -p mpush-server --example smoke -- [--conns 10000]`
//! With `--cluster`: a redis-server and three nodes; clients on nodes B and C,
//! every push sent to node A's API, so each one crosses nodes.
//! It starts `target/release/mpush-server` as a child process on loopback
//! ports, opens N real connections (RSA handshake + bind, legacy profile),
//! reads the server's RSS from /proc, then pushes through the API and counts
//! what the clients receive. Everything is bounded in count and time.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant as StdInstant};

use mpush_protocol::Instant;
use mpush_protocol::client::{ClientConfig, ClientConnection, ClientEvent};
use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::dedup::DedupWindow;
use mpush_protocol::session::DeviceInfo;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Semaphore;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One client: handshake, bind, then count messages until the end.
/// `connecting` is held until bound, which bounds the handshakes in progress.
async fn client(
    addr: SocketAddr,
    src: std::net::IpAddr,
    i: usize,
    received: Arc<AtomicU64>,
    ready: Arc<Semaphore>,
    connecting: tokio::sync::OwnedSemaphorePermit,
) -> Result<(), String> {
    let mut connecting = Some(connecting);
    let sock = TcpSocket::new_v4().map_err(|e| e.to_string())?;
    sock.bind(SocketAddr::new(src, 0))
        .map_err(|e| e.to_string())?;
    let mut s: TcpStream = sock.connect(addr).await.map_err(|e| e.to_string())?;
    let device = DeviceInfo {
        device_id: format!("bench-{i}"),
        os_name: "android".into(),
        os_version: "1".into(),
        client_version: "1".into(),
    };
    let mut cfg = ClientConfig::new(Arc::new(RsaPublic::mpush_default()), device);
    cfg.offer_v2 = false;
    cfg.handshake_timeout = Duration::from_secs(30);
    cfg.bind_timeout = Duration::from_secs(30);
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&(i as u64).to_le_bytes());
    let mut m = ClientConnection::new(
        Arc::new(cfg),
        seed,
        Instant::now(),
        0,
        None,
        DedupWindow::new(16),
    );
    let mut buf = vec![0u8; 4096];
    let mut bound = false;
    loop {
        while let Some(b) = m.poll_transmit() {
            s.write_all(&b).await.map_err(|e| e.to_string())?;
        }
        while let Some(e) = m.poll_event() {
            match e {
                ClientEvent::Connected { .. } => {
                    let _ = m.bind(&format!("user-{i}"), "", "", Instant::now());
                }
                ClientEvent::BindOk { .. } if !bound => {
                    bound = true;
                    connecting.take();
                    ready.add_permits(1);
                }
                ClientEvent::Message(_) => {
                    received.fetch_add(1, Ordering::Relaxed);
                }
                ClientEvent::Closed { reason, .. } => return Err(format!("closed: {reason:?}")),
                _ => {}
            }
        }
        while let Some(b) = m.poll_transmit() {
            s.write_all(&b).await.map_err(|e| e.to_string())?;
        }
        let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(());
        }
        m.handle_input(&buf[..n], Instant::now());
    }
}

#[tokio::main]
async fn main() {
    let conns = arg("--conns", 10_000);
    let pushes = arg("--pushes", 200_000);
    let bin = std::env::current_exe()
        .expect("exe")
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .join("mpush-server");
    assert!(
        bin.exists(),
        "build the server first: cargo build --release -p mpush-server ({})",
        bin.display()
    );
    let cluster = std::env::args().any(|a| a == "--cluster");
    let mut redis = None;
    let redis_url = if cluster {
        let port = free_port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install redis-server)");
        redis = Some(Server(child));
        tokio::time::sleep(Duration::from_millis(300)).await;
        Some(format!("redis://127.0.0.1:{port}/"))
    } else {
        None
    };
    let spawn = |id: &str| {
        let (tcp, http) = (free_port(), free_port());
        let mut cmd = Command::new(&bin);
        cmd.args([
            "--tcp",
            &format!("127.0.0.1:{tcp}"),
            "--http",
            &format!("127.0.0.1:{http}"),
            "--ws",
            "",
        ])
        .env("MPUSH__LIMITS__HANDSHAKES_PER_IP", "1000000")
        .env("MPUSH__DELIVERY__PUSH_RATE", "10000000")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if let Some(url) = &redis_url {
            cmd.args(["--redis", url])
                .env("MPUSH__CLUSTER__NODE_ID", id)
                .env("MPUSH__CLUSTER__INTERNAL", "127.0.0.1:0");
        }
        (Server(cmd.spawn().expect("server starts")), tcp, http)
    };
    let (server, tcp, http) = spawn("A");
    let others: Vec<(Server, u16, u16)> = if cluster {
        vec![spawn("B"), spawn("C")]
    } else {
        Vec::new()
    };
    let _redis = redis;
    let pid = server.0.id();
    let api = format!("http://127.0.0.1:{http}");
    let http_client = reqwest::Client::new();
    for _ in 0..100 {
        if http_client
            .get(format!("{api}/healthz"))
            .send()
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_before = rss_kb(pid);

    // In cluster mode the clients connect to B and C only.
    let targets: Vec<SocketAddr> = if cluster {
        others
            .iter()
            .map(|o| format!("127.0.0.1:{}", o.1).parse().expect("addr"))
            .collect()
    } else {
        vec![format!("127.0.0.1:{tcp}").parse().expect("addr")]
    };
    for t in &targets {
        for _ in 0..100 {
            if TcpStream::connect(t).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let received = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Semaphore::new(0));
    let limiter = Arc::new(Semaphore::new(256));
    let t0 = StdInstant::now();
    for i in 0..conns {
        let (r, rd, lim) = (received.clone(), ready.clone(), limiter.clone());
        // Spread over source addresses: ~28k ephemeral ports each.
        let src = std::net::IpAddr::from([127, 0, 0, 2 + (i / 20_000) as u8]);
        let permit = lim.acquire_owned().await.expect("semaphore");
        let addr = targets[i % targets.len()];
        tokio::spawn(async move {
            if let Err(e) = client(addr, src, i, r, rd, permit).await {
                eprintln!("client {i}: {e}");
            }
        });
    }
    let bound =
        tokio::time::timeout(Duration::from_secs(120), ready.acquire_many(conns as u32)).await;
    assert!(bound.is_ok(), "all clients bound within 120 s");
    let connect_secs = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after = rss_kb(pid);
    let per_conn = (rss_after.saturating_sub(rss_before)) as f64 * 1024.0 / conns as f64;
    println!(
        "connections: {conns} handshakes+binds in {connect_secs:.2} s ({:.0}/s)",
        conns as f64 / connect_secs
    );
    if !cluster {
        println!(
            "server RSS: {rss_before} kB idle -> {rss_after} kB with {conns} bound connections"
        );
        println!(
            "memory per idle bound connection: {:.0} bytes ({:.2} KB)",
            per_conn,
            per_conn / 1024.0
        );
    }

    // Unicast through the batch API: 1000 users per request, 64-byte content.
    let content = "x".repeat(64);
    let batch = 1000.min(conns);
    let requests = pushes.div_ceil(batch);
    let t1 = StdInstant::now();
    let start_count = received.load(Ordering::Relaxed);
    let mut handles = Vec::new();
    let inflight = Arc::new(Semaphore::new(8));
    for r in 0..requests {
        let users: Vec<String> = (0..batch)
            .map(|k| format!("user-{}", (r * batch + k) % conns))
            .collect();
        let body = json!({"userIds": users, "content": content});
        let (c, url, sem) = (
            http_client.clone(),
            format!("{api}/api/v1/push/batch"),
            inflight.clone(),
        );
        handles.push(tokio::spawn(async move {
            let _p = sem.acquire_owned().await.expect("sem");
            c.post(url)
                .json(&body)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }));
    }
    let mut ok = 0;
    for h in handles {
        if h.await.unwrap_or(0) == 200 {
            ok += 1;
        }
    }
    let want = (requests * batch) as u64;
    let deadline = StdInstant::now() + Duration::from_secs(60);
    while received.load(Ordering::Relaxed) - start_count < want && StdInstant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let got = received.load(Ordering::Relaxed) - start_count;
    let secs = t1.elapsed().as_secs_f64();
    println!(
        "batch API{}: {ok}/{requests} requests OK, {got}/{want} messages delivered in {secs:.2} s = {:.0} msg/s",
        if cluster {
            " (every push crosses nodes: API on A, clients on B and C)"
        } else {
            ""
        },
        got as f64 / secs
    );

    // Single-user API: 64 concurrent callers for a fixed count.
    let singles = 20_000.min(pushes);
    let t2 = StdInstant::now();
    let start_count = received.load(Ordering::Relaxed);
    let sem = Arc::new(Semaphore::new(64));
    let mut handles = Vec::new();
    for k in 0..singles {
        let (c, url, s) = (
            http_client.clone(),
            format!("{api}/api/v1/push"),
            sem.clone(),
        );
        let body = json!({"userId": format!("user-{}", k % conns), "content": content});
        handles.push(tokio::spawn(async move {
            let _p = s.acquire_owned().await.expect("sem");
            c.post(url)
                .json(&body)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }));
    }
    for h in handles {
        let _ = h.await;
    }
    let deadline = StdInstant::now() + Duration::from_secs(30);
    while received.load(Ordering::Relaxed) - start_count < singles as u64
        && StdInstant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let got = received.load(Ordering::Relaxed) - start_count;
    let secs = t2.elapsed().as_secs_f64();
    println!(
        "single push API (64 concurrent): {got}/{singles} delivered in {secs:.2} s = {:.0} req/s",
        got as f64 / secs
    );
    println!("server RSS at the end: {} kB", rss_kb(pid));
}
