//! Fast connect: a session resumed from the driver's store (mpush's form,
//! and v2's single-use tickets with proof of key possession).

use web_time::Instant;

use super::{ServerConnection, ServerEvent, State, Transport, duration_ms_i64, hex_id};
use crate::crypto::{ResumeDerivation, ResumeProofs, SessionCipher, verify_mac};
use crate::error::ProtocolError;
use crate::message::{Body, ErrorCode, ErrorMessage, FastConnect, FastConnectOk, v2};
use crate::packet::{Command, Packet};
use crate::session::{KeptBinding, Profile, SessionRecord, SessionSecret, duration_ms};

/// ADR 0008: a fast connect waiting for its kept binding to be restored.
#[derive(Debug)]
pub(super) struct PendingRestore {
    ok: FastConnectOk,
    packet_id: i32,
    user_id: String,
}

impl ServerConnection {
    /// Answer to `ResumeRequested`: the stored session, if any.
    pub(super) fn on_session(&mut self, record: Option<SessionRecord>, now: Instant) {
        if !matches!(self.state, State::AwaitResume { .. }) {
            return;
        }
        let State::AwaitResume { request, packet_id } =
            std::mem::replace(&mut self.state, State::AwaitHandshake)
        else {
            return;
        };
        self.resume(*request, packet_id, record, now);
        self.process_input(now);
    }

    pub(super) fn resume(
        &mut self,
        request: FastConnect,
        packet_id: i32,
        record: Option<SessionRecord>,
        now: Instant,
    ) {
        let expired = |r: &SessionRecord| r.expire_at_ms <= self.unix_ms(now);
        let Some(record) = record.filter(|r| !expired(r)) else {
            return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
        };
        let v2_record = matches!(
            record.secret,
            SessionSecret::V2 { .. } | SessionSecret::Transport { .. }
        );
        // A transport session resumes only on a secure transport and into
        // the same profile; a classic one only outside it (ADR 0005). A
        // mismatch looks like an unknown session: the client handshakes.
        let wants_transport = request
            .proof
            .as_ref()
            .and_then(|p| p.capabilities.as_ref())
            .is_some_and(v2::Capabilities::has_transport);
        let is_transport = record.secret.is_transport();
        if wants_transport != is_transport
            || (is_transport && !(self.transport_secured() && self.config.accept_transport))
        {
            return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
        }
        if record.device.device_id != request.device_id {
            // On v2 a wrong device id looks exactly like a wrong proof, so a
            // prober learns nothing about whose session it holds.
            let code = if v2_record {
                ErrorCode::SESSION_EXPIRED
            } else {
                ErrorCode::INVALID_DEVICE
            };
            return self.resume_refused(packet_id, code);
        }
        if self.config.require_v2 && !v2_record {
            return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
        }
        let heartbeat = self.negotiate_heartbeat(request.max_heartbeat);
        let now_ms = self.unix_ms(now);
        let mut next = None;
        let mut restore = None;
        let mut keep = false;
        let (cipher, profile, accept) = match (&record.secret, &request.proof) {
            (SessionSecret::Legacy { key, iv }, _) => {
                (Some(SessionCipher::cbc(key, *iv)), Profile::Legacy, None)
            }
            (
                SessionSecret::V2 { resume_key } | SessionSecret::Transport { resume_key },
                Some(proof),
            ) if self.config.enable_v2 => {
                // A nonce of another length is refused as a wrong proof is,
                // before any hashing.
                if !v2::RESUME_NONCE_LEN.contains(&proof.client_nonce.len()) {
                    return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
                }
                // Both proofs under one HMAC key schedule, both keys from one
                // HKDF extract.
                let proofs = ResumeProofs::new(resume_key);
                let want =
                    proofs.client(&request.session_id, &request.device_id, &proof.client_nonce);
                if !verify_mac(&want, &proof.proof) {
                    return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
                }
                let (Some(server_nonce), Some(next_raw)) = (self.draw::<16>(), self.draw::<16>())
                else {
                    return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
                };
                keep = self.honour_features(proof.capabilities.as_ref()) & v2::FEATURE_KEEP_BINDING
                    != 0;
                let next_id = hex_id(&next_raw);
                let next_expire = now_ms + duration_ms_i64(self.config.session_ttl);
                let derived = ResumeDerivation::new(resume_key, &proof.client_nonce, &server_nonce);
                let next_key = derived.next_resume_key();
                // A kept binding travels with the ticket's rotation while
                // the client still asks for it and its token is good.
                restore = record.binding.clone().filter(|b| keep && b.is_live(now_ms));
                next = Some(SessionRecord {
                    session_id: next_id.clone(),
                    device: record.device.clone(),
                    secret: SessionSecret::resumable(next_key, is_transport),
                    expire_at_ms: next_expire,
                    binding: restore.clone(),
                });
                let accept = v2::ResumeAccept {
                    server_nonce: server_nonce.to_vec(),
                    proof: proofs.server(&proof.client_nonce, &server_nonce).to_vec(),
                    next_session_id: next_id,
                    next_expire_at_ms: next_expire,
                    bound: false,
                };
                let cipher = (!is_transport).then(|| SessionCipher::gcm(&derived.connection_key()));
                (cipher, Profile::V2, Some(accept))
            }
            // A v2 session without a proof (or with v2 turned off) cannot resume.
            (SessionSecret::V2 { .. } | SessionSecret::Transport { .. }, _) => {
                return self.resume_refused(packet_id, ErrorCode::SESSION_EXPIRED);
            }
        };
        let ok = FastConnectOk {
            heartbeat: duration_ms(heartbeat),
            accept,
        };
        self.sealer.set_cipher(cipher);
        if is_transport {
            self.transport = Transport::Profile;
        }
        self.profile = profile;
        self.set_heartbeat(heartbeat, now);
        self.user = None;
        if let Some(n) = &next {
            self.keep_session(&n.session_id, keep);
        }
        let replaces = next.as_ref().map(|_| record.session_id.clone());
        self.events.push_back(ServerEvent::Resumed {
            device: record.device,
            profile,
            session: next,
            replaces,
        });
        match restore {
            // The answer goes out once the driver has bound the connection.
            Some(binding) => self.await_restore(ok, packet_id, binding),
            None => {
                self.send_plain(Command::FAST_CONNECT, packet_id, ok.to_bytes());
                self.establish();
            }
        }
    }

    fn await_restore(&mut self, ok: FastConnectOk, packet_id: i32, binding: KeptBinding) {
        self.state = State::AwaitRestore(Box::new(PendingRestore {
            ok,
            packet_id,
            user_id: binding.user_id.clone(),
        }));
        self.events
            .push_back(ServerEvent::RestoreRequested { binding });
    }

    /// Answer to `RestoreRequested`: FAST_CONNECT_OK, saying whether the
    /// connection is bound.
    pub(super) fn on_restored(&mut self, bound: bool, now: Instant) {
        if !matches!(self.state, State::AwaitRestore(_)) {
            return;
        }
        let State::AwaitRestore(pending) =
            std::mem::replace(&mut self.state, State::AwaitHandshake)
        else {
            return;
        };
        let PendingRestore {
            mut ok,
            packet_id,
            user_id,
        } = *pending;
        if let Some(a) = ok.accept.as_mut() {
            a.bound = bound;
        }
        self.send_plain(Command::FAST_CONNECT, packet_id, ok.to_bytes());
        if bound {
            self.user = Some(user_id.into_boxed_str());
        }
        self.establish();
        self.process_input(now);
    }

    pub(super) fn on_fast_connect(&mut self, p: &Packet) -> Result<(), ProtocolError> {
        if self.resume_seen || self.handshake_seen || !matches!(self.state, State::AwaitHandshake) {
            self.refuse_repeat(p, "fast connect");
            return Ok(());
        }
        self.resume_seen = true;
        let fc = FastConnect::from_bytes(&p.body)?;
        if fc.session_id.is_empty()
            || fc.session_id.len() > crate::session::limits::SESSION_ID
            || fc.device_id.len() > crate::session::limits::DEVICE_ID
            || (self.config.require_v2 && fc.proof.is_none())
        {
            self.resume_refused(p.session_id, ErrorCode::SESSION_EXPIRED);
            return Ok(());
        }
        self.events.push_back(ServerEvent::ResumeRequested {
            session_id: fc.session_id.clone(),
            device_id: fc.device_id.clone(),
        });
        self.state = State::AwaitResume {
            request: Box::new(fc),
            packet_id: p.session_id,
        };
        Ok(())
    }

    pub(super) fn resume_refused(&mut self, request: i32, code: ErrorCode) {
        // The connection stays open: the client handshakes on it (spec 5.5).
        self.state = State::AwaitHandshake;
        self.send_plain(
            Command::ERROR,
            request,
            ErrorMessage::new(Command::FAST_CONNECT, code).to_bytes(),
        );
    }
}
