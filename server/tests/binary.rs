//! The `mpush-server` binary as a newcomer runs it: it starts with no config,
//! says where it listens, serves, and drains on SIGTERM; bad settings stop it
//! with an error naming the key.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

#[tokio::test]
async fn starts_prints_serves_and_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mpush-server"))
        .args([
            "--tcp",
            "127.0.0.1:0",
            "--ws",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let stdout = child.stdout.take().expect("stdout");
    let lines = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .take_while(|l| !l.contains("ttlSeconds"))
            .collect::<Vec<_>>()
    });
    let lines = tokio::time::timeout(Duration::from_secs(20), lines)
        .await
        .expect("banner in time")
        .expect("read");
    let text = lines.join("\n");
    assert!(text.contains("TCP gateway"), "{text}");
    assert!(text.contains("curl"), "it shows how to push: {text}");
    let http = lines
        .iter()
        .find(|l| l.contains("HTTP API") && l.contains("http://"))
        .and_then(|l| l.split("http://").nth(1))
        .and_then(|r| r.split('/').next())
        .expect("HTTP address")
        .to_owned();
    let health: serde_json::Value = reqwest::get(format!("http://{http}/healthz"))
        .await
        .expect("healthz")
        .json()
        .await
        .expect("json");
    assert_eq!(health["status"], "ok");
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "exits cleanly after draining: {status:?}");
}

#[test]
fn invalid_settings_stop_it_with_the_key_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_mpush-server"))
        .args(["--tcp", "not-an-address"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("net.tcp"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_mpush-server"))
        .args(["--http", "127.0.0.1:0", "--tcp", "127.0.0.1:0", "--ws", ""])
        .env("MPUSH__LIMITS__MAX_CONNECTIONS", "0")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_connections"));
}
