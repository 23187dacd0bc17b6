//! The minijinja environment that stands in for transformers' compiled one:
//! an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop
//! controls, its `tojson`, `raise_exception` and `strftime_now`, and
//! Jinja2's filters and tests where minijinja's differ from Python's.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, UndefinedBehavior, Value};

use crate::filters;
use crate::generation::{BUFFERED_FILTER, END, FILTER, START};
use crate::json::{py_type_name, tojson_filter, type_error};
use crate::methods::{self, strip};
use crate::objects;
use crate::python;
use crate::strftime::strftime;
use crate::Now;

/// The name the template is compiled under (no extension: no autoescape).
pub(crate) const TEMPLATE_NAME: &str = "chat_template";
/// The context variable holding the render's [`Now`], for `strftime_now`.
pub(crate) const NOW_VAR: &str = "__prep_now";
/// Starts the detail of the error `raise_exception` raises, so that a render
/// error can be told to be the template's own.
pub(crate) const RAISED_TAG: &str = "\u{FDD2}raise_exception:";

/// minijinja's filters, tests and globals that Jinja2 does not have: a
/// template naming one fails in transformers, so it fails here too.
const NOT_JINJA2_FILTERS: [&str; 5] = ["split", "lines", "bool", "chain", "zip"];
const NOT_JINJA2_TESTS: [&str; 4] = ["int", "safe", "startingwith", "endingwith"];

/// Builds the environment with `source` (already rewritten by
/// [`crate::generation::rewrite`]) compiled in it.
pub(crate) fn build(source: String) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()?,
    );
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_formatter(|out, _state, value| {
        out.write_str(&python::to_str(value))
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "cannot write output"))
    });
    env.set_unknown_method_callback(methods::call_method);
    for name in NOT_JINJA2_FILTERS {
        env.remove_filter(name);
    }
    for name in NOT_JINJA2_TESTS {
        env.remove_test(name);
    }
    env.remove_global("debug");
    add_filters(&mut env);
    add_tests(&mut env);
    env.add_global("raise_exception", Value::from_function(raise_exception));
    env.add_global("strftime_now", Value::from_function(strftime_now));
    env.add_global("namespace", Value::from_function(namespace));
    env.add_global("joiner", Value::from_function(objects::joiner));
    env.add_global("cycler", Value::from_function(objects::cycler));
    env.add_global("lipsum", Value::from_function(objects::lipsum));
    env.add_template_owned(TEMPLATE_NAME, source)?;
    Ok(env)
}

fn add_filters(env: &mut Environment<'static>) {
    env.add_filter("tojson", tojson_filter);
    env.add_filter("string", |v: &Value| python::to_str(v));
    env.add_filter("join", filters::join);
    env.add_filter(
        "trim",
        |v: &Value, chars: Option<Value>| -> Result<String, Error> {
            let chars = match &chars {
                Some(c) if !c.is_none() => Some(c.as_str().ok_or_else(|| {
                    type_error(format!(
                        "strip arg must be None or str, not {}",
                        py_type_name(c)
                    ))
                })?),
                _ => None,
            };
            Ok(strip(&python::to_str(v), chars, true, true).to_owned())
        },
    );
    env.add_filter("lower", |v: &Value| python::to_str(v).to_lowercase());
    env.add_filter("upper", |v: &Value| python::to_str(v).to_uppercase());
    env.add_filter("title", |v: &Value| {
        filters::jinja_title(&python::to_str(v))
    });
    env.add_filter("capitalize", |v: &Value| {
        methods::capitalize(&python::to_str(v))
    });
    env.add_filter("replace", filters::replace);
    env.add_filter("indent", filters::indent);
    env.add_filter("default", filters::default);
    env.add_filter("d", filters::default);
    env.add_filter("int", filters::int);
    env.add_filter("float", filters::float);
    env.add_filter("round", filters::round);
    env.add_filter("center", filters::center);
    env.add_filter("wordcount", filters::wordcount);
    env.add_filter("truncate", filters::truncate);
    env.add_filter("escape", |v: &Value| filters::escape(v, false));
    env.add_filter("e", |v: &Value| filters::escape(v, false));
    env.add_filter("forceescape", |v: &Value| filters::escape(v, true));
    env.add_filter(FILTER, |body: String| format!("{START}{body}{END}"));
    env.add_filter(BUFFERED_FILTER, |_body: String| -> Result<String, Error> {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            "a {% generation %} block inside a macro, call, filter or {% set %} block or a \
             recursive loop: transformers reports its span against buffered output, which \
             prep does not reproduce",
        ))
    });
}

fn add_tests(env: &mut Environment<'static>) {
    env.add_test("sequence", |v: &Value| {
        v.is_undefined()
            || matches!(v.kind(), ValueKind::String | ValueKind::Seq)
            || python::is_dict(v)
    });
    env.add_test("iterable", |v: &Value| {
        v.is_undefined()
            || matches!(
                v.kind(),
                ValueKind::String | ValueKind::Seq | ValueKind::Iterable
            )
            || python::is_dict(v)
    });
    env.add_test("mapping", python::is_dict);
    env.add_test("callable", |v: &Value| v.kind() == ValueKind::Plain);
    env.add_test("lower", |v: &Value| {
        python::is_case(&python::to_str(v), false)
    });
    env.add_test("upper", |v: &Value| {
        python::is_case(&python::to_str(v), true)
    });
}

/// transformers' `raise_exception(message)`.
fn raise_exception(message: Value) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED_TAG}{}", python::to_str(&message)),
    ))
}

/// transformers' `strftime_now(format)`, formatting the render's [`Now`].
fn strftime_now(state: &State, format: &Value) -> Result<String, Error> {
    let now = state
        .lookup(NOW_VAR)
        .and_then(|v| v.downcast_object_ref::<NowValue>().map(|n| n.0))
        .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "strftime_now: no time given"))?;
    let format = format.as_str().ok_or_else(|| {
        type_error(format!(
            "strftime() argument 1 must be str, not {}",
            py_type_name(format)
        ))
    })?;
    strftime(&now, format).map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
}

/// The render's [`Now`] as a template value (opaque to the template).
#[derive(Debug)]
pub(crate) struct NowValue(pub Now);

impl minijinja::value::Object for NowValue {}

/// transformers' `namespace(...)`: minijinja's (a dict and keyword
/// arguments, merged as `dict()` merges them), refusing the
/// underscore-prefixed names transformers refuses.
fn namespace(value: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let merged = minijinja::functions::dict(value, kwargs)?;
    for key in merged.try_iter()? {
        if let Some(bad) = key.as_str().filter(|k| k.starts_with('_')) {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "SecurityError: Chat templates cannot store underscore-prefixed attributes on \
                     a namespace, but got '{bad}'. Please rename the attribute."
                ),
            ));
        }
    }
    minijinja::functions::namespace(Some(merged.into()))
}
