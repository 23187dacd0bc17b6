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
        match self {
            Normalizer::Nfc => by_segments(
                text,
                |t| is_nfc_quick(t.chars()),
                |t, out| out.extend(t.nfc().map(|(c, _)| c)),
            ),
            Normalizer::Nfd => by_segments(
                text,
                |t| is_nfd_quick(t.chars()),
                |t, out| out.extend(t.nfd().map(|(c, _)| c)),
            ),
            Normalizer::Nfkc => by_segments(
                text,
                |t| is_nfkc_quick(t.chars()),
                |t, out| out.extend(t.nfkc().map(|(c, _)| c)),
            ),
            Normalizer::Nfkd => by_segments(
                text,
                |t| is_nfkd_quick(t.chars()),
                |t, out| out.extend(t.nfkd().map(|(c, _)| c)),
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

/// In words, for a run's summary.
impl std::fmt::Display for Normalizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Normalizer::Nfc => write!(f, "NFC"),
            Normalizer::Nfd => write!(f, "NFD"),
            Normalizer::Nfkc => write!(f, "NFKC"),
            Normalizer::Nfkd => write!(f, "NFKD"),
            Normalizer::Lowercase => write!(f, "lowercase"),
            Normalizer::Replace(from, to) => write!(f, "{from:?} replaced by {to:?}"),
            Normalizer::ReplaceRegex(_, to) => write!(f, "a pattern replaced by {to:?}"),
            Normalizer::Prepend(p) => write!(f, "{p:?} prepended"),
            Normalizer::Strip { left, right } => match (left, right) {
                (true, false) => write!(f, "whitespace stripped on the left"),
                (false, true) => write!(f, "whitespace stripped on the right"),
                _ => write!(f, "whitespace stripped"),
            },
            Normalizer::StripAccents => write!(f, "accents stripped"),
            Normalizer::Bert(b) => write!(f, "{b}"),
            Normalizer::Sequence(all) => {
                let all: Vec<String> = all.iter().map(Normalizer::to_string).collect();
                write!(f, "{}", all.join(", then "))
            }
            Normalizer::Precompiled(_) => write!(f, "SentencePiece's compiled character map"),
        }
    }
}

/// `text` in one of the four Unicode forms: `quick` is the form's quick
/// check, `run` appends a text in the form.
///
/// Only the text around non-ASCII characters is looked at. Each run of
/// them, with the ASCII character before it (which a combining mark after
/// it may compose with), is a segment, checked on its own and normalized
/// on its own where the check is not sure. That is the form of the whole
/// text: an ASCII character is a starter that never composes with what
/// comes before it and that no reordering crosses, so no form joins or
/// reorders characters across a cut made before one.
fn by_segments<'t>(
    text: &'t str,
    quick: fn(&str) -> IsNormalized,
    run: fn(&str, &mut String),
) -> Cow<'t, str> {
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    // The bytes of `text` before this are in `out`.
    let mut copied = 0;
    let mut at = 0;
    while let Some(start) = first_non_ascii(bytes, at) {
        // Every byte from `at` to `start` is ASCII, and so is the one
        // before `at`: a segment starts at a character boundary.
        let end = bytes[start..]
            .iter()
            .position(|&b| b < 0x80)
            .map_or(bytes.len(), |n| start + n);
        let segment = start.saturating_sub(1)..end;
        if quick(&text[segment.clone()]) != IsNormalized::Yes {
            let out = out.get_or_insert_with(|| String::with_capacity(text.len() + 16));
            out.push_str(&text[copied..segment.start]);
            run(&text[segment], out);
            copied = end;
        }
        at = end;
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(&text[copied..]);
            Cow::Owned(out)
        }
    }
}

/// The first byte at or after `from` that is not ASCII, eight at a time.
#[inline]
fn first_non_ascii(bytes: &[u8], from: usize) -> Option<usize> {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut i = from;
    while i + 8 <= bytes.len() {
        let word = u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let high = word & HIGH;
        if high != 0 {
            return Some(i + (high.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    bytes[i..].iter().position(|&b| b >= 0x80).map(|n| i + n)
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Characters that compose, decompose, reorder or do nothing in the
    /// four forms: ASCII a mark may compose with, marks of several
    /// classes, singletons, Hangul jamo and syllables, two-part vowels,
    /// compatibility characters.
    fn form_char() -> impl Strategy<Value = char> {
        prop_oneof![
            6 => proptest::sample::select(vec![
                'a', 'e', 'A', 'o', 'c', ' ', '\n', '1', '\u{301}', '\u{300}', '\u{327}',
                '\u{323}', '\u{345}', '\u{344}', '\u{5b0}', '\u{338}', 'é', 'É', 'ö', 'ǖ', 'Å',
                '\u{212b}', '\u{1100}', '\u{1161}', '\u{11a8}', '가', '각', '\u{b47}', '\u{b3e}',
                '\u{b57}', 'ﬁ', '½', 'ΐ', '\u{f73}', '\u{f900}', 'Ａ', 'Ḋ', 'ẛ', '\u{1e0c}', '\u{307}',
                '中', '😀', '\u{fb2c}', '\u{2126}', 'ſ', 'ͅ', 'ς',
            ]),
            1 => any::<char>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn segments_give_the_form_of_the_whole_text(chars in proptest::collection::vec(form_char(), 0..40)) {
            let text: String = chars.into_iter().collect();
            let whole: [(Normalizer, String); 4] = [
                (Normalizer::Nfc, text.nfc().map(|(c, _)| c).collect()),
                (Normalizer::Nfd, text.nfd().map(|(c, _)| c).collect()),
                (Normalizer::Nfkc, text.nfkc().map(|(c, _)| c).collect()),
                (Normalizer::Nfkd, text.nfkd().map(|(c, _)| c).collect()),
            ];
            for (form, expected) in whole {
                let got = form.apply(&text);
                prop_assert_eq!(&*got, expected.as_str(), "{:?} of {:?}", form, text);
                // ASCII is never copied.
                prop_assert!(!text.is_ascii() || matches!(got, Cow::Borrowed(_)), "{:?}", form);
            }
        }

        #[test]
        fn first_non_ascii_is_the_first(bytes in proptest::collection::vec(prop_oneof![5 => 0u8..0x80, 1 => any::<u8>()], 0..40), from in 0usize..41) {
            let from = from.min(bytes.len());
            prop_assert_eq!(
                first_non_ascii(&bytes, from),
                bytes[from..].iter().position(|&b| b >= 0x80).map(|n| from + n)
            );
        }
    }
}
