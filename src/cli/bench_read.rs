//! `prep bench-read`: how fast the loader delivers batches, beside a plain
//! copy of the same size, and how long a training step waits for data.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use prep::format::Dataset;
use prep::loader::bench::{self, BenchConfig, Device, Gather, Step};
use prep::loader::{Pinned, Widen};
use prep::size::format_bytes;

/// Measure the batch loader on a packed dataset: tokens/s delivered to the
/// device (or to host memory with --device cpu), the copy bandwidth beside
/// a reference copy of the same size in the same run (pinned host to
/// device, timed with CUDA events, on a GPU), that copy at 256 KiB, 4 MiB
/// and 64 MiB, and the consumer's wait per step while a training step of
/// --step-ms is simulated.
///
/// Rows are read in the sampler's order (seed --seed, one rank), epoch
/// after epoch, by one loader for the whole run. The first --depth steps
/// of each measurement fill the ring and are not counted.
#[derive(Debug, Parser)]
#[command(
    after_help = "Exit codes: 0 success, 2 usage error, a dataset that cannot be read, or no such device."
)]
pub(crate) struct Args {
    /// A packed dataset (or any dataset whose records are all one length).
    #[arg(value_name = "DIR")]
    dir: PathBuf,

    /// Where batches go: cpu (host memory), or cuda:N (GPU N; needs a prep
    /// built with --features cuda).
    #[arg(long, default_value = "cpu", value_parser = parse::<Device>)]
    device: Device,

    /// Rows per batch.
    #[arg(long, value_name = "B", default_value_t = 64)]
    batch: usize,

    /// Batches to time (at most one epoch).
    #[arg(long, value_name = "N", default_value_t = 200)]
    steps: usize,

    /// Simulated training step in milliseconds.
    #[arg(long, value_name = "MS", conflicts_with = "step_x")]
    step_ms: Option<f64>,

    /// Simulated training step as a multiple of the reference copy time of
    /// one batch, as measured in the same run: 2 asks whether the loader
    /// keeps up with a consumer that spends twice the copy's time per batch.
    #[arg(long, value_name = "X", default_value_t = 2.0)]
    step_x: f64,

    /// Batches prepared ahead of the consumer.
    #[arg(long, value_name = "K", default_value_t = 4)]
    depth: usize,

    /// Threads gathering rows (0: one per core).
    #[arg(long, short = 't', value_name = "N", default_value_t = 0)]
    threads: usize,

    /// Seed of the sampler's order.
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,

    /// cuda: widen ids on the device to i64, i32, or leave them (none).
    #[arg(long, default_value = "i64", value_parser = parse::<Widen>)]
    widen: Widen,

    /// cuda: the staging buffers' page-locked memory: plain (cached) or wc
    /// (write-combined). The reference copy reads the same kind.
    #[arg(long, default_value = "plain", value_parser = parse::<Pinned>)]
    pinned: Pinned,

    /// cuda: who gathers a batch's rows: host (the loader's threads, into
    /// staging buffers), device (a kernel on the GPU, from the dataset
    /// page-locked in place: it must fit in memory) or dma (the GPU's copy
    /// engines, from there too; CUDA 12.8 or newer).
    #[arg(long, default_value = "host", value_parser = parse::<Gather>)]
    gather: Gather,

    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,

    /// Do not read the dataset once before timing: measure with whatever
    /// of it the page cache holds.
    #[arg(long)]
    cold: bool,
}

/// A loader option from its text (device, widening, staging, gather).
fn parse<T: std::str::FromStr<Err = prep::loader::LoaderError>>(s: &str) -> Result<T, String> {
    s.parse()
        .map_err(|e: prep::loader::LoaderError| e.to_string())
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let ds = Arc::new(Dataset::open(&args.dir)?);
    if !args.cold {
        let took = bench::warm_page_cache(&ds)?;
        eprintln!(
            "Read the dataset once ({}) in {:.1}s so that it is in the page cache (--cold to skip).",
            format_bytes(ds.n_tokens() * ds.dtype().size() as u64),
            took.as_secs_f64()
        );
    }
    let step = match args.step_ms {
        Some(ms) => Step::Fixed(Duration::try_from_secs_f64(ms / 1e3).map_err(|_| {
            anyhow::anyhow!("--step-ms {ms}: expected a number of milliseconds, 0 or more")
        })?),
        None if args.step_x.is_finite() && args.step_x >= 0.0 => Step::Copies(args.step_x),
        None => anyhow::bail!("--step-x {}: expected a number, 0 or more", args.step_x),
    };
    let config = BenchConfig {
        batch_rows: args.batch,
        steps: args.steps,
        step,
        depth: args.depth,
        threads: args.threads,
        seed: args.seed,
        widen: args.widen,
        pinned: args.pinned,
        gather: args.gather,
    };
    let report = bench::run(ds, args.device, &config)?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        println!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}
