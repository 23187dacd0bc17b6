//! `prep dedup`: flags to a [`DedupConfig`], then the summary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use super::write_flags::WriteFlags;

use prep::dedup::parts::{self, TaskConfig};
use prep::dedup::{self, DedupConfig, Params};
use prep::partition::Part;
use prep::size::parse_size;

/// Remove near-duplicate documents (MinHash over token shingles).
///
/// Each document is signed with --bands x --rows MinHash values over its
/// --ngram-token shingles; documents that share every value of some band
/// are candidates, candidates are joined into clusters, and each cluster
/// keeps its first document (the smallest record index) and loses the
/// others. The defaults are datatrove's: 5-grams, 14 bands of 8, which
/// finds pairs of Jaccard similarity s with probability 1 - (1 - s^8)^14
/// (one half near 0.72).
///
/// OUT is the kept documents in the input's order, and OUT/duplicates.jsonl
/// lists every removed document with the one it duplicates:
/// {"doc": 7, "kept": 2}, record indices of IN. The output is the same
/// for any --threads and --memory. Run tokenize --dedup first to drop
/// exact duplicates cheaply.
///
/// On many machines, with a shared --work directory: N signature tasks
/// (IN --signatures --part I/N), then B bucket tasks (--buckets --part
/// J/B), then the dataset (IN OUT, whole, or --part K/M for prep merge);
/// the same documents are removed as on one machine.
#[derive(Debug, Parser)]
#[command(
    after_help = sizes_then!("Exit codes: 0 success, 2 usage, input or I/O error.")
)]
pub(crate) struct Args {
    /// The documents dataset to deduplicate (not for --buckets).
    #[arg(value_name = "IN")]
    input: Option<PathBuf>,

    /// The dataset of kept documents (not for --signatures or --buckets).
    #[arg(value_name = "OUT")]
    output: Option<PathBuf>,

    /// The work directory the tasks of a run on many machines share.
    #[arg(long, value_name = "WORK")]
    work: Option<PathBuf>,

    /// Many machines, first stage: sign part I of N of IN's records into WORK.
    #[arg(long, requires_all = ["work", "part"], conflicts_with = "buckets")]
    signatures: bool,

    /// Many machines, second stage: find the candidates of share J of B of
    /// the signature parts in WORK.
    #[arg(long, requires_all = ["work", "part"])]
    buckets: bool,

    /// This task's part, 0 <= I < N: of the records (--signatures, or the
    /// dataset written from WORK, for prep merge) or of the buckets.
    #[arg(long, value_name = "I/N")]
    part: Option<Part>,

    /// Tokens per shingle.
    #[arg(long, value_name = "N", default_value_t = Params::default().ngram)]
    ngram: usize,

    /// Bands of the signature.
    #[arg(long, value_name = "B", default_value_t = Params::default().bands)]
    bands: usize,

    /// MinHash values per band.
    #[arg(long, value_name = "R", default_value_t = Params::default().rows)]
    rows: usize,

    /// The seed of the hash functions.
    #[arg(long, value_name = "S", default_value_t = Params::default().seed)]
    seed: u64,

    /// Memory for the candidates' entries (24 bytes per band per document);
    /// more is spilled to sorted runs in a folder inside OUT.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    memory: u64,

    /// Threads that sign documents; 0 uses every core. The output is the
    /// same for any value.
    #[arg(long, short = 't', value_name = "N", default_value_t = 0)]
    threads: usize,

    #[command(flatten)]
    write: WriteFlags,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let params = Params {
        ngram: args.ngram,
        bands: args.bands,
        rows: args.rows,
        seed: args.seed,
    };
    let bar = super::progress::Bar::new(args.write.quiet);
    if let (true, Some(work), Some(part)) = (args.signatures || args.buckets, &args.work, args.part)
    {
        let config = TaskConfig {
            work: work.clone(),
            part,
            params,
            memory: args.memory,
            threads: args.threads,
            overwrite: args.write.overwrite,
            single_writer: args.write.single_writer,
        };
        let (r, what) = if args.signatures {
            let (Some(input), None) = (&args.input, &args.output) else {
                anyhow::bail!("--signatures takes IN and no OUT: prep dedup IN --work WORK --signatures --part I/N");
            };
            (parts::signatures(input, &config, &bar)?, "documents signed")
        } else {
            if args.input.is_some() {
                anyhow::bail!(
                    "--buckets takes no IN or OUT: prep dedup --work WORK --buckets --part J/B"
                );
            }
            (parts::buckets(&config, &bar)?, "candidate pairs found")
        };
        if !args.write.quiet && !r.already_complete {
            eprintln!(
                "{}: {} {what} in {:.1}s.",
                r.dir.display(),
                r.count,
                r.elapsed.as_secs_f64()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let (Some(input), Some(output)) = (args.input, args.output) else {
        anyhow::bail!("give IN and OUT (or --signatures or --buckets with --work and --part)");
    };
    if args.part.is_some() && args.work.is_none() {
        anyhow::bail!("--part writes a share of the dataset from the tasks' --work directory: give --work WORK");
    }
    let mut config = DedupConfig::new(input, output);
    config.params = params;
    config.memory = args.memory;
    config.threads = args.threads;
    config.writing = args.write.writing();
    config.work = args.work;
    config.part = args.part;
    let r = dedup::run(&config, &bar)?;
    if !args.write.quiet && !r.already_complete {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        eprintln!(
            "Removed {} of {} documents ({:.2}%) as near-duplicates ({} clusters in the input), in {:.1}s{}.{}",
            r.removed,
            r.documents,
            100.0 * r.removed as f64 / r.documents.max(1) as f64,
            r.clusters,
            secs,
            if r.runs > 0 {
                format!(" ({} sorted runs spilled)", r.runs)
            } else {
                String::new()
            },
            super::peak(),
        );
        eprintln!(
            "  {}: {} documents, {} tokens; report in {}",
            config.output.display(),
            r.manifest.n_records,
            r.manifest.n_tokens,
            config.output.join(dedup::REPORT_FILE).display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
