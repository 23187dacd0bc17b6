//! One reader's records: its share of the epoch's positions, each row read
//! from a mapped block of the cache, with fetch threads keeping the next
//! window of blocks on their way.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::cache::{BlockCache, CachedBlock};
use super::fetch::Source;
use super::StreamError;
use crate::sampler::BlockOrder;

/// Which records of an epoch a reader reads: rank `rank` of `world`, and
/// within the rank DataLoader worker `worker` of `workers`, which takes
/// the rank's records `batch` at a time in turn with the other workers (as
/// a DataLoader consumes them), so that what a rank has consumed after any
/// number of whole batches is a prefix of its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// The rank.
    pub rank: u64,
    /// Ranks in the job.
    pub world: u64,
    /// The DataLoader worker within the rank.
    pub worker: u64,
    /// DataLoader workers of the rank (1 without workers).
    pub workers: u64,
    /// The DataLoader's batch size.
    pub batch: u64,
}

impl Share {
    /// Rank `rank` of `world`, without DataLoader workers.
    pub fn rank(rank: u64, world: u64) -> Share {
        Share {
            rank,
            world,
            worker: 0,
            workers: 1,
            batch: 1,
        }
    }

    /// The rank's `j`-th record index (0-based) read by this worker as its
    /// `k`-th: batches dealt to the workers in turn.
    fn local(&self, k: u64) -> u64 {
        let (t, within) = (k / self.batch, k % self.batch);
        (t * self.workers + self.worker) * self.batch + within
    }
}

/// A record read from the cache: a row of a mapped block.
#[derive(Debug, Clone)]
pub struct StreamRecord {
    block: Arc<CachedBlock>,
    at: usize,
    len: usize,
    /// The record's number in the dataset.
    pub index: u64,
    /// Its global position in the epoch's order.
    pub position: u64,
}

impl StreamRecord {
    /// The row's bytes: its tokens, little-endian in the dataset's dtype.
    pub fn bytes(&self) -> &[u8] {
        &self.block.bytes()[self.at..self.at + self.len]
    }
}

/// What the fetch threads need.
pub(super) struct Fetching {
    pub(super) source: Arc<Source>,
    pub(super) cache: BlockCache,
    /// Block files are named `{name}-{block number}`.
    pub(super) name: String,
    pub(super) block: u64,
    pub(super) rows: u64,
    pub(super) row_bytes: u64,
    pub(super) in_flight: usize,
    /// Blocks of one window of every stream read: how far ahead to fetch.
    pub(super) window_blocks: u64,
    /// Whether blocks go through the cache directory; if not (a local
    /// dataset), each is read and checked into memory.
    pub(super) cached: bool,
}

type Ready = Mutex<HashMap<u64, Result<Arc<CachedBlock>, StreamError>>>;

/// One reader's records of an epoch, in order: an iterator of
/// [`StreamRecord`]s (see [`super::Stream::reader`]).
pub struct StreamReader {
    order: Arc<BlockOrder>,
    start: u64,
    share: Share,
    /// Records of the rank.
    each: u64,
    /// The next of this reader's records (its `k`).
    next: u64,
    /// The lookahead's next record.
    ahead: u64,
    block: u64,
    row_bytes: u64,
    window_blocks: u64,
    /// Blocks asked of the fetch threads and not yet taken.
    requested: HashSet<u64>,
    mapped: VecDeque<(u64, Arc<CachedBlock>)>,
    ready: Arc<(Ready, Condvar)>,
    tx: Option<Sender<u64>>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for StreamReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamReader")
            .field("share", &self.share)
            .field("start", &self.start)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl StreamReader {
    pub(super) fn new(order: BlockOrder, start: u64, share: Share, f: Fetching) -> StreamReader {
        let (tx, rx) = channel::<u64>();
        let rx = Arc::new(Mutex::new(rx));
        let ready: Arc<(Ready, Condvar)> = Arc::default();
        let f = Arc::new(f);
        let threads = (0..f.in_flight)
            .map(|_| {
                let (rx, ready, f) = (Arc::clone(&rx), Arc::clone(&ready), Arc::clone(&f));
                std::thread::spawn(move || loop {
                    let next = rx.lock().expect("no panic while held").recv();
                    let Ok(b) = next else { return };
                    let result = fetch_block(&f, b);
                    ready
                        .0
                        .lock()
                        .expect("no panic while held")
                        .insert(b, result);
                    ready.1.notify_all();
                })
            })
            .collect();
        let each = order.len().saturating_sub(start) / share.world;
        StreamReader {
            order: Arc::new(order),
            start,
            share,
            each,
            next: 0,
            ahead: 0,
            block: f.block,
            row_bytes: f.row_bytes,
            window_blocks: f.window_blocks.max(1),
            requested: HashSet::new(),
            mapped: VecDeque::new(),
            ready,
            tx: Some(tx),
            threads,
        }
    }

    /// The global position and record of this reader's `k`-th record, or
    /// `None` past its share.
    fn record_at(&self, k: u64) -> Option<(u64, u64)> {
        let i = self.share.local(k);
        (i < self.each).then(|| {
            let g = self.start + self.share.rank + i * self.share.world;
            (g, self.order.get(g))
        })
    }

    /// Asks for the blocks of the records ahead, in the order they will be
    /// read, up to a window of every stream read.
    fn look_ahead(&mut self) {
        self.ahead = self.ahead.max(self.next);
        while let Some((_, record)) = self.record_at(self.ahead) {
            let b = record / self.block;
            if !self.requested.contains(&b) && !self.is_mapped(b) {
                if self.requested.len() as u64 >= self.window_blocks {
                    return;
                }
                self.request(b);
            }
            self.ahead += 1;
        }
    }

    fn request(&mut self, b: u64) {
        self.requested.insert(b);
        if let Some(tx) = &self.tx {
            let _ = tx.send(b);
        }
    }

    /// Block `b`, mapped: from this reader's maps, or waited for.
    fn block(&mut self, b: u64) -> Result<Arc<CachedBlock>, StreamError> {
        if let Some(at) = self.mapped.iter().position(|(m, _)| *m == b) {
            let entry = self.mapped.remove(at).expect("found");
            let block = Arc::clone(&entry.1);
            self.mapped.push_back(entry);
            return Ok(block);
        }
        if !self.requested.contains(&b) {
            self.request(b);
        }
        let block = {
            let (lock, ready) = &*self.ready;
            let mut map = lock.lock().expect("no panic while held");
            loop {
                if let Some(result) = map.remove(&b) {
                    break result;
                }
                map = ready.wait(map).expect("no panic while held");
            }
        };
        self.requested.remove(&b);
        let block = block?;
        self.mapped.push_back((b, Arc::clone(&block)));
        while self.mapped.len() as u64 > 2 * self.window_blocks {
            self.mapped.pop_front();
        }
        Ok(block)
    }

    /// Records this reader reads in all (from its start).
    pub fn len(&self) -> u64 {
        let full = self.each / (self.share.workers * self.share.batch);
        let mut n = full * self.share.batch;
        let rest = self.each - full * self.share.workers * self.share.batch;
        n += rest
            .saturating_sub(self.share.worker * self.share.batch)
            .min(self.share.batch);
        n
    }

    /// Whether block `b` is among this reader's mapped blocks.
    fn is_mapped(&self, b: u64) -> bool {
        self.mapped.iter().any(|(m, _)| *m == b)
    }

    /// Whether the next call of `next` may wait for a fetch: false when
    /// its record's block is mapped already (or there is no next record).
    /// A caller that holds a lock others need (Python's GIL) lets it go
    /// only when this is true.
    pub fn may_wait(&self) -> bool {
        match self.record_at(self.next) {
            None => false,
            Some((_, index)) => !self.is_mapped(index / self.block),
        }
    }

    /// True when this reader has no record to read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Iterator for StreamReader {
    type Item = Result<StreamRecord, StreamError>;

    fn next(&mut self) -> Option<Self::Item> {
        let (position, index) = self.record_at(self.next)?;
        // The blocks ahead are asked for from this record on, so that its
        // own block is the first in line.
        self.look_ahead();
        self.next += 1;
        let b = index / self.block;
        Some(self.block(b).map(|block| StreamRecord {
            block,
            at: ((index - b * self.block) * self.row_bytes) as usize,
            len: self.row_bytes as usize,
            index,
            position,
        }))
    }
}

impl Drop for StreamReader {
    fn drop(&mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn fetch_block(f: &Fetching, b: u64) -> Result<Arc<CachedBlock>, StreamError> {
    let rows = b * f.block..((b + 1) * f.block).min(f.rows);
    let len = (rows.end - rows.start) * f.row_bytes;
    if !f.cached {
        return Ok(Arc::new(CachedBlock::in_memory(f.source.rows(rows)?)));
    }
    let name = format!("{}-{b}", f.name);
    let block = f.cache.get_or_fetch(&name, len, || f.source.rows(rows))?;
    Ok(Arc::new(block))
}
