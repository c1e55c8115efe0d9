//! The seam between a connection and the logic layer: every call a
//! connection makes, and nothing else. The gateway is generic over it, so a
//! driver can be run over an in-memory transport against a fake logic (the
//! tests in `gateway/tests.rs`), and the logic layer's `Hub` is one
//! implementation among possible others.
//!
//! The methods return `impl Future + Send` rather than boxed futures: the
//! driver is generic over `L`, so there is no per-call allocation on the
//! write path, and a connection's task holds a call's state only while it
//! is awaited (the rarest, largest calls are boxed at the call site).

use std::future::Future;
use std::sync::Arc;

use mpush_protocol::message::{HttpRequest, HttpResponse, Redirect};
use mpush_protocol::server::OutboundPush;
use mpush_protocol::session::{KeptBinding, SessionRecord};
use tokio::sync::watch;

use crate::auth::TokenError;
use crate::logic::{Hub, Lifecycle, Outcome, Settling, UpPushOutcome, UpPushStrikes};
use crate::proxy::Caller;
use crate::route::{ConnInfo, ConnQueue, Transport};

/// What a connection asks of the logic layer.
pub trait Logic: Send + Sync + 'static {
    // ----- the node's connections -------------------------------------

    /// A connection was accepted: its id (counted until `closed`).
    fn opened(&self) -> u64;
    /// A connection counted by `opened` ended.
    fn closed(&self);
    /// Open connections on this node, bound or not.
    fn connections(&self) -> usize;
    /// Flips to true when the node drains.
    fn shutdown_signal(&self) -> watch::Receiver<bool>;
    /// Where a draining connection of `transport` is sent.
    fn redirect_for(&self, transport: Transport) -> Redirect;

    // ----- sessions and binding ---------------------------------------

    /// A full handshake's session, so its client can resume.
    fn store_session(&self, s: SessionRecord) -> impl Future<Output = ()> + Send;
    /// The session a client wants to resume (`None`: a full handshake).
    fn session(&self, session_id: &str) -> impl Future<Output = Option<SessionRecord>> + Send;
    /// A v2 resume's single-use ticket: false when it was already used.
    fn rotate_session(
        &self,
        replaces: Option<String>,
        next: Option<SessionRecord>,
    ) -> impl Future<Output = bool> + Send;
    /// Authorises and registers a bind; the user, shared, and what a
    /// session keeps of it (ADR 0008).
    fn bind(
        &self,
        info: &Arc<ConnInfo>,
        tx: &Arc<ConnQueue>,
        user_id: &str,
        tags: String,
        token: &str,
        previous: Option<&Arc<str>>,
    ) -> impl Future<Output = Result<(Arc<str>, KeptBinding), TokenError>> + Send;
    /// ADR 0008: binds a resumed connection as its session kept it; the
    /// user when bound everywhere (`None`: nothing bound).
    fn restore(
        &self,
        info: &Arc<ConnInfo>,
        tx: &Arc<ConnQueue>,
        binding: &KeptBinding,
    ) -> impl Future<Output = Option<Arc<str>>> + Send;
    /// ADR 0008: keeps a binding with a session (`None` clears it).
    fn keep_binding(
        &self,
        session_id: String,
        binding: Option<KeptBinding>,
    ) -> impl Future<Output = ()> + Send;
    fn unbind(&self, user: &str, info: &ConnInfo) -> impl Future<Output = bool> + Send;
    /// What is kept for a user who just bound here, in order.
    fn replay_inbox(
        &self,
        user: &Arc<str>,
        info: &ConnInfo,
    ) -> impl Future<Output = Vec<OutboundPush>> + Send;

    // ----- what became of pushes --------------------------------------

    /// Settles an outcome; the inbox work it leaves, if any, to await.
    fn settle<'a>(
        &'a self,
        user: &'a Arc<str>,
        info: &'a ConnInfo,
        outcome: Outcome<'a>,
    ) -> Option<Settling<'a>>;

    // ----- upstream ---------------------------------------------------

    /// A client's up-push, and whether the connection must close for abuse.
    fn up_push(
        &self,
        user: Option<&Arc<str>>,
        info: &ConnInfo,
        content: &[u8],
        message_id: Option<u64>,
        strikes: &mut UpPushStrikes,
    ) -> impl Future<Output = UpPushOutcome> + Send;
    /// Some sink takes lifecycle events (so the caller builds them).
    fn wants_lifecycle(&self) -> bool;
    fn lifecycle(&self, kind: Lifecycle, user: &str, info: &ConnInfo, reason: Option<&str>);

    // ----- mpush's HTTP proxy -----------------------------------------

    /// Requests one connection may have in flight through the proxy.
    fn http_proxy_per_conn(&self) -> usize;
    /// Forwards a client's HTTP_PROXY request; the response for the client,
    /// whatever happened. Owned (`'static`): the connection runs it on a
    /// task of its own and goes on serving meanwhile.
    fn http_proxy(
        &self,
        caller: Caller,
        request: HttpRequest,
    ) -> impl Future<Output = HttpResponse> + Send + 'static;
}

impl Logic for Hub {
    fn opened(&self) -> u64 {
        self.node().opened()
    }

    fn closed(&self) {
        self.node().closed();
    }

    fn connections(&self) -> usize {
        self.node().connections()
    }

    fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.node().shutdown_signal()
    }

    fn redirect_for(&self, transport: Transport) -> Redirect {
        self.node().redirect_for(transport)
    }

    fn store_session(&self, s: SessionRecord) -> impl Future<Output = ()> + Send {
        self.sessions().store(s)
    }

    fn session(&self, session_id: &str) -> impl Future<Output = Option<SessionRecord>> + Send {
        self.sessions().get(session_id)
    }

    fn rotate_session(
        &self,
        replaces: Option<String>,
        next: Option<SessionRecord>,
    ) -> impl Future<Output = bool> + Send {
        self.sessions().rotate(replaces, next)
    }

    fn bind(
        &self,
        info: &Arc<ConnInfo>,
        tx: &Arc<ConnQueue>,
        user_id: &str,
        tags: String,
        token: &str,
        previous: Option<&Arc<str>>,
    ) -> impl Future<Output = Result<(Arc<str>, KeptBinding), TokenError>> + Send {
        self.sessions()
            .bind(info, tx, user_id, tags, token, previous)
    }

    fn restore(
        &self,
        info: &Arc<ConnInfo>,
        tx: &Arc<ConnQueue>,
        binding: &KeptBinding,
    ) -> impl Future<Output = Option<Arc<str>>> + Send {
        self.sessions().restore(info, tx, binding)
    }

    fn keep_binding(
        &self,
        session_id: String,
        binding: Option<KeptBinding>,
    ) -> impl Future<Output = ()> + Send {
        self.sessions().keep_binding(session_id, binding)
    }

    fn unbind(&self, user: &str, info: &ConnInfo) -> impl Future<Output = bool> + Send {
        self.sessions().unbind(user, info)
    }

    fn replay_inbox(
        &self,
        user: &Arc<str>,
        info: &ConnInfo,
    ) -> impl Future<Output = Vec<OutboundPush>> + Send {
        self.delivery().replay_inbox(user, info)
    }

    fn settle<'a>(
        &'a self,
        user: &'a Arc<str>,
        info: &'a ConnInfo,
        outcome: Outcome<'a>,
    ) -> Option<Settling<'a>> {
        self.delivery().settle(user, info, outcome)
    }

    fn up_push(
        &self,
        user: Option<&Arc<str>>,
        info: &ConnInfo,
        content: &[u8],
        message_id: Option<u64>,
        strikes: &mut UpPushStrikes,
    ) -> impl Future<Output = UpPushOutcome> + Send {
        self.upstream()
            .up_push(user, info, content, message_id, strikes)
    }

    fn wants_lifecycle(&self) -> bool {
        self.upstream().wants_lifecycle()
    }

    fn lifecycle(&self, kind: Lifecycle, user: &str, info: &ConnInfo, reason: Option<&str>) {
        self.upstream().lifecycle(kind, user, info, reason);
    }

    fn http_proxy_per_conn(&self) -> usize {
        self.upstream().proxy().map_or(0, |p| p.per_conn())
    }

    fn http_proxy(
        &self,
        caller: Caller,
        request: HttpRequest,
    ) -> impl Future<Output = HttpResponse> + Send + 'static {
        let proxy = self.upstream().proxy().cloned();
        async move {
            match proxy {
                Some(p) => p.forward(caller, request).await,
                // The machine refuses HTTP_PROXY when the proxy is off.
                None => crate::proxy::refusal(501, "the HTTP proxy is off"),
            }
        }
    }
}
