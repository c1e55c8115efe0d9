//! The shared test vectors (`protocol/testdata/vectors/*.json`) as a library
//! check (feature `conformance`), so that every build of the protocol can be
//! held to the same bytes: this crate's tests, the browser package's smoke
//! test in Node, and any binding that links the protocol.
//!
//! [`check_vector`] takes one vector file's JSON and checks encode and decode
//! byte for byte; a mismatch or a malformed vector is an `Err` naming the
//! vector and the field, never a panic.

use bytes::BytesMut;
use rand_core::SeedableRng;
use serde_json::Value;

use crate::crypto::{
    self, AesKey, ResumeKey, Rng, SessionCipher, connection_key, legacy_session_key,
    resume_accept_proof, resume_proof, v2_session_keys,
};
use crate::message::{
    Ack, BindUser, Body, ErrorCode, ErrorMessage, FastConnect, FastConnectOk, Handshake,
    HandshakeOk, HttpResponse, Kick, OkMessage, Redirect, v2,
};
use crate::packet::{Command, Decoder, Flags, Frame, Packet};
use crate::session::{ResumeTicket, SessionSecret};

/// A vector that does not match this build, or is malformed: the words
/// name the vector and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Mismatch(pub String);

impl From<String> for Mismatch {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for Mismatch {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

type Check = Result<(), Mismatch>;

/// Field readers over one vector's `fields` object.
struct Fields<'a> {
    name: &'a str,
    v: &'a Value,
}

impl Fields<'_> {
    fn get(&self, key: &str) -> Result<&Value, Mismatch> {
        self.v
            .get(key)
            .ok_or_else(|| Mismatch(format!("{}: missing field {key}", self.name)))
    }

    /// A string field; absent or null is the empty string (as mpush writes it).
    fn s(&self, key: &str) -> Result<String, Mismatch> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(Mismatch(format!(
                "{}: field {key} is not a string",
                self.name
            ))),
        }
    }

    fn i(&self, key: &str) -> Result<i64, Mismatch> {
        self.get(key)?
            .as_i64()
            .ok_or_else(|| Mismatch(format!("{}: field {key} is not an integer", self.name)))
    }

    /// An integer field that later vectors added: absent is 0.
    fn i_or0(&self, key: &str) -> Result<i64, Mismatch> {
        match self.v.get(key) {
            None => Ok(0),
            Some(_) => self.i(key),
        }
    }

    /// A boolean field that later vectors added: absent is false.
    fn b_or_false(&self, key: &str) -> Result<bool, Mismatch> {
        match self.v.get(key) {
            None => Ok(false),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| Mismatch(format!("{}: field {key} is not a boolean", self.name))),
        }
    }

    fn hex(&self, key: &str) -> Result<Vec<u8>, Mismatch> {
        unhex(self.name, key, self.get(key)?)
    }

    fn arr16(&self, key: &str) -> Result<[u8; 16], Mismatch> {
        self.hex(key)?
            .try_into()
            .map_err(|_| Mismatch(format!("{}: field {key} is not 16 bytes", self.name)))
    }

    fn sub<'b>(&'b self, key: &str) -> Option<Fields<'b>> {
        self.v.get(key).map(|v| Fields { name: self.name, v })
    }
}

fn unhex(name: &str, key: &str, v: &Value) -> Result<Vec<u8>, Mismatch> {
    let text = v
        .as_str()
        .ok_or_else(|| Mismatch(format!("{name}: field {key} is not a hex string")))?;
    hex::decode(text).map_err(|e| Mismatch(format!("{name}: field {key}: {e}")))
}

fn same(name: &str, what: &str, got: &[u8], want: &[u8]) -> Check {
    if got == want {
        Ok(())
    } else {
        Err(Mismatch(format!(
            "{name}: {what}: got {}, want {}",
            hex::encode(got),
            hex::encode(want)
        )))
    }
}

fn equal<T: PartialEq + std::fmt::Debug>(name: &str, what: &str, got: T, want: T) -> Check {
    if got == want {
        Ok(())
    } else {
        Err(Mismatch(format!(
            "{name}: {what}: got {got:?}, want {want:?}"
        )))
    }
}

/// `msg` encodes to `hex` and `hex` decodes to `msg`.
fn both_ways<B: Body + PartialEq + std::fmt::Debug>(name: &str, msg: B, hex: &[u8]) -> Check {
    same(name, "encode", &msg.to_bytes(), hex)?;
    let back = B::from_bytes(hex).map_err(|e| Mismatch(format!("{name}: decode: {e}")))?;
    equal(name, "decode", back, msg)
}

fn caps(f: &Fields<'_>) -> Result<Option<v2::Capabilities>, Mismatch> {
    f.sub("capabilities")
        .map(|c| {
            Ok(v2::Capabilities {
                profile: c.i("profile")? as u32,
                features: c.i("features")? as u32,
            })
        })
        .transpose()
}

/// Checks one vector (the JSON of one file) and returns its name.
pub fn check_vector(v: &Value) -> Result<String, Mismatch> {
    let name = v
        .get("name")
        .and_then(Value::as_str)
        .ok_or("vector without a name")?;
    let kind = v
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| Mismatch(format!("{name}: no kind")))?;
    let f = Fields {
        name,
        v: v.get("fields").unwrap_or(&Value::Null),
    };
    let hex = match v.get("hex") {
        Some(h) => unhex(name, "hex", h)?,
        None => Vec::new(),
    };
    check_kind(name, kind, v, &f, &hex)?;
    Ok(name.to_owned())
}

fn check_kind(name: &str, kind: &str, v: &Value, f: &Fields<'_>, hex: &[u8]) -> Check {
    match kind {
        "handshake" => both_ways(
            name,
            Handshake {
                device_id: f.s("deviceId")?,
                os_name: f.s("osName")?,
                os_version: f.s("osVersion")?,
                client_version: f.s("clientVersion")?,
                iv: f.hex("iv")?,
                client_key: f.hex("clientKey")?,
                min_heartbeat: f.i("minHeartbeat")? as i32,
                max_heartbeat: f.i("maxHeartbeat")? as i32,
                timestamp: f.i("timestamp")?,
                capabilities: caps(f)?,
            },
            hex,
        ),
        "handshake_ok" => both_ways(
            name,
            HandshakeOk {
                server_key: f.hex("serverKey")?,
                heartbeat: f.i("heartbeat")? as i32,
                session_id: f.s("sessionId")?,
                expire_time: f.i("expireTime")?,
                capabilities: caps(f)?,
            },
            hex,
        ),
        "fast_connect" => {
            let proof = match f.sub("proof") {
                Some(p) => Some(v2::ResumeProof {
                    capabilities: Some(v2::Capabilities {
                        profile: p.i("profile")? as u32,
                        // Vectors before ADR 0008 name no features.
                        features: p.i_or0("features")? as u32,
                    }),
                    client_nonce: p.hex("clientNonce")?,
                    proof: p.hex("proof")?,
                }),
                None => None,
            };
            both_ways(
                name,
                FastConnect {
                    session_id: f.s("sessionId")?,
                    device_id: f.s("deviceId")?,
                    min_heartbeat: f.i("minHeartbeat")? as i32,
                    max_heartbeat: f.i("maxHeartbeat")? as i32,
                    proof,
                },
                hex,
            )
        }
        "fast_connect_ok" => {
            let accept = match f.sub("accept") {
                Some(a) => Some(v2::ResumeAccept {
                    server_nonce: a.hex("serverNonce")?,
                    proof: a.hex("proof")?,
                    // Absent from vectors made before single-use tickets
                    // (and before ADR 0008's `bound`).
                    next_session_id: a.s("nextSessionId")?,
                    next_expire_at_ms: a.i_or0("nextExpireAtMs")?,
                    bound: a.b_or_false("bound")?,
                }),
                None => None,
            };
            both_ways(
                name,
                FastConnectOk {
                    heartbeat: f.i("heartbeat")? as i32,
                    accept,
                },
                hex,
            )
        }
        "bind" => both_ways(
            name,
            BindUser {
                user_id: f.s("userId")?,
                data: f.s("data")?,
                tags: f.s("tags")?,
            },
            hex,
        ),
        "ok" => both_ways(
            name,
            OkMessage {
                cmd: f.i("cmd")? as u8,
                code: f.i("code")? as u8,
                data: f.s("data")?,
            },
            hex,
        ),
        "error" => both_ways(
            name,
            ErrorMessage {
                cmd: f.i("cmd")? as u8,
                code: ErrorCode(f.i("code")? as u8),
                reason: f.s("reason")?,
                data: f.s("data")?,
            },
            hex,
        ),
        "kick" => both_ways(
            name,
            Kick {
                device_id: f.s("deviceId")?,
                user_id: f.s("userId")?,
            },
            hex,
        ),
        "ack" => {
            let ids = f
                .get("messageIds")?
                .as_array()
                .ok_or_else(|| Mismatch(format!("{name}: messageIds is not an array")))?
                .iter()
                .map(|x| {
                    x.as_u64()
                        .ok_or_else(|| Mismatch(format!("{name}: bad message id")))
                })
                .collect::<Result<Vec<u64>, Mismatch>>()?;
            both_ways(name, Ack { message_ids: ids }, hex)
        }
        "redirect" => both_ways(
            name,
            Redirect {
                address: f.s("address")?,
                retry_after_ms: f.i("retryAfterMs")? as u32,
                jitter_ms: f.i("jitterMs")? as u32,
                reason: f.s("reason")?,
            },
            hex,
        ),
        "push_envelope" => {
            equal(name, "ackMode", f.s("ackMode")?.as_str(), "auto")?;
            let env = v2::PushEnvelope {
                message_id: f.i("messageId")? as u64,
                trace_id: f.s("traceId")?,
                content: f.hex("content")?,
                ack_mode: v2::AckMode::Auto as i32,
                expires_at_ms: f.i("expiresAtMs")? as u64,
            };
            same(name, "encode", &prost::Message::encode_to_vec(&env), hex)?;
            let back: v2::PushEnvelope = prost::Message::decode(hex)
                .map_err(|e| Mismatch(format!("{name}: decode: {e}")))?;
            equal(name, "decode", back, env)
        }
        "http_response" => {
            let body = f
                .sub("body")
                .ok_or_else(|| Mismatch(format!("{name}: missing body")))?;
            let fill = *body
                .hex("fill")?
                .first()
                .ok_or_else(|| Mismatch(format!("{name}: empty fill")))?;
            let msg = HttpResponse {
                status_code: f.i("statusCode")? as i32,
                reason_phrase: f.s("reasonPhrase")?,
                headers: f.s("headers")?,
                body: vec![fill; body.i("len")? as usize],
            };
            let enc = msg.to_bytes();
            equal(
                name,
                "hex_is_prefix",
                &v["hex_is_prefix"],
                &Value::Bool(true),
            )?;
            let total = v["total_len"].as_i64().unwrap_or(-1);
            equal(name, "length", enc.len() as i64, total)?;
            same(name, "prefix", enc.get(..hex.len()).unwrap_or(&enc), hex)?;
            let back =
                HttpResponse::from_bytes(&enc).map_err(|e| Mismatch(format!("{name}: {e}")))?;
            equal(name, "decode", back, msg)
        }
        "packet" => {
            let frame = Frame::Packet(Packet {
                cmd: Command(f.i("cmd")? as u8),
                cc: f.i("cc")? as i16,
                flags: Flags(f.i("flags")? as u8),
                session_id: f.i("sessionId")? as i32,
                lrc: f.i("lrc")? as i8,
                body: f.hex("body")?.into(),
            });
            same(name, "encode", &frame.to_bytes(), hex)?;
            let mut buf = BytesMut::from(hex);
            equal(
                name,
                "decode",
                Decoder::default().decode(&mut buf),
                Ok(Some(frame)),
            )
        }
        "heartbeat" => {
            same(name, "encode", &Frame::Heartbeat.to_bytes(), hex)?;
            let mut buf = BytesMut::from(hex);
            equal(
                name,
                "decode",
                Decoder::default().decode(&mut buf),
                Ok(Some(Frame::Heartbeat)),
            )
        }
        "aes_cbc" => {
            let c = SessionCipher::cbc(&AesKey(f.arr16("key")?), f.arr16("iv")?);
            let plain = f.hex("plain")?;
            let mut rng = Rng::seed_from_u64(0);
            same(name, "seal", &c.seal(&mut rng, &[], &plain), hex)?;
            let opened = c
                .open(&[], hex)
                .map_err(|e| Mismatch(format!("{name}: open: {e}")))?;
            same(name, "open", &opened, &plain)
        }
        "session_key" => {
            let k = legacy_session_key(&f.arr16("clientKey")?, &f.arr16("serverKey")?);
            same(name, "session key", &k.0, hex)
        }
        "zlib" => {
            let out = crypto::decompress(hex, 1 << 16)
                .map_err(|e| Mismatch(format!("{name}: inflate: {e}")))?;
            same(name, "inflate", &out, &f.hex("plain")?)
        }
        "token_dat" => {
            let text = v["text"]
                .as_str()
                .ok_or_else(|| Mismatch(format!("{name}: no text")))?;
            let t = ResumeTicket::from_token_dat(text)
                .ok_or_else(|| Mismatch(format!("{name}: token.dat does not parse")))?;
            equal(name, "sessionId", t.session_id.clone(), f.s("sessionId")?)?;
            equal(name, "expireTime", t.expire_at_ms, f.i("expireTime")?)?;
            equal(
                name,
                "secret",
                &t.secret,
                &SessionSecret::Legacy {
                    key: AesKey(f.arr16("key")?),
                    iv: f.arr16("iv")?,
                },
            )?;
            equal(
                name,
                "to_token_dat",
                t.to_token_dat().as_deref(),
                Some(text),
            )
        }
        "v2_keys" => {
            let (traffic, resume) = v2_session_keys(
                &f.arr16("clientKey")?,
                &f.arr16("serverKey")?,
                &f.arr16("iv")?,
            );
            same(name, "traffic", &traffic.0, &f.hex("traffic")?)?;
            same(name, "resume", &resume.0, &f.hex("resume")?)?;
            let (cn, sn) = (f.hex("clientNonce")?, f.hex("serverNonce")?);
            let proof = resume_proof(&resume, &f.s("sessionId")?, &f.s("deviceId")?, &cn);
            same(name, "resume proof", &proof, &f.hex("resumeProof")?)?;
            let accept = resume_accept_proof(&resume, &cn, &sn);
            same(name, "accept proof", &accept, &f.hex("acceptProof")?)?;
            let rk = ResumeKey(resume.0);
            same(
                name,
                "connection traffic key",
                &connection_key(&rk, &cn, &sn).0,
                &f.hex("connectionTraffic")?,
            )
        }
        other => Err(Mismatch(format!("{name}: unknown vector kind {other}"))),
    }
}
