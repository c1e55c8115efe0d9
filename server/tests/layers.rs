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

/// A crate's modules at one level (the files and folders of `dir`) and the
/// ones each imports: `crate::x` from the crate's root, `super::x` from a
/// folder's children. Test modules are left out (they may import anything).
fn module_graph(dir: &Path, prefix: &str) -> Vec<(String, Vec<String>)> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = e.path();
        let name = p.file_stem().expect("name").to_string_lossy().to_string();
        if (p.is_dir() || p.extension().is_some_and(|x| x == "rs"))
            && !["lib", "main", "mod"].contains(&name.as_str())
            && !names.contains(&name)
        {
            names.push(name);
        }
    }
    names.sort();
    let mut graph = Vec::new();
    for name in &names {
        let mut files = Vec::new();
        let sub = dir.join(name);
        if sub.is_dir() {
            sources(&sub, &mut files);
        }
        let file = dir.join(format!("{name}.rs"));
        if file.is_file() {
            files.push(file);
        }
        let mut uses = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f).expect("read source");
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(i) => &text[..i],
                None => &text,
            };
            for other in &names {
                if other != name
                    && !uses.contains(other)
                    && [";", "::", ",", "}", " "]
                        .iter()
                        .any(|end| text.contains(&format!("{prefix}{other}{end}")))
                {
                    uses.push(other.clone());
                }
            }
        }
        graph.push((name.clone(), uses));
    }
    graph
}

/// The circles in a graph (each strongly connected set of two or more).
fn circles(graph: &[(String, Vec<String>)]) -> Vec<Vec<String>> {
    let reach = |from: &str| {
        let mut seen = vec![from.to_string()];
        let mut todo = vec![from.to_string()];
        while let Some(n) = todo.pop() {
            if let Some((_, next)) = graph.iter().find(|(m, _)| *m == n) {
                for x in next {
                    if !seen.contains(x) {
                        seen.push(x.clone());
                        todo.push(x.clone());
                    }
                }
            }
        }
        seen
    };
    let mut out: Vec<Vec<String>> = Vec::new();
    for (n, _) in graph {
        let mut set: Vec<String> = reach(n)
            .into_iter()
            .filter(|m| m != n && reach(m).contains(n))
            .collect();
        if !set.is_empty() {
            set.push(n.clone());
            set.sort();
            if !out.contains(&set) {
                out.push(set);
            }
        }
    }
    out
}

#[test]
fn no_module_imports_in_a_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for krate in ["protocol", "server", "sdk-core", "filter"] {
        let src = root.join(krate).join("src");
        for c in circles(&module_graph(&src, "crate::")) {
            found.push(format!("{krate}: {}", c.join(" ↔ ")));
        }
        // One level down: the files of each folder module, by `super::x`.
        for e in std::fs::read_dir(&src).expect("read dir").flatten() {
            if e.path().is_dir() {
                for c in circles(&module_graph(&e.path(), "super::")) {
                    let folder = e.file_name().to_string_lossy().to_string();
                    found.push(format!("{krate}/{folder}: {}", c.join(" ↔ ")));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "modules that import each other: {found:#?}"
    );
}

#[test]
fn the_circle_check_finds_a_circle() {
    let g = vec![
        ("a".to_string(), vec!["b".to_string()]),
        ("b".to_string(), vec!["c".to_string()]),
        ("c".to_string(), vec!["a".to_string()]),
        ("d".to_string(), vec!["a".to_string()]),
    ];
    assert_eq!(circles(&g), vec![vec!["a", "b", "c"]]);
    assert!(circles(&g[3..]).is_empty());
}
