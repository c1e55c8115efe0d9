use super::{Body, opt, read_ext, string, v2, write_ext};
use crate::error::DecodeError;
use crate::packet::Command;
use crate::wire::{Reader, Writer};

/// FAST_CONNECT, client to server, plaintext. A v2 client appends a proof that
/// it holds the session's resume key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FastConnect {
    pub session_id: String,
    pub device_id: String,
    pub min_heartbeat: i32,
    pub max_heartbeat: i32,
    pub proof: Option<v2::ResumeProof>,
}

impl Body for FastConnect {
    const CMD: Command = Command::FAST_CONNECT;

    fn encode(&self, w: &mut Writer) {
        w.string(opt(&self.session_id))
            .string(opt(&self.device_id))
            .i32(self.min_heartbeat)
            .i32(self.max_heartbeat);
        write_ext(w, self.proof.as_ref());
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            session_id: string(r, "sessionId")?,
            device_id: string(r, "deviceId")?,
            min_heartbeat: r.i32("minHeartbeat")?,
            max_heartbeat: r.i32("maxHeartbeat")?,
            proof: read_ext(r),
        })
    }
}

/// FAST_CONNECT_OK, server to client, plaintext. A v2 server appends its own
/// proof and nonce, from which both sides derive this connection's key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FastConnectOk {
    pub heartbeat: i32,
    pub accept: Option<v2::ResumeAccept>,
}

impl Body for FastConnectOk {
    const CMD: Command = Command::FAST_CONNECT;

    fn encode(&self, w: &mut Writer) {
        w.i32(self.heartbeat);
        write_ext(w, self.accept.as_ref());
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            heartbeat: r.i32("heartbeat")?,
            accept: read_ext(r),
        })
    }
}
