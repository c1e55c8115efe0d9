//! Key derivation. Legacy: session key = clientKey XOR serverKey. v2: HKDF-SHA256
//! over both keys gives a per-connection traffic key and a resume key; fast
//! connect proves possession of the resume key with HMAC-SHA256 and derives a
//! fresh traffic key from both sides' nonces.

use hkdf::Hkdf;
use hmac::{KeyInit, Mac};
use sha2::Sha256;
use zeroize::{Zeroize, ZeroizeOnDrop};

use super::key::{AES_KEY_LEN, AesKey};

type HmacSha256 = hmac::Hmac<Sha256>;

pub const RESUME_KEY_LEN: usize = 32;

/// The secret a v2 session is resumed with; kept by client and server.
#[derive(Clone, PartialEq, Eq, Zeroize, ZeroizeOnDrop)]
pub struct ResumeKey(pub [u8; RESUME_KEY_LEN]);

impl std::fmt::Debug for ResumeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResumeKey(..)")
    }
}

/// mpush's `mixKey`: byte-wise XOR.
pub fn legacy_session_key(client_key: &[u8; 16], server_key: &[u8; 16]) -> AesKey {
    let mut k = [0u8; AES_KEY_LEN];
    for (i, b) in k.iter_mut().enumerate() {
        *b = client_key[i] ^ server_key[i];
    }
    AesKey(k)
}

/// v2 keys after a full handshake: (traffic key, resume key).
pub fn v2_session_keys(
    client_key: &[u8; 16],
    server_key: &[u8; 16],
    iv: &[u8; 16],
) -> (AesKey, ResumeKey) {
    let mut ikm = [0u8; 32];
    ikm[..16].copy_from_slice(client_key);
    ikm[16..].copy_from_slice(server_key);
    let hk = Hkdf::<Sha256>::new(Some(iv), &ikm);
    ikm.zeroize();
    let mut traffic = [0u8; AES_KEY_LEN];
    let mut resume = [0u8; RESUME_KEY_LEN];
    // Output lengths are far below HKDF's limit.
    let _ = hk.expand(b"mpush-v2 traffic", &mut traffic);
    let _ = hk.expand(b"mpush-v2 resume", &mut resume);
    (AesKey(traffic), ResumeKey(resume))
}

/// What one resume derives from the resume key, salted with both of its
/// nonces: the new connection's traffic key and the next ticket's resume
/// key. Both are HKDF expansions of one extract, done once here.
pub struct ResumeDerivation(Hkdf<Sha256>);

impl ResumeDerivation {
    pub fn new(resume: &ResumeKey, client_nonce: &[u8], server_nonce: &[u8]) -> Self {
        let salt = [client_nonce, server_nonce].concat();
        Self(Hkdf::<Sha256>::new(Some(&salt), &resume.0))
    }

    /// The traffic key of the v2 connection this resume opens.
    pub fn connection_key(&self) -> AesKey {
        let mut traffic = [0u8; AES_KEY_LEN];
        // Far below HKDF's length limit.
        let _ = self.0.expand(b"mpush-v2 traffic", &mut traffic);
        AesKey(traffic)
    }

    /// The resume key of the session that replaces the resumed one
    /// (tickets are single-use): bound to both nonces of this resume.
    pub fn next_resume_key(&self) -> ResumeKey {
        let mut next = [0u8; RESUME_KEY_LEN];
        // Far below HKDF's length limit.
        let _ = self.0.expand(b"mpush-v2 next resume", &mut next);
        ResumeKey(next)
    }
}

/// The traffic key of a v2 connection opened by fast connect.
pub fn connection_key(resume: &ResumeKey, client_nonce: &[u8], server_nonce: &[u8]) -> AesKey {
    ResumeDerivation::new(resume, client_nonce, server_nonce).connection_key()
}

/// The resume key of the session that replaces a resumed one (tickets are
/// single-use): bound to both nonces of the resume that issued it.
pub fn next_resume_key(resume: &ResumeKey, client_nonce: &[u8], server_nonce: &[u8]) -> ResumeKey {
    ResumeDerivation::new(resume, client_nonce, server_nonce).next_resume_key()
}

/// A fast connect's HMAC-SHA256 proofs under one resume key, the client's
/// and the server's: HMAC's key schedule done once for both.
pub struct ResumeProofs(HmacSha256);

pub const PROOF_LEN: usize = 32;

impl ResumeProofs {
    pub fn new(key: &ResumeKey) -> Self {
        Self(<HmacSha256 as KeyInit>::new_from_slice(&key.0).expect("HMAC takes any key length"))
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; PROOF_LEN] {
        let mut m = self.0.clone();
        for p in parts {
            // Length-prefix each part so that no two inputs share an encoding.
            m.update(&(p.len() as u32).to_be_bytes());
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }

    /// The client's proof.
    pub fn client(&self, session_id: &str, device_id: &str, nonce: &[u8]) -> [u8; PROOF_LEN] {
        self.mac(&[
            b"mpush-v2 resume",
            session_id.as_bytes(),
            device_id.as_bytes(),
            nonce,
        ])
    }

    /// The server's answer: it too holds the resume key.
    pub fn server(&self, client_nonce: &[u8], server_nonce: &[u8]) -> [u8; PROOF_LEN] {
        self.mac(&[b"mpush-v2 resume ok", client_nonce, server_nonce])
    }
}

/// The client's fast-connect proof.
pub fn resume_proof(key: &ResumeKey, session_id: &str, device_id: &str, nonce: &[u8]) -> Vec<u8> {
    ResumeProofs::new(key)
        .client(session_id, device_id, nonce)
        .to_vec()
}

/// The server's answer proof: it too holds the resume key.
pub fn resume_accept_proof(key: &ResumeKey, client_nonce: &[u8], server_nonce: &[u8]) -> Vec<u8> {
    ResumeProofs::new(key)
        .server(client_nonce, server_nonce)
        .to_vec()
}

/// Constant-time comparison of two MACs.
pub fn verify_mac(expected: &[u8], got: &[u8]) -> bool {
    if expected.len() != got.len() {
        return false;
    }
    expected
        .iter()
        .zip(got)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_key_is_xor() {
        let c: [u8; 16] = std::array::from_fn(|i| 0x20 + i as u8);
        let s: [u8; 16] = std::array::from_fn(|i| 0xf0 + i as u8);
        assert_eq!(legacy_session_key(&c, &s).0, [0xd0; 16]);
    }

    /// HKDF and HMAC as the spec writes them, one call per output: what
    /// the shared extract and key schedule must give byte for byte.
    fn textbook(
        k: &ResumeKey,
        cn: &[u8],
        sn: &[u8],
        sid: &str,
        dev: &str,
    ) -> ([u8; 16], [u8; 32], Vec<u8>, Vec<u8>) {
        let salt = [cn, sn].concat();
        let mut traffic = [0u8; 16];
        let mut next = [0u8; 32];
        Hkdf::<Sha256>::new(Some(&salt), &k.0)
            .expand(b"mpush-v2 traffic", &mut traffic)
            .expect("16 bytes");
        Hkdf::<Sha256>::new(Some(&salt), &k.0)
            .expand(b"mpush-v2 next resume", &mut next)
            .expect("32 bytes");
        let mac = |parts: &[&[u8]]| {
            let mut m = <HmacSha256 as KeyInit>::new_from_slice(&k.0).expect("any key");
            for p in parts {
                m.update(&(p.len() as u32).to_be_bytes());
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        };
        (
            traffic,
            next,
            mac(&[b"mpush-v2 resume", sid.as_bytes(), dev.as_bytes(), cn]),
            mac(&[b"mpush-v2 resume ok", cn, sn]),
        )
    }

    proptest::proptest! {
        #[test]
        fn one_extract_and_one_key_schedule_give_what_the_spec_does(
            key in proptest::array::uniform32(proptest::num::u8::ANY),
            cn in proptest::collection::vec(proptest::num::u8::ANY, 0..80),
            sn in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            sid in "[0-9a-f]{0,40}",
            dev in "\\PC{0,20}",
        ) {
            let k = ResumeKey(key);
            let (traffic, next, client, server) = textbook(&k, &cn, &sn, &sid, &dev);
            let d = ResumeDerivation::new(&k, &cn, &sn);
            proptest::prop_assert_eq!(d.connection_key().0, traffic);
            proptest::prop_assert_eq!(d.next_resume_key().0, next);
            let p = ResumeProofs::new(&k);
            proptest::prop_assert_eq!(p.client(&sid, &dev, &cn).to_vec(), client.clone());
            proptest::prop_assert_eq!(p.server(&cn, &sn).to_vec(), server.clone());
            // The one-call forms are the same functions.
            proptest::prop_assert_eq!(connection_key(&k, &cn, &sn).0, traffic);
            proptest::prop_assert_eq!(resume_proof(&k, &sid, &dev, &cn), client);
            proptest::prop_assert_eq!(resume_accept_proof(&k, &cn, &sn), server);
        }
    }

    #[test]
    fn proofs_bind_their_inputs() {
        let k = ResumeKey([7; 32]);
        let p = resume_proof(&k, "s", "d", &[1; 16]);
        assert!(verify_mac(&p, &resume_proof(&k, "s", "d", &[1; 16])));
        assert!(!verify_mac(&p, &resume_proof(&k, "s", "e", &[1; 16])));
        assert!(!verify_mac(&p, &resume_proof(&k, "sd", "", &[1; 16])));
        assert!(!verify_mac(
            &p,
            &resume_proof(&ResumeKey([8; 32]), "s", "d", &[1; 16])
        ));
        assert_ne!(
            connection_key(&k, &[1; 16], &[2; 16]).0,
            connection_key(&k, &[1; 16], &[3; 16]).0
        );
    }
}
