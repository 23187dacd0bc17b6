//! What BERT's `tokenizer.json` files put around WordPiece: the
//! `BertNormalizer` and the `BertPreTokenizer`, as HF tokenizers runs them.
//!
//! Each character class is HF's own definition over the crates HF takes it
//! from (`unicode_categories` for control characters, punctuation and
//! non-spacing marks, `unicode-normalization-alignments` for NFD, `char`'s
//! methods for whitespace and lowercase), so the Unicode version is HF's.
//! Both have a path for ASCII, where every step is a table lookup per byte;
//! the tables are filled by the general per-character rules, so the two
//! paths cannot disagree.

use std::borrow::Cow;

use serde_json::Value;
use unicode_categories::UnicodeCategories;
use unicode_normalization_alignments::UnicodeNormalization;

use super::Unsupported;

/// HF's `is_whitespace` in the normalizer: `\t`, `\n` and `\r` are control
/// characters in Unicode, but count as whitespace (Rust's
/// `char::is_whitespace` already has them).
fn is_whitespace(c: char) -> bool {
    c.is_whitespace()
}

/// HF's `is_control`: Cc, Cf and Co, except `\t`, `\n` and `\r`.
fn is_control(c: char) -> bool {
    !matches!(c, '\t' | '\n' | '\r') && c.is_other()
}

/// HF's "Chinese character": the CJK Unified Ideographs blocks and their
/// extensions and compatibility blocks, exactly HF's ranges (Hangul, kana
/// and the CJK punctuation are not among them).
fn is_chinese_char(c: char) -> bool {
    matches!(
        c as u32,
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            | 0x2B920..=0x2CEAF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

/// HF's `is_bert_punc`: ASCII punctuation (which has symbols such as `$`,
/// `+` and `^` that Unicode does not call punctuation) or a character of a
/// Unicode punctuation category.
pub(crate) fn is_bert_punc(c: char) -> bool {
    c.is_ascii_punctuation() || c.is_punctuation()
}

/// An ASCII byte the normalizer drops.
const DROP: u8 = 0xFF;

/// HF's `BertNormalizer`, with `strip_accents` resolved (unset follows
/// `lowercase`, as in HF).
#[derive(Clone)]
pub(crate) struct BertNormalizer {
    clean_text: bool,
    handle_chinese_chars: bool,
    strip_accents: bool,
    lowercase: bool,
    /// What each ASCII byte becomes: itself, another byte, or `DROP`.
    ascii: [u8; 128],
}

impl std::fmt::Debug for BertNormalizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bert")
            .field("clean_text", &self.clean_text)
            .field("handle_chinese_chars", &self.handle_chinese_chars)
            .field("strip_accents", &self.strip_accents)
            .field("lowercase", &self.lowercase)
            .finish()
    }
}

/// In words: the steps this file turns on.
impl std::fmt::Display for BertNormalizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let steps: Vec<&str> = [
            (self.clean_text, "cleaned"),
            (self.handle_chinese_chars, "CJK characters spaced out"),
            (self.strip_accents, "accents stripped"),
            (self.lowercase, "lowercased"),
        ]
        .into_iter()
        .filter_map(|(on, step)| on.then_some(step))
        .collect();
        match steps.as_slice() {
            [] => write!(f, "BERT's (nothing turned on)"),
            steps => write!(f, "BERT's ({})", steps.join(", ")),
        }
    }
}

impl BertNormalizer {
    /// Reads a `BertNormalizer` object. HF requires the three flags and
    /// takes a missing or null `strip_accents` as unset; a file it would
    /// not load is refused.
    pub(crate) fn from_json(n: &Value) -> Result<BertNormalizer, Unsupported> {
        let flag = |key: &str| {
            n[key].as_bool().ok_or_else(|| {
                Unsupported(format!(
                    "normalizer: BertNormalizer {key} is not true or false"
                ))
            })
        };
        let lowercase = flag("lowercase")?;
        let strip_accents = match &n["strip_accents"] {
            Value::Null => lowercase,
            Value::Bool(b) => *b,
            other => {
                return Err(Unsupported(format!(
                    "normalizer: BertNormalizer strip_accents {other}"
                )))
            }
        };
        Ok(BertNormalizer::new(
            flag("clean_text")?,
            flag("handle_chinese_chars")?,
            strip_accents,
            lowercase,
        ))
    }

    fn new(
        clean_text: bool,
        handle_chinese_chars: bool,
        strip_accents: bool,
        lowercase: bool,
    ) -> BertNormalizer {
        let mut n = BertNormalizer {
            clean_text,
            handle_chinese_chars,
            strip_accents,
            lowercase,
            ascii: [DROP; 128],
        };
        for b in 0..128u8 {
            let mut out = String::new();
            n.general(&(b as char).to_string(), &mut out, false);
            n.ascii[b as usize] = match out.as_bytes() {
                [] => DROP,
                [one] if one.is_ascii() => *one,
                _ => unreachable!("an ASCII character normalizes to at most one"),
            };
        }
        n
    }

    /// The normalized text, borrowed when the normalizer changes nothing.
    pub(crate) fn apply<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let bytes = text.as_bytes();
        if !text.is_ascii() {
            let mut out = String::with_capacity(text.len() + text.len() / 8);
            self.general(text, &mut out, true);
            return Cow::Owned(out);
        }
        // ASCII: borrowed up to the first byte that changes.
        let Some(first) = bytes.iter().position(|&b| self.ascii[b as usize] != b) else {
            return Cow::Borrowed(text);
        };
        let mut out = Vec::with_capacity(bytes.len());
        out.extend_from_slice(&bytes[..first]);
        for &b in &bytes[first..] {
            let to = self.ascii[b as usize];
            if to != DROP {
                out.push(to);
            }
        }
        Cow::Owned(String::from_utf8(out).expect("ASCII bytes are UTF-8"))
    }

    /// HF's four steps in its order, each on the whole text as HF does:
    /// clean, space out Chinese characters, strip accents (NFD, then
    /// non-spacing marks removed), lowercase. With `table`, ASCII
    /// characters go through the ASCII table (filled by this function
    /// without it); the others are gathered and decomposed a run at a time.
    fn general(&self, text: &str, out: &mut String, table: bool) {
        // Characters that survive cleaning, since the last ASCII character
        // that survived it. An ASCII character is a starter that decomposes
        // to itself, so it ends a run of NFD's reordering, and decomposing
        // run by run is the same as decomposing the whole text; a dropped
        // character ends nothing, since HF drops it before it decomposes.
        let mut run = String::new();
        for c in text.chars() {
            if table && c.is_ascii() {
                let to = self.ascii[c as usize];
                if to != DROP {
                    if !run.is_empty() {
                        self.finish(&run, out);
                        run.clear();
                    }
                    out.push(to as char);
                }
                continue;
            }
            if self.clean_text && (c == '\0' || c == '\u{FFFD}' || is_control(c)) {
                continue;
            }
            let c = if self.clean_text && is_whitespace(c) {
                ' '
            } else {
                c
            };
            if self.handle_chinese_chars && is_chinese_char(c) {
                run.push(' ');
                run.push(c);
                run.push(' ');
            } else {
                run.push(c);
            }
        }
        self.finish(&run, out);
    }

    /// Strips accents from and lowercases a run of cleaned text.
    fn finish(&self, run: &str, out: &mut String) {
        let lower = |c: char, out: &mut String| {
            if self.lowercase {
                out.extend(c.to_lowercase());
            } else {
                out.push(c);
            }
        };
        if self.strip_accents {
            for (c, _) in run.nfd() {
                if !c.is_mark_nonspacing() {
                    lower(c, out);
                }
            }
        } else {
            for c in run.chars() {
                lower(c, out);
            }
        }
    }
}

/// HF's `BertPreTokenizer`: whitespace (`char::is_whitespace`) separates
/// words and is removed, and each punctuation character ([`is_bert_punc`])
/// is a word of its own. Calls `word` with each, in order.
pub(crate) fn words(text: &str, word: &mut dyn FnMut(&str)) {
    const WORD: u8 = 0;
    const SPACE: u8 = 1;
    const PUNC: u8 = 2;
    static ASCII: [u8; 128] = {
        let mut t = [WORD; 128];
        let mut b = 0;
        while b < 128 {
            let c = b as u8 as char;
            // `char::is_whitespace` for ASCII: U+0009 to U+000D and space.
            t[b] = if matches!(b, 0x09..=0x0D | 0x20) {
                SPACE
            } else if c.is_ascii_punctuation() {
                PUNC
            } else {
                WORD
            };
            b += 1;
        }
        t
    };
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let (class, len) = if b < 0x80 {
            (ASCII[b as usize], 1)
        } else {
            let c = text[i..].chars().next().expect("a character at a boundary");
            let class = if c.is_whitespace() {
                SPACE
            } else if is_bert_punc(c) {
                PUNC
            } else {
                WORD
            };
            (class, c.len_utf8())
        };
        if class != WORD {
            if start < i {
                word(&text[start..i]);
            }
            if class == PUNC {
                word(&text[i..i + len]);
            }
            start = i + len;
        }
        i += len;
    }
    if start < bytes.len() {
        word(&text[start..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_table_is_the_general_rule() {
        for flags in 0..16u8 {
            let n = BertNormalizer::new(
                flags & 1 != 0,
                flags & 2 != 0,
                flags & 4 != 0,
                flags & 8 != 0,
            );
            for b in 0..128u8 {
                let text = (b as char).to_string();
                let mut want = String::new();
                n.general(&text, &mut want, false);
                assert_eq!(n.apply(&text), want, "{flags:04b} {b:#04x}");
            }
        }
    }

    proptest::proptest! {
        /// Decomposing run by run, between ASCII characters, is decomposing
        /// the whole text: marks of every class around dropped controls,
        /// Chinese characters and whitespace.
        #[test]
        fn runs_are_the_whole_text(
            chars in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::sample::select(vec![
                        'a', 'E', ' ', '\t', '\u{1}', '\0', '\u{fffd}', '\u{85}', '\u{3000}',
                        '\u{301}', '\u{316}', '\u{1d165}', '\u{1d166}', '\u{1d16d}', 'É',
                        '\u{4e00}', '\u{f900}', 'İ', 'Σ', '\u{200b}', '\u{e000}',
                    ]),
                    proptest::arbitrary::any::<char>(),
                ],
                0..40,
            ),
            flags in 0..16u8,
        ) {
            let text: String = chars.into_iter().collect();
            let n = BertNormalizer::new(flags & 1 != 0, flags & 2 != 0, flags & 4 != 0, flags & 8 != 0);
            let mut whole = String::new();
            n.general(&text, &mut whole, false);
            proptest::prop_assert_eq!(n.apply(&text), whole);
        }
    }

    #[test]
    fn words_are_hf_steps() {
        let steps = super::super::pretok::Steps::from_json(&serde_json::json!({
            "type": "Sequence", "pretokenizers": [
                {"type": "WhitespaceSplit"},
                {"type": "Punctuation", "behavior": "Isolated"}
            ]
        }))
        .unwrap();
        for text in [
            "",
            "  ",
            "Hey friend!     How are you?!?",
            "a$b+c^d `e` ~f~ 中文「引用」\u{3000}x\u{a0}y\u{85}z\u{2028}",
            "don't...stop—now¿¡ «q» ‹r› 1,000.5%",
        ] {
            let mut want = Vec::new();
            steps.run_words(text, true, &mut Default::default(), &mut |w| {
                want.push(w.to_owned())
            });
            let mut got = Vec::new();
            words(text, &mut |w| got.push(w.to_owned()));
            assert_eq!(got, want, "{text:?}");
        }
    }
}
