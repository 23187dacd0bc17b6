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

pub mod entries;
pub mod minhash;
pub mod parts;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use xxhash_rust::xxh3::xxh3_64;

use crate::format::{
    checksum_hex, Dataset, DatasetWriter, DocumentCounts, FileInfo, FormatError, InputInfo,
    Manifest,
};
use crate::output::{Done, Output, OutputError, Start};
use crate::partition::Part;
use crate::progress::Progress;
use crate::run::Writing;
pub use minhash::{candidate_probability, MinHasher, Params};

/// The report of removed documents inside the output dataset.
pub const REPORT_FILE: &str = crate::output::REPORT_FILE;
/// The working folder inside the output (and a signature task's folder):
/// spilled runs, the removed list.
pub const WORK_FOLDER: &str = crate::output::WORK_FOLDERS[2];
/// The removed documents inside [`WORK_FOLDER`], once the clusters are made.
const REMOVED_FILE: &str = "removed.bin";
/// Signature values at most: `bands * rows`.
pub(crate) const MAX_HASHES: usize = 4096;

/// What `prep dedup` is asked to do: the whole run on one machine, or
/// the dataset written from a work directory's bucket parts
/// ([`parts`]), whole or a part of it.
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
    /// Take the candidates from this work directory's bucket parts
    /// instead of signing the documents here.
    pub work: Option<PathBuf>,
    /// Write only this share of the input's records, as a partial dataset
    /// for `prep merge` (with [`DedupConfig::work`]).
    pub part: Option<Part>,
}

impl DedupConfig {
    /// A config with the CLI's defaults: datatrove's parameters, 1 GiB of
    /// entries, a thread per core, 1 GiB shards, the whole run here.
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>) -> DedupConfig {
        DedupConfig {
            input: input.into(),
            output: output.into(),
            params: Params::default(),
            memory: 1 << 30,
            threads: 0,
            writing: Writing::default(),
            work: None,
            part: None,
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
    /// A file in object storage could not be read.
    #[error(transparent)]
    Read(#[from] crate::format::ReadError),
    /// The work directory's object store could not be reached.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The input is not a documents dataset.
    #[error(transparent)]
    NotDocuments(#[from] Box<crate::run::NotDocuments>),
    /// The output overlaps the input.
    #[error(transparent)]
    Overlap(#[from] crate::run::Overlap),
    /// The work directory's parts cannot be read together.
    #[error(transparent)]
    Task(#[from] crate::task::TaskError),
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
    /// A work directory made from another input or with other parameters.
    #[error("{}: the work directory's tasks were not run as this run asks: {why}; give the input and parameters they were run with, or run them again", path.display())]
    OtherWork {
        /// The part's description.
        path: PathBuf,
        /// What differs.
        why: String,
    },
    /// The thread pool could not be started.
    #[error("cannot start the threads: {0}")]
    Threads(std::io::Error),
}

/// Refuses parameters that make no signature.
pub fn check_params(p: &Params) -> Result<(), DedupError> {
    if p.ngram == 0 || p.bands == 0 || p.rows == 0 || p.bands.saturating_mul(p.rows) > MAX_HASHES {
        return Err(DedupError::BadParams {
            ngram: p.ngram,
            bands: p.bands,
            rows: p.rows,
        });
    }
    Ok(())
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct DedupReport {
    /// The output's manifest.
    pub manifest: Manifest,
    /// Documents read (the part's share for a part).
    pub documents: u64,
    /// Documents removed as near-duplicates (of those read).
    pub removed: u64,
    /// Clusters of two or more documents, in the whole input.
    pub clusters: u64,
    /// Sorted runs spilled to disk (0 when the entries fit in memory).
    pub runs: u64,
    /// True when the output was already complete.
    pub already_complete: bool,
    /// Wall time.
    pub elapsed: Duration,
}

/// The journal's state: the removed list the shards were written with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct State {
    /// XXH3-64 of the removed list (as [`REMOVED_FILE`] holds it) and the
    /// clusters count.
    removed: Option<(String, u64)>,
}

/// Runs `prep dedup` (see the [module docs](self)).
pub fn run(config: &DedupConfig, progress: &dyn Progress) -> Result<DedupReport, DedupError> {
    let started = Instant::now();
    let p = config.params;
    check_params(&p)?;
    crate::run::refuse_overlap(&config.output, &[&config.input], "the input")?;
    let local = crate::fetch::Local::of(&config.input)?;
    let input = Dataset::open(local.dir())?;
    let base = input.manifest().clone();
    crate::run::documents_only("dedup", &config.input, &base, "dedup before pack")?;
    let info = InputInfo::of_dataset(&config.input, local.dir(), &base)?;
    let job = parts::Job {
        params: p,
        input: info.clone(),
        n_records: input.len(),
    };
    let options = json!({
        "ngram": p.ngram,
        "bands": p.bands,
        "rows": p.rows,
        "seed": p.seed,
        "shard_size": config.writing.shard_size,
    });
    let identity = crate::run::Identity::new("dedup", &options, vec![info], config.part);
    let mut output = Output::lock(&config.output, config.writing.single_writer)?;
    let start = output.start::<State, u64>(&identity.fingerprint, config.writing.overwrite)?;
    let mut journal = match start {
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
    let folder = output.dir().join(WORK_FOLDER);
    let verified = input.verified()?;

    // The removed list: saved by an earlier run of this one, or made now
    // (from the work directory's pairs, or by signing here).
    let saved = journal
        .state
        .removed
        .clone()
        .and_then(|(sum, clusters)| Some((read_removed(&folder, &sum)?, clusters)));
    let (removed, clusters, runs) = match saved {
        Some((removed, clusters)) => {
            progress.note("resuming: the clusters are already made");
            (removed, clusters, 0)
        }
        None => {
            let mut found = Clusters::default();
            let runs = match &config.work {
                Some(work) => {
                    parts::read_pairs(work, &job, |doc, first| found.join(&[first, doc]))?;
                    0
                }
                None => {
                    let pool = crate::run::thread_pool(config.threads, "dedup")
                        .map_err(DedupError::Threads)?;
                    let hasher = MinHasher::new(p);
                    let most = input.len() * p.bands as u64;
                    let mut held = entries::Entries::new(&folder, config.memory, most);
                    let all = 0..input.len();
                    pool.install(|| entries::sign(&verified, &hasher, all, &mut held, progress))?;
                    let runs = held.runs();
                    entries::for_each_group(held.sorted()?, |docs| found.join(docs))?;
                    runs
                }
            };
            let clusters = found.roots();
            let removed = found.removed();
            // Shards already written were written with another list, or
            // with none known: they go.
            if !journal.shards.is_empty() {
                journal = output.restart(&identity.fingerprint)?;
            }
            let sum = write_removed(&folder, &removed)?;
            journal.state.removed = Some((sum, clusters));
            output.save(&journal)?;
            output.progressed();
            (removed, clusters, runs)
        }
    };

    let range = config.part.unwrap_or(Part::WHOLE).range(input.len());
    let from = journal.shards.last().map_or(range.start, |d| d.at);
    if from > range.start {
        progress.note(&format!(
            "resuming: {} input records are already in complete shards",
            from - range.start
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
    for g in from..range.end {
        if g % 4096 == 0 {
            verified.release_records(g.saturating_sub(4096)..g);
        }
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

    let ours = &removed[removed.partition_point(|r| r.0 < range.start)
        ..removed.partition_point(|r| r.0 < range.end)];
    let report = report_lines(ours);
    output.put(REPORT_FILE, &report)?;
    output.copy_tokenizer(base.tokenizer.file.as_deref(), input.dir())?;
    let read = range.end - range.start;
    let documents = DocumentCounts {
        read,
        written: read - ours.len() as u64,
        deduplicated: ours.len() as u64,
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
        documents: read,
        removed: ours.len() as u64,
        clusters,
        runs,
        already_complete: false,
        elapsed: started.elapsed(),
    })
}

/// The report's lines: `{"doc":g,"kept":k}` per removed document.
fn report_lines(removed: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(removed.len() * 28);
    for (doc, kept) in removed {
        writeln!(out, "{{\"doc\":{doc},\"kept\":{kept}}}").expect("writes to a Vec");
    }
    out
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
    std::fs::create_dir_all(work).map_err(|e| FormatError::io(work, e))?;
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
}
