//! The session's own tests (sans-IO: a fake clock and the protocol's machines).

use super::*;

#[test]
fn loopback_websocket_addresses() {
    for a in [
        "ws://localhost:8088/",
        "ws://LOCALHOST",
        "ws://127.0.0.1:8088",
        "ws://127.9.9.9/x",
        "ws://[::1]:8088/",
        "ws://127.0.0.1:8088?x=1",
    ] {
        assert!(is_loopback_ws(a), "{a}");
    }
    for a in [
        "wss://localhost/",
        "ws://example.com/",
        "ws://10.0.0.1:8088",
        "ws://localhost.example.com/",
        "ws://127.0.0.1.nip.io/",
        "ws://[::2]/",
        "ws://user@evil/",
        "tls://127.0.0.1:3000",
        "127.0.0.1:3000",
    ] {
        assert!(!is_loopback_ws(a), "{a}");
    }
}

/// mpush's published key, left as the default or given by value, is
/// refused for plain connections to other hosts unless the app opts in.
#[cfg(feature = "classic")]
#[test]
fn the_published_key_needs_an_opt_in_for_other_hosts() {
    let device = DeviceInfo {
        device_id: "d1".into(),
        ..DeviceInfo::default()
    };
    let config = |servers: &[&str], key: RsaPublic| {
        SessionConfig::new(
            servers.iter().map(|s| (*s).to_owned()).collect(),
            Arc::new(key),
            device.clone(),
        )
    };
    let pasted =
        RsaPublic::from_text(mpush_protocol::crypto::MPUSH_DEFAULT_PUBLIC_KEY).expect("loads");
    for key in [RsaPublic::mpush_default(), pasted] {
        for ok in [
            &["127.0.0.1:3000"][..],
            &["ws://localhost:8088/", "[::1]:3000"],
            &["tls://push.example.com:3000", "wss://push.example.com/"],
        ] {
            assert!(config(ok, key.clone()).validate().is_ok(), "{ok:?}");
        }
        for bad in [
            &["push.example.com:3000"][..],
            &["127.0.0.1:3000", "ws://10.0.0.1:8088/"],
        ] {
            let e = config(bad, key.clone()).validate().expect_err("refused");
            assert!(e.to_string().contains("allow_published_key"), "{e}");
            let mut c = config(bad, key.clone());
            c.allow_published_key = true;
            assert!(c.validate().is_ok(), "opted in");
        }
        let mut c = config(&[], key.clone());
        c.allocator_url = Some("http://alloc.example.com:9999/".into());
        assert!(c.validate().is_err(), "an allocator on another host");
        c.allocator_url = Some("http://127.0.0.1@alloc.example.com/".into());
        assert!(c.validate().is_err(), "userinfo is not the host");
    }
}

#[test]
fn loopback_addresses_in_every_form() {
    for a in [
        "127.0.0.1:3000",
        "tls://localhost:3000",
        "http://user:pw@127.0.0.1:9999/",
        "[::1]:3000",
    ] {
        assert!(is_loopback_address(a), "{a}");
    }
    for a in [
        "10.0.0.1:3000",
        "http://127.0.0.1@evil.example/",
        "push.example.com:3000",
    ] {
        assert!(!is_loopback_address(a), "{a}");
    }
}
