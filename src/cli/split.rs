//! `prep split`: flags to a [`SplitConfig`], then the summary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use super::write_flags::WriteFlags;

use prep::partition::Part;
use prep::size::format_bytes;
use prep::split::{self, SplitConfig};

/// Split a documents dataset into OUT/train, OUT/val (and OUT/test).
///
/// Each document's side is decided by a keyed hash (XXH3 with --seed) of its
/// token ids, so identical documents always land on the same side and
/// nothing leaks between them; the shares come within a small tolerance of
/// --val and --test. Every side keeps the input's order, and together they
/// are exactly the input. prep export of OUT/train and OUT/val gives
/// nanoGPT's train.bin and val.bin.
///
/// With --part I/N, task I of N splits its share of the input's records
/// into partial datasets; prep merge of the parts' train (and val, test)
/// gives the whole run's sides.
#[derive(Debug, Parser)]
#[command(
    after_help = sizes_then!("Exit codes: 0 success, 2 usage, input or I/O error.")
)]
pub(crate) struct Args {
    /// The documents dataset to split.
    #[arg(value_name = "IN")]
    input: PathBuf,

    /// The directory to write train, val and test into.
    #[arg(value_name = "OUT")]
    output: PathBuf,

    /// The share of documents for validation, e.g. 0.01.
    #[arg(long, value_name = "F")]
    val: f64,

    /// The share of documents for a test side (none when not given).
    #[arg(long, value_name = "F")]
    test: Option<f64>,

    /// The key of the hash that assigns the sides.
    #[arg(long, value_name = "S")]
    seed: u64,

    #[command(flatten)]
    write: WriteFlags,

    /// Split only part I of N of the input's records (0-based), for prep merge.
    #[arg(long, value_name = "I/N")]
    part: Option<Part>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut config = SplitConfig::new(args.input, args.output, args.val, args.seed);
    if let Some(test) = args.test {
        if test <= 0.0 {
            anyhow::bail!("--test {test}: give a share above 0, or leave --test out");
        }
        config.test = test;
    }
    config.writing = args.write.writing();
    config.part = args.part;
    let bar = super::progress::Bar::new(args.write.quiet);
    let r = split::run(&config, &bar)?;
    if !args.write.quiet && !r.already_complete {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        eprintln!(
            "Split {} documents with seed {} in {:.1}s: {} at {:.0} MB/s.",
            r.documents,
            config.seed,
            secs,
            format_bytes(r.bytes),
            r.bytes as f64 / 1e6 / secs,
        );
        for s in &r.sides {
            let m = &s.manifest;
            eprintln!(
                "  {}: {} documents ({:.2}%), {} tokens, {}",
                config.output.join(s.side.name()).display(),
                m.n_records,
                100.0 * m.n_records as f64 / r.documents.max(1) as f64,
                m.n_tokens,
                super::count(m.shards.len() as u64, "shard")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
