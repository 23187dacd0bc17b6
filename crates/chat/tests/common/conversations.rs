//! The conversations, tools and keyword arguments the differential test
//! renders every template with, and the real conversations of the shared
//! chat corpus turned into messages.
use std::path::Path;

use prep_chat::{value_from_json, Value};

use super::dataset_text;

/// Tools in the JSON-schema form transformers passes on: nested schemas,
/// enums, floats and non-ASCII descriptions.
pub const TOOLS: &str = r#"[
 {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city — «quoted» & <tagged>",
  "parameters": {"type": "object", "properties": {
    "city": {"type": "string", "description": "The city, e.g. \"Paris\" or 'Zürich'"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
    "precision": {"type": "number", "minimum": 1e-3, "maximum": 1e16, "default": 0.5}},
   "required": ["city"]}}},
 {"type": "function", "function": {"name": "search", "description": "Search the web",
  "parameters": {"type": "object", "properties": {
    "query": {"type": "string"},
    "filters": {"type": "object", "properties": {"site": {"type": "string"}, "max_results": {"type": "integer", "default": 10}}},
    "tags": {"type": "array", "items": {"type": "string"}}},
   "required": ["query"]},
  "return": {"type": "string"}}}
]"#;

/// Synthetic conversations: (label, messages, whether they need tools).
pub const CONVERSATIONS: &[(&str, &str, bool)] = &[
    (
        "single-user",
        r#"[{"role": "user", "content": "Hello!"}]"#,
        false,
    ),
    (
        "user-assistant",
        r#"[{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}]"#,
        false,
    ),
    (
        "system-multi-turn",
        r#"[{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye."}]"#,
        false,
    ),
    (
        "system-user",
        r#"[{"role": "system", "content": "Be kind.\n"}, {"role": "user", "content": "  padded  \n"}]"#,
        false,
    ),
    (
        "whitespace-content",
        r#"[{"role": "user", "content": "\n\n  spaced out\t\n"}, {"role": "assistant", "content": "\n answer with trailing space \n\n"},
            {"role": "user", "content": "\u001c\u001fcontrol\u000b\u000c"}]"#,
        false,
    ),
    (
        "unicode-and-markup",
        r#"[{"role": "system", "content": "Système: <b>bold</b> & 'single' \"double\" \\ back"},
            {"role": "user", "content": "中文 😀 👩‍👩‍👧 é\u0301 {{ not_a_tag }} {% raw %} <|im_end|>"},
            {"role": "assistant", "content": "Ответ: «ok» — done\u2028next\u0085line\u00a0nbsp"}]"#,
        false,
    ),
    (
        "tool-call",
        r#"[{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "precision": 0.1}}}]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
            {"role": "assistant", "content": "It is 21.5 °C and clear."}]"#,
        true,
    ),
    (
        "parallel-tool-calls",
        r#"[{"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris and Zürich, then search."},
            {"role": "assistant", "content": null, "tool_calls": [
              {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
              {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "precision": 1e-05}}}]},
            {"role": "tool", "tool_call_id": "a", "content": "18"},
            {"role": "tool", "tool_call_id": "b", "content": "12"},
            {"role": "assistant", "content": "Paris 18, Zürich 12."}]"#,
        true,
    ),
    (
        "tool-call-string-arguments",
        r#"[{"role": "user", "content": "Search cats"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
              "function": {"name": "search", "arguments": "{\"query\": \"cats\"}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "many cats"}]"#,
        true,
    ),
    (
        "tool-call-nested-arguments",
        r#"[{"role": "user", "content": "Search with filters"},
            {"role": "assistant", "tool_calls": [{"id": "d", "type": "function",
              "function": {"name": "search", "arguments": {"query": "x < y & z", "filters": {"site": "example.org", "max_results": 3},
                "tags": ["a", "b'c", "d\"e"], "ratio": 1e16, "tiny": 2.5e-7, "neg": -0.0, "count": -3, "flag": true, "nothing": null,
                "deep": {"list": [1, 2.0, "three", [4, {"five": 5}]], "empty": {}, "none": []}}}}]},
            {"role": "tool", "tool_call_id": "d", "content": {"results": ["r1", "r2"], "score": 0.75}}]"#,
        true,
    ),
    (
        "reasoning-content",
        r#"[{"role": "user", "content": "Think about it."},
            {"role": "assistant", "reasoning_content": "Let me think... 2+2=4.", "content": "The answer is 4."},
            {"role": "user", "content": "And 3+3?"}]"#,
        false,
    ),
    (
        "think-in-content",
        r#"[{"role": "user", "content": "Why?"},
            {"role": "assistant", "content": "<think>\nBecause of reasons.\n</think>\n\nBecause."},
            {"role": "user", "content": "Sure?"},
            {"role": "assistant", "content": "<think>\n\n</think>\nYes."}]"#,
        false,
    ),
    (
        "thinking-field",
        r#"[{"role": "user", "content": "Q"}, {"role": "assistant", "thinking": "pondering", "content": "A", "reasoning": "other"}]"#,
        false,
    ),
    (
        "starts-with-assistant",
        r#"[{"role": "assistant", "content": "I speak first."}, {"role": "user", "content": "OK"}]"#,
        false,
    ),
    (
        "two-users",
        r#"[{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]"#,
        false,
    ),
    (
        "system-only",
        r#"[{"role": "system", "content": "Only a system prompt."}]"#,
        false,
    ),
    (
        "empty-content",
        r#"[{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]"#,
        false,
    ),
    (
        "content-parts",
        r#"[{"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}]"#,
        false,
    ),
    (
        "extra-keys",
        r#"[{"role": "user", "content": "hi", "name": "bob", "loss_weight": 0.0, "meta": {"k": [1.5, true, null]}},
            {"role": "assistant", "content": "hey", "loss_weight": 1.0, "weight": 1e-05}]"#,
        false,
    ),
    (
        "ipython-role",
        r#"[{"role": "user", "content": "run it"}, {"role": "ipython", "content": "42"}]"#,
        false,
    ),
    (
        "no-think-system",
        r#"[{"role": "system", "content": "Answer briefly. /no_think  "}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\nHello"}]"#,
        false,
    ),
    (
        "system-override",
        r#"[{"role": "system", "content": "Custom only /system_override /think "}, {"role": "user", "content": "Hi"}]"#,
        false,
    ),
    ("empty-conversation", "[]", false),
];

/// Keyword arguments (besides the special tokens): (label, JSON object).
pub const KWARGS: &[(&str, &str)] = &[
    ("none", "{}"),
    ("enable_thinking=False", r#"{"enable_thinking": false}"#),
    (
        "date_string,tools_in_user_message=False",
        r#"{"date_string": "01 Jan 2025", "tools_in_user_message": false}"#,
    ),
    (
        "builtin_tools",
        r#"{"builtin_tools": ["code_interpreter", "brave_search", "get_weather"]}"#,
    ),
    (
        "xml_tools,python_tools",
        r#"{"xml_tools": [{"name": "calc", "description": "it's a calculator", "parameters": {"x": 1.5, "ok": true, "n": null}}],
            "python_tools": [{"name": "run", "args": ["code"], "ratio": 1e-07}]}"#,
    ),
];

/// The special tokens transformers passes for a template: those of its
/// tokenizer_config.json where the corpus has one, else `<s>`/`</s>`. As
/// JSON object members (no braces), in transformers' order.
pub fn special_tokens(corpus: &Path, template: &str) -> String {
    let config = corpus.join(format!("configs/{template}.tokenizer_config.json"));
    let Ok(text) = std::fs::read_to_string(&config) else {
        return r#""bos_token": "<s>", "eos_token": "</s>""#.to_owned();
    };
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut members = Vec::new();
    for name in [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ] {
        let token = match &config[name] {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Object(o) => {
                o.get("content").and_then(|c| c.as_str()).map(String::from)
            }
            _ => None,
        };
        if let Some(t) = token {
            members.push(format!(
                "{}: {}",
                serde_json::to_string(name).unwrap(),
                serde_json::to_string(&t).unwrap()
            ));
        }
    }
    members.join(", ")
}

/// JSON text of a value (key order kept).
fn json(v: &Value) -> String {
    serde_json::to_string(v).unwrap()
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::from_pairs(pairs)
}

fn message(role: &str, content: Value) -> Value {
    map(vec![("role", Value::from(role)), ("content", content)])
}

/// Real conversations from the shipped corpus's datasets: (label, messages,
/// tools).
pub fn real_conversations() -> Vec<(String, String, Option<String>)> {
    let mut out = Vec::new();
    // OpenAI-style: each line is the message list.
    let text = dataset_text("openai_sft.jsonl");
    for (i, line) in text.lines().enumerate().step_by(2) {
        let messages = value_from_json(line).unwrap();
        out.push((format!("openai_sft:{i}"), json(&messages), None));
    }
    // LLaMA-Factory v1: content as a list of text parts, flattened.
    let text = dataset_text("v1_sft_demo.jsonl");
    for (i, line) in text.lines().enumerate().step_by(10) {
        let row = value_from_json(line).unwrap();
        let messages: Vec<Value> = row
            .get_attr("messages")
            .unwrap()
            .try_iter()
            .unwrap()
            .map(|m| {
                let content: String = m
                    .get_attr("content")
                    .unwrap()
                    .try_iter()
                    .unwrap()
                    .filter(|p| p.get_attr("type").unwrap().as_str() == Some("text"))
                    .map(|p| p.get_attr("value").unwrap().as_str().unwrap().to_owned())
                    .collect();
                let pairs: Vec<(Value, Value)> = m
                    .try_iter()
                    .unwrap()
                    .map(|k| {
                        let v = if k.as_str() == Some("content") {
                            Value::from(content.clone())
                        } else {
                            m.get_item(&k).unwrap()
                        };
                        (k, v)
                    })
                    .collect();
                Value::from_pairs(pairs)
            })
            .collect();
        out.push((
            format!("v1_sft_demo:{i}"),
            json(&Value::from(messages)),
            None,
        ));
    }
    out.extend(sharegpt("glaive_toolcall_en_demo.json", "glaive", 3));
    out.extend(sharegpt("dpo_en_demo.json", "dpo", 10));
    // Alpaca: instruction (and input) from the user, output from the assistant.
    let rows = value_from_json(&dataset_text("alpaca_en_demo.json")).unwrap();
    for (i, row) in rows.try_iter().unwrap().enumerate().step_by(10) {
        let s = |k: &str| row.get_attr(k).unwrap().as_str().unwrap_or("").to_owned();
        let user = if s("input").is_empty() {
            s("instruction")
        } else {
            format!("{}\n\n{}", s("instruction"), s("input"))
        };
        let messages = Value::from(vec![
            message("user", Value::from(user)),
            message("assistant", Value::from(s("output"))),
        ]);
        out.push((format!("alpaca:{i}"), json(&messages), None));
    }
    out
}

/// ShareGPT rows (`conversations` of `from`/`value`, a `tools` JSON string,
/// a `chosen` reply): function calls become assistant `tool_calls`,
/// observations `tool` messages.
fn sharegpt(file: &str, name: &str, step: usize) -> Vec<(String, String, Option<String>)> {
    let rows = value_from_json(&dataset_text(file)).unwrap();
    let mut out = Vec::new();
    for (i, row) in rows.try_iter().unwrap().enumerate().step_by(step) {
        let mut turns: Vec<Value> = row
            .get_attr("conversations")
            .unwrap()
            .try_iter()
            .unwrap()
            .collect();
        if let Ok(chosen) = row.get_attr("chosen") {
            if !chosen.is_undefined() {
                turns.push(chosen);
            }
        }
        let mut messages = Vec::new();
        for t in turns {
            let value = t.get_attr("value").unwrap();
            let from = t.get_attr("from").unwrap();
            messages.push(match from.as_str().unwrap() {
                "human" => message("user", value),
                "gpt" => message("assistant", value),
                "system" => message("system", value),
                "observation" => message("tool", value),
                "function_call" => {
                    let call = value_from_json(value.as_str().unwrap()).unwrap();
                    let function = map(vec![
                        ("name", call.get_attr("name").unwrap()),
                        ("arguments", call.get_attr("arguments").unwrap()),
                    ]);
                    let tool_call = map(vec![
                        ("type", Value::from("function")),
                        ("function", function),
                    ]);
                    map(vec![
                        ("role", Value::from("assistant")),
                        ("content", Value::from("")),
                        ("tool_calls", Value::from(vec![tool_call])),
                    ])
                }
                other => panic!("unknown ShareGPT role {other}"),
            });
        }
        let tools = row
            .get_attr("tools")
            .ok()
            .and_then(|t| t.as_str().map(String::from))
            .map(|t| {
                let specs = value_from_json(&t).unwrap();
                let wrapped: Vec<Value> = specs
                    .try_iter()
                    .unwrap()
                    .map(|f| map(vec![("type", Value::from("function")), ("function", f)]))
                    .collect();
                json(&Value::from(wrapped))
            });
        out.push((format!("{name}:{i}"), json(&Value::from(messages)), tools));
    }
    out
}
