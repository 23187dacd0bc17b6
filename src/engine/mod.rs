//! The fast encoding engine: byte-level BPE with ids identical to HF
//! tokenizers, for the tokenizers whose every step it knows.
//!
//! [`FastTokenizer::from_json`] reads a `tokenizer.json` and accepts it only
//! if each stage is one the engine reproduces exactly; anything else is
//! [`Unsupported`], with the reason, and prep runs HF tokenizers instead.
//! What it accepts:
//!
//! - **added tokens** with `single_word`, `lstrip` and `rstrip` off, split
//!   out of the raw text as HF does even without `add_special_tokens`: first
//!   the tokens with `normalized: false`, then, within what is left, those
//!   with `normalized: true`, each set by leftmost-longest match;
//! - **normalizer**: none, or an empty `Sequence`;
//! - **pre-tokenizer**: `ByteLevel` with its GPT-2 pattern, or a `Split`
//!   (`Isolated`) with the cl100k / Llama 3 or o200k pattern then
//!   `ByteLevel` without its own pattern, or DeepSeek V3's three splits; the
//!   patterns are recognised by their text and run by [`scan`], never by a
//!   regex; `add_prefix_space` must be off;
//! - **model**: `BPE` with no dropout, no subword prefix or suffix, no byte
//!   fallback, and a token for each of the 256 bytes.
//!
//! The post-processor and decoder do not touch the ids of
//! `encode(text, add_special_tokens=false)`, which is what prep asks for.
//!
//! [`LoadedTokenizer`] loads a `tokenizer.json` for every stage that needs
//! one (HF tokenizers' reading of it, and this engine's beside it), chooses
//! the default end-of-document token, and [`token_arg`] is the one rule by
//! which `--eos`, `--bos`, `--pad` and `--sep` name a token.

mod bpe;
pub mod scan;
mod tokenizer;
mod unicode;

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use foldhash::fast::FixedState;
use serde_json::Value;

use bpe::{Bpe, BpeState, Merge};
pub use scan::Pattern;
pub use tokenizer::{
    read_tokenizer_bytes, token_arg, DefaultEos, LoadedTokenizer, PostProcessorTokens,
    TokenArgError, TokenizerError, EOS_NAMES, TOKEN_PREFIX,
};

/// Why the fast engine does not take a tokenizer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

/// Which engine encodes, as asked on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineChoice {
    /// The fast engine when it supports the tokenizer, else HF tokenizers.
    #[default]
    Auto,
    /// HF tokenizers, always.
    Hf,
    /// The fast engine; a tokenizer it does not support is an error.
    Fast,
}

/// A byte-level BPE tokenizer the fast engine runs.
pub struct FastTokenizer {
    pattern: Pattern,
    bpe: Bpe,
    /// Added tokens matched on the raw text.
    raw: Option<Added>,
    /// Added tokens matched on the normalized text (the same text here).
    normalized: Option<Added>,
    /// Tells this tokenizer's cached pieces from another's.
    serial: u64,
}

/// One worker's buffers and cache of encoded pieces. A state used with
/// another tokenizer empties its cache first, so it cannot mix them.
#[derive(Default)]
pub struct EncodeState {
    serial: u64,
    bpe: BpeState,
}

/// Serial numbers of tokenizers, from 1 (a fresh state belongs to none).
static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A set of added tokens, found by leftmost-longest match.
struct Added {
    matcher: AhoCorasick,
    ids: Vec<u32>,
}

impl Added {
    fn new(tokens: Vec<(String, u32)>) -> Result<Option<Added>, Unsupported> {
        if tokens.is_empty() {
            return Ok(None);
        }
        let (patterns, ids): (Vec<String>, Vec<u32>) = tokens.into_iter().unzip();
        let matcher = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .map_err(|e| Unsupported(format!("added tokens: {e}")))?;
        Ok(Some(Added { matcher, ids }))
    }
}

/// Appends the ids of `text`: `added`'s tokens as their ids, the text
/// between them through `between`.
#[inline]
fn split_added(
    added: Option<&Added>,
    text: &str,
    out: &mut Vec<u32>,
    between: &mut dyn FnMut(&str, &mut Vec<u32>),
) {
    let Some(added) = added else {
        return between(text, out);
    };
    let mut last = 0;
    for m in added.matcher.find_iter(text) {
        between(&text[last..m.start()], out);
        out.push(added.ids[m.pattern().as_usize()]);
        last = m.end();
    }
    between(&text[last..], out);
}

impl FastTokenizer {
    /// Reads a `tokenizer.json`, or says why the fast engine cannot run it.
    pub fn from_json(json: &[u8]) -> Result<FastTokenizer, Unsupported> {
        let root: File = serde_json::from_slice(json)
            .map_err(|e| Unsupported(format!("not a tokenizer.json: {e}")))?;
        match &root.normalizer {
            Value::Null => {}
            n if n["type"] == "Sequence"
                && n["normalizers"].as_array().is_some_and(|a| a.is_empty()) => {}
            n => {
                return Err(Unsupported(format!(
                    "normalizer {} is not supported",
                    n["type"]
                )))
            }
        }
        let pattern = pre_tokenizer(&root.pre_tokenizer)?;
        let bpe = model(&root.model)?;
        let (raw, normalized) = added_tokens(&root.added_tokens, &root.model.vocab)?;
        Ok(FastTokenizer {
            pattern,
            bpe,
            raw: Added::new(raw)?,
            normalized: Added::new(normalized)?,
            serial: SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// The split pattern recognised in the file.
    pub fn pattern(&self) -> Pattern {
        self.pattern
    }

    /// Appends the ids of `text` to `out`: exactly HF tokenizers'
    /// `encode(text, add_special_tokens=False).ids`.
    pub fn encode(&self, text: &str, state: &mut EncodeState, out: &mut Vec<u32>) {
        if state.serial != self.serial {
            *state = EncodeState {
                serial: self.serial,
                bpe: BpeState::default(),
            };
        }
        // HF's two passes: tokens that are not normalized are split out of
        // the raw text, then normalized ones out of what lies between.
        split_added(self.raw.as_ref(), text, out, &mut |text, out| {
            split_added(self.normalized.as_ref(), text, out, &mut |text, out| {
                self.encode_plain(text, state, out)
            })
        });
    }

    /// Pre-tokenizes and encodes text with no added tokens in it.
    #[inline]
    fn encode_plain(&self, text: &str, state: &mut EncodeState, out: &mut Vec<u32>) {
        let bpe = &self.bpe;
        let cache = &mut state.bpe;
        self.pattern
            .split(text, &mut |piece| bpe.encode(piece.as_bytes(), cache, out));
    }
}

/// The parts of a `tokenizer.json` the engine reads; the vocabulary goes
/// straight into a hash map (a JSON tree of it would be slow to build and
/// slow to search).
#[derive(serde::Deserialize)]
struct File {
    #[serde(default)]
    normalizer: Value,
    #[serde(default)]
    pre_tokenizer: Value,
    model: Model,
    #[serde(default)]
    added_tokens: Vec<Value>,
}

#[derive(serde::Deserialize)]
struct Model {
    #[serde(rename = "type", default)]
    kind: Value,
    #[serde(default)]
    dropout: Value,
    #[serde(default)]
    continuing_subword_prefix: Value,
    #[serde(default)]
    end_of_word_suffix: Value,
    #[serde(default)]
    byte_fallback: Value,
    #[serde(default)]
    ignore_merges: Value,
    #[serde(default)]
    vocab: Vocab,
    #[serde(default)]
    merges: Vec<Value>,
}

type Vocab = HashMap<String, u32, FixedState>;

fn pre_tokenizer(p: &Value) -> Result<Pattern, Unsupported> {
    let unsupported = |what: &str| Err(Unsupported(format!("pre-tokenizer: {what}")));
    let byte_level = |p: &Value, regex: bool| {
        p["type"] == "ByteLevel"
            && p["add_prefix_space"] == false
            && p["use_regex"].as_bool().unwrap_or(true) == regex
    };
    let split = |p: &Value| -> Option<String> {
        let isolated = p["type"] == "Split"
            && p["behavior"] == "Isolated"
            && p["invert"].as_bool() != Some(true);
        isolated.then(|| p["pattern"]["Regex"].as_str().map(canonical))?
    };
    if byte_level(p, true) {
        return Ok(Pattern::Gpt2);
    }
    if p["type"] != "Sequence" {
        return unsupported(&format!("{} is not supported", p["type"]));
    }
    let steps = p["pretokenizers"].as_array().map_or(&[][..], Vec::as_slice);
    let Some((last, splits)) = steps.split_last() else {
        return unsupported("an empty sequence");
    };
    if !byte_level(last, false) {
        return unsupported("the sequence does not end in ByteLevel without its own pattern (or adds a prefix space)");
    }
    let splits: Option<Vec<String>> = splits.iter().map(split).collect();
    let splits = splits.unwrap_or_default();
    let splits: Vec<&str> = splits.iter().map(String::as_str).collect();
    match splits[..] {
        [p] if p == scan::GPT2 => Ok(Pattern::Gpt2),
        [p] if p == scan::CL100K => Ok(Pattern::Cl100k),
        [p] if p == scan::O200K => Ok(Pattern::O200k),
        [a, b, c]
            if a == scan::DEEPSEEK_DIGITS && b == scan::DEEPSEEK_CJK && c == scan::DEEPSEEK =>
        {
            Ok(Pattern::DeepSeek)
        }
        _ => unsupported("the split patterns are not ones the fast engine knows"),
    }
}

/// A pattern as the scanners' constants spell it: files write carriage
/// return and line feed either escaped or as the characters themselves.
fn canonical(pattern: &str) -> String {
    pattern.replace('\r', r"\r").replace('\n', r"\n")
}

/// GPT-2's map from bytes to the characters byte-level vocabularies use.
fn byte_chars() -> [char; 256] {
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        chars[b as usize] = if printable {
            b as char
        } else {
            let c = char::from_u32(next).expect("below the surrogates");
            next += 1;
            c
        };
    }
    chars
}

fn model(m: &Model) -> Result<Bpe, Unsupported> {
    let unsupported = |what: String| Err(Unsupported(format!("model: {what}")));
    if m.kind != "BPE" {
        return unsupported(format!("{} is not byte-level BPE", m.kind));
    }
    if !(m.dropout.is_null() || m.dropout.as_f64() == Some(0.0)) {
        return unsupported("dropout".into());
    }
    for (key, value) in [
        ("continuing_subword_prefix", &m.continuing_subword_prefix),
        ("end_of_word_suffix", &m.end_of_word_suffix),
    ] {
        if !(value.is_null() || value == "") {
            return unsupported(format!("{key} is set"));
        }
    }
    if m.byte_fallback == true {
        return unsupported("byte_fallback".into());
    }
    let vocab = &m.vocab;
    let id = |token: &str| vocab.get(token).copied();
    let chars = byte_chars();
    let mut byte_ids = [0u32; 256];
    for (b, c) in chars.iter().enumerate() {
        match id(c.encode_utf8(&mut [0; 4])) {
            Some(i) => byte_ids[b] = i,
            None => return unsupported(format!("no token for byte {b:#04x}")),
        }
    }
    let mut merges = HashMap::with_capacity_and_hasher(m.merges.len(), FixedState::default());
    let mut joined = String::new();
    for (rank, line) in m.merges.iter().enumerate() {
        let pair: Option<(&str, &str)> = match line {
            Value::String(s) => s.split_once(' ').filter(|(_, b)| !b.contains(' ')),
            Value::Array(a) if a.len() == 2 => a[0].as_str().zip(a[1].as_str()),
            _ => None,
        };
        let Some((a, b)) = pair else {
            return unsupported(format!("merge {rank} is not a pair"));
        };
        joined.clear();
        joined.push_str(a);
        joined.push_str(b);
        let (Some(left), Some(right), Some(new)) = (id(a), id(b), id(&joined)) else {
            return unsupported(format!("merge {rank} names tokens not in the vocabulary"));
        };
        // As in HF, a pair listed twice keeps its last rank.
        merges.insert(
            u64::from(left) << 32 | u64::from(right),
            Merge {
                rank: rank as u32,
                id: new,
            },
        );
    }
    let whole = (m.ignore_merges == true).then(|| {
        let mut byte_of = HashMap::new();
        for (b, c) in chars.iter().enumerate() {
            byte_of.insert(*c, b as u8);
        }
        vocab
            .iter()
            .filter_map(|(token, id)| {
                let bytes: Option<Box<[u8]>> =
                    token.chars().map(|c| byte_of.get(&c).copied()).collect();
                Some((bytes?, *id))
            })
            .collect()
    });
    Ok(Bpe {
        byte_ids,
        merges,
        whole,
    })
}

type AddedLists = (Vec<(String, u32)>, Vec<(String, u32)>);

fn added_tokens(list: &[Value], vocab: &Vocab) -> Result<AddedLists, Unsupported> {
    let (mut raw, mut normalized) = (Vec::new(), Vec::new());
    let mut seen = std::collections::HashSet::new();
    for t in list {
        let (Some(content), Some(id)) = (t["content"].as_str(), t["id"].as_u64()) else {
            return Err(Unsupported("an added token without content or id".into()));
        };
        for flag in ["single_word", "lstrip", "rstrip"] {
            if t[flag] == true {
                return Err(Unsupported(format!("added token {content:?} sets {flag}")));
            }
        }
        if content.is_empty() {
            continue;
        }
        // HF gives a token the model's id when the model has it; a file that
        // says otherwise, or lists a token twice, is left to HF.
        if vocab.get(content).is_some_and(|&v| u64::from(v) != id) {
            return Err(Unsupported(format!(
                "added token {content:?} has another id in the model"
            )));
        }
        if !seen.insert(content) {
            return Err(Unsupported(format!(
                "added token {content:?} is listed twice"
            )));
        }
        // HF's default for a token that does not say is `!special`.
        let is_normalized = t["normalized"].as_bool().unwrap_or(t["special"] != true);
        let list = if is_normalized {
            &mut normalized
        } else {
            &mut raw
        };
        list.push((content.to_owned(), id as u32));
    }
    Ok((raw, normalized))
}
