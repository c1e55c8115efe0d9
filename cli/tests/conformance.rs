//! The conformance kit's client mode against this SDK (the native core,
//! through `mpush conformance-adapter`), over TCP and WebSocket, offering v2
//! and as a legacy mpush 0.8.1 client. The tables go to target/conformance/.

use mpush_conformance::client::{CASES, ClientKit, Transport};
use mpush_conformance::{Outcome, Report};

/// The tables of the test command's runs, under target/conformance/.
fn save(report: &Report, name: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/conformance");
    if let Err(e) = report.save(&dir, name) {
        eprintln!("target/conformance/{name}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_sdk_passes_the_client_cases() {
    let bin = env!("CARGO_BIN_EXE_mpush").to_owned();
    let work = std::env::temp_dir().join(format!("mpush-conformance-{}", std::process::id()));
    let mut report = Report {
        subject: "native SDK (mpush conformance-adapter)".into(),
        ..Default::default()
    };
    let runs: [(&str, Transport, Vec<String>); 3] = [
        (
            "native-tcp",
            Transport::Tcp,
            vec![bin.clone(), "conformance-adapter".into()],
        ),
        (
            "native-ws",
            Transport::Ws,
            vec![bin.clone(), "conformance-adapter".into()],
        ),
        (
            "native-legacy",
            Transport::Tcp,
            vec![
                "env".into(),
                "MPUSH_CONFORMANCE_LEGACY=1".into(),
                bin.clone(),
                "conformance-adapter".into(),
            ],
        ),
    ];
    for (label, transport, command) in runs {
        let kit = ClientKit {
            command,
            transport,
            label: label.into(),
            work_dir: work.join(label),
        };
        for r in kit.run(&[]).await {
            report.push(r);
        }
    }
    println!("{}", report.table());
    save(&report, "client-native");
    let c = report.counts();
    assert_eq!(c.failed, 0, "{}", report.table());
    assert_eq!(report.results.len(), CASES.len() * 3);
    // What the legacy profile cannot offer is said so, and only that.
    for r in &report.results {
        if let Outcome::NotOffered(_) = r.outcome {
            assert_eq!(r.over, "native-legacy", "{r:?}");
            assert!(
                ["client.push.duplicate", "client.redirect"].contains(&r.id.as_str()),
                "{r:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}
