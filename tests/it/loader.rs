//! The loader's ring, tested without a GPU: batches arrive in sampler order
//! with the right rows, epoch after epoch, from one set of buffers; a run
//! resumes at (epoch, position); a copy into a target never starts before
//! the consumer's work on it is done; a staging buffer is never refilled
//! while a copy out of it runs, though the backend tracks nothing itself;
//! no target is freed before the consumer's fence on it, even when the
//! loader is dropped first; at most `depth` batches are ahead; errors and
//! drops mid-epoch end cleanly; a backend that reads rows itself (as the
//! GPU's gathers do) is handed each row's address. The asynchronous test backend below copies
//! and frees on a thread of its own, like a GPU stream, with random delays.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::common::*;
use prep::format::{Dataset, Dtype};
use prep::loader::{
    Backend, Batch, Done, HostBackend, Loader, LoaderConfig, LoaderError, Order, Position,
};
use prep::sampler::Sampler;

const ROW: usize = 16;

/// `n` rows of 16 tokens; row `i` holds `i * 16 + j` (mod 65536).
fn rows_dataset(t: &TestDir, n: usize) -> Arc<Dataset> {
    let rows: Vec<Vec<u32>> = (0..n)
        .map(|i| (0..ROW).map(|j| ((i * ROW + j) % 65536) as u32).collect())
        .collect();
    write_dataset(t.dir.path(), Dtype::U16, 1000, &rows);
    Arc::new(Dataset::open(t.dir.path()).unwrap())
}

fn expected_row(ds: &Dataset, index: u64) -> Vec<u8> {
    ds.record(index).unwrap().as_bytes().to_vec()
}

/// One epoch (`epoch`) of `order`, from `position`.
fn config(
    batch_rows: usize,
    depth: usize,
    order: Order,
    epoch: u64,
    position: u64,
) -> LoaderConfig {
    LoaderConfig {
        batch_rows,
        depth,
        order,
        start: Position { epoch, position },
        end_epoch: Some(epoch + 1),
        threads: depth % 2 + 1,
    }
}

#[test]
fn host_batches_arrive_in_sampler_order_with_their_rows() {
    let t = TestDir::new();
    let ds = rows_dataset(&t, 103);
    for (batch_rows, depth, start) in [(8usize, 1usize, 0u64), (8, 3, 0), (7, 2, 40), (200, 2, 0)] {
        let order = Order::single(4);
        let sampler = order.sampler(ds.len(), 1);
        let mut loader = Loader::new(
            ds.clone(),
            Arc::new(HostBackend),
            config(batch_rows, depth, order, 1, start),
        )
        .unwrap();
        let mut position = start;
        while let Some(batch) = loader.next_batch().unwrap() {
            assert_eq!((batch.epoch(), batch.position()), (1, position));
            assert_eq!(batch.row_tokens(), ROW);
            let bytes = ROW * 2;
            for r in 0..batch.rows() {
                let index = sampler.get(position + r as u64).unwrap();
                assert_eq!(
                    &batch.target()[r * bytes..(r + 1) * bytes],
                    expected_row(&ds, index).as_slice()
                );
            }
            position += batch.rows() as u64;
            batch.release(None);
        }
        assert_eq!(position, ds.len(), "every row from the start on");
        assert!(loader.next_batch().unwrap().is_none(), "and then nothing");
    }
}

#[test]
fn records_of_different_lengths_are_refused() {
    let t = TestDir::new();
    write_dataset(t.dir.path(), Dtype::U16, 1000, &[vec![1, 2], vec![3]]);
    let ds = Arc::new(Dataset::open(t.dir.path()).unwrap());
    let err = Loader::new(
        ds,
        Arc::new(HostBackend),
        config(1, 1, Order::single(0), 0, 0),
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("differ in length"), "{err}");
}

/// Reads the rows itself, as a GPU backend that registers the dataset does
/// (a kernel or the copy engines): the producer hands it each row's
/// address, which it finds in one of the shards' mappings and copies from.
/// The producer's address path, on a machine without a GPU.
struct AddressBackend {
    dataset: Arc<Dataset>,
    row_bytes: usize,
}

impl Backend for AddressBackend {
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
        assert_eq!(bytes % 8, 0, "whole addresses");
        let ds = &self.dataset;
        for (k, address) in staging[..bytes].chunks_exact(8).enumerate() {
            let at = u64::from_le_bytes(address.try_into().unwrap()) as usize;
            let row = (0..ds.n_shards())
                .map(|s| ds.shard_bin(s))
                .find_map(|bin| {
                    let start = bin.as_ptr() as usize;
                    let offset = at.checked_sub(start)?;
                    bin.get(offset..offset + self.row_bytes)
                })
                .ok_or_else(|| LoaderError::Backend(format!("{at:#x} is in no shard")))?;
            target[k * self.row_bytes..(k + 1) * self.row_bytes].copy_from_slice(row);
        }
        Ok(Done)
    }

    fn wait(&self, _: &Done) -> Result<(), LoaderError> {
        Ok(())
    }

    fn gathers(&self) -> Option<&Dataset> {
        Some(&self.dataset)
    }
}

#[test]
fn a_backend_that_reads_rows_itself_gets_each_rows_address_in_sampler_order() {
    let t = TestDir::new();
    let ds = rows_dataset(&t, 103);
    assert!(ds.n_shards() > 2, "rows from several shards");
    let backend = Arc::new(AddressBackend {
        dataset: ds.clone(),
        row_bytes: ROW * 2,
    });
    let order = Order::single(9);
    let mut config = config(7, 2, order, 0, 0);
    config.end_epoch = Some(2);
    let mut loader = Loader::new(ds.clone(), backend, config).unwrap();
    let mut seen = [0u64; 2];
    while let Some(batch) = loader.next_batch().unwrap() {
        let sampler = order.sampler(ds.len(), batch.epoch());
        let bytes = ROW * 2;
        for r in 0..batch.rows() {
            let index = sampler.get(batch.position() + r as u64).unwrap();
            assert_eq!(
                &batch.target()[r * bytes..(r + 1) * bytes],
                expected_row(&ds, index).as_slice(),
                "epoch {}, row {} of the batch at {}",
                batch.epoch(),
                r,
                batch.position()
            );
        }
        seen[batch.epoch() as usize] += batch.rows() as u64;
        batch.release(None);
    }
    assert_eq!(seen, [ds.len(); 2], "every row of both epochs");
}

/// A completion flag: the fence of the test backend.
#[derive(Default)]
struct Flag {
    done: Mutex<bool>,
    changed: Condvar,
}

impl Flag {
    fn complete(&self) {
        *self.done.lock().unwrap() = true;
        self.changed.notify_all();
    }

    fn wait(&self) {
        let mut done = self.done.lock().unwrap();
        while !*done {
            done = self.changed.wait(done).unwrap();
        }
    }
}

type Fence = Arc<Flag>;

/// What the test backend saw that breaks a rule of the ring.
#[derive(Default)]
struct Counters {
    /// A copy into a target the consumer's work was still reading.
    target_overwritten: AtomicUsize,
    /// A staging buffer handed out for writing while a copy read it.
    staging_overwritten: AtomicUsize,
    /// A target freed while the consumer's work was still reading it.
    freed_in_use: AtomicUsize,
    /// Targets freed.
    freed: AtomicUsize,
    /// Targets allocated.
    allocated: AtomicUsize,
}

struct Staging {
    bytes: Arc<Mutex<Vec<u8>>>,
    /// Set while a queued copy has yet to read the buffer.
    in_flight: Arc<AtomicBool>,
}

struct Target {
    bytes: Arc<Mutex<Vec<u8>>>,
    /// Set while the simulated consumer's work reads the target.
    in_use: Arc<AtomicBool>,
    counters: Arc<Counters>,
}

impl Drop for Target {
    /// Freeing the memory: the consumer's work must be done with it.
    fn drop(&mut self) {
        if self.in_use.load(Ordering::SeqCst) {
            self.counters.freed_in_use.fetch_add(1, Ordering::SeqCst);
        }
        self.counters.freed.fetch_add(1, Ordering::SeqCst);
    }
}

/// Copies and frees on a worker thread in queue order, like a GPU stream,
/// each copy after a random delay, checking the rules of the ring as it
/// goes. Like a GPU backend with cudarc's event tracking off, it does no
/// waiting of its own: the ring must.
struct AsyncBackend {
    queue: Mutex<Sender<Box<dyn FnOnce() + Send>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    copies: AtomicUsize,
    recycled: AtomicUsize,
    fail_at: Option<usize>,
    /// Copies take up to this long.
    max_delay_us: u64,
    counters: Arc<Counters>,
}

impl AsyncBackend {
    fn new(fail_at: Option<usize>) -> AsyncBackend {
        AsyncBackend::with_delay(fail_at, 400)
    }

    fn with_delay(fail_at: Option<usize>, max_delay_us: u64) -> AsyncBackend {
        let (tx, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let worker = std::thread::spawn(move || {
            for job in rx {
                job();
            }
        });
        AsyncBackend {
            queue: Mutex::new(tx),
            worker: Mutex::new(Some(worker)),
            copies: AtomicUsize::new(0),
            recycled: AtomicUsize::new(0),
            fail_at,
            max_delay_us,
            counters: Arc::default(),
        }
    }

    fn enqueue(&self, job: impl FnOnce() + Send + 'static) {
        self.queue.lock().unwrap().send(Box::new(job)).unwrap();
    }

    fn count(&self, which: fn(&Counters) -> &AtomicUsize) -> usize {
        which(&self.counters).load(Ordering::SeqCst)
    }
}

impl Drop for AsyncBackend {
    /// Runs what is queued (the frees among it), then stops the worker.
    fn drop(&mut self) {
        let (tx, _) = mpsc::channel();
        *self.queue.lock().unwrap() = tx;
        if let Some(w) = self.worker.lock().unwrap().take() {
            w.join().unwrap();
        }
    }
}

impl Backend for AsyncBackend {
    type Staging = Staging;
    type Target = Target;
    type Fence = Fence;

    fn alloc_staging(&self, bytes: usize) -> Result<Staging, LoaderError> {
        Ok(Staging {
            bytes: Arc::new(Mutex::new(vec![0; bytes])),
            in_flight: Arc::default(),
        })
    }

    fn alloc_target(&self, bytes: usize) -> Result<Target, LoaderError> {
        self.counters.allocated.fetch_add(1, Ordering::SeqCst);
        Ok(Target {
            bytes: Arc::new(Mutex::new(vec![0; bytes])),
            in_use: Arc::default(),
            counters: self.counters.clone(),
        })
    }

    fn fence(&self) -> Result<Fence, LoaderError> {
        let fence = Fence::default();
        fence.complete();
        Ok(fence)
    }

    fn staging_mut<'a>(&self, staging: &'a mut Staging) -> Result<&'a mut [u8], LoaderError> {
        if staging.in_flight.load(Ordering::SeqCst) {
            self.counters
                .staging_overwritten
                .fetch_add(1, Ordering::SeqCst);
            // Counted; now wait, so the test itself stays memory-safe.
            while Arc::strong_count(&staging.bytes) > 1 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        let bytes = Arc::get_mut(&mut staging.bytes)
            .expect("no copy holds the staging buffer once it has read it")
            .get_mut()
            .unwrap();
        Ok(bytes.as_mut_slice())
    }

    fn copy(
        &self,
        staging: &mut Staging,
        target: &mut Target,
        bytes: usize,
        after: Option<Fence>,
        staged: &mut Fence,
    ) -> Result<Fence, LoaderError> {
        let n = self.copies.fetch_add(1, Ordering::SeqCst);
        if Some(n) == self.fail_at {
            return Err(LoaderError::Backend(format!(
                "injected failure at copy {n}"
            )));
        }
        let (read, ready): (Fence, Fence) = (Arc::default(), Arc::default());
        *staged = read.clone();
        let (src, dst, in_use) = (
            staging.bytes.clone(),
            target.bytes.clone(),
            target.in_use.clone(),
        );
        let in_flight = staging.in_flight.clone();
        in_flight.store(true, Ordering::SeqCst);
        let (done, counters) = (ready.clone(), self.counters.clone());
        let delay = Duration::from_micros((n as u64 * 7919) % self.max_delay_us.max(1));
        self.enqueue(move || {
            if let Some(after) = after {
                after.wait(); // the stream waits for the consumer
            }
            if in_use.load(Ordering::SeqCst) {
                counters.target_overwritten.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(delay);
            dst.lock().unwrap()[..bytes].copy_from_slice(&src.lock().unwrap()[..bytes]);
            drop(src); // the staging buffer is free again
            in_flight.store(false, Ordering::SeqCst);
            read.complete();
            done.complete();
        });
        Ok(ready)
    }

    fn wait(&self, fence: &Fence) -> Result<(), LoaderError> {
        fence.wait();
        Ok(())
    }

    fn retire(&self, target: Target, done: Option<Fence>) {
        self.enqueue(move || {
            if let Some(done) = done {
                done.wait(); // the stream waits for the consumer
            }
            drop(target);
        });
    }

    fn recycle(&self, fence: Fence) {
        assert!(
            Arc::strong_count(&fence) <= 2,
            "a fence comes back only once its batch is released"
        );
        self.recycled.fetch_add(1, Ordering::SeqCst);
    }
}

/// Starts work "on the device" that reads the batch's target for `work`,
/// and returns the fence of that work.
fn start_work(batch: &Batch<AsyncBackend>, work: Duration) -> Fence {
    let in_use = batch.target().in_use.clone();
    in_use.store(true, Ordering::SeqCst);
    let done: Fence = Arc::default();
    let finished = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(work);
        in_use.store(false, Ordering::SeqCst);
        finished.complete();
    });
    done
}

/// Checks that the batch's target holds the rows the sampler of its epoch
/// names at its positions.
fn check_rows(batch: &Batch<AsyncBackend>, ds: &Dataset, sampler: &Sampler) {
    let bytes = batch.target().bytes.lock().unwrap();
    for r in 0..batch.rows() {
        let index = sampler.get(batch.position() + r as u64).unwrap();
        assert_eq!(
            &bytes[r * ROW * 2..(r + 1) * ROW * 2],
            expected_row(ds, index).as_slice()
        );
    }
}

/// Consumes like a training loop on a GPU: waits for each batch, checks
/// its rows, then "computes" on it asynchronously for `work` and releases
/// it with the fence of that work. Returns the (epoch, position) seen.
fn consume(
    loader: &mut Loader<AsyncBackend>,
    ds: &Dataset,
    order: Order,
    depth: usize,
    work: Duration,
    copies: &AtomicUsize,
) -> Result<Vec<(u64, u64)>, LoaderError> {
    let mut seen = Vec::new();
    let mut consumed = 0usize;
    while let Some(batch) = loader.next_batch()? {
        batch.ready().wait();
        consumed += 1;
        assert!(
            copies.load(Ordering::SeqCst) <= consumed + depth,
            "more than depth batches ahead"
        );
        check_rows(&batch, ds, &order.sampler(ds.len(), batch.epoch()));
        seen.push((batch.epoch(), batch.position()));
        let done = start_work(&batch, work);
        batch.release(Some(done));
    }
    Ok(seen)
}

fn async_config(batch_rows: usize, depth: usize, order: Order) -> LoaderConfig {
    config(batch_rows, depth, order, 0, 0)
}

#[test]
fn async_copies_respect_the_ring_with_slow_and_fast_consumers() {
    let t = TestDir::new();
    let ds = rows_dataset(&t, 257);
    let order = Order {
        seed: 9,
        rank: 1,
        world_size: 2,
    };
    for depth in [1usize, 2, 4] {
        for work in [
            Duration::ZERO,
            Duration::from_micros(300),
            Duration::from_millis(2),
        ] {
            let backend = Arc::new(AsyncBackend::new(None));
            let mut loader =
                Loader::new(ds.clone(), backend.clone(), async_config(5, depth, order)).unwrap();
            let seen = consume(&mut loader, &ds, order, depth, work, &backend.copies).unwrap();
            let len = order.sampler(ds.len(), 0).len();
            let expected: Vec<(u64, u64)> = (0..len).step_by(5).map(|p| (0, p)).collect();
            assert_eq!(seen, expected, "depth {depth}, work {work:?}");
            assert_eq!(
                backend.count(|c| &c.target_overwritten),
                0,
                "a copy overwrote a target the consumer was using"
            );
            // Every fence but those of the last batch in each slot comes back.
            let recycled = backend.recycled.load(Ordering::SeqCst);
            assert!(
                recycled + depth >= seen.len(),
                "{recycled} fences recycled of {}",
                seen.len()
            );
        }
    }
}

#[test]
fn staging_is_not_refilled_while_its_copy_runs_though_the_backend_tracks_nothing() {
    // The backend hands out a staging buffer without waiting (as cudarc's
    // pinned slices do once event tracking is off): the ring alone must
    // wait for the copy out of it. Slow copies, a fast gather.
    let t = TestDir::new();
    let ds = rows_dataset(&t, 300);
    let order = Order::single(3);
    for depth in [1usize, 2, 3] {
        let backend = Arc::new(AsyncBackend::with_delay(None, 3000));
        let mut loader =
            Loader::new(ds.clone(), backend.clone(), async_config(7, depth, order)).unwrap();
        let seen = consume(
            &mut loader,
            &ds,
            order,
            depth,
            Duration::ZERO,
            &backend.copies,
        )
        .unwrap();
        assert_eq!(seen.len(), 300usize.div_ceil(7));
        assert_eq!(
            backend.count(|c| &c.staging_overwritten),
            0,
            "depth {depth}: a staging buffer was written while its copy ran"
        );
    }
}

#[test]
fn one_loader_spans_epochs_on_the_buffers_it_allocated_once() {
    let t = TestDir::new();
    let ds = rows_dataset(&t, 103);
    let order = Order::single(5);
    let depth = 3;
    let backend = Arc::new(AsyncBackend::new(None));
    let mut loader = Loader::new(
        ds.clone(),
        backend.clone(),
        LoaderConfig {
            end_epoch: Some(4),
            ..async_config(10, depth, order)
        },
    )
    .unwrap();
    let seen = consume(
        &mut loader,
        &ds,
        order,
        depth,
        Duration::from_micros(200),
        &backend.copies,
    )
    .unwrap();
    // Every epoch in order, each from 0 in steps of 10 (the last batch of
    // an epoch partial), no batch spanning two.
    let expected: Vec<(u64, u64)> = (0..4)
        .flat_map(|e| (0..103).step_by(10).map(move |p| (e, p)))
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(
        backend.count(|c| &c.allocated),
        depth,
        "the targets are allocated once, for every epoch"
    );
    assert_eq!(backend.count(|c| &c.target_overwritten), 0);
    // The epochs differ: a fresh permutation each.
    assert_ne!(
        order.sampler(ds.len(), 0).iter().collect::<Vec<_>>(),
        order.sampler(ds.len(), 1).iter().collect::<Vec<_>>()
    );
}

/// The record indices a host loader delivers from `start` up to `end_epoch`.
fn host_rows(ds: &Arc<Dataset>, order: Order, start: Position, end_epoch: u64) -> Vec<(u64, u64)> {
    let mut loader = Loader::new(
        ds.clone(),
        Arc::new(HostBackend),
        LoaderConfig {
            batch_rows: 8,
            depth: 2,
            order,
            start,
            end_epoch: Some(end_epoch),
            threads: 1,
        },
    )
    .unwrap();
    let mut rows = Vec::new();
    while let Some(batch) = loader.next_batch().unwrap() {
        let sampler = order.sampler(ds.len(), batch.epoch());
        for r in 0..batch.rows() as u64 {
            let index = sampler.get(batch.position() + r).unwrap();
            let bytes = &batch.target()[r as usize * ROW * 2..(r as usize + 1) * ROW * 2];
            assert_eq!(bytes, expected_row(ds, index).as_slice());
            rows.push((batch.epoch(), index));
        }
        batch.release(None);
    }
    rows
}

#[test]
fn a_run_resumed_at_epoch_and_position_reads_what_the_uninterrupted_run_read() {
    let t = TestDir::new();
    let ds = rows_dataset(&t, 61);
    let order = Order {
        seed: 2,
        rank: 2,
        world_size: 3,
    };
    let len = order.sampler(ds.len(), 0).len(); // 20 rows per epoch
    let whole = host_rows(&ds, order, Position::default(), 3);
    assert_eq!(whole.len() as u64, 3 * len);
    for (epoch, position) in [(0u64, 0u64), (0, 5), (1, 0), (1, 13), (1, len), (2, 19)] {
        let resumed = host_rows(&ds, order, Position { epoch, position }, 3);
        let skipped = (epoch * len + position) as usize;
        assert_eq!(
            resumed,
            whole[skipped..],
            "resumed at ({epoch}, {position})"
        );
    }
}

#[test]
fn batches_say_where_to_resume() {
    let t = TestDir::new();
    let ds = rows_dataset(&t, 20);
    let mut loader = Loader::new(
        ds.clone(),
        Arc::new(HostBackend),
        LoaderConfig {
            end_epoch: Some(2),
            ..config(8, 2, Order::single(0), 0, 0)
        },
    )
    .unwrap();
    let mut resume = Vec::new();
    while let Some(batch) = loader.next_batch().unwrap() {
        resume.push(batch.resume_at());
    }
    let at = |epoch, position| Position { epoch, position };
    assert_eq!(
        resume,
        [
            at(0, 8),
            at(0, 16),
            at(0, 20),
            at(1, 8),
            at(1, 16),
            at(1, 20)
        ]
    );
}

#[test]
fn a_rank_with_no_rows_is_refused_rather_than_looping_forever() {
    let t = TestDir::new();
    let ds = rows_dataset(&t, 3);
    let order = Order {
        seed: 0,
        rank: 3,
        world_size: 4,
    };
    let err = Loader::new(
        ds,
        Arc::new(HostBackend),
        LoaderConfig {
            end_epoch: None,
            ..config(1, 1, order, 0, 0)
        },
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("no row to read"), "{err}");
}

#[test]
fn an_error_mid_epoch_reaches_the_consumer_after_the_good_batches() {
    let t = TestDir::new();
    let ds = rows_dataset(&t, 100);
    let backend = Arc::new(AsyncBackend::new(Some(6)));
    let mut loader = Loader::new(
        ds.clone(),
        backend.clone(),
        async_config(10, 3, Order::single(1)),
    )
    .unwrap();
    let mut good = 0;
    let err = loop {
        match loader.next_batch() {
            Ok(Some(batch)) => {
                batch.ready().wait();
                good += 1;
                batch.release(None);
            }
            Ok(None) => panic!("the epoch ended without the error"),
            Err(e) => break e,
        }
    };
    assert_eq!(good, 6, "the batches before the failed copy arrive");
    assert!(
        err.to_string().contains("injected failure at copy 6"),
        "{err}"
    );
    assert!(loader.next_batch().unwrap().is_none());
}

#[test]
fn dropping_the_loader_mid_epoch_stops_the_producer() {
    let t = TestDir::new();
    let ds = rows_dataset(&t, 500);
    for hold in [false, true] {
        let backend = Arc::new(AsyncBackend::new(None));
        let mut loader = Loader::new(
            ds.clone(),
            backend.clone(),
            LoaderConfig {
                end_epoch: None,
                ..async_config(4, 2, Order::single(1))
            },
        )
        .unwrap();
        let first = loader.next_batch().unwrap().unwrap();
        first.ready().wait();
        // The producer is now waiting for a free slot (the consumer holds
        // one, the other is ready): dropping must not hang, whether or not
        // the consumer still holds a batch.
        let kept = if hold { Some(first) } else { None };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            drop(loader);
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the loader's drop returned");
        drop(kept);
        assert!(backend.copies.load(Ordering::SeqCst) < 125);
    }
}

#[test]
fn dropping_the_loader_frees_no_target_before_the_consumers_fence() {
    // The end of a run: the consumer released batches with fences of work
    // still running (waiting in the ring), holds one more whose work is
    // running too, drops the loader, and releases the held batch last. No
    // target may be freed while that work still reads it.
    let t = TestDir::new();
    let ds = rows_dataset(&t, 200);
    for (depth, released) in [(2usize, 1usize), (3, 2), (4, 2)] {
        let backend = Arc::new(AsyncBackend::new(None));
        let mut loader = Loader::new(
            ds.clone(),
            backend.clone(),
            LoaderConfig {
                end_epoch: None,
                ..async_config(4, depth, Order::single(7))
            },
        )
        .unwrap();
        let slow = Duration::from_millis(60);
        for _ in 0..released {
            let batch = loader.next_batch().unwrap().unwrap();
            batch.ready().wait();
            let done = start_work(&batch, slow);
            batch.release(Some(done));
        }
        let held = loader.next_batch().unwrap().unwrap();
        held.ready().wait();
        let done = start_work(&held, slow);
        drop(loader);
        held.release(Some(done));
        // The last owner of the backend: dropping it runs every queued free.
        let backend = Arc::try_unwrap(backend)
            .ok()
            .expect("nothing holds the backend once the loader and its batches are gone");
        let counters = backend.counters.clone();
        drop(backend);
        assert_eq!(
            counters.freed_in_use.load(Ordering::SeqCst),
            0,
            "depth {depth}: a target was freed while the consumer's work read it"
        );
        assert_eq!(
            counters.freed.load(Ordering::SeqCst),
            depth,
            "every target is freed, once"
        );
    }
}

/// `prep bench-read --json` on host memory: the counts follow the flags and
/// the simulated step is the asked multiple of the copy measured in the run;
/// bad step and staging flags are usage errors.
#[test]
fn bench_read_reports_json_with_the_step_a_multiple_of_the_measured_copy() {
    let t = TestDir::new();
    rows_dataset(&t, 400);
    let out = ok(t.prep().args([
        "bench-read",
        ".",
        "--batch",
        "8",
        "--steps",
        "20",
        "--step-x",
        "3",
        "--threads",
        "2",
        "--json",
    ]));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["rows"], 400);
    assert_eq!(r["row_tokens"], ROW);
    assert_eq!(r["batch_bytes"], 8 * ROW * 2);
    assert_eq!(r["delivered"], 20);
    assert_eq!(r["steps_timed"], 20);
    let copy = &r["batch_copy"];
    assert_eq!(copy["bytes"], 8 * ROW * 2);
    let per_copy = copy["seconds"].as_f64().unwrap() / copy["copies"].as_f64().unwrap();
    let step = r["step_seconds"].as_f64().unwrap();
    assert!(
        (step - 3.0 * per_copy).abs() < 1e-8,
        "step {step} s, copy {per_copy} s"
    );
    for bad in [
        &["--step-x=-1"][..],
        &["--step-x", "2", "--step-ms", "1"],
        &["--pinned", "cached"],
    ] {
        let err = fails(t.prep().args(["bench-read", "."]).args(bad), 2);
        assert!(err.contains("step") || err.contains("pinned"), "{err}");
    }
}
