//! Arbitrary bytes into a ClientConnection (what a hostile or broken server
//! could send): while it waits for HANDSHAKE_OK, and on an established v2 or
//! legacy session. The client may close, but never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mpush_protocol::testing::{LinkFaults, Pair};

fuzz_target!(|data: &[u8]| {
    let v2 = data.first().is_some_and(|b| b & 1 == 1);
    // Before the handshake answer.
    let mut fresh = Pair::new(7, v2, true, LinkFaults::perfect());
    let t = fresh.now;
    fresh.client.handle_input(data, t);
    while fresh.client.poll_transmit().is_some() {}
    while fresh.client.poll_event().is_some() {}
    fresh.client.handle_timeout(t + std::time::Duration::from_secs(60));

    // On an established session (a real handshake first).
    if data.first().is_none_or(|b| b & 0x80 == 0) {
        return;
    }
    let mut pair = Pair::new(data.len() as u64, v2, true, LinkFaults::perfect());
    pair.run_for(std::time::Duration::from_secs(1));
    let t = pair.now;
    pair.client.handle_input(data, t);
    while pair.client.poll_transmit().is_some() {}
    while pair.client.poll_event().is_some() {}
});
