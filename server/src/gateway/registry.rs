//! The connection registry: who is bound where, keyed by user and client type.
//! Binding the same user and client type again replaces (and kicks) the older
//! connection, as mpush does; other client types stay online (multi-device).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;
use mpush_protocol::server::OutboundPush;
use mpush_protocol::session::{DeviceInfo, Profile};
use parking_lot::RwLock;
use tokio::sync::mpsc;

/// What other tasks can ask of a connection.
#[derive(Debug)]
pub enum ConnCommand {
    Push(Box<OutboundPush>),
    /// Another device took this connection's place: send KICK (mpush keeps
    /// the connection open; its client decides). Boxed, like `Push`, so a
    /// command is two words and each connection's queue blocks stay small.
    Kicked(Box<Kick>),
    /// The API kicked the user: send KICK and close.
    KickAndClose,
    /// Shutdown: redirect v2 clients, drain ACKs, close.
    Drain,
}

/// Who replaced a connection.
#[derive(Debug)]
pub struct Kick {
    pub device_id: String,
    pub user_id: String,
}

/// Facts about a live connection.
#[derive(Debug)]
pub struct ConnInfo {
    pub id: u64,
    pub device: DeviceInfo,
    pub client_type: i32,
    pub profile: Profile,
    pub transport: &'static str,
    pub connected_at_ms: i64,
    pub tags: RwLock<String>,
}

/// A way to reach a connection's task.
#[derive(Debug, Clone)]
pub struct ConnHandle {
    pub info: Arc<ConnInfo>,
    pub tx: mpsc::Sender<ConnCommand>,
}

#[derive(Default)]
pub struct Registry {
    users: DashMap<String, Vec<ConnHandle>>,
    bound: AtomicUsize,
}

impl Registry {
    /// Registers `handle` for `user`; returns the connection it replaced (same
    /// client type, another connection), if any.
    pub fn bind(&self, user: &str, handle: ConnHandle) -> Option<ConnHandle> {
        let mut routes = self.users.entry(user.to_owned()).or_default();
        if let Some(i) = routes.iter().position(|h| h.info.id == handle.info.id) {
            routes[i] = handle;
            return None;
        }
        let ct = handle.info.client_type;
        let old = routes
            .iter()
            .position(|h| h.info.client_type == ct)
            .map(|i| routes.remove(i));
        if old.is_none() {
            self.bound.fetch_add(1, Ordering::Relaxed);
        }
        routes.push(handle);
        old
    }

    /// Removes `user`'s route through connection `conn_id`, if it is still the
    /// route (a newer bind may have replaced it).
    pub fn unbind(&self, user: &str, conn_id: u64) -> bool {
        let mut removed = false;
        self.users.remove_if_mut(user, |_, routes| {
            if let Some(i) = routes.iter().position(|h| h.info.id == conn_id) {
                routes.remove(i);
                removed = true;
            }
            routes.is_empty()
        });
        if removed {
            self.bound.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    pub fn lookup(&self, user: &str) -> Vec<ConnHandle> {
        self.users.get(user).map(|r| r.clone()).unwrap_or_default()
    }

    /// Bound connections.
    pub fn len(&self) -> usize {
        self.bound.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every (user, connection), for broadcast and drain.
    pub fn snapshot(&self) -> Vec<(String, ConnHandle)> {
        let mut out = Vec::with_capacity(self.len());
        for e in self.users.iter() {
            for h in e.value() {
                out.push((e.key().clone(), h.clone()));
            }
        }
        out
    }
}
