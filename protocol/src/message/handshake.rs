use super::{Body, bytes, opt, read_ext, string, v2, write_ext};
use crate::error::DecodeError;
use crate::packet::Command;
use crate::wire::{Reader, Writer};

/// HANDSHAKE, client to server (RSA-sealed). A v2 client appends its capabilities.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Handshake {
    pub device_id: String,
    pub os_name: String,
    pub os_version: String,
    pub client_version: String,
    pub iv: Vec<u8>,
    pub client_key: Vec<u8>,
    pub min_heartbeat: i32,
    pub max_heartbeat: i32,
    pub timestamp: i64,
    pub capabilities: Option<v2::Capabilities>,
}

impl Body for Handshake {
    const CMD: Command = Command::HANDSHAKE;

    fn encode(&self, w: &mut Writer) {
        w.string(opt(&self.device_id))
            .string(opt(&self.os_name))
            .string(opt(&self.os_version))
            .string(opt(&self.client_version))
            .bytes(Some(&self.iv))
            .bytes(Some(&self.client_key))
            .i32(self.min_heartbeat)
            .i32(self.max_heartbeat)
            .i64(self.timestamp);
        write_ext(w, self.capabilities.as_ref());
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            device_id: string(r, "deviceId")?,
            os_name: string(r, "osName")?,
            os_version: string(r, "osVersion")?,
            client_version: string(r, "clientVersion")?,
            iv: bytes(r, "iv")?,
            client_key: bytes(r, "clientKey")?,
            min_heartbeat: r.i32("minHeartbeat")?,
            max_heartbeat: r.i32("maxHeartbeat")?,
            timestamp: r.i64("timestamp")?,
            capabilities: read_ext(r),
        })
    }
}

/// HANDSHAKE_OK, server to client (AES-CBC with the client key). A v2 server
/// appends the capabilities it agreed to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HandshakeOk {
    pub server_key: Vec<u8>,
    pub heartbeat: i32,
    pub session_id: String,
    pub expire_time: i64,
    pub capabilities: Option<v2::Capabilities>,
}

impl Body for HandshakeOk {
    const CMD: Command = Command::HANDSHAKE;

    fn encode(&self, w: &mut Writer) {
        w.bytes(Some(&self.server_key))
            .i32(self.heartbeat)
            .string(opt(&self.session_id))
            .i64(self.expire_time);
        write_ext(w, self.capabilities.as_ref());
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            server_key: bytes(r, "serverKey")?,
            heartbeat: r.i32("heartbeat")?,
            session_id: string(r, "sessionId")?,
            expire_time: r.i64("expireTime")?,
            capabilities: read_ext(r),
        })
    }
}
