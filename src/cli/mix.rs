//! `prep mix`: flags to a [`MixConfig`], then the summary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use super::write_flags::WriteFlags;

use prep::mix::{self, MixConfig, Source};
use prep::partition::Part;
use prep::size::format_bytes;

/// Mix documents datasets by weight into one shuffled dataset of --tokens
/// tokens.
///
/// Each source gives its weight's share of the tokens (weights are
/// relative: 0.7 and 0.3, or 7 and 3), to within one document; documents
/// are drawn from a source without replacement within each pass over it,
/// and a source that would need more than --max-epochs passes is refused.
/// The mixture is shuffled exactly as prep shuffle does, and its manifest
/// records the recipe and what each source gave (prep inspect shows it).
/// Sources must share tokenizer, dtype and special tokens.
///
/// With --part I/N, task I of N writes its share of the mixture's records;
/// prep merge joins parts 0..N-1 into the dataset one run writes.
#[derive(Debug, Parser)]
#[command(
    after_help = sizes_then!("Exit codes: 0 success, 2 usage, input or I/O error.")
)]
pub(crate) struct Args {
    /// The dataset to write.
    #[arg(value_name = "OUT")]
    output: PathBuf,

    /// A source dataset and its weight, DIR:WEIGHT: several after one
    /// --source, or --source repeated.
    #[arg(long = "source", value_name = "DIR:WEIGHT", required = true, num_args = 1.., value_parser = parse_source)]
    sources: Vec<Source>,

    /// Tokens in the mixture.
    #[arg(long, value_name = "N")]
    tokens: u64,

    /// The seed of the draw and of the order.
    #[arg(long, value_name = "S")]
    seed: u64,

    /// Most passes over any one source (1: no document repeats).
    #[arg(long, value_name = "E", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    max_epochs: u64,

    #[command(flatten)]
    write: WriteFlags,

    /// Threads for sorting; 0 uses every core. The output is the same for any value.
    #[arg(long, short = 't', value_name = "N", default_value_t = 0)]
    threads: usize,

    /// This task's share, I/N (0 <= I < N), of the mixture's records.
    #[arg(long, value_name = "I/N")]
    part: Option<Part>,
}

/// `DIR:WEIGHT`, split at the last colon (a directory may hold one).
fn parse_source(s: &str) -> Result<Source, String> {
    let (dir, weight) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not DIR:WEIGHT"))?;
    let weight: f64 = weight
        .parse()
        .map_err(|_| format!("{s:?}: weight {weight:?} is not a number"))?;
    if dir.is_empty() {
        return Err(format!("{s:?}: no directory before the colon"));
    }
    Ok(Source {
        dir: PathBuf::from(dir),
        weight,
    })
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut config = MixConfig::new(args.sources, args.output, args.tokens, args.seed);
    config.max_epochs = args.max_epochs;
    config.writing = args.write.writing();
    config.threads = args.threads;
    config.part = args.part;
    let bar = super::progress::Bar::new(args.write.quiet);
    let r = mix::run(&config, &bar)?;
    if !args.write.quiet && !r.already_complete {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        let m = &r.manifest;
        eprintln!(
            "Mixed {} documents ({} tokens, {}) from {} with seed {} in {:.1}s: {:.0} MB/s. Wrote {} in {}.",
            m.n_records,
            m.n_tokens,
            format_bytes(r.bytes),
            super::count(r.sources.len() as u64, "source"),
            config.seed,
            secs,
            r.bytes as f64 / 1e6 / secs,
            config.output.display(),
            super::count(m.shards.len() as u64, "shard"),
        );
        for s in &r.sources {
            eprintln!(
                "  {}: weight {} ({:.2}%), {} tokens of {} asked, {} documents, {:.3} epochs",
                s.source,
                s.weight,
                100.0 * s.share,
                s.tokens,
                s.target_tokens,
                s.documents,
                s.epochs
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
