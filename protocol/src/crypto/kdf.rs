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

/// HKDF over the resume key, salted with both nonces of one resume.
fn from_resume(
    resume: &ResumeKey,
    client_nonce: &[u8],
    server_nonce: &[u8],
    info: &[u8],
    out: &mut [u8],
) {
    let mut salt = Vec::with_capacity(client_nonce.len() + server_nonce.len());
    salt.extend_from_slice(client_nonce);
    salt.extend_from_slice(server_nonce);
    let hk = Hkdf::<Sha256>::new(Some(&salt), &resume.0);
    // Both outputs are far below HKDF's length limit.
    let _ = hk.expand(info, out);
}

/// The traffic key of a v2 connection opened by fast connect.
pub fn connection_key(resume: &ResumeKey, client_nonce: &[u8], server_nonce: &[u8]) -> AesKey {
    let mut traffic = [0u8; AES_KEY_LEN];
    from_resume(
        resume,
        client_nonce,
        server_nonce,
        b"mpush-v2 traffic",
        &mut traffic,
    );
    AesKey(traffic)
}

/// The resume key of the session that replaces a resumed one (tickets are
/// single-use): bound to both nonces of the resume that issued it.
pub fn next_resume_key(resume: &ResumeKey, client_nonce: &[u8], server_nonce: &[u8]) -> ResumeKey {
    let mut next = [0u8; RESUME_KEY_LEN];
    from_resume(
        resume,
        client_nonce,
        server_nonce,
        b"mpush-v2 next resume",
        &mut next,
    );
    ResumeKey(next)
}

fn mac(key: &ResumeKey, parts: &[&[u8]]) -> Vec<u8> {
    let mut m = <HmacSha256 as KeyInit>::new_from_slice(&key.0).expect("HMAC takes any key length");
    for p in parts {
        // Length-prefix each part so that no two inputs share an encoding.
        m.update(&(p.len() as u32).to_be_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().to_vec()
}

/// The client's fast-connect proof.
pub fn resume_proof(key: &ResumeKey, session_id: &str, device_id: &str, nonce: &[u8]) -> Vec<u8> {
    mac(
        key,
        &[
            b"mpush-v2 resume",
            session_id.as_bytes(),
            device_id.as_bytes(),
            nonce,
        ],
    )
}

/// The server's answer proof: it too holds the resume key.
pub fn resume_accept_proof(key: &ResumeKey, client_nonce: &[u8], server_nonce: &[u8]) -> Vec<u8> {
    mac(key, &[b"mpush-v2 resume ok", client_nonce, server_nonce])
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
