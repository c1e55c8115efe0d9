//! The frame decoder: never panics, consumes nothing when it needs more bytes,
//! and every frame it returns re-encodes to bytes that decode to the same frame.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mpush_protocol::packet::Decoder;

fuzz_target!(|data: &[u8]| {
    let decoder = Decoder::new(64 * 1024);
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.clone();
        match decoder.decode(&mut buf) {
            Ok(Some(frame)) => {
                assert!(buf.len() < before.len(), "a frame consumes bytes");
                let mut again = BytesMut::from(&frame.to_bytes()[..]);
                assert_eq!(decoder.decode(&mut again), Ok(Some(frame)));
                assert!(again.is_empty());
            }
            Ok(None) => {
                assert_eq!(buf, before);
                break;
            }
            Err(_) => break,
        }
    }
});
