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

/// This thread's ChaCha20 generator, seeded from the OS, and how many bytes
/// it gave since.
struct ThreadRng {
    rng: mpush_protocol::crypto::Rng,
    since_seed: usize,
}

/// Bytes a thread's generator gives before it is seeded from the OS again
/// (as `rand`'s `ThreadRng` does): what a compromise of its state could
/// predict is bounded, and a reseed is one `getrandom` call per 2,048
/// connection seeds.
const RESEED_AFTER: usize = 64 * 1024;

/// `b` filled from this thread's generator.
fn fill_from_thread(b: &mut [u8]) {
    thread_local! {
        static RNG: std::cell::RefCell<ThreadRng> = std::cell::RefCell::new(ThreadRng {
            rng: rng(),
            since_seed: 0,
        });
    }
    RNG.with_borrow_mut(|t| {
        if t.since_seed >= RESEED_AFTER {
            t.rng = rng();
            t.since_seed = 0;
        }
        t.since_seed += b.len();
        rand_core::Rng::fill_bytes(&mut t.rng, b);
    });
}

/// The seed of one connection's protocol machine (its nonces and keys):
/// from this thread's generator, not a `getrandom` system call per
/// connection (about 1.7 % of the server's CPU per fast connect).
pub fn conn_seed() -> [u8; 32] {
    let mut s = [0u8; 32];
    fill_from_thread(&mut s);
    s
}

/// A random lowercase hex id of `n` bytes.
///
/// From this thread's generator: a push's trace id no longer costs a
/// `getrandom` system call (about 1 % of the server's CPU in batch
/// unicast). The ids stay unguessable.
pub fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    fill_from_thread(&mut b);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_hex_of_their_length_and_differ_across_calls_and_threads() {
        let here: Vec<String> = (0..100).map(|_| random_hex(16)).collect();
        assert!(here.iter().all(|id| {
            id.len() == 32
                && id
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        }));
        let there: Vec<String> = std::thread::spawn(|| (0..100).map(|_| random_hex(16)).collect())
            .join()
            .expect("joins");
        let all: std::collections::HashSet<_> = here.iter().chain(&there).collect();
        assert_eq!(all.len(), 200, "each thread's generator has its own seed");
        assert_eq!(random_hex(6).len(), 12);
        // Past the reseed bound too, the seeds never repeat.
        let seeds: std::collections::HashSet<[u8; 32]> =
            (0..3 * RESEED_AFTER / 32).map(|_| conn_seed()).collect();
        assert_eq!(seeds.len(), 3 * RESEED_AFTER / 32);
        assert_eq!(random_hex(40).len(), 80);
    }
}
