//! Loading a HuggingFace `tokenizer.json` as the reference would use it, and
//! resolving the special tokens a run adds.

use std::io::Read;
use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;
use xxhash_rust::xxh3::xxh3_64;

use super::TokenizeError;
use crate::engine::{FastTokenizer, Unsupported};
use crate::format::Dtype;

/// A tokenizer ready for dataset preparation.
pub(crate) struct LoadedTokenizer {
    /// Truncation and padding off, whatever the file says.
    pub tokenizer: Tokenizer,
    /// The JSON as read (decompressed), copied into the dataset.
    pub json: Vec<u8>,
    /// XXH3-64 of `json`.
    pub xxh3: u64,
    /// One more than the largest id, added tokens included.
    pub vocab_size: u64,
    /// The narrowest dtype that holds every id.
    pub dtype: Dtype,
}

/// Tokens tried, in order, when `--eos` is not given.
pub(crate) const EOS_CANDIDATES: &[&str] = &[
    "<|endoftext|>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
    "</s>",
    "<eos>",
    "<|end|>",
    "[SEP]",
];

impl LoadedTokenizer {
    /// Reads `path` (`.json`, or `.json.zst` / `.json.gz`).
    pub(crate) fn load(path: &Path) -> Result<LoadedTokenizer, TokenizeError> {
        Ok(Self::load_with_fast(path, false)?.0)
    }

    /// [`LoadedTokenizer::load`], and with `fast` the fast engine's reading
    /// of the same file, built at the same time on a second thread (the
    /// two readings of a large vocabulary take about as long each).
    pub(crate) fn load_with_fast(
        path: &Path,
        fast: bool,
    ) -> Result<(LoadedTokenizer, Option<Result<FastTokenizer, Unsupported>>), TokenizeError> {
        let bad = |message: String| TokenizeError::Tokenizer {
            path: path.into(),
            message,
        };
        let json = read_maybe_compressed(path).map_err(|e| bad(e.to_string()))?;
        std::thread::scope(|scope| {
            let fast = fast.then(|| scope.spawn(|| FastTokenizer::from_json(&json)));
            let tok = Self::from_json(&json, bad)?;
            let fast = fast.map(|f| f.join().expect("reading a tokenizer.json does not panic"));
            Ok((tok, fast))
        })
    }

    fn from_json(
        json: &[u8],
        bad: impl Fn(String) -> TokenizeError,
    ) -> Result<LoadedTokenizer, TokenizeError> {
        let mut tokenizer = Tokenizer::from_bytes(json)
            .map_err(|e| bad(format!("not a HuggingFace tokenizer.json: {e}")))?;
        // Dataset preparation keeps every token of every document: a file
        // that switches on truncation or padding for inference must not cut
        // or pad here.
        tokenizer
            .with_truncation(None)
            .map_err(|e| bad(format!("cannot switch truncation off: {e}")))?;
        tokenizer.with_padding(None);
        let max_id = tokenizer
            .get_vocab(true)
            .into_values()
            .max()
            .ok_or_else(|| bad("the vocabulary is empty".into()))?;
        let xxh3 = xxh3_64(json);
        Ok(LoadedTokenizer {
            tokenizer,
            json: json.to_vec(),
            xxh3,
            vocab_size: u64::from(max_id) + 1,
            dtype: Dtype::for_max_id(max_id),
        })
    }

    /// Resolves a `--eos`/`--bos` value: a token string of the vocabulary,
    /// else a decimal id that the vocabulary has.
    pub(crate) fn resolve(&self, flag: &'static str, value: &str) -> Result<u32, TokenizeError> {
        if let Some(id) = self.tokenizer.token_to_id(value) {
            return Ok(id);
        }
        if let Ok(id) = value.parse::<u32>() {
            if self.tokenizer.id_to_token(id).is_some() {
                return Ok(id);
            }
        }
        Err(TokenizeError::UnknownToken {
            flag,
            value: value.into(),
            vocab_size: self.vocab_size,
        })
    }

    /// The usual end-of-text token of this tokenizer, if it has one.
    pub(crate) fn default_eos(&self) -> Option<(String, u32)> {
        EOS_CANDIDATES.iter().find_map(|t| {
            self.tokenizer
                .token_to_id(t)
                .map(|id| ((*t).to_owned(), id))
        })
    }

    /// The token string of `id`, for messages.
    pub(crate) fn token(&self, id: u32) -> String {
        self.tokenizer
            .id_to_token(id)
            .unwrap_or_else(|| format!("#{id}"))
    }
}

/// Reads a whole file, decompressing `.zst` and `.gz` by extension.
pub(crate) fn read_maybe_compressed(path: &Path) -> std::io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let mut out = Vec::new();
    match path.extension().and_then(|e| e.to_str()) {
        Some("zst") => {
            zstd::Decoder::new(file)?.read_to_end(&mut out)?;
        }
        Some("gz") => {
            flate2::read::MultiGzDecoder::new(file).read_to_end(&mut out)?;
        }
        _ => {
            std::io::BufReader::new(file).read_to_end(&mut out)?;
        }
    }
    Ok(out)
}

/// The path as given, for the manifest and messages.
pub(crate) fn display_path(path: &Path) -> String {
    PathBuf::from(path).to_string_lossy().into_owned()
}
