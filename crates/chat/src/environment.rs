//! A minijinja environment that behaves like transformers' chat-template
//! environment (`ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols])` plus its
//! `tojson`, `raise_exception` and `strftime_now`).
//!
//! Templates on the Hub are Python-flavoured Jinja: they call `str` methods
//! (`.startswith`, `.split`, `.strip('\n')`), print Python values (`None`,
//! `True`) and expect `json.dumps` spacing. Each of those is reproduced here so
//! a template renders the same bytes it renders under transformers.

use crate::pyjson::{self, DumpOptions};
use crate::strftime::{strftime, UtcTime};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{from_args, Kwargs, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, Value};

/// The error `raise_exception(message)` throws, kept as the minijinja error's
/// source so the template's own message can be reported without the engine's
/// decoration.
#[derive(Debug)]
pub(crate) struct RaisedException(pub String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

/// Builds the environment. Templates are added by the caller.
pub(crate) fn chat_environment() -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            // Jinja2's default: one trailing newline of the template is dropped.
            .keep_trailing_newline(false)
            .build()?,
    );
    // transformers renders with autoescape off; minijinja would otherwise pick
    // HTML escaping for names ending in `.html` and friends.
    env.set_auto_escape_callback(|_| AutoEscape::None);
    // Missing attributes must be falsy / "is not defined" as in Jinja2.
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Lenient);
    env.set_formatter(|out, _state, value| {
        out.write_str(&pyjson::py_str(value))
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "cannot write template output"))
    });
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |format: &str| {
        strftime(format, &UtcTime::now())
    });
    env.set_unknown_method_callback(python_methods);
    Ok(env)
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let mut opts = DumpOptions::default();
    if let Some(flag) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        opts.ensure_ascii = flag;
    }
    let indent: Option<Value> = kwargs.get("indent")?;
    opts.indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().into()),
        Some(v) => {
            let n = v.as_usize().ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an int or a string",
                )
            })?;
            Some(" ".repeat(n))
        }
    };
    let separators: Option<Value> = kwargs.get("separators")?;
    if let Some(seps) = separators.filter(|v| !v.is_none()) {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        match parts.as_slice() {
            [item, key] => {
                opts.separators = Some((
                    item.as_str().unwrap_or_default().to_string(),
                    key.as_str().unwrap_or_default().to_string(),
                ))
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be an (item_separator, key_separator) pair",
                ))
            }
        }
    }
    if let Some(flag) = kwargs.get::<Option<bool>>("sort_keys")? {
        opts.sort_keys = flag;
    }
    kwargs.assert_all_used()?;
    Ok(Value::from(pyjson::dumps(value, &opts)?))
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

/// Python `str` methods missing from minijinja-contrib's `pycompat`, then
/// everything `pycompat` implements (`startswith`, `split`, `strip`, ...).
fn python_methods(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        match method {
            "rsplit" => {
                let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
                return rsplit(s, sep, maxsplit.unwrap_or(-1));
            }
            "removeprefix" => {
                let (prefix,): (&str,) = from_args(args)?;
                return Ok(Value::from(s.strip_prefix(prefix).unwrap_or(s)));
            }
            "removesuffix" => {
                let (suffix,): (&str,) = from_args(args)?;
                return Ok(Value::from(s.strip_suffix(suffix).unwrap_or(s)));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Python's `str.rsplit(sep=None, maxsplit=-1)`.
fn rsplit(s: &str, sep: Option<&str>, maxsplit: i64) -> Result<Value, Error> {
    let limit = if maxsplit < 0 {
        usize::MAX
    } else {
        maxsplit as usize
    };
    let mut parts: Vec<&str> = match sep {
        Some("") => {
            return Err(Error::new(ErrorKind::InvalidOperation, "empty separator"));
        }
        Some(sep) => s.rsplitn(limit.saturating_add(1), sep).collect(),
        None => {
            // Whitespace form: runs of whitespace separate, leading/trailing
            // whitespace yields no empty strings.
            let mut parts = Vec::new();
            let mut rest = s.trim_end();
            while !rest.is_empty() {
                if parts.len() == limit {
                    parts.push(rest);
                    break;
                }
                match rest.rfind(char::is_whitespace) {
                    Some(i) => {
                        let ws_len = rest[i..].chars().next().map_or(1, char::len_utf8);
                        parts.push(&rest[i + ws_len..]);
                        rest = rest[..i].trim_end();
                    }
                    None => {
                        parts.push(rest);
                        rest = "";
                    }
                }
            }
            parts
        }
    };
    parts.reverse();
    Ok(parts.into_iter().map(Value::from).collect())
}

/// transformers registers a `{% generation %}...{% endgeneration %}` block tag
/// (it marks assistant tokens for training masks and renders its body
/// unchanged). minijinja has no such tag, so it is rewritten into an
/// always-true `if` with the same whitespace-control markers, which renders
/// identically.
pub(crate) fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open_ctl, body) = split_ctl_prefix(inner);
        let (body, close_ctl) = split_ctl_suffix(body);
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(word) => {
                out.push_str("{%");
                out.push_str(open_ctl);
                out.push(' ');
                out.push_str(word);
                out.push(' ');
                out.push_str(close_ctl);
                out.push_str("%}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn split_ctl_prefix(s: &str) -> (&str, &str) {
    match s.chars().next() {
        Some('-') | Some('+') => s.split_at(1),
        _ => ("", s),
    }
}

fn split_ctl_suffix(s: &str) -> (&str, &str) {
    match s.chars().last() {
        Some('-') | Some('+') => s.split_at(s.len() - 1),
        _ => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str) -> String {
        let env = chat_environment().expect("environment");
        env.render_str(src, ()).expect("render")
    }

    #[test]
    fn rsplit_matches_python() {
        assert_eq!(render("{{ 'a,b,c'.rsplit(',', 1) }}"), "['a,b', 'c']");
        assert_eq!(render("{{ 'a,b,c'.rsplit(',') }}"), "['a', 'b', 'c']");
        assert_eq!(
            render("{{ '  a  b c '.rsplit(none, 1) }}"),
            "['  a  b', 'c']"
        );
        assert_eq!(render("{{ ' a b '.rsplit() }}"), "['a', 'b']");
        assert_eq!(render("{{ 'xay'.removeprefix('x') }}"), "ay");
    }

    #[test]
    fn generation_tags_render_their_body() {
        let src = rewrite_generation_tags(
            "a{%- generation -%} b {%- endgeneration %}c{% if 1 %}d{% endif %}",
        );
        assert_eq!(
            src,
            "a{%- if true -%} b {%- endif %}c{% if 1 %}d{% endif %}"
        );
        assert_eq!(render(&src), "abcd");
    }

    #[test]
    fn raise_exception_keeps_message() {
        let env = chat_environment().expect("environment");
        let err = env
            .render_str("{{ raise_exception('roles must alternate') }}", ())
            .expect_err("must fail");
        let source = std::error::Error::source(&err)
            .and_then(|s| s.downcast_ref::<RaisedException>())
            .map(|e| e.0.clone());
        assert_eq!(source.as_deref(), Some("roles must alternate"));
    }
}
