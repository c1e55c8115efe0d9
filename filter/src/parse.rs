//! From tokens to a checked program: a recursive-descent parser over
//! JavaScript's precedence levels that builds the node arena bottom-up,
//! giving each node its possible types as it is made. Methods are resolved,
//! arities and receivers checked, regexes compiled, and every limit
//! (nodes, nesting, regexes) enforced here, once per condition.

mod resolve;

use regex::Regex;

use crate::ast::{BinOp, Id, Lit, Node, Program, UnOp, VARS, children, ty};
use crate::lex::{Tok, Token};
use crate::{CompileError, Limits};

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
}
