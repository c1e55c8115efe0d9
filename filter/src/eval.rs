//! Evaluation of a checked program on one connection's fields.
//!
//! Bounded by construction: each node is evaluated at most once (no loops,
//! no user functions, no shared subtrees), the tree is at most
//! `Limits::max_depth` high, and every operation charges the [`Meter`]
//! before it works: its scan length as work, and the bytes it is about to
//! allocate as memory. Over either budget, evaluation stops with
//! [`EvalError::Budget`]. No operation's output is larger than a fixed
//! factor of its inputs (case mapping at most 3×, concatenation the sum).

use std::borrow::Cow;

mod methods;

use crate::ast::{BinOp, Func, Id, Lit, Node, Program, UnOp, Var};
use crate::js;
use crate::{EvalError, Fields, Resource};
use methods::char_at;

/// A value, as JavaScript has it (for the types a condition can make).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val<'a> {
    Undef,
    Null,
    Bool(bool),
    Num(f64),
    Str(Cow<'a, str>),
    /// From `split` and `match`: strings, and undefined for a group that
    /// did not take part in a match.
    Arr(Vec<Val<'a>>),
    Re(u8),
}

/// What one evaluation may still do.
#[derive(Debug, Clone)]
pub(crate) struct Meter {
    pub work: u64,
    pub bytes: usize,
    max_work: u64,
    max_bytes: usize,
}

impl Meter {
    pub fn new(max_work: u64, max_bytes: usize) -> Self {
        Self {
            work: 0,
            bytes: 0,
            max_work,
            max_bytes,
        }
    }

    fn step(&mut self, n: usize) -> Result<(), EvalError> {
        self.work = self.work.saturating_add(n as u64);
        if self.work > self.max_work {
            return Err(EvalError::Budget(Resource::Work));
        }
        Ok(())
    }

    /// Called before allocating `n` bytes.
    fn alloc(&mut self, n: usize) -> Result<(), EvalError> {
        self.bytes = self.bytes.saturating_add(n);
        if self.bytes > self.max_bytes {
            return Err(EvalError::Budget(Resource::Memory));
        }
        Ok(())
    }
}

const VAL: usize = std::mem::size_of::<Val<'static>>();

fn type_error(what: &'static str) -> EvalError {
    EvalError::Type(what)
}

impl Program {
    pub(crate) fn run<'a>(&'a self, f: &Fields<'a>, m: &mut Meter) -> Result<Val<'a>, EvalError> {
        self.ev(self.root, f, m)
    }

    fn ev<'a>(&'a self, id: Id, f: &Fields<'a>, m: &mut Meter) -> Result<Val<'a>, EvalError> {
        m.step(1)?;
        Ok(match &self.nodes[usize::from(id)] {
            Node::Lit(l) => match l {
                Lit::Undef => Val::Undef,
                Lit::Null => Val::Null,
                Lit::Bool(b) => Val::Bool(*b),
                Lit::Num(n) => Val::Num(*n),
                Lit::Str(s) => Val::Str(Cow::Borrowed(s)),
            },
            Node::Var(v) => {
                let s = match v {
                    Var::UserId => f.user_id,
                    Var::Tags => f.tags,
                    Var::ClientVersion => f.client_version,
                    Var::OsName => f.os_name,
                    Var::OsVersion => f.os_version,
                };
                // mpush reads an empty field as null (its decoder's rule).
                if s.is_empty() {
                    Val::Null
                } else {
                    Val::Str(Cow::Borrowed(s))
                }
            }
            Node::Regex(r) => Val::Re(*r),
            Node::Unary(op, x) => {
                let v = self.ev(*x, f, m)?;
                match op {
                    UnOp::Not => Val::Bool(!truthy(&v)),
                    UnOp::Neg => Val::Num(-to_num(&v, m)?),
                    UnOp::Pos => Val::Num(to_num(&v, m)?),
                    UnOp::TypeOf => Val::Str(Cow::Borrowed(match v {
                        Val::Undef => "undefined",
                        Val::Bool(_) => "boolean",
                        Val::Num(_) => "number",
                        Val::Str(_) => "string",
                        Val::Null | Val::Arr(_) | Val::Re(_) => "object",
                    })),
                }
            }
            Node::Binary(op, a, b) => {
                let a = self.ev(*a, f, m)?;
                let b = self.ev(*b, f, m)?;
                binary(*op, a, b, m)?
            }
            Node::Logic { and, items } => {
                let mut v = Val::Undef;
                for i in items.iter() {
                    v = self.ev(*i, f, m)?;
                    if truthy(&v) != *and {
                        return Ok(v);
                    }
                }
                v
            }
            Node::Cond(c, a, b) => {
                let c = self.ev(*c, f, m)?;
                self.ev(if truthy(&c) { *a } else { *b }, f, m)?
            }
            Node::Length(x) => match self.ev(*x, f, m)? {
                Val::Str(s) => {
                    m.step(s.len())?;
                    Val::Num(js::utf16_len(&s) as f64)
                }
                Val::Arr(v) => Val::Num(v.len() as f64),
                Val::Null | Val::Undef => return Err(type_error("cannot read `length` of null")),
                _ => Val::Undef,
            },
            Node::Index(x, i) => {
                let x = self.ev(*x, f, m)?;
                let i = self.ev(*i, f, m)?;
                let i = to_num(&i, m)?;
                match x {
                    Val::Str(s) => char_at(s, i, m)?.map_or(Val::Undef, Val::Str),
                    Val::Arr(mut v) => {
                        if i >= 0.0 && i.fract() == 0.0 && i < v.len() as f64 {
                            v.swap_remove(i as usize)
                        } else {
                            Val::Undef
                        }
                    }
                    Val::Null | Val::Undef => return Err(type_error("cannot index null")),
                    _ => Val::Undef,
                }
            }
            Node::Method {
                recv,
                m: method,
                args,
            } => {
                let r = self.ev(*recv, f, m)?;
                let mut a = [Val::Undef, Val::Undef];
                for (slot, x) in a.iter_mut().zip(args.iter()) {
                    *slot = self.ev(*x, f, m)?;
                }
                let [a0, a1] = a;
                self.method(*method, r, a0, a1, m)?
            }
            Node::Call { f: func, args } => {
                let mut a = [Val::Undef, Val::Undef];
                for (slot, x) in a.iter_mut().zip(args.iter()) {
                    *slot = self.ev(*x, f, m)?;
                }
                let [a0, a1] = a;
                let given = args.len();
                call(*func, given, a0, a1, m)?
            }
        })
    }
}

fn call<'a>(
    f: Func,
    given: usize,
    a0: Val<'a>,
    a1: Val<'a>,
    m: &mut Meter,
) -> Result<Val<'a>, EvalError> {
    Ok(match f {
        Func::ParseInt => {
            let s = to_str(a0, m)?;
            m.step(s.len())?;
            let radix = opt_num(a1, 0.0, m)?;
            Val::Num(js::parse_int(&s, radix))
        }
        Func::ParseFloat => {
            let s = to_str(a0, m)?;
            m.step(s.len())?;
            Val::Num(js::parse_float(&s))
        }
        Func::Number => Val::Num(if given == 0 { 0.0 } else { to_num(&a0, m)? }),
        Func::String => Val::Str(if given == 0 {
            Cow::Borrowed("")
        } else {
            to_str(a0, m)?
        }),
        Func::Boolean => Val::Bool(truthy(&a0)),
        Func::IsNaN => Val::Bool(to_num(&a0, m)?.is_nan()),
        Func::IsFinite => Val::Bool(to_num(&a0, m)?.is_finite()),
    })
}

fn binary<'a>(op: BinOp, a: Val<'a>, b: Val<'a>, m: &mut Meter) -> Result<Val<'a>, EvalError> {
    Ok(match op {
        BinOp::Add => {
            let (a, b) = (primitive(a, m)?, primitive(b, m)?);
            if matches!(a, Val::Str(_)) || matches!(b, Val::Str(_)) {
                let (a, b) = (to_str(a, m)?, to_str(b, m)?);
                m.step(a.len() + b.len())?;
                m.alloc(a.len() + b.len())?;
                let mut s = String::with_capacity(a.len() + b.len());
                s.push_str(&a);
                s.push_str(&b);
                Val::Str(Cow::Owned(s))
            } else {
                Val::Num(to_num(&a, m)? + to_num(&b, m)?)
            }
        }
        BinOp::Sub => Val::Num(to_num(&a, m)? - to_num(&b, m)?),
        BinOp::Mul => Val::Num(to_num(&a, m)? * to_num(&b, m)?),
        BinOp::Div => Val::Num(to_num(&a, m)? / to_num(&b, m)?),
        BinOp::Rem => Val::Num(to_num(&a, m)? % to_num(&b, m)?),
        BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
            let (a, b) = (primitive(a, m)?, primitive(b, m)?);
            let ord = if let (Val::Str(x), Val::Str(y)) = (&a, &b) {
                m.step(x.len() + y.len())?;
                Some(js::compare(x, y))
            } else {
                to_num(&a, m)?.partial_cmp(&to_num(&b, m)?)
            };
            Val::Bool(ord.is_some_and(|o| match op {
                BinOp::Lt => o.is_lt(),
                BinOp::Le => o.is_le(),
                BinOp::Gt => o.is_gt(),
                _ => o.is_ge(),
            }))
        }
        BinOp::Eq => Val::Bool(loose_eq(a, b, m)?),
        BinOp::Ne => Val::Bool(!loose_eq(a, b, m)?),
        BinOp::StrictEq => Val::Bool(strict_eq(&a, &b)),
        BinOp::StrictNe => Val::Bool(!strict_eq(&a, &b)),
    })
}

pub(crate) fn truthy(v: &Val<'_>) -> bool {
    match v {
        Val::Undef | Val::Null => false,
        Val::Bool(b) => *b,
        Val::Num(n) => *n != 0.0 && !n.is_nan(),
        Val::Str(s) => !s.is_empty(),
        Val::Arr(_) | Val::Re(_) => true,
    }
}

fn strict_eq(a: &Val<'_>, b: &Val<'_>) -> bool {
    match (a, b) {
        (Val::Undef, Val::Undef) | (Val::Null, Val::Null) => true,
        (Val::Bool(x), Val::Bool(y)) => x == y,
        (Val::Num(x), Val::Num(y)) => x == y,
        (Val::Str(x), Val::Str(y)) => x == y,
        // Objects are equal only to themselves; a condition never holds two
        // references to one.
        _ => false,
    }
}

/// JavaScript's `==`.
fn loose_eq<'a>(a: Val<'a>, b: Val<'a>, m: &mut Meter) -> Result<bool, EvalError> {
    Ok(match (a, b) {
        (Val::Undef | Val::Null, Val::Undef | Val::Null) => true,
        (Val::Undef | Val::Null, _) | (_, Val::Undef | Val::Null) => false,
        (Val::Num(x), Val::Num(y)) => x == y,
        (Val::Str(x), Val::Str(y)) => {
            m.step(x.len().min(y.len()))?;
            x == y
        }
        (Val::Bool(x), Val::Bool(y)) => x == y,
        (Val::Num(x), Val::Str(s)) | (Val::Str(s), Val::Num(x)) => {
            m.step(s.len())?;
            x == js::to_number(&s)
        }
        (Val::Bool(x), other) | (other, Val::Bool(x)) => {
            loose_eq(Val::Num(f64::from(u8::from(x))), other, m)?
        }
        (Val::Arr(_) | Val::Re(_), Val::Arr(_) | Val::Re(_)) => false,
        (o @ (Val::Arr(_) | Val::Re(_)), p) | (p, o @ (Val::Arr(_) | Val::Re(_))) => {
            let o = primitive(o, m)?;
            loose_eq(o, p, m)?
        }
    })
}

/// ToPrimitive: an array is its elements joined with commas.
fn primitive<'a>(v: Val<'a>, m: &mut Meter) -> Result<Val<'a>, EvalError> {
    match v {
        Val::Arr(_) | Val::Re(_) => Ok(Val::Str(to_str(v, m)?)),
        other => Ok(other),
    }
}

fn to_num(v: &Val<'_>, m: &mut Meter) -> Result<f64, EvalError> {
    Ok(match v {
        Val::Undef => f64::NAN,
        Val::Null => 0.0,
        Val::Bool(b) => f64::from(u8::from(*b)),
        Val::Num(n) => *n,
        Val::Str(s) => {
            m.step(s.len())?;
            js::to_number(s)
        }
        Val::Arr(_) => {
            let s = to_str(v.clone_shallow(m)?, m)?;
            m.step(s.len())?;
            js::to_number(&s)
        }
        Val::Re(_) => f64::NAN,
    })
}

/// An argument that may be left out: `default` when it is.
fn opt_num(v: Val<'_>, default: f64, m: &mut Meter) -> Result<f64, EvalError> {
    match v {
        Val::Undef => Ok(default),
        x => to_num(&x, m),
    }
}

fn to_str<'a>(v: Val<'a>, m: &mut Meter) -> Result<Cow<'a, str>, EvalError> {
    Ok(match v {
        Val::Undef => Cow::Borrowed("undefined"),
        Val::Null => Cow::Borrowed("null"),
        Val::Bool(b) => Cow::Borrowed(if b { "true" } else { "false" }),
        Val::Num(n) => {
            // At most 25 bytes ("-1.2345678901234567e-308").
            m.alloc(32)?;
            Cow::Owned(js::number_to_string(n))
        }
        Val::Str(s) => s,
        Val::Arr(items) => {
            let mut len = items.len().saturating_sub(1);
            for x in &items {
                if let Val::Str(s) = x {
                    len += s.len();
                }
            }
            m.step(len)?;
            m.alloc(len)?;
            let mut out = String::with_capacity(len);
            for (k, x) in items.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                if let Val::Str(s) = x {
                    out.push_str(s);
                }
            }
            Cow::Owned(out)
        }
        Val::Re(_) => Cow::Borrowed("/(regex)/"),
    })
}

impl Val<'_> {
    /// A copy of an array (for a conversion that consumes it), charged.
    fn clone_shallow(&self, m: &mut Meter) -> Result<Self, EvalError> {
        if let Val::Arr(v) = self {
            m.alloc(v.len() * VAL)?;
            for x in v {
                if let Val::Str(Cow::Owned(s)) = x {
                    m.alloc(s.len())?;
                }
            }
        }
        Ok(self.clone())
    }
}
