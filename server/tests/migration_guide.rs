//! docs/migrating-from-mpush.md, executed: its Java program (JDK only)
//! pushes through a live server to a bound client, and its settings table
//! covers every key of mpush 0.8.1's documented defaults, as
//! `config from-mpush` reads them.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn guide() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/migrating-from-mpush.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The guide's one ```java block.
fn java_program(guide: &str) -> String {
    let start = guide.find("```java\n").expect("a ```java block") + "```java\n".len();
    let len = guide[start..].find("```").expect("its end");
    guide[start..start + len].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guide_s_java_program_pushes_to_a_bound_user() {
    let program = java_program(&guide());
    let dir = std::env::temp_dir().join(format!("mpush-guide-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("PushExample.java");
    std::fs::write(&file, program).expect("write");
    let server = start(settings()).await;
    let api = format!("http://{}", server.http);
    let mut client = bound(
        &server,
        Via::Tcp,
        false,
        device("d-java", "android"),
        "guide-user",
        "",
    )
    .await;

    let run = |user: &'static str| {
        let (api, file) = (api.clone(), file.clone());
        tokio::task::spawn_blocking(move || {
            Command::new(java())
                .arg(&file)
                .arg(&api)
                .arg(user)
                .env_remove("MPUSH_API_TOKEN")
                .output()
                .expect("java runs")
        })
    };
    let o = run("guide-user").await.expect("join");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && stdout.starts_with("sent "),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    client.message("hello from Java").await;
    // The program asks to keep it for an offline user (ttlSeconds): that is
    // a 200 too, with `stored`.
    let o = run("nobody-here").await.expect("join");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && stdout.contains("\"stored\":true"),
        "{stdout}"
    );
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Does `pattern` (with `*` for any run of characters) match `key`?
fn glob(pattern: &str, key: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut rest = key;
    for (i, p) in parts.iter().enumerate() {
        if i == 0 {
            let Some(r) = rest.strip_prefix(p) else {
                return false;
            };
            rest = r;
        } else if i == parts.len() - 1 {
            return rest.ends_with(p);
        } else {
            match rest.find(p) {
                Some(at) => rest = &rest[at + p.len()..],
                None => return false,
            }
        }
    }
    rest.is_empty()
}

/// The mpush keys the guide's settings table names: backticked `mp.` keys,
/// and the short names beside one (`max-heartbeat` after
/// `mp.core.min-heartbeat`) completed with its prefix.
fn table_patterns(guide: &str) -> Vec<String> {
    let mut out = Vec::new();
    for row in guide.lines().filter(|l| l.starts_with("| `mp.")) {
        let first_cell = row.split('|').nth(1).unwrap_or_default();
        let mut prefix = String::new();
        for (i, tok) in first_cell.split('`').enumerate() {
            if i % 2 == 0 || tok.is_empty() {
                continue;
            }
            if tok.starts_with("mp.") {
                let path = tok.trim_end_matches(".*");
                prefix = path[..path.rfind('.').unwrap_or(0) + 1].to_owned();
                out.push(tok.to_owned());
            } else {
                out.push(format!("{prefix}{tok}"));
            }
        }
    }
    out
}

#[test]
fn the_guide_s_settings_table_covers_every_key_of_mpush_s_defaults() {
    let conf = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mpush-0.8.1-defaults.conf"),
    )
    .expect("the defaults");
    // Every leaf key of the defaults file, as the converter sees it: what it
    // mapped (named in its comments) and what it did not (listed).
    let c = mpush_server::from_mpush::convert(&conf, "/opt/mpush").expect("converts");
    let mut keys: Vec<String> = c
        .toml
        .lines()
        .filter_map(|l| l.strip_prefix("# from "))
        .map(|l| l.split([' ', ':']).next().unwrap_or_default().to_owned())
        .chain(c.unmapped.iter().map(|(k, _)| k.clone()))
        .collect();
    keys.sort();
    keys.dedup();
    assert!(keys.len() > 20, "{keys:?}");
    let patterns = table_patterns(&guide());
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| {
            let k = k.trim_end_matches(".*");
            // A group the converter read whole (`flow-control.global`) is
            // named by its keys.
            !patterns.iter().any(|p| {
                glob(p, k) || glob(p.trim_end_matches(".*"), k) || p.starts_with(&format!("{k}."))
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "keys the guide's table does not name: {missing:?}\npatterns: {patterns:?}"
    );
}
