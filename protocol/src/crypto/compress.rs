//! zlib out; zlib or gzip in (mpush's iOS clients send gzip).

use std::io::{Read, Write};

use flate2::Compression;
use flate2::read::{GzDecoder, ZlibDecoder};
use flate2::write::ZlibEncoder;

use crate::error::CryptoError;

/// zlib (RFC 1950) at the default level, as Java's `DeflaterOutputStream`.
pub fn compress(data: &[u8]) -> Vec<u8> {
    let mut enc = ZlibEncoder::new(
        Vec::with_capacity(data.len() / 2 + 16),
        Compression::default(),
    );
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(data);
    enc.finish().unwrap_or_default()
}

/// Inflates zlib or gzip (by the `1F 8B` magic), refusing output over `max` bytes
/// so a small packet cannot expand into a memory bomb.
pub fn decompress(data: &[u8], max: usize) -> Result<Vec<u8>, CryptoError> {
    let mut out = Vec::new();
    let limit = max as u64 + 1;
    let res = if data.starts_with(&[0x1F, 0x8B]) {
        GzDecoder::new(data).take(limit).read_to_end(&mut out)
    } else {
        ZlibDecoder::new(data).take(limit).read_to_end(&mut out)
    };
    res.map_err(|e| CryptoError::Decompress(e.to_string()))?;
    if out.len() > max {
        return Err(CryptoError::DecompressTooLarge(max));
    }
    Ok(out)
}

#[cfg(test)]
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
    }

    #[test]
    fn gzip_is_accepted() {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), Compression::default());
        enc.write_all(b"hello gzip").expect("write");
        let gz = enc.finish().expect("finish");
        assert_eq!(decompress(&gz, 100).expect("inflates"), b"hello gzip");
    }

    #[test]
    fn bombs_and_garbage_are_errors() {
        let big = compress(&vec![0u8; 1 << 20]);
        assert_eq!(
            decompress(&big, 1000),
            Err(CryptoError::DecompressTooLarge(1000))
        );
        assert!(decompress(b"garbage", 1000).is_err());
    }
}
