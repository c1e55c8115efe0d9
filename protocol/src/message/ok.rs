use super::{Body, opt, string};
use crate::error::DecodeError;
use crate::packet::Command;
use crate::wire::{Reader, Writer};

/// OK, server to client: `cmd` names the command being answered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OkMessage {
    pub cmd: u8,
    pub code: u8,
    pub data: String,
}

impl OkMessage {
    pub fn new(cmd: Command, data: impl Into<String>) -> Self {
        Self {
            cmd: cmd.0,
            code: 0,
            data: data.into(),
        }
    }
}

impl Body for OkMessage {
    const CMD: Command = Command::OK;

    fn encode(&self, w: &mut Writer) {
        w.u8(self.cmd).u8(self.code).string(opt(&self.data));
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            cmd: r.u8("cmd")?,
            code: r.u8("code")?,
            data: string(r, "data")?,
        })
    }
}
