//! `prep shuffle`: flags to a [`ShuffleConfig`], then the summary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::shuffle::{self, ShuffleConfig};
use crate::size::{format_bytes, parse_size};

/// Shuffle the documents of one or more datasets into an exact, uniformly
/// random global order, in bounded memory.
///
/// Several inputs are shuffled together as one mixture; they must share
/// tokenizer, dtype and special tokens. The order depends on the seed and
/// the inputs only, never on --memory or --threads. Inputs larger than the
/// memory budget go through bucket files in a temporary folder inside OUT.
#[derive(Debug, Parser)]
#[command(
    after_help = "Sizes are bytes or take a unit: KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024).\n\
Exit codes: 0 success, 2 usage, input or I/O error."
)]
pub(crate) struct Args {
    /// Input dataset directories, then the output directory.
    #[arg(value_name = "DIR", required = true, num_args = 2..)]
    dirs: Vec<PathBuf>,

    /// The seed of the permutation.
    #[arg(long, value_name = "S")]
    seed: u64,

    /// Memory budget for documents in flight; larger inputs are shuffled out of core.
    #[arg(long, value_name = "SIZE", default_value = "4GiB", value_parser = parse_size)]
    memory: u64,

    /// Largest .bin per output shard.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    shard_size: u64,

    /// Threads for sorting; 0 uses every core. The output is the same for any value.
    #[arg(long, short = 't', value_name = "N", default_value_t = 0)]
    threads: usize,

    /// Replace what is in the output directory.
    #[arg(long)]
    overwrite: bool,

    /// No progress bar or summary; errors are still printed.
    #[arg(long, short = 'q')]
    quiet: bool,
}

pub(crate) fn run(mut args: Args) -> anyhow::Result<ExitCode> {
    let output = args.dirs.pop().expect("clap requires two directories");
    let mut config = ShuffleConfig::new(args.dirs, output, args.seed);
    config.memory = args.memory;
    config.shard_size = args.shard_size;
    config.threads = args.threads;
    config.overwrite = args.overwrite;
    let bar = super::progress::Bar::new(args.quiet);
    let r = shuffle::run(&config, &bar)?;
    if !args.quiet {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        let how = if r.buckets == 0 {
            "in memory".to_owned()
        } else {
            format!("out of core through {} buckets", r.buckets)
        };
        eprintln!(
            "Shuffled {} documents ({} tokens, {}) from {} inputs with seed {} {how} in {:.1}s: {:.0} MB/s. Wrote {} in {} shards.{}",
            r.manifest.n_records,
            r.manifest.n_tokens,
            format_bytes(r.bytes),
            r.manifest.provenance.inputs.len(),
            config.seed,
            secs,
            r.bytes as f64 / 1e6 / secs,
            config.output.display(),
            r.manifest.shards.len(),
            crate::util::peak_rss_bytes().map_or(String::new(), |p| format!(" Peak memory {}.", format_bytes(p))),
        );
    }
    Ok(ExitCode::SUCCESS)
}
