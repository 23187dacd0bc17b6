//! Python's text forms of template values: `str(x)` (what `{{ x }}`, `|string`
//! and `|join` print) and `repr(x)` (how a list or dict prints its items), and
//! the character classes of Python's string methods.

use std::fmt::Write;

use minijinja::value::{Tuple, ValueKind};
use minijinja::Value;

use crate::tables::{
    ALPHA, DECIMAL, DIGIT, NOT_PRINTABLE, NUMERIC, TITLECASE, TITLE_LETTERS, WHITESPACE,
};

/// Whether `c` is in one of the sorted, disjoint inclusive `ranges`.
fn in_ranges(ranges: &[(u32, u32)], c: char) -> bool {
    let c = c as u32;
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// Python's `str.isspace()` for one character.
pub(crate) fn is_space(c: char) -> bool {
    in_ranges(WHITESPACE, c)
}

/// Python's `str.isprintable()` for one character.
pub(crate) fn is_printable(c: char) -> bool {
    !in_ranges(NOT_PRINTABLE, c)
}

/// Python's `str.isalpha()` for one character.
pub(crate) fn is_alpha(c: char) -> bool {
    in_ranges(ALPHA, c)
}

/// Python's `str.isnumeric()` for one character.
pub(crate) fn is_numeric(c: char) -> bool {
    in_ranges(NUMERIC, c)
}

/// Python's `str.isdigit()` for one character.
pub(crate) fn is_digit(c: char) -> bool {
    in_ranges(DIGIT, c)
}

/// Python's `str.isdecimal()` for one character.
pub(crate) fn is_decimal(c: char) -> bool {
    in_ranges(DECIMAL, c)
}

/// Python's `str.isalnum()` for one character (also what `\w` matches,
/// with `_`).
pub(crate) fn is_alnum(c: char) -> bool {
    is_alpha(c) || is_numeric(c)
}

/// `str.islower()` (`upper` false) or `str.isupper()` (`upper` true): some
/// cased character, and none of the other case or title case.
pub(crate) fn is_case(s: &str, upper: bool) -> bool {
    let mut any = false;
    for c in s.chars().filter(|&c| is_cased(c)) {
        any = true;
        let ok = if upper {
            c.is_uppercase() && !c.is_lowercase()
        } else {
            c.is_lowercase() && !c.is_uppercase()
        };
        if !ok {
            return false;
        }
    }
    any
}

/// Whether Python counts `c` as cased (upper, lower or title case), which is
/// what `str.title()` starts a new word after.
pub(crate) fn is_cased(c: char) -> bool {
    c.is_lowercase() || c.is_uppercase() || TITLE_LETTERS.contains(&c)
}

/// Appends Python's title case of `c` (`'ǆ'.title()` is `'ǅ'`, not `'Ǆ'`).
pub(crate) fn push_title(out: &mut String, c: char) {
    match TITLECASE.binary_search_by(|&(k, _)| k.cmp(&c)) {
        Ok(i) => out.push_str(TITLECASE[i].1),
        Err(_) => out.extend(c.to_uppercase()),
    }
}

/// Python's `repr(float)`: the shortest digits that read back the same, in
/// positional form for exponents -4 to 15 and scientific (`1e-05`, `1e+16`)
/// outside them; `inf`, `-inf`, `nan`.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Python's repr: the fewest digits that read back as `x`, and of those
    // the closest to `x` (ties to even). Rust's `{:e}` finds the fewest, but
    // may pick another string of that length; `{:.N$e}` rounds correctly.
    let shortest = format!("{x:e}");
    let digits = shortest
        .split('e')
        .next()
        .unwrap_or("")
        .bytes()
        .filter(u8::is_ascii_digit)
        .count();
    let closest = format!("{x:.*e}", digits.saturating_sub(1));
    let sci = if closest.parse::<f64>() == Ok(x) {
        closest
    } else {
        shortest
    };
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp < 0 {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        } else if exp + 1 >= n {
            format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
        } else {
            let (int, frac) = digits.split_at((exp + 1) as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

/// Python's `repr(str)`: single quotes unless the text has a single quote
/// and no double quote; backslash escapes for the quote, `\\`, `\n`, `\r`,
/// `\t` and every character that is not printable.
pub fn str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let cp = c as u32;
                let _ = if cp <= 0xff {
                    write!(out, "\\x{cp:02x}")
                } else if cp <= 0xffff {
                    write!(out, "\\u{cp:04x}")
                } else {
                    write!(out, "\\U{cp:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Appends Python's `str(value)`: strings as they are, `None`, `True`,
/// `False`, numbers as Python prints them, lists `[...]`, tuples `(...)` and
/// dicts `{...}` with their items' `repr`. Undefined prints as nothing, as
/// Jinja2's `Undefined` does.
pub fn push_str(out: &mut String, value: &Value) {
    if let Some(s) = value.as_str() {
        out.push_str(s);
    } else if value.is_undefined() {
    } else {
        push_repr(out, value);
    }
}

/// Python's `str(value)` as a new string.
pub fn to_str(value: &Value) -> String {
    let mut out = String::new();
    push_str(&mut out, value);
    out
}

/// Appends Python's `repr(value)` (see [`push_str`]).
pub fn push_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::String => str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Number => push_number(out, value),
        ValueKind::Seq | ValueKind::Iterable if value.downcast_object_ref::<Tuple>().is_some() => {
            let items: Vec<Value> = value.try_iter().map(|i| i.collect()).unwrap_or_default();
            out.push('(');
            push_items(out, &items);
            if items.len() == 1 {
                out.push(',');
            }
            out.push(')');
        }
        ValueKind::Seq => {
            let items: Vec<Value> = value.try_iter().map(|i| i.collect()).unwrap_or_default();
            out.push('[');
            push_items(out, &items);
            out.push(']');
        }
        ValueKind::Map if is_namespace(value) => {
            // Jinja2's Namespace repr (minijinja keeps the names sorted).
            out.push_str("<Namespace ");
            push_dict(out, value);
            out.push('>');
        }
        ValueKind::Map => push_dict(out, value),
        // Macros, loops, iterators: minijinja's own form (Python's names an
        // address and cannot be matched anyway).
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Whether a value is a dict (from the messages, a literal or `dict()`),
/// not a namespace, which Jinja2 does not count as a mapping.
pub(crate) fn is_dict(value: &Value) -> bool {
    value.kind() == ValueKind::Map && !is_namespace(value)
}

/// Whether a value is a `namespace()`. minijinja does not export its type,
/// so this reads the start of its debug form (bounded: the rest of a large
/// map is never formatted).
pub(crate) fn is_namespace(value: &Value) -> bool {
    struct Prefix(String);
    impl std::fmt::Write for Prefix {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let room = 16usize.saturating_sub(self.0.len());
            self.0.extend(s.chars().take(room));
            if self.0.len() >= 16 {
                Err(std::fmt::Error)
            } else {
                Ok(())
            }
        }
    }
    let Some(obj) = value.as_object() else {
        return false;
    };
    let mut prefix = Prefix(String::new());
    let _ = write!(prefix, "{obj:?}");
    prefix.0.starts_with("Namespace {")
}

/// `{key: value, ...}` with the items' repr.
fn push_dict(out: &mut String, value: &Value) {
    out.push('{');
    for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_repr(out, &key);
        out.push_str(": ");
        push_repr(out, &value.get_item(&key).unwrap_or_default());
    }
    out.push('}');
}

fn push_items(out: &mut String, items: &[Value]) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_repr(out, item);
    }
}

/// Appends a number as Python prints it: integers in full, floats by
/// [`float_repr`].
fn push_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
    } else if let Ok(x) = f64::try_from(value.clone()) {
        out.push_str(&float_repr(x));
    } else {
        let _ = write!(out, "{value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected outputs came from CPython 3.11: repr(x) and str(x).
    #[test]
    fn floats_print_as_python_repr() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.125, "123456789.125"),
            (-2.5e-7, "-2.5e-07"),
            (1.5e300, "1.5e+300"),
            (-0.0, "-0.0"),
            (std::f64::consts::PI, "3.141592653589793"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
            (12345678901234567.0, "1.2345678901234568e+16"),
            (0.00012, "0.00012"),
            (1e15 + 0.3, "1000000000000000.2"),
        ] {
            assert_eq!(float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn strings_repr_as_python() {
        for (s, want) in [
            ("abc", "'abc'"),
            ("it's", "\"it's\""),
            ("say \"hi\"", "'say \"hi\"'"),
            ("both ' and \"", "'both \\' and \"'"),
            ("a\\b\n\r\t", "'a\\\\b\\n\\r\\t'"),
            (
                "\u{0}\u{1f}\u{7f}\u{85}\u{a0}",
                "'\\x00\\x1f\\x7f\\x85\\xa0'",
            ),
            ("é中😀", "'é中😀'"),
            ("zw\u{200d}j\u{2028}", "'zw\\u200dj\\u2028'"),
            ("\u{e0001}", "'\\U000e0001'"),
        ] {
            let mut out = String::new();
            str_repr(&mut out, s);
            assert_eq!(out, want, "{s:?}");
        }
    }
}
