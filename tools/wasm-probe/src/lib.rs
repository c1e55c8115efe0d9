//! A wasm module that runs a whole client/server exchange through the protocol
//! machines, so that every code path a browser SDK needs is linked in and the
//! module's imports can be checked: it must import nothing from `env` (no
//! libc, no OS randomness, no clock behind the protocol's back).

use std::sync::Arc;

use mpush_protocol::client::{ClientConfig, ClientConnection, ClientEvent};
use mpush_protocol::dedup::DedupWindow;
use mpush_protocol::server::{Answer, OutboundPush, ServerConfig, ServerConnection, ServerEvent};
use mpush_protocol::session::AckMode;
use mpush_protocol::testing::{default_key, test_device};

/// Handshake, bind and one push with an ACK; returns the messages received
/// (1 on success). `seed` feeds both machines' RNGs.
#[unsafe(no_mangle)]
pub extern "C" fn mpush_probe(seed: u64, v2: u32) -> u32 {
    let now = mpush_protocol::Instant::now();
    let key = default_key();
    let mut sc = ServerConfig::new(key.clone());
    sc.enable_v2 = v2 != 0;
    let mut server = ServerConnection::new(Arc::new(sc), [seed as u8; 32], now, 0);
    let mut cc = ClientConfig::new(Arc::new(key.public()), test_device());
    cc.offer_v2 = v2 != 0;
    let mut client = ClientConnection::new(
        Arc::new(cc),
        [seed as u8 ^ 0xFF; 32],
        now,
        0,
        None,
        DedupWindow::default(),
    );
    let mut received = 0;
    let mut bound = false;
    for _ in 0..16 {
        while let Some(b) = client.poll_transmit() {
            server.handle_input(&b, now);
        }
        while let Some(e) = server.poll_event() {
            if let ServerEvent::BindRequested {
                request, user_id, ..
            } = e
            {
                server.handle_answer(
                    Answer::Bind {
                        request,
                        user_id,
                        result: Ok(()),
                    },
                    now,
                );
            }
        }
        while let Some(b) = server.poll_transmit() {
            client.handle_input(&b, now);
        }
        while let Some(e) = client.poll_event() {
            match e {
                ClientEvent::Connected { .. } => {
                    let _ = client.bind("u", "", "", now);
                }
                ClientEvent::BindOk { .. } if !bound => {
                    bound = true;
                    let _ = server.push(
                        OutboundPush {
                            message_id: 1,
                            trace_id: "".into(),
                            content: bytes::Bytes::from_static(b"hi"),
                            ack_mode: AckMode::Auto,
                            expires_at_ms: 0,
                            ack_timeout: None,
                            queued_at: None,
                        },
                        now,
                    );
                }
                ClientEvent::Message(_) => received += 1,
                _ => {}
            }
        }
    }
    received
}

/// Runs a client `Session` (sdk-core) against an in-memory server through a
/// handshake and a bind; returns 1 when the session reports the bind.
#[unsafe(no_mangle)]
pub extern "C" fn mpush_session_probe(seed: u64) -> u32 {
    use mpush_sdk_core::{Action, Session, SessionConfig, SessionEvent};
    let now = mpush_protocol::Instant::now();
    let key = default_key();
    let cfg = SessionConfig::new(
        vec!["server:1".into()],
        Arc::new(key.public()),
        test_device(),
    );
    let mut session = Session::new(cfg, None, [seed as u8; 32], now, 0);
    let mut server = ServerConnection::new(Arc::new(ServerConfig::new(key)), [1; 32], now, 0);
    let _ = session.bind("u", "", "", now);
    for _ in 0..16 {
        while let Some(a) = session.poll_action() {
            match a {
                Action::Open { .. } => session.handle_opened(now),
                Action::Send(b) => server.handle_input(&b, now),
                _ => {}
            }
        }
        while let Some(e) = server.poll_event() {
            if let ServerEvent::BindRequested {
                request, user_id, ..
            } = e
            {
                server.handle_answer(
                    Answer::Bind {
                        request,
                        user_id,
                        result: Ok(()),
                    },
                    now,
                );
            }
        }
        while let Some(b) = server.poll_transmit() {
            session.handle_input(&b, now);
        }
        while let Some(e) = session.poll_event() {
            if matches!(e, SessionEvent::BindResult { ok: true, .. }) {
                return 1;
            }
        }
    }
    0
}

#[cfg(test)]
mod tests {
    #[test]
    fn session_probe_binds() {
        assert_eq!(super::mpush_session_probe(3), 1);
    }

    #[test]
    fn probe_delivers_one_message_on_each_profile() {
        assert_eq!(super::mpush_probe(7, 0), 1);
        assert_eq!(super::mpush_probe(7, 1), 1);
    }
}
