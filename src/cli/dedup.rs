//! `prep dedup`: flags to a [`DedupConfig`], then the summary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use super::write_flags::WriteFlags;

use prep::dedup::{self, DedupConfig, Params};
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
#[derive(Debug, Parser)]
#[command(
    after_help = "Sizes are bytes or take a unit: KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024).\n\
Exit codes: 0 success, 2 usage, input or I/O error."
)]
pub(crate) struct Args {
    /// The documents dataset to deduplicate.
    #[arg(value_name = "IN")]
    input: PathBuf,

    /// The dataset of kept documents.
    #[arg(value_name = "OUT")]
    output: PathBuf,

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
    let mut config = DedupConfig::new(args.input, args.output);
    config.params = Params {
        ngram: args.ngram,
        bands: args.bands,
        rows: args.rows,
        seed: args.seed,
    };
    config.memory = args.memory;
    config.threads = args.threads;
    config.writing = args.write.writing();
    let bar = super::progress::Bar::new(args.write.quiet);
    let r = dedup::run(&config, &bar)?;
    if !args.write.quiet && !r.already_complete {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        eprintln!(
            "Removed {} of {} documents ({:.2}%) as near-duplicates in {} clusters, in {:.1}s{}.",
            r.removed,
            r.documents,
            100.0 * r.removed as f64 / r.documents.max(1) as f64,
            r.clusters,
            secs,
            if r.runs > 0 {
                format!(" ({} sorted runs spilled)", r.runs)
            } else {
                String::new()
            }
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
