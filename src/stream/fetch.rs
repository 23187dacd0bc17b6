//! Fetching one block of a packed dataset: the rows of the block, from the
//! one or two shards that hold them, each range read as one ranged GET of
//! the whole chunks that cover it and checked against the shard's `.sum`
//! before a byte of it is used.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::format::{ChunkSums, Files, Manifest, ShardInfo};

use super::StreamError;

/// The shards of a packed dataset, opened as they are first needed.
#[derive(Debug)]
pub(super) struct Source {
    files: Files,
    shards: Vec<ShardInfo>,
    /// Shard `s` holds rows `starts[s]..starts[s + 1]`.
    starts: Vec<u64>,
    row_bytes: u64,
    opened: Vec<Mutex<Option<Arc<OpenShard>>>>,
}

#[derive(Debug)]
struct OpenShard {
    bin: crate::format::File,
    sums: ChunkSums,
}

impl Source {
    /// The rows of `manifest`'s shards at `files`, `row_bytes` each.
    pub(super) fn new(files: Files, manifest: &Manifest, row_bytes: u64) -> Source {
        let mut starts = vec![0u64];
        for s in &manifest.shards {
            starts.push(starts[starts.len() - 1] + s.n_records);
        }
        Source {
            files,
            opened: manifest.shards.iter().map(|_| Mutex::new(None)).collect(),
            shards: manifest.shards.clone(),
            starts,
            row_bytes,
        }
    }

    /// Whether the shards are in object storage (else a local directory).
    pub(super) fn is_remote(&self) -> bool {
        self.files.is_remote()
    }

    /// The bytes of rows `rows`, checked chunk by chunk. A range whose
    /// check fails is fetched once more before it is an error.
    pub(super) fn rows(&self, rows: Range<u64>) -> Result<Vec<u8>, StreamError> {
        let mut out = Vec::with_capacity(((rows.end - rows.start) * self.row_bytes) as usize);
        let mut s = self.starts.partition_point(|&start| start <= rows.start) - 1;
        let mut at = rows.start;
        while at < rows.end {
            while self.starts[s + 1] <= at {
                s += 1;
            }
            let end = rows.end.min(self.starts[s + 1]);
            let local =
                (at - self.starts[s]) * self.row_bytes..(end - self.starts[s]) * self.row_bytes;
            self.read_checked(s, local, &mut out)?;
            at = end;
        }
        Ok(out)
    }

    fn read_checked(
        &self,
        s: usize,
        range: Range<u64>,
        out: &mut Vec<u8>,
    ) -> Result<(), StreamError> {
        let shard = self.open(s)?;
        let covering = shard.sums.covering(range.clone());
        let url = self
            .files
            .path_of(&self.shards[s].bin)
            .display()
            .to_string();
        let mut last = None;
        for _ in 0..2 {
            let bytes = shard.bin.read(covering.clone())?;
            match shard.sums.verify(covering.start, &bytes) {
                Ok(()) => {
                    let from = (range.start - covering.start) as usize;
                    out.extend_from_slice(&bytes[from..from + (range.end - range.start) as usize]);
                    return Ok(());
                }
                Err(bad) => last = Some(bad.to_string()),
            }
        }
        Err(StreamError::Corrupt {
            url,
            what: last.unwrap_or_default(),
        })
    }

    fn open(&self, s: usize) -> Result<Arc<OpenShard>, StreamError> {
        let mut slot = self.opened[s].lock().expect("no panic while held");
        if let Some(open) = slot.as_ref() {
            return Ok(Arc::clone(open));
        }
        let info = &self.shards[s];
        let sums = self.files.chunk_sums(s, info)?;
        let bin = self.files.open_required(&info.bin)?;
        let open = Arc::new(OpenShard { bin, sums });
        *slot = Some(Arc::clone(&open));
        Ok(open)
    }
}
