//! Broadcast filters: tags (any-substring match against the client's tags, as
//! mpush) and a condition expression over the client's fields.
//!
//! Conditions use the `evalexpr` language, close to the JavaScript mpush
//! accepted for simple cases: `osName == "android" && clientVersion != "1.0"`,
//! `str::regex_matches(tags, "vip")` (evalexpr's regex support: the `regex` crate, linear
//! time). Variables: `userId`, `tags`,
//! `clientVersion`, `osName`, `osVersion`.

use evalexpr::{ContextWithMutableVariables, HashMapContext, Node, Value};

use crate::route::ConnHandle;

/// Longest condition accepted, and deepest nesting (parentheses, plus runs
/// of prefix operators): the parser and evaluator recurse, and a condition
/// from a caller or another node must not be able to exhaust a stack.
pub const MAX_CONDITION_LEN: usize = 1024;
pub const MAX_CONDITION_DEPTH: usize = 16;

/// Checks a condition's size and nesting before it is parsed.
pub fn check_condition(c: &str) -> Result<(), String> {
    if c.len() > MAX_CONDITION_LEN {
        return Err(format!(
            "condition is {} bytes; at most {MAX_CONDITION_LEN}",
            c.len()
        ));
    }
    let (mut depth, mut max, mut run) = (0usize, 0usize, 0usize);
    for ch in c.chars() {
        match ch {
            '(' => {
                depth += 1;
                run = 0;
            }
            ')' => {
                depth = depth.saturating_sub(1);
                run = 0;
            }
            '!' | '-' => run += 1,
            ch if ch.is_whitespace() => {}
            _ => run = 0,
        }
        max = max.max(depth + run);
    }
    if max > MAX_CONDITION_DEPTH {
        return Err(format!(
            "condition nests {max} deep; at most {MAX_CONDITION_DEPTH}"
        ));
    }
    Ok(())
}

#[derive(Debug)]
pub struct Filter {
    pub tags: Vec<String>,
    pub condition: Option<Node>,
    pub client_type: Option<i32>,
}

impl Filter {
    /// Parses the condition once and tries it on empty fields: a syntax error
    /// or a non-boolean result is the caller's 400.
    pub fn new(
        tags: Vec<String>,
        condition: Option<&str>,
        client_type: Option<i32>,
    ) -> Result<Self, String> {
        let condition = match condition.filter(|c| !c.trim().is_empty()) {
            Some(c) => {
                check_condition(c)?;
                let node =
                    evalexpr::build_operator_tree(c).map_err(|e| format!("condition: {e}"))?;
                match node.eval_with_context(&context("", "", "", "", "")) {
                    Ok(Value::Boolean(_)) => {}
                    Ok(other) => {
                        return Err(format!("condition must be true or false, not `{other}`"));
                    }
                    Err(e) => return Err(format!("condition: {e}")),
                }
                Some(node)
            }
            None => None,
        };
        Ok(Self {
            tags,
            condition,
            client_type,
        })
    }

    pub fn matches(&self, user_id: &str, conn: &ConnHandle) -> bool {
        let info = &conn.info;
        if self.client_type.is_some_and(|ct| ct != info.client_type) {
            return false;
        }
        if self.tags.is_empty() && self.condition.is_none() {
            return true;
        }
        let tags = info.tags.read().clone();
        if !self.tags.is_empty() && !self.tags.iter().any(|t| tags.contains(t.as_str())) {
            return false;
        }
        let Some(cond) = &self.condition else {
            return true;
        };
        matches!(
            cond.eval_with_context(&context(
                user_id,
                &tags,
                info.client_version(),
                info.os_name(),
                info.os_version(),
            )),
            Ok(Value::Boolean(true))
        )
    }
}

fn context(
    user_id: &str,
    tags: &str,
    client_version: &str,
    os_name: &str,
    os_version: &str,
) -> HashMapContext {
    let mut ctx = HashMapContext::new();
    for (k, v) in [
        ("userId", user_id),
        ("tags", tags),
        ("clientVersion", client_version),
        ("osName", os_name),
        ("osVersion", os_version),
    ] {
        // Setting a string variable cannot fail.
        let _ = ctx.set_value(k.into(), Value::String(v.into()));
    }
    ctx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_regex_condition_works() {
        let f = Filter::new(
            vec![],
            Some(r#"osName == "android" && str::regex_matches(tags, "vip")"#),
            None,
        )
        .expect("the README's example parses");
        let cond = f.condition.expect("a condition");
        let eval = |tags: &str, os: &str| {
            cond.eval_with_context(&context("u", tags, "1.0", os, "14"))
                .expect("evaluates")
        };
        assert_eq!(eval("beta,vip", "android"), Value::Boolean(true));
        assert_eq!(eval("beta", "android"), Value::Boolean(false));
        assert_eq!(eval("vip", "ios"), Value::Boolean(false));
    }

    #[test]
    fn deep_and_long_conditions_are_refused_before_parsing() {
        let deep = format!("{}true{}", "(".repeat(200_000), ")".repeat(200_000));
        assert!(Filter::new(vec![], Some(&deep), None).is_err());
        let nested = format!("{}true{}", "(".repeat(17), ")".repeat(17));
        assert!(Filter::new(vec![], Some(&nested), None).is_err());
        let nots = format!("{}true", "!".repeat(40));
        assert!(Filter::new(vec![], Some(&nots), None).is_err());
        let ok = format!("{}true{}", "(".repeat(8), ")".repeat(8));
        assert!(Filter::new(vec![], Some(&ok), None).is_ok());
        assert!(
            Filter::new(
                vec![],
                Some(r#"osName == "android" && !(tags == "x")"#),
                None
            )
            .is_ok()
        );
    }
}
