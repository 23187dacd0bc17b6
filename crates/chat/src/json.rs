//! The `tojson` filter as transformers defines it: Python's `json.dumps(x,
//! ensure_ascii=False, indent=indent, separators=separators,
//! sort_keys=sort_keys)`, not Jinja2's HTML-safe `tojson` nor serde_json's
//! compact form.

use std::fmt::Write;

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Value};

use crate::python::{float_repr, is_dict};

/// How `json.dumps` was asked to write.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    /// Escape every character outside printable ASCII as `\uXXXX`.
    pub ensure_ascii: bool,
    /// The indent of one level; `None` writes everything on one line.
    pub indent: Option<String>,
    /// Between items (`", "` on one line, `","` when indented).
    pub item_separator: String,
    /// Between a key and its value (`": "`).
    pub key_separator: String,
    /// Write object keys sorted, not in insertion order.
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    /// `json.dumps(x, ensure_ascii=False)`.
    fn default() -> DumpOptions {
        DumpOptions {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }
}

/// The filter: `x | tojson`, `tojson(indent=4)`, and the positional form
/// `tojson(ensure_ascii, indent, separators, sort_keys)` of transformers'
/// signature.
pub(crate) fn tojson_filter(
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(type_error(format!(
            "tojson() takes from 1 to 5 positional arguments but {} were given",
            args.len() + 1
        )));
    }
    let mut given: [Option<Value>; 4] = Default::default();
    for (slot, arg) in given.iter_mut().zip(args.iter()) {
        *slot = Some(arg.clone());
    }
    for (i, name) in NAMES.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            if given[i].is_some() {
                return Err(type_error(format!(
                    "tojson() got multiple values for argument '{name}'"
                )));
            }
            given[i] = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = given;
    let indent = match indent.filter(|v| !v.is_none()) {
        None => None,
        Some(v) => Some(indent_string(&v)?),
    };
    let (item_separator, key_separator) = match separators.filter(|v| !v.is_none()) {
        Some(v) => separator_pair(&v)?,
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let opts = DumpOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    dumps(value, &opts)
}

/// `' ' * indent` for an integer (or bool), the string itself for a string.
fn indent_string(v: &Value) -> Result<String, Error> {
    if let Some(s) = v.as_str() {
        return Ok(s.to_owned());
    }
    if v.kind() == ValueKind::Bool {
        return Ok(if v.is_true() { " " } else { "" }.to_owned());
    }
    if v.is_integer() {
        let n = i64::try_from(v.clone()).unwrap_or(0);
        return Ok(" ".repeat(n.max(0) as usize));
    }
    Err(type_error(format!(
        "can't multiply sequence by non-int of type '{}'",
        py_type_name(v)
    )))
}

/// The two strings of `separators=(item, key)`.
fn separator_pair(v: &Value) -> Result<(String, String), Error> {
    let items: Vec<Value> = v
        .try_iter()
        .map_err(|_| type_error("cannot unpack non-iterable separators".into()))?
        .collect();
    match items.as_slice() {
        [a, b] => match (a.as_str(), b.as_str()) {
            (Some(a), Some(b)) => Ok((a.to_owned(), b.to_owned())),
            _ => Err(type_error("separators must be strings".into())),
        },
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("ValueError: expected 2 separators, got {}", items.len()),
        )),
    }
}

/// Python's `json.dumps(value, ...)` with `opts`.
pub fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, opts, 0)?;
    Ok(out)
}

fn write_value(
    out: &mut String,
    value: &Value,
    opts: &DumpOptions,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::String => {
            write_string(out, value.as_str().unwrap_or_default(), opts.ensure_ascii)
        }
        ValueKind::Number => write_number(out, value),
        // Lists, tuples and minijinja's lazy sequences (slices among them).
        // Python refuses its iterators (`d.items()`, `range()`, `reverse`),
        // which minijinja does not tell apart from lists: prep writes them.
        ValueKind::Seq | ValueKind::Iterable if value.as_object().is_some() => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_array(out, &items, opts, depth)?;
        }
        ValueKind::Map if is_dict(value) => write_object(out, value, opts, depth)?,
        _ => {
            return Err(type_error(format!(
                "Object of type {} is not JSON serializable",
                py_type_name(value)
            )))
        }
    }
    Ok(())
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let x = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if x.is_nan() {
        out.push_str("NaN");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        out.push_str(&float_repr(x));
    }
}

/// The newline and indent before an item at `depth`, when indenting.
fn newline_indent(out: &mut String, opts: &DumpOptions, depth: usize) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_array(
    out: &mut String,
    items: &[Value],
    opts: &DumpOptions,
    depth: usize,
) -> Result<(), Error> {
    if items.is_empty() {
        out.push_str("[]");
        return Ok(());
    }
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_separator);
        }
        newline_indent(out, opts, depth + 1);
        write_value(out, item, opts, depth + 1)?;
    }
    newline_indent(out, opts, depth);
    out.push(']');
    Ok(())
}

fn write_object(
    out: &mut String,
    value: &Value,
    opts: &DumpOptions,
    depth: usize,
) -> Result<(), Error> {
    let mut keys: Vec<Value> = value.try_iter()?.collect();
    if keys.is_empty() {
        out.push_str("{}");
        return Ok(());
    }
    if opts.sort_keys {
        sort_keys(&mut keys)?;
    }
    out.push('{');
    for (i, key) in keys.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_separator);
        }
        newline_indent(out, opts, depth + 1);
        write_string(out, &key_string(key)?, opts.ensure_ascii);
        out.push_str(&opts.key_separator);
        write_value(out, &value.get_item(key)?, opts, depth + 1)?;
    }
    newline_indent(out, opts, depth);
    out.push('}');
    Ok(())
}

/// `sorted(d.items())`: keys of one kind compare; strings by code point.
fn sort_keys(keys: &mut [Value]) -> Result<(), Error> {
    let first = keys[0].kind();
    if keys.iter().any(|k| k.kind() != first) {
        return Err(type_error(
            "'<' not supported between instances of mixed key types".into(),
        ));
    }
    keys.sort();
    Ok(())
}

/// The text of an object key: strings as they are, numbers, booleans and
/// None as `json.dumps` converts them.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key);
            Ok(s)
        }
        _ => Err(type_error(format!(
            "keys must be str, int, float, bool or None, not {}",
            py_type_name(key)
        ))),
    }
}

/// A JSON string literal, escaped as `json.dumps` escapes it.
pub(crate) fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's type name for a template value, for error messages.
pub(crate) fn py_type_name(value: &Value) -> &'static str {
    match value.kind() {
        ValueKind::Undefined => "Undefined",
        ValueKind::None => "NoneType",
        ValueKind::Bool => "bool",
        ValueKind::Number if value.is_integer() => "int",
        ValueKind::Number => "float",
        ValueKind::String => "str",
        ValueKind::Bytes => "bytes",
        ValueKind::Seq => "list",
        ValueKind::Map => "dict",
        _ => "object",
    }
}

/// A Python `TypeError`, as a template error.
pub(crate) fn type_error(msg: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("TypeError: {msg}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// JSON text of a value with every kind json.dumps writes.
    const SRC: &str = "{\"k\": \"it's\", \"n\": 1, \"f\": 1e-05, \"big\": 1e16, \"neg\": -0.0, \"l\": [1, 2.5, null, true, false], \"e\": {}, \"el\": [], \"s\": \"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\\u007f é 中 😀 <&>\", \"nested\": {\"a\": [{\"b\": null}]}}";

    fn dump(opts: DumpOptions) -> String {
        dumps(&crate::value_from_json(SRC).unwrap(), &opts).unwrap()
    }

    // Expected outputs came from CPython 3.11's json.dumps(json.loads(SRC), ...).
    #[test]
    fn dumps_as_python() {
        // ensure_ascii=False (transformers' tojson)
        assert_eq!(dump(DumpOptions::default()), "{\"k\": \"it's\", \"n\": 1, \"f\": 1e-05, \"big\": 1e+16, \"neg\": -0.0, \"l\": [1, 2.5, null, true, false], \"e\": {}, \"el\": [], \"s\": \"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\u{7f} é 中 😀 <&>\", \"nested\": {\"a\": [{\"b\": null}]}}");
        // indent=2
        let indent = DumpOptions {
            indent: Some("  ".into()),
            item_separator: ",".into(),
            ..DumpOptions::default()
        };
        assert_eq!(dump(indent), "{\n  \"k\": \"it's\",\n  \"n\": 1,\n  \"f\": 1e-05,\n  \"big\": 1e+16,\n  \"neg\": -0.0,\n  \"l\": [\n    1,\n    2.5,\n    null,\n    true,\n    false\n  ],\n  \"e\": {},\n  \"el\": [],\n  \"s\": \"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\u{7f} é 中 😀 <&>\",\n  \"nested\": {\n    \"a\": [\n      {\n        \"b\": null\n      }\n    ]\n  }\n}");
        // ensure_ascii=True
        let ascii = DumpOptions {
            ensure_ascii: true,
            ..DumpOptions::default()
        };
        assert_eq!(dump(ascii), "{\"k\": \"it's\", \"n\": 1, \"f\": 1e-05, \"big\": 1e+16, \"neg\": -0.0, \"l\": [1, 2.5, null, true, false], \"e\": {}, \"el\": [], \"s\": \"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\\u007f \\u00e9 \\u4e2d \\ud83d\\ude00 <&>\", \"nested\": {\"a\": [{\"b\": null}]}}");
        // separators=(',', ':'), sort_keys=True
        let compact = DumpOptions {
            item_separator: ",".into(),
            key_separator: ":".into(),
            sort_keys: true,
            ..DumpOptions::default()
        };
        assert_eq!(dump(compact), "{\"big\":1e+16,\"e\":{},\"el\":[],\"f\":1e-05,\"k\":\"it's\",\"l\":[1,2.5,null,true,false],\"n\":1,\"neg\":-0.0,\"nested\":{\"a\":[{\"b\":null}]},\"s\":\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\u{7f} é 中 😀 <&>\"}");
    }

    // Expected output came from CPython 3.11's str(json.loads(SRC)).
    #[test]
    fn str_as_python() {
        let v = crate::value_from_json(SRC).unwrap();
        assert_eq!(crate::python::to_str(&v), "{'k': \"it's\", 'n': 1, 'f': 1e-05, 'big': 1e+16, 'neg': -0.0, 'l': [1, 2.5, None, True, False], 'e': {}, 'el': [], 's': 'a\"b\\\\c\\n\\r\\t\\x08\\x0c\\x01\\x1f\\x7f é 中 😀 <&>', 'nested': {'a': [{'b': None}]}}");
    }
}
