//! Python's methods on template values (`content.split('</think>')`,
//! `message.get('tool_calls')`): the string methods written here to give
//! exactly CPython's results (its whitespace, line breaks, title case,
//! character offsets), everything else from minijinja-contrib's pycompat.
//!
//! Methods that would change a list or dict (`append`, `update`, `pop`...)
//! stay unknown and fail, as transformers' ImmutableSandboxedEnvironment
//! refuses them with a SecurityError.

use minijinja::value::{Kwargs, Tuple, ValueKind};
use minijinja::{Error, ErrorKind, State, Value};

use crate::json::{py_type_name, type_error};
use crate::python::{self, is_cased, is_space, push_title};

/// The template's arguments to a method, bound to Python parameter names.
struct Args {
    positional: Vec<Value>,
    keyword: Vec<(String, Value)>,
}

impl Args {
    fn new(args: &[Value]) -> Result<Args, Error> {
        let mut positional = args.to_vec();
        let mut keyword = Vec::new();
        if positional.last().is_some_and(Value::is_kwargs) {
            let kwargs = Kwargs::try_from(positional.pop().unwrap_or_default())?;
            for name in kwargs.args() {
                keyword.push((name.to_owned(), kwargs.peek::<Value>(name)?));
            }
        }
        Ok(Args {
            positional,
            keyword,
        })
    }

    /// Binds the arguments to `params` (all optional after `required`);
    /// names in `keywords` may also come by keyword.
    fn bind(
        &self,
        method: &str,
        params: &[&str],
        required: usize,
        keywords: &[&str],
    ) -> Result<Vec<Option<Value>>, Error> {
        if self.positional.len() > params.len() {
            return Err(type_error(format!(
                "{method}() takes at most {} arguments ({} given)",
                params.len(),
                self.positional.len()
            )));
        }
        let mut bound: Vec<Option<Value>> = params.iter().map(|_| None).collect();
        for (slot, v) in bound.iter_mut().zip(&self.positional) {
            *slot = Some(v.clone());
        }
        for (name, v) in &self.keyword {
            let i = params
                .iter()
                .position(|p| p == name)
                .filter(|_| keywords.contains(&name.as_str()))
                .ok_or_else(|| {
                    type_error(format!(
                        "{method}() got an unexpected keyword argument '{name}'"
                    ))
                })?;
            if bound[i].is_some() {
                return Err(type_error(format!(
                    "{method}() got multiple values for argument '{name}'"
                )));
            }
            bound[i] = Some(v.clone());
        }
        if bound[..required].iter().any(Option::is_none) {
            return Err(type_error(format!(
                "{method}() takes at least {required} argument(s)"
            )));
        }
        Ok(bound)
    }
}

/// The unknown-method callback of the environment.
pub(crate) fn call_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        if let Some(rv) = string_method(s, method, &Args::new(args)?)? {
            return Ok(rv);
        }
    }
    if value.kind() == ValueKind::Seq && method == "index" {
        return list_index(value, &Args::new(args)?);
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// A string argument, or Python's TypeError naming what came instead.
fn want_str<'a>(v: &'a Value, what: &str) -> Result<&'a str, Error> {
    v.as_str()
        .ok_or_else(|| type_error(format!("{what} must be str, not {}", py_type_name(v))))
}

/// A bound argument that must be a string.
fn required_str<'a>(v: &'a Option<Value>, what: &str) -> Result<&'a str, Error> {
    want_str(v.as_ref().unwrap_or(&Value::UNDEFINED), what)
}

/// An optional string argument: absent or None gives `None`.
fn opt_str<'a>(v: &'a Option<Value>, what: &str) -> Result<Option<&'a str>, Error> {
    match v {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => want_str(v, what).map(Some),
    }
}

/// An optional integer argument (Python also takes a bool).
fn opt_int(v: &Option<Value>, default: i64) -> Result<i64, Error> {
    match v {
        None => Ok(default),
        Some(v) if v.kind() == ValueKind::Bool => Ok(i64::from(v.is_true())),
        Some(v) if v.is_integer() => i64::try_from(v.clone()),
        Some(v) => Err(type_error(format!(
            "'{}' object cannot be interpreted as an integer",
            py_type_name(v)
        ))),
    }
}

/// The string methods prep implements itself; `None` for the others.
fn string_method(s: &str, method: &str, args: &Args) -> Result<Option<Value>, Error> {
    let rv = match method {
        "strip" | "lstrip" | "rstrip" => {
            let a = args.bind(method, &["chars"], 0, &[])?;
            let chars = opt_str(&a[0], &format!("{method} arg"))?;
            Value::from(strip(s, chars, method != "rstrip", method != "lstrip"))
        }
        "split" | "rsplit" => {
            let a = args.bind(method, &["sep", "maxsplit"], 0, &["sep", "maxsplit"])?;
            let sep = opt_str(&a[0], "sep")?;
            let maxsplit = opt_int(&a[1], -1)?;
            let parts = if method == "split" {
                split(s, sep, maxsplit)?
            } else {
                rsplit(s, sep, maxsplit)?
            };
            Value::from(parts)
        }
        "splitlines" => {
            let a = args.bind(method, &["keepends"], 0, &["keepends"])?;
            let keepends = a[0].as_ref().is_some_and(Value::is_true);
            Value::from(splitlines(s, keepends))
        }
        "startswith" | "endswith" => return affix_test(s, method, args).map(Some),
        "title" => {
            args.bind(method, &[], 0, &[])?;
            Value::from(title(s))
        }
        "capitalize" => {
            args.bind(method, &[], 0, &[])?;
            Value::from(capitalize(s))
        }
        "find" | "rfind" | "index" | "rindex" | "count" => {
            let a = args.bind(method, &["sub", "start", "end"], 1, &[])?;
            let sub = required_str(&a[0], "argument")?;
            let chars: Vec<char> = s.chars().collect();
            let (start, end) = slice_bounds(chars.len(), &a[1], &a[2])?;
            return search(&chars, start, end, sub, method).map(Some);
        }
        _ => return other_string_method(s, method, args),
    };
    Ok(Some(rv))
}

/// The rest of the string methods prep implements itself; `None` for the
/// others.
fn other_string_method(s: &str, method: &str, args: &Args) -> Result<Option<Value>, Error> {
    let rv = match method {
        "join" => {
            let a = args.bind(method, &["iterable"], 1, &[])?;
            let mut out = String::new();
            let items = a[0].as_ref().unwrap_or(&Value::UNDEFINED);
            for (i, item) in items.try_iter()?.enumerate() {
                let item = item.as_str().ok_or_else(|| {
                    type_error(format!(
                        "sequence item {i}: expected str instance, {} found",
                        py_type_name(&item)
                    ))
                })?;
                if i > 0 {
                    out.push_str(s);
                }
                out.push_str(item);
            }
            Value::from(out)
        }
        "isspace" | "isalpha" | "isalnum" | "isdigit" | "isdecimal" | "isnumeric" => {
            args.bind(method, &[], 0, &[])?;
            let class: fn(char) -> bool = match method {
                "isspace" => is_space,
                "isalpha" => python::is_alpha,
                "isalnum" => python::is_alnum,
                "isdigit" => python::is_digit,
                "isdecimal" => python::is_decimal,
                _ => python::is_numeric,
            };
            Value::from(!s.is_empty() && s.chars().all(class))
        }
        "islower" | "isupper" => {
            args.bind(method, &[], 0, &[])?;
            Value::from(python::is_case(s, method == "isupper"))
        }
        "center" | "ljust" | "rjust" => {
            let a = args.bind(method, &["width", "fillchar"], 1, &[])?;
            let width = opt_int(&a[0], 0)?;
            let fill = match opt_str(&a[1], "fillchar")? {
                None => ' ',
                Some(f) if f.chars().count() == 1 => f.chars().next().unwrap_or(' '),
                Some(_) => {
                    return Err(type_error(
                        "The fill character must be exactly one character long".into(),
                    ))
                }
            };
            Value::from(pad(s, width, fill, method))
        }
        "removeprefix" | "removesuffix" => {
            let a = args.bind(method, &["fix"], 1, &[])?;
            let fix = required_str(&a[0], &format!("{method}() argument"))?;
            Value::from(if method == "removeprefix" {
                s.strip_prefix(fix).unwrap_or(s)
            } else {
                s.strip_suffix(fix).unwrap_or(s)
            })
        }
        "partition" | "rpartition" => {
            let a = args.bind(method, &["sep"], 1, &[])?;
            let sep = required_str(&a[0], "separator")?;
            if sep.is_empty() {
                return Err(value_error("empty separator"));
            }
            let found = if method == "partition" {
                s.find(sep)
            } else {
                s.rfind(sep)
            };
            let parts = match found {
                Some(i) => [&s[..i], sep, &s[i + sep.len()..]],
                None if method == "partition" => [s, "", ""],
                None => ["", "", s],
            };
            Value::from(Tuple::from(parts.map(Value::from)))
        }
        _ => return Ok(None),
    };
    Ok(Some(rv))
}

/// `str.center(width, fill)`, `ljust`, `rjust`: CPython puts the odd
/// character of centring on the left when the width is odd.
pub(crate) fn pad(s: &str, width: i64, fill: char, how: &str) -> String {
    let len = s.chars().count() as i64;
    let marg = width - len;
    if marg <= 0 {
        return s.to_owned();
    }
    let left = match how {
        "ljust" => 0,
        "rjust" => marg,
        _ => marg / 2 + (marg & width & 1),
    };
    let mut out = String::with_capacity(s.len() + marg as usize);
    out.extend(std::iter::repeat_n(fill, left as usize));
    out.push_str(s);
    out.extend(std::iter::repeat_n(fill, (marg - left) as usize));
    out
}

/// A Python `ValueError`, as a template error.
fn value_error(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("ValueError: {msg}"))
}

/// `str.strip(chars)`, `lstrip`, `rstrip`: Python whitespace when `chars`
/// is None.
pub(crate) fn strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let strip_it = |c: char| match chars {
        None => is_space(c),
        Some(set) => set.contains(c),
    };
    let mut out = s;
    if left {
        out = out.trim_start_matches(strip_it);
    }
    if right {
        out = out.trim_end_matches(strip_it);
    }
    out
}

/// `str.split(sep, maxsplit)`.
fn split(s: &str, sep: Option<&str>, maxsplit: i64) -> Result<Vec<String>, Error> {
    let max = if maxsplit < 0 {
        usize::MAX
    } else {
        maxsplit as usize
    };
    let Some(sep) = sep else {
        return Ok(split_whitespace(s, max));
    };
    if sep.is_empty() {
        return Err(value_error("empty separator"));
    }
    Ok(s.splitn(max.saturating_add(1), sep)
        .map(String::from)
        .collect())
}

/// `str.rsplit(sep, maxsplit)`.
fn rsplit(s: &str, sep: Option<&str>, maxsplit: i64) -> Result<Vec<String>, Error> {
    let max = if maxsplit < 0 {
        usize::MAX
    } else {
        maxsplit as usize
    };
    let mut parts: Vec<String> = match sep {
        None => {
            let rev: String = s.chars().rev().collect();
            split_whitespace(&rev, max)
                .into_iter()
                .map(|p| p.chars().rev().collect())
                .collect()
        }
        Some("") => return Err(value_error("empty separator")),
        Some(sep) => s
            .rsplitn(max.saturating_add(1), sep)
            .map(String::from)
            .collect(),
    };
    parts.reverse();
    Ok(parts)
}

/// `str.split()` with no separator: runs of Python whitespace separate,
/// and none is kept at either end (the remainder after `max` splits keeps
/// its trailing whitespace, as Python's does).
fn split_whitespace(s: &str, max: usize) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = s.trim_start_matches(is_space);
    while !rest.is_empty() {
        if parts.len() == max {
            parts.push(rest.to_owned());
            break;
        }
        match rest.find(is_space) {
            Some(i) => {
                parts.push(rest[..i].to_owned());
                rest = rest[i..].trim_start_matches(is_space);
            }
            None => {
                parts.push(rest.to_owned());
                break;
            }
        }
    }
    parts
}

/// Whether Python's `splitlines` breaks a line at `c`.
fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r'
            | '\u{b}'
            | '\u{c}'
            | '\u{1c}'
            | '\u{1d}'
            | '\u{1e}'
            | '\u{85}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// `str.splitlines(keepends)`: every Python line boundary, `\r\n` as one.
pub(crate) fn splitlines(s: &str, keepends: bool) -> Vec<String> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut iter = s.char_indices().peekable();
    while let Some((i, c)) = iter.next() {
        if !is_line_break(c) {
            continue;
        }
        let mut end = i + c.len_utf8();
        if c == '\r' && iter.peek().is_some_and(|&(_, n)| n == '\n') {
            iter.next();
            end += 1;
        }
        lines.push(s[start..if keepends { end } else { i }].to_owned());
        start = end;
    }
    if start < s.len() {
        lines.push(s[start..].to_owned());
    }
    lines
}

/// `str.title()`: a character after a cased one is lowered, any other is
/// title-cased.
pub(crate) fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut previous_cased = false;
    for c in s.chars() {
        if previous_cased {
            out.extend(c.to_lowercase());
        } else {
            push_title(&mut out, c);
        }
        previous_cased = is_cased(c);
    }
    out
}

/// `str.capitalize()`: the first character title-cased, the rest lowered.
pub(crate) fn capitalize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    if let Some(c) = chars.next() {
        push_title(&mut out, c);
    }
    for c in chars {
        out.extend(c.to_lowercase());
    }
    out
}

/// `startswith`/`endswith` with a string or a tuple (list) of strings.
fn affix_test(s: &str, method: &str, args: &Args) -> Result<Value, Error> {
    let a = args.bind(method, &["affix", "start", "end"], 1, &[])?;
    let chars: Vec<char> = s.chars().collect();
    let (start, end) = slice_bounds(chars.len(), &a[1], &a[2])?;
    let hay: String = if start <= end {
        chars[start..end].iter().collect()
    } else {
        String::new()
    };
    let test = |affix: &str| {
        if start > chars.len() {
            return false;
        }
        if method == "startswith" {
            hay.starts_with(affix)
        } else {
            hay.ends_with(affix)
        }
    };
    let affix = a[0].as_ref().unwrap_or(&Value::UNDEFINED);
    if let Some(one) = affix.as_str() {
        return Ok(Value::from(test(one)));
    }
    if affix.kind() == ValueKind::Seq {
        for item in affix.try_iter()? {
            let item = item.as_str().ok_or_else(|| {
                type_error(format!(
                    "tuple for {method} must only contain str, not {}",
                    py_type_name(&item)
                ))
            })?;
            if test(item) {
                return Ok(Value::from(true));
            }
        }
        return Ok(Value::from(false));
    }
    Err(type_error(format!(
        "{method} first arg must be str or a tuple of str, not {}",
        py_type_name(affix)
    )))
}

/// Python's clamping of `s[start:end]` bounds, in characters.
fn slice_bounds(
    len: usize,
    start: &Option<Value>,
    end: &Option<Value>,
) -> Result<(usize, usize), Error> {
    // A start past the end stays there (Python then finds nothing, not even
    // the empty string); an end past it is the end.
    let bound = |v: &Option<Value>, default: usize| -> Result<usize, Error> {
        match v {
            None => Ok(default),
            Some(v) if v.is_none() => Ok(default),
            Some(_) => {
                let i = opt_int(v, 0)?;
                Ok(if i < 0 {
                    (len as i64 + i).max(0) as usize
                } else {
                    i as usize
                })
            }
        }
    };
    Ok((bound(start, 0)?, bound(end, len)?.min(len)))
}

/// `find`, `rfind`, `index`, `rindex` and `count` of `sub` in
/// `chars[start..end]`, in character offsets.
fn search(
    chars: &[char],
    start: usize,
    end: usize,
    sub: &str,
    method: &str,
) -> Result<Value, Error> {
    let sub: Vec<char> = sub.chars().collect();
    let sub = &sub[..];
    let hits = || {
        (start..=end.saturating_sub(sub.len())).filter(move |&i| {
            end >= sub.len() && i + sub.len() <= end && chars[i..i + sub.len()] == *sub
        })
    };
    let found = if start > end || start > chars.len() {
        None
    } else {
        match method {
            "count" => {
                if sub.is_empty() {
                    return Ok(Value::from(end - start + 1));
                }
                let mut n = 0;
                let mut i = start;
                while i + sub.len() <= end {
                    if chars[i..i + sub.len()] == *sub {
                        n += 1;
                        i += sub.len();
                    } else {
                        i += 1;
                    }
                }
                return Ok(Value::from(n));
            }
            "find" | "index" => hits().next(),
            _ => hits().next_back(),
        }
    };
    match (found, method) {
        (Some(i), _) => Ok(Value::from(i)),
        (None, "count") => Ok(Value::from(0)),
        (None, "find" | "rfind") => Ok(Value::from(-1)),
        (None, _) => Err(value_error("substring not found")),
    }
}

/// `list.index(x)`.
fn list_index(value: &Value, args: &Args) -> Result<Value, Error> {
    let a = args.bind("index", &["value"], 1, &[])?;
    let want = a[0].clone().unwrap_or_default();
    for (i, item) in value.try_iter()?.enumerate() {
        if item == want {
            return Ok(Value::from(i));
        }
    }
    Err(value_error("value is not in list"))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected outputs came from CPython 3.11.
    #[test]
    fn split_and_strip_as_python() {
        assert_eq!(split("  a b\t\nc  ", None, -1).unwrap(), ["a", "b", "c"]);
        assert_eq!(split("  a b  c  ", None, 1).unwrap(), ["a", "b  c  "]);
        assert_eq!(rsplit("  a b  c  ", None, 1).unwrap(), ["  a b", "c"]);
        assert_eq!(split("a,b,,c", Some(","), -1).unwrap(), ["a", "b", "", "c"]);
        assert_eq!(rsplit("a,b,,c", Some(","), 2).unwrap(), ["a,b", "", "c"]);
        assert_eq!(split("", None, -1).unwrap(), Vec::<String>::new());
        assert_eq!(split("", Some(","), -1).unwrap(), [""]);
        assert_eq!(split("a\u{1c}b\u{a0}c", None, -1).unwrap(), ["a", "b", "c"]);
        assert_eq!(strip("\u{1f} x \u{3000}", None, true, true), "x");
        assert_eq!(strip("xxhixy", Some("xy"), true, false), "hixy");
        assert_eq!(
            splitlines("a\r\nb\rc\u{b}d\u{2028}e\n", true),
            ["a\r\n", "b\r", "c\u{b}", "d\u{2028}", "e\n"]
        );
        assert_eq!(splitlines("a\n\nb", false), ["a", "", "b"]);
    }

    #[test]
    fn case_as_python() {
        // "they're bill's 3rd ǆungla".title() and .capitalize()
        assert_eq!(
            title("they're bill's 3rd ǆungla"),
            "They'Re Bill'S 3Rd ǅungla"
        );
        assert_eq!(capitalize("ǆUNGLA ßig"), "ǅungla ßig");
        assert_eq!(title("ßa"), "Ssa");
    }
}
