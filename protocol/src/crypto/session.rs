//! The AES session ciphers: legacy AES-128-CBC/PKCS#7 with the session's static
//! IV (spec 5.1), and v2 AES-128-GCM with a fresh random nonce per packet,
//! prefixed to the ciphertext, and the packet header as associated data.

use aes::{Aes128Dec, Aes128Enc};
/// AES-128-GCM over the encryption-only key schedule (CTR mode never
/// decrypts a block): half the memory per connection of `aes_gcm::Aes128Gcm`.
type Aes128Gcm = aes_gcm::AesGcm<aes::Aes128Enc, aes_gcm::aead::consts::U12>;
use aes_gcm::aead::{Aead, AeadInOut, KeyInit, Payload};
use cbc::cipher::{BlockModeDecrypt, BlockModeEncrypt, InnerIvInit, block_padding::Pkcs7};
use zeroize::Zeroize;

use super::{Rng, random_array};
use crate::error::CryptoError;

use super::key::{AesKey, GCM_NONCE_LEN, GCM_TAG_LEN};

/// The cipher a connection seals its bodies with. It holds only the key
/// (16 bytes, wiped on drop): the AES key schedule (and GCM's hash key) is
/// expanded for each packet and wiped after it. An idle connection then holds
/// no 176–320-byte schedule on the heap; expanding one takes tens of
/// nanoseconds with AES-NI, small beside sealing and writing the packet.
#[derive(Clone)]
pub enum SessionCipher {
    /// Legacy: CBC, same IV for every packet, no integrity.
    Cbc { key: AesKey, iv: [u8; 16] },
    /// v2: GCM, random 96-bit nonce per packet.
    Gcm { key: AesKey },
}

impl std::fmt::Debug for SessionCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cbc { .. } => f.write_str("SessionCipher::Cbc"),
            Self::Gcm { .. } => f.write_str("SessionCipher::Gcm"),
        }
    }
}

impl Drop for SessionCipher {
    fn drop(&mut self) {
        if let Self::Cbc { iv, .. } = self {
            iv.zeroize();
        }
    }
}

impl SessionCipher {
    pub fn cbc(key: &AesKey, iv: [u8; 16]) -> Self {
        Self::Cbc {
            key: key.clone(),
            iv,
        }
    }

    pub fn gcm(key: &AesKey) -> Self {
        Self::Gcm { key: key.clone() }
    }

    pub fn is_aead(&self) -> bool {
        matches!(self, Self::Gcm { .. })
    }

    /// The CBC key and IV (what mpush stores to resume a legacy session).
    pub fn cbc_material(&self) -> Option<(&AesKey, &[u8; 16])> {
        match self {
            Self::Cbc { key, iv, .. } => Some((key, iv)),
            Self::Gcm { .. } => None,
        }
    }

    /// Seals a body under a random nonce. `aad` is ignored by CBC.
    pub fn seal(&self, rng: &mut Rng, aad: &[u8], plain: &[u8]) -> Vec<u8> {
        let nonce: [u8; GCM_NONCE_LEN] = match self {
            Self::Cbc { .. } => [0; GCM_NONCE_LEN],
            Self::Gcm { .. } => random_array(rng),
        };
        self.seal_with_nonce(nonce, aad, plain)
    }

    /// Seals a body under `nonce` (GCM; CBC ignores it), which must never
    /// repeat under this key: a counter per connection key does that.
    pub fn seal_with_nonce(&self, nonce: [u8; GCM_NONCE_LEN], aad: &[u8], plain: &[u8]) -> Vec<u8> {
        self.expand().seal_with_nonce(nonce, aad, plain)
    }

    /// The key schedule (and GCM's hash key) expanded once, to seal several
    /// packets of one burst with (`Sealer::seal_counted`); wiped on drop.
    pub fn expand(&self) -> Expanded {
        match self {
            Self::Cbc { key, iv } => Expanded::Cbc {
                enc: aes_enc(key),
                iv: *iv,
            },
            Self::Gcm { key } => Expanded::Gcm(<Aes128Gcm as KeyInit>::new(&key.0.into())),
        }
    }

    /// Opens a body sealed by the peer.
    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
        match self {
            Self::Cbc { key, iv } => {
                if sealed.is_empty() || !sealed.len().is_multiple_of(16) {
                    return Err(CryptoError::Decrypt);
                }
                let dec = <Aes128Dec as aes::cipher::KeyInit>::new(&key.0.into());
                cbc::Decryptor::<Aes128Dec>::inner_iv_init(dec, &(*iv).into())
                    .decrypt_padded_vec::<Pkcs7>(sealed)
                    .map_err(|_| CryptoError::Decrypt)
            }
            Self::Gcm { key } => {
                let cipher = <Aes128Gcm as KeyInit>::new(&key.0.into());
                if sealed.len() < GCM_NONCE_LEN + GCM_TAG_LEN {
                    return Err(CryptoError::Decrypt);
                }
                let (nonce, body) = sealed.split_at(GCM_NONCE_LEN);
                let nonce: [u8; GCM_NONCE_LEN] =
                    nonce.try_into().map_err(|_| CryptoError::Decrypt)?;
                cipher
                    .decrypt(&nonce.into(), Payload { msg: body, aad })
                    .map_err(|_| CryptoError::Decrypt)
            }
        }
    }
}

/// A `SessionCipher`'s sealing side with its key schedule expanded: what
/// sealing one packet builds and drops, kept for the packets of a burst.
/// The AES schedule and GCM's hash key are wiped on drop (the crates'
/// `zeroize`), the CBC IV here.
pub enum Expanded {
    Cbc { enc: Aes128Enc, iv: [u8; 16] },
    Gcm(Aes128Gcm),
}

impl std::fmt::Debug for Expanded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cbc { .. } => f.write_str("Expanded::Cbc"),
            Self::Gcm(_) => f.write_str("Expanded::Gcm"),
        }
    }
}

impl Drop for Expanded {
    fn drop(&mut self) {
        if let Self::Cbc { iv, .. } = self {
            iv.zeroize();
        }
    }
}

impl Expanded {
    /// `SessionCipher::seal_with_nonce`, without expanding the key again.
    pub fn seal_with_nonce(&self, nonce: [u8; GCM_NONCE_LEN], aad: &[u8], plain: &[u8]) -> Vec<u8> {
        match self {
            Self::Cbc { enc, iv } => {
                cbc::Encryptor::<Aes128Enc>::inner_iv_init(enc.clone(), &(*iv).into())
                    .encrypt_padded_vec::<Pkcs7>(plain)
            }
            Self::Gcm(cipher) => {
                // nonce ‖ ciphertext ‖ tag, sealed in place in one buffer.
                let mut out = Vec::with_capacity(GCM_NONCE_LEN + plain.len() + GCM_TAG_LEN);
                out.extend_from_slice(&nonce);
                out.extend_from_slice(plain);
                // Encryption only fails for inputs beyond GCM's 64 GiB limit.
                match cipher.encrypt_inout_detached(
                    &nonce.into(),
                    aad,
                    (&mut out[GCM_NONCE_LEN..]).into(),
                ) {
                    Ok(tag) => out.extend_from_slice(&tag),
                    Err(_) => out.clear(),
                }
                out
            }
        }
    }
}

/// The encryption-only key schedule of `key`.
fn aes_enc(key: &AesKey) -> Aes128Enc {
    <Aes128Enc as aes::cipher::KeyInit>::new(&key.0.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;

    fn seq(start: u8) -> [u8; 16] {
        std::array::from_fn(|i| start + i as u8)
    }

    #[test]
    fn cbc_matches_spec_vector() {
        let mut rng = Rng::seed_from_u64(0);
        let c = SessionCipher::cbc(&AesKey([0xd0; 16]), seq(0x10));
        let bind = hex::decode("0006757365722d31000000057461672d31").expect("hex");
        let sealed = c.seal(&mut rng, &[], &bind);
        assert_eq!(
            hex::encode(&sealed),
            "30a376a11b0e915b96fa7f5e45f8b5f63de4c10d86e40f100232fb1afdef94ff"
        );
        assert_eq!(c.open(&[], &sealed).expect("opens"), bind);
        assert_eq!(c.open(&[], &sealed[..15]), Err(CryptoError::Decrypt));
    }

    #[test]
    fn gcm_uses_fresh_nonces_and_authenticates() {
        let mut rng = Rng::seed_from_u64(0);
        let c = SessionCipher::gcm(&AesKey([1; 16]));
        let a = c.seal(&mut rng, b"hdr", b"hello");
        let b = c.seal(&mut rng, b"hdr", b"hello");
        assert_ne!(a, b, "nonces differ");
        assert_eq!(c.open(b"hdr", &a).expect("opens"), b"hello");
        assert_eq!(c.open(b"other", &a), Err(CryptoError::Decrypt));
        let mut t = a.clone();
        t[20] ^= 1;
        assert_eq!(c.open(b"hdr", &t), Err(CryptoError::Decrypt));
        assert_eq!(c.open(b"hdr", &a[..10]), Err(CryptoError::Decrypt));
    }
}
