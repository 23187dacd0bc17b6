//! Bucket files being written: every document a shuffle scatters goes
//! through here, to the bucket its key chooses (a bucket file of its own,
//! or a bucket's region of a scatter file).
//!
//! Each bucket has a buffer that the scattering thread fills with its
//! records (see [`Spool::put`]; a record runs on into the next buffer
//! where it does not fit). A full buffer goes to a thread of the
//! spool's own, which hashes it (the bucket's XXH3, for the journal) and
//! writes it ([`Sink`]), so that the kernel's copy into the page cache
//! (half of a scatter's time) runs on another core while the scattering
//! thread reads and checks the next documents. Buffers are written in the
//! order they fill, each to its own bucket, so every file and its hash are
//! the ones one thread would make. Buffers smaller than [`MIN_THREADED`] (a scatter
//! with many buckets in little memory) are written by the scattering
//! thread itself: messages that small would cost more than they save.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;

use xxhash_rust::xxh3::Xxh3;

use super::{ShuffleError, BUCKET_HEADER};

/// Full buffers that wait for the writer thread at most.
const DEPTH: usize = 4;

/// The smallest buffer handed to the writer thread.
const MIN_THREADED: usize = 64 << 10;

/// Bytes a [`Sink`] hashes, then writes, at a time: the write reads them
/// from the cache.
const HASH_PIECE: usize = 64 << 10;

/// A bucket's writer, and the XXH3 of what was written to it.
struct Sink<W> {
    out: W,
    hash: Xxh3,
}

impl<W: Write> Sink<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<()> {
        for piece in buf.chunks(HASH_PIECE) {
            self.hash.update(piece);
            self.out.write_all(piece)?;
        }
        Ok(())
    }
}

/// A bucket as the spool leaves it: its writer and path, the bytes
/// written to it and their XXH3.
pub(super) struct Spooled<W> {
    pub out: W,
    pub path: PathBuf,
    pub bytes: u64,
    pub xxh3: u64,
}

/// Buckets being filled (see the module's documentation).
pub(super) struct Spool<W: Write + Send + 'static> {
    /// Each bucket's path, for errors.
    paths: Vec<PathBuf>,
    /// Each bucket's buffer being filled: empty (no capacity) until its
    /// first record.
    bufs: Vec<Vec<u8>>,
    bytes: Vec<u64>,
    buffer: usize,
    /// Bytes at which each bucket's buffer is handed on: `buffer`, but
    /// for the first, staggered from bucket to bucket. (Documents spread
    /// evenly over the buckets, so buffers that all start empty all fill
    /// at once, over and over: bursts that the writer thread cannot take,
    /// between spells with nothing to write.)
    limits: Vec<usize>,
    /// The writer thread, or the buckets' writers when there is none.
    writing: Writing<W>,
}

enum Writing<W: Write + Send + 'static> {
    Inline(Vec<Sink<W>>),
    Thread(Writer<W>),
}

/// The writer thread and what goes to and from it.
struct Writer<W> {
    to: Option<SyncSender<(usize, Vec<u8>)>>,
    /// Buffers the thread has written, emptied, to be filled again.
    back: Receiver<Vec<u8>>,
    /// Buffers made so far: at most one per bucket, [`DEPTH`] waiting and
    /// one being written.
    made: usize,
    /// Set by the thread when a write fails: what is sent after is dropped.
    failed: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Written<W>>>,
}

/// What the writer thread hands back: the writers, and the first write
/// that failed (its bucket and error), if one did.
type Written<W> = (Vec<Sink<W>>, Result<(), (usize, std::io::Error)>);

impl<W: Write + Send + 'static> Spool<W> {
    /// A spool of the buckets `outs` (paths `paths`, for errors), with a
    /// buffer of `buffer` bytes each.
    ///
    /// # Errors
    /// The writer thread could not be started.
    pub fn new(outs: Vec<W>, paths: Vec<PathBuf>, buffer: usize) -> Result<Spool<W>, ShuffleError> {
        let n = outs.len();
        assert_eq!(n, paths.len(), "a path per bucket");
        let buffer = buffer.max(BUCKET_HEADER);
        let sinks = outs
            .into_iter()
            .map(|out| Sink {
                out,
                hash: Xxh3::new(),
            })
            .collect();
        let writing = if buffer < MIN_THREADED {
            Writing::Inline(sinks)
        } else {
            Writing::Thread(Writer::start(sinks).map_err(|e| {
                let first = paths.first().cloned().unwrap_or_default();
                ShuffleError::Format(crate::format::FormatError::io(first, e))
            })?)
        };
        Ok(Spool {
            paths,
            bufs: (0..n).map(|_| Vec::new()).collect(),
            bytes: vec![0; n],
            buffer,
            limits: (0..n).map(|i| (buffer * (i + 1) / n).max(1)).collect(),
            writing,
        })
    }

    /// Appends document `g` with its key to bucket `i`: its record is the
    /// concatenation of `parts` (its tokens, and its loss mask after them
    /// when the inputs have masks) after a header of its key, its number
    /// and its size in bytes, each a little-endian u64.
    pub fn put(&mut self, i: usize, key: u64, g: u64, parts: &[&[u8]]) -> Result<(), ShuffleError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut head = [0u8; BUCKET_HEADER];
        head[..8].copy_from_slice(&key.to_le_bytes());
        head[8..16].copy_from_slice(&g.to_le_bytes());
        head[16..].copy_from_slice(&(len as u64).to_le_bytes());
        self.append(i, &head)?;
        for part in parts {
            self.append(i, part)?;
        }
        self.bytes[i] += (BUCKET_HEADER + len) as u64;
        Ok(())
    }

    /// Appends `bytes` to bucket `i`'s buffer, handing on each buffer that
    /// fills.
    fn append(&mut self, i: usize, mut bytes: &[u8]) -> Result<(), ShuffleError> {
        while !bytes.is_empty() {
            if self.bufs[i].capacity() == 0 {
                self.bufs[i] = self.empty()?;
            }
            let buf = &mut self.bufs[i];
            let n = (self.limits[i] - buf.len()).min(bytes.len());
            buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if buf.len() == self.limits[i] {
                self.limits[i] = self.buffer;
                self.hand_on(i)?;
            }
        }
        Ok(())
    }

    /// An empty buffer: one the writer thread has written, or a new one.
    fn empty(&mut self) -> Result<Vec<u8>, ShuffleError> {
        let limit = self.bufs.len() + DEPTH + 1;
        let buffer = self.buffer;
        match &mut self.writing {
            Writing::Thread(w) => {
                if let Ok(buf) = w.back.try_recv() {
                    return Ok(buf);
                }
                if w.made < limit {
                    w.made += 1;
                    return Ok(Vec::with_capacity(buffer));
                }
                // Every buffer is full or being written: wait for one.
                match w.back.recv() {
                    Ok(buf) => Ok(buf),
                    Err(_) => Err(self.failure()),
                }
            }
            Writing::Inline(_) => Ok(Vec::with_capacity(buffer)),
        }
    }

    /// Writes bucket `i`'s buffer, or sends it to be written.
    fn hand_on(&mut self, i: usize) -> Result<(), ShuffleError> {
        match &mut self.writing {
            Writing::Inline(sinks) => {
                let written = sinks[i].write(&self.bufs[i]);
                self.bufs[i].clear();
                written.map_err(|e| {
                    ShuffleError::Format(crate::format::FormatError::io(self.paths[i].clone(), e))
                })
            }
            Writing::Thread(w) => {
                let full = std::mem::take(&mut self.bufs[i]);
                let sent = !w.failed.load(Ordering::Acquire)
                    && w.to.as_ref().is_some_and(|to| to.send((i, full)).is_ok());
                match sent {
                    true => Ok(()),
                    false => Err(self.failure()),
                }
            }
        }
    }

    /// The error that stopped the writer thread.
    fn failure(&mut self) -> ShuffleError {
        let Writing::Thread(w) = &mut self.writing else {
            unreachable!("only a writer thread fails on its own")
        };
        let (_, written) = w.join();
        let (i, e) = match written {
            Err(failed) => failed,
            Ok(()) => (0, std::io::Error::other("the bucket writer stopped")),
        };
        ShuffleError::Format(crate::format::FormatError::io(self.paths[i].clone(), e))
    }

    /// Writes what the buffers hold and waits for every write; each
    /// bucket's writer back, with the bytes written to it and their XXH3.
    pub fn finish(mut self) -> Result<Vec<Spooled<W>>, ShuffleError> {
        for i in 0..self.bufs.len() {
            if !self.bufs[i].is_empty() {
                self.hand_on(i)?;
            }
        }
        let (mut sinks, written) = match &mut self.writing {
            Writing::Inline(sinks) => (std::mem::take(sinks), Ok(())),
            Writing::Thread(w) => w.join(),
        };
        let flushed = written.and_then(|()| {
            sinks
                .iter_mut()
                .enumerate()
                .try_for_each(|(i, s)| s.out.flush().map_err(|e| (i, e)))
        });
        if let Err((i, e)) = flushed {
            return Err(ShuffleError::Format(crate::format::FormatError::io(
                self.paths[i].clone(),
                e,
            )));
        }
        Ok(sinks
            .into_iter()
            .zip(self.paths)
            .zip(&self.bytes)
            .map(|((sink, path), &bytes)| Spooled {
                xxh3: sink.hash.digest(),
                out: sink.out,
                path,
                bytes,
            })
            .collect())
    }
}

impl<W: Write + Send + 'static> Writer<W> {
    fn start(mut sinks: Vec<Sink<W>>) -> std::io::Result<Writer<W>> {
        let (to, full) = std::sync::mpsc::sync_channel::<(usize, Vec<u8>)>(DEPTH);
        let (give_back, back) = std::sync::mpsc::channel::<Vec<u8>>();
        let failed = Arc::new(AtomicBool::new(false));
        let flag = failed.clone();
        let thread = std::thread::Builder::new()
            .name("prep-bucket-writer".into())
            .spawn(move || {
                let mut written = Ok(());
                for (i, mut buf) in full {
                    if written.is_ok() {
                        if let Err(e) = sinks[i].write(&buf) {
                            written = Err((i, e));
                            flag.store(true, Ordering::Release);
                        }
                    }
                    buf.clear();
                    // Gone only once the spool is: nothing left to fill.
                    let _ = give_back.send(buf);
                }
                (sinks, written)
            })?;
        Ok(Writer {
            to: Some(to),
            back,
            made: 0,
            failed,
            thread: Some(thread),
        })
    }

    /// Waits for every buffer sent to be written.
    fn join(&mut self) -> Written<W> {
        self.to = None;
        match self.thread.take() {
            Some(thread) => match thread.join() {
                Ok(done) => done,
                Err(panic) => std::panic::resume_unwind(panic),
            },
            None => (
                Vec::new(),
                Err((0, std::io::Error::other("the bucket writer stopped"))),
            ),
        }
    }
}

impl<W> Drop for Writer<W> {
    /// A spool dropped unfinished (an error elsewhere) still waits for its
    /// thread, so that nothing writes to its files after.
    fn drop(&mut self) {
        self.to = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bucket's bytes in memory, shared with the test.
    #[derive(Clone, Default)]
    struct Mem(Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Mem {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A writer that fails once it holds more than `room` bytes.
    struct Full {
        room: usize,
    }

    impl Write for Full {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if buf.len() > self.room {
                return Err(std::io::ErrorKind::StorageFull.into());
            }
            self.room -= buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    proptest::proptest! {
        /// Whatever the buffer size, on the writer thread or not, every
        /// bucket holds its records in the order put, and its hash and size
        /// are those of its bytes.
        #[test]
        fn buckets_hold_their_records_in_order(
            docs in proptest::collection::vec((0usize..5, 0usize..3000), 0..300),
            buffer in proptest::sample::select(vec![1usize, 100, 4096, 64 << 10, 70_000]),
        ) {
            let mems: Vec<Mem> = (0..5).map(|_| Mem::default()).collect();
            let paths = (0..5).map(|i| PathBuf::from(format!("b{i}"))).collect();
            let mut spool = Spool::new(mems.clone(), paths, buffer).unwrap();
            let mut expect = vec![Vec::new(); 5];
            for (g, &(b, len)) in docs.iter().enumerate() {
                let tokens: Vec<u8> = (0..len).map(|k| (k ^ g) as u8).collect();
                let (first, rest) = tokens.split_at(len / 3);
                spool.put(b, g as u64 * 7, g as u64, &[first, rest]).unwrap();
                expect[b].extend_from_slice(&(g as u64 * 7).to_le_bytes());
                expect[b].extend_from_slice(&(g as u64).to_le_bytes());
                expect[b].extend_from_slice(&(len as u64).to_le_bytes());
                expect[b].extend_from_slice(&tokens);
            }
            let done = spool.finish().unwrap();
            for (i, d) in done.iter().enumerate() {
                let got = mems[i].0.lock().unwrap().clone();
                proptest::prop_assert_eq!(&got, &expect[i]);
                proptest::prop_assert_eq!(d.bytes, got.len() as u64);
                proptest::prop_assert_eq!(d.xxh3, xxhash_rust::xxh3::xxh3_64(&got));
            }
        }
    }

    /// A write that fails names its bucket's file, on the writer thread or
    /// not, whether the scattering thread learns it while putting or when
    /// finishing.
    #[test]
    fn a_failed_write_names_its_bucket() {
        for (buffer, docs) in [(100, 10), (64 << 10, 10), (64 << 10, 2000)] {
            let outs = vec![Full { room: usize::MAX }, Full { room: 1000 }];
            let paths = vec![PathBuf::from("b0"), PathBuf::from("b1")];
            let mut spool = Spool::new(outs, paths, buffer).unwrap();
            let put = (0..docs).try_for_each(|g| spool.put(g % 2, 0, g as u64, &[&[1u8; 300]]));
            let e = match put {
                Err(e) => e,
                Ok(()) => spool.finish().err().expect("a write fails"),
            };
            let message = e.to_string();
            assert!(message.contains("b1"), "{message}");
            assert!(!message.contains("b0"), "{message}");
        }
    }
}
