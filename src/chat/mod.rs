//! Chat data: conversations rendered by the model's own chat template, and
//! the loss mask that says which of their tokens are trained on.
//!
//! A row becomes a [`Conversation`] by [`shape`]'s rule; the template (the
//! `prep_chat` crate renders it as `transformers` does) turns it into text;
//! the tokenizer turns the text into ids with no special token of its own;
//! and the spans of the text that are trained on become a mask with one
//! byte per id.
//!
//! The spans, policy `assistant`: a template with `{% generation %}` blocks
//! names them itself. Otherwise each assistant message's span runs from
//! where the conversation before it, rendered with the generation prompt,
//! parts from the conversation up to it, to where that parts from the whole
//! (see [`reply_span`]); the reply's own text must lie inside, so a template
//! that rewrites earlier turns cannot place a mask wrongly: the row is
//! refused as unverifiable. A token is trained on when it begins inside a
//! span and runs past its end by whitespace at most: the prompt never is
//! (see [`mask_from_offsets`]). Policy `last` keeps the last span, `all`
//! trains on every token.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use minijinja::value::Value;
use prep_chat::{Now, RenderError, RenderInput, Template};

use crate::engine::offsets::Offsets;
use crate::engine::{EncodeState, FastTokenizer};

pub mod shape;

pub use shape::{Conversation, Shape};

/// Which tokens of a conversation are trained on (`--loss-mask`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskPolicy {
    /// Every assistant turn, its end-of-turn tokens included.
    Assistant,
    /// The last assistant turn only.
    Last,
    /// Every token.
    All,
}

impl MaskPolicy {
    /// The policy's name as `--loss-mask` takes it.
    pub fn name(self) -> &'static str {
        match self {
            MaskPolicy::Assistant => "assistant",
            MaskPolicy::Last => "last",
            MaskPolicy::All => "all",
        }
    }
}

/// What to do with a conversation longer than `--max-tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlong {
    /// Skip it, counted.
    Drop,
    /// Keep its first tokens and their mask, counted.
    Truncate,
}

/// Everything chat mode is asked to do.
#[derive(Debug, Clone)]
pub struct ChatConfig {
    /// The template: a `.jinja` file, a `tokenizer_config.json` or
    /// `chat_template.json`, or a directory holding them; `None` looks
    /// beside the tokenizer file.
    pub template: Option<PathBuf>,
    /// Which of a list of named templates (`--chat-template-name`).
    pub template_name: Option<String>,
    /// How rows hold their conversation.
    pub shape: Shape,
    /// Which tokens are trained on.
    pub policy: MaskPolicy,
    /// The date `strftime_now` gives templates, `YYYY-MM-DD`.
    pub date: String,
    /// Template variables given on the command line, after those the
    /// template's config gives (bos_token, eos_token, ...).
    pub vars: Vec<(String, serde_json::Value)>,
    /// The longest conversation in tokens, and what to do past it.
    pub max_tokens: Option<(usize, Overlong)>,
}

impl ChatConfig {
    /// Chat mode with the defaults: the tokenizer's own template, shapes
    /// detected, assistant turns trained on, the date 2026-01-01.
    pub fn new() -> ChatConfig {
        ChatConfig {
            template: None,
            template_name: None,
            shape: Shape::Auto,
            policy: MaskPolicy::Assistant,
            date: DEFAULT_DATE.into(),
            vars: Vec::new(),
            max_tokens: None,
        }
    }
}

impl Default for ChatConfig {
    fn default() -> Self {
        ChatConfig::new()
    }
}

/// The date `strftime_now` gives a template unless `--chat-date` says
/// otherwise: fixed, so that two runs render the same text.
pub const DEFAULT_DATE: &str = "2026-01-01";

/// Why chat mode cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ChatSetupError {
    /// The template cannot be found, read or compiled.
    #[error("{}: {message}", path.display())]
    Template {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A flag's value is not usable.
    #[error("{0}")]
    Usage(String),
}

/// Why one row is not trained on. Each is counted by its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowError {
    /// The row is no conversation prep can read.
    Malformed(String),
    /// The template refused the conversation (`raise_exception`) or failed on it.
    Refused(String),
    /// The trained spans cannot be verified (see the module docs).
    Unverifiable(String),
}

impl std::fmt::Display for RowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RowError::Malformed(m) => write!(f, "not a conversation: {m}"),
            RowError::Refused(m) => write!(f, "the chat template refused it: {m}"),
            RowError::Unverifiable(m) => write!(f, "its loss mask cannot be verified: {m}"),
        }
    }
}

/// The loaded template(s) and everything a worker needs to render a row.
pub struct Chat {
    /// The template used for rows without tools.
    template: Template,
    /// The template for rows with tools, where a list of named templates
    /// has a `tool_use` one and none was named.
    tool_use: Option<Template>,
    vars: Vec<(String, Value)>,
    now: Now,
    shape: Shape,
    policy: MaskPolicy,
    /// Where the template came from, for the summary.
    pub source: String,
    /// The options the manifest records.
    pub options: serde_json::Value,
    /// The xxh3 of the template text(s), for the fingerprint.
    pub template_xxh3: u64,
    /// The fast engine, where it can place the mask (see [`Chat::use_fast`]).
    fast: Option<FastEngine>,
}

/// The fast engine as chat mode runs it: the tokenizer, what places its
/// tokens on the text, and one encoding state per worker thread.
struct FastEngine {
    tokenizer: Box<FastTokenizer>,
    offsets: Offsets,
    states: Vec<Mutex<EncodeState>>,
}

/// One rendered and tokenized conversation.
pub struct Encoded {
    /// Trained-on tokens among those pushed.
    pub trainable: u64,
    /// Bytes of rendered text.
    pub text_bytes: usize,
    /// Whether HF tokenizers placed the mask in a run on the fast engine.
    pub placed_by_hf: bool,
    /// XXH3-128 of the rendered text: what `--dedup` compares.
    pub text_hash: u128,
}

impl Chat {
    /// Loads the template `config` names (or the one beside `tokenizer`).
    pub fn load(config: &ChatConfig, tokenizer: &Path) -> Result<Chat, ChatSetupError> {
        let found = find::find(config.template.as_deref(), tokenizer)?;
        let (text, tool_use) = find::choose(&found, config.template_name.as_deref())?;
        let compile = |source: &str| {
            Template::new(source).map_err(|e| ChatSetupError::Template {
                path: found.path.clone(),
                message: e.to_string(),
            })
        };
        let now = parse_date(&config.date)?;
        let mut vars: Vec<(String, Value)> = found.vars.clone();
        for (k, v) in &config.vars {
            let v = prep_chat::value_from_json(&v.to_string())
                .map_err(|e| ChatSetupError::Usage(format!("--chat-var {k}: {e}")))?;
            match vars.iter_mut().find(|(name, _)| name == k) {
                Some(slot) => slot.1 = v,
                None => vars.push((k.clone(), v)),
            }
        }
        let mut hashed = text.clone();
        if let Some(t) = &tool_use {
            hashed.push('\0');
            hashed.push_str(t);
        }
        let template_xxh3 = xxhash_rust::xxh3::xxh3_64(hashed.as_bytes());
        let options = serde_json::json!({
            "template": found.path.to_string_lossy(),
            "template_name": config.template_name,
            "template_xxh3": crate::format::checksum_hex(template_xxh3),
            "shape": config.shape.name(),
            "loss_mask": config.policy.name(),
            "date": config.date,
            "vars": vars.iter().map(|(k, v)| (k.clone(), serde_json::to_value(v).unwrap_or_default())).collect::<serde_json::Map<_, _>>(),
            "max_tokens": config.max_tokens.map(|(n, _)| n),
            "overlong": config.max_tokens.map(|(_, o)| match o { Overlong::Drop => "drop", Overlong::Truncate => "truncate" }),
        });
        let template = compile(&text)?;
        let tool_use = tool_use.as_deref().map(compile).transpose()?;
        for name in ["bos_token", "eos_token"] {
            let read = template.reads(name) || tool_use.as_ref().is_some_and(|t| t.reads(name));
            let given =
                vars.iter().any(|(k, _)| k == name) || found.named.iter().any(|k| k == name);
            if read && !given {
                return Err(undefined_token(&found, name));
            }
        }
        Ok(Chat {
            template,
            tool_use,
            vars,
            now,
            shape: config.shape,
            policy: config.policy,
            source: found.describe(),
            options,
            template_xxh3,
            fast: None,
        })
    }

    /// Encodes with the fast engine from now on, `threads` workers at a
    /// time: each rendering is encoded by `tokenizer` (ids identical to HF
    /// tokenizers') and its tokens placed on the text by `offsets`; a
    /// rendering whose tokens are not its text byte for byte is encoded
    /// again by HF tokenizers, for its offsets.
    pub fn use_fast(&mut self, tokenizer: FastTokenizer, offsets: Offsets, threads: usize) {
        self.fast = Some(FastEngine {
            tokenizer: Box::new(tokenizer),
            offsets,
            states: (0..threads.max(1))
                .map(|_| Mutex::new(EncodeState::default()))
                .collect(),
        });
    }

    /// Renders one JSON row and tokenizes it with `tokenizer`: its ids go
    /// to `tokens`, one mask byte per id to `mask`.
    ///
    /// # Errors
    /// [`RowError`] for a row that is no conversation, one the template
    /// refuses, or one whose mask cannot be verified; nothing is pushed.
    pub fn encode(
        &self,
        row: &str,
        tokenizer: &tokenizers::Tokenizer,
        tokens: &mut Vec<u32>,
        mask: &mut Vec<u8>,
    ) -> Result<Encoded, RowError> {
        let row = prep_chat::value_from_json(row).map_err(RowError::Malformed)?;
        let conv = shape::conversation(&row, self.shape).map_err(RowError::Malformed)?;
        let (text, spans) = self.render_with_spans(&conv)?;
        let start = mask.len();
        let fast = self.encode_fast(&text, spans.as_deref(), tokens, mask);
        if !fast {
            let encoding = tokenizer
                .encode(text.as_str(), false)
                .map_err(|e| RowError::Refused(format!("the tokenizer failed: {e}")))?;
            tokens.extend_from_slice(encoding.get_ids());
            match spans {
                Some(spans) => mask_from_offsets(&text, encoding.get_offsets(), &spans, mask),
                None => mask.resize(start + encoding.get_ids().len(), 1),
            }
        }
        let trainable = mask[start..].iter().map(|&m| u64::from(m)).sum();
        Ok(Encoded {
            trainable,
            text_bytes: text.len(),
            placed_by_hf: self.fast.is_some() && !fast,
            text_hash: xxhash_rust::xxh3::xxh3_128(text.as_bytes()),
        })
    }

    /// Encodes `text` with the fast engine and masks it by `spans` (every
    /// token for `None`); `false`, with nothing pushed, when there is no
    /// fast engine or its tokens are not the text byte for byte.
    fn encode_fast(
        &self,
        text: &str,
        spans: Option<&[Range<usize>]>,
        tokens: &mut Vec<u32>,
        mask: &mut Vec<u8>,
    ) -> bool {
        let Some(fast) = &self.fast else {
            return false;
        };
        let slot = rayon::current_thread_index().unwrap_or(0) % fast.states.len();
        let mut state = fast.states[slot].lock().unwrap_or_else(|e| e.into_inner());
        let start = tokens.len();
        fast.tokenizer.encode(text, &mut state, tokens);
        let Some(spans) = spans else {
            mask.resize(mask.len() + tokens.len() - start, 1);
            return true;
        };
        let mut offsets = Vec::with_capacity(tokens.len() - start);
        if !fast.offsets.of(&tokens[start..], text, &mut offsets) {
            tokens.truncate(start);
            return false;
        }
        mask_from_offsets(text, &offsets, spans, mask);
        true
    }

    /// The whole rendering and its trained spans, as the policy says
    /// (`None`: every token, policy `all`).
    fn render_with_spans(&self, conv: &Conversation) -> Result<(String, Option<Spans>), RowError> {
        let template = match (&conv.tools, &self.tool_use) {
            (Some(_), Some(t)) => t,
            _ => &self.template,
        };
        let render = |messages: &[Value], add_generation_prompt: bool| {
            let n = messages.len();
            let messages = Value::from(messages.to_vec());
            let input = RenderInput {
                messages: &messages,
                tools: conv.tools.as_ref(),
                documents: None,
                add_generation_prompt,
                vars: &self.vars,
                now: self.now,
            };
            template.render(&input).map_err(|e| refusal(e, conv, n))
        };
        let whole = render(&conv.messages, false)?;
        let text = whole.text;
        if self.policy == MaskPolicy::All {
            return Ok((text, None));
        }
        // Which assistant turns are trained on, by their `weight`.
        let weights = conv
            .messages
            .iter()
            .enumerate()
            .filter(|(_, m)| is_assistant(m))
            .map(|(i, m)| trained_weight(i, m))
            .collect::<Result<Vec<bool>, RowError>>()?;
        // One span per assistant turn, in order (a template's generation
        // blocks, or each reply placed by prefix renderings).
        let spans: Spans = match template.has_generation() {
            true => whole.generation,
            false => {
                let mut spans: Spans = Vec::new();
                for (i, m) in conv.messages.iter().enumerate() {
                    if !is_assistant(m) {
                        continue;
                    }
                    let unverifiable = |what: &str, e: RowError| {
                        RowError::Unverifiable(format!(
                            "rendering the turns {what} assistant message {i}: {e}"
                        ))
                    };
                    let before =
                        render(&conv.messages[..i], true).map_err(|e| unverifiable("before", e))?;
                    let upto = render(&conv.messages[..=i], false)
                        .map_err(|e| unverifiable("up to", e))?;
                    let span = reply_span(&before.text, &upto.text, &text, m).map_err(|why| {
                        RowError::Unverifiable(format!("assistant message {i}: {why}"))
                    })?;
                    if spans.last().is_some_and(|last| last.end > span.start) {
                        return Err(RowError::Unverifiable(format!(
                            "assistant message {i}'s reply does not come after the one before it"
                        )));
                    }
                    spans.push(span);
                }
                spans
            }
        };
        let mut spans: Spans = if weights.iter().all(|&w| w) {
            spans
        } else if spans.len() == weights.len() {
            spans
                .into_iter()
                .zip(&weights)
                .filter_map(|(span, &w)| w.then_some(span))
                .collect()
        } else {
            return Err(RowError::Unverifiable(format!(
                "a turn has weight 0, but the template's {} generation blocks are not its {} \
                 assistant turns one for one",
                spans.len(),
                weights.len()
            )));
        };
        if self.policy == MaskPolicy::Last {
            spans = spans.pop().into_iter().collect();
        }
        Ok((text, Some(spans)))
    }
}

/// A row the template failed on, or refused (`raise_exception`). When it
/// failed and one of the first `n` messages has a field that is null or a
/// content that is missing (transformers drops null fields before the
/// template sees them, so it reads them as undefined), the error names
/// that message and field first: the template's own words ("unsupported
/// types string and undefined") say neither.
fn refusal(error: RenderError, conv: &Conversation, n: usize) -> RowError {
    match error {
        RenderError::Raised(m) => RowError::Refused(m),
        RenderError::Failed(m) => match absent_field(conv, n) {
            Some(field) => RowError::Refused(format!("{field} ({m})")),
            None => RowError::Refused(m),
        },
    }
}

/// The first of the first `n` messages with a missing `content` or a
/// null field, in words: `message 2: field "content" is null`. Only for
/// rows of OpenAI messages, whose indices are the row's own (the other
/// shapes make every field they write a string).
fn absent_field(conv: &Conversation, n: usize) -> Option<String> {
    if conv.shape != Shape::Messages {
        return None;
    }
    let messages = &conv.messages[..n.min(conv.messages.len())];
    let no_content = messages.iter().position(|m| {
        m.get_attr("content")
            .map_or(true, |c| c.is_undefined() || c.is_none())
    });
    if let Some(i) = no_content {
        let content = messages[i].get_attr("content").unwrap_or_default();
        return Some(match content.is_none() {
            true => format!("message {i}: field \"content\" is null"),
            false => format!("message {i}: no field \"content\""),
        });
    }
    messages.iter().enumerate().find_map(|(i, m)| {
        let keys = m.try_iter().ok()?;
        keys.into_iter()
            .find(|k| m.get_item(k).is_ok_and(|v| v.is_none()))
            .map(|k| format!("message {i}: field {:?} is null", k.to_string()))
    })
}

/// The refusal of a template that reads `name` (`bos_token`, `eos_token`)
/// when nothing gives it: rendered, it would print as nothing (as
/// transformers prints an undefined variable), and every conversation
/// would silently lose that token.
fn undefined_token(found: &find::Found, name: &str) -> ChatSetupError {
    let looked = match &found.config {
        Some(config) => format!("{} does not name it", config.display()),
        None => {
            "no tokenizer_config.json is beside the template or in the tokenizer's folder".into()
        }
    };
    ChatSetupError::Template {
        path: found.path.clone(),
        message: format!(
            "the chat template uses `{name}`, and nothing gives it ({looked}, and no \
             --chat-var {name}=... is given): every conversation would be rendered without \
             it. Give the model's tokenizer_config.json (beside the template, or in the model \
             folder given as --tokenizer or --chat-template), or pass --chat-var {name}=VALUE"
        ),
    }
}

/// Where one assistant reply lies in the whole rendering `whole`, from
/// `before` (the turns before it, rendered with the generation prompt) and
/// `upto` (the turns up to it): it starts where `before` and `upto` part
/// (a template may open a reply with more than it keeps, such as a
/// `<think>` the generation prompt adds) and ends where `upto` and `whole`
/// part (a template may close the last turn with more than an inner one,
/// such as an eos at the very end). A template that renders an earlier
/// turn differently inside the whole (one that drops earlier `<think>`
/// blocks) is caught by the reply's own text: its content (trimmed), or
/// else its tool calls' names, must lie inside the span.
fn reply_span(
    before: &str,
    upto: &str,
    whole: &str,
    message: &Value,
) -> Result<Range<usize>, String> {
    let start = common_prefix(before, upto);
    let end = common_prefix(upto, whole);
    if end <= start {
        return Err("the text through the reply does not continue the conversation's text past the reply's prompt".into());
    }
    let span = &whole[start..end];
    let content = message
        .get_attr("content")
        .ok()
        .and_then(|c| c.as_str().map(|s| python_strip(s).to_owned()))
        .unwrap_or_default();
    let only_tool_calls = content.is_empty();
    let needles: Vec<String> = if only_tool_calls {
        tool_call_names(message)
    } else {
        vec![content]
    };
    match needles.iter().find(|n| !span.contains(n.as_str())) {
        Some(missing) if only_tool_calls && !whole.contains(missing.as_str()) => Err(format!(
            "the template does not render the reply's tool calls (the name {:?} is nowhere \
             in its text), so the reply would be trained as an empty turn",
            missing.chars().take(40).collect::<String>()
        )),
        Some(missing) => Err(format!(
            "the template renders the reply differently inside the whole conversation \
             (its text {:?} is not where the reply is)",
            missing.chars().take(40).collect::<String>()
        )),
        None => Ok(start..end),
    }
}

/// `s` without the whitespace Python's `str.strip()` removes (Unicode's,
/// and the separators U+001C to U+001F).
fn python_strip(s: &str) -> &str {
    s.trim_matches(is_python_space)
}

/// Whether Python's `str.isspace()` holds for `c`: Unicode's whitespace,
/// and the separators U+001C to U+001F.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The length in bytes of the longest common prefix of `a` and `b` that
/// ends on a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// The names of a message's tool calls (`function.name`, or `name`).
fn tool_call_names(message: &Value) -> Vec<String> {
    let Ok(calls) = message.get_attr("tool_calls") else {
        return Vec::new();
    };
    let Ok(calls) = calls.try_iter() else {
        return Vec::new();
    };
    calls
        .filter_map(|call| {
            let function = call.get_attr("function").ok().filter(|f| !f.is_undefined());
            let name = function.unwrap_or(call).get_attr("name").ok()?;
            name.as_str().map(str::to_owned)
        })
        .collect()
}

/// Whether a message is the assistant's.
/// Whether assistant message `i` is trained on, by its `weight` (OpenAI's
/// fine-tuning format): absent (or null) or 1, yes; 0, no; anything else
/// is no conversation prep reads.
fn trained_weight(i: usize, message: &Value) -> Result<bool, RowError> {
    let Ok(weight) = message.get_attr("weight") else {
        return Ok(true);
    };
    if weight.is_undefined() || weight.is_none() {
        return Ok(true);
    }
    match f64::try_from(weight.clone()) {
        Ok(1.0) => Ok(true),
        Ok(0.0) => Ok(false),
        _ => Err(RowError::Malformed(format!(
            "message {i}: weight is {weight}, not 0 or 1"
        ))),
    }
}

fn is_assistant(message: &Value) -> bool {
    message
        .get_attr("role")
        .ok()
        .as_ref()
        .and_then(|r| r.as_str())
        == Some("assistant")
}

/// Byte ranges of a rendering that are trained on, in order.
type Spans = Vec<Range<usize>>;

/// Pushes one mask byte per token of `text`: 1 where the token begins
/// inside a span, overlaps it (a token of no width overlaps nothing), and
/// reaches past its end by whitespace at most.
///
/// The prompt is never a target. A token that begins before a span is not
/// trained, whatever of the reply it reaches into: a header that is an
/// added token with `rstrip` takes the reply's leading spaces, newlines or
/// tabs into its offsets (Phi-3's `<|assistant|>`), and a run of newlines
/// can begin in the prompt and end in the reply. Nor is a token that runs
/// past a span's end into more than whitespace: a reply's span, found
/// where two renderings part, can end inside the next turn's header when
/// the text that closes a conversation and that header begin alike
/// (Phi-3's `<|endoftext|>` and `<|user|>` part after `<|`). An
/// end-of-turn token that takes the whitespace after it (`rstrip`) stays
/// trained.
fn mask_from_offsets(
    text: &str,
    offsets: &[(usize, usize)],
    spans: &[Range<usize>],
    mask: &mut Vec<u8>,
) {
    mask.extend(
        offsets
            .iter()
            .map(|&(s, e)| u8::from(spans.iter().any(|span| trained(text, s, e, span)))),
    );
}

/// Whether the token at `s..e` of `text` is trained on by `span` (see
/// [`mask_from_offsets`]).
fn trained(text: &str, s: usize, e: usize, span: &Range<usize>) -> bool {
    let inside = span.start <= s && s < span.end && span.start < e;
    inside
        && (e <= span.end
            || text
                .get(span.end..e)
                .is_some_and(|past| past.chars().all(is_python_space)))
}

/// `YYYY-MM-DD` as the time `strftime_now` formats (midnight).
fn parse_date(date: &str) -> Result<Now, ChatSetupError> {
    let bad = || ChatSetupError::Usage(format!("--chat-date {date:?} is not a date YYYY-MM-DD"));
    let mut parts = date.split('-');
    let (Some(y), Some(m), Some(d), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let year: i32 = y.parse().map_err(|_| bad())?;
    let month: u32 = m.parse().map_err(|_| bad())?;
    let day: u32 = d.parse().map_err(|_| bad())?;
    if y.len() != 4 || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return Err(bad());
    }
    Ok(Now {
        year,
        month,
        day,
        hour: 0,
        minute: 0,
        second: 0,
    })
}

mod find;
