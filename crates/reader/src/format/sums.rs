//! `NAME.sum`: the XXH3-64 of every fixed-size chunk of a shard's `.bin`,
//! so that a reader that fetches a part of a shard (a ranged GET from
//! object storage) can verify that part before use. The manifest's
//! `bin_xxh3` covers the whole file and cannot.
//!
//! A reader parses the file with [`ChunkSums::parse`], widens the byte
//! range it wants to whole chunks with [`ChunkSums::covering`], fetches
//! that range and checks it with [`ChunkSums::verify`]:
//!
//! ```
//! # use prep_reader::format::{ChunkSums, CHUNK_BYTES};
//! # fn get(range: std::ops::Range<u64>) -> Vec<u8> { vec![0; (range.end - range.start) as usize] }
//! # let dir = tempfile::tempdir().unwrap();
//! # let mut w = prep_reader::format::ShardWriter::create(dir.path(), "s", prep_reader::format::Dtype::U16).unwrap();
//! # w.push_raw(&vec![0u8; 3 << 20]).unwrap();
//! # let info = w.finish().unwrap();
//! # let sum_bytes = std::fs::read(dir.path().join("s.sum")).unwrap();
//! let sums = ChunkSums::parse(std::path::Path::new("s.sum"), &sum_bytes, info.bin_bytes)?;
//! assert_eq!(sums.chunk_bytes(), CHUNK_BYTES);
//! let wanted = 1_500_000..1_600_000; // bytes of the .bin a record needs
//! let range = sums.covering(wanted.clone());
//! assert_eq!(range, 1 << 20..2 << 20);
//! let bytes = get(range.clone()); // one ranged GET
//! sums.verify(range.start, &bytes)?;
//! let record = &bytes[(wanted.start - range.start) as usize..(wanted.end - range.start) as usize];
//! # assert_eq!(record.len(), 100_000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use super::FormatError;

/// The first eight bytes of every `.sum` file.
pub const SUM_MAGIC: [u8; 8] = *b"PREPSUM\0";
/// The chunk checksum file version this build writes and the newest it reads.
pub const SUM_VERSION: u32 = 1;
/// Bytes before the first chunk's checksum.
pub const SUM_HEADER_LEN: usize = 32;
/// The chunk size prep writes: 1 MiB of the `.bin` per checksum. A reader
/// takes the size from each file's header, never from this constant.
///
/// A ranged GET of a few MiB is what object storage serves well; verifying
/// a record then reads at most one chunk more on each side of it, and the
/// file costs 8 bytes per MiB of tokens.
pub const CHUNK_BYTES: u64 = 1 << 20;
/// The variable that sets the chunk size a writer uses in place of
/// [`CHUNK_BYTES`] (the streaming tests use small chunks so that a small
/// dataset has many of them). Readers never look at it.
pub const CHUNK_VAR: &str = "PREP_SUM_CHUNK_BYTES";

/// The chunk size to write: [`CHUNK_BYTES`], or what [`CHUNK_VAR`] says
/// when it is a positive number.
pub fn chunk_bytes_to_write() -> u64 {
    std::env::var(CHUNK_VAR)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&c| c > 0)
        .unwrap_or(CHUNK_BYTES)
}

/// A shard's chunk checksums, parsed and checked against the size of its
/// `.bin`: chunk `i` is bytes `[i * chunk_bytes, min((i + 1) * chunk_bytes,
/// bin_bytes))` of the `.bin`, and its checksum is the XXH3-64 (seed 0) of
/// those bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkSums {
    /// The `.sum` file, for messages.
    path: PathBuf,
    chunk_bytes: u64,
    bin_bytes: u64,
    sums: Vec<u64>,
}

impl ChunkSums {
    /// Parses and checks the `.sum` file `bytes` (the whole file) of a
    /// `.bin` of `bin_bytes` bytes (the manifest's `bin_bytes`). `path`
    /// only names the file in errors: a local path or an object's address.
    ///
    /// # Errors
    /// Every rule of FORMAT.md's `NAME.sum` section: a file shorter than
    /// its header ([`FormatError::SumTooShort`]), a bad magic
    /// ([`FormatError::SumBadMagic`]), a version this build does not read
    /// ([`FormatError::UnsupportedVersion`]), nonzero reserved bytes
    /// ([`FormatError::SumReserved`]), a chunk size of 0
    /// ([`FormatError::SumChunkBytes`]), a chunk count that does not cover
    /// `bin_bytes` exactly ([`FormatError::SumChunkCount`]) and a file size
    /// other than the header says ([`FormatError::SumSize`]). The size is
    /// checked before anything is allocated, so the allocation is bounded
    /// by `bytes`, never by a count in the header.
    pub fn parse(path: &Path, bytes: &[u8], bin_bytes: u64) -> Result<ChunkSums, FormatError> {
        let head = bytes
            .get(..SUM_HEADER_LEN)
            .ok_or_else(|| FormatError::SumTooShort {
                path: path.into(),
                len: bytes.len() as u64,
            })?;
        if head[0..8] != SUM_MAGIC {
            return Err(FormatError::SumBadMagic { path: path.into() });
        }
        let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if version > SUM_VERSION || version == 0 {
            return Err(FormatError::UnsupportedVersion {
                path: path.into(),
                found: version.into(),
                supported: SUM_VERSION.into(),
            });
        }
        if head[12..16] != [0; 4] {
            return Err(FormatError::SumReserved { path: path.into() });
        }
        let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        let (chunk_bytes, n_chunks) = (word(16), word(24));
        if chunk_bytes == 0 {
            return Err(FormatError::SumChunkBytes { path: path.into() });
        }
        let expected = Self::file_len(n_chunks);
        if expected != Some(bytes.len() as u64) {
            return Err(FormatError::SumSize {
                path: path.into(),
                len: bytes.len() as u64,
                n_chunks,
                expected: expected
                    .map_or_else(|| "more bytes than a u64 holds".into(), |e| e.to_string()),
            });
        }
        let needed = bin_bytes.div_ceil(chunk_bytes);
        if n_chunks != needed {
            return Err(FormatError::SumChunkCount {
                path: path.into(),
                n_chunks,
                chunk_bytes,
                bin_bytes,
                expected: needed,
            });
        }
        let sums = bytes[SUM_HEADER_LEN..]
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        Ok(ChunkSums {
            path: path.into(),
            chunk_bytes,
            bin_bytes,
            sums,
        })
    }

    /// The size of a `.sum` file of `n_chunks` checksums, or `None` if it
    /// overflows a u64.
    pub fn file_len(n_chunks: u64) -> Option<u64> {
        n_chunks.checked_mul(8)?.checked_add(SUM_HEADER_LEN as u64)
    }

    /// The `.sum` file's bytes for chunks of `chunk_bytes` with these
    /// checksums, as [`crate::format::ShardWriter`] writes them.
    pub fn encode(chunk_bytes: u64, sums: &[u64]) -> Vec<u8> {
        let mut out = Vec::with_capacity(SUM_HEADER_LEN + 8 * sums.len());
        out.extend_from_slice(&SUM_MAGIC);
        out.extend_from_slice(&SUM_VERSION.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&chunk_bytes.to_le_bytes());
        out.extend_from_slice(&(sums.len() as u64).to_le_bytes());
        for sum in sums {
            out.extend_from_slice(&sum.to_le_bytes());
        }
        out
    }

    /// Bytes of the `.bin` per chunk (the last chunk may be shorter), at least 1.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// The size of the `.bin` the checksums describe.
    pub fn bin_bytes(&self) -> u64 {
        self.bin_bytes
    }

    /// The number of chunks: `ceil(bin_bytes / chunk_bytes)`.
    pub fn len(&self) -> u64 {
        self.sums.len() as u64
    }

    /// True when the `.bin` is empty, and so has no chunk.
    pub fn is_empty(&self) -> bool {
        self.sums.is_empty()
    }

    /// The byte range of the `.bin` that chunk `index` covers, or `None`
    /// past the last chunk.
    pub fn chunk(&self, index: u64) -> Option<Range<u64>> {
        if index >= self.len() {
            return None;
        }
        // In range: index * chunk_bytes < bin_bytes, so nothing overflows.
        let start = index * self.chunk_bytes;
        Some(start..self.bin_bytes.min(start.saturating_add(self.chunk_bytes)))
    }

    /// The smallest range of whole chunks that contains `range` (clipped to
    /// the `.bin` first): it starts at a chunk boundary and ends at a chunk
    /// boundary or at the end of the `.bin`, so [`ChunkSums::verify`] can
    /// check what a read of it returns. An empty range (after clipping)
    /// gives an empty range at a chunk boundary.
    pub fn covering(&self, range: Range<u64>) -> Range<u64> {
        let end = range.end.min(self.bin_bytes);
        let start = range.start.min(end);
        let first = start / self.chunk_bytes * self.chunk_bytes;
        if start == end {
            return first..first;
        }
        // The end of the chunk that holds byte `end - 1`; past the end of
        // the .bin (or of a u64, for a hostile chunk size) it is the end.
        let last = (end - 1) / self.chunk_bytes + 1;
        let aligned_end = last
            .checked_mul(self.chunk_bytes)
            .map_or(self.bin_bytes, |e| e.min(self.bin_bytes));
        first..aligned_end
    }

    /// Checks `bytes`, the bytes of the `.bin` from `aligned_start` on, chunk
    /// by chunk. `aligned_start` must be a chunk boundary and `bytes` must
    /// end at a chunk boundary or at the end of the `.bin` (a range from
    /// [`ChunkSums::covering`] does both). Only the bytes given are checked
    /// (none: nothing to check), so a caller that asked for a range also
    /// checks that it got all of it; a short read that stops inside a
    /// chunk fails here.
    ///
    /// # Errors
    /// The first chunk that fails, by index and byte range: its checksum
    /// differs ([`ChunkProblem::Checksum`]), `bytes` stop inside it
    /// ([`ChunkProblem::Truncated`], as a short read leaves them),
    /// `aligned_start` is not its start ([`ChunkProblem::Misaligned`]), or
    /// `bytes` run past the end of the `.bin` ([`ChunkProblem::PastEnd`]).
    pub fn verify(&self, aligned_start: u64, bytes: &[u8]) -> Result<(), BadChunk> {
        let end = aligned_start.checked_add(bytes.len() as u64);
        match end {
            Some(end) if end <= self.bin_bytes => {}
            _ => {
                let end = end.unwrap_or(u64::MAX);
                return Err(self.bad(self.len(), self.bin_bytes..end, ChunkProblem::PastEnd));
            }
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let first = aligned_start / self.chunk_bytes;
        if !aligned_start.is_multiple_of(self.chunk_bytes) {
            let range = self.chunk(first).expect("a start inside the .bin");
            let problem = ChunkProblem::Misaligned {
                start: aligned_start,
            };
            return Err(self.bad(first, range, problem));
        }
        let step = usize::try_from(self.chunk_bytes).unwrap_or(usize::MAX);
        for (k, piece) in bytes.chunks(step).enumerate() {
            let index = first + k as u64;
            let range = self.chunk(index).expect("bytes inside the .bin");
            if (piece.len() as u64) < range.end - range.start {
                let got = piece.len() as u64;
                return Err(self.bad(index, range, ChunkProblem::Truncated { got }));
            }
            self.check(index, xxh3_64(piece))?;
        }
        Ok(())
    }

    /// Whether `digest` is the checksum of chunk `index` (one the `.sum`
    /// lists), for a caller that hashed the chunk as it streamed by.
    pub fn check(&self, index: u64, digest: u64) -> Result<(), BadChunk> {
        let range = self.chunk(index);
        let expected = usize::try_from(index).ok().and_then(|i| self.sums.get(i));
        match (range, expected) {
            (Some(_), Some(&expected)) if expected == digest => Ok(()),
            (Some(range), Some(&expected)) => Err(self.bad(
                index,
                range,
                ChunkProblem::Checksum {
                    expected,
                    found: digest,
                },
            )),
            _ => Err(self.bad(index, self.bin_bytes..self.bin_bytes, ChunkProblem::PastEnd)),
        }
    }

    fn bad(&self, index: u64, range: Range<u64>, problem: ChunkProblem) -> BadChunk {
        BadChunk {
            path: self.path.clone(),
            index,
            range,
            problem,
        }
    }
}

/// A chunk of a `.bin` that does not match its `.sum`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: chunk {index} (bytes {}..{} of the shard's .bin): {problem}", path.display(), range.start, range.end)]
pub struct BadChunk {
    /// The `.sum` file, as [`ChunkSums::parse`] was told to name it.
    pub path: PathBuf,
    /// The chunk's index in the `.sum` (for [`ChunkProblem::PastEnd`]: the
    /// number of chunks, one past the last).
    pub index: u64,
    /// The chunk's byte range in the `.bin` (for
    /// [`ChunkProblem::PastEnd`]: the bytes past the end of the `.bin`).
    pub range: Range<u64>,
    /// What is wrong with it.
    pub problem: ChunkProblem,
}

/// What is wrong with a [`BadChunk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkProblem {
    /// The bytes' XXH3-64 is not the one the `.sum` lists.
    Checksum {
        /// The checksum the `.sum` lists.
        expected: u64,
        /// The checksum of the bytes given.
        found: u64,
    },
    /// The bytes stop inside the chunk, before its end (a short read).
    Truncated {
        /// The chunk's bytes given.
        got: u64,
    },
    /// The bytes given start inside the chunk, not at its start.
    Misaligned {
        /// Where they start.
        start: u64,
    },
    /// The bytes given run past the end of the `.bin`.
    PastEnd,
}

impl fmt::Display for ChunkProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkProblem::Checksum { expected, found } => {
                write!(f, "XXH3 is {found:016x}, the .sum lists {expected:016x}")
            }
            ChunkProblem::Truncated { got } => {
                write!(f, "only {got} of its bytes were given (a short read?)")
            }
            ChunkProblem::Misaligned { start } => {
                write!(f, "bytes given from {start}, which is not a chunk boundary")
            }
            ChunkProblem::PastEnd => f.write_str("bytes given past the end of the .bin"),
        }
    }
}

/// The XXH3-64 of each chunk of a stream of bytes, computed as the bytes go
/// by in pieces of any size: the writer's way of making a `.sum` in the
/// pass that writes the `.bin`, and `validate`'s of checking one in the
/// pass that reads it.
#[derive(Clone)]
pub struct ChunkHasher {
    chunk_bytes: u64,
    hasher: Xxh3,
    /// Bytes of the current chunk hashed so far.
    filled: u64,
    /// The current chunk's index.
    index: u64,
}

impl ChunkHasher {
    /// A hasher of chunks of `chunk_bytes` (at least 1).
    pub fn new(chunk_bytes: u64) -> ChunkHasher {
        assert!(chunk_bytes > 0, "chunks of at least one byte");
        ChunkHasher {
            chunk_bytes,
            hasher: Xxh3::new(),
            filled: 0,
            index: 0,
        }
    }

    /// The chunk size it hashes.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// Hashes the next `bytes` of the stream, calling `done(index, xxh3)`
    /// for each chunk they complete.
    pub fn update(&mut self, mut bytes: &[u8], mut done: impl FnMut(u64, u64)) {
        while !bytes.is_empty() {
            let room = self.chunk_bytes - self.filled;
            let take = usize::try_from(room).map_or(bytes.len(), |r| r.min(bytes.len()));
            let (now, rest) = bytes.split_at(take);
            self.hasher.update(now);
            self.filled += take as u64;
            bytes = rest;
            if self.filled == self.chunk_bytes {
                done(self.index, self.hasher.digest());
                self.hasher.reset();
                self.filled = 0;
                self.index += 1;
            }
        }
    }

    /// Ends the stream: calls `done` for the last chunk, if it is partial.
    pub fn finish(self, mut done: impl FnMut(u64, u64)) {
        if self.filled > 0 {
            done(self.index, self.hasher.digest());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sums_of(bin: &[u8], chunk_bytes: u64) -> Vec<u8> {
        let mut sums = Vec::new();
        let mut hasher = ChunkHasher::new(chunk_bytes);
        hasher.update(bin, |_, d| sums.push(d));
        hasher.finish(|_, d| sums.push(d));
        ChunkSums::encode(chunk_bytes, &sums)
    }

    fn parse(bytes: &[u8], bin_bytes: u64) -> Result<ChunkSums, FormatError> {
        ChunkSums::parse(Path::new("s.sum"), bytes, bin_bytes)
    }

    fn header(version: u32, reserved: u32, chunk_bytes: u64, n_chunks: u64) -> Vec<u8> {
        let mut out = SUM_MAGIC.to_vec();
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&reserved.to_le_bytes());
        out.extend_from_slice(&chunk_bytes.to_le_bytes());
        out.extend_from_slice(&n_chunks.to_le_bytes());
        out
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let bin: Vec<u8> = (0..10u8).collect();
        let bytes = sums_of(&bin, 4);
        let mut expected = header(1, 0, 4, 3);
        for chunk in [&bin[0..4], &bin[4..8], &bin[8..10]] {
            expected.extend_from_slice(&xxh3_64(chunk).to_le_bytes());
        }
        assert_eq!(bytes, expected);
        assert_eq!(&bytes[..8], b"PREPSUM\0");
        let sums = parse(&bytes, 10).unwrap();
        assert_eq!(
            (sums.chunk_bytes(), sums.len(), sums.bin_bytes()),
            (4, 3, 10)
        );
        assert_eq!(sums.chunk(2), Some(8..10));
        assert_eq!(sums.chunk(3), None);
    }

    #[test]
    fn an_empty_bin_has_no_chunk_and_verifies_empty() {
        let bytes = sums_of(&[], CHUNK_BYTES);
        assert_eq!(bytes.len(), SUM_HEADER_LEN);
        let sums = parse(&bytes, 0).unwrap();
        assert!(sums.is_empty());
        assert_eq!(sums.covering(0..100), 0..0);
        sums.verify(0, &[]).unwrap();
        let err = sums.verify(0, &[1]).unwrap_err();
        assert_eq!(err.problem, ChunkProblem::PastEnd);
    }

    #[test]
    fn hostile_headers_are_refused_by_name() {
        let good = header(1, 0, 4, 2);
        let with_sums = |mut h: Vec<u8>, n: usize| {
            h.resize(h.len() + 8 * n, 0);
            h
        };
        let cases: Vec<(Vec<u8>, u64, &str)> = vec![
            (good[..31].to_vec(), 8, "shorter than its 32-byte header"),
            (
                {
                    let mut h = with_sums(good.clone(), 2);
                    h[3] = b'X';
                    h
                },
                8,
                "bad magic",
            ),
            (with_sums(header(2, 0, 4, 2), 2), 8, "format version 2"),
            (with_sums(header(0, 0, 4, 2), 2), 8, "format version 0"),
            (with_sums(header(1, 1, 4, 2), 2), 8, "reserved"),
            (with_sums(header(1, 0, 0, 2), 2), 8, "chunk size 0"),
            // Counts whose file would be larger than memory: refused by size
            // before anything is allocated.
            (header(1, 0, 1, u64::MAX), u64::MAX, "more bytes than a u64"),
            (header(1, 0, 1, u64::MAX / 8), u64::MAX / 8, "needs"),
            (with_sums(good.clone(), 1), 8, "needs 48"),
            (with_sums(good.clone(), 3), 8, "needs 48"),
            // A count that disagrees with the .bin's size.
            (with_sums(good.clone(), 2), 9, "3 are needed"),
            (with_sums(good.clone(), 2), 4, "1 are needed"),
            (with_sums(header(1, 0, u64::MAX, 2), 2), 5, "1 are needed"),
        ];
        for (bytes, bin_bytes, words) in cases {
            let err = parse(&bytes, bin_bytes).unwrap_err().to_string();
            assert!(err.contains(words), "{words:?} not in {err:?}");
            assert!(err.starts_with("s.sum: "), "{err}");
        }
        parse(&with_sums(good, 2), 8).unwrap();
        // The largest chunk size: one chunk for any .bin.
        let sums = parse(&with_sums(header(1, 0, u64::MAX, 1), 1), 5).unwrap();
        assert_eq!(sums.covering(1..3), 0..5);
        assert_eq!(sums.chunk(0), Some(0..5));
    }

    #[test]
    fn covering_rounds_out_to_chunks_and_clips_to_the_bin() {
        let bin = vec![7u8; 10];
        let sums = parse(&sums_of(&bin, 4), 10).unwrap();
        assert_eq!(sums.covering(0..1), 0..4);
        assert_eq!(sums.covering(3..5), 0..8);
        assert_eq!(sums.covering(4..8), 4..8);
        assert_eq!(sums.covering(9..100), 8..10);
        assert_eq!(sums.covering(5..5), 4..4);
        assert_eq!(sums.covering(50..60), 8..8);
        // An inverted range is empty, at its end.
        #[allow(clippy::reversed_empty_ranges)]
        let inverted = 6..2;
        assert_eq!(sums.covering(inverted), 0..0);
    }

    #[test]
    fn verify_names_the_failing_chunk() {
        let mut bin: Vec<u8> = (0..10u8).collect();
        let sums = parse(&sums_of(&bin, 4), 10).unwrap();
        sums.verify(0, &bin).unwrap();
        sums.verify(4, &bin[4..]).unwrap();
        sums.verify(8, &bin[8..]).unwrap();
        sums.verify(8, &[]).unwrap();
        sums.verify(10, &[]).unwrap();

        bin[5] ^= 1;
        let err = sums.verify(0, &bin).unwrap_err();
        assert_eq!((err.index, err.range.clone()), (1, 4..8));
        assert!(matches!(err.problem, ChunkProblem::Checksum { .. }));
        assert!(
            err.to_string()
                .starts_with("s.sum: chunk 1 (bytes 4..8 of the shard's .bin): XXH3 is "),
            "{err}"
        );
        bin[5] ^= 1;

        let err = sums.verify(0, &bin[..6]).unwrap_err();
        assert_eq!(
            (err.index, err.range, err.problem),
            (1, 4..8, ChunkProblem::Truncated { got: 2 })
        );
        let err = sums.verify(2, &bin[2..4]).unwrap_err();
        assert_eq!(
            (err.index, err.range, err.problem),
            (0, 0..4, ChunkProblem::Misaligned { start: 2 })
        );
        let err = sums.verify(8, &[8, 9, 10]).unwrap_err();
        assert_eq!(
            (err.index, err.range, err.problem),
            (3, 10..11, ChunkProblem::PastEnd)
        );
        let err = sums.verify(u64::MAX, &[1]).unwrap_err();
        assert_eq!(err.problem, ChunkProblem::PastEnd);
    }

    /// A `.bin` of `len` bytes, deterministic, with chunks of `chunk`.
    fn bin_and_sums(len: usize, chunk: u64) -> (Vec<u8>, ChunkSums) {
        let bin: Vec<u8> = (0..len).map(|i| (i * 7 + i / 13) as u8).collect();
        let sums = parse(&sums_of(&bin, chunk), len as u64).unwrap();
        (bin, sums)
    }

    proptest! {
        #[test]
        fn any_ranges_covering_range_verifies(
            len in 0usize..3000,
            chunk in 1u64..700,
            a in 0u64..3200,
            b in 0u64..3200,
        ) {
            let (bin, sums) = bin_and_sums(len, chunk);
            let (lo, hi) = (a.min(b), a.max(b));
            let range = sums.covering(lo..hi);
            let clipped = lo.min(len as u64)..hi.min(len as u64);
            prop_assert!(range.start <= range.end && range.end <= len as u64);
            prop_assert_eq!(range.start % chunk, 0);
            prop_assert!(range.end % chunk == 0 || range.end == len as u64);
            if clipped.start < clipped.end {
                prop_assert!(range.start <= clipped.start && clipped.end <= range.end);
                // The smallest such range: less than a chunk more on each side.
                prop_assert!(clipped.start - range.start < chunk);
                prop_assert!(range.end - clipped.end < chunk);
            } else {
                prop_assert!(range.is_empty());
            }
            let bytes = &bin[range.start as usize..range.end as usize];
            prop_assert_eq!(sums.verify(range.start, bytes), Ok(()));
        }

        #[test]
        fn one_flipped_byte_fails_naming_its_chunk(
            len in 1usize..3000,
            chunk in 1u64..700,
            at in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let (mut bin, sums) = bin_and_sums(len, chunk);
            let at = at.index(len);
            bin[at] ^= 1 << bit;
            let index = at as u64 / chunk;
            let err = sums.verify(0, &bin).unwrap_err();
            prop_assert_eq!(err.index, index);
            prop_assert_eq!(err.range.clone(), sums.chunk(index).unwrap());
            prop_assert!(err.range.contains(&(at as u64)));
            let is_checksum = matches!(err.problem, ChunkProblem::Checksum { .. });
            prop_assert!(is_checksum);
            // The chunk alone fails too; its neighbours pass.
            let r = err.range.clone();
            prop_assert!(sums.verify(r.start, &bin[r.start as usize..r.end as usize]).is_err());
            prop_assert_eq!(sums.verify(r.end, &bin[r.end as usize..]), Ok(()));
            prop_assert_eq!(sums.verify(0, &bin[..r.start as usize]), Ok(()));
        }

        #[test]
        fn pieces_of_any_size_hash_as_one_stream(
            len in 0usize..3000,
            chunk in 1u64..700,
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let (bin, sums) = bin_and_sums(len, chunk);
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(len + 1)).collect();
            cuts.push(0);
            cuts.push(len);
            cuts.sort_unstable();
            let mut hasher = ChunkHasher::new(chunk);
            let mut seen = Vec::new();
            for w in cuts.windows(2) {
                hasher.update(&bin[w[0]..w[1]], |i, d| seen.push((i, d)));
            }
            hasher.finish(|i, d| seen.push((i, d)));
            prop_assert_eq!(seen.len() as u64, sums.len());
            for (i, d) in seen {
                prop_assert_eq!(sums.check(i, d), Ok(()));
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in prop::collection::vec(any::<u8>(), 0..200),
            bin_bytes in any::<u64>(),
            header_words in prop::collection::vec(any::<u64>(), 2),
        ) {
            let _ = parse(&bytes, bin_bytes);
            // A valid magic and version with arbitrary counts.
            let mut h = header(1, 0, header_words[0], header_words[1]);
            h.extend_from_slice(&bytes);
            if let Ok(sums) = parse(&h, bin_bytes) {
                let r = sums.covering(bin_bytes / 3..bin_bytes / 2);
                prop_assert!(r.end <= bin_bytes);
                let _ = sums.verify(r.start, &bytes);
            }
        }
    }
}
