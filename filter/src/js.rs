//! The pieces of JavaScript's semantics the language needs: string ↔ number
//! conversions, UTF-16 positions, whitespace. Each costs time linear in its
//! input and allocates at most a small fixed amount.

use std::cmp::Ordering;

/// JavaScript's WhiteSpace and LineTerminator code points (what `trim` removes).
pub(crate) fn is_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' | ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202f}'
                | '\u{205f}'
                | '\u{3000}'
                | '\u{feff}'
    )
}

pub(crate) fn trim(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// Length of the longest prefix that is an unsigned decimal literal
/// (`12`, `1.5`, `.5`, `1.`, `1e-3`); 0 if there is none.
pub(crate) fn decimal_prefix(s: &str) -> usize {
    let b = s.as_bytes();
    let digits = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let int_end = digits(0);
    let mut end = int_end;
    if end < b.len() && b[end] == b'.' {
        let frac_end = digits(end + 1);
        if int_end == 0 && frac_end == end + 1 {
            return 0; // a lone `.`
        }
        end = frac_end;
    }
    if end == 0 {
        return 0;
    }
    if end < b.len() && (b[end] | 0x20) == b'e' {
        let mut j = end + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        let exp_end = digits(j);
        if exp_end > j {
            end = exp_end;
        }
    }
    end
}

/// The value of `digits` (all valid in `radix`), as JavaScript rounds it.
pub(crate) fn digits_value(digits: &str, radix: u32) -> f64 {
    digits.chars().fold(0.0, |acc, c| {
        acc * f64::from(radix) + f64::from(c.to_digit(radix).unwrap_or(0))
    })
}

/// `Number(s)`: StringToNumber. Whitespace around is ignored, `""` is 0,
/// anything that is not a whole numeric literal is NaN.
pub(crate) fn to_number(s: &str) -> f64 {
    let t = trim(s);
    if t.is_empty() {
        return 0.0;
    }
    let b = t.as_bytes();
    if b.len() > 2 && b[0] == b'0' && matches!(b[1] | 0x20, b'x' | b'o' | b'b') {
        let radix = match b[1] | 0x20 {
            b'x' => 16,
            b'o' => 8,
            _ => 2,
        };
        let d = &t[2..];
        return if d.chars().all(|c| c.is_digit(radix)) {
            digits_value(d, radix)
        } else {
            f64::NAN
        };
    }
    let (sign, body) = match t.as_bytes()[0] {
        b'-' => (-1.0, &t[1..]),
        b'+' => (1.0, &t[1..]),
        _ => (1.0, t),
    };
    if body == "Infinity" {
        return sign * f64::INFINITY;
    }
    if decimal_prefix(body) == body.len() {
        body.parse::<f64>().map_or(f64::NAN, |v| sign * v)
    } else {
        f64::NAN
    }
}

/// `parseFloat(s)`: the longest decimal prefix after whitespace.
pub(crate) fn parse_float(s: &str) -> f64 {
    let t = s.trim_start_matches(is_space);
    let (sign, body) = match t.as_bytes().first() {
        Some(b'-') => (-1.0, &t[1..]),
        Some(b'+') => (1.0, &t[1..]),
        _ => (1.0, t),
    };
    if body.starts_with("Infinity") {
        return sign * f64::INFINITY;
    }
    let len = decimal_prefix(body);
    if len == 0 {
        return f64::NAN;
    }
    body[..len].parse::<f64>().map_or(f64::NAN, |v| sign * v)
}

/// `parseInt(s, radix)`: radix 0 means "10, or 16 after `0x`".
pub(crate) fn parse_int(s: &str, radix: f64) -> f64 {
    let t = s.trim_start_matches(is_space);
    let (sign, mut body) = match t.as_bytes().first() {
        Some(b'-') => (-1.0, &t[1..]),
        Some(b'+') => (1.0, &t[1..]),
        _ => (1.0, t),
    };
    let mut radix = if radix.is_finite() {
        radix.trunc() as i64
    } else {
        0
    };
    let hex_prefix =
        body.len() >= 2 && body.as_bytes()[0] == b'0' && (body.as_bytes()[1] | 0x20) == b'x';
    if radix == 0 {
        radix = 10;
        if hex_prefix {
            radix = 16;
            body = &body[2..];
        }
    } else if radix == 16 && hex_prefix {
        body = &body[2..];
    }
    if !(2..=36).contains(&radix) {
        return f64::NAN;
    }
    let radix = radix as u32;
    let end = body
        .find(|c: char| !c.is_digit(radix))
        .unwrap_or(body.len());
    if end == 0 {
        return f64::NAN;
    }
    sign * digits_value(&body[..end], radix)
}

/// `String(n)`: JavaScript's Number::toString for radix 10.
pub(crate) fn number_to_string(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if x < 0.0 {
        return format!("-{}", number_to_string(-x));
    }
    // The shortest digits that round-trip, and the decimal exponent.
    let e = format!("{x:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    let k = digits.len() as i32;
    let n = exp + 1;
    if k <= n && n <= 21 {
        let zeros = (n - k) as usize;
        format!("{digits}{}", "0".repeat(zeros))
    } else if 0 < n && n <= 21 {
        let (a, b) = digits.split_at(n as usize);
        format!("{a}.{b}")
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let sign = if n - 1 < 0 { '-' } else { '+' };
        let (a, b) = digits.split_at(1);
        if b.is_empty() {
            format!("{a}e{sign}{}", (n - 1).abs())
        } else {
            format!("{a}.{b}e{sign}{}", (n - 1).abs())
        }
    }
}

/// A string's `length`: UTF-16 code units.
pub(crate) fn utf16_len(s: &str) -> usize {
    s.chars().map(char::len_utf16).sum()
}

/// The UTF-16 position of byte offset `byte`.
pub(crate) fn utf16_pos(s: &str, byte: usize) -> usize {
    utf16_len(&s[..byte])
}

/// The byte offset of UTF-16 position `pos` (clamped to the string; a
/// position inside a surrogate pair rounds up to the next character).
pub(crate) fn byte_at(s: &str, pos: usize) -> usize {
    let mut units = 0;
    for (i, c) in s.char_indices() {
        if units >= pos {
            return i;
        }
        units += c.len_utf16();
    }
    s.len()
}

/// Strings compare by UTF-16 code units in JavaScript.
pub(crate) fn compare(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// ToIntegerOrInfinity for positions, then clamped to `0..=len`.
pub(crate) fn clamp_pos(x: f64, len: usize) -> usize {
    if x.is_nan() || x <= 0.0 {
        0
    } else if x >= len as f64 {
        len
    } else {
        x.trunc() as usize
    }
}

/// A relative position (`slice`, `substr`): negative counts from the end.
pub(crate) fn relative_pos(x: f64, len: usize) -> usize {
    if x.is_nan() {
        return 0;
    }
    let x = x.trunc();
    if x < 0.0 {
        let back = -x;
        if back >= len as f64 {
            0
        } else {
            len - back as usize
        }
    } else {
        clamp_pos(x, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_print_as_javascript_does() {
        for (x, s) in [
            (1.0, "1"),
            (1.5, "1.5"),
            (-0.25, "-0.25"),
            (1e21, "1e+21"),
            (123456789012345680000.0, "123456789012345680000"),
            (1e-7, "1e-7"),
            (0.000001, "0.000001"),
            (1.25e-10, "1.25e-10"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(number_to_string(x), s, "{x}");
        }
    }

    #[test]
    fn strings_read_as_javascript_does() {
        assert_eq!(to_number(" 42 "), 42.0);
        assert_eq!(to_number(""), 0.0);
        assert_eq!(to_number("0x10"), 16.0);
        assert!(to_number("10.0.19045").is_nan());
        assert!(to_number("inf").is_nan());
        assert_eq!(to_number("-Infinity"), f64::NEG_INFINITY);
        assert_eq!(parse_int("14.2.1", 0.0), 14.0);
        assert_eq!(parse_int("0x1f", 0.0), 31.0);
        assert!(parse_int("v2", 0.0).is_nan());
        assert_eq!(parse_float("10.5beta"), 10.5);
        assert!(parse_float("beta").is_nan());
    }

    #[test]
    fn utf16_positions() {
        let s = "a😀b";
        assert_eq!(utf16_len(s), 4);
        assert_eq!(byte_at(s, 3), 5);
        assert_eq!(utf16_pos(s, 5), 3);
        assert_eq!(compare("\u{ffff}", "😀"), Ordering::Greater);
    }
}
