//! HF tokenizers' offsets of a BPE encoding, restated from the tokens' own
//! bytes, for callers that place something on the text by offsets (chat
//! mode's loss mask) but encode with the fast engine, which keeps no
//! offsets. Two families: byte-level BPE, and SentencePiece-style BPE
//! (`▁` for a space, `<0xXX>` byte tokens) with the normalizers and
//! pre-tokenizers that only mark spaces.
//!
//! A byte-level token stands for a fixed run of bytes: its vocabulary
//! string read back through the byte-to-character table, or an added
//! token's content. When the tokens of an encoding, laid back to back, are
//! the text byte for byte, nothing was normalized away or inserted, and HF
//! places every token exactly there: from the start of the character its
//! first byte lies in to the end of the character its last byte lies in.
//! HF's post-processors then trim spaces off the offsets where their
//! `trim_offsets` says so ([`Offsets::of`] applies the same rule, counted
//! as HF counts it). A SentencePiece-style tokenizer may put a `▁` before a
//! text that does not stand for a byte of it (`Prepend`, or `Metaspace`'s
//! `prepend_scheme`); HF places it on the text's first character, and so
//! does [`Offsets::of`]. When the bytes are not the text (a normalizer that
//! changed it, a prefix space, an added token that took the spaces around
//! it), [`Offsets::of`] says so and the caller asks HF tokenizers.

/// The table of what each id stands for, and the post-processor's trim.
pub struct Offsets {
    /// By id: the bytes the token stands for and the leading and trailing
    /// characters HF's trim counts; `None` for an id with no such bytes.
    tokens: Vec<Option<Token>>,
    /// `Some(add_prefix_space)` when the post-processor trims offsets.
    trim: Option<bool>,
    /// Where a SentencePiece-style tokenizer puts a `▁` of its own before a
    /// text between added tokens; `None` for byte-level BPE.
    mark: Option<Mark>,
}

/// When a SentencePiece-style tokenizer puts a `▁` of its own before a
/// text (one between added tokens, or the whole text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    /// Never (no `Prepend`, `Metaspace` with `prepend_scheme: never`, or none).
    Never,
    /// Before every text not starting with a space (`Metaspace`, `always`).
    Always,
    /// Before the text at the start of the input, when it does not start
    /// with a space (`Metaspace`, `first`).
    First,
    /// Before every text (the `Prepend` normalizer).
    Each,
}

struct Token {
    bytes: Box<[u8]>,
    /// An added token's options, `None` for a token of the model.
    added: Option<Added>,
    /// For an id both in the model's vocabulary and an added token whose
    /// content is other bytes (Gemma's `▁▁`): the content and its options.
    /// Where the text holds the content, the id is the added token, which
    /// HF matches before the model runs.
    alt: Option<(Box<[u8]>, Added)>,
    /// Characters of the token's string, from its start, that are the
    /// byte-level space `Ġ` or whitespace: what HF's trim takes off.
    lead: usize,
    /// The same from its end.
    trail: usize,
}

/// What placing an added token needs of its options.
#[derive(Clone, Copy)]
struct Added {
    /// Matched on the normalized text. Every added token ends the text a
    /// pre-tokenizer sees; one matched on the raw text also ends the text
    /// a normalizer sees.
    normalized: bool,
    /// It takes the whitespace before it.
    lstrip: bool,
    /// It takes the whitespace after it.
    rstrip: bool,
}

/// GPT-2's table of bytes to the characters that stand for them: printable
/// bytes stand for themselves, the others for U+0100 onward, in order.
fn byte_of_char() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (char::from(b), b)
            } else {
                next += 1;
                (char::from_u32(0x100 + next - 1).expect("a char"), b)
            }
        })
        .collect()
}

/// Whether HF's trim takes the character off a token's end.
fn trimmed(c: char) -> bool {
    c == 'Ġ' || c.is_whitespace()
}

/// The characters HF's trim counts at the start (or, `rev`, the end) of a
/// token's string.
fn count_trimmed(s: &str, rev: bool) -> usize {
    match rev {
        false => s.chars().take_while(|&c| trimmed(c)).count(),
        true => s.chars().rev().take_while(|&c| trimmed(c)).count(),
    }
}

impl Offsets {
    /// The table for `tokenizer`, or `None` when it is of neither family,
    /// or has a normalizer, pre-tokenizer or post-processor whose effect on
    /// offsets is not restated here.
    pub fn new(tokenizer: &tokenizers::Tokenizer) -> Option<Offsets> {
        let json = |v: Option<serde_json::Value>| v.unwrap_or(serde_json::Value::Null);
        let pre = json(
            tokenizer
                .get_pre_tokenizer()
                .and_then(|p| serde_json::to_value(p).ok()),
        );
        let normalizer = json(
            tokenizer
                .get_normalizer()
                .and_then(|n| serde_json::to_value(n).ok()),
        );
        let model = serde_json::to_value(tokenizer.get_model()).ok()?;
        let trim = match tokenizer.get_post_processor() {
            None => None,
            Some(p) => trim_of(&serde_json::to_value(p).ok()?)?,
        };
        let byte_level = pre.to_string().contains("\"ByteLevel\"");
        let mark = match byte_level {
            true => None,
            false if model.get("type")?.as_str()? == "BPE" && trim.is_none() => {
                Some(sentencepiece_mark(&normalizer, &pre)?)
            }
            false => return None,
        };
        let byte_fallback = model.get("byte_fallback").and_then(|b| b.as_bool()) == Some(true);
        let table = byte_of_char();
        let vocab = tokenizer.get_vocab(false);
        let added = tokenizer.get_added_tokens_decoder();
        let size = vocab
            .values()
            .chain(added.keys())
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        let mut tokens: Vec<Option<Token>> = (0..size).map(|_| None).collect();
        let mut seen = vec![false; size];
        // A BPE vocabulary may spell tokens with a prefix (inside a word)
        // or a suffix (at its end) that stand for no byte.
        let affix = |key: &str| {
            model
                .get(key)
                .and_then(|a| a.as_str())
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
        };
        let (prefix, suffix) = (
            affix("continuing_subword_prefix"),
            affix("end_of_word_suffix"),
        );
        for (string, &id) in &vocab {
            let mut bare = string.as_str();
            if let Some(p) = &prefix {
                bare = bare
                    .strip_prefix(p.as_str())
                    .filter(|b| !b.is_empty())
                    .unwrap_or(bare);
            }
            if let Some(s) = &suffix {
                bare = bare
                    .strip_suffix(s.as_str())
                    .filter(|b| !b.is_empty())
                    .unwrap_or(bare);
            }
            let bytes: Option<Box<[u8]>> = match mark {
                None => bare.chars().map(|c| table.get(&c).copied()).collect(),
                Some(_) => Some(sentencepiece_bytes(bare, byte_fallback)),
            };
            // An id spelled two ways stands for no one run of bytes.
            let slot = &mut tokens[id as usize];
            *slot = match (seen[id as usize], bytes) {
                (false, Some(bytes)) => Some(Token {
                    bytes,
                    added: None,
                    alt: None,
                    lead: count_trimmed(string, false),
                    trail: count_trimmed(string, true),
                }),
                _ => None,
            };
            seen[id as usize] = true;
        }
        // An added token's string in an encoding is its content; HF places
        // it on its match, with the whitespace it takes (`lstrip`, `rstrip`).
        for (&id, token) in &added {
            let options = Added {
                normalized: token.normalized,
                lstrip: token.lstrip,
                rstrip: token.rstrip,
            };
            if let Some(model) = tokens[id as usize].as_mut() {
                if *model.bytes != *token.content.as_bytes() {
                    model.alt = Some((token.content.as_bytes().into(), options));
                    continue;
                }
            }
            tokens[id as usize] = Some(Token {
                bytes: token.content.as_bytes().into(),
                added: Some(options),
                alt: None,
                // Trimmed by its matched string, whitespace taken included
                // (see `of`), not by its content.
                lead: 0,
                trail: 0,
            });
        }
        Some(Offsets { tokens, trim, mark })
    }

    /// HF's byte offsets of `ids`, the encoding of `text`, into `out`
    /// (cleared first); `false`, with `out` unspecified, when the tokens'
    /// bytes back to back are not `text`.
    pub fn of(&self, ids: &[u32], text: &str, out: &mut Vec<(usize, usize)>) -> bool {
        out.clear();
        let bytes = text.as_bytes();
        let mut at = 0;
        // At the start of a text between added tokens, and whether a `▁`
        // of the tokenizer's own is still to come.
        let mut text_start = true;
        let mut own_mark = false;
        for (i, &id) in ids.iter().enumerate() {
            let Some(Some(token)) = self.tokens.get(id as usize) else {
                return false;
            };
            let (mut token_bytes, added) = match &token.alt {
                Some((content, options)) if bytes[at..].starts_with(content) => {
                    (&content[..], Some(*options))
                }
                _ => (&token.bytes[..], token.added),
            };
            if let Some(options) = added {
                // A `Prepend` normalizer marks the texts between the added
                // tokens matched before it runs.
                if self
                    .mark
                    .is_some_and(|m| m != Mark::Each || !options.normalized)
                {
                    text_start = true;
                    own_mark = false;
                }
                let Some(end) = place_added(text, at, token_bytes, options) else {
                    return false;
                };
                let mut offsets = (at, end);
                if let Some(add_prefix_space) = self.trim {
                    // The token's string is its match, whitespace taken included.
                    let matched = &text[at..end];
                    let ends = (count_trimmed(matched, false), count_trimmed(matched, true));
                    trim(&mut offsets, i, ends, add_prefix_space);
                }
                out.push(offsets);
                at = end;
                continue;
            }
            let mut marked = false;
            if let Some(mark) = self.mark {
                if std::mem::take(&mut text_start) {
                    let spaced = bytes.get(at) == Some(&b' ');
                    own_mark = match mark {
                        Mark::Never => false,
                        Mark::Each => true,
                        Mark::Always => !spaced,
                        Mark::First => at == 0 && !spaced,
                    };
                }
                if own_mark {
                    // The tokenizer's `▁`, which stands for no byte.
                    let Some(rest) = token_bytes.strip_prefix(b" ") else {
                        return false;
                    };
                    token_bytes = rest;
                    (own_mark, marked) = (false, true);
                }
            }
            let end = at + token_bytes.len();
            if bytes.get(at..end) != Some(token_bytes) {
                return false;
            }
            // HF aligns a token to whole characters of the text; its own
            // `▁` lies on the text's first character.
            let mut start = at;
            while !text.is_char_boundary(start) {
                start -= 1;
            }
            let mut stop = if marked && end == at {
                at + text[at..].chars().next().map_or(0, char::len_utf8)
            } else {
                end
            };
            while !text.is_char_boundary(stop) {
                stop += 1;
            }
            let mut offsets = (start, stop);
            if let Some(add_prefix_space) = self.trim {
                trim(&mut offsets, i, (token.lead, token.trail), add_prefix_space);
            }
            out.push(offsets);
            at = end;
        }
        at == bytes.len() && !own_mark
    }
}

/// Where an added token whose content is `content` ends when it is placed
/// at `at` of `text`: after the whitespace it takes before its content
/// (`lstrip`, all of it up to `at`, which earlier tokens end at), its
/// content, and the whitespace it takes after (`rstrip`); `None` when the
/// content is not there. Whitespace as HF's `\s` (Unicode White_Space).
fn place_added(text: &str, at: usize, content: &[u8], options: Added) -> Option<usize> {
    let space = |from: usize| {
        text[from..]
            .char_indices()
            .find(|(_, c)| !c.is_whitespace())
            .map_or(text.len() - from, |(i, _)| i)
    };
    let start = if options.lstrip { at + space(at) } else { at };
    let end = start + content.len();
    if text.as_bytes().get(start..end) != Some(content) {
        return None;
    }
    Some(if options.rstrip && text.is_char_boundary(end) {
        end + space(end)
    } else {
        end
    })
}

/// What a SentencePiece-style token stands for: `▁` is a space, and with
/// byte fallback `<0xXX>` is that byte.
fn sentencepiece_bytes(token: &str, byte_fallback: bool) -> Box<[u8]> {
    if byte_fallback && token.len() == 6 && token.starts_with("<0x") && token.ends_with('>') {
        if let Ok(b) = u8::from_str_radix(&token[3..5], 16) {
            return Box::new([b]);
        }
    }
    token
        .replace('\u{2581}', " ")
        .into_bytes()
        .into_boxed_slice()
}

/// Where a SentencePiece-style tokenizer puts a `▁` of its own, from its
/// normalizer and pre-tokenizer; `None` for a step that changes the text
/// otherwise (spaces made `▁` are read back as spaces).
fn sentencepiece_mark(normalizer: &serde_json::Value, pre: &serde_json::Value) -> Option<Mark> {
    let mut steps = Vec::new();
    flatten(normalizer, "normalizers", &mut steps);
    let mut mark = Mark::Never;
    for step in steps {
        match step.get("type")?.as_str()? {
            "Prepend" if step.get("prepend")?.as_str()? == "\u{2581}" => mark = Mark::Each,
            "Replace" if replaces_spaces(step) => {}
            _ => return None,
        }
    }
    let mut steps = Vec::new();
    flatten(pre, "pretokenizers", &mut steps);
    for step in steps {
        match step.get("type")?.as_str()? {
            "Metaspace" => {
                if step.get("replacement")?.as_str()? != "\u{2581}" || mark != Mark::Never {
                    return None;
                }
                let scheme = step.get("prepend_scheme").and_then(|s| s.as_str());
                let legacy = step.get("add_prefix_space").and_then(|a| a.as_bool());
                mark = match (scheme, legacy) {
                    (Some("always"), _) | (None, Some(true) | None) => Mark::Always,
                    (Some("first"), _) => Mark::First,
                    (Some("never"), _) | (None, Some(false)) => Mark::Never,
                    _ => return None,
                };
            }
            // A split cuts the text without changing it; one that drops
            // text fails the check of the bytes.
            "Split" => {}
            _ => return None,
        }
    }
    Some(mark)
}

/// A `Replace` of a space by `▁`.
fn replaces_spaces(step: &serde_json::Value) -> bool {
    step.get("pattern")
        .and_then(|p| p.get("String"))
        .and_then(|s| s.as_str())
        == Some(" ")
        && step.get("content").and_then(|c| c.as_str()) == Some("\u{2581}")
}

/// The steps of `value`, a step or a `Sequence` of them under `key`, in order.
fn flatten<'a>(value: &'a serde_json::Value, key: &str, out: &mut Vec<&'a serde_json::Value>) {
    if value.is_null() {
        return;
    }
    match value.get(key).and_then(|s| s.as_array()) {
        Some(list) if value.get("type").and_then(|t| t.as_str()) == Some("Sequence") => {
            for step in list {
                flatten(step, key, out);
            }
        }
        _ => out.push(value),
    }
}

/// HF's `process_offsets`: spaces off both ends, counted in characters of
/// the token's string (as HF counts them), except the one space a prefix
/// space added in front of the first token.
fn trim(
    offsets: &mut (usize, usize),
    i: usize,
    (lead, trail): (usize, usize),
    add_prefix_space: bool,
) {
    let mut lead = lead;
    if lead > 0 || trail > 0 {
        if lead > 0 {
            let is_first = i == 0 || offsets.0 == 0;
            if is_first && add_prefix_space && lead == 1 {
                lead = 0;
            }
            offsets.0 = (offsets.0 + lead).min(offsets.1);
        }
        if trail > 0 && offsets.1 >= trail {
            offsets.1 = (offsets.1 - trail).max(offsets.0);
        }
    }
}

/// What a post-processor does to offsets: `Some(None)` nothing,
/// `Some(Some(add_prefix_space))` HF's trim, `None` something not restated
/// here (two trims, or a processor of another kind).
fn trim_of(processor: &serde_json::Value) -> Option<Option<bool>> {
    let kind = processor.get("type")?.as_str()?;
    let trims = |p: &serde_json::Value| {
        let on = p
            .get("trim_offsets")
            .and_then(|t| t.as_bool())
            .unwrap_or(false);
        on.then(|| {
            p.get("add_prefix_space")
                .and_then(|a| a.as_bool())
                .unwrap_or(false)
        })
    };
    match kind {
        "TemplateProcessing" | "BertProcessing" => Some(None),
        "ByteLevel" | "RobertaProcessing" => Some(trims(processor)),
        "Sequence" => {
            let mut found = None;
            for step in processor.get("processors")?.as_array()? {
                if let Some(t) = trim_of(step)? {
                    if found.replace(t).is_some() {
                        return None;
                    }
                }
            }
            Some(found)
        }
        _ => None,
    }
}
