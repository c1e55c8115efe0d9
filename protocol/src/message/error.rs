use super::{Body, opt, string};
use crate::error::DecodeError;
use crate::packet::Command;
use crate::wire::{Reader, Writer};

/// The error code table of spec section 4. Unknown codes are kept.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct ErrorCode(pub u8);

impl ErrorCode {
    /// Free-text errors ("Param invalid", "not handshake", "bind failed", ...).
    pub const NONE: Self = Self(0);
    pub const OFFLINE: Self = Self(1);
    pub const PUSH_CLIENT_FAILURE: Self = Self(2);
    pub const ROUTER_CHANGE: Self = Self(3);
    pub const ACK_TIMEOUT: Self = Self(4);
    pub const DISPATCH_ERROR: Self = Self(100);
    pub const UNSUPPORTED_CMD: Self = Self(101);
    pub const REPEAT_HANDSHAKE: Self = Self(102);
    pub const SESSION_EXPIRED: Self = Self(103);
    pub const INVALID_DEVICE: Self = Self(104);
    /// v2: an up-push the server could not accept now (its sinks are full or
    /// the sender is over its rate); send it again later.
    pub const RETRY_LATER: Self = Self(105);
    /// v2: an up-push the server will never accept as sent (not bound).
    pub const REJECTED: Self = Self(106);

    /// The reason string mpush sends with this code.
    pub fn reason(self) -> &'static str {
        match self {
            Self::OFFLINE => "user offline",
            Self::PUSH_CLIENT_FAILURE => "push to client failure",
            Self::ROUTER_CHANGE => "router change",
            Self::ACK_TIMEOUT => "ack timeout",
            Self::DISPATCH_ERROR => "handle message error",
            Self::UNSUPPORTED_CMD => "unsupported command",
            Self::REPEAT_HANDSHAKE => "repeat handshake",
            Self::SESSION_EXPIRED => "session expired",
            Self::INVALID_DEVICE => "invalid device",
            Self::RETRY_LATER => "retry later",
            Self::REJECTED => "rejected",
            _ => "",
        }
    }
}

/// ERROR, server to client: `cmd` names the command being answered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorMessage {
    pub cmd: u8,
    pub code: ErrorCode,
    pub reason: String,
    pub data: String,
}

impl ErrorMessage {
    /// An error with the code's standard reason.
    pub fn new(cmd: Command, code: ErrorCode) -> Self {
        Self::with_reason(cmd, code, code.reason())
    }

    pub fn with_reason(cmd: Command, code: ErrorCode, reason: impl Into<String>) -> Self {
        Self {
            cmd: cmd.0,
            code,
            reason: reason.into(),
            data: String::new(),
        }
    }
}

impl Body for ErrorMessage {
    const CMD: Command = Command::ERROR;

    fn encode(&self, w: &mut Writer) {
        w.u8(self.cmd)
            .u8(self.code.0)
            .string(opt(&self.reason))
            .string(opt(&self.data));
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            cmd: r.u8("cmd")?,
            code: ErrorCode(r.u8("code")?),
            reason: string(r, "reason")?,
            data: string(r, "data")?,
        })
    }
}
