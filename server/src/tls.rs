//! TLS for the listeners that face clients (rustls): a certificate chain and
//! key from PEM files, reloaded without dropping a connection, on SIGHUP or
//! when a file changes (checked every few seconds). A reload that fails
//! keeps the certificate in use and says why.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::{Mutex, RwLock};
use tokio_rustls::TlsAcceptor;
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
    acceptor: TlsAcceptor,
    /// The files' modification times at the last load.
    stamp: Mutex<(Option<SystemTime>, Option<SystemTime>)>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
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
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        // Resumption by stateless tickets (keys rotated by rustls every six
        // hours), not by rustls' default 256-entry session cache: every
        // client of a large node can resume, and a reconnect skips the
        // certificate signature. One ticket per handshake: a client
        // reconnects with one session at a time.
        config.ticketer = tokio_rustls::rustls::crypto::aws_lc_rs::Ticketer::new()?;
        config.send_tls13_tickets = 1;
        Ok(Arc::new(Self {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            current,
            acceptor: TlsAcceptor::from(Arc::new(config)),
            stamp: Mutex::new((mtime(cert_file), mtime(key_file))),
        }))
    }

    pub fn acceptor(&self) -> &TlsAcceptor {
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
