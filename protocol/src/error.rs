//! Typed errors of the protocol layer.

use thiserror::Error;

/// A frame could not be cut out of the byte stream. The connection cannot
/// continue after one of these: the stream position is lost.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("negative body length {0}")]
    NegativeLength(i32),
    #[error("body length {len} exceeds the maximum of {max} bytes")]
    TooLarge { len: usize, max: usize },
}

/// A message body did not decode.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("body ends inside field `{field}`")]
    Truncated { field: &'static str },
    #[error("field `{field}` has an invalid length")]
    BadLength { field: &'static str },
    #[error("field `{field}` is invalid: {reason}")]
    Invalid {
        field: &'static str,
        reason: &'static str,
    },
    #[error("protobuf: {0}")]
    Protobuf(String),
    #[error("json: {0}")]
    Json(String),
}

/// Encryption, decryption, compression or key loading failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CryptoError {
    #[error("RSA: {0}")]
    Rsa(String),
    #[error("key: {0}")]
    Key(String),
    #[error("ciphertext is malformed or was tampered with")]
    Decrypt,
    #[error("body does not decompress: {0}")]
    Decompress(String),
    #[error("decompressed body exceeds {0} bytes")]
    DecompressTooLarge(usize),
}

/// Anything that can go wrong turning received bytes into a message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ProtocolError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    #[error("{0}")]
    State(&'static str),
}
