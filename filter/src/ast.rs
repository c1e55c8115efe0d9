//! The checked form of a condition: a node arena (children before
//! parents), each node's possible types, the compiled regexes.

use regex::Regex;

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
