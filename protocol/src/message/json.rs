//! The WebSocket JSON text-frame form of spec section 8, spoken by mpush's
//! legacy JavaScript client: no encryption, no compression, no heartbeat.
//!
//! Frames look like `{"body":{...},"bodyLength":N,"cmd":15,"flags":16,"sessionId":7}`
//! with sorted keys; `bodyLength` is an artifact of fastjson that readers ignore.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::error::DecodeError;
use crate::packet::{Command, Flags};

/// One JSON frame with its body still untyped.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonPacket {
    pub cmd: Command,
    pub flags: Flags,
    pub session_id: i32,
    pub body: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawPacket {
    cmd: i64,
    #[serde(default)]
    flags: i64,
    #[serde(default)]
    session_id: i64,
    #[serde(default)]
    body: Option<Value>,
}

impl JsonPacket {
    pub fn new(cmd: Command, session_id: i32, body: Option<Map<String, Value>>) -> Self {
        Self {
            cmd,
            flags: Flags::JSON_BODY,
            session_id,
            body,
        }
    }

    /// Parses a text frame. Missing `flags`/`sessionId` default to 0 (mpush would
    /// fail on a missing JSON flag; this decoder is lenient there).
    pub fn parse(text: &str) -> Result<Self, DecodeError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| DecodeError::Json(e.to_string()))?;
        if !value.is_object() {
            return Err(DecodeError::Json("frame is not a JSON object".into()));
        }
        let raw: RawPacket =
            serde_json::from_value(value).map_err(|e| DecodeError::Json(e.to_string()))?;
        let cmd = u8::try_from(raw.cmd).map_err(|_| DecodeError::Invalid {
            field: "cmd",
            reason: "out of range",
        })?;
        let flags = u8::try_from(raw.flags).map_err(|_| DecodeError::Invalid {
            field: "flags",
            reason: "out of range",
        })?;
        let session_id = i32::try_from(raw.session_id).map_err(|_| DecodeError::Invalid {
            field: "sessionId",
            reason: "out of range",
        })?;
        let body = match raw.body {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(_) => {
                return Err(DecodeError::Invalid {
                    field: "body",
                    reason: "not an object",
                });
            }
        };
        Ok(Self {
            cmd: Command(cmd),
            flags: Flags(flags),
            session_id,
            body,
        })
    }

    /// Renders the frame as mpush does, keys sorted.
    pub fn to_text(&self) -> String {
        let mut v = json!({
            "cmd": self.cmd.0,
            "flags": self.flags.0,
            "sessionId": self.session_id,
            "bodyLength": self.body.as_ref().map_or(0, Map::len),
        });
        if let (Some(body), Value::Object(obj)) = (&self.body, &mut v) {
            obj.insert("body".into(), Value::Object(body.clone()));
        }
        v.to_string()
    }

    /// A string field of the body; absent or null is empty, like the binary form.
    pub fn str_field(&self, key: &str) -> String {
        match self.body.as_ref().and_then(|b| b.get(key)) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        }
    }

    pub fn int_field(&self, key: &str) -> i64 {
        self.body
            .as_ref()
            .and_then(|b| b.get(key))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    }
}

/// Builds a body object from key/value pairs, leaving out empty strings (null).
pub fn body<'a>(fields: impl IntoIterator<Item = (&'a str, Value)>) -> Map<String, Value> {
    fields
        .into_iter()
        .filter(|(_, v)| !matches!(v, Value::Null) && v.as_str() != Some(""))
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

/// OK in JSON: `{cmd, code (left out if 0), data}`.
pub fn ok(answering: Command, session_id: i32, data: &str) -> JsonPacket {
    JsonPacket::new(
        Command::OK,
        session_id,
        Some(body([("cmd", json!(answering.0)), ("data", json!(data))])),
    )
}

/// ERROR in JSON: `{cmd, code (left out if 0), reason, data}`.
pub fn error(answering: Command, session_id: i32, code: u8, reason: &str) -> JsonPacket {
    let mut fields = vec![("cmd", json!(answering.0)), ("reason", json!(reason))];
    if code != 0 {
        fields.push(("code", json!(code)));
    }
    JsonPacket::new(Command::ERROR, session_id, Some(body(fields)))
}

/// PUSH in JSON: the content decoded as UTF-8 (lossily), with the ack flags.
pub fn push(session_id: i32, content: &[u8], ack_flags: Flags) -> JsonPacket {
    let mut p = JsonPacket::new(
        Command::PUSH,
        session_id,
        Some(body([("content", json!(String::from_utf8_lossy(content)))])),
    );
    p.flags = p.flags.with(ack_flags);
    p
}

/// KICK in JSON.
pub fn kick(device_id: &str, user_id: &str) -> JsonPacket {
    JsonPacket::new(
        Command::KICK,
        0,
        Some(body([
            ("deviceId", json!(device_id)),
            ("userId", json!(user_id)),
        ])),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_fastjson() {
        let p = push(7, b"hi", Flags::AUTO_ACK);
        assert_eq!(
            p.to_text(),
            r#"{"body":{"content":"hi"},"bodyLength":1,"cmd":15,"flags":24,"sessionId":7}"#
        );
        let hs_ok = JsonPacket::new(Command::HANDSHAKE, 3, None);
        assert_eq!(
            hs_ok.to_text(),
            r#"{"bodyLength":0,"cmd":2,"flags":16,"sessionId":3}"#
        );
        assert_eq!(
            ok(Command::BIND, 4, "bind success").to_text(),
            r#"{"body":{"cmd":5,"data":"bind success"},"bodyLength":2,"cmd":11,"flags":16,"sessionId":4}"#
        );
    }

    #[test]
    fn parses_client_frames() {
        let p = JsonPacket::parse(r#"{"cmd":23,"flags":16,"sessionId":9,"body":null}"#)
            .expect("parses");
        assert_eq!((p.cmd, p.session_id, p.body), (Command::ACK, 9, None));
        let b = JsonPacket::parse(
            r#"{"cmd":5,"flags":16,"sessionId":2,"body":{"userId":"u1","tags":null}}"#,
        )
        .expect("parses");
        assert_eq!(b.str_field("userId"), "u1");
        assert_eq!(b.str_field("tags"), "");
        assert!(JsonPacket::parse("[1,2]").is_err());
        assert!(JsonPacket::parse(r#"{"cmd":999}"#).is_err());
        assert!(JsonPacket::parse(r#"{"cmd":5,"body":3}"#).is_err());
    }
}
