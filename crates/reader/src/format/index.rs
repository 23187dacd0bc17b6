//! The `.idx` file: a 32-byte header, then `n_records + 1` u64 token offsets.

use std::path::Path;

use super::{Dtype, FormatError};

/// The first eight bytes of every `.idx` file.
pub const IDX_MAGIC: [u8; 8] = *b"PREPIDX\0";
/// The index version this build writes and the newest it reads.
pub const IDX_VERSION: u32 = 1;
/// Bytes before the first offset.
pub const IDX_HEADER_LEN: usize = 32;

/// The fixed-size header of a `.idx` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdxHeader {
    /// Token type of the shard's `.bin`.
    pub dtype: Dtype,
    /// Records in the shard.
    pub n_records: u64,
    /// Tokens in the shard's `.bin`.
    pub n_tokens: u64,
}

impl IdxHeader {
    /// The header's 32 bytes, as written at the start of the file.
    pub fn encode(&self) -> [u8; IDX_HEADER_LEN] {
        let mut out = [0u8; IDX_HEADER_LEN];
        out[0..8].copy_from_slice(&IDX_MAGIC);
        out[8..12].copy_from_slice(&IDX_VERSION.to_le_bytes());
        out[12] = self.dtype.size() as u8;
        out[16..24].copy_from_slice(&self.n_records.to_le_bytes());
        out[24..32].copy_from_slice(&self.n_tokens.to_le_bytes());
        out
    }

    /// Parses and checks the header at the start of `bytes` (the whole file),
    /// including that the file's length matches the record count.
    ///
    /// `path` only names the file in errors.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<IdxHeader, FormatError> {
        Self::parse_head(path, bytes, bytes.len() as u64)
    }

    /// [`IdxHeader::parse`] for a file not held in memory: `head` is its
    /// first bytes (at least the header's, when the file has them) and `len`
    /// its length. The same checks, for a file read as a stream.
    pub fn parse_head(path: &Path, head: &[u8], len: u64) -> Result<IdxHeader, FormatError> {
        let head = head
            .get(..IDX_HEADER_LEN)
            .filter(|_| len >= IDX_HEADER_LEN as u64)
            .ok_or_else(|| FormatError::IdxTooShort {
                path: path.into(),
                len,
            })?;
        if head[0..8] != IDX_MAGIC {
            return Err(FormatError::IdxBadMagic { path: path.into() });
        }
        let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if version > IDX_VERSION || version == 0 {
            return Err(FormatError::UnsupportedVersion {
                path: path.into(),
                found: version.into(),
                supported: IDX_VERSION.into(),
            });
        }
        let dtype = Dtype::from_size(head[12]).ok_or(FormatError::IdxBadTokenSize {
            path: path.into(),
            size: head[12],
        })?;
        if head[13..16] != [0, 0, 0] {
            return Err(FormatError::IdxReserved { path: path.into() });
        }
        let n_records = u64::from_le_bytes(head[16..24].try_into().expect("8 bytes"));
        let n_tokens = u64::from_le_bytes(head[24..32].try_into().expect("8 bytes"));
        let expected = Self::file_len(n_records);
        if expected != Some(len) {
            return Err(FormatError::IdxSize {
                path: path.into(),
                len,
                n_records,
                expected: expected
                    .map_or_else(|| "more bytes than a u64 holds".into(), |e| e.to_string()),
            });
        }
        Ok(IdxHeader {
            dtype,
            n_records,
            n_tokens,
        })
    }

    /// The size of an `.idx` file with `n_records` records, or `None` if it
    /// overflows a u64 (only a hostile header asks for that).
    pub fn file_len(n_records: u64) -> Option<u64> {
        n_records
            .checked_add(1)?
            .checked_mul(8)?
            .checked_add(IDX_HEADER_LEN as u64)
    }
}

/// One way an offsets array breaks the rules: which offset, its value, and
/// what was expected of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetViolation {
    /// Index into the offsets array.
    pub position: u64,
    /// The offset found there.
    pub found: u64,
    /// What the format requires of it.
    pub expected: String,
}

/// Every place where `offsets` breaks the rules: the first is not 0, one is
/// smaller than the one before it, the last is not `n_tokens`. In order of
/// position; the reader stops at the first, `prep validate` lists them all.
pub fn offset_violations(
    offsets: &[u64],
    n_tokens: u64,
) -> impl Iterator<Item = OffsetViolation> + '_ {
    let mut rules = OffsetRules::new(n_tokens);
    let mut rest = offsets.iter();
    let mut finished = false;
    std::iter::from_fn(move || {
        for &offset in rest.by_ref() {
            if let Some(v) = rules.push(offset) {
                return Some(v);
            }
        }
        if finished {
            return None;
        }
        finished = true;
        rules.finish()
    })
}

/// The rules of [`offset_violations`], one offset at a time, for an index
/// read as a stream: [`OffsetRules::push`] each offset in order, then
/// [`OffsetRules::finish`]. Holds two numbers, whatever the index's size.
#[derive(Debug, Clone)]
pub struct OffsetRules {
    n_tokens: u64,
    /// Offsets pushed so far.
    seen: u64,
    previous: Option<u64>,
}

impl OffsetRules {
    /// Rules for the offsets of an index whose header counts `n_tokens`.
    pub fn new(n_tokens: u64) -> OffsetRules {
        OffsetRules {
            n_tokens,
            seen: 0,
            previous: None,
        }
    }

    /// The rule the next offset breaks, if any: the first is not 0, or it
    /// is smaller than the one before it.
    pub fn push(&mut self, offset: u64) -> Option<OffsetViolation> {
        let position = self.seen;
        self.seen += 1;
        let previous = self.previous.replace(offset);
        match previous {
            None if offset != 0 => Some(OffsetViolation {
                position,
                found: offset,
                expected: "expected 0".into(),
            }),
            Some(p) if offset < p => Some(OffsetViolation {
                position,
                found: offset,
                expected: format!(
                    "smaller than offsets[{}] = {p}; offsets must not decrease",
                    position - 1
                ),
            }),
            _ => None,
        }
    }

    /// The rule the offsets break as a whole, once all are pushed: there
    /// are none, or the last is not the header's token count.
    pub fn finish(&self) -> Option<OffsetViolation> {
        match self.previous {
            None => Some(OffsetViolation {
                position: 0,
                found: 0,
                expected: "the index has no offsets".into(),
            }),
            Some(last) if last != self.n_tokens => Some(OffsetViolation {
                position: self.seen - 1,
                found: last,
                expected: format!("expected the header's token count {}", self.n_tokens),
            }),
            Some(_) => None,
        }
    }
}

/// Parses a whole `.idx` file held in memory, at any alignment, and checks
/// its offsets: the checks the reader runs on a mapped index. Returns the
/// header. Memory used is proportional to `bytes.len()`, never to a count
/// read from the file.
pub fn check_index(path: &Path, bytes: &[u8]) -> Result<IdxHeader, FormatError> {
    let header = IdxHeader::parse(path, bytes)?;
    let offsets: Vec<u64> = bytes[IDX_HEADER_LEN..]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    check_offsets(path, &offsets, header.n_tokens)?;
    Ok(header)
}

/// Checks that `offsets` start at 0, never decrease and end at `n_tokens`;
/// the error names the first offending position.
pub fn check_offsets(path: &Path, offsets: &[u64], n_tokens: u64) -> Result<(), FormatError> {
    match offset_violations(offsets, n_tokens).next() {
        None => Ok(()),
        Some(v) => Err(FormatError::IdxOffsets {
            path: path.into(),
            position: v.position,
            found: v.found,
            expected: v.expected,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: IdxHeader, offsets: &[u64]) -> Vec<u8> {
        let mut out = header.encode().to_vec();
        for o in offsets {
            out.extend_from_slice(&o.to_le_bytes());
        }
        out
    }

    /// A uint16 header with no tokens and `n_records` records.
    fn u16_header(n_records: u64) -> IdxHeader {
        IdxHeader {
            dtype: Dtype::U16,
            n_records,
            n_tokens: 0,
        }
    }

    fn p() -> &'static Path {
        Path::new("s.idx")
    }

    #[test]
    fn round_trip() {
        let h = IdxHeader {
            dtype: Dtype::U32,
            n_records: 2,
            n_tokens: 7,
        };
        let bytes = file(h, &[0, 3, 7]);
        assert_eq!(IdxHeader::parse(p(), &bytes).unwrap(), h);
    }

    #[test]
    fn too_short() {
        let err = IdxHeader::parse(p(), b"PREPIDX\0\x01").unwrap_err();
        assert!(
            matches!(err, FormatError::IdxTooShort { len: 9, .. }),
            "{err}"
        );
    }

    #[test]
    fn bad_magic() {
        let mut bytes = file(u16_header(0), &[0]);
        bytes[0] = b'X';
        assert!(matches!(
            IdxHeader::parse(p(), &bytes),
            Err(FormatError::IdxBadMagic { .. })
        ));
    }

    #[test]
    fn newer_version_is_refused_by_name() {
        let mut bytes = file(u16_header(0), &[0]);
        bytes[8] = 2;
        let err = IdxHeader::parse(p(), &bytes).unwrap_err();
        assert!(matches!(
            err,
            FormatError::UnsupportedVersion {
                found: 2,
                supported: 1,
                ..
            }
        ));
        assert!(err.to_string().contains("upgrade prep"), "{err}");
    }

    #[test]
    fn bad_token_size_and_reserved() {
        let mut bytes = file(u16_header(0), &[0]);
        bytes[12] = 3;
        assert!(matches!(
            IdxHeader::parse(p(), &bytes),
            Err(FormatError::IdxBadTokenSize { size: 3, .. })
        ));
        bytes[12] = 2;
        bytes[14] = 1;
        assert!(matches!(
            IdxHeader::parse(p(), &bytes),
            Err(FormatError::IdxReserved { .. })
        ));
    }

    #[test]
    fn hostile_record_count_does_not_overflow() {
        let bytes = file(u16_header(u64::MAX), &[0]);
        let err = IdxHeader::parse(p(), &bytes).unwrap_err();
        assert!(matches!(err, FormatError::IdxSize { .. }), "{err}");
        let bytes = file(u16_header(u64::MAX / 8), &[0]);
        assert!(matches!(
            IdxHeader::parse(p(), &bytes),
            Err(FormatError::IdxSize { .. })
        ));
    }

    #[test]
    fn size_must_match_record_count() {
        let bytes = file(u16_header(3), &[0, 0]);
        assert!(matches!(
            IdxHeader::parse(p(), &bytes),
            Err(FormatError::IdxSize { n_records: 3, .. })
        ));
    }

    #[test]
    fn offsets_checked() {
        assert!(check_offsets(p(), &[0, 2, 2, 5], 5).is_ok());
        assert!(matches!(
            check_offsets(p(), &[1, 2], 2),
            Err(FormatError::IdxOffsets { position: 0, .. })
        ));
        assert!(matches!(
            check_offsets(p(), &[0, 3, 2, 5], 5),
            Err(FormatError::IdxOffsets { position: 2, .. })
        ));
        assert!(matches!(
            check_offsets(p(), &[0, 3], 4),
            Err(FormatError::IdxOffsets { position: 1, .. })
        ));
        assert!(check_offsets(p(), &[], 0).is_err());
    }
}
