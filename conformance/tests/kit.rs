//! The kit against this project's server (TCP and WebSocket, pushes through
//! the HTTP API): every case passes or is honestly "not offered". Then the
//! kit against a deliberately broken server (a proxy that breaks the real
//! one in named ways): the cases each defect breaks fail, the rest pass.
//! The tables go to target/conformance/ (JSON and JUnit too).

use std::sync::Arc;
use std::time::Duration;

use mpush_conformance::broken::{self, Defect};
use mpush_conformance::conn::Target;
use mpush_conformance::server::{CASES, ServerKit};
use mpush_conformance::trigger::Trigger;
use mpush_conformance::{Outcome, Report};
use mpush_protocol::crypto::RsaPublic;
use mpush_server::{Running, Settings};

/// This server, with what lets the slow cases run in seconds: a short
/// handshake deadline, a short minimum heartbeat, a short fast-connect
/// window and quick ACK retries.
async fn server() -> Running {
    let mut s = Settings::default();
    s.net.tcp = "127.0.0.1:0".into();
    s.net.ws = "127.0.0.1:0".into();
    s.net.http = "127.0.0.1:0".into();
    s.limits.handshake_timeout_ms = 1_000;
    s.limits.min_heartbeat_ms = 1_000;
    s.delivery.session_ttl_secs = 2;
    s.delivery.ack_waits_ms = vec![500, 500];
    s.delivery.ack_retries = 2;
    mpush_server::start(s.validate().expect("valid"))
        .await
        .expect("starts")
}

fn kit(target: Target, api: String, run: &str) -> ServerKit {
    ServerKit {
        target,
        public_key: Arc::new(RsaPublic::mpush_default()),
        trigger: Trigger::Api {
            base: api,
            token: None,
        },
        session_ttl: Some(Duration::from_secs(2)),
        silence_limit: Duration::from_secs(4),
        run_id: run.into(),
    }
}

/// The tables of the test command's runs, under target/conformance/.
fn save(report: &Report, name: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/conformance");
    if let Err(e) = report.save(&dir, name) {
        eprintln!("target/conformance/{name}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_server_passes_every_case_over_tcp_and_websocket() {
    let s = server().await;
    let api = format!("http://{}", s.http);
    let mut report = Report {
        subject: "mpush-server via api".into(),
        ..Default::default()
    };
    let ws = format!("ws://{}/", s.ws.expect("ws"));
    for (target, run) in [(Target::Tcp(s.tcp.to_string()), "t"), (Target::Ws(ws), "w")] {
        for r in kit(target, api.clone(), run).run(&[]).await {
            report.push(r);
        }
    }
    println!("{}", report.table());
    save(&report, "server");
    let c = report.counts();
    assert_eq!(c.failed, 0, "{}", report.table());
    assert_eq!(report.results.len(), CASES.len() * 2);
    // This server offers everything the kit checks: nothing is "not
    // offered" or skipped here.
    assert_eq!((c.not_offered, c.skipped), (0, 0), "{}", report.table());
    // The JUnit and JSON forms say the same.
    let junit = report.junit();
    assert!(
        junit.contains("<testsuites") && junit.contains("server.push.biz_ack"),
        "{junit}"
    );
    let json: serde_json::Value = serde_json::from_str(&report.json()).expect("json");
    assert_eq!(json["counts"]["passed"], CASES.len() * 2);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_server_fails_the_cases_it_should() {
    let s = server().await;
    let api = format!("http://{}", s.http);
    let mut report = Report {
        subject: "broken fixture".into(),
        ..Default::default()
    };
    for defect in Defect::ALL {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let proxy = tokio::spawn(broken::serve(listener, s.tcp.to_string(), defect));
        // The cases the defect breaks, and one it does not, as a control.
        let mut only: Vec<String> = defect
            .breaks()
            .iter()
            .map(|id| id.trim_start_matches("server.").to_owned())
            .collect();
        only.push("bind.ok".into());
        let k = kit(Target::Tcp(addr.to_string()), api.clone(), defect.name());
        for mut r in k.run(&only).await {
            r.over = defect.name().into();
            let must_fail = defect.breaks().contains(&r.id.as_str());
            match (&r.outcome, must_fail) {
                (Outcome::Failed(_), true) | (Outcome::Passed, false) => {}
                (o, _) => panic!(
                    "{}: with the defect {} the case {} was {o:?}, expected {}",
                    r.id,
                    defect.name(),
                    if must_fail { "to fail" } else { "to pass" },
                    if must_fail { "FAILED" } else { "passed" }
                ),
            }
            report.push(r);
        }
        proxy.abort();
    }
    println!("{}", report.table());
    save(&report, "broken");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_client_fails_the_cases_it_should() {
    use mpush_conformance::broken::ClientDefect;
    use mpush_conformance::client::{ClientKit, Transport};
    let bin = env!("CARGO_BIN_EXE_mpush-conformance");
    let work = std::env::temp_dir().join(format!("mpush-broken-client-{}", std::process::id()));
    let mut report = Report {
        subject: "broken client fixture".into(),
        ..Default::default()
    };
    for defect in ClientDefect::ALL {
        let kit = ClientKit {
            command: vec![
                bin.into(),
                "broken-client".into(),
                "--defect".into(),
                defect.name().into(),
            ],
            transport: Transport::Tcp,
            label: defect.name().into(),
            work_dir: work.join(defect.name()),
        };
        let mut only: Vec<String> = defect
            .breaks()
            .iter()
            .map(|id| id.trim_start_matches("client.").to_owned())
            .collect();
        // A control: what the defect leaves alone passes.
        only.push("bind".into());
        for r in kit.run(&only).await {
            let must_fail = defect.breaks().contains(&r.id.as_str());
            match (&r.outcome, must_fail) {
                (Outcome::Failed(_), true) | (Outcome::Passed, false) => {}
                (o, _) => panic!(
                    "{}: with the client defect {} the case was {o:?}, expected it {}",
                    r.id,
                    defect.name(),
                    if must_fail { "to fail" } else { "to pass" }
                ),
            }
            report.push(r);
        }
    }
    println!("{}", report.table());
    save(&report, "broken-client");
    let _ = std::fs::remove_dir_all(&work);
}

/// A server that does not keep bindings (ADR 0008 is optional) does not
/// echo the bit: its kept-binding cases are "not offered", never failed,
/// and the rest of the fast-connect cases still pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_kept_bindings_is_not_offered_those_cases() {
    let mut s = Settings::default();
    s.net.tcp = "127.0.0.1:0".into();
    s.net.ws = "127.0.0.1:0".into();
    s.net.http = "127.0.0.1:0".into();
    s.limits.keep_binding = Some(false);
    let s = mpush_server::start(s.validate().expect("valid"))
        .await
        .expect("starts");
    let k = kit(
        Target::Tcp(s.tcp.to_string()),
        format!("http://{}", s.http),
        "nk",
    );
    let results = k
        .run(&[
            "fast_connect.resume".into(),
            "fast_connect.kept_binding".into(),
        ])
        .await;
    let ids: Vec<&str> = results.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    for r in &results {
        let kept = r.id.contains("kept_binding");
        match (&r.outcome, kept) {
            (Outcome::NotOffered(why), true) => assert!(why.contains("KEEP_BINDING"), "{why}"),
            (Outcome::Passed, false) => {}
            (o, _) => panic!("{}: {o:?}", r.id),
        }
    }
    s.shutdown().await;
}
