//! The `mpush` CLI round trip: `mpush listen` in one process receives what
//! `mpush push` sends through the API; errors give their exit codes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use mpush_server::Settings;
use serde_json::Value;

#[path = "../../server/tests/common/ports.rs"]
mod ports;
use ports::free_port;

const MPUSH: &str = env!("CARGO_BIN_EXE_mpush");

async fn start(tokens: Vec<String>) -> mpush_server::Running {
    let mut s = Settings::default();
    s.net.tcp = "127.0.0.1:0".into();
    s.net.ws = String::new();
    s.net.http = "127.0.0.1:0".into();
    s.security.api_tokens = tokens;
    mpush_server::start(s.validate().expect("valid"))
        .await
        .expect("starts")
}

async fn run(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || Command::new(MPUSH).args(&args).output().expect("runs"))
        .await
        .expect("join")
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[tokio::test]
async fn listen_receives_what_push_sends() {
    let server = start(Vec::new()).await;
    let api = format!("http://{}", server.http);
    let mut listener = Command::new(MPUSH)
        .args([
            "listen",
            "--server",
            &server.tcp.to_string(),
            "--user",
            "cli-user",
            "--count",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("listen starts");
    // Wait until the listener is bound.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let out = run(s(&["status", "--api", &api, "--user", "cli-user"])).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        if v["online"] == true {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "listener never bound");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = run(s(&[
        "push",
        "--api",
        &api,
        "--user",
        "cli-user",
        "--content",
        "hello from the CLI",
        "--ack",
        "biz",
    ]))
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent: Value = serde_json::from_slice(&out.stdout).expect("push JSON");
    assert_eq!(sent["dispatched"], 1);
    let stdout = listener.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || BufReader::new(stdout).lines().next())
        .await
        .expect("join")
        .expect("a line")
        .expect("utf-8");
    let msg: Value = serde_json::from_str(&line).expect("a JSON line");
    assert_eq!(msg["content"], "hello from the CLI");
    assert_eq!(msg["acked"], true);
    let status = tokio::task::spawn_blocking(move || listener.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "listen exits after --count messages");
    // The listener acknowledged the BIZ message.
    let trace = sent["traceId"].as_str().unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let t: Value = reqwest::get(format!("{api}/api/v1/traces/{trace}"))
            .await
            .expect("trace")
            .json()
            .await
            .expect("json");
        if t["state"] == "ACK" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = run(s(&["status", "--api", &api])).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"status\":\"ok\""));
    server.shutdown().await;
}

#[tokio::test]
async fn errors_have_clear_messages_and_exit_codes() {
    let server = start(vec!["a-very-secret-api-token".into()]).await;
    let api = format!("http://{}", server.http);
    let out = run(s(&["push", "--api", &api, "--user", "u", "--content", "x"])).await;
    assert_eq!(out.status.code(), Some(4), "auth refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("authentication refused"));
    // Offline and not kept: the push did not happen (exit 2, and says why).
    let out = run(s(&[
        "push",
        "--api",
        &api,
        "--user",
        "u",
        "--content",
        "x",
        "--api-token",
        "a-very-secret-api-token",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ttl"));
    let out = run(s(&[
        "push",
        "--api",
        &api,
        "--user",
        "u",
        "--content",
        "x",
        "--ttl",
        "60",
        "--api-token",
        "a-very-secret-api-token",
    ]))
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let long = "x".repeat(20_000);
    let out = run(vec![
        "push".into(),
        "--api".into(),
        api.clone(),
        "--user".into(),
        "u".into(),
        "--content".into(),
        long,
        "--api-token".into(),
        "a-very-secret-api-token".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(2), "refused request");
    assert!(String::from_utf8_lossy(&out.stderr).contains("content"));
    server.shutdown().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let out = run(s(&[
        "push",
        "--api",
        &format!("http://127.0.0.1:{port}"),
        "--user",
        "u",
        "--content",
        "x",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(3), "unreachable");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unreachable"));
    let out = run(s(&[
        "listen",
        "--server",
        &format!("127.0.0.1:{port}"),
        "--user",
        "u",
    ]))
    .await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "listen gives up on a server that never answered"
    );
    let out = run(s(&[
        "push",
        "--api",
        "x",
        "--user",
        "u",
        "--content",
        "c",
        "--ack",
        "sometimes",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(2), "usage errors");
}

/// `mpush send` up-pushes arrive at `mpush webhook-listen` (through the
/// server's webhook sink, signed); the backend commands work end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_reaches_webhook_listen_and_the_backend_commands_work() {
    const SECRET: &str = "cli-webhook-secret-0123456789";
    let hook = format!("127.0.0.1:{}", free_port());
    let mut receiver = Command::new(MPUSH)
        .args([
            "webhook-listen",
            "--listen",
            &hook,
            "--secret",
            SECRET,
            "--fail-first",
            "1",
            "--count",
            "2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("webhook-listen starts");
    let mut s = Settings::default();
    s.net.tcp = "127.0.0.1:0".into();
    s.net.ws = String::new();
    s.net.http = "127.0.0.1:0".into();
    s.sinks.webhooks = vec![mpush_server::config::Webhook {
        url: format!("http://{hook}/"),
        secret: SECRET.into(),
        max_backoff_ms: 200,
        ..Default::default()
    }];
    let server = mpush_server::start(s.validate().expect("valid"))
        .await
        .expect("starts");
    let api = format!("http://{}", server.http);
    // webhook-listen is up once its port answers.
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(&hook).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = run(s_args(&[
        "send",
        "--server",
        &server.tcp.to_string(),
        "--user",
        "sender",
        "--content",
        "first",
        "--content",
        "second ✓",
    ]))
    .await;
    assert!(
        out.status.success(),
        "send: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let accepted = String::from_utf8_lossy(&out.stdout);
    assert_eq!(accepted.lines().count(), 2, "{accepted}");
    let got = tokio::task::spawn_blocking(move || {
        let lines: Vec<Value> = BufReader::new(receiver.stdout.take().expect("stdout"))
            .lines()
            .map_while(Result::ok)
            .map(|l| serde_json::from_str(&l).expect("a JSON line"))
            .collect();
        let _ = receiver.wait();
        lines
    })
    .await
    .expect("join");
    let contents: Vec<&str> = got.iter().filter_map(|e| e["content"].as_str()).collect();
    assert_eq!(contents, ["first", "second ✓"], "{got:?}");
    assert!(
        got.iter()
            .all(|e| e["userId"] == "sender" && e["type"] == "up_push")
    );

    // A request with a wrong signature is refused by webhook-listen.
    let hook2 = format!("127.0.0.1:{}", free_port());
    let mut strict = Command::new(MPUSH)
        .args(["webhook-listen", "--listen", &hook2, "--secret", SECRET])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let http = reqwest::Client::new();
    let mut status = 0;
    for _ in 0..100 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        if let Ok(r) = http
            .post(format!("http://{hook2}/"))
            .header("x-mpush-timestamp", now.to_string())
            .header("x-mpush-signature", format!("v1={}", "00".repeat(32)))
            .body("{\"events\":[]}")
            .send()
            .await
        {
            status = r.status().as_u16();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = strict.kill();
    let _ = strict.wait();
    assert_eq!(status, 401);

    // broadcast, topic push, trace, kick.
    let out = run(s_args(&["broadcast", "--api", &api, "--content", "to all"])).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let trace = v["traceId"].as_str().expect("trace id").to_owned();
    let out = run(s_args(&["trace", "--api", &api, &trace])).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(s_args(&[
        "topic",
        "push",
        "--api",
        &api,
        "--topic",
        "news",
        "--content",
        "hi",
    ]))
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["subscribers"], 0, "{v}");
    let out = run(s_args(&["kick", "--api", &api, "--user", "nobody"])).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no online device"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // An up-push the server cannot place (no sink on this server) is a
    // clear refusal, not a hang.
    server.shutdown().await;
    let bare = start(Vec::new()).await;
    let out = run(s_args(&[
        "send",
        "--server",
        &bare.tcp.to_string(),
        "--user",
        "u",
        "--content",
        "nowhere",
    ]))
    .await;
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no sink"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bare.shutdown().await;
}

fn s_args(v: &[&str]) -> Vec<String> {
    s(v)
}
