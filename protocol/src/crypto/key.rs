//! Key material and sizes shared by every build (the slim one too).

use zeroize::{Zeroize, ZeroizeOnDrop};

pub const AES_KEY_LEN: usize = 16;
pub const GCM_NONCE_LEN: usize = 12;
pub const GCM_TAG_LEN: usize = 16;

/// 16 bytes of AES key material, wiped on drop.
#[derive(Clone, PartialEq, Eq, Zeroize, ZeroizeOnDrop)]
pub struct AesKey(pub [u8; AES_KEY_LEN]);

impl std::fmt::Debug for AesKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AesKey(..)")
    }
}
