//! The machine's settings: `ServerConfig` (mpush's defaults).

use std::sync::Arc;
use std::time::Duration;

use crate::ack::RetryPolicy;
use crate::crypto::RsaPrivate;

/// Server-side protocol settings. Defaults are mpush's.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub private_key: Arc<RsaPrivate>,
    /// Bounds of the negotiated heartbeat (mpush: 3 min and 3 min).
    pub min_heartbeat: Duration,
    pub max_heartbeat: Duration,
    /// Heartbeat check interval before a handshake (mpush: 10 s).
    pub initial_heartbeat: Duration,
    /// Consecutive missed heartbeats tolerated; one more closes (mpush: 2).
    pub max_heartbeat_misses: u32,
    /// How long a session can be resumed (mpush: 1 day).
    pub session_ttl: Duration,
    /// Largest accepted body on the wire (mpush: 10 KiB).
    pub max_body: usize,
    /// Largest body a compressed packet may inflate to.
    pub max_inflated: usize,
    /// Compress outgoing bodies longer than this (mpush: 10 KiB).
    pub compress_over: usize,
    /// Offer the v2 profile to clients that ask for it.
    pub enable_v2: bool,
    /// Accept HTTP_PROXY requests (mpush's `mp.http.proxy-enabled`).
    pub http_proxy: bool,
    /// Retries of pushes that wait for an ACK.
    pub ack_retry: RetryPolicy,
    /// Pushes awaiting an ACK at once; more are refused with `PushError::Busy`.
    pub max_inflight: usize,
    /// A connection that has not completed a handshake or fast connect within
    /// this is closed, whatever it sends (default 10 s).
    pub handshake_timeout: Duration,
    /// Largest RSA ciphertext of a handshake, in blocks of the key's size
    /// (default 8; a real client sends two to four).
    pub max_handshake_blocks: usize,
    /// Refuse legacy and plaintext handshakes and legacy fast connects: only
    /// the v2 profile is served.
    pub require_v2: bool,
    /// Hand the RSA private-key operation to the driver
    /// (`ServerEvent::DecryptRequested`) instead of doing it inline, so a
    /// driver can run it off its async workers.
    pub offload_rsa: bool,
    /// Serve the transport-secured profile (ADR 0005) on connections the
    /// driver marked secure (`set_transport_secured`); never elsewhere.
    pub accept_transport: bool,
    /// Honour `FEATURE_KEEP_BINDING` (ADR 0008): keep a binding with the
    /// session and restore it on a fast connect (`ServerEvent::RestoreRequested`).
    /// Off by default: a driver that turns it on answers that event.
    pub keep_binding: bool,
}

impl ServerConfig {
    pub fn new(private_key: Arc<RsaPrivate>) -> Self {
        Self {
            private_key,
            min_heartbeat: Duration::from_secs(180),
            max_heartbeat: Duration::from_secs(180),
            initial_heartbeat: Duration::from_secs(10),
            max_heartbeat_misses: 2,
            session_ttl: Duration::from_secs(86_400),
            max_body: crate::packet::DEFAULT_MAX_BODY,
            max_inflated: 1 << 20,
            compress_over: 10 * 1024,
            enable_v2: true,
            http_proxy: false,
            ack_retry: RetryPolicy::default(),
            max_inflight: 1024,
            handshake_timeout: Duration::from_secs(10),
            max_handshake_blocks: 8,
            require_v2: false,
            offload_rsa: false,
            accept_transport: true,
            keep_binding: false,
        }
    }
}
