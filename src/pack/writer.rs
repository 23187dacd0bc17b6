//! Rows into shards: each row's tokens go to the shard's `.bin`/`.idx`
//! (through [`DatasetWriter`]) and its pieces to the shard's `.seg`, written
//! when the shard is complete.
//!
//! Rows are assembled in batches, in parallel, and written in order, so the
//! output does not depend on the thread count. Tokens are read from the
//! input with positioned reads, not through its mapping: pages of a mapping
//! stay in the process's resident memory once touched (64 KiB around each
//! fault), and rows that pick documents at random would touch the whole
//! input. Resident memory stays that of a window's plan and one batch. The
//! reads go through the input's checks ([`Verified::reader`]): the first
//! piece read from a chunk of the input checks that chunk whole.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use xxhash_rust::xxh3::xxh3_64;

use super::bestfit::Piece;
use crate::format::{
    atomic_write, checksum_hex, DatasetWriter, Dtype, FormatError, SegWriter, Segment, ShardInfo,
    ShardPart, ShardReader, Verified,
};

/// Bytes of rows assembled in parallel before they are written in order
/// (two such batches are in memory: one being filled, one being written).
const BATCH_BYTES: u64 = 32 << 20;

/// What a row costs in a batch besides its tokens: its list of pieces and
/// the three buffers of its [`Row`], each with the allocator's overhead
/// (about 350 bytes measured over the two batches at `--seq-len 1`).
const ROW_OVERHEAD: u64 = 192;

/// Rows per batch for rows of `row_bytes`: at least one, however long, and
/// few enough that very short rows (`--seq-len 1`) do not make a batch of
/// millions whose bookkeeping outweighs their tokens many times over.
pub(crate) fn batch_rows(row_bytes: u64) -> u64 {
    (BATCH_BYTES / (row_bytes + ROW_OVERHEAD)).max(1)
}

/// Builds rows from pieces of the input's documents.
pub(crate) struct RowBuilder<'a> {
    input: &'a Verified<'a>,
    /// Rows read the input in its order (concat without a seed): each
    /// chunk is read once into a buffer, checked there and served from it,
    /// rather than checked in place and read again.
    in_order: bool,
    seq_len: u32,
    sep: Option<Vec<u8>>,
    pad: Vec<u8>,
}

/// One assembled row: its bytes, its pieces, and (from an input with loss
/// masks) its mask.
#[derive(Default)]
struct Row {
    bytes: Vec<u8>,
    segments: Vec<Segment>,
    mask: Vec<u8>,
}

/// The input `.bin` (and `.mask`) files one task reads, through the
/// input's checks: a chunk's first read checks it whole.
struct Files<'a> {
    input: &'a Verified<'a>,
    in_order: bool,
    open: HashMap<usize, ShardReader<'a, 'a>>,
    masks: HashMap<usize, ShardReader<'a, 'a>>,
}

impl Files<'_> {
    /// Appends tokens `from .. from + len` of record `doc` to `out`, as bytes.
    fn read(
        &mut self,
        doc: u64,
        from: u64,
        len: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), FormatError> {
        let (input, ds) = (self.input, self.input.dataset());
        let (s, local) = ds.locate(doc)?;
        let size = ds.dtype().size() as u64;
        let start = (ds.shard_offsets(s)[local] + from) * size;
        self.open
            .entry(s)
            .or_insert_with(|| input.reader(s, ShardPart::Bin, self.in_order))
            .read_append(start..start + len * size, out)
    }

    /// Appends the loss mask of tokens `from .. from + len` of record `doc`
    /// to `out`; the input has masks.
    fn read_mask(
        &mut self,
        doc: u64,
        from: u64,
        len: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), FormatError> {
        let (input, ds) = (self.input, self.input.dataset());
        let (s, local) = ds.locate(doc)?;
        let start = ds.shard_offsets(s)[local] + from;
        self.masks
            .entry(s)
            .or_insert_with(|| input.reader(s, ShardPart::Mask, self.in_order))
            .read_append(start..start + len, out)
    }
}

impl<'a> RowBuilder<'a> {
    pub(crate) fn new(
        input: &'a Verified<'a>,
        in_order: bool,
        seq_len: u32,
        sep: Option<u32>,
        pad: Option<u32>,
    ) -> RowBuilder<'a> {
        let dtype = input.dataset().dtype();
        let bytes = |id: u32| match dtype {
            Dtype::U16 => (id as u16).to_le_bytes().to_vec(),
            Dtype::U32 => id.to_le_bytes().to_vec(),
        };
        RowBuilder {
            input,
            in_order,
            seq_len,
            sep: sep.map(bytes),
            pad: pad.map(bytes).unwrap_or_default(),
        }
    }

    /// Row `pieces` (in order) followed by padding to `seq_len`; from an
    /// input with loss masks, the row's mask is its pieces' masks, with 0
    /// for separators and padding (never trained on).
    fn build(&self, pieces: &[Piece], files: &mut Files, row: &mut Row) -> Result<(), FormatError> {
        row.bytes.clear();
        row.segments.clear();
        row.mask.clear();
        let ds = self.input.dataset();
        let masked = ds.manifest().has_loss_mask();
        let mut at = 0u32;
        for p in pieces {
            let doc_len = ds.record_len(p.doc)?;
            let from = p.offset.min(doc_len);
            let to = (p.offset + u64::from(p.len)).min(doc_len);
            files.read(p.doc, from, to - from, &mut row.bytes)?;
            if masked {
                files.read_mask(p.doc, from, to - from, &mut row.mask)?;
            }
            if p.offset + u64::from(p.len) > doc_len {
                // The piece runs past the document's tokens: its separator.
                row.bytes
                    .extend_from_slice(self.sep.as_deref().expect("a separator was added"));
                if masked {
                    row.mask.push(0);
                }
            }
            row.segments.push(Segment {
                doc: p.doc,
                doc_offset: p.offset,
                start: at,
                length: p.len,
            });
            at += p.len;
        }
        let full = self.seq_len as usize * ds.dtype().size();
        if row.bytes.len() < full && self.pad.is_empty() {
            return Err(FormatError::Mismatch {
                path: ds.dir().into(),
                message: "a row shorter than seq_len needs a pad token".into(),
            });
        }
        while row.bytes.len() < full {
            row.bytes.extend_from_slice(&self.pad);
        }
        if masked {
            row.mask.resize(self.seq_len as usize, 0);
        }
        Ok(())
    }
}

/// Writes rows into shards with their segment indexes.
///
/// Each batch is assembled while the one before it is written: two buffers
/// of rows, one filled by the pool's threads, one drained by the writer.
pub(crate) struct PackWriter<'a> {
    builder: RowBuilder<'a>,
    pool: &'a rayon::ThreadPool,
    sink: Sink,
    /// Rows assembled and not yet written: `pending[..pending_len]`.
    pending: Vec<Row>,
    pending_len: usize,
    /// The buffer the next batch is assembled into.
    spare: Vec<Row>,
}

/// The writing side: shards, their segment indexes, and what is complete.
struct Sink {
    dir: PathBuf,
    inner: DatasetWriter,
    seq_len: u32,
    seg: SegWriter,
    /// Every completed shard, `.seg` included.
    shards: Vec<ShardInfo>,
}

impl<'a> PackWriter<'a> {
    /// A writer into `dir` that continues after the shards already `done`.
    pub(crate) fn new(
        builder: RowBuilder<'a>,
        pool: &'a rayon::ThreadPool,
        dir: &Path,
        shard_size: u64,
        done: Vec<ShardInfo>,
    ) -> PackWriter<'a> {
        let seq_len = builder.seq_len;
        PackWriter {
            sink: Sink {
                dir: dir.into(),
                inner: DatasetWriter::new(
                    dir,
                    builder.input.dataset().dtype(),
                    shard_size,
                    done.clone(),
                )
                .masked(builder.input.dataset().manifest().has_loss_mask()),
                seq_len,
                seg: SegWriter::new(seq_len),
                shards: done,
            },
            builder,
            pool,
            pending: Vec::new(),
            pending_len: 0,
            spare: Vec::new(),
        }
    }

    /// Assembles the rows of `batch` in parallel while writing the batch
    /// before it; `sealed` is called with every shard completed on the way.
    /// The rows of the last batch are written by [`PackWriter::finish`].
    pub(crate) fn write<P: AsRef<[Piece]> + Sync>(
        &mut self,
        batch: &[P],
        mut sealed: impl FnMut(&ShardInfo) -> Result<(), super::PackError> + Send,
    ) -> Result<(), super::PackError> {
        let n = batch.len();
        if self.spare.len() < n {
            self.spare.resize_with(n, Row::default);
        }
        let PackWriter {
            builder,
            pool,
            sink,
            pending,
            pending_len,
            spare,
        } = self;
        let threads = pool.current_num_threads().max(1);
        let (written, built) = pool.install(|| {
            rayon::join(
                || sink.write(&pending[..*pending_len], &mut sealed),
                || build_all(builder, &mut spare[..n], batch, threads),
            )
        });
        built?;
        written?;
        std::mem::swap(&mut self.pending, &mut self.spare);
        self.pending_len = n;
        Ok(())
    }

    /// Writes the last batch, completes the open shard and returns every
    /// shard, in order.
    pub(crate) fn finish(
        mut self,
        mut sealed: impl FnMut(&ShardInfo) -> Result<(), super::PackError> + Send,
    ) -> Result<Vec<ShardInfo>, super::PackError> {
        self.sink
            .write(&self.pending[..self.pending_len], &mut sealed)?;
        let sink = self.sink;
        let mut shards = sink.shards;
        let all = sink.inner.finish()?;
        if all.len() > shards.len() {
            let last = all.last().expect("one more than recorded").clone();
            shards.push(finish_shard(&sink.dir, sink.seg, last)?);
        }
        Ok(shards)
    }
}

/// Assembles `batch` into `rows`, in parallel chunks.
fn build_all<P: AsRef<[Piece]> + Sync>(
    builder: &RowBuilder,
    rows: &mut [Row],
    batch: &[P],
    threads: usize,
) -> Result<(), FormatError> {
    let chunk = batch.len().div_ceil(threads * 4).max(1);
    rows.par_chunks_mut(chunk)
        .zip(batch.par_chunks(chunk))
        .try_for_each(|(rows, pieces)| {
            let mut files = Files {
                input: builder.input,
                in_order: builder.in_order,
                open: HashMap::new(),
                masks: HashMap::new(),
            };
            rows.iter_mut()
                .zip(pieces)
                .try_for_each(|(row, p)| builder.build(p.as_ref(), &mut files, row))
        })
}

impl Sink {
    /// Writes `rows` in order, calling `sealed` with each shard as soon as
    /// it is complete (its `.seg` included), so that a journal lags no shard.
    fn write(
        &mut self,
        rows: &[Row],
        sealed: &mut (dyn FnMut(&ShardInfo) -> Result<(), super::PackError> + Send),
    ) -> Result<(), super::PackError> {
        for row in rows {
            let sealed_one = if self.inner.is_masked() {
                self.inner.push_raw_masked(&row.bytes, &row.mask)?
            } else {
                self.inner.push_raw(&row.bytes)?
            };
            if sealed_one.is_some() {
                let done = self.inner.shards().last().expect("just sealed").clone();
                let seg = std::mem::replace(&mut self.seg, SegWriter::new(self.seq_len));
                let info = finish_shard(&self.dir, seg, done)?;
                self.shards.push(info.clone());
                sealed(&info)?;
            }
            self.seg.push_row(&row.segments);
        }
        Ok(())
    }
}

/// Writes the `.seg` of a completed shard and adds it to the shard's entry.
fn finish_shard(dir: &Path, seg: SegWriter, mut info: ShardInfo) -> Result<ShardInfo, FormatError> {
    debug_assert_eq!(seg.n_rows(), info.n_records);
    let stem = info.bin.strip_suffix(".bin").unwrap_or(&info.bin);
    let name = format!("{stem}.seg");
    let bytes = seg.encode();
    atomic_write(&dir.join(&name), &bytes)?;
    info.seg = Some(name);
    info.seg_bytes = Some(bytes.len() as u64);
    info.seg_xxh3 = Some(checksum_hex(xxh3_64(&bytes)));
    Ok(info)
}
