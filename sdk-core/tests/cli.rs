//! The `mpush` CLI round trip: `mpush listen` in one process receives what
//! `mpush push` sends through the API; errors give their exit codes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use mpush_server::Settings;
use serde_json::Value;

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
