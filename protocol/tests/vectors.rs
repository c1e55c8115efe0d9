//! Reads every test vector in `testdata/vectors/` and checks encode and decode
//! byte for byte. The same files are read by the binding tests of other
//! languages; changing one is a protocol change.

use std::path::Path;

use bytes::BytesMut;
use mpush_protocol::crypto::{
    self, AesKey, ResumeKey, Rng, RsaPrivate, RsaPublic, SessionCipher, connection_key,
    legacy_session_key, resume_accept_proof, resume_proof, v2_session_keys,
};
use mpush_protocol::message::{
    Ack, BindUser, Body, ErrorCode, ErrorMessage, FastConnect, FastConnectOk, Handshake,
    HandshakeOk, HttpResponse, Kick, OkMessage, Redirect, v2,
};
use mpush_protocol::packet::{Command, Decoder, Flags, Frame, Packet};
use mpush_protocol::session::{ResumeTicket, SessionSecret};
use rand_core::SeedableRng;
use serde_json::Value;

fn unhex(v: &Value) -> Vec<u8> {
    hex::decode(v.as_str().unwrap_or_default()).expect("hex field")
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

fn i(v: &Value) -> i64 {
    v.as_i64().expect("integer field")
}

fn arr16(v: &Value) -> [u8; 16] {
    unhex(v).try_into().expect("16 bytes")
}

/// Checks that `msg` encodes to `hex` and that `hex` decodes to `msg`.
fn both_ways<B: Body + PartialEq + std::fmt::Debug>(name: &str, msg: B, hex: &[u8]) {
    assert_eq!(
        hex::encode(msg.to_bytes()),
        hex::encode(hex),
        "{name}: encode"
    );
    assert_eq!(B::from_bytes(hex).expect("decodes"), msg, "{name}: decode");
}

fn caps(f: &Value) -> Option<v2::Capabilities> {
    f.get("capabilities").map(|c| v2::Capabilities {
        profile: i(&c["profile"]) as u32,
        features: i(&c["features"]) as u32,
    })
}

fn check(v: &Value) {
    let name = v["name"].as_str().expect("name");
    let f = &v["fields"];
    let hex = unhex(&v["hex"]);
    match v["kind"].as_str().expect("kind") {
        "handshake" => both_ways(
            name,
            Handshake {
                device_id: s(&f["deviceId"]),
                os_name: s(&f["osName"]),
                os_version: s(&f["osVersion"]),
                client_version: s(&f["clientVersion"]),
                iv: unhex(&f["iv"]),
                client_key: unhex(&f["clientKey"]),
                min_heartbeat: i(&f["minHeartbeat"]) as i32,
                max_heartbeat: i(&f["maxHeartbeat"]) as i32,
                timestamp: i(&f["timestamp"]),
                capabilities: caps(f),
            },
            &hex,
        ),
        "handshake_ok" => both_ways(
            name,
            HandshakeOk {
                server_key: unhex(&f["serverKey"]),
                heartbeat: i(&f["heartbeat"]) as i32,
                session_id: s(&f["sessionId"]),
                expire_time: i(&f["expireTime"]),
                capabilities: caps(f),
            },
            &hex,
        ),
        "fast_connect" => both_ways(
            name,
            FastConnect {
                session_id: s(&f["sessionId"]),
                device_id: s(&f["deviceId"]),
                min_heartbeat: i(&f["minHeartbeat"]) as i32,
                max_heartbeat: i(&f["maxHeartbeat"]) as i32,
                proof: f.get("proof").map(|p| v2::ResumeProof {
                    capabilities: Some(v2::Capabilities {
                        profile: i(&p["profile"]) as u32,
                        features: 0,
                    }),
                    client_nonce: unhex(&p["clientNonce"]),
                    proof: unhex(&p["proof"]),
                }),
            },
            &hex,
        ),
        "fast_connect_ok" => both_ways(
            name,
            FastConnectOk {
                heartbeat: i(&f["heartbeat"]) as i32,
                accept: f.get("accept").map(|a| v2::ResumeAccept {
                    server_nonce: unhex(&a["serverNonce"]),
                    proof: unhex(&a["proof"]),
                }),
            },
            &hex,
        ),
        "bind" => both_ways(
            name,
            BindUser {
                user_id: s(&f["userId"]),
                data: s(&f["data"]),
                tags: s(&f["tags"]),
            },
            &hex,
        ),
        "ok" => both_ways(
            name,
            OkMessage {
                cmd: i(&f["cmd"]) as u8,
                code: i(&f["code"]) as u8,
                data: s(&f["data"]),
            },
            &hex,
        ),
        "error" => both_ways(
            name,
            ErrorMessage {
                cmd: i(&f["cmd"]) as u8,
                code: ErrorCode(i(&f["code"]) as u8),
                reason: s(&f["reason"]),
                data: s(&f["data"]),
            },
            &hex,
        ),
        "kick" => both_ways(
            name,
            Kick {
                device_id: s(&f["deviceId"]),
                user_id: s(&f["userId"]),
            },
            &hex,
        ),
        "ack" => both_ways(
            name,
            Ack {
                message_ids: f["messageIds"]
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|x| x.as_u64().expect("u64"))
                    .collect(),
            },
            &hex,
        ),
        "redirect" => both_ways(
            name,
            Redirect {
                address: s(&f["address"]),
                retry_after_ms: i(&f["retryAfterMs"]) as u32,
                jitter_ms: i(&f["jitterMs"]) as u32,
                reason: s(&f["reason"]),
            },
            &hex,
        ),
        "push_envelope" => {
            let env = v2::PushEnvelope {
                message_id: i(&f["messageId"]) as u64,
                trace_id: s(&f["traceId"]),
                content: unhex(&f["content"]),
                ack_mode: v2::AckMode::Auto as i32,
                expires_at_ms: i(&f["expiresAtMs"]) as u64,
            };
            assert_eq!(f["ackMode"], "auto");
            assert_eq!(prost::Message::encode_to_vec(&env), hex, "{name}");
            let back: v2::PushEnvelope = prost::Message::decode(&hex[..]).expect("decodes");
            assert_eq!(back, env);
        }
        "http_response" => {
            let body = &f["body"];
            let fill = unhex(&body["fill"])[0];
            let msg = HttpResponse {
                status_code: i(&f["statusCode"]) as i32,
                reason_phrase: s(&f["reasonPhrase"]),
                headers: s(&f["headers"]),
                body: vec![fill; i(&body["len"]) as usize],
            };
            let enc = msg.to_bytes();
            assert_eq!(v["hex_is_prefix"], true);
            assert_eq!(enc.len() as i64, i(&v["total_len"]), "{name}: length");
            assert_eq!(
                hex::encode(&enc[..hex.len()]),
                hex::encode(&hex),
                "{name}: prefix"
            );
            assert_eq!(HttpResponse::from_bytes(&enc).expect("decodes"), msg);
        }
        "packet" => {
            let p = Packet {
                cmd: Command(i(&f["cmd"]) as u8),
                cc: i(&f["cc"]) as i16,
                flags: Flags(i(&f["flags"]) as u8),
                session_id: i(&f["sessionId"]) as i32,
                lrc: i(&f["lrc"]) as i8,
                body: unhex(&f["body"]).into(),
            };
            let frame = Frame::Packet(p);
            assert_eq!(
                hex::encode(frame.to_bytes()),
                hex::encode(&hex),
                "{name}: encode"
            );
            let mut buf = BytesMut::from(&hex[..]);
            assert_eq!(
                Decoder::default().decode(&mut buf),
                Ok(Some(frame)),
                "{name}: decode"
            );
        }
        "heartbeat" => {
            assert_eq!(Frame::Heartbeat.to_bytes().to_vec(), hex);
            let mut buf = BytesMut::from(&hex[..]);
            assert_eq!(
                Decoder::default().decode(&mut buf),
                Ok(Some(Frame::Heartbeat))
            );
        }
        "aes_cbc" => {
            let c = SessionCipher::cbc(&AesKey(arr16(&f["key"])), arr16(&f["iv"]));
            let plain = unhex(&f["plain"]);
            let mut rng = Rng::seed_from_u64(0);
            assert_eq!(
                hex::encode(c.seal(&mut rng, &[], &plain)),
                hex::encode(&hex),
                "{name}"
            );
            assert_eq!(c.open(&[], &hex).expect("opens"), plain, "{name}");
        }
        "session_key" => {
            let k = legacy_session_key(&arr16(&f["clientKey"]), &arr16(&f["serverKey"]));
            assert_eq!(k.0.to_vec(), hex, "{name}");
        }
        "zlib" => {
            let plain = unhex(&f["plain"]);
            assert_eq!(
                crypto::decompress(&hex, 1 << 16).expect("inflates"),
                plain,
                "{name}"
            );
        }
        "token_dat" => {
            let text = v["text"].as_str().expect("text");
            let t = ResumeTicket::from_token_dat(text).expect("parses");
            assert_eq!(t.session_id, s(&f["sessionId"]));
            assert_eq!(t.expire_at_ms, i(&f["expireTime"]));
            assert_eq!(
                t.secret,
                SessionSecret::Legacy {
                    key: AesKey(arr16(&f["key"])),
                    iv: arr16(&f["iv"]),
                }
            );
            assert_eq!(t.to_token_dat().as_deref(), Some(text), "{name}");
        }
        "v2_keys" => {
            let (traffic, resume) = v2_session_keys(
                &arr16(&f["clientKey"]),
                &arr16(&f["serverKey"]),
                &arr16(&f["iv"]),
            );
            assert_eq!(hex::encode(traffic.0), s(&f["traffic"]));
            assert_eq!(hex::encode(resume.0), s(&f["resume"]));
            let (cn, sn) = (unhex(&f["clientNonce"]), unhex(&f["serverNonce"]));
            let proof = resume_proof(&resume, &s(&f["sessionId"]), &s(&f["deviceId"]), &cn);
            assert_eq!(hex::encode(proof), s(&f["resumeProof"]));
            assert_eq!(
                hex::encode(resume_accept_proof(&resume, &cn, &sn)),
                s(&f["acceptProof"])
            );
            let rk = ResumeKey(resume.0);
            assert_eq!(
                hex::encode(connection_key(&rk, &cn, &sn).0),
                s(&f["connectionTraffic"])
            );
        }
        other => panic!("{name}: unknown vector kind {other}"),
    }
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
        check(&v);
        names.push(v["name"].as_str().unwrap_or_default().to_owned());
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
