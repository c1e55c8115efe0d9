//! Deterministic client/server simulations on a fake clock (house rule 6).

use std::time::Duration;

use bytes::Bytes;
use mpush_protocol::client::{ClientCloseReason, ClientEvent};
use mpush_protocol::message::{ErrorCode, Redirect};
use mpush_protocol::server::{CloseReason, OutboundPush, PushError, ServerEvent, UpPushRefusal};
use mpush_protocol::session::{AckMode, Profile, ResumeTicket, SessionSecret};
use mpush_protocol::testing::{BindPolicy, LinkFaults, Pair};

const SEC: Duration = Duration::from_secs(1);

fn connected(p: &Pair) -> Option<(Profile, bool, Option<ResumeTicket>)> {
    p.client_events.iter().rev().find_map(|e| match e {
        ClientEvent::Connected {
            profile,
            resumed,
            ticket,
            ..
        } => Some((*profile, *resumed, ticket.clone())),
        _ => None,
    })
}

fn handshake(seed: u64, client_v2: bool, server_v2: bool) -> Pair {
    let mut p = Pair::new(seed, client_v2, server_v2, LinkFaults::perfect());
    assert!(
        p.run_until(5 * SEC, |p| connected(p).is_some()),
        "handshake completes"
    );
    p
}

fn bind(p: &mut Pair, user: &str) {
    let now = p.now;
    p.client.bind(user, "tag-a", "", now).expect("bind sent");
    p.pump();
    assert!(
        p.run_until(5 * SEC, |p| p.client_events.iter().any(
            |e| matches!(e, ClientEvent::BindOk { user_id } if user_id == user)
        )),
        "bind ok"
    );
    assert_eq!(p.server.user(), Some(user));
}

/// Push `id`: content "hello {id}", trace "t-{id}".
fn outbound(id: u64, mode: AckMode) -> OutboundPush {
    OutboundPush {
        message_id: id,
        trace_id: format!("t-{id}").into(),
        content: Bytes::from(format!("hello {id}")),
        ack_mode: mode,
        expires_at_ms: 0,
        ack_timeout: None,
        queued_at: None,
    }
}

fn push(p: &mut Pair, id: u64, mode: AckMode) -> Result<i32, PushError> {
    let now = p.now;
    let r = p.server.push(outbound(id, mode), now);
    p.pump();
    r
}

fn messages(p: &Pair) -> Vec<String> {
    p.client_events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::Message(m) => Some(String::from_utf8_lossy(&m.content).into_owned()),
            _ => None,
        })
        .collect()
}

fn server_count(p: &Pair, f: impl Fn(&ServerEvent) -> bool) -> usize {
    p.server_events.iter().filter(|e| f(e)).count()
}

#[test]
fn handshake_negotiates_the_profile_with_either_peer_legacy() {
    for (c, s, want) in [
        (false, false, Profile::Legacy),
        (true, false, Profile::Legacy),
        (false, true, Profile::Legacy),
        (true, true, Profile::V2),
    ] {
        let p = handshake(1, c, s);
        let (profile, resumed, ticket) = connected(&p).expect("connected");
        assert_eq!(
            (profile, resumed),
            (want, false),
            "client v2={c} server v2={s}"
        );
        assert_eq!(p.server.profile(), want);
        let ticket = ticket.expect("ticket");
        assert_eq!(ticket.session_id.len(), 32);
        match (want, &ticket.secret) {
            (Profile::Legacy, SessionSecret::Legacy { .. })
            | (Profile::V2, SessionSecret::V2 { .. }) => {}
            other => panic!("ticket secret does not match profile: {other:?}"),
        }
        assert_eq!(
            p.server.heartbeat(),
            Duration::from_secs(180),
            "mpush's default"
        );
        assert_eq!(p.client.heartbeat(), Duration::from_secs(180));
    }
}

#[test]
fn fast_connect_resumes_each_profile() {
    for v2 in [false, true] {
        let mut p = handshake(2, v2, v2);
        let ticket = connected(&p).and_then(|c| c.2).expect("ticket");
        p.reconnect(Some(ticket));
        p.client_events.clear();
        assert!(p.run_until(5 * SEC, |p| connected(p).is_some()));
        let (profile, resumed, _) = connected(&p).expect("connected");
        assert!(resumed, "fast connect used (v2={v2})");
        assert_eq!(profile, if v2 { Profile::V2 } else { Profile::Legacy });
        // The resumed session really shares keys: a bind and a push work.
        bind(&mut p, "user-1");
        push(&mut p, 1, AckMode::Auto).expect("push");
        assert!(p.run_until(5 * SEC, |p| server_count(p, |e| matches!(
            e,
            ServerEvent::Acked { push } if push.message_id == 1
        )) == 1));
        assert_eq!(messages(&p), vec!["hello 1"]);
    }
}

#[test]
fn fast_connect_falls_back_to_handshake_on_the_same_socket() {
    for v2 in [false, true] {
        let mut p = handshake(3, v2, v2);
        let mut ticket = connected(&p).and_then(|c| c.2).expect("ticket");
        // Unknown session: 103, then a full handshake on the same connection.
        let mut unknown = ticket.clone();
        unknown.session_id = "ffffffffffffffffffffffffffffffff".into();
        p.reconnect(Some(unknown));
        p.client_events.clear();
        assert!(p.run_until(5 * SEC, |p| connected(p).is_some()));
        assert!(p.client_events.iter().any(|e| matches!(
            e,
            ClientEvent::ResumeRejected { code } if *code == ErrorCode::SESSION_EXPIRED
        )));
        assert_eq!(connected(&p).map(|c| c.1), Some(false), "full handshake");
        // v2: the right session id with the wrong key is refused (no proof).
        if v2 {
            ticket.secret = SessionSecret::V2 {
                resume_key: mpush_protocol::crypto::ResumeKey([9; 32]),
            };
            p.reconnect(Some(ticket));
            p.client_events.clear();
            assert!(p.run_until(5 * SEC, |p| connected(p).is_some()));
            assert_eq!(
                connected(&p).map(|c| c.1),
                Some(false),
                "forged resume refused"
            );
        }
    }
}

#[test]
fn fast_connect_from_another_device_is_refused_with_104() {
    let mut p = handshake(4, false, false);
    let ticket = connected(&p).and_then(|c| c.2).expect("ticket");
    let sid = ticket.session_id.clone();
    p.sessions.get_mut(&sid).expect("stored").device.device_id = "other".into();
    p.reconnect(Some(ticket));
    p.client_events.clear();
    assert!(p.run_until(5 * SEC, |p| connected(p).is_some()));
    assert!(p.client_events.iter().any(|e| matches!(
        e,
        ClientEvent::ResumeRejected { code } if *code == ErrorCode::INVALID_DEVICE
    )));
}

#[test]
fn push_in_each_ack_mode() {
    for v2 in [false, true] {
        let mut p = handshake(5, v2, v2);
        bind(&mut p, "u");
        push(&mut p, 10, AckMode::None).expect("push");
        push(&mut p, 11, AckMode::Auto).expect("push");
        push(&mut p, 12, AckMode::Biz).expect("push");
        p.run_for(SEC);
        assert_eq!(messages(&p), vec!["hello 10", "hello 11", "hello 12"]);
        assert_eq!(
            server_count(
                &p,
                |e| matches!(e, ServerEvent::Acked { push } if push.message_id == 11)
            ),
            1
        );
        assert_eq!(
            server_count(
                &p,
                |e| matches!(e, ServerEvent::Acked { push } if push.message_id == 12)
            ),
            0,
            "app has not acked yet"
        );
        let token = p
            .client_events
            .iter()
            .find_map(|e| match e {
                ClientEvent::Message(m) if m.ack_mode == AckMode::Biz => m.ack,
                _ => None,
            })
            .expect("biz message carries an ack token");
        if v2 {
            assert_eq!(token.message_id, Some(12));
        }
        let now = p.now;
        p.client.ack(token, now).expect("ack");
        p.pump();
        p.run_for(SEC);
        assert_eq!(
            server_count(
                &p,
                |e| matches!(e, ServerEvent::Acked { push } if push.message_id == 12)
            ),
            1
        );
        assert_eq!(p.server.inflight(), 0);
        // Nothing is retried once acked.
        p.run_for(30 * SEC);
        assert_eq!(messages(&p).len(), 3);
        assert_eq!(
            server_count(&p, |e| matches!(e, ServerEvent::PushRetried { .. })),
            0
        );
    }
}

#[test]
fn unacked_pushes_are_retried_then_time_out_and_are_seen_once() {
    for v2 in [false, true] {
        let mut p = handshake(6, v2, v2);
        bind(&mut p, "u");
        push(&mut p, 20, AckMode::Biz).expect("push");
        p.run_for(30 * SEC);
        let retries: Vec<u32> = p
            .server_events
            .iter()
            .filter_map(|e| match e {
                ServerEvent::PushRetried {
                    message_id: 20,
                    attempt,
                    ..
                } => Some(*attempt),
                _ => None,
            })
            .collect();
        assert_eq!(retries, vec![1, 2, 3]);
        assert_eq!(
            server_count(&p, |e| matches!(
                e,
                ServerEvent::PushTimedOut { push } if push.message_id == 20
            )),
            1
        );
        assert_eq!(messages(&p), vec!["hello 20"], "retries are deduplicated");
    }
}

#[test]
fn a_lost_biz_ack_is_repeated_when_the_server_retries() {
    let mut p = handshake(19, true, true);
    bind(&mut p, "u");
    push(&mut p, 30, AckMode::Biz).expect("push");
    p.run_for(SEC);
    let token = p
        .client_events
        .iter()
        .find_map(|e| match e {
            ClientEvent::Message(m) => m.ack,
            _ => None,
        })
        .expect("token");
    p.c2s.faults.loss = 1.0;
    let now = p.now;
    p.client.ack(token, now).expect("ack");
    p.pump();
    p.run_for(Duration::from_millis(500));
    p.c2s.faults.loss = 0.0;
    assert!(p.run_until(10 * SEC, |p| server_count(p, |e| matches!(
        e,
        ServerEvent::Acked { push } if push.message_id == 30
    )) == 1));
    assert_eq!(messages(&p).len(), 1);
}

#[test]
fn hostile_link_delivers_each_message_once() {
    for v2 in [true, false] {
        hostile_run(v2);
    }
}

fn hostile_run(v2: bool) {
    const N: u64 = 40;
    let mut p = handshake(7, v2, v2);
    bind(&mut p, "u");
    p.c2s.faults = LinkFaults::hostile();
    p.s2c.faults = LinkFaults::hostile();
    for id in 0..N {
        push(&mut p, id, AckMode::Auto).expect("push");
        p.run_for(Duration::from_millis(100));
    }
    p.run_for(60 * SEC);
    let got = messages(&p);
    let mut unique = got.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), got.len(), "no duplicates reach the app");
    let acked = server_count(&p, |e| matches!(e, ServerEvent::Acked { .. }));
    let timed_out = server_count(&p, |e| matches!(e, ServerEvent::PushTimedOut { .. }));
    assert_eq!(
        acked + timed_out,
        N as usize,
        "every push ends acked or timed out"
    );
    assert!(acked as u64 >= N - 2, "retries overcome loss: {acked}/{N}");
    assert!(got.len() >= acked, "every acked message was delivered");
    assert!(
        p.c2s.stats.1 > 0 && p.s2c.stats.2 > 0,
        "the link did lose and duplicate: {:?} {:?}",
        p.c2s.stats,
        p.s2c.stats
    );
    assert!(retry_happened(&p));
}

fn retry_happened(p: &Pair) -> bool {
    server_count(p, |e| matches!(e, ServerEvent::PushRetried { .. })) > 0
}

#[test]
fn kick_reaches_the_client() {
    for v2 in [false, true] {
        let mut p = handshake(8, v2, v2);
        bind(&mut p, "u");
        p.server.kick("dev-2", "u");
        p.pump();
        p.run_for(SEC);
        assert!(p.client_events.iter().any(|e| matches!(
            e,
            ClientEvent::Kicked { device_id, user_id } if device_id == "dev-2" && user_id == "u"
        )));
    }
}

#[test]
fn heartbeats_keep_an_idle_connection_alive() {
    let mut p = handshake(9, true, true);
    p.run_for(Duration::from_secs(3600));
    assert!(p.client.is_established() && p.server.is_established());
}

#[test]
fn client_times_out_when_the_server_goes_silent() {
    let mut p = handshake(10, false, false);
    p.s2c.faults.loss = 1.0;
    let t0 = p.now;
    assert!(p.run_until(Duration::from_secs(900), |p| p.client.is_closed()));
    let waited = p.now - t0;
    assert!(
        waited >= Duration::from_secs(360) && waited <= Duration::from_secs(400),
        "{waited:?}"
    );
    assert!(p.client_events.iter().any(|e| matches!(
        e,
        ClientEvent::Closed {
            reason: ClientCloseReason::HeartbeatTimeout,
            reconnect: true
        }
    )));
    assert!(!p.server.is_closed(), "the server still hears pings");
}

#[test]
fn server_times_out_a_silent_client() {
    let mut p = handshake(11, false, false);
    p.c2s.faults.loss = 1.0;
    assert!(p.run_until(Duration::from_secs(900), |p| p.server.is_closed()));
    assert!(p.server_events.iter().any(|e| matches!(
        e,
        ServerEvent::Closed {
            reason: CloseReason::HeartbeatTimeout,
            ..
        }
    )));
    // mpush: the third consecutive missed check closes (3 x 180 s).
    assert!(p.elapsed() >= Duration::from_secs(540), "{:?}", p.elapsed());
}

#[test]
fn server_closes_a_connection_that_never_handshakes() {
    let mut p = Pair::new(12, false, false, LinkFaults::perfect());
    p.c2s.clear();
    p.c2s.faults.loss = 1.0;
    assert!(p.run_until(Duration::from_secs(120), |p| p.server.is_closed()));
    // The handshake deadline (10 s), not the heartbeat check, ends it.
    let t = p.elapsed();
    assert!(
        t >= Duration::from_secs(10) && t <= Duration::from_secs(11),
        "{t:?}"
    );
    assert!(p.server_events.iter().any(|e| matches!(
        e,
        ServerEvent::Closed {
            reason: CloseReason::HandshakeTimeout,
            ..
        }
    )));
    assert!(p.client_events.iter().any(|e| matches!(
        e,
        ClientEvent::Closed {
            reason: ClientCloseReason::HandshakeTimeout,
            reconnect: true
        }
    )));
}

#[test]
fn redirect_only_reaches_v2_clients() {
    let mut p = handshake(13, true, true);
    let r = Redirect {
        address: "127.0.0.1:3001".into(),
        retry_after_ms: 100,
        jitter_ms: 500,
        reason: "draining".into(),
    };
    assert!(p.server.redirect(&r));
    p.pump();
    p.run_for(SEC);
    assert!(
        p.client_events
            .iter()
            .any(|e| *e == ClientEvent::Redirect(r.clone()))
    );
    let mut legacy = handshake(13, false, false);
    assert!(!legacy.server.redirect(&r));
}

#[test]
fn refused_bind_closes_and_the_client_reconnects() {
    let mut p = handshake(14, false, false);
    p.bind_policy = BindPolicy::Refuse("bad token".into());
    let now = p.now;
    p.client.bind("u", "", "tok", now).expect("sent");
    p.pump();
    p.run_for(SEC);
    assert!(p.server.is_closed());
    assert!(p.client_events.iter().any(|e| matches!(
        e,
        ClientEvent::Closed {
            reason: ClientCloseReason::ServerError {
                code: ErrorCode::NONE,
                ..
            },
            reconnect: true
        }
    )));
}

#[test]
fn bind_is_resent_once_then_the_client_gives_up() {
    let mut p = handshake(15, false, false);
    p.c2s.faults.loss = 1.0;
    let sent_before = p.c2s.stats.0;
    let now = p.now;
    p.client.bind("u", "", "", now).expect("sent");
    p.pump();
    assert!(p.run_until(10 * SEC, |p| p.client.is_closed()));
    assert_eq!(p.c2s.stats.0 - sent_before, 2, "the bind and one resend");
    assert!(p.client_events.iter().any(|e| matches!(
        e,
        ClientEvent::Closed {
            reason: ClientCloseReason::RequestTimeout(_),
            ..
        }
    )));
    // Two 3 s timeouts: the bind and its one resend.
    assert!(p.elapsed() >= Duration::from_secs(6));
}

#[test]
fn up_push_with_auto_ack_is_acknowledged() {
    for v2 in [false, true] {
        let mut p = handshake(16, v2, v2);
        bind(&mut p, "u");
        let now = p.now;
        let id = p
            .client
            .push(b"up!", AckMode::Auto, 3 * SEC, now)
            .expect("push");
        p.pump();
        p.run_for(SEC);
        assert!(p.server_events.iter().any(|e| matches!(
            e,
            ServerEvent::UpPush { content, message_id, .. } if &content[..] == b"up!" && message_id.is_some() == v2
        )));
        assert!(
            p.client_events
                .contains(&ClientEvent::PushAcked { request: id })
        );
    }
}

#[test]
fn up_push_keeps_its_message_id_on_a_resend() {
    let mut p = handshake(161, true, true);
    bind(&mut p, "u");
    let now = p.now;
    p.client
        .push_with_id(b"a", 77, AckMode::Auto, 3 * SEC, now)
        .expect("push");
    p.client
        .push_with_id(b"a", 77, AckMode::Auto, 3 * SEC, now)
        .expect("again");
    p.pump();
    p.run_for(SEC);
    let ids: Vec<Option<u64>> = p
        .server_events
        .iter()
        .filter_map(|e| match e {
            ServerEvent::UpPush { message_id, .. } => Some(*message_id),
            _ => None,
        })
        .collect();
    assert_eq!(ids, vec![Some(77), Some(77)]);
}

#[test]
fn a_refused_up_push_is_reported_and_the_connection_stays() {
    // v2: ERROR(PUSH, RETRY_LATER) becomes PushRefused; the link stays up
    // and the next push goes through.
    let mut p = handshake(162, true, true);
    bind(&mut p, "u");
    p.up_push_refusal = Some(UpPushRefusal::RetryLater("sinks full".into()));
    let now = p.now;
    let id = p
        .client
        .push(b"up!", AckMode::Auto, 3 * SEC, now)
        .expect("push");
    p.pump();
    p.run_for(SEC);
    assert!(p.client_events.iter().any(|e| matches!(
        e,
        ClientEvent::PushRefused { request, code: ErrorCode::RETRY_LATER, reason }
            if *request == id && reason == "sinks full"
    )));
    assert!(!p.client.is_closed() && !p.server.is_closed());
    p.up_push_refusal = None;
    let now = p.now;
    let id = p
        .client
        .push(b"again", AckMode::Auto, 3 * SEC, now)
        .expect("push");
    p.pump();
    p.run_for(SEC);
    assert!(
        p.client_events
            .contains(&ClientEvent::PushAcked { request: id })
    );

    // Legacy: no ERROR (an mpush client reconnects on one): no ACK, so the
    // client's wait times out, and the connection stays.
    let mut p = handshake(163, false, false);
    bind(&mut p, "u");
    p.up_push_refusal = Some(UpPushRefusal::RetryLater("sinks full".into()));
    let now = p.now;
    let id = p
        .client
        .push(b"up!", AckMode::Auto, 3 * SEC, now)
        .expect("push");
    p.pump();
    p.run_for(4 * SEC);
    assert!(
        p.client_events
            .contains(&ClientEvent::PushTimedOut { request: id })
    );
    assert!(!p.client.is_closed() && !p.server.is_closed());
}

#[test]
fn push_before_handshake_is_refused_and_inflight_is_bounded() {
    let mut p = Pair::new(17, true, true, LinkFaults::perfect());
    assert_eq!(push(&mut p, 1, AckMode::Auto), Err(PushError::NotReady));
    assert!(p.run_until(5 * SEC, |p| connected(p).is_some()));
    for id in 0..1024 {
        push(&mut p, id, AckMode::Biz).expect("room");
    }
    assert_eq!(push(&mut p, 5000, AckMode::Biz), Err(PushError::Busy));
    assert_eq!(push(&mut p, 5, AckMode::Biz), Err(PushError::Duplicate(5)));
    assert!(
        push(&mut p, 5001, AckMode::None).is_ok(),
        "untracked pushes are not limited"
    );
}

#[test]
fn closing_reports_unacked_pushes() {
    let mut p = handshake(18, true, true);
    bind(&mut p, "u");
    push(&mut p, 1, AckMode::Biz).expect("push");
    push(&mut p, 2, AckMode::Biz).expect("push");
    p.server.close();
    p.pump();
    assert!(p.server_events.iter().any(|e| matches!(
        e,
        ServerEvent::Closed { reason: CloseReason::Local, unacked } if unacked.iter().map(|p| p.message_id).collect::<Vec<_>>() == vec![1, 2]
    )));
}

/// ADR 0005: a pair on the transport-secured profile.
fn transport_pair(seed: u64, secure: bool) -> Pair {
    let key = mpush_protocol::testing::default_key();
    let mut cc = mpush_protocol::client::ClientConfig::new(
        std::sync::Arc::new(key.public()),
        mpush_protocol::testing::test_device(),
    );
    cc.transport_secured = true;
    let sc = mpush_protocol::server::ServerConfig::new(key);
    let p = Pair::with_configs(seed, cc, sc, LinkFaults::perfect(), None);
    if secure { p.secure() } else { p }
}

#[test]
fn the_transport_profile_needs_no_crypto_and_works_like_v2() {
    let mut p = transport_pair(40, true);
    assert!(p.run_until(5 * SEC, |p| connected(p).is_some()));
    let (profile, resumed, ticket) = connected(&p).expect("connected");
    assert_eq!(profile, Profile::V2);
    assert!(!resumed);
    assert!(p.server.is_transport());
    let ticket = ticket.expect("ticket");
    assert!(matches!(ticket.secret, SessionSecret::Transport { .. }));
    assert!(ticket.to_text().starts_with("vt,"), "{}", ticket.to_text());
    assert_eq!(
        ResumeTicket::from_text(&ticket.to_text()),
        Some(ticket.clone())
    );
    // v2 semantics on plaintext packets: message ids, ACKs, binds.
    bind(&mut p, "user-t");
    push(&mut p, 7, AckMode::Auto).expect("push");
    assert!(p.run_until(5 * SEC, |p| server_count(p, |e| matches!(
        e,
        ServerEvent::Acked { push } if push.message_id == 7
    )) == 1));
    assert_eq!(messages(&p), vec!["hello 7"]);

    // Fast connect with the transport ticket: the same profile, no cipher.
    p.reconnect(Some(ticket));
    p.client_events.clear();
    assert!(p.run_until(5 * SEC, |p| connected(p).is_some()));
    let (profile, resumed, next) = connected(&p).expect("connected");
    assert!(resumed && profile == Profile::V2 && p.server.is_transport());
    assert!(matches!(
        next.map(|t| t.secret),
        Some(SessionSecret::Transport { .. })
    ));
    bind(&mut p, "user-t");
    push(&mut p, 8, AckMode::Auto).expect("push");
    assert!(p.run_until(5 * SEC, |p| server_count(p, |e| matches!(
        e,
        ServerEvent::Acked { push } if push.message_id == 8
    )) == 1));
}

#[test]
fn the_transport_profile_is_refused_on_a_connection_that_is_not_tls() {
    // The attacker's view: a plaintext handshake on plain TCP gets nowhere.
    let mut p = transport_pair(41, false);
    p.run_for(5 * SEC);
    assert!(connected(&p).is_none(), "not established");
    assert!(!p.server.is_established());
    assert!(
        p.server_events
            .iter()
            .all(|e| !matches!(e, ServerEvent::HandshakeCompleted { .. }))
    );

    // A transport ticket is not resumed on a plain connection, and a classic
    // v2 ticket not on a transport one: both end in a full handshake.
    let mut secure = transport_pair(42, true);
    assert!(secure.run_until(5 * SEC, |p| connected(p).is_some()));
    let transport_ticket = connected(&secure).and_then(|c| c.2).expect("ticket");
    let mut classic = handshake(43, true, true);
    classic.sessions.extend(secure.sessions.clone());
    classic.reconnect(Some(transport_ticket.clone()));
    classic.client_events.clear();
    assert!(classic.run_until(5 * SEC, |p| connected(p).is_some()));
    assert_eq!(
        connected(&classic).map(|c| c.1),
        Some(false),
        "handshake, not resume"
    );
    assert!(!classic.server.is_transport());

    // The transport session presented with the TRANSPORT capability on a
    // plain connection (TLS stripped): refused (103), and no handshake follows.
    let forged = transport_ticket;
    let mut plain = transport_pair(44, false);
    plain.sessions.extend(secure.sessions.clone());
    plain.reconnect(Some(forged));
    plain.run_for(5 * SEC);
    assert!(
        plain.client_events.iter().any(|e| matches!(
            e,
            ClientEvent::ResumeRejected { code } if *code == ErrorCode::SESSION_EXPIRED
        )),
        "{:?}",
        plain.client_events
    );
    assert!(!plain.server.is_established());
}

// ----- ADR 0008: a resumed session keeps its binding -----------------------

/// A v2 pair whose server keeps bindings (`server_keeps`) and whose client
/// asks for it (`client_keeps`), handshaken.
fn keeping_pair(seed: u64, server_keeps: bool, client_keeps: bool) -> Pair {
    use mpush_protocol::client::ClientConfig;
    use mpush_protocol::server::ServerConfig;
    use mpush_protocol::testing::{default_key, test_device};
    let key = default_key();
    let mut cc = ClientConfig::new(std::sync::Arc::new(key.public()), test_device());
    cc.keep_binding = client_keeps;
    let mut sc = ServerConfig::new(key);
    sc.keep_binding = server_keeps;
    let mut p = Pair::with_configs(seed, cc, sc, LinkFaults::perfect(), None);
    assert!(p.run_until(5 * SEC, |p| connected(p).is_some()));
    p
}

/// Drops the connection and fast-connects with the last ticket; the events
/// of the new connection only.
fn resume(p: &mut Pair) {
    let ticket = p
        .client_events
        .iter()
        .rev()
        .find_map(|e| match e {
            ClientEvent::Connected {
                ticket: Some(t), ..
            } => Some(t.clone()),
            _ => None,
        })
        .expect("a ticket");
    p.reconnect(Some(ticket));
    p.client_events.clear();
    p.server_events.clear();
    assert!(p.run_until(5 * SEC, |p| connected(p).is_some()));
    assert!(connected(p).expect("connected").1, "resumed");
}

fn restore_asked(p: &Pair) -> usize {
    server_count(p, |e| matches!(e, ServerEvent::RestoreRequested { .. }))
}

#[test]
fn a_kept_binding_comes_back_with_the_fast_connect_and_no_bind() {
    let mut p = keeping_pair(30, true, true);
    assert!(p.server.kept_session().is_some());
    // The client can tell the server honours the bit (the kit's live case
    // tells a server that does not offer it so).
    let echoed = p.client.server_features() & mpush_protocol::message::v2::FEATURE_KEEP_BINDING;
    assert_ne!(echoed, 0, "{:#x}", p.client.server_features());
    bind(&mut p, "alice");
    // Twice: the binding travels with each single-use ticket's rotation.
    for round in 0..2 {
        resume(&mut p);
        assert!(p.client.binding_kept(), "round {round}: told it is bound");
        assert_eq!(p.server.user(), Some("alice"), "round {round}");
        assert_eq!(restore_asked(&p), 1, "round {round}");
        assert_eq!(
            server_count(&p, |e| matches!(e, ServerEvent::BindRequested { .. })),
            0,
            "round {round}: no BIND"
        );
        let kept = p.sessions.values().filter(|s| s.binding.is_some());
        assert_eq!(kept.count(), 1, "only the live ticket holds it");
        push(&mut p, 10 + round, AckMode::Auto).expect("pushed to the restored user");
        assert!(p.run_until(5 * SEC, |p| server_count(p, |e| matches!(
            e,
            ServerEvent::Acked { push } if push.message_id == 10 + round
        )) == 1));
    }
}

#[test]
fn the_fast_connect_answer_waits_for_the_restore() {
    use mpush_protocol::server::Answer;
    let mut p = keeping_pair(31, true, true);
    bind(&mut p, "alice");
    let ticket = connected(&p).and_then(|c| c.2).expect("ticket");
    p.hold_restore = true;
    p.reconnect(Some(ticket));
    p.client_events.clear();
    p.server_events.clear();
    p.run_for(SEC);
    assert_eq!(restore_asked(&p), 1);
    assert!(
        connected(&p).is_none(),
        "no FAST_CONNECT_OK before the answer"
    );
    assert!(!p.server.is_established());
    assert_eq!(push(&mut p, 1, AckMode::Auto), Err(PushError::NotReady));
    let now = p.now;
    p.server.handle_answer(Answer::Restored(true), now);
    p.pump();
    assert!(p.run_until(5 * SEC, |p| connected(p).is_some()));
    assert!(p.client.binding_kept());
    assert_eq!(p.server.user(), Some("alice"));
}

#[test]
fn a_failed_restore_says_not_bound_and_the_client_binds_itself() {
    let mut p = keeping_pair(32, true, true);
    bind(&mut p, "alice");
    p.restore_ok = false;
    resume(&mut p);
    assert_eq!(restore_asked(&p), 1);
    assert!(!p.client.binding_kept());
    assert_eq!(p.server.user(), None);
    assert!(
        p.sessions.values().all(|s| s.binding.is_none()),
        "nothing left to restore"
    );
    p.restore_ok = true;
    bind(&mut p, "alice");
    push(&mut p, 1, AckMode::Auto).expect("push");
    assert!(p.run_until(5 * SEC, |p| server_count(p, |e| matches!(
        e,
        ServerEvent::Acked { .. }
    )) == 1));
}

#[test]
fn without_the_bit_on_either_side_a_resume_is_as_before() {
    for (server_keeps, client_keeps) in [(false, true), (true, false), (false, false)] {
        let mut p = keeping_pair(33, server_keeps, client_keeps);
        assert_eq!(p.server.kept_session(), None);
        assert_eq!(
            p.client.server_features() & mpush_protocol::message::v2::FEATURE_KEEP_BINDING,
            0,
            "not echoed unless both keep"
        );
        bind(&mut p, "alice");
        assert!(p.sessions.values().all(|s| s.binding.is_none()));
        resume(&mut p);
        assert_eq!(restore_asked(&p), 0);
        assert!(!p.client.binding_kept());
        assert_eq!(p.server.user(), None, "the client binds itself");
    }
}

#[test]
fn the_answer_without_a_kept_binding_is_byte_for_byte_the_old_one() {
    // Same seeds, a server that keeps bindings and one that does not, a
    // client that asks and nothing bound: the server's bytes are the same.
    let answer = |server_keeps: bool| {
        let mut p = keeping_pair(34, server_keeps, true);
        let ticket = connected(&p).and_then(|c| c.2).expect("ticket");
        p.reconnect(Some(ticket));
        let mut out = Vec::new();
        while let Some(b) = p.server.poll_transmit() {
            out.extend_from_slice(&b);
        }
        p.step(p.now + SEC);
        while let Some(b) = p.server.poll_transmit() {
            out.extend_from_slice(&b);
        }
        (out, p.s2c.deliver(p.now + 10 * SEC))
    };
    let (kept, plain) = (answer(true), answer(false));
    assert!(!kept.1.is_empty(), "a FAST_CONNECT_OK was sent");
    assert_eq!(kept, plain);
}

#[test]
fn an_unbind_or_a_kick_leaves_nothing_to_restore() {
    let mut p = keeping_pair(35, true, true);
    bind(&mut p, "alice");
    let now = p.now;
    p.client.unbind("alice", now).expect("unbind");
    p.pump();
    p.run_for(SEC);
    assert!(p.sessions.values().all(|s| s.binding.is_none()));
    resume(&mut p);
    assert_eq!(restore_asked(&p), 0);

    let mut p = keeping_pair(36, true, true);
    bind(&mut p, "alice");
    p.server.kick("dev-2", "alice");
    p.pump();
    assert_eq!(
        server_count(&p, |e| matches!(e, ServerEvent::ForgetBinding { .. })),
        1
    );
    assert!(p.sessions.values().all(|s| s.binding.is_none()));
    assert_eq!(p.server.kept_session(), None, "none kept after a kick");
    resume(&mut p);
    assert_eq!(restore_asked(&p), 0);
}

#[test]
fn an_expired_token_restores_nothing() {
    let mut p = keeping_pair(37, true, true);
    bind(&mut p, "alice");
    let expired = p.unix_ms + p.elapsed().as_millis() as i64 - 1;
    for s in p.sessions.values_mut() {
        if let Some(b) = s.binding.as_mut() {
            b.expires_at_ms = expired;
        }
    }
    resume(&mut p);
    assert_eq!(restore_asked(&p), 0);
    assert_eq!(p.server.user(), None);
    assert!(
        p.sessions.values().all(|s| s.binding.is_none()),
        "an expired binding does not travel to the next ticket"
    );
}

/// Pushes queued before the server's next write are sealed as one burst,
/// the key schedule expanded once for all of them (`Sealer::seal_counted`):
/// each opens at the client, in order, on both profiles, and so does a push
/// after the burst, sealed on its own once the write took the schedule away.
#[test]
fn a_burst_of_pushes_before_one_write_arrives_whole_and_in_order() {
    for v2 in [false, true] {
        let mut p = handshake(7, v2, v2);
        bind(&mut p, "u-burst");
        let now = p.now;
        for id in 1..=9u64 {
            p.server
                .push(outbound(id, AckMode::Auto), now)
                .expect("pushed");
        }
        p.pump();
        push(&mut p, 10, AckMode::Auto).expect("pushed after the burst");
        assert!(
            p.run_until(5 * SEC, |p| messages(p).len() == 10),
            "v2={v2}: every push arrives, got {:?}",
            messages(&p)
        );
        let want: Vec<String> = (1..=10).map(|id| format!("hello {id}")).collect();
        assert_eq!(messages(&p), want, "v2={v2}");
    }
}
