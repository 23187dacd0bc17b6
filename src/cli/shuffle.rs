//! `prep shuffle`: flags to a [`ShuffleConfig`] (or, distributed, a
//! [`ScatterConfig`] or [`GatherConfig`]), then the summary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use super::write_flags::WriteFlags;

use prep::partition::Part;
use prep::shuffle::{self, GatherConfig, ScatterConfig, ShuffleConfig};
use prep::size::{format_bytes, parse_size};

/// Shuffle the documents of one or more datasets into an exact, uniformly
/// random global order, in bounded memory.
///
/// Several inputs are shuffled together as one mixture; they must share
/// tokenizer, dtype and special tokens. The order depends on the seed and
/// the inputs only, never on --memory or --threads. Inputs larger than the
/// memory budget go through bucket files in a temporary folder inside OUT.
///
/// On many machines, the same order in two stages of independent tasks:
///
///   prep shuffle IN... WORK --seed S --scatter --part I/N --buckets B
///
/// for I = 0..N-1 (each writes WORK/scatter-IIIII), then
///
///   prep shuffle WORK OUT_J --gather --bucket J
///
/// for J = 0..B-1. The records of OUT_0, OUT_1, ... OUT_{B-1} in turn are
/// those of `prep shuffle IN... OUT --seed S`, in the same order, whatever N
/// and B are; `prep merge` joins them into that dataset.
#[derive(Debug, Parser)]
#[command(
    after_help = sizes_then!("Exit codes: 0 success, 2 usage, input or I/O error.")
)]
pub(crate) struct Args {
    /// Input dataset directories, then the output directory (with
    /// --scatter: the work directory; with --gather: the work directory,
    /// then the output directory).
    #[arg(value_name = "DIR", required = true, num_args = 2..)]
    dirs: Vec<PathBuf>,

    /// The seed of the permutation (not with --gather: the scatter recorded it).
    #[arg(long, value_name = "S", required_unless_present = "gather")]
    seed: Option<u64>,

    /// Distributed, first stage: send this task's share of the documents
    /// (--part) to --buckets buckets in WORK/scatter-IIIII.
    #[arg(long, requires_all = ["part", "buckets", "seed"], conflicts_with_all = ["gather", "shard_size"])]
    scatter: bool,

    /// With --scatter: this task's share, I/N (0 <= I < N), of the documents.
    #[arg(long, value_name = "I/N", requires = "scatter")]
    part: Option<Part>,

    /// With --scatter: the number of buckets, that is of gather tasks.
    #[arg(long, value_name = "B", requires = "scatter", value_parser = clap::value_parser!(u64).range(1..))]
    buckets: Option<u64>,

    /// Distributed, second stage: sort bucket --bucket of every scatter part
    /// in WORK into the dataset OUT.
    #[arg(long, requires = "bucket", conflicts_with_all = ["seed", "memory"])]
    gather: bool,

    /// With --gather: the bucket to gather, 0 <= J < B.
    #[arg(long, value_name = "J", requires = "gather")]
    bucket: Option<u64>,

    /// Memory budget for documents in flight; larger inputs are shuffled out
    /// of core. With --scatter, for the buckets' write buffers. A gather
    /// holds its whole bucket in memory.
    #[arg(long, value_name = "SIZE", default_value = "4GiB", value_parser = parse_size)]
    memory: u64,

    #[command(flatten)]
    write: WriteFlags,

    /// Threads for sorting; 0 uses every core. The output is the same for
    /// any value. A scatter does not sort and uses one.
    #[arg(long, short = 't', value_name = "N", default_value_t = 0)]
    threads: usize,
}

pub(crate) fn run(mut args: Args) -> anyhow::Result<ExitCode> {
    // clap drops a `requires` whose target conflicts with a flag given (say
    // `--bucket` with `--seed`): checked here too, so that no stage flag is
    // ever silently ignored.
    let stray = [
        ("--part", args.part.is_some(), "--scatter", args.scatter),
        (
            "--buckets",
            args.buckets.is_some(),
            "--scatter",
            args.scatter,
        ),
        ("--bucket", args.bucket.is_some(), "--gather", args.gather),
    ];
    if let Some((flag, _, stage, _)) = stray.iter().find(|(_, given, _, on)| *given && !on) {
        anyhow::bail!("{flag} is only for {stage}");
    }
    if args.gather {
        return gather(args);
    }
    let output = args.dirs.pop().expect("clap requires two directories");
    let seed = args.seed.expect("clap requires --seed without --gather");
    if args.scatter {
        return scatter(args, output, seed);
    }
    let mut config = ShuffleConfig::new(args.dirs, output, seed);
    config.memory = args.memory;
    config.writing = args.write.writing();
    config.threads = args.threads;
    let bar = super::progress::Bar::new(args.write.quiet);
    let r = shuffle::run(&config, &bar)?;
    if !args.write.quiet && !r.already_complete {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        let how = if r.buckets == 0 {
            "in memory".to_owned()
        } else {
            format!("out of core through {} buckets", r.buckets)
        };
        eprintln!(
            "Shuffled {} documents ({} tokens, {}) from {} with seed {} {how} in {:.1}s: {:.0} MB/s. Wrote {} in {}.{}",
            r.manifest.n_records,
            r.manifest.n_tokens,
            format_bytes(r.bytes),
            super::count(r.manifest.provenance.inputs.len() as u64, "input"),
            config.seed,
            secs,
            r.bytes as f64 / 1e6 / secs,
            config.output.display(),
            super::count(r.manifest.shards.len() as u64, "shard"),
            super::peak(),
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn scatter(args: Args, work: PathBuf, seed: u64) -> anyhow::Result<ExitCode> {
    let part = args.part.expect("clap requires --part with --scatter");
    let buckets = args
        .buckets
        .expect("clap requires --buckets with --scatter");
    let mut config = ScatterConfig::new(args.dirs, work, seed, part, buckets);
    config.memory = args.memory;
    config.overwrite = args.write.overwrite;
    config.single_writer = args.write.single_writer;
    let bar = super::progress::Bar::new(args.write.quiet);
    let r = shuffle::scatter(&config, &bar)?;
    if !args.write.quiet && !r.already_complete {
        let bytes = r.info.data_bytes;
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        eprintln!(
            "Scattered documents {}..{} of {} (part {part}) into {} buckets with seed {seed} in {:.1}s: {} at {:.0} MB/s. Wrote {}.{}",
            r.info.start,
            r.info.end,
            r.info.n_total,
            buckets,
            secs,
            format_bytes(bytes),
            bytes as f64 / 1e6 / secs,
            r.dir.display(),
            super::peak(),
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn gather(mut args: Args) -> anyhow::Result<ExitCode> {
    if args.dirs.len() != 2 {
        anyhow::bail!(
            "--gather takes two directories, WORK and OUT, not {}",
            args.dirs.len()
        );
    }
    let output = args.dirs.pop().expect("two directories");
    let work = args.dirs.pop().expect("two directories");
    let bucket = args.bucket.expect("clap requires --bucket with --gather");
    let mut config = GatherConfig::new(work, output, bucket);
    config.writing = args.write.writing();
    config.threads = args.threads;
    let bar = super::progress::Bar::new(args.write.quiet);
    let r = shuffle::gather(&config, &bar)?;
    if !args.write.quiet && !r.already_complete {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        let m = &r.manifest;
        eprintln!(
            "Gathered bucket {bucket} of {} ({} documents, {} tokens, {}) from {} in {:.1}s: {:.0} MB/s. Wrote {} in {}.{}",
            m.partition.as_ref().map_or(0, |p| p.parts),
            m.n_records,
            m.n_tokens,
            format_bytes(r.bytes),
            super::count(r.parts as u64, "scatter part"),
            secs,
            r.bytes as f64 / 1e6 / secs,
            config.output.display(),
            super::count(m.shards.len() as u64, "shard"),
            super::peak(),
        );
    }
    Ok(ExitCode::SUCCESS)
}
