//! The fast encoding engine: byte-level BPE with ids identical to HF
//! tokenizers, for the tokenizers whose every step it knows.
//!
//! [`FastTokenizer::from_json`] reads a `tokenizer.json` and accepts it only
//! if each stage is one the engine reproduces exactly; anything else is
//! [`Unsupported`], with the reason, and prep runs HF tokenizers instead.
//! What it accepts:
//!
//! - **added tokens**, split out as HF does even without
//!   `add_special_tokens`: first the tokens with `normalized: false` from the
//!   raw text, then, within each normalized text between them, those with
//!   `normalized: true` (as the normalizer writes them), each set by
//!   leftmost-longest match, with `single_word`, `lstrip` and `rstrip`
//!   applied by HF's own regex-crate tests;
//! - **normalizer**: the ones in [`normalize`], or none;
//! - **pre-tokenizer**: any sequence of the steps in [`pretok`] around one
//!   `ByteLevel`; the shapes of the GPT-2, cl100k / Llama 3, o200k and
//!   DeepSeek V3 files run on one scanner of [`scan`], never a regex;
//! - **model**: `BPE` (or no type) with no dropout and no byte fallback,
//!   with or without a `continuing_subword_prefix` and `end_of_word_suffix`
//!   (spelled as HF's `merge_word` spells them); a byte without a token is
//!   dropped, as HF drops it, unless the model names an unknown token.
//!
//! The post-processor and decoder do not touch the ids of
//! `encode(text, add_special_tokens=false)`, which is what prep asks for.
//!
//! [`LoadedTokenizer`] loads a `tokenizer.json` for every stage that needs
//! one (HF tokenizers' reading of it, this engine's, or both), chooses
//! the default end-of-document token, and [`token_arg`] is the one rule by
//! which `--eos`, `--bos`, `--pad` and `--sep` name a token.
//!
//! prep re-exports this crate as `prep::engine`; it depends on nothing of
//! prep's, so that the dev profile can build it optimised while the rest of
//! prep stays quick to recompile.
#![deny(missing_docs)]

mod bert;
mod bpe;
mod cache;
pub mod compiled;
mod dfa;
mod normalize;
pub mod offsets;
mod precompiled;
mod pretok;
pub mod scan;
mod sentencepiece;
mod tokenizer;
mod unicode;
mod unigram;
mod wordpiece;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, Anchored, Input, MatchKind, StartKind};
use foldhash::fast::FixedState;
use serde_json::value::RawValue;
use serde_json::Value;

use bpe::{Bpe, BpeState, Merge};
use normalize::Normalizer;
use pretok::Steps;
pub use scan::Pattern;
use tokenizer::Names;
pub use tokenizer::{
    read_tokenizer_bytes, token_arg, tokenizer_file, Compiled, DefaultEos, LoadedTokenizer,
    PostProcessorTokens, Readings, TokenArgError, TokenNames, TokenizerError, EOS_NAMES,
    TOKEN_PREFIX,
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

/// A tokenizer the fast engine runs.
pub struct FastTokenizer {
    normalizer: Option<Normalizer>,
    model: Engine,
    /// Added tokens matched on the raw text.
    raw: Option<Added>,
    /// Added tokens matched on the normalized text.
    normalized: Option<Added>,
    /// Tells this tokenizer's cached pieces from another's.
    serial: u64,
}

/// The pre-tokenizer and model, by family.
enum Engine {
    /// Byte-level BPE (GPT-2 and its descendants).
    ByteLevel { pre: PreTokenizer, bpe: Box<Bpe> },
    /// BPE over characters, SentencePiece style (Llama 2, Mistral, Phi-3).
    SentencePiece(Steps, Box<sentencepiece::Model>),
    /// Unigram (T5, mT5, XLM-R).
    Unigram(Steps, unigram::Model),
    /// WordPiece (BERT and its descendants).
    WordPiece(Steps, wordpiece::Model),
}

impl Engine {
    /// Writes the family and the model's tables; the pre-tokenizer's steps
    /// are read again from the file's JSON.
    fn write(&self, w: &mut compiled::Writer) {
        match self {
            Engine::ByteLevel { bpe, .. } => {
                w.u8(0);
                bpe.write(w);
            }
            Engine::SentencePiece(_, m) => {
                w.u8(1);
                m.write(w);
            }
            Engine::Unigram(_, m) => {
                w.u8(2);
                m.write(w);
            }
            Engine::WordPiece(_, m) => {
                w.u8(3);
                m.write(w);
            }
        }
    }
}

/// How the text between added tokens is cut into pieces.
enum PreTokenizer {
    /// One scanner does the whole pre-tokenizer (the hot path); with a
    /// space prepended to a text that does not start with one when `true`.
    Scan(Pattern, bool),
    /// Any other sequence of steps.
    Steps(Steps),
}

impl PreTokenizer {
    /// The pre-tokenizer around a `ByteLevel` step: one scanner where one
    /// does it all, else the steps.
    fn for_byte_level(steps: Steps) -> Result<PreTokenizer, Unsupported> {
        Ok(match steps.scanner() {
            Some((pattern, prefix_space)) => PreTokenizer::Scan(pattern, prefix_space),
            None => PreTokenizer::Steps(steps.checked_byte_level()?),
        })
    }
}

/// One worker's buffers and cache of encoded pieces. A state used with
/// another tokenizer empties its cache first, so it cannot mix them.
#[derive(Default)]
pub struct EncodeState {
    serial: u64,
    bpe: BpeState,
    sentencepiece: sentencepiece::State,
    unigram: unigram::State,
    wordpiece: wordpiece::State,
    pretok: pretok::Scratch,
}

/// Serial numbers of tokenizers, from 1 (a fresh state belongs to none).
static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// An added token's options, as HF applies them around a match.
#[derive(Debug, Clone, Copy, Default)]
struct Strip {
    /// Only where no word character touches either end.
    single_word: bool,
    /// Whitespace before it is part of it.
    lstrip: bool,
    /// Whitespace after it is part of it.
    rstrip: bool,
}

/// A set of added tokens, found by leftmost-longest match.
struct Added {
    matcher: AhoCorasick,
    /// The bytes every token starts with, where there are two or more: a
    /// match starts only where they occur, and a search for them skips
    /// text far faster than the automaton, whose own prefilter stops at
    /// every occurrence of a first byte (GPT-NeoX's 23 runs of spaces all
    /// start with two spaces). The automaton then runs anchored there.
    prefix: Option<memchr::memmem::Finder<'static>>,
    ids: Vec<u32>,
    strip: Vec<Strip>,
}

impl Added {
    fn new(tokens: Vec<(String, u32, Strip)>) -> Result<Option<Added>, Unsupported> {
        if tokens.is_empty() {
            return Ok(None);
        }
        let mut patterns = Vec::with_capacity(tokens.len());
        let mut ids = Vec::with_capacity(tokens.len());
        let mut strip = Vec::with_capacity(tokens.len());
        for (content, id, s) in tokens {
            patterns.push(content);
            ids.push(id);
            strip.push(s);
        }
        let common = patterns.iter().skip(1).fold(patterns[0].len(), |n, p| {
            let same = patterns[0]
                .bytes()
                .zip(p.bytes())
                .take_while(|(a, b)| a == b);
            n.min(same.count())
        });
        let prefix = (common >= 2)
            .then(|| memchr::memmem::Finder::new(&patterns[0].as_bytes()[..common]).into_owned());
        let matcher = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .start_kind(match prefix {
                Some(_) => StartKind::Anchored,
                None => StartKind::Unanchored,
            })
            .build(&patterns)
            .map_err(|e| Unsupported(format!("added tokens: {e}")))?;
        Ok(Some(Added {
            matcher,
            prefix,
            ids,
            strip,
        }))
    }

    /// The matches in `text`, leftmost-longest, none overlapping: (start,
    /// end, which token).
    fn matches<'a>(&'a self, text: &'a str) -> impl Iterator<Item = (usize, usize, usize)> + 'a {
        let mut plain = self.prefix.is_none().then(|| self.matcher.find_iter(text));
        let mut at = 0;
        std::iter::from_fn(move || {
            let found = |m: aho_corasick::Match| (m.start(), m.end(), m.pattern().as_usize());
            if let Some(plain) = &mut plain {
                return plain.next().map(found);
            }
            let prefix = self.prefix.as_ref()?;
            loop {
                let start = at + prefix.find(&text.as_bytes()[at..])?;
                let input = Input::new(text).range(start..).anchored(Anchored::Yes);
                match self.matcher.find(input) {
                    Some(m) => {
                        at = m.end();
                        return Some(found(m));
                    }
                    None => at = start + 1,
                }
            }
        })
    }
}

/// The tests HF makes around an added token's match, with the regex crate
/// as HF makes them (so `\w` and `\s` are the same sets).
static ENDS_WITH_WORD: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"\w$").expect("a valid regex"));
static STARTS_WITH_WORD: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^\w").expect("a valid regex"));
static SPACE_AT_END: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"\s*$").expect("a valid regex"));
static SPACE_AT_START: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^\s*").expect("a valid regex"));

/// Appends the ids of `text`: `added`'s tokens as their ids, the text
/// between them through `between`.
#[inline]
fn split_added(
    added: Option<&Added>,
    text: &str,
    out: &mut Vec<u32>,
    between: &mut dyn FnMut(&str, bool, &mut Vec<u32>),
) {
    let Some(added) = added else {
        return between(text, true, out);
    };
    let mut last = 0;
    for (mut start, mut stop, token) in added.matches(text) {
        let strip = added.strip[token];
        if strip.single_word {
            let alone_before = start == 0 || !ENDS_WITH_WORD.is_match(&text[..start]);
            let alone_after = stop == text.len() || !STARTS_WITH_WORD.is_match(&text[stop..]);
            if !(alone_before && alone_after) {
                continue;
            }
        }
        if strip.lstrip {
            // Spaces an earlier token already took stay with it.
            let spaces = SPACE_AT_END
                .find(&text[..start])
                .map_or(start, |m| m.start());
            start = spaces.max(last);
        }
        if strip.rstrip {
            stop += SPACE_AT_START.find(&text[stop..]).map_or(0, |m| m.end());
        }
        if last < start {
            between(&text[last..start], last == 0, out);
        }
        out.push(added.ids[token]);
        last = stop.max(last);
    }
    if last < text.len() {
        between(&text[last..], last == 0, out);
    }
}

impl FastTokenizer {
    /// Reads a `tokenizer.json`, or says why the fast engine cannot run it.
    pub fn from_json(json: &[u8]) -> Result<FastTokenizer, Unsupported> {
        Ok(Self::from_json_named(json)?.0)
    }

    /// Reads a `tokenizer.json` whose XXH3 is `source`, with its compiled
    /// form ([`compiled`]), or says why the fast engine cannot run it.
    pub fn compile(json: &[u8], source: u64) -> Result<(FastTokenizer, Vec<u8>), Unsupported> {
        let (fast, _, compiled) = Self::build(json, Some(source))?;
        Ok((fast, compiled.expect("asked for")))
    }

    /// The tokenizer a compiled form holds, if it is whole, current, and
    /// made from the `tokenizer.json` whose XXH3 is `source`.
    pub fn from_compiled_bytes(
        bytes: &[u8],
        source: u64,
    ) -> Result<FastTokenizer, compiled::Stale> {
        Ok(Self::from_compiled(bytes, source)?.0)
    }

    /// [`FastTokenizer::from_compiled_bytes`] of the file at `path`, mapped
    /// (as a run reads the cache): its merge table is used in place.
    pub fn from_compiled_path(
        path: &std::path::Path,
        source: u64,
    ) -> std::io::Result<Result<FastTokenizer, compiled::Stale>> {
        Ok(Self::from_compiled_file(path, source)?.map(|(fast, _)| fast))
    }

    /// [`FastTokenizer::from_json`], with the file's tokens by name (its
    /// vocabulary, added tokens and post-processor), which the engine reads
    /// anyway: what a run asks of a file beside its ids, answered without
    /// HF tokenizers' reading of it.
    pub(crate) fn from_json_named(json: &[u8]) -> Result<(FastTokenizer, Names), Unsupported> {
        let (fast, names, _) = Self::build(json, None)?;
        Ok((fast, names))
    }

    /// Reads a `tokenizer.json` as [`FastTokenizer::from_json_named`]
    /// does, with its compiled form ([`compiled`]) when `compile_for` gives
    /// the file's XXH3.
    pub(crate) fn build(
        json: &[u8],
        compile_for: Option<u64>,
    ) -> Result<(FastTokenizer, Names, Option<Vec<u8>>), Unsupported> {
        let root: File = serde_json::from_slice(json)
            .map_err(|e| Unsupported(format!("not a tokenizer.json: {e}")))?;
        let value = |raw: &Option<Box<RawValue>>| match raw {
            None => Ok(Value::Null),
            Some(raw) => serde_json::from_str(raw.get())
                .map_err(|e| Unsupported(format!("not a tokenizer.json: {e}"))),
        };
        let normalizer = Normalizer::from_json(&value(&root.normalizer)?)?;
        let steps = Steps::from_json(&value(&root.pre_tokenizer)?)?;
        let model = root.model.get();
        let head: ModelHead =
            serde_json::from_str(model).map_err(|e| Unsupported(format!("model: {e}")))?;
        let (model, vocab) = match (head.family()?, steps.byte_level()) {
            (Family::Bpe, true) => {
                let m: BpeModel =
                    serde_json::from_str(model).map_err(|e| Unsupported(format!("model: {e}")))?;
                let pre = PreTokenizer::for_byte_level(steps)?;
                let bpe = Box::new(self::model(&m)?);
                (Engine::ByteLevel { pre, bpe }, m.vocab)
            }
            (Family::Bpe, false) => {
                let (m, vocab) = sentencepiece::Model::from_json(model)?;
                (Engine::SentencePiece(steps, Box::new(m)), vocab)
            }
            (Family::Unigram, false) => {
                let (m, vocab) = unigram::Model::from_json(model)?;
                (Engine::Unigram(steps, m), vocab)
            }
            (Family::WordPiece, false) => {
                let (m, vocab) = wordpiece::Model::from_json(model)?;
                (Engine::WordPiece(steps, m), vocab)
            }
            (family, true) => {
                return Err(Unsupported(format!(
                    "pre-tokenizer: ByteLevel before a {family:?} model"
                )))
            }
        };
        let (raw, normalized) = added_tokens(&root.added_tokens, &vocab, normalizer.as_ref())?;
        let names = Names::new(&root.added_tokens, vocab, &value(&root.post_processor)?)?;
        let compiled = compile_for.map(|source| {
            fn text(raw: &Option<Box<RawValue>>) -> &str {
                raw.as_ref().map_or("null", |r| r.get())
            }
            let mut w = compiled::Writer::default();
            w.str(text(&root.normalizer));
            w.str(text(&root.pre_tokenizer));
            w.str(text(&root.post_processor));
            model.write(&mut w);
            write_added(&mut w, &raw);
            write_added(&mut w, &normalized);
            names.write(&mut w);
            compiled::seal(source, &w.buf)
        });
        let fast = FastTokenizer {
            normalizer,
            model,
            raw: Added::new(raw)?,
            normalized: Added::new(normalized)?,
            serial: SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        Ok((fast, names, compiled))
    }

    /// The tokenizer a compiled form holds, if it is whole and was made by
    /// this engine from the `tokenizer.json` whose XXH3 is `source`.
    pub(crate) fn from_compiled(
        bytes: &[u8],
        source: u64,
    ) -> Result<(FastTokenizer, Names), compiled::Stale> {
        compiled::open(bytes, source)?;
        Self::read_compiled(compiled::Reader::new(&bytes[compiled::HEADER..]))
    }

    /// [`FastTokenizer::from_compiled`] of the compiled form at `path`,
    /// mapped: its merge table is used in place.
    pub(crate) fn from_compiled_file(
        path: &std::path::Path,
        source: u64,
    ) -> std::io::Result<Result<(FastTokenizer, Names), compiled::Stale>> {
        let file = std::fs::File::open(path)?;
        // SAFETY: compiled forms are written whole under another name and
        // renamed into place, never changed where they lie.
        let map = std::sync::Arc::new(unsafe { memmap2::Mmap::map(&file)? });
        Ok(match compiled::open(&map, source) {
            Ok(_) => Self::read_compiled(compiled::Reader::mapped(&map)),
            Err(stale) => Err(stale),
        })
    }

    fn read_compiled(mut r: compiled::Reader) -> Result<(FastTokenizer, Names), compiled::Stale> {
        let refused = |e: Unsupported| compiled::Stale(format!("the engine refuses it now: {e}"));
        let value = |text: &str| {
            serde_json::from_str::<Value>(text)
                .map_err(|e| compiled::Stale(format!("a part is not JSON: {e}")))
        };
        let normalizer = Normalizer::from_json(&value(r.str()?)?).map_err(refused)?;
        let steps = Steps::from_json(&value(r.str()?)?).map_err(refused)?;
        let post_processor = value(r.str()?)?;
        let model = match r.u8()? {
            0 => Engine::ByteLevel {
                pre: PreTokenizer::for_byte_level(steps).map_err(refused)?,
                bpe: Box::new(Bpe::read(&mut r)?),
            },
            1 => Engine::SentencePiece(steps, Box::new(sentencepiece::Model::read(&mut r)?)),
            2 => Engine::Unigram(steps, unigram::Model::read(&mut r)?),
            3 => Engine::WordPiece(steps, wordpiece::Model::read(&mut r)?),
            _ => return Err(compiled::Stale("an unknown model family".into())),
        };
        let raw = read_added(&mut r)?;
        let normalized = read_added(&mut r)?;
        let names = Names::read(&mut r, &post_processor).map_err(refused)?;
        r.finish()?;
        let fast = FastTokenizer {
            normalizer,
            model,
            raw: Added::new(raw).map_err(refused)?,
            normalized: Added::new(normalized).map_err(refused)?,
            serial: SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        Ok((fast, names))
    }

    /// The one scanner that pre-tokenizes, where one does it all.
    pub fn pattern(&self) -> Option<Pattern> {
        match self.model {
            Engine::ByteLevel {
                pre: PreTokenizer::Scan(p, _),
                ..
            } => Some(p),
            _ => None,
        }
    }

    /// The stages the engine runs, in words, for a run's summary.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = &self.normalizer {
            parts.push(format!("normalizer: {n}"));
        }
        let (pre, model) = match &self.model {
            Engine::ByteLevel { pre, .. } => {
                let pre = match pre {
                    PreTokenizer::Scan(p, false) => p.to_string(),
                    PreTokenizer::Scan(p, true) => format!("{p} with a prefix space"),
                    PreTokenizer::Steps(s) => s.to_string(),
                };
                (pre, "byte-level BPE")
            }
            Engine::SentencePiece(s, _) => (s.to_string(), "SentencePiece BPE"),
            Engine::Unigram(s, _) => (s.to_string(), "Unigram"),
            Engine::WordPiece(s, _) => (s.to_string(), "WordPiece"),
        };
        parts.extend([pre, model.to_string()]);
        parts.join("; ")
    }

    /// Appends the ids of `text` to `out`: exactly HF tokenizers'
    /// `encode(text, add_special_tokens=False).ids`.
    pub fn encode(&self, text: &str, state: &mut EncodeState, out: &mut Vec<u32>) {
        if state.serial != self.serial {
            *state = EncodeState {
                serial: self.serial,
                ..EncodeState::default()
            };
        }
        // HF's two passes: tokens that are not normalized are split out of
        // the raw text, then each text between them is normalized and
        // normalized ones are split out of it. `first` says whether a text
        // starts where the whole text does (Metaspace's `first` scheme).
        split_added(self.raw.as_ref(), text, out, &mut |raw, first, out| {
            let text = match &self.normalizer {
                Some(n) => n.apply(raw),
                None => Cow::Borrowed(raw),
            };
            split_added(
                self.normalized.as_ref(),
                &text,
                out,
                &mut |text, at_start, out| self.encode_plain(text, first && at_start, state, out),
            )
        });
    }

    /// Pre-tokenizes and encodes text with no added tokens in it.
    #[inline]
    fn encode_plain(&self, text: &str, first: bool, state: &mut EncodeState, out: &mut Vec<u32>) {
        // HF drops a text the normalizer emptied before pre-tokenizing it
        // (a Metaspace step would otherwise mark it).
        if text.is_empty() {
            return;
        }
        let scratch = &mut state.pretok;
        let (pre, bpe) = match &self.model {
            Engine::ByteLevel { pre, bpe } => (pre, bpe),
            Engine::SentencePiece(steps, m) => {
                let s = &mut state.sentencepiece;
                return steps.run_words(text, first, scratch, &mut |w| m.encode(w, s, out));
            }
            Engine::Unigram(steps, m) => {
                let s = &mut state.unigram;
                return steps.run_words(text, first, scratch, &mut |w| m.encode(w, s, out));
            }
            Engine::WordPiece(steps, m) => {
                let s = &mut state.wordpiece;
                return steps.run_words(text, first, scratch, &mut |w| m.encode(w, s, out));
            }
        };
        let cache = &mut state.bpe;
        match pre {
            PreTokenizer::Scan(pattern, false) => {
                pattern.split(text, &mut |piece| bpe.encode(piece.as_bytes(), cache, out))
            }
            PreTokenizer::Scan(pattern, true) => {
                let spaced;
                let text = if text.starts_with(' ') {
                    text
                } else {
                    spaced = format!(" {text}");
                    &spaced
                };
                pattern.split(text, &mut |piece| bpe.encode(piece.as_bytes(), cache, out))
            }
            PreTokenizer::Steps(steps) => {
                steps.run(text, scratch, &mut |piece| bpe.encode(piece, cache, out))
            }
        }
    }
}

/// The parts of a `tokenizer.json` the engine reads; the vocabulary goes
/// straight into a hash map (a JSON tree of it would be slow to build and
/// slow to search).
/// The normalizer, pre-tokenizer and post-processor are kept as the file
/// spells them, for the compiled form.
#[derive(serde::Deserialize)]
struct File {
    #[serde(default)]
    normalizer: Option<Box<RawValue>>,
    #[serde(default)]
    pre_tokenizer: Option<Box<RawValue>>,
    model: Box<RawValue>,
    #[serde(default)]
    added_tokens: Vec<Value>,
    #[serde(default)]
    post_processor: Option<Box<RawValue>>,
}

/// A model's families, as HF tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Bpe,
    Unigram,
    WordPiece,
}

/// What tells a model's family: its `type`, or, in files that leave it
/// out (RoBERTa, T5, BERT), the fields only one family has.
#[derive(serde::Deserialize)]
struct ModelHead {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    merges: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    max_input_chars_per_word: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    continuing_subword_prefix: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    unk_id: Option<serde::de::IgnoredAny>,
}

impl ModelHead {
    fn family(&self) -> Result<Family, Unsupported> {
        match self.kind.as_deref() {
            Some("BPE") => Ok(Family::Bpe),
            Some("Unigram") => Ok(Family::Unigram),
            Some("WordPiece") => Ok(Family::WordPiece),
            Some(other) => Err(Unsupported(format!("model: {other} is not supported"))),
            // HF tries BPE, WordPiece, WordLevel and Unigram in turn; each
            // needs its own fields.
            None if self.merges.is_some() => Ok(Family::Bpe),
            None if self.max_input_chars_per_word.is_some()
                || self.continuing_subword_prefix.is_some() =>
            {
                Ok(Family::WordPiece)
            }
            None if self.unk_id.is_some() => Ok(Family::Unigram),
            None => Err(Unsupported(
                "model: no type and no fields that tell it".into(),
            )),
        }
    }
}

#[derive(serde::Deserialize)]
struct BpeModel<'a> {
    #[serde(default)]
    dropout: Value,
    #[serde(default)]
    continuing_subword_prefix: Value,
    #[serde(default)]
    end_of_word_suffix: Value,
    #[serde(default)]
    byte_fallback: Value,
    #[serde(default)]
    unk_token: Value,
    #[serde(default)]
    ignore_merges: Value,
    #[serde(default)]
    vocab: Vocab,
    #[serde(default, borrow)]
    merges: Vec<MergeLine<'a>>,
}

/// One entry of a BPE model's `merges` as HF reads it, `"a b"` or
/// `["a", "b"]`, borrowed from the JSON where it holds no escape (a large
/// vocabulary has half a million: a JSON value each was a tenth of Gemma
/// 3's load). `None`: a string that is not two parts around one space.
pub(crate) struct MergeLine<'a>(Option<(Cow<'a, str>, Cow<'a, str>)>);

impl MergeLine<'_> {
    /// The two tokens merged, left and right.
    pub(crate) fn pair(&self) -> Option<(&str, &str)> {
        self.0.as_ref().map(|(a, b)| (a.as_ref(), b.as_ref()))
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for MergeLine<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use std::marker::PhantomData;
        /// A string, borrowed where the JSON allows.
        struct Text<'a>(Cow<'a, str>);
        impl<'de: 'a, 'a> serde::Deserialize<'de> for Text<'a> {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_str(TextVisitor(PhantomData)).map(Text)
            }
        }
        struct TextVisitor<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for TextVisitor<'a> {
            type Value = Cow<'a, str>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a token")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(s))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(s.to_owned()))
            }
        }
        struct Line<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Line<'a> {
            type Value = MergeLine<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#"a merge, "a b" or ["a", "b"]"#)
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                let parts = s.split_once(' ').filter(|(_, b)| !b.contains(' '));
                Ok(MergeLine(
                    parts.map(|(a, b)| (Cow::Borrowed(a), Cow::Borrowed(b))),
                ))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                let parts = s.split_once(' ').filter(|(_, b)| !b.contains(' '));
                let owned = |t: &str| Cow::Owned(t.to_owned());
                Ok(MergeLine(parts.map(|(a, b)| (owned(a), owned(b)))))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let a = seq.next_element::<Text>()?;
                let b = seq.next_element::<Text>()?;
                let more = seq.next_element::<serde::de::IgnoredAny>()?.is_some();
                Ok(MergeLine(match (a, b, more) {
                    (Some(a), Some(b), false) => Some((a.0, b.0)),
                    _ => None,
                }))
            }
        }
        d.deserialize_any(Line(PhantomData))
    }
}

/// A model's vocabulary: token text to id.
pub(crate) type Vocab = HashMap<String, u32, FixedState>;

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

fn model(m: &BpeModel) -> Result<Bpe, Unsupported> {
    let unsupported = |what: String| Err(Unsupported(format!("model: {what}")));
    if !(m.dropout.is_null() || m.dropout.as_f64() == Some(0.0)) {
        return unsupported("dropout".into());
    }
    let affix = |key: &str, value: &Value| match value {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        _ => Err(Unsupported(format!("model: {key} is not a string"))),
    };
    let prefix = affix("continuing_subword_prefix", &m.continuing_subword_prefix)?;
    let suffix = affix("end_of_word_suffix", &m.end_of_word_suffix)?;
    if m.byte_fallback == true {
        return unsupported("byte_fallback".into());
    }
    let vocab = &m.vocab;
    let id = |token: &str| vocab.get(token).copied();
    let chars = byte_chars();
    // HF spells each character of a piece as prefix + byte (all but the
    // first) + suffix (the last) before looking it up.
    let table = |before: &str, after: &str| {
        let mut ids = [0u32; 256];
        for (b, c) in chars.iter().enumerate() {
            match id(&format!("{before}{c}{after}")) {
                Some(i) => ids[b] = i,
                // HF drops a character the vocabulary lacks (Falcon's has no
                // token for some control bytes) unless it has an unknown token.
                None if m.unk_token.is_null() => ids[b] = bpe::NO_TOKEN,
                None => return Err(Unsupported(format!("model: no token for byte {b:#04x}"))),
            }
        }
        Ok(ids)
    };
    let byte_ids = table("", "")?;
    let affixed = if prefix.is_empty() && suffix.is_empty() {
        None
    } else {
        Some(Box::new(bpe::Affixed {
            middle: table(&prefix, "")?,
            last: table(&prefix, &suffix)?,
            only: table("", &suffix)?,
        }))
    };
    let mut merges = bpe::MergeTableBuilder::with_capacity(m.merges.len());
    let mut joined = String::new();
    for (rank, line) in m.merges.iter().enumerate() {
        let Some((a, b)) = line.pair() else {
            return unsupported(format!("merge {rank} is not a pair"));
        };
        // As HF, the merged token is `a` and `b` without its prefix.
        let Some(b_rest) = b.strip_prefix(prefix.as_str()) else {
            return unsupported(format!(
                "merge {rank}: {b:?} does not start with the prefix"
            ));
        };
        joined.clear();
        joined.push_str(a);
        joined.push_str(b_rest);
        let (Some(left), Some(right), Some(new)) = (id(a), id(b), id(&joined)) else {
            return unsupported(format!("merge {rank} names tokens not in the vocabulary"));
        };
        // As in HF, a pair listed twice keeps its last rank.
        let merge = Merge {
            rank: rank as u32,
            id: new,
        };
        if !merges.insert(u64::from(left) << 32 | u64::from(right), merge) {
            return unsupported(format!("merge {rank} joins two tokens of id {}", u32::MAX));
        }
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
        merges: merges.finish(),
        whole,
        affixed,
    })
}

type AddedList = Vec<(String, u32, Strip)>;

fn write_added(w: &mut compiled::Writer, list: &AddedList) {
    w.len(list.len());
    for (content, id, strip) in list {
        w.str(content);
        w.u32(*id);
        w.u8(u8::from(strip.single_word)
            | u8::from(strip.lstrip) << 1
            | u8::from(strip.rstrip) << 2);
    }
}

fn read_added(r: &mut compiled::Reader) -> Result<AddedList, compiled::Stale> {
    let n = r.len()?;
    let mut list = Vec::with_capacity(n);
    for _ in 0..n {
        let content = r.str()?.to_owned();
        let id = r.u32()?;
        let bits = r.u8()?;
        let strip = Strip {
            single_word: bits & 1 != 0,
            lstrip: bits & 2 != 0,
            rstrip: bits & 4 != 0,
        };
        list.push((content, id, strip));
    }
    Ok(list)
}

fn added_tokens(
    list: &[Value],
    vocab: &Vocab,
    normalizer: Option<&Normalizer>,
) -> Result<(AddedList, AddedList), Unsupported> {
    let (mut raw, mut normalized) = (Vec::new(), Vec::new());
    let mut seen = std::collections::HashSet::new();
    // HF numbers an added token itself, whatever the file says: the model's
    // id where the model has the token, else the next id after the largest
    // added so far, from the vocabulary's size. A file whose ids are not
    // that numbering is left to HF.
    let size = vocab.len() as u64;
    let mut largest: Option<u64> = None;
    for t in list {
        let (Some(content), Some(id)) = (t["content"].as_str(), t["id"].as_u64()) else {
            return Err(Unsupported("an added token without content or id".into()));
        };
        let strip = Strip {
            single_word: t["single_word"] == true,
            lstrip: t["lstrip"] == true,
            rstrip: t["rstrip"] == true,
        };
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
        let numbered = match vocab.get(content) {
            Some(&v) => u64::from(v),
            None => match largest {
                Some(max) if max >= size || size == 0 => max + 1,
                _ => size,
            },
        };
        if numbered != id {
            return Err(Unsupported(format!(
                "added token {content:?} has id {id} in the file, and HF numbers it {numbered}"
            )));
        }
        largest = Some(largest.map_or(id, |max| max.max(id)));
        // HF's default for a token that does not say is `!special`.
        let is_normalized = t["normalized"].as_bool().unwrap_or(t["special"] != true);
        if is_normalized {
            // HF looks for a normalized token as the normalizer writes it.
            let content = match normalizer {
                Some(n) => n.apply(content).into_owned(),
                None => content.to_owned(),
            };
            if !content.is_empty() {
                normalized.push((content, id as u32, strip));
            }
        } else {
            raw.push((content.to_owned(), id as u32, strip));
        }
    }
    Ok((raw, normalized))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// With or without a common prefix, the matches are the automaton's
        /// own leftmost-longest ones.
        #[test]
        fn added_token_matches_are_leftmost_longest(
            prefix in "[ a]{0,3}",
            tails in proptest::collection::vec("[ ab]{0,4}", 1..6),
            text in "[ abé]{0,60}",
        ) {
            let tokens: Vec<String> = tails.iter().map(|t| format!("{prefix}{t}"))
                .filter(|t| !t.is_empty()).collect();
            prop_assume!(!tokens.is_empty());
            let added = Added::new(tokens.iter().enumerate()
                .map(|(i, t)| (t.clone(), i as u32, Strip::default())).collect())
                .unwrap().unwrap();
            let reference = AhoCorasickBuilder::new()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&tokens)
                .unwrap();
            let expected: Vec<_> = reference.find_iter(&text)
                .map(|m| (m.start(), m.end(), m.pattern().as_usize())).collect();
            // Every token starts with `prefix`: two bytes of it make a search.
            prop_assert!(prefix.len() < 2 || added.prefix.is_some());
            prop_assert_eq!(added.matches(&text).collect::<Vec<_>>(), expected);
        }
    }
}
