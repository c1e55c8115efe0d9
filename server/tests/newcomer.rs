//! What a newcomer and an operator see of a real `mpush-server` process: the
//! series the shipped Grafana dashboard and the docs name exist on a fresh
//! node, the banner names the node and what its first curl needs, a second
//! node on the same host is told which setting to change, logs written to a
//! file carry no colour codes, a refused bind is logged with its reason, and
//! `token` / `config check` refuse what the server would refuse.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Redis, TestClient, Via, device, free_port};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mpush-server"))
}

/// A server process: its banner (stdout up to the first curl) and its
/// stderr, collected by a thread; killed on drop.
struct Proc {
    child: Child,
    banner: String,
    stderr: std::sync::Arc<parking_lot::Mutex<String>>,
}

impl Proc {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Result<Self, String> {
        let mut c = bin();
        c.args(args)
            .env("MPUSH__NET__DEMO_DIR", "")
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("starts");
        let stderr = std::sync::Arc::new(parking_lot::Mutex::new(String::new()));
        let mut err = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            let mut banner = String::new();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                banner.push_str(&line);
                banner.push('\n');
                if line.contains("-d '{") {
                    let _ = tx.send(banner.clone());
                }
            }
            let _ = tx.send(banner);
        });
        let banner = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
        if !banner.contains("-d '{") {
            let _ = child.kill();
            let _ = child.wait();
            std::thread::sleep(Duration::from_millis(200));
            return Err(format!("{banner}{}", stderr.lock()));
        }
        Ok(Self {
            child,
            banner,
            stderr,
        })
    }

    /// `start` from a tokio test: on the blocking pool (it waits for the
    /// banner), not on the runtime's worker.
    async fn start_off_runtime(args: &[&str], env: &[(&str, &str)]) -> Result<Self, String> {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        let args = own(args);
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        tokio::task::spawn_blocking(move || {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            let e: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            Self::start(&a, &e)
        })
        .await
        .expect("join")
    }

    /// The address after `label` in the banner.
    fn addr(&self, label: &str) -> String {
        let line = self
            .banner
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label} in {}", self.banner));
        let a = line.trim_start()[label.len()..].split_whitespace().next();
        a.unwrap_or_default()
            .trim_start_matches("http://")
            .trim_start_matches("ws://")
            .trim_end_matches('/')
            .to_owned()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const LOCAL: &[&str] = &[
    "--tcp",
    "127.0.0.1:0",
    "--ws",
    "127.0.0.1:0",
    "--http",
    "127.0.0.1:0",
];

/// The metric names (series without labels) a Prometheus text page has.
fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// `mpush_*` names in `text` (the dashboard's queries, a README).
fn names_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("mpush_") {
        let n: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        out.insert(n);
    }
    out
}

/// Every series the shipped Grafana dashboard queries, and every metric the
/// server README names, is on `/metrics` of a node that has served nothing
/// yet (zero-valued), so panels are not empty and `rate(x) > 0` alerts can
/// tell "none" from "missing".
#[test]
fn the_dashboard_and_the_docs_find_every_series_on_a_fresh_node() {
    let p = Proc::start(LOCAL, &[]).expect("starts");
    let http = p.addr("HTTP API");
    let text = reqwest::blocking::get(format!("http://{http}/metrics"))
        .expect("scrape")
        .text()
        .expect("text");
    let have = series(&text);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("docs/ops/grafana-dashboard.json")).expect("dashboard"),
    )
    .expect("JSON");
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().into_iter().flatten() {
            queried.extend(names_in(t["expr"].as_str().unwrap_or("")));
        }
    }
    assert!(queried.len() >= 30, "the dashboard queries: {queried:?}");
    let missing: Vec<_> = queried.iter().filter(|n| !have.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries series a fresh node does not have: {missing:?}"
    );
    let readme = std::fs::read_to_string(root.join("server/README.md")).expect("README");
    // `mpush_server` is the crate (RUST_LOG=mpush_server=debug), not a metric.
    let documented: BTreeSet<String> = names_in(&readme)
        .into_iter()
        .filter(|n| n != "mpush_server" && n != "mpush_")
        .collect();
    let missing: Vec<_> = documented
        .iter()
        .filter(|n| {
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n);
            !have.contains(*n) && !have.contains(&format!("{base}_bucket"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "server/README.md names metrics a fresh node does not have: {missing:?}"
    );
    // Every catalogued metric, not just those the docs name.
    for (name, ..) in mpush_server::telemetry::CATALOG {
        assert!(
            have.contains(*name) || have.contains(&format!("{name}_bucket")),
            "{name} is not on a fresh node's /metrics"
        );
    }
    println!(
        "{} series on a fresh node; the dashboard queries {}, the README names {}: all present",
        have.len(),
        queried.len(),
        documented.len()
    );
}

/// The banner names the node (and, in a cluster, its node port); a second
/// node on the same host that would take the same node port stops with an
/// error naming `cluster.internal` and `--node-port`; logs on a pipe carry
/// no colour codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_on_one_host_is_told_which_setting_to_change() {
    let redis = Redis::start(free_port()).await;
    let url = redis.url();
    let node_port = format!("127.0.0.1:{}", free_port());
    let mut args = LOCAL.to_vec();
    args.extend([
        "--redis",
        &url,
        "--node-id",
        "node-a",
        "--node-port",
        &node_port,
    ]);
    let first = Proc::start_off_runtime(&args, &[])
        .await
        .expect("the first node starts");
    assert!(first.banner.contains("(node node-a)"), "{}", first.banner);
    assert!(
        first
            .banner
            .contains(&format!("Node port          {node_port}")),
        "{}",
        first.banner
    );
    let n = args.len();
    args[n - 3] = "node-b";
    let second = Proc::start_off_runtime(&args, &[]).await;
    let Err(out) = second else {
        panic!("a second node on the same node port started")
    };
    for needle in [
        "cluster.internal",
        "--node-port",
        "the node port",
        &node_port,
    ] {
        assert!(out.contains(needle), "{needle} not in: {out}");
    }
    let logs = first.stderr.lock().clone();
    assert!(
        !logs.contains('\u{1b}'),
        "colour codes in piped logs: {logs:?}"
    );
    drop(first);
}

/// A gateway port in use names its setting and flag too.
#[test]
fn a_port_in_use_names_the_setting_and_the_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = taken.local_addr().expect("addr").to_string();
    let Err(out) = Proc::start(&["--tcp", &a, "--ws", "", "--http", "127.0.0.1:0"], &[]) else {
        panic!("started on a taken port")
    };
    for needle in ["net.tcp", "--tcp", "the TCP gateway", &a] {
        assert!(out.contains(needle), "{needle} not in: {out}");
    }
}

/// With API tokens, the banner's first curl carries the header it needs
/// (the token itself is never printed); the API refuses a call without it.
#[test]
fn with_api_tokens_the_banner_curl_has_the_authorization_header() {
    let token = "api-token-0123456789abcdef0123456789";
    let p = Proc::start(
        LOCAL,
        &[("MPUSH__SECURITY__API_TOKENS", &format!("[\"{token}\"]"))],
    )
    .expect("starts");
    assert!(
        p.banner.contains("authorization: Bearer $MPUSH_API_TOKEN"),
        "{}",
        p.banner
    );
    assert!(!p.banner.contains(token), "{}", p.banner);
    // The banner's curl, run as printed with the variable set, is accepted.
    let curl: String = p
        .banner
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("curl"))
        .map(|l| l.trim().trim_end_matches('\\').to_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("sh")
        .arg("-c")
        .arg(&curl)
        .env("MPUSH_API_TOKEN", token)
        .output()
        .expect("curl runs");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("\"traceId\""), "{curl}: {body}");
}

/// A refused bind is logged at the default level with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_bind_is_logged_with_its_reason() {
    let secret = "jwt-secret-0123456789abcdef0123456789";
    let p = Proc::start_off_runtime(LOCAL, &[("MPUSH__SECURITY__JWT_SECRET", secret)])
        .await
        .expect("starts");
    let tcp: std::net::SocketAddr = p.addr("TCP gateway").parse().expect("addr");
    let mut c = TestClient::connect_to(tcp, Via::Tcp, true, device("bad-1", "android"), None).await;
    c.connected().await;
    c.bind_with_token("mallory", "", "not-a-token").await;
    c.wait_for("a refused bind closes", |e| {
        matches!(e, mpush_protocol::client::ClientEvent::Closed { .. })
    })
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let logs = p.stderr.lock().clone();
        if logs.contains("bind refused") {
            assert!(
                logs.contains("mallory") && logs.contains("reason"),
                "{logs}"
            );
            assert!(
                !logs.contains("not-a-token"),
                "the token was logged: {logs}"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not logged: {logs}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `token` refuses a secret the server refuses at start.
#[test]
fn token_refuses_a_secret_the_server_refuses() {
    let out = bin()
        .args(["token", "--user", "alice"])
        .env("MPUSH__SECURITY__JWT_SECRET", "short-secret")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "minted with a weak secret");
    assert!(err.contains("jwt_secret needs 32 characters"), "{err}");
    assert!(out.stdout.is_empty());
}

/// `config check` refuses settings that disagree with each other.
#[test]
fn config_check_refuses_settings_that_disagree() {
    let dir = std::env::temp_dir().join(format!("mpush-xfield-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for (toml, needle) in [
        (
            "[delivery]\nack_waits_ms = [2000]\nack_retries = 3\n",
            "delivery.ack_retries = 3",
        ),
        (
            "[delivery]\nack_waits_ms = [1, 1, 1]\n",
            "100 ms to 600000 ms",
        ),
        (
            "[delivery]\nack_waits_ms = [1000, 2000, 3000, 4000, 5000]\n",
            "give 3 or 4",
        ),
        (
            "[net]\nws = \"0.0.0.0:8088\"\ndev_loopback_transport = true\n",
            "net.dev_loopback_transport",
        ),
    ] {
        let f = dir.join("c.toml");
        std::fs::write(&f, toml).expect("write");
        let out = bin()
            .args(["config", "check"])
            .arg(&f)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "accepted: {toml}");
        assert!(err.contains(needle), "{toml}: {err}");
    }
    let f = dir.join("ok.toml");
    std::fs::write(
        &f,
        "[delivery]\nack_waits_ms = [2000, 4000, 6000]\nack_retries = 3\n",
    )
    .expect("write");
    let out = bin()
        .args(["config", "check"])
        .arg(&f)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A CORS preflight the API will not allow is a JSON 403 that says why.
#[test]
fn a_refused_preflight_is_json_that_says_why() {
    let p = Proc::start(
        LOCAL,
        &[("MPUSH__SECURITY__CORS_ORIGINS", "[\"https://app.example\"]")],
    )
    .expect("starts");
    let http = p.addr("HTTP API");
    let c = reqwest::blocking::Client::new();
    let ask = |origin: &str, method: &str, headers: &str| {
        let r = c
            .request(
                reqwest::Method::OPTIONS,
                format!("http://{http}/api/v1/push"),
            )
            .header("origin", origin)
            .header("access-control-request-method", method)
            .header("access-control-request-headers", headers)
            .send()
            .expect("answers");
        let st = r.status().as_u16();
        let allow = r
            .headers()
            .get("access-control-allow-origin")
            .map(|v| v.to_str().unwrap_or("").to_owned());
        (st, allow, r.text().unwrap_or_default())
    };
    let (st, _, body) = ask("https://evil.example", "POST", "content-type");
    assert_eq!(st, 403, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("security.cors_origins"),
        "{v}"
    );
    let (st, _, body) = ask("https://app.example", "PATCH", "content-type");
    assert_eq!(st, 403, "{body}");
    let (st, allow, body) = ask(
        "https://app.example",
        "POST",
        "content-type,authorization,idempotency-key",
    );
    assert_eq!(
        (st, allow.as_deref()),
        (200, Some("https://app.example")),
        "{body}"
    );
}

/// A configured sink's series carry its name from start, at zero.
#[test]
fn a_configured_sink_has_its_labelled_series_from_start() {
    let p = Proc::start(
        LOCAL,
        &[(
            "MPUSH__SINKS__WEBHOOKS",
            "[{url=\"http://127.0.0.1:9/hook\",secret=\"sink-secret-0123456789\"}]",
        )],
    )
    .expect("starts");
    let http = p.addr("HTTP API");
    let text = reqwest::blocking::get(format!("http://{http}/metrics"))
        .expect("scrape")
        .text()
        .expect("text");
    for metric in [
        "mpush_sink_events_delivered_total{sink=",
        "mpush_sink_retries_total{sink=",
        "mpush_sink_refused_total{sink=",
        "mpush_sink_events_dropped_total{sink=",
        "mpush_sink_queue_depth{sink=",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(metric) && l.ends_with(" 0")),
            "{metric} at zero not on /metrics:\n{text}"
        );
    }
}
