//! `prep validate`: everything a reader relies on, checked in one pass per
//! file, shards in parallel, with every problem reported (capped per kind).
//!
//! The dataset is a local directory or an address in object storage; the
//! checks are the same code for both ([`crate::format::Files`]): each file is read
//! in order as a sequence of chunks (slices of a mapping, or ranged GETs),
//! so a remote shard is never held whole.
//!
//! The checks share their primitives with the reader ([`IdxHeader::parse`],
//! [`offset_violations`](crate::format::offset_violations),
//! [`Manifest::consistency_problems`]), so what `validate` accepts the
//! reader opens, and what the reader refuses `validate` reports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::format::{
    checksum_hex, row_index_end, row_index_start, row_violation, row_window, ChunkHasher,
    ChunkSums, FormatError, IdxHeader, Manifest, OffsetRules, SegHeader, Segment, ShardInfo,
    Tokens, FORMAT_VERSION, IDX_HEADER_LEN, MANIFEST_FILE, SEGMENT_BYTES, SEG_HEADER_LEN,
};
use crate::format::{Entries, File, Files, ReadError, TokenBlocks};

/// The manifest schema, compiled into the binary so `validate` needs no files beside it.
pub const MANIFEST_SCHEMA: &str = include_str!("../schemas/manifest.schema.json");

/// What `prep validate` is asked to do.
#[derive(Debug, Clone)]
pub struct ValidateConfig {
    /// The dataset directory, or its object-storage address
    /// (`s3://bucket/prefix`, `gs://`, `az://`, `https://`).
    pub dir: PathBuf,
    /// Skip the checksums (everything else is still checked).
    pub quick: bool,
    /// Worker threads; 0 means one per core.
    pub threads: usize,
    /// Problems listed per kind; the rest are counted.
    pub max_per_kind: usize,
}

impl ValidateConfig {
    /// A full check of `dir` on every core, 20 problems listed per kind.
    pub fn new(dir: impl Into<PathBuf>) -> ValidateConfig {
        ValidateConfig {
            dir: dir.into(),
            quick: false,
            threads: 0,
            max_per_kind: 20,
        }
    }
}

/// Why `validate` could not run at all (exit code 2), as opposed to finding problems.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// The directory does not exist.
    #[error("{}: no such directory", .0.display())]
    NoDirectory(PathBuf),
    /// The manifest is missing, unreadable, not JSON, or of a newer version.
    #[error(transparent)]
    Manifest(#[from] FormatError),
    /// The worker threads could not be started.
    #[error("cannot start worker threads: {0}")]
    Threads(String),
    /// A dataset in object storage could not be read: a missing bucket,
    /// refused credentials, a dropped connection (the message names the
    /// object).
    #[error(transparent)]
    Read(#[from] ReadError),
}

impl ValidateError {
    /// Which way of failing this is, as the JSON report names it.
    pub fn kind(&self) -> FailureKind {
        match self {
            ValidateError::NoDirectory(_) => FailureKind::NoDirectory,
            ValidateError::Manifest(e) => match e {
                FormatError::NoManifest { .. } => FailureKind::NoManifest,
                FormatError::UnsupportedVersion { .. } => FailureKind::UnsupportedVersion,
                FormatError::Io { .. } => FailureKind::Io,
                // Every other way a manifest fails to read is a bad manifest.
                _ => FailureKind::BadManifest,
            },
            ValidateError::Threads(_) => FailureKind::Threads,
            ValidateError::Read(ReadError::NoManifest { .. }) => FailureKind::NoManifest,
            ValidateError::Read(_) => FailureKind::Io,
        }
    }

    /// The file or directory the failure is about, when there is one.
    pub fn path(&self) -> Option<PathBuf> {
        match self {
            ValidateError::NoDirectory(dir) => Some(dir.clone()),
            ValidateError::Manifest(e) => match e {
                FormatError::NoManifest { dir } => Some(dir.join(MANIFEST_FILE)),
                FormatError::Io { path, .. }
                | FormatError::BadManifest { path, .. }
                | FormatError::UnsupportedVersion { path, .. } => Some(path.clone()),
                _ => None,
            },
            ValidateError::Threads(_) => None,
            ValidateError::Read(e) => e.path(),
        }
    }
}

/// Why `validate` could not check a dataset at all (exit code 2); the report
/// then says so in its `error` field instead of listing problems.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The dataset directory does not exist.
    NoDirectory,
    /// The directory has no `manifest.json`.
    NoManifest,
    /// The manifest is not JSON (or not readable as a manifest at all).
    BadManifest,
    /// The manifest has a version newer than this build reads.
    UnsupportedVersion,
    /// The manifest could not be read from disk, or the dataset from
    /// object storage (a missing bucket, refused credentials, no connection).
    Io,
    /// The worker threads could not be started.
    Threads,
}

/// The `error` of a report for a dataset that could not be checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// Which way of failing.
    pub kind: FailureKind,
    /// The file or directory it is about (the dataset directory when no
    /// single file is to blame).
    pub path: String,
    /// The whole message, as printed on stderr.
    pub message: String,
}

/// The kinds of problem, one per rule of FORMAT.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// The manifest does not match schemas/manifest.schema.json.
    ManifestSchema,
    /// The manifest's totals, paths or sizes disagree among themselves.
    ManifestCounts,
    /// A listed file is missing.
    MissingFile,
    /// A file's size differs from the manifest's.
    FileSize,
    /// A file named as prep names a shard's files (`shard-00042.bin`) is
    /// not listed. (Other files the manifest does not list are notes.)
    UnlistedFile,
    /// A file's XXH3-64 differs from the manifest's.
    Checksum,
    /// An index header is unreadable (magic, version, token size, reserved bytes, length).
    IdxHeader,
    /// An index header's dtype differs from the manifest's.
    DtypeMismatch,
    /// An index header's counts differ from the manifest's.
    CountMismatch,
    /// A `.bin`'s size differs from its index header's token count.
    BinSize,
    /// Offsets do not start at 0, decrease, or do not end at the token count.
    Offsets,
    /// A token id is not below `vocab_size`.
    TokenOutOfRange,
    /// A record does not end with eos although the manifest says eos is appended.
    MissingEos,
    /// A record does not start with bos although the manifest says bos is prepended.
    MissingBos,
    /// A packed row is not `seq_len` tokens long.
    RowLength,
    /// A packed shard's segment index is unreadable, disagrees with its
    /// shard, or its pieces do not tile the rows.
    Segments,
    /// A packed row's tokens after its last piece are not the pad token.
    Padding,
    /// A shard's chunk checksum file (`.sum`) is unreadable (magic,
    /// version, reserved bytes, chunk size, length) or its chunks do not
    /// cover the shard's `.bin`.
    ChunkSums,
    /// A chunk of a `.bin` does not have the XXH3-64 its `.sum` lists.
    ChunkChecksum,
    /// A shard's loss mask (`.mask`) is not one byte per token, each 0 or 1.
    LossMask,
}

/// One problem, with where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// What rule it breaks.
    pub kind: ProblemKind,
    /// The file, relative to the dataset directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The shard's position in the manifest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<u64>,
    /// The record within the shard.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<u64>,
    /// The token offset within the shard.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The chunk of the shard's `.bin`, as its `.sum` numbers them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunk: Option<u64>,
    /// What was found and what was expected.
    pub message: String,
}

/// What was looked at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Checked {
    /// Shards in the manifest.
    pub shards: u64,
    /// Records scanned.
    pub records: u64,
    /// Tokens scanned.
    pub tokens: u64,
    /// Bytes read (shard files and the tokenizer copy).
    pub bytes: u64,
    /// Whether checksums were verified (`--quick` skips them).
    pub checksums: bool,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// The outcome of `prep validate`; its JSON form is described by
/// schemas/validate-report.schema.json.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The dataset directory.
    pub dataset: String,
    /// True when no problem was found.
    pub valid: bool,
    /// Problems found, in order of shard and position, at most `max_per_kind` of each kind.
    pub problems: Vec<Problem>,
    /// Problems found but not listed, by kind.
    pub omitted: BTreeMap<ProblemKind, u64>,
    /// What was looked at.
    pub checked: Checked,
    /// Why nothing could be checked, for a dataset `validate` could not run
    /// on (then `valid` is false and `problems` empty); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Failure>,
    /// Files beside the dataset that are not part of it and do not make it
    /// invalid (a file of the user's, such as `work.seg`); absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Note>,
}

/// A file beside the dataset that is not part of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Note {
    /// The file, relative to the dataset directory.
    pub file: String,
    /// What it is to the dataset.
    pub message: String,
}

impl Report {
    /// The report for a dataset that could not be checked at all, so that
    /// `validate --json` always prints a report a script can parse: not
    /// valid, no problems listed, nothing checked, and `error` saying why.
    pub fn could_not_run(config: &ValidateConfig, error: &ValidateError) -> Report {
        let path = error.path().unwrap_or_else(|| config.dir.clone());
        Report {
            dataset: config.dir.display().to_string(),
            valid: false,
            problems: Vec::new(),
            omitted: BTreeMap::new(),
            checked: Checked::default(),
            error: Some(Failure {
                kind: error.kind(),
                path: path.display().to_string(),
                message: error.to_string(),
            }),
            notes: Vec::new(),
        }
    }

    /// Problems found, listed or not.
    pub fn total_problems(&self) -> u64 {
        self.problems.len() as u64 + self.omitted.values().sum::<u64>()
    }
}

/// Collects problems, listing at most `cap` of each kind and counting the rest.
struct Problems {
    cap: usize,
    listed: Vec<Problem>,
    counts: BTreeMap<ProblemKind, u64>,
    notes: Vec<Note>,
}

impl Problems {
    fn new(cap: usize) -> Problems {
        Problems {
            cap,
            listed: Vec::new(),
            counts: BTreeMap::new(),
            notes: Vec::new(),
        }
    }

    fn push(&mut self, problem: Problem) {
        let count = self.counts.entry(problem.kind).or_default();
        *count += 1;
        if *count as usize <= self.cap {
            self.listed.push(problem);
        }
    }

    /// Adds another collector's problems after this one's, keeping the cap.
    fn merge(&mut self, other: Problems) {
        let mut listed_of: BTreeMap<ProblemKind, u64> = BTreeMap::new();
        for p in other.listed {
            *listed_of.entry(p.kind).or_default() += 1;
            self.push(p);
        }
        for (kind, count) in other.counts {
            let unlisted = count - listed_of.get(&kind).copied().unwrap_or(0);
            *self.counts.entry(kind).or_default() += unlisted;
        }
    }

    fn into_report(self, dataset: String, checked: Checked) -> Report {
        let mut omitted = BTreeMap::new();
        for (kind, count) in &self.counts {
            let listed = self.listed.iter().filter(|p| p.kind == *kind).count() as u64;
            if *count > listed {
                omitted.insert(*kind, count - listed);
            }
        }
        Report {
            dataset,
            valid: self.counts.is_empty(),
            problems: self.listed,
            omitted,
            checked,
            error: None,
            notes: self.notes,
        }
    }
}

fn problem(
    kind: ProblemKind,
    file: Option<&str>,
    shard: Option<usize>,
    message: String,
) -> Problem {
    Problem {
        kind,
        file: file.map(str::to_owned),
        shard: shard.map(|s| s as u64),
        record: None,
        token: None,
        chunk: None,
        message,
    }
}

/// Runs every check on the dataset in `config.dir`: a local directory, or
/// an object-storage address (`s3://bucket/prefix`, `gs://`, `az://`,
/// `https://`) read in place, each object streamed through the same checks
/// by ranged GETs of bounded size.
///
/// Returns a report (valid or not) whenever the manifest could be read as
/// JSON of a known version; an error only when there is nothing to check,
/// or when the store fails (a missing bucket, refused credentials, a
/// dropped connection): then nothing was checked to the end.
pub fn validate(config: &ValidateConfig) -> Result<Report, ValidateError> {
    let started = Instant::now();
    let dir = &config.dir;
    let source = Files::new(dir).map_err(ReadError::from)?;
    if !source.is_remote() && !dir.is_dir() {
        return Err(ValidateError::NoDirectory(dir.clone()));
    }
    let mut problems = Problems::new(config.max_per_kind.max(1));
    let Some(manifest) = read_manifest(&source, dir, &mut problems)? else {
        let checked = Checked {
            checksums: !config.quick,
            seconds: started.elapsed().as_secs_f64(),
            ..Checked::default()
        };
        return Ok(problems.into_report(dir.display().to_string(), checked));
    };
    for message in manifest.consistency_problems() {
        problems.push(problem(
            ProblemKind::ManifestCounts,
            Some(MANIFEST_FILE),
            None,
            message,
        ));
    }
    unlisted_files(&source, &manifest, &mut problems)?;
    let packed = manifest.kind == "packed";
    if packed {
        for message in packed_manifest_problems(&manifest) {
            problems.push(problem(
                ProblemKind::ManifestCounts,
                Some(MANIFEST_FILE),
                None,
                message,
            ));
        }
    }

    let threads = crate::util::thread_count(config.threads);
    let pool = crate::run::thread_pool(threads, "validate")
        .map_err(|e| ValidateError::Threads(e.to_string()))?;
    let cap = problems.cap;
    let results: Vec<(Problems, Checked, Pieces)> = pool.install(|| {
        manifest
            .shards
            .par_iter()
            .enumerate()
            .map(|(s, shard)| check_shard(&source, &manifest, s, shard, config.quick, cap))
            .collect::<Result<_, ReadError>>()
    })?;
    let mut checked = Checked {
        shards: manifest.shards.len() as u64,
        checksums: !config.quick,
        ..Checked::default()
    };
    let mut pieces = Pieces::default();
    for (shard_problems, shard_checked, shard_pieces) in results {
        problems.merge(shard_problems);
        checked.records += shard_checked.records;
        checked.tokens += shard_checked.tokens;
        checked.bytes += shard_checked.bytes;
        pieces.complete &= shard_pieces.complete;
        pieces.segments += shard_pieces.segments;
        pieces.padding += shard_pieces.padding;
    }
    if let (true, true, Some(p)) = (packed, pieces.complete, &manifest.packing) {
        for (what, listed, found) in [
            ("pieces", p.pieces, pieces.segments),
            ("pad_tokens", p.pad_tokens, pieces.padding),
        ] {
            if listed != found {
                problems.push(problem(
                    ProblemKind::ManifestCounts,
                    Some(MANIFEST_FILE),
                    None,
                    format!("packing.{what} is {listed} but the segment indexes hold {found}"),
                ));
            }
        }
    }
    checked.bytes += check_listed_files(&source, &manifest, config.quick, &mut problems)?;
    checked.seconds = started.elapsed().as_secs_f64();
    Ok(problems.into_report(dir.display().to_string(), checked))
}

/// Segments and padding counted over a packed dataset's shards.
#[derive(Debug, Clone, Copy)]
struct Pieces {
    /// Every shard's segment index was read and sound.
    complete: bool,
    segments: u64,
    padding: u64,
}

impl Default for Pieces {
    fn default() -> Pieces {
        Pieces {
            complete: true,
            segments: 0,
            padding: 0,
        }
    }
}

/// What a packed manifest must say: its row length, its packing counts in
/// agreement with its totals, a segment index for every shard.
fn packed_manifest_problems(m: &Manifest) -> Vec<String> {
    let mut out = Vec::new();
    let Some(l) = m.seq_len else {
        out.push("a packed dataset needs seq_len".into());
        return out;
    };
    if l == 0 || l > u64::from(u32::MAX) {
        out.push(format!("seq_len {l} is not between 1 and 2^32 - 1"));
    }
    if m.n_records.checked_mul(l) != Some(m.n_tokens) {
        out.push(format!(
            "n_tokens is {} but {} rows of {l} tokens hold {}",
            m.n_tokens,
            m.n_records,
            m.n_records.saturating_mul(l)
        ));
    }
    match &m.packing {
        None => out.push("a packed dataset needs packing".into()),
        Some(p) => {
            if p.rows != m.n_records {
                out.push(format!(
                    "packing.rows is {} but n_records is {}",
                    p.rows, m.n_records
                ));
            }
            if p.pad_tokens > m.n_tokens {
                out.push(format!(
                    "packing.pad_tokens {} is more than n_tokens {}",
                    p.pad_tokens, m.n_tokens
                ));
            }
            if p.pad_tokens > 0 && m.special_tokens.pad.is_none() {
                out.push("rows are padded but special_tokens.pad is null".into());
            }
        }
    }
    for (i, shard) in m.shards.iter().enumerate() {
        // An unsafe path is one of the manifest's consistency problems.
        if shard.seg.is_none() || shard.seg_bytes.is_none() || shard.seg_xxh3.is_none() {
            out.push(format!(
                "shard {i}: a packed shard needs seg, seg_bytes and seg_xxh3"
            ));
        }
    }
    out
}

/// Reads the manifest, reports schema problems, and parses it if it can be.
///
/// Missing, unreadable, not JSON, or of a newer version: an error (nothing
/// to check). Not of the schema's shape: problems, and `None`.
fn read_manifest(
    source: &Files,
    dir: &Path,
    problems: &mut Problems,
) -> Result<Option<Manifest>, ValidateError> {
    let path = source.path_of(MANIFEST_FILE);
    let bytes = match source.manifest_bytes("") {
        Ok(Some(bytes)) => bytes,
        Ok(None) if !source.is_remote() => {
            return Err(FormatError::NoManifest { dir: dir.into() }.into())
        }
        Ok(None) => return Err(source.no_manifest().into()),
        Err(ReadError::Format(e)) => return Err(e.into()),
        Err(e) => return Err(e.into()),
    };
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| FormatError::BadManifest {
            path: path.clone(),
            message: format!("not JSON: {e}"),
        })?;
    // Another tool's manifest: nothing of prep's to check.
    Manifest::check_format(&path, &value)?;
    if let Some(v) = value.get("version").and_then(|v| v.as_u64()) {
        if v > FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                path,
                found: v,
                supported: FORMAT_VERSION,
            }
            .into());
        }
    }
    let schema: serde_json::Value =
        serde_json::from_str(MANIFEST_SCHEMA).expect("the embedded schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("the embedded schema compiles");
    let mut schema_ok = true;
    for error in validator.iter_errors(&value) {
        schema_ok = false;
        let at = error.instance_path().to_string();
        let at = if at.is_empty() {
            "the manifest".to_owned()
        } else {
            at
        };
        problems.push(problem(
            ProblemKind::ManifestSchema,
            Some(MANIFEST_FILE),
            None,
            format!("{at}: {error}"),
        ));
    }
    match serde_json::from_value::<Manifest>(value) {
        Ok(manifest) => Ok(Some(manifest)),
        Err(e) => {
            if schema_ok {
                problems.push(problem(
                    ProblemKind::ManifestSchema,
                    Some(MANIFEST_FILE),
                    None,
                    e.to_string(),
                ));
            }
            Ok(None)
        }
    }
}

/// Files of the dataset (a directory's walk, a prefix's listing) that look
/// like shards (`.bin`, `.idx`, `.seg`, `.sum`, `.mask`, or their `.tmp`
/// forms) but are not listed: a problem when prep's numbering names them
/// ([`crate::output::is_shard_name`]: a shard the manifest lost), a note
/// otherwise (a file of someone else's beside the dataset). The files a
/// manifest lists besides its shards count as listed; so do the
/// files of the parts a merged dataset names (a shard that `--dedup`
/// rewrote without some records leaves the part's own in place).
fn unlisted_files(
    source: &Files,
    manifest: &Manifest,
    problems: &mut Problems,
) -> Result<(), ReadError> {
    let mut besides: Vec<String> = manifest
        .other_files()
        .into_iter()
        .map(|f| f.name.to_owned())
        .collect();
    for part in &manifest.provenance.merged {
        // A part whose manifest cannot be read lists nothing more.
        let Ok(Some(bytes)) = source.manifest_bytes(&part.path) else {
            continue;
        };
        let Ok(m) = Manifest::parse(&source.path_of(&part.path), &bytes) else {
            continue;
        };
        let files = m.shards.iter().flat_map(|s| s.files().map(|f| f.name));
        let others = m.other_files();
        for file in files.chain(others.iter().map(|f| f.name)) {
            besides.push(format!("{}/{file}", part.path));
        }
    }
    let listed: BTreeSet<&str> = manifest
        .shards
        .iter()
        .flat_map(|s| s.files().map(|f| f.name))
        .chain(besides.iter().map(String::as_str))
        .collect();
    for rel in source.files()? {
        let name = rel.strip_suffix(crate::format::TMP_SUFFIX).unwrap_or(&rel);
        let looks_like_shard = crate::output::SHARD_EXTENSIONS
            .iter()
            .any(|ext| name.ends_with(ext));
        if !looks_like_shard || listed.contains(rel.as_str()) {
            continue;
        }
        let file_name = name.rsplit('/').next().unwrap_or(name);
        if crate::output::is_shard_name(file_name) && !rel.contains('/') {
            problems.push(problem(
                ProblemKind::UnlistedFile,
                Some(&rel),
                None,
                "is named as a shard file of this dataset but the manifest does not list it".into(),
            ));
        } else {
            problems.notes.push(Note {
                file: rel.clone(),
                message: "not part of the dataset: the manifest does not list it".into(),
            });
        }
    }
    Ok(())
}

/// The files a manifest lists besides the shards ([`Manifest::other_files`]:
/// the tokenizer copy, a part's record hashes, a report): each present, of
/// its listed size, with its checksum. Returns the bytes read.
fn check_listed_files(
    source: &Files,
    manifest: &Manifest,
    quick: bool,
    problems: &mut Problems,
) -> Result<u64, ReadError> {
    let mut bytes = 0;
    for f in manifest.other_files() {
        bytes += check_file(source, f.what, f.name, f.xxh3, f.bytes, quick, problems)?;
    }
    Ok(bytes)
}

/// One file `what` of the dataset besides the shards, at `file`: a plain
/// relative path, present, `bytes` long when the manifest says, and (unless
/// `quick`) of XXH3 `xxh3`. Returns the bytes read.
fn check_file(
    source: &Files,
    what: &str,
    file: &str,
    xxh3: &str,
    bytes: Option<u64>,
    quick: bool,
    problems: &mut Problems,
) -> Result<u64, ReadError> {
    if !crate::format::is_safe_relative(file) {
        problems.push(problem(
            ProblemKind::ManifestCounts,
            Some(MANIFEST_FILE),
            None,
            format!("{what}'s path {file:?} is not a plain relative path"),
        ));
        return Ok(0);
    }
    let Some(copy) = open(source, file, Err(what), problems)? else {
        return Ok(0);
    };
    if let Some(listed) = bytes.filter(|&b| b != copy.len()) {
        problems.push(problem(
            ProblemKind::FileSize,
            Some(file),
            None,
            format!("{} bytes, the manifest says {listed}", copy.len()),
        ));
        return Ok(0);
    }
    if quick {
        return Ok(0);
    }
    let found = checksum_hex(copy.xxh3()?);
    if found != xxh3 {
        problems.push(problem(
            ProblemKind::Checksum,
            Some(file),
            None,
            format!("XXH3 is {found}, the manifest says {xxh3}"),
        ));
    }
    Ok(copy.len())
}

/// Every check of one shard. Each file is read in order, in chunks (a
/// mapped file's slices, an object's ranged GETs): the `.sum` for its
/// checksum and header, the `.idx` for its checksum and for its offsets,
/// the `.seg` of a packed shard likewise, then the `.bin` once, its
/// checksum, its chunks' checksums, token scan and the records' checks
/// sharing the pass, with the offsets (and segments) read alongside.
fn check_shard(
    source: &Files,
    manifest: &Manifest,
    s: usize,
    info: &ShardInfo,
    quick: bool,
    cap: usize,
) -> Result<(Problems, Checked, Pieces), ReadError> {
    let mut problems = Problems::new(cap);
    let mut checked = Checked::default();
    let unchecked = Pieces {
        complete: false,
        ..Pieces::default()
    };
    if !crate::format::is_safe_relative(&info.bin) || !crate::format::is_safe_relative(&info.idx) {
        // Reported with the manifest's consistency problems.
        return Ok((problems, checked, unchecked));
    }
    let c = ShardCheck {
        manifest,
        s,
        info,
        quick,
        cap,
    };
    check_listed_bin_bytes(&c, &mut problems);
    check_mask_file(source, &c, &mut problems, &mut checked)?;
    let sums = check_sum_file(source, &c, &mut problems, &mut checked)?;
    let Some(files) = open_shard_files(source, &c, &mut problems)? else {
        return Ok((problems, checked, unchecked));
    };
    let IndexFindings { sound, rows } = check_index(&c, &files, &mut problems, &mut checked)?;

    // A packed shard's segment index, before the .bin whose rows it describes.
    let mut seg_problems = Problems::new(cap);
    let segments = match (c.packed(), sound) {
        (true, true) => {
            problems.merge(rows);
            check_segment_index(source, manifest, s, info, quick, &mut seg_problems)?
        }
        _ => None,
    };

    let (out_of_range, probes) = check_bin(
        &c,
        &files,
        sound,
        segments.as_ref(),
        sums.as_ref(),
        &mut problems,
        &mut checked,
    )?;
    problems.merge(out_of_range);
    problems.merge(seg_problems);
    let pieces = merge_probes(probes, segments.as_ref(), &mut problems);
    Ok((problems, checked, pieces))
}

/// What every phase of [`check_shard`] needs to know about the shard.
struct ShardCheck<'a> {
    manifest: &'a Manifest,
    /// The shard's position in the manifest.
    s: usize,
    info: &'a ShardInfo,
    quick: bool,
    cap: usize,
}

impl ShardCheck<'_> {
    /// A problem with `file` of this shard.
    fn at(&self, kind: ProblemKind, file: &str, message: String) -> Problem {
        problem(kind, Some(file), Some(self.s), message)
    }

    /// Whether the dataset is packed (rows of `seq_len`, a segment index per shard).
    fn packed(&self) -> bool {
        self.manifest.kind == "packed"
    }
}

/// A shard's two files, opened.
struct ShardFiles {
    bin: File,
    idx: File,
}

/// What the index's checks tell the phases after them.
struct IndexFindings {
    /// The offsets are sound and inside the `.bin`.
    sound: bool,
    /// Row lengths of a packed shard, reported only when the offsets are sound.
    rows: Problems,
}

/// The manifest's `bin_bytes` of the shard against its token count.
fn check_listed_bin_bytes(c: &ShardCheck, problems: &mut Problems) {
    let (s, info, dtype) = (c.s, c.info, c.manifest.dtype);
    let expected_bin = info.n_tokens.checked_mul(dtype.size() as u64);
    if expected_bin != Some(info.bin_bytes) {
        problems.push(c.at(
            ProblemKind::ManifestCounts,
            MANIFEST_FILE,
            format!(
                "shard {s}: bin_bytes is {} but {} tokens of {dtype} take {}",
                info.bin_bytes,
                info.n_tokens,
                expected_bin.map_or("more than a u64".into(), |b| b.to_string())
            ),
        ));
    }
}

/// The shard's `.bin` and `.idx`, opened and their sizes checked against
/// the manifest's; `None` when either is missing.
fn open_shard_files(
    source: &Files,
    c: &ShardCheck,
    problems: &mut Problems,
) -> Result<Option<ShardFiles>, ReadError> {
    let info = c.info;
    let bin = open(source, &info.bin, Ok(c.s), problems)?;
    let idx = open(source, &info.idx, Ok(c.s), problems)?;
    let (Some(bin), Some(idx)) = (bin, idx) else {
        return Ok(None);
    };
    for (name, file, listed) in [
        (&info.bin, &bin, info.bin_bytes),
        (&info.idx, &idx, info.idx_bytes),
    ] {
        if file.len() != listed {
            problems.push(c.at(
                ProblemKind::FileSize,
                name,
                format!("{} bytes, the manifest says {listed}", file.len()),
            ));
        }
    }
    Ok(Some(ShardFiles { bin, idx }))
}

/// The shard's chunk checksums, when its entry lists them (a dataset of an
/// older prep has none, and is valid without): present, of the listed size
/// and checksum, and a header that describes the listed `.bin`. Returns
/// them when they can be checked against the `.bin`.
fn check_sum_file(
    source: &Files,
    c: &ShardCheck,
    problems: &mut Problems,
    checked: &mut Checked,
) -> Result<Option<ChunkSums>, ReadError> {
    let info = c.info;
    let Some(name) = info
        .sum
        .as_deref()
        .filter(|n| crate::format::is_safe_relative(n))
    else {
        return Ok(None); // none, or an unsafe path reported with the manifest
    };
    let Some(file) = open(source, name, Ok(c.s), problems)? else {
        return Ok(None);
    };
    checked.bytes += file.len();
    if Some(file.len()) != info.sum_bytes {
        problems.push(c.at(
            ProblemKind::FileSize,
            name,
            format!(
                "{} bytes, the manifest says {}",
                file.len(),
                info.sum_bytes.map_or("nothing".into(), |b| b.to_string())
            ),
        ));
    }
    if !c.quick {
        let listed = info.sum_xxh3.as_deref().unwrap_or("");
        verify_checksum(&file, name, listed, Some(c.s), problems)?;
    }
    // Read whole: 8 bytes per chunk, a small file beside its .bin.
    let bytes = file.read(0..file.len())?;
    match ChunkSums::parse(Path::new(name), &bytes, info.bin_bytes) {
        Ok(sums) => Ok(Some(sums)),
        Err(e) => {
            let message = strip_path(&e.to_string(), name);
            problems.push(c.at(ProblemKind::ChunkSums, name, message));
            Ok(None)
        }
    }
}

/// The shard's loss mask, when its entry lists one (a version 2 dataset):
/// present, one byte per token, of the listed size and checksum, and every
/// byte 0 or 1.
fn check_mask_file(
    source: &Files,
    c: &ShardCheck,
    problems: &mut Problems,
    checked: &mut Checked,
) -> Result<(), ReadError> {
    let info = c.info;
    let Some(name) = info
        .mask
        .as_deref()
        .filter(|n| crate::format::is_safe_relative(n))
    else {
        return Ok(()); // none, or an unsafe path reported with the manifest
    };
    let Some(file) = open(source, name, Ok(c.s), problems)? else {
        return Ok(());
    };
    checked.bytes += file.len();
    if file.len() != info.n_tokens {
        problems.push(c.at(
            ProblemKind::LossMask,
            name,
            format!(
                "{} bytes, but the shard has {} tokens and a mask one byte for each",
                file.len(),
                info.n_tokens
            ),
        ));
        return Ok(());
    }
    if !c.quick {
        let listed = info.mask_xxh3.as_deref().unwrap_or("");
        verify_checksum(&file, name, listed, Some(c.s), problems)?;
    }
    let mut at = 0u64;
    let mut chunks = file.chunks(0..file.len());
    while let Some(chunk) = chunks.next_chunk()? {
        if let Some(k) = chunk.iter().position(|&b| b > 1) {
            problems.push(c.at(
                ProblemKind::LossMask,
                name,
                format!(
                    "byte {} (token {} of the shard) is {}; a mask byte is 0 or 1",
                    at + k as u64,
                    at + k as u64,
                    chunk[k]
                ),
            ));
            return Ok(());
        }
        at += chunk.len() as u64;
    }
    Ok(())
}

/// The index: header, agreement with the manifest and the .bin, offsets.
fn check_index(
    c: &ShardCheck,
    files: &ShardFiles,
    problems: &mut Problems,
    checked: &mut Checked,
) -> Result<IndexFindings, ReadError> {
    let (bin, idx, info) = (&files.bin, &files.idx, c.info);
    checked.bytes += idx.len();
    if !c.quick {
        verify_checksum(idx, &info.idx, &info.idx_xxh3, Some(c.s), problems)?;
    }
    let header = read_idx_header(c, idx, problems)?;
    checked.bytes += bin.len();
    let mut findings = IndexFindings {
        sound: false,
        rows: Problems::new(c.cap),
    };
    let Some(h) = header else {
        return Ok(findings);
    };
    check_idx_header(c, &h, bin, problems);
    let offsets_sound = check_offsets(c, &h, idx, &mut findings.rows, problems)?;
    // Per-record checks need offsets that are sound and inside the .bin.
    let dtype = c.manifest.dtype;
    let bin_tokens = bin.len() / dtype.size() as u64;
    findings.sound = offsets_sound && h.dtype == dtype && h.n_tokens <= bin_tokens;
    if findings.sound {
        checked.records += h.n_records;
    }
    Ok(findings)
}

/// The index's header, parsed; an unreadable one is a problem and `None`.
fn read_idx_header(
    c: &ShardCheck,
    idx: &File,
    problems: &mut Problems,
) -> Result<Option<IdxHeader>, ReadError> {
    let name = &c.info.idx;
    let head = idx.read(0..IDX_HEADER_LEN as u64)?;
    match IdxHeader::parse_head(Path::new(name), &head, idx.len()) {
        Ok(h) => Ok(Some(h)),
        Err(e) => {
            problems.push(c.at(
                ProblemKind::IdxHeader,
                name,
                strip_path(&e.to_string(), name),
            ));
            Ok(None)
        }
    }
}

/// The index header's dtype and counts against the manifest's, and the
/// `.bin`'s size against its token count.
fn check_idx_header(c: &ShardCheck, h: &IdxHeader, bin: &File, problems: &mut Problems) {
    let (info, dtype) = (c.info, c.manifest.dtype);
    if h.dtype != dtype {
        problems.push(c.at(
            ProblemKind::DtypeMismatch,
            &info.idx,
            format!("header says {} but the manifest says {dtype}", h.dtype),
        ));
    }
    if h.n_records != info.n_records || h.n_tokens != info.n_tokens {
        problems.push(c.at(
            ProblemKind::CountMismatch,
            &info.idx,
            format!(
                "header has {} records and {} tokens, the manifest lists {} and {}",
                h.n_records, h.n_tokens, info.n_records, info.n_tokens
            ),
        ));
    }
    let needed = h.n_tokens.checked_mul(h.dtype.size() as u64);
    if needed != Some(bin.len()) {
        problems.push(c.at(
            ProblemKind::BinSize,
            &info.bin,
            format!(
                "{} bytes, but the index's {} tokens of {} take {}",
                bin.len(),
                h.n_tokens,
                h.dtype,
                needed.map_or("more than a u64".into(), |b| b.to_string())
            ),
        ));
    }
}

/// The offsets against their rules (into `problems`) and, in a packed
/// shard, each row's length against `seq_len` (into `rows`). Returns
/// whether the offsets broke no rule.
fn check_offsets(
    c: &ShardCheck,
    h: &IdxHeader,
    idx: &File,
    rows: &mut Problems,
    problems: &mut Problems,
) -> Result<bool, ReadError> {
    let info = c.info;
    let packed = c.packed();
    let seq_len = c
        .manifest
        .seq_len
        .filter(|&l| l > 0 && l <= u64::from(u32::MAX));
    let mut rules = OffsetRules::new(h.n_tokens);
    let mut offsets = Entries::<8>::new(idx, IDX_HEADER_LEN as u64..idx.len());
    let mut violations = Vec::new();
    let (mut r, mut previous) = (0u64, None);
    while let Some(offset) = offsets.next_u64()? {
        violations.extend(rules.push(offset));
        if let (true, Some(l), Some(lo)) = (packed, seq_len, previous) {
            if offset >= lo && offset - lo != l {
                let mut p = c.at(
                    ProblemKind::RowLength,
                    &info.bin,
                    format!("row of {} tokens, seq_len is {l}", offset - lo),
                );
                p.record = Some(r);
                rows.push(p);
            }
        }
        if previous.is_some() {
            r += 1;
        }
        previous = Some(offset);
    }
    violations.extend(rules.finish());
    let sound = violations.is_empty();
    for v in violations {
        let mut p = c.at(
            ProblemKind::Offsets,
            &info.idx,
            format!("offsets[{}] = {}: {}", v.position, v.found, v.expected),
        );
        p.record = Some(v.position);
        problems.push(p);
    }
    Ok(sound)
}

/// The .bin: checksum, chunk checksums, token ids and the records' checks
/// in one pass. Returns the ids out of range and the probes, whose problems
/// the caller adds after those of the segment index.
fn check_bin<'a>(
    c: &ShardCheck,
    files: &'a ShardFiles,
    sound: bool,
    segments: Option<&'a (File, SegHeader)>,
    sums: Option<&ChunkSums>,
    problems: &mut Problems,
    checked: &mut Checked,
) -> Result<(Problems, Probes<'a>), ReadError> {
    let info = c.info;
    let mut hasher = (!c.quick).then(xxhash_rust::xxh3::Xxh3::new);
    // A .bin of another size than listed is reported as such; its chunks
    // would only repeat it.
    let sums = sums.filter(|s| !c.quick && s.bin_bytes() == files.bin.len());
    let mut chunks = sums.map(|s| ChunkHasher::new(s.chunk_bytes()));
    let mut out_of_range = Problems::new(c.cap);
    let mut records = match sound {
        true => Some(RecordWalk::new(&files.idx)),
        false => None,
    };
    let mut probes = probes_for(c, &files.idx, sound, segments, problems);
    let mut blocks = TokenBlocks::new(&files.bin, c.manifest.dtype);
    while let Some(block) = blocks.next_block()? {
        if let Some(h) = hasher.as_mut() {
            h.update(block.raw);
        }
        if let (Some(chunks), Some(sums)) = (chunks.as_mut(), sums) {
            chunks.update(block.raw, |i, d| check_chunk(c, sums, i, d, problems));
        }
        checked.tokens += block.tokens.len() as u64;
        check_ids(
            c,
            block.tokens,
            block.start,
            &mut records,
            &mut out_of_range,
        )?;
        probes.check(block.start, block.tokens, c.s, info)?;
    }
    if let Some(h) = hasher {
        verify_digest(h.digest(), &info.bin, &info.bin_xxh3, Some(c.s), problems);
    }
    if let (Some(chunks), Some(sums)) = (chunks, sums) {
        chunks.finish(|i, d| check_chunk(c, sums, i, d, problems));
    }
    Ok((out_of_range, probes))
}

/// Chunk `index` of the `.bin`, hashed to `digest`, against its `.sum`: a
/// mismatch is a problem of the `.bin` naming the chunk and its bytes.
fn check_chunk(c: &ShardCheck, sums: &ChunkSums, index: u64, digest: u64, problems: &mut Problems) {
    if let Err(bad) = sums.check(index, digest) {
        let sum = c.info.sum.as_deref().unwrap_or_default();
        let mut p = c.at(
            ProblemKind::ChunkChecksum,
            &c.info.bin,
            strip_path(&bad.to_string(), sum),
        );
        p.chunk = Some(bad.index);
        problems.push(p);
    }
}

/// The probes the pass over the `.bin` makes: a packed shard's rows when
/// its segment index is sound, the records of a shard of documents, none
/// when the offsets are not sound.
fn probes_for<'a>(
    c: &ShardCheck,
    idx: &'a File,
    sound: bool,
    segments: Option<&'a (File, SegHeader)>,
    problems: &mut Problems,
) -> Probes<'a> {
    match (sound, segments) {
        (false, _) => Probes::None,
        (true, Some((seg, header))) => Probes::Rows(Box::new(RowProbes::new(
            c.manifest, idx, seg, header, c.cap,
        ))),
        (true, None) if c.packed() => Probes::None,
        (true, None) => {
            Probes::Records(Box::new(RecordProbes::new(c.manifest, idx, c.s, problems)))
        }
    }
}

/// One block's token ids not below `vocab_size`, each a problem, with its
/// record when the offsets are sound (`records`).
fn check_ids(
    c: &ShardCheck,
    tokens: Tokens<'_>,
    start: u64,
    records: &mut Option<RecordWalk<'_>>,
    out_of_range: &mut Problems,
) -> Result<(), ReadError> {
    let vocab_size = c.manifest.vocab_size;
    let mut failed = None;
    scan_tokens(tokens, start, vocab_size, |token, id| {
        let mut p = c.at(
            ProblemKind::TokenOutOfRange,
            &c.info.bin,
            format!("token id {id} is not below vocab_size {vocab_size}"),
        );
        p.token = Some(token);
        if let Some(walk) = records.as_mut() {
            match walk.record_of(token) {
                Ok(r) => p.record = Some(r),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        out_of_range.push(p);
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The probes' problems, added to the shard's; a packed shard's pieces
/// and padding, counted when its rows were checked.
fn merge_probes(
    probes: Probes<'_>,
    segments: Option<&(File, SegHeader)>,
    problems: &mut Problems,
) -> Pieces {
    let unchecked = Pieces {
        complete: false,
        ..Pieces::default()
    };
    match probes {
        Probes::None => unchecked,
        Probes::Records(p) => {
            problems.merge(p.eos);
            problems.merge(p.bos);
            unchecked
        }
        Probes::Rows(p) => {
            problems.merge(p.padding_problems);
            problems.merge(p.eos_problems);
            Pieces {
                complete: true,
                segments: segments.map_or(0, |(_, h)| h.n_segments),
                padding: p.padding,
            }
        }
    }
}

/// The checks of a packed shard's segment index, the rows' own checks
/// aside: present, of the listed size and checksum, a header that matches
/// the shard, and pieces that tile each row from position 0. Returns the
/// file and its header when they are sound, for the pass over the `.bin`.
fn check_segment_index(
    source: &Files,
    manifest: &Manifest,
    s: usize,
    info: &ShardInfo,
    quick: bool,
    problems: &mut Problems,
) -> Result<Option<(File, SegHeader)>, ReadError> {
    let at = |kind, file: &str, record: Option<u64>, message: String| {
        let mut p = problem(kind, Some(file), Some(s), message);
        p.record = record;
        p
    };
    let Some(l) = manifest
        .seq_len
        .filter(|&l| l > 0 && l <= u64::from(u32::MAX))
    else {
        return Ok(None); // reported with the manifest
    };
    let Some(name) = info
        .seg
        .as_deref()
        .filter(|n| crate::format::is_safe_relative(n))
    else {
        return Ok(None); // reported with the manifest
    };
    let Some(file) = open(source, name, Ok(s), problems)? else {
        return Ok(None);
    };
    if Some(file.len()) != info.seg_bytes {
        problems.push(at(
            ProblemKind::FileSize,
            name,
            None,
            format!(
                "{} bytes, the manifest says {}",
                file.len(),
                info.seg_bytes.map_or("nothing".into(), |b| b.to_string())
            ),
        ));
    }
    if !quick {
        let listed = info.seg_xxh3.as_deref().unwrap_or("");
        verify_checksum(&file, name, listed, Some(s), problems)?;
    }
    let head = file.read(0..SEG_HEADER_LEN as u64)?;
    let header = match SegHeader::parse_head(Path::new(name), &head, file.len()) {
        Ok(h) => h,
        Err(e) => {
            let message = strip_path(&e.to_string(), name);
            problems.push(at(ProblemKind::Segments, name, None, message));
            return Ok(None);
        }
    };
    let rows = info.n_records;
    if header.n_rows != rows || u64::from(header.seq_len) != l {
        problems.push(at(
            ProblemKind::Segments,
            name,
            None,
            format!(
                "header has {} rows of {} tokens, the shard has {rows} rows and seq_len is {l}",
                header.n_rows, header.seq_len
            ),
        ));
        return Ok(None);
    }
    // The rules of format::segment_violations, a row at a time.
    let n = header.n_segments;
    let split = header.segments_offset() as u64;
    let mut index = Entries::<8>::new(&file, SEG_HEADER_LEN as u64..split);
    let mut cursor = SegmentCursor::new(&file, split);
    let mut violations = Vec::new();
    let first = index.next_u64()?;
    violations.extend(row_index_start(first));
    let (mut previous, mut entries, mut r) = (first, u64::from(first.is_some()), 0u64);
    while let Some(hi) = index.next_u64()? {
        entries += 1;
        let lo = previous.expect("a row index entry before this one");
        match row_window(r, lo, hi, n) {
            Err(violation) => violations.push(violation),
            Ok(None) => {}
            Ok(Some(range)) => {
                let pieces = cursor.read(range)?;
                if let Some((_, message)) = row_violation(pieces, header.seq_len) {
                    violations.push((r, message));
                }
            }
        }
        previous = Some(hi);
        r += 1;
    }
    violations.extend(row_index_end(entries, previous, n));
    let sound = violations.is_empty();
    for (r, message) in violations {
        problems.push(at(ProblemKind::Segments, name, Some(r), message));
    }
    Ok(sound.then_some((file, header)))
}

/// Segment entries read in order, a row's worth at a time; a row that does
/// not start where the previous one ended (only in a broken index) starts
/// a new read there.
struct SegmentCursor<'a> {
    file: &'a File,
    /// Byte offset of entry 0.
    base: u64,
    entries: Entries<'a, SEGMENT_BYTES>,
    /// The entry `entries` reads next.
    next: u64,
    row: Vec<Segment>,
}

impl<'a> SegmentCursor<'a> {
    fn new(file: &'a File, base: u64) -> SegmentCursor<'a> {
        SegmentCursor {
            file,
            base,
            entries: Entries::new(file, base..file.len()),
            next: 0,
            row: Vec::new(),
        }
    }

    /// Entries `range` (within the file, as [`row_window`] promises).
    fn read(&mut self, range: std::ops::Range<u64>) -> Result<&[Segment], ReadError> {
        if range.start != self.next {
            let at = self.base + range.start * SEGMENT_BYTES as u64;
            self.entries = Entries::new(self.file, at..self.file.len());
            self.next = range.start;
        }
        self.row.clear();
        while self.next < range.end {
            let Some(segment) = self.entries.next_segment()? else {
                break;
            };
            self.row.push(segment);
            self.next += 1;
        }
        Ok(&self.row)
    }
}

/// The records of a shard whose offsets are sound, walked forward: which
/// record holds a token, for positions asked in increasing order.
struct RecordWalk<'a> {
    idx: &'a File,
    /// The offsets, read from the first call on (an object is not asked
    /// for them unless they are needed).
    offsets: Option<Entries<'a, 8>>,
    started: bool,
    /// The current record, its first token, and the next record's first
    /// (`None` past the last record).
    record: u64,
    lo: u64,
    hi: Option<u64>,
}

impl<'a> RecordWalk<'a> {
    fn new(idx: &'a File) -> RecordWalk<'a> {
        RecordWalk {
            idx,
            offsets: None,
            started: false,
            record: 0,
            lo: 0,
            hi: None,
        }
    }

    /// Moves to the next record: `(record, lo, hi)`, or `None` past the last.
    fn advance(&mut self) -> Result<Option<(u64, u64, u64)>, ReadError> {
        let idx = self.idx;
        let offsets = self
            .offsets
            .get_or_insert_with(|| Entries::new(idx, IDX_HEADER_LEN as u64..idx.len()));
        if !self.started {
            self.started = true;
            self.lo = offsets.next_u64()?.unwrap_or(0);
        } else if let Some(hi) = self.hi {
            self.record += 1;
            self.lo = hi;
        } else {
            return Ok(None);
        }
        self.hi = offsets.next_u64()?;
        Ok(self.hi.map(|hi| (self.record, self.lo, hi)))
    }

    /// The record holding token `token`: the last whose first token is at
    /// or before it (past the last record: the number of records), for
    /// tokens asked in increasing order.
    fn record_of(&mut self, token: u64) -> Result<u64, ReadError> {
        if !self.started {
            self.advance()?;
        }
        while self.hi.is_some_and(|hi| hi <= token) {
            self.advance()?;
        }
        Ok(self.record)
    }
}

/// The checks of the `.bin` that look at single tokens the offsets (and a
/// packed shard's segments) point to, made as the pass over the `.bin`
/// reaches them.
enum Probes<'a> {
    None,
    Records(Box<RecordProbes<'a>>),
    Rows(Box<RowProbes<'a>>),
}

impl Probes<'_> {
    fn check(
        &mut self,
        start: u64,
        tokens: Tokens<'_>,
        s: usize,
        info: &ShardInfo,
    ) -> Result<(), ReadError> {
        match self {
            Probes::None => Ok(()),
            Probes::Records(p) => p.check(start, tokens, s, info),
            Probes::Rows(p) => p.check(start, tokens, s, info),
        }
    }
}

/// eos at the end (bos at the start) of every record, when the manifest
/// says they were added.
struct RecordProbes<'a> {
    walk: RecordWalk<'a>,
    eos_id: Option<u32>,
    bos_id: Option<u32>,
    /// The record being checked, and which of its ends are done.
    current: Option<(u64, u64, u64)>,
    started: bool,
    bos_done: bool,
    eos_done: bool,
    eos: Problems,
    bos: Problems,
}

impl<'a> RecordProbes<'a> {
    fn new(
        manifest: &Manifest,
        idx: &'a File,
        s: usize,
        problems: &mut Problems,
    ) -> RecordProbes<'a> {
        let special = &manifest.special_tokens;
        let mut wanted = |added: bool, id: Option<u32>, name: &str| {
            if added && id.is_none() {
                problems.push(problem(
                    ProblemKind::ManifestCounts,
                    Some(MANIFEST_FILE),
                    Some(s),
                    format!("{name} is said to be added but special_tokens.{name} is null"),
                ));
            }
            id.filter(|_| added)
        };
        let eos_id = wanted(manifest.eos_appended, special.eos, "eos");
        let bos_id = wanted(manifest.bos_prepended, special.bos, "bos");
        RecordProbes {
            walk: RecordWalk::new(idx),
            eos_id,
            bos_id,
            current: None,
            started: false,
            bos_done: false,
            eos_done: false,
            eos: Problems::new(problems.cap),
            bos: Problems::new(problems.cap),
        }
    }

    fn check(
        &mut self,
        start: u64,
        tokens: Tokens<'_>,
        s: usize,
        info: &ShardInfo,
    ) -> Result<(), ReadError> {
        if self.eos_id.is_none() && self.bos_id.is_none() {
            return Ok(());
        }
        let end = start + tokens.len() as u64;
        if !self.started {
            self.started = true;
            self.current = self.walk.advance()?;
        }
        while let Some((r, lo, hi)) = self.current {
            let ends = [
                (
                    &mut self.bos_done,
                    self.bos_id,
                    Some(lo),
                    &mut self.bos,
                    ProblemKind::MissingBos,
                ),
                (
                    &mut self.eos_done,
                    self.eos_id,
                    hi.checked_sub(1),
                    &mut self.eos,
                    ProblemKind::MissingEos,
                ),
            ];
            let mut waiting = false;
            for (done, id, pos, problems, kind) in ends {
                let Some(id) = id.filter(|_| !*done) else {
                    *done = true;
                    continue;
                };
                let inside = pos.filter(|&p| p < hi && p >= lo);
                let found = match inside {
                    None => None,
                    Some(p) if p < end => tokens.get((p - start) as usize),
                    Some(_) => {
                        waiting = true;
                        break;
                    }
                };
                *done = true;
                if found != Some(id) {
                    let (name, verb) = match kind {
                        ProblemKind::MissingEos => ("eos", "end"),
                        _ => ("bos", "start"),
                    };
                    let what =
                        found.map_or("the record is empty".to_owned(), |f| format!("found {f}"));
                    let mut p = problem(
                        kind,
                        Some(info.bin.as_str()),
                        Some(s),
                        format!("record does not {verb} with {name} {id}: {what}"),
                    );
                    p.record = Some(r);
                    p.token = pos;
                    problems.push(p);
                }
            }
            if waiting {
                break;
            }
            self.current = self.walk.advance()?;
            self.bos_done = false;
            self.eos_done = false;
        }
        Ok(())
    }
}

/// The rows of a packed shard whose offsets and segment index are sound:
/// pad tokens after the last piece, and, when documents end with eos, eos
/// at the end of every piece followed by another piece or by padding (such
/// a piece ends its document, in both modes).
struct RowProbes<'a> {
    walk: RecordWalk<'a>,
    index: Entries<'a, 8>,
    segments: SegmentCursor<'a>,
    seq_len: u64,
    pad: Option<u32>,
    eos: Option<u32>,
    /// The row being checked: number, first token, pieces, the next piece
    /// whose end is to be looked at, the next padding position (None once
    /// the padding is checked).
    row: Option<(u64, u64)>,
    pieces: Vec<Segment>,
    next_piece: usize,
    next_pad: Option<u64>,
    started: bool,
    previous_entry: u64,
    padding: u64,
    padding_problems: Problems,
    eos_problems: Problems,
}

impl<'a> RowProbes<'a> {
    fn new(
        manifest: &Manifest,
        idx: &'a File,
        seg: &'a File,
        header: &SegHeader,
        cap: usize,
    ) -> RowProbes<'a> {
        let split = header.segments_offset() as u64;
        RowProbes {
            walk: RecordWalk::new(idx),
            index: Entries::new(seg, SEG_HEADER_LEN as u64..split),
            segments: SegmentCursor::new(seg, split),
            seq_len: u64::from(header.seq_len),
            pad: manifest.special_tokens.pad,
            eos: manifest
                .eos_appended
                .then_some(manifest.special_tokens.eos)
                .flatten(),
            row: None,
            pieces: Vec::new(),
            next_piece: 0,
            next_pad: None,
            started: false,
            previous_entry: 0,
            padding: 0,
            padding_problems: Problems::new(cap),
            eos_problems: Problems::new(cap),
        }
    }

    /// Moves to the next row and reads its pieces.
    fn next_row(&mut self) -> Result<(), ReadError> {
        self.row = self.walk.advance()?.map(|(r, lo, _)| (r, lo));
        if self.row.is_none() {
            return Ok(());
        }
        if !self.started {
            self.started = true;
            self.previous_entry = self.index.next_u64()?.unwrap_or(0);
        }
        let hi = self.index.next_u64()?.unwrap_or(self.previous_entry);
        self.pieces = self.segments.read(self.previous_entry..hi)?.to_vec();
        self.previous_entry = hi;
        let used = self.pieces.last().map_or(0, |p| p.end());
        self.padding += self.seq_len - used;
        self.next_piece = 0;
        self.next_pad = Some(used);
        Ok(())
    }

    fn check(
        &mut self,
        start: u64,
        tokens: Tokens<'_>,
        s: usize,
        info: &ShardInfo,
    ) -> Result<(), ReadError> {
        let end = start + tokens.len() as u64;
        let token = |p: u64| tokens.get((p - start) as usize).unwrap_or(0);
        if !self.started {
            self.next_row()?;
        }
        while let Some((r, base)) = self.row {
            // Piece ends, in order.
            while let (Some(eos), Some(piece)) = (self.eos, self.pieces.get(self.next_piece)) {
                let k = self.next_piece;
                let used = self.pieces.last().map_or(0, |p| p.end());
                let ends_document = k + 1 < self.pieces.len() || used < self.seq_len;
                let last = base + piece.end() - 1;
                if !ends_document {
                    self.next_piece += 1;
                    continue;
                }
                if last >= end {
                    return Ok(());
                }
                let found = token(last);
                if found != eos {
                    let mut p = problem(
                        ProblemKind::MissingEos,
                        Some(info.bin.as_str()),
                        Some(s),
                        format!(
                            "piece {k} (document {}) is followed by {} but does not end with eos {eos}: found {found}",
                            piece.doc,
                            if k + 1 < self.pieces.len() { "another piece" } else { "padding" },
                        ),
                    );
                    p.record = Some(r);
                    p.token = Some(last);
                    self.eos_problems.push(p);
                }
                self.next_piece += 1;
            }
            // Padding, up to the first token that is not the pad token.
            while let Some(pos) = self.next_pad.filter(|&pos| pos < self.seq_len) {
                if base + pos >= end {
                    return Ok(());
                }
                let found = token(base + pos);
                if Some(found) != self.pad {
                    let used = self.pieces.last().map_or(0, |p| p.end());
                    let mut p = problem(
                        ProblemKind::Padding,
                        Some(info.bin.as_str()),
                        Some(s),
                        format!(
                            "token {found} at position {pos} follows the last piece (which ends at {used}) but is not the pad token {}",
                            self.pad.map_or("(none)".into(), |p| p.to_string())
                        ),
                    );
                    p.record = Some(r);
                    p.token = Some(base + pos);
                    self.padding_problems.push(p);
                    self.next_pad = None;
                } else {
                    self.next_pad = Some(pos + 1);
                }
            }
            self.next_row()?;
        }
        Ok(())
    }
}

/// The file `name` of the dataset, a file of shard `Ok(s)` or the file
/// `Err(what)` besides the shards; a missing (or, locally, unreadable) one
/// is a problem and `None`. A store's failure is the caller's error.
fn open(
    source: &Files,
    name: &str,
    of: Result<usize, &str>,
    problems: &mut Problems,
) -> Result<Option<File>, ReadError> {
    let s = of.ok();
    match source.open(name) {
        Ok(Some(file)) => Ok(Some(file)),
        Ok(None) => {
            let message = match of {
                Ok(_) => "listed in the manifest but missing".into(),
                Err(what) => format!("{what} is missing"),
            };
            problems.push(problem(ProblemKind::MissingFile, Some(name), s, message));
            Ok(None)
        }
        Err(ReadError::Format(e)) => {
            problems.push(problem(
                ProblemKind::MissingFile,
                Some(name),
                s,
                e.to_string(),
            ));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn verify_checksum(
    file: &File,
    name: &str,
    listed: &str,
    s: Option<usize>,
    problems: &mut Problems,
) -> Result<(), ReadError> {
    verify_digest(file.xxh3()?, name, listed, s, problems);
    Ok(())
}

fn verify_digest(hash: u64, name: &str, listed: &str, s: Option<usize>, problems: &mut Problems) {
    let found = checksum_hex(hash);
    if found != listed {
        problems.push(problem(
            ProblemKind::Checksum,
            Some(name),
            s,
            format!("XXH3 is {found}, the manifest says {listed}"),
        ));
    }
}

/// Scans token ids for values not below `vocab_size`, calling `bad(token
/// offset, id)` for each, offsets counted from `start`.
///
/// Works in blocks: the maximum of a block is cheap to compute (the
/// compiler vectorises it), and only a block whose maximum is too large is
/// looked at token by token.
fn scan_tokens(tokens: Tokens<'_>, start: u64, vocab_size: u64, bad: impl FnMut(u64, u64)) {
    match tokens {
        Tokens::U16(ids) => scan_ids(ids, start, vocab_size, bad),
        Tokens::U32(ids) => scan_ids(ids, start, vocab_size, bad),
    }
}

fn scan_ids<T: Copy + Ord + Default + Into<u64>>(
    ids: &[T],
    start: u64,
    vocab_size: u64,
    mut bad: impl FnMut(u64, u64),
) {
    const BLOCK: usize = 1 << 16;
    let mut base = start;
    for block in ids.chunks(BLOCK) {
        if block.iter().copied().max().unwrap_or_default().into() >= vocab_size {
            for (i, &id) in block.iter().enumerate() {
                if id.into() >= vocab_size {
                    bad(base + i as u64, id.into());
                }
            }
        }
        base += block.len() as u64;
    }
}

/// Format errors start with the file's path; the problem names the file already.
fn strip_path(message: &str, name: &str) -> String {
    message
        .strip_prefix(name)
        .and_then(|m| m.strip_prefix(": "))
        .unwrap_or(message)
        .to_owned()
}
