//! Starting a connection: the full handshake (mpush's RSA + AES form, the
//! v2 profile, the transport-secured profile on TLS) or a fast connect with
//! a resume ticket, and the server's answers to them.

use std::time::Duration;

use web_time::Instant;

use super::{ClientCloseReason, ClientConnection, ClientEvent, Pending, RequestKind, State};
use crate::crypto::{
    self, AesKey, SessionCipher, random_array, resume_accept_proof, resume_proof, v2_session_keys,
    verify_mac,
};
use crate::error::{DecodeError, ProtocolError};
use crate::message::{Body, FastConnect, FastConnectOk, Handshake, HandshakeOk, v2};
use crate::packet::{Command, Flags, Frame, Packet};
use crate::session::{Profile, ResumeTicket, SessionSecret, duration_ms};

impl ClientConnection {
    pub(super) fn start_handshake(&mut self, now: Instant) {
        if self.transport() {
            return self.start_transport_handshake(now);
        }
        let client_key: [u8; 16] = random_array(&mut self.rng);
        let iv: [u8; 16] = random_array(&mut self.rng);
        let caps = self
            .config
            .offer_v2
            .then(|| offered(v2::Capabilities::v2(), self.config.keep_binding));
        let hs = self.handshake_message(iv.to_vec(), client_key.to_vec(), caps);
        let mut body = hs.to_bytes();
        let mut flags = Flags::CRYPTO;
        if let Some(c) = crypto::compress_over(&body, self.config.compress_over) {
            body = c;
            flags = flags.with(Flags::COMPRESS);
        }
        let id = self.next_id();
        match self.config.public_key.encrypt(&mut self.rng, &body) {
            Ok(sealed) => {
                let p = Packet::new(Command::HANDSHAKE, id, flags, sealed);
                self.write(&Frame::Packet(p).to_bytes(), now);
            }
            Err(e) => {
                return self.close_with(ClientCloseReason::Protocol(e.into()), false);
            }
        }
        self.sealer.set_cipher(None);
        self.state = State::Handshaking {
            client_key: AesKey(client_key),
            iv,
        };
        self.expect_handshake_answer(id, now);
    }

    /// This device's HANDSHAKE body.
    pub(super) fn handshake_message(
        &self,
        iv: Vec<u8>,
        client_key: Vec<u8>,
        capabilities: Option<v2::Capabilities>,
    ) -> Handshake {
        let d = &self.config.device;
        Handshake {
            device_id: d.device_id.clone(),
            os_name: d.os_name.clone(),
            os_version: d.os_version.clone(),
            client_version: d.client_version.clone(),
            iv,
            client_key,
            min_heartbeat: duration_ms(self.config.min_heartbeat),
            max_heartbeat: duration_ms(self.config.max_heartbeat),
            timestamp: 0,
            capabilities,
        }
    }

    /// ADR 0005: the handshake in plaintext (the transport is TLS), no keys.
    pub(super) fn start_transport_handshake(&mut self, now: Instant) {
        let caps = Some(offered(
            v2::Capabilities::transport(),
            self.config.keep_binding,
        ));
        let hs = self.handshake_message(Vec::new(), Vec::new(), caps);
        let id = self.next_id();
        let p = Packet::new(Command::HANDSHAKE, id, Flags::NONE, hs.to_bytes());
        self.write(&Frame::Packet(p).to_bytes(), now);
        self.sealer.set_cipher(None);
        self.state = State::Handshaking {
            client_key: AesKey([0; 16]),
            iv: [0; 16],
        };
        self.expect_handshake_answer(id, now);
    }

    pub(super) fn start_resume(&mut self, ticket: ResumeTicket, now: Instant) {
        let client_nonce: [u8; 16] = random_array(&mut self.rng);
        let proof = match &ticket.secret {
            SessionSecret::Legacy { .. } => None,
            SessionSecret::V2 { resume_key } | SessionSecret::Transport { resume_key } => {
                Some(v2::ResumeProof {
                    capabilities: Some(offered(
                        if ticket.secret.is_transport() {
                            v2::Capabilities::transport()
                        } else {
                            v2::Capabilities::v2()
                        },
                        self.config.keep_binding,
                    )),
                    client_nonce: client_nonce.to_vec(),
                    proof: resume_proof(
                        resume_key,
                        &ticket.session_id,
                        &self.config.device.device_id,
                        &client_nonce,
                    ),
                })
            }
        };
        let fc = FastConnect {
            session_id: ticket.session_id.clone(),
            device_id: self.config.device.device_id.clone(),
            min_heartbeat: duration_ms(self.config.min_heartbeat),
            max_heartbeat: duration_ms(self.config.max_heartbeat),
            proof,
        };
        let id = self.next_id();
        let p = Packet::new(Command::FAST_CONNECT, id, Flags::NONE, fc.to_bytes());
        self.write(&Frame::Packet(p).to_bytes(), now);
        self.state = State::Resuming {
            ticket,
            client_nonce,
        };
        self.expect_handshake_answer(id, now);
    }

    pub(super) fn expect_handshake_answer(&mut self, id: i32, now: Instant) {
        self.pending.insert(
            id,
            Pending {
                kind: RequestKind::Handshake,
                deadline: now + self.config.handshake_timeout,
                retries_left: 0,
                resend: None,
                user_id: String::new(),
            },
        );
    }

    pub(super) fn on_handshake_ok(
        &mut self,
        p: &Packet,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        let State::Handshaking { client_key, iv } = &self.state else {
            return Ok(()); // a late or repeated answer
        };
        let (client_key, iv) = (client_key.clone(), *iv);
        if self.transport() {
            return self.on_transport_handshake_ok(p, now);
        }
        let reply_cipher = cbc_cipher(&client_key, iv)?;
        let body = self.sealer.open_with(Some(&reply_cipher), p)?;
        let ok = HandshakeOk::from_bytes(&body)?;
        let server_key: [u8; 16] = ok
            .server_key
            .as_slice()
            .try_into()
            .map_err(|_| DecodeError::BadLength { field: "serverKey" })?;
        let v2 = self.config.offer_v2
            && ok
                .capabilities
                .as_ref()
                .is_some_and(|c| c.profile >= v2::PROFILE);
        if v2 {
            self.server_features = ok.capabilities.as_ref().map_or(0, |c| c.features);
        }
        let (cipher, secret, profile) = if v2 {
            let (traffic, resume_key) = v2_session_keys(&client_key.0, &server_key, &iv);
            (
                gcm_cipher(&traffic)?,
                SessionSecret::V2 { resume_key },
                Profile::V2,
            )
        } else {
            let key = crypto::legacy_session_key(&client_key.0, &server_key);
            (
                cbc_cipher(&key, iv)?,
                SessionSecret::Legacy { key, iv },
                Profile::Legacy,
            )
        };
        let ticket = (!ok.session_id.is_empty()).then(|| ResumeTicket {
            session_id: ok.session_id.clone(),
            expire_at_ms: ok.expire_time,
            secret,
        });
        self.pending.remove(&p.session_id);
        self.established(Some(cipher), profile, ok.heartbeat, now);
        self.events.push_back(ClientEvent::Connected {
            profile,
            heartbeat: self.heartbeat,
            resumed: false,
            ticket,
        });
        Ok(())
    }

    /// ADR 0005: a plaintext HANDSHAKE_OK naming the transport profile, its
    /// `serverKey` the session's resume key.
    pub(super) fn on_transport_handshake_ok(
        &mut self,
        p: &Packet,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        if p.flags.contains(Flags::CRYPTO) {
            return Err(ProtocolError::State(
                "a sealed answer to a transport handshake",
            ));
        }
        let ok = HandshakeOk::from_bytes(&p.body)?;
        if !ok
            .capabilities
            .as_ref()
            .is_some_and(v2::Capabilities::has_transport)
        {
            return Err(ProtocolError::State(
                "the server did not take the transport-secured profile",
            ));
        }
        let key: [u8; crate::crypto::RESUME_KEY_LEN] = ok
            .server_key
            .as_slice()
            .try_into()
            .map_err(|_| DecodeError::BadLength { field: "serverKey" })?;
        self.server_features = ok.capabilities.as_ref().map_or(0, |c| c.features);
        let ticket = (!ok.session_id.is_empty()).then(|| ResumeTicket {
            session_id: ok.session_id.clone(),
            expire_at_ms: ok.expire_time,
            secret: SessionSecret::Transport {
                resume_key: crate::crypto::ResumeKey(key),
            },
        });
        self.pending.remove(&p.session_id);
        self.established(None, Profile::V2, ok.heartbeat, now);
        self.events.push_back(ClientEvent::Connected {
            profile: Profile::V2,
            heartbeat: self.heartbeat,
            resumed: false,
            ticket,
        });
        Ok(())
    }

    pub(super) fn on_fast_connect_ok(
        &mut self,
        p: &Packet,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        let State::Resuming {
            ticket,
            client_nonce,
        } = &self.state
        else {
            return Ok(());
        };
        let ok = FastConnectOk::from_bytes(&p.body)?;
        let mut next = None;
        let (cipher, profile) = match (&ticket.secret, &ok.accept) {
            (SessionSecret::Legacy { key, iv }, _) => {
                (Some(cbc_cipher(key, *iv)?), Profile::Legacy)
            }
            (
                SessionSecret::V2 { resume_key } | SessionSecret::Transport { resume_key },
                Some(accept),
            ) => {
                let transport = ticket.secret.is_transport();
                if !v2::RESUME_NONCE_LEN.contains(&accept.server_nonce.len()) {
                    return Err(ProtocolError::State(
                        "server nonce of a length outside the profile's",
                    ));
                }
                let want = resume_accept_proof(resume_key, client_nonce, &accept.server_nonce);
                if !verify_mac(&want, &accept.proof) {
                    return Err(ProtocolError::State(
                        "server failed to prove the session key",
                    ));
                }
                let derived = crate::crypto::ResumeDerivation::new(
                    resume_key,
                    client_nonce,
                    &accept.server_nonce,
                );
                let key = derived.connection_key();
                // Single-use tickets: the server named the session to use next time.
                if !accept.next_session_id.is_empty() {
                    let resume_key = derived.next_resume_key();
                    next = Some(ResumeTicket {
                        session_id: accept.next_session_id.clone(),
                        expire_at_ms: accept.next_expire_at_ms,
                        secret: SessionSecret::resumable(resume_key, transport),
                    });
                }
                let cipher = if transport {
                    None
                } else {
                    Some(gcm_cipher(&key)?)
                };
                (cipher, Profile::V2)
            }
            (SessionSecret::V2 { .. } | SessionSecret::Transport { .. }, None) => {
                return Err(ProtocolError::State("v2 resume answered without a proof"));
            }
        };
        self.pending.remove(&p.session_id);
        self.established(cipher, profile, ok.heartbeat, now);
        self.binding_kept = ok.accept.as_ref().is_some_and(|a| a.bound);
        self.events.push_back(ClientEvent::Connected {
            profile,
            heartbeat: self.heartbeat,
            resumed: true,
            ticket: next,
        });
        Ok(())
    }

    pub(super) fn established(
        &mut self,
        cipher: Option<SessionCipher>,
        profile: Profile,
        heartbeat_ms: i32,
        now: Instant,
    ) {
        self.sealer.set_cipher(cipher);
        self.profile = profile;
        self.heartbeat = Duration::from_millis(u64::try_from(heartbeat_ms).unwrap_or(0).max(1000));
        self.state = State::Established;
        self.last_read = now;
    }
}

/// The classic ciphers; a build without them (feature `classic` off, the
/// transport-only browser module) refuses the classic profiles.
#[cfg(feature = "classic")]
pub(super) fn cbc_cipher(key: &AesKey, iv: [u8; 16]) -> Result<SessionCipher, ProtocolError> {
    Ok(SessionCipher::cbc(key, iv))
}

#[cfg(feature = "classic")]
pub(super) fn gcm_cipher(key: &AesKey) -> Result<SessionCipher, ProtocolError> {
    Ok(SessionCipher::gcm(key))
}

#[cfg(not(feature = "classic"))]
pub(super) fn cbc_cipher(_: &AesKey, _: [u8; 16]) -> Result<SessionCipher, ProtocolError> {
    Err(ProtocolError::State(NO_CLASSIC))
}

#[cfg(not(feature = "classic"))]
pub(super) fn gcm_cipher(_: &AesKey) -> Result<SessionCipher, ProtocolError> {
    Err(ProtocolError::State(NO_CLASSIC))
}

#[cfg(not(feature = "classic"))]
pub(super) const NO_CLASSIC: &str = "this build speaks only the transport-secured profile (wss://)";

/// What this client offers: `caps`, `FEATURE_PLAIN_BODIES` when this
/// build does not inflate (the server then sends it no compressed body), and
/// `FEATURE_KEEP_BINDING` when `keep_binding` (ADR 0008).
pub(super) fn offered(caps: v2::Capabilities, keep_binding: bool) -> v2::Capabilities {
    let mut features = 0;
    if !crypto::INFLATES {
        features |= v2::FEATURE_PLAIN_BODIES;
    }
    if keep_binding {
        features |= v2::FEATURE_KEEP_BINDING;
    }
    caps.with_features(features)
}
