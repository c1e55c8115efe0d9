//! The webhook sink: `POST {"events":[...]}` as JSON, signed.
//!
//! `X-Mpush-Timestamp` is the Unix time in seconds; `X-Mpush-Signature` is
//! `v1=` and the hex HMAC-SHA256, under the shared secret, of the timestamp,
//! a `.`, and the body. A receiver recomputes it over the raw body, compares
//! in constant time, and refuses timestamps more than a few minutes away
//! from its clock (a replayed request).

use std::time::Duration;

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use hmac::{KeyInit, Mac};

use super::{Deliver, DeliverError};

pub const TIMESTAMP_HEADER: &str = "x-mpush-timestamp";
pub const SIGNATURE_HEADER: &str = "x-mpush-signature";

/// The `X-Mpush-Signature` value for `body` sent at `timestamp` (seconds).
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1={}", hex::encode(mac.finalize().into_bytes()))
}

pub struct Webhook {
    url: String,
    /// The URL as errors and logs show it (credentials masked).
    shown: String,
    secret: Vec<u8>,
    client: reqwest::Client,
}

impl Webhook {
    pub fn new(url: &str, secret: &str, timeout_ms: u64) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(timeout_ms))
            .connect_timeout(Duration::from_millis(timeout_ms.min(3_000)))
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(64)
            .user_agent(concat!("mpush-server/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("a client with rustls");
        Self {
            url: url.to_owned(),
            shown: crate::redact::mask_url(url),
            secret: secret.as_bytes().to_vec(),
            client,
        }
    }
}

/// `{"events":[e1,e2,...]}` from events that are JSON objects already.
fn body(events: &[Bytes]) -> Bytes {
    let len: usize = events.iter().map(|e| e.len() + 1).sum();
    let mut b = BytesMut::with_capacity(len + 16);
    b.put_slice(b"{\"events\":[");
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            b.put_u8(b',');
        }
        b.put_slice(e);
    }
    b.put_slice(b"]}");
    b.freeze()
}

#[async_trait]
impl Deliver for Webhook {
    async fn deliver(&self, events: &[Bytes]) -> Result<(), DeliverError> {
        let body = body(events);
        let ts = u64::try_from(crate::clock::unix_ms() / 1000).unwrap_or(0);
        let sig = sign(&self.secret, ts, &body);
        let r = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header(TIMESTAMP_HEADER, ts.to_string())
            .header(SIGNATURE_HEADER, sig)
            .body(body)
            .send()
            .await
            // reqwest's error text names the URL: without it, ours masked.
            .map_err(|e| DeliverError::Unreachable {
                target: format!("POST {}", self.shown),
                reason: e.without_url().to_string(),
            })?;
        let status = r.status();
        // Read a small answer so the connection can be reused; a large one
        // is not read (nor held): the connection is dropped instead.
        let mut r = r;
        let mut read = 0usize;
        while let Ok(Some(chunk)) = r.chunk().await {
            read += chunk.len();
            if read > 64 * 1024 {
                break;
            }
        }
        if status.is_success() {
            Ok(())
        } else {
            Err(DeliverError::Refused {
                target: format!("POST {}", self.shown),
                status: status.to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_one_json_object_and_the_signature_covers_it() {
        let b = body(&[
            Bytes::from_static(b"{\"a\":1}"),
            Bytes::from_static(b"{\"b\":2}"),
        ]);
        let v: serde_json::Value = serde_json::from_slice(&b).expect("json");
        assert_eq!(v["events"][1]["b"], 2);
        let s = sign(b"0123456789abcdef", 1_700_000_000, &b);
        assert!(s.starts_with("v1=") && s.len() == 3 + 64);
        assert_ne!(s, sign(b"0123456789abcdef", 1_700_000_001, &b));
        assert_ne!(s, sign(b"0123456789abcdeX", 1_700_000_000, &b));
    }
}
