//! `prep dedup`: near-duplicate documents removed from a documents dataset
//! by MinHash over token shingles, with a report of every removal.
//!
//! # Why a stage of its own
//!
//! A near-duplicate is only known once every document has been seen: a
//! document can be removed for one that comes a terabyte later. So this is
//! a stage over the tokenized dataset rather than a mode of `tokenize`: it
//! reads the tokens `tokenize` wrote (through their checksums), composes
//! with `tokenize --dedup` (exact duplicates first, cheaply, then near
//! ones), and runs on any documents dataset without tokenizing again.
//!
//! # The rule
//!
//! 1. **Signatures** ([`minhash`]): each document's MinHash signature over
//!    its `n`-token shingles, cut into `bands` band keys.
//! 2. **Candidates**: the entries `(band, key, document)` of every
//!    document, sorted (in memory, or in sorted runs spilled to
//!    `OUT/.dedup-tmp` when they exceed `--memory`, then merged). Documents
//!    with an equal `(band, key)` are candidates.
//! 3. **Clusters**: the connected components of the candidate pairs
//!    (union-find). In each, the document with the smallest record index is
//!    kept, and every other one is removed as a duplicate of it.
//!
//! The clusters are a function of the input and the parameters alone: the
//! entries are unique (one per band and document), so their sorted order,
//! and the components, do not depend on `--memory` or `--threads`.
//!
//! # Output
//!
//! `OUT` is the kept documents, in the input's order, as a documents
//! dataset, and `OUT/duplicates.jsonl` ([`REPORT_FILE`]) lists every
//! removed document, one line each in increasing record index:
//! `{"doc": 7, "kept": 2}`, both record indices of the input. The manifest
//! lists the report (`provenance.report`, with its size and XXH3), and its
//! `documents.deduplicated` counts the removed documents.
//!
//! # Resume
//!
//! Once the clusters are made, the removed documents are saved in the work
//! folder and their checksum in the journal: a run stopped after that
//! resumes writing from its last completed shard without signing anything
//! again; one stopped before signs again from the start.
//!
//! # Memory
//!
//! The entries take 24 bytes per band per document; at most `--memory` of
//! them are held, the rest spilled in sorted runs. The clusters hold 16
//! bytes or so per document that has a candidate (not per document).

pub mod minhash;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::json;
use xxhash_rust::xxh3::xxh3_64;

use crate::format::{
    checksum_hex, Dataset, DatasetWriter, DocumentCounts, FileInfo, FormatError, InputInfo,
    Manifest, Tokens, Verified,
};
use crate::output::{Done, Output, OutputError, Start};
use crate::progress::{Progress, ProgressSnapshot};
use crate::run::Writing;
pub use minhash::{candidate_probability, MinHasher, Params};

/// The report of removed documents inside the output dataset.
pub const REPORT_FILE: &str = "duplicates.jsonl";
/// The working folder inside the output: spilled runs, the removed list.
pub const WORK_FOLDER: &str = crate::output::WORK_FOLDERS[2];
/// The removed documents inside [`WORK_FOLDER`], once the clusters are made.
const REMOVED_FILE: &str = "removed.bin";
/// Bytes of one entry: band, key, document.
const ENTRY_BYTES: u64 = 24;
/// Documents signed per parallel batch.
const BATCH: u64 = 4096;
/// The fewest entries held before a run is spilled, whatever `--memory`.
const MIN_ENTRIES: u64 = 1 << 12;
/// Signature values at most: `bands * rows`.
const MAX_HASHES: usize = 4096;

/// What `prep dedup` is asked to do.
#[derive(Debug, Clone)]
pub struct DedupConfig {
    /// The documents dataset to deduplicate.
    pub input: PathBuf,
    /// The dataset of kept documents.
    pub output: PathBuf,
    /// Shingles, bands, rows and seed.
    pub params: Params,
    /// Bytes of entries held before they are spilled in sorted runs.
    pub memory: u64,
    /// Threads that sign documents (0: one per core).
    pub threads: usize,
    /// Shard size and whether to replace what the output holds.
    pub writing: Writing,
}

impl DedupConfig {
    /// A config with the CLI's defaults: datatrove's parameters, 1 GiB of
    /// entries, a thread per core, 1 GiB shards.
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>) -> DedupConfig {
        DedupConfig {
            input: input.into(),
            output: output.into(),
            params: Params::default(),
            memory: 1 << 30,
            threads: 0,
            writing: Writing::default(),
        }
    }
}

/// Every way `prep dedup` can fail.
#[derive(Debug, thiserror::Error)]
pub enum DedupError {
    /// The input or the output could not be read or written.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The output directory was refused or is held by another run.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// An input dataset in object storage could not be fetched.
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
    /// The input is not a documents dataset.
    #[error(transparent)]
    NotDocuments(#[from] Box<crate::run::NotDocuments>),
    /// The output overlaps the input.
    #[error(transparent)]
    Overlap(#[from] crate::run::Overlap),
    /// Parameters that make no signature.
    #[error("--ngram {ngram}, --bands {bands}, --rows {rows}: each must be at least 1, and bands x rows at most {MAX_HASHES}")]
    BadParams {
        /// Tokens per shingle.
        ngram: usize,
        /// Bands.
        bands: usize,
        /// Rows per band.
        rows: usize,
    },
    /// The thread pool could not be started.
    #[error("cannot start the threads: {0}")]
    Threads(std::io::Error),
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct DedupReport {
    /// The output's manifest.
    pub manifest: Manifest,
    /// Documents in the input.
    pub documents: u64,
    /// Documents removed as near-duplicates.
    pub removed: u64,
    /// Clusters of two or more documents.
    pub clusters: u64,
    /// Sorted runs spilled to disk (0 when the entries fit in memory).
    pub runs: u64,
    /// True when the output was already complete.
    pub already_complete: bool,
    /// Wall time.
    pub elapsed: Duration,
}

/// The journal's state: the removed list, once made.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct State {
    /// XXH3-64 of [`REMOVED_FILE`] and its clusters count.
    removed: Option<(String, u64)>,
}

/// Runs `prep dedup` (see the [module docs](self)).
pub fn run(config: &DedupConfig, progress: &dyn Progress) -> Result<DedupReport, DedupError> {
    let started = Instant::now();
    let p = config.params;
    if p.ngram == 0 || p.bands == 0 || p.rows == 0 || p.bands * p.rows > MAX_HASHES {
        return Err(DedupError::BadParams {
            ngram: p.ngram,
            bands: p.bands,
            rows: p.rows,
        });
    }
    crate::run::refuse_overlap(&config.output, &[&config.input], "the input")?;
    let local = crate::fetch::Local::of(&config.input)?;
    let input = Dataset::open(local.dir())?;
    let base = input.manifest().clone();
    crate::run::documents_only("dedup", &config.input, &base, "dedup before pack")?;
    let inputs = vec![InputInfo::of_dataset(&config.input, local.dir(), &base)?];
    let options = json!({
        "ngram": p.ngram,
        "bands": p.bands,
        "rows": p.rows,
        "seed": p.seed,
        "shard_size": config.writing.shard_size,
    });
    let identity = crate::run::Identity::new("dedup", &options, inputs, None);
    let mut output =
        Output::lock(&config.output, config.writing.single_writer)?.owning(&[REPORT_FILE]);
    let mut journal =
        match output.start::<State, u64>(&identity.fingerprint, config.writing.overwrite)? {
            Start::Complete(m) => {
                let d = m.provenance.documents;
                return Ok(DedupReport {
                    documents: d.read,
                    removed: d.deduplicated,
                    clusters: 0,
                    runs: 0,
                    already_complete: true,
                    elapsed: started.elapsed(),
                    manifest: *m,
                });
            }
            Start::Resume(j) | Start::Fresh(j) => j,
        };
    let work = output.dir().join(WORK_FOLDER);
    let verified = input.verified()?;
    let pool = crate::run::thread_pool(config.threads, "dedup").map_err(DedupError::Threads)?;

    let saved = journal
        .state
        .removed
        .clone()
        .and_then(|(sum, clusters)| Some((read_removed(&work, &sum)?, clusters)));
    let (removed, clusters, runs) = match saved {
        Some((removed, clusters)) => {
            progress.note("resuming: the clusters are already made");
            (removed, clusters, 0)
        }
        None => {
            // Whatever was written came from a run that had no clusters yet.
            if !journal.shards.is_empty() || work.exists() {
                journal = output.restart(&identity.fingerprint)?;
            }
            std::fs::create_dir_all(&work).map_err(|e| FormatError::io(&work, e))?;
            let hasher = MinHasher::new(p);
            let entries = Entries::new(&work, config.memory);
            let entries = pool.install(|| sign_all(&verified, &hasher, entries, progress))?;
            let runs = entries.runs.len() as u64;
            let mut found = Clusters::default();
            entries.for_each_group(|docs| found.join(docs))?;
            let clusters = found.roots();
            let removed = found.removed();
            let sum = write_removed(&work, &removed)?;
            journal.state.removed = Some((sum, clusters));
            output.save(&journal)?;
            output.progressed();
            (removed, clusters, runs)
        }
    };

    let from = journal.shards.last().map_or(0, |d| d.at);
    if from > 0 {
        progress.note(&format!(
            "resuming: {from} input records are already in complete shards"
        ));
    }
    let mut writer = DatasetWriter::new(
        output.dir(),
        base.dtype,
        config.writing.shard_size,
        journal.shard_infos(),
    )
    .masked(base.has_loss_mask());
    let mut next = removed.partition_point(|r| r.0 < from);
    for g in from..input.len() {
        if removed.get(next).is_some_and(|r| r.0 == g) {
            next += 1;
            continue;
        }
        if let Some(sealed) = writer.push_record(&verified, g)? {
            journal.shards.push(Done {
                shard: sealed.clone(),
                at: g,
            });
            output.save(&journal)?;
        }
    }
    let shards = writer.finish()?;

    let report = report_lines(&removed);
    output.put(REPORT_FILE, &report)?;
    output.copy_tokenizer(base.tokenizer.file.as_deref(), input.dir())?;
    let n = input.len();
    let documents = DocumentCounts {
        read: n,
        written: n - removed.len() as u64,
        deduplicated: removed.len() as u64,
        ..DocumentCounts::default()
    };
    let mut manifest = identity.derive(&base, shards, options, documents);
    manifest.provenance.report = Some(FileInfo {
        file: REPORT_FILE.into(),
        bytes: report.len() as u64,
        xxh3: checksum_hex(xxh3_64(&report)),
    });
    output.remove_work_folder(WORK_FOLDER)?;
    output.commit(&manifest)?;
    progress.finish();
    Ok(DedupReport {
        manifest,
        documents: n,
        removed: removed.len() as u64,
        clusters,
        runs,
        already_complete: false,
        elapsed: started.elapsed(),
    })
}

/// The report's lines: `{"doc": g, "kept": k}` per removed document.
fn report_lines(removed: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(removed.len() * 28);
    for (doc, kept) in removed {
        writeln!(out, "{{\"doc\":{doc},\"kept\":{kept}}}").expect("writes to a Vec");
    }
    out
}

/// The ids of a record as u32s, widened into `buf` for a `uint16` dataset.
fn ids<'a>(tokens: Tokens<'a>, buf: &'a mut Vec<u32>) -> &'a [u32] {
    match tokens {
        Tokens::U32(t) => t,
        Tokens::U16(t) => {
            buf.clear();
            buf.extend(t.iter().map(|&x| u32::from(x)));
            buf
        }
    }
}

/// Signs every document of `input` into `entries`, a batch of documents
/// at a time over the current thread pool.
fn sign_all(
    input: &Verified<'_>,
    hasher: &MinHasher,
    mut entries: Entries,
    progress: &dyn Progress,
) -> Result<Entries, DedupError> {
    let n = input.dataset().len();
    let size = input.dataset().dtype().size() as u64;
    let total = input.dataset().n_tokens() * size;
    let bands = hasher.params().bands;
    let mut bytes = 0u64;
    let mut start = 0u64;
    while start < n {
        let end = (start + BATCH).min(n);
        let signed: Vec<Vec<[u64; 3]>> = (start..end)
            .into_par_iter()
            .map_init(
                || (Vec::new(), Vec::new(), Vec::new()),
                |(buf, scratch, sig), g| -> Result<Vec<[u64; 3]>, FormatError> {
                    let record = ids(input.record(g)?, buf);
                    if !hasher.sign(record, scratch, sig) {
                        return Ok(Vec::new());
                    }
                    Ok((0..bands)
                        .map(|j| [j as u64, hasher.band_key(sig, j), g])
                        .collect())
                },
            )
            .collect::<Result<_, _>>()?;
        for doc in signed {
            entries.push(&doc)?;
        }
        for g in start..end {
            bytes += input.dataset().record_len(g)? * size;
        }
        progress.update(&ProgressSnapshot {
            input_bytes: bytes,
            input_total: total,
            documents: end,
            text_bytes: 0,
            tokens: bytes / size,
        });
        start = end;
    }
    Ok(entries)
}

/// The candidates' entries: held sorted in memory up to a budget, the rest
/// in sorted runs on disk.
struct Entries {
    dir: PathBuf,
    held: Vec<[u64; 3]>,
    limit: usize,
    runs: Vec<PathBuf>,
}

impl Entries {
    fn new(dir: &Path, memory: u64) -> Entries {
        Entries {
            dir: dir.into(),
            held: Vec::new(),
            limit: (memory / ENTRY_BYTES).max(MIN_ENTRIES) as usize,
            runs: Vec::new(),
        }
    }

    fn push(&mut self, doc: &[[u64; 3]]) -> Result<(), FormatError> {
        self.held.extend_from_slice(doc);
        if self.held.len() >= self.limit {
            self.spill()?;
        }
        Ok(())
    }

    /// Sorts what is held and writes it as the next run.
    fn spill(&mut self) -> Result<(), FormatError> {
        self.held.par_sort_unstable();
        let path = self.dir.join(format!("run-{:05}.bin", self.runs.len()));
        let io = |e| FormatError::io(&path, e);
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&path).map_err(io)?);
        for e in &self.held {
            for v in e {
                w.write_all(&v.to_le_bytes()).map_err(io)?;
            }
        }
        w.into_inner()
            .map_err(|e| io(e.into_error()))?
            .sync_all()
            .map_err(io)?;
        self.held.clear();
        self.runs.push(path);
        Ok(())
    }

    /// Calls `f` with the documents of every `(band, key)` that two or
    /// more documents share, in increasing record index, group after group
    /// in `(band, key)` order.
    fn for_each_group(mut self, mut f: impl FnMut(&[u64])) -> Result<(), FormatError> {
        self.held.par_sort_unstable();
        let mut sources: Vec<Box<dyn Iterator<Item = Result<[u64; 3], FormatError>>>> = Vec::new();
        for path in &self.runs {
            sources.push(Box::new(RunReader::open(path)?));
        }
        let held = std::mem::take(&mut self.held);
        sources.push(Box::new(held.into_iter().map(Ok)));
        let mut heap = std::collections::BinaryHeap::new();
        for (i, s) in sources.iter_mut().enumerate() {
            if let Some(e) = s.next() {
                heap.push(std::cmp::Reverse((e?, i)));
            }
        }
        let mut group: Vec<u64> = Vec::new();
        let mut at = [u64::MAX; 2];
        while let Some(std::cmp::Reverse((e, i))) = heap.pop() {
            if [e[0], e[1]] != at {
                if group.len() > 1 {
                    f(&group);
                }
                group.clear();
                at = [e[0], e[1]];
            }
            group.push(e[2]);
            if let Some(next) = sources[i].next() {
                heap.push(std::cmp::Reverse((next?, i)));
            }
        }
        if group.len() > 1 {
            f(&group);
        }
        Ok(())
    }
}

/// A spilled run, read back entry by entry.
struct RunReader {
    path: PathBuf,
    r: BufReader<File>,
}

impl RunReader {
    fn open(path: &Path) -> Result<RunReader, FormatError> {
        let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
        Ok(RunReader {
            path: path.into(),
            r: BufReader::with_capacity(1 << 20, file),
        })
    }
}

impl Iterator for RunReader {
    type Item = Result<[u64; 3], FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut b = [0u8; ENTRY_BYTES as usize];
        match self.r.read_exact(&mut b) {
            Ok(()) => Some(Ok([0, 1, 2].map(|i| {
                u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"))
            }))),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => None,
            Err(e) => Some(Err(FormatError::io(&self.path, e))),
        }
    }
}

/// Union-find over the documents that have a candidate, each component's
/// root its smallest record index.
#[derive(Debug, Default)]
struct Clusters {
    parent: HashMap<u64, u64>,
}

impl Clusters {
    fn find(&mut self, x: u64) -> u64 {
        let mut root = x;
        while let Some(&p) = self.parent.get(&root) {
            if p == root {
                break;
            }
            root = p;
        }
        // Path compression: every node on the way points at the root.
        let mut at = x;
        while at != root {
            let next = self.parent[&at];
            self.parent.insert(at, root);
            at = next;
        }
        root
    }

    /// Joins the documents of one group into one component.
    fn join(&mut self, docs: &[u64]) {
        let mut root = self.find(docs[0]);
        self.parent.entry(root).or_insert(root);
        for &d in &docs[1..] {
            let other = self.find(d);
            self.parent.entry(other).or_insert(other);
            if other != root {
                let (lo, hi) = (root.min(other), root.max(other));
                self.parent.insert(hi, lo);
                root = lo;
            }
        }
    }

    /// Components of two or more documents.
    fn roots(&self) -> u64 {
        self.parent.iter().filter(|(k, v)| k == v).count() as u64
    }

    /// Every document that is not its component's root, with the root, in
    /// increasing record index.
    fn removed(&mut self) -> Vec<(u64, u64)> {
        let docs: Vec<u64> = self.parent.keys().copied().collect();
        let mut out: Vec<(u64, u64)> = docs
            .into_iter()
            .filter_map(|d| {
                let r = self.find(d);
                (r != d).then_some((d, r))
            })
            .collect();
        out.sort_unstable();
        out
    }
}

/// Writes the removed list; returns its XXH3-64, hex.
fn write_removed(work: &Path, removed: &[(u64, u64)]) -> Result<String, FormatError> {
    let bytes: Vec<u8> = removed
        .iter()
        .flat_map(|(d, k)| d.to_le_bytes().into_iter().chain(k.to_le_bytes()))
        .collect();
    let path = work.join(REMOVED_FILE);
    crate::format::atomic_write(&path, &bytes)?;
    Ok(checksum_hex(xxh3_64(&bytes)))
}

/// The removed list saved by an earlier run, if it is there and its
/// checksum is `sum`.
fn read_removed(work: &Path, sum: &str) -> Option<Vec<(u64, u64)>> {
    let bytes = std::fs::read(work.join(REMOVED_FILE)).ok()?;
    if checksum_hex(xxh3_64(&bytes)) != sum || bytes.len() % 16 != 0 {
        return None;
    }
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
    Some(
        bytes
            .chunks_exact(16)
            .map(|c| (word(&c[..8]), word(&c[8..])))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_keep_their_smallest_document_whatever_the_join_order() {
        let groups: [&[u64]; 5] = [&[5, 9], &[2, 9], &[30, 31], &[9, 12, 40], &[31, 44]];
        let mut expected = None;
        for rotation in 0..groups.len() {
            let mut c = Clusters::default();
            for k in 0..groups.len() {
                c.join(groups[(k + rotation) % groups.len()]);
            }
            let removed = c.removed();
            assert_eq!(c.roots(), 2);
            if let Some(e) = &expected {
                assert_eq!(&removed, e);
            }
            expected = Some(removed);
        }
        assert_eq!(
            expected.unwrap(),
            [(5, 2), (9, 2), (12, 2), (31, 30), (40, 2), (44, 30)]
        );
    }

    #[test]
    fn spilled_runs_merge_into_the_groups_held_entries_give() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = 7u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let all: Vec<[u64; 3]> = (0..20_000u64)
            .map(|g| [next() % 3, next() % 500, g])
            .collect();
        let groups = |memory: u64| {
            let mut e = Entries::new(tmp.path(), memory);
            for x in &all {
                e.push(&[*x]).unwrap();
            }
            let runs = e.runs.len();
            let mut out = Vec::new();
            e.for_each_group(|g| out.push(g.to_vec())).unwrap();
            (runs, out)
        };
        let (none, held) = groups(u64::MAX / 2);
        let (runs, spilled) = groups(MIN_ENTRIES * ENTRY_BYTES);
        assert_eq!(none, 0);
        assert!(runs >= 4, "{runs}");
        assert_eq!(held, spilled);
        assert!(held
            .iter()
            .all(|g| g.len() > 1 && g.windows(2).all(|w| w[0] < w[1])));
    }
}
