//! Recovery after Redis came back: this node's registration and routes go
//! back into Redis, then what was kept for its users while it was not
//! listening is handed over. A use case over the node's state and delivery.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Hub;

/// One recovery at a time, and none lost: a call while one runs makes it
/// run once more at its end.
#[derive(Default)]
pub(super) struct Recovery {
    running: AtomicBool,
    wanted: AtomicBool,
}

impl Recovery {
    /// Asks for a recovery; true when the caller is to run it.
    fn start(&self) -> bool {
        self.wanted.store(true, Ordering::SeqCst);
        !self.running.swap(true, Ordering::SeqCst)
    }

    /// Takes the request to run (again).
    fn take(&self) -> bool {
        self.wanted.swap(false, Ordering::SeqCst)
    }

    /// The runner stops; true when a call came after its last `take` and
    /// found it running, so it must run on.
    fn stop(&self) -> bool {
        self.running.store(false, Ordering::SeqCst);
        self.wanted.load(Ordering::SeqCst) && !self.running.swap(true, Ordering::SeqCst)
    }
}

impl Hub {
    /// Redis came back (the pub/sub connection's return, a registration
    /// found missing, a renewal that succeeds again after failing): the
    /// registration and every route of this node's connections go back into
    /// Redis, then what was kept for its users while it was not listening is
    /// handed over. Both are retried (0.1 s, doubling to 5 s) until they
    /// succeed or the node drains: never left for a timer. One recovery runs
    /// at a time; a call during one makes it run once more at its end.
    pub async fn recover(&self) {
        if self.cluster.is_none() {
            return;
        }
        if !self.recovery.start() {
            return;
        }
        loop {
            while self.recovery.take() && !self.node.is_draining() {
                self.reassert().await;
                self.sweep_until_done().await;
            }
            if !self.recovery.stop() {
                break;
            }
        }
    }

    /// Puts this node's registration and every route of its connections
    /// back into Redis, retrying until both are there (or the node drains).
    pub async fn reassert(&self) {
        let Some(cl) = &self.cluster else {
            return;
        };
        let (mut registered, mut failed) = (false, usize::MAX);
        let mut wait = Duration::from_millis(100);
        let mut attempts = 0u32;
        while !self.node.is_draining() {
            attempts += 1;
            if !registered {
                registered = cl.register(self.node.connections(), true).await.is_some();
            }
            if failed > 0 {
                failed = self.delivery.router.refresh().await;
            }
            if registered && failed == 0 {
                break;
            }
            if attempts == 20 {
                tracing::warn!(
                    registered,
                    failed,
                    "re-asserting in Redis: still failing, trying on (up to every 5 s)"
                );
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
        self.node.forget_health();
        metrics::counter!("mpush_redis_reasserts_total").increment(1);
        if registered && failed == 0 {
            tracing::info!(
                routes = self.bound(),
                attempts,
                "registration and routes re-asserted in Redis"
            );
        }
    }

    /// Hands over what is kept for the users connected here, retrying the
    /// users whose inbox could not be read until none is left (or the node
    /// drains).
    async fn sweep_until_done(&self) {
        let mut users = None;
        let mut wait = Duration::from_millis(100);
        while !self.node.is_draining() {
            let failed = self.delivery.sweep_kept(users.take()).await;
            if failed.is_empty() {
                return;
            }
            tracing::warn!(
                users = failed.len(),
                "kept messages not read for some users: trying again"
            );
            users = Some(failed);
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }
}
