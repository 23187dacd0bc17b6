//! `prep pack`: a documents dataset into rows of exactly `seq_len` tokens,
//! with a segment index that says where every document piece lies.
//!
//! Two modes:
//!
//! - **concat** lays the documents end to end and cuts the stream every `L`
//!   tokens, as Megatron-LM, nanoGPT and llm.c do. Rows keep the input order
//!   unless a seed is given; the last partial row is dropped unless
//!   `pad_last`.
//! - **bestfit** cuts only documents longer than `L` (into pieces of `L` and
//!   a remainder) and packs all pieces whole by best-fit decreasing
//!   ([`bestfit`]), padding each row's rest. The input is packed in windows
//!   of `window` documents, independently (memory stays bounded and windows
//!   are planned in parallel); each window's rows are written in a seeded
//!   random order, because decreasing order would put long documents first.
//!
//! The output is the same for any thread count. Rows of one shard are fixed
//! in number (`shard_size / (L * token size)`), so an interrupted run resumes
//! after its last complete shard: the plans are recomputed (they are cheap),
//! the rows already written are skipped.
//!
//! A packed row's pieces, as a variable-length attention kernel takes them
//! ([`crate::format::Dataset::segments`]):
//!
//! ```
//! use prep::pack::{self, PackConfig};
//! use prep::format::Dataset;
//!
//! // Pack the 36 documents of a test fixture into rows of 16 tokens.
//! let dir = std::env::temp_dir().join(format!("prep-doc-segments-{}", std::process::id()));
//! let mut config = PackConfig::new("fixtures/validate/good", &dir, 16);
//! config.writing.overwrite = true;
//! pack::run(&config, &prep::progress::NoProgress)?;
//!
//! let ds = Dataset::open(&dir)?;
//! for i in 0..ds.len() {
//!     let row = ds.record(i)?;
//!     let pieces = ds.segments(i)?;
//!     // cu_seqlens for a variable-length attention kernel: where each piece
//!     // starts, then where the last one ends (the rest is padding).
//!     let mut cu_seqlens: Vec<u32> = pieces.iter().map(|p| p.start).collect();
//!     cu_seqlens.push(pieces.last().map_or(0, |p| p.start + p.length));
//!     assert_eq!(cu_seqlens[0], 0);
//!     assert!(*cu_seqlens.last().unwrap() as usize <= row.len());
//! }
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Partitioned runs
//!
//! With [`PackConfig::part`] set to part `I` of `N` (`--part I/N`), a run
//! writes one share of the packed dataset, and `prep merge` joins the shares
//! of parts `0..N` in order (rows and segment indexes concatenated, counts
//! summed) into **exactly** the dataset a run without a part writes: the
//! same rows in the same order, the same segments, the same counts. No part
//! reads another's output, so the parts can run anywhere, at once.
//!
//! - **concat**: of the `R` output rows (the last partial one included with
//!   `pad_last`), part `I` writes rows [`Part::range`]`(R)`. Output row `k`
//!   is stream row `k`, or its image under the seeded permutation, and any
//!   stream row is computed from its number alone.
//! - **bestfit**: the `W = ceil(documents / window)` windows are planned and
//!   written independently already (each window's rows in its own seeded
//!   order), so part `I` packs windows `Part::range(W)` as a single run
//!   would. The one limit of partitioning: no more than `W` parts have work;
//!   the others write an empty dataset.
//!
//! A part's counts add up with the other parts' to the single run's:
//! bestfit counts what its windows hold. concat counts a document (and
//! whether it is cut) in the part whose share of the stream, tokens
//! `start * L .. end * L` of its rows' range, holds the document's first
//! token (the last part also owns what lies past its share: documents only
//! in the dropped tail); it counts the pieces and the padding in the rows it
//! writes, so that each part's segment indexes agree with its own manifest,
//! and the dropped tokens in the last part. `provenance.documents` counts
//! the input documents attributed to the part the same way.
//!
//! Every part writes a valid dataset, empty when its share is, with a
//! manifest whose `partition` names the part and the run's `job`: the
//! fingerprint a run without a part has. The part's own fingerprint also
//! covers the part, so a part re-run into its directory finds its output
//! complete, or resumes it when it was interrupted.

pub mod bestfit;
mod concat;
mod writer;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde_json::json;

use crate::format::{
    Dataset, DocumentCounts, FormatError, InputInfo, Manifest, Packing, ShardInfo, Verified,
};
use crate::output::{Done, Output, OutputError, Start};
use crate::partition::Part;
use crate::permute::Permutation;
use crate::progress::{Progress, ProgressSnapshot};
use crate::run::Writing;
use writer::{batch_rows, PackWriter, RowBuilder};

/// How documents become rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackMode {
    /// End to end, cut every `seq_len` tokens.
    Concat,
    /// Whole documents (pieces of long ones) by best-fit decreasing, padded.
    BestFit,
}

impl PackMode {
    /// The name used on the command line and in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            PackMode::Concat => "concat",
            PackMode::BestFit => "bestfit",
        }
    }
}

/// What `prep pack` is asked to do.
#[derive(Debug, Clone)]
pub struct PackConfig {
    /// The documents dataset to pack.
    pub input: PathBuf,
    /// The dataset directory to write.
    pub output: PathBuf,
    /// Tokens per row.
    pub seq_len: u32,
    /// concat or bestfit.
    pub mode: PackMode,
    /// The pad token (a token string or an id); default the input's pad
    /// token, else its eos.
    pub pad: Option<String>,
    /// A separator to add after every document, for inputs without eos.
    pub sep: Option<String>,
    /// Pack an input without eos as it is, with no separator.
    pub no_sep: bool,
    /// The seed of the row order. concat: `None` keeps the input order;
    /// bestfit: `None` means 0.
    pub seed: Option<u64>,
    /// Documents per best-fit window.
    pub window: u64,
    /// concat: pad the last partial row instead of dropping it.
    pub pad_last: bool,
    /// Shard size and whether to replace what the output holds.
    pub writing: Writing,
    /// Threads for planning best-fit windows; 0 means one per core. The
    /// output does not depend on it.
    pub threads: usize,
    /// Write only this share of the packed dataset, for `prep merge` to join
    /// with the other parts' (see the [module docs](self)); `None` writes
    /// the whole dataset.
    pub part: Option<Part>,
}

/// Documents per best-fit window unless told otherwise.
pub const DEFAULT_WINDOW: u64 = 1_000_000;

impl PackConfig {
    /// A config with the CLI's defaults: bestfit, seed 0, windows of
    /// [`DEFAULT_WINDOW`] documents, 1 GiB shards.
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>, seq_len: u32) -> PackConfig {
        PackConfig {
            input: input.into(),
            output: output.into(),
            seq_len,
            mode: PackMode::BestFit,
            pad: None,
            sep: None,
            no_sep: false,
            seed: None,
            window: DEFAULT_WINDOW,
            pad_last: false,
            writing: Writing::default(),
            threads: 0,
            part: None,
        }
    }
}

/// Every way `prep pack` can fail.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// The input or the output could not be read or written.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The output overlaps an input.
    #[error(transparent)]
    Overlap(#[from] crate::run::Overlap),
    /// The options do not fit together or do not fit the input.
    #[error("{0}")]
    Usage(String),
    /// The input is not a documents dataset.
    #[error(transparent)]
    NotDocuments(#[from] Box<crate::run::NotDocuments>),
    /// A `--pad` or `--sep` value that names no token.
    #[error("--{flag} {value:?}: {why}")]
    Token {
        /// `pad` or `sep`.
        flag: &'static str,
        /// The value given.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// The output directory was refused or is held by another run.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// An input dataset in object storage could not be fetched.
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct PackReport {
    /// The manifest written (`packing` holds the counts).
    pub manifest: Manifest,
    /// True when the output was already complete and nothing was done.
    pub already_complete: bool,
    /// Rows kept from an interrupted run.
    pub resumed_rows: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// The ids a run uses: the separator added after each document, if any,
/// and the pad token, if any.
struct Specials {
    sep: Option<u32>,
    pad: Option<u32>,
}

/// What a run decides before it writes: the special ids, the order's
/// seed, the options the manifest records and the run's fingerprints.
struct Plan {
    specials: Specials,
    seed: Option<u64>,
    window: Option<u64>,
    options: serde_json::Value,
    identity: crate::run::Identity,
}

/// Refuses flags that do not go together.
fn check_flags(config: &PackConfig) -> Result<(), PackError> {
    if config.seq_len == 0 {
        return Err(PackError::Usage("--seq-len must be at least 1".into()));
    }
    if config.mode == PackMode::BestFit && config.pad_last {
        return Err(PackError::Usage(
            "--pad-last applies to --mode concat (bestfit pads every row it does not fill)".into(),
        ));
    }
    if config.window == 0 {
        return Err(PackError::Usage("--window must be at least 1".into()));
    }
    Ok(())
}

/// Checks the input against the flags and plans the run.
fn plan(
    config: &PackConfig,
    input: &Dataset,
    shown_as: &std::path::Path,
) -> Result<Plan, PackError> {
    let base = input.manifest();
    crate::run::documents_only(
        "pack",
        &config.input,
        base,
        "from prep tokenize, shuffle, mix or split",
    )?;
    let specials = specials(config, base)?;
    // Before anything is written: rows that are not full need a pad token.
    let stream_tokens = input.n_tokens() + input.len() * u64::from(specials.sep.is_some());
    let short_rows = match config.mode {
        PackMode::BestFit => true,
        PackMode::Concat => {
            config.pad_last && !stream_tokens.is_multiple_of(u64::from(config.seq_len))
        }
    };
    if short_rows && specials.pad.is_none() {
        return Err(no_pad());
    }
    let seed = match config.mode {
        PackMode::Concat => config.seed,
        PackMode::BestFit => Some(config.seed.unwrap_or(0)),
    };
    let window = (config.mode == PackMode::BestFit).then_some(config.window);
    let options = json!({
        "seq_len": config.seq_len,
        "mode": config.mode.name(),
        "seed": seed,
        "window": window,
        "pad": specials.pad,
        "sep": specials.sep,
        "pad_last": config.pad_last,
        "shard_size": config.writing.shard_size,
    });
    let inputs = vec![InputInfo::of_dataset(shown_as, input.dir(), base)?];
    let identity = crate::run::Identity::new("pack", &options, inputs, config.part);
    Ok(Plan {
        specials,
        seed,
        window,
        options,
        identity,
    })
}

/// Runs `prep pack`: plans the run, resumes or starts its output, writes
/// the part's rows in the chosen mode, and commits the derived manifest.
pub fn run(config: &PackConfig, progress: &dyn Progress) -> Result<PackReport, PackError> {
    let started = Instant::now();
    check_flags(config)?;
    crate::run::refuse_overlap(&config.output, &[&config.input], "the input")?;
    let local = crate::fetch::Local::of(&config.input)?;
    let input = Dataset::open(local.dir())?;
    let plan = plan(config, &input, &config.input)?;
    let mut output = Output::lock(&config.output, config.writing.single_writer)?;
    let dir = &output.dir().to_path_buf();
    let mut journal =
        match output.start::<(), ()>(&plan.identity.fingerprint, config.writing.overwrite)? {
            Start::Complete(manifest) => {
                progress.note("the packed dataset is already complete; nothing to do");
                return Ok(PackReport {
                    manifest: *manifest,
                    already_complete: true,
                    resumed_rows: 0,
                    elapsed: started.elapsed(),
                });
            }
            Start::Resume(journal) | Start::Fresh(journal) => journal,
        };
    let kept = journal.shard_infos();
    let skip: u64 = kept.iter().map(|s| s.n_records).sum();
    if skip > 0 {
        progress.note(&format!(
            "resuming: kept {} complete shards ({skip} rows) of an interrupted run",
            kept.len()
        ));
    }

    let threads = crate::util::thread_count(config.threads);
    let pool = crate::run::thread_pool(threads, "pack")
        .map_err(|e| PackError::Format(crate::format::FormatError::io(dir.clone(), e)))?;
    let l = config.seq_len;
    // Every token and mask byte of a row is read through the input's checks.
    let verified = input.verified()?;
    let builder = RowBuilder::new(&verified, l, plan.specials.sep, plan.specials.pad);
    let mut rows = Rows {
        out: PackWriter::new(&builder, &pool, dir, config.writing.shard_size, kept),
        input: &verified,
        released: 0,
        pool: &pool,
        per_batch: batch_rows(u64::from(l) * input.manifest().dtype.size() as u64),
        skip,
        shown: Shown {
            progress,
            seq_len: u64::from(l),
            rows: 0,
        },
    };
    // Each shard is journaled as soon as it is in place.
    let mut sealed = |s: &ShardInfo| -> Result<(), PackError> {
        journal.shards.push(Done {
            shard: s.clone(),
            at: (),
        });
        Ok(output.save(&journal)?)
    };
    let (documents, packing) = match config.mode {
        PackMode::Concat => write_concat(config, &plan, &input, &mut rows, &mut sealed)?,
        PackMode::BestFit => write_bestfit(config, &plan, &input, threads, &mut rows, &mut sealed)?,
    };
    let shards = rows.out.finish(&mut sealed)?;
    output.copy_tokenizer(input.manifest().tokenizer.file.as_deref(), input.dir())?;
    let manifest = derived_manifest(config, plan, input.manifest(), shards, documents, packing);
    output.commit(&manifest)?;
    progress.finish();
    Ok(PackReport {
        manifest,
        already_complete: false,
        resumed_rows: skip,
        elapsed: started.elapsed(),
    })
}

/// The output rows as they are built and written, and what a run shows.
struct Rows<'a> {
    out: PackWriter<'a>,
    /// The input, read through its checks.
    input: &'a Verified<'a>,
    /// Documents before this one have left the process's memory.
    released: u64,
    pool: &'a rayon::ThreadPool,
    /// Rows built and written at a time.
    per_batch: u64,
    /// Rows kept from an interrupted run: the first this run writes.
    skip: u64,
    shown: Shown<'a>,
}

impl Rows<'_> {
    /// Drops the pages of the input's documents before `doc`, whose rows
    /// are all written, from the process's memory (they stay in the page
    /// cache): for the modes that read the input in order, so that what
    /// pack holds of it is the documents of the rows being built.
    fn release_before(&mut self, doc: u64) {
        if doc > self.released {
            self.out.release(self.released..doc);
            self.released = doc;
        }
    }
}

/// The journal's hook, called with each shard as it is sealed.
type Sealed<'s> = dyn FnMut(&ShardInfo) -> Result<(), PackError> + Send + 's;

/// Concat: the documents end to end, cut every `seq_len` tokens, the rows
/// in stream order or permuted by the seed; this part writes its share of
/// the rows. Returns the documents it accounts for and its packing record.
fn write_concat(
    config: &PackConfig,
    plan: &Plan,
    input: &Dataset,
    rows_out: &mut Rows,
    sealed: &mut Sealed,
) -> Result<(u64, Packing), PackError> {
    let (l, part) = (config.seq_len, config.part.unwrap_or(Part::WHOLE));
    let sep = u64::from(plan.specials.sep.is_some());
    let pool = rows_out.pool;
    let stream = concat::Stream::new(input, plan.specials.sep.is_some());
    let total = stream.len();
    let full = total / u64::from(l);
    let tail = total % u64::from(l);
    let rows = full + u64::from(config.pad_last && tail > 0);
    let written = (rows * u64::from(l)).min(total);
    let perm = plan.seed.map(|s| Permutation::new(rows, s, 0));
    let stream_row = |k: u64| perm.as_ref().map_or(k, |p| p.get(k));
    // This part writes output rows `share`. It counts the documents
    // whose first token lies in its share of the stream (the last
    // part also those past it, in the dropped tail), and the pieces
    // and padding of the rows it writes.
    let share = part.range(rows);
    let lu = u64::from(l);
    let owned = share.start * lu..if part.is_last() {
        u64::MAX
    } else {
        share.end * lu
    };
    // Unless a seed scatters them, the part's rows are one run of
    // the stream, and their pieces are counted in the same pass.
    let scattered = perm.is_some() && part.count > 1;
    let contiguous = if scattered { 0..0 } else { share.clone() };
    let lengths = input.record_lengths().map(|n| n + sep);
    let mut c = concat::counts(lengths, l, written, owned, contiguous);
    if scattered {
        let stream_rows = share.clone().into_par_iter().map(stream_row);
        c.pieces = pool.install(|| concat::pieces_in(&stream, stream_rows, l));
    }
    // Only the stream's last row can be padded.
    let padded = rows * lu - written;
    let holds_padded_row = padded > 0
        && if scattered {
            pool.install(|| {
                share
                    .clone()
                    .into_par_iter()
                    .any(|k| stream_row(k) + 1 == rows)
            })
        } else {
            share.contains(&(rows - 1))
        };
    rows_out.shown.rows = share.end - share.start;
    let mut first = share.start + rows_out.skip;
    while first < share.end {
        let last = (first + rows_out.per_batch).min(share.end);
        let batch: Vec<Vec<bestfit::Piece>> = pool.install(|| {
            (first..last)
                .into_par_iter()
                .map(|k| {
                    let mut pieces = Vec::new();
                    stream.row(stream_row(k), l, &mut pieces);
                    pieces
                })
                .collect()
        });
        rows_out.out.write(&batch, &mut *sealed)?;
        if perm.is_none() {
            // In stream order, every row before this batch is written.
            if let Some(p) = batch.first().and_then(|row| row.first()) {
                rows_out.release_before(p.doc);
            }
        }
        rows_out.shown.rows(last - share.start);
        first = last;
    }
    let packing = Packing {
        mode: "concat".into(),
        seed: plan.seed,
        window: None,
        separator: plan.specials.sep,
        rows: share.end - share.start,
        pad_tokens: if holds_padded_row { padded } else { 0 },
        pad_share: 0.0,
        documents: c.documents,
        documents_cut: c.cut,
        pieces: c.pieces,
        tokens_dropped: if part.is_last() { total - written } else { 0 },
    };
    Ok((c.records, packing))
}

/// Bestfit: windows of `--window` documents, each packed whole by best-fit
/// decreasing and its rows permuted by the seed and the window's number;
/// this part plans and writes its share of the windows, planned in
/// parallel and written in order. Returns the documents it accounts for
/// and its packing record.
fn write_bestfit(
    config: &PackConfig,
    plan: &Plan,
    input: &Dataset,
    threads: usize,
    rows_out: &mut Rows,
    sealed: &mut Sealed,
) -> Result<(u64, Packing), PackError> {
    let (l, part) = (config.seq_len, config.part.unwrap_or(Part::WHOLE));
    let sep = u64::from(plan.specials.sep.is_some());
    let seed = plan.seed.expect("bestfit always has a seed");
    // An estimate for the progress bar; padding adds a little.
    rows_out.shown.rows = (input.n_tokens() + input.len() * sep).div_ceil(u64::from(l));
    let mut packing = Packing {
        mode: "bestfit".into(),
        seed: Some(seed),
        window: plan.window,
        separator: plan.specials.sep,
        rows: 0,
        pad_tokens: 0,
        pad_share: 0.0,
        documents: 0,
        documents_cut: 0,
        pieces: 0,
        tokens_dropped: 0,
    };
    // This part plans and writes windows `share`, whole: window `w`
    // holds documents `w * window ..`, whichever part packs it.
    let n_docs = input.len();
    let share = part.range(n_docs.div_ceil(config.window));
    let mut next_doc = share.start.saturating_mul(config.window).min(n_docs);
    let end_doc = share.end.saturating_mul(config.window).min(n_docs);
    if config.part.is_some() && next_doc == end_doc && n_docs > 0 {
        rows_out.shown.progress.note(&format!(
            "part {part} has no work: the input's {n_docs} documents make only {} windows of --window {}",
            n_docs.div_ceil(config.window),
            config.window
        ));
    }
    if part.count > 1 {
        let share = u128::from(end_doc - next_doc) * u128::from(rows_out.shown.rows);
        rows_out.shown.rows = (share / u128::from(n_docs.max(1))) as u64;
    }
    let documents = end_doc - next_doc;
    let mut w = share.start;
    let mut tokens = 0u64;
    let skip = rows_out.skip;
    while next_doc < end_doc {
        // A batch of windows, planned in parallel, written in order.
        let mut batch = Vec::with_capacity(threads);
        while batch.len() < threads && next_doc < end_doc {
            let n = config.window.min(end_doc - next_doc);
            batch.push((w, next_doc, n));
            next_doc += n;
            w += 1;
        }
        // While the windows are planned, the other threads check the
        // input's chunks the first window's rows will read (a window is
        // planned on one thread, and the first window alone is all a small
        // run has). Only the first: the pages a check reads stay in the
        // process's memory until its window is written, and the batch's
        // later windows are checked as their rows read them, one window
        // at a time, as before.
        let docs = batch
            .first()
            .map_or(0..0, |&(_, first, n)| first..first + n);
        let input_checks = rows_out.input;
        let (plans, ()) = rows_out.pool.install(|| {
            rayon::join(
                || -> Vec<_> {
                    batch
                        .into_par_iter()
                        .map(|(w, first, n)| {
                            // Read from the input's offsets as planned: a
                            // copy would be memory new to the process.
                            let lens = lengths_from(input, first)
                                .take(n as usize)
                                .map(move |n| n + sep);
                            (w, first, bestfit::plan(first, lens, l))
                        })
                        .collect()
                },
                || check_ahead(input_checks, docs),
            )
        });
        for (w, first_doc, window) in plans {
            let rows = window.n_rows() as u64;
            let first_row = packing.rows;
            packing.rows += rows;
            packing.documents += window.documents;
            packing.documents_cut += window.cut;
            packing.pieces += window.pieces.len() as u64;
            tokens += window.tokens;
            if packing.rows <= skip {
                continue;
            }
            let perm = Permutation::new(rows, seed, w);
            let mut j = skip.saturating_sub(first_row);
            while j < rows {
                let end = (j + rows_out.per_batch).min(rows);
                let batch: Vec<&[bestfit::Piece]> =
                    (j..end).map(|j| window.row(perm.get(j) as usize)).collect();
                rows_out.out.write(&batch, &mut *sealed)?;
                // The windows before this one are written now: their
                // documents can go.
                rows_out.release_before(first_doc);
                rows_out.shown.rows(first_row + end);
                j = end;
            }
        }
    }
    packing.pad_tokens = packing.rows * u64::from(l) - tokens;
    Ok((documents, packing))
}

/// Checks the chunks of the input's `.bin`s that hold documents `docs`, on
/// the pool's threads, so that the rows that read them find them checked.
/// A chunk that fails stays unpassed, and the row that reads it reports it
/// as it would without this.
fn check_ahead(input: &Verified, docs: std::ops::Range<u64>) {
    let _reported_when_read = input
        .bin_chunks(docs)
        .into_par_iter()
        .try_for_each(|(s, range)| input.check_bin(s, range));
}

/// The packed dataset's manifest: the input's, with this run's shards,
/// provenance, special tokens, packing record and partition.
fn derived_manifest(
    config: &PackConfig,
    plan: Plan,
    base: &Manifest,
    shards: Vec<ShardInfo>,
    documents: u64,
    packing: Packing,
) -> Manifest {
    let n_tokens: u64 = shards.iter().map(|s| s.n_tokens).sum();
    let packing = Packing {
        pad_share: if n_tokens == 0 {
            0.0
        } else {
            packing.pad_tokens as f64 / n_tokens as f64
        },
        ..packing
    };
    let specials = &plan.specials;
    let special = crate::format::SpecialTokens {
        eos: base.special_tokens.eos.or(specials.sep),
        pad: specials.pad,
        ..base.special_tokens
    };
    plan.identity
        .derive(
            base,
            shards,
            plan.options,
            DocumentCounts::all_written(documents),
        )
        .with_specials(
            special,
            base.bos_prepended,
            base.eos_appended || specials.sep.is_some(),
        )
        .with_packing(u64::from(config.seq_len), packing)
}

/// The length of every record from `first` on, read from the offsets alone.
fn lengths_from(input: &Dataset, first: u64) -> impl Iterator<Item = u64> + Clone + '_ {
    let (shard, local) = input.locate(first).unwrap_or((input.n_shards(), 0));
    (shard..input.n_shards()).flat_map(move |s| {
        let from = if s == shard { local } else { 0 };
        input.shard_offsets(s)[from..]
            .windows(2)
            .map(|w| w[1] - w[0])
    })
}

fn no_pad() -> PackError {
    PackError::Usage(
        "rows that are not full need a pad token, and the input names none (no pad, no eos): pass --pad TOKEN"
            .into(),
    )
}

/// Resolves `--sep` and `--pad` against the input's manifest and tokenizer.
fn specials(config: &PackConfig, base: &Manifest) -> Result<Specials, PackError> {
    use crate::engine::{LoadedTokenizer, Readings, TokenNames};
    // The dataset's tokenizer copy, read only for a --sep or --pad, and by
    // the engine alone where it reads the file: names are all pack asks.
    let tokenizer = std::cell::OnceCell::new();
    let tokenizer = || {
        tokenizer.get_or_init(|| {
            let path = config.input.join(base.tokenizer.file.as_ref()?);
            let read = LoadedTokenizer::load_with_fast(&path, Readings::Fast);
            read.ok().map(|(tokenizer, _)| tokenizer)
        })
    };
    let resolve = |flag: &'static str, value: &str| -> Result<u32, PackError> {
        let names = tokenizer().as_ref().map(|t| t as &dyn TokenNames);
        crate::engine::token_arg(flag, value, names, Some(base.vocab_size)).map_err(|e| {
            PackError::Token {
                flag,
                value: value.into(),
                why: e.why,
            }
        })
    };
    let sep = match (&config.sep, config.no_sep) {
        (Some(_), true) => {
            return Err(PackError::Usage(
                "--sep and --no-sep contradict each other".into(),
            ))
        }
        (Some(value), false) => {
            if base.eos_appended {
                return Err(PackError::Usage(format!(
                    "the documents already end with eos (id {}); --sep would add a second separator",
                    base.special_tokens.eos.map_or("?".into(), |e| e.to_string())
                )));
            }
            Some(resolve("sep", value)?)
        }
        (None, no_sep) => {
            if !base.eos_appended && !no_sep {
                return Err(PackError::Usage(
                    "the documents do not end with an eos token, so nothing would separate them: \
                     pass --sep TOKEN to add one after each document, or --no-sep to pack them as they are"
                        .into(),
                ));
            }
            None
        }
    };
    let pad = match &config.pad {
        Some(value) => Some(resolve("pad", value)?),
        None => base.special_tokens.pad.or(base.special_tokens.eos).or(sep),
    };
    Ok(Specials { sep, pad })
}

/// Progress in rows written out of the total.
struct Shown<'a> {
    progress: &'a dyn Progress,
    seq_len: u64,
    /// Rows the run will have written at the end (0 until known).
    rows: u64,
}

impl Shown<'_> {
    fn rows(&mut self, done: u64) {
        self.progress.update(&ProgressSnapshot {
            input_bytes: done,
            input_total: self.rows.max(done),
            documents: 0,
            text_bytes: 0,
            tokens: done * self.seq_len,
        });
    }
}
