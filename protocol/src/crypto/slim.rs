//! The build without the classic crypto (feature `classic` off: the browser's
//! transport-only module, ADR 0005). There is no RSA key and no session
//! cipher here: `RsaPublic` only says so, and `SessionCipher` has no values,
//! so no packet is ever sealed or opened with one. The client machine refuses
//! a classic handshake or resume in this build before reaching either.

use super::Rng;
use crate::error::CryptoError;

const WHY: &str = "this build speaks only the transport-secured profile (wss://): no RSA";

/// No RSA in this build: a placeholder for the configuration's key field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RsaPublic(());

impl RsaPublic {
    /// The placeholder (the classic build's mpush default key).
    pub fn mpush_default() -> Self {
        Self(())
    }

    /// No key is used in this build, the published one neither.
    pub fn is_mpush_published(&self) -> bool {
        false
    }

    /// A key cannot be used in this build: an error that says so.
    pub fn from_text(_: &str) -> Result<Self, CryptoError> {
        Err(CryptoError::Key(WHY.into()))
    }

    pub fn encrypt(&self, _: &mut Rng, _: &[u8]) -> Result<Vec<u8>, CryptoError> {
        Err(CryptoError::Key(WHY.into()))
    }
}

/// No session cipher exists in this build (the type has no values).
#[derive(Debug, Clone)]
pub enum SessionCipher {}

impl SessionCipher {
    pub fn is_aead(&self) -> bool {
        match *self {}
    }

    pub fn seal(&self, _: &mut Rng, _: &[u8], _: &[u8]) -> Vec<u8> {
        match *self {}
    }

    pub fn seal_with_nonce(&self, _: [u8; super::GCM_NONCE_LEN], _: &[u8], _: &[u8]) -> Vec<u8> {
        match *self {}
    }

    pub fn open(&self, _: &[u8], _: &[u8]) -> Result<Vec<u8>, CryptoError> {
        match *self {}
    }

    pub fn expand(&self) -> Expanded {
        match *self {}
    }
}

/// No expanded cipher either (the type has no values).
#[derive(Debug)]
pub enum Expanded {}

impl Expanded {
    pub fn seal_with_nonce(&self, _: [u8; super::GCM_NONCE_LEN], _: &[u8], _: &[u8]) -> Vec<u8> {
        match *self {}
    }
}
