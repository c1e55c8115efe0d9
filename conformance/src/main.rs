//! The `mpush-conformance` command. See README.md.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use mpush_conformance::Report;
use mpush_conformance::broken::{self, ClientDefect, Defect};
use mpush_conformance::client::{self, ClientKit, Transport};
use mpush_conformance::conn::Target;
use mpush_conformance::server::{CASES, ServerKit};
use mpush_conformance::trigger::Trigger;
use mpush_protocol::crypto::RsaPublic;

#[derive(Debug, Parser)]
#[command(
    name = "mpush-conformance",
    version,
    about = "Conformance cases for mpush servers"
)]
enum Cli {
    /// Runs the server cases against a server; exit 1 if any failed.
    Server {
        /// The binary TCP gateway, `host:port`.
        #[arg(long)]
        tcp: Option<String>,
        /// The WebSocket gateway, `ws://host:port/`: the same cases in binary frames.
        #[arg(long)]
        ws: Option<String>,
        /// The server's RSA public key (base64 X.509 or PEM); mpush's
        /// published key when absent.
        #[arg(long, value_name = "FILE")]
        public_key: Option<PathBuf>,
        /// Push through this server's HTTP API (`http://host:port`).
        #[arg(long, conflicts_with = "gateway")]
        api: Option<String>,
        /// A bearer token for the HTTP API.
        #[arg(long, env = "MPUSH_API_TOKEN")]
        api_token: Option<String>,
        /// Push through mpush's gateway protocol (GATEWAY_PUSH), `host:port`.
        #[arg(long)]
        gateway: Option<String>,
        /// The server's fast-connect window in seconds, when short enough to
        /// wait out (runs the expired-session case).
        #[arg(long)]
        session_ttl_secs: Option<u64>,
        /// How long a silent connection may stay open (mpush 0.8.1: ~40 s).
        #[arg(long, default_value_t = 45)]
        silence_limit_secs: u64,
        /// Only cases whose id starts with this (repeatable).
        #[arg(long)]
        only: Vec<String>,
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
    },
    /// Lists the server cases with the spec section each checks.
    Cases,
    /// Runs client cases: a scripted server the client under test (the
    /// command after `--`, an adapter: README.md) connects to; exit 1 if any
    /// failed.
    Client {
        /// Serve WebSocket (binary frames) instead of TCP.
        #[arg(long)]
        ws: bool,
        /// Names the client in the results.
        #[arg(long, default_value = "client")]
        label: String,
        /// Only cases whose id starts with this (repeatable).
        #[arg(long)]
        only: Vec<String>,
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// The adapter: a program and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// A deliberately broken client, speaking the adapter contract.
    BrokenClient {
        /// no-heartbeat, tight-loop, no-resume, double-delivery, no-biz-ack, ignore-kick
        #[arg(long)]
        defect: ClientDefect,
    },
    /// A deliberately broken server: relays to `--upstream`, broken as named.
    BrokenProxy {
        #[arg(long)]
        listen: String,
        #[arg(long)]
        upstream: String,
        /// no-pong, no-kick, wrong-resume-code, keep-open
        #[arg(long)]
        defect: Defect,
    },
}

#[tokio::main]
async fn main() {
    match Cli::parse() {
        Cli::Cases => {
            for (id, spec, title) in CASES {
                println!("server.{id:<32} {spec:<24} {title}");
            }
            for (id, spec, title) in client::CASES {
                println!("client.{id:<32} {spec:<24} {title}");
            }
        }
        Cli::BrokenClient { defect } => broken::run_client(defect).await,
        Cli::Client {
            ws,
            label,
            only,
            json,
            junit,
            command,
        } => {
            let kit = ClientKit {
                command,
                transport: if ws { Transport::Ws } else { Transport::Tcp },
                label: label.clone(),
                work_dir: std::env::temp_dir()
                    .join(format!("mpush-conformance-{}", std::process::id())),
            };
            let mut report = Report {
                subject: label,
                ..Default::default()
            };
            for r in kit.run(&only).await {
                report.push(r);
            }
            let _ = std::fs::remove_dir_all(&kit.work_dir);
            finish(&report, json, junit);
        }
        Cli::BrokenProxy {
            listen,
            upstream,
            defect,
        } => {
            let l = match tokio::net::TcpListener::bind(&listen).await {
                Ok(l) => l,
                Err(e) => fail(&format!("cannot listen on {listen}: {e}")),
            };
            eprintln!(
                "broken ({}) proxy on {listen} for {upstream}",
                defect.name()
            );
            broken::serve(l, upstream, defect).await;
        }
        Cli::Server {
            tcp,
            ws,
            public_key,
            api,
            api_token,
            gateway,
            session_ttl_secs,
            silence_limit_secs,
            only,
            json,
            junit,
        } => {
            let key = match public_key {
                None => RsaPublic::mpush_default(),
                Some(p) => {
                    let text = std::fs::read_to_string(&p)
                        .unwrap_or_else(|e| fail(&format!("{}: {e}", p.display())));
                    RsaPublic::from_text(&text).unwrap_or_else(|e| {
                        fail(&format!("{}: not a public key: {e}", p.display()))
                    })
                }
            };
            let trigger = match (api, gateway) {
                (Some(base), _) => Trigger::Api {
                    base: base.trim_end_matches('/').to_owned(),
                    token: api_token,
                },
                (None, Some(addr)) => Trigger::Gateway { addr },
                (None, None) => fail("name a trigger: --api URL or --gateway HOST:PORT"),
            };
            let targets: Vec<Target> = tcp
                .map(Target::Tcp)
                .into_iter()
                .chain(ws.map(Target::Ws))
                .collect();
            if targets.is_empty() {
                fail("name the server: --tcp HOST:PORT and/or --ws URL");
            }
            let mut report = Report {
                subject: format!("server via {}", trigger.name()),
                ..Default::default()
            };
            let run_id = format!("{:x}", mpush_conformance::conn::unix_ms());
            for target in targets {
                let kit = ServerKit {
                    target,
                    public_key: Arc::new(key.clone()),
                    trigger: trigger.clone(),
                    session_ttl: session_ttl_secs.map(Duration::from_secs),
                    silence_limit: Duration::from_secs(silence_limit_secs),
                    run_id: run_id.clone(),
                };
                for r in kit.run(&only).await {
                    report.push(r);
                }
            }
            finish(&report, json, junit);
        }
    }
}

fn finish(report: &Report, json: Option<PathBuf>, junit: Option<PathBuf>) {
    print!("{}", report.table());
    if let Some(p) = json {
        write(&p, &report.json());
    }
    if let Some(p) = junit {
        write(&p, &report.junit());
    }
    if report.counts().failed > 0 {
        std::process::exit(1);
    }
}

fn write(p: &PathBuf, text: &str) {
    if let Err(e) = std::fs::write(p, text) {
        fail(&format!("{}: {e}", p.display()));
    }
}

fn fail(why: &str) -> ! {
    eprintln!("mpush-conformance: {why}");
    std::process::exit(2);
}
