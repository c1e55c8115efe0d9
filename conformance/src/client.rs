//! `client` mode: a scripted server that a client under test connects to.
//!
//! The kit starts the client as a command, once per case, and reads what the
//! client's application sees through a small adapter contract (README.md):
//! the command gets the server's address, public key, user and device id in
//! `MPUSH_CONFORMANCE_*` variables, and prints one JSON object per line on
//! standard output: `{"event": "connected", "resumed": bool}`, `{"event":
//! "bound", "userId"}`, `{"event": "message", "text", "needsAck"}`,
//! `{"event": "kicked"}`. It acknowledges a message that needs it after
//! printing it, as an application that handled it does. The server side of
//! each case is the protocol's server machine, scripted by the case: what it
//! pushes, refuses, repeats or redirects, and what it observes on the wire.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use mpush_protocol::crypto::RsaPrivate;
use mpush_protocol::message::Redirect;
use mpush_protocol::packet::{Decoder, Frame};
use mpush_protocol::server::{
    Answer, BindRefusal, OutboundPush, ServerConfig, ServerConnection, ServerEvent,
};
use mpush_protocol::session::{AckMode, Profile, SessionRecord};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::report::{Case, CaseResult, Outcome, run_cases};

/// Which transport the scripted server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    /// Binary WebSocket frames (what the browser package speaks).
    Ws,
}

/// What a run against a client needs.
#[derive(Debug, Clone)]
pub struct ClientKit {
    /// The adapter: a program and its arguments.
    pub command: Vec<String>,
    pub transport: Transport,
    /// Names the adapter in the results (`native`, `node`, `python`, ...).
    pub label: String,
    /// Where each case's adapter may keep state (a fresh folder per case).
    pub work_dir: PathBuf,
}

/// Every client case: id, spec section, what it checks.
pub const CASES: &[Case] = &[
    (
        "handshake",
        "mpush-wire 5.3, 9.3",
        "the client handshakes with its device's fields",
    ),
    (
        "bind",
        "mpush-wire 9.4",
        "the client binds its user after the handshake",
    ),
    (
        "push.no_ack",
        "mpush-wire 4",
        "a push without ACK reaches the application",
    ),
    (
        "push.auto_ack",
        "mpush-wire 9.5",
        "an AUTO_ACK push is acknowledged by the SDK",
    ),
    (
        "push.biz_ack",
        "mpush-wire 9.5",
        "a BIZ_ACK push is acknowledged once the application handled it",
    ),
    (
        "push.duplicate",
        "ADR 0001",
        "a retransmitted push reaches the application once",
    ),
    (
        "heartbeat",
        "mpush-wire 6.2",
        "the client sends heartbeats at the negotiated interval",
    ),
    (
        "backoff",
        "mpush-wire 9.9",
        "refused connections are retried, with growing waits, not in a tight loop",
    ),
    (
        "fast_connect",
        "mpush-wire 5.5, 9.3",
        "a reconnect resumes the session (FAST_CONNECT) and binds again",
    ),
    ("kick", "mpush-wire 9.6", "a KICK reaches the application"),
    (
        "error.reconnect",
        "mpush-wire 9.7, 11.6",
        "after an ERROR that closes the connection the client comes back",
    ),
    (
        "redirect",
        "ADR 0001",
        "a v2 REDIRECT sends the client to the address given",
    ),
];

const WAIT: Duration = Duration::from_secs(10);

type CaseOutcome = Result<Outcome, String>;

fn pass() -> CaseOutcome {
    Ok(Outcome::Passed)
}

/// The client under test, and the lines it printed.
struct Adapter {
    _child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<Value>,
    seen: Vec<Value>,
    stderr: Arc<Mutex<String>>,
}

impl Adapter {
    fn start(command: &[String], env: &[(&str, String)]) -> Result<Self, String> {
        let (program, args) = command.split_first().ok_or("no adapter command")?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the adapter `{program}`: {e}"))?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    let _ = tx.send(v);
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(err) = child.stderr.take() {
            let keep = stderr.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    let mut s = keep.lock();
                    if s.len() < 8192 {
                        s.push_str(&l);
                        s.push('\n');
                    }
                }
            });
        }
        Ok(Self {
            _child: child,
            lines: rx,
            seen: Vec::new(),
            stderr,
        })
    }

    /// The next line whose `event` is `event` (and matching `f`).
    async fn line(
        &mut self,
        event: &str,
        within: Duration,
        f: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let matches = |v: &Value| v["event"] == event && f(v);
        if let Some(v) = self.seen.iter().find(|v| matches(v)) {
            return Some(v.clone());
        }
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(v)) => {
                    self.seen.push(v.clone());
                    if matches(&v) {
                        return Some(v);
                    }
                }
                _ => return None,
            }
        }
    }

    /// Lines seen so far with this event, after reading for `d`.
    async fn count(&mut self, event: &str, d: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + d;
        while let Ok(Some(v)) = tokio::time::timeout_at(deadline, self.lines.recv()).await {
            self.seen.push(v);
        }
        self.seen.iter().filter(|v| v["event"] == event).count()
    }

    fn stderr_tail(&self) -> String {
        let s = self.stderr.lock();
        let tail: String = s
            .chars()
            .rev()
            .take(600)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        tail
    }
}

type Sessions = Arc<Mutex<HashMap<String, SessionRecord>>>;

type Link = crate::link::Link<TcpStream>;

/// One connection of the client under test, served by a scripted machine.
struct Served {
    link: Link,
    machine: ServerConnection,
    sessions: Sessions,
    events: VecDeque<ServerEvent>,
    closed: bool,
    /// Heartbeat bytes the client sent, and when.
    heartbeats: Vec<Instant>,
    observer: BytesMut,
    decoder: Decoder,
    /// Refuse every BIND (ERROR, then the connection closes).
    refuse_bind: bool,
    /// The id of the next push this connection sends.
    next_message: u64,
}

impl Served {
    async fn write(&mut self, b: &[u8]) {
        if !self.link.write(b).await {
            self.closed = true;
        }
    }

    /// Writes what the machine queued; answers what it asks, as a real
    /// server's logic would (sessions kept, binds accepted or refused).
    async fn flush(&mut self) {
        loop {
            let mut busy = false;
            while let Some(e) = self.machine.poll_event() {
                busy = true;
                self.answer(&e);
                self.events.push_back(e);
            }
            while let Some(b) = self.machine.poll_transmit() {
                busy = true;
                self.write(&b).await;
            }
            if !busy {
                break;
            }
        }
    }

    fn answer(&mut self, e: &ServerEvent) {
        let now = mpush_protocol::Instant::now();
        match e {
            ServerEvent::HandshakeCompleted {
                session: Some(s), ..
            } => {
                self.sessions.lock().insert(s.session_id.clone(), s.clone());
            }
            ServerEvent::ResumeRequested { session_id, .. } => {
                let s = self.sessions.lock().get(session_id).cloned();
                self.machine.handle_answer(Answer::Session(s), now);
            }
            ServerEvent::Resumed {
                session, replaces, ..
            } => {
                let mut all = self.sessions.lock();
                if let Some(r) = replaces {
                    all.remove(r);
                }
                if let Some(s) = session {
                    all.insert(s.session_id.clone(), s.clone());
                }
            }
            ServerEvent::BindRequested {
                request, user_id, ..
            } => {
                let result = if self.refuse_bind {
                    Err(BindRefusal::Unauthorized(
                        "refused by the scripted server".into(),
                    ))
                } else {
                    Ok(())
                };
                self.machine.handle_answer(
                    Answer::Bind {
                        request: *request,
                        user_id: user_id.clone(),
                        result,
                    },
                    now,
                );
            }
            ServerEvent::UnbindRequested { request, .. } => {
                self.machine.handle_answer(
                    Answer::Unbind {
                        request: *request,
                        ok: true,
                    },
                    now,
                );
            }
            ServerEvent::UpPush { reply, .. } => {
                self.machine.handle_answer(
                    Answer::UpPush {
                        reply: *reply,
                        result: Ok(()),
                    },
                    now,
                );
            }
            _ => {}
        }
    }

    fn observe(&mut self, data: &[u8]) {
        self.observer.extend_from_slice(data);
        while let Ok(Some(f)) = self.decoder.decode(&mut self.observer) {
            if f == Frame::Heartbeat {
                self.heartbeats.push(Instant::now());
            }
        }
    }

    async fn step(&mut self, deadline: tokio::time::Instant) -> bool {
        if self.closed {
            return false;
        }
        let timer = self
            .machine
            .poll_timeout()
            .map(tokio::time::Instant::from_std)
            .unwrap_or(deadline)
            .min(deadline);
        let mut buf = vec![0u8; 64 << 10];
        let read = self.link.read(&mut buf);
        let got = tokio::select! {
            r = read => Some(r),
            _ = tokio::time::sleep_until(timer) => None,
        };
        match got {
            Some(Some(data)) => {
                self.observe(&data);
                self.machine
                    .handle_input(&data, mpush_protocol::Instant::now());
            }
            Some(None) => self.closed = true,
            None => self.machine.handle_timeout(mpush_protocol::Instant::now()),
        }
        self.flush().await;
        if self.machine.is_closed() {
            self.closed = true;
        }
        !self.closed && tokio::time::Instant::now() < deadline
    }

    async fn event(
        &mut self,
        within: Duration,
        f: impl Fn(&ServerEvent) -> bool,
    ) -> Option<ServerEvent> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(i) = self.events.iter().position(&f) {
                return self.events.remove(i);
            }
            if !self.step(deadline).await {
                return self
                    .events
                    .iter()
                    .position(&f)
                    .and_then(|i| self.events.remove(i));
            }
        }
    }

    async fn settle(&mut self, d: Duration) {
        let deadline = tokio::time::Instant::now() + d;
        while self.step(deadline).await {}
    }

    /// Pushes `text`; with `twice`, every byte of it is written twice (an
    /// exact retransmit on the wire).
    async fn push(&mut self, text: &str, mode: AckMode, twice: bool) -> Result<(), String> {
        self.flush().await;
        let p = OutboundPush {
            message_id: self.next_message,
            trace_id: format!("conformance-{text}").into(),
            content: Bytes::copy_from_slice(text.as_bytes()),
            ack_mode: mode,
            expires_at_ms: 0,
            ack_timeout: Some(Duration::from_secs(30)),
            queued_at: None,
        };
        self.next_message += 1;
        self.machine
            .push(p, mpush_protocol::Instant::now())
            .map_err(|e| e.to_string())?;
        while let Some(b) = self.machine.poll_transmit() {
            self.write(&b).await;
            if twice {
                self.write(&b).await;
            }
        }
        self.flush().await;
        Ok(())
    }
}

/// The scripted server's listening side.
struct Server {
    listener: TcpListener,
    transport: Transport,
    config: Arc<ServerConfig>,
    sessions: Sessions,
}

impl Server {
    async fn bind(transport: Transport, heartbeat: Duration) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let mut config = ServerConfig::new(Arc::new(RsaPrivate::mpush_default()));
        config.min_heartbeat = heartbeat;
        config.max_heartbeat = heartbeat;
        Ok(Self {
            listener,
            transport,
            config: Arc::new(config),
            sessions: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    fn address(&self) -> String {
        let a = self
            .listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        match self.transport {
            Transport::Tcp => a,
            Transport::Ws => format!("ws://{a}/"),
        }
    }

    /// The next connection (within `within`).
    async fn accept(&self, within: Duration) -> Result<Served, String> {
        let (stream, _) = tokio::time::timeout(within, self.listener.accept())
            .await
            .map_err(|_| format!("the client did not connect within {within:?}"))?
            .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let link = match self.transport {
            Transport::Tcp => Link::Tcp(stream),
            Transport::Ws => Link::Ws(Box::new(
                tokio::time::timeout(WAIT, tokio_tungstenite::accept_async(stream))
                    .await
                    .map_err(|_| "the WebSocket upgrade did not finish".to_owned())?
                    .map_err(|e| format!("WebSocket upgrade: {e}"))?,
            )),
        };
        let mut seed = [0u8; 32];
        let _ = getrandom::fill(&mut seed);
        Ok(Served {
            link,
            machine: ServerConnection::new(
                self.config.clone(),
                seed,
                mpush_protocol::Instant::now(),
                crate::conn::unix_ms(),
            ),
            sessions: self.sessions.clone(),
            events: VecDeque::new(),
            closed: false,
            heartbeats: Vec::new(),
            observer: BytesMut::new(),
            decoder: Decoder::new(64 << 20),
            refuse_bind: false,
            next_message: 1,
        })
    }
}

fn handshaken(e: &ServerEvent) -> bool {
    matches!(
        e,
        ServerEvent::HandshakeCompleted { .. } | ServerEvent::Resumed { .. }
    )
}

fn bind_asked(e: &ServerEvent) -> bool {
    matches!(e, ServerEvent::BindRequested { .. })
}

impl ClientKit {
    /// Runs every case (or those whose id starts with one of `only`).
    pub async fn run(&self, only: &[String]) -> Vec<CaseResult> {
        let budget = Duration::from_secs(60);
        run_cases(CASES, "client", &self.label, only, budget, |id| {
            self.case(id)
        })
        .await
    }

    fn start(&self, case: &str, server: &Server) -> Result<(Adapter, String), String> {
        let user = format!("conf-user-{case}");
        let dir = self.work_dir.join(case.replace('.', "-"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let key = RsaPrivate::mpush_default()
            .public()
            .to_spki_der()
            .map_err(|e| e.to_string())?;
        let env = [
            ("MPUSH_CONFORMANCE_SERVER", server.address()),
            ("MPUSH_CONFORMANCE_PUBLIC_KEY", b64(&key)),
            ("MPUSH_CONFORMANCE_USER", user.clone()),
            ("MPUSH_CONFORMANCE_DEVICE", format!("conf-device-{case}")),
            ("MPUSH_CONFORMANCE_STATE_DIR", dir.display().to_string()),
            ("MPUSH_CONFORMANCE_CASE", case.to_owned()),
        ];
        Ok((Adapter::start(&self.command, &env)?, user))
    }

    /// Starts the client and serves it up to a completed bind.
    async fn bound(&self, case: &str, server: &Server) -> Result<(Adapter, Served), String> {
        let (mut a, user) = self.start(case, server)?;
        let mut s = server.accept(WAIT).await.map_err(|e| with_stderr(&a, e))?;
        match s.event(WAIT, bind_asked).await {
            Some(ServerEvent::BindRequested { user_id, .. }) if user_id == user => {}
            Some(e) => return Err(format!("bound {e:?}, not {user}")),
            None => return Err(with_stderr(&a, "no BIND after the handshake".into())),
        }
        if a.line("bound", WAIT, |_| true).await.is_none() {
            return Err(with_stderr(&a, "the adapter did not print `bound`".into()));
        }
        Ok((a, s))
    }

    async fn case(&self, id: &str) -> CaseOutcome {
        let hb = if id == "heartbeat" {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(180)
        };
        let server = Server::bind(self.transport, hb).await?;
        match id {
            "handshake" => {
                let (a, _) = self.start(id, &server)?;
                let mut s = server.accept(WAIT).await?;
                match s.event(WAIT, handshaken).await {
                    Some(ServerEvent::HandshakeCompleted { device, .. }) => {
                        if device.device_id.is_empty() || device.os_name.is_empty() {
                            return Err(format!(
                                "the handshake lacks its device fields: {device:?}"
                            ));
                        }
                        pass()
                    }
                    Some(other) => Err(format!("{other:?}")),
                    None => Err(with_stderr(&a, "no handshake".into())),
                }
            }
            "bind" => {
                self.bound(id, &server).await?;
                pass()
            }
            "push.no_ack" | "push.auto_ack" | "push.biz_ack" => {
                let mode = match id {
                    "push.auto_ack" => AckMode::Auto,
                    "push.biz_ack" => AckMode::Biz,
                    _ => AckMode::None,
                };
                let (mut a, mut s) = self.bound(id, &server).await?;
                s.push("hello conformance", mode, false).await?;
                let line = a
                    .line("message", WAIT, |v| v["text"] == "hello conformance")
                    .await
                    .ok_or_else(|| with_stderr(&a, "the application got no message".into()))?;
                if mode == AckMode::None {
                    return pass();
                }
                if mode == AckMode::Biz && line["needsAck"] != true {
                    return Err(format!(
                        "a BIZ push reached the application without needsAck: {line}"
                    ));
                }
                match s
                    .event(WAIT, |e| matches!(e, ServerEvent::Acked { .. }))
                    .await
                {
                    Some(_) => pass(),
                    None => Err("no ACK came back".into()),
                }
            }
            "push.duplicate" => {
                let (mut a, mut s) = self.bound(id, &server).await?;
                let profile = s.machine.profile();
                s.push("only once", AckMode::Auto, true).await?;
                s.settle(Duration::from_millis(200)).await;
                let n = a.count("message", Duration::from_secs(2)).await;
                match (n, profile) {
                    (1, _) => pass(),
                    (0, _) => Err(with_stderr(&a, "the message did not arrive".into())),
                    (_, Profile::Legacy) => Ok(Outcome::NotOffered(format!(
                        "the legacy profile has no message ids: the application got it {n} times"
                    ))),
                    (_, _) => Err(format!("the application got the same message {n} times")),
                }
            }
            "heartbeat" => {
                let (a, mut s) = self.bound(id, &server).await?;
                let hb = s.machine.heartbeat();
                let from = s.heartbeats.len();
                s.settle(hb * 3 + Duration::from_millis(500)).await;
                let n = s.heartbeats.len() - from;
                if s.closed {
                    return Err(with_stderr(
                        &a,
                        format!("the connection ended ({n} heartbeat(s) at a negotiated {hb:?})"),
                    ));
                }
                if n >= 2 {
                    pass()
                } else {
                    Err(format!(
                        "{n} heartbeat(s) in {:?} at a negotiated {hb:?}",
                        hb * 3
                    ))
                }
            }
            "backoff" => {
                let (a, _) = self.start(id, &server)?;
                let mut at = Vec::new();
                let until = Instant::now() + Duration::from_secs(9);
                while Instant::now() < until {
                    let left = until.saturating_duration_since(Instant::now());
                    match tokio::time::timeout(left, server.listener.accept()).await {
                        // Refused: closed before a byte is read.
                        Ok(Ok((conn, _))) => {
                            at.push(Instant::now());
                            drop(conn);
                        }
                        _ => break,
                    }
                }
                if at.len() < 2 {
                    return Err(with_stderr(
                        &a,
                        format!("{} attempt(s) in 9 s: it gave up", at.len()),
                    ));
                }
                let gaps: Vec<u128> = at.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
                if at.len() > 12 {
                    let first: Vec<u128> = gaps.iter().take(8).copied().collect();
                    return Err(format!(
                        "{} attempts in 9 s (first gaps {first:?} ms): a tight loop",
                        at.len()
                    ));
                }
                if gaps.last() < gaps.first() {
                    return Err(format!("the waits shrink: {gaps:?} ms"));
                }
                pass()
            }
            "fast_connect" => {
                let (_a, mut s) = self.bound(id, &server).await?;
                s.settle(Duration::from_millis(300)).await;
                // The server goes away; the client comes back.
                drop(s);
                let mut s = server.accept(Duration::from_secs(20)).await?;
                match s.event(WAIT, handshaken).await {
                    Some(ServerEvent::Resumed { .. }) => {}
                    Some(ServerEvent::HandshakeCompleted { .. }) => {
                        return Err("the reconnect did a full handshake, not FAST_CONNECT".into());
                    }
                    other => return Err(format!("no resume: {other:?}")),
                }
                match s.event(WAIT, bind_asked).await {
                    Some(_) => pass(),
                    None => Err("resumed, but the user was not bound again".into()),
                }
            }
            "kick" => {
                let (mut a, mut s) = self.bound(id, &server).await?;
                s.machine.kick("another-device", "conf-user-kick");
                s.flush().await;
                s.settle(Duration::from_millis(100)).await;
                match a.line("kicked", WAIT, |_| true).await {
                    Some(_) => pass(),
                    None => Err(with_stderr(
                        &a,
                        "the application was not told of the KICK".into(),
                    )),
                }
            }
            "error.reconnect" => {
                let (a, _) = self.start(id, &server)?;
                let mut s = server.accept(WAIT).await?;
                s.refuse_bind = true;
                if s.event(WAIT, bind_asked).await.is_none() {
                    return Err(with_stderr(&a, "no BIND".into()));
                }
                s.settle(Duration::from_millis(300)).await;
                drop(s);
                match server.accept(Duration::from_secs(20)).await {
                    Ok(_) => pass(),
                    Err(e) => Err(with_stderr(&a, e)),
                }
            }
            "redirect" => {
                let (a, mut s) = self.bound(id, &server).await?;
                if s.machine.profile() != Profile::V2 {
                    return Ok(Outcome::NotOffered(
                        "the client speaks the legacy profile".into(),
                    ));
                }
                let other = Server::bind(self.transport, hb).await?;
                let sent = s.machine.redirect(&Redirect {
                    address: other.address(),
                    retry_after_ms: 100,
                    jitter_ms: 100,
                    reason: "conformance".into(),
                });
                if !sent {
                    return Ok(Outcome::NotOffered(
                        "this connection cannot be redirected".into(),
                    ));
                }
                s.flush().await;
                s.settle(Duration::from_millis(300)).await;
                match other.accept(Duration::from_secs(15)).await {
                    Ok(_) => pass(),
                    Err(e) => Err(with_stderr(&a, e)),
                }
            }
            other => Err(format!("no case {other}")),
        }
    }
}

fn with_stderr(a: &Adapter, why: String) -> String {
    let tail = a.stderr_tail();
    if tail.trim().is_empty() {
        why
    } else {
        format!(
            "{why}; the adapter's stderr ends: {}",
            tail.trim().replace('\n', " | ")
        )
    }
}

fn b64(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}
