//! The server machine against a client that plays the attacker: each attack
//! gets its stated reaction (close, refusal, deadline), decided by the machine.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use mpush_protocol::client::{ClientConfig, ClientConnection, ClientEvent};
use mpush_protocol::dedup::DedupWindow;
use mpush_protocol::message::{Body, ErrorCode, ErrorMessage, Handshake};
use mpush_protocol::packet::{Command, Decoder, Flags, Frame, Packet};
use mpush_protocol::server::{
    Answer, CloseReason, OutboundPush, ServerConfig, ServerConnection, ServerEvent,
};
use mpush_protocol::session::{AckMode, DeviceInfo, Profile, limits};
use mpush_protocol::testing::{LinkFaults, Pair, default_key, test_device};
use mpush_protocol::{Instant, ProtocolError};

fn server_with(f: impl FnOnce(&mut ServerConfig)) -> (ServerConnection, Instant) {
    let now = Instant::now();
    let mut cfg = ServerConfig::new(default_key());
    f(&mut cfg);
    (ServerConnection::new(Arc::new(cfg), [3; 32], now, 0), now)
}

fn client(v2: bool, device: DeviceInfo, now: Instant) -> ClientConnection {
    let mut cfg = ClientConfig::new(Arc::new(default_key().public()), device);
    cfg.offer_v2 = v2;
    ClientConnection::new(Arc::new(cfg), [5; 32], now, 0, None, DedupWindow::default())
}

use mpush_protocol::testing::drain_server as drain;

fn closed_by(events: &[ServerEvent]) -> Option<&CloseReason> {
    events.iter().find_map(|e| match e {
        ServerEvent::Closed { reason, .. } => Some(reason),
        _ => None,
    })
}

fn error_code(frames: &[Frame]) -> Option<(u8, String)> {
    frames.iter().find_map(|f| match f {
        Frame::Packet(p) if p.cmd == Command::ERROR => ErrorMessage::from_bytes(&p.body)
            .ok()
            .map(|e| (e.code.0, e.reason)),
        _ => None,
    })
}

/// `body` as one unsealed packet of request `id`, on the wire.
fn plain<B: Body>(body: &B, id: i32) -> bytes::Bytes {
    Frame::Packet(Packet::new(B::CMD, id, Flags::NONE, body.to_bytes())).to_bytes()
}

/// Connects a real client to `s`; returns the client and the client's hello bytes.
fn handshake(s: &mut ServerConnection, c: &mut ClientConnection, now: Instant) -> Vec<u8> {
    let hello = c.poll_transmit().expect("hello").to_vec();
    s.handle_input(&hello, now);
    while let Some(e) = s.poll_event() {
        if let ServerEvent::DecryptRequested { ciphertext } = e {
            let mut rng = <mpush_protocol::crypto::Rng as rand_core::SeedableRng>::seed_from_u64(1);
            let plain = default_key().decrypt(&mut rng, &ciphertext);
            s.handle_answer(Answer::Decrypted(plain), now);
        }
    }
    while let Some(b) = s.poll_transmit() {
        c.handle_input(&b, now);
    }
    assert!(s.is_established() && c.is_established());
    hello
}

#[test]
fn heartbeats_alone_do_not_keep_an_unauthenticated_connection() {
    let (mut s, start) = server_with(|_| {});
    let mut now = start;
    while !s.is_closed() && now < start + Duration::from_secs(60) {
        s.handle_input(&[0xDF], now);
        now += Duration::from_millis(500);
        if s.poll_timeout().is_some_and(|t| t <= now) {
            s.handle_timeout(now);
        }
    }
    let (_, events) = drain(&mut s);
    assert_eq!(closed_by(&events), Some(&CloseReason::HandshakeTimeout));
    assert!(now - start <= Duration::from_secs(11), "{:?}", now - start);
}

#[test]
fn a_second_handshake_on_one_connection_closes_it() {
    let (mut s, now) = server_with(|_| {});
    let mut c = client(false, test_device(), now);
    let hello = handshake(&mut s, &mut c, now);
    drain(&mut s);
    s.handle_input(&hello, now);
    let (frames, events) = drain(&mut s);
    assert_eq!(
        error_code(&frames).map(|e| e.0),
        Some(ErrorCode::REPEAT_HANDSHAKE.0)
    );
    assert!(s.is_closed());
    assert!(matches!(closed_by(&events), Some(CloseReason::Refused(_))));
}

#[test]
fn a_fast_connect_after_a_handshake_closes_it() {
    let (mut s, now) = server_with(|_| {});
    let mut c = client(false, test_device(), now);
    handshake(&mut s, &mut c, now);
    drain(&mut s);
    let fc = mpush_protocol::message::FastConnect {
        session_id: "abc".into(),
        device_id: "dev-1".into(),
        ..Default::default()
    };
    s.handle_input(&plain(&fc, 3), now);
    assert!(s.is_closed());
}

#[test]
fn an_oversized_rsa_handshake_is_refused_before_any_rsa_work() {
    // 80 blocks of a 1024-bit key: what a 10 KiB frame holds. A real client
    // sends two to four.
    let (mut s, now) = server_with(|c| c.offload_rsa = true);
    let p = Frame::Packet(Packet::new(
        Command::HANDSHAKE,
        1,
        Flags::CRYPTO,
        vec![0x55; 80 * 128],
    ));
    s.handle_input(&p.to_bytes(), now);
    let (frames, events) = drain(&mut s);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, ServerEvent::DecryptRequested { .. })),
        "no RSA work was asked for"
    );
    assert_eq!(
        error_code(&frames).map(|e| e.1),
        Some("Param invalid".into())
    );
    assert!(s.is_closed());
}

/// A plaintext handshake of `device` into a fresh server: the device the
/// server kept, or `None` when it refused.
fn handshake_with(device: DeviceInfo) -> Option<DeviceInfo> {
    let (mut s, now) = server_with(|_| {});
    let hs = Handshake {
        device_id: device.device_id,
        os_name: device.os_name,
        os_version: device.os_version,
        client_version: device.client_version,
        iv: vec![1; 16],
        client_key: vec![2; 16],
        ..Default::default()
    };
    s.handle_input(&plain(&hs, 1), now);
    let (_, events) = drain(&mut s);
    let kept = events.into_iter().find_map(|e| match e {
        ServerEvent::HandshakeCompleted { device, .. } => Some(device),
        _ => None,
    });
    assert_eq!(kept.is_none(), s.is_closed());
    kept
}

#[test]
fn an_oversized_device_id_is_refused() {
    let d = DeviceInfo {
        device_id: "d".repeat(9000),
        ..test_device()
    };
    assert_eq!(handshake_with(d), None, "no session is created");
}

/// What real clients send is kept whole; longer descriptions are cut, never
/// refused (mpush 0.8.1 accepted any length).
#[test]
fn device_descriptions_are_cut_never_refused() {
    // mpush's web page: "web " + navigator.userAgent (Chrome on Android, with
    // an in-app browser's suffix: one of the longer real agents).
    let ua = "web Mozilla/5.0 (Linux; Android 14; SM-S918B Build/UP1A.231005.007; wv) AppleWebKit/537.36 (KHTML, like Gecko) Version/4.0 Chrome/131.0.6778.39 Mobile Safari/537.36 [FB_IAB/FB4A;FBAV/489.0.0.66.81;IABMV/1;]";
    let kept = handshake_with(DeviceInfo {
        device_id: "3f2504e0-4f89-11d3-9a0c-0305e82c3301".into(),
        os_name: ua.into(),
        os_version: "Android 14 (SDK 34; samsung SM-S918B; UP1A.231005.007.S918BXXS3BXA1)".into(),
        client_version: "2.14.0-beta.3+build.20241105.abcdef0".into(),
    })
    .expect("a real device's handshake is accepted");
    assert_eq!(kept.os_name, ua);
    let kept = handshake_with(DeviceInfo {
        os_name: "ΐ".repeat(1000),
        os_version: "v".repeat(2000),
        client_version: "c".repeat(2000),
        ..test_device()
    })
    .expect("long descriptions (within mpush's 10 KiB packet) are cut, not refused");
    assert_eq!(
        (
            kept.os_name.len(),
            kept.os_version.len(),
            kept.client_version.len()
        ),
        (limits::OS_NAME, limits::OS_VERSION, limits::CLIENT_VERSION)
    );
}

#[test]
fn rsa_can_run_in_the_driver_and_input_waits_for_it() {
    let (mut s, now) = server_with(|c| c.offload_rsa = true);
    let mut c = client(true, test_device(), now);
    let hello = c.poll_transmit().expect("hello");
    s.handle_input(&hello, now);
    let Some(ServerEvent::DecryptRequested { ciphertext }) = s.poll_event() else {
        panic!("the machine asks for the RSA work");
    };
    // Bytes that arrive meanwhile are held, not decoded.
    s.handle_input(&[0xDF], now);
    assert!(s.poll_transmit().is_none());
    let mut rng = <mpush_protocol::crypto::Rng as rand_core::SeedableRng>::seed_from_u64(9);
    let plain = default_key().decrypt(&mut rng, &ciphertext);
    s.handle_answer(Answer::Decrypted(plain), now);
    let (frames, events) = drain(&mut s);
    assert!(s.is_established());
    assert!(matches!(
        events.first(),
        Some(ServerEvent::HandshakeCompleted {
            profile: Profile::V2,
            ..
        })
    ));
    assert_eq!(
        frames.last(),
        Some(&Frame::Heartbeat),
        "then the held input"
    );
}

#[test]
fn require_v2_refuses_legacy_and_plaintext_handshakes() {
    let (mut s, now) = server_with(|c| c.require_v2 = true);
    let mut c = client(false, test_device(), now);
    s.handle_input(&c.poll_transmit().expect("hello"), now);
    assert!(s.is_closed(), "legacy refused");

    let (mut s, now) = server_with(|c| c.require_v2 = true);
    let hs = Handshake {
        device_id: "d".into(),
        iv: vec![1; 16],
        client_key: vec![2; 16],
        ..Default::default()
    };
    s.handle_input(&plain(&hs, 1), now);
    assert!(s.is_closed(), "plaintext refused");

    let (mut s, now) = server_with(|c| c.require_v2 = true);
    let mut c = client(true, test_device(), now);
    handshake(&mut s, &mut c, now);
    assert_eq!(s.profile(), Profile::V2);
}

fn v2_pair() -> (ServerConnection, ClientConnection, Instant) {
    let (mut s, now) = server_with(|_| {});
    let mut c = client(true, test_device(), now);
    handshake(&mut s, &mut c, now);
    drain(&mut s);
    while c.poll_event().is_some() {}
    (s, c, now)
}

fn push(s: &mut ServerConnection, now: Instant) -> Vec<u8> {
    s.push(
        OutboundPush {
            message_id: 77,
            trace_id: "t".into(),
            content: bytes::Bytes::from_static(b"secret"),
            ack_mode: AckMode::Auto,
            expires_at_ms: 0,
            ack_timeout: None,
            queued_at: None,
        },
        now,
    )
    .expect("pushed");
    s.poll_transmit().expect("push bytes").to_vec()
}

#[test]
fn v2_a_push_reflected_back_to_the_server_does_not_open() {
    let (mut s, _c, now) = v2_pair();
    let wire = push(&mut s, now);
    // The same bytes, sent back: same key, same header, other direction.
    s.handle_input(&wire, now);
    let (_, events) = drain(&mut s);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, ServerEvent::UpPush { .. })),
        "not taken as the client's up-push"
    );
    assert!(matches!(
        closed_by(&events),
        Some(CloseReason::Protocol(ProtocolError::Crypto(_)))
    ));
}

#[test]
fn v2_an_unsealed_empty_ack_is_not_an_ack() {
    let (mut s, _c, now) = v2_pair();
    let wire = push(&mut s, now);
    let mut buf = BytesMut::from(&wire[..]);
    let Ok(Some(Frame::Packet(p))) = Decoder::default().decode(&mut buf) else {
        panic!("push frame");
    };
    let forged = Frame::Packet(Packet::new(
        Command::ACK,
        p.session_id,
        Flags::NONE,
        Vec::new(),
    ));
    s.handle_input(&forged.to_bytes(), now);
    let (_, events) = drain(&mut s);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, ServerEvent::Acked { .. })),
        "an injected ACK confirms nothing"
    );
    assert!(s.is_closed());
}

#[test]
fn v2_the_client_acks_sealed_and_is_heard() {
    let (mut s, mut c, now) = v2_pair();
    let wire = push(&mut s, now);
    c.handle_input(&wire, now);
    while let Some(b) = c.poll_transmit() {
        s.handle_input(&b, now);
    }
    let (_, events) = drain(&mut s);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ServerEvent::Acked { push } if push.message_id == 77)),
        "{events:?}"
    );
    assert!(
        c.poll_event()
            .is_some_and(|e| matches!(e, ClientEvent::Message(_)))
    );
}

#[test]
fn v2_a_wrong_device_id_looks_like_a_wrong_proof() {
    let mut p = Pair::new(21, true, true, LinkFaults::perfect());
    p.run_for(Duration::from_secs(1));
    let ticket = p
        .client_events
        .iter()
        .find_map(|e| match e {
            ClientEvent::Connected { ticket, .. } => ticket.clone(),
            _ => None,
        })
        .expect("ticket");
    // Another device presents the ticket: SESSION_EXPIRED, as for a bad proof.
    let mut record = p.sessions.get(&ticket.session_id).cloned().expect("stored");
    record.device.device_id = "someone-else".into();
    p.sessions.insert(ticket.session_id.clone(), record);
    p.reconnect(Some(ticket));
    p.run_for(Duration::from_secs(1));
    let refused = p
        .client_events
        .iter()
        .any(|e| matches!(e, ClientEvent::Connected { resumed: false, .. }));
    assert!(refused, "fell back to a full handshake");
    assert!(
        p.server_events
            .iter()
            .all(|e| !matches!(e, ServerEvent::Resumed { .. }))
    );
}

#[test]
fn a_declared_length_is_not_an_allocation() {
    let d = Decoder::new(16 << 20);
    let mut buf = BytesMut::from(&[0x00, 0xF0, 0x00, 0x00, 1, 2, 3][..]);
    assert!(matches!(d.decode(&mut buf), Ok(None)));
    assert!(buf.capacity() < 4096, "{}", buf.capacity());
}

fn tickets(p: &Pair) -> Vec<(bool, mpush_protocol::session::ResumeTicket)> {
    p.client_events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::Connected {
                resumed,
                ticket: Some(t),
                ..
            } => Some((*resumed, t.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn v2_resume_tickets_are_single_use() {
    let mut p = Pair::new(31, true, true, LinkFaults::perfect());
    p.run_for(Duration::from_secs(1));
    let first = tickets(&p).pop().expect("ticket").1;
    // Resuming hands out the next ticket and retires the one used.
    p.reconnect(Some(first.clone()));
    p.run_for(Duration::from_secs(1));
    let (resumed, second) = tickets(&p).pop().expect("a new ticket");
    assert!(resumed);
    assert_ne!(second.session_id, first.session_id);
    assert!(
        !p.sessions.contains_key(&first.session_id),
        "the old one is gone"
    );
    // A replay of the used ticket does not resume.
    let before = p.client_events.len();
    p.reconnect(Some(first));
    p.run_for(Duration::from_secs(1));
    assert!(
        p.client_events[before..]
            .iter()
            .any(|e| matches!(e, ClientEvent::Connected { resumed: false, .. }))
    );
    // The new one does (once).
    p.reconnect(Some(second));
    p.run_for(Duration::from_secs(1));
    assert!(matches!(tickets(&p).pop(), Some((true, _))));
}

/// A FAST_CONNECT of a stored v2 session whose proof is right, over a client
/// nonce of `len` bytes: resumed, or refused as a wrong proof is.
fn resume_with_nonce(len: usize) -> (Vec<Frame>, Vec<ServerEvent>) {
    use mpush_protocol::crypto::{ResumeKey, ResumeProofs};
    use mpush_protocol::message::{FastConnect, v2};
    use mpush_protocol::session::{SessionRecord, SessionSecret};
    let (mut s, now) = server_with(|_| {});
    let key = ResumeKey([7; 32]);
    let (sid, dev) = ("0123456789abcdef0123456789abcdef", test_device().device_id);
    let nonce = vec![9u8; len];
    let fc = FastConnect {
        session_id: sid.into(),
        device_id: dev.clone(),
        proof: Some(v2::ResumeProof {
            capabilities: Some(v2::Capabilities::v2()),
            client_nonce: nonce.clone(),
            proof: ResumeProofs::new(&key).client(sid, &dev, &nonce).to_vec(),
        }),
        ..Default::default()
    };
    s.handle_input(&plain(&fc, 1), now);
    let (_, asked) = drain(&mut s);
    assert!(
        asked
            .iter()
            .any(|e| matches!(e, ServerEvent::ResumeRequested { .. })),
        "{asked:?}"
    );
    let record = SessionRecord {
        session_id: sid.into(),
        device: test_device(),
        secret: SessionSecret::V2 { resume_key: key },
        expire_at_ms: i64::MAX,
        binding: None,
    };
    s.handle_answer(Answer::Session(Some(record)), now);
    drain(&mut s)
}

#[test]
fn a_resume_nonce_outside_the_profiles_lengths_is_refused_as_a_wrong_proof() {
    use mpush_protocol::message::v2::RESUME_NONCE_LEN;
    let resumed = |events: &[ServerEvent]| {
        events
            .iter()
            .any(|e| matches!(e, ServerEvent::Resumed { .. }))
    };
    // The bounds themselves resume (this crate's clients send 16).
    for len in [*RESUME_NONCE_LEN.start(), 32, *RESUME_NONCE_LEN.end()] {
        let (frames, events) = resume_with_nonce(len);
        assert!(resumed(&events), "{len}: {events:?}");
        assert!(
            frames
                .iter()
                .any(|f| matches!(f, Frame::Packet(p) if p.cmd == Command::FAST_CONNECT)),
            "{len}"
        );
    }
    // Shorter or longer, even with the right proof: SESSION_EXPIRED, the
    // answer to a wrong proof, and the connection stays open for the full
    // handshake the client falls back to.
    for len in [
        0,
        RESUME_NONCE_LEN.start() - 1,
        RESUME_NONCE_LEN.end() + 1,
        8 << 10,
    ] {
        let (frames, events) = resume_with_nonce(len);
        assert!(!resumed(&events), "{len}: {events:?}");
        assert_eq!(
            error_code(&frames).map(|e| e.0),
            Some(ErrorCode::SESSION_EXPIRED.0),
            "{len}"
        );
        assert!(closed_by(&events).is_none(), "{len}: {events:?}");
    }
}

/// What a v2 client with a ticket makes of a FAST_CONNECT_OK whose proof is
/// right, over a server nonce of `len` bytes.
fn client_given_server_nonce(len: usize) -> Vec<ClientEvent> {
    use mpush_protocol::crypto::{ResumeKey, resume_accept_proof};
    use mpush_protocol::message::{FastConnect, FastConnectOk, v2};
    use mpush_protocol::session::{ResumeTicket, SessionSecret};
    let now = Instant::now();
    let key = ResumeKey([7; 32]);
    let mut cfg = ClientConfig::new(Arc::new(default_key().public()), test_device());
    cfg.offer_v2 = true;
    let ticket = ResumeTicket {
        session_id: "0123456789abcdef0123456789abcdef".into(),
        expire_at_ms: i64::MAX,
        secret: SessionSecret::V2 {
            resume_key: key.clone(),
        },
    };
    let mut c = ClientConnection::new(
        Arc::new(cfg),
        [5; 32],
        now,
        0,
        Some(ticket),
        DedupWindow::default(),
    );
    let hello = c.poll_transmit().expect("fast connect");
    let d = Decoder::new(1 << 20);
    let mut buf = BytesMut::from(&hello[..]);
    let Ok(Some(Frame::Packet(p))) = d.decode(&mut buf) else {
        panic!("not a packet");
    };
    assert_eq!(p.cmd, Command::FAST_CONNECT);
    let fc = FastConnect::from_bytes(&p.body).expect("fast connect");
    let cn = fc.proof.expect("a v2 proof").client_nonce;
    let sn = vec![4u8; len];
    let ok = FastConnectOk {
        heartbeat: 180_000,
        accept: Some(v2::ResumeAccept {
            proof: resume_accept_proof(&key, &cn, &sn),
            server_nonce: sn,
            next_session_id: "fedcba9876543210fedcba9876543210".into(),
            next_expire_at_ms: i64::MAX,
            bound: false,
        }),
    };
    c.handle_input(&plain(&ok, p.session_id), now);
    std::iter::from_fn(|| c.poll_event()).collect()
}

#[test]
fn a_client_refuses_a_server_nonce_outside_the_profiles_lengths() {
    use mpush_protocol::message::v2::RESUME_NONCE_LEN;
    let resumed = |events: &[ClientEvent]| {
        events
            .iter()
            .any(|e| matches!(e, ClientEvent::Connected { resumed: true, .. }))
    };
    for len in [*RESUME_NONCE_LEN.start(), *RESUME_NONCE_LEN.end()] {
        let events = client_given_server_nonce(len);
        assert!(resumed(&events), "{len}: {events:?}");
    }
    for len in [0, RESUME_NONCE_LEN.end() + 1, 8 << 10] {
        let events = client_given_server_nonce(len);
        assert!(!resumed(&events), "{len}: {events:?}");
        assert!(
            events
                .iter()
                .any(|e| matches!(e, ClientEvent::Closed { .. })),
            "{len}: {events:?}"
        );
    }
}
