//! JSON text to template values as Python's `json.loads` reads it, so that a
//! conversation read by prep is the one transformers would see: objects keep
//! their key order (a repeated key keeps its first place and its last value),
//! integers stay integers (`-0` is `0`), other numbers are floats rounded as
//! `float()` rounds them (`1e400` is `inf`), and `NaN`, `Infinity` and
//! `-Infinity` are read.

use minijinja::Value;

/// How deep arrays and objects may nest (Python stops at its recursion
/// limit, about a thousand).
const MAX_DEPTH: usize = 512;

/// Parses `text` (see the module docs). Errors name the byte offset.
pub fn parse(text: &str) -> Result<Value, String> {
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        pos: 0,
        depth: 0,
    };
    p.skip_ws();
    let v = p.value()?;
    p.skip_ws();
    if p.pos != p.s.len() {
        return Err(p.err("extra data"));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn err(&self, what: &str) -> String {
        format!("{what} at byte {}", self.pos)
    }

    fn skip_ws(&mut self) {
        while matches!(self.s.get(self.pos), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.text[self.pos..].starts_with(lit) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<Value, String> {
        match self.s.get(self.pos) {
            Some(b'{') => self.nested(Self::object),
            Some(b'[') => self.nested(Self::array),
            Some(b'"') => Ok(Value::from(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ if self.eat("true") => Ok(Value::from(true)),
            _ if self.eat("false") => Ok(Value::from(false)),
            _ if self.eat("null") => Ok(Value::from(())),
            _ if self.eat("NaN") => Ok(Value::from(f64::NAN)),
            _ if self.eat("Infinity") => Ok(Value::from(f64::INFINITY)),
            _ => Err(self.err("expecting value")),
        }
    }

    fn nested(&mut self, f: fn(&mut Self) -> Result<Value, String>) -> Result<Value, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err("nested too deep"));
        }
        let v = f(self);
        self.depth -= 1;
        v
    }

    fn object(&mut self) -> Result<Value, String> {
        self.pos += 1;
        let mut pairs: Vec<(Value, Value)> = Vec::new();
        self.skip_ws();
        if self.eat("}") {
            return Ok(Value::from_pairs(pairs));
        }
        loop {
            self.skip_ws();
            if self.s.get(self.pos) != Some(&b'"') {
                return Err(self.err("expecting property name enclosed in double quotes"));
            }
            let key = Value::from(self.string()?);
            self.skip_ws();
            if !self.eat(":") {
                return Err(self.err("expecting ':' delimiter"));
            }
            self.skip_ws();
            let value = self.value()?;
            pairs.push((key, value));
            self.skip_ws();
            if self.eat("}") {
                // Value::from_pairs keeps a repeated key's first place and
                // last value, as a Python dict does.
                return Ok(Value::from_pairs(pairs));
            }
            if !self.eat(",") {
                return Err(self.err("expecting ',' delimiter"));
            }
        }
    }

    fn array(&mut self) -> Result<Value, String> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.eat("]") {
            return Ok(Value::from(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value()?);
            self.skip_ws();
            if self.eat("]") {
                return Ok(Value::from(items));
            }
            if !self.eat(",") {
                return Err(self.err("expecting ',' delimiter"));
            }
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?`, or `-Infinity`.
    fn number(&mut self) -> Result<Value, String> {
        let start = self.pos;
        if self.eat("-Infinity") {
            return Ok(Value::from(f64::NEG_INFINITY));
        }
        self.eat("-");
        let digits = |p: &mut Self| {
            let from = p.pos;
            while p.s.get(p.pos).is_some_and(u8::is_ascii_digit) {
                p.pos += 1;
            }
            p.pos - from
        };
        match self.s.get(self.pos) {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(self.err("expecting value")),
        }
        let mut float = false;
        if self.s.get(self.pos) == Some(&b'.')
            && self.s.get(self.pos + 1).is_some_and(u8::is_ascii_digit)
        {
            self.pos += 1;
            digits(self);
            float = true;
        }
        if matches!(self.s.get(self.pos), Some(b'e' | b'E')) {
            let mark = self.pos;
            self.pos += 1;
            if matches!(self.s.get(self.pos), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if digits(self) == 0 {
                self.pos = mark;
            } else {
                float = true;
            }
        }
        let lit = &self.text[start..self.pos];
        if float {
            return lit
                .parse::<f64>()
                .map(Value::from)
                .map_err(|_| self.err("bad number"));
        }
        if let Ok(n) = lit.parse::<i64>() {
            return Ok(Value::from(n));
        }
        if let Ok(n) = lit.parse::<u64>() {
            return Ok(Value::from(n));
        }
        if let Ok(n) = lit.parse::<i128>() {
            return Ok(Value::from(n));
        }
        if let Ok(n) = lit.parse::<u128>() {
            return Ok(Value::from(n));
        }
        Err(self.err("integer too large for prep (Python keeps it exact)"))
    }

    fn string(&mut self) -> Result<String, String> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let run = self.pos;
            while self
                .s
                .get(self.pos)
                .is_some_and(|&b| b != b'"' && b != b'\\' && b >= 0x20)
            {
                self.pos += 1;
            }
            out.push_str(&self.text[run..self.pos]);
            match self.s.get(self.pos) {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    self.escape(&mut out)?;
                }
                Some(_) => return Err(self.err("invalid control character")),
                None => return Err(self.err("unterminated string")),
            }
        }
    }

    fn escape(&mut self, out: &mut String) -> Result<(), String> {
        let c = self.s.get(self.pos).copied();
        self.pos += 1;
        match c {
            Some(b'"') => out.push('"'),
            Some(b'\\') => out.push('\\'),
            Some(b'/') => out.push('/'),
            Some(b'b') => out.push('\u{8}'),
            Some(b'f') => out.push('\u{c}'),
            Some(b'n') => out.push('\n'),
            Some(b'r') => out.push('\r'),
            Some(b't') => out.push('\t'),
            Some(b'u') => {
                let hi = self.hex4()?;
                let cp =
                    if (0xD800..0xDC00).contains(&hi) && self.text[self.pos..].starts_with("\\u") {
                        let save = self.pos;
                        self.pos += 2;
                        let lo = self.hex4()?;
                        if (0xDC00..0xE000).contains(&lo) {
                            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                        } else {
                            self.pos = save;
                            hi
                        }
                    } else {
                        hi
                    };
                let c = char::from_u32(cp)
                    .ok_or_else(|| self.err("a lone surrogate, which prep cannot hold"))?;
                out.push(c);
            }
            _ => return Err(self.err("invalid \\escape")),
        }
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let hex = self
            .text
            .get(self.pos..self.pos + 4)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| self.err("invalid \\uXXXX escape"))?;
        self.pos += 4;
        u32::from_str_radix(hex, 16).map_err(|_| self.err("invalid \\uXXXX escape"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::to_str;

    // Expected outputs came from CPython 3.11: str(json.loads(text)).
    #[test]
    fn reads_as_python() {
        for (text, want) in [
            ("-0", "0"),
            ("-0.0", "-0.0"),
            ("1E5", "100000.0"),
            (r#"{"a": 1, "b": 2, "a": 3}"#, "{'a': 3, 'b': 2}"),
            ("18446744073709551615", "18446744073709551615"),
            ("18446744073709551616", "18446744073709551616"),
            ("-9223372036854775809", "-9223372036854775809"),
            ("1e400", "inf"),
            ("[NaN, Infinity, -Infinity]", "[nan, inf, -inf]"),
            (
                r#" {"s": "\u00e9\ud83d\ude00\n\/\"", "e": [], "o": {}} "#,
                "{'s': 'é😀\\n/\"', 'e': [], 'o': {}}",
            ),
            (
                "[1.5, 2, true, false, null, 1e-7, 0.1]",
                "[1.5, 2, True, False, None, 1e-07, 0.1]",
            ),
        ] {
            assert_eq!(to_str(&parse(text).unwrap()), want, "{text}");
        }
        for bad in [
            "",
            "[1,]",
            "{\"a\" 1}",
            "01",
            "\"a\u{1}\"",
            "[1] x",
            "\"\\ud800\"",
            "1.",
            "tru",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
