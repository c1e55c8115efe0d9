//! The orchestrator: servers and workers as child processes, the scenarios,
//! the figures with their ratios to the ideal server.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use hdrhistogram::serialization::Deserializer;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout, Command};
use tokio::sync::Semaphore;

use crate::worker::{Transport, stamp};

mod upstream;

/// Sockets per worker process (the limit is 20,000 open files per process).
const PER_WORKER: usize = 19_000;
const PAYLOAD: usize = 64;
static GROUPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const QUANTILES: [f64; 9] = [0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999];

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// A small run (about a minute) that checks the tool works, not speed.
    #[arg(long)]
    pub quick: bool,
    /// Connections per scenario (default 10,000; --quick: 500).
    #[arg(long)]
    pub conns: Option<usize>,
    /// Also write the figures as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Run only these scenario groups (ideal, connections, delivery, scale,
    /// cluster, cpu, upstream, storm, curve); the report needs them all.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Write the report (Markdown) here, with its charts in `docs/bench/` beside it.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// The server binary (default: `mpush-server` next to this one).
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
    /// Load clients bind again after every fast connect instead of asking
    /// the server to keep their binding (ADR 0008): the protocol before it,
    /// for an A/B of the fast connect.
    #[arg(long)]
    pub rebind: bool,
    /// The `cpu` scenario's clients come back with their tickets in this
    /// many parts, each beside as many of the ideal's accepts (1: all the
    /// fast connects, then all the accepts).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub fast_parts: u16,
    /// The TLS connects (each transport) likewise alternate with the
    /// ideal's TLS accepts in this many parts (1: all the server's
    /// connects, then all the ideal's accepts).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub tls_parts: u16,
}

/// `--rebind`, for every worker this run starts.
static REBIND: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

struct Proc {
    child: tokio::process::Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Result<Self> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("spawning a child process")?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        Ok(Self {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        })
    }

    async fn ask(&mut self, cmd: &str, timeout: Duration) -> Result<Value> {
        self.stdin.write_all(format!("{cmd}\n").as_bytes()).await?;
        self.stdin.flush().await?;
        let line = tokio::time::timeout(timeout, self.lines.next_line())
            .await
            .with_context(|| format!("no answer to `{cmd}` in {timeout:?}"))??
            .with_context(|| format!("the process ended before answering `{cmd}`"))?;
        Ok(serde_json::from_str(&line)?)
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }
}

/// A loopback port nothing listens on, for a process the bench starts: below
/// the ephemeral range, where the load clients' outgoing connections never
/// take it (a port from `127.0.0.1:0` was, in CI). Shared with the tests.
fn free_port() -> Result<u16> {
    Ok(ports::try_free_port()?)
}

#[path = "../../server/tests/common/ports.rs"]
mod ports;

/// A process the bench started exited before it served: its port was taken
/// between [`free_port`]'s check and its bind.
#[derive(Debug)]
struct ExitedAtStart(String);

impl std::fmt::Display for ExitedAtStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} exited at start", self.0)
    }
}

impl std::error::Error for ExitedAtStart {}

/// Runs `start` (which picks its own free ports) again, up to twice, when
/// what it started exited at start.
async fn on_free_ports<T, F: Future<Output = Result<T>>>(
    mut start: impl FnMut() -> F,
) -> Result<T> {
    let mut tries = 0;
    loop {
        match start().await {
            Err(e) if tries < 2 && e.is::<ExitedAtStart>() => {
                eprintln!("{e:#}; starting it again on other ports");
                tries += 1;
            }
            r => return r,
        }
    }
}

/// Resident memory of a process, in KiB.
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The CPU time (user and system, every thread, ended ones included) of
/// process `pid`, to the nanosecond: its process CPU clock. The per-operation
/// figures divide a phase's CPU by its operations, and some phases last about
/// a tenth of a second (10,000 plain accepts), where `/proc`'s clock ticks
/// (10 ms) would be a tenth of the figure. `/proc/<pid>/stat` is the
/// fallback where that clock is not available.
fn cpu_secs(pid: u32) -> f64 {
    use nix::time::{clock_getcpuclockid, clock_gettime};
    let Ok(pid_i) = i32::try_from(pid) else {
        return 0.0;
    };
    match clock_getcpuclockid(nix::unistd::Pid::from_raw(pid_i)).and_then(clock_gettime) {
        Ok(t) => t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9,
        Err(_) => cpu_secs_ticks(pid),
    }
}

/// `cpu_secs` from `/proc/<pid>/stat`, in clock ticks.
fn cpu_secs_ticks(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is 0,
    // utime 11, stime 12, in clock ticks.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    ticks as f64 / clock_ticks()
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
fn clock_ticks() -> f64 {
    static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// CPUs the load workers are pinned to (the `cpu` scenario keeps them off
/// the server's core); empty: not pinned.
static WORKER_CPUS: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

struct Server {
    child: tokio::process::Child,
    tcp: String,
    ws: String,
    api: String,
}

/// A throwaway redis-server for cluster scenarios.
struct Redis {
    _child: tokio::process::Child,
    url: String,
}

async fn start_redis() -> Result<Redis> {
    on_free_ports(|| async { start_redis_on(free_port()?).await }).await
}

async fn start_redis_on(port: u16) -> Result<Redis> {
    let mut child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no", "--maxclients", "10000"])
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("redis-server (apt-get install redis-server)")?;
    for _ in 0..200 {
        if let Some(status) = child.try_wait()? {
            return Err(ExitedAtStart(format!("redis-server ({status}, port {port})")).into());
        }
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(Redis {
                _child: child,
                url: format!("redis://127.0.0.1:{port}/"),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("redis-server did not listen")
}

/// One server process; in a cluster, node `id` on `redis`.
async fn start_server(bin: &Path, cluster: Option<(&Redis, &str)>) -> Result<Server> {
    start_server_with(bin, cluster, None, &[]).await
}

/// `start_server`, pinned to `cpus` (taskset) and with extra settings.
async fn start_server_with(
    bin: &Path,
    cluster: Option<(&Redis, &str)>,
    cpus: Option<&str>,
    env: &[(&str, &str)],
) -> Result<Server> {
    on_free_ports(|| async {
        let ports = (free_port()?, free_port()?, free_port()?);
        start_server_on(bin, cluster, cpus, env, ports).await
    })
    .await
}

/// `start_server_with` on these ports (TCP, WebSocket, HTTP): a restart
/// comes back where its clients look for it.
async fn start_server_on(
    bin: &Path,
    cluster: Option<(&Redis, &str)>,
    cpus: Option<&str>,
    env: &[(&str, &str)],
    (tcp, ws, http): (u16, u16, u16),
) -> Result<Server> {
    let mut cmd = match cpus {
        Some(c) => {
            let mut t = Command::new("taskset");
            t.args(["-c", c]).arg(bin);
            t
        }
        None => Command::new(bin),
    };
    cmd.args([
        "--tcp",
        &format!("127.0.0.1:{tcp}"),
        "--ws",
        &format!("127.0.0.1:{ws}"),
        "--http",
        &format!("127.0.0.1:{http}"),
    ])
    .env("MPUSH__LIMITS__HANDSHAKES_PER_IP", "10000000")
    .env("MPUSH__LIMITS__MAX_CONNECTIONS", "200000")
    // Every load worker is one loopback address holding up to 19,000 clients,
    // all connecting at once: lift the per-address caps meant for the internet.
    .env("MPUSH__LIMITS__MAX_CONNECTIONS_PER_IP", "1000000")
    .env("MPUSH__LIMITS__RSA_QUEUE", "1000000")
    .env("MPUSH__DELIVERY__PUSH_RATE", "100000000")
    .env("MPUSH__DELIVERY__BROADCAST_RATE", "100000000")
    .env("MPUSH__DELIVERY__BROADCAST_MAX", "1000000")
    .env("MPUSH__NET__DEMO_DIR", "")
    .env("RUST_LOG", "error")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some((redis, id)) = cluster {
        cmd.args(["--redis", &redis.url])
            .env("MPUSH__CLUSTER__NODE_ID", id)
            .env("MPUSH__CLUSTER__INTERNAL", "127.0.0.1:0");
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let api = format!("http://127.0.0.1:{http}");
    let client = reqwest::Client::new();
    for _ in 0..200 {
        if let Some(status) = child.try_wait()? {
            let what = format!("mpush-server ({status}, ports {tcp}, {ws}, {http})");
            return Err(ExitedAtStart(what).into());
        }
        if client.get(format!("{api}/healthz")).send().await.is_ok() {
            return Ok(Server {
                child,
                tcp: format!("127.0.0.1:{tcp}"),
                ws: format!("127.0.0.1:{ws}"),
                api,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("mpush-server did not answer /healthz")
}

struct Ideal {
    proc: Proc,
    addr: String,
}

async fn start_ideal(me: &Path) -> Result<Ideal> {
    start_ideal_on(me, None).await
}

async fn start_ideal_on(me: &Path, cpus: Option<&str>) -> Result<Ideal> {
    start_ideal_with(me, cpus, None).await
}

/// The ideal server, accepting TLS with `tls` (certificate and key PEM) when given.
async fn start_ideal_with(
    me: &Path,
    cpus: Option<&str>,
    tls: Option<(&Path, &Path)>,
) -> Result<Ideal> {
    on_free_ports(|| start_ideal_once(me, cpus, tls)).await
}

async fn start_ideal_once(
    me: &Path,
    cpus: Option<&str>,
    tls: Option<(&Path, &Path)>,
) -> Result<Ideal> {
    let addr = format!("127.0.0.1:{}", free_port()?);
    let mut cmd = match cpus {
        Some(c) => {
            let mut t = Command::new("taskset");
            t.args(["-c", c]).arg(me);
            t
        }
        None => Command::new(me),
    };
    cmd.args(["ideal", "--addr", &addr]);
    if let Some((cert, key)) = tls {
        cmd.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
    }
    let mut proc = Proc::spawn(cmd)?;
    let first = tokio::time::timeout(Duration::from_secs(10), proc.lines.next_line())
        .await
        .context("the ideal server did not start")??
        .unwrap_or_default();
    if first.is_empty() {
        return Err(ExitedAtStart(format!("the ideal server (on {addr})")).into());
    }
    if !first.contains("listening") {
        bail!("the ideal server did not listen: {first}");
    }
    Ok(Ideal { proc, addr })
}

/// Waits until the ideal server itself has accepted `n` connections (the
/// clients count a connection once the kernel took it, before the server's
/// accept: a broadcast sent earlier would miss the last few). Returns how
/// many it holds: a few of 10k simultaneous connects can be lost in the
/// kernel's accept queue, and the ideal's figures are then over those.
async fn ideal_accepted(ideal: &mut Ideal, n: usize, timeout: Duration) -> Result<usize> {
    let deadline = Instant::now() + timeout;
    let (mut last, mut since) = (0, Instant::now());
    loop {
        let v = ideal.proc.ask("count", Duration::from_secs(10)).await?;
        let got = v["conns"].as_u64().unwrap_or(0) as usize;
        if got >= n {
            return Ok(got);
        }
        if got != last {
            (last, since) = (got, Instant::now());
        }
        if since.elapsed() > Duration::from_secs(3) && got > 0 {
            eprintln!("ideal server: {got} of {n} connections accepted; measuring over those");
            return Ok(got);
        }
        if Instant::now() > deadline {
            bail!("the ideal server accepted {got} of {n} connections");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Debug, Default)]
struct Totals {
    received: u64,
    bound_now: i64,
    lost: u64,
    bound: u64,
    connected: u64,
    resumed: u64,
    dropped: u64,
    failed: u64,
    errors: Vec<String>,
}

struct Workers {
    procs: Vec<Proc>,
    hist: Histogram<u64>,
}

impl Workers {
    /// How many of `conns` connections `start` sends to each of `targets`.
    fn split(conns: usize, targets: usize) -> Vec<usize> {
        let targets = targets.max(1);
        let count = conns.div_ceil(PER_WORKER).max(targets).max(1);
        let mut per = vec![0; targets];
        let mut first = 0;
        for w in 0..count {
            let n = (conns - first) / (count - w);
            per[w % targets] += n;
            first += n;
        }
        per
    }

    /// Spreads `conns` over worker processes (at most `PER_WORKER` each, one
    /// source address each), the workers over `targets` round-robin.
    async fn start(
        me: &Path,
        targets: &[String],
        transport: Transport,
        legacy: bool,
        conns: usize,
        first_user: usize,
    ) -> Result<Self> {
        Self::start_tls(me, targets, transport, legacy, conns, first_user, None).await
    }

    /// `conns` clients of the ideal servers at `targets`.
    async fn ideal(me: &Path, targets: &[String], conns: usize) -> Result<Self> {
        Self::start(me, targets, Transport::Ideal, false, conns, 0).await
    }

    /// `conns` TCP v2 clients of one server, once every one is bound.
    async fn bound_tcp(me: &Path, target: &str, conns: usize, timeout: Duration) -> Result<Self> {
        let mut w = Self::start(me, &[target.to_owned()], Transport::Tcp, false, conns, 0).await?;
        w.wait("bind", timeout, |t| t.bound >= conns as u64).await?;
        Ok(w)
    }

    /// Storm clients (`worker --storm`): they come back on their own when
    /// their connection is lost, `concurrency` connecting at once per worker.
    async fn start_storm(
        me: &Path,
        target: &str,
        conns: usize,
        concurrency: usize,
    ) -> Result<Self> {
        let c = concurrency.to_string();
        Self::start_args(
            me,
            &[target.to_string()],
            Transport::Tcp,
            false,
            conns,
            0,
            None,
            &["--storm", "--concurrency", &c],
        )
        .await
    }

    /// `start`, over TLS trusting `tls_ca` when given (protocol clients then
    /// speak the transport-secured profile).
    async fn start_tls(
        me: &Path,
        targets: &[String],
        transport: Transport,
        legacy: bool,
        conns: usize,
        first_user: usize,
        tls_ca: Option<&Path>,
    ) -> Result<Self> {
        Self::start_args(
            me,
            targets,
            transport,
            legacy,
            conns,
            first_user,
            tls_ca,
            &[],
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_args(
        me: &Path,
        targets: &[String],
        transport: Transport,
        legacy: bool,
        conns: usize,
        first_user: usize,
        tls_ca: Option<&Path>,
        extra: &[&str],
    ) -> Result<Self> {
        let count = conns.div_ceil(PER_WORKER).max(targets.len()).max(1);
        // Fresh source addresses for every group of workers: the ports of the
        // previous ones are still in TIME_WAIT.
        let group = GROUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 250 + 1;
        let mut procs = Vec::new();
        let mut first = 0;
        let cpus = WORKER_CPUS.lock().map(|c| c.clone()).unwrap_or_default();
        for w in 0..count {
            let n = (conns - first) / (count - w);
            let mut cmd = if cpus.is_empty() {
                Command::new(me)
            } else {
                let mut t = Command::new("taskset");
                t.args(["-c", &cpus]).arg(me);
                t
            };
            cmd.args([
                "worker",
                "--target",
                &targets[w % targets.len()],
                "--transport",
            ])
            .arg(match transport {
                Transport::Tcp => "tcp",
                Transport::Ws => "ws",
                Transport::Ideal => "ideal",
            })
            .args(["--conns", &n.to_string()])
            .args(["--first", &(first_user + first).to_string()])
            .args(["--src", &format!("127.0.{group}.{}", 2 + w)]);
            if legacy {
                cmd.arg("--legacy");
            }
            if let Some(ca) = tls_ca {
                cmd.arg("--tls-ca").arg(ca);
            }
            if REBIND.load(std::sync::atomic::Ordering::Relaxed) {
                cmd.arg("--rebind");
            }
            cmd.args(extra);
            procs.push(Proc::spawn(cmd)?);
            first += n;
        }
        Ok(Self {
            procs,
            hist: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        })
    }

    async fn totals(&mut self) -> Result<Totals> {
        let mut t = Totals::default();
        for p in &mut self.procs {
            let v = p.ask("stats", Duration::from_secs(30)).await?;
            let n = |k: &str| v[k].as_u64().unwrap_or(0);
            t.received += n("received");
            t.bound_now += v["bound_now"].as_i64().unwrap_or(0);
            t.lost += n("lost");
            t.bound += n("bound");
            t.connected += n("connected");
            t.resumed += n("resumed");
            t.dropped += n("dropped");
            t.failed += n("failed");
            if let Some(e) = v["errors"].as_array() {
                t.errors
                    .extend(e.iter().filter_map(|x| x.as_str().map(str::to_owned)));
            }
            let hex = v["hist"].as_str().unwrap_or_default();
            let bytes: Vec<u8> = (0..hex.len() / 2)
                .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
                .collect();
            if !bytes.is_empty() {
                let h: Histogram<u64> = Deserializer::new()
                    .deserialize(&mut &bytes[..])
                    .map_err(|e| anyhow::anyhow!("histogram: {e:?}"))?;
                self.hist.add(&h).map_err(|e| anyhow::anyhow!("{e:?}"))?;
            }
        }
        Ok(t)
    }

    /// Polls until `done(totals)`, failing on client errors or the timeout.
    async fn wait(
        &mut self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Totals) -> bool,
    ) -> Result<Totals> {
        let deadline = Instant::now() + timeout;
        loop {
            let t = self.totals().await?;
            if done(&t) {
                return Ok(t);
            }
            if t.failed > 0 {
                bail!("{what}: {} client(s) failed: {:?}", t.failed, t.errors);
            }
            if Instant::now() > deadline {
                bail!("{what}: timed out after {timeout:?} ({t:?})");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn all(&mut self, cmd: &str) -> Result<()> {
        for p in &mut self.procs {
            let v = p.ask(cmd, Duration::from_secs(10)).await?;
            if v["event"] == "error" {
                bail!("worker refused `{cmd}`: {}", v["message"]);
            }
        }
        Ok(())
    }

    fn take_latency(&mut self) -> Value {
        let h = &self.hist;
        let v = if h.is_empty() {
            json!(null)
        } else {
            json!({
                "count": h.len(),
                "p50_us": h.value_at_quantile(0.5),
                "p99_us": h.value_at_quantile(0.99),
                "p999_us": h.value_at_quantile(0.999),
                "max_us": h.max(),
                "quantiles": QUANTILES
                    .iter()
                    .map(|q| json!([q, h.value_at_quantile(*q)]))
                    .collect::<Vec<_>>(),
            })
        };
        self.hist.reset();
        v
    }

    async fn quit(mut self) {
        for p in &mut self.procs {
            let _ = p.stdin.write_all(b"quit\n").await;
        }
        for p in &mut self.procs {
            let _ = tokio::time::timeout(Duration::from_secs(5), p.child.wait()).await;
        }
    }
}

struct Sizes {
    conns: usize,
    /// How long the `cpu` scenario waits at most for loopback's TIME_WAIT
    /// sockets to drain before it measures (zero: it does not wait).
    settle: Duration,
    batch_msgs: usize,
    single_msgs: usize,
    paced_rate: usize,
    paced_secs: u64,
    broadcasts: usize,
    /// Broadcasts back to back in the `cpu` scenario (half as many one at a time).
    cpu_broadcasts: usize,
    /// Broadcasts in all before the `cpu` scenario's memory reading.
    rss_broadcasts: usize,
    /// Broadcast scaling points: (connections, server processes).
    scale: Vec<(usize, usize)>,
    timeout: Duration,
    /// Up-push scenario: connections, and messages in all (per sink).
    up_conns: usize,
    up_msgs: usize,
    /// Seconds of single-user pushes at 1,000/s in the `cpu` scenario.
    tail_secs: u64,
    /// RSA private-key operations the ideal times in the `cpu` scenario.
    rsa_ops: usize,
    /// Clients in the reconnect storms.
    storm_conns: usize,
    /// The cost curve's steps (connections) and its node processes.
    curve: Vec<usize>,
    curve_nodes: usize,
    /// `--fast-parts`, `--tls-parts`.
    fast_parts: usize,
    tls_parts: usize,
}

fn ratio(ours: f64, ideal: f64) -> f64 {
    if ideal > 0.0 { ours / ideal } else { 0.0 }
}

/// Scenario 1 and 2: memory per idle bound connection, full handshakes/s,
/// fast connects/s.
async fn connections(
    me: &Path,
    bin: &Path,
    s: &Sizes,
    transport: Transport,
    legacy: bool,
) -> Result<Value> {
    let server = start_server(bin, None).await?;
    let pid = server.child.id().unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_kb(pid);
    let target = if transport == Transport::Ws {
        &server.ws
    } else {
        &server.tcp
    };
    let t0 = Instant::now();
    let mut w = Workers::start(
        me,
        std::slice::from_ref(target),
        transport,
        legacy,
        s.conns,
        0,
    )
    .await?;
    let n = s.conns as u64;
    w.wait("handshake and bind", s.timeout, |t| t.bound >= n)
        .await?;
    let hs_secs = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kb(pid);
    let t1 = Instant::now();
    w.all("reconnect").await?;
    let t = w
        .wait("fast connect", s.timeout, |t| t.connected >= 2 * n)
        .await?;
    let fc_secs = t1.elapsed().as_secs_f64();
    w.quit().await;
    drop(server);
    Ok(json!({
        "transport": transport,
        "profile": if legacy { "legacy" } else { "v2" },
        "conns": s.conns,
        "bytes_per_conn": (after.saturating_sub(before) * 1024) as f64 / s.conns as f64,
        "handshakes_per_s": s.conns as f64 / hs_secs,
        "fast_connects_per_s": s.conns as f64 / fc_secs,
        "resumed": t.resumed,
    }))
}

async fn ideal_memory(me: &Path, s: &Sizes) -> Result<(Ideal, Workers, f64, usize)> {
    let ideal = start_ideal(me).await?;
    let pid = ideal.proc.pid();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_kb(pid);
    let mut w = Workers::ideal(me, std::slice::from_ref(&ideal.addr), s.conns).await?;
    let n = s.conns as u64;
    w.wait("ideal connections", s.timeout, |t| t.bound >= n)
        .await?;
    let mut ideal = ideal;
    let held = ideal_accepted(&mut ideal, s.conns, s.timeout).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let per = (rss_kb(pid).saturating_sub(before) * 1024) as f64 / held.max(1) as f64;
    Ok((ideal, w, per, held))
}

async fn post(client: &reqwest::Client, url: &str, body: Value) -> Result<()> {
    let r = client.post(url).json(&body).send().await?;
    if !r.status().is_success() {
        bail!(
            "{url}: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        );
    }
    Ok(())
}

/// POSTs every `(url, body)`, at most `concurrency` at once. A body is made
/// (and its timestamp taken) only when its request is about to go.
async fn post_all(
    http: &reqwest::Client,
    concurrency: usize,
    requests: impl IntoIterator<Item = (String, Value)>,
) -> Result<()> {
    let gate = Arc::new(Semaphore::new(concurrency));
    let mut tasks = Vec::new();
    for (url, body) in requests {
        let permit = gate.clone().acquire_owned().await?;
        let http = http.clone();
        tasks.push(tokio::spawn(async move {
            let r = post(&http, &url, body).await;
            drop(permit);
            r
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Runs `send`, then waits until the workers got `count` more messages:
/// the delivery rate (from the start of `send`) and the latency percentiles.
async fn measure(
    w: &mut Workers,
    what: &str,
    timeout: Duration,
    count: usize,
    send: impl std::future::Future<Output = Result<()>>,
) -> Result<(f64, Value)> {
    let base = w.totals().await?.received;
    w.take_latency();
    let t0 = Instant::now();
    send.await?;
    let want = base + count as u64;
    w.wait(what, timeout, |t| t.received >= want).await?;
    Ok((count as f64 / t0.elapsed().as_secs_f64(), w.take_latency()))
}

/// User ids `u<k>` for `count` consecutive `k` from `from`, over `conns` users.
fn users(from: usize, count: usize, conns: usize) -> Vec<String> {
    (from..from + count)
        .map(|k| format!("u{}", k % conns))
        .collect()
}

/// Unicast through the batch API as fast as 8 callers go, 1,000 users per
/// request: (messages, rate, latency).
async fn batch_unicast(
    w: &mut Workers,
    http: &reqwest::Client,
    api: &str,
    s: &Sizes,
) -> Result<(usize, f64, Value)> {
    let batch = 1000.min(s.conns);
    let messages = s.batch_msgs.div_ceil(batch) * batch;
    let url = format!("{api}/api/v1/push/batch");
    let requests = (0..messages / batch).map(|r| {
        let body = json!({"userIds": users(r * batch, batch, s.conns), "content": stamp(PAYLOAD)});
        (url.clone(), body)
    });
    let (rate, latency) = measure(
        w,
        "batch deliveries",
        s.timeout,
        messages,
        post_all(http, 8, requests),
    )
    .await?;
    Ok((messages, rate, latency))
}

/// `s.broadcasts` broadcasts back to back to `n` connections: (rate, latency).
async fn broadcast(
    w: &mut Workers,
    http: &reqwest::Client,
    api: &str,
    s: &Sizes,
    n: usize,
) -> Result<(f64, Value)> {
    let url = format!("{api}/api/v1/broadcast");
    let send = async {
        for _ in 0..s.broadcasts {
            post(http, &url, json!({"content": stamp(PAYLOAD)})).await?;
        }
        Ok(())
    };
    measure(w, "broadcast deliveries", s.timeout, s.broadcasts * n, send).await
}

/// Scenario 3 and 4 on one server: unicast (batch, single, paced) and broadcast.
async fn delivery(me: &Path, bin: &Path, s: &Sizes) -> Result<Value> {
    let server = start_server(bin, None).await?;
    let mut w = Workers::bound_tcp(me, &server.tcp, s.conns, s.timeout).await?;
    let http = reqwest::Client::new();

    // The server's CPU per message too: the rate moves with how the two
    // cores are shared with the clients, its CPU per message much less.
    let pid = server.child.id().unwrap_or(0);
    let c0 = cpu_secs(pid);
    eprintln!("delivery: batch unicast");
    let (messages, batch_rate, batch_latency) =
        batch_unicast(&mut w, &http, &server.api, s).await?;
    let batch_cpu_us = (cpu_secs(pid) - c0) * 1e6 / messages.max(1) as f64;
    // Every message's trace has its states (DISPATCHED, DELIVERED): a
    // trace writer that fell behind and dropped events would make the rate
    // cheaper than it is.
    let dropped = trace_events_dropped("delivery", [server.api.as_str()]).await?;

    // Paced: a steady rate through the batch API, one request every 10 ms.
    let per_tick = (s.paced_rate / 100).max(1);
    let ticks = s.paced_secs as usize * 100;
    let url = format!("{}/api/v1/push/batch", server.api);
    let paced = async {
        let mut interval = tokio::time::interval(Duration::from_millis(10));
        let mut tasks = Vec::new();
        for k in 0..ticks {
            interval.tick().await;
            let body = json!({"userIds": users(k * per_tick, per_tick, s.conns), "content": stamp(PAYLOAD)});
            let (http, url) = (http.clone(), url.clone());
            tasks.push(tokio::spawn(async move { post(&http, &url, body).await }));
        }
        for t in tasks {
            t.await??;
        }
        Ok(())
    };
    let (_, paced_latency) = measure(
        &mut w,
        "paced deliveries",
        s.timeout,
        ticks * per_tick,
        paced,
    )
    .await?;

    // Single-user API, 64 concurrent callers.
    let url = format!("{}/api/v1/push", server.api);
    let requests = (0..s.single_msgs).map(|k| {
        let body = json!({"userId": format!("u{}", k % s.conns), "content": stamp(PAYLOAD)});
        (url.clone(), body)
    });
    let (single_rate, single_latency) = measure(
        &mut w,
        "single deliveries",
        s.timeout,
        s.single_msgs,
        post_all(&http, 64, requests),
    )
    .await?;

    let (broadcast_rate, broadcast_latency) =
        broadcast(&mut w, &http, &server.api, s, s.conns).await?;
    w.quit().await;
    drop(server);
    Ok(json!({
        "conns": s.conns,
        "batch": {"messages": messages, "per_s": batch_rate, "latency": batch_latency, "cpu_us_per_message": batch_cpu_us, "trace_events_dropped": dropped},
        "paced": {"rate": per_tick * 100, "seconds": s.paced_secs, "latency": paced_latency},
        "single": {"requests": s.single_msgs, "per_s": single_rate, "latency": single_latency},
        "broadcast": {"broadcasts": s.broadcasts, "per_s": broadcast_rate, "latency": broadcast_latency},
    }))
}

/// Server CPU per delivery and memory over time: the server pinned to CPU 0,
/// the load workers to the others, `s.conns` bound TCP v2 connections. CPU
/// is the server process's CPU clock (`cpu_secs`), so the workers' own
/// kernel and user time is not in it.
async fn cpu(me: &Path, bin: &Path, s: &Sizes) -> Result<Value> {
    if std::thread::available_parallelism().map_or(1, usize::from) < 2 {
        bail!("the cpu scenario needs two CPUs");
    }
    *WORKER_CPUS.lock().map_err(|_| anyhow::anyhow!("lock"))? = "1-1023".into();
    // This process (the API caller) stays off the server's core too.
    pin_self("1-1023");
    let result = match cpu_inner(me, bin, s).await {
        Ok(mut v) => tls_inner(me, bin, s).await.map(|t| {
            v["tls"] = t;
            v
        }),
        Err(e) => Err(e),
    };
    pin_self("0-1023");
    *WORKER_CPUS.lock().map_err(|_| anyhow::anyhow!("lock"))? = String::new();
    result
}

/// Moves every thread of this process to `cpus` (`taskset -a`); a failure
/// only makes the figures noisier, so it is reported and not fatal.
fn pin_self(cpus: &str) {
    let ok = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("cpu: could not pin this process to CPUs {cpus} (taskset)");
    }
}

/// TCP sockets in TIME_WAIT on this machine (`/proc/net/sockstat`).
fn time_wait_sockets() -> usize {
    let stat = std::fs::read_to_string("/proc/net/sockstat").unwrap_or_default();
    stat.lines()
        .find_map(|l| l.strip_prefix("TCP: "))
        .and_then(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.windows(2)
                .find(|w| w[0] == "tw")
                .and_then(|w| w[1].parse().ok())
        })
        .unwrap_or(0)
}

/// Waits (at most `s.settle`) until the load clients' closed connections
/// have left TIME_WAIT (60 s on Linux). On loopback they share the kernel's
/// connection table with the server, which a server's own clients on other
/// hosts never do: a full run reaches the `cpu` scenario with the earlier
/// scenarios' tens of thousands of them, and every connect and lookup it
/// measures then walks a fuller table than in `--only cpu`.
async fn settle_time_wait(s: &Sizes) {
    let deadline = Instant::now() + s.settle;
    let before = time_wait_sockets();
    while time_wait_sockets() > 100 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if before > 100 {
        eprintln!(
            "cpu: {before} sockets in TIME_WAIT, {} left after waiting",
            time_wait_sockets()
        );
    }
}

async fn cpu_inner(me: &Path, bin: &Path, s: &Sizes) -> Result<Value> {
    let n = s.conns;
    settle_time_wait(s).await;
    let http = reqwest::Client::new();
    let server = start_server_with(bin, None, Some("0"), &[]).await?;
    let pid = server.child.id().unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c0 = cpu_secs(pid);
    let mut w = Workers::bound_tcp(me, &server.tcp, n, s.timeout).await?;
    let handshake_cpu = cpu_secs(pid) - c0;
    // What the server spends with every connection bound and nothing to do
    // (its timers, the metrics sampler): in every phase's figures below as
    // much as the phase lasts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c_idle = cpu_secs(pid);
    let idle_window = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_cpu_per_s = (cpu_secs(pid) - c_idle) / idle_window.elapsed().as_secs_f64();

    // The latency tail: single-user pushes at 1,000/s through the API, every
    // connection idle and bound, the server alone on its core: before the
    // ideal server and its clients exist (measured with them idle beside
    // it, after the fast connects, the p99 was 2.8-5.7 ms in 16 runs on
    // one machine, against 0.7-1.7 ms before them or without them).
    let url = format!("{}/api/v1/push", server.api);
    let tail_n = s.tail_secs as usize * 1000;
    let tail_send = paced_pushes(&url, tail_n, n);
    eprintln!("cpu: single-user pushes at 1000/s for {} s", s.tail_secs);
    let c_tail = cpu_secs(pid);
    let held_before = server_buckets(&server.api).await?;
    let (_, tail_latency) = measure(
        &mut w,
        "single-user pushes at 1000/s",
        s.timeout,
        tail_n,
        tail_send,
    )
    .await?;
    let tail_cpu = cpu_secs(pid) - c_tail;
    // The server's own share of the tail, from its histograms' buckets:
    // how long it took over each API call, and held each push between
    // accepting and writing it.
    let held_after = server_buckets(&server.api).await?;
    let server_held: serde_json::Map<String, Value> = held_after
        .iter()
        .map(|(series, after)| {
            let before = held_before
                .iter()
                .find(|(l, _)| l == series)
                .map_or(0.0, |b| b.1);
            (series.clone(), json!(after - before))
        })
        .collect();
    eprintln!(
        "cpu: the server's own share of the tail, pushes at or under each bound: {}",
        Value::Object(server_held.clone())
    );

    // The ideal server, pinned the same way: what a connect and a delivery
    // cost this machine's kernel at best (an accept; one write per
    // connection per broadcast). Started beside this server, so that the
    // fast connect and one broadcast at a time are measured alternately on
    // both: the VM's speed drifts over minutes by more than the floors'
    // margins. Its connections stay idle until its broadcasts.
    let mut ideal = start_ideal_on(me, Some("0")).await?;
    let ipid = ideal.proc.pid();
    // One RSA private-key operation, as the server does per full handshake
    // (same key, library and blinding), timed on the server's core.
    let rsa_ops = s.rsa_ops;
    let c_rsa = cpu_secs(ipid);
    let rsa_reply = ideal.proc.ask(&format!("rsa {rsa_ops}"), s.timeout).await?;
    let ideal_rsa_cpu = cpu_secs(ipid) - c_rsa;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Fast connects: every client drops its connection (the server's close
    // is measured alone: the ideal's accept closes nothing), then comes back
    // with its ticket, one part at a time, alternately with as many of the
    // ideal's accepts (the side that goes first alternates too).
    eprintln!("cpu: closes, then fast connects alternately with the ideal's accepts");
    let c_close = cpu_secs(pid);
    w.all("disconnect").await?;
    w.wait("disconnect", s.timeout, |t| t.dropped >= n as u64)
        .await?;
    // Let the server see every close and unbind.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let close_cpu = cpu_secs(pid) - c_close;
    let (mut fast_cpu, mut ideal_accept_cpu) = (0.0, 0.0);
    // `done`: the clients back (and the ideal's connections) before part `k`.
    let (mut done, mut held) = (0, 0);
    let mut iw: Option<Workers> = None;
    for k in 0..s.fast_parts {
        let part = (k..n).step_by(s.fast_parts).count();
        for ours in [k % 2 == 0, k % 2 == 1] {
            if ours {
                let c = cpu_secs(pid);
                w.all(&format!("reconnect {k} {}", s.fast_parts)).await?;
                let want = (n + done + part) as u64;
                w.wait("fast connect", s.timeout, |t| {
                    t.connected >= want && t.bound >= want
                })
                .await?;
                // What the server still does for the last of them.
                tokio::time::sleep(Duration::from_millis(200)).await;
                fast_cpu += cpu_secs(pid) - c;
            } else {
                let c = cpu_secs(ipid);
                let mut more = Workers::ideal(me, std::slice::from_ref(&ideal.addr), part).await?;
                more.wait("ideal connections", s.timeout, |t| t.bound >= part as u64)
                    .await?;
                held = ideal_accepted(&mut ideal, done + part, s.timeout).await?;
                ideal_accept_cpu += cpu_secs(ipid) - c;
                match &mut iw {
                    Some(iw) => iw.procs.append(&mut more.procs),
                    None => iw = Some(more),
                }
            }
        }
        done += part;
    }
    let mut iw = iw.context("no ideal connections")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = rss_kb(pid);

    // The latency tail's pushes through the ideal server, once it holds as
    // many connections (the server's are idle beside it): this machine's
    // own tail for a message handed to a server and read by a client.
    eprintln!("cpu: single messages at 1000/s through the ideal server");
    let (_, ideal_tail_latency) = measure(
        &mut iw,
        "ideal messages at 1000/s",
        s.timeout,
        tail_n,
        paced_ideal(&mut ideal, tail_n),
    )
    .await?;

    // Broadcasts back to back.
    eprintln!("cpu: broadcasts");
    let url = format!("{}/api/v1/broadcast", server.api);
    let back_to_back = s.cpu_broadcasts;
    let c2 = cpu_secs(pid);
    let (b2b_rate, _) = broadcast_n(&mut w, &http, &url, s, n, back_to_back).await?;
    let b2b_cpu = cpu_secs(pid) - c2;
    // The same with a condition every client passes, and without one,
    // alternately (the order rotates every round): the VM's speed drifts
    // over a minute by more than the floor's margin, so phases one after
    // the other would compare the drift too. First in blocks of five back
    // to back, then one broadcast at a time: back to back, a slower
    // selection changes how many messages one write carries (the blocking
    // pool's thread shares the server's one core here), so only one at a
    // time isolates what evaluating adds to a delivery.
    let kinds = [None, Some(BENCH_CONDITION), Some(BENCH_CONDITION_JS)];
    let block = 5.min((back_to_back / 2).max(1));
    let rounds = ((back_to_back / 2) / block).max(1);
    let cond_n = rounds * block;
    // One at a time, twice as many: what evaluating adds is a few percent
    // of such a delivery.
    let cond_one_n = 2 * cond_n;
    let mut blocks_cpu = [0.0f64; 3];
    let mut one_cpu_by = [0.0f64; 3];
    for (per, total, cpu) in [
        (block, cond_n, &mut blocks_cpu),
        (1, cond_one_n, &mut one_cpu_by),
    ] {
        for round in 0..total / per {
            for i in 0..kinds.len() {
                let k = (round + i) % kinds.len();
                let c = cpu_secs(pid);
                broadcast_n_with(&mut w, &http, &url, s, n, per, kinds[k]).await?;
                cpu[k] += cpu_secs(pid) - c;
            }
        }
    }
    let [plain_cpu, cond_cpu, cond_js_cpu] = blocks_cpu;
    // One broadcast in flight at a time, this server alone (the rate-limited
    // figure below is compared with it).
    let one = s.cpu_broadcasts / 2;
    eprintln!("cpu: one broadcast at a time");
    let c3 = cpu_secs(pid);
    for _ in 0..one {
        broadcast_n(&mut w, &http, &url, s, n, 1).await?;
    }
    let one_cpu = cpu_secs(pid) - c3;

    // One broadcast in flight at a time, alternately here and on the ideal
    // in blocks of five; each block starts with one broadcast not measured,
    // which warms what the other server's block evicted. Both figures come
    // out higher than either server's alone (about a fifth, on both sides,
    // also with the other one stopped), so the ratio is taken from these
    // and the figures alone are reported beside them.
    const BLOCK: usize = 5;
    let ideal_one = format!("broadcast 1 {PAYLOAD}");
    let (mut alt_cpu, mut ideal_one_cpu) = (0.0, 0.0);
    let mut measured = 0;
    while measured < one {
        let block = (one - measured).min(BLOCK);
        for k in 0..=block {
            let c3 = cpu_secs(pid);
            broadcast_n(&mut w, &http, &url, s, n, 1).await?;
            if k > 0 {
                alt_cpu += cpu_secs(pid) - c3;
            }
        }
        for k in 0..=block {
            let c6 = cpu_secs(ipid);
            measure(&mut iw, "ideal broadcast", s.timeout, held, async {
                ideal.proc.ask(&ideal_one, s.timeout).await.map(drop)
            })
            .await?;
            if k > 0 {
                ideal_one_cpu += cpu_secs(ipid) - c6;
            }
        }
        measured += block;
    }
    let cmd = format!("broadcast {back_to_back} {PAYLOAD}");
    let c5 = cpu_secs(ipid);
    measure(
        &mut iw,
        "ideal broadcast",
        s.timeout,
        back_to_back * n,
        async { ideal.proc.ask(&cmd, s.timeout).await.map(drop) },
    )
    .await?;
    let ideal_b2b_cpu = cpu_secs(ipid) - c5;
    iw.quit().await;
    drop(ideal);

    // The rest of the memory run: `s.rss_broadcasts` deliveries in all.
    // Alone, alternating, and one warm-up per block.
    let done = back_to_back + 2 * one + one.div_ceil(BLOCK);
    let mut left = s.rss_broadcasts.saturating_sub(done);
    while left > 0 {
        let k = left.min(back_to_back.max(1));
        broadcast_n(&mut w, &http, &url, s, n, k).await?;
        left -= k;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let busy_rss = rss_kb(pid);
    w.quit().await;
    drop(server);

    // The shipped flow-control default (30,000 deliveries/s), compared with
    // one broadcast at a time on the same process, before and after it
    // (ABA: drift that is linear over the phase cancels, and no other
    // process's block evicts its caches in between, which cost about a fifth
    // per copy when two servers took turns). Between those broadcasts the
    // limiter's bucket refills (one broadcast takes n of its 30,000 tokens;
    // the pause gives them back), so it never makes them wait: the server's
    // own counter of flow-control waits proves it. A fresh process pays for
    // its first broadcasts (queues and buffers growing), so two unmeasured
    // ones warm it first.
    const LIMIT: usize = 30_000;
    let limited = start_server_with(
        bin,
        None,
        Some("0"),
        &[("MPUSH__DELIVERY__BROADCAST_RATE", "30000")],
    )
    .await?;
    let lpid = limited.child.id().unwrap_or(0);
    let mut w = Workers::bound_tcp(me, &limited.tcp, n, s.timeout).await?;
    let url = format!("{}/api/v1/broadcast", limited.api);
    let refill = Duration::from_secs_f64((n as f64 / LIMIT as f64) * 1.2 + 0.05);
    let full = Duration::from_secs_f64(1.1);
    for _ in 0..2 {
        broadcast_n(&mut w, &http, &url, s, n, 1).await?;
        tokio::time::sleep(refill).await;
    }
    tokio::time::sleep(full).await;
    // The server's count of flow-control waits before and after each part.
    let waits = async || scrape(&limited.api, "mpush_flow_control_waits_total ").await;
    let w0 = waits().await?;
    let (mut free_cpu, mut free_n) = (0.0, 0);
    let mut one_free = async |w: &mut Workers, k: usize| -> Result<()> {
        for _ in 0..k {
            let c = cpu_secs(lpid);
            broadcast_n(w, &http, &url, s, n, 1).await?;
            free_cpu += cpu_secs(lpid) - c;
            free_n += 1;
            tokio::time::sleep(refill).await;
        }
        Ok(())
    };
    one_free(&mut w, one / 2).await?;
    let w1 = waits().await?;
    tokio::time::sleep(full).await;
    let limited_n = (back_to_back / 2).max(1);
    let c4 = cpu_secs(lpid);
    let (limited_rate, _) = broadcast_n(&mut w, &http, &url, s, n, limited_n).await?;
    let limited_cpu = cpu_secs(lpid) - c4;
    let w2 = waits().await?;
    tokio::time::sleep(full).await;
    one_free(&mut w, one - one / 2).await?;
    let w3 = waits().await?;
    let (free_waits, limited_waits) = ((w1 - w0) + (w3 - w2), w2 - w1);
    anyhow::ensure!(
        free_waits == 0.0,
        "the limiter made {free_waits} of the unlimited broadcasts wait: the pause between them is too short"
    );
    w.quit().await;
    drop(limited);

    let us = |cpu: f64, deliveries: usize| cpu * 1e6 / deliveries.max(1) as f64;
    Ok(json!({
        "conns": n,
        "ideal_back_to_back_cpu_us_per_delivery": us(ideal_b2b_cpu, back_to_back * held),
        "ideal_one_at_a_time_cpu_us_per_delivery": us(ideal_one_cpu, one * held),
        "ideal_accept_cpu_us": us(ideal_accept_cpu, held),
        "ideal_rsa_op_cpu_us": us(ideal_rsa_cpu, rsa_ops),
        "ideal_rsa_backend": rsa_reply["backend"],
        "handshake_cpu_us": us(handshake_cpu, n),
        "single_paced": {"rate": 1000, "pushes": tail_n, "cpu_us_per_push": us(tail_cpu, tail_n), "latency": tail_latency, "ideal_latency": ideal_tail_latency, "server_share_le": server_held},
        "fast_connect_cpu_us": us(fast_cpu, n),
        "fast_connects_per_core_s": n as f64 / fast_cpu.max(1e-9),
        "fast_connect_alternating": {"parts": s.fast_parts},
        "close_cpu_us": us(close_cpu, n),
        "idle_cpu_ms_per_s": idle_cpu_per_s * 1e3,
        "broadcast_back_to_back": {"broadcasts": back_to_back, "per_s": b2b_rate, "cpu_us_per_delivery": us(b2b_cpu, back_to_back * n)},
        "broadcast_one_at_a_time": {"broadcasts": one, "cpu_us_per_delivery": us(one_cpu, one * n)},
        "one_at_a_time_alternating": {"broadcasts": one, "cpu_us_per_delivery": us(alt_cpu, one * n), "ideal_cpu_us_per_delivery": us(ideal_one_cpu, one * held)},
        "broadcast_condition_baseline": {"broadcasts": cond_n, "block": block, "cpu_us_per_delivery": us(plain_cpu, cond_n * n)},
        "broadcast_condition": {"broadcasts": cond_n, "condition": BENCH_CONDITION, "cpu_us_per_delivery": us(cond_cpu, cond_n * n)},
        "broadcast_condition_js": {"broadcasts": cond_n, "condition": BENCH_CONDITION_JS, "cpu_us_per_delivery": us(cond_js_cpu, cond_n * n)},
        "broadcast_condition_one_at_a_time": {"broadcasts": cond_one_n, "cpu_us_per_delivery": {"none": us(one_cpu_by[0], cond_one_n * n), "condition": us(one_cpu_by[1], cond_one_n * n), "condition_js": us(one_cpu_by[2], cond_one_n * n)}},
        "broadcast_rate_limited": {"broadcasts": limited_n, "rate_limit": LIMIT, "per_s": limited_rate, "cpu_us_per_delivery": us(limited_cpu, limited_n * n), "limiter_waits": limited_waits, "one_at_a_time_same_process": {"broadcasts": free_n, "cpu_us_per_delivery": us(free_cpu, free_n * n), "limiter_waits": free_waits}},
        "idle_rss_kb": idle_rss,
        "rss_after": {"deliveries": s.rss_broadcasts.max(done) * n, "rss_kb": busy_rss, "x_idle": busy_rss as f64 / idle_rss.max(1) as f64},
    }))
}

/// The connect path over TLS, the server alone on CPU 0: TCP and WebSocket
/// with the transport-secured profile (a full connect, then every client
/// reconnecting with its TLS session and its resume ticket), each beside the
/// ideal server doing a TLS accept alone: the connects come in `tls_parts`
/// parts, each beside as many of the ideal's accepts (the side that goes
/// first alternates), as the fast connect does. ECDSA P-256 certificate,
/// TLS 1.3.
async fn tls_inner(me: &Path, bin: &Path, s: &Sizes) -> Result<Value> {
    let n = s.conns;
    let dir = std::env::temp_dir().join(format!("mpush-bench-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem())?;
    std::fs::write(&key, ck.signing_key.serialize_pem())?;
    let (cert_s, key_s) = (cert.display().to_string(), key.display().to_string());
    let env = [
        ("MPUSH__TLS__CERT_FILE", cert_s.as_str()),
        ("MPUSH__TLS__KEY_FILE", key_s.as_str()),
        ("MPUSH__TLS__LISTENERS", "[\"tcp\",\"ws\"]"),
    ];
    let us = |cpu: f64, k: usize| cpu * 1e6 / k.max(1) as f64;
    let parts = s.tls_parts.clamp(1, n.max(1));
    let mut out =
        json!({"conns": n, "certificate": "ECDSA P-256", "protocol": "TLS 1.3", "parts": parts});
    let (mut ideal_sum, mut ideal_held) = (0.0, 0);
    for (t, name) in [(Transport::Tcp, "tcp"), (Transport::Ws, "ws")] {
        eprintln!(
            "cpu: {name} over TLS, transport-secured profile, alternately with the ideal's TLS accepts"
        );
        let server = start_server_with(bin, None, Some("0"), &env).await?;
        let pid = server.child.id().unwrap_or(0);
        let mut ideal = start_ideal_with(me, Some("0"), Some((&cert, &key))).await?;
        let ipid = ideal.proc.pid();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let target = if t == Transport::Ws {
            &server.ws
        } else {
            &server.tcp
        };
        let (mut connect_cpu, mut ideal_cpu) = (0.0, 0.0);
        let (mut done, mut held) = (0, 0);
        let (mut w, mut iw): (Option<Workers>, Option<Workers>) = (None, None);
        for k in 0..parts {
            let part = (k..n).step_by(parts).count();
            for ours in [k % 2 == 0, k % 2 == 1] {
                let (p, addr, kind, first) = if ours {
                    (pid, target, t, done)
                } else {
                    (ipid, &ideal.addr, Transport::Ideal, 0)
                };
                let c = cpu_secs(p);
                let mut more = Workers::start_tls(
                    me,
                    std::slice::from_ref(addr),
                    kind,
                    false,
                    part,
                    first,
                    Some(&cert),
                )
                .await?;
                more.wait("TLS connects", s.timeout, |x| x.bound >= part as u64)
                    .await?;
                if ours {
                    // What the server still does for the last of them.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    connect_cpu += cpu_secs(pid) - c;
                } else {
                    held = ideal_accepted(&mut ideal, done + part, s.timeout).await?;
                    ideal_cpu += cpu_secs(ipid) - c;
                }
                let all = if ours { &mut w } else { &mut iw };
                match all {
                    Some(all) => all.procs.append(&mut more.procs),
                    None => *all = Some(more),
                }
            }
            done += part;
        }
        // The ideal's part is done: it and its clients leave before the
        // reconnects.
        if let Some(iw) = iw {
            iw.quit().await;
        }
        drop(ideal);
        let mut w = w.context("no TLS connections")?;
        let c1 = cpu_secs(pid);
        w.all("reconnect").await?;
        w.wait("TLS fast connects", s.timeout, |x| {
            x.connected >= 2 * n as u64
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let fast_cpu = cpu_secs(pid) - c1;
        let totals = w.totals().await?;
        let tls_resumed =
            scrape(&server.api, "mpush_tls_handshakes_total{kind=\"resumed\"}").await?;
        w.quit().await;
        drop(server);
        ideal_sum += ideal_cpu;
        ideal_held += held;
        out[name] = json!({
            "connect_cpu_us": us(connect_cpu, n),
            "ideal_accept_cpu_us": us(ideal_cpu, held),
            "fast_connect_cpu_us": us(fast_cpu, n),
            "resumed": totals.resumed,
            "tls_resumed": tls_resumed,
        });
    }
    // Both transports' references together.
    out["ideal_accept_cpu_us"] = json!(us(ideal_sum, ideal_held));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(out)
}

/// Reconnect storms: `n` bound clients (the SDK's backoff and jitter, resume
/// tickets) on one node, which is then (1) killed and restarted at once on
/// its ports, with the embedded store (sessions lost: full RSA handshakes)
/// and on Redis (sessions kept: fast connects), and (2) drained in a
/// two-node cluster (its clients redirected to the other node). For each:
/// seconds from the kill (or SIGTERM) until every client is bound again,
/// the CPU of the node that takes them, the connect latency (attempt to
/// bind), and the connections lost on the way.
async fn storm(me: &Path, bin: &Path, s: &Sizes) -> Result<Value> {
    let n = s.storm_conns;
    let redis = start_redis().await?;
    let limit = Duration::from_secs(120);
    let mut out = json!({"conns": n, "concurrency": STORM_CONCURRENCY});
    for (name, clustered) in [("kill_embedded", false), ("kill_redis", true)] {
        eprintln!("storm: {n} clients, node killed and restarted ({name})");
        let cl = clustered.then_some((&redis, "storm-a"));
        let ports = (free_port()?, free_port()?, free_port()?);
        let mut server = start_server_on(bin, cl, None, &[], ports).await?;
        let mut w = Workers::start_storm(me, &server.tcp, n, STORM_CONCURRENCY).await?;
        w.wait("storm: first bind", s.timeout, |t| t.bound_now >= n as i64)
            .await?;
        let before = w.totals().await?;
        w.take_latency();
        let t0 = Instant::now();
        server.child.start_kill()?;
        let _ = server.child.wait().await;
        let again = start_server_on(bin, cl, None, &[], ports).await?;
        let restarted = t0.elapsed().as_secs_f64();
        let pid = again.child.id().unwrap_or(0);
        let t = w
            .wait("storm: every client bound again", limit, |t| {
                t.bound_now >= n as i64
            })
            .await?;
        let secs = t0.elapsed().as_secs_f64();
        let cpu = cpu_secs(pid);
        let fast = scrape(&again.api, "mpush_handshakes_total{kind=\"fast\"}").await?;
        let full = scrape(&again.api, "mpush_handshakes_total{kind=\"full\"}").await?;
        out[name] = json!({
            "seconds_to_all_bound": secs,
            "restart_seconds": restarted,
            "server_cpu_s": cpu,
            "full_handshakes": full,
            "fast_connects": fast,
            "lost": t.lost - before.lost,
            "connect_latency": w.take_latency(),
        });
        w.quit().await;
        drop(again);
    }
    eprintln!("storm: {n} clients, node drained (redirected to the other node)");
    let a = start_server_with(bin, Some((&redis, "storm-da")), None, &[]).await?;
    let b = start_server_with(bin, Some((&redis, "storm-db")), None, &[]).await?;
    // Both nodes see each other before the drain picks where to send clients.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut w = Workers::start_storm(me, &a.tcp, n, STORM_CONCURRENCY).await?;
    w.wait("storm: first bind", s.timeout, |t| t.bound_now >= n as i64)
        .await?;
    let before = w.totals().await?;
    w.take_latency();
    let bpid = b.child.id().unwrap_or(0);
    let c0 = cpu_secs(bpid);
    let t0 = Instant::now();
    let status = tokio::process::Command::new("kill")
        .args(["-TERM", &a.child.id().unwrap_or(0).to_string()])
        .status()
        .await?;
    if !status.success() {
        bail!("storm: could not send SIGTERM to the node");
    }
    let t = w
        .wait("storm: every client bound on the other node", limit, |t| {
            t.bound_now >= n as i64 && t.lost >= before.lost + n as u64
        })
        .await?;
    out["drain_redis"] = json!({
        "seconds_to_all_bound": t0.elapsed().as_secs_f64(),
        "server_cpu_s": cpu_secs(bpid) - c0,
        "lost": t.lost - before.lost,
        "connect_latency": w.take_latency(),
    });
    w.quit().await;
    drop((a, b));
    Ok(out)
}

/// Storm clients connecting at once per worker: no gate, as real clients
/// have none (the kernel's accept queue is what spreads them).
const STORM_CONCURRENCY: usize = 100_000;

/// `count` single-user pushes through `url` at 1,000/s, spread over `users`
/// users; each request is made (and its timestamp taken) when its tick comes.
///
/// Sent from a thread of its own over kept-alive HTTP/1.1 connections
/// (round robin; a thread per connection reads the answers), written to
/// the socket right after the timestamp, as the ideal server's messages
/// are written to its pipe. Through an HTTP client on this process's
/// runtime, each call went through a spawned task and the client's
/// connection task first: two wakes on a core the load clients share, where
/// the scheduler can hold a woken thread for milliseconds, counted in the
/// latency as if the server had taken them.
async fn paced_pushes(url: &str, count: usize, users: usize) -> Result<()> {
    let rest = url
        .strip_prefix("http://")
        .context("paced pushes need an http:// URL")?;
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (host, path) = (host.to_owned(), path.to_owned());
    tokio::task::spawn_blocking(move || paced_pushes_blocking(&host, &path, count, users)).await?
}

/// Connections `paced_pushes` spreads its calls over: one call is usually
/// answered long before the next comes, so this is only for the rare slow one.
const PACED_CONNS: usize = 4;

fn paced_pushes_blocking(host: &str, path: &str, count: usize, users: usize) -> Result<()> {
    use std::io::Write;
    let mut conns = Vec::new();
    let mut readers = Vec::new();
    for c in 0..PACED_CONNS {
        let s = std::net::TcpStream::connect(host)?;
        s.set_nodelay(true)?;
        let r = s.try_clone()?;
        let answers = (c..count).step_by(PACED_CONNS).count();
        readers.push(std::thread::spawn(move || read_answers(r, answers)));
        conns.push(s);
    }
    let start = Instant::now();
    for k in 0..count {
        let at = start + Duration::from_millis(k as u64);
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let body =
            json!({"userId": format!("u{}", (k * 7919) % users.max(1)), "content": stamp(PAYLOAD)})
                .to_string();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        conns[k % PACED_CONNS].write_all(req.as_bytes())?;
    }
    for r in readers {
        r.join()
            .map_err(|_| anyhow::anyhow!("an answer reader panicked"))??;
    }
    Ok(())
}

/// Reads `n` HTTP/1.1 answers (each with a `Content-Length`); any but 200 is an error.
fn read_answers(s: std::net::TcpStream, n: usize) -> Result<()> {
    use std::io::{BufRead, Read};
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut r = std::io::BufReader::new(s);
    for _ in 0..n {
        let mut status = String::new();
        r.read_line(&mut status)?;
        let mut len = 0usize;
        loop {
            let mut line = String::new();
            if r.read_line(&mut line)? == 0 {
                bail!("the API closed the connection");
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse()?;
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body)?;
        if status.split_whitespace().nth(1) != Some("200") {
            bail!("push: {} {}", status.trim(), String::from_utf8_lossy(&body));
        }
    }
    Ok(())
}

/// `count` messages through the ideal server at 1,000/s, each to the next
/// connection, stamped here as `paced_pushes` stamps its API calls (the
/// ideal reads a command line where the server reads an HTTP request).
async fn paced_ideal(ideal: &mut Ideal, count: usize) -> Result<()> {
    let Proc { stdin, lines, .. } = &mut ideal.proc;
    let send = async {
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        for _ in 0..count {
            tick.tick().await;
            stdin
                .write_all(format!("send {}\n", stamp(PAYLOAD)).as_bytes())
                .await?;
            stdin.flush().await?;
        }
        anyhow::Ok(())
    };
    // Its answers are read as they come: a full pipe would hold it up.
    let answers = async {
        for _ in 0..count {
            let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .context("the ideal server stopped answering")??
                .context("the ideal server ended")?;
            let v: Value = serde_json::from_str(&line)?;
            if v["sent"] != 1 {
                bail!("the ideal server did not send: {line}");
            }
        }
        anyhow::Ok(())
    };
    tokio::try_join!(send, answers)?;
    Ok(())
}

/// The trace events these servers dropped (their trace writers fell
/// behind), said on stderr when there are any.
async fn trace_events_dropped<'a>(
    phase: &str,
    apis: impl IntoIterator<Item = &'a str>,
) -> Result<f64> {
    let mut dropped = 0.0;
    for api in apis {
        dropped += scrape(api, "mpush_trace_events_dropped_total ").await?;
    }
    if dropped > 0.0 {
        eprintln!("{phase}: {dropped} trace events dropped");
    }
    Ok(dropped)
}

/// One series' value from the server's `/metrics` (0 when absent).
async fn scrape(api: &str, series: &str) -> Result<f64> {
    let text = reqwest::get(format!("{api}/metrics")).await?.text().await?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0))
}

/// The server's histograms of its own time per single push, cumulative as
/// Prometheus renders them: (`what le=<bound>`, pushes at or under it).
/// `api`: from its headers read to its answer; `write`: from its acceptance
/// to its write on the client's socket.
async fn server_buckets(api: &str) -> Result<Vec<(String, f64)>> {
    let text = reqwest::get(format!("{api}/metrics")).await?.text().await?;
    let series = [
        (
            "api",
            "mpush_api_request_duration_seconds_bucket{route=\"push\",le=\"",
        ),
        ("write", "mpush_push_write_delay_seconds_bucket{le=\""),
    ];
    Ok(text
        .lines()
        .filter_map(|l| {
            let (what, rest) = series
                .iter()
                .find_map(|(what, p)| Some((*what, l.strip_prefix(p)?)))?;
            let (le, rest) = rest.split_once('"')?;
            let n = rest.trim_start_matches('}').trim().parse().ok()?;
            Some((format!("{what} le={le}"), n))
        })
        .collect())
}

/// `k` broadcasts back to back to `n` connections, waiting for every copy.
async fn broadcast_n(
    w: &mut Workers,
    http: &reqwest::Client,
    url: &str,
    s: &Sizes,
    n: usize,
    k: usize,
) -> Result<(f64, Value)> {
    broadcast_n_with(w, http, url, s, n, k, None).await
}

/// A condition every load client passes (they bind as `u<n>` from
/// "android"): comparisons and a regex over the client's fields.
const BENCH_CONDITION: &str =
    r#"osName == "android" && userId != "nobody" && str::regex_matches(userId, "^u")"#;

/// The same in mpush's JavaScript forms (what backends moving from Java
/// mpush send): string methods, a regex literal, a null-safe tags test.
const BENCH_CONDITION_JS: &str = r#"(!tags || tags.indexOf("blocked") < 0) && osName.toLowerCase() == "android" && /^u\d+$/.test(userId)"#;

/// `k` broadcasts back to back, each with `condition` when given.
async fn broadcast_n_with(
    w: &mut Workers,
    http: &reqwest::Client,
    url: &str,
    s: &Sizes,
    n: usize,
    k: usize,
    condition: Option<&str>,
) -> Result<(f64, Value)> {
    let send = async {
        for _ in 0..k {
            let mut body = json!({"content": stamp(PAYLOAD)});
            if let Some(c) = condition {
                body["condition"] = json!(c);
            }
            post(http, url, body).await?;
        }
        Ok(())
    };
    measure(w, "broadcast deliveries", s.timeout, k * n, send).await
}

const NODE_IDS: [&str; 6] = ["A", "B", "C", "D", "E", "F"];

/// Scenario 4 at a scale: `broadcasts` broadcasts to `n` connections over
/// `nodes` server processes (a cluster on Redis when more than one: the
/// broadcast crosses nodes), and the same over as many ideal processes.
async fn broadcast_at(me: &Path, bin: &Path, s: &Sizes, n: usize, nodes: usize) -> Result<Value> {
    let redis = if nodes > 1 {
        Some(start_redis().await?)
    } else {
        None
    };
    let mut servers = Vec::new();
    for id in NODE_IDS.iter().take(nodes) {
        servers.push(start_server(bin, redis.as_ref().map(|r| (r, *id))).await?);
    }
    let targets: Vec<String> = servers.iter().map(|x| x.tcp.clone()).collect();
    let mut w = Workers::start(me, &targets, Transport::Tcp, false, n, 0).await?;
    w.wait("bind", s.timeout, |t| t.bound >= n as u64).await?;
    // Every node must see the others before a broadcast fans out to them.
    tokio::time::sleep(Duration::from_millis(if nodes > 1 { 2000 } else { 200 })).await;
    let http = reqwest::Client::new();
    let (per_s, latency) = broadcast(&mut w, &http, &servers[0].api, s, n).await?;
    w.quit().await;
    drop(servers);
    drop(redis);

    let mut ideals = Vec::new();
    for _ in 0..nodes {
        ideals.push(start_ideal(me).await?);
    }
    let addrs: Vec<String> = ideals.iter().map(|i| i.addr.clone()).collect();
    let mut iw = Workers::ideal(me, &addrs, n).await?;
    iw.wait("ideal connections", s.timeout, |t| t.bound >= n as u64)
        .await?;
    let want = Workers::split(n, ideals.len());
    let mut held = 0;
    for (i, w) in ideals.iter_mut().zip(want) {
        held += ideal_accepted(i, w, s.timeout).await?;
    }
    let cmd = format!("broadcast {} {PAYLOAD}", s.broadcasts);
    let send = async {
        futures_util::future::try_join_all(ideals.iter_mut().map(|i| i.proc.ask(&cmd, s.timeout)))
            .await
            .map(drop)
    };
    let (ideal_per_s, ideal_latency) = measure(
        &mut iw,
        "ideal broadcast",
        s.timeout,
        s.broadcasts * held,
        send,
    )
    .await?;
    iw.quit().await;
    Ok(json!({
        "conns": n,
        "nodes": nodes,
        "broadcasts": s.broadcasts,
        "per_s": per_s,
        "latency": latency,
        "ideal_per_s": ideal_per_s,
        "ideal_latency": ideal_latency,
    }))
}

/// Redis's `used_memory`, in bytes.
async fn redis_used_memory(redis: &Redis) -> Result<u64> {
    let client = redis::Client::open(redis.url.as_str())?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO").arg("memory").query_async(&mut c).await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0))
}

/// The cost curve: for each step of `s.curve` connections over
/// `s.curve_nodes` node processes on one Redis, what one more connection
/// costs (each node's RSS, Redis memory: routes and sessions), what a
/// broadcast to all of them costs (time, server CPU per delivery), and the
/// latency of single-user pushes at 1,000/s through one node's API (most
/// cross to another node). The shape to reach: per-connection cost flat,
/// broadcast cost linear in the recipients.
async fn curve(me: &Path, bin: &Path, s: &Sizes) -> Result<Value> {
    let mut steps = Vec::new();
    for &n in &s.curve {
        let nodes = s.curve_nodes;
        eprintln!("curve: {n} connections on {nodes} node processes and one Redis");
        let redis = start_redis().await?;
        let mut servers = Vec::new();
        for id in NODE_IDS.iter().take(nodes) {
            servers.push(start_server(bin, Some((&redis, *id))).await?);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let pids: Vec<u32> = servers.iter().map(|x| x.child.id().unwrap_or(0)).collect();
        let rss0: Vec<u64> = pids.iter().map(|p| rss_kb(*p)).collect();
        let redis0 = redis_used_memory(&redis).await?;
        let targets: Vec<String> = servers.iter().map(|x| x.tcp.clone()).collect();
        let per_node = Workers::split(n, nodes);
        let mut w = Workers::start(me, &targets, Transport::Tcp, false, n, 0).await?;
        w.wait("bind", s.timeout, |t| t.bound >= n as u64).await?;
        // Every node must see the others before a broadcast fans out.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let rss: Vec<f64> = pids
            .iter()
            .zip(&rss0)
            .zip(&per_node)
            .map(|((p, r0), k)| (rss_kb(*p).saturating_sub(*r0) * 1024) as f64 / (*k).max(1) as f64)
            .collect();
        let redis_bytes = redis_used_memory(&redis).await?.saturating_sub(redis0) as f64 / n as f64;
        let http = reqwest::Client::new();
        // One broadcast at a time, `s.broadcasts` times.
        let cpu0: f64 = pids.iter().map(|p| cpu_secs(*p)).sum();
        let url = format!("{}/api/v1/broadcast", servers[0].api);
        let mut one = Vec::new();
        for _ in 0..s.broadcasts {
            let t0 = Instant::now();
            broadcast_n(&mut w, &http, &url, s, n, 1).await?;
            one.push(t0.elapsed().as_secs_f64());
        }
        let cpu_b: f64 = pids.iter().map(|p| cpu_secs(*p)).sum::<f64>() - cpu0;
        one.sort_by(f64::total_cmp);
        // Single-user pushes at 1,000/s through node A.
        let url = format!("{}/api/v1/push", servers[0].api);
        let pushes = s.tail_secs.min(3) as usize * 1000;
        let send = paced_pushes(&url, pushes, n);
        let (_, unicast) =
            measure(&mut w, "curve: unicast at 1000/s", s.timeout, pushes, send).await?;
        w.quit().await;
        drop(servers);
        steps.push(json!({
            "conns": n,
            "nodes": nodes,
            "rss_bytes_per_conn": rss,
            "rss_bytes_per_conn_mean": rss.iter().sum::<f64>() / rss.len().max(1) as f64,
            "redis_bytes_per_conn": redis_bytes,
            "broadcast_seconds_median": one.get(one.len() / 2).copied().unwrap_or(0.0),
            "broadcast_cpu_us_per_delivery": cpu_b * 1e6 / (s.broadcasts * n).max(1) as f64,
            "unicast_1000_per_s": unicast,
        }));
    }
    Ok(json!(steps))
}

/// Scenario 5: three nodes on one Redis; the clients on B and C, every push
/// through A's batch API, so each one crosses nodes.
async fn cluster_unicast(me: &Path, bin: &Path, s: &Sizes) -> Result<Value> {
    let redis = start_redis().await?;
    let mut servers = Vec::new();
    for id in ["A", "B", "C"] {
        servers.push(start_server(bin, Some((&redis, id))).await?);
    }
    let targets = vec![servers[1].tcp.clone(), servers[2].tcp.clone()];
    let mut w = Workers::start(me, &targets, Transport::Tcp, false, s.conns, 0).await?;
    let n = s.conns as u64;
    w.wait("bind", s.timeout, |t| t.bound >= n).await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let http = reqwest::Client::new();
    // What the phase leaves in Redis is its traces (routes and sessions are
    // there before it): each message's record, kept for the trace TTL.
    let redis0 = redis_used_memory(&redis).await?;
    let (messages, per_s, latency) = batch_unicast(&mut w, &http, &servers[0].api, s).await?;
    let trace_bytes =
        redis_used_memory(&redis).await?.saturating_sub(redis0) as f64 / messages.max(1) as f64;
    let dropped = trace_events_dropped("cluster", servers.iter().map(|s| s.api.as_str())).await?;
    w.quit().await;
    Ok(json!({
        "nodes": 3, "conns": s.conns, "messages": messages, "per_s": per_s, "latency": latency,
        "redis_trace_bytes_per_message": trace_bytes, "trace_events_dropped": dropped,
    }))
}

/// The ideal server's unicast and broadcast rates on the same connections.
async fn ideal_delivery(
    ideal: &mut Ideal,
    w: &mut Workers,
    s: &Sizes,
    held: usize,
) -> Result<Value> {
    let cmd = format!("unicast {} {PAYLOAD}", s.batch_msgs);
    let (unicast, unicast_latency) = measure(w, "ideal unicast", s.timeout, s.batch_msgs, async {
        ideal.proc.ask(&cmd, s.timeout).await.map(drop)
    })
    .await?;
    let cmd = format!("broadcast {} {PAYLOAD}", s.broadcasts);
    let (broadcast, broadcast_latency) = measure(
        w,
        "ideal broadcast",
        s.timeout,
        s.broadcasts * held,
        async { ideal.proc.ask(&cmd, s.timeout).await.map(drop) },
    )
    .await?;
    Ok(json!({
        "unicast": {"per_s": unicast, "latency": unicast_latency},
        "broadcast": {"per_s": broadcast, "latency": broadcast_latency},
    }))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn print_report(r: &Value) {
    let ideal = &r["ideal"];
    println!(
        "\n== mpush-bench ({} connections{}) ==",
        r["conns"],
        if r["quick"] == true { ", quick" } else { "" }
    );
    println!(
        "ideal server: {:.0} B per idle connection",
        f(&ideal["bytes_per_conn"])
    );
    println!(
        "{:<12} {:>12} {:>10} {:>14} {:>16}",
        "connections", "B/conn", "x ideal", "handshakes/s", "fast connects/s"
    );
    for c in r["connections"].as_array().into_iter().flatten() {
        let b = f(&c["bytes_per_conn"]);
        println!(
            "{:<12} {:>12.0} {:>10.2} {:>14.0} {:>16.0}",
            format!(
                "{}/{}",
                c["transport"].as_str().unwrap_or("?"),
                c["profile"].as_str().unwrap_or("?")
            ),
            b,
            ratio(b, f(&ideal["bytes_per_conn"])),
            f(&c["handshakes_per_s"]),
            f(&c["fast_connects_per_s"]),
        );
    }
    let d = &r["delivery"];
    let lat = |v: &Value| {
        format!(
            "p50 {} us, p99 {} us, p999 {} us",
            v["p50_us"], v["p99_us"], v["p999_us"]
        )
    };
    let iu = f(&ideal["delivery"]["unicast"]["per_s"]);
    let ib = f(&ideal["delivery"]["broadcast"]["per_s"]);
    println!(
        "unicast, batch API: {:.0} msg/s ({:.2} x ideal {:.0}), server CPU {:.2} us per message; {}",
        f(&d["batch"]["per_s"]),
        ratio(f(&d["batch"]["per_s"]), iu),
        iu,
        f(&d["batch"]["cpu_us_per_message"]),
        lat(&d["batch"]["latency"])
    );
    println!(
        "unicast, single API: {:.0} msg/s ({:.2} x ideal); {}",
        f(&d["single"]["per_s"]),
        ratio(f(&d["single"]["per_s"]), iu),
        lat(&d["single"]["latency"])
    );
    println!(
        "unicast, paced at {}/s for {} s: {}",
        d["paced"]["rate"],
        d["paced"]["seconds"],
        lat(&d["paced"]["latency"])
    );
    println!(
        "broadcast: {:.0} msg/s ({:.2} x ideal {:.0}); {}",
        f(&d["broadcast"]["per_s"]),
        ratio(f(&d["broadcast"]["per_s"]), ib),
        ib,
        lat(&d["broadcast"]["latency"])
    );
    for b in r["broadcast_scale"].as_array().into_iter().flatten() {
        println!(
            "broadcast to {} connections on {} process(es): {:.0} msg/s ({:.2} x ideal {:.0}); {}",
            b["conns"],
            b["nodes"],
            f(&b["per_s"]),
            ratio(f(&b["per_s"]), f(&b["ideal_per_s"])),
            f(&b["ideal_per_s"]),
            lat(&b["latency"])
        );
    }
    let c = &r["cluster"];
    println!(
        "cluster, 3 nodes, every push crossing nodes: {:.0} msg/s ({:.2} x ideal unicast); {}; Redis {:.0} B per message traced",
        f(&c["per_s"]),
        ratio(f(&c["per_s"]), iu),
        lat(&c["latency"]),
        f(&c["redis_trace_bytes_per_message"])
    );
    let c = &r["cpu"];
    if !c.is_null() {
        println!(
            "server on one core, {} connections: handshake {:.0} us, fast connect {:.1} us ({:.0}/core-s), close {:.1} us; broadcast CPU/delivery {:.2} us back to back (ideal {:.2}), {:.2} us one at a time alone, {:.2} us alternating (ideal {:.2}), {:.2} us rate-limited; RSS {} KB idle, {:.2}x after {} deliveries",
            c["conns"],
            f(&c["handshake_cpu_us"]),
            f(&c["fast_connect_cpu_us"]),
            f(&c["fast_connects_per_core_s"]),
            f(&c["close_cpu_us"]),
            f(&c["broadcast_back_to_back"]["cpu_us_per_delivery"]),
            f(&c["ideal_back_to_back_cpu_us_per_delivery"]),
            f(&c["broadcast_one_at_a_time"]["cpu_us_per_delivery"]),
            f(&c["one_at_a_time_alternating"]["cpu_us_per_delivery"]),
            f(&c["ideal_one_at_a_time_cpu_us_per_delivery"]),
            f(&c["broadcast_rate_limited"]["cpu_us_per_delivery"]),
            c["idle_rss_kb"],
            f(&c["rss_after"]["x_idle"]),
            c["rss_after"]["deliveries"],
        );
    }
    for u in r["upstream"].as_array().into_iter().flatten() {
        println!(
            "up-push to {}: {:.0} accepted/s, {:.0}/s at the backend; push -> ACK p50 {} us, p99 {} us, p999 {} us",
            u["sink"].as_str().unwrap_or(""),
            u["accepted_per_s"].as_f64().unwrap_or(0.0),
            u["delivered_per_s"].as_f64().unwrap_or(0.0),
            u["p50_us"],
            u["p99_us"],
            u["p999_us"],
        );
    }
}

/// The command that regenerates the report.
pub fn command(quick: bool) -> String {
    format!(
        "cargo build --release -p mpush-server -p mpush-bench\ntarget/release/mpush-bench run{} --report BENCHMARKS.md",
        if quick { " --quick" } else { "" }
    )
}

pub async fn run(a: RunArgs) -> Result<()> {
    REBIND.store(a.rebind, std::sync::atomic::Ordering::Relaxed);
    let me = std::env::current_exe()?;
    let bin = match &a.server_bin {
        Some(b) => b.clone(),
        None => me.with_file_name("mpush-server"),
    };
    if !bin.exists() {
        bail!(
            "no server binary at {} (cargo build --release -p mpush-server, or --server-bin)",
            bin.display()
        );
    }
    let s = if a.quick {
        Sizes {
            conns: a.conns.unwrap_or(500),
            settle: Duration::ZERO,
            batch_msgs: 5_000,
            single_msgs: 1_000,
            paced_rate: 2_000,
            paced_secs: 1,
            broadcasts: 3,
            cpu_broadcasts: 4,
            rss_broadcasts: 8,
            scale: vec![(200, 1), (600, 3)],
            timeout: Duration::from_secs(60),
            up_conns: 20,
            up_msgs: 2_000,
            tail_secs: 1,
            rsa_ops: 100,
            storm_conns: 300,
            curve: vec![300, 900],
            curve_nodes: 2,
            fast_parts: a.fast_parts.into(),
            tls_parts: a.tls_parts.into(),
        }
    } else {
        Sizes {
            conns: a.conns.unwrap_or(10_000),
            settle: Duration::from_secs(75),
            batch_msgs: 200_000,
            single_msgs: 20_000,
            paced_rate: 20_000,
            paced_secs: 3,
            broadcasts: 20,
            cpu_broadcasts: 50,
            rss_broadcasts: 150,
            scale: vec![(1_000, 1), (10_000, 1), (50_000, 3)],
            timeout: Duration::from_secs(300),
            up_conns: 200,
            up_msgs: 200_000,
            tail_secs: 10,
            rsa_ops: 2_000,
            storm_conns: 19_000,
            curve: vec![10_000, 50_000, 100_000],
            curve_nodes: 6,
            fast_parts: a.fast_parts.into(),
            tls_parts: a.tls_parts.into(),
        }
    };
    let started = Instant::now();
    let want = |g: &str| a.only.is_empty() || a.only.iter().any(|o| o == g);
    // Fail before the first scenario, not minutes into the run, when a
    // scenario that starts its own Redis cannot.
    let need_redis: Vec<&str> = ["scale", "cluster", "curve", "storm"]
        .into_iter()
        .filter(|g| want(g))
        .collect();
    if !need_redis.is_empty() {
        let found = std::process::Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|st| st.success());
        if !found {
            bail!(
                "redis-server is not on PATH; the {} scenario(s) start their own \
                 (apt-get install redis-server), or leave them out with \
                 --only ideal,connections,delivery,cpu,upstream",
                need_redis.join(", ")
            );
        }
    }
    let (mut ideal_bytes, mut ideal_delivery_v) = (0.0, Value::Null);
    if want("ideal") {
        eprintln!("ideal server: {} connections", s.conns);
        let (mut ideal, mut iw, bytes, held) = ideal_memory(&me, &s).await?;
        ideal_bytes = bytes;
        ideal_delivery_v = ideal_delivery(&mut ideal, &mut iw, &s, held).await?;
        iw.quit().await;
        drop(ideal);
    }
    let mut conns = Vec::new();
    if want("connections") {
        for (t, legacy) in [
            (Transport::Tcp, false),
            (Transport::Tcp, true),
            (Transport::Ws, false),
            (Transport::Ws, true),
        ] {
            eprintln!(
                "connections: {t:?} {}",
                if legacy { "legacy" } else { "v2" }
            );
            conns.push(connections(&me, &bin, &s, t, legacy).await?);
        }
    }
    let mut delivery_v = Value::Null;
    if want("delivery") {
        eprintln!("delivery: unicast and broadcast");
        delivery_v = delivery(&me, &bin, &s).await?;
    }
    let mut scale = Vec::new();
    if want("scale") {
        for &(n, nodes) in &s.scale {
            eprintln!("broadcast: {n} connections on {nodes} server process(es)");
            scale.push(broadcast_at(&me, &bin, &s, n, nodes).await?);
        }
    }
    let mut cluster = Value::Null;
    if want("cluster") {
        eprintln!("cluster: cross-node unicast");
        cluster = cluster_unicast(&me, &bin, &s).await?;
    }
    let mut cpu_v = Value::Null;
    if want("cpu") {
        eprintln!("cpu: server on one core, {} connections", s.conns);
        cpu_v = cpu(&me, &bin, &s).await?;
    }
    let mut curve_v = Value::Null;
    if want("curve") {
        curve_v = curve(&me, &bin, &s).await?;
    }
    let mut storm_v = Value::Null;
    if want("storm") {
        storm_v = storm(&me, &bin, &s).await?;
    }
    let mut upstream_v = Value::Null;
    if want("upstream") {
        eprintln!("upstream: up-pushes to the sinks");
        upstream_v = upstream::upstream(&bin, &s).await?;
    }
    let ideal_delivery = ideal_delivery_v;
    let delivery = delivery_v;
    let report = json!({
        "quick": a.quick,
        "conns": s.conns,
        "seconds": started.elapsed().as_secs_f64(),
        "ideal": {"bytes_per_conn": ideal_bytes, "delivery": ideal_delivery},
        "connections": conns,
        "delivery": delivery,
        "broadcast_scale": scale,
        "cluster": cluster,
        "cpu": cpu_v,
        "upstream": upstream_v,
        "storm": storm_v,
        "curve": curve_v,
    });
    print_report(&report);
    println!("\ntargets:");
    for t in crate::report::targets(&report) {
        println!("  {:<60} {:>14} {}", t.name, t.shown(), t.verdict());
    }
    if let Some(md) = &a.report {
        crate::report::write(&report, md, &command(a.quick))?;
        eprintln!("report: {}", md.display());
    }
    if let Some(p) = &a.json {
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
        eprintln!("figures: {}", p.display());
    }
    println!(
        "mpush-bench: done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A start whose process exited is tried again on other ports, twice at
    /// most; any other failure is not.
    #[tokio::test]
    async fn a_process_that_exited_at_start_is_started_again_twice_at_most() {
        let calls = std::cell::Cell::new(0);
        let exits = |ok_on: u32| {
            let calls = &calls;
            move || async move {
                calls.set(calls.get() + 1);
                if calls.get() < ok_on {
                    Err(ExitedAtStart("redis-server (port 1)".into()).into())
                } else {
                    Ok(calls.get())
                }
            }
        };
        assert_eq!(on_free_ports(exits(3)).await.expect("third start"), 3);
        calls.set(0);
        let e = on_free_ports(exits(4)).await.expect_err("gives up");
        assert!(e.is::<ExitedAtStart>(), "{e}");
        assert_eq!(calls.get(), 3);
        calls.set(0);
        let other = on_free_ports(|| async {
            calls.set(calls.get() + 1);
            Err::<(), _>(anyhow::anyhow!("did not answer /healthz"))
        })
        .await;
        assert!(other.is_err());
        assert_eq!(calls.get(), 1, "not an exit: not tried again");
    }

    #[test]
    fn free_ports_are_below_the_ephemeral_range_and_differ() {
        let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse().ok())
            .unwrap_or(32_768);
        let ports: Vec<u16> = (0..50).map(|_| free_port().expect("a port")).collect();
        if low > 11_000 {
            assert!(ports.iter().all(|p| *p < low), "{ports:?}");
        }
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    }
}
