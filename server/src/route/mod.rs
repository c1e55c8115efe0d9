//! The route layer: where a user is connected. `Connections` holds this
//! node's connections (their command queues); a `RouteStore` is the table
//! every node reads (this node's connections in the embedded default, the
//! Redis route table in cluster mode). `Router::resolve` is the one question
//! the logic layer asks: for each of a user's devices, a local connection, a
//! remote node, or nothing (offline).
//!
//! This layer knows nothing of messages or traces: it imports `store`-level
//! plumbing only (`redis_conn`), never `logic`, `gateway` or `cluster`.

pub mod local;
pub mod queue;
pub mod table;
pub mod tags;

use mpush_protocol::session::ClientType;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use mpush_protocol::server::OutboundPush;
use mpush_protocol::session::{DeviceInfo, Profile};
use parking_lot::RwLock;

pub use local::{Connections, Handles};
pub use queue::{ConnQueue, Fired, SendError};
pub use table::RedisRoutes;
pub use tags::Tags;

/// What other tasks can ask of a connection.
#[derive(Debug)]
pub enum ConnCommand {
    /// Shared: a broadcast's one push goes to every connection without a
    /// copy (or an allocation) per recipient.
    Push(Arc<OutboundPush>),
    /// Another device took this connection's place: send KICK (mpush keeps
    /// the connection open; its client decides).
    Kicked(Box<Kick>),
    /// The API kicked the user: send KICK and close.
    KickAndClose,
    /// The node drains: redirect, wait for the ACKs in flight, close. Never
    /// queued (a full queue cannot refuse it): `ConnQueue::drain` flags it.
    Drain,
    /// The connection's timer came (its protocol machine's deadline or the
    /// drain's). Never queued: `ConnQueue::fire` flags it.
    Tick,
}

/// Who replaced a connection.
#[derive(Debug)]
pub struct Kick {
    pub device_id: String,
    pub user_id: String,
}

/// Which gateway a connection came through (with or without TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// The TCP gateway (mpush's binary packets).
    Tcp,
    /// The WebSocket gateway (binary packets, or mpush's JSON text frames).
    Ws,
}

impl Transport {
    /// Its name in settings (`tls.listeners`), events and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Ws => "ws",
        }
    }
}

/// Facts about a live connection (one per connection: kept compact).
#[derive(Debug)]
pub struct ConnInfo {
    pub id: u64,
    /// Shared with every trace event of this connection.
    pub device_id: Arc<str>,
    /// OS name, OS version and client version, joined by `\0`.
    about: Box<str>,
    pub client_type: ClientType,
    pub profile: Profile,
    pub transport: Transport,
    pub connected_at_ms: i64,
    /// Shared, not copied, by each broadcast's filter.
    pub tags: RwLock<Tags>,
}

impl ConnInfo {
    pub fn new(
        id: u64,
        device: &DeviceInfo,
        profile: Profile,
        transport: Transport,
        connected_at_ms: i64,
    ) -> Self {
        let about = [
            device.os_name.as_str(),
            &device.os_version,
            &device.client_version,
        ]
        .join("\0")
        .into_boxed_str();
        Self {
            id,
            device_id: device.device_id.as_str().into(),
            about,
            client_type: device.client_type(),
            profile,
            transport,
            connected_at_ms,
            tags: RwLock::new(Tags::default()),
        }
    }

    fn about(&self, i: usize) -> &str {
        self.about.split('\0').nth(i).unwrap_or("")
    }

    pub fn os_name(&self) -> &str {
        self.about(0)
    }

    pub fn os_version(&self) -> &str {
        self.about(1)
    }

    pub fn client_version(&self) -> &str {
        self.about(2)
    }
}

/// A way to reach a connection's task.
#[derive(Debug, Clone)]
pub struct ConnHandle {
    pub info: Arc<ConnInfo>,
    pub tx: Arc<ConnQueue>,
}

/// One row of the route table: where (user, client type) is connected.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    #[serde(skip)]
    pub client_type: ClientType,
    pub node: String,
    #[serde(with = "crate::json_u64")]
    pub conn_id: u64,
    #[serde(default)]
    pub device_id: String,
    /// What the user view shows of the device, whatever node it is on
    /// (absent in rows written by an older node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceDetails>,
}

/// A bound device as `GET /api/v1/users/{id}` shows it (the route row
/// carries it, so a device on another node looks the same).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceDetails {
    pub os_name: String,
    pub os_version: String,
    pub client_version: String,
    pub profile: String,
    pub transport: Transport,
    pub connected_at_ms: i64,
    pub tags: String,
}

impl DeviceDetails {
    pub fn of(i: &ConnInfo) -> Self {
        Self {
            os_name: i.os_name().to_owned(),
            os_version: i.os_version().to_owned(),
            client_version: i.client_version().to_owned(),
            profile: format!("{:?}", i.profile).to_lowercase(),
            transport: i.transport,
            connected_at_ms: i.connected_at_ms,
            tags: i.tags.read().as_str().to_owned(),
        }
    }
}

/// The route table could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("route table unavailable: {0}")]
pub struct RouteError(pub String);

/// The table of routes every node reads.
#[async_trait]
pub trait RouteStore: Send + Sync + 'static {
    /// Writes `route` for `user`; returns the route of the same client type
    /// it replaced, if any.
    async fn bind(&self, user: &str, route: Route) -> Result<Option<Route>, RouteError>;
    /// Removes `user`'s route of `client_type` if it still names `node`'s
    /// connection `conn_id` (a newer bind may have replaced it).
    async fn unbind(&self, user: &str, client_type: ClientType, node: &str, conn_id: u64);
    async fn lookup(&self, user: &str) -> Result<Vec<Route>, RouteError>;
    /// Many users at once, for delivery: one round trip per batch, not one
    /// per user; the routes may leave out the device's details (`device`).
    async fn lookup_many(&self, users: &[Arc<str>]) -> Result<Vec<Vec<Route>>, RouteError>;
    /// Keeps this node's routes alive (their TTL): writes each one back if
    /// its row is gone or still names its connection, never over a row of
    /// another connection.
    async fn refresh(&self, routes: Vec<(Arc<str>, Route)>) -> Renewed;
}

/// What a route refresh did.
#[derive(Debug, Default)]
pub struct Renewed {
    /// The routes written back.
    pub written: Vec<(Arc<str>, Route)>,
    /// Routes that could not be written (the table is down).
    pub failed: usize,
}

/// Where one copy of a message goes.
#[derive(Debug, Clone)]
pub enum Target {
    Local(ConnHandle),
    Remote(Route),
}

/// The route layer's front: this node's connections and the shared table.
pub struct Router {
    node_id: String,
    local: Arc<Connections>,
    /// `None` in the embedded default: `local` is the whole table.
    table: Option<Arc<dyn RouteStore>>,
    /// Set by `withdraw` (a drain): from then on this node writes no route
    /// into the table, and a write that raced the withdraw is taken back.
    withdrawn: AtomicBool,
}

impl Router {
    pub fn new(node_id: String, table: Option<Arc<dyn RouteStore>>) -> Self {
        Self {
            node_id,
            local: Arc::new(Connections::default()),
            table,
            withdrawn: AtomicBool::new(false),
        }
    }

    /// Whether this node's routes were withdrawn (it drains).
    fn is_withdrawn(&self) -> bool {
        self.withdrawn.load(Ordering::SeqCst)
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn local(&self) -> &Connections {
        &self.local
    }

    /// The local connections, for work on another thread (a broadcast's
    /// condition on the blocking pool).
    pub fn local_arc(&self) -> Arc<Connections> {
        self.local.clone()
    }

    /// Registers a bound connection here and in the table. Returns the local
    /// connection it replaced and the route it replaced on another node.
    pub async fn bind(
        &self,
        user: &Arc<str>,
        handle: ConnHandle,
    ) -> (Option<ConnHandle>, Result<Option<Route>, RouteError>) {
        let route = Route {
            client_type: handle.info.client_type,
            node: self.node_id.clone(),
            conn_id: handle.info.id,
            device_id: handle.info.device_id.to_string(),
            device: self
                .table
                .is_some()
                .then(|| DeviceDetails::of(&handle.info)),
        };
        let replaced = self.local.bind(user, handle);
        let remote = match &self.table {
            // A draining node sends no one here: the device is bound for
            // the drain's redirect only, and a push to it meanwhile goes
            // to its inbox as for the routes the drain withdrew.
            Some(_) if self.is_withdrawn() => Ok(None),
            Some(t) => {
                let (client_type, conn_id) = (route.client_type, route.conn_id);
                let old = t.bind(user, route).await;
                if self.is_withdrawn() {
                    // The drain began while this row was being written:
                    // its withdraw may have come before the row.
                    t.unbind(user, client_type, &self.node_id, conn_id).await;
                }
                old.map(|old| old.filter(|o| o.node != self.node_id))
            }
            None => Ok(None),
        };
        (replaced, remote)
    }

    /// Removes a connection's route, here and in the table.
    pub async fn unbind(&self, user: &str, client_type: ClientType, conn_id: u64) -> bool {
        let removed = self.local.unbind(user, conn_id);
        if let Some(t) = &self.table {
            t.unbind(user, client_type, &self.node_id, conn_id).await;
        }
        removed
    }

    /// Every device of `user` (of `client_type`, when given).
    pub async fn resolve(
        &self,
        user: &str,
        client_type: Option<ClientType>,
    ) -> Result<Vec<Target>, RouteError> {
        // The table first, this node's connections after it: a connection
        // bound here meanwhile is then in both (a bind enters it here
        // before the table), so its fresh row is not taken for a stale one
        // and removed from the table, which would hide the device from the
        // other nodes until the next route refresh.
        let remote = match &self.table {
            Some(t) => t.lookup(user).await.map(Some),
            None => Ok(None),
        };
        let local = self.local.lookup(user);
        self.merge(user, client_type, local, remote).await
    }

    /// `resolve` for many users: the table is read in one round trip per batch.
    pub async fn resolve_many(
        &self,
        users: &[Arc<str>],
        client_type: Option<ClientType>,
    ) -> Vec<Result<Vec<Target>, RouteError>> {
        let remote: Vec<Result<Option<Vec<Route>>, RouteError>> = match &self.table {
            Some(t) => match t.lookup_many(users).await {
                Ok(all) => all.into_iter().map(|r| Ok(Some(r))).collect(),
                Err(e) => users.iter().map(|_| Err(e.clone())).collect(),
            },
            None => users.iter().map(|_| Ok(None)).collect(),
        };
        let mut out = Vec::with_capacity(users.len());
        for (user, remote) in users.iter().zip(remote) {
            // After the table, as in `resolve`.
            let local = self.local.lookup(user);
            out.push(self.merge(user, client_type, local, remote).await);
        }
        out
    }

    /// Local connections first; table routes for client types with no local
    /// connection. A route naming this node without a connection is stale and
    /// removed. A table that cannot be read is an error only when nothing local
    /// was found.
    async fn merge(
        &self,
        user: &str,
        client_type: Option<ClientType>,
        local: Handles,
        remote: Result<Option<Vec<Route>>, RouteError>,
    ) -> Result<Vec<Target>, RouteError> {
        let mut out: Vec<Target> = local
            .into_iter()
            .filter(|h| client_type.is_none_or(|ct| ct == h.info.client_type))
            .map(Target::Local)
            .collect();
        let routes = match remote {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(out),
            Err(e) if out.is_empty() => return Err(e),
            Err(_) => return Ok(out),
        };
        for r in routes {
            if client_type.is_some_and(|ct| ct != r.client_type)
                || out.iter().any(|t| match t {
                    Target::Local(h) => h.info.client_type == r.client_type,
                    Target::Remote(_) => false,
                })
            {
                continue;
            }
            if r.node == self.node_id {
                if let Some(t) = &self.table {
                    t.unbind(user, r.client_type, &r.node, r.conn_id).await;
                }
                continue;
            }
            out.push(Target::Remote(r));
        }
        Ok(out)
    }

    /// Removes a route found stale (its node is gone).
    pub async fn forget(&self, user: &str, route: &Route) {
        if let Some(t) = &self.table {
            t.unbind(user, route.client_type, &route.node, route.conn_id)
                .await;
        }
    }

    /// Removes every route of this node from the table (the start of a drain):
    /// other nodes stop sending here; the connections stay until they close.
    /// From then on, no bind or route refresh of this node writes a route
    /// (one that was under way is taken back when it ends).
    pub async fn withdraw(&self) {
        self.withdrawn.store(true, Ordering::SeqCst);
        if let Some(t) = &self.table {
            for (user, h) in self.local.snapshot() {
                t.unbind(&user, h.info.client_type, &self.node_id, h.info.id)
                    .await;
            }
        }
    }

    /// Renews the TTL of this node's routes in the table; how many could
    /// not be written.
    pub async fn refresh(&self) -> usize {
        self.refresh_from(self.local.snapshot()).await
    }

    /// `refresh` of a snapshot of this node's connections. A connection of
    /// the snapshot may have closed before its route was written back (a
    /// refresh of many routes takes a while): a route written back for a
    /// connection no longer bound here is removed again, so that it does not
    /// send pushes here until its TTL.
    ///
    /// A drained node refreshes nothing, and a refresh under way when the
    /// drain withdrew the routes removes every route it wrote back.
    pub async fn refresh_from(&self, snapshot: Vec<(Arc<str>, ConnHandle)>) -> usize {
        let Some(t) = &self.table else {
            return 0;
        };
        if self.is_withdrawn() {
            return 0;
        }
        let routes = snapshot
            .into_iter()
            .map(|(user, h)| {
                let route = Route {
                    client_type: h.info.client_type,
                    node: self.node_id.clone(),
                    conn_id: h.info.id,
                    device_id: h.info.device_id.to_string(),
                    device: Some(DeviceDetails::of(&h.info)),
                };
                (user, route)
            })
            .collect();
        let renewed = t.refresh(routes).await;
        let withdrawn = self.is_withdrawn();
        for (user, route) in renewed.written {
            if withdrawn || !self.local.holds(&user, route.conn_id) {
                t.unbind(&user, route.client_type, &route.node, route.conn_id)
                    .await;
            }
        }
        renewed.failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use tokio::sync::Notify;

    /// A route table in memory whose reads wait at a gate, so that a test
    /// can bind a connection while a push is between the table and this
    /// node's connections.
    #[derive(Default)]
    struct GatedTable {
        rows: parking_lot::Mutex<HashMap<(String, ClientType), Route>>,
        reading: Notify,
        gate: Notify,
    }

    #[async_trait]
    impl RouteStore for GatedTable {
        async fn bind(&self, user: &str, route: Route) -> Result<Option<Route>, RouteError> {
            Ok(self
                .rows
                .lock()
                .insert((user.to_owned(), route.client_type), route))
        }
        async fn unbind(&self, user: &str, ct: ClientType, node: &str, conn_id: u64) {
            let mut rows = self.rows.lock();
            let key = (user.to_owned(), ct);
            if rows
                .get(&key)
                .is_some_and(|r| r.node == node && r.conn_id == conn_id)
            {
                rows.remove(&key);
            }
        }
        async fn lookup(&self, user: &str) -> Result<Vec<Route>, RouteError> {
            self.reading.notify_one();
            self.gate.notified().await;
            let rows = self.rows.lock().clone();
            Ok(rows
                .into_iter()
                .filter(|((u, _), _)| u == user)
                .map(|(_, r)| r)
                .collect())
        }
        async fn lookup_many(&self, users: &[Arc<str>]) -> Result<Vec<Vec<Route>>, RouteError> {
            let mut out = Vec::new();
            for u in users {
                out.push(self.lookup(u).await?);
            }
            Ok(out)
        }
        /// Waits at the gate too, then writes every route back (as the
        /// real tables do where the row is gone).
        async fn refresh(&self, routes: Vec<(Arc<str>, Route)>) -> Renewed {
            self.reading.notify_one();
            self.gate.notified().await;
            let mut rows = self.rows.lock();
            for (user, route) in &routes {
                rows.insert((user.to_string(), route.client_type), route.clone());
            }
            Renewed {
                written: routes,
                failed: 0,
            }
        }
    }

    fn handle(id: u64) -> ConnHandle {
        let device = DeviceInfo {
            device_id: format!("device-{id}"),
            os_name: "android".into(),
            os_version: "14".into(),
            client_version: "1.0".into(),
        };
        ConnHandle {
            info: Arc::new(ConnInfo::new(id, &device, Profile::V2, Transport::Tcp, 0)),
            tx: Arc::new(ConnQueue::new(8)),
        }
    }

    /// A push that reads the table while the user's device binds on this
    /// node finds the table's row for the new connection; the row must stay.
    #[tokio::test]
    async fn a_push_racing_a_bind_here_keeps_the_new_route() {
        for many in [false, true] {
            let table = Arc::new(GatedTable::default());
            let router = Arc::new(Router::new("a".into(), Some(table.clone())));
            let user: Arc<str> = "u".into();
            let resolving = tokio::spawn({
                let (router, user) = (router.clone(), user.clone());
                async move {
                    if many {
                        router.resolve_many(&[user], None).await.remove(0)
                    } else {
                        router.resolve(&user, None).await
                    }
                }
            });
            // The push is reading the table: it waits at the gate.
            table.reading.notified().await;
            let (replaced, remote) = router.bind(&user, handle(7)).await;
            assert!(replaced.is_none() && matches!(remote, Ok(None)));
            table.gate.notify_one();
            let targets = resolving.await.expect("joins").expect("resolves");
            assert_eq!(targets.len(), 1, "the device bound meanwhile is reached");
            let rows = table.rows.lock().clone();
            assert_eq!(
                rows.get(&("u".to_owned(), ClientType::Mobile))
                    .map(|r| r.conn_id),
                Some(7),
                "the new route stays in the table (many: {many})"
            );
        }
    }

    /// A drain withdraws this node's routes while a route refresh is
    /// writing them back: nothing of this node stays in the table, and
    /// neither a later refresh nor a later bind writes a row.
    #[tokio::test]
    async fn a_refresh_racing_a_drain_leaves_no_route_of_the_draining_node() {
        let table = Arc::new(GatedTable::default());
        let router = Arc::new(Router::new("a".into(), Some(table.clone())));
        let (u1, u2): (Arc<str>, Arc<str>) = ("u1".into(), "u2".into());
        router.bind(&u1, handle(1)).await.1.expect("binds");
        router.bind(&u2, handle(2)).await.1.expect("binds");
        assert_eq!(table.rows.lock().len(), 2);
        let refreshing = tokio::spawn({
            let router = router.clone();
            async move { router.refresh().await }
        });
        // The refresh took its snapshot and is writing: the drain starts.
        table.reading.notified().await;
        router.withdraw().await;
        assert!(table.rows.lock().is_empty(), "the withdraw removed them");
        table.gate.notify_one();
        assert_eq!(refreshing.await.expect("joins"), 0);
        assert!(
            table.rows.lock().is_empty(),
            "the refresh took back what it wrote after the withdraw"
        );
        // Later ones write nothing (the refresh would wait at the gate if
        // it went to the table; it must not).
        assert_eq!(router.refresh().await, 0);
        let (replaced, remote) = router.bind(&"u3".into(), handle(3)).await;
        assert!(replaced.is_none() && matches!(remote, Ok(None)));
        assert!(
            table.rows.lock().is_empty(),
            "a draining node binds locally only"
        );
        assert_eq!(router.local().len(), 3, "the connections stay bound here");
    }
}
