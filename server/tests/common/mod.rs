//! Test harness: a server on 127.0.0.1 port 0, and a tokio-driven test client
//! around the protocol's `ClientConnection` (legacy profile = behaves like
//! mpush-client-java 0.8.1, spec section 9; or v2), over TCP or WebSocket.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use mpush_protocol::Instant;
use mpush_protocol::client::{AckToken, ClientConfig, ClientConnection, ClientEvent};
use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::dedup::DedupWindow;
use mpush_protocol::session::{DeviceInfo, ResumeTicket};
use mpush_server::{Running, Settings};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

pub const WAIT: Duration = Duration::from_secs(10);

/// Settings for tests: every listener on 127.0.0.1:0.
pub fn settings() -> Settings {
    let mut s = Settings::default();
    s.net.tcp = "127.0.0.1:0".into();
    s.net.ws = "127.0.0.1:0".into();
    s.net.http = "127.0.0.1:0".into();
    s.delivery.ack_waits_ms = vec![300, 300, 300];
    s.shutdown.drain_timeout_ms = 1000;
    s
}

pub async fn start(s: Settings) -> Running {
    mpush_server::start(s.validate().expect("valid settings"))
        .await
        .expect("server starts")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Tcp,
    Ws,
}

pub fn device(id: &str, os: &str) -> DeviceInfo {
    DeviceInfo {
        device_id: id.into(),
        os_name: os.into(),
        os_version: "1.0".into(),
        client_version: "0.8.1".into(),
    }
}

/// A client that completed its handshake and bound `user`.
pub async fn bound(
    server: &Running,
    via: Via,
    v2: bool,
    dev: DeviceInfo,
    user: &str,
    tags: &str,
) -> TestClient {
    let mut c = TestClient::connect(server, via, v2, dev, None).await;
    c.connected().await;
    c.bind(user, tags).await;
    c
}

enum Cmd {
    Bind(String, String, String),
    Unbind(String),
    Ack(AckToken),
    Push(Vec<u8>),
    Http(mpush_protocol::message::HttpRequest),
    Close,
}

pub struct TestClient {
    cmds: mpsc::UnboundedSender<Cmd>,
    events: mpsc::UnboundedReceiver<ClientEvent>,
    pub seen: Vec<ClientEvent>,
}

impl TestClient {
    pub async fn connect(
        server: &Running,
        via: Via,
        v2: bool,
        dev: DeviceInfo,
        ticket: Option<ResumeTicket>,
    ) -> Self {
        let addr = match via {
            Via::Tcp => server.tcp,
            Via::Ws => server.ws.expect("ws enabled"),
        };
        Self::connect_to(addr, via, v2, dev, ticket).await
    }

    /// Connects to a gateway at `addr` (a server in another process).
    pub async fn connect_to(
        addr: SocketAddr,
        via: Via,
        v2: bool,
        dev: DeviceInfo,
        ticket: Option<ResumeTicket>,
    ) -> Self {
        let mut cfg = ClientConfig::new(Arc::new(RsaPublic::mpush_default()), dev);
        cfg.offer_v2 = v2;
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let stream = TcpStream::connect(addr).await.expect("connects");
        let machine = ClientConnection::new(
            Arc::new(cfg),
            rand_seed(),
            Instant::now(),
            unix_ms(),
            ticket,
            DedupWindow::default(),
        );
        match via {
            Via::Tcp => tokio::spawn(drive_tcp(stream, machine, cmd_rx, ev_tx)),
            Via::Ws => {
                let (ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/"), stream)
                    .await
                    .expect("upgrade");
                tokio::spawn(drive_ws(ws, machine, cmd_rx, ev_tx))
            }
        };
        Self {
            cmds: cmd_tx,
            events: ev_rx,
            seen: Vec::new(),
        }
    }

    /// Waits for an event matching `f` (keeping every event in `seen`).
    pub async fn wait_for(&mut self, what: &str, f: impl Fn(&ClientEvent) -> bool) -> ClientEvent {
        if let Some(e) = self.seen.iter().find(|e| f(e)) {
            return e.clone();
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let e = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting for {what}; saw {:?}", self.seen))
                .unwrap_or_else(|| panic!("client ended before {what}; saw {:?}", self.seen));
            self.seen.push(e.clone());
            if f(&e) {
                return e;
            }
        }
    }

    /// Collects events for `d` without waiting for anything in particular.
    pub async fn settle(&mut self, d: Duration) {
        let deadline = tokio::time::Instant::now() + d;
        while let Ok(Some(e)) = tokio::time::timeout_at(deadline, self.events.recv()).await {
            self.seen.push(e);
        }
    }

    pub async fn connected(&mut self) -> ClientEvent {
        self.wait_for("connected", |e| matches!(e, ClientEvent::Connected { .. }))
            .await
    }

    pub async fn bind(&mut self, user: &str, tags: &str) {
        self.bind_with_token(user, tags, "").await;
        self.wait_for("bind ok", |e| matches!(e, ClientEvent::BindOk { .. }))
            .await;
    }

    pub async fn bind_with_token(&mut self, user: &str, tags: &str, token: &str) {
        let _ = self
            .cmds
            .send(Cmd::Bind(user.into(), tags.into(), token.into()));
    }

    pub fn unbind(&self, user: &str) {
        let _ = self.cmds.send(Cmd::Unbind(user.into()));
    }

    pub fn ack(&self, t: AckToken) {
        let _ = self.cmds.send(Cmd::Ack(t));
    }

    pub fn close(&self) {
        let _ = self.cmds.send(Cmd::Close);
    }

    /// An up-push asking for the server's ACK (`PushAcked` / `PushTimedOut`
    /// / `PushRefused` follow).
    pub fn push_up(&self, content: &[u8]) {
        let _ = self.cmds.send(Cmd::Push(content.to_vec()));
    }

    /// An HTTP request through the server's proxy (`HttpResponse` follows).
    pub fn http(&self, request: mpush_protocol::message::HttpRequest) {
        let _ = self.cmds.send(Cmd::Http(request));
    }

    /// The next HTTP response not seen before (taken out of `seen`).
    pub async fn http_response(&mut self) -> mpush_protocol::message::HttpResponse {
        let e = self
            .wait_for("an HTTP response", |e| {
                matches!(e, ClientEvent::HttpResponse { .. })
            })
            .await;
        if let Some(i) = self.seen.iter().position(|x| *x == e) {
            self.seen.remove(i);
        }
        match e {
            ClientEvent::HttpResponse { response, .. } => response,
            _ => unreachable!("matched above"),
        }
    }

    /// Messages received so far, as text.
    pub fn messages(&self) -> Vec<String> {
        self.seen
            .iter()
            .filter_map(|e| match e {
                ClientEvent::Message(m) => Some(String::from_utf8_lossy(&m.content).into_owned()),
                _ => None,
            })
            .collect()
    }

    pub async fn message(&mut self, text: &str) -> ClientEvent {
        let t = text.to_owned();
        self.wait_for(
            text,
            move |e| matches!(e, ClientEvent::Message(m) if m.content[..] == *t.as_bytes()),
        )
        .await
    }
}

fn rand_seed() -> [u8; 32] {
    let mut s = [0u8; 32];
    getrandom::fill(&mut s).expect("random");
    s
}

pub fn unix_ms() -> i64 {
    mpush_server::clock::unix_ms()
}

fn apply(m: &mut ClientConnection, c: Cmd) {
    let now = Instant::now();
    match c {
        Cmd::Bind(u, t, k) => {
            let _ = m.bind(&u, &t, &k, now);
        }
        Cmd::Unbind(u) => {
            let _ = m.unbind(&u, now);
        }
        Cmd::Ack(t) => {
            let _ = m.ack(t, now);
        }
        Cmd::Push(b) => {
            let _ = m.push(
                &b,
                mpush_protocol::session::AckMode::Auto,
                Duration::from_secs(3),
                now,
            );
        }
        Cmd::Http(r) => {
            let _ = m.http(&r, Duration::from_secs(30), now);
        }
        Cmd::Close => m.close(),
    }
}

fn forward(m: &mut ClientConnection, ev: &mpsc::UnboundedSender<ClientEvent>) -> bool {
    let mut closed = false;
    while let Some(e) = m.poll_event() {
        closed |= matches!(e, ClientEvent::Closed { .. });
        let _ = ev.send(e);
    }
    closed
}

async fn sleep_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}

async fn drive_tcp(
    mut s: TcpStream,
    mut m: ClientConnection,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    ev: mpsc::UnboundedSender<ClientEvent>,
) {
    let mut buf = vec![0u8; 65536];
    loop {
        while let Some(b) = m.poll_transmit() {
            if s.write_all(&b).await.is_err() {
                return;
            }
        }
        if forward(&mut m, &ev) {
            return;
        }
        tokio::select! {
            c = cmds.recv() => match c { Some(c) => apply(&mut m, c), None => return },
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    let _ = ev.send(ClientEvent::Closed { reason: mpush_protocol::client::ClientCloseReason::Local, reconnect: true });
                    return;
                }
                Ok(n) => m.handle_input(&buf[..n], Instant::now()),
            },
            _ = sleep_opt(m.poll_timeout()) => m.handle_timeout(Instant::now()),
        }
    }
}

type WsStream = tokio_tungstenite::WebSocketStream<TcpStream>;

async fn drive_ws(
    mut s: WsStream,
    mut m: ClientConnection,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    ev: mpsc::UnboundedSender<ClientEvent>,
) {
    loop {
        while let Some(b) = m.poll_transmit() {
            if s.send(Message::Binary(b)).await.is_err() {
                return;
            }
        }
        if forward(&mut m, &ev) {
            return;
        }
        tokio::select! {
            c = cmds.recv() => match c { Some(c) => apply(&mut m, c), None => return },
            r = s.next() => match r {
                Some(Ok(Message::Binary(b))) => m.handle_input(&b, Instant::now()),
                Some(Ok(_)) => {}
                _ => {
                    let _ = ev.send(ClientEvent::Closed { reason: mpush_protocol::client::ClientCloseReason::Local, reconnect: true });
                    return;
                }
            },
            _ = sleep_opt(m.poll_timeout()) => m.handle_timeout(Instant::now()),
        }
    }
}

/// mpush's JavaScript client: JSON text frames over WebSocket.
pub struct JsonClient {
    ws: WsStream,
    pub received: Vec<Value>,
}

impl JsonClient {
    pub async fn connect(server: &Running) -> Self {
        let addr = server.ws.expect("ws");
        let stream = TcpStream::connect(addr).await.expect("connects");
        let (ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/"), stream)
            .await
            .expect("upgrade");
        Self {
            ws,
            received: Vec::new(),
        }
    }

    pub async fn send(&mut self, v: Value) {
        self.ws
            .send(Message::Text(v.to_string().into()))
            .await
            .expect("send");
    }

    pub async fn recv(&mut self) -> Value {
        loop {
            let m = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a frame in time")
                .expect("open")
                .expect("frame");
            if let Message::Text(t) = m {
                let v: Value = serde_json::from_str(t.as_str()).expect("JSON frame");
                self.received.push(v.clone());
                return v;
            }
        }
    }
}

/// An HTTP client for the API.
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn new(server: &Running) -> Self {
        Self {
            base: format!("http://{}", server.http),
            http: reqwest::Client::new(),
        }
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// A POST with extra headers: status, headers and body.
    pub async fn post_with(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: Value,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut r = self.http.post(format!("{}{path}", self.base)).json(&body);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let r = r.send().await.expect("request");
        let (status, h) = (r.status().as_u16(), r.headers().clone());
        (status, h, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn text(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, String) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.expect("request");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    }

    /// Waits until the trace shows `state` for `user` (any device).
    pub async fn trace_state(&self, trace: &str, user: &str, state: &str) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let (_, v) = self.get(&format!("/api/v1/traces/{trace}")).await;
            let hit = v["recipients"].as_array().is_some_and(|rs| {
                rs.iter()
                    .any(|r| r["userId"] == user && r["state"] == state)
            });
            if hit {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "trace {trace} never showed {state} for {user}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Raw bytes to the TCP port; returns what the server sent back before closing.
pub async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.expect("connects");
    s.write_all(bytes).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .expect("server closes in time");
    out
}

// ----- Redis: a redis-server of a test's own -------------------------------

use std::process::{Child, Command, Stdio};

mod ports;
// Not every test crate that includes this module starts a process.
#[allow(unused_imports)]
pub use ports::free_port;

/// A redis-server of this test's own, killed on drop.
pub struct Redis {
    pub child: Child,
    pub port: u16,
    /// Its working directory, removed on drop.
    pub dir: std::path::PathBuf,
}

impl Redis {
    pub async fn start(port: u16) -> Self {
        Self::start_with(port, &[]).await
    }

    pub async fn start_with(port: u16, extra: &[&str]) -> Self {
        // Its own working directory: a replica writes the RDB it syncs
        // there, never into the work tree.
        let dir = std::env::temp_dir().join(format!("mpush-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("redis dir");
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
                "--dir",
                &dir.to_string_lossy(),
            ])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server runs (the test command installs it)");
        let r = Self { child, port, dir };
        wait_listening(("127.0.0.1", port)).await;
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub async fn query(&self, args: &[&str]) -> redis::Value {
        self.try_query(args).await.expect("query")
    }

    pub async fn try_query(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let client = redis::Client::open(self.url()).expect("url");
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis");
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut c).await
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until `addr` accepts connections.
pub async fn wait_listening(addr: impl tokio::net::ToSocketAddrs + Clone) {
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr.clone()).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nothing listens");
}

/// Waits until the allocator route lists `n` live nodes.
pub async fn wait_for_nodes(api: &Api, n: usize) {
    for _ in 0..100 {
        if api
            .text(reqwest::Method::GET, "/", None)
            .await
            .1
            .split(',')
            .count()
            == n
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the cluster never listed {n} nodes");
}

/// The JDK's `java` launcher (11+: single-file sources), which the tests
/// that run Java programs need; scripts/test installs it.
pub fn java() -> std::path::PathBuf {
    let ok = std::process::Command::new("java")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "this test runs a Java program and needs a JDK 11+ (`java`); scripts/test installs openjdk-17-jdk-headless"
    );
    std::path::PathBuf::from("java")
}
