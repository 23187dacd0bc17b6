//! `prep mix`: a weighted mixture of datasets, drawn and shuffled exactly,
//! written as an ordinary documents dataset.
//!
//! # The recipe
//!
//! Sources `0..k` with weights `w_i` (any positive numbers: only their
//! ratios count) and a total of `N` tokens. Source `i`'s target is the
//! cumulative share `C_i = round(N · (w_0 + ... + w_i) / W)`, `W` the sum of
//! the weights, minus what the sources before it took; so `C_{k-1} = N`.
//!
//! # The draw
//!
//! Source `i` is read in passes (epochs). Pass `e` visits its documents in
//! the order of [`Permutation::new`]`(n_i, seed, stream(i, e))`, each once,
//! so documents are drawn without replacement within a pass. A document is
//! taken when the running total stays at or below `C_i` with it, and passed
//! over otherwise (the gap only shrinks, so it would not fit later either);
//! the pass goes on until the total is `C_i` or the pass ends. If documents
//! were passed over, the shortest of them is taken too when that leaves the
//! total closer to `C_i`, and the source stops; a pass that took every
//! document is followed by the next. The running total is therefore within
//! half a document of `C_i` after every source: the mixture holds `N`
//! tokens to within half a document, and source `i` its target to within
//! one document. Only the last few documents of a source's draw are chosen
//! by length (those that fit the last gap), so the draw is otherwise
//! uniform. A source that would need more than `--max-epochs` passes is
//! refused with the number it needs.
//!
//! # The order
//!
//! The drawn documents are numbered `g = 0, 1, ...` source by source, pass
//! by pass, and within a pass in the source's own order; the output is in
//! increasing `(shuffle_key(seed, g), g)` order ([`shuffle_key`]), the order
//! `prep shuffle --seed S` gives a dataset of those documents in that
//! numbering. So a one-source mixture of all of a source's tokens is `prep
//! shuffle` of it, shard for shard.
//!
//! The plan (the drawn list and its order) takes 32 bytes per drawn
//! document in memory; tokens are copied from the sources' mappings. The
//! output is a function of the sources, the options and nothing else:
//! `--threads` only sorts faster.
//!
//! # Partitioned
//!
//! `--part I/N` writes the `I`-th contiguous share of the output's records
//! (every task computes the same plan) as a partial dataset; `prep merge`
//! joins the parts into the dataset one task would have written.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use crate::fetch::Local;
use crate::format::{
    Dataset, DatasetWriter, DocumentCounts, FormatError, InputInfo, Manifest, ShardInfo, Verified,
};
use crate::output::{Done, Journal, Output, OutputError, Start};
use crate::partition::Part;
use crate::permute::{shuffle_key, Permutation};
use crate::progress::{Progress, ProgressSnapshot};
use crate::run::Writing;

/// One source of a mixture: a documents dataset and its weight.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    /// The dataset directory.
    pub dir: PathBuf,
    /// Its weight: a positive finite number, relative to the others'.
    pub weight: f64,
}

/// What `prep mix` is asked to do.
#[derive(Debug, Clone)]
pub struct MixConfig {
    /// The sources, in this order (the order is part of the recipe).
    pub sources: Vec<Source>,
    /// The dataset directory to write.
    pub output: PathBuf,
    /// Tokens in the mixture (to within half a document).
    pub tokens: u64,
    /// The seed of the draw and of the order.
    pub seed: u64,
    /// Most passes over any one source.
    pub max_epochs: u64,
    /// Shard size and whether to replace what the output holds.
    pub writing: Writing,
    /// Threads for sorting; 0 means one per core. The output does not depend on it.
    pub threads: usize,
    /// This task's share of the output (`--part I/N`), or the whole.
    pub part: Option<Part>,
}

impl MixConfig {
    /// A config with the CLI's defaults: one pass at most, 1 GiB shards.
    pub fn new(
        sources: Vec<Source>,
        output: impl Into<PathBuf>,
        tokens: u64,
        seed: u64,
    ) -> MixConfig {
        MixConfig {
            sources,
            output: output.into(),
            tokens,
            seed,
            max_epochs: 1,
            writing: Writing::default(),
            threads: 0,
            part: None,
        }
    }
}

/// Every way `prep mix` can fail.
#[derive(Debug, thiserror::Error)]
pub enum MixError {
    /// A source or the output could not be read or written.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The output directory was refused or is held by another run.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// A source in object storage could not be fetched.
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
    /// No source given.
    #[error("no source given (--source DIR:WEIGHT)")]
    NoSource,
    /// A weight that is not a positive finite number.
    #[error("source {}: weight {weight} is not a positive number", dir.display())]
    BadWeight {
        /// The source.
        dir: PathBuf,
        /// Its weight.
        weight: f64,
    },
    /// The output overlaps an input.
    #[error(transparent)]
    Overlap(#[from] crate::run::Overlap),
    /// Two inputs that cannot be taken together.
    #[error(transparent)]
    Incompatible(#[from] Box<crate::run::Incompatible>),
    /// A source that is not a documents dataset.
    #[error(transparent)]
    NotDocuments(#[from] Box<crate::run::NotDocuments>),
    /// A source too small for its share within `--max-epochs` passes.
    #[error(
        "source {}: its share is {need} tokens but it holds {has}; that takes {epochs} epochs and --max-epochs is {max} \
         (pass --max-epochs {epochs}, lower its weight or --tokens)",
        dir.display()
    )]
    TooManyEpochs {
        /// The source.
        dir: PathBuf,
        /// Tokens it must give.
        need: u64,
        /// Tokens it holds.
        has: u64,
        /// Passes that takes.
        epochs: u64,
        /// The limit.
        max: u64,
    },
    /// A source with a share to give and no tokens at all.
    #[error("source {}: its share is {need} tokens but it holds none", dir.display())]
    EmptySource {
        /// The source.
        dir: PathBuf,
        /// Tokens it must give.
        need: u64,
    },
}

/// What one source gave the mixture, as the manifest records it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceUse {
    /// The source's directory, as given.
    pub source: String,
    /// Its weight as given.
    pub weight: f64,
    /// Its share of the tokens: its weight over the sum of the weights.
    pub share: f64,
    /// The tokens the recipe asked of it.
    pub target_tokens: u64,
    /// The tokens it gave.
    pub tokens: u64,
    /// The documents it gave (a document drawn in two passes counts twice).
    pub documents: u64,
    /// Passes over it: `tokens` over the tokens it holds (1.5 is one whole
    /// pass and half of a second).
    pub epochs: f64,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct MixReport {
    /// The manifest written (or found complete).
    pub manifest: Manifest,
    /// Per source, what it gave.
    pub sources: Vec<SourceUse>,
    /// True when the output was already complete.
    pub already_complete: bool,
    /// Bytes of token data written by this run.
    pub bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// The drawn documents, in mixture numbering `g`: `(source, record)`.
pub struct Plan {
    /// Document `g` of the mixture is record `drawn[g].1` of source `drawn[g].0`.
    pub drawn: Vec<(u32, u64)>,
    /// Per source, what it gave.
    pub sources: Vec<SourceUse>,
}

/// The permutation stream of pass `epoch` over source `source`.
fn stream(source: usize, epoch: u64) -> u64 {
    ((source as u64) << 32) | epoch
}

/// Draws the mixture's documents (see the [module docs](self)): record
/// lengths in tokens per source, in its order.
pub fn plan(
    sources: &[Source],
    lengths: &[Vec<u64>],
    tokens: u64,
    seed: u64,
    max_epochs: u64,
) -> Result<Plan, MixError> {
    let total_weight: f64 = sources.iter().map(|s| s.weight).sum();
    let mut drawn = Vec::new();
    let mut uses = Vec::with_capacity(sources.len());
    let (mut cumulative, mut so_far) = (0.0f64, 0u64);
    for (i, (source, lens)) in sources.iter().zip(lengths).enumerate() {
        cumulative += source.weight;
        let goal = if i + 1 == sources.len() {
            tokens
        } else {
            ((tokens as f64) * cumulative / total_weight).round() as u64
        }
        .max(so_far);
        let need = goal - so_far;
        let has: u64 = lens.iter().sum();
        if need > 0 && has == 0 {
            return Err(MixError::EmptySource {
                dir: source.dir.clone(),
                need,
            });
        }
        if need > 0 && need > has.saturating_mul(max_epochs) {
            return Err(MixError::TooManyEpochs {
                dir: source.dir.clone(),
                need,
                has,
                epochs: need.div_ceil(has),
                max: max_epochs,
            });
        }
        let (mut taken, mut documents) = (0u64, 0u64);
        let mut epoch = 0;
        while taken < need && epoch < max_epochs {
            let order = Permutation::new(lens.len() as u64, seed, stream(i, epoch));
            let mut pass = Vec::new();
            // The shortest document that did not fit: the gap only shrinks,
            // so no document passed over would fit later.
            let mut over: Option<u64> = None;
            for j in 0..order.len() {
                if taken == need {
                    break;
                }
                let d = order.get(j);
                let len = lens[d as usize];
                if taken + len <= need {
                    pass.push(d);
                    taken += len;
                } else if over.is_none_or(|o| len < lens[o as usize]) {
                    over = Some(d);
                }
            }
            // Past the goal: take it only if that ends closer to it.
            let done = taken == need || over.is_some();
            if let Some(d) = over {
                let len = lens[d as usize];
                if taken + len - need < need - taken {
                    pass.push(d);
                    taken += len;
                }
            }
            pass.sort_unstable();
            documents += pass.len() as u64;
            drawn.extend(pass.into_iter().map(|d| (i as u32, d)));
            if done {
                break;
            }
            epoch += 1;
        }
        so_far += taken;
        uses.push(SourceUse {
            source: source.dir.display().to_string(),
            weight: source.weight,
            share: source.weight / total_weight,
            target_tokens: need,
            tokens: taken,
            documents,
            epochs: if has == 0 {
                0.0
            } else {
                taken as f64 / has as f64
            },
        });
    }
    Ok(Plan {
        drawn,
        sources: uses,
    })
}

/// The order of the mixture: element `p` is the number `g` of output record
/// `p`, in increasing `(shuffle_key(seed, g), g)` order.
fn order(n: u64, seed: u64, pool: &rayon::ThreadPool) -> Vec<u64> {
    let mut keyed: Vec<(u64, u64)> = (0..n).map(|g| (shuffle_key(seed, g), g)).collect();
    // (key, g) pairs are unique, so an unstable parallel sort is deterministic.
    pool.install(|| {
        use rayon::slice::ParallelSliceMut;
        keyed.par_sort_unstable();
    });
    keyed.into_iter().map(|(_, g)| g).collect()
}

/// Runs `prep mix`.
///
/// Resumable: a journal records every completed output shard; started again
/// with the same sources and options (threads may differ), a run keeps the
/// intact shards and writes on from the next record. A finished dataset is
/// left alone.
pub fn run(config: &MixConfig, progress: &dyn Progress) -> Result<MixReport, MixError> {
    let started = Instant::now();
    check_sources(config)?;
    let dirs: Vec<&PathBuf> = config.sources.iter().map(|s| &s.dir).collect();
    crate::run::refuse_overlap(&config.output, &dirs, "the source")?;
    // Sources in object storage are read from verified local copies.
    let local = config
        .sources
        .iter()
        .map(|s| Local::of(&s.dir))
        .collect::<Result<Vec<_>, _>>()?;
    let datasets = open_sources(config, &local)?;
    let base = datasets[0].manifest().clone();
    let identity = identity(config, &datasets)?;
    let plan = draw(config, &datasets)?;

    let mut output = Output::lock(&config.output, config.writing.single_writer)?;
    let journal = match output.start::<(), ()>(&identity.fingerprint, config.writing.overwrite)? {
        Start::Complete(manifest) => {
            progress.note("the mixture is already complete; nothing to do");
            return Ok(MixReport {
                manifest: *manifest,
                sources: plan.sources,
                already_complete: true,
                bytes: 0,
                elapsed: started.elapsed(),
            });
        }
        Start::Resume(journal) => {
            if !journal.shards.is_empty() {
                progress.note(&format!(
                    "resuming: kept {} complete shards of an interrupted run",
                    journal.shards.len()
                ));
            }
            journal
        }
        Start::Fresh(journal) => journal,
    };
    let pool = crate::run::thread_pool(config.threads, "mix")
        .map_err(|e| FormatError::io(&config.output, e))?;
    let n = plan.drawn.len() as u64;
    let order = order(n, config.seed, &pool);
    let range = config.part.unwrap_or(Part::WHOLE).range(n);
    let records = &order[range.start as usize..range.end as usize];
    let verified = datasets
        .iter()
        .map(Dataset::verified)
        .collect::<Result<Vec<_>, _>>()?;
    let (shards, bytes) = write_records(
        config,
        &mut output,
        journal,
        &verified,
        &plan.drawn,
        records,
        progress,
    )?;
    output.copy_tokenizer(base.tokenizer.file.as_deref(), datasets[0].dir())?;
    let manifest = mixed_manifest(
        config,
        &identity,
        &base,
        shards,
        &plan.sources,
        range.end - range.start,
    );
    output.commit(&manifest)?;
    progress.finish();
    Ok(MixReport {
        manifest,
        sources: plan.sources,
        already_complete: false,
        bytes,
        elapsed: started.elapsed(),
    })
}

/// Refuses a mixture without sources, or with a weight that is not a
/// positive finite number.
fn check_sources(config: &MixConfig) -> Result<(), MixError> {
    if config.sources.is_empty() {
        return Err(MixError::NoSource);
    }
    for s in &config.sources {
        if !(s.weight.is_finite() && s.weight > 0.0) {
            return Err(MixError::BadWeight {
                dir: s.dir.clone(),
                weight: s.weight,
            });
        }
    }
    Ok(())
}

/// Opens every source from where it is read, and checks that they all hold
/// documents that read the same way as the first.
fn open_sources(config: &MixConfig, local: &[Local]) -> Result<Vec<Dataset>, MixError> {
    let datasets = local
        .iter()
        .map(|l| Dataset::open(l.dir()))
        .collect::<Result<Vec<_>, _>>()?;
    let first = &config.sources[0].dir;
    let base = datasets[0].manifest();
    for (ds, s) in datasets.iter().zip(&config.sources) {
        crate::run::documents_only("mix", &s.dir, ds.manifest(), "mix before pack")?;
    }
    for (ds, s) in datasets.iter().zip(&config.sources).skip(1) {
        crate::run::same_documents("mix", first, base, &s.dir, ds.manifest())?;
    }
    Ok(datasets)
}

/// The run's identity: the request and the sources, counted by content.
fn identity(config: &MixConfig, datasets: &[Dataset]) -> Result<crate::run::Identity, MixError> {
    let inputs = config
        .sources
        .iter()
        .zip(datasets)
        .map(|(s, ds)| InputInfo::of_dataset(&s.dir, ds.dir(), ds.manifest()))
        .collect::<Result<Vec<_>, _>>()?;
    // The weights in the sources' order; the sources themselves count by
    // content, as the inputs.
    let request = json!({
        "weights": config.sources.iter().map(|s| s.weight).collect::<Vec<_>>(),
        "tokens": config.tokens,
        "seed": config.seed,
        "max_epochs": config.max_epochs,
        "shard_size": config.writing.shard_size,
    });
    Ok(crate::run::Identity::new(
        "mix",
        &request,
        inputs,
        config.part,
    ))
}

/// Draws the mixture's documents from the sources' record lengths.
fn draw(config: &MixConfig, datasets: &[Dataset]) -> Result<Plan, MixError> {
    let lengths: Vec<Vec<u64>> = datasets
        .iter()
        .map(|d| d.record_lengths().collect())
        .collect();
    plan(
        &config.sources,
        &lengths,
        config.tokens,
        config.seed,
        config.max_epochs,
    )
}

/// Writes `records` (numbers `g` of drawn documents, this part's share of
/// the order) from the first one the kept shards do not hold, journaling
/// every shard as it is sealed; returns the shards and the bytes written.
/// Each record is read through its source's checks.
fn write_records(
    config: &MixConfig,
    output: &mut Output,
    mut journal: Journal<(), ()>,
    datasets: &[Verified<'_>],
    drawn: &[(u32, u64)],
    records: &[u64],
    progress: &dyn Progress,
) -> Result<(Vec<ShardInfo>, u64), MixError> {
    // Records already in the kept shards.
    let written: u64 = journal.shards.iter().map(|d| d.shard.n_records).sum();
    let dtype = datasets[0].dataset().dtype();
    let mut writer = DatasetWriter::new(
        output.dir(),
        dtype,
        config.writing.shard_size,
        journal.shard_infos(),
    )
    .masked(datasets[0].dataset().manifest().has_loss_mask());
    let total_bytes: u64 = records
        .iter()
        .map(|&g| {
            let (s, d) = drawn[g as usize];
            datasets[s as usize].dataset().record_len(d).unwrap_or(0) * dtype.size() as u64
        })
        .sum();
    let mut bytes = 0u64;
    for (p, &g) in (written..).zip(&records[written as usize..]) {
        let (s, d) = drawn[g as usize];
        let record_len = datasets[s as usize].record_bytes(d)?.len();
        if let Some(sealed) = writer.push_record(&datasets[s as usize], d)? {
            journal.shards.push(Done {
                shard: sealed.clone(),
                at: (),
            });
            output.save(&journal)?;
        }
        bytes += record_len as u64;
        if p.is_multiple_of(4096) {
            progress.update(&ProgressSnapshot {
                input_bytes: bytes,
                input_total: total_bytes,
                documents: p,
                text_bytes: 0,
                tokens: 0,
            });
        }
    }
    Ok((writer.finish()?, bytes))
}

/// The mixture's manifest: the first source's, with this run's shards and
/// options, the recipe of what each source gave, and `documents` written.
fn mixed_manifest(
    config: &MixConfig,
    identity: &crate::run::Identity,
    base: &Manifest,
    shards: Vec<ShardInfo>,
    sources: &[SourceUse],
    documents: u64,
) -> Manifest {
    let options = json!({
        "seed": config.seed,
        "tokens": config.tokens,
        "max_epochs": config.max_epochs,
        "shard_size": config.writing.shard_size,
        "recipe": sources,
    });
    identity.derive(
        base,
        shards,
        options,
        DocumentCounts::all_written(documents),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(weights: &[f64]) -> Vec<Source> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| Source {
                dir: PathBuf::from(format!("s{i}")),
                weight,
            })
            .collect()
    }

    /// Lengths 1..=max repeating, `n` of them.
    fn lengths(n: usize, max: u64) -> Vec<u64> {
        (0..n).map(|i| 1 + i as u64 % max).collect()
    }

    #[test]
    fn shares_are_within_one_document_and_the_total_within_half() {
        for seed in 0..20 {
            let lens = vec![lengths(500, 40), lengths(300, 25), lengths(700, 9)];
            let plan = plan(&sources(&[0.5, 0.3, 0.2]), &lens, 5000, seed, 1).unwrap();
            let total: u64 = plan.sources.iter().map(|s| s.tokens).sum();
            assert!(total.abs_diff(5000) <= 20, "{total}");
            for (s, want) in plan.sources.iter().zip([2500, 1500, 1000]) {
                assert!(s.tokens.abs_diff(want) <= 40, "{s:?}");
            }
            assert_eq!(
                plan.drawn.len() as u64,
                plan.sources.iter().map(|s| s.documents).sum::<u64>()
            );
        }
    }

    #[test]
    fn no_document_twice_within_a_pass_and_passes_as_needed() {
        let lens = vec![vec![3u64; 10]];
        // 75 tokens of a 30-token source: two whole passes and half a third.
        let plan = plan(&sources(&[1.0]), &lens, 75, 9, 3).unwrap();
        assert_eq!(plan.sources[0].tokens, 75);
        assert_eq!(plan.sources[0].epochs, 2.5);
        let mut count = [0u32; 10];
        for &(_, d) in &plan.drawn {
            count[d as usize] += 1;
        }
        assert!(count.iter().all(|&c| c == 2 || c == 3), "{count:?}");
        let err = super::plan(&sources(&[1.0]), &lens, 75, 9, 2)
            .err()
            .unwrap();
        assert!(
            matches!(err, MixError::TooManyEpochs { epochs: 3, .. }),
            "{err}"
        );
    }
}
