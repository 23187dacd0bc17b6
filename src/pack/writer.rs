//! Rows into shards: each row's tokens go to the shard's `.bin`/`.idx`
//! (through [`DatasetWriter`]) and its pieces to the shard's `.seg`, written
//! when the shard is complete.
//!
//! Rows are assembled in batches, in parallel, and written in order, so the
//! output does not depend on the thread count. A row is assembled as a list
//! of borrowed pieces: its documents' tokens in the input's mapping (read
//! through the input's checks, [`Verified`]: the first piece read from a
//! chunk of the input checks that chunk whole, in place), separators, and
//! padding from a row of pad tokens. The writer copies the pieces into a
//! staging buffer, which it hashes and writes in long runs
//! ([`crate::format::Gathered`]): each token byte is copied twice, once
//! there and once into the page cache (no read copies it).
//!
//! The input's pages that rows touch stay in the process's resident memory
//! (shared with the page cache) until they are released: pack releases the
//! documents behind it where it reads the input in order (concat without a
//! seed, and each bestfit window once written), so what it holds is a
//! window's documents; concat with a seed reads rows anywhere in the input
//! and holds what it has touched.

use rayon::prelude::*;
use xxhash_rust::xxh3::Xxh3;

use super::bestfit::Piece;
use crate::format::{
    checksum_hex, AtomicFile, DatasetWriter, Dtype, FormatError, SegWriter, Segment, ShardInfo,
    Verified,
};
use std::path::{Path, PathBuf};

/// Bytes of rows assembled in parallel before they are written in order
/// (two such batches are in memory: one being filled, one being written).
const BATCH_BYTES: u64 = 32 << 20;

/// Rows ahead of the one being built or copied whose index entries or
/// pieces are fetched into the caches.
const PREFETCH_ROWS: usize = 2;

/// What a row costs in a batch besides its tokens: its list of pieces and
/// the three lists of its [`Row`], each with the allocator's overhead.
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
    seq_len: u32,
    sep: Option<Vec<u8>>,
    /// A row's worth of pad tokens (empty without a pad token): a row's
    /// padding is a slice of it.
    pad: Vec<u8>,
    /// A row's worth of zero mask bytes, for separators and padding.
    zeros: Vec<u8>,
}

/// One assembled row: its bytes and (from an input with loss masks) its
/// mask, as pieces borrowed from the input or the builder, and its pieces'
/// segments.
#[derive(Default)]
struct Row<'a> {
    bytes: Vec<&'a [u8]>,
    segments: Vec<Segment>,
    mask: Vec<&'a [u8]>,
}

impl<'a> RowBuilder<'a> {
    pub(crate) fn new(
        input: &'a Verified<'a>,
        seq_len: u32,
        sep: Option<u32>,
        pad: Option<u32>,
    ) -> RowBuilder<'a> {
        let dtype = input.dataset().dtype();
        let bytes = |id: u32| match dtype {
            Dtype::U16 => (id as u16).to_le_bytes().to_vec(),
            Dtype::U32 => id.to_le_bytes().to_vec(),
        };
        let masked = input.dataset().manifest().has_loss_mask();
        RowBuilder {
            input,
            seq_len,
            sep: sep.map(bytes),
            pad: pad.map_or_else(Vec::new, |p| bytes(p).repeat(seq_len as usize)),
            zeros: vec![0; if masked { seq_len as usize } else { 0 }],
        }
    }

    /// Fetches the index entries of `pieces` into the caches, for a row
    /// built a little later: each lies at a random place of the input's
    /// index, and reading it stalls the build otherwise.
    fn prefetch(&self, pieces: &[Piece]) {
        let ds = self.input.dataset();
        for p in pieces {
            if let Ok((s, local)) = ds.locate(p.doc) {
                crate::util::prefetch(&ds.shard_offsets(s)[local..]);
            }
        }
    }

    /// Row `pieces` (in order) followed by padding to `seq_len`; from an
    /// input with loss masks, the row's mask is its pieces' masks, with 0
    /// for separators and padding (never trained on).
    fn build(&'a self, pieces: &[Piece], row: &mut Row<'a>) -> Result<(), FormatError> {
        row.bytes.clear();
        row.segments.clear();
        row.mask.clear();
        let ds = self.input.dataset();
        let masked = ds.manifest().has_loss_mask();
        let size = ds.dtype().size();
        let (mut at, mut len) = (0u32, 0usize);
        for p in pieces {
            let tokens = self.input.record_bytes(p.doc)?;
            let doc_len = (tokens.len() / size) as u64;
            let from = p.offset.min(doc_len) as usize;
            let to = (p.offset + u64::from(p.len)).min(doc_len) as usize;
            row.bytes.push(&tokens[from * size..to * size]);
            len += (to - from) * size;
            if masked {
                let mask = self.input.loss_mask(p.doc)?.unwrap_or_default();
                row.mask.push(&mask[from..to]);
            }
            if p.offset + u64::from(p.len) > doc_len {
                // The piece runs past the document's tokens: its separator.
                let sep = self.sep.as_deref().expect("a separator was added");
                row.bytes.push(sep);
                len += sep.len();
                if masked {
                    row.mask.push(&self.zeros[..1]);
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
        let full = self.seq_len as usize * size;
        if len < full {
            if self.pad.is_empty() {
                return Err(FormatError::Mismatch {
                    path: ds.dir().into(),
                    message: "a row shorter than seq_len needs a pad token".into(),
                });
            }
            row.bytes.push(&self.pad[..full - len]);
            if masked {
                row.mask.push(&self.zeros[..(full - len) / size]);
            }
        }
        Ok(())
    }
}

/// Writes rows into shards with their segment indexes.
///
/// Each batch is assembled while the one before it is written: two buffers
/// of rows, one filled by the pool's threads, one drained by the writer.
pub(crate) struct PackWriter<'a> {
    builder: &'a RowBuilder<'a>,
    pool: &'a rayon::ThreadPool,
    sink: Sink,
    /// Rows assembled and not yet written: `pending[..pending_len]`.
    pending: Vec<Row<'a>>,
    pending_len: usize,
    /// The buffer the next batch is assembled into.
    spare: Vec<Row<'a>>,
    /// Documents whose pages leave the process's memory beside the next
    /// batch's assembly ([`PackWriter::release`]).
    to_release: std::ops::Range<u64>,
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
        builder: &'a RowBuilder<'a>,
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
            to_release: 0..0,
        }
    }

    /// Drops the pages of the input's documents `docs`, none of which a
    /// row still to be written holds, from the process's memory (they stay
    /// in the page cache). Done beside the next batch's assembly rather
    /// than between batches: unmapping a window's pages takes a while, and
    /// nothing waits for it.
    pub(crate) fn release(&mut self, docs: std::ops::Range<u64>) {
        self.to_release = if self.to_release.is_empty() {
            docs
        } else {
            self.to_release.start.min(docs.start)..self.to_release.end.max(docs.end)
        };
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
            to_release,
        } = self;
        let threads = pool.current_num_threads().max(1);
        let release = std::mem::replace(to_release, 0..0);
        let (written, built) = pool.install(|| {
            rayon::join(
                || sink.write(&pending[..*pending_len], &mut sealed),
                || {
                    builder.input.release_records(release);
                    build_all(builder, &mut spare[..n], batch, threads)
                },
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
fn build_all<'a, P: AsRef<[Piece]> + Sync>(
    builder: &'a RowBuilder<'a>,
    rows: &mut [Row<'a>],
    batch: &[P],
    threads: usize,
) -> Result<(), FormatError> {
    let chunk = batch.len().div_ceil(threads * 4).max(1);
    rows.par_chunks_mut(chunk)
        .zip(batch.par_chunks(chunk))
        .try_for_each(|(rows, pieces)| {
            rows.iter_mut().enumerate().try_for_each(|(i, row)| {
                if let Some(ahead) = pieces.get(i + PREFETCH_ROWS) {
                    builder.prefetch(ahead.as_ref());
                }
                builder.build(pieces[i].as_ref(), row)
            })
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
        let masked = self.inner.is_masked();
        let mut out = self.inner.gather();
        for (i, row) in rows.iter().enumerate() {
            // A row's pieces lie anywhere in the input: the start of each
            // piece two rows ahead is fetched while this one is copied.
            if let Some(ahead) = rows.get(i + PREFETCH_ROWS) {
                ahead
                    .bytes
                    .iter()
                    .for_each(|piece| crate::util::prefetch(piece));
            }
            let mask = masked.then_some(&row.mask[..]);
            if let Some(done) = out.push(&row.bytes, mask)?.cloned() {
                let seg = std::mem::replace(&mut self.seg, SegWriter::new(self.seq_len));
                let info = finish_shard(&self.dir, seg, done)?;
                self.shards.push(info.clone());
                sealed(&info)?;
            }
            self.seg.push_row(&row.segments);
        }
        Ok(out.finish()?)
    }
}

/// Writes the `.seg` of a completed shard and adds it to the shard's entry.
fn finish_shard(dir: &Path, seg: SegWriter, mut info: ShardInfo) -> Result<ShardInfo, FormatError> {
    debug_assert_eq!(seg.n_rows(), info.n_records);
    let stem = info.bin.strip_suffix(".bin").unwrap_or(&info.bin);
    let name = format!("{stem}.seg");
    // Streamed: a shard of short documents has an index of tens of MB.
    let mut file = AtomicFile::create(&dir.join(&name))?;
    let mut hash = Xxh3::new();
    seg.encode_into(|block| {
        hash.update(block);
        file.write(block)
    })?;
    info.seg_bytes = Some(file.bytes());
    file.commit()?;
    info.seg = Some(name);
    info.seg_xxh3 = Some(checksum_hex(hash.digest()));
    Ok(info)
}
