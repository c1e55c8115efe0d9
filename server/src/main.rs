//! `mpush-server`: parse flags, load and validate settings, start, wait for a
//! signal, drain.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use mpush_server::Settings;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The mpush reference push server. With no flags and no config file it runs
/// complete on this machine (on loopback), keeping everything in memory.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
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
    /// This node's id (cluster.node_id); a cluster picks a random one when unset.
    #[arg(long, value_name = "ID")]
    node_id: Option<String>,
    /// The node-to-node port's address (cluster.internal), for a second node on the same host.
    #[arg(long, value_name = "ADDR")]
    node_port: Option<String>,
    /// TOML settings file; MPUSH__SECTION__KEY environment variables override it.
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log lines as text, or as one JSON object per line.
    #[arg(long, value_enum, default_value = "text", env = "MPUSH_LOG_FORMAT")]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, clap::Subcommand)]
enum Sub {
    /// Settings: check a file, or print the effective settings.
    Config {
        #[command(subcommand)]
        command: ConfigCmd,
    },
    /// Writes a fresh RSA key pair: the private key (PKCS#8 PEM) to `--out`,
    /// and prints the public key that apps embed (`ClientConfig.setPublicKey`).
    Keygen {
        /// Where to write the private key (refuses to overwrite).
        #[arg(long, default_value = "mpush-private-key.pem")]
        out: PathBuf,
        /// Key size in bits.
        #[arg(long, default_value_t = 2048)]
        bits: usize,
    },
    /// Mints a JWT bind token for tests and demos, with the configured
    /// `security.jwt_secret` (HS256) or a PEM private key (`--key`).
    Token {
        /// The user id (`sub`).
        #[arg(long)]
        user: String,
        /// How long it is valid: `90s`, `30m`, `1h`, `7d`.
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// Restrict it to one client type (1 mobile, 2 pc, 3 web).
        #[arg(long)]
        client_type: Option<i32>,
        /// Fix the bound tags (they replace what the client sends).
        #[arg(long)]
        tags: Option<String>,
        /// Sign with this PEM private key (RS256, or ES256 with `--alg ES256`)
        /// instead of the configured secret.
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
        #[arg(long, default_value = "RS256")]
        alg: String,
    },
}

#[derive(Debug, clap::Subcommand)]
enum ConfigCmd {
    /// Loads FILE (and the MPUSH__ environment) and validates every setting;
    /// a bad one is named. Exit 0: the server would start with it.
    Check { file: PathBuf },
    /// Prints the effective settings (defaults, `--config`, environment,
    /// flags) as TOML, every secret masked.
    Print,
    /// Reads a Java mpush `mpush.conf` (HOCON) and prints this server's
    /// TOML; every key that does not carry over is named with the reason
    /// (in the output, and counted on stderr). Check the result with
    /// `config check`.
    FromMpush {
        file: PathBuf,
        /// Stands for `${user.dir}` in the file (the Java process's working
        /// directory); the current directory by default.
        #[arg(long)]
        user_dir: Option<String>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Colour only on a terminal, and never with NO_COLOR set (no-color.org):
    // a log file or a journal keeps no escape codes.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .with_env_filter(filter);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init(),
    }
    if let Some(Sub::Config {
        command: ConfigCmd::Check { file },
    }) = &cli.command
    {
        match Settings::load(Some(file)).and_then(Settings::validate) {
            Ok(_) => {
                println!("{}: ok", file.display());
                return Ok(());
            }
            Err(e) => {
                eprintln!("{}: {e}", file.display());
                std::process::exit(1);
            }
        }
    }
    if let Some(Sub::Config {
        command: ConfigCmd::FromMpush { file, user_dir },
    }) = &cli.command
    {
        let text = std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        let cwd = match user_dir {
            Some(d) => d.clone(),
            None => std::env::current_dir()?.display().to_string(),
        };
        match mpush_server::from_mpush::convert(&text, &cwd) {
            Ok(c) => {
                print!("{}", c.toml);
                eprintln!(
                    "{}: converted; {} key(s) not carried over (listed at the end, with the reason)",
                    file.display(),
                    c.unmapped.len()
                );
                return Ok(());
            }
            Err(e) => {
                eprintln!("{}: {e}", file.display());
                std::process::exit(1);
            }
        }
    }
    let mut settings = Settings::load(cli.config.as_deref())?;
    let flags = Flags {
        tcp: cli.tcp,
        ws: cli.ws,
        http: cli.http,
        redis: cli.redis,
        node_id: cli.node_id,
        node_port: cli.node_port,
    };
    match cli.command {
        Some(Sub::Config {
            command: ConfigCmd::Print,
        }) => {
            apply_flags(&mut settings, &flags);
            print!("{}", settings.to_toml_masked());
            return Ok(());
        }
        Some(Sub::Config { .. }) => return Ok(()),
        Some(Sub::Keygen { out, bits }) => return keygen(&out, bits),
        Some(Sub::Token {
            user,
            ttl,
            client_type,
            tags,
            key,
            alg,
        }) => {
            let key = mint_key(&settings, key.as_deref(), &alg)?;
            let ttl = parse_ttl(&ttl)?;
            let max = settings.security.max_bind_token_lifetime_secs;
            anyhow::ensure!(
                max == 0 || ttl <= max,
                "--ttl {ttl}s: the server refuses tokens that live longer than {max}s (security.max_bind_token_lifetime_secs)"
            );
            let t = mpush_server::auth::mint_jwt(&key, &user, ttl, client_type, tags)
                .map_err(|e| anyhow::anyhow!("minting: {e}"))?;
            println!("{t}");
            return Ok(());
        }
        None => {}
    }
    apply_flags(&mut settings, &flags);
    let cfg = settings.validate()?;
    let default_key = cfg.default_key;
    let open_api = cfg.settings.security.api_tokens.is_empty();
    let dev_transport = cfg.loopback_transport;
    let demo = mpush_server::api::demo_dir(&cfg.settings.net.demo_dir).is_some();
    let tls = cfg.settings.tls.clone();
    let (ws_scheme, http_scheme) = (
        if tls.on("ws") { "wss" } else { "ws" },
        if tls.on("http") { "https" } else { "http" },
    );
    let running = mpush_server::start(cfg)
        .await
        .context("starting the server")?;
    if default_key {
        tracing::warn!(
            "USING MPUSH'S PUBLISHED RSA KEY: anyone can decrypt handshakes made with it. \
             Fine on loopback; make your own with `mpush-server keygen` for anything real."
        );
    }
    if dev_transport {
        tracing::warn!(
            "net.dev_loopback_transport is on (the default for a WebSocket gateway on loopback): \
             browsers on this machine may use plain ws:// without mpush's RSA and AES; upgrades \
             that carry forwarding headers never count. A reverse proxy on this machine that \
             strips them: set net.dev_loopback_transport = false"
        );
    }
    if open_api {
        tracing::warn!(
            "no security.api_tokens configured: the HTTP API answers loopback clients only"
        );
    }
    println!(
        "mpush-server {} listening (node {}):",
        env!("CARGO_PKG_VERSION"),
        running.node_id
    );
    println!(
        "  TCP gateway        {}{}",
        running.tcp,
        if tls.on("tcp") { " (TLS)" } else { "" }
    );
    if let Some(ws) = running.ws {
        println!("  WebSocket gateway  {ws_scheme}://{ws}/");
    }
    println!(
        "  HTTP API           {http_scheme}://{}/  (OpenAPI: /openapi.json, metrics: /metrics)",
        running.http
    );
    if let Some(a) = running.internal {
        println!("  Node port          {a}  (cluster.internal, --node-port)");
    }
    if demo {
        println!(
            "  Demo page          {http_scheme}://{}/demo/",
            loopback(running.http)
        );
    }
    println!("Push a first message:");
    if open_api {
        println!(
            "  curl -s {http_scheme}://{}/api/v1/push -H 'content-type: application/json' \\\n    -d '{{\"userId\":\"user-1\",\"content\":\"hello\",\"ackMode\":\"auto\",\"ttlSeconds\":600}}'",
            loopback(running.http)
        );
    } else {
        // The token itself is never printed: the shell variable stands for it.
        println!("  export MPUSH_API_TOKEN=...   # one of security.api_tokens");
        println!(
            "  curl -s {http_scheme}://{}/api/v1/push -H \"authorization: Bearer $MPUSH_API_TOKEN\" \\\n    -H 'content-type: application/json' \\\n    -d '{{\"userId\":\"user-1\",\"content\":\"hello\",\"ackMode\":\"auto\",\"ttlSeconds\":600}}'",
            loopback(running.http)
        );
    }
    shutdown_signal().await;
    tracing::info!("shutting down: draining connections");
    running.shutdown().await;
    Ok(())
}

/// The flags that override settings (they win over the file and the environment).
struct Flags {
    tcp: Option<String>,
    ws: Option<String>,
    http: Option<String>,
    redis: Option<String>,
    node_id: Option<String>,
    node_port: Option<String>,
}

fn apply_flags(settings: &mut Settings, f: &Flags) {
    let set = |slot: &mut String, v: &Option<String>| {
        if let Some(v) = v {
            slot.clone_from(v);
        }
    };
    set(&mut settings.net.tcp, &f.tcp);
    set(&mut settings.net.ws, &f.ws);
    set(&mut settings.net.http, &f.http);
    set(&mut settings.cluster.redis, &f.redis);
    set(&mut settings.cluster.node_id, &f.node_id);
    set(&mut settings.cluster.internal, &f.node_port);
}

/// The key `token` signs with: `--key` (RS256 or ES256), else the configured secret.
fn mint_key(
    settings: &Settings,
    key: Option<&std::path::Path>,
    alg: &str,
) -> anyhow::Result<mpush_server::auth::MintKey> {
    use mpush_server::auth::MintKey;
    let Some(f) = key else {
        anyhow::ensure!(
            !settings.security.jwt_secret.is_empty(),
            "no signing key: set security.jwt_secret (or MPUSH__SECURITY__JWT_SECRET), or pass --key"
        );
        // The same check the server makes at start: a token it could never
        // verify is not minted.
        mpush_server::auth::BindAuth::new(&settings.security.token_keys()).map_err(|e| {
            anyhow::anyhow!(
                "security.{e}: the server refuses this secret at start, so it mints no tokens with it"
            )
        })?;
        return Ok(MintKey::Secret(settings.security.jwt_secret.clone()));
    };
    let pem = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
    match alg {
        "RS256" => Ok(MintKey::RsaPem(pem)),
        "ES256" => Ok(MintKey::EcPem(pem)),
        other => anyhow::bail!("--alg {other}: RS256 or ES256"),
    }
}

fn keygen(out: &std::path::Path, bits: usize) -> anyhow::Result<()> {
    use base64::Engine as _;
    use std::io::Write as _;
    anyhow::ensure!((2048..=4096).contains(&bits), "--bits: 2048 to 4096");
    let (key, der) =
        mpush_protocol::crypto::RsaPrivate::generate(&mut mpush_server::clock::rng(), bits)?;
    let pem = pem::encode_config(
        &pem::Pem::new("PRIVATE KEY", der),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    );
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts
        .open(out)
        .with_context(|| format!("creating {} (it must not exist)", out.display()))?;
    f.write_all(pem.as_bytes())?;
    let public = base64::engine::general_purpose::STANDARD.encode(key.public().to_spki_der()?);
    println!("private key written to {} (mode 600)", out.display());
    println!(
        "server setting:  security.private_key_file = \"{}\"",
        out.display()
    );
    println!("public key for apps (ClientConfig.setPublicKey / publicKey option):");
    println!("{public}");
    Ok(())
}

fn parse_ttl(s: &str) -> anyhow::Result<u64> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().context("--ttl: a number and s, m, h or d")?;
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        other => anyhow::bail!("--ttl: unknown unit `{other}`"),
    };
    Ok(n * mult)
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
