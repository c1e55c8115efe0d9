//! Tokens of a condition: JavaScript's lexical grammar for the forms the
//! language has (numbers, strings, regex literals, names, punctuators), and
//! clear refusals for the rest (template literals, comments).

use crate::CompileError;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    Num(f64),
    Str(String),
    /// `/pattern/flags`
    Regex {
        pattern: String,
        flags: String,
    },
    /// A name; evalexpr's `str::name` paths are one name.
    Name(String),
    Punct(&'static str),
    End,
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub tok: Tok,
    /// Byte offset in the source.
    pub at: usize,
}

/// Longest first, so `===` is not read as `==` `=`.
const PUNCTS: &[&str] = &[
    "===", "!==", "**", "==", "!=", "<=", ">=", "&&", "||", "??", "?.", "=>", "+=", "-=", "++",
    "--", "<<", ">>", "(", ")", "[", "]", "{", "}", ".", ",", "?", ":", "!", "<", ">", "+", "-",
    "*", "/", "%", "=", ";", "&", "|", "^", "~",
];

pub(crate) fn tokens(src: &str) -> Result<Vec<Token>, CompileError> {
    let b = src.as_bytes();
    let mut out: Vec<Token> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        // Non-ASCII whitespace (no-break space, line separators, BOM) as JS has it.
        if c >= 0x80 {
            let ch = src[i..].chars().next().unwrap_or('\u{FFFD}');
            if crate::js::is_space(ch) {
                i += ch.len_utf8();
                continue;
            }
        }
        let at = i;
        let tok =
            if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
                let (n, len) =
                    number(&src[i..]).ok_or_else(|| CompileError::at(at, "a malformed number"))?;
                i += len;
                Tok::Num(n)
            } else if c == b'"' || c == b'\'' {
                let (s, len) = string(&src[i..]).ok_or_else(|| {
                    CompileError::at(
                        at,
                        "a string that is not closed (or has a malformed escape)",
                    )
                })?;
                i += len;
                Tok::Str(s)
            } else if c == b'`' {
                return Err(CompileError::at(
                    at,
                    "template literals are not supported: use \"...\" or '...'",
                ));
            } else if c == b'/' && b.get(i + 1).is_some_and(|n| *n == b'/' || *n == b'*') {
                return Err(CompileError::at(at, "comments are not supported"));
            } else if c == b'/' && regex_allowed(out.last()) {
                let (pattern, flags, len) = regex(&src[i..])
                    .ok_or_else(|| CompileError::at(at, "a regex literal that is not closed"))?;
                i += len;
                Tok::Regex { pattern, flags }
            } else if is_name_start(src[i..].chars().next().unwrap_or(' ')) {
                let len = name(&src[i..]);
                let n = &src[i..i + len];
                i += len;
                Tok::Name(n.to_owned())
            } else if let Some(p) = PUNCTS.iter().find(|p| src[i..].starts_with(**p)) {
                i += p.len();
                Tok::Punct(p)
            } else {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(CompileError::at(at, format!("unexpected character `{ch}`")));
            };
        out.push(Token { tok, at });
    }
    out.push(Token {
        tok: Tok::End,
        at: src.len(),
    });
    Ok(out)
}

/// A `/` starts a regex where an operand is expected, as in JavaScript.
fn regex_allowed(prev: Option<&Token>) -> bool {
    match prev.map(|t| &t.tok) {
        None => true,
        Some(Tok::Num(_) | Tok::Str(_) | Tok::Regex { .. }) => false,
        Some(Tok::Name(n)) => matches!(n.as_str(), "typeof" | "return"),
        Some(Tok::Punct(p)) => !matches!(*p, ")" | "]" | "}"),
        Some(Tok::End) => false,
    }
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == '$'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '$'
}

/// A name, with evalexpr's `::` path separators inside it.
fn name(s: &str) -> usize {
    let mut len = 0;
    loop {
        len += s[len..]
            .find(|c: char| !is_name_char(c))
            .unwrap_or(s.len() - len);
        let rest = &s[len..];
        if rest.starts_with("::") && rest[2..].chars().next().is_some_and(is_name_start) {
            len += 2;
        } else {
            return len;
        }
    }
}

/// A numeric literal: decimal (with fraction and exponent), `0x`, `0o`, `0b`.
fn number(s: &str) -> Option<(f64, usize)> {
    let b = s.as_bytes();
    if b.len() > 1 && b[0] == b'0' && matches!(b[1] | 0x20, b'x' | b'o' | b'b') {
        let radix = match b[1] | 0x20 {
            b'x' => 16,
            b'o' => 8,
            _ => 2,
        };
        let digits = s[2..]
            .find(|c: char| !c.is_digit(radix))
            .unwrap_or(s.len() - 2);
        if digits == 0 {
            return None;
        }
        let v = crate::js::digits_value(&s[2..2 + digits], radix);
        let len = 2 + digits;
        return (!s[len..].chars().next().is_some_and(is_name_char)).then_some((v, len));
    }
    let len = crate::js::decimal_prefix(s);
    if len == 0 {
        return None;
    }
    // `1.toString` is not a number followed by a name in JS either.
    if s[len..].chars().next().is_some_and(is_name_char) {
        return None;
    }
    s[..len].parse::<f64>().ok().map(|v| (v, len))
}

/// A quoted string with JavaScript's escapes.
fn string(s: &str) -> Option<(String, usize)> {
    let quote = s.chars().next()?;
    let mut out = String::new();
    let mut it = s.char_indices().skip(1);
    while let Some((i, c)) = it.next() {
        match c {
            c if c == quote => return Some((out, i + 1)),
            '\n' | '\r' => return None,
            '\\' => {
                let (_, e) = it.next()?;
                match e {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    'r' => out.push('\r'),
                    'b' => out.push('\u{8}'),
                    'f' => out.push('\u{c}'),
                    'v' => out.push('\u{b}'),
                    '0' => out.push('\0'),
                    'x' => {
                        let h: String = (0..2).filter_map(|_| it.next().map(|(_, c)| c)).collect();
                        out.push(char::from_u32(u32::from_str_radix(&h, 16).ok()?)?);
                    }
                    'u' => {
                        let mut h = String::new();
                        let (_, first) = it.next()?;
                        if first == '{' {
                            for (_, c) in it.by_ref() {
                                if c == '}' {
                                    break;
                                }
                                h.push(c);
                                if h.len() > 6 {
                                    return None;
                                }
                            }
                        } else {
                            h.push(first);
                            for _ in 0..3 {
                                h.push(it.next()?.1);
                            }
                        }
                        let u = u32::from_str_radix(&h, 16).ok()?;
                        // A lone surrogate has no place in a Rust string.
                        out.push(char::from_u32(u).unwrap_or('\u{FFFD}'));
                    }
                    // A line continuation.
                    '\n' => {}
                    other => out.push(other),
                }
            }
            c => out.push(c),
        }
    }
    None
}

/// `/pattern/flags`: a `/` inside a class or after a backslash does not end it.
fn regex(s: &str) -> Option<(String, String, usize)> {
    let mut in_class = false;
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match c {
            '\n' | '\r' => return None,
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '[' => in_class = true,
            ']' => in_class = false,
            '/' if !in_class => {
                let pattern = s[1..i].to_owned();
                let flen = s[i + 1..]
                    .find(|c: char| !is_name_char(c))
                    .unwrap_or(s.len() - i - 1);
                let flags = s[i + 1..i + 1 + flen].to_owned();
                return Some((pattern, flags, i + 1 + flen));
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        tokens(s)
            .expect("lexes")
            .into_iter()
            .map(|t| t.tok)
            .collect()
    }

    #[test]
    fn regex_or_division_by_context() {
        assert_eq!(
            toks("/a\\/b[/]/i.test(x)")[0],
            Tok::Regex {
                pattern: "a\\/b[/]".into(),
                flags: "i".into()
            }
        );
        assert_eq!(toks("x / 2")[1], Tok::Punct("/"));
        assert_eq!(toks("(x) / 2")[3], Tok::Punct("/"));
    }

    #[test]
    fn strings_numbers_and_paths() {
        assert_eq!(
            toks(r#"'a\'b' "c\u0041\x42\u{43}""#)[..2],
            [Tok::Str("a'b".into()), Tok::Str("cABC".into())]
        );
        assert_eq!(
            toks("0x1F .5 1e3 -1")[..4],
            [
                Tok::Num(31.0),
                Tok::Num(0.5),
                Tok::Num(1000.0),
                Tok::Punct("-")
            ]
        );
        assert_eq!(
            toks("str::regex_matches(")[0],
            Tok::Name("str::regex_matches".into())
        );
        assert!(tokens("`x`").is_err());
        assert!(tokens("'open").is_err());
        assert!(tokens("1 // c").is_err());
    }
}
