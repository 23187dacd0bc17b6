//! A dataset's files as `validate`, `inspect` and `sample` read them:
//! mapped from a local directory, or fetched from object storage
//! (`s3://bucket/prefix`, `gs://`, `az://`, `https://`) by ranged GETs.
//!
//! The checks are written once, over what both kinds of file offer: a
//! length, a small range read at once ([`File::read`]), and any range read
//! in order as a sequence of chunks ([`File::chunks`]). A mapped file hands
//! out slices of its mapping, [`LOCAL_CHUNK`] bytes at a time (no copy); an
//! object hands out the blocks of its ranged GETs ([`crate::store::ObjectReader`]),
//! so memory stays bounded however large a shard is. [`Entries`] and
//! [`TokenBlocks`] decode chunks into offsets, segment entries and tokens,
//! whatever the chunk boundaries and the alignment of the bytes.

use std::borrow::Cow;
use std::ops::Range;
use std::path::{Path, PathBuf};

#[cfg(feature = "store")]
use bytes::Bytes;

use super::reader::check_row_index;
use super::{
    BadChunk, ChunkSums, Dataset, Dtype, FormatError, MappedFile, Segment, ShardInfo, Tokens,
    IDX_HEADER_LEN, MAX_MANIFEST_BYTES, SEGMENT_BYTES, SEG_HEADER_LEN,
};
#[cfg(feature = "store")]
use crate::store::{Object, ObjectReader, StoreError};

/// Bytes of a mapped file handed out as one chunk.
pub const LOCAL_CHUNK: usize = 8 << 20;

/// Why a dataset's file could not be read (as opposed to what is wrong with
/// its bytes, which the callers report in their own terms).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A local file could not be opened or mapped, or a file's bytes
    /// break the format where a reader of single records needs them sound.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A request to object storage failed (a missing bucket, refused
    /// credentials, no connection), after the store's retries.
    #[error(transparent)]
    #[cfg(feature = "store")]
    Store(#[from] StoreError),
    /// There is no `manifest.json` at the dataset's address (its bucket
    /// exists: a missing bucket is a [`StoreError::NoBucket`]).
    #[error("{url}: no such object: not a prep dataset (no manifest.json at this address)")]
    NoManifest {
        /// The manifest's address.
        url: String,
    },
    /// The transfer of an object's range failed part way (a dropped
    /// connection, an object that changed while it was read).
    #[error("{url}: reading failed after {at} bytes: {cause}")]
    Read {
        /// The object.
        url: String,
        /// Bytes of the range received before the failure.
        at: u64,
        /// What failed.
        cause: std::io::Error,
    },
}

impl ReadError {
    /// The file or object the failure is about.
    pub fn path(&self) -> Option<PathBuf> {
        match self {
            ReadError::Format(FormatError::Io { path, .. }) => Some(path.clone()),
            ReadError::Format(e) => format_path(e),
            #[cfg(feature = "store")]
            ReadError::Store(e) => Some(PathBuf::from(e.url())),
            ReadError::Read { url, .. } | ReadError::NoManifest { url } => Some(PathBuf::from(url)),
        }
    }
}

fn format_path(e: &FormatError) -> Option<PathBuf> {
    match e {
        FormatError::Io { path, .. }
        | FormatError::BadManifest { path, .. }
        | FormatError::UnsupportedVersion { path, .. }
        | FormatError::IdxTooShort { path, .. }
        | FormatError::IdxBadMagic { path }
        | FormatError::IdxBadTokenSize { path, .. }
        | FormatError::IdxReserved { path }
        | FormatError::IdxSize { path, .. }
        | FormatError::IdxOffsets { path, .. }
        | FormatError::Mismatch { path, .. }
        | FormatError::BadSegment { path, .. }
        | FormatError::SumTooShort { path, .. }
        | FormatError::SumBadMagic { path }
        | FormatError::SumReserved { path }
        | FormatError::SumChunkBytes { path }
        | FormatError::SumSize { path, .. }
        | FormatError::SumChunkCount { path, .. }
        | FormatError::NoChunkSums { path, .. }
        | FormatError::BadChunk(BadChunk { path, .. }) => Some(path.clone()),
        FormatError::BadInput(bad) => Some(bad.path.clone()),
        FormatError::NoManifest { dir } => Some(dir.join(crate::format::MANIFEST_FILE)),
        FormatError::RecordOutOfRange { .. } | FormatError::BigEndian => None,
    }
}

/// Where a dataset lies: a local directory or an object-storage prefix.
#[derive(Debug, Clone)]
pub enum Files {
    /// A local directory; files are mapped.
    Dir(PathBuf),
    /// The "folder" in object storage that holds `manifest.json`.
    #[cfg(feature = "store")]
    Store(Object),
}

impl Files {
    /// The dataset at `location`: an object-storage address when
    /// [`crate::store::is_url`] says it is one, else a local directory.
    ///
    /// # Errors
    /// [`StoreError::BadUrl`] for an address the store cannot use.
    #[cfg(feature = "store")]
    pub fn new(location: &Path) -> Result<Files, StoreError> {
        match location.to_str().filter(|s| crate::store::is_url(s)) {
            Some(url) => Ok(Files::Store(Object::at(url.trim_end_matches('/'))?)),
            None => Ok(Files::Dir(location.to_path_buf())),
        }
    }

    /// Whether the dataset is read from object storage.
    pub fn is_remote(&self) -> bool {
        #[cfg(feature = "store")]
        return matches!(self, Files::Store(_));
        #[cfg(not(feature = "store"))]
        false
    }

    /// How `name` (relative to the dataset) is called in messages: a local
    /// path or the object's address.
    pub fn path_of(&self, name: &str) -> PathBuf {
        match self {
            Files::Dir(dir) => dir.join(name),
            #[cfg(feature = "store")]
            Files::Store(root) => PathBuf::from(format!("{}/{name}", root.url())),
        }
    }

    /// The file `name` (relative to the dataset), or `None` when there is
    /// no such file.
    ///
    /// # Errors
    /// A local file that cannot be opened or mapped; the store's failure
    /// (a missing bucket, refused credentials, no connection).
    pub fn open(&self, name: &str) -> Result<Option<File>, ReadError> {
        match self {
            Files::Dir(dir) => {
                let path = dir.join(name);
                match MappedFile::open(&path) {
                    Ok(map) => Ok(Some(File(Kind::Mapped(map)))),
                    Err(FormatError::Io { cause: source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(e.into()),
                }
            }
            #[cfg(feature = "store")]
            Files::Store(root) => {
                let object = root.child(name)?;
                match object.size() {
                    Ok(len) => Ok(Some(File(Kind::Object { object, len }))),
                    Err(StoreError::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// The file `name`, which the dataset must have: a missing one is an
    /// error naming it (for a local file, with the system's own words).
    ///
    /// # Errors
    /// As [`Files::open`], and [`FormatError::Io`] for a missing file.
    pub fn open_required(&self, name: &str) -> Result<File, ReadError> {
        match self {
            Files::Dir(dir) => Ok(File(Kind::Mapped(MappedFile::open(&dir.join(name))?))),
            #[cfg(feature = "store")]
            Files::Store(_) => self.open(name)?.ok_or_else(|| {
                FormatError::Io {
                    path: self.path_of(name),
                    cause: std::io::Error::new(std::io::ErrorKind::NotFound, "no such object"),
                }
                .into()
            }),
        }
    }

    /// The chunk checksums of shard number `shard` of the dataset, whose
    /// manifest entry is `info`: what a reader that verifies ranges of the
    /// shard's `.bin` ([`ChunkSums::verify`]) reads first. The `.sum` must
    /// have the size and XXH3-64 the entry lists, and describe a `.bin` of
    /// the listed `bin_bytes`.
    ///
    /// # Errors
    /// [`FormatError::NoChunkSums`] for a shard that lists no `.sum` (a
    /// dataset of a prep from before them), naming the manifest and the
    /// shard; [`FormatError::Mismatch`] for a `.sum` of another size or
    /// checksum than listed; [`ChunkSums::parse`]'s errors; and as
    /// [`Files::open_required`].
    pub fn chunk_sums(&self, shard: usize, info: &ShardInfo) -> Result<ChunkSums, ReadError> {
        let (Some(name), Some(listed_bytes), Some(listed_xxh3)) = (
            info.sum.as_deref(),
            info.sum_bytes,
            info.sum_xxh3.as_deref(),
        ) else {
            return Err(FormatError::NoChunkSums {
                path: self.path_of(crate::format::MANIFEST_FILE),
                shard: shard as u64,
            }
            .into());
        };
        let path = self.path_of(name);
        let mismatch = |message: String| FormatError::Mismatch {
            path: path.clone(),
            message,
        };
        let file = self.open_required(name)?;
        // Checked before the read: the manifest bounds what is fetched.
        if file.len() != listed_bytes {
            let len = file.len();
            return Err(mismatch(format!("{len} bytes, the manifest lists {listed_bytes}")).into());
        }
        let bytes = file.read(0..file.len())?;
        let found = super::checksum_hex(xxhash_rust::xxh3::xxh3_64(&bytes));
        if found != listed_xxh3 {
            return Err(
                mismatch(format!("XXH3 is {found}, the manifest lists {listed_xxh3}")).into(),
            );
        }
        Ok(ChunkSums::parse(&path, &bytes, info.bin_bytes)?)
    }

    /// The bytes of the manifest in the folder `sub` of the dataset (`""`
    /// for its own), or `None` when there is none.
    ///
    /// # Errors
    /// A manifest larger than [`MAX_MANIFEST_BYTES`] is a
    /// [`FormatError::BadManifest`]; otherwise as [`Files::open`].
    pub fn manifest_bytes(&self, sub: &str) -> Result<Option<Vec<u8>>, ReadError> {
        let name = if sub.is_empty() {
            crate::format::MANIFEST_FILE.to_owned()
        } else {
            format!(
                "{}/{}",
                sub.trim_end_matches('/'),
                crate::format::MANIFEST_FILE
            )
        };
        let Some(file) = self.open(&name)? else {
            return Ok(None);
        };
        if file.len() > MAX_MANIFEST_BYTES {
            return Err(FormatError::BadManifest {
                path: self.path_of(&name),
                message: format!("{} bytes, more than any manifest needs", file.len()),
            }
            .into());
        }
        Ok(Some(file.read(0..file.len())?.into_owned()))
    }

    /// The error for a dataset without a manifest: for a local directory,
    /// [`FormatError::NoManifest`]; in a store, [`ReadError::NoManifest`]
    /// naming the manifest's address, or the listing's failure when the
    /// prefix cannot even be listed (a missing bucket says so by name).
    pub fn no_manifest(&self) -> ReadError {
        match self {
            Files::Dir(dir) => FormatError::NoManifest { dir: dir.clone() }.into(),
            #[cfg(feature = "store")]
            Files::Store(root) => {
                let url = self
                    .path_of(crate::format::MANIFEST_FILE)
                    .display()
                    .to_string();
                match crate::store::list(root.url(), |_| true) {
                    // Name the manifest, the object that was asked for.
                    Err(StoreError::NoBucket { op, .. }) => StoreError::NoBucket { url, op }.into(),
                    Err(e @ StoreError::Denied { .. }) => e.into(),
                    Ok(_) | Err(_) => ReadError::NoManifest { url },
                }
            }
        }
    }

    /// Every file of the dataset, relative to it, `/`-separated, sorted: a
    /// walk of the directory, or a listing of the prefix.
    ///
    /// # Errors
    /// The listing's failure (a store's; an unreadable local directory is
    /// skipped, as a walk skips what it cannot read).
    pub fn files(&self) -> Result<Vec<String>, ReadError> {
        let mut found = Vec::new();
        match self {
            Files::Dir(dir) => walk(dir, dir, &mut found),
            #[cfg(feature = "store")]
            Files::Store(root) => {
                let prefix = format!("{}/", root.url());
                for listed in crate::store::list(root.url(), |_| true)? {
                    if let Some(rel) = listed.url.strip_prefix(&prefix) {
                        found.push(rel.to_owned());
                    }
                }
            }
        }
        found.sort();
        Ok(found)
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            walk(root, &path, out);
        } else if let Ok(rel) = path.strip_prefix(root) {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// One file of a dataset: mapped, or an object of known size.
#[derive(Debug)]
pub struct File(Kind);

#[derive(Debug)]
enum Kind {
    /// A local file, mapped.
    Mapped(MappedFile),
    /// An object in storage, and its size from a HEAD request.
    #[cfg(feature = "store")]
    Object { object: Object, len: u64 },
}

impl File {
    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        match &self.0 {
            Kind::Mapped(map) => map.bytes().len() as u64,
            #[cfg(feature = "store")]
            Kind::Object { len, .. } => *len,
        }
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of `range` (clamped to the file), at once: for small
    /// ranges (a header, one record), as one ranged GET.
    ///
    /// # Errors
    /// The store's failure.
    pub fn read(&self, range: Range<u64>) -> Result<Cow<'_, [u8]>, ReadError> {
        let end = range.end.min(self.len());
        let start = range.start.min(end);
        match &self.0 {
            Kind::Mapped(map) => Ok(Cow::Borrowed(&map.bytes()[start as usize..end as usize])),
            #[cfg(feature = "store")]
            Kind::Object { .. } if start == end => Ok(Cow::Borrowed(&[])),
            #[cfg(feature = "store")]
            Kind::Object { object, .. } => {
                let bytes = object.get_range(start..end)?;
                if bytes.len() as u64 != end - start {
                    return Err(StoreError::Changed {
                        url: object.url().to_owned(),
                        expected: self.len(),
                        found: start + bytes.len() as u64,
                    }
                    .into());
                }
                Ok(Cow::Owned(bytes.to_vec()))
            }
        }
    }

    /// The bytes of `range` (clamped to the file), in order, in chunks.
    pub fn chunks(&self, range: Range<u64>) -> Chunks<'_> {
        let end = range.end.min(self.len());
        let start = range.start.min(end);
        match &self.0 {
            Kind::Mapped(map) => Chunks::Mapped {
                rest: &map.bytes()[start as usize..end as usize],
                size: LOCAL_CHUNK,
            },
            #[cfg(feature = "store")]
            Kind::Object { object, .. } => Chunks::Object {
                reader: object.reader(start, end),
                url: object.url().to_owned(),
                at: 0,
                current: Bytes::new(),
            },
        }
    }

    /// A reader of `range` (clamped to the file), for a consumer that
    /// parses a stream: the mapping's bytes, or the object's ranged GETs,
    /// several in flight.
    pub fn reader(&self, range: Range<u64>) -> Box<dyn std::io::Read + Send + '_> {
        let end = range.end.min(self.len());
        let start = range.start.min(end);
        match &self.0 {
            Kind::Mapped(map) => Box::new(&map.bytes()[start as usize..end as usize]),
            #[cfg(feature = "store")]
            Kind::Object { object, .. } => Box::new(object.reader(start, end)),
        }
    }

    /// The XXH3-64 of the whole file and its length, read in chunks.
    ///
    /// # Errors
    /// The transfer's failure.
    pub fn xxh3(&self) -> Result<u64, ReadError> {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut chunks = self.chunks(0..self.len());
        while let Some(chunk) = chunks.next_chunk()? {
            hasher.update(chunk);
        }
        Ok(hasher.digest())
    }
}

/// A range of a [`File`], handed out in order, a chunk at a time.
pub enum Chunks<'a> {
    /// What is left of a mapped range, handed out `size` bytes at a time.
    Mapped {
        /// The bytes not handed out yet.
        rest: &'a [u8],
        /// Bytes per chunk.
        size: usize,
    },
    /// An object's range, by ranged GETs.
    #[cfg(feature = "store")]
    Object {
        /// The GETs in flight.
        reader: ObjectReader,
        /// The object, for messages.
        url: String,
        /// Bytes handed out so far.
        at: u64,
        /// The chunk last handed out.
        current: Bytes,
    },
}

impl<'a> Chunks<'a> {
    /// The next chunk (never empty), or `None` at the end of the range.
    ///
    /// # Errors
    /// [`ReadError::Read`] naming the object when a GET fails.
    pub fn next_chunk(&mut self) -> Result<Option<&[u8]>, ReadError> {
        match self {
            Chunks::Mapped { rest, size } => {
                if rest.is_empty() {
                    return Ok(None);
                }
                let all: &'a [u8] = rest;
                let (chunk, after) = all.split_at(all.len().min((*size).max(1)));
                *rest = after;
                Ok(Some(chunk))
            }
            #[cfg(feature = "store")]
            Chunks::Object {
                reader,
                url,
                at,
                current,
            } => match reader.next_chunk() {
                Ok(Some(chunk)) => {
                    *at += chunk.len() as u64;
                    *current = chunk;
                    Ok(Some(&current[..]))
                }
                Ok(None) => Ok(None),
                Err(source) => Err(ReadError::Read {
                    url: url.clone(),
                    at: *at,
                    cause: source,
                }),
            },
        }
    }
}

/// Fixed-size entries of `N` bytes read in order from a range: an index's
/// offsets (`N` = 8), a segment index's entries (`N` = 24). Holds one chunk.
pub struct Entries<'a, const N: usize> {
    chunks: Chunks<'a>,
    block: Vec<u8>,
    at: usize,
}

impl<'a, const N: usize> Entries<'a, N> {
    /// The entries of `range` of `file`.
    pub fn new(file: &'a File, range: Range<u64>) -> Entries<'a, N> {
        Entries::of(file.chunks(range))
    }

    fn of(chunks: Chunks<'a>) -> Entries<'a, N> {
        Entries {
            chunks,
            block: Vec::new(),
            at: 0,
        }
    }

    /// The next entry's bytes, or `None` at the end (a trailing partial
    /// entry is not one).
    ///
    /// # Errors
    /// The transfer's failure.
    pub fn next_bytes(&mut self) -> Result<Option<[u8; N]>, ReadError> {
        while self.block.len() - self.at < N {
            self.block.drain(..self.at);
            self.at = 0;
            match self.chunks.next_chunk()? {
                Some(chunk) => self.block.extend_from_slice(chunk),
                None => return Ok(None),
            }
        }
        let entry = self.block[self.at..self.at + N]
            .try_into()
            .expect("N bytes");
        self.at += N;
        Ok(Some(entry))
    }
}

impl Entries<'_, 8> {
    /// The next little-endian u64.
    ///
    /// # Errors
    /// The transfer's failure.
    pub fn next_u64(&mut self) -> Result<Option<u64>, ReadError> {
        Ok(self.next_bytes()?.map(u64::from_le_bytes))
    }
}

impl Entries<'_, SEGMENT_BYTES> {
    /// The next segment entry.
    ///
    /// # Errors
    /// The transfer's failure.
    pub fn next_segment(&mut self) -> Result<Option<Segment>, ReadError> {
        Ok(self.next_bytes()?.map(|b| Segment::decode(&b)))
    }
}

/// Tokens of a `.bin` read in order, a block at a time, together with the
/// raw chunk each block came from (for the checksum). A chunk that is
/// aligned and whole is viewed in place; otherwise its tokens are decoded
/// into a buffer, with a token split between two chunks carried over.
pub struct TokenBlocks<'a> {
    chunks: Chunks<'a>,
    dtype: Dtype,
    carry: Vec<u8>,
    u16s: Vec<u16>,
    u32s: Vec<u32>,
    /// The position of the next block's first token.
    at: u64,
}

/// One step of [`TokenBlocks`].
pub struct TokenBlock<'b> {
    /// The chunk's bytes as read.
    pub raw: &'b [u8],
    /// Position in the file of the first token of `tokens`.
    pub start: u64,
    /// The whole tokens completed by this chunk (possibly none).
    pub tokens: Tokens<'b>,
}

impl<'a> TokenBlocks<'a> {
    /// The tokens of the whole of `file`, of type `dtype`.
    pub fn new(file: &'a File, dtype: Dtype) -> TokenBlocks<'a> {
        TokenBlocks::of(file.chunks(0..file.len()), dtype)
    }

    fn of(chunks: Chunks<'a>, dtype: Dtype) -> TokenBlocks<'a> {
        TokenBlocks {
            chunks,
            dtype,
            carry: Vec::new(),
            u16s: Vec::new(),
            u32s: Vec::new(),
            at: 0,
        }
    }

    /// The next chunk and its tokens, or `None` at the end of the file (a
    /// trailing partial token is in the last chunk's `raw` only).
    ///
    /// # Errors
    /// The transfer's failure.
    pub fn next_block(&mut self) -> Result<Option<TokenBlock<'_>>, ReadError> {
        let size = self.dtype.size();
        let Some(raw) = self.chunks.next_chunk()? else {
            return Ok(None);
        };
        let start = self.at;
        let in_place = if self.carry.is_empty() && raw.len() % size == 0 {
            match self.dtype {
                Dtype::U16 => crate::format::mmap_cast_u16(raw).map(Tokens::U16),
                Dtype::U32 => crate::format::mmap_cast_u32(raw).map(Tokens::U32),
            }
        } else {
            None
        };
        let tokens = match in_place {
            Some(tokens) => tokens,
            None => {
                // Decode the carried bytes with this chunk's, keeping what
                // does not make a whole token for the next chunk.
                let need = (size - self.carry.len()) % size;
                let (head, body) = raw.split_at(need.min(raw.len()));
                self.carry.extend_from_slice(head);
                let whole = body.len() - body.len() % size;
                let mut bytes = Vec::new();
                if self.carry.len() == size {
                    bytes.append(&mut self.carry);
                }
                let (body, tail) = body.split_at(whole);
                let dtype = self.dtype;
                let decode = |b: &[u8], out16: &mut Vec<u16>, out32: &mut Vec<u32>| match dtype {
                    Dtype::U16 => {
                        out16.extend(b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])))
                    }
                    Dtype::U32 => out32.extend(
                        b.chunks_exact(4)
                            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                    ),
                };
                self.u16s.clear();
                self.u32s.clear();
                decode(&bytes, &mut self.u16s, &mut self.u32s);
                decode(body, &mut self.u16s, &mut self.u32s);
                self.carry.extend_from_slice(tail);
                match self.dtype {
                    Dtype::U16 => Tokens::U16(&self.u16s),
                    Dtype::U32 => Tokens::U32(&self.u32s),
                }
            }
        };
        self.at += tokens.len() as u64;
        Ok(Some(TokenBlock { raw, start, tokens }))
    }
}

/// What a dataset read by range offers beside [`Dataset`]'s reads: the
/// lengths of every record streamed from the indexes, and the dataset's
/// copy of its tokenizer.
impl Dataset<Files> {
    /// Calls `f` with the length in tokens of every record, in order, read
    /// from the indexes alone (streamed), checking them whole as the mapped
    /// reader does on open: the offsets, and a packed shard's row index.
    ///
    /// # Errors
    /// [`FormatError::IdxOffsets`] for offsets that break the rules; the
    /// transfer's failure.
    pub fn for_each_length(&self, mut f: impl FnMut(u64)) -> Result<(), ReadError> {
        let files = self.storage();
        for (shard, info) in self.shards.iter().zip(&self.manifest().shards) {
            let mut rules = crate::format::OffsetRules::new(info.n_tokens);
            let mut offsets = Entries::<8>::new(&shard.idx, IDX_HEADER_LEN as u64..shard.idx.len());
            let mut previous = None;
            let bad = |v: crate::format::OffsetViolation| FormatError::IdxOffsets {
                path: files.path_of(&info.idx),
                position: v.position,
                found: v.found,
                expected: v.expected,
            };
            while let Some(offset) = offsets.next_u64()? {
                if let Some(v) = rules.push(offset) {
                    return Err(bad(v).into());
                }
                if let Some(lo) = previous {
                    f(offset - lo);
                }
                previous = Some(offset);
            }
            if let Some(v) = rules.finish() {
                return Err(bad(v).into());
            }
            if let (Some((seg, header)), Some(name)) = (&shard.seg, &info.seg) {
                let mut rows =
                    Entries::<8>::new(seg, SEG_HEADER_LEN as u64..header.segments_offset() as u64);
                check_row_index(
                    &files.path_of(name),
                    std::iter::from_fn(|| rows.next_u64().transpose()),
                    header.n_segments,
                )?;
            }
        }
        Ok(())
    }

    /// The dataset's copy of its tokenizer, as stored (`None` when the
    /// manifest names none or it is missing), with its address.
    ///
    /// # Errors
    /// The store's failure.
    pub fn tokenizer_copy(&self) -> Result<Option<(PathBuf, Vec<u8>)>, ReadError> {
        let Some(name) = &self.manifest().tokenizer.file else {
            return Ok(None);
        };
        let Some(file) = self.storage().open(name)? else {
            return Ok(None);
        };
        let bytes = file.read(0..file.len())?.into_owned();
        Ok(Some((self.storage().path_of(name), bytes)))
    }
}

/// The number of records of the dataset at `location` (a directory, or an
/// object-storage address read in place), once the reader's checks pass:
/// what `prep sample` draws its order from.
///
/// # Errors
/// What opening the dataset meets ([`crate::format::Dataset::open`]'s
/// errors; for a store also its failures, naming the object).
#[cfg(feature = "store")]
pub fn record_count(location: &Path) -> Result<u64, ReadError> {
    let ds = Dataset::open_in(Files::new(location)?)?;
    ds.for_each_length(|_| {})?;
    Ok(ds.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes whose value is their position (mod 251): every split shows.
    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn entries_come_back_whole_whatever_the_chunk_size() {
        let data = bytes(8 * 37 + 5); // and a trailing partial entry
        let whole: Vec<u64> = data
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        for size in 1..=20 {
            let mut entries = Entries::<8>::of(Chunks::Mapped { rest: &data, size });
            let mut got = Vec::new();
            while let Some(v) = entries.next_u64().unwrap() {
                got.push(v);
            }
            assert_eq!(got, whole, "chunks of {size}");
        }
    }

    #[test]
    fn tokens_come_back_whole_and_raw_bytes_in_order_whatever_the_chunk_size() {
        for (dtype, n) in [(Dtype::U16, 2 * 41 + 1), (Dtype::U32, 4 * 23 + 3)] {
            let data = bytes(n);
            let size = dtype.size();
            let whole: Vec<u32> = data
                .chunks_exact(size)
                .map(|c| match dtype {
                    Dtype::U16 => u32::from(u16::from_le_bytes([c[0], c[1]])),
                    Dtype::U32 => u32::from_le_bytes(c.try_into().unwrap()),
                })
                .collect();
            for chunk in [1, 2, 3, 5, 7, 8, 13, 64, 1000] {
                let mut blocks = TokenBlocks::of(
                    Chunks::Mapped {
                        rest: &data,
                        size: chunk,
                    },
                    dtype,
                );
                let (mut raw, mut tokens) = (Vec::new(), Vec::new());
                while let Some(block) = blocks.next_block().unwrap() {
                    raw.extend_from_slice(block.raw);
                    assert_eq!(
                        block.start,
                        tokens.len() as u64,
                        "{dtype} in chunks of {chunk}"
                    );
                    tokens.extend(block.tokens.iter());
                }
                assert_eq!(raw, data, "{dtype} in chunks of {chunk}");
                assert_eq!(tokens, whole, "{dtype} in chunks of {chunk}");
            }
        }
    }
}
