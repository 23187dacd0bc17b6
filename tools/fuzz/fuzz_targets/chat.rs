//! Any bytes as a chat row: the JSON reader, the rule that makes a row a
//! conversation, and a template that prints every field (with tojson and
//! Python's str) must give a value or a typed error, never a panic; spans
//! of generation blocks lie inside the text.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prep::chat::shape::{conversation, Shape};
use prep_chat::{Now, RenderInput, Template, Value};

/// Prints every message's fields, tool calls and tools the ways templates
/// do, with a generation block around each assistant turn.
const TEMPLATE: &str = "{%- for m in messages -%}\
{{ '<|' + m.role + '|>' }}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}\
{%- for c in m.tool_calls or [] %}{{ c | tojson }}{{ c.function.arguments | tojson(indent=2) }}{% endfor %}\
{% endgeneration %}{% else %}{{ m.content | string | trim }}{{ m }}{% endif %}\
{%- endfor -%}{%- if tools %}{{ tools | tojson }}{% for t in tools %}{{ t }}{% endfor %}{% endif %}\
{%- if add_generation_prompt %}<|assistant|>{% endif %}";

fn template() -> &'static Template {
    static T: OnceLock<Template> = OnceLock::new();
    T.get_or_init(|| Template::new(TEMPLATE).expect("the fuzz template compiles"))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(row) = prep_chat::value_from_json(text) else {
        return;
    };
    let Ok(conv) = conversation(&row, Shape::Auto) else {
        return;
    };
    let messages = Value::from(conv.messages.clone());
    let now = Now { year: 2026, month: 1, day: 1, hour: 0, minute: 0, second: 0 };
    let vars = [("bos_token".to_owned(), Value::from("<s>"))];
    for add_generation_prompt in [false, true] {
        let input = RenderInput {
            messages: &messages,
            tools: conv.tools.as_ref(),
            documents: None,
            add_generation_prompt,
            vars: &vars,
            now,
        };
        if let Ok(rendered) = template().render(&input) {
            for span in &rendered.generation {
                assert!(span.start <= span.end && span.end <= rendered.text.len());
                assert!(rendered.text.is_char_boundary(span.start) && rendered.text.is_char_boundary(span.end));
            }
        }
    }
});
