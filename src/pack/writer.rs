//! Rows into shards: each row's tokens go to the shard's `.bin`/`.idx`
//! (through [`DatasetWriter`]) and its pieces to the shard's `.seg`, written
//! when the shard is complete.

use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

use super::bestfit::Piece;
use crate::format::{
    atomic_write, checksum_hex, Dataset, DatasetWriter, Dtype, FormatError, SegWriter, Segment,
    ShardInfo,
};

/// Assembles rows from an input dataset's documents and writes them.
pub(crate) struct PackWriter<'a> {
    input: &'a Dataset,
    dir: PathBuf,
    inner: DatasetWriter,
    seq_len: u32,
    seg: SegWriter,
    /// Every completed shard, `.seg` included.
    shards: Vec<ShardInfo>,
    sep: Option<Vec<u8>>,
    pad: Vec<u8>,
    row: Vec<u8>,
    segments: Vec<Segment>,
}

impl<'a> PackWriter<'a> {
    /// A writer into `dir` that continues after the shards already `done`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        input: &'a Dataset,
        dir: &Path,
        dtype: Dtype,
        seq_len: u32,
        shard_size: u64,
        sep: Option<u32>,
        pad: Option<u32>,
        done: Vec<ShardInfo>,
    ) -> PackWriter<'a> {
        let bytes = |id: u32| match dtype {
            Dtype::U16 => (id as u16).to_le_bytes().to_vec(),
            Dtype::U32 => id.to_le_bytes().to_vec(),
        };
        PackWriter {
            input,
            dir: dir.into(),
            inner: DatasetWriter::new(dir, dtype, shard_size, done.clone()),
            seq_len,
            seg: SegWriter::new(seq_len),
            shards: done,
            sep: sep.map(bytes),
            pad: pad.map(bytes).unwrap_or_default(),
            row: Vec::with_capacity(seq_len as usize * dtype.size()),
            segments: Vec::new(),
        }
    }

    /// Writes one row made of `pieces` (in order) and padding to `seq_len`.
    /// Returns the shard completed to make room for it, if one was.
    pub(crate) fn push(&mut self, pieces: &[Piece]) -> Result<Option<&ShardInfo>, FormatError> {
        self.row.clear();
        self.segments.clear();
        let mut at = 0u32;
        for p in pieces {
            let bytes = self.input.record_bytes(p.doc)?;
            let size = self.input.dtype().size();
            let doc_len = (bytes.len() / size) as u64;
            let from = p.offset.min(doc_len) as usize;
            let to = (p.offset + u64::from(p.len)).min(doc_len) as usize;
            self.row.extend_from_slice(&bytes[from * size..to * size]);
            if p.offset + u64::from(p.len) > doc_len {
                // The piece runs past the document's tokens: its separator.
                self.row
                    .extend_from_slice(self.sep.as_deref().expect("a separator was added"));
            }
            self.segments.push(Segment {
                doc: p.doc,
                doc_offset: p.offset,
                start: at,
                length: p.len,
            });
            at += p.len;
        }
        let full = self.seq_len as usize * self.input.dtype().size();
        if self.row.len() < full && self.pad.is_empty() {
            return Err(FormatError::Mismatch {
                path: self.dir.clone(),
                message: "a row shorter than seq_len needs a pad token".into(),
            });
        }
        while self.row.len() < full {
            self.row.extend_from_slice(&self.pad);
        }
        let sealed = self.inner.push_raw(&self.row)?.is_some();
        if sealed {
            let done = self.inner.shards().last().expect("just sealed").clone();
            self.finish_shard(done)?;
        }
        self.seg.push_row(&self.segments);
        Ok(if sealed { self.shards.last() } else { None })
    }

    /// Writes the `.seg` of a completed shard and records it.
    fn finish_shard(&mut self, mut info: ShardInfo) -> Result<(), FormatError> {
        let seg = std::mem::replace(&mut self.seg, SegWriter::new(self.seq_len));
        debug_assert_eq!(seg.n_rows(), info.n_records);
        let stem = info.bin.strip_suffix(".bin").unwrap_or(&info.bin);
        let name = format!("{stem}.seg");
        let bytes = seg.encode();
        atomic_write(&self.dir.join(&name), &bytes)?;
        info.seg = Some(name);
        info.seg_bytes = Some(bytes.len() as u64);
        info.seg_xxh3 = Some(checksum_hex(xxh3_64(&bytes)));
        self.shards.push(info);
        Ok(())
    }

    /// Completes the open shard and returns every shard, in order.
    pub(crate) fn finish(mut self) -> Result<Vec<ShardInfo>, FormatError> {
        let dataset = std::mem::replace(
            &mut self.inner,
            DatasetWriter::new(&self.dir, Dtype::U16, 1, Vec::new()),
        );
        let all = dataset.finish()?;
        if all.len() > self.shards.len() {
            let last = all.last().expect("one more than recorded").clone();
            self.finish_shard(last)?;
        }
        Ok(self.shards)
    }
}
