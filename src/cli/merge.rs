//! `prep merge`: flags to a [`MergeConfig`], then the summary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use prep::merge::{self, MergeConfig};
use prep::size::format_bytes;

/// Join the partial datasets of a partitioned run into one dataset.
///
/// Takes every part of one run made with --part I/N (prep tokenize, prep
/// pack) or every bucket of prep shuffle --gather, in any order, and writes
/// OUT/manifest.json listing their shards in part order: the records are
/// exactly those one run without --part makes. Parts inside OUT are used in
/// place; parts elsewhere are hard-linked into OUT (or copied with --copy).
/// Token data is not copied, except shards that lose records to --dedup
/// across parts.
#[derive(Debug, Parser)]
#[command(after_help = "Exit codes: 0 success, 2 usage, input or I/O error.")]
pub(crate) struct Args {
    /// The partial datasets, then the output directory.
    #[arg(value_name = "DIR", required = true, num_args = 2..)]
    dirs: Vec<PathBuf>,

    /// Copy the shard files of parts outside OUT instead of hard-linking them.
    #[arg(long)]
    copy: bool,

    /// Replace another dataset found in OUT (the parts inside it are kept).
    #[arg(long)]
    overwrite: bool,

    /// No progress bar or summary; errors are still printed.
    #[arg(long, short = 'q')]
    quiet: bool,

    /// You guarantee this run is OUT's only writer: write to an object store
    /// that does not honour conditional writes, where prep's lock locks
    /// nothing (refused without it); the manifest records it.
    #[arg(long)]
    single_writer: bool,
}

pub(crate) fn run(mut args: Args) -> anyhow::Result<ExitCode> {
    let output = args.dirs.pop().expect("clap requires two directories");
    let mut config = MergeConfig::new(args.dirs, output);
    config.copy = args.copy;
    config.overwrite = args.overwrite;
    config.single_writer = args.single_writer;
    let bar = super::progress::Bar::new(args.quiet);
    let r = merge::run(&config, &bar)?;
    if args.quiet {
        return Ok(ExitCode::SUCCESS);
    }
    let m = &r.manifest;
    if r.already_complete {
        eprintln!(
            "{} is already this merge: {} records, {} tokens in {}. Nothing to do.",
            config.output.display(),
            m.n_records,
            m.n_tokens,
            super::count(m.shards.len() as u64, "shard")
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut how = Vec::new();
    for (n, what) in [
        (r.referenced, "used in place"),
        (r.linked, "hard-linked"),
        (r.copied, "copied"),
        (r.rewritten, "rewritten without cross-part duplicates"),
    ] {
        if n > 0 {
            how.push(format!("{n} {what}"));
        }
    }
    let dedup = m.provenance.documents.deduplicated;
    eprintln!(
        "Merged {} into {}: {} records, {} tokens in {} ({}){} in {:.2}s; wrote {} of shard data.{}",
        super::count(r.parts as u64, "part"),
        config.output.display(),
        m.n_records,
        m.n_tokens,
        super::count(m.shards.len() as u64, "shard"),
        if how.is_empty() { "none".to_owned() } else { how.join(", ") },
        if dedup > 0 { format!("; {dedup} duplicate documents dropped in all") } else { String::new() },
        r.elapsed.as_secs_f64(),
        format_bytes(r.bytes_written),
        prep::util::peak_rss_bytes().map_or(String::new(), |p| format!(" Peak memory {}.", format_bytes(p))),
    );
    Ok(ExitCode::SUCCESS)
}
