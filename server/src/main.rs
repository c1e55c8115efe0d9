//! `mpush-server`: parse flags, load and validate settings, start, wait for a
//! signal, drain.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use mpush_server::Settings;

/// The mpush reference push server. With no flags and no config file it runs
/// complete on this machine, keeping everything in memory.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// TCP gateway address (mpush's connect port).
    #[arg(long, value_name = "ADDR")]
    tcp: Option<String>,
    /// WebSocket gateway address ("" disables it).
    #[arg(long, value_name = "ADDR")]
    ws: Option<String>,
    /// HTTP API address.
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// Cluster mode: share routes, sessions, inboxes, traces and topics through this Redis.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// TOML settings file; MPUSH__SECTION__KEY environment variables override it.
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let mut settings = Settings::load(cli.config.as_deref())?;
    if let Some(a) = cli.tcp {
        settings.net.tcp = a;
    }
    if let Some(a) = cli.ws {
        settings.net.ws = a;
    }
    if let Some(a) = cli.http {
        settings.net.http = a;
    }
    if let Some(r) = cli.redis {
        settings.cluster.redis = r;
    }
    let cfg = settings.validate()?;
    let default_key = cfg.default_key;
    let open_api = cfg.settings.security.api_tokens.is_empty();
    let demo = mpush_server::api::demo_dir(&cfg.settings.net.demo_dir).is_some();
    let running = mpush_server::start(cfg)
        .await
        .context("starting the server")?;
    if default_key {
        tracing::warn!(
            "USING MPUSH'S PUBLIC DEFAULT RSA KEY: anyone can decrypt handshakes made with it. \
             Fine for trying things out; set security.private_key for anything real."
        );
    }
    if open_api {
        tracing::warn!(
            "no security.api_tokens configured: the HTTP API answers loopback clients only"
        );
    }
    println!("mpush-server listening:");
    println!("  TCP gateway        {}", running.tcp);
    if let Some(ws) = running.ws {
        println!("  WebSocket gateway  ws://{ws}/");
    }
    println!(
        "  HTTP API           http://{}/  (OpenAPI: /openapi.json, metrics: /metrics)",
        running.http
    );
    if demo {
        println!(
            "  Demo page          http://{}/demo/",
            loopback(running.http)
        );
    }
    println!("Push a first message:");
    println!(
        "  curl -s http://{}/api/v1/push -H 'content-type: application/json' \\\n    -d '{{\"userId\":\"user-1\",\"content\":\"hello\",\"ackMode\":\"auto\",\"ttlSeconds\":600}}'",
        loopback(running.http)
    );
    shutdown_signal().await;
    tracing::info!("shutting down: draining connections");
    running.shutdown().await;
    Ok(())
}

fn loopback(a: std::net::SocketAddr) -> String {
    if a.ip().is_unspecified() {
        format!("127.0.0.1:{}", a.port())
    } else {
        a.to_string()
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
