//! Verified reads: what every stage that reads a dataset (shuffle, pack,
//! mix, split, merge, export) reads its input through, so that a checksum
//! it writes never certifies bytes nobody checked.
//!
//! A stage opens its input with [`Dataset::verified`], which checks every
//! `.idx` and `.seg` whole against the manifest (they are small, and read
//! whole by every stage), and then reads tokens and loss masks through the
//! [`Verified`] view: by borrowed slices of the mapping
//! ([`Verified::record_bytes`], [`Verified::tokens`], ...), or by positioned
//! reads that keep file pages out of the process's memory
//! ([`Verified::reader`]). Either way, the first read that touches a chunk
//! of a `.bin` (the chunks of its `.sum`; the whole file for a shard
//! without one) or of a `.mask` (always the whole file: masks have no
//! `.sum`) checks the whole chunk before any of its bytes is handed out:
//!
//! - its XXH3-64 against the `.sum` (or the manifest's `bin_xxh3`,
//!   `mask_xxh3`),
//! - every token id that starts in it below the manifest's `vocab_size`,
//! - every mask byte 0 or 1.
//!
//! Each chunk is checked once (a bit per chunk records it), in the pass
//! that reads it: the cost is one XXH3 pass and one scan of the ids over
//! the input (docs/performance.md, "Checking the input"). A failure is a
//! [`BadInput`] naming the input file, the chunk and the records it holds.
//!
//! What is checked is the file as it was when the chunk was first read: a
//! later read of a checked chunk (a positioned read of a piece, a slice of
//! the mapping) does not check again, so a file rewritten while a stage
//! reads it is not caught, as it is not by any reader of a mapping (see
//! the SIGBUS note of the mapping). A chunk read whole in order is used
//! from the very bytes that were checked.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::{fmt, iter};

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use super::files::{Files, ReadError};
use super::reader::Tokens;
use super::{ChunkSums, Dataset, Dtype, FormatError, ShardInfo};

/// A chunk read into memory at once, at most: a larger one (the whole
/// `.bin` of a shard without a `.sum`, or a `.mask`) is checked in blocks
/// of [`BLOCK`] as it streams by before its bytes are handed out.
const MAX_CACHED_CHUNK: u64 = 16 << 20;
/// Bytes read at once when a large chunk is checked or read in order.
const BLOCK: usize = 1 << 20;

/// Bytes read from an input dataset that are not what its manifest vouches
/// for: found before any of them went into an output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct BadInput {
    /// The input file: a `.bin`, `.mask`, `.idx` or `.seg`.
    pub path: PathBuf,
    /// The chunk's number (0 for a file checked whole).
    pub chunk: u64,
    /// The chunk's byte range in the file.
    pub range: Range<u64>,
    /// The records of the dataset (numbered across its shards) that have
    /// bytes in the chunk, first and last; `None` for an index file.
    pub records: Option<(u64, u64)>,
    /// What is wrong.
    pub problem: InputProblem,
}

/// What is wrong with a [`BadInput`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputProblem {
    /// The chunk's XXH3-64 is not the one listed.
    Checksum {
        /// The checksum listed.
        expected: u64,
        /// The checksum of the bytes read.
        found: u64,
        /// Where it is listed: the `.sum` or the manifest.
        listed_in: &'static str,
    },
    /// The file ended before the chunk did.
    Short {
        /// Bytes of the chunk read.
        got: u64,
    },
    /// A token id not below the vocabulary size.
    TokenOutOfRange {
        /// The token's position in the shard.
        token: u64,
        /// The record that holds it, numbered across the dataset.
        record: u64,
        /// The id.
        id: u64,
        /// The manifest's `vocab_size`.
        vocab_size: u64,
    },
    /// A loss mask byte other than 0 or 1.
    MaskByte {
        /// The byte's position in the `.mask` (the token's in the shard).
        byte: u64,
        /// The record that holds it, numbered across the dataset.
        record: u64,
        /// Its value.
        value: u8,
    },
}

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = (self.range.start, self.range.end);
        write!(
            f,
            "{}: chunk {} (bytes {a}..{b}",
            self.path.display(),
            self.chunk
        )?;
        match self.records {
            Some((r, s)) if r == s => write!(f, ", record {r})")?,
            Some((r, s)) => write!(f, ", records {r} to {s})")?,
            None => f.write_str(")")?,
        }
        match &self.problem {
            InputProblem::Checksum {
                expected,
                found,
                listed_in,
            } => write!(
                f,
                ": XXH3 is {found:016x}, {listed_in} lists {expected:016x}"
            )?,
            InputProblem::Short { got } => write!(
                f,
                ": the file ends after {got} of the chunk's bytes (it was truncated)"
            )?,
            InputProblem::TokenOutOfRange {
                token,
                record,
                id,
                vocab_size,
            } => write!(
                f,
                ": token {token} of the shard (record {record}) is id {id}, not below the \
                 vocabulary size {vocab_size} in manifest.json"
            )?,
            InputProblem::MaskByte {
                byte,
                record,
                value,
            } => write!(
                f,
                ": loss mask byte {byte} (record {record}) is {value}; a mask byte is 0 or 1"
            )?,
        }
        f.write_str(": the input is damaged; nothing was made from it (prep validate tells more)")
    }
}

/// Which file of a shard a read is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardPart {
    /// The tokens: `NAME.bin`.
    Bin,
    /// The loss mask: `NAME.mask`, a byte per token.
    Mask,
}

/// What the bytes of a file must hash to.
#[derive(Debug)]
enum Expected {
    /// Chunk by chunk, as its `.sum` lists.
    Chunks(ChunkSums),
    /// Whole, as the manifest lists (`None`: it lists nothing).
    Whole(Option<u64>),
}

/// One file's checks and which of its chunks have passed.
#[derive(Debug)]
struct FileChecks {
    path: PathBuf,
    len: u64,
    expected: Expected,
    passed: Box<[AtomicBool]>,
}

impl FileChecks {
    fn new(path: PathBuf, len: u64, expected: Expected) -> FileChecks {
        let n = match &expected {
            Expected::Chunks(sums) => sums.len(),
            Expected::Whole(_) => u64::from(len > 0),
        };
        FileChecks {
            path,
            len,
            expected,
            passed: iter::repeat_with(|| AtomicBool::new(false))
                .take(n as usize)
                .collect(),
        }
    }

    /// The chunk that holds byte `at` (`at` below the file's length).
    fn chunk_of(&self, at: u64) -> u64 {
        match &self.expected {
            Expected::Chunks(sums) => at / sums.chunk_bytes(),
            Expected::Whole(_) => 0,
        }
    }

    fn chunk(&self, c: u64) -> Range<u64> {
        match &self.expected {
            Expected::Chunks(sums) => sums.chunk(c).unwrap_or(self.len..self.len),
            Expected::Whole(_) => 0..self.len,
        }
    }

    fn passed(&self, c: u64) -> bool {
        self.passed[c as usize].load(Ordering::Acquire)
    }

    fn pass(&self, c: u64) {
        self.passed[c as usize].store(true, Ordering::Release);
    }

    /// The checksum problem of chunk `c` whose bytes hash to `found`, if any.
    fn checksum(&self, c: u64, found: u64) -> Option<InputProblem> {
        let (expected, listed_in) = match &self.expected {
            Expected::Chunks(sums) => match sums.check(c, found) {
                Ok(()) => return None,
                Err(bad) => match bad.problem {
                    super::ChunkProblem::Checksum { expected, .. } => (expected, "the .sum"),
                    _ => return Some(InputProblem::Short { got: 0 }),
                },
            },
            Expected::Whole(None) => return None,
            Expected::Whole(Some(expected)) => (*expected, "the manifest"),
        };
        (expected != found).then_some(InputProblem::Checksum {
            expected,
            found,
            listed_in,
        })
    }
}

/// One shard's checks.
#[derive(Debug)]
struct ShardChecks {
    bin: FileChecks,
    mask: Option<FileChecks>,
}

/// A dataset whose every read of tokens and masks is verified first: the
/// first read from a chunk of a `.bin` (its `.sum`'s chunks, or the whole
/// file without one) or of a `.mask` (the whole file) checks the whole
/// chunk (its XXH3, every id below `vocab_size`, every mask byte 0 or 1)
/// before any byte of it is handed out, once. Made by
/// [`Dataset::verified`]; shared by the threads of a stage (`Sync`: a
/// chunk's check is recorded atomically).
#[derive(Debug)]
pub struct Verified<'a> {
    ds: &'a Dataset,
    shards: Vec<ShardChecks>,
    /// Ids at or above this are refused; `None` when the dtype holds no
    /// id that large.
    limit: Option<u64>,
}

impl Dataset {
    /// This dataset, read through the checks of [`Verified`]: what a stage
    /// reads its input through. Checks every `.idx` and `.seg` whole first.
    ///
    /// # Errors
    /// A [`BadInput`] for an `.idx` or `.seg` whose XXH3 is not the one the
    /// manifest lists; a `.sum` of another size or checksum than listed, or
    /// that breaks its format.
    pub fn verified(&self) -> Result<Verified<'_>, FormatError> {
        let files = Files::Dir(self.dir().to_path_buf());
        let mut shards = Vec::with_capacity(self.n_shards());
        for (s, info) in self.manifest().shards.iter().enumerate() {
            self.check_whole(&info.idx, self.shards[s].idx.bytes(), &info.idx_xxh3)?;
            if let (Some((seg, _)), Some(name), Some(listed)) =
                (&self.shards[s].seg, &info.seg, &info.seg_xxh3)
            {
                self.check_whole(name, seg.bytes(), listed)?;
            }
            let expected = match files.chunk_sums(s, info) {
                Ok(sums) => Expected::Chunks(sums),
                Err(ReadError::Format(FormatError::NoChunkSums { .. })) => {
                    Expected::Whole(parse_hex(&info.bin_xxh3))
                }
                Err(ReadError::Format(e)) => return Err(e),
                Err(e) => {
                    return Err(FormatError::io(
                        self.dir(),
                        std::io::Error::other(e.to_string()),
                    ))
                }
            };
            let bin = FileChecks::new(self.dir().join(&info.bin), info.bin_bytes, expected);
            let mask = match (&info.mask, &self.shards[s].mask) {
                (Some(name), Some(map)) => Some(FileChecks::new(
                    self.dir().join(name),
                    map.bytes().len() as u64,
                    Expected::Whole(info.mask_xxh3.as_deref().and_then(parse_hex)),
                )),
                _ => None,
            };
            shards.push(ShardChecks { bin, mask });
        }
        Ok(Verified {
            ds: self,
            shards,
            limit: id_limit(self.manifest().vocab_size, self.dtype()),
        })
    }

    /// Checks an index file, read whole, against the XXH3 listed.
    fn check_whole(&self, name: &str, bytes: &[u8], listed: &str) -> Result<(), FormatError> {
        let found = xxh3_64(bytes);
        match parse_hex(listed) {
            Some(expected) if expected != found => Err(BadInput {
                path: self.dir().join(name),
                chunk: 0,
                range: 0..bytes.len() as u64,
                records: None,
                problem: InputProblem::Checksum {
                    expected,
                    found,
                    listed_in: "the manifest",
                },
            }
            .into()),
            _ => Ok(()),
        }
    }
}

/// The checksum `hex` lists, if it is one.
fn parse_hex(hex: &str) -> Option<u64> {
    u64::from_str_radix(hex, 16).ok()
}

/// The ids a dataset of `dtype` with `vocab_size` ids refuses: those at or
/// above the vocabulary size, `None` when the dtype cannot hold one.
pub fn id_limit(vocab_size: u64, dtype: Dtype) -> Option<u64> {
    let largest = (1u64 << (8 * dtype.size())) - 1;
    (vocab_size <= largest).then_some(vocab_size)
}

/// The position and value of the first id of `tokens` at or above `limit`.
///
/// Works in blocks: a block's maximum is cheap (the compiler vectorises
/// it), and only a block whose maximum is too large is looked at token by
/// token.
pub fn first_id_at_or_above(tokens: Tokens<'_>, limit: u64) -> Option<(usize, u64)> {
    fn scan<T: Copy + Ord + Default + Into<u64>>(ids: &[T], limit: u64) -> Option<(usize, u64)> {
        const IDS: usize = 1 << 14;
        for (k, block) in ids.chunks(IDS).enumerate() {
            if block.iter().copied().max().unwrap_or_default().into() >= limit {
                let i = block
                    .iter()
                    .position(|&id| id.into() >= limit)
                    .expect("the maximum is out of range");
                return Some((k * IDS + i, block[i].into()));
            }
        }
        None
    }
    match tokens {
        Tokens::U16(ids) => scan(ids, limit),
        Tokens::U32(ids) => scan(ids, limit),
    }
}

/// The first id of the little-endian tokens `bytes` (whole tokens of
/// `dtype`) at or above `limit`, decoded from bytes of any alignment.
fn first_id_in_bytes(bytes: &[u8], dtype: Dtype, limit: u64) -> Option<(usize, u64)> {
    match dtype {
        Dtype::U16 => match super::mmap_cast_u16(bytes) {
            Some(ids) => first_id_at_or_above(Tokens::U16(ids), limit),
            None => {
                let ids: Vec<u16> = bytes
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                first_id_at_or_above(Tokens::U16(&ids), limit)
            }
        },
        Dtype::U32 => match super::mmap_cast_u32(bytes) {
            Some(ids) => first_id_at_or_above(Tokens::U32(ids), limit),
            None => {
                let ids: Vec<u32> = bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                first_id_at_or_above(Tokens::U32(&ids), limit)
            }
        },
    }
}

impl<'a> Verified<'a> {
    /// The dataset read.
    pub fn dataset(&self) -> &'a Dataset {
        self.ds
    }

    fn checks(&self, s: usize, part: ShardPart) -> &FileChecks {
        match part {
            ShardPart::Bin => &self.shards[s].bin,
            ShardPart::Mask => self.shards[s]
                .mask
                .as_ref()
                .expect("a mask is read only from a dataset with masks"),
        }
    }

    /// The mapped bytes of shard `s`'s `part`.
    fn mapped(&self, s: usize, part: ShardPart) -> &'a [u8] {
        let shard = &self.ds.shards[s];
        match part {
            ShardPart::Bin => shard.bin.bytes(),
            ShardPart::Mask => shard.mask.as_ref().map_or(&[], |m| m.bytes()),
        }
    }

    /// Drops the pages of records `range` (their tokens, and their masks)
    /// from the process's memory once they have been read through the
    /// mapping: they stay in the page cache, and a later read maps them
    /// again. For a stage that reads each record once, in order, borrowed
    /// from the mapping (no copy), and must not keep a whole input in its
    /// resident memory. Records out of range are ignored.
    pub fn release_records(&self, range: Range<u64>) {
        let end = range.end.min(self.ds.len());
        if range.start >= end {
            return;
        }
        let size = self.ds.dtype().size();
        let (Ok((first, _)), Ok((last, _))) =
            (self.ds.locate(range.start), self.ds.locate(end - 1))
        else {
            return;
        };
        for s in first..=last {
            let base = self.ds.shard_first_record(s);
            let offsets = self.ds.shard_offsets(s);
            let n = (offsets.len() - 1) as u64;
            let (lo, hi) = (range.start.max(base) - base, end.min(base + n) - base);
            let (a, b) = (offsets[lo as usize] as usize, offsets[hi as usize] as usize);
            self.release(s, ShardPart::Bin, a * size..b * size);
            self.release(s, ShardPart::Mask, a..b);
        }
    }

    /// Drops bytes `range` of shard `s`'s `part` from the process's memory
    /// (see [`super::mmap::Mapping::release`]).
    fn release(&self, s: usize, part: ShardPart, range: Range<usize>) {
        let shard = &self.ds.shards[s];
        match part {
            ShardPart::Bin => shard.bin.release(range),
            ShardPart::Mask => {
                if let Some(mask) = &shard.mask {
                    mask.release(range);
                }
            }
        }
    }

    /// The records of the dataset that hold tokens `tokens` of shard `s`
    /// (clamped to the shard): the first and the last.
    fn records_of(&self, s: usize, tokens: Range<u64>) -> Option<(u64, u64)> {
        let offsets = self.ds.shard_offsets(s);
        let n = offsets.len().checked_sub(1).filter(|&n| n > 0)?;
        let record = |t: u64| {
            let r = offsets.partition_point(|&o| o <= t).saturating_sub(1);
            self.ds.shard_first_record(s) + r.min(n - 1) as u64
        };
        Some((
            record(tokens.start),
            record(tokens.end.saturating_sub(1).max(tokens.start)),
        ))
    }

    /// The failure of chunk `c` of shard `s`'s `part`.
    fn bad(&self, s: usize, part: ShardPart, c: u64, problem: InputProblem) -> FormatError {
        let checks = self.checks(s, part);
        let range = checks.chunk(c);
        let unit = match part {
            ShardPart::Bin => self.ds.dtype().size() as u64,
            ShardPart::Mask => 1,
        };
        BadInput {
            path: checks.path.clone(),
            chunk: c,
            records: self.records_of(s, range.start / unit..range.end.div_ceil(unit)),
            range,
            problem,
        }
        .into()
    }

    /// Checks what chunk `c` of shard `s`'s `part` holds besides its
    /// checksum: `bytes` are the file's from `start` (a chunk's start, or a
    /// block's within it), and hold the tokens that start before `end`.
    fn check_content(
        &self,
        s: usize,
        part: ShardPart,
        c: u64,
        start: u64,
        bytes: &[u8],
    ) -> Result<(), FormatError> {
        match part {
            ShardPart::Bin => {
                let Some(limit) = self.limit else {
                    return Ok(());
                };
                let dtype = self.ds.dtype();
                let size = dtype.size() as u64;
                // The tokens that start in the bytes: a token split across
                // two chunks is checked with the first.
                let skip = (start.next_multiple_of(size) - start) as usize;
                let whole = bytes.len().saturating_sub(skip) / size as usize * size as usize;
                let tokens = &bytes[skip.min(bytes.len())..skip.min(bytes.len()) + whole];
                match first_id_in_bytes(tokens, dtype, limit) {
                    None => Ok(()),
                    Some((i, id)) => {
                        let token = start.div_ceil(size) + i as u64;
                        let record = self.records_of(s, token..token + 1).map_or(0, |r| r.0);
                        Err(self.bad(
                            s,
                            part,
                            c,
                            InputProblem::TokenOutOfRange {
                                token,
                                record,
                                id,
                                vocab_size: limit,
                            },
                        ))
                    }
                }
            }
            ShardPart::Mask => match bytes.iter().position(|&b| b > 1) {
                None => Ok(()),
                Some(i) => {
                    let byte = start + i as u64;
                    let record = self.records_of(s, byte..byte + 1).map_or(0, |r| r.0);
                    Err(self.bad(
                        s,
                        part,
                        c,
                        InputProblem::MaskByte {
                            byte,
                            record,
                            value: bytes[i],
                        },
                    ))
                }
            },
        }
    }

    /// Checks chunk `c` of shard `s`'s `part` from `bytes`: the chunk's, and
    /// after them at most a token's more (the end of a token the chunk
    /// splits). Records that it passed.
    fn check_chunk(
        &self,
        s: usize,
        part: ShardPart,
        c: u64,
        bytes: &[u8],
    ) -> Result<(), FormatError> {
        let checks = self.checks(s, part);
        let range = checks.chunk(c);
        let len = (range.end - range.start) as usize;
        if bytes.len() < len {
            let got = bytes.len() as u64;
            return Err(self.bad(s, part, c, InputProblem::Short { got }));
        }
        if let Some(problem) = checks.checksum(c, xxh3_64(&bytes[..len])) {
            return Err(self.bad(s, part, c, problem));
        }
        self.check_content(s, part, c, range.start, &bytes[..len.min(bytes.len())])?;
        if bytes.len() > len {
            // The token split by the chunk's end, checked with this chunk.
            let size = self.ds.dtype().size() as u64;
            let last = range.end / size * size;
            if part == ShardPart::Bin && last < range.end && last >= range.start {
                let from = (last - range.start) as usize;
                self.check_content(s, part, c, last, &bytes[from..])?;
            }
        }
        checks.pass(c);
        Ok(())
    }

    /// Makes sure bytes `range` of shard `s`'s `part` have passed their
    /// checks, checking from the mapping the chunks that have not.
    fn ensure_mapped(
        &self,
        s: usize,
        part: ShardPart,
        range: Range<u64>,
    ) -> Result<(), FormatError> {
        let checks = self.checks(s, part);
        if range.start >= range.end {
            return Ok(());
        }
        let mapped = self.mapped(s, part);
        let size = match part {
            ShardPart::Bin => self.ds.dtype().size() as u64,
            ShardPart::Mask => 1,
        };
        for c in checks.chunk_of(range.start)..=checks.chunk_of(range.end - 1) {
            if checks.passed(c) {
                continue;
            }
            let r = checks.chunk(c);
            let end = (r.end + size - 1).min(mapped.len() as u64);
            let checked = self.check_chunk(s, part, c, &mapped[r.start as usize..end as usize]);
            if r.end - r.start > MAX_CACHED_CHUNK {
                // More than a stage holds at once (a whole `.bin` without a
                // `.sum`, a `.mask`): its pages leave the process's memory
                // once checked, and come back as its records are read.
                self.release(s, part, r.start as usize..end as usize);
            }
            checked?;
        }
        Ok(())
    }

    /// Record `index` as the little-endian bytes of the `.bin`, borrowed
    /// from the mapping, once the chunks that hold it have passed.
    ///
    /// # Errors
    /// [`BadInput`] for a chunk that fails; an index past the end.
    pub fn record_bytes(&self, index: u64) -> Result<&'a [u8], FormatError> {
        let (s, local) = self.ds.locate(index)?;
        let o = self.ds.shard_offsets(s);
        let size = self.ds.dtype().size() as u64;
        let range = o[local] * size..o[local + 1] * size;
        self.ensure_mapped(s, ShardPart::Bin, range.clone())?;
        Ok(&self.ds.shard_bin(s)[range.start as usize..range.end as usize])
    }

    /// Calls `f(index, tokens, mask)` for records `range` in order (past
    /// the end: none), each its tokens' little-endian bytes and (in a
    /// dataset with masks) its mask, borrowed from the mapping once the
    /// chunks that hold them have passed: what [`Verified::record_bytes`]
    /// and [`Verified::loss_mask`] give record by record, for a stage that
    /// walks its input in order. A chunk's checks are looked up once, when
    /// the walk first reaches it, not once per record.
    ///
    /// # Errors
    /// [`BadInput`] for a chunk that fails (the records before it have
    /// been handed out); what `f` returns.
    pub fn for_each_in_order<E: From<FormatError>>(
        &self,
        range: Range<u64>,
        mut f: impl FnMut(u64, &'a [u8], Option<&'a [u8]>) -> Result<(), E>,
    ) -> Result<(), E> {
        let end = range.end.min(self.ds.len());
        if range.start >= end {
            return Ok(());
        }
        let size = self.ds.dtype().size() as u64;
        let (first, _) = self.ds.locate(range.start)?;
        let (last, _) = self.ds.locate(end - 1)?;
        for s in first..=last {
            let base = self.ds.shard_first_record(s);
            let o = self.ds.shard_offsets(s);
            let n = (o.len() - 1) as u64;
            let (lo, hi) = (range.start.max(base) - base, end.min(base + n) - base);
            let bin = self.mapped(s, ShardPart::Bin);
            let masked = self.shards[s].mask.is_some();
            let mask = self.mapped(s, ShardPart::Mask);
            // The end of the chunks passed so far: bytes before it need no look.
            let (mut bin_passed, mut mask_passed) = (0u64, 0u64);
            for local in lo as usize..hi as usize {
                let (a, b) = (o[local], o[local + 1]);
                if b * size > bin_passed {
                    self.ensure_mapped(s, ShardPart::Bin, a * size..b * size)?;
                    bin_passed = self.passed_through(s, ShardPart::Bin, b * size);
                }
                let m = match masked {
                    true => {
                        if b > mask_passed {
                            self.ensure_mapped(s, ShardPart::Mask, a..b)?;
                            mask_passed = self.passed_through(s, ShardPart::Mask, b);
                        }
                        Some(&mask[a as usize..b as usize])
                    }
                    false => None,
                };
                f(
                    base + local as u64,
                    &bin[(a * size) as usize..(b * size) as usize],
                    m,
                )?;
            }
        }
        Ok(())
    }

    /// The end of the chunk of shard `s`'s `part` that holds the byte
    /// before `end`: once bytes up to `end` have passed, every byte before
    /// this has.
    fn passed_through(&self, s: usize, part: ShardPart, end: u64) -> u64 {
        let checks = self.checks(s, part);
        checks.chunk(checks.chunk_of(end - 1)).end
    }

    /// Record `index`'s tokens, borrowed, once checked.
    ///
    /// # Errors
    /// As [`Verified::record_bytes`].
    pub fn record(&self, index: u64) -> Result<Tokens<'a>, FormatError> {
        self.record_bytes(index)?;
        self.ds.record(index)
    }

    /// Record `index`'s loss mask, once checked; `None` for a dataset
    /// without masks.
    ///
    /// # Errors
    /// As [`Verified::record_bytes`], for the `.mask`.
    pub fn loss_mask(&self, index: u64) -> Result<Option<&'a [u8]>, FormatError> {
        let (s, local) = self.ds.locate(index)?;
        if self.shards[s].mask.is_none() {
            return Ok(None);
        }
        let o = self.ds.shard_offsets(s);
        let range = o[local]..o[local + 1];
        self.ensure_mapped(s, ShardPart::Mask, range.clone())?;
        Ok(Some(
            &self.mapped(s, ShardPart::Mask)[range.start as usize..range.end as usize],
        ))
    }

    /// Tokens `range` of the dataset as [`Dataset::tokens`] gives them, once
    /// every chunk they lie in has passed.
    ///
    /// # Errors
    /// [`BadInput`] for a chunk that fails; a range past the end.
    pub fn tokens(
        &self,
        range: Range<u64>,
    ) -> Result<impl Iterator<Item = Tokens<'a>> + 'a, FormatError> {
        let size = self.ds.dtype().size() as u64;
        let mut first = 0u64;
        for s in 0..self.ds.n_shards() {
            let n = self.ds.manifest().shards[s].n_tokens;
            let (lo, hi) = (range.start.max(first), range.end.min(first + n));
            if lo < hi {
                self.ensure_mapped(s, ShardPart::Bin, (lo - first) * size..(hi - first) * size)?;
            }
            first += n;
        }
        self.ds.tokens(range)
    }

    /// Checks every chunk of shard `s` (its `.bin`, and its `.mask` if it
    /// has one) that has not passed yet: for a stage that takes a shard
    /// whole without reading its records (`prep merge`'s links).
    ///
    /// # Errors
    /// [`BadInput`] for a chunk that fails.
    pub fn check_shard(&self, s: usize) -> Result<(), FormatError> {
        let info: &ShardInfo = &self.ds.manifest().shards[s];
        self.ensure_mapped(s, ShardPart::Bin, 0..info.bin_bytes)?;
        if let Some(mask) = &self.shards[s].mask {
            self.ensure_mapped(s, ShardPart::Mask, 0..mask.len)?;
        }
        Ok(())
    }

    /// The chunks of the `.bin`s that hold records `records`, as (shard,
    /// byte range) pairs, each checked as one: a stage that checks its input
    /// ahead of reading it, on several threads, hands each thread its own
    /// ([`Verified::check_bin`]). A shard without a `.sum` is one chunk,
    /// the whole file.
    pub fn bin_chunks(&self, records: Range<u64>) -> Vec<(usize, Range<u64>)> {
        let records = records.start..records.end.min(self.ds.len());
        if records.is_empty() {
            return Vec::new();
        }
        let size = self.ds.dtype().size() as u64;
        let (first, at) = self.ds.locate(records.start).expect("in range");
        let (last, to) = self.ds.locate(records.end - 1).expect("in range");
        let mut chunks = Vec::new();
        for s in first..=last {
            let o = self.ds.shard_offsets(s);
            let from = if s == first { o[at] } else { 0 };
            let end = if s == last { o[to + 1] } else { o[o.len() - 1] };
            if from == end {
                continue;
            }
            let checks = &self.shards[s].bin;
            let (c0, c1) = (
                checks.chunk_of(from * size),
                checks.chunk_of(end * size - 1),
            );
            chunks.extend((c0..=c1).map(|c| (s, checks.chunk(c))));
        }
        chunks
    }

    /// Checks, from the mapping, the chunks of shard `s`'s `.bin` that hold
    /// bytes `range` and have not passed yet (as the first read from them
    /// would).
    ///
    /// # Errors
    /// [`BadInput`] for a chunk that fails.
    pub fn check_bin(&self, s: usize, range: Range<u64>) -> Result<(), FormatError> {
        self.ensure_mapped(s, ShardPart::Bin, range)
    }

    /// A reader of shard `s`'s `part` by positioned reads, not through the
    /// mapping (whose pages would stay in the process's memory once
    /// touched). `in_order`: reads come in file order (a stage that walks
    /// the shard), so whole chunks are read at once and handed out from
    /// memory; otherwise (reads at random, as pack's rows make them) a
    /// chunk's first read checks the whole chunk in place, from the mapping,
    /// whose pages then leave the process's memory again, and every read
    /// reads just the bytes asked for.
    pub fn reader(&self, s: usize, part: ShardPart, in_order: bool) -> ShardReader<'_, 'a> {
        ShardReader {
            v: self,
            s,
            part,
            in_order,
            file: None,
            buf: Vec::new(),
            at: 0,
            valid: 0,
        }
    }
}

/// Positioned, verified reads of one file of a shard (see
/// [`Verified::reader`]).
pub struct ShardReader<'v, 'a> {
    v: &'v Verified<'a>,
    s: usize,
    part: ShardPart,
    in_order: bool,
    file: Option<File>,
    /// Checked bytes of the file, from `at`: `buf[..valid]`.
    buf: Vec<u8>,
    at: u64,
    valid: usize,
}

impl ShardReader<'_, '_> {
    fn io(&self, e: std::io::Error) -> FormatError {
        FormatError::io(self.v.checks(self.s, self.part).path.clone(), e)
    }

    fn file(&mut self) -> Result<&File, FormatError> {
        if self.file.is_none() {
            let path = &self.v.checks(self.s, self.part).path;
            self.file = Some(File::open(path).map_err(|e| FormatError::io(path, e))?);
        }
        Ok(self.file.as_ref().expect("just opened"))
    }

    /// Reads bytes `range` of the file into `buf`, as many as there are.
    fn load(&mut self, range: Range<u64>) -> Result<(), FormatError> {
        let want = (range.end - range.start) as usize;
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(want, 0);
        let mut got = 0;
        while got < want {
            let read = self
                .file()?
                .read_at(&mut buf[got..], range.start + got as u64);
            match read {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io(e)),
            }
        }
        buf.truncate(got);
        self.buf = buf;
        self.at = range.start;
        self.valid = 0;
        Ok(())
    }

    /// Checks chunk `c`, too large to hold, by reading it in blocks.
    fn check_streaming(&mut self, c: u64) -> Result<(), FormatError> {
        let (v, s, part) = (self.v, self.s, self.part);
        let checks = v.checks(s, part);
        let range = checks.chunk(c);
        let mut hasher = Xxh3::new();
        let mut at = range.start;
        // A bad id or mask byte is reported only once the checksum has
        // passed: a damaged chunk is named as damaged, as a chunk held
        // whole is.
        let mut content = Ok(());
        while at < range.end {
            // Blocks are whole tokens: BLOCK is a multiple of every size.
            self.load(at..(at + BLOCK as u64).min(range.end))?;
            if self.buf.is_empty() {
                let got = at - range.start;
                return Err(v.bad(s, part, c, InputProblem::Short { got }));
            }
            hasher.update(&self.buf);
            if content.is_ok() {
                content = v.check_content(s, part, c, at, &self.buf);
            }
            at += self.buf.len() as u64;
        }
        self.buf.clear();
        if let Some(problem) = checks.checksum(c, hasher.digest()) {
            return Err(v.bad(s, part, c, problem));
        }
        content?;
        checks.pass(c);
        Ok(())
    }

    /// Fills `out` with the file's bytes from `start`, each from a chunk
    /// that has passed its checks.
    ///
    /// # Errors
    /// [`BadInput`] for a chunk that fails; a read error, or a file that
    /// ends before `out` is full, naming the file.
    pub fn read(&mut self, start: u64, out: &mut [u8]) -> Result<(), FormatError> {
        let (v, s, part) = (self.v, self.s, self.part);
        let checks = v.checks(s, part);
        let (mut pos, mut filled) = (start, 0usize);
        while filled < out.len() {
            let want = out.len() - filled;
            if pos >= self.at && pos < self.at + self.valid as u64 {
                let from = (pos - self.at) as usize;
                let n = want.min(self.valid - from);
                out[filled..filled + n].copy_from_slice(&self.buf[from..from + n]);
                filled += n;
                pos += n as u64;
                continue;
            }
            if pos >= checks.len {
                let e = std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("read past the end of the file's {} bytes", checks.len),
                );
                return Err(self.io(e));
            }
            let c = checks.chunk_of(pos);
            let range = checks.chunk(c);
            let large = range.end - range.start > MAX_CACHED_CHUNK;
            if !checks.passed(c) {
                if large {
                    self.check_streaming(c)?;
                } else if !self.in_order {
                    // Reads at random use only a piece of the chunk: it is
                    // checked in place, from the mapping (no copy), and its
                    // pages then leave this process's memory again.
                    let size = match part {
                        ShardPart::Bin => v.ds.dtype().size() as u64,
                        ShardPart::Mask => 1,
                    };
                    let end = (range.end + size - 1).min(checks.len) as usize;
                    let checked =
                        v.check_chunk(s, part, c, &v.mapped(s, part)[range.start as usize..end]);
                    v.release(s, part, range.start as usize..end);
                    checked?;
                    continue;
                } else {
                    let size = match part {
                        ShardPart::Bin => v.ds.dtype().size() as u64,
                        ShardPart::Mask => 1,
                    };
                    self.load(range.start..(range.end + size - 1).min(checks.len))?;
                    v.check_chunk(s, part, c, &self.buf)?;
                    self.valid = (range.end - range.start) as usize;
                    continue;
                }
            }
            if self.in_order {
                let from = if large { pos } else { range.start };
                let to = if large {
                    (pos + BLOCK as u64).min(range.end)
                } else {
                    range.end
                };
                self.load(from..to)?;
                self.valid = self.buf.len();
                if self.valid == 0 {
                    let e = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
                    return Err(self.io(e));
                }
                continue;
            }
            let n = want.min((range.end - pos) as usize);
            let file = self.file()?;
            if let Err(e) = file.read_exact_at(&mut out[filled..filled + n], pos) {
                return Err(self.io(e));
            }
            filled += n;
            pos += n as u64;
        }
        Ok(())
    }

    /// Appends the file's bytes `range` to `out`.
    ///
    /// # Errors
    /// As [`ShardReader::read`].
    pub fn read_append(&mut self, range: Range<u64>, out: &mut Vec<u8>) -> Result<(), FormatError> {
        let at = out.len();
        out.resize(at + (range.end - range.start) as usize, 0);
        self.read(range.start, &mut out[at..])
    }
}

impl From<BadInput> for FormatError {
    fn from(bad: BadInput) -> FormatError {
        FormatError::BadInput(Box::new(bad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{
        atomic_write, checksum_hex, DatasetWriter, DocumentCounts, Manifest, Provenance,
        TokenizerInfo, MANIFEST_FILE,
    };
    use std::path::Path;

    /// Chunks of this many bytes: a small dataset has many.
    const CHUNK: u64 = 10;

    /// Records `i = 0..n` of `3 + i % 5` tokens `i + k`, below 40.
    fn records(n: u32) -> Vec<Vec<u32>> {
        (0..n)
            .map(|i| (0..3 + i % 5).map(|k| (i + k) % 40).collect())
            .collect()
    }

    /// A one-shard uint16 dataset of `records` with vocabulary 40 whose
    /// `.sum` has chunks of [`CHUNK`] bytes (none with `sums` false).
    fn write(dir: &Path, records: &[Vec<u32>], sums: bool) {
        let mut w = DatasetWriter::new(dir, Dtype::U16, 1 << 30, Vec::new());
        for r in records {
            w.push(r).unwrap();
        }
        let mut shards = w.finish().unwrap();
        let info = &mut shards[0];
        let bin = std::fs::read(dir.join(&info.bin)).unwrap();
        let chunk_sums: Vec<u64> = bin.chunks(CHUNK as usize).map(xxh3_64).collect();
        let sum = ChunkSums::encode(CHUNK, &chunk_sums);
        atomic_write(&dir.join(info.sum.as_ref().unwrap()), &sum).unwrap();
        info.sum_bytes = Some(sum.len() as u64);
        info.sum_xxh3 = Some(checksum_hex(xxh3_64(&sum)));
        if !sums {
            info.sum = None;
            info.sum_bytes = None;
            info.sum_xxh3 = None;
        }
        let tokenizer = TokenizerInfo {
            file: None,
            xxh3: checksum_hex(0),
        };
        let n = records.len() as u64;
        let provenance = Provenance::new(
            "test",
            Vec::new(),
            serde_json::json!({}),
            DocumentCounts::all_written(n),
            checksum_hex(0),
        );
        let m = Manifest::documents(Dtype::U16, 40, tokenizer, shards, provenance);
        atomic_write(&dir.join(MANIFEST_FILE), m.to_json().as_bytes()).unwrap();
    }

    /// Every record as read by the mapped view and by both kinds of reader.
    fn read_all(ds: &Dataset) -> Result<Vec<[Vec<u8>; 4]>, FormatError> {
        let v = ds.verified()?;
        let mut in_order = v.reader(0, ShardPart::Bin, true);
        let mut at_random = v.reader(0, ShardPart::Bin, false);
        let o = ds.shard_offsets(0);
        let mut out = Vec::new();
        // Random reads from the last record back.
        for i in (0..ds.len()).rev() {
            let range = o[i as usize] * 2..o[i as usize + 1] * 2;
            let mut b = Vec::new();
            at_random.read_append(range, &mut b)?;
            out.push([Vec::new(), Vec::new(), b, Vec::new()]);
        }
        out.reverse();
        for i in 0..ds.len() {
            let range = o[i as usize] * 2..o[i as usize + 1] * 2;
            out[i as usize][0] = v.record_bytes(i)?.to_vec();
            in_order.read_append(range, &mut out[i as usize][1])?;
        }
        ds.verified()?
            .for_each_in_order(0..ds.len() + 3, |i, tokens, mask| {
                assert!(mask.is_none());
                out[i as usize][3] = tokens.to_vec();
                Ok::<(), FormatError>(())
            })?;
        Ok(out)
    }

    fn bad_input(e: FormatError) -> BadInput {
        match e {
            FormatError::BadInput(bad) => *bad,
            other => panic!("not a BadInput: {other}"),
        }
    }

    #[test]
    fn every_path_reads_what_the_dataset_holds() {
        for sums in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            write(dir.path(), &records(30), sums);
            let ds = Dataset::open(dir.path()).unwrap();
            let all = read_all(&ds).unwrap();
            for (i, [a, b, c, d]) in all.iter().enumerate() {
                let want = ds.record_bytes(i as u64).unwrap();
                let got = (&a[..], &b[..], &c[..], &d[..]);
                assert_eq!(got, (want, want, want, want), "record {i}");
            }
            // Any part of the records, in order.
            let v = ds.verified().unwrap();
            for range in [0..0, 0..1, 7..19, 29..30, 29..40, 31..35] {
                let mut seen = Vec::new();
                v.for_each_in_order(range.clone(), |i, tokens, _| {
                    assert_eq!(tokens, ds.record_bytes(i).unwrap());
                    seen.push(i);
                    Ok::<(), FormatError>(())
                })
                .unwrap();
                assert_eq!(seen, (range.start..range.end.min(30)).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn released_records_read_the_same_again() {
        let dir = tempfile::tempdir().unwrap();
        let recs = records(3000);
        write(dir.path(), &recs, true);
        let ds = Dataset::open(dir.path()).unwrap();
        let v = ds.verified().unwrap();
        for (batch, range) in [
            (0u64, 0..1000u64),
            (1, 1000..3000),
            (2, 2990..5000),
            (3, 7..7),
        ] {
            for g in range.start..range.end.min(3000) {
                assert_eq!(
                    v.record(g).unwrap().to_vec(),
                    recs[g as usize],
                    "batch {batch}"
                );
            }
            v.release_records(range);
        }
        for (g, want) in recs.iter().enumerate() {
            assert_eq!(&v.record(g as u64).unwrap().to_vec(), want);
        }
    }

    #[test]
    fn a_flipped_byte_is_named_by_file_chunk_and_records_on_every_path() {
        let dir = tempfile::tempdir().unwrap();
        let recs = records(30);
        write(dir.path(), &recs, true);
        let bin = dir.path().join("shard-00000.bin");
        let mut bytes = std::fs::read(&bin).unwrap();
        let at = 57;
        bytes[at] ^= 0x04;
        std::fs::write(&bin, &bytes).unwrap();
        let ds = Dataset::open(dir.path()).unwrap();
        let v = ds.verified().unwrap();
        let o = ds.shard_offsets(0);
        let token = at as u64 / 2;
        let record = o.partition_point(|&x| x <= token) as u64 - 1;
        let mut walked = 0;
        let mut errors = vec![
            v.record_bytes(record).unwrap_err(),
            read_all(&ds).unwrap_err(),
            ds.verified()
                .unwrap()
                .for_each_in_order(0..30, |_, _, _| {
                    walked += 1;
                    Ok::<(), FormatError>(())
                })
                .unwrap_err(),
        ];
        // The walk handed out the records before the bad chunk, and no more.
        assert!(walked <= record && walked >= o.partition_point(|&x| x * 2 < 50) as u64 - 1);
        let mut b = Vec::new();
        let range = o[record as usize] * 2..o[record as usize + 1] * 2;
        errors.push(
            ds.verified()
                .unwrap()
                .reader(0, ShardPart::Bin, false)
                .read_append(range, &mut b)
                .unwrap_err(),
        );
        for e in errors {
            let text = e.to_string();
            let bad = bad_input(e);
            assert_eq!(bad.path, bin, "{text}");
            assert_eq!(bad.chunk, at as u64 / CHUNK, "{text}");
            assert_eq!(bad.range, 50..60, "{text}");
            let (first, last) = bad.records.unwrap();
            assert!(first <= record && record <= last, "{text}");
            assert!(
                matches!(bad.problem, InputProblem::Checksum { .. }),
                "{text}"
            );
            assert!(text.contains("chunk 5 (bytes 50..60, records"), "{text}");
        }
        // A record wholly in other chunks still reads.
        assert_eq!(v.record_bytes(0).unwrap(), ds.record_bytes(0).unwrap());
    }

    #[test]
    fn an_id_past_the_vocabulary_and_a_bad_whole_file_are_named() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &records(30), false);
        let bin = dir.path().join("shard-00000.bin");
        let mut bytes = std::fs::read(&bin).unwrap();
        bytes[40..42].copy_from_slice(&41u16.to_le_bytes());
        std::fs::write(&bin, &bytes).unwrap();
        // Without a .sum the whole .bin is one chunk, against bin_xxh3.
        let ds = Dataset::open(dir.path()).unwrap();
        let bad = bad_input(read_all(&ds).unwrap_err());
        assert_eq!((bad.chunk, bad.range.clone()), (0, 0..bytes.len() as u64));
        assert!(bad.to_string().contains("the manifest lists"), "{bad}");
        drop(ds);
        // With the checksum made to match, the id is what fails.
        let mut m = Manifest::read(dir.path()).unwrap();
        m.shards[0].bin_xxh3 = checksum_hex(xxh3_64(&bytes));
        atomic_write(&dir.path().join(MANIFEST_FILE), m.to_json().as_bytes()).unwrap();
        let ds = Dataset::open(dir.path()).unwrap();
        let bad = bad_input(read_all(&ds).unwrap_err());
        let o = ds.shard_offsets(0);
        let record = o.partition_point(|&x| x <= 20) as u64 - 1;
        assert_eq!(
            bad.problem,
            InputProblem::TokenOutOfRange {
                token: 20,
                record,
                id: 41,
                vocab_size: 40
            }
        );
        assert!(
            bad.to_string().contains("token 20 of the shard (record"),
            "{bad}"
        );
    }

    #[test]
    fn a_whole_file_too_large_to_hold_is_checked_as_it_streams_by() {
        // No .sum, and a .bin larger than a chunk held in memory at once.
        let dir = tempfile::tempdir().unwrap();
        let n = (MAX_CACHED_CHUNK / 2 / 100_000 + 2) as u32;
        let recs: Vec<Vec<u32>> = (0..n)
            .map(|i| (0..100_000u32).map(|k| (i + k) % 40).collect())
            .collect();
        write(dir.path(), &recs, false);
        let ds = Dataset::open(dir.path()).unwrap();
        assert!(ds.shard_bin(0).len() as u64 > MAX_CACHED_CHUNK);
        for (i, [a, b, c, d]) in read_all(&ds).unwrap().iter().enumerate() {
            let want = ds.record_bytes(i as u64).unwrap();
            let got = (&a[..], &b[..], &c[..], &d[..]);
            assert_eq!(got, (want, want, want, want), "record {i}");
        }
        drop(ds);
        let bin = dir.path().join("shard-00000.bin");
        let mut bytes = std::fs::read(&bin).unwrap();
        bytes[(MAX_CACHED_CHUNK + 3) as usize] ^= 1;
        std::fs::write(&bin, &bytes).unwrap();
        let ds = Dataset::open(dir.path()).unwrap();
        let v = ds.verified().unwrap();
        for in_order in [true, false] {
            let mut first = vec![0u8; 8];
            let bad = bad_input(
                v.reader(0, ShardPart::Bin, in_order)
                    .read(0, &mut first)
                    .unwrap_err(),
            );
            assert_eq!((bad.chunk, bad.range), (0, 0..bytes.len() as u64));
            assert!(matches!(
                bad.problem,
                InputProblem::Checksum {
                    listed_in: "the manifest",
                    ..
                }
            ));
        }
    }

    #[test]
    fn ids_are_found_in_any_block_and_limits_follow_the_dtype() {
        let mut ids = vec![3u16; 40_000];
        assert_eq!(first_id_at_or_above(Tokens::U16(&ids), 4), None);
        ids[33_333] = 4;
        ids[39_000] = 9;
        assert_eq!(
            first_id_at_or_above(Tokens::U16(&ids), 4),
            Some((33_333, 4))
        );
        assert_eq!(id_limit(65_536, Dtype::U16), None);
        assert_eq!(id_limit(65_535, Dtype::U16), Some(65_535));
        assert_eq!(id_limit(50_257, Dtype::U32), Some(50_257));
    }
}
