//! Reads every test vector in `testdata/vectors/` and checks encode and decode
//! byte for byte. The same files are read by the binding tests of other
//! languages; changing one is a protocol change.

use std::path::Path;

use mpush_protocol::conformance::check_vector;
use mpush_protocol::crypto::{Rng, RsaPrivate, RsaPublic};
use mpush_protocol::message::{Body, Handshake};
use rand_core::SeedableRng;
use serde_json::Value;

fn unhex(v: &Value) -> Vec<u8> {
    hex::decode(v.as_str().unwrap_or_default()).expect("hex field")
}

#[test]
fn every_vector_matches() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/vectors");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("vector dir") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read"))
            .expect("valid JSON");
        let name = check_vector(&v).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        names.push(name);
    }
    names.sort();
    // Guard against an empty or half-read directory.
    for must in [
        "handshake_plain",
        "handshakeok_aes",
        "bind_packet",
        "v2_keys",
        "token_dat",
    ] {
        assert!(names.iter().any(|n| n == must), "missing vector {must}");
    }
    assert!(names.len() >= 20, "{names:?}");
}

/// The spec's vectors are all legacy: decode the spec handshake after a round
/// trip through mpush's real default key pair, with the stripped private key.
#[test]
fn handshake_sealed_with_the_default_public_key_opens_with_the_stripped_private_key() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/vectors");
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("handshake_plain.json")).expect("read"),
    )
    .expect("json");
    let plain = unhex(&v["hex"]);
    let public = RsaPublic::mpush_default();
    let stripped = RsaPrivate::mpush_default();
    let full = RsaPrivate::from_text(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("testdata/mpush-default-rsa-private-pkcs8.pem"),
        )
        .expect("pem"),
    )
    .expect("full key loads");
    let mut rng = Rng::seed_from_u64(42);
    let sealed = public.encrypt(&mut rng, &plain).expect("seals");
    assert_eq!(sealed.len(), 128, "one RSA block");
    for key in [&stripped, &full] {
        let opened = key.decrypt(&mut rng, &sealed).expect("opens");
        assert_eq!(opened, plain);
        let hs = Handshake::from_bytes(&opened).expect("decodes");
        assert_eq!(hs.device_id, "dev-1");
    }
}

/// A vector that does not match, or is malformed, is an error naming it, not a panic.
#[test]
fn a_tampered_vector_is_reported() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/vectors");
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("bind_packet.json")).expect("read"))
            .expect("json");
    let good = check_vector(&v).expect("the real vector matches");
    assert_eq!(good, "bind_packet");
    let hex = v["hex"].as_str().unwrap_or_default().to_owned();
    let flipped = format!(
        "{}{}",
        &hex[..hex.len() - 1],
        if hex.ends_with('0') { '1' } else { '0' }
    );
    v["hex"] = Value::String(flipped);
    let e = check_vector(&v).expect_err("a flipped byte is caught");
    assert!(e.0.starts_with("bind_packet: "), "{e}");
    for broken in [
        serde_json::json!({}),
        serde_json::json!({"name": "x", "kind": "packet", "hex": "zz"}),
        serde_json::json!({"name": "x", "kind": "packet", "hex": "00", "fields": {}}),
        serde_json::json!({"name": "x", "kind": "what", "hex": ""}),
    ] {
        assert!(check_vector(&broken).is_err(), "{broken}");
    }
}
