//! Normalizers, as HF tokenizers applies them to the text between added
//! tokens: the same crates and the same per-character rules, so the same
//! Unicode version and the same output.
//!
//! HF keeps an alignment for every character; prep needs only the
//! normalized text, so each step here maps a string to a string, and leaves
//! the text borrowed when it changes nothing (ASCII under the Unicode forms,
//! text the quick check already finds normalized).

use std::borrow::Cow;

use serde_json::Value;
use unicode_normalization_alignments::char::is_combining_mark;
use unicode_normalization_alignments::{
    is_nfc_quick, is_nfd_quick, is_nfkc_quick, is_nfkd_quick, IsNormalized, UnicodeNormalization,
};

use super::bert::BertNormalizer;
use super::dfa::Automaton;
use super::precompiled::Precompiled;
use super::Unsupported;

/// One normalizer of a `tokenizer.json`.
#[derive(Debug, Clone)]
pub(crate) enum Normalizer {
    Nfc,
    Nfd,
    Nfkc,
    Nfkd,
    /// `char::to_lowercase` of each character (no final-sigma rule, as HF).
    Lowercase,
    /// Every non-overlapping occurrence of a string, left to right.
    Replace(String, String),
    /// Every match of a regex, left to right, as onig finds them.
    ReplaceRegex(std::sync::Arc<Automaton>, String),
    /// Prepended to a text that is not empty.
    Prepend(String),
    /// `char::is_whitespace` trimmed from either end.
    Strip {
        left: bool,
        right: bool,
    },
    /// Combining marks removed.
    StripAccents,
    /// BERT's: cleaning, Chinese characters spaced out, accents stripped,
    /// lowercase, each as its file says.
    Bert(BertNormalizer),
    Sequence(Vec<Normalizer>),
    /// SentencePiece's compiled character map (T5, XLM-R).
    Precompiled(Box<Precompiled>),
}

impl Normalizer {
    /// Reads a normalizer; `None` for one that changes nothing.
    pub(crate) fn from_json(n: &Value) -> Result<Option<Normalizer>, Unsupported> {
        if n.is_null() {
            return Ok(None);
        }
        let unsupported = |what: String| Err(Unsupported(format!("normalizer: {what}")));
        let string = |key: &str| n[key].as_str().map(str::to_owned);
        let normalizer = match n["type"].as_str() {
            Some("NFC") => Normalizer::Nfc,
            Some("NFD") => Normalizer::Nfd,
            Some("NFKC") => Normalizer::Nfkc,
            Some("NFKD") => Normalizer::Nfkd,
            Some("Lowercase") => Normalizer::Lowercase,
            Some("StripAccents") => Normalizer::StripAccents,
            Some("BertNormalizer") => Normalizer::Bert(BertNormalizer::from_json(n)?),
            Some("Strip") => Normalizer::Strip {
                left: n["strip_left"].as_bool().unwrap_or(false),
                right: n["strip_right"].as_bool().unwrap_or(false),
            },
            Some("Prepend") => match string("prepend") {
                Some(p) => Normalizer::Prepend(p),
                None => return unsupported("Prepend without a string".into()),
            },
            Some("Replace") => match (n["pattern"]["String"].as_str(), string("content")) {
                // An empty pattern matches nothing in HF.
                (Some(""), Some(_)) => return Ok(None),
                (Some(from), Some(to)) => Normalizer::Replace(from.to_owned(), to),
                (None, Some(to)) => match n["pattern"]["Regex"].as_str() {
                    Some(re) => match Automaton::new(re) {
                        Ok(a) => Normalizer::ReplaceRegex(std::sync::Arc::new(a), to),
                        Err(why) => return unsupported(format!("Replace pattern {re:?}: {why}")),
                    },
                    None => return unsupported(format!("Replace pattern {}", n["pattern"])),
                },
                _ => return unsupported("Replace without content".into()),
            },
            Some("Precompiled") => Normalizer::Precompiled(Box::new(Precompiled::from_json(n)?)),
            Some("Sequence") => {
                let steps = n["normalizers"].as_array().map_or(&[][..], Vec::as_slice);
                let mut list = Vec::new();
                for step in steps {
                    list.extend(Normalizer::from_json(step)?);
                }
                match list.len() {
                    0 => return Ok(None),
                    1 => list.pop().expect("one"),
                    _ => Normalizer::Sequence(list),
                }
            }
            _ => return unsupported(format!("{} is not supported", n["type"])),
        };
        Ok(Some(normalizer))
    }

    /// The normalized text.
    pub(crate) fn apply<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let form = |quick: fn(&str) -> IsNormalized, run: fn(&str) -> String| {
            if text.is_ascii() || quick(text) == IsNormalized::Yes {
                Cow::Borrowed(text)
            } else {
                Cow::Owned(run(text))
            }
        };
        match self {
            Normalizer::Nfc => form(
                |t| is_nfc_quick(t.chars()),
                |t| t.nfc().map(|(c, _)| c).collect(),
            ),
            Normalizer::Nfd => form(
                |t| is_nfd_quick(t.chars()),
                |t| t.nfd().map(|(c, _)| c).collect(),
            ),
            Normalizer::Nfkc => form(
                |t| is_nfkc_quick(t.chars()),
                |t| t.nfkc().map(|(c, _)| c).collect(),
            ),
            Normalizer::Nfkd => form(
                |t| is_nfkd_quick(t.chars()),
                |t| t.nfkd().map(|(c, _)| c).collect(),
            ),
            Normalizer::Lowercase => {
                if text.bytes().all(|b| !b.is_ascii_uppercase() && b < 0x80) {
                    Cow::Borrowed(text)
                } else {
                    Cow::Owned(text.chars().flat_map(char::to_lowercase).collect())
                }
            }
            Normalizer::Replace(from, to) => match from.as_bytes() {
                // One ASCII byte (SentencePiece's " " to "▁", frequent) is
                // found by a byte loop, not a search started per match;
                // longer strings by the two-way searcher.
                &[b] if b < 0x80 => replace_all(
                    text,
                    1,
                    text.bytes()
                        .enumerate()
                        .filter(|&(_, c)| c == b)
                        .map(|(i, _)| i),
                    to,
                ),
                _ => replace_all(
                    text,
                    from.len(),
                    text.match_indices(from.as_str()).map(|(i, _)| i),
                    to,
                ),
            },
            Normalizer::ReplaceRegex(re, to) => {
                let mut out = String::new();
                let mut last = 0;
                re.find_iter(text, &mut |start, end| {
                    out.push_str(&text[last..start]);
                    out.push_str(to);
                    last = end;
                });
                if last == 0 && out.is_empty() {
                    Cow::Borrowed(text)
                } else {
                    out.push_str(&text[last..]);
                    Cow::Owned(out)
                }
            }
            Normalizer::Prepend(p) => {
                if text.is_empty() {
                    Cow::Borrowed(text)
                } else {
                    Cow::Owned(format!("{p}{text}"))
                }
            }
            Normalizer::Strip { left, right } => {
                let mut t = text;
                if *left {
                    t = t.trim_start_matches(char::is_whitespace);
                }
                if *right {
                    t = t.trim_end_matches(char::is_whitespace);
                }
                Cow::Borrowed(t)
            }
            Normalizer::StripAccents => {
                if text.is_ascii() {
                    Cow::Borrowed(text)
                } else {
                    Cow::Owned(text.chars().filter(|&c| !is_combining_mark(c)).collect())
                }
            }
            Normalizer::Bert(b) => b.apply(text),
            Normalizer::Precompiled(p) => p.apply(text),
            Normalizer::Sequence(steps) => {
                let mut out = Cow::Borrowed(text);
                for step in steps {
                    out = match out {
                        Cow::Borrowed(t) => step.apply(t),
                        // A step that changes nothing keeps the text it was
                        // given, not a copy of it.
                        Cow::Owned(s) => match step.apply(&s) {
                            Cow::Borrowed(t) if t.len() == s.len() => Cow::Owned(s),
                            changed => Cow::Owned(changed.into_owned()),
                        },
                    };
                }
                out
            }
        }
    }
}

/// `text` with each match, `len` bytes at each of `starts` (in order, not
/// overlapping), replaced by `to`; borrowed where there is none.
fn replace_all<'t>(
    text: &'t str,
    len: usize,
    mut starts: impl Iterator<Item = usize>,
    to: &str,
) -> Cow<'t, str> {
    let Some(first) = starts.next() else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    let mut last = 0;
    for i in std::iter::once(first).chain(starts) {
        out.push_str(&text[last..i]);
        out.push_str(to);
        last = i + len;
    }
    out.push_str(&text[last..]);
    Cow::Owned(out)
}
