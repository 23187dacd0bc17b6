//! prep's chat-template renderer: Hugging Face chat templates (Jinja)
//! rendered byte for byte as Python `transformers` renders them with
//! `tokenizer.apply_chat_template(messages, tools=..., documents=...,
//! add_generation_prompt=..., tokenize=False, **kwargs)`, with the spans of
//! the `{% generation %}` blocks (what transformers turns into its
//! assistant-tokens mask).
//!
//! The engine is minijinja, set up as transformers sets up Jinja2
//! (`_compile_jinja_template`: trim_blocks, lstrip_blocks, loop controls, no
//! autoescape, the last newline of the template dropped) and brought to
//! Python's behaviour where the two differ:
//!
//! - `{{ x }}` prints Python's `str(x)` (`None`, `True`, `['a', 1]`,
//!   `{'k': 'v'}`, `1e-05`); so do `|string` and `|join`;
//! - `tojson` is transformers' `json.dumps(x, ensure_ascii=False, indent=...,
//!   separators=..., sort_keys=...)`;
//! - `raise_exception(msg)` gives [`RenderError::Raised`], `strftime_now(fmt)`
//!   formats [`RenderInput::now`];
//! - Python's string methods (`strip`, `split`, `splitlines`, `title`...)
//!   and Jinja2's `trim`, `indent`, `title`, `sequence`, `iterable`... with
//!   CPython's character classes;
//! - the messages go through what `apply_chat_template` does to them first:
//!   keys whose value is None dropped, reasoning copied to `thinking` and
//!   `reasoning_content`.
//!
//! What is known not to match (each rare in chat templates) is listed on
//! [`Template`].

#![deny(missing_docs)]

mod env;
mod filters;
mod generation;
mod json;
mod json_read;
mod methods;
mod objects;
mod python;
mod strftime;
#[rustfmt::skip]
mod tables;

use std::ops::Range;

use minijinja::value::ValueKind;
pub use minijinja::Value;

pub use json::{dumps as json_dumps, DumpOptions};
pub use python::{float_repr, to_str as python_str};

/// A compiled chat template; render it from any number of threads at once.
///
/// What prep knows it does not reproduce, each rare in chat templates.
/// Failing where transformers renders:
///
/// - a `{% generation %}` block inside a macro, call block, filter block,
///   `{% set %}` block or recursive loop, when it renders: transformers'
///   span there is counted against buffered output, not the text;
/// - Python's `%` string formatting (`'%s' % x`; the `format` filter works);
/// - the filters `striptags`, `filesizeformat`, `wordwrap`, `urlize`,
///   `xmlattr` and `random`, and `lipsum()`, when reached;
/// - integers beyond 128 bits.
///
/// Rendering where transformers fails:
///
/// - `tojson` of a Python iterator (`d.items()`, `range()`, the output of
///   `select`, `map` or `reverse` without `| list`), which json.dumps
///   refuses;
/// - an unknown filter or test outside any `{% if %}` that the render never
///   reaches (Jinja2 refuses those when compiling);
/// - `{% set ns._name = ... %}` (transformers refuses underscore names on
///   namespaces; prep only in `namespace(...)`).
///
/// Rendering differently:
///
/// - `~` prints a float whose repr has an exponent (`1e-05`), or a list or
///   dict holding strings with non-printable characters other than control
///   characters, as minijinja does (`{{ }}`, `|string` and `|join` print
///   them as Python does);
/// - `d.items` (or `keys`, `values`, `get`...) written as an attribute on a
///   dict with such a key gives the key's value, where Jinja2 gives the dict
///   method;
/// - printing a macro, loop, cycler or iterator object (Python prints its
///   type and address), or a namespace whose names were not given in sorted
///   order (prep prints them sorted);
/// - upper and lower case of characters added to Unicode after version 14
///   (Python 3.11's); the other character classes are Python's own.
pub struct Template {
    env: minijinja::Environment<'static>,
    has_generation: bool,
}

/// What a template is rendered with: the arguments of transformers'
/// `apply_chat_template`.
pub struct RenderInput<'a> {
    /// The conversation: a list of message maps.
    pub messages: &'a Value,
    /// The tools (a list of JSON-schema maps), or None: the template then sees
    /// `tools` as None, as transformers passes it.
    pub tools: Option<&'a Value>,
    /// The documents (a list of maps), or None, as for `tools`.
    pub documents: Option<&'a Value>,
    /// Whether to end with the header of a new assistant message.
    pub add_generation_prompt: bool,
    /// Further template variables, in order: the tokenizer's special tokens
    /// (`bos_token`, `eos_token`, ...) then the user's keyword arguments
    /// (`enable_thinking`, `date_string`...); a later one of the same name
    /// wins, as in transformers' `{**special_tokens_map, **kwargs}`.
    pub vars: &'a [(String, Value)],
    /// The time `strftime_now` formats (transformers uses the clock).
    pub now: Now,
}

/// A local date and time, as `datetime.now()` would give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// The year, 1 to 9999.
    pub year: i32,
    /// The month, 1 to 12.
    pub month: u32,
    /// The day of the month, from 1.
    pub day: u32,
    /// The hour, 0 to 23.
    pub hour: u32,
    /// The minute, 0 to 59.
    pub minute: u32,
    /// The second, 0 to 59.
    pub second: u32,
}

/// A rendered conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// The text, as transformers returns it with `tokenize=False`.
    pub text: String,
    /// The spans transformers reports for the `{% generation %}` blocks, as
    /// byte ranges of `text`, in its order (a block's span when it ends).
    pub generation: Vec<Range<usize>>,
}

/// Why a render failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The template called `raise_exception(message)` (it refuses the
    /// conversation, e.g. roles that do not alternate).
    #[error("the chat template refused the conversation: {0}")]
    Raised(String),
    /// Any other failure: a template error (with its line), a Python error
    /// transformers would raise (named first, e.g. `TypeError: ...`), or an
    /// input prep refuses.
    #[error("rendering the chat template failed: {0}")]
    Failed(String),
}

/// Why a template does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The source is not a template minijinja compiles (with the line).
    #[error("chat template syntax error: {0}")]
    Syntax(String),
}

impl Template {
    /// Compiles a template source. `{% generation %}`/`{% endgeneration %}` are supported.
    pub fn new(source: &str) -> Result<Template, TemplateError> {
        if let Some(c) = source.chars().find(|&c| is_reserved(c)) {
            return Err(TemplateError::Syntax(format!(
                "the template contains U+{:04X}, a character prep reserves",
                c as u32
            )));
        }
        // Jinja2's lexer reads every line break of the template text as
        // "\n" (its newline_sequence), in text and string literals alike.
        let source = source.replace("\r\n", "\n").replace('\r', "\n");
        let rewritten = generation::rewrite(&source).map_err(TemplateError::Syntax)?;
        let env = env::build(rewritten.source).map_err(|e| TemplateError::Syntax(describe(&e)))?;
        Ok(Template {
            env,
            has_generation: rewritten.has_generation,
        })
    }

    /// Whether the source has {% generation %} blocks.
    pub fn has_generation(&self) -> bool {
        self.has_generation
    }

    /// Whether the template reads the variable `name` from what it is
    /// rendered with (rather than setting it itself), anywhere in its text,
    /// whether or not a render reaches that place: so a caller can refuse
    /// to render without a variable, such as `bos_token`, that would
    /// otherwise print as nothing.
    pub fn reads(&self, name: &str) -> bool {
        self.env
            .get_template(env::TEMPLATE_NAME)
            .is_ok_and(|t| t.undeclared_variables(false).contains(name))
    }

    /// Renders. Thread-safe (&self), called from many threads at once.
    pub fn render(&self, input: &RenderInput<'_>) -> Result<Rendered, RenderError> {
        let ctx = context(input)?;
        let template = self
            .env
            .get_template(env::TEMPLATE_NAME)
            .map_err(|e| RenderError::Failed(describe(&e)))?;
        let text = template.render(ctx).map_err(|e| match raised(&e) {
            Some(msg) => RenderError::Raised(msg),
            None => RenderError::Failed(describe(&e)),
        })?;
        if !self.has_generation {
            return Ok(Rendered {
                text,
                generation: Vec::new(),
            });
        }
        let (text, generation) = generation::extract_spans(&text).map_err(RenderError::Failed)?;
        Ok(Rendered { text, generation })
    }
}

/// The characters prep uses to mark generation blocks (and to tag raised
/// errors); no input may contain them.
fn is_reserved(c: char) -> bool {
    ('\u{FDD0}'..='\u{FDD2}').contains(&c)
}

/// The template's variables, as transformers passes them: `messages`
/// (normalised), `tools`, `documents`, `add_generation_prompt`, then `vars`.
fn context(input: &RenderInput<'_>) -> Result<Value, RenderError> {
    const OWN: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];
    let messages = normalize_messages(input.messages)?;
    let tools = list_of_maps(input.tools, "tools", "Tools should either be a JSON schema, or a callable function with type hints and a docstring suitable for auto-conversion to a schema.")?;
    let documents = list_of_maps(
        input.documents,
        "documents",
        "Documents should be a list of dicts with 'title' and 'text' keys!",
    )?;
    let mut pairs: Vec<(String, Value)> = vec![
        ("messages".into(), messages),
        ("tools".into(), tools),
        ("documents".into(), documents),
        (
            "add_generation_prompt".into(),
            Value::from(input.add_generation_prompt),
        ),
    ];
    for (name, value) in input.vars {
        if OWN.contains(&name.as_str()) {
            return Err(RenderError::Failed(format!(
                "TypeError: got multiple values for keyword argument '{name}'"
            )));
        }
        match pairs.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value.clone(),
            None => pairs.push((name.clone(), value.clone())),
        }
    }
    for (name, value) in &pairs {
        if let Some(c) = find_reserved(value) {
            return Err(RenderError::Failed(format!(
                "{name} contains U+{:04X}, a character prep reserves to mark generation blocks",
                c as u32
            )));
        }
    }
    pairs.push((
        env::NOW_VAR.into(),
        Value::from_object(env::NowValue(input.now)),
    ));
    Ok(Value::from_pairs(pairs))
}

/// None, or a list of maps (transformers refuses anything else).
fn list_of_maps(value: Option<&Value>, what: &str, refusal: &str) -> Result<Value, RenderError> {
    let Some(value) = value else {
        return Ok(Value::from(()));
    };
    if value.kind() != ValueKind::Seq {
        return Err(RenderError::Failed(format!(
            "TypeError: {what} must be a list"
        )));
    }
    for item in value
        .try_iter()
        .map_err(|e| RenderError::Failed(describe(&e)))?
    {
        if item.kind() != ValueKind::Map {
            return Err(RenderError::Failed(refusal.to_owned()));
        }
    }
    Ok(value.clone())
}

/// Names of a message's reasoning, the first being the one templates read.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// transformers' `_normalize_chat_messages` and `_alias_reasoning_fields`:
/// each message's None-valued keys dropped, and a message with reasoning
/// under any of its names given it as `thinking` (first) and
/// `reasoning_content` (last), in that key order.
fn normalize_messages(messages: &Value) -> Result<Value, RenderError> {
    if messages.kind() != ValueKind::Seq {
        return Err(RenderError::Failed(format!(
            "TypeError: messages must be a list, not {}",
            messages.kind()
        )));
    }
    let mut out = Vec::new();
    for message in messages
        .try_iter()
        .map_err(|e| RenderError::Failed(describe(&e)))?
    {
        if message.kind() != ValueKind::Map {
            return Err(RenderError::Failed(format!(
                "TypeError: Chat messages should be dicts, dataclasses or pydantic models, but got {}.",
                python::to_str(&message)
            )));
        }
        let mut pairs: Vec<(Value, Value)> = Vec::new();
        for key in message
            .try_iter()
            .map_err(|e| RenderError::Failed(describe(&e)))?
        {
            let value = message.get_item(&key).unwrap_or_default();
            if !value.is_none() {
                pairs.push((key, value));
            }
        }
        let reasoning = REASONING_FIELDS
            .iter()
            .find_map(|f| pairs.iter().find(|(k, _)| k.as_str() == Some(f)))
            .map(|(_, v)| v.clone());
        if let Some(r) = reasoning {
            let mut aliased = vec![(Value::from("thinking"), r.clone())];
            for (k, v) in pairs {
                match aliased.iter_mut().find(|(a, _)| *a == k) {
                    Some(slot) => slot.1 = v,
                    None => aliased.push((k, v)),
                }
            }
            let rc = Value::from("reasoning_content");
            match aliased.iter_mut().find(|(a, _)| *a == rc) {
                Some(slot) => slot.1 = r,
                None => aliased.push((rc, r)),
            }
            pairs = aliased;
        }
        out.push(Value::from_pairs(pairs));
    }
    Ok(Value::from(out))
}

/// The first reserved character in any string (or key) inside `value`.
fn find_reserved(value: &Value) -> Option<char> {
    match value.kind() {
        ValueKind::String => value
            .as_str()
            .and_then(|s| s.chars().find(|&c| is_reserved(c))),
        ValueKind::Seq | ValueKind::Map => {
            let is_map = value.kind() == ValueKind::Map;
            value.try_iter().ok()?.find_map(|item| {
                find_reserved(&item).or_else(|| {
                    if is_map {
                        find_reserved(&value.get_item(&item).unwrap_or_default())
                    } else {
                        None
                    }
                })
            })
        }
        _ => None,
    }
}

/// The message `raise_exception` was called with, if that is what failed.
fn raised(err: &minijinja::Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(me) = e.downcast_ref::<minijinja::Error>() {
            if let Some(msg) = me.detail().and_then(|d| d.strip_prefix(env::RAISED_TAG)) {
                return Some(msg.to_owned());
            }
        }
        cur = e.source();
    }
    None
}

/// An error with its causes and the template line.
fn describe(err: &minijinja::Error) -> String {
    let mut out = err.to_string();
    let mut cur = std::error::Error::source(err);
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}

/// Converts JSON text into a minijinja Value keeping object key order (for messages read from JSONL).
///
/// Read as Python's `json.loads` reads it: a repeated key keeps its first
/// place and its last value, integers stay integers (`-0` is `0`; beyond
/// 128 bits refused), other numbers are floats (`1e400` is `inf`), and
/// `NaN`, `Infinity`, `-Infinity` are read. A lone surrogate escape, which
/// Python keeps and Rust strings cannot hold, is refused.
pub fn value_from_json(text: &str) -> Result<minijinja::Value, String> {
    json_read::parse(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Now = Now {
        year: 2025,
        month: 3,
        day: 7,
        hour: 9,
        minute: 5,
        second: 3,
    };

    fn render(
        source: &str,
        messages: &str,
        vars: &[(&str, &str)],
    ) -> Result<Rendered, RenderError> {
        let messages = value_from_json(messages).unwrap();
        let vars: Vec<(String, Value)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), value_from_json(v).unwrap()))
            .collect();
        Template::new(source).unwrap().render(&RenderInput {
            messages: &messages,
            tools: None,
            documents: None,
            add_generation_prompt: false,
            vars: &vars,
            now: NOW,
        })
    }

    // Expected outputs came from CPython 3.11: str() of the value (Jinja2
    // prints with str()).
    #[test]
    fn prints_python_str() {
        let out = render(
            "{{ v }}|{{ n }}|{{ t }}|{{ f }}|{{ missing }}|{{ messages }}",
            r#"[{"role": "user", "content": "it's", "x": null}]"#,
            &[
                ("v", r#"[1, "a", null, [true, 1e-07]]"#),
                ("n", "null"),
                ("t", "false"),
                ("f", "1e16"),
            ],
        )
        .unwrap();
        assert_eq!(
            out.text,
            "[1, 'a', None, [True, 1e-07]]|None|False|1e+16||[{'role': 'user', 'content': \"it's\"}]"
        );
    }

    #[test]
    fn raise_exception_is_raised() {
        let err = render(
            "{{ raise_exception('no ' ~ messages[0].role) }}",
            r#"[{"role": "user"}]"#,
            &[],
        );
        assert_eq!(err, Err(RenderError::Raised("no user".into())));
        let err = render("{{ 1 + 'a' }}", "[]", &[]);
        assert!(matches!(err, Err(RenderError::Failed(_))), "{err:?}");
    }

    #[test]
    fn reads_names_the_variables_a_template_takes_from_its_context() {
        let t = Template::new(
            "{% set eos = 'x' %}{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}\
             {% if add_generation_prompt %}{{ eos }}{% else %}{{ eos_token | default('') }}{% endif %}",
        )
        .unwrap();
        assert!(t.reads("bos_token") && t.reads("eos_token") && t.reads("messages"));
        assert!(!t.reads("eos") && !t.reads("m") && !t.reads("pad_token"));
        let sets = Template::new("{% set bos_token = '<s>' %}{{ bos_token }}").unwrap();
        assert!(!sets.reads("bos_token"));
    }

    #[test]
    fn reasoning_is_aliased_as_transformers_does() {
        let out = render(
            "{{ messages[0] | tojson }}",
            r#"[{"role": "assistant", "content": "A", "reasoning": "r", "reasoning_content": null}]"#,
            &[],
        )
        .unwrap();
        assert_eq!(
            out.text,
            r#"{"thinking": "r", "role": "assistant", "content": "A", "reasoning": "r", "reasoning_content": "r"}"#
        );
    }

    #[test]
    fn reserved_characters_are_refused() {
        let err = render(
            "{{ messages[0].content }}",
            "[{\"content\": \"a\u{FDD0}\"}]",
            &[],
        );
        assert!(matches!(err, Err(RenderError::Failed(_))), "{err:?}");
        assert!(Template::new("a\u{FDD1}").is_err());
    }

    #[test]
    fn renders_from_many_threads() {
        fn is_sync<T: Send + Sync>() {}
        is_sync::<Template>();
        let template = Template::new(
            "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
        )
        .unwrap();
        std::thread::scope(|scope| {
            for i in 0..4 {
                let template = &template;
                scope.spawn(move || {
                    for j in 0..50 {
                        let text = format!("t{i}-{j}é");
                        let messages =
                            Value::from(vec![Value::from_pairs([("content", text.clone())])]);
                        let out = template
                            .render(&RenderInput {
                                messages: &messages,
                                tools: None,
                                documents: None,
                                add_generation_prompt: false,
                                vars: &[],
                                now: NOW,
                            })
                            .unwrap();
                        assert_eq!(out.text, text);
                        assert_eq!(out.generation, vec![0..text.len()]);
                    }
                });
            }
        });
    }
}
