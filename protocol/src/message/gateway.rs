use super::{Body, bytes, opt, string};
use crate::error::DecodeError;
use crate::packet::Command;
use crate::wire::{Reader, Writer};

/// GATEWAY_PUSH, push client to gateway node (plaintext). An empty `user_id`
/// means broadcast, filtered by `tags` (JSON array text) or `condition`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatewayPush {
    pub user_id: String,
    pub client_type: i32,
    pub timeout: i32,
    pub content: Vec<u8>,
    pub task_id: String,
    pub tags: String,
    pub condition: String,
}

impl Body for GatewayPush {
    const CMD: Command = Command::GATEWAY_PUSH;

    fn encode(&self, w: &mut Writer) {
        w.string(opt(&self.user_id))
            .i32(self.client_type)
            .i32(self.timeout)
            .bytes(Some(&self.content))
            .string(opt(&self.task_id))
            .string(opt(&self.tags))
            .string(opt(&self.condition));
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            user_id: string(r, "userId")?,
            client_type: r.i32("clientType")?,
            timeout: r.i32("timeout")?,
            content: bytes(r, "content")?,
            task_id: string(r, "taskId")?,
            tags: string(r, "tags")?,
            condition: string(r, "condition")?,
        })
    }
}

/// GATEWAY_KICK, node to node (mpush sends it over the UDP gateway only).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatewayKick {
    pub user_id: String,
    pub device_id: String,
    pub conn_id: String,
    pub client_type: i32,
    pub target_server: String,
    pub target_port: i32,
}

impl Body for GatewayKick {
    const CMD: Command = Command::GATEWAY_KICK;

    fn encode(&self, w: &mut Writer) {
        w.string(opt(&self.user_id))
            .string(opt(&self.device_id))
            .string(opt(&self.conn_id))
            .i32(self.client_type)
            .string(opt(&self.target_server))
            .i32(self.target_port);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            user_id: string(r, "userId")?,
            device_id: string(r, "deviceId")?,
            conn_id: string(r, "connId")?,
            client_type: r.i32("clientType")?,
            target_server: string(r, "targetServer")?,
            target_port: r.i32("targetPort")?,
        })
    }
}
