//! Methods of strings, arrays and regexes: each charges the meter for what
//! it scans and, before it allocates, for what it will allocate.

use std::borrow::Cow;

use super::{Meter, VAL, Val, opt_num, strict_eq, to_num, to_str, type_error};
use crate::EvalError;
use crate::ast::{Method, Program};
use crate::js;

impl Program {
    pub(super) fn method<'a>(
        &'a self,
        method: Method,
        r: Val<'a>,
        a0: Val<'a>,
        a1: Val<'a>,
        m: &mut Meter,
    ) -> Result<Val<'a>, EvalError> {
        use Method as M;
        if matches!(r, Val::Null | Val::Undef) {
            return Err(type_error("a method called on null"));
        }
        if method == M::Test {
            let Val::Re(k) = r else {
                return Err(type_error("test of something that is not a regex"));
            };
            let s = to_str(a0, m)?;
            m.step(regex_cost(&s))?;
            return Ok(Val::Bool(self.regexes[usize::from(k)].0.is_match(&s)));
        }
        if method == M::ToString {
            return Ok(Val::Str(to_str(r, m)?));
        }
        if let Val::Arr(v) = r {
            return array_method(method, v, a0, a1, m);
        }
        let Val::Str(s) = r else {
            return Err(type_error("a string method called on something else"));
        };
        let len16 = || js::utf16_len(&s);
        Ok(match method {
            M::IndexOf => {
                let needle = to_str(a0, m)?;
                m.step(s.len() + needle.len())?;
                let from = js::clamp_pos(opt_num(a1, 0.0, m)?, len16());
                let start = js::byte_at(&s, from);
                Val::Num(match s[start..].find(&*needle) {
                    Some(i) => js::utf16_pos(&s, start + i) as f64,
                    None => -1.0,
                })
            }
            M::LastIndexOf => {
                let needle = to_str(a0, m)?;
                m.step(s.len() + needle.len())?;
                let from = match a1 {
                    Val::Undef => f64::INFINITY,
                    x => {
                        let n = to_num(&x, m)?;
                        if n.is_nan() { f64::INFINITY } else { n }
                    }
                };
                let limit = js::byte_at(&s, js::clamp_pos(from, len16()));
                let mut end = (limit + needle.len()).min(s.len());
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                Val::Num(match s[..end].rfind(&*needle) {
                    Some(i) => js::utf16_pos(&s, i) as f64,
                    None => -1.0,
                })
            }
            M::Includes | M::StartsWith | M::EndsWith => {
                let needle = to_str(a0, m)?;
                m.step(s.len() + needle.len())?;
                Val::Bool(match method {
                    M::Includes => {
                        let from = js::byte_at(&s, js::clamp_pos(opt_num(a1, 0.0, m)?, len16()));
                        s[from..].contains(&*needle)
                    }
                    M::StartsWith => {
                        let from = js::byte_at(&s, js::clamp_pos(opt_num(a1, 0.0, m)?, len16()));
                        s[from..].starts_with(&*needle)
                    }
                    _ => {
                        let n = len16();
                        let end = js::byte_at(&s, js::clamp_pos(opt_num(a1, n as f64, m)?, n));
                        s[..end].ends_with(&*needle)
                    }
                })
            }
            M::Substring | M::Substr | M::Slice => {
                m.step(s.len())?;
                let n = len16();
                let (start, end) = match method {
                    M::Substring => {
                        let a = js::clamp_pos(opt_num(a0, 0.0, m)?, n);
                        let b = js::clamp_pos(opt_num(a1, n as f64, m)?, n);
                        (a.min(b), a.max(b))
                    }
                    M::Substr => {
                        let a = js::relative_pos(opt_num(a0, 0.0, m)?, n);
                        let count = js::clamp_pos(opt_num(a1, n as f64, m)?, n);
                        (a, (a + count).min(n))
                    }
                    _ => {
                        let a = js::relative_pos(opt_num(a0, 0.0, m)?, n);
                        let b = js::relative_pos(opt_num(a1, n as f64, m)?, n);
                        (a, b.max(a))
                    }
                };
                let (i, j) = (js::byte_at(&s, start), js::byte_at(&s, end));
                Val::Str(sub(s, i, j, m)?)
            }
            M::CharAt => {
                let i = opt_num(a0, 0.0, m)?;
                Val::Str(char_at(s, i.trunc(), m)?.unwrap_or(Cow::Borrowed("")))
            }
            M::At => {
                let i = to_num(&a0, m)?;
                let i = if i.is_nan() { 0.0 } else { i.trunc() };
                let i = if i < 0.0 { i + len16() as f64 } else { i };
                char_at(s, i, m)?.map_or(Val::Undef, Val::Str)
            }
            M::CharCodeAt => {
                m.step(s.len())?;
                let i = opt_num(a0, 0.0, m)?.trunc();
                Val::Num(if i >= 0.0 {
                    s.encode_utf16().nth(i as usize).map_or(f64::NAN, f64::from)
                } else {
                    f64::NAN
                })
            }
            M::ToLowerCase | M::ToUpperCase => {
                m.step(s.len())?;
                let lower = method == M::ToLowerCase;
                if s.is_ascii() {
                    let unchanged = if lower {
                        !s.bytes().any(|b| b.is_ascii_uppercase())
                    } else {
                        !s.bytes().any(|b| b.is_ascii_lowercase())
                    };
                    if unchanged {
                        return Ok(Val::Str(s));
                    }
                    m.alloc(s.len())?;
                    return Ok(Val::Str(Cow::Owned(if lower {
                        s.to_ascii_lowercase()
                    } else {
                        s.to_ascii_uppercase()
                    })));
                }
                // Unicode case mapping at most triples a string's bytes:
                // that much is reserved (and charged) once, never grown.
                m.alloc(s.len() * 3)?;
                let mut out = String::with_capacity(s.len() * 3);
                if lower {
                    lowercase_into(&s, &mut out);
                } else {
                    s.chars()
                        .flat_map(char::to_uppercase)
                        .for_each(|c| out.push(c));
                }
                Val::Str(Cow::Owned(out))
            }
            M::Trim | M::TrimStart | M::TrimEnd => {
                m.step(s.len())?;
                let t = match method {
                    M::Trim => js::trim(&s),
                    M::TrimStart => s.trim_start_matches(js::is_space),
                    _ => s.trim_end_matches(js::is_space),
                };
                let i = t.as_ptr() as usize - s.as_ptr() as usize;
                let j = i + t.len();
                Val::Str(sub(s, i, j, m)?)
            }
            M::Split => split(s, a0, a1, m)?,
            M::Match => {
                let Val::Re(k) = a0 else {
                    return Err(type_error("match without a regex"));
                };
                let (re, global) = &self.regexes[usize::from(k)];
                m.step(regex_cost(&s))?;
                if *global {
                    let count = re.find_iter(&s).count();
                    if count == 0 {
                        return Ok(Val::Null);
                    }
                    m.step(regex_cost(&s))?;
                    m.alloc(count * VAL)?;
                    let mut out = Vec::with_capacity(count);
                    for x in re.find_iter(&s) {
                        out.push(Val::Str(sub_ref(&s, x.start(), x.end(), m)?));
                    }
                    Val::Arr(out)
                } else {
                    let Some(caps) = re.captures(&s) else {
                        return Ok(Val::Null);
                    };
                    m.alloc(caps.len() * VAL)?;
                    let mut out = Vec::with_capacity(caps.len());
                    for g in caps.iter() {
                        out.push(match g {
                            Some(x) => Val::Str(sub_ref(&s, x.start(), x.end(), m)?),
                            None => Val::Undef,
                        });
                    }
                    Val::Arr(out)
                }
            }
            M::Search => {
                let Val::Re(k) = a0 else {
                    return Err(type_error("search without a regex"));
                };
                m.step(regex_cost(&s))?;
                Val::Num(match self.regexes[usize::from(k)].0.find(&s) {
                    Some(x) => js::utf16_pos(&s, x.start()) as f64,
                    None => -1.0,
                })
            }
            // Answered before the receiver's type is looked at.
            M::Test | M::ToString => return Err(type_error("no such string method")),
        })
    }
}

/// JavaScript's toLowerCase: per character, except that a capital sigma
/// ending a word becomes a final sigma.
fn lowercase_into(s: &str, out: &mut String) {
    let mut chars = s.char_indices().peekable();
    let mut prev_letter = false;
    while let Some((_, c)) = chars.next() {
        if c == 'Σ' {
            let next_letter = chars.peek().is_some_and(|(_, n)| n.is_alphabetic());
            out.push(if prev_letter && !next_letter {
                'ς'
            } else {
                'σ'
            });
        } else {
            c.to_lowercase().for_each(|l| out.push(l));
        }
        prev_letter = c.is_alphabetic();
    }
}

/// Regex matching is linear in the haystack for a compiled size that the
/// limits bound; this charges it as a few steps per byte.
fn regex_cost(s: &str) -> usize {
    s.len().saturating_mul(4).saturating_add(16)
}

fn array_method<'a>(
    method: Method,
    v: Vec<Val<'a>>,
    a0: Val<'a>,
    a1: Val<'a>,
    m: &mut Meter,
) -> Result<Val<'a>, EvalError> {
    use Method as M;
    let n = v.len();
    match method {
        M::IndexOf | M::LastIndexOf | M::Includes => {
            let mut cost = n;
            for x in &v {
                if let Val::Str(s) = x {
                    cost += s.len();
                }
            }
            m.step(cost)?;
            let same = |x: &Val<'a>| strict_eq(x, &a0);
            Ok(match method {
                M::Includes => Val::Bool(v.iter().any(same)),
                M::IndexOf => {
                    let from = js::relative_pos(opt_num(a1, 0.0, m)?, n);
                    Val::Num(
                        v.iter()
                            .skip(from)
                            .position(same)
                            .map_or(-1.0, |i| (i + from) as f64),
                    )
                }
                _ => Val::Num(v.iter().rposition(same).map_or(-1.0, |i| i as f64)),
            })
        }
        M::At => {
            let i = to_num(&a0, m)?;
            let i = if i.is_nan() { 0.0 } else { i.trunc() };
            let i = if i < 0.0 { i + n as f64 } else { i };
            let mut v = v;
            Ok(if i >= 0.0 && i < n as f64 {
                v.swap_remove(i as usize)
            } else {
                Val::Undef
            })
        }
        _ => Err(type_error("a string method called on an array")),
    }
}

/// `s.split(sep, limit)`.
fn split<'a>(
    s: Cow<'a, str>,
    sep: Val<'a>,
    limit: Val<'a>,
    m: &mut Meter,
) -> Result<Val<'a>, EvalError> {
    let limit = match limit {
        Val::Undef => usize::MAX,
        x => {
            let l = to_num(&x, m)?;
            if l.is_nan() || l <= 0.0 {
                0
            } else {
                l.min(1e9) as usize
            }
        }
    };
    if matches!(sep, Val::Undef) {
        m.alloc(VAL)?;
        return Ok(Val::Arr(if limit == 0 {
            vec![]
        } else {
            vec![Val::Str(s)]
        }));
    }
    let sep = to_str(sep, m)?;
    m.step(s.len() + sep.len())?;
    // Counted before anything is allocated.
    let parts = if sep.is_empty() {
        s.chars().count()
    } else {
        s.matches(&*sep).count() + 1
    }
    .min(limit);
    m.alloc(parts * VAL)?;
    let mut out = Vec::with_capacity(parts);
    if sep.is_empty() {
        for (i, c) in s.char_indices().take(parts) {
            out.push(Val::Str(sub_ref(&s, i, i + c.len_utf8(), m)?));
        }
    } else {
        let mut at = 0;
        for (i, _) in s.match_indices(&*sep).take(parts) {
            out.push(Val::Str(sub_ref(&s, at, i, m)?));
            at = i + sep.len();
        }
        if out.len() < parts {
            out.push(Val::Str(sub_ref(&s, at, s.len(), m)?));
        }
    }
    Ok(Val::Arr(out))
}

/// The character at UTF-16 position `i` (all of it, if `i` falls on the
/// first half of a surrogate pair).
pub(super) fn char_at<'a>(
    s: Cow<'a, str>,
    i: f64,
    m: &mut Meter,
) -> Result<Option<Cow<'a, str>>, EvalError> {
    m.step(s.len())?;
    if i.is_nan() || i < 0.0 || i.fract() != 0.0 || i >= js::utf16_len(&s) as f64 {
        return Ok(None);
    }
    let start = js::byte_at(&s, i as usize);
    let len = s[start..].chars().next().map_or(0, char::len_utf8);
    sub(s, start, start + len, m).map(Some)
}

/// `s[i..j]`, borrowed when `s` is, else a charged copy.
fn sub<'a>(s: Cow<'a, str>, i: usize, j: usize, m: &mut Meter) -> Result<Cow<'a, str>, EvalError> {
    match s {
        Cow::Borrowed(b) => Ok(Cow::Borrowed(&b[i..j])),
        Cow::Owned(o) => {
            m.alloc(j - i)?;
            Ok(Cow::Owned(o[i..j].to_owned()))
        }
    }
}

/// The same for a string that is still in use.
fn sub_ref<'a>(
    s: &Cow<'a, str>,
    i: usize,
    j: usize,
    m: &mut Meter,
) -> Result<Cow<'a, str>, EvalError> {
    match s {
        Cow::Borrowed(b) => Ok(Cow::Borrowed(&b[i..j])),
        Cow::Owned(o) => {
            m.alloc(j - i)?;
            Ok(Cow::Owned(o[i..j].to_owned()))
        }
    }
}
