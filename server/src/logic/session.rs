//! Sessions (fast connect), bind and auth, unbind, kicks, and who is online:
//! what a connection asks of the logic layer, and what the API asks about users.

use mpush_protocol::session::ClientType;
use std::sync::Arc;

use mpush_protocol::session::{KeptBinding, SessionRecord};
use serde::Serialize;

use crate::auth::{BindAuth, TokenError};
use crate::cluster::{Cluster, KickMsg};
use crate::route::{
    ConnCommand, ConnHandle, ConnInfo, ConnQueue, DeviceDetails, Kick, RouteError, Router, Tags,
    Target, Transport,
};
use crate::store::{InboxStore, SessionStore, StoreError};

/// One online device of a user, on this node or another.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceView {
    pub device_id: String,
    pub client_type: ClientType,
    pub node: String,
    /// The fields below are null only for a route written by an older node.
    pub os_name: Option<String>,
    pub os_version: Option<String>,
    pub client_version: Option<String>,
    pub profile: Option<String>,
    pub transport: Option<Transport>,
    pub connected_at_ms: Option<i64>,
    pub tags: Option<String>,
}

impl DeviceView {
    /// One shape wherever the device is: the route row carries the details.
    fn new(
        device_id: String,
        client_type: ClientType,
        node: String,
        d: Option<DeviceDetails>,
    ) -> Self {
        Self {
            device_id,
            client_type,
            node,
            os_name: d.as_ref().map(|d| d.os_name.clone()),
            os_version: d.as_ref().map(|d| d.os_version.clone()),
            client_version: d.as_ref().map(|d| d.client_version.clone()),
            profile: d.as_ref().map(|d| d.profile.clone()),
            transport: d.as_ref().map(|d| d.transport),
            connected_at_ms: d.as_ref().map(|d| d.connected_at_ms),
            tags: d.map(|d| d.tags),
        }
    }
}

/// A user, cluster-wide.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserView {
    pub user_id: String,
    pub online: bool,
    pub devices: Vec<DeviceView>,
    pub inbox: usize,
}

/// The sessions service: resumable sessions, bind and its auth, unbind,
/// kicks, and who is online.
pub struct Sessions {
    store: Arc<dyn SessionStore>,
    auth: Arc<BindAuth>,
    router: Arc<Router>,
    cluster: Option<Arc<Cluster>>,
    /// Read for a user's view (how many messages wait).
    inbox: Arc<dyn InboxStore>,
}

impl Sessions {
    pub fn new(
        store: Arc<dyn SessionStore>,
        auth: Arc<BindAuth>,
        router: Arc<Router>,
        cluster: Option<Arc<Cluster>>,
        inbox: Arc<dyn InboxStore>,
    ) -> Self {
        Self {
            store,
            auth,
            router,
            cluster,
            inbox,
        }
    }

    /// Stores a session so its client can resume.
    pub async fn store(&self, s: SessionRecord) {
        if let Err(e) = self.store.put(s).await {
            // The client falls back to a full handshake next time.
            tracing::warn!(error = %e, "session not stored");
        }
    }

    /// The session a client wants to resume (a store that is down reads as
    /// missing: the client falls back to a full handshake).
    pub async fn get(&self, session_id: &str) -> Option<SessionRecord> {
        self.store.get(session_id).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "session store unavailable: resume refused");
            None
        })
    }

    /// A v2 resume: the old ticket is single-use. False when it was already
    /// used (a concurrent replay): the connection must close.
    pub async fn rotate(&self, replaces: Option<String>, next: Option<SessionRecord>) -> bool {
        if let Some(old) = replaces
            && !matches!(self.store.remove(&old).await, Ok(true))
        {
            metrics::counter!("mpush_resume_replays_total").increment(1);
            return false;
        }
        if let Some(s) = next {
            self.store(s).await;
        }
        true
    }

    /// Authorises and registers a bind. The older connection of the same
    /// client type, here or on another node, is told who replaced it (mpush
    /// 7.4: it stays open; its client decides).
    pub async fn bind(
        &self,
        info: &Arc<ConnInfo>,
        tx: &Arc<ConnQueue>,
        user_id: &str,
        tags: String,
        token: &str,
        previous: Option<&Arc<str>>,
    ) -> Result<(Arc<str>, KeptBinding), TokenError> {
        let grant = self
            .auth
            .check(user_id, info.client_type, token)
            .inspect_err(|e| {
                metrics::counter!("mpush_bind_refused_total").increment(1);
                log_refused_bind(user_id, info, e);
            })?;
        let binding = KeptBinding {
            user_id: user_id.to_owned(),
            tags: grant.tags.unwrap_or(tags),
            expires_at_ms: grant.expires_at_ms,
        };
        let (user, _) = self.bind_as(info, tx, &binding, previous).await;
        Ok((user, binding))
    }

    /// ADR 0008: binds a resumed connection as its session kept it (the
    /// token was checked when it was kept; its expiry, by the machine). The
    /// user when the route is written everywhere; `None` (and nothing bound)
    /// otherwise: the client then binds itself and gets a true answer.
    pub async fn restore(
        &self,
        info: &Arc<ConnInfo>,
        tx: &Arc<ConnQueue>,
        binding: &KeptBinding,
    ) -> Option<Arc<str>> {
        let (user, everywhere) = self.bind_as(info, tx, binding, None).await;
        restored_counter(everywhere).increment(1);
        if everywhere {
            return Some(user);
        }
        self.router.unbind(&user, info.client_type, info.id).await;
        None
    }

    /// ADR 0008: keeps `binding` with a session (`None` clears it). Not
    /// kept: the client binds itself after its next fast connect. Not
    /// cleared (the store is down): the session cannot be resumed while it
    /// is down either; the failure is counted and logged.
    pub async fn keep_binding(&self, session_id: String, binding: Option<KeptBinding>) {
        let what = if binding.is_some() { "keep" } else { "clear" };
        if let Err(e) = self.store.set_binding(&session_id, binding).await {
            metrics::counter!("mpush_binding_store_errors_total", "op" => what).increment(1);
            tracing::warn!(error = %e, op = what, "kept binding not written");
        }
    }

    /// Registers `binding` on this connection: the route, and the older
    /// login of the same client type told who replaced it. True when the
    /// route is written everywhere (false: this node only).
    async fn bind_as(
        &self,
        info: &Arc<ConnInfo>,
        tx: &Arc<ConnQueue>,
        binding: &KeptBinding,
        previous: Option<&Arc<str>>,
    ) -> (Arc<str>, bool) {
        let user_id = binding.user_id.as_str();
        if let Some(prev) = previous.filter(|p| &***p != user_id) {
            self.router.unbind(prev, info.client_type, info.id).await;
        }
        *info.tags.write() = Tags::new(&binding.tags);
        let user: Arc<str> = user_id.into();
        let handle = ConnHandle {
            info: info.clone(),
            tx: tx.clone(),
        };
        let (replaced, remote) = self.router.bind(&user, handle).await;
        if let Some(old) = replaced {
            let _ = old.tx.try_send(ConnCommand::Kicked(Box::new(Kick {
                device_id: old.info.device_id.to_string(),
                user_id: user_id.to_owned(),
            })));
            metrics::counter!("mpush_kicks_total").increment(1);
        }
        match remote {
            Ok(Some(old)) => {
                if let Some(cl) = &self.cluster {
                    let kick = KickMsg {
                        user_id: user_id.to_owned(),
                        client_type: old.client_type.code(),
                        conn_id: old.conn_id,
                        close: false,
                    };
                    if let Err(e) = cl.publish_kick(&old.node, &kick).await {
                        tracing::warn!(error = %e, "kick of the older login not sent");
                    }
                }
                (user, true)
            }
            Ok(None) => (user, true),
            Err(e) => {
                tracing::warn!(error = %e, "bound locally only");
                (user, false)
            }
        }
    }

    pub async fn unbind(&self, user: &str, info: &ConnInfo) -> bool {
        self.router.unbind(user, info.client_type, info.id).await
    }

    /// Kicks `user`'s connections (of `client_type`, when given) on every
    /// node: KICK, then close. Returns how many were told.
    pub async fn kick_user(
        &self,
        user: &str,
        client_type: Option<ClientType>,
    ) -> Result<usize, RouteError> {
        let targets = self.router.resolve(user, client_type).await?;
        let mut n = 0;
        for t in targets {
            match t {
                Target::Local(h) => {
                    if h.tx.try_send(ConnCommand::KickAndClose).is_ok() {
                        n += 1;
                    }
                }
                Target::Remote(r) => {
                    let Some(cl) = &self.cluster else { continue };
                    let kick = KickMsg {
                        user_id: user.to_owned(),
                        client_type: r.client_type.code(),
                        conn_id: r.conn_id,
                        close: true,
                    };
                    if cl.publish_kick(&r.node, &kick).await.is_ok() {
                        n += 1;
                    }
                }
            }
        }
        Ok(n)
    }

    /// A kick another node published for one of this node's connections.
    pub(super) fn kick_here(&self, k: &KickMsg) {
        for h in self.router.local().lookup(&k.user_id) {
            // 0 on the wire: any client type.
            if (k.conn_id != 0 && h.info.id != k.conn_id)
                || (k.client_type != 0 && h.info.client_type.code() != k.client_type)
            {
                continue;
            }
            // Out of this node's table now, not when the connection gets to
            // the command: a push meanwhile would still reach the kicked
            // device, and a route refresh would write its row back over the
            // newer login's row once that one is gone.
            self.router.local().unbind(&k.user_id, h.info.id);
            let cmd = if k.close {
                ConnCommand::KickAndClose
            } else {
                // mpush's KICK names the kicked connection's own device.
                ConnCommand::Kicked(Box::new(Kick {
                    device_id: h.info.device_id.to_string(),
                    user_id: k.user_id.clone(),
                }))
            };
            let _ = h.tx.try_send(cmd);
            metrics::counter!("mpush_kicks_total").increment(1);
        }
    }

    /// A user's devices on every node, and their inbox.
    pub async fn user(&self, user: &str) -> Result<UserView, StoreError> {
        let targets = self
            .router
            .resolve(user, None)
            .await
            .map_err(|e| StoreError::new("routes", e))?;
        let devices: Vec<DeviceView> = targets
            .into_iter()
            .map(|t| match t {
                Target::Local(h) => DeviceView::new(
                    h.info.device_id.to_string(),
                    h.info.client_type,
                    self.router.node_id().to_owned(),
                    Some(DeviceDetails::of(&h.info)),
                ),
                Target::Remote(r) => DeviceView::new(r.device_id, r.client_type, r.node, r.device),
            })
            .collect();
        let inbox = self.inbox.len(user).await?;
        Ok(UserView {
            user_id: user.to_owned(),
            online: !devices.is_empty(),
            devices,
            inbox,
        })
    }
}

/// Logs a refused bind with its reason at the default level, at most one
/// line a second (a client retrying a bad token in a loop must not flood
/// the log); the line says how many were left out since the last one.
fn log_refused_bind(user_id: &str, info: &ConnInfo, e: &TokenError) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_SEC: AtomicU64 = AtomicU64::new(0);
    static LEFT_OUT: AtomicU64 = AtomicU64::new(0);
    let now = u64::try_from(crate::clock::unix_ms() / 1000).unwrap_or(0);
    let last = LAST_SEC.load(Ordering::Relaxed);
    if now == last
        || LAST_SEC
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        LEFT_OUT.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let left_out = LEFT_OUT.swap(0, Ordering::Relaxed);
    tracing::warn!(
        user = user_id,
        device = %info.device_id,
        client_type = ?info.client_type,
        reason = %e,
        left_out,
        "bind refused (mpush_bind_refused_total; at most one such line a second, left_out counts the others)"
    );
}

/// `mpush_bindings_restored_total` by outcome, looked up once: a lookup by
/// name and label costs a hash and a lock on every fast connect.
fn restored_counter(everywhere: bool) -> &'static metrics::Counter {
    static BOUND: std::sync::OnceLock<metrics::Counter> = std::sync::OnceLock::new();
    static FAILED: std::sync::OnceLock<metrics::Counter> = std::sync::OnceLock::new();
    let (cell, outcome) = if everywhere {
        (&BOUND, "bound")
    } else {
        (&FAILED, "failed")
    };
    cell.get_or_init(|| metrics::counter!("mpush_bindings_restored_total", "outcome" => outcome))
}
