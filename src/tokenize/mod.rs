//! `prep tokenize`: raw documents into a sharded token dataset.
//!
//! The stage streams: a reader thread hands out batches of raw documents,
//! worker threads (rayon) parse and tokenize them, and the calling thread puts
//! the results back in input order and writes the shards. At most
//! `window` batches are in flight at once, so memory does not grow with the
//! input; the output does not depend on the number of threads.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

pub use crate::engine::EngineChoice;
use crate::format::{checksum_hex, Dtype, FormatError, InputInfo, Manifest};
use crate::input::{DocError, InputError, Location};
use crate::partition::Part;
use crate::run::Writing;

mod journal;
mod stage;
pub(crate) use stage::plan;

pub use crate::progress::{NoProgress, Progress, ProgressSnapshot};

/// How the end-of-document token is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eos {
    /// The tokenizer's own special end-of-document token if it has one
    /// (see [`crate::engine::LoadedTokenizer::default_eos`]), else none.
    Auto,
    /// No end-of-document token.
    Off,
    /// An id, or a token string (see [`crate::engine::token_arg`]).
    Token(String),
}

/// Everything `prep tokenize` can be asked to do.
#[derive(Debug, Clone)]
pub struct TokenizeConfig {
    /// Path of a HuggingFace `tokenizer.json` (`.zst`/`.gz` compressed is fine).
    pub tokenizer: PathBuf,
    /// Files, directories and globs.
    pub inputs: Vec<String>,
    /// Field holding the text; `a.b` reaches into nested objects.
    pub text_key: String,
    /// The dataset directory to write.
    pub output: PathBuf,
    /// Token appended to every document.
    pub eos: Eos,
    /// Token prepended to every document (token string or id).
    pub bos: Option<String>,
    /// Worker threads; 0 means one per core.
    pub threads: usize,
    /// Shard size and whether to replace what the output holds.
    pub writing: Writing,
    /// Drop documents whose exact text was seen before.
    pub dedup: bool,
    /// Count bad documents and go on, instead of stopping at the first.
    pub skip_bad: bool,
    /// Text bytes per batch handed to a worker.
    pub batch_bytes: usize,
    /// Batches in flight per worker thread (the reorder window).
    pub window_per_thread: usize,
    /// Task `I` of `N` of a partitioned run (`--part I/N`): read only this
    /// part's share of the inputs and write a partial dataset for `prep merge`.
    pub part: Option<Part>,
    /// Which encoder runs (`--engine`): the ids are the same either way.
    pub engine: EngineChoice,
    /// Chat mode (`--chat`): rows are conversations, rendered by a chat
    /// template, written with a loss mask beside their tokens.
    pub chat: Option<crate::chat::ChatConfig>,
}

impl TokenizeConfig {
    /// A config with the CLI's defaults for everything but the required paths.
    pub fn new(
        tokenizer: impl Into<PathBuf>,
        inputs: Vec<String>,
        output: impl Into<PathBuf>,
    ) -> Self {
        TokenizeConfig {
            tokenizer: tokenizer.into(),
            inputs,
            text_key: "text".into(),
            output: output.into(),
            eos: Eos::Auto,
            bos: None,
            threads: 0,
            writing: Writing::default(),
            dedup: false,
            skip_bad: false,
            batch_bytes: DEFAULT_BATCH_BYTES,
            window_per_thread: DEFAULT_WINDOW_PER_THREAD,
            part: None,
            engine: EngineChoice::Auto,
            chat: None,
        }
    }
}

/// Default text bytes per batch.
pub const DEFAULT_BATCH_BYTES: usize = 1 << 20;
/// Default batches in flight per thread.
pub const DEFAULT_WINDOW_PER_THREAD: usize = 4;
/// Documents per batch at most (many tiny documents make small batches).
const MAX_BATCH_DOCS: usize = 8192;
/// Bad documents described in the report (the rest are only counted).
const MAX_WARNINGS: usize = 20;

/// Every way `prep tokenize` can fail.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// An input could not be found or read.
    #[error(transparent)]
    Input(#[from] InputError),
    /// Writing or reading the dataset failed.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The tokenizer file cannot be read or is not a tokenizer.json.
    #[error(transparent)]
    Load(#[from] crate::engine::TokenizerError),
    /// The tokenizer cannot be used as asked.
    #[error("tokenizer {}: {message}", path.display())]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// `--eos` or `--bos` names no token of the vocabulary.
    #[error(transparent)]
    UnknownToken(#[from] crate::engine::TokenArgError),
    /// A document is bad and `--skip-bad` was not given.
    #[error("{}: {loc}: {error} (pass --skip-bad to skip bad documents)", path.display())]
    BadDocument {
        /// The input file.
        path: PathBuf,
        /// Where in it.
        loc: Location,
        /// What is wrong.
        error: DocError,
    },
    /// A chat row is bad and `--skip-bad` was not given.
    #[error("{}: {loc}: {error} (pass --skip-bad to skip bad documents)", path.display())]
    BadConversation {
        /// The input file.
        path: PathBuf,
        /// Where in it.
        loc: Location,
        /// What is wrong.
        error: crate::chat::RowError,
    },
    /// Chat mode cannot start: its template or flags.
    #[error(transparent)]
    Chat(#[from] crate::chat::ChatSetupError),
    /// The tokenizer failed on a document.
    #[error("{}: {loc}: the tokenizer failed: {message}", path.display())]
    Encode {
        /// The input file.
        path: PathBuf,
        /// Where in it.
        loc: Location,
        /// The tokenizer's message.
        message: String,
    },
    /// The output directory was refused or is held by another run.
    #[error(transparent)]
    Output(#[from] crate::output::OutputError),
    /// The output directory is, lies inside or holds an input.
    #[error(transparent)]
    Overlap(#[from] crate::run::Overlap),
    /// Options that do not go together.
    #[error("{0}")]
    Usage(String),
    /// The worker threads could not be started.
    #[error("cannot start {threads} worker threads: {message}")]
    Threads {
        /// Threads asked for.
        threads: usize,
        /// The error.
        message: String,
    },
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct TokenizeReport {
    /// The manifest written (or found, when the dataset was already complete).
    pub manifest: Manifest,
    /// The dataset was already complete: nothing was done.
    pub already_complete: bool,
    /// Shards kept from an interrupted run.
    pub resumed_shards: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// Text bytes tokenized in this run (resumed shards excluded).
    pub text_bytes: u64,
    /// Tokens written in this run (resumed shards excluded).
    pub tokens: u64,
    /// Documents written in this run (resumed shards excluded).
    pub documents: u64,
    /// Worker threads used.
    pub threads: usize,
    /// The eos token and how it was chosen, for the summary.
    pub eos_note: String,
    /// The engine that encoded, and why, for the summary.
    pub engine_note: String,
    /// The first bad documents skipped, described.
    pub warnings: Vec<String>,
}

/// Runs `prep tokenize`.
pub fn run(
    config: &TokenizeConfig,
    progress: &dyn Progress,
) -> Result<TokenizeReport, TokenizeError> {
    stage::run(config, progress)
}

/// The options recorded in the manifest: those that shape the output.
fn options_json(
    config: &TokenizeConfig,
    eos: Option<u32>,
    bos: Option<u32>,
    dtype: Dtype,
    chat: Option<&crate::chat::Chat>,
) -> serde_json::Value {
    let mut options = json!({
        "tokenizer": display_path(&config.tokenizer),
        "text_key": config.text_key,
        "eos": eos,
        "bos": bos,
        "dtype": dtype,
        "shard_size": config.writing.shard_size,
        "dedup": config.dedup,
        "skip_bad": config.skip_bad,
    });
    if let Some(chat) = chat {
        options["chat"] = chat.options.clone();
    }
    options
}

/// The options that shape a run's bytes, for its fingerprint
/// ([`crate::run::job_fingerprint`]): the recorded options, adjusted.
///
/// The tokenizer counts by its checksum, not its path. `skip_bad` is left
/// out: it changes nothing until a bad document is met, and a run that
/// stopped at one must be resumable with `--skip-bad`, as its error message
/// suggests (a resumed or finished run that did skip documents is only
/// accepted with `--skip-bad`: see the pipeline). `engine` is left out
/// because both engines give the same ids: a run may resume with the other.
/// A chat template counts by the checksum of its text, as the tokenizer does.
fn fingerprinted(options: &serde_json::Value, tokenizer_xxh3: u64) -> serde_json::Value {
    let mut options = options.clone();
    if let Some(map) = options.as_object_mut() {
        map.remove("skip_bad");
        map.remove("engine");
        map.remove("tokenizer");
        map.insert("tokenizer_xxh3".into(), checksum_hex(tokenizer_xxh3).into());
        // A template counts by its text's checksum, not its path.
        if let Some(chat) = map.get_mut("chat").and_then(|c| c.as_object_mut()) {
            chat.remove("template");
        }
    }
    options
}

/// The path as given, for the manifest and messages.
fn display_path(path: &std::path::Path) -> String {
    path.to_string_lossy().into_owned()
}

fn input_infos(files: &[crate::input::InputFile]) -> Vec<InputInfo> {
    files
        .iter()
        .map(|f| InputInfo {
            path: display_path(&f.path),
            bytes: f.bytes,
            xxh3: None,
            version: f.version.clone(),
        })
        .collect()
}
