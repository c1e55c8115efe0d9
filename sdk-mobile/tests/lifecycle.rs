//! `shutdown()`, or freeing a client without it, stops its runtime: no
//! thread is left behind. (One test per binary: it counts the process's threads.)

use std::sync::Arc;
use std::time::Duration;

use mpush_sdk_mobile::{ConnectionState, PushClient, PushConfig, PushError};

fn sdk_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "mpush-sdk")
                })
                .count()
        })
        .unwrap_or(0)
}

fn config(server: String) -> PushConfig {
    PushConfig {
        servers: vec![server],
        device_id: "lifecycle".into(),
        allocator_url: None,
        public_key: None,
        os_name: "android".into(),
        os_version: String::new(),
        client_version: String::new(),
        offer_v2: true,
        heartbeat_ms: None,
        connect_timeout_ms: Some(1000),
        backoff_initial_ms: Some(20),
        backoff_max_ms: Some(50),
        dedup_capacity: Some(16),
        outbound_capacity: Some(2),
        tls_pinned_cert_pem: None,
        transport_profile: false,
        allow_published_key: false,
    }
}

#[test]
fn dropping_a_client_stops_its_thread_and_bad_input_is_refused() {
    // A loopback port nobody listens on: the client keeps retrying.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    assert_eq!(sdk_threads(), 0);
    let client = PushClient::new(config(format!("127.0.0.1:{port}")), None, None).expect("valid");
    assert_eq!(
        client.ack(1).map_err(|e| e.code()),
        Err("invalid_state".to_owned()),
        "calls before connect() are refused"
    );
    assert_eq!(client.state(), ConnectionState::Idle);
    client.connect().expect("starts");
    std::thread::sleep(Duration::from_millis(300));
    assert!(sdk_threads() >= 1, "the SDK runs on its own thread");
    assert!(
        matches!(
            client.state(),
            ConnectionState::Connecting | ConnectionState::Disconnected
        ),
        "{:?}",
        client.state()
    );
    // Up-pushes queue while offline, up to the bound; then QueueFull.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("rt");
    for _ in 0..2 {
        let c = Arc::clone(&client);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("rt");
            let _ = rt.block_on(c.push(b"queued".to_vec(), true));
        });
    }
    std::thread::sleep(Duration::from_millis(200));
    let full = rt.block_on(client.push(b"one too many".to_vec(), false));
    assert_eq!(
        full.as_ref().map_err(PushError::code),
        Err("queue_full".to_owned()),
        "{full:?}"
    );
    // Calls in flight hold the object: shutdown() ends them with Stopped.
    client.shutdown();
    assert_eq!(sdk_threads(), 0, "no thread left behind after shutdown()");
    assert_eq!(client.state(), ConnectionState::Closed);
    assert!(matches!(
        rt.block_on(client.push(b"late".to_vec(), false)),
        Err(PushError::Stopped)
    ));
    drop(client);

    // Freed without shutdown(): Drop stops the runtime.
    let other = PushClient::new(config(format!("127.0.0.1:{port}")), None, None).expect("valid");
    other.connect().expect("starts");
    std::thread::sleep(Duration::from_millis(100));
    assert!(sdk_threads() >= 1);
    drop(other);
    assert_eq!(sdk_threads(), 0, "no thread left behind after drop");

    let bad = PushClient::new(
        PushConfig {
            device_id: String::new(),
            ..config("x:1".into())
        },
        None,
        None,
    );
    assert!(matches!(bad, Err(PushError::InvalidInput { .. })));
    // The core's rules (SessionConfig::validate), with the field named.
    match PushClient::new(
        PushConfig {
            outbound_capacity: Some(0),
            ..config("x:1".into())
        },
        None,
        None,
    ) {
        Err(PushError::InvalidInput { reason }) => {
            assert!(reason.contains("outbound_capacity"), "{reason}")
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}
