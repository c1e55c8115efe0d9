//! Types both machines share: the profile, device facts, what a server stores to
//! resume a session, the client's resume ticket, and the ACK modes.

use serde::{Deserialize, Serialize};

use crate::crypto::{AesKey, ResumeKey};

/// Which protocol profile a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    /// Exactly mpush 0.8.1: AES-CBC with a static IV, raw push bodies.
    Legacy,
    /// Negotiated extensions: AES-GCM, push envelopes with message ids,
    /// resume proofs, redirects.
    V2,
}

/// How a push is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AckMode {
    /// Fire and forget.
    #[default]
    None,
    /// The receiving SDK acknowledges on receipt.
    Auto,
    /// The application acknowledges when it has handled the message.
    Biz,
}

impl AckMode {
    pub fn flags(self) -> crate::Flags {
        match self {
            Self::None => crate::Flags::NONE,
            Self::Auto => crate::Flags::AUTO_ACK,
            Self::Biz => crate::Flags::BIZ_ACK,
        }
    }

    /// BIZ wins over AUTO when a sender sets both bits.
    pub fn from_flags(flags: crate::Flags) -> Self {
        if flags.contains(crate::Flags::BIZ_ACK) {
            Self::Biz
        } else if flags.contains(crate::Flags::AUTO_ACK) {
            Self::Auto
        } else {
            Self::None
        }
    }

    pub fn to_v2(self) -> i32 {
        match self {
            Self::None => crate::message::v2::AckMode::None as i32,
            Self::Auto => crate::message::v2::AckMode::Auto as i32,
            Self::Biz => crate::message::v2::AckMode::Biz as i32,
        }
    }

    pub fn from_v2(v: i32) -> Self {
        match crate::message::v2::AckMode::try_from(v) {
            Ok(crate::message::v2::AckMode::Auto) => Self::Auto,
            Ok(crate::message::v2::AckMode::Biz) => Self::Biz,
            _ => Self::None,
        }
    }
}

/// Lengths (bytes) a server keeps of what a client says about itself and
/// what it binds. They are set from what real clients send (browser user
/// agents, Android and iOS device and OS strings, mpush 0.8.1's web page,
/// which sends `"web " + navigator.userAgent` as its OS name), and chosen per
/// field between refusing and truncating, so that no client mpush 0.8.1
/// accepted is refused for a field's length:
///
/// - identity fields (device id, user id) are refused over their cap, which
///   is several times the longest real scheme (an FCM token is ~160 bytes,
///   an e-mail address at most 254): cutting one would merge two devices or
///   users;
/// - descriptive fields (OS name and version, client version) are cut to
///   their cap at a character boundary, never refused;
/// - tags are cut at the last comma that fits, so whole tags are kept;
/// - the bind token is not capped here: it is only held while the bind is
///   checked, the packet size bounds it, and a server that checks tokens
///   refuses one longer than any token it issues.
pub mod limits {
    pub const DEVICE_ID: usize = 512;
    pub const USER_ID: usize = 512;
    pub const OS_NAME: usize = 512;
    pub const OS_VERSION: usize = 256;
    pub const CLIENT_VERSION: usize = 256;
    pub const TAGS: usize = 4096;

    /// A fast-connect session id (ours are 32 hex characters).
    pub const SESSION_ID: usize = 64;

    /// Checks a BIND's user id and cuts its tags to [`TAGS`]; the error
    /// names the field that is refused.
    pub fn check_bind(user_id: &str, tags: &mut String) -> Result<(), &'static str> {
        if user_id.len() > USER_ID {
            return Err("userId");
        }
        cut_tags(tags);
        Ok(())
    }

    /// Cuts `s` to at most `max` bytes at a character boundary.
    pub fn cut(s: &mut String, max: usize) {
        if s.len() > max {
            let mut end = max;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
        }
    }

    /// Cuts tags to [`TAGS`] bytes, at the last comma that fits when there
    /// is one (a tag is never cut in half).
    pub fn cut_tags(tags: &mut String) {
        if tags.len() > TAGS {
            cut(tags, TAGS);
            if let Some(i) = tags.rfind(',') {
                tags.truncate(i);
            }
        }
    }
}

/// What a client said about itself in its handshake.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceInfo {
    pub device_id: String,
    pub os_name: String,
    pub os_version: String,
    pub client_version: String,
}

impl DeviceInfo {
    /// Applies [`limits`]: a device id over its cap is refused (the error
    /// names it); the descriptive fields are cut to theirs.
    pub fn check_limits(&mut self) -> Result<(), &'static str> {
        if self.device_id.len() > limits::DEVICE_ID {
            return Err("deviceId");
        }
        limits::cut(&mut self.os_name, limits::OS_NAME);
        limits::cut(&mut self.os_version, limits::OS_VERSION);
        limits::cut(&mut self.client_version, limits::CLIENT_VERSION);
        Ok(())
    }

    /// mpush's client type, from the OS name.
    pub fn client_type(&self) -> ClientType {
        ClientType::from_os_name(&self.os_name)
    }
}

/// mpush's client types: one connection per user per type (a second login
/// of the same type replaces the first). On the wire, in Redis and in JSON
/// it is mpush's integer (`code`): 1 mobile, 2 pc, 3 web, -1 unknown.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(into = "i32", try_from = "i32")]
pub enum ClientType {
    #[default]
    Unknown,
    Mobile,
    Pc,
    Web,
}

impl ClientType {
    /// mpush's integer.
    pub const fn code(self) -> i32 {
        match self {
            Self::Unknown => -1,
            Self::Mobile => 1,
            Self::Pc => 2,
            Self::Web => 3,
        }
    }

    /// From mpush's integer; `None` for one it does not define.
    pub const fn from_code(code: i32) -> Option<Self> {
        match code {
            -1 => Some(Self::Unknown),
            1 => Some(Self::Mobile),
            2 => Some(Self::Pc),
            3 => Some(Self::Web),
            _ => None,
        }
    }

    /// mpush's rule: the OS name says which (case-insensitive words).
    pub fn from_os_name(os_name: &str) -> Self {
        let os = os_name.to_lowercase();
        let has = |words: &[&str]| words.iter().any(|w| os.contains(w));
        if has(&["android", "ios"]) {
            Self::Mobile
        } else if has(&["windows", "mac", "linux"]) {
            Self::Pc
        } else if has(&["web", "h5"]) {
            Self::Web
        } else {
            Self::Unknown
        }
    }

    /// The API's name for it (`mobile`, `pc`, `web`, `unknown`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Mobile => "mobile",
            Self::Pc => "pc",
            Self::Web => "web",
        }
    }
}

impl From<ClientType> for i32 {
    fn from(t: ClientType) -> Self {
        t.code()
    }
}

/// An integer mpush does not define as a client type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("client type {0}: 1 (mobile), 2 (pc), 3 (web) or -1 (unknown)")]
pub struct UnknownClientType(pub i32);

impl TryFrom<i32> for ClientType {
    type Error = UnknownClientType;

    fn try_from(code: i32) -> Result<Self, Self::Error> {
        Self::from_code(code).ok_or(UnknownClientType(code))
    }
}

/// The key material a session is resumed with.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum SessionSecret {
    /// mpush's: the CBC session key and the static IV.
    Legacy { key: AesKey, iv: [u8; 16] },
    /// v2: a resume key that never goes on the wire.
    V2 { resume_key: ResumeKey },
    /// v2 on the transport-secured profile (ADR 0005): the resume key the
    /// server drew and sent inside TLS. Such a session resumes only on a
    /// secure transport, and only into the same profile.
    Transport { resume_key: ResumeKey },
}

impl SessionSecret {
    /// A v2 session's secret: on the transport-secured profile or not.
    pub fn resumable(resume_key: ResumeKey, transport: bool) -> Self {
        if transport {
            Self::Transport { resume_key }
        } else {
            Self::V2 { resume_key }
        }
    }

    /// A session of the transport-secured profile (ADR 0005).
    pub fn is_transport(&self) -> bool {
        matches!(self, Self::Transport { .. })
    }
}

/// What the server stores under a session id so a client can fast-connect.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SessionRecord {
    pub session_id: String,
    pub device: DeviceInfo,
    pub secret: SessionSecret,
    /// Unix milliseconds.
    pub expire_at_ms: i64,
    /// The binding kept with the session (ADR 0008), restored on a fast
    /// connect that negotiates `FEATURE_KEEP_BINDING`. Never on the wire.
    pub binding: Option<KeptBinding>,
}

/// A binding kept with a session (ADR 0008): what a BIND that succeeded
/// said, so a fast connect can bind again without one.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct KeptBinding {
    pub user_id: String,
    /// The tags the bind set (the client's, or the ones its token fixed).
    pub tags: String,
    /// Unix milliseconds when the bind token expires; 0: no token was
    /// needed, no expiry but the session's.
    pub expires_at_ms: i64,
}

impl KeptBinding {
    /// Still good at `now_ms`: a binding whose token expired is not restored
    /// (the client binds itself with a fresh token).
    pub fn is_live(&self, now_ms: i64) -> bool {
        self.expires_at_ms == 0 || self.expires_at_ms > now_ms
    }
}

/// What the client keeps to fast-connect later (mpush's `token.dat`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ResumeTicket {
    pub session_id: String,
    /// Unix milliseconds.
    pub expire_at_ms: i64,
    pub secret: SessionSecret,
}

fn signed_bytes(b: &[u8]) -> String {
    b.iter()
        .map(|&x| (x as i8).to_string())
        .collect::<Vec<_>>()
        .join("|")
}

fn parse_signed_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
    let v: Vec<u8> = s
        .split('|')
        .map(|p| p.trim().parse::<i8>().map(|x| x as u8))
        .collect::<Result<_, _>>()
        .ok()?;
    v.try_into().ok()
}

impl ResumeTicket {
    /// mpush's `token.dat` line: `sessionId,expireTime,<key>,<iv>` with the bytes
    /// as signed decimals joined by `|`. Only legacy tickets have this form.
    pub fn to_token_dat(&self) -> Option<String> {
        match &self.secret {
            SessionSecret::Legacy { key, iv } => Some(format!(
                "{},{},{},{}",
                self.session_id,
                self.expire_at_ms,
                signed_bytes(&key.0),
                signed_bytes(iv)
            )),
            SessionSecret::V2 { .. } | SessionSecret::Transport { .. } => None,
        }
    }

    /// One line for any ticket: `token.dat` for legacy tickets, and
    /// `v2,<sessionId>,<expireTime>,<hex resume key>` for v2 ones.
    pub fn to_text(&self) -> String {
        match &self.secret {
            SessionSecret::Legacy { .. } => self.to_token_dat().unwrap_or_default(),
            SessionSecret::V2 { resume_key } | SessionSecret::Transport { resume_key } => format!(
                "{},{},{},{}",
                if self.secret.is_transport() {
                    "vt"
                } else {
                    "v2"
                },
                self.session_id,
                self.expire_at_ms,
                hex::encode(resume_key.0.as_slice())
            ),
        }
    }

    /// Parses `to_text`'s output (and mpush's `token.dat`).
    pub fn from_text(line: &str) -> Option<Self> {
        let line = line.trim();
        let (transport, rest) = match (line.strip_prefix("v2,"), line.strip_prefix("vt,")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => return Self::from_token_dat(line),
        };
        let parts: Vec<&str> = rest.split(',').collect();
        let [sid, exp, key] = parts.as_slice() else {
            return None;
        };
        // Exactly 64 hex digits (no sign, as `from_str_radix` per pair took).
        let mut k = [0u8; crate::crypto::RESUME_KEY_LEN];
        hex::decode_to_slice(key, &mut k).ok()?;
        let resume_key = crate::crypto::ResumeKey(k);
        Some(Self {
            session_id: (*sid).to_owned(),
            expire_at_ms: exp.parse().ok()?,
            secret: SessionSecret::resumable(resume_key, transport),
        })
    }

    pub fn from_token_dat(line: &str) -> Option<Self> {
        let parts: Vec<&str> = line.trim().split(',').collect();
        let [sid, exp, key, iv] = parts.as_slice() else {
            return None;
        };
        Some(Self {
            session_id: (*sid).to_owned(),
            expire_at_ms: exp.parse().ok()?,
            secret: SessionSecret::Legacy {
                key: AesKey(parse_signed_bytes(key)?),
                iv: parse_signed_bytes(iv)?,
            },
        })
    }
}

impl SessionRecord {
    /// mpush's Redis value for `mp:rs:<sessionId>`:
    /// `osName,osVersion,clientVersion,deviceId,<key>,<iv>` (legacy sessions only).
    pub fn to_mpush_value(&self) -> Option<String> {
        let field = |s: &str| {
            if s.is_empty() {
                "null".to_owned()
            } else {
                s.to_owned()
            }
        };
        match &self.secret {
            SessionSecret::Legacy { key, iv } => Some(format!(
                "{},{},{},{},{},{}",
                field(&self.device.os_name),
                field(&self.device.os_version),
                field(&self.device.client_version),
                field(&self.device.device_id),
                signed_bytes(&key.0),
                signed_bytes(iv)
            )),
            SessionSecret::V2 { .. } | SessionSecret::Transport { .. } => None,
        }
    }

    /// Parses mpush's Redis value; it needs exactly six fields.
    pub fn from_mpush_value(session_id: &str, expire_at_ms: i64, value: &str) -> Option<Self> {
        let parts: Vec<&str> = value.split(',').collect();
        let [os, osv, cv, dev, key, iv] = parts.as_slice() else {
            return None;
        };
        let field = |s: &str| {
            if s == "null" {
                String::new()
            } else {
                s.to_owned()
            }
        };
        Some(Self {
            session_id: session_id.to_owned(),
            device: DeviceInfo {
                device_id: field(dev),
                os_name: field(os),
                os_version: field(osv),
                client_version: field(cv),
            },
            secret: SessionSecret::Legacy {
                key: AesKey(parse_signed_bytes(key)?),
                iv: parse_signed_bytes(iv)?,
            },
            expire_at_ms,
            binding: None,
        })
    }
}

/// A duration as the wire's milliseconds (saturating).
pub fn duration_ms(d: std::time::Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_dat_matches_spec_vector() {
        let line = "0123456789abcdef0123456789abcdef,1700000000000,-48|-48|-48|-48|-48|-48|-48|-48|-48|-48|-48|-48|-48|-48|-48|-48,16|17|18|19|20|21|22|23|24|25|26|27|28|29|30|31";
        let t = ResumeTicket::from_token_dat(line).expect("parses");
        assert_eq!(t.expire_at_ms, 1_700_000_000_000);
        assert_eq!(
            t.secret,
            SessionSecret::Legacy {
                key: AesKey([0xd0; 16]),
                iv: std::array::from_fn(|i| 0x10 + i as u8)
            }
        );
        assert_eq!(t.to_token_dat().as_deref(), Some(line));
        assert!(ResumeTicket::from_token_dat("a,b,c").is_none());
    }

    #[test]
    fn ticket_text_round_trips_for_both_profiles() {
        let v2 = ResumeTicket {
            session_id: "abc".into(),
            expire_at_ms: 42,
            secret: SessionSecret::V2 {
                resume_key: crate::crypto::ResumeKey([0xAB; 32]),
            },
        };
        assert_eq!(ResumeTicket::from_text(&v2.to_text()), Some(v2));
        let legacy = ResumeTicket {
            session_id: "abc".into(),
            expire_at_ms: 42,
            secret: SessionSecret::Legacy {
                key: AesKey([1; 16]),
                iv: [2; 16],
            },
        };
        assert_eq!(ResumeTicket::from_text(&legacy.to_text()), Some(legacy));
        assert_eq!(ResumeTicket::from_text("v2,a,1,zz"), None);
        assert_eq!(ResumeTicket::from_text("garbage"), None);
    }

    #[test]
    fn mpush_session_value_round_trips() {
        let r = SessionRecord {
            session_id: "s".into(),
            device: DeviceInfo {
                device_id: "dev-1".into(),
                os_name: "android".into(),
                os_version: "6.0".into(),
                client_version: String::new(),
            },
            secret: SessionSecret::Legacy {
                key: AesKey([0xd0; 16]),
                iv: [1; 16],
            },
            expire_at_ms: 5,
            binding: None,
        };
        let v = r.to_mpush_value().expect("legacy");
        assert!(v.starts_with("android,6.0,null,dev-1,-48|"));
        assert_eq!(SessionRecord::from_mpush_value("s", 5, &v), Some(r));
        assert!(SessionRecord::from_mpush_value("s", 5, "a,b,c").is_none());
    }

    #[test]
    fn client_type_from_os_name() {
        let t = |os: &str| {
            DeviceInfo {
                os_name: os.into(),
                ..Default::default()
            }
            .client_type()
        };
        assert_eq!(
            (t("Android"), t("iOS"), t("Mac OS X"), t("web"), t("tv")),
            (
                ClientType::Mobile,
                ClientType::Mobile,
                ClientType::Pc,
                ClientType::Web,
                ClientType::Unknown
            )
        );
        for t in [
            ClientType::Unknown,
            ClientType::Mobile,
            ClientType::Pc,
            ClientType::Web,
        ] {
            assert_eq!(ClientType::from_code(t.code()), Some(t));
            let json = serde_json::to_string(&t).expect("json");
            assert_eq!(json, t.code().to_string());
            assert_eq!(serde_json::from_str::<ClientType>(&json).ok(), Some(t));
        }
        assert_eq!(ClientType::from_code(0), None);
        assert!(serde_json::from_str::<ClientType>("7").is_err());
    }
}
