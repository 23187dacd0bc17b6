//! The loader's ring, tested without a GPU: batches arrive in sampler order
//! with the right rows; a copy into a target never starts before the
//! consumer's work on it is done; a staging buffer is never refilled while
//! a copy out of it runs; at most `depth` batches are ahead; errors and
//! drops mid-epoch end cleanly. The asynchronous test backend below copies
//! on a thread of its own, like a GPU stream, with random delays.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::*;
use prep::format::{Dataset, Dtype};
use prep::loader::{Backend, Batch, HostBackend, Loader, LoaderConfig, LoaderError};
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

#[test]
fn host_batches_arrive_in_sampler_order_with_their_rows() {
    let t = TestDir::new();
    let ds = rows_dataset(&t, 103);
    for (batch_rows, depth, start) in [(8usize, 1usize, 0u64), (8, 3, 0), (7, 2, 40), (200, 2, 0)] {
        let sampler = Sampler::new(ds.len(), 4, 1, 0, 1);
        let mut loader = Loader::new(
            ds.clone(),
            sampler.clone(),
            Arc::new(HostBackend),
            LoaderConfig {
                batch_rows,
                depth,
                start,
                threads: depth % 2 + 1,
            },
        )
        .unwrap();
        let mut position = start;
        while let Some(batch) = loader.next_batch().unwrap() {
            assert_eq!(batch.position(), position);
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
        Sampler::new(2, 0, 0, 0, 1),
        Arc::new(HostBackend),
        LoaderConfig {
            batch_rows: 1,
            depth: 1,
            start: 0,
            threads: 2,
        },
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("differ in length"), "{err}");
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

struct Staging {
    bytes: Arc<Mutex<Vec<u8>>>,
    /// The copy out of this buffer, if one was queued.
    pending: Option<Fence>,
}

struct Target {
    bytes: Arc<Mutex<Vec<u8>>>,
    /// Set while the simulated consumer's work reads the target.
    in_use: Arc<AtomicBool>,
}

/// Copies on a worker thread in queue order, like a GPU stream, each after
/// a random delay, checking the rules of the ring as it goes.
struct AsyncBackend {
    queue: Mutex<Sender<Box<dyn FnOnce() + Send>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    copies: AtomicUsize,
    recycled: AtomicUsize,
    fail_at: Option<usize>,
    violations: Arc<AtomicUsize>,
}

impl AsyncBackend {
    fn new(fail_at: Option<usize>) -> AsyncBackend {
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
            violations: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Drop for AsyncBackend {
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
            pending: None,
        })
    }

    fn alloc_target(&self, bytes: usize) -> Result<Target, LoaderError> {
        Ok(Target {
            bytes: Arc::new(Mutex::new(vec![0; bytes])),
            in_use: Arc::new(AtomicBool::new(false)),
        })
    }

    fn fill<'a>(&self, staging: &'a mut Staging) -> Result<&'a mut [u8], LoaderError> {
        if let Some(p) = staging.pending.take() {
            p.wait();
        }
        // The copy is done with the buffer: the producer may write it. The
        // test hands out the vector itself through a raw view of the Arc.
        let bytes = Arc::get_mut(&mut staging.bytes)
            .expect("no copy holds the staging buffer once its fence is complete")
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
    ) -> Result<Fence, LoaderError> {
        let n = self.copies.fetch_add(1, Ordering::SeqCst);
        if Some(n) == self.fail_at {
            return Err(LoaderError::Backend(format!(
                "injected failure at copy {n}"
            )));
        }
        let fence: Fence = Arc::default();
        let (src, dst, in_use) = (
            staging.bytes.clone(),
            target.bytes.clone(),
            target.in_use.clone(),
        );
        let (done, violations) = (fence.clone(), self.violations.clone());
        let delay = Duration::from_micros((n as u64 * 7919) % 400);
        self.queue
            .lock()
            .unwrap()
            .send(Box::new(move || {
                if let Some(after) = after {
                    after.wait(); // the stream waits for the consumer
                }
                if in_use.load(Ordering::SeqCst) {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(delay);
                dst.lock().unwrap()[..bytes].copy_from_slice(&src.lock().unwrap()[..bytes]);
                drop(src); // the staging buffer is free again
                done.complete();
            }))
            .unwrap();
        staging.pending = Some(fence.clone());
        Ok(fence)
    }

    fn recycle(&self, fence: Fence) {
        assert!(
            Arc::strong_count(&fence) <= 2,
            "a fence comes back only once its batch is released"
        );
        self.recycled.fetch_add(1, Ordering::SeqCst);
    }
}

/// Consumes an epoch like a training loop on a GPU: waits for each batch,
/// checks its rows, then "computes" on it asynchronously for `work` and
/// releases it with the fence of that work. Returns the positions seen.
fn consume(
    loader: &mut Loader<AsyncBackend>,
    ds: &Dataset,
    sampler: &Sampler,
    depth: usize,
    work: Duration,
    copies: &AtomicUsize,
) -> Result<Vec<u64>, LoaderError> {
    let mut positions = Vec::new();
    let mut consumed = 0usize;
    while let Some(batch) = loader.next_batch()? {
        let batch: Batch<AsyncBackend> = batch;
        batch.ready().wait();
        consumed += 1;
        assert!(
            copies.load(Ordering::SeqCst) <= consumed + depth,
            "more than depth batches ahead"
        );
        {
            let bytes = batch.target().bytes.lock().unwrap();
            for r in 0..batch.rows() {
                let index = sampler.get(batch.position() + r as u64).unwrap();
                assert_eq!(
                    &bytes[r * ROW * 2..(r + 1) * ROW * 2],
                    expected_row(ds, index).as_slice()
                );
            }
        }
        positions.push(batch.position());
        let in_use = batch.target().in_use.clone();
        in_use.store(true, Ordering::SeqCst);
        let done: Fence = Arc::default();
        let finished = done.clone();
        std::thread::spawn(move || {
            std::thread::sleep(work);
            in_use.store(false, Ordering::SeqCst);
            finished.complete();
        });
        batch.release(Some(done));
    }
    Ok(positions)
}

#[test]
fn async_copies_respect_the_ring_with_slow_and_fast_consumers() {
    let t = TestDir::new();
    let ds = rows_dataset(&t, 257);
    for depth in [1usize, 2, 4] {
        for work in [
            Duration::ZERO,
            Duration::from_micros(300),
            Duration::from_millis(2),
        ] {
            let sampler = Sampler::new(ds.len(), 9, 0, 1, 2);
            let backend = Arc::new(AsyncBackend::new(None));
            let mut loader = Loader::new(
                ds.clone(),
                sampler.clone(),
                backend.clone(),
                LoaderConfig {
                    batch_rows: 5,
                    depth,
                    start: 0,
                    threads: 2,
                },
            )
            .unwrap();
            let positions =
                consume(&mut loader, &ds, &sampler, depth, work, &backend.copies).unwrap();
            let expected: Vec<u64> = (0..sampler.len()).step_by(5).collect();
            assert_eq!(positions, expected, "depth {depth}, work {work:?}");
            assert_eq!(
                backend.violations.load(Ordering::SeqCst),
                0,
                "a copy overwrote a target the consumer was using"
            );
            // Every fence but those of the last batch in each slot comes back.
            let recycled = backend.recycled.load(Ordering::SeqCst);
            assert!(
                recycled + depth >= positions.len(),
                "{recycled} fences recycled of {}",
                positions.len()
            );
        }
    }
}

#[test]
fn an_error_mid_epoch_reaches_the_consumer_after_the_good_batches() {
    let t = TestDir::new();
    let ds = rows_dataset(&t, 100);
    let sampler = Sampler::new(ds.len(), 1, 0, 0, 1);
    let backend = Arc::new(AsyncBackend::new(Some(6)));
    let mut loader = Loader::new(
        ds.clone(),
        sampler.clone(),
        backend.clone(),
        LoaderConfig {
            batch_rows: 10,
            depth: 3,
            start: 0,
            threads: 2,
        },
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
        let sampler = Sampler::new(ds.len(), 1, 0, 0, 1);
        let backend = Arc::new(AsyncBackend::new(None));
        let mut loader = Loader::new(
            ds.clone(),
            sampler,
            backend.clone(),
            LoaderConfig {
                batch_rows: 4,
                depth: 2,
                start: 0,
                threads: 2,
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
