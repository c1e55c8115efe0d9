//! Settings: defaults, then the TOML file, then `MPUSH__SECTION__KEY`
//! environment variables, then command-line flags; validated once at start-up.
//!
//! Longer than most files on purpose: every setting sits beside its
//! default and its check (half the lines are the documentation `config
//! print` and the README's reference come from), and the tests at the end
//! read them together.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use mpush_protocol::crypto::RsaPrivate;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub net: Net,
    pub security: Security,
    pub limits: Limits,
    pub delivery: Delivery,
    pub shutdown: Shutdown,
    pub cluster: Cluster,
    pub sinks: Sinks,
    pub tls: TlsSettings,
    pub http_proxy: HttpProxy,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Net {
    /// mpush's connect port.
    pub tcp: String,
    /// WebSocket gateway; empty disables it.
    pub ws: String,
    /// HTTP API (and mpush's alloc routes).
    pub http: String,
    /// `host:port` the allocator (`GET /`) hands to clients; default: the TCP address.
    pub public_address: String,
    /// `ws://` or `wss://` URL the allocator hands to browsers (`GET /?transport=ws`);
    /// default: the WebSocket port on the host the browser asked for.
    pub public_ws_url: String,
    /// A folder served read-only at `/demo/` (the demo page, `demo-web/`),
    /// when it exists; empty disables it.
    pub demo_dir: String,
    /// Reverse proxies (IPs or CIDRs, e.g. `10.0.0.0/8`) whose forwarding
    /// header (`forwarded_header`) is believed: behind them,
    /// the API and the WebSocket gateway see the client's address (for the
    /// loopback-only API, per-IP limits and logs) and the original scheme.
    pub trusted_proxies: Vec<String>,
    /// The header those proxies set: `x-forwarded-for` (with
    /// `X-Forwarded-Proto`; nginx, HAProxy, Envoy, Traefik, cloud load
    /// balancers) or `forwarded` (RFC 7239). Only that one is read: the
    /// other could be the client's own. A hop that is not a clean address
    /// makes the caller an unknown remote one (fail closed).
    pub forwarded_header: String,
    /// Plain `ws://` connections from a loopback peer count as secure for
    /// the transport-secured profile (ADR 0005), so the browser's `mpush-sdk`
    /// module, which has no RSA or AES, can reach a server on this machine
    /// without TLS. Unset (the default): on exactly when `net.ws` listens on
    /// loopback without TLS and no `trusted_proxies` are configured (the
    /// server `cargo run` starts); an upgrade request that carries
    /// forwarding headers (a reverse proxy on this machine) never counts.
    /// `true` insists (refused unless `net.ws` is on loopback and there are
    /// no proxies); `false` turns it off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev_loopback_transport: Option<bool>,
}

impl Default for Net {
    fn default() -> Self {
        Self {
            // Loopback by default: a local demo needs no credentials; a
            // server reachable from other hosts is configured on purpose
            // (and then must have its own key, bind auth and API tokens).
            tcp: "127.0.0.1:3000".into(),
            ws: "127.0.0.1:8088".into(),
            http: "127.0.0.1:9999".into(),
            public_address: String::new(),
            public_ws_url: String::new(),
            demo_dir: "demo-web".into(),
            trusted_proxies: Vec::new(),
            forwarded_header: "x-forwarded-for".into(),
            dev_loopback_transport: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Security {
    /// RSA private key, PKCS#8 (what `mpush-server keygen` and mpush write)
    /// or PKCS#1, as PEM or bare base64. Empty: mpush's *published* default
    /// key, which anyone can decrypt handshakes with: loopback only, unless
    /// `allow_published_key`. That key pasted in (any format) counts the same.
    pub private_key: String,
    /// Or read it from this file.
    pub private_key_file: String,
    /// Opt-in: run listeners reachable from other hosts with mpush's published
    /// RSA key (for deployed mpush apps that embed it; their traffic is not
    /// confidential against anyone who has the key, i.e. everyone).
    pub allow_published_key: bool,
    /// Bearer tokens accepted by the HTTP API. None: the API answers loopback
    /// clients only (and an HTTP listener reachable from other hosts needs
    /// `anonymous_api_on_loopback`, since a local reverse proxy would make
    /// every caller look local).
    pub api_tokens: Vec<String>,
    /// Opt-in: no API tokens although the HTTP listener is reachable from
    /// other hosts; loopback callers (a local proxy too) are trusted.
    pub anonymous_api_on_loopback: bool,
    /// HMAC secret for mpush-style bind tokens (`<expiry>.<hex HMAC>`).
    pub bind_secret: String,
    /// JWT bind tokens signed with HS256 and this secret (32+ characters).
    pub jwt_secret: String,
    /// JWT bind tokens signed with RS256 or ES256: the verifying public key (PEM).
    pub jwt_public_key: String,
    /// Or read it from this file.
    pub jwt_public_key_file: String,
    /// Required `iss` / `aud` claims, when set.
    pub jwt_issuer: String,
    pub jwt_audience: String,
    /// A bind token (JWT or mpush-style) that expires further away than
    /// this many seconds is refused, so a leaked token cannot be one that
    /// lives for years. 0 (the default): no limit.
    pub max_bind_token_lifetime_secs: u64,
    /// Opt-in: accept unauthenticated binds (mpush's behaviour: anyone can
    /// bind as any user and read that user's offline inbox) on listeners
    /// reachable from other hosts. Loopback listeners always may.
    pub anonymous_bind: bool,
    /// Serve only the v2 profile: legacy, plaintext and JSON handshakes and
    /// legacy fast connects are refused.
    pub require_v2: bool,
    /// Opt-in: keep resumable session secrets in Redis unsealed, in mpush's
    /// value format (to share sessions with Java mpush nodes during a
    /// migration). Default: sealed with a key derived from the RSA key, so
    /// read access to Redis does not let anyone resume a session.
    pub plaintext_sessions_at_rest: bool,
    /// Host names the HTTP API answers to (DNS-rebinding defence), besides
    /// IP literals and `localhost`; `*` allows any.
    pub allowed_hosts: Vec<String>,
    /// Origins whose pages may call the HTTP API from a browser (CORS), e.g.
    /// `https://admin.example.com`; `*` allows any. Empty: no CORS headers.
    pub cors_origins: Vec<String>,
}

impl Security {
    /// What bind tokens are checked with.
    pub fn token_keys(&self) -> crate::auth::TokenKeys<'_> {
        crate::auth::TokenKeys {
            bind_secret: &self.bind_secret,
            jwt_secret: &self.jwt_secret,
            jwt_public_key: &self.jwt_public_key,
            jwt_public_key_file: &self.jwt_public_key_file,
            jwt_issuer: &self.jwt_issuer,
            jwt_audience: &self.jwt_audience,
            max_bind_token_lifetime_secs: self.max_bind_token_lifetime_secs,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub max_connections: usize,
    /// Largest packet body on the wire (mpush: 10240).
    pub max_packet_size: usize,
    /// New connections per second per client IP (burst of the same size):
    /// also the address's RSA budget, since a connection gets one handshake.
    pub handshakes_per_ip: u32,
    /// Commands queued for one connection before it counts as a slow consumer.
    pub outbound_queue: usize,
    /// A write that takes longer than this closes the connection (slow consumer).
    pub write_timeout_ms: u64,
    pub min_heartbeat_ms: u64,
    pub max_heartbeat_ms: u64,
    /// WebSocket read buffer per connection (small: idle connections stay cheap).
    pub ws_read_buffer: usize,
    /// Open connections per client IP (carrier NAT puts many phones behind one).
    pub max_connections_per_ip: usize,
    /// A connection that has not completed its handshake by then is closed.
    pub handshake_timeout_ms: u64,
    /// Threads doing RSA handshakes at once (0: two per core) and handshakes
    /// waiting for one at most (more are refused).
    pub rsa_workers: usize,
    pub rsa_queue: usize,
    /// TCP keepalive idle time on accepted sockets (0: off).
    pub tcp_keepalive_secs: u64,
    /// HTTP API: time to send a request's headers, idle time between
    /// requests on a kept-alive connection, and open connections at most.
    pub http_header_timeout_ms: u64,
    pub http_idle_timeout_ms: u64,
    pub http_max_connections: usize,
    /// Resumable sessions kept in memory (embedded store): by count and by
    /// bytes; over either, the oldest are forgotten (their clients do a full
    /// handshake next time).
    pub max_sessions: usize,
    pub max_session_bytes: usize,
    /// Topics one user may subscribe to, and subscribers of one topic.
    pub max_topics_per_user: usize,
    pub max_subscribers_per_topic: usize,
    /// Up-pushes (client → backend) per second and burst, per connection and
    /// per user (all of the user's connections on this node). Over a limit
    /// the up-push is refused with "retry later".
    pub up_push_rate_per_conn: u32,
    pub up_push_burst_per_conn: u32,
    pub up_push_rate_per_user: u32,
    pub up_push_burst_per_user: u32,
    /// A connection whose up-pushes are refused for its rate this many times
    /// in a row is closed (abuse).
    pub up_push_abuse_refusals: u32,
    /// ADR 0008: keep a client's binding with its session and restore it on
    /// a fast connect, for clients that ask (our SDKs do), so they come back
    /// bound without a BIND. A kept binding ends with its bind token's
    /// expiry; set `false` to check a token at every reconnect. Unset: on
    /// when binds need no token, off when they do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_binding: Option<bool>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 19_000,
            max_packet_size: 10 * 1024,
            handshakes_per_ip: 100,
            outbound_queue: 256,
            write_timeout_ms: 10_000,
            min_heartbeat_ms: 180_000,
            max_heartbeat_ms: 180_000,
            ws_read_buffer: 256,
            max_connections_per_ip: 10_000,
            handshake_timeout_ms: 10_000,
            rsa_workers: 0,
            rsa_queue: 512,
            tcp_keepalive_secs: 60,
            http_header_timeout_ms: 10_000,
            http_idle_timeout_ms: 60_000,
            http_max_connections: 1024,
            max_sessions: 1_000_000,
            max_session_bytes: 256 << 20,
            max_topics_per_user: 256,
            max_subscribers_per_topic: 1_000_000,
            up_push_rate_per_conn: 50,
            up_push_burst_per_conn: 100,
            up_push_rate_per_user: 100,
            up_push_burst_per_user: 200,
            up_push_abuse_refusals: 100,
            keep_binding: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Delivery {
    /// Waits between a push and its retries (mpush: 2 s, 4 s, 6 s).
    pub ack_waits_ms: Vec<u64>,
    pub ack_retries: u32,
    /// How long trace states are kept (7 days).
    pub trace_ttl_secs: u64,
    /// Traces kept in memory at most (the embedded store), by count and by
    /// bytes; the oldest go first.
    pub trace_max: usize,
    pub trace_max_bytes: usize,
    /// Bytes of traces kept in Redis at most (cluster mode), the oldest
    /// going first; 0: bounded by `trace_ttl_secs` only. Counted as the
    /// store writes them, in 16 shards of a sixteenth each.
    pub redis_trace_max_bytes: u64,
    /// Messages kept per offline user; more are refused (reported, never dropped silently).
    pub inbox_max: usize,
    /// Longest `ttlSeconds` accepted.
    pub max_ttl_secs: u64,
    /// Global unicast rate (messages/s); over it, work is delayed.
    pub push_rate: u32,
    /// Broadcast rate (messages/s) and the largest broadcast.
    pub broadcast_rate: u32,
    pub broadcast_max: usize,
    /// How long a session can be resumed with fast connect (1 day).
    pub session_ttl_secs: u64,
    /// How long a request with an `Idempotency-Key` (or a `traceId`) is
    /// remembered: a retry within it gets the first answer and delivers
    /// nothing twice (1 day).
    pub idempotency_window_secs: u64,
    /// Keys (and bytes of answers) kept at most by the embedded store; over
    /// either, the oldest go first. Redis keeps them for the window.
    pub idempotency_max_keys: usize,
    pub idempotency_max_bytes: usize,
}

impl Default for Delivery {
    fn default() -> Self {
        Self {
            ack_waits_ms: vec![2000, 4000, 6000],
            ack_retries: 3,
            trace_ttl_secs: 7 * 86_400,
            trace_max: 1_000_000,
            trace_max_bytes: 256 << 20,
            redis_trace_max_bytes: 0,
            inbox_max: 1000,
            max_ttl_secs: 7 * 86_400,
            push_rate: 50_000,
            broadcast_rate: 30_000,
            broadcast_max: 100_000,
            session_ttl_secs: 86_400,
            idempotency_window_secs: 86_400,
            idempotency_max_keys: 200_000,
            idempotency_max_bytes: 128 << 20,
        }
    }
}

/// TLS on the listeners that face clients (rustls). Off unless a
/// certificate is given; the files are reloaded on SIGHUP or when they change.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM certificate chain (leaf first) and PEM private key (PKCS#8, RSA or SEC1).
    pub cert_file: String,
    pub key_file: String,
    /// Which listeners speak TLS: `tcp` (the binary gateway), `ws` (`wss://`),
    /// `http` (HTTPS API).
    pub listeners: Vec<String>,
    /// How often the files are checked for a change.
    pub reload_check_secs: u64,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            cert_file: String::new(),
            key_file: String::new(),
            listeners: vec!["tcp".into(), "ws".into(), "http".into()],
            reload_check_secs: 5,
        }
    }
}

impl TlsSettings {
    /// Whether `listener` (`tcp`, `ws` or `http`) speaks TLS.
    pub fn on(&self, listener: &str) -> bool {
        !self.cert_file.is_empty() && self.listeners.iter().any(|l| l == listener)
    }
}

/// Where events for the backend go: client up-pushes, connection lifecycle
/// events and delivery callbacks. Several sinks at once; none by default
/// (then up-pushes are refused: there is no one to hand them to).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Sinks {
    /// HTTP POST endpoints (`[[sinks.webhooks]]`).
    pub webhooks: Vec<Webhook>,
    /// A Redis Stream in the cluster's Redis (cluster mode only).
    pub stream: Option<StreamSink>,
    /// URLs a push may name as its own `callbackUrl` (an allow-list, matched
    /// exactly); each gets a webhook queue of its own, signed with
    /// `callback_secret`.
    pub callback_urls: Vec<String>,
    pub callback_secret: String,
    /// How long an up-push waits to be accepted (a synchronous webhook's 2xx,
    /// the stream's XADD) before the client is told to retry later.
    pub accept_timeout_ms: u64,
    /// Delivery callbacks watched at once on this node (pushes asking for
    /// more are refused with 503), and how long a push is watched.
    pub callback_max_watched: usize,
    pub callback_window_secs: u64,
}

impl Default for Sinks {
    fn default() -> Self {
        Self {
            webhooks: Vec::new(),
            stream: None,
            callback_urls: Vec::new(),
            callback_secret: String::new(),
            accept_timeout_ms: 5_000,
            callback_max_watched: 200_000,
            callback_window_secs: 3_600,
        }
    }
}

/// mpush's HTTP proxy over the long connection (`mp.http`): a client's
/// HTTP_PROXY request is forwarded to a backend named in `dns_mapping` and
/// the response sent back on the connection. Off by default. Unlike mpush,
/// the mapping is an allow-list: a host not in it is refused (403), nothing
/// in the request chooses an address, and redirects are returned to the
/// client rather than followed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HttpProxy {
    /// mpush's `proxy-enabled`.
    pub enabled: bool,
    /// mpush's `dns-mapping`: a request's host (without its port) to the
    /// backends that serve it, `ip:port` (plain HTTP, as in mpush) or an
    /// `http://` / `https://` base (scheme and authority only); taken in turn.
    pub dns_mapping: std::collections::BTreeMap<String, Vec<String>>,
    /// mpush's `default-read-timeout` (10 s): a request's whole exchange,
    /// unless its `readTimeout` header asks for less, or for more up to
    /// `max_read_timeout_ms`. Past it the client gets 408.
    pub default_read_timeout_ms: u64,
    pub max_read_timeout_ms: u64,
    /// Largest request body forwarded (413 over it) and largest response
    /// body returned (mpush's `max-content-length`, 5 MiB; 502 over it).
    pub max_request_body: usize,
    pub max_response_body: usize,
    /// Requests in flight at once: per connection, per user (on this node)
    /// and on this node; over any, the client gets 429 (503 for the node's).
    pub max_in_flight_per_conn: usize,
    pub max_in_flight_per_user: usize,
    pub max_in_flight: usize,
    /// mpush's `max-conn-per-host`: idle connections kept per backend.
    pub max_conn_per_host: usize,
}

impl Default for HttpProxy {
    fn default() -> Self {
        Self {
            enabled: false,
            dns_mapping: Default::default(),
            default_read_timeout_ms: 10_000,
            max_read_timeout_ms: 30_000,
            max_request_body: 64 << 10,
            max_response_body: 5 << 20,
            max_in_flight_per_conn: 8,
            max_in_flight_per_user: 32,
            max_in_flight: 1024,
            max_conn_per_host: 5,
        }
    }
}

/// Which events a sink takes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum SinkEvent {
    /// A client's up-push.
    UpPush,
    /// bound, unbound, kicked, disconnected.
    Lifecycle,
    /// A push's terminal state per recipient (pushes with `callback: true`).
    Callback,
}

/// When a webhook's up-push counts as accepted.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WebhookMode {
    /// Once the endpoint answered 2xx for it: the client's ACK means the
    /// backend has it (at-least-once even if this node dies).
    Sync,
    /// Once it is in this node's bounded queue: a faster ACK, but a node that
    /// dies loses what it had queued.
    Async,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Webhook {
    pub url: String,
    /// HMAC-SHA256 key for `X-Mpush-Signature` (16+ characters).
    pub secret: String,
    pub events: Vec<SinkEvent>,
    pub mode: WebhookMode,
    /// Events waiting on this node at most; over it, up-pushes are refused
    /// with "retry later" and other events are counted as dropped.
    pub queue: usize,
    /// Events per POST at most, and POSTs in flight at once.
    pub batch: usize,
    pub concurrency: usize,
    pub timeout_ms: u64,
    /// Retries wait from 100 ms doubling up to this (with jitter), for as
    /// long as the endpoint fails.
    pub max_backoff_ms: u64,
}

impl Default for Webhook {
    fn default() -> Self {
        Self {
            url: String::new(),
            secret: String::new(),
            events: vec![SinkEvent::UpPush],
            mode: WebhookMode::Sync,
            queue: 10_000,
            batch: 100,
            concurrency: 4,
            timeout_ms: 5_000,
            max_backoff_ms: 30_000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StreamSink {
    /// The stream's key.
    pub key: String,
    /// `XADD .. MAXLEN ~ maxlen`: the stream keeps about this many entries.
    pub maxlen: u64,
    pub events: Vec<SinkEvent>,
}

impl Default for StreamSink {
    fn default() -> Self {
        Self {
            key: "mpush:events".into(),
            maxlen: 1_000_000,
            events: vec![SinkEvent::UpPush],
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Shutdown {
    /// How long to wait for in-flight ACKs before closing.
    pub drain_timeout_ms: u64,
    /// Where v2 TCP clients are told to reconnect (`host:port`) when no other
    /// cluster node is live; empty: their own server list.
    pub redirect_to: String,
    /// The same for WebSocket clients (`ws://` or `wss://` URL).
    pub redirect_to_ws: String,
    /// Clients wait up to this long (plus 100 ms) before they reconnect, each
    /// a different time, so a drained node's clients do not arrive at once.
    pub redirect_jitter_ms: u32,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self {
            drain_timeout_ms: 5_000,
            redirect_to: String::new(),
            redirect_to_ws: String::new(),
            redirect_jitter_ms: 5_000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Cluster {
    /// Redis URL (`redis://host:port/db`, `redis+sentinel://s1:26379,s2:26379/master`,
    /// or `redis+cluster://n1:6379,n2:6379/`);
    /// empty: the embedded in-memory default.
    pub redis: String,
    /// For `rediss://` (and `rediss+sentinel://`, `rediss+cluster://`) on a
    /// private CA: the CA certificate (PEM) the Redis servers' certificates
    /// chain to; empty: the webpki roots.
    pub redis_ca_file: String,
    /// This node's id; empty: a random one at each start.
    pub node_id: String,
    /// Node-to-node port (mpush's gateway port); loopback by default.
    pub internal: String,
    /// Shared secret of the nodes (32+ characters): a peer proves it with an
    /// HMAC challenge before any push is read. Required when the node port
    /// is reachable from other hosts, unless `allow_unauthenticated_peers`.
    pub secret: String,
    /// Opt-in: a node port reachable from other hosts without a secret
    /// (anyone who reaches it can push to any user on this node).
    pub allow_unauthenticated_peers: bool,
    /// Host other nodes and clients reach this node at; empty: the bound IP
    /// (127.0.0.1 when bound to all interfaces).
    pub advertise_host: String,
    /// Route entries live this long unless refreshed (every `route_refresh_secs`).
    pub route_ttl_secs: u64,
    pub route_refresh_secs: u64,
    /// Node registrations live this long unless renewed (every `node_renew_secs`).
    pub node_ttl_secs: u64,
    pub node_renew_secs: u64,
    /// Timeout of one Redis command and of one node-to-node forward.
    pub timeout_ms: u64,
    /// Users whose routes a node keeps in its client-side cache for
    /// delivery (Redis invalidates them on every change; one `PING` per
    /// lookup keeps them current); 0: every lookup reads Redis.
    pub route_cache_keys: usize,
}

impl Default for Cluster {
    fn default() -> Self {
        Self {
            redis: String::new(),
            redis_ca_file: String::new(),
            node_id: String::new(),
            internal: "127.0.0.1:3001".into(),
            secret: String::new(),
            allow_unauthenticated_peers: false,
            advertise_host: String::new(),
            route_ttl_secs: 90,
            route_refresh_secs: 30,
            node_ttl_secs: 30,
            node_renew_secs: 15,
            timeout_ms: 2000,
            route_cache_keys: 100_000,
        }
    }
}

/// A setting that does not make sense.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("`{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
}

fn invalid(key: &'static str, reason: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.to_string(),
    }
}

/// Settings after validation: addresses parsed, the key loaded.
#[derive(Debug, Clone)]
pub struct Validated {
    pub settings: Settings,
    /// `net.dev_loopback_transport` resolved: plain `ws://` from loopback
    /// may use the transport-secured profile.
    pub loopback_transport: bool,
    pub tcp: SocketAddr,
    pub ws: Option<SocketAddr>,
    pub http: SocketAddr,
    pub private_key: Arc<RsaPrivate>,
    /// True when the key is mpush's published default (left unset, or
    /// pasted in: recognised by value).
    pub default_key: bool,
    /// Who may bind as whom.
    pub bind_auth: Arc<crate::auth::BindAuth>,
    /// The certificate, when TLS is on.
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// `net.trusted_proxies`, parsed.
    pub proxies: Arc<TrustedProxies>,
}

pub use crate::forwarded::{Forwarded, TrustedProxies};

impl Settings {
    /// Loads defaults, then `file` (if any), then the environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Settings::default()));
        if let Some(f) = file {
            if !f.exists() {
                return Err(invalid(
                    "--config",
                    format!("{} does not exist", f.display()),
                ));
            }
            fig = fig.merge(Toml::file(f));
        }
        fig = fig.merge(Env::prefixed("MPUSH__").split("__"));
        fig.extract().map_err(|e| ConfigError::Load(Box::new(e)))
    }

    /// A copy fit to print: every secret setting replaced by `"***"` and
    /// every URL's credentials masked (`redact`: by name and by shape, so
    /// a setting added later is covered too).
    pub fn masked(&self) -> Self {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        crate::redact::mask_settings(&mut v);
        serde_json::from_value(v).unwrap_or_default()
    }

    /// The effective settings as TOML, secrets masked (`config print`).
    pub fn to_toml_masked(&self) -> String {
        toml::to_string_pretty(&self.masked()).unwrap_or_else(|e| format!("# cannot print: {e}\n"))
    }

    /// Checks every setting once (each alone, then the ones that must agree);
    /// the server runs on the result.
    pub fn validate(self) -> Result<Validated, ConfigError> {
        let addr = |key: &'static str, v: &str| {
            v.parse::<SocketAddr>()
                .map_err(|e| invalid(key, format!("`{v}` is not an address: {e}")))
        };
        let tcp = addr("net.tcp", &self.net.tcp)?;
        let http = addr("net.http", &self.net.http)?;
        let u = &self.net.public_ws_url;
        if !(u.is_empty() || u.starts_with("ws://") || u.starts_with("wss://")) {
            return Err(invalid(
                "net.public_ws_url",
                "must be a ws:// or wss:// URL",
            ));
        }
        for o in &self.security.cors_origins {
            if o != "*" && o.parse::<axum::http::HeaderValue>().is_err() {
                return Err(invalid(
                    "security.cors_origins",
                    format!("`{o}` is not an origin"),
                ));
            }
        }
        let ws = if self.net.ws.is_empty() {
            None
        } else {
            Some(addr("net.ws", &self.net.ws)?)
        };
        let l = &self.limits;
        if l.max_connections == 0 {
            return Err(invalid("limits.max_connections", "must be at least 1"));
        }
        if !(64..=16 * 1024 * 1024).contains(&l.max_packet_size) {
            return Err(invalid(
                "limits.max_packet_size",
                "must be 64 bytes to 16 MiB",
            ));
        }
        if l.outbound_queue == 0 || l.handshakes_per_ip == 0 {
            return Err(invalid("limits", "queues and rates must be at least 1"));
        }
        if l.min_heartbeat_ms < 1000 || l.min_heartbeat_ms > l.max_heartbeat_ms {
            return Err(invalid(
                "limits.min_heartbeat_ms",
                "must be at least 1000 and at most max_heartbeat_ms",
            ));
        }
        if !(256..=1 << 20).contains(&l.ws_read_buffer) {
            return Err(invalid(
                "limits.ws_read_buffer",
                "must be 256 bytes to 1 MiB",
            ));
        }
        let d = &self.delivery;
        if d.ack_waits_ms.is_empty() {
            return Err(invalid("delivery.ack_waits_ms", "needs at least one wait"));
        }
        if let Some(w) = d
            .ack_waits_ms
            .iter()
            .find(|w| !(MIN_ACK_WAIT_MS..=MAX_ACK_WAIT_MS).contains(*w))
        {
            return Err(invalid(
                "delivery.ack_waits_ms",
                format!(
                    "{w} ms: each wait is {MIN_ACK_WAIT_MS} ms to {MAX_ACK_WAIT_MS} ms (a wait shorter than a round trip resends what is on its way)"
                ),
            ));
        }
        // One wait after each attempt: the first send and `ack_retries`
        // resends. The last wait repeats, so `ack_retries` waits (mpush's
        // 3 and 3) or one more are both complete; other lengths are a typo.
        let (n, r) = (d.ack_waits_ms.len(), d.ack_retries as usize);
        if n != r && n != r + 1 {
            return Err(invalid(
                "delivery.ack_waits_ms",
                format!(
                    "{n} wait(s) for delivery.ack_retries = {r}: give {r} or {} (one after the first send and each resend; the last repeats)",
                    r + 1
                ),
            ));
        }
        if d.push_rate == 0 || d.broadcast_rate == 0 || d.broadcast_max == 0 {
            return Err(invalid(
                "delivery",
                "rates and broadcast_max must be at least 1",
            ));
        }
        let c = &self.cluster;
        let mut internal = None;
        if !c.redis.is_empty() {
            if !crate::redis_conn::valid_url(&c.redis) {
                return Err(invalid(
                    "cluster.redis",
                    "must be redis[s]://[user:password@]host:port/db, redis[s]+sentinel://[user:password@]host:port,.../master or redis[s]+cluster://[user:password@]host:port,.../",
                ));
            }
            internal = Some(addr("cluster.internal", &c.internal)?);
            if !c.redis_ca_file.is_empty() && std::fs::metadata(&c.redis_ca_file).is_err() {
                return Err(invalid(
                    "cluster.redis_ca_file",
                    format!("{} cannot be read", c.redis_ca_file),
                ));
            }
            if c.route_refresh_secs == 0 || c.route_refresh_secs >= c.route_ttl_secs {
                return Err(invalid(
                    "cluster.route_refresh_secs",
                    "must be at least 1 and below route_ttl_secs",
                ));
            }
            if c.node_renew_secs == 0 || c.node_renew_secs >= c.node_ttl_secs {
                return Err(invalid(
                    "cluster.node_renew_secs",
                    "must be at least 1 and below node_ttl_secs",
                ));
            }
        }
        validate_sinks(&self.sinks, !c.redis.is_empty())?;
        validate_http_proxy(&self.http_proxy)?;
        if l.up_push_rate_per_conn == 0
            || l.up_push_burst_per_conn == 0
            || l.up_push_rate_per_user == 0
            || l.up_push_burst_per_user == 0
            || l.up_push_abuse_refusals == 0
        {
            return Err(invalid(
                "limits.up_push_*",
                "up-push rates, bursts and the abuse count must be at least 1",
            ));
        }
        if l.max_connections_per_ip == 0
            || l.handshake_timeout_ms < 1000
            || l.rsa_queue == 0
            || l.http_max_connections == 0
            || l.http_header_timeout_ms < 100
            || l.http_idle_timeout_ms < 100
            || l.max_sessions == 0
            || l.max_session_bytes < 1 << 20
            || l.max_topics_per_user == 0
            || l.max_subscribers_per_topic == 0
        {
            return Err(invalid(
                "limits",
                "caps must be at least 1, handshake_timeout_ms at least 1000, HTTP timeouts at least 100 ms, max_session_bytes at least 1 MiB",
            ));
        }
        if d.idempotency_window_secs == 0
            || d.idempotency_max_keys == 0
            || d.idempotency_max_bytes < 1 << 20
        {
            return Err(invalid(
                "delivery.idempotency_*",
                "the window and the key count must be at least 1, the bytes at least 1 MiB",
            ));
        }
        if d.trace_max_bytes < 1 << 20 {
            return Err(invalid(
                "delivery.trace_max_bytes",
                "must be at least 1 MiB",
            ));
        }
        if d.redis_trace_max_bytes != 0 && d.redis_trace_max_bytes < 16 << 20 {
            return Err(invalid(
                "delivery.redis_trace_max_bytes",
                "must be 0 (bounded by trace_ttl_secs only) or at least 16 MiB",
            ));
        }
        if self.security.api_tokens.iter().any(|t| t.len() < 16) {
            return Err(invalid(
                "security.api_tokens",
                "each token needs 16 characters or more",
            ));
        }
        let s = &self.security;
        let (text, pasted) = if !s.private_key.is_empty() {
            (s.private_key.clone(), Some("security.private_key"))
        } else if !s.private_key_file.is_empty() {
            let t = std::fs::read_to_string(&s.private_key_file).map_err(|e| {
                invalid(
                    "security.private_key_file",
                    format!("{}: {e}", s.private_key_file),
                )
            })?;
            (t, Some("security.private_key_file"))
        } else {
            (
                mpush_protocol::crypto::MPUSH_DEFAULT_PRIVATE_KEY.to_owned(),
                None,
            )
        };
        let private_key = RsaPrivate::from_text(&text)
            .map_err(|e| invalid("security.private_key", e.to_string()))?;
        // By value: mpush's published key pasted in (in any format) is as
        // public as the one left unset.
        let default_key = private_key.is_mpush_published();
        let bind_auth =
            crate::auth::BindAuth::new(&s.token_keys()).map_err(|e| invalid("security.jwt", e))?;
        if !c.redis.is_empty() && !c.secret.is_empty() && c.secret.len() < 32 {
            return Err(invalid(
                "cluster.secret",
                "needs 32 characters or more (e.g. `openssl rand -hex 32`)",
            ));
        }
        let loopback_ws =
            self.net.trusted_proxies.is_empty() && ws.is_some_and(|a| a.ip().is_loopback());
        if self.net.dev_loopback_transport == Some(true) && !loopback_ws {
            return Err(invalid(
                "net.dev_loopback_transport",
                "is for development: it needs net.ws on a loopback address and no net.trusted_proxies",
            ));
        }
        // Secure by default: what other hosts can reach needs a credential,
        // or an opt-in whose name says what it gives away.
        let exposed = |a: &SocketAddr| !a.ip().is_loopback();
        let gateways_exposed = exposed(&tcp) || ws.as_ref().is_some_and(exposed);
        let mut missing = Vec::new();
        if gateways_exposed && default_key && !s.allow_published_key {
            missing.push(match pasted {
                Some("security.private_key") => {
                    "a key of your own in security.private_key: the one given is mpush's published key, which anyone can decrypt handshakes with (make one with `mpush-server keygen`), or security.allow_published_key = true to keep it"
                }
                Some(_) => {
                    "a key of your own in security.private_key_file: the file holds mpush's published key, which anyone can decrypt handshakes with (make one with `mpush-server keygen`), or security.allow_published_key = true to keep it"
                }
                None => {
                    "security.private_key (make one with `mpush-server keygen`), or security.allow_published_key = true to keep mpush's published key"
                }
            });
        }
        if gateways_exposed && bind_auth.is_anonymous() && !s.anonymous_bind {
            missing.push(
                "security.jwt_secret, security.jwt_public_key or security.bind_secret (bind authentication), or security.anonymous_bind = true",
            );
        }
        if exposed(&http) && s.api_tokens.is_empty() && !s.anonymous_api_on_loopback {
            missing.push("security.api_tokens, or security.anonymous_api_on_loopback = true");
        }
        if internal.as_ref().is_some_and(exposed)
            && c.secret.is_empty()
            && !c.allow_unauthenticated_peers
        {
            missing.push(
                "cluster.secret (the node port is reachable from other hosts), or cluster.allow_unauthenticated_peers = true",
            );
        }
        if !missing.is_empty() {
            return Err(invalid(
                "security",
                format!(
                    "listeners reachable from other hosts need: {}",
                    missing.join("; ")
                ),
            ));
        }
        let tls = validate_tls(&self.tls)?;
        let proxies = Arc::new(
            TrustedProxies::parse(
                &self.net.trusted_proxies,
                crate::forwarded::ForwardedHeader::parse(&self.net.forwarded_header)
                    .map_err(|e| invalid("net.forwarded_header", e))?,
            )
            .map_err(|e| invalid("net.trusted_proxies", e))?,
        );
        let loopback_transport = self
            .net
            .dev_loopback_transport
            .unwrap_or(!self.tls.on("ws"))
            && loopback_ws;
        Ok(Validated {
            loopback_transport,
            settings: self,
            tcp,
            ws,
            http,
            private_key: Arc::new(private_key),
            default_key,
            bind_auth: Arc::new(bind_auth),
            tls,
            proxies,
        })
    }
}

/// Loads the certificate when TLS is configured (a bad file stops the start
/// and `config check`, with the setting named).
fn validate_tls(t: &TlsSettings) -> Result<Option<Arc<crate::tls::Tls>>, ConfigError> {
    if t.cert_file.is_empty() && t.key_file.is_empty() {
        return Ok(None);
    }
    if t.cert_file.is_empty() || t.key_file.is_empty() {
        return Err(invalid(
            "tls.cert_file",
            "tls.cert_file and tls.key_file go together",
        ));
    }
    if let Some(l) = t
        .listeners
        .iter()
        .find(|l| !matches!(l.as_str(), "tcp" | "ws" | "http"))
    {
        return Err(invalid("tls.listeners", format!("`{l}`: tcp, ws or http")));
    }
    if t.reload_check_secs == 0 {
        return Err(invalid("tls.reload_check_secs", "must be at least 1"));
    }
    crate::tls::Tls::new(Path::new(&t.cert_file), Path::new(&t.key_file))
        .map(Some)
        .map_err(|e| invalid("tls.cert_file", e))
}

/// The shortest and longest ACK wait `delivery.ack_waits_ms` accepts.
pub const MIN_ACK_WAIT_MS: u64 = 100;
pub const MAX_ACK_WAIT_MS: u64 = 600_000;

/// An `http_proxy.dns_mapping` backend that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidBackend(String);

/// An `http_proxy.dns_mapping` backend, `ip:port` (plain HTTP, mpush's form)
/// or an `http://` / `https://` base with no path, query or credentials: its
/// base URL (scheme and authority, no trailing slash).
pub fn proxy_backend(s: &str) -> Result<String, InvalidBackend> {
    let bad = |why: String| InvalidBackend(why);
    let full = if s.contains("://") {
        s.to_owned()
    } else {
        s.parse::<SocketAddr>()
            .map_err(|_| bad(format!("`{s}` is neither ip:port nor an http(s):// URL")))?;
        format!("http://{s}")
    };
    let u = reqwest::Url::parse(&full).map_err(|e| bad(format!("`{s}`: {e}")))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad(format!("`{s}`: only http:// and https:// backends")));
    }
    if u.host_str().is_none() {
        return Err(bad(format!("`{s}` names no host")));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(bad(format!("`{s}`: no credentials in a backend address")));
    }
    if u.path() != "/" || u.query().is_some() || u.fragment().is_some() {
        return Err(bad(format!(
            "`{s}`: a backend is a scheme and an address, no path"
        )));
    }
    let mut base = u.to_string();
    base.pop(); // the path's "/"
    Ok(base)
}

fn validate_http_proxy(p: &HttpProxy) -> Result<(), ConfigError> {
    if !p.enabled {
        return Ok(());
    }
    if p.dns_mapping.is_empty() {
        return Err(invalid(
            "http_proxy.dns_mapping",
            "names no host: with the proxy on, only mapped hosts are reachable",
        ));
    }
    for (host, targets) in &p.dns_mapping {
        if host.is_empty() || host.contains([':', '/', '@']) {
            return Err(invalid(
                "http_proxy.dns_mapping",
                format!("`{host}` is not a host name (no port, no scheme)"),
            ));
        }
        if targets.is_empty() {
            return Err(invalid(
                "http_proxy.dns_mapping",
                format!("`{host}` has no backend"),
            ));
        }
        for t in targets {
            if let Err(e) = proxy_backend(t) {
                return Err(invalid("http_proxy.dns_mapping", format!("`{host}`: {e}")));
            }
        }
    }
    if p.default_read_timeout_ms == 0 || p.max_read_timeout_ms < p.default_read_timeout_ms {
        return Err(invalid(
            "http_proxy.default_read_timeout_ms",
            "must be at least 1 and at most max_read_timeout_ms",
        ));
    }
    if p.max_in_flight_per_conn == 0
        || p.max_in_flight_per_user == 0
        || p.max_in_flight == 0
        || p.max_conn_per_host == 0
        || p.max_response_body == 0
    {
        return Err(invalid(
            "http_proxy.max_*",
            "the in-flight limits, max_conn_per_host and max_response_body must be at least 1",
        ));
    }
    Ok(())
}

fn validate_sinks(s: &Sinks, clustered: bool) -> Result<(), ConfigError> {
    let http_url = |u: &str| {
        (u.starts_with("http://") || u.starts_with("https://"))
            && u.parse::<axum::http::Uri>()
                .is_ok_and(|x| x.host().is_some())
    };
    for w in &s.webhooks {
        if !http_url(&w.url) {
            return Err(invalid(
                "sinks.webhooks.url",
                format!("`{}` is not an http:// or https:// URL", w.url),
            ));
        }
        if w.secret.len() < 16 {
            return Err(invalid(
                "sinks.webhooks.secret",
                "must be at least 16 characters (receivers verify X-Mpush-Signature with it)",
            ));
        }
        if w.events.is_empty() {
            return Err(invalid("sinks.webhooks.events", "names no event kind"));
        }
        if w.queue == 0 || w.batch == 0 || w.concurrency == 0 || w.concurrency > 64 {
            return Err(invalid(
                "sinks.webhooks",
                "queue and batch must be at least 1, concurrency 1 to 64",
            ));
        }
        if w.timeout_ms < 100 || w.max_backoff_ms < 100 {
            return Err(invalid(
                "sinks.webhooks.timeout_ms",
                "timeout_ms and max_backoff_ms must be at least 100",
            ));
        }
    }
    if let Some(st) = &s.stream {
        if !clustered {
            return Err(invalid(
                "sinks.stream",
                "needs cluster mode (cluster.redis): the stream lives in the cluster's Redis",
            ));
        }
        if st.key.is_empty() || st.maxlen == 0 || st.events.is_empty() {
            return Err(invalid(
                "sinks.stream",
                "needs a key, a maxlen of at least 1 and an event kind",
            ));
        }
    }
    for u in &s.callback_urls {
        if !http_url(u) {
            return Err(invalid(
                "sinks.callback_urls",
                format!("`{u}` is not an http:// or https:// URL"),
            ));
        }
    }
    if !s.callback_urls.is_empty() && s.callback_secret.len() < 16 {
        return Err(invalid(
            "sinks.callback_secret",
            "must be at least 16 characters when callback_urls are set",
        ));
    }
    if s.accept_timeout_ms < 100 || s.callback_max_watched == 0 || s.callback_window_secs == 0 {
        return Err(invalid(
            "sinks",
            "accept_timeout_ms must be at least 100, callback_max_watched and callback_window_secs at least 1",
        ));
    }
    Ok(())
}

impl Validated {
    pub fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.settings.limits.write_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_mpush_ports_and_validate() {
        let v = Settings::default().validate().expect("valid");
        assert_eq!(v.tcp.port(), 3000);
        assert_eq!(v.ws.map(|a| a.port()), Some(8088));
        assert_eq!(v.http.port(), 9999);
        assert!(v.default_key);
    }

    #[test]
    fn the_redis_trace_bound_is_off_or_at_least_16_mib() {
        let mut s = Settings::default();
        s.delivery.redis_trace_max_bytes = 1 << 20;
        let e = s.clone().validate().expect_err("too small").to_string();
        assert!(e.contains("delivery.redis_trace_max_bytes"), "{e}");
        s.delivery.redis_trace_max_bytes = 64 << 20;
        assert!(s.clone().validate().is_ok());
        s.delivery.redis_trace_max_bytes = 0;
        assert!(s.validate().is_ok(), "off: the TTL only");
    }

    #[test]
    fn exposed_listeners_need_credentials_or_named_opt_ins() {
        let mut s = Settings::default();
        s.net.tcp = "0.0.0.0:3000".into();
        s.net.http = "0.0.0.0:9999".into();
        let e = s.clone().validate().expect_err("refused").to_string();
        for key in [
            "security.allow_published_key",
            "security.anonymous_bind",
            "security.api_tokens",
        ] {
            assert!(e.contains(key), "{e}");
        }
        s.security.allow_published_key = true;
        s.security.anonymous_bind = true;
        s.security.anonymous_api_on_loopback = true;
        assert!(s.clone().validate().is_ok(), "opted in");
        s.cluster.redis = "redis://127.0.0.1:6379/".into();
        s.cluster.internal = "0.0.0.0:3001".into();
        let e = s.clone().validate().expect_err("node port").to_string();
        assert!(e.contains("cluster.secret"), "{e}");
        s.cluster.secret = "short".into();
        assert!(s.clone().validate().is_err(), "a short secret");
        s.cluster.secret = "x".repeat(32);
        assert!(s.validate().is_ok());
    }

    /// A team moving from mpush pastes its old key file in: it is the
    /// published key, and an exposed listener refuses it as if unset.
    #[test]
    fn the_published_key_pasted_in_is_refused_on_exposed_listeners() {
        let exposed = |f: &dyn Fn(&mut Settings)| {
            let mut s = Settings::default();
            s.net.tcp = "0.0.0.0:3000".into();
            s.security.anonymous_bind = true;
            f(&mut s);
            s.validate()
        };
        let pem = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../protocol/testdata/mpush-default-rsa-private-pkcs8.pem"
        ))
        .expect("the published key's PEM");
        let dir = std::env::temp_dir().join(format!("mpush-published-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("old-mpush-key.pem");
        std::fs::write(&file, &pem).expect("written");
        for (how, set) in [
            (
                "security.private_key",
                Box::new(|s: &mut Settings| {
                    s.security.private_key =
                        mpush_protocol::crypto::MPUSH_DEFAULT_PRIVATE_KEY.into()
                }) as Box<dyn Fn(&mut Settings)>,
            ),
            (
                "security.private_key",
                Box::new(|s: &mut Settings| s.security.private_key = pem.clone()),
            ),
            (
                "security.private_key_file",
                Box::new(|s: &mut Settings| {
                    s.security.private_key_file = file.display().to_string()
                }),
            ),
        ] {
            let e = exposed(&*set).expect_err("refused").to_string();
            assert!(e.contains(how) && e.contains("published key"), "{e}");
            let ok = exposed(&|s| {
                set(s);
                s.security.allow_published_key = true;
            })
            .expect("with the named opt-in");
            assert!(ok.default_key, "and the warning is printed");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_values_name_their_key() {
        let mut s = Settings::default();
        s.net.tcp = "nowhere".into();
        let e = s.validate().expect_err("invalid");
        assert!(e.to_string().contains("net.tcp"), "{e}");
        let mut s = Settings::default();
        s.security.private_key = "garbage".into();
        assert!(
            s.validate()
                .expect_err("bad key")
                .to_string()
                .contains("private_key")
        );
        let mut s = Settings::default();
        s.limits.min_heartbeat_ms = 10;
        assert!(s.validate().is_err());
    }

    #[test]
    fn dev_loopback_transport_is_for_a_loopback_server_without_proxies() {
        let mut s = Settings::default();
        s.net.dev_loopback_transport = Some(true);
        assert!(s.clone().validate().is_ok(), "the loopback defaults");
        let mut proxied = s.clone();
        proxied.net.trusted_proxies = vec!["10.0.0.0/8".into()];
        let mut exposed = s.clone();
        exposed.net.ws = "0.0.0.0:8088".into();
        for bad in [proxied, exposed] {
            let Err(e) = bad.validate() else {
                panic!("refused")
            };
            let e = e.to_string();
            assert!(e.contains("net.dev_loopback_transport"), "{e}");
        }
    }

    #[test]
    fn printing_masks_every_secret() {
        let mut s = Settings::default();
        s.security.api_tokens = vec!["token-0123456789abcdef".into()];
        s.security.jwt_secret = "jwt-secret-0123456789abcdef0123456789".into();
        s.cluster.secret = "node-secret-0123456789abcdef0123456789".into();
        s.cluster.redis = "redis://app:hunter2@10.0.0.5:6379/0".into();
        s.sinks.webhooks = vec![Webhook {
            url: "https://backend.example.com/hook".into(),
            secret: "webhook-secret-0123456789".into(),
            ..Webhook::default()
        }];
        let text = s.to_toml_masked();
        for secret in [
            "token-0123",
            "jwt-secret",
            "node-secret",
            "hunter2",
            "webhook-secret",
        ] {
            assert!(!text.contains(secret), "{secret} printed:\n{text}");
        }
        assert!(text.contains("redis://app:***@10.0.0.5:6379/0"), "{text}");
        assert!(text.contains("https://backend.example.com/hook"), "{text}");
        // What it prints loads back as settings.
        let back: Settings = toml::from_str(&text).expect("valid TOML settings");
        assert_eq!(back.net, s.net);
    }

    #[test]
    fn sinks_are_checked_with_the_setting_named() {
        let check = |f: &dyn Fn(&mut Settings), key: &str| {
            let mut s = Settings::default();
            f(&mut s);
            let e = s.validate().expect_err("invalid").to_string();
            assert!(e.contains(key), "{key}: {e}");
        };
        let hook = |url: &str, secret: &str| Webhook {
            url: url.into(),
            secret: secret.into(),
            ..Webhook::default()
        };
        check(
            &|s| s.sinks.webhooks = vec![hook("ftp://x/", "0123456789abcdef")],
            "sinks.webhooks.url",
        );
        check(
            &|s| s.sinks.webhooks = vec![hook("http://127.0.0.1:1/", "short")],
            "sinks.webhooks.secret",
        );
        check(
            &|s| {
                let mut w = hook("http://127.0.0.1:1/", "0123456789abcdef");
                w.events.clear();
                s.sinks.webhooks = vec![w];
            },
            "sinks.webhooks.events",
        );
        check(
            &|s| s.sinks.stream = Some(StreamSink::default()),
            "sinks.stream",
        );
        check(
            &|s| s.sinks.callback_urls = vec!["http://127.0.0.1:1/cb".into()],
            "sinks.callback_secret",
        );
        check(&|s| s.limits.up_push_rate_per_conn = 0, "limits.up_push_");
        let mut s = Settings::default();
        s.sinks.webhooks = vec![hook("https://backend.example.com/hook", "0123456789abcdef")];
        s.validate().expect("a valid webhook");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API
    fn file_and_environment_layer_over_defaults() {
        let dir = std::env::temp_dir().join(format!("mpush-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("mpush.toml");
        std::fs::write(
            &f,
            "[net]\ntcp = \"127.0.0.1:4000\"\n[limits]\nmax_connections = 7\n",
        )
        .expect("write");
        figment::Jail::expect_with(|jail| {
            jail.set_env("MPUSH__LIMITS__MAX_CONNECTIONS", "9");
            let s = Settings::load(Some(&f)).expect("loads");
            assert_eq!(s.net.tcp, "127.0.0.1:4000");
            assert_eq!(s.limits.max_connections, 9);
            Ok(())
        });
        std::fs::write(&f, "[net]\ntcpp = \"x\"\n").expect("write");
        assert!(Settings::load(Some(&f)).is_err(), "unknown keys are errors");
        assert!(Settings::load(Some(&dir.join("missing.toml"))).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
