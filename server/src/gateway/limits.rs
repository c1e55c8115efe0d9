//! What one client address may cost the gateway: a rate of new connections
//! (which is also its RSA budget: a connection gets one handshake) and a
//! number of open ones; and the RSA private-key operations themselves, on a
//! few dedicated threads behind a bounded queue, so a handshake flood cannot
//! starve the async workers that serve bound connections.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use mpush_protocol::crypto::RsaPrivate;
use mpush_protocol::error::CryptoError;
use parking_lot::Mutex;
use tokio::sync::oneshot;

/// New connections per client IP: `rate` per second, a burst of the same
/// size (governor's keyed GCRA; addresses idle long enough are forgotten).
pub struct IpRateLimit {
    limiter: governor::DefaultKeyedRateLimiter<IpAddr>,
}

impl IpRateLimit {
    pub fn new(rate: u32) -> Self {
        let rate = std::num::NonZeroU32::new(rate.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
        Self {
            limiter: governor::DefaultKeyedRateLimiter::keyed(governor::Quota::per_second(rate)),
        }
    }

    pub fn allow(&self, ip: IpAddr) -> bool {
        if self.limiter.len() > 100_000 {
            // Forget addresses whose budget is full again: they are
            // equivalent to new ones.
            self.limiter.retain_recent();
        }
        self.limiter.check_key(&ip).is_ok()
    }
}

/// Open connections per client IP, with a cap.
pub struct PerIp {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One counted connection; dropping it gives the slot back.
pub struct IpSlot {
    owner: Arc<PerIp>,
    ip: IpAddr,
}

impl PerIp {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for one more connection from `ip`, or `None` over the cap.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr) -> Option<IpSlot> {
        let mut open = self.open.lock();
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            owner: self.clone(),
            ip,
        })
    }
}

impl IpSlot {
    /// The address this slot counts.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut open = self.owner.open.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Why a handshake's RSA work was not done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("too many handshakes are waiting for the RSA workers")]
pub struct RsaBusy;

/// RSA private-key operations off the async workers: `workers` long-lived
/// threads (each keeps its own allocator arena and RNG, so a handshake
/// storm does not grow the process by a thread per handshake) and at most
/// `queue` handshakes waiting.
pub struct RsaPool {
    jobs: std::sync::mpsc::SyncSender<Job>,
    /// Private-key operations done (a test's witness of work skipped).
    #[cfg_attr(not(test), allow(dead_code))]
    done: Arc<std::sync::atomic::AtomicU64>,
}

type Job = (Bytes, oneshot::Sender<Result<Vec<u8>, CryptoError>>);

impl RsaPool {
    pub fn new(key: Arc<RsaPrivate>, workers: usize, queue: usize) -> Self {
        let (jobs, rx) = std::sync::mpsc::sync_channel::<Job>(queue.max(1));
        let rx = Arc::new(Mutex::new(rx));
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        for i in 0..workers.max(1) {
            let (key, rx, done) = (key.clone(), rx.clone(), done.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("mpush-rsa-{i}"))
                .spawn(move || {
                    let mut rng = crate::clock::rng();
                    loop {
                        // Ends when the pool (the sending side) is dropped.
                        let Ok((ciphertext, reply)) = rx.lock().recv() else {
                            return;
                        };
                        // A handshake whose deadline passed while it waited
                        // here, or whose client closed its connection, is not
                        // decrypted: under a storm the queue would otherwise
                        // be worked off for clients that have left, and every
                        // later one would time out too.
                        if reply.is_closed() {
                            metrics::counter!("mpush_handshakes_refused_total", "reason" => "expired")
                                .increment(1);
                            continue;
                        }
                        let plain = key.decrypt(&mut rng, &ciphertext);
                        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let _ = reply.send(plain);
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start an RSA worker thread");
            }
        }
        Self { jobs, done }
    }

    /// Private-key operations done so far.
    #[cfg(test)]
    pub fn done(&self) -> u64 {
        self.done.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Decrypts a handshake; refused when the queue is full.
    pub async fn decrypt(
        &self,
        ciphertext: Bytes,
    ) -> Result<Result<Vec<u8>, CryptoError>, RsaBusy> {
        let (reply, rx) = oneshot::channel();
        if self.jobs.try_send((ciphertext, reply)).is_err() {
            metrics::counter!("mpush_handshakes_refused_total", "reason" => "busy").increment(1);
            return Err(RsaBusy);
        }
        rx.await.map_err(|_| RsaBusy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpush_protocol::crypto::RsaPublic;
    use std::time::Duration;

    fn expired(text: &str) -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix("mpush_handshakes_refused_total{reason=\"expired\"} "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// A handshake given up while it waited for the RSA worker (its
    /// deadline passed) costs no RSA work: the worker skips it and counts it.
    #[tokio::test]
    async fn a_handshake_whose_caller_left_is_not_decrypted() {
        let metrics = crate::metrics_handle();
        let before = expired(&metrics.render());
        let pool = Arc::new(RsaPool::new(Arc::new(RsaPrivate::mpush_default()), 1, 8));
        let mut rng = crate::clock::rng();
        let block = RsaPublic::mpush_default()
            .encrypt(&mut rng, b"a handshake's body")
            .expect("encrypt");
        // One job of 64 blocks keeps the only worker busy for tens of ms.
        let long = Bytes::from(block.repeat(64));
        let busy = tokio::spawn({
            let pool = pool.clone();
            async move { pool.decrypt(long).await }
        });
        // This test's runtime has one thread: the spawned task queues its
        // job when this one yields, before the next job below.
        tokio::task::yield_now().await;
        // Queued behind it, then given up: polled once (queued), dropped.
        let gave_up =
            tokio::time::timeout(Duration::ZERO, pool.decrypt(Bytes::from(block.clone())));
        assert!(gave_up.await.is_err(), "the queued job cannot be done yet");
        // The worker takes jobs in order: once the next one is answered, the
        // abandoned one has been passed over.
        let plain = pool.decrypt(Bytes::from(block)).await.expect("queued");
        assert_eq!(plain.expect("decrypted"), b"a handshake's body");
        assert!(busy.await.expect("task").expect("queued").is_ok());
        assert!(
            expired(&metrics.render()) > before,
            "the abandoned handshake was skipped"
        );
    }
}
