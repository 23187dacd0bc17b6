//! Streaming a packed dataset through a bounded cache (prep::stream), on a
//! local directory (the object-storage runs are tests/python/test_stream.py):
//! every row once per epoch across ranks and DataLoader workers, each row
//! the dataset's own bytes, the cache never above its limit, a resume on
//! another world size reading exactly the rest, and the refusals.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::common::*;
use prep::format::{Dataset, Dtype, MANIFEST_FILE};
use prep::pack::{self, PackConfig, PackMode};
use prep::stream::{Share, Stream, StreamConfig, StreamError, StreamState};
use prep::tokenize::NoProgress;

/// A packed dataset of rows of 16 tokens in shards of 1 KiB (32 rows), so
/// that blocks straddle shards: 353 of them, an odd count, so that two ranks
/// leave one out.
fn packed(t: &TestDir) -> PathBuf {
    let docs = t.path("docs");
    std::fs::create_dir_all(&docs).unwrap();
    let records: Vec<Vec<u32>> = (0..303u32)
        .map(|i| (0..(1 + i % 37)).map(|j| 1 + (i * 13 + j) % 900).collect())
        .collect();
    write_dataset(&docs, Dtype::U16, 4 << 10, &records);
    let mut m = prep::format::Manifest::read(&docs).unwrap();
    m.vocab_size = 1000;
    prep::format::atomic_write(&docs.join(MANIFEST_FILE), m.to_json().as_bytes()).unwrap();
    let out = t.path("packed");
    let mut c = PackConfig::new(&docs, &out, 16);
    c.mode = PackMode::Concat;
    c.no_sep = true;
    c.writing.shard_size = 1 << 10;
    pack::run(&c, &NoProgress).unwrap();
    out
}

fn config(t: &TestDir, name: &str, limit: u64) -> StreamConfig {
    let mut c = StreamConfig::new(t.path(name), limit);
    c.seed = 7;
    c.block_bytes = Some(5 * 32); // 5 rows of 32 bytes
    c.window = Some(2);
    c.streams = Some(4);
    // The cache directory itself is under test: a local dataset's blocks
    // go through it as a remote one's do.
    c.cache_local = true;
    c
}

/// Reads `share` to the end (or `take` records), checking each row against
/// the mapped dataset and the cache against its limit.
fn read(
    stream: &Stream,
    ds: &Dataset,
    epoch: u64,
    start: u64,
    share: Share,
    take: Option<usize>,
) -> Vec<u64> {
    let limit = stream.cache().limit();
    let mut seen = Vec::new();
    let reader = stream.reader(epoch, start, share).unwrap();
    for r in reader.take(take.unwrap_or(usize::MAX)) {
        let r = r.unwrap();
        assert_eq!(
            r.bytes(),
            ds.record_bytes(r.index).unwrap(),
            "row {}",
            r.index
        );
        let used = stream.cache().used().unwrap();
        assert!(used <= limit, "cache holds {used} bytes, limit {limit}");
        seen.push(r.index);
    }
    seen
}

#[test]
fn ranks_and_workers_read_every_row_once_under_the_cache_limit() {
    let t = TestDir::new();
    let dir = packed(&t);
    let ds = Dataset::open(&dir).unwrap();
    let n = ds.len();
    assert!(ds.manifest().shards.len() > 3, "several shards");
    let probe = Stream::open(dir.to_str().unwrap(), config(&t, "cache", u64::MAX), None).unwrap();
    let need = probe.cache_need(2);
    // Far smaller than the dataset: the reader must evict as it goes.
    assert!(need * 3 < n * 32, "need {need} against {} bytes", n * 32);
    let mut c = config(&t, "cache", need);
    c.world = 2;
    let stream = Stream::open(dir.to_str().unwrap(), c, None).unwrap();
    let order = stream.order(0).unwrap();
    let mut all = Vec::new();
    for rank in 0..2 {
        let mut by_worker = Vec::new();
        for worker in 0..2 {
            let share = Share {
                rank,
                world: 2,
                worker,
                workers: 2,
                batch: 3,
            };
            by_worker.push(read(&stream, &ds, 0, 0, share, None));
        }
        // The workers' batches, taken in turn as a DataLoader does, are the
        // rank's positions in order.
        let mut merged = Vec::new();
        let mut cursors = [0usize, 0];
        'outer: loop {
            for w in 0..2 {
                let batch = &by_worker[w][cursors[w]..(cursors[w] + 3).min(by_worker[w].len())];
                if batch.is_empty() {
                    break 'outer;
                }
                merged.extend_from_slice(batch);
                cursors[w] += batch.len();
            }
        }
        merged.extend_from_slice(&by_worker[0][cursors[0]..]);
        let expected: Vec<u64> = order.positions(0, rank, 2).map(|g| order.get(g)).collect();
        assert_eq!(merged, expected, "rank {rank}");
        all.extend(merged);
    }
    let distinct: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "no row twice");
    assert_eq!(all.len() as u64, n - n % 2, "all but n % world rows");
    // Those left out are the order's last positions, as with the Sampler.
    assert_eq!(n % 2, 1, "an odd row count: one row is left out");
    let left_out: BTreeSet<u64> = (0..n).filter(|i| !distinct.contains(i)).collect();
    let last: BTreeSet<u64> = (n - n % 2..n).map(|g| order.get(g)).collect();
    assert_eq!(left_out, last);
}

#[test]
fn a_resume_on_another_world_size_reads_exactly_the_rest() {
    let t = TestDir::new();
    let dir = packed(&t);
    let ds = Dataset::open(&dir).unwrap();
    let n = ds.len();
    let stream = Stream::open(dir.to_str().unwrap(), config(&t, "cache", u64::MAX), None).unwrap();
    let before: Vec<u64> = (0..2)
        .flat_map(|rank| read(&stream, &ds, 1, 0, Share::rank(rank, 2), Some(40)))
        .collect();
    let state = stream.state(1, 2 * 40);
    // The state is a plain JSON value, and loads on 3 ranks.
    let json = serde_json::to_string(&state).unwrap();
    let state: StreamState = serde_json::from_str(&json).unwrap();
    let mut c = config(&t, "cache", u64::MAX);
    c.streams = None; // taken from the state
    let resumed = Stream::open(dir.to_str().unwrap(), c, Some(&state)).unwrap();
    let after: Vec<u64> = (0..3)
        .flat_map(|rank| {
            read(
                &resumed,
                &ds,
                state.epoch,
                state.position,
                Share::rank(rank, 3),
                None,
            )
        })
        .collect();
    let union: BTreeSet<u64> = before.iter().chain(&after).copied().collect();
    assert_eq!(union.len(), before.len() + after.len(), "no row twice");
    assert_eq!(union.len() as u64, n - (n - 80) % 3);
}

#[test]
fn refusals_name_their_numbers() {
    let t = TestDir::new();
    let dir = packed(&t);
    // A limit below the smallest plan with what the caller fixed (blocks
    // of 5 rows of 32 bytes, windows of 2, 4 streams): 1 rank x 2 windows
    // x 2 blocks x 4 streams x (160 + 16) bytes.
    let err = Stream::open(dir.to_str().unwrap(), config(&t, "cache", 100), None).unwrap_err();
    assert!(matches!(err, StreamError::CacheTooSmall { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("below the 2816 bytes the smallest plan"),
        "{err}"
    );
    // Enough for 2 ranks (2 streams each), not for 3, which share no
    // factor with 4 streams and so read all 4.
    let probe = Stream::open(dir.to_str().unwrap(), config(&t, "cache", u64::MAX), None).unwrap();
    let (two, three) = (probe.cache_need(2), probe.cache_need(3));
    assert_eq!((two, three), (1408, 2816));
    let mut c = config(&t, "cache", two);
    c.world = 2;
    let stream = Stream::open(dir.to_str().unwrap(), c, None).unwrap();
    stream.reader(0, 0, Share::rank(1, 2)).unwrap();
    let err = stream.reader(0, 0, Share::rank(0, 3)).unwrap_err();
    assert!(matches!(err, StreamError::CacheTooSmall { .. }), "{err}");
    assert!(err.to_string().contains("below the 2816 bytes"), "{err}");

    let state = stream.state(0, 10);
    let mut c = config(&t, "cache", u64::MAX);
    c.seed = 8;
    let err = Stream::open(dir.to_str().unwrap(), c, Some(&state)).unwrap_err();
    assert!(err.to_string().contains("seed 7"), "{err}");

    let docs = t.path("docs");
    let err =
        Stream::open(docs.to_str().unwrap(), config(&t, "cache", u64::MAX), None).unwrap_err();
    assert!(matches!(err, StreamError::NotPacked { .. }), "{err}");
}

#[test]
fn a_corrupt_shard_is_an_error_naming_it_never_a_row() {
    let t = TestDir::new();
    let dir = packed(&t);
    let ds = Dataset::open(&dir).unwrap();
    let bin = dir.join(&ds.manifest().shards[1].bin);
    drop(ds);
    let mut bytes = std::fs::read(&bin).unwrap();
    bytes[5] ^= 0x40;
    std::fs::write(&bin, &bytes).unwrap();
    let stream = Stream::open(dir.to_str().unwrap(), config(&t, "cache", u64::MAX), None).unwrap();
    let results: Vec<_> = stream.reader(0, 0, Share::rank(0, 1)).unwrap().collect();
    let err = results
        .iter()
        .find_map(|r| r.as_ref().err())
        .expect("an error");
    assert!(err.to_string().contains(&*bin.to_string_lossy()), "{err}");
    assert!(err.to_string().contains("corrupt"), "{err}");
    // The cache holds whole blocks only, never a part.
    for e in std::fs::read_dir(t.path("cache")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".part"), "{name}");
    }
}

/// The batch loader over a stream, and over the mapped dataset in the
/// stream's order: each rank's batches are its share of the stream's order,
/// row for row, a loader started at a state's global position (a resumed
/// run, on any world size) delivers exactly the rest, and each batch's
/// resume position is the next state's.
#[test]
fn the_batch_loader_reads_a_stream_in_its_order() {
    use prep::loader::{HostBackend, Loader, LoaderConfig, Order, Position};
    use std::sync::Arc;

    let t = TestDir::new();
    let dir = packed(&t);
    let ds = Arc::new(Dataset::open(&dir).unwrap());
    let stream =
        Arc::new(Stream::open(dir.to_str().unwrap(), config(&t, "cache", u64::MAX), None).unwrap());
    let order = stream.order(2).unwrap();
    // 28 is no multiple of 3: a state taken on another world size.
    for (rank, world, batch_rows, position) in [
        (0u64, 1u64, 7usize, 0u64),
        (1, 2, 5, 0),
        (0, 3, 4, 27),
        (2, 3, 4, 28),
    ] {
        let config = LoaderConfig {
            batch_rows,
            depth: 2,
            order: Order {
                seed: 0,
                rank,
                world_size: world,
            },
            start: Position { epoch: 2, position },
            end_epoch: Some(3),
            threads: 1,
        };
        let expected: Vec<u64> = order
            .positions(position, rank, world)
            .map(|g| order.get(g))
            .collect();
        let streamed =
            Loader::from_stream(Arc::clone(&stream), Arc::new(HostBackend), config).unwrap();
        let in_place = Loader::with_stream_order(
            Arc::clone(&ds),
            Arc::clone(&stream),
            Arc::new(HostBackend),
            config,
        )
        .unwrap();
        for (how, mut loader) in [("streamed", streamed), ("in place", in_place)] {
            let mut got = Vec::new();
            let mut at = position;
            while let Some(batch) = loader.next_batch().unwrap() {
                assert_eq!((batch.epoch(), batch.position()), (2, at), "{how}");
                for row in batch.target()[..batch.rows() * 32].chunks(32) {
                    got.push(row.to_vec());
                }
                // Every rank consumed as many rows: the state's position.
                at += batch.rows() as u64 * world;
                assert_eq!(batch.resume_at().position, at, "{how}");
                batch.release(None);
            }
            assert_eq!(got.len(), expected.len(), "{how}: rank {rank} of {world}");
            for (row, &index) in got.iter().zip(&expected) {
                assert_eq!(
                    row.as_slice(),
                    ds.record_bytes(index).unwrap(),
                    "{how}: row {index}"
                );
            }
        }
    }
}

/// A local dataset's blocks are read and checked into memory, not written
/// into the cache directory: the same rows in the same order as through
/// the cache, and nothing in the directory after.
#[test]
fn a_local_dataset_streams_without_filling_the_cache_directory() {
    let t = TestDir::new();
    let dir = packed(&t);
    let ds = Dataset::open(&dir).unwrap();
    let through =
        Stream::open(dir.to_str().unwrap(), config(&t, "cached", u64::MAX), None).unwrap();
    let mut c = config(&t, "direct", u64::MAX);
    c.cache_local = false;
    let direct = Stream::open(dir.to_str().unwrap(), c, None).unwrap();
    for rank in 0..2 {
        let share = Share::rank(rank, 2);
        assert_eq!(
            read(&direct, &ds, 1, 0, share, None),
            read(&through, &ds, 1, 0, share, None),
            "rank {rank}"
        );
    }
    assert!(
        through.cache().used().unwrap() > 0,
        "the cached reader used its directory"
    );
    assert_eq!(
        direct.cache().used().unwrap(),
        0,
        "nothing in the direct reader's cache"
    );
}
