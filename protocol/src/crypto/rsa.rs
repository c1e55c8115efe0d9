//! RSA PKCS#1 v1.5 in `k - 11`-byte chunks, as mpush's `RSAUtils` does it.

use base64::Engine as _;
use rsa::pkcs8::{DecodePublicKey, PrivateKeyInfoRef};
use rsa::traits::PublicKeyParts;
use rsa::{BoxedUint, Pkcs1v15Encrypt, PrivateKey as RsaPrivateKey, PublicKey as RsaPublicKey};

use super::Rng;
use crate::error::CryptoError;

/// mpush's public default public key (X.509 SubjectPublicKeyInfo, base64), shipped
/// with every mpush client and demo. Anyone can decrypt traffic made with it.
pub const MPUSH_DEFAULT_PUBLIC_KEY: &str = "MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQCghPCWCobG8nTD24juwSVataW7iViRxcTkey/B792VZEhuHjQvA3cAJgx2Lv8GnX8NIoShZtoCg3Cx6ecs+VEPD2fBcg2L4JK7xldGpOJ3ONEAyVsLOttXZtNXvyDZRijiErQALMTorcgi79M5uVX9/jMv2Ggb2XAeZhlLD28fHwIDAQAB";

/// mpush's public default private key exactly as mpush ships it: a PKCS#8 box
/// around a stripped PKCS#1 key that holds only n and d.
pub const MPUSH_DEFAULT_PRIVATE_KEY: &str = "MIIBNgIBADANBgkqhkiG9w0BAQEFAASCASAwggEcAgEAAoGBAKCE8JYKhsbydMPbiO7BJVq1pbuJWJHFxOR7L8Hv3ZVkSG4eNC8DdwAmDHYu/wadfw0ihKFm2gKDcLHp5yz5UQ8PZ8FyDYvgkrvGV0ak4nc40QDJWws621dm01e/INlGKOIStAAsxOityCLv0zm5Vf3+My/YaBvZcB5mGUsPbx8fAgEAAoGAAy0+WanRqwRHXUzt89OsupPXuNNqBlCEqgTqGAt4Nimq6Ur9u2R1KXKXUotxjp71Ubw6JbuUWvJg+5Rmd9RjT0HOUEQF3rvzEepKtaraPhV5ejEIrB+nJWNfGye4yzLdfEXJBGUQzrG+wNe13izfRNXI4dN/6Q5npzqaqv0E1CkCAQACAQACAQACAQACAQA=";

/// The exponent assumed for keys that were stored without one (mpush's default).
const DEFAULT_EXPONENT: u64 = 65537;

/// PKCS#1 v1.5 padding overhead.
const PADDING: usize = 11;

/// Decodes PEM (any `-----` armour) or bare base64 into DER.
fn der_from_text(text: &str) -> Result<Vec<u8>, CryptoError> {
    let b64: String = text
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .flat_map(str::chars)
        .filter(|c| !c.is_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| CryptoError::Key(format!("not base64: {e}")))
}

/// The server's RSA private key.
#[derive(Clone)]
pub struct RsaPrivate {
    key: RsaPrivateKey,
}

impl std::fmt::Debug for RsaPrivate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RsaPrivate({} bits)", self.key.size() * 8)
    }
}

impl RsaPrivate {
    /// mpush's public default key (see [`MPUSH_DEFAULT_PRIVATE_KEY`]).
    pub fn mpush_default() -> Self {
        // The constant is checked by a unit test; it cannot fail at run time.
        Self::from_text(MPUSH_DEFAULT_PRIVATE_KEY).expect("mpush default key loads")
    }

    /// Loads a private key from PEM or bare base64 text: PKCS#8 (what mpush
    /// and `mpush-server keygen` write) or PKCS#1 (`BEGIN RSA PRIVATE KEY`,
    /// what `openssl rsa` converts to).
    pub fn from_text(text: &str) -> Result<Self, CryptoError> {
        let der = der_from_text(text)?;
        match Self::from_pkcs8_der(&der) {
            Ok(k) => Ok(k),
            Err(pkcs8) => {
                use rsa::pkcs8::der::Decode;
                match rsa::pkcs1::RsaPrivateKeyRef::from_der(&der) {
                    Ok(pk) => Self::from_pkcs1(&pk),
                    Err(_) => Err(pkcs8),
                }
            }
        }
    }

    /// Loads a PKCS#8 private key. Besides standard keys this accepts mpush's
    /// stripped keys (public exponent and primes stored as 0): the exponent is
    /// taken as 65537 and the primes are recovered from n, e and d.
    pub fn from_pkcs8_der(der: &[u8]) -> Result<Self, CryptoError> {
        use rsa::pkcs8::der::Decode;
        let info = PrivateKeyInfoRef::from_der(der)
            .map_err(|e| CryptoError::Key(format!("not PKCS#8: {e}")))?;
        let pk = rsa::pkcs1::RsaPrivateKeyRef::from_der(info.private_key.as_bytes())
            .map_err(|e| CryptoError::Key(format!("not an RSA key: {e}")))?;
        Self::from_pkcs1(&pk)
    }

    fn from_pkcs1(pk: &rsa::pkcs1::RsaPrivateKeyRef<'_>) -> Result<Self, CryptoError> {
        let n_bytes = pk.modulus.as_bytes();
        let bits = u32::try_from(n_bytes.len() * 8)
            .map_err(|_| CryptoError::Key("modulus too large".into()))?;
        let uint = |b: &[u8]| {
            BoxedUint::from_be_slice(b, bits).map_err(|e| CryptoError::Key(format!("{e:?}")))
        };
        let is_zero = |b: &[u8]| b.iter().all(|&x| x == 0);
        let n = uint(n_bytes)?;
        let d = uint(pk.private_exponent.as_bytes())?;
        let e_bytes = pk.public_exponent.as_bytes();
        let e = if is_zero(e_bytes) {
            BoxedUint::from(DEFAULT_EXPONENT)
        } else {
            BoxedUint::from_be_slice(e_bytes, 64).map_err(|e| CryptoError::Key(format!("{e:?}")))?
        };
        let primes = if is_zero(pk.prime1.as_bytes()) || is_zero(pk.prime2.as_bytes()) {
            Vec::new() // recovered by from_components
        } else {
            vec![uint(pk.prime1.as_bytes())?, uint(pk.prime2.as_bytes())?]
        };
        let key = RsaPrivateKey::from_components(n, e, d, primes)
            .map_err(|e| CryptoError::Key(format!("invalid RSA key: {e}")))?;
        Ok(Self { key })
    }

    /// A fresh key of `bits` bits and its PKCS#8 DER encoding (what
    /// `from_text` reads back, as PEM or base64).
    pub fn generate(rng: &mut Rng, bits: usize) -> Result<(Self, Vec<u8>), CryptoError> {
        use rsa::pkcs8::EncodePrivateKey;
        let key = RsaPrivateKey::new(rng, bits).map_err(|e| CryptoError::Key(e.to_string()))?;
        let der = key
            .to_pkcs8_der()
            .map_err(|e| CryptoError::Key(e.to_string()))?
            .as_bytes()
            .to_vec();
        Ok((Self { key }, der))
    }

    /// A symmetric key derived from this private key (HKDF-SHA256 over the
    /// private exponent, `label` as info): every node that holds the RSA key
    /// derives the same one, and nobody else can.
    pub fn derive_key(&self, label: &[u8]) -> super::AesKey {
        use rsa::traits::PrivateKeyParts;
        let d = zeroize::Zeroizing::new(self.key.d().to_be_bytes());
        let hk = hkdf::Hkdf::<sha2::Sha256>::new(Some(b"mpush-rs key derivation"), &d);
        let mut out = [0u8; super::AES_KEY_LEN];
        // 16 bytes is far below HKDF's output limit.
        hk.expand(label, &mut out).expect("HKDF length");
        super::AesKey(out)
    }

    /// Whether this is mpush's published default key (by its modulus, in
    /// whatever format it was loaded): anyone can decrypt handshakes made
    /// with it.
    pub fn is_mpush_published(&self) -> bool {
        self.public().is_mpush_published()
    }

    /// The key's public half.
    pub fn public(&self) -> RsaPublic {
        RsaPublic {
            key: self.key.to_public_key(),
        }
    }

    /// Modulus size in bytes (128 for mpush's 1024-bit keys).
    pub fn size(&self) -> usize {
        self.key.size()
    }

    /// Decrypts `k`-byte blocks and concatenates them. Blinded with `rng`.
    pub fn decrypt(&self, rng: &mut Rng, ciphertext: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let k = self.key.size();
        if ciphertext.is_empty() || !ciphertext.len().is_multiple_of(k) {
            return Err(CryptoError::Rsa(format!(
                "ciphertext length {} is not a multiple of {k}",
                ciphertext.len()
            )));
        }
        let mut out = Vec::with_capacity(ciphertext.len());
        for block in ciphertext.chunks(k) {
            let plain = self
                .key
                .decrypt_blinded(rng, Pkcs1v15Encrypt, block)
                .map_err(|e| CryptoError::Rsa(e.to_string()))?;
            out.extend_from_slice(&plain);
        }
        Ok(out)
    }
}

/// The client's copy of the server's RSA public key.
#[derive(Clone, Debug)]
pub struct RsaPublic {
    key: RsaPublicKey,
}

impl RsaPublic {
    /// mpush's public default key (see [`MPUSH_DEFAULT_PUBLIC_KEY`]).
    pub fn mpush_default() -> Self {
        Self::from_text(MPUSH_DEFAULT_PUBLIC_KEY).expect("mpush default key loads")
    }

    /// Loads an X.509 SubjectPublicKeyInfo from PEM or bare base64 text, as
    /// mpush's `ClientConfig.setPublicKey` takes it.
    pub fn from_text(text: &str) -> Result<Self, CryptoError> {
        let der = der_from_text(text)?;
        let key = RsaPublicKey::from_public_key_der(&der)
            .map_err(|e| CryptoError::Key(format!("not an RSA public key: {e}")))?;
        Ok(Self { key })
    }

    pub fn size(&self) -> usize {
        self.key.size()
    }

    /// Whether this is mpush's published default key (by its modulus).
    pub fn is_mpush_published(&self) -> bool {
        self.key.n() == Self::mpush_default().key.n()
    }

    /// X.509 SubjectPublicKeyInfo DER: base64 of it is what mpush clients embed.
    pub fn to_spki_der(&self) -> Result<Vec<u8>, CryptoError> {
        use rsa::pkcs8::EncodePublicKey;
        Ok(self
            .key
            .to_public_key_der()
            .map_err(|e| CryptoError::Key(e.to_string()))?
            .as_bytes()
            .to_vec())
    }

    /// Encrypts in `k - 11`-byte chunks, each to exactly `k` bytes.
    pub fn encrypt(&self, rng: &mut Rng, plaintext: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let k = self.key.size();
        let chunk = k - PADDING;
        let mut out = Vec::with_capacity(plaintext.len().div_ceil(chunk).max(1) * k);
        for block in plaintext.chunks(chunk) {
            let c = self
                .key
                .encrypt(rng, Pkcs1v15Encrypt, block)
                .map_err(|e| CryptoError::Rsa(e.to_string()))?;
            out.extend_from_slice(&c);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;

    #[test]
    fn stripped_default_key_loads_and_matches_public_key() {
        let private = RsaPrivate::mpush_default();
        assert_eq!(private.size(), 128);
        let public = RsaPublic::mpush_default();
        assert_eq!(private.public().key, public.key);
    }

    /// mpush's published key is recognised by value, in each format a team
    /// moving from mpush may paste it in: mpush's own stripped PKCS#8, a
    /// full PKCS#8 PEM, and PKCS#1 as `openssl rsa` writes it.
    #[test]
    fn the_published_key_is_recognised_in_any_format() {
        use rsa::pkcs1::EncodeRsaPrivateKey;
        use rsa::pkcs8::EncodePrivateKey;
        let stripped = RsaPrivate::from_text(MPUSH_DEFAULT_PRIVATE_KEY).expect("loads");
        assert!(stripped.is_mpush_published());
        let pkcs8 = stripped
            .key
            .to_pkcs8_pem(rsa::pkcs8::LineEnding::LF)
            .expect("pem");
        let pkcs1 = stripped
            .key
            .to_pkcs1_pem(rsa::pkcs1::LineEnding::LF)
            .expect("pem");
        assert!(pkcs1.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
        for text in [
            pkcs8.as_str(),
            pkcs1.as_str(),
            &format!("\n  {MPUSH_DEFAULT_PRIVATE_KEY}  \n"),
        ] {
            let k = RsaPrivate::from_text(text).expect("loads");
            assert!(k.is_mpush_published());
        }
        assert!(
            RsaPublic::from_text(MPUSH_DEFAULT_PUBLIC_KEY)
                .expect("loads")
                .is_mpush_published()
        );
        let mut rng = Rng::seed_from_u64(7);
        let (own, _) = RsaPrivate::generate(&mut rng, 1024).expect("generates");
        assert!(!own.is_mpush_published());
        assert!(!own.public().is_mpush_published());
    }

    #[test]
    fn chunked_round_trip() {
        let mut rng = Rng::seed_from_u64(1);
        let private = RsaPrivate::mpush_default();
        let public = private.public();
        for len in [1usize, 116, 117, 118, 300] {
            let msg: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let c = public.encrypt(&mut rng, &msg).expect("encrypts");
            assert_eq!(c.len(), len.div_ceil(117) * 128);
            assert_eq!(private.decrypt(&mut rng, &c).expect("decrypts"), msg);
        }
    }

    #[test]
    fn bad_ciphertext_lengths_are_errors() {
        let mut rng = Rng::seed_from_u64(1);
        let private = RsaPrivate::mpush_default();
        assert!(private.decrypt(&mut rng, &[]).is_err());
        assert!(private.decrypt(&mut rng, &[1u8; 100]).is_err());
    }

    #[test]
    fn garbage_keys_are_errors() {
        assert!(RsaPrivate::from_text("not a key").is_err());
        assert!(RsaPrivate::from_text("AAAA").is_err());
        assert!(RsaPublic::from_text("AAAA").is_err());
    }
}
