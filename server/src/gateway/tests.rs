//! The connection driver at its seams: an in-memory transport below it, a
//! fake logic above it, and the protocol's own client machine at the other
//! end of the pipe. No socket, no store: what the driver hands the logic
//! layer, and what it does with the answers, is all that is observed.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use mpush_protocol::Instant;
use mpush_protocol::client::{ClientCloseReason, ClientConfig, ClientConnection, ClientEvent};
use mpush_protocol::dedup::DedupWindow;
use mpush_protocol::message::{HttpRequest, HttpResponse, Redirect};
use mpush_protocol::server::OutboundPush;
use mpush_protocol::session::{AckMode, KeptBinding, SessionRecord};
use mpush_protocol::testing::{default_key, test_device};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

use super::transport::{Incoming, Transport};
use super::{Gateway, Logic, conn};
use crate::auth::TokenError;
use crate::logic::{Lifecycle, Outcome, Settling, UpPushOutcome, UpPushStrikes, UpRefusal};
use crate::route::{self, ConnCommand, ConnInfo, ConnQueue};

const WAIT: Duration = Duration::from_secs(5);

/// A logic layer that records what it is told and answers as set.
struct Fake {
    next_conn: AtomicU64,
    open: AtomicUsize,
    shutdown: watch::Sender<bool>,
    refuse_bind: AtomicBool,
    /// The up-push answer: refused for the rate, and close the connection.
    up_abuse: AtomicBool,
    /// What `replay_inbox` hands a user who binds.
    kept: Mutex<Vec<OutboundPush>>,
    sessions: Mutex<Vec<SessionRecord>>,
    /// Every call the driver made, in order, in words.
    calls: Mutex<Vec<String>>,
    /// The queue of the last connection that bound.
    bound: Mutex<Option<Arc<ConnQueue>>>,
    /// Proxied requests wait for a permit here, then echo their URI.
    proxy_gate: Arc<tokio::sync::Semaphore>,
}

impl Fake {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            next_conn: AtomicU64::new(1),
            open: AtomicUsize::new(0),
            shutdown: watch::channel(false).0,
            refuse_bind: AtomicBool::new(false),
            up_abuse: AtomicBool::new(false),
            kept: Mutex::new(Vec::new()),
            sessions: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
            bound: Mutex::new(None),
            proxy_gate: Arc::new(tokio::sync::Semaphore::new(0)),
        })
    }

    fn call(&self, what: impl Into<String>) {
        self.calls.lock().push(what.into());
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().clone()
    }

    /// Waits until the driver has made `what` (they run on its task).
    async fn called(&self, what: &str) {
        let t0 = tokio::time::Instant::now();
        while !self.calls().iter().any(|c| c == what) {
            assert!(
                t0.elapsed() < WAIT,
                "no `{what}` call; calls: {:?}",
                self.calls()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Logic for Fake {
    fn opened(&self) -> u64 {
        self.open.fetch_add(1, Ordering::SeqCst);
        self.next_conn.fetch_add(1, Ordering::SeqCst)
    }

    fn closed(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.call("closed");
    }

    fn connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    fn redirect_for(&self, transport: route::Transport) -> Redirect {
        self.call(format!("redirect {transport:?}"));
        Redirect {
            address: "10.0.0.2:3000".into(),
            retry_after_ms: 100,
            jitter_ms: 1,
            reason: "server shutting down".into(),
        }
    }

    async fn store_session(&self, s: SessionRecord) {
        self.call("store_session");
        self.sessions.lock().push(s);
    }

    async fn session(&self, session_id: &str) -> Option<SessionRecord> {
        self.call("session");
        self.sessions
            .lock()
            .iter()
            .find(|s| s.session_id == session_id)
            .cloned()
    }

    async fn rotate_session(&self, _: Option<String>, next: Option<SessionRecord>) -> bool {
        self.call("rotate_session");
        self.sessions.lock().extend(next);
        true
    }

    async fn bind(
        &self,
        info: &Arc<ConnInfo>,
        tx: &Arc<ConnQueue>,
        user_id: &str,
        tags: String,
        token: &str,
        _previous: Option<&Arc<str>>,
    ) -> Result<(Arc<str>, KeptBinding), TokenError> {
        self.call(format!("bind {user_id} {tags} {token} {}", info.device_id));
        if self.refuse_bind.load(Ordering::SeqCst) {
            return Err(TokenError::OtherUser);
        }
        *self.bound.lock() = Some(tx.clone());
        let kept = KeptBinding {
            user_id: user_id.to_owned(),
            tags,
            expires_at_ms: 0,
        };
        Ok((user_id.into(), kept))
    }

    async fn restore(
        &self,
        _: &Arc<ConnInfo>,
        tx: &Arc<ConnQueue>,
        binding: &KeptBinding,
    ) -> Option<Arc<str>> {
        self.call(format!("restore {}", binding.user_id));
        if self.refuse_bind.load(Ordering::SeqCst) {
            return None;
        }
        *self.bound.lock() = Some(tx.clone());
        Some(binding.user_id.as_str().into())
    }

    async fn keep_binding(&self, session_id: String, binding: Option<KeptBinding>) {
        let user = binding.as_ref().map_or("-", |b| b.user_id.as_str());
        self.call(format!("keep {user}"));
        for s in self.sessions.lock().iter_mut() {
            if s.session_id == session_id {
                s.binding = binding.clone();
            }
        }
    }

    async fn unbind(&self, user: &str, _: &ConnInfo) -> bool {
        self.call(format!("unbind {user}"));
        true
    }

    async fn replay_inbox(&self, user: &Arc<str>, _: &ConnInfo) -> Vec<OutboundPush> {
        self.call(format!("replay {user}"));
        std::mem::take(&mut *self.kept.lock())
    }

    fn settle<'a>(
        &'a self,
        user: &'a Arc<str>,
        _: &'a ConnInfo,
        outcome: Outcome<'a>,
    ) -> Option<Settling<'a>> {
        let what = match &outcome {
            Outcome::Written { traces, .. } => format!("written {user} {}", traces.join(",")),
            Outcome::Refused { trace_id, .. } => format!("refused {user} {trace_id}"),
            Outcome::Retried { trace_id, .. } => format!("retried {user} {trace_id}"),
            Outcome::Acked(p) => format!("acked {user} {}", p.trace_id),
            Outcome::TimedOut(p) => format!("timed out {user} {}", p.trace_id),
            Outcome::Closed(unacked) => format!("closed with {} unacked", unacked.len()),
        };
        // The inbox work comes back as a future the connection awaits.
        Some(Box::pin(async move { self.call(what) }))
    }

    async fn up_push(
        &self,
        user: Option<&Arc<str>>,
        _: &ConnInfo,
        content: &[u8],
        _: Option<u64>,
        _: &mut UpPushStrikes,
    ) -> UpPushOutcome {
        self.call(format!(
            "up_push {} {}",
            user.map_or("-", |u| &**u),
            String::from_utf8_lossy(content)
        ));
        if self.up_abuse.load(Ordering::SeqCst) {
            return UpPushOutcome {
                result: Err(UpRefusal::RateLimited("per connection")),
                close: true,
            };
        }
        UpPushOutcome {
            result: Ok(()),
            close: false,
        }
    }

    fn wants_lifecycle(&self) -> bool {
        true
    }

    fn lifecycle(&self, kind: Lifecycle, user: &str, _: &ConnInfo, _: Option<&str>) {
        self.call(format!("lifecycle {kind:?} {user}"));
    }

    fn http_proxy_per_conn(&self) -> usize {
        2
    }

    fn http_proxy(
        &self,
        caller: crate::proxy::Caller,
        request: HttpRequest,
    ) -> impl Future<Output = HttpResponse> + Send + 'static {
        self.call(format!(
            "http_proxy {} as {}",
            request.uri,
            caller.user.as_deref().unwrap_or("-")
        ));
        let gate = self.proxy_gate.clone();
        async move {
            let _ = gate.acquire().await.map(|p| p.forget());
            HttpResponse {
                status_code: 200,
                reason_phrase: "OK".into(),
                headers: String::new(),
                body: request.uri.into_bytes(),
            }
        }
    }
}

/// An in-memory byte pipe: what the client writes arrives as `Data`; the
/// client dropping its end is end of file.
struct Pipe {
    rx: mpsc::UnboundedReceiver<Bytes>,
    tx: mpsc::UnboundedSender<Bytes>,
}

impl Transport for Pipe {
    const KIND: route::Transport = route::Transport::Tcp;

    async fn recv(&mut self) -> io::Result<Incoming> {
        Ok(match self.rx.recv().await {
            Some(b) => Incoming::Data(b),
            None => Incoming::Eof,
        })
    }

    async fn send(&mut self, data: Bytes) -> io::Result<()> {
        self.tx
            .send(data)
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }

    async fn send_text(&mut self, _: String) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    async fn ping(&mut self) -> io::Result<()> {
        Ok(())
    }

    async fn shutdown(&mut self) {}
}

/// The protocol's client machine at the other end of a pipe.
struct Client {
    machine: ClientConnection,
    to_server: Option<mpsc::UnboundedSender<Bytes>>,
    from_server: mpsc::UnboundedReceiver<Bytes>,
}

impl Client {
    fn flush(&mut self) {
        while let Some(b) = self.machine.poll_transmit() {
            if let Some(tx) = &self.to_server {
                let _ = tx.send(b);
            }
        }
    }

    /// The next event, reading from the server as needed.
    async fn next(&mut self) -> ClientEvent {
        loop {
            self.flush();
            if let Some(e) = self.machine.poll_event() {
                self.flush();
                return e;
            }
            let got = tokio::time::timeout(WAIT, self.from_server.recv()).await;
            match got.expect("the server answers within the wait") {
                Some(b) => self.machine.handle_input(&b, Instant::now()),
                None => self.machine.close(),
            }
        }
    }

    /// Connected, or panics.
    async fn connected(&mut self) {
        let e = self.next().await;
        assert!(
            matches!(e, ClientEvent::Connected { resumed: false, .. }),
            "{e:?}"
        );
    }

    async fn bind(&mut self, user: &str) -> ClientEvent {
        self.machine
            .bind(user, "vip,beta", "a-token", Instant::now())
            .expect("connected");
        self.next().await
    }
}

/// A gateway over `logic`, and one connection to it driven on its own task.
fn connect(logic: &Arc<Fake>) -> (Client, tokio::task::JoinHandle<()>) {
    let (client, task, _) = connect_gw(logic);
    (client, task)
}

/// `connect`, and the gateway the connection is on.
fn connect_gw(logic: &Arc<Fake>) -> (Client, tokio::task::JoinHandle<()>, Arc<Gateway<Fake>>) {
    connect_gw_with(logic, |_| {})
}

/// `connect_gw` with settings of the test's own.
fn connect_gw_with(
    logic: &Arc<Fake>,
    settings: impl FnOnce(&mut crate::config::Settings),
) -> (Client, tokio::task::JoinHandle<()>, Arc<Gateway<Fake>>) {
    let mut s = crate::config::Settings::default();
    s.net.tcp = "127.0.0.1:0".into();
    s.net.ws = "127.0.0.1:0".into();
    s.net.http = "127.0.0.1:0".into();
    settings(&mut s);
    let cfg = s.validate().expect("valid settings");
    let mut proto = mpush_protocol::server::ServerConfig::new(cfg.private_key.clone());
    proto.http_proxy = true;
    // As the server runs it: the RSA work on the gateway's pool.
    proto.offload_rsa = true;
    let proto = Arc::new(proto);
    let gw = Gateway::new(logic.clone(), proto, &cfg);
    let (to_server, rx) = mpsc::unbounded_channel();
    let (tx, from_server) = mpsc::unbounded_channel();
    let peer: std::net::SocketAddr = "127.0.0.1:40000".parse().expect("address");
    let slot = gw.per_ip.acquire(peer.ip()).expect("a slot");
    let id = logic.opened();
    let task = tokio::spawn(conn::serve(
        Pipe { rx, tx },
        gw.clone(),
        id,
        peer,
        slot,
        false,
    ));
    let machine = ClientConnection::new(
        Arc::new(ClientConfig::new(
            Arc::new(default_key().public()),
            test_device(),
        )),
        [7; 32],
        Instant::now(),
        crate::clock::unix_ms(),
        None,
        DedupWindow::default(),
    );
    let client = Client {
        machine,
        to_server: Some(to_server),
        from_server,
    };
    (client, task, gw)
}

/// The connection's task ends within the wait, without a panic.
async fn ended(task: tokio::task::JoinHandle<()>) {
    tokio::time::timeout(WAIT, task)
        .await
        .expect("ends")
        .expect("no panic");
}

fn push(trace: &str, content: &str) -> OutboundPush {
    OutboundPush {
        message_id: 0,
        trace_id: trace.into(),
        content: Bytes::copy_from_slice(content.as_bytes()),
        ack_mode: AckMode::Auto,
        expires_at_ms: 0,
        ack_timeout: None,
        queued_at: None,
    }
}

fn send(logic: &Fake, p: OutboundPush) {
    let q = logic.bound.lock().clone().expect("a bound connection");
    assert!(q.try_send(ConnCommand::Push(Arc::new(p))).is_ok());
}

#[tokio::test]
async fn a_bound_connection_writes_a_push_and_settles_its_ack() {
    let logic = Fake::new();
    let (mut client, task) = connect(&logic);
    client.connected().await;
    assert!(logic.calls().contains(&"store_session".to_owned()));

    let e = client.bind("alice").await;
    assert_eq!(
        e,
        ClientEvent::BindOk {
            user_id: "alice".into()
        }
    );
    let device = test_device().device_id;
    let calls = logic.calls();
    let at = |c: &str| calls.iter().position(|x| x == c);
    let bind = at(&format!("bind alice vip,beta a-token {device}")).expect("bind");
    let bound = at("lifecycle Bound alice").expect("lifecycle");
    let replay = at("replay alice").expect("replay");
    assert!(bind < bound && bound < replay, "{calls:?}");

    send(
        &logic,
        OutboundPush {
            message_id: 11,
            ..push("t-1", "hello")
        },
    );
    let ClientEvent::Message(m) = client.next().await else {
        panic!("a message");
    };
    assert_eq!((&*m.content, m.trace_id.as_str()), (&b"hello"[..], "t-1"));
    logic.called("written alice t-1").await;
    // The client acknowledges on its own (auto ACK) when it next writes.
    client.flush();
    logic.called("acked alice t-1").await;

    // The client goes: the driver unbinds, settles nothing left, and
    // closes its count.
    drop(client);
    ended(task).await;
    let calls = logic.calls();
    assert!(
        calls.contains(&"closed with 0 unacked".to_owned()),
        "{calls:?}"
    );
    assert!(calls.contains(&"unbind alice".to_owned()), "{calls:?}");
    assert_eq!(calls.last().map(String::as_str), Some("closed"));
    assert_eq!(logic.connections(), 0);
}

#[tokio::test]
async fn a_refused_bind_is_mpush_s_bind_error_and_nothing_is_registered() {
    let logic = Fake::new();
    logic.refuse_bind.store(true, Ordering::SeqCst);
    let (mut client, task) = connect(&logic);
    client.connected().await;
    let e = client.bind("mallory").await;
    let ClientEvent::Closed {
        reason: ClientCloseReason::ServerError { reason, .. },
        ..
    } = e
    else {
        panic!("the client closes on the bind error: {e:?}");
    };
    assert_eq!(reason, "bind failed");
    drop(client);
    ended(task).await;
    let calls = logic.calls();
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("replay") || c.starts_with("lifecycle")),
        "{calls:?}"
    );
    assert!(!calls.iter().any(|c| c.starts_with("unbind")), "{calls:?}");
}

#[tokio::test]
async fn what_was_kept_is_replayed_in_order_at_bind() {
    let logic = Fake::new();
    logic.kept.lock().extend([
        OutboundPush {
            message_id: 1,
            ..push("k-1", "first")
        },
        OutboundPush {
            message_id: 2,
            ..push("k-2", "second")
        },
    ]);
    let (mut client, _task) = connect(&logic);
    client.connected().await;
    assert!(matches!(
        client.bind("bob").await,
        ClientEvent::BindOk { .. }
    ));
    let mut got = Vec::new();
    for _ in 0..2 {
        let ClientEvent::Message(m) = client.next().await else {
            panic!("a message");
        };
        got.push(m.trace_id);
    }
    assert_eq!(got, ["k-1", "k-2"]);
    logic.called("written bob k-1,k-2").await;
}

#[tokio::test]
async fn an_up_push_the_logic_calls_abuse_closes_the_connection() {
    let logic = Fake::new();
    logic.up_abuse.store(true, Ordering::SeqCst);
    let (mut client, task) = connect(&logic);
    client.connected().await;
    assert!(matches!(
        client.bind("eve").await,
        ClientEvent::BindOk { .. }
    ));
    client
        .machine
        .push(b"spam", AckMode::Auto, WAIT, Instant::now())
        .expect("connected");
    // The refusal, then the close: the decision is the logic's.
    loop {
        match client.next().await {
            ClientEvent::Closed { .. } => break,
            ClientEvent::PushRefused { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    ended(task).await;
    assert!(logic.calls().contains(&"up_push eve spam".to_owned()));
}

#[tokio::test]
async fn a_drain_redirects_the_client_then_closes() {
    let logic = Fake::new();
    let (mut client, task, gw) = connect_gw(&logic);
    client.connected().await;
    assert!(matches!(
        client.bind("carol").await,
        ClientEvent::BindOk { .. }
    ));
    assert_eq!(gw.conns.len(), 1, "the open connection is registered");
    let _ = logic.shutdown.send(true);
    let e = client.next().await;
    let ClientEvent::Redirect(r) = e else {
        panic!("a redirect: {e:?}");
    };
    assert_eq!(r.address, "10.0.0.2:3000");
    assert!(logic.calls().contains(&"redirect Tcp".to_owned()));
    // Nothing in flight: the driver closes without waiting for the drain timeout.
    ended(task).await;
    assert!(logic.calls().contains(&"unbind carol".to_owned()));
    assert_eq!(gw.conns.len(), 0, "a closed connection leaves the registry");
}

/// The drain waits for the ACKs in flight until its deadline, which the
/// gateway's timers keep (the connection's task holds no timer): a client
/// that never acknowledges is closed then, long before its push's own ACK
/// timeout, and the push is settled as left unacknowledged.
#[tokio::test]
async fn a_drain_closes_a_client_that_does_not_acknowledge_at_its_deadline() {
    let logic = Fake::new();
    let (mut client, task, gw) = connect_gw_with(&logic, |s| s.shutdown.drain_timeout_ms = 300);
    client.connected().await;
    client.bind("carol").await;
    let mut p = push("t1", "hello");
    p.ack_timeout = Some(Duration::from_secs(60));
    send(&logic, p);
    // The push's bytes arrive; the client machine never sees them, so no
    // ACK goes back.
    let got = tokio::time::timeout(WAIT, client.from_server.recv()).await;
    assert!(got.expect("the push is written").is_some());
    let started = std::time::Instant::now();
    let _ = logic.shutdown.send(true);
    ended(task).await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "closed before the drain's deadline: {took:?}"
    );
    let calls = logic.calls();
    assert!(
        calls.contains(&"closed with 1 unacked".to_owned()),
        "{calls:?}"
    );
    assert!(calls.contains(&"unbind carol".to_owned()), "{calls:?}");
    assert_eq!(gw.conns.len(), 0);
}

/// The timers hold about two entries per open connection: entries of
/// closed connections, and those a connection has since armed earlier
/// than, are dropped once they outnumber the open connections (a churn of
/// short connections, or of ACK deadlines, does not grow the heap).
#[tokio::test]
async fn the_timers_drop_what_no_open_connection_is_armed_for() {
    let reg = super::ConnRegistry::default();
    let q = Arc::new(ConnQueue::new(4));
    reg.register(1, &q);
    // Ever earlier deadlines: each leaves the one before it stale.
    for at in (1_000_000..1_003_000).rev() {
        if q.arm(at) {
            reg.timers.add(at, 1);
        }
    }
    // Connections that are gone.
    for conn in 2..1_000 {
        reg.timers.add(2_000_000, conn);
    }
    assert!(reg.timers.len() > 3_000);
    let mut due = Vec::new();
    reg.fire_due(&mut due);
    assert_eq!(reg.timers.len(), 1, "only the armed entry is left");
    assert!(q.armed_for(1_000_000));
}

/// A deadline that moved later does not wake the connection when the
/// earlier one comes: the timers re-arm its entry for the later one (a
/// node's connections that all finished their handshakes within a second
/// would otherwise be woken together at the handshake deadline, in the
/// middle of the pushes they serve). The later deadline does wake it.
#[tokio::test]
async fn a_deadline_that_moved_later_wakes_nobody_until_it_comes() {
    let reg = super::ConnRegistry::default();
    let q = Arc::new(ConnQueue::new(4));
    reg.register(1, &q);
    let now = reg.timers.now();
    // The handshake's deadline, then the heartbeat's once it is done.
    assert!(q.arm(now + 1));
    reg.timers.add(now + 1, 1);
    assert!(!q.arm(now + 10_000_000), "later: only noted");
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut due = Vec::new();
    let next = reg.fire_due(&mut due);
    assert!(q.try_recv().is_none(), "not woken for the earlier deadline");
    assert_eq!(reg.timers.len(), 1, "one live entry, for the later one");
    assert!(q.armed_for(now + 10_000_000));
    assert!(next.is_some_and(|at| at > tokio::time::Instant::now()));
    // Moved later by little: re-armed, then woken when it comes.
    let q2 = Arc::new(ConnQueue::new(4));
    reg.register(2, &q2);
    let now = reg.timers.now();
    assert!(q2.arm(now + 1));
    reg.timers.add(now + 1, 2);
    assert!(!q2.arm(now + 3));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let next = reg.fire_due(&mut due);
    assert!(q2.try_recv().is_none(), "re-armed first");
    assert!(
        next.is_some_and(|at| at <= tokio::time::Instant::now()),
        "the re-armed entry is due: the task turns again at once"
    );
    reg.fire_due(&mut due);
    assert!(matches!(q2.try_recv(), Some(ConnCommand::Tick)));
    assert!(q.try_recv().is_none());
}

/// A client that closes its connection while its handshake waits for the
/// RSA worker gives its place up at once: its task ends and the worker
/// skips the job, instead of both lasting until the handshake's deadline
/// (a storm's clients that gave up would otherwise be decrypted anyway).
#[tokio::test]
async fn a_client_that_leaves_while_its_handshake_waits_for_rsa_costs_no_rsa_work() {
    let logic = Fake::new();
    let (mut client, task, gw) = connect_gw_with(&logic, |s| s.limits.rsa_workers = 1);
    // The only worker is busy: one job of 256 blocks (well over a second
    // in a debug build).
    let mut rng = crate::clock::rng();
    let block = mpush_protocol::crypto::RsaPublic::mpush_default()
        .encrypt(&mut rng, b"a handshake's body")
        .expect("encrypt");
    let long = Bytes::from(block.repeat(256));
    let busy = tokio::spawn({
        let gw = gw.clone();
        async move { gw.rsa.decrypt(long).await }
    });
    tokio::task::yield_now().await;
    // The client's handshake goes out, then the client leaves.
    client.flush();
    client.to_server = None;
    ended(task).await;
    assert!(
        !busy.is_finished(),
        "the connection ended while the worker was still busy"
    );
    let decrypted = tokio::time::timeout(Duration::from_secs(60), busy)
        .await
        .expect("the long job ends")
        .expect("no panic");
    assert!(decrypted.is_ok());
    // The worker has passed over the abandoned job: the next one is
    // answered, and two operations were done in all (the long job and it).
    let next = gw.rsa.decrypt(Bytes::from(block)).await.expect("queued");
    assert_eq!(next.expect("decrypted"), b"a handshake's body");
    assert_eq!(
        gw.rsa.done(),
        2,
        "the abandoned handshake was not decrypted"
    );
}

/// A connection that opens while the node drains (its accept raced the
/// drain) drains at once, though the drain went out before it was there: it
/// is closed instead of being served.
#[tokio::test]
async fn a_connection_opened_during_a_drain_is_not_served() {
    let logic = Fake::new();
    // No receiver yet: `send` would not store it.
    logic.shutdown.send_replace(true);
    let (mut client, task, gw) = connect_gw(&logic);
    // The gateway's watcher has seen the signal (it runs at once).
    for _ in 0..100 {
        if gw.conns.draining.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(gw.conns.draining.load(std::sync::atomic::Ordering::SeqCst));
    loop {
        match client.next().await {
            ClientEvent::Closed { .. } => break,
            ClientEvent::BindOk { .. } => panic!("served during a drain"),
            _ => {}
        }
    }
    ended(task).await;
    assert_eq!(gw.conns.len(), 0);
}

/// mpush's HTTP proxy: a request runs beside the connection (a push is
/// written while two wait on their backend), the third in flight is 429 at
/// once, and each response goes back under its own request id.
#[tokio::test]
async fn proxied_requests_run_beside_the_connection_within_its_limit() {
    let logic = Fake::new();
    let (mut client, task) = connect(&logic);
    client.connected().await;
    client.bind("alice").await;
    let req = |uri: &str| HttpRequest {
        method: mpush_protocol::message::HttpMethod::Post,
        uri: uri.into(),
        headers: "readTimeout:3000\n".into(),
        body: b"a=1".to_vec(),
    };
    let mut ids = Vec::new();
    for uri in ["http://api/1", "http://api/2", "http://api/3"] {
        ids.push(
            client
                .machine
                .http(&req(uri), WAIT, Instant::now())
                .expect("connected"),
        );
    }
    client.flush();
    let e = client.next().await;
    let ClientEvent::HttpResponse { request, response } = e else {
        panic!("the third is refused at once: {e:?}");
    };
    assert_eq!((request, response.status_code), (ids[2], 429));
    logic.called("http_proxy http://api/2 as alice").await;
    // The connection is not held up by the two waiting on their backend.
    send(&logic, push("t-1", "meanwhile"));
    let e = client.next().await;
    assert!(
        matches!(&e, ClientEvent::Message(m) if &*m.content == b"meanwhile"),
        "{e:?}"
    );
    logic.proxy_gate.add_permits(2);
    let mut got = Vec::new();
    for _ in 0..2 {
        match client.next().await {
            ClientEvent::HttpResponse { request, response } => {
                got.push((request, response.status_code, response.body));
            }
            other => panic!("a response: {other:?}"),
        }
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            (ids[0], 200, b"http://api/1".to_vec()),
            (ids[1], 200, b"http://api/2".to_vec())
        ]
    );
    drop(client);
    ended(task).await;
}

/// Every idle connection is one task holding this future: its size is
/// memory per connection (issue 27's floor is 2,048 bytes per idle TCP
/// connection in all). What grew it before: an `async fn`'s arguments kept
/// beside the driver they were moved into, a `while let` keeping a whole
/// event across an await, a write's timer held in the loop, a heartbeat
/// timer per connection (the gateway's timers keep the deadlines now). 376
/// bytes with the pinned toolchain. The bound is what keeps tokio's task
/// cell (the future, a 32-byte header, the scheduler and id, a 48-byte
/// trailer, aligned to 128 bytes) in jemalloc's 512-byte class: at 409 bytes
/// it is a 640-byte cell.
#[tokio::test]
async fn an_idle_connection_s_task_stays_small() {
    let logic = Fake::new();
    let mut s = crate::config::Settings::default();
    s.net.tcp = "127.0.0.1:0".into();
    s.net.ws = "127.0.0.1:0".into();
    s.net.http = "127.0.0.1:0".into();
    let cfg = s.validate().expect("valid settings");
    let proto = Arc::new(mpush_protocol::server::ServerConfig::new(
        cfg.private_key.clone(),
    ));
    let gw = Gateway::new(logic.clone(), proto, &cfg);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let c = tokio::net::TcpStream::connect(l.local_addr().expect("address"))
        .await
        .expect("connect");
    let peer: std::net::SocketAddr = "127.0.0.1:40000".parse().expect("address");
    let slot = gw.per_ip.acquire(peer.ip()).expect("a slot");
    let f = conn::serve(crate::gateway::transport::Tcp(c), gw, 1, peer, slot, false);
    let size = std::mem::size_of_val(&f);
    assert!(size <= 400, "the connection's future is {size} bytes");
}
