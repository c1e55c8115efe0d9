//! Who may bind as whom. Two token schemes, checked on every BIND on every
//! profile and transport:
//!
//! - JWT (`security.jwt_secret` for HS256, `security.jwt_public_key` for RS256
//!   or ES256): `sub` is the user id, `exp` is required; optional `clientType`
//!   (the bind is refused from another client type) and `tags` (they replace
//!   the tags the client sent), `iss`/`aud` when configured.
//! - mpush-style HMAC tokens (`security.bind_secret`): `<expiry>.<hex HMAC>`.
//!
//! With neither configured every bind is accepted (mpush's behaviour), which
//! the settings allow only on loopback or with `security.anonymous_bind`.

use hmac::{KeyInit, Mac};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use mpush_protocol::session::ClientType;
use serde::{Deserialize, Serialize};

use crate::clock::unix_ms;

/// The claims of a bind token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    pub sub: String,
    pub exp: u64,
    #[serde(
        rename = "clientType",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_type: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<String>,
}

/// What a valid token grants beyond the user id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// Tags the token fixes (they replace the client's).
    pub tags: Option<String>,
    /// Unix milliseconds when the token expires (0: no token was needed).
    /// A binding kept with a session ends then (ADR 0008).
    pub expires_at_ms: i64,
}

struct Jwt {
    key: DecodingKey,
    validation: Validation,
}

pub struct BindAuth {
    hmac_secret: String,
    jwt: Option<Jwt>,
    /// `security.max_bind_token_lifetime_secs`: a token that expires
    /// further away than this is refused (None: no limit).
    max_lifetime: Option<u64>,
}

/// Why a bind token does not let a client bind (the words are the ones the
/// logs, the close reason and the docs use).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    #[error("bind token is longer than {MAX_TOKEN_LEN} bytes")]
    TooLong,
    #[error("bind token missing or malformed")]
    Malformed,
    /// The JWT did not verify (signature, algorithm, expiry, issuer, audience).
    #[error("bind token: {0}")]
    Invalid(String),
    #[error("bind token is for another user")]
    OtherUser,
    #[error("bind token is for another client type")]
    OtherClientType,
    #[error("bind token expiry is not a number")]
    BadExpiry,
    #[error("bind token expired")]
    Expired,
    #[error("bind token does not match the user")]
    Mismatch,
    #[error("bind token expires in more than {0} s (security.max_bind_token_lifetime_secs)")]
    LivesTooLong(i64),
}

/// The longest bind token a server that checks tokens reads: far above any
/// JWT it issues (an RS256 token with a few claims is under 1 KiB).
pub const MAX_TOKEN_LEN: usize = 8192;

impl std::fmt::Debug for BindAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BindAuth")
            .field("hmac", &!self.hmac_secret.is_empty())
            .field("jwt", &self.jwt.is_some())
            .finish()
    }
}

/// What bind tokens are checked with (from `security.*` in the settings;
/// the configuration builds it, so this layer does not read the settings).
#[derive(Debug, Clone, Copy, Default)]
pub struct TokenKeys<'a> {
    /// `bind_secret`: HMAC tokens (`user.expiry.mac`).
    pub bind_secret: &'a str,
    /// `jwt_secret` (HS256), or `jwt_public_key` / `jwt_public_key_file` (ES256, RS256).
    pub jwt_secret: &'a str,
    pub jwt_public_key: &'a str,
    pub jwt_public_key_file: &'a str,
    pub jwt_issuer: &'a str,
    pub jwt_audience: &'a str,
    /// A token that expires further away than this is refused; 0: no limit.
    pub max_bind_token_lifetime_secs: u64,
}

/// What is wrong with the configured token keys (the words name the setting).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("{file}: {reason}")]
    File { file: String, reason: String },
    #[error("jwt_secret needs 32 characters or more")]
    ShortSecret,
    #[error("give jwt_secret or jwt_public_key, not both")]
    Both,
    /// A key the JWT library refused (`setting: reason`).
    #[error("{setting}: {reason}")]
    Key {
        setting: &'static str,
        reason: String,
    },
}

impl BindAuth {
    /// From the token keys; `Err` names what is wrong with a key.
    pub fn new(s: &TokenKeys<'_>) -> Result<Self, KeyError> {
        let public = if !s.jwt_public_key.is_empty() {
            Some(s.jwt_public_key.to_owned())
        } else if !s.jwt_public_key_file.is_empty() {
            Some(
                std::fs::read_to_string(s.jwt_public_key_file).map_err(|e| KeyError::File {
                    file: s.jwt_public_key_file.to_owned(),
                    reason: e.to_string(),
                })?,
            )
        } else {
            None
        };
        let key = match (s.jwt_secret, public) {
            ("", None) => None,
            (secret, None) => {
                if secret.len() < 32 {
                    return Err(KeyError::ShortSecret);
                }
                let key =
                    DecodingKey::from_secret(secret.as_bytes()).map_err(|e| KeyError::Key {
                        setting: "jwt_secret",
                        reason: e.to_string(),
                    })?;
                Some((key, Algorithm::HS256))
            }
            // An SPKI PEM does not name its algorithm in the armour.
            ("", Some(pem)) => Some(match DecodingKey::from_ec_pem(pem.as_bytes()) {
                Ok(k) => (k, Algorithm::ES256),
                Err(_) => (
                    DecodingKey::from_rsa_pem(pem.as_bytes()).map_err(|e| KeyError::Key {
                        setting: "jwt_public_key",
                        reason: e.to_string(),
                    })?,
                    Algorithm::RS256,
                ),
            }),
            (_, Some(_)) => {
                return Err(KeyError::Both);
            }
        };
        // The algorithm is pinned by the configuration: `none` and algorithm
        // confusion fail.
        let jwt = key.map(|(key, alg)| {
            let mut validation = Validation::new(alg);
            validation.leeway = 30;
            validation.set_required_spec_claims(&["exp", "sub"]);
            if !s.jwt_issuer.is_empty() {
                validation.set_issuer(&[s.jwt_issuer]);
            }
            if s.jwt_audience.is_empty() {
                validation.validate_aud = false;
            } else {
                validation.set_audience(&[s.jwt_audience]);
            }
            Jwt { key, validation }
        });
        Ok(Self {
            hmac_secret: s.bind_secret.to_owned(),
            jwt,
            max_lifetime: (s.max_bind_token_lifetime_secs > 0)
                .then_some(s.max_bind_token_lifetime_secs),
        })
    }

    /// True when no scheme is configured: every bind is accepted.
    pub fn is_anonymous(&self) -> bool {
        self.hmac_secret.is_empty() && self.jwt.is_none()
    }

    /// Checks `token` for binding `user_id` from a client of `client_type`.
    pub fn check(
        &self,
        user_id: &str,
        client_type: ClientType,
        token: &str,
    ) -> Result<Grant, TokenError> {
        if self.is_anonymous() {
            return Ok(Grant::default());
        }
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::TooLong);
        }
        let looks_jwt = token.bytes().filter(|b| *b == b'.').count() == 2;
        match (&self.jwt, looks_jwt) {
            (Some(j), true) => {
                let data = jsonwebtoken::decode::<Claims>(token, &j.key, &j.validation)
                    .map_err(|e| TokenError::Invalid(e.to_string()))?;
                let c = data.claims;
                if c.sub != user_id {
                    return Err(TokenError::OtherUser);
                }
                // The claim is mpush's integer (any other value matches none).
                if c.client_type.is_some_and(|ct| ct != client_type.code()) {
                    return Err(TokenError::OtherClientType);
                }
                let exp = i64::try_from(c.exp).unwrap_or(i64::MAX);
                self.check_lifetime(exp)?;
                Ok(Grant {
                    tags: c.tags,
                    expires_at_ms: exp.saturating_mul(1000),
                })
            }
            _ if !self.hmac_secret.is_empty() => {
                let exp = check_hmac_token(&self.hmac_secret, user_id, token)?;
                self.check_lifetime(exp)?;
                Ok(Grant {
                    tags: None,
                    expires_at_ms: exp.saturating_mul(1000),
                })
            }
            _ => Err(TokenError::Malformed),
        }
    }
}

impl BindAuth {
    /// A token expiring at `exp` (Unix seconds) lives no longer than
    /// `max_bind_token_lifetime_secs` from now (with the JWT leeway).
    fn check_lifetime(&self, exp: i64) -> Result<(), TokenError> {
        let Some(max) = self.max_lifetime else {
            return Ok(());
        };
        let now = unix_ms() / 1000;
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        if exp.saturating_sub(now) > max.saturating_add(30) {
            return Err(TokenError::LivesTooLong(max));
        }
        Ok(())
    }
}

/// Mints a JWT bind token for `user_id`, valid for `ttl_secs`: HS256 with
/// `secret`, or RS256/ES256 with a PEM private key.
pub fn mint_jwt(
    key: &MintKey,
    user_id: &str,
    ttl_secs: u64,
    client_type: Option<i32>,
    tags: Option<String>,
) -> Result<String, jsonwebtoken::errors::Error> {
    let claims = Claims {
        sub: user_id.to_owned(),
        exp: u64::try_from(unix_ms() / 1000).unwrap_or(0) + ttl_secs,
        client_type,
        tags,
    };
    let (header, enc) = match key {
        MintKey::Secret(s) => (
            Header::new(Algorithm::HS256),
            EncodingKey::from_secret(s.as_bytes())?,
        ),
        MintKey::RsaPem(p) => (
            Header::new(Algorithm::RS256),
            EncodingKey::from_rsa_pem(p.as_bytes())?,
        ),
        MintKey::EcPem(p) => (
            Header::new(Algorithm::ES256),
            EncodingKey::from_ec_pem(p.as_bytes())?,
        ),
    };
    jsonwebtoken::encode(&header, &claims, &enc)
}

/// The key a token is minted with.
pub enum MintKey {
    Secret(String),
    RsaPem(String),
    EcPem(String),
}

/// mpush-style bind tokens: `<unix expiry seconds>.<hex HMAC-SHA256(secret, userId "." expiry)>`;
/// the expiry of a valid one.
pub fn check_hmac_token(secret: &str, user_id: &str, token: &str) -> Result<i64, TokenError> {
    let (exp, _) = token.split_once('.').ok_or(TokenError::Malformed)?;
    let exp: i64 = exp.parse().map_err(|_| TokenError::BadExpiry)?;
    if exp.saturating_mul(1000) < unix_ms() {
        return Err(TokenError::Expired);
    }
    let want = sign_bind_token(secret, user_id, exp);
    if mpush_protocol::crypto::verify_mac(want.as_bytes(), token.as_bytes()) {
        Ok(exp)
    } else {
        Err(TokenError::Mismatch)
    }
}

/// Makes an mpush-style bind token for `user_id` valid until `expiry_unix_secs`.
pub fn sign_bind_token(secret: &str, user_id: &str, expiry_unix_secs: i64) -> String {
    let mut m = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes any key length");
    m.update(format!("{user_id}.{expiry_unix_secs}").as_bytes());
    format!(
        "{expiry_unix_secs}.{}",
        hex::encode(m.finalize().into_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Security;

    fn auth(f: impl FnOnce(&mut Security)) -> BindAuth {
        let mut s = Security::default();
        f(&mut s);
        BindAuth::new(&s.token_keys()).expect("valid")
    }

    #[test]
    fn hmac_tokens() {
        let a = auth(|s| s.bind_secret = "s3cret".into());
        let exp = unix_ms() / 1000 + 60;
        let t = sign_bind_token("s3cret", "u1", exp);
        assert!(a.check("u1", ClientType::Mobile, &t).is_ok());
        assert!(a.check("u2", ClientType::Mobile, &t).is_err());
        assert!(a.check("u1", ClientType::Mobile, "").is_err());
        let old = sign_bind_token("s3cret", "u1", 1000);
        assert!(a.check("u1", ClientType::Mobile, &old).is_err());
        assert!(
            auth(|_| {}).check("u1", ClientType::Mobile, "").is_ok(),
            "anonymous"
        );
    }

    #[test]
    fn hs256_tokens() {
        let secret = "0123456789abcdef0123456789abcdef";
        let a = auth(|s| s.jwt_secret = secret.into());
        let key = MintKey::Secret(secret.into());
        let t = mint_jwt(&key, "ann", 60, Some(1), Some("vip".into())).expect("minted");
        let g = a.check("ann", ClientType::Mobile, &t).expect("valid");
        assert_eq!(g.tags.as_deref(), Some("vip"));
        let ttl = g.expires_at_ms - unix_ms();
        assert!((55_000..=61_000).contains(&ttl), "expiry {ttl} ms away");
        assert!(
            a.check("bob", ClientType::Mobile, &t).is_err(),
            "another user"
        );
        assert!(
            a.check("ann", ClientType::Web, &t).is_err(),
            "another client type"
        );
        let other = MintKey::Secret("another-secret-another-secret-xx".into());
        let forged = mint_jwt(&other, "ann", 60, None, None).expect("minted");
        assert!(
            a.check("ann", ClientType::Mobile, &forged).is_err(),
            "wrong key"
        );
        // Expired beyond the leeway.
        let claims = Claims {
            sub: "ann".into(),
            exp: u64::try_from(unix_ms() / 1000).unwrap_or(0) - 120,
            client_type: None,
            tags: None,
        };
        let expired = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()).expect("key"),
        )
        .expect("encoded");
        assert!(
            a.check("ann", ClientType::Mobile, &expired).is_err(),
            "expired"
        );
        // alg=none and a token signed for another algorithm are refused.
        let none = format!(
            "{}.{}.",
            base64_url(r#"{"alg":"none","typ":"JWT"}"#),
            base64_url(&format!(r#"{{"sub":"ann","exp":{}}}"#, claims.exp + 1000))
        );
        assert!(
            a.check("ann", ClientType::Mobile, &none).is_err(),
            "alg none"
        );
    }

    #[test]
    fn a_maximum_lifetime_refuses_longer_tokens() {
        let secret = "0123456789abcdef0123456789abcdef";
        let a = auth(|s| {
            s.jwt_secret = secret.into();
            s.max_bind_token_lifetime_secs = 3600;
        });
        let key = MintKey::Secret(secret.into());
        let hour = mint_jwt(&key, "ann", 3600, None, None).expect("minted");
        assert!(a.check("ann", ClientType::Mobile, &hour).is_ok());
        let year = mint_jwt(&key, "ann", 365 * 86_400, None, None).expect("minted");
        let e = a
            .check("ann", ClientType::Mobile, &year)
            .expect_err("too long-lived");
        assert!(matches!(e, TokenError::LivesTooLong(_)), "{e}");
        assert!(
            e.to_string().contains("max_bind_token_lifetime_secs"),
            "{e}"
        );
        let h = auth(|s| {
            s.bind_secret = "s3cret".into();
            s.max_bind_token_lifetime_secs = 60;
        });
        let now = unix_ms() / 1000;
        assert!(
            h.check(
                "u1",
                ClientType::Mobile,
                &sign_bind_token("s3cret", "u1", now + 60)
            )
            .is_ok()
        );
        assert!(
            h.check(
                "u1",
                ClientType::Mobile,
                &sign_bind_token("s3cret", "u1", now + 86_400)
            )
            .is_err()
        );
        // Off by default.
        let open = auth(|s| s.jwt_secret = secret.into());
        assert!(open.check("ann", ClientType::Mobile, &year).is_ok());
        // A token longer than any real one is not parsed.
        let e = a
            .check("ann", ClientType::Mobile, &"x.y.".repeat(4000))
            .expect_err("too long");
        assert_eq!(e, TokenError::TooLong);
        assert!(e.to_string().contains("longer than"), "{e}");
    }

    fn base64_url(s: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
    }
}
