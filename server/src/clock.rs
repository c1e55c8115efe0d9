//! The wall clock, read only by drivers (the protocol gets it as a value).

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A fresh 32-byte seed from the OS for a protocol machine's RNG.
pub fn seed() -> [u8; 32] {
    let mut s = [0u8; 32];
    // The OS RNG failing is unrecoverable for a server that must hand out keys.
    getrandom::fill(&mut s).expect("OS random number generator");
    s
}

/// A cryptographically secure RNG, freshly seeded from the OS.
pub fn rng() -> mpush_protocol::crypto::Rng {
    rand_core::SeedableRng::from_seed(seed())
}

/// A random lowercase hex id of `n` bytes.
pub fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("OS random number generator");
    hex::encode(b)
}

/// A uniformly random number below `n` (0 when `n` is 0).
pub fn random_below(n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("OS random number generator");
    u64::from_le_bytes(b) % n
}
