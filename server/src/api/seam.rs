//! The seam between the HTTP API and the logic layer: the one send use case
//! and the read-only queries the routes make, and the API's own slice of
//! the settings. The handlers see only these, so they run over a fake
//! service in `api/tests.rs` (no socket, no store), and over the logic
//! layer's `Hub` in the server.

use mpush_protocol::session::ClientType;
use std::sync::Arc;

use async_trait::async_trait;

use crate::cluster::NodeInfo;
use crate::config::Validated;
use crate::logic::callback::CallbackTarget;
use crate::logic::send::{SendAnswer, SendError, SendRequest};
use crate::logic::{Hub, Listeners, NotReady, UserView};
use crate::route::RouteError;
use crate::store::{StoreError, TopicFull, TraceView};

/// What the API asks of the logic layer.
#[async_trait]
pub trait Service: Send + Sync + 'static {
    /// Every push (single, batch, broadcast, topic, `/exec`, alloc's).
    async fn send(&self, req: SendRequest) -> Result<SendAnswer, SendError>;
    /// A callback target some sink or allowed URL can take.
    fn can_reach(&self, target: &CallbackTarget) -> bool;
    async fn trace(&self, trace_id: &str) -> Result<Option<TraceView>, StoreError>;
    async fn user(&self, user: &str) -> Result<UserView, StoreError>;
    /// Kicks a user's connections (of one client type); how many were told.
    async fn kick(&self, user: &str, client_type: Option<ClientType>) -> Result<usize, RouteError>;
    /// True when the subscription is new.
    async fn subscribe(&self, topic: &str, user: &str) -> Result<bool, TopicFull>;
    /// True when there was one.
    async fn unsubscribe(&self, topic: &str, user: &str) -> Result<bool, StoreError>;
    fn health(&self) -> Health;
    async fn ready(&self) -> Result<(), NotReady>;
    /// The cluster's live nodes, least loaded first (`None`: no cluster).
    async fn live_nodes(&self) -> Option<Vec<NodeInfo>>;
    /// Where this node's gateways listen.
    fn listeners(&self) -> Listeners;
    /// Brings the gauges up to date before a scrape.
    fn update_gauges(&self);
}

/// `/healthz`'s figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    pub draining: bool,
    pub connections: usize,
    pub bound: usize,
}

/// What the API reads of the configuration, taken once when it is built.
#[derive(Debug, Clone, Default)]
pub struct ApiSettings {
    /// Bearer tokens; none: loopback clients only.
    pub api_tokens: Vec<String>,
    pub allowed_hosts: Vec<String>,
    pub cors_origins: Vec<String>,
    /// The demo page's folder (`net.demo_dir`).
    pub demo_dir: String,
    /// The longest `ttlSeconds` a push may ask for.
    pub max_ttl_secs: u64,
    /// The largest content a client can take in one packet.
    pub max_content: usize,
    /// What alloc hands out.
    pub public_address: String,
    pub public_ws_url: String,
    pub tls_tcp: bool,
    pub tls_ws: bool,
}

impl ApiSettings {
    pub fn new(cfg: &Validated) -> Self {
        let s = &cfg.settings;
        Self {
            api_tokens: s.security.api_tokens.clone(),
            allowed_hosts: s.security.allowed_hosts.clone(),
            cors_origins: s.security.cors_origins.clone(),
            demo_dir: s.net.demo_dir.clone(),
            max_ttl_secs: s.delivery.max_ttl_secs,
            // Room for the envelope, padding and the AEAD tag inside one packet.
            max_content: s.limits.max_packet_size.saturating_sub(256),
            public_address: s.net.public_address.clone(),
            public_ws_url: s.net.public_ws_url.clone(),
            tls_tcp: s.tls.on("tcp"),
            tls_ws: s.tls.on("ws"),
        }
    }
}

/// The logic layer as the API's service.
pub struct HubService(pub Arc<Hub>);

#[async_trait]
impl Service for HubService {
    async fn send(&self, req: SendRequest) -> Result<SendAnswer, SendError> {
        self.0.delivery().send(req).await
    }

    fn can_reach(&self, target: &CallbackTarget) -> bool {
        self.0.delivery().tracer().callbacks().can_reach(target)
    }

    async fn trace(&self, trace_id: &str) -> Result<Option<TraceView>, StoreError> {
        self.0.delivery().tracer().get(trace_id).await
    }

    async fn user(&self, user: &str) -> Result<UserView, StoreError> {
        self.0.sessions().user(user).await
    }

    async fn kick(&self, user: &str, client_type: Option<ClientType>) -> Result<usize, RouteError> {
        self.0.sessions().kick_user(user, client_type).await
    }

    async fn subscribe(&self, topic: &str, user: &str) -> Result<bool, TopicFull> {
        self.0.delivery().topics().subscribe(topic, user).await
    }

    async fn unsubscribe(&self, topic: &str, user: &str) -> Result<bool, StoreError> {
        self.0.delivery().topics().unsubscribe(topic, user).await
    }

    fn health(&self) -> Health {
        let node = self.0.node();
        Health {
            draining: node.is_draining(),
            connections: node.connections(),
            bound: self.0.bound(),
        }
    }

    async fn ready(&self) -> Result<(), NotReady> {
        self.0.node().ready().await
    }

    async fn live_nodes(&self) -> Option<Vec<NodeInfo>> {
        match self.0.cluster() {
            Some(cl) => Some(cl.live_nodes().await),
            None => None,
        }
    }

    fn listeners(&self) -> Listeners {
        self.0.node().listeners()
    }

    fn update_gauges(&self) {
        self.0.update_gauges();
    }
}
