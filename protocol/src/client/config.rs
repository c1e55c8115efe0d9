//! The machine's settings: `ClientConfig` (mpush-client-java's defaults).

use std::sync::Arc;
use std::time::Duration;

use crate::crypto::RsaPublic;
use crate::session::DeviceInfo;

/// Client-side protocol settings. Defaults are mpush-client-java's.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub public_key: Arc<RsaPublic>,
    pub device: DeviceInfo,
    /// Heartbeat bounds sent to the server (mpush: both 240 s).
    pub min_heartbeat: Duration,
    pub max_heartbeat: Duration,
    /// Handshake and fast-connect answer timeout (mpush: 3 s, no retry).
    pub handshake_timeout: Duration,
    /// BIND/UNBIND answer timeout (mpush: 3 s) and resends of BIND (mpush: 1).
    pub bind_timeout: Duration,
    pub bind_retries: u32,
    /// Compress bodies longer than this (mpush client: 1024).
    pub compress_over: usize,
    /// Largest body accepted from the server, on the wire and inflated.
    pub max_body: usize,
    /// Ask for the v2 profile; a legacy server ignores the request.
    pub offer_v2: bool,
    /// This connection is TLS (or loopback in development): use the
    /// transport-secured profile (ADR 0005): a plaintext handshake, no
    /// RSA and no cipher. Only servers of this project accept it, and only
    /// on connections they know to be TLS. Needs `offer_v2`.
    pub transport_secured: bool,
    /// Ask the server to keep this device's binding with its session (ADR
    /// 0008), so a fast connect comes back bound without a BIND
    /// (`ClientConnection::binding_kept`). Servers that do not keep
    /// bindings ignore it.
    pub keep_binding: bool,
}

impl ClientConfig {
    pub fn new(public_key: Arc<RsaPublic>, device: DeviceInfo) -> Self {
        Self {
            public_key,
            device,
            min_heartbeat: Duration::from_secs(240),
            max_heartbeat: Duration::from_secs(240),
            handshake_timeout: Duration::from_secs(3),
            bind_timeout: Duration::from_secs(3),
            bind_retries: 1,
            compress_over: 1024,
            max_body: 1 << 20,
            offer_v2: true,
            transport_secured: false,
            keep_binding: true,
        }
    }
}
