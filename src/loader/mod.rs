//! Batches of rows delivered ahead of the consumer: a background thread
//! gathers each batch from the mapped shards into a staging buffer, starts
//! its copy into a target buffer, and hands the target to the consumer with
//! a fence that says when the copy is complete.
//!
//! # The ring
//!
//! There are `depth` slots, each a staging buffer (the producer's, filled by
//! the CPU) and a target buffer (the consumer's: device memory on a GPU).
//! Targets move between the two threads by channel, so a target is owned by
//! exactly one side at a time and the type system rules out writing a
//! buffer the consumer is reading:
//!
//! 1. the producer gathers batch `k` into staging buffer `k % depth`, once
//!    the copy out of it for batch `k - depth` is complete
//!    ([`Backend::fill`] waits for that);
//! 2. it takes a free target (waiting while the consumer holds all of them:
//!    at most `depth` batches are in flight) and starts the copy, ordered
//!    after the fence the consumer released that target with
//!    ([`Backend::copy`]; on a GPU a stream wait, not a host sync);
//! 3. it sends the target, the copy's fence, the sampler position and the
//!    row count to the consumer, in batch order.
//!
//! The consumer takes batches with [`Loader::next`], orders its work after
//! [`Batch::ready`] and gives the target back with [`Batch::release`],
//! passing a fence for its own work on it. Nothing is allocated per step:
//! buffers are allocated once, when the loader starts.
//!
//! The scheduling is written against [`Backend`]: [`HostBackend`] copies
//! between host buffers and runs everywhere (and is what `prep bench-read
//! --device cpu` measures); the CUDA backend (feature `cuda`) copies into
//! device memory through pinned staging buffers.

#[cfg(feature = "cuda")]
pub mod cuda;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::format::{Dataset, FormatError};
use crate::sampler::Sampler;

/// Every way a loader can fail.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// Reading the dataset failed.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The dataset's records are not rows of one length.
    #[error("{0}")]
    Usage(String),
    /// The backend (the GPU driver, or a test's) failed.
    #[error("{0}")]
    Backend(String),
    /// The producer thread stopped without saying why (it panicked).
    #[error("the loader's producer thread stopped unexpectedly")]
    Stopped,
}

/// Where batches are copied: buffers, a copy that may run asynchronously,
/// and fences that say when it is complete.
pub trait Backend: Send + Sync + 'static {
    /// A buffer the CPU fills with a batch's rows (pinned host memory).
    type Staging: Send + 'static;
    /// A buffer the consumer reads a batch from (device memory).
    type Target: Send + 'static;
    /// A point in a queue of work, complete or not.
    type Fence: Send + 'static;

    /// A staging buffer of `bytes` bytes.
    fn alloc_staging(&self, bytes: usize) -> Result<Self::Staging, LoaderError>;
    /// A target buffer for a batch of `bytes` staged bytes.
    fn alloc_target(&self, bytes: usize) -> Result<Self::Target, LoaderError>;
    /// The staging buffer's bytes, to be written, once every copy out of it
    /// is complete.
    fn fill<'a>(&self, staging: &'a mut Self::Staging) -> Result<&'a mut [u8], LoaderError>;
    /// Starts copying the first `bytes` bytes of `staging` into `target`,
    /// after `after` (the consumer's fence for its last use of `target`)
    /// is complete; returns the fence of the copy.
    fn copy(
        &self,
        staging: &mut Self::Staging,
        target: &mut Self::Target,
        bytes: usize,
        after: Option<Self::Fence>,
    ) -> Result<Self::Fence, LoaderError>;

    /// Takes back a copy's fence once the consumer is done with its batch,
    /// so that [`Backend::copy`] can use it again instead of making a new
    /// one each step. Fences the backend keeps no pool of are dropped.
    fn recycle(&self, _fence: Self::Fence) {}
}

/// A batch ready for the consumer (or being copied into its target: see
/// [`Batch::ready`]).
pub struct Batch<B: Backend> {
    target: Option<B::Target>,
    ready: Option<B::Fence>,
    position: u64,
    rows: usize,
    row_tokens: usize,
    slot: usize,
    free: Sender<Free<B>>,
}

impl<B: Backend> Batch<B> {
    /// The target buffer: `rows() * row_tokens()` tokens, row after row.
    pub fn target(&self) -> &B::Target {
        self.target.as_ref().expect("held until released")
    }

    /// The fence of the copy into the target: order work on the target after it.
    pub fn ready(&self) -> &B::Fence {
        self.ready.as_ref().expect("held until released")
    }

    /// The sampler position of the batch's first row: a run resumes at
    /// `position() + rows()` once this batch is consumed.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Rows in the batch: the batch size, or fewer for the last batch of the epoch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Tokens per row.
    pub fn row_tokens(&self) -> usize {
        self.row_tokens
    }

    /// The ring slot the batch occupies (for diagnostics).
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Gives the target back for the next batches; the producer copies into
    /// it only after `done` (the fence of the consumer's last work on it)
    /// is complete. `None` says that work is already complete.
    pub fn release(mut self, done: Option<B::Fence>) {
        self.give_back(done);
    }

    fn give_back(&mut self, done: Option<B::Fence>) {
        if let Some(target) = self.target.take() {
            // The producer may have stopped; then the target is simply freed.
            let _ = self.free.send(Free {
                slot: self.slot,
                target,
                done,
                ready: self.ready.take(),
            });
        }
    }
}

impl<B: Backend> Drop for Batch<B> {
    /// Dropping a batch releases it with no fence: the consumer's work on it
    /// must be complete by then.
    fn drop(&mut self) {
        self.give_back(None);
    }
}

/// A target on its way back to the producer, with the consumer's fence and
/// the spent fence of the copy that filled it.
struct Free<B: Backend> {
    slot: usize,
    target: B::Target,
    done: Option<B::Fence>,
    ready: Option<B::Fence>,
}

/// What the producer sends: a batch, an error, or the end of the epoch.
enum Message<B: Backend> {
    Batch {
        slot: usize,
        target: B::Target,
        ready: B::Fence,
        position: u64,
        rows: usize,
    },
    Failed(LoaderError),
}

/// How a loader runs.
#[derive(Debug, Clone, Copy)]
pub struct LoaderConfig {
    /// Rows per batch.
    pub batch_rows: usize,
    /// Slots in the ring: batches prepared ahead of the consumer, at most.
    pub depth: usize,
    /// The sampler position to start from (a resumed run's position).
    pub start: u64,
    /// Threads that gather rows into staging buffers (0: one per core).
    /// The gather is a random read of the page cache at a few GB/s per
    /// thread, while a PCIe 5 copy runs at tens: feeding a GPU at full
    /// speed takes several.
    pub threads: usize,
}

/// Delivers the batches of one epoch of one rank, in sampler order, from a
/// background thread. Dropping it stops the thread.
pub struct Loader<B: Backend> {
    ready: Receiver<Message<B>>,
    free: Option<Sender<Free<B>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    row_tokens: usize,
    finished: bool,
}

impl<B: Backend> Loader<B> {
    /// Starts the producer: `depth` staging and target buffers of
    /// `batch_rows` rows each are allocated now, once.
    ///
    /// The dataset's records must all be one length (a packed dataset, or
    /// any dataset of equal records).
    pub fn new(
        dataset: Arc<Dataset>,
        sampler: Sampler,
        backend: Arc<B>,
        config: LoaderConfig,
    ) -> Result<Loader<B>, LoaderError> {
        let row_tokens = row_length(&dataset)?;
        let depth = config.depth.max(1);
        let batch_rows = config.batch_rows.max(1);
        let bytes = batch_rows * row_tokens * dataset.dtype().size();
        let mut staging = Vec::with_capacity(depth);
        let (free_tx, free_rx) = mpsc::channel();
        for slot in 0..depth {
            staging.push(backend.alloc_staging(bytes)?);
            free_tx
                .send(Free {
                    slot,
                    target: backend.alloc_target(bytes)?,
                    done: None,
                    ready: None,
                })
                .expect("the receiver is alive");
        }
        let (ready_tx, ready_rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let threads = crate::util::thread_count(config.threads);
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("prep-gather-{i}"))
                    .build()
                    .map_err(|e| {
                        LoaderError::Backend(format!("cannot start gather threads: {e}"))
                    })?,
            )
        } else {
            None
        };
        let producer = Producer {
            pool,
            indices: vec![0; batch_rows],
            row_bytes: row_tokens * dataset.dtype().size(),
            dataset,
            sampler,
            backend,
            staging,
            free: free_rx,
            ready: ready_tx,
            stop: stop.clone(),
            batch_rows,
            start: config.start,
        };
        let thread = std::thread::Builder::new()
            .name("prep-loader".into())
            .spawn(move || producer.run())
            .map_err(|e| LoaderError::Backend(format!("cannot start the loader thread: {e}")))?;
        Ok(Loader {
            ready: ready_rx,
            free: Some(free_tx),
            stop,
            thread: Some(thread),
            row_tokens,
            finished: false,
        })
    }

    /// Tokens per row.
    pub fn row_tokens(&self) -> usize {
        self.row_tokens
    }

    /// The next batch, in sampler order; `None` at the end of the epoch.
    /// Waits while the producer has none ready. After an error, every later
    /// call returns `None`.
    pub fn next_batch(&mut self) -> Result<Option<Batch<B>>, LoaderError> {
        if self.finished {
            return Ok(None);
        }
        match self.ready.recv() {
            Ok(Message::Batch {
                slot,
                target,
                ready,
                position,
                rows,
            }) => Ok(Some(Batch {
                target: Some(target),
                ready: Some(ready),
                position,
                rows,
                row_tokens: self.row_tokens,
                slot,
                free: self.free.clone().expect("alive until dropped"),
            })),
            Ok(Message::Failed(e)) => {
                self.finished = true;
                Err(e)
            }
            Err(_) => {
                // The producer is gone: the end of the epoch, or a panic.
                self.finished = true;
                let panicked = self
                    .thread
                    .take()
                    .map(|t| t.join().is_err())
                    .unwrap_or(false);
                if panicked {
                    Err(LoaderError::Stopped)
                } else {
                    Ok(None)
                }
            }
        }
    }
}

impl<B: Backend> Drop for Loader<B> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.free.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The length of every record, which the loader needs to be one.
fn row_length(ds: &Dataset) -> Result<usize, LoaderError> {
    if let Some(l) = ds.manifest().seq_len {
        return Ok(l as usize);
    }
    let mut lengths = ds.record_lengths();
    let first = lengths.next().unwrap_or(0);
    if lengths.all(|l| l == first) && first > 0 {
        Ok(first as usize)
    } else {
        Err(LoaderError::Usage(format!(
            "{}: records differ in length; the loader reads rows of one length (pack the dataset first)",
            ds.dir().display()
        )))
    }
}

/// The producer thread's state.
struct Producer<B: Backend> {
    /// Gather threads, when more than one.
    pool: Option<rayon::ThreadPool>,
    /// The current batch's record indices (allocated once).
    indices: Vec<u64>,
    row_bytes: usize,
    dataset: Arc<Dataset>,
    sampler: Sampler,
    backend: Arc<B>,
    staging: Vec<B::Staging>,
    free: Receiver<Free<B>>,
    ready: Sender<Message<B>>,
    stop: Arc<AtomicBool>,
    batch_rows: usize,
    start: u64,
}

/// How often a waiting producer looks at the stop flag.
const POLL: Duration = Duration::from_millis(20);

impl<B: Backend> Producer<B> {
    fn run(mut self) {
        if let Err(e) = self.produce() {
            let _ = self.ready.send(Message::Failed(e));
        }
    }

    fn produce(&mut self) -> Result<(), LoaderError> {
        let end = self.sampler.len();
        let mut position = self.start.min(end);
        let mut k = 0usize;
        while position < end {
            let rows = (end - position).min(self.batch_rows as u64) as usize;
            let s = k % self.staging.len();
            let bytes = self.gather(s, position, rows)?;
            let Some(mut free) = self.take_free()? else {
                return Ok(()); // stopped
            };
            if let Some(spent) = free.ready.take() {
                self.backend.recycle(spent);
            }
            let ready = self.backend.copy(
                &mut self.staging[s],
                &mut free.target,
                bytes,
                free.done.take(),
            )?;
            let sent = self.ready.send(Message::Batch {
                slot: free.slot,
                target: free.target,
                ready,
                position,
                rows,
            });
            if sent.is_err() {
                return Ok(()); // the consumer is gone
            }
            position += rows as u64;
            k += 1;
        }
        Ok(())
    }

    /// Copies the rows at sampler positions `position..position + rows`
    /// into staging buffer `s`; returns the bytes written.
    fn gather(&mut self, s: usize, position: u64, rows: usize) -> Result<usize, LoaderError> {
        for (k, slot) in self.indices[..rows].iter_mut().enumerate() {
            *slot = self
                .sampler
                .get(position + k as u64)
                .expect("positions below len()");
        }
        let buffer = self.backend.fill(&mut self.staging[s])?;
        let bytes = rows * self.row_bytes;
        let ds = &self.dataset;
        let copy = |(slot, &index): (&mut [u8], &u64)| -> Result<(), LoaderError> {
            let record = ds.record(index)?.as_bytes();
            if record.len() != slot.len() {
                return Err(LoaderError::Usage(format!(
                    "record {index} is {} bytes, not the {} of a row",
                    record.len(),
                    slot.len()
                )));
            }
            slot.copy_from_slice(record);
            Ok(())
        };
        let indices = &self.indices[..rows];
        match &self.pool {
            None => buffer[..bytes]
                .chunks_mut(self.row_bytes)
                .zip(indices)
                .try_for_each(copy)?,
            Some(pool) => pool.install(|| {
                use rayon::prelude::*;
                buffer[..bytes]
                    .par_chunks_mut(self.row_bytes)
                    .zip(indices.par_iter())
                    .try_for_each(copy)
            })?,
        }
        Ok(bytes)
    }

    /// A free target, waiting for one while the consumer holds them all;
    /// `None` once the loader is dropped.
    fn take_free(&self) -> Result<Option<Free<B>>, LoaderError> {
        loop {
            if self.stop.load(Ordering::Acquire) {
                return Ok(None);
            }
            match self.free.recv_timeout(POLL) {
                Ok(free) => return Ok(Some(free)),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
            }
        }
    }
}

/// Copies between host buffers: the target is host memory and every copy
/// is complete when [`Backend::copy`] returns. Runs everywhere; it is what
/// `prep bench-read --device cpu` measures.
#[derive(Debug, Default)]
pub struct HostBackend;

/// A fence that is always complete (the host copy is synchronous).
#[derive(Debug, Clone, Copy, Default)]
pub struct Done;

impl Backend for HostBackend {
    type Staging = Vec<u8>;
    type Target = Vec<u8>;
    type Fence = Done;

    fn alloc_staging(&self, bytes: usize) -> Result<Vec<u8>, LoaderError> {
        Ok(vec![0; bytes])
    }

    fn alloc_target(&self, bytes: usize) -> Result<Vec<u8>, LoaderError> {
        Ok(vec![0; bytes])
    }

    fn fill<'a>(&self, staging: &'a mut Vec<u8>) -> Result<&'a mut [u8], LoaderError> {
        Ok(staging)
    }

    fn copy(
        &self,
        staging: &mut Vec<u8>,
        target: &mut Vec<u8>,
        bytes: usize,
        _after: Option<Done>,
    ) -> Result<Done, LoaderError> {
        target[..bytes].copy_from_slice(&staging[..bytes]);
        Ok(Done)
    }
}
