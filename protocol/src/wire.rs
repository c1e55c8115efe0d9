//! Body encoding primitives of spec section 3: big-endian integers and the
//! `bytes`/`string` length-prefix rule (`i16`, or `0x7FFF` + `i32` for long fields).

use crate::error::DecodeError;

/// The `i16` prefix value that announces an extra `i32` length.
const LONG_MARK: i16 = 0x7FFF;

/// Appends body fields to a buffer.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(cap: usize) -> Self {
        Self {
            buf: Vec::with_capacity(cap),
        }
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// A `bytes` field; `None` and empty both encode as a zero length (Java's null).
    pub fn bytes(&mut self, v: Option<&[u8]>) -> &mut Self {
        let v = v.unwrap_or_default();
        let len = v.len();
        if len < LONG_MARK as usize {
            // Checked above: fits in i16.
            self.buf.extend_from_slice(&(len as i16).to_be_bytes());
        } else {
            self.buf.extend_from_slice(&LONG_MARK.to_be_bytes());
            let extra = i32::try_from(len - LONG_MARK as usize).unwrap_or(i32::MAX);
            self.buf.extend_from_slice(&extra.to_be_bytes());
        }
        self.buf.extend_from_slice(v);
        self
    }

    /// A `string` field (UTF-8 in a `bytes` field).
    pub fn string(&mut self, v: Option<&str>) -> &mut Self {
        self.bytes(v.map(str::as_bytes))
    }

    /// Raw bytes with no prefix (PUSH bodies, trailing extension fields).
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }

    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads body fields from a slice. Running out of bytes is an error; trailing
/// bytes are left for the caller (legacy decoders ignore them, v2 reads extensions).
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    pub fn remaining(&self) -> &'a [u8] {
        self.buf
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated { field });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, field)?[0])
    }

    pub fn i16(&mut self, field: &'static str) -> Result<i16, DecodeError> {
        let b = self.take(2, field)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    pub fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        let b = self.take(4, field)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }

    /// A `bytes` field; a zero length decodes as `None`, like Java's null.
    pub fn bytes(&mut self, field: &'static str) -> Result<Option<&'a [u8]>, DecodeError> {
        let short = self.i16(field)?;
        let len = match short {
            0 => return Ok(None),
            LONG_MARK => {
                let extra = self.i32(field)?;
                let extra = usize::try_from(extra).map_err(|_| DecodeError::BadLength { field })?;
                LONG_MARK as usize + extra
            }
            n if n < 0 => return Err(DecodeError::BadLength { field }),
            n => n as usize,
        };
        self.take(len, field).map(Some)
    }

    /// A `string` field, decoded lossily like Java (malformed UTF-8 becomes U+FFFD).
    pub fn string(&mut self, field: &'static str) -> Result<Option<String>, DecodeError> {
        Ok(self
            .bytes(field)?
            .map(|b| String::from_utf8_lossy(b).into_owned()))
    }

    /// A `bytes` field that must hold exactly `N` bytes.
    pub fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let b = self.bytes(field)?.unwrap_or_default();
        b.try_into().map_err(|_| DecodeError::BadLength { field })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_prefix_boundaries() {
        for (len, prefix) in [
            (0usize, "0000"),
            (1, "0001"),
            (32766, "7ffe"),
            (32767, "7fff00000000"),
            (40000, "7fff00001c41"),
        ] {
            let data = vec![7u8; len];
            let mut w = Writer::new();
            w.bytes(Some(&data));
            let out = w.finish();
            assert_eq!(hex::encode(&out[..prefix.len() / 2]), prefix, "len {len}");
            let mut r = Reader::new(&out);
            let back = r.bytes("f").expect("decodes");
            assert_eq!(back.map(<[u8]>::len).unwrap_or(0), len);
            assert!(r.is_empty());
        }
    }

    #[test]
    fn negative_and_truncated_lengths_are_errors() {
        assert!(matches!(
            Reader::new(&[0x80, 0x00]).bytes("f"),
            Err(DecodeError::BadLength { .. })
        ));
        assert!(matches!(
            Reader::new(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff]).bytes("f"),
            Err(DecodeError::BadLength { .. })
        ));
        assert!(matches!(
            Reader::new(&[0x00, 0x05, 1, 2]).bytes("f"),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn empty_string_decodes_as_null() {
        let mut w = Writer::new();
        w.string(Some(""));
        assert_eq!(Reader::new(&w.finish()).string("s").expect("ok"), None);
    }
}
