use super::{Body, bytes, opt, string};
use crate::error::DecodeError;
use crate::packet::Command;
use crate::wire::{Reader, Writer};

/// The HTTP proxy request method byte; anything unknown means GET, as in mpush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpMethod {
    #[default]
    Get,
    Post,
    Put,
    Delete,
}

impl HttpMethod {
    pub fn from_byte(b: u8) -> Self {
        match b {
            1 => Self::Post,
            2 => Self::Put,
            3 => Self::Delete,
            _ => Self::Get,
        }
    }

    pub fn to_byte(self) -> u8 {
        match self {
            Self::Get => 0,
            Self::Post => 1,
            Self::Put => 2,
            Self::Delete => 3,
        }
    }
}

/// HTTP_PROXY request, client to server.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HttpRequest {
    pub method: HttpMethod,
    pub uri: String,
    /// `name:value\n` lines; see [`parse_headers`].
    pub headers: String,
    pub body: Vec<u8>,
}

impl Body for HttpRequest {
    const CMD: Command = Command::HTTP_PROXY;

    fn encode(&self, w: &mut Writer) {
        w.u8(self.method.to_byte())
            .string(opt(&self.uri))
            .string(opt(&self.headers))
            .bytes(Some(&self.body));
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            method: HttpMethod::from_byte(r.u8("method")?),
            uri: string(r, "uri")?,
            headers: string(r, "headers")?,
            body: bytes(r, "body")?,
        })
    }
}

/// HTTP_PROXY response, server to client.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HttpResponse {
    pub status_code: i32,
    pub reason_phrase: String,
    pub headers: String,
    pub body: Vec<u8>,
}

impl Body for HttpResponse {
    const CMD: Command = Command::HTTP_PROXY;

    fn encode(&self, w: &mut Writer) {
        w.i32(self.status_code)
            .string(opt(&self.reason_phrase))
            .string(opt(&self.headers))
            .bytes(Some(&self.body));
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            status_code: r.i32("statusCode")?,
            reason_phrase: string(r, "reasonPhrase")?,
            headers: string(r, "headers")?,
            body: bytes(r, "body")?,
        })
    }
}

/// Parses mpush's header text: only lines ending in `\n` count, split at the
/// first `:`, nothing trimmed. (mpush keeps the previous value for `name:`
/// with an empty value; this parser records the empty value instead.)
pub fn parse_headers(text: &str) -> Vec<(String, String)> {
    text.split_inclusive('\n')
        .filter_map(|line| line.strip_suffix('\n'))
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Formats headers as mpush does: `name:value\n` each; no headers is null.
pub fn format_headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    headers
        .into_iter()
        .map(|(k, v)| format!("{k}:{v}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let text = format_headers([("readTimeout", "3000"), ("content-type", "a:b")]);
        assert_eq!(text, "readTimeout:3000\ncontent-type:a:b\n");
        assert_eq!(
            parse_headers(&text),
            vec![
                ("readTimeout".into(), "3000".into()),
                ("content-type".into(), "a:b".into())
            ]
        );
        assert!(parse_headers("no-newline:x").is_empty());
    }
}
