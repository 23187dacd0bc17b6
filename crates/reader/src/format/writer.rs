//! Writing shards and small files atomically: a temporary name in the target
//! directory, flushed to disk, then renamed into place.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use super::{
    checksum_hex, sum_chunk_bytes_to_write, ChunkHasher, ChunkSums, Dtype, FormatError, IdxHeader,
    ShardInfo, IDX_HEADER_LEN,
};

/// A writer of a file from its start that hands the file at most
/// [`MAX_WRITE`] bytes a call, each call ending at a multiple of
/// [`MAX_WRITE`] of the file where it can ([`write_piece`]): what a
/// [`BufWriter`] of a larger buffer writes through.
#[derive(Debug)]
pub struct Capped<W> {
    inner: W,
    /// Bytes written so far: where the next write lands.
    at: u64,
}

impl<W> Capped<W> {
    /// `inner`, a file written from its start.
    pub fn new(inner: W) -> Capped<W> {
        Capped { inner, at: 0 }
    }

    /// The file, back.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for Capped<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(write_piece(self.at, buf))?;
        self.at += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The first piece of `buf`, to be written at byte `at` of a file, that one
/// `write(2)` takes: up to the next multiple of [`MAX_WRITE`] of the file.
/// Pieces that start and end on those multiples fill the page cache's
/// memory for them whole; a piece that ends inside a piece of that memory
/// makes the kernel zero the rest of it first, only for the next write to
/// overwrite it.
pub fn write_piece(at: u64, buf: &[u8]) -> &[u8] {
    let room = MAX_WRITE - (at % MAX_WRITE as u64) as usize;
    &buf[..buf.len().min(room)]
}

/// Suffix of every file prep has not finished writing.
pub const TMP_SUFFIX: &str = ".tmp";
/// The write buffer of files written a little at a time (an index, a
/// mask): as large as one write may be.
const WRITE_BUFFER: usize = MAX_WRITE;
/// The most bytes prep hands one `write(2)` of a large file: longer runs
/// are written in pieces of this size. The kernel takes the page-cache
/// memory for a write in pieces as large as the write (large folios), and
/// on a virtual machine whose hypervisor takes back free memory (as the
/// benchmark VM's does) large pieces can cost several times more to come
/// by. Writing 1 GiB into a new file there (`tools/bench_write_size.py`,
/// five runs of each size at five times of a day) took 0.43 to 0.64 s of
/// system time in writes of 16 KiB every time, while writes of 64 KiB to
/// 4 MiB took 0.26 to 0.6 s at some times and 2 to 3 s at others, 256 KiB
/// included; `cp`, whose in-kernel copy fills the page cache a page at a
/// time, kept to about 0.4 s throughout. The calls themselves cost little:
/// 65,536 a GiB.
pub const MAX_WRITE: usize = 16 << 10;
/// Bytes of records [`Gathered`] copies together before it hashes and
/// writes them.
const STAGING_BYTES: usize = 1 << 20;
/// Bytes of a `.bin` written between two starts of their writeback.
const WRITEBACK_BYTES: u64 = 8 << 20;

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().expect("a file path").to_os_string();
    name.push(TMP_SUFFIX);
    path.with_file_name(name)
}

/// Writes `bytes` to `path` so that readers see the old file or the new one,
/// never a part: a temporary file in the same directory, fsync, rename.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<(), FormatError> {
    let mut file = AtomicFile::create(path)?;
    file.write(bytes)?;
    file.commit()
}

/// A file written under `NAME.tmp` beside its final path and renamed into
/// place by [`AtomicFile::commit`] (after an fsync of the file, then of the
/// directory, so the rename survives a crash). Dropped before its commit
/// (any error, a full disk), it removes the temporary file: readers see the
/// old file or the whole new one, and nothing half-written stays behind.
/// The one atomic writer of prep, for shards' small files and exports' large
/// ones alike.
pub struct AtomicFile {
    path: PathBuf,
    guard: TmpGuard,
    out: Option<BufWriter<Capped<File>>>,
    bytes: u64,
}

impl AtomicFile {
    /// Starts `path` as `path.tmp` (truncating a stale one).
    pub fn create(path: &Path) -> Result<AtomicFile, FormatError> {
        let tmp = tmp_path(path);
        let file = File::create(&tmp).map_err(|e| FormatError::io(&tmp, e))?;
        Ok(AtomicFile {
            path: path.into(),
            guard: TmpGuard { paths: vec![tmp] },
            out: Some(BufWriter::with_capacity(WRITE_BUFFER, Capped::new(file))),
            bytes: 0,
        })
    }

    fn tmp(&self) -> &Path {
        &self.guard.paths[0]
    }

    /// Appends `bytes`.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), FormatError> {
        let out = self.out.as_mut().expect("open until closed");
        if let Err(e) = out.write_all(bytes) {
            return Err(FormatError::io(self.tmp(), e));
        }
        self.bytes += bytes.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Flushes, syncs and closes the file, which keeps its temporary name
    /// (and is still removed on drop) until [`AtomicFile::commit`]: several
    /// files that must appear together are closed first, then committed.
    pub fn close(&mut self) -> Result<(), FormatError> {
        if let Some(out) = self.out.take() {
            let file = out
                .into_inner()
                .map_err(|e| FormatError::io(self.tmp(), e.into_error()))?
                .into_inner();
            file.sync_all()
                .map_err(|e| FormatError::io(self.tmp(), e))?;
        }
        Ok(())
    }

    /// Closes the file if open and renames it into place, durably.
    pub fn commit(mut self) -> Result<(), FormatError> {
        self.close()?;
        std::fs::rename(self.tmp(), &self.path).map_err(|e| FormatError::io(&self.path, e))?;
        self.guard.paths.clear();
        sync_dir(&self.path)
    }
}

/// Asks the kernel to start writing bytes `range` of `file` to disk, and
/// returns without waiting (Linux's `sync_file_range` with
/// `SYNC_FILE_RANGE_WRITE`; nothing elsewhere). Best effort: the fsync
/// that ends the file is what makes it durable.
fn start_writeback(file: &File, range: std::ops::Range<u64>) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(start), Ok(len)) = (
            libc::off64_t::try_from(range.start),
            libc::off64_t::try_from(range.end - range.start),
        ) else {
            return;
        };
        // SAFETY: the descriptor is `file`'s, open for the whole call; the
        // call reads and writes no memory of this process, only starts I/O
        // of the file's dirty pages in the range.
        let _ = unsafe {
            libc::sync_file_range(file.as_raw_fd(), start, len, libc::SYNC_FILE_RANGE_WRITE)
        };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, range);
}

/// Makes a rename durable: fsync the directory that holds `path`.
fn sync_dir(path: &Path) -> Result<(), FormatError> {
    #[cfg(unix)]
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| FormatError::io(dir, e))?;
    }
    Ok(())
}

/// Writes one shard: records are appended to `STEM.bin.tmp` and
/// `STEM.idx.tmp`, and the `.bin` is hashed whole and a chunk of
/// [`CHUNK_BYTES`](super::CHUNK_BYTES) (or what [`SUM_CHUNK_VAR`](super::SUM_CHUNK_VAR) says) at a time as it goes; [`ShardWriter::finish`] writes the
/// index header and `STEM.sum` (the chunks' checksums), checksums the files
/// and renames them into place.
pub struct ShardWriter {
    /// The `.bin` while a thread of its own writes it (see [`Pipe`]):
    /// first, so that a shard dropped unfinished stops that thread before
    /// its temporary files go.
    pipe: Option<Pipe>,
    /// Removes the temporary files if the shard is dropped unfinished (an
    /// error, or a bad document that stops the run).
    guard: TmpGuard,
    bin_path: PathBuf,
    idx_path: PathBuf,
    sum_path: PathBuf,
    /// The `.bin`; `None` while [`ShardWriter::pipe`] has it.
    bin: Option<BinFile>,
    /// The `.bin`'s hashes, of what was appended to it.
    hash: BinHash,
    idx: BufWriter<File>,
    dtype: Dtype,
    n_records: u64,
    n_tokens: u64,
    scratch: Vec<u8>,
    /// The loss mask of a masked shard (see [`ShardWriter::create_masked`]).
    mask: Option<MaskFile>,
}

/// A shard's `.bin` being written: the file, and how far its writeback
/// was started.
struct BinFile {
    out: BufWriter<File>,
    /// Bytes appended (in the file or its buffer).
    len: u64,
    /// Bytes whose writeback to disk has been started.
    written_back: u64,
}

/// The hashes of a shard's `.bin`, the whole file's XXH3 and its chunks',
/// taken by the thread that appends (not by the writer thread, which the
/// kernel's copy keeps busy enough).
struct BinHash {
    whole: Xxh3,
    chunks: ChunkHasher,
    /// The checksums of the complete chunks so far (8 bytes per MiB).
    sums: Vec<u64>,
}

impl BinHash {
    /// Hashes `bytes`, the next the `.bin` holds: both hashes a piece of
    /// [`MAX_WRITE`] at a time, so the second reads it from the cache.
    fn update(&mut self, bytes: &[u8]) {
        for piece in bytes.chunks(MAX_WRITE) {
            self.whole.update(piece);
            let sums = &mut self.sums;
            self.chunks.update(piece, |_, sum| sums.push(sum));
        }
    }
}

impl BinFile {
    /// Appends `bytes` (a record) through the write buffer.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.len() >= self.out.capacity() {
            // What the buffer would pass through whole.
            return self.append_run(bytes);
        }
        self.out.write_all(bytes)?;
        self.appended(bytes.len());
        Ok(())
    }

    /// Appends `bytes` (a long run) straight to the file, after what the
    /// write buffer holds, in writes of at most [`MAX_WRITE`]
    /// ([`write_piece`]).
    fn append_run(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.out.flush()?;
        let mut rest = bytes;
        let mut at = self.len;
        while !rest.is_empty() {
            let piece = write_piece(at, rest);
            self.out.get_mut().write_all(piece)?;
            at += piece.len() as u64;
            rest = &rest[piece.len()..];
        }
        self.appended(bytes.len());
        Ok(())
    }

    /// Counts `n` bytes just appended, and starts the writeback to disk of
    /// what the file holds past the last start, every [`WRITEBACK_BYTES`]:
    /// the disk writes while the stage works on, and the fsync that ends
    /// the shard finds little left to wait for, where otherwise it would
    /// wait for the whole shard (the kernel starts on its own only past a
    /// share of the machine's memory). Best effort: a refusal leaves it to
    /// the fsync.
    fn appended(&mut self, n: usize) {
        self.len += n as u64;
        // What reached the file: what was appended, less what the buffer holds.
        let in_file = self.len - self.out.buffer().len() as u64;
        if in_file - self.written_back >= WRITEBACK_BYTES {
            start_writeback(self.out.get_ref(), self.written_back..in_file);
            self.written_back = in_file;
        }
    }
}

/// Runs staged by [`Gathered`] queued for a shard's writer thread at most:
/// the stage fills the next while the thread writes these.
const PIPE_DEPTH: usize = 4;

/// The staging buffers of one [`DatasetWriter`], shared with its shards'
/// writer threads, which put each back once written: a handful, made once
/// and reused for every run of every shard. (Buffers dropped and made
/// again cost the kernel a fresh, zeroed page for each of their pages:
/// measured at a quarter of a pack's time when each batch of rows made
/// its own.)
#[derive(Clone, Default)]
struct Buffers(std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

impl Buffers {
    /// An empty buffer of [`STAGING_BYTES`]: one put back, or a new one.
    fn take(&self) -> Vec<u8> {
        let spare = self.0.lock().unwrap_or_else(|e| e.into_inner()).pop();
        spare.unwrap_or_else(|| Vec::with_capacity(STAGING_BYTES))
    }

    /// Keeps `buf`, emptied, for the next [`Buffers::take`].
    fn put(&self, mut buf: Vec<u8>) {
        buf.clear();
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(buf);
    }
}

/// A shard's `.bin` handed to a thread of its own while [`Gathered`]
/// stages runs for it: the thread writes each run (the kernel's copy into
/// the page cache, and the start of its writeback) while the stage copies
/// the next run's records out of its inputs and hashes it, so the two
/// halves of a byte's journey run on two cores. (The kernel's half is the
/// larger: with the hashes on the writer thread too, that thread was the
/// one every pack waited for.) Runs are hashed and written in the order
/// sent, so the file and its hashes are the ones one thread makes. At most
/// [`PIPE_DEPTH`] runs wait; each buffer goes back to the writer's
/// [`Buffers`] once written.
struct Pipe {
    to: Option<std::sync::mpsc::SyncSender<Vec<u8>>>,
    /// Set by the thread when a write fails: what is sent after is dropped.
    failed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<(BinFile, std::io::Result<()>)>>,
}

impl Pipe {
    fn start(mut bin: BinFile, buffers: Buffers) -> std::io::Result<Pipe> {
        use std::sync::atomic::Ordering;
        let (to, runs) = std::sync::mpsc::sync_channel::<Vec<u8>>(PIPE_DEPTH);
        let failed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = failed.clone();
        let thread = std::thread::Builder::new()
            .name("prep-shard-writer".into())
            .spawn(move || {
                let mut written = Ok(());
                for run in runs {
                    if written.is_ok() {
                        written = bin.append_run(&run);
                        if written.is_err() {
                            flag.store(true, Ordering::Release);
                        }
                    }
                    buffers.put(run);
                }
                (bin, written)
            })?;
        Ok(Pipe {
            to: Some(to),
            failed,
            thread: Some(thread),
        })
    }

    /// Sends `run` to be written (waiting while [`PIPE_DEPTH`]
    /// runs wait); false once the thread has failed (joining it tells why).
    fn send(&mut self, run: Vec<u8>) -> bool {
        if self.failed.load(std::sync::atomic::Ordering::Acquire) {
            return false;
        }
        self.to.as_ref().is_some_and(|to| to.send(run).is_ok())
    }

    /// Waits for every run sent to be written; the `.bin` back, and the
    /// first write that failed, if one did.
    fn join(mut self) -> (BinFile, std::io::Result<()>) {
        self.to = None;
        let thread = self.thread.take().expect("joined once");
        match thread.join() {
            Ok(done) => done,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Pipe {
    /// A pipe dropped unjoined (its shard abandoned) still waits for its
    /// thread, so that nothing writes to the shard's files after.
    fn drop(&mut self) {
        self.to = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A shard's `.mask` being written: one byte per token, hashed as it goes.
struct MaskFile {
    path: PathBuf,
    out: BufWriter<File>,
    hash: Xxh3,
    bytes: u64,
}

impl ShardWriter {
    /// Starts shard `STEM` in `dir`, with tokens of `dtype`.
    pub fn create(dir: &Path, stem: &str, dtype: Dtype) -> Result<ShardWriter, FormatError> {
        Self::create_with(dir, stem, dtype, false)
    }

    /// Starts shard `STEM` with a loss mask (`STEM.mask`): every record is
    /// then pushed with [`ShardWriter::push_masked`].
    pub fn create_masked(dir: &Path, stem: &str, dtype: Dtype) -> Result<ShardWriter, FormatError> {
        Self::create_with(dir, stem, dtype, true)
    }

    fn create_with(
        dir: &Path,
        stem: &str,
        dtype: Dtype,
        masked: bool,
    ) -> Result<ShardWriter, FormatError> {
        let bin_path = dir.join(format!("{stem}.bin"));
        let idx_path = dir.join(format!("{stem}.idx"));
        let sum_path = dir.join(format!("{stem}.sum"));
        let open = |path: &Path| {
            let tmp = tmp_path(path);
            // Read access too: the index is read back to checksum it.
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .map(|f| BufWriter::with_capacity(WRITE_BUFFER, f))
                .map_err(|e| FormatError::io(&tmp, e))
        };
        let bin = open(&bin_path)?;
        let mut idx = open(&idx_path)?;
        // The header's counts are known only at the end: write a placeholder
        // now and the real header in `finish`, so offsets stream to disk and
        // memory does not grow with the number of records.
        let mut first = [0u8; IDX_HEADER_LEN + 8];
        first[..8].copy_from_slice(b"PREPTMP\0");
        idx.write_all(&first)
            .map_err(|e| FormatError::io(tmp_path(&idx_path), e))?;
        let mut tmps = vec![
            tmp_path(&bin_path),
            tmp_path(&idx_path),
            tmp_path(&sum_path),
        ];
        let mask = if masked {
            let path = dir.join(format!("{stem}.mask"));
            tmps.push(tmp_path(&path));
            Some(MaskFile {
                out: open(&path)?,
                path,
                hash: Xxh3::new(),
                bytes: 0,
            })
        } else {
            None
        };
        Ok(ShardWriter {
            pipe: None,
            guard: TmpGuard { paths: tmps },
            bin_path,
            idx_path,
            sum_path,
            bin: Some(BinFile {
                out: bin,
                len: 0,
                written_back: 0,
            }),
            hash: BinHash {
                whole: Xxh3::new(),
                chunks: ChunkHasher::new(sum_chunk_bytes_to_write()),
                sums: Vec::new(),
            },
            idx,
            dtype,
            n_records: 0,
            n_tokens: 0,
            scratch: Vec::new(),
            mask,
        })
    }

    /// Appends one record and its loss mask (one 0 or 1 per token) to a
    /// shard made by [`ShardWriter::create_masked`].
    pub fn push_masked(&mut self, tokens: &[u32], mask: &[u8]) -> Result<(), FormatError> {
        self.write_mask(tokens.len(), mask)?;
        self.push_unmasked(tokens)
    }

    /// Appends one record given as little-endian bytes (as
    /// [`ShardWriter::push_raw`] takes it) and its loss mask.
    pub fn push_raw_masked(&mut self, bytes: &[u8], mask: &[u8]) -> Result<(), FormatError> {
        self.write_mask(bytes.len() / self.dtype.size(), mask)?;
        self.write_record(bytes)
    }

    /// Writes the mask of a record of `n_tokens` tokens.
    fn write_mask(&mut self, n_tokens: usize, mask: &[u8]) -> Result<(), FormatError> {
        let bin_path = &self.bin_path;
        let Some(file) = self.mask.as_mut() else {
            return Err(FormatError::Mismatch {
                path: bin_path.clone(),
                message: "a loss mask pushed into a shard without one".into(),
            });
        };
        if mask.len() != n_tokens || mask.iter().any(|&m| m > 1) {
            return Err(FormatError::Mismatch {
                path: file.path.clone(),
                message: format!(
                    "a record of {n_tokens} tokens needs as many mask bytes, each 0 or 1 (got {})",
                    mask.len()
                ),
            });
        }
        file.out
            .write_all(mask)
            .map_err(|e| FormatError::io(tmp_path(&file.path), e))?;
        file.hash.update(mask);
        file.bytes += mask.len() as u64;
        Ok(())
    }

    /// Appends one record.
    ///
    /// An id that does not fit the shard's dtype is an error: ids are never
    /// truncated. A masked shard takes its records with their masks only.
    pub fn push(&mut self, tokens: &[u32]) -> Result<(), FormatError> {
        if self.mask.is_some() {
            return Err(FormatError::Mismatch {
                path: self.bin_path.clone(),
                message: "a record without its loss mask pushed into a masked shard".into(),
            });
        }
        self.push_unmasked(tokens)
    }

    fn push_unmasked(&mut self, tokens: &[u32]) -> Result<(), FormatError> {
        self.scratch.clear();
        match self.dtype {
            Dtype::U16 => {
                self.scratch.reserve(tokens.len() * 2);
                for &t in tokens {
                    let t = u16::try_from(t).map_err(|_| FormatError::Mismatch {
                        path: self.bin_path.clone(),
                        message: format!("token id {t} does not fit uint16"),
                    })?;
                    self.scratch.extend_from_slice(&t.to_le_bytes());
                }
            }
            Dtype::U32 => {
                self.scratch.reserve(tokens.len() * 4);
                for &t in tokens {
                    self.scratch.extend_from_slice(&t.to_le_bytes());
                }
            }
        }
        let scratch = std::mem::take(&mut self.scratch);
        let result = self.write_record(&scratch);
        self.scratch = scratch;
        result
    }

    /// Appends one record given as its little-endian bytes in the shard's
    /// dtype, as another dataset's `.bin` holds them: no decoding, no copy.
    ///
    /// The length must be a multiple of the token size.
    pub fn push_raw(&mut self, bytes: &[u8]) -> Result<(), FormatError> {
        if self.mask.is_some() {
            return Err(FormatError::Mismatch {
                path: self.bin_path.clone(),
                message: "a record without its loss mask pushed into a masked shard".into(),
            });
        }
        self.write_record(bytes)
    }

    fn write_record(&mut self, bytes: &[u8]) -> Result<(), FormatError> {
        let size = self.dtype.size();
        if !bytes.len().is_multiple_of(size) {
            return Err(FormatError::Mismatch {
                path: self.bin_path.clone(),
                message: format!(
                    "a record of {} bytes is not whole {} tokens",
                    bytes.len(),
                    self.dtype
                ),
            });
        }
        self.bin()?
            .append(bytes)
            .map_err(|e| FormatError::io(tmp_path(&self.bin_path), e))?;
        self.hash.update(bytes);
        self.n_tokens += (bytes.len() / size) as u64;
        self.n_records += 1;
        self.idx
            .write_all(&self.n_tokens.to_le_bytes())
            .map_err(|e| FormatError::io(tmp_path(&self.idx_path), e))
    }

    /// The `.bin`, taken back from its thread first if it has one (which
    /// has then written everything sent to it); the error that stopped
    /// that thread, if one did.
    fn bin(&mut self) -> Result<&mut BinFile, FormatError> {
        if let Some(pipe) = self.pipe.take() {
            let (bin, written) = pipe.join();
            self.bin = Some(bin);
            written.map_err(|e| FormatError::io(tmp_path(&self.bin_path), e))?;
        }
        Ok(self
            .bin
            .as_mut()
            .expect("the .bin is here once its thread is joined"))
    }

    /// Starts one record of `bytes` bytes whose bytes the caller stages and
    /// sends itself ([`ShardWriter::send_staged`], see [`Gathered`]):
    /// checks it, writes its mask (in pieces, in a masked shard) and its
    /// index entry.
    fn begin_record(&mut self, bytes: usize, mask: Option<&[&[u8]]>) -> Result<(), FormatError> {
        let size = self.dtype.size();
        if !bytes.is_multiple_of(size) {
            return Err(FormatError::Mismatch {
                path: self.bin_path.clone(),
                message: format!(
                    "a record of {bytes} bytes is not whole {} tokens",
                    self.dtype
                ),
            });
        }
        let mismatch = |message: &str| FormatError::Mismatch {
            path: self.bin_path.clone(),
            message: message.into(),
        };
        match (mask, self.mask.is_some()) {
            (Some(mask), true) => {
                let n: usize = mask.iter().map(|m| m.len()).sum();
                if n != bytes / size {
                    return Err(mismatch(&format!(
                        "a record of {} tokens needs as many mask bytes (got {n})",
                        bytes / size
                    )));
                }
                for piece in mask {
                    self.write_mask(piece.len(), piece)?;
                }
            }
            (None, false) => {}
            (Some(_), false) => {
                return Err(mismatch("a loss mask pushed into a shard without one"))
            }
            (None, true) => {
                return Err(mismatch(
                    "a record without its loss mask pushed into a masked shard",
                ))
            }
        }
        self.n_tokens += (bytes / size) as u64;
        self.n_records += 1;
        self.idx
            .write_all(&self.n_tokens.to_le_bytes())
            .map_err(|e| FormatError::io(tmp_path(&self.idx_path), e))
    }

    /// Hands `run` (bytes of records [`ShardWriter::begin_record`]
    /// started, in order) to the `.bin`'s thread, started on the first
    /// run, to be hashed and written after what came before, and then put
    /// back into `buffers`.
    fn send_staged(&mut self, run: Vec<u8>, buffers: &Buffers) -> Result<(), FormatError> {
        let tmp = tmp_path(&self.bin_path);
        let io = |e| FormatError::io(&tmp, e);
        if self.pipe.is_none() {
            let bin = self.bin.take().expect("the .bin is here without a thread");
            self.pipe = Some(Pipe::start(bin, buffers.clone()).map_err(io)?);
        }
        self.hash.update(&run);
        if self.pipe.as_mut().is_some_and(|p| p.send(run)) {
            return Ok(());
        }
        // The thread stopped: joining it tells why.
        self.bin()?;
        Err(io(std::io::Error::other(
            "the shard's writer thread stopped",
        )))
    }

    /// Records written so far.
    pub fn n_records(&self) -> u64 {
        self.n_records
    }

    /// Bytes of the `.bin` so far.
    pub fn bin_bytes(&self) -> u64 {
        self.n_tokens * self.dtype.size() as u64
    }

    /// Writes the index header and the `.sum`, syncs, checksums and
    /// renames the files into place.
    pub fn finish(mut self) -> Result<ShardInfo, FormatError> {
        self.bin()?;
        let BinFile { out, .. } = self.bin.take().expect("taken back above");
        let BinHash {
            whole,
            chunks,
            sums: mut chunk_sums,
        } = self.hash;
        let bin_tmp = tmp_path(&self.bin_path);
        let idx_tmp = tmp_path(&self.idx_path);
        let sum_tmp = tmp_path(&self.sum_path);
        let bin = out
            .into_inner()
            .map_err(|e| FormatError::io(&bin_tmp, e.into_error()))?;
        bin.sync_all().map_err(|e| FormatError::io(&bin_tmp, e))?;
        // Every record's bytes reached the file (a gathered write left
        // unfinished would leave them short of what was hashed).
        let written = bin
            .metadata()
            .map_err(|e| FormatError::io(&bin_tmp, e))?
            .len();
        let expected = self.n_tokens * self.dtype.size() as u64;
        if written != expected {
            return Err(FormatError::Mismatch {
                path: bin_tmp,
                message: format!("wrote {written} token bytes, expected {expected}"),
            });
        }
        let mut idx = self
            .idx
            .into_inner()
            .map_err(|e| FormatError::io(&idx_tmp, e.into_error()))?;
        let header = IdxHeader {
            dtype: self.dtype,
            n_records: self.n_records,
            n_tokens: self.n_tokens,
        };
        let io = |e| FormatError::io(&idx_tmp, e);
        idx.seek(SeekFrom::Start(0)).map_err(io)?;
        idx.write_all(&header.encode()).map_err(io)?;
        idx.sync_all().map_err(io)?;
        // The index is small (8 bytes a record): hashing it by reading it back
        // is cheaper than holding its offsets in memory.
        idx.seek(SeekFrom::Start(0)).map_err(io)?;
        let (idx_xxh3, idx_bytes) = hash_reader(&mut idx).map_err(io)?;
        let expected = IdxHeader::file_len(self.n_records).expect("a written index fits a u64");
        if idx_bytes != expected {
            return Err(FormatError::Mismatch {
                path: idx_tmp,
                message: format!("wrote {idx_bytes} index bytes, expected {expected}"),
            });
        }
        let chunk_bytes = chunks.chunk_bytes();
        chunks.finish(|_, sum| chunk_sums.push(sum));
        let sum = ChunkSums::encode(chunk_bytes, &chunk_sums);
        write_synced(&sum_tmp, &sum)?;
        let mask = self.mask.map(MaskFile::finish).transpose()?;
        let mut guard = self.guard;
        let mut renames = vec![
            (bin_tmp, self.bin_path.clone()),
            (idx_tmp, self.idx_path.clone()),
            (sum_tmp, self.sum_path.clone()),
        ];
        if let Some((path, _, _)) = &mask {
            renames.push((tmp_path(path), path.clone()));
        }
        for (tmp, path) in &renames {
            std::fs::rename(tmp, path).map_err(|e| FormatError::io(path, e))?;
        }
        guard.paths.clear();
        sync_dir(&self.idx_path)?;
        let name = |p: &Path| {
            p.file_name()
                .expect("a file")
                .to_string_lossy()
                .into_owned()
        };
        Ok(ShardInfo {
            bin: name(&self.bin_path),
            idx: name(&self.idx_path),
            n_records: self.n_records,
            n_tokens: self.n_tokens,
            bin_bytes: self.n_tokens * self.dtype.size() as u64,
            idx_bytes,
            bin_xxh3: checksum_hex(whole.digest()),
            idx_xxh3: checksum_hex(idx_xxh3),
            seg: None,
            seg_bytes: None,
            seg_xxh3: None,
            sum: Some(name(&self.sum_path)),
            sum_bytes: Some(sum.len() as u64),
            sum_xxh3: Some(checksum_hex(xxhash_rust::xxh3::xxh3_64(&sum))),
            mask: mask.as_ref().map(|(path, _, _)| name(path)),
            mask_bytes: mask.as_ref().map(|&(_, bytes, _)| bytes),
            mask_xxh3: mask.map(|(_, _, xxh3)| checksum_hex(xxh3)),
        })
    }
}

impl MaskFile {
    /// Flushes and syncs the temporary file: its final path, size and hash.
    fn finish(self) -> Result<(PathBuf, u64, u64), FormatError> {
        let tmp = tmp_path(&self.path);
        let file = self
            .out
            .into_inner()
            .map_err(|e| FormatError::io(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| FormatError::io(&tmp, e))?;
        Ok((self.path, self.bytes, self.hash.digest()))
    }
}

/// Writes `bytes` to `path` (a temporary name) and syncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), FormatError> {
    let io = |e| FormatError::io(path, e);
    let mut file = File::create(path).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)
}

/// Deletes its files when dropped, unless cleared first.
struct TmpGuard {
    paths: Vec<PathBuf>,
}

impl Drop for TmpGuard {
    fn drop(&mut self) {
        for path in &self.paths {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// XXH3-64 and length of everything `reader` yields.
pub fn hash_reader(reader: &mut impl Read) -> std::io::Result<(u64, u64)> {
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; WRITE_BUFFER];
    let mut len = 0u64;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok((hasher.digest(), len)),
            Ok(n) => {
                hasher.update(&buf[..n]);
                len += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// XXH3-64 and length of a file.
pub fn hash_file(path: &Path) -> Result<(u64, u64), FormatError> {
    let mut file = File::open(path).map_err(|e| FormatError::io(path, e))?;
    hash_reader(&mut file).map_err(|e| FormatError::io(path, e))
}

/// Writes records into consecutive shards `shard-NNNNN`, cutting a new shard
/// before a record that would take the current `.bin` past `shard_size` bytes.
pub struct DatasetWriter {
    dir: PathBuf,
    dtype: Dtype,
    /// Shards carry loss masks.
    masked: bool,
    shard_size: u64,
    shards: Vec<ShardInfo>,
    current: Option<ShardWriter>,
    /// The staging buffers of [`Gathered`] records, made once.
    buffers: Buffers,
}

impl DatasetWriter {
    /// A writer into `dir` that continues after the shards already `done`
    /// (empty for a fresh dataset; a resumed run passes the shards it kept).
    pub fn new(dir: &Path, dtype: Dtype, shard_size: u64, done: Vec<ShardInfo>) -> DatasetWriter {
        DatasetWriter {
            dir: dir.into(),
            dtype,
            masked: false,
            shard_size: shard_size.max(1),
            shards: done,
            current: None,
            buffers: Buffers::default(),
        }
    }

    /// The same writer making shards with loss masks: records are then
    /// pushed with [`DatasetWriter::push_masked`].
    pub fn masked(mut self, masked: bool) -> DatasetWriter {
        self.masked = masked;
        self
    }

    /// The token type of the shards.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Whether the shards carry loss masks.
    pub fn is_masked(&self) -> bool {
        self.masked
    }

    /// Appends one record and its loss mask; returns the shard completed to
    /// make room for it, if one was.
    pub fn push_masked(
        &mut self,
        tokens: &[u32],
        mask: &[u8],
    ) -> Result<Option<&ShardInfo>, FormatError> {
        let bytes = tokens.len() as u64 * self.dtype.size() as u64;
        self.append(bytes, |shard| shard.push_masked(tokens, mask))
    }

    /// Appends one record as little-endian bytes with its loss mask;
    /// returns the shard completed to make room for it, if one was.
    pub fn push_raw_masked(
        &mut self,
        bytes: &[u8],
        mask: &[u8],
    ) -> Result<Option<&ShardInfo>, FormatError> {
        self.append(bytes.len() as u64, |shard| {
            shard.push_raw_masked(bytes, mask)
        })
    }

    /// Appends record `index` of `ds` as it is: its bytes, and its loss
    /// mask when this writer's shards carry masks (both or neither must),
    /// each read through `ds`'s checks; returns the shard completed to
    /// make room for it, if one was.
    pub fn push_record(
        &mut self,
        ds: &super::Verified<'_>,
        index: u64,
    ) -> Result<Option<&ShardInfo>, FormatError> {
        let bytes = ds.record_bytes(index)?;
        match (ds.loss_mask(index)?, self.masked) {
            (Some(mask), true) => self.push_raw_masked(bytes, mask),
            (None, false) => self.push_raw(bytes),
            (mask, _) => Err(FormatError::Mismatch {
                path: ds.dataset().dir().into(),
                message: format!(
                    "record {index} {} a loss mask, and the dataset it is written to {}",
                    if mask.is_some() { "has" } else { "has no" },
                    if self.masked { "has them" } else { "has none" }
                ),
            }),
        }
    }

    /// The file stem of shard number `n`.
    pub fn shard_stem(n: usize) -> String {
        format!("shard-{n:05}")
    }

    /// Appends one record. Returns the shard that was completed to make room
    /// for it, if one was: that shard and all before it are final on disk.
    pub fn push(&mut self, tokens: &[u32]) -> Result<Option<&ShardInfo>, FormatError> {
        let bytes = tokens.len() as u64 * self.dtype.size() as u64;
        self.append(bytes, |shard| shard.push(tokens))
    }

    /// Appends one record given as little-endian bytes of the dataset's dtype
    /// (see [`ShardWriter::push_raw`]); returns the shard completed to make
    /// room for it, if one was.
    pub fn push_raw(&mut self, bytes: &[u8]) -> Result<Option<&ShardInfo>, FormatError> {
        self.append(bytes.len() as u64, |shard| shard.push_raw(bytes))
    }

    /// Cuts a new shard if a record of `bytes` would overflow the current one,
    /// then lets `write` append it.
    fn append(
        &mut self,
        bytes: u64,
        write: impl FnOnce(&mut ShardWriter) -> Result<(), FormatError>,
    ) -> Result<Option<&ShardInfo>, FormatError> {
        let sealed = self.full_for(bytes);
        if sealed {
            self.seal()?;
        }
        write(self.current()?)?;
        Ok(if sealed { self.shards.last() } else { None })
    }

    /// Whether a record of `bytes` must start a new shard: the open one
    /// holds a record and would grow past the shard size.
    fn full_for(&self, bytes: u64) -> bool {
        self.current
            .as_ref()
            .is_some_and(|c| c.n_records() > 0 && c.bin_bytes() + bytes > self.shard_size)
    }

    /// The open shard, started if there is none.
    fn current(&mut self) -> Result<&mut ShardWriter, FormatError> {
        if self.current.is_none() {
            let stem = Self::shard_stem(self.shards.len());
            let shard = ShardWriter::create_with(&self.dir, &stem, self.dtype, self.masked)?;
            self.current = Some(shard);
        }
        Ok(self.current.as_mut().expect("just started"))
    }

    /// A writer of records given in pieces (see [`Gathered`]).
    pub fn gather(&mut self) -> Gathered<'_> {
        Gathered {
            writer: self,
            staged: Vec::new(),
        }
    }

    fn seal(&mut self) -> Result<(), FormatError> {
        if let Some(current) = self.current.take() {
            self.shards.push(current.finish()?);
        }
        Ok(())
    }

    /// The shards completed so far.
    pub fn shards(&self) -> &[ShardInfo] {
        &self.shards
    }

    /// Completes the open shard and returns every shard, in order.
    pub fn finish(mut self) -> Result<Vec<ShardInfo>, FormatError> {
        self.seal()?;
        Ok(self.shards)
    }
}

/// Records appended to a [`DatasetWriter`] in pieces, wherever they lie (an
/// input's mapping, a separator, padding): each piece is copied once, into
/// a staging buffer of [`STAGING_BYTES`], which when full is hashed (the
/// file's XXH3 and its chunks') and goes to the shard's writer thread
/// ([`Pipe`]) to be written in one run, while the next fills. Records pushed whole
/// one by one ([`DatasetWriter::push_raw`]) are hashed one by one instead:
/// XXH3's streaming state copies what does not fill its 256-byte blocks, so
/// hashing records of a few hundred bytes that way copies most of their
/// bytes again, twice, in small copies.
///
/// Why a copy at all, when vectored writes could take the pieces from the
/// mapping: measured on the 2-core VM (docs/performance.md), the kernel's
/// copy into the page cache ran at a fraction of its speed when its source
/// was the input's mapping rather than a buffer in cache (a shuffle in
/// memory of 1 GiB of 20,000-token documents: 1.9 to 2.3 s of system time
/// against 0.6 s), which cost more than this copy.
///
/// Shards are cut as [`DatasetWriter::push_raw`] cuts them, and what a
/// shard holds is written before it is sealed. Call [`Gathered::finish`]
/// at the end: dropped without it, what is staged is sent then and an
/// error is lost (the shard's end checks its length). A write that fails
/// in the thread is the error of the next run sent, or of the shard's end.
/// The index and the
/// loss mask (a byte per token) are buffered as ever.
pub struct Gathered<'w> {
    writer: &'w mut DatasetWriter,
    /// Bytes of started records not yet hashed and written.
    staged: Vec<u8>,
}

impl Gathered<'_> {
    /// Appends one record: the concatenation of `pieces`, little-endian
    /// tokens of the writer's dtype, with its loss mask in pieces when the
    /// shards carry masks (and only then). Returns the shard completed to
    /// make room for it, if one was.
    ///
    /// # Errors
    /// A record of no whole number of tokens, a mask of another length or
    /// where none belongs (or none where one does), or a write that failed.
    pub fn push(
        &mut self,
        pieces: &[&[u8]],
        mask: Option<&[&[u8]]>,
    ) -> Result<Option<&ShardInfo>, FormatError> {
        let bytes: usize = pieces.iter().map(|p| p.len()).sum();
        let sealed = self.writer.full_for(bytes as u64);
        if sealed {
            self.write()?;
            self.writer.seal()?;
        }
        self.writer.current()?.begin_record(bytes, mask)?;
        if self.staged.capacity() == 0 {
            self.staged = self.writer.buffers.take();
        }
        for piece in pieces {
            let mut rest = *piece;
            while !rest.is_empty() {
                if self.staged.len() == STAGING_BYTES {
                    self.write()?;
                    self.staged = self.writer.buffers.take();
                }
                let n = rest.len().min(STAGING_BYTES - self.staged.len());
                self.staged.extend_from_slice(&rest[..n]);
                rest = &rest[n..];
            }
        }
        Ok(if sealed {
            self.writer.shards.last()
        } else {
            None
        })
    }

    /// Hands what is staged to the open shard's writer thread; the next
    /// record takes another buffer.
    fn write(&mut self) -> Result<(), FormatError> {
        if self.staged.is_empty() {
            if self.staged.capacity() > 0 {
                self.writer.buffers.put(std::mem::take(&mut self.staged));
            }
            return Ok(());
        }
        let shard = self.writer.current.as_mut().expect("a record was started");
        shard.send_staged(std::mem::take(&mut self.staged), &self.writer.buffers)
    }

    /// Writes what is staged; the writer takes records again.
    ///
    /// # Errors
    /// A write that failed.
    pub fn finish(mut self) -> Result<(), FormatError> {
        self.write()
    }
}

impl Drop for Gathered<'_> {
    fn drop(&mut self) {
        let _ = self.write();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records gathered from pieces make the same shards, byte
    /// for byte, as the same records pushed whole, masks included, with
    /// shards cut at the same records.
    #[test]
    fn gathered_records_write_what_pushed_ones_do() {
        let tmp = tempfile::tempdir().unwrap();
        let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
        std::fs::create_dir_all(&one).unwrap();
        std::fs::create_dir_all(&two).unwrap();
        let records: Vec<Vec<u8>> = (0..3000u32)
            .map(|i| {
                // Some records longer than the staging buffer.
                let tokens = if i % 500 == 7 { 300_000 } else { i % 37 };
                (0..tokens * 2).map(|k| (i + k) as u8).collect()
            })
            .collect();
        let masks: Vec<Vec<u8>> = records
            .iter()
            .map(|r| (0..r.len() / 2).map(|k| (k % 2) as u8).collect())
            .collect();
        let mut pushed = DatasetWriter::new(&one, Dtype::U16, 20_000, Vec::new()).masked(true);
        for (r, m) in records.iter().zip(&masks) {
            pushed.push_raw_masked(r, m).unwrap();
        }
        let pushed = pushed.finish().unwrap();
        let mut writer = DatasetWriter::new(&two, Dtype::U16, 20_000, Vec::new()).masked(true);
        let mut gathered = writer.gather();
        let mut sealed = 0;
        for (r, m) in records.iter().zip(&masks) {
            let (a, b) = r.split_at(r.len() / 4 * 2);
            let (c, d) = m.split_at(m.len() / 3);
            sealed += usize::from(
                gathered
                    .push(&[a, &[], b], Some(&[c, d][..]))
                    .unwrap()
                    .is_some(),
            );
        }
        gathered.finish().unwrap();
        let written = writer.finish().unwrap();
        assert_eq!(sealed, written.len() - 1);
        assert!(written.len() > 5);
        assert_eq!(
            serde_json::to_string(&pushed).unwrap(),
            serde_json::to_string(&written).unwrap()
        );
        for shard in &written {
            for name in [
                &shard.bin,
                &shard.idx,
                shard.sum.as_ref().unwrap(),
                shard.mask.as_ref().unwrap(),
            ] {
                assert_eq!(
                    std::fs::read(one.join(name)).unwrap(),
                    std::fs::read(two.join(name)).unwrap()
                );
            }
        }
        let mut unmasked = DatasetWriter::new(&two, Dtype::U16, 10_000, Vec::new());
        let mut gathered = unmasked.gather();
        let (half, whole): (&[u8], &[u8]) = (&[1, 2, 3], &[1, 2]);
        assert!(gathered.push(&[half], None).is_err(), "half a token");
        assert!(
            gathered.push(&[whole], Some(&[&[1u8][..]][..])).is_err(),
            "a mask where none belongs"
        );
    }

    /// What a full disk does to a copy of the tokenizer: the write fails
    /// part-way, and the `.tmp` it wrote must not stay behind.
    /// Pieces cover the bytes in order, none longer than MAX_WRITE, each
    /// ending on a multiple of MAX_WRITE of the file or at the end.
    #[test]
    fn write_pieces_end_on_multiples_of_the_largest_write() {
        let bytes = vec![1u8; 3 * MAX_WRITE + 5];
        for start in [
            0,
            1,
            MAX_WRITE as u64 - 1,
            MAX_WRITE as u64,
            7 * MAX_WRITE as u64 + 3,
        ] {
            let (mut at, mut rest, mut pieces) = (start, &bytes[..], 0);
            while !rest.is_empty() {
                let piece = write_piece(at, rest);
                assert!(!piece.is_empty() && piece.len() <= MAX_WRITE);
                at += piece.len() as u64;
                rest = &rest[piece.len()..];
                assert!(
                    rest.is_empty() || at % MAX_WRITE as u64 == 0,
                    "from {start}"
                );
                pieces += 1;
            }
            assert_eq!(at - start, bytes.len() as u64);
            assert!(pieces <= 5);
        }
    }

    /// A write that fails in a shard's writer thread (a full disk:
    /// /dev/full fails every write with ENOSPC) is the error of a later
    /// push or of the shard's end, naming the `.bin`, and nothing of the
    /// shard stays behind.
    #[test]
    fn a_write_failed_in_the_writer_thread_is_an_error_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let mut writer = DatasetWriter::new(tmp.path(), Dtype::U16, 1 << 30, Vec::new());
        let record = vec![7u8; 64 << 10];
        let mut gathered = writer.gather();
        // The shard is opened, its record staged and not yet written.
        gathered.push(&[&record], None).unwrap();
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("Linux has /dev/full");
        let shard = gathered.writer.current.as_mut().unwrap();
        shard.bin.as_mut().unwrap().out = BufWriter::with_capacity(WRITE_BUFFER, full);
        let mut error = None;
        for _ in 0..200 {
            if let Err(e) = gathered.push(&[&record], None) {
                error = Some(e);
                break;
            }
        }
        let error = match error {
            Some(e) => {
                drop(gathered);
                drop(writer);
                e
            }
            None => {
                gathered.finish().unwrap();
                writer.finish().unwrap_err()
            }
        };
        let message = error.to_string();
        assert!(message.contains("shard-00000.bin.tmp"), "{message}");
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    #[test]
    fn tokenizer_tmp_is_not_left_behind_when_a_write_fails() {
        let tmp = tempfile::tempdir().unwrap();
        // The final name is taken by a folder: the rename fails.
        let target = tmp.path().join("tokenizer.json");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("x"), b"x").unwrap();
        assert!(atomic_write(&target, b"{}").is_err());
        assert!(!tmp.path().join("tokenizer.json.tmp").exists());

        // /dev/full fails every write with ENOSPC, as a full disk does.
        if Path::new("/dev/full").exists() {
            let mut file = AtomicFile::create(&tmp.path().join("big.bin")).unwrap();
            let tmp_name = tmp.path().join("big.bin.tmp");
            std::fs::remove_file(&tmp_name).unwrap();
            std::os::unix::fs::symlink("/dev/full", &tmp_name).unwrap();
            // The buffered bytes reach the (replaced) file only on close.
            let reopened = std::fs::OpenOptions::new()
                .write(true)
                .open(&tmp_name)
                .unwrap();
            file.out = Some(BufWriter::new(Capped::new(reopened)));
            file.write(&[0u8; 4096]).unwrap();
            assert!(file.close().is_err());
            drop(file);
            assert!(!tmp_name.exists());
        }
    }
}
