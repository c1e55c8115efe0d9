//! The container files, checked without Docker (not on this machine): the
//! Dockerfile's shape (hadolint lints it too, in the test command), the
//! compose file's nodes (each node's settings load and validate exactly as
//! that node would start), and the example config (every setting there).

use std::collections::BTreeMap;
use std::path::Path;

use mpush_server::Settings;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn read(p: &str) -> String {
    std::fs::read_to_string(root().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

#[test]
fn the_dockerfile_builds_locked_and_runs_as_non_root_on_a_small_image() {
    let text = read("Dockerfile");
    let instructions: Vec<(String, String)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, _)| k.chars().all(|c| c.is_ascii_uppercase()))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let froms: Vec<&str> = instructions
        .iter()
        .filter(|(k, _)| k == "FROM")
        .map(|(_, v)| v.as_str())
        .collect();
    assert!(froms.len() >= 2, "multi-stage: {froms:?}");
    let toolchain = read("rust-toolchain.toml");
    let pinned = toolchain
        .lines()
        .find_map(|l| l.strip_prefix("channel = "))
        .expect("a pinned channel")
        .trim_matches('"');
    assert!(
        froms[0].starts_with(&format!("rust:{pinned}")),
        "the build stage uses the pinned Rust {pinned}: {}",
        froms[0]
    );
    assert!(text.contains("--locked"), "cargo build --locked");
    // The last stage: a non-root user, the binary as the entry point.
    let last = instructions
        .iter()
        .rposition(|(k, _)| k == "FROM")
        .expect("FROM");
    let final_stage = &instructions[last..];
    let user = final_stage
        .iter()
        .find(|(k, _)| k == "USER")
        .map(|(_, v)| v.as_str())
        .expect("USER in the final stage");
    assert!(
        !matches!(user.split(':').next(), Some("root" | "0")),
        "non-root: {user}"
    );
    let expose = final_stage
        .iter()
        .find(|(k, _)| k == "EXPOSE")
        .map(|(_, v)| v.clone())
        .expect("EXPOSE");
    for port in ["3000", "8088", "9999", "3001"] {
        assert!(
            expose.split_whitespace().any(|p| p == port),
            "{port}: {expose}"
        );
    }
    assert!(
        final_stage
            .iter()
            .any(|(k, v)| k == "ENTRYPOINT" && v.contains("mpush-server")),
        "ENTRYPOINT mpush-server"
    );
}

/// Each service's `environment:` map, from the compose file's simple layout.
fn compose_nodes(text: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut nodes = BTreeMap::new();
    let mut service: Option<String> = None;
    let mut in_env = false;
    for line in text.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if indent == 2 && t.ends_with(':') {
            service = Some(t.trim_end_matches(':').to_owned());
            in_env = false;
        } else if indent == 4 {
            in_env = t == "environment:";
        } else if indent == 6
            && in_env
            && let (Some(s), Some((k, v))) = (&service, t.split_once(": "))
        {
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(v);
            nodes
                .entry(s.clone())
                .or_insert_with(Vec::new)
                .push((k.to_owned(), v.to_owned()));
        }
    }
    nodes
}

#[test]
#[allow(clippy::result_large_err)] // figment's Jail API
fn every_compose_node_would_start_with_its_settings() {
    let nodes = compose_nodes(&read("deploy/compose.yaml"));
    assert_eq!(
        nodes.keys().collect::<Vec<_>>(),
        ["node-a", "node-b", "node-c"],
        "{nodes:?}"
    );
    let (_, der) =
        mpush_protocol::crypto::RsaPrivate::generate(&mut mpush_server::clock::rng(), 2048)
            .expect("a key");
    let pem = pem::encode(&pem::Pem::new("PRIVATE KEY", der));
    let mut ids = Vec::new();
    for (name, env) in &nodes {
        figment::Jail::expect_with(|jail| {
            jail.create_file("key.pem", &pem)?;
            let key_path = jail.directory().join("key.pem");
            for (k, v) in env {
                let v = match v.as_str() {
                    v if v.contains("${MPUSH_API_TOKEN") => {
                        "[\"compose-api-token-0123456789\"]".to_owned()
                    }
                    v if v.contains("${MPUSH_JWT_SECRET") => "j".repeat(40),
                    v if v.contains("${MPUSH_NODE_SECRET") => "n".repeat(40),
                    "/run/secrets/mpush_key" => key_path.to_string_lossy().into_owned(),
                    v => v.to_owned(),
                };
                assert!(k.starts_with("MPUSH__"), "{name}: {k}");
                jail.set_env(k, v);
            }
            let s = Settings::load(None).map_err(|e| e.to_string())?;
            let cfg = s
                .validate()
                .map_err(|e| format!("{name} would not start: {e}"))?;
            assert!(!cfg.default_key, "{name}: its own key");
            assert_eq!(cfg.tcp.port(), 3000);
            ids.push(cfg.settings.cluster.node_id.clone());
            Ok(())
        });
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "distinct node ids");
}

#[test]
fn the_example_config_names_every_setting() {
    let example = read("deploy/config.example.toml");
    let defaults = toml::to_string(&Settings::default()).expect("toml");
    let mut section = String::new();
    let mut missing = Vec::new();
    for line in defaults.lines() {
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_owned();
            assert!(example.contains(&format!("# [{s}]")), "[{s}] missing");
        } else if let Some((k, _)) = line.split_once(" = ")
            && !example.contains(&format!("# {k} = "))
        {
            missing.push(format!("{section}.{k}"));
        }
    }
    assert!(
        missing.is_empty(),
        "not in deploy/config.example.toml: {missing:?}"
    );
    // Uncommented, it is a valid settings file (up to the sink examples,
    // which are tables of their own).
    let settings_part = example.split("\n# [[").next().unwrap_or_default();
    let uncommented: String = settings_part
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| {
            l.starts_with('[') && l.ends_with(']') && !l.starts_with("[[")
                || l.split_once(" = ")
                    .is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let s: Settings = toml::from_str(&uncommented)
        .unwrap_or_else(|e| panic!("the example, uncommented: {e}\n{uncommented}"));
    assert_eq!(s, Settings::default(), "its values are the defaults");
}
