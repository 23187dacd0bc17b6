//! What `prep bench-read` measures: how fast the loader delivers batches,
//! beside a reference copy of the same size timed the way the device
//! clocks it, and how long a training step waits for its batch.
//!
//! One loader runs through every measurement, across epochs, as a training
//! run would: its buffers are allocated before timing starts and never
//! freed inside a timed loop.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use super::Gather;
use super::{
    Backend, Batch, HostBackend, Loader, LoaderConfig, LoaderError, Order, Pinned, Position, Widen,
};
use crate::format::Dataset;
use crate::size::format_bytes;

/// A plain copy of a batch's size: the ceiling the loader is measured
/// against.
pub trait Reference {
    /// The time `n` back-to-back copies of `bytes` bytes take, as the
    /// device clocks them (events on a GPU).
    fn copy_time(&self, bytes: usize, n: usize) -> Result<Duration, LoaderError>;
}

/// Bytes the host's reference copy cycles through: more than the caches,
/// as rows come from the page cache.
const HOST_SOURCE: usize = 512 << 20;

impl Reference for HostBackend {
    fn copy_time(&self, bytes: usize, n: usize) -> Result<Duration, LoaderError> {
        let chunks = (HOST_SOURCE / bytes.max(1)).max(2);
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

#[cfg(feature = "cuda")]
impl Reference for super::cuda::CudaBackend {
    fn copy_time(&self, bytes: usize, n: usize) -> Result<Duration, LoaderError> {
        self.pinned_copy_time(bytes, n)
    }
}

/// Where batches go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// Host memory ([`HostBackend`]).
    Cpu,
    /// GPU `N` (the CUDA backend; feature `cuda`).
    Cuda(usize),
}

impl FromStr for Device {
    type Err = LoaderError;

    /// `cpu`, `cuda` (GPU 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<Device, LoaderError> {
        let bad = || LoaderError::Usage(format!("device {s:?}: expected cpu or cuda:N"));
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(bad),
        }
    }
}

/// How a benchmark runs.
#[derive(Debug, Clone, Copy)]
pub struct BenchConfig {
    /// Rows per batch.
    pub batch_rows: usize,
    /// Batches to time in each measurement.
    pub steps: usize,
    /// The simulated training step.
    pub step: Step,
    /// Batches prepared ahead of the consumer.
    pub depth: usize,
    /// Gather threads (0: one per core).
    pub threads: usize,
    /// The sampler's seed.
    pub seed: u64,
    /// How ids arrive on a GPU.
    pub widen: Widen,
    /// The page-locked memory a GPU's staging buffers (and the reference
    /// copy's source) are.
    pub pinned: Pinned,
    /// Who gathers a batch's rows on a GPU.
    pub gather: Gather,
}

/// The length of the simulated training step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// A fixed time.
    Fixed(Duration),
    /// A multiple of the reference copy time of one batch, as measured in
    /// the same run: 2 asks whether the loader keeps up with a consumer
    /// that spends twice the copy's time on each batch.
    Copies(f64),
}

impl Default for Step {
    fn default() -> Step {
        Step::Copies(2.0)
    }
}

/// Sizes the reference copy is also timed at, beside the batch's: small
/// copies show the per-copy cost, large ones the link's bandwidth.
pub const REFERENCE_SIZES: [usize; 3] = [256 << 10, 4 << 20, 64 << 20];

/// One reference measurement.
#[derive(Debug, Clone, Copy)]
pub struct CopyTiming {
    /// Bytes per copy.
    pub bytes: usize,
    /// Copies timed.
    pub copies: usize,
    /// Their total time.
    pub time: Duration,
}

impl CopyTiming {
    /// Bytes per second.
    pub fn bandwidth(&self) -> f64 {
        (self.bytes * self.copies) as f64 / self.time.as_secs_f64().max(1e-12)
    }

    /// The time of one copy.
    pub fn per_copy(&self) -> Duration {
        self.time / self.copies.max(1) as u32
    }
}

/// What a benchmark measured.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// The dataset's directory.
    pub dir: std::path::PathBuf,
    /// Where batches went, in words.
    pub place: String,
    /// Rows in the dataset, and tokens per row.
    pub rows: u64,
    /// Tokens per row.
    pub row_tokens: usize,
    /// Bytes per batch, as stored.
    pub batch_bytes: usize,
    /// Rows per batch.
    pub batch_rows: usize,
    /// Ring depth.
    pub depth: usize,
    /// Full batches delivered as fast as the consumer took them, and the time.
    pub delivered: usize,
    /// The time the delivered batches took.
    pub delivery: Duration,
    /// The reference copy at the batch's size.
    pub batch_copy: CopyTiming,
    /// The reference copy at [`REFERENCE_SIZES`].
    pub references: Vec<CopyTiming>,
    /// The simulated step.
    pub step: Duration,
    /// Every step's wait for its batch after the ring filled, sorted.
    pub waits: Vec<Duration>,
}

/// A step counts as waiting when its batch took longer than this to be ready.
pub const WAITED: Duration = Duration::from_micros(100);

impl BenchReport {
    /// The loader's bandwidth, bytes per second.
    pub fn loader_bandwidth(&self) -> f64 {
        (self.delivered * self.batch_bytes) as f64 / self.delivery.as_secs_f64().max(1e-12)
    }

    /// Steps that waited over [`WAITED`].
    pub fn steps_waiting(&self) -> usize {
        self.waits.iter().filter(|w| **w > WAITED).count()
    }

    /// The report as one JSON object (`prep bench-read --json`): the
    /// figures the text shows, in seconds, bytes and bytes per second.
    pub fn to_json(&self) -> serde_json::Value {
        let secs = |d: Duration| d.as_secs_f64();
        let copy = |c: &CopyTiming| {
            serde_json::json!({
                "bytes": c.bytes,
                "copies": c.copies,
                "seconds": secs(c.time),
                "bytes_per_second": c.bandwidth(),
            })
        };
        let waits = &self.waits;
        serde_json::json!({
            "dir": self.dir.display().to_string(),
            "place": self.place,
            "rows": self.rows,
            "row_tokens": self.row_tokens,
            "batch_rows": self.batch_rows,
            "batch_bytes": self.batch_bytes,
            "depth": self.depth,
            "delivered": self.delivered,
            "delivery_seconds": secs(self.delivery),
            "loader_bytes_per_second": self.loader_bandwidth(),
            "loader_tokens_per_second": (self.delivered * self.batch_rows * self.row_tokens) as f64
                / secs(self.delivery).max(1e-12),
            "batch_copy": copy(&self.batch_copy),
            "references": self.references.iter().map(copy).collect::<Vec<_>>(),
            "step_seconds": secs(self.step),
            "steps_timed": waits.len(),
            "steps_waiting": self.steps_waiting(),
            "waited_threshold_seconds": secs(WAITED),
            "wait_mean_seconds": secs(waits.iter().sum::<Duration>()) / waits.len().max(1) as f64,
            "wait_max_seconds": waits.last().map_or(0.0, |d| secs(*d)),
        })
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gb = |bw: f64| bw / 1e9;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        writeln!(
            f,
            "{}: {} rows of {} tokens; batches of {} rows ({}), depth {}, to {}",
            self.dir.display(),
            self.rows,
            self.row_tokens,
            self.batch_rows,
            format_bytes(self.batch_bytes as u64),
            self.depth,
            self.place
        )?;
        let loader = self.loader_bandwidth();
        let tokens = (self.delivered * self.batch_rows * self.row_tokens) as f64;
        writeln!(
            f,
            "  loader, sampler order    {:>10.1}M tokens/s  {:>8.2} GB/s  ({:.0}% of the reference copy)",
            tokens / self.delivery.as_secs_f64().max(1e-12) / 1e6,
            gb(loader),
            100.0 * loader / self.batch_copy.bandwidth()
        )?;
        for c in std::iter::once(&self.batch_copy).chain(&self.references) {
            writeln!(
                f,
                "  reference copy {:>9}  {:>8} copies  {:>8.2} GB/s  {:>9.3} ms each",
                format_bytes(c.bytes as u64),
                c.copies,
                gb(c.bandwidth()),
                ms(c.per_copy())
            )?;
        }
        let waits = &self.waits;
        let mean = waits.iter().sum::<Duration>() / waits.len().max(1) as u32;
        let at = |q: usize| waits.get((waits.len() * q / 100).min(waits.len().saturating_sub(1)));
        write!(
            f,
            "  step of {:.3} ms ({:.1}x the reference copy of a batch): wait per step after warm-up mean {:.3} ms, p99 {:.3} ms, max {:.3} ms; {} of {} steps waited over {:.1} ms",
            ms(self.step),
            self.step.as_secs_f64() / self.batch_copy.per_copy().as_secs_f64().max(1e-12),
            ms(mean),
            at(99).map_or(0.0, |d| ms(*d)),
            waits.last().map_or(0.0, |d| ms(*d)),
            self.steps_waiting(),
            waits.len(),
            ms(WAITED)
        )
    }
}

/// Benchmarks the loader to `device`. Without the `cuda` feature, a GPU
/// device is an error that says how to build for one.
pub fn run(
    dataset: Arc<Dataset>,
    device: Device,
    config: &BenchConfig,
) -> Result<BenchReport, LoaderError> {
    match device {
        Device::Cpu => bench(dataset, Arc::new(HostBackend), "host memory", config),
        Device::Cuda(ordinal) => cuda(dataset, ordinal, config),
    }
}

#[cfg(feature = "cuda")]
fn cuda(
    ds: Arc<Dataset>,
    ordinal: usize,
    config: &BenchConfig,
) -> Result<BenchReport, LoaderError> {
    let backend = super::cuda::CudaBackend::new(ordinal, ds.dtype(), config.widen)?
        .with_pinned(config.pinned);
    let pinned = match config.pinned {
        Pinned::Plain => "plain",
        Pinned::WriteCombined => "write-combined",
    };
    let place = match config.gather {
        Gather::Host => format!("GPU cuda:{ordinal} ({pinned} pinned staging)"),
        Gather::Device => format!("GPU cuda:{ordinal} (rows gathered by a kernel on the device)"),
        Gather::Dma => format!("GPU cuda:{ordinal} (rows copied by the device's copy engines)"),
    };
    let backend = backend.gather_with(config.gather, ds.clone())?;
    bench(ds, Arc::new(backend), &place, config)
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: Arc<Dataset>, _: usize, _: &BenchConfig) -> Result<BenchReport, LoaderError> {
    Err(LoaderError::Usage(
        "this prep was built without GPU support: build it with `cargo build --release --features cuda`, or use --device cpu".into(),
    ))
}

/// Reads one byte per page of every shard so that the dataset is in the
/// page cache; returns the time it took.
pub fn warm_page_cache(ds: &Dataset) -> Result<Duration, LoaderError> {
    let started = Instant::now();
    let mut sum = 0u64;
    for span in ds.tokens(0..ds.n_tokens())? {
        sum += span
            .as_bytes()
            .iter()
            .step_by(4096)
            .map(|&b| u64::from(b))
            .sum::<u64>();
    }
    std::hint::black_box(sum);
    Ok(started.elapsed())
}

/// The two measurements, on one loader: delivery as fast as the consumer
/// takes batches, then steps of a simulated length.
pub fn bench<B: Backend + Reference>(
    ds: Arc<Dataset>,
    backend: Arc<B>,
    place: &str,
    config: &BenchConfig,
) -> Result<BenchReport, LoaderError> {
    if config.batch_rows == 0 || config.steps == 0 {
        return Err(LoaderError::Usage(
            "the batch and the steps must be at least 1".into(),
        ));
    }
    if ds.len() < config.batch_rows as u64 {
        return Err(LoaderError::Usage(format!(
            "the dataset has {} rows, fewer than a batch of {} (use a smaller batch)",
            ds.len(),
            config.batch_rows
        )));
    }
    let depth = config.depth.max(1);
    let mut loader = Loader::new(
        ds.clone(),
        backend.clone(),
        LoaderConfig {
            batch_rows: config.batch_rows,
            depth,
            order: Order::single(config.seed),
            start: Position::default(),
            end_epoch: None,
            threads: config.threads,
        },
    )?;
    let row_tokens = loader.row_tokens();
    let batch_bytes = config.batch_rows * row_tokens * ds.dtype().size();
    let steps = config.steps.max(depth + 1);

    // The reference copies first, the loader idle with its ring full.
    let references = REFERENCE_SIZES
        .iter()
        .map(|&bytes| reference(&*backend, bytes))
        .collect::<Result<Vec<_>, _>>()?;
    let batch_copy = reference(&*backend, batch_bytes)?;

    // 1. Delivery at full speed, after the ring has filled once.
    for _ in 0..depth {
        full_batch(&mut loader, &*backend, config.batch_rows)?.release(None);
    }
    let started = Instant::now();
    for _ in 0..steps {
        full_batch(&mut loader, &*backend, config.batch_rows)?.release(None);
    }
    let delivery = started.elapsed();

    // 2. Steps of a simulated length: how long each waits for its batch.
    let step = match config.step {
        Step::Fixed(d) => d,
        Step::Copies(x) => batch_copy.per_copy().mul_f64(x.max(0.0)),
    };
    let mut waits = Vec::with_capacity(steps);
    for k in 0..depth + steps {
        let t = Instant::now();
        let batch = full_batch(&mut loader, &*backend, config.batch_rows)?;
        if k >= depth {
            waits.push(t.elapsed());
        }
        simulate_step(step);
        batch.release(None);
    }
    waits.sort_unstable();
    Ok(BenchReport {
        dir: ds.dir().to_path_buf(),
        place: place.to_string(),
        rows: ds.len(),
        row_tokens,
        batch_bytes,
        batch_rows: config.batch_rows,
        depth,
        delivered: steps,
        delivery,
        batch_copy,
        references,
        step,
        waits,
    })
}

/// The reference copy of `bytes`, over about 1 GiB (8 to 2,000 copies).
fn reference<B: Reference>(backend: &B, bytes: usize) -> Result<CopyTiming, LoaderError> {
    let copies = ((1usize << 30) / bytes.max(1)).clamp(8, 2000);
    Ok(CopyTiming {
        bytes,
        copies,
        time: backend.copy_time(bytes, copies)?,
    })
}

/// The next batch of `rows` rows, ready as the host sees it; an epoch's
/// partial last batch is skipped.
fn full_batch<B: Backend>(
    loader: &mut Loader<B>,
    backend: &B,
    rows: usize,
) -> Result<Batch<B>, LoaderError> {
    loop {
        let batch = loader.next_batch()?.ok_or(LoaderError::Stopped)?;
        backend.wait(batch.ready())?;
        if batch.rows() == rows {
            return Ok(batch);
        }
    }
}

/// Busy for `d`, as a training step keeps the GPU busy. A sleep would
/// also do, but oversleeps by a scheduler tick at sub-millisecond lengths.
fn simulate_step(d: Duration) {
    let until = Instant::now() + d;
    if d > Duration::from_millis(2) {
        std::thread::sleep(d - Duration::from_millis(1));
    }
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_as_cpu_or_cuda_n() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda3"] {
            assert!(bad.parse::<Device>().is_err(), "{bad}");
        }
    }
}
