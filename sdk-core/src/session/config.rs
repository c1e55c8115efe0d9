//! What a session is configured with, and the address rules it checks.

use super::*;

/// How to reach the servers and who this client is.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Addresses tried in order: `host:port` (TCP), `tls://host:port` (TCP
    /// over TLS) or `ws://` / `wss://` URLs.
    pub servers: Vec<String>,
    /// mpush's allocator: an HTTP URL whose `GET` returns `host:port,...`.
    /// When set, the list is fetched before each round of connection attempts.
    pub allocator_url: Option<String>,
    pub public_key: Arc<RsaPublic>,
    pub device: DeviceInfo,
    /// Ask for the v2 profile (a legacy server ignores it).
    pub offer_v2: bool,
    /// Heartbeat asked of the server.
    pub heartbeat: Duration,
    pub backoff: BackoffConfig,
    /// Message ids remembered to drop repeats, across reconnects.
    pub dedup_capacity: usize,
    /// Up-pushes and ACKs kept while offline; more are refused.
    pub outbound_capacity: usize,
    /// How long an `Open` may take before it counts as failed.
    pub connect_timeout: Duration,
    /// The native driver's TLS (`tls://`, `wss://`): `None` trusts the
    /// webpki roots (Mozilla's); a PEM certificate here is the only one
    /// trusted (pinning, for private deployments and self-signed servers).
    /// Browsers use the page's own trust instead.
    pub tls_pinned_cert_pem: Option<String>,
    /// On `tls://` and `wss://` addresses, use the transport-secured profile
    /// (ADR 0005: no RSA or AES on top of TLS; servers of this project
    /// only). If a server refuses it, the session goes back to the classic
    /// handshake for good. Off by default.
    pub transport_profile: bool,
    /// Opt-in: use mpush's published RSA key (the default when no key is
    /// given, and recognised by value when one is) on plain connections to
    /// other hosts. Anyone can decrypt such a handshake; this is for apps
    /// that must reach a server still using that key. Off by default.
    pub allow_published_key: bool,
}

impl SessionConfig {
    /// The defaults, here and nowhere else (every binding starts from them).
    pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(240);
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DEFAULT_DEDUP_CAPACITY: usize = 1024;
    pub const DEFAULT_OUTBOUND_CAPACITY: usize = 256;
    /// The bounds `validate` enforces.
    pub const MIN_HEARTBEAT: Duration = Duration::from_secs(1);
    pub const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(100);
    pub const MAX_DURATION: Duration = Duration::from_secs(86_400);
    pub const MAX_CAPACITY: usize = 1_000_000;

    pub fn new(servers: Vec<String>, public_key: Arc<RsaPublic>, device: DeviceInfo) -> Self {
        Self {
            servers,
            allocator_url: None,
            public_key,
            device,
            offer_v2: true,
            heartbeat: Self::DEFAULT_HEARTBEAT,
            backoff: BackoffConfig::default(),
            dedup_capacity: Self::DEFAULT_DEDUP_CAPACITY,
            outbound_capacity: Self::DEFAULT_OUTBOUND_CAPACITY,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            tls_pinned_cert_pem: None,
            transport_profile: false,
            allow_published_key: false,
        }
    }

    /// Checks every field; the error (`invalid_input`) names the first bad
    /// one. Every binding calls this, so the rules are the same everywhere.
    pub fn validate(&self) -> Result<(), SessionError> {
        let bad = |m: String| Err(SessionError::InvalidInput(m));
        if self.servers.is_empty() && self.allocator_url.is_none() {
            return bad("servers or allocator_url is required".into());
        }
        for s in &self.servers {
            if let Err(why) = check_address(s) {
                return bad(format!("servers: \"{s}\": {why}"));
            }
            if !cfg!(feature = "classic") && !transport_capable(s) {
                return bad(format!(
                    "servers: \"{s}\": this build has no RSA or AES, so it speaks only the \
                     transport-secured profile: wss://, or ws:// to this machine for development"
                ));
            }
        }
        if let Some(u) = &self.allocator_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            return bad(format!("allocator_url: \"{u}\" is not an http(s):// URL"));
        }
        if self.device.device_id.is_empty() {
            return bad("device_id must not be empty".into());
        }
        let within = |d: Duration, min: Duration| d >= min && d <= Self::MAX_DURATION;
        if !within(self.heartbeat, Self::MIN_HEARTBEAT) {
            return bad("heartbeat: from 1 s to 1 day".into());
        }
        if !within(self.connect_timeout, Self::MIN_CONNECT_TIMEOUT) {
            return bad("connect_timeout: from 100 ms to 1 day".into());
        }
        let b = &self.backoff;
        if b.initial.is_zero() || b.max < b.initial || b.max > Self::MAX_DURATION {
            return bad("backoff: 0 < initial <= max <= 1 day".into());
        }
        if !(1.0..=100.0).contains(&b.multiplier) || !(0.0..=1.0).contains(&b.jitter) {
            return bad("backoff: multiplier from 1 to 100, jitter from 0 to 1".into());
        }
        for (name, n) in [
            ("dedup_capacity", self.dedup_capacity),
            ("outbound_capacity", self.outbound_capacity),
        ] {
            if n == 0 || n > Self::MAX_CAPACITY {
                return bad(format!("{name}: from 1 to 1000000"));
            }
        }
        // Last, once every field is well formed: mpush's published key (left
        // as the default or given by value) protects nothing on a plain
        // connection to another host.
        if self.public_key.is_mpush_published() && !self.allow_published_key {
            let exposed = self
                .servers
                .iter()
                .find(|s| !is_tls_address(s) && !is_loopback_address(s))
                .or(self
                    .allocator_url
                    .as_ref()
                    .filter(|u| !is_loopback_address(u)));
            if let Some(s) = exposed {
                return bad(format!(
                    "public_key: mpush's published key, which anyone can decrypt the handshake \
                     with, for \"{s}\": give the server's own key (`mpush-server keygen` prints \
                     it), or set allow_published_key (allowPublishedKey) to reach a server that \
                     still uses it"
                ));
            }
        }
        Ok(())
    }
}

/// An address whose connection is TLS (`tls://`, `wss://`).
pub fn is_tls_address(address: &str) -> bool {
    address.starts_with("tls://") || address.starts_with("wss://")
}

/// A `ws://` address on this machine (`localhost`, 127.0.0.0/8, `[::1]`):
/// a development server, which may take the transport-secured profile over
/// plain WebSocket when it says so (`net.dev_loopback_transport`, ADR 0005).
pub fn is_loopback_ws(address: &str) -> bool {
    address.starts_with("ws://") && is_loopback_address(address)
}

/// An address on this machine (`localhost`, 127.0.0.0/8, `[::1]`), in any
/// form a server list or an allocator URL takes: `host:port`,
/// `tls://host:port`, `ws://`, `wss://`, `http://`, `https://`.
pub fn is_loopback_address(address: &str) -> bool {
    let rest = address.split_once("://").map_or(address, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // After any userinfo: `http://127.0.0.1@evil.example` is not loopback.
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    // 127.0.0.0/8 as a dotted quad, or ::1 (no IP parser: this runs in the
    // browser module, where every kilobyte counts).
    let v4_loopback = host.split('.').count() == 4
        && host.starts_with("127.")
        && host.split('.').all(|p| p.parse::<u8>().is_ok());
    host.eq_ignore_ascii_case("localhost") || host == "::1" || v4_loopback
}

/// Whether this build may use the transport-secured profile on `address`:
/// TLS addresses, and (in a build without the classic handshake, which has
/// no other way in) `ws://` to this machine for development.
pub(super) fn transport_capable(address: &str) -> bool {
    is_tls_address(address) || (!cfg!(feature = "classic") && is_loopback_ws(address))
}

/// `host:port`, `tls://host:port`, `ws://...` or `wss://...`.
fn check_address(s: &str) -> Result<(), &'static str> {
    if let Some(rest) = s.strip_prefix("ws://").or_else(|| s.strip_prefix("wss://")) {
        return if rest.is_empty() || rest.starts_with('/') {
            Err("no host")
        } else {
            Ok(())
        };
    }
    let hostport = s.strip_prefix("tls://").unwrap_or(s);
    match hostport.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0) => Ok(()),
        _ => Err("not host:port, tls://host:port, ws:// or wss://"),
    }
}

/// The server list an mpush allocator answers (`host:port,host:port`, or
/// URLs), for `Session::handle_servers`.
pub fn parse_server_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}
