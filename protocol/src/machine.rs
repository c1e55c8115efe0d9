//! One interface for every server-side connection machine: the binary packet
//! machine (`ServerConnection`) and mpush's JSON text form
//! (`JsonServerConnection`). A driver holds a `Box<dyn ServerMachine>` and
//! never asks which one it is.

use bytes::Bytes;
use web_time::Instant;

use crate::json_server::JsonServerConnection;
use crate::message::Redirect;
use crate::server::{Answer, OutboundPush, PushError, ServerConnection, ServerEvent};

/// What came from the socket.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// Bytes of the TCP stream, or a binary WebSocket frame.
    Bytes(&'a [u8]),
    /// A WebSocket text frame.
    Text(&'a str),
    /// A transport control frame (a WebSocket ping or pong): the peer is alive.
    Activity,
}

/// What goes to the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transmit {
    /// Everything queued, for one write.
    Bytes(Bytes),
    /// One text frame.
    Text(String),
    /// A transport liveness probe (a WebSocket ping).
    Ping,
}

/// The verbs every server connection machine speaks.
pub trait ServerMachine: Send {
    fn handle_input(&mut self, input: Input<'_>, now: Instant);
    fn handle_timeout(&mut self, now: Instant);
    fn poll_transmit(&mut self) -> Option<Transmit>;
    fn poll_event(&mut self) -> Option<ServerEvent>;
    fn poll_timeout(&self) -> Option<Instant>;
    /// Pushes waiting for their ACK.
    fn inflight(&self) -> usize;
    fn is_closed(&self) -> bool;
    fn push(&mut self, push: OutboundPush, now: Instant) -> Result<i32, PushError>;
    fn kick(&mut self, device_id: &str, user_id: &str);
    /// Asks the client to reconnect elsewhere; false when it cannot be told.
    fn redirect(&mut self, redirect: &Redirect) -> bool;
    fn close(&mut self);
    /// The answer to an event that asked for one (`Answer`).
    fn handle_answer(&mut self, answer: Answer, now: Instant);
    /// ADR 0008: the session a binding is kept under, when the client and
    /// the config keep bindings (never on the JSON form, which has none).
    fn kept_session(&self) -> Option<String> {
        None
    }
}

impl ServerMachine for ServerConnection {
    fn handle_input(&mut self, input: Input<'_>, now: Instant) {
        match input {
            Input::Bytes(b) => ServerConnection::handle_input(self, b, now),
            // Text frames belong to the JSON form; a binary connection closes.
            Input::Text(_) => ServerConnection::close(self),
            Input::Activity => {}
        }
    }
    fn handle_timeout(&mut self, now: Instant) {
        ServerConnection::handle_timeout(self, now);
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        ServerConnection::poll_transmit(self).map(Transmit::Bytes)
    }
    fn poll_event(&mut self) -> Option<ServerEvent> {
        ServerConnection::poll_event(self)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        ServerConnection::poll_timeout(self)
    }
    fn inflight(&self) -> usize {
        ServerConnection::inflight(self)
    }
    fn is_closed(&self) -> bool {
        ServerConnection::is_closed(self)
    }
    fn push(&mut self, push: OutboundPush, now: Instant) -> Result<i32, PushError> {
        ServerConnection::push(self, push, now)
    }
    fn kick(&mut self, device_id: &str, user_id: &str) {
        ServerConnection::kick(self, device_id, user_id);
    }
    fn redirect(&mut self, redirect: &Redirect) -> bool {
        ServerConnection::redirect(self, redirect)
    }
    fn close(&mut self) {
        ServerConnection::close(self);
    }
    fn handle_answer(&mut self, answer: Answer, now: Instant) {
        ServerConnection::handle_answer(self, answer, now);
    }
    fn kept_session(&self) -> Option<String> {
        ServerConnection::kept_session(self)
    }
}

impl ServerMachine for JsonServerConnection {
    fn handle_input(&mut self, input: Input<'_>, now: Instant) {
        match input {
            Input::Bytes(_) => self.handle_binary(),
            Input::Text(t) => self.handle_text(t, now),
            Input::Activity => self.handle_activity(now),
        }
    }
    fn handle_timeout(&mut self, now: Instant) {
        JsonServerConnection::handle_timeout(self, now);
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.poll_ping() {
            return Some(Transmit::Ping);
        }
        JsonServerConnection::poll_transmit(self).map(Transmit::Text)
    }
    fn poll_event(&mut self) -> Option<ServerEvent> {
        JsonServerConnection::poll_event(self)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        JsonServerConnection::poll_timeout(self)
    }
    fn inflight(&self) -> usize {
        JsonServerConnection::inflight(self)
    }
    fn is_closed(&self) -> bool {
        JsonServerConnection::is_closed(self)
    }
    fn push(&mut self, push: OutboundPush, now: Instant) -> Result<i32, PushError> {
        JsonServerConnection::push(self, push, now)
    }
    fn kick(&mut self, device_id: &str, user_id: &str) {
        JsonServerConnection::kick(self, device_id, user_id);
    }
    /// The JSON form has no redirect: its clients learn by the close.
    fn redirect(&mut self, _redirect: &Redirect) -> bool {
        false
    }
    fn close(&mut self) {
        JsonServerConnection::close(self);
    }
    fn handle_answer(&mut self, answer: Answer, _now: Instant) {
        JsonServerConnection::handle_answer(self, answer);
    }
}
