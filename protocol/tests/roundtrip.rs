//! Property tests: every message type round-trips, the frame decoder accepts
//! any split of a valid stream, and no byte sequence panics a machine.

use std::sync::Arc;

use bytes::BytesMut;
use mpush_protocol::client::ClientConnection;
use mpush_protocol::dedup::DedupWindow;
use mpush_protocol::message::json::JsonPacket;
use mpush_protocol::message::{
    Ack, BindUser, Body, ErrorCode, ErrorMessage, FastConnect, FastConnectOk, GatewayKick,
    GatewayPush, Handshake, HandshakeOk, HttpMethod, HttpRequest, HttpResponse, Kick, OkMessage,
    Push, Redirect, v2,
};
use mpush_protocol::packet::{Command, Decoder, Flags, Frame, Packet};
use mpush_protocol::server::{ServerConfig, ServerConnection};
use mpush_protocol::testing::{default_key, test_device};
use mpush_protocol::{Instant, client::ClientConfig};
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    // Includes non-ASCII; lengths cross no prefix boundary here (see `long_bytes`).
    "\\PC{0,40}"
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

// Profile 0 with no features encodes to nothing and reads back as absent.
fn caps() -> impl Strategy<Value = Option<v2::Capabilities>> {
    prop::option::of(
        (1..=u32::MAX, any::<u32>())
            .prop_map(|(profile, features)| v2::Capabilities { profile, features }),
    )
}

fn round_trip<B: Body + PartialEq + std::fmt::Debug>(m: B) -> Result<(), TestCaseError> {
    let back = B::from_bytes(&m.to_bytes()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(back, m);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn handshake(d in text(), o in text(), ov in text(), cv in text(), iv in bytes(20), k in bytes(20),
                 min in any::<i32>(), max in any::<i32>(), ts in any::<i64>(), c in caps()) {
        round_trip(Handshake { device_id: d, os_name: o, os_version: ov, client_version: cv, iv, client_key: k,
            min_heartbeat: min, max_heartbeat: max, timestamp: ts, capabilities: c })?;
    }

    #[test]
    fn handshake_ok(k in bytes(20), hb in any::<i32>(), s in text(), e in any::<i64>(), c in caps()) {
        round_trip(HandshakeOk { server_key: k, heartbeat: hb, session_id: s, expire_time: e, capabilities: c })?;
    }

    #[test]
    fn fast_connect(s in text(), d in text(), a in any::<i32>(), b in any::<i32>(),
                    proof in prop::option::of((bytes(17), bytes(33)))) {
        round_trip(FastConnect { session_id: s, device_id: d, min_heartbeat: a, max_heartbeat: b,
            proof: proof.map(|(n, p)| v2::ResumeProof { capabilities: Some(v2::Capabilities::v2()), client_nonce: n, proof: p }) })?;
    }

    #[test]
    fn fast_connect_ok(hb in any::<i32>(), accept in prop::option::of((prop::collection::vec(any::<u8>(), 1..17), bytes(33)))) {
        round_trip(FastConnectOk { heartbeat: hb,
            accept: accept.map(|(n, p)| v2::ResumeAccept { server_nonce: n, proof: p, ..Default::default() }) })?;
    }

    #[test]
    fn bind(u in text(), d in text(), t in text()) {
        round_trip(BindUser { user_id: u, data: d, tags: t })?;
    }

    #[test]
    fn ok_and_error(cmd in any::<u8>(), code in any::<u8>(), a in text(), b in text()) {
        round_trip(OkMessage { cmd, code, data: a.clone() })?;
        round_trip(ErrorMessage { cmd, code: ErrorCode(code), reason: a, data: b })?;
    }

    #[test]
    fn push_kick_ack_redirect(c in bytes(200), d in text(), u in text(), ids in prop::collection::vec(any::<u64>(), 0..20),
                              r in any::<u32>(), j in any::<u32>()) {
        round_trip(Push { content: c })?;
        round_trip(Kick { device_id: d.clone(), user_id: u.clone() })?;
        round_trip(Ack { message_ids: ids })?;
        round_trip(Redirect { address: d, retry_after_ms: r, jitter_ms: j, reason: u })?;
    }

    #[test]
    fn http(m in 0u8..4, uri in text(), h in text(), body in bytes(300), status in any::<i32>()) {
        round_trip(HttpRequest { method: HttpMethod::from_byte(m), uri, headers: h.clone(), body: body.clone() })?;
        round_trip(HttpResponse { status_code: status, reason_phrase: h.clone(), headers: h, body })?;
    }

    #[test]
    fn gateway(u in text(), ct in any::<i32>(), to in any::<i32>(), c in bytes(100), t in text(), port in any::<i32>()) {
        round_trip(GatewayPush { user_id: u.clone(), client_type: ct, timeout: to, content: c, task_id: t.clone(),
            tags: t.clone(), condition: u.clone() })?;
        round_trip(GatewayKick { user_id: u.clone(), device_id: t.clone(), conn_id: u, client_type: ct,
            target_server: t, target_port: port })?;
    }

    #[test]
    fn long_bytes(len in prop::sample::select(vec![32766usize, 32767, 32768, 40000, 70000])) {
        round_trip(HttpResponse { body: vec![7; len], ..Default::default() })?;
    }

    #[test]
    fn json_packets(cmd in any::<u8>(), flags in any::<u8>(), sid in any::<i32>(), content in text()) {
        let mut p = mpush_protocol::message::json::push(sid, content.as_bytes(), Flags::AUTO_ACK);
        p.cmd = Command(cmd);
        p.flags = Flags(flags);
        let back = JsonPacket::parse(&p.to_text()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back, p);
    }

    /// Any split of a valid stream decodes to the same frames.
    #[test]
    fn frames_survive_any_split(bodies in prop::collection::vec(bytes(64), 1..8), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..10)) {
        let frames: Vec<Frame> = bodies.into_iter().enumerate().map(|(i, b)| {
            if b.len() == 1 { Frame::Heartbeat } else { Frame::Packet(Packet::new(Command(15), i as i32, Flags::CRYPTO, b)) }
        }).collect();
        let mut wire = BytesMut::new();
        for f in &frames { f.encode(&mut wire); }
        let mut cut_at: Vec<usize> = cuts.iter().map(|c| c.index(wire.len() + 1)).collect();
        cut_at.push(wire.len());
        cut_at.sort_unstable();
        let d = Decoder::default();
        let (mut buf, mut got, mut from) = (BytesMut::new(), Vec::new(), 0);
        for to in cut_at {
            buf.extend_from_slice(&wire[from..to]);
            from = to;
            while let Some(f) = d.decode(&mut buf).map_err(|e| TestCaseError::fail(e.to_string()))? { got.push(f); }
        }
        prop_assert_eq!(got, frames);
    }

    /// Network bytes never panic either machine, whatever state it is in.
    #[test]
    fn machines_survive_garbage(chunks in prop::collection::vec(bytes(64), 1..6), framed in any::<bool>(), cmd in any::<u8>(), flags in any::<u8>()) {
        let now = Instant::now();
        let key = default_key();
        let mut server = ServerConnection::new(Arc::new(ServerConfig::new(key.clone())), [1; 32], now, 0);
        let mut client = ClientConnection::new(Arc::new(ClientConfig::new(Arc::new(key.public()), test_device())),
            [2; 32], now, 0, None, DedupWindow::default());
        for c in chunks {
            let input = if framed { Frame::Packet(Packet::new(Command(cmd), 1, Flags(flags), c)).to_bytes().to_vec() } else { c };
            server.handle_input(&input, now);
            client.handle_input(&input, now);
            while server.poll_transmit().is_some() || server.poll_event().is_some() {}
            while client.poll_transmit().is_some() || client.poll_event().is_some() {}
        }
        server.handle_timeout(now + std::time::Duration::from_secs(3600));
        client.handle_timeout(now + std::time::Duration::from_secs(3600));
    }
}
