//! Broadcast filters: the client type, tags (any listed tag as a substring
//! of the client's tags, as mpush's `TagsCondition`) and a condition over
//! the client's fields (`mpush-filter`: mpush's JavaScript forms, compiled
//! once per broadcast, evaluated per connection within a fixed budget).

use mpush_filter::{Condition, EvalError, Fields, Resource};
use mpush_protocol::session::ClientType;

use crate::route::ConnHandle;

/// Tags one broadcast may list, and the longest: each is searched for in
/// every connection's tags.
pub const MAX_FILTER_TAGS: usize = 64;
pub const MAX_FILTER_TAG_LEN: usize = 128;

#[derive(Debug)]
pub struct Filter {
    pub tags: Vec<String>,
    pub condition: Option<Condition>,
    pub client_type: Option<ClientType>,
}

/// What evaluating a broadcast's condition came to, over its connections.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FilterStats {
    pub evaluated: u64,
    /// A method of a field the client did not send, and the like: "not
    /// selected", as in mpush.
    pub type_errors: u64,
    /// Stopped by the per-connection budget.
    pub over_work: u64,
    pub over_memory: u64,
}

impl FilterStats {
    /// Counts them (`mpush_broadcast_condition_*`) and reports budget stops.
    pub fn publish(&self, trace_id: &str) {
        if self.evaluated == 0 {
            return;
        }
        metrics::counter!("mpush_broadcast_condition_evaluations_total").increment(self.evaluated);
        for (kind, n) in [
            ("type", self.type_errors),
            ("work", self.over_work),
            ("memory", self.over_memory),
        ] {
            if n > 0 {
                metrics::counter!("mpush_broadcast_condition_errors_total", "kind" => kind)
                    .increment(n);
            }
        }
        if self.over_work + self.over_memory > 0 {
            tracing::warn!(
                trace = trace_id,
                over_work = self.over_work,
                over_memory = self.over_memory,
                evaluated = self.evaluated,
                "broadcast condition over its budget for some connections (not selected)"
            );
        }
    }
}

/// Why a broadcast's audience cannot be used (the caller's 400; the words
/// say what to write instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("tags lists {0} tags; at most {MAX_FILTER_TAGS}")]
    TooManyTags(usize),
    #[error("each tag is 1 to {MAX_FILTER_TAG_LEN} bytes (`{0}`)")]
    BadTag(String),
    #[error("condition: {0}")]
    Condition(String),
}

impl Filter {
    /// Compiles the condition once (never evaluates it): a syntax error,
    /// an unknown name, a result that can never be a boolean or a limit
    /// exceeded is the caller's 400, with what to write instead.
    pub fn new(
        tags: Vec<String>,
        condition: Option<&str>,
        client_type: Option<ClientType>,
    ) -> Result<Self, FilterError> {
        if tags.len() > MAX_FILTER_TAGS {
            return Err(FilterError::TooManyTags(tags.len()));
        }
        if let Some(t) = tags
            .iter()
            .find(|t| t.is_empty() || t.len() > MAX_FILTER_TAG_LEN)
        {
            return Err(FilterError::BadTag(t.chars().take(40).collect()));
        }
        let condition = match condition.filter(|c| !c.trim().is_empty()) {
            Some(c) => {
                Some(Condition::compile(c).map_err(|e| FilterError::Condition(e.to_string()))?)
            }
            None => None,
        };
        Ok(Self {
            tags,
            condition,
            client_type,
        })
    }

    pub fn matches(&self, user_id: &str, conn: &ConnHandle, stats: &mut FilterStats) -> bool {
        let info = &conn.info;
        if self.client_type.is_some_and(|ct| ct != info.client_type) {
            return false;
        }
        if self.tags.is_empty() && self.condition.is_none() {
            return true;
        }
        let tags = info.tags.read().clone();
        if !self.tags.is_empty() && !tags.match_any(&self.tags) {
            return false;
        }
        let Some(cond) = &self.condition else {
            return true;
        };
        stats.evaluated += 1;
        let fields = Fields {
            user_id,
            tags: tags.as_str(),
            client_version: info.client_version(),
            os_name: info.os_name(),
            os_version: info.os_version(),
        };
        match cond.eval(&fields) {
            Ok(selected) => selected,
            Err(e) => {
                match e {
                    EvalError::Budget(Resource::Work) => stats.over_work += 1,
                    EvalError::Budget(Resource::Memory) => stats.over_memory += 1,
                    _ => stats.type_errors += 1,
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_bounded_in_count_and_length() {
        assert!(Filter::new(vec!["t".into(); 65], None, None).is_err());
        assert!(Filter::new(vec!["x".repeat(129)], None, None).is_err());
        assert!(Filter::new(vec![String::new()], None, None).is_err());
        assert!(Filter::new(vec!["vip".into(); 64], None, None).is_ok());
    }

    #[test]
    fn conditions_are_compiled_not_tried() {
        // A substring of a field: a trial run on empty fields would throw.
        assert!(Filter::new(vec![], Some("userId.substring(0, 3) == 'vip'"), None).is_ok());
        let e = Filter::new(vec![], Some("userId"), None)
            .expect_err("not a boolean")
            .to_string();
        assert!(e.contains("never true or false"), "{e}");
        let e = Filter::new(
            vec![],
            Some(r#"str::regex_replace(userId, "", userId) == """#),
            None,
        )
        .expect_err("can grow")
        .to_string();
        assert!(e.contains("grow"), "{e}");
    }
}
