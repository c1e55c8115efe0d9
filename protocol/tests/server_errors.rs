//! How `ServerConnection` answers bad input (spec sections 4 and 6.4), and that
//! it reassembles input that arrives one byte at a time.

use std::sync::Arc;

use mpush_protocol::client::{ClientConfig, ClientConnection, ClientEvent};
use mpush_protocol::dedup::DedupWindow;
use mpush_protocol::message::{BindUser, Body, ErrorCode, ErrorMessage};
use mpush_protocol::packet::{Command, Flags, Frame, Packet};
use mpush_protocol::server::{CloseReason, ServerConfig, ServerConnection, ServerEvent};
use mpush_protocol::testing::{default_key, test_device};
use mpush_protocol::{Instant, ProtocolError};

fn server() -> (ServerConnection, Instant) {
    let now = Instant::now();
    let s = ServerConnection::new(Arc::new(ServerConfig::new(default_key())), [3; 32], now, 0);
    (s, now)
}

use mpush_protocol::testing::drain_server as drain;

fn error_of(frames: &[Frame]) -> ErrorMessage {
    frames
        .iter()
        .find_map(|f| match f {
            Frame::Packet(p) if p.cmd == Command::ERROR => ErrorMessage::from_bytes(&p.body).ok(),
            _ => None,
        })
        .expect("an ERROR was sent")
}

fn packet(cmd: Command, flags: Flags, body: Vec<u8>) -> Vec<u8> {
    Frame::Packet(Packet::new(cmd, 9, flags, body))
        .to_bytes()
        .to_vec()
}

#[test]
fn unsupported_command_gets_101_and_close() {
    let (mut s, now) = server();
    s.handle_input(&packet(Command(99), Flags::NONE, vec![]), now);
    let (frames, events) = drain(&mut s);
    let e = error_of(&frames);
    assert_eq!((e.cmd, e.code), (99, ErrorCode::UNSUPPORTED_CMD));
    assert!(s.is_closed());
    assert!(matches!(
        events.last(),
        Some(ServerEvent::Closed {
            reason: CloseReason::UnsupportedCommand(Command(99)),
            ..
        })
    ));
}

#[test]
fn heartbeats_are_echoed() {
    let (mut s, now) = server();
    s.handle_input(&[0xDF, 0xDF], now);
    let (frames, _) = drain(&mut s);
    assert_eq!(frames, vec![Frame::Heartbeat, Frame::Heartbeat]);
}

#[test]
fn oversized_and_negative_frames_close_with_an_error() {
    for header in [[0u8, 0, 0x28, 0x01], [0xFF, 0xFF, 0xFF, 0xF0]] {
        let (mut s, now) = server();
        s.handle_input(&header, now);
        let (frames, events) = drain(&mut s);
        assert_eq!(error_of(&frames).code, ErrorCode::DISPATCH_ERROR);
        assert!(matches!(
            events.last(),
            Some(ServerEvent::Closed {
                reason: CloseReason::Protocol(ProtocolError::Frame(_)),
                ..
            })
        ));
    }
}

#[test]
fn undecryptable_handshake_gets_100_and_close() {
    let (mut s, now) = server();
    s.handle_input(
        &packet(Command::HANDSHAKE, Flags::CRYPTO, vec![0x55; 128]),
        now,
    );
    let (frames, events) = drain(&mut s);
    let e = error_of(&frames);
    assert_eq!(
        (e.cmd, e.code),
        (Command::HANDSHAKE.0, ErrorCode::DISPATCH_ERROR)
    );
    assert!(s.is_closed());
    assert!(matches!(
        events.last(),
        Some(ServerEvent::Closed {
            reason: CloseReason::Protocol(_),
            ..
        })
    ));
}

#[test]
fn handshake_with_bad_parameters_is_param_invalid() {
    let (mut s, now) = server();
    // A plaintext handshake (accepted, as mpush does) with a 3-byte key.
    let hs = mpush_protocol::message::Handshake {
        device_id: "d".into(),
        iv: vec![0; 16],
        client_key: vec![0; 3],
        ..Default::default()
    };
    s.handle_input(&packet(Command::HANDSHAKE, Flags::NONE, hs.to_bytes()), now);
    let (frames, _) = drain(&mut s);
    let e = error_of(&frames);
    assert_eq!(
        (e.code, e.reason.as_str()),
        (ErrorCode::NONE, "Param invalid")
    );
    assert!(s.is_closed());
}

#[test]
fn bind_before_handshake_is_refused() {
    let (mut s, now) = server();
    let body = BindUser {
        user_id: "u".into(),
        ..Default::default()
    }
    .to_bytes();
    s.handle_input(&packet(Command::BIND, Flags::NONE, body), now);
    let (frames, _) = drain(&mut s);
    assert_eq!(error_of(&frames).reason, "not handshake");
    assert!(s.is_closed());
}

#[test]
fn truncated_body_is_a_dispatch_error() {
    let (mut s, now) = server();
    s.handle_input(
        &packet(Command::FAST_CONNECT, Flags::NONE, vec![0, 9, 1]),
        now,
    );
    let (frames, _) = drain(&mut s);
    assert_eq!(error_of(&frames).code, ErrorCode::DISPATCH_ERROR);
}

#[test]
fn a_handshake_fed_one_byte_at_a_time_completes() {
    let now = Instant::now();
    let key = default_key();
    let mut server =
        ServerConnection::new(Arc::new(ServerConfig::new(key.clone())), [4; 32], now, 0);
    let mut client = ClientConnection::new(
        Arc::new(ClientConfig::new(Arc::new(key.public()), test_device())),
        [5; 32],
        now,
        0,
        None,
        DedupWindow::default(),
    );
    let hello = client.poll_transmit().expect("handshake");
    for b in hello.iter() {
        server.handle_input(&[*b], now);
    }
    let reply = server.poll_transmit().expect("handshake ok");
    for b in reply.iter() {
        client.handle_input(&[*b], now);
    }
    assert!(matches!(
        client.poll_event(),
        Some(ClientEvent::Connected { resumed: false, .. })
    ));
    assert!(server.is_established() && client.is_established());
}

/// `FEATURE_PLAIN_BODIES` (the browser's transport-only build has no zlib):
/// a client that sets it gets its large pushes uncompressed, and the server
/// echoes the bit; without it the same push is compressed, as before.
#[test]
fn a_client_that_does_not_inflate_gets_plain_bodies() {
    use mpush_protocol::message::{Handshake, HandshakeOk, v2};
    use mpush_protocol::server::OutboundPush;
    let big = vec![b'a'; 64 * 1024];
    for plain in [true, false] {
        let (mut s, now) = server();
        s.set_transport_secured(true);
        let features = if plain {
            v2::FEATURE_TRANSPORT | v2::FEATURE_PLAIN_BODIES
        } else {
            v2::FEATURE_TRANSPORT
        };
        let device = test_device();
        let hs = Handshake {
            device_id: device.device_id,
            os_name: device.os_name,
            os_version: device.os_version,
            client_version: device.client_version,
            capabilities: Some(v2::Capabilities {
                profile: v2::PROFILE,
                features,
            }),
            ..Handshake::default()
        };
        s.handle_input(&packet(Command::HANDSHAKE, Flags::NONE, hs.to_bytes()), now);
        let (frames, _) = drain(&mut s);
        let ok = frames
            .iter()
            .find_map(|f| match f {
                Frame::Packet(p) if p.cmd == Command::HANDSHAKE => {
                    HandshakeOk::from_bytes(&p.body).ok()
                }
                _ => None,
            })
            .expect("HANDSHAKE_OK");
        let caps = ok.capabilities.expect("capabilities");
        assert!(caps.has_transport());
        assert_eq!(caps.wants_plain_bodies(), plain, "the bit is echoed");

        s.push(
            OutboundPush {
                message_id: 1,
                trace_id: "t".into(),
                content: big.clone().into(),
                ack_mode: mpush_protocol::session::AckMode::None,
                expires_at_ms: 0,
                ack_timeout: None,
                queued_at: None,
            },
            now,
        )
        .expect("push");
        let (frames, _) = drain(&mut s);
        let push = frames
            .iter()
            .find_map(|f| match f {
                Frame::Packet(p) if p.cmd == Command::PUSH => Some(p.clone()),
                _ => None,
            })
            .expect("PUSH");
        assert_eq!(!push.flags.contains(Flags::COMPRESS), plain);
        if plain {
            assert!(push.body.len() > big.len(), "{}", push.body.len());
        } else {
            assert!(push.body.len() < big.len() / 10, "{}", push.body.len());
        }
    }
}
