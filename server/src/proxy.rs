//! mpush's HTTP proxy over the long connection (`HTTP_PROXY`, mpush's
//! `mp.http`): a client sends an HTTP request inside its encrypted
//! connection, the server forwards it to a backend and sends the response
//! back on the same connection.
//!
//! What a client can make us do is bounded here, not left to the backend:
//! - **reach**: only hosts named in `http_proxy.dns_mapping`, and only the
//!   backends listed for them. Nothing in the request chooses an address
//!   (mpush forwards an unmapped host as it is; we answer 403), and a
//!   redirect is handed back to the client, never followed.
//! - **hold**: request bodies up to `max_request_body` (413), response bodies
//!   up to `max_response_body` (502), requests in flight per connection
//!   (checked by the connection), per user and per node (429, 503).
//! - **wait**: the whole exchange, body included, within the request's
//!   `readTimeout` header (mpush's) capped by `max_read_timeout_ms`, else
//!   `default_read_timeout_ms`: then 408, as mpush answers.
//!
//! What the backend sees: the client's method, path, query, headers and
//! body; `Host` as the client named it; `X-Forwarded-For` /
//! `X-Forwarded-Port` set to the connection's address (as mpush does; any the
//! client sent are dropped); and, beyond mpush, `X-Mpush-User-Id` and
//! `X-Mpush-Device-Id` when the connection is bound (a client cannot send
//! these itself), so a backend can tell who asks.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use mpush_protocol::message::{HttpMethod, HttpRequest, HttpResponse, parse_headers};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::Semaphore;

use crate::config;

/// One backend of a mapped host: where requests for it go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// `http://ip:port` or the configured `http(s)://host[:port]`, no path.
    base: String,
}

impl Backend {
    /// `ip:port` (plain HTTP, mpush's form) or an `http://` / `https://`
    /// base with no path, query, or credentials (`config::proxy_backend`).
    pub fn parse(s: &str) -> Result<Self, config::InvalidBackend> {
        config::proxy_backend(s).map(|base| Self { base })
    }
}

struct Backends {
    list: Vec<Backend>,
    next: AtomicUsize,
}

impl Backends {
    fn pick(&self) -> &Backend {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        &self.list[i % self.list.len()]
    }
}

/// Who asks: the connection's address, and its device and user when known.
#[derive(Debug, Clone)]
pub struct Caller {
    pub peer: SocketAddr,
    pub user: Option<Arc<str>>,
    pub device: Option<Arc<str>>,
}

/// The proxy: one per node, shared by every connection.
pub struct HttpProxy {
    client: reqwest::Client,
    hosts: HashMap<String, Backends>,
    settings: config::HttpProxy,
    node: Arc<Semaphore>,
    per_user: DashMap<Arc<str>, usize>,
}

/// Headers a client may not set: hop-by-hop ones, the ones we compute, and
/// the identity we vouch for.
const DROPPED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-port",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-mpush-user-id",
    "x-mpush-device-id",
];

/// mpush's header carrying a request's timeout in milliseconds.
const READ_TIMEOUT: &str = "readTimeout";

/// An answer of the proxy's own (no backend was asked, or it failed):
/// the status with its reason phrase, and why in a header and the body.
pub fn refusal(status: u16, why: &str) -> HttpResponse {
    let reason = reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let body = why.as_bytes().to_vec();
    HttpResponse {
        status_code: status.into(),
        reason_phrase: reason.to_owned(),
        headers: format!(
            "content-type:text/plain; charset=utf-8\ncontent-length:{}\nx-mpush-proxy-error:{}\n",
            body.len(),
            why
        ),
        body,
    }
}

fn outcome(label: &'static str) {
    metrics::counter!("mpush_http_proxy_requests_total", "outcome" => label).increment(1);
}

/// The user's share of in-flight requests, given back on drop.
struct UserSlot<'a> {
    map: &'a DashMap<Arc<str>, usize>,
    user: Arc<str>,
}

impl Drop for UserSlot<'_> {
    fn drop(&mut self) {
        self.map.remove_if_mut(&self.user, |_, n| {
            *n -= 1;
            *n == 0
        });
    }
}

impl HttpProxy {
    /// `None` when the proxy is off. The settings were validated.
    pub fn new(s: &config::HttpProxy) -> Option<Arc<Self>> {
        if !s.enabled {
            return None;
        }
        let hosts = s
            .dns_mapping
            .iter()
            .map(|(host, targets)| {
                let list = targets
                    .iter()
                    .filter_map(|t| Backend::parse(t).ok())
                    .collect();
                (
                    host.to_ascii_lowercase(),
                    Backends {
                        list,
                        next: AtomicUsize::new(0),
                    },
                )
            })
            .filter(|(_, b)| !b.list.is_empty())
            .collect();
        let client = reqwest::Client::builder()
            // A redirect could lead anywhere: the client gets it instead.
            .redirect(reqwest::redirect::Policy::none())
            // The host's HTTP_PROXY environment must not reroute backends.
            .no_proxy()
            .pool_max_idle_per_host(s.max_conn_per_host)
            .connect_timeout(Duration::from_millis(s.max_read_timeout_ms))
            .build()
            .ok()?;
        Some(Arc::new(Self {
            client,
            hosts,
            settings: s.clone(),
            node: Arc::new(Semaphore::new(s.max_in_flight)),
            per_user: DashMap::new(),
        }))
    }

    /// Requests one connection may have in flight.
    pub fn per_conn(&self) -> usize {
        self.settings.max_in_flight_per_conn
    }

    fn user_slot(&self, user: &Arc<str>) -> Option<UserSlot<'_>> {
        let mut n = self.per_user.entry(user.clone()).or_insert(0);
        if *n >= self.settings.max_in_flight_per_user {
            return None;
        }
        *n += 1;
        Some(UserSlot {
            map: &self.per_user,
            user: user.clone(),
        })
    }

    /// Forwards one request; always an answer for the client (mpush's
    /// statuses where it has one: 400, 408, 502).
    pub async fn forward(&self, caller: Caller, req: HttpRequest) -> HttpResponse {
        let started = Instant::now();
        let r = self.forward_inner(caller, req).await;
        metrics::histogram!("mpush_http_proxy_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        r
    }

    async fn forward_inner(&self, caller: Caller, req: HttpRequest) -> HttpResponse {
        let Ok(_node) = self.node.clone().try_acquire_owned() else {
            outcome("busy");
            return refusal(503, "the proxy is busy on this node");
        };
        let _user = match &caller.user {
            Some(u) => match self.user_slot(u) {
                Some(s) => Some(s),
                None => {
                    outcome("user_limit");
                    return refusal(429, "too many proxied requests in flight for this user");
                }
            },
            None => None,
        };
        if req.body.len() > self.settings.max_request_body {
            outcome("too_large");
            return refusal(413, "the request body is over the proxy's limit");
        }
        let Ok(url) = reqwest::Url::parse(&req.uri) else {
            outcome("bad_request");
            return refusal(400, "the uri is not an absolute URL");
        };
        if !matches!(url.scheme(), "http" | "https") {
            outcome("bad_request");
            return refusal(400, "only http:// and https:// URLs");
        }
        let Some(host) = url.host_str().map(str::to_ascii_lowercase) else {
            outcome("bad_request");
            return refusal(400, "the URL names no host");
        };
        let Some(backends) = self.hosts.get(&host) else {
            outcome("unmapped");
            return refusal(403, "the host is not in the proxy's mapping");
        };
        let mut target = backends.pick().base.clone();
        target.push_str(url.path());
        if let Some(q) = url.query() {
            target.push('?');
            target.push_str(q);
        }
        let mut timeout = Duration::from_millis(self.settings.default_read_timeout_ms);
        let mut headers = HeaderMap::new();
        for (name, value) in parse_headers(&req.headers) {
            if name.eq_ignore_ascii_case(READ_TIMEOUT) {
                if let Ok(ms) = value.trim().parse::<u64>()
                    && ms > 0
                {
                    timeout = Duration::from_millis(ms.min(self.settings.max_read_timeout_ms));
                }
                continue;
            }
            let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.trim().as_bytes()),
                HeaderValue::from_bytes(value.trim().as_bytes()),
            ) else {
                outcome("bad_request");
                return refusal(400, "a header is not a valid HTTP header");
            };
            if DROPPED.contains(&n.as_str()) {
                continue;
            }
            headers.append(n, v);
        }
        let authority = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        let vouched = [
            ("host", Some(authority)),
            ("x-forwarded-for", Some(caller.peer.ip().to_string())),
            ("x-forwarded-port", Some(caller.peer.port().to_string())),
            ("x-mpush-user-id", caller.user.as_deref().map(str::to_owned)),
            (
                "x-mpush-device-id",
                caller.device.as_deref().map(str::to_owned),
            ),
        ];
        for (name, value) in vouched {
            if let Some(v) = value.and_then(|v| HeaderValue::from_str(&v).ok()) {
                headers.insert(name, v);
            }
        }
        let method = match req.method {
            HttpMethod::Get => reqwest::Method::GET,
            HttpMethod::Post => reqwest::Method::POST,
            HttpMethod::Put => reqwest::Method::PUT,
            HttpMethod::Delete => reqwest::Method::DELETE,
        };
        let mut builder = self.client.request(method, &target).headers(headers);
        if !req.body.is_empty() {
            builder = builder.body(req.body);
        }
        let max = self.settings.max_response_body;
        let exchange = async move {
            let mut resp = builder.send().await?;
            if resp.content_length().is_some_and(|n| n > max as u64) {
                return Ok(Err(()));
            }
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await? {
                if body.len() + chunk.len() > max {
                    return Ok(Err(()));
                }
                body.extend_from_slice(&chunk);
            }
            Ok::<_, reqwest::Error>(Ok((resp.status(), resp.headers().clone(), body)))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) => {
                outcome("timeout");
                refusal(408, "the backend did not answer in time")
            }
            Ok(Err(e)) => {
                outcome("backend_error");
                tracing::debug!(error = %e, %host, "proxied request failed");
                refusal(502, "the backend could not be reached")
            }
            Ok(Ok(Err(()))) => {
                outcome("response_too_large");
                refusal(502, "the backend's response is over the proxy's limit")
            }
            Ok(Ok(Ok((status, headers, body)))) => {
                outcome("forwarded");
                let mut text = String::new();
                for (n, v) in &headers {
                    if matches!(
                        n.as_str(),
                        "connection" | "keep-alive" | "transfer-encoding" | "content-length"
                    ) {
                        continue;
                    }
                    let v = String::from_utf8_lossy(v.as_bytes());
                    // A line break in a value would split mpush's format.
                    if v.contains('\n') {
                        continue;
                    }
                    text.push_str(n.as_str());
                    text.push(':');
                    text.push_str(&v);
                    text.push('\n');
                }
                if !body.is_empty() {
                    text.push_str(&format!("content-length:{}\n", body.len()));
                }
                HttpResponse {
                    status_code: status.as_u16().into(),
                    reason_phrase: status.canonical_reason().unwrap_or("").to_owned(),
                    headers: text,
                    body,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse_as_mpush_writes_them_and_as_urls() {
        assert_eq!(
            Backend::parse("127.0.0.1:8080").map(|b| b.base),
            Ok("http://127.0.0.1:8080".to_owned())
        );
        assert_eq!(
            Backend::parse("https://api.internal:8443").map(|b| b.base),
            Ok("https://api.internal:8443".to_owned())
        );
        assert_eq!(
            Backend::parse("http://api.internal/").map(|b| b.base),
            Ok("http://api.internal".to_owned())
        );
        for bad in [
            "api.internal",
            "ftp://x:21",
            "http://u:p@x:80",
            "http://x:80/path",
            "http://x:80/?q=1",
            "",
        ] {
            assert!(Backend::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_user_slot_is_given_back() {
        let p = HttpProxy::new(&config::HttpProxy {
            enabled: true,
            dns_mapping: [("a".to_owned(), vec!["127.0.0.1:1".to_owned()])].into(),
            max_in_flight_per_user: 2,
            ..Default::default()
        })
        .expect("on");
        let u: Arc<str> = "u".into();
        let a = p.user_slot(&u).expect("first");
        let b = p.user_slot(&u).expect("second");
        assert!(p.user_slot(&u).is_none(), "a third is over the limit");
        drop(a);
        let c = p.user_slot(&u).expect("room again");
        drop((b, c));
        assert!(p.per_user.is_empty(), "no entry is left for an idle user");
    }
}
