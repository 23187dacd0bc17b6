//! Finding a chat template and the variables that come with it, the way a
//! model's folder holds them: `chat_template.jinja`, or `chat_template` in
//! `tokenizer_config.json` (a text, or a list of named texts), or
//! `chat_template.json`; the special tokens' strings (`bos_token`,
//! `eos_token`, ...) from `tokenizer_config.json`.

use std::path::{Path, PathBuf};

use minijinja::value::Value;

use super::ChatSetupError;

/// The special-token strings a template may read, as `transformers` passes
/// them (its `special_tokens_map`).
const SPECIAL_TOKENS: &[&str] = &[
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A template source as found.
pub(super) struct Found {
    /// The file the template text came from.
    pub path: PathBuf,
    templates: Templates,
    /// Variables from the config beside it, in order.
    pub vars: Vec<(String, Value)>,
    /// The special tokens the config names, a string or null: a null one
    /// is the model saying it has none (Qwen's `bos_token`), which the
    /// template then sees undefined, as in transformers.
    pub named: Vec<String>,
    /// The config the variables came from, if any.
    pub config: Option<PathBuf>,
}

enum Templates {
    One(String),
    /// A list of named templates, in the file's order.
    Named(Vec<(String, String)>),
}

impl Found {
    /// Where the template and its variables came from, for the summary.
    pub fn describe(&self) -> String {
        match &self.config {
            Some(c) if *c != self.path => format!(
                "chat template {} with the special tokens of {}",
                self.path.display(),
                c.display()
            ),
            _ => format!("chat template {}", self.path.display()),
        }
    }
}

/// The template `given` names, or the one in the tokenizer's folder.
///
/// The special tokens' strings come with the template: from the config it
/// is in. A template whose file names none (a `.jinja` file, a
/// `chat_template.json`) takes those of the `tokenizer_config.json` beside
/// it, else of the one in the tokenizer's folder, as a model folder holds
/// them and as transformers renders a template passed to
/// `apply_chat_template` with the tokenizer's special tokens.
pub(super) fn find(given: Option<&Path>, tokenizer: &Path) -> Result<Found, ChatSetupError> {
    let folder = tokenizer_folder(tokenizer);
    let mut found = match given {
        Some(path) if path.is_dir() => in_folder(path)?,
        Some(path) => in_file(path)?,
        None => {
            return in_folder(&folder).map_err(|e| match e {
                ChatSetupError::Template { path, message } => ChatSetupError::Template {
                    path,
                    message: format!("{message}; pass --chat-template FILE (a .jinja file, a tokenizer_config.json or a model folder)"),
                },
                other => other,
            })
        }
    };
    if found.named.is_empty() {
        let beside = found.path.with_file_name("tokenizer_config.json");
        for config in [beside, folder.join("tokenizer_config.json")] {
            if found.config.as_ref() == Some(&config) || !config.is_file() {
                continue;
            }
            let json = read_json(&config)?;
            found.vars = special_tokens(&json);
            found.named = named_special_tokens(&json);
            found.config = Some(config);
            break;
        }
    }
    Ok(found)
}

/// The folder a tokenizer's files are in: that of the `tokenizer.json`
/// `tokenizer` resolves to, so that a model folder (`save_pretrained`, a
/// hub cache snapshot, a hub cache model folder) is looked in, not its
/// parent.
fn tokenizer_folder(tokenizer: &Path) -> PathBuf {
    let file = crate::engine::tokenizer_file(tokenizer).unwrap_or_else(|_| tokenizer.to_owned());
    match file.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => dir.to_owned(),
        None => PathBuf::from("."),
    }
}

/// A model folder: `chat_template.jinja`, else the config's
/// `chat_template`, else `chat_template.json`; the config's variables.
fn in_folder(dir: &Path) -> Result<Found, ChatSetupError> {
    let config = dir.join("tokenizer_config.json");
    let jinja = dir.join("chat_template.jinja");
    let wrapper = dir.join("chat_template.json");
    let config_json = if config.is_file() {
        Some(read_json(&config)?)
    } else {
        None
    };
    let vars = config_json.as_ref().map(special_tokens).unwrap_or_default();
    let named = config_json
        .as_ref()
        .map(named_special_tokens)
        .unwrap_or_default();
    let templates = if jinja.is_file() {
        Some((jinja.clone(), Templates::One(read_text(&jinja)?)))
    } else if let Some(t) = config_json
        .as_ref()
        .map(|c| templates_of(&config, c))
        .transpose()?
        .flatten()
    {
        Some((config.clone(), t))
    } else if wrapper.is_file() {
        templates_of(&wrapper, &read_json(&wrapper)?)?.map(|t| (wrapper.clone(), t))
    } else {
        None
    };
    let Some((path, templates)) = templates else {
        return Err(ChatSetupError::Template {
            path: dir.into(),
            message: "no chat template here: no chat_template.jinja, no tokenizer_config.json \
                      with a chat_template, no chat_template.json"
                .into(),
        });
    };
    Ok(Found {
        path,
        templates,
        vars,
        named,
        config: config_json.map(|_| config),
    })
}

/// A file: a JSON config or wrapper holding `chat_template`, else the
/// template's text itself.
fn in_file(path: &Path) -> Result<Found, ChatSetupError> {
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if !is_json {
        return Ok(Found {
            path: path.into(),
            templates: Templates::One(read_text(path)?),
            vars: Vec::new(),
            named: Vec::new(),
            config: None,
        });
    }
    let json = read_json(path)?;
    let vars = special_tokens(&json);
    let named = named_special_tokens(&json);
    let templates = match templates_of(path, &json)? {
        Some(t) => t,
        None => {
            // transformers writes the template beside the config.
            let beside = path.with_file_name("chat_template.jinja");
            if !beside.is_file() {
                return Err(ChatSetupError::Template {
                    path: path.into(),
                    message: "has no chat_template, and no chat_template.jinja is beside it".into(),
                });
            }
            return Ok(Found {
                templates: Templates::One(read_text(&beside)?),
                path: beside,
                vars,
                named,
                config: Some(path.into()),
            });
        }
    };
    Ok(Found {
        path: path.into(),
        templates,
        vars,
        named,
        config: Some(path.into()),
    })
}

/// The `chat_template` of a JSON object: a text or a list of named ones.
fn templates_of(
    path: &Path,
    json: &serde_json::Value,
) -> Result<Option<Templates>, ChatSetupError> {
    let bad = |message: String| ChatSetupError::Template {
        path: path.into(),
        message,
    };
    match json.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(Templates::One(s.clone()))),
        Some(serde_json::Value::Array(list)) => {
            let mut named = Vec::new();
            for (i, item) in list.iter().enumerate() {
                let name = item.get("name").and_then(|n| n.as_str());
                let text = item.get("template").and_then(|t| t.as_str());
                let (Some(name), Some(text)) = (name, text) else {
                    return Err(bad(format!(
                        "chat_template entry {i} is not {{\"name\": ..., \"template\": ...}}"
                    )));
                };
                named.push((name.to_owned(), text.to_owned()));
            }
            Ok(Some(Templates::Named(named)))
        }
        Some(_) => Err(bad(
            "chat_template is neither a text nor a list of named templates".into(),
        )),
    }
}

/// The template to use for rows without tools, and the one for rows with
/// tools when it differs: a named one when `name` is given; else
/// `default`, and `tool_use` for rows with tools where there is one (as
/// `transformers` chooses).
pub(super) fn choose(
    found: &Found,
    name: Option<&str>,
) -> Result<(String, Option<String>), ChatSetupError> {
    let named = match &found.templates {
        Templates::One(text) => {
            if let Some(name) = name {
                return Err(ChatSetupError::Usage(format!(
                    "--chat-template-name {name:?}: {} holds one template, not a list of named ones",
                    found.path.display()
                )));
            }
            return Ok((text.clone(), None));
        }
        Templates::Named(named) => named,
    };
    let get = |n: &str| named.iter().find(|(k, _)| k == n).map(|(_, t)| t.clone());
    let names = || {
        named
            .iter()
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match name {
        Some(n) => get(n).map(|t| (t, None)).ok_or_else(|| {
            ChatSetupError::Usage(format!(
                "--chat-template-name {n:?}: {} has the templates {}",
                found.path.display(),
                names()
            ))
        }),
        None => {
            let default = get("default").ok_or_else(|| {
                ChatSetupError::Usage(format!(
                    "{} has the templates {} and none called \"default\": pass --chat-template-name",
                    found.path.display(),
                    names()
                ))
            })?;
            Ok((default, get("tool_use")))
        }
    }
}

/// The special tokens' strings a config gives (a string, or an object
/// with `content`), and `additional_special_tokens`.
fn special_tokens(json: &serde_json::Value) -> Vec<(String, Value)> {
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => {
            o.get("content").and_then(|c| c.as_str()).map(str::to_owned)
        }
        _ => None,
    };
    let mut vars = Vec::new();
    for key in SPECIAL_TOKENS {
        if let Some(s) = json.get(*key).and_then(text) {
            vars.push(((*key).to_owned(), Value::from(s)));
        }
    }
    if let Some(list) = json
        .get("additional_special_tokens")
        .and_then(|l| l.as_array())
    {
        let list: Vec<Value> = list.iter().filter_map(text).map(Value::from).collect();
        vars.push(("additional_special_tokens".into(), Value::from(list)));
    }
    vars
}

/// The special tokens a config names at all, as a string, an object or
/// null.
fn named_special_tokens(json: &serde_json::Value) -> Vec<String> {
    SPECIAL_TOKENS
        .iter()
        .filter(|key| json.get(**key).is_some())
        .map(|key| (*key).to_owned())
        .collect()
}

fn read_text(path: &Path) -> Result<String, ChatSetupError> {
    std::fs::read_to_string(path).map_err(|e| ChatSetupError::Template {
        path: path.into(),
        message: format!("cannot read: {e}"),
    })
}

fn read_json(path: &Path) -> Result<serde_json::Value, ChatSetupError> {
    let text = read_text(path)?;
    serde_json::from_str(&text).map_err(|e| ChatSetupError::Template {
        path: path.into(),
        message: format!("not JSON: {e}"),
    })
}
