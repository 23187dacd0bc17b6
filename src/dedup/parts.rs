//! `prep dedup` as independent tasks on many machines: the documents
//! signed by `N` signature tasks, the candidates found by `B` bucket tasks,
//! and the dataset written by one task or by `M` parts for `prep merge`,
//! with the documents the one-machine run removes, document for document.
//!
//! 1. **Signatures**, task `I` of `N` (`--signatures --part I/N`): the
//!    input's records [`Part::range`]`(n)`, signed, their entries sorted by
//!    `(band, key, document)` and written to `WORK/signatures-IIIII/`.
//! 2. **Buckets**, task `J` of `B` (`--buckets --part J/B`): the entries
//!    are placed on one line, entry `(band, key)` at `band · 2⁶⁴ + key`,
//!    and task `J` takes the interval `[J·L/B, (J+1)·L/B)` of its length
//!    `L = bands · 2⁶⁴`. It merges that interval of every signature part
//!    (each part's entries are sorted, so it reads only the chunks that
//!    hold it), and writes for each group of documents sharing a
//!    `(band, key)` the pairs `(document, first document of the group)`
//!    to `WORK/buckets-JJJJJ/`. A group lies in one interval, so no pair is
//!    lost or doubled at a boundary; no task holds more than one chunk of
//!    each part.
//! 3. **Filter** (`prep dedup IN OUT --work WORK`, with `--part K/M` for a
//!    share of the output): the pairs of every bucket task, joined into
//!    clusters by the one-machine run's union-find, and the kept documents
//!    written. The pairs are the one-machine run's candidate groups, each
//!    as a star around its first document, and the clusters depend only on
//!    which documents are joined, so the removed documents are the same.
//!
//! # Files
//!
//! A signature part writes `entries.bin` (the magic `PREPMHSH`, the
//! version as a little-endian u64, then its entries, 24 bytes each:
//! band, key, document, little-endian) and `signatures.json`
//! ([`SignaturesInfo`]), which lists each chunk of [`CHUNK_ENTRIES`]
//! entries with its first `(band, key)` and its XXH3-64: a bucket task
//! finds its interval from the list and checks every chunk it reads.
//! A bucket part writes `pairs.bin` (the magic `PREPMHPR`, the version,
//! then the pairs, 16 bytes each: document, first document) and
//! `buckets.json` ([`BucketsInfo`]) with its XXH3-64, checked whole by the
//! filter. Descriptions are written last; the rules of finished,
//! interrupted and foreign task folders are [`crate::task`]'s.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use super::entries::{self, Entries, Entry, ENTRY_BYTES};
use super::minhash::{MinHasher, Params};
use super::{check_params, DedupError, WORK_FOLDER};
use crate::format::{checksum_hex, Dataset, Files, FormatError, InputInfo, TMP_SUFFIX};
use crate::output::Output;
use crate::partition::Part;
use crate::progress::Progress;
use crate::task::{self, Described};

/// A signature part's description, written last.
pub const SIGNATURES_FILE: &str = "signatures.json";
/// A signature part's entries.
pub const ENTRIES_FILE: &str = "entries.bin";
/// A bucket part's description, written last.
pub const BUCKETS_FILE: &str = "buckets.json";
/// A bucket part's pairs.
pub const PAIRS_FILE: &str = "pairs.bin";
/// The first 8 bytes of [`ENTRIES_FILE`].
const ENTRIES_MAGIC: &[u8; 8] = b"PREPMHSH";
/// The first 8 bytes of [`PAIRS_FILE`].
const PAIRS_MAGIC: &[u8; 8] = b"PREPMHPR";
/// The version of the files this build writes and the newest it reads.
const VERSION: u64 = 1;
/// Bytes before the first entry or pair: magic and version.
const HEADER: u64 = 16;
/// Entries per checked chunk of [`ENTRIES_FILE`] (384 KiB).
pub const CHUNK_ENTRIES: u64 = 1 << 14;
/// Descriptions larger than this are refused before parsing.
const MAX_DESCRIPTION: u64 = 1 << 30;

/// The parameters and input a task was run with, which every task of one
/// job shares and the filter checks against its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Shingles, bands, rows, seed.
    pub params: Params,
    /// The input dataset as the provenance records it.
    pub input: InputInfo,
    /// Records in the input.
    pub n_records: u64,
}

/// One chunk of a signature part's entries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    /// Its first entry's band and key.
    pub first: [u64; 2],
    /// XXH3-64 of its bytes, 16 hex digits.
    pub xxh3: String,
}

/// `signatures.json`: one signature part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignaturesInfo {
    /// Always `"prep-dedup-signatures"`.
    pub format: String,
    /// The version.
    pub version: u64,
    /// The signature job's fingerprint: equal in every part.
    pub job: String,
    /// This part.
    pub part: u64,
    /// Signature parts in the job (`N`).
    pub parts: u64,
    /// What was signed, and how.
    #[serde(flatten)]
    pub of: Job,
    /// This part's first record.
    pub start: u64,
    /// One past its last.
    pub end: u64,
    /// Entries in [`ENTRIES_FILE`].
    pub entries: u64,
    /// The data file, relative to the part's folder.
    pub data: String,
    /// Its size: the header and every entry.
    pub data_bytes: u64,
    /// Every [`CHUNK_ENTRIES`] entries, in order.
    pub chunks: Vec<Chunk>,
}

/// `buckets.json`: one bucket part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BucketsInfo {
    /// Always `"prep-dedup-buckets"`.
    pub format: String,
    /// The version.
    pub version: u64,
    /// The bucket job's fingerprint: equal in every part.
    pub job: String,
    /// This part.
    pub part: u64,
    /// Bucket parts in the job (`B`).
    pub parts: u64,
    /// The signature job it read.
    pub signatures: String,
    /// What was signed, and how.
    #[serde(flatten)]
    pub of: Job,
    /// Pairs in [`PAIRS_FILE`].
    pub pairs: u64,
    /// The data file, relative to the part's folder.
    pub data: String,
    /// Its size: the header and every pair.
    pub data_bytes: u64,
    /// XXH3-64 of the data file, 16 hex digits.
    pub data_xxh3: String,
}

/// The size of a data file the description names, or `None` when missing.
fn data_len(dir: &Path, data: &str) -> Option<u64> {
    let file = Files::new(dir).ok()?.open(data).ok()??;
    Some(file.len())
}

/// What is wrong with a part number, the data file's name or its size.
fn basic_inconsistency(
    part: u64,
    parts: u64,
    data: &str,
    data_bytes: u64,
    expect_bytes: Option<u64>,
) -> Option<String> {
    if Part::new(part, parts).is_none() {
        return Some(format!("part {part} of {parts} does not exist"));
    }
    if !crate::format::is_safe_relative(data) {
        return Some(format!("data file {data:?} is not a plain relative path"));
    }
    if expect_bytes != Some(data_bytes) {
        return Some(format!(
            "its data file's size ({data_bytes} bytes) does not fit its counts"
        ));
    }
    None
}

/// How two jobs' parameters and inputs differ, in words.
fn job_differs(a: &Job, b: &Job, parts: (u64, u64)) -> String {
    let mut what = Vec::new();
    if a.params != b.params {
        what.push(format!("parameters {}, not {}", a.params, b.params));
    }
    if a.input.xxh3 != b.input.xxh3 || a.n_records != b.n_records {
        what.push("another input dataset".to_owned());
    }
    if parts.0 != parts.1 {
        what.push(format!("parts {}, not {}", parts.0, parts.1));
    }
    if what.is_empty() {
        "its prep version differs".into()
    } else {
        what.join(", ")
    }
}

impl Described for SignaturesInfo {
    const PREFIX: &'static str = "signatures";
    const FILE: &'static str = SIGNATURES_FILE;
    const FORMAT: &'static str = "prep-dedup-signatures";
    const VERSION: u64 = VERSION;
    const MAX_BYTES: u64 = MAX_DESCRIPTION;
    const WHAT: &'static str = "signature part";
    const RUN: &'static str = "prep dedup IN --work WORK --signatures";
    const NEXT: &'static str = "find the buckets";

    fn job(&self) -> &str {
        &self.job
    }

    fn part(&self) -> u64 {
        self.part
    }

    fn parts(&self) -> u64 {
        self.parts
    }

    fn inconsistency(&self) -> Option<String> {
        let bytes = self
            .entries
            .checked_mul(ENTRY_BYTES)
            .and_then(|b| b.checked_add(HEADER));
        let why = basic_inconsistency(self.part, self.parts, &self.data, self.data_bytes, bytes);
        if why.is_some() {
            return why;
        }
        let range = Part::new(self.part, self.parts)?.range(self.of.n_records);
        if (self.start, self.end) != (range.start, range.end) {
            return Some(format!(
                "records {}..{}, but part {} of {} records is {}..{}",
                self.start, self.end, self.part, self.of.n_records, range.start, range.end
            ));
        }
        if self.chunks.len() as u64 != self.entries.div_ceil(CHUNK_ENTRIES) {
            return Some(format!(
                "{} chunks for {} entries",
                self.chunks.len(),
                self.entries
            ));
        }
        check_params(&self.of.params).err().map(|e| e.to_string())
    }

    fn intact(&self, dir: &Path) -> bool {
        data_len(dir, &self.data) == Some(self.data_bytes)
    }

    fn differs(&self, first: &SignaturesInfo) -> String {
        job_differs(&self.of, &first.of, (self.parts, first.parts))
    }
}

impl Described for BucketsInfo {
    const PREFIX: &'static str = "buckets";
    const FILE: &'static str = BUCKETS_FILE;
    const FORMAT: &'static str = "prep-dedup-buckets";
    const VERSION: u64 = VERSION;
    const MAX_BYTES: u64 = MAX_DESCRIPTION;
    const WHAT: &'static str = "bucket part";
    const RUN: &'static str = "prep dedup --work WORK --buckets";
    const NEXT: &'static str = "write the dataset";

    fn job(&self) -> &str {
        &self.job
    }

    fn part(&self) -> u64 {
        self.part
    }

    fn parts(&self) -> u64 {
        self.parts
    }

    fn inconsistency(&self) -> Option<String> {
        let bytes = self
            .pairs
            .checked_mul(16)
            .and_then(|b| b.checked_add(HEADER));
        basic_inconsistency(self.part, self.parts, &self.data, self.data_bytes, bytes)
            .or_else(|| check_params(&self.of.params).err().map(|e| e.to_string()))
    }

    fn intact(&self, dir: &Path) -> bool {
        data_len(dir, &self.data) == Some(self.data_bytes)
    }

    fn differs(&self, first: &BucketsInfo) -> String {
        job_differs(&self.of, &first.of, (self.parts, first.parts))
    }
}

/// What one signature or bucket task is asked to do.
#[derive(Debug, Clone)]
pub struct TaskConfig {
    /// The work directory every task shares.
    pub work: PathBuf,
    /// This task's part.
    pub part: Part,
    /// Shingles, bands, rows, seed (signature tasks).
    pub params: Params,
    /// Bytes of entries held before runs are spilled (signature tasks).
    pub memory: u64,
    /// Threads (0: one per core).
    pub threads: usize,
    /// Replace what the task's folder holds.
    pub overwrite: bool,
    /// The user guarantees a single writer ([`crate::run::Writing::single_writer`]).
    pub single_writer: bool,
}

/// What a task did.
#[derive(Debug, Clone)]
pub struct TaskReport {
    /// The task's folder.
    pub dir: PathBuf,
    /// Documents signed, or pairs found.
    pub count: u64,
    /// True when the task was already complete and nothing was done.
    pub already_complete: bool,
    /// Wall time.
    pub elapsed: Duration,
}

/// A task folder's output, started afresh unless it is already finished:
/// `Err(report)` when there is nothing to do.
fn start_task<D: Described>(
    config: &TaskConfig,
    job: &str,
    count: impl Fn(&D) -> u64,
    own: &'static [&'static str],
    progress: &dyn Progress,
    started: Instant,
) -> Result<Result<Output, TaskReport>, DedupError> {
    let dir = task::part_dir::<D>(&config.work, config.part.index);
    let mut output = Output::lock(&dir, config.single_writer)?.owning(own);
    if !config.overwrite {
        if let Some(done) = task::finished_task::<D>(&dir, job, config.part)? {
            progress.note(&format!(
                "this {} is already complete; nothing to do",
                D::WHAT
            ));
            output.progressed();
            return Ok(Err(TaskReport {
                dir,
                count: count(&done),
                already_complete: true,
                elapsed: started.elapsed(),
            }));
        }
    }
    let fingerprint = crate::run::part_fingerprint(job, Some(config.part));
    task::start_afresh::<D>(&mut output, &fingerprint, config.overwrite, &dir)?;
    Ok(Ok(output))
}

/// Runs signature task `config.part` over the documents dataset `input`.
pub fn signatures(
    input: &Path,
    config: &TaskConfig,
    progress: &dyn Progress,
) -> Result<TaskReport, DedupError> {
    let started = Instant::now();
    check_params(&config.params)?;
    let dir = task::part_dir::<SignaturesInfo>(&config.work, config.part.index);
    crate::run::refuse_overlap(&dir, &[input], "the input")?;
    let local = crate::fetch::Local::of(input)?;
    let ds = Dataset::open(local.dir())?;
    crate::run::documents_only("dedup", input, ds.manifest(), "dedup before pack")?;
    let of = Job {
        params: config.params,
        input: InputInfo::of_dataset(input, local.dir(), ds.manifest())?,
        n_records: ds.len(),
    };
    let job = crate::run::job_fingerprint(
        "dedup --signatures",
        &json!({ "params": of.params, "parts": config.part.count }),
        std::slice::from_ref(&of.input),
    );
    let own = &[SIGNATURES_FILE, ENTRIES_FILE];
    let count = |d: &SignaturesInfo| d.end - d.start;
    let output = match start_task(config, &job, count, own, progress, started)? {
        Ok(output) => output,
        Err(done) => return Ok(done),
    };
    let range = config.part.range(ds.len());
    let verified = ds.verified()?;
    let hasher = MinHasher::new(config.params);
    let most = (range.end - range.start) * config.params.bands as u64;
    let mut held = Entries::new(&output.dir().join(WORK_FOLDER), config.memory, most);
    let pool = crate::run::thread_pool(config.threads, "dedup").map_err(DedupError::Threads)?;
    pool.install(|| entries::sign(&verified, &hasher, range.clone(), &mut held, progress))?;

    let path = output.dir().join(ENTRIES_FILE);
    let (count, chunks) = write_entries(&path, held.sorted()?)?;
    output.remove_work_folder(WORK_FOLDER)?;
    let info = SignaturesInfo {
        format: SignaturesInfo::FORMAT.into(),
        version: VERSION,
        job,
        part: config.part.index,
        parts: config.part.count,
        of,
        start: range.start,
        end: range.end,
        entries: count,
        data: ENTRIES_FILE.into(),
        data_bytes: HEADER + count * ENTRY_BYTES,
        chunks,
    };
    commit(output, SIGNATURES_FILE, &info)?;
    progress.finish();
    Ok(TaskReport {
        dir,
        count: range.end - range.start,
        already_complete: false,
        elapsed: started.elapsed(),
    })
}

/// Writes a description last, completing the task's folder.
fn commit<T: Serialize>(output: Output, name: &str, info: &T) -> Result<(), DedupError> {
    let mut json = serde_json::to_string_pretty(info).expect("a description serializes");
    json.push('\n');
    output.commit_file(name, json.as_bytes())?;
    Ok(())
}

/// Writes the sorted entries to `path` (through a temporary name), chunk
/// by chunk; returns the count and the chunks.
fn write_entries(
    path: &Path,
    sorted: impl Iterator<Item = Result<Entry, FormatError>>,
) -> Result<(u64, Vec<Chunk>), FormatError> {
    let tmp = PathBuf::from(format!("{}{TMP_SUFFIX}", path.display()));
    let io = |e| FormatError::io(&tmp, e);
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp).map_err(io)?);
    w.write_all(ENTRIES_MAGIC).map_err(io)?;
    w.write_all(&VERSION.to_le_bytes()).map_err(io)?;
    let (mut count, mut chunks) = (0u64, Vec::new());
    let mut hash = Xxh3::new();
    let mut first = [0u64; 2];
    let mut bytes = Vec::with_capacity(ENTRY_BYTES as usize);
    for e in sorted {
        let e = e?;
        if count.is_multiple_of(CHUNK_ENTRIES) {
            if count > 0 {
                chunks.push(Chunk {
                    first,
                    xxh3: checksum_hex(hash.digest()),
                });
            }
            hash = Xxh3::new();
            first = [e[0], e[1]];
        }
        bytes.clear();
        entries::encode(&e, &mut bytes);
        hash.update(&bytes);
        w.write_all(&bytes).map_err(io)?;
        count += 1;
    }
    if count > 0 {
        chunks.push(Chunk {
            first,
            xxh3: checksum_hex(hash.digest()),
        });
    }
    w.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| FormatError::io(path, e))?;
    Ok((count, chunks))
}

/// An entry's place on the bucket tasks' line: `band · 2⁶⁴ + key`.
fn position(band: u64, key: u64) -> u128 {
    (u128::from(band) << 64) | u128::from(key)
}

/// Bucket task `part`'s interval of the line of `bands` bands.
fn interval(part: Part, bands: u64) -> std::ops::Range<u128> {
    let length = u128::from(bands) << 64;
    let at = |i: u64| {
        // i * length / count without overflow: length < 2^77, count < 2^64.
        let (q, r) = (
            length / u128::from(part.count),
            length % u128::from(part.count),
        );
        q * u128::from(i) + r * u128::from(i) / u128::from(part.count)
    };
    at(part.index)..at(part.index + 1)
}

/// A signature part's entries in an interval of the line, each chunk read
/// checked against its XXH3 first.
struct PartEntries {
    path: PathBuf,
    file: crate::format::File,
    info: SignaturesInfo,
    range: std::ops::Range<u128>,
    chunk: usize,
    held: std::vec::IntoIter<Entry>,
}

impl PartEntries {
    fn open(
        dir: &Path,
        info: SignaturesInfo,
        range: std::ops::Range<u128>,
    ) -> Result<PartEntries, DedupError> {
        let source = Files::new(dir)?;
        let path = source.path_of(&info.data);
        let file = source.open_required(&info.data)?;
        if file.len() != info.data_bytes {
            return Err(corrupt(&path, &info, "its size is not the one described"));
        }
        let header = file.read(0..HEADER)?;
        if &header[..8] != ENTRIES_MAGIC {
            return Err(corrupt(&path, &info, "it does not start with PREPMHSH"));
        }
        // The last chunk that starts at or before the interval.
        let chunk = info
            .chunks
            .partition_point(|c| position(c.first[0], c.first[1]) <= range.start)
            .saturating_sub(1);
        Ok(PartEntries {
            path,
            file,
            info,
            range,
            chunk,
            held: Vec::new().into_iter(),
        })
    }

    /// Reads and checks the next chunk; `false` past the interval.
    fn next_chunk(&mut self) -> Result<bool, DedupError> {
        let Some(c) = self.info.chunks.get(self.chunk) else {
            return Ok(false);
        };
        if position(c.first[0], c.first[1]) >= self.range.end {
            return Ok(false);
        }
        let first = self.chunk as u64 * CHUNK_ENTRIES;
        let n = CHUNK_ENTRIES.min(self.info.entries - first);
        let at = HEADER + first * ENTRY_BYTES;
        let bytes = self.file.read(at..at + n * ENTRY_BYTES)?;
        if checksum_hex(xxh3_64(&bytes)) != c.xxh3 {
            let why = format!("chunk {} does not have the XXH3 described", self.chunk);
            return Err(corrupt(&self.path, &self.info, &why));
        }
        let range = self.range.clone();
        let entries: Vec<Entry> = bytes
            .chunks_exact(ENTRY_BYTES as usize)
            .map(entries::decode)
            .filter(|e| range.contains(&position(e[0], e[1])))
            .collect();
        self.held = entries.into_iter();
        self.chunk += 1;
        Ok(true)
    }
}

impl Iterator for PartEntries {
    type Item = Result<Entry, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(e) = self.held.next() {
                return Some(Ok(e));
            }
            match self.next_chunk() {
                Ok(true) => {}
                Ok(false) => return None,
                Err(DedupError::Format(e)) => return Some(Err(e)),
                Err(e) => {
                    return Some(Err(FormatError::Mismatch {
                        path: self.path.clone(),
                        message: e.to_string(),
                    }))
                }
            }
        }
    }
}

/// A damaged signature part's data file.
fn corrupt(path: &Path, info: &SignaturesInfo, why: &str) -> DedupError {
    DedupError::Format(FormatError::Mismatch {
        path: path.into(),
        message: format!(
            "{why}: the file is damaged; run signature part {}/{} again (with --overwrite)",
            info.part, info.parts
        ),
    })
}

/// Runs bucket task `config.part` over the signature parts in the work
/// directory.
pub fn buckets(config: &TaskConfig, progress: &dyn Progress) -> Result<TaskReport, DedupError> {
    let started = Instant::now();
    let parts = task::read_parts::<SignaturesInfo>(&config.work)?;
    let first = parts[0].1.clone();
    let job = crate::run::job_fingerprint(
        "dedup --buckets",
        &json!({ "signatures": first.job, "buckets": config.part.count }),
        &[],
    );
    let own = &[BUCKETS_FILE, PAIRS_FILE];
    let output = match start_task(
        config,
        &job,
        |d: &BucketsInfo| d.pairs,
        own,
        progress,
        started,
    )? {
        Ok(output) => output,
        Err(done) => return Ok(done),
    };
    let range = interval(config.part, first.of.params.bands as u64);
    let mut sources = Vec::with_capacity(parts.len());
    for (dir, info) in parts {
        sources.push(PartEntries::open(&dir, info, range.clone())?);
    }
    let path = output.dir().join(PAIRS_FILE);
    let tmp = PathBuf::from(format!("{}{TMP_SUFFIX}", path.display()));
    let io = |e| FormatError::io(&tmp, e);
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp).map_err(io)?);
    let mut hash = Xxh3::new();
    let mut header = ENTRIES_MAGIC.to_vec();
    header[..8].copy_from_slice(PAIRS_MAGIC);
    header.extend_from_slice(&VERSION.to_le_bytes());
    hash.update(&header);
    w.write_all(&header).map_err(io)?;
    let (mut pairs, mut failed) = (0u64, None);
    entries::for_each_group(entries::Merged::new(sources)?, |group| {
        for &doc in &group[1..] {
            let mut pair = [0u8; 16];
            pair[..8].copy_from_slice(&doc.to_le_bytes());
            pair[8..].copy_from_slice(&group[0].to_le_bytes());
            hash.update(&pair);
            if let Err(e) = w.write_all(&pair) {
                failed.get_or_insert(e);
            }
            pairs += 1;
        }
    })?;
    if let Some(e) = failed {
        return Err(io(e).into());
    }
    w.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(|e| FormatError::io(&path, e))?;
    let info = BucketsInfo {
        format: BucketsInfo::FORMAT.into(),
        version: VERSION,
        job,
        part: config.part.index,
        parts: config.part.count,
        signatures: first.job,
        of: first.of,
        pairs,
        data: PAIRS_FILE.into(),
        data_bytes: HEADER + 16 * pairs,
        data_xxh3: checksum_hex(hash.digest()),
    };
    commit(output, BUCKETS_FILE, &info)?;
    progress.finish();
    Ok(TaskReport {
        dir: task::part_dir::<BucketsInfo>(&config.work, config.part.index),
        count: pairs,
        already_complete: false,
        elapsed: started.elapsed(),
    })
}

/// Calls `f` with every pair `(document, first document)` of every bucket
/// part in `work`, each part's data checked whole first; refuses a work
/// directory made from another input or with other parameters than `of`.
pub fn read_pairs(work: &Path, of: &Job, mut f: impl FnMut(u64, u64)) -> Result<(), DedupError> {
    for (dir, info) in task::read_parts::<BucketsInfo>(work)? {
        let source = Files::new(&dir)?;
        let path = source.path_of(&info.data);
        if info.of.params != of.params
            || info.of.input.xxh3 != of.input.xxh3
            || info.of.n_records != of.n_records
        {
            return Err(DedupError::OtherWork {
                path: dir.join(BUCKETS_FILE),
                why: job_differs(&info.of, of, (0, 0)),
            });
        }
        let file = source.open_required(&info.data)?;
        let bytes = file.read(0..file.len())?;
        let damaged = |why: &str| {
            DedupError::Format(FormatError::Mismatch {
                path: path.clone(),
                message: format!(
                    "{why}: the file is damaged; run bucket part {}/{} again (with --overwrite)",
                    info.part, info.parts
                ),
            })
        };
        if bytes.len() as u64 != info.data_bytes || !bytes.starts_with(PAIRS_MAGIC) {
            return Err(damaged("its size or header is not the one described"));
        }
        if checksum_hex(xxh3_64(&bytes)) != info.data_xxh3 {
            return Err(damaged("its XXH3 is not the one described"));
        }
        let word = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
        for pair in bytes[HEADER as usize..].chunks_exact(16) {
            let (doc, first) = (word(&pair[..8]), word(&pair[8..]));
            if doc >= of.n_records || first >= doc {
                return Err(damaged("a pair names records out of order or range"));
            }
            f(doc, first);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_intervals_tile_the_line() {
        for bands in [1u64, 14, 20] {
            for count in [1u64, 2, 3, 7, 100] {
                let mut at = 0u128;
                for index in 0..count {
                    let r = interval(Part::new(index, count).unwrap(), bands);
                    assert_eq!(r.start, at);
                    at = r.end;
                }
                assert_eq!(at, u128::from(bands) << 64);
            }
        }
    }
}
