//! Names to nodes: the functions, methods and regexes a condition may use,
//! with their arities and receivers checked, and the forms it may not,
//! refused with what to write instead.

use super::Parser;
use crate::CompileError;
use crate::ast::{Func, Id, Lit, Method, Node, ty};

impl Parser<'_> {
    /// Named functions: JavaScript's global conversions and evalexpr's
    /// string functions (the server's earlier syntax).
    pub(super) fn call(&mut self, n: &str, args: Vec<Id>, at: usize) -> Result<Id, CompileError> {
        let arity = |lo: usize, hi: usize| -> Result<(), CompileError> {
            if (lo..=hi).contains(&args.len()) {
                Ok(())
            } else if lo == hi {
                Err(CompileError::at(
                    at,
                    format!("`{n}` takes {lo} argument(s)"),
                ))
            } else {
                Err(CompileError::at(
                    at,
                    format!("`{n}` takes {lo} to {hi} arguments"),
                ))
            }
        };
        let (f, t, lo, hi) = match n {
            "parseInt" => (Func::ParseInt, ty::NUM, 1, 2),
            "parseFloat" => (Func::ParseFloat, ty::NUM, 1, 1),
            "Number" => (Func::Number, ty::NUM, 0, 1),
            "String" | "str::from" => (Func::String, ty::STR, 0, 1),
            "Boolean" => (Func::Boolean, ty::BOOL, 0, 1),
            "isNaN" => (Func::IsNaN, ty::BOOL, 1, 1),
            "isFinite" => (Func::IsFinite, ty::BOOL, 1, 1),
            "str::regex_matches" => {
                arity(2, 2)?;
                let pattern = match &self.nodes[usize::from(args[1])] {
                    Node::Lit(Lit::Str(p)) => p.clone(),
                    _ => {
                        return Err(CompileError::at(
                            at,
                            "str::regex_matches: the pattern must be a string literal (or write /pattern/.test(x))",
                        ));
                    }
                };
                let r = self.regex(&pattern, "", at)?;
                let re = self.push(Node::Regex(r), ty::RE, at)?;
                return self.method(re, "test", vec![args[0]], at);
            }
            "str::to_lowercase" | "str::to_uppercase" | "str::trim" | "len" => {
                arity(1, 1)?;
                let m = match n {
                    "str::to_lowercase" => "toLowerCase",
                    "str::to_uppercase" => "toUpperCase",
                    "str::trim" => "trim",
                    _ => {
                        let x = args[0];
                        if self.ty(x) & (ty::STR | ty::ARR) == 0 {
                            return Err(CompileError::at(at, "len: of a string"));
                        }
                        return self.push(Node::Length(x), ty::NUM, at);
                    }
                };
                return self.method(args[0], m, vec![], at);
            }
            "str::substring" => {
                arity(2, 3)?;
                return self.method(args[0], "substring", args[1..].to_vec(), at);
            }
            "str::regex_replace" => {
                return Err(CompileError::at(
                    at,
                    "str::regex_replace is not supported: its output can grow with every match",
                ));
            }
            "if" => {
                return Err(CompileError::at(
                    at,
                    "if(c, a, b) is not supported: write c ? a : b",
                ));
            }
            "contains" | "contains_any" => {
                return Err(CompileError::at(
                    at,
                    format!("`{n}` is not supported: write x.includes(y)"),
                ));
            }
            "eval" | "Function" | "RegExp" | "require" => {
                return Err(CompileError::at(
                    at,
                    format!("`{n}` is not supported (for a regex, write a /literal/)"),
                ));
            }
            _ => {
                return Err(CompileError::at(
                    at,
                    format!(
                        "unknown function `{n}`: parseInt, parseFloat, Number, String, Boolean, isNaN, isFinite (and evalexpr's str::regex_matches, str::to_lowercase, str::to_uppercase, str::trim, str::substring, str::from, len)"
                    ),
                ));
            }
        };
        arity(lo, hi)?;
        for a in &args {
            self.no_regex_value(*a, at)?;
        }
        self.push(
            Node::Call {
                f,
                args: args.into(),
            },
            t,
            at,
        )
    }

    pub(super) fn method(
        &mut self,
        recv: Id,
        name: &str,
        args: Vec<Id>,
        at: usize,
    ) -> Result<Id, CompileError> {
        use Method as M;
        const S: u8 = ty::STR;
        const A: u8 = ty::ARR;
        let (m, on, lo, hi, t) = match name {
            "indexOf" => (M::IndexOf, S | A, 1, 2, ty::NUM),
            "lastIndexOf" => (M::LastIndexOf, S | A, 1, 2, ty::NUM),
            "includes" => (M::Includes, S | A, 1, 2, ty::BOOL),
            "startsWith" => (M::StartsWith, S, 1, 2, ty::BOOL),
            "endsWith" => (M::EndsWith, S, 1, 2, ty::BOOL),
            "substring" => (M::Substring, S, 1, 2, ty::STR),
            "substr" => (M::Substr, S, 1, 2, ty::STR),
            "slice" => (M::Slice, S, 0, 2, ty::STR),
            "charAt" => (M::CharAt, S, 0, 1, ty::STR),
            "charCodeAt" => (M::CharCodeAt, S, 0, 1, ty::NUM),
            "at" => (M::At, S | A, 1, 1, ty::STR | ty::UNDEF),
            "toLowerCase" | "toLocaleLowerCase" => (M::ToLowerCase, S, 0, 0, ty::STR),
            "toUpperCase" | "toLocaleUpperCase" => (M::ToUpperCase, S, 0, 0, ty::STR),
            "trim" => (M::Trim, S, 0, 0, ty::STR),
            "trimStart" | "trimLeft" => (M::TrimStart, S, 0, 0, ty::STR),
            "trimEnd" | "trimRight" => (M::TrimEnd, S, 0, 0, ty::STR),
            "split" => (M::Split, S, 0, 2, ty::ARR),
            "match" => (M::Match, S, 1, 1, ty::ARR | ty::NULL),
            "search" => (M::Search, S, 1, 1, ty::NUM),
            "toString" => (M::ToString, S | A | ty::NUM | ty::BOOL, 0, 0, ty::STR),
            "test" => (M::Test, ty::RE, 0, 1, ty::BOOL),
            "repeat" | "padStart" | "padEnd" | "replace" | "replaceAll" | "concat" | "join"
            | "normalize" | "fill" | "map" | "filter" | "reduce" => {
                return Err(CompileError::at(
                    at,
                    format!(
                        "`{name}` is not supported: a condition's functions never make more than their input (it is evaluated for every connection within a fixed budget)"
                    ),
                ));
            }
            "exec" => {
                return Err(CompileError::at(
                    at,
                    "`exec` is not supported: write /re/.test(x) or x.match(/re/)",
                ));
            }
            _ => {
                return Err(CompileError::at(
                    at,
                    format!(
                        "unknown method `{name}`: strings have indexOf, lastIndexOf, includes, startsWith, endsWith, substring, substr, slice, charAt, charCodeAt, at, toLowerCase, toUpperCase, trim, trimStart, trimEnd, split, match, search, toString and length; arrays (from split and match) indexOf, lastIndexOf, includes, at and length; regexes test"
                    ),
                ));
            }
        };
        let rt = self.ty(recv);
        if rt & on == 0 {
            return Err(CompileError::at(
                at,
                format!("`{name}` is not a method of {}", ty::describe(rt)),
            ));
        }
        if !(lo..=hi).contains(&args.len()) {
            return Err(CompileError::at(
                at,
                if lo == hi {
                    format!("`{name}` takes {lo} argument(s)")
                } else {
                    format!("`{name}` takes {lo} to {hi} arguments")
                },
            ));
        }
        let mut args = args;
        if matches!(m, M::Match | M::Search) {
            // JavaScript makes a regex of a string argument: here it is made
            // once, now, so the argument must be a literal.
            let a = args[0];
            match &self.nodes[usize::from(a)] {
                Node::Regex(_) => {}
                Node::Lit(Lit::Str(p)) => {
                    let p = p.clone();
                    let r = self.regex(&p, "", at)?;
                    args[0] = self.push(Node::Regex(r), ty::RE, at)?;
                }
                _ => {
                    return Err(CompileError::at(
                        at,
                        format!("`{name}` takes a regex literal, e.g. x.{name}(/vip/)"),
                    ));
                }
            }
        } else {
            for a in &args {
                self.no_regex_value(*a, at)?;
            }
        }
        if m == M::Test {
            // `/re/.test()` reads "undefined" in JavaScript; keep it simple.
            if args.is_empty() {
                return Err(CompileError::at(at, "`test` takes the string to test"));
            }
        }
        self.push(
            Node::Method {
                recv,
                m,
                args: args.into(),
            },
            t,
            at,
        )
    }

    /// A regex value is only a method's receiver (`test`) or argument
    /// (`match`, `search`): anywhere else it would be converted to text.
    pub(super) fn no_regex_value(&self, id: Id, at: usize) -> Result<(), CompileError> {
        if self.ty(id) & ty::RE != 0 {
            return Err(CompileError::at(
                at,
                "a regex is used as /re/.test(x), x.match(/re/) or x.search(/re/)",
            ));
        }
        Ok(())
    }

    pub(super) fn regex(
        &mut self,
        pattern: &str,
        flags: &str,
        at: usize,
    ) -> Result<u8, CompileError> {
        if self.regexes.len() >= self.limits.max_regexes {
            return Err(CompileError::at(
                at,
                format!(
                    "more than {} regexes in one condition",
                    self.limits.max_regexes
                ),
            ));
        }
        if pattern.len() > self.limits.max_regex_len {
            return Err(CompileError::at(
                at,
                format!("a regex longer than {} bytes", self.limits.max_regex_len),
            ));
        }
        let mut b = regex::RegexBuilder::new(pattern);
        let mut global = false;
        for f in flags.chars() {
            match f {
                'i' => {
                    b.case_insensitive(true);
                }
                'm' => {
                    b.multi_line(true);
                }
                's' => {
                    b.dot_matches_new_line(true);
                }
                'g' => global = true,
                // Unicode is always on; indices are not reported.
                'u' | 'd' => {}
                other => {
                    return Err(CompileError::at(
                        at,
                        format!("regex flag `{other}` is not supported (i, m, s, g, u are)"),
                    ));
                }
            }
        }
        let re = b
            .size_limit(self.limits.regex_size)
            .dfa_size_limit(self.limits.regex_size)
            .nest_limit(u32::try_from(self.limits.max_depth).unwrap_or(32))
            .build()
            .map_err(|e| CompileError::at(at, regex_error(&e)))?;
        let id = u8::try_from(self.regexes.len())
            .map_err(|_| CompileError::at(at, "too many regexes"))?;
        self.regexes.push((re, global));
        Ok(id)
    }
}

fn regex_error(e: &regex::Error) -> String {
    match e {
        regex::Error::CompiledTooBig(limit) => {
            format!("a regex that compiles to more than {limit} bytes")
        }
        regex::Error::Syntax(s) => {
            let first = s.lines().last().unwrap_or(s).trim();
            if s.contains("look-around") || s.contains("backreference") {
                "regex lookaround and backreferences are not supported (matching stays linear in time)".to_owned()
            } else {
                format!("regex: {first}")
            }
        }
        other => format!("regex: {other}"),
    }
}
