//! The app's commands (bind, unbind, ack, push, close) and how each
//! request is settled.

use super::*;

impl Session {
    // ----- app commands ----------------------------------------------------

    /// Binds (and re-binds after every reconnect) a user. Returns a
    /// request id that `Settled` names once the server accepted the bind
    /// (or refused it: `bind_failed`). Offline, it waits for the connection.
    /// A bind of another user, or an unbind, fails the open ones.
    pub fn bind(
        &mut self,
        user: &str,
        tags: &str,
        token: &str,
        now: Instant,
    ) -> Result<u64, SessionError> {
        self.alive()?;
        if user.is_empty() {
            return Err(SessionError::InvalidInput(
                "user id must not be empty".into(),
            ));
        }
        if self.user.as_ref().is_some_and(|(u, ..)| u != user) {
            self.fail_binds(&format!("replaced by a bind of {user}"));
        }
        let request = self.new_request();
        self.binds.push(request);
        self.user = Some((user.to_owned(), tags.to_owned(), token.to_owned()));
        if let Link::Connected { conn, .. } = &mut self.link
            && conn.is_established()
        {
            let _ = conn.bind(user, tags, token, now);
            self.pump(now);
        }
        Ok(request)
    }

    /// Forgets the user (no more re-binds) and tells the server. The
    /// request settles once that is sent (at once when offline: the server
    /// unbinds a closed connection by itself).
    pub fn unbind(&mut self, now: Instant) -> Result<u64, SessionError> {
        self.alive()?;
        self.fail_binds("unbound before the server answered");
        self.confirmed = None;
        let online = matches!(&self.link, Link::Connected { conn, .. } if conn.is_established());
        if let Some((user, ..)) = self.user.take() {
            if let (true, Link::Connected { conn, .. }) = (online, &mut self.link) {
                let _ = conn.unbind(&user, now);
                self.pump(now);
            } else if self.ticket.take().is_some() {
                // Offline: the server may keep the binding with the session
                // (ADR 0008) and restore it on the next fast connect. A
                // full handshake starts a session with none.
                self.events.push_back(SessionEvent::TicketUpdated {
                    ticket: String::new(),
                });
            }
        }
        let request = self.new_request();
        self.settle(request, Ok(()));
        Ok(request)
    }

    /// Acknowledges a message the app handled (BIZ mode). Offline, a v2 ACK is
    /// queued; a legacy one names a packet of a closed connection and is moot.
    pub fn ack(&mut self, ack_id: u64, now: Instant) -> Result<(), SessionError> {
        self.alive()?;
        let (generation, token) = self
            .acks
            .remove(&ack_id)
            .ok_or(SessionError::UnknownAck(ack_id))?;
        let current = generation == self.generation;
        if let Link::Connected { conn, .. } = &mut self.link
            && conn.is_established()
            && (current || token.message_id.is_some())
        {
            let _ = conn.ack(token, now);
            self.pump(now);
            return Ok(());
        }
        if token.message_id.is_some() {
            self.enqueue(Outbound::Ack(token))?;
        }
        Ok(())
    }

    /// Sends a message up; queued while offline. Returns a request id that
    /// `Settled` names: with an `ack_mode`, once the server accepted (or
    /// refused) it; without, once written. Until accepted it is kept (and
    /// sent again, with the same message id, after a reconnect); unanswered
    /// and queued up-pushes together are bounded by `outbound_capacity`.
    pub fn push(
        &mut self,
        content: &[u8],
        ack_mode: AckMode,
        now: Instant,
    ) -> Result<u64, SessionError> {
        self.alive()?;
        let held = self.outbound.len() + self.requests.len() + self.retry.len();
        if held >= self.config.outbound_capacity {
            return Err(SessionError::QueueFull(held));
        }
        let request = self.new_request();
        let item = Outbound::Push(UpPush {
            request,
            message_id: self.rng.next_u64(),
            content: Bytes::copy_from_slice(content),
            ack_mode,
            timeout: Duration::from_secs(10),
            retries: 0,
        });
        if self.is_connected() {
            self.send_outbound(item, now);
            self.pump(now);
        } else {
            self.enqueue(item)?;
        }
        Ok(request)
    }

    /// Stops for good.
    pub fn close(&mut self) {
        if matches!(self.link, Link::Stopped) {
            return;
        }
        if let Link::Connected { conn, .. } = &mut self.link {
            conn.close();
        }
        self.actions.push_back(Action::Close);
        self.stop("closed by the app".into());
    }

    // ----- internals -----------------------------------------------------

    pub(super) fn new_request(&mut self) -> u64 {
        let r = self.next_request;
        self.next_request += 1;
        r
    }

    pub(super) fn settle(&mut self, request: u64, result: Result<(), SessionError>) {
        self.events
            .push_back(SessionEvent::Settled { request, result });
    }

    /// Settles every open bind with `result`.
    pub(super) fn settle_binds(&mut self, result: Result<(), SessionError>) {
        for r in std::mem::take(&mut self.binds) {
            self.settle(r, result.clone());
        }
    }

    pub(super) fn fail_binds(&mut self, why: &str) {
        self.settle_binds(Err(SessionError::BindFailed(why.to_owned())));
    }

    pub(super) fn set_state(&mut self, state: SessionState) {
        if state != self.state {
            self.state = state.clone();
            self.events.push_back(SessionEvent::StateChanged(state));
        }
    }

    /// Stopped for good: every open request settles with `stopped`.
    pub(super) fn stop(&mut self, reason: String) {
        self.link = Link::Stopped;
        self.set_state(SessionState::Stopped {
            reason: reason.clone(),
        });
        let mut open: Vec<u64> = std::mem::take(&mut self.binds);
        open.extend(self.requests.drain().map(|(_, p)| p.request));
        open.extend(self.retry.drain(..).map(|(_, p)| p.request));
        open.extend(self.outbound.drain(..).filter_map(|o| match o {
            Outbound::Push(p) => Some(p.request),
            Outbound::Ack(_) => None,
        }));
        // Binds, then the pushes sent (in the order sent), then the queued ones.
        for r in open {
            self.settle(r, Err(SessionError::Stopped));
        }
        self.events.push_back(SessionEvent::Stopped { reason });
    }

    pub(super) fn alive(&self) -> Result<(), SessionError> {
        if matches!(self.link, Link::Stopped) {
            Err(SessionError::Stopped)
        } else {
            Ok(())
        }
    }

    pub(super) fn enqueue(&mut self, item: Outbound) -> Result<(), SessionError> {
        if self.outbound.len() >= self.config.outbound_capacity {
            return Err(SessionError::QueueFull(self.outbound.len()));
        }
        self.outbound.push_back(item);
        Ok(())
    }
}
