//! Encode + seal and open + decode of a 64-byte push, legacy (AES-CBC, raw body)
//! and v2 (AES-GCM, protobuf envelope), and a burst of eight sealed with the key
//! schedule expanded for each or kept. Run: `cargo bench -p mpush-protocol`.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mpush_protocol::crypto::{AesKey, Rng, SessionCipher};
use mpush_protocol::message::v2;
use mpush_protocol::packet::{Command, Decoder, Flags, Frame};
use mpush_protocol::seal::{Sealer, Side};
use rand_core::SeedableRng;

const CONTENT: [u8; 64] = [b'x'; 64];

fn sealer(side: Side, v2: bool) -> Sealer {
    let mut s = Sealer::new(side, 10 * 1024, 1 << 20);
    let key = AesKey([7; 16]);
    s.set_cipher(Some(if v2 {
        SessionCipher::gcm(&key)
    } else {
        SessionCipher::cbc(&key, [9; 16])
    }));
    s
}

fn encode(s: &Sealer, rng: &mut Rng, v2: bool, id: u64, out: &mut BytesMut) {
    let body: Bytes = if v2 {
        prost::Message::encode_to_vec(&v2::PushEnvelope {
            message_id: id,
            trace_id: "0123456789abcdef".into(),
            content: CONTENT.to_vec(),
            ack_mode: v2::AckMode::Auto as i32,
            expires_at_ms: 0,
        })
        .into()
    } else {
        Bytes::from_static(&CONTENT)
    };
    let p = s.seal(rng, Command::PUSH, id as i32, Flags::AUTO_ACK, &body);
    Frame::Packet(p).encode(out);
}

fn decode(s: &Sealer, v2: bool, wire: &mut BytesMut) -> usize {
    let Ok(Some(Frame::Packet(p))) = Decoder::default().decode(wire) else {
        panic!("frame");
    };
    let body = s.open(&p).expect("opens");
    if v2 {
        let env: v2::PushEnvelope = prost::Message::decode(body).expect("envelope");
        env.content.len()
    } else {
        body.len()
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("push_64B");
    g.throughput(Throughput::Elements(1));
    for (name, v2) in [("legacy", false), ("v2", true)] {
        let s = sealer(Side::Server, v2);
        let client = sealer(Side::Client, v2);
        let mut rng = Rng::seed_from_u64(1);
        let mut out = BytesMut::with_capacity(4096);
        g.bench_function(format!("{name}/encode+seal"), |b| {
            b.iter(|| {
                out.clear();
                encode(&s, &mut rng, v2, 42, &mut out);
                black_box(out.len())
            })
        });
        let mut wire = BytesMut::new();
        encode(&s, &mut rng, v2, 42, &mut wire);
        let wire = wire.freeze();
        println!(
            "{name}: {} bytes on the wire for a 64-byte push",
            wire.len()
        );
        g.bench_function(format!("{name}/open+decode"), |b| {
            b.iter(|| {
                let mut buf = BytesMut::from(&wire[..]);
                black_box(decode(&client, v2, &mut buf))
            })
        });
    }
    g.finish();

    // Eight pushes to one connection before its write: each sealed with the
    // key schedule expanded for it, or the schedule expanded once and kept
    // for the burst (what the server machine does when a packet already
    // waits for the write).
    let mut g = c.benchmark_group("push_64B_burst_of_8");
    g.throughput(Throughput::Elements(8));
    for (name, v2) in [("legacy", false), ("v2", true)] {
        let body = if v2 {
            prost::Message::encode_to_vec(&v2::PushEnvelope {
                message_id: 42,
                trace_id: "0123456789abcdef".into(),
                content: CONTENT.to_vec(),
                ack_mode: v2::AckMode::Auto as i32,
                expires_at_ms: 0,
            })
        } else {
            CONTENT.to_vec()
        };
        for (how, burst) in [("one by one", false), ("schedule kept", true)] {
            let mut s = sealer(Side::Server, v2);
            s.count_nonces([1, 2, 3, 4]);
            let mut out = BytesMut::with_capacity(4096);
            g.bench_function(format!("{name}/{how}"), |b| {
                b.iter(|| {
                    out.clear();
                    for i in 0..8 {
                        let p = s.seal_counted(
                            Command::PUSH,
                            i,
                            Flags::AUTO_ACK,
                            &body,
                            burst && i > 0,
                        );
                        Frame::Packet(p).encode(&mut out);
                    }
                    s.cool();
                    black_box(out.len())
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
