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
    /// The same key in OpenSSL, which does the private-key operation when
    /// the `openssl-rsa` feature is on (a key OpenSSL cannot take, such as
    /// one of more than two primes, stays with `rsa`).
    #[cfg(feature = "openssl-rsa")]
    native: Option<native::NativeKey>,
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
        Ok(Self::with_key(key))
    }

    fn with_key(key: RsaPrivateKey) -> Self {
        Self {
            #[cfg(feature = "openssl-rsa")]
            native: native::NativeKey::new(&key),
            key,
        }
    }

    /// The same key with the private-key operation left to the pure-Rust
    /// `rsa` crate (for comparisons: `benches/rsa.rs`).
    #[cfg(feature = "openssl-rsa")]
    pub fn without_openssl(&self) -> Self {
        Self {
            key: self.key.clone(),
            native: None,
        }
    }

    /// Which library does the private-key operation: `"openssl"` or
    /// `"rsa"` (the pure-Rust crate).
    pub fn backend(&self) -> &'static str {
        #[cfg(feature = "openssl-rsa")]
        if self.native.is_some() {
            return "openssl";
        }
        "rsa"
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
        Ok((Self::with_key(key), der))
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
        #[cfg(feature = "openssl-rsa")]
        if let Some(native) = &self.native {
            return native.decrypt(k, ciphertext);
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

/// The private-key operation through OpenSSL: the modular exponentiation
/// (CRT, blinded, constant time) in libcrypto, the PKCS#1 v1.5 decoding here
/// with implicit rejection (draft-irtf-cfrg-rsa-guidance §7), exactly as the
/// `rsa` crate decodes: a ciphertext whose padding is wrong decrypts to a
/// synthetic message derived from it and the key, in the same time as a
/// good one, so the handshake that follows fails the same way whatever the
/// padding was (no Bleichenbacher/Marvin oracle). OpenSSL 3.0's own PKCS#1
/// decoding reports bad padding as an error instead.
#[cfg(feature = "openssl-rsa")]
mod native {
    use hmac::{KeyInit, Mac};
    use openssl::bn::{BigNum, BigNumContext};
    use openssl::pkey::Private;
    use openssl::rsa::{Padding, Rsa};
    use rsa::traits::{PrivateKeyParts, PublicKeyParts};
    use rsa::{BoxedUint, PrivateKey as RsaPrivateKey};
    use sha2::{Digest, Sha256};
    use subtle::{Choice, ConditionallySelectable, ConstantTimeEq, ConstantTimeGreater};
    use zeroize::{Zeroize, Zeroizing};

    use crate::error::CryptoError;

    type HmacSha256 = hmac::Hmac<Sha256>;

    /// An OpenSSL copy of a two-prime key, with its CRT values, and the
    /// hash of the private exponent that implicit rejection keys its
    /// messages with. OpenSSL blinds each operation itself (its own RNG).
    #[derive(Clone)]
    pub(super) struct NativeKey {
        pub(super) rsa: Rsa<Private>,
        /// SHA-256 of I2OSP(d, k).
        d_hash: Zeroizing<[u8; 32]>,
    }

    impl NativeKey {
        /// None when OpenSSL cannot hold the key as a two-prime CRT key, or
        /// the copy does not decrypt what the key's public half encrypts:
        /// the caller then keeps using `rsa`.
        pub(super) fn new(key: &RsaPrivateKey) -> Option<Self> {
            let [p, q] = key.primes() else {
                return None;
            };
            let k = key.size();
            // Implicit rejection's PRF encodes bit lengths in two octets.
            if !(11..8192).contains(&k) {
                return None;
            }
            let bn = |b: &BoxedUint| {
                let bytes = Zeroizing::new(b.to_be_bytes());
                BigNum::from_slice(&bytes).ok()
            };
            let (n, e, d) = (bn(key.n())?, bn(key.e())?, bn(key.d())?);
            let (p, q) = (bn(p)?, bn(q)?);
            let mut ctx = BigNumContext::new_secure().ok()?;
            let one = BigNum::from_u32(1).ok()?;
            let mut dp = BigNum::new_secure().ok()?;
            dp.nnmod(&d, &(&p - &one), &mut ctx).ok()?;
            let mut dq = BigNum::new_secure().ok()?;
            dq.nnmod(&d, &(&q - &one), &mut ctx).ok()?;
            let mut qinv = BigNum::new_secure().ok()?;
            qinv.mod_inverse(&q, &p, &mut ctx).ok()?;
            let d_bytes = Zeroizing::new(d.to_vec_padded(i32::try_from(k).ok()?).ok()?);
            let d_hash = Zeroizing::new(Sha256::digest(&*d_bytes).into());
            let rsa = Rsa::from_private_components(n, e, d, p, q, dp, dq, qinv).ok()?;
            if !rsa.check_key().unwrap_or(false) || rsa.size() as usize != k {
                return None;
            }
            let native = Self { rsa, d_hash };
            native.agrees_with(key).then_some(native)
        }

        /// One round trip: `rsa` encrypts with the public half, OpenSSL
        /// decrypts.
        fn agrees_with(&self, key: &RsaPrivateKey) -> bool {
            let probe = b"mpush-rs: the OpenSSL copy of the key";
            // The padding's randomness from OpenSSL: this crate draws none
            // of its own.
            let mut seed = [0u8; 32];
            if openssl::rand::rand_bytes(&mut seed).is_err() {
                return false;
            }
            let mut rng = <crate::crypto::Rng as rand_core::SeedableRng>::from_seed(seed);
            let Ok(c) = key
                .to_public_key()
                .encrypt(&mut rng, rsa::Pkcs1v15Encrypt, probe)
            else {
                return false;
            };
            self.decrypt(key.size(), &c).is_ok_and(|p| p == probe)
        }

        /// Decrypts `k`-byte blocks (the caller checked the length) and
        /// concatenates their messages.
        pub(super) fn decrypt(&self, k: usize, ciphertext: &[u8]) -> Result<Vec<u8>, CryptoError> {
            let mut out = Vec::with_capacity(ciphertext.len());
            let mut em = Zeroizing::new(vec![0u8; k]);
            for block in ciphertext.chunks(k) {
                // Fails only for what is public: a block not below the modulus.
                match self.rsa.private_decrypt(block, &mut em, Padding::NONE) {
                    Ok(n) if n == k => {}
                    _ => {
                        out.zeroize();
                        return Err(CryptoError::Rsa("decryption error".into()));
                    }
                }
                let len = self.unpad(&mut em, block);
                out.extend_from_slice(&em[k - len..]);
            }
            Ok(out)
        }

        /// EME-PKCS1-v1_5 decoding with implicit rejection: leaves the
        /// message at the end of `em` and returns its length. Where the
        /// padding is wrong, the message is the alternative one. No branch
        /// and no index depends on `em`.
        fn unpad(&self, em: &mut [u8], ciphertext: &[u8]) -> usize {
            let k = em.len();
            let kdk = self.key_derivation_key(ciphertext);
            let am = irprf(&kdk, b"message", k);
            let cl = irprf(&kdk, b"length", 256);
            // k is in 11..8192 (checked when the key was made).
            let max_len = u16::try_from(k - 11).unwrap_or(u16::MAX);
            let al = alternative_length(&cl, max_len);

            // EM = 0x00 || 0x02 || PS (at least eight nonzero octets) || 0x00 || M
            let mut bad = !em[0].ct_eq(&0) | !em[1].ct_eq(&2);
            let mut looking = Choice::from(1);
            let mut separator = 0u32;
            for (i, octet) in (0u32..).zip(em.iter()).skip(2) {
                let zero = octet.ct_eq(&0);
                separator.conditional_assign(&i, looking & zero);
                looking &= !zero;
            }
            bad |= looking | !separator.ct_gt(&9);
            let k32 = u32::try_from(k).unwrap_or(u32::MAX);
            let l =
                u32::conditional_select(&k32.wrapping_sub(separator).wrapping_sub(1), &0, looking);
            let len = u32::conditional_select(&l, &u32::from(al), bad);
            for (e, a) in em.iter_mut().zip(am.iter()) {
                e.conditional_assign(a, bad);
            }
            len as usize
        }

        /// KDK = HMAC-SHA256(SHA-256(I2OSP(d, k)), C).
        fn key_derivation_key(&self, ciphertext: &[u8]) -> Zeroizing<[u8; 32]> {
            let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&*self.d_hash)
                .expect("HMAC takes any key length");
            mac.update(ciphertext);
            Zeroizing::new(mac.finalize().into_bytes().into())
        }
    }

    /// IRPRF(KDK, label, length): HMAC-SHA256 blocks over
    /// I2OSP(i, 2) || label || I2OSP(length in bits, 2).
    fn irprf(kdk: &[u8; 32], label: &[u8], length: usize) -> Zeroizing<Vec<u8>> {
        let bits = u16::try_from(length * 8).unwrap_or(u16::MAX).to_be_bytes();
        let mut out = Zeroizing::new(vec![0u8; length]);
        for (i, chunk) in (0u16..).zip(out.chunks_mut(32)) {
            let mut mac =
                <HmacSha256 as KeyInit>::new_from_slice(kdk).expect("HMAC takes any key length");
            mac.update(&i.to_be_bytes());
            mac.update(label);
            mac.update(&bits);
            let block = Zeroizing::new(<[u8; 32]>::from(mac.finalize().into_bytes()));
            chunk.copy_from_slice(&block[..chunk.len()]);
        }
        out
    }

    /// The alternative message's length: the last of the 128 two-octet
    /// candidates in `cl`, masked to `max`'s bit length, that is not above
    /// `max` (0 when none is).
    fn alternative_length(cl: &[u8], max: u16) -> u16 {
        let mut mask = max;
        mask |= mask >> 1;
        mask |= mask >> 2;
        mask |= mask >> 4;
        mask |= mask >> 8;
        cl.chunks_exact(2).fold(0u16, |al, pair| {
            let candidate = u16::from_be_bytes([pair[0], pair[1]]) & mask;
            u16::conditional_select(&al, &candidate, !candidate.ct_gt(&max))
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_alternative_length_is_the_last_admissible_candidate() {
            let mut cl = [0xff; 256];
            cl[..2].copy_from_slice(&5u16.to_be_bytes());
            cl[252..254].copy_from_slice(&20u16.to_be_bytes());
            assert_eq!(alternative_length(&cl, 20), 20);
            cl[252..254].fill(0xff);
            // 0xffff masked to 5 bits is 31, above 20: the first one stays.
            assert_eq!(alternative_length(&cl, 20), 5);
            cl[..2].fill(0xff);
            assert_eq!(alternative_length(&cl, 20), 0);
            assert_eq!(alternative_length(&cl, 0), 0);
        }
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

    /// With `openssl-rsa`, OpenSSL does the private-key operation for every
    /// two-prime key: mpush's stripped default key (primes recovered from n
    /// and d) and generated ones. It answers exactly what `rsa` answers, for
    /// every ciphertext a client makes and for forged ones: a block with bad
    /// padding gives the same synthetic message (implicit rejection), a
    /// block not below the modulus the same refusal.
    #[cfg(feature = "openssl-rsa")]
    #[test]
    fn openssl_decrypts_what_rsa_decrypts() {
        use proptest::prelude::{any, prop_assert, prop_assert_eq, proptest};
        let mut rng = Rng::seed_from_u64(3);
        let keys = [
            RsaPrivate::mpush_default(),
            RsaPrivate::generate(&mut rng, 1024).expect("generates").0,
            RsaPrivate::generate(&mut rng, 2048).expect("generates").0,
        ];
        for key in &keys {
            assert_eq!(key.backend(), "openssl", "{key:?}");
            let pure = key.without_openssl();
            assert_eq!(pure.backend(), "rsa");
            let public = key.public();
            let k = key.size();
            let cases = proptest::test_runner::Config {
                cases: 64,
                ..Default::default()
            };
            proptest!(cases, |(msg in proptest::collection::vec(any::<u8>(), 1..400),
                               garbage in proptest::collection::vec(any::<u8>(), 1..4),
                               seed in any::<u64>())| {
                let mut rng = Rng::seed_from_u64(seed);
                let c = public.encrypt(&mut rng, &msg).expect("encrypts");
                prop_assert_eq!(&key.decrypt(&mut rng, &c).expect("openssl"), &msg);
                prop_assert_eq!(&pure.decrypt(&mut rng, &c).expect("rsa"), &msg);
                // A block nobody encrypted: random bytes below the modulus.
                let mut forged = vec![0u8; k];
                rand_core::Rng::fill_bytes(&mut rng, &mut forged[1..]);
                forged[1] &= 0x7f;
                for (i, b) in garbage.iter().enumerate() {
                    forged[1 + i] ^= b;
                }
                let by_rsa = pure.decrypt(&mut rng, &forged).expect("rsa rejects implicitly");
                let by_openssl = key.decrypt(&mut rng, &forged).expect("OpenSSL rejects implicitly");
                prop_assert_eq!(&by_openssl, &by_rsa);
                prop_assert!(by_rsa.len() <= k - 11);
                // Not below the modulus: refused by both.
                let mut above = forged.clone();
                above[0] = 0xff;
                prop_assert!(pure.decrypt(&mut rng, &above).is_err());
                prop_assert!(key.decrypt(&mut rng, &above).is_err());
                // Lengths that are not whole blocks are refused before either library.
                prop_assert!(key.decrypt(&mut rng, &c[..c.len() - 1]).is_err());
            });
        }
    }

    /// The decoding's edge cases, made exactly: every header, separators
    /// at each place around the eight-octet minimum and at the end, a
    /// missing separator, later zeros. Each encoded message is encrypted raw
    /// and both libraries must answer the same.
    #[cfg(feature = "openssl-rsa")]
    #[test]
    fn openssl_decodes_every_edge_of_the_padding_as_rsa_does() {
        let key = RsaPrivate::mpush_default();
        let pure = key.without_openssl();
        let native = key.native.as_ref().expect("OpenSSL holds the key");
        let k = key.size();
        let mut rng = Rng::seed_from_u64(5);
        let mut seen_valid = 0;
        for header in [[0u8, 2], [0, 1], [1, 2], [0, 0]] {
            for separator in (2..=13).chain([64, k - 2, k - 1, k]) {
                for later_zero in [false, true] {
                    let mut em = vec![0x42u8; k];
                    em[..2].copy_from_slice(&header);
                    if separator < k {
                        em[separator] = 0;
                        if later_zero && separator < k - 1 {
                            em[k - 1] = 0;
                        }
                    }
                    let mut c = vec![0u8; k];
                    native
                        .rsa
                        .public_encrypt(&em, &mut c, openssl::rsa::Padding::NONE)
                        .expect("raw");
                    let by_rsa = pure.decrypt(&mut rng, &c).expect("rsa");
                    let by_openssl = key.decrypt(&mut rng, &c).expect("openssl");
                    assert_eq!(by_openssl, by_rsa, "{header:?} {separator} {later_zero}");
                    let valid = header == [0, 2] && (10..k).contains(&separator);
                    if valid {
                        assert_eq!(by_rsa, em[separator + 1..]);
                        seen_valid += 1;
                    }
                }
            }
        }
        assert!(seen_valid > 10);
    }
}
