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
//! Pure-ASCII text takes a table instead: ASCII's only multi-character
//! grapheme cluster is CR LF (no ASCII character extends or prepends a
//! cluster), so each byte, and each CR LF, is its own cluster, and the
//! table holds exactly what the crate writes for each.

use std::borrow::Cow;

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
        let changed = |s: &str| {
            let out = map.normalize_string(s);
            (out != s).then(|| out.into_boxed_str())
        };
        let ascii = Box::new(std::array::from_fn(|b| {
            changed((b as u8 as char).encode_utf8(&mut [0; 4]))
        }));
        let crlf = changed("\r\n");
        Ok(Precompiled { map, ascii, crlf })
    }

    /// The normalized text.
    pub(crate) fn apply<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if !text.is_ascii() {
            let out = self.map.normalize_string(text);
            return if out == text {
                Cow::Borrowed(text)
            } else {
                Cow::Owned(out)
            };
        }
        let bytes = text.as_bytes();
        let crlf_changes = self.crlf.is_some();
        let first = bytes.iter().enumerate().position(|(i, &b)| {
            self.ascii[b as usize].is_some()
                || (crlf_changes && b == b'\r' && bytes.get(i + 1) == Some(&b'\n'))
        });
        let Some(first) = first else {
            return Cow::Borrowed(text);
        };
        let mut out = String::with_capacity(text.len());
        out.push_str(&text[..first]);
        let mut i = first;
        while i < bytes.len() {
            let b = bytes[i];
            if b == b'\r' && bytes.get(i + 1) == Some(&b'\n') {
                out.push_str(self.crlf.as_deref().unwrap_or("\r\n"));
                i += 2;
                continue;
            }
            match &self.ascii[b as usize] {
                Some(s) => out.push_str(s),
                None => out.push(b as char),
            }
            i += 1;
        }
        Cow::Owned(out)
    }
}
