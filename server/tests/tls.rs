//! TLS on every client-facing listener, with a self-signed certificate the
//! test makes: the native SDK over `tls://` (the binary gateway) and `wss://`
//! receives a push sent over HTTPS; the certificate is replaced on disk and
//! reloaded without dropping a connected client.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use mpush_protocol::session::AckMode;
use mpush_sdk_core::SessionEvent;
use mpush_sdk_core::native::{Client, ClientOptions};
use mpush_sdk_core::session::SessionConfig;
use serde_json::json;

/// A fresh self-signed certificate for 127.0.0.1 and localhost: (cert PEM, key PEM).
fn self_signed() -> (String, String) {
    let c = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("a certificate");
    (c.cert.pem(), c.signing_key.serialize_pem())
}

fn write(dir: &Path, cert: &str, key: &str) -> (PathBuf, PathBuf) {
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    // Through a rename: the server never reads a half-written file.
    for (path, text) in [(&c, cert), (&k, key)] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, path).expect("rename");
    }
    (c, k)
}

/// A temp dir holding a fresh self-signed certificate, and settings that
/// serve it on every listener: (settings, certificate PEM, dir).
fn tls_setup(tag: &str) -> (mpush_server::Settings, String, PathBuf) {
    let dir = std::env::temp_dir().join(format!("mpush-tls-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (cert, key) = self_signed();
    let (cert_file, key_file) = write(&dir, &cert, &key);
    let mut s = settings();
    s.tls.cert_file = cert_file.to_string_lossy().into_owned();
    s.tls.key_file = key_file.to_string_lossy().into_owned();
    (s, cert, dir)
}

/// A client session that trusts only `pin`.
fn session(address: String, pin: &str, device_id: &str) -> SessionConfig {
    let key = Arc::new(mpush_protocol::crypto::RsaPublic::mpush_default());
    let mut cfg = SessionConfig::new(vec![address], key, device(device_id, "android"));
    cfg.tls_pinned_cert_pem = Some(pin.to_owned());
    cfg.backoff.initial = Duration::from_millis(100);
    cfg
}

fn connect(session: SessionConfig) -> Client {
    Client::connect(ClientOptions {
        session,
        ticket_store: None,
    })
    .expect("valid options")
}

fn client(address: String, pin: &str, device_id: &str) -> Client {
    connect(session(address, pin, device_id))
}

async fn next(c: &mut Client, what: &str, f: impl Fn(&SessionEvent) -> bool) -> SessionEvent {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let e = tokio::time::timeout_at(deadline, c.next_event())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .unwrap_or_else(|| panic!("ended before {what}"));
        if f(&e) {
            return e;
        }
    }
}

async fn https_push(http: &reqwest::Client, base: &str, user: &str, content: &str) {
    let r = http
        .post(format!("{base}/api/v1/push"))
        .json(&json!({"userId": user, "content": content, "ackMode": "auto"}))
        .send()
        .await
        .expect("the API answers over HTTPS");
    assert_eq!(r.status(), 200);
}

/// The server's metrics, in Prometheus' text form.
async fn metrics(http: &reqwest::Client, base: &str) -> String {
    http.get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// `mpush_tls_suites_total` of `suite` in a scrape (0: never negotiated).
fn suite_count(text: &str, suite: &str) -> f64 {
    let series = format!("mpush_tls_suites_total{{suite=\"{suite}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

fn https_client(pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(pem.as_bytes()).expect("pem")])
        .build()
        .expect("client")
}

async fn message(c: &mut Client, text: &str) {
    next(
        c,
        text,
        |e| matches!(e, SessionEvent::Message(m) if m.content == text.as_bytes()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_transport_over_tls_and_a_certificate_reload_keeps_connections() {
    let (mut s, cert, dir) = tls_setup("reload");
    s.tls.reload_check_secs = 1;
    let server = start(s).await;
    let base = format!("https://127.0.0.1:{}", server.http.port());

    let mut over_tcp = client(
        format!("tls://127.0.0.1:{}", server.tcp.port()),
        &cert,
        "tls-1",
    );
    let mut over_ws = client(
        format!("wss://127.0.0.1:{}/", server.ws.expect("ws").port()),
        &cert,
        "wss-1",
    );
    over_tcp.bind("tina", "", "").await.expect("bind");
    over_ws.bind("walt", "", "").await.expect("bind");
    for c in [&mut over_tcp, &mut over_ws] {
        next(c, "bound", |e| {
            matches!(e, SessionEvent::BindResult { ok: true, .. })
        })
        .await;
    }
    let http = https_client(&cert);
    https_push(&http, &base, "tina", "over tls").await;
    https_push(&http, &base, "walt", "over wss").await;
    message(&mut over_tcp, "over tls").await;
    message(&mut over_ws, "over wss").await;
    // AES-128-GCM (the SDK offers it first, as browsers do, and the
    // listeners choose it): the key schedule ran on SHA-256, never on
    // AES-256-GCM's SHA-384.
    let text = metrics(&http, &base).await;
    let handshakes = |suite: &str| suite_count(&text, suite);
    assert!(handshakes("TLS13_AES_128_GCM_SHA256") >= 2.0, "{text}");
    assert_eq!(handshakes("TLS13_AES_256_GCM_SHA384"), 0.0, "{text}");
    // The allocator hands out the TLS addresses, and a client that knows
    // only the allocator (over HTTPS, with the same pinned certificate)
    // connects through it.
    let listed = http.get(format!("{base}/")).send().await.expect("alloc");
    assert_eq!(
        listed.text().await.expect("text"),
        format!("tls://127.0.0.1:{}", server.tcp.port())
    );
    let listed = http
        .get(format!("{base}/?transport=ws"))
        .send()
        .await
        .expect("alloc");
    assert_eq!(
        listed.text().await.expect("text"),
        format!("wss://127.0.0.1:{}/", server.ws.expect("ws").port())
    );
    let mut via_alloc = {
        let key = Arc::new(mpush_protocol::crypto::RsaPublic::mpush_default());
        let mut cfg = SessionConfig::new(Vec::new(), key, device("alloc-1", "android"));
        cfg.allocator_url = Some(format!("{base}/"));
        cfg.tls_pinned_cert_pem = Some(cert.clone());
        Client::connect(ClientOptions {
            session: cfg,
            ticket_store: None,
        })
        .expect("valid options")
    };
    let connected = next(&mut via_alloc, "connected through the allocator", |e| {
        matches!(e, SessionEvent::Connected { .. })
    })
    .await;
    assert!(
        matches!(&connected, SessionEvent::Connected { address, .. } if address.starts_with("tls://")),
        "{connected:?}"
    );
    drop(via_alloc);
    // Up-pushes ride the same TLS connection (no sink here: a clear refusal).
    let e = over_tcp
        .push(b"up", AckMode::Auto)
        .await
        .expect_err("no sink");
    assert_eq!(e.code(), "push_rejected");

    // Plain TCP to the TLS port gets nowhere.
    let plain = reqwest::get(format!("http://127.0.0.1:{}/healthz", server.http.port())).await;
    assert!(plain.is_err() || !plain.expect("response").status().is_success());

    // A new certificate on disk: picked up (checked every second) without
    // dropping the connected clients.
    let (cert2, key2) = self_signed();
    write(&dir, &cert2, &key2);
    let new_http = https_client(&cert2);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if new_http
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The old certificate is no longer served to new connections...
    let old = https_client(&cert)
        .get(format!("{base}/healthz"))
        .send()
        .await;
    assert!(old.is_err(), "new handshakes use the new certificate");
    // ...and the clients connected before the reload still receive.
    https_push(&new_http, &base, "tina", "after reload").await;
    https_push(&new_http, &base, "walt", "after reload, wss").await;
    message(&mut over_tcp, "after reload").await;
    message(&mut over_ws, "after reload, wss").await;
    // A broken file keeps the certificate in use.
    std::fs::write(dir.join("cert.pem"), "not a certificate").expect("write");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        new_http
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success()),
        "a failed reload keeps serving the last good certificate"
    );
    drop((over_tcp, over_ws));
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_certificate_is_refused_at_start_with_the_setting_named() {
    let dir = std::env::temp_dir().join(format!("mpush-tls-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (cert, _) = self_signed();
    let (_, other_key) = self_signed();
    let (c, k) = write(&dir, &cert, &other_key);
    let mut s = settings();
    s.tls.cert_file = c.to_string_lossy().into_owned();
    s.tls.key_file = k.to_string_lossy().into_owned();
    let e = s
        .validate()
        .expect_err("a key that does not match")
        .to_string();
    assert!(e.contains("tls.cert_file"), "{e}");
    let mut s = settings();
    s.tls.cert_file = dir.join("missing.pem").to_string_lossy().into_owned();
    s.tls.key_file = k.to_string_lossy().into_owned();
    assert!(s.validate().is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that opens a TCP connection to a TLS port and says nothing is
/// closed at the handshake deadline: it cannot hold a connection for free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_tls_client_is_closed_at_the_handshake_deadline() {
    use tokio::io::AsyncReadExt;
    let (mut s, _, dir) = tls_setup("silent");
    s.limits.handshake_timeout_ms = 1000;
    let server = start(s).await;
    let mut sock = tokio::net::TcpStream::connect(server.tcp)
        .await
        .expect("connects");
    let mut buf = [0u8; 16];
    let r = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await;
    assert!(
        matches!(r, Ok(Ok(0)) | Ok(Err(_))),
        "closed by the server within the deadline: {r:?}"
    );
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// ADR 0005: on `tls://` and `wss://` the native SDK can skip RSA and AES;
/// the server takes that profile only on its TLS listeners. A ticket of the
/// profile starts with `vt,`. (Resuming it: protocol/tests/simulation.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_transport_secured_profile_over_tls_and_never_over_plain_tcp() {
    let (s, cert, dir) = tls_setup("profile");
    let server = start(s).await;
    let base = format!("https://127.0.0.1:{}", server.http.port());
    let http = https_client(&cert);
    for (i, address) in [
        format!("tls://127.0.0.1:{}", server.tcp.port()),
        format!("wss://127.0.0.1:{}/", server.ws.expect("ws").port()),
    ]
    .into_iter()
    .enumerate()
    {
        let user = format!("tp-{i}");
        let mut cfg = session(address.clone(), &cert, &user);
        cfg.transport_profile = true;
        let mut c = connect(cfg);
        let SessionEvent::TicketUpdated { ticket } = next(&mut c, "a ticket", |e| {
            matches!(e, SessionEvent::TicketUpdated { .. })
        })
        .await
        else {
            unreachable!()
        };
        assert!(ticket.starts_with("vt,"), "{address}: {ticket}");
        c.bind(&user, "", "").await.expect("bind");
        https_push(&http, &base, &user, "no rsa here").await;
        message(&mut c, "no rsa here").await;
        c.close();
    }

    // The same plaintext handshake on the plain TCP listener: refused, no
    // session. (A raw protocol client: the SDK only offers it over TLS.)
    let plain = start(settings()).await;
    let key = Arc::new(mpush_protocol::crypto::RsaPublic::mpush_default());
    let mut cc = mpush_protocol::client::ClientConfig::new(key, device("tp-plain", "android"));
    cc.transport_secured = true;
    let mut conn = mpush_protocol::client::ClientConnection::new(
        Arc::new(cc),
        [5; 32],
        mpush_protocol::Instant::now(),
        0,
        None,
        mpush_protocol::dedup::DedupWindow::default(),
    );
    let mut sock = tokio::net::TcpStream::connect(plain.tcp)
        .await
        .expect("connect");
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    while let Some(b) = conn.poll_transmit() {
        sock.write_all(&b).await.expect("write");
    }
    let mut buf = vec![0u8; 4096];
    let mut connected = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, sock.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                conn.handle_input(&buf[..n], mpush_protocol::Instant::now());
                while let Some(e) = conn.poll_event() {
                    connected |= matches!(e, mpush_protocol::client::ClientEvent::Connected { .. });
                }
            }
            Err(_) => panic!("the server neither answered nor closed"),
        }
    }
    assert!(!connected, "a plaintext session on a plain connection");
    plain.shutdown().await;
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// One TLS handshake with `cfg` to `addr`, then a short read, which takes
/// in the session ticket the server sends after it: (the suite, full or
/// resumed).
async fn tls_handshake(
    addr: std::net::SocketAddr,
    cfg: Arc<tokio_rustls::rustls::ClientConfig>,
) -> (
    Option<tokio_rustls::rustls::CipherSuite>,
    Option<tokio_rustls::rustls::HandshakeKind>,
) {
    use tokio::io::AsyncReadExt;
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    let mut buf = [0u8; 64];
    let _ = tokio::time::timeout(Duration::from_millis(300), tls.read(&mut buf)).await;
    let c = tls.get_ref().1;
    (
        c.negotiated_cipher_suite().map(|s| s.suite()),
        c.handshake_kind(),
    )
}

/// The listeners choose the suite, as Go's crypto/tls does: AES-128-GCM for
/// a client that lists AES-256-GCM first (rustls', Node's and the JDK's
/// default order), whose SHA-384 key schedule costs more; ChaCha20 for a
/// client that puts it first (one without AES instructions). A session
/// ticket resumes on any listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listeners_choose_aes_128_unless_the_client_puts_chacha_first() {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::{self, CipherSuite, HandshakeKind};
    let (s, cert, dir) = tls_setup("suites");
    let server = start(s).await;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes()) {
        roots.add(c.expect("PEM")).expect("a root");
    }
    let client = |first: Option<CipherSuite>| {
        let mut p = rustls::crypto::aws_lc_rs::default_provider();
        if let Some(first) = first {
            p.cipher_suites.sort_by_key(|s| s.suite() != first);
        }
        Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(p))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(roots.clone())
                .with_no_client_auth(),
        )
    };
    let aes_256_first = client(None);
    assert_eq!(
        aes_256_first.crypto_provider().cipher_suites[0].suite(),
        CipherSuite::TLS13_AES_256_GCM_SHA384,
        "rustls' own order lists AES-256-GCM first"
    );
    let chacha_first = client(Some(CipherSuite::TLS13_CHACHA20_POLY1305_SHA256));
    for (cfg, want) in [
        (aes_256_first, CipherSuite::TLS13_AES_128_GCM_SHA256),
        (chacha_first, CipherSuite::TLS13_CHACHA20_POLY1305_SHA256),
    ] {
        // A full handshake, then resumed ones: one ticket key serves every
        // listener.
        let ws = server.ws.expect("ws");
        for (addr, listener, how) in [
            (server.tcp, "tcp", HandshakeKind::Full),
            (server.tcp, "tcp", HandshakeKind::Resumed),
            (ws, "ws", HandshakeKind::Resumed),
        ] {
            let (suite, kind) = tls_handshake(addr, cfg.clone()).await;
            assert_eq!(suite, Some(want), "{listener}");
            assert_eq!(kind, Some(how), "{listener}");
        }
    }
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `openssl s_client` to `addr` with `args`, trusting only the test's
/// certificate: (protocol, suite in OpenSSL's names).
fn openssl_handshake(addr: std::net::SocketAddr, ca: &Path, args: &[&str]) -> (String, String) {
    let out = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &addr.to_string(),
            "-servername",
            "localhost",
        ])
        .args(["-brief", "-verify_return_error", "-CAfile"])
        .arg(ca)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl (scripts/test installs it)");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("openssl {args:?} to {addr}: no `{name}` in\n{text}"))
    };
    (field("Protocol version:"), field("Ciphersuite:"))
}

/// The JDK's TLS client (`SSLSocket`, its default suite order: AES-256-GCM
/// first in TLS 1.3 and in TLS 1.2), trusting only the certificate in `ca`:
/// a handshake per protocol given (`default` or a protocol name); prints
/// the protocol and suite of each.
const JAVA_PROBE: &str = r#"
import java.io.FileInputStream;
import java.io.InputStream;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import java.util.List;
import javax.net.ssl.*;

public class TlsProbe {
    public static void main(String[] a) throws Exception {
        KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
        ks.load(null, null);
        try (InputStream in = new FileInputStream(a[1])) {
            ks.setCertificateEntry("server", CertificateFactory.getInstance("X.509").generateCertificate(in));
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(ks);
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(null, tmf.getTrustManagers(), null);
        for (String port : a[0].split(",")) {
            for (int i = 2; i < a.length; i++) {
                try (SSLSocket s = (SSLSocket) ctx.getSocketFactory().createSocket("127.0.0.1", Integer.parseInt(port))) {
                    if (!a[i].equals("default")) s.setEnabledProtocols(new String[] {a[i]});
                    SSLParameters p = s.getSSLParameters();
                    p.setServerNames(List.of(new SNIHostName("localhost")));
                    s.setSSLParameters(p);
                    s.startHandshake();
                    System.out.println(port + " " + s.getSession().getProtocol() + " " + s.getSession().getCipherSuite());
                }
            }
        }
    }
}
"#;

/// Real TLS clients, not rustls: OpenSSL's `s_client` (its own default
/// order, AES-256-GCM first; ChaCha20 first; TLS 1.2 only, likewise) and
/// the JDK's `SSLSocket` (TLS 1.3 and TLS 1.2 only) get the suite the
/// server chooses on the binary gateway's, the WebSocket gateway's and the
/// HTTPS API's listeners. The HTTPS API's handshakes count in the metrics
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tls_clients_get_aes_128_unless_they_put_chacha_first_on_every_listener() {
    let (s, cert, dir) = tls_setup("real");
    let server = start(s).await;
    let ca = dir.join("cert.pem");
    let listeners = [
        ("tcp", server.tcp),
        ("ws", server.ws.expect("ws")),
        ("api", server.http),
    ];
    let cases: [(&[&str], &str, &str); 4] = [
        (&[], "TLSv1.3", "TLS_AES_128_GCM_SHA256"),
        (
            &[
                "-ciphersuites",
                "TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256",
            ],
            "TLSv1.3",
            "TLS_CHACHA20_POLY1305_SHA256",
        ),
        (&["-tls1_2"], "TLSv1.2", "ECDHE-ECDSA-AES128-GCM-SHA256"),
        (
            &[
                "-tls1_2",
                "-cipher",
                "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES128-GCM-SHA256",
            ],
            "TLSv1.2",
            "ECDHE-ECDSA-CHACHA20-POLY1305",
        ),
    ];
    for (name, addr) in listeners {
        for (args, protocol, suite) in cases {
            let ca = ca.clone();
            let got = tokio::task::spawn_blocking(move || openssl_handshake(addr, &ca, args))
                .await
                .expect("openssl");
            assert_eq!(
                got,
                (protocol.to_owned(), suite.to_owned()),
                "{name} {args:?}"
            );
        }
    }

    // The JDK, in its default order, on every listener.
    let java = java();
    let probe = dir.join("TlsProbe.java");
    std::fs::write(&probe, JAVA_PROBE).expect("write");
    let ports = listeners.map(|(_, a)| a.port().to_string()).join(",");
    let (probe_path, ca_path) = (probe.clone(), ca.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(java)
            .arg(&probe_path)
            .arg(&ports)
            .arg(&ca_path)
            .args(["default", "TLSv1.2"])
            .output()
    })
    .await
    .expect("join")
    .expect("java");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut want = Vec::new();
    for (_, a) in listeners {
        want.push(format!("{} TLSv1.3 TLS_AES_128_GCM_SHA256", a.port()));
        want.push(format!(
            "{} TLSv1.2 TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            a.port()
        ));
    }
    assert_eq!(text.lines().collect::<Vec<_>>(), want);

    // Every listener counts its handshakes: TLS 1.2 with ChaCha20 is this
    // test's alone in this process, one per listener.
    let base = format!("https://127.0.0.1:{}", server.http.port());
    let text = metrics(&https_client(&cert), &base).await;
    let count = |suite: &str| suite_count(&text, suite);
    assert_eq!(
        count("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
        3.0,
        "{text}"
    );
    assert!(
        count("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256") >= 6.0,
        "{text}"
    );
    assert_eq!(
        count("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"),
        0.0,
        "{text}"
    );
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
