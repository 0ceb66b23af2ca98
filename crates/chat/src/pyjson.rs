//! Python-compatible JSON and `repr` formatting.
//!
//! Chat templates were written against Python: transformers' `tojson` filter is
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`, and `{{ value }}` prints `str(value)`. Prompts must match
//! byte for byte (the prefix cache and the model's training both see those
//! bytes), so the separators (`", "` and `": "`), the escaping rules and the
//! float spelling (`1e+20`, `1.5e-07`, `2.0`) are reproduced here instead of
//! using serde_json's compact output.

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};
use std::fmt::Write as _;

/// Options of Python's `json.dumps` that chat templates use.
#[derive(Debug, Clone, Default)]
pub struct DumpOptions {
    /// Escape every non-ASCII character as `\uXXXX` (Python's default is on,
    /// transformers' filter turns it off).
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: newline after every item, `s` repeated per
    /// depth (Python's `indent=2` is `Some("  ")`).
    pub indent: Option<String>,
    /// `(item_separator, key_separator)`; `None` picks Python's defaults, which
    /// depend on whether `indent` is set.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

/// `json.dumps(value, ...)` for a template value.
pub fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let (item_sep, key_sep) = match &opts.separators {
        Some((item, key)) => (item.as_str(), key.as_str()),
        None if opts.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let mut enc = Encoder {
        out: String::new(),
        opts,
        item_sep,
        key_sep,
    };
    enc.value(value, 0)?;
    Ok(enc.out)
}

/// `json.dumps` with transformers' defaults (one line, non-ASCII kept).
pub fn dumps_default(value: &Value) -> Result<String, Error> {
    dumps(value, &DumpOptions::default())
}

struct Encoder<'a> {
    out: String,
    opts: &'a DumpOptions,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl Encoder<'_> {
    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.opts.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    fn value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            // Python would raise on an undefined value; a template that dumps
            // a missing field most plausibly wants `null`.
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(value)?,
            ValueKind::String => {
                let s = value.as_str().unwrap_or_default();
                write_json_str(&mut self.out, s, self.opts.ensure_ascii);
            }
            ValueKind::Map => self.map(value, depth)?,
            ValueKind::Seq | ValueKind::Iterable => self.seq(value, depth)?,
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {kind} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }

    fn number(&mut self, value: &Value) -> Result<(), Error> {
        if value.is_integer() {
            let n = i128::try_from(value.clone())?;
            let _ = write!(self.out, "{n}");
        } else {
            let f = f64::try_from(value.clone())?;
            self.out.push_str(&json_float(f));
        }
        Ok(())
    }

    fn seq(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        let items: Vec<Value> = value.try_iter()?.collect();
        if items.is_empty() {
            self.out.push_str("[]");
            return Ok(());
        }
        self.out.push('[');
        self.newline(depth + 1);
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.out.push_str(self.item_sep);
                self.newline(depth + 1);
            }
            self.value(item, depth + 1)?;
        }
        self.newline(depth);
        self.out.push(']');
        Ok(())
    }

    fn map(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        let mut entries = Vec::new();
        for key in value.try_iter()? {
            let item = value.get_item(&key)?;
            entries.push((json_key(&key)?, item));
        }
        if entries.is_empty() {
            self.out.push_str("{}");
            return Ok(());
        }
        if self.opts.sort_keys {
            entries.sort_by(|a, b| a.0.cmp(&b.0));
        }
        self.out.push('{');
        self.newline(depth + 1);
        for (i, (key, item)) in entries.iter().enumerate() {
            if i > 0 {
                self.out.push_str(self.item_sep);
                self.newline(depth + 1);
            }
            write_json_str(&mut self.out, key, self.opts.ensure_ascii);
            self.out.push_str(self.key_sep);
            self.value(item, depth + 1)?;
        }
        self.newline(depth);
        self.out.push('}');
        Ok(())
    }
}

/// Python converts non-string dict keys the way `json.dumps` does:
/// `True` -> "true", `None` -> "null", numbers by their JSON spelling.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None | ValueKind::Undefined => "null".to_string(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::Number if key.is_integer() => i128::try_from(key.clone())?.to_string(),
        ValueKind::Number => json_float(f64::try_from(key.clone())?),
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("keys must be str, int, float, bool or None, not {kind}"),
            ))
        }
    })
}

/// A JSON string literal with Python's escaping: `"`, `\`, `\n`, `\r`, `\t`,
/// `\b`, `\f` by name, other control characters as `\u00xx`; with
/// `ensure_ascii` everything outside printable ASCII as `\uxxxx` (UTF-16
/// surrogate pairs above the BMP).
pub fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for ch in s.chars() {
        match ch {
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

/// Python's `json.dumps` spelling of a float (`float.__repr__`, with
/// `NaN`/`Infinity` for the non-finite values JSON cannot express).
pub fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".to_string()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string()
    } else {
        py_float_repr(f)
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip (which Rust's
/// formatting also produces), laid out as Python does — positional notation
/// for decimal exponents in `-5 < e < 16`, otherwise `d.ddde+XX`.
pub fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    // `{:e}` gives the shortest round-trip digits as `d.ddde<exp>`.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if f == 0.0 {
        return format!("{sign}0.0");
    }
    if (-5 < exp) && (exp < 16) {
        let mut s = String::from(sign);
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                s.push_str(&digits);
                s.extend(std::iter::repeat_n('0', int_len - digits.len()));
                s.push_str(".0");
            } else {
                s.push_str(&digits[..int_len]);
                s.push('.');
                s.push_str(&digits[int_len..]);
            }
        } else {
            s.push_str("0.");
            s.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            s.push_str(&digits);
        }
        s
    } else {
        let (first, rest) = digits.split_at(1);
        let exp_sign = if exp < 0 { '-' } else { '+' };
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        format!("{sign}{first}{frac}e{exp_sign}{:02}", exp.abs())
    }
}

/// Python's `str(value)` for what `{{ value }}` prints: `None`, `True`,
/// `2.0`, lists and dicts in `repr` form (`['a', None]`), strings verbatim,
/// undefined as the empty string (Jinja2's default `Undefined`).
pub fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        _ => py_repr(value),
    }
}

/// Python's `repr(value)` for template data.
pub fn py_repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, value);
    out
}

fn write_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if !value.is_integer() => match f64::try_from(value.clone()) {
            Ok(f) => out.push_str(&py_float_repr(f)),
            Err(_) => out.push_str(&value.to_string()),
        },
        ValueKind::Seq | ValueKind::Iterable if !value.is_tuple() => {
            out.push('[');
            if let Ok(items) = value.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &item);
                }
            }
            out.push(']');
        }
        ValueKind::Map if value.as_object().is_some() && !value.is_kwargs() => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &key);
                    out.push_str(": ");
                    if let Ok(item) = value.get_item(&key) {
                        write_repr(out, &item);
                    }
                }
            }
            out.push('}');
        }
        // minijinja's Debug output already follows Python's repr for strings
        // (quote choice and escapes), integers, tuples and namespaces.
        _ => {
            let _ = write!(out, "{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (1e20, "1e+20"),
            (1.5e-7, "1.5e-07"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1234567890123456.7, "1234567890123456.8"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (123.456, "123.456"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (100.0, "100.0"),
            (-2.5, "-2.5"),
        ];
        for (f, want) in cases {
            assert_eq!(py_float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn json_escapes_like_python() {
        let mut s = String::new();
        write_json_str(&mut s, "a\"b\\c\n\u{1}\u{7f}é🌍", false);
        assert_eq!(s, "\"a\\\"b\\\\c\\n\\u0001\u{7f}é🌍\"");
        let mut s = String::new();
        write_json_str(&mut s, "é🌍\u{7f}", true);
        assert_eq!(s, "\"\\u00e9\\ud83c\\udf0d\\u007f\"");
    }
}
