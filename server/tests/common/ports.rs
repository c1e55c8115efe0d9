//! Free loopback ports for the processes a test starts (shared with the
//! CLI's tests through `#[path]`).

/// A loopback port nothing listens on, for a process a test starts.
///
/// Below the kernel's ephemeral range: a port it handed out for
/// `127.0.0.1:0` and this test released may be taken as the source port of
/// the next outgoing connection (tests run in parallel and connect a lot),
/// and the process started on it then fails with "address in use". The
/// kernel never picks source ports below the range. Candidates rotate from an
/// offset of the process id, so parallel tests and processes try different ones.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 10_000;
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    if low > FIRST + 1_000 {
        let offset = std::process::id().wrapping_mul(7_919);
        for _ in 0..4_096 {
            let n = offset.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
            let port = u16::try_from(FIRST + n % (low - FIRST)).expect("below 65536");
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port")
}
