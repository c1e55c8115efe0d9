//! The workload during a fault, and everything it saw (the history the
//! checker reads): the apps (sdk-core clients, one per user, each starting
//! on its home node and moving when it must), pushes in every ACK mode and
//! with a TTL through every node's API (retried with their Idempotency-Key
//! as a careful backend does), broadcasts, up-pushes, and a webhook
//! receiver for the up-pushes that can be taken down and brought back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::session::{AckMode, DeviceInfo};
use mpush_sdk_core::native::{Client, ClientHandle, ClientOptions};
use mpush_sdk_core::{SessionConfig, SessionEvent};
use serde_json::{Value, json};

use crate::cluster::API_TOKEN;

/// How a push asked to be delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Auto,
    Biz,
    /// No ACK mode, kept for the user for ten minutes.
    Ttl,
}

/// One push as the backend saw it: its final answer after retries.
#[derive(Debug, Clone)]
pub struct PushRecord {
    pub content: String,
    pub user: String,
    pub mode: Mode,
    pub status: u16,
    pub body: Value,
    pub tries: u32,
}

#[derive(Default)]
pub struct History {
    pub pushes: Vec<PushRecord>,
    /// Per user, every message its app saw (after the SDK's dedup).
    pub seen: HashMap<String, Vec<String>>,
    /// Up-pushes the SDK said the server accepted, and refused.
    pub ups_acked: Vec<String>,
    pub ups_refused: Vec<String>,
    /// What the webhook receiver got: (event id, content).
    pub ups_received: Vec<(String, String)>,
    pub broadcasts_accepted: u64,
    pub broadcasts_refused: u64,
}

pub type Shared = Arc<Mutex<History>>;

/// The up-push receiver (the backend's webhook), which can go down.
pub struct Receiver {
    pub url: String,
    addr: std::net::SocketAddr,
    history: Shared,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Receiver {
    pub async fn start(ip: std::net::Ipv4Addr, history: Shared) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let mut r = Self {
            url: format!("http://{addr}/"),
            addr,
            history,
            task: None,
        };
        r.serve(listener);
        Ok(r)
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let history = self.history.clone();
        let app = axum::Router::new().route(
            "/",
            axum::routing::post(move |body: axum::Json<Value>| {
                let history = history.clone();
                async move {
                    if let Some(events) = body["events"].as_array() {
                        let mut h = history.lock().expect("history");
                        for e in events {
                            if e["type"] == "up_push" {
                                h.ups_received.push((
                                    e["id"].as_str().unwrap_or_default().to_owned(),
                                    e["content"].as_str().unwrap_or_default().to_owned(),
                                ));
                            }
                        }
                    }
                    "ok"
                }
            }),
        );
        self.task = Some(tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        }));
    }

    /// Down: nothing listens (the server's webhook sees connection refused).
    pub fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    pub async fn restart(&mut self) -> Result<()> {
        self.stop();
        let listener = loop {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        self.serve(listener);
        Ok(())
    }
}

/// One app: an sdk-core client bound as its user.
pub struct App {
    pub user: String,
    pub client: ClientHandle,
    task: tokio::task::JoinHandle<()>,
}

impl App {
    /// Connects to `servers` in order (its home node first), binds `user`,
    /// records every message, acknowledges BIZ ones after a moment (so that
    /// some are un-ACKed when a node dies).
    pub async fn start(user: &str, servers: Vec<String>, history: Shared) -> Result<Self> {
        let device = DeviceInfo {
            device_id: format!("{user}-device"),
            os_name: "android".into(),
            os_version: "14".into(),
            client_version: "faults".into(),
        };
        let mut config = SessionConfig::new(servers, Arc::new(RsaPublic::mpush_default()), device);
        // The run's hosts are on a private bridge, with mpush's key on purpose.
        config.allow_published_key = true;
        config.backoff.initial = Duration::from_millis(200);
        config.backoff.max = Duration::from_secs(2);
        config.connect_timeout = Duration::from_secs(2);
        config.heartbeat = Duration::from_secs(5);
        let mut events = Client::connect(ClientOptions {
            session: config,
            ticket_store: None,
        })?;
        let client = events.handle();
        let handle = client.clone();
        let u = user.to_owned();
        let task = tokio::spawn(async move {
            while let Some(e) = events.next_event().await {
                if let SessionEvent::Message(m) = e {
                    let text = String::from_utf8_lossy(&m.content).into_owned();
                    history
                        .lock()
                        .expect("history")
                        .seen
                        .entry(u.clone())
                        .or_default()
                        .push(text);
                    if m.needs_ack {
                        let h = handle.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            let _ = h.ack(m.ack_id).await;
                        });
                    }
                }
            }
        });
        client.bind(user, "", "").await?;
        Ok(Self {
            user: user.to_owned(),
            client,
            task,
        })
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.client.close();
        self.task.abort();
    }
}

/// The API calls of a careful backend: an Idempotency-Key per push, and
/// retries of a 503 or a failed request with it.
pub struct Backend {
    http: reqwest::Client,
    pub apis: Arc<Mutex<Vec<String>>>,
    seq: AtomicU64,
}

impl Backend {
    pub fn new(apis: Vec<String>) -> Self {
        Self {
            http: reqwest::Client::new(),
            apis: Arc::new(Mutex::new(apis)),
            seq: AtomicU64::new(0),
        }
    }

    /// Stops sending through `api` (its node is going away).
    pub fn avoid(&self, api: &str) {
        self.apis.lock().expect("apis").retain(|a| a != api);
    }

    fn api(&self, n: u64) -> String {
        let apis = self.apis.lock().expect("apis");
        apis[(n as usize) % apis.len()].clone()
    }

    async fn post(&self, url: &str, key: &str, body: &Value) -> Result<(u16, Value), String> {
        let r = self
            .http
            .post(url)
            .bearer_auth(API_TOKEN)
            .header("idempotency-key", key)
            .json(body)
            .timeout(Duration::from_secs(4))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = r.status().as_u16();
        Ok((status, r.json().await.unwrap_or(Value::Null)))
    }

    /// One push to `user`, retried (another node's API each time) while
    /// the answer is a 503, a 409 in progress, or none, for up to 30 s (as
    /// a backend with a queue would); its final answer is what counts.
    pub async fn push(&self, user: &str, mode: Mode) -> PushRecord {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let content = format!("p{n}");
        let mut body = json!({"userId": user, "content": content});
        match mode {
            Mode::Auto => body["ackMode"] = json!("auto"),
            Mode::Biz => body["ackMode"] = json!("biz"),
            Mode::Ttl => body["ttlSeconds"] = json!(600),
        }
        let mut tries = 0;
        let started = std::time::Instant::now();
        loop {
            tries += 1;
            let url = format!("{}/api/v1/push", self.api(n + u64::from(tries)));
            let r = self.post(&url, &content, &body).await;
            let again = match &r {
                Ok((503, _)) => true,
                Ok((409, b)) => b["error"]["code"] == "in_progress",
                Ok(_) => false,
                Err(_) => true,
            };
            if !again || started.elapsed() > Duration::from_secs(30) {
                let (status, body) = r.unwrap_or_else(|e| (0, json!({ "error": e })));
                return PushRecord {
                    content,
                    user: user.to_owned(),
                    mode,
                    status,
                    body,
                    tries,
                };
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    pub async fn broadcast(&self) -> bool {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let url = format!("{}/api/v1/broadcast", self.api(n));
        let body = json!({"content": format!("b{n}"), "condition": "userId.indexOf('f') == 0"});
        matches!(self.post(&url, &format!("b{n}"), &body).await, Ok((202, _)))
    }

    /// Whether a push to every user reaches a connection now (a probe
    /// without TTL or ACK mode: its loss is not counted).
    pub async fn all_reachable(&self, users: &[String]) -> bool {
        let mut ok = true;
        for (i, u) in users.iter().enumerate() {
            let url = format!("{}/api/v1/push", self.api(i as u64));
            let body = json!({"userId": u, "content": "probe"});
            let r = self
                .http
                .post(&url)
                .bearer_auth(API_TOKEN)
                .json(&body)
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            ok &= matches!(r, Ok(r) if r.status().as_u16() == 200);
        }
        ok
    }
}

/// Runs the workload until `stop`: pushes every `every`, a broadcast every
/// 3 s, an up-push from every app every 2 s.
pub async fn run(
    backend: Arc<Backend>,
    apps: Arc<Vec<App>>,
    history: Shared,
    every: Duration,
    stop: Arc<AtomicBool>,
) {
    let mut tasks = Vec::new();
    let users: Vec<String> = apps.iter().map(|a| a.user.clone()).collect();
    {
        let (backend, history, stop) = (backend.clone(), history.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut k: usize = 0;
            let mut inflight = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let user = users[(k * 7) % users.len()].clone();
                let mode = [Mode::Auto, Mode::Biz, Mode::Ttl][k % 3];
                let (b, h) = (backend.clone(), history.clone());
                inflight.push(tokio::spawn(async move {
                    let r = b.push(&user, mode).await;
                    h.lock().expect("history").pushes.push(r);
                }));
                k += 1;
                tokio::time::sleep(every).await;
            }
            for t in inflight {
                let _ = t.await;
            }
        }));
    }
    {
        let (backend, history, stop) = (backend.clone(), history.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let ok = backend.broadcast().await;
                {
                    let mut h = history.lock().expect("history");
                    if ok {
                        h.broadcasts_accepted += 1;
                    } else {
                        h.broadcasts_refused += 1;
                    }
                }
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        }));
    }
    for (i, app) in apps.iter().enumerate() {
        let (history, stop, client) = (history.clone(), stop.clone(), app.client.clone());
        let user = app.user.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(83 * i as u64 % 2000)).await;
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let content = format!("up-{user}-{n}");
                n += 1;
                let r = client.push(content.as_bytes(), AckMode::Auto).await;
                {
                    let mut h = history.lock().expect("history");
                    match r {
                        Ok(()) => h.ups_acked.push(content),
                        Err(_) => h.ups_refused.push(content),
                    }
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// Waits (up to `limit`) until every push answered 2xx was seen by its app.
pub async fn quiesce(history: &Shared, limit: Duration) -> Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        let done = {
            let h = history.lock().expect("history");
            h.pushes
                .iter()
                .filter(|p| (200..300).contains(&p.status))
                .all(|p| h.seen.get(&p.user).is_some_and(|s| s.contains(&p.content)))
        };
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    start.elapsed()
}
