//! Who is behind a connection that came through a reverse proxy: one parser
//! of `X-Forwarded-For` / `X-Forwarded-Proto` and of RFC 7239 `Forwarded`,
//! used by the HTTP API and the WebSocket gateway alike.
//!
//! It fails closed. Headers are believed only from a peer in
//! `net.trusted_proxies`, and only the header that `net.forwarded_header`
//! names (the other could come from the client itself, unchanged by a proxy
//! that does not touch it). Walking the chain from the right, past trusted
//! proxies, the first address that is not a trusted proxy is the client.
//! Any hop in that walk that is not a clean address (`ip:port`, `[v6]`,
//! `unknown`, an empty item, an obfuscated name, a value that is not text)
//! makes the client [`ClientIp::Unknown`]: a remote caller with no address,
//! which is never loopback and never a trusted proxy. The same for a
//! protocol header with anything but `http`, `https`, `ws` or `wss` in it.
//! Several header lines are read as one list, as HTTP defines them.

use std::net::{IpAddr, Ipv6Addr};

use axum::http::HeaderMap;

/// The header the trusted proxies set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For` (and `X-Forwarded-Proto`): nginx, HAProxy, Envoy,
    /// Traefik, cloud load balancers.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded` (`for=` and `proto=`).
    Forwarded,
}

/// A forwarding setting that cannot be used (the words quote it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    #[error("`{0}`: x-forwarded-for or forwarded")]
    Header(String),
    #[error("`{0}` is not an IP address or CIDR")]
    Address(String),
}

impl ForwardedHeader {
    pub fn parse(s: &str) -> Result<Self, ProxyError> {
        match s.to_ascii_lowercase().as_str() {
            "x-forwarded-for" => Ok(Self::XForwardedFor),
            "forwarded" => Ok(Self::Forwarded),
            _ => Err(ProxyError::Header(s.to_owned())),
        }
    }
}

/// The client's address, or none that can be believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientIp {
    Known(IpAddr),
    /// A trusted proxy forwarded something that is not a clean address.
    Unknown,
}

/// What a request or an upgrade came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarded {
    pub client: ClientIp,
    /// The client's own connection was TLS (a trusted proxy said so).
    pub secure: bool,
}

impl Forwarded {
    fn direct(peer: IpAddr) -> Self {
        Self {
            client: ClientIp::Known(peer),
            secure: false,
        }
    }

    const UNKNOWN: Self = Self {
        client: ClientIp::Unknown,
        secure: false,
    };

    /// Only a known loopback address is loopback.
    pub fn is_loopback(&self) -> bool {
        matches!(self.client, ClientIp::Known(ip) if ip.is_loopback())
    }

    /// The address to count per-IP limits and to log under: an unknown
    /// client is `::` (all of them share one budget).
    pub fn ip(&self) -> IpAddr {
        match self.client {
            ClientIp::Known(ip) => ip,
            ClientIp::Unknown => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        }
    }
}

/// The forwarding headers of one request, read once (every line of each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardingHeaders {
    xff: Option<String>,
    xfp: Option<String>,
    forwarded: Option<String>,
    /// A line that is not visible ASCII text.
    junk: bool,
}

impl ForwardingHeaders {
    /// The request carries forwarding headers (it came through a proxy).
    pub fn any(&self) -> bool {
        self.xff.is_some() || self.xfp.is_some() || self.forwarded.is_some() || self.junk
    }

    pub fn from_headers(h: &HeaderMap) -> Self {
        let mut junk = false;
        let mut all = |name: &str| {
            let mut out: Option<String> = None;
            for v in h.get_all(name) {
                match v.to_str() {
                    Ok(s) => match &mut out {
                        Some(o) => {
                            o.push(',');
                            o.push_str(s);
                        }
                        None => out = Some(s.to_owned()),
                    },
                    Err(_) => junk = true,
                }
            }
            out
        };
        let (xff, xfp, forwarded) = (
            all("x-forwarded-for"),
            all("x-forwarded-proto"),
            all("forwarded"),
        );
        Self {
            xff,
            xfp,
            forwarded,
            junk,
        }
    }
}

/// The reverse proxies whose forwarding headers are believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    nets: Vec<ipnet::IpNet>,
    header: ForwardedHeader,
}

impl TrustedProxies {
    pub fn parse(list: &[String], header: ForwardedHeader) -> Result<Self, ProxyError> {
        let nets = list
            .iter()
            .map(|p| {
                p.parse::<ipnet::IpNet>()
                    .or_else(|_| p.parse::<IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| ProxyError::Address(p.clone()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { nets, header })
    }

    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    pub fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// The client behind `peer` (see the module's rules).
    pub fn resolve(&self, peer: IpAddr, h: &ForwardingHeaders) -> Forwarded {
        let peer = peer.to_canonical();
        if !self.trusts(peer) {
            return Forwarded::direct(peer);
        }
        match self.header {
            ForwardedHeader::XForwardedFor => {
                if h.junk {
                    return Forwarded::UNKNOWN;
                }
                // No header: the request is the proxy's own.
                let client = match &h.xff {
                    None => peer,
                    Some(xff) => {
                        let hops = xff.split(',').map(|hop| Hop {
                            addr: bare_ip(hop.trim()),
                            secure: None,
                        });
                        match self.walk(peer, hops) {
                            Some(c) => c,
                            None => return Forwarded::UNKNOWN,
                        }
                    }
                };
                let secure = match h.xfp.as_deref().map(proto_list) {
                    None => false,
                    Some(Some(secure)) => secure,
                    Some(None) => return Forwarded::UNKNOWN,
                };
                Forwarded {
                    client: ClientIp::Known(client),
                    secure,
                }
            }
            ForwardedHeader::Forwarded => {
                let Some(fwd) = &h.forwarded else {
                    return if h.junk {
                        Forwarded::UNKNOWN
                    } else {
                        Forwarded::direct(peer)
                    };
                };
                if h.junk {
                    return Forwarded::UNKNOWN;
                }
                let mut elements = Vec::new();
                for e in fwd.split(',') {
                    match forwarded_element(e) {
                        Some(hop) => elements.push(hop),
                        None => {
                            elements.push(Hop {
                                addr: None,
                                secure: None,
                            });
                        }
                    }
                }
                let mut secure = false;
                let mut last_secure = None;
                let found = self.walk_with(peer, elements.into_iter(), |hop| {
                    last_secure = hop.secure;
                });
                if let Some(s) = last_secure {
                    secure = s;
                }
                match found {
                    Some(client) => Forwarded {
                        client: ClientIp::Known(client),
                        secure,
                    },
                    None => Forwarded::UNKNOWN,
                }
            }
        }
    }

    /// From the right: past trusted proxies to the first address that is
    /// not one (the client); a hop that is not clean on the way: none. All
    /// hops trusted: the leftmost.
    fn walk(&self, peer: IpAddr, hops: impl DoubleEndedIterator<Item = Hop>) -> Option<IpAddr> {
        self.walk_with(peer, hops, |_| {})
    }

    fn walk_with(
        &self,
        peer: IpAddr,
        hops: impl DoubleEndedIterator<Item = Hop>,
        mut seen: impl FnMut(&Hop),
    ) -> Option<IpAddr> {
        let mut client = peer;
        for hop in hops.rev() {
            let ip = hop.addr?;
            seen(&hop);
            client = ip;
            if !self.trusts(ip) {
                break;
            }
        }
        Some(client)
    }
}

/// One hop of a forwarding chain: its address if clean, and (RFC 7239) the
/// protocol it names.
struct Hop {
    addr: Option<IpAddr>,
    secure: Option<bool>,
}

/// An address with nothing around it: `192.0.2.1`, `2001:db8::1`.
fn bare_ip(s: &str) -> Option<IpAddr> {
    if s.is_empty() || s.len() > 45 {
        return None;
    }
    s.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// `X-Forwarded-Proto`: every entry `http`, `https`, `ws` or `wss` (else
/// `None`); secure when every entry is `https` or `wss` (a client's forged
/// `https` in front of a proxy's `http` is not).
fn proto_list(s: &str) -> Option<bool> {
    let mut secure = true;
    for p in s.split(',') {
        secure &= scheme_secure(p.trim())?;
    }
    Some(secure)
}

fn scheme_secure(p: &str) -> Option<bool> {
    match p.to_ascii_lowercase().as_str() {
        "https" | "wss" => Some(true),
        "http" | "ws" => Some(false),
        _ => None,
    }
}

/// One RFC 7239 element (`for=...;proto=...;by=...`): `None` if it is not
/// well formed, has no `for`, or names a node that is not an address.
fn forwarded_element(e: &str) -> Option<Hop> {
    let mut addr = None;
    let mut secure = None;
    for pair in e.split(';') {
        let (k, v) = pair.trim().split_once('=')?;
        let v = unquote(v.trim())?;
        match k.trim().to_ascii_lowercase().as_str() {
            "for" => {
                if addr.is_some() {
                    return None;
                }
                addr = Some(node(&v)?);
            }
            "proto" => {
                if secure.is_some() {
                    return None;
                }
                secure = Some(scheme_secure(&v)?);
            }
            "by" | "host" => {}
            _ => return None,
        }
    }
    Some(Hop {
        addr: Some(addr?),
        secure,
    })
}

fn unquote(v: &str) -> Option<String> {
    if let Some(inner) = v.strip_prefix('"') {
        let inner = inner.strip_suffix('"')?;
        if inner.contains(['"', '\\']) {
            return None;
        }
        Some(inner.to_owned())
    } else if !v.is_empty() && v.bytes().all(is_tchar) {
        Some(v.to_owned())
    } else {
        None
    }
}

/// RFC 7230's token characters: an unquoted value has only these (so an
/// IPv6 address or a port must be quoted).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// RFC 7239's node: `192.0.2.1`, `192.0.2.1:80`, `[2001:db8::1]`,
/// `[2001:db8::1]:80`. Not `unknown`, nor an obfuscated `_name`.
fn node(v: &str) -> Option<IpAddr> {
    if let Some(rest) = v.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        let ip: std::net::Ipv6Addr = ip.parse().ok()?;
        if !(after.is_empty() || port(after.strip_prefix(':')?)) {
            return None;
        }
        return Some(IpAddr::V6(ip).to_canonical());
    }
    let (ip, p) = match v.split_once(':') {
        Some((ip, p)) => (ip, Some(p)),
        None => (v, None),
    };
    if p.is_some_and(|p| !port(p)) {
        return None;
    }
    ip.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

fn port(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 5
        && p.bytes().all(|b| b.is_ascii_digit())
        && p.parse::<u16>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: &str = "127.0.0.1";

    fn proxies(header: ForwardedHeader) -> TrustedProxies {
        TrustedProxies::parse(&["127.0.0.1".into(), "10.0.0.0/8".into()], header).expect("valid")
    }

    fn xff(v: &str) -> ForwardingHeaders {
        ForwardingHeaders {
            xff: Some(v.into()),
            ..Default::default()
        }
    }

    fn resolve(h: &ForwardingHeaders) -> Forwarded {
        proxies(ForwardedHeader::XForwardedFor).resolve(PEER.parse().expect("ip"), h)
    }

    fn known(ip: &str) -> ClientIp {
        ClientIp::Known(ip.parse().expect("ip"))
    }

    /// Every malformed hop a proxy could pass on, in the trusted part of
    /// the chain: the caller is unknown, never the proxy (loopback).
    #[test]
    fn malformed_hops_fail_closed() {
        for v in [
            "203.0.113.5:4711",
            "[2001:db8::1]",
            "[2001:db8::1]:4711",
            "unknown",
            "",
            " ",
            ",",
            "203.0.113.5,",
            "203.0.113.5, junk",
            "203.0.113.5, 10.0.0.1, junk",
            "203.0.113.5 10.0.0.1",
            "_hidden",
            "localhost",
            "127.0.0.1.evil.example",
            "0x7f.0.0.1",
            "2130706433",
            "::ffff:127.0.0.1:80",
            "fe80::1%eth0",
        ] {
            let f = resolve(&xff(v));
            assert_eq!(f.client, ClientIp::Unknown, "X-Forwarded-For: {v:?}");
            assert!(!f.is_loopback(), "{v:?}");
        }
    }

    #[test]
    fn clean_chains_name_the_client() {
        for (v, client) in [
            ("203.0.113.5", "203.0.113.5"),
            ("203.0.113.5 , 10.1.2.3", "203.0.113.5"),
            // Left of the client is the client's own text: not read.
            ("junk, 198.51.100.7, 10.0.0.2", "198.51.100.7"),
            ("127.0.0.1, 198.51.100.7", "198.51.100.7"),
            ("2001:db8::1", "2001:db8::1"),
            ("::ffff:198.51.100.7", "198.51.100.7"),
            // Every hop a trusted proxy: the leftmost is the client.
            ("10.0.0.9, 10.0.0.2", "10.0.0.9"),
        ] {
            assert_eq!(resolve(&xff(v)).client, known(client), "{v}");
        }
        assert_eq!(
            resolve(&ForwardingHeaders::default()).client,
            known(PEER),
            "no header: the proxy's own request"
        );
        let tls_only = resolve(&ForwardingHeaders {
            xfp: Some("wss".into()),
            ..Default::default()
        });
        assert_eq!(
            (tls_only.client, tls_only.secure),
            (known(PEER), true),
            "a TLS terminator that sets only the protocol"
        );
        let untrusted = proxies(ForwardedHeader::XForwardedFor)
            .resolve("192.0.2.9".parse().expect("ip"), &xff("127.0.0.1"));
        assert_eq!(
            untrusted.client,
            known("192.0.2.9"),
            "headers of others are ignored"
        );
        let junk = ForwardingHeaders {
            junk: true,
            ..Default::default()
        };
        assert_eq!(
            resolve(&junk).client,
            ClientIp::Unknown,
            "a header that is not text"
        );
    }

    #[test]
    fn forwarded_proto_is_believed_only_when_clean_and_whole() {
        let with = |proto: &str| {
            resolve(&ForwardingHeaders {
                xff: Some("203.0.113.5".into()),
                xfp: Some(proto.into()),
                ..Default::default()
            })
        };
        assert!(with("https").secure);
        assert!(with("WSS").secure);
        assert!(!with("http").secure);
        assert!(
            !with("https, http").secure,
            "a forged https before the proxy's http"
        );
        for junk in ["", "https,", "gopher", "https;x", "https http"] {
            let f = with(junk);
            assert_eq!(
                (f.client, f.secure),
                (ClientIp::Unknown, false),
                "X-Forwarded-Proto: {junk:?}"
            );
        }
    }

    #[test]
    fn rfc7239_forwarded() {
        let p = proxies(ForwardedHeader::Forwarded);
        let fwd = |v: &str| {
            p.resolve(
                PEER.parse().expect("ip"),
                &ForwardingHeaders {
                    forwarded: Some(v.into()),
                    ..Default::default()
                },
            )
        };
        for (v, client, secure) in [
            ("for=203.0.113.5", "203.0.113.5", false),
            ("for=203.0.113.5;proto=https", "203.0.113.5", true),
            (
                "For=\"[2001:db8:cafe::17]:4711\";Proto=wss",
                "2001:db8:cafe::17",
                true,
            ),
            (
                "for=\"203.0.113.5:80\";by=10.0.0.1, for=10.0.0.2",
                "203.0.113.5",
                false,
            ),
            (
                "for=198.51.100.1, for=203.0.113.5;proto=http",
                "203.0.113.5",
                false,
            ),
        ] {
            let f = fwd(v);
            assert_eq!((f.client, f.secure), (known(client), secure), "{v}");
        }
        for v in [
            "for=unknown",
            "for=_hidden",
            "for=[2001:db8::1]",
            "for=2001:db8::1",
            "for=203.0.113.5:99999",
            "for=",
            "proto=https",
            "for=203.0.113.5;for=198.51.100.1",
            "for=203.0.113.5;proto=gopher",
            "for=\"203.0.113.5",
            "for=203.0.113.5;secret=x",
            "for=203.0.113.5,",
            "",
        ] {
            assert_eq!(fwd(v).client, ClientIp::Unknown, "Forwarded: {v:?}");
        }
        // With `forwarded` configured, X-Forwarded-For is not read (a client
        // could have written it), and the other way around.
        let only_xff = p.resolve(PEER.parse().expect("ip"), &xff("203.0.113.5"));
        assert_eq!(only_xff.client, known(PEER));
        let only_fwd = proxies(ForwardedHeader::XForwardedFor).resolve(
            PEER.parse().expect("ip"),
            &ForwardingHeaders {
                forwarded: Some("for=127.0.0.1".into()),
                xff: Some("203.0.113.5".into()),
                ..Default::default()
            },
        );
        assert_eq!(only_fwd.client, known("203.0.113.5"));
    }

    #[test]
    fn several_header_lines_are_one_list() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", "127.0.0.1".parse().expect("value"));
        h.append("x-forwarded-for", "203.0.113.5".parse().expect("value"));
        let f = resolve(&ForwardingHeaders::from_headers(&h));
        assert_eq!(
            f.client,
            known("203.0.113.5"),
            "the proxy's line is the last"
        );
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            axum::http::HeaderValue::from_bytes(b"203.0.113.5\xff").expect("value"),
        );
        assert_eq!(
            resolve(&ForwardingHeaders::from_headers(&h)).client,
            ClientIp::Unknown
        );
    }
}
