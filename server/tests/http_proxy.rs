//! mpush's HTTP proxy over the long connection, end to end: a real backend
//! HTTP server on loopback, the server between, and the protocol's client
//! sending what mpush 0.8.1 clients send (`HttpRequestMessage`: method byte,
//! absolute URI, `name:value\n` headers with `readTimeout`, body). Then the
//! attacker: unmapped hosts and addresses, huge bodies both ways, a slow
//! backend, a redirect elsewhere, forged identity headers, many requests.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use common::*;
use mpush_protocol::message::{HttpMethod, HttpRequest, HttpResponse, parse_headers};
use serde_json::{Value, json};

/// A backend on loopback: what it was asked, and how often.
struct Backend {
    addr: std::net::SocketAddr,
    hits: Arc<AtomicUsize>,
}

async fn echo(State(hits): State<Arc<AtomicUsize>>, req: Request) -> Response {
    hits.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let headers: serde_json::Map<String, Value> = parts
        .headers
        .iter()
        .map(|(k, v)| (k.to_string(), json!(String::from_utf8_lossy(v.as_bytes()))))
        .collect();
    let path = parts.uri.path().to_owned();
    match path.as_str() {
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            "late".into_response()
        }
        "/big" => vec![b'x'; 2 << 20].into_response(),
        "/big-chunked" => {
            let chunks = (0..64).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 32 << 10]));
            Body::from_stream(futures_util::stream::iter(chunks)).into_response()
        }
        "/redirect" => Response::builder()
            .status(302)
            .header("location", "http://169.254.169.254/latest/meta-data/")
            .body(Body::empty())
            .expect("response"),
        _ => axum::Json(json!({
            "method": parts.method.as_str(),
            "path": path,
            "query": parts.uri.query(),
            "headers": headers,
            "body": String::from_utf8_lossy(&body),
        }))
        .into_response(),
    }
}

async fn backend() -> Backend {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .fallback(any(echo))
        .with_state(hits.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Backend { addr, hits }
}

fn proxy_settings(b: &Backend) -> mpush_server::Settings {
    let mut s = settings();
    s.http_proxy.enabled = true;
    s.http_proxy.dns_mapping = [
        ("mpush.com".to_owned(), vec![b.addr.to_string()]),
        // Two backends for one host (in mpush's form and as a URL), taken in turn.
        (
            "api.example.com".to_owned(),
            vec![b.addr.to_string(), format!("http://{}", b.addr)],
        ),
    ]
    .into();
    s
}

/// What an mpush 0.8.1 Android app sends (`HttpRequest.buildPost`, a form
/// body, `setTimeout`): the header text as `MPUtils.headerToString` writes it.
fn mpush_request(method: HttpMethod, uri: &str, body: &[u8]) -> HttpRequest {
    HttpRequest {
        method,
        uri: uri.into(),
        headers:
            "Content-Type:application/x-www-form-urlencoded; charset=utf-8\nreadTimeout:3000\n"
                .into(),
        body: body.to_vec(),
    }
}

fn header(r: &HttpResponse, name: &str) -> Option<String> {
    parse_headers(&r.headers)
        .into_iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
}

fn json_body(r: &HttpResponse) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}: {:?}", r))
}

#[tokio::test]
async fn an_mpush_client_s_request_reaches_the_mapped_backend_and_the_answer_comes_back() {
    let b = backend().await;
    let server = start(proxy_settings(&b)).await;
    for via in [Via::Tcp, Via::Ws] {
        let mut c = bound(&server, via, false, device("d-proxy", "android"), "ann", "").await;
        let mut req = mpush_request(
            HttpMethod::Post,
            "http://mpush.com/push/send?to=bob&lang=zh",
            "content=你好".as_bytes(),
        );
        // The client tries to speak for someone else, and to choose where
        // the request goes: none of it reaches the backend.
        req.headers.push_str(
            "X-Mpush-User-Id:mallory\nX-Forwarded-For:10.0.0.1\nHost:169.254.169.254\nX-App:demo\n",
        );
        c.http(req);
        let r = c.http_response().await;
        assert_eq!(
            (r.status_code, r.reason_phrase.as_str()),
            (200, "OK"),
            "{r:?}"
        );
        assert_eq!(
            header(&r, "content-length"),
            Some(r.body.len().to_string()),
            "mpush sets the body's length"
        );
        let seen = json_body(&r);
        assert_eq!(seen["method"], "POST");
        assert_eq!(seen["path"], "/push/send");
        assert_eq!(seen["query"], "to=bob&lang=zh");
        assert_eq!(seen["body"], "content=你好");
        let h = &seen["headers"];
        assert_eq!(
            h["content-type"],
            "application/x-www-form-urlencoded; charset=utf-8"
        );
        assert_eq!(h["host"], "mpush.com", "the host the client named");
        assert_eq!(
            h["x-forwarded-for"], "127.0.0.1",
            "the connection's address"
        );
        assert!(
            h["x-forwarded-port"]
                .as_str()
                .is_some_and(|p| p.parse::<u16>().is_ok())
        );
        assert_eq!(
            h["x-mpush-user-id"], "ann",
            "the bound user, not the forged one"
        );
        assert_eq!(h["x-mpush-device-id"], "d-proxy");
        assert_eq!(h["x-app"], "demo");
        assert!(
            h.get("readtimeout").is_none(),
            "readTimeout is the proxy's, as in mpush"
        );

        // GET, PUT and DELETE too, on the host with two backends.
        for (m, name) in [
            (HttpMethod::Get, "GET"),
            (HttpMethod::Put, "PUT"),
            (HttpMethod::Delete, "DELETE"),
        ] {
            c.http(mpush_request(
                m,
                "https://API.example.com:8443/v1/item",
                b"",
            ));
            let r = c.http_response().await;
            assert_eq!(r.status_code, 200, "{r:?}");
            let seen = json_body(&r);
            assert_eq!(seen["method"], name);
            assert_eq!(seen["headers"]["host"], "api.example.com:8443");
        }
        c.close();
    }
    server.shutdown().await;
}

#[tokio::test]
async fn an_attacker_reaches_nothing_unmapped_and_holds_nothing_long() {
    let b = backend().await;
    let mut s = proxy_settings(&b);
    s.http_proxy.max_request_body = 1024;
    s.http_proxy.max_response_body = 1 << 20;
    s.http_proxy.max_read_timeout_ms = 1000;
    s.http_proxy.default_read_timeout_ms = 1000;
    let server = start(s).await;
    let mut c = bound(
        &server,
        Via::Tcp,
        true,
        device("d-atk", "android"),
        "eve",
        "",
    )
    .await;
    let ask = |c: &TestClient, uri: &str, body: &[u8]| {
        c.http(mpush_request(HttpMethod::Post, uri, body));
    };

    // Hosts and addresses outside the mapping: 403, the backend never asked.
    let direct = format!("http://{}/echo", b.addr);
    for uri in [
        "http://evil.example/",
        "http://169.254.169.254/latest/meta-data/",
        direct.as_str(),
        "http://localhost/",
        "http://mpush.com.evil.example/",
        "http://user:pw@evil.example/",
    ] {
        ask(&c, uri, b"");
        let r = c.http_response().await;
        assert_eq!(r.status_code, 403, "{uri}: {r:?}");
    }
    // Not an absolute http(s) URL: 400.
    for uri in ["/relative", "file:///etc/passwd", "gopher://mpush.com/", ""] {
        ask(&c, uri, b"");
        let r = c.http_response().await;
        assert_eq!(r.status_code, 400, "{uri}: {r:?}");
    }
    // A header that is not HTTP: 400.
    c.http(HttpRequest {
        method: HttpMethod::Get,
        uri: "http://mpush.com/".into(),
        headers: "Bad Name:x\n".into(),
        body: Vec::new(),
    });
    assert_eq!(c.http_response().await.status_code, 400);
    assert_eq!(
        b.hits.load(Ordering::SeqCst),
        0,
        "no request reached the backend"
    );

    // A body over the limit: 413, not forwarded.
    ask(&c, "http://mpush.com/echo", &[b'a'; 4096]);
    assert_eq!(c.http_response().await.status_code, 413);
    assert_eq!(b.hits.load(Ordering::SeqCst), 0);

    // A response over the limit, with a length or chunked: 502.
    for path in ["/big", "/big-chunked"] {
        ask(&c, &format!("http://mpush.com{path}"), b"");
        let r = c.http_response().await;
        assert_eq!(r.status_code, 502, "{path}: {r:?}");
        assert!(
            r.body.len() < 1024,
            "the client gets the refusal, not the body"
        );
    }

    // A redirect is the client's to follow (or not), never the proxy's.
    ask(&c, "http://mpush.com/redirect", b"");
    let r = c.http_response().await;
    assert_eq!(r.status_code, 302);
    assert_eq!(
        header(&r, "location").as_deref(),
        Some("http://169.254.169.254/latest/meta-data/")
    );

    // A slow backend: 408 at the capped timeout, however long the client asks.
    let t = Instant::now();
    c.http(HttpRequest {
        headers: "readTimeout:600000\n".into(),
        ..mpush_request(HttpMethod::Get, "http://mpush.com/slow", b"")
    });
    let r = c.http_response().await;
    assert_eq!(
        (r.status_code, r.reason_phrase.as_str()),
        (408, "Request Timeout")
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn requests_in_flight_are_bounded_per_connection_and_per_user() {
    let b = backend().await;
    let mut s = proxy_settings(&b);
    s.http_proxy.max_in_flight_per_conn = 2;
    s.http_proxy.max_in_flight_per_user = 3;
    s.http_proxy.default_read_timeout_ms = 1500;
    s.http_proxy.max_read_timeout_ms = 1500;
    let server = start(s).await;
    let mut one = bound(&server, Via::Tcp, true, device("d-1", "android"), "sam", "").await;
    // Another client type: a second phone would replace the first (a kick).
    let mut two = bound(&server, Via::Tcp, true, device("d-2", "windows"), "sam", "").await;
    let slow = || mpush_request(HttpMethod::Get, "http://mpush.com/slow", b"");
    // Connection one: two slow ones in flight, the third is refused at once.
    for _ in 0..3 {
        one.http(slow());
    }
    let t = Instant::now();
    let r = one.http_response().await;
    assert_eq!(r.status_code, 429, "{r:?}");
    assert!(t.elapsed() < Duration::from_millis(1000), "refused at once");
    // Connection two, the same user: one more fits the user's three, the
    // next is refused for the user.
    two.http(slow());
    tokio::time::sleep(Duration::from_millis(200)).await;
    two.http(slow());
    let r = two.http_response().await;
    assert_eq!(r.status_code, 429, "{r:?}");
    assert!(
        header(&r, "x-mpush-proxy-error").is_some_and(|w| w.contains("user")),
        "{r:?}"
    );
    // The slow ones end as 408; then there is room again.
    for _ in 0..2 {
        assert_eq!(one.http_response().await.status_code, 408);
    }
    assert_eq!(two.http_response().await.status_code, 408);
    one.http(mpush_request(HttpMethod::Get, "http://mpush.com/echo", b""));
    assert_eq!(one.http_response().await.status_code, 200);
    server.shutdown().await;
}

#[tokio::test]
async fn with_the_proxy_off_a_request_is_mpush_s_unsupported_command() {
    let server = start(settings()).await;
    let mut c = bound(
        &server,
        Via::Tcp,
        false,
        device("d-off", "android"),
        "off",
        "",
    )
    .await;
    c.http(mpush_request(HttpMethod::Get, "http://mpush.com/", b""));
    let e = c
        .wait_for("the connection's end", |e| {
            matches!(e, mpush_protocol::client::ClientEvent::Closed { .. })
        })
        .await;
    assert!(format!("{e:?}").contains("Closed"), "{e:?}");
    server.shutdown().await;
}

#[test]
fn the_mapping_is_checked_at_start() {
    let mut s = settings();
    s.http_proxy.enabled = true;
    let e = s.clone().validate().expect_err("no host mapped");
    assert!(e.to_string().contains("http_proxy.dns_mapping"), "{e}");
    for bad in [
        ("mpush.com", "mpush.internal"),
        ("mpush.com", "ftp://10.0.0.1:21"),
        ("mpush.com", "http://10.0.0.1:80/path"),
        ("mpush.com:80", "10.0.0.1:80"),
    ] {
        let mut s = s.clone();
        s.http_proxy.dns_mapping = [(bad.0.to_owned(), vec![bad.1.to_owned()])].into();
        let e = s.validate().expect_err("refused");
        assert!(
            e.to_string().contains("http_proxy.dns_mapping"),
            "{bad:?}: {e}"
        );
    }
}
