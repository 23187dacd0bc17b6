//! The one place where prep maps files and views bytes as integers.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::FormatError;

/// A read-only file mapping (or nothing, for an empty file, which cannot be mapped).
/// Public only as the file type of [`super::Mapped`] storage; not nameable outside.
#[derive(Debug)]
pub struct Mapping {
    map: Option<Mmap>,
}

impl Mapping {
    /// Maps `path` read-only.
    pub fn open(path: &Path) -> Result<Mapping, FormatError> {
        let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
        let len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
        if len == 0 {
            return Ok(Mapping { map: None });
        }
        // SAFETY: the mapping is read-only and lives as long as `Mapping`. What
        // mapping cannot rule out is another process truncating or rewriting
        // the file while it is mapped: reads could then see changed bytes or
        // fault (SIGBUS). prep never modifies a file in place (it writes
        // under a temporary name and renames), so that happens only when a
        // user or another tool rewrites a dataset while it is being read,
        // which the documentation warns against.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| FormatError::io(path, e))?;
        Ok(Mapping { map: Some(map) })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// Drops the pages of `range` (clamped to the file) from this process's
    /// memory once they have been read: they stay in the page cache, and a
    /// later read of them maps them again. For a reader that reads through
    /// the mapping once, as the positioned reads' checks do
    /// ([`super::Verified::reader`]), and must not keep a whole input in
    /// its resident memory. Best effort: a refusal only leaves them mapped.
    pub fn release(&self, range: std::ops::Range<usize>) {
        let Some(map) = &self.map else {
            return;
        };
        let end = range.end.min(map.len());
        let start = range.start.min(end);
        // SAFETY: the mapping is read-only, so no page of it holds bytes
        // that are not the file's: dropping them loses nothing, and a read
        // after this one, through any slice of the mapping, faults the
        // same bytes back in from the page cache (memmap2 rounds the range
        // out to whole pages, within the mapping).
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        };
    }
}

/// Integer types that any byte pattern of the right size and alignment is a
/// valid value of, and that dataset files store little-endian.
pub trait Plain: Copy {}
impl Plain for u16 {}
impl Plain for u32 {}
impl Plain for u64 {}
/// `#[repr(C)]` with fields u64, u64, u32, u32: 24 bytes, no padding, every
/// bit pattern a valid value (the size and alignment are asserted where it
/// is defined).
impl Plain for super::segments::Segment {}

/// Views `bytes` as a slice of `T` without copying, or `None` when the start
/// is not aligned for `T` or the length is not a multiple of its size.
///
/// Values are read in the machine's byte order, so callers check that the
/// machine is little-endian first ([`little_endian`]).
pub fn cast<T: Plain>(bytes: &[u8]) -> Option<&[T]> {
    // SAFETY: `T` is a plain integer or a `#[repr(C)]` struct of them with
    // no padding (the `Plain` trait is private and implemented only for u16,
    // u32, u64 and `Segment`), so every bit pattern is a valid value and no
    // invariant can be broken; `align_to` itself guarantees the
    // middle slice is aligned and in bounds. The prefix and suffix must be
    // empty, or the view would not cover `bytes` exactly.
    let (prefix, middle, suffix) = unsafe { bytes.align_to::<T>() };
    (prefix.is_empty() && suffix.is_empty()).then_some(middle)
}

/// The bytes of a slice of `T`, as they lie in memory: the inverse of
/// [`cast`] (for tokens viewed from a little-endian file, the file's bytes).
pub fn bytes_of<T: Plain>(values: &[T]) -> &[u8] {
    // SAFETY: `values` is `size_of_val(values)` initialised bytes at its
    // address (`Plain` types have no padding), u8 has alignment 1 and every
    // byte value is valid; the lifetime is the slice's.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
}

/// Datasets are little-endian and viewed in place, so a big-endian machine
/// cannot read them without copying.
pub fn little_endian() -> Result<(), FormatError> {
    if cfg!(target_endian = "little") {
        Ok(())
    } else {
        Err(FormatError::BigEndian)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cast_refuses_a_partial_cover() {
        // Three bytes never make whole u16s, whatever the alignment.
        assert!(cast::<u16>(&[0u8; 3]).is_none());
        assert_eq!(cast::<u16>(&[]).map(<[u16]>::len), Some(0));
    }
}
