//! The connection across reconnects: which server next, the backoff, what
//! is sent once connected, and what the connection's events mean for the
//! session.

use super::*;

impl Session {
    /// Starts a round: fetch the list from the allocator, or try the next server.
    pub(super) fn connect(&mut self, now: Instant) {
        self.tried = 0;
        match &self.config.allocator_url {
            Some(url) => {
                let url = url.clone();
                self.link = Link::Fetching;
                self.set_state(SessionState::Connecting {
                    address: url.clone(),
                });
                self.actions.push_back(Action::FetchServers { url });
            }
            None => self.open_next(now),
        }
    }

    pub(super) fn open_next(&mut self, now: Instant) {
        if self.servers.is_empty() {
            return self.retry_later(now, "no server address configured".into());
        }
        let address = self.servers[self.next_server % self.servers.len()].clone();
        self.next_server = (self.next_server + 1) % self.servers.len();
        self.tried += 1;
        self.link = Link::Opening {
            address: address.clone(),
            deadline: now + self.config.connect_timeout,
        };
        self.set_state(SessionState::Connecting {
            address: address.clone(),
        });
        self.actions.push_back(Action::Open { address });
    }

    pub(super) fn open_next_or_wait(&mut self, now: Instant, reason: String) {
        if self.tried < self.servers.len() {
            self.open_next(now);
        } else {
            self.retry_later(now, reason);
        }
    }

    pub(super) fn retry_later(&mut self, now: Instant, reason: String) {
        let delay = self.backoff.next_delay(&mut self.rng);
        self.wait(now, delay, reason);
    }

    pub(super) fn wait(&mut self, now: Instant, delay: Duration, reason: String) {
        self.link = Link::Waiting { at: now + delay };
        let retry_in_ms = delay.as_millis() as u64;
        self.set_state(SessionState::Disconnected {
            reason: reason.clone(),
            retry_in_ms,
        });
        self.events.push_back(SessionEvent::Disconnected {
            reason,
            retry_in_ms,
        });
    }

    pub(super) fn drop_connection(&mut self) {
        if self.conn_transport && !self.conn_established {
            // A transport-profile connection that ended before it was up:
            // the server would not take the profile (an older server, or
            // mpush), or the network failed mid-handshake. Either way the
            // classic handshake is used from now on, which every server takes.
            self.transport_refused = true;
        }
        if let Link::Connected { conn, .. } = &mut self.link {
            self.dedup = Some(conn.take_dedup());
        }
        // Legacy ACKs name packets of this connection: moot once it is gone.
        self.acks.retain(|_, (_, t)| t.message_id.is_some());
        // Up-pushes not answered yet go first on the next connection, in
        // the order they were made, with their message ids.
        for (_, p) in self.requests.drain().rev() {
            self.outbound.push_front(Outbound::Push(p));
        }
        self.link = Link::Stopped;
    }

    /// An up-push refused for now (or not answered): sent again later with
    /// its message id, or failed with `retry_later` after the last try.
    pub(super) fn retry_up_push(&mut self, mut p: UpPush, reason: String, now: Instant) {
        // mpush 0.8.1's profile carries no message id: a copy sent again is
        // a new event to the backend, so the app decides.
        let v2 =
            matches!(&self.link, Link::Connected { conn, .. } if conn.profile() == Profile::V2);
        if p.retries >= UP_PUSH_RETRIES || !v2 {
            self.settle(p.request, Err(SessionError::RetryLater(reason)));
            return;
        }
        let wait = Duration::from_secs(1 << p.retries.min(5));
        p.retries += 1;
        self.retry.push((now + wait, p));
    }

    /// Up-pushes whose wait is over: sent now, or queued for the next
    /// connection.
    pub(super) fn due_retries(&mut self, now: Instant) {
        while let Some(i) = self.retry.iter().position(|(at, _)| *at <= now) {
            let (_, p) = self.retry.remove(i);
            if self.is_connected() {
                self.send_outbound(Outbound::Push(p), now);
            } else {
                self.outbound.push_front(Outbound::Push(p));
            }
        }
        self.pump(now);
    }

    pub(super) fn send_outbound(&mut self, item: Outbound, now: Instant) {
        let Link::Connected { conn, .. } = &mut self.link else {
            return;
        };
        match item {
            Outbound::Push(p) => {
                match conn.push_with_id(&p.content, p.message_id, p.ack_mode, p.timeout, now) {
                    Ok(id) if p.ack_mode != AckMode::None => {
                        self.requests.insert(id, p);
                    }
                    Ok(_) => self.settle(p.request, Ok(())),
                    Err(e) => {
                        self.settle(p.request, Err(SessionError::PushRejected(e.to_string())))
                    }
                }
            }
            Outbound::Ack(token) => {
                let _ = conn.ack(token, now);
            }
        }
    }

    /// Moves the connection's output to actions and its events to session events.
    pub(super) fn pump(&mut self, now: Instant) {
        loop {
            let Link::Connected { conn, address } = &mut self.link else {
                return;
            };
            let address = address.clone();
            while let Some(b) = conn.poll_transmit() {
                self.actions.push_back(Action::Send(b));
            }
            let Some(e) = conn.poll_event() else {
                return;
            };
            self.on_connection_event(e, address, now);
        }
    }

    pub(super) fn on_connection_event(&mut self, e: ClientEvent, address: String, now: Instant) {
        match e {
            ClientEvent::Connected {
                profile,
                resumed,
                ticket,
                ..
            } => {
                self.backoff.reset();
                self.conn_established = true;
                if let Some(t) = ticket {
                    self.events.push_back(SessionEvent::TicketUpdated {
                        ticket: t.to_text(),
                    });
                    self.ticket = Some(t);
                }
                let v2 = profile == Profile::V2;
                self.set_state(SessionState::Connected {
                    address: address.clone(),
                    resumed,
                    v2,
                });
                self.events.push_back(SessionEvent::Connected {
                    address,
                    resumed,
                    v2,
                });
                if let (Some((u, t, k)), Link::Connected { conn, .. }) =
                    (self.user.clone(), &mut self.link)
                {
                    // ADR 0008: resumed already bound to the user the app
                    // still wants, with the same tags and token: no BIND.
                    let kept = resumed
                        && conn.binding_kept()
                        && self.confirmed.as_ref() == self.user.as_ref();
                    if kept {
                        self.settle_binds(Ok(()));
                        self.events.push_back(SessionEvent::BindResult {
                            user_id: u,
                            ok: true,
                            reason: String::new(),
                        });
                    } else {
                        let _ = conn.bind(&u, &t, &k, now);
                    }
                }
                while let Some(item) = self.outbound.pop_front() {
                    self.send_outbound(item, now);
                }
            }
            ClientEvent::ResumeRejected { .. } => {
                self.ticket = None;
                self.events.push_back(SessionEvent::TicketUpdated {
                    ticket: String::new(),
                });
            }
            ClientEvent::BindOk { user_id } => {
                if self.user.as_ref().is_some_and(|(u, ..)| *u == user_id) {
                    self.confirmed = self.user.clone();
                    self.settle_binds(Ok(()));
                }
                self.events.push_back(SessionEvent::BindResult {
                    user_id,
                    ok: true,
                    reason: String::new(),
                });
            }
            ClientEvent::Unbound { .. } => {}
            ClientEvent::Message(m) => {
                let ack_id = self.next_ack;
                self.next_ack += 1;
                let needs_ack = m.ack.is_some();
                if let Some(token) = m.ack {
                    self.acks.insert(ack_id, (self.generation, token));
                    while self.acks.len() > self.config.dedup_capacity.max(1) {
                        self.acks.pop_first();
                    }
                }
                self.events.push_back(SessionEvent::Message(Message {
                    content: m.content.to_vec(),
                    message_id: m.message_id,
                    trace_id: m.trace_id,
                    needs_ack,
                    ack_id,
                }));
            }
            ClientEvent::PushAcked { request } => {
                if let Some(p) = self.requests.remove(&request) {
                    self.settle(p.request, Ok(()));
                }
            }
            ClientEvent::PushTimedOut { request } => {
                if let Some(p) = self.requests.remove(&request) {
                    self.retry_up_push(p, "no answer from the server in time".into(), now);
                }
            }
            ClientEvent::PushRefused {
                request,
                code,
                reason,
            } => {
                if let Some(p) = self.requests.remove(&request) {
                    if code == ErrorCode::RETRY_LATER {
                        self.retry_up_push(p, reason, now);
                    } else {
                        self.settle(p.request, Err(SessionError::PushRejected(reason)));
                    }
                }
            }
            ClientEvent::Kicked { device_id, user_id } => {
                // Kicked out ourselves (as mpush's JS client reads it: user and
                // device both ours): forget the user, so that reconnecting does
                // not undo the kick by binding again. The app may bind anew.
                let ours = device_id == self.config.device.device_id
                    && self.user.as_ref().is_some_and(|(u, ..)| *u == user_id);
                if ours {
                    self.user = None;
                    self.fail_binds("kicked");
                }
                self.events
                    .push_back(SessionEvent::Kicked { device_id, user_id });
            }
            ClientEvent::Redirect(r) => {
                // A clean drain: go now (after the server's delay and jitter),
                // without counting it as a failure.
                if !r.address.is_empty() {
                    self.servers.retain(|s| *s != r.address);
                    self.servers.insert(0, r.address.clone());
                    self.next_server = 0;
                }
                let jitter = if r.jitter_ms == 0 {
                    0
                } else {
                    self.rng.next_u64() % u64::from(r.jitter_ms)
                };
                self.actions.push_back(Action::Close);
                self.drop_connection();
                self.backoff.reset();
                let delay = Duration::from_millis(u64::from(r.retry_after_ms) + jitter);
                self.wait(now, delay, format!("redirected: {}", r.reason));
            }
            ClientEvent::HttpResponse { .. } | ClientEvent::HttpTimedOut { .. } => {}
            ClientEvent::Closed { reason, reconnect } => {
                // A refused bind: report it and stop re-binding that user on
                // every reconnect (the server would refuse it again).
                if let ClientCloseReason::ServerError {
                    cmd: Command::BIND,
                    reason: why,
                    ..
                } = &reason
                    && let Some((user_id, ..)) = self.user.take()
                {
                    self.fail_binds(why);
                    self.events.push_back(SessionEvent::BindResult {
                        user_id,
                        ok: false,
                        reason: why.clone(),
                    });
                }
                // A refused transport-profile handshake is not final: the
                // classic handshake comes next (see drop_connection).
                let fall_back = self.conn_transport && !self.conn_established;
                self.actions.push_back(Action::Close);
                self.drop_connection();
                if reconnect || fall_back {
                    self.retry_later(now, reason.to_string());
                } else {
                    self.stop(reason.to_string());
                }
            }
            _ => {}
        }
    }

    pub(super) fn unix_ms(&self, now: Instant) -> i64 {
        let (base, ms) = self.clock;
        ms + i64::try_from(now.saturating_duration_since(base).as_millis()).unwrap_or(0)
    }
}
