//! `prep validate`: everything a reader relies on, checked in one pass per
//! file, shards in parallel, with every problem reported (capped per kind).
//!
//! The checks share their primitives with the reader ([`IdxHeader::parse`],
//! [`offset_violations`], [`Manifest::consistency_problems`]), so what
//! `validate` accepts the reader opens, and what the reader refuses
//! `validate` reports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use crate::format::{
    checksum_hex, offset_violations, segment_violations, Dtype, FormatError, IdxHeader, Manifest,
    SegHeader, ShardInfo, FORMAT_VERSION, IDX_HEADER_LEN, MANIFEST_FILE, SEG_HEADER_LEN,
};

/// The manifest schema, compiled into the binary so `validate` needs no files beside it.
pub const MANIFEST_SCHEMA: &str = include_str!("../schemas/manifest.schema.json");

/// What `prep validate` is asked to do.
#[derive(Debug, Clone)]
pub struct ValidateConfig {
    /// The dataset directory.
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
    /// The manifest could not be read from disk.
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
    /// A file that looks like a shard is not listed.
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
}

impl Problems {
    fn new(cap: usize) -> Problems {
        Problems {
            cap,
            listed: Vec::new(),
            counts: BTreeMap::new(),
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
        message,
    }
}

/// Runs every check on the dataset in `config.dir`.
///
/// Returns a report (valid or not) whenever the manifest could be read as
/// JSON of a known version; an error only when there is nothing to check.
pub fn validate(config: &ValidateConfig) -> Result<Report, ValidateError> {
    let started = Instant::now();
    let dir = &config.dir;
    if !dir.is_dir() {
        return Err(ValidateError::NoDirectory(dir.clone()));
    }
    let mut problems = Problems::new(config.max_per_kind.max(1));
    let Some(manifest) = read_manifest(dir, &mut problems)? else {
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
    unlisted_files(dir, &manifest, &mut problems);
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
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| ValidateError::Threads(e.to_string()))?;
    let cap = problems.cap;
    let results: Vec<(Problems, Checked, Pieces)> = pool.install(|| {
        manifest
            .shards
            .par_iter()
            .enumerate()
            .map(|(s, shard)| check_shard(dir, &manifest, s, shard, config.quick, cap))
            .collect()
    });
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
    checked.bytes += check_tokenizer(dir, &manifest, config.quick, &mut problems);
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
        match (&shard.seg, shard.seg_bytes, &shard.seg_xxh3) {
            (Some(name), Some(_), Some(_)) => {
                if !crate::format::is_safe_relative(name) {
                    out.push(format!(
                        "shard {i}: path {name:?} is not a plain relative path"
                    ));
                }
            }
            _ => out.push(format!(
                "shard {i}: a packed shard needs seg, seg_bytes and seg_xxh3"
            )),
        }
    }
    out
}

/// Reads the manifest, reports schema problems, and parses it if it can be.
///
/// Missing, unreadable, not JSON, or of a newer version: an error (nothing
/// to check). Not of the schema's shape: problems, and `None`.
fn read_manifest(dir: &Path, problems: &mut Problems) -> Result<Option<Manifest>, ValidateError> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(FormatError::NoManifest { dir: dir.into() }.into())
        }
        Err(e) => return Err(FormatError::Io { path, source: e }.into()),
    };
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| FormatError::BadManifest {
            path: path.clone(),
            message: format!("not JSON: {e}"),
        })?;
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

/// Files under `dir` that look like shards (`.bin`, `.idx`, or their `.tmp`
/// forms) but are not listed. A partial dataset's record hashes count as
/// listed; so do the files of the parts a merged dataset names (a shard that
/// `--dedup` rewrote without some records leaves the part's own in place).
fn unlisted_files(dir: &Path, manifest: &Manifest, problems: &mut Problems) {
    let mut hashes = Vec::new();
    if let Some(h) = manifest.partition.as_ref().and_then(|p| p.hashes.as_ref()) {
        hashes.push(h.file.clone());
    }
    for part in &manifest.provenance.merged {
        let Ok(m) = Manifest::read(&dir.join(&part.path)) else {
            continue;
        };
        let files = m
            .shards
            .iter()
            .flat_map(|s| [Some(&s.bin), Some(&s.idx), s.seg.as_ref()]);
        let own_hashes = m
            .partition
            .as_ref()
            .and_then(|p| p.hashes.as_ref())
            .map(|h| &h.file);
        for file in files.flatten().chain(own_hashes) {
            hashes.push(format!("{}/{file}", part.path));
        }
    }
    let listed: BTreeSet<&str> = manifest
        .shards
        .iter()
        .flat_map(|s| [Some(s.bin.as_str()), Some(s.idx.as_str()), s.seg.as_deref()])
        .flatten()
        .chain(hashes.iter().map(String::as_str))
        .collect();
    let mut found = Vec::new();
    walk(dir, dir, &mut found);
    found.sort();
    for rel in found {
        let looks_like_shard = [".bin", ".idx", ".seg", ".bin.tmp", ".idx.tmp", ".seg.tmp"]
            .iter()
            .any(|ext| rel.ends_with(ext));
        if looks_like_shard && !listed.contains(rel.as_str()) {
            problems.push(problem(
                ProblemKind::UnlistedFile,
                Some(&rel),
                None,
                "looks like a shard file but the manifest does not list it".into(),
            ));
        }
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            walk(root, &path, out);
        } else if let Ok(rel) = path.strip_prefix(root) {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The tokenizer copy, when the manifest names one: present, and its checksum.
fn check_tokenizer(dir: &Path, manifest: &Manifest, quick: bool, problems: &mut Problems) -> u64 {
    let Some(file) = &manifest.tokenizer.file else {
        return 0;
    };
    if !crate::format::is_safe_relative(file) {
        problems.push(problem(
            ProblemKind::ManifestCounts,
            Some(MANIFEST_FILE),
            None,
            format!("tokenizer path {file:?} is not a plain relative path"),
        ));
        return 0;
    }
    let path = dir.join(file);
    if !path.is_file() {
        problems.push(problem(
            ProblemKind::MissingFile,
            Some(file),
            None,
            "the tokenizer copy is missing".into(),
        ));
        return 0;
    }
    if quick {
        return 0;
    }
    match crate::format::hash_file(&path) {
        Ok((hash, len)) => {
            let found = checksum_hex(hash);
            if found != manifest.tokenizer.xxh3 {
                problems.push(problem(
                    ProblemKind::Checksum,
                    Some(file),
                    None,
                    format!(
                        "XXH3 is {found}, the manifest says {}",
                        manifest.tokenizer.xxh3
                    ),
                ));
            }
            len
        }
        Err(e) => {
            problems.push(problem(
                ProblemKind::MissingFile,
                Some(file),
                None,
                e.to_string(),
            ));
            0
        }
    }
}

/// Every check of one shard. Files are mapped and each is read once: the
/// checksum and the token scan share the pass over the `.bin`.
fn check_shard(
    dir: &Path,
    manifest: &Manifest,
    s: usize,
    info: &ShardInfo,
    quick: bool,
    cap: usize,
) -> (Problems, Checked, Pieces) {
    let mut problems = Problems::new(cap);
    let mut checked = Checked::default();
    let packed = manifest.kind == "packed";
    let mut pieces = Pieces {
        complete: false,
        ..Pieces::default()
    };
    if !crate::format::is_safe_relative(&info.bin) || !crate::format::is_safe_relative(&info.idx) {
        return (problems, checked, pieces); // reported with the manifest's consistency problems
    }
    let at = |kind, file: &str, message: String| problem(kind, Some(file), Some(s), message);
    let dtype = manifest.dtype;
    let expected_bin = info.n_tokens.checked_mul(dtype.size() as u64);
    if expected_bin != Some(info.bin_bytes) {
        problems.push(at(
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
    let (Some(bin), Some(idx)) = (
        open(dir, &info.bin, s, &mut problems),
        open(dir, &info.idx, s, &mut problems),
    ) else {
        return (problems, checked, pieces);
    };
    for (name, map, listed) in [
        (&info.bin, &bin, info.bin_bytes),
        (&info.idx, &idx, info.idx_bytes),
    ] {
        let len = map.bytes().len() as u64;
        if len != listed {
            problems.push(at(
                ProblemKind::FileSize,
                name,
                format!("{len} bytes, the manifest says {listed}"),
            ));
        }
    }

    // The index: header, agreement with the manifest and the .bin, offsets.
    let idx_bytes = idx.bytes();
    checked.bytes += idx_bytes.len() as u64;
    if !quick {
        verify_checksum(idx_bytes, &info.idx, &info.idx_xxh3, s, &mut problems);
    }
    let header = match IdxHeader::parse(Path::new(&info.idx), idx_bytes) {
        Ok(h) => Some(h),
        Err(e) => {
            problems.push(at(
                ProblemKind::IdxHeader,
                &info.idx,
                strip_path(&e.to_string(), &info.idx),
            ));
            None
        }
    };
    let bin_bytes = bin.bytes();
    checked.bytes += bin_bytes.len() as u64;
    let mut offsets: Option<&[u64]> = None;
    if let Some(h) = header {
        if h.dtype != dtype {
            problems.push(at(
                ProblemKind::DtypeMismatch,
                &info.idx,
                format!("header says {} but the manifest says {dtype}", h.dtype),
            ));
        }
        if h.n_records != info.n_records || h.n_tokens != info.n_tokens {
            problems.push(at(
                ProblemKind::CountMismatch,
                &info.idx,
                format!(
                    "header has {} records and {} tokens, the manifest lists {} and {}",
                    h.n_records, h.n_tokens, info.n_records, info.n_tokens
                ),
            ));
        }
        let needed = h.n_tokens.checked_mul(h.dtype.size() as u64);
        if needed != Some(bin_bytes.len() as u64) {
            problems.push(at(
                ProblemKind::BinSize,
                &info.bin,
                format!(
                    "{} bytes, but the index's {} tokens of {} take {}",
                    bin_bytes.len(),
                    h.n_tokens,
                    h.dtype,
                    needed.map_or("more than a u64".into(), |b| b.to_string())
                ),
            ));
        }
        let view = crate::format::mmap_cast_u64(&idx_bytes[IDX_HEADER_LEN..]);
        if let Some(view) = view {
            let mut any = false;
            for v in offset_violations(view, h.n_tokens) {
                any = true;
                let mut p = at(
                    ProblemKind::Offsets,
                    &info.idx,
                    format!("offsets[{}] = {}: {}", v.position, v.found, v.expected),
                );
                p.record = Some(v.position);
                problems.push(p);
            }
            // Per-record checks need offsets that are sound and inside the .bin.
            let bin_tokens = bin_bytes.len() as u64 / dtype.size() as u64;
            if !any && h.dtype == dtype && h.n_tokens <= bin_tokens {
                offsets = Some(view);
            }
        }
    }

    // The .bin: checksum and token ids in one pass.
    if !quick {
        verify_checksum(bin_bytes, &info.bin, &info.bin_xxh3, s, &mut problems);
    }
    let whole = bin_bytes.len() - bin_bytes.len() % dtype.size();
    let tokens = scan_tokens(
        &bin_bytes[..whole],
        dtype,
        manifest.vocab_size,
        |token, id| {
            let mut p = at(
                ProblemKind::TokenOutOfRange,
                &info.bin,
                format!(
                    "token id {id} is not below vocab_size {}",
                    manifest.vocab_size
                ),
            );
            p.token = Some(token);
            p.record = offsets.map(|o| record_of(o, token));
            problems.push(p);
        },
    );
    checked.tokens += tokens;

    if let (true, Some(offsets)) = (packed, offsets) {
        checked.records += offsets.len() as u64 - 1;
        pieces = check_packed(
            dir,
            manifest,
            s,
            info,
            offsets,
            bin_bytes,
            quick,
            &mut problems,
        );
    } else if let Some(offsets) = offsets {
        checked.records += offsets.len() as u64 - 1;
        let special = &manifest.special_tokens;
        let checks = [
            (
                manifest.eos_appended,
                special.eos,
                ProblemKind::MissingEos,
                "eos",
            ),
            (
                manifest.bos_prepended,
                special.bos,
                ProblemKind::MissingBos,
                "bos",
            ),
        ];
        for (wanted, id, kind, name) in checks {
            if !wanted {
                continue;
            }
            let Some(id) = id else {
                problems.push(at(
                    ProblemKind::ManifestCounts,
                    MANIFEST_FILE,
                    format!("{name} is said to be added but special_tokens.{name} is null"),
                ));
                continue;
            };
            for (r, w) in offsets.windows(2).enumerate() {
                let (lo, hi) = (w[0], w[1]);
                let pos = if kind == ProblemKind::MissingEos {
                    hi.checked_sub(1)
                } else {
                    Some(lo)
                };
                let found = pos
                    .filter(|&p| p < hi && p >= lo)
                    .map(|p| token_at(bin_bytes, dtype, p));
                if found != Some(id) {
                    let what =
                        found.map_or("the record is empty".to_owned(), |f| format!("found {f}"));
                    let mut p = at(
                        kind,
                        &info.bin,
                        format!(
                            "record does not {} with {name} {id}: {what}",
                            if kind == ProblemKind::MissingEos {
                                "end"
                            } else {
                                "start"
                            }
                        ),
                    );
                    p.record = Some(r as u64);
                    p.token = pos;
                    problems.push(p);
                }
            }
        }
    }
    (problems, checked, pieces)
}

/// The checks of a packed shard whose offsets are sound: rows of `seq_len`;
/// a segment index that matches the shard, whose pieces tile each row from
/// position 0; pad tokens after the last piece; and, when documents end
/// with eos, eos at the end of every piece followed by another piece or by
/// padding (such a piece ends its document, in both modes).
#[allow(clippy::too_many_arguments)]
fn check_packed(
    dir: &Path,
    manifest: &Manifest,
    s: usize,
    info: &ShardInfo,
    offsets: &[u64],
    bin: &[u8],
    quick: bool,
    problems: &mut Problems,
) -> Pieces {
    let mut counts = Pieces {
        complete: false,
        ..Pieces::default()
    };
    let at = |kind, file: &str, record: Option<u64>, message: String| {
        let mut p = problem(kind, Some(file), Some(s), message);
        p.record = record;
        p
    };
    let Some(l) = manifest
        .seq_len
        .filter(|&l| l > 0 && l <= u64::from(u32::MAX))
    else {
        return counts; // reported with the manifest
    };
    for (r, w) in offsets.windows(2).enumerate() {
        if w[1] - w[0] != l {
            problems.push(at(
                ProblemKind::RowLength,
                &info.bin,
                Some(r as u64),
                format!("row of {} tokens, seq_len is {l}", w[1] - w[0]),
            ));
        }
    }
    let Some(name) = info
        .seg
        .as_deref()
        .filter(|n| crate::format::is_safe_relative(n))
    else {
        return counts; // reported with the manifest
    };
    let Some(map) = open(dir, name, s, problems) else {
        return counts;
    };
    let bytes = map.bytes();
    if Some(bytes.len() as u64) != info.seg_bytes {
        problems.push(at(
            ProblemKind::FileSize,
            name,
            None,
            format!(
                "{} bytes, the manifest says {}",
                bytes.len(),
                info.seg_bytes.map_or("nothing".into(), |b| b.to_string())
            ),
        ));
    }
    if !quick {
        verify_checksum(
            bytes,
            name,
            info.seg_xxh3.as_deref().unwrap_or(""),
            s,
            problems,
        );
    }
    let header = match SegHeader::parse(Path::new(name), bytes) {
        Ok(h) => h,
        Err(e) => {
            problems.push(at(
                ProblemKind::Segments,
                name,
                None,
                strip_path(&e.to_string(), name),
            ));
            return counts;
        }
    };
    let rows = offsets.len() as u64 - 1;
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
        return counts;
    }
    let split = header.segments_offset();
    let (Some(row_index), Some(segments)) = (
        crate::format::mmap_cast_u64(&bytes[SEG_HEADER_LEN..split]),
        crate::format::mmap_cast_segments(&bytes[split..]),
    ) else {
        problems.push(at(
            ProblemKind::Segments,
            name,
            None,
            "not aligned in memory".into(),
        ));
        return counts;
    };
    let mut sound = true;
    for (r, message) in segment_violations(row_index, segments, header.seq_len) {
        sound = false;
        problems.push(at(ProblemKind::Segments, name, Some(r), message));
    }
    if !sound {
        return counts;
    }
    let dtype = manifest.dtype;
    let pad = manifest.special_tokens.pad;
    let eos = manifest
        .eos_appended
        .then_some(manifest.special_tokens.eos)
        .flatten();
    for (r, w) in row_index.windows(2).enumerate() {
        let row = &segments[w[0] as usize..w[1] as usize];
        let base = offsets[r];
        let used = row.last().map_or(0, |p| p.end());
        counts.padding += l - used;
        for pos in used..l {
            let found = token_at(bin, dtype, base + pos);
            if Some(found) != pad {
                let mut p = at(
                    ProblemKind::Padding,
                    &info.bin,
                    Some(r as u64),
                    format!(
                        "token {found} at position {pos} follows the last piece (which ends at {used}) but is not the pad token {}",
                        pad.map_or("(none)".into(), |p| p.to_string())
                    ),
                );
                p.token = Some(base + pos);
                problems.push(p);
                break;
            }
        }
        if let Some(eos) = eos {
            for (k, piece) in row.iter().enumerate() {
                let ends_document = k + 1 < row.len() || used < l;
                let last = base + piece.end() - 1;
                if ends_document && token_at(bin, dtype, last) != eos {
                    let mut p = at(
                        ProblemKind::MissingEos,
                        &info.bin,
                        Some(r as u64),
                        format!(
                            "piece {k} (document {}) is followed by {} but does not end with eos {eos}: found {}",
                            piece.doc,
                            if k + 1 < row.len() { "another piece" } else { "padding" },
                            token_at(bin, dtype, last)
                        ),
                    );
                    p.token = Some(last);
                    problems.push(p);
                }
            }
        }
    }
    counts.segments = segments.len() as u64;
    counts.complete = true;
    counts
}

fn open(
    dir: &Path,
    name: &str,
    s: usize,
    problems: &mut Problems,
) -> Option<crate::format::MappedFile> {
    match crate::format::MappedFile::open(&dir.join(name)) {
        Ok(m) => Some(m),
        Err(FormatError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            problems.push(problem(
                ProblemKind::MissingFile,
                Some(name),
                Some(s),
                "listed in the manifest but missing".into(),
            ));
            None
        }
        Err(e) => {
            problems.push(problem(
                ProblemKind::MissingFile,
                Some(name),
                Some(s),
                e.to_string(),
            ));
            None
        }
    }
}

fn verify_checksum(bytes: &[u8], name: &str, listed: &str, s: usize, problems: &mut Problems) {
    let found = checksum_hex(xxhash_rust::xxh3::xxh3_64(bytes));
    if found != listed {
        problems.push(problem(
            ProblemKind::Checksum,
            Some(name),
            Some(s),
            format!("XXH3 is {found}, the manifest says {listed}"),
        ));
    }
}

/// Scans token ids for values not below `vocab_size`, calling `bad(token
/// offset, id)` for each; returns the number of tokens.
///
/// Works in blocks: the maximum of a block is cheap to compute (the
/// compiler vectorises it), and only a block whose maximum is too large is
/// looked at token by token.
fn scan_tokens(bytes: &[u8], dtype: Dtype, vocab_size: u64, bad: impl FnMut(u64, u64)) -> u64 {
    match dtype {
        Dtype::U16 => scan_ids(
            crate::format::mmap_cast_u16(bytes).expect("mapped files are page-aligned"),
            vocab_size,
            bad,
        ),
        Dtype::U32 => scan_ids(
            crate::format::mmap_cast_u32(bytes).expect("mapped files are page-aligned"),
            vocab_size,
            bad,
        ),
    }
}

fn scan_ids<T: Copy + Ord + Default + Into<u64>>(
    ids: &[T],
    vocab_size: u64,
    mut bad: impl FnMut(u64, u64),
) -> u64 {
    const BLOCK: usize = 1 << 16;
    let mut base = 0u64;
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
    ids.len() as u64
}

/// The record holding token offset `token`, given sound offsets.
fn record_of(offsets: &[u64], token: u64) -> u64 {
    (offsets.partition_point(|&o| o <= token) as u64).saturating_sub(1)
}

fn token_at(bytes: &[u8], dtype: Dtype, token: u64) -> u32 {
    let i = token as usize * dtype.size();
    match dtype {
        Dtype::U16 => u32::from(u16::from_le_bytes([bytes[i], bytes[i + 1]])),
        Dtype::U32 => u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]),
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
