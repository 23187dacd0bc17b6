//! `prep bench-read`: how fast the loader delivers batches, beside a plain
//! copy of the same size, and how long a training step waits for data.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;

use crate::format::Dataset;
use crate::loader::{Backend, Batch, HostBackend, Loader, LoaderConfig, LoaderError};
use crate::sampler::Sampler;
use crate::size::format_bytes;

/// Measure the batch loader on a packed dataset: tokens/s delivered to the
/// device (or to host memory with --device cpu), the copy bandwidth beside
/// a plain copy of the same size in the same run, and the consumer's wait
/// per step while a training step of --step-ms is simulated.
///
/// Rows are read in the sampler's order (seed --seed, epoch 0, one rank).
/// The first --depth steps fill the ring and are not counted in the waits.
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
    #[arg(long, default_value = "cpu")]
    device: String,

    /// Rows per batch.
    #[arg(long, value_name = "B", default_value_t = 64)]
    batch: usize,

    /// Batches to time (at most one epoch).
    #[arg(long, value_name = "N", default_value_t = 200)]
    steps: usize,

    /// Simulated training step in milliseconds. [default: twice the copy
    /// time of one batch, as measured in the same run]
    #[arg(long, value_name = "X")]
    step_ms: Option<f64>,

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
    #[arg(long, default_value = "i64")]
    widen: String,

    /// Do not read the dataset once before timing: measure with whatever
    /// of it the page cache holds.
    #[arg(long)]
    cold: bool,
}

/// What the consumer does with a batch on a given device: wait until its
/// copy is complete (as seen from the host), and give it back.
trait Consumer<B: Backend> {
    fn wait_ready(&self, batch: &Batch<B>) -> Result<(), LoaderError>;
    /// Times `n` plain copies of `bytes` bytes: the bandwidth ceiling.
    fn plain_copy(&self, bytes: usize, n: usize) -> Result<Duration, LoaderError>;
}

struct Host;

/// Bytes the host's plain copy cycles through.
const PLAIN_SOURCE: usize = 512 << 20;

impl Consumer<HostBackend> for Host {
    fn wait_ready(&self, _: &Batch<HostBackend>) -> Result<(), LoaderError> {
        Ok(())
    }

    fn plain_copy(&self, bytes: usize, n: usize) -> Result<Duration, LoaderError> {
        // From a source larger than the caches, as the rows come from the
        // page cache: batch after batch of one contiguous buffer.
        let chunks = (PLAIN_SOURCE / bytes.max(1)).max(2);
        let src = vec![1u8; bytes * chunks];
        let mut dst = vec![0u8; bytes];
        let started = Instant::now();
        for k in 0..n {
            let at = (k % chunks) * bytes;
            dst.copy_from_slice(std::hint::black_box(&src[at..at + bytes]));
            std::hint::black_box(&mut dst);
        }
        Ok(started.elapsed())
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let ds = Arc::new(Dataset::open(&args.dir)?);
    if args.batch == 0 || args.steps == 0 {
        anyhow::bail!("--batch and --steps must be at least 1");
    }
    if !args.cold {
        let started = Instant::now();
        let mut sum = 0u64;
        for span in ds.tokens(0..ds.n_tokens())? {
            // One byte per page brings the file into the page cache.
            sum += span
                .as_bytes()
                .iter()
                .step_by(4096)
                .map(|&b| u64::from(b))
                .sum::<u64>();
        }
        std::hint::black_box(sum);
        eprintln!(
            "Read the dataset once ({}) in {:.1}s so that it is in the page cache (--cold to skip).",
            format_bytes(ds.n_tokens() * ds.dtype().size() as u64),
            started.elapsed().as_secs_f64()
        );
    }
    let device = args.device.as_str();
    if device == "cpu" {
        bench(&args, ds, Arc::new(HostBackend), &Host, "host memory")?;
        return Ok(ExitCode::SUCCESS);
    }
    let ordinal = match device.strip_prefix("cuda") {
        Some("") => 0,
        Some(n) => n
            .strip_prefix(':')
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| anyhow::anyhow!("--device {device:?}: expected cpu or cuda:N"))?,
        None => anyhow::bail!("--device {device:?}: expected cpu or cuda:N"),
    };
    cuda_bench(&args, ds, ordinal)
}

#[cfg(not(feature = "cuda"))]
fn cuda_bench(_: &Args, _: Arc<Dataset>, _: usize) -> anyhow::Result<ExitCode> {
    anyhow::bail!(
        "this prep was built without GPU support: build it with `cargo build --release --features cuda`, or use --device cpu"
    )
}

#[cfg(feature = "cuda")]
fn cuda_bench(args: &Args, ds: Arc<Dataset>, ordinal: usize) -> anyhow::Result<ExitCode> {
    use crate::loader::cuda::{CudaBackend, Widen};
    let widen = match args.widen.as_str() {
        "none" => Widen::None,
        "i32" => Widen::I32,
        "i64" => Widen::I64,
        other => anyhow::bail!("--widen {other:?}: expected none, i32 or i64"),
    };
    let backend = Arc::new(CudaBackend::new(ordinal, ds.dtype(), widen)?);
    let consumer = gpu::Gpu {
        backend: backend.clone(),
    };
    bench(args, ds, backend, &consumer, &format!("GPU cuda:{ordinal}"))?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::Consumer;
    use crate::loader::cuda::CudaBackend;
    use crate::loader::{Batch, LoaderError};

    pub(super) struct Gpu {
        pub(super) backend: Arc<CudaBackend>,
    }

    fn err(e: cudarc::driver::DriverError) -> LoaderError {
        LoaderError::Backend(format!("CUDA: {e}"))
    }

    impl Consumer<CudaBackend> for Gpu {
        fn wait_ready(&self, batch: &Batch<CudaBackend>) -> Result<(), LoaderError> {
            batch.ready().synchronize().map_err(err)
        }

        fn plain_copy(&self, bytes: usize, n: usize) -> Result<Duration, LoaderError> {
            let ctx = self.backend.context();
            let stream = ctx.new_stream().map_err(err)?;
            // SAFETY: filled right below, before any read.
            let mut host = unsafe { ctx.alloc_pinned::<u8>(bytes) }.map_err(err)?;
            host.as_mut_slice().map_err(err)?.fill(1);
            let mut dev = stream.alloc_zeros::<u8>(bytes).map_err(err)?;
            stream.memcpy_htod(&host, &mut dev).map_err(err)?;
            stream.synchronize().map_err(err)?;
            let started = Instant::now();
            for _ in 0..n {
                stream.memcpy_htod(&host, &mut dev).map_err(err)?;
            }
            stream.synchronize().map_err(err)?;
            Ok(started.elapsed())
        }
    }
}

/// The two measurements: delivery as fast as the consumer can take it,
/// then steps of a simulated length.
fn bench<B: Backend>(
    args: &Args,
    ds: Arc<Dataset>,
    backend: Arc<B>,
    consumer: &dyn Consumer<B>,
    place: &str,
) -> Result<(), LoaderError> {
    let sampler = Sampler::new(ds.len(), args.seed, 0, 0, 1);
    let config = LoaderConfig {
        batch_rows: args.batch,
        depth: args.depth,
        start: 0,
        threads: args.threads,
    };
    let row_bytes = ds.n_tokens() / ds.len().max(1) * ds.dtype().size() as u64;
    let batch_bytes = args.batch as u64 * row_bytes;
    if sampler.len() < args.batch as u64 {
        return Err(LoaderError::Usage(format!(
            "the dataset has {} rows, fewer than a batch of {} (use a smaller --batch)",
            sampler.len(),
            args.batch
        )));
    }
    let steps = args.steps.max(args.depth + 1);

    // 1. Delivery at full speed.
    let mut epochs = Epochs::new(&ds, &backend, args, config)?;
    let mut delivered = 0u64;
    let started = Instant::now();
    for _ in 0..steps {
        let batch = epochs.next()?;
        consumer.wait_ready(&batch)?;
        delivered += batch.rows() as u64;
        batch.release(None);
    }
    let elapsed = started.elapsed();
    drop(epochs);
    let plain = consumer.plain_copy(batch_bytes as usize, steps)?;
    let row_tokens = row_bytes / ds.dtype().size() as u64;
    let tokens = delivered * row_tokens;
    let rate = |bytes: u64, t: Duration| bytes as f64 / t.as_secs_f64().max(1e-9);
    let loader_bw = rate(delivered * row_bytes, elapsed);
    let plain_bw = rate(batch_bytes * steps as u64, plain);
    println!(
        "{}: {} rows of {row_tokens} tokens; batches of {} rows ({}), depth {}, to {place}",
        args.dir.display(),
        ds.len(),
        args.batch,
        format_bytes(batch_bytes),
        args.depth
    );
    println!(
        "  loader, sampler order    {:>10.1}M tokens/s  {:>8.2} GB/s  ({:.0}% of the plain copy)",
        tokens as f64 / elapsed.as_secs_f64().max(1e-9) / 1e6,
        loader_bw / 1e9,
        100.0 * loader_bw / plain_bw
    );
    println!(
        "  plain copy, same size    {:>10}              {:>8.2} GB/s",
        "",
        plain_bw / 1e9
    );

    // 2. Steps of a simulated length: how long each waits for its batch.
    let copy_ms = plain.as_secs_f64() * 1e3 / steps as f64;
    let loader_ms = elapsed.as_secs_f64() * 1e3 / steps as f64;
    let step_ms = args.step_ms.unwrap_or(2.0 * copy_ms);
    let mut epochs = Epochs::new(&ds, &backend, args, config)?;
    let mut waits = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t = Instant::now();
        let batch = epochs.next()?;
        consumer.wait_ready(&batch)?;
        waits.push(t.elapsed());
        simulate_step(Duration::from_secs_f64(step_ms / 1e3));
        batch.release(None);
    }
    let counted = &mut waits[args.depth.min(steps)..];
    counted.sort_unstable();
    let mean = counted.iter().sum::<Duration>() / counted.len().max(1) as u32;
    let over = counted
        .iter()
        .filter(|w| **w > Duration::from_micros(100))
        .count();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "  step of {step_ms:.3} ms ({:.1}x the plain copy of a batch, {:.1}x the loader's time per batch):\n    wait per step after warm-up mean {:.3} ms, p99 {:.3} ms, max {:.3} ms; {over} of {} steps waited over 0.1 ms",
        step_ms / copy_ms.max(1e-9),
        step_ms / loader_ms.max(1e-9),
        ms(mean),
        ms(counted[(counted.len() * 99 / 100).min(counted.len() - 1)]),
        ms(*counted.last().expect("more steps than depth")),
        counted.len()
    );
    Ok(())
}

/// Full batches from epoch after epoch (a new loader for each epoch: its
/// buffers are allocated when the epoch starts, not per step).
struct Epochs<'a, B: Backend> {
    ds: &'a Arc<Dataset>,
    backend: &'a Arc<B>,
    seed: u64,
    config: LoaderConfig,
    epoch: u64,
    loader: Loader<B>,
}

impl<'a, B: Backend> Epochs<'a, B> {
    fn new(
        ds: &'a Arc<Dataset>,
        backend: &'a Arc<B>,
        args: &Args,
        config: LoaderConfig,
    ) -> Result<Epochs<'a, B>, LoaderError> {
        let sampler = Sampler::new(ds.len(), args.seed, 0, 0, 1);
        Ok(Epochs {
            ds,
            backend,
            seed: args.seed,
            config,
            epoch: 0,
            loader: Loader::new(ds.clone(), sampler, backend.clone(), config)?,
        })
    }

    /// The next full batch; a partial last batch of an epoch is skipped.
    fn next(&mut self) -> Result<Batch<B>, LoaderError> {
        loop {
            match self.loader.next_batch()? {
                Some(b) if b.rows() == self.config.batch_rows => return Ok(b),
                Some(_) => continue,
                None => {
                    self.epoch += 1;
                    let sampler = Sampler::new(self.ds.len(), self.seed, self.epoch, 0, 1);
                    self.loader =
                        Loader::new(self.ds.clone(), sampler, self.backend.clone(), self.config)?;
                }
            }
        }
    }
}

/// Busy for `d` (a training step keeps the GPU busy; a sleep would also
/// do, but oversleeps by a scheduler tick at sub-millisecond lengths).
fn simulate_step(d: Duration) {
    let until = Instant::now() + d;
    if d > Duration::from_millis(2) {
        std::thread::sleep(d - Duration::from_millis(1));
    }
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}
