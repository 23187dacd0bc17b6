//! Loading a HuggingFace `tokenizer.json` as the reference would use it, and
//! the special tokens a run adds: the default end-of-document token, what
//! the tokenizer's post-processor would add, and how a flag names a token.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;
use serde_json::Value;
use tokenizers::models::unigram::Unigram;
use tokenizers::models::ModelWrapper;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{Encoding, PostProcessor, Token, Tokenizer};
use xxhash_rust::xxh3::xxh3_64;

use super::compiled::{self, Reader, Stale, Writer};
use super::{FastTokenizer, Unsupported};

/// Why a `tokenizer.json` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The file cannot be read or decompressed.
    #[error("tokenizer {}: {cause}", path.display())]
    Read {
        /// The tokenizer file.
        path: PathBuf,
        /// The underlying error.
        cause: std::io::Error,
    },
    /// The file is not JSON at all.
    #[error("tokenizer {}: not valid JSON: {message} at line {line} column {column}", path.display())]
    Json {
        /// The tokenizer file.
        path: PathBuf,
        /// What the JSON parser found.
        message: String,
        /// 1-based line of the (decompressed) file.
        line: usize,
        /// 1-based column in that line.
        column: usize,
    },
    /// Valid JSON, but not shaped like a HuggingFace `tokenizer.json`.
    #[error("tokenizer {}: not a HuggingFace tokenizer.json: {why}", path.display())]
    NotATokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// What is wrong with its shape.
        why: String,
    },
    /// A tokenizer HF tokenizers reads but prep cannot use.
    #[error("tokenizer {}: {why}", path.display())]
    Unusable {
        /// The tokenizer file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

/// A `--eos`, `--bos`, `--pad` or `--sep` value that names no token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} {value:?}: {why}")]
pub struct TokenArgError {
    /// The flag, as the caller names it (`--eos`).
    pub flag: String,
    /// The value given.
    pub value: String,
    /// Why it names no token.
    pub why: String,
}

/// Written before a token's text, names the token even when that text is
/// digits: `--eos token:0` is the token "0", `--eos 0` is id 0.
pub const TOKEN_PREFIX: &str = "token:";

/// Resolves a flag's value to a token id, the one rule for `--eos`,
/// `--bos`, `--pad` and `--sep` everywhere:
///
/// - a whole number (`0`, `50256`) is an id, never looked up as text: it
///   must be below `vocab_size` and, with a tokenizer, one of its ids;
/// - `token:TEXT` is the token whose text is `TEXT`, whatever `TEXT` is;
/// - anything else is a token's text, looked up in `tokenizer`.
///
/// Without a tokenizer only ids can be resolved.
pub fn token_arg(
    flag: &str,
    value: &str,
    tokenizer: Option<&dyn TokenNames>,
    vocab_size: Option<u64>,
) -> Result<u32, TokenArgError> {
    let refuse = |why: String| TokenArgError {
        flag: flag.to_owned(),
        value: value.to_owned(),
        why,
    };
    let digits = value.strip_prefix('-').unwrap_or(value);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        // A digit token is named with the prefix; say so when one exists,
        // since that may be what was meant.
        let hint = match tokenizer.and_then(|t| t.token_to_id(value)) {
            Some(id) => {
                format!(" (the token {value:?}, id {id}, is written {TOKEN_PREFIX}{value})")
            }
            None => String::new(),
        };
        let id = match value.parse::<u32>() {
            Ok(id) => id,
            Err(_) => {
                return Err(refuse(format!(
                    "an id is a whole number from 0 to {}{hint}",
                    u32::MAX
                )))
            }
        };
        if let Some(size) = vocab_size.filter(|&size| u64::from(id) >= size) {
            return Err(refuse(format!(
                "id {id} is not below the vocabulary size {size}{hint}"
            )));
        }
        if tokenizer.is_some_and(|t| t.id_to_token(id).is_none()) {
            return Err(refuse(format!("the tokenizer has no token with id {id}")));
        }
        return Ok(id);
    }
    let (text, prefixed) = match value.strip_prefix(TOKEN_PREFIX) {
        Some(text) => (text, true),
        None => (value, false),
    };
    let Some(tokenizer) = tokenizer else {
        return Err(refuse(if prefixed {
            "there is no tokenizer to look the token up in".into()
        } else {
            "not an id, and there is no tokenizer to look a token up in".into()
        }));
    };
    let Some(id) = tokenizer.token_to_id(text) else {
        return Err(refuse(if prefixed {
            format!("the tokenizer has no token {text:?}")
        } else {
            "neither an id nor a token of the tokenizer".into()
        }));
    };
    if let Some(size) = vocab_size.filter(|&size| u64::from(id) >= size) {
        return Err(refuse(format!(
            "its id {id} is not below the vocabulary size {size}"
        )));
    }
    Ok(id)
}

/// Special tokens that end a document, in order of preference: the first
/// one a tokenizer has as a *special* added token is its default eos.
/// End-of-turn tokens of chat formats (`<|im_end|>`, `<|eot_id|>`,
/// `<|end|>`, `<end_of_turn>`) are left out on purpose: they end a message,
/// not a document.
pub const EOS_NAMES: &[&str] = &[
    "<|endoftext|>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
    "</s>",
    "<eos>",
];

/// The end-of-document token a run uses when `--eos` is not given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultEos {
    /// The token's text.
    pub token: String,
    /// Its id.
    pub id: u32,
    /// Found as the token the post-processor appends, not by its name.
    pub from_post_processor: bool,
}

impl DefaultEos {
    /// Why this token was chosen, for the run's notes.
    pub fn why(&self) -> &'static str {
        if self.from_post_processor {
            "the special token the tokenizer's post-processor appends (the tokenizer has no \
             special end-of-document token such as <|endoftext|>, </s> or <eos>)"
        } else {
            "the tokenizer's special end-of-document token"
        }
    }
}

/// The special tokens the tokenizer's post-processor puts around a single
/// sequence when asked to (`add_special_tokens=true`), which prep does not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PostProcessorTokens {
    /// Ids added before the text (a bos or `[CLS]`).
    pub before: Vec<u32>,
    /// Ids added after it (an eos or `[SEP]`).
    pub after: Vec<u32>,
}

/// Which readings of a `tokenizer.json` a caller needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readings {
    /// HF tokenizers' alone.
    Hf,
    /// The fast engine's. HF tokenizers reads the file only where the
    /// engine does not run it (and to say what is wrong with a broken one),
    /// or when [`LoadedTokenizer::hf`] is first asked: the token names,
    /// the vocabulary size and the post-processor's tokens come from the
    /// engine's reading. HF's reading of a large vocabulary costs as much
    /// as the engine's (about a second for Gemma 3's 262,144 ids).
    Fast,
    /// Both, read at once on two threads.
    Both,
}

/// A tokenizer ready for dataset preparation.
pub struct LoadedTokenizer {
    path: PathBuf,
    /// HF tokenizers' reading, truncation and padding off whatever the
    /// file says; read on first use after a [`Readings::Fast`] load.
    hf: OnceLock<Tokenizer>,
    /// The tokens by name, from the fast engine's reading, where HF's was
    /// not made at load.
    names: Option<Names>,
    /// The JSON as read (decompressed), copied into the dataset.
    pub json: Vec<u8>,
    /// XXH3-64 of `json`.
    pub xxh3: u64,
    /// Where the fast engine's reading came from, when it read the file.
    pub compiled: Option<Compiled>,
    /// One more than the largest id, added tokens included (a dataset's
    /// dtype is the narrowest that holds every id below it:
    /// `prep::Dtype::for_vocab_size`).
    pub vocab_size: u64,
}

/// A tokenizer's tokens by name: what [`token_arg`] looks a flag's value up
/// in.
pub trait TokenNames {
    /// The id of the token spelled `text`, an added token first.
    fn token_to_id(&self, text: &str) -> Option<u32>;
    /// The text of token `id`, an added token first.
    fn id_to_token(&self, id: u32) -> Option<String>;
}

impl TokenNames for Tokenizer {
    fn token_to_id(&self, text: &str) -> Option<u32> {
        // The inherent method of the `TokenizerImpl` a `Tokenizer` wraps.
        (**self).token_to_id(text)
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        (**self).id_to_token(id)
    }
}

/// A file's tokens by name as the fast engine reads them, looked up as HF
/// tokenizers looks them up: the added tokens first, then the model's
/// vocabulary; and its post-processor, which is HF's own, read alone.
pub(crate) struct Names {
    /// Each added token HF keeps (not the empty ones): id, text, special.
    added: Vec<(u32, String, bool)>,
    vocab: WordList,
    post_processor: Option<PostProcessorWrapper>,
}

/// A vocabulary as one text with each token's end and id, in the order of
/// the map it came from: searched from the start for the few names a run
/// asks (a flag's value, the end-of-document token), and read from a
/// compiled form without a string allocated per token.
struct WordList {
    text: Vec<u8>,
    ends: Vec<u64>,
    ids: Vec<u32>,
}

impl WordList {
    fn iter(&self) -> impl Iterator<Item = (&[u8], u32)> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .zip(&self.ids)
            .map(|((start, &end), &id)| (&self.text[start as usize..end as usize], id))
    }
}

impl Names {
    /// From the file's `added_tokens`, the model's vocabulary and its
    /// `post_processor`. The engine has already checked that every added
    /// token's id is the one HF gives it.
    pub(crate) fn new(
        added_tokens: &[Value],
        vocab: super::Vocab,
        post_processor: &Value,
    ) -> Result<Names, Unsupported> {
        let added = added_tokens
            .iter()
            .filter_map(|t| {
                let content = t["content"].as_str().filter(|c| !c.is_empty())?;
                let id = u32::try_from(t["id"].as_u64()?).ok()?;
                Some((id, content.to_owned(), t["special"] == true))
            })
            .collect();
        let mut words = WordList {
            text: Vec::new(),
            ends: Vec::with_capacity(vocab.len()),
            ids: Vec::with_capacity(vocab.len()),
        };
        for (token, id) in vocab {
            words.text.extend_from_slice(token.as_bytes());
            words.ends.push(words.text.len() as u64);
            words.ids.push(id);
        }
        Ok(Names {
            added,
            vocab: words,
            post_processor: Self::post_processor(post_processor)?,
        })
    }

    fn post_processor(value: &Value) -> Result<Option<PostProcessorWrapper>, Unsupported> {
        match value {
            Value::Null => Ok(None),
            v => {
                Ok(Some(PostProcessorWrapper::deserialize(v).map_err(|e| {
                    Unsupported(format!("post_processor: {e}"))
                })?))
            }
        }
    }

    /// Writes the names for [`Names::read`] (the post-processor is kept as
    /// the file's JSON).
    pub(crate) fn write(&self, w: &mut Writer) {
        w.len(self.added.len());
        for (id, text, special) in &self.added {
            w.u32(*id);
            w.str(text);
            w.bool(*special);
        }
        w.bytes(&self.vocab.text);
        w.u64s(&self.vocab.ends);
        w.u32s(&self.vocab.ids);
    }

    /// The names [`Names::write`] wrote, with the file's `post_processor`.
    pub(crate) fn read(r: &mut Reader, post_processor: &Value) -> Result<Names, Unsupported> {
        let damaged = |e: Stale| Unsupported(e.0);
        let n = r.len().map_err(damaged)?;
        let mut added = Vec::with_capacity(n);
        for _ in 0..n {
            let id = r.u32().map_err(damaged)?;
            let text = r.str().map_err(damaged)?.to_owned();
            added.push((id, text, r.bool().map_err(damaged)?));
        }
        let text = r.bytes().map_err(damaged)?.to_vec();
        let ends = r.u64s().map_err(damaged)?;
        let ids = r.u32s().map_err(damaged)?;
        // The texts are only compared and shown, never cut: UTF-8 is not
        // checked here (the payload's checksum was).
        let whole = ends.len() == ids.len()
            && ends.windows(2).all(|w| w[0] <= w[1])
            && ends.last().is_none_or(|&e| e <= text.len() as u64);
        if !whole {
            return Err(Unsupported("the vocabulary's ends are out of order".into()));
        }
        Ok(Names {
            added,
            vocab: WordList { text, ends, ids },
            post_processor: Self::post_processor(post_processor)?,
        })
    }

    fn added(&self, id: u32) -> Option<&(u32, String, bool)> {
        self.added.iter().find(|a| a.0 == id)
    }

    /// One more than the largest id, as HF's `get_vocab(true)` has them.
    fn vocab_size(&self) -> Option<u64> {
        let model = self.vocab.ids.iter().copied();
        let largest = model.chain(self.added.iter().map(|a| a.0)).max()?;
        Some(u64::from(largest) + 1)
    }
}

impl TokenNames for Names {
    fn token_to_id(&self, text: &str) -> Option<u32> {
        let added = self.added.iter().find(|a| a.1 == text).map(|a| a.0);
        added.or_else(|| {
            let text = text.as_bytes();
            self.vocab
                .iter()
                .find(|&(t, _)| t == text)
                .map(|(_, id)| id)
        })
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        match self.added(id) {
            Some(a) => Some(a.1.clone()),
            None => self
                .vocab
                .iter()
                .find(|&(_, v)| v == id)
                .map(|(t, _)| String::from_utf8_lossy(t).into_owned()),
        }
    }
}

impl TokenNames for LoadedTokenizer {
    fn token_to_id(&self, text: &str) -> Option<u32> {
        match &self.names {
            Some(names) => names.token_to_id(text),
            None => self.hf_read().token_to_id(text),
        }
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        match &self.names {
            Some(names) => names.id_to_token(id),
            None => self.hf_read().id_to_token(id),
        }
    }
}

impl LoadedTokenizer {
    /// Reads `path` (`.json`, or `.json.zst` / `.json.gz`) with HF
    /// tokenizers.
    pub fn load(path: &Path) -> Result<LoadedTokenizer, TokenizerError> {
        Ok(Self::load_with_fast(path, Readings::Hf)?.0)
    }

    /// Reads `path` as `readings` asks, with the fast engine's reading of
    /// it unless `readings` is [`Readings::Hf`] (its error, where the
    /// engine does not run the file). A file HF tokenizers refuses is
    /// refused with its reason whenever HF reads it.
    pub fn load_with_fast(
        path: &Path,
        readings: Readings,
    ) -> Result<(LoadedTokenizer, Option<Result<FastTokenizer, Unsupported>>), TokenizerError> {
        Self::load_cached(path, readings, compiled::cache_dir().as_deref())
    }

    /// [`LoadedTokenizer::load_with_fast`], with the compiled forms kept in
    /// `cache` (none: the engine reads the JSON each time).
    pub fn load_cached(
        path: &Path,
        readings: Readings,
        cache: Option<&Path>,
    ) -> Result<(LoadedTokenizer, Option<Result<FastTokenizer, Unsupported>>), TokenizerError> {
        let json = read_tokenizer_bytes(path).map_err(|source| TokenizerError::Read {
            path: path.into(),
            cause: source,
        })?;
        let read_hf = || -> Result<LoadedTokenizer, TokenizerError> {
            let hf = read_hf(path, &json)?;
            let largest = hf.get_vocab(true).into_values().max();
            let largest = largest.ok_or_else(|| TokenizerError::Unusable {
                path: path.into(),
                why: "the vocabulary is empty".into(),
            })?;
            Ok(LoadedTokenizer {
                path: path.into(),
                hf: OnceLock::from(hf),
                names: None,
                json: json.clone(),
                xxh3: xxh3_64(&json),
                compiled: None,
                vocab_size: u64::from(largest) + 1,
            })
        };
        let xxh3 = xxh3_64(&json);
        match readings {
            Readings::Hf => Ok((read_hf()?, None)),
            Readings::Both => std::thread::scope(|scope| {
                let fast = scope.spawn(|| fast_reading(&json, xxh3, cache));
                let mut tok = read_hf()?;
                let (fast, compiled) = fast
                    .join()
                    .expect("reading a tokenizer.json does not panic");
                tok.compiled = Some(compiled);
                Ok((tok, Some(fast.map(|(fast, _)| fast))))
            }),
            Readings::Fast => match fast_reading(&json, xxh3, cache) {
                (Ok((fast, names)), compiled) => {
                    let Some(vocab_size) = names.vocab_size() else {
                        // HF says what is wrong with an empty vocabulary.
                        return Ok((read_hf()?, Some(Ok(fast))));
                    };
                    let tok = LoadedTokenizer {
                        path: path.into(),
                        hf: OnceLock::new(),
                        names: Some(names),
                        xxh3,
                        json,
                        compiled: Some(compiled),
                        vocab_size,
                    };
                    Ok((tok, Some(Ok(fast))))
                }
                (Err(why), _) => Ok((read_hf()?, Some(Err(why)))),
            },
        }
    }

    /// HF tokenizers' reading of the file, made now if the load did not
    /// make it.
    pub fn hf(&self) -> Result<&Tokenizer, TokenizerError> {
        if let Some(hf) = self.hf.get() {
            return Ok(hf);
        }
        let hf = read_hf(&self.path, &self.json)?;
        Ok(self.hf.get_or_init(|| hf))
    }

    /// HF tokenizers' reading of the file, owned.
    pub fn into_hf(self) -> Result<Tokenizer, TokenizerError> {
        self.hf()?;
        Ok(self.hf.into_inner().expect("read just now"))
    }

    /// Whether HF tokenizers has read the file.
    pub fn hf_is_read(&self) -> bool {
        self.hf.get().is_some()
    }

    /// HF's reading, where the load made it (`names` is `None` only then).
    fn hf_read(&self) -> &Tokenizer {
        self.hf
            .get()
            .expect("a load without the engine's names reads HF's")
    }

    /// Resolves a `--eos`/`--bos` value by [`token_arg`]'s rule.
    pub fn resolve(&self, flag: &str, value: &str) -> Result<u32, TokenArgError> {
        token_arg(flag, value, Some(self), Some(self.vocab_size))
    }

    /// The tokenizer's own end-of-document token, if it has one: the first
    /// of [`EOS_NAMES`] that it has as a special added token, else the
    /// special token its post-processor appends to a sequence (BERT's
    /// `[SEP]`). A plain vocabulary token is never chosen, whatever its
    /// text (Gemma's vocabulary has an ordinary `</s>`; its eos is `<eos>`).
    pub fn default_eos(&self) -> Option<DefaultEos> {
        let is_special = |id: u32, text: &str| match &self.names {
            Some(names) => names.added(id).is_some_and(|a| a.2 && a.1 == text),
            None => self
                .hf_read()
                .get_added_tokens_decoder()
                .get(&id)
                .is_some_and(|t| t.special && t.content == text),
        };
        let named = EOS_NAMES.iter().find_map(|&name| {
            let id = self.token_to_id(name)?;
            is_special(id, name).then(|| DefaultEos {
                token: name.to_owned(),
                id,
                from_post_processor: false,
            })
        });
        if named.is_some() {
            return named;
        }
        let id = *self.post_processor_tokens().after.last()?;
        let token = self.id_to_token(id)?;
        is_special(id, &token).then_some(DefaultEos {
            token,
            id,
            from_post_processor: true,
        })
    }

    /// What the post-processor adds around a sequence, found by asking it:
    /// the special tokens of `encode("a", add_special_tokens=true)` before
    /// and after the ids of `encode("a", add_special_tokens=false)`. Empty
    /// when it adds nothing or the two encodings do not line up. Without
    /// HF's reading, the file's post-processor (HF's, read alone) is asked
    /// to process one token.
    pub fn post_processor_tokens(&self) -> PostProcessorTokens {
        let (plain, full) = match &self.names {
            None => {
                let hf = self.hf_read();
                (hf.encode("a", false), hf.encode("a", true))
            }
            Some(names) => {
                let Some(post) = &names.post_processor else {
                    return PostProcessorTokens::default();
                };
                let plain = Encoding::from_tokens(vec![Token::new(0, "a".into(), (0, 1))], 0);
                (Ok(plain.clone()), post.process(plain, None, true))
            }
        };
        let (Ok(plain), Ok(full)) = (plain, full) else {
            return PostProcessorTokens::default();
        };
        let (ids, mask) = (full.get_ids(), full.get_special_tokens_mask());
        let before = mask.iter().take_while(|&&m| m == 1).count();
        let after = mask[before..].iter().rev().take_while(|&&m| m == 1).count();
        if ids[before..ids.len() - after] != *plain.get_ids() {
            return PostProcessorTokens::default();
        }
        PostProcessorTokens {
            before: ids[..before].to_vec(),
            after: ids[ids.len() - after..].to_vec(),
        }
    }

    /// Notes on the special tokens the post-processor would add that a run
    /// adding `bos` and `eos` does not, so that none is dropped silently.
    pub fn post_processor_notes(&self, bos: Option<u32>, eos: Option<u32>) -> Vec<String> {
        let added = self.post_processor_tokens();
        let mut notes = Vec::new();
        let sides = [
            (
                &added.before,
                bos,
                "adds",
                "at the start",
                "--bos",
                "prepend",
            ),
            (
                &added.after,
                eos,
                "appends",
                "at the end",
                "--eos",
                "append",
            ),
        ];
        for (ids, ours, adds, place, flag, verb) in sides {
            if ids.is_empty() || (ids.len() == 1 && Some(ids[0]) == ours) {
                continue;
            }
            let tokens = ids
                .iter()
                .map(|&id| format!("{:?}", self.token(id)))
                .collect::<Vec<_>>()
                .join(" ");
            let what =
                format!("the tokenizer's post-processor {adds} {tokens} {place} of a sequence");
            notes.push(match (ours, ids.as_slice()) {
                (Some(ours), _) => {
                    format!(
                        "{what}; prep {verb}s {:?} ({flag}) instead",
                        self.token(ours)
                    )
                }
                (None, &[id]) => format!(
                    "{what}; prep does not: pass {flag} '{}' to {verb} it",
                    self.token(id)
                ),
                (None, _) => format!("{what}; prep does not"),
            });
        }
        notes
    }

    /// The token string of `id`, for messages.
    pub fn token(&self, id: u32) -> String {
        self.id_to_token(id).unwrap_or_else(|| format!("#{id}"))
    }
}

/// Where the fast engine's reading of a file came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compiled {
    /// Its compiled form in the cache, at this path.
    Read(PathBuf),
    /// The JSON; the compiled form was then written at `path`, since the
    /// cache did not serve (`why`: none yet, stale, or damaged).
    Written {
        /// The compiled form.
        path: PathBuf,
        /// Why the one there was not read.
        why: String,
    },
    /// The JSON, with nothing kept (no cache directory, a cache that cannot
    /// be written, or a file the engine does not run): why.
    NotKept(String),
}

impl std::fmt::Display for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Compiled::Read(path) => write!(f, "compiled form read from {}", path.display()),
            Compiled::Written { path, why } => {
                write!(
                    f,
                    "read from JSON ({why}); compiled form written to {}",
                    path.display()
                )
            }
            Compiled::NotKept(why) => write!(f, "read from JSON; no compiled form kept ({why})"),
        }
    }
}

/// The fast engine's reading of `json` (whose XXH3 is `xxh3`): from its
/// compiled form in the cache where that is whole and current, else from
/// the JSON, writing the compiled form for the next run. A compiled form
/// that cannot be used is never an error, only a slower load.
fn fast_reading(
    json: &[u8],
    xxh3: u64,
    cache: Option<&Path>,
) -> (Result<(FastTokenizer, Names), Unsupported>, Compiled) {
    let Some(dir) = cache else {
        let why = format!(
            "{} is off, or neither XDG_CACHE_HOME nor HOME is set",
            compiled::CACHE_ENV
        );
        return (FastTokenizer::from_json_named(json), Compiled::NotKept(why));
    };
    let path = compiled::cache_file(dir, xxh3);
    let why = match FastTokenizer::from_compiled_file(&path, xxh3) {
        Ok(Ok(read)) => return (Ok(read), Compiled::Read(path)),
        Ok(Err(stale)) => format!("the one there is stale or damaged: {stale}"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "none yet".to_owned(),
        Err(e) => format!("cannot read the one there: {e}"),
    };
    match FastTokenizer::build(json, Some(xxh3)) {
        Ok((fast, names, bytes)) => {
            let bytes = bytes.expect("build compiles when given the source's hash");
            let kept = match compiled::store(&path, &bytes) {
                Ok(()) => Compiled::Written { path, why },
                Err(e) => Compiled::NotKept(format!("cannot write {}: {e}", path.display())),
            };
            (Ok((fast, names)), kept)
        }
        Err(unsupported) => (
            Err(unsupported),
            Compiled::NotKept("the fast engine does not run this file".into()),
        ),
    }
}

/// HF tokenizers' reading of `json` (from `path`), truncation and padding
/// off whatever the file says.
fn read_hf(path: &Path, json: &[u8]) -> Result<Tokenizer, TokenizerError> {
    let unusable = |why: String| TokenizerError::Unusable {
        path: path.into(),
        why,
    };
    // HF panics on a SentencePiece character map it cannot read (at load,
    // or on the first text that reaches a broken entry): such a file is
    // refused first, naming what is wrong.
    check_charsmaps(json).map_err(|e| unusable(format!("normalizer: Precompiled: {e}")))?;
    let mut tokenizer =
        Tokenizer::from_bytes(json).map_err(|e| diagnose(path, json, &e.to_string()))?;
    with_python_scores(&mut tokenizer, json).map_err(unusable)?;
    // Dataset preparation keeps every token of every document: a file that
    // switches on truncation or padding for inference must not cut or pad
    // here.
    tokenizer
        .with_truncation(None)
        .map_err(|e| unusable(format!("cannot switch truncation off: {e}")))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

/// Gives a Unigram model the scores the Python package reads, so that its
/// ids are Python's. Both read the file with serde_json, but prep links it
/// with `float_roundtrip` (jsonschema asks for it, and Cargo builds one
/// serde_json for all), which reads each score as the nearest double, while
/// the Python package's serde_json reads some a double off (T5's
/// `-2.0122928619384766` for "▁"); where two segmentations nearly tie
/// (`-------` in T5) the two builds then choose differently. The model is
/// rebuilt as HF builds it, from the scores as Python has them.
fn with_python_scores(tokenizer: &mut Tokenizer, json: &[u8]) -> Result<(), String> {
    if !matches!(tokenizer.get_model(), ModelWrapper::Unigram(_)) {
        return Ok(());
    }
    #[derive(serde::Deserialize)]
    struct Root<'a> {
        #[serde(borrow)]
        model: &'a serde_json::value::RawValue,
    }
    let root: Root = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    let (vocab, unk_id, byte_fallback) =
        super::unigram::python_model(root.model.get()).map_err(|e| e.0)?;
    let model = Unigram::from(vocab, unk_id, byte_fallback).map_err(|e| e.to_string())?;
    tokenizer.with_model(model);
    Ok(())
}

/// Says what is wrong with a file HF tokenizers refused: not JSON at all,
/// JSON of another shape (the top level or `model` not an object), or a
/// tokenizer.json HF tokenizers cannot read (its own message). Runs only
/// after a failure, so a good file is parsed once.
fn diagnose(path: &Path, json: &[u8], hf_error: &str) -> TokenizerError {
    let shape = |why: String| TokenizerError::NotATokenizer {
        path: path.into(),
        why,
    };
    let value = match serde_json::from_slice::<Value>(json) {
        Ok(value) => value,
        Err(e) => {
            let full = e.to_string();
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            return TokenizerError::Json {
                path: path.into(),
                message: full.strip_suffix(&suffix).unwrap_or(&full).to_owned(),
                line: e.line(),
                column: e.column(),
            };
        }
    };
    let Value::Object(top) = &value else {
        return shape(format!(
            "the file holds {}, not a JSON object",
            kind_of(&value)
        ));
    };
    match top.get("model") {
        None => {
            let fields: Vec<String> = top.keys().take(12).map(|k| format!("{k:?}")).collect();
            let more = top.len().saturating_sub(fields.len());
            shape(format!(
                "it has no \"model\" field (its fields: {}{})",
                if fields.is_empty() {
                    "none".to_owned()
                } else {
                    fields.join(", ")
                },
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ))
        }
        // HF tokenizers says "data did not match any variant of untagged
        // enum ModelUntagged" for a model whose type it does not know (or
        // that has none and matches no model by its fields): say which.
        Some(Value::Object(model)) => match model.get("type") {
            Some(Value::String(kind)) if !MODEL_TYPES.contains(&kind.as_str()) => shape(format!(
                "model type {kind:?} is unknown: prep reads {} models",
                MODEL_TYPES.join(", ")
            )),
            Some(kind) if !kind.is_string() => shape(format!(
                "the model's \"type\" is {}, not a string",
                kind_of(kind)
            )),
            None if hf_error.contains("ModelUntagged") => shape(format!(
                "the model has no \"type\", and its fields are those of none of the {} models prep reads",
                MODEL_TYPES.join(", ")
            )),
            // The shape is right as far as we look: HF tokenizers says what is not.
            _ => shape(hf_error.to_owned()),
        },
        Some(model) => shape(format!("\"model\" is {}, not an object", kind_of(model))),
    }
}

/// The `model.type` values of a tokenizer.json that HF tokenizers reads
/// (and so prep: the fast engine runs a subset of them, HF tokenizers the
/// rest).
const MODEL_TYPES: [&str; 4] = ["BPE", "WordPiece", "WordLevel", "Unigram"];

/// What a JSON value is, for messages: `an array`.
fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The tokenizer file `path` names: `path` itself, or for a directory the
/// `tokenizer.json` in it, as a `save_pretrained` folder and a Hugging Face
/// hub cache snapshot folder (`models--org--name/snapshots/<hash>`) hold it.
/// A hub cache's model folder (`models--org--name`, with `refs/main` and
/// `snapshots/`) gives the snapshot `refs/main` names. Symbolic links are
/// followed (a snapshot's files link into its `blobs/`).
///
/// # Errors
/// `NotFound` naming what was looked for when a directory holds no
/// `tokenizer.json`; other I/O errors as they come.
pub fn tokenizer_file(path: &Path) -> std::io::Result<PathBuf> {
    if !std::fs::metadata(path)?.is_dir() {
        return Ok(path.to_owned());
    }
    let direct = path.join("tokenizer.json");
    if direct.is_file() {
        return Ok(direct);
    }
    if let Ok(main) = std::fs::read_to_string(path.join("refs").join("main")) {
        let snapshot = path
            .join("snapshots")
            .join(main.trim())
            .join("tokenizer.json");
        if snapshot.is_file() {
            return Ok(snapshot);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::NotFound,
        "a directory with no tokenizer.json in it (give the file, a save_pretrained \
         folder or a hub cache snapshot folder that holds one)",
    ))
}

/// Reads a whole tokenizer file, decompressing `.zst` and `.gz` by extension;
/// a directory is read as [`tokenizer_file`] resolves it.
pub fn read_tokenizer_bytes(path: &Path) -> std::io::Result<Vec<u8>> {
    let path = &tokenizer_file(path)?;
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

/// Whether every `Precompiled` normalizer of a `tokenizer.json` (alone or
/// in a `Sequence`) has a map HF reads without panicking; else what is
/// wrong with the first that does not. A file that is not JSON passes:
/// HF's own reading reports that.
fn check_charsmaps(json: &[u8]) -> Result<(), String> {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(default)]
        normalizer: Value,
    }
    fn walk(n: &Value) -> Result<(), String> {
        match n["type"].as_str() {
            Some("Precompiled") => super::precompiled::check_json(n),
            Some("Sequence") => n["normalizers"]
                .as_array()
                .map_or(Ok(()), |steps| steps.iter().try_for_each(walk)),
            _ => Ok(()),
        }
    }
    match serde_json::from_slice::<Head>(json) {
        Ok(head) => walk(&head.normalizer),
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPT-2 tokenizer.json of fixtures/, decompressed.
    fn gpt2_json() -> Vec<u8> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/tokenizers/gpt2.tokenizer.json.zst");
        read_tokenizer_bytes(&path).unwrap()
    }

    #[test]
    fn a_save_pretrained_directory_is_read_through_its_tokenizer_json() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), gpt2_json()).unwrap();
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        let tok = LoadedTokenizer::load(dir.path()).unwrap();
        assert_eq!(tok.json, gpt2_json());
        assert_eq!(tok.vocab_size, 50257);
    }

    #[cfg(unix)]
    #[test]
    fn a_hub_cache_snapshot_and_its_model_folder_are_read_through_the_symlinks() {
        // models--gpt2/{refs/main, snapshots/<hash>/tokenizer.json -> ../../blobs/<sha>}
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("models--gpt2");
        std::fs::create_dir_all(model.join("blobs")).unwrap();
        std::fs::create_dir_all(model.join("refs")).unwrap();
        std::fs::create_dir_all(model.join("snapshots/abc123")).unwrap();
        std::fs::write(model.join("blobs/f1e2d3"), gpt2_json()).unwrap();
        std::fs::write(model.join("refs/main"), b"abc123").unwrap();
        std::os::unix::fs::symlink(
            "../../blobs/f1e2d3",
            model.join("snapshots/abc123/tokenizer.json"),
        )
        .unwrap();
        let snapshot = model.join("snapshots/abc123");
        assert_eq!(
            tokenizer_file(&snapshot).unwrap(),
            snapshot.join("tokenizer.json")
        );
        assert_eq!(
            tokenizer_file(&model).unwrap(),
            snapshot.join("tokenizer.json")
        );
        assert_eq!(LoadedTokenizer::load(&model).unwrap().json, gpt2_json());
    }

    #[test]
    fn a_directory_without_tokenizer_json_says_so() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("vocab.json"), b"{}").unwrap();
        let err = LoadedTokenizer::load(dir.path())
            .err()
            .expect("no tokenizer.json");
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("tokenizer {}: ", dir.path().display())),
            "{message}"
        );
        assert!(message.contains("no tokenizer.json"), "{message}");
        assert!(!message.contains("Is a directory"), "{message}");
    }
}
