//! `mpush-server keygen`, `token`, `config check`, `config print` and `--log-format json`, as an operator runs them.

use mpush_protocol::session::ClientType;
use std::process::Command;

use mpush_protocol::crypto::{RsaPrivate, RsaPublic};
use mpush_server::auth::{BindAuth, TokenKeys};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mpush-server"))
}

fn out(c: &mut Command) -> (bool, String, String) {
    let o = c.output().expect("runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn pem(label: &str, b64: &str) -> String {
    use base64::Engine as _;
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64");
    pem::encode(&pem::Pem::new(label, der))
}

#[test]
fn keygen_writes_a_key_pair_and_token_mints_what_the_server_accepts() {
    let dir = std::env::temp_dir().join(format!("mpush-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let key = dir.join("key.pem");
    let _ = std::fs::remove_file(&key);
    let (ok, stdout, stderr) = out(bin().args(["keygen", "--out"]).arg(&key));
    assert!(ok, "{stderr}");
    let public_b64 = stdout
        .lines()
        .last()
        .expect("the public key is printed last")
        .trim()
        .to_owned();
    let private = RsaPrivate::from_text(&std::fs::read_to_string(&key).expect("written"))
        .expect("a PKCS#8 key the server loads");
    assert_eq!(private.size(), 256, "2048 bits");
    let public = RsaPublic::from_text(&public_b64).expect("an SPKI key apps load");
    assert_eq!(
        public.to_spki_der().expect("der"),
        private.public().to_spki_der().expect("der"),
        "the printed public key is the written key's"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).expect("meta").permissions().mode();
        assert_eq!(mode & 0o077, 0, "private key readable by its owner only");
    }
    let (ok, _, stderr) = out(bin().args(["keygen", "--out"]).arg(&key));
    assert!(
        !ok && stderr.contains("must not exist"),
        "never overwrites: {stderr}"
    );

    // HS256 with the configured secret.
    let secret = "cli-secret-0123456789abcdef-0123456789";
    let (ok, token, stderr) = out(bin()
        .args([
            "token",
            "--user",
            "alice",
            "--ttl",
            "10m",
            "--client-type",
            "1",
        ])
        .env("MPUSH__SECURITY__JWT_SECRET", secret));
    assert!(ok, "{stderr}");
    let auth = BindAuth::new(&TokenKeys {
        jwt_secret: secret,
        ..Default::default()
    })
    .expect("auth");
    assert!(
        auth.check("alice", ClientType::Mobile, token.trim())
            .is_ok()
    );
    assert!(
        auth.check("alice", ClientType::Web, token.trim()).is_err(),
        "client type bound"
    );
    assert!(
        auth.check("mallory", ClientType::Mobile, token.trim())
            .is_err()
    );

    // RS256 with the generated key; the server verifies with the public half.
    let (ok, token, stderr) = out(bin().args(["token", "--user", "bob", "--key"]).arg(&key));
    assert!(ok, "{stderr}");
    let public = pem("PUBLIC KEY", &public_b64);
    let auth = BindAuth::new(&TokenKeys {
        jwt_public_key: &public,
        ..Default::default()
    })
    .expect("auth");
    assert!(auth.check("bob", ClientType::Mobile, token.trim()).is_ok());
    assert!(
        auth.check("alice", ClientType::Mobile, token.trim())
            .is_err()
    );

    // Without a key it says what to set.
    let (ok, _, stderr) = out(bin().args(["token", "--user", "x"]));
    assert!(!ok && stderr.contains("jwt_secret"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_exposed_server_refuses_to_start_and_names_the_settings() {
    let (ok, _, stderr) =
        out(bin().args(["--tcp", "0.0.0.0:0", "--ws", "", "--http", "127.0.0.1:0"]));
    assert!(!ok);
    for key in ["security.allow_published_key", "security.anonymous_bind"] {
        assert!(stderr.contains(key), "{stderr}");
    }
}

/// A team moving from mpush pastes its old key file into the setting: the
/// server refuses to start exposed with it (it never binds a port) and says
/// the key is mpush's published one.
#[test]
fn a_pasted_published_key_keeps_an_exposed_server_from_starting() {
    let key = pem(
        "PRIVATE KEY",
        mpush_protocol::crypto::MPUSH_DEFAULT_PRIVATE_KEY,
    );
    let (ok, _, stderr) = out(bin()
        .args(["--tcp", "0.0.0.0:0", "--ws", "", "--http", "127.0.0.1:0"])
        .env("MPUSH__SECURITY__PRIVATE_KEY", &key)
        .env("MPUSH__SECURITY__ANONYMOUS_BIND", "true"));
    assert!(!ok, "refused");
    assert!(
        stderr.contains("security.private_key") && stderr.contains("published key"),
        "{stderr}"
    );
}

#[test]
fn config_check_names_the_bad_setting_and_print_masks_secrets() {
    let dir = std::env::temp_dir().join(format!("mpush-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[limits]\nmax_packet_size = 1\n").expect("write");
    let (ok, _, err) = out(bin().args(["config", "check"]).arg(&bad));
    assert!(!ok);
    assert!(err.contains("limits.max_packet_size"), "{err}");
    let typo = dir.join("typo.toml");
    std::fs::write(&typo, "[limits]\nmax_conections = 5\n").expect("write");
    let (ok, _, err) = out(bin().args(["config", "check"]).arg(&typo));
    assert!(!ok);
    assert!(err.contains("max_conections"), "{err}");
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        "[security]\napi_tokens = [\"an-api-token-0123456789\"]\n\n[cluster]\nsecret = \"a-node-secret-0123456789abcdef0123456789\"\n",
    )
    .expect("write");
    let (ok, stdout, err) = out(bin().args(["config", "check"]).arg(&good));
    assert!(ok, "{err}");
    assert!(stdout.contains("ok"), "{stdout}");
    let (ok, printed, err) = out(bin().arg("--config").arg(&good).args(["config", "print"]));
    assert!(ok, "{err}");
    assert!(
        !printed.contains("an-api-token") && !printed.contains("a-node-secret"),
        "{printed}"
    );
    assert!(printed.contains("api_tokens = [\"***\"]"), "{printed}");
    assert!(
        printed.contains("[sinks]") && printed.contains("[limits]"),
        "{printed}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn log_format_json_writes_one_object_per_line() {
    use std::io::{BufRead, BufReader};
    let mut child = bin()
        .args([
            "--log-format",
            "json",
            "--tcp",
            "127.0.0.1:0",
            "--ws",
            "",
            "--http",
            "127.0.0.1:0",
        ])
        .env("RUST_LOG", "info")
        .env("MPUSH__NET__DEMO_DIR", "")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    let stderr = child.stderr.take().expect("stderr");
    // A deadline: the server is stopped after 10 s whatever it printed.
    let pid = child.id().to_string();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(10));
        let _ = Command::new("kill").arg(&pid).status();
    });
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        lines.push(line);
        if lines.len() == 2 {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{l}");
        assert!(v["timestamp"].is_string(), "{l}");
    }
}

/// Credentials in every URL setting and every secret setting, and mpush's
/// published key pasted in: `config print`, the start-up output and the
/// logs of a running server (debug level, text and JSON, with failing
/// webhook and callback deliveries that name their URLs) show none of
/// them, and the published key is warned about.
#[test]
fn no_credential_is_printed_or_logged() {
    use std::io::Read as _;
    let dir = std::env::temp_dir().join(format!("mpush-leak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    // A port nothing listens on: every delivery fails and is logged.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let secrets = [
        "HOOKPASS-1f2e",
        "QUERYKEY-9a8b",
        "CBTOKEN-7c6d",
        "HOOKSECRET-0123456789",
        "CALLBACKSECRET-0123456789",
        "APITOKEN-0123456789abcdef",
        "JWTSECRET-0123456789abcdef0123456789",
        "FRAGTOKEN-5e4f",
    ];
    let config = format!(
        r#"
[net]
tcp = "127.0.0.1:0"
ws = ""
http = "127.0.0.1:0"
demo_dir = ""

[security]
private_key = """{key}"""
api_tokens = ["{api}"]
jwt_secret = "{jwt}"

[[sinks.webhooks]]
url = "http://hookuser:{pass}@127.0.0.1:{closed}/hook?team=a&api_key={query}"
secret = "{hook}"
events = ["callback"]
mode = "async"
max_backoff_ms = 200

[sinks]
callback_urls = ["http://127.0.0.1:{closed}/cb?token={cb}#access_token={frag}"]
callback_secret = "{cbs}"
"#,
        key = pem(
            "PRIVATE KEY",
            mpush_protocol::crypto::MPUSH_DEFAULT_PRIVATE_KEY
        ),
        api = secrets[5],
        jwt = secrets[6],
        pass = secrets[0],
        query = secrets[1],
        hook = secrets[3],
        cb = secrets[2],
        frag = secrets[7],
        cbs = secrets[4],
    );
    let file = dir.join("leaky.toml");
    std::fs::write(&file, config).expect("written");
    let leaks = |what: &str, text: &str| {
        for s in secrets {
            assert!(!text.contains(s), "{what} shows {s}:\n{text}");
        }
    };

    let (ok, printed, stderr) = out(bin().arg("--config").arg(&file).args(["config", "print"]));
    assert!(ok, "{stderr}");
    leaks("config print", &printed);
    assert!(printed.contains("hookuser:***@"), "{printed}");

    for format in ["text", "json"] {
        let mut child = bin()
            .arg("--config")
            .arg(&file)
            .args(["--log-format", format])
            .env("RUST_LOG", "debug")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starts");
        let mut stdout = child.stdout.take().expect("stdout");
        // The banner names the API's port.
        let mut banner = Vec::new();
        let mut byte = [0u8; 1];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let api = loop {
            assert!(std::time::Instant::now() < deadline, "no banner");
            if stdout.read(&mut byte).expect("reads") == 0 {
                panic!("exited: {}", String::from_utf8_lossy(&banner));
            }
            banner.push(byte[0]);
            let text = String::from_utf8_lossy(&banner);
            if let Some(line) = text
                .lines()
                .find(|l| l.contains("HTTP API") && text.ends_with('\n'))
            {
                let url = line
                    .split_whitespace()
                    .find(|w| w.starts_with("http://"))
                    .expect("url");
                break url.trim_end_matches('/').to_owned();
            }
        };
        let http = reqwest::blocking::Client::new();
        for body in [
            serde_json::json!({"userId": "nobody", "content": "x", "callback": true}),
            serde_json::json!({"userId": "nobody", "content": "y", "callbackUrl":
                format!("http://127.0.0.1:{closed}/cb?token={}#access_token={}", secrets[2], secrets[7])}),
        ] {
            let r = http
                .post(format!("{api}/api/v1/push"))
                .bearer_auth(secrets[5])
                .json(&body)
                .send()
                .expect("answers");
            // Offline and not kept: a 404 (ADR 0007); the callbacks fire.
            let st = r.status().as_u16();
            assert!(
                st == 200 || st == 404,
                "{st}: {}",
                r.text().unwrap_or_default()
            );
        }
        // Deliveries fail, are retried and logged for a while.
        std::thread::sleep(std::time::Duration::from_secs(2));
        let _ = child.kill();
        let _ = child.wait();
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).ok();
        let mut err = String::new();
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut err)
            .ok();
        let all = format!("{}{rest}\n{err}", String::from_utf8_lossy(&banner));
        leaks(&format!("the {format} log"), &all);
        assert!(
            all.contains("PUBLISHED RSA KEY"),
            "the pasted published key is warned about:\n{all}"
        );
        assert!(
            all.contains(&format!("127.0.0.1:{closed}")),
            "the failing deliveries were logged (with their URLs masked):\n{all}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `config from-mpush` on mpush 0.8.1's documented defaults (every key set,
/// `tests/data/mpush-0.8.1-defaults.conf`) and on a deployed file: TOML that
/// `config check` accepts, with every key that does not carry over named.
#[test]
fn from_mpush_converts_mpush_s_defaults_and_a_deployed_file() {
    let dir = std::env::temp_dir().join(format!("mpush-from-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    for (conf, must) in [
        (
            "mpush-0.8.1-defaults.conf",
            &[
                "tcp = \"0.0.0.0:3000\"",
                "max_packet_size = 10240",
                "min_heartbeat_ms = 180000",
                "session_ttl_secs = 86400",
                "push_rate = 5000",
                "broadcast_rate = 3000",
                "allow_published_key = true",
                "anonymous_bind = true",
                "mp.zk.*: none: no ZooKeeper",
                "mp.net.gateway-server-port: none: business backends push through the HTTP API",
            ][..],
        ),
        (
            "mpush-deployed.conf",
            &[
                "redis = \"redis://:s3cret%3Apw@10.0.10.20:6379/1\"",
                "ws = \"0.0.0.0:8080\"",
                "public_address = \"111.1.32.137:3000\"",
                "dns_mapping = { \"api.example.com\" = [\"10.0.10.30:8080\", \"10.0.10.31:8080\"] }",
                "default_read_timeout_ms = 5000",
            ][..],
        ),
    ] {
        let (ok, toml, stderr) = out(bin()
            .args(["config", "from-mpush", "--user-dir", "/opt/mpush"])
            .arg(data.join(conf)));
        assert!(ok, "{conf}: {stderr}");
        assert!(stderr.contains("not carried over"), "{stderr}");
        for m in must {
            assert!(toml.contains(m), "{conf}: no `{m}` in\n{toml}");
        }
        let file = dir.join(conf.replace(".conf", ".toml"));
        std::fs::write(&file, &toml).expect("write");
        let (ok, stdout, stderr) = out(bin().args(["config", "check"]).arg(&file));
        assert!(
            ok,
            "{conf}: config check refuses the conversion: {stderr}\n{toml}"
        );
        assert!(stdout.contains("ok"), "{stdout}");
    }
    // Not mpush's HOCON: a clear error naming the file, exit 1.
    let broken = dir.join("broken.conf");
    std::fs::write(&broken, "mp { core = ").expect("write");
    let (ok, _, stderr) = out(bin().args(["config", "from-mpush"]).arg(&broken));
    assert!(!ok && stderr.contains("broken.conf"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
