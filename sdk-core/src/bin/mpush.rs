//! `mpush`: a command-line client for developers and operators.
//!
//! Exit codes: 0 success; 1 other failure; 2 the server refused the request
//! (bad input); 3 the server is unreachable; 4 authentication was refused.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::session::DeviceInfo;
use mpush_sdk_core::SessionEvent;
use mpush_sdk_core::native::{Client, ClientOptions, FileTicketStore, TicketStore};
use mpush_sdk_core::session::SessionConfig;
use serde_json::{Value, json};

#[derive(Parser)]
#[command(
    name = "mpush",
    version,
    about = "Talk to an mpush server: listen for pushes, send them, check status."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Connect, bind a user and print every message as a JSON line (acknowledging it).
    Listen {
        /// Server address (`host:port`, `ws://...`, `wss://...`); repeat for fall-backs.
        #[arg(long = "server", required_unless_present = "allocator")]
        servers: Vec<String>,
        /// mpush allocator URL whose GET returns `host:port,...`.
        #[arg(long)]
        allocator: Option<String>,
        #[arg(long)]
        user: String,
        #[arg(long, default_value = "")]
        tags: String,
        /// Bind token, for servers that check them.
        #[arg(long, default_value = "")]
        token: String,
        #[arg(long, default_value = "mpush-cli")]
        device_id: String,
        /// The server's RSA public key (base64 SPKI); default: mpush's public default key.
        #[arg(long)]
        public_key: Option<String>,
        /// Speak only the legacy mpush 0.8.1 profile.
        #[arg(long)]
        legacy: bool,
        /// Keep the resume ticket in this file (fast connect across runs).
        #[arg(long)]
        ticket_file: Option<std::path::PathBuf>,
        /// Exit after this many messages.
        #[arg(long)]
        count: Option<usize>,
    },
    /// Push a message through the HTTP API.
    Push {
        /// API base URL, e.g. http://127.0.0.1:9999
        #[arg(long)]
        api: String,
        #[arg(long)]
        user: String,
        #[arg(long)]
        content: String,
        #[arg(long, value_enum, default_value = "none")]
        ack: Ack,
        /// Keep for the user while offline, in seconds.
        #[arg(long)]
        ttl: Option<u64>,
        /// Bearer token for the API.
        #[arg(long, env = "MPUSH_API_TOKEN")]
        api_token: Option<String>,
    },
    /// Show the server's health, or a user's online devices.
    Status {
        #[arg(long)]
        api: String,
        #[arg(long)]
        user: Option<String>,
        #[arg(long, env = "MPUSH_API_TOKEN")]
        api_token: Option<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Ack {
    None,
    Auto,
    Biz,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Listen {
            servers,
            allocator,
            user,
            tags,
            token,
            device_id,
            public_key,
            legacy,
            ticket_file,
            count,
        } => {
            let key = match public_key
                .as_deref()
                .map(RsaPublic::from_text)
                .unwrap_or_else(|| Ok(RsaPublic::mpush_default()))
            {
                Ok(k) => k,
                Err(e) => return fail(2, &format!("--public-key: {e}")),
            };
            let device = DeviceInfo {
                device_id,
                os_name: std::env::consts::OS.into(),
                os_version: String::new(),
                client_version: env!("CARGO_PKG_VERSION").into(),
            };
            let mut session = SessionConfig::new(servers, Arc::new(key), device);
            session.allocator_url = allocator;
            session.offer_v2 = !legacy;
            listen(
                ClientOptions {
                    session,
                    ticket_store: ticket_file
                        .map(|f| Arc::new(FileTicketStore::new(f)) as Arc<dyn TicketStore>),
                },
                &user,
                &tags,
                &token,
                count,
            )
            .await
        }
        Command::Push {
            api,
            user,
            content,
            ack,
            ttl,
            api_token,
        } => {
            let mode = match ack {
                Ack::None => "none",
                Ack::Auto => "auto",
                Ack::Biz => "biz",
            };
            let mut body = json!({"userId": user, "content": content, "ackMode": mode});
            if let Some(t) = ttl {
                body["ttlSeconds"] = json!(t);
            }
            request(
                reqwest::Method::POST,
                &format!("{}/api/v1/push", api.trim_end_matches('/')),
                Some(body),
                api_token,
            )
            .await
        }
        Command::Status {
            api,
            user,
            api_token,
        } => {
            let base = api.trim_end_matches('/');
            let url = match user {
                Some(u) => format!("{base}/api/v1/users/{u}"),
                None => format!("{base}/healthz"),
            };
            request(reqwest::Method::GET, &url, None, api_token).await
        }
    }
}

fn fail(code: u8, msg: &str) -> ExitCode {
    eprintln!("mpush: {msg}");
    ExitCode::from(code)
}

async fn request(
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
    token: Option<String>,
) -> ExitCode {
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
    {
        Ok(c) => c,
        Err(e) => return fail(1, &e.to_string()),
    };
    let mut req = client.request(method, url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) if e.is_connect() || e.is_timeout() => {
            return fail(3, &format!("server unreachable at {url}: {e}"));
        }
        Err(e) => return fail(1, &e.to_string()),
    };
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if status.is_success() {
        println!("{text}");
        return ExitCode::SUCCESS;
    }
    let detail = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or(text);
    match status.as_u16() {
        401 | 403 => fail(4, &format!("authentication refused: {detail}")),
        400..=499 => fail(2, &format!("refused ({status}): {detail}")),
        _ => fail(1, &format!("server error ({status}): {detail}")),
    }
}

async fn listen(
    options: ClientOptions,
    user: &str,
    tags: &str,
    token: &str,
    count: Option<usize>,
) -> ExitCode {
    let mut client = Client::connect(options);
    if let Err(e) = client.bind(user, tags, token).await {
        return fail(1, &e.to_string());
    }
    let mut seen = 0;
    let mut ever_connected = false;
    let mut failures = 0;
    while let Some(e) = client.next_event().await {
        match e {
            SessionEvent::Connected {
                address,
                resumed,
                v2,
            } => {
                ever_connected = true;
                failures = 0;
                eprintln!(
                    "connected to {address} ({}, {})",
                    if v2 { "v2" } else { "legacy" },
                    if resumed { "fast connect" } else { "handshake" }
                );
            }
            SessionEvent::BindResult {
                user_id,
                ok,
                reason,
            } => eprintln!(
                "bind {user_id}: {}",
                if ok { "ok".to_owned() } else { reason }
            ),
            SessionEvent::Disconnected {
                reason,
                retry_in_ms,
            } => {
                failures += 1;
                eprintln!("disconnected ({reason}); retrying in {retry_in_ms} ms");
                if !ever_connected && failures >= 3 {
                    return fail(3, &format!("server unreachable: {reason}"));
                }
            }
            SessionEvent::Message(m) => {
                let line = json!({
                    "content": String::from_utf8_lossy(&m.content),
                    "messageId": m.message_id,
                    "traceId": m.trace_id,
                    "acked": m.needs_ack,
                });
                println!("{line}");
                if m.needs_ack {
                    let _ = client.ack(m.ack_id).await;
                }
                seen += 1;
                if count.is_some_and(|c| seen >= c) {
                    client.close();
                    return ExitCode::SUCCESS;
                }
            }
            SessionEvent::Kicked { device_id, .. } => {
                eprintln!("kicked: device {device_id} took this user's place")
            }
            SessionEvent::Stopped { reason } => return fail(1, &format!("stopped: {reason}")),
            _ => {}
        }
    }
    ExitCode::SUCCESS
}
