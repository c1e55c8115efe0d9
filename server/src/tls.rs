//! TLS for the listeners that face clients (rustls): a certificate chain and
//! key from PEM files, reloaded without dropping a connection, on SIGHUP or
//! when a file changes (checked every few seconds). A reload that fails
//! keeps the certificate in use and says why.
//!
//! The cipher suite is the server's choice, as Go's crypto/tls makes it:
//! AES-128-GCM (a SHA-256 key schedule, which CPUs accelerate; AES-256-GCM's
//! SHA-384 runs in plain code on CPUs without SHA-512 instructions, about a
//! tenth more CPU per connect), unless the client's first choice is
//! ChaCha20-Poly1305, which a client without AES instructions puts first:
//! it gets ChaCha20.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::{Mutex, RwLock};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::rustls::CipherSuite;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};

/// The certificate in use, swapped in place by a reload.
#[derive(Debug)]
struct Current {
    key: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.key.read().clone())
    }
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("cert_file", &self.cert_file)
            .finish_non_exhaustive()
    }
}

pub struct Tls {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: Arc<Current>,
    acceptor: Acceptor,
    /// The files' modification times at the last load.
    stamp: Mutex<(Option<SystemTime>, Option<SystemTime>)>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

const AES_128: [CipherSuite; 3] = [
    CipherSuite::TLS13_AES_128_GCM_SHA256,
    CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
];
const CHACHA: [CipherSuite; 3] = [
    CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
];

/// rustls' suites with `first` ahead of the rest (whose order is kept).
fn ordered(first: &[&[CipherSuite]]) -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    p.cipher_suites.sort_by_key(|s| {
        first
            .iter()
            .position(|group| group.contains(&s.suite()))
            .unwrap_or(first.len())
    });
    Arc::new(p)
}

/// Whether the first suite of the client's list that `ours` has is a
/// ChaCha20 one: a client without AES instructions says so that way.
fn prefers_chacha(offered: &[CipherSuite], ours: &[rustls::SupportedCipherSuite]) -> bool {
    offered
        .iter()
        .find(|o| ours.iter().any(|s| s.suite() == **o))
        .is_some_and(|o| CHACHA.contains(o))
}

/// The listeners' TLS accept: reads the ClientHello, then completes the
/// handshake with the configuration whose suite order suits the client
/// (the module's comment). Both share the certificate and the ticket keys,
/// so a ticket from either resumes on either.
#[derive(Clone)]
pub struct Acceptor {
    aes: Arc<ServerConfig>,
    chacha: Arc<ServerConfig>,
}

impl Acceptor {
    pub async fn accept<IO>(&self, io: IO) -> std::io::Result<tokio_rustls::server::TlsStream<IO>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io).await?;
        // The suites the configurations have (both the same, in two orders).
        let ours = &self.aes.crypto_provider().cipher_suites;
        let config = if prefers_chacha(start.client_hello().cipher_suites(), ours) {
            &self.chacha
        } else {
            &self.aes
        };
        let tls = start.into_stream(config.clone()).await?;
        count(tls.get_ref().1);
        Ok(tls)
    }
}

/// A completed handshake in the metrics, whichever listener took it (the
/// client listeners and the HTTPS API): full or resumed, and its suite (a
/// label from rustls' fixed set of names: no client can add a series).
fn count(conn: &rustls::ServerConnection) {
    let kind = match conn.handshake_kind() {
        Some(rustls::HandshakeKind::Resumed) => "resumed",
        _ => "full",
    };
    metrics::counter!("mpush_tls_handshakes_total", "kind" => kind).increment(1);
    let suite = conn
        .negotiated_cipher_suite()
        .and_then(|s| s.suite().as_str())
        .unwrap_or("other");
    metrics::counter!("mpush_tls_suites_total", "suite" => suite).increment(1);
}

/// Why a certificate could not be loaded (the words name the file).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read or is not PEM.
    #[error("{file}: {reason}")]
    File { file: String, reason: String },
    #[error("{0}: no certificate in it")]
    NoCertificate(String),
    /// The key does not belong to the certificate (or is of a kind rustls
    /// does not take).
    #[error("{cert} with {key}: {reason}")]
    Mismatch {
        cert: String,
        key: String,
        reason: String,
    },
    #[error("{0}")]
    Config(#[from] rustls::Error),
}

fn file_error(p: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        file: p.display().to_string(),
        reason: e.to_string(),
    }
}

/// Reads a chain and its key and checks that they belong together.
fn load(cert_file: &Path, key_file: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| file_error(cert_file, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(cert_file, e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert_file.display().to_string()));
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| file_error(key_file, e))?;
    let ck = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| TlsError::Mismatch {
        cert: cert_file.display().to_string(),
        key: key_file.display().to_string(),
        reason: e.to_string(),
    })?;
    Ok(Arc::new(ck))
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl Tls {
    pub fn new(cert_file: &Path, key_file: &Path) -> Result<Arc<Self>, TlsError> {
        let key = load(cert_file, key_file)?;
        let current = Arc::new(Current {
            key: RwLock::new(key),
        });
        // Resumption by stateless tickets (keys rotated by rustls every six
        // hours), not by rustls' default 256-entry session cache: every
        // client of a large node can resume, and a reconnect skips the
        // certificate signature. One ticket per handshake: a client
        // reconnects with one session at a time.
        let ticketer = tokio_rustls::rustls::crypto::aws_lc_rs::Ticketer::new()?;
        let config = |first: &[&[CipherSuite]]| -> Result<Arc<ServerConfig>, TlsError> {
            let mut config = ServerConfig::builder_with_provider(ordered(first))
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_cert_resolver(current.clone());
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            config.ignore_client_order = true;
            config.ticketer = ticketer.clone();
            config.send_tls13_tickets = 1;
            Ok(Arc::new(config))
        };
        let acceptor = Acceptor {
            aes: config(&[&AES_128])?,
            chacha: config(&[&CHACHA, &AES_128])?,
        };
        Ok(Arc::new(Self {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            current,
            acceptor,
            stamp: Mutex::new((mtime(cert_file), mtime(key_file))),
        }))
    }

    pub fn acceptor(&self) -> &Acceptor {
        &self.acceptor
    }

    /// Reads the files again; new handshakes get the new certificate,
    /// connections already open keep theirs.
    pub fn reload(&self) -> Result<(), TlsError> {
        let key = load(&self.cert_file, &self.key_file)?;
        *self.current.key.write() = key;
        *self.stamp.lock() = (mtime(&self.cert_file), mtime(&self.key_file));
        metrics::counter!("mpush_tls_reloads_total").increment(1);
        tracing::info!(cert = %self.cert_file.display(), "TLS certificate reloaded");
        Ok(())
    }

    fn changed(&self) -> bool {
        *self.stamp.lock() != (mtime(&self.cert_file), mtime(&self.key_file))
    }

    /// Reloads on SIGHUP and when a file's modification time changes.
    pub fn spawn_watch(self: &Arc<Self>, every: Duration) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            #[cfg(unix)]
            let mut hup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            loop {
                #[cfg(unix)]
                let signalled = async {
                    match hup.as_mut() {
                        Some(h) => {
                            h.recv().await;
                        }
                        None => std::future::pending().await,
                    }
                };
                #[cfg(not(unix))]
                let signalled = std::future::pending::<()>();
                let by_signal = tokio::select! {
                    _ = signalled => true,
                    _ = tokio::time::sleep(every) => false,
                };
                let Some(tls) = me.upgrade() else { return };
                if (by_signal || tls.changed())
                    && let Err(e) = tls.reload()
                {
                    metrics::counter!("mpush_tls_reload_errors_total").increment(1);
                    tracing::warn!(error = %e, "TLS reload failed; the certificate in use stays");
                    // Do not retry the same broken files every few seconds.
                    *tls.stamp.lock() = (mtime(&tls.cert_file), mtime(&tls.key_file));
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CipherSuite as S;

    #[test]
    fn chacha_only_for_a_client_that_puts_it_first() {
        let provider = provider();
        let ours = &provider.cipher_suites;
        // Chrome's and Firefox's order, rustls' (and Node's, the JDK's)
        // AES-256 first, an AES-less phone's ChaCha20 first.
        let browser = [
            S::TLS13_AES_128_GCM_SHA256,
            S::TLS13_AES_256_GCM_SHA384,
            S::TLS13_CHACHA20_POLY1305_SHA256,
        ];
        let aes_256_first = [
            S::TLS13_AES_256_GCM_SHA384,
            S::TLS13_CHACHA20_POLY1305_SHA256,
            S::TLS13_AES_128_GCM_SHA256,
        ];
        let no_aes = [
            S::TLS13_CHACHA20_POLY1305_SHA256,
            S::TLS13_AES_128_GCM_SHA256,
        ];
        assert!(!prefers_chacha(&browser, ours));
        assert!(!prefers_chacha(&aes_256_first, ours));
        assert!(prefers_chacha(&no_aes, ours));
        // Suites this server does not have are skipped (GREASE, old CBC
        // ones); a TLS 1.2 client's ChaCha20 counts too.
        let grease = S::from(0x0a0a);
        assert!(prefers_chacha(
            &[
                grease,
                S::TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA,
                S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
                S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            ],
            ours
        ));
        assert!(!prefers_chacha(&[grease], ours));
        assert!(!prefers_chacha(&[], ours));
    }

    #[test]
    fn the_orders_put_their_groups_first_and_keep_every_suite() {
        let suites = |p: Arc<rustls::crypto::CryptoProvider>| -> Vec<CipherSuite> {
            p.cipher_suites.iter().map(|s| s.suite()).collect()
        };
        let all = suites(provider());
        let aes = suites(ordered(&[&AES_128]));
        let chacha = suites(ordered(&[&CHACHA, &AES_128]));
        for o in [&aes, &chacha] {
            let (mut a, mut b) = (o.clone(), all.clone());
            a.sort_by_key(|s| u16::from(*s));
            b.sort_by_key(|s| u16::from(*s));
            assert_eq!(a, b, "the same suites, reordered");
        }
        assert_eq!(aes[0], S::TLS13_AES_128_GCM_SHA256);
        assert!(aes[..3].iter().all(|s| AES_128.contains(s)), "{aes:?}");
        assert_eq!(chacha[0], S::TLS13_CHACHA20_POLY1305_SHA256);
        assert!(chacha[..3].iter().all(|s| CHACHA.contains(s)), "{chacha:?}");
        assert!(
            chacha[3..6].iter().all(|s| AES_128.contains(s)),
            "{chacha:?}"
        );
    }
}
