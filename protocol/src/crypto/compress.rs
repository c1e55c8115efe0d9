//! zlib out; zlib in, and gzip in with the `gzip` feature (mpush's iOS
//! clients send gzip to servers). Outbound compression is the `deflate`
//! feature: without it (the browser build) nothing is compressed on the way
//! out, which every peer accepts, and the deflater is not linked. Inbound is
//! the `inflate` feature: the browser's transport-only build leaves it out
//! and asks the server for plain bodies instead (`FEATURE_PLAIN_BODIES`).

use crate::error::CryptoError;

/// zlib (RFC 1950) at the default level, as Java's `DeflaterOutputStream`.
#[cfg(feature = "deflate")]
pub fn compress(data: &[u8]) -> Vec<u8> {
    miniz_oxide::deflate::compress_to_vec_zlib(data, 6)
}

/// `data` compressed when it is over `threshold` bytes and this build
/// compresses (feature `deflate`).
pub fn compress_over(data: &[u8], threshold: usize) -> Option<Vec<u8>> {
    #[cfg(feature = "deflate")]
    if data.len() > threshold {
        let c = compress(data);
        return (!c.is_empty()).then_some(c);
    }
    let _ = (data, threshold);
    None
}

/// Whether this build inflates compressed bodies (feature `inflate`). A
/// client without it asks servers for plain bodies (`FEATURE_PLAIN_BODIES`).
pub const INFLATES: bool = cfg!(feature = "inflate");

/// Inflates zlib (or gzip, by the `1F 8B` magic, with the `gzip` feature),
/// refusing output over `max` bytes so a small packet cannot expand into a
/// memory bomb.
pub fn decompress(data: &[u8], max: usize) -> Result<Vec<u8>, CryptoError> {
    if data.starts_with(&[0x1F, 0x8B]) {
        return gunzip(data, max);
    }
    inflate(data, max)
}

#[cfg(not(feature = "inflate"))]
fn inflate(_: &[u8], _: usize) -> Result<Vec<u8>, CryptoError> {
    Err(CryptoError::Decompress(
        "a compressed body, but this build does not inflate (feature inflate)".into(),
    ))
}

#[cfg(feature = "inflate")]
fn inflate(data: &[u8], max: usize) -> Result<Vec<u8>, CryptoError> {
    use miniz_oxide::inflate::{DecompressError, TINFLStatus};
    miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(data, max).map_err(
        |DecompressError { status, .. }| match status {
            TINFLStatus::HasMoreOutput => CryptoError::DecompressTooLarge(max),
            other => CryptoError::Decompress(format!("corrupt zlib stream ({other:?})")),
        },
    )
}

#[cfg(feature = "gzip")]
fn gunzip(data: &[u8], max: usize) -> Result<Vec<u8>, CryptoError> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| CryptoError::Decompress(e.to_string()))?;
    if out.len() > max {
        return Err(CryptoError::DecompressTooLarge(max));
    }
    Ok(out)
}

#[cfg(not(feature = "gzip"))]
fn gunzip(_: &[u8], _: usize) -> Result<Vec<u8>, CryptoError> {
    Err(CryptoError::Decompress(
        "gzip bodies are not accepted by this build (feature gzip)".into(),
    ))
}

#[cfg(all(test, feature = "deflate", feature = "gzip"))]
mod tests {
    use super::*;

    #[test]
    fn java_zlib_vector_inflates() {
        let java = hex::decode("789c4b4ca40c0000148d1841").expect("hex");
        assert_eq!(decompress(&java, 1000).expect("inflates"), vec![b'a'; 64]);
        // Our deflater need not match Java's bytes, only be zlib and inflate back.
        let ours = compress(&[b'a'; 64]);
        assert_eq!(&ours[..2], &[0x78, 0x9C]);
        assert_eq!(decompress(&ours, 1000).expect("inflates"), vec![b'a'; 64]);
        assert_eq!(compress_over(&[b'a'; 64], 64), None);
        assert_eq!(compress_over(&[b'a'; 65], 64).map(|c| c[0]), Some(0x78));
    }

    #[test]
    fn gzip_is_accepted() {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(b"hello gzip").expect("write");
        let gz = enc.finish().expect("finish");
        assert_eq!(decompress(&gz, 100).expect("inflates"), b"hello gzip");
        assert_eq!(decompress(&gz, 5), Err(CryptoError::DecompressTooLarge(5)));
    }

    #[test]
    fn bombs_and_garbage_are_errors() {
        let big = compress(&vec![0u8; 1 << 20]);
        assert_eq!(
            decompress(&big, 1000),
            Err(CryptoError::DecompressTooLarge(1000))
        );
        assert_eq!(decompress(&big, 1 << 20).map(|v| v.len()), Ok(1 << 20));
        assert!(decompress(b"garbage", 1000).is_err());
        assert!(decompress(&big[..big.len() / 2], 1 << 20).is_err());
    }
}
