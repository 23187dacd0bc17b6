//! WordPiece (BERT and its descendants): greedy longest match first with a
//! prefix on the pieces after the first, exactly as HF's `models/wordpiece`.
//!
//! A word of more than `max_input_chars_per_word` characters is the unknown
//! token; otherwise, from the start of the word, the longest piece in the
//! vocabulary is taken (after the first, looked up with
//! `continuing_subword_prefix` before it), and a word with any part that no
//! piece matches is one unknown token, whatever pieces it had found.
//!
//! Two things make it faster than HF's and give the same pieces: pieces
//! after the first are looked up in a second map that holds the vocabulary's
//! prefixed tokens without their prefix, so no string is built per lookup;
//! and the search for a piece starts at the longest token of the map, not
//! at the end of the word, since nothing longer can match. The model keeps
//! no cache and allocates nothing per word, so [`State`] holds nothing.

use serde::Deserialize;

use super::compiled::{Reader, Stale, Writer};
use super::{Unsupported, Vocab};

/// The model, ready to encode.
pub(crate) struct Model {
    /// Every token: the first piece of a word is looked up here.
    vocab: Vocab,
    /// The tokens that start with the prefix, without it: the pieces after
    /// the first are looked up here.
    continuing: Vocab,
    /// The longest key of `vocab` and of `continuing`, in bytes.
    longest: usize,
    longest_continuing: usize,
    unk: u32,
    max_chars: usize,
}

/// One worker's buffers: none, since the model allocates nothing per word.
#[derive(Default)]
pub(crate) struct State;

/// A WordPiece `model` object. HF requires each of these (only `type` may
/// be left out) and ignores other fields.
#[derive(Deserialize)]
struct Json {
    unk_token: String,
    continuing_subword_prefix: String,
    max_input_chars_per_word: usize,
    vocab: Vocab,
}

impl Model {
    /// Writes the model's tables for [`Model::read`].
    pub(crate) fn write(&self, w: &mut Writer) {
        w.vocab(&self.vocab);
        w.vocab(&self.continuing);
        for n in [self.longest, self.longest_continuing, self.max_chars] {
            w.len(n);
        }
        w.u32(self.unk);
    }

    /// The model [`Model::write`] wrote.
    pub(crate) fn read(r: &mut Reader) -> Result<Model, Stale> {
        let word = |r: &mut Reader| r.u64().map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        Ok(Model {
            vocab: r.vocab()?,
            continuing: r.vocab()?,
            longest: word(r)?,
            longest_continuing: word(r)?,
            max_chars: word(r)?,
            unk: r.u32()?,
        })
    }

    /// Reads the `model` object of a `tokenizer.json`, with its
    /// vocabulary (for the added tokens' ids), or says why it is refused.
    pub(crate) fn from_json(model: &str) -> Result<(Model, Vocab), Unsupported> {
        let m: Json =
            serde_json::from_str(model).map_err(|e| Unsupported(format!("model: {e}")))?;
        // HF fails the encoding of a text that needs a missing unknown
        // token; the engine leaves that to HF.
        let Some(&unk) = m.vocab.get(&m.unk_token) else {
            return Err(Unsupported(format!(
                "model: the unknown token {:?} is not in the vocabulary",
                m.unk_token
            )));
        };
        let prefix = &m.continuing_subword_prefix;
        let continuing: Vocab = m
            .vocab
            .iter()
            .filter_map(|(token, &id)| Some((token.strip_prefix(prefix.as_str())?.to_owned(), id)))
            .collect();
        let longest = |v: &Vocab| v.keys().map(String::len).max().unwrap_or(0);
        let model = Model {
            longest: longest(&m.vocab),
            longest_continuing: longest(&continuing),
            vocab: m.vocab.clone(),
            continuing,
            unk,
            max_chars: m.max_input_chars_per_word,
        };
        Ok((model, m.vocab))
    }

    /// Appends the ids of one pre-tokenized word.
    pub(crate) fn encode(&self, word: &str, _state: &mut State, out: &mut Vec<u32>) {
        // Fewer bytes than the limit is fewer characters too.
        if word.len() > self.max_chars && word.chars().count() > self.max_chars {
            out.push(self.unk);
            return;
        }
        if let Some(&id) = self.vocab.get(word) {
            out.push(id);
            return;
        }
        let found = out.len();
        let mut start = 0;
        while start < word.len() {
            let (map, longest) = if start == 0 {
                (&self.vocab, self.longest)
            } else {
                (&self.continuing, self.longest_continuing)
            };
            let mut end = word.len().min(start + longest);
            while !word.is_char_boundary(end) {
                end -= 1;
            }
            let id = loop {
                if end <= start {
                    break None;
                }
                if let Some(&id) = map.get(&word[start..end]) {
                    break Some(id);
                }
                // One character shorter.
                end = word[..end]
                    .char_indices()
                    .next_back()
                    .map_or(start, |(i, _)| i);
            };
            let Some(id) = id else {
                out.truncate(found);
                out.push(self.unk);
                return;
            };
            out.push(id);
            start = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(vocab: &[&str], prefix: &str, max: usize) -> Model {
        let vocab: serde_json::Map<String, serde_json::Value> = vocab
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i.into()))
            .collect();
        let json = serde_json::json!({
            "unk_token": "[UNK]",
            "continuing_subword_prefix": prefix,
            "max_input_chars_per_word": max,
            "vocab": vocab,
        });
        Model::from_json(&json.to_string()).unwrap().0
    }

    fn ids(m: &Model, word: &str) -> Vec<u32> {
        let mut out = vec![99];
        m.encode(word, &mut State, &mut out);
        out.split_off(1)
    }

    #[test]
    fn longest_match_first_with_prefix() {
        let m = model(
            &["[UNK]", "un", "unaff", "##aff", "##able", "##a", "é", "##é"],
            "##",
            100,
        );
        assert_eq!(ids(&m, "unaffable"), [2, 4]);
        assert_eq!(ids(&m, "unaable"), [1, 5, 4]);
        assert_eq!(ids(&m, "éé"), [6, 7]);
        // Any part without a piece makes the whole word unknown.
        assert_eq!(ids(&m, "unaffx"), [0]);
        assert_eq!(ids(&m, "aff"), [0]);
    }

    #[test]
    fn word_over_the_limit_in_characters_is_unknown() {
        let m = model(&["[UNK]", "é", "##é"], "##", 3);
        assert_eq!(ids(&m, "ééé"), [1, 2, 2]);
        assert_eq!(ids(&m, "éééé"), [0]);
    }

    #[test]
    fn empty_prefix_looks_up_pieces_as_they_are() {
        let m = model(&["[UNK]", "ab", "c", "##c"], "", 100);
        assert_eq!(ids(&m, "abc"), [1, 2]);
    }

    #[test]
    fn missing_unknown_token_is_refused() {
        let json = r###"{"unk_token": "[UNK]", "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100, "vocab": {"a": 0}}"###;
        assert!(Model::from_json(json).is_err());
    }
}
