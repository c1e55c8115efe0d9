//! Every message body of spec section 4, typed, with encode and decode, plus the
//! v2 protobuf bodies (`v2`) and the WebSocket JSON form of spec section 8 (`json`).
//!
//! Strings follow Java's null rule: an empty string and null encode alike (a zero
//! length) and decode as an empty `String`, so the mapping is lossless on the wire.

mod ack;
mod bind;
mod error;
mod fast_connect;
mod gateway;
mod handshake;
mod http;
pub mod json;
mod kick;
mod ok;
mod push;
mod redirect;

pub use ack::Ack;
pub use bind::BindUser;
pub use error::{ErrorCode, ErrorMessage};
pub use fast_connect::{FastConnect, FastConnectOk};
pub use gateway::{GatewayKick, GatewayPush};
pub use handshake::{Handshake, HandshakeOk};
pub use http::{HttpMethod, HttpRequest, HttpResponse, format_headers, parse_headers};
pub use kick::Kick;
pub use ok::OkMessage;
pub use push::Push;
pub use redirect::Redirect;

use crate::error::DecodeError;
use crate::packet::Command;
use crate::wire::{Reader, Writer};

/// The protobuf messages of the v2 profile, generated from `proto/mpush_v2.proto`.
pub mod v2 {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/mpush.v2.rs"));

    /// The profile number this crate speaks.
    pub const PROFILE: u32 = 2;

    /// `features` bit: the transport-secured profile (ADR 0005). The
    /// connection is TLS, so packets carry no application-layer crypto.
    pub const FEATURE_TRANSPORT: u32 = 1;

    /// `features` bit: the sender does not inflate, so the server sends it
    /// no compressed body (the browser's transport-only build leaves zlib
    /// out; compression belongs to the transport there). Servers that know
    /// the bit echo it in HANDSHAKE_OK.
    pub const FEATURE_PLAIN_BODIES: u32 = 2;

    /// `features` bit (ADR 0008): keep this connection's binding with its
    /// session, and restore it on a fast connect (`ResumeAccept.bound`), so
    /// the client sends no BIND after resuming. Echoed when honoured.
    pub const FEATURE_KEEP_BINDING: u32 = 4;

    /// The lengths a resume nonce (`ResumeProof.client_nonce`,
    /// `ResumeAccept.server_nonce`) may have, in bytes: at least 128 bits of
    /// freshness, and a bound on what the other side can make the receiver
    /// hash before the proof is checked. This crate sends 16.
    pub const RESUME_NONCE_LEN: std::ops::RangeInclusive<usize> = 16..=64;

    impl Capabilities {
        pub fn v2() -> Self {
            Self {
                profile: PROFILE,
                features: 0,
            }
        }

        /// v2 on the transport-secured profile.
        pub fn transport() -> Self {
            Self {
                profile: PROFILE,
                features: FEATURE_TRANSPORT,
            }
        }

        pub fn has_transport(&self) -> bool {
            self.profile >= PROFILE && self.features & FEATURE_TRANSPORT != 0
        }

        /// The sender asks for uncompressed bodies (`FEATURE_PLAIN_BODIES`).
        pub fn wants_plain_bodies(&self) -> bool {
            self.profile >= PROFILE && self.features & FEATURE_PLAIN_BODIES != 0
        }

        /// The sender asks the server to keep its binding (`FEATURE_KEEP_BINDING`).
        pub fn wants_keep_binding(&self) -> bool {
            self.profile >= PROFILE && self.features & FEATURE_KEEP_BINDING != 0
        }

        /// These capabilities with `features` bits added.
        pub fn with_features(mut self, features: u32) -> Self {
            self.features |= features;
            self
        }
    }
}

/// A message body with its command code and its binary encoding.
pub trait Body: Sized {
    /// The command this body travels under.
    const CMD: Command;

    fn encode(&self, w: &mut Writer);
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError>;

    fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.encode(&mut w);
        w.finish()
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::decode(&mut Reader::new(bytes))
    }
}

/// Writes an optional protobuf extension as a trailing `bytes` field.
fn write_ext<M: prost::Message>(w: &mut Writer, ext: Option<&M>) {
    if let Some(m) = ext {
        w.bytes(Some(&m.encode_to_vec()));
    }
}

/// Reads an optional trailing extension. Legacy peers send nothing, and bytes
/// that do not parse are ignored as a legacy decoder would ignore them. An
/// extension that decodes to the empty message counts as absent: the null rule
/// of `bytes` fields cannot tell "empty" from "none" on the way out either.
fn read_ext<M: prost::Message + Default + PartialEq>(r: &mut Reader<'_>) -> Option<M> {
    if r.is_empty() {
        return None;
    }
    let bytes = r.bytes("extension").ok()??;
    M::decode(bytes).ok().filter(|m| *m != M::default())
}

fn string(r: &mut Reader<'_>, field: &'static str) -> Result<String, DecodeError> {
    Ok(r.string(field)?.unwrap_or_default())
}

fn bytes(r: &mut Reader<'_>, field: &'static str) -> Result<Vec<u8>, DecodeError> {
    Ok(r.bytes(field)?.map(<[u8]>::to_vec).unwrap_or_default())
}

fn opt(s: &str) -> Option<&str> {
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fuzz regression: a present-but-empty extension decoded as `Some(empty)`
    /// and re-encoded as nothing.
    #[test]
    fn empty_extension_is_absent() {
        let mut w = Writer::new();
        w.i32(180_000).bytes(Some(&[0x22, 0x00]));
        let ok = FastConnectOk::from_bytes(&w.finish()).expect("decodes");
        assert_eq!(ok.accept, None);
        assert_eq!(
            FastConnectOk::from_bytes(&ok.to_bytes()).expect("again"),
            ok
        );
    }
}
