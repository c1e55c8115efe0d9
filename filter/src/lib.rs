//! Broadcast conditions: which connections a broadcast goes to.
//!
//! **What it is:** a small expression language, a subset of JavaScript, over
//! the five fields mpush gives a condition (`userId`, `tags`,
//! `clientVersion`, `osName`, `osVersion`). mpush 0.8.1 evaluated conditions
//! with the JVM's JavaScript engine; the forms its backends write
//! (`tags && tags.indexOf('vip') != -1 && osName == "android"`) mean the same
//! here, with JavaScript's coercions, and the server's earlier evalexpr forms
//! (`str::regex_matches(tags, "vip")`) still work.
//!
//! **What it is not:** a JavaScript engine. A condition is one expression:
//! no statements, assignments, functions, loops or objects, and no function
//! whose output can outgrow its input (`repeat`, `padStart`, `replace`,
//! `join`, ...). It is compiled once per broadcast ([`Condition::compile`]:
//! parsed, type-checked, regexes built under size limits) and then
//! evaluated per connection ([`Condition::eval`]) within a budget of work
//! and memory that a hostile condition cannot exceed ([`Limits`]).
//!
//! ```
//! use mpush_filter::{Condition, Fields};
//!
//! let c = Condition::compile(r#"tags && tags.indexOf('vip') != -1 && osName == "android""#).unwrap();
//! let fields = Fields { user_id: "u1", tags: "beta,vip", client_version: "1.2", os_name: "android", os_version: "14" };
//! assert!(c.eval(&fields).unwrap());
//! assert!(!c.eval(&Fields { tags: "", ..fields }).unwrap()); // no tags: null, as in mpush
//! ```
//!
//! The result is true only when the expression's value is the boolean
//! `true`, as mpush's `(Boolean) engine.eval(...)`; an evaluation that
//! fails (a method called on a missing field, a spent budget) is an
//! [`EvalError`], which a broadcast counts as "not selected", as mpush did.

mod ast;
mod eval;
mod js;
mod lex;
mod parse;

use std::fmt;

/// What a condition may cost. The defaults ([`Limits::DEFAULT`]) are what
/// the server uses; they are far above what real conditions need (the
/// longest fields a server keeps are 4 KiB of tags and 512 bytes of OS name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest condition text, in bytes.
    pub max_len: usize,
    /// Deepest nesting: parentheses, calls, operators inside operators (a
    /// chain of `&&` or `||` counts once).
    pub max_depth: usize,
    /// Most parts (values, operators, calls) in one condition.
    pub max_nodes: usize,
    /// Most regexes in one condition, longest pattern, and the most memory
    /// one regex may compile to (and its lazy DFA may use).
    pub max_regexes: usize,
    pub max_regex_len: usize,
    pub regex_size: usize,
    /// Work one evaluation may do: one unit per part evaluated plus one per
    /// byte scanned (a few per byte for a regex).
    pub max_work: u64,
    /// Bytes one evaluation may allocate (copies of strings, arrays).
    pub max_bytes: usize,
}

impl Limits {
    pub const DEFAULT: Self = Self {
        max_len: 1024,
        max_depth: 32,
        max_nodes: 512,
        max_regexes: 4,
        max_regex_len: 256,
        regex_size: 256 * 1024,
        max_work: 1 << 20,
        max_bytes: 256 * 1024,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A connection's fields, as its client sent them (empty: not sent, which a
/// condition reads as `null`, as mpush did).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fields<'a> {
    pub user_id: &'a str,
    pub tags: &'a str,
    pub client_version: &'a str,
    pub os_name: &'a str,
    pub os_version: &'a str,
}

/// Why a condition was refused: a message for the API caller, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileError {
    pub message: String,
    /// Byte offset in the condition.
    pub at: usize,
}

impl CompileError {
    pub(crate) fn at(at: usize, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            at,
        }
    }
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.message, self.at)
    }
}

impl std::error::Error for CompileError {}

/// Which budget an evaluation spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Work,
    Memory,
}

/// Why one evaluation has no result (the connection is not selected).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// What JavaScript would throw a TypeError for: a method of `null` (a
    /// field the client did not send), a string method of a number.
    #[error("TypeError: {0}")]
    Type(&'static str),
    /// The condition needed more than [`Limits::max_work`] or
    /// [`Limits::max_bytes`] for this connection.
    #[error("over the condition's {0:?} budget")]
    Budget(Resource),
}

/// What one evaluation used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub work: u64,
    pub bytes: usize,
}

/// A compiled condition: cheap to evaluate, safe to share across threads.
#[derive(Debug)]
pub struct Condition {
    program: ast::Program,
    limits: Limits,
}

impl Condition {
    /// Compiles with [`Limits::DEFAULT`].
    pub fn compile(src: &str) -> Result<Self, CompileError> {
        Self::compile_with(src, &Limits::DEFAULT)
    }

    /// Parses and checks `src`: a syntax error, an unknown name or method, a
    /// value that can never be a boolean, or a limit exceeded is refused
    /// with a message that says what to write instead. Never evaluates it.
    pub fn compile_with(src: &str, limits: &Limits) -> Result<Self, CompileError> {
        if src.len() > limits.max_len {
            return Err(CompileError::at(
                limits.max_len,
                format!(
                    "the condition is {} bytes; at most {}",
                    src.len(),
                    limits.max_len
                ),
            ));
        }
        let toks = lex::tokens(src)?;
        let program = parse::parse(toks, limits)?;
        Ok(Self {
            program,
            limits: *limits,
        })
    }

    /// Whether the connection with these fields is selected.
    pub fn eval(&self, fields: &Fields<'_>) -> Result<bool, EvalError> {
        self.eval_metered(fields).0
    }

    /// [`Self::eval`], with what it used.
    pub fn eval_metered(&self, fields: &Fields<'_>) -> (Result<bool, EvalError>, Usage) {
        let mut m = eval::Meter::new(self.limits.max_work, self.limits.max_bytes);
        let r = self
            .program
            .run(fields, &mut m)
            .map(|v| matches!(v, eval::Val::Bool(true)));
        (
            r,
            Usage {
                work: m.work,
                bytes: m.bytes,
            },
        )
    }

    /// The limits it was compiled with.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// How many parts and regexes it has.
    pub fn size(&self) -> (usize, usize) {
        (self.program.nodes.len(), self.program.regexes.len())
    }
}
