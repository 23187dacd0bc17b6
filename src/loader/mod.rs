//! Batches of rows delivered ahead of the consumer: a background thread
//! gathers each batch from the mapped shards into a staging buffer, starts
//! its copy into a target buffer, and hands the target to the consumer with
//! a fence that says when the copy is complete. One loader runs across
//! epochs, allocating its buffers once.
//!
//! # The ring
//!
//! There are `depth` slots, each a staging buffer (the producer's, filled by
//! the CPU) and a target buffer (the consumer's: device memory on a GPU).
//! Targets move between the two threads by channel, so a target is owned by
//! exactly one side at a time and the type system rules out writing a
//! buffer the consumer is reading. The rules, all kept here in the ring
//! rather than left to a backend:
//!
//! 1. **Staging reuse.** The producer gathers batch `k` into staging buffer
//!    `k % depth` only after the staging fence of that buffer (recorded by
//!    [`Backend::copy`] once the copy of batch `k - depth` has read it) is
//!    complete: [`Backend::wait`], a host wait.
//! 2. **Target reuse.** It takes a free target (waiting while the consumer
//!    holds all of them: at most `depth` batches are in flight) and starts
//!    the copy, ordered after the fence the consumer released that target
//!    with ([`Backend::copy`]; on a GPU a stream wait, not a host sync).
//! 3. **Order.** It sends the target, the copy's fence, the epoch, the
//!    sampler position and the row count to the consumer, in order: epoch
//!    after epoch, each in sampler order. An epoch ends with its partial
//!    batch, if any; no batch spans two epochs.
//! 4. **Freeing.** A target is freed only through [`Backend::retire`], with
//!    the consumer's last fence on it: whether it was waiting in the ring
//!    when the loader was dropped, or released by the consumer after the
//!    loader was gone. Staging buffers are freed after their last copy is
//!    complete.
//!
//! The consumer takes batches with [`Loader::next_batch`], orders its work
//! after [`Batch::ready`] and gives the target back with [`Batch::release`],
//! passing a fence for its own work on it. Nothing is allocated per step:
//! buffers are allocated once, when the loader starts, and serve every epoch.
//!
//! # Where rows come from
//!
//! [`Loader::new`] reads a mapped local [`Dataset`] in the order of a
//! [`Sampler`] (a full permutation per epoch); [`Loader::from_stream`] reads
//! a packed dataset in object storage through a [`Stream`] (its block order,
//! fetched ahead into a bounded cache: see [`crate::stream`]). The ring, the
//! backends and the batches are the same for both.
//!
//! The scheduling is written against [`Backend`]: [`HostBackend`] copies
//! between host buffers and runs everywhere (and is what `prep bench-read
//! --device cpu` measures); the CUDA backend (feature `cuda`) copies into
//! device memory through pinned staging buffers.

pub mod bench;
#[cfg(feature = "cuda")]
pub mod cuda;

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::format::{Dataset, Dtype, FormatError, Manifest};
use crate::sampler::{BlockOrder, Sampler};
use crate::stream::{Share, Stream, StreamError, StreamReader};

/// Every way a loader can fail.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// Reading the dataset failed.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Streaming the dataset failed (a fetch, a check, the cache).
    #[error(transparent)]
    Stream(#[from] Box<StreamError>),
    /// The dataset or the configuration does not suit the loader (records
    /// of different lengths, a rank with no rows, ids that do not fit).
    #[error("{0}")]
    Usage(String),
    /// The backend (the GPU driver, or a test's) failed.
    #[error("{0}")]
    Backend(String),
    /// The producer thread stopped without saying why (it panicked).
    #[error("the loader's producer thread stopped unexpectedly")]
    Stopped,
}

/// The kind of page-locked host memory a GPU backend stages batches in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pinned {
    /// Cached page-locked memory (`cuMemHostAlloc` with no flags): the
    /// gather writes it at memory speed.
    #[default]
    Plain,
    /// Write-combined (`CU_MEMHOSTALLOC_WRITECOMBINED`): uncached, the CPU
    /// writes it through write-combining buffers and reads it very slowly.
    WriteCombined,
}

impl FromStr for Pinned {
    type Err = LoaderError;

    /// `plain` or `wc`.
    fn from_str(s: &str) -> Result<Pinned, LoaderError> {
        match s {
            "plain" => Ok(Pinned::Plain),
            "wc" => Ok(Pinned::WriteCombined),
            _ => Err(LoaderError::Usage(format!(
                "pinned memory {s:?}: expected plain or wc"
            ))),
        }
    }
}

/// Who gathers a batch's rows when they go to a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gather {
    /// The loader's threads, into staging buffers the GPU copies from.
    #[default]
    Host,
    /// A kernel on the GPU reads each row from the dataset registered in
    /// place (`CudaBackend::gather_on_device`).
    Device,
    /// The GPU's copy engines copy each row from the dataset registered in
    /// place, one batched copy per batch (`CudaBackend::gather_by_copies`).
    Dma,
}

impl FromStr for Gather {
    type Err = LoaderError;

    /// `host`, `device` or `dma`.
    fn from_str(s: &str) -> Result<Gather, LoaderError> {
        match s {
            "host" => Ok(Gather::Host),
            "device" => Ok(Gather::Device),
            "dma" => Ok(Gather::Dma),
            _ => Err(LoaderError::Usage(format!(
                "gather {s:?}: expected host, device or dma"
            ))),
        }
    }
}

/// The ids as the consumer receives them on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Widen {
    /// As stored: 2 or 4 bytes per token.
    None,
    /// Widened on the device to int32 (only for ids below 2^31).
    I32,
    /// Widened on the device to int64 (what `torch.nn.Embedding` takes).
    I64,
}

impl Widen {
    /// Bytes per id as the consumer receives them, for stored `dtype`.
    pub fn bytes(self, dtype: Dtype) -> usize {
        match self {
            Widen::None => dtype.size(),
            Widen::I32 => 4,
            Widen::I64 => 8,
        }
    }
}

impl FromStr for Widen {
    type Err = LoaderError;

    /// `none`, `i32` or `i64`.
    fn from_str(s: &str) -> Result<Widen, LoaderError> {
        match s {
            "none" => Ok(Widen::None),
            "i32" => Ok(Widen::I32),
            "i64" => Ok(Widen::I64),
            other => Err(LoaderError::Usage(format!(
                "widen {other:?}: expected none, i32 or i64"
            ))),
        }
    }
}

/// Refuses a widening that could change an id: uint32 ids of a vocabulary
/// over 2^31 do not all fit an int32 (the widening is a bit copy, so an id
/// of 2^31 or more would arrive negative). Every id is below `vocab_size`
/// (`prep validate` checks it), so the vocabulary decides.
pub fn check_widen(dtype: Dtype, widen: Widen, vocab_size: u64) -> Result<(), LoaderError> {
    if dtype == Dtype::U32 && widen == Widen::I32 && vocab_size > 1 << 31 {
        return Err(LoaderError::Usage(format!(
            "a vocabulary of {vocab_size} ids does not fit int32 (ids of 2^31 and more would turn negative): widen to i64"
        )));
    }
    Ok(())
}

/// Where batches are copied: buffers, a copy that may run asynchronously,
/// and fences that say when work is complete.
///
/// A backend's work runs in one queue (a GPU stream): a copy starts after
/// everything queued before it, and so does a free queued by
/// [`Backend::retire`]. The ring keeps the rules of reuse (see the module
/// documentation); a backend only has to do what each method says.
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
    /// A fence with nothing recorded in it: complete.
    fn fence(&self) -> Result<Self::Fence, LoaderError>;
    /// The staging buffer's bytes, to be written. The ring calls this only
    /// once the buffer's staging fence is complete; the backend need not
    /// wait for anything.
    fn staging_mut<'a>(&self, staging: &'a mut Self::Staging) -> Result<&'a mut [u8], LoaderError>;
    /// Starts copying the first `bytes` bytes of `staging` into `target`,
    /// after `after` (the consumer's fence for its last use of `target`)
    /// is complete. Records into `staged` the point at which the copy has
    /// read all of `staging`, and returns the fence of the batch being
    /// ready in `target` (the copy and any work after it, such as widening).
    fn copy(
        &self,
        staging: &mut Self::Staging,
        target: &mut Self::Target,
        bytes: usize,
        after: Option<Self::Fence>,
        staged: &mut Self::Fence,
    ) -> Result<Self::Fence, LoaderError>;
    /// Blocks the calling thread until `fence` is complete (yielding the
    /// core, where the backend can, rather than spinning).
    fn wait(&self, fence: &Self::Fence) -> Result<(), LoaderError>;

    /// Frees `target` once `done` (the consumer's fence for its last use)
    /// and every copy queued before are complete. The ring calls it for
    /// every target it allocated, exactly once. The default waits for
    /// `done` on the host; a GPU backend queues the wait instead.
    fn retire(&self, target: Self::Target, done: Option<Self::Fence>) {
        if let Some(done) = done {
            // Nothing better to do on failure than free after the wait
            // that failed: the queue is broken either way.
            let _ = self.wait(&done);
        }
        drop(target);
    }

    /// Takes back a copy's fence once the consumer is done with its batch,
    /// so that [`Backend::copy`] can use it again instead of making a new
    /// one each step. Fences the backend keeps no pool of are dropped.
    fn recycle(&self, _fence: Self::Fence) {}

    /// The mapped dataset this backend gathers rows from itself, if it does:
    /// the producer then writes each row's address in that dataset's mapped
    /// shards into the staging buffer (8 bytes, little-endian, row after
    /// row) instead of the row, and [`Backend::copy`] reads the rows from
    /// there. `None` (the default): the producer gathers the rows.
    fn gathers(&self) -> Option<&Dataset> {
        None
    }

    /// Refuses a dataset this backend cannot deliver faithfully (a dtype it
    /// was not built for, ids its widening would change); `name` names the
    /// dataset in the error.
    fn check(&self, _name: &str, _manifest: &Manifest) -> Result<(), LoaderError> {
        Ok(())
    }
}

/// A target and the fences of its last uses. Whoever drops it (the ring,
/// a channel of a loader that is gone, a batch released too late) has the
/// backend free the target after `done`: a consumer reading through a raw
/// pointer is never left reading freed memory.
struct Held<B: Backend> {
    backend: Arc<B>,
    slot: usize,
    target: Option<B::Target>,
    /// The consumer's fence for its last work on the target.
    done: Option<B::Fence>,
    /// The fence of the copy that filled the target.
    ready: Option<B::Fence>,
}

impl<B: Backend> Drop for Held<B> {
    fn drop(&mut self) {
        if let Some(target) = self.target.take() {
            self.backend.retire(target, self.done.take());
        }
    }
}

/// Where a run is in its data: the epoch, and the sampler position within
/// it. A run that consumed a batch resumes at [`Batch::resume_at`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// The epoch.
    pub epoch: u64,
    /// The position within the epoch: for a mapped dataset the sampler
    /// position, rows this rank consumed; for a stream
    /// ([`Loader::from_stream`]) the global position, rows the whole job
    /// consumed.
    pub position: u64,
}

/// The order rows are read in: one rank's share of a seeded permutation,
/// a fresh permutation each epoch (see [`Sampler`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Order {
    /// The seed of every epoch's permutation.
    pub seed: u64,
    /// This rank.
    pub rank: u64,
    /// Ranks reading the dataset together (at least 1).
    pub world_size: u64,
}

impl Order {
    /// One rank reading everything, under `seed`.
    pub fn single(seed: u64) -> Order {
        Order {
            seed,
            rank: 0,
            world_size: 1,
        }
    }

    /// The sampler of `epoch` for a dataset of `n` records.
    pub fn sampler(&self, n: u64, epoch: u64) -> Sampler {
        Sampler::new(n, self.seed, epoch, self.rank, self.world_size)
    }
}

/// A batch ready for the consumer (or being copied into its target: see
/// [`Batch::ready`]).
pub struct Batch<B: Backend> {
    held: Option<Held<B>>,
    epoch: u64,
    position: u64,
    rows: usize,
    /// Positions a row of this rank advances: 1, or a stream's world size.
    stride: u64,
    row_tokens: usize,
    free: Sender<Held<B>>,
}

impl<B: Backend> Batch<B> {
    fn held(&self) -> &Held<B> {
        self.held.as_ref().expect("held until released")
    }

    /// The target buffer: `rows() * row_tokens()` tokens, row after row.
    pub fn target(&self) -> &B::Target {
        self.held().target.as_ref().expect("held until released")
    }

    /// The fence of the copy into the target: order work on the target after it.
    pub fn ready(&self) -> &B::Fence {
        self.held().ready.as_ref().expect("held until released")
    }

    /// The epoch the batch's rows belong to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The position of the batch's first row within its epoch (see
    /// [`Position::position`]).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Where a run resumes once this batch is consumed: its epoch, at
    /// `position() + rows()` (for a stream, `+ rows() × world_size`: every
    /// rank consumed as many). The end of an epoch resumes at the next.
    pub fn resume_at(&self) -> Position {
        Position {
            epoch: self.epoch,
            position: self.position + self.rows as u64 * self.stride,
        }
    }

    /// Rows in the batch: the batch size, or fewer for the last batch of an epoch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Tokens per row.
    pub fn row_tokens(&self) -> usize {
        self.row_tokens
    }

    /// The ring slot the batch occupies (for diagnostics).
    pub fn slot(&self) -> usize {
        self.held().slot
    }

    /// The backend the batch was copied by.
    pub fn backend(&self) -> &Arc<B> {
        &self.held().backend
    }

    /// Gives the target back for the next batches; the producer copies into
    /// it only after `done` (the fence of the consumer's last work on it)
    /// is complete, and if the loader is gone the target is freed only
    /// after it. `None` says that work is already complete.
    pub fn release(mut self, done: Option<B::Fence>) {
        self.give_back(done);
    }

    fn give_back(&mut self, done: Option<B::Fence>) {
        if let Some(mut held) = self.held.take() {
            held.done = done;
            // If the producer has stopped, the send fails and drops `held`,
            // which retires the target after `done`.
            let _ = self.free.send(held);
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

/// What the producer sends: a batch, or an error.
enum Message<B: Backend> {
    Batch {
        held: Held<B>,
        epoch: u64,
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
    /// The order of the rows: seed, rank, world size.
    pub order: Order,
    /// Where to start: epoch and position (a resumed run's; see
    /// [`Position::position`]).
    pub start: Position,
    /// The epoch to stop before; `None` runs epoch after epoch until the
    /// loader is dropped.
    pub end_epoch: Option<u64>,
    /// Threads that gather rows into staging buffers (0: one per core).
    /// The gather is a random read of the page cache at a few GB/s per
    /// thread, while a PCIe 5 copy runs at tens: feeding a GPU at full
    /// speed takes several.
    pub threads: usize,
}

impl LoaderConfig {
    /// Batches of `batch_rows` rows, `depth` ahead, one rank in the order
    /// of `seed`, epoch 0 only, from its start, one gather thread per core.
    pub fn new(batch_rows: usize, depth: usize, seed: u64) -> LoaderConfig {
        LoaderConfig {
            batch_rows,
            depth,
            order: Order::single(seed),
            start: Position::default(),
            end_epoch: Some(1),
            threads: 0,
        }
    }
}

/// Delivers the batches of one rank, epoch after epoch, in sampler order,
/// from a background thread. Dropping it stops the thread; batches the
/// consumer still holds stay valid until released.
pub struct Loader<B: Backend> {
    ready: Receiver<Message<B>>,
    free: Option<Sender<Held<B>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    row_tokens: usize,
    /// Positions a row of this rank advances ([`Position::position`]).
    stride: u64,
    finished: bool,
}

impl<B: Backend> Loader<B> {
    /// Starts the producer over a mapped dataset, read in the order of
    /// `config.order` (a [`Sampler`] per epoch): `depth` staging and target
    /// buffers of `batch_rows` rows each are allocated now, once, for every
    /// epoch.
    ///
    /// The dataset's records must all be one length (a packed dataset, or
    /// any dataset of equal records), and the rank must read at least one
    /// row per epoch.
    pub fn new(
        dataset: Arc<Dataset>,
        backend: Arc<B>,
        config: LoaderConfig,
    ) -> Result<Loader<B>, LoaderError> {
        let row_tokens = row_length(&dataset)?;
        let name = dataset.dir().display().to_string();
        check_backend(&name, &dataset, &*backend)?;
        check_order(&config.order)?;
        let rows = config.order.sampler(dataset.len(), 0).len();
        check_rows(&name, dataset.len(), rows, &config.order)?;
        Loader::start(Rows::Mapped(dataset), row_tokens, backend, config)
    }

    /// Starts the producer over a packed dataset streamed from storage,
    /// read in the stream's own order (its seed; `config.order.seed` is not
    /// used): this rank's share of each epoch, as a [`StreamReader`] of
    /// `Share::rank(rank, world_size)` reads it. A [`Position`] here is the
    /// stream's global position, as a [`crate::stream::StreamState`]
    /// records it (rows the whole job consumed, every rank alike): a run
    /// starts from a state's position taken on any world size, and a
    /// batch's [`Batch::resume_at`] is a state's position again. Buffers as
    /// [`Loader::new`].
    pub fn from_stream(
        stream: Arc<Stream>,
        backend: Arc<B>,
        config: LoaderConfig,
    ) -> Result<Loader<B>, LoaderError> {
        let manifest = stream.manifest();
        let row_tokens = manifest.seq_len.ok_or_else(|| {
            LoaderError::Usage(format!("{}: not a packed dataset", stream.location()))
        })? as usize;
        backend.check(stream.location(), manifest)?;
        if backend.gathers().is_some() {
            return Err(LoaderError::Usage(format!(
                "{}: a streamed dataset is gathered on the host; a backend that gathers rows itself reads a mapped one",
                stream.location()
            )));
        }
        check_order(&config.order)?;
        let rows = stream.len() / config.order.world_size;
        check_rows(stream.location(), stream.len(), rows, &config.order)?;
        Loader::start(Rows::Stream(stream), row_tokens, backend, config)
    }

    /// Starts the producer over a mapped dataset read in `stream`'s order
    /// (the stream of the same dataset, opened for its order: no row is
    /// read through it), so a run reads the rows a [`Loader::from_stream`]
    /// of the same stream reads, in the same order and from the same
    /// positions, with the rows read in place (and gathered by any
    /// backend, [`Backend::gathers`] included). Positions are global, as
    /// for [`Loader::from_stream`].
    pub fn with_stream_order(
        dataset: Arc<Dataset>,
        stream: Arc<Stream>,
        backend: Arc<B>,
        config: LoaderConfig,
    ) -> Result<Loader<B>, LoaderError> {
        let row_tokens = row_length(&dataset)?;
        let name = dataset.dir().display().to_string();
        if dataset.len() != stream.len() || dataset.manifest().seq_len != stream.manifest().seq_len
        {
            return Err(LoaderError::Usage(format!(
                "{name}: the order is of {} ({} rows), another dataset",
                stream.location(),
                stream.len()
            )));
        }
        check_backend(&name, &dataset, &*backend)?;
        check_order(&config.order)?;
        let rows = stream.len() / config.order.world_size;
        check_rows(&name, stream.len(), rows, &config.order)?;
        Loader::start(Rows::Ordered(dataset, stream), row_tokens, backend, config)
    }

    fn start(
        rows: Rows,
        row_tokens: usize,
        backend: Arc<B>,
        config: LoaderConfig,
    ) -> Result<Loader<B>, LoaderError> {
        let depth = config.depth.max(1);
        let batch_rows = config.batch_rows.max(1);
        let row_bytes = row_tokens
            .checked_mul(rows.dtype().size())
            .ok_or_else(|| LoaderError::Usage(format!("rows of {row_tokens} tokens")))?;
        let bytes = batch_rows.checked_mul(row_bytes).ok_or_else(|| {
            LoaderError::Usage(format!(
                "a batch of {batch_rows} rows of {row_bytes} bytes does not fit in memory"
            ))
        })?;
        let mut staging = Vec::with_capacity(depth);
        let mut staged = Vec::with_capacity(depth);
        let (free_tx, free_rx) = mpsc::channel();
        for slot in 0..depth {
            staging.push(backend.alloc_staging(bytes)?);
            staged.push(backend.fence()?);
            free_tx
                .send(Held {
                    backend: backend.clone(),
                    slot,
                    target: Some(backend.alloc_target(bytes)?),
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
        let stride = rows.stride(&config.order);
        let producer = Producer {
            pool,
            indices: vec![0; batch_rows],
            row_bytes,
            rows,
            backend,
            staging,
            staged,
            free: free_rx,
            ready: ready_tx,
            stop: stop.clone(),
            batch_rows,
            order: config.order,
            start: config.start,
            end_epoch: config.end_epoch,
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
            stride,
            finished: false,
        })
    }

    /// Tokens per row.
    pub fn row_tokens(&self) -> usize {
        self.row_tokens
    }

    /// The next batch: epoch after epoch, each in sampler order; `None`
    /// once the end epoch is reached. Waits while the producer has none
    /// ready. After an error, every later call returns `None`.
    pub fn next_batch(&mut self) -> Result<Option<Batch<B>>, LoaderError> {
        if self.finished {
            return Ok(None);
        }
        match self.ready.recv() {
            Ok(Message::Batch {
                held,
                epoch,
                position,
                rows,
            }) => Ok(Some(Batch {
                held: Some(held),
                epoch,
                position,
                rows,
                stride: self.stride,
                row_tokens: self.row_tokens,
                free: self.free.clone().expect("alive until dropped"),
            })),
            Ok(Message::Failed(e)) => {
                self.finished = true;
                Err(e)
            }
            Err(_) => {
                // The producer is gone: the end epoch, or a panic.
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
    /// Stops the producer. Targets waiting in the ring are retired after
    /// the consumer's fences on them; those the consumer still holds are
    /// retired when released.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.free.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `backend` takes `dataset` (its ids' type), and gathers from it if it
/// gathers rows itself.
fn check_backend<B: Backend>(
    name: &str,
    dataset: &Dataset,
    backend: &B,
) -> Result<(), LoaderError> {
    backend.check(name, dataset.manifest())?;
    if backend.gathers().is_some_and(|g| !std::ptr::eq(g, dataset)) {
        return Err(LoaderError::Usage(format!(
            "{name}: the backend gathers rows from another dataset"
        )));
    }
    Ok(())
}

/// The length of every record, which the loader needs to be one.
fn row_length(ds: &Dataset) -> Result<usize, LoaderError> {
    // Batches are tokens alone: a dataset whose masks say which to train
    // on is refused rather than trained on whole.
    ds.manifest()
        .refuse_loss_mask(ds.dir(), "the batch loader")?;
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

/// Refuses a rank outside its world.
fn check_order(order: &Order) -> Result<(), LoaderError> {
    let Order {
        rank, world_size, ..
    } = *order;
    if world_size == 0 || rank >= world_size {
        return Err(LoaderError::Usage(format!(
            "rank {rank} of a world of {world_size}: the rank must be below the world size"
        )));
    }
    Ok(())
}

/// Refuses a rank that would read no row in an epoch.
fn check_rows(name: &str, records: u64, rows: u64, order: &Order) -> Result<(), LoaderError> {
    if rows == 0 {
        return Err(LoaderError::Usage(format!(
            "{name}: {records} records for {} ranks leave rank {} no row to read",
            order.world_size, order.rank
        )));
    }
    Ok(())
}

/// Where the loader's rows come from (see the [module docs](self)).
enum Rows {
    Mapped(Arc<Dataset>),
    Stream(Arc<Stream>),
    /// A mapped dataset in a stream's order: the stream gives the order
    /// alone, the rows are read in place.
    Ordered(Arc<Dataset>, Arc<Stream>),
}

impl Rows {
    fn dtype(&self) -> Dtype {
        match self {
            Rows::Mapped(ds) | Rows::Ordered(ds, _) => ds.dtype(),
            Rows::Stream(stream) => stream.manifest().dtype,
        }
    }

    /// Positions one row of a rank advances ([`Position::position`]).
    fn stride(&self, order: &Order) -> u64 {
        match self {
            Rows::Mapped(_) => 1,
            Rows::Stream(_) | Rows::Ordered(..) => order.world_size,
        }
    }

    /// The rows of `epoch` for the rank of `order`, from its `position`.
    fn epoch(&self, order: &Order, epoch: u64, position: u64) -> Result<EpochRows, LoaderError> {
        Ok(match self {
            Rows::Mapped(ds) => EpochRows::Mapped(order.sampler(ds.len(), epoch)),
            Rows::Stream(stream) => {
                let start = position.min(stream.len());
                let share = Share::rank(order.rank, order.world_size);
                EpochRows::Stream(stream.reader(epoch, start, share).map_err(Box::new)?)
            }
            Rows::Ordered(_, stream) => {
                let start = position.min(stream.len());
                let each = (stream.len() - start) / order.world_size;
                EpochRows::Ordered {
                    order: stream.order(epoch).map_err(Box::new)?,
                    rank: order.rank,
                    world: order.world_size,
                    end: start + each * order.world_size,
                }
            }
        })
    }
}

/// One epoch's rows for one rank.
enum EpochRows {
    /// Sampler positions, each a record of the mapped dataset.
    Mapped(Sampler),
    /// The stream's rows from the position the epoch starts at, in order.
    Stream(StreamReader),
    /// A stream's order over a mapped dataset: rank `rank` of `world`
    /// reads global positions `g + rank`, `g` from the epoch's start by
    /// `world`, up to `end`.
    Ordered {
        order: BlockOrder,
        rank: u64,
        world: u64,
        end: u64,
    },
}

impl EpochRows {
    /// The position after the epoch's last row, for an epoch entered at
    /// `position`, with rows `stride` positions apart.
    fn end(&self, position: u64, stride: u64) -> u64 {
        match self {
            EpochRows::Mapped(sampler) => sampler.len(),
            EpochRows::Stream(reader) => position + reader.len() * stride,
            EpochRows::Ordered { end, .. } => *end,
        }
    }
}

/// The producer thread's state.
struct Producer<B: Backend> {
    /// Gather threads, when more than one.
    pool: Option<rayon::ThreadPool>,
    /// The current batch's record indices (allocated once).
    indices: Vec<u64>,
    row_bytes: usize,
    rows: Rows,
    backend: Arc<B>,
    staging: Vec<B::Staging>,
    /// Per staging buffer: complete once the last copy out of it has read it.
    staged: Vec<B::Fence>,
    free: Receiver<Held<B>>,
    ready: Sender<Message<B>>,
    stop: Arc<AtomicBool>,
    batch_rows: usize,
    order: Order,
    start: Position,
    end_epoch: Option<u64>,
}

/// Bytes of a row's address in a staging buffer, for a backend that
/// gathers rows itself ([`Backend::gathers`]).
pub const ADDRESS: usize = 8;

/// The least a gather task copies (see [`Producer::gather`]).
const GATHER_TASK: usize = 256 << 10;

/// How often a waiting producer looks at the stop flag.
const POLL: Duration = Duration::from_millis(20);

impl<B: Backend> Producer<B> {
    fn run(mut self) {
        if let Err(e) = self.produce() {
            let _ = self.ready.send(Message::Failed(e));
        }
        // The staging buffers are freed when `self` drops: not while a copy
        // still reads them.
        for fence in &self.staged {
            let _ = self.backend.wait(fence);
        }
    }

    fn produce(&mut self) -> Result<(), LoaderError> {
        let Position {
            mut epoch,
            mut position,
        } = self.start;
        let mut k = 0usize;
        let stride = self.rows.stride(&self.order);
        while !matches!(self.end_epoch, Some(end) if epoch >= end) {
            let mut source = self.rows.epoch(&self.order, epoch, position)?;
            let end = source.end(position, stride);
            while position < end {
                let rows = ((end - position) / stride).min(self.batch_rows as u64) as usize;
                let s = k % self.staging.len();
                let bytes = self.gather(&mut source, s, position, rows)?;
                let Some(mut held) = self.take_free()? else {
                    return Ok(()); // stopped
                };
                if let Some(spent) = held.ready.take() {
                    self.backend.recycle(spent);
                }
                let target = held.target.as_mut().expect("a free slot holds its target");
                let ready = self.backend.copy(
                    &mut self.staging[s],
                    target,
                    bytes,
                    held.done.take(),
                    &mut self.staged[s],
                )?;
                held.ready = Some(ready);
                let sent = self.ready.send(Message::Batch {
                    held,
                    epoch,
                    position,
                    rows,
                });
                if sent.is_err() {
                    return Ok(()); // the consumer is gone
                }
                position += rows as u64 * stride;
                k += 1;
            }
            epoch += 1;
            position = 0;
        }
        Ok(())
    }

    /// Copies the rows at positions `position..position + rows` into
    /// staging buffer `s`, once the last copy out of it has read it;
    /// returns the bytes written.
    fn gather(
        &mut self,
        source: &mut EpochRows,
        s: usize,
        position: u64,
        rows: usize,
    ) -> Result<usize, LoaderError> {
        let bytes = rows * self.row_bytes;
        match source {
            EpochRows::Mapped(sampler) => {
                for (k, slot) in self.indices[..rows].iter_mut().enumerate() {
                    *slot = sampler
                        .get(position + k as u64)
                        .expect("positions below len()");
                }
            }
            EpochRows::Ordered {
                order, rank, world, ..
            } => {
                for (k, slot) in self.indices[..rows].iter_mut().enumerate() {
                    *slot = order.get(position + *rank + k as u64 * *world);
                }
            }
            EpochRows::Stream(reader) => {
                // The stream's fetch threads read ahead; the copy out of
                // its mapped blocks is one memcpy a row.
                self.backend.wait(&self.staged[s])?;
                let buffer = self.backend.staging_mut(&mut self.staging[s])?;
                for slot in buffer[..bytes].chunks_mut(self.row_bytes) {
                    let row = reader
                        .next()
                        .expect("the epoch's end counts the reader's rows")
                        .map_err(Box::new)?;
                    slot.copy_from_slice(row.bytes());
                }
                return Ok(bytes);
            }
        }
        // The staging reuse rule: whatever the backend tracks itself.
        self.backend.wait(&self.staged[s])?;
        let buffer = self.backend.staging_mut(&mut self.staging[s])?;
        let (Rows::Mapped(ds) | Rows::Ordered(ds, _)) = &self.rows else {
            unreachable!("indices are of a mapped dataset")
        };
        // A row: the record at `index`, which must be a row's length.
        let row_bytes = self.row_bytes;
        let row = |index: u64| -> Result<&[u8], LoaderError> {
            let record = ds.record_bytes(index)?;
            if record.len() != row_bytes {
                return Err(LoaderError::Usage(format!(
                    "record {index} is {} bytes, not the {row_bytes} of a row",
                    record.len()
                )));
            }
            Ok(record)
        };
        let indices = &self.indices[..rows];
        if self.backend.gathers().is_some() {
            // The backend copies the rows itself: each row's address.
            let addresses = buffer[..rows * ADDRESS].chunks_exact_mut(ADDRESS);
            for (slot, &index) in addresses.zip(indices) {
                slot.copy_from_slice(&(row(index)?.as_ptr() as u64).to_le_bytes());
            }
            return Ok(rows * ADDRESS);
        }
        let copy = |(slot, &index): (&mut [u8], &u64)| -> Result<(), LoaderError> {
            slot.copy_from_slice(row(index)?);
            Ok(())
        };
        // Each gather task copies at least GATHER_TASK bytes: a small batch
        // is gathered by the producer alone, as waking the pool costs more
        // than the copy.
        let task_rows = GATHER_TASK.div_ceil(row_bytes).max(1);
        match self.pool.as_ref().filter(|_| rows > task_rows) {
            None => buffer[..bytes]
                .chunks_mut(row_bytes)
                .zip(indices)
                .try_for_each(copy)?,
            Some(pool) => pool.install(|| {
                use rayon::prelude::*;
                buffer[..bytes]
                    .par_chunks_mut(row_bytes)
                    .zip(indices.par_iter())
                    .with_min_len(task_rows)
                    .try_for_each(copy)
            })?,
        }
        Ok(bytes)
    }

    /// A free target, waiting for one while the consumer holds them all;
    /// `None` once the loader is dropped.
    fn take_free(&self) -> Result<Option<Held<B>>, LoaderError> {
        loop {
            if self.stop.load(Ordering::Acquire) {
                return Ok(None);
            }
            match self.free.recv_timeout(POLL) {
                Ok(held) => return Ok(Some(held)),
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

    fn fence(&self) -> Result<Done, LoaderError> {
        Ok(Done)
    }

    fn staging_mut<'a>(&self, staging: &'a mut Vec<u8>) -> Result<&'a mut [u8], LoaderError> {
        Ok(staging)
    }

    fn copy(
        &self,
        staging: &mut Vec<u8>,
        target: &mut Vec<u8>,
        bytes: usize,
        _after: Option<Done>,
        _staged: &mut Done,
    ) -> Result<Done, LoaderError> {
        target[..bytes].copy_from_slice(&staging[..bytes]);
        Ok(Done)
    }

    fn wait(&self, _: &Done) -> Result<(), LoaderError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u32_to_i32_widening_is_refused_when_ids_can_reach_2_pow_31() {
        assert!(check_widen(Dtype::U32, Widen::I32, (1 << 31) + 1).is_err());
        assert!(check_widen(Dtype::U32, Widen::I32, 1 << 32).is_err());
        // Every id below 2^31 fits: allowed, as is every other widening.
        assert!(check_widen(Dtype::U32, Widen::I32, 1 << 31).is_ok());
        assert!(check_widen(Dtype::U32, Widen::I64, 1 << 32).is_ok());
        assert!(check_widen(Dtype::U32, Widen::None, 1 << 32).is_ok());
        assert!(check_widen(Dtype::U16, Widen::I32, 1 << 32).is_ok());
    }

    #[test]
    fn gather_parses_its_three_names_and_refuses_others() {
        assert_eq!("host".parse::<Gather>().unwrap(), Gather::Host);
        assert_eq!("device".parse::<Gather>().unwrap(), Gather::Device);
        assert_eq!("dma".parse::<Gather>().unwrap(), Gather::Dma);
        let err = "gpu".parse::<Gather>().unwrap_err().to_string();
        assert!(err.contains("host, device or dma"), "{err}");
    }

    #[test]
    fn widen_parses_its_three_names_and_refuses_others() {
        assert_eq!("none".parse::<Widen>().unwrap(), Widen::None);
        assert_eq!("i32".parse::<Widen>().unwrap(), Widen::I32);
        assert_eq!("i64".parse::<Widen>().unwrap(), Widen::I64);
        assert!("int64".parse::<Widen>().is_err());
        assert_eq!(Widen::None.bytes(Dtype::U16), 2);
        assert_eq!(Widen::I64.bytes(Dtype::U16), 8);
    }
}
