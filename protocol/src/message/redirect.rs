use super::{Body, v2};
use crate::error::DecodeError;
use crate::packet::Command;
use crate::wire::{Reader, Writer};

/// REDIRECT (v2 only), server to client: reconnect to `address` (or anywhere,
/// when empty) after `retry_after_ms` plus a random delay up to `jitter_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Redirect {
    pub address: String,
    pub retry_after_ms: u32,
    pub jitter_ms: u32,
    pub reason: String,
}

impl Body for Redirect {
    const CMD: Command = Command::REDIRECT;

    fn encode(&self, w: &mut Writer) {
        let m = v2::Redirect {
            address: self.address.clone(),
            retry_after_ms: self.retry_after_ms,
            jitter_ms: self.jitter_ms,
            reason: self.reason.clone(),
        };
        w.raw(&prost::Message::encode_to_vec(&m));
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let m: v2::Redirect = prost::Message::decode(r.remaining())
            .map_err(|e| DecodeError::Protobuf(e.to_string()))?;
        Ok(Self {
            address: m.address,
            retry_after_ms: m.retry_after_ms,
            jitter_ms: m.jitter_ms,
            reason: m.reason,
        })
    }
}
