//! A small hash-based random generator: SHA-256 in counter mode over a key that
//! is replaced after every block (forward secrecy: a state captured later does
//! not reveal what was drawn before).
//!
//! It is the `Rng` of the build without the classic crypto (the browser's
//! transport-only module, ADR 0005): SHA-256 is linked there anyway for the
//! resume proofs, so this costs a few hundred bytes where ChaCha20 cost 13 KB.
//! The classic build keeps ChaCha20, which is faster per byte for the server.
//!
//! Construction, per 32-byte block `n` (a 64-bit counter, big endian):
//! `out = SHA-256(key | 0x01 | n)`, then `key = SHA-256(key | 0x00 | n)`.
//! Both are SHA-256 of distinct inputs under a secret prefix, the shape of
//! NIST SP 800-90A's Hash_DRBG without its reseeding (the machines that own
//! one live for one connection or one session).

use std::convert::Infallible;

use rand_core::{SeedableRng, TryCryptoRng, TryRng};
use sha2::{Digest, Sha256};
use zeroize::{Zeroize, ZeroizeOnDrop};

/// The generator. Seeded with 32 random bytes by the driver.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct HashDrbg {
    key: [u8; 32],
    counter: u64,
    block: [u8; 32],
    /// Bytes of `block` already handed out.
    used: usize,
}

impl std::fmt::Debug for HashDrbg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HashDrbg(..)")
    }
}

impl HashDrbg {
    fn hash(&self, domain: u8) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update([domain]);
        h.update(self.counter.to_be_bytes());
        h.finalize().into()
    }

    fn refill(&mut self) {
        self.block = self.hash(1);
        self.key = self.hash(0);
        self.counter = self.counter.wrapping_add(1);
        self.used = 0;
    }

    fn fill(&mut self, dst: &mut [u8]) {
        let mut dst = dst;
        while !dst.is_empty() {
            if self.used == self.block.len() {
                self.refill();
            }
            let n = dst.len().min(self.block.len() - self.used);
            let (head, rest) = dst.split_at_mut(n);
            head.copy_from_slice(&self.block[self.used..self.used + n]);
            // Handed-out bytes do not stay in the state.
            self.block[self.used..self.used + n].zeroize();
            self.used += n;
            dst = rest;
        }
    }
}

impl SeedableRng for HashDrbg {
    type Seed = [u8; 32];

    fn from_seed(seed: Self::Seed) -> Self {
        Self {
            key: seed,
            counter: 0,
            block: [0; 32],
            used: 32,
        }
    }
}

impl TryRng for HashDrbg {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        let mut b = [0u8; 4];
        self.fill(&mut b);
        Ok(u32::from_le_bytes(b))
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        let mut b = [0u8; 8];
        self.fill(&mut b);
        Ok(u64::from_le_bytes(b))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.fill(dst);
        Ok(())
    }
}

impl TryCryptoRng for HashDrbg {}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::Rng as _;

    #[test]
    fn first_block_is_the_documented_construction() {
        let seed = [7u8; 32];
        let mut rng = HashDrbg::from_seed(seed);
        let mut got = [0u8; 40];
        rng.fill_bytes(&mut got);

        let h = |key: &[u8], domain: u8, n: u64| -> [u8; 32] {
            let mut d = Sha256::new();
            d.update(key);
            d.update([domain]);
            d.update(n.to_be_bytes());
            d.finalize().into()
        };
        let out0 = h(&seed, 1, 0);
        let key1 = h(&seed, 0, 0);
        let out1 = h(&key1, 1, 1);
        assert_eq!(&got[..32], &out0);
        assert_eq!(&got[32..], &out1[..8]);
    }

    #[test]
    fn draws_in_pieces_equal_one_draw() {
        let mut a = HashDrbg::from_seed([1; 32]);
        let mut b = HashDrbg::from_seed([1; 32]);
        let mut whole = [0u8; 100];
        a.fill_bytes(&mut whole);
        let mut parts = Vec::new();
        for n in [3usize, 29, 1, 32, 35] {
            let mut p = vec![0u8; n];
            b.fill_bytes(&mut p);
            parts.extend(p);
        }
        assert_eq!(&whole[..], &parts[..]);
        let x = a.next_u64();
        let mut c = HashDrbg::from_seed([1; 32]);
        let mut skip = [0u8; 100];
        c.fill_bytes(&mut skip);
        assert_eq!(x, c.next_u64());
    }

    #[test]
    fn seeds_give_different_streams_and_no_short_cycle() {
        let mut a = HashDrbg::from_seed([1; 32]);
        let mut b = HashDrbg::from_seed([2; 32]);
        assert_ne!(a.next_u64(), b.next_u64());
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            assert!(seen.insert(a.next_u64()), "a repeated 64-bit draw");
        }
        // Roughly uniform bits: each bit of 10,000 draws set 50 % +- 3 %.
        let mut ones = [0u32; 64];
        for v in &seen {
            for (i, o) in ones.iter_mut().enumerate() {
                *o += ((v >> i) & 1) as u32;
            }
        }
        assert!(ones.iter().all(|&o| (4700..=5300).contains(&o)), "{ones:?}");
    }
}
