//! The server's RSA private-key operation on one handshake block (mpush's
//! default 1024-bit key, blinded), by each library the server can use: the
//! pure-Rust `rsa` crate and OpenSSL (feature `openssl-rsa`, the server's
//! default). Run: `cargo bench -p mpush-protocol --features openssl-rsa --bench rsa`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use mpush_protocol::crypto::{Rng, RsaPrivate, RsaPublic};
use rand_core::SeedableRng;

fn decrypt(c: &mut Criterion) {
    let key = RsaPrivate::mpush_default();
    assert_eq!(key.backend(), "openssl");
    let pure = key.without_openssl();
    let mut rng = Rng::seed_from_u64(1);
    // A handshake body's size: one block.
    let block = RsaPublic::mpush_default()
        .encrypt(&mut rng, &[7u8; 100])
        .expect("encrypts");
    let mut g = c.benchmark_group("rsa-1024 private-key operation");
    g.bench_function("openssl", |b| {
        b.iter(|| key.decrypt(&mut rng, black_box(&block)).expect("decrypts"))
    });
    g.bench_function("rsa crate", |b| {
        b.iter(|| pure.decrypt(&mut rng, black_box(&block)).expect("decrypts"))
    });
    g.finish();
}

criterion_group!(benches, decrypt);
criterion_main!(benches);
