//! Unigram (T5, mT5, XLM-R): the best segmentation of each word by the vocabulary's scores.
//!
//! Not run by the fast engine yet: every file of this family is refused
//! with the reason, and prep runs HF tokenizers for it.

use super::{Unsupported, Vocab};

/// The model, ready to encode.
pub(crate) struct Model {
    vocab: Vocab,
}

/// One worker's buffers.
#[derive(Default)]
pub(crate) struct State;

impl Model {
    /// Reads the `model` object of a `tokenizer.json`, with its
    /// vocabulary (for the added tokens' ids), or says why it is refused.
    pub(crate) fn from_json(_model: &str) -> Result<(Model, Vocab), Unsupported> {
        Err(Unsupported(
            "model: the fast engine does not run this family yet".into(),
        ))
    }

    /// Appends the ids of one pre-tokenized word.
    pub(crate) fn encode(&self, word: &str, _state: &mut State, out: &mut Vec<u32>) {
        out.extend(self.vocab.get(word).copied());
    }
}
