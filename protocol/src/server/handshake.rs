//! The full handshake: mpush's RSA + AES form (legacy and the v2 profile,
//! the RSA step inline or offloaded to the driver), the plaintext form, and
//! the transport-secured profile on TLS connections (ADR 0005).

use std::time::Duration;

use rand_core::SeedableRng;
use web_time::Instant;

use super::{
    CloseReason, ServerConnection, ServerEvent, State, Transport, duration_ms_i64, hex_id,
};
use crate::crypto::{
    self, AesKey, Rng, SessionCipher, legacy_session_key, random_array, v2_session_keys,
};
use crate::error::ProtocolError;
use crate::message::{Body, ErrorCode, ErrorMessage, Handshake, HandshakeOk, v2};
use crate::packet::{Command, Flags, Frame, Packet};
use crate::session::{DeviceInfo, Profile, SessionRecord, SessionSecret, duration_ms};

impl ServerConnection {
    pub(super) fn on_handshake(&mut self, p: &Packet, now: Instant) -> Result<(), ProtocolError> {
        if self.handshake_seen || !matches!(self.state, State::AwaitHandshake) {
            // One full handshake per connection: a second one (a replay, or
            // a flood of RSA work on one socket) ends it.
            self.refuse_repeat(p, "handshake");
            return Ok(());
        }
        self.handshake_seen = true;
        if !p.flags.contains(Flags::CRYPTO) {
            // mpush accepts a plaintext handshake (spec 11.9); so do we,
            // unless only v2 is served.
            if self.config.require_v2 && !self.transport_secured() {
                self.refuse_handshake(p.session_id, "plaintext handshake (v2 required)");
                return Ok(());
            }
            return self.complete_handshake(p.session_id, p.body.to_vec(), true, now);
        }
        let max = self.config.private_key.size() * self.config.max_handshake_blocks;
        if p.body.is_empty() || p.body.len() > max {
            self.refuse_handshake(p.session_id, "handshake ciphertext size");
            return Ok(());
        }
        if self.config.offload_rsa {
            self.state = State::AwaitDecrypt {
                request: p.session_id,
                flags: p.flags,
            };
            self.events.push_back(ServerEvent::DecryptRequested {
                ciphertext: p.body.clone(),
            });
            return Ok(());
        }
        let Some(rng) = self.rng.as_deref_mut() else {
            self.refuse_handshake(p.session_id, "no handshake in this state");
            return Ok(());
        };
        let plain = self.config.private_key.decrypt(rng, &p.body);
        self.after_decrypt(p.session_id, p.flags, plain, now)
    }

    /// Answer to `DecryptRequested`: the plaintext, or why it failed.
    pub(super) fn on_decrypted(
        &mut self,
        result: Result<Vec<u8>, crate::error::CryptoError>,
        now: Instant,
    ) {
        let State::AwaitDecrypt { request, flags } = self.state else {
            return;
        };
        self.state = State::AwaitHandshake;
        if let Err(e) = self.after_decrypt(request, flags, result, now) {
            self.fail(Command::HANDSHAKE, request, e);
        }
        self.process_input(now);
    }

    pub(super) fn after_decrypt(
        &mut self,
        request: i32,
        flags: Flags,
        plain: Result<Vec<u8>, crate::error::CryptoError>,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        let plain = plain?;
        let body = if flags.contains(Flags::COMPRESS) {
            crypto::decompress(&plain, self.config.max_body)?
        } else {
            plain
        };
        self.complete_handshake(request, body, false, now)
    }

    pub(super) fn complete_handshake(
        &mut self,
        request: i32,
        body: Vec<u8>,
        plaintext: bool,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        let mut hs = Handshake::from_bytes(&body)?;
        if hs
            .capabilities
            .as_ref()
            .is_some_and(v2::Capabilities::has_transport)
        {
            return self.complete_transport_handshake(request, hs, plaintext, now);
        }
        let key_bytes = zeroize::Zeroizing::new(std::mem::take(&mut hs.client_key));
        let (Ok(iv), Ok(client_key)) = (
            <[u8; 16]>::try_from(hs.iv.as_slice()),
            <[u8; 16]>::try_from(key_bytes.as_slice()),
        ) else {
            self.refuse_handshake(request, "invalid handshake parameters");
            return Ok(());
        };
        let device = match handshake_device(&mut hs) {
            Ok(d) => d,
            Err(why) => {
                self.refuse_handshake(request, why);
                return Ok(());
            }
        };
        let v2 = self.config.enable_v2
            && hs
                .capabilities
                .as_ref()
                .is_some_and(|c| c.profile >= v2::PROFILE);
        if self.config.require_v2 && !v2 {
            self.refuse_handshake(request, "legacy handshake (v2 required)");
            return Ok(());
        }
        let (Some(server_key), Some(id_raw)) = (self.draw::<16>(), self.draw::<16>()) else {
            self.refuse_handshake(request, "no handshake in this state");
            return Ok(());
        };
        let capabilities = v2.then(|| {
            let echo = self.honour_features(hs.capabilities.as_ref());
            v2::Capabilities::v2().with_features(echo)
        });
        let keep = capabilities
            .as_ref()
            .is_some_and(|c| c.features & v2::FEATURE_KEEP_BINDING != 0);
        let (heartbeat, ok) =
            self.session_offer(&hs, &id_raw, server_key.to_vec(), capabilities, now);
        // HANDSHAKE_OK always goes out under AES-CBC(clientKey, iv), as in mpush.
        let client_key = AesKey(client_key);
        let reply_cipher = SessionCipher::cbc(&client_key, iv);
        // CBC: the nonce source is not used.
        let packet = self.sealer.seal_with(
            &reply_cipher,
            &mut Rng::from_seed([0; 32]),
            Command::HANDSHAKE,
            request,
            &ok.to_bytes(),
        );
        Frame::Packet(packet).encode(&mut self.out);
        let (cipher, secret, profile) = if v2 {
            let (traffic, resume_key) = v2_session_keys(&client_key.0, &server_key, &iv);
            (
                SessionCipher::gcm(&traffic),
                SessionSecret::V2 { resume_key },
                Profile::V2,
            )
        } else {
            let key = legacy_session_key(&client_key.0, &server_key);
            (
                SessionCipher::cbc(&key, iv),
                SessionSecret::Legacy { key, iv },
                Profile::Legacy,
            )
        };
        let session = SessionRecord {
            session_id: ok.session_id,
            device,
            secret,
            expire_at_ms: ok.expire_time,
            binding: None,
        };
        self.handshake_established(Some(cipher), profile, heartbeat, session, keep, now);
        Ok(())
    }

    /// A new session's terms: the heartbeat negotiated with `hs`, and the
    /// HANDSHAKE_OK that announces them (the session id made of `id_raw`,
    /// its expiry, `server_key` and `capabilities`).
    pub(super) fn session_offer(
        &self,
        hs: &Handshake,
        id_raw: &[u8; 16],
        server_key: Vec<u8>,
        capabilities: Option<v2::Capabilities>,
        now: Instant,
    ) -> (Duration, HandshakeOk) {
        let heartbeat = self.negotiate_heartbeat(hs.max_heartbeat);
        let ok = HandshakeOk {
            server_key,
            heartbeat: duration_ms(heartbeat),
            session_id: hex_id(id_raw),
            expire_time: self.unix_ms(now) + duration_ms_i64(self.config.session_ttl),
            capabilities,
        };
        (heartbeat, ok)
    }

    /// Applies the client's `features` bits that change how this side sends
    /// (`FEATURE_PLAIN_BODIES`: no compression towards it), and returns the
    /// ones to echo in HANDSHAKE_OK.
    pub(super) fn honour_features(&mut self, caps: Option<&v2::Capabilities>) -> u32 {
        let mut echo = 0;
        if caps.is_some_and(v2::Capabilities::wants_plain_bodies) {
            self.sealer.never_compress();
            echo |= v2::FEATURE_PLAIN_BODIES;
        }
        if self.config.keep_binding && caps.is_some_and(v2::Capabilities::wants_keep_binding) {
            echo |= v2::FEATURE_KEEP_BINDING;
        }
        echo
    }

    /// With `keep` (the echo had `FEATURE_KEEP_BINDING`): remembers the
    /// session a binding is kept under.
    pub(super) fn keep_session(&mut self, session_id: &str, keep: bool) {
        self.kept_session = if keep {
            super::unhex_id(session_id).unwrap_or_default()
        } else {
            [0; 16]
        };
    }

    /// A full handshake answered: the connection is up with `cipher`, and
    /// the driver hears of the new session.
    pub(super) fn handshake_established(
        &mut self,
        cipher: Option<SessionCipher>,
        profile: Profile,
        heartbeat: Duration,
        session: SessionRecord,
        keep: bool,
        now: Instant,
    ) {
        self.sealer.set_cipher(cipher);
        self.profile = profile;
        self.set_heartbeat(heartbeat, now);
        self.keep_session(&session.session_id, keep);
        self.establish();
        let device = session.device.clone();
        self.events.push_back(ServerEvent::HandshakeCompleted {
            session: Some(session),
            device,
            profile,
        });
    }

    /// The transport-secured profile (ADR 0005): a plaintext handshake on a
    /// connection the driver marked secure. No RSA, no cipher; the resume
    /// key is drawn here and sent inside TLS in `serverKey`.
    pub(super) fn complete_transport_handshake(
        &mut self,
        request: i32,
        mut hs: Handshake,
        plaintext: bool,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        let allowed = plaintext
            && self.transport_secured()
            && self.config.accept_transport
            && self.config.enable_v2;
        if !allowed {
            self.refuse_handshake(request, "transport profile on a connection that is not TLS");
            return Ok(());
        }
        let device = match handshake_device(&mut hs) {
            Ok(d) => d,
            Err(why) => {
                self.refuse_handshake(request, why);
                return Ok(());
            }
        };
        let (Some(key), Some(id_raw)) = (
            self.draw::<{ crate::crypto::RESUME_KEY_LEN }>(),
            self.draw::<16>(),
        ) else {
            self.refuse_handshake(request, "no handshake in this state");
            return Ok(());
        };
        let echo = self.honour_features(hs.capabilities.as_ref());
        let keep = echo & v2::FEATURE_KEEP_BINDING != 0;
        let capabilities = Some(v2::Capabilities::transport().with_features(echo));
        let (heartbeat, ok) = self.session_offer(&hs, &id_raw, key.to_vec(), capabilities, now);
        self.send_plain(Command::HANDSHAKE, request, ok.to_bytes());
        self.transport = Transport::Profile;
        let session = SessionRecord {
            session_id: ok.session_id,
            device,
            secret: SessionSecret::Transport {
                resume_key: crate::crypto::ResumeKey(key),
            },
            expire_at_ms: ok.expire_time,
            binding: None,
        };
        self.handshake_established(None, Profile::V2, heartbeat, session, keep, now);
        Ok(())
    }

    pub(super) fn refuse_handshake(&mut self, request: i32, why: &str) {
        self.reply_error(
            ErrorMessage::with_reason(Command::HANDSHAKE, ErrorCode::NONE, "Param invalid"),
            request,
        );
        self.close_with(CloseReason::Refused(format!("handshake refused: {why}")));
    }

    /// A second handshake or fast connect on one connection closes it.
    pub(super) fn refuse_repeat(&mut self, p: &Packet, what: &str) {
        self.reply_error(
            ErrorMessage::new(p.cmd, ErrorCode::REPEAT_HANDSHAKE),
            p.session_id,
        );
        self.close_with(CloseReason::Refused(format!("repeated {what}")));
    }

    pub(super) fn establish(&mut self) {
        if let Some(prefix) = self.draw::<4>() {
            self.sealer.count_nonces(prefix);
        }
        // Nothing random is needed past this point: an established
        // connection does not carry an RNG.
        self.rng = None;
        self.state = State::Established;
        self.liveness.established();
    }

    /// Random bytes, while the connection still has its RNG.
    pub(super) fn draw<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.rng.as_deref_mut().map(random_array)
    }
}

/// The device a handshake names, checked; `Err` says why it is refused.
pub(super) fn handshake_device(hs: &mut Handshake) -> Result<DeviceInfo, &'static str> {
    let mut device = DeviceInfo {
        device_id: std::mem::take(&mut hs.device_id),
        os_name: std::mem::take(&mut hs.os_name),
        os_version: std::mem::take(&mut hs.os_version),
        client_version: std::mem::take(&mut hs.client_version),
    };
    if device.device_id.is_empty() {
        return Err("handshake without a device id");
    }
    device.check_limits()?;
    Ok(device)
}
