//! The `.seg` file of a packed shard: for every row, the document pieces it
//! holds and where each starts, so that training code builds attention masks,
//! `cu_seqlens`, position ids and loss masks without scanning for separators.

use std::path::Path;

use super::FormatError;

/// The first eight bytes of every `.seg` file.
pub const SEG_MAGIC: [u8; 8] = *b"PREPSEG\0";
/// The segment index version this build writes and the newest it reads.
pub const SEG_VERSION: u32 = 1;
/// Bytes before the row index.
pub const SEG_HEADER_LEN: usize = 32;
/// Bytes of one [`Segment`] entry.
pub const SEGMENT_BYTES: usize = 24;

/// One piece of a document inside a packed row, as stored in a `.seg` file
/// (24 bytes, little-endian, in this field order).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Segment {
    /// The document's record number in the dataset that was packed.
    pub doc: u64,
    /// Where the piece begins inside its document, in tokens; 0 for a piece
    /// that starts its document.
    pub doc_offset: u64,
    /// Where the piece begins inside the row, in tokens.
    pub start: u32,
    /// Tokens in the piece, at least 1.
    pub length: u32,
}

// Viewed in place by `mmap::cast`: the layout must be exactly the file's.
const _: () = assert!(std::mem::size_of::<Segment>() == SEGMENT_BYTES);
const _: () = assert!(std::mem::align_of::<Segment>() == 8);

impl Segment {
    /// The piece's end inside the row: `start + length`.
    pub fn end(&self) -> u64 {
        u64::from(self.start) + u64::from(self.length)
    }

    /// The entry's 24 bytes as stored.
    pub fn encode(&self) -> [u8; SEGMENT_BYTES] {
        let mut out = [0u8; SEGMENT_BYTES];
        out[0..8].copy_from_slice(&self.doc.to_le_bytes());
        out[8..16].copy_from_slice(&self.doc_offset.to_le_bytes());
        out[16..20].copy_from_slice(&self.start.to_le_bytes());
        out[20..24].copy_from_slice(&self.length.to_le_bytes());
        out
    }

    /// The entry stored in `bytes` (the inverse of [`Segment::encode`]), at
    /// any alignment.
    pub fn decode(bytes: &[u8; SEGMENT_BYTES]) -> Segment {
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let half = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        Segment {
            doc: word(0),
            doc_offset: word(8),
            start: half(16),
            length: half(20),
        }
    }
}

/// The fixed-size header of a `.seg` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegHeader {
    /// Tokens per row.
    pub seq_len: u32,
    /// Rows in the shard (the `.idx`'s `n_records`).
    pub n_rows: u64,
    /// Segment entries in the file.
    pub n_segments: u64,
}

impl SegHeader {
    /// The header's 32 bytes, as written at the start of the file.
    pub fn encode(&self) -> [u8; SEG_HEADER_LEN] {
        let mut out = [0u8; SEG_HEADER_LEN];
        out[0..8].copy_from_slice(&SEG_MAGIC);
        out[8..12].copy_from_slice(&SEG_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&self.seq_len.to_le_bytes());
        out[16..24].copy_from_slice(&self.n_rows.to_le_bytes());
        out[24..32].copy_from_slice(&self.n_segments.to_le_bytes());
        out
    }

    /// Parses and checks the header at the start of `bytes` (the whole
    /// file), including that the file's length matches its counts.
    ///
    /// `path` only names the file in errors.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<SegHeader, FormatError> {
        Self::parse_head(path, bytes, bytes.len() as u64)
    }

    /// [`SegHeader::parse`] for a file not held in memory: `head` is its
    /// first bytes (at least the header's, when the file has them) and `len`
    /// its length. The same checks, for a file read as a stream.
    pub fn parse_head(path: &Path, head: &[u8], len: u64) -> Result<SegHeader, FormatError> {
        let bad = |message: String| FormatError::Mismatch {
            path: path.into(),
            message,
        };
        let head = head
            .get(..SEG_HEADER_LEN)
            .filter(|_| len >= SEG_HEADER_LEN as u64)
            .ok_or_else(|| {
                bad(format!(
                    "segment index is {len} bytes, shorter than its {SEG_HEADER_LEN}-byte header"
                ))
            })?;
        if head[0..8] != SEG_MAGIC {
            return Err(bad("not a prep segment index (bad magic bytes)".into()));
        }
        let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if version > SEG_VERSION || version == 0 {
            return Err(FormatError::UnsupportedVersion {
                path: path.into(),
                found: version.into(),
                supported: SEG_VERSION.into(),
            });
        }
        let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        let header = SegHeader {
            seq_len: u32::from_le_bytes(head[12..16].try_into().expect("4 bytes")),
            n_rows: word(16),
            n_segments: word(24),
        };
        let expected = Self::file_len(header.n_rows, header.n_segments);
        if expected != Some(len) {
            return Err(bad(format!(
                "segment index is {len} bytes, but a header with {} rows and {} segments needs {}",
                header.n_rows,
                header.n_segments,
                expected.map_or_else(|| "more bytes than a u64 holds".into(), |e| e.to_string())
            )));
        }
        Ok(header)
    }

    /// The size of a `.seg` file, or `None` if it overflows a u64.
    pub fn file_len(n_rows: u64, n_segments: u64) -> Option<u64> {
        let rows = n_rows.checked_add(1)?.checked_mul(8)?;
        let segments = n_segments.checked_mul(SEGMENT_BYTES as u64)?;
        rows.checked_add(segments)?
            .checked_add(SEG_HEADER_LEN as u64)
    }

    /// Byte offset of the segment entries: after the header and the row index.
    pub fn segments_offset(&self) -> usize {
        SEG_HEADER_LEN + 8 * (self.n_rows as usize + 1)
    }
}

/// The first rule that one row's pieces break, as (the piece's position in
/// the row, message), or `None` for a sound row: each piece is at least one
/// token long, the pieces lie back to back from position 0, and the last ends
/// at or before `seq_len`. The arithmetic is in u64, so no entry of a hostile
/// file overflows it.
///
/// Every reader of pieces runs this on the row it hands out ([`crate::format::Dataset::segments`]),
/// and [`segment_violations`] runs it on every row for `prep validate`: one
/// rule, one place. It costs one pass over the row's few entries.
pub fn row_violation(pieces: &[Segment], seq_len: u32) -> Option<(usize, String)> {
    let mut at = 0u64;
    for (k, s) in pieces.iter().enumerate() {
        if s.length == 0 {
            return Some((k, format!("piece {k} is empty")));
        }
        if u64::from(s.start) != at {
            return Some((k, format!("piece {k} starts at {}, expected {at}", s.start)));
        }
        at = s.end();
        if at > u64::from(seq_len) {
            return Some((
                k,
                format!("piece {k} ends at {at}, past the row's {seq_len} tokens"),
            ));
        }
    }
    None
}

/// Every place where a segment index breaks the rules, as (row, message),
/// in row order: the row index must start at 0, not decrease and end at the
/// number of entries; each row's pieces must obey [`row_violation`].
pub fn segment_violations<'a>(
    row_index: &'a [u64],
    segments: &'a [Segment],
    seq_len: u32,
) -> impl Iterator<Item = (u64, String)> + 'a {
    let n = segments.len() as u64;
    let first = row_index_start(row_index.first().copied());
    let last = row_index_end(row_index.len() as u64, row_index.last().copied(), n);
    let rows = row_index.windows(2).enumerate().filter_map(move |(r, w)| {
        match row_window(r as u64, w[0], w[1], n) {
            Err(violation) => Some(violation),
            Ok(None) => None,
            Ok(Some(pieces)) => {
                let pieces = &segments[pieces.start as usize..pieces.end as usize];
                row_violation(pieces, seq_len).map(|(_, message)| (r as u64, message))
            }
        }
    });
    first.into_iter().chain(rows).chain(last)
}

/// The rule of [`segment_violations`] for the row index's first entry,
/// which must be 0 (`None`: the row index is empty).
pub fn row_index_start(first: Option<u64>) -> Option<(u64, String)> {
    match first {
        Some(0) => None,
        Some(f) => Some((0, format!("row_index[0] = {f}, expected 0"))),
        None => Some((0, "the row index is empty".into())),
    }
}

/// The rule of [`segment_violations`] for row `r`, whose entries run from
/// row-index entry `lo` to `hi`: a violation when `hi < lo`; otherwise the
/// entries holding its pieces, to be checked with [`row_violation`], or
/// `None` when they lie past the `n_segments` entries (the row index's end
/// is then reported by [`row_index_end`]).
pub fn row_window(
    r: u64,
    lo: u64,
    hi: u64,
    n_segments: u64,
) -> Result<Option<std::ops::Range<u64>>, (u64, String)> {
    if hi < lo {
        return Err((
            r,
            format!(
                "row_index[{}] = {hi} is smaller than row_index[{r}] = {lo}",
                r + 1
            ),
        ));
    }
    Ok((hi <= n_segments).then_some(lo..hi))
}

/// The rule of [`segment_violations`] for the row index's last entry (of
/// `entries`), which must be the number of segments.
pub fn row_index_end(entries: u64, last: Option<u64>, n_segments: u64) -> Option<(u64, String)> {
    match last {
        Some(l) if l != n_segments => Some((
            entries.saturating_sub(2),
            format!("the row index ends at {l}, expected {n_segments} (the number of segments)"),
        )),
        _ => None,
    }
}

/// Parses a whole `.seg` file and checks every rule of FORMAT.md on it: the
/// header, the size, the row index and the pieces of every row. Works on
/// bytes at any alignment (it decodes rather than views them); `path` only
/// names the file in errors.
pub fn check_segments(path: &Path, bytes: &[u8]) -> Result<SegHeader, FormatError> {
    let header = SegHeader::parse(path, bytes)?;
    let at = header.segments_offset();
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
    let rows: Vec<u64> = bytes[SEG_HEADER_LEN..at]
        .chunks_exact(8)
        .map(word)
        .collect();
    let segments: Vec<Segment> = bytes[at..]
        .chunks_exact(SEGMENT_BYTES)
        .map(|c| Segment::decode(c.try_into().expect("24 bytes")))
        .collect();
    let first = segment_violations(&rows, &segments, header.seq_len).next();
    match first {
        None => Ok(header),
        Some((row, message)) => Err(FormatError::Mismatch {
            path: path.into(),
            message: format!("row {row}: {message}"),
        }),
    }
}

/// Collects the pieces of a shard's rows and writes them as a `.seg` file.
#[derive(Debug)]
pub struct SegWriter {
    seq_len: u32,
    row_index: Blocks<u64>,
    segments: Blocks<Segment>,
}

impl SegWriter {
    /// An empty segment index for rows of `seq_len` tokens.
    pub fn new(seq_len: u32) -> SegWriter {
        let mut row_index = Blocks::default();
        row_index.extend_from_slice(&[0]);
        SegWriter {
            seq_len,
            row_index,
            segments: Blocks::default(),
        }
    }

    /// Adds the next row's pieces, in the order they lie in the row.
    pub fn push_row(&mut self, pieces: &[Segment]) {
        self.segments.extend_from_slice(pieces);
        self.row_index
            .extend_from_slice(&[self.segments.len() as u64]);
    }

    /// Rows added so far.
    pub fn n_rows(&self) -> u64 {
        self.row_index.len() as u64 - 1
    }

    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            SEG_HEADER_LEN + 8 * self.row_index.len() + SEGMENT_BYTES * self.segments.len(),
        );
        let Ok(()) = self.encode_into(|block| {
            out.extend_from_slice(block);
            Ok::<(), std::convert::Infallible>(())
        });
        out
    }

    /// The file's bytes handed to `out` in order, in blocks of about 64
    /// KiB: what [`SegWriter::encode`] makes, without a second copy of a
    /// large index in memory (a shard of short documents has tens of MB).
    ///
    /// # Errors
    /// The first error of `out`, after which it is not called again.
    pub fn encode_into<E>(&self, mut out: impl FnMut(&[u8]) -> Result<(), E>) -> Result<(), E> {
        const BLOCK: usize = 64 << 10;
        let header = SegHeader {
            seq_len: self.seq_len,
            n_rows: self.n_rows(),
            n_segments: self.segments.len() as u64,
        };
        let mut buf = Vec::with_capacity(BLOCK + SEG_HEADER_LEN.max(SEGMENT_BYTES));
        buf.extend_from_slice(&header.encode());
        let mut put = |bytes: &[u8], buf: &mut Vec<u8>| {
            buf.extend_from_slice(bytes);
            if buf.len() < BLOCK {
                return Ok(());
            }
            let sent = out(buf);
            buf.clear();
            sent
        };
        for r in self.row_index.iter() {
            put(&r.to_le_bytes(), &mut buf)?;
        }
        for s in self.segments.iter() {
            put(&s.encode(), &mut buf)?;
        }
        if !buf.is_empty() {
            out(&buf)?;
        }
        Ok(())
    }
}

/// A list kept in blocks of [`Blocks::BLOCK`] bytes: it grows without
/// moving what it holds. A list that doubles would pass through twice its
/// size of memory new to the process, and copy itself on the way: for a
/// shard of short documents, tens of MB.
#[derive(Debug, Clone)]
struct Blocks<T> {
    blocks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Blocks<T> {
    fn default() -> Blocks<T> {
        Blocks {
            blocks: Vec::new(),
            len: 0,
        }
    }
}

impl<T: Copy> Blocks<T> {
    const BLOCK: usize = 1 << 20;

    fn per_block() -> usize {
        (Self::BLOCK / std::mem::size_of::<T>().max(1)).max(1)
    }

    fn extend_from_slice(&mut self, mut items: &[T]) {
        self.len += items.len();
        while !items.is_empty() {
            match self.blocks.last_mut() {
                Some(block) if block.len() < block.capacity() => {
                    let n = items.len().min(block.capacity() - block.len());
                    block.extend_from_slice(&items[..n]);
                    items = &items[n..];
                }
                _ => self.blocks.push(Vec::with_capacity(Self::per_block())),
            }
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.blocks.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(start: u32, length: u32) -> Segment {
        Segment {
            doc: 0,
            doc_offset: 0,
            start,
            length,
        }
    }

    /// Kept in blocks, a list holds what a `Vec` would, in order, across
    /// as many blocks as it takes and slices that straddle them.
    #[test]
    fn blocks_hold_what_a_vec_holds() {
        let mut blocks = Blocks::<u64>::default();
        let mut vec = Vec::new();
        let per_block = Blocks::<u64>::per_block() as u64;
        let mut next = 0u64;
        for n in [
            0,
            1,
            7,
            per_block - 3,
            5,
            per_block,
            2 * per_block + 11,
            0,
            2,
        ] {
            let items: Vec<u64> = (next..next + n).collect();
            next += n;
            blocks.extend_from_slice(&items);
            vec.extend_from_slice(&items);
            assert_eq!(blocks.len(), vec.len());
        }
        assert!(blocks.blocks.len() >= 4);
        assert!(blocks
            .blocks
            .iter()
            .all(|b| b.capacity() == per_block as usize));
        assert!(blocks.iter().copied().eq(vec.iter().copied()));
    }

    /// The streamed blocks make the file `encode` makes, whatever its
    /// size; an error of the receiver ends the stream.
    #[test]
    fn encoded_in_blocks_is_encoded_whole() {
        for rows in [0u32, 1, 3, 5_000] {
            let mut w = SegWriter::new(64);
            for r in 0..rows {
                let pieces: Vec<Segment> = (0..r % 4 + 1).map(|k| seg(k * 16, 16)).collect();
                w.push_row(&pieces);
            }
            let mut blocks = Vec::new();
            w.encode_into(|b| {
                blocks.push(b.to_vec());
                Ok::<(), ()>(())
            })
            .unwrap();
            assert_eq!(blocks.concat(), w.encode(), "{rows} rows");
            assert!(blocks.len() > 1 || rows < 5_000);
            let mut calls = 0;
            assert_eq!(
                w.encode_into(|_| {
                    calls += 1;
                    Err("full")
                }),
                Err("full")
            );
            assert_eq!(calls, 1);
        }
    }

    #[test]
    fn encode_then_parse() {
        let mut w = SegWriter::new(8);
        w.push_row(&[seg(0, 5), seg(5, 3)]);
        w.push_row(&[seg(0, 2)]);
        let bytes = w.encode();
        let header = SegHeader::parse(Path::new("x.seg"), &bytes).unwrap();
        assert_eq!(
            header,
            SegHeader {
                seq_len: 8,
                n_rows: 2,
                n_segments: 3
            }
        );
        assert_eq!(
            Some(bytes.len() as u64),
            SegHeader::file_len(2, 3),
            "size as specified"
        );
        assert!(SegHeader::parse(Path::new("x.seg"), &bytes[..bytes.len() - 1]).is_err());
        assert_eq!(check_segments(Path::new("x.seg"), &bytes).unwrap(), header);
        let mut shifted = bytes.clone();
        shifted[header.segments_offset() + 16] = 1; // the first piece starts at 1
        let err = check_segments(Path::new("x.seg"), &shifted).unwrap_err();
        assert!(err.to_string().contains("row 0"), "{err}");
    }

    #[test]
    fn violations_found() {
        let ok = [seg(0, 5), seg(5, 3)];
        assert_eq!(segment_violations(&[0, 2], &ok, 8).count(), 0);
        assert_eq!(
            segment_violations(&[0, 2], &ok, 7).count(),
            1,
            "past the row"
        );
        let gap = [seg(0, 4), seg(5, 3)];
        assert_eq!(segment_violations(&[0, 2], &gap, 8).count(), 1);
        let empty = [seg(0, 0)];
        assert_eq!(segment_violations(&[0, 1], &empty, 8).count(), 1);
        assert_eq!(segment_violations(&[0, 1], &ok, 8).count(), 1, "bad last");
        let bad_first: Vec<_> = segment_violations(&[1, 2], &ok, 8).collect();
        assert!(bad_first[0].1.contains("row_index[0]"), "{bad_first:?}");
    }

    #[test]
    fn row_violation_names_the_piece_and_cannot_overflow() {
        assert_eq!(row_violation(&[], 8), None, "a row of padding only");
        assert_eq!(row_violation(&[seg(0, 5), seg(5, 3)], 8), None);
        let (k, message) = row_violation(&[seg(0, 5), seg(5, u32::MAX)], 8).unwrap();
        assert_eq!(k, 1);
        assert!(message.contains("past the row's 8 tokens"), "{message}");
        // start + length past u32::MAX is still caught, not wrapped around.
        let (k, _) = row_violation(&[seg(0, u32::MAX), seg(u32::MAX, 2)], u32::MAX).unwrap();
        assert_eq!(k, 1);
        let (k, message) = row_violation(&[seg(5000, 4_000_000_000)], 1025).unwrap();
        assert_eq!(k, 0);
        assert!(message.contains("starts at 5000"), "{message}");
        assert_eq!(row_violation(&[seg(0, 5), seg(5, 0)], 8).unwrap().0, 1);
    }
}
