//! The server's layers: every crate-internal import points down (see
//! ARCHITECTURE.md). Read from the sources, so a new upward import fails here.

use std::path::Path;

/// Module → the top-level modules it must not import.
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("store", &["logic", "route", "cluster", "gateway", "api"]),
    ("route", &["logic", "cluster", "gateway", "api", "store"]),
    ("cluster", &["logic", "route", "gateway", "api", "store"]),
    ("logic", &["gateway", "api"]),
    (
        "sink",
        &["logic", "route", "cluster", "gateway", "api", "store"],
    ),
    ("gateway", &["api"]),
    (
        "tls",
        &[
            "logic", "route", "cluster", "gateway", "api", "store", "sink",
        ],
    ),
    (
        "telemetry",
        &[
            "logic", "route", "cluster", "gateway", "api", "store", "sink",
        ],
    ),
    (
        "redis_conn",
        &["logic", "route", "cluster", "gateway", "api", "store"],
    ),
];

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_import_points_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    for (module, forbidden) in FORBIDDEN {
        let mut files = Vec::new();
        let dir = src.join(module);
        if dir.is_dir() {
            sources(&dir, &mut files);
        } else {
            files.push(src.join(format!("{module}.rs")));
        }
        assert!(!files.is_empty(), "{module} has sources");
        for f in files {
            let text = std::fs::read_to_string(&f).expect("read source");
            for up in *forbidden {
                if text.contains(&format!("crate::{up}::"))
                    || text.contains(&format!("crate::{up};"))
                {
                    bad.push(format!("{} imports {up}", f.display()));
                }
            }
        }
    }
    assert!(bad.is_empty(), "upward imports: {bad:#?}");
}
