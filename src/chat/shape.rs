//! Rows into conversations: the one rule by which the shapes chat data
//! comes in (OpenAI `messages`, ShareGPT `conversations`, Alpaca) become
//! the list of messages a chat template reads.
//!
//! The rule (docs/chat.md states it for users; tests/python/test_chat.py
//! implements it again as the reference):
//! - a row that is a JSON array is the messages; an object with `messages`
//!   holds OpenAI-style messages; with `conversations`, ShareGPT turns; with
//!   `instruction` and `output`, an Alpaca record.
//! - OpenAI messages pass as they are, keys in order, except that content
//!   given as a list of parts becomes the concatenation of its text parts
//!   (`{"type": "text", "text": …}`, or `value` for `text`), and a tool
//!   call's `arguments` given as a string holding a JSON object becomes that
//!   object. A role outside [`ROLES`] or a part that is not text makes the
//!   row bad.
//! - A row's `tools` (a list, or a string holding one) goes to the template
//!   as `tools`; a row's `system` string (ShareGPT, Alpaca) becomes a first
//!   system message.
//! - ShareGPT turns map by `from`: human/user → user, gpt/assistant/model →
//!   assistant, system → system, function_call → an assistant message with
//!   empty content and one tool call (the turn's value is the JSON
//!   `{"name", "arguments"}`), observation/tool → a tool message. A row with
//!   `chosen` (one turn) has it appended as the last turn: preference data
//!   trained as SFT on the chosen reply.
//! - Alpaca: the system message, then each `[question, answer]` of
//!   `history` as a user and an assistant message, then the user message
//!   `instruction` (followed by a newline and `input` when `input` is not
//!   empty) and the assistant message `output`.

use minijinja::value::{Value, ValueKind};

/// The roles a message may have.
pub const ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "ipython",
];

/// How rows hold their conversation (`--chat-shape`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Decided per row by its fields (see the module docs).
    Auto,
    /// OpenAI-style `messages` (or a bare array of them).
    Messages,
    /// ShareGPT `conversations` of `from`/`value` turns.
    ShareGpt,
    /// Alpaca `instruction`, `input`, `output`.
    Alpaca,
}

impl Shape {
    /// The shape's name as `--chat-shape` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Auto => "auto",
            Shape::Messages => "messages",
            Shape::ShareGpt => "sharegpt",
            Shape::Alpaca => "alpaca",
        }
    }
}

/// One row as a template reads it.
#[derive(Debug, Clone)]
pub struct Conversation {
    /// The messages, in order.
    pub messages: Vec<Value>,
    /// The tools the row offers the model, if any.
    pub tools: Option<Value>,
    /// The shape the row was read as.
    pub shape: Shape,
}

/// Reads `row` (one parsed JSON row) as `shape` says.
///
/// # Errors
/// What makes the row no conversation, in words for the user.
pub fn conversation(row: &Value, shape: Shape) -> Result<Conversation, String> {
    let shape = match shape {
        Shape::Auto => detect(row)?,
        other => other,
    };
    let mut messages = Vec::new();
    let system = field(row, "system").filter(|s| !s.is_none());
    if let Some(system) = system.filter(|_| shape != Shape::Messages) {
        let text = system
            .as_str()
            .ok_or_else(|| format!("field \"system\" is {}, not a string", kind(&system)))?;
        messages.push(message("system", Value::from(text)));
    }
    match shape {
        Shape::Messages => {
            let list = if row.kind() == ValueKind::Seq {
                row.clone()
            } else {
                field(row, "messages").ok_or("no field \"messages\"")?
            };
            for (i, m) in list_items(&list, "messages")?.iter().enumerate() {
                messages.push(openai_message(m).map_err(|e| format!("message {i}: {e}"))?);
            }
        }
        Shape::ShareGpt => {
            let turns = field(row, "conversations").ok_or("no field \"conversations\"")?;
            let mut turns = list_items(&turns, "conversations")?;
            turns.extend(field(row, "chosen"));
            for (i, t) in turns.iter().enumerate() {
                messages.push(sharegpt_turn(t).map_err(|e| format!("turn {i}: {e}"))?);
            }
        }
        Shape::Alpaca => alpaca(row, &mut messages)?,
        Shape::Auto => unreachable!("detected above"),
    }
    if messages.is_empty() {
        return Err("the conversation has no messages".into());
    }
    let tools = match field(row, "tools").filter(|_| row.kind() == ValueKind::Map) {
        None => None,
        Some(t) if t.is_none() => None,
        Some(t) => Some(tools(&t)?),
    };
    Ok(Conversation {
        messages,
        tools,
        shape,
    })
}

/// The shape a row's fields say.
fn detect(row: &Value) -> Result<Shape, String> {
    if row.kind() == ValueKind::Seq {
        return Ok(Shape::Messages);
    }
    if row.kind() != ValueKind::Map {
        return Err(format!(
            "a row is {}, not an object or a list of messages",
            kind(row)
        ));
    }
    if field(row, "messages").is_some() {
        Ok(Shape::Messages)
    } else if field(row, "conversations").is_some() {
        Ok(Shape::ShareGpt)
    } else if field(row, "instruction").is_some() && field(row, "output").is_some() {
        Ok(Shape::Alpaca)
    } else {
        Err(format!(
            "no conversation: the row has none of \"messages\", \"conversations\", or \
             \"instruction\" with \"output\" (its fields: {})",
            keys(row).join(", ")
        ))
    }
}

/// An OpenAI-style message, its content and tool calls made plain.
fn openai_message(m: &Value) -> Result<Value, String> {
    if m.kind() != ValueKind::Map {
        return Err(format!("is {}, not an object", kind(m)));
    }
    let role = field(m, "role").ok_or("no field \"role\"")?;
    let role = role.as_str().ok_or("\"role\" is not a string")?;
    if !ROLES.contains(&role) {
        return Err(format!(
            "unknown role {role:?} (known: {})",
            ROLES.join(", ")
        ));
    }
    let mut out: Vec<(Value, Value)> = Vec::new();
    for key in m.try_iter().map_err(|e| e.to_string())? {
        let value = m.get_item(&key).unwrap_or_default();
        let value = match key.as_str() {
            Some("content") if value.kind() == ValueKind::Seq => {
                Value::from(text_of_parts(&value)?)
            }
            Some("tool_calls") if value.kind() == ValueKind::Seq => tool_calls(&value)?,
            _ => value,
        };
        out.push((key, value));
    }
    Ok(Value::from_pairs(out))
}

/// The text of a content given as a list of parts.
fn text_of_parts(parts: &Value) -> Result<String, String> {
    let mut text = String::new();
    for (i, part) in list_items(parts, "content")?.iter().enumerate() {
        let ty = field(part, "type");
        if ty.as_ref().and_then(|t| t.as_str()) != Some("text") {
            return Err(format!(
                "content part {i} is of type {}, and prep reads text only",
                ty.map_or("(none)".to_owned(), |t| t.to_string())
            ));
        }
        let piece = field(part, "text")
            .or_else(|| field(part, "value"))
            .ok_or_else(|| format!("content part {i} has no \"text\""))?;
        text += piece
            .as_str()
            .ok_or_else(|| format!("content part {i}'s text is {}, not a string", kind(&piece)))?;
    }
    Ok(text)
}

/// Tool calls with every `function.arguments` that is a string holding a
/// JSON object replaced by that object.
fn tool_calls(calls: &Value) -> Result<Value, String> {
    let mut out = Vec::new();
    for call in list_items(calls, "tool_calls")? {
        let Some(function) = field(&call, "function").filter(|f| f.kind() == ValueKind::Map) else {
            out.push(call);
            continue;
        };
        let parsed = field(&function, "arguments")
            .and_then(|a| a.as_str().map(str::to_owned))
            .and_then(|a| prep_chat::value_from_json(&a).ok())
            .filter(|a| a.kind() == ValueKind::Map);
        let Some(parsed) = parsed else {
            out.push(call);
            continue;
        };
        let function = replace(&function, "arguments", parsed)?;
        out.push(replace(&call, "function", function)?);
    }
    Ok(Value::from(out))
}

/// `map` with `key`'s value replaced, keys in order.
fn replace(map: &Value, key: &str, value: Value) -> Result<Value, String> {
    let mut out: Vec<(Value, Value)> = Vec::new();
    for k in map.try_iter().map_err(|e| e.to_string())? {
        let v = if k.as_str() == Some(key) {
            value.clone()
        } else {
            map.get_item(&k).unwrap_or_default()
        };
        out.push((k, v));
    }
    Ok(Value::from_pairs(out))
}

/// One ShareGPT turn as a message.
fn sharegpt_turn(t: &Value) -> Result<Value, String> {
    let from = field(t, "from").ok_or("no field \"from\"")?;
    let from = from.as_str().ok_or("\"from\" is not a string")?;
    let value = field(t, "value").ok_or("no field \"value\"")?;
    let text = value
        .as_str()
        .ok_or_else(|| format!("\"value\" is {}, not a string", kind(&value)))?;
    let role = match from {
        "human" | "user" => "user",
        "gpt" | "assistant" | "model" => "assistant",
        "system" => "system",
        "observation" | "tool" => "tool",
        "function_call" => return function_call(text).map(|m| with_weight(t, m)),
        other => {
            return Err(format!(
                "unknown \"from\" {other:?} (known: human, user, gpt, assistant, model, system, \
                 function_call, observation, tool)"
            ))
        }
    };
    Ok(with_weight(t, message(role, Value::from(text))))
}

/// `message` with turn `t`'s `weight`, when it has one (see `--loss-mask`).
fn with_weight(t: &Value, message: Value) -> Value {
    match field(t, "weight") {
        None => message,
        Some(weight) => {
            let mut pairs: Vec<(Value, Value)> = message
                .try_iter()
                .into_iter()
                .flatten()
                .map(|k| {
                    let v = message.get_item(&k).unwrap_or_default();
                    (k, v)
                })
                .collect();
            pairs.push((Value::from("weight"), weight));
            Value::from_pairs(pairs)
        }
    }
}

/// A ShareGPT `function_call` turn: an assistant message with one tool call.
fn function_call(text: &str) -> Result<Value, String> {
    let call = prep_chat::value_from_json(text)
        .map_err(|e| format!("a function_call's value is not JSON: {e}"))?;
    let name = field(&call, "name").ok_or("a function_call's value has no \"name\"")?;
    let arguments = field(&call, "arguments")
        .unwrap_or_else(|| Value::from_pairs(Vec::<(Value, Value)>::new()));
    let function = Value::from_pairs([("name", name), ("arguments", arguments)]);
    let call = Value::from_pairs([("type", Value::from("function")), ("function", function)]);
    Ok(Value::from_pairs([
        ("role", Value::from("assistant")),
        ("content", Value::from("")),
        ("tool_calls", Value::from(vec![call])),
    ]))
}

/// An Alpaca record's messages.
fn alpaca(row: &Value, messages: &mut Vec<Value>) -> Result<(), String> {
    let text = |name: &str| -> Result<Option<String>, String> {
        match field(row, name) {
            None => Ok(None),
            Some(v) if v.is_none() => Ok(None),
            Some(v) => v
                .as_str()
                .map(|s| Some(s.to_owned()))
                .ok_or_else(|| format!("field {name:?} is {}, not a string", kind(&v))),
        }
    };
    if let Some(history) = field(row, "history").filter(|h| !h.is_none()) {
        for (i, pair) in list_items(&history, "history")?.iter().enumerate() {
            let pair = list_items(pair, "history")?;
            let [q, a] = pair.as_slice() else {
                return Err(format!(
                    "history entry {i} is not a [question, answer] pair"
                ));
            };
            for (role, v) in [("user", q), ("assistant", a)] {
                let s = v
                    .as_str()
                    .ok_or_else(|| format!("history entry {i} holds {}, not a string", kind(v)))?;
                messages.push(message(role, Value::from(s)));
            }
        }
    }
    let instruction = text("instruction")?.ok_or("no field \"instruction\"")?;
    let user = match text("input")? {
        Some(input) if !input.is_empty() => format!("{instruction}\n{input}"),
        _ => instruction,
    };
    messages.push(message("user", Value::from(user)));
    let output = text("output")?.ok_or("no field \"output\"")?;
    messages.push(message("assistant", Value::from(output)));
    Ok(())
}

/// A row's tools: a list, or a string holding one.
fn tools(t: &Value) -> Result<Value, String> {
    let list = match t.as_str() {
        Some(text) => prep_chat::value_from_json(text)
            .map_err(|e| format!("field \"tools\" is a string but not JSON: {e}"))?,
        None => t.clone(),
    };
    if list.kind() != ValueKind::Seq {
        return Err(format!("field \"tools\" is {}, not a list", kind(&list)));
    }
    Ok(list)
}

/// A message of `role` with `content`.
fn message(role: &str, content: Value) -> Value {
    Value::from_pairs([("role", Value::from(role)), ("content", content)])
}

/// Field `name` of a map, or `None` when it is absent (or `row` is no map).
fn field(row: &Value, name: &str) -> Option<Value> {
    if row.kind() != ValueKind::Map {
        return None;
    }
    row.get_attr(name).ok().filter(|v| !v.is_undefined())
}

/// The items of a list, or an error naming `what`.
fn list_items(list: &Value, what: &str) -> Result<Vec<Value>, String> {
    if list.kind() != ValueKind::Seq {
        return Err(format!("{what:?} is {}, not a list", kind(list)));
    }
    Ok(list.try_iter().map_err(|e| e.to_string())?.collect())
}

/// A map's keys, for messages.
fn keys(row: &Value) -> Vec<String> {
    row.try_iter()
        .map(|it| it.map(|k| format!("{:?}", k.to_string())).collect())
        .unwrap_or_default()
}

/// What a value is, in words.
fn kind(v: &Value) -> &'static str {
    match v.kind() {
        ValueKind::Undefined => "undefined",
        ValueKind::None => "null",
        ValueKind::Bool => "a boolean",
        ValueKind::Number => "a number",
        ValueKind::String => "a string",
        ValueKind::Seq => "a list",
        ValueKind::Map => "an object",
        _ => "something else",
    }
}
