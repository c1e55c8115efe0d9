use super::{Body, opt, string};
use crate::error::DecodeError;
use crate::packet::Command;
use crate::wire::{Reader, Writer};

/// BIND and UNBIND bodies (the same fields). `data` is what the Java client calls
/// "alias" and leaves null; this project carries the optional bind token there.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BindUser {
    pub user_id: String,
    pub data: String,
    pub tags: String,
}

impl Body for BindUser {
    const CMD: Command = Command::BIND;

    fn encode(&self, w: &mut Writer) {
        w.string(opt(&self.user_id))
            .string(opt(&self.data))
            .string(opt(&self.tags));
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            user_id: string(r, "userId")?,
            data: string(r, "data")?,
            tags: string(r, "tags")?,
        })
    }
}
