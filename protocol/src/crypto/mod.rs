//! Crypto of spec section 5 and of the v2 profile: RSA PKCS#1 v1.5 in chunks,
//! the AES session ciphers (legacy CBC with a static IV, v2 AES-128-GCM with a
//! fresh nonce per packet), key derivation, and zlib/gzip compression.
//!
//! Nothing here draws randomness on its own: callers pass the seeded RNG of the
//! state machine, so the same code runs in browsers and on a fake clock.

mod compress;
mod drbg;
mod kdf;
mod key;
#[cfg(feature = "classic")]
mod rsa;
#[cfg(feature = "classic")]
mod session;
#[cfg(not(feature = "classic"))]
mod slim;

#[cfg(feature = "deflate")]
pub use compress::compress;
pub use compress::{INFLATES, compress_over, decompress};
pub use kdf::{
    PROOF_LEN, RESUME_KEY_LEN, ResumeDerivation, ResumeKey, ResumeProofs, connection_key,
    legacy_session_key, next_resume_key, resume_accept_proof, resume_proof, v2_session_keys,
    verify_mac,
};
pub use key::{AES_KEY_LEN, AesKey, GCM_NONCE_LEN, GCM_TAG_LEN};
#[cfg(feature = "classic")]
pub use rsa::{MPUSH_DEFAULT_PRIVATE_KEY, MPUSH_DEFAULT_PUBLIC_KEY, RsaPrivate, RsaPublic};
#[cfg(feature = "classic")]
pub use session::{Expanded, SessionCipher};
#[cfg(not(feature = "classic"))]
pub use slim::{Expanded, RsaPublic, SessionCipher};

pub use drbg::HashDrbg;

/// The RNG every machine uses: seeded by the driver, cryptographically strong.
/// ChaCha20 in the classic build; the SHA-256 generator of `drbg` without it,
/// where SHA-256 is linked anyway and ChaCha20 would be 13 KB of the browser
/// module.
#[cfg(feature = "classic")]
pub type Rng = rand_chacha::ChaCha20Rng;
#[cfg(not(feature = "classic"))]
pub type Rng = HashDrbg;

/// Fills `N` random bytes.
pub fn random_array<const N: usize>(rng: &mut Rng) -> [u8; N] {
    let mut out = [0u8; N];
    rand_core::Rng::fill_bytes(rng, &mut out);
    out
}
