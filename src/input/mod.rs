//! Readers of raw corpora: JSONL (plain, `.gz`, `.zst`), Parquet, and the
//! Arrow IPC (`.arrow`) files of a Hugging Face `datasets` cache.
//!
//! Inputs are expanded from files, directories and globs into one sorted list
//! ([`expand`]); a [`Reader`] walks that list in order and hands out batches of
//! [`RawDoc`]s. JSONL lines are handed out unparsed, so that JSON parsing runs
//! on the worker threads with tokenization ([`extract_text`]); Parquet text
//! arrives already decoded from its column.
//!
//! Where the text is found is named by a [`TextKey`], the same way for both
//! formats: at each level the whole remaining dotted name is tried as one
//! field name first (so a column literally called `meta.text` is found), and
//! only if there is no such field is the first part split off and followed
//! into a nested object (JSON) or struct column (Parquet).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub mod arrow_ipc;
pub mod jsonl;
pub mod parquet;
mod remote_parquet;
pub mod share;

pub use share::{share, Share, Slice};

/// The extensions [`expand`] accepts, for error messages.
const ACCEPTED_EXTENSIONS: &str =
    ".jsonl, .json, .ndjson (each optionally followed by .gz or .zst), .parquet, .pq, .arrow";

/// The metadata files a Hugging Face `datasets` folder keeps beside its
/// `.arrow` files: JSON, but not documents, so a directory walk that finds
/// `.arrow` files beside them leaves them out.
const DATASETS_METADATA: &[&str] = &["dataset_info.json", "state.json", "dataset_dict.json"];

/// A fatal problem with an input file: the job stops.
///
/// Every variant that concerns a file names it; those raised while reading
/// also say where in the file reading stopped.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A pattern given to `--input` matched no file.
    #[error("--input {pattern:?} matched no file")]
    NoMatch {
        /// The pattern as given.
        pattern: String,
    },
    /// A directory given to `--input` holds files, but none prep can read.
    #[error(
        "--input {pattern:?} matched no file prep can read; it holds {}; accepted are {ACCEPTED_EXTENSIONS}",
        skipped_list(skipped)
    )]
    NoReadableFile {
        /// The pattern as given.
        pattern: String,
        /// The files skipped for their extension (hidden ones aside), sorted.
        skipped: Vec<PathBuf>,
    },
    /// A glob pattern is not valid glob syntax.
    #[error("--input {pattern:?} is not a valid glob pattern: {cause}")]
    BadPattern {
        /// The pattern as given.
        pattern: String,
        /// What is wrong with it.
        cause: glob::PatternError,
    },
    /// A file or directory named on the command line does not exist.
    #[error("{}: No such file or directory", path.display())]
    NotFound {
        /// The path as given.
        path: PathBuf,
    },
    /// An input was written to while the run read it: the dataset would
    /// join records of two versions of it.
    #[error(
        "{}: the file changed while it was read ({before} when the run began, now {now}); \
         nothing was committed: run again once it no longer changes (--overwrite to start over)",
        path.display()
    )]
    Changed {
        /// The input.
        path: PathBuf,
        /// Its version when the run began ([`InputFile::version`]).
        before: String,
        /// Its version now.
        now: String,
    },
    /// A path exists but its metadata or directory listing could not be read
    /// (for example, permission denied).
    #[error("{}: cannot read: {cause}", path.display())]
    Stat {
        /// The path that could not be examined.
        path: PathBuf,
        /// The underlying error.
        cause: std::io::Error,
    },
    /// A directory is a `datasets` DatasetDict folder (`save_to_disk` of
    /// several splits): reading it whole would mix the splits.
    #[error("{}: a Hugging Face datasets folder of the splits {}: name the split to read (--input {})", dir.display(), splits.join(", "), dir.join(splits.first().map_or("SPLIT", |s| s.as_str())).display())]
    DatasetDict {
        /// The folder.
        dir: PathBuf,
        /// Its splits, as its `dataset_dict.json` lists them.
        splits: Vec<String>,
    },
    /// A folder's `.arrow` files are several versions or splits of a
    /// `datasets` dataset (a cache folder where `.map` wrote `cache-*.arrow`
    /// beside the original, or one split file per split): reading them
    /// together would read the same documents twice, or mix splits.
    #[error("{}: the .arrow files here are {} versions or splits of a Hugging Face dataset: {}; name the one to read (--input FILE, or a glob of one version's files)", dir.display(), versions.len(), versions.join("; "))]
    DatasetVersions {
        /// The folder.
        dir: PathBuf,
        /// Each version: its name and its files.
        versions: Vec<String>,
    },
    /// A `datasets` folder's `state.json` cannot be read, or names a data
    /// file the folder lacks.
    #[error("{}: {what}", path.display())]
    DatasetState {
        /// The `state.json` (or the file it names).
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A file named explicitly (or matched by a glob) has an extension that
    /// says neither JSONL nor Parquet.
    #[error("{}: unknown file extension; accepted are {ACCEPTED_EXTENSIONS}", path.display())]
    UnknownExtension {
        /// The file.
        path: PathBuf,
    },
    /// An input file could not be opened (or its decompressor set up).
    #[error("{}: cannot open: {cause}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        cause: std::io::Error,
    },
    /// A `.json` file that is one JSON array is not a well-formed one (an
    /// element without a `,` between, no closing `]`, more after it).
    #[error("{}: line {line}: {what}", path.display())]
    JsonArray {
        /// The file.
        path: PathBuf,
        /// 1-based line where reading stopped.
        line: u64,
        /// What is wrong.
        what: String,
    },
    /// Reading or decompressing a JSONL file failed part way (a truncated
    /// `.gz`, a corrupt `.zst`, a disk error).
    #[error("{}: reading failed at line {line}: {cause}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// 1-based number of the line being read when the error occurred;
        /// every line before it was read completely and handed out. Reading
        /// runs ahead by up to a buffer (1 MiB decompressed), so the damage
        /// itself lies at or after this line.
        line: u64,
        /// The underlying error.
        cause: std::io::Error,
    },
    /// A `.parquet` file is not a readable Parquet file (bad magic, corrupt
    /// footer or metadata).
    #[error("{}: not a readable Parquet file: {cause}", path.display())]
    ParquetOpen {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        cause: ::parquet::errors::ParquetError,
    },
    /// A `.arrow` file is neither an Arrow IPC stream nor an Arrow IPC file.
    #[error("{}: not a readable Arrow IPC stream or file: {cause}", path.display())]
    ArrowOpen {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        cause: arrow::error::ArrowError,
    },
    /// Decoding a record batch of a `.arrow` file failed part way.
    #[error("{}: reading record batch {batch} (from row {row}) failed: {cause}", path.display())]
    ArrowRead {
        /// The file.
        path: PathBuf,
        /// 0-based record batch being decoded when the error occurred.
        batch: usize,
        /// 0-based row of the file that batch would have started at.
        row: u64,
        /// The underlying error.
        cause: arrow::error::ArrowError,
    },
    /// An object in storage could not be listed, found or read (the
    /// message names its URL and the request that failed).
    /// (Boxed: the store's errors are large and rare.)
    #[error(transparent)]
    Store(Box<crate::store::StoreError>),
    /// Decoding the data of a Parquet file failed part way.
    #[error("{}: reading row group {row_group} failed: {cause}", path.display())]
    ParquetRead {
        /// The file.
        path: PathBuf,
        /// 0-based row group being decoded when the error occurred.
        row_group: usize,
        /// The underlying error.
        cause: arrow::error::ArrowError,
    },
    /// The text column (or a struct field on its path) is not in the file.
    #[error(
        "{}: no column {column:?}; available columns: {}",
        path.display(),
        list_names(available)
    )]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The dotted name that was looked for.
        column: String,
        /// The fields at the level where the lookup failed, dotted from the
        /// top, in schema order.
        available: Vec<String>,
    },
    /// The text column exists but does not hold strings.
    #[error(
        "{}: column {column:?} has type {found}; expected a string column (Utf8, LargeUtf8 or Utf8View, or a dictionary of one)",
        path.display()
    )]
    ColumnType {
        /// The file.
        path: PathBuf,
        /// The dotted name of the column.
        column: String,
        /// The Arrow type found, as Arrow prints it.
        found: String,
    },
    /// A column on the way to a nested text field is not a struct.
    #[error(
        "{}: column {column:?} has type {found}, not a struct, so {key:?} cannot be reached",
        path.display()
    )]
    NotAStruct {
        /// The file.
        path: PathBuf,
        /// The dotted name of the column that should have been a struct.
        column: String,
        /// The whole text key.
        key: String,
        /// The Arrow type found, as Arrow prints it.
        found: String,
    },
}

impl From<crate::store::StoreError> for InputError {
    fn from(e: crate::store::StoreError) -> InputError {
        InputError::Store(Box::new(e))
    }
}

/// The fields of a line for an error message: the first ones quoted, then
/// how many more.
fn field_list(fields: &[String]) -> String {
    const SHOWN: usize = 20;
    if fields.is_empty() {
        return "no fields".to_owned();
    }
    let mut list = fields
        .iter()
        .take(SHOWN)
        .map(|f| format!("{f:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    if fields.len() > SHOWN {
        list += &format!(" and {} more", fields.len() - SHOWN);
    }
    format!("fields {list}")
}

/// The files a directory walk skipped, for an error message: the first few,
/// then how many more.
fn skipped_list(skipped: &[PathBuf]) -> String {
    const SHOWN: usize = 10;
    let mut list = skipped
        .iter()
        .take(SHOWN)
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if skipped.len() > SHOWN {
        list += &format!(" and {} more", skipped.len() - SHOWN);
    }
    format!("{} file(s) of other types: {list}", skipped.len())
}

/// Joins column names for an error message, saying so when there are none.
fn list_names(names: &[String]) -> String {
    if names.is_empty() {
        "(none)".to_owned()
    } else {
        names.join(", ")
    }
}

/// A problem with one document. Fatal unless the user asked to skip bad documents.
///
/// The messages do not name the file or line: the caller pairs them with the
/// [`RawDoc`]'s file and [`Location`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocError {
    /// The line is not valid UTF-8.
    #[error("invalid UTF-8 at byte {offset} of the document")]
    InvalidUtf8 {
        /// Byte offset of the first invalid byte within the line.
        offset: usize,
    },
    /// The line is not valid JSON.
    #[error("malformed JSON: {message} at column {column}")]
    Malformed {
        /// What the JSON parser expected or found.
        message: String,
        /// 1-based byte column in the line where the parser stopped.
        column: usize,
    },
    /// The line is valid JSON but not an object.
    #[error("not a JSON object (found {found})")]
    NotAnObject {
        /// What was found instead, e.g. `an array`.
        found: &'static str,
    },
    /// An object on the way to a nested key is not an object.
    #[error("field {field:?} is {found}, not an object, cannot reach {key:?}")]
    NotAnObjectField {
        /// The dotted path of the field that should have been an object.
        field: String,
        /// The whole text key.
        key: String,
        /// What was found instead, e.g. `a number`.
        found: &'static str,
    },
    /// The text field is absent.
    #[error("no field {key:?}; the document has {}", field_list(fields))]
    MissingField {
        /// The whole text key.
        key: String,
        /// The fields of the object where the lookup failed, dotted from
        /// the top, in the line's order: what `--text-key` could have been.
        fields: Vec<String>,
    },
    /// The text field is present but null (a JSON `null`, or a null in a
    /// Parquet column).
    #[error("field {key:?} is null")]
    Null {
        /// The whole text key.
        key: String,
    },
    /// The text field holds something other than a string.
    #[error("field {key:?} is {found}, expected a string")]
    NotAString {
        /// The whole text key.
        key: String,
        /// What was found instead, e.g. `a number`.
        found: &'static str,
    },
    /// The text contains a `\uXXXX` escape of an unpaired UTF-16 surrogate,
    /// which no UTF-8 string can hold.
    #[error(
        "text has an unpaired UTF-16 surrogate escape (such as \\ud800) near column {column}; \
         it cannot be represented in UTF-8"
    )]
    LoneSurrogate {
        /// 1-based byte column in the line near which the escape ends.
        column: usize,
    },
}

/// The `--text-key` path: `text`, or `a.b` for a nested field.
///
/// See the [module docs](self) for how a dotted key is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextKey {
    dotted: String,
    parts: Vec<String>,
    /// Whole rows are read, not a text field (see [`TextKey::whole_row`]).
    whole: bool,
}

impl TextKey {
    /// Parses a dotted path. Every string is a valid key (an empty one names
    /// the field `""`).
    pub fn parse(key: &str) -> TextKey {
        TextKey {
            dotted: key.to_owned(),
            parts: key.split('.').map(str::to_owned).collect(),
            whole: false,
        }
    }

    /// Not a field but the whole row, for readers of rows (chat mode): a
    /// JSONL line as it is, a Parquet or Arrow row as the JSON object of
    /// its columns (nulls left out), as arrow's JSON writer writes it.
    pub fn whole_row() -> TextKey {
        TextKey {
            dotted: "(whole row)".into(),
            parts: Vec::new(),
            whole: true,
        }
    }

    /// Whether whole rows are read (see [`TextKey::whole_row`]).
    pub fn is_whole_row(&self) -> bool {
        self.whole
    }

    /// The key as given, in dotted form.
    pub fn as_str(&self) -> &str {
        &self.dotted
    }

    /// The parts between the dots, in order; never empty.
    pub fn parts(&self) -> &[String] {
        &self.parts
    }
}

impl fmt::Display for TextKey {
    /// Writes the dotted form, as given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.dotted)
    }
}

/// Where a document sits in its file, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// 1-based line number in a JSONL file.
    Line(u64),
    /// In a slice of a plain JSONL file read by one part (`--part`): the
    /// `line`-th line (1-based) counted from the line that starts at byte
    /// `start`. [`resolve_location`] turns it into a [`Location::Line`].
    LineFrom {
        /// Byte offset of the first line the part read.
        start: u64,
        /// 1-based line number counted from there.
        line: u64,
    },
    /// Element `index` (0-based) of a file that is one JSON array,
    /// starting on line `line` (1-based).
    Element {
        /// The line the element starts on.
        line: u64,
        /// Its place in the array.
        index: u64,
    },
    /// 0-based row in an Arrow IPC file.
    FileRow(u64),
    /// 0-based row group and 0-based row within it, in a Parquet file.
    Row {
        /// Row group index.
        row_group: usize,
        /// Row index within the row group.
        row: u64,
    },
}

impl fmt::Display for Location {
    /// Writes `line 17` or `row group 2, row 5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Line(line) => write!(f, "line {line}"),
            Location::LineFrom { start, line } => {
                write!(f, "line {line} counted from byte {start}")
            }
            Location::Element { line, index } => {
                write!(f, "line {line} (element {index} of its JSON array)")
            }
            Location::FileRow(row) => write!(f, "row {row}"),
            Location::Row { row_group, row } => write!(f, "row group {row_group}, row {row}"),
        }
    }
}

impl Location {
    /// The line number of a [`Location::Line`], else `fallback`.
    fn line_or(self, fallback: u64) -> u64 {
        match self {
            Location::Line(line) => line,
            _ => fallback,
        }
    }
}

/// `loc` with a line counted from a slice's start ([`Location::LineFrom`])
/// turned into the line's number in the whole file, by counting the lines
/// before the slice. Reads the file up to there: for error messages only.
/// Other locations, and any that cannot be resolved, come back unchanged.
pub fn resolve_location(path: &Path, loc: Location) -> Location {
    match loc {
        Location::LineFrom { start, line } => {
            share::line_number_at(path, start).map_or(loc, |first| Location::Line(first + line - 1))
        }
        other => other,
    }
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

impl Payload {
    /// Bytes this payload holds, the measure of a batch's size.
    fn len(&self) -> usize {
        match self {
            Payload::Json(line) => line.len(),
            Payload::Text(text) => text.len(),
            Payload::Bad(_) => 0,
        }
    }
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
    /// Arrow IPC, stream or file (`.arrow`, as a `datasets` cache writes it).
    Arrow,
}

impl InputKind {
    /// The kind a file name says, case-insensitively, or `None` when its
    /// extension is not one [`expand`] accepts.
    pub fn from_path(path: &Path) -> Option<InputKind> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let (stem, compression) = if let Some(stem) = name.strip_suffix(".gz") {
            (stem, Compression::Gzip)
        } else if let Some(stem) = name.strip_suffix(".zst") {
            (stem, Compression::Zstd)
        } else {
            (name.as_str(), Compression::None)
        };
        let is_json = [".jsonl", ".json", ".ndjson"]
            .iter()
            .any(|ext| stem.ends_with(ext));
        if is_json {
            return Some(InputKind::Jsonl(compression));
        }
        if stem.ends_with(".arrow") && compression == Compression::None {
            return Some(InputKind::Arrow);
        }
        let is_parquet = [".parquet", ".pq"].iter().any(|ext| stem.ends_with(ext));
        (is_parquet && compression == Compression::None).then_some(InputKind::Parquet)
    }
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
    /// Which version of the file this is, beside its size ([`version_of`]
    /// for a local file, [`crate::store::Listed::version`] for an object):
    /// what makes an input edited in place to the same size another input.
    pub version: Option<String>,
}

impl InputFile {
    /// Refuses the file if it is no longer the version it was when listed
    /// ([`InputFile::version`]: its size, modification time, or an object's
    /// version id or ETag differ): checked before a run commits, so that no
    /// dataset joins records read from two versions of an input.
    ///
    /// # Errors
    /// [`InputError::Changed`], or the failure to look at it again.
    pub fn still_the_same(&self) -> Result<(), InputError> {
        let (bytes, version) = match self.path.to_str().filter(|p| crate::store::is_url(p)) {
            Some(url) => match crate::store::Object::at(url)?.head()? {
                Some(head) => (head.bytes, head.tag.identity()),
                None => (0, None),
            },
            None => {
                let meta =
                    std::fs::metadata(&self.path).map_err(|cause| stat_error(&self.path, cause))?;
                (meta.len(), version_of(&meta))
            }
        };
        let shown = |bytes: u64, v: &Option<String>| {
            format!("{bytes} bytes, {}", v.as_deref().unwrap_or("no version"))
        };
        if bytes == self.bytes && version == self.version {
            return Ok(());
        }
        Err(InputError::Changed {
            path: self.path.clone(),
            before: shown(self.bytes, &self.version),
            now: shown(bytes, &version),
        })
    }
}

/// The version of a local file that an input's identity takes beside its
/// size: its modification time in nanoseconds since the Unix epoch,
/// `mtime:N`, as rsync and make tell a changed file (`None` where the file
/// system keeps none).
///
/// Not its inode or device: a file read through another mount point (a
/// task of a partitioned run on another machine) is the same input.
pub fn version_of(meta: &std::fs::Metadata) -> Option<String> {
    let modified = meta.modified().ok()?;
    let nanos = match modified.duration_since(std::time::UNIX_EPOCH) {
        Ok(after) => after.as_nanos() as i128,
        Err(before) => -(before.duration().as_nanos() as i128),
    };
    Some(format!("mtime:{nanos}"))
}

/// Expands `--input` values into a sorted, de-duplicated list of files.
///
/// Each pattern is one of:
/// - a glob (it contains `*`, `?` or `[` and is not itself an existing path):
///   every match is taken as if it had been named by itself, so quoting a
///   glob or letting the shell expand it gives the same list. As in a shell,
///   wildcards do not match a leading dot.
/// - a directory: searched recursively for files with a known extension;
///   hidden files and directories (name starting with `.`) and files with
///   other extensions are skipped, and so are the JSON metadata files of a
///   `datasets` folder (`dataset_info.json`, `state.json`,
///   `dataset_dict.json`) that sit beside `.arrow` files. Symbolic links are
///   followed, each directory visited once.
/// - a file: it must have a known extension (see [`InputKind::from_path`]).
///
/// The result is sorted byte-wise by path (after dropping `.` components
/// and doubled separators), without duplicates, so it never depends on the
/// order of the patterns or of a directory listing. No patterns give an
/// empty list.
///
/// # Errors
/// [`InputError::NoMatch`] when a glob or directory yields no file
/// ([`InputError::NoReadableFile`], naming them, when a directory holds
/// files but none of a known type),
/// [`InputError::NotFound`] for a missing path, [`InputError::UnknownExtension`]
/// for a named file of another type, [`InputError::BadPattern`] and
/// [`InputError::Stat`] for unreadable patterns and paths.
pub fn expand(patterns: &[String]) -> Result<Vec<InputFile>, InputError> {
    let mut files = Vec::new();
    let mut visited_dirs = HashSet::new();
    for pattern in patterns {
        let before = files.len();
        let mut skipped = Vec::new();
        if crate::store::is_url(pattern) {
            add_remote(pattern, &mut files)?;
            if files.len() == before {
                return Err(InputError::NoMatch {
                    pattern: pattern.clone(),
                });
            }
            continue;
        }
        // A shell that expanded `data/*` may hand us `data/a[1].jsonl`: an
        // existing path is taken literally, never re-read as a glob.
        let is_glob = pattern.contains(['*', '?', '[']) && !Path::new(pattern).exists();
        if is_glob {
            let options = glob::MatchOptions {
                case_sensitive: true,
                require_literal_separator: true,
                require_literal_leading_dot: true,
            };
            let matches =
                glob::glob_with(pattern, options).map_err(|source| InputError::BadPattern {
                    pattern: pattern.clone(),
                    cause: source,
                })?;
            for entry in matches {
                let path = entry.map_err(|e| InputError::Stat {
                    path: e.path().to_owned(),
                    cause: e.into(),
                })?;
                add_named(&path, &mut files, &mut visited_dirs, &mut skipped)?;
            }
        } else {
            add_named(
                Path::new(pattern),
                &mut files,
                &mut visited_dirs,
                &mut skipped,
            )?;
        }
        if files.len() == before {
            if !skipped.is_empty() {
                skipped.sort();
                return Err(InputError::NoReadableFile {
                    pattern: pattern.clone(),
                    skipped,
                });
            }
            return Err(InputError::NoMatch {
                pattern: pattern.clone(),
            });
        }
    }
    files.sort_by(|a, b| {
        a.path
            .as_os_str()
            .as_encoded_bytes()
            .cmp(b.path.as_os_str().as_encoded_bytes())
    });
    files.dedup_by(|a, b| a.path == b.path);
    Ok(files)
}

/// Adds the objects an object-storage pattern names (see [`crate::store::list`]):
/// a glob's matches and a named object must have a known extension; a
/// "folder" contributes the objects under it that have one, with the rules
/// of a `datasets` folder applied to each folder below it as on disk
/// ([`datasets_folder`]). The URL is kept whole as the file's path.
fn add_remote(pattern: &str, files: &mut Vec<InputFile>) -> Result<(), InputError> {
    let listed = crate::store::list(pattern, |name| {
        InputKind::from_path(Path::new(name)).is_some()
    })?;
    let named =
        pattern.contains(['*', '?', '[']) || matches!(&listed[..], [one] if one.url == pattern);
    let mut found = Vec::new();
    for object in listed {
        let path = PathBuf::from(object.url);
        let kind = InputKind::from_path(&path)
            .ok_or_else(|| InputError::UnknownExtension { path: path.clone() })?;
        found.push(InputFile {
            path,
            kind,
            bytes: object.bytes,
            version: object.version,
        });
    }
    if named {
        files.extend(found);
        return Ok(());
    }
    let mut folders: BTreeMap<PathBuf, Vec<InputFile>> = BTreeMap::new();
    for f in found {
        let dir = f.path.parent().unwrap_or(Path::new("")).to_path_buf();
        folders.entry(dir).or_default().push(f);
    }
    for (dir, mut here) in folders {
        datasets_folder(&dir, &mut here)?;
        files.extend(here);
    }
    Ok(())
}

/// The object behind an input whose path is a URL, with its size; `None`
/// for a local path.
pub(crate) fn remote(path: &Path) -> Result<Option<(crate::store::Object, u64)>, InputError> {
    let Some(url) = path.to_str().filter(|p| crate::store::is_url(p)) else {
        return Ok(None);
    };
    let object = crate::store::Object::at(url)?;
    let size = object.size()?;
    Ok(Some((object, size)))
}

/// Adds a path given by the user (or matched by a glob): a directory is walked,
/// a file must have a known extension.
fn add_named(
    path: &Path,
    files: &mut Vec<InputFile>,
    visited_dirs: &mut HashSet<PathBuf>,
    skipped: &mut Vec<PathBuf>,
) -> Result<(), InputError> {
    let meta = std::fs::metadata(path).map_err(|source| stat_error(path, source))?;
    if meta.is_dir() {
        return walk_dir(path, files, visited_dirs, skipped);
    }
    let kind = InputKind::from_path(path).ok_or_else(|| InputError::UnknownExtension {
        path: path.to_owned(),
    })?;
    files.push(InputFile {
        path: normalize(path),
        kind,
        bytes: meta.len(),
        version: version_of(&meta),
    });
    Ok(())
}

/// Recursively collects the files with known extensions under `dir`, and
/// the (not hidden) files of other types into `skipped`.
fn walk_dir(
    dir: &Path,
    files: &mut Vec<InputFile>,
    visited_dirs: &mut HashSet<PathBuf>,
    skipped: &mut Vec<PathBuf>,
) -> Result<(), InputError> {
    // A symlink back up the tree would otherwise recurse forever.
    let canonical = std::fs::canonicalize(dir).map_err(|source| stat_error(dir, source))?;
    if !visited_dirs.insert(canonical) {
        return Ok(());
    }
    let entries = std::fs::read_dir(dir).map_err(|source| stat_error(dir, source))?;
    // This directory's own files: its datasets metadata goes once all are known.
    let mut here = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| stat_error(dir, source))?;
        if entry.file_name().as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let path = entry.path();
        // `fs::metadata` follows symlinks, unlike `DirEntry::metadata`.
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            // A dangling symlink inside a directory is not an input; skip it as
            // we skip any other file we were not asked for by name.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(stat_error(&path, source)),
        };
        if meta.is_dir() {
            walk_dir(&path, files, visited_dirs, skipped)?;
        } else if let Some(kind) = InputKind::from_path(&path) {
            here.push(InputFile {
                path: normalize(&path),
                kind,
                bytes: meta.len(),
                version: version_of(&meta),
            });
        } else {
            skipped.push(normalize(&path));
        }
    }
    datasets_folder(dir, &mut here)?;
    files.extend(here);
    Ok(())
}

/// The file name of an input, or "" when it is not UTF-8.
fn file_name(f: &InputFile) -> &str {
    f.path.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// Applies the rules of a Hugging Face `datasets` folder to the files
/// found directly in `dir`:
/// - a DatasetDict folder (`dataset_dict.json`) is refused, naming its
///   splits: each split is a folder of its own, and reading them together
///   would mix train and test;
/// - a `save_to_disk` folder (`state.json`) gives exactly the `.arrow`
///   files its state lists, which must come in name order (the order
///   `datasets` writes them and prep reads inputs in);
/// - otherwise `.arrow` files of more than one version or split (a cache
///   folder: `json-train.arrow`, `json-test.arrow`, the `cache-*.arrow`
///   each `.map` writes) are refused, naming each version's files;
/// - the folder's JSON metadata is never read as documents.
///
/// `dir` is a local directory or a folder in object storage (its URL);
/// `here` holds its files with a known extension (the JSON metadata
/// among them).
fn datasets_folder(dir: &Path, here: &mut Vec<InputFile>) -> Result<(), InputError> {
    let has = |name: &str| here.iter().any(|f| file_name(f) == name);
    let has_state = has("state.json");
    let shown = || match dir.to_str().filter(|d| crate::store::is_url(d)) {
        Some(_) => dir.to_path_buf(),
        None => normalize(dir),
    };
    if has("dataset_dict.json") {
        let path = dir.join("dataset_dict.json");
        let splits = read_json(&path)?
            .get("splits")
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect::<Vec<_>>()
            })
            .filter(|s| !s.is_empty())
            .ok_or_else(|| InputError::DatasetState {
                path: path.clone(),
                what: "no \"splits\" list".into(),
            })?;
        return Err(InputError::DatasetDict {
            dir: shown(),
            splits,
        });
    }
    if !here.iter().any(|f| f.kind == InputKind::Arrow) {
        return Ok(());
    }
    here.retain(|f| !DATASETS_METADATA.contains(&file_name(f)));
    if has_state {
        return state_files(dir, here);
    }
    let mut versions: Vec<(String, Vec<String>)> = Vec::new();
    for f in here.iter().filter(|f| f.kind == InputKind::Arrow) {
        let name = file_name(f).to_string();
        let key = arrow_version(&name);
        match versions.iter_mut().find(|(k, _)| *k == key) {
            Some((_, names)) => names.push(name),
            None => versions.push((key, vec![name])),
        }
    }
    if versions.len() > 1 {
        versions.sort();
        return Err(InputError::DatasetVersions {
            dir: shown(),
            versions: versions
                .into_iter()
                .map(|(key, mut names)| {
                    names.sort();
                    format!("{key} ({})", names.join(", "))
                })
                .collect(),
        });
    }
    Ok(())
}

/// Keeps, of the `.arrow` files in a `save_to_disk` folder, exactly those
/// its `state.json` lists.
fn state_files(dir: &Path, here: &mut Vec<InputFile>) -> Result<(), InputError> {
    let path = dir.join("state.json");
    let listed: Vec<String> = read_json(&path)?
        .get("_data_files")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|f| f.get("filename").and_then(|n| n.as_str()).map(String::from))
                .collect()
        })
        .filter(|l: &Vec<String>| !l.is_empty())
        .ok_or_else(|| InputError::DatasetState {
            path: path.clone(),
            what: "no \"_data_files\" list of file names".into(),
        })?;
    if listed
        .windows(2)
        .any(|w| w[0].as_bytes() >= w[1].as_bytes())
    {
        return Err(InputError::DatasetState {
            path,
            what: format!(
                "lists its data files out of name order ({}); prep reads inputs in name order",
                listed.join(", ")
            ),
        });
    }
    if let Some(missing) = listed
        .iter()
        .find(|n| !here.iter().any(|f| file_name(f) == n.as_str()))
    {
        return Err(InputError::DatasetState {
            path: dir.join(missing),
            what: format!("listed in {} but not here", path.display()),
        });
    }
    here.retain(|f| f.kind != InputKind::Arrow || listed.iter().any(|n| n == file_name(f)));
    Ok(())
}

/// The version or split an `.arrow` file of a `datasets` folder belongs
/// to: its name without the shard suffix that `datasets` adds
/// (`-00000-of-00004`, `_00000_of_00004`) and without `.arrow`.
fn arrow_version(name: &str) -> String {
    let stem = name.strip_suffix(".arrow").unwrap_or(name);
    let bytes = stem.as_bytes();
    // "-NNNNN-of-NNNNN" or "_NNNNN_of_NNNNN": 15 bytes.
    if bytes.len() > 15 {
        let (head, tail) = stem.split_at(stem.len() - 15);
        let t = tail.as_bytes();
        let sep = t[0];
        let digits = |r: std::ops::Range<usize>| t[r].iter().all(u8::is_ascii_digit);
        if (sep == b'-' || sep == b'_')
            && digits(1..6)
            && t[6] == sep
            && &t[7..9] == b"of"
            && t[9] == sep
            && digits(10..15)
        {
            return head.to_string();
        }
    }
    stem.to_string()
}

/// A small JSON metadata file of a `datasets` folder, on disk or in
/// object storage.
fn read_json(path: &Path) -> Result<serde_json::Value, InputError> {
    let text = match path.to_str().filter(|p| crate::store::is_url(p)) {
        Some(url) => crate::store::Object::at(url)?.get_all()?.to_vec(),
        None => std::fs::read(path).map_err(|source| stat_error(path, source))?,
    };
    serde_json::from_slice(&text).map_err(|e| InputError::DatasetState {
        path: path.to_owned(),
        what: format!("not valid JSON: {e}"),
    })
}

fn stat_error(path: &Path, source: std::io::Error) -> InputError {
    if source.kind() == std::io::ErrorKind::NotFound {
        InputError::NotFound {
            path: path.to_owned(),
        }
    } else {
        InputError::Stat {
            path: path.to_owned(),
            cause: source,
        }
    }
}

/// Drops `.` components and doubled separators, so that `data//a.jsonl`,
/// `data/./a.jsonl` and `data/a.jsonl` sort and de-duplicate as one file.
fn normalize(path: &Path) -> PathBuf {
    path.components().collect()
}

/// Extracts the text field from one JSONL line.
///
/// The line is checked to be UTF-8, then parsed without building a tree:
/// fields other than the key are skipped, and the text is borrowed from the
/// line when it holds no escapes. When a key occurs twice in one object the
/// last occurrence wins, as in Python's `json.loads`. Escapes decode exactly
/// as `json.loads` decodes them, except that an unpaired surrogate escape is
/// refused ([`DocError::LoneSurrogate`]) since the result must be UTF-8.
/// Like `json.loads`, bare `NaN`, `Infinity` and `-Infinity` values are
/// accepted (lines holding them take a slower path and are not borrowed).
/// Whitespace (including a `\r`) around the object is allowed.
///
/// # Errors
/// One [`DocError`] per way the line can fail; never panics.
pub fn extract_text<'a>(line: &'a [u8], key: &TextKey) -> Result<Cow<'a, str>, DocError> {
    jsonl::extract_text(line, key)
}

/// Reads all input files in order, in batches.
///
/// Memory stays bounded by the batch being built: JSONL is streamed line by
/// line (a single line may be of any length) and Parquet is decoded about a
/// thousand rows at a time, reading only the text column.
pub struct Reader {
    files: Vec<InputFile>,
    /// What to read of each file.
    slices: Vec<Slice>,
    key: TextKey,
    /// Index of the next file to open.
    next_file: usize,
    /// The file being read and its index.
    current: Option<(u32, Source)>,
    /// An error met while a batch already held documents: it is returned by
    /// the next call, so that no document before it is lost.
    pending: Option<InputError>,
    /// Sum of the sizes of the files left behind.
    done_bytes: u64,
    progress: Arc<AtomicU64>,
}

/// An open input file.
enum Source {
    Jsonl(jsonl::JsonlSource),
    Parquet(parquet::ParquetSource),
    Arrow(arrow_ipc::ArrowSource),
}

impl Reader {
    /// A reader over `files`, in the given order. Nothing is opened until the
    /// first [`Reader::next_batch`].
    pub fn new(files: Vec<InputFile>, key: TextKey) -> Reader {
        let shares = files
            .into_iter()
            .map(|file| Share {
                file,
                slice: Slice::Whole,
            })
            .collect();
        Reader::from_shares(shares, key)
    }

    /// A reader over a part's share of the inputs (see [`share()`]): each
    /// file's slice, in the given order.
    pub fn from_shares(shares: Vec<Share>, key: TextKey) -> Reader {
        let (files, slices) = shares.into_iter().map(|s| (s.file, s.slice)).unzip();
        Reader {
            files,
            slices,
            key,
            next_file: 0,
            current: None,
            pending: None,
            done_bytes: 0,
            progress: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The next batch: documents up to `max_bytes` of payload or `max_docs` documents.
    ///
    /// Documents are added until the batch holds at least `max_bytes` bytes of
    /// payload or `max_docs` documents (so a batch may end one document past
    /// `max_bytes`, and always holds at least one document). A batch may span
    /// files. Returns `Ok(None)` once every file has been read.
    ///
    /// # Errors
    /// An [`InputError`] for a file that cannot be opened or read. Documents
    /// read before the failure are returned first, in the batch that ends at
    /// it; the error comes with the next call. The failed file is then
    /// abandoned, and a further call goes on with the next file.
    pub fn next_batch(
        &mut self,
        max_bytes: usize,
        max_docs: usize,
    ) -> Result<Option<Vec<RawDoc>>, InputError> {
        if let Some(err) = self.pending.take() {
            return Err(err);
        }
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        loop {
            let doc = match self.next_doc() {
                Ok(Some(doc)) => doc,
                Ok(None) => break,
                Err(err) if batch.is_empty() => return Err(err),
                Err(err) => {
                    self.pending = Some(err);
                    break;
                }
            };
            bytes = bytes.saturating_add(doc.payload.len());
            batch.push(doc);
            if bytes >= max_bytes || batch.len() >= max_docs {
                break;
            }
        }
        Ok((!batch.is_empty()).then_some(batch))
    }

    /// The next document of the current file, opening files as needed.
    fn next_doc(&mut self) -> Result<Option<RawDoc>, InputError> {
        loop {
            if self.current.is_none() {
                let Some(file) = self.files.get(self.next_file) else {
                    return Ok(None);
                };
                // More than 4 billion input files cannot be indexed by RawDoc::file.
                let index = u32::try_from(self.next_file).unwrap_or(u32::MAX);
                self.next_file += 1;
                let slice = &self.slices[self.next_file - 1];
                let source = match file.kind {
                    InputKind::Jsonl(compression) => jsonl::JsonlSource::open(
                        &file.path,
                        compression,
                        match slice {
                            Slice::Bytes(range) => Some(range.clone()),
                            _ => None,
                        },
                        Arc::clone(&self.progress),
                    )
                    .map(Source::Jsonl),
                    InputKind::Parquet => parquet::ParquetSource::open(
                        &file.path,
                        &self.key,
                        match slice {
                            Slice::RowGroups(range) => Some(range.clone()),
                            _ => None,
                        },
                        Arc::clone(&self.progress),
                    )
                    .map(Source::Parquet),
                    InputKind::Arrow => {
                        arrow_ipc::ArrowSource::open(&file.path, &self.key).map(Source::Arrow)
                    }
                };
                match source {
                    Ok(source) => self.current = Some((index, source)),
                    Err(err) => {
                        self.leave_file();
                        return Err(err);
                    }
                }
            }
            let Some((index, source)) = self.current.as_mut() else {
                continue;
            };
            let next = match source {
                Source::Jsonl(source) => source.next_doc(),
                Source::Parquet(source) => source.next_doc(),
                Source::Arrow(source) => source.next_doc(),
            };
            match next {
                Ok(Some((loc, payload))) => {
                    return Ok(Some(RawDoc {
                        file: *index,
                        loc,
                        payload,
                    }))
                }
                Ok(None) => self.leave_file(),
                Err(err) => {
                    self.leave_file();
                    return Err(err);
                }
            }
        }
    }

    /// Closes the current file (if any) and counts the whole of it as
    /// consumed, whatever the decoder managed to count.
    fn leave_file(&mut self) {
        self.current = None;
        let left = self
            .next_file
            .checked_sub(1)
            .and_then(|i| self.files.get(i));
        if let Some(file) = left {
            self.done_bytes = self.done_bytes.saturating_add(file.bytes);
            // fetch_max keeps the counter monotone even if a file grew while
            // it was read and its reader counted past its listed size.
            self.progress.fetch_max(self.done_bytes, Ordering::Relaxed);
        }
    }

    /// A counter of on-disk input bytes consumed so far.
    ///
    /// It only grows, and reaches the sum of [`InputFile::bytes`] once every
    /// file has been read (more if a file grew meanwhile). JSONL files count
    /// as their compressed bytes are read; Parquet files count row group by
    /// row group. Meant for a progress bar: read it from any thread.
    pub fn progress(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path, content: &[u8]) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    fn names(files: &[InputFile], root: &Path) -> Vec<String> {
        files
            .iter()
            .map(|f| {
                f.path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }

    fn s(path: &Path) -> String {
        path.to_str().unwrap().to_owned()
    }

    #[test]
    fn kinds_by_extension() {
        let kind = |name: &str| InputKind::from_path(Path::new(name));
        assert_eq!(kind("a.jsonl"), Some(InputKind::Jsonl(Compression::None)));
        assert_eq!(
            kind("d/a.json.gz"),
            Some(InputKind::Jsonl(Compression::Gzip))
        );
        assert_eq!(
            kind("a.NDJSON.zst"),
            Some(InputKind::Jsonl(Compression::Zstd))
        );
        assert_eq!(kind("a.parquet"), Some(InputKind::Parquet));
        assert_eq!(kind("a.pq"), Some(InputKind::Parquet));
        assert_eq!(kind("data-00000-of-00001.arrow"), Some(InputKind::Arrow));
        for name in [
            "a.txt",
            "a.gz",
            "a.parquet.gz",
            "jsonl",
            "a.jsonl.bz2",
            "a.jsonlx",
        ] {
            assert_eq!(kind(name), None, "{name}");
        }
    }

    #[test]
    fn arrow_versions_are_names_without_the_shard_suffix() {
        for (name, version) in [
            ("data-00000-of-00003.arrow", "data"),
            ("json-train.arrow", "json-train"),
            ("json-train-00001-of-00002.arrow", "json-train"),
            ("cache-8f1e2d3c4b5a6978.arrow", "cache-8f1e2d3c4b5a6978"),
            (
                "cache-8f1e2d3c4b5a6978_00002_of_00004.arrow",
                "cache-8f1e2d3c4b5a6978",
            ),
            ("x-0000a-of-00001.arrow", "x-0000a-of-00001"),
            ("-00000-of-00001.arrow", "-00000-of-00001"),
        ] {
            assert_eq!(arrow_version(name), version, "{name}");
        }
    }

    #[test]
    fn directories_are_walked_sorted_without_hidden_or_unknown_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for name in [
            "b/z.jsonl",
            "b/a.parquet",
            "a.jsonl.gz",
            "B.jsonl",
            "c/d/e.ndjson.zst",
            "notes.txt",
            ".hidden.jsonl",
            ".git/x.jsonl",
        ] {
            touch(&root.join(name), b"{}\n");
        }
        let files = expand(&[s(root)]).unwrap();
        assert_eq!(
            names(&files, root),
            [
                "B.jsonl",
                "a.jsonl.gz",
                "b/a.parquet",
                "b/z.jsonl",
                "c/d/e.ndjson.zst"
            ]
        );
        assert_eq!(files[0].bytes, 3);
        assert_eq!(files[2].kind, InputKind::Parquet);

        // Order of patterns and duplicates make no difference.
        let again = expand(&[
            s(&root.join("b/z.jsonl")),
            s(&root.join("b")),
            s(root),
            format!("{}/./B.jsonl", s(root)),
        ])
        .unwrap();
        assert_eq!(again, files);
    }

    #[test]
    fn globs_expand_like_a_shell() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for name in [
            "p2.jsonl",
            "p10.jsonl",
            "p1.jsonl",
            ".p3.jsonl",
            "sub/p4.jsonl",
            "other.parquet",
        ] {
            touch(&root.join(name), b"");
        }
        let files = expand(&[format!("{}/p*.jsonl", s(root))]).unwrap();
        assert_eq!(names(&files, root), ["p1.jsonl", "p10.jsonl", "p2.jsonl"]);
        let files = expand(&[format!("{}/*", s(root))]).unwrap();
        assert_eq!(
            names(&files, root),
            [
                "other.parquet",
                "p1.jsonl",
                "p10.jsonl",
                "p2.jsonl",
                "sub/p4.jsonl"
            ]
        );

        touch(&root.join("readme.md"), b"");
        let err = expand(&[format!("{}/*", s(root))]).unwrap_err();
        assert!(
            matches!(err, InputError::UnknownExtension { ref path } if path.ends_with("readme.md"))
        );
    }

    #[test]
    fn an_existing_path_with_glob_characters_is_taken_literally() {
        let dir = tempfile::tempdir().unwrap();
        touch(&dir.path().join("a[1].jsonl"), b"");
        touch(&dir.path().join("a1.jsonl"), b"");
        let files = expand(&[s(&dir.path().join("a[1].jsonl"))]).unwrap();
        assert_eq!(names(&files, dir.path()), ["a[1].jsonl"]);
        let files = expand(&[s(&dir.path().join("a[0-9].jsonl"))]).unwrap();
        assert_eq!(names(&files, dir.path()), ["a1.jsonl"]);
    }

    #[test]
    fn a_glob_matching_nothing_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let pattern = format!("{}/*.jsonl", s(dir.path()));
        let err = expand(std::slice::from_ref(&pattern)).unwrap_err();
        assert!(matches!(err, InputError::NoMatch { pattern: ref p } if *p == pattern));
        assert_eq!(
            err.to_string(),
            format!("--input {pattern:?} matched no file")
        );
        let err = expand(&["[".to_owned()]).unwrap_err();
        assert!(matches!(err, InputError::BadPattern { .. }), "{err:?}");
    }

    #[test]
    fn an_empty_directory_matches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        touch(&dir.path().join(".notes.txt"), b"");
        assert!(matches!(
            expand(&[s(dir.path())]),
            Err(InputError::NoMatch { .. })
        ));
    }

    #[test]
    fn a_directory_of_unreadable_files_names_them() {
        let dir = tempfile::tempdir().unwrap();
        touch(&dir.path().join("b.csv"), b"");
        touch(&dir.path().join("sub/a.txt"), b"");
        touch(&dir.path().join(".hidden"), b"");
        let err = expand(&[s(dir.path())]).unwrap_err();
        let InputError::NoReadableFile { ref skipped, .. } = err else {
            panic!("{err:?}")
        };
        assert_eq!(names_of(skipped, dir.path()), ["b.csv", "sub/a.txt"]);
        let message = err.to_string();
        assert!(
            message.contains("b.csv") && message.contains(".arrow"),
            "{message}"
        );
    }

    fn names_of(paths: &[PathBuf], root: &Path) -> Vec<String> {
        paths
            .iter()
            .map(|p| p.strip_prefix(root).unwrap().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.jsonl");
        let err = expand(&[s(&path)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{}: No such file or directory", path.display())
        );
    }

    #[test]
    fn an_unknown_extension_lists_the_accepted_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.csv");
        touch(&path, b"");
        let message = expand(&[s(&path)]).unwrap_err().to_string();
        assert!(
            message.starts_with(&format!("{}: unknown file extension", path.display())),
            "{message}"
        );
        assert!(
            message.contains(".jsonl") && message.contains(".zst") && message.contains(".parquet"),
            "{message}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_loop_is_walked_once() {
        let dir = tempfile::tempdir().unwrap();
        touch(&dir.path().join("d/a.jsonl"), b"");
        std::os::unix::fs::symlink(dir.path().join("d"), dir.path().join("d/loop")).unwrap();
        let files = expand(&[s(dir.path())]).unwrap();
        assert_eq!(names(&files, dir.path()), ["d/a.jsonl"]);
    }

    #[test]
    fn displays() {
        assert_eq!(Location::Line(17).to_string(), "line 17");
        assert_eq!(
            Location::Row {
                row_group: 2,
                row: 5
            }
            .to_string(),
            "row group 2, row 5"
        );
        let key = TextKey::parse("meta.text");
        assert_eq!(key.to_string(), "meta.text");
        assert_eq!(key.as_str(), "meta.text");
        assert_eq!(key.parts(), ["meta", "text"]);
    }

    #[test]
    fn the_reader_can_move_to_another_thread() {
        fn is_send<T: Send>() {}
        is_send::<Reader>();
    }

    #[test]
    fn no_files_no_batches() {
        let mut reader = Reader::new(Vec::new(), TextKey::parse("text"));
        assert!(reader.next_batch(10, 10).unwrap().is_none());
        assert_eq!(reader.progress().load(Ordering::Relaxed), 0);
    }
}
