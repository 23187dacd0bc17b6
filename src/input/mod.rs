//! Readers of raw corpora: JSONL (plain, `.gz`, `.zst`) and Parquet.
//!
//! Inputs are expanded from files, directories and globs into one sorted list
//! ([`expand`]); a [`Reader`] walks that list in order and hands out batches of
//! [`RawDoc`]s. JSONL lines are handed out unparsed, so that JSON parsing runs
//! on the worker threads with tokenization ([`extract_text`]); Parquet text
//! arrives already decoded from its column.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

pub mod jsonl;
pub mod parquet;

/// A fatal problem with an input file: the job stops.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A pattern given to `--input` matched no file.
    #[error("--input {pattern:?} matched no file")]
    NoMatch {
        /// The pattern as given.
        pattern: String,
    },
}

/// A problem with one document. Fatal unless the user asked to skip bad documents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocError {
    /// The line is not valid UTF-8.
    #[error("invalid UTF-8 at byte {offset} of the line")]
    InvalidUtf8 {
        /// Byte offset of the first invalid byte within the line.
        offset: usize,
    },
}

/// The `--text-key` path: `text`, or `a.b` for a nested field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextKey {
    parts: Vec<String>,
}

impl TextKey {
    /// Parses a dotted path.
    pub fn parse(key: &str) -> TextKey {
        TextKey { parts: key.split('.').map(str::to_owned).collect() }
    }
}

/// Where a document sits in its file, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// 1-based line number in a JSONL file.
    Line(u64),
    /// 0-based row group and 0-based row within it, in a Parquet file.
    Row {
        /// Row group index.
        row_group: usize,
        /// Row index within the row group.
        row: u64,
    },
}

/// What a reader hands out for one document.
#[derive(Debug)]
pub enum Payload {
    /// One JSONL line (without its line terminator), not yet parsed.
    Json(Vec<u8>),
    /// Text already decoded (Parquet).
    Text(String),
    /// A document that could not be read (a null in a Parquet column).
    Bad(DocError),
}

/// One raw document and where it came from.
#[derive(Debug)]
pub struct RawDoc {
    /// Index of the file in the expanded input list.
    pub file: u32,
    /// Position within that file.
    pub loc: Location,
    /// The document itself.
    pub payload: Payload,
}

/// Compression of a JSONL file, chosen by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Plain text.
    None,
    /// `.gz`
    Gzip,
    /// `.zst`
    Zstd,
}

/// The format of an input file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// JSON Lines, possibly compressed.
    Jsonl(Compression),
    /// Apache Parquet.
    Parquet,
}

/// One input file after expansion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFile {
    /// The path as found.
    pub path: PathBuf,
    /// Its format.
    pub kind: InputKind,
    /// Size on disk in bytes.
    pub bytes: u64,
}

/// Expands `--input` values into a sorted, de-duplicated list of files.
pub fn expand(_patterns: &[String]) -> Result<Vec<InputFile>, InputError> {
    todo!()
}

/// Extracts the text field from one JSONL line.
pub fn extract_text<'a>(_line: &'a [u8], _key: &TextKey) -> Result<Cow<'a, str>, DocError> {
    todo!()
}

/// Reads all input files in order, in batches.
pub struct Reader {
    _files: Vec<InputFile>,
}

impl Reader {
    /// A reader over `files`, in the given order.
    pub fn new(files: Vec<InputFile>, _key: TextKey) -> Reader {
        Reader { _files: files }
    }

    /// The next batch: documents up to `max_bytes` of payload or `max_docs` documents.
    pub fn next_batch(
        &mut self,
        _max_bytes: usize,
        _max_docs: usize,
    ) -> Result<Option<Vec<RawDoc>>, InputError> {
        todo!()
    }

    /// A counter of on-disk input bytes consumed so far.
    pub fn progress(&self) -> Arc<AtomicU64> {
        todo!()
    }
}
