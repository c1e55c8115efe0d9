//! This node's connections, by user. Binding the same user and client type
//! again replaces the older connection (the caller kicks it), as mpush does;
//! other client types stay online (multi-device).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;

use super::ConnHandle;

/// A user's connections on this node, as a lookup copies them out.
pub type Handles = smallvec::SmallVec<[ConnHandle; 2]>;

#[derive(Default)]
pub struct Connections {
    users: DashMap<Arc<str>, Vec<ConnHandle>>,
    bound: AtomicUsize,
}

impl Connections {
    /// Registers `handle` for `user`; returns the connection it replaced (same
    /// client type, another connection), if any.
    pub fn bind(&self, user: &Arc<str>, handle: ConnHandle) -> Option<ConnHandle> {
        // Most users have one device: room for exactly one.
        let mut routes = self
            .users
            .entry(user.clone())
            .or_insert_with(|| Vec::with_capacity(1));
        if let Some(i) = routes.iter().position(|h| h.info.id == handle.info.id) {
            routes[i] = handle;
            return None;
        }
        let ct = handle.info.client_type;
        let old = routes
            .iter()
            .position(|h| h.info.client_type == ct)
            .map(|i| routes.swap_remove(i));
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
                routes.swap_remove(i);
                removed = true;
            }
            routes.is_empty()
        });
        if removed {
            self.bound.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// `user`'s connections here. Most users have one or two devices: they
    /// are copied out without an allocation (a push looks up every
    /// recipient).
    pub fn lookup(&self, user: &str) -> Handles {
        self.users
            .get(user)
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether `user` is bound here through connection `conn_id`.
    pub fn holds(&self, user: &str, conn_id: u64) -> bool {
        self.users
            .get(user)
            .is_some_and(|r| r.iter().any(|h| h.info.id == conn_id))
    }

    /// Bound connections.
    pub fn len(&self) -> usize {
        self.bound.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every (user, connection) that `keep` accepts, visited in place (no
    /// copy of the whole table; a user id is a shared pointer).
    pub fn select(
        &self,
        mut keep: impl FnMut(&str, &ConnHandle) -> bool,
    ) -> Vec<(Arc<str>, ConnHandle)> {
        let mut out = Vec::new();
        for e in self.users.iter() {
            for h in e.value() {
                if keep(e.key(), h) {
                    out.push((e.key().clone(), h.clone()));
                }
            }
        }
        out
    }

    /// Every (user, connection), for drain and route refresh.
    pub fn snapshot(&self) -> Vec<(Arc<str>, ConnHandle)> {
        self.select(|_, _| true)
    }
}
