//! One task per connection: the driver around the protocol machine. It moves
//! bytes and time into the machine, carries its output to the socket (all
//! that is queued in one write), and answers the machine's IO round trips
//! through the hub. It makes no protocol decision of its own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use mpush_protocol::Instant;
use mpush_protocol::json_server::JsonServerConnection;
use mpush_protocol::message::Redirect;
use mpush_protocol::server::{CloseReason, OutboundPush, PushError, ServerConnection, ServerEvent};
use mpush_protocol::session::{AckMode, Profile, SessionRecord};
use parking_lot::RwLock;
use tokio::sync::mpsc;
use tracing::{debug, info};

use super::limits::IpSlot;
use super::registry::{ConnCommand, ConnHandle, ConnInfo, Kick};
use super::transport::{Incoming, Transport};
use crate::clock::{seed, unix_ms};
use crate::push::Hub;
use crate::store::TraceState;

/// The protocol machine of a connection: binary packets, or mpush's JSON form
/// (chosen by a WebSocket client's first frame).
enum Machine {
    Binary(Box<ServerConnection>),
    Json(Box<JsonServerConnection>),
}

impl Machine {
    fn poll_event(&mut self) -> Option<ServerEvent> {
        match self {
            Self::Binary(m) => m.poll_event(),
            Self::Json(m) => m.poll_event(),
        }
    }
    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Self::Binary(m) => m.poll_timeout(),
            Self::Json(m) => m.poll_timeout(),
        }
    }
    fn handle_timeout(&mut self, now: Instant) {
        match self {
            Self::Binary(m) => m.handle_timeout(now),
            Self::Json(m) => m.handle_timeout(now),
        }
    }
    fn is_closed(&self) -> bool {
        match self {
            Self::Binary(m) => m.is_closed(),
            Self::Json(m) => m.is_closed(),
        }
    }
    fn inflight(&self) -> usize {
        match self {
            Self::Binary(m) => m.inflight(),
            Self::Json(m) => m.inflight(),
        }
    }
    fn push(&mut self, p: OutboundPush, now: Instant) -> Result<i32, PushError> {
        match self {
            Self::Binary(m) => m.push(p, now),
            Self::Json(m) => m.push(p, now),
        }
    }
    fn kick(&mut self, device_id: &str, user_id: &str) {
        match self {
            Self::Binary(m) => m.kick(device_id, user_id),
            Self::Json(m) => m.kick(device_id, user_id),
        }
    }
    fn close(&mut self) {
        match self {
            Self::Binary(m) => m.close(),
            Self::Json(m) => m.close(),
        }
    }
    fn handle_bind_result(&mut self, request: i32, user: &str, r: Result<(), String>) {
        match self {
            Self::Binary(m) => m.handle_bind_result(request, user, r),
            Self::Json(m) => m.handle_bind_result(request, user, r),
        }
    }
    fn handle_unbind_result(&mut self, request: i32, ok: bool) {
        match self {
            Self::Binary(m) => m.handle_unbind_result(request, ok),
            Self::Json(m) => m.handle_unbind_result(request, ok),
        }
    }
}

/// What the driver remembers about pushes in flight, to trace their outcome.
struct Sent {
    trace_id: String,
    ack_mode: AckMode,
    /// Kept (a refcount, not a copy) so a drain can move it to the inbox.
    content: Bytes,
    expires_at_ms: u64,
}

struct Driver<T: Transport> {
    hub: Arc<Hub>,
    transport: T,
    machine: Machine,
    conn_id: u64,
    peer: SocketAddr,
    info: Option<Arc<ConnInfo>>,
    user: Option<String>,
    tx: Option<mpsc::Sender<ConnCommand>>,
    sent: HashMap<u64, Sent>,
    draining: bool,
    accepted: Instant,
    /// This connection's place in its address's count; freed with the driver.
    _slot: IpSlot,
}

/// Serves one accepted connection until it closes.
pub async fn serve<T: Transport>(transport: T, hub: Arc<Hub>, peer: SocketAddr, slot: IpSlot) {
    let now = Instant::now();
    let conn_id = hub.next_conn_id();
    let machine = Machine::Binary(Box::new(ServerConnection::new(
        hub.proto.clone(),
        seed(),
        now,
        unix_ms(),
    )));
    let (tx, rx) = mpsc::channel(hub.cfg.settings.limits.outbound_queue);
    let mut d = Driver {
        hub,
        transport,
        machine,
        conn_id,
        peer,
        info: None,
        user: None,
        tx: Some(tx),
        sent: HashMap::new(),
        draining: false,
        accepted: now,
        _slot: slot,
    };
    d.run(rx).await;
}

impl<T: Transport> Driver<T> {
    async fn run(&mut self, mut rx: mpsc::Receiver<ConnCommand>) {
        let mut first_frame = true;
        let mut drain_deadline: Option<tokio::time::Instant> = None;
        let mut shutdown = self.hub.shutdown.subscribe();
        if *shutdown.borrow() {
            self.command(ConnCommand::Drain);
        }
        loop {
            let deadline = self
                .machine
                .poll_timeout()
                .map(tokio::time::Instant::from_std);
            let sleep_until = match (deadline, drain_deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                _ = shutdown.changed(), if !self.draining => self.command(ConnCommand::Drain),
                // `self.tx` keeps the queue open for the connection's whole life.
                Some(c) = rx.recv() => self.command(c),
                inc = self.transport.recv() => match inc {
                    Ok(Incoming::Data(b)) => {
                        if first_frame && T::NAME == "ws" { first_frame = false; }
                        match &mut self.machine {
                            Machine::Binary(m) => m.handle_input(&b, Instant::now()),
                            Machine::Json(m) => m.handle_binary(),
                        }
                    }
                    Ok(Incoming::Text(t)) => {
                        if first_frame {
                            // mpush's JavaScript client speaks JSON text frames.
                            self.machine = Machine::Json(Box::new(JsonServerConnection::new(self.hub.proto.clone(), self.accepted)));
                            first_frame = false;
                        }
                        match &mut self.machine {
                            Machine::Json(m) => m.handle_text(&t, Instant::now()),
                            Machine::Binary(m) => m.close(),
                        }
                    }
                    Ok(Incoming::Activity) => {
                        if let Machine::Json(m) = &mut self.machine {
                            m.handle_activity(Instant::now());
                        }
                    }
                    Ok(Incoming::Eof) | Err(_) => break,
                },
                _ = sleep_opt(sleep_until) => {
                    self.machine.handle_timeout(Instant::now());
                    if drain_deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                        self.machine.close();
                    }
                }
            }
            while let Ok(c) = rx.try_recv() {
                self.command(c);
            }
            if self.pump().await.is_err() {
                break;
            }
            if self.draining && drain_deadline.is_none() {
                drain_deadline = Some(
                    tokio::time::Instant::now()
                        + std::time::Duration::from_millis(
                            self.hub.cfg.settings.shutdown.drain_timeout_ms,
                        ),
                );
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
        while let Some(e) = self.machine.poll_event() {
            self.event(e).await;
        }
        self.transport.shutdown().await;
        self.finish().await;
    }

    fn command(&mut self, c: ConnCommand) {
        let now = Instant::now();
        match c {
            ConnCommand::Push(p) => self.push(*p, now),
            ConnCommand::Kicked(k) => self.machine.kick(&k.device_id, &k.user_id),
            ConnCommand::KickAndClose => {
                if let (Some(info), Some(user)) = (&self.info, &self.user) {
                    let device = info.device.device_id.clone();
                    let user = user.clone();
                    self.machine.kick(&device, &user);
                }
                self.machine.close();
            }
            ConnCommand::Drain => {
                self.draining = true;
                let s = &self.hub.cfg.settings.shutdown;
                if let Machine::Binary(m) = &mut self.machine {
                    m.redirect(&Redirect {
                        address: self
                            .hub
                            .redirect_to
                            .get()
                            .cloned()
                            .unwrap_or_else(|| s.redirect_to.clone()),
                        retry_after_ms: 0,
                        jitter_ms: s.redirect_jitter_ms,
                        reason: "server shutting down".into(),
                    });
                }
            }
        }
    }

    fn push(&mut self, p: OutboundPush, now: Instant) {
        let (message_id, trace_id, ack_mode) = (p.message_id, p.trace_id.clone(), p.ack_mode);
        let (content, expires_at_ms) = (p.content.clone(), p.expires_at_ms);
        let result = self.machine.push(p, now);
        let hub = self.hub.clone();
        let (user, device, ct) = self.who();
        match result {
            Ok(_) => {
                if ack_mode != AckMode::None {
                    self.sent.insert(
                        message_id,
                        Sent {
                            trace_id: trace_id.clone(),
                            ack_mode,
                            content,
                            expires_at_ms,
                        },
                    );
                }
                tokio::spawn(async move {
                    hub.trace(&trace_id, &user, &device, ct, TraceState::Dispatched, None)
                        .await;
                });
            }
            Err(e) => {
                let state = if matches!(e, PushError::Duplicate(_)) {
                    TraceState::Dispatched
                } else {
                    TraceState::Failed
                };
                tokio::spawn(async move {
                    hub.trace(&trace_id, &user, &device, ct, state, Some(e.to_string()))
                        .await;
                });
            }
        }
    }

    fn who(&self) -> (String, String, i32) {
        (
            self.user.clone().unwrap_or_default(),
            self.info
                .as_ref()
                .map(|i| i.device.device_id.clone())
                .unwrap_or_default(),
            self.info.as_ref().map_or(-1, |i| i.client_type),
        )
    }

    /// Handles every event, then writes every transmit, until both are empty.
    async fn pump(&mut self) -> std::io::Result<()> {
        loop {
            let mut busy = false;
            while let Some(e) = self.machine.poll_event() {
                busy = true;
                self.event(e).await;
            }
            match &mut self.machine {
                Machine::Binary(m) => {
                    if let Some(bytes) = m.poll_transmit() {
                        busy = true;
                        self.write(bytes).await?;
                    }
                }
                Machine::Json(m) => {
                    if m.poll_ping() {
                        busy = true;
                        let t = self.hub.cfg.write_timeout();
                        tokio::time::timeout(t, self.transport.ping())
                            .await
                            .map_err(|_| slow())??;
                    }
                    while let Some(text) = m.poll_transmit() {
                        busy = true;
                        let t = self.hub.cfg.write_timeout();
                        tokio::time::timeout(t, self.transport.send_text(text))
                            .await
                            .map_err(|_| slow())??;
                    }
                }
            }
            if !busy {
                return Ok(());
            }
        }
    }

    async fn write(&mut self, bytes: Bytes) -> std::io::Result<()> {
        let t = self.hub.cfg.write_timeout();
        match tokio::time::timeout(t, self.transport.send(bytes)).await {
            Ok(r) => r,
            Err(_) => {
                metrics::counter!("mpush_slow_consumer_closed_total").increment(1);
                Err(slow())
            }
        }
    }

    async fn event(&mut self, e: ServerEvent) {
        let now = Instant::now();
        match e {
            ServerEvent::HandshakeCompleted {
                device,
                session,
                profile,
            } => {
                if let Some(s) = session {
                    self.hub.sessions.put(s).await;
                }
                self.set_info(device, profile);
                metrics::counter!("mpush_handshakes_total", "kind" => "full").increment(1);
            }
            ServerEvent::DecryptRequested { ciphertext } => {
                // Off the async workers (the address's budget is its
                // connection rate), and never past the handshake deadline.
                let deadline = tokio::time::Instant::from_std(
                    self.accepted + self.hub.proto.handshake_timeout,
                );
                // Boxed: the connection task's future stays as small as an idle
                // connection needs; this state exists only during a handshake.
                let job = self.hub.rsa.decrypt(ciphertext);
                let result = Box::pin(tokio::time::timeout_at(deadline, job)).await;
                match (result, &mut self.machine) {
                    (Ok(Ok(plain)), Machine::Binary(m)) => {
                        m.handle_decrypt_result(plain, Instant::now())
                    }
                    (Ok(Err(refused)), m) => {
                        debug!(peer = %self.peer, %refused, "handshake refused");
                        m.close();
                    }
                    (_, m) => {
                        debug!(peer = %self.peer, "handshake deadline passed waiting for RSA");
                        m.close();
                    }
                }
            }
            ServerEvent::ResumeRequested { session_id, .. } => {
                let record = self.hub.sessions.get(&session_id).await;
                if let Machine::Binary(m) = &mut self.machine {
                    m.handle_resume_result(record, now);
                }
            }
            ServerEvent::Resumed {
                device,
                profile,
                session,
                replaces,
            } => {
                self.set_info(device, profile);
                metrics::counter!("mpush_handshakes_total", "kind" => "fast").increment(1);
                if replaces.is_some() || session.is_some() {
                    // Boxed: only a resuming connection carries this state.
                    Box::pin(self.rotate_ticket(session, replaces)).await;
                }
            }
            ServerEvent::BindRequested {
                request,
                user_id,
                tags,
                token,
                previous_user,
            } => {
                self.bind(request, user_id, tags, token, previous_user)
                    .await;
            }
            ServerEvent::UnbindRequested { request, user_id } => {
                let ok = self.hub.registry.unbind(&user_id, self.conn_id);
                self.forget_route(&user_id).await;
                if ok || self.user.as_deref() == Some(user_id.as_str()) {
                    self.user = None;
                }
                self.machine.handle_unbind_result(request, true);
            }
            ServerEvent::UpPush { .. } => {
                metrics::counter!("mpush_up_pushes_total").increment(1);
            }
            ServerEvent::HttpProxy { .. } => {}
            ServerEvent::Acked { message_id } => self.acked(message_id).await,
            ServerEvent::PushRetried {
                message_id,
                attempt,
            } => {
                metrics::counter!("mpush_push_retries_total").increment(1);
                // Each resend shows in the trace's history (the state stays DISPATCHED).
                if let Some(s) = self.sent.get(&message_id) {
                    let trace_id = s.trace_id.clone();
                    let (user, device, ct) = self.who();
                    self.hub
                        .trace(
                            &trace_id,
                            &user,
                            &device,
                            ct,
                            TraceState::Dispatched,
                            Some(format!("resent (retry {attempt})")),
                        )
                        .await;
                }
            }
            ServerEvent::PushTimedOut { message_id } => {
                if let Some(s) = self.sent.remove(&message_id) {
                    let (user, device, ct) = self.who();
                    self.hub
                        .trace(
                            &s.trace_id,
                            &user,
                            &device,
                            ct,
                            TraceState::Timeout,
                            Some("no ACK after every retry".into()),
                        )
                        .await;
                }
            }
            ServerEvent::Closed { reason, unacked } => {
                debug!(conn = self.conn_id, peer = %self.peer, ?reason, unacked = unacked.len(), "connection closed");
                if matches!(
                    reason,
                    CloseReason::Protocol(_) | CloseReason::UnsupportedCommand(_)
                ) {
                    metrics::counter!("mpush_protocol_errors_total").increment(1);
                }
                // Pushes still waiting for an ACK stay in the inbox (if they
                // had a TTL) and are re-sent on the next bind. On shutdown,
                // every un-ACKed push is kept, with the session TTL if it had none.
                let (user, device, ct) = self.who();
                for id in unacked {
                    if let Some(s) = self.sent.remove(&id) {
                        if self.draining && !user.is_empty() {
                            let keep =
                                i64::try_from(self.hub.cfg.settings.delivery.session_ttl_secs)
                                    .unwrap_or(86_400)
                                    * 1000;
                            let expires_at_ms = match i64::try_from(s.expires_at_ms).unwrap_or(0) {
                                0 => unix_ms() + keep,
                                t => t,
                            };
                            let kept = crate::store::StoredMessage {
                                message_id: id,
                                trace_id: s.trace_id.clone(),
                                content: s.content.clone(),
                                ack_mode: s.ack_mode,
                                client_type: None,
                                expires_at_ms,
                            };
                            if self.hub.inbox.push(&user, kept).await.is_err() {
                                metrics::counter!("mpush_inbox_full_total").increment(1);
                            }
                        }
                        self.hub
                            .trace(
                                &s.trace_id,
                                &user,
                                &device,
                                ct,
                                TraceState::Offline,
                                Some("connection closed before the ACK".into()),
                            )
                            .await;
                    }
                }
            }
            _ => {}
        }
    }

    /// v2 tickets are single-use: whoever deletes the old session first
    /// keeps the connection; a concurrent replay of the ticket loses it.
    async fn rotate_ticket(&mut self, next: Option<SessionRecord>, replaces: Option<String>) {
        if let Some(old) = replaces
            && !self.hub.sessions.remove(&old).await
        {
            metrics::counter!("mpush_resume_replays_total").increment(1);
            self.machine.close();
            return;
        }
        if let Some(s) = next {
            self.hub.sessions.put(s).await;
        }
    }

    fn set_info(&mut self, device: mpush_protocol::session::DeviceInfo, profile: Profile) {
        self.info = Some(Arc::new(ConnInfo {
            id: self.conn_id,
            client_type: device.client_type(),
            device,
            profile,
            transport: T::NAME,
            connected_at_ms: unix_ms(),
            tags: RwLock::new(String::new()),
        }));
    }

    async fn bind(
        &mut self,
        request: i32,
        user_id: String,
        tags: String,
        token: String,
        previous: Option<String>,
    ) {
        let Some(info) = self.info.clone() else {
            return;
        };
        let grant = match self
            .hub
            .cfg
            .bind_auth
            .check(&user_id, info.client_type, &token)
        {
            Ok(g) => g,
            Err(reason) => {
                metrics::counter!("mpush_bind_refused_total").increment(1);
                debug!(conn = self.conn_id, peer = %self.peer, %reason, "bind refused");
                self.machine
                    .handle_bind_result(request, &user_id, Err(reason));
                return;
            }
        };
        let tags = grant.tags.unwrap_or(tags);
        if let Some(prev) = previous.filter(|p| *p != user_id) {
            self.hub.registry.unbind(&prev, self.conn_id);
        }
        *info.tags.write() = tags;
        let Some(tx) = self.tx.clone() else {
            return;
        };
        let handle = ConnHandle {
            info: info.clone(),
            tx,
        };
        if let Some(old) = self.hub.registry.bind(&user_id, handle) {
            // mpush 7.4: the older connection of the same client type is told
            // who replaced it; it stays open (its client decides).
            let _ = old.tx.try_send(ConnCommand::Kicked(Box::new(Kick {
                device_id: old.info.device.device_id.clone(),
                user_id: user_id.clone(),
            })));
            metrics::counter!("mpush_kicks_total").increment(1);
        }
        if let Some(cl) = self.hub.cluster.get() {
            // The route table; a route of the same client type on another
            // node means a login elsewhere: kick it there (mpush 7.4).
            match cl
                .route_set(
                    &user_id,
                    info.client_type,
                    self.conn_id,
                    &info.device.device_id,
                )
                .await
            {
                Ok(Some(old)) if old.node != cl.node_id => {
                    let kick = serde_json::json!({"userId": user_id, "clientType": old.client_type, "connId": old.conn_id.to_string()});
                    let _ = cl
                        .publish(&format!("mp:kick:{}", old.node), kick.to_string())
                        .await;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "route table unavailable; bound locally only"),
            }
        }
        self.user = Some(user_id.clone());
        self.machine.handle_bind_result(request, &user_id, Ok(()));
        info!(conn = self.conn_id, user = %user_id, device = %info.device.device_id, "bound");
        // The offline inbox, in order.
        let now = Instant::now();
        for m in self.hub.pending_for(&user_id, info.client_type).await {
            let push = OutboundPush {
                message_id: m.message_id,
                trace_id: m.trace_id,
                content: m.content,
                ack_mode: m.ack_mode,
                expires_at_ms: u64::try_from(m.expires_at_ms).unwrap_or(0),
                ack_timeout: None,
            };
            if m.ack_mode == AckMode::None {
                self.hub.inbox.remove(&user_id, m.message_id).await;
            }
            self.push(push, now);
        }
    }

    async fn acked(&mut self, message_id: u64) {
        let Some(s) = self.sent.remove(&message_id) else {
            return;
        };
        let (user, device, ct) = self.who();
        let state = if s.ack_mode == AckMode::Biz {
            TraceState::Ack
        } else {
            TraceState::Delivered
        };
        self.hub
            .trace(&s.trace_id, &user, &device, ct, state, None)
            .await;
        self.hub.inbox.remove(&user, message_id).await;
        metrics::counter!("mpush_acks_total").increment(1);
    }

    async fn forget_route(&self, user: &str) {
        if let (Some(cl), Some(info)) = (self.hub.cluster.get(), &self.info) {
            cl.route_del(user, info.client_type, &cl.node_id, self.conn_id)
                .await;
        }
    }

    async fn finish(&mut self) {
        if let Some(user) = self.user.take() {
            self.hub.registry.unbind(&user, self.conn_id);
            self.forget_route(&user).await;
        }
        self.tx = None;
        self.hub.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

fn slow() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "slow consumer: write timed out",
    )
}

async fn sleep_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
