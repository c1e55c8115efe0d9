//! One way to hide credentials in what the server prints or logs: URLs
//! (userinfo, and query or fragment parameters whose names look like
//! credentials) and settings (by name: secrets, tokens, passwords, private
//! keys; by shape: every string that is a URL). `config print`, the
//! start-up log, and every log line that names a URL go through here, so a
//! URL setting added later is masked without anyone remembering to.

use serde_json::Value;

const MASK: &str = "***";

/// `scheme://user:password@host/path?token=x#k=v` →
/// `scheme://user:***@host/path?token=***#k=v`. A userinfo without a
/// password (`https://TOKEN@host`) is masked whole: it is the credential.
pub fn mask_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, url),
    };
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(auth_end);
    let authority = match authority.rfind('@') {
        Some(at) => {
            let (userinfo, host) = authority.split_at(at);
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:{MASK}{host}"),
                None => format!("{MASK}{host}"),
            }
        }
        None => authority.to_owned(),
    };
    let mut out = String::with_capacity(url.len());
    if let Some(s) = scheme {
        out.push_str(s);
        out.push_str("://");
    }
    out.push_str(&authority);
    // Path, then `?query`, then `#fragment`: parameters in the last two.
    let (before_frag, frag) = match tail.split_once('#') {
        Some((a, f)) => (a, Some(f)),
        None => (tail, None),
    };
    let (path, query) = match before_frag.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (before_frag, None),
    };
    out.push_str(path);
    if let Some(q) = query {
        out.push('?');
        out.push_str(&mask_params(q));
    }
    if let Some(f) = frag {
        out.push('#');
        out.push_str(&mask_params(f));
    }
    out
}

fn mask_params(q: &str) -> String {
    q.split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !v.is_empty() && credential_name(k) => format!("{k}={MASK}"),
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// A name that usually carries a credential (setting keys and URL
/// parameters alike), compared without case, `-` or `_`.
pub fn credential_name(name: &str) -> bool {
    let n: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    const WORDS: [&str; 14] = [
        "pass", "pwd", "secret", "token", "key", "sig", "auth", "cred", "session", "private",
        "bearer", "jwt", "otp", "hmac",
    ];
    WORDS.iter().any(|w| n.contains(w))
}

/// A setting whose value is a secret itself (not a path or a public key).
fn secret_setting(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    if n.ends_with("_file")
        || n.contains("public")
        || n.starts_with("allow")
        || n.starts_with("max_")
    {
        return false;
    }
    n == "private_key"
        || n.ends_with("secret")
        || n.ends_with("tokens")
        || n.ends_with("token")
        || n.contains("password")
}

/// Masks a settings tree in place: secret settings by name, URLs by shape.
pub fn mask_settings(v: &mut Value) {
    mask_value(v, None);
}

fn mask_value(v: &mut Value, key: Option<&str>) {
    match v {
        Value::Object(map) => {
            for (k, x) in map.iter_mut() {
                mask_value(x, Some(k));
            }
        }
        Value::Array(items) => {
            for x in items {
                mask_value(x, key);
            }
        }
        Value::String(s) => {
            if s.is_empty() {
                return;
            }
            if key.is_some_and(secret_setting) {
                *s = MASK.into();
            } else if s.contains("://") || (s.contains('@') && s.contains(':')) {
                *s = mask_url(s);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials_and_keep_the_rest() {
        for (url, shown) in [
            (
                "redis://app:hunter2@10.0.0.5:6379/0",
                "redis://app:***@10.0.0.5:6379/0",
            ),
            ("rediss://:hunter2@h:6380", "rediss://:***@h:6380"),
            (
                "redis+sentinel://u:p4ss@s1:26379,s2:26379/master",
                "redis+sentinel://u:***@s1:26379,s2:26379/master",
            ),
            (
                "https://ghp_abc123@hooks.example/x",
                "https://***@hooks.example/x",
            ),
            (
                "https://h.example/hook?team=a&api_key=K1&X-Amz-Signature=S&sig=z&page=2",
                "https://h.example/hook?team=a&api_key=***&X-Amz-Signature=***&sig=***&page=2",
            ),
            (
                "https://h.example/cb#access_token=T&state=s",
                "https://h.example/cb#access_token=***&state=s",
            ),
            (
                "https://a:b@h.example/p@q?token=t",
                "https://a:***@h.example/p@q?token=***",
            ),
            ("https://h.example/plain", "https://h.example/plain"),
            ("user:pw@host:6379", "user:***@host:6379"),
        ] {
            assert_eq!(mask_url(url), shown, "{url}");
        }
    }

    #[test]
    fn settings_are_masked_by_name_and_by_shape() {
        let mut v = serde_json::json!({
            "security": {"private_key": "MIIB", "private_key_file": "/etc/k.pem", "jwt_secret": "s",
                          "api_tokens": ["t1", "t2"], "jwt_public_key": "PUBLIC", "allow_published_key": true},
            "sinks": {"webhooks": [{"url": "https://u:pw@h/x?token=1", "secret": "w"}],
                      "callback_urls": ["https://h/cb?key=k"], "callback_secret": "c"},
            "cluster": {"redis": "redis://:pw@h:1/0", "secret": "n", "node_id": "a"},
            "future": {"some_url": "wss://x:y@h/", "db_password": "p"}
        });
        mask_settings(&mut v);
        let text = v.to_string();
        for secret in [
            "MIIB", "\"s\"", "t1", "t2", ":pw@", "token=1", "\"w\"", "key=k", "\"c\"", "\"n\"",
            "x:y", "\"p\"",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        for kept in [
            "/etc/k.pem",
            "PUBLIC",
            "\"a\"",
            "https://u:***@h/x?token=***",
        ] {
            assert!(text.contains(kept), "{kept} missing from {text}");
        }
    }
}
