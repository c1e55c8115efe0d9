//! `mpush-faults`: the fault-injection suite. Each fault runs on a fresh
//! cluster (three mpush-server nodes and a redis-server, or a Sentinel group, real processes on
//! hosts of their own), under a workload of apps and a backend; the checker
//! then states what the fault cost (see `check`), and the report is a table
//! per fault (FAULTS.md).
//!
//!   mpush-faults run --quick                      # every fault once, short
//!   mpush-faults run --report FAULTS.md           # the report in the repo

mod check;
mod cluster;
mod load;
mod net;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use check::Outcome;
use cluster::{Node, Redis};
use load::{App, Backend, History, Receiver, Shared};

#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Runs the faults and prints (and writes) the table.
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Every fault once, with short phases (the test command's form).
    #[arg(long)]
    quick: bool,
    /// Only these faults (names as in the table).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Write the report (Markdown) here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Also write the outcomes as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The server binary (default: `mpush-server` beside this one).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Loopback addresses even when namespaces are possible.
    #[arg(long)]
    loopback: bool,
}

/// A fault: what it does, and whether it needs isolated hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    RedisRestart,
    /// Sentinel: the primary killed, the replica promoted.
    RedisFailover,
    RedisCutFromNode,
    NodesCut,
    NodeKilled,
    NodeDrained,
    LossyLink,
    NodePortFlood,
    WebhookDown,
    /// Combined: Redis restarted while a node is killed.
    RedisRestartAndNodeKilled,
    /// Combined: a lossy link while a stranger floods the node port.
    LossyLinkAndFlood,
}

const ALL: [Fault; 11] = [
    Fault::RedisRestart,
    Fault::RedisFailover,
    Fault::RedisCutFromNode,
    Fault::NodesCut,
    Fault::NodeKilled,
    Fault::NodeDrained,
    Fault::LossyLink,
    Fault::NodePortFlood,
    Fault::WebhookDown,
    Fault::RedisRestartAndNodeKilled,
    Fault::LossyLinkAndFlood,
];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Self::RedisRestart => "redis-restart",
            Self::RedisFailover => "redis-failover",
            Self::RedisCutFromNode => "redis-cut-from-node",
            Self::NodesCut => "nodes-cut",
            Self::NodeKilled => "node-killed",
            Self::NodeDrained => "node-drained",
            Self::LossyLink => "lossy-link",
            Self::NodePortFlood => "node-port-flood",
            Self::WebhookDown => "webhook-down",
            Self::RedisRestartAndNodeKilled => "redis-restart+node-killed",
            Self::LossyLinkAndFlood => "lossy-link+node-port-flood",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Self::RedisRestart => {
                "redis-server SIGKILLed, restarted empty after the fault's length"
            }
            Self::RedisFailover => {
                "Sentinel (a primary, a replica, a sentinel; the nodes use redis+sentinel://): the primary SIGKILLed, the sentinel promotes the replica; the old primary back, empty, as a replica after the fault's length"
            }
            Self::RedisCutFromNode => {
                "node A and Redis cut off from each other (both ways) for the fault's length"
            }
            Self::NodesCut => "nodes A and B cut off from each other for the fault's length",
            Self::NodeKilled => {
                "node B SIGKILLed with un-ACKed BIZ pushes (apps ACK after 300 ms), restarted after the fault"
            }
            Self::NodeDrained => {
                "node C drained (SIGTERM) during the load, restarted after the fault"
            }
            Self::LossyLink => {
                "node A's link down 10 % of the time in 50-250 ms bursts for the fault's length"
            }
            Self::NodePortFlood => {
                "a stranger holds 400 silent sockets on node B's node port for the fault's length"
            }
            Self::WebhookDown => {
                "the up-push webhook receiver down (connection refused) for the fault's length"
            }
            Self::RedisRestartAndNodeKilled => {
                "redis-server SIGKILLed and node B SIGKILLed together; both back after the fault"
            }
            Self::LossyLinkAndFlood => {
                "node A's link lossy while a stranger floods node B's node port"
            }
        }
    }

    fn needs_isolation(self) -> bool {
        matches!(
            self,
            Self::RedisCutFromNode | Self::NodesCut | Self::LossyLink | Self::LossyLinkAndFlood
        )
    }

    fn combined(self) -> bool {
        matches!(
            self,
            Self::RedisRestartAndNodeKilled | Self::LossyLinkAndFlood
        )
    }
}

/// What a fault acts on.
struct World {
    net: net::Net,
    redis: Redis,
    nodes: Vec<Node>,
    receiver: Receiver,
    flap: Option<tokio::task::JoinHandle<()>>,
    flood: Option<(Arc<AtomicBool>, Vec<tokio::task::JoinHandle<()>>)>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match cli.cmd {
            Cmd::Run(a) => run(a).await,
        }
    })
}

fn command_line(a: &RunArgs) -> String {
    let mut c =
        "cargo build -p mpush-server -p mpush-faults && target/debug/mpush-faults run".to_owned();
    if a.quick {
        c.push_str(" --quick");
    }
    if let Some(r) = &a.report {
        c.push_str(&format!(" --report {}", r.display()));
    }
    c
}

async fn run(a: RunArgs) -> Result<()> {
    let bin = match &a.server_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no parent directory")?
            .join("mpush-server"),
    };
    anyhow::ensure!(
        bin.exists(),
        "{} does not exist: cargo build -p mpush-server",
        bin.display()
    );
    let faults: Vec<Fault> = ALL
        .iter()
        .copied()
        .filter(|f| a.only.is_empty() || a.only.iter().any(|o| o == f.name()))
        .filter(|f| !a.quick || !f.combined() || a.only.iter().any(|o| o == f.name()))
        .collect();
    // Phases: before the fault, the fault, after the heal.
    let (warm, hold, after) = if a.quick {
        (
            Duration::from_secs(3),
            Duration::from_secs(6),
            Duration::from_secs(3),
        )
    } else {
        (
            Duration::from_secs(5),
            Duration::from_secs(12),
            Duration::from_secs(5),
        )
    };
    let mut outcomes = Vec::new();
    let mut isolated = false;
    for f in faults {
        let probe = net::Net::setup(&["redis", "a", "b", "c"], a.loopback)?;
        isolated |= probe.isolated;
        if f.needs_isolation() && !probe.isolated {
            println!(
                "{}: skipped (needs network namespaces: run as root)",
                f.name()
            );
            outcomes.push(Outcome {
                fault: f.name().into(),
                what: f.what().into(),
                skipped: Some("needs network namespaces (root)".into()),
                ..Outcome::default()
            });
            continue;
        }
        println!("{}: {}", f.name(), f.what());
        let started = Instant::now();
        let o = one(f, probe, &bin, warm, hold, after).await?;
        println!(
            "  {} pushes ({} 2xx, {} 503, {} 409, {} other, {} no answer), lost {}, wrong 2xx {}, seen twice {}, up-pushes acked {} lost {}, recovery {:?} ms, in {:.0} s",
            o.pushes,
            o.answered_2xx,
            o.answered_503,
            o.answered_409,
            o.answered_other,
            o.unanswered,
            o.lost,
            o.wrong_2xx,
            o.duplicates,
            o.ups_acked,
            o.ups_lost,
            o.recovery_ms,
            started.elapsed().as_secs_f64()
        );
        for e in &o.examples {
            println!("    {e}");
        }
        outcomes.push(o);
    }
    let md = check::markdown(&outcomes, &command_line(&a), isolated);
    if let Some(r) = &a.report {
        std::fs::write(r, &md)?;
    }
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&outcomes)?)?;
    }
    println!("\n{md}");
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.failed())
        .map(|o| o.fault.as_str())
        .collect();
    anyhow::ensure!(
        failed.is_empty(),
        "faults that lost, duplicated or misreported: {failed:?}"
    );
    Ok(())
}

/// One fault on a fresh cluster: load, fault, heal, settle, check.
async fn one(
    f: Fault,
    net: net::Net,
    bin: &std::path::Path,
    warm: Duration,
    hold: Duration,
    after: Duration,
) -> Result<Outcome> {
    let history: Shared = Arc::new(std::sync::Mutex::new(History::default()));
    let receiver = Receiver::start(net.root_ip, history.clone()).await?;
    let redis = Redis::start(net.host("redis"), f == Fault::RedisFailover).await?;
    let mut nodes = Vec::new();
    for id in ["a", "b", "c"] {
        nodes.push(
            Node::start(
                &id.to_uppercase(),
                net.host(id),
                bin,
                &redis.url(),
                &receiver.url,
            )
            .await?,
        );
    }
    let apis: Vec<String> = nodes.iter().map(Node::api).collect();
    let backend = Arc::new(Backend::new(apis.clone()));
    // 24 users, 8 starting on each node; each app may move to any node.
    let mut apps = Vec::new();
    for i in 0..24 {
        let home = i % nodes.len();
        let mut servers = vec![nodes[home].tcp()];
        servers.extend(
            nodes
                .iter()
                .enumerate()
                .filter(|(k, _)| *k != home)
                .map(|(_, n)| n.tcp()),
        );
        apps.push(App::start(&format!("f{i:02}"), servers, history.clone()).await?);
    }
    let users: Vec<String> = apps.iter().map(|a| a.user.clone()).collect();
    let apps = Arc::new(apps);
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(load::run(
        backend.clone(),
        apps.clone(),
        history.clone(),
        Duration::from_millis(40),
        stop.clone(),
    ));
    let mut w = World {
        net,
        redis,
        nodes,
        receiver,
        flap: None,
        flood: None,
    };
    tokio::time::sleep(warm).await;
    inject(f, &mut w, &backend).await?;
    tokio::time::sleep(hold).await;
    heal(f, &mut w, &backend).await?;
    let healed = Instant::now();
    // Recovery: until a push to every user reaches a connection again.
    let mut recovery = None;
    while healed.elapsed() < Duration::from_secs(30) {
        if backend.all_reachable(&users).await {
            recovery = Some(healed.elapsed().as_millis() as u64);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(after).await;
    stop.store(true, Ordering::Relaxed);
    let _ = load.await;
    let settle = load::quiesce(&history, Duration::from_secs(20)).await;
    // Up-pushes still on their way to the backend.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut o = {
        let h = std::mem::take(&mut *history.lock().expect("history"));
        check::check(f.name(), f.what(), &h, &apis, settle).await
    };
    o.recovery_ms = recovery;
    drop(apps);
    for n in &mut w.nodes {
        n.kill().await;
        if o.failed() {
            let log = std::fs::read_to_string(&n.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            println!("  node {} log (last lines):", n.id);
            for l in tail.into_iter().rev() {
                println!("    {l}");
            }
        }
        let _ = std::fs::remove_file(&n.log);
    }
    w.redis.stop().await;
    Ok(o)
}

async fn inject(f: Fault, w: &mut World, backend: &Backend) -> Result<()> {
    match f {
        Fault::RedisRestart | Fault::RedisFailover => w.redis.kill().await,
        Fault::RedisCutFromNode => w.net.cut("a", "redis", true)?,
        Fault::NodesCut => w.net.cut("a", "b", true)?,
        Fault::NodeKilled => {
            w.nodes[1].kill().await;
            backend.avoid(&w.nodes[1].api());
        }
        Fault::NodeDrained => {
            backend.avoid(&w.nodes[2].api());
            w.nodes[2].drain().await?;
        }
        Fault::LossyLink => w.flap = Some(flap(&w.net, "a")),
        Fault::NodePortFlood => w.flood = Some(flood(w.nodes[1].node_port(), w.net.root_ip)),
        Fault::WebhookDown => w.receiver.stop(),
        Fault::RedisRestartAndNodeKilled => {
            w.redis.kill().await;
            w.nodes[1].kill().await;
            backend.avoid(&w.nodes[1].api());
        }
        Fault::LossyLinkAndFlood => {
            w.flap = Some(flap(&w.net, "a"));
            w.flood = Some(flood(w.nodes[1].node_port(), w.net.root_ip));
        }
    }
    Ok(())
}

async fn heal(f: Fault, w: &mut World, backend: &Backend) -> Result<()> {
    let all: Vec<String> = w.nodes.iter().map(Node::api).collect();
    match f {
        Fault::RedisRestart | Fault::RedisFailover => w.redis.restart().await?,
        Fault::RedisCutFromNode => w.net.cut("a", "redis", false)?,
        Fault::NodesCut => w.net.cut("a", "b", false)?,
        Fault::NodeKilled => w.nodes[1].restart().await?,
        Fault::NodeDrained => w.nodes[2].restart().await?,
        Fault::LossyLink => stop_flap(w)?,
        Fault::NodePortFlood => stop_flood(w),
        Fault::WebhookDown => w.receiver.restart().await?,
        Fault::RedisRestartAndNodeKilled => {
            w.redis.restart().await?;
            w.nodes[1].restart().await?;
        }
        Fault::LossyLinkAndFlood => {
            stop_flap(w)?;
            stop_flood(w);
        }
    }
    *backend.apis.lock().expect("apis") = all;
    Ok(())
}

/// The host's link down 10 % of the time, in bursts of 50-250 ms.
fn flap(net: &net::Net, host: &str) -> tokio::task::JoinHandle<()> {
    // The Net stays with the run: the task runs `ip` itself.
    let ns_link = net.link_name(host).unwrap_or_default();
    tokio::spawn(async move {
        let mut k: u64 = 0;
        loop {
            k = k
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let down = 50 + (k >> 33) % 200;
            let up = down * 9;
            set_link(&ns_link, false);
            tokio::time::sleep(Duration::from_millis(down)).await;
            set_link(&ns_link, true);
            tokio::time::sleep(Duration::from_millis(up)).await;
        }
    })
}

fn set_link(link: &str, up: bool) {
    let _ = std::process::Command::new("ip")
        .args(["link", "set", link, if up { "up" } else { "down" }])
        .status();
}

fn stop_flap(w: &mut World) -> Result<()> {
    if let Some(t) = w.flap.take() {
        t.abort();
    }
    w.net.link("a", true)
}

/// A stranger holding 400 silent sockets on `port` (reopened when closed),
/// from the root host's address.
fn flood(
    port: std::net::SocketAddr,
    from: std::net::Ipv4Addr,
) -> (Arc<AtomicBool>, Vec<tokio::task::JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = (0..400)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
                        return;
                    };
                    let _ = socket.bind((from, 0).into());
                    match tokio::time::timeout(Duration::from_secs(2), socket.connect(port)).await {
                        Ok(Ok(mut s)) => {
                            use tokio::io::AsyncReadExt;
                            let mut buf = [0u8; 64];
                            while let Ok(Ok(k)) =
                                tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await
                            {
                                if k == 0 || stop.load(Ordering::Relaxed) {
                                    break;
                                }
                            }
                        }
                        _ => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            })
        })
        .collect();
    (stop, tasks)
}

fn stop_flood(w: &mut World) {
    if let Some((stop, tasks)) = w.flood.take() {
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.abort();
        }
    }
}
