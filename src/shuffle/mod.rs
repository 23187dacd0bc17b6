//! `prep shuffle`: an exact global shuffle of documents in bounded memory.
//!
//! # The algorithm
//!
//! Number the input documents `g = 0, 1, ...` across all inputs, in order.
//! Give each a key `k(g) = XXH3-64(g, seed)`; the output is the documents in
//! increasing `(k(g), g)` order. Sorting by independent uniform keys gives a
//! uniformly random permutation (every order of the keys is equally likely);
//! XXH3 stands in for the independent keys, and ties (probability below
//! n²/2⁶⁵) are broken by `g`. The order is a function of the seed and the
//! inputs alone: neither `--memory` nor `--threads` can change it.
//!
//! In memory (the documents and 32 bytes of bookkeeping each fit in half the
//! budget) the sort is direct. Otherwise every document is appended, with its
//! key, to one of `B = 2^b` bucket files chosen by the top `b` bits of its
//! key (`B` at most 256, so the open files stay few), and each bucket is then
//! read back, sorted by key and written out; concatenating the buckets in
//! order is the global key order, whatever `B` is. A bucket still larger than
//! the budget is split again on the next bits of the key. Inputs and buckets
//! are read and written sequentially in large blocks: two reads and two
//! writes of the data, a third of each only for a corpus more than 128 times
//! the budget.
//!
//! Documents are read where they lie: the inputs' mappings (each chunk
//! checked against its checksum as it is first read), and the bucket files
//! mapped in turn: no read copies them. Sorted, they are written from there
//! ([`crate::format::Gathered`]: one copy into a staging buffer, hashed
//! and written in long runs), so a shuffle in memory copies each byte
//! twice, once into that buffer and once into the page cache.
//!
//! # On many machines
//!
//! The same order can be made by independent tasks ([`dist`]: `prep shuffle
//! --scatter`, then `--gather`). Scatter task `I` of `N` keys its share of
//! the documents `g` (a contiguous range of the same numbering) and sends
//! each to bucket `j = floor(k(g) * B / 2⁶⁴)`. That map is monotone in the
//! key, so bucket `j` is exactly the key interval `[j·2⁶⁴/B, (j+1)·2⁶⁴/B)`:
//! every key of bucket `j` is below every key of bucket `j + 1`, and equal
//! keys share a bucket. Gather task `j` collects bucket `j` from every part
//! and sorts it by `(k, g)`. Concatenating the gathered buckets `0..B` is
//! therefore the documents in increasing `(k, g)` order: the one-machine
//! permutation itself, record for record, for any `N` and `B`, not merely a
//! permutation drawn from the same distribution. Keys are uniform, so
//! buckets hold about `n/B` documents each whatever the inputs' order.

use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::fetch::{FetchError, Local};
use crate::format::{
    checksum_hex, Capped, Dataset, DatasetWriter, DocumentCounts, Dtype, FormatError, InputInfo,
    Manifest, MappedFile, Provenance, Verified,
};
use crate::output::{Done, Output, OutputError, Start, WORK_FOLDERS};
use crate::progress::{Progress, ProgressSnapshot};
use crate::run::Writing;

pub mod dist;
mod spool;
use spool::Spool;

pub use dist::{gather, scatter, GatherConfig, GatherReport, ScatterConfig, ScatterReport};

/// Bytes of bookkeeping per document: key, index, offset and length.
const ENTRY_BYTES: u64 = 32;
/// Bytes a document takes in a bucket file besides its tokens: key, index, length.
const BUCKET_HEADER: usize = 24;
/// Records ahead of the one being written whose first bytes are fetched
/// into the cache (see [`Gather::emit`]).
const PREFETCH_AHEAD: usize = 8;
/// Most bucket files open at once.
const MAX_BUCKETS: u64 = 256;
/// Bytes of input records a pass that reads each once (the first pass out of
/// core, a scatter) reads through the mapping before it drops their pages
/// from its memory again (they stay in the page cache).
const RELEASE_BYTES: u64 = 8 << 20;

/// What `prep shuffle` is asked to do.
#[derive(Debug, Clone)]
pub struct ShuffleConfig {
    /// Input datasets, shuffled together as one mixture, in this order.
    pub inputs: Vec<PathBuf>,
    /// The dataset directory to write.
    pub output: PathBuf,
    /// The seed: the order is a function of it and the inputs alone.
    pub seed: u64,
    /// Memory budget in bytes for documents and bookkeeping.
    pub memory: u64,
    /// Shard size and whether to replace what the output holds.
    pub writing: Writing,
    /// Worker threads for sorting; 0 means one per core. The output does not depend on it.
    pub threads: usize,
}

impl ShuffleConfig {
    /// A config with the CLI's defaults: 4 GiB of memory, 1 GiB shards.
    pub fn new(inputs: Vec<PathBuf>, output: impl Into<PathBuf>, seed: u64) -> ShuffleConfig {
        ShuffleConfig {
            inputs,
            output: output.into(),
            seed,
            memory: 4 << 30,
            writing: Writing::default(),
            threads: 0,
        }
    }
}

/// Every way `prep shuffle` can fail.
#[derive(Debug, thiserror::Error)]
pub enum ShuffleError {
    /// An input or the output could not be read or written.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Two inputs that cannot be taken together.
    #[error(transparent)]
    Incompatible(#[from] Box<crate::run::Incompatible>),
    /// An input that is not a documents dataset.
    #[error(transparent)]
    NotDocuments(#[from] Box<crate::run::NotDocuments>),
    /// The output overlaps an input.
    #[error(transparent)]
    Overlap(#[from] crate::run::Overlap),
    /// The output directory was refused or is held by another run.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// An input dataset in object storage could not be fetched.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// A scatter part's file could not be read (on disk or in object
    /// storage).
    #[error(transparent)]
    Source(#[from] crate::format::ReadError),
    /// A request to object storage failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// No input given.
    #[error("no input dataset given")]
    NoInput,
    /// A bucket's records do not add up: a damaged bucket or scatter file.
    #[error("{}: {why}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A scatter directory's `scatter.json` cannot be read, is not one, or
    /// contradicts itself.
    #[error("{}: {why}", path.display())]
    BadScatter {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The scatter parts of a gather cannot be read together.
    #[error(transparent)]
    Task(#[from] crate::task::TaskError),
    /// More buckets than the memory budget can buffer while scattering.
    #[error("{buckets} buckets need at least {} of --memory to scatter (a write buffer each); give more memory or use fewer buckets", crate::size::format_bytes(*need))]
    TooManyBuckets {
        /// Buckets asked for.
        buckets: u64,
        /// Memory they need.
        need: u64,
    },
    /// The disk filled up (or a quota ran out) after the first pass, which
    /// leaves its bucket files behind for a re-run to resume from. The
    /// error itself is printed first.
    #[error("{cause}; the disk is full: the shuffle's scratch folder {} holds {} of bucket files, kept so that the same command run again once there is space resumes; to reclaim the space instead, delete that folder (a re-run then starts the shuffle over)", scratch.display(), crate::size::format_bytes(*bytes))]
    DiskFull {
        /// The error that met the full disk.
        cause: Box<ShuffleError>,
        /// The scratch folder left on the disk.
        scratch: PathBuf,
        /// The bytes of its files.
        bytes: u64,
    },
    /// Gather was asked for a bucket the run does not have.
    #[error("bucket {bucket} does not exist: the scatter made {buckets} buckets (0 to {})", buckets.saturating_sub(1))]
    NoBucket {
        /// The bucket asked for.
        bucket: u64,
        /// Buckets of the run.
        buckets: u64,
    },
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct ShuffleReport {
    /// The manifest written.
    pub manifest: Manifest,
    /// Bucket files used in the first pass (0: shuffled in memory).
    pub buckets: u64,
    /// Bytes of token data moved.
    pub bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// The output was already complete: nothing was done.
    pub already_complete: bool,
}

/// The key of document `g` (see [`crate::permute::shuffle_key`], which
/// `prep mix` shares).
pub fn key(seed: u64, g: u64) -> u64 {
    crate::permute::shuffle_key(seed, g)
}

/// The order of `n` documents under `seed`: element `i` is the input index of
/// output record `i`. Holds all `n` keys: for tests and small `n`; the
/// command itself never builds this array.
pub fn permutation(seed: u64, n: u64) -> Vec<u64> {
    let mut order: Vec<(u64, u64)> = (0..n).map(|g| (key(seed, g), g)).collect();
    order.sort_unstable();
    order.into_iter().map(|(_, g)| g).collect()
}

/// One document waiting to be written: its key and index decide its place;
/// its bytes are borrowed from where they lie (an input's mapping, a bucket
/// file's, a batch).
#[derive(Clone, Copy)]
struct Record<'a> {
    key: u64,
    g: u64,
    bytes: &'a [u8],
}

/// A record's tokens and (from inputs with loss masks) its mask, where they
/// lie, or why they cannot be read.
type Parts<'a> = Result<(&'a [u8], Option<&'a [u8]>), ShuffleError>;

/// One document of a [`Batch`] or a bucket file: where its bytes lie in
/// the batch's data or the file.
struct Entry {
    key: u64,
    g: u64,
    offset: usize,
    len: usize,
}

/// The records of `entries`, borrowed from `data`, the bytes they lie in.
fn records_of<'a>(data: &'a [u8], entries: &[Entry]) -> Vec<Record<'a>> {
    entries
        .iter()
        .map(|e| Record {
            key: e.key,
            g: e.g,
            bytes: &data[e.offset..e.offset + e.len],
        })
        .collect()
}

/// A document's place in the shuffled order: its key, then its number.
trait Keyed {
    fn order(&self) -> (u64, u64);
}

impl Keyed for Record<'_> {
    fn order(&self) -> (u64, u64) {
        (self.key, self.g)
    }
}

impl Keyed for Entry {
    fn order(&self) -> (u64, u64) {
        (self.key, self.g)
    }
}

/// Puts documents in the shuffled order, on the threads of `pool`. (Key
/// and number together are unique, so an unstable parallel sort is
/// deterministic.)
fn sort<T: Keyed + Send>(pool: &rayon::ThreadPool, documents: &mut [T]) {
    use rayon::slice::ParallelSliceMut;
    pool.install(|| documents.par_sort_unstable_by_key(Keyed::order));
}

/// Documents held in memory to be sorted (a gather's bucket, read from its
/// scatter parts): their bytes back to back, and an entry each.
struct Batch {
    data: Vec<u8>,
    entries: Vec<Entry>,
}

impl Batch {
    fn with_capacity(bytes: usize, documents: usize) -> Batch {
        Batch {
            data: Vec::with_capacity(bytes),
            entries: Vec::with_capacity(documents),
        }
    }

    fn push(&mut self, key: u64, g: u64, tokens: &[u8]) {
        self.entries.push(Entry {
            key,
            g,
            offset: self.data.len(),
            len: tokens.len(),
        });
        self.data.extend_from_slice(tokens);
    }

    /// The documents, borrowed from the batch.
    fn records(&self) -> Vec<Record<'_>> {
        records_of(&self.data, &self.entries)
    }
}

/// Runs `prep shuffle`.
///
/// Resumable: a journal in the output directory records every output shard
/// as it is completed, with the bucket file and the number of its documents
/// written before the next shard starts. Started again with the same inputs,
/// seed and shard size (memory and threads may differ), a run keeps the
/// shards whose checksums still match and goes on from there; a finished
/// dataset is left alone.
pub fn run(config: &ShuffleConfig, progress: &dyn Progress) -> Result<ShuffleReport, ShuffleError> {
    crate::run::refuse_overlap(&config.output, &config.inputs, "the input")?;
    let inputs = open_inputs(&config.inputs)?;
    let output = Output::lock(&config.output, config.writing.single_writer)?;
    let scratch = output.dir().join(TMP_DIR);
    shuffle_into(config, None, inputs, output, progress).map_err(|e| scratch_left(e, &scratch))
}

/// [`run`] into an output directory the caller has locked (a pipeline that
/// holds it from its first stage on), recording the output as that
/// pipeline's: `recorded` (the fused `tokenize --shuffle-seed`'s
/// provenance) replaces shuffle's own, and its fingerprint decides whether
/// an existing output is this run's.
pub(crate) fn run_in(
    config: &ShuffleConfig,
    recorded: &Provenance,
    output: Output,
    progress: &dyn Progress,
) -> Result<ShuffleReport, ShuffleError> {
    let inputs = open_inputs(&config.inputs)?;
    let scratch = output.dir().join(TMP_DIR);
    shuffle_into(config, Some(recorded), inputs, output, progress)
        .map_err(|e| scratch_left(e, &scratch))
}

/// `e`, or for a full disk [`ShuffleError::DiskFull`] saying where the
/// scratch folder is and how large, when the failed run (its output
/// dropped by now, which removes the folder unless it is worth resuming
/// from) left it behind.
fn scratch_left(e: ShuffleError, scratch: &Path) -> ShuffleError {
    let io = match &e {
        ShuffleError::Format(FormatError::Io { cause, .. })
        | ShuffleError::Output(OutputError::Format(FormatError::Io { cause, .. })) => cause,
        _ => return e,
    };
    if !matches!(
        io.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    ) {
        return e;
    }
    let Ok(entries) = std::fs::read_dir(scratch) else {
        return e;
    };
    let bytes = entries
        .filter_map(|entry| entry.ok()?.metadata().ok())
        .map(|meta| meta.len())
        .sum();
    ShuffleError::DiskFull {
        cause: Box::new(e),
        scratch: scratch.to_path_buf(),
        bytes,
    }
}

/// What a shuffle decides before it writes: the options and fingerprint the
/// manifest records, the seed, and the sizes that choose between sorting in
/// memory and bucket files.
struct Plan {
    options: serde_json::Value,
    fingerprint: String,
    seed: u64,
    /// Documents of all inputs together.
    n_docs: u64,
    /// Bytes of their tokens.
    token_bytes: u64,
    /// Memory for documents and bookkeeping.
    budget: u64,
    /// Memory the documents and their bookkeeping take, all in memory.
    need: u64,
}

/// Sizes the inputs and makes the run's options and fingerprint.
fn plan(
    config: &ShuffleConfig,
    recorded: Option<&Provenance>,
    datasets: &[Dataset],
    dtype: Dtype,
    inputs: &[InputInfo],
) -> Plan {
    let options = json!({ "seed": config.seed, "shard_size": config.writing.shard_size });
    let fingerprint = match recorded {
        Some(p) => p.fingerprint.clone(),
        None => crate::run::job_fingerprint("shuffle", &options, inputs),
    };
    let n_docs: u64 = datasets.iter().map(Dataset::len).sum();
    // A document's bytes as the shuffle moves them: its tokens, and its
    // loss mask after them when the inputs have masks (see [`walk`]).
    let token_bytes: u64 = datasets
        .iter()
        .map(|d| d.n_tokens() * record_unit(d, dtype))
        .sum();
    Plan {
        options,
        fingerprint,
        seed: config.seed,
        n_docs,
        token_bytes,
        budget: config.memory.max(64 << 10),
        need: token_bytes + n_docs * ENTRY_BYTES,
    }
}

/// [`run`] into an open output: plans, starts or resumes, sorts in memory or
/// through bucket files, and commits the manifest.
fn shuffle_into(
    config: &ShuffleConfig,
    recorded: Option<&Provenance>,
    inputs: Inputs,
    mut output: Output,
    progress: &dyn Progress,
) -> Result<ShuffleReport, ShuffleError> {
    let started = Instant::now();
    let Inputs {
        datasets,
        base,
        info: inputs,
        _local,
    } = inputs;
    let plan = plan(config, recorded, &datasets, base.dtype, &inputs);
    let dir = &output.dir().to_path_buf();
    let tmp = dir.join(TMP_DIR);
    let journal = match output
        .start::<JournalState, Checkpoint>(&plan.fingerprint, config.writing.overwrite)?
    {
        Start::Complete(manifest) => {
            progress.note("the shuffled dataset is already complete; nothing to do");
            return Ok(ShuffleReport {
                manifest: *manifest,
                buckets: 0,
                bytes: 0,
                elapsed: started.elapsed(),
                already_complete: true,
            });
        }
        Start::Resume(journal) => resume(&mut output, journal, &plan.fingerprint, &tmp, progress)?,
        Start::Fresh(journal) => journal,
    };
    let pool = crate::run::thread_pool(config.threads, "shuffle")
        .map_err(|e| ShuffleError::Format(crate::format::FormatError::io(dir.clone(), e)))?;
    let resume_at = journal
        .shards
        .last()
        .map(|s| (s.at.bucket.clone(), s.at.emitted));
    let mut gather = Gather {
        pool: &pool,
        writer: DatasetWriter::new(
            dir,
            base.dtype,
            config.writing.shard_size,
            journal.shard_infos(),
        )
        .masked(base.has_loss_mask()),
        journal,
        output: &mut output,
        tmp: tmp.clone(),
        budget: plan.budget,
        moved: Moved {
            bytes: 0,
            total: plan.token_bytes * 2,
            docs: 0,
        },
        progress,
    };

    // Every token and mask byte is read through the inputs' checks.
    let verified = verify_all(&datasets)?;
    let buckets;
    if plan.need <= plan.budget / 2 && !gather.journal.state.scattered {
        buckets = 0;
        let skip = resume_at.map_or(0, |(_, k)| k as usize);
        gather.in_memory(&verified, &plan, skip)?;
    } else {
        if !gather.journal.state.scattered {
            gather.journal.state.buckets =
                write_buckets(&verified, &plan, &tmp, &mut gather.moved, progress)?;
            gather.journal.state.scattered = true;
            gather.output.save(&gather.journal)?;
            gather.output.progressed();
        }
        let names = buckets_to_sort(&tmp)?;
        buckets = names.len() as u64;
        gather.buckets(names, resume_at)?;
    }
    let shards = gather.writer.finish()?;
    drop(verified);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)
            .map_err(|e| ShuffleError::Format(crate::format::FormatError::io(tmp.clone(), e)))?;
    }

    output.copy_tokenizer(base.tokenizer.file.as_deref(), datasets[0].dir())?;
    let provenance = provenance(
        recorded,
        inputs,
        plan.options,
        plan.n_docs,
        plan.fingerprint,
    );
    let manifest = base.derived(shards, provenance);
    output.commit(&manifest)?;
    progress.finish();
    Ok(ShuffleReport {
        manifest,
        buckets,
        bytes: plan.token_bytes,
        elapsed: started.elapsed(),
        already_complete: false,
    })
}

/// Takes over an interrupted run's journal, or starts over when the bucket
/// files it records were lost.
fn resume(
    output: &mut Output,
    mut journal: Journal,
    fingerprint: &str,
    tmp: &Path,
    progress: &dyn Progress,
) -> Result<Journal, ShuffleError> {
    // The bucket files not yet used must be as the first pass wrote
    // them (they are not synced to disk); if the machine lost any,
    // start over.
    let buckets_intact = journal.state.buckets.iter().all(|b| {
        let path = tmp.join(&b.name);
        !path.exists()
            || crate::format::hash_file(&path)
                .is_ok_and(|(h, len)| len == b.bytes && checksum_hex(h) == b.xxh3)
    });
    if journal.state.scattered && (!tmp.is_dir() || !buckets_intact) {
        journal = output.restart(fingerprint)?;
    }
    if journal.state.scattered {
        output.progressed();
    }
    if !journal.shards.is_empty() {
        progress.note(&format!(
            "resuming: kept {} complete shards of an interrupted run",
            journal.shards.len()
        ));
    }
    Ok(journal)
}

/// The first pass: every document, with its key, appended to the bucket file
/// of `tmp` that the top bits of its key choose. Returns what the journal
/// records of the files.
fn write_buckets(
    inputs: &[Verified],
    plan: &Plan,
    tmp: &Path,
    moved: &mut Moved,
    progress: &dyn Progress,
) -> Result<Vec<BucketRecord>, ShuffleError> {
    let b = plan
        .need
        .div_ceil(bucket_bytes(plan.budget))
        .next_power_of_two()
        .clamp(2, MAX_BUCKETS);
    if tmp.exists() {
        std::fs::remove_dir_all(tmp)
            .map_err(|e| ShuffleError::Format(crate::format::FormatError::io(tmp, e)))?;
    }
    std::fs::create_dir_all(tmp)
        .map_err(|e| ShuffleError::Format(crate::format::FormatError::io(tmp, e)))?;
    let mut files = open_buckets(tmp, 0, 0, b.trailing_zeros(), bucket_buffer(plan.budget, b))?;
    let bits = b.trailing_zeros();
    for_each_record(inputs, 0..plan.n_docs, true, |g, tokens, mask| {
        let k = key(plan.seed, g);
        let record = [tokens, mask.unwrap_or_default()];
        files.put((k >> (64 - bits)) as usize, k, g, &record)?;
        moved.bytes += (tokens.len() + record[1].len()) as u64;
        if g % 4096 == 0 {
            moved.report(progress);
        }
        Ok(())
    })?;
    close(files, false)
}

/// The bucket files of `tmp` left to sort, in key order, once the parts of
/// a bucket whose split was interrupted are deleted.
fn buckets_to_sort(tmp: &Path) -> Result<Vec<String>, ShuffleError> {
    let mut names = bucket_names(tmp)?;
    // A run stopped while splitting a bucket leaves the whole and some of
    // its parts. The whole is deleted only once its parts are complete,
    // so while it exists none of them has been used: drop them.
    let ranges: Vec<(u64, u32)> = names.iter().filter_map(|n| parse_bucket_name(n)).collect();
    let leftover = |n: &String| {
        let child = parse_bucket_name(n).expect("listed names parse");
        ranges.iter().any(|&parent| contains(parent, child))
    };
    for name in names.iter().filter(|n| leftover(n)) {
        let path = tmp.join(name);
        std::fs::remove_file(&path)
            .map_err(|e| ShuffleError::Format(crate::format::FormatError::io(path, e)))?;
    }
    names.retain(|n| !leftover(n));
    Ok(names)
}

/// The provenance of the shuffled dataset: shuffle's own, or the one
/// `recorded` gives, made now.
fn provenance(
    recorded: Option<&Provenance>,
    inputs: Vec<InputInfo>,
    options: serde_json::Value,
    n_docs: u64,
    fingerprint: String,
) -> Provenance {
    match recorded {
        Some(p) => Provenance {
            created: crate::util::created_time(),
            ..p.clone()
        },
        None => Provenance::new(
            "shuffle",
            inputs,
            options,
            DocumentCounts::all_written(n_docs),
            fingerprint,
        ),
    }
}

/// The input datasets, opened and checked to mix.
struct Inputs {
    datasets: Vec<Dataset>,
    /// Where each dataset is read: the inputs in object storage, fetched.
    _local: Vec<Local>,
    /// The first input's manifest: what the output shares with every input.
    base: Manifest,
    /// Each input as provenance records it: path, size, XXH3 of its manifest.
    info: Vec<InputInfo>,
}

/// Opens the inputs, checks that they can be shuffled together, and
/// describes each for the provenance.
/// Where shuffle belongs in a pipeline, for an input that is packed.
const SHUFFLE_BEFORE_PACK: &str = "shuffle before pack; pack's --seed orders the rows it writes";

fn open_inputs(paths: &[PathBuf]) -> Result<Inputs, ShuffleError> {
    let first = paths.first().ok_or(ShuffleError::NoInput)?;
    let local = paths
        .iter()
        .map(|p| Local::of(p))
        .collect::<Result<Vec<_>, _>>()?;
    let datasets = local
        .iter()
        .map(|l| Dataset::open(l.dir()))
        .collect::<Result<Vec<_>, _>>()?;
    let base = datasets[0].manifest().clone();
    for (ds, path) in datasets.iter().zip(paths) {
        crate::run::documents_only("shuffle", path, ds.manifest(), SHUFFLE_BEFORE_PACK)?;
    }
    for (ds, path) in datasets.iter().zip(paths).skip(1) {
        crate::run::same_documents("shuffle", first, &base, path, ds.manifest())?;
    }
    let info = paths
        .iter()
        .zip(&datasets)
        .map(|(path, ds)| Ok(InputInfo::of_dataset(path, ds.dir(), ds.manifest())?))
        .collect::<Result<Vec<_>, ShuffleError>>()?;
    Ok(Inputs {
        datasets,
        _local: local,
        base,
        info,
    })
}

/// The folder of bucket files in the output directory.
const TMP_DIR: &str = WORK_FOLDERS[0];

/// The shuffle's own state in its journal: whether the bucket files are
/// complete, and what they were when written.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct JournalState {
    scattered: bool,
    /// The first pass's bucket files, to check on a resume.
    #[serde(default)]
    buckets: Vec<BucketRecord>,
}

/// A bucket file as the first pass left it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct BucketRecord {
    name: String,
    bytes: u64,
    xxh3: String,
}

/// Where the next shard starts after a completed one: after `emitted`
/// documents (in sorted order) of bucket file `bucket` ("" in memory).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    bucket: String,
    emitted: u64,
}

/// A shuffle's journal.
type Journal = crate::output::Journal<JournalState, Checkpoint>;

/// The inputs, each read through its checks ([`Dataset::verified`]): what
/// every read of their tokens and masks goes through.
fn verify_all(datasets: &[Dataset]) -> Result<Vec<Verified<'_>>, ShuffleError> {
    Ok(datasets
        .iter()
        .map(Dataset::verified)
        .collect::<Result<Vec<_>, _>>()?)
}

/// Calls `f(g, tokens, mask)` for the input documents `g` in `range`
/// (numbered across all inputs, in order), each its tokens' bytes and
/// (from inputs with loss masks) its mask, as [`for_each_record`] hands
/// them out, dropping their pages from memory as it goes.
fn for_each_document(
    datasets: &[Dataset],
    range: Range<u64>,
    mut f: impl FnMut(u64, &[u8], Option<&[u8]>) -> Result<(), ShuffleError>,
) -> Result<(), ShuffleError> {
    for_each_record(&verify_all(datasets)?, range, true, |g, tokens, mask| {
        f(g, tokens, mask)
    })
}

/// Calls `f(g, bytes)` with the size in bytes of every input document `g` in
/// `range` (its tokens', and its mask's), from the indexes alone: no token
/// is read.
fn for_each_length(
    datasets: &[Dataset],
    range: Range<u64>,
    mut f: impl FnMut(u64, u64) -> Result<(), ShuffleError>,
) -> Result<(), ShuffleError> {
    let mut first = 0u64; // the global number of the dataset's first document
    for ds in datasets {
        let unit = record_unit(ds, ds.dtype());
        let (lo, hi) = (range.start.max(first), range.end.min(first + ds.len()));
        for g in lo..hi.max(lo) {
            f(g, ds.record_len(g - first)? * unit)?;
        }
        first += ds.len();
    }
    Ok(())
}

/// Bytes a document moves per token: its token's, and one more for its
/// mask byte when the dataset has loss masks.
pub(crate) fn record_unit(ds: &Dataset, dtype: Dtype) -> u64 {
    dtype.size() as u64 + u64::from(ds.manifest().has_loss_mask())
}

/// A moved document's tokens and (from inputs with loss masks) mask: a
/// bucket record (see [`Spool::put`]), split again.
pub(crate) fn split_record(record: &[u8], masked: bool, size: usize) -> (&[u8], Option<&[u8]>) {
    if !masked {
        return (record, None);
    }
    let n = record.len() / (size + 1);
    let (tokens, mask) = record.split_at(n * size);
    (tokens, Some(mask))
}

/// Calls `f(g, tokens, mask)` for the input documents `g` in `range`
/// (numbered across all inputs, in order): the bytes of each document's
/// tokens and (from inputs with loss masks) of its mask, borrowed from the
/// input's mapping once the chunks that hold them have passed their checks
/// (each chunk checked as the walk first reaches it: one read, no copy).
///
/// `release`: the pass reads each document once, so the pages of what it
/// has read leave the process's memory every [`RELEASE_BYTES`] (they stay
/// in the page cache), and an input larger than the memory budget is not
/// held whole. Without it they stay mapped for the documents' later use.
fn for_each_record<'a>(
    inputs: &[Verified<'a>],
    range: Range<u64>,
    release: bool,
    mut f: impl FnMut(u64, &'a [u8], Option<&'a [u8]>) -> Result<(), ShuffleError>,
) -> Result<(), ShuffleError> {
    let mut first = 0u64; // the global number of the dataset's first document
    for v in inputs {
        let n = v.dataset().len();
        let (lo, hi) = (range.start.max(first) - first, range.end.min(first + n));
        let hi = hi.saturating_sub(first);
        let (mut held_from, mut held) = (lo, 0u64);
        v.for_each_in_order(lo..hi.max(lo), |i, tokens, mask| {
            f(first + i, tokens, mask)?;
            held += (tokens.len() + mask.map_or(0, <[u8]>::len)) as u64;
            if release && held >= RELEASE_BYTES {
                v.release_records(held_from..i + 1);
                (held_from, held) = (i + 1, 0);
            }
            Ok::<(), ShuffleError>(())
        })?;
        if release {
            v.release_records(held_from..hi);
        }
        first += n;
    }
    Ok(())
}

/// Bytes moved so far, for progress.
struct Moved {
    bytes: u64,
    total: u64,
    docs: u64,
}

impl Moved {
    fn report(&self, progress: &dyn Progress) {
        progress.update(&ProgressSnapshot {
            input_bytes: self.bytes,
            input_total: self.total,
            documents: self.docs,
            text_bytes: 0,
            tokens: 0,
        });
    }
}

/// A bucket file's name: the first key of its range, in hex, and the number
/// of leading key bits the range fixes. Names sort in key order, and a split
/// bucket's parts sort right after it.
fn bucket_name(start: u64, bits: u32) -> String {
    format!("{start:016x}-{bits:02}.bucket")
}

/// The range of a bucket file from its name.
fn parse_bucket_name(name: &str) -> Option<(u64, u32)> {
    let stem = name.strip_suffix(".bucket")?;
    let (start, bits) = stem.split_once('-')?;
    Some((u64::from_str_radix(start, 16).ok()?, bits.parse().ok()?))
}

/// True when bucket range `child` lies strictly inside range `parent`.
fn contains(parent: (u64, u32), child: (u64, u32)) -> bool {
    let (start, bits) = parent;
    child.1 > bits && bits > 0 && (child.0 >> (64 - bits)) == (start >> (64 - bits))
}

/// The bucket files of `tmp`, in key order (none when there is no `tmp`).
fn bucket_names(tmp: &Path) -> Result<Vec<String>, ShuffleError> {
    if !tmp.exists() {
        return Ok(Vec::new()); // shuffled in memory
    }
    let io = |e| ShuffleError::Format(crate::format::FormatError::io(tmp, e));
    let mut names: Vec<String> = std::fs::read_dir(tmp)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| parse_bucket_name(n).is_some())
        .collect();
    names.sort();
    Ok(names)
}

/// Opens the `2^sub_bits` bucket files that split the range (`start`,
/// `bits`) on the next `sub_bits` key bits, each with a buffer of `buffer`.
fn open_buckets(
    tmp: &Path,
    start: u64,
    bits: u32,
    sub_bits: u32,
    buffer: usize,
) -> Result<Spool<Capped<File>>, ShuffleError> {
    let total = bits + sub_bits;
    let paths: Vec<PathBuf> = (0..1u64 << sub_bits)
        .map(|i| tmp.join(bucket_name(start | (i << (64 - total)), total)))
        .collect();
    let files = paths
        .iter()
        .map(|path| {
            let file = File::create(path).map_err(|e| {
                ShuffleError::Format(crate::format::FormatError::io(path.clone(), e))
            })?;
            Ok(Capped::new(file))
        })
        .collect::<Result<Vec<_>, ShuffleError>>()?;
    Spool::new(files, paths, buffer)
}

/// Flushes bucket files and returns what the journal records of each: name,
/// size and XXH3. With `sync`, also forces them to disk.
///
/// The first pass's buckets are not synced: a resume checks them against the
/// journal and starts over if the machine lost any. The parts of a split
/// bucket are synced, because the whole is deleted once they exist.
fn close(buckets: Spool<Capped<File>>, sync: bool) -> Result<Vec<BucketRecord>, ShuffleError> {
    buckets
        .finish()?
        .into_iter()
        .map(|b| {
            if sync {
                b.out.into_inner().sync_all().map_err(|e| {
                    ShuffleError::Format(crate::format::FormatError::io(b.path.clone(), e))
                })?;
            }
            Ok(BucketRecord {
                name: b
                    .path
                    .file_name()
                    .expect("a file")
                    .to_string_lossy()
                    .into_owned(),
                bytes: b.bytes,
                xxh3: checksum_hex(b.xxh3),
            })
        })
        .collect()
}

/// The most bytes a bucket file may hold before it is split: a quarter of
/// the budget, because the second pass holds two at once (the one being
/// written, and the next, being sorted beside it).
fn bucket_bytes(budget: u64) -> u64 {
    budget / 4
}

/// Write buffers for `n` buckets: a quarter of the budget between them.
fn bucket_buffer(budget: u64, n: u64) -> usize {
    (budget / 4 / n).clamp(64 << 10, 4 << 20) as usize
}

/// The second pass, writing documents in key order and recording a
/// checkpoint at every completed shard.
struct Gather<'a> {
    pool: &'a rayon::ThreadPool,
    writer: DatasetWriter,
    journal: Journal,
    output: &'a mut Output,
    tmp: PathBuf,
    budget: u64,
    moved: Moved,
    progress: &'a dyn Progress,
}

impl Gather<'_> {
    /// Sorts every document in memory and writes them from position `skip`
    /// on: one sorted run, named "" in the journal. The documents stay in
    /// the inputs' mappings: only their keys and places are held.
    fn in_memory<'a>(
        &mut self,
        inputs: &[Verified<'a>],
        plan: &Plan,
        skip: usize,
    ) -> Result<(), ShuffleError> {
        self.check_ahead(inputs);
        let mut records = Vec::with_capacity(plan.n_docs as usize);
        for_each_record(inputs, 0..plan.n_docs, false, |g, tokens, _| {
            records.push(Record {
                key: key(plan.seed, g),
                g,
                bytes: tokens,
            });
            Ok(())
        })?;
        self.moved.bytes += plan.token_bytes;
        let firsts: Vec<u64> = inputs
            .iter()
            .scan(0, |first, v| {
                let at = *first;
                *first += v.dataset().len();
                Some(at)
            })
            .collect();
        // A record is its tokens; its mask (when the inputs have masks) is
        // the input's, found by the document's number.
        let masked = self.writer.is_masked();
        let parts = |r: &Record<'a>| -> Parts<'a> {
            let d = firsts.partition_point(|&f| f <= r.g) - 1;
            let mask = match masked {
                true => inputs[d].loss_mask(r.g - firsts[d])?,
                false => None,
            };
            Ok((r.bytes, mask))
        };
        sort(self.pool, &mut records);
        self.emit("", records, skip, &parts)
    }

    /// Checks the inputs' `.bin` chunks on every thread of the pool, so
    /// that the pass that collects the records (one thread) finds them
    /// checked. A chunk that fails is left unpassed and is reported by that
    /// pass, in input order, as it would be without this.
    fn check_ahead(&self, inputs: &[Verified<'_>]) {
        use rayon::prelude::*;
        let chunks: Vec<(&Verified<'_>, usize, Range<u64>)> = inputs
            .iter()
            .flat_map(|v| {
                v.bin_chunks(0..v.dataset().len())
                    .into_iter()
                    .map(move |(s, r)| (v, s, r))
            })
            .collect();
        let _reported_below = self.pool.install(|| {
            chunks
                .into_par_iter()
                .try_for_each(|(v, s, r)| v.check_bin(s, r))
        });
    }

    /// Sorts and writes the bucket files `names` in key order, from the
    /// last completed shard's checkpoint on when resuming.
    ///
    /// While one bucket is written, a thread of its own maps, parses and
    /// sorts the next ([`sort_bucket`]): otherwise the shard's writer
    /// thread would wait through that at every bucket.
    fn buckets(
        &mut self,
        mut names: Vec<String>,
        resume_at: Option<(String, u64)>,
    ) -> Result<(), ShuffleError> {
        if let Some((bucket, _)) = &resume_at {
            names.retain(|n| n >= bucket);
        }
        let skip = |name: &str| match &resume_at {
            Some((bucket, k)) if bucket == name => *k as usize,
            _ => 0,
        };
        let (tmp, budget) = (self.tmp.clone(), self.budget);
        let prepare = |name: &String| sort_bucket(&tmp.join(name), budget, skip(name) > 0);
        let prepare = &prepare;
        std::thread::scope(|scope| {
            let mut next = None;
            for (i, name) in names.iter().enumerate() {
                let this = match next.take() {
                    Some(thread) => join_sorter(thread)?,
                    None => prepare(name)?,
                };
                let Some(sorted) = this else {
                    // Split on this thread: nothing else in memory meanwhile.
                    self.split(name)?;
                    continue;
                };
                if let Some(after) = names.get(i + 1) {
                    let thread = std::thread::Builder::new()
                        .name("prep-bucket-sort".into())
                        .spawn_scoped(scope, move || prepare(after))
                        .map_err(|e| {
                            ShuffleError::Format(crate::format::FormatError::io(tmp.clone(), e))
                        })?;
                    next = Some(thread);
                }
                self.emit_records(name, sorted.records(), skip(name))?;
            }
            Ok(())
        })
    }

    /// Splits bucket file `name`, larger than [`bucket_bytes`], on the next
    /// key bits, and sorts and writes its parts.
    fn split(&mut self, name: &str) -> Result<(), ShuffleError> {
        let path = self.tmp.join(name);
        let io = |e| ShuffleError::Format(crate::format::FormatError::io(path.clone(), e));
        let bytes = std::fs::metadata(&path).map_err(io)?.len();
        let (start, bits) = parse_bucket_name(name).expect("listed bucket names parse");
        let sub_bits = bytes
            .div_ceil(bucket_bytes(self.budget))
            .next_power_of_two()
            .clamp(2, MAX_BUCKETS)
            .trailing_zeros();
        let n = 1u64 << sub_bits;
        let mut subs = open_buckets(
            &self.tmp,
            start,
            bits,
            sub_bits,
            bucket_buffer(self.budget, n),
        )?;
        let file = MappedFile::open(&path)?;
        let all = file.bytes();
        parse_records(all, &path, |k, g, record| {
            let i = (k << bits) >> (64 - sub_bits);
            subs.put(i as usize, k, g, &[&all[record]])
        })?;
        drop(file);
        close(subs, true)?;
        // The parts are complete: the whole can go.
        std::fs::remove_file(&path).map_err(io)?;
        let parts = (0..n)
            .map(|i| bucket_name(start | (i << (64 - bits - sub_bits)), bits + sub_bits))
            .collect();
        self.buckets(parts, None)
    }

    /// [`Gather::emit`] of records that hold their masks after their
    /// tokens, as bucket files and scatter regions hold them.
    fn emit_records(
        &mut self,
        name: &str,
        records: Vec<Record<'_>>,
        skip: usize,
    ) -> Result<(), ShuffleError> {
        let (masked, size) = (self.writer.is_masked(), self.writer.dtype().size());
        self.emit(name, records, skip, &|r| {
            Ok(split_record(r.bytes, masked, size))
        })
    }

    /// Writes the documents of one run sorted by [`sort`] (a bucket, or
    /// everything in memory) from position `skip` on, each as `parts` gives
    /// its tokens and mask, straight from where they lie.
    fn emit<'a>(
        &mut self,
        name: &str,
        records: Vec<Record<'a>>,
        skip: usize,
        parts: &dyn Fn(&Record<'a>) -> Parts<'a>,
    ) -> Result<(), ShuffleError> {
        let mut out = self.writer.gather();
        for (i, e) in records.iter().enumerate().skip(skip) {
            // The record a few ahead, at a random place of the inputs:
            // its first bytes (and their page's translation) are on their
            // way by the time it is copied.
            if let Some(ahead) = records.get(i + PREFETCH_AHEAD) {
                crate::util::prefetch(ahead.bytes);
            }
            let (tokens, mask) = parts(e)?;
            let sealed = out
                .push(&[tokens], mask.as_ref().map(std::slice::from_ref))?
                .cloned();
            if let Some(sealed) = sealed {
                self.journal.shards.push(Done {
                    shard: sealed.clone(),
                    at: Checkpoint {
                        bucket: name.into(),
                        emitted: i as u64,
                    },
                });
                self.output.save(&self.journal)?;
                // Every document of the buckets before this one is in a
                // completed shard now: their files are no longer needed.
                for old in bucket_names(&self.tmp)?
                    .into_iter()
                    .filter(|n| n.as_str() < name)
                {
                    let path = self.tmp.join(old);
                    std::fs::remove_file(&path).map_err(|e| {
                        ShuffleError::Format(crate::format::FormatError::io(path, e))
                    })?;
                }
            }
            self.moved.bytes += e.bytes.len() as u64;
            self.moved.docs += 1;
            if self.moved.docs.is_multiple_of(4096) {
                self.moved.report(self.progress);
            }
        }
        Ok(out.finish()?)
    }
}

/// Calls `f(key, g, record)` for each document record of `bytes` (a bucket
/// file, mapped), in the order written, the record as its range of `bytes`;
/// `path` names the file in errors. A record that claims more bytes than
/// remain is refused.
fn parse_records(
    bytes: &[u8],
    path: &Path,
    mut f: impl FnMut(u64, u64, Range<usize>) -> Result<(), ShuffleError>,
) -> Result<u64, ShuffleError> {
    let (mut at, mut records) = (0usize, 0u64);
    while at < bytes.len() {
        let past_end = || ShuffleError::Corrupt {
            path: path.into(),
            why: format!(
                "record {records} runs past the end of its {} bytes",
                bytes.len()
            ),
        };
        let head = bytes.get(at..at + BUCKET_HEADER).ok_or_else(past_end)?;
        let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        let start = at + BUCKET_HEADER;
        let end = usize::try_from(word(16))
            .ok()
            .and_then(|len| start.checked_add(len))
            .filter(|&end| end <= bytes.len())
            .ok_or_else(past_end)?;
        f(word(0), word(8), start..end)?;
        at = end;
        records += 1;
    }
    Ok(records)
}

/// A bucket file ready to write: mapped, its records parsed and in order
/// ([`sort`]).
struct Sorted {
    file: MappedFile,
    entries: Vec<Entry>,
}

impl Sorted {
    /// The records in order, borrowed from the file.
    fn records(&self) -> Vec<Record<'_>> {
        records_of(self.file.bytes(), &self.entries)
    }
}

/// Bucket file `path` mapped, parsed and sorted; `None` when it is to be
/// split instead ([`Gather::split`]): larger than [`bucket_bytes`], not
/// being resumed, and with key bits left to split on.
fn sort_bucket(path: &Path, budget: u64, resuming: bool) -> Result<Option<Sorted>, ShuffleError> {
    let io = |e| ShuffleError::Format(crate::format::FormatError::io(path, e));
    let bytes = std::fs::metadata(path).map_err(io)?.len();
    let name = path.file_name().expect("a file").to_string_lossy();
    let (_, bits) = parse_bucket_name(&name).expect("listed bucket names parse");
    if bytes > bucket_bytes(budget) && bits < 56 && !resuming {
        return Ok(None);
    }
    let file = MappedFile::open(path)?;
    let mut entries = Vec::new();
    parse_records(file.bytes(), path, |key, g, record| {
        entries.push(Entry {
            key,
            g,
            offset: record.start,
            len: record.len(),
        });
        Ok(())
    })?;
    // One thread: this runs beside the writing of the bucket before.
    entries.sort_unstable_by_key(Keyed::order);
    Ok(Some(Sorted { file, entries }))
}

/// What a bucket-sorting thread returned, or its panic, passed on.
fn join_sorter<T>(
    thread: std::thread::ScopedJoinHandle<'_, Result<T, ShuffleError>>,
) -> Result<T, ShuffleError> {
    match thread.join() {
        Ok(sorted) => sorted,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Calls `f(key, g, tokens)` for each document record in the `bytes` bytes
/// `r` yields (a bucket file, or one bucket's region of a scatter file), in
/// the order written; `path` names the file in errors. Returns the number
/// of records. A record that claims more bytes than remain is refused
/// before anything is allocated for it.
fn read_records(
    mut r: impl Read,
    bytes: u64,
    path: &Path,
    mut f: impl FnMut(u64, u64, &[u8]) -> Result<(), ShuffleError>,
) -> Result<u64, ShuffleError> {
    let io = |e| ShuffleError::Format(crate::format::FormatError::io(path, e));
    let mut head = [0u8; BUCKET_HEADER];
    let mut tokens = Vec::new();
    let (mut left, mut records) = (bytes, 0u64);
    while left > 0 {
        let past_end = || ShuffleError::Corrupt {
            path: path.into(),
            why: format!("record {records} runs past the end of its {bytes} bytes"),
        };
        left = left
            .checked_sub(BUCKET_HEADER as u64)
            .ok_or_else(past_end)?;
        r.read_exact(&mut head).map_err(io)?;
        let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        left = left.checked_sub(word(16)).ok_or_else(past_end)?;
        tokens.resize(word(16) as usize, 0);
        r.read_exact(&mut tokens).map_err(io)?;
        f(word(0), word(8), &tokens)?;
        records += 1;
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io_error(path: &Path, kind: std::io::ErrorKind) -> ShuffleError {
        ShuffleError::Format(FormatError::io(path, std::io::Error::from(kind)))
    }

    /// A full disk after the first pass names the scratch folder left on
    /// it, its size, and both ways on; any other error, or a full disk
    /// that left no folder, is the error alone. (A test through the binary
    /// needs a small file system to fill: tests/it/shuffle.rs mounts one
    /// where it may.)
    #[test]
    fn a_full_disk_names_the_scratch_folder_left_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().join(TMP_DIR);
        std::fs::create_dir(&scratch).unwrap();
        std::fs::write(scratch.join("a"), vec![0u8; 3072]).unwrap();
        std::fs::write(scratch.join("b"), vec![0u8; 2048]).unwrap();
        let shard = dir.path().join("shard-00003.bin.tmp");
        for kind in [
            std::io::ErrorKind::StorageFull,
            std::io::ErrorKind::QuotaExceeded,
        ] {
            let e = scratch_left(io_error(&shard, kind), &scratch);
            assert!(matches!(e, ShuffleError::DiskFull { bytes: 5120, .. }));
            let message = e.to_string();
            for part in [
                &format!("{}: ", shard.display()),
                &format!("scratch folder {} holds 5.00 KiB", scratch.display()),
                "the same command run again once there is space resumes",
                "delete that folder",
            ] {
                assert!(message.contains(part), "{part:?} not in {message:?}");
            }
        }
        let other = scratch_left(
            io_error(&shard, std::io::ErrorKind::PermissionDenied),
            &scratch,
        );
        assert!(matches!(other, ShuffleError::Format(_)));
        let gone = scratch_left(
            io_error(&shard, std::io::ErrorKind::StorageFull),
            &dir.path().join("none"),
        );
        assert!(matches!(gone, ShuffleError::Format(_)));
    }
}
