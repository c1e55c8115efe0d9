//! Every body decoder and the WebSocket JSON parser: never panic; whatever
//! decodes re-encodes to something that decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mpush_protocol::message::json::JsonPacket;
use mpush_protocol::message::*;

fn check<B: Body + PartialEq + std::fmt::Debug>(data: &[u8]) {
    if let Ok(m) = B::from_bytes(data) {
        let again = B::from_bytes(&m.to_bytes()).expect("re-encoded body decodes");
        assert_eq!(again, m);
    }
}

fuzz_target!(|data: &[u8]| {
    check::<Handshake>(data);
    check::<HandshakeOk>(data);
    check::<FastConnect>(data);
    check::<FastConnectOk>(data);
    check::<BindUser>(data);
    check::<OkMessage>(data);
    check::<ErrorMessage>(data);
    check::<Kick>(data);
    check::<Ack>(data);
    check::<Redirect>(data);
    check::<HttpRequest>(data);
    check::<HttpResponse>(data);
    check::<GatewayPush>(data);
    check::<GatewayKick>(data);
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(p) = JsonPacket::parse(text) {
            let _ = JsonPacket::parse(&p.to_text()).expect("rendered JSON parses");
        }
    }
});
