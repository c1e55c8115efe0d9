//! A connection's tags: what its client sent at bind (or its token
//! granted), in mpush's form, a comma-joined string. Kept as that string
//! (broadcast conditions read `tags` as one, as in mpush), with the two
//! rules that read it named here rather than spread as string operations.

use std::sync::Arc;

/// A connection's tags. Cloning shares them; the empty set allocates
/// nothing (most connections have none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tags(Option<Arc<str>>);

impl Tags {
    /// From the bind's (or the token's) string, as sent.
    pub fn new(joined: &str) -> Self {
        Self((!joined.is_empty()).then(|| joined.into()))
    }

    /// The string as the client sent it (for conditions and the API).
    pub fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }

    /// mpush's `TagsCondition`: the connection is selected when any of
    /// `wanted` occurs in its tags' string (a substring match, as mpush
    /// 0.8.1 does, so that deployed backends select the same devices).
    pub fn match_any(&self, wanted: &[String]) -> bool {
        let have = self.as_str();
        !have.is_empty() && wanted.iter().any(|w| have.contains(w.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_read_as_mpush_reads_them() {
        let t = Tags::new("vip, beta,,android-12");
        assert_eq!(t.as_str(), "vip, beta,,android-12");
        // mpush's rule: a substring of the string.
        assert!(t.match_any(&["beta".into()]));
        assert!(t.match_any(&["android".into()]));
        assert!(!t.match_any(&["ios".into()]));
        let none = Tags::default();
        assert_eq!(none.as_str(), "");
        assert!(!none.match_any(&["vip".into()]));
        assert_eq!(Tags::new(""), none);
    }
}
