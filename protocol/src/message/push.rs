use super::Body;
use crate::error::DecodeError;
use crate::packet::Command;
use crate::wire::{Reader, Writer};

/// PUSH in either direction: the whole body is the content, with no length
/// prefix. On the v2 profile the content is an encoded `v2::PushEnvelope`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Push {
    pub content: Vec<u8>,
}

impl Body for Push {
    const CMD: Command = Command::PUSH;

    fn encode(&self, w: &mut Writer) {
        w.raw(&self.content);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            content: r.remaining().to_vec(),
        })
    }
}
