//! Arbitrary bytes into a ServerConnection, before and after a real handshake:
//! the server may close, but never panics.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use mpush_protocol::server::{Answer, ServerConfig, ServerConnection, ServerEvent};
use mpush_protocol::testing::{LinkFaults, Pair};
use mpush_protocol::Instant;

fn config() -> Arc<ServerConfig> {
    static C: OnceLock<Arc<ServerConfig>> = OnceLock::new();
    C.get_or_init(|| Arc::new(ServerConfig::new(mpush_protocol::testing::default_key())))
        .clone()
}

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    let mut fresh = ServerConnection::new(config(), [1; 32], now, 0);
    fresh.handle_input(data, now);
    while fresh.poll_transmit().is_some() {}
    while fresh.poll_event().is_some() {}

    // Half the inputs also hit an established session (slower: a real RSA
    // handshake runs first), then garbage from the "client".
    if data.first().is_none_or(|b| b & 0x80 == 0) {
        return;
    }
    let mut pair = Pair::new(data.len() as u64, data.first().is_some_and(|b| b & 1 == 1), true, LinkFaults::perfect());
    pair.run_for(std::time::Duration::from_secs(1));
    let t = pair.now;
    pair.server.handle_input(data, t);
    while pair.server.poll_transmit().is_some() {}
    while let Some(e) = pair.server.poll_event() {
        if let ServerEvent::ResumeRequested { .. } = e {
            pair.server.handle_answer(Answer::Session(None), t);
        }
    }
});
