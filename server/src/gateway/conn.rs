//! One task per connection: the driver around its protocol machine. It moves
//! bytes and time into the machine, carries the machine's output to the
//! socket (everything queued in one write), and hands what the client asked
//! for (bind, resume) and what became of each push (written, acknowledged,
//! timed out, left unacknowledged at close) to the logic layer. It makes no
//! protocol decision, and no delivery decision, of its own.

use std::net::SocketAddr;
use std::sync::Arc;

use mpush_protocol::Instant;
use mpush_protocol::json_server::JsonServerConnection;
use mpush_protocol::machine::{Input, ServerMachine, Transmit};
use mpush_protocol::message::{HttpRequest, HttpResponse};
use mpush_protocol::server::{
    Answer, BindRefusal, CloseReason, OutboundPush, PushError, ServerConnection, ServerEvent,
    UpPushRefusal,
};
use mpush_protocol::session::{DeviceInfo, KeptBinding, Profile};
use tracing::{debug, info};

use super::limits::IpSlot;
use super::transport::{Incoming, Transport};
use super::{Gateway, Logic};
use crate::clock::{conn_seed, unix_ms};
use crate::logic::{Lifecycle, Outcome, UpPushStrikes};
use crate::proxy::Caller;
use crate::route::{ConnCommand, ConnInfo, ConnQueue};

/// HTTP_PROXY requests under way on tasks of their own, and where their
/// responses come back. Boxed, made at the first request: most connections
/// never use the proxy, and their task does not carry it.
struct Proxied {
    tx: tokio::sync::mpsc::UnboundedSender<(i32, HttpResponse)>,
    rx: tokio::sync::mpsc::UnboundedReceiver<(i32, HttpResponse)>,
    in_flight: usize,
}

struct Driver<T: Transport, L: Logic> {
    gw: Arc<Gateway<L>>,
    transport: T,
    machine: Box<dyn ServerMachine>,
    conn_id: u64,
    /// The peer's port; its address is the IP slot's (`peer()`).
    port: u16,
    info: Option<Arc<ConnInfo>>,
    user: Option<Arc<str>>,
    tx: Arc<ConnQueue>,
    /// Traces of the pushes queued in the machine since the last write (and
    /// when the server accepted each): they are DELIVERED once that write
    /// succeeds.
    /// Pushes handed to the machine and not yet written: their trace, when
    /// they were queued, and the message id of a copy kept in the inbox
    /// until it is written (a TTL push without an ACK mode).
    unwritten: Vec<(Arc<str>, Option<Instant>, Option<u64>)>,
    draining: bool,
    /// The drain's deadline, in the gateway timers' ticks (`u64::MAX`: none).
    drain_at: u64,
    /// Up-pushes refused for this connection's or user's rate in a row.
    strikes: UpPushStrikes,
    accepted: Instant,
    proxied: Option<Box<Proxied>>,
    /// This connection's place in its address's count; freed with the driver.
    _slot: IpSlot,
}

/// Serves one accepted connection (counted by `Logic::opened`) until it closes.
/// `secure`: it arrived over TLS (our listener, or a trusted proxy that says
/// so), so the transport-secured profile is allowed on it (ADR 0005).
///
/// Not an `async fn`: the driver is built here and the task's future owns it
/// (an `async fn` keeps its arguments beside what they were moved into for
/// the task's whole life, about 180 bytes per connection).
pub fn serve<T: Transport, L: Logic>(
    transport: T,
    gw: Arc<Gateway<L>>,
    conn_id: u64,
    peer: SocketAddr,
    slot: IpSlot,
    secure: bool,
) -> impl Future<Output = ()> + Send + 'static {
    let now = Instant::now();
    let mut machine = Box::new(ServerConnection::new(
        gw.settings.proto.clone(),
        conn_seed(),
        now,
        unix_ms(),
    ));
    machine.set_transport_secured(secure);
    debug_assert_eq!(slot.ip(), peer.ip(), "the slot counts the peer's address");
    let tx = Arc::new(ConnQueue::new(gw.settings.outbound_queue));
    let mut d = Driver {
        gw,
        transport,
        machine,
        conn_id,
        port: peer.port(),
        info: None,
        user: None,
        tx,
        unwritten: Vec::new(),
        draining: false,
        drain_at: u64::MAX,
        strikes: UpPushStrikes::default(),
        accepted: now,
        proxied: None,
        _slot: slot,
    };
    // A span per connection (DEBUG: an idle connection costs nothing for it
    // unless debug logs are on) that its log lines carry: id, peer, and the
    // device and user once known.
    let span = tracing::debug_span!(
        "conn",
        id = conn_id,
        %peer,
        device = tracing::field::Empty,
        user = tracing::field::Empty
    );
    // An `async` block, not an `async fn` taking the driver: the block
    // keeps the driver once, where an `async fn` keeps its argument and the
    // local it is moved into.
    let run = async move { d.run().await };
    if span.is_disabled() {
        futures_util::future::Either::Left(run)
    } else {
        // Boxed: only with debug logs on does a connection's task carry a span.
        futures_util::future::Either::Right(Box::pin(tracing::Instrument::instrument(run, span)))
    }
}

impl<T: Transport, L: Logic> Driver<T, L> {
    async fn run(&mut self) {
        let mut first_frame = true;
        // The drain and the deadlines come through the queue
        // (`ConnCommand::Drain`, `ConnCommand::Tick`): an idle connection
        // holds no future and no timer for them.
        if self.gw.conns.register(self.conn_id, &self.tx) {
            self.drain();
        }
        loop {
            self.arm();
            tokio::select! {
                c = self.tx.recv() => self.command(c),
                r = proxied(&mut self.proxied), if self.proxied.as_ref().is_some_and(|p| p.in_flight > 0) => {
                    let (request, response) = r;
                    self.machine.handle_answer(Answer::Http { request, response }, Instant::now());
                }
                inc = self.transport.recv() => match inc {
                    Ok(Incoming::Eof) | Err(_) => break,
                    Ok(inc) => {
                        match &inc {
                            Incoming::Text(_) if std::mem::take(&mut first_frame) => {
                                // mpush's JavaScript client speaks JSON text
                                // frames from its first frame on.
                                self.machine = Box::new(JsonServerConnection::new(
                                    self.gw.settings.proto.clone(),
                                    self.accepted,
                                ));
                            }
                            Incoming::Data(_) => first_frame = false,
                            _ => {}
                        }
                        self.input(&inc);
                    }
                },
            }
            while let Some(c) = self.tx.try_recv() {
                self.command(c);
            }
            if self.pump().await.is_err() {
                break;
            }
            if self.draining && self.drain_at == u64::MAX {
                let at = tokio::time::Instant::now() + self.gw.settings.drain_timeout;
                self.drain_at = self.gw.conns.timers.tick_of(at);
            }
            if self.draining && self.machine.inflight() == 0 {
                self.machine.close();
            }
            if self.machine.is_closed() {
                let _ = self.pump().await;
                break;
            }
        }
        // Whatever the machine did not report, the socket is gone now.
        self.machine.close();
        // `let ... else`, not `while let`: a `while let` keeps its scrutinee
        // (a whole `Option<ServerEvent>`) in the task's state across the await.
        loop {
            let Some(e) = self.machine.poll_event() else {
                break;
            };
            Box::pin(self.event(e)).await;
        }
        self.transport.shutdown().await;
        Box::pin(self.finish()).await;
        self.gw.conns.remove(self.conn_id);
    }

    /// Hands one frame from the socket to the machine.
    fn input(&mut self, frame: &Incoming) {
        let now = Instant::now();
        match frame {
            Incoming::Data(b) => self.machine.handle_input(Input::Bytes(b), now),
            Incoming::Text(t) => self.machine.handle_input(Input::Text(t), now),
            Incoming::Activity => self.machine.handle_input(Input::Activity, now),
            Incoming::Eof => {}
        }
    }

    /// Sets the connection's next deadline (the machine's or the drain's);
    /// enters it in the gateway's timers if it is earlier than the one armed
    /// (see `gateway::timers`).
    fn arm(&self) {
        let timers = &self.gw.conns.timers;
        let machine = self
            .machine
            .poll_timeout()
            .map(|d| timers.tick_of(tokio::time::Instant::from_std(d)));
        let at = machine.map_or(self.drain_at, |m| m.min(self.drain_at));
        if self.tx.arm(at) {
            super::start_timers(&self.gw);
            timers.add(at, self.conn_id);
        }
    }

    /// A deadline came: the machine's (if it has not moved on since) and
    /// the drain's.
    fn tick(&mut self) {
        let now = Instant::now();
        if self.machine.poll_timeout().is_some_and(|d| d <= now) {
            self.machine.handle_timeout(now);
        }
        if self.drain_at <= self.gw.conns.timers.now() {
            self.machine.close();
        }
    }

    fn peer(&self) -> SocketAddr {
        SocketAddr::new(self._slot.ip(), self.port)
    }

    fn drain(&mut self) {
        self.draining = true;
        let redirect = self.gw.logic.redirect_for(T::KIND);
        self.machine.redirect(&redirect);
    }

    fn command(&mut self, c: ConnCommand) {
        match c {
            ConnCommand::Push(p) => self.push(Arc::unwrap_or_clone(p)),
            ConnCommand::Kicked(k) => {
                if let (Some(info), Some(user)) = (&self.info, &self.user)
                    && *k.device_id == *info.device_id
                    && **user == *k.user_id
                {
                    self.gw.logic.lifecycle(Lifecycle::Kicked, user, info, None);
                    // Another device took the user: this connection stays
                    // open (as in mpush) but is no longer the user's. The
                    // route table no longer names it (the kick took it out).
                    self.user = None;
                }
                self.machine.kick(&k.device_id, &k.user_id);
            }
            ConnCommand::Drain => {
                if !self.draining {
                    self.drain();
                }
            }
            ConnCommand::Tick => self.tick(),
            ConnCommand::KickAndClose => {
                if let (Some(info), Some(user)) = (&self.info, &self.user) {
                    self.gw.logic.lifecycle(
                        Lifecycle::Kicked,
                        user,
                        info,
                        Some("kicked by the API"),
                    );
                    let (device, user) = (info.device_id.clone(), user.clone());
                    self.machine.kick(&device, &user);
                }
                self.machine.close();
            }
        }
    }

    fn push(&mut self, p: OutboundPush) {
        let trace_id = p.trace_id.clone();
        let queued_at = p.queued_at;
        let kept = (p.ack_mode == mpush_protocol::session::AckMode::None && p.expires_at_ms > 0)
            .then_some(p.message_id);
        match self.machine.push(p, Instant::now()) {
            Ok(_) => self.unwritten.push((trace_id, queued_at, kept)),
            // Already in flight here (an inbox replay of a push under way).
            Err(PushError::Duplicate(_)) => {}
            Err(e) => {
                if let (Some(user), Some(info)) = (&self.user, &self.info) {
                    let why = e.to_string();
                    let outcome = Outcome::Refused {
                        trace_id: &trace_id,
                        why,
                    };
                    // A refusal is settled in the trace alone: nothing to await.
                    let work = self.gw.logic.settle(user, info, outcome);
                    debug_assert!(work.is_none(), "a refusal leaves no inbox work");
                }
            }
        }
    }

    /// Handles every event, then writes every transmit, until both are empty.
    async fn pump(&mut self) -> std::io::Result<()> {
        loop {
            let mut busy = false;
            // `let ... else`, not `while let`: a `while let` keeps its
            // scrutinee (a whole `Option<ServerEvent>`, about 170 bytes) in
            // the task's state across the await, for the task's whole life.
            loop {
                let Some(e) = self.machine.poll_event() else {
                    break;
                };
                busy = true;
                // Boxed: an idle connection's task does not carry the state
                // of the rarest, largest step (an event's round trip).
                Box::pin(self.event(e)).await;
            }
            loop {
                let Some(t) = self.machine.poll_transmit() else {
                    break;
                };
                busy = true;
                // Most writes go at once; the rest wait, boxed (see `wait_write`).
                if let Some(t) = self.try_write(t)? {
                    self.wait_write(t).await?;
                }
            }
            if !self.unwritten.is_empty() {
                let written = std::mem::take(&mut self.unwritten);
                for at in written.iter().filter_map(|(_, at, _)| *at) {
                    write_delay().record(at.elapsed().as_secs_f64());
                }
                if self.user.is_some() {
                    let kept: Vec<u64> = written.iter().filter_map(|(.., k)| *k).collect();
                    let traces: Vec<Arc<str>> = written.into_iter().map(|(t, ..)| t).collect();
                    let outcome = Outcome::Written {
                        traces: &traces,
                        kept: &kept,
                    };
                    self.settle(outcome).await;
                }
            }
            if !busy {
                return Ok(());
            }
        }
    }

    /// Writes `t` if the socket takes all of it now (no future, no timer);
    /// what is left to write otherwise.
    fn try_write(&mut self, mut t: Transmit) -> std::io::Result<Option<Transmit>> {
        if let Transmit::Bytes(b) = &mut t
            && self.transport.try_send(b)?
        {
            return Ok(None);
        }
        Ok(Some(t))
    }

    /// A write that waits (a full socket, or a transport that always waits),
    /// within the write timeout. Boxed, and made by a plain function: the
    /// idle task does not carry a wait's state (its timer alone is 112 bytes).
    fn wait_write(
        &mut self,
        t: Transmit,
    ) -> std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send + '_>> {
        let limit = self.gw.settings.write_timeout;
        let transport = &mut self.transport;
        Box::pin(async move {
            let r = match t {
                Transmit::Bytes(b) => tokio::time::timeout(limit, transport.send(b)).await,
                Transmit::Text(s) => tokio::time::timeout(limit, transport.send_text(s)).await,
                Transmit::Ping => tokio::time::timeout(limit, transport.ping()).await,
            };
            r.unwrap_or_else(|_| {
                metrics::counter!("mpush_slow_consumer_closed_total").increment(1);
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "slow consumer: write timed out",
                ))
            })
        })
    }

    async fn event(&mut self, e: ServerEvent) {
        let logic = self.gw.logic.clone();
        match e {
            ServerEvent::HandshakeCompleted {
                device,
                session,
                profile,
            } => {
                if let Some(s) = session {
                    logic.store_session(s).await;
                }
                self.set_info(device, profile);
                self.handshaken(Handshake::Full);
            }
            ServerEvent::DecryptRequested { ciphertext } => {
                // Off the async workers (the address's budget is its
                // connection rate), and never past the handshake deadline.
                let deadline = tokio::time::Instant::from_std(
                    self.accepted + self.gw.settings.proto.handshake_timeout,
                );
                // Boxed: the connection task's future stays as small as an idle
                // connection needs; this state exists only during a handshake.
                let job = self.gw.rsa.decrypt(ciphertext);
                let mut job = Box::pin(tokio::time::timeout_at(deadline, job));
                // The socket is watched meanwhile: a client that leaves while
                // its handshake waits for a worker (a storm's client that
                // gave up and reconnects) drops its job, which the worker
                // then skips, instead of holding it to the deadline. What
                // it sends meanwhile (one frame; the next waits in the
                // socket) is handled after the answer.
                let mut early = None;
                let decrypted = loop {
                    tokio::select! {
                        r = &mut job => break Some(r),
                        inc = self.transport.recv(), if early.is_none() => match inc {
                            Ok(Incoming::Eof) | Err(_) => break None,
                            Ok(frame) => early = Some(frame),
                        },
                    }
                };
                // Dropped before the answer is handled: if the client left,
                // the worker finds the job abandoned and skips it.
                drop(job);
                match decrypted {
                    Some(Ok(Ok(plain))) => self
                        .machine
                        .handle_answer(Answer::Decrypted(plain), Instant::now()),
                    Some(Ok(Err(refused))) => {
                        debug!(peer = %self.peer(), %refused, "handshake refused");
                        self.machine.close();
                    }
                    Some(Err(_)) => {
                        debug!(peer = %self.peer(), "handshake deadline passed waiting for RSA");
                        self.machine.close();
                    }
                    None => {
                        // The worker counts the skipped job (`expired`).
                        debug!(peer = %self.peer(), "client left while its handshake waited for RSA");
                        self.machine.close();
                    }
                }
                if let Some(frame) = early {
                    self.input(&frame);
                }
            }
            ServerEvent::ResumeRequested { session_id, .. } => {
                let record = Box::pin(logic.session(&session_id)).await;
                self.machine
                    .handle_answer(Answer::Session(record), Instant::now());
            }
            ServerEvent::Resumed {
                device,
                profile,
                session,
                replaces,
            } => {
                self.set_info(device, profile);
                self.handshaken(Handshake::Fast);
                if (replaces.is_some() || session.is_some())
                    && !Box::pin(logic.rotate_session(replaces, session)).await
                {
                    self.machine.close();
                }
            }
            ServerEvent::BindRequested {
                request,
                user_id,
                tags,
                token,
                ..
            } => Box::pin(self.bind(request, user_id, tags, token)).await,
            ServerEvent::RestoreRequested { binding } => Box::pin(self.restore(binding)).await,
            ServerEvent::ForgetBinding { session_id } => {
                logic.keep_binding(session_id, None).await;
            }
            ServerEvent::UnbindRequested { request, user_id } => {
                if let Some(session) = self.machine.kept_session() {
                    logic.keep_binding(session, None).await;
                }
                if let Some(info) = &self.info {
                    logic.unbind(&user_id, info).await;
                    logic.lifecycle(Lifecycle::Unbound, &user_id, info, None);
                }
                if self.user.as_deref() == Some(user_id.as_str()) {
                    self.user = None;
                }
                self.machine
                    .handle_answer(Answer::Unbind { request, ok: true }, Instant::now());
            }
            ServerEvent::UpPush {
                content,
                message_id,
                reply,
            } => {
                metrics::counter!("mpush_up_pushes_total").increment(1);
                let Some(info) = self.info.clone() else {
                    return;
                };
                // Awaited here: a connection's up-pushes reach the sinks in
                // the order it sent them, and a client that sends faster than
                // they accept is slowed down (its socket is not read meanwhile).
                let up = logic.up_push(
                    self.user.as_ref(),
                    &info,
                    &content,
                    message_id,
                    &mut self.strikes,
                );
                let outcome = Box::pin(up).await;
                let result = outcome.result.map_err(|e| {
                    debug!(conn = self.conn_id, refused = %e, "up-push refused");
                    if e.retryable() {
                        UpPushRefusal::RetryLater(e.to_string())
                    } else {
                        UpPushRefusal::Rejected(e.to_string())
                    }
                });
                self.machine
                    .handle_answer(Answer::UpPush { reply, result }, Instant::now());
                if outcome.close {
                    info!(conn = self.conn_id, peer = %self.peer(), "closed: up-pushes over the rate limit");
                    self.machine.close();
                }
            }
            ServerEvent::Acked { push } => {
                if let Some(at) = push.queued_at {
                    ack_delay().record(at.elapsed().as_secs_f64());
                }
                self.settle(Outcome::Acked(&push)).await;
            }
            ServerEvent::PushRetried {
                trace_id, attempt, ..
            } => {
                let outcome = Outcome::Retried {
                    trace_id: &trace_id,
                    attempt,
                };
                self.settle(outcome).await;
            }
            ServerEvent::PushTimedOut { push } => {
                self.settle(Outcome::TimedOut(&push)).await;
            }
            ServerEvent::Closed { reason, unacked } => {
                debug!(conn = self.conn_id, peer = %self.peer(), ?reason, unacked = unacked.len(), "connection closed");
                if matches!(
                    reason,
                    CloseReason::Protocol(_) | CloseReason::UnsupportedCommand(_)
                ) {
                    metrics::counter!("mpush_protocol_errors_total").increment(1);
                }
                if let (Some(user), Some(info), true) =
                    (&self.user, &self.info, logic.wants_lifecycle())
                {
                    logic.lifecycle(
                        Lifecycle::Disconnected,
                        user,
                        info,
                        Some(&close_reason(&reason)),
                    );
                }
                self.settle(Outcome::Closed(unacked)).await;
            }
            ServerEvent::HttpProxy { request, http } => self.http_proxy(request, http),
            _ => {}
        }
    }

    /// Runs a proxied request on a task of its own (the connection goes on
    /// meanwhile); its response comes back through `proxied`. Over the
    /// connection's in-flight limit the client gets 429 at once.
    fn http_proxy(&mut self, request: i32, http: HttpRequest) {
        let logic = &self.gw.logic;
        let in_flight = self.proxied.as_ref().map_or(0, |p| p.in_flight);
        if in_flight >= logic.http_proxy_per_conn() {
            metrics::counter!("mpush_http_proxy_requests_total", "outcome" => "conn_limit")
                .increment(1);
            let response = crate::proxy::refusal(
                429,
                "too many proxied requests in flight on this connection",
            );
            self.machine
                .handle_answer(Answer::Http { request, response }, Instant::now());
            return;
        }
        let caller = Caller {
            peer: self.peer(),
            user: self.user.clone(),
            device: self.info.as_ref().map(|i| i.device_id.clone()),
        };
        let work = logic.http_proxy(caller, http);
        let proxied = self.proxied.get_or_insert_with(|| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            Box::new(Proxied {
                tx,
                rx,
                in_flight: 0,
            })
        });
        proxied.in_flight += 1;
        let tx = proxied.tx.clone();
        tokio::spawn(async move {
            // A connection that closed meanwhile stops its requests.
            tokio::select! {
                response = work => {
                    let _ = tx.send((request, response));
                }
                _ = tx.closed() => {}
            }
        });
    }

    /// Settles what became of this connection's pushes (once it is bound);
    /// the future is the inbox work that leaves, if any. It holds only that
    /// work, not the driver.
    fn settle<'a>(&'a self, outcome: Outcome<'a>) -> impl Future<Output = ()> + Send + 'a {
        let work = match (&self.user, &self.info) {
            (Some(user), Some(info)) => self.gw.logic.settle(user, info, outcome),
            _ => None,
        };
        async move {
            if let Some(work) = work {
                work.await;
            }
        }
    }

    fn set_info(&mut self, device: DeviceInfo, profile: Profile) {
        tracing::Span::current().record("device", device.device_id.as_str());
        self.info = Some(Arc::new(ConnInfo::new(
            self.conn_id,
            &device,
            profile,
            T::KIND,
            unix_ms(),
        )));
    }

    async fn bind(&mut self, request: i32, user_id: String, tags: String, token: String) {
        let (Some(info), tx) = (self.info.clone(), self.tx.clone()) else {
            return;
        };
        let logic = self.gw.logic.clone();
        let result = logic
            .bind(&info, &tx, &user_id, tags, &token, self.user.as_ref())
            .await;
        let (user, binding) = match result {
            Ok(bound) => bound,
            Err(reason) => {
                debug!(conn = self.conn_id, peer = %self.peer(), %reason, "bind refused");
                let answer = Answer::Bind {
                    request,
                    user_id,
                    result: Err(BindRefusal::Unauthorized(reason.to_string())),
                };
                self.machine.handle_answer(answer, Instant::now());
                return;
            }
        };
        // ADR 0008: kept before the answer, so a client that saw its bind
        // succeed comes back bound from its next fast connect.
        if let Some(session) = self.machine.kept_session() {
            logic.keep_binding(session, Some(binding)).await;
        }
        let answer = Answer::Bind {
            request,
            user_id,
            result: Ok(()),
        };
        self.bound(user, info, answer).await;
    }

    /// A bind (or a restore) succeeded: the answer, the lifecycle event and
    /// the offline inbox, in order.
    async fn bound(&mut self, user: Arc<str>, info: Arc<ConnInfo>, answer: Answer) {
        let logic = self.gw.logic.clone();
        self.user = Some(user.clone());
        tracing::Span::current().record("user", &*user);
        info!(conn = self.conn_id, user = %user, device = %info.device_id, "bound");
        self.machine.handle_answer(answer, Instant::now());
        logic.lifecycle(Lifecycle::Bound, &user, &info, None);
        // The offline inbox, in order.
        for push in logic.replay_inbox(&user, &info).await {
            self.push(push);
        }
    }

    /// ADR 0008: a resumed session kept its binding; bound again here
    /// before the client hears FAST_CONNECT_OK, or told it is not.
    async fn restore(&mut self, binding: KeptBinding) {
        let logic = self.gw.logic.clone();
        let restored = match (self.info.clone(), self.machine.is_closed()) {
            (Some(info), false) => {
                let tx = self.tx.clone();
                logic.restore(&info, &tx, &binding).await.map(|u| (u, info))
            }
            _ => None,
        };
        match restored {
            Some((user, info)) => self.bound(user, info, Answer::Restored(true)).await,
            None => {
                // Not bound: nothing is kept either, so the next resume does
                // not restore what this client may not bind again.
                if let Some(session) = self.machine.kept_session() {
                    logic.keep_binding(session, None).await;
                }
                self.machine
                    .handle_answer(Answer::Restored(false), Instant::now());
            }
        }
    }

    fn handshaken(&self, kind: Handshake) {
        let (count, duration) = handshake_metrics(kind);
        count.increment(1);
        duration.record(self.accepted.elapsed().as_secs_f64());
    }

    async fn finish(&mut self) {
        if let (Some(user), Some(info)) = (self.user.take(), &self.info) {
            self.gw.logic.unbind(&user, info).await;
        }
        self.tx.close();
        self.gw.logic.closed();
    }
}

#[derive(Clone, Copy)]
enum Handshake {
    Full,
    Fast,
}

/// The handshake metrics of each kind, looked up once (a lookup by name and
/// label costs a hash and a lock on every connect).
fn handshake_metrics(kind: Handshake) -> &'static (metrics::Counter, metrics::Histogram) {
    type Pair = (metrics::Counter, metrics::Histogram);
    static FULL: std::sync::OnceLock<Pair> = std::sync::OnceLock::new();
    static FAST: std::sync::OnceLock<Pair> = std::sync::OnceLock::new();
    match kind {
        Handshake::Full => FULL.get_or_init(|| {
            (
                metrics::counter!("mpush_handshakes_total", "kind" => "full"),
                metrics::histogram!("mpush_handshake_duration_seconds", "kind" => "full"),
            )
        }),
        Handshake::Fast => FAST.get_or_init(|| {
            (
                metrics::counter!("mpush_handshakes_total", "kind" => "fast"),
                metrics::histogram!("mpush_handshake_duration_seconds", "kind" => "fast"),
            )
        }),
    }
}

/// The per-push histograms, looked up once (they are recorded per copy).
fn write_delay() -> &'static metrics::Histogram {
    static H: std::sync::OnceLock<metrics::Histogram> = std::sync::OnceLock::new();
    H.get_or_init(|| metrics::histogram!("mpush_push_write_delay_seconds"))
}

fn ack_delay() -> &'static metrics::Histogram {
    static H: std::sync::OnceLock<metrics::Histogram> = std::sync::OnceLock::new();
    H.get_or_init(|| metrics::histogram!("mpush_push_ack_seconds"))
}

/// Why a connection ended, for a lifecycle event.
fn close_reason(r: &CloseReason) -> String {
    match r {
        CloseReason::Local => "connection closed".into(),
        CloseReason::HeartbeatTimeout => "heartbeat timeout".into(),
        CloseReason::HandshakeTimeout => "handshake timeout".into(),
        CloseReason::Protocol(e) => format!("protocol error: {e}"),
        CloseReason::UnsupportedCommand(c) => format!("unsupported command {}", c.0),
        CloseReason::Refused(why) => format!("refused: {why}"),
        other => format!("{other:?}"),
    }
}

/// The next answer of an HTTP proxy request (pending while none can come);
/// polled, so the idle task holds no receive future for it.
async fn proxied(p: &mut Option<Box<Proxied>>) -> (i32, HttpResponse) {
    std::future::poll_fn(|cx| match p {
        // The driver holds a sender: the channel never ends.
        Some(p) => match p.rx.poll_recv(cx) {
            std::task::Poll::Ready(Some(r)) => {
                p.in_flight -= 1;
                std::task::Poll::Ready(r)
            }
            _ => std::task::Poll::Pending,
        },
        None => std::task::Poll::Pending,
    })
    .await
}
