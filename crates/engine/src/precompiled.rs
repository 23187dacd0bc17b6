//! SentencePiece's compiled character map (T5's `nmt_nfkc`, XLM-R, mBART,
//! Marian), as HF tokenizers' `Precompiled` normalizer applies it.
//!
//! The map (`precompiled_charsmap`: base64 of a little-endian u32 trie size,
//! a double-array trie over UTF-8 bytes, then a blob of NUL-terminated
//! replacement strings) is read and applied by the `spm_precompiled` crate,
//! the one HF tokenizers calls, so the rules are HF's own: the text is cut
//! into extended grapheme clusters; a cluster under 6 bytes with an entry
//! is replaced whole (by the entry of its *shortest* prefix in the trie),
//! and otherwise each of its characters is replaced by its own entry or
//! kept.
//!
//! # ASCII by table, the rest by the crate
//!
//! Each cluster is replaced on its own, so the text can be cut anywhere a
//! cluster boundary is certain and each part normalized alone. Between two
//! ASCII characters there is always one, except inside CR LF: no ASCII
//! character is Extend, ZWJ, SpacingMark, Prepend, Extended_Pictographic,
//! a Regional_Indicator, a Hangul jamo or an Indic consonant, so none of
//! the rules that join characters (UAX #29 GB6 to GB13) applies to such a
//! pair, and the rules that look back (emoji ZWJ sequences, regional
//! indicator pairs, Indic conjuncts) look back only through characters of
//! those classes, so a cluster after the pair is found as in the whole
//! text. Elsewhere a boundary is not certain: an ASCII character before a
//! combining mark or ZWJ joins its cluster, as does one after a Prepend
//! character (U+0600). So the text is cut only between two ASCII
//! characters other than CR LF: a stretch with a non-ASCII character keeps
//! the ASCII characters next to it and goes through the crate, and the
//! ASCII between such stretches takes a table, which holds exactly what
//! the crate writes for each ASCII character and for CR LF (each a cluster
//! of its own there).
//!
//! # A malformed map is refused
//!
//! The crate indexes the trie and the blob without checking: a map whose
//! trie is empty, whose offsets lead out of the trie, or whose entries
//! point past the blob or inside a character makes it panic (HF too, on
//! the first text that reaches the bad entry). [`check`] follows every
//! path a lookup can take (keys are valid UTF-8 of at most 5 bytes: a
//! cluster under 6 bytes, or one character) and the fast engine refuses a
//! map on which one would fail.

use std::borrow::Cow;
use std::collections::HashSet;

use serde_json::Value;
use spm_precompiled::Precompiled as Charsmap;

use super::Unsupported;

/// The normalizer, with its ASCII table.
#[derive(Clone)]
pub(crate) struct Precompiled {
    map: Charsmap,
    /// What each ASCII character is written as; `None` where it is kept.
    ascii: Box<[Option<Box<str>>; 128]>,
    /// What CR LF is written as; `None` where it is kept.
    crlf: Option<Box<str>>,
    /// The ASCII bytes not copied as they are: those the table changes, and
    /// CR (which may start CR LF).
    stops: [bool; 128],
}

impl std::fmt::Debug for Precompiled {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("Precompiled")
    }
}

impl Precompiled {
    /// Reads a `{"type": "Precompiled", "precompiled_charsmap": ...}`.
    pub(crate) fn from_json(n: &Value) -> Result<Precompiled, Unsupported> {
        // Read from text, as HF reads it: the crate borrows the base64.
        let map: Charsmap = serde_json::from_str(&n.to_string()).map_err(|e| {
            let e = e.to_string();
            let e: String = e.chars().take(200).collect();
            Unsupported(format!("normalizer: Precompiled: {e}"))
        })?;
        check_json(n).map_err(|e| Unsupported(format!("normalizer: Precompiled: {e}")))?;
        let changed = |s: &str| {
            let out = map.normalize_string(s);
            (out != s).then(|| out.into_boxed_str())
        };
        let ascii = Box::new(std::array::from_fn(|b| {
            changed((b as u8 as char).encode_utf8(&mut [0; 4]))
        }));
        let crlf = changed("\r\n");
        let stops = std::array::from_fn(|b| ascii[b].is_some() || b == usize::from(b'\r'));
        Ok(Precompiled {
            map,
            ascii,
            crlf,
            stops,
        })
    }

    /// The normalized text.
    pub(crate) fn apply<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let bytes = text.as_bytes();
        // The first byte that is not ASCII or not copied as it is.
        let Some(first) = bytes
            .iter()
            .position(|&b| b >= 0x80 || self.stops[b as usize])
        else {
            return Cow::Borrowed(text);
        };
        // Back to a certain cluster boundary (the byte is one, or the text
        // before it is ASCII).
        let start = if bytes[first] < 0x80 {
            first
        } else {
            ascii_cut_before(bytes, first, 0)
        };
        let mut out = String::with_capacity(text.len() + text.len() / 8);
        out.push_str(&text[..start]);
        let mut changed = false;
        let mut i = start;
        while i < bytes.len() {
            // ASCII up to the next non-ASCII byte, less the ASCII
            // characters that go with it.
            let next = bytes[i..]
                .iter()
                .position(|&b| b >= 0x80)
                .map_or(bytes.len(), |k| i + k);
            let stretch = if next < bytes.len() {
                ascii_cut_before(bytes, next, i)
            } else {
                next
            };
            changed |= self.push_ascii(&text[i..stretch], &mut out);
            if stretch == bytes.len() {
                break;
            }
            // Through the crate up to the next certain boundary.
            let end = ascii_cut_after(bytes, next);
            let part = &text[stretch..end];
            let normalized = self.map.normalize_string(part);
            changed |= normalized != part;
            out.push_str(&normalized);
            i = end;
        }
        if changed {
            Cow::Owned(out)
        } else {
            Cow::Borrowed(text)
        }
    }

    /// Appends ASCII text through the table, the runs it keeps copied
    /// whole; whether anything changed.
    fn push_ascii(&self, text: &str, out: &mut String) -> bool {
        let bytes = text.as_bytes();
        let mut changed = false;
        let mut i = 0;
        while i < bytes.len() {
            let run = bytes[i..]
                .iter()
                .position(|&b| self.stops[b as usize])
                .unwrap_or(bytes.len() - i);
            out.push_str(&text[i..i + run]);
            i += run;
            let Some(&b) = bytes.get(i) else {
                break;
            };
            let (with, len) = if b == b'\r' && bytes.get(i + 1) == Some(&b'\n') {
                (self.crlf.as_deref(), 2)
            } else {
                (self.ascii[b as usize].as_deref(), 1)
            };
            match with {
                Some(s) => {
                    out.push_str(s);
                    changed = true;
                }
                None => out.push_str(&text[i..i + len]),
            }
            i += len;
        }
        changed
    }
}

/// The last certain cluster boundary before the non-ASCII byte at `at`,
/// with the bytes from `from` to `at` ASCII and `from` itself a boundary:
/// one ASCII character back (two for CR LF), not before `from`.
fn ascii_cut_before(bytes: &[u8], at: usize, from: usize) -> usize {
    if at == from {
        return at;
    }
    let cut = at - 1;
    if cut > from && bytes[cut - 1] == b'\r' && bytes[cut] == b'\n' {
        cut - 1
    } else {
        cut
    }
}

/// The first certain cluster boundary after the non-ASCII byte at `at`:
/// between two ASCII bytes that are not CR LF, or the text's end.
fn ascii_cut_after(bytes: &[u8], at: usize) -> usize {
    let mut i = at + 1;
    while i < bytes.len() {
        if bytes[i] < 0x80 && bytes[i - 1] < 0x80 && !(bytes[i - 1] == b'\r' && bytes[i] == b'\n') {
            return i;
        }
        i += 1;
    }
    bytes.len()
}

/// The bytes of standard base64 (padding optional), as the crate reads the
/// map; `None` for anything else.
fn base64(text: &str) -> Option<Vec<u8>> {
    let digits = text.trim_end_matches('=').as_bytes();
    if text.len() - digits.len() > 2 || digits.len() % 4 == 1 {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(digits.len() / 4 * 3 + 2);
    for chunk in digits.chunks(4) {
        let mut n = 0u32;
        for (k, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * k);
        }
        let [_, a, b, c] = n.to_be_bytes();
        out.extend_from_slice(&[a, b, c][..chunk.len() - 1]);
    }
    Some(out)
}

/// [`check`] on the map of a `{"type": "Precompiled", ...}` object: what
/// makes the crate fail on it (at load or on some text), if anything.
pub(crate) fn check_json(n: &Value) -> Result<(), String> {
    let text = n
        .get("precompiled_charsmap")
        .and_then(Value::as_str)
        .ok_or("no precompiled_charsmap string")?;
    check(&base64(text).ok_or("the map is not plain base64")?)
}

/// The longest key the crate looks up: a cluster under 6 bytes.
const MAX_KEY: usize = 5;

/// Whether every lookup of a valid UTF-8 key of up to [`MAX_KEY`] bytes in
/// the map stays inside its trie and blob, walking the trie as the crate
/// does; else what fails.
pub(crate) fn check(map: &[u8]) -> Result<(), String> {
    let word = |at: usize| -> Option<usize> {
        let b = map.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let size = word(0).ok_or("the map is under 4 bytes")?;
    let units = size / 4;
    let blob = map
        .get(4 + units * 4..)
        .ok_or("the trie is larger than the map")?;
    let blob = std::str::from_utf8(blob).map_err(|_| "the replacements are not UTF-8")?;
    let unit = |i: usize| word(4 + i * 4);
    // The crate's reading of a unit.
    let has_leaf = |u: usize| (u >> 8) & 1 == 1;
    let value = |u: usize| u & ((1 << 31) - 1);
    let label = |u: usize| u & ((1 << 31) | 0xFF);
    let offset = |u: usize| (u >> 10) << ((u & (1 << 9)) >> 6);
    let root = unit(0).ok_or("the trie is empty")?;
    // The positions a lookup can reach after each number of bytes, each
    // taken at the first depth it is reached.
    let mut seen = HashSet::new();
    let mut level = vec![offset(root)];
    for depth in 0..MAX_KEY {
        let mut next = Vec::new();
        for &node in &level {
            // Bytes of valid UTF-8 other than NUL (which ends the walk).
            for c in (1..=0xF4usize).filter(|c| !matches!(c, 0xC0 | 0xC1)) {
                let at = node ^ c;
                let u = unit(at)
                    .ok_or_else(|| format!("a lookup leaves the trie ({at} of {units} units)"))?;
                if label(u) != c {
                    continue;
                }
                let child = at ^ offset(u);
                if has_leaf(u) {
                    let v = unit(child).ok_or_else(|| {
                        format!("an entry lies outside the trie ({child} of {units} units)")
                    })?;
                    let v = value(v);
                    if !blob.is_char_boundary(v) {
                        return Err(format!(
                            "an entry points at byte {v} of {} bytes of replacements, not at a character",
                            blob.len()
                        ));
                    }
                }
                if depth + 1 < MAX_KEY && seen.insert(child) {
                    next.push(child);
                }
            }
        }
        level = next;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    /// T5's normalizer, from the tokenizer file committed in the
    /// repository's fixtures/.
    fn t5() -> (Value, Precompiled) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/tokenizers/t5-small.tokenizer.json.zst");
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let json: Value = serde_json::from_reader(zstd::Decoder::new(file).unwrap()).unwrap();
        let n = json["normalizer"].clone();
        assert_eq!(n["type"], "Precompiled");
        let p = Precompiled::from_json(&n).unwrap();
        (n, p)
    }

    thread_local! {
        static T5: (Value, Precompiled) = t5();
    }

    /// Characters around which cluster boundaries move: ASCII (CR and LF
    /// among it), combining marks, Prepend, ZWJ and emoji, regional
    /// indicators, Hangul jamo, Indic conjuncts, and characters T5's map
    /// replaces.
    fn fragment() -> impl Strategy<Value = String> {
        let special = proptest::sample::select(vec![
            "\r",
            "\n",
            "\r\n",
            "\t",
            " ",
            "\u{0}",
            "\u{7f}",
            "a",
            "Z",
            "0",
            "~",
            "\u{301}",
            "\u{323}",
            "\u{308}",
            "\u{20dd}",
            "\u{600}",
            "\u{605}",
            "\u{110bd}",
            "\u{d4e}",
            "\u{200d}",
            "\u{200c}",
            "\u{fe0f}",
            "👩",
            "💻",
            "👍",
            "\u{1f3fd}",
            "🇩",
            "🇪",
            "©",
            "中",
            "日本",
            "\u{1100}",
            "\u{1161}",
            "\u{11a8}",
            "한",
            "\u{903}",
            "क",
            "\u{94d}",
            "ष",
            "\u{e33}",
            "ｶ",
            "\u{ff9e}",
            "Ａ",
            "①",
            "ﬁ",
            "™",
            "½",
            "é",
            "e\u{301}",
            "\u{a0}",
            "\u{3000}",
            "\u{2028}",
            "\u{85}",
            "\u{fffd}",
            "\u{feff}",
        ]);
        prop_oneof![
            4 => special.prop_map(str::to_owned),
            1 => "[ -~]{1,6}",
            1 => any::<char>().prop_map(String::from),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn stretches_normalize_as_the_whole_text(
            parts in proptest::collection::vec(fragment(), 0..24)
        ) {
            let text = parts.concat();
            T5.with(|(_, p)| {
                let got = p.apply(&text);
                prop_assert_eq!(got.as_ref(), p.map.normalize_string(&text));
                Ok(())
            })?;
        }
    }

    #[test]
    fn cuts_only_between_ascii_characters_other_than_crlf() {
        let b = "ab\r\n\u{301}x\r\ny".as_bytes();
        // Before the combining mark: back past CR LF to after "b".
        assert_eq!(ascii_cut_before(b, 4, 0), 2);
        assert_eq!(ascii_cut_before(b, 4, 3), 3);
        assert_eq!(ascii_cut_before(b, 4, 4), 4);
        // After it: not inside "x\r" ... "\r\n".
        assert_eq!(ascii_cut_after(b, 4), 7);
        assert_eq!(ascii_cut_after("é\r\n".as_bytes(), 0), 4);
    }

    #[test]
    fn base64_as_the_crate_reads_it() {
        assert_eq!(base64("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64("").unwrap(), b"");
        assert!(base64("a").is_none());
        assert!(base64("!!!!").is_none());
        assert!(base64("aGVsbG8===").is_none());
    }

    /// Maps on which the crate would index out of bounds are refused, and
    /// T5's passes.
    #[test]
    fn malformed_maps_are_refused() {
        let with = |map: &[u8]| {
            let mut text = String::new();
            for chunk in map.chunks(3) {
                let mut n = [0u8; 3];
                n[..chunk.len()].copy_from_slice(chunk);
                let n = u32::from_be_bytes([0, n[0], n[1], n[2]]);
                for k in 0..=chunk.len() {
                    let d = (n >> (18 - 6 * k)) & 63;
                    text.push(
                        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
                            [d as usize] as char,
                    );
                }
            }
            serde_json::json!({"type": "Precompiled", "precompiled_charsmap": text})
        };
        let refused = |map: &[u8]| {
            let n = with(map);
            assert_eq!(
                base64(n["precompiled_charsmap"].as_str().unwrap()).unwrap(),
                map
            );
            Precompiled::from_json(&n).expect_err("refused").0
        };
        // An empty trie: the crate reads its unit 0.
        let e = refused(&[0, 0, 0, 0, b'a', 0]);
        assert!(e.contains("empty"), "{e}");
        // The trie larger than the map: the crate cannot parse it.
        let e = refused(&[8, 0, 0, 0, 1, 2]);
        assert!(e.contains("Precompiled"), "{e}");
        // A root whose children lie past the trie.
        let e = refused(&[4, 0, 0, 0, 0, 0, 0xF0, 0x7F]);
        assert!(e.contains("leaves the trie"), "{e}");
        let n = T5.with(|(n, _)| n.clone());
        let map = base64(n["precompiled_charsmap"].as_str().unwrap()).unwrap();
        check(&map).unwrap();
        // Replacements cut short: entries point past them.
        let size = u32::from_le_bytes(map[..4].try_into().unwrap()) as usize;
        let e = refused(&map[..4 + size + 10]);
        assert!(e.contains("replacements"), "{e}");
        // The root's offset out of range.
        let mut bad = map.clone();
        bad[4 + 2] = 0xFF;
        bad[4 + 3] = 0x7F;
        let e = refused(&bad);
        assert!(e.contains("leaves the trie"), "{e}");
    }
}
