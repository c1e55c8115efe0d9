use super::{Body, opt, string};
use crate::error::DecodeError;
use crate::packet::Command;
use crate::wire::{Reader, Writer};

/// KICK, server to client: another device logged in as the same user and client type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Kick {
    pub device_id: String,
    pub user_id: String,
}

impl Body for Kick {
    const CMD: Command = Command::KICK;

    fn encode(&self, w: &mut Writer) {
        w.string(opt(&self.device_id)).string(opt(&self.user_id));
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            device_id: string(r, "deviceId")?,
            user_id: string(r, "userId")?,
        })
    }
}
