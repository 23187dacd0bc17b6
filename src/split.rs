//! `prep split`: a documents dataset into train, validation (and test)
//! datasets, document by document, with nothing leaking between them.
//!
//! # The rule
//!
//! A document's side is a function of its token ids and the seed alone:
//! `u = (XXH3-64(bytes, seed) >> 11) / 2^53`, the keyed hash of the record's
//! bytes (its ids, little-endian, in the dataset's dtype) mapped to
//! `[0, 1)`; the document goes to `val` when `u < F_val`, to `test` when
//! `F_val <= u < F_val + F_test`, and to `train` otherwise. Identical
//! documents therefore always land on the same side, however often they
//! repeat and wherever they sit; the shares are those of independent coin
//! flips, within a few standard deviations (`sqrt(F (1 - F) / n)`) of `F`.
//!
//! Each side keeps the input's order. Every input record is in exactly one
//! side, so the parts together are the input as a multiset of documents.
//!
//! # Partitioned runs
//!
//! With [`SplitConfig::part`] set to part `I` of `N` (`--part I/N`), a run
//! splits the input records [`Part::range`]`(n)` only, and each side it
//! writes is a partial dataset (`partition.stage` = `"split"`, and a `job`
//! per side, equal in every part). `prep merge` of the parts' `train` (and
//! of their `val`, `test`) gives the records of the whole run's side, in
//! the same order: each side keeps the input's order and the ranges are
//! contiguous. No part reads another's output.
//!
//! # Output
//!
//! `OUT/train`, `OUT/val` and, with `--test`, `OUT/test`, each an ordinary
//! documents dataset with its own lock, journal and manifest. A run stopped
//! part-way resumes every side from its last completed shard: the journal
//! of each records, with every shard, how many input records had been read
//! when it was completed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::format::{
    Dataset, DatasetWriter, DocumentCounts, FormatError, InputInfo, Manifest, Verified,
};
use crate::output::{Done, Output, OutputError, Start};
use crate::partition::Part;
use crate::progress::{Progress, ProgressSnapshot};
use crate::run::Writing;

/// The sides of a split, in the order they are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Training documents.
    Train,
    /// Validation documents.
    Val,
    /// Test documents.
    Test,
}

impl Side {
    /// The side's folder name inside the output directory.
    pub fn name(self) -> &'static str {
        match self {
            Side::Train => "train",
            Side::Val => "val",
            Side::Test => "test",
        }
    }
}

/// The side of the document whose record bytes are `record` (see the
/// [module docs](self)).
pub fn side(record: &[u8], seed: u64, val: f64, test: f64) -> Side {
    let u = (xxh3_64_with_seed(record, seed) >> 11) as f64 / (1u64 << 53) as f64;
    if u < val {
        Side::Val
    } else if u < val + test {
        Side::Test
    } else {
        Side::Train
    }
}

/// What `prep split` is asked to do.
#[derive(Debug, Clone)]
pub struct SplitConfig {
    /// The documents dataset to split.
    pub input: PathBuf,
    /// The directory that receives `train`, `val` and `test`.
    pub output: PathBuf,
    /// The validation share, in `[0, 1)`.
    pub val: f64,
    /// The test share (0: no test side); `val + test < 1`.
    pub test: f64,
    /// The seed of the hash.
    pub seed: u64,
    /// Shard size and whether to replace what the output holds.
    pub writing: Writing,
    /// Split only this share of the input's records, for `prep merge` to
    /// join with the other parts' (see the [module docs](self)).
    pub part: Option<Part>,
}

impl SplitConfig {
    /// A config with the CLI's defaults: no test side, 1 GiB shards.
    pub fn new(
        input: impl Into<PathBuf>,
        output: impl Into<PathBuf>,
        val: f64,
        seed: u64,
    ) -> SplitConfig {
        SplitConfig {
            input: input.into(),
            output: output.into(),
            val,
            test: 0.0,
            seed,
            writing: Writing::default(),
            part: None,
        }
    }

    /// The sides this split writes.
    pub fn sides(&self) -> Vec<Side> {
        let mut sides = vec![Side::Train, Side::Val];
        if self.test > 0.0 {
            sides.push(Side::Test);
        }
        sides
    }
}

/// Every way `prep split` can fail.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// The input or an output could not be read or written.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// An output directory was refused or is held by another run.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// An input dataset in object storage could not be fetched.
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
    /// Shares outside `[0, 1)` or adding up to 1 or more.
    #[error("--val {val} and --test {test}: each share must be at least 0 and together below 1")]
    BadShares {
        /// The validation share.
        val: f64,
        /// The test share.
        test: f64,
    },
    /// The input is not a documents dataset.
    #[error(transparent)]
    NotDocuments(#[from] Box<crate::run::NotDocuments>),
    /// The output overlaps an input.
    #[error(transparent)]
    Overlap(#[from] crate::run::Overlap),
}

/// One side as written.
#[derive(Debug, Clone)]
pub struct SideReport {
    /// Which side.
    pub side: Side,
    /// Its manifest.
    pub manifest: Manifest,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct SplitReport {
    /// Every side, in [`SplitConfig::sides`] order.
    pub sides: Vec<SideReport>,
    /// Records in the input.
    pub documents: u64,
    /// True when every side was already complete.
    pub already_complete: bool,
    /// Bytes of token data written by this run.
    pub bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// One side being written.
struct SideWriter {
    side: Side,
    output: Output,
    /// The side's identity: a job of its own, which every part shares.
    identity: crate::run::Identity,
    /// `None` when the side was already complete.
    writer: Option<DatasetWriter>,
    /// The journal; each shard's checkpoint is the number of input records
    /// read when it was completed.
    journal: crate::output::Journal<(), u64>,
    /// Input records before this one are in the kept shards.
    from: u64,
    complete: Option<Manifest>,
}

/// Runs `prep split`: checks the shares and the input, starts or resumes
/// every side, sends each input record to its side, and commits each side's
/// manifest.
pub fn run(config: &SplitConfig, progress: &dyn Progress) -> Result<SplitReport, SplitError> {
    let started = Instant::now();
    check_shares(config)?;
    crate::run::refuse_overlap(&config.output, &[&config.input], "the input")?;
    let local = crate::fetch::Local::of(&config.input)?;
    let input = Dataset::open(local.dir())?;
    let base = input.manifest().clone();
    crate::run::documents_only("split", &config.input, &base, "split before pack")?;
    let inputs = vec![InputInfo::of_dataset(&config.input, local.dir(), &base)?];
    let options = json!({
        "seed": config.seed,
        "val": config.val,
        "test": config.test,
        "shard_size": config.writing.shard_size,
    });
    let identity = crate::run::Identity::new("split", &options, inputs, config.part);

    let mut sides = Vec::new();
    for side in config.sides() {
        sides.push(open_side(config, &identity, side, &base)?);
    }
    let already_complete = sides.iter().all(|w| w.complete.is_some());
    let resume_at = sides.iter().map(|w| w.from).min().unwrap_or(0);
    if resume_at > 0 && !already_complete {
        progress.note(&format!(
            "resuming: {resume_at} input records are already in complete shards"
        ));
    }

    let range = config.part.unwrap_or(Part::WHOLE).range(input.len());
    let verified = input.verified()?;
    let (counts, bytes) = write_sides(config, &verified, &mut sides, range.clone(), progress)?;

    let mut reports = Vec::new();
    for (w, count) in sides.into_iter().zip(counts) {
        let documents = DocumentCounts {
            read: range.end - range.start,
            written: count,
            ..DocumentCounts::default()
        };
        reports.push(finish_side(w, &input, &options, documents)?);
    }
    progress.finish();
    Ok(SplitReport {
        sides: reports,
        documents: range.end - range.start,
        already_complete,
        bytes,
        elapsed: started.elapsed(),
    })
}

/// Refuses shares outside `[0, 1)` or adding up to 1 or more.
fn check_shares(config: &SplitConfig) -> Result<(), SplitError> {
    let (val, test) = (config.val, config.test);
    let share = |f: f64| f.is_finite() && (0.0..1.0).contains(&f);
    if !(share(val) && share(test) && val + test < 1.0) {
        return Err(SplitError::BadShares { val, test });
    }
    Ok(())
}

/// Locks one side's directory and starts it: complete, resumed after its
/// kept shards, or fresh.
fn open_side(
    config: &SplitConfig,
    identity: &crate::run::Identity,
    side: Side,
    base: &Manifest,
) -> Result<SideWriter, SplitError> {
    // A side's job is what every part shares; a part's own fingerprint
    // also names the part, so a re-run finds it complete or resumes it.
    let identity = identity.output(side.name());
    let fingerprint = &identity.fingerprint;
    let dir = config.output.join(side.name());
    let mut output = Output::lock(&dir, config.writing.single_writer)?;
    let (journal, complete) =
        match output.start::<(), u64>(fingerprint, config.writing.overwrite)? {
            Start::Complete(m) => (crate::output::Journal::new(fingerprint), Some(*m)),
            Start::Resume(j) | Start::Fresh(j) => (j, None),
        };
    let from = match &complete {
        Some(_) => u64::MAX,
        None => journal.shards.last().map_or(0, |d| d.at),
    };
    let writer = complete.is_none().then(|| {
        DatasetWriter::new(
            output.dir(),
            base.dtype,
            config.writing.shard_size,
            journal.shard_infos(),
        )
        .masked(base.has_loss_mask())
    });
    Ok(SideWriter {
        side,
        output,
        identity,
        writer,
        journal,
        from,
        complete,
    })
}

/// Sends every input record of `range` to its side (each read through the
/// input's checks), writing those after
/// the side's kept shards; returns the records each side got and the bytes
/// written.
fn write_sides(
    config: &SplitConfig,
    input: &Verified<'_>,
    sides: &mut [SideWriter],
    range: std::ops::Range<u64>,
    progress: &dyn Progress,
) -> Result<(Vec<u64>, u64), SplitError> {
    let size = input.dataset().dtype().size() as u64;
    let total_bytes = input.dataset().n_tokens() * size;
    let mut bytes = 0u64;
    let mut counts = vec![0u64; sides.len()];
    for g in range {
        let record = input.record_bytes(g)?;
        let s = side(record, config.seed, config.val, config.test);
        let i = sides
            .iter()
            .position(|w| w.side == s)
            .expect("a side with a share is written");
        counts[i] += 1;
        let w = &mut sides[i];
        if g < w.from {
            continue;
        }
        let writer = w
            .writer
            .as_mut()
            .expect("only complete sides have no writer");
        if let Some(sealed) = writer.push_record(input, g)? {
            w.journal.shards.push(Done {
                shard: sealed.clone(),
                at: g,
            });
            w.output.save(&w.journal)?;
        }
        bytes += record.len() as u64;
        if g.is_multiple_of(4096) {
            progress.update(&ProgressSnapshot {
                input_bytes: bytes,
                input_total: total_bytes,
                documents: g,
                text_bytes: 0,
                tokens: 0,
            });
        }
    }
    Ok((counts, bytes))
}

/// A side's report: the manifest it was found complete with, or the one
/// its shards, `options` and `documents` make, committed.
fn finish_side(
    w: SideWriter,
    input: &Dataset,
    options: &serde_json::Value,
    documents: DocumentCounts,
) -> Result<SideReport, SplitError> {
    let SideWriter {
        side,
        output,
        identity,
        writer,
        complete,
        ..
    } = w;
    let manifest = match (complete, writer) {
        (Some(m), _) => m,
        (None, writer) => {
            let base = input.manifest();
            let shards = writer.expect("an incomplete side has a writer").finish()?;
            output.copy_tokenizer(base.tokenizer.file.as_deref(), input.dir())?;
            let mut options = options.clone();
            options["side"] = json!(side.name());
            let manifest = identity.derive(base, shards, options, documents);
            output.commit(&manifest)?;
            manifest
        }
    };
    Ok(SideReport { side, manifest })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_fractions_and_the_seed_keys_the_hash() {
        let (mut val, mut test) = (0, 0);
        let n = 100_000u32;
        for i in 0..n {
            match side(&i.to_le_bytes(), 7, 0.1, 0.05) {
                Side::Val => val += 1,
                Side::Test => test += 1,
                Side::Train => {}
            }
        }
        // Three standard deviations of a binomial share.
        let within = |count: u32, f: f64| {
            let sd = (f * (1.0 - f) / n as f64).sqrt();
            (count as f64 / n as f64 - f).abs() < 3.0 * sd
        };
        assert!(within(val, 0.1), "{val}");
        assert!(within(test, 0.05), "{test}");
        let sides = |seed| (0..1000u32).map(move |i| side(&i.to_le_bytes(), seed, 0.1, 0.05));
        assert!(sides(7).zip(sides(8)).any(|(a, b)| a != b));
    }
}
