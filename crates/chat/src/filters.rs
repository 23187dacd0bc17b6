//! Jinja2's filters where minijinja's give other results than Python's:
//! those that convert with Python's `str()` (`join`, `replace`), Jinja2's
//! own `title` and `indent`, and the number conversions `int`, `float` and
//! `round` with Python's parsing and rounding.

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Value};

use crate::json::{py_type_name, type_error};
use crate::methods::{pad, splitlines};
use crate::python::{self, is_alnum, is_space};

/// Jinja2's `join(value, d='', attribute=None)`: Python `str` of each item.
pub(crate) fn join(value: &Value, d: Option<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let attribute: Option<Value> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    let sep = d.as_ref().map(python::to_str).unwrap_or_default();
    if value.is_undefined() {
        return Ok(String::new());
    }
    let iter = value
        .try_iter()
        .map_err(|_| type_error(format!("'{}' object is not iterable", py_type_name(value))))?;
    let mut out = String::new();
    for (i, item) in iter.enumerate() {
        if i > 0 {
            out.push_str(&sep);
        }
        let item = match &attribute {
            Some(attr) => get_path(&item, attr),
            None => item,
        };
        python::push_str(&mut out, &item);
    }
    Ok(out)
}

/// Jinja2's attribute getter: `a.b.0` walks items by name (and by index for
/// integers); a missing one is undefined.
fn get_path(item: &Value, attr: &Value) -> Value {
    let Some(path) = attr.as_str() else {
        return item.get_item(attr).unwrap_or_default();
    };
    let mut v = item.clone();
    for part in path.split('.') {
        let key = match part.parse::<i64>() {
            Ok(n) => Value::from(n),
            Err(_) => Value::from(part),
        };
        v = v.get_item(&key).unwrap_or_default();
    }
    v
}

/// Jinja2's `replace(s, old, new, count=None)` on `str(s)`.
pub(crate) fn replace(
    s: &Value,
    old: &Value,
    new: &Value,
    count: Option<Value>,
) -> Result<String, Error> {
    let (s, old, new) = (python::to_str(s), python::to_str(old), python::to_str(new));
    let count = match count.filter(|c| !c.is_none()) {
        None => -1,
        Some(c) => i64::try_from(c)?,
    };
    Ok(if count < 0 {
        s.replace(&old, &new)
    } else {
        s.replacen(&old, &new, count as usize)
    })
}

/// Jinja2's `title` filter (not `str.title`): each word after `-`, space,
/// `(`, `{`, `[` or `<` gets its first character upper-cased and the rest
/// lowered.
pub(crate) fn jinja_title(s: &str) -> String {
    let is_sep = |c: char| is_space(c) || matches!(c, '-' | '(' | '{' | '[' | '<');
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while !rest.is_empty() {
        let n = rest.find(|c: char| !is_sep(c)).unwrap_or(rest.len());
        let (seps, tail) = rest.split_at(n);
        let m = tail.find(is_sep).unwrap_or(tail.len());
        let (word, tail) = tail.split_at(m);
        for item in [seps, word] {
            let mut chars = item.chars();
            if let Some(c) = chars.next() {
                out.extend(c.to_uppercase());
                out.extend(chars.flat_map(char::to_lowercase));
            }
        }
        rest = tail;
    }
    out
}

/// Jinja2's `indent(s, width=4, first=False, blank=False)`.
pub(crate) fn indent(s: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let mut given: [Option<Value>; 3] = Default::default();
    for (slot, a) in given.iter_mut().zip(args.iter()) {
        *slot = Some(a.clone());
    }
    for (i, name) in ["width", "first", "blank"].iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            given[i] = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let Some(s) = s.as_str() else {
        return Err(type_error(format!(
            "unsupported operand type(s) for +=: '{}' and 'str'",
            py_type_name(s)
        )));
    };
    let [width, first, blank] = given;
    let indention = match &width {
        None => "    ".to_owned(),
        Some(w) if w.as_str().is_some() => w.as_str().unwrap_or_default().to_owned(),
        Some(w) if w.kind() == ValueKind::Bool || w.is_integer() => " ".repeat(
            i64::try_from(w.clone())
                .unwrap_or(i64::from(w.is_true()))
                .max(0) as usize,
        ),
        Some(w) => {
            return Err(type_error(format!(
                "can't multiply sequence by non-int of type '{}'",
                py_type_name(w)
            )))
        }
    };
    let s = format!("{s}\n");
    let mut rv = if blank.is_some_and(|b| b.is_true()) {
        splitlines(&s, false).join(&format!("\n{indention}"))
    } else {
        let lines = splitlines(&s, false);
        let mut rv = lines[0].clone();
        if lines.len() > 1 {
            rv.push('\n');
            let rest: Vec<String> = lines[1..]
                .iter()
                .map(|l| {
                    if l.is_empty() {
                        String::new()
                    } else {
                        format!("{indention}{l}")
                    }
                })
                .collect();
            rv.push_str(&rest.join("\n"));
        }
        rv
    };
    if first.is_some_and(|f| f.is_true()) {
        rv.insert_str(0, &indention);
    }
    Ok(rv)
}

/// Jinja2's `int(value, default=0, base=10)`: Python's `int(value)`, else
/// `int(float(value))`, else the default.
pub(crate) fn int(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let [default, base] = bind2(&args, &kwargs, ["default", "base"])?;
    if base.as_ref().is_some_and(|b| b.as_i64() != Some(10)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "int: prep supports only base 10",
        ));
    }
    let default = default.unwrap_or(Value::from(0));
    let from_float = |x: f64| -> Option<Value> {
        (x.is_finite() && x.abs() < 1.7e38).then(|| Value::from(x.trunc() as i128))
    };
    let rv = match value.kind() {
        ValueKind::Bool => Some(Value::from(i64::from(value.is_true()))),
        ValueKind::Number if value.is_integer() => Some(value.clone()),
        ValueKind::Number => f64::try_from(value.clone()).ok().and_then(from_float),
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            parse_int(s).or_else(|| parse_float(s).and_then(from_float))
        }
        _ => None,
    };
    Ok(rv.unwrap_or(default))
}

/// Jinja2's `float(value, default=0.0)`: Python's `float(value)`, else the
/// default.
pub(crate) fn float(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let [default, _] = bind2(&args, &kwargs, ["default", ""])?;
    let rv = match value.kind() {
        ValueKind::Bool => Some(if value.is_true() { 1.0 } else { 0.0 }),
        ValueKind::Number => f64::try_from(value.clone()).ok(),
        ValueKind::String => parse_float(value.as_str().unwrap_or_default()),
        _ => None,
    };
    Ok(rv
        .map(Value::from)
        .unwrap_or(default.unwrap_or(Value::from(0.0))))
}

/// Jinja2's `round(value, precision=0, method='common')`: Python's
/// `round(value, precision)` (halves to even, on the exact binary value),
/// or `math.ceil`/`math.floor` of `value * 10**precision` over the same.
pub(crate) fn round(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let [precision, method] = bind2(&args, &kwargs, ["precision", "method"])?;
    let precision = match &precision {
        None => 0,
        Some(p) => p
            .as_i64()
            .ok_or_else(|| type_error("precision must be an integer".into()))?,
    };
    let method = method
        .as_ref()
        .map(python::to_str)
        .unwrap_or_else(|| "common".into());
    if value.is_integer() && method == "common" && precision >= 0 {
        return Ok(value.clone());
    }
    let x = f64::try_from(value.clone()).map_err(|_| {
        type_error(format!(
            "type {} doesn't define __round__ method",
            py_type_name(value)
        ))
    })?;
    let scale = 10f64.powi(precision as i32);
    let rv = match method.as_str() {
        "common" if (0..=300).contains(&precision) => format!("{x:.*}", precision as usize)
            .parse::<f64>()
            .unwrap_or(x),
        "common" => (x * scale).round_ties_even() / scale,
        "ceil" => (x * scale).ceil() / scale,
        "floor" => (x * scale).floor() / scale,
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "method must be common, ceil or floor",
            ))
        }
    };
    Ok(Value::from(rv))
}

/// Two optional parameters, positional or by name (an empty name takes no
/// keyword).
fn bind2(args: &[Value], kwargs: &Kwargs, names: [&str; 2]) -> Result<[Option<Value>; 2], Error> {
    if args.len() > 2 {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let mut out: [Option<Value>; 2] = [args.first().cloned(), args.get(1).cloned()];
    for (slot, name) in out.iter_mut().zip(names) {
        if !name.is_empty() {
            if let Some(v) = kwargs.get::<Option<Value>>(name)? {
                *slot = Some(v);
            }
        }
    }
    kwargs.assert_all_used()?;
    Ok(out)
}

/// Python's digits with single underscores between them, which `int()` and
/// `float()` take; `None` if the underscores are elsewhere.
fn without_underscores(s: &str) -> Option<String> {
    let b = s.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c == b'_' {
            let ok =
                i > 0 && i + 1 < b.len() && b[i - 1].is_ascii_digit() && b[i + 1].is_ascii_digit();
            if !ok {
                return None;
            }
        }
    }
    Some(s.replace('_', ""))
}

/// Python's `int(s)` in base 10 (whitespace around, a sign, ASCII digits).
fn parse_int(s: &str) -> Option<Value> {
    let t = without_underscores(s.trim_matches(is_space))?;
    let digits = t.strip_prefix(['+', '-']).unwrap_or(&t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse::<i128>().ok().map(Value::from)
}

/// Python's `float(s)` (whitespace around, `inf`, `nan`, exponents).
fn parse_float(s: &str) -> Option<f64> {
    let t = without_underscores(s.trim_matches(is_space))?;
    let body = t
        .strip_prefix(['+', '-'])
        .unwrap_or(&t)
        .to_ascii_lowercase();
    let named = matches!(body.as_str(), "inf" | "infinity" | "nan");
    let numeric = !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'+' | b'-'))
        && body.bytes().any(|b| b.is_ascii_digit());
    if named || numeric {
        t.parse::<f64>().ok()
    } else {
        None
    }
}

/// Jinja2's `center(value, width=80)`: `str(value).center(width)`.
pub(crate) fn center(value: &Value, width: Option<i64>) -> String {
    pad(&python::to_str(value), width.unwrap_or(80), ' ', "center")
}

/// Jinja2's `wordcount(s)`: the runs of `\w` (Python's alphanumerics and
/// `_`) in `str(s)`.
pub(crate) fn wordcount(value: &Value) -> usize {
    let s = python::to_str(value);
    let mut count = 0;
    let mut in_word = false;
    for c in s.chars() {
        let word = c == '_' || is_alnum(c);
        if word && !in_word {
            count += 1;
        }
        in_word = word;
    }
    count
}

/// Jinja2's `truncate(s, length=255, killwords=False, end='...',
/// leeway=None)` (leeway 5, the default policy).
pub(crate) fn truncate(s: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let names = ["length", "killwords", "end", "leeway"];
    if args.len() > names.len() {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let mut given: [Option<Value>; 4] = Default::default();
    for (slot, a) in given.iter_mut().zip(args.iter()) {
        *slot = Some(a.clone());
    }
    for (slot, name) in given.iter_mut().zip(names) {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            *slot = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let [length, killwords, end, leeway] = given;
    if s.is_undefined() {
        return Ok(s.clone());
    }
    let length = length.map_or(Ok(255), i64::try_from)?;
    let end = end
        .as_ref()
        .map(python::to_str)
        .unwrap_or_else(|| "...".into());
    let leeway = leeway
        .filter(|v| !v.is_none())
        .map_or(Ok(5), i64::try_from)?;
    let end_len = end.chars().count() as i64;
    if length < end_len || leeway < 0 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("AssertionError: expected length >= {end_len}, got {length}"),
        ));
    }
    let len = match s.as_str() {
        Some(text) => text.chars().count(),
        None => s.len().ok_or_else(|| {
            type_error(format!("object of type '{}' has no len()", py_type_name(s)))
        })?,
    };
    if len as i64 <= length + leeway {
        return Ok(s.clone());
    }
    // Past the length, Python slices and splits: only a string has `rsplit`.
    let text = s.as_str().ok_or_else(|| {
        type_error(format!(
            "'{}' object has no attribute 'rsplit'",
            py_type_name(s)
        ))
    })?;
    let chars: Vec<char> = text.chars().collect();
    let head: String = chars[..(length - end_len) as usize].iter().collect();
    let head = if killwords.is_some_and(|k| k.is_true()) {
        head
    } else {
        head.rsplit_once(' ')
            .map_or(head.clone(), |(h, _)| h.to_owned())
    };
    Ok(Value::from(head + &end))
}

/// markupsafe's `escape`: `&`, `<`, `>`, `"` and `'` as entities, on
/// `str(value)`; a string already marked safe is left alone unless `force`.
pub(crate) fn escape(value: &Value, force: bool) -> Value {
    if value.is_safe() && !force {
        return value.clone();
    }
    let s = python::to_str(value);
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    Value::from_safe_string(out)
}

/// Jinja2's `default(value, default_value='', boolean=False)`: the default
/// for an undefined value, or with `boolean` for any false one.
pub(crate) fn default(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let [fallback, boolean] = bind2(&args, &kwargs, ["default_value", "boolean"])?;
    let boolean = boolean.is_some_and(|b| b.is_true());
    if value.is_undefined() || (boolean && !value.is_true()) {
        Ok(fallback.unwrap_or_else(|| Value::from("")))
    } else {
        Ok(value.clone())
    }
}
