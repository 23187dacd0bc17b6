//! The candidates' entries `(band, key, document)`: made by signing
//! documents, held sorted in memory up to a budget, the rest spilled in
//! sorted runs, and read back as one sorted stream.
//!
//! Entries are unique (one per band and document), so their sorted order
//! is one order whatever the budget, the runs or the threads.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::minhash::MinHasher;
use crate::format::{FormatError, Tokens, Verified};
use crate::progress::{Progress, ProgressSnapshot};

/// One entry: band, band key, document.
pub type Entry = [u64; 3];
/// Bytes of one entry on disk: three little-endian u64s.
pub const ENTRY_BYTES: u64 = 24;
/// Documents signed per parallel batch.
const BATCH: u64 = 4096;
/// The most entries one document adds: one per band.
const MAX_DOCUMENT_ENTRIES: usize = super::MAX_HASHES;
/// The fewest entries held before a run is spilled, whatever the budget.
pub const MIN_ENTRIES: u64 = 1 << 12;

/// An entry as its 24 bytes on disk.
pub fn encode(e: &Entry, out: &mut Vec<u8>) {
    for v in e {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// The entry of 24 bytes on disk.
pub fn decode(b: &[u8]) -> Entry {
    [0, 1, 2].map(|i| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes")))
}

/// The ids of a record as u32s, widened into `buf` for a `uint16` dataset.
fn ids<'a>(tokens: Tokens<'a>, buf: &'a mut Vec<u32>) -> &'a [u32] {
    match tokens {
        Tokens::U32(t) => t,
        Tokens::U16(t) => {
            buf.clear();
            buf.extend(t.iter().map(|&x| u32::from(x)));
            buf
        }
    }
}

/// Signs the documents `range` of `input` into `entries`, a batch of
/// documents at a time over the current thread pool.
pub fn sign(
    input: &Verified<'_>,
    hasher: &MinHasher,
    range: Range<u64>,
    entries: &mut Entries,
    progress: &dyn Progress,
) -> Result<(), FormatError> {
    let ds = input.dataset();
    let size = ds.dtype().size() as u64;
    let total: u64 = range
        .clone()
        .map(|g| ds.record_len(g).map(|n| n * size))
        .sum::<Result<u64, _>>()?;
    let bands = hasher.params().bands;
    let mut bytes = 0u64;
    let mut start = range.start;
    while start < range.end {
        let end = (start + BATCH).min(range.end);
        let signed: Vec<Vec<Entry>> = (start..end)
            .into_par_iter()
            .map_init(
                || (Vec::new(), Vec::new(), Vec::new()),
                |(buf, scratch, sig), g| -> Result<Vec<Entry>, FormatError> {
                    let record = ids(input.record(g)?, buf);
                    if !hasher.sign(record, scratch, sig) {
                        return Ok(Vec::new());
                    }
                    Ok((0..bands)
                        .map(|j| [j as u64, hasher.band_key(sig, j), g])
                        .collect())
                },
            )
            .collect::<Result<_, _>>()?;
        for doc in signed {
            entries.push(&doc)?;
        }
        // Read once: the batch's pages leave this process's memory.
        input.release_records(start..end);
        for g in start..end {
            bytes += ds.record_len(g)? * size;
        }
        progress.update(&ProgressSnapshot {
            input_bytes: bytes,
            input_total: total,
            documents: end - range.start,
            text_bytes: 0,
            tokens: bytes / size,
        });
        start = end;
    }
    Ok(())
}

/// Entries held sorted in memory up to a budget, the rest in sorted runs
/// on disk.
pub struct Entries {
    dir: PathBuf,
    held: Vec<Entry>,
    limit: usize,
    runs: Vec<PathBuf>,
}

impl Entries {
    /// Entries that spill runs into `dir` beyond `memory` bytes, of which
    /// there will be at most `most` (documents times bands).
    pub fn new(dir: &Path, memory: u64, most: u64) -> Entries {
        let limit = (memory / ENTRY_BYTES).max(MIN_ENTRIES) as usize;
        Entries {
            dir: dir.into(),
            // Room for what will be held and one more document's entries,
            // reserved at once: a vector that doubled as it filled would
            // hold the old and the new buffer together, twice the budget.
            held: Vec::with_capacity(limit.min(most as usize) + MAX_DOCUMENT_ENTRIES),
            limit,
            runs: Vec::new(),
        }
    }

    /// Runs spilled so far.
    pub fn runs(&self) -> u64 {
        self.runs.len() as u64
    }

    /// Adds a document's entries.
    pub fn push(&mut self, doc: &[Entry]) -> Result<(), FormatError> {
        self.held.extend_from_slice(doc);
        if self.held.len() >= self.limit {
            self.spill()?;
        }
        Ok(())
    }

    /// Sorts what is held and writes it as the next run.
    fn spill(&mut self) -> Result<(), FormatError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| FormatError::io(&self.dir, e))?;
        self.held.par_sort_unstable();
        let path = self.dir.join(format!("run-{:05}.bin", self.runs.len()));
        let io = |e| FormatError::io(&path, e);
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&path).map_err(io)?);
        let mut bytes = Vec::with_capacity(ENTRY_BYTES as usize);
        for e in &self.held {
            bytes.clear();
            encode(e, &mut bytes);
            w.write_all(&bytes).map_err(io)?;
        }
        w.into_inner()
            .map_err(|e| io(e.into_error()))?
            .sync_all()
            .map_err(io)?;
        self.held.clear();
        self.runs.push(path);
        Ok(())
    }

    /// Every entry, in sorted order, merged from the runs and what is held.
    pub fn sorted(
        mut self,
    ) -> Result<impl Iterator<Item = Result<Entry, FormatError>>, FormatError> {
        self.held.par_sort_unstable();
        let mut sources: Vec<Box<dyn Iterator<Item = Result<Entry, FormatError>>>> = Vec::new();
        for path in &self.runs {
            sources.push(Box::new(RunReader::open(path)?));
        }
        let held = std::mem::take(&mut self.held);
        sources.push(Box::new(held.into_iter().map(Ok)));
        Merged::new(sources)
    }
}

/// Sorted streams of entries merged into one sorted stream.
pub struct Merged<S> {
    sources: Vec<S>,
    heap: std::collections::BinaryHeap<std::cmp::Reverse<(Entry, usize)>>,
}

impl<S: Iterator<Item = Result<Entry, FormatError>>> Merged<S> {
    /// The merge of `sources`, each sorted.
    pub fn new(mut sources: Vec<S>) -> Result<Merged<S>, FormatError> {
        let mut heap = std::collections::BinaryHeap::new();
        for (i, s) in sources.iter_mut().enumerate() {
            if let Some(e) = s.next() {
                heap.push(std::cmp::Reverse((e?, i)));
            }
        }
        Ok(Merged { sources, heap })
    }
}

impl<S: Iterator<Item = Result<Entry, FormatError>>> Iterator for Merged<S> {
    type Item = Result<Entry, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        let std::cmp::Reverse((e, i)) = self.heap.pop()?;
        match self.sources[i].next() {
            Some(Ok(next)) => self.heap.push(std::cmp::Reverse((next, i))),
            Some(Err(err)) => return Some(Err(err)),
            None => {}
        }
        Some(Ok(e))
    }
}

/// Calls `f` with the documents of every `(band, key)` that two or more
/// entries of the sorted stream `sorted` share, in increasing record index,
/// group after group in `(band, key)` order.
pub fn for_each_group(
    sorted: impl Iterator<Item = Result<Entry, FormatError>>,
    mut f: impl FnMut(&[u64]),
) -> Result<(), FormatError> {
    let mut group: Vec<u64> = Vec::new();
    let mut at = [u64::MAX; 2];
    for e in sorted {
        let e = e?;
        if [e[0], e[1]] != at {
            if group.len() > 1 {
                f(&group);
            }
            group.clear();
            at = [e[0], e[1]];
        }
        group.push(e[2]);
    }
    if group.len() > 1 {
        f(&group);
    }
    Ok(())
}

/// A spilled run, read back entry by entry.
struct RunReader {
    path: PathBuf,
    r: BufReader<File>,
}

impl RunReader {
    fn open(path: &Path) -> Result<RunReader, FormatError> {
        let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
        Ok(RunReader {
            path: path.into(),
            r: BufReader::with_capacity(1 << 20, file),
        })
    }
}

impl Iterator for RunReader {
    type Item = Result<Entry, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut b = [0u8; ENTRY_BYTES as usize];
        match self.r.read_exact(&mut b) {
            Ok(()) => Some(Ok(decode(&b))),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => None,
            Err(e) => Some(Err(FormatError::io(&self.path, e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spilled_runs_merge_into_the_groups_held_entries_give() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = 7u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let all: Vec<Entry> = (0..20_000u64)
            .map(|g| [next() % 3, next() % 500, g])
            .collect();
        let groups = |memory: u64| {
            let mut e = Entries::new(tmp.path(), memory, all.len() as u64);
            for x in &all {
                e.push(&[*x]).unwrap();
            }
            let runs = e.runs();
            let mut out = Vec::new();
            for_each_group(e.sorted().unwrap(), |g| out.push(g.to_vec())).unwrap();
            (runs, out)
        };
        let (none, held) = groups(u64::MAX / 2);
        let (runs, spilled) = groups(MIN_ENTRIES * ENTRY_BYTES);
        assert_eq!(none, 0);
        assert!(runs >= 4, "{runs}");
        assert_eq!(held, spilled);
        assert!(held
            .iter()
            .all(|g| g.len() > 1 && g.windows(2).all(|w| w[0] < w[1])));
    }
}
