//! `mpush-server config from-mpush FILE`: reads a Java mpush `mpush.conf`
//! (HOCON, as mpush 0.8.1 loads it: Lightbend config, `${user.dir}` and
//! `${mp.home}` substitutions) and writes this server's TOML.
//!
//! Every key under `mp` ends in one of three places: a setting here (with
//! the value converted: `10k` bytes, `3m` durations, Redis nodes as a URL),
//! "none, because" (named in the output with the reason), or "unknown" (not
//! a key of mpush 0.8.1: named too, in case of a typo). The output is what
//! keeps deployed apps working first: mpush's published key and anonymous
//! binds on exposed listeners are kept when the file had them, marked as the
//! opt-ins they are here (docs/migrating-from-mpush.md has the order in
//! which to turn them off).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hocon::HoconValue;

/// Why a file could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum FromMpushError {
    #[error("not HOCON mpush can read: {0}")]
    Parse(String),
    #[error("`{key}`: {why}")]
    Value { key: String, why: String },
}

/// The TOML, and what did not carry over (key, reason), in key order.
#[derive(Debug)]
pub struct Conversion {
    pub toml: String,
    pub unmapped: Vec<(String, String)>,
}

fn bad(key: &str, why: impl Into<String>) -> FromMpushError {
    FromMpushError::Value {
        key: key.into(),
        why: why.into(),
    }
}

/// Keys with no setting here, and why (a prefix ends with a dot).
const NONE_BECAUSE: &[(&str, &str)] = &[
    ("mp.home", "no working directory is needed"),
    (
        "mp.log-level",
        "logs go to stderr; the level is RUST_LOG (info by default)",
    ),
    (
        "mp.log.level",
        "logs go to stderr; the level is RUST_LOG (info by default)",
    ),
    (
        "mp.log-dir",
        "logs go to stderr (the service manager keeps them)",
    ),
    (
        "mp.log.dir",
        "logs go to stderr (the service manager keeps them)",
    ),
    (
        "mp.log-conf-path",
        "no logback: --log-format text|json and RUST_LOG",
    ),
    ("mp.core.epoll-provider", "tokio uses epoll on Linux"),
    (
        "mp.security.public-key",
        "derived from the private key; apps keep embedding it",
    ),
    ("mp.security.aes-key-length", "16, fixed by the protocol"),
    (
        "mp.security.ras-key-length",
        "follows the key (mpush-server keygen --bits)",
    ),
    (
        "mp.net.gateway-server-port",
        "business backends push through the HTTP API (net.http), not GATEWAY_PUSH; nodes talk on cluster.internal",
    ),
    ("mp.net.gateway-client-port", "no UDP gateway"),
    (
        "mp.net.gateway-server-net",
        "no UDP/SCTP/UDT gateway: the HTTP API",
    ),
    ("mp.net.gateway-server-multicast", "no UDP gateway"),
    ("mp.net.gateway-client-multicast", "no UDP gateway"),
    (
        "mp.net.gateway-client-num",
        "no gateway client: the HTTP API",
    ),
    (
        "mp.net.admin-server-port",
        "no telnet console: the HTTP API (online status, kick) and /metrics",
    ),
    (
        "mp.net.ws-path",
        "the WebSocket gateway answers on any path",
    ),
    (
        "mp.net.snd_buf.",
        "kernel defaults; limits.outbound_queue bounds what a connection holds",
    ),
    (
        "mp.net.rcv_buf.",
        "kernel defaults; limits.max_packet_size bounds a frame",
    ),
    (
        "mp.net.write-buffer-water-mark.",
        "limits.outbound_queue and limits.write_timeout_ms bound a slow reader",
    ),
    (
        "mp.net.traffic-shaping.",
        "per-connection and per-user rates are limits.up_push_*; pushes are paced by delivery.push_rate",
    ),
    (
        "mp.zk.",
        "no ZooKeeper: nodes find each other in Redis (cluster.redis)",
    ),
    ("mp.redis.write-to-zk", "no ZooKeeper"),
    (
        "mp.redis.config.",
        "the Redis client multiplexes one connection per node: no pool to size",
    ),
    (
        "mp.thread.",
        "tokio runs one worker per core; RSA has limits.rsa_workers",
    ),
    (
        "mp.push.flow-control.global.max",
        "no global cap: delivery.push_rate paces, the API answers what was delivered",
    ),
    (
        "mp.push.flow-control.broadcast.duration",
        "folded into delivery.broadcast_rate (per second)",
    ),
    (
        "mp.push.flow-control.global.duration",
        "folded into delivery.push_rate (per second)",
    ),
    ("mp.monitor.", "GET /metrics (Prometheus) and the logs"),
    (
        "mp.spi.",
        "extension points are sinks (webhooks, a Redis stream) and bind authentication",
    ),
];

/// The key (or its group, `prefix.*`) and why it has no setting here.
fn none_because(key: &str) -> Option<(String, &'static str)> {
    NONE_BECAUSE
        .iter()
        .find_map(|(k, why)| match k.strip_suffix('.') {
            Some(group) if key.starts_with(k) || key == group => Some((format!("{group}.*"), *why)),
            None if key == *k => Some((key.to_owned(), *why)),
            _ => None,
        })
}

/// Leaf keys under `prefix` (an object the mapping takes whole counts as one).
fn leaves(prefix: &str, v: &HoconValue, out: &mut Vec<(String, HoconValue)>) {
    let whole = matches!(
        prefix,
        "mp.http.dns-mapping" | "mp.net.public-host-mapping" | "mp.redis.cluster-group"
    );
    match v.as_object() {
        Some(map) if !whole => {
            for (k, v) in map {
                leaves(&format!("{prefix}.{k}"), v, out);
            }
        }
        _ => out.push((prefix.to_owned(), v.clone())),
    }
}

/// The settings being built: section → key → TOML value, with a comment.
#[derive(Default)]
struct Out {
    sections: BTreeMap<&'static str, Vec<(String, toml::Value, String)>>,
}

impl Out {
    fn set(&mut self, section: &'static str, key: &str, v: toml::Value, from: &str) {
        let list = self.sections.entry(section).or_default();
        list.retain(|(k, ..)| k != key);
        list.push((key.to_owned(), v, from.to_owned()));
    }
}

fn scalar(v: &HoconValue) -> Option<String> {
    match v {
        HoconValue::Scalar(s) => Some(s.raw.clone()),
        _ => None,
    }
}

/// mpush's byte sizes (`10k` = 10 KiB, as Lightbend reads a single letter).
fn bytes(key: &str, v: &HoconValue) -> Result<i64, FromMpushError> {
    let raw = scalar(v).ok_or_else(|| bad(key, "expected a size"))?;
    let c =
        hocon::parse(&format!("v = {}", toml_quote(&raw))).map_err(|e| bad(key, e.to_string()))?;
    c.get_bytes("v").map_err(|e| bad(key, e.to_string()))
}

fn millis(key: &str, v: &HoconValue) -> Result<i64, FromMpushError> {
    let raw = scalar(v).ok_or_else(|| bad(key, "expected a duration"))?;
    let c =
        hocon::parse(&format!("v = {}", toml_quote(&raw))).map_err(|e| bad(key, e.to_string()))?;
    let d = c.get_duration("v").map_err(|e| bad(key, e.to_string()))?;
    i64::try_from(d.as_millis()).map_err(|_| bad(key, "too long"))
}

fn int(key: &str, v: &HoconValue) -> Result<i64, FromMpushError> {
    v.as_i64()
        .ok_or_else(|| bad(key, "expected a whole number"))
}

fn string(key: &str, v: &HoconValue) -> Result<String, FromMpushError> {
    scalar(v).ok_or_else(|| bad(key, "expected a string"))
}

fn toml_quote(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// Redis nodes as mpush writes them: `host:port[:password]` strings
/// (0.8.1's `nodes`) or `{host, port, password}` objects (`cluster-group`).
fn redis_nodes(v: &HoconValue) -> Vec<(String, i64, String)> {
    let mut out = Vec::new();
    let mut one = |n: &HoconValue| {
        if let Some(s) = n.as_str() {
            let mut it = s.splitn(3, ':');
            let host = it.next().unwrap_or_default().to_owned();
            let port = it.next().and_then(|p| p.parse().ok()).unwrap_or(6379);
            let pw = it.next().unwrap_or_default().to_owned();
            out.push((host, port, pw));
        } else if let Some(o) = n.as_object() {
            let host = o.get("host").and_then(scalar).unwrap_or_default();
            let port = o.get("port").and_then(HoconValue::as_i64).unwrap_or(6379);
            let pw = o.get("password").and_then(scalar).unwrap_or_default();
            out.push((host, port, pw));
        }
    };
    for n in v.as_array().unwrap_or_default() {
        match n.as_array() {
            // cluster-group: groups of nodes.
            Some(group) => group.iter().for_each(&mut one),
            None => one(n),
        }
    }
    out
}

/// `:password@` for a Redis URL, the password percent-encoded; empty
/// without one.
fn userinfo(password: &str) -> String {
    if password.is_empty() {
        return String::new();
    }
    const USERINFO: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    format!(
        ":{}@",
        percent_encoding::utf8_percent_encode(password, USERINFO)
    )
}

/// Converts an `mpush.conf`. `cwd` stands for `${user.dir}` (the Java
/// process's working directory), which mpush's reference uses.
pub fn convert(text: &str, cwd: &str) -> Result<Conversion, FromMpushError> {
    let env = std::collections::HashMap::from([("user.dir".to_owned(), cwd.to_owned())]);
    let conf =
        hocon::parse_with_env(text, &env).map_err(|e| FromMpushError::Parse(e.to_string()))?;
    let Some(mp) = conf.get("mp") else {
        return Err(FromMpushError::Parse("no `mp` section".into()));
    };
    let mut all = Vec::new();
    leaves("mp", mp, &mut all);
    let mut out = Out::default();
    let mut unmapped = Vec::new();
    let mut published_key = true;
    let mut private_key = None;
    let (mut redis_model, mut redis_password, mut nodes) =
        ("single".to_owned(), String::new(), Vec::new());
    let (mut flow_global, mut flow_global_ms) = (None, 1000);
    let (mut flow_broadcast, mut flow_broadcast_ms) = (None, 1000);
    let mut proxy_enabled = false;
    let mut proxy_mapping = BTreeMap::<String, Vec<String>>::new();
    let mut exposed = false;
    let mut public_host = None;
    let mut connect_port = 3000;
    for (key, v) in &all {
        let k = key.as_str();
        let from = format!("from {k}");
        match k {
            "mp.core.max-packet-size" => {
                out.set("limits", "max_packet_size", bytes(k, v)?.into(), &from)
            }
            "mp.core.min-heartbeat" => {
                out.set("limits", "min_heartbeat_ms", millis(k, v)?.into(), &from)
            }
            "mp.core.max-heartbeat" => {
                out.set("limits", "max_heartbeat_ms", millis(k, v)?.into(), &from)
            }
            "mp.core.session-expired-time" => out.set(
                "delivery",
                "session_ttl_secs",
                (millis(k, v)? / 1000).into(),
                &from,
            ),
            "mp.core.compress-threshold" => {
                let n = bytes(k, v)?;
                if n != 10 * 1024 {
                    unmapped.push((
                        k.to_owned(),
                        format!("fixed at mpush's default, 10k (the file has {n} bytes)"),
                    ));
                }
            }
            "mp.core.max-hb-timeout-times" => {
                let n = int(k, v)?;
                if n != 2 {
                    unmapped.push((
                        k.to_owned(),
                        format!("fixed at mpush's default, 2 (the file has {n})"),
                    ));
                }
            }
            "mp.security.private-key" => {
                let pem = string(k, v)?;
                let key = mpush_protocol::crypto::RsaPrivate::from_text(&pem)
                    .map_err(|e| bad(k, format!("not a key this server loads: {e}")))?;
                published_key = key.is_mpush_published();
                private_key = Some(pem);
            }
            "mp.net.connect-server-port" => {
                let port = int(k, v)?;
                exposed = true;
                connect_port = port;
                out.set("net", "tcp", format!("0.0.0.0:{port}").into(), &from);
            }
            "mp.net.ws-server-port" => {
                let port = int(k, v)?;
                let ws = if port == 0 {
                    String::new()
                } else {
                    format!("0.0.0.0:{port}")
                };
                out.set("net", "ws", ws.into(), &format!("{from} (0: off)"));
            }
            "mp.net.public-host-mapping" => {
                let map = v.as_object().cloned().unwrap_or_default();
                let publics: Vec<String> = map.values().filter_map(scalar).collect();
                match publics.as_slice() {
                    [] => {}
                    [one] => public_host = Some(one.clone()),
                    _ => unmapped.push((
                        k.to_owned(),
                        "several LAN→public pairs: set net.public_address on each node".into(),
                    )),
                }
            }
            "mp.redis.cluster-model" => redis_model = string(k, v)?,
            "mp.redis.password" => redis_password = string(k, v)?,
            "mp.redis.nodes" | "mp.redis.cluster-group" => nodes.extend(redis_nodes(v)),
            "mp.http.proxy-enabled" => proxy_enabled = v.as_bool().unwrap_or(false),
            "mp.http.max-conn-per-host" => {
                out.set("http_proxy", "max_conn_per_host", int(k, v)?.into(), &from)
            }
            "mp.http.default-read-timeout" => {
                let ms = millis(k, v)?;
                out.set("http_proxy", "default_read_timeout_ms", ms.into(), &from);
                out.set(
                    "http_proxy",
                    "max_read_timeout_ms",
                    ms.max(30_000).into(),
                    "a client's readTimeout header is capped here",
                );
            }
            "mp.http.max-content-length" => out.set(
                "http_proxy",
                "max_response_body",
                bytes(k, v)?.into(),
                &from,
            ),
            "mp.http.dns-mapping" => {
                for (host, targets) in v.as_object().cloned().unwrap_or_default() {
                    let list = targets
                        .as_array()
                        .unwrap_or_default()
                        .iter()
                        .filter_map(scalar)
                        .collect();
                    proxy_mapping.insert(host, list);
                }
            }
            "mp.push.flow-control.global.limit" => flow_global = Some(int(k, v)?),
            "mp.push.flow-control.global.duration" => flow_global_ms = millis(k, v)?,
            "mp.push.flow-control.broadcast.limit" => flow_broadcast = Some(int(k, v)?),
            "mp.push.flow-control.broadcast.duration" => flow_broadcast_ms = millis(k, v)?,
            "mp.push.flow-control.broadcast.max" => {
                out.set("delivery", "broadcast_max", int(k, v)?.into(), &from)
            }
            _ => match none_because(k) {
                Some((name, why)) => {
                    let why = format!("none: {why}");
                    if !unmapped.iter().any(|(n, _)| *n == name) {
                        unmapped.push((name, why));
                    }
                }
                None => unmapped.push((
                    k.to_owned(),
                    "not a key of mpush 0.8.1: ignored (a typo?)".into(),
                )),
            },
        }
    }
    if let Some(host) = public_host {
        out.set(
            "net",
            "public_address",
            format!("{host}:{connect_port}").into(),
            "from mp.net.public-host-mapping: what the allocator hands out",
        );
    }
    let per_sec = |limit: i64, ms: i64| (limit * 1000 / ms.max(1)).max(1);
    if let Some(l) = flow_global {
        out.set(
            "delivery",
            "push_rate",
            per_sec(l, flow_global_ms).into(),
            "from mp.push.flow-control.global (limit per duration, per second)",
        );
    }
    if let Some(l) = flow_broadcast {
        out.set(
            "delivery",
            "broadcast_rate",
            per_sec(l, flow_broadcast_ms).into(),
            "from mp.push.flow-control.broadcast (limit per duration, per second)",
        );
    }
    if !nodes.is_empty() {
        let url = match redis_model.as_str() {
            "cluster" => {
                let pw = nodes
                    .iter()
                    .map(|n| n.2.clone())
                    .find(|p| !p.is_empty())
                    .unwrap_or(redis_password.clone());
                let hosts: Vec<String> = nodes.iter().map(|(h, p, _)| format!("{h}:{p}")).collect();
                format!("redis+cluster://{}{}/", userinfo(&pw), hosts.join(","))
            }
            _ => {
                let (h, p, pw) = &nodes[0];
                let pw = if pw.is_empty() { &redis_password } else { pw };
                if nodes.len() > 1 {
                    unmapped.push((
                        "mp.redis.nodes".into(),
                        "several nodes in the single model: the first is used (a Sentinel set-up is redis+sentinel://)".into(),
                    ));
                }
                // Database 1: mpush's nodes use 0, and the two systems must
                // not write the same route keys (the migration guide, 5).
                format!("redis://{}{h}:{p}/1", userinfo(pw))
            }
        };
        let note = if redis_model == "cluster" {
            "from mp.redis (cluster mode). A Redis Cluster has one database: while Java nodes run, use another cluster (route keys would collide)"
        } else {
            "from mp.redis (cluster mode), database 1: Java mpush uses 0 and the two do not share routes"
        };
        out.set("cluster", "redis", url.into(), note);
        out.set(
            "cluster",
            "internal",
            "0.0.0.0:3001".into(),
            "the node-to-node port (mpush's gateway port; a secret is required when exposed)",
        );
        let mut secret = [0u8; 24];
        getrandom::fill(&mut secret).map_err(|e| bad("mp.redis", e.to_string()))?;
        out.set(
            "cluster",
            "secret",
            hex::encode(secret).into(),
            "made for this file: give every node the same (peers prove it before any push is read)",
        );
    }
    if proxy_enabled && proxy_mapping.is_empty() {
        unmapped.push((
            "mp.http.proxy-enabled".into(),
            "left off: mpush forwarded any host; here only hosts in http_proxy.dns_mapping are reachable, so name them and enable it".into(),
        ));
    } else if proxy_enabled {
        out.set(
            "http_proxy",
            "enabled",
            true.into(),
            "from mp.http.proxy-enabled",
        );
    }
    if !proxy_mapping.is_empty() {
        let table: toml::Table = proxy_mapping
            .into_iter()
            .map(|(h, t)| {
                (
                    h,
                    toml::Value::Array(t.into_iter().map(Into::into).collect()),
                )
            })
            .collect();
        out.set(
            "http_proxy",
            "dns_mapping",
            toml::Value::Table(table),
            "from mp.http.dns-mapping: an allow-list here",
        );
    }
    if let Some(pem) = private_key.filter(|_| !published_key) {
        out.set(
            "security",
            "private_key",
            pem.into(),
            "from mp.security.private-key (better: private_key_file)",
        );
    }
    if exposed {
        if published_key {
            out.set(
                "security",
                "allow_published_key",
                true.into(),
                "OPT-IN, INSECURE: mpush's published key, which the deployed apps embed; replace it (mpush-server keygen) as the migration guide says",
            );
        }
        out.set(
            "security",
            "anonymous_bind",
            true.into(),
            "OPT-IN, INSECURE: mpush let any client bind as any user; give apps bind tokens (security.jwt_secret), then remove this",
        );
    }
    let mut toml = String::from(
        "# Converted from an mpush.conf by `mpush-server config from-mpush`.\n\
         # Check it with `mpush-server config check FILE`; the guide is\n\
         # docs/migrating-from-mpush.md.\n",
    );
    for (section, keys) in &out.sections {
        let _ = write!(toml, "\n[{section}]\n");
        for (k, v, from) in keys {
            let _ = writeln!(toml, "# {from}");
            let _ = writeln!(toml, "{k} = {}", inline(v));
        }
    }
    unmapped.sort();
    if !unmapped.is_empty() {
        toml.push_str("\n# Not carried over:\n");
        for (k, why) in &unmapped {
            let _ = writeln!(toml, "#   {k}: {why}");
        }
    }
    Ok(Conversion { toml, unmapped })
}

/// A value on one line (a table inline).
fn inline(v: &toml::Value) -> String {
    match v {
        toml::Value::Table(t) => {
            let parts: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{} = {}", toml_quote(k), inline(v)))
                .collect();
            format!("{{ {} }}", parts.join(", "))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_durations_and_redis_nodes_convert() {
        let c = convert(
            r#"
            mp.core.max-packet-size = 20k
            mp.core.min-heartbeat = 1m
            mp.core.max-heartbeat = 5m
            mp.core.session-expired-time = 2d
            mp.redis { cluster-model = cluster, password = "p@ss", nodes = ["10.0.0.1:7000", "10.0.0.2:7000"] }
            mp.push.flow-control.global { limit = 5000, duration = 1s }
            mp.push.flow-control.broadcast { limit = 300, duration = 100ms, max = 10 }
            mp.zk.server-address = "127.0.0.1:2181"
            mp.net.conect-server-port = 1
            "#,
            "/opt/mpush",
        )
        .expect("converts");
        let s: crate::config::Settings = toml::from_str(&c.toml).expect("our settings");
        assert_eq!(s.limits.max_packet_size, 20 * 1024);
        assert_eq!(
            (s.limits.min_heartbeat_ms, s.limits.max_heartbeat_ms),
            (60_000, 300_000)
        );
        assert_eq!(s.delivery.session_ttl_secs, 2 * 86_400);
        assert_eq!(
            s.cluster.redis,
            "redis+cluster://:p%40ss@10.0.0.1:7000,10.0.0.2:7000/"
        );
        assert_eq!(
            (s.delivery.push_rate, s.delivery.broadcast_rate),
            (5000, 3000)
        );
        assert_eq!(s.delivery.broadcast_max, 10);
        let why = |k: &str| {
            c.unmapped
                .iter()
                .find(|(x, _)| x == k)
                .map(|(_, w)| w.clone())
        };
        assert!(why("mp.zk.*").is_some_and(|w| w.contains("ZooKeeper")));
        assert!(why("mp.net.conect-server-port").is_some_and(|w| w.contains("typo")));
    }

    #[test]
    fn not_hocon_is_an_error_not_a_panic() {
        assert!(convert("mp { core = ", "/").is_err());
        assert!(convert("other.key = 1", "/").is_err());
        assert!(convert("mp.core.max-packet-size = lots", "/").is_err());
    }
}
