//! The reader of datasets, one type over two storages: a local directory
//! mapped whole (records handed out as borrowed slices, no copy), or files
//! read by range from a local directory or object storage.

use std::borrow::Cow;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::files::{File, Files, ReadError};
use super::index::check_offsets;
use super::mmap::{bytes_of, cast, little_endian, Mapping};
use super::segments::{row_violation, row_window, SegHeader, Segment};
use super::{
    Dtype, FormatError, IdxHeader, Manifest, ShardInfo, IDX_HEADER_LEN, SEGMENT_BYTES,
    SEG_HEADER_LEN,
};

/// The tokens of one record, borrowed from the mapped `.bin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens<'a> {
    /// A `uint16` dataset.
    U16(&'a [u16]),
    /// A `uint32` dataset.
    U32(&'a [u32]),
}

impl<'a> Tokens<'a> {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        match self {
            Tokens::U16(t) => t.len(),
            Tokens::U32(t) => t.len(),
        }
    }

    /// True when the record holds no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token `i` widened to u32, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<u32> {
        match self {
            Tokens::U16(t) => t.get(i).map(|&x| u32::from(x)),
            Tokens::U32(t) => t.get(i).copied(),
        }
    }

    /// The tokens as the `.bin` stores them (little-endian), borrowed: what
    /// a copy to another buffer or a device moves, without decoding.
    pub fn as_bytes(&self) -> &'a [u8] {
        match *self {
            Tokens::U16(t) => bytes_of(t),
            Tokens::U32(t) => bytes_of(t),
        }
    }

    /// The tokens widened to u32, in a new vector.
    pub fn to_vec(&self) -> Vec<u32> {
        self.iter().collect()
    }

    /// The tokens widened to u32.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        let (a, b) = match *self {
            Tokens::U16(t) => (Some(t.iter().map(|&x| u32::from(x))), None),
            Tokens::U32(t) => (None, Some(t.iter().copied())),
        };
        a.into_iter().flatten().chain(b.into_iter().flatten())
    }
}

/// Where a [`Dataset`]'s files are and how they are read: [`Mapped`] (a
/// local directory, every file mapped for the dataset's lifetime, records
/// borrowed from the mappings) or [`Files`] (a local directory or an
/// object-storage prefix, read by range on demand). Sealed: these two are
/// the storages prep reads.
///
/// Everything about a dataset's layout and its rules (the shard headers
/// against the manifest, where a record's tokens lie, a row's pieces) is
/// written once, in [`Dataset`], over the few operations here.
pub trait Storage: sealed::Sealed + Sized {
    /// One open file of the dataset.
    type File: std::fmt::Debug + Send + Sync;
    /// A range of a file's bytes: borrowed from a mapping, or owned.
    type Bytes<'a>: std::ops::Deref<Target = [u8]>
    where
        Self: 'a;
    /// A packed row's pieces: borrowed from a mapping, or owned.
    type Segments<'a>: std::ops::Deref<Target = [Segment]> + IntoIterator
    where
        Self: 'a;
    /// Why reading failed.
    type Error: From<FormatError> + std::fmt::Debug + std::fmt::Display;
    /// How the file `name` (relative to the dataset) is called in messages.
    fn path_of(&self, name: &str) -> PathBuf;
    /// Reads and parses the manifest.
    fn read_manifest(&self) -> Result<Manifest, Self::Error>;
    /// Opens the file `name`, which the dataset must have.
    fn open_file(&self, name: &str) -> Result<Self::File, Self::Error>;
    /// A file's length in bytes.
    fn file_len(file: &Self::File) -> u64;
    /// The bytes of `range` of `file`, clamped to the file.
    fn read(file: &Self::File, range: Range<u64>) -> Result<Self::Bytes<'_>, Self::Error>;
    /// A row's pieces from the bytes of their `.seg` entries: a view of
    /// the mapping, or decoded.
    fn segments<'a>(bytes: Self::Bytes<'a>) -> Self::Segments<'a>
    where
        Self: 'a;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Mapped {}
    impl Sealed for super::Files {}
}

/// A local dataset directory whose files are mapped: what training code,
/// the loader and every stage read. Records are borrowed slices of the
/// mappings, and opening checks every index whole (cheap: they are mapped).
#[derive(Debug, Clone)]
pub struct Mapped {
    dir: PathBuf,
}

impl Storage for Mapped {
    type File = Mapping;
    type Bytes<'a> = &'a [u8];
    type Segments<'a> = &'a [Segment];
    type Error = FormatError;

    fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn read_manifest(&self) -> Result<Manifest, FormatError> {
        Manifest::read(&self.dir)
    }

    fn open_file(&self, name: &str) -> Result<Mapping, FormatError> {
        Mapping::open(&self.dir.join(name))
    }

    fn file_len(file: &Mapping) -> u64 {
        file.bytes().len() as u64
    }

    fn read(file: &Mapping, range: Range<u64>) -> Result<&[u8], FormatError> {
        let bytes = file.bytes();
        let end = (range.end as usize).min(bytes.len());
        Ok(&bytes[(range.start as usize).min(end)..end])
    }

    fn segments<'a>(bytes: &'a [u8]) -> &'a [Segment]
    where
        Self: 'a,
    {
        cast::<Segment>(bytes).expect("checked at open")
    }
}

impl Storage for Files {
    type File = File;
    type Bytes<'a> = Cow<'a, [u8]>;
    type Segments<'a> = Vec<Segment>;
    type Error = ReadError;

    fn path_of(&self, name: &str) -> PathBuf {
        Files::path_of(self, name)
    }

    fn read_manifest(&self) -> Result<Manifest, ReadError> {
        let Some(bytes) = self.manifest_bytes("")? else {
            return Err(self.no_manifest());
        };
        Ok(Manifest::parse(
            &self.path_of(super::MANIFEST_FILE),
            &bytes,
        )?)
    }

    fn open_file(&self, name: &str) -> Result<File, ReadError> {
        self.open_required(name)
    }

    fn file_len(file: &File) -> u64 {
        file.len()
    }

    fn read(file: &File, range: Range<u64>) -> Result<Cow<'_, [u8]>, ReadError> {
        file.read(range)
    }

    fn segments<'a>(bytes: Cow<'a, [u8]>) -> Vec<Segment>
    where
        Self: 'a,
    {
        bytes
            .chunks_exact(SEGMENT_BYTES)
            .map(|c| Segment::decode(c.try_into().expect("24 bytes")))
            .collect()
    }
}

/// One shard's open files.
#[derive(Debug)]
pub(super) struct Shard<F> {
    pub(super) idx: F,
    pub(super) bin: F,
    /// A packed shard's segment index, and its header.
    pub(super) seg: Option<(F, SegHeader)>,
    /// The loss mask of a version 2 dataset's shard: a byte per token.
    pub(super) mask: Option<F>,
}

/// An open dataset: its manifest, and every shard's files opened with the
/// quick checks made (index and segment headers against the manifest, the
/// sizes of the `.bin` and `.mask`; not the checksums), so that no later
/// call can read out of bounds.
///
/// One type over two storages: `Dataset` (that is, `Dataset<Mapped>`) maps
/// a local directory and hands out records as borrowed slices, with no copy;
/// `Dataset<Files>` reads a local directory or an object-storage prefix by
/// range, holding only the manifest in memory (what `inspect` and `sample`
/// use). What a record is, where it lies and which rules its index and
/// pieces follow is written once for both.
///
/// ```
/// use prep_reader::format::{Dataset, Tokens};
///
/// // A small dataset of 36 documents in 4 shards, from prep's test fixtures.
/// let ds = Dataset::open("../../fixtures/validate/good")?;
/// assert_eq!(ds.len(), 36);
/// let mut tokens = 0;
/// for i in 0..ds.len() {
///     // A borrowed view of the mapped shard: no copy, no allocation.
///     let record = ds.record(i)?;
///     if let Tokens::U16(ids) = record {
///         assert_eq!(ids.last(), Some(&1), "every document ends with eos 1");
///     }
///     tokens += record.len() as u64;
/// }
/// assert_eq!(tokens, ds.n_tokens());
/// # Ok::<(), prep_reader::format::FormatError>(())
/// ```
#[derive(Debug)]
pub struct Dataset<S: Storage = Mapped> {
    pub(super) storage: S,
    manifest: Manifest,
    pub(super) shards: Vec<Shard<S::File>>,
    /// `starts[s]` is the global index of shard `s`'s first record; one extra
    /// entry holds the total.
    starts: Vec<u64>,
    /// `token_starts[s]` is the global position of shard `s`'s first token;
    /// one extra entry holds the total.
    token_starts: Vec<u64>,
}

impl<S: Storage> Dataset<S> {
    /// Opens the dataset in `storage`, with the quick checks of every shard.
    ///
    /// # Errors
    /// [`FormatError::NoManifest`] (or, in a store, [`ReadError::NoManifest`])
    /// when there is no manifest; the format's errors for a manifest or
    /// shard header that breaks its rules, naming the file; the storage's
    /// failures.
    pub fn open_in(storage: S) -> Result<Dataset<S>, S::Error> {
        little_endian()?;
        let manifest = storage.read_manifest()?;
        let mut shards = Vec::with_capacity(manifest.shards.len());
        let mut starts = Vec::with_capacity(manifest.shards.len() + 1);
        let mut token_starts = Vec::with_capacity(manifest.shards.len() + 1);
        let (mut start, mut token_start) = (0u64, 0u64);
        for info in &manifest.shards {
            starts.push(start);
            token_starts.push(token_start);
            shards.push(open_shard(&storage, &manifest, info)?);
            start += info.n_records; // cannot overflow: the manifest's parse summed them
            token_start += info.n_tokens;
        }
        starts.push(start);
        token_starts.push(token_start);
        Ok(Dataset {
            storage,
            manifest,
            shards,
            starts,
            token_starts,
        })
    }

    /// The storage the dataset is read from.
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Number of records.
    pub fn len(&self) -> u64 {
        self.manifest.n_records
    }

    /// True when the dataset has no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of tokens.
    pub fn n_tokens(&self) -> u64 {
        self.manifest.n_tokens
    }

    /// Token type.
    pub fn dtype(&self) -> Dtype {
        self.manifest.dtype
    }

    /// Number of shards.
    pub fn n_shards(&self) -> usize {
        self.shards.len()
    }

    /// The global number of shard `s`'s first record.
    pub fn shard_first_record(&self, s: usize) -> u64 {
        self.starts[s]
    }

    /// The shard holding record `index`, and the record's number within it.
    pub fn locate(&self, index: u64) -> Result<(usize, usize), FormatError> {
        if index >= self.len() {
            return Err(FormatError::RecordOutOfRange {
                index,
                len: self.len(),
            });
        }
        // The last shard whose first record is at or before `index`; empty
        // shards share a start with their successor and are skipped over.
        let s = self.starts.partition_point(|&start| start <= index) - 1;
        Ok((s, (index - self.starts[s]) as usize))
    }

    /// The shard of record `index` and the record's token range in it, from
    /// its two index entries, checked to bound a range of the `.bin`.
    fn token_range(&self, index: u64) -> Result<(usize, u64, u64), S::Error> {
        let (s, local) = self.locate(index)?;
        let info = &self.manifest.shards[s];
        let at = IDX_HEADER_LEN as u64 + 8 * local as u64;
        let entries = S::read(&self.shards[s].idx, at..at + 16)?;
        let word = |i: usize| u64::from_le_bytes(entries[i..i + 8].try_into().expect("8 bytes"));
        let (lo, hi) = (word(0), word(8));
        if hi < lo || hi > info.n_tokens {
            return Err(FormatError::IdxOffsets {
                path: self.storage.path_of(&info.idx),
                position: local as u64 + 1,
                found: hi,
                expected: format!("between offsets[{local}] = {lo} and {}", info.n_tokens),
            }
            .into());
        }
        Ok((s, lo, hi))
    }

    /// The length in tokens of record `index`, from the offsets alone.
    pub fn record_len(&self, index: u64) -> Result<u64, S::Error> {
        let (_, lo, hi) = self.token_range(index)?;
        Ok(hi - lo)
    }

    /// Record `index` as the little-endian bytes of the `.bin` (what
    /// [`crate::format::ShardWriter::push_raw`] takes): borrowed from the
    /// mapping, or one ranged read.
    pub fn record_bytes(&self, index: u64) -> Result<S::Bytes<'_>, S::Error> {
        let (s, lo, hi) = self.token_range(index)?;
        let size = self.manifest.dtype.size() as u64;
        S::read(&self.shards[s].bin, lo * size..hi * size)
    }

    /// Record `index`'s tokens widened to u32, in a new vector.
    pub fn record_ids(&self, index: u64) -> Result<Vec<u32>, S::Error> {
        let bytes = self.record_bytes(index)?;
        Ok(match self.manifest.dtype {
            Dtype::U16 => bytes
                .chunks_exact(2)
                .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            Dtype::U32 => bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        })
    }

    /// Record `index`'s loss mask, one byte per token (1 where the token is
    /// trained on), from its shard's `.mask`; `None` when the dataset has no
    /// masks (version 1). `prep validate` and [`crate::format::Verified::loss_mask`]
    /// check that every byte is 0 or 1 (and the file's checksum); this does
    /// not.
    pub fn loss_mask(&self, index: u64) -> Result<Option<S::Bytes<'_>>, S::Error> {
        let (s, lo, hi) = self.token_range(index)?;
        match &self.shards[s].mask {
            None => Ok(None),
            Some(mask) => Ok(Some(S::read(mask, lo..hi)?)),
        }
    }

    /// The document pieces of row `index` of a packed dataset, in the order
    /// they lie in the row (borrowed from the mapped `.seg` file when it is
    /// mapped). Tokens after the last piece's end are padding.
    ///
    /// An error for a dataset without segment indexes (a `documents` dataset),
    /// and [`FormatError::BadSegment`], naming the `.seg` file and the entry,
    /// for a row whose pieces break the rules of FORMAT.md (an empty piece, a
    /// gap, a piece past `seq_len`): what is returned is always safe to turn
    /// into `cu_seqlens` or masks over the row. Checking costs one pass over
    /// the row's pieces.
    ///
    /// (`prep::pack`'s documentation has an example: the pieces of every
    /// row of a freshly packed dataset as `cu_seqlens`.)
    pub fn segments(&self, index: u64) -> Result<S::Segments<'_>, S::Error> {
        let (s, local) = self.locate(index)?;
        let info = &self.manifest.shards[s];
        let (Some((seg, header)), Some(name)) = (&self.shards[s].seg, &info.seg) else {
            return Err(FormatError::Mismatch {
                path: self.storage.path_of(&info.idx),
                message: "this shard has no segment index (only packed datasets have one)".into(),
            }
            .into());
        };
        let mismatch = |message: String| FormatError::Mismatch {
            path: self.storage.path_of(name),
            message,
        };
        let at = SEG_HEADER_LEN as u64 + 8 * local as u64;
        let rows = S::read(seg, at..at + 16)?;
        let word = |i: usize| u64::from_le_bytes(rows[i..i + 8].try_into().expect("8 bytes"));
        let (first, end) = (word(0), word(8));
        let range = row_window(local as u64, first, end, header.n_segments)
            .map_err(|(_, message)| mismatch(message))?
            .ok_or_else(|| {
                mismatch(format!(
                    "row {local}'s entries end at {end}, past the {} segments",
                    header.n_segments
                ))
            })?;
        let base = header.segments_offset() as u64;
        let pieces = S::segments(S::read(
            seg,
            base + range.start * SEGMENT_BYTES as u64..base + range.end * SEGMENT_BYTES as u64,
        )?);
        match row_violation(&pieces, header.seq_len) {
            None => Ok(pieces),
            Some((k, message)) => Err(FormatError::BadSegment {
                path: self.storage.path_of(name),
                row: local as u64,
                entry: first + k as u64,
                message,
            }
            .into()),
        }
    }
}

/// The quick checks of one shard, made on open by every storage: the
/// index header against the manifest, the sizes of the `.bin` and `.mask`,
/// and a packed shard's `.seg` header.
fn open_shard<S: Storage>(
    storage: &S,
    manifest: &Manifest,
    info: &ShardInfo,
) -> Result<Shard<S::File>, S::Error> {
    let dtype = manifest.dtype;
    let idx = storage.open_file(&info.idx)?;
    let header = {
        let head = S::read(&idx, 0..IDX_HEADER_LEN as u64)?;
        IdxHeader::parse_head(&storage.path_of(&info.idx), &head, S::file_len(&idx))?
    };
    check_idx_header(&storage.path_of(&info.idx), &header, dtype, info)?;
    let bin = storage.open_file(&info.bin)?;
    check_bin_len(
        &storage.path_of(&info.bin),
        S::file_len(&bin),
        &header,
        dtype,
    )?;
    let seg = match &info.seg {
        None => None,
        Some(name) => {
            let seg = storage.open_file(name)?;
            let path = storage.path_of(name);
            let seg_header = {
                let head = S::read(&seg, 0..SEG_HEADER_LEN as u64)?;
                SegHeader::parse_head(&path, &head, S::file_len(&seg))?
            };
            check_seg_header(&path, &seg_header, header.n_records, manifest)?;
            Some((seg, seg_header))
        }
    };
    let mask = match &info.mask {
        None => None,
        Some(name) => {
            let mask = storage.open_file(name)?;
            let len = S::file_len(&mask);
            if len != header.n_tokens {
                return Err(FormatError::Mismatch {
                    path: storage.path_of(name),
                    message: format!(
                        "{len} bytes, but a loss mask has one byte for each of the shard's {} tokens",
                        header.n_tokens
                    ),
                }
                .into());
            }
            Some(mask)
        }
    };
    Ok(Shard {
        idx,
        bin,
        seg,
        mask,
    })
}

/// The rule of a packed shard's row index that reading rows relies on, as
/// every reader checks it over the whole index (mapped on open, streamed
/// by [`Dataset::<Files>::for_each_length`]): it runs from 0 to the number
/// of segments without decreasing. `entries` yields the index's entries.
pub(super) fn check_row_index<E: From<FormatError>>(
    path: &Path,
    entries: impl IntoIterator<Item = Result<u64, E>>,
    n_segments: u64,
) -> Result<(), E> {
    let (mut first, mut last, mut ok) = (None, None, true);
    for at in entries {
        let at = at?;
        first.get_or_insert(at);
        ok &= last.is_none_or(|l| l <= at);
        last = Some(at);
    }
    if ok && first == Some(0) && last == Some(n_segments) {
        return Ok(());
    }
    Err(FormatError::Mismatch {
        path: path.into(),
        message: "the row index does not run from 0 to the number of segments without decreasing"
            .into(),
    }
    .into())
}

impl Dataset {
    /// Opens the dataset in the local directory `dir`, maps every file and
    /// checks every shard's header and offsets.
    pub fn open(dir: impl AsRef<Path>) -> Result<Dataset, FormatError> {
        let ds = Dataset::open_in(Mapped {
            dir: dir.as_ref().to_path_buf(),
        })?;
        ds.check_mapped()?;
        Ok(ds)
    }

    /// Opens the dataset in `dir` for `command`, a stage that does not
    /// carry loss masks into its output yet: a dataset with masks is
    /// refused (see [`Manifest::refuse_loss_mask`]).
    pub fn open_unmasked(dir: impl AsRef<Path>, command: &str) -> Result<Dataset, FormatError> {
        let ds = Dataset::open(dir)?;
        ds.manifest.refuse_loss_mask(&ds.storage.dir, command)?;
        Ok(ds)
    }

    /// What the borrowed views rely on, checked once over the mappings:
    /// every offset (so that [`Dataset::shard_offsets`] can be trusted
    /// whole), a packed shard's row index, and the alignment of the arrays
    /// viewed as integers.
    fn check_mapped(&self) -> Result<(), FormatError> {
        let mismatch = |name: &str, message: &str| FormatError::Mismatch {
            path: self.storage.path_of(name),
            message: message.into(),
        };
        for (shard, info) in self.shards.iter().zip(&self.manifest.shards) {
            let offsets = cast::<u64>(&shard.idx.bytes()[IDX_HEADER_LEN..])
                .ok_or_else(|| mismatch(&info.idx, "offsets are not 8-byte aligned in memory"))?;
            check_offsets(&self.storage.path_of(&info.idx), offsets, info.n_tokens)?;
            let aligned = match self.manifest.dtype {
                Dtype::U16 => cast::<u16>(shard.bin.bytes()).is_some(),
                Dtype::U32 => cast::<u32>(shard.bin.bytes()).is_some(),
            };
            if !aligned {
                return Err(mismatch(&info.bin, "tokens are not aligned in memory"));
            }
            if let (Some((seg, header)), Some(name)) = (&shard.seg, &info.seg) {
                let rows = cast::<u64>(&seg.bytes()[SEG_HEADER_LEN..header.segments_offset()])
                    .ok_or_else(|| {
                        mismatch(name, "the row index is not 8-byte aligned in memory")
                    })?;
                if cast::<Segment>(&seg.bytes()[header.segments_offset()..]).is_none() {
                    return Err(mismatch(name, "segments are not aligned in memory"));
                }
                check_row_index::<FormatError>(
                    &self.storage.path_of(name),
                    rows.iter().map(|&r| Ok(r)),
                    header.n_segments,
                )?;
            }
        }
        Ok(())
    }

    /// The dataset directory.
    pub fn dir(&self) -> &Path {
        &self.storage.dir
    }

    /// Record `index`, borrowed from the mapped shard: no copy, no allocation.
    pub fn record(&self, index: u64) -> Result<Tokens<'_>, FormatError> {
        let bytes = self.record_bytes(index)?;
        Ok(match self.manifest.dtype {
            Dtype::U16 => Tokens::U16(cast::<u16>(bytes).expect("checked at open")),
            Dtype::U32 => Tokens::U32(cast::<u32>(bytes).expect("checked at open")),
        })
    }

    /// Tokens `range` of the dataset, counting every record's tokens back to
    /// back across shards, as borrowed spans: one per shard the range
    /// touches, in order, none of them empty. No copy.
    ///
    /// ```
    /// let ds = prep_reader::format::Dataset::open("../../fixtures/validate/good")?;
    /// // A window across a shard boundary (the first shard holds fewer tokens).
    /// let first = ds.manifest().shards[0].n_tokens;
    /// let spans: Vec<_> = ds.tokens(first - 3..first + 5)?.collect();
    /// assert_eq!(spans.len(), 2);
    /// assert_eq!(spans.iter().map(|s| s.len()).sum::<usize>(), 8);
    /// // The same tokens as the records hold.
    /// let all: Vec<u32> = ds.records().flat_map(|r| r.to_vec()).collect();
    /// let got: Vec<u32> = spans.iter().flat_map(|s| s.to_vec()).collect();
    /// assert_eq!(got, all[first as usize - 3..first as usize + 5]);
    /// # Ok::<(), prep_reader::format::FormatError>(())
    /// ```
    pub fn tokens(
        &self,
        range: std::ops::Range<u64>,
    ) -> Result<impl Iterator<Item = Tokens<'_>> + '_, FormatError> {
        if range.start > range.end || range.end > self.n_tokens() {
            return Err(FormatError::RecordOutOfRange {
                index: range.end,
                len: self.n_tokens(),
            });
        }
        let first = self
            .token_starts
            .partition_point(|&t| t <= range.start)
            .saturating_sub(1);
        Ok((first..self.shards.len())
            .map_while(move |s| {
                let lo = range.start.max(self.token_starts[s]);
                let hi = range.end.min(self.token_starts[s + 1]);
                (lo < hi || self.token_starts[s] < range.end).then(|| {
                    let (a, b) = (
                        (lo - self.token_starts[s]) as usize,
                        (hi.max(lo) - self.token_starts[s]) as usize,
                    );
                    let bytes = self.shards[s].bin.bytes();
                    match self.manifest.dtype {
                        Dtype::U16 => {
                            Tokens::U16(&cast::<u16>(bytes).expect("checked at open")[a..b])
                        }
                        Dtype::U32 => {
                            Tokens::U32(&cast::<u32>(bytes).expect("checked at open")[a..b])
                        }
                    }
                })
            })
            .filter(|t| !t.is_empty()))
    }

    /// Shard `s`'s token bytes, its whole mapped `.bin` (empty for an empty
    /// shard): a mapping starts on a page boundary and covers whole pages.
    pub fn shard_bin(&self, s: usize) -> &[u8] {
        self.shards[s].bin.bytes()
    }

    /// The `n_records + 1` token offsets of shard `s`, as its `.idx` holds them.
    pub fn shard_offsets(&self, s: usize) -> &[u64] {
        // Checked at open: aligned, and every offset within the rules.
        cast::<u64>(&self.shards[s].idx.bytes()[IDX_HEADER_LEN..]).expect("checked at open")
    }

    /// The length in tokens of every record, in order, read from the
    /// offsets alone (no token is touched).
    pub fn record_lengths(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.shards.len()).flat_map(|s| self.shard_offsets(s).windows(2).map(|w| w[1] - w[0]))
    }

    /// Every record in order.
    pub fn records(&self) -> impl Iterator<Item = Tokens<'_>> + '_ {
        (0..self.len()).map(move |i| self.record(i).expect("index in range"))
    }
}

/// The rule every reader of a shard applies first ([`Dataset`]'s open, and
/// `prep validate`'s): its index header repeats the
/// manifest entry's dtype and counts.
fn check_idx_header(
    path: &Path,
    header: &IdxHeader,
    dtype: Dtype,
    info: &ShardInfo,
) -> Result<(), FormatError> {
    let mismatch = |message: String| FormatError::Mismatch {
        path: path.into(),
        message,
    };
    if header.dtype != dtype {
        return Err(mismatch(format!(
            "header says {} but the manifest says {dtype}",
            header.dtype
        )));
    }
    if header.n_records != info.n_records || header.n_tokens != info.n_tokens {
        return Err(mismatch(format!(
            "header has {} records and {} tokens but the manifest lists {} and {}",
            header.n_records, header.n_tokens, info.n_records, info.n_tokens
        )));
    }
    Ok(())
}

/// A shard's `.bin` (of `len` bytes) holds exactly the tokens its index
/// header counts.
fn check_bin_len(
    path: &Path,
    len: u64,
    header: &IdxHeader,
    dtype: Dtype,
) -> Result<(), FormatError> {
    let expected = header.n_tokens.checked_mul(dtype.size() as u64);
    if expected != Some(len) {
        return Err(FormatError::Mismatch {
            path: path.into(),
            message: format!(
                "{len} bytes, but {} tokens of {dtype} need {}",
                header.n_tokens,
                expected.map_or_else(|| "more than a u64".into(), |e| e.to_string())
            ),
        });
    }
    Ok(())
}

/// A `.seg` header agrees with its shard's index (`n_rows` records) and the
/// manifest's `seq_len`.
fn check_seg_header(
    path: &Path,
    header: &SegHeader,
    n_rows: u64,
    manifest: &Manifest,
) -> Result<(), FormatError> {
    let mismatch = |message: String| FormatError::Mismatch {
        path: path.into(),
        message,
    };
    if header.n_rows != n_rows {
        return Err(mismatch(format!(
            "{} rows, but the shard's index has {n_rows} records",
            header.n_rows
        )));
    }
    if Some(u64::from(header.seq_len)) != manifest.seq_len {
        return Err(mismatch(format!(
            "rows of {} tokens, but the manifest's seq_len is {:?}",
            header.seq_len, manifest.seq_len
        )));
    }
    Ok(())
}
