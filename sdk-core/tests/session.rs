//! Session tests on a scripted in-memory network and a fake clock: the server
//! side is a real `ServerConnection`, the network is a set of addresses that
//! are up or down, and time only moves when the test says.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mpush_protocol::Instant;
use mpush_protocol::crypto::RsaPrivate;
use mpush_protocol::message::Redirect;
use mpush_protocol::server::{
    Answer, BindRefusal, OutboundPush, ServerConfig, ServerConnection, ServerEvent, UpPushRefusal,
};
use mpush_protocol::session::{AckMode, KeptBinding, SessionRecord};
use mpush_protocol::testing::{default_key, test_device};
use mpush_sdk_core::{Action, Session, SessionConfig, SessionError, SessionEvent, SessionState};

struct Net {
    now: Instant,
    session: Session,
    up: HashSet<String>,
    server: Option<(String, ServerConnection)>,
    store: HashMap<String, SessionRecord>,
    sconf: Arc<ServerConfig>,
    events: Vec<SessionEvent>,
    server_events: Vec<ServerEvent>,
    opened: Vec<String>,
    /// The server keeps bindings (ADR 0008) and rotates tickets in `store`.
    keep: bool,
}

impl Net {
    fn new(servers: &[&str], v2: bool) -> Self {
        Self::with(servers, v2, |_| {})
    }

    fn with(servers: &[&str], v2: bool, tune: impl FnOnce(&mut SessionConfig)) -> Self {
        let key: Arc<RsaPrivate> = default_key();
        let mut cfg = SessionConfig::new(
            servers.iter().map(|s| s.to_string()).collect(),
            Arc::new(key.public()),
            test_device(),
        );
        cfg.offer_v2 = v2;
        tune(&mut cfg);
        let now = Instant::now();
        let session = Session::new(cfg, None, [7; 32], now, 1_700_000_000_000);
        let mut n = Self {
            now,
            session,
            up: servers.iter().map(|s| s.to_string()).collect(),
            server: None,
            store: HashMap::new(),
            sconf: Arc::new(ServerConfig::new(key)),
            events: Vec::new(),
            server_events: Vec::new(),
            opened: Vec::new(),
            keep: false,
        };
        n.pump();
        n
    }

    /// A v2 session against a server that keeps bindings (ADR 0008).
    fn keeping() -> Self {
        let key: Arc<RsaPrivate> = default_key();
        let mut sc = ServerConfig::new(key);
        sc.keep_binding = true;
        let mut n = Self::new(&[], true);
        n.up.insert("a:1".into());
        n.sconf = Arc::new(sc);
        n.keep = true;
        n.session = Session::new(
            {
                let mut c = SessionConfig::new(
                    vec!["a:1".into()],
                    Arc::new(default_key().public()),
                    test_device(),
                );
                c.offer_v2 = true;
                c
            },
            None,
            [7; 32],
            n.now,
            1_700_000_000_000,
        );
        n.pump();
        n
    }

    /// ADR 0008's driver side: what the server keeps with the session.
    fn keep_binding(&mut self, id: Option<String>, binding: Option<KeptBinding>) {
        if let Some(r) = id.and_then(|id| self.store.get_mut(&id)) {
            r.binding = binding;
        }
    }

    fn pump(&mut self) {
        for _ in 0..1000 {
            let mut busy = false;
            while let Some(a) = self.session.poll_action() {
                busy = true;
                match a {
                    Action::Open { address } => {
                        self.opened.push(address.clone());
                        if self.up.contains(&address) {
                            let s = ServerConnection::new(
                                self.sconf.clone(),
                                [9; 32],
                                self.now,
                                1_700_000_000_000,
                            );
                            self.server = Some((address, s));
                            self.session.handle_opened(self.now);
                        } else {
                            self.session
                                .handle_open_failed("connection refused", self.now);
                        }
                    }
                    Action::Send(b) => {
                        if let Some((_, s)) = &mut self.server {
                            s.handle_input(&b, self.now);
                        }
                    }
                    Action::Close => self.server = None,
                    Action::FetchServers { .. } => {}
                }
            }
            if let Some((_, s)) = &mut self.server {
                while let Some(b) = s.poll_transmit() {
                    busy = true;
                    self.session.handle_input(&b, self.now);
                }
            }
            let mut evs = Vec::new();
            if let Some((_, s)) = &mut self.server {
                while let Some(e) = s.poll_event() {
                    evs.push(e);
                }
            }
            for e in evs {
                busy = true;
                self.serve(&e);
                self.server_events.push(e);
            }
            while let Some(e) = self.session.poll_event() {
                busy = true;
                self.events.push(e);
            }
            if !busy {
                return;
            }
        }
        panic!("network never settled");
    }

    fn serve(&mut self, e: &ServerEvent) {
        let now = self.now;
        if self.keep {
            let kept = self.server.as_ref().and_then(|(_, s)| s.kept_session());
            match e {
                ServerEvent::Resumed {
                    session, replaces, ..
                } => {
                    if let Some(old) = replaces {
                        self.store.remove(old);
                    }
                    if let Some(r) = session {
                        self.store.insert(r.session_id.clone(), r.clone());
                    }
                }
                ServerEvent::BindRequested { user_id, tags, .. } => {
                    let b = KeptBinding {
                        user_id: user_id.clone(),
                        tags: tags.clone(),
                        expires_at_ms: 0,
                    };
                    self.keep_binding(kept, Some(b));
                }
                ServerEvent::UnbindRequested { .. } => self.keep_binding(kept, None),
                ServerEvent::ForgetBinding { session_id } => {
                    self.keep_binding(Some(session_id.clone()), None);
                }
                ServerEvent::RestoreRequested { .. } => {
                    if let Some((_, s)) = &mut self.server {
                        s.handle_answer(Answer::Restored(true), now);
                    }
                }
                _ => {}
            }
        }
        let Some((_, s)) = &mut self.server else {
            return;
        };
        match e {
            ServerEvent::HandshakeCompleted {
                session: Some(r), ..
            } => {
                self.store.insert(r.session_id.clone(), r.clone());
            }
            ServerEvent::ResumeRequested { session_id, .. } => {
                s.handle_answer(Answer::Session(self.store.get(session_id).cloned()), now);
            }
            ServerEvent::BindRequested {
                request, user_id, ..
            } => {
                let result = if user_id.starts_with("refused") {
                    Err(BindRefusal::Unauthorized("user not allowed".to_owned()))
                } else {
                    Ok(())
                };
                let answer = Answer::Bind {
                    request: *request,
                    user_id: user_id.clone(),
                    result,
                };
                s.handle_answer(answer, now);
            }
            ServerEvent::UpPush { content, reply, .. } => {
                let result = if content.starts_with(b"busy") {
                    Err(UpPushRefusal::RetryLater("sinks full".into()))
                } else if content.starts_with(b"hold") {
                    // No answer (a server that lost it, or died).
                    return;
                } else {
                    Ok(())
                };
                let answer = Answer::UpPush {
                    reply: *reply,
                    result,
                };
                s.handle_answer(answer, now);
            }
            _ => {}
        }
    }

    /// Moves the clock through every deadline up to `d` from now.
    fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        loop {
            let next = [
                self.session.poll_timeout(),
                self.server.as_ref().and_then(|(_, s)| s.poll_timeout()),
            ]
            .into_iter()
            .flatten()
            .min()
            .filter(|t| *t <= end);
            let Some(t) = next else { break };
            self.now = self.now.max(t);
            self.session.handle_timeout(self.now);
            if let Some((_, s)) = &mut self.server {
                s.handle_timeout(self.now);
            }
            self.pump();
        }
        self.now = end;
    }

    fn cut(&mut self) {
        self.server = None;
        self.session.handle_closed("connection reset", self.now);
        self.pump();
    }

    fn connected(&self) -> Vec<(String, bool)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                SessionEvent::Connected {
                    address, resumed, ..
                } => Some((address.clone(), *resumed)),
                _ => None,
            })
            .collect()
    }

    fn count(&self, f: impl Fn(&SessionEvent) -> bool) -> usize {
        self.events.iter().filter(|e| f(e)).count()
    }

    fn server_push(&mut self, id: u64, mode: AckMode) {
        let now = self.now;
        let (_, s) = self.server.as_mut().expect("connected");
        s.push(
            OutboundPush {
                message_id: id,
                trace_id: "t".into(),
                content: Bytes::from(format!("msg {id}")),
                ack_mode: mode,
                expires_at_ms: 0,
                ack_timeout: None,
                queued_at: None,
            },
            now,
        )
        .expect("pushed");
        self.pump();
    }
}

#[test]
fn backoff_grows_with_jitter_and_resets_when_the_network_is_back() {
    let mut n = Net::new(&["a:1", "b:2"], true);
    // Both servers were up at start; take them down and drop the link.
    n.up.clear();
    n.cut();
    n.advance(Duration::from_secs(200));
    let delays: Vec<u64> = n
        .events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Disconnected { retry_in_ms, .. } => Some(*retry_in_ms),
            _ => None,
        })
        .collect();
    let want = [1000u64, 2000, 4000, 8000, 16000, 32000, 60000];
    for (got, want) in delays.iter().zip(want) {
        let (lo, hi) = (want * 8 / 10, want * 12 / 10);
        assert!(
            (lo..=hi).contains(got),
            "{got} ms not within 20% of {want}: {delays:?}"
        );
    }
    assert!(delays.len() >= want.len());
    // Each round tries every server in order.
    assert!(n.opened.windows(2).any(|w| w == ["a:1", "b:2"]));
    // The network is back: reconnect now, not in 60 s.
    n.up.insert("b:2".into());
    let before = n.connected().len();
    n.session.network_available(n.now);
    n.pump();
    assert_eq!(n.connected().len(), before + 1, "connected at once");
    assert_eq!(n.connected().last().map(|c| c.0.as_str()), Some("b:2"));
}

/// ADR 0008: a resume that comes back bound to the user the app still
/// wants sends no BIND and still settles the app's bind; another user, or
/// an unbind made offline, is not left to the kept binding.
#[test]
fn a_resume_that_kept_the_binding_sends_no_bind() {
    let mut n = Net::keeping();
    let binds = |n: &Net| {
        n.server_events
            .iter()
            .filter(|e| matches!(e, ServerEvent::BindRequested { .. }))
            .count()
    };
    let restores = |n: &Net| {
        n.server_events
            .iter()
            .filter(|e| matches!(e, ServerEvent::RestoreRequested { .. }))
            .count()
    };
    let ok = |n: &Net, user: &str| {
        n.count(
            |e| matches!(e, SessionEvent::BindResult { ok: true, user_id, .. } if user_id == user),
        )
    };
    let now = n.now;
    let first = n.session.bind("u1", "t", "", now).expect("bind");
    n.pump();
    assert_eq!((binds(&n), ok(&n, "u1")), (1, 1));
    assert_eq!(settled(&n, first), vec![Ok(())]);
    for round in 0..2 {
        n.cut();
        n.advance(Duration::from_secs(3));
        assert_eq!(n.connected().last(), Some(&("a:1".to_string(), true)));
        assert_eq!(restores(&n), round + 1, "restored (round {round})");
        assert_eq!(binds(&n), 1, "no BIND after the resume (round {round})");
        assert_eq!(ok(&n, "u1"), round + 2, "the app hears it is bound");
    }
    // Another user asked for while offline: the resume restores u1, the
    // SDK binds u2 (the server replaces u1).
    n.cut();
    let now = n.now;
    let second = n.session.bind("u2", "", "", now).expect("bind");
    n.advance(Duration::from_secs(3));
    assert_eq!(binds(&n), 2);
    assert_eq!(settled(&n, second), vec![Ok(())]);
    // An unbind made offline drops the ticket: a full handshake, a session
    // with nothing kept.
    n.cut();
    let now = n.now;
    n.session.unbind(now).expect("unbind");
    n.pump();
    assert!(
        n.events
            .iter()
            .any(|e| matches!(e, SessionEvent::TicketUpdated { ticket } if ticket.is_empty()))
    );
    let before = restores(&n);
    n.advance(Duration::from_secs(3));
    assert_eq!(n.connected().last(), Some(&("a:1".to_string(), false)));
    assert_eq!(restores(&n), before);
}

#[test]
fn reconnects_with_fast_connect_and_rebinds() {
    for v2 in [false, true] {
        let mut n = Net::new(&["a:1"], v2);
        assert_eq!(n.connected(), vec![("a:1".to_string(), false)]);
        assert_eq!(
            n.count(|e| matches!(e, SessionEvent::TicketUpdated { ticket } if !ticket.is_empty())),
            1
        );
        let now = n.now;
        n.session.bind("u1", "t", "", now).expect("bind");
        n.pump();
        assert_eq!(
            n.count(|e| matches!(e, SessionEvent::BindResult { ok: true, .. })),
            1
        );
        n.cut();
        n.advance(Duration::from_secs(2));
        assert_eq!(
            n.connected().last(),
            Some(&("a:1".to_string(), true)),
            "fast connect (v2={v2})"
        );
        assert_eq!(
            n.count(|e| matches!(e, SessionEvent::BindResult { ok: true, .. })),
            2,
            "re-bound by itself"
        );
        // The server forgot the session: fall back to a full handshake, new ticket.
        n.store.clear();
        n.cut();
        n.advance(Duration::from_secs(3));
        assert_eq!(n.connected().last(), Some(&("a:1".to_string(), false)));
        assert!(
            n.events
                .iter()
                .any(|e| matches!(e, SessionEvent::TicketUpdated { ticket } if ticket.is_empty()))
        );
        assert_eq!(
            n.count(|e| matches!(e, SessionEvent::BindResult { ok: true, .. })),
            3
        );
    }
}

#[test]
fn offline_pushes_and_acks_are_queued_and_flushed_in_order() {
    let mut n = Net::new(&["a:1"], true);
    let now = n.now;
    n.session.bind("u1", "", "", now).expect("bind");
    n.pump();
    n.server_push(5, AckMode::Biz);
    let ack_id = n
        .events
        .iter()
        .find_map(|e| match e {
            SessionEvent::Message(m) if m.needs_ack => Some(m.ack_id),
            _ => None,
        })
        .expect("biz message");
    n.up.clear();
    n.cut();
    let now = n.now;
    let r1 = n
        .session
        .push(b"first", AckMode::Auto, now)
        .expect("queued");
    let r2 = n
        .session
        .push(b"second", AckMode::None, now)
        .expect("queued");
    n.session.ack(ack_id, now).expect("queued ack");
    n.up.insert("a:1".into());
    n.advance(Duration::from_secs(2));
    let ups: Vec<Vec<u8>> = n
        .server_events
        .iter()
        .filter_map(|e| match e {
            ServerEvent::UpPush { content, .. } => Some(content.to_vec()),
            _ => None,
        })
        .collect();
    assert_eq!(ups, vec![b"first".to_vec(), b"second".to_vec()]);
    assert!(n.events.contains(&SessionEvent::Settled {
        request: r1,
        result: Ok(())
    }));
    assert_ne!(r1, r2);
    assert_eq!(
        n.count(|e| matches!(e, SessionEvent::Settled { result: Err(_), .. })),
        0
    );
    // The new server had lost message 5's ACK and sends it again: the app
    // does not see it twice, and the session confirms it by itself.
    n.server_push(5, AckMode::Biz);
    assert_eq!(n.count(|e| matches!(e, SessionEvent::Message(_))), 1);
    assert!(
        n.server_events
            .iter()
            .any(|e| matches!(e, ServerEvent::Acked { push } if push.message_id == 5))
    );
}

#[test]
fn a_refused_up_push_fails_retryable_and_the_connection_stays() {
    let mut n = Net::new(&["a:1"], true);
    let now = n.now;
    n.session.bind("u1", "", "", now).expect("bind");
    n.pump();
    let r = n
        .session
        .push(b"busy now", AckMode::Auto, now)
        .expect("sent");
    n.pump();
    // "Retry later": sent again with its message id, waiting 1, 2, 4, 8 s,
    // then failed (retryable) for the app to decide.
    n.advance(Duration::from_secs(20));
    let error = n
        .events
        .iter()
        .find_map(|e| match e {
            SessionEvent::Settled {
                request,
                result: Err(error),
            } if *request == r => Some(error.clone()),
            _ => None,
        })
        .expect("refused");
    assert_eq!(error, SessionError::RetryLater("sinks full".into()));
    assert!(error.retryable());
    assert_eq!(error.code(), "retry_later");
    let ids = up_ids(&n);
    assert_eq!(ids.len(), 5, "the first send and four more: {ids:?}");
    assert!(
        ids.iter().all(|id| id.is_some() && *id == ids[0]),
        "one message id for every send (the backend's event id): {ids:?}"
    );
    let now = n.now;
    let r2 = n.session.push(b"fine", AckMode::Auto, now).expect("sent");
    n.pump();
    n.advance(Duration::from_secs(1));
    assert!(n.events.contains(&SessionEvent::Settled {
        request: r2,
        result: Ok(())
    }));
    assert_eq!(
        n.count(|e| matches!(e, SessionEvent::Connected { .. })),
        1,
        "no reconnect"
    );
}

#[test]
fn an_unanswered_up_push_is_sent_again_after_a_reconnect_with_its_id() {
    let mut n = Net::new(&["a:1"], true);
    let now = n.now;
    n.session.bind("u1", "", "", now).expect("bind");
    n.pump();
    let r = n
        .session
        .push(b"hold me", AckMode::Auto, now)
        .expect("sent");
    n.pump();
    n.advance(Duration::from_millis(200));
    let first: Vec<Option<u64>> = up_ids(&n);
    assert_eq!(first.len(), 1);
    // The link drops before the server answered: not failed, kept.
    n.cut();
    n.server_events.clear();
    n.up.insert("a:1".into());
    n.advance(Duration::from_secs(3));
    assert_eq!(
        n.count(|e| matches!(e, SessionEvent::Settled { result: Err(_), .. })),
        0
    );
    assert_eq!(up_ids(&n), first, "sent again with the same message id");
    assert!(!n.events.contains(&SessionEvent::Settled {
        request: r,
        result: Ok(())
    }));
}

fn up_ids(n: &Net) -> Vec<Option<u64>> {
    n.server_events
        .iter()
        .filter_map(|e| match e {
            ServerEvent::UpPush { message_id, .. } => Some(*message_id),
            _ => None,
        })
        .collect()
}

#[test]
fn the_queue_is_bounded_and_full_is_reported() {
    let mut n = Net::new(&["a:1"], true);
    n.up.clear();
    n.cut();
    let now = n.now;
    for _ in 0..256 {
        n.session.push(b"x", AckMode::None, now).expect("room");
    }
    assert_eq!(
        n.session.push(b"x", AckMode::None, now),
        Err(mpush_sdk_core::SessionError::QueueFull(256))
    );
}

#[test]
fn messages_are_deduplicated_across_reconnects() {
    let mut n = Net::new(&["a:1"], true);
    let now = n.now;
    n.session.bind("u1", "", "", now).expect("bind");
    n.pump();
    n.server_push(7, AckMode::Auto);
    n.cut();
    n.advance(Duration::from_secs(2));
    assert!(n.session.is_connected());
    // The server did not get the ACK before the cut; it sends message 7 again.
    n.server_push(7, AckMode::Auto);
    n.server_push(8, AckMode::Auto);
    let got: Vec<Option<u64>> = n
        .events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Message(m) => Some(m.message_id),
            _ => None,
        })
        .collect();
    assert_eq!(got, vec![Some(7), Some(8)], "7 is shown once");
    assert!(
        n.server_events
            .iter()
            .any(|e| matches!(e, ServerEvent::Acked { push } if push.message_id == 7)),
        "the repeat is re-acked"
    );
}

#[test]
fn kick_and_redirect() {
    let mut n = Net::new(&["a:1"], true);
    let now = n.now;
    n.session.bind("u1", "", "", now).expect("bind");
    n.pump();
    n.server
        .as_mut()
        .expect("conn")
        .1
        .kick("other-device", "u1");
    n.pump();
    assert!(n.events.iter().any(
        |e| matches!(e, SessionEvent::Kicked { device_id, .. } if device_id == "other-device")
    ));
    n.up.insert("c:3".into());
    let r = Redirect {
        address: "c:3".into(),
        retry_after_ms: 100,
        jitter_ms: 200,
        reason: "drain".into(),
    };
    assert!(n.server.as_mut().expect("conn").1.redirect(&r));
    n.pump();
    let retry = n.events.iter().rev().find_map(|e| match e {
        SessionEvent::Disconnected { retry_in_ms, .. } => Some(*retry_in_ms),
        _ => None,
    });
    let retry = retry.expect("disconnected for the redirect");
    assert!((100..300).contains(&retry), "{retry}");
    n.advance(Duration::from_millis(400));
    assert_eq!(n.connected().last().map(|c| c.0.as_str()), Some("c:3"));
    assert_eq!(
        n.count(|e| matches!(e, SessionEvent::BindResult { ok: true, .. })),
        2
    );
}

#[test]
fn close_stops_for_good() {
    let mut n = Net::new(&["a:1"], false);
    n.session.close();
    n.pump();
    assert!(
        n.events
            .iter()
            .any(|e| matches!(e, SessionEvent::Stopped { .. }))
    );
    n.advance(Duration::from_secs(120));
    assert_eq!(n.connected().len(), 1, "no reconnect after close");
    let now = n.now;
    assert!(n.session.push(b"x", AckMode::None, now).is_err());
}

#[test]
fn a_refused_bind_is_reported_once_and_not_retried_on_every_reconnect() {
    let mut n = Net::new(&["a"], true);
    let now = n.now;
    n.session.bind("refused-1", "", "", now).expect("bind");
    n.pump();
    let refused = n.count(|e| {
        matches!(e, SessionEvent::BindResult { user_id, ok: false, reason } if user_id == "refused-1" && !reason.is_empty())
    });
    assert_eq!(refused, 1, "{:?}", n.events);
    // The session reconnects (the server closed on the error) without re-binding.
    n.advance(Duration::from_secs(5));
    assert!(n.session.is_connected());
    let asked = n
        .server_events
        .iter()
        .filter(
            |e| matches!(e, ServerEvent::BindRequested { user_id, .. } if user_id == "refused-1"),
        )
        .count();
    assert_eq!(asked, 1, "the refused user is not bound again");
    // Another user binds fine on the same session.
    let now = n.now;
    n.session.bind("u2", "", "", now).expect("bind");
    n.pump();
    assert_eq!(
        n.count(
            |e| matches!(e, SessionEvent::BindResult { user_id, ok: true, .. } if user_id == "u2")
        ),
        1
    );
}

#[test]
fn a_kick_of_this_device_is_not_undone_by_the_next_reconnect() {
    let mut n = Net::new(&["a"], true);
    let now = n.now;
    n.session.bind("u1", "", "", now).expect("bind");
    n.pump();
    let me = test_device().device_id;
    n.server.as_mut().expect("conn").1.kick(&me, "u1");
    n.pump();
    assert_eq!(
        n.count(|e| matches!(e, SessionEvent::Kicked { user_id, .. } if user_id == "u1")),
        1
    );
    // The server closes after an API kick; the session reconnects but does not re-bind.
    n.cut();
    n.advance(Duration::from_secs(5));
    assert!(n.session.is_connected());
    let binds = n
        .server_events
        .iter()
        .filter(|e| matches!(e, ServerEvent::BindRequested { .. }))
        .count();
    assert_eq!(binds, 1, "bound once, before the kick");
}

#[test]
fn unacknowledged_biz_messages_do_not_pile_up() {
    let mut n = Net::new(&["a:1"], true);
    let now = n.now;
    n.session.bind("u1", "", "", now).expect("bind");
    n.pump();
    // In batches, with a reconnect after each (a server caps in-flight pushes
    // per connection; v2 ACK handles outlive their connection).
    for batch in 0..11 {
        for id in 1..=100 {
            n.server_push(batch * 100 + id, AckMode::Biz);
        }
        n.cut();
        n.advance(Duration::from_secs(5));
        assert!(n.session.is_connected());
    }
    let ack_ids: Vec<u64> = n
        .events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Message(m) if m.needs_ack => Some(m.ack_id),
            _ => None,
        })
        .collect();
    assert_eq!(ack_ids.len(), 1100);
    let now = n.now;
    // The oldest handles were let go (default capacity 1024); the newest work.
    assert_eq!(
        n.session.ack(ack_ids[0], now),
        Err(SessionError::UnknownAck(ack_ids[0]))
    );
    assert_eq!(n.session.ack(ack_ids[1099], now), Ok(()));
}

#[test]
fn reconnects_wait_while_the_network_is_down_or_the_app_is_in_the_background() {
    let mut n = Net::new(&["a:1"], true);
    assert!(n.session.is_connected());
    n.session.network_lost();
    n.cut();
    let opened = n.opened.len();
    n.advance(Duration::from_secs(600));
    assert_eq!(
        n.opened.len(),
        opened,
        "no attempts while the network is down"
    );
    assert!(n.session.poll_timeout().is_none());
    // Foreground alone does not help: the network is still down.
    let now = n.now;
    n.session.background();
    n.session.foreground(now);
    n.pump();
    assert_eq!(n.opened.len(), opened);
    // The network is back, but the app went to the background meanwhile.
    n.session.background();
    n.session.network_available(now);
    n.pump();
    n.advance(Duration::from_secs(600));
    assert_eq!(n.opened.len(), opened, "no attempts in the background");
    // Foreground: at once, without waiting for the backoff.
    let now = n.now;
    n.session.foreground(now);
    n.pump();
    assert_eq!(n.opened.len(), opened + 1);
    assert!(n.session.is_connected());
}

/// The one (error, code) table every SDK checks: `sdk-core/testdata/error-codes.json`.
#[test]
fn every_session_error_has_the_code_of_the_shared_table() {
    let table: serde_json::Value =
        serde_json::from_str(include_str!("../testdata/error-codes.json"))
            .expect("error-codes.json");
    let rows = table["errors"].as_array().expect("errors");
    let all = SessionError::every_kind();
    assert_eq!(rows.len(), all.len(), "one row per kind");
    for (row, e) in rows.iter().zip(&all) {
        let kind = format!("{e:?}");
        assert!(
            kind.starts_with(row["kind"].as_str().unwrap_or("?")),
            "{kind} vs {row}"
        );
        assert_eq!(e.code(), row["code"], "{kind}");
        assert_eq!(e.retryable(), row["retryable"], "{kind}");
    }
}

fn settled(n: &Net, request: u64) -> Vec<Result<(), SessionError>> {
    n.events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Settled { request: r, result } if *r == request => Some(result.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_bind_settles_once_when_the_server_answers_even_if_made_offline() {
    let mut n = Net::new(&["a:1"], true);
    n.up.clear();
    n.session.handle_closed("gone", n.now);
    n.pump();
    let now = n.now;
    let r = n.session.bind("ann", "", "", now).expect("bind");
    n.pump();
    assert!(settled(&n, r).is_empty(), "not before the server said so");
    n.up.insert("a:1".into());
    n.advance(Duration::from_secs(120));
    assert_eq!(settled(&n, r), vec![Ok(())]);
    // A reconnect re-binds, but the request stays settled once.
    n.session.handle_closed("dropped", n.now);
    n.advance(Duration::from_secs(120));
    assert_eq!(settled(&n, r), vec![Ok(())]);
}

#[test]
fn binds_fail_when_refused_replaced_unbound_or_closed() {
    let mut n = Net::new(&["a:1"], true);
    let now = n.now;
    let refused = n.session.bind("refused-1", "", "", now).expect("bind");
    n.pump();
    assert!(matches!(
        settled(&n, refused).as_slice(),
        [Err(SessionError::BindFailed(why))] if !why.is_empty()
    ));
    n.advance(Duration::from_secs(120));

    // A bind of another user replaces a pending one; an unbind fails it.
    n.up.clear();
    n.session.handle_closed("gone", n.now);
    n.pump();
    let now = n.now;
    let first = n.session.bind("ann", "", "", now).expect("bind");
    let again = n.session.bind("ann", "", "", now).expect("bind");
    let other = n.session.bind("bob", "", "", now).expect("bind");
    n.pump();
    assert!(matches!(
        settled(&n, first).as_slice(),
        [Err(SessionError::BindFailed(_))]
    ));
    assert!(matches!(
        settled(&n, again).as_slice(),
        [Err(SessionError::BindFailed(_))]
    ));
    assert!(settled(&n, other).is_empty());
    let unbind = n.session.unbind(now).expect("unbind");
    n.pump();
    assert!(matches!(
        settled(&n, other).as_slice(),
        [Err(SessionError::BindFailed(_))]
    ));
    assert_eq!(settled(&n, unbind), vec![Ok(())], "offline: at once");

    // Closing settles every open request with `stopped`, once.
    let pending_bind = n.session.bind("cat", "", "", now).expect("bind");
    let pending_push = n.session.push(b"x", AckMode::Auto, now).expect("push");
    n.session.close();
    n.pump();
    assert_eq!(settled(&n, pending_bind), vec![Err(SessionError::Stopped)]);
    assert_eq!(settled(&n, pending_push), vec![Err(SessionError::Stopped)]);
    assert_eq!(
        n.session.bind("dan", "", "", now),
        Err(SessionError::Stopped)
    );
    assert!(matches!(
        n.session.bind("", "", "", now),
        Err(SessionError::Stopped | SessionError::InvalidInput(_))
    ));
}

#[test]
fn the_state_is_queryable_and_every_change_is_an_event_before_its_detail() {
    let mut n = Net::new(&["a:1"], true);
    assert_eq!(n.session.state().name(), "connected");
    let states: Vec<&'static str> = n
        .events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::StateChanged(s) => Some(s.name()),
            _ => None,
        })
        .collect();
    assert_eq!(states.last(), Some(&"connected"), "{states:?}");
    assert!(states.contains(&"connecting"));
    // `StateChanged` comes right before the event it sums up.
    let i = n
        .events
        .iter()
        .position(|e| matches!(e, SessionEvent::Connected { .. }))
        .expect("connected");
    assert!(matches!(
        &n.events[i - 1],
        SessionEvent::StateChanged(SessionState::Connected { address, .. }) if address == "a:1"
    ));
    n.session.handle_closed("dropped", n.now);
    n.pump();
    assert!(matches!(
        n.session.state(),
        SessionState::Disconnected { reason, .. } | SessionState::Connecting { address: reason } if !reason.is_empty()
    ));
    n.session.close();
    n.pump();
    assert_eq!(n.session.state().name(), "closed");
}

/// ADR 0005: a server that will not take the transport-secured profile (here:
/// its connection is not marked TLS, as an older server would behave) costs
/// one attempt; the session then uses the classic handshake for good.
#[test]
fn a_refused_transport_profile_falls_back_to_the_classic_handshake() {
    let mut n = Net::with(&["tls://a:1"], true, |c| c.transport_profile = true);
    n.advance(Duration::from_secs(30));
    assert!(n.session.is_connected(), "{:?}", n.events);
    assert!(
        n.opened.len() >= 2,
        "a refused attempt, then the classic one"
    );
    let ticket = n.events.iter().rev().find_map(|e| match e {
        SessionEvent::TicketUpdated { ticket } if !ticket.is_empty() => Some(ticket.clone()),
        _ => None,
    });
    assert!(
        ticket.is_some_and(|t| t.starts_with("v2,")),
        "a classic v2 session"
    );
}

#[test]
fn validate_names_the_bad_setting() {
    let key = Arc::new(default_key().public());
    let good = SessionConfig::new(vec!["127.0.0.1:3000".into()], key, test_device());
    assert_eq!(good.validate(), Ok(()));
    type Breaker = Box<dyn Fn(&mut SessionConfig)>;
    let cases: Vec<(&str, Breaker)> = vec![
        ("servers or allocator_url", Box::new(|c| c.servers.clear())),
        ("servers", Box::new(|c| c.servers = vec!["nonsense".into()])),
        ("servers", Box::new(|c| c.servers = vec!["ws://".into()])),
        (
            "allocator_url",
            Box::new(|c| c.allocator_url = Some("ftp://x".into())),
        ),
        ("device_id", Box::new(|c| c.device.device_id.clear())),
        (
            "heartbeat",
            Box::new(|c| c.heartbeat = Duration::from_millis(10)),
        ),
        (
            "connect_timeout",
            Box::new(|c| c.connect_timeout = Duration::ZERO),
        ),
        ("backoff", Box::new(|c| c.backoff.max = Duration::ZERO)),
        ("backoff", Box::new(|c| c.backoff.jitter = 2.0)),
        ("dedup_capacity", Box::new(|c| c.dedup_capacity = 0)),
        (
            "outbound_capacity",
            Box::new(|c| c.outbound_capacity = usize::MAX),
        ),
    ];
    for (name, break_it) in cases {
        let mut c = good.clone();
        break_it(&mut c);
        match c.validate() {
            Err(e @ SessionError::InvalidInput(_)) => {
                assert_eq!(e.code(), "invalid_input");
                assert!(e.to_string().contains(name), "{e} should name {name}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    for ok in [
        "tls://push.example.com:3443",
        "wss://push.example.com/ws",
        "[::1]:3000",
    ] {
        let mut c = good.clone();
        c.servers = vec![ok.into()];
        assert_eq!(c.validate(), Ok(()), "{ok}");
    }
}

#[test]
fn allocator_lists_are_trimmed_and_blanks_dropped() {
    assert_eq!(
        mpush_sdk_core::session::parse_server_list(" a:1, ,ws://b:2/ ,"),
        vec!["a:1", "ws://b:2/"]
    );
    assert!(mpush_sdk_core::session::parse_server_list("").is_empty());
}
