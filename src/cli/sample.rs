//! `prep sample`: the sampler's record indices, one per line.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use prep::sampler::Sampler;

/// Print the records one rank reads in one epoch, in order, one per line.
///
/// The order is the one training code gets from prep's Sampler (Rust) and
/// prep.Sampler (Python) with the same arguments: a seeded
/// permutation of the records per epoch, rank R taking every W-th position
/// from R. Each rank reads floor(n / W) records; the rest of the epoch's
/// last positions are left out.
#[derive(Debug, Parser)]
#[command(after_help = "Exit codes: 0 success, 2 usage error or a dataset that cannot be read.")]
pub(crate) struct Args {
    /// The dataset: a directory, or an object-storage address
    /// (s3://bucket/prefix, gs://, az://, https://) read in place.
    #[arg(value_name = "DIR")]
    dir: PathBuf,

    /// Seed of the order.
    #[arg(long, value_name = "S")]
    seed: u64,

    /// Epoch: each has its own permutation.
    #[arg(long, value_name = "E", default_value_t = 0)]
    epoch: u64,

    /// This rank, from 0.
    #[arg(long, value_name = "R", default_value_t = 0)]
    rank: u64,

    /// Number of data-parallel ranks.
    #[arg(long, value_name = "W", default_value_t = 1)]
    world_size: u64,

    /// First position to print (a resumed run's position).
    #[arg(long, value_name = "K", default_value_t = 0)]
    start: u64,

    /// Print at most N indices. [default: to the end of the epoch]
    #[arg(long, value_name = "N")]
    count: Option<u64>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.world_size == 0 {
        anyhow::bail!("--world-size must be at least 1");
    }
    if args.rank >= args.world_size {
        anyhow::bail!(
            "--rank {} is not below --world-size {}",
            args.rank,
            args.world_size
        );
    }
    let n = prep::format::record_count(&args.dir)?;
    let sampler = Sampler::new(n, args.seed, args.epoch, args.rank, args.world_size);
    let mut out = BufWriter::new(std::io::stdout().lock());
    let count = args.count.unwrap_or(u64::MAX);
    for index in sampler
        .iter_from(args.start)
        .take(count.min(usize::MAX as u64) as usize)
    {
        writeln!(out, "{index}")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
