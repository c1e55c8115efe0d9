//! `mpush`: a command-line client for developers and operators.
//!
//! Exit codes: 0 success; 1 other failure; 2 the server refused the request
//! (bad input), or the push did not happen (the user is offline and nothing
//! asked to keep it, or the inbox is full); 3 the server is unreachable; 4
//! authentication was refused; 5 the server could not do it now, retry
//! later (an up-push, or a store or node it needed is down: 503).

mod webhook;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use mpush_protocol::crypto::RsaPublic;
use mpush_protocol::session::{AckMode, DeviceInfo};
use mpush_sdk_core::native::{Client, ClientOptions, FileTicketStore, TicketStore};
use mpush_sdk_core::session::SessionConfig;
use mpush_sdk_core::{SessionError, SessionEvent};
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
    /// The conformance kit's adapter for this SDK (`mpush-conformance
    /// client -- mpush conformance-adapter`): reads the
    /// `MPUSH_CONFORMANCE_*` variables, connects and binds, and prints what
    /// the application sees as JSON lines (conformance/README.md).
    ConformanceAdapter,
    /// Connect, bind a user and print every message as a JSON line (acknowledging it).
    Listen {
        #[command(flatten)]
        conn: Connect,
        /// Exit after this many messages.
        #[arg(long)]
        count: Option<usize>,
    },
    /// Connect, bind a user and send messages up (to the backend, through the
    /// server's sinks); each line printed once the server accepted it.
    Send {
        #[command(flatten)]
        conn: Connect,
        /// A message to send; repeat for several (in order).
        #[arg(long = "content", required = true)]
        contents: Vec<String>,
    },
    /// Receive webhook events (up-pushes, lifecycle events, delivery
    /// callbacks): check each signature and print each event as a JSON line.
    WebhookListen {
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:8787")]
        listen: std::net::SocketAddr,
        /// The path the server posts to.
        #[arg(long, default_value = "/")]
        path: String,
        /// The shared secret (the server's `sinks.webhooks[].secret`).
        #[arg(long, env = "MPUSH_WEBHOOK_SECRET")]
        secret: String,
        /// Refuse timestamps further than this from now (replays).
        #[arg(long, default_value_t = 300)]
        tolerance_secs: u64,
        /// Answer the first N requests with 503 (to watch the server retry).
        #[arg(long, default_value_t = 0)]
        fail_first: usize,
        /// Push each up-push back to its user ("echo: ...") through this API.
        #[arg(long)]
        echo_api: Option<String>,
        #[arg(long, env = "MPUSH_API_TOKEN")]
        api_token: Option<String>,
        /// Exit after this many events.
        #[arg(long)]
        count: Option<usize>,
    },
    /// Broadcast a message to every connected client (or those matching tags).
    Broadcast {
        #[arg(long)]
        api: String,
        #[arg(long)]
        content: String,
        /// Only clients bound with one of these tags (comma-separated).
        #[arg(long)]
        tags: Option<String>,
        /// A condition: mpush's JavaScript over userId, tags, clientVersion,
        /// osName and osVersion, e.g. `tags.indexOf("vip") >= 0 && osName == "android"`.
        #[arg(long)]
        condition: Option<String>,
        #[arg(long, value_enum, default_value = "none")]
        ack: Ack,
        /// Report per-node aggregates to the callback sinks.
        #[arg(long)]
        callback: bool,
        #[arg(long, env = "MPUSH_API_TOKEN")]
        api_token: Option<String>,
    },
    /// Topics: push to every subscriber.
    Topic {
        #[command(subcommand)]
        command: TopicCommand,
    },
    /// Show a push's trace; with --follow, print it each time it changes.
    Trace {
        #[arg(long)]
        api: String,
        trace_id: String,
        #[arg(long)]
        follow: bool,
        /// Stop following after this many seconds.
        #[arg(long, default_value_t = 30)]
        timeout_secs: u64,
        #[arg(long, env = "MPUSH_API_TOKEN")]
        api_token: Option<String>,
    },
    /// Kick a user's connections (of one client type, if given) on every node.
    Kick {
        #[arg(long)]
        api: String,
        #[arg(long)]
        user: String,
        #[arg(long)]
        client_type: Option<i32>,
        #[arg(long, env = "MPUSH_API_TOKEN")]
        api_token: Option<String>,
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
        /// Report each recipient's terminal state to the callback sinks.
        #[arg(long)]
        callback: bool,
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

#[derive(Subcommand)]
enum TopicCommand {
    /// Push a message to every subscriber of a topic.
    Push {
        #[arg(long)]
        api: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        content: String,
        #[arg(long, value_enum, default_value = "none")]
        ack: Ack,
        #[arg(long)]
        callback: bool,
        #[arg(long, env = "MPUSH_API_TOKEN")]
        api_token: Option<String>,
    },
}

/// How a client command connects and binds.
#[derive(Args)]
struct Connect {
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
    /// Use mpush's published key on a plain connection to another host (a
    /// server that still uses it; anyone can decrypt that handshake).
    #[arg(long)]
    allow_published_key: bool,
    /// Speak only the legacy mpush 0.8.1 profile.
    #[arg(long)]
    legacy: bool,
    /// Keep the resume ticket in this file (fast connect across runs).
    #[arg(long)]
    ticket_file: Option<std::path::PathBuf>,
    /// Trust only this PEM certificate for `tls://` and `wss://` (a private
    /// or self-signed server); default: the webpki roots.
    #[arg(long, value_name = "PEM_FILE")]
    tls_pin: Option<std::path::PathBuf>,
}

impl Connect {
    fn options(self) -> Result<(ClientOptions, String, String, String), String> {
        let key = self
            .public_key
            .as_deref()
            .map(RsaPublic::from_text)
            .unwrap_or_else(|| Ok(RsaPublic::mpush_default()))
            .map_err(|e| format!("--public-key: {e}"))?;
        let device = DeviceInfo {
            device_id: self.device_id,
            os_name: std::env::consts::OS.into(),
            os_version: String::new(),
            client_version: env!("CARGO_PKG_VERSION").into(),
        };
        let mut session = SessionConfig::new(self.servers, Arc::new(key), device);
        session.allocator_url = self.allocator;
        session.offer_v2 = !self.legacy;
        session.allow_published_key = self.allow_published_key;
        if let Some(f) = &self.tls_pin {
            session.tls_pinned_cert_pem = Some(
                std::fs::read_to_string(f)
                    .map_err(|e| format!("--tls-pin {}: {e}", f.display()))?,
            );
        }
        let options = ClientOptions {
            session,
            ticket_store: self
                .ticket_file
                .map(|f| Arc::new(FileTicketStore::new(f)) as Arc<dyn TicketStore>),
        };
        Ok((options, self.user, self.tags, self.token))
    }
}

impl Ack {
    fn name(self) -> &'static str {
        match self {
            Ack::None => "none",
            Ack::Auto => "auto",
            Ack::Biz => "biz",
        }
    }
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
        Command::ConformanceAdapter => conformance_adapter().await,
        Command::Listen { conn, count } => match conn.options() {
            Ok((options, user, tags, token)) => listen(options, &user, &tags, &token, count).await,
            Err(e) => fail(2, &e),
        },
        Command::Send { conn, contents } => match conn.options() {
            Ok((options, user, tags, token)) => send(options, &user, &tags, &token, contents).await,
            Err(e) => fail(2, &e),
        },
        Command::WebhookListen {
            listen,
            path,
            secret,
            tolerance_secs,
            fail_first,
            echo_api,
            api_token,
            count,
        } => {
            if secret.is_empty() {
                return fail(2, "--secret must not be empty");
            }
            let o = webhook::Options {
                listen,
                path,
                secret,
                tolerance_secs,
                fail_first,
                echo_api,
                api_token,
                count,
            };
            match webhook::run(o).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(1, &e),
            }
        }
        Command::Broadcast {
            api,
            content,
            tags,
            condition,
            ack,
            callback,
            api_token,
        } => {
            let mut body = json!({"content": content, "ackMode": ack.name()});
            if let Some(t) = tags {
                body["tags"] = json!(
                    t.split(',')
                        .map(str::trim)
                        .filter(|t| !t.is_empty())
                        .collect::<Vec<_>>()
                );
            }
            if let Some(c) = condition {
                body["condition"] = json!(c);
            }
            post(&api, "/api/v1/broadcast", body, callback, api_token).await
        }
        Command::Topic {
            command:
                TopicCommand::Push {
                    api,
                    topic,
                    content,
                    ack,
                    callback,
                    api_token,
                },
        } => {
            let body = json!({"content": content, "ackMode": ack.name()});
            let path = format!("/api/v1/topics/{}/push", path_segment(&topic));
            post(&api, &path, body, callback, api_token).await
        }
        Command::Trace {
            api,
            trace_id,
            follow,
            timeout_secs,
            api_token,
        } => {
            let url = format!(
                "{}/api/v1/traces/{}",
                api.trim_end_matches('/'),
                path_segment(&trace_id)
            );
            if follow {
                follow_trace(&url, api_token, Duration::from_secs(timeout_secs)).await
            } else {
                request(reqwest::Method::GET, &url, None, api_token).await
            }
        }
        Command::Kick {
            api,
            user,
            client_type,
            api_token,
        } => {
            let body = client_type.map_or_else(|| json!({}), |c| json!({"clientType": c}));
            let path = format!("/api/v1/users/{}/kick", path_segment(&user));
            post(&api, &path, body, false, api_token).await
        }
        Command::Push {
            api,
            user,
            content,
            ack,
            ttl,
            callback,
            api_token,
        } => {
            let mut body = json!({"userId": user, "content": content, "ackMode": ack.name()});
            if let Some(t) = ttl {
                body["ttlSeconds"] = json!(t);
            }
            post(&api, "/api/v1/push", body, callback, api_token).await
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

/// POST a JSON body to the API at `path` (with `callback: true` when asked).
async fn post(
    api: &str,
    path: &str,
    mut body: Value,
    callback: bool,
    token: Option<String>,
) -> ExitCode {
    if callback {
        body["callback"] = json!(true);
    }
    let url = format!("{}{path}", api.trim_end_matches('/'));
    request(reqwest::Method::POST, &url, Some(body), token).await
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
    let offline = text.contains("\"offline\"");
    let detail = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or(text);
    match status.as_u16() {
        401 | 403 => fail(4, &format!("authentication refused: {detail}")),
        404 if offline => fail(
            2,
            &format!("not sent: {detail} (--ttl keeps a push for an offline user)"),
        ),
        400..=499 => fail(2, &format!("refused ({status}): {detail}")),
        503 => fail(5, &format!("unavailable, retry later: {detail}")),
        _ => fail(1, &format!("server error ({status}): {detail}")),
    }
}

/// A path segment, percent-encoded (user ids, topics and trace ids may hold
/// any character).
fn path_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prints a trace each time it changes, until every recipient settled or
/// `limit` passed.
async fn follow_trace(url: &str, token: Option<String>, limit: Duration) -> ExitCode {
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
    {
        Ok(c) => c,
        Err(e) => return fail(1, &e.to_string()),
    };
    let deadline = tokio::time::Instant::now() + limit;
    let mut last = String::new();
    loop {
        let mut req = client.get(url);
        if let Some(t) = &token {
            req = req.bearer_auth(t);
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => {
                let text = r.text().await.unwrap_or_default();
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                let line = v.to_string();
                if line != last {
                    println!("{line}");
                    last = line;
                }
                let settled = v["recipients"].as_array().is_some_and(|rs| {
                    !rs.is_empty()
                        && rs.iter().all(|r| {
                            matches!(
                                r["state"].as_str(),
                                Some("ACK" | "TIMEOUT" | "FAILED" | "OFFLINE")
                            )
                        })
                });
                if settled {
                    return ExitCode::SUCCESS;
                }
            }
            Ok(r) if r.status().as_u16() == 404 => {}
            Ok(r) => return fail(1, &format!("trace: {}", r.status())),
            Err(e) => return fail(3, &format!("server unreachable at {url}: {e}")),
        }
        if tokio::time::Instant::now() >= deadline {
            return ExitCode::SUCCESS;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Binds in the background: the caller reads the events meanwhile (the
/// bind resolves only once connected, and says how it went in `BindResult`).
/// The kit's adapter contract: the connection from the environment, events
/// out as JSON lines, a message that needs an ACK acknowledged after it was
/// printed (an application that handled it).
async fn conformance_adapter() -> ExitCode {
    let var = |k: &str| std::env::var(format!("MPUSH_CONFORMANCE_{k}")).unwrap_or_default();
    let state = std::path::PathBuf::from(var("STATE_DIR"));
    let conn = Connect {
        servers: vec![var("SERVER")],
        allocator: None,
        user: var("USER"),
        tags: String::new(),
        token: String::new(),
        device_id: var("DEVICE"),
        public_key: Some(var("PUBLIC_KEY")),
        allow_published_key: true,
        legacy: var("LEGACY") == "1",
        ticket_file: (!state.as_os_str().is_empty()).then(|| state.join("ticket")),
        tls_pin: None,
    };
    let (options, user, tags, token) = match conn.options() {
        Ok(o) => o,
        Err(e) => return fail(2, &e),
    };
    let mut client = match Client::connect(options) {
        Ok(c) => c,
        Err(e) => return fail(2, &e.to_string()),
    };
    start_bind(&client, &user, &tags, &token);
    while let Some(e) = client.next_event().await {
        let line = match e {
            SessionEvent::Connected { resumed, v2, .. } => {
                json!({"event": "connected", "resumed": resumed, "v2": v2})
            }
            SessionEvent::BindResult {
                user_id,
                ok,
                reason,
            } => {
                if ok {
                    json!({"event": "bound", "userId": user_id})
                } else {
                    json!({"event": "bind_failed", "userId": user_id, "reason": reason})
                }
            }
            SessionEvent::Message(m) => {
                let line = json!({
                    "event": "message",
                    "text": String::from_utf8_lossy(&m.content),
                    "traceId": m.trace_id,
                    "messageId": m.message_id,
                    "needsAck": m.needs_ack,
                });
                println!("{line}");
                if m.needs_ack {
                    let _ = client.ack(m.ack_id).await;
                }
                continue;
            }
            SessionEvent::Kicked { device_id, .. } => {
                json!({"event": "kicked", "deviceId": device_id})
            }
            SessionEvent::Disconnected {
                reason,
                retry_in_ms,
            } => {
                json!({"event": "disconnected", "reason": reason.to_string(), "retryInMs": retry_in_ms})
            }
            SessionEvent::Stopped { reason } => {
                println!(
                    "{}",
                    json!({"event": "stopped", "reason": reason.to_string()})
                );
                return ExitCode::SUCCESS;
            }
            _ => continue,
        };
        println!("{line}");
    }
    ExitCode::SUCCESS
}

fn start_bind(client: &Client, user: &str, tags: &str, token: &str) {
    let (h, user, tags, token) = (
        client.handle(),
        user.to_owned(),
        tags.to_owned(),
        token.to_owned(),
    );
    tokio::spawn(async move {
        let _ = h.bind(&user, &tags, &token).await;
    });
}

/// Sends each message up in order; prints `{"content", "accepted"}` per
/// accepted message; stops at the first refusal (exit 5 when retryable).
async fn send(
    options: ClientOptions,
    user: &str,
    tags: &str,
    token: &str,
    contents: Vec<String>,
) -> ExitCode {
    let mut client = match Client::connect(options) {
        Ok(c) => c,
        Err(e) => return fail(2, &e.to_string()),
    };
    start_bind(&client, user, tags, token);
    // Wait for the bind's answer (the session binds as soon as it connects).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut failures = 0;
    loop {
        let e = match tokio::time::timeout_at(deadline, client.next_event()).await {
            Ok(Some(e)) => e,
            Ok(None) => return fail(1, "the session ended"),
            Err(_) => return fail(3, "not bound within 15 s"),
        };
        match e {
            SessionEvent::BindResult { ok: true, .. } => break,
            SessionEvent::BindResult { reason, .. } => {
                return fail(4, &format!("bind refused: {reason}"));
            }
            SessionEvent::Disconnected { reason, .. } => {
                failures += 1;
                if failures >= 3 {
                    return fail(3, &format!("server unreachable: {reason}"));
                }
            }
            SessionEvent::Stopped { reason } => return fail(1, &format!("stopped: {reason}")),
            _ => {}
        }
    }
    for c in contents {
        match client.push(c.as_bytes(), AckMode::Auto).await {
            Ok(()) => println!("{}", json!({"content": c, "accepted": true})),
            Err(e @ SessionError::RetryLater(_)) => {
                return fail(5, &format!("not accepted now: {e}; retry later"));
            }
            Err(e) => return fail(2, &format!("not accepted: {e}")),
        }
    }
    client.close();
    ExitCode::SUCCESS
}

async fn listen(
    options: ClientOptions,
    user: &str,
    tags: &str,
    token: &str,
    count: Option<usize>,
) -> ExitCode {
    let mut client = match Client::connect(options) {
        Ok(c) => c,
        Err(e) => return fail(2, &e.to_string()),
    };
    start_bind(&client, user, tags, token);
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
