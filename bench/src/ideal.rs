//! The minimal ideal server: plain tokio, no protocol, one task and one
//! bounded queue per connection, queued messages coalesced into one write.
//! What a push server could do at best on this machine; `run` reports every
//! figure of the real server as a ratio to it. Driven over stdin/stdout.

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::worker::stamp;

type Queues = Arc<Mutex<Vec<mpsc::Sender<Bytes>>>>;

async fn writer<W>(mut sock: W, mut rx: mpsc::Receiver<Bytes>)
where
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut batch = Vec::new();
    let mut buf = BytesMut::new();
    while rx.recv_many(&mut batch, 256).await > 0 {
        for m in batch.drain(..) {
            buf.put_u32(m.len() as u32);
            buf.put_slice(&m);
        }
        if sock.write_all(&buf).await.is_err() || sock.flush().await.is_err() {
            return;
        }
        buf.clear();
    }
}

/// Sends `count` messages of `size` bytes: to every connection, or round-robin.
async fn send(queues: &Queues, count: usize, size: usize, broadcast: bool) -> usize {
    let qs: Vec<mpsc::Sender<Bytes>> = queues.lock().map(|q| q.clone()).unwrap_or_default();
    if qs.is_empty() {
        return 0;
    }
    let mut sent = 0;
    for k in 0..count {
        let msg = Bytes::from(stamp(size));
        if broadcast {
            for q in &qs {
                if q.send(msg.clone()).await.is_ok() {
                    sent += 1;
                }
            }
        } else if qs[k % qs.len()].send(msg).await.is_ok() {
            sent += 1;
        }
    }
    sent
}

/// `count` RSA private-key operations on this thread, as the server does one
/// per full handshake: the mpush default 1024-bit key, the same library and
/// blinding, one block of a handshake's size. Returns the seconds spent and
/// the library that did them.
fn rsa_ops(count: usize) -> Result<(f64, &'static str)> {
    use mpush_protocol::crypto::{RsaPrivate, RsaPublic};
    let key = RsaPrivate::mpush_default();
    let mut rng: mpush_protocol::crypto::Rng = rand_core::SeedableRng::from_seed([9; 32]);
    let block = RsaPublic::mpush_default().encrypt(&mut rng, &[7u8; 100])?;
    let t0 = std::time::Instant::now();
    for _ in 0..count {
        key.decrypt(&mut rng, &block)?;
    }
    Ok((t0.elapsed().as_secs_f64(), key.backend()))
}

/// A TLS acceptor over `cert`/`key` (PEM) with rustls' defaults: what a TLS
/// accept alone costs, for the server's TLS listeners to be compared with.
fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

pub async fn run(addr: &str, tls: Option<(&Path, &Path)>) -> Result<()> {
    let listener = TcpListener::bind(addr).await?;
    let acceptor = tls.map(|(c, k)| tls_acceptor(c, k)).transpose()?;
    let queues: Queues = Arc::new(Mutex::new(Vec::new()));
    let q = queues.clone();
    tokio::spawn(async move {
        loop {
            // An aborted connection (ECONNABORTED and the like) is not the
            // end of the listener.
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let _ = sock.set_nodelay(true);
            let (tx, rx) = mpsc::channel(1024);
            match &acceptor {
                None => {
                    if let Ok(mut v) = q.lock() {
                        v.push(tx);
                    }
                    tokio::spawn(writer(sock, rx));
                }
                Some(acceptor) => {
                    let (acceptor, q) = (acceptor.clone(), q.clone());
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(sock).await else {
                            return;
                        };
                        if let Ok(mut v) = q.lock() {
                            v.push(tx);
                        }
                        writer(tls, rx).await;
                    });
                }
            }
        }
    });
    let mut out = tokio::io::stdout();
    out.write_all(format!("{}\n", json!({"event": "listening", "addr": addr})).as_bytes())
        .await?;
    out.flush().await?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut next = 0usize;
    while let Some(line) = lines.next_line().await? {
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            // One message with this text (the bench's stamp) to the next
            // connection, round-robin.
            ["send", text] => {
                let q = queues
                    .lock()
                    .ok()
                    .and_then(|q| (!q.is_empty()).then(|| q[next % q.len()].clone()));
                next = next.wrapping_add(1);
                let sent = match q {
                    Some(q) => q
                        .send(Bytes::copy_from_slice(text.as_bytes()))
                        .await
                        .is_ok(),
                    None => false,
                };
                json!({"event": "sent", "sent": usize::from(sent)})
            }
            ["broadcast" | "unicast", count, size] => {
                let (count, size) = (count.parse()?, size.parse()?);
                let sent = send(&queues, count, size, words[0] == "broadcast").await;
                json!({"event": "sent", "sent": sent})
            }
            ["rsa", count] => {
                let count: usize = count.parse()?;
                let (spent, backend) = rsa_ops(count)?;
                json!({"event": "rsa", "ops": count, "seconds": spent, "backend": backend})
            }
            ["count"] => {
                json!({"event": "count", "conns": queues.lock().map(|q| q.len()).unwrap_or(0)})
            }
            ["quit"] => break,
            _ => json!({"event": "error", "message": format!("unknown command {line}")}),
        };
        out.write_all(format!("{reply}\n").as_bytes()).await?;
        out.flush().await?;
    }
    Ok(())
}
