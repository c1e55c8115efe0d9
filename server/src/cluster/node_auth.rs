//! Peer authentication on the node-to-node port: a mutual HMAC-SHA256
//! challenge over `cluster.secret`, done before a single push is read.
//!
//! ```text
//! acceptor  -> connector  "MPN1" | nonce_a (32)
//! connector -> acceptor   "MPN1" | nonce_c (32) | HMAC(secret, "mpush node c" | nonce_a | nonce_c)
//! acceptor  -> connector  HMAC(secret, "mpush node a" | nonce_a | nonce_c)
//! ```
//!
//! Fresh nonces on both sides: a recorded exchange cannot be replayed in
//! either direction. It authenticates the peers; it does not encrypt the
//! link (run the node port on a private network).

use std::time::Duration;

use hmac::{KeyInit, Mac};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MAGIC: &[u8; 4] = b"MPN1";

fn mac(secret: &str, label: &[u8], a: &[u8; 32], c: &[u8; 32]) -> [u8; 32] {
    let mut m = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes any key length");
    m.update(label);
    m.update(a);
    m.update(c);
    m.finalize().into_bytes().into()
}

fn nonce() -> [u8; 32] {
    crate::clock::seed()
}

fn refused(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.to_owned())
}

/// The accepting side; `Err` means close the connection.
pub async fn accept(stream: &mut TcpStream, secret: &str, limit: Duration) -> std::io::Result<()> {
    let run = async {
        let a = hello(stream).await?;
        answer(stream, secret, &a).await
    };
    tokio::time::timeout(limit, run)
        .await
        .map_err(|_| timed_out())?
}

/// The acceptor's first step: its nonce, which the peer answers.
pub async fn hello(stream: &mut TcpStream) -> std::io::Result<[u8; 32]> {
    let a = nonce();
    let mut hello = Vec::with_capacity(36);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&a);
    stream.write_all(&hello).await?;
    Ok(a)
}

/// The acceptor's second step: the peer's answer checked, its proof sent.
pub async fn answer(stream: &mut TcpStream, secret: &str, a: &[u8; 32]) -> std::io::Result<()> {
    let mut answer = [0u8; 4 + 32 + 32];
    stream.read_exact(&mut answer).await?;
    if &answer[..4] != MAGIC {
        return Err(refused("not a node"));
    }
    let c: [u8; 32] = answer[4..36].try_into().expect("32 bytes");
    let want = mac(secret, b"mpush node c", a, &c);
    if !mpush_protocol::crypto::verify_mac(&want, &answer[36..]) {
        return Err(refused("wrong node secret"));
    }
    stream.write_all(&mac(secret, b"mpush node a", a, &c)).await
}

fn timed_out() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "node authentication timed out",
    )
}

/// The connecting side; `Err` means the peer is not one of ours.
pub async fn connect(stream: &mut TcpStream, secret: &str, limit: Duration) -> std::io::Result<()> {
    let run = async {
        let mut hello = [0u8; 36];
        stream.read_exact(&mut hello).await?;
        if &hello[..4] != MAGIC {
            return Err(refused("not a node"));
        }
        let a: [u8; 32] = hello[4..].try_into().expect("32 bytes");
        let c = nonce();
        let mut answer = Vec::with_capacity(68);
        answer.extend_from_slice(MAGIC);
        answer.extend_from_slice(&c);
        answer.extend_from_slice(&mac(secret, b"mpush node c", &a, &c));
        stream.write_all(&answer).await?;
        let mut proof = [0u8; 32];
        stream.read_exact(&mut proof).await?;
        if !mpush_protocol::crypto::verify_mac(&mac(secret, b"mpush node a", &a, &c), &proof) {
            return Err(refused("the peer does not know the node secret"));
        }
        Ok(())
    };
    tokio::time::timeout(limit, run)
        .await
        .map_err(|_| timed_out())?
}
