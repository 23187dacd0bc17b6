//! A zero-copy reader: every shard mapped, records handed out as borrowed slices.

use std::path::{Path, PathBuf};

use super::index::check_offsets;
use super::mmap::{bytes_of, cast, little_endian, Mapped};
use super::segments::{row_violation, SegHeader, Segment};
use super::{Dtype, FormatError, IdxHeader, Manifest, ShardInfo, IDX_HEADER_LEN};

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

struct Shard {
    bin: Mapped,
    idx: Mapped,
    /// The segment index of a packed shard.
    seg: Option<SegIndex>,
    /// The loss mask of a version 2 dataset's shard: a byte per token.
    mask: Option<Mapped>,
}

/// A packed shard's mapped `.seg` file, with what checking a row needs.
struct SegIndex {
    map: Mapped,
    /// Byte offset of the first entry.
    at: usize,
    /// Tokens per row, from the header (equal to the manifest's).
    seq_len: u32,
    /// The file, to name in errors.
    path: PathBuf,
}

impl Shard {
    fn offsets(&self) -> &[u64] {
        // Checked at open: the index is aligned, its length matches the header.
        cast::<u64>(&self.idx.bytes()[IDX_HEADER_LEN..]).expect("checked at open")
    }

    /// The row index and the entries of the segment index, if there is one.
    fn segments(&self) -> Option<(&SegIndex, &[u64], &[Segment])> {
        let seg = self.seg.as_ref()?;
        let bytes = seg.map.bytes();
        // Checked at open: sizes match the header, the row index is in bounds.
        let rows = cast::<u64>(&bytes[super::SEG_HEADER_LEN..seg.at]).expect("checked at open");
        let segments = cast::<Segment>(&bytes[seg.at..]).expect("checked at open");
        Some((seg, rows, segments))
    }
}

/// An open dataset: the manifest, and every shard mapped and checked.
///
/// Opening runs the quick checks (headers, sizes, offsets against the
/// manifest; not the checksums) so that no later call can read out of bounds.
///
/// ```
/// use prep::format::{Dataset, Tokens};
///
/// // A small dataset of 36 documents in 4 shards, from prep's test fixtures.
/// let ds = Dataset::open("fixtures/validate/good")?;
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
/// # Ok::<(), prep::format::FormatError>(())
/// ```
pub struct Dataset {
    dir: PathBuf,
    manifest: Manifest,
    shards: Vec<Shard>,
    /// `starts[s]` is the global index of shard `s`'s first record; one extra
    /// entry holds the total.
    starts: Vec<u64>,
    /// `token_starts[s]` is the global position of shard `s`'s first token;
    /// one extra entry holds the total.
    token_starts: Vec<u64>,
}

impl Dataset {
    /// Opens the dataset in `dir` and checks every shard's header and offsets.
    pub fn open(dir: impl AsRef<Path>) -> Result<Dataset, FormatError> {
        little_endian()?;
        let dir = dir.as_ref().to_path_buf();
        let manifest = Manifest::read(&dir)?;
        let mut shards = Vec::with_capacity(manifest.shards.len());
        let mut starts = Vec::with_capacity(manifest.shards.len() + 1);
        let mut token_starts = Vec::with_capacity(manifest.shards.len() + 1);
        let mut start = 0u64;
        let mut token_start = 0u64;
        for info in &manifest.shards {
            starts.push(start);
            shards.push(open_shard(&dir, &manifest, info)?);
            token_starts.push(token_start);
            start += info.n_records; // cannot overflow: Manifest::read summed them
            token_start += info.n_tokens;
        }
        starts.push(start);
        token_starts.push(token_start);
        Ok(Dataset {
            dir,
            manifest,
            shards,
            starts,
            token_starts,
        })
    }

    /// Opens the dataset in `dir` for `command`, a stage that does not
    /// carry loss masks into its output yet: a dataset with masks is
    /// refused (see [`Manifest::refuse_loss_mask`]).
    pub fn open_unmasked(dir: impl AsRef<Path>, command: &str) -> Result<Dataset, FormatError> {
        let ds = Dataset::open(dir)?;
        ds.manifest.refuse_loss_mask(&ds.dir, command)?;
        Ok(ds)
    }

    /// The dataset directory.
    pub fn dir(&self) -> &Path {
        &self.dir
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

    /// Record `index`, borrowed from the mapped shard: no copy, no allocation.
    pub fn record(&self, index: u64) -> Result<Tokens<'_>, FormatError> {
        let (s, local) = self.locate(index)?;
        let shard = &self.shards[s];
        let offsets = shard.offsets();
        let (lo, hi) = (offsets[local] as usize, offsets[local + 1] as usize);
        let bytes = shard.bin.bytes();
        Ok(match self.manifest.dtype {
            Dtype::U16 => Tokens::U16(&cast::<u16>(bytes).expect("checked at open")[lo..hi]),
            Dtype::U32 => Tokens::U32(&cast::<u32>(bytes).expect("checked at open")[lo..hi]),
        })
    }

    /// Record `index` as the little-endian bytes of the `.bin`, borrowed
    /// from the mapping (what [`crate::format::ShardWriter::push_raw`] takes).
    pub fn record_bytes(&self, index: u64) -> Result<&[u8], FormatError> {
        let (s, local) = self.locate(index)?;
        let shard = &self.shards[s];
        let offsets = shard.offsets();
        let size = self.manifest.dtype.size();
        let (lo, hi) = (offsets[local] as usize, offsets[local + 1] as usize);
        Ok(&shard.bin.bytes()[lo * size..hi * size])
    }

    /// Record `index`'s loss mask, one byte per token (1 where the token is
    /// trained on), borrowed from the mapped `.mask`; `None` when the
    /// dataset has no masks (version 1). `prep validate` checks that every
    /// byte is 0 or 1; this does not.
    pub fn loss_mask(&self, index: u64) -> Result<Option<&[u8]>, FormatError> {
        let (s, local) = self.locate(index)?;
        let shard = &self.shards[s];
        let Some(mask) = &shard.mask else {
            return Ok(None);
        };
        let offsets = shard.offsets();
        let (lo, hi) = (offsets[local] as usize, offsets[local + 1] as usize);
        Ok(Some(&mask.bytes()[lo..hi]))
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

    /// The length in tokens of record `index`, from the offsets alone.
    pub fn record_len(&self, index: u64) -> Result<u64, FormatError> {
        let (s, local) = self.locate(index)?;
        let offsets = self.shards[s].offsets();
        Ok(offsets[local + 1] - offsets[local])
    }

    /// Tokens `range` of the dataset, counting every record's tokens back to
    /// back across shards, as borrowed spans: one per shard the range
    /// touches, in order, none of them empty. No copy.
    ///
    /// ```
    /// let ds = prep::format::Dataset::open("fixtures/validate/good")?;
    /// // A window across a shard boundary (the first shard holds fewer tokens).
    /// let first = ds.manifest().shards[0].n_tokens;
    /// let spans: Vec<_> = ds.tokens(first - 3..first + 5)?.collect();
    /// assert_eq!(spans.len(), 2);
    /// assert_eq!(spans.iter().map(|s| s.len()).sum::<usize>(), 8);
    /// // The same tokens as the records hold.
    /// let all: Vec<u32> = ds.records().flat_map(|r| r.to_vec()).collect();
    /// let got: Vec<u32> = spans.iter().flat_map(|s| s.to_vec()).collect();
    /// assert_eq!(got, all[first as usize - 3..first as usize + 5]);
    /// # Ok::<(), prep::format::FormatError>(())
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

    /// Number of shards.
    pub fn n_shards(&self) -> usize {
        self.shards.len()
    }

    /// The global number of shard `s`'s first record.
    pub fn shard_first_record(&self, s: usize) -> u64 {
        self.starts[s]
    }

    /// Shard `s`'s token bytes, its whole mapped `.bin` (empty for an empty
    /// shard): a mapping starts on a page boundary and covers whole pages.
    pub fn shard_bin(&self, s: usize) -> &[u8] {
        self.shards[s].bin.bytes()
    }

    /// The `n_records + 1` token offsets of shard `s`, as its `.idx` holds them.
    pub fn shard_offsets(&self, s: usize) -> &[u64] {
        self.shards[s].offsets()
    }

    /// The length in tokens of every record, in order, read from the
    /// offsets alone (no token is touched).
    pub fn record_lengths(&self) -> impl Iterator<Item = u64> + '_ {
        self.shards
            .iter()
            .flat_map(|s| s.offsets().windows(2).map(|w| w[1] - w[0]))
    }

    /// The document pieces of row `index` of a packed dataset, in the order
    /// they lie in the row, borrowed from the mapped `.seg` file. Tokens after
    /// the last piece's end are padding.
    ///
    /// An error for a dataset without segment indexes (a `documents` dataset),
    /// and [`FormatError::BadSegment`], naming the `.seg` file and the entry,
    /// for a row whose pieces break the rules of FORMAT.md (an empty piece, a
    /// gap, a piece past `seq_len`): what is returned is always safe to turn
    /// into `cu_seqlens` or masks over the row. Checking costs one pass over
    /// the row's pieces.
    ///
    /// ```
    /// use prep::pack::{self, PackConfig};
    /// use prep::format::Dataset;
    ///
    /// // Pack the 36 documents of a test fixture into rows of 16 tokens.
    /// let dir = std::env::temp_dir().join(format!("prep-doc-segments-{}", std::process::id()));
    /// let mut config = PackConfig::new("fixtures/validate/good", &dir, 16);
    /// config.writing.overwrite = true;
    /// pack::run(&config, &prep::progress::NoProgress)?;
    ///
    /// let ds = Dataset::open(&dir)?;
    /// for i in 0..ds.len() {
    ///     let row = ds.record(i)?;
    ///     let pieces = ds.segments(i)?;
    ///     // cu_seqlens for a variable-length attention kernel: where each piece
    ///     // starts, then where the last one ends (the rest is padding).
    ///     let mut cu_seqlens: Vec<u32> = pieces.iter().map(|p| p.start).collect();
    ///     cu_seqlens.push(pieces.last().map_or(0, |p| p.start + p.length));
    ///     assert_eq!(cu_seqlens[0], 0);
    ///     assert!(*cu_seqlens.last().unwrap() as usize <= row.len());
    /// }
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn segments(&self, index: u64) -> Result<&[Segment], FormatError> {
        let (s, local) = self.locate(index)?;
        let (seg, rows, segments) =
            self.shards[s]
                .segments()
                .ok_or_else(|| FormatError::Mismatch {
                    path: self.dir.join(&self.manifest.shards[s].idx),
                    message: "this shard has no segment index (only packed datasets have one)"
                        .into(),
                })?;
        let first = rows[local];
        let pieces = &segments[first as usize..rows[local + 1] as usize];
        match row_violation(pieces, seg.seq_len) {
            None => Ok(pieces),
            Some((k, message)) => Err(FormatError::BadSegment {
                path: seg.path.clone(),
                row: local as u64,
                entry: first + k as u64,
                message,
            }),
        }
    }

    /// Every record in order.
    pub fn records(&self) -> impl Iterator<Item = Tokens<'_>> + '_ {
        (0..self.len()).map(move |i| self.record(i).expect("index in range"))
    }
}

fn open_shard(dir: &Path, manifest: &Manifest, info: &ShardInfo) -> Result<Shard, FormatError> {
    let dtype = manifest.dtype;
    let idx_path = dir.join(&info.idx);
    let bin_path = dir.join(&info.bin);
    let idx = Mapped::open(&idx_path)?;
    let header = IdxHeader::parse(&idx_path, idx.bytes())?;
    let mismatch = |path: &Path, message: String| FormatError::Mismatch {
        path: path.into(),
        message,
    };
    check_idx_header(&idx_path, &header, dtype, info)?;
    let offsets = cast::<u64>(&idx.bytes()[IDX_HEADER_LEN..])
        .ok_or_else(|| mismatch(&idx_path, "offsets are not 8-byte aligned in memory".into()))?;
    check_offsets(&idx_path, offsets, header.n_tokens)?;
    let bin = Mapped::open(&bin_path)?;
    check_bin_len(&bin_path, bin.bytes().len() as u64, &header, dtype)?;
    let aligned = match dtype {
        Dtype::U16 => cast::<u16>(bin.bytes()).is_some(),
        Dtype::U32 => cast::<u32>(bin.bytes()).is_some(),
    };
    if !aligned {
        return Err(mismatch(
            &bin_path,
            "tokens are not aligned in memory".into(),
        ));
    }
    let seg = match &info.seg {
        None => None,
        Some(name) => Some(open_segments(&dir.join(name), manifest, header.n_records)?),
    };
    let mask = match &info.mask {
        None => None,
        Some(name) => {
            let path = dir.join(name);
            let mask = Mapped::open(&path)?;
            if mask.bytes().len() as u64 != header.n_tokens {
                return Err(mismatch(
                    &path,
                    format!(
                        "{} bytes, but a loss mask has one byte for each of the shard's {} tokens",
                        mask.bytes().len(),
                        header.n_tokens
                    ),
                ));
            }
            Some(mask)
        }
    };
    Ok(Shard {
        bin,
        idx,
        seg,
        mask,
    })
}

/// The rule every reader of a shard applies first (the mapped reader here,
/// and [`crate::source`]'s over object storage): its index header repeats the
/// manifest entry's dtype and counts.
pub(crate) fn check_idx_header(
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
pub(crate) fn check_bin_len(
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
pub(crate) fn check_seg_header(
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

/// Maps a `.seg` file and checks what reading it relies on: the header, the
/// size, and a row index that stays within the entries. (Each row's pieces
/// are checked when [`Dataset::segments`] hands them out, so that opening
/// stays cheap; `prep validate` checks every row.)
fn open_segments(path: &Path, manifest: &Manifest, n_rows: u64) -> Result<SegIndex, FormatError> {
    let mismatch = |message: String| FormatError::Mismatch {
        path: path.into(),
        message,
    };
    let map = Mapped::open(path)?;
    let header = SegHeader::parse(path, map.bytes())?;
    check_seg_header(path, &header, n_rows, manifest)?;
    let at = header.segments_offset();
    let bytes = map.bytes();
    let rows = cast::<u64>(&bytes[super::SEG_HEADER_LEN..at])
        .ok_or_else(|| mismatch("the row index is not 8-byte aligned in memory".into()))?;
    if cast::<Segment>(&bytes[at..]).is_none() {
        return Err(mismatch("segments are not aligned in memory".into()));
    }
    let ok = rows.first() == Some(&0)
        && rows.windows(2).all(|w| w[0] <= w[1])
        && rows.last() == Some(&header.n_segments);
    if !ok {
        return Err(mismatch(
            "the row index does not run from 0 to the number of segments without decreasing".into(),
        ));
    }
    Ok(SegIndex {
        map,
        at,
        seq_len: header.seq_len,
        path: path.into(),
    })
}
