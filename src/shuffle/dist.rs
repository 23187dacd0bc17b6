//! The shuffle as independent tasks: `prep shuffle --scatter` on `N`
//! machines, then `prep shuffle --gather` on `B`, for the permutation one
//! machine makes, record for record.
//!
//! # The algorithm
//!
//! The one-machine shuffle numbers the documents `g = 0..n` across the
//! inputs and writes them in increasing `(k(g), g)` order, `k(g) =
//! XXH3-64(g, seed)`: sorting by independent uniform keys gives a uniformly
//! random permutation (see the [parent module](super)). The distributed run
//! computes the same order in two stages:
//!
//! 1. **Scatter**, task `I` of `N`: the documents `g` in
//!    [`Part::range`]`(n)` (contiguous, so the task reads its share of the
//!    shards sequentially and no task needs another's), each sent with its
//!    key to bucket `j = floor(k * B / 2⁶⁴)` ([`bucket_of`]).
//! 2. **Gather**, task `J` of `B`: bucket `J` of every scatter part, sorted
//!    by `(k, g)` in memory and written as a dataset.
//!
//! [`bucket_of`] is monotone in the key: bucket `j` holds exactly the keys
//! in `[j·2⁶⁴/B, (j+1)·2⁶⁴/B)`. Every key of bucket `j` is below every key
//! of bucket `j + 1`, and documents with equal keys share a bucket, so
//! gathered bucket 0, then 1, ..., then `B - 1` is the whole `(k, g)` order:
//! the same permutation as `prep shuffle IN... OUT --seed S`, for any `N`
//! and `B`. The keys are uniform, so every bucket gets about `n/B` documents
//! (and tokens) whatever the order or the mix of the inputs; which part
//! scattered a document changes nothing but where it was read from.
//!
//! # Files
//!
//! Scatter task `I` writes `WORK/scatter-IIIII/` (`I` zero-padded to 5
//! digits):
//!
//! - `buckets.bin`: a 16-byte header, the magic `PREPSCAT` then the version
//!   as a little-endian u64 (1), then one region per bucket, in bucket
//!   order, back to back. A region is its documents in increasing `g`, each
//!   a record of `key` u64, `g` u64, `bytes` u64 (all little-endian), then
//!   `bytes` bytes of tokens in the input's dtype. An empty bucket has an
//!   empty region.
//! - `scatter.json` ([`ScatterInfo`]): the run's fingerprint (`job`), the
//!   part, the counts, the inputs, what the output manifest shares with the
//!   inputs, and each region's offset, size, record count and XXH3-64.
//!   Written last and atomically: a directory without it is unfinished.
//! - the inputs' tokenizer copy, for gather to pass on.
//!
//! Gather task `J` reads `scatter.json` of every part, requires parts
//! `0..N` of one job and nothing else, reads region `J` of each part with a
//! positioned read, checks its size and XXH3, sorts, and writes a normal
//! dataset whose manifest's `partition` is `{stage: "shuffle", part: J,
//! parts: B, job}`.
//!
//! # Retries
//!
//! Every task is a function of its inputs and options: run again, it
//! writes the same bytes. A task whose output is complete and of the same
//! job does nothing; one interrupted (its journal names the same task) is
//! done again from the start, which costs one task's work; a directory
//! holding anything else is refused unless `overwrite`, and then only
//! prep's own files are removed.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use xxhash_rust::xxh3::Xxh3;

use super::{
    for_each_document, for_each_length, key, open_inputs, read_records, Batch, Checkpoint, Gather,
    Inputs, Journal, JournalState, Moved, ShuffleError, Spool, BUCKET_HEADER, TMP_DIR,
};
use crate::format::Files;
use crate::format::{
    checksum_hex, Dataset, DatasetWriter, DocumentCounts, Dtype, InputInfo, Manifest, Partition,
    Provenance, ShardInfo, SpecialTokens, TokenizerInfo,
};
use crate::output::{Output, Start};
use crate::partition::Part;
use crate::progress::Progress;
use crate::run::Writing;

/// The description of a scatter part, in its directory; written last.
pub const SCATTER_FILE: &str = "scatter.json";
/// The data file of a scatter part: every bucket's region.
pub const DATA_FILE: &str = "buckets.bin";
/// The first 8 bytes of [`DATA_FILE`].
pub const DATA_MAGIC: &[u8; 8] = b"PREPSCAT";
/// The version of [`DATA_FILE`] and [`SCATTER_FILE`] this build writes and
/// the newest it reads.
pub const SCATTER_VERSION: u64 = 1;
/// Bytes before the first region of [`DATA_FILE`]: magic and version.
const DATA_HEADER: u64 = 16;
/// The `format` field of [`SCATTER_FILE`].
const SCATTER_FORMAT: &str = "prep-scatter";
/// A `scatter.json` larger than this is refused before parsing: a real one
/// is about 100 bytes per bucket.
const MAX_SCATTER_JSON: u64 = 1 << 30;
/// The smallest write buffer of a bucket while scattering.
const MIN_BUFFER: u64 = 4 << 10;
/// The largest: more buys nothing once writes are a few MiB.
const MAX_BUFFER: u64 = 4 << 20;
/// Memory per bucket besides its buffer: its checksum state and cursor.
const BUCKET_STATE: u64 = 1 << 10;

/// The directory scatter part `part` writes inside the work directory.
pub fn part_dir(work: &Path, part: u64) -> PathBuf {
    crate::task::part_dir::<ScatterInfo>(work, part)
}

/// The bucket of a key among `buckets`: `floor(key * buckets / 2⁶⁴)`.
/// Monotone in the key, so bucket `j` is the key interval
/// `[j·2⁶⁴/buckets, (j+1)·2⁶⁴/buckets)`. `buckets` must be at least 1.
pub fn bucket_of(key: u64, buckets: u64) -> u64 {
    ((u128::from(key) * u128::from(buckets)) >> 64) as u64
}

/// What one scatter task is asked to do.
#[derive(Debug, Clone)]
pub struct ScatterConfig {
    /// Input datasets, numbered together in this order (as the one-machine
    /// shuffle numbers them).
    pub inputs: Vec<PathBuf>,
    /// The work directory shared by every task; this one writes
    /// [`part_dir`]`(work, part.index)`.
    pub work: PathBuf,
    /// The seed of the permutation.
    pub seed: u64,
    /// This task's share of the documents.
    pub part: Part,
    /// Buckets, that is gather tasks; at least 1.
    pub buckets: u64,
    /// Memory budget in bytes for the buckets' write buffers.
    pub memory: u64,
    /// Replace what the part's directory holds.
    pub overwrite: bool,
    /// The user guarantees a single writer ([`crate::run::Writing::single_writer`]).
    pub single_writer: bool,
}

impl ScatterConfig {
    /// A config with the CLI's defaults: 4 GiB of memory, no overwrite.
    pub fn new(
        inputs: Vec<PathBuf>,
        work: impl Into<PathBuf>,
        seed: u64,
        part: Part,
        buckets: u64,
    ) -> ScatterConfig {
        ScatterConfig {
            inputs,
            work: work.into(),
            seed,
            part,
            buckets,
            memory: 4 << 30,
            overwrite: false,
            single_writer: false,
        }
    }
}

/// What one gather task is asked to do.
#[derive(Debug, Clone)]
pub struct GatherConfig {
    /// The work directory the scatter tasks wrote.
    pub work: PathBuf,
    /// The dataset directory to write.
    pub output: PathBuf,
    /// The bucket to gather, `0 <= bucket < B`.
    pub bucket: u64,
    /// Shard size and whether to replace what the output holds.
    pub writing: Writing,
    /// Worker threads for sorting; 0 means one per core. The output does not depend on it.
    pub threads: usize,
}

impl GatherConfig {
    /// A config with the CLI's defaults: 1 GiB shards, every core.
    pub fn new(work: impl Into<PathBuf>, output: impl Into<PathBuf>, bucket: u64) -> GatherConfig {
        GatherConfig {
            work: work.into(),
            output: output.into(),
            bucket,
            writing: Writing::default(),
            threads: 0,
        }
    }
}

/// The contents of `scatter.json`: one scatter part, and what gather needs
/// to check it belongs with the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScatterInfo {
    /// Always `"prep-scatter"`.
    pub format: String,
    /// [`SCATTER_VERSION`].
    pub version: u64,
    /// XXH3-64 of everything that shapes the run but the part: prep's
    /// version, seed, parts, buckets and each input's size and manifest
    /// checksum. Equal in every part of one run; the gathered datasets'
    /// `partition.job`.
    pub job: String,
    /// This part's number, `0 <= part < parts`.
    pub part: u64,
    /// Scatter parts in the run (`N`).
    pub parts: u64,
    /// Buckets in the run (`B`): the gather tasks.
    pub buckets: u64,
    /// The seed of the permutation.
    pub seed: u64,
    /// Documents of all inputs together.
    pub n_total: u64,
    /// This part's first document `g`.
    pub start: u64,
    /// One past its last: the part holds documents `start..end`.
    pub end: u64,
    /// The input datasets, in order, as the provenance records them.
    pub inputs: Vec<InputInfo>,
    /// What the gathered datasets share with the inputs.
    pub base: Base,
    /// The data file, relative to the part's directory.
    pub data: String,
    /// Its size in bytes: the header and every region.
    pub data_bytes: u64,
    /// One per bucket, in bucket order.
    pub regions: Vec<Region>,
}

/// The fields of the inputs' manifests that a gathered dataset keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Base {
    /// Token type.
    pub dtype: Dtype,
    /// Every token id is below this.
    pub vocab_size: u64,
    /// Ids of the special tokens.
    pub special_tokens: SpecialTokens,
    /// Every document starts with `special_tokens.bos`.
    pub bos_prepended: bool,
    /// Every document ends with `special_tokens.eos`.
    pub eos_appended: bool,
    /// The tokenizer, whose copy lies in the part's directory.
    pub tokenizer: TokenizerInfo,
    /// The documents carry loss masks: each record in the data file is its
    /// tokens followed by its mask, a byte per token.
    #[serde(default)]
    pub loss_mask: bool,
}

impl Base {
    /// What a gathered dataset keeps of the inputs' manifest.
    fn of(manifest: Manifest) -> Base {
        Base {
            dtype: manifest.dtype,
            vocab_size: manifest.vocab_size,
            special_tokens: manifest.special_tokens,
            bos_prepended: manifest.bos_prepended,
            eos_appended: manifest.eos_appended,
            loss_mask: manifest.has_loss_mask(),
            tokenizer: manifest.tokenizer,
        }
    }
}

/// One bucket's region of the data file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    /// Where it starts in the data file.
    pub offset: u64,
    /// Its size: 24 bytes per document plus its tokens (and their masks).
    pub bytes: u64,
    /// Documents in it.
    pub records: u64,
    /// XXH3-64 of its bytes, 16 hex digits.
    pub xxh3: String,
}

/// What a scatter task did.
#[derive(Debug, Clone)]
pub struct ScatterReport {
    /// The part's directory.
    pub dir: PathBuf,
    /// Its `scatter.json`.
    pub info: ScatterInfo,
    /// True when the part was already complete and nothing was done.
    pub already_complete: bool,
    /// Wall time.
    pub elapsed: Duration,
}

/// What a gather task did.
#[derive(Debug, Clone)]
pub struct GatherReport {
    /// The manifest written (or found complete).
    pub manifest: Manifest,
    /// Scatter parts read.
    pub parts: u64,
    /// Bytes of the bucket's regions read.
    pub bytes: u64,
    /// True when the output was already complete and nothing was done.
    pub already_complete: bool,
    /// Wall time.
    pub elapsed: Duration,
}

/// Runs scatter task `config.part`: writes its documents' bucket regions
/// and `scatter.json` into [`part_dir`]`(work, I)`.
///
/// Memory: a write buffer per bucket, `memory / 2 / B` clamped to 4 KiB ..
/// 4 MiB, about 1 KiB of state per bucket, and one document. Reads the
/// indexes of its share twice and its tokens once, sequentially; writes
/// each byte once.
pub fn scatter(
    config: &ScatterConfig,
    progress: &dyn Progress,
) -> Result<ScatterReport, ShuffleError> {
    let started = Instant::now();
    let (part, buckets) = (config.part, config.buckets);
    check_buckets(config)?;
    let dir = part_dir(&config.work, part.index);
    crate::run::refuse_overlap(&dir, &config.inputs, "the input")?;
    let Inputs {
        datasets,
        base,
        info: inputs,
        _local,
    } = open_inputs(&config.inputs)?;
    let n_total: u64 = datasets.iter().map(|d| d.len()).sum();
    let job = crate::run::job_fingerprint(
        "shuffle --scatter",
        &json!({ "seed": config.seed, "parts": part.count, "buckets": buckets }),
        &inputs,
    );
    let task = crate::run::part_fingerprint(&job, Some(part));

    let mut output = Output::lock(&dir, config.single_writer)?.owning(&[SCATTER_FILE, DATA_FILE]);
    if !config.overwrite {
        if let Some(done) = crate::task::finished_task::<ScatterInfo>(&dir, &job, part)? {
            progress.note("this scatter part is already complete; nothing to do");
            output.progressed();
            return Ok(ScatterReport {
                dir,
                info: done,
                already_complete: true,
                elapsed: started.elapsed(),
            });
        }
    }
    crate::task::start_afresh::<ScatterInfo>(&mut output, &task, config.overwrite, &dir)?;

    let range = part.range(n_total);
    let layout = lay_out(&datasets, range.clone(), config.seed, buckets)?;
    let regions = write_regions(
        config,
        &datasets,
        range.clone(),
        &layout,
        output.dir(),
        progress,
    )?;

    output.copy_tokenizer(base.tokenizer.file.as_deref(), datasets[0].dir())?;
    let info = ScatterInfo {
        format: SCATTER_FORMAT.into(),
        version: SCATTER_VERSION,
        job,
        part: part.index,
        parts: part.count,
        buckets,
        seed: config.seed,
        n_total,
        start: range.start,
        end: range.end,
        inputs,
        base: Base::of(base),
        data: DATA_FILE.into(),
        data_bytes: layout.data_bytes,
        regions,
    };
    let mut json = serde_json::to_string_pretty(&info).expect("a scatter description serializes");
    json.push('\n');
    output.commit_file(SCATTER_FILE, json.as_bytes())?;
    progress.finish();
    Ok(ScatterReport {
        dir,
        info,
        already_complete: false,
        elapsed: started.elapsed(),
    })
}

/// Refuses a scatter without buckets, or with more than the memory budget
/// can buffer.
fn check_buckets(config: &ScatterConfig) -> Result<(), ShuffleError> {
    let buckets = config.buckets;
    if buckets == 0 {
        return Err(ShuffleError::BadScatter {
            path: config.work.clone(),
            why: "a scatter needs at least 1 bucket".into(),
        });
    }
    let need = buckets.saturating_mul(MIN_BUFFER + BUCKET_STATE);
    if need > config.memory {
        return Err(ShuffleError::TooManyBuckets { buckets, need });
    }
    Ok(())
}

/// Where each bucket's region lies in the data file.
struct Layout {
    /// Each bucket's (records, bytes).
    sizes: Vec<(u64, u64)>,
    /// Where each bucket's region starts.
    offsets: Vec<u64>,
    /// The data file's size: the header and every region.
    data_bytes: u64,
}

/// First pass, indexes only: each bucket's size, so that the regions can
/// be laid out back to back before a token is read.
fn lay_out(
    datasets: &[Dataset],
    range: Range<u64>,
    seed: u64,
    buckets: u64,
) -> Result<Layout, ShuffleError> {
    let mut sizes = vec![(0u64, 0u64); buckets as usize]; // (records, bytes)
    for_each_length(datasets, range, |g, len| {
        let size = &mut sizes[bucket_of(key(seed, g), buckets) as usize];
        size.0 += 1;
        size.1 += BUCKET_HEADER as u64 + len;
        Ok(())
    })?;
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut end = DATA_HEADER;
    for &(_, bytes) in &sizes {
        offsets.push(end);
        end += bytes;
    }
    Ok(Layout {
        sizes,
        offsets,
        data_bytes: end,
    })
}

/// Second pass: every document to its bucket's cursor, through a small
/// buffer per bucket, into the data file of `dir`; returns the regions.
fn write_regions(
    config: &ScatterConfig,
    datasets: &[Dataset],
    range: Range<u64>,
    layout: &Layout,
    dir: &Path,
    progress: &dyn Progress,
) -> Result<Vec<Region>, ShuffleError> {
    let (seed, buckets) = (config.seed, config.buckets);
    // Into the part's directory, or its staging folder when the work
    // directory is in object storage.
    let path = dir.join(DATA_FILE);
    let tmp = dir.join(format!("{DATA_FILE}{}", crate::format::TMP_SUFFIX));
    let io = |e| ShuffleError::Format(crate::format::FormatError::io(tmp.clone(), e));
    let file = std::sync::Arc::new(create_data_file(&tmp, layout.data_bytes)?);
    let buffer = (config.memory / 2 / buckets).clamp(MIN_BUFFER, MAX_BUFFER) as usize;
    let (ats, paths) = layout
        .offsets
        .iter()
        .map(|&pos| {
            (
                At {
                    file: file.clone(),
                    pos,
                },
                tmp.clone(),
            )
        })
        .unzip();
    let mut regions = Spool::new(ats, paths, buffer)?;
    let mut moved = Moved {
        bytes: 0,
        total: layout.data_bytes,
        docs: 0,
    };
    for_each_document(datasets, range, |g, tokens, mask| {
        let k = key(seed, g);
        let record = [tokens, mask.unwrap_or_default()];
        regions.put(bucket_of(k, buckets) as usize, k, g, &record)?;
        moved.bytes += (BUCKET_HEADER + tokens.len() + record[1].len()) as u64;
        moved.docs += 1;
        if moved.docs.is_multiple_of(4096) {
            moved.report(progress);
        }
        Ok(())
    })?;
    let regions = close_regions(regions, layout, &tmp)?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&tmp, &path)
        .map_err(|e| ShuffleError::Format(crate::format::FormatError::io(path.clone(), e)))?;
    Ok(regions)
}

/// Creates the data file at `tmp`, `data_bytes` long, with its header.
fn create_data_file(tmp: &Path, data_bytes: u64) -> Result<File, ShuffleError> {
    let io = |e| ShuffleError::Format(crate::format::FormatError::io(tmp, e));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)
        .map_err(io)?;
    file.set_len(data_bytes).map_err(io)?;
    let mut header = [0u8; DATA_HEADER as usize];
    header[..8].copy_from_slice(DATA_MAGIC);
    header[8..].copy_from_slice(&SCATTER_VERSION.to_le_bytes());
    // At the file's start: it was just opened.
    (&file).write_all(&header).map_err(io)?;
    Ok(file)
}

/// Flushes every region's buffer and describes the region, checking that it
/// holds the bytes the first pass laid out.
fn close_regions(
    regions: Spool<At>,
    layout: &Layout,
    tmp: &Path,
) -> Result<Vec<Region>, ShuffleError> {
    regions
        .finish()?
        .into_iter()
        .zip(layout.offsets.iter().zip(&layout.sizes))
        .map(|(b, (&offset, &(records, bytes)))| {
            if b.bytes != bytes {
                // The first pass saw other lengths: an input changed meanwhile.
                return Err(ShuffleError::Corrupt {
                    path: tmp.to_path_buf(),
                    why: "the inputs changed while being scattered; run the task again".into(),
                });
            }
            Ok(Region {
                offset,
                bytes,
                records,
                xxh3: checksum_hex(b.xxh3),
            })
        })
        .collect()
}

/// Runs gather task `config.bucket`: reads that bucket's region of every
/// scatter part, sorts it and writes it as a dataset.
///
/// Memory: the bucket's tokens and 32 bytes per document.
pub fn gather(
    config: &GatherConfig,
    progress: &dyn Progress,
) -> Result<GatherReport, ShuffleError> {
    let started = Instant::now();
    let parts = crate::task::read_parts::<ScatterInfo>(&config.work)?;
    let first = &parts[0].1;
    let (buckets, j) = (first.buckets, config.bucket);
    if j >= buckets {
        return Err(ShuffleError::NoBucket { bucket: j, buckets });
    }
    let dir = &config.output;
    let scattered: Vec<&PathBuf> = parts.iter().map(|(d, _)| d).collect();
    crate::run::refuse_overlap(dir, &scattered, "the scatter directory")?;
    let options = json!({
        "seed": first.seed,
        "parts": first.parts,
        "buckets": buckets,
        "bucket": j,
        "shard_size": config.writing.shard_size,
    });
    // The gather of every bucket is one job (the scatter job's, with this
    // stage's own options); each bucket is a part of it.
    let gather_job = crate::run::job_fingerprint(
        "shuffle --gather",
        &json!({ "scatter": first.job, "shard_size": config.writing.shard_size }),
        &[],
    );
    let fingerprint = crate::run::part_fingerprint(&gather_job, Part::new(j, buckets));
    let mut output = Output::lock(dir, config.writing.single_writer)?;
    let journal =
        match output.start::<JournalState, Checkpoint>(&fingerprint, config.writing.overwrite)? {
            Start::Complete(manifest) => {
                progress.note("this bucket's dataset is already complete; nothing to do");
                return Ok(GatherReport {
                    manifest: *manifest,
                    parts: parts.len() as u64,
                    bytes: 0,
                    already_complete: true,
                    elapsed: started.elapsed(),
                });
            }
            Start::Fresh(journal) => journal,
            // Interrupted: a gather is one task's work, done again in full.
            Start::Resume(_) => output.restart(&fingerprint)?,
        };

    let (batch, bytes, records) = collect_bucket(&parts, j)?;
    let shards = sort_and_write(
        config,
        &mut output,
        journal,
        (first.base.dtype, first.base.loss_mask),
        batch,
        progress,
    )?;

    let (part0, _) = &parts[0];
    output.copy_tokenizer(first.base.tokenizer.file.as_deref(), part0)?;
    let manifest = gathered_manifest(first, j, shards, options, records, fingerprint);
    output.commit(&manifest)?;
    progress.finish();
    Ok(GatherReport {
        manifest,
        parts: parts.len() as u64,
        bytes,
        already_complete: false,
        elapsed: started.elapsed(),
    })
}

/// Reads bucket `j`'s region of every part into one batch; returns it with
/// the regions' bytes and documents.
fn collect_bucket(
    parts: &[(PathBuf, ScatterInfo)],
    j: u64,
) -> Result<(Batch, u64, u64), ShuffleError> {
    // Every region is checked against the data file's size before anything
    // is allocated for it.
    let mut bytes = 0u64;
    let mut records = 0u64;
    for (part_dir, info) in parts {
        let region = &info.regions[j as usize];
        check_data_file(part_dir, info)?;
        bytes += region.bytes;
        records += region.records;
    }
    let mut batch = Batch::with_capacity(
        bytes.saturating_sub(records * BUCKET_HEADER as u64) as usize,
        records as usize,
    );
    for (part_dir, info) in parts {
        read_region(part_dir, info, j, &mut batch)?;
    }
    Ok((batch, bytes, records))
}

/// Sorts the bucket's documents and writes them as the output's shards.
fn sort_and_write(
    config: &GatherConfig,
    output: &mut Output,
    journal: Journal,
    (dtype, masked): (Dtype, bool),
    batch: Batch,
    progress: &dyn Progress,
) -> Result<Vec<ShardInfo>, ShuffleError> {
    let pool = crate::run::thread_pool(config.threads, "scatter").map_err(|e| {
        ShuffleError::Format(crate::format::FormatError::io(config.output.clone(), e))
    })?;
    let local = output.dir().to_path_buf();
    let mut sorter = Gather {
        pool: &pool,
        writer: DatasetWriter::new(&local, dtype, config.writing.shard_size, Vec::new())
            .masked(masked),
        journal,
        output,
        tmp: local.join(TMP_DIR),
        budget: u64::MAX,
        moved: Moved {
            bytes: 0,
            total: batch.data.len() as u64,
            docs: 0,
        },
        progress,
    };
    let mut records = batch.records();
    super::sort(&pool, &mut records);
    sorter.emit_records("", records, 0)?;
    Ok(sorter.writer.finish()?)
}

/// The manifest of gathered bucket `j`: the inputs' fields, shuffle's
/// provenance, and the bucket as a part of the scatter's job.
fn gathered_manifest(
    first: &ScatterInfo,
    j: u64,
    shards: Vec<ShardInfo>,
    options: serde_json::Value,
    records: u64,
    fingerprint: String,
) -> Manifest {
    let base = first.base.clone();
    Manifest::documents(
        base.dtype,
        base.vocab_size,
        base.tokenizer,
        shards,
        Provenance::new(
            "shuffle",
            first.inputs.clone(),
            options,
            DocumentCounts::all_written(records),
            fingerprint,
        ),
    )
    .with_specials(base.special_tokens, base.bos_prepended, base.eos_appended)
    .with_partition(Some(Partition {
        stage: "shuffle".into(),
        part: j,
        parts: first.buckets,
        job: first.job.clone(),
        hashes: None,
    }))
}

/// A writer at a position of a file, for one bucket's region: each write
/// seeks there first, so that many regions of one file fill in any order.
struct At {
    file: std::sync::Arc<File>,
    pos: u64,
}

impl Write for At {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut file = &*self.file;
        file.seek(SeekFrom::Start(self.pos))?;
        // In pieces of at most MAX_WRITE, as every large file is written.
        let n = file.write(crate::format::write_piece(self.pos, buf))?;
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hash: Xxh3,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// The `scatter.json` of a part's directory, or `None` when it has none
/// (not started, or not finished).
impl crate::task::Described for ScatterInfo {
    const PREFIX: &'static str = "scatter";
    const FILE: &'static str = SCATTER_FILE;
    const FORMAT: &'static str = SCATTER_FORMAT;
    const VERSION: u64 = SCATTER_VERSION;
    const MAX_BYTES: u64 = MAX_SCATTER_JSON;
    const WHAT: &'static str = "scatter part";
    const RUN: &'static str = "prep shuffle --scatter";
    const NEXT: &'static str = "gather";

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
        inconsistency(self)
    }

    fn intact(&self, dir: &Path) -> bool {
        data_intact(dir, self)
    }

    /// The counts that differ, or else its inputs or prep version.
    fn differs(&self, first: &ScatterInfo) -> String {
        let what = [
            ("seed", self.seed, first.seed),
            ("parts", self.parts, first.parts),
            ("buckets", self.buckets, first.buckets),
            ("documents", self.n_total, first.n_total),
        ]
        .iter()
        .filter(|(_, a, b)| a != b)
        .map(|(name, a, b)| format!("{name} {a}, not {b}"))
        .collect::<Vec<_>>();
        if what.is_empty() {
            "its inputs or prep version differ".into()
        } else {
            what.join(", ")
        }
    }
}

/// What is wrong with a `scatter.json` on its own, if anything: counts out
/// of range, a part range that is not the part's, regions that do not tile
/// the data file.
fn inconsistency(info: &ScatterInfo) -> Option<String> {
    let Some(part) = Part::new(info.part, info.parts) else {
        return Some(format!(
            "part {} of {} does not exist",
            info.part, info.parts
        ));
    };
    if info.buckets == 0 || info.regions.len() as u64 != info.buckets {
        return Some(format!(
            "{} regions for {} buckets",
            info.regions.len(),
            info.buckets
        ));
    }
    let range = part.range(info.n_total);
    if (info.start, info.end) != (range.start, range.end) {
        return Some(format!(
            "documents {}..{}, but part {part} of {} documents is {}..{}",
            info.start, info.end, info.n_total, range.start, range.end
        ));
    }
    if !crate::format::is_safe_relative(&info.data) {
        return Some(format!(
            "data file {:?} is not a plain relative path",
            info.data
        ));
    }
    let mut at = DATA_HEADER;
    for (j, r) in info.regions.iter().enumerate() {
        let headers = r.records.checked_mul(BUCKET_HEADER as u64);
        if r.offset != at || headers.is_none_or(|h| h > r.bytes) {
            return Some(format!(
                "bucket {j}'s region does not follow the one before it, or is too small for its documents"
            ));
        }
        match at.checked_add(r.bytes) {
            Some(next) => at = next,
            None => return Some(format!("bucket {j}'s region ends past 2^64 bytes")),
        }
    }
    (at != info.data_bytes).then(|| {
        format!(
            "the regions end at byte {at}, the data file at {}",
            info.data_bytes
        )
    })
}

/// True when a part's data file has the size its `scatter.json` records.
fn data_intact(dir: &Path, info: &ScatterInfo) -> bool {
    let file = Files::new(dir).map(|s| s.open(&info.data));
    matches!(file, Ok(Ok(Some(f))) if f.len() == info.data_bytes)
}

/// Checks a part's data file against its `scatter.json`: size, magic and
/// version.
fn check_data_file(dir: &Path, info: &ScatterInfo) -> Result<(), ShuffleError> {
    let source = Files::new(dir)?;
    let path = source.path_of(&info.data);
    let corrupt = |why: String| ShuffleError::Corrupt {
        path: path.clone(),
        why: format!(
            "{why}; run scatter part {}/{} again (with --overwrite)",
            info.part, info.parts
        ),
    };
    let file = source.open(&info.data)?.ok_or_else(|| {
        ShuffleError::Format(crate::format::FormatError::io(
            path.clone(),
            std::io::ErrorKind::NotFound.into(),
        ))
    })?;
    let len = file.len();
    if len != info.data_bytes {
        return Err(corrupt(format!(
            "{len} bytes, but {SCATTER_FILE} says {}",
            info.data_bytes
        )));
    }
    let header = file.read(0..DATA_HEADER)?;
    if header.len() as u64 != DATA_HEADER {
        return Err(corrupt("is shorter than its header".into()));
    }
    if &header[..8] != DATA_MAGIC {
        return Err(corrupt("does not start with PREPSCAT".into()));
    }
    let version = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
    if version != info.version {
        return Err(corrupt(format!(
            "version {version}, but {SCATTER_FILE} says {}",
            info.version
        )));
    }
    Ok(())
}

/// Reads bucket `j`'s region of one part into `batch`, checking its
/// documents, their buckets, its record count and its XXH3.
fn read_region(
    dir: &Path,
    info: &ScatterInfo,
    j: u64,
    batch: &mut Batch,
) -> Result<(), ShuffleError> {
    let source = Files::new(dir)?;
    let path = source.path_of(&info.data);
    let region = &info.regions[j as usize];
    let corrupt = |why: String| {
        ShuffleError::Corrupt {
        path: path.clone(),
        why: format!(
            "bucket {j}'s region ({} bytes at {}) {why}: the file is damaged; run scatter part {}/{} \
             again (with --overwrite)",
            region.bytes, region.offset, info.part, info.parts
        ),
    }
    };
    let file = source.open(&info.data)?.ok_or_else(|| {
        ShuffleError::Format(crate::format::FormatError::io(
            path.clone(),
            std::io::ErrorKind::NotFound.into(),
        ))
    })?;
    let mut reader = Hashing {
        inner: file.reader(region.offset..region.offset + region.bytes),
        hash: Xxh3::new(),
    };
    let mut stray = None;
    let records = read_records(&mut reader, region.bytes, &path, |k, g, tokens| {
        if bucket_of(k, info.buckets) != j || k != key(info.seed, g) {
            stray.get_or_insert(g);
        }
        batch.push(k, g, tokens);
        Ok(())
    })
    .map_err(|e| match e {
        ShuffleError::Corrupt { why, .. } => corrupt(why),
        e => e,
    })?;
    let found = checksum_hex(reader.hash.digest());
    if found != region.xxh3 {
        return Err(corrupt(format!(
            "has XXH3 {found}, {SCATTER_FILE} says {}",
            region.xxh3
        )));
    }
    if records != region.records {
        return Err(corrupt(format!(
            "holds {records} documents, {SCATTER_FILE} says {}",
            region.records
        )));
    }
    if let Some(g) = stray {
        return Err(corrupt(format!(
            "holds document {g}, whose key is not of this bucket under seed {}",
            info.seed
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::NoProgress;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/validate/good")
    }

    /// Every file of a directory, names sorted, with its bytes.
    fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut all: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                (name, std::fs::read(e.path()).unwrap())
            })
            .collect();
        all.sort();
        all
    }

    #[test]
    fn a_scatter_killed_midway_is_done_again_and_another_tasks_is_refused() {
        let work = tempfile::tempdir().unwrap();
        let part = Part::new(1, 2).unwrap();
        let config = ScatterConfig::new(vec![fixture()], work.path(), 6, part, 3);
        let done = scatter(&config, &NoProgress).unwrap();
        let complete = files(&done.dir);
        // What a kill leaves: the journal, part of the data file, no scatter.json.
        std::fs::remove_file(done.dir.join(SCATTER_FILE)).unwrap();
        std::fs::remove_file(done.dir.join(DATA_FILE)).unwrap();
        std::fs::write(done.dir.join("buckets.bin.tmp"), b"PREPSCAT").unwrap();
        save_journal::<(), ()>(
            &done.dir,
            &crate::run::part_fingerprint(&done.info.job, Some(part)),
        );
        let again = scatter(&config, &NoProgress).unwrap();
        assert!(!again.already_complete);
        assert_eq!(files(&done.dir), complete);

        // The same, left by another task: not this one's to take over.
        std::fs::remove_file(done.dir.join(SCATTER_FILE)).unwrap();
        save_journal::<(), ()>(
            &done.dir,
            &crate::run::part_fingerprint(&done.info.job, Part::new(0, 2)),
        );
        let err = scatter(&config, &NoProgress).unwrap_err();
        assert!(
            matches!(
                err,
                ShuffleError::Output(crate::output::OutputError::Refused { .. })
            ),
            "{err}"
        );
    }

    #[test]
    fn a_gather_killed_midway_is_done_again() {
        let work = tempfile::tempdir().unwrap();
        for i in 0..2 {
            let part = Part::new(i, 2).unwrap();
            scatter(
                &ScatterConfig::new(vec![fixture()], work.path(), 6, part, 2),
                &NoProgress,
            )
            .unwrap();
        }
        let out = work.path().join("out");
        let mut config = GatherConfig::new(work.path(), &out, 1);
        config.writing.shard_size = 16;
        let done = gather(&config, &NoProgress).unwrap();
        assert!(done.manifest.shards.len() > 1);
        let shards = |dir: &Path| {
            files(dir)
                .into_iter()
                .filter(|(n, _)| n.starts_with("shard-"))
                .collect::<Vec<_>>()
        };
        let complete = shards(&out);
        // Killed after its first shard: a journal, a shard, a partial one.
        std::fs::remove_file(out.join(crate::format::MANIFEST_FILE)).unwrap();
        std::fs::remove_file(out.join(&done.manifest.shards[1].bin)).unwrap();
        std::fs::write(out.join("shard-00001.bin.tmp"), b"partial").unwrap();
        save_journal::<JournalState, Checkpoint>(&out, &done.manifest.provenance.fingerprint);
        let again = gather(&config, &NoProgress).unwrap();
        assert!(!again.already_complete);
        assert_eq!(shards(&out), complete);
        assert!(!out.join(crate::output::JOURNAL_FILE).exists());
        assert!(!out.join("shard-00001.bin.tmp").exists());
    }

    /// What a run killed after its start leaves: its journal, nothing done.
    fn save_journal<S: Default + serde::Serialize, C: serde::Serialize>(
        dir: &Path,
        fingerprint: &str,
    ) {
        let journal = crate::output::Journal::<S, C>::new(fingerprint);
        std::fs::write(dir.join(crate::output::JOURNAL_FILE), journal.to_lines()).unwrap();
    }

    #[test]
    fn buckets_are_key_intervals_in_order() {
        for b in [1u64, 2, 3, 5, 7, 64, 1000] {
            assert_eq!(bucket_of(0, b), 0);
            assert_eq!(bucket_of(u64::MAX, b), b - 1);
            let mut prev = 0;
            for k in (0..=u64::MAX).step_by((u64::MAX / 9973) as usize) {
                let j = bucket_of(k, b);
                assert!(j >= prev && j < b, "key {k} of {b} buckets");
                // The interval [j·2⁶⁴/B, (j+1)·2⁶⁴/B) holds k.
                let lo = (u128::from(j) << 64).div_ceil(u128::from(b));
                let hi = (u128::from(j + 1) << 64).div_ceil(u128::from(b));
                assert!(lo <= u128::from(k) && u128::from(k) < hi);
                prev = j;
            }
        }
    }
}
