//! Free loopback ports for the processes a test or the bench starts. One
//! file, included by `#[path]` in the server's tests, the CLI's tests and
//! `mpush-bench` (no crate is shared between them).
#![allow(dead_code)]

/// A loopback port nothing listens on, for a process a test starts.
///
/// Below the kernel's ephemeral range: a port it handed out for
/// `127.0.0.1:0` and this test released may be taken as the source port of
/// the next outgoing connection (tests run in parallel and connect a lot),
/// and the process started on it then fails with "address in use". The
/// kernel never picks source ports below the range. Candidates rotate from an
/// offset of the process id, so parallel tests and processes try different ones.
pub fn free_port() -> u16 {
    try_free_port().expect("a free loopback port")
}

/// [`free_port`], with an error instead of a panic. Without room below the
/// range it falls back to the kernel's choice (and its race).
pub fn try_free_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 10_000;
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    if low > FIRST + 1_000 {
        let span = low - FIRST;
        let offset = std::process::id().wrapping_mul(7_919);
        for _ in 0..span.min(4_096) {
            let n = offset.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
            // FIRST + n % span < low, and `low` came from a port range.
            let port = (FIRST + n % span) as u16;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
