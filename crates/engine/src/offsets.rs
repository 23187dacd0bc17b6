//! HF tokenizers' offsets of a byte-level BPE encoding, restated from the
//! tokens' own bytes, for callers that place something on the text by
//! offsets (chat mode's loss mask) but encode with the fast engine, which
//! keeps no offsets.
//!
//! A byte-level token stands for a fixed run of bytes: its vocabulary
//! string read back through the byte-to-character table, or an added
//! token's content. When the tokens of an encoding, laid back to back, are
//! the text byte for byte, nothing was normalized away or inserted, and HF
//! places every token exactly there: from the start of the character its
//! first byte lies in to the end of the character its last byte lies in.
//! HF's post-processors then trim spaces off the offsets where their
//! `trim_offsets` says so ([`Offsets::of`] applies the same rule, counted
//! as HF counts it). When the bytes are not the text (a normalizer that
//! changed it, a prefix space, an added token that took the spaces around
//! it), [`Offsets::of`] says so and the caller asks HF tokenizers.

/// The table of what each id stands for, and the post-processor's trim.
pub struct Offsets {
    /// By id: the bytes the token stands for and the leading and trailing
    /// characters HF's trim counts; `None` for an id with no such bytes.
    tokens: Vec<Option<Token>>,
    /// `Some(add_prefix_space)` when the post-processor trims offsets.
    trim: Option<bool>,
}

struct Token {
    bytes: Box<[u8]>,
    /// Characters of the token's string, from its start, that are the
    /// byte-level space `Ġ` or whitespace: what HF's trim takes off.
    lead: usize,
    /// The same from its end.
    trail: usize,
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

impl Offsets {
    /// The table for `tokenizer`, a byte-level BPE tokenizer (the caller
    /// knows the family: the fast engine runs it as one), or `None` when
    /// its post-processor is one whose effect on offsets is not restated
    /// here.
    pub fn new(tokenizer: &tokenizers::Tokenizer) -> Option<Offsets> {
        let trim = match tokenizer.get_post_processor() {
            None => None,
            Some(p) => trim_of(&serde_json::to_value(p).ok()?)?,
        };
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
        let count = |s: &str, rev: bool| match rev {
            false => s.chars().take_while(|&c| trimmed(c)).count(),
            true => s.chars().rev().take_while(|&c| trimmed(c)).count(),
        };
        // A BPE vocabulary may spell tokens with a prefix (inside a word)
        // or a suffix (at its end) that stand for no byte.
        let model = serde_json::to_value(tokenizer.get_model()).ok()?;
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
            let bytes: Option<Box<[u8]>> = bare.chars().map(|c| table.get(&c).copied()).collect();
            tokens[id as usize] = bytes.map(|bytes| Token {
                bytes,
                lead: count(string, false),
                trail: count(string, true),
            });
        }
        // An added token's string in an encoding is its content.
        for (&id, token) in &added {
            tokens[id as usize] = Some(Token {
                bytes: token.content.as_bytes().into(),
                lead: count(&token.content, false),
                trail: count(&token.content, true),
            });
        }
        Some(Offsets { tokens, trim })
    }

    /// HF's byte offsets of `ids`, the encoding of `text`, into `out`
    /// (cleared first); `false`, with `out` unspecified, when the tokens'
    /// bytes back to back are not `text`.
    pub fn of(&self, ids: &[u32], text: &str, out: &mut Vec<(usize, usize)>) -> bool {
        out.clear();
        let bytes = text.as_bytes();
        let mut at = 0;
        for (i, &id) in ids.iter().enumerate() {
            let Some(Some(token)) = self.tokens.get(id as usize) else {
                return false;
            };
            let end = at + token.bytes.len();
            if bytes.get(at..end) != Some(&token.bytes[..]) {
                return false;
            }
            // HF aligns a token to whole characters of the text.
            let mut start = at;
            while !text.is_char_boundary(start) {
                start -= 1;
            }
            let mut stop = end;
            while !text.is_char_boundary(stop) {
                stop += 1;
            }
            let mut offsets = (start, stop);
            if let Some(add_prefix_space) = self.trim {
                trim(&mut offsets, i, token, add_prefix_space);
            }
            out.push(offsets);
            at = end;
        }
        at == bytes.len()
    }
}

/// HF's `process_offsets`: spaces off both ends, counted in characters of
/// the token's string (as HF counts them), except the one space a prefix
/// space added in front of the first token.
fn trim(offsets: &mut (usize, usize), i: usize, token: &Token, add_prefix_space: bool) {
    let mut lead = token.lead;
    if lead > 0 || token.trail > 0 {
        if lead > 0 {
            let is_first = i == 0 || offsets.0 == 0;
            if is_first && add_prefix_space && lead == 1 {
                lead = 0;
            }
            offsets.0 = (offsets.0 + lead).min(offsets.1);
        }
        if token.trail > 0 && offsets.1 >= token.trail {
            offsets.1 = (offsets.1 - token.trail).max(offsets.0);
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
