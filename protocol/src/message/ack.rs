use super::{Body, v2};
use crate::error::DecodeError;
use crate::packet::Command;
use crate::wire::{Reader, Writer};

/// ACK: empty on the legacy profile (the packet's session id names the push);
/// on v2 it lists the message ids it confirms.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ack {
    pub message_ids: Vec<u64>,
}

impl Body for Ack {
    const CMD: Command = Command::ACK;

    fn encode(&self, w: &mut Writer) {
        if !self.message_ids.is_empty() {
            let body = v2::AckBody {
                message_ids: self.message_ids.clone(),
            };
            w.raw(&prost::Message::encode_to_vec(&body));
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        if r.is_empty() {
            return Ok(Self::default());
        }
        let body: v2::AckBody = prost::Message::decode(r.remaining())
            .map_err(|e| DecodeError::Protobuf(e.to_string()))?;
        Ok(Self {
            message_ids: body.message_ids,
        })
    }
}
