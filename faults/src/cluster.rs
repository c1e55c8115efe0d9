//! The processes of a run: a redis-server (or a Sentinel group) and the
//! mpush-server nodes, each on its host, started, killed, drained and
//! restarted as real processes.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::process::Child;

use crate::net::Host;

pub const API_TOKEN: &str = "fault-suite-api-token-0123456789";
const NODE_SECRET: &str = "fault-suite-node-secret-0123456789abcdef";
pub const TCP_PORT: u16 = 3000;
pub const HTTP_PORT: u16 = 9999;
pub const NODE_PORT: u16 = 3001;
const REDIS_PORT: u16 = 6379;
const REPLICA_PORT: u16 = 6380;
const SENTINEL_PORT: u16 = 26379;
const SENTINEL_MASTER: &str = "mymaster";

/// The Redis of a run: one redis-server, or a Sentinel group (a primary, a
/// replica and one sentinel, all on the Redis host) that the nodes reach
/// through the sentinel.
pub struct Redis {
    host: Host,
    dir: PathBuf,
    sentinel: bool,
    /// The servers by port (6379, and 6380 with Sentinel).
    servers: Vec<(u16, Option<Child>)>,
    sentinel_child: Option<Child>,
    /// The port the primary was on when it was killed.
    killed: Option<u16>,
}

impl Redis {
    pub async fn start(host: &Host, sentinel: bool) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("mpush-faults-redis-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut r = Self {
            host: host.clone(),
            dir,
            sentinel,
            servers: Vec::new(),
            sentinel_child: None,
            killed: None,
        };
        r.spawn(REDIS_PORT, None).await?;
        if sentinel {
            r.spawn(REPLICA_PORT, Some(REDIS_PORT)).await?;
            r.wait_synced(REDIS_PORT).await?;
            r.spawn_sentinel().await?;
        }
        Ok(r)
    }

    pub fn url(&self) -> String {
        if self.sentinel {
            format!(
                "redis+sentinel://{}:{SENTINEL_PORT}/{SENTINEL_MASTER}",
                self.host.ip
            )
        } else {
            format!("redis://{}:{REDIS_PORT}/0", self.host.ip)
        }
    }

    async fn spawn(&mut self, port: u16, replica_of: Option<u16>) -> Result<()> {
        let data = self.dir.join(port.to_string());
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data)?;
        let mut cmd = self.host.command("redis-server");
        cmd.args([
            "--bind",
            &self.host.ip.to_string(),
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ])
        .arg("--dir")
        .arg(&data);
        if let Some(p) = replica_of {
            cmd.args(["--replicaof", &self.host.ip.to_string(), &p.to_string()]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting redis-server (apt install redis-server)")?;
        self.servers.retain(|(p, _)| *p != port);
        self.servers.push((port, Some(child)));
        wait_port(self.host.ip, port, Duration::from_secs(10)).await
    }

    async fn spawn_sentinel(&mut self) -> Result<()> {
        let ip = self.host.ip;
        let conf = self.dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {SENTINEL_PORT}\nbind {ip}\nprotected-mode no\ndir {}\n\
                 sentinel monitor {SENTINEL_MASTER} {ip} {REDIS_PORT} 1\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                 sentinel failover-timeout {SENTINEL_MASTER} 3000\n",
                self.dir.display()
            ),
        )?;
        let child = self
            .host
            .command("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting redis-server --sentinel")?;
        self.sentinel_child = Some(child);
        wait_port(ip, SENTINEL_PORT, Duration::from_secs(10)).await
    }

    /// Until the primary on `port` has its replica online.
    async fn wait_synced(&self, port: u16) -> Result<()> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if self
                .cli(port, &["INFO", "replication"])
                .await
                .contains("state=online")
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the replica never synced")
    }

    /// `redis-cli` on this host (its output, empty on failure).
    async fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = self
            .host
            .command("redis-cli")
            .args(["-h", &self.host.ip.to_string(), "-p", &port.to_string()])
            .args(args)
            .output()
            .await;
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The port of the current primary (as the sentinel says, with Sentinel).
    pub async fn primary(&self) -> u16 {
        if !self.sentinel {
            return REDIS_PORT;
        }
        let out = self
            .cli(
                SENTINEL_PORT,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER],
            )
            .await;
        out.lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(REDIS_PORT)
    }

    /// SIGKILL of the primary: everything it held that was not replicated is gone.
    pub async fn kill(&mut self) {
        let port = self.primary().await;
        if let Some((_, c)) = self.servers.iter_mut().find(|(p, _)| *p == port)
            && let Some(mut c) = c.take()
        {
            let _ = c.kill().await;
        }
        self.killed = Some(port);
    }

    /// Single: a fresh, empty redis-server on the same address. Sentinel:
    /// the killed primary back, empty, as a replica of the one the sentinel
    /// promoted (after waiting for the promotion).
    pub async fn restart(&mut self) -> Result<()> {
        let port = self.killed.take().unwrap_or(REDIS_PORT);
        if !self.sentinel {
            return self.spawn(port, None).await;
        }
        let start = Instant::now();
        let mut primary = self.primary().await;
        while primary == port && start.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            primary = self.primary().await;
        }
        anyhow::ensure!(primary != port, "the sentinel never promoted the replica");
        self.spawn(port, Some(primary)).await
    }

    /// Everything down (the end of a run).
    pub async fn stop(&mut self) {
        for (_, c) in &mut self.servers {
            if let Some(mut c) = c.take() {
                let _ = c.kill().await;
            }
        }
        if let Some(mut c) = self.sentinel_child.take() {
            let _ = c.kill().await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One mpush-server node.
pub struct Node {
    pub id: String,
    pub host: Host,
    bin: PathBuf,
    redis: String,
    webhook: String,
    child: Option<Child>,
    /// Where its log goes (shown when a fault goes wrong).
    pub log: PathBuf,
}

impl Node {
    pub async fn start(
        id: &str,
        host: &Host,
        bin: &std::path::Path,
        redis: &str,
        webhook: &str,
    ) -> Result<Self> {
        let mut n = Self {
            id: id.to_owned(),
            host: host.clone(),
            bin: bin.to_path_buf(),
            redis: redis.to_owned(),
            webhook: webhook.to_owned(),
            child: None,
            log: std::env::temp_dir().join(format!("mpush-faults-{}-{id}.log", std::process::id())),
        };
        n.spawn().await?;
        Ok(n)
    }

    pub fn tcp(&self) -> String {
        format!("{}:{TCP_PORT}", self.host.ip)
    }

    pub fn api(&self) -> String {
        format!("http://{}:{HTTP_PORT}", self.host.ip)
    }

    pub fn node_port(&self) -> std::net::SocketAddr {
        (self.host.ip, NODE_PORT).into()
    }

    async fn spawn(&mut self) -> Result<()> {
        let ip = self.host.ip;
        let mut cmd = self.host.command(&self.bin.display().to_string());
        cmd.args(["--tcp", &format!("{ip}:{TCP_PORT}"), "--http", &format!("{ip}:{HTTP_PORT}"), "--ws", ""])
            .env("RUST_LOG", "warn")
            .env("MPUSH__NET__DEMO_DIR", "")
            .env("MPUSH__CLUSTER__REDIS", &self.redis)
            .env("MPUSH__CLUSTER__NODE_ID", &self.id)
            .env("MPUSH__CLUSTER__INTERNAL", format!("{ip}:{NODE_PORT}"))
            .env("MPUSH__CLUSTER__SECRET", NODE_SECRET)
            .env("MPUSH__CLUSTER__TIMEOUT_MS", "1000")
            .env("MPUSH__CLUSTER__NODE_RENEW_SECS", "2")
            .env("MPUSH__CLUSTER__NODE_TTL_SECS", "6")
            .env("MPUSH__SECURITY__API_TOKENS", format!("[\"{API_TOKEN}\"]"))
            .env("MPUSH__SECURITY__ALLOW_PUBLISHED_KEY", "true")
            .env("MPUSH__SECURITY__ANONYMOUS_BIND", "true")
            .env("MPUSH__DELIVERY__ACK_WAITS_MS", "[800,1500,2500]")
            .env("MPUSH__SHUTDOWN__DRAIN_TIMEOUT_MS", "3000")
            .env("MPUSH__SHUTDOWN__REDIRECT_JITTER_MS", "1000")
            .env(
                "MPUSH__SINKS__WEBHOOKS",
                format!(
                    "[{{url=\"{}\",secret=\"fault-suite-webhook-secret\",events=[\"up_push\"],max_backoff_ms=500}}]",
                    self.webhook
                ),
            )
            .env("MPUSH__SINKS__ACCEPT_TIMEOUT_MS", "1500")
            .stdout(Stdio::null())
            .kill_on_drop(true);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        cmd.stderr(Stdio::from(log));
        self.child = Some(
            cmd.spawn()
                .with_context(|| format!("starting node {}", self.id))?,
        );
        wait_ready(&self.api(), Duration::from_secs(20)).await
    }

    /// SIGKILL, with whatever it held.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    /// SIGTERM: the node drains (routes withdrawn, clients redirected) and exits.
    pub async fn drain(&mut self) -> Result<()> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        if let Some(pid) = c.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        match tokio::time::timeout(Duration::from_secs(15), c.wait()).await {
            Ok(_) => Ok(()),
            Err(_) => {
                let _ = c.kill().await;
                bail!("node {} did not drain in 15 s", self.id)
            }
        }
    }

    pub async fn restart(&mut self) -> Result<()> {
        self.kill().await;
        self.spawn().await
    }
}

async fn wait_port(ip: Ipv4Addr, port: u16, limit: Duration) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if tokio::net::TcpStream::connect((ip, port)).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{ip}:{port} did not open in {limit:?}")
}

/// Until `/readyz` answers 200.
pub async fn wait_ready(api: &str, limit: Duration) -> Result<()> {
    let http = reqwest::Client::new();
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(r) = http
            .get(format!("{api}/readyz"))
            .timeout(Duration::from_secs(1))
            .send()
            .await
            && r.status().is_success()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{api} not ready in {limit:?}")
}
