//! From tokens to a checked program: a recursive-descent parser over
//! JavaScript's precedence levels that builds the node arena bottom-up,
//! giving each node its possible types as it is made. Methods are resolved,
//! arities and receivers checked, regexes compiled, and every limit
//! (nodes, nesting, regexes) enforced here, once per condition.

use regex::Regex;

use crate::lex::{Tok, Token};
use crate::{CompileError, Limits};

pub(crate) type Id = u16;

/// The client's fields a condition reads (mpush's five).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Var {
    UserId,
    Tags,
    ClientVersion,
    OsName,
    OsVersion,
}

pub(crate) const VARS: [(&str, Var); 5] = [
    ("userId", Var::UserId),
    ("tags", Var::Tags),
    ("clientVersion", Var::ClientVersion),
    ("osName", Var::OsName),
    ("osVersion", Var::OsVersion),
];

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Lit {
    Undef,
    Null,
    Bool(bool),
    Num(f64),
    Str(Box<str>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnOp {
    Not,
    Neg,
    Pos,
    TypeOf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    StrictEq,
    StrictNe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    IndexOf,
    LastIndexOf,
    Includes,
    StartsWith,
    EndsWith,
    Substring,
    Substr,
    Slice,
    CharAt,
    CharCodeAt,
    At,
    ToLowerCase,
    ToUpperCase,
    Trim,
    TrimStart,
    TrimEnd,
    Split,
    Match,
    Search,
    ToString,
    Test,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    ParseInt,
    ParseFloat,
    Number,
    String,
    Boolean,
    IsNaN,
    IsFinite,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Lit(Lit),
    Var(Var),
    Regex(u8),
    Unary(UnOp, Id),
    Binary(BinOp, Id, Id),
    /// `a && b && ...` (and) or `a || b || ...`, flattened: a long chain
    /// does not make the tree deep.
    Logic {
        and: bool,
        items: Box<[Id]>,
    },
    Cond(Id, Id, Id),
    Length(Id),
    Index(Id, Id),
    Method {
        recv: Id,
        m: Method,
        args: Box<[Id]>,
    },
    Call {
        f: Func,
        args: Box<[Id]>,
    },
}

/// Possible types of a node's value, as a bit set.
pub(crate) mod ty {
    pub const UNDEF: u8 = 1;
    pub const NULL: u8 = 2;
    pub const BOOL: u8 = 4;
    pub const NUM: u8 = 8;
    pub const STR: u8 = 16;
    pub const ARR: u8 = 32;
    pub const RE: u8 = 64;
    /// Types that can be falsy (`&&` may return them).
    pub const FALSY: u8 = UNDEF | NULL | BOOL | NUM | STR;
    /// Types that can be truthy (`||` may return them).
    pub const TRUTHY: u8 = BOOL | NUM | STR | ARR | RE;

    pub fn describe(t: u8) -> String {
        let names = [
            (UNDEF, "undefined"),
            (NULL, "null"),
            (BOOL, "a boolean"),
            (NUM, "a number"),
            (STR, "a string"),
            (ARR, "an array"),
            (RE, "a regex"),
        ];
        let v: Vec<&str> = names
            .iter()
            .filter(|(b, _)| t & b != 0)
            .map(|(_, n)| *n)
            .collect();
        v.join(" or ")
    }
}

/// A checked program: nodes in creation order (children before parents),
/// the root last.
#[derive(Debug)]
pub(crate) struct Program {
    pub nodes: Vec<Node>,
    /// Each with its `g` flag (`match` then returns every match).
    pub regexes: Vec<(Regex, bool)>,
    pub root: Id,
}

struct Parser<'l> {
    toks: Vec<Token>,
    pos: usize,
    limits: &'l Limits,
    nodes: Vec<Node>,
    types: Vec<u8>,
    heights: Vec<u16>,
    regexes: Vec<(Regex, bool)>,
}

pub(crate) fn parse(toks: Vec<Token>, limits: &Limits) -> Result<Program, CompileError> {
    let mut p = Parser {
        toks,
        pos: 0,
        limits,
        nodes: Vec::new(),
        types: Vec::new(),
        heights: Vec::new(),
        regexes: Vec::new(),
    };
    if matches!(p.peek(), Tok::End) {
        return Err(CompileError::at(0, "the condition is empty"));
    }
    let root = p.expr(0)?;
    let t = p.next();
    match t.tok {
        Tok::End => {}
        Tok::Punct(",") => {
            return Err(CompileError::at(
                t.at,
                "`,` outside a call's arguments is not supported",
            ));
        }
        _ => return Err(unexpected(&t, "the end of the condition")),
    }
    let rt = p.types[usize::from(root)];
    if rt & ty::BOOL == 0 {
        return Err(CompileError::at(
            0,
            format!(
                "the condition is {}, never true or false: compare it (e.g. `osName == \"android\"`, `tags.indexOf(\"vip\") >= 0`)",
                ty::describe(rt)
            ),
        ));
    }
    Ok(Program {
        nodes: p.nodes,
        regexes: p.regexes,
        root,
    })
}

fn unexpected(t: &Token, wanted: &str) -> CompileError {
    if let Tok::Punct(p) = &t.tok
        && let Some(why) = refused_punct(p)
    {
        return CompileError::at(t.at, why);
    }
    let what = match &t.tok {
        Tok::End => "the end".to_owned(),
        Tok::Num(n) => format!("the number {n}"),
        Tok::Str(_) => "a string".to_owned(),
        Tok::Regex { .. } => "a regex".to_owned(),
        Tok::Name(n) => format!("`{n}`"),
        Tok::Punct(p) => format!("`{p}`"),
    };
    CompileError::at(t.at, format!("expected {wanted}, found {what}"))
}

/// Operators JavaScript has that a condition does not, and why.
fn refused_punct(p: &str) -> Option<&'static str> {
    Some(match p {
        "=" | "+=" | "-=" | "++" | "--" => {
            "assignments are not supported: a condition is one expression"
        }
        ";" => "statements are not supported: a condition is one expression",
        "=>" | "{" | "}" => "functions and objects are not supported",
        "&" | "|" | "^" | "~" | "<<" | ">>" | "**" => {
            "bitwise operators and `**` are not supported (for evalexpr's `^`, there is no equivalent)"
        }
        "??" | "?." => "`??` and `?.` are not supported: use `x != null && ...`",
        _ => return None,
    })
}

impl Parser<'_> {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos.min(self.toks.len() - 1)].tok
    }

    fn at(&self) -> usize {
        self.toks[self.pos.min(self.toks.len() - 1)].at
    }

    fn next(&mut self) -> Token {
        let t = self.toks[self.pos.min(self.toks.len() - 1)].clone();
        self.pos += 1;
        t
    }

    fn eat(&mut self, p: &str) -> bool {
        if matches!(self.peek(), Tok::Punct(q) if *q == p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, p: &str) -> Result<(), CompileError> {
        if self.eat(p) {
            Ok(())
        } else {
            let t = self.next();
            Err(unexpected(&t, &format!("`{p}`")))
        }
    }

    fn deeper(&self, depth: usize) -> Result<usize, CompileError> {
        if depth >= self.limits.max_depth {
            return Err(CompileError::at(
                self.at(),
                format!(
                    "the condition nests deeper than {} levels",
                    self.limits.max_depth
                ),
            ));
        }
        Ok(depth + 1)
    }

    /// Adds a node with its type; children must exist. Checks the node
    /// count and the tree's height.
    fn push(&mut self, node: Node, t: u8, at: usize) -> Result<Id, CompileError> {
        if self.nodes.len() >= self.limits.max_nodes {
            return Err(CompileError::at(
                at,
                format!(
                    "the condition has more than {} parts",
                    self.limits.max_nodes
                ),
            ));
        }
        let h = 1 + children(&node)
            .map(|c| self.heights[usize::from(c)])
            .max()
            .unwrap_or(0);
        if usize::from(h) > self.limits.max_depth {
            return Err(CompileError::at(
                at,
                format!(
                    "the condition nests deeper than {} levels",
                    self.limits.max_depth
                ),
            ));
        }
        let id =
            Id::try_from(self.nodes.len()).map_err(|_| CompileError::at(at, "too many parts"))?;
        self.nodes.push(node);
        self.types.push(t);
        self.heights.push(h);
        Ok(id)
    }

    fn ty(&self, id: Id) -> u8 {
        self.types[usize::from(id)]
    }

    fn expr(&mut self, depth: usize) -> Result<Id, CompileError> {
        let depth = self.deeper(depth)?;
        let at = self.at();
        let c = self.logic(false, depth)?;
        if !self.eat("?") {
            return Ok(c);
        }
        let a = self.expr(depth)?;
        self.expect(":")?;
        let b = self.expr(depth)?;
        self.no_regex_value(c, at)?;
        let t = self.ty(a) | self.ty(b);
        self.push(Node::Cond(c, a, b), t, at)
    }

    /// `||` chains (and = false) over `&&` chains (and = true) over equality.
    fn logic(&mut self, and: bool, depth: usize) -> Result<Id, CompileError> {
        let at = self.at();
        let op = if and { "&&" } else { "||" };
        let first = if and {
            self.binary(0, depth)?
        } else {
            self.logic(true, depth)?
        };
        if !matches!(self.peek(), Tok::Punct(p) if *p == op) {
            return Ok(first);
        }
        let mut items = vec![first];
        while self.eat(op) {
            items.push(if and {
                self.binary(0, depth)?
            } else {
                self.logic(true, depth)?
            });
        }
        let mut t = 0;
        for (k, i) in items.iter().enumerate() {
            self.no_regex_value(*i, at)?;
            let it = self.ty(*i);
            // All but the last are returned only when they decide.
            t |= if k + 1 == items.len() {
                it
            } else if and {
                it & ty::FALSY
            } else {
                it & ty::TRUTHY
            };
        }
        self.push(
            Node::Logic {
                and,
                items: items.into(),
            },
            t,
            at,
        )
    }

    /// Binary operators by level: 0 equality, 1 relational, 2 additive, 3
    /// multiplicative, then unary.
    fn binary(&mut self, level: u8, depth: usize) -> Result<Id, CompileError> {
        const LEVELS: [&[(&str, BinOp)]; 4] = [
            &[
                ("===", BinOp::StrictEq),
                ("!==", BinOp::StrictNe),
                ("==", BinOp::Eq),
                ("!=", BinOp::Ne),
            ],
            &[
                ("<=", BinOp::Le),
                (">=", BinOp::Ge),
                ("<", BinOp::Lt),
                (">", BinOp::Gt),
            ],
            &[("+", BinOp::Add), ("-", BinOp::Sub)],
            &[("*", BinOp::Mul), ("/", BinOp::Div), ("%", BinOp::Rem)],
        ];
        let sub = |p: &mut Self| {
            if level == 3 {
                p.unary(depth)
            } else {
                p.binary(level + 1, depth)
            }
        };
        let mut left = sub(self)?;
        loop {
            if let Tok::Name(n) = self.peek()
                && matches!(n.as_str(), "in" | "instanceof")
            {
                return Err(CompileError::at(
                    self.at(),
                    format!("`{n}` is not supported"),
                ));
            }
            let at = self.at();
            let Some(op) = LEVELS[usize::from(level)]
                .iter()
                .find(|(p, _)| matches!(self.peek(), Tok::Punct(q) if q == p))
                .map(|(_, op)| *op)
            else {
                return Ok(left);
            };
            self.pos += 1;
            let right = sub(self)?;
            self.no_regex_value(left, at)?;
            self.no_regex_value(right, at)?;
            let t = match op {
                BinOp::Add => {
                    let (a, b) = (self.ty(left), self.ty(right));
                    let mut t = 0;
                    if (a | b) & (ty::STR | ty::ARR) != 0 {
                        t |= ty::STR;
                    }
                    if a & !(ty::STR | ty::ARR) != 0 && b & !(ty::STR | ty::ARR) != 0 {
                        t |= ty::NUM;
                    }
                    t
                }
                BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem => ty::NUM,
                _ => ty::BOOL,
            };
            left = self.push(Node::Binary(op, left, right), t, at)?;
        }
    }

    fn unary(&mut self, depth: usize) -> Result<Id, CompileError> {
        let at = self.at();
        let op = match self.peek() {
            Tok::Punct("!") => Some(UnOp::Not),
            Tok::Punct("-") => Some(UnOp::Neg),
            Tok::Punct("+") => Some(UnOp::Pos),
            Tok::Name(n) if n == "typeof" => Some(UnOp::TypeOf),
            Tok::Name(n) if matches!(n.as_str(), "void" | "delete" | "await" | "new") => {
                return Err(CompileError::at(
                    at,
                    if n == "new" {
                        "`new` is not supported (for a regex, write a /literal/)".to_owned()
                    } else {
                        format!("`{n}` is not supported")
                    },
                ));
            }
            _ => None,
        };
        let Some(op) = op else {
            return self.postfix(depth);
        };
        self.pos += 1;
        let depth = self.deeper(depth)?;
        let x = self.unary(depth)?;
        if op != UnOp::TypeOf {
            self.no_regex_value(x, at)?;
        }
        let t = match op {
            UnOp::Not => ty::BOOL,
            UnOp::Neg | UnOp::Pos => ty::NUM,
            UnOp::TypeOf => ty::STR,
        };
        self.push(Node::Unary(op, x), t, at)
    }

    fn postfix(&mut self, depth: usize) -> Result<Id, CompileError> {
        let mut x = self.primary(depth)?;
        loop {
            let at = self.at();
            if self.eat(".") {
                let t = self.next();
                let Tok::Name(name) = t.tok else {
                    return Err(unexpected(&t, "a property or method name"));
                };
                if name == "length" && !matches!(self.peek(), Tok::Punct("(")) {
                    let rt = self.ty(x);
                    if rt & (ty::STR | ty::ARR) == 0 {
                        return Err(CompileError::at(
                            at,
                            format!(
                                "`.length` of {}: only strings and arrays have one",
                                ty::describe(rt)
                            ),
                        ));
                    }
                    x = self.push(Node::Length(x), ty::NUM, at)?;
                    continue;
                }
                if !matches!(self.peek(), Tok::Punct("(")) {
                    return Err(CompileError::at(
                        t.at,
                        format!("unknown property `{name}` (strings and arrays have `length`)"),
                    ));
                }
                let args = self.args(depth)?;
                x = self.method(x, &name, args, t.at)?;
            } else if self.eat("[") {
                let d = self.deeper(depth)?;
                let i = self.expr(d)?;
                self.expect("]")?;
                let rt = self.ty(x);
                if rt & (ty::STR | ty::ARR) == 0 {
                    return Err(CompileError::at(
                        at,
                        format!(
                            "indexing {}: only strings and arrays can be indexed",
                            ty::describe(rt)
                        ),
                    ));
                }
                self.no_regex_value(i, at)?;
                x = self.push(Node::Index(x, i), ty::STR | ty::UNDEF, at)?;
            } else if matches!(self.peek(), Tok::Punct("(")) {
                return Err(CompileError::at(
                    at,
                    "only named functions and methods can be called",
                ));
            } else {
                return Ok(x);
            }
        }
    }

    fn args(&mut self, depth: usize) -> Result<Vec<Id>, CompileError> {
        self.expect("(")?;
        let depth = self.deeper(depth)?;
        let mut args = Vec::new();
        if self.eat(")") {
            return Ok(args);
        }
        loop {
            args.push(self.expr(depth)?);
            if self.eat(")") {
                return Ok(args);
            }
            self.expect(",")?;
        }
    }

    fn primary(&mut self, depth: usize) -> Result<Id, CompileError> {
        let t = self.next();
        let at = t.at;
        match t.tok {
            Tok::Num(n) => self.push(Node::Lit(Lit::Num(n)), ty::NUM, at),
            Tok::Str(s) => self.push(Node::Lit(Lit::Str(s.into())), ty::STR, at),
            Tok::Regex { pattern, flags } => {
                let r = self.regex(&pattern, &flags, at)?;
                self.push(Node::Regex(r), ty::RE, at)
            }
            Tok::Punct("(") => {
                let d = self.deeper(depth)?;
                let x = self.expr(d)?;
                self.expect(")")?;
                Ok(x)
            }
            Tok::Punct(p) => Err(unexpected(
                &Token {
                    tok: Tok::Punct(p),
                    at,
                },
                "a value",
            )),
            Tok::Name(n) => self.name(&n, at, depth),
            Tok::End => Err(unexpected(&Token { tok: Tok::End, at }, "a value")),
        }
    }

    fn name(&mut self, n: &str, at: usize, depth: usize) -> Result<Id, CompileError> {
        let lit = match n {
            "true" => Some((Lit::Bool(true), ty::BOOL)),
            "false" => Some((Lit::Bool(false), ty::BOOL)),
            "null" => Some((Lit::Null, ty::NULL)),
            "undefined" => Some((Lit::Undef, ty::UNDEF)),
            "NaN" => Some((Lit::Num(f64::NAN), ty::NUM)),
            "Infinity" => Some((Lit::Num(f64::INFINITY), ty::NUM)),
            _ => None,
        };
        if let Some((l, t)) = lit {
            return self.push(Node::Lit(l), t, at);
        }
        if let Some((_, v)) = VARS.iter().find(|(name, _)| *name == n) {
            // A field the client did not send is null, as in mpush.
            return self.push(Node::Var(*v), ty::STR | ty::NULL, at);
        }
        if matches!(self.peek(), Tok::Punct("(")) {
            let args = self.args(depth)?;
            return self.call(n, args, at);
        }
        Err(CompileError::at(
            at,
            match n {
                "var" | "let" | "const" | "function" | "return" | "if" | "for" | "while" => {
                    format!("`{n}` is not supported: a condition is one expression")
                }
                _ => format!(
                    "unknown name `{n}`: a condition reads userId, tags, clientVersion, osName and osVersion"
                ),
            },
        ))
    }

    /// Named functions: JavaScript's global conversions and evalexpr's
    /// string functions (the server's earlier syntax).
    fn call(&mut self, n: &str, args: Vec<Id>, at: usize) -> Result<Id, CompileError> {
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

    fn method(
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
    fn no_regex_value(&self, id: Id, at: usize) -> Result<(), CompileError> {
        if self.ty(id) & ty::RE != 0 {
            return Err(CompileError::at(
                at,
                "a regex is used as /re/.test(x), x.match(/re/) or x.search(/re/)",
            ));
        }
        Ok(())
    }

    fn regex(&mut self, pattern: &str, flags: &str, at: usize) -> Result<u8, CompileError> {
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

/// A node's children.
pub(crate) fn children(n: &Node) -> impl Iterator<Item = Id> + '_ {
    let (fixed, list): ([Option<Id>; 3], &[Id]) = match n {
        Node::Lit(_) | Node::Var(_) | Node::Regex(_) => ([None, None, None], &[]),
        Node::Unary(_, a) | Node::Length(a) => ([Some(*a), None, None], &[]),
        Node::Binary(_, a, b) | Node::Index(a, b) => ([Some(*a), Some(*b), None], &[]),
        Node::Cond(a, b, c) => ([Some(*a), Some(*b), Some(*c)], &[]),
        Node::Logic { items, .. } => ([None, None, None], items),
        Node::Method { recv, args, .. } => ([Some(*recv), None, None], args),
        Node::Call { args, .. } => ([None, None, None], args),
    };
    fixed.into_iter().flatten().chain(list.iter().copied())
}
