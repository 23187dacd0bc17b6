//! The on-disk contract: shard index headers, the manifest, atomic writing and
//! a zero-copy reader. The specification follows.
//!
#![doc = include_str!("FORMAT.md")]

use std::fmt;
use std::path::PathBuf;

mod files;
mod index;
mod manifest;
mod mmap;
mod reader;
mod segments;
mod sums;
mod verify;
mod writer;

#[cfg(feature = "store")]
pub use files::record_count;
pub use files::{Chunks, Entries, File, Files, ReadError, TokenBlock, TokenBlocks, LOCAL_CHUNK};
pub use index::{
    check_index, offset_violations, IdxHeader, OffsetRules, OffsetViolation, IDX_HEADER_LEN,
    IDX_MAGIC, IDX_VERSION,
};
pub use manifest::is_safe_relative;
pub use manifest::{
    identity, ChatCounts, DocumentCounts, FileInfo, InputInfo, Manifest, OtherFile, Packing,
    Partition, Provenance, ShardFile, ShardInfo, SpecialTokens, TokenizerInfo, FORMAT_NAME,
    FORMAT_VERSION, MANIFEST_FILE, MASKED_VERSION, MAX_MANIFEST_BYTES, PLAIN_VERSION,
};
pub use mmap::Mapping as MappedFile;
pub use reader::{Dataset, Mapped, Storage, Tokens};
pub use segments::{
    check_segments, row_index_end, row_index_start, row_violation, row_window, segment_violations,
    SegHeader, SegWriter, Segment, SEGMENT_BYTES, SEG_HEADER_LEN, SEG_MAGIC, SEG_VERSION,
};
pub use sums::{chunk_bytes_to_write as sum_chunk_bytes_to_write, ChunkHasher};
pub use sums::{
    BadChunk, ChunkProblem, ChunkSums, CHUNK_BYTES, CHUNK_VAR as SUM_CHUNK_VAR, SUM_HEADER_LEN,
    SUM_MAGIC, SUM_VERSION,
};
pub use verify::{
    first_id_at_or_above, id_limit, BadInput, InputProblem, ShardPart, ShardReader, Verified,
};
pub use writer::TMP_SUFFIX;

/// Views mapped bytes as u16 tokens (None if misaligned or of odd length).
pub fn mmap_cast_u16(bytes: &[u8]) -> Option<&[u16]> {
    mmap::cast(bytes)
}

/// Views mapped bytes as u32 tokens (None if misaligned or of ragged length).
pub fn mmap_cast_u32(bytes: &[u8]) -> Option<&[u32]> {
    mmap::cast(bytes)
}

pub use writer::{
    atomic_write, hash_file, write_piece, AtomicFile, Capped, DatasetWriter, Gathered, ShardWriter,
    MAX_WRITE,
};

/// The type of every token in a dataset's `.bin` files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Dtype {
    /// Little-endian `u16`: every id of the vocabulary is at most 65,535.
    #[serde(rename = "uint16")]
    U16,
    /// Little-endian `u32`.
    #[serde(rename = "uint32")]
    U32,
}

impl Dtype {
    /// The narrowest dtype that holds every id below `vocab_size` (a
    /// vocabulary of exactly 65,536 ids still fits `U16`).
    pub fn for_vocab_size(vocab_size: u64) -> Dtype {
        if vocab_size <= 1 << 16 {
            Dtype::U16
        } else {
            Dtype::U32
        }
    }

    /// Bytes per token: 2 or 4.
    pub fn size(self) -> usize {
        match self {
            Dtype::U16 => 2,
            Dtype::U32 => 4,
        }
    }

    /// The dtype whose token size is `size` bytes, if any.
    pub fn from_size(size: u8) -> Option<Dtype> {
        match size {
            2 => Some(Dtype::U16),
            4 => Some(Dtype::U32),
            _ => None,
        }
    }

    /// The name used in the manifest and by numpy users: `uint16` or `uint32`.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::U16 => "uint16",
            Dtype::U32 => "uint32",
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// XXH3-64 with seed 0, as the manifest writes it: 16 lowercase hex digits.
pub fn checksum_hex(hash: u64) -> String {
    format!("{hash:016x}")
}

/// Every way reading or writing a dataset can fail.
///
/// Each variant names the file it is about; a reader meets these instead of a
/// panic or an out-of-bounds read when a file is corrupt or hostile.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// An I/O error on a file.
    #[error("{}: {cause}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        cause: std::io::Error,
    },
    /// The directory has no `manifest.json`.
    #[error("{}: not a prep dataset (no manifest.json; an interrupted run leaves none, re-run it to resume)", dir.display())]
    NoManifest {
        /// The directory.
        dir: PathBuf,
    },
    /// The manifest is not valid JSON or misses a field.
    #[error("{}: invalid manifest: {message}", path.display())]
    BadManifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The manifest or an index has a version this build does not read.
    #[error("{}: format version {found}, but this prep reads version {supported} at most; upgrade prep", path.display())]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: u64,
        /// The newest version this build reads.
        supported: u64,
    },
    /// An index file is shorter than its header.
    #[error("{}: index is {len} bytes, shorter than its {IDX_HEADER_LEN}-byte header", path.display())]
    IdxTooShort {
        /// The index file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// An index file does not start with the magic bytes.
    #[error("{}: not a prep index (bad magic bytes)", path.display())]
    IdxBadMagic {
        /// The index file.
        path: PathBuf,
    },
    /// The token size byte of an index header is neither 2 nor 4.
    #[error("{}: invalid token size {size} in index header (expected 2 or 4)", path.display())]
    IdxBadTokenSize {
        /// The index file.
        path: PathBuf,
        /// The byte found.
        size: u8,
    },
    /// Reserved header bytes are not zero.
    #[error("{}: reserved bytes of the index header are not zero", path.display())]
    IdxReserved {
        /// The index file.
        path: PathBuf,
    },
    /// The index file's size does not match the record count in its header.
    #[error("{}: index is {len} bytes, but a header with {n_records} records needs {expected}", path.display())]
    IdxSize {
        /// The index file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The record count in its header.
        n_records: u64,
        /// The length the header implies (None when it overflows).
        expected: String,
    },
    /// The offsets do not start at 0, decrease, or do not end at the token count.
    #[error("{}: offsets[{position}] = {found}: {expected}", path.display())]
    IdxOffsets {
        /// The index file.
        path: PathBuf,
        /// Which offset is wrong.
        position: u64,
        /// Its value.
        found: u64,
        /// What was expected.
        expected: String,
    },
    /// A shard's header, its `.bin` and the manifest disagree.
    #[error("{}: {message}", path.display())]
    Mismatch {
        /// The file where the disagreement shows.
        path: PathBuf,
        /// Both sides of it.
        message: String,
    },
    /// A packed row's entries in a `.seg` file break the rules of its row
    /// (an empty piece, a gap or overlap, a piece past `seq_len`): found
    /// when the row's pieces are read, before anyone builds `cu_seqlens`
    /// from them.
    #[error("{}: row {row}, entry {entry}: {message}", path.display())]
    BadSegment {
        /// The `.seg` file.
        path: PathBuf,
        /// The row within the shard.
        row: u64,
        /// The entry's number in the file (counting from the first entry).
        entry: u64,
        /// Which rule it breaks.
        message: String,
    },
    /// A `.sum` file is shorter than its header.
    #[error("{}: chunk checksum file is {len} bytes, shorter than its {SUM_HEADER_LEN}-byte header", path.display())]
    SumTooShort {
        /// The `.sum` file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// A `.sum` file does not start with the magic bytes.
    #[error("{}: not a prep chunk checksum file (bad magic bytes)", path.display())]
    SumBadMagic {
        /// The `.sum` file.
        path: PathBuf,
    },
    /// The reserved bytes of a `.sum` header are not zero.
    #[error("{}: reserved bytes of the chunk checksum header are not zero", path.display())]
    SumReserved {
        /// The `.sum` file.
        path: PathBuf,
    },
    /// A `.sum` header gives chunks of 0 bytes.
    #[error("{}: chunk size 0 in the chunk checksum header (a chunk holds at least one byte)", path.display())]
    SumChunkBytes {
        /// The `.sum` file.
        path: PathBuf,
    },
    /// A `.sum` file's size does not match the chunk count in its header.
    #[error("{}: chunk checksum file is {len} bytes, but a header with {n_chunks} chunks needs {expected}", path.display())]
    SumSize {
        /// The `.sum` file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The chunk count in its header.
        n_chunks: u64,
        /// The length the header implies (or that it overflows).
        expected: String,
    },
    /// A `.sum` file's chunks do not cover its shard's `.bin` exactly.
    #[error("{}: {n_chunks} chunks of {chunk_bytes} bytes listed, but {expected} are needed for the shard's {bin_bytes}-byte .bin", path.display())]
    SumChunkCount {
        /// The `.sum` file.
        path: PathBuf,
        /// The chunk count in its header.
        n_chunks: u64,
        /// The chunk size in its header.
        chunk_bytes: u64,
        /// The size of the `.bin`.
        bin_bytes: u64,
        /// `ceil(bin_bytes / chunk_bytes)`.
        expected: u64,
    },
    /// A shard lists no `.sum` (a dataset written by a prep from before
    /// chunk checksums), read by a reader that verifies ranges of shards.
    #[error(
        "{}: shard {shard} lists no chunk checksums (.sum): the dataset was written by an older prep, \
         and its shards cannot be verified a range at a time; re-make it with this prep, or fetch it \
         whole (prep fetch) and read the local copy",
        path.display()
    )]
    NoChunkSums {
        /// The manifest.
        path: PathBuf,
        /// The shard's position in the manifest.
        shard: u64,
    },
    /// A chunk of a `.bin` does not match its `.sum`.
    #[error(transparent)]
    BadChunk(#[from] BadChunk),
    /// Bytes a stage read from an input dataset are not what its manifest
    /// vouches for (a checksum, an id past the vocabulary, a mask byte
    /// other than 0 or 1), found before any went into an output.
    #[error(transparent)]
    BadInput(#[from] Box<BadInput>),
    /// A record index past the end of the dataset.
    #[error("record {index} is out of range: the dataset has {len} records")]
    RecordOutOfRange {
        /// The index asked for.
        index: u64,
        /// The number of records.
        len: u64,
    },
    /// This machine is big-endian; the files are little-endian and are viewed in place.
    #[error("prep datasets are little-endian and read in place; this machine is big-endian")]
    BigEndian,
}

impl FormatError {
    /// [`FormatError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> FormatError {
        FormatError::Io {
            path: path.into(),
            cause: source,
        }
    }
}

#[cfg(test)]
mod limits {
    //! Each limit is stated once in FORMAT.md's "Limits" table and held by
    //! one constant here and one in the Python reader: the three agree.
    use super::*;

    fn read(rel: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The value of `NAME = EXPR` in the Python reader, for the integer
    /// expressions it uses (`256 << 20`, `(1 << 32) - 1`, `32`).
    fn python_constant(source: &str, name: &str) -> u64 {
        let line = source
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} = ")))
            .unwrap_or_else(|| panic!("python/prep/reader.py has no {name}"));
        let expr = line
            .split('#')
            .next()
            .unwrap()
            .trim()
            .replace(['(', ')'], "");
        let (expr, minus) = match expr.split_once(" - ") {
            Some((e, m)) => (e.to_string(), m.trim().parse::<u64>().unwrap()),
            None => (expr, 0),
        };
        let value = match expr.split_once(" << ") {
            Some((a, b)) => a.trim().parse::<u64>().unwrap() << b.trim().parse::<u32>().unwrap(),
            None => expr.trim().parse::<u64>().unwrap(),
        };
        value - minus
    }

    /// The number in the "limit" column of FORMAT.md's row for `what`.
    fn spec_number(spec: &str, what: &str) -> u64 {
        let limits = spec
            .split("## Limits")
            .nth(1)
            .expect("FORMAT.md has a Limits section");
        let row = limits
            .lines()
            .find(|l| l.starts_with(&format!("| {what} ")))
            .unwrap_or_else(|| panic!("FORMAT.md's Limits table has no row {what:?}"));
        let cell = row.split('|').nth(2).unwrap();
        // The largest number in the cell ("1 to 4,294,967,295": the upper bound).
        cell.split(|c: char| !(c.is_ascii_digit() || c == ','))
            .filter_map(|n| n.replace(',', "").parse::<u64>().ok())
            .max()
            .unwrap_or_else(|| panic!("no number in {row:?}"))
    }

    #[test]
    fn format_md_rust_and_python_agree() {
        let spec = read("src/format/FORMAT.md");
        let py = read("../../python/prep/reader.py");
        let rows: [(&str, u64, &str); 4] = [
            (
                "`manifest.json` size",
                MAX_MANIFEST_BYTES,
                "MAX_MANIFEST_BYTES",
            ),
            ("`.idx` header", IDX_HEADER_LEN as u64, "_HEADER_LEN"),
            ("`.seg` header", SEG_HEADER_LEN as u64, "_HEADER_LEN"),
            (
                "a packed dataset's `seq_len`",
                u32::MAX as u64,
                "_MAX_SEQ_LEN",
            ),
        ];
        for (what, rust, python) in rows {
            assert_eq!(
                spec_number(&spec, what),
                rust,
                "FORMAT.md against Rust: {what}"
            );
            assert_eq!(
                python_constant(&py, python),
                rust,
                "Python {python} against Rust: {what}"
            );
        }
        assert_eq!(
            spec_number(&spec, "one `.seg` segment"),
            SEGMENT_BYTES as u64
        );
        assert_eq!(spec_number(&spec, "`.sum` header"), SUM_HEADER_LEN as u64);
        assert_eq!(spec_number(&spec, "a `.sum`'s `chunk_bytes`"), 1);
        let dtype = py
            .lines()
            .find(|l| l.starts_with("SEGMENT_DTYPE = "))
            .unwrap();
        let bytes = 8 * dtype.matches("\"<u8\"").count() + 4 * dtype.matches("\"<u4\"").count();
        assert_eq!(bytes, SEGMENT_BYTES, "Python SEGMENT_DTYPE: {dtype}");
    }
}
