//! `mpush-server keygen` and `mpush-server token`, as an operator runs them.

use std::process::Command;

use mpush_protocol::crypto::{RsaPrivate, RsaPublic};
use mpush_server::auth::BindAuth;
use mpush_server::config::Security;

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
    let auth = BindAuth::new(&Security {
        jwt_secret: secret.into(),
        ..Default::default()
    })
    .expect("auth");
    assert!(auth.check("alice", 1, token.trim()).is_ok());
    assert!(
        auth.check("alice", 3, token.trim()).is_err(),
        "client type bound"
    );
    assert!(auth.check("mallory", 1, token.trim()).is_err());

    // RS256 with the generated key; the server verifies with the public half.
    let (ok, token, stderr) = out(bin().args(["token", "--user", "bob", "--key"]).arg(&key));
    assert!(ok, "{stderr}");
    let auth = BindAuth::new(&Security {
        jwt_public_key: pem("PUBLIC KEY", &public_b64),
        ..Default::default()
    })
    .expect("auth");
    assert!(auth.check("bob", 1, token.trim()).is_ok());
    assert!(auth.check("alice", 1, token.trim()).is_err());

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
